/*
 * gemm_blocks.c — the block-weight GEMM (gemm_blocks.h): repacking a GGUF tensor's levels into
 * groups of 8 rows, per-block activation quantization, and the portable and AVX2 kernels.
 */
#include "gemm_blocks.h"
#include "gemm_blocks_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "gemm.h"
#include "quant.h"
#include "util.h"

/* Rows of a group and the token tile the AVX2 kernel reads a group's weights once for. */
#define GROUP CAI_BLOCK_ROWS
#define TOKEN_TILE 4

/* ---------------------------------------------------------------------------------------
 * Formats
 * --------------------------------------------------------------------------------------- */

typedef struct bformat
{
	ggml_type	type;
	bool		nibble;
	bool		k_quant;
	bool		has_min;
	bool		split16;
	int8_t		zero;
} bformat;

/* quant.h's cai_block_levels, per type */
static const bformat formats[] = {
	{GGML_TYPE_Q4_0, true, false, false, false, -8},
	{GGML_TYPE_Q4_1, true, false, true, false, 0},
	{GGML_TYPE_Q4_K, true, true, true, false, 0},
	{GGML_TYPE_Q5_0, false, false, false, false, 0},
	{GGML_TYPE_Q5_1, false, false, true, false, 0},
	{GGML_TYPE_Q5_K, false, true, true, false, 0},
	{GGML_TYPE_Q6_K, false, true, false, true, 0},
	{GGML_TYPE_Q8_0, false, false, false, false, 0},
};

static const bformat *
format_of(ggml_type type)
{
	for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++)
		if (formats[i].type == type)
			return &formats[i];
	return NULL;
}

bool
cai_cpu_bmatrix_supports(ggml_type type)
{
	return format_of(type) != NULL;
}

/*
 * Bytes of a group's block of 32 inputs: 4-bit levels two to a byte, Q6_K's 6-bit levels as a
 * nibble and a 2-bit part, the other formats a byte per level.
 */
static inline int
layout_block_bytes(bool nibble, bool split16)
{
	return nibble ? 16 * GROUP : split16 ? 24 * GROUP : 32 * GROUP;
}

static inline int
block_bytes_of(const cai_cpu_bmatrix *m)
{
	return layout_block_bytes(m->nibble, m->split16);
}

bool
cai_cpu_bmatrix_layout_matches(const cai_cpu_bmatrix *m)
{
	const bformat *f = format_of(m->type);

	return f && m->nibble == f->nibble && m->k_quant == f->k_quant && m->has_min == f->has_min &&
		m->split16 == f->split16 && m->zero == f->zero;
}

size_t
cai_cpu_bmatrix_block_bytes(ggml_type type)
{
	const bformat *f = format_of(type);

	return f ? (size_t) layout_block_bytes(f->nibble, f->split16) : 0;
}


/* ---------------------------------------------------------------------------------------
 * Repacking
 * --------------------------------------------------------------------------------------- */

static size_t
align64(size_t n)
{
	return (n + 63) & ~(size_t) 63;
}

/* Sizes every array of m (n_out, k and the format flags set) and allocates them as one. */
static bool
bmatrix_alloc(cai_cpu_bmatrix *m)
{
	const size_t nb = (size_t) m->k / CAI_BLOCK_ELEMS;
	const size_t g = (size_t) m->n_groups;
	const size_t n_scales = g * (m->k_quant ? (size_t) m->k / 256 : nb) * GROUP;
	const size_t q_bytes = align64(g * nb * block_bytes_of(m));
	const size_t d_bytes = align64(n_scales * sizeof(uint16_t));
	const size_t dmin_bytes = m->has_min ? d_bytes : 0;
	const size_t sc_bytes = m->k_quant ? align64(g * nb * GROUP * (m->split16 ? 2 : 1)) : 0;
	const size_t m_bytes = m->k_quant && m->has_min ? align64(g * nb * GROUP) : 0;
	uint8_t    *p;

	m->bytes = q_bytes + d_bytes + dmin_bytes + sc_bytes + m_bytes;
	m->mem = cai_alloc_large(m->bytes);
	if (!m->mem)
		return false;
	memset(m->mem, 0, m->bytes);
	p = m->mem;
	m->q = p;
	m->d = (const uint16_t *) (p + q_bytes);
	m->dmin = m->has_min ? (const uint16_t *) (p + q_bytes + d_bytes) : NULL;
	m->sc = m->k_quant ? (const int8_t *) (p + q_bytes + d_bytes + dmin_bytes) : NULL;
	m->m = m_bytes ? (const int8_t *) (p + q_bytes + d_bytes + dmin_bytes + sc_bytes) : NULL;
	return true;
}

/* Places the levels of block b (32 of them) of row lane in group g. */
static void
place_levels(cai_cpu_bmatrix *m, int g, int b, int lane, const int8_t *lv)
{
	const int	nb = m->k / CAI_BLOCK_ELEMS;
	uint8_t    *dst = (uint8_t *) m->q + ((size_t) g * nb + b) * block_bytes_of(m);

	if (m->nibble)
		for (int p = 0; p < 4; p++)
			for (int i = 0; i < 4; i++)
				dst[32 * p + 4 * lane + i] = (uint8_t) ((lv[8 * p + i] & 0x0f) |
														((lv[8 * p + 4 + i] & 0x0f) << 4));
	else if (m->split16)
		for (int s = 0; s < 8; s++)
			for (int i = 0; i < 4; i++)
			{
				const int	u = (lv[4 * s + i] + SPLIT16_LEVEL_OFFSET) & 0x3f;
				uint8_t    *lo = &dst[32 * (s / 2) + 4 * lane + i];
				uint8_t    *hi = &dst[SPLIT16_HIGH_BITS + 32 * (s / 4) + 4 * lane + i];
				const int	lo_shift = 4 * (s % 2),
							hi_shift = 2 * (s % 4);

				*lo = (uint8_t) ((*lo & ~(0x0f << lo_shift)) | (u & 0x0f) << lo_shift);
				*hi = (uint8_t) ((*hi & ~(0x03 << hi_shift)) | (u >> 4) << hi_shift);
			}
	else
		for (int s = 0; s < 8; s++)
			for (int i = 0; i < 4; i++)
				dst[32 * s + 4 * lane + i] = (uint8_t) lv[4 * s + i];
}

