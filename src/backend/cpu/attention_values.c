/*
 * attention_values.c — the int8 attention's value pass (attention_values.h): packing a
 * segment's values into groups of four positions, and the integer sums of the weight planes
 * times them on each path.  Integer sums have no rounding order: the paths may block, vectorize
 * and tile them freely and still agree exactly.
 */
#include "attention_values.h"

#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Positions per KV block (kv.h's CAI_KV_BLOCK_TOKENS): four quads. */
#define QUADS_PER_BLOCK 4

/* ---------------------------------------------------------------------------------------------
 * Packing
 * ------------------------------------------------------------------------------------------- */

/* One quad's four value rows (stride bytes apart) into out[d][4], dimensions [d0, hd). */
static void
pack_quad_generic(const int8_t *row, size_t stride, int hd, int d0, int8_t *out)
{
	for (int i = 0; i < 4; i++)
		for (int d = d0; d < hd; d++)
			out[(size_t) d * 4 + i] = row[(size_t) i * stride + d];
}

#if defined(__x86_64__)
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define TARGET_AVX2 __attribute__((target("avx2")))
#define TARGET_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")))

/*
 * The same, 64 dimensions at a time (returns the dimensions done): bytes of rows 0 and 1, and
 * of 2 and 3, interleaved, then their 16-bit pairs, give in 128-bit lane L the dimensions
 * 16L + 4k .. 16L + 4k + 3 of register k; a 4 x 4 transpose of the lanes puts dimensions
 * 16c .. 16c + 15 in output c.
 */
TARGET_AVX512 static int
pack_quad_avx512(const int8_t *row, size_t stride, int hd, int8_t *out)
{
	int			d_vec = hd / 64 * 64;

	for (int d0 = 0; d0 < d_vec; d0 += 64)
	{
		const int8_t *r = row + d0;
		__m512i		r0 = _mm512_loadu_si512(r),
					r1 = _mm512_loadu_si512(r + stride),
					r2 = _mm512_loadu_si512(r + 2 * stride),
					r3 = _mm512_loadu_si512(r + 3 * stride);
		__m512i		a = _mm512_unpacklo_epi8(r0, r1),
					bh = _mm512_unpackhi_epi8(r0, r1),
					c = _mm512_unpacklo_epi8(r2, r3),
					dh = _mm512_unpackhi_epi8(r2, r3);
		__m512i		x0 = _mm512_unpacklo_epi16(a, c),
					x1 = _mm512_unpackhi_epi16(a, c),
					x2 = _mm512_unpacklo_epi16(bh, dh),
					x3 = _mm512_unpackhi_epi16(bh, dh);
		__m512i		t0 = _mm512_shuffle_i32x4(x0, x1, 0x44),
					t1 = _mm512_shuffle_i32x4(x2, x3, 0x44),
					t2 = _mm512_shuffle_i32x4(x0, x1, 0xEE),
					t3 = _mm512_shuffle_i32x4(x2, x3, 0xEE);
		int8_t	   *o = out + (size_t) d0 * 4;

		_mm512_storeu_si512(o, _mm512_shuffle_i32x4(t0, t1, 0x88));
		_mm512_storeu_si512(o + 64, _mm512_shuffle_i32x4(t0, t1, 0xDD));
		_mm512_storeu_si512(o + 128, _mm512_shuffle_i32x4(t2, t3, 0x88));
		_mm512_storeu_si512(o + 192, _mm512_shuffle_i32x4(t2, t3, 0xDD));
	}
	return d_vec;
}

