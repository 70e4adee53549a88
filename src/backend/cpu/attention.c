/*
 * attention.c — causal GQA attention over the paged int8 KV cache (see attention.h for the
 * arithmetic and why it is batch-independent).
 *
 * For each segment (attention.h) in turn, a tile runs three passes over its blocks, so that a
 * segment's scores (at most 256 per row) stay in the L1 and L2 caches between the passes:
 *   1. scores: each block's keys of the KV head are transposed once into groups of four bytes
 *      (kt[g][slot][4] = k[slot][4g .. 4g+3]), so that one 4-byte dot-product instruction
 *      (AVX-512 VNNI vpdpbusd, or AVX2 vpmaddubsw + vpmaddwd) scores a query against all 16
 *      keys of the block at once; every tile row reuses the transposed block.  On avx512-vnni
 *      the segment's blocks are transposed first and its whole blocks then scored two at a
 *      time, each query broadcast feeding both.  On avx512-amx a tile of 16 or more rows
 *      takes its scores from AMX int8 tiles instead: the transposed block is already a tile's
 *      B operand, and the segment's blocks are transposed first, then scored together;
 *   2. softmax of each row's part of the segment (attention.h: max subtraction, the
 *      attention's exp2, sixteen-partial-sum total); the int8 path then quantizes each row's
 *      weights to 14 bits in two 7-bit planes (the float reference path normalizes instead);
 *   3. values: the int8 path packs the segment's values of the KV head once for the tile, in
 *      groups of four positions, and takes each row's exact integer sums of weights times
 *      values from cpu/attention_values.c (AMX tiles, vpdpbusd, AVX2 or plain C), then scales
 *      them once; the float path accumulates the shadow values positions in ascending order.
 *      Each row then takes the segment's sums as its output (its first segment) or folds them
 *      into it; the int8 path does so as it scales the sums, with the fold weights worked out
 *      for all the rows after the softmax (so the sums make one trip through memory).
 * A part of a split tile (cai_attention_tile_part) runs the same passes over its segments and
 * leaves their sums, maxima and totals to cai_attention_merge; so does a shared tile
 * (cai_attention_shared_part), whose rows are one token of each of several sequences over blocks
 * they all hold, each token's rows into its own sequence's partials.
 *
 * Paths.  The tile is compiled for AVX-512, AVX2 and baseline x86-64 and picked at run time the
 * way cpu/gemm.c picks its kernels (cai_cpu_isa(), so cai_cpu_force_isa switches both;
 * avx512-amx is the AVX-512 path with AMX scores and value sums, avx-vnni the AVX2 one).  The integer sums are exact
 * and every float operation is lane-wise, in the same order on every path, with multiply-add
 * contraction switched off for this file (below) and the exp's fused multiply-adds written out
 * on every path: all paths give bit-identical results.
 * The AVX-512 path's hot loops (scores, exponentials) are functions of their own:
 * inlined into the tile, GCC 12 spills their accumulators to the stack.
 */
#include "attention.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include "attention_values.h"
#include "gemm.h"
#include "ops.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* A multiply-add fused by the compiler would round differently on FMA paths. */
#pragma GCC optimize("fp-contract=off")

/*
 * Query rows per tile the kernel aims for (tile_tokens * n_group).  A larger tile packs and
 * transposes each KV block for more rows, but holds more scores between the passes: 128 is
 * faster than 64 on long prompts and no slower on short ones, and 192 gains nothing more.
 * Results do not depend on it.
 */
#define TILE_ROWS 128

/* Query rows are processed in groups of this many (buffers are padded to a multiple). */
#define ROW_GROUP 4

/* Query rows per AMX tile (a multiple of ROW_GROUP); the scratch holds whole tiles of rows. */
#define AMX_ROWS 16

#define BLOCK CAI_KV_BLOCK_TOKENS

/*
 * Floats between the starts of two rows' scores: a segment's 256 and one cache line more.  The
 * AMX scores are written a block (one line) of 64 rows at a time, and rows 1 KB apart would all
 * land in 4 of the L1 cache's 64 sets and evict each other.
 */
#define SCORES_LD (CAI_ATTN_SEGMENT_TOKENS + 16)

/* Query rows of one token handed to the float path's value accumulation at once. */
#define MAX_GROUP_ROWS 16

typedef float cai_v16f __attribute__((vector_size(64)));
typedef int32_t cai_v16i __attribute__((vector_size(64)));

CAI_ALWAYS_INLINE cai_v16f
cai_v16f_load(const float *p)
{
	cai_v16f	v;

	memcpy(&v, p, sizeof(v));
	return v;
}

/* Lane-wise a > b ? a : b, by comparison masks like ops.h's cai_v8f_max. */
#define cai_v16f_max(a, b) \
	({ \
		cai_v16f	max_a_ = (a), \
					max_b_ = (b); \
		cai_v16i	max_m_ = max_a_ > max_b_; \
		(cai_v16f) (((cai_v16i) max_a_ & max_m_) | ((cai_v16i) max_b_ & ~max_m_)); \
	})

/*
 * The attention's exp2 (cai_attention_exp2 in attention.h) lane by lane: x clamped to
 * [CAI_ATTN_EXP2_LO, CAI_ATTN_EXP2_HI] (ops.h's CAI_VCLAMP: a NaN becomes the low end), k = x
 * rounded to the nearest integer (ties to even, by the 1.5 * 2^23 trick), r = x - k (exact), the
 * polynomial by Horner's rule with each step fused (one rounding, as vfmadd, fmaf and the GPU's
 * __fmaf_rn give), times 2^k built in the exponent bits.  GCC turns the lane loop into vector
 * multiply-adds where the path has them.
 */
#define ATTN_DEFINE_VEXP2(NAME, VF, VI) \
CAI_ALWAYS_INLINE VF \
NAME(const VF *px) \
{ \
	const VF	zero = {0}; \
	const VF	magic = zero + 12582912.0f; \
	const VF	lo = zero + CAI_ATTN_EXP2_LO; \
	const VF	hi = zero + CAI_ATTN_EXP2_HI; \
	VF			x = *px, \
				k, \
				p; \
	VI			bits; \
\
	CAI_VCLAMP(VF, VI, x, lo, hi); \
	k = (x + magic) - magic; \
	for (int i_ = 0; i_ < (int) (sizeof(VF) / sizeof(float)); i_++) \
	{ \
		float		r_ = x[i_] - k[i_]; \
		float		p_ = __builtin_fmaf(CAI_ATTN_EXP2_C6, r_, CAI_ATTN_EXP2_C5); \
\
		p_ = __builtin_fmaf(p_, r_, CAI_ATTN_EXP2_C4); \
		p_ = __builtin_fmaf(p_, r_, CAI_ATTN_EXP2_C3); \
		p_ = __builtin_fmaf(p_, r_, CAI_ATTN_EXP2_C2); \
		p_ = __builtin_fmaf(p_, r_, CAI_ATTN_EXP2_C1); \
		p[i_] = __builtin_fmaf(p_, r_, 1.0f); \
	} \
	bits = (__builtin_convertvector(k, VI) + 127) << 23; \
	return p * (VF) bits; \
}

ATTN_DEFINE_VEXP2(attn_exp2_16, cai_v16f, cai_v16i)
ATTN_DEFINE_VEXP2(attn_exp2_8, cai_v8f, cai_v8i)

/* (a macro: a 64-byte vector passed by value draws GCC's ABI note on non-AVX-512 builds) */
#define cai_v16f_store(p, v) \
	do { \
		cai_v16f	v16_ = (v); \
		memcpy((p), &v16_, sizeof(v16_)); \
	} while (0)

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

/* Rows of a tile the scratch holds, rounded up to whole AMX tiles (whole row groups too). */
static int
tile_rows_padded(int n_group)
{
	int			rows = cai_attention_tile_tokens(n_group) * n_group;

	return (rows + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS;
}

int
cai_attention_max_segments(int max_context)
{
	return (max_context - 1) / CAI_ATTN_SEGMENT_TOKENS + 1;
}

size_t
cai_attention_scratch_bytes(int max_context, int n_group, int head_dim)
{
	size_t		rows = (size_t) tile_rows_padded(n_group);

	return align64(rows * (size_t) SCORES_LD * sizeof(float))	/* scores */
		+ align64(rows * (size_t) head_dim * sizeof(float))	/* seg_o */
		+ 2 * align64(rows * sizeof(float))	/* seg_m, seg_l */
		+ align64((rows + 8) * 7 * sizeof(float))	/* fold */
		+ align64(rows * (size_t) head_dim)	/* q_i8 */
		+ align64(rows * (size_t) head_dim * sizeof(float))	/* q_f32 */
		+ align64(rows * sizeof(float))	/* q_scale */
		+ align64(rows * sizeof(int32_t))	/* q_sum */
		+ align64((size_t) CAI_ATTN_SEGMENT_TOKENS * head_dim)	/* k_t */
		+ align64(CAI_ATTN_SEGMENT_TOKENS * sizeof(float))	/* k_scales */
		+ align64(rows * BLOCK * sizeof(int32_t))	/* dots */
		+ align64((size_t) CAI_ATTN_SEGMENT_TOKENS * head_dim)	/* k2_t */
		+ align64(rows * BLOCK * sizeof(int32_t))	/* dots2 */
		+ align64((size_t) BLOCK * head_dim * sizeof(float))	/* values */
		+ 2 * align64(rows * sizeof(int32_t))	/* row_lo, row_hi */
		+ 2 * align64(CAI_ATTN_SEGMENT_TOKENS * sizeof(float))	/* v_scales, v_scale_max */
		+ 2 * align64(rows * (size_t) CAI_ATTN_SEGMENT_TOKENS)	/* w_lo, w_hi */
		+ align64((size_t) CAI_ATTN_SEGMENT_TOKENS * head_dim)	/* v_quads */
		+ align64(rows * 2 * (size_t) head_dim * sizeof(int32_t))	/* v_sums */
		+ align64(rows * sizeof(int32_t))	/* row_quads */
		+ align64(rows * sizeof(float))	/* row_g */
		+ align64(CAI_ATTN_SEGMENT_TOKENS * sizeof(float))	/* own_vs */
		+ 2 * align64((size_t) n_group * CAI_ATTN_SEGMENT_TOKENS)	/* own_w_lo, own_w_hi */
		+ align64((size_t) n_group * 2 * head_dim * sizeof(int32_t));	/* own_sums */
}

void
cai_attention_scratch_init(cai_attn_scratch *s, void *memory, int max_context, int n_group,
						   int head_dim)
{
	size_t		rows = (size_t) tile_rows_padded(n_group);
	uint8_t    *p = memory;

	s->scores = (float *) p;
	p += align64(rows * (size_t) SCORES_LD * sizeof(float));
	s->q_i8 = (int8_t *) p;
	p += align64(rows * (size_t) head_dim);
	s->q_f32 = (float *) p;
	p += align64(rows * (size_t) head_dim * sizeof(float));
	s->q_scale = (float *) p;
	p += align64(rows * sizeof(float));
	s->q_sum = (int32_t *) p;
	p += align64(rows * sizeof(int32_t));
	s->k_t = (int8_t *) p;
	p += align64((size_t) CAI_ATTN_SEGMENT_TOKENS * head_dim);
	s->k_scales = (float *) p;
	p += align64(CAI_ATTN_SEGMENT_TOKENS * sizeof(float));
	s->dots = (int32_t *) p;
	p += align64(rows * BLOCK * sizeof(int32_t));
	s->k2_t = (int8_t *) p;
	p += align64((size_t) CAI_ATTN_SEGMENT_TOKENS * head_dim);
	s->dots2 = (int32_t *) p;
	p += align64(rows * BLOCK * sizeof(int32_t));
	s->values = (float *) p;
	p += align64((size_t) BLOCK * head_dim * sizeof(float));
	s->v_scales = (float *) p;
	p += align64(CAI_ATTN_SEGMENT_TOKENS * sizeof(float));
	s->v_scale_max = (float *) p;
	p += align64(CAI_ATTN_SEGMENT_TOKENS * sizeof(float));
	s->w_lo = p;
	p += align64(rows * (size_t) CAI_ATTN_SEGMENT_TOKENS);
	s->w_hi = p;
	p += align64(rows * (size_t) CAI_ATTN_SEGMENT_TOKENS);
	s->v_quads = (int8_t *) p;
	p += align64((size_t) CAI_ATTN_SEGMENT_TOKENS * head_dim);
	s->v_sums = (int32_t *) p;
	p += align64(rows * 2 * (size_t) head_dim * sizeof(int32_t));
	s->row_quads = (int32_t *) p;
	p += align64(rows * sizeof(int32_t));
	s->row_g = (float *) p;
	p += align64(rows * sizeof(float));
	s->row_lo = (int32_t *) p;
	p += align64(rows * sizeof(int32_t));
	s->row_hi = (int32_t *) p;
	p += align64(rows * sizeof(int32_t));
	s->seg_o = (float *) p;
	p += align64(rows * (size_t) head_dim * sizeof(float));
	s->seg_m = (float *) p;
	p += align64(rows * sizeof(float));
	s->seg_l = (float *) p;
	p += align64(rows * sizeof(float));
	s->own_vs = (float *) p;
	p += align64(CAI_ATTN_SEGMENT_TOKENS * sizeof(float));
	s->own_w_lo = p;
	p += align64((size_t) n_group * CAI_ATTN_SEGMENT_TOKENS);
	s->own_w_hi = p;
	p += align64((size_t) n_group * CAI_ATTN_SEGMENT_TOKENS);
	s->own_sums = (int32_t *) p;
	p += align64((size_t) n_group * 2 * head_dim * sizeof(int32_t));
	s->fold = (float *) p;
}

/* ---------------------------------------------------------------------------------------------
 * Query-times-keys kernels: dots[r][slot] = sum_d q[r][d] * k[slot][d], exactly, for the
 * transposed block kt[g][slot][4] and rows [0, rows) (rows a multiple of ROW_GROUP).
 * ------------------------------------------------------------------------------------------- */

/*
 * Transposes the keys of slots [0, 16) (rows `stride` bytes apart) into kt[g][slot][4]; slots
 * outside [s0, s1] are zeroed (their memory may never have been written).
 */
static void
transpose_keys_generic(const int8_t *keys, size_t stride, int hd, int s0, int s1, int8_t *kt)
{
	for (int slot = 0; slot < BLOCK; slot++)
	{
		const int8_t *krow = keys + (size_t) slot * stride;

		for (int g = 0; g < hd / 4; g++)
		{
			if (slot < s0 || slot > s1)
				memset(kt + ((size_t) g * BLOCK + slot) * 4, 0, 4);
			else
				memcpy(kt + ((size_t) g * BLOCK + slot) * 4, krow + 4 * g, 4);
		}
	}
}

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
#define TARGET_AVX2 __attribute__((target("avx2,fma")))

/*
 * The same transposition for head sizes that are a multiple of 64: each 64-byte chunk of the
 * 16 key rows is a 16 x 16 matrix of dwords, transposed in registers (interleave dwords, then
 * qwords, then 128-bit blocks).  Unused slots are transposed too: whatever they hold only
 * reaches dot products that are never read (VNNI arithmetic has no lane crossing).
 */
TARGET_AVX512 static void
transpose_keys_avx512(const int8_t *keys, size_t stride, int hd, bool flip, int8_t *kt)
{
	const __m512i flip_bits = _mm512_set1_epi8(flip ? (char) 0x80 : 0);

	for (int c = 0; c < hd / 64; c++)
	{
		__m512i		r[16],
					a[16],
					b[16];

		for (int i = 0; i < 16; i++)
			r[i] = _mm512_loadu_si512(keys + (size_t) i * stride + 64 * c);
		for (int i = 0; i < 8; i++)
		{
			a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
			a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
		}
		/* b[4i + k], 128-bit block bb: rows 4i..4i+3 of dword column 4bb + k */
		for (int i = 0; i < 4; i++)
		{
			b[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i + 0], a[4 * i + 2]);
			b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i + 0], a[4 * i + 2]);
			b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
			b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
		}
		for (int k = 0; k < 4; k++)
		{
			__m512i		c0 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0x44);
			__m512i		c1 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0xEE);
			__m512i		d0 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0x44);
			__m512i		d1 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0xEE);
			int8_t	   *out = kt + (size_t) (16 * c) * 64;

			_mm512_storeu_si512(out + (size_t) (0 + k) * 64,
								_mm512_xor_si512(_mm512_shuffle_i32x4(c0, d0, 0x88), flip_bits));
			_mm512_storeu_si512(out + (size_t) (4 + k) * 64,
								_mm512_xor_si512(_mm512_shuffle_i32x4(c0, d0, 0xDD), flip_bits));
			_mm512_storeu_si512(out + (size_t) (8 + k) * 64,
								_mm512_xor_si512(_mm512_shuffle_i32x4(c1, d1, 0x88), flip_bits));
			_mm512_storeu_si512(out + (size_t) (12 + k) * 64,
								_mm512_xor_si512(_mm512_shuffle_i32x4(c1, d1, 0xDD), flip_bits));
		}
	}
}