/* Places one decoded source block of row r. */
static void
place_block(cai_cpu_bmatrix *m, int r, int src_block, const cai_block_levels *lv)
{
	const int	g = r / GROUP;
	const int	lane = r % GROUP;
	const int	subs = lv->n / CAI_BLOCK_ELEMS;
	uint16_t   *d = (uint16_t *) m->d;
	uint16_t   *dmin = (uint16_t *) m->dmin;

	for (int j = 0; j < subs; j++)
	{
		const int	b = src_block * subs + j;

		place_levels(m, g, b, lane, lv->q + CAI_BLOCK_ELEMS * j);
		if (!m->k_quant)
		{
			d[cai_bscale_index(m, g, b) + lane] = lv->d;
			if (dmin)
				dmin[cai_bscale_index(m, g, b) + lane] = lv->dmin;
			continue;
		}
		if (m->split16)
		{
			((int8_t *) m->sc)[cai_bsub_index(m, g, b) + lane] = lv->sc[2 * j];
			((int8_t *) m->sc)[cai_bsub_index(m, g, b) + GROUP + lane] = lv->sc[2 * j + 1];
		}
		else
			((int8_t *) m->sc)[cai_bsub_index(m, g, b) + lane] = lv->sc[j];
		if (m->m)
			((int8_t *) m->m)[cai_bsub_index(m, g, b) + lane] = lv->m[j];
	}
	if (m->k_quant)
	{
		d[cai_bscale_index(m, g, src_block * subs) + lane] = lv->d;
		if (dmin)
			dmin[cai_bscale_index(m, g, src_block * subs) + lane] = lv->dmin;
	}
}

cai_status
cai_cpu_bmatrix_pack(ggml_type type, const void *data, int rows, int k, cai_cpu_bmatrix *out,
					 cai_error *err)
{
	const bformat *f = format_of(type);
	const int64_t per_block = ggml_type_block_elems(type);
	const size_t src_block_bytes = ggml_type_block_bytes(type);
	size_t		row_bytes;
	cai_cpu_bmatrix m;

	memset(out, 0, sizeof(*out));
	if (!f)
		return cai_fail(err, CAI_ERR_UNSUPPORTED, "the cpu has no block kernel for %s weights",
						ggml_type_name(type));
	if (rows < 1 || k < 1 || k % per_block != 0 || !ggml_row_bytes(type, k, &row_bytes))
		return cai_fail(err, CAI_ERR_FORMAT,
						"a %s matrix of %d rows of %d inputs is not whole blocks of %lld",
						ggml_type_name(type), rows, k, (long long) per_block);
	memset(&m, 0, sizeof(m));
	m.n_out = rows;
	m.k = k;
	m.n_groups = (rows + GROUP - 1) / GROUP;
	m.type = type;
	m.nibble = f->nibble;
	m.k_quant = f->k_quant;
	m.has_min = f->has_min;
	m.split16 = f->split16;
	m.zero = f->zero;
	if (!bmatrix_alloc(&m))
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory repacking a %s matrix",
						ggml_type_name(type));
	for (int r = 0; r < rows; r++)
	{
		const uint8_t *row = (const uint8_t *) data + (size_t) r * row_bytes;

		for (int sb = 0; sb < k / per_block; sb++)
		{
			cai_block_levels lv;

			cai_block_levels_decode(type, row + (size_t) sb * src_block_bytes, &lv);
			if (!isfinite(cai_fp16_to_fp32(lv.d)) ||
				(lv.has_min && !isfinite(cai_fp16_to_fp32(lv.dmin))))
			{
				free(m.mem);
				return cai_fail(err, CAI_ERR_FORMAT,
								"a %s matrix has a scale that is not a finite number (row %d, block %d)",
								ggml_type_name(type), r, sb);
			}
			place_block(&m, r, sb, &lv);
		}
	}
	*out = m;
	return CAI_OK;
}

void
cai_cpu_bmatrix_free(cai_cpu_bmatrix *m)
{
	if (!m)
		return;
	free(m->mem);
	memset(m, 0, sizeof(*m));
}

/* ---------------------------------------------------------------------------------------
 * The scales of a block, as both kernels compute them
 * --------------------------------------------------------------------------------------- */

/* Row lane's level e of block b in group g. */
static inline int
level_at(const cai_cpu_bmatrix *m, int g, int b, int lane, int e)
{
	const int	nb = m->k / CAI_BLOCK_ELEMS;
	const uint8_t *src = m->q + ((size_t) g * nb + b) * block_bytes_of(m);

	if (m->nibble)
	{
		int			within = e % 8;
		uint8_t		byte = src[32 * (e / 8) + 4 * lane + within % 4];

		return within >= 4 ? byte >> 4 : byte & 0x0f;
	}
	if (m->split16)
	{
		const int	s = e / 4,
					i = e % 4;
		const int	lo = (src[32 * (s / 2) + 4 * lane + i] >> (4 * (s % 2))) & 0x0f;
		const int	hi = (src[SPLIT16_HIGH_BITS + 32 * (s / 4) + 4 * lane + i] >> (2 * (s % 4))) & 0x03;

		return (lo | hi << 4) - SPLIT16_LEVEL_OFFSET;
	}
	return (int8_t) src[32 * (e / 4) + 4 * lane + e % 4];
}

/* ws (half h of a split block: ws of inputs 16 h ..) of row lane, block b of group g. */
static inline float
weight_scale(const cai_cpu_bmatrix *m, int g, int b, int lane, int h)
{
	const float d = cai_fp16_to_fp32(m->d[cai_bscale_index(m, g, b) + lane]);

	if (!m->k_quant)
		return d;
	return d * (float) m->sc[cai_bsub_index(m, g, b) + (m->split16 ? h * GROUP : 0) + lane];
}

/* wm of row lane, block b of group g (has_min or zero != 0); ws is weight_scale's. */
static inline float
weight_min(const cai_cpu_bmatrix *m, int g, int b, int lane, float ws)
{
	if (!m->has_min)
		return ws * (float) m->zero;
	if (!m->k_quant)
		return cai_fp16_to_fp32(m->dmin[cai_bscale_index(m, g, b) + lane]);
	return cai_fp16_to_fp32(m->dmin[cai_bscale_index(m, g, b) + lane]) *
		(float) m->m[cai_bsub_index(m, g, b) + lane];
}

static inline bool
has_min_term(const cai_cpu_bmatrix *m)
{
	return m->has_min || m->zero != 0;
}

void
cai_cpu_bmatrix_row(const cai_cpu_bmatrix *m, int o, float *dst)
{
	const int	g = o / GROUP;
	const int	lane = o % GROUP;

	for (int b = 0; b < m->k / CAI_BLOCK_ELEMS; b++)
		for (int e = 0; e < CAI_BLOCK_ELEMS; e++)
		{
			float		ws = weight_scale(m, g, b, lane, e / 16);
			float		x = ws * (float) level_at(m, g, b, lane, e);

			if (has_min_term(m))
				x = x + weight_min(m, g, b, lane, weight_scale(m, g, b, lane, 0));
			dst[(size_t) b * CAI_BLOCK_ELEMS + e] = x;
		}
}

/* ---------------------------------------------------------------------------------------
 * Activations
 * --------------------------------------------------------------------------------------- */

int
cai_act_group(ggml_type type)
{
	const bformat *f = format_of(type);

	return f && f->k_quant ? CAI_KQUANT_BLOCKS : 1;
}

