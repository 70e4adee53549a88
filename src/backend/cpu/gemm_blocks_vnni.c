/*
 * gemm_blocks_vnni.c — the block GEMM's AVX-512 VNNI kernels (the layout and the order of the
 * float operations every path follows: gemm_blocks.h).
 *
 * A call computes two groups at once, 16 rows, one per 32-bit lane of a 512-bit vector: step s
 * (inputs 4 s .. 4 s + 3) of a block is group g's 32 bytes beside group g + 1's, and vpdpbusd
 * multiplies those levels, unsigned, with the token's four activations of the step, signed and
 * broadcast, adding into 16 exact int32 row sums.  The levels go into the unsigned operand as
 * they are (nibbles 0..15, Q6_K's stored 0..63) or with the sign bit flipped (the signed byte
 * formats: w + 128), and that offset times the activations' block sum is taken off the integer
 * sum again; so each block's row sums are the integers the portable kernel computes, and the
 * float operations after them are the same ones in the same order: the same bits.  With
 * super-block activations a K-quant's block sums are multiplied by their sub-block scales in
 * int32 and summed over the super-block first (tile_vnni_kquant; its AMX kernel folds the scales
 * into the levels instead, group_amx_kquant).
 *
 * A block's levels are widened from the packed layout once per tile of up to 8 tokens, which
 * take them from registers; each tile's 8 sums per row stay in registers for the whole row.
 * Decoding a token streams the prepared weights once: the first tile asks for the blocks ahead
 * of it (both groups' levels and scales) so that the loads find them in the cache.
 *
 * The file is compiled twice: into the engine, natively, behind target attributes (the ISA
 * selection, gemm.h, checks the CPU at run time), and into the unit tests with CAI_BLOCKS_SIMDE
 * defined, through SIMDe's portable implementations of the same intrinsics and without any
 * AVX-512 compiler flag, so that every machine tests these kernels bit for bit against the
 * portable one.
 */
#include "gemm_blocks_internal.h"

#include <string.h>

#if defined(CAI_BLOCKS_SIMDE)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#define VNNI_TARGET
#define VNNI_NAME(name) name##_simde
#define VNNI_KERNELS 1
#elif defined(__x86_64__)
#include <immintrin.h>
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define VNNI_NAME(name) name
#define VNNI_KERNELS 1
#endif

#if defined(VNNI_KERNELS)

#define GROUP CAI_BLOCK_ROWS
#define VTILE 8					/* tokens that share a block's widened levels */

/*
 * Three conversions to 16 lanes.  SIMDe (0.7) lacks their 512-bit forms, so its build makes
 * them of two 256-bit halves, which gives the same values lane for lane.
 */
#if defined(CAI_BLOCKS_SIMDE)
static inline __m512
join_ps(__m256 lo, __m256 hi)
{
	return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

static inline __m512
cvtph_ps16(__m256i h)
{
	return join_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)),
				   _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
}

static inline __m512
cvtepi32_ps16(__m512i v)
{
	return join_ps(_mm256_cvtepi32_ps(_mm512_castsi512_si256(v)),
				   _mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(v, 1)));
}

static inline __m512i
cvtepi8_epi32_16(__m128i v)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepi8_epi32(v)),
							  _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)), 1);
}
#else
#define cvtph_ps16 _mm512_cvtph_ps
#define cvtepi32_ps16 _mm512_cvtepi32_ps
#define cvtepi8_epi32_16 _mm512_cvtepi8_epi32
#endif

static inline int32_t
load_i32(const int8_t *p)
{
	int32_t		v;

	memcpy(&v, p, sizeof(v));
	return v;
}

/*
 * Token t's sums of the rows of groups g and g2 (lane r: row g * GROUP + r), through the
 * epilogue (cai_bstore_result's operations, lane for lane, a vector at a time where all 16 rows
 * exist).
 */
VNNI_TARGET static inline void
store_pair(const bgemm_job *j, int t, int g, int g2, __m512 acc)
{
	const int	o0 = g * GROUP;
	float		lanes[2 * GROUP];

	if (g2 != g && o0 + 2 * GROUP <= j->n_out)
	{
		float	   *dst = j->out + (size_t) t * j->ldo + o0;
		__m512		v = acc;

		if (j->bias)
			v = _mm512_add_ps(v, _mm512_loadu_ps(j->bias + o0));
		if (j->accumulate)
			v = _mm512_add_ps(_mm512_loadu_ps(dst), v);
		_mm512_storeu_ps(dst, v);
		return;
	}
	_mm512_storeu_ps(lanes, acc);
	for (int lane = 0; lane < (g2 != g ? 2 * GROUP : GROUP) && o0 + lane < j->n_out; lane++)
		cai_bstore_result(j, t, o0 + lane, lanes[lane]);
}

/* 32 bytes of group g beside the same 32 bytes of group g + 1. */
VNNI_TARGET static inline __m512i
load_pair(const uint8_t *a, const uint8_t *b)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) a)),
							  _mm256_loadu_si256((const __m256i *) b), 1);
}

/* Two groups' 8 fp16 scales as 16 floats. */
VNNI_TARGET static inline __m512
halves_pair(const uint16_t *a, const uint16_t *b)
{
	return cvtph_ps16(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *) a)),
											  _mm_loadu_si128((const __m128i *) b), 1));
}

/* Two groups' 8 int8 sub-block scales as 16 floats. */
VNNI_TARGET static inline __m512
bytes_pair(const int8_t *a, const int8_t *b)
{
	return cvtepi32_ps16(cvtepi8_epi32_16(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *) a),
															 _mm_loadl_epi64((const __m128i *) b))));
}

/*
 * Block b's scales for the 16 rows of groups g and g2: ws (split16: ws_hi, the second half's)
 * and wm.  d and dmin carry a K-quant's super-block scales from block to block (read at its
 * first block).
 */
VNNI_TARGET static inline __attribute__((always_inline)) void
block_scales(const cai_cpu_bmatrix *m, int g, int g2, int b, const bool k_quant,
			 const bool has_min, const bool split16, __m512 *d, __m512 *dmin, __m512 *ws,
			 __m512 *ws_hi, __m512 *wm)
{
	if (!k_quant || b % 8 == 0)
	{
		*d = halves_pair(m->d + cai_bscale_index(m, g, b), m->d + cai_bscale_index(m, g2, b));
		if (has_min)
			*dmin = halves_pair(m->dmin + cai_bscale_index(m, g, b),
								m->dmin + cai_bscale_index(m, g2, b));
	}
	if (k_quant)
	{
		*ws = _mm512_mul_ps(*d, bytes_pair(m->sc + cai_bsub_index(m, g, b),
										   m->sc + cai_bsub_index(m, g2, b)));
		if (split16)
			*ws_hi = _mm512_mul_ps(*d, bytes_pair(m->sc + cai_bsub_index(m, g, b) + GROUP,
												  m->sc + cai_bsub_index(m, g2, b) + GROUP));
		if (has_min)
			*wm = _mm512_mul_ps(*dmin, bytes_pair(m->m + cai_bsub_index(m, g, b),
												  m->m + cai_bsub_index(m, g2, b)));
	}
	else
	{
		*ws = *d;
		*wm = *dmin;
	}
}

/*
 * The levels of a block of two groups (p1, p2) widened to a byte each, v[s] step s's (lane r:
 * row r's inputs 4 s .. 4 s + 3).  For vpdpbusd's unsigned operand (exact false) as the layout
 * stores them, nibbles 0..15 and Q6_K's 0..63, and the byte formats with their sign bit
 * flipped; exact: every format's true signed level, its fixed min folded in (Q4_0's level
 * minus 8, Q6_K's stored level minus 32), so that the integer sums need no correction.
 */