/*
 * acc += vpdpbusd(k, the four bytes at p broadcast to every lane).  Written out because GCC
 * copies the accumulator around every vpdpbusd intrinsic; the broadcast rides on the load.
 */
typedef int32_t cai_i32_alias __attribute__((may_alias, aligned(1)));
#define DPBUSD_BCAST(acc, k, p) \
	__asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(k), "m"(*(const cai_i32_alias *) (p)))

/*
 * vpdpbusd multiplies unsigned by signed bytes: the keys come transposed with their top bit
 * flipped (k ^ 0x80 == k + 128 as an unsigned byte), which adds 128 * sum(q) to each dot
 * product; q_sum removes it.  With scores given (a block wholly inside the segment's span),
 * each row's scores go straight there instead, ld_scores floats apart:
 * dot * (kscale[slot] * q_scale[r]), the operations the tile applies to dots.  With kt2
 * (two-digit keys: the second digits, transposed the same way) the dot is
 * 254 (q . k) + q . k2.
 */
TARGET_AVX512 __attribute__((noinline)) static void
qk_block_avx512(const int8_t *kt, const int8_t *kt2, const int8_t *q, const int32_t *q_sum,
				int rows, int hd, int32_t *dots, const float *kscale, const float *q_scale,
				float *scores, size_t ld_scores)
{
	const __m512 ks = _mm512_loadu_ps(kscale);
	const __m512i base = _mm512_set1_epi32(CAI_KV_KEY_DIGIT_BASE);

	/*
	 * Four rows, each with two sums (even and odd groups, or the two digits): eight
	 * independent chains of vpdpbusd, enough to cover its latency.  Integer sums are exact in
	 * any order.
	 */
	for (int r = 0; r < rows; r += ROW_GROUP)
	{
		const int8_t *q0 = q + (size_t) r * hd;
		const int8_t *q1 = q0 + hd;
		const int8_t *q2 = q1 + hd;
		const int8_t *q3 = q2 + hd;
		__m512i		a0 = _mm512_setzero_si512(),
					a1 = a0,
					a2 = a0,
					a3 = a0,
					b0 = a0,
					b1 = a0,
					b2 = a0,
					b3 = a0;

		if (kt2)
		{
			for (int g = 0; g < hd / 4; g++)
			{
				__m512i		ka = _mm512_loadu_si512(kt + (size_t) g * 64);
				__m512i		kb = _mm512_loadu_si512(kt2 + (size_t) g * 64);

				DPBUSD_BCAST(a0, ka, q0 + 4 * g);
				DPBUSD_BCAST(a1, ka, q1 + 4 * g);
				DPBUSD_BCAST(a2, ka, q2 + 4 * g);
				DPBUSD_BCAST(a3, ka, q3 + 4 * g);
				DPBUSD_BCAST(b0, kb, q0 + 4 * g);
				DPBUSD_BCAST(b1, kb, q1 + 4 * g);
				DPBUSD_BCAST(b2, kb, q2 + 4 * g);
				DPBUSD_BCAST(b3, kb, q3 + 4 * g);
			}
			/* a = 254 (a - 128 sum(q)) = 254 (q . k); b - 128 sum(q) = q . k2 below */
#define FIRST_DIGIT(i, A) \
			A = _mm512_mullo_epi32(_mm512_sub_epi32(A, _mm512_set1_epi32(q_sum[r + i] * 128)), base)
			FIRST_DIGIT(0, a0);
			FIRST_DIGIT(1, a1);
			FIRST_DIGIT(2, a2);
			FIRST_DIGIT(3, a3);
#undef FIRST_DIGIT
		}
		else
			for (int g = 0; g < hd / 4; g += 2)
			{
				__m512i		ka = _mm512_loadu_si512(kt + (size_t) g * 64);
				__m512i		kb = _mm512_loadu_si512(kt + (size_t) g * 64 + 64);

				DPBUSD_BCAST(a0, ka, q0 + 4 * g);
				DPBUSD_BCAST(a1, ka, q1 + 4 * g);
				DPBUSD_BCAST(a2, ka, q2 + 4 * g);
				DPBUSD_BCAST(a3, ka, q3 + 4 * g);
				DPBUSD_BCAST(b0, kb, q0 + 4 * g + 4);
				DPBUSD_BCAST(b1, kb, q1 + 4 * g + 4);
				DPBUSD_BCAST(b2, kb, q2 + 4 * g + 4);
				DPBUSD_BCAST(b3, kb, q3 + 4 * g + 4);
			}
#define STORE_DOTS(i, A, B) \
		do { \
			__m512i		dot_ = _mm512_sub_epi32(_mm512_add_epi32(A, B), \
												_mm512_set1_epi32(q_sum[r + i] * 128)); \
\
			if (scores) \
				_mm512_storeu_ps(scores + (size_t) (r + i) * ld_scores, \
								 _mm512_mul_ps(_mm512_cvtepi32_ps(dot_), \
											   _mm512_mul_ps(ks, _mm512_set1_ps(q_scale[r + i])))); \
			else \
				_mm512_storeu_si512(dots + (size_t) (r + i) * BLOCK, dot_); \
		} while (0)
		STORE_DOTS(0, a0, b0);
		STORE_DOTS(1, a1, b1);
		STORE_DOTS(2, a2, b2);
		STORE_DOTS(3, a3, b3);
#undef STORE_DOTS
	}
}

/*
 * The scores of two consecutive whole blocks (kt: the first's transposed, flipped keys, the
 * second's right after), for every row, as qk_block_avx512 makes each: each query broadcast
 * feeds both blocks, so a step issues six loads for eight vpdpbusd instead of ten (on cores
 * with two vector multiply ports the loads, not the multiplies, bound qk_block_avx512).
 * Single-digit keys; kscale holds the two blocks' 32 key scales.
 */
TARGET_AVX512 __attribute__((noinline)) static void
qk_block_pair_avx512(const int8_t *kt, const int8_t *q, const int32_t *q_sum, int rows, int hd,
					 const float *kscale, const float *q_scale, float *scores, size_t ld_scores)
{
	const int8_t *kt_b = kt + (size_t) BLOCK * hd;
	const __m512 ks_a = _mm512_loadu_ps(kscale);
	const __m512 ks_b = _mm512_loadu_ps(kscale + BLOCK);

	for (int r = 0; r < rows; r += ROW_GROUP)
	{
		const int8_t *q0 = q + (size_t) r * hd;
		const int8_t *q1 = q0 + hd;
		const int8_t *q2 = q1 + hd;
		const int8_t *q3 = q2 + hd;
		__m512i		a0 = _mm512_setzero_si512(),
					a1 = a0,
					a2 = a0,
					a3 = a0,
					b0 = a0,
					b1 = a0,
					b2 = a0,
					b3 = a0;

		for (int g = 0; g < hd / 4; g++)
		{
			__m512i		ka = _mm512_loadu_si512(kt + (size_t) g * 64);
			__m512i		kb = _mm512_loadu_si512(kt_b + (size_t) g * 64);
			__m512i		x;

#define BOTH_BLOCKS(A, B, qr) \
			do { \
				x = _mm512_set1_epi32(*(const cai_i32_alias *) ((qr) + 4 * g)); \
				__asm__("vpdpbusd %2, %1, %0" : "+v"(A) : "v"(ka), "v"(x)); \
				__asm__("vpdpbusd %2, %1, %0" : "+v"(B) : "v"(kb), "v"(x)); \
			} while (0)
			BOTH_BLOCKS(a0, b0, q0);
			BOTH_BLOCKS(a1, b1, q1);
			BOTH_BLOCKS(a2, b2, q2);
			BOTH_BLOCKS(a3, b3, q3);
#undef BOTH_BLOCKS
		}
#define STORE_SCORES(i, A, B) \
		do { \
			__m512i		bias_ = _mm512_set1_epi32(q_sum[r + i] * 128); \
			__m512		qs_ = _mm512_set1_ps(q_scale[r + i]); \
			float	   *row_ = scores + (size_t) (r + i) * ld_scores; \
\
			_mm512_storeu_ps(row_, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(A, bias_)), \
												 _mm512_mul_ps(ks_a, qs_))); \
			_mm512_storeu_ps(row_ + BLOCK, \
							 _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(B, bias_)), \
										   _mm512_mul_ps(ks_b, qs_))); \
		} while (0)
		STORE_SCORES(0, a0, b0);
		STORE_SCORES(1, a1, b1);
		STORE_SCORES(2, a2, b2);
		STORE_SCORES(3, a3, b3);
#undef STORE_SCORES
	}
}

/*
 * The same scores from AMX int8 tiles (the avx512-amx path): tdpbssd multiplies signed by signed
 * bytes, so no offset is needed, and its int32 sums are the same integers.  The queries are the
 * A tiles (16 rows of 64 bytes: 64 dimensions), the transposed block kt is already the B layout
 * (row g: the 16 slots' dimensions 4g..4g+3), and each product is a 16 x 16 block of dots.
 * Tiles 0-3 hold the dots of four 16-row chunks, 4 and 5 their queries in turn, 6 and 7 the
 * keys (one 64-dimension step each).
 */
#define TARGET_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")))

/* Chunk I's query rows for step c into tile A; then its dots, tile C, += A x keys (tile B). */
#define AMX_CHUNK_STEP(C, A, B, I) \
	do { \
		_tile_loadd(A, q + (size_t) (r + AMX_ROWS * (I)) * hd + 64 * c, hd); \
		_tile_dpbssd(C, A, B); \
	} while (0)

