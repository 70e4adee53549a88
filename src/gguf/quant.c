/*
 * quant.c — ggml block formats: sizes, names, dequantization to float, and the engine's
 * per-row symmetric int8 quantization.
 *
 * Block layouts (ggml's block_* structs, packed, little-endian; "half" is IEEE fp16):
 *   Q4_0  32 elems, 18 bytes: half d; u8 qs[16].  x[j] = (lo(qs[j]) - 8) d, x[j+16] = (hi - 8) d
 *   Q4_1  32 elems, 20 bytes: half d, m; u8 qs[16].  x[j] = lo(qs[j]) d + m, x[j+16] = hi d + m
 *   Q5_0  32 elems, 22 bytes: half d; u8 qh[4]; u8 qs[16].  As Q4_0 with a 5th bit per value
 *        from the little-endian 32-bit qh (bit j for element j), centred on 16:
 *        x[j] = (lo(qs[j]) | bit j << 4) - 16) d, x[j+16] = (hi | bit j+16 << 4) - 16) d
 *   Q5_1  32 elems, 24 bytes: half d, m; u8 qh[4]; u8 qs[16].  The same 5-bit values, unsigned:
 *        x = q d + m
 *   Q8_0  32 elems, 34 bytes: half d; i8 qs[32].  x[j] = qs[j] d
 *   Q4_K 256 elems, 144 bytes: half d, dmin; u8 scales[12]; u8 qs[128].  Eight sub-blocks of 32
 *        with 6-bit scale sc and min m each (packed in scales[12]); x = d sc q - dmin m.  Each 64
 *        elements take 32 bytes of qs: low nibbles are the first 32, high nibbles the next 32.
 *   Q5_K 256 elems, 176 bytes: as Q4_K plus u8 qh[32] (before qs) giving each value a 5th bit:
 *        sub-block s takes bit s of qh[l] for its element l.
 *   Q6_K 256 elems, 210 bytes: u8 ql[128]; u8 qh[64]; i8 scales[16]; half d.  x = d sc (q - 32),
 *        q = 4 low bits from ql, 2 high bits from qh, one scale per 16 elements.
 */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "util.h"

#define QK 32					/* elements per block of the simple formats */
#define QK_K 256				/* elements per K-quant super-block */

/* Size and name of every ggml type this engine knows (dequantizable or not). */
typedef struct ggml_type_info
{
	ggml_type	type;
	const char *name;
	int64_t		block_elems;
	size_t		block_bytes;
	bool		can_dequantize;
} ggml_type_info;

static const ggml_type_info type_table[] = {
	{GGML_TYPE_F32, "f32", 1, 4, true},
	{GGML_TYPE_F16, "f16", 1, 2, true},
	{GGML_TYPE_Q4_0, "q4_0", QK, 2 + QK / 2, true},
	{GGML_TYPE_Q4_1, "q4_1", QK, 4 + QK / 2, true},
	{GGML_TYPE_Q5_0, "q5_0", QK, 2 + 4 + QK / 2, true},
	{GGML_TYPE_Q5_1, "q5_1", QK, 4 + 4 + QK / 2, true},
	{GGML_TYPE_Q8_0, "q8_0", QK, 2 + QK, true},
	{GGML_TYPE_Q8_1, "q8_1", QK, 4 + QK, false},
	{GGML_TYPE_Q2_K, "q2_k", QK_K, QK_K / 16 + QK_K / 4 + 4, false},
	{GGML_TYPE_Q3_K, "q3_k", QK_K, QK_K / 8 + QK_K / 4 + 12 + 2, false},
	{GGML_TYPE_Q4_K, "q4_k", QK_K, 4 + 12 + QK_K / 2, true},
	{GGML_TYPE_Q5_K, "q5_k", QK_K, 4 + 12 + QK_K / 8 + QK_K / 2, true},
	{GGML_TYPE_Q6_K, "q6_k", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, true},
	{GGML_TYPE_Q8_K, "q8_k", QK_K, 4 + QK_K + QK_K / 16 * 2, false},
	{GGML_TYPE_I8, "i8", 1, 1, false},
	{GGML_TYPE_I16, "i16", 1, 2, false},
	{GGML_TYPE_I32, "i32", 1, 4, false},
	{GGML_TYPE_I64, "i64", 1, 8, false},
	{GGML_TYPE_F64, "f64", 1, 8, false},
	{GGML_TYPE_BF16, "bf16", 1, 2, true},
};