/* A group whose largest value is 0 (or whose 127 / max overflows): levels, scales, sums 0. */
static void
quantize_act_zeros(int blocks, int8_t *qb, float *s, int16_t *sum)
{
	for (int b = 0; b < blocks; b++)
	{
		memset(qb + b * CAI_BLOCK_ELEMS, 0, CAI_BLOCK_ELEMS);
		s[b] = 0.0f;
		sum[b] = 0;
	}
}

/* One group of `blocks` blocks of 32: its levels, and each block's scale and sum. */
static void
quantize_act_group(const float *xb, int blocks, int8_t *qb, float *s, int16_t *sum)
{
	const int	n = blocks * CAI_BLOCK_ELEMS;
	float		amax = 0.0f;
	float		inv;

	for (int i = 0; i < n; i++)
	{
		float		a = fabsf(xb[i]);

		amax = a > amax ? a : amax;
	}
	inv = amax > 0.0f ? 127.0f / amax : 0.0f;
	if (!(amax > 0.0f) || isinf(inv))
	{
		quantize_act_zeros(blocks, qb, s, sum);
		return;
	}
	for (int b = 0; b < blocks; b++)
	{
		int			total = 0;

		for (int i = b * CAI_BLOCK_ELEMS; i < (b + 1) * CAI_BLOCK_ELEMS; i++)
		{
			float		v = xb[i] * inv;

			v = v > -127.0f ? v : -127.0f;
			v = v < 127.0f ? v : 127.0f;
			qb[i] = (int8_t) (int) rintf(v);
			total += qb[i];
		}
		s[b] = amax / 127.0f;
		sum[b] = (int16_t) total;
	}
}

#if defined(__x86_64__)
/*
 * quantize_act_group in eight lanes, the same bits: max_ps(a, m) is the scalar loop's
 * "a > m ? a : m" lane by lane (a NaN is passed over in both), and the maximum of the lanes'
 * maxima, none of them NaN, is the same whatever the order; the clamps are the scalar ones;
 * cvtps rounds to nearest even as rintf does in the default rounding mode.
 */
__attribute__((target("avx2"))) static void
quantize_act_group_avx2(const float *xb, int blocks, int8_t *qb, float *s, int16_t *sum)
{
	const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	__m256		m = _mm256_setzero_ps();
	__m128		h;
	float		amax,
				inv;

	for (int i = 0; i < 4 * blocks; i++)
		m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + 8 * i), abs_mask), m);
	h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
	h = _mm_max_ps(h, _mm_movehl_ps(h, h));
	h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
	amax = _mm_cvtss_f32(h);
	inv = amax > 0.0f ? 127.0f / amax : 0.0f;
	if (!(amax > 0.0f) || isinf(inv))
	{
		quantize_act_zeros(blocks, qb, s, sum);
		return;
	}
	for (int b = 0; b < blocks; b++)
	{
		const float *xblk = xb + b * CAI_BLOCK_ELEMS;
		__m256i		iv[4],
					total;
		__m128i		t4;

		for (int i = 0; i < 4; i++)
		{
			__m256		v = _mm256_mul_ps(_mm256_loadu_ps(xblk + 8 * i), _mm256_set1_ps(inv));

			v = _mm256_max_ps(v, _mm256_set1_ps(-127.0f));
			v = _mm256_min_ps(v, _mm256_set1_ps(127.0f));
			iv[i] = _mm256_cvtps_epi32(v);
		}
		/* the packs work within 128-bit lanes: the permutation puts the four-byte runs in order */
		_mm256_storeu_si256((__m256i *) (qb + b * CAI_BLOCK_ELEMS),
							_mm256_permutevar8x32_epi32(_mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]),
																		   _mm256_packs_epi32(iv[2], iv[3])),
														_mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
		total = _mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3]));
		t4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
		t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, _MM_SHUFFLE(1, 0, 3, 2)));
		t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, _MM_SHUFFLE(2, 3, 0, 1)));
		s[b] = amax / 127.0f;
		sum[b] = (int16_t) _mm_cvtsi128_si32(t4);
	}
}
#endif

void
cai_quantize_act_blocks(const float *x, int n_tok, int k, int group, int8_t *q, float *s,
						int16_t *sum)
{
	const int	nb = k / CAI_BLOCK_ELEMS;
	void		(*quantize) (const float *, int, int8_t *, float *, int16_t *) = quantize_act_group;

#if defined(__x86_64__)
	/* every path but the portable one has AVX2 (gemm.h) */
	if (strcmp(cai_cpu_isa(), "generic") != 0)
		quantize = quantize_act_group_avx2;
#endif
	for (int t = 0; t < n_tok; t++)
		for (int b = 0; b < nb; b += group)
		{
			const size_t i = (size_t) t * nb + b;

			quantize(x + i * CAI_BLOCK_ELEMS, group, q + i * CAI_BLOCK_ELEMS, s + i, sum + i);
		}
}

/* ---------------------------------------------------------------------------------------
 * Kernels
 * --------------------------------------------------------------------------------------- */


/*
 * A K-quant's super-block of row lane in group g from block b0 (gemm_blocks.h): the exact
 * integer sums I and M against a token's levels a (of the super-block's first input) and the
 * activations' block sums asum.
 */
static void
kquant_superblock_sums(const cai_cpu_bmatrix *m, int g, int b0, int lane, const int8_t *a,
					   const int16_t *asum, int32_t *i_sum, int32_t *m_sum)
{
	int32_t		I = 0,
				M = 0;

	for (int b = b0; b < b0 + CAI_KQUANT_BLOCKS; b++)
	{
		const int8_t *sc = m->sc + cai_bsub_index(m, g, b);
		int32_t		isum[2] = {0, 0};

		for (int e = 0; e < CAI_BLOCK_ELEMS; e++)
			isum[e / 16] += level_at(m, g, b, lane, e) * a[(b - b0) * CAI_BLOCK_ELEMS + e];
		if (m->split16)
			I += sc[lane] * isum[0] + sc[GROUP + lane] * isum[1];
		else
			I += sc[lane] * (isum[0] + isum[1]);
		if (m->has_min)
			M += m->m[cai_bsub_index(m, g, b) + lane] * asum[b - b0];
	}
	*i_sum = I;
	*m_sum = M;
}

/*
 * Portable: row by row, block by block (with super-block activations a K-quant's super-block by
 * super-block), in the order every path follows.
 */
