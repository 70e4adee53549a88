/*
 * attention.c — causal GQA attention over the paged int8 KV cache (see attention.h for the
 * arithmetic and why it is batch-independent).
 *
 * A tile runs three passes over its sequence's blocks [first row's lo, last row's pos]:
 *   1. scores: each block's keys of the KV head are transposed once into groups of four bytes
 *      (kt[g][slot][4] = k[slot][4g .. 4g+3]), so that one 4-byte dot-product instruction
 *      (AVX-512 VNNI vpdpbusd, or AVX2 vpmaddubsw + vpmaddwd) scores a query against all 16
 *      keys of the block at once; every tile row reuses the transposed block;
 *   2. softmax per row (max subtraction, fast exp, eight-partial-sum total, normalize);
 *   3. values: each block's values of the KV head are widened to float once and accumulated
 *      into every row that sees them, positions in ascending order.
 *
 * Paths.  The tile is compiled for AVX-512, AVX2 and baseline x86-64 and picked at run time the
 * way cpu/gemm.c picks its kernels (cai_cpu_isa(), so cai_cpu_force_isa switches both).  The
 * integer dot products are exact and every float operation is lane-wise, in the same order on
 * every path, with multiply-add contraction switched off for this file (below): all paths give
 * bit-identical results.
 */
#include "attention.h"

#include <string.h>

#include "gemm.h"
#include "ops.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* A multiply-add fused by the compiler would round differently on FMA paths. */
#pragma GCC optimize("fp-contract=off")

/* Query rows per tile the kernel aims for (tile_tokens * n_group). */
#define TILE_ROWS 64

/* Query rows are processed in groups of this many (buffers are padded to a multiple). */
#define ROW_GROUP 8

#define BLOCK CAI_KV_BLOCK_TOKENS

typedef float cai_v16f __attribute__((vector_size(64)));

static size_t
align64(size_t n)
{
	return (n + 63) & ~(size_t) 63;
}

int
cai_attention_tile_tokens(int n_group)
{
	int			t = TILE_ROWS / n_group;

	return t < 1 ? 1 : t;
}

/* Rows of a tile, rounded up to whole row groups. */
static int
tile_rows_padded(int n_group)
{
	int			rows = cai_attention_tile_tokens(n_group) * n_group;

	return (rows + ROW_GROUP - 1) / ROW_GROUP * ROW_GROUP;
}

size_t
cai_attention_scratch_bytes(int max_context, int n_group, int head_dim)
{
	size_t		rows = (size_t) tile_rows_padded(n_group);

	return align64(rows * (size_t) max_context * sizeof(float))	/* scores */
		+ align64(rows * (size_t) head_dim)	/* q_i8 */
		+ align64(rows * (size_t) head_dim * sizeof(float))	/* q_f32 */
		+ align64(rows * sizeof(float))	/* q_scale */
		+ align64(rows * sizeof(int32_t))	/* q_sum */
		+ align64((size_t) BLOCK * head_dim)	/* k_t */
		+ align64(rows * BLOCK * sizeof(int32_t))	/* dots */
		+ align64((size_t) BLOCK * head_dim * sizeof(float))	/* values */
		+ 2 * align64(rows * sizeof(int32_t));	/* row_lo, row_hi */
}

void
cai_attention_scratch_init(cai_attn_scratch *s, void *memory, int max_context, int n_group,
						   int head_dim)
{
	size_t		rows = (size_t) tile_rows_padded(n_group);
	uint8_t    *p = memory;

	s->scores = (float *) p;
	p += align64(rows * (size_t) max_context * sizeof(float));
	s->q_i8 = (int8_t *) p;
	p += align64(rows * (size_t) head_dim);
	s->q_f32 = (float *) p;
	p += align64(rows * (size_t) head_dim * sizeof(float));
	s->q_scale = (float *) p;
	p += align64(rows * sizeof(float));
	s->q_sum = (int32_t *) p;
	p += align64(rows * sizeof(int32_t));
	s->k_t = (int8_t *) p;
	p += align64((size_t) BLOCK * head_dim);
	s->dots = (int32_t *) p;
	p += align64(rows * BLOCK * sizeof(int32_t));
	s->values = (float *) p;
	p += align64((size_t) BLOCK * head_dim * sizeof(float));
	s->row_lo = (int32_t *) p;
	p += align64(rows * sizeof(int32_t));
	s->row_hi = (int32_t *) p;
}