/* The table entry of a type; NULL for types this engine does not know. */
static const ggml_type_info *
type_info(ggml_type type)
{
	for (size_t i = 0; i < sizeof(type_table) / sizeof(type_table[0]); i++)
	{
		if (type_table[i].type == type)
			return &type_table[i];
	}
	return NULL;
}

/* Elements per block; 0 for an unknown type. */
int64_t
ggml_type_block_elems(ggml_type type)
{
	const ggml_type_info *info = type_info(type);

	return info ? info->block_elems : 0;
}

/* Bytes per block; 0 for an unknown type. */
size_t
ggml_type_block_bytes(ggml_type type)
{
	const ggml_type_info *info = type_info(type);

	return info ? info->block_bytes : 0;
}

/* ggml's lower-case name of a type ("q4_k"), for messages. */
const char *
ggml_type_name(ggml_type type)
{
	const ggml_type_info *info = type_info(type);

	return info ? info->name : "unknown";
}

/* True for the types cai_dequantize_row decodes. */
bool
ggml_type_can_dequantize(ggml_type type)
{
	const ggml_type_info *info = type_info(type);

	return info && info->can_dequantize;
}

/* Bytes of n elements of type: false for a partial block, a negative n or overflow. */
bool
ggml_row_bytes(ggml_type type, int64_t n, size_t *out)
{
	const ggml_type_info *info = type_info(type);

	if (!info || n < 0 || n % info->block_elems != 0)
		return false;
	return cai_mul_size((size_t) (n / info->block_elems), info->block_bytes, out);
}

/* Reads a little-endian fp16 at p (blocks are packed, so p may be unaligned). */
static inline float
load_half(const uint8_t *p)
{
	uint16_t	h;

	memcpy(&h, p, sizeof(h));
	return cai_fp16_to_fp32(h);
}

/* One decoder per block format, n_blocks whole blocks each (layouts atop this file). */
static void
dequantize_q4_0(const uint8_t *src, float *dst, int64_t n_blocks)
{
	for (int64_t b = 0; b < n_blocks; b++, src += 18, dst += QK)
	{
		float		d = load_half(src);
		const uint8_t *qs = src + 2;

		for (int j = 0; j < QK / 2; j++)
		{
			dst[j] = (float) ((qs[j] & 0x0f) - 8) * d;
			dst[j + QK / 2] = (float) ((qs[j] >> 4) - 8) * d;
		}
	}
}

static void
dequantize_q4_1(const uint8_t *src, float *dst, int64_t n_blocks)
{
	for (int64_t b = 0; b < n_blocks; b++, src += 20, dst += QK)
	{
		float		d = load_half(src);
		float		m = load_half(src + 2);
		const uint8_t *qs = src + 4;

		for (int j = 0; j < QK / 2; j++)
		{
			dst[j] = (float) (qs[j] & 0x0f) * d + m;
			dst[j + QK / 2] = (float) (qs[j] >> 4) * d + m;
		}
	}
}

/* The 5-bit values of a Q5_0/Q5_1 block: 4 low bits from qs, the 5th from qh. */
static void
q5_values(const uint8_t *qh_bytes, const uint8_t *qs, int *q)
{
	uint32_t	qh = (uint32_t) qh_bytes[0] | (uint32_t) qh_bytes[1] << 8 |
		(uint32_t) qh_bytes[2] << 16 | (uint32_t) qh_bytes[3] << 24;

	for (int j = 0; j < QK / 2; j++)
	{
		q[j] = (qs[j] & 0x0f) | (int) ((qh >> j) & 1u) << 4;
		q[j + QK / 2] = (qs[j] >> 4) | (int) ((qh >> (j + QK / 2)) & 1u) << 4;
	}
}

static void
dequantize_q5_0(const uint8_t *src, float *dst, int64_t n_blocks)
{
	for (int64_t b = 0; b < n_blocks; b++, src += 22, dst += QK)
	{
		float		d = load_half(src);
		int			q[QK];

		q5_values(src + 2, src + 6, q);
		for (int j = 0; j < QK; j++)
			dst[j] = (float) (q[j] - 16) * d;
	}
}

static void
dequantize_q5_1(const uint8_t *src, float *dst, int64_t n_blocks)
{
	for (int64_t b = 0; b < n_blocks; b++, src += 24, dst += QK)
	{
		float		d = load_half(src);
		float		m = load_half(src + 2);
		int			q[QK];

		q5_values(src + 4, src + 8, q);
		for (int j = 0; j < QK; j++)
			dst[j] = (float) q[j] * d + m;
	}
}