static void
group_portable(const bgemm_job *j, int g, int thread)
{
	const cai_cpu_bmatrix *m = j->w;
	const int	k = m->k;
	const int	nb = k / CAI_BLOCK_ELEMS;
	const bool	superblocks = m->k_quant && j->superblocks;

	for (int lane = 0; lane < GROUP && g * GROUP + lane < j->n_out; lane++)
		for (int t = 0; t < j->n_tok; t++)
		{
			const int8_t *a = j->xq + (size_t) t * k;
			float		acc = 0.0f;

			for (int b = 0; b < nb && superblocks; b += CAI_KQUANT_BLOCKS)
			{
				const size_t tb = (size_t) t * nb + b;
				int32_t		I,
							M;
				float		term;

				kquant_superblock_sums(m, g, b, lane, a + (size_t) b * CAI_BLOCK_ELEMS,
									   j->xsum + tb, &I, &M);
				term = cai_fp16_to_fp32(m->d[cai_bscale_index(m, g, b) + lane]) * (float) I;
				if (m->has_min)
					term = term + cai_fp16_to_fp32(m->dmin[cai_bscale_index(m, g, b) + lane]) *
						(float) M;
				acc = acc + j->xs[tb] * term;
			}
			for (int b = 0; b < nb && !superblocks; b++)
			{
				int32_t		isum[2] = {0, 0};
				float		term;

				for (int e = 0; e < CAI_BLOCK_ELEMS; e++)
					isum[e / 16] += level_at(m, g, b, lane, e) * a[b * CAI_BLOCK_ELEMS + e];
				if (m->split16)
					term = weight_scale(m, g, b, lane, 0) * (float) isum[0] +
						weight_scale(m, g, b, lane, 1) * (float) isum[1];
				else
					term = weight_scale(m, g, b, lane, 0) *
						(float) (isum[0] + isum[1] + m->zero * j->xsum[(size_t) t * nb + b]);
				if (m->has_min)
					term = term + weight_min(m, g, b, lane, weight_scale(m, g, b, lane, 0)) *
						(float) j->xsum[(size_t) t * nb + b];
				acc = acc + j->xs[(size_t) t * nb + b] * term;
			}
			cai_bstore_result(j, t, g * GROUP + lane, acc);
		}
}

#if defined(__x86_64__)
#define TARGET_AVX2_F16C __attribute__((target("avx2,fma,f16c")))

static inline int32_t
load_i32(const int8_t *p)
{
	int32_t		v;

	memcpy(&v, p, sizeof(v));
	return v;
}

/*
 * The helpers below widen each row's int16 pair sums into its int32 lane with vpmaddwd; the
 * multiplier `scale` holds one int16 per pair: 1 for the plain sum, or a K-quant row's sub-block
 * scale twice (scale_pairs), which makes the lane sc times the sum at no extra instruction.
 * Exact either way: an int16 times an int8, two of them, in an int32.
 */

/* A group's 8 int8 sub-block scales at p as vpmaddwd's multiplier: row r's twice in lane r. */
TARGET_AVX2_F16C static inline __m256i
scale_pairs(const int8_t *p)
{
	const __m256i s = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) p));

	return _mm256_blend_epi16(s, _mm256_slli_epi32(s, 16), 0xaa);
}

/* The 8 rows' integer sums of a nibble block against one token's 32 levels at a. */
TARGET_AVX2_F16C static inline __m256i
nibble_sums(const __m256i *lo, const __m256i *hi, const int8_t *a, __m256i scale)
{
	__m256i		s16 = _mm256_setzero_si256();

	for (int p = 0; p < 4; p++)
	{
		s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo[p], _mm256_set1_epi32(load_i32(a + 8 * p))));
		s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[p], _mm256_set1_epi32(load_i32(a + 8 * p + 4))));
	}
	return _mm256_madd_epi16(s16, scale);
}

/* The same for a byte block, steps [s0, s0 + n): |w| times a with w's sign. */
TARGET_AVX2_F16C static inline __m256i
byte_sums(const __m256i *w, const __m256i *wabs, const int8_t *a, int s0, int n, __m256i scale)
{
	__m256i		s32 = _mm256_setzero_si256();

	for (int s = s0; s < s0 + n; s++)
	{
		__m256i		signed_a = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(a + 4 * s)), w[s]);

		s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(_mm256_maddubs_epi16(wabs[s], signed_a), scale));
	}
	return s32;
}

/*
 * byte_sums for levels of at most 32 in magnitude (Q5_0, Q5_1, Q5_K: 5 bits; Q6_K: -32..31),
 * n a multiple of 4: four steps' pair sums, each at most 2 * 32 * 127, add up in int16 without
 * overflow (4 * 8128 = 32512), so one widening per four steps instead of one per step.  Exact
 * integers either way: the same sums as byte_sums.
 */
TARGET_AVX2_F16C static inline __m256i
byte_sums_narrow(const __m256i *w, const __m256i *wabs, const int8_t *a, int s0, int n,
				 __m256i scale)
{
	__m256i		s32 = _mm256_setzero_si256();

	for (int s = s0; s < s0 + n; s += 4)
	{
		__m256i		s16 = _mm256_setzero_si256();

		for (int i = s; i < s + 4; i++)
			s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(wabs[i], _mm256_sign_epi8(
														 _mm256_set1_epi32(load_i32(a + 4 * i)), w[i])));
		s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(s16, scale));
	}
	return s32;
}

/*
 * The 8 rows' sums of unsigned levels of at most 63 (Q6_K's, stored + 32) against a's steps
 * [s0, s0 + 4), that is one half block: vpmaddubsw takes the levels as they are, two steps' pair
 * sums (each at most 2 * 63 * 127) add up in int16 without overflow (32004), then widen.
 */
TARGET_AVX2_F16C static inline __m256i
unsigned_half_sums(const __m256i *w, const int8_t *a, int s0, __m256i scale)
{
	__m256i		s32 = _mm256_setzero_si256();

	for (int s = s0; s < s0 + 4; s += 2)
	{
		__m256i		s16 = _mm256_add_epi16(
										   _mm256_maddubs_epi16(w[s], _mm256_set1_epi32(load_i32(a + 4 * s))),
										   _mm256_maddubs_epi16(w[s + 1], _mm256_set1_epi32(load_i32(a + 4 * s + 4))));

		s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(s16, scale));
	}
	return s32;
}

/*
 * M of a K-quant super-block (gemm_blocks.h) for the 8 rows and one token: lane r of mins[i]
 * holds row r's mins of blocks 2i and 2i + 1 as two int16 (min_pairs), and the token's block
 * sums asum lie two to a 32-bit word in the same order, so four vpmaddwd make the exact sum.
 */
TARGET_AVX2_F16C static inline __m256i
superblock_min_sums(const __m256i *mins, const int16_t *asum)
{
	__m256i		s32 = _mm256_setzero_si256();

	for (int i = 0; i < CAI_KQUANT_BLOCKS / 2; i++)
	{
		int32_t		two;

		memcpy(&two, asum + 2 * i, sizeof(two));
		s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(mins[i], _mm256_set1_epi32(two)));
	}
	return s32;
}