VNNI_TARGET static inline __attribute__((always_inline)) void
widen_block(const uint8_t *p1, const uint8_t *p2, const bool nibble, const bool split16,
			const int zero, const bool exact, __m512i *v)
{
	const bool	flip = !exact;

	if (nibble || split16)
	{
		/* steps 2p and 2p + 1 are the low and high nibbles of vector p */
		const __m512i nib = _mm512_set1_epi8(0x0f);

		for (int p = 0; p < 4; p++)
		{
			__m512i		raw = load_pair(p1 + 32 * p, p2 + 32 * p);

			v[2 * p] = _mm512_and_si512(raw, nib);
			v[2 * p + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
		}
	}
	if (split16)
	{
		/*
		 * step 4h + c's high two bits sit at bits 2c of vector h of the high parts; the 16-bit
		 * shifts move bits across bytes only into positions the mask 0x30 clears
		 */
		const __m512i top = _mm512_set1_epi8(0x30);

		for (int h = 0; h < 2; h++)
		{
			__m512i		hb = load_pair(p1 + SPLIT16_HIGH_BITS + 32 * h,
									   p2 + SPLIT16_HIGH_BITS + 32 * h);

			v[4 * h] = _mm512_or_si512(v[4 * h], _mm512_and_si512(_mm512_slli_epi16(hb, 4), top));
			v[4 * h + 1] = _mm512_or_si512(v[4 * h + 1], _mm512_and_si512(_mm512_slli_epi16(hb, 2), top));
			v[4 * h + 2] = _mm512_or_si512(v[4 * h + 2], _mm512_and_si512(hb, top));
			v[4 * h + 3] = _mm512_or_si512(v[4 * h + 3], _mm512_and_si512(_mm512_srli_epi16(hb, 2), top));
		}
	}
	else if (!nibble)
		for (int s = 0; s < 8; s++)
		{
			v[s] = load_pair(p1 + 32 * s, p2 + 32 * s);
			if (flip)
				v[s] = _mm512_xor_si512(v[s], _mm512_set1_epi8((char) 0x80));
		}
	if (exact && ((nibble && zero != 0) || split16))
		for (int s = 0; s < 8; s++)
			v[s] = _mm512_add_epi8(v[s], _mm512_set1_epi8((char) (split16 ? -SPLIT16_LEVEL_OFFSET : zero)));
}

/*
 * A block's 16 row sums against one token's 32 activations at a, in two independent chains of
 * four steps: the even and the odd steps (split16: the two halves, c0 the first).
 */
VNNI_TARGET static inline __attribute__((always_inline)) void
block_dot(const __m512i *v, const int8_t *a, const bool split16, __m512i *c0, __m512i *c1)
{
	__m512i		x0 = _mm512_setzero_si512(),
				x1 = _mm512_setzero_si512();

	for (int s = 0; s < 4; s++)
	{
		const int	s0 = split16 ? s : 2 * s,
					s1 = split16 ? 4 + s : 2 * s + 1;

		x0 = _mm512_dpbusd_epi32(x0, v[s0], _mm512_set1_epi32(load_i32(a + 4 * s0)));
		x1 = _mm512_dpbusd_epi32(x1, v[s1], _mm512_set1_epi32(load_i32(a + 4 * s1)));
	}
	*c0 = x0;
	*c1 = x1;
}

/* Two groups' 8 int8 sub-block scales (mins) as 16 int32 lanes. */
VNNI_TARGET static inline __m512i
sub_scales_pair(const int8_t *a, const int8_t *b)
{
	return cvtepi8_epi32_16(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *) a),
											   _mm_loadl_epi64((const __m128i *) b)));
}

/*
 * A super-block's mins of the 16 rows of groups g and g2 from block b0, as vpdpwssd's pairs:
 * vector p's lane r holds row r's m of blocks b0 + 2p (low 16 bits) and b0 + 2p + 1 (high), so
 * that with a token's two block sums side by side (the int16 array as it is) M = sum of four
 * vpdpwssd.
 */
VNNI_TARGET static inline __attribute__((always_inline)) void
min_pairs(const cai_cpu_bmatrix *m, int g, int g2, int b0, __m512i *mp)
{
	for (int p = 0; p < 4; p++)
	{
		const int	b = b0 + 2 * p;
		__m512i		even = sub_scales_pair(m->m + cai_bsub_index(m, g, b), m->m + cai_bsub_index(m, g2, b));
		__m512i		odd = sub_scales_pair(m->m + cai_bsub_index(m, g, b + 1),
										  m->m + cai_bsub_index(m, g2, b + 1));

		mp[p] = _mm512_or_si512(_mm512_and_si512(even, _mm512_set1_epi32(0xffff)),
								_mm512_slli_epi32(odd, 16));
	}
}

/* M of a super-block for one token: its 8 block sums at xsum against the pairs of min_pairs. */
VNNI_TARGET static inline __m512i
min_sum(const __m512i *mp, const int16_t *xsum)
{
	__m512i		acc = _mm512_setzero_si512();
	int32_t		pair;

	for (int p = 0; p < 4; p++)
	{
		memcpy(&pair, xsum + 2 * p, sizeof(pair));
		acc = _mm512_dpwssd_epi32(acc, mp[p], _mm512_set1_epi32(pair));
	}
	return acc;
}

/*
 * The float end of a super-block for one token (gemm_blocks.h): term = d * I (+ dmin * M),
 * acc + sa * term.
 */
VNNI_TARGET static inline __m512
kquant_finish(__m512 acc, __m512i I, __m512i M, __m512 d, __m512 dmin, float sa, const bool has_min)
{
	__m512		term = _mm512_mul_ps(d, cvtepi32_ps16(I));

	if (has_min)
		term = _mm512_add_ps(term, _mm512_mul_ps(dmin, cvtepi32_ps16(M)));
	return _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(sa), term));
}

/*
 * A K-quant's tile (tile_vnni's, k_quant): each block's exact row sums times its int32 sub-block
 * scales add up in I per token over the super-block, and the float end comes once per 256
 * inputs.
 */
