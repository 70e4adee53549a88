/*
 * cuda_loader.h — the engine's side of the CUDA backend: finds build/libcai_cuda.so (or the
 * installed copy), dlopen()s it and resolves its entry points.  CUDA-free and PostgreSQL-free C;
 * meant to be compiled into libcai (it needs only -ldl), so that the engine loads libcudart only
 * when pg_cai.device is auto or cuda and a CPU-only server never does.
 */
#ifndef CAI_CUDA_LOADER_H
#define CAI_CUDA_LOADER_H

#include <stdbool.h>
#include <stddef.h>

#include "backend_cuda.h"

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

#endif							/* CAI_CUDA_LOADER_H */