/* ---------------------------------------------------------------------------------------------
 * Query-times-keys kernels: dots[r][slot] = sum_d q[r][d] * k[slot][d], exactly, for the
 * transposed block kt[g][slot][4] and rows [0, rows) (rows a multiple of ROW_GROUP).
 * ------------------------------------------------------------------------------------------- */

static void
qk_block_generic(const int8_t *kt, const int8_t *q, const int32_t *q_sum, int rows, int hd,
				 int32_t *dots)
{
	for (int r = 0; r < rows; r++)
	{
		const int8_t *qr = q + (size_t) r * hd;
		int32_t    *out = dots + (size_t) r * BLOCK;

		for (int slot = 0; slot < BLOCK; slot++)
			out[slot] = 0;
		for (int g = 0; g < hd / 4; g++)
		{
			const int8_t *kg = kt + (size_t) g * BLOCK * 4;

			for (int slot = 0; slot < BLOCK; slot++)
				out[slot] += (int32_t) kg[slot * 4] * qr[4 * g]
					+ (int32_t) kg[slot * 4 + 1] * qr[4 * g + 1]
					+ (int32_t) kg[slot * 4 + 2] * qr[4 * g + 2]
					+ (int32_t) kg[slot * 4 + 3] * qr[4 * g + 3];
		}
	}
}

#if defined(__x86_64__)

#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define TARGET_AVX2 __attribute__((target("avx2")))

/*
 * vpdpbusd multiplies unsigned by signed bytes: the keys go in with their top bit flipped
 * (k ^ 0x80 == k + 128 as an unsigned byte), which adds 128 * sum(q) to each dot product;
 * q_sum removes it.
 */
TARGET_AVX512 static void
qk_block_avx512(const int8_t *kt, const int8_t *q, const int32_t *q_sum, int rows, int hd,
				int32_t *dots)
{
	const __m512i flip = _mm512_set1_epi8((char) 0x80);

	for (int r = 0; r < rows; r += ROW_GROUP)
	{
		__m512i		acc[ROW_GROUP];

		for (int i = 0; i < ROW_GROUP; i++)
			acc[i] = _mm512_setzero_si512();
		for (int g = 0; g < hd / 4; g++)
		{
			__m512i		kv = _mm512_xor_si512(_mm512_loadu_si512(kt + (size_t) g * 64), flip);

			for (int i = 0; i < ROW_GROUP; i++)
			{
				int32_t		q4;

				memcpy(&q4, q + (size_t) (r + i) * hd + 4 * g, 4);
				acc[i] = _mm512_dpbusd_epi32(acc[i], kv, _mm512_set1_epi32(q4));
			}
		}
		for (int i = 0; i < ROW_GROUP; i++)
			_mm512_storeu_si512(dots + (size_t) (r + i) * BLOCK,
								_mm512_sub_epi32(acc[i], _mm512_set1_epi32(q_sum[r + i] * 128)));
	}
}

/*
 * vpmaddubsw multiplies unsigned by signed bytes into saturating 16-bit pair sums: with |q| as
 * the unsigned side and k * sign(q) as the signed one every pair is at most 2 * 127 * 127, so
 * nothing saturates (quantized values never hold -128).
 */