static void
dequantize_q8_0(const uint8_t *src, float *dst, int64_t n_blocks)
{
	for (int64_t b = 0; b < n_blocks; b++, src += 34, dst += QK)
	{
		float		d = load_half(src);
		const int8_t *qs = (const int8_t *) (src + 2);

		for (int j = 0; j < QK; j++)
			dst[j] = (float) qs[j] * d;
	}
}

/*
 * Unpacks the 6-bit scale and min of sub-block j (0..7) from a K-quant's 12 scale bytes:
 * bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3 likewise; sub-blocks 4-7
 * keep their low 4 bits in the nibbles of bytes 8-11 and their top 2 bits in the spare top bits
 * of bytes 0-7.
 */
static inline void
k_scale_min(int j, const uint8_t *scales, uint8_t *sc, uint8_t *m)
{
	if (j < 4)
	{
		*sc = scales[j] & 63;
		*m = scales[j + 4] & 63;
	}
	else
	{
		*sc = (uint8_t) ((scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4));
		*m = (uint8_t) ((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
	}
}

static void
dequantize_q4_k(const uint8_t *src, float *dst, int64_t n_blocks)
{
	for (int64_t b = 0; b < n_blocks; b++, src += 144)
	{
		float		d = load_half(src);
		float		dmin = load_half(src + 2);
		const uint8_t *scales = src + 4;
		const uint8_t *qs = src + 16;

		/* each 64 elements: two sub-blocks sharing 32 bytes (low nibbles, then high) */
		for (int j = 0; j < QK_K / 64; j++, qs += 32, dst += 64)
		{
			uint8_t		sc0,
						m0,
						sc1,
						m1;
			float		d0,
						d1,
						mm0,
						mm1;

			k_scale_min(2 * j, scales, &sc0, &m0);
			k_scale_min(2 * j + 1, scales, &sc1, &m1);
			d0 = d * sc0;
			mm0 = dmin * m0;
			d1 = d * sc1;
			mm1 = dmin * m1;
			for (int l = 0; l < 32; l++)
			{
				dst[l] = d0 * (float) (qs[l] & 0x0f) - mm0;
				dst[l + 32] = d1 * (float) (qs[l] >> 4) - mm1;
			}
		}
	}
}

static void
dequantize_q5_k(const uint8_t *src, float *dst, int64_t n_blocks)
{
	for (int64_t b = 0; b < n_blocks; b++, src += 176)
	{
		float		d = load_half(src);
		float		dmin = load_half(src + 2);
		const uint8_t *scales = src + 4;
		const uint8_t *qh = src + 16;
		const uint8_t *qs = src + 48;

		for (int j = 0; j < QK_K / 64; j++, qs += 32, dst += 64)
		{
			uint8_t		sc0,
						m0,
						sc1,
						m1;
			float		d0,
						d1,
						mm0,
						mm1;
			int			bit0 = 2 * j;
			int			bit1 = 2 * j + 1;

			k_scale_min(2 * j, scales, &sc0, &m0);
			k_scale_min(2 * j + 1, scales, &sc1, &m1);
			d0 = d * sc0;
			mm0 = dmin * m0;
			d1 = d * sc1;
			mm1 = dmin * m1;
			for (int l = 0; l < 32; l++)
			{
				int			q0 = (qs[l] & 0x0f) | (((qh[l] >> bit0) & 1) << 4);
				int			q1 = (qs[l] >> 4) | (((qh[l] >> bit1) & 1) << 4);

				dst[l] = d0 * (float) q0 - mm0;
				dst[l + 32] = d1 * (float) q1 - mm1;
			}
		}
	}
}

static void
dequantize_q6_k(const uint8_t *src, float *dst, int64_t n_blocks)
{
	for (int64_t b = 0; b < n_blocks; b++, src += 210)
	{
		const uint8_t *ql = src;
		const uint8_t *qh = src + 128;
		const int8_t *sc = (const int8_t *) (src + 192);
		float		d = load_half(src + 208);

		/* two halves of 128 elements: 64 bytes of ql, 32 of qh and 8 scales each */
		for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, dst += 128)
		{
			for (int l = 0; l < 32; l++)
			{
				int			is = l / 16;
				int			q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
				int			q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
				int			q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
				int			q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;

				dst[l] = d * (float) sc[is] * (float) q1;
				dst[l + 32] = d * (float) sc[is + 2] * (float) q2;
				dst[l + 64] = d * (float) sc[is + 4] * (float) q3;
				dst[l + 96] = d * (float) sc[is + 6] * (float) q4;
			}
		}
	}
}

/*
 * Dequantizes n elements of type from src (a whole number of blocks) into dst.  The caller
 * guarantees src holds ggml_row_bytes(type, n) bytes (gguf_open validated tensor sizes).
 */
cai_status
cai_dequantize_row(ggml_type type, const void *src, float *dst, int64_t n, cai_error *err)
{
	const ggml_type_info *info = type_info(type);
	const uint8_t *p = src;
	int64_t		n_blocks;

	if (!info)
		return cai_fail(err, CAI_ERR_UNSUPPORTED, "dequantize: unknown ggml type %d", (int) type);
	if (!info->can_dequantize)
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"dequantize: ggml type %s is not supported", info->name);
	if (n < 0 || n % info->block_elems != 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"dequantize: %lld elements is not a whole number of %s blocks of %lld",
						(long long) n, info->name, (long long) info->block_elems);
	n_blocks = n / info->block_elems;

	switch (type)
	{
		case GGML_TYPE_F32:
			memcpy(dst, src, (size_t) n * sizeof(float));
			break;
		case GGML_TYPE_F16:
			for (int64_t i = 0; i < n; i++)
				dst[i] = load_half(p + 2 * i);
			break;
		case GGML_TYPE_BF16:
			for (int64_t i = 0; i < n; i++)
			{
				uint16_t	b;

				memcpy(&b, p + 2 * i, sizeof(b));
				dst[i] = cai_bf16_to_fp32(b);
			}
			break;
		case GGML_TYPE_Q4_0:
			dequantize_q4_0(p, dst, n_blocks);
			break;
		case GGML_TYPE_Q4_1:
			dequantize_q4_1(p, dst, n_blocks);
			break;
		case GGML_TYPE_Q5_0:
			dequantize_q5_0(p, dst, n_blocks);
			break;
		case GGML_TYPE_Q5_1:
			dequantize_q5_1(p, dst, n_blocks);
			break;
		case GGML_TYPE_Q8_0:
			dequantize_q8_0(p, dst, n_blocks);
			break;
		case GGML_TYPE_Q4_K:
			dequantize_q4_k(p, dst, n_blocks);
			break;
		case GGML_TYPE_Q5_K:
			dequantize_q5_k(p, dst, n_blocks);
			break;
		case GGML_TYPE_Q6_K:
			dequantize_q6_k(p, dst, n_blocks);
			break;
		default:
			return cai_fail(err, CAI_ERR_INTERNAL,
							"dequantize: no decoder for ggml type %s", info->name);
	}
	return CAI_OK;
}