/* Step c's keys into tile B, then up to four chunks' (n of them) products with them. */
#define AMX_STEP(B) \
	do { \
		_tile_loadd(B, kt + (size_t) c * 16 * 64, 64); \
		AMX_CHUNK_STEP(0, 4, B, 0); \
		if (n > 1) \
			AMX_CHUNK_STEP(1, 5, B, 1); \
		if (n > 2) \
			AMX_CHUNK_STEP(2, 4, B, 2); \
		if (n > 3) \
			AMX_CHUNK_STEP(3, 5, B, 3); \
	} while (0)

/*
 * qk_block_avx512's results for n_blocks consecutive transposed blocks kt (BLOCK * hd bytes
 * apart) and rows [0, rows) (rows a multiple of AMX_ROWS, hd of 64), with the tiles configured
 * by cai_amx_configure: the dots of one block (n_blocks 1), or every block's scores, block i at
 * scores + i * BLOCK in each row (kscale: n_blocks * BLOCK scales).  With kt2_first (two-digit
 * keys) each unit runs the tiles over both digits' blocks and takes 254 (q . k) + q . k2.
 *
 * The work goes in units of a block and four chunks of rows.  A unit's dots are scaled into
 * scores only after the next unit's products are under way, so that the tiles and the vector
 * units do not wait for each other, and the keys come from blocks transposed beforehand: a
 * tile read just after the vector stores that wrote it would wait for them.
 */
TARGET_AMX __attribute__((noinline)) static void
qk_blocks_amx(const int8_t *kt_first, const int8_t *kt2_first, int n_blocks, const int8_t *q,
			  int rows, int hd, int32_t *dots, const float *kscale, const float *q_scale,
			  float *scores, size_t ld_scores)
{
	int32_t		unit_dots[2][2][4 * AMX_ROWS][BLOCK] __attribute__((aligned(64)));
	int			units_per_block = (rows + 4 * AMX_ROWS - 1) / (4 * AMX_ROWS);
	int			n_units = n_blocks * units_per_block;
	int			n_digits = kt2_first ? 2 : 1;
	int			prev_r = 0,
				prev_rows = 0,
				prev_block = 0;
	int			key_tile = 0;

	for (int u = 0; u <= n_units; u++)
	{
		int			block = u / units_per_block;
		int			r = u % units_per_block * 4 * AMX_ROWS;
		int			n = (rows - r) / AMX_ROWS < 4 ? (rows - r) / AMX_ROWS : 4;

		/* each digit's dots (with one digit and no scores, straight into dots) */
		for (int digit = 0; u < n_units && digit < n_digits; digit++)
		{
			const int8_t *kt = (digit ? kt2_first : kt_first) + (size_t) block * BLOCK * hd;
			int32_t    *out = scores || kt2_first ? unit_dots[u & 1][digit][0] :
				dots + (size_t) r * BLOCK;

			_tile_zero(0);
			_tile_zero(1);
			_tile_zero(2);
			_tile_zero(3);
			/* keys alternate between tiles 6 and 7: loading one does not wait for the other's reads */
			for (int c = 0; c < hd / 64; c++, key_tile ^= 1)
			{
				if (key_tile == 0)
					AMX_STEP(6);
				else
					AMX_STEP(7);
			}
			_tile_stored(0, out, BLOCK * sizeof(int32_t));
			if (n > 1)
				_tile_stored(1, out + 1 * AMX_ROWS * BLOCK, BLOCK * sizeof(int32_t));
			if (n > 2)
				_tile_stored(2, out + 2 * AMX_ROWS * BLOCK, BLOCK * sizeof(int32_t));
			if (n > 3)
				_tile_stored(3, out + 3 * AMX_ROWS * BLOCK, BLOCK * sizeof(int32_t));
		}
		/* two digits: the unit's dots 254 (q . k) + q . k2, into dots or scaled below */
		if (kt2_first && u < n_units)
			for (int i = 0; i < n * AMX_ROWS; i++)
			{
				__m512i		dot = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_load_si512(unit_dots[u & 1][0][i]),
																	  _mm512_set1_epi32(CAI_KV_KEY_DIGIT_BASE)),
												   _mm512_load_si512(unit_dots[u & 1][1][i]));

				if (scores)
					_mm512_store_si512(unit_dots[u & 1][0][i], dot);
				else
					_mm512_storeu_si512(dots + (size_t) (r + i) * BLOCK, dot);
			}
		/* the previous unit's scores: dot * (kscale[slot] * q_scale[r]), as the tile does */
		if (scores && prev_rows > 0)
		{
			const __m512 ks = _mm512_loadu_ps(kscale + (size_t) prev_block * BLOCK);
			float	   *dst = scores + (size_t) prev_block * BLOCK;

			for (int i = 0; i < prev_rows; i++)
				_mm512_storeu_ps(dst + (size_t) (prev_r + i) * ld_scores,
								 _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(unit_dots[(u - 1) & 1][0][i])),
											   _mm512_mul_ps(ks, _mm512_set1_ps(q_scale[prev_r + i]))));
		}
		prev_r = r;
		prev_rows = n * AMX_ROWS;
		prev_block = block;
	}
}
#undef AMX_STEP
#undef AMX_CHUNK_STEP

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

	if (strcmp(isa, "avx512-vnni") == 0 || strcmp(isa, "avx512-amx") == 0)
		return ATTN_AVX512;
	if (strcmp(isa, "avx2") == 0 || strcmp(isa, "avx-vnni") == 0)
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

#if defined(__x86_64__)
/*
 * ATTN_DEFINE_VEXP2's reduction and polynomial with the intrinsics of one vector width W (512
 * or 256): r and p from x and its rounded k.
 */
#define ATTN_EXP2_POLY_SIMD(W, x, k, r, p) \
	do { \
		r = _mm##W##_sub_ps(x, k); \
		p = _mm##W##_fmadd_ps(_mm##W##_set1_ps(CAI_ATTN_EXP2_C6), r, _mm##W##_set1_ps(CAI_ATTN_EXP2_C5)); \
		p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(CAI_ATTN_EXP2_C4)); \
		p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(CAI_ATTN_EXP2_C3)); \
		p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(CAI_ATTN_EXP2_C2)); \
		p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(CAI_ATTN_EXP2_C1)); \
		p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(1.0f)); \
	} while (0)

/*
 * partials_total in registers, from partial sums 0-7 (lo) and 8-15 (hi): pairs, then the tree's
 * halves ((0 + 4), (1 + 5), (2 + 6), (3 + 7)), then ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)).
 * (Through memory, the partials' stores would stall the loads that read them back.)
 */
__attribute__((target("avx"))) CAI_ALWAYS_INLINE float
partials_total_avx(__m256 lo, __m256 hi)
{
	__m256		pairs = _mm256_add_ps(lo, hi);
	__m128		quad = _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps(pairs, 1));
	__m128		two = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));

	return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

/*
 * The softmax's exponentials on AVX-512: row[i] = exp2(row[i] - m) for i < n, each added into
 * partial[i % 16] in order (the last vector's missing lanes are masked off: they add nothing).
 * The same bits as the attention's exp2, in fewer instructions: the low clamp is vmaxps (x > lo ?
 * x : lo is its definition, NaN included), and the high one is left out (x <= 0 < hi: it never
 * applies); the rounding to the nearest integer is vrndscaleps (it may give -0 where the
 * 1.5 * 2^23 trick gives +0, which changes no later bit); and 2^k multiplies by vscalefps (the
 * same correctly rounded product as p * 2^k for k in [-126, 127]).  Returns their total
 * (partials_total).
 */
TARGET_AVX512 CAI_ALWAYS_INLINE __m512
exp2_minus_max16(__m512 s, __m512 mv)
{
	__m512		x = _mm512_max_ps(_mm512_sub_ps(s, mv), _mm512_set1_ps(CAI_ATTN_EXP2_LO));
	__m512		k,
				r,
				p;

	k = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	ATTN_EXP2_POLY_SIMD(512, x, k, r, p);
	return _mm512_scalef_ps(p, k);
}

TARGET_AVX512 __attribute__((noinline)) static float
exp_minus_max_avx512(float *row, int n, float m)
{
	const __m512 mv = _mm512_set1_ps(m);
	__m512		acc = _mm512_setzero_ps();
	int			i = 0;

	for (; i + 16 <= n; i += 16)
	{
		__m512		e = exp2_minus_max16(_mm512_loadu_ps(row + i), mv);

		_mm512_storeu_ps(row + i, e);
		acc = _mm512_add_ps(acc, e);
	}
	if (i < n)
	{
		__mmask16	k = (__mmask16) ((1u << (n - i)) - 1);
		__m512		e = exp2_minus_max16(_mm512_maskz_loadu_ps(k, row + i), mv);

		_mm512_mask_storeu_ps(row + i, k, e);
		acc = _mm512_mask_add_ps(acc, k, acc, e);
	}
	return partials_total_avx(_mm512_castps512_ps256(acc),
							   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
}

/*
 * The same on AVX2, sixteen positions as two halves (partials 0-7 and 8-15), with
 * ATTN_DEFINE_VEXP2's steps: the low clamp as vmaxps, the high one left out (as above), the
 * rounder, the fused polynomial, and 2^k built in the exponent bits.
 */
TARGET_AVX2 CAI_ALWAYS_INLINE __m256
exp2_minus_max8(__m256 s, __m256 mv)
{
	const __m256 magic = _mm256_set1_ps(12582912.0f);
	__m256		x = _mm256_max_ps(_mm256_sub_ps(s, mv), _mm256_set1_ps(CAI_ATTN_EXP2_LO));
	__m256		k,
				r,
				p;
	__m256i		bits;

	k = _mm256_sub_ps(_mm256_add_ps(x, magic), magic);
	ATTN_EXP2_POLY_SIMD(256, x, k, r, p);
	bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(k), _mm256_set1_epi32(127)), 23);
	return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

/* Positions [i, i + 8) of the row that are below n: exponentials stored, and their sum into acc. */
TARGET_AVX2 CAI_ALWAYS_INLINE __m256
exp2_minus_max8_part(float *row, int i, int n, __m256 mv, __m256 acc)
{
	__m256i		in = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i),
										_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	__m256		e = exp2_minus_max8(_mm256_maskload_ps(row + i, in), mv);

	e = _mm256_and_ps(e, _mm256_castsi256_ps(in));
	_mm256_maskstore_ps(row + i, in, e);
	return _mm256_add_ps(acc, e);
}

TARGET_AVX2 __attribute__((noinline)) static float
exp_minus_max_avx2(float *row, int n, float m)
{
	const __m256 mv = _mm256_set1_ps(m);
	__m256		acc_lo = _mm256_setzero_ps(),
				acc_hi = _mm256_setzero_ps();
	int			i = 0;

	for (; i + 16 <= n; i += 16)
	{
		__m256		e_lo = exp2_minus_max8(_mm256_loadu_ps(row + i), mv);
		__m256		e_hi = exp2_minus_max8(_mm256_loadu_ps(row + i + 8), mv);

		_mm256_storeu_ps(row + i, e_lo);
		_mm256_storeu_ps(row + i + 8, e_hi);
		acc_lo = _mm256_add_ps(acc_lo, e_lo);
		acc_hi = _mm256_add_ps(acc_hi, e_hi);
	}
	if (i < n)
		acc_lo = exp2_minus_max8_part(row, i, n, mv, acc_lo);
	if (i + 8 < n)
		acc_hi = exp2_minus_max8_part(row, i + 8, n, mv, acc_hi);
	return partials_total_avx(acc_lo, acc_hi);
}
#endif

typedef int8_t cai_v16b __attribute__((vector_size(16)));

/*
 * Weights of n positions: q = round((p * vs) * qinv) to nearest, ties to even (adding and
 * subtracting 1.5 * 2^23 rounds so for 0 <= x < 2^22), split into the planes lo = q & 127 and
 * hi = q >> 7.
 */
#define WEIGHT_ROUNDER 12582912.0f
CAI_ALWAYS_INLINE void
quantize_weights(const float *p, const float *vs, int n, float qinv, uint8_t *lo, uint8_t *hi)
{
	int			i = 0;

	for (; i + 16 <= n; i += 16)
	{
		cai_v16f	x = (cai_v16f_load(p + i) * cai_v16f_load(vs + i)) * qinv;
		cai_v16i	qv = __builtin_convertvector((x + WEIGHT_ROUNDER) - WEIGHT_ROUNDER, cai_v16i);
		cai_v16b	l = __builtin_convertvector(qv & 127, cai_v16b);
		cai_v16b	h = __builtin_convertvector(qv >> 7, cai_v16b);

		memcpy(lo + i, &l, sizeof(l));
		memcpy(hi + i, &h, sizeof(h));
	}
	for (; i < n; i++)
	{
		float		x = (p[i] * vs[i]) * qinv;
		int32_t		qi = (int32_t) ((x + WEIGHT_ROUNDER) - WEIGHT_ROUNDER);

		lo[i] = (uint8_t) (qi & 127);
		hi[i] = (uint8_t) (qi >> 7);
	}
}

#if defined(__x86_64__)
/*
 * quantize_weights on AVX-512, the same integers: vcvtps2dq rounds to nearest even (as the
 * rounder does below 2^22), and 64 weights at a time become bytes by saturating packs (the
 * weights are at most 16383: nothing saturates) instead of one vpmovdb per sixteen per plane.
 * The packs interleave their sources per 128-bit lane; one dword permutation puts the bytes back
 * in position order.
 */