/* superblock_min_sums' mins of group g's super-block from block b0. */
TARGET_AVX2_F16C static inline void
min_pairs(const cai_cpu_bmatrix *m, int g, int b0, __m256i *mins)
{
	for (int i = 0; i < CAI_KQUANT_BLOCKS / 2; i++)
		mins[i] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(
			_mm_loadl_epi64((const __m128i *) (m->m + cai_bsub_index(m, g, b0 + 2 * i))),
			_mm_loadl_epi64((const __m128i *) (m->m + cai_bsub_index(m, g, b0 + 2 * i + 1)))));
}

/*
 * Group g for tokens [t0, t0 + nt), nt <= TOKEN_TILE: the weights of a block read once.  The
 * format's flags and the K-quants' arithmetic (superblocks, the job's) are compile-time
 * constants in each instance (GROUP_AVX2 below), so the block loop carries no branches on them.
 * With super-block activations a K-quant's blocks add sc times their sums (Q6_K: per half, less
 * 32 sc times the half's activation sum) into one int32 I per row and token, the sub-block
 * scales riding on the widening vpmaddwd; the super-block's last block adds the mins' M and does
 * the float operations, once per 256 inputs.  With per-block activations each block converts
 * its sums and does the float operations with ws = d sc and wm = dmin m (Q6_K: ws and ws_hi per
 * half), as the other formats do with d and dmin.
 */
TARGET_AVX2_F16C static inline __attribute__((always_inline)) void
tile_avx2(const bgemm_job *j, int g, int t0, int nt, const bool nibble, const bool k_quant,
		  const bool has_min, const bool split16, const bool narrow, const int zero,
		  const bool superblocks, const uint8_t *unpacked)
{
	const cai_cpu_bmatrix *m = j->w;
	const int	k = m->k;
	const int	nb = k / CAI_BLOCK_ELEMS;
	const int	bbytes = layout_block_bytes(nibble, split16);
	const uint8_t *qg = m->q + (size_t) g * nb * bbytes;
	const int8_t *xq = j->xq + (size_t) t0 * k;
	const float *xs = j->xs + (size_t) t0 * nb;
	const int16_t *xsum = j->xsum + (size_t) t0 * nb;
	const int16_t *xsum_lo = split16 ? j->xsum_lo + (size_t) t0 * nb : NULL;
	const __m256i ones = _mm256_set1_epi16(1);
	__m256		acc[TOKEN_TILE];
	__m256i		isuper[TOKEN_TILE];
	__m256		d = _mm256_setzero_ps(),
				dmin = _mm256_setzero_ps();

	for (int t = 0; t < nt; t++)
	{
		acc[t] = _mm256_setzero_ps();
		isuper[t] = _mm256_setzero_si256();
	}
	for (int b = 0; b < nb; b++)
	{
		const uint8_t *qb = qg + (size_t) b * bbytes;
		const bool	last = k_quant && superblocks &&
			b % CAI_KQUANT_BLOCKS == CAI_KQUANT_BLOCKS - 1;
		__m256i		v[8],
					u[8],
					scale = ones,
					scale_hi = ones,
					offset32 = _mm256_setzero_si256(),
					mins[CAI_KQUANT_BLOCKS / 2];
		__m256		ws = _mm256_setzero_ps(),
					ws_hi = _mm256_setzero_ps(),
					wm = _mm256_setzero_ps();

		/*
		 * the group's first tile streams its weights from memory and asks for what it reads
		 * ahead (gemm_blocks_internal.h); later tiles find them in the cache
		 */
		if (t0 == 0 && !(split16 && unpacked))
			cai_bprefetch_ahead(m, g, 1, b, CAI_BPREFETCH_BLOCKS);
		if (!k_quant || b % CAI_KQUANT_BLOCKS == 0)
		{
			d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (m->d + cai_bscale_index(m, g, b))));
			if (has_min)
				dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (m->dmin + cai_bscale_index(m, g, b))));
		}
		if (k_quant && superblocks)
		{
			const int8_t *sc = m->sc + cai_bsub_index(m, g, b);

			scale = scale_pairs(sc);
			if (split16)
			{
				/* 32 sc_lo and 32 sc_hi of row r side by side in lane r (4096 at most) */
				const __m256i lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) sc)),
							hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) (sc + GROUP)));

				scale_hi = scale_pairs(sc + GROUP);
				offset32 = _mm256_blend_epi16(_mm256_slli_epi32(lo, 5), _mm256_slli_epi32(hi, 21), 0xaa);
			}
			if (has_min && last)
				min_pairs(m, g, b - (CAI_KQUANT_BLOCKS - 1), mins);
		}
		else if (k_quant)
		{
			const int8_t *sc = m->sc + cai_bsub_index(m, g, b);

			ws = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) sc))));
			if (split16)
				ws_hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
								_mm_loadl_epi64((const __m128i *) (sc + GROUP)))));
			if (has_min)
				wm = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
								_mm_loadl_epi64((const __m128i *) (m->m + cai_bsub_index(m, g, b))))));
		}
		else
		{
			ws = d;
			wm = dmin;
		}
		if (nibble)
			for (int p = 0; p < 4; p++)
			{
				__m256i		raw = _mm256_loadu_si256((const __m256i *) (qb + 32 * p));

				v[p] = _mm256_and_si256(raw, _mm256_set1_epi8(0x0f));
				u[p] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0f));
			}
		else if (split16 && unpacked)
			for (int s = 0; s < 8; s++)
				v[s] = _mm256_loadu_si256((const __m256i *) (unpacked + (size_t) b * 32 * GROUP + 32 * s));
		else if (split16)
		{
			/*
			 * steps 2p and 2p + 1 are the nibbles of vector p; step 4h + c's high two bits sit
			 * at bits 2c of vector h of the high parts.  The 16-bit shifts move bits across
			 * bytes only into positions the mask 0x30 clears.
			 */
			const __m256i nib = _mm256_set1_epi8(0x0f),
						top = _mm256_set1_epi8(0x30);

			for (int p = 0; p < 4; p++)
			{
				__m256i		raw = _mm256_loadu_si256((const __m256i *) (qb + 32 * p));

				v[2 * p] = _mm256_and_si256(raw, nib);
				v[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib);
			}
			for (int h = 0; h < 2; h++)
			{
				__m256i		hb = _mm256_loadu_si256((const __m256i *) (qb + SPLIT16_HIGH_BITS + 32 * h));

				v[4 * h] = _mm256_or_si256(v[4 * h], _mm256_and_si256(_mm256_slli_epi16(hb, 4), top));
				v[4 * h + 1] = _mm256_or_si256(v[4 * h + 1], _mm256_and_si256(_mm256_slli_epi16(hb, 2), top));
				v[4 * h + 2] = _mm256_or_si256(v[4 * h + 2], _mm256_and_si256(hb, top));
				v[4 * h + 3] = _mm256_or_si256(v[4 * h + 3], _mm256_and_si256(_mm256_srli_epi16(hb, 2), top));
			}
		}
		else
			for (int s = 0; s < 8; s++)
			{
				v[s] = _mm256_loadu_si256((const __m256i *) (qb + 32 * s));
				u[s] = _mm256_sign_epi8(v[s], v[s]);
			}
		for (int t = 0; t < nt; t++)
		{
			const int8_t *a = xq + (size_t) t * k + (size_t) b * CAI_BLOCK_ELEMS;
			const size_t tb = (size_t) t * nb + b;
			__m256i		isum;
			__m256		term;

			if (split16 && !superblocks)
			{
				/* the stored levels' sums less 32 times each half's activation sum: exact */
				const int	lo = xsum_lo[tb];
				__m256i		isum_lo = _mm256_add_epi32(unsigned_half_sums(v, a, 0, ones),
													   _mm256_set1_epi32(-SPLIT16_LEVEL_OFFSET * lo));
				__m256i		isum_hi = _mm256_add_epi32(unsigned_half_sums(v, a, 4, ones),
													   _mm256_set1_epi32(-SPLIT16_LEVEL_OFFSET * (xsum[tb] - lo)));

				term = _mm256_add_ps(_mm256_mul_ps(ws, _mm256_cvtepi32_ps(isum_lo)),
									 _mm256_mul_ps(ws_hi, _mm256_cvtepi32_ps(isum_hi)));
			}
			else
			{
				if (nibble)
					isum = nibble_sums(v, u, a, scale);
				else if (split16)
				{
					/* as above, the halves' corrections times their scales in one vpmaddwd */
					const int	lo = xsum_lo[tb];
					const uint32_t halves = (uint16_t) lo | (uint32_t) (uint16_t) (xsum[tb] - lo) << 16;

					isum = _mm256_add_epi32(unsigned_half_sums(v, a, 0, scale),
											unsigned_half_sums(v, a, 4, scale_hi));
					isum = _mm256_sub_epi32(isum, _mm256_madd_epi16(offset32, _mm256_set1_epi32((int32_t) halves)));
				}
				else if (narrow)
					isum = byte_sums_narrow(v, u, a, 0, 8, scale);
				else
					isum = byte_sums(v, u, a, 0, 8, scale);
				if (k_quant && superblocks)
				{
					const size_t tb0 = tb - b % CAI_KQUANT_BLOCKS;

					isuper[t] = _mm256_add_epi32(isuper[t], isum);
					if (!last)
						continue;
					term = _mm256_mul_ps(d, _mm256_cvtepi32_ps(isuper[t]));
					isuper[t] = _mm256_setzero_si256();
					if (has_min)
						term = _mm256_add_ps(term, _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(
												superblock_min_sums(mins, xsum + tb0))));
					acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_set1_ps(xs[tb0]), term));
					continue;
				}
				if (zero != 0)
					isum = _mm256_add_epi32(isum, _mm256_set1_epi32(zero * xsum[tb]));
				term = _mm256_mul_ps(ws, _mm256_cvtepi32_ps(isum));
			}
			if (has_min)
				term = _mm256_add_ps(term, _mm256_mul_ps(wm, _mm256_set1_ps((float) xsum[tb])));
			acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_set1_ps(xs[tb]), term));
		}
	}
	for (int t = 0; t < nt; t++)
	{
		float		lanes[GROUP];

		_mm256_storeu_ps(lanes, acc[t]);
		for (int lane = 0; lane < GROUP && g * GROUP + lane < j->n_out; lane++)
			cai_bstore_result(j, t0 + t, g * GROUP + lane, lanes[lane]);
	}
}