/*
 * Per-row symmetric int8: scale = max|x| / 127 and q = roundf(x / scale), rounding halves away
 * from zero (roundf, independent of the FPU rounding mode), clamped to [-127, 127]; a NaN
 * element quantizes to 0.  A row of
 * zeros (or one whose max is not a finite positive number) gets scale 0 and all-zero q.
 */
void
cai_quantize_row_i8(const float *x, int64_t n, int8_t *q, float *scale)
{
	float		amax = 0.0f;
	float		inv;

	for (int64_t i = 0; i < n; i++)
	{
		float		a = fabsf(x[i]);

		if (a > amax)
			amax = a;
	}
	if (!(amax > 0.0f) || !isfinite(amax))
	{
		*scale = 0.0f;
		memset(q, 0, (size_t) (n > 0 ? n : 0));
		return;
	}
	*scale = amax / 127.0f;
	inv = 127.0f / amax;
	for (int64_t i = 0; i < n; i++)
	{
		q[i] = (int8_t) cai_i8_level_clamp(roundf(x[i] * inv));
	}
}

/* ---------------------------------------------------------------------------------------------
 * Integer levels (quant.h's cai_block_levels)
 * ------------------------------------------------------------------------------------------- */

static inline uint16_t
half_bits(const uint8_t *p)
{
	uint16_t	h;

	memcpy(&h, p, sizeof(h));
	return h;
}

bool
ggml_type_has_levels(ggml_type type)
{
	switch (type)
	{
		case GGML_TYPE_Q4_0:
		case GGML_TYPE_Q4_1:
		case GGML_TYPE_Q5_0:
		case GGML_TYPE_Q5_1:
		case GGML_TYPE_Q8_0:
		case GGML_TYPE_Q4_K:
		case GGML_TYPE_Q5_K:
		case GGML_TYPE_Q6_K:
			return true;
		default:
			return false;
	}
}

/* The K-quants' eight 6-bit scales and (negated) mins. */
static void
k_levels_scales(const uint8_t *scales, cai_block_levels *out)
{
	for (int j = 0; j < 8; j++)
	{
		uint8_t		sc,
					m;

		k_scale_min(j, scales, &sc, &m);
		out->sc[j] = (int8_t) sc;
		out->m[j] = (int8_t) -(int) m;
	}
}

