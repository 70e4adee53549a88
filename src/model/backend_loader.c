/*
 * backend_loader.c — finds and dlopen()s libcai_cuda.so and resolves its entry points (see
 * backend_loader.h).
 */
#define _GNU_SOURCE
#include "backend_loader.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Tries one candidate file; fills the loader when it loads and has every symbol. */
static bool
try_open(const char *file, cai_cuda_loader *out, char *why, size_t why_len)
{
	void	   *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);

	if (!h)
	{
		const char *e = dlerror();	/* names the file */

		snprintf(why, why_len, "%s", e ? e : file);
		return false;
	}
	out->device_count = (cai_cuda_device_count_fn) dlsym(h, "cai_cuda_device_count");
	out->backend_create = (cai_cuda_backend_create_fn) dlsym(h, "cai_cuda_backend_create");
	out->backend_status = (cai_cuda_backend_status_fn) dlsym(h, "cai_cuda_backend_status");
	out->backend_device = (cai_cuda_backend_device_fn) dlsym(h, "cai_cuda_backend_device");
	if (!out->device_count || !out->backend_create || !out->backend_status || !out->backend_device)
	{
		snprintf(why, why_len, "%.1000s: a cai_cuda_* entry point is missing (stale build?)", file);
		dlclose(h);
		out->device_count = NULL;
		out->backend_create = NULL;
		out->backend_status = NULL;
		out->backend_device = NULL;
		return false;
	}
	out->handle = h;
	return true;
}

/* Copies dir[/name] into path; false (with why) when it does not fit. */
static bool
set_candidate(char *slot, const char *dir, const char *name, char *why, size_t why_len)
{
	int			n = name ? snprintf(slot, CAI_CUDA_PATH_MAX, "%s/%s", dir, name) :
		snprintf(slot, CAI_CUDA_PATH_MAX, "%s", dir);

	if (n < 0 || n >= CAI_CUDA_PATH_MAX)
	{
		snprintf(why, why_len, "the CUDA library's path is too long: \"%.200s\"", dir);
		return false;
	}
	return true;
}

/* Length of dir without trailing slashes (but "/" stays one character). */
static size_t
dir_length(const char *dir)
{
	size_t		n = strlen(dir);

	while (n > 1 && dir[n - 1] == '/')
		n--;
	return n;
}

bool
cai_cuda_library_path(const cai_cuda_search *search, char path[CAI_CUDA_PATH_MAX], char *why,
					  size_t why_len)
{
	const char *given = NULL;
	const char *given_by = NULL;
	const char *exe = search->exe_path;
	const char *bindir = search->install_bindir;
	const char *libdir = search->install_libdir;
	char		dir[CAI_CUDA_PATH_MAX];
	size_t		exe_dir_len;

	if (why_len > 0)
		why[0] = '\0';
	path[0] = '\0';
	if (search->explicit_path && search->explicit_path[0])
	{
		given = search->explicit_path;
		given_by = "the CUDA library setting";
	}
	else if (search->env_path && search->env_path[0])
	{
		given = search->env_path;
		given_by = "CAI_CUDA_LIBRARY";
	}
	if (given)
	{
		if (given[0] != '/')
		{
			snprintf(why, why_len, "%s must be an absolute path (got \"%.200s\")", given_by, given);
			return false;
		}
		return set_candidate(path, given, NULL, why, why_len);
	}

	if (!exe || exe[0] != '/')
	{
		snprintf(why, why_len, "cannot tell where this program is installed, so where %s is; "
				 "set CAI_CUDA_LIBRARY", CAI_CUDA_LIBRARY_NAME);
		return false;
	}
	/* the program's directory is exe[0..exe_dir_len), or "/" when that is empty */
	exe_dir_len = (size_t) (strrchr(exe, '/') - exe);
	if (bindir && bindir[0] == '/' && dir_length(bindir) == (exe_dir_len ? exe_dir_len : 1) &&
		strncmp(bindir, exe, dir_length(bindir)) == 0)
	{
		/* the installed engine: where install-cuda puts the library, nowhere else */
		if (!libdir || libdir[0] != '/')
		{
			snprintf(why, why_len, "no library directory is known for the installed %s; set "
					 "CAI_CUDA_LIBRARY", CAI_CUDA_LIBRARY_NAME);
			return false;
		}
		snprintf(dir, sizeof(dir), "%.*s", (int) dir_length(libdir), libdir);
		return set_candidate(path, dir, CAI_CUDA_LIBRARY_NAME, why, why_len);
	}

	/*
	 * A program run from a build tree: the library built with it, never the installed one, whose
	 * interface may be another version's.
	 */
	if (exe_dir_len + sizeof("/build") > sizeof(dir))
	{
		snprintf(why, why_len, "the program's path is too long: \"%.200s\"", exe);
		return false;
	}
	snprintf(dir, sizeof(dir), "%.*s/build", (int) exe_dir_len, exe);
	return set_candidate(path, dir, CAI_CUDA_LIBRARY_NAME, why, why_len);
}

/* The install directories this engine was built for (the Makefile passes pg_config's). */
static void
install_dirs(cai_cuda_search *search, char *bindir_buf)
{
#ifdef CAI_INSTALL_BINDIR
	/* /proc/self/exe has symbolic links resolved: so must the directory it is compared with */
	search->install_bindir = realpath(CAI_INSTALL_BINDIR, bindir_buf) ? bindir_buf :
		CAI_INSTALL_BINDIR;
#endif
#ifdef CAI_INSTALL_PKGLIBDIR
	search->install_libdir = CAI_INSTALL_PKGLIBDIR;
#endif
}

bool
cai_cuda_loader_open(const char *path, cai_cuda_loader *out, char *why, size_t why_len)
{
	cai_cuda_search search;
	char		exe[CAI_CUDA_PATH_MAX];
	char		bindir[PATH_MAX];
	ssize_t		exe_len;

	memset(out, 0, sizeof(*out));
	memset(&search, 0, sizeof(search));
	search.explicit_path = path;
	search.env_path = getenv("CAI_CUDA_LIBRARY");
	/* the executable itself, never argv[0]: that may be any name, relative to anywhere */
	exe_len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (exe_len > 0)
	{
		exe[exe_len] = '\0';
		search.exe_path = exe;
	}
	install_dirs(&search, bindir);

	if (!cai_cuda_library_path(&search, out->path, why, why_len))
		return false;
	if (access(out->path, F_OK) != 0)
	{
		snprintf(why, why_len, "%.1000s not found", out->path);
		return false;
	}
	return try_open(out->path, out, why, why_len);
}

void
cai_cuda_loader_close(cai_cuda_loader *loader)
{
	if (loader->handle)
		dlclose(loader->handle);
	memset(loader, 0, sizeof(*loader));
}
