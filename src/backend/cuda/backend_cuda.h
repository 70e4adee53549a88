/*
 * backend_cuda.h — the CUDA instance of the engine's backend table (src/engine/backend.h), as
 * exported by build/libcai_cuda.so.
 *
 * The engine dlopen()s the shared object only when pg_cai.device is auto or cuda (so a CPU-only
 * server never loads libcudart) and resolves these symbols by name:
 *
 *   cai_cuda_device_count     (cuda_kernels.h)  how many devices; 0 with the reason
 *   cai_cuda_backend_create   the table over one device
 *   cai_cuda_backend_status   waits for queued work; the first error since the last call
 *   cai_cuda_backend_device   "cuda (NVIDIA H100 80GB HBM3, cc 9.0, 132 SMs, ...; N MiB of weights)"
 *
 * What the table does with the pointers backend.h's operations receive:
 *   - buffers from ops->alloc are device memory (the forward's activations);
 *   - model weights are the table's own: a forward context has each int8 matrix uploaded
 *     row-major by prepare_i8 and every other array (norms, biases, the rotations' mix tables,
 *     the embedding, float reference weights) copied by weight_data, both through page-locked
 *     memory when the context is made; the operations receive those device pointers;
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

#include "backend_loader.h"
#include "cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The entry points of backend_loader.h's contract (their _fn types), exported by the library. */
CAI_CUDA_API cai_status cai_cuda_backend_create(const cai_cuda_backend_params *params,
												cai_backend **out, cai_error *err);
CAI_CUDA_API cai_status cai_cuda_backend_status(cai_backend *be, cai_error *err);
CAI_CUDA_API const char *cai_cuda_backend_device(const cai_backend *be);

/* Decode steps recorded as CUDA graphs, and replayed, since the backend was made (tests, bench). */
CAI_CUDA_API void cai_cuda_backend_graph_counts(const cai_backend *be, uint64_t *captures,
												uint64_t *replays);

#ifdef __cplusplus
}
#endif

#endif							/* CAI_BACKEND_CUDA_H */
