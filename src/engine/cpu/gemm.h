/*
 * gemm.h — the CPU's matrix kernels: W8A8 int8 GEMM with a fused epilogue, its float reference,
 * and per-token activation quantization.  Runtime ISA dispatch: AVX-512 VNNI, else AVX2, else
 * portable C; every path gives bit-identical results (int32 accumulation is exact; the epilogue
 * is the same float expression per element).
 *
 * Layouts: activations row-major [n_tok, k]; weights row-major [n_out, k] (one output channel
 * per row, the layout cuBLASLt's TN int8 GEMM wants too); outputs row-major [n_tok, ldo].
 */
#ifndef CAI_GEMM_H
#define CAI_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "threadpool.h"

/* An int8 weight matrix prepared for the kernels. */
typedef struct cai_qmatrix
{
	int			n_out;			/* rows: output channels */
	int			k;				/* columns: input features; a multiple of 4 */
	const int8_t *q;			/* [n_out, k], values in [-127, 127] */
	const float *scale;			/* [n_out] per-channel scale */
	int32_t    *row_sum;		/* [n_out] sum of q over k (VNNI's unsigned-offset correction) */
} cai_qmatrix;

/* Fills m->row_sum (allocated by the caller, n_out entries). */
void		cai_qmatrix_prepare(cai_qmatrix *m);

/*
 * Per-token symmetric int8 quantization: q[t, :] = round(x[t, :] / s[t]), s[t] = max|x[t,:]|/127
 * (s = 0 rows quantize to zeros; the GEMM then yields exactly 0 for them).
 */
void		cai_quantize_act_i8(const float *x, int n_tok, int k, int8_t *q, float *s);

/*
 * out[t, o] (=|+=) (float)(sum_i xq[t, i] * w.q[o, i]) * xs[t] * w.scale[o]  (+ bias[o])
 * accumulate: add into out (residual connections) instead of storing.
 */
void		cai_gemm_i8(cai_threadpool *pool, const int8_t *xq, const float *xs, int n_tok,
						const cai_qmatrix *w, const float *bias, float *out, int ldo,
						bool accumulate);

/*
 * Float reference: out[t, o] (=|+=) sum_i x[t, i] * w[o, i] (+ bias[o]); each dot product
 * is summed in one fixed order, whatever n_tok, threads or blocking.
 */
void		cai_gemm_f32(cai_threadpool *pool, const float *x, int n_tok, int k,
						 const float *w, int n_out, const float *bias, float *out, int ldo,
						 bool accumulate);

/* "avx512-vnni", "avx2" or "generic": the int8 path this CPU runs. */
const char *cai_cpu_isa(void);

/* Tests: force a path ("generic", "avx2", "avx512-vnni"); false if unavailable here. */
bool		cai_cpu_force_isa(const char *name);

#endif							/* CAI_GEMM_H */