/* On AVX2, 32 dimensions at a time (lane L of register k: dimensions 16L + 4k ..). */
TARGET_AVX2 static int
pack_quad_avx2(const int8_t *row, size_t stride, int hd, int8_t *out)
{
	int			d_vec = hd / 32 * 32;

	for (int d0 = 0; d0 < d_vec; d0 += 32)
	{
		const int8_t *r = row + d0;
		__m256i		r0 = _mm256_loadu_si256((const __m256i *) r),
					r1 = _mm256_loadu_si256((const __m256i *) (r + stride)),
					r2 = _mm256_loadu_si256((const __m256i *) (r + 2 * stride)),
					r3 = _mm256_loadu_si256((const __m256i *) (r + 3 * stride));
		__m256i		a = _mm256_unpacklo_epi8(r0, r1),
					bh = _mm256_unpackhi_epi8(r0, r1),
					c = _mm256_unpacklo_epi8(r2, r3),
					dh = _mm256_unpackhi_epi8(r2, r3);
		__m256i		x0 = _mm256_unpacklo_epi16(a, c),
					x1 = _mm256_unpackhi_epi16(a, c),
					x2 = _mm256_unpacklo_epi16(bh, dh),
					x3 = _mm256_unpackhi_epi16(bh, dh);
		__m256i    *o = (__m256i *) (out + (size_t) d0 * 4);

		_mm256_storeu_si256(o, _mm256_permute2x128_si256(x0, x1, 0x20));
		_mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(x2, x3, 0x20));
		_mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(x0, x1, 0x31));
		_mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(x2, x3, 0x31));
	}
	return d_vec;
}
#endif

void
attn_pack_values(attn_value_path path, const int8_t *const *blocks, int n_blocks, size_t stride,
				 int hd, int n_quads, int8_t *vq)
{
	for (int quad = 0; quad < n_quads; quad++)
	{
		int			b = quad / QUADS_PER_BLOCK;
		int8_t	   *out = vq + (size_t) quad * hd * 4;
		const int8_t *row;
		int			d0 = 0;

		if (b >= n_blocks)
		{
			memset(out, 0, (size_t) hd * 4);
			continue;
		}
		row = blocks[b] + (size_t) (quad % QUADS_PER_BLOCK * 4) * stride;
#if defined(__x86_64__)
		if (path == ATTN_VALUES_AVX512 || path == ATTN_VALUES_AMX)
			d0 = pack_quad_avx512(row, stride, hd, out);
		else if (path == ATTN_VALUES_AVX2)
			d0 = pack_quad_avx2(row, stride, hd, out);
#endif
		pack_quad_generic(row, stride, hd, d0, out);
	}
	(void) path;
}

/* ---------------------------------------------------------------------------------------------
 * Sums
 * ------------------------------------------------------------------------------------------- */

/* Row r's sums for dimensions [d0, hd), one product at a time. */
static void
value_sums_row_generic(const uint8_t *lo, const uint8_t *hi, const int8_t *vq, int hd,
					   int n_quads, int d0, int32_t *sums)
{
	for (int d = d0; d < hd; d++)
	{
		int32_t		sl = 0,
					sh = 0;

		for (int quad = 0; quad < n_quads; quad++)
			for (int i = 0; i < 4; i++)
			{
				int32_t		v = vq[((size_t) quad * hd + d) * 4 + i];

				sl += lo[4 * quad + i] * v;
				sh += hi[4 * quad + i] * v;
			}
		sums[d] = sl;
		sums[hd + d] = sh;
	}
}

#if defined(__x86_64__)
/* The four plane bytes of a quad, broadcast. */
#define PLANE_QUAD(p, quad) \
	({ \
		int32_t		quad_bytes_; \
\
		memcpy(&quad_bytes_, (p) + 4 * (quad), 4); \
		quad_bytes_; \
	})

/*
 * acc += vpdpbusd(w, the signed value bytes at p): w (the planes' unsigned bytes) in a register,
 * the values straight from memory.  Written out because GCC copies the accumulator around
 * every vpdpbusd intrinsic.
 */
typedef int8_t cai_v64b_alias __attribute__((vector_size(64), may_alias, aligned(1)));
#define DPBUSD_MEM(acc, w, p) \
	__asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const cai_v64b_alias *) (p)))
/* The same with the values in a register too (one load shared by several sums). */
#define DPBUSD_REG(acc, w, v) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(v))

/*
 * Bit i set when quad i of the row's high plane has a nonzero byte, for its n_quads quads (at
 * most 64: a segment).  The planes are zero past a row's range up to a whole 64 positions, so
 * reading whole vectors stays inside them.
 */
TARGET_AVX512 static inline __attribute__((always_inline)) uint64_t
nonzero_quads_avx512(const uint8_t *w_hi, int n_quads)
{
	uint64_t	mask = 0;

	for (int c = 0; 16 * c < n_quads; c++)
	{
		__m512i		h = _mm512_loadu_si512(w_hi + 64 * c);

		mask |= (uint64_t) _mm512_test_epi32_mask(h, h) << (16 * c);
	}
	return n_quads >= 64 ? mask : mask & ((UINT64_C(1) << n_quads) - 1);
}

