/*
 * backend_loader.h — the engine's side of the CUDA backend: the entry points build/libcai_cuda.so
 * exports (kernels/backend_cuda.h implements them), and the loader that finds the library (or the
 * installed copy), dlopen()s it and resolves them.  CUDA-free and PostgreSQL-free C, part of
 * libcai (it needs only -ldl), so that the engine loads libcudart only when pg_cai.device is auto
 * or cuda and a CPU-only server never does.  The engine side owns this contract: kernels/ includes
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

/* File name the engine passes to dlopen (next to the engine's own library, or on the path). */
#define CAI_CUDA_LIBRARY_NAME "libcai_cuda.so"

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
	char		path[1024];		/* the file that was loaded */
	cai_cuda_device_count_fn device_count;
	cai_cuda_backend_create_fn backend_create;
	cai_cuda_backend_status_fn backend_status;
	cai_cuda_backend_device_fn backend_device;
} cai_cuda_loader;

/*
 * Loads the CUDA backend.  Candidates, first found wins: path (when not NULL); $CAI_CUDA_LIBRARY;
 * libcai_cuda.so beside the module that contains this code (pg_cai.so in $pkglibdir, or the cai
 * executable) and in its build/ subdirectory; then the dynamic loader's own search.  On failure
 * returns false with the reason (every candidate's dlerror) in why.
 */
bool		cai_cuda_loader_open(const char *path, cai_cuda_loader *out, char *why,
								 size_t why_len);
void		cai_cuda_loader_close(cai_cuda_loader *loader);

#ifdef __cplusplus
}
#endif

#endif							/* CAI_BACKEND_LOADER_H */
