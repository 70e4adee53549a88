/*
 * gemm_blocks_avxvnni.c — the block GEMM's AVX-VNNI kernels (the layout and the order of the
 * float operations every path follows: gemm_blocks.h).
 *
 * This file exists for the CPUs that have the VEX-encoded vpdpbusd on 256-bit registers but no
 * AVX-512 (Intel's E-core Xeons, Alder Lake and its successors): there the AVX-512 kernels of
 * gemm_blocks_vnni.c cannot run, and the AVX2 kernel spends two or three instructions
 * (vpmaddubsw, vpmaddwd, the sign step) where one vpdpbusd does.  It follows the 512-bit
 * kernel's scheme at half its width: one group of 8 rows per call, one row per 32-bit lane of
 * a ymm register.  Step s (inputs 4 s .. 4 s + 3) of a block is the group's 32 bytes at 32 s as
 * the layout stores them, so vpdpbusd multiplies them, unsigned, with the token's four
 * activations of the step, signed and broadcast, into 8 exact int32 row sums.  The levels go
 * into the unsigned operand as they are (nibbles 0..15, Q6_K's stored 0..63) or with the sign
 * bit flipped (the signed byte formats: w + 128), and that offset times the activations' block
 * sum is taken off the integer sum again; so each block's row sums are the integers the
 * portable kernel computes (with super-block activations a K-quant's then multiplied by their
 * sub-block scales and summed over the super-block into its exact int32 I and M), and the float
 * operations after them, per block or, a K-quant's with super-block activations, per super-block,
 * are the same ones in the same order: the same bits.
 *
 * A block's levels are widened once per tile of up to 4 tokens (AVX2 has 16 vector registers,
 * not AVX-512's 32: a block's 8 steps and a tile's sums fill them), Q6_K's once per group into
 * the thread's scratch when a call has more tokens than a tile.  Decoding a token streams the
 * prepared weights once: the first tile asks for the blocks ahead of it (levels and scales) so
 * that the loads find them in the cache.
 *
 * Compiled twice, like gemm_blocks_vnni.c: into the engine natively behind target attributes
 * (the ISA selection checks the CPU at run time), and into the unit tests with CAI_BLOCKS_SIMDE
 * defined, through SIMDe, whose AVX512-VL _mm256_dpbusd_epi32 computes what AVX-VNNI's
 * _mm256_dpbusd_avx_epi32 does (SIMDe 0.7 lacks the latter's name), so that every machine tests
 * these kernels bit for bit against the portable one.
 */
#include "gemm_blocks_internal.h"

#include <string.h>

#if defined(CAI_BLOCKS_SIMDE)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#define AVXVNNI_TARGET
#define AVXVNNI_NAME(name) name##_simde
#define dpbusd256 _mm256_dpbusd_epi32
#define AVXVNNI_KERNELS 1
#elif defined(__x86_64__)
#include <immintrin.h>
#define AVXVNNI_TARGET __attribute__((target("avx2,avxvnni,f16c")))
#define AVXVNNI_NAME(name) name
#define dpbusd256 _mm256_dpbusd_avx_epi32
#define AVXVNNI_KERNELS 1
#endif

#if defined(AVXVNNI_KERNELS)

#define GROUP CAI_BLOCK_ROWS
#define YTILE 4					/* tokens that share a block's widened levels */

static inline int32_t
load_i32(const int8_t *p)
{
	int32_t		v;

	memcpy(&v, p, sizeof(v));
	return v;
}

/* A group's 8 int8 sub-block scales (or mins) at p as int32, row r's in lane r. */
AVXVNNI_TARGET static inline __m256i
bytes_to_epi32(const int8_t *p)
{
	return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) p));
}

/*
 * Block b's scales for the 8 rows of group g: d and dmin (a K-quant's read at its super-block's
 * first block and carried from block to block); with super-block activations a K-quant's
 * sub-block scales sc (split16: sc_hi, the second half's) as the int32 multipliers of its block
 * sums; else the float ws (split16: ws_hi) and wm of the block's float operations, d sc and
 * dmin m for a K-quant, d and dmin for the others.
 */
