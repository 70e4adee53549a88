/*
 * main.c — the unit-test runner.  Usage: run_unit [substring]
 */
#include <stdlib.h>
#include <unistd.h>

#include "test.h"

typedef struct test_case
{
	const char *name;
	const char *file;
	test_fn		fn;
} test_case;

static test_case tests[1024];
static int	n_tests;
int			test_current_failures;
int			test_current_skipped;

void
test_register(const char *name, const char *file, test_fn fn)
{
	if (n_tests < (int) (sizeof(tests) / sizeof(tests[0])))
		tests[n_tests++] = (test_case) {name, file, fn};
}

void
test_skip(const char *reason)
{
	test_current_skipped = 1;
	fprintf(stderr, "    skipped: %s\n", reason);
}

const char *
test_real_model_path(void)
{
	const char *env = getenv("CAI_TEST_MODEL");
	static const char *candidates[] = {
		"models/SmolLM2-135M-Instruct.Q4_1.gguf",
		"../models/SmolLM2-135M-Instruct.Q4_1.gguf",
		"../../models/SmolLM2-135M-Instruct.Q4_1.gguf",
	};

	if (env && *env)
		return access(env, R_OK) == 0 ? env : NULL;
	for (size_t i = 0; i < sizeof(candidates) / sizeof(candidates[0]); i++)
		if (access(candidates[i], R_OK) == 0)
			return candidates[i];
	return NULL;
}

static int
compare_tests(const void *a, const void *b)
{
	const test_case *x = a;
	const test_case *y = b;
	int			c = strcmp(x->file, y->file);

	return c ? c : strcmp(x->name, y->name);
}

int
main(int argc, char **argv)
{
	const char *filter = argc > 1 ? argv[1] : NULL;
	int			passed = 0;
	int			failed = 0;
	int			skipped = 0;

	qsort(tests, n_tests, sizeof(tests[0]), compare_tests);
	for (int i = 0; i < n_tests; i++)
	{
		if (filter && !strstr(tests[i].name, filter) && !strstr(tests[i].file, filter))
			continue;
		test_current_failures = 0;
		test_current_skipped = 0;
		fprintf(stderr, "%-40s ", tests[i].name);
		fflush(stderr);
		tests[i].fn();
		if (test_current_failures)
		{
			failed++;
			fprintf(stderr, "FAILED (%s)\n", tests[i].file);
		}
		else if (test_current_skipped)
		{
			skipped++;
			fprintf(stderr, "skipped\n");
		}
		else
		{
			passed++;
			fprintf(stderr, "ok\n");
		}
	}
	fflush(stderr);
	printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
	return failed ? 1 : 0;
}
