/*
 * backend_cuda.h — the CUDA instance of the engine's backend table (src/engine/backend.h), as
 * exported by build/libcai_cuda.so.
 *
 * The engine dlopen()s the shared object only when pg_cai.device is auto or cuda (so a CPU-only
 * server never loads libcudart) and resolves these symbols by name:
 *
 *   cai_cuda_device_count     (cuda_backend.h)  how many devices; 0 with the reason
 *   cai_cuda_backend_create   the table over one device, the model's weights uploaded
 *   cai_cuda_backend_status   waits for queued work; the first error since the last call
 *   cai_cuda_backend_device   "cuda (NVIDIA H100 80GB HBM3, cc 9.0, 132 SMs)"
 *
 * What the table does with the pointers backend.h's operations receive:
 *   - buffers from ops->alloc are device memory (the forward's activations);
 *   - model weights (cai_qmatrix arrays, norm and bias vectors, the rotations' mix tables, float
 *     reference weights) are copied to the device at creation and found again by their host address (views such as
 *     wq inside wqkv resolve by offset);
 *   - index arrays (ids, pos, rows) and the batch layout are host memory, uploaded per call
 *     through page-locked staging;
 *   - a GEMM output that is not backend memory (the caller's logits) is computed on the device
 *     and downloaded before the call returns;
 *   - the engine's KV pool (host, kv.c) is mirrored by a device pool with the same block ids, so
 *     block tables and prefix-cache sharing work unchanged; the host pool's memory is not used;
 *   - the float KV shadow of the reference path is mirrored on the device the same way.
 * backend.h's operations return nothing, so a failure is kept (the first one) and every later
 * operation does nothing until cai_cuda_backend_status reports it.
 */
#ifndef CAI_BACKEND_CUDA_H
#define CAI_BACKEND_CUDA_H

#include "backend.h"
#include "cuda_backend.h"
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

CAI_CUDA_API cai_status cai_cuda_backend_create(const cai_cuda_backend_params *params,
												cai_backend **out, cai_error *err);
CAI_CUDA_API cai_status cai_cuda_backend_status(cai_backend *be, cai_error *err);
CAI_CUDA_API const char *cai_cuda_backend_device(const cai_backend *be);

/* The same, as the types dlsym() results are cast to. */
typedef int (*cai_cuda_device_count_fn) (char *why, size_t why_len);
typedef cai_status (*cai_cuda_backend_create_fn) (const cai_cuda_backend_params *params,
												  cai_backend **out, cai_error *err);
typedef cai_status (*cai_cuda_backend_status_fn) (cai_backend *be, cai_error *err);
typedef const char *(*cai_cuda_backend_device_fn) (const cai_backend *be);

#ifdef __cplusplus
}
#endif

#endif							/* CAI_BACKEND_CUDA_H */