TARGET_AVX512 __attribute__((noinline)) static void
quantize_weights_avx512(const float *p, const float *vs, int n, float qinv, uint8_t *lo,
						uint8_t *hi)
{
	const __m512 qv = _mm512_set1_ps(qinv);
	const __m512i low7 = _mm512_set1_epi16(127);
	const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
	int			i = 0;

#define WEIGHTS16(k) \
	_mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(p + i + 16 * (k)), \
														 _mm512_loadu_ps(vs + i + 16 * (k))), qv), \
							 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
	for (; i + 64 <= n; i += 64)
	{
		__m512i		a = _mm512_packus_epi32(WEIGHTS16(0), WEIGHTS16(1));
		__m512i		b = _mm512_packus_epi32(WEIGHTS16(2), WEIGHTS16(3));
		__m512i		l = _mm512_packus_epi16(_mm512_and_si512(a, low7), _mm512_and_si512(b, low7));
		__m512i		h = _mm512_packus_epi16(_mm512_srli_epi16(a, 7), _mm512_srli_epi16(b, 7));

		_mm512_storeu_si512(lo + i, _mm512_permutexvar_epi32(order, l));
		_mm512_storeu_si512(hi + i, _mm512_permutexvar_epi32(order, h));
	}
	for (; i + 16 <= n; i += 16)
	{
		__m512i		q = WEIGHTS16(0);

		_mm_storeu_si128((__m128i *) (lo + i), _mm512_cvtepi32_epi8(_mm512_and_si512(q, _mm512_set1_epi32(127))));
		_mm_storeu_si128((__m128i *) (hi + i), _mm512_cvtepi32_epi8(_mm512_srli_epi32(q, 7)));
	}
#undef WEIGHTS16
	quantize_weights(p + i, vs + i, n - i, qinv, lo + i, hi + i);
}

/*
 * The same on AVX2, 32 weights per step: vroundps to nearest even, then the packs and a dword
 * permutation as above.
 */
TARGET_AVX2 __attribute__((noinline)) static void
quantize_weights_avx2(const float *p, const float *vs, int n, float qinv, uint8_t *lo,
					  uint8_t *hi)
{
	const __m256 qv = _mm256_set1_ps(qinv);
	const __m256i low7 = _mm256_set1_epi16(127);
	const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
	int			i = 0;

#define WEIGHTS8(k) \
	_mm256_cvttps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(p + i + 8 * (k)), \
																	 _mm256_loadu_ps(vs + i + 8 * (k))), qv), \
										_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
	for (; i + 32 <= n; i += 32)
	{
		__m256i		a = _mm256_packus_epi32(WEIGHTS8(0), WEIGHTS8(1));
		__m256i		b = _mm256_packus_epi32(WEIGHTS8(2), WEIGHTS8(3));
		__m256i		l = _mm256_packus_epi16(_mm256_and_si256(a, low7), _mm256_and_si256(b, low7));
		__m256i		h = _mm256_packus_epi16(_mm256_srli_epi16(a, 7), _mm256_srli_epi16(b, 7));

		_mm256_storeu_si256((__m256i *) (lo + i), _mm256_permutevar8x32_epi32(l, order));
		_mm256_storeu_si256((__m256i *) (hi + i), _mm256_permutevar8x32_epi32(h, order));
	}
#undef WEIGHTS8
	quantize_weights(p + i, vs + i, n - i, qinv, lo + i, hi + i);
}

/*
 * The maximum of row[0..n) on AVX2: vmaxps is a > b ? a : b, as cai_v16f_max, which GCC builds
 * from compares and logic on AVX2; exact in any order for the finite scores a row holds.
 */
TARGET_AVX2 __attribute__((noinline)) static float
row_max_avx2(const float *row, int n)
{
	__m256		m0 = _mm256_set1_ps(row[0]),
				m1 = m0,
				m2 = m0,
				m3 = m0;
	float		m;
	int			i = 0;

	for (; i + 32 <= n; i += 32)
	{
		m0 = _mm256_max_ps(m0, _mm256_loadu_ps(row + i));
		m1 = _mm256_max_ps(m1, _mm256_loadu_ps(row + i + 8));
		m2 = _mm256_max_ps(m2, _mm256_loadu_ps(row + i + 16));
		m3 = _mm256_max_ps(m3, _mm256_loadu_ps(row + i + 24));
	}
	for (; i + 8 <= n; i += 8)
		m0 = _mm256_max_ps(m0, _mm256_loadu_ps(row + i));
	m0 = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
	m0 = _mm256_max_ps(m0, _mm256_permute2f128_ps(m0, m0, 1));
	m0 = _mm256_max_ps(m0, _mm256_permute_ps(m0, 0x4E));
	m0 = _mm256_max_ps(m0, _mm256_permute_ps(m0, 0xB1));
	m = _mm256_cvtss_f32(m0);
	for (; i < n; i++)
		m = row[i] > m ? row[i] : m;
	return m;
}
#endif

/* Where an int8 row's exponentials go on to (softmax_row): its weights' planes. */
typedef struct row_weights
{
	const float *vs;			/* the value scales of the row's positions */
	float		qinv;			/* 16383 / vmax */
	uint8_t    *lo;				/* the planes, from the row's first position */
	uint8_t    *hi;
} row_weights;

/*
 * The maximum of row[0..n): exact in any order for the finite scores a row holds (the GPU
 * reduces it as a tree), so four independent sixteen-lane chains, then the lanes, then the rest.
 */
CAI_ALWAYS_INLINE float
row_max(const float *row, int n, attn_isa isa)
{
	float		m = row[0];
	int			i = 0;

#if defined(__x86_64__)
	if (isa == ATTN_AVX2)
		return row_max_avx2(row, n);
#endif
	if (n >= 64)
	{
		cai_v16f	m0 = cai_v16f_load(row),
					m1 = cai_v16f_load(row + 16),
					m2 = cai_v16f_load(row + 32),
					m3 = cai_v16f_load(row + 48);

		for (i = 64; i + 64 <= n; i += 64)
		{
			m0 = cai_v16f_max(m0, cai_v16f_load(row + i));
			m1 = cai_v16f_max(m1, cai_v16f_load(row + i + 16));
			m2 = cai_v16f_max(m2, cai_v16f_load(row + i + 32));
			m3 = cai_v16f_max(m3, cai_v16f_load(row + i + 48));
		}
		for (; i + 16 <= n; i += 16)
			m0 = cai_v16f_max(m0, cai_v16f_load(row + i));
		m0 = cai_v16f_max(cai_v16f_max(m0, m1), cai_v16f_max(m2, m3));
		/* the lanes by halves: four shuffles, not sixteen scalar compares */
		m0 = cai_v16f_max(m0, __builtin_shufflevector(m0, m0, 8, 9, 10, 11, 12, 13, 14, 15,
													  0, 1, 2, 3, 4, 5, 6, 7));
		m0 = cai_v16f_max(m0, __builtin_shufflevector(m0, m0, 4, 5, 6, 7, 0, 1, 2, 3,
													  12, 13, 14, 15, 8, 9, 10, 11));
		m0 = cai_v16f_max(m0, __builtin_shufflevector(m0, m0, 2, 3, 0, 1, 6, 7, 4, 5,
													  10, 11, 8, 9, 14, 15, 12, 13));
		m0 = cai_v16f_max(m0, __builtin_shufflevector(m0, m0, 1, 0, 3, 2, 5, 4, 7, 6,
													  9, 8, 11, 10, 13, 12, 15, 14));
		m = m0[0] > m ? m0[0] : m;
	}
	for (; i < n; i++)
		m = row[i] > m ? row[i] : m;
	return m;
}

/*
 * The exponentials' total (attention.h): partial sums p[0..16) of positions i % 16, pairs
 * p[i] + p[i + 8], then ops.h's tree of eight.
 */
CAI_ALWAYS_INLINE float
partials_total(const float *p)
{
	cai_v8f		s = cai_v8f_load(p) + cai_v8f_load(p + 8);

	return cai_v8f_sum(&s);
}

/*
 * In place: row[0..n) = softmax(row[0..n)) given its maximum m (row_max); *total_out gets the
 * exponentials' total (partials_total).  With weights (the int8 path) the row is not
 * normalized: it keeps the exponentials, and they become the quantized weights
 * (quantize_weights; a pass of its own runs faster than one fused into the exponentials').
 */
CAI_ALWAYS_INLINE void
softmax_row(float *row, int n, float m, float *total_out, const row_weights *w, attn_isa isa)
{
	float		inv;
	int			i;

#if defined(__x86_64__)
	if (isa == ATTN_AVX512)
		*total_out = exp_minus_max_avx512(row, n, m);
	else if (isa == ATTN_AVX2)
		*total_out = exp_minus_max_avx2(row, n, m);
	else
#endif
	{
		float		partial[16];
		cai_v16f	acc = {0};

		for (i = 0; i + 16 <= n; i += 16)
		{
			cai_v16f	d = cai_v16f_load(row + i) - m;	/* (vector - scalar: a plain broadcast) */
			cai_v16f	e = attn_exp2_16(&d);

			cai_v16f_store(row + i, e);
			acc = acc + e;
		}
		if (i < n)
		{
			const cai_v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
			float		buf[16] = {0};
			cai_v16f	d,
						e;

			memcpy(buf, row + i, (size_t) (n - i) * sizeof(float));
			d = cai_v16f_load(buf) - m;
			e = attn_exp2_16(&d);
			/* lanes past n add nothing */
			e = (cai_v16f) ((cai_v16i) e & (lane < n - i));
			cai_v16f_store(buf, e);
			memcpy(row + i, buf, (size_t) (n - i) * sizeof(float));
			acc = acc + e;
		}
		cai_v16f_store(partial, acc);
		*total_out = partials_total(partial);
	}
	if (w)
	{
#if defined(__x86_64__)
		if (isa == ATTN_AVX512)
			quantize_weights_avx512(row, w->vs, n, w->qinv, w->lo, w->hi);
		else if (isa == ATTN_AVX2)
			quantize_weights_avx2(row, w->vs, n, w->qinv, w->lo, w->hi);
		else
#endif
			quantize_weights(row, w->vs, n, w->qinv, w->lo, w->hi);
		return;
	}
	inv = 1.0f / *total_out;
	for (i = 0; i + 16 <= n; i += 16)
		cai_v16f_store(row + i, cai_v16f_load(row + i) * inv);
	for (; i < n; i++)
		row[i] = row[i] * inv;
}

/* The attention's exp2 of one value (the same bits as in any lane of a vector). */
float
cai_attention_exp2(float x)
{
	cai_v8f		d = cai_v8f_set1(x);
	cai_v8f		e = attn_exp2_8(&d);

	return e[0];
}

/*
 * The weights with which a segment's normalized value sums o (total l) fold into a row's
 * running output (total *L): out = wa * out + wb * o (attention.h's merge), given ea = exp(M - M')
 * and eb = exp(m - M') for the row's running maximum M, the segment's m and their maximum M'.
 * *L becomes the merged total.
 */
CAI_ALWAYS_INLINE void
fold_weights(float *L, float ea, float eb, float l, float *wa, float *wb)
{
	float		a = ea * *L;
	float		b = eb * l;
	float		Ln = a + b;

	*wa = a / Ln;
	*wb = b / Ln;
	*L = Ln;
}

/* Folds a segment's value sums o into a row's output with fold_weights' weights. */
CAI_ALWAYS_INLINE void
fold_row(float *out, const float *o, float wa, float wb, int hd)
{
	for (int d = 0; d < hd; d++)
		out[d] = wa * out[d] + wb * o[d];
}

/* The pointer to row r's output (tile rows are token-major: r = token * group + head). */
CAI_ALWAYS_INLINE float *
row_out(float *out, int ldo, int t0, int kv_head, int group, int hd, int r)
{
	return out + (size_t) (t0 + r / group) * ldo + (size_t) (kv_head * group + r % group) * hd;
}

/* Where a tile's rows leave their outputs: rows [t0, ..) of out, query heads of kv_head. */
typedef struct tile_out
{
	float	   *out;
	int			ldo;
	int			t0;
	int			kv_head;
	int			group;
} tile_out;

/*
 * A tile's running merge state, in s->fold: each row's running maximum and total, and the
 * current segment's maximum-to-be and fold weights (rows + 8 floats apart, whole vectors).
 */
typedef struct fold_state
{
	float	   *run_m;
	float	   *run_l;
	float	   *new_m;
	float	   *ea;
	float	   *eb;
	float	   *wa;
	float	   *wb;
} fold_state;

CAI_ALWAYS_INLINE fold_state
fold_state_of(const cai_attn_scratch *s, int rows)
{
	int			stride = (rows + 7) / 8 * 8;
	fold_state	f = {.run_m = s->fold};

	f.run_l = f.run_m + stride;
	f.new_m = f.run_l + stride;
	f.ea = f.new_m + stride;
	f.eb = f.ea + stride;
	f.wa = f.eb + stride;
	f.wb = f.wa + stride;
	return f;
}

/* Whether row r meets segment sg = [seg_lo, seg_hi], and whether it is the row's first. */
CAI_ALWAYS_INLINE bool
row_meets(const cai_attn_scratch *s, int r, int seg_lo, int seg_hi)
{
	return s->row_lo[r] <= seg_hi && s->row_hi[r] >= seg_lo;
}