/* acc[0..NV) += the plane bytes of one quad (broadcast) times its values, NV vectors from d0 */
#define PLANE_QUAD_SUMS(acc, plane, quad, NV) \
	do { \
		const int8_t *v_ = vq + ((size_t) (quad) * hd + d0) * 4; \
		__m512i		b_ = _mm512_set1_epi32(PLANE_QUAD(plane, quad)); \
\
		for (int k_ = 0; k_ < (NV); k_++) \
			DPBUSD_MEM((acc)[k_], b_, v_ + 64 * k_); \
	} while (0)

/*
 * One plane's sums of NR rows (1 or 2; rows 2 * hd apart in sums), NV vectors of 16 dimensions
 * from d0, held in registers: over all n_quads quads when DENSE, else over those in mask.  Two
 * rows share each value vector's load: loads, not multiplies, bound this on cores with two
 * vector multiply ports.  One row alternates its quads between two sets of accumulators, so
 * that as many vpdpbusd chains are in flight.  Integer sums are the same in any order.
 */
TARGET_AVX512 static inline __attribute__((always_inline)) void
value_sums_plane_avx512(const uint8_t *plane, int ld_w, int n_quads, uint64_t mask, bool DENSE,
						const int8_t *vq, int hd, int d0, int32_t *sums, int NR, int NV)
{
	__m512i		acc0[4],
				acc1[4];

	for (int k = 0; k < NV; k++)
	{
		acc0[k] = _mm512_setzero_si512();
		acc1[k] = _mm512_setzero_si512();
	}
	if (DENSE)
		mask = n_quads >= 64 ? ~UINT64_C(0) : (UINT64_C(1) << n_quads) - 1;
#define ROW_PAIR_QUAD_SUMS(quad) \
	do { \
		const int8_t *v_ = vq + ((size_t) (quad) * hd + d0) * 4; \
		__m512i		b0_ = _mm512_set1_epi32(PLANE_QUAD(plane, quad)); \
		__m512i		b1_ = _mm512_set1_epi32(PLANE_QUAD(plane + ld_w, quad)); \
\
		for (int k_ = 0; k_ < NV; k_++) \
		{ \
			__m512i		v_k_ = _mm512_loadu_si512(v_ + 64 * k_); \
\
			DPBUSD_REG(acc0[k_], b0_, v_k_); \
			DPBUSD_REG(acc1[k_], b1_, v_k_); \
		} \
	} while (0)
	if (NR == 2 && DENSE)
		for (int quad = 0; quad < n_quads; quad++)
			ROW_PAIR_QUAD_SUMS(quad);
	else if (NR == 2)
		for (; mask; mask &= mask - 1)
			ROW_PAIR_QUAD_SUMS(__builtin_ctzll(mask));
	else
	{
		while (mask)
		{
			PLANE_QUAD_SUMS(acc0, plane, __builtin_ctzll(mask), NV);
			mask &= mask - 1;
			if (!mask)
				break;
			PLANE_QUAD_SUMS(acc1, plane, __builtin_ctzll(mask), NV);
			mask &= mask - 1;
		}
		for (int k = 0; k < NV; k++)
			acc0[k] = _mm512_add_epi32(acc0[k], acc1[k]);
	}
#undef ROW_PAIR_QUAD_SUMS
	for (int k = 0; k < NV; k++)
	{
		_mm512_storeu_si512(sums + d0 + 16 * k, acc0[k]);
		if (NR == 2)
			_mm512_storeu_si512(sums + 2 * hd + d0 + 16 * k, acc1[k]);
	}
}

/*
 * Both planes' sums of NR rows (1 or 2), NV vectors from d0: the low plane over all n_quads
 * quads, the high plane over those in hi_mask only.  A weight's high byte is nonzero only when
 * it is at least 128 / 16383 of the row's largest, and most of a long context's weights are
 * smaller: on SmolLM2 over prose, 54-62 % of a row's quads are zero in this plane.
 */
