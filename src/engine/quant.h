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

#endif							/* CAI_QUANT_H */