CAI_ALWAYS_INLINE bool
row_starts(const cai_attn_scratch *s, int r, int sg)
{
	return sg == s->row_lo[r] / CAI_ATTN_SEGMENT_TOKENS;
}

/*
 * The rows' merge state at segment sg, from its maxima and totals (s->seg_m, s->seg_l): a row's
 * first segment starts its running maximum and total; at a later one the row gets fold_weights'
 * weights, the exponentials of all the rows at once (the attention's exp is lane-wise).
 */
CAI_ALWAYS_INLINE void
segment_fold_state(const cai_attn_scratch *s, int rows, int sg, int seg_lo, int seg_hi)
{
	fold_state	f = fold_state_of(s, rows);
	int			stride = (rows + 7) / 8 * 8;

	for (int r = 0; r < stride; r++)
	{
		float		m = r < rows ? s->seg_m[r] : 0.0f;

		f.ea[r] = f.eb[r] = 0.0f;
		if (r >= rows || !row_meets(s, r, seg_lo, seg_hi))
			continue;
		if (row_starts(s, r, sg))
		{
			f.run_m[r] = m;
			f.run_l[r] = s->seg_l[r];
			continue;
		}
		f.new_m[r] = m > f.run_m[r] ? m : f.run_m[r];
		f.ea[r] = f.run_m[r] - f.new_m[r];
		f.eb[r] = m - f.new_m[r];
	}
	for (int r = 0; r < stride; r += 8)
	{
		cai_v8f		xa = cai_v8f_load(f.ea + r);
		cai_v8f		xb = cai_v8f_load(f.eb + r);

		cai_v8f_store(f.ea + r, attn_exp2_8(&xa));
		cai_v8f_store(f.eb + r, attn_exp2_8(&xb));
	}
	for (int r = 0; r < rows; r++)
	{
		if (!row_meets(s, r, seg_lo, seg_hi) || row_starts(s, r, sg))
			continue;
		fold_weights(&f.run_l[r], f.ea[r], f.eb[r], s->seg_l[r], &f.wa[r], &f.wb[r]);
		f.run_m[r] = f.new_m[r];
	}
}

/*
 * Float reference path: for each of NR rows i, o[i][0..HD) += p[i][slot + p_off] *
 * values[slot][..] for slots a..e of a block, in slot order (the value scale is 1).  The rows share their range (the
 * query heads of one token), so each value row is loaded once for all of them and the
 * NR * HD/16 accumulators are independent chains; NR and HD are compile-time constants (the
 * accumulators stay in registers).  Each row gets exactly the operations it would get alone.
 */
CAI_ALWAYS_INLINE void
accumulate_values_rows(float *const *o, const float *const *p, int p_off, const float *values,
					   int a, int e, int NR, int HD)
{
	cai_v16f	acc[4][8];

	for (int r = 0; r < NR; r++)
		for (int i = 0; i < HD / 16; i++)
			memcpy(&acc[r][i], o[r] + 16 * i, sizeof(cai_v16f));
	for (int j = a; j <= e; j++)
	{
		cai_v16f	v[8];

		for (int i = 0; i < HD / 16; i++)
			memcpy(&v[i], values + (size_t) j * HD + 16 * i, sizeof(cai_v16f));
		for (int r = 0; r < NR; r++)
		{
			float		c = p[r][j + p_off];
			cai_v16f	cv = {c, c, c, c, c, c, c, c, c, c, c, c, c, c, c, c};

			for (int i = 0; i < HD / 16; i++)
				acc[r][i] = acc[r][i] + cv * v[i];
		}
	}
	for (int r = 0; r < NR; r++)
		for (int i = 0; i < HD / 16; i++)
			memcpy(o[r] + 16 * i, &acc[r][i], sizeof(cai_v16f));
}

/* The same for any head size (a multiple of 8), one row at a time. */
CAI_ALWAYS_INLINE void
accumulate_values_any(float *o, const float *p, int p_off, const float *values, int a, int e,
					  int hd)
{
	for (int j = a; j <= e; j++)
	{
		cai_v8f		c = cai_v8f_set1(p[j + p_off]);
		const float *vr = values + (size_t) j * hd;

		for (int d = 0; d < hd; d += 8)
			cai_v8f_store(o + d, cai_v8f_load(o + d) + c * cai_v8f_load(vr + d));
	}
}

/*
 * Float rows sharing a range: up to 4 rows of head size 64, 2 of 128 in one pass, other sizes a
 * row at a time.
 */
CAI_ALWAYS_INLINE void
accumulate_values(float *const *o, const float *const *p, int nr, int p_off,
				  const float *values, int a, int e, int hd)
{
	int			r = 0;

#define ROWS_CASE(N, HD) \
	case N: \
		accumulate_values_rows(o + r, p + r, p_off, values, a, e, N, HD); \
		break
	if (hd == 64)
		for (; r < nr; r += 4)
			switch (nr - r < 4 ? nr - r : 4)
			{
				ROWS_CASE(4, 64); ROWS_CASE(3, 64); ROWS_CASE(2, 64); ROWS_CASE(1, 64);
			}
	else if (hd == 128)
		for (; r < nr; r += 2)
			switch (nr - r < 2 ? nr - r : 2)
			{
				ROWS_CASE(2, 128); ROWS_CASE(1, 128);
			}
#undef ROWS_CASE
	for (; r < nr; r++)
		accumulate_values_any(o[r], p[r], p_off, values, a, e, hd);
}

/*
 * The float reference path's value pass of segment [seg_lo, seg_hi]: positions in ascending
 * order, one multiply and one add each, over the shadow KV's float values, into s->seg_o from
 * the rows' probabilities in s->scores.
 */
CAI_ALWAYS_INLINE void
value_pass_f32(const cai_attn_params *ap, const cai_kv_shadow *shadow, const int32_t *table,
			   cai_attn_scratch *s, int kv_head, int n_tok, int group, int seg_lo, int seg_hi)
{
	const int	hd = ap->head_dim;
	const int	n_kv = ap->n_kv_heads;

	memset(s->seg_o, 0, (size_t) n_tok * group * hd * sizeof(float));
	for (int b = seg_lo / BLOCK; b <= seg_hi / BLOCK; b++)
	{
		int			base = b * BLOCK;
		int			j0 = base > seg_lo ? base : seg_lo;
		int			j1 = base + BLOCK - 1 < seg_hi ? base + BLOCK - 1 : seg_hi;
		const float *vf = shadow->data + (size_t) table[b] * shadow->block_floats
			+ (size_t) ap->kv_layer * shadow->layer_floats + (size_t) BLOCK * n_kv * hd;

		for (int j = j0; j <= j1; j++)
		{
			int			slot = j - base;

			memcpy(s->values + (size_t) slot * hd, vf + ((size_t) slot * n_kv + kv_head) * hd,
				   (size_t) hd * sizeof(float));
		}

		/* the query heads of a token share its range: their rows go together */
		for (int ti = 0; ti < n_tok; ti++)
		{
			int			r0 = ti * group;
			int			a = j0 > s->row_lo[r0] ? j0 : s->row_lo[r0];
			int			e = j1 < s->row_hi[r0] ? j1 : s->row_hi[r0];

			if (a > e)
				continue;
			for (int g0 = 0; g0 < group; g0 += MAX_GROUP_ROWS)
			{
				int			nr = group - g0 < MAX_GROUP_ROWS ? group - g0 : MAX_GROUP_ROWS;
				float	   *o[MAX_GROUP_ROWS];
				const float *p[MAX_GROUP_ROWS];

				for (int i = 0; i < nr; i++)
				{
					o[i] = s->seg_o + (size_t) (r0 + g0 + i) * hd;
					p[i] = s->scores + (size_t) (r0 + g0 + i) * SCORES_LD;
				}
				accumulate_values(o, p, nr, base - seg_lo, s->values, a - base, e - base, hd);
			}
		}
	}
}

/* ---------------------------------------------------------------------------------------------
 * The int8 value pass (attention.h): weights quantized to 14 bits, exact integer sums
 * ------------------------------------------------------------------------------------------- */

/*
 * A shared tile's tokens and their own blocks: the rows of token i (batch row tokens[i]),
 * [i * part_rows, (i + 1) * part_rows), read their own sequence's table tables[i] from position
 * `from` (block-aligned) on.
 */
typedef struct own_blocks
{
	const int  *tokens;
	const int32_t *const *tables;
	int			n_parts;
	int			part_rows;
	int			from;
} own_blocks;

/*
 * The own blocks' share of segment [seg_lo, seg_hi]'s value sums, which hold the shared
 * positions' (below own->from) when this runs: for each token, its rows' weight planes from
 * own->from (copied, zero past their positions to whole 64-position steps, as every value-sum
 * kernel may read), its own values packed, their exact sums added to s->v_sums.  AMX takes rows
 * sixteen at a time; a token's few rows take the AVX-512 kernel there, the same integers.
 */
CAI_ALWAYS_INLINE void
own_value_sums(const cai_attn_params *ap, cai_kv_pool *kv, const own_blocks *own,
			   cai_attn_scratch *s, int kv_head, int seg_base, int seg_hi, int n_pad,
			   attn_value_path path)
{
	const cai_kv_layout *L = cai_kv_pool_layout(kv);
	const int	hd = ap->head_dim;
	const int	SEG = CAI_ATTN_SEGMENT_TOKENS;
	const int	skip = own->from - seg_base;	/* the planes' bytes before the own blocks */
	const attn_value_path own_path = path == ATTN_VALUES_AMX ? ATTN_VALUES_AVX512 : path;
	const int8_t *blocks[CAI_ATTN_SEGMENT_TOKENS / BLOCK];
	int			quads[TILE_ROWS];

	for (int p = 0; p < own->n_parts; p++)
	{
		int			r0 = p * own->part_rows;
		int			e = s->row_hi[r0] < seg_hi ? s->row_hi[r0] : seg_hi;
		int			n_blocks = e / BLOCK - own->from / BLOCK + 1;
		int			n_quads = ((e - own->from) / 4 + 1 + 15) / 16 * 16;
		int			kept = (n_pad < SEG ? n_pad : SEG) - skip;

		if (e < own->from)
			continue;
		for (int b = 0; b < n_blocks; b++)
			blocks[b] = cai_kv_values(L, cai_kv_block_layer(kv, own->tables[p][own->from / BLOCK + b],
														  ap->kv_layer)) + (size_t) kv_head * hd;
		attn_pack_values(own_path, blocks, n_blocks, (size_t) ap->n_kv_heads * hd, hd, n_quads,
						 s->v_quads);
		for (int i = 0; i < own->part_rows; i++)
		{
			int			r = r0 + i;
			uint8_t    *lo = s->own_w_lo + (size_t) i * SEG;
			uint8_t    *hi = s->own_w_hi + (size_t) i * SEG;
			int			n = 4 * n_quads < kept ? 4 * n_quads : kept;

			memcpy(lo, s->w_lo + (size_t) r * SEG + skip, (size_t) n);
			memcpy(hi, s->w_hi + (size_t) r * SEG + skip, (size_t) n);
			memset(lo + n, 0, (size_t) (4 * n_quads - n));
			memset(hi + n, 0, (size_t) (4 * n_quads - n));
			quads[i] = s->row_quads[r] - skip / 4;
		}
		attn_value_sums(own_path, s->own_w_lo, s->own_w_hi, SEG, s->v_quads, hd, own->part_rows,
						quads, s->own_sums);
		for (int i = 0; i < own->part_rows; i++)
		{
			int32_t    *sums = s->v_sums + (size_t) (r0 + i) * 2 * hd;
			const int32_t *add = s->own_sums + (size_t) i * 2 * hd;

			for (int d = 0; d < 2 * hd; d++)
				sums[d] += add[d];
		}
	}
}

/*
 * The int8 path's softmax and value pass of segment [seg_lo, seg_hi] for the tile's rows, their
 * scores in s->scores (positions from seg_lo): each row's maximum and total into s->seg_m and
 * s->seg_l, its normalized value sums into s->seg_o.  Positions are counted from the
 * block-aligned seg_base, so that groups of four never straddle a block; rows_w >= rows rows
 * get weight planes (AMX tiles take 16 at a time).
 */