TARGET_AVX2 static void
qk_block_avx2(const int8_t *kt, const int8_t *q, const int32_t *q_sum, int rows, int hd,
			  int32_t *dots)
{
	const __m256i ones = _mm256_set1_epi16(1);

	for (int r = 0; r < rows; r += ROW_GROUP)
	{
		__m256i		lo[ROW_GROUP],
					hi[ROW_GROUP];

		for (int i = 0; i < ROW_GROUP; i++)
		{
			lo[i] = _mm256_setzero_si256();
			hi[i] = _mm256_setzero_si256();
		}
		for (int g = 0; g < hd / 4; g++)
		{
			__m256i		k0 = _mm256_loadu_si256((const __m256i *) (kt + (size_t) g * 64));
			__m256i		k1 = _mm256_loadu_si256((const __m256i *) (kt + (size_t) g * 64 + 32));

			for (int i = 0; i < ROW_GROUP; i++)
			{
				int32_t		q4;
				__m256i		qb,
							qa;

				memcpy(&q4, q + (size_t) (r + i) * hd + 4 * g, 4);
				qb = _mm256_set1_epi32(q4);
				qa = _mm256_abs_epi8(qb);
				lo[i] = _mm256_add_epi32(lo[i],
										 _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(k0, qb)), ones));
				hi[i] = _mm256_add_epi32(hi[i],
										 _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(k1, qb)), ones));
			}
		}
		for (int i = 0; i < ROW_GROUP; i++)
		{
			_mm256_storeu_si256((__m256i *) (dots + (size_t) (r + i) * BLOCK), lo[i]);
			_mm256_storeu_si256((__m256i *) (dots + (size_t) (r + i) * BLOCK + 8), hi[i]);
		}
	}
}
#endif

typedef enum attn_isa
{
	ATTN_GENERIC = 0,
	ATTN_AVX2,
	ATTN_AVX512
} attn_isa;

/* The path gemm.c runs (a test may force it); AVX2 needs only avx2 here. */
static attn_isa
current_isa(void)
{
	const char *isa = cai_cpu_isa();

	if (strcmp(isa, "avx512-vnni") == 0)
		return ATTN_AVX512;
	if (strcmp(isa, "avx2") == 0)
		return ATTN_AVX2;
	return ATTN_GENERIC;
}

/* ---------------------------------------------------------------------------------------------
 * The tile, written once and compiled per path
 * ------------------------------------------------------------------------------------------- */

/* Float dot product, eight partial sums (n is a multiple of 8) and the fixed tree. */
CAI_ALWAYS_INLINE float
dot_f32(const float *a, const float *b, int n)
{
	cai_v8f		acc = cai_v8f_set1(0.0f);

	for (int i = 0; i < n; i += 8)
		acc = acc + cai_v8f_load(a + i) * cai_v8f_load(b + i);
	return cai_v8f_sum(&acc);
}

/*
 * In place: row[0..n) = softmax(row[0..n)).  The exponentials' total uses partial sum i % 8
 * for element i, then the tree, then the tail in order; it depends only on n and the values.
 */
CAI_ALWAYS_INLINE void
softmax_row(float *row, int n)
{
	float		m = row[0];
	cai_v8f		acc = cai_v8f_set1(0.0f);
	float		tail = 0.0f;
	float		inv;
	int			i;

	/* the maximum is exact whatever the order: eight lanes, then the rest */
	if (n >= 8)
	{
		cai_v8f		mv = cai_v8f_load(row);

		for (i = 8; i + 8 <= n; i += 8)
		{
			cai_v8f		x = cai_v8f_load(row + i);

			mv = cai_v8f_max(&mv, &x);
		}
		for (int k = 0; k < 8; k++)
			m = mv[k] > m ? mv[k] : m;
	}
	else
		i = 1;
	for (; i < n; i++)
		m = row[i] > m ? row[i] : m;
	for (i = 0; i + 8 <= n; i += 8)
	{
		cai_v8f		d = cai_v8f_load(row + i) - cai_v8f_set1(m);
		cai_v8f		e = cai_v8f_exp(&d);

		cai_v8f_store(row + i, e);
		acc = acc + e;
	}
	if (i < n)
	{
		float		buf[8] = {0};
		cai_v8f		d,
					e;

		memcpy(buf, row + i, (size_t) (n - i) * sizeof(float));
		d = cai_v8f_load(buf) - cai_v8f_set1(m);
		e = cai_v8f_exp(&d);
		cai_v8f_store(buf, e);
		for (int k = 0; k < n - i; k++)
			tail = tail + buf[k];
		memcpy(row + i, buf, (size_t) (n - i) * sizeof(float));
	}
	inv = 1.0f / (cai_v8f_sum(&acc) + tail);
	for (i = 0; i < n; i++)
		row[i] = row[i] * inv;
}

