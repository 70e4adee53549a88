/*
 * gemm_blocks.h — GEMMs over the file's own block-quantized weights (Q4_0, Q4_1, Q4_K, Q5_0,
 * Q5_1, Q5_K, Q6_K, Q8_0) with int8 activations quantized per block of 32.
 *
 * The int8 path (gemm.h) requantizes every weight to int8 per output channel.  A 4-bit GGUF
 * holds about half those bytes, and decoding one token is bound by how fast the weights stream
 * from memory, so this path keeps each weight's own level and scales (quant.h's
 * cai_block_levels) and multiplies them with activations quantized like llama.cpp's Q8_0: an
 * int8 level per element and a float scale per 32 (or, asked for, the K-quants' inputs like its
 * Q8_K, one scale per 256: faster, less faithful; see below).  Per block of 32 a row's weight
 * is x = ws q + wm, so
 *
 *   sum_i x_i a_i = sa * (ws * sum_i q_i qa_i + wm * sum_i qa_i)
 *
 * with an exact int32 dot product and the activations' block sums computed once per token.
 * Super-block activations.  A K-quant's ws = d sc and wm = dmin m carry small integer
 * sub-block scales sc and m under one float d and dmin per 256 inputs; with activations of one
 * sa per 256 too (quantized in groups of CAI_KQUANT_BLOCKS blocks, act_group below) a
 * super-block is
 *
 *   sa * (d * I + dmin * M),  I = sum_b sc_b * sum_(i in b) q_i qa_i,  M = sum_b m_b * asum_b
 *
 * with I and M exact int32 sums (Q6_K: sc per 16 inputs, no min): the float operations come
 * once per 256 inputs rather than once per 32, and a kernel may fold sc into the levels
 * (sc q fits in 16 bits) and let the integer units do the rest: a Q4_K_M file's prefill runs
 * about 1.65x as fast on AMX.  The price is the activations' resolution: one outlier coarsens 255 inputs, not 31
 * (docs/numerics.md has what it costs), so it is a choice (activations int8_256), not the
 * default.
 *
 * Layout.  Rows go in groups of 8 (one lane each of an AVX2 vector: eight rows' sums come out
 * of one instruction sequence and no horizontal reduction is needed).  For group g and block b
 * of 32 inputs:
 *   - nibble formats (levels 0..15: Q4_0, Q4_1, Q4_K): 128 bytes; byte 32 p + 4 r + i holds
 *     row r's element 8 p + i in its low nibble and element 8 p + 4 + i in its high nibble;
 *   - byte formats (Q5_0, Q5_1, Q5_K, Q8_0): 256 bytes; byte 32 s + 4 r + i is row r's
 *     element 4 s + i (a signed level);
 *   - Q6_K: 192 bytes, its levels plus 32 (0..63, unsigned, so its kernel needs no sign step) in
 *     two parts, as the file keeps them: byte 32 p + 4 r + i holds the low four bits of row r's
 *     element 8 p + i in its low nibble and of element 8 p + 4 + i in its high one; byte
 *     128 + 32 h + 4 r + i holds the high two bits of elements 16 h + 4 c + i at bits 2 c
 *     (c = 0..3);
 *   - scales as the file has them: an fp16 d (and dmin) per row and block, or for K-quants per
 *     row and super-block of 256 with an int8 sub-block scale (and min) per row and block
 *     (Q6_K: two, one per 16).  Memory per weight: Q4_0 4.5 bits (the file's), Q4_1 5, Q4_K
 *     4.625, Q6_K 6.625, Q8_0 8.5; the 5-bit formats take a byte per level.
 *
 * Results are the same bits on every path: per row and token, blocks (with super-block
 * activations a K-quant's super-blocks) are accumulated in order as acc = acc + sa * term,
 * term = ws * (float) isum [+ wm * (float) asum] (super-blocks: term = d * (float) I
 * [+ dmin * (float) M]), each operation a rounded float
 * multiply or add (no fused multiply-add), the same on the portable and the AVX2 kernels.  A
 * format whose min is a fixed multiple of its scale (Q4_0's -8 ws) folds it into the integer
 * sum instead: term = ws * (float) (isum + zero * asum), exact and one float product fewer.
 * (The AVX-512 paths run the VNNI kernels of gemm_blocks_vnni.c, two groups at a time with
 * vpdpbusd, one instance per format; the avx-vnni path those of gemm_blocks_avxvnni.c, one
 * group at a time with the 256-bit vpdpbusd; the AVX2 path the AVX2 kernel.)
 */
#ifndef CAI_GEMM_BLOCKS_H
#define CAI_GEMM_BLOCKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"
#include "gguf.h"
#include "threadpool.h"

#define CAI_BLOCK_ROWS 8		/* rows per group */
#define CAI_BLOCK_ELEMS 32		/* inputs per block */
#define CAI_KQUANT_BLOCKS 8		/* blocks of a K-quant's super-block of 256 */

