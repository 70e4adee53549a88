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

/* Tests whose names begin so need no device: they run in dry mode too. */
#define HOST_PREFIX "gpu_host_"

static cai_cuda_ctx *shared_ctx;

cai_cuda_ctx *
gpu_ctx(void)
{
	return shared_ctx;
}

/* After each test: wait for the device and free what the test allocated. */
static void
gpu_after_each(void)
{
	gpu_sync();
	gpu_free_all();
}

int
main(int argc, char **argv)
{
	const char *filter = argc > 1 ? argv[1] : NULL;
	const char *dev_env = getenv("CAI_CUDA_DEVICE");
	int			device = dev_env ? atoi(dev_env) : 0;
	int			selected = test_count_selected(filter);
	char		why[256] = "";
	int			n_dev;
	cai_cuda_device_info info;
	cai_error	err;
	test_counts counts;

	n_dev = cai_cuda_device_count(why, sizeof(why));
	if (n_dev <= 0 && (!filter || strstr(filter, HOST_PREFIX)))
	{
		/* the gpu_host_ tests check the library's host code (repacking) and need no device */
		int			host = test_count_selected(HOST_PREFIX);

		printf("no CUDA device is present (%s): %d GPU tests were skipped; the %d host tests run\n",
			   why, selected - host, host);
		test_run_selected(HOST_PREFIX, gpu_free_all, &counts);
		printf("%d passed, %d failed, %d skipped\n", counts.passed, counts.failed,
			   counts.skipped + selected - host);
		return counts.failed > 0 ? 1 : 0;
	}
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

	test_run_selected(filter, gpu_after_each, &counts);
	cai_cuda_ctx_free(shared_ctx);
	printf("%d passed, %d failed, %d skipped\n", counts.passed, counts.failed, counts.skipped);
	return counts.failed > 0 ? 1 : 0;
}