/*
 * o[0..hd) += (p[slot + p_off] * vscale[slot]) * values[slot][0..hd) for slots a..e of a block,
 * in slot order; HD a compile-time 64 or 128 keeps o in registers.
 */
CAI_ALWAYS_INLINE void
accumulate_values_fixed(float *o, const float *p, int p_off, const float *vscale,
						const float *values, int a, int e, int HD)
{
	cai_v16f	acc[8];

	for (int i = 0; i < HD / 16; i++)
		memcpy(&acc[i], o + 16 * i, sizeof(cai_v16f));
	for (int j = a; j <= e; j++)
	{
		float		c = p[j + p_off] * vscale[j];
		cai_v16f	cv = {c, c, c, c, c, c, c, c, c, c, c, c, c, c, c, c};
		const float *vr = values + (size_t) j * HD;

		for (int i = 0; i < HD / 16; i++)
		{
			cai_v16f	v;

			memcpy(&v, vr + 16 * i, sizeof(v));
			acc[i] = acc[i] + cv * v;
		}
	}
	for (int i = 0; i < HD / 16; i++)
		memcpy(o + 16 * i, &acc[i], sizeof(cai_v16f));
}

CAI_ALWAYS_INLINE void
accumulate_values(float *o, const float *p, int p_off, const float *vscale, const float *values,
				  int a, int e, int hd)
{
	if (hd == 64)
		accumulate_values_fixed(o, p, p_off, vscale, values, a, e, 64);
	else if (hd == 128)
		accumulate_values_fixed(o, p, p_off, vscale, values, a, e, 128);
	else
	{
		for (int j = a; j <= e; j++)
		{
			cai_v8f		c = cai_v8f_set1(p[j + p_off] * vscale[j]);
			const float *vr = values + (size_t) j * hd;

			for (int d = 0; d < hd; d += 8)
				cai_v8f_store(o + d, cai_v8f_load(o + d) + c * cai_v8f_load(vr + d));
		}
	}
}