TARGET_AVX512 static inline __attribute__((always_inline)) void
value_sums_rows_avx512(const uint8_t *lo, const uint8_t *hi, int ld_w, uint64_t hi_mask,
					   const int8_t *vq, int hd, int n_quads, int d0, int32_t *sums, int NR,
					   int NV)
{
	if (NR == 2)
	{
		value_sums_plane_avx512(lo, ld_w, n_quads, 0, true, vq, hd, d0, sums, 2, NV);
		value_sums_plane_avx512(hi, ld_w, n_quads, hi_mask, false, vq, hd, d0, sums + hd, 2, NV);
	}
	else
	{
		value_sums_plane_avx512(lo, ld_w, n_quads, 0, true, vq, hd, d0, sums, 1, NV);
		value_sums_plane_avx512(hi, ld_w, n_quads, hi_mask, false, vq, hd, d0, sums + hd, 1, NV);
	}
}

/*
 * Rows in pairs (a pair takes the longer row's quads: planes are zero past a row's own): the
 * low plane over all the quads, the high plane over those where either row's is nonzero.
 */
TARGET_AVX512 static void
value_sums_avx512(const uint8_t *w_lo, const uint8_t *w_hi, int ld_w, const int8_t *vq, int hd,
				  int rows, const int *row_quads, int32_t *sums)
{
	int			d_vec = hd / 16 * 16;

	for (int r = 0; r < rows; r += 2)
	{
		int			nr = rows - r < 2 ? rows - r : 2;
		int			nq = row_quads[r];
		const uint8_t *lo = w_lo + (size_t) r * ld_w;
		const uint8_t *hi = w_hi + (size_t) r * ld_w;
		int32_t    *out = sums + (size_t) r * 2 * hd;
		uint64_t	hi_mask;
		int			d0 = 0;

		if (nr == 2 && row_quads[r + 1] > nq)
			nq = row_quads[r + 1];
		if (nq == 0)
			continue;
		hi_mask = nonzero_quads_avx512(hi, nq);
		if (nr == 2)
			hi_mask |= nonzero_quads_avx512(hi + ld_w, nq);
		for (; d0 + 64 <= d_vec; d0 += 64)
		{
			if (nr == 2)
				value_sums_rows_avx512(lo, hi, ld_w, hi_mask, vq, hd, nq, d0, out, 2, 4);
			else
				value_sums_rows_avx512(lo, hi, ld_w, hi_mask, vq, hd, nq, d0, out, 1, 4);
		}
		for (; d0 < d_vec; d0 += 16)
		{
			if (nr == 2)
				value_sums_rows_avx512(lo, hi, ld_w, hi_mask, vq, hd, nq, d0, out, 2, 1);
			else
				value_sums_rows_avx512(lo, hi, ld_w, hi_mask, vq, hd, nq, d0, out, 1, 1);
		}
		for (int i = 0; i < nr && d_vec < hd; i++)
			value_sums_row_generic(lo + (size_t) i * ld_w, hi + (size_t) i * ld_w, vq, hd, nq,
								   d_vec, out + (size_t) i * 2 * hd);
	}
}

/*
 * The same on AVX2: vpmaddubsw's 16-bit pair sums (at most 2 * 127 * 128: no saturation), then
 * vpmaddwd by ones to 32 bits; one row, 32 dimensions at a time.
 */
TARGET_AVX2 static void
value_sums_avx2(const uint8_t *w_lo, const uint8_t *w_hi, int ld_w, const int8_t *vq, int hd,
				int rows, const int *row_quads, int32_t *sums)
{
	const __m256i ones = _mm256_set1_epi16(1);
	int			d_vec = hd / 8 * 8;

	for (int r = 0; r < rows; r++)
	{
		const uint8_t *lo = w_lo + (size_t) r * ld_w;
		const uint8_t *hi = w_hi + (size_t) r * ld_w;
		int32_t    *out = sums + (size_t) r * 2 * hd;
		int			nq = row_quads[r];

		if (nq == 0)
			continue;
		for (int d0 = 0; d0 < d_vec; d0 += 32)
		{
			int			nv = (d_vec - d0) / 8 < 4 ? (d_vec - d0) / 8 : 4;
			__m256i		acc_lo[4],
						acc_hi[4];

			for (int k = 0; k < 4; k++)
				acc_lo[k] = acc_hi[k] = _mm256_setzero_si256();
			for (int quad = 0; quad < nq; quad++)
			{
				const int8_t *v = vq + ((size_t) quad * hd + d0) * 4;
				__m256i		bl = _mm256_set1_epi32(PLANE_QUAD(lo, quad));
				__m256i		bh = _mm256_set1_epi32(PLANE_QUAD(hi, quad));

				for (int k = 0; k < nv; k++)
				{
					__m256i		vk = _mm256_loadu_si256((const __m256i *) (v + 32 * k));

					acc_lo[k] = _mm256_add_epi32(acc_lo[k],
												 _mm256_madd_epi16(_mm256_maddubs_epi16(bl, vk), ones));
					acc_hi[k] = _mm256_add_epi32(acc_hi[k],
												 _mm256_madd_epi16(_mm256_maddubs_epi16(bh, vk), ones));
				}
			}
			for (int k = 0; k < nv; k++)
			{
				_mm256_storeu_si256((__m256i *) (out + d0 + 8 * k), acc_lo[k]);
				_mm256_storeu_si256((__m256i *) (out + hd + d0 + 8 * k), acc_hi[k]);
			}
		}
		if (d_vec < hd)
			value_sums_row_generic(lo, hi, vq, hd, nq, d_vec, out);
	}
}