/*
 * tile_avx2 over all token tiles of the job, for one arithmetic of a K-quant's (superblocks)
 * and the levels from the layout or, Q6_K's, from the thread's scratch (unpacked).
 */
TARGET_AVX2_F16C static inline __attribute__((always_inline)) void
tiles_avx2(const bgemm_job *j, int g, const bool nibble, const bool k_quant, const bool has_min,
		   const bool split16, const bool narrow, const int zero, const bool superblocks,
		   const uint8_t *unpacked)
{
	for (int t0 = 0; t0 < j->n_tok; t0 += TOKEN_TILE)
		tile_avx2(j, g, t0, j->n_tok - t0 < TOKEN_TILE ? j->n_tok - t0 : TOKEN_TILE, nibble,
				  k_quant, has_min, split16, narrow, zero, superblocks, unpacked);
}

/*
 * One instance of tile_avx2 per format of the formats table, over all token tiles; a K-quant
 * one per arithmetic, chosen once per call.
 */
#define GROUP_AVX2(name, nibble, k_quant, has_min, split16, narrow, zero) \
TARGET_AVX2_F16C static void \
name(const bgemm_job *j, int g, int thread) \
{ \
	if (k_quant && j->superblocks) \
		tiles_avx2(j, g, nibble, k_quant, has_min, split16, narrow, zero, true, NULL); \
	else \
		tiles_avx2(j, g, nibble, k_quant, has_min, split16, narrow, zero, false, NULL); \
}

/*
 * Q6_K's levels, a byte each (stored plus 32), of every block of group g into dst (256 bytes a
 * block, the byte formats' arrangement): the unpacking its kernel otherwise does per token tile.
 */
TARGET_AVX2_F16C static void
unpack_split16_group(const cai_cpu_bmatrix *m, int g, uint8_t *dst)
{
	const int	nb = m->k / CAI_BLOCK_ELEMS;
	const uint8_t *qg = m->q + (size_t) g * nb * 24 * GROUP;
	const __m256i nib = _mm256_set1_epi8(0x0f),
				top = _mm256_set1_epi8(0x30);

	for (int b = 0; b < nb; b++)
	{
		const uint8_t *qb = qg + (size_t) b * 24 * GROUP;
		uint8_t    *out = dst + (size_t) b * 32 * GROUP;

		for (int h = 0; h < 2; h++)
		{
			__m256i		lo0 = _mm256_loadu_si256((const __m256i *) (qb + 64 * h)),
						lo1 = _mm256_loadu_si256((const __m256i *) (qb + 64 * h + 32)),
						hb = _mm256_loadu_si256((const __m256i *) (qb + SPLIT16_HIGH_BITS + 32 * h));

			_mm256_storeu_si256((__m256i *) (out + 128 * h),
								_mm256_or_si256(_mm256_and_si256(lo0, nib),
												_mm256_and_si256(_mm256_slli_epi16(hb, 4), top)));
			_mm256_storeu_si256((__m256i *) (out + 128 * h + 32),
								_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo0, 4), nib),
												_mm256_and_si256(_mm256_slli_epi16(hb, 2), top)));
			_mm256_storeu_si256((__m256i *) (out + 128 * h + 64),
								_mm256_or_si256(_mm256_and_si256(lo1, nib), _mm256_and_si256(hb, top)));
			_mm256_storeu_si256((__m256i *) (out + 128 * h + 96),
								_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo1, 4), nib),
												_mm256_and_si256(_mm256_srli_epi16(hb, 2), top)));
		}
	}
}