/*
 * The version of the layout above: prepared weights kept in a cache file (weight_cache.h) hold
 * it in their key, so raise it with any change to the bytes cai_cpu_bmatrix_pack writes (group
 * size, byte order, scales).  A change to the struct's fields also needs the cache's export
 * (cpu/weight_io.c), which a static assertion on its size points to.
 */
#define CAI_BLOCK_LAYOUT_VERSION 3

typedef struct cai_cpu_bmatrix
{
	int			n_out;			/* rows: output channels */
	int			k;				/* inputs: a multiple of 32 (of 256 for K-quants) */
	int			n_groups;		/* ceil(n_out / 8); a last partial group is zero-padded */
	ggml_type	type;			/* the source format */
	bool		nibble;			/* 4-bit levels, two per byte */
	bool		k_quant;		/* super-block scales d * sc */
	bool		has_min;		/* a min per row and block (dmin, or dmin * m) */
	bool		split16;		/* a scale per 16 inputs (Q6_K) */
	int8_t		zero;			/* without a min: min = d * zero (Q4_0: -8) */
	const uint8_t *q;			/* [n_groups][k / 32][128 or 256] */
	const uint16_t *d;			/* fp16: [n_groups][k / 32 or k / 256][8] */
	const uint16_t *dmin;		/* fp16, same shape (has_min), else NULL */
	const int8_t *sc;			/* k_quant: [n_groups][k / 32][8] (split16: [.][.][2][8]) */
	const int8_t *m;			/* k_quant with has_min: [n_groups][k / 32][8] */
	void	   *mem;			/* the one allocation holding all of the above */
	size_t		bytes;
} cai_cpu_bmatrix;

/* Whether the CPU multiplies this type's levels directly (quant.h's ggml_type_has_levels). */
bool		cai_cpu_bmatrix_supports(ggml_type type);

/* The bytes of a group's block of 32 inputs in type's layout (0: not supported). */
size_t		cai_cpu_bmatrix_block_bytes(ggml_type type);

/*
 * Whether m's format flags are the ones its type's kernel assumes (a matrix read from a file
 * must be checked: the kernel is chosen by the type, and reads the type's layout).
 */
bool		cai_cpu_bmatrix_layout_matches(const cai_cpu_bmatrix *m);

/*
 * Repacks rows [0, rows) of a tensor of type (each row k elements, ggml_row_bytes apart,
 * starting at data) into out.  A scale that is not a finite number is refused (CAI_ERR_FORMAT,
 * naming the row), as is a k that is not a whole number of the type's blocks.
 */
cai_status	cai_cpu_bmatrix_pack(ggml_type type, const void *data, int rows, int k,
								 cai_cpu_bmatrix *out, cai_error *err);
void		cai_cpu_bmatrix_free(cai_cpu_bmatrix *m);

/*
 * Row o of m as float weights (k to dst): the weights the GEMM multiplies, for tests and the
 * embedding of a model whose head shares it.
 */
void		cai_cpu_bmatrix_row(const cai_cpu_bmatrix *m, int o, float *dst);

/*
 * The blocks of 32 that share one activation scale when type's GEMM takes super-block
 * activations: CAI_KQUANT_BLOCKS for the K-quants, else 1 (the other formats' arithmetic is per
 * block whatever the group).
 */
int			cai_act_group(ggml_type type);

/*
 * Symmetric int8 quantization of x [n_tok, k] (k a multiple of 32 * group) in groups of `group`
 * blocks of 32: for each group, s = max|x| / 127, q = rint(x * 127 / max) clamped to +-127 (a
 * group of zeros: s = 0, q = 0); per block of 32 its s (the group's) and sum = the sum of its q.
 * s and sum are [n_tok][k / 32].
 */
void		cai_quantize_act_blocks(const float *x, int n_tok, int k, int group, int8_t *q,
									float *s, int16_t *sum);

/*
 * out[t, o] (=|+=) sum over blocks (see above) (+ bias[o]) for the first n_out rows of w
 * (n_out <= w->n_out) and the n_tok quantized rows xq [n_tok, k], xs and xsum [n_tok, k / 32],
 * quantized in groups of act_group blocks: a K-quant takes the super-block arithmetic when it is
 * CAI_KQUANT_BLOCKS (reading each super-block's scale at its first block), the per-block one
 * when it is 1.
 */
void		cai_gemm_blocks(cai_threadpool *pool, const int8_t *xq, const float *xs,
							const int16_t *xsum, int act_group, int n_tok,
							const cai_cpu_bmatrix *w, int n_out, const float *bias, float *out,
							int ldo, bool accumulate);

/* The portable kernel alone, whatever the CPU (tests compare the paths with it). */
void		cai_gemm_blocks_portable(const int8_t *xq, const float *xs, const int16_t *xsum,
									 int act_group, int n_tok, const cai_cpu_bmatrix *w,
									 int n_out, const float *bias, float *out, int ldo,
									 bool accumulate);

#endif							/* CAI_GEMM_BLOCKS_H */