VNNI_TARGET static inline __attribute__((always_inline)) void
tile_vnni_kquant(const bgemm_job *j, int g, int t0, const int nt, const bool nibble,
				 const bool has_min, const bool split16)
{
	const cai_cpu_bmatrix *m = j->w;
	const int	k = m->k;
	const int	nb = k / CAI_BLOCK_ELEMS;
	const int	n_groups = (j->n_out + GROUP - 1) / GROUP;
	const int	g2 = g + 1 < n_groups ? g + 1 : g;
	const int	bbytes = nibble ? 16 * GROUP : split16 ? 24 * GROUP : 32 * GROUP;
	/* the unsigned operand's offset per unit of the block sum: Q5_K's bytes go in flipped */
	const int	offset = nibble ? 0 : -128;
	const uint8_t *q1 = m->q + (size_t) g * nb * bbytes;
	const uint8_t *q2 = m->q + (size_t) g2 * nb * bbytes;
	const int8_t *xq = j->xq + (size_t) t0 * k;
	const float *xs = j->xs + (size_t) t0 * nb;
	const int16_t *xsum = j->xsum + (size_t) t0 * nb;
	const int16_t *xsum_lo = split16 ? j->xsum_lo + (size_t) t0 * nb : NULL;
	__m512		acc[VTILE];
	__m512i		I[VTILE];

	for (int t = 0; t < nt; t++)
		acc[t] = _mm512_setzero_ps();
	for (int b0 = 0; b0 < nb; b0 += CAI_KQUANT_BLOCKS)
	{
		const __m512 d = halves_pair(m->d + cai_bscale_index(m, g, b0), m->d + cai_bscale_index(m, g2, b0));

		for (int t = 0; t < nt; t++)
			I[t] = _mm512_setzero_si512();
		for (int b = b0; b < b0 + CAI_KQUANT_BLOCKS; b++)
		{
			const uint8_t *p1 = q1 + (size_t) b * bbytes;
			const uint8_t *p2 = q2 + (size_t) b * bbytes;
			const __m512i sc = sub_scales_pair(m->sc + cai_bsub_index(m, g, b), m->sc + cai_bsub_index(m, g2, b));
			const __m512i sc_hi = split16 ?
				sub_scales_pair(m->sc + cai_bsub_index(m, g, b) + GROUP,
								m->sc + cai_bsub_index(m, g2, b) + GROUP) : sc;
			__m512i		v[8];

			if (t0 == 0)
				cai_bprefetch_ahead(m, g, g2 - g + 1, b, CAI_BPREFETCH_BLOCKS);
			widen_block(p1, p2, nibble, split16, 0, false, v);
			for (int t = 0; t < nt; t++)
			{
				const size_t tb = (size_t) t * nb + b;
				__m512i		c0,
							c1;

				block_dot(v, xq + (size_t) t * k + (size_t) b * CAI_BLOCK_ELEMS, split16, &c0, &c1);
				if (split16)
				{
					/* the stored levels' sums less 32 times each half's activation sum: exact */
					const int	lo = xsum_lo[tb];

					c0 = _mm512_add_epi32(c0, _mm512_set1_epi32(-SPLIT16_LEVEL_OFFSET * lo));
					c1 = _mm512_add_epi32(c1, _mm512_set1_epi32(-SPLIT16_LEVEL_OFFSET * (xsum[tb] - lo)));
					I[t] = _mm512_add_epi32(I[t], _mm512_add_epi32(_mm512_mullo_epi32(sc, c0),
																   _mm512_mullo_epi32(sc_hi, c1)));
				}
				else
				{
					__m512i		isum = _mm512_add_epi32(c0, c1);

					if (offset != 0)
						isum = _mm512_add_epi32(isum, _mm512_set1_epi32(offset * xsum[tb]));
					I[t] = _mm512_add_epi32(I[t], _mm512_mullo_epi32(sc, isum));
				}
			}
		}
		if (has_min)
		{
			const __m512 dmin = halves_pair(m->dmin + cai_bscale_index(m, g, b0),
											m->dmin + cai_bscale_index(m, g2, b0));
			__m512i		mp[4];

			min_pairs(m, g, g2, b0, mp);
			for (int t = 0; t < nt; t++)
				acc[t] = kquant_finish(acc[t], I[t], min_sum(mp, xsum + (size_t) t * nb + b0), d,
									   dmin, xs[(size_t) t * nb + b0], true);
		}
		else
			for (int t = 0; t < nt; t++)
				acc[t] = kquant_finish(acc[t], I[t], I[t], d, d, xs[(size_t) t * nb + b0], false);
	}
	for (int t = 0; t < nt; t++)
		store_pair(j, t0 + t, g, g2, acc[t]);
}

/*
 * Groups g and g + 1 (g alone, computed twice and stored once, when it is the last) for tokens
 * [t0, t0 + nt).  The format's flags and nt are compile-time constants in each instance, so
 * the loops unroll and the tile's sums live in registers.
 */
VNNI_TARGET static inline __attribute__((always_inline)) void
tile_vnni(const bgemm_job *j, int g, int t0, const int nt, const bool nibble,
		  const bool k_quant, const bool has_min, const bool split16, const int zero)
{
	const cai_cpu_bmatrix *m = j->w;
	const int	k = m->k;
	const int	nb = k / CAI_BLOCK_ELEMS;
	const int	n_groups = (j->n_out + GROUP - 1) / GROUP;
	const int	g2 = g + 1 < n_groups ? g + 1 : g;
	const int	bbytes = nibble ? 16 * GROUP : split16 ? 24 * GROUP : 32 * GROUP;
	/* the integer sum's correction per unit of the activations' block sum (not split16) */
	const int	offset = nibble ? zero : zero - 128;
	const uint8_t *q1 = m->q + (size_t) g * nb * bbytes;
	const uint8_t *q2 = m->q + (size_t) g2 * nb * bbytes;
	const int8_t *xq = j->xq + (size_t) t0 * k;
	const float *xs = j->xs + (size_t) t0 * nb;
	const int16_t *xsum = j->xsum + (size_t) t0 * nb;
	const int16_t *xsum_lo = split16 ? j->xsum_lo + (size_t) t0 * nb : NULL;
	__m512		acc[VTILE];
	__m512		d = _mm512_setzero_ps(),
				dmin = _mm512_setzero_ps();

	if (k_quant && j->superblocks)
	{
		tile_vnni_kquant(j, g, t0, nt, nibble, has_min, split16);
		return;
	}
	for (int t = 0; t < nt; t++)
		acc[t] = _mm512_setzero_ps();
	for (int b = 0; b < nb; b++)
	{
		const uint8_t *p1 = q1 + (size_t) b * bbytes;
		const uint8_t *p2 = q2 + (size_t) b * bbytes;
		__m512i		v[8];
		__m512		ws,
					ws_hi = _mm512_setzero_ps(),
					wm = _mm512_setzero_ps();

		if (t0 == 0)
			cai_bprefetch_ahead(m, g, g2 - g + 1, b, CAI_BPREFETCH_BLOCKS);
		block_scales(m, g, g2, b, k_quant, has_min, split16, &d, &dmin, &ws, &ws_hi, &wm);
		widen_block(p1, p2, nibble, split16, zero, false, v);
		for (int t = 0; t < nt; t++)
		{
			const int8_t *a = xq + (size_t) t * k + (size_t) b * CAI_BLOCK_ELEMS;
			const size_t tb = (size_t) t * nb + b;
			__m512i		c0,
						c1;
			__m512		term;

			block_dot(v, a, split16, &c0, &c1);
			if (split16)
			{
				const int	lo = xsum_lo[tb];
				__m512i		isum_lo = _mm512_add_epi32(c0, _mm512_set1_epi32(-SPLIT16_LEVEL_OFFSET * lo));
				__m512i		isum_hi = _mm512_add_epi32(c1, _mm512_set1_epi32(-SPLIT16_LEVEL_OFFSET * (xsum[tb] - lo)));

				term = _mm512_add_ps(_mm512_mul_ps(ws, cvtepi32_ps16(isum_lo)),
									 _mm512_mul_ps(ws_hi, cvtepi32_ps16(isum_hi)));
			}
			else
			{
				__m512i		isum = _mm512_add_epi32(c0, c1);

				if (offset != 0)
					isum = _mm512_add_epi32(isum, _mm512_set1_epi32(offset * xsum[tb]));
				term = _mm512_mul_ps(ws, cvtepi32_ps16(isum));
			}
			if (has_min)
				term = _mm512_add_ps(term, _mm512_mul_ps(wm, _mm512_set1_ps((float) xsum[tb])));
			acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_set1_ps(xs[tb]), term));
		}
	}
	for (int t = 0; t < nt; t++)
		store_pair(j, t0 + t, g, g2, acc[t]);
}

/*
 * Tokens [t0, n_tok) of groups g and g + 1: tiles of 8, then what remains in tiles of 4, 2 and
 * 1, each an instance of its own (the tile's size a constant).
 */