AVXVNNI_TARGET static inline __attribute__((always_inline)) void
block_scales(const cai_cpu_bmatrix *m, int g, int b, const bool k_quant, const bool has_min,
			 const bool split16, const bool superblocks, __m256 *d, __m256 *dmin, __m256i *sc,
			 __m256i *sc_hi, __m256 *ws, __m256 *ws_hi, __m256 *wm)
{
	if (!k_quant || b % CAI_KQUANT_BLOCKS == 0)
	{
		*d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (m->d + cai_bscale_index(m, g, b))));
		if (has_min)
			*dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (m->dmin + cai_bscale_index(m, g, b))));
	}
	if (k_quant && superblocks)
	{
		*sc = bytes_to_epi32(m->sc + cai_bsub_index(m, g, b));
		if (split16)
			*sc_hi = bytes_to_epi32(m->sc + cai_bsub_index(m, g, b) + GROUP);
	}
	else if (k_quant)
	{
		*ws = _mm256_mul_ps(*d, _mm256_cvtepi32_ps(bytes_to_epi32(m->sc + cai_bsub_index(m, g, b))));
		if (split16)
			*ws_hi = _mm256_mul_ps(*d, _mm256_cvtepi32_ps(bytes_to_epi32(m->sc + cai_bsub_index(m, g, b) + GROUP)));
		if (has_min)
			*wm = _mm256_mul_ps(*dmin, _mm256_cvtepi32_ps(bytes_to_epi32(m->m + cai_bsub_index(m, g, b))));
	}
	else
	{
		*ws = *d;
		*wm = *dmin;
	}
}

/* Group g's mins of the K-quant super-block from block b0, for superblock_min_sums. */
AVXVNNI_TARGET static inline __attribute__((always_inline)) void
min_pairs(const cai_cpu_bmatrix *m, int g, int b0, __m256i *mins)
{
	for (int i = 0; i < CAI_KQUANT_BLOCKS / 2; i++)
		mins[i] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(
			_mm_loadl_epi64((const __m128i *) (m->m + cai_bsub_index(m, g, b0 + 2 * i))),
			_mm_loadl_epi64((const __m128i *) (m->m + cai_bsub_index(m, g, b0 + 2 * i + 1)))));
}

/*
 * M of a K-quant super-block (gemm_blocks.h) for the 8 rows and one token: lane r of mins[i]
 * holds row r's mins of blocks 2i and 2i + 1 as two int16 (min_pairs), and the token's block
 * sums asum lie two to a 32-bit word in the same order, so four vpmaddwd make the exact sum.
 */
AVXVNNI_TARGET static inline __m256i
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

/*
 * The levels of a group's block at p widened to a byte each for vpdpbusd's unsigned operand,
 * v[s] step s's (lane r: row r's inputs 4 s .. 4 s + 3): nibbles 0..15 and Q6_K's stored 0..63
 * as they are, the byte formats with their sign bit flipped.
 */
AVXVNNI_TARGET static inline __attribute__((always_inline)) void
widen_block(const uint8_t *p, const bool nibble, const bool split16, __m256i *v)
{
	if (nibble || split16)
	{
		/* steps 2p and 2p + 1 are the low and high nibbles of vector p */
		const __m256i nib = _mm256_set1_epi8(0x0f);

		for (int i = 0; i < 4; i++)
		{
			__m256i		raw = _mm256_loadu_si256((const __m256i *) (p + 32 * i));

			v[2 * i] = _mm256_and_si256(raw, nib);
			v[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib);
		}
	}
	if (split16)
	{
		/*
		 * step 4h + c's high two bits sit at bits 2c of vector h of the high parts; the 16-bit
		 * shifts move bits across bytes only into positions the mask 0x30 clears
		 */
		const __m256i top = _mm256_set1_epi8(0x30);

		for (int h = 0; h < 2; h++)
		{
			__m256i		hb = _mm256_loadu_si256((const __m256i *) (p + SPLIT16_HIGH_BITS + 32 * h));

			v[4 * h] = _mm256_or_si256(v[4 * h], _mm256_and_si256(_mm256_slli_epi16(hb, 4), top));
			v[4 * h + 1] = _mm256_or_si256(v[4 * h + 1], _mm256_and_si256(_mm256_slli_epi16(hb, 2), top));
			v[4 * h + 2] = _mm256_or_si256(v[4 * h + 2], _mm256_and_si256(hb, top));
			v[4 * h + 3] = _mm256_or_si256(v[4 * h + 3], _mm256_and_si256(_mm256_srli_epi16(hb, 2), top));
		}
	}
	else if (!nibble)
		for (int s = 0; s < 8; s++)
			v[s] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *) (p + 32 * s)),
									_mm256_set1_epi8((char) 0x80));
}

/*
 * Group g for tokens [t0, t0 + nt), its levels from the layout or (wide, Q6_K) already widened
 * into the thread's scratch, 256 bytes a block.  The format's flags and nt are compile-time
 * constants in each instance, and so is the K-quants' arithmetic (superblocks, the job's), so
 * the loops unroll, carry no branches on them, and the tile's sums live in registers.  With
 * super-block activations a K-quant's block sums (Q6_K: each half's) are multiplied by their
 * sub-block scales in int32 and added into one I per row and token; its super-block's last block
 * adds the mins' M and does the float operations, once per 256 inputs.  With per-block
 * activations every block converts its sums and does the float operations with ws and wm
 * (Q6_K: ws and ws_hi per half).
 */
