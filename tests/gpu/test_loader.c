/*
 * test_loader.c — the engine-side loader (src/model/backend_loader.c) loads libcai_cuda.so by
 * absolute path, resolves every entry point, and the resolved functions are the ones this program
 * links directly.  The file given is the one this program was linked with (found through
 * dladdr), so the test checks the library just built, wherever the tree or the install is.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
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
	char		linked[PATH_MAX];
	Dl_info		info;

	if (!dladdr((void *) cai_cuda_backend_create, &info) || !info.dli_fname ||
		!realpath(info.dli_fname, linked))
	{
		CHECK_MSG(false, "cannot tell which libcai_cuda.so this program links");
		return;
	}
	if (!cai_cuda_loader_open(linked, &loader, why, sizeof(why)))
	{
		CHECK_MSG(false, "%s did not load: %s", linked, why);
		return;
	}
	CHECK(loader.handle != NULL);
	CHECK(strcmp(loader.path, linked) == 0);
	CHECK(loader.backend_create == cai_cuda_backend_create);
	CHECK(loader.backend_status == cai_cuda_backend_status);
	CHECK(loader.backend_device == cai_cuda_backend_device);
	CHECK(loader.device_count(reason, sizeof(reason)) >= 1);
	cai_cuda_loader_close(&loader);
	CHECK(loader.handle == NULL);

	/* an explicit path that does not exist fails with a reason naming it */
	CHECK(!cai_cuda_loader_open("/nonexistent/libcai_cuda.so", &loader, why, sizeof(why)));
	CHECK(strstr(why, "/nonexistent/libcai_cuda.so") != NULL);

	/* a relative one is refused, even though the library is loaded in this process already */
	CHECK(!cai_cuda_loader_open("libcai_cuda.so", &loader, why, sizeof(why)));
	CHECK_MSG(strstr(why, "must be an absolute path") != NULL, "%s", why);
}