VNNI_TARGET static inline __attribute__((always_inline)) void
tokens_vnni(const bgemm_job *j, int g, int t0, const bool nibble, const bool k_quant,
			const bool has_min, const bool split16, const int zero)
{
	for (; t0 + 8 <= j->n_tok; t0 += 8)
		tile_vnni(j, g, t0, 8, nibble, k_quant, has_min, split16, zero);
	if (t0 + 4 <= j->n_tok)
	{
		tile_vnni(j, g, t0, 4, nibble, k_quant, has_min, split16, zero);
		t0 += 4;
	}
	if (t0 + 2 <= j->n_tok)
	{
		tile_vnni(j, g, t0, 2, nibble, k_quant, has_min, split16, zero);
		t0 += 2;
	}
	if (t0 < j->n_tok)
		tile_vnni(j, g, t0, 1, nibble, k_quant, has_min, split16, zero);
}

/* One instance per format, over all tokens. */
#define GROUP_VNNI(name, nibble, k_quant, has_min, split16, zero) \
VNNI_TARGET static void \
VNNI_NAME(name)(const bgemm_job *j, int g, int thread) \
{ \
	tokens_vnni(j, g, 0, nibble, k_quant, has_min, split16, zero); \
}

GROUP_VNNI(group_vnni_q4_0, true, false, false, false, -8)
GROUP_VNNI(group_vnni_q4_1, true, false, true, false, 0)
GROUP_VNNI(group_vnni_q4_k, true, true, true, false, 0)
GROUP_VNNI(group_vnni_q5_0, false, false, false, false, 0)
GROUP_VNNI(group_vnni_q5_1, false, false, true, false, 0)
GROUP_VNNI(group_vnni_q5_k, false, true, true, false, 0)
GROUP_VNNI(group_vnni_q6_k, false, true, false, true, 0)
GROUP_VNNI(group_vnni_q8_0, false, false, false, false, 0)

cai_bkernel
VNNI_NAME(cai_bkernel_vnni)(ggml_type type)
{
	cai_bkernel k = {NULL, 2, 0, 0};

	switch (type)
	{
		case GGML_TYPE_Q4_0:
			k.fn = VNNI_NAME(group_vnni_q4_0);
			break;
		case GGML_TYPE_Q4_1:
			k.fn = VNNI_NAME(group_vnni_q4_1);
			break;
		case GGML_TYPE_Q4_K:
			k.fn = VNNI_NAME(group_vnni_q4_k);
			break;
		case GGML_TYPE_Q5_0:
			k.fn = VNNI_NAME(group_vnni_q5_0);
			break;
		case GGML_TYPE_Q5_1:
			k.fn = VNNI_NAME(group_vnni_q5_1);
			break;
		case GGML_TYPE_Q5_K:
			k.fn = VNNI_NAME(group_vnni_q5_k);
			break;
		case GGML_TYPE_Q6_K:
			k.fn = VNNI_NAME(group_vnni_q6_k);
			break;
		case GGML_TYPE_Q8_0:
			k.fn = VNNI_NAME(group_vnni_q8_0);
			break;
		default:
			break;
	}
	return k;
}

#if !defined(CAI_BLOCKS_SIMDE)
/* ---------------------------------------------------------------------------------------
 * AMX: whole tiles of 16 tokens, and batches of 8
 *
 * A block of two groups, widened, is AMX's B operand as it stands: row s of the tile is step
 * s, 16 rows' four inputs each.  So a call widens its two groups' blocks once into the
 * thread's scratch (with the blocks' scales, as floats), and then, per tile of 16 tokens and
 * block, tdpbssd multiplies the tokens' 32 activations (A: the tile's 16 tokens' inputs of the
 * block, side by side in bgemm_job.xq_tiles) by it into 16 x 16 exact int32 sums (C: a token's
 * 16 rows per tile row, the lanes of the VNNI kernel's sums), which the same float epilogue
 * finishes: the same bits.  Both operands are signed, so the levels go in as stored, nothing
 * flipped.  Q6_K takes each
 * half block apart (its two scales): two products of 16 inputs.  While one block's sums go
 * through the epilogue, the next block's product is under way in the other tile(s) of sums.
 * A batch of 8 tokens (tile_amx_small) takes half a tile's rows the same way, its blocks
 * widened as it goes.
 * --------------------------------------------------------------------------------------- */

#define AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,amx-tile,amx-int8")))
#define AMX_WIDE_BYTES (32 * 2 * GROUP)	/* a block's widened levels: the B tile */
#define AMX_SCALE_FLOATS (3 * 2 * GROUP)	/* ws, ws_hi, wm of a block's 16 rows */
#define AMX_SCRATCH_BLOCK (AMX_WIDE_BYTES + AMX_SCALE_FLOATS * (int) sizeof(float))
#define AMX_LAG 2				/* blocks between a product and its epilogue */

typedef struct amx_blocks_config
{
	uint8_t		palette;
	uint8_t		start_row;
	uint8_t		reserved[14];
	uint16_t	bytes_per_row[16];
	uint8_t		rows[16];
} amx_blocks_config;

/*
 * Tiles 0-3: sums (`tokens` tokens x 16 rows of int32).  Whole blocks: tile 4 the tokens' 32
 * inputs, tile 6 the block's 8 steps.  Q6_K: tiles 4 and 5 the tokens' two halves, 6 and 7 the
 * block's steps 0-3 and 4-7.
 */
AMX_TARGET static void
amx_configure_blocks(bool split16, int tokens)
{
	amx_blocks_config cfg;

	memset(&cfg, 0, sizeof(cfg));
	cfg.palette = 1;
	for (int t = 0; t < 4; t++)
	{
		cfg.rows[t] = tokens;
		cfg.bytes_per_row[t] = 64;
	}
	if (split16)
	{
		cfg.rows[4] = cfg.rows[5] = tokens;
		cfg.bytes_per_row[4] = cfg.bytes_per_row[5] = 16;
		cfg.rows[6] = cfg.rows[7] = 4;
		cfg.bytes_per_row[6] = cfg.bytes_per_row[7] = 64;
	}
	else
	{
		cfg.rows[4] = tokens;
		cfg.bytes_per_row[4] = 32;
		cfg.rows[6] = 8;
		cfg.bytes_per_row[6] = 64;
	}
	/* (not _tile_loadconfig: GCC 12 does not see that it reads the whole struct) */
	__asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

/* Block b's products for tokens from a (k apart) into tile C (and C2: split16). */
#define AMX_BLOCK_PRODUCT(C, C2, wide, a, k, split16) \
	do { \
		_tile_zero(C); \
		if (split16) \
		{ \
			_tile_zero(C2); \
			_tile_loadd(4, a, k); \
			_tile_loadd(5, (a) + 16, k); \
			_tile_loadd(6, wide, 64); \
			_tile_loadd(7, (wide) + 4 * 64, 64); \
			_tile_dpbssd(C, 4, 6); \
			_tile_dpbssd(C2, 5, 7); \
		} \
		else \
		{ \
			_tile_loadd(4, a, k); \
			_tile_loadd(6, wide, 64); \
			_tile_dpbssd(C, 4, 6); \
		} \
	} while (0)

/*
 * Block (or item) p's sums out of their tiles into lo, and with `both` the second tile's into
 * hi: tiles 0 and 1 for an even p, 2 and 3 for an odd one (the second tile: split16's second
 * halves, or the K-quants' high bytes).
 */
AMX_TARGET static inline __attribute__((always_inline)) void
amx_store_sums(int p, int32_t *lo, int32_t *hi, const bool both)
{
	if (p % 2 == 0)
	{
		_tile_stored(0, lo, 64);
		if (both)
			_tile_stored(1, hi, 64);
	}
	else
	{
		_tile_stored(2, lo, 64);
		if (both)
			_tile_stored(3, hi, 64);
	}
}

/*
 * The float epilogue of a block for `tokens` tokens: lo and hi their sums (a token's 16 rows
 * after another's; hi split16's second halves), exact (the levels were widened with their
 * fixed mins); token t's scale xs[t * stride] and block sum xsum[t * stride] (floats, or with
 * xsum_int16 the activations' own int16 sums).
 */
AMX_TARGET static inline __attribute__((always_inline)) void
amx_epilogue(const float *xs, const void *xsum, const bool xsum_int16, const size_t stride,
			 const float *scales, const int32_t *lo, const int32_t *hi, __m512 *acc,
			 const int tokens, const bool has_min, const bool split16)
{
	const __m512 ws = _mm512_loadu_ps(scales),
				ws_hi = split16 ? _mm512_loadu_ps(scales + 2 * GROUP) : ws,
				wm = has_min ? _mm512_loadu_ps(scales + 4 * GROUP) : ws;

#pragma GCC unroll 16
	for (int t = 0; t < tokens; t++)
	{
		const __m512 sum = _mm512_cvtepi32_ps(_mm512_load_si512(lo + t * 2 * GROUP));
		__m512		term;

		if (split16)
			term = _mm512_add_ps(_mm512_mul_ps(ws, sum),
								 _mm512_mul_ps(ws_hi, _mm512_cvtepi32_ps(_mm512_load_si512(hi + t * 2 * GROUP))));
		else
			term = _mm512_mul_ps(ws, sum);
		if (has_min)
			term = _mm512_add_ps(term, _mm512_mul_ps(wm, _mm512_set1_ps(xsum_int16 ?
																		  (float) ((const int16_t *) xsum)[t * stride] :
																		  ((const float *) xsum)[t * stride])));
		acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_set1_ps(xs[t * stride]), term));
	}
}