CAI_ALWAYS_INLINE void
attention_tile_body(const cai_attn_params *ap, const cai_batch_layout *batch, int seq,
					int kv_head, int t0, int n_tok, const float *q, int ldq,
					cai_kv_pool *kv, const cai_kv_shadow *shadow, float *out, int ldo,
					cai_attn_scratch *s, attn_isa isa)
{
	const cai_kv_layout *L = cai_kv_pool_layout(kv);
	const int32_t *table = batch->block_tables[seq];
	const int	hd = ap->head_dim;
	const int	n_kv = ap->n_kv_heads;
	const int	group = ap->n_heads / n_kv;
	const int	rows = n_tok * group;
	const int	rows_padded = (rows + ROW_GROUP - 1) / ROW_GROUP * ROW_GROUP;
	int			jlo,
				jhi,
				span;
	float		kscale[BLOCK];
	float		vscale[BLOCK];

	/* each row's position range and its prepared query */
	for (int ti = 0; ti < n_tok; ti++)
	{
		int			t = t0 + ti;
		int			pos = batch->token_pos[t];
		int			lo = 0;

		if (ap->window > 0 && pos - ap->window + 1 > 0)
			lo = pos - ap->window + 1;
		for (int g = 0; g < group; g++)
		{
			int			r = ti * group + g;
			const float *qrow = q + (size_t) t * ldq + (size_t) (kv_head * group + g) * hd;

			s->row_lo[r] = lo;
			s->row_hi[r] = pos;
			if (!shadow)
			{
				int8_t	   *qq = s->q_i8 + (size_t) r * hd;
				float		qs;
				int32_t		sum = 0;

				cai_op_quantize_vec_i8(qrow, hd, qq, &qs);
				for (int d = 0; d < hd; d++)
					sum += qq[d];
				s->q_sum[r] = sum;
				s->q_scale[r] = qs * ap->scale;
			}
			else
			{
				for (int d = 0; d < hd; d++)
					s->q_f32[(size_t) r * hd + d] = qrow[d] * ap->scale;
			}
		}
	}
	if (!shadow && rows_padded > rows)
	{
		memset(s->q_i8 + (size_t) rows * hd, 0, (size_t) (rows_padded - rows) * hd);
		memset(s->q_sum + rows, 0, (size_t) (rows_padded - rows) * sizeof(int32_t));
	}
	jlo = s->row_lo[0];
	jhi = s->row_hi[rows - 1];
	span = jhi - jlo + 1;

	/* pass 1: scores */
	for (int b = jlo / BLOCK; b <= jhi / BLOCK; b++)
	{
		int			base = b * BLOCK;
		int			j0 = base > jlo ? base : jlo;
		int			j1 = base + BLOCK - 1 < jhi ? base + BLOCK - 1 : jhi;
		uint8_t    *part = cai_kv_block_layer(kv, table[b], ap->kv_layer);

		if (!shadow)
		{
			const int8_t *keys = cai_kv_keys(L, part);
			const float *kscales = cai_kv_key_scales(L, part);

			for (int slot = j0 - base; slot <= j1 - base; slot++)
				kscale[slot] = kscales[slot * n_kv + kv_head];

			/* transpose the head's keys into four-byte groups; slots outside [j0, j1] are 0 */
			for (int slot = 0; slot < BLOCK; slot++)
			{
				int			j = base + slot;
				const int8_t *krow = keys + ((size_t) slot * n_kv + kv_head) * hd;

				if (j < j0 || j > j1)
				{
					for (int g = 0; g < hd / 4; g++)
						memset(s->k_t + ((size_t) g * BLOCK + slot) * 4, 0, 4);
					continue;
				}
				for (int g = 0; g < hd / 4; g++)
					memcpy(s->k_t + ((size_t) g * BLOCK + slot) * 4, krow + 4 * g, 4);
			}
			switch (isa)
			{
#if defined(__x86_64__)
				case ATTN_AVX512:
					qk_block_avx512(s->k_t, s->q_i8, s->q_sum, rows_padded, hd, s->dots);
					break;
				case ATTN_AVX2:
					qk_block_avx2(s->k_t, s->q_i8, s->q_sum, rows_padded, hd, s->dots);
					break;
#endif
				default:
					qk_block_generic(s->k_t, s->q_i8, s->q_sum, rows_padded, hd, s->dots);
					break;
			}
			for (int r = 0; r < rows; r++)
			{
				int			a = j0 > s->row_lo[r] ? j0 : s->row_lo[r];
				int			e = j1 < s->row_hi[r] ? j1 : s->row_hi[r];
				const int32_t *dr = s->dots + (size_t) r * BLOCK;
				float	   *sr = s->scores + (size_t) r * span;
				float		qs = s->q_scale[r];

				for (int j = a; j <= e; j++)
					sr[j - jlo] = (float) dr[j - base] * (qs * kscale[j - base]);
			}
		}
		else
		{
			const float *keys = shadow->data + (size_t) table[b] * shadow->block_floats
				+ (size_t) ap->kv_layer * shadow->layer_floats;

			for (int r = 0; r < rows; r++)
			{
				int			a = j0 > s->row_lo[r] ? j0 : s->row_lo[r];
				int			e = j1 < s->row_hi[r] ? j1 : s->row_hi[r];

				for (int j = a; j <= e; j++)
					s->scores[(size_t) r * span + (j - jlo)] =
						dot_f32(s->q_f32 + (size_t) r * hd,
								keys + ((size_t) (j - base) * n_kv + kv_head) * hd, hd);
			}
		}
	}

	/* pass 2: softmax of each row over its own range */
	for (int r = 0; r < rows; r++)
		softmax_row(s->scores + (size_t) r * span + (s->row_lo[r] - jlo),
					s->row_hi[r] - s->row_lo[r] + 1);

	/* pass 3: weighted sum of values, positions in ascending order */
	for (int r = 0; r < rows; r++)
		memset(out + (size_t) (t0 + r / group) * ldo + (size_t) (kv_head * group + r % group) * hd,
			   0, (size_t) hd * sizeof(float));
	for (int b = jlo / BLOCK; b <= jhi / BLOCK; b++)
	{
		int			base = b * BLOCK;
		int			j0 = base > jlo ? base : jlo;
		int			j1 = base + BLOCK - 1 < jhi ? base + BLOCK - 1 : jhi;
		uint8_t    *part = cai_kv_block_layer(kv, table[b], ap->kv_layer);

		if (!shadow)
		{
			const int8_t *vq = cai_kv_values(L, part);
			const float *vs = cai_kv_value_scales(L, part);

			for (int j = j0; j <= j1; j++)
			{
				int			slot = j - base;
				const int8_t *vrow = vq + ((size_t) slot * n_kv + kv_head) * hd;
				float	   *dst = s->values + (size_t) slot * hd;

				for (int d = 0; d < hd; d++)
					dst[d] = (float) vrow[d];
				vscale[slot] = vs[slot * n_kv + kv_head];
			}
		}
		else
		{
			const float *vf = shadow->data + (size_t) table[b] * shadow->block_floats
				+ (size_t) ap->kv_layer * shadow->layer_floats + (size_t) BLOCK * n_kv * hd;

			for (int j = j0; j <= j1; j++)
			{
				int			slot = j - base;

				memcpy(s->values + (size_t) slot * hd, vf + ((size_t) slot * n_kv + kv_head) * hd,
					   (size_t) hd * sizeof(float));
				vscale[slot] = 1.0f;
			}
		}

		for (int r = 0; r < rows; r++)
		{
			int			a = j0 > s->row_lo[r] ? j0 : s->row_lo[r];
			int			e = j1 < s->row_hi[r] ? j1 : s->row_hi[r];
			float	   *o = out + (size_t) (t0 + r / group) * ldo + (size_t) (kv_head * group + r % group) * hd;

			if (a > e)
				continue;
			accumulate_values(o, s->scores + (size_t) r * span, base - jlo, vscale, s->values,
							  a - base, e - base, hd);
		}
	}
}