void
cai_block_levels_decode(ggml_type type, const void *block, cai_block_levels *out)
{
	const uint8_t *src = block;
	int			q5[QK];

	memset(out, 0, sizeof(*out));
	out->n = QK;
	switch (type)
	{
		case GGML_TYPE_Q4_0:
			out->d = half_bits(src);
			out->zero = -8;
			for (int j = 0; j < QK / 2; j++)
			{
				out->q[j] = (int8_t) (src[2 + j] & 0x0f);
				out->q[j + QK / 2] = (int8_t) (src[2 + j] >> 4);
			}
			break;
		case GGML_TYPE_Q4_1:
			out->d = half_bits(src);
			out->dmin = half_bits(src + 2);
			out->has_min = true;
			for (int j = 0; j < QK / 2; j++)
			{
				out->q[j] = (int8_t) (src[4 + j] & 0x0f);
				out->q[j + QK / 2] = (int8_t) (src[4 + j] >> 4);
			}
			break;
		case GGML_TYPE_Q5_0:
			out->d = half_bits(src);
			q5_values(src + 2, src + 6, q5);
			for (int j = 0; j < QK; j++)
				out->q[j] = (int8_t) (q5[j] - 16);
			break;
		case GGML_TYPE_Q5_1:
			out->d = half_bits(src);
			out->dmin = half_bits(src + 2);
			out->has_min = true;
			q5_values(src + 4, src + 8, q5);
			for (int j = 0; j < QK; j++)
				out->q[j] = (int8_t) q5[j];
			break;
		case GGML_TYPE_Q8_0:
			out->d = half_bits(src);
			memcpy(out->q, src + 2, QK);
			break;
		case GGML_TYPE_Q4_K:
			out->n = QK_K;
			out->k_quant = out->has_min = true;
			out->d = half_bits(src);
			out->dmin = half_bits(src + 2);
			k_levels_scales(src + 4, out);
			/* each 64 elements: two sub-blocks sharing 32 bytes (low nibbles, then high) */
			for (int j = 0; j < QK_K / 64; j++)
				for (int l = 0; l < 32; l++)
				{
					out->q[64 * j + l] = (int8_t) (src[16 + 32 * j + l] & 0x0f);
					out->q[64 * j + 32 + l] = (int8_t) (src[16 + 32 * j + l] >> 4);
				}
			break;
		case GGML_TYPE_Q5_K:
			out->n = QK_K;
			out->k_quant = out->has_min = true;
			out->d = half_bits(src);
			out->dmin = half_bits(src + 2);
			k_levels_scales(src + 4, out);
			for (int j = 0; j < QK_K / 64; j++)
				for (int l = 0; l < 32; l++)
				{
					const uint8_t qs = src[48 + 32 * j + l];
					const uint8_t qh = src[16 + l];

					out->q[64 * j + l] = (int8_t) ((qs & 0x0f) | (((qh >> (2 * j)) & 1) << 4));
					out->q[64 * j + 32 + l] = (int8_t) ((qs >> 4) | (((qh >> (2 * j + 1)) & 1) << 4));
				}
			break;
		case GGML_TYPE_Q6_K:
			out->n = QK_K;
			out->k_quant = out->split16 = true;
			out->d = half_bits(src + 208);
			memcpy(out->sc, src + 192, 16);
			for (int half = 0; half < 2; half++)
			{
				const uint8_t *ql = src + 64 * half;
				const uint8_t *qh = src + 128 + 32 * half;
				int8_t	   *q = out->q + 128 * half;

				for (int l = 0; l < 32; l++)
				{
					q[l] = (int8_t) (((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32);
					q[l + 32] = (int8_t) (((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32);
					q[l + 64] = (int8_t) (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
					q[l + 96] = (int8_t) (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
				}
			}
			break;
		default:
			break;
	}
}

float
cai_block_levels_weight(const cai_block_levels *b, int i)
{
	const float d = cai_fp16_to_fp32(b->d);
	const int	j = i / 32;

	if (!b->k_quant)
		return d * (float) b->q[i] + (b->has_min ? cai_fp16_to_fp32(b->dmin) : d * (float) b->zero);
	if (b->split16)
		return (d * (float) b->sc[i / 16]) * (float) b->q[i];
	return (d * (float) b->sc[j]) * (float) b->q[i] + cai_fp16_to_fp32(b->dmin) * (float) b->m[j];
}