/*
 * A batch of AMX_SMALL_TOKENS tokens (a decode step of 8 sequences, n samples) has no whole
 * tile of 16, and no scratch (whole blocks only: not Q6_K, see tokens_amx_small).  Per block,
 * two groups' levels are widened into a small ring on the stack one block ahead of their
 * product (a tile load right after the vector stores of the same lines would wait for them),
 * tile 4 takes the tokens' 32 inputs straight from the activations (k bytes apart: no copy for
 * a single call's tokens), and the sums go through the same epilogue in the same order as the
 * VNNI tile's: the same bits, with the products on the tile unit instead of eight vpdpbusd per
 * token and block.  Pipelined as group_amx: block b is widened while b - 1 multiplies, b - 2's
 * sums are stored and b - 3's finish.
 */
#define AMX_SMALL_TOKENS 8
#define AMX_RING 4				/* blocks from a widening to its epilogue, plus one */

AMX_TARGET static inline __attribute__((always_inline)) void
tile_amx_small(const bgemm_job *j, int g, int t0, const bool nibble, const bool k_quant,
			   const bool has_min, const int zero)
{
	const cai_cpu_bmatrix *m = j->w;
	const int	k = m->k;
	const int	nb = k / CAI_BLOCK_ELEMS;
	const int	n_groups = (j->n_out + GROUP - 1) / GROUP;
	const int	g2 = g + 1 < n_groups ? g + 1 : g;
	const int	bbytes = nibble ? 16 * GROUP : 32 * GROUP;
	const uint8_t *q1 = m->q + (size_t) g * nb * bbytes;
	const uint8_t *q2 = m->q + (size_t) g2 * nb * bbytes;
	const int8_t *xq = j->xq + (size_t) t0 * k;
	const float *xs = j->xs + (size_t) t0 * nb;
	const int16_t *xsum = j->xsum + (size_t) t0 * nb;
	uint8_t		wide[AMX_RING][AMX_WIDE_BYTES] __attribute__((aligned(64)));
	float		scales[AMX_RING][AMX_SCALE_FLOATS] __attribute__((aligned(64)));
	int32_t		sums[AMX_LAG][AMX_SMALL_TOKENS][2 * GROUP] __attribute__((aligned(64)));
	__m512		acc[AMX_SMALL_TOKENS];
	__m512		d = _mm512_setzero_ps(),
				dmin = _mm512_setzero_ps();

	for (int t = 0; t < AMX_SMALL_TOKENS; t++)
		acc[t] = _mm512_setzero_ps();
	amx_configure_blocks(false, AMX_SMALL_TOKENS);
	for (int b = 0; b < nb + AMX_LAG + 1; b++)
	{
		if (b < nb)
		{
			const uint8_t *p1 = q1 + (size_t) b * bbytes;
			const uint8_t *p2 = q2 + (size_t) b * bbytes;
			float	   *sc = scales[b % AMX_RING];
			__m512i		v[8];
			__m512		ws,
						ws_hi = _mm512_setzero_ps(),
						wm = _mm512_setzero_ps();

			if (t0 == 0)
				cai_bprefetch_ahead(m, g, g2 - g + 1, b, CAI_BPREFETCH_BLOCKS);
			block_scales(m, g, g2, b, k_quant, has_min, false, &d, &dmin, &ws, &ws_hi, &wm);
			_mm512_store_ps(sc, ws);
			_mm512_store_ps(sc + 4 * GROUP, wm);
			widen_block(p1, p2, nibble, false, zero, true, v);
			for (int s = 0; s < 8; s++)
				_mm512_store_si512(wide[b % AMX_RING] + 64 * s, v[s]);
		}
		if (b >= 1 && b <= nb)
		{
			const int	p = b - 1;
			const uint8_t *w = wide[p % AMX_RING];
			const int8_t *a = xq + (size_t) p * CAI_BLOCK_ELEMS;

			if (p % 2 == 0)
				AMX_BLOCK_PRODUCT(0, 1, w, a, k, false);
			else
				AMX_BLOCK_PRODUCT(2, 3, w, a, k, false);
		}
		if (b >= 2 && b <= nb + 1)
			amx_store_sums(b - 2, sums[(b - 2) % AMX_LAG][0], NULL, false);
		if (b >= AMX_LAG + 1)
		{
			const int	p = b - AMX_LAG - 1;

			amx_epilogue(xs + p, xsum + p, true, nb, scales[p % AMX_RING], sums[p % AMX_LAG][0], NULL,
						 acc, AMX_SMALL_TOKENS, has_min, false);
		}
	}
	_tile_release();
	for (int t = 0; t < AMX_SMALL_TOKENS; t++)
		store_pair(j, t0 + t, g, g2, acc[t]);
}

/*
 * Tokens [t0, n_tok) of groups g and g + 1 without whole tiles of 16: batches of 8 on the tile
 * unit, what remains of them through the VNNI tiles.  Q6_K stays on VNNI: its two half-block
 * scales take two products, two stores and two conversions per token on the tile unit, which
 * measured no faster than its VNNI tile (bench_gemm, 8 tokens).
 */
AMX_TARGET static inline __attribute__((always_inline)) void
tokens_amx_small(const bgemm_job *j, int g, int t0, const bool nibble, const bool k_quant,
				 const bool has_min, const bool split16, const int zero)
{
	if (!(k_quant && j->superblocks) && !split16)
		for (; t0 + AMX_SMALL_TOKENS <= j->n_tok; t0 += AMX_SMALL_TOKENS)
			tile_amx_small(j, g, t0, nibble, k_quant, has_min, zero);
	tokens_vnni(j, g, t0, nibble, k_quant, has_min, split16, zero);
}

