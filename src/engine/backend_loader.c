/*
 * backend_loader.c — finds and dlopen()s libcai_cuda.so and resolves its entry points (see
 * backend_loader.h).
 */
#define _GNU_SOURCE
#include "backend_loader.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends a candidate's reason to why ("; "-separated), as far as it fits. */
static void
note_failure(char *why, size_t why_len, const char *reason)
{
	size_t		used = strlen(why);

	if (used + 1 < why_len)
		snprintf(why + used, why_len - used, "%s%s", used ? "; " : "", reason);
}

/* Tries one candidate file; fills the loader when it loads and has every symbol. */
static bool
try_open(const char *file, cai_cuda_loader *out, char *why, size_t why_len)
{
	void	   *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);

	if (!h)
	{
		const char *e = dlerror();	/* names the file */

		note_failure(why, why_len, e ? e : file);
		return false;
	}
	out->device_count = (cai_cuda_device_count_fn) dlsym(h, "cai_cuda_device_count");
	out->backend_create = (cai_cuda_backend_create_fn) dlsym(h, "cai_cuda_backend_create");
	out->backend_status = (cai_cuda_backend_status_fn) dlsym(h, "cai_cuda_backend_status");
	out->backend_device = (cai_cuda_backend_device_fn) dlsym(h, "cai_cuda_backend_device");
	if (!out->device_count || !out->backend_create || !out->backend_status || !out->backend_device)
	{
		char		msg[1200];

		snprintf(msg, sizeof(msg), "%s: a cai_cuda_* entry point is missing (stale build?)", file);
		note_failure(why, why_len, msg);
		dlclose(h);
		return false;
	}
	out->handle = h;
	snprintf(out->path, sizeof(out->path), "%s", file);
	return true;
}

bool
cai_cuda_loader_open(const char *path, cai_cuda_loader *out, char *why, size_t why_len)
{
	const char *env = getenv("CAI_CUDA_LIBRARY");
	Dl_info		info;
	char		buf[1024];

	memset(out, 0, sizeof(*out));
	if (why_len > 0)
		why[0] = '\0';
	if (path && *path)
		return try_open(path, out, why, why_len);
	if (env && *env && try_open(env, out, why, why_len))
		return true;
	/* beside the module holding this function: pg_cai.so in $pkglibdir, or the cai executable */
	if (dladdr((void *) cai_cuda_loader_open, &info) && info.dli_fname)
	{
		const char *slash = strrchr(info.dli_fname, '/');
		int			dir_len = slash ? (int) (slash - info.dli_fname) : 1;
		const char *dir = slash ? info.dli_fname : ".";

		snprintf(buf, sizeof(buf), "%.*s/%s", dir_len, dir, CAI_CUDA_LIBRARY_NAME);
		if (try_open(buf, out, why, why_len))
			return true;
		snprintf(buf, sizeof(buf), "%.*s/build/%s", dir_len, dir, CAI_CUDA_LIBRARY_NAME);
		if (try_open(buf, out, why, why_len))
			return true;
	}
	return try_open(CAI_CUDA_LIBRARY_NAME, out, why, why_len);
}

void
cai_cuda_loader_close(cai_cuda_loader *loader)
{
	if (loader->handle)
		dlclose(loader->handle);
	memset(loader, 0, sizeof(*loader));
}
