/*
 * test_runner.c — the test registry and run loop shared by the unit runner (tests/unit/main.c)
 * and the GPU runner (tests/gpu/main_gpu.c).
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
static int	tests_sorted;
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

static bool
test_selected(const test_case *t, const char *filter)
{
	return !filter || strstr(t->name, filter) || strstr(t->file, filter);
}

int
test_count_selected(const char *filter)
{
	int			n = 0;

	for (int i = 0; i < n_tests; i++)
		if (test_selected(&tests[i], filter))
			n++;
	return n;
}

void
test_run_selected(const char *filter, void (*after_each) (void), test_counts *counts)
{
	memset(counts, 0, sizeof(*counts));
	if (!tests_sorted)
	{
		qsort(tests, n_tests, sizeof(tests[0]), compare_tests);
		tests_sorted = 1;
	}
	for (int i = 0; i < n_tests; i++)
	{
		if (!test_selected(&tests[i], filter))
			continue;
		test_current_failures = 0;
		test_current_skipped = 0;
		fprintf(stderr, "%-40s ", tests[i].name);
		fflush(stderr);
		tests[i].fn();
		if (after_each)
			after_each();
		if (test_current_failures)
		{
			counts->failed++;
			fprintf(stderr, "FAILED (%s)\n", tests[i].file);
		}
		else if (test_current_skipped)
		{
			counts->skipped++;
			fprintf(stderr, "skipped\n");
		}
		else
		{
			counts->passed++;
			fprintf(stderr, "ok\n");
		}
	}
	fflush(stderr);
}