/*
 * Q6_K: one tile reads the packed levels; more tokens unpack the group's levels once into the
 * thread's scratch and read them from there for every tile, so prefill pays the unpacking once
 * per group rather than once per four tokens.
 */
TARGET_AVX2_F16C static void
group_avx2_q6_k(const bgemm_job *j, int g, int thread)
{
	if (j->unpacked && j->n_tok > TOKEN_TILE)
	{
		uint8_t    *scratch = j->unpacked + (size_t) thread * (j->w->k / CAI_BLOCK_ELEMS) * 32 * GROUP;

		unpack_split16_group(j->w, g, scratch);
		if (j->superblocks)
			tiles_avx2(j, g, false, true, false, true, true, 0, true, scratch);
		else
			tiles_avx2(j, g, false, true, false, true, true, 0, false, scratch);
		return;
	}
	if (j->superblocks)
		tiles_avx2(j, g, false, true, false, true, true, 0, true, NULL);
	else
		tiles_avx2(j, g, false, true, false, true, true, 0, false, NULL);
}

GROUP_AVX2(group_avx2_q4_0, true, false, false, false, true, -8)
GROUP_AVX2(group_avx2_q4_1, true, false, true, false, true, 0)
GROUP_AVX2(group_avx2_q4_k, true, true, true, false, true, 0)
GROUP_AVX2(group_avx2_q5_0, false, false, false, false, true, 0)
GROUP_AVX2(group_avx2_q5_1, false, false, true, false, true, 0)
GROUP_AVX2(group_avx2_q5_k, false, true, true, false, true, 0)
GROUP_AVX2(group_avx2_q8_0, false, false, false, false, false, 0)