static void
attention_tile_generic(const cai_attn_params *ap, const cai_batch_layout *batch, int seq,
					   int kv_head, int t0, int n_tok, const float *q, int ldq,
					   cai_kv_pool *kv, const cai_kv_shadow *shadow, float *out, int ldo,
					   cai_attn_scratch *s)
{
	attention_tile_body(ap, batch, seq, kv_head, t0, n_tok, q, ldq, kv, shadow, out, ldo, s,
						ATTN_GENERIC);
}

#if defined(__x86_64__)
TARGET_AVX2 static void
attention_tile_avx2(const cai_attn_params *ap, const cai_batch_layout *batch, int seq,
					int kv_head, int t0, int n_tok, const float *q, int ldq,
					cai_kv_pool *kv, const cai_kv_shadow *shadow, float *out, int ldo,
					cai_attn_scratch *s)
{
	attention_tile_body(ap, batch, seq, kv_head, t0, n_tok, q, ldq, kv, shadow, out, ldo, s,
						ATTN_AVX2);
}

TARGET_AVX512 static void
attention_tile_avx512(const cai_attn_params *ap, const cai_batch_layout *batch, int seq,
					  int kv_head, int t0, int n_tok, const float *q, int ldq,
					  cai_kv_pool *kv, const cai_kv_shadow *shadow, float *out, int ldo,
					  cai_attn_scratch *s)
{
	attention_tile_body(ap, batch, seq, kv_head, t0, n_tok, q, ldq, kv, shadow, out, ldo, s,
						ATTN_AVX512);
}
#endif

void
cai_attention_tile(const cai_attn_params *ap, const cai_batch_layout *batch, int seq,
				   int kv_head, int t0, int n_tok, const float *q, int ldq,
				   cai_kv_pool *kv, const cai_kv_shadow *shadow, float *out, int ldo,
				   cai_attn_scratch *s)
{
	switch (current_isa())
	{
#if defined(__x86_64__)
		case ATTN_AVX512:
			attention_tile_avx512(ap, batch, seq, kv_head, t0, n_tok, q, ldq, kv, shadow, out,
								  ldo, s);
			return;
		case ATTN_AVX2:
			attention_tile_avx2(ap, batch, seq, kv_head, t0, n_tok, q, ldq, kv, shadow, out,
								ldo, s);
			return;
#endif
		default:
			attention_tile_generic(ap, batch, seq, kv_head, t0, n_tok, q, ldq, kv, shadow, out,
								   ldo, s);
			return;
	}
}
