/*
 * main_gpu.c — the GPU test runner.  Usage: run_gpu [substring]
 *
 * Every test compares a CUDA kernel or backend operation with the engine's CPU path.  Without a
 * CUDA device (no driver, no GPU) every test is skipped, the runner says so, and exits 0: the
 * suite is built wherever nvcc is and run where a GPU is.  CAI_CUDA_DEVICE picks the device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_util.h"
#include "test.h"

typedef struct test_case
{
	const char *name;
	const char *file;
	test_fn		fn;
} test_case;

static test_case tests[512];
static int	n_tests;
int			test_current_failures;
int			test_current_skipped;
static cai_cuda_ctx *shared_ctx;

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

cai_cuda_ctx *
gpu_ctx(void)
{
	return shared_ctx;
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
	const char *dev_env = getenv("CAI_CUDA_DEVICE");
	int			device = dev_env ? atoi(dev_env) : 0;
	int			passed = 0,
				failed = 0,
				skipped = 0,
				selected = 0;
	char		why[256] = "";
	int			n_dev;
	cai_cuda_device_info info;
	cai_error	err;

	qsort(tests, n_tests, sizeof(test_case), compare_tests);
	for (int i = 0; i < n_tests; i++)
		if (!filter || strstr(tests[i].name, filter) || strstr(tests[i].file, filter))
			selected++;

	n_dev = cai_cuda_device_count(why, sizeof(why));
	if (n_dev <= 0)
	{
		printf("no CUDA device is present (%s): all %d GPU tests were skipped\n", why, selected);
		printf("0 passed, 0 failed, %d skipped\n", selected);
		return 0;
	}
	if (cai_cuda_ctx_create(device, &shared_ctx, &err) != CAI_OK)
	{
		printf("cannot open CUDA device %d: %s\n", device, err.message);
		printf("0 passed, %d failed, 0 skipped\n", selected);
		return 1;
	}
	cai_cuda_get_device_info(shared_ctx, &info);
	printf("device %d: %s (compute capability %d.%d, %d SMs, %.1f GiB)\n", device, info.name,
		   info.cc_major, info.cc_minor, info.sm_count, info.total_bytes / 1073741824.0);

	for (int i = 0; i < n_tests; i++)
	{
		if (filter && !strstr(tests[i].name, filter) && !strstr(tests[i].file, filter))
			continue;
		test_current_failures = 0;
		test_current_skipped = 0;
		fprintf(stderr, "  %s ...\n", tests[i].name);
		tests[i].fn();
		gpu_sync();
		gpu_free_all();
		if (test_current_failures > 0)
		{
			failed++;
			fprintf(stderr, "  FAIL %s (%d checks)\n", tests[i].name, test_current_failures);
		}
		else if (test_current_skipped)
			skipped++;
		else
			passed++;
	}
	cai_cuda_ctx_free(shared_ctx);
	printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
	return failed > 0 ? 1 : 0;
}