AMX_TARGET static inline __attribute__((always_inline)) void
group_amx(const bgemm_job *j, int g, int thread, const bool nibble, const bool k_quant,
		  const bool has_min, const bool split16, const int zero)
{
	const cai_cpu_bmatrix *m = j->w;
	const int	nb = m->k / CAI_BLOCK_ELEMS;
	const int	n_groups = (j->n_out + GROUP - 1) / GROUP;
	const int	g2 = g + 1 < n_groups ? g + 1 : g;
	const int	bbytes = nibble ? 16 * GROUP : split16 ? 24 * GROUP : 32 * GROUP;
	const int	n_tiles = j->n_tok / CAI_BTILE_TOKENS;
	uint8_t    *wide;
	float	   *scales;
	__m512		d = _mm512_setzero_ps(),
				dmin = _mm512_setzero_ps();
	int32_t		sums[AMX_LAG][2][16][2 * GROUP] __attribute__((aligned(64)));

	if (!j->unpacked || !j->xq_tiles || n_tiles == 0)
	{
		tokens_amx_small(j, g, 0, nibble, k_quant, has_min, split16, zero);
		return;
	}
	wide = j->unpacked + (size_t) thread * nb * AMX_SCRATCH_BLOCK;
	scales = (float *) (wide + (size_t) nb * AMX_WIDE_BYTES);
	for (int b = 0; b < nb; b++)
	{
		__m512i		v[8];
		__m512		ws,
					ws_hi = _mm512_setzero_ps(),
					wm = _mm512_setzero_ps();

		block_scales(m, g, g2, b, k_quant, has_min, split16, &d, &dmin, &ws, &ws_hi, &wm);
		_mm512_storeu_ps(scales + (size_t) b * AMX_SCALE_FLOATS, ws);
		_mm512_storeu_ps(scales + (size_t) b * AMX_SCALE_FLOATS + 2 * GROUP, ws_hi);
		_mm512_storeu_ps(scales + (size_t) b * AMX_SCALE_FLOATS + 4 * GROUP, wm);
		widen_block(m->q + ((size_t) g * nb + b) * bbytes, m->q + ((size_t) g2 * nb + b) * bbytes,
					nibble, split16, zero, true, v);
		for (int s = 0; s < 8; s++)
			_mm512_storeu_si512(wide + (size_t) b * AMX_WIDE_BYTES + 64 * s, v[s]);
	}
	amx_configure_blocks(split16, CAI_BTILE_TOKENS);
	for (int tile = 0; tile < n_tiles; tile++)
	{
		const int8_t *xq = j->xq_tiles + (size_t) tile * nb * CAI_BTILE_TOKENS * CAI_BLOCK_ELEMS;
		const float *xs = j->xs_tiles + (size_t) tile * nb * CAI_BTILE_TOKENS;
		const float *xsum_f = j->xsum_tiles + (size_t) tile * nb * CAI_BTILE_TOKENS;
		__m512		acc[16];

#pragma GCC unroll 16
		for (int t = 0; t < 16; t++)
			acc[t] = _mm512_setzero_ps();
		/*
		 * block b's product into one pair of tiles while block b - 1's sums go out of the
		 * other to memory and block b - 2's, stored an iteration ago, through the epilogue:
		 * vector loads right after the tile stores would wait for them (distances of up to
		 * eight blocks measured the same as two)
		 */
		for (int b = 0; b < nb + AMX_LAG; b++)
		{
			if (b < nb)
			{
				const uint8_t *w = wide + (size_t) b * AMX_WIDE_BYTES;
				const int8_t *a = xq + (size_t) b * CAI_BTILE_TOKENS * CAI_BLOCK_ELEMS;

				if (b % 2 == 0)
					AMX_BLOCK_PRODUCT(0, 1, w, a, CAI_BLOCK_ELEMS, split16);
				else
					AMX_BLOCK_PRODUCT(2, 3, w, a, CAI_BLOCK_ELEMS, split16);
			}
			if (b >= 1 && b <= nb)
				amx_store_sums(b - 1, sums[(b - 1) % AMX_LAG][0][0], sums[(b - 1) % AMX_LAG][1][0], split16);
			if (b >= AMX_LAG)
				amx_epilogue(xs + (size_t) (b - AMX_LAG) * CAI_BTILE_TOKENS,
							 xsum_f + (size_t) (b - AMX_LAG) * CAI_BTILE_TOKENS, false, 1,
							 scales + (size_t) (b - AMX_LAG) * AMX_SCALE_FLOATS,
							 sums[(b - AMX_LAG) % AMX_LAG][0][0], sums[(b - AMX_LAG) % AMX_LAG][1][0],
							 acc, CAI_BTILE_TOKENS, has_min, split16);
		}
		for (int t = 0; t < CAI_BTILE_TOKENS; t++)
			store_pair(j, tile * CAI_BTILE_TOKENS + t, g, g2, acc[t]);
	}
	_tile_release();
	tokens_amx_small(j, g, n_tiles * CAI_BTILE_TOKENS, nibble, k_quant, has_min, split16, zero);
}

/* ---------------------------------------------------------------------------------------
 * AMX for the K-quants: a super-block's sub-block scales folded into the levels
 *
 * Per super-block the sums are I = sum_b sc_b sum_i q_i a_i (gemm_blocks.h), so with each level
 * times its sub-block scale (|sc q| <= 32 * 128: 16 bits) as B, one accumulation over all 256
 * inputs gives I exactly.  AMX multiplies bytes, so the 16-bit products go in as two: their low
 * bytes (unsigned, tdpbsud) and their high bytes (signed, tdpbssd), in two tiles of sums, and
 * I = low + 256 high; both are exact in int32 (256 * 127 * 255 at most).  A call folds its two
 * groups' levels once into the thread's scratch; then per tile of 16 tokens and super-block,
 * four products of 64 inputs into each of the two tiles, two tile stores and one float
 * epilogue, against eight products, eight stores and eight epilogues a block at a time.  The
 * mins' M = sum_b m_b asum_b comes from vpdpwssd as in the decode kernel.
 * --------------------------------------------------------------------------------------- */

#define AMX_KQ_WIDE_BYTES (2 * 32 * 2 * GROUP)	/* a block's folded levels, low and high bytes */
#define AMX_KQ_SUPER_BYTES (2 * 2 * GROUP * (int) sizeof(float) + 4 * 64)	/* d, dmin, the min pairs */
#define AMX_KQ_SCRATCH_BLOCK (AMX_KQ_WIDE_BYTES + AMX_KQ_SUPER_BYTES / CAI_KQUANT_BLOCKS)
#define AMX_KQ_RUN 64			/* inputs per product: a tile row of A */
#define AMX_KQ_TILES 8			/* token tiles that share a super-block's levels in L1 */
#define AMX_KQ_PAIRS 4			/* pairs of groups that share a chunk of tiles' activations */

/*
 * Tiles 0-3: sums (0 and 1 the low and high bytes' of one super-block, 2 and 3 the next's);
 * tiles 4 and 5: 16 tokens' 64 inputs (runs in turn); tiles 6 and 7: the low and high bytes
 * of 64 inputs' folded levels (16 steps of 4).
 */