CAI_ALWAYS_INLINE void
softmax_values_i8(const cai_attn_params *ap, cai_kv_pool *kv, const int32_t *table,
				  const own_blocks *own, cai_attn_scratch *s, int kv_head, int rows, int rows_w,
				  int sg, int seg_lo, int seg_hi, const tile_out *dst, attn_value_path path,
				  attn_isa isa)
{
	row_weights w;
	const cai_kv_layout *L = cai_kv_pool_layout(kv);
	const int	hd = ap->head_dim;
	const int	n_kv = ap->n_kv_heads;
	const int	SEG = CAI_ATTN_SEGMENT_TOKENS;
	const int	seg_base = seg_lo / BLOCK * BLOCK;
	const int	n_pad = (seg_hi - seg_base + 64) / 64 * 64;	/* whole AMX steps */
	/* a shared tile's segment where its tokens' own blocks begin: the table's blocks before */
	const bool	mixed = own && own->from <= seg_hi;
	const int	shared_hi = mixed ? own->from - 1 : seg_hi;
	const int	n_blocks = shared_hi / BLOCK - seg_base / BLOCK + 1;
	const int8_t *blocks[CAI_ATTN_SEGMENT_TOKENS / BLOCK];
	int			shared_quads[TILE_ROWS + AMX_ROWS];

	/* the segment's value rows and scales of the head */
	for (int b = 0; b < n_blocks; b++)
	{
		int			base = seg_base + b * BLOCK;
		int			j0 = base > seg_lo ? base : seg_lo;
		int			j1 = base + BLOCK - 1 < shared_hi ? base + BLOCK - 1 : shared_hi;
		uint8_t    *part = cai_kv_block_layer(kv, table[base / BLOCK], ap->kv_layer);
		const float *vs = cai_kv_value_scales(L, part);

		blocks[b] = cai_kv_values(L, part) + (size_t) kv_head * hd;
		for (int j = j0; j <= j1; j++)
			s->v_scales[j - seg_base] = vs[(j - base) * n_kv + kv_head];
	}
	/*
	 * their running maximum from seg_lo: a row that starts there (most do) reads its vmax (kept
	 * in a register: through memory, each step would wait for the previous one's store)
	 */
	{
		float		run = s->v_scales[seg_lo - seg_base];

		for (int j = seg_lo; j <= shared_hi; j++)
		{
			float		v = s->v_scales[j - seg_base];

			run = run > v ? run : v;
			s->v_scale_max[j - seg_base] = run;
		}
	}

	/*
	 * each row's softmax and weights over its range, weights zero elsewhere up to n_pad; the
	 * maxima of a group of rows first, so that their short dependent chains overlap
	 */
	for (int r0 = 0; r0 < rows_w; r0 += MAX_GROUP_ROWS)
	{
		int			r1 = r0 + MAX_GROUP_ROWS < rows_w ? r0 + MAX_GROUP_ROWS : rows_w;

		for (int r = r0; r < r1 && r < rows; r++)
		{
			int			a = s->row_lo[r] > seg_lo ? s->row_lo[r] : seg_lo;
			int			e = s->row_hi[r] < seg_hi ? s->row_hi[r] : seg_hi;

			if (a <= e)
				s->seg_m[r] = row_max(s->scores + (size_t) r * SCORES_LD + (a - seg_lo), e - a + 1, isa);
		}
		for (int r = r0; r < r1; r++)
		{
			uint8_t    *lo = s->w_lo + (size_t) r * SEG;
			uint8_t    *hi = s->w_hi + (size_t) r * SEG;
			int			a = r < rows && s->row_lo[r] > seg_lo ? s->row_lo[r] : seg_lo;
			int			e = r < rows && s->row_hi[r] < seg_hi ? s->row_hi[r] : seg_hi;
			float		vmax,
						qinv;

			if (r >= rows || a > e)
			{
				memset(lo, 0, (size_t) n_pad);
				memset(hi, 0, (size_t) n_pad);
				s->row_quads[r] = 0;
				continue;
			}
			w.vs = s->v_scales + (a - seg_base);
			if (mixed)
			{
				/*
				 * the row's scales in a row: the shared ones, then its token's own (gathered
				 * once per token); the largest of them all, as the row alone takes it
				 */
				if (r % own->part_rows == 0)
				{
					const int32_t *t = own->tables[r / own->part_rows];

					memcpy(s->own_vs, s->v_scales + (a - seg_base),
						   (size_t) (own->from - a) * sizeof(float));
					for (int j = own->from; j <= e; j++)
						s->own_vs[j - a] = cai_kv_value_scales(L, cai_kv_block_layer(kv, t[j / BLOCK],
																				  ap->kv_layer))
							[(j % BLOCK) * n_kv + kv_head];
				}
				vmax = 0.0f;
				for (int j = a; j <= e; j++)
					vmax = s->own_vs[j - a] > vmax ? s->own_vs[j - a] : vmax;
				w.vs = s->own_vs;
			}
			else if (a == seg_lo)
				vmax = s->v_scale_max[e - seg_base];
			else
			{
				vmax = 0.0f;
				for (int j = a; j <= e; j++)
					vmax = s->v_scales[j - seg_base] > vmax ? s->v_scales[j - seg_base] : vmax;
			}
			qinv = vmax >= CAI_ATTN_VSCALE_MIN ? (float) CAI_ATTN_WEIGHT_MAX / vmax : 0.0f;
			/* (most rows cover the whole segment: no call for nothing to clear) */
			if (a > seg_base)
			{
				memset(lo, 0, (size_t) (a - seg_base));
				memset(hi, 0, (size_t) (a - seg_base));
			}
			if (e - seg_base + 1 < n_pad)
			{
				memset(lo + (e - seg_base + 1), 0, (size_t) (n_pad - (e - seg_base + 1)));
				memset(hi + (e - seg_base + 1), 0, (size_t) (n_pad - (e - seg_base + 1)));
			}
			w.qinv = qinv;
			w.lo = lo + (a - seg_base);
			w.hi = hi + (a - seg_base);
			softmax_row(s->scores + (size_t) r * SCORES_LD + (a - seg_lo), e - a + 1, s->seg_m[r],
						&s->seg_l[r], &w, isa);
			s->row_quads[r] = (e - seg_base) / 4 + 1;
			s->row_g[r] = (vmax / (float) CAI_ATTN_WEIGHT_MAX) / s->seg_l[r];
		}
	}

	if (dst)
		segment_fold_state(s, rows, sg, seg_lo, seg_hi);
	attn_pack_values(path, blocks, n_blocks, (size_t) n_kv * hd, hd, n_pad / 4, s->v_quads);
	if (!mixed)
		attn_value_sums(path, s->w_lo, s->w_hi, SEG, s->v_quads, hd,
						path == ATTN_VALUES_AMX ? rows_w : rows, s->row_quads, s->v_sums);
	else
	{
		/* the shared blocks' sums (their packing is zero past them), then each token's own */
		int			n_rows = path == ATTN_VALUES_AMX ? rows_w : rows;

		for (int r = 0; r < n_rows; r++)
			shared_quads[r] = s->row_quads[r] < (own->from - seg_base) / 4 ?
				s->row_quads[r] : (own->from - seg_base) / 4;
		attn_value_sums(path, s->w_lo, s->w_hi, SEG, s->v_quads, hd, n_rows, shared_quads,
						s->v_sums);
		own_value_sums(ap, kv, own, s, kv_head, seg_base, seg_hi, n_pad, path);
	}

	/*
	 * o = (float) (128 * hi sum + lo sum) * g: into s->seg_o, or straight into the row's output
	 * (its first segment) or folded into it, the same operations as fold_row on s->seg_o
	 */
	{
		fold_state	f = fold_state_of(s, rows);

		for (int r = 0; r < rows; r++)
		{
			const int32_t *sums = s->v_sums + (size_t) r * 2 * hd;
			float	   *o = dst ? row_out(dst->out, dst->ldo, dst->t0, dst->kv_head, dst->group, hd, r)
				: s->seg_o + (size_t) r * hd;
			bool		fold = dst && !row_starts(s, r, sg);
			float		g = s->row_g[r];
			float		wa = fold ? f.wa[r] : 0.0f;
			float		wb = fold ? f.wb[r] : 0.0f;
			int			d = 0;

			if (s->row_quads[r] == 0)
				continue;
			for (; d + 16 <= hd; d += 16)
			{
				cai_v16i	sl,
							sh;
				cai_v16f	od;

				memcpy(&sl, sums + d, sizeof(sl));
				memcpy(&sh, sums + hd + d, sizeof(sh));
				od = __builtin_convertvector(sh * 128 + sl, cai_v16f) * g;
				if (fold)
					od = wa * cai_v16f_load(o + d) + wb * od;
				cai_v16f_store(o + d, od);
			}
			for (; d < hd; d++)
			{
				float		od = (float) (sums[hd + d] * 128 + sums[d]) * g;

				o[d] = fold ? wa * o[d] + wb * od : od;
			}
		}
	}
}

/* Prefetches one head's 16 rows of a block's keys or values (rows n_kv * hd bytes apart). */
CAI_ALWAYS_INLINE void
prefetch_head_rows(const int8_t *rows, int n_kv, int hd)
{
	for (int slot = 0; slot < BLOCK; slot++)
		for (int off = 0; off < hd; off += 64)
			__builtin_prefetch(rows + (size_t) slot * n_kv * hd + off, 0, 2);
}

/* Prefetches a block's 16 x n_kv key or value scales. */
CAI_ALWAYS_INLINE void
prefetch_scales(const float *scales, int n_kv)
{
	for (size_t off = 0; off < (size_t) BLOCK * n_kv * sizeof(float); off += 64)
		__builtin_prefetch((const char *) scales + off, 0, 2);
}

/* The start of a tile's work: its first block's keys and key scales. */
CAI_ALWAYS_INLINE void
prefetch_tile_start(const cai_attn_params *ap, const cai_batch_layout *batch, int seq,
					int kv_head, int t0, cai_kv_pool *kv)
{
	const cai_kv_layout *L = cai_kv_pool_layout(kv);
	int			pos0 = batch->token_pos[t0];
	int			lo0 = ap->window > 0 && pos0 - ap->window + 1 > 0 ? pos0 - ap->window + 1 : 0;
	uint8_t    *first = cai_kv_block_layer(kv, batch->block_tables[seq][lo0 / BLOCK], ap->kv_layer);

	prefetch_head_rows(cai_kv_keys(L, first) + (size_t) kv_head * ap->head_dim, ap->n_kv_heads,
					   ap->head_dim);
	prefetch_scales(cai_kv_key_scales(L, first), ap->n_kv_heads);
}

#if defined(__x86_64__)
/*
 * cai_op_quantize_vec_i8 of a query (n a multiple of 16) on AVX-512, the same bits for finite
 * x (a NaN may land in another lane's maximum, as it may on the GPU): the largest |x| (exact in
 * any order), scale = amax / 127, q = x * (127 / amax) clamped to +-127 by vmaxps and
 * vminps (the comparisons cai_v8f_max and cai_v8f_min make) and rounded to nearest even by
 * vcvtps2dq (as the 1.5 * 2^23 trick does), and the sum of the q.  The portable version, built
 * for AVX2, takes about three times as long on the 64 floats of a head.
 */
TARGET_AVX512 __attribute__((noinline)) static void
quantize_query_avx512(const float *x, int n, int8_t *q, float *scale, int32_t *sum)
{
	__m512		vmax = _mm512_setzero_ps();
	__m512		inv;
	__m512i		acc = _mm512_setzero_si512();
	float		amax;

	for (int i = 0; i < n; i += 16)
		vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
	amax = _mm512_reduce_max_ps(vmax);
	if (!(amax > 0.0f) || isinf(127.0f / amax))
	{
		*scale = 0.0f;
		*sum = 0;
		memset(q, 0, (size_t) n);
		return;
	}
	*scale = amax / 127.0f;
	inv = _mm512_set1_ps(127.0f / amax);
	for (int i = 0; i < n; i += 16)
	{
		__m512		v = _mm512_mul_ps(_mm512_loadu_ps(x + i), inv);
		__m512i		qi;

		v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
		qi = _mm512_cvtps_epi32(v);
		_mm_storeu_si128((__m128i *) (q + i), _mm512_cvtepi32_epi8(qi));
		acc = _mm512_add_epi32(acc, qi);
	}
	*sum = _mm512_reduce_add_epi32(acc);
}
#endif

/* A query row quantized to int8 (cai_op_quantize_vec_i8's rule), with its scale and the sum of its q. */
CAI_ALWAYS_INLINE void
quantize_query(const float *x, int hd, int8_t *q, float *scale, int32_t *sum, attn_isa isa)
{
	int32_t		total = 0;

#if defined(__x86_64__)
	if (isa == ATTN_AVX512 && hd % 16 == 0)
	{
		quantize_query_avx512(x, hd, q, scale, sum);
		return;
	}
#endif
	cai_op_quantize_vec_i8(x, hd, q, scale);
	for (int d = 0; d < hd; d++)
		total += q[d];
	*sum = total;
}

/*
 * A block's keys of one head (rows `stride` bytes apart) into four-byte groups kt[g][slot][4],
 * with their top bits flipped for vpdpbusd when flip is set (qk_block_avx512).
 */
CAI_ALWAYS_INLINE void
transpose_keys(attn_isa isa, const int8_t *keys, size_t stride, int hd, int s0, int s1, bool flip,
			   int8_t *kt)
{
#if defined(__x86_64__)
	if (isa == ATTN_AVX512 && hd % 64 == 0)
	{
		transpose_keys_avx512(keys, stride, hd, flip, kt);
		return;
	}
#endif
	transpose_keys_generic(keys, stride, hd, s0, s1, kt);
	for (int i = 0; flip && i < BLOCK * hd; i++)
		kt[i] ^= (int8_t) 0x80;
}

/*
 * The exact dot products of the tile's rows from r0 with one transposed block kt, into
 * dots[rows][16]; with kt2 (two-digit keys), 254 (q . k) + q . k2.
 */
