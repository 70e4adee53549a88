/*
 * gpu_util.h — helpers of the GPU tests: the shared device context, seeded random data (never
 * all zeros), device buffers that are freed with the test, and exact/near comparisons that
 * check every element and report the first few mismatches.
 */
#ifndef CAI_GPU_UTIL_H
#define CAI_GPU_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_kernels.h"

/* The context every test uses (created by main before the tests run). */
cai_cuda_ctx *gpu_ctx(void);

/* A small deterministic generator (xorshift64*), one per test. */
typedef struct gpu_rng
{
	uint64_t	s;
} gpu_rng;

void		gpu_rng_seed(gpu_rng *r, uint64_t seed);
uint64_t	gpu_rng_next(gpu_rng *r);
float		gpu_rng_float(gpu_rng *r, float lo, float hi);
int			gpu_rng_int(gpu_rng *r, int lo, int hi);	/* [lo, hi] */

void		gpu_fill_f32(gpu_rng *r, float *x, size_t n, float lo, float hi);
void		gpu_fill_i8(gpu_rng *r, int8_t *x, size_t n);	/* [-127, 127] */

/*
 * Device buffers of the running test: allocated and filled from host memory (or poisoned with
 * 0xff bytes, a NaN pattern for floats, so that unwritten outputs show), freed by gpu_free_all.
 */
void	   *gpu_alloc(size_t bytes);
void	   *gpu_upload(const void *host, size_t bytes);
bool		gpu_download(void *host, const void *dev, size_t bytes);
void		gpu_free_all(void);

/* Waits for the device and reports any error as a test failure; true when all is well. */
bool		gpu_sync(void);

/* Checks a status; on failure records a test failure with the message and returns false. */
bool		gpu_ok(cai_status st, const cai_error *err, const char *what);

/* Bitwise equality of every element; reports up to five mismatches with their indexes. */
bool		gpu_same_f32(const float *gpu, const float *cpu, size_t n, const char *what);
bool		gpu_same_i8(const int8_t *gpu, const int8_t *cpu, size_t n, const char *what);
bool		gpu_same_i32(const int32_t *gpu, const int32_t *cpu, size_t n, const char *what);

/* |gpu - cpu| <= abs_tol + rel_tol * |cpu| for every element (NaN never passes). */
bool		gpu_near_f32(const float *gpu, const float *cpu, size_t n, double abs_tol,
						 double rel_tol, const char *what);

#endif							/* CAI_GPU_UTIL_H */