AMX_TARGET static void
amx_configure_kquant(void)
{
	amx_blocks_config cfg;

	memset(&cfg, 0, sizeof(cfg));
	cfg.palette = 1;
	for (int t = 0; t < 8; t++)
	{
		cfg.rows[t] = 16;
		cfg.bytes_per_row[t] = 64;
	}
	__asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

/*
 * Block b's levels of groups g and g2 times their sub-block scales, split into low bytes (lo)
 * and high bytes (hi), 8 steps of 64 bytes each, the steps' lanes as widen_block's.
 */
AMX_TARGET static inline __attribute__((always_inline)) void
fold_block(const cai_cpu_bmatrix *m, int g, int g2, int b, const bool nibble, const bool split16,
		   uint8_t *lo, uint8_t *hi)
{
	const int	nb = m->k / CAI_BLOCK_ELEMS;
	const int	bbytes = nibble ? 16 * GROUP : split16 ? 24 * GROUP : 32 * GROUP;
	__m512i		v[8],
				scale[2][2];

	widen_block(m->q + ((size_t) g * nb + b) * bbytes, m->q + ((size_t) g2 * nb + b) * bbytes,
				nibble, split16, 0, true, v);
	for (int h = 0; h < (split16 ? 2 : 1); h++)
	{
		/* lane r's scale as the low 16 bits of its 32: 4 copies for each of its 4 bytes */
		const __m512i sc = sub_scales_pair(m->sc + cai_bsub_index(m, g, b) + h * GROUP,
										   m->sc + cai_bsub_index(m, g2, b) + h * GROUP);
		__m512i		idx_lo,
					idx_hi;
		int16_t		lo_i[32],
					hi_i[32];

		for (int e = 0; e < 32; e++)
		{
			lo_i[e] = (int16_t) (2 * (e / 4));
			hi_i[e] = (int16_t) (2 * (8 + e / 4));
		}
		idx_lo = _mm512_loadu_si512(lo_i);
		idx_hi = _mm512_loadu_si512(hi_i);
		scale[h][0] = _mm512_permutexvar_epi16(idx_lo, sc);
		scale[h][1] = _mm512_permutexvar_epi16(idx_hi, sc);
	}
	for (int s = 0; s < 8; s++)
	{
		const int	h = split16 && s >= 4 ? 1 : 0;
		const __m512i p0 = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(_mm512_castsi512_si256(v[s])), scale[h][0]);
		const __m512i p1 = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(v[s], 1)),
											  scale[h][1]);

		_mm512_storeu_si512(lo + 64 * s,
							_mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(p0)),
											   _mm512_cvtepi16_epi8(p1), 1));
		_mm512_storeu_si512(hi + 64 * s,
							_mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srai_epi16(p0, 8))),
											   _mm512_cvtepi16_epi8(_mm512_srai_epi16(p1, 8)), 1));
	}
}

/*
 * Run c of a super-block's products (A: a tile's 16 tokens' 64 inputs of it, in tile A_T)
 * into C_LO and C_HI.  Runs alternate between two A tiles, so that a run's activations load
 * while the previous run's products still read theirs.
 */
#define AMX_RUN_PRODUCT(C_LO, C_HI, A_T, lo, hi, a, c) \
	do { \
		_tile_loadd(A_T, (a) + (size_t) (c) * CAI_BTILE_TOKENS * AMX_KQ_RUN, AMX_KQ_RUN); \
		_tile_loadd(6, (lo) + (size_t) (c) * 2 * 8 * 64, 64); \
		_tile_dpbsud(C_LO, A_T, 6); \
		_tile_loadd(7, (hi) + (size_t) (c) * 2 * 8 * 64, 64); \
		_tile_dpbssd(C_HI, A_T, 7); \
	} while (0)

/* A super-block's products for a tile's tokens (its 4 runs of 64 at a) into C_LO, C_HI. */
#define AMX_SUPER_PRODUCT(C_LO, C_HI, lo, hi, a) \
	do { \
		_tile_zero(C_LO); \
		_tile_zero(C_HI); \
		AMX_RUN_PRODUCT(C_LO, C_HI, 4, lo, hi, a, 0); \
		AMX_RUN_PRODUCT(C_LO, C_HI, 5, lo, hi, a, 1); \
		AMX_RUN_PRODUCT(C_LO, C_HI, 4, lo, hi, a, 2); \
		AMX_RUN_PRODUCT(C_LO, C_HI, 5, lo, hi, a, 3); \
	} while (0)

/*
 * Pair p's (groups g + 2 p and the next) folded levels and super-block scales into the scratch
 * at pair (its super-blocks' levels, then their d, dmin and min pairs).
 */
AMX_TARGET static inline __attribute__((always_inline)) void
fold_pair(const cai_cpu_bmatrix *m, int g, int g2, uint8_t *pair, const bool nibble,
		  const bool has_min, const bool split16)
{
	const int	nb = m->k / CAI_BLOCK_ELEMS;
	const int	n_super = nb / CAI_KQUANT_BLOCKS;
	const size_t super_wide = (size_t) CAI_KQUANT_BLOCKS * AMX_KQ_WIDE_BYTES;
	uint8_t    *extra = pair + (size_t) n_super * super_wide;

	for (int sb = 0; sb < n_super; sb++)
	{
		uint8_t    *lo = pair + (size_t) sb * super_wide;
		float	   *scales = (float *) (extra + (size_t) sb * AMX_KQ_SUPER_BYTES);
		const int	b0 = sb * CAI_KQUANT_BLOCKS;

		for (int i = 0; i < CAI_KQUANT_BLOCKS; i++)
			fold_block(m, g, g2, b0 + i, nibble, split16, lo + (size_t) i * 8 * 64,
					   lo + super_wide / 2 + (size_t) i * 8 * 64);
		_mm512_storeu_ps(scales, halves_pair(m->d + cai_bscale_index(m, g, b0),
											 m->d + cai_bscale_index(m, g2, b0)));
		if (has_min)
		{
			__m512i		mp[4];

			_mm512_storeu_ps(scales + 2 * GROUP, halves_pair(m->dmin + cai_bscale_index(m, g, b0),
															 m->dmin + cai_bscale_index(m, g2, b0)));
			min_pairs(m, g, g2, b0, mp);
			for (int q = 0; q < 4; q++)
				_mm512_storeu_si512(scales + 4 * GROUP + 16 * q, mp[q]);
		}
	}
}

/*
 * Up to AMX_KQ_PAIRS pairs of groups from g.  A call's tokens go in chunks of AMX_KQ_TILES
 * tiles; within a chunk, item i is tile i % nt of pair (i / nt) % np in super-block
 * i / (nt np): a super-block's folded levels (8 KB) stay in L1 for all the chunk's tiles, and
 * the chunk's activations (k bytes a token: megabytes for a down projection) are read from
 * memory once for all the pairs, not once per pair.
 */