CAI_ALWAYS_INLINE void
block_dots(attn_isa isa, bool amx, const int8_t *kt, const int8_t *kt2, cai_attn_scratch *s,
		   int r0, int rows_qk, int rows_padded, int hd, const float *kscale, int32_t *dots)
{
	const int8_t *q = s->q_i8 + (size_t) r0 * hd;
	const int32_t *q_sum = s->q_sum + r0;

	switch (isa)
	{
#if defined(__x86_64__)
		case ATTN_AVX512:
			if (amx)
				qk_blocks_amx(kt, kt2, 1, q, rows_qk, hd, dots, kscale, s->q_scale + r0, NULL, 0);
			else
				qk_block_avx512(kt, kt2, q, q_sum, rows_padded, hd, dots, kscale,
								s->q_scale + r0, NULL, 0);
			return;
		case ATTN_AVX2:
			qk_block_avx2(kt, q, q_sum, rows_padded, hd, dots);
			if (kt2)
				qk_block_avx2(kt2, q, q_sum, rows_padded, hd, s->dots2);
			break;
#endif
		default:
			qk_block_generic(kt, q, q_sum, rows_padded, hd, dots);
			if (kt2)
				qk_block_generic(kt2, q, q_sum, rows_padded, hd, s->dots2);
			break;
	}
	if (kt2)
		for (int i = 0; i < rows_padded * BLOCK; i++)
			dots[i] = CAI_KV_KEY_DIGIT_BASE * dots[i] + s->dots2[i];
}

/*
 * The scores of block b (from own->from on) of segment [seg_lo, seg_hi] for a shared tile: each
 * token's rows against its own sequence's block, transposed into kt (and kt2), by the per-block
 * kernels (never AMX: a token has few rows), the same scores as the rows alone get.
 */
CAI_ALWAYS_INLINE void
own_block_scores(const cai_attn_params *ap, cai_kv_pool *kv, const own_blocks *own,
				 cai_attn_scratch *s, int kv_head, int b, int seg_lo, int seg_hi, int8_t *kt,
				 int8_t *kt2, attn_isa isa)
{
	const cai_kv_layout *L = cai_kv_pool_layout(kv);
	const int	hd = ap->head_dim;
	const int	n_kv = ap->n_kv_heads;
	const int	base = b * BLOCK;
	const int	nr = own->part_rows;
	const int	nr_padded = (nr + ROW_GROUP - 1) / ROW_GROUP * ROW_GROUP;

	for (int p = 0; p < own->n_parts; p++)
	{
		int			r0 = p * nr;
		/* a token's rows share their range */
		int			j0 = base > s->row_lo[r0] ? base : s->row_lo[r0];
		int			j1 = base + BLOCK - 1 < s->row_hi[r0] ? base + BLOCK - 1 : s->row_hi[r0];
		uint8_t    *part;
		const float *kscales;
		float		kscale[BLOCK];
		cai_v16f	ks;

		if (j0 < seg_lo)
			j0 = seg_lo;
		if (j1 > seg_hi)
			j1 = seg_hi;
		if (j0 > j1)
			continue;
		part = cai_kv_block_layer(kv, own->tables[p][b], ap->kv_layer);
		kscales = cai_kv_key_scales(L, part);
		for (int slot = 0; slot < BLOCK; slot++)
			kscale[slot] = kscales[slot * n_kv + kv_head];
		memcpy(&ks, kscale, sizeof(ks));
		transpose_keys(isa, cai_kv_keys(L, part) + (size_t) kv_head * hd, (size_t) n_kv * hd, hd,
					   j0 - base, j1 - base, isa == ATTN_AVX512, kt);
		if (kt2)
			transpose_keys(isa, cai_kv_key_second_digits(L, part) + (size_t) kv_head * hd,
						   (size_t) n_kv * hd, hd, j0 - base, j1 - base, isa == ATTN_AVX512, kt2);
		block_dots(isa, false, kt, kt2, s, r0, nr_padded, nr_padded, hd, kscale, s->dots);
		for (int i = 0; i < nr; i++)
		{
			int			r = r0 + i;
			cai_v16i	di;
			cai_v16f	qks = ks * s->q_scale[r];
			float		sc[BLOCK];

			memcpy(&di, s->dots + (size_t) i * BLOCK, sizeof(di));
			cai_v16f_store(sc, __builtin_convertvector(di, cai_v16f) * qks);
			memcpy(s->scores + (size_t) r * SCORES_LD + (j0 - seg_lo), sc + (j0 - base),
				   (size_t) (j1 - j0 + 1) * sizeof(float));
		}
	}
}

/*
 * The tile's passes over segments [seg_begin, seg_end) of its rows: into out (partials NULL,
 * all of the rows' segments) or into partials.  The rows are those of tokens t0 .. t0 + n_tok - 1,
 * or, with own, of own->tokens (a shared tile: one token of each of several sequences whose
 * tables hold the same blocks below own->from, seq's table among them, each token's rows into
 * its own partials pt[i]).
 */
CAI_ALWAYS_INLINE void
attention_tile_body(const cai_attn_params *ap, const cai_batch_layout *batch, int seq,
					int kv_head, int t0, int n_tok, const own_blocks *own,
					const float *q, int ldq, cai_kv_pool *kv, const cai_kv_shadow *shadow,
					int seg_begin, int seg_end, const cai_attn_partials *pt, float *out, int ldo,
					cai_attn_scratch *s, attn_isa isa)
{
	const cai_kv_layout *L = cai_kv_pool_layout(kv);
	const int32_t *table = batch->block_tables[seq];
	const int	hd = ap->head_dim;
	const int	n_kv = ap->n_kv_heads;
	const int	group = ap->n_heads / n_kv;
	const int	rows = n_tok * group;
	/* rows per partials: a shared tile's tokens each have their own */
	const int	part_rows = own ? group : rows;
	const int	rows_padded = (rows + ROW_GROUP - 1) / ROW_GROUP * ROW_GROUP;
	const int	SEG = CAI_ATTN_SEGMENT_TOKENS;
	const float score_scale = cai_attn_score_scale(ap);
	int			jlo,
				jhi,
				s0,
				n_segs;
	/* scores from AMX tiles where the rows fill a tile (not for decode), rows padded to tiles */
	const bool	amx = isa == ATTN_AVX512 && !shadow && rows_padded >= AMX_ROWS && hd % 64 == 0 &&
		strcmp(cai_cpu_isa(), "avx512-amx") == 0;
	const int	rows_qk = amx ? (rows + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS : rows_padded;
	const bool	two_digits = L->key_digits == 2 && !shadow;
	/* AVX-512 without AMX: a segment's whole blocks are scored two at a time (single digits) */
	const bool	block_pairs = isa == ATTN_AVX512 && !amx && !shadow && !two_digits;
	/* the segment's transposed blocks and key scales kept until its whole blocks are scored */
	const bool	keep_segment_keys = amx || block_pairs;
	const tile_out dst = {.out = out, .ldo = ldo, .t0 = t0, .kv_head = kv_head, .group = group};
	const attn_value_path vpath = amx ? ATTN_VALUES_AMX
		: isa == ATTN_AVX512 ? ATTN_VALUES_AVX512
		: isa == ATTN_AVX2 ? ATTN_VALUES_AVX2 : ATTN_VALUES_GENERIC;

	/* the first block's keys and scales, while the queries are prepared */
	if (!shadow && !pt)
		prefetch_tile_start(ap, batch, seq, kv_head, t0, kv);

	/* each row's position range and its prepared query */
	for (int ti = 0; ti < n_tok; ti++)
	{
		int			t = own ? own->tokens[ti] : t0 + ti;
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
				float		qs;

				quantize_query(qrow, hd, s->q_i8 + (size_t) r * hd, &qs, &s->q_sum[r], isa);
				s->q_scale[r] = qs * score_scale;
			}
			else
			{
				for (int d = 0; d < hd; d++)
					s->q_f32[(size_t) r * hd + d] = qrow[d] * score_scale;
			}
		}
	}
	if (!shadow && (rows_qk > rows || own))
	{
		/* a shared tile's last token's rows are scored in whole row groups too */
		int			to = own && rows + ROW_GROUP > rows_qk ? rows + ROW_GROUP : rows_qk;

		memset(s->q_i8 + (size_t) rows * hd, 0, (size_t) (to - rows) * hd);
		memset(s->q_sum + rows, 0, (size_t) (to - rows) * sizeof(int32_t));
		memset(s->q_scale + rows, 0, (size_t) (to - rows) * sizeof(float));
	}

	/*
	 * The positions this call covers: the rows' ranges (their union is contiguous: each row
	 * starts at most one past the previous row's end, or a shared tile's all start together)
	 * within the segments asked for; from here on row_lo and row_hi are clipped to them, and a
	 * row they miss has lo > hi.
	 */
	jlo = s->row_lo[0];
	jhi = s->row_hi[0];
	for (int r = 1; r < rows; r++)
		jhi = s->row_hi[r] > jhi ? s->row_hi[r] : jhi;
	if (seg_begin < jlo / SEG)
		seg_begin = jlo / SEG;
	if (seg_end > jhi / SEG + 1)
		seg_end = jhi / SEG + 1;
	if (seg_begin >= seg_end)
		return;
	for (int r = 0; r < rows; r++)
	{
		if (s->row_lo[r] < seg_begin * SEG)
			s->row_lo[r] = seg_begin * SEG;
		if (s->row_hi[r] > seg_end * SEG - 1)
			s->row_hi[r] = seg_end * SEG - 1;
	}
	jlo = s->row_lo[0];
	jhi = s->row_hi[0];
	for (int r = 1; r < rows; r++)
		jhi = s->row_hi[r] > jhi ? s->row_hi[r] : jhi;
	s0 = jlo / SEG;
	n_segs = jhi / SEG - s0 + 1;
#if defined(__x86_64__)
	if (amx)
		cai_amx_configure();
