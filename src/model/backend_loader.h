/*
 * backend_loader.h — the engine's side of the CUDA backend: the entry points build/libcai_cuda.so
 * exports (src/backend/cuda/backend_cuda.h implements them), and the loader that finds the library by
 * absolute path (the installed copy, or a build tree's), dlopen()s it and resolves them.  CUDA-free and PostgreSQL-free C, part of
 * libcai (it needs only -ldl), so that the engine loads libcudart only when pg_cai.device is auto
 * or cuda and a CPU-only server never does.  The engine side owns this contract: src/backend/cuda/ includes
 * this header, never the other way round.
 */
#ifndef CAI_BACKEND_LOADER_H
#define CAI_BACKEND_LOADER_H

#include <stdbool.h>
#include <stddef.h>

#include "backend.h"
#include "kv.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The library's file name, in the directories the loader looks in. */
#define CAI_CUDA_LIBRARY_NAME "libcai_cuda.so"
#define CAI_CUDA_PATH_MAX 1024

typedef struct cai_cuda_backend_params
{
	int			device;			/* CUDA device index */
	const cai_model *model;		/* whose weights are uploaded; must outlive the backend */
	cai_backend_limits limits;
	/* kv.c's accessors: the shared object links nothing of libcai */
	const cai_kv_layout *(*kv_pool_layout) (const cai_kv_pool *pool);
	int			(*kv_pool_n_blocks) (const cai_kv_pool *pool);
} cai_cuda_backend_params;

/* The library's entry points, as the types dlsym() results are cast to. */
typedef int (*cai_cuda_device_count_fn) (char *why, size_t why_len);
typedef cai_status (*cai_cuda_backend_create_fn) (const cai_cuda_backend_params *params,
												  cai_backend **out, cai_error *err);
typedef cai_status (*cai_cuda_backend_status_fn) (cai_backend *be, cai_error *err);
typedef const char *(*cai_cuda_backend_device_fn) (const cai_backend *be);

typedef struct cai_cuda_loader
{
	void	   *handle;			/* dlopen() handle, NULL when not loaded */
	char		path[CAI_CUDA_PATH_MAX];	/* the file loaded or tried ("" when none was) */
	cai_cuda_device_count_fn device_count;
	cai_cuda_backend_create_fn backend_create;
	cai_cuda_backend_status_fn backend_status;
	cai_cuda_backend_device_fn backend_device;
} cai_cuda_loader;

/*
 * What decides where the library is looked for.  Every candidate is an absolute path: a library
 * is code run inside the engine, so it must never come from the working directory (the server's
 * data directory) or from whatever a relative name resolves to.
 */
typedef struct cai_cuda_search
{
	const char *explicit_path;	/* a setting or flag; when set, the only candidate */
	const char *env_path;		/* $CAI_CUDA_LIBRARY; when set (and no explicit_path), the
								 * only candidate */
	const char *exe_path;		/* the running program, absolute (/proc/self/exe), or NULL */
	const char *install_bindir; /* where make install puts programs (pg_config --bindir) */
	const char *install_libdir; /* where make install puts the library (--pkglibdir) */
} cai_cuda_search;

/*
 * The file to load: explicit_path, else env_path, else for a program in install_bindir (the
 * installed engine) install_libdir's library, else (a program run from a build tree) the one in
 * <the program's directory>/build.  False with the reason in why when explicit_path or env_path
 * is not an absolute path, or the program's place or the install's library directory is unknown.
 */
bool		cai_cuda_library_path(const cai_cuda_search *search, char path[CAI_CUDA_PATH_MAX],
								  char *why, size_t why_len);

/*
 * Loads the CUDA backend from cai_cuda_library_path's file: path (a setting; NULL for none), else
 * $CAI_CUDA_LIBRARY, else the installed or built library (with the install directories this
 * engine was built for and /proc/self/exe).  On failure returns false with the reason in why
 * ("<path> not found" when there is no such file: it is not passed to dlopen then).
 */
bool		cai_cuda_loader_open(const char *path, cai_cuda_loader *out, char *why,
								 size_t why_len);
void		cai_cuda_loader_close(cai_cuda_loader *loader);

#ifdef __cplusplus
}
#endif

#endif							/* CAI_BACKEND_LOADER_H */
