/*
 * test_loader.c — the engine-side loader (src/engine/backend_loader.c) finds libcai_cuda.so, resolves
 * every entry point, and the resolved functions are the ones this program links directly.
 */
#include <string.h>

#include "backend_cuda.h"
#include "backend_loader.h"
#include "gpu_util.h"
#include "test.h"

TEST(gpu_loader_resolves_entry_points)
{
	cai_cuda_loader loader;
	char		why[2048];
	char		reason[256];

	if (!cai_cuda_loader_open(NULL, &loader, why, sizeof(why)))
	{
		CHECK_MSG(false, "libcai_cuda.so not found: %s", why);
		return;
	}
	CHECK(loader.handle != NULL);
	CHECK(strstr(loader.path, "libcai_cuda.so") != NULL);
	CHECK(loader.backend_create == cai_cuda_backend_create);
	CHECK(loader.backend_status == cai_cuda_backend_status);
	CHECK(loader.backend_device == cai_cuda_backend_device);
	CHECK(loader.device_count(reason, sizeof(reason)) >= 1);
	cai_cuda_loader_close(&loader);
	CHECK(loader.handle == NULL);

	/* an explicit path that does not exist fails with a reason naming it */
	CHECK(!cai_cuda_loader_open("/nonexistent/libcai_cuda.so", &loader, why, sizeof(why)));
	CHECK(strstr(why, "/nonexistent/libcai_cuda.so") != NULL);
}
