/*
 * gemm.h — the CPU's matrix kernels: W8A8 int8 GEMM with a fused epilogue, its float reference,
 * and per-token activation quantization.  Runtime ISA dispatch: AVX-512 VNNI with AMX tiles,
 * else AVX-512 VNNI, else AVX-VNNI (AVX2's kernels here; 256-bit vpdpbusd in the block GEMM),
 * else AVX2, else portable C; every path gives bit-identical results (int32
 * accumulation is exact; the epilogue is the same float expression per element).
 *
 * Layouts: activations row-major [n_tok, k]; outputs row-major [n_tok, ldo].  The model's
 * weights come row-major (weights.h's cai_qmatrix); the CPU backend's prepare_i8 copies each
 * into its own panels of 16 channels: for every 4 inputs the 16 channels' 4 bytes are
 * adjacent, so one 64-byte load feeds a vpdpbusd that updates 16 channels' sums at once and no
 * horizontal reduction is needed, and a panel's 16 steps for 64 inputs are one AMX tile
 * (gemm.c).  Packing permutes the bytes of each 16-row panel in
 * place, so the first rows of a packed matrix, up to a multiple of 16, are still a valid
 * matrix.  A matrix that is not packed runs a portable row-major kernel: correct on every
 * path, not fast (tests).
 */
#ifndef CAI_GEMM_H
#define CAI_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "threadpool.h"

/* Channels per panel of the packed layout. */
#define CAI_QMATRIX_PANEL 16

/*
 * The version of the panel layout below: prepared weights kept in a cache file (weight_cache.h)
 * hold it in their key.  Raise it with any change to how cai_cpu_qmatrix_pack lays out bytes.
 */
#define CAI_QMATRIX_LAYOUT_VERSION 1

/* An int8 weight matrix as the CPU kernels read it. */
typedef struct cai_cpu_qmatrix
{
	int			n_out;			/* rows: output channels */
	int			k;				/* columns: input features; a multiple of 4 */
	const int8_t *q;			/* n_out * k bytes: row-major, or packed (below) */
	const float *scale;			/* [n_out] per-channel scale */
	bool		packed;			/* q is in the CPU's panel layout */
} cai_cpu_qmatrix;

/*
 * Packs a row-major matrix of values in [-127, 127] in place into the panel layout (a no-op
 * when already packed; a matrix whose k is not a multiple of 4 stays row-major).  Returns false
 * only when out of memory (the matrix is then unchanged).
 */
bool		cai_cpu_qmatrix_pack(cai_cpu_qmatrix *m);

/*
 * The panel layout.  Panel p holds channels [16p, 16p + r) (r = 16 but for a last partial
 * panel) in the n_out * k bytes their rows occupy row-major; within it, step g (inputs 4g to
 * 4g + 3) takes 4 * r bytes, channel c's 4 inputs at 4 * c, each stored biased (w ^ 0x80, the
 * unsigned operand of vpdpbusd).
 */
static inline int
cai_cpu_qmatrix_panel_width(const cai_cpu_qmatrix *m, int p)
{
	int			r = m->n_out - p * CAI_QMATRIX_PANEL;

	return r < CAI_QMATRIX_PANEL ? r : CAI_QMATRIX_PANEL;
}

/* Row o of m as row-major int8 values (k bytes to dst), whatever the layout. */
static inline void
cai_cpu_qmatrix_row(const cai_cpu_qmatrix *m, int o, int8_t *dst)
{
	const int	k = m->k;

	if (!m->packed)
	{
		for (int i = 0; i < k; i++)
			dst[i] = m->q[(size_t) o * k + i];
	}
	else
	{
		int			p = o / CAI_QMATRIX_PANEL;
		int			r = cai_cpu_qmatrix_panel_width(m, p);
		const uint8_t *base = (const uint8_t *) m->q + (size_t) p * CAI_QMATRIX_PANEL * k +
			(size_t) 4 * (o % CAI_QMATRIX_PANEL);

		for (int g = 0; g < k / 4; g++)
			for (int b = 0; b < 4; b++)
				dst[4 * g + b] = (int8_t) (base[(size_t) g * 4 * r + b] ^ 0x80);
	}
}

/* The whole of m row-major (n_out * k bytes to dst). */
static inline void
cai_cpu_qmatrix_unpack(const cai_cpu_qmatrix *m, int8_t *dst)
{
	for (int o = 0; o < m->n_out; o++)
		cai_cpu_qmatrix_row(m, o, dst + (size_t) o * m->k);
}

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
						const cai_cpu_qmatrix *w, const float *bias, float *out, int ldo,
						bool accumulate);

/*
 * Float reference: out[t, o] (=|+=) sum_i x[t, i] * w[o, i] (+ bias[o]); each dot product
 * is summed in one fixed order, whatever n_tok, threads or blocking.
 */
void		cai_gemm_f32(cai_threadpool *pool, const float *x, int n_tok, int k,
						 const float *w, int n_out, const float *bias, float *out, int ldo,
						 bool accumulate);

/*
 * "avx512-amx", "avx512-vnni", "avx-vnni", "avx2" or "generic": the int8 path this CPU runs.
 * avx512-amx is avx512-vnni with AMX int8 tiles (Linux granted) for the int8 GEMM and the
 * attention's scores; avx-vnni is avx2 with the block GEMM's 256-bit AVX-VNNI kernels (CPUs
 * with AVX-VNNI but no AVX-512): the same results.
 */
const char *cai_cpu_isa(void);

/* Whether name is one of those paths' names. */
bool		cai_cpu_isa_known(const char *name);

/* Forces a path (one of those names: tests, cai_cpu_use_isa); false if unavailable here. */
bool		cai_cpu_force_isa(const char *name);

/*
 * AMX tiles on the avx512-amx path: configure the calling thread's eight tiles as 16 rows of 64
 * bytes (their contents start at zero), and release them when done (nothing then for a context
 * switch to save).  The GEMM and the attention's scores use this one shape.
 */
void		cai_amx_configure(void);
void		cai_amx_release(void);

#endif							/* CAI_GEMM_H */
