/*
 * quant.h — ggml block formats (dequantization) and the engine's int8 weight layout.
 *
 * Source tensors come in the GGUF file's formats; the engine converts every matrix to
 * per-output-channel symmetric int8: row r of W[out, in] is q[r, :] * scale[r], with
 * scale[r] = max|W[r, :]| / 127 and q in [-127, 127] (never -128, so that sign tricks in the
 * CPU kernels cannot overflow).
 */
#ifndef CAI_QUANT_H
#define CAI_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"
#include "gguf.h"

/* Elements per block (1 for plain types, 32 for Q4_0.., 256 for K-quants); 0 = unknown type. */
int64_t		ggml_type_block_elems(ggml_type type);

/* Bytes per block; 0 = unknown type. */
size_t		ggml_type_block_bytes(ggml_type type);

const char *ggml_type_name(ggml_type type);

/* True for the types cai_dequantize_row accepts. */
bool		ggml_type_can_dequantize(ggml_type type);

/* Bytes of n elements of type; false if n is not a whole number of blocks or it overflows. */
bool		ggml_row_bytes(ggml_type type, int64_t n, size_t *out);

/*
 * Dequantizes n elements (a whole number of blocks) from src to dst.
 * Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K.
 */
cai_status	cai_dequantize_row(ggml_type type, const void *src, float *dst, int64_t n,
							   cai_error *err);

/* A rounded level made a weight: NaN -> 0, clamped to [-127, 127]. */
static inline float
cai_i8_level_clamp(float v)
{
	if (v != v)
		return 0.0f;
	return v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
}

/* Symmetric per-row int8: q[r, :] = round(x[r, :] / scale[r]), scale[r] = max|x[r, :]| / 127. */
void		cai_quantize_row_i8(const float *x, int64_t n, int8_t *q, float *scale);

/*
 * One GGUF block as integer levels and the scales that make them weights, for kernels that
 * multiply the file's own levels (the CPU's block GEMM, backend/cpu/gemm_blocks.h) instead of
 * requantizing them.  Per sub-block j of 32 elements (q[32 j .. 32 j + 31]):
 *
 *   nibble/byte formats with a scale per block (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): n = 32 and
 *     x = h(d) * q + min,  min = h(dmin) when has_min, else h(d) * zero (zero: -8 for Q4_0, else 0);
 *   K-quants (Q4_K, Q5_K, Q6_K): n = 256 and
 *     x = (h(d) * sc[s]) * q + h(dmin) * m[j],  s = j for Q4_K/Q5_K (sc per 32); Q6_K has a scale
 *     per 16 elements (s = 2 j, 2 j + 1 for the halves) and no min;
 *
 * with h() an fp16 read exactly as float.  Levels: Q4_0, Q4_1, Q4_K 0..15 (a nibble); Q5_1, Q5_K
 * 0..31; Q5_0 and Q6_K are stored centred (q - 16, q - 32) and Q8_0 as it is, so those carry no
 * min.  Every product above is exact in float (at most 11 + 8 + 6 bits), so a weight rebuilt
 * this way equals cai_dequantize_row's.
 */
typedef struct cai_block_levels
{
	int			n;				/* elements of the block: 32 or 256 */
	bool		k_quant;		/* scales are h(d) * sc (and h(dmin) * m) */
	bool		has_min;		/* an independent min per sub-block */
	bool		split16;		/* a scale per 16 elements (Q6_K) */
	int8_t		zero;			/* the min as a multiple of the scale (Q4_0: -8) */
	uint16_t	d;				/* fp16 bits */
	uint16_t	dmin;			/* fp16 bits (has_min) */
	int8_t		sc[16];			/* k_quant: per 32 (or per 16 with split16) */
	int8_t		m[8];			/* k_quant with has_min: per 32, negated (x = ... + dmin * m) */
	int8_t		q[256];
} cai_block_levels;

/* True for the types cai_block_levels_decode reads (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K). */
bool		ggml_type_has_levels(ggml_type type);

/* Decodes one block of type at src (ggml_type_block_bytes bytes). */
void		cai_block_levels_decode(ggml_type type, const void *src, cai_block_levels *out);

/* Element i of a decoded block as a float weight (the formula above; tests, the embedding). */
float		cai_block_levels_weight(const cai_block_levels *b, int i);

#endif							/* CAI_QUANT_H */