AMX_TARGET static inline __attribute__((always_inline)) void
group_amx_kquant(const bgemm_job *j, int g, int thread, const bool nibble, const bool has_min,
				 const bool split16)
{
	const cai_cpu_bmatrix *m = j->w;
	const int	nb = m->k / CAI_BLOCK_ELEMS;
	const int	n_super = nb / CAI_KQUANT_BLOCKS;
	const int	n_groups = (j->n_out + GROUP - 1) / GROUP;
	const int	n_tiles = j->n_tok / CAI_BTILE_TOKENS;
	const size_t super_wide = (size_t) CAI_KQUANT_BLOCKS * AMX_KQ_WIDE_BYTES;
	const size_t pair_bytes = (size_t) nb * AMX_KQ_SCRATCH_BLOCK;
	int			np = 0;
	int			first[AMX_KQ_PAIRS],
				second[AMX_KQ_PAIRS];
	uint8_t    *scratch;
	int32_t		sums[AMX_LAG][2][16][2 * GROUP] __attribute__((aligned(64)));
	float		acc[AMX_KQ_PAIRS][AMX_KQ_TILES * 16][2 * GROUP] __attribute__((aligned(64)));

	for (int gp = g; gp < g + 2 * AMX_KQ_PAIRS && gp < n_groups; gp += 2)
	{
		first[np] = gp;
		second[np++] = gp + 1 < n_groups ? gp + 1 : gp;
	}
	if (!j->unpacked || !j->xq_tiles || n_tiles == 0)
	{
		for (int p = 0; p < np; p++)
			tokens_vnni(j, first[p], 0, nibble, true, has_min, split16, 0);
		return;
	}
	scratch = j->unpacked + (size_t) thread * AMX_KQ_PAIRS * pair_bytes;
	for (int p = 0; p < np; p++)
		fold_pair(m, first[p], second[p], scratch + p * pair_bytes, nibble, has_min, split16);
	amx_configure_kquant();
	for (int tile0 = 0; tile0 < n_tiles; tile0 += AMX_KQ_TILES)
	{
		const int	nt = n_tiles - tile0 < AMX_KQ_TILES ? n_tiles - tile0 : AMX_KQ_TILES;
		const int	n_items = n_super * np * nt;

		for (int p = 0; p < np; p++)
			for (int i = 0; i < nt * 16; i++)
				_mm512_store_ps(acc[p][i], _mm512_setzero_ps());
		/* as group_amx's blocks: an item's product, the previous one's stores, the epilogue two behind */
		for (int i = 0; i < n_items + AMX_LAG; i++)
		{
			if (i < n_items)
			{
				const int	sb = i / (nt * np),
							p = i / nt % np,
							tile = tile0 + i % nt;
				const uint8_t *lo = scratch + p * pair_bytes + (size_t) sb * super_wide;
				const int8_t *a = j->xq_tiles + ((size_t) tile * nb + (size_t) sb * CAI_KQUANT_BLOCKS) *
					CAI_BTILE_TOKENS * CAI_BLOCK_ELEMS;

				if (i % 2 == 0)
					AMX_SUPER_PRODUCT(0, 1, lo, lo + super_wide / 2, a);
				else
					AMX_SUPER_PRODUCT(2, 3, lo, lo + super_wide / 2, a);
			}
			if (i >= 1 && i <= n_items)
				amx_store_sums(i - 1, sums[(i - 1) % AMX_LAG][0][0], sums[(i - 1) % AMX_LAG][1][0], true);
			if (i >= AMX_LAG)
			{
				const int	done = i - AMX_LAG;
				const int	sb = done / (nt * np),
							p = done / nt % np,
							tile = tile0 + done % nt;
				const int	b0 = sb * CAI_KQUANT_BLOCKS;
				const float *scales = (const float *) (scratch + p * pair_bytes + (size_t) n_super * super_wide +
													   (size_t) sb * AMX_KQ_SUPER_BYTES);
				const float *xs = j->xs_tiles + ((size_t) tile * nb + b0) * CAI_BTILE_TOKENS;
				const int16_t *xsum = j->xsum + (size_t) tile * CAI_BTILE_TOKENS * nb + b0;
				const __m512 d = _mm512_loadu_ps(scales);
				const __m512 dmin = has_min ? _mm512_loadu_ps(scales + 2 * GROUP) : d;
				int32_t		(*slot)[16][2 * GROUP] = sums[done % AMX_LAG];
				float		(*tacc)[2 * GROUP] = acc[p] + (size_t) (done % nt) * 16;
				__m512i		mp[4];

				for (int q = 0; q < 4; q++)
					mp[q] = has_min ? _mm512_loadu_si512(scales + 4 * GROUP + 16 * q) : _mm512_setzero_si512();
#pragma GCC unroll 16
				for (int t = 0; t < 16; t++)
				{
					const __m512i I = _mm512_add_epi32(_mm512_load_si512(slot[0][t]),
													   _mm512_slli_epi32(_mm512_load_si512(slot[1][t]), 8));
					const __m512i M = has_min ? min_sum(mp, xsum + (size_t) t * nb) : I;

					_mm512_store_ps(tacc[t], kquant_finish(_mm512_load_ps(tacc[t]), I, M, d, dmin,
														   xs[t], has_min));
				}
			}
		}
		for (int p = 0; p < np; p++)
			for (int i = 0; i < nt * 16; i++)
				store_pair(j, tile0 * CAI_BTILE_TOKENS + i, first[p], second[p], _mm512_load_ps(acc[p][i]));
	}
	_tile_release();
	for (int p = 0; p < np; p++)
		tokens_vnni(j, first[p], n_tiles * CAI_BTILE_TOKENS, nibble, true, has_min, split16, 0);
}

#define GROUP_AMX(name, nibble, k_quant, has_min, split16, zero) \
AMX_TARGET static void \
name(const bgemm_job *j, int g, int thread) \
{ \
	group_amx(j, g, thread, nibble, k_quant, has_min, split16, zero); \
}

GROUP_AMX(group_amx_q4_0, true, false, false, false, -8)
GROUP_AMX(group_amx_q4_1, true, false, true, false, 0)
GROUP_AMX(group_amx_q4_k, true, true, true, false, 0)
GROUP_AMX(group_amx_q5_0, false, false, false, false, 0)
GROUP_AMX(group_amx_q5_1, false, false, true, false, 0)
GROUP_AMX(group_amx_q5_k, false, true, true, false, 0)
GROUP_AMX(group_amx_q6_k, false, true, false, true, 0)

/* The K-quants' instances for super-block activations. */
#define GROUP_AMX_SUPER(name, nibble, has_min, split16) \
AMX_TARGET static void \
name(const bgemm_job *j, int g, int thread) \
{ \
	group_amx_kquant(j, g, thread, nibble, has_min, split16); \
}

GROUP_AMX_SUPER(group_amx_super_q4_k, true, true, false)
GROUP_AMX_SUPER(group_amx_super_q5_k, false, true, false)
GROUP_AMX_SUPER(group_amx_super_q6_k, false, false, true)
GROUP_AMX(group_amx_q8_0, false, false, false, false, 0)

cai_bkernel
cai_bkernel_amx(ggml_type type, bool superblocks)
{
	cai_bkernel k = {NULL, 2, AMX_SCRATCH_BLOCK, 0};
	const cai_bkernel kquant = {NULL, 2 * AMX_KQ_PAIRS, AMX_KQ_PAIRS * AMX_KQ_SCRATCH_BLOCK, AMX_KQ_RUN};

	switch (type)
	{
		case GGML_TYPE_Q4_0:
			k.fn = group_amx_q4_0;
			break;
		case GGML_TYPE_Q4_1:
			k.fn = group_amx_q4_1;
			break;
		case GGML_TYPE_Q4_K:
			if (superblocks)
				k = kquant;
			k.fn = superblocks ? group_amx_super_q4_k : group_amx_q4_k;
			break;
		case GGML_TYPE_Q5_0:
			k.fn = group_amx_q5_0;
			break;
		case GGML_TYPE_Q5_1:
			k.fn = group_amx_q5_1;
			break;
		case GGML_TYPE_Q5_K:
			if (superblocks)
				k = kquant;
			k.fn = superblocks ? group_amx_super_q5_k : group_amx_q5_k;
			break;
		case GGML_TYPE_Q6_K:
			if (superblocks)
				k = kquant;
			k.fn = superblocks ? group_amx_super_q6_k : group_amx_q6_k;
			break;
		case GGML_TYPE_Q8_0:
			k.fn = group_amx_q8_0;
			break;
		default:
			break;
	}
	return k;
}
#endif							/* !CAI_BLOCKS_SIMDE */

#else							/* no x86-64: no VNNI kernels */

cai_bkernel
cai_bkernel_vnni(ggml_type type)
{
	return (cai_bkernel) {NULL, 1, 0, 0};
}

cai_bkernel
cai_bkernel_amx(ggml_type type, bool superblocks)
{
	return (cai_bkernel) {NULL, 1, 0, 0};
}

#endif