#endif

	/* each segment in turn: scores, softmax, weighted sums of values */
	for (int sg = s0; sg < s0 + n_segs; sg++)
	{
		int			seg_lo = sg * SEG > jlo ? sg * SEG : jlo;
		int			seg_hi = sg * SEG + SEG - 1 < jhi ? sg * SEG + SEG - 1 : jhi;

		/* pass 1: scores */
		for (int b = seg_lo / BLOCK; b <= seg_hi / BLOCK; b++)
		{
			int			base = b * BLOCK;
			int			j0 = base > seg_lo ? base : seg_lo;
			int			j1 = base + BLOCK - 1 < seg_hi ? base + BLOCK - 1 : seg_hi;
			uint8_t    *part;

			if (own && base >= own->from)
			{
				/* a block of each token's own (its slot: the shared blocks' stay for AMX) */
				own_block_scores(ap, kv, own, s, kv_head, b, seg_lo, seg_hi,
								 s->k_t + (size_t) (keep_segment_keys ? b - seg_lo / BLOCK : 0) * BLOCK * hd,
								 !two_digits ? NULL :
								 s->k2_t + (size_t) (amx ? b - seg_lo / BLOCK : 0) * BLOCK * hd, isa);
				continue;
			}
			part = cai_kv_block_layer(kv, table[b], ap->kv_layer);
			if (!shadow)
			{
				const int8_t *keys = cai_kv_keys(L, part);
				const float *kscales = cai_kv_key_scales(L, part);
				float		kscale_block[BLOCK];
				cai_v16f	ks;

				/*
				 * Blocks lie far apart and a decode reads each once: ask for the next block's
				 * keys and this block's values (pass 3) now, so that memory latency overlaps.
				 */
				prefetch_head_rows(cai_kv_values(L, part) + (size_t) kv_head * hd, n_kv, hd);
				prefetch_scales(cai_kv_value_scales(L, part), n_kv);
				if (b + 1 <= jhi / BLOCK)
				{
					uint8_t    *next = cai_kv_block_layer(kv, table[b + 1], ap->kv_layer);

					prefetch_head_rows(cai_kv_keys(L, next) + (size_t) kv_head * hd, n_kv, hd);
					prefetch_scales(cai_kv_key_scales(L, next), n_kv);
				}

				/* kept: the segment's blocks one after another (scored below) */
				int8_t	   *kt = keep_segment_keys ?
					s->k_t + (size_t) (b - seg_lo / BLOCK) * BLOCK * hd : s->k_t;
				int8_t	   *kt2 = !two_digits ? NULL :
					amx ? s->k2_t + (size_t) (b - seg_lo / BLOCK) * BLOCK * hd : s->k2_t;
				float	   *kscale = keep_segment_keys ?
					s->k_scales + (b - seg_lo / BLOCK) * BLOCK : kscale_block;
				bool		flip = isa == ATTN_AVX512 && !amx;
				bool		whole = base >= seg_lo && base + BLOCK - 1 <= seg_hi;

				/* all 16 (slots outside [j0, j1] feed only lanes that are never stored) */
				for (int slot = 0; slot < BLOCK; slot++)
					kscale[slot] = kscales[slot * n_kv + kv_head];
				memcpy(&ks, kscale, sizeof(ks));

				/* the head's keys in four-byte groups (two-digit keys: both digits') */
				transpose_keys(isa, keys + (size_t) kv_head * hd, (size_t) n_kv * hd, hd,
							   j0 - base, j1 - base, flip, kt);
				if (kt2)
					transpose_keys(isa, cai_kv_key_second_digits(L, part) + (size_t) kv_head * hd,
								   (size_t) n_kv * hd, hd, j0 - base, j1 - base, flip, kt2);
	#if defined(__x86_64__)
				if (whole && keep_segment_keys)
					continue;	/* a whole block's scores come with the segment's others, below */
				if (whole && isa == ATTN_AVX512)
				{
					/*
					 * a block inside the segment's span: every row's scores straight from the
					 * sums (lanes outside a row's range are never read, as below)
					 */
					qk_block_avx512(kt, kt2, s->q_i8, s->q_sum, rows_padded, hd, NULL,
									kscale, s->q_scale, s->scores + (base - seg_lo), SCORES_LD);
					continue;
				}
	#endif
				block_dots(isa, amx, kt, kt2, s, 0, rows_qk, rows_padded, hd, kscale, s->dots);
				/* score = dot * (q scale * k scale), the block's 16 slots at once */
				for (int r = 0; r < rows; r++)
				{
					int			a = j0 > s->row_lo[r] ? j0 : s->row_lo[r];
					int			e = j1 < s->row_hi[r] ? j1 : s->row_hi[r];
					cai_v16i	di;
					cai_v16f	qks = ks * s->q_scale[r];	/* q scale * k scale per slot */
					float		sc[BLOCK];

					if (a > e)
						continue;
					memcpy(&di, s->dots + (size_t) r * BLOCK, sizeof(di));
					/* a block inside the segment's span is stored whole: lanes outside the row's
					 * own range are never read */
					if (whole)
					{
						cai_v16f_store(s->scores + (size_t) r * SCORES_LD + (base - seg_lo),
									   __builtin_convertvector(di, cai_v16f) * qks);
						continue;
					}
					cai_v16f_store(sc, __builtin_convertvector(di, cai_v16f) * qks);
					memcpy(s->scores + (size_t) r * SCORES_LD + (a - seg_lo), sc + (a - base),
						   (size_t) (e - a + 1) * sizeof(float));
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
						s->scores[(size_t) r * SCORES_LD + (j - seg_lo)] =
							dot_f32(s->q_f32 + (size_t) r * hd,
									keys + ((size_t) (j - base) * n_kv + kv_head) * hd, hd);
				}
			}
		}

#if defined(__x86_64__)
		/* with AMX, the scores of the segment's whole blocks, all at once */
		if (amx)
		{
			int			first = (seg_lo + BLOCK - 1) / BLOCK;
			int			last = (seg_hi + 1) / BLOCK - 1;

			if (own && last >= own->from / BLOCK)
				last = own->from / BLOCK - 1;
			if (first <= last)
				qk_blocks_amx(s->k_t + (size_t) (first - seg_lo / BLOCK) * BLOCK * hd,
							  two_digits ? s->k2_t + (size_t) (first - seg_lo / BLOCK) * BLOCK * hd : NULL,
							  last - first + 1, s->q_i8, rows_qk, hd, NULL,
							  s->k_scales + (first - seg_lo / BLOCK) * BLOCK, s->q_scale,
							  s->scores + (first * BLOCK - seg_lo), SCORES_LD);
		}
		else if (block_pairs)
		{
			int			b = (seg_lo + BLOCK - 1) / BLOCK;
			int			last = (seg_hi + 1) / BLOCK - 1;

			if (own && last >= own->from / BLOCK)
				last = own->from / BLOCK - 1;
			for (; b <= last; b += 2)
			{
				const int8_t *kt = s->k_t + (size_t) (b - seg_lo / BLOCK) * BLOCK * hd;
				const float *kscale = s->k_scales + (b - seg_lo / BLOCK) * BLOCK;
				float	   *scores = s->scores + (b * BLOCK - seg_lo);

				if (b < last)
					qk_block_pair_avx512(kt, s->q_i8, s->q_sum, rows_padded, hd, kscale,
										 s->q_scale, scores, SCORES_LD);
				else
					qk_block_avx512(kt, NULL, s->q_i8, s->q_sum, rows_padded, hd, NULL, kscale,
									s->q_scale, scores, SCORES_LD);
			}
		}
#endif

		/* pass 2, softmax of each row over its own part of the segment; pass 3, values */
		if (shadow)
		{
			for (int r = 0; r < rows; r++)
			{
				int			a = seg_lo > s->row_lo[r] ? seg_lo : s->row_lo[r];
				int			e = seg_hi < s->row_hi[r] ? seg_hi : s->row_hi[r];

				if (a > e)
					continue;
				float	   *row = s->scores + (size_t) r * SCORES_LD + (a - seg_lo);

				s->seg_m[r] = row_max(row, e - a + 1, isa);
				softmax_row(row, e - a + 1, s->seg_m[r], &s->seg_l[r], NULL, isa);
			}
			value_pass_f32(ap, shadow, table, s, kv_head, n_tok, group, seg_lo, seg_hi);
		}
		else
			softmax_values_i8(ap, kv, table, own, s, kv_head, rows, rows_qk, sg, seg_lo, seg_hi,
							  pt ? NULL : &dst, vpath, isa);

		/* the segment's sums: to the split tile's partials, or (float path) to the output */
		if (pt)
		{
			for (int r = 0; r < rows; r++)
			{
				const cai_attn_partials *p = pt + r / part_rows;
				int			pr = r % part_rows;
				int			k = sg - p->seg0;

				if (!row_meets(s, r, seg_lo, seg_hi))
					continue;
				memcpy(p->o + ((size_t) k * part_rows + pr) * hd, s->seg_o + (size_t) r * hd,
					   (size_t) hd * sizeof(float));
				p->m[(size_t) pr * p->n_segs + k] = s->seg_m[r];
				p->l[(size_t) pr * p->n_segs + k] = s->seg_l[r];
			}
		}
		else if (shadow)
		{
			fold_state	f = fold_state_of(s, rows);

			segment_fold_state(s, rows, sg, seg_lo, seg_hi);
			for (int r = 0; r < rows; r++)
			{
				float	   *o = row_out(out, ldo, t0, kv_head, group, hd, r);

				if (!row_meets(s, r, seg_lo, seg_hi))
					continue;
				if (row_starts(s, r, sg))
					memcpy(o, s->seg_o + (size_t) r * hd, (size_t) hd * sizeof(float));
				else
					fold_row(o, s->seg_o + (size_t) r * hd, f.wa[r], f.wb[r], hd);
			}
		}
	}
#if defined(__x86_64__)
	if (amx)
		cai_amx_release();
#endif
}

#define TILE_ARGS \
	const cai_attn_params *ap, const cai_batch_layout *batch, int seq, int kv_head, int t0, \
	int n_tok, const own_blocks *own, const float *q, int ldq, \
	cai_kv_pool *kv, const cai_kv_shadow *shadow, int seg_begin, int seg_end, \
	const cai_attn_partials *pt, float *out, int ldo, cai_attn_scratch *s
#define TILE_PASS ap, batch, seq, kv_head, t0, n_tok, own, q, ldq, kv, shadow, \
	seg_begin, seg_end, pt, out, ldo, s

static void
attention_tile_generic(TILE_ARGS)
{
	attention_tile_body(TILE_PASS, ATTN_GENERIC);
}

#if defined(__x86_64__)
TARGET_AVX2 static void
attention_tile_avx2(TILE_ARGS)
{
	attention_tile_body(TILE_PASS, ATTN_AVX2);
}

TARGET_AVX512 static void
attention_tile_avx512(TILE_ARGS)
{
	attention_tile_body(TILE_PASS, ATTN_AVX512);
}
#endif

static void
attention_tile_dispatch(TILE_ARGS)
{
	switch (current_isa())
	{
#if defined(__x86_64__)
		case ATTN_AVX512:
			attention_tile_avx512(TILE_PASS);
			return;
		case ATTN_AVX2:
			attention_tile_avx2(TILE_PASS);
			return;
#endif
		default:
			attention_tile_generic(TILE_PASS);
			return;
	}
}

#undef TILE_ARGS
#undef TILE_PASS

void
cai_attention_tile(const cai_attn_params *ap, const cai_batch_layout *batch, int seq,
				   int kv_head, int t0, int n_tok, const float *q, int ldq,
				   cai_kv_pool *kv, const cai_kv_shadow *shadow, float *out, int ldo,
				   cai_attn_scratch *s)
{
	attention_tile_dispatch(ap, batch, seq, kv_head, t0, n_tok, NULL, q, ldq, kv, shadow, 0,
							INT_MAX, NULL, out, ldo, s);
}

void
cai_attention_tile_segments(const cai_attn_params *ap, const cai_batch_layout *batch,
							int t0, int n_tok, int *first, int *last)
{
	int			pos0 = batch->token_pos[t0];
	int			lo = ap->window > 0 && pos0 - ap->window + 1 > 0 ? pos0 - ap->window + 1 : 0;

	*first = lo / CAI_ATTN_SEGMENT_TOKENS;
	*last = batch->token_pos[t0 + n_tok - 1] / CAI_ATTN_SEGMENT_TOKENS;
}

void
cai_attention_tile_part(const cai_attn_params *ap, const cai_batch_layout *batch, int seq,
						int kv_head, int t0, int n_tok, const float *q, int ldq,
						cai_kv_pool *kv, const cai_kv_shadow *shadow, int seg_begin,
						int seg_end, const cai_attn_partials *partials, cai_attn_scratch *s)
{
	attention_tile_dispatch(ap, batch, seq, kv_head, t0, n_tok, NULL, q, ldq, kv, shadow,
							seg_begin, seg_end, partials, NULL, 0, s);
}

int
cai_attention_shared_max_seqs(int n_group)
{
	/* a row group to spare: each token's rows are scored in whole groups */
	return (TILE_ROWS - ROW_GROUP) / n_group;
}

void
cai_attention_shared_part(const cai_attn_params *ap, const cai_batch_layout *batch,
						  const int *seqs, int n_seqs, int kv_head, const float *q, int ldq,
						  cai_kv_pool *kv, int seg_begin, int seg_end, int own_from,
						  const cai_attn_partials *partials, cai_attn_scratch *s)
{
	int			tokens[TILE_ROWS];
	const int32_t *tables[TILE_ROWS];
	own_blocks	own = {.tokens = tokens, .tables = tables, .n_parts = n_seqs,
	.part_rows = ap->n_heads / ap->n_kv_heads, .from = own_from};

	for (int i = 0; i < n_seqs; i++)
	{
		tokens[i] = batch->seq_start[seqs[i]];
		tables[i] = batch->block_tables[seqs[i]];
	}
	attention_tile_dispatch(ap, batch, seqs[0], kv_head, tokens[0], n_seqs, &own, q, ldq, kv,
							NULL, seg_begin, seg_end, partials, NULL, 0, s);
}

/*
 * The merge, compiled per path like the tile: the pair of exponentials of each fold is one call
 * of the vector exp2, whose fused multiply-adds are instructions on the AVX paths (the portable
 * build calls fmaf for them).
 */
CAI_ALWAYS_INLINE void
attention_merge_body(const cai_attn_params *ap, const cai_batch_layout *batch, int kv_head,
					 int t0, int n_tok, const cai_attn_partials *pt, float *out, int ldo)
{
	const int	hd = ap->head_dim;
	const int	group = ap->n_heads / ap->n_kv_heads;
	const int	rows = n_tok * group;
	const int	SEG = CAI_ATTN_SEGMENT_TOKENS;

	for (int r = 0; r < rows; r++)
	{
		int			pos = batch->token_pos[t0 + r / group];
		int			lo = ap->window > 0 && pos - ap->window + 1 > 0 ? pos - ap->window + 1 : 0;
		int			first = lo / SEG - pt->seg0;
		int			n = pos / SEG - lo / SEG + 1;
		float	   *o = row_out(out, ldo, t0, kv_head, group, hd, r);
		float		M = pt->m[(size_t) r * pt->n_segs + first];
		float		L = pt->l[(size_t) r * pt->n_segs + first];

		memcpy(o, pt->o + ((size_t) first * rows + r) * hd, (size_t) hd * sizeof(float));
		for (int k = first + 1; k < first + n; k++)
		{
			float		m = pt->m[(size_t) r * pt->n_segs + k];
			float		Mn = m > M ? m : M;
			cai_v8f		x = cai_v8f_set1(0.0f);
			cai_v8f		e;
			float		wa,
						wb;

			x[0] = M - Mn;
			x[1] = m - Mn;
			e = attn_exp2_8(&x);
			fold_weights(&L, e[0], e[1], pt->l[(size_t) r * pt->n_segs + k], &wa, &wb);
			fold_row(o, pt->o + ((size_t) k * rows + r) * hd, wa, wb, hd);
			M = Mn;
		}
	}
}

#define MERGE_ARGS \
	const cai_attn_params *ap, const cai_batch_layout *batch, int kv_head, int t0, int n_tok, \
	const cai_attn_partials *pt, float *out, int ldo
#define MERGE_PASS ap, batch, kv_head, t0, n_tok, pt, out, ldo

static void
attention_merge_generic(MERGE_ARGS)
{
	attention_merge_body(MERGE_PASS);
}

#if defined(__x86_64__)
TARGET_AVX2 static void
attention_merge_avx2(MERGE_ARGS)
{
	attention_merge_body(MERGE_PASS);
}

TARGET_AVX512 static void
attention_merge_avx512(MERGE_ARGS)
{
	attention_merge_body(MERGE_PASS);
}
#endif

void
cai_attention_merge(MERGE_ARGS)
{
	switch (current_isa())
	{
#if defined(__x86_64__)
		case ATTN_AVX512:
			attention_merge_avx512(MERGE_PASS);
			return;
		case ATTN_AVX2:
			attention_merge_avx2(MERGE_PASS);
			return;
#endif
		default:
			attention_merge_generic(MERGE_PASS);
			return;
	}
}

#undef MERGE_ARGS
#undef MERGE_PASS