/* F16C from CPUID itself: clang 14's __builtin_cpu_supports does not know "f16c". */
static bool
avx2_f16c_available(void)
{
	unsigned int a,
				b,
				c,
				d;

	/* F16C from CPUID itself: not every compiler's __builtin_cpu_supports knows its name */
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
		__get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

/*
 * The kernel of the path gemm.h's ISA selection names (generic: the portable one) for type:
 * avx512-vnni and avx512-amx take the VNNI kernels, avx-vnni the 256-bit AVX-VNNI ones, avx2
 * the AVX2 ones.
 */
static cai_bkernel
select_kernel(ggml_type type, bool superblocks, int n_tok)
{
	const cai_bkernel portable = {group_portable, 1, 0, 0};

#if defined(__x86_64__)
	const char *isa = cai_cpu_isa();

	if (strcmp(isa, "avx512-amx") == 0 && cai_bkernel_amx(type, superblocks).fn)
		return cai_bkernel_amx(type, superblocks);
	/*
	 * One token is a stream of weights, not arithmetic: the AVX2 kernel reads one group (one
	 * run of memory) at a time where the VNNI kernel reads two side by side, and decodes
	 * faster (the same bits; measured on the EPYC Zen 4 VM, docs/benchmarks.md)
	 */
	if (strcmp(isa, "avx512-vnni") == 0 && n_tok == 1 && avx2_f16c_available())
		isa = "avx2";
	if (strncmp(isa, "avx512", 6) == 0 && cai_bkernel_vnni(type).fn)
		return cai_bkernel_vnni(type);
	if (strcmp(isa, "avx-vnni") == 0 && cai_bkernel_avxvnni(type).fn)
		return cai_bkernel_avxvnni(type);
	if (strcmp(isa, "generic") != 0 && avx2_f16c_available())
		switch (type)
		{
			case GGML_TYPE_Q4_0:
				return (cai_bkernel) {group_avx2_q4_0, 1, 0, 0};
			case GGML_TYPE_Q4_1:
				return (cai_bkernel) {group_avx2_q4_1, 1, 0, 0};
			case GGML_TYPE_Q4_K:
				return (cai_bkernel) {group_avx2_q4_k, 1, 0, 0};
			case GGML_TYPE_Q5_0:
				return (cai_bkernel) {group_avx2_q5_0, 1, 0, 0};
			case GGML_TYPE_Q5_1:
				return (cai_bkernel) {group_avx2_q5_1, 1, 0, 0};
			case GGML_TYPE_Q5_K:
				return (cai_bkernel) {group_avx2_q5_k, 1, 0, 0};
			case GGML_TYPE_Q6_K:
				return (cai_bkernel) {group_avx2_q6_k, 1, 0, 0};
			case GGML_TYPE_Q8_0:
				return (cai_bkernel) {group_avx2_q8_0, 1, 0, 0};
			default:
				break;
		}
#endif
	return portable;
}

typedef struct bgemm_task
{
	const bgemm_job *job;
	cai_bkernel kernel;
} bgemm_task;

static void
run_task(void *arg, int task, int thread)
{
	const bgemm_task *bt = arg;
	const bgemm_job *j = bt->job;
	const int	n_groups = (j->n_out + GROUP - 1) / GROUP;
	const int	g1 = (task + 1) * j->groups_per_task;

	for (int g = task * j->groups_per_task; g < g1 && g < n_groups; g += bt->kernel.step)
		bt->kernel.fn(j, g, thread);
}

/*
 * The activations of n_tiles whole tiles of tokens in the order the tile kernels read them
 * (bgemm_job.xq_tiles): tile by tile, run by run of `width` inputs, the tile's tokens' inputs of
 * the run each; and block by block their scales and block sums as floats.
 */
static void
tile_activations(const int8_t *xq, const float *xs, const int16_t *xsum, int n_tiles, int k,
				 int width, int8_t *xq_tiles, float *xs_tiles, float *xsum_tiles)
{
	const int	nb = k / CAI_BLOCK_ELEMS;
	const int	runs = k / width;

	for (int tile = 0; tile < n_tiles; tile++)
	{
		for (int r = 0; r < runs; r++)
		{
			const size_t dst = ((size_t) tile * runs + r) * CAI_BTILE_TOKENS;

			for (int t = 0; t < CAI_BTILE_TOKENS; t++)
			{
				const int8_t *src = xq + ((size_t) tile * CAI_BTILE_TOKENS + t) * k + (size_t) r * width;

				/* constant sizes, so that each copy is a vector move, not a call */
				if (width == 2 * CAI_BLOCK_ELEMS)
					memcpy(xq_tiles + (dst + t) * width, src, 2 * CAI_BLOCK_ELEMS);
				else
					memcpy(xq_tiles + (dst + t) * width, src, CAI_BLOCK_ELEMS);
			}
		}
		for (int b = 0; b < nb; b++)
		{
			const size_t dst = ((size_t) tile * nb + b) * CAI_BTILE_TOKENS;

			for (int t = 0; t < CAI_BTILE_TOKENS; t++)
			{
				const size_t tok = (size_t) tile * CAI_BTILE_TOKENS + t;

				xs_tiles[dst + t] = xs[tok * nb + b];
				xsum_tiles[dst + t] = (float) xsum[tok * nb + b];
			}
		}
	}
}

/*
 * A call's scratch, kept by the calling thread and grown as needed rather than allocated per
 * call: a prefill's GEMMs each ask for megabytes (the tiled activations, the AMX kernels'
 * widened weights), and memory fresh from the kernel costs its pages' zeroing at every call
 * (a sixth of a 512-token prefill's time, measured).  What a thread holds is about its largest
 * step's activations and weights' scratch.  Cache-line aligned: an AMX tile's rows are 64
 * bytes, and a row across two lines costs two loads.
 */
enum
{
	SCRATCH_XSUM_LO, SCRATCH_WEIGHTS, SCRATCH_XQ_TILES, SCRATCH_XS_TILES, N_SCRATCH
};

static __thread struct
{
	void	   *p;
	size_t		bytes;
}			call_scratch[N_SCRATCH];

static void *
scratch_of(int which, size_t bytes)
{
	if (call_scratch[which].bytes < bytes)
	{
		free(call_scratch[which].p);
		if (posix_memalign(&call_scratch[which].p, 64, bytes) != 0)
			call_scratch[which].p = NULL;
		call_scratch[which].bytes = call_scratch[which].p ? bytes : 0;
	}
	return call_scratch[which].p;
}

void
cai_gemm_blocks_run(cai_threadpool *pool, cai_bkernel kernel, const int8_t *xq, const float *xs,
					const int16_t *xsum, int act_group, int n_tok, const cai_cpu_bmatrix *w,
					int n_out, const float *bias, float *out, int ldo, bool accumulate)
{
	const int	n_groups = (n_out + GROUP - 1) / GROUP;
	const int	threads = pool ? cai_threadpool_size(pool) : 1;
	const int	nb = w->k / CAI_BLOCK_ELEMS;
	int			n_tasks = threads * 8 < n_groups ? threads * 8 : n_groups;
	int16_t    *xsum_lo = NULL;
	int8_t	   *xq_tiles = NULL;
	float	   *xs_tiles = NULL;
	bgemm_job	job = {xq, xs, xsum, NULL, act_group == CAI_KQUANT_BLOCKS, n_tok, w, n_out, bias, out,
	ldo, accumulate, 1, NULL, NULL, NULL, NULL};
	bgemm_task	task = {&job, kernel};

	if (n_tok < 1 || n_groups < 1)
		return;
	/*
	 * the half sums the unsigned Q6_K kernels subtract (without memory, the portable kernel):
	 * the kernel is chosen by the type, so the type's format decides, not the matrix's own flag,
	 * which a hostile weight cache file can set apart from its type
	 */
	if (format_of(w->type) && format_of(w->type)->split16 && kernel.fn != group_portable)
	{
		xsum_lo = scratch_of(SCRATCH_XSUM_LO, (size_t) n_tok * nb * sizeof(int16_t));
		if (!xsum_lo)
			task.kernel = (cai_bkernel) {group_portable, 1, 0, 0};
		for (int t = 0; xsum_lo && t < n_tok; t++)
			for (int b = 0; b < nb; b++)
			{
				const int8_t *a = xq + (size_t) t * w->k + (size_t) b * CAI_BLOCK_ELEMS;
				int			total = 0;

				for (int i = 0; i < CAI_BLOCK_ELEMS / 2; i++)
					total += a[i];
				xsum_lo[(size_t) t * nb + b] = (int16_t) total;
			}
		job.xsum_lo = xsum_lo;
		/* without this scratch the AVX2 kernel unpacks per tile: slower, the same bits */
		if (xsum_lo && n_tok > TOKEN_TILE && task.kernel.step == 1)
			job.unpacked = scratch_of(SCRATCH_WEIGHTS, (size_t) threads * nb * 32 * GROUP);
	}
	if (task.kernel.scratch_block > 0 && n_tok >= CAI_BSCRATCH_TOKENS)
	{
		const int	n_tiles = n_tok / CAI_BTILE_TOKENS;

		job.unpacked = scratch_of(SCRATCH_WEIGHTS, (size_t) threads * nb * task.kernel.scratch_block);
		xq_tiles = scratch_of(SCRATCH_XQ_TILES, (size_t) n_tiles * CAI_BTILE_TOKENS * w->k);
		xs_tiles = scratch_of(SCRATCH_XS_TILES,
							  (size_t) n_tiles * CAI_BTILE_TOKENS * nb * 2 * sizeof(float));
		if (xq_tiles && xs_tiles)
		{
			tile_activations(xq, xs, xsum, n_tiles, w->k,
							 task.kernel.tile_inputs > 0 ? task.kernel.tile_inputs : CAI_BLOCK_ELEMS,
							 xq_tiles, xs_tiles, xs_tiles + (size_t) n_tiles * CAI_BTILE_TOKENS * nb);
			job.xq_tiles = xq_tiles;
			job.xs_tiles = xs_tiles;
			job.xsum_tiles = xs_tiles + (size_t) n_tiles * CAI_BTILE_TOKENS * nb;
		}
	}
	/* a task holds whole calls of a kernel that takes several groups at once */
	job.groups_per_task = (n_groups + n_tasks - 1) / n_tasks;
	job.groups_per_task += (task.kernel.step - job.groups_per_task % task.kernel.step) %
		task.kernel.step;
	n_tasks = (n_groups + job.groups_per_task - 1) / job.groups_per_task;
	if (pool && n_tasks > 1)
		cai_threadpool_run(pool, run_task, &task, n_tasks);
	else
		for (int t = 0; t < n_tasks; t++)
			run_task(&task, t, 0);
}

void
cai_gemm_blocks(cai_threadpool *pool, const int8_t *xq, const float *xs, const int16_t *xsum,
				int act_group, int n_tok, const cai_cpu_bmatrix *w, int n_out, const float *bias,
				float *out, int ldo, bool accumulate)
{
	cai_gemm_blocks_run(pool, select_kernel(w->type, act_group == CAI_KQUANT_BLOCKS, n_tok), xq, xs,
						xsum, act_group, n_tok, w, n_out, bias, out, ldo, accumulate);
}

void
cai_gemm_blocks_portable(const int8_t *xq, const float *xs, const int16_t *xsum, int act_group,
						 int n_tok, const cai_cpu_bmatrix *w, int n_out, const float *bias,
						 float *out, int ldo, bool accumulate)
{
	cai_gemm_blocks_run(NULL, (cai_bkernel) {group_portable, 1, 0, 0}, xq, xs, xsum, act_group,
						n_tok, w, n_out, bias, out, ldo, accumulate);
}