/*
 * The same from AMX int8 tiles: a tile of 16 rows' plane bytes (64 positions) is an A operand
 * as it lies, 16 quads of 16 dimensions of vq a B operand (rows hd * 4 bytes apart), and
 * tdpbusd multiplies the unsigned planes by the signed values.  32 dimensions at a time:
 * tiles 0-3 the lo and hi sums of two 16-dimension columns, 4 and 5 the planes, 6 and 7 the
 * values.
 */
TARGET_AMX static void
value_sums_amx(const uint8_t *w_lo, const uint8_t *w_hi, int ld_w, const int8_t *vq, int hd,
			   int rows, const int *row_quads, int32_t *sums)
{
	const size_t ld_sums = (size_t) 2 * hd * sizeof(int32_t);

	for (int r = 0; r < rows; r += 16)
	{
		int			nq = 0;
		int			steps;

		for (int i = 0; i < 16; i++)
			nq = row_quads[r + i] > nq ? row_quads[r + i] : nq;
		steps = (nq + 15) / 16;
		if (steps == 0)
			continue;
		for (int h = 0; h < hd; h += 32)
		{
			int32_t    *out = sums + (size_t) r * 2 * hd + h;

			_tile_zero(0);
			_tile_zero(1);
			_tile_zero(2);
			_tile_zero(3);
			for (int c = 0; c < steps; c++)
			{
				const int8_t *v = vq + ((size_t) 16 * c * hd + h) * 4;

				_tile_loadd(4, w_lo + (size_t) r * ld_w + 64 * c, ld_w);
				_tile_loadd(5, w_hi + (size_t) r * ld_w + 64 * c, ld_w);
				_tile_loadd(6, v, hd * 4);
				_tile_loadd(7, v + 64, hd * 4);
				_tile_dpbusd(0, 4, 6);
				_tile_dpbusd(1, 4, 7);
				_tile_dpbusd(2, 5, 6);
				_tile_dpbusd(3, 5, 7);
			}
			_tile_stored(0, out, ld_sums);
			_tile_stored(1, out + 16, ld_sums);
			_tile_stored(2, out + hd, ld_sums);
			_tile_stored(3, out + hd + 16, ld_sums);
		}
	}
}
#endif

void
attn_value_sums(attn_value_path path, const uint8_t *w_lo, const uint8_t *w_hi, int ld_w,
				const int8_t *vq, int hd, int rows, const int *row_quads, int32_t *sums)
{
#if defined(__x86_64__)
	switch (path)
	{
		case ATTN_VALUES_AMX:
			value_sums_amx(w_lo, w_hi, ld_w, vq, hd, rows, row_quads, sums);
			return;
		case ATTN_VALUES_AVX512:
			value_sums_avx512(w_lo, w_hi, ld_w, vq, hd, rows, row_quads, sums);
			return;
		case ATTN_VALUES_AVX2:
			value_sums_avx2(w_lo, w_hi, ld_w, vq, hd, rows, row_quads, sums);
			return;
		default:
			break;
	}
#endif
	(void) path;
	for (int r = 0; r < rows; r++)
		if (row_quads[r] > 0)
			value_sums_row_generic(w_lo + (size_t) r * ld_w, w_hi + (size_t) r * ld_w, vq, hd,
								   row_quads[r], 0, sums + (size_t) r * 2 * hd);
}