AVXVNNI_TARGET static inline __attribute__((always_inline)) void
tile_avxvnni(const bgemm_job *j, int g, int t0, const int nt, const bool nibble,
			 const bool k_quant, const bool has_min, const bool split16, const int zero,
			 const bool superblocks, const uint8_t *wide)
{
	const cai_cpu_bmatrix *m = j->w;
	const int	k = m->k;
	const int	nb = k / CAI_BLOCK_ELEMS;
	const int	bbytes = nibble ? 16 * GROUP : split16 ? 24 * GROUP : 32 * GROUP;
	/* the integer sum's correction per unit of the activations' block sum (not split16) */
	const int	offset = nibble ? zero : zero - 128;
	const uint8_t *qg = m->q + (size_t) g * nb * bbytes;
	const int8_t *xq = j->xq + (size_t) t0 * k;
	const float *xs = j->xs + (size_t) t0 * nb;
	const int16_t *xsum = j->xsum + (size_t) t0 * nb;
	const int16_t *xsum_lo = split16 ? j->xsum_lo + (size_t) t0 * nb : NULL;
	__m256		acc[YTILE];
	__m256i		isuper[YTILE];
	__m256		d = _mm256_setzero_ps(),
				dmin = _mm256_setzero_ps();

	for (int t = 0; t < nt; t++)
	{
		acc[t] = _mm256_setzero_ps();
		isuper[t] = _mm256_setzero_si256();
	}
	for (int b = 0; b < nb; b++)
	{
		const uint8_t *p = qg + (size_t) b * bbytes;
		const bool	last = k_quant && superblocks &&
			b % CAI_KQUANT_BLOCKS == CAI_KQUANT_BLOCKS - 1;
		__m256i		v[8],
					sc = _mm256_setzero_si256(),
					sc_hi = _mm256_setzero_si256(),
					mins[CAI_KQUANT_BLOCKS / 2];
		__m256		ws = _mm256_setzero_ps(),
					ws_hi = _mm256_setzero_ps(),
					wm = _mm256_setzero_ps();

		if (t0 == 0 && !wide)
			cai_bprefetch_ahead(m, g, 1, b, CAI_BPREFETCH_BLOCKS);
		block_scales(m, g, b, k_quant, has_min, split16, superblocks, &d, &dmin, &sc, &sc_hi,
					 &ws, &ws_hi, &wm);
		if (has_min && last)
			min_pairs(m, g, b - (CAI_KQUANT_BLOCKS - 1), mins);
		if (wide)
			for (int s = 0; s < 8; s++)
				v[s] = _mm256_loadu_si256((const __m256i *) (wide + (size_t) b * 32 * GROUP + 32 * s));
		else
			widen_block(p, nibble, split16, v);
		for (int t = 0; t < nt; t++)
		{
			const int8_t *a = xq + (size_t) t * k + (size_t) b * CAI_BLOCK_ELEMS;
			const size_t tb = (size_t) t * nb + b;
			/* two independent chains of four, the even and the odd steps (split16: the halves) */
			__m256i		c0 = _mm256_setzero_si256(),
						c1 = _mm256_setzero_si256(),
						isum;
			__m256		term;

			for (int s = 0; s < 4; s++)
			{
				const int	s0 = split16 ? s : 2 * s,
							s1 = split16 ? 4 + s : 2 * s + 1;

				c0 = dpbusd256(c0, v[s0], _mm256_set1_epi32(load_i32(a + 4 * s0)));
				c1 = dpbusd256(c1, v[s1], _mm256_set1_epi32(load_i32(a + 4 * s1)));
			}
			if (split16)
			{
				const int	lo = xsum_lo[tb];
				__m256i		isum_lo = _mm256_add_epi32(c0, _mm256_set1_epi32(-SPLIT16_LEVEL_OFFSET * lo));
				__m256i		isum_hi = _mm256_add_epi32(c1, _mm256_set1_epi32(-SPLIT16_LEVEL_OFFSET * (xsum[tb] - lo)));

				if (superblocks)
					isum = _mm256_add_epi32(_mm256_mullo_epi32(sc, isum_lo), _mm256_mullo_epi32(sc_hi, isum_hi));
				else
					term = _mm256_add_ps(_mm256_mul_ps(ws, _mm256_cvtepi32_ps(isum_lo)),
										 _mm256_mul_ps(ws_hi, _mm256_cvtepi32_ps(isum_hi)));
			}
			else
			{
				isum = _mm256_add_epi32(c0, c1);
				if (offset != 0)
					isum = _mm256_add_epi32(isum, _mm256_set1_epi32(offset * xsum[tb]));
				if (k_quant && superblocks)
					isum = _mm256_mullo_epi32(sc, isum);
				else
					term = _mm256_mul_ps(ws, _mm256_cvtepi32_ps(isum));
			}
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
 * Group g for all of the job's tokens: tiles of 4, then what remains in tiles of 2 and 1, each
 * an instance of its own (the tile's size a constant).  Q6_K with more tokens than a tile and
 * the scratch the runner gives it (256 bytes per thread and block) widens the group's levels
 * once and reads them from there for every tile.  superblocks: tile_avxvnni's.
 */
AVXVNNI_TARGET static inline __attribute__((always_inline)) void
group_avxvnni(const bgemm_job *j, int g, int thread, const bool nibble, const bool k_quant,
			  const bool has_min, const bool split16, const int zero, const bool superblocks)
{
	const uint8_t *wide = NULL;
	int			t0 = 0;

	if (split16 && j->unpacked && j->n_tok > YTILE)
	{
		const int	nb = j->w->k / CAI_BLOCK_ELEMS;
		uint8_t    *dst = j->unpacked + (size_t) thread * nb * 32 * GROUP;

		for (int b = 0; b < nb; b++)
		{
			__m256i		v[8];

			widen_block(j->w->q + ((size_t) g * nb + b) * 24 * GROUP, false, true, v);
			for (int s = 0; s < 8; s++)
				_mm256_storeu_si256((__m256i *) (dst + (size_t) b * 32 * GROUP + 32 * s), v[s]);
		}
		wide = dst;
	}
	for (; t0 + YTILE <= j->n_tok; t0 += YTILE)
		tile_avxvnni(j, g, t0, YTILE, nibble, k_quant, has_min, split16, zero, superblocks, wide);
	if (t0 + 2 <= j->n_tok)
	{
		tile_avxvnni(j, g, t0, 2, nibble, k_quant, has_min, split16, zero, superblocks, wide);
		t0 += 2;
	}
	if (t0 < j->n_tok)
		tile_avxvnni(j, g, t0, 1, nibble, k_quant, has_min, split16, zero, superblocks, wide);
}

/* One instance per format, a K-quant's one per arithmetic, chosen once per call. */
#define GROUP_AVXVNNI(name, nibble, k_quant, has_min, split16, zero) \
AVXVNNI_TARGET static void \
AVXVNNI_NAME(name)(const bgemm_job *j, int g, int thread) \
{ \
	if (k_quant && j->superblocks) \
		group_avxvnni(j, g, thread, nibble, k_quant, has_min, split16, zero, true); \
	else \
		group_avxvnni(j, g, thread, nibble, k_quant, has_min, split16, zero, false); \
}

GROUP_AVXVNNI(group_avxvnni_q4_0, true, false, false, false, -8)
GROUP_AVXVNNI(group_avxvnni_q4_1, true, false, true, false, 0)
GROUP_AVXVNNI(group_avxvnni_q4_k, true, true, true, false, 0)
GROUP_AVXVNNI(group_avxvnni_q5_0, false, false, false, false, 0)
GROUP_AVXVNNI(group_avxvnni_q5_1, false, false, true, false, 0)
GROUP_AVXVNNI(group_avxvnni_q5_k, false, true, true, false, 0)
GROUP_AVXVNNI(group_avxvnni_q6_k, false, true, false, true, 0)
GROUP_AVXVNNI(group_avxvnni_q8_0, false, false, false, false, 0)

cai_bkernel
AVXVNNI_NAME(cai_bkernel_avxvnni)(ggml_type type)
{
	cai_bkernel k = {NULL, 1, 0, 0};

	switch (type)
	{
		case GGML_TYPE_Q4_0:
			k.fn = AVXVNNI_NAME(group_avxvnni_q4_0);
			break;
		case GGML_TYPE_Q4_1:
			k.fn = AVXVNNI_NAME(group_avxvnni_q4_1);
			break;
		case GGML_TYPE_Q4_K:
			k.fn = AVXVNNI_NAME(group_avxvnni_q4_k);
			break;
		case GGML_TYPE_Q5_0:
			k.fn = AVXVNNI_NAME(group_avxvnni_q5_0);
			break;
		case GGML_TYPE_Q5_1:
			k.fn = AVXVNNI_NAME(group_avxvnni_q5_1);
			break;
		case GGML_TYPE_Q5_K:
			k.fn = AVXVNNI_NAME(group_avxvnni_q5_k);
			break;
		case GGML_TYPE_Q6_K:
			k.fn = AVXVNNI_NAME(group_avxvnni_q6_k);
			break;
		case GGML_TYPE_Q8_0:
			k.fn = AVXVNNI_NAME(group_avxvnni_q8_0);
			break;
		default:
			break;
	}
	return k;
}

#else							/* no x86-64: no AVX-VNNI kernels */

cai_bkernel
cai_bkernel_avxvnni(ggml_type type)
{
	return (cai_bkernel) {NULL, 1, 0, 0};
}

#endif
