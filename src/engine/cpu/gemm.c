/*
 * gemm.c — the CPU matrix kernels: W8A8 int8 GEMM with a fused epilogue, the float reference
 * GEMM and per-token activation quantization, with runtime ISA dispatch.
 *
 * Exactness contract.  The int8 product accumulates in int32, which is exact whatever the
 * order, so every ISA path, thread count and blocking yields the same integer per output; the
 * integer then goes through one epilogue (GEMM_EPILOGUE below), the same float expression in
 * the same order on every path.  Activation quantization uses only exact operations (max of
 * absolute values) and the same correctly rounded float operations on every path.  Hence the
 * int8 results are bit-identical across ISAs, threads and batch sizes.
 *
 * The float reference sums every dot product in one fixed order (16 strided partial sums, a
 * fixed tree, then the tail), whatever the number of tokens or threads; paths that have FMA
 * use it, the generic one does not, so float results only match within a path.
 *
 * Work is split over the thread pool by output channels (and tokens for big batches), never
 * along k, so no task ever reduces another task's partial sums.
 */
#include "gemm.h"

#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/*
 * A barrier the compiler cannot see through: keeps a float (or a vector of floats) from being
 * fused into a multiply-add with its neighbours.  GNU C contracts a * b + c by default where
 * FMA exists, which would make the FMA paths round differently from the generic one.
 */
#if defined(__x86_64__) || defined(__i386__)
#define FP_BARRIER(v) __asm__("" : "+v"(v))
#elif defined(__aarch64__)
#define FP_BARRIER(v) __asm__("" : "+w"(v))
#else
#define FP_BARRIER(v) __asm__("" : "+r"(v))
#endif

/*
 * The int8 epilogue: the single definition of how the integer becomes the output,
 *
 *     v = ((float) acc * xs) * ws;   v = v + bias (if any);   result = v  or  prev + v,
 *
 * each operation rounded to float.  It is a macro so that the same text serves scalars (float)
 * and GNU vectors of floats (__m256, __m512: lane-wise IEEE operations, hence the same bits);
 * the vector kernels convert int32 to float with the same round-to-nearest as the scalar cast.
 * bias and prev are only evaluated when used.
 */
#define GEMM_EPILOGUE(result, accf, xs, ws, has_bias, bias, accumulate, prev) \
	do { \
		(result) = (accf) * (xs) * (ws); \
		FP_BARRIER(result); \
		if (has_bias) \
		{ \
			(result) = (result) + (bias); \
			FP_BARRIER(result); \
		} \
		if (accumulate) \
			(result) = (prev) + (result); \
	} while (0)

/* The epilogue for one output element. */
static inline __attribute__((always_inline)) void
gemm_epilogue(float *dst, int32_t acc, float xs, float ws, const float *bias, int o,
			  bool accumulate)
{
	float		v;

	GEMM_EPILOGUE(v, (float) acc, xs, ws, bias != NULL, bias[o], accumulate, *dst);
	*dst = v;
}

/* The float GEMM's epilogue: the same order as the int8 one. */
static inline __attribute__((always_inline)) void
gemm_f32_epilogue(float *dst, float dot, const float *bias, int o, bool accumulate)
{
	float		v = dot;

	if (bias)
	{
		v = v + bias[o];
		FP_BARRIER(v);
	}
	if (accumulate)
		*dst = *dst + v;
	else
		*dst = v;
}

/* ---------------------------------------------------------------------------------------
 * ISA selection
 * --------------------------------------------------------------------------------------- */

typedef enum gemm_isa
{
	ISA_UNSET = 0,
	ISA_GENERIC,
	ISA_AVX2,
	ISA_AVX512_VNNI,
} gemm_isa;

/*
 * The path in use.  This is process-wide on purpose: it describes the CPU, is computed once,
 * and is only changed by tests through cai_cpu_force_isa.
 */
static _Atomic int selected_isa = ISA_UNSET;

static bool
isa_available(gemm_isa isa)
{
	switch (isa)
	{
		case ISA_GENERIC:
			return true;
#if defined(__x86_64__)
		case ISA_AVX2:
			__builtin_cpu_init();
			return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
		case ISA_AVX512_VNNI:
			__builtin_cpu_init();
			return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
				__builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
				__builtin_cpu_supports("fma");
#endif
		default:
			return false;
	}
}

static gemm_isa
current_isa(void)
{
	int			isa = atomic_load_explicit(&selected_isa, memory_order_relaxed);

	if (isa == ISA_UNSET)
	{
		if (isa_available(ISA_AVX512_VNNI))
			isa = ISA_AVX512_VNNI;
		else if (isa_available(ISA_AVX2))
			isa = ISA_AVX2;
		else
			isa = ISA_GENERIC;
		atomic_store_explicit(&selected_isa, isa, memory_order_relaxed);
	}
	return (gemm_isa) isa;
}

static const char *
isa_name(gemm_isa isa)
{
	switch (isa)
	{
		case ISA_AVX512_VNNI:
			return "avx512-vnni";
		case ISA_AVX2:
			return "avx2";
		default:
			return "generic";
	}
}

/* Name of the int8 path in use. */
const char *
cai_cpu_isa(void)
{
	return isa_name(current_isa());
}

/* Tests: switches to the named path if this CPU has it. */
bool
cai_cpu_force_isa(const char *name)
{
	static const gemm_isa all[] = {ISA_GENERIC, ISA_AVX2, ISA_AVX512_VNNI};

	if (!name)
		return false;
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
	{
		if (strcmp(name, isa_name(all[i])) == 0)
		{
			if (!isa_available(all[i]))
				return false;
			atomic_store_explicit(&selected_isa, all[i], memory_order_relaxed);
			return true;
		}
	}
	return false;
}

/* ---------------------------------------------------------------------------------------
 * Weight preparation and activation quantization
 * --------------------------------------------------------------------------------------- */

/* Fills row_sum, the per-channel sum of the int8 weights (VNNI's offset correction). */
void
cai_qmatrix_prepare(cai_qmatrix *m)
{
	for (int o = 0; o < m->n_out; o++)
	{
		const int8_t *row = m->q + (size_t) o * m->k;
		int32_t		sum = 0;

		for (int i = 0; i < m->k; i++)
			sum += row[i];
		m->row_sum[o] = sum;
	}
}

/*
 * Quantizes one value given the row's 127/max|x|.  Rounding: x * inv rounded to nearest, ties
 * to even (rintf under the default rounding mode, like the vector conversions), after clamping
 * to [-127, 127] with the comparisons written so that NaN becomes -127 exactly as the vector
 * max/min instructions do.
 */
static inline int8_t
quantize_one(float x, float inv)
{
	float		v = x * inv;

	v = v > -127.0f ? v : -127.0f;
	v = v < 127.0f ? v : 127.0f;
	return (int8_t) (int) rintf(v);
}

/*
 * The row's scale and its inverse from max|x|.  A row whose max is zero or so small that
 * 127/max overflows (subnormal inputs) is quantized to zeros with scale 0: its contribution is
 * below float resolution anyway.
 */
static inline bool
row_scale(float amax, float *scale, float *inv)
{
	float		r;

	if (!(amax > 0.0f))
		return false;
	r = 127.0f / amax;
	if (isinf(r))
		return false;
	*scale = amax / 127.0f;
	*inv = r;
	return true;
}

/* One token's row: generic path. */
static void
quantize_row_generic(const float *x, int k, int8_t *q, float *s)
{
	float		amax = 0.0f;
	float		inv;

	for (int i = 0; i < k; i++)
	{
		float		a = fabsf(x[i]);

		amax = a > amax ? a : amax;
	}
	if (!row_scale(amax, s, &inv))
	{
		*s = 0.0f;
		memset(q, 0, k);
		return;
	}
	for (int i = 0; i < k; i++)
		q[i] = quantize_one(x[i], inv);
}

/* ---------------------------------------------------------------------------------------
 * Kernels
 * --------------------------------------------------------------------------------------- */

typedef struct gemm_i8_job
{
	const int8_t *xq;
	const float *xs;
	int			n_tok;
	const cai_qmatrix *w;
	const float *bias;
	float	   *out;
	int			ldo;
	bool		accumulate;
} gemm_i8_job;

typedef struct gemm_f32_job
{
	const float *x;
	int			n_tok;
	int			k;
	const float *w;
	int			n_out;
	const float *bias;
	float	   *out;
	int			ldo;
	bool		accumulate;
} gemm_f32_job;

/* A kernel computes the output tile tokens [t0, t1) x channels [o0, o1). */
typedef void (*gemm_i8_kernel) (const gemm_i8_job *j, int t0, int t1, int o0, int o1);
typedef void (*gemm_f32_kernel) (const gemm_f32_job *j, int t0, int t1, int o0, int o1);

/* Portable int8 kernel: one int32 dot product per output, then the epilogue. */
static void
gemm_i8_generic(const gemm_i8_job *j, int t0, int t1, int o0, int o1)
{
	int			k = j->w->k;

	for (int t = t0; t < t1; t++)
	{
		const int8_t *x = j->xq + (size_t) t * k;

		for (int o = o0; o < o1; o++)
		{
			const int8_t *w = j->w->q + (size_t) o * k;
			int32_t		acc = 0;

			for (int i = 0; i < k; i++)
				acc += (int32_t) x[i] * w[i];
			gemm_epilogue(j->out + (size_t) t * j->ldo + o, acc, j->xs[t], j->w->scale[o],
						  j->bias, o, j->accumulate);
		}
	}
}

/*
 * The float dot product's fixed order: lane l (0..15) sums x[i] * w[i] for i = l, l + 16, ...
 * below k rounded down to 16; lanes reduce as l += l + 8, then + 4, + 2, + 1; the tail elements
 * follow one by one.  The generic path multiplies then adds (no FMA).
 */
static float
dot_f32_generic(const float *x, const float *w, int k)
{
	float		lane[16] = {0};
	int			k16 = k & ~15;
	float		sum;

	for (int i = 0; i < k16; i += 16)
		for (int l = 0; l < 16; l++)
		{
			float		p = x[i + l] * w[i + l];

			FP_BARRIER(p);
			lane[l] = lane[l] + p;
		}
	for (int width = 8; width >= 1; width /= 2)
		for (int l = 0; l < width; l++)
			lane[l] = lane[l] + lane[l + width];
	sum = lane[0];
	for (int i = k16; i < k; i++)
	{
		float		p = x[i] * w[i];

		FP_BARRIER(p);
		sum = sum + p;
	}
	return sum;
}

/* Portable float kernel. */
static void
gemm_f32_generic(const gemm_f32_job *j, int t0, int t1, int o0, int o1)
{
	for (int t = t0; t < t1; t++)
		for (int o = o0; o < o1; o++)
			gemm_f32_epilogue(j->out + (size_t) t * j->ldo + o,
							  dot_f32_generic(j->x + (size_t) t * j->k,
											  j->w + (size_t) o * j->k, j->k),
							  j->bias, o, j->accumulate);
}

/* ---------------------------------------------------------------------------------------
 * AVX-512 VNNI
 *
 * vpdpbusd multiplies unsigned bytes by signed bytes.  Activations are made unsigned by
 * flipping their top bit (x ^ 0x80 == x + 128 as an unsigned byte), so each lane accumulates
 * sum (x + 128) * w = sum x * w + 128 * row_sum; the correction is subtracted after the
 * reduction.  The arithmetic wraps modulo 2^32, so the result is exact whenever the true dot
 * product fits in int32 (|k| * 127 * 127 < 2^31, i.e. k < 133,000).
 *
 * Tiles are NT tokens x NR channels (NT * NR <= 16 accumulators), fully unrolled for constant
 * NT and NR; one 64-byte step loads NT activation vectors and NR weight vectors and issues
 * NT * NR dot-product instructions.  The NT * NR accumulators are reduced together by a
 * transposing tree into one vector of sums, and full tiles run the epilogue on that vector.
 * One token (decode) uses 1 x 16 tiles: 16 weight rows streamed against one activation row.
 * Batches use 4 x 4 tiles: each weight row loaded serves 4 tokens from registers, and the
 * 4 rows (4 * k bytes) stay in L1 while the kernel runs over all the task's tokens.
 *
 * Measured on the 2-core EPYC (Zen 4, 3.7 GHz, one 512-bit vpdpbusd per cycle per core: peak
 * 473 int8 GOPS per core): 4 x 4 tiles reach 360-400 GOPS per core (k = 576 to 1536, 76-85% of
 * peak; the rest is the reduction and epilogue, ~3 shuffles per output against k / 64
 * vpdpbusd); decode streams weights at 20-25 GB/s per core, the memory's pace.
 * --------------------------------------------------------------------------------------- */
#if defined(__x86_64__)

#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))
#define TARGET_AVX2 __attribute__((target("avx2,fma")))
/*
 * Software prefetch of weight rows ahead of use.  Weights are streamed from DRAM once per call
 * (the model is far bigger than the caches), and the hardware prefetcher alone leaves a core at
 * about half of the bandwidth it can pull: prefetching into L2 (T1; the L2 can track more misses
 * than L1) one block ahead measured about 1.8x the single-thread decode bandwidth of no prefetch
 * or of prefetching into L1 on the 2-core EPYC (Zen 4) this was tuned on.
 *   PF_DECODE_ROWS: rows ahead in the one-token kernel (one 16-row block);
 *   PF_BATCH_ROWS: rows ahead in the batched kernel (four 4-row groups).
 */
#define PF_HINT _MM_HINT_T1
#define PF_DECODE_ROWS 16
#define PF_BATCH_ROWS 16

/*
 * Sums each of 16 vectors' lanes: result lane j = sum of v[j]'s 16 lanes.  Pairs are combined
 * with 32-bit then 64-bit interleaves, then 128-bit blocks are transposed and added.
 */
static inline __attribute__((always_inline)) TARGET_AVX512 __m512i
hsum16_epi32(const __m512i *v)
{
	__m512i		l1[8],
				l2[4],
				l3[2];

	for (int i = 0; i < 8; i++)
		l1[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
								 _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
	/* l1[i] per 128-bit block: a02 b02 a13 b13 (a = v[2i], b = v[2i+1]) */
	for (int i = 0; i < 4; i++)
		l2[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(l1[2 * i], l1[2 * i + 1]),
								 _mm512_unpackhi_epi64(l1[2 * i], l1[2 * i + 1]));
	/* l2[i] per 128-bit block: partial sums of v[4i], v[4i+1], v[4i+2], v[4i+3] */
	for (int i = 0; i < 2; i++)
		l3[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(l2[2 * i], l2[2 * i + 1], 0x88),
								 _mm512_shuffle_i32x4(l2[2 * i], l2[2 * i + 1], 0xDD));
	/*
	 * l3[i] blocks: v[8i..8i+3] summed over source blocks 0-1, the same over blocks 2-3, then
	 * v[8i+4..8i+7] over blocks 0-1 and over blocks 2-3; the last step adds the halves.
	 */
	return _mm512_add_epi32(_mm512_shuffle_i32x4(l3[0], l3[1], 0x88),
							_mm512_shuffle_i32x4(l3[0], l3[1], 0xDD));
}

/*
 * One NT x NR tile: tokens t..t+NT-1, channels o..o+NR-1, the whole of k.  Returns the exact
 * int32 dot products, lane tt * NR + r (lanes past NT * NR are zero).  If pf is not NULL, the
 * NR rows at pf (same k) are prefetched along the way, one cache line per weight load: the
 * next rows this thread will stream.
 */
static inline __attribute__((always_inline)) TARGET_AVX512 __m512i
vnni_tile(const int8_t *x, const int8_t *w, const int32_t *row_sum, int k, int NT, int NR,
		  const int8_t *pf)
{
	__m512i		acc[16];
	const __m512i flip = _mm512_set1_epi8((char) 0x80);
	int32_t		corr[16] = {0};
	int			i;

	for (int a = 0; a < 16; a++)
		acc[a] = _mm512_setzero_si512();
	for (i = 0; i + 64 <= k; i += 64)
	{
		__m512i		xu[4];

		for (int tt = 0; tt < NT; tt++)
			xu[tt] = _mm512_xor_si512(_mm512_loadu_si512(x + (size_t) tt * k + i), flip);
		for (int r = 0; r < NR; r++)
		{
			__m512i		wv = _mm512_loadu_si512(w + (size_t) r * k + i);

			if (pf)
				_mm_prefetch((const char *) (pf + (size_t) r * k + i), PF_HINT);
			for (int tt = 0; tt < NT; tt++)
				acc[tt * NR + r] = _mm512_dpbusd_epi32(acc[tt * NR + r], xu[tt], wv);
		}
	}
	if (i < k)
	{
		__mmask64	m = (~0ULL) >> (64 - (k - i));
		__m512i		xu[4];

		/* masked-off weight bytes are zero, so the flipped padding of x adds nothing */
		for (int tt = 0; tt < NT; tt++)
			xu[tt] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, x + (size_t) tt * k + i), flip);
		for (int r = 0; r < NR; r++)
		{
			__m512i		wv = _mm512_maskz_loadu_epi8(m, w + (size_t) r * k + i);

			for (int tt = 0; tt < NT; tt++)
				acc[tt * NR + r] = _mm512_dpbusd_epi32(acc[tt * NR + r], xu[tt], wv);
		}
	}
	/* the +128 offset: lane tt * NR + r loses 128 * row_sum[r] (wrapping, like vpdpbusd) */
	if (NT == 1 && NR == 16)
		return _mm512_sub_epi32(hsum16_epi32(acc),
								_mm512_slli_epi32(_mm512_loadu_si512(row_sum), 7));
	if (NR == 4)
		return _mm512_sub_epi32(hsum16_epi32(acc),
								_mm512_maskz_slli_epi32((__mmask16) ((1u << (4 * NT)) - 1),
														_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *) row_sum)), 7));
	for (int tt = 0; tt < NT; tt++)
		for (int r = 0; r < NR; r++)
			corr[tt * NR + r] = (int32_t) ((uint32_t) row_sum[r] << 7);
	return _mm512_sub_epi32(hsum16_epi32(acc), _mm512_loadu_si512(corr));
}

/* Scalar epilogue of an NT x NR tile whose sums are in lanes tt * nr + r. */
static TARGET_AVX512 void
vnni_epilogue_scalar(const gemm_i8_job *j, int t, int nt, int o, int nr, __m512i sums)
{
	int32_t		acc[16];

	_mm512_storeu_si512(acc, sums);
	for (int tt = 0; tt < nt; tt++)
		for (int r = 0; r < nr; r++)
			gemm_epilogue(j->out + (size_t) (t + tt) * j->ldo + o + r, acc[tt * nr + r],
						  j->xs[t + tt], j->w->scale[o + r], j->bias, o + r, j->accumulate);
}

/* Vector epilogue of one token's 16 consecutive channels. */
static inline __attribute__((always_inline)) TARGET_AVX512 void
vnni_epilogue_1x16(const gemm_i8_job *j, int t, int o, __m512i sums)
{
	float	   *dst = j->out + (size_t) t * j->ldo + o;
	__m512		v;

	GEMM_EPILOGUE(v, _mm512_cvtepi32_ps(sums), _mm512_set1_ps(j->xs[t]),
				  _mm512_loadu_ps(j->w->scale + o), j->bias != NULL,
				  _mm512_loadu_ps(j->bias + o), j->accumulate, _mm512_loadu_ps(dst));
	_mm512_storeu_ps(dst, v);
}

/* Vector epilogue of a 4 x 4 tile (lane tt * 4 + r). */
static inline __attribute__((always_inline)) TARGET_AVX512 void
vnni_epilogue_4x4(const gemm_i8_job *j, int t, int o, __m512i sums)
{
	const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
	float	   *d0 = j->out + (size_t) t * j->ldo + o;
	float	   *d1 = d0 + j->ldo;
	float	   *d2 = d1 + j->ldo;
	float	   *d3 = d2 + j->ldo;
	__m512		xs = _mm512_permutexvar_ps(spread,
										   _mm512_castps128_ps512(_mm_loadu_ps(j->xs + t)));
	__m512		v;

	GEMM_EPILOGUE(v, _mm512_cvtepi32_ps(sums), xs,
				  _mm512_broadcast_f32x4(_mm_loadu_ps(j->w->scale + o)), j->bias != NULL,
				  _mm512_broadcast_f32x4(_mm_loadu_ps(j->bias + o)), j->accumulate,
				  _mm512_insertf32x4(_mm512_insertf32x4(_mm512_insertf32x4(
																		   _mm512_castps128_ps512(_mm_loadu_ps(d0)), _mm_loadu_ps(d1), 1),
														_mm_loadu_ps(d2), 2),
									 _mm_loadu_ps(d3), 3));
	_mm_storeu_ps(d0, _mm512_castps512_ps128(v));
	_mm_storeu_ps(d1, _mm512_extractf32x4_ps(v, 1));
	_mm_storeu_ps(d2, _mm512_extractf32x4_ps(v, 2));
	_mm_storeu_ps(d3, _mm512_extractf32x4_ps(v, 3));
}

#define VNNI_TILE_CASE(NT_, NR_) \
	case (NT_) * 32 + (NR_): \
		sums = vnni_tile(x, w, rs, k, (NT_), (NR_), pf); \
		break

/* Any tile shape (edges): compute, then the scalar epilogue. */
static TARGET_AVX512 void
vnni_tile_edge(const gemm_i8_job *j, int t, int nt, int o, int nr)
{
	int			k = j->w->k;
	const int8_t *x = j->xq + (size_t) t * k;
	const int8_t *w = j->w->q + (size_t) o * k;
	const int32_t *rs = j->w->row_sum + o;
	const int8_t *pf = NULL;
	__m512i		sums;

	switch (nt * 32 + nr)
	{
			VNNI_TILE_CASE(1, 8);
			VNNI_TILE_CASE(1, 4);
			VNNI_TILE_CASE(1, 3);
			VNNI_TILE_CASE(1, 2);
			VNNI_TILE_CASE(1, 1);
			VNNI_TILE_CASE(2, 4);
			VNNI_TILE_CASE(2, 3);
			VNNI_TILE_CASE(2, 2);
			VNNI_TILE_CASE(2, 1);
			VNNI_TILE_CASE(3, 4);
			VNNI_TILE_CASE(3, 3);
			VNNI_TILE_CASE(3, 2);
			VNNI_TILE_CASE(3, 1);
			VNNI_TILE_CASE(4, 3);
			VNNI_TILE_CASE(4, 2);
			VNNI_TILE_CASE(4, 1);
		default:
			return;				/* not reached: the caller only asks for the shapes above */
	}
	vnni_epilogue_scalar(j, t, nt, o, nr, sums);
}

/* AVX-512 VNNI int8 kernel for one task's tile range. */
static TARGET_AVX512 void
gemm_i8_avx512(const gemm_i8_job *j, int t0, int t1, int o0, int o1)
{
	int			k = j->w->k;
	const int8_t *wq = j->w->q;
	const int32_t *rs = j->w->row_sum;

	if (t1 - t0 == 1)
	{
		const int8_t *x = j->xq + (size_t) t0 * k;
		int			o = o0;

		/*
		 * Decode: one token, 16 channels per step, prefetching the next 16 rows (contiguous,
		 * 16 * k bytes) while computing these; the last block prefetches nothing.
		 */
		for (; o + 16 <= o1; o += 16)
		{
			const int8_t *pf = o + 16 + PF_DECODE_ROWS <= o1 ?
				wq + (size_t) (o + PF_DECODE_ROWS) * k : NULL;
			__m512i		sums;

			if (pf)
				sums = vnni_tile(x, wq + (size_t) o * k, rs + o, k, 1, 16, pf);
			else
				sums = vnni_tile(x, wq + (size_t) o * k, rs + o, k, 1, 16, NULL);
			vnni_epilogue_1x16(j, t0, o, sums);
		}
		for (; o + 4 <= o1; o += 4)
			vnni_tile_edge(j, t0, 1, o, 4);
		if (o < o1)
			vnni_tile_edge(j, t0, 1, o, o1 - o);
		return;
	}

	/*
	 * Batches: for each group of 4 channels (2.3 KB of weights at k = 576, kept in L1) run over
	 * the token groups; the first token group prefetches the next 4 rows.
	 */
	for (int o = o0; o < o1; o += 4)
	{
		int			nr = o1 - o < 4 ? o1 - o : 4;

		if (nr < 4)
		{
			for (int t = t0; t < t1; t += 4)
				vnni_tile_edge(j, t, t1 - t < 4 ? t1 - t : 4, o, nr);
			continue;
		}
		for (int t = t0; t < t1; t += 4)
		{
			const int8_t *x = j->xq + (size_t) t * k;
			const int8_t *pf = (t == t0 && o + 4 + PF_BATCH_ROWS <= o1) ?
				wq + (size_t) (o + PF_BATCH_ROWS) * k : NULL;

			if (t1 - t >= 4)
			{
				__m512i		sums;

				if (pf)
					sums = vnni_tile(x, wq + (size_t) o * k, rs + o, k, 4, 4, pf);
				else
					sums = vnni_tile(x, wq + (size_t) o * k, rs + o, k, 4, 4, NULL);
				vnni_epilogue_4x4(j, t, o, sums);
			}
			else
				vnni_tile_edge(j, t, t1 - t, o, 4);
		}
	}
}

/* ---------------------------------------------------------------------------------------
 * AVX2
 *
 * No unsigned-by-signed dot product here beyond vpmaddubsw, so the sign trick: |x| (unsigned)
 * times sign(w, x) (w with x's sign) equals x * w; pairs of such products are summed to int16
 * by vpmaddubsw, which cannot saturate because |x|, |w| <= 127 (2 * 127 * 127 = 32258), and
 * vpmaddwd with ones widens pairs to int32.  Tiles of NT x NR <= 8 accumulators.
 * --------------------------------------------------------------------------------------- */

/* Lane j of the result = sum of v[j]'s 8 lanes. */
static inline __attribute__((always_inline)) TARGET_AVX2 __m256i
hsum8_epi32(const __m256i *v)
{
	__m256i		h01 = _mm256_hadd_epi32(v[0], v[1]);
	__m256i		h23 = _mm256_hadd_epi32(v[2], v[3]);
	__m256i		h45 = _mm256_hadd_epi32(v[4], v[5]);
	__m256i		h67 = _mm256_hadd_epi32(v[6], v[7]);
	__m256i		g0 = _mm256_hadd_epi32(h01, h23);	/* per 128-bit half: v0 v1 v2 v3 */
	__m256i		g1 = _mm256_hadd_epi32(h45, h67);	/* per 128-bit half: v4 v5 v6 v7 */

	return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20),
							_mm256_permute2x128_si256(g0, g1, 0x31));
}

/* One 32-byte step of an AVX2 tile: the sign trick for every token x channel pair. */
static inline __attribute__((always_inline)) TARGET_AVX2 void
avx2_i8_step(__m256i *acc, const int8_t *x, const int8_t *w, size_t k, int i, int NT, int NR,
			 __m256i ones)
{
	__m256i		xv[2],
				ax[2];

	for (int tt = 0; tt < NT; tt++)
	{
		xv[tt] = _mm256_loadu_si256((const __m256i *) (x + tt * k + i));
		ax[tt] = _mm256_abs_epi8(xv[tt]);
	}
	for (int r = 0; r < NR; r++)
	{
		__m256i		wv = _mm256_loadu_si256((const __m256i *) (w + r * k + i));

		for (int tt = 0; tt < NT; tt++)
		{
			__m256i		p = _mm256_maddubs_epi16(ax[tt], _mm256_sign_epi8(wv, xv[tt]));

			acc[tt * NR + r] = _mm256_add_epi32(acc[tt * NR + r], _mm256_madd_epi16(p, ones));
		}
	}
}

/*
 * One NT x NR tile (NT <= 2, NT * NR <= 8): the int32 dot products in lanes tt * NR + r,
 * prefetching the NR rows at pf (if not NULL) along the way.
 */
static inline __attribute__((always_inline)) TARGET_AVX2 __m256i
avx2_tile(const int8_t *x, const int8_t *w, int k, int NT, int NR, const int8_t *pf)
{
	__m256i		acc[8];
	const __m256i ones = _mm256_set1_epi16(1);
	int			i;

	for (int a = 0; a < 8; a++)
		acc[a] = _mm256_setzero_si256();
	for (i = 0; i + 32 <= k; i += 32)
	{
		if (pf && (i & 63) == 0)
			for (int r = 0; r < NR; r++)
				_mm_prefetch((const char *) (pf + (size_t) r * k + i), PF_HINT);
		avx2_i8_step(acc, x, w, k, i, NT, NR, ones);
	}
	if (i < k)
	{
		/* the tail (a multiple of 4 bytes) through zero-padded copies */
		int8_t		xt[2][32] = {{0}};
		int8_t		wt[8][32] = {{0}};

		for (int tt = 0; tt < NT; tt++)
			memcpy(xt[tt], x + (size_t) tt * k + i, k - i);
		for (int r = 0; r < NR; r++)
			memcpy(wt[r], w + (size_t) r * k + i, k - i);
		avx2_i8_step(acc, &xt[0][0], &wt[0][0], 32, 0, NT, NR, ones);
	}
	return hsum8_epi32(acc);
}

/* Vector epilogue of a 2 x 4 tile (lane tt * 4 + r). */
static inline __attribute__((always_inline)) TARGET_AVX2 void
avx2_epilogue_2x4(const gemm_i8_job *j, int t, int o, __m256i sums)
{
	float	   *d0 = j->out + (size_t) t * j->ldo + o;
	float	   *d1 = d0 + j->ldo;
	__m256		xs = _mm256_set_m128(_mm_set1_ps(j->xs[t + 1]), _mm_set1_ps(j->xs[t]));
	__m256		v;

	GEMM_EPILOGUE(v, _mm256_cvtepi32_ps(sums), xs,
				  _mm256_broadcast_ps((const __m128 *) (j->w->scale + o)), j->bias != NULL,
				  _mm256_broadcast_ps((const __m128 *) (j->bias + o)), j->accumulate,
				  _mm256_set_m128(_mm_loadu_ps(d1), _mm_loadu_ps(d0)));
	_mm_storeu_ps(d0, _mm256_castps256_ps128(v));
	_mm_storeu_ps(d1, _mm256_extractf128_ps(v, 1));
}

/* Vector epilogue of one token's 8 consecutive channels. */
static inline __attribute__((always_inline)) TARGET_AVX2 void
avx2_epilogue_1x8(const gemm_i8_job *j, int t, int o, __m256i sums)
{
	float	   *dst = j->out + (size_t) t * j->ldo + o;
	__m256		v;

	GEMM_EPILOGUE(v, _mm256_cvtepi32_ps(sums), _mm256_set1_ps(j->xs[t]),
				  _mm256_loadu_ps(j->w->scale + o), j->bias != NULL,
				  _mm256_loadu_ps(j->bias + o), j->accumulate, _mm256_loadu_ps(dst));
	_mm256_storeu_ps(dst, v);
}

#define AVX2_TILE_CASE(NT_, NR_) \
	case (NT_) * 32 + (NR_): \
		sums = avx2_tile(x, w, k, (NT_), (NR_), NULL); \
		break

/* Any tile shape (edges): compute, then the scalar epilogue. */
static TARGET_AVX2 void
avx2_tile_edge(const gemm_i8_job *j, int t, int nt, int o, int nr)
{
	int			k = j->w->k;
	const int8_t *x = j->xq + (size_t) t * k;
	const int8_t *w = j->w->q + (size_t) o * k;
	__m256i		sums;
	int32_t		acc[8];

	switch (nt * 32 + nr)
	{
			AVX2_TILE_CASE(1, 4);
			AVX2_TILE_CASE(1, 3);
			AVX2_TILE_CASE(1, 2);
			AVX2_TILE_CASE(1, 1);
			AVX2_TILE_CASE(2, 3);
			AVX2_TILE_CASE(2, 2);
			AVX2_TILE_CASE(2, 1);
		default:
			return;				/* not reached */
	}
	_mm256_storeu_si256((__m256i *) acc, sums);
	for (int tt = 0; tt < nt; tt++)
		for (int r = 0; r < nr; r++)
			gemm_epilogue(j->out + (size_t) (t + tt) * j->ldo + o + r, acc[tt * nr + r],
						  j->xs[t + tt], j->w->scale[o + r], j->bias, o + r, j->accumulate);
}

/* AVX2 int8 kernel for one task's tile range: 1 x 8 tiles for one token, else 2 x 4. */
static TARGET_AVX2 void
gemm_i8_avx2(const gemm_i8_job *j, int t0, int t1, int o0, int o1)
{
	int			k = j->w->k;
	const int8_t *wq = j->w->q;

	if (t1 - t0 == 1)
	{
		const int8_t *x = j->xq + (size_t) t0 * k;
		int			o = o0;

		/* decode: 8 channels per step, prefetching 8 rows PF_DECODE_ROWS ahead */
		for (; o + 8 <= o1; o += 8)
		{
			const int8_t *pf = o + 8 + PF_DECODE_ROWS <= o1 ?
				wq + (size_t) (o + PF_DECODE_ROWS) * k : NULL;
			__m256i		sums;

			if (pf)
				sums = avx2_tile(x, wq + (size_t) o * k, k, 1, 8, pf);
			else
				sums = avx2_tile(x, wq + (size_t) o * k, k, 1, 8, NULL);
			avx2_epilogue_1x8(j, t0, o, sums);
		}
		for (; o + 4 <= o1; o += 4)
			avx2_tile_edge(j, t0, 1, o, 4);
		if (o < o1)
			avx2_tile_edge(j, t0, 1, o, o1 - o);
		return;
	}
	for (int o = o0; o < o1; o += 4)
	{
		int			nr = o1 - o < 4 ? o1 - o : 4;

		for (int t = t0; t < t1; t += 2)
		{
			if (nr == 4 && t1 - t >= 2)
			{
				const int8_t *pf = (t == t0 && o + 4 + PF_BATCH_ROWS <= o1) ?
					wq + (size_t) (o + PF_BATCH_ROWS) * k : NULL;
				__m256i		sums;

				if (pf)
					sums = avx2_tile(j->xq + (size_t) t * k, wq + (size_t) o * k, k, 2, 4, pf);
				else
					sums = avx2_tile(j->xq + (size_t) t * k, wq + (size_t) o * k, k, 2, 4, NULL);
				avx2_epilogue_2x4(j, t, o, sums);
			}
			else
				avx2_tile_edge(j, t, t1 - t < 2 ? t1 - t : 2, o, nr);
		}
	}
}

/* ---------------------------------------------------------------------------------------
 * Float reference kernels with FMA.  Both widths realize the same order as dot_f32_generic:
 * 16 lanes (one zmm, or two ymm holding lanes 0-7 and 8-15) accumulated with FMA, the tree
 * l + 8, + 4, + 2, + 1, then the tail with scalar FMA.  So AVX2 and AVX-512 agree bit for bit.
 * --------------------------------------------------------------------------------------- */

/* The tree on lanes 0-7 already holding s[l] + s[l + 8]. */
static inline __attribute__((always_inline)) TARGET_AVX2 float
tree8_ps(__m256 v)
{
	__m128		a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	a = _mm_add_ps(a, _mm_movehl_ps(a, a));
	a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
	return _mm_cvtss_f32(a);
}

/* The tail elements past the last multiple of 16, in order, with FMA. */
static inline __attribute__((always_inline)) TARGET_AVX2 float
dot_tail_fma(float sum, const float *x, const float *w, int from, int k)
{
	for (int i = from; i < k; i++)
		sum = fmaf(x[i], w[i], sum);
	return sum;
}

/* NT x NR tile (NT * NR <= 16) of float dot products, AVX-512. */
static inline __attribute__((always_inline)) TARGET_AVX512 void
f32_tile_avx512(const float *x, const float *w, int k, int NT, int NR, float *dots)
{
	__m512		acc[16];
	int			k16 = k & ~15;

	for (int a = 0; a < NT * NR; a++)
		acc[a] = _mm512_setzero_ps();
	for (int i = 0; i < k16; i += 16)
	{
		__m512		xv[4];

		for (int tt = 0; tt < NT; tt++)
			xv[tt] = _mm512_loadu_ps(x + (size_t) tt * k + i);
		for (int r = 0; r < NR; r++)
		{
			__m512		wv = _mm512_loadu_ps(w + (size_t) r * k + i);

			for (int tt = 0; tt < NT; tt++)
				acc[tt * NR + r] = _mm512_fmadd_ps(xv[tt], wv, acc[tt * NR + r]);
		}
	}
	for (int tt = 0; tt < NT; tt++)
		for (int r = 0; r < NR; r++)
		{
			__m512		v = acc[tt * NR + r];
			__m256		h = _mm256_add_ps(_mm512_castps512_ps256(v),
										  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));

			dots[tt * NR + r] = dot_tail_fma(tree8_ps(h), x + (size_t) tt * k,
											 w + (size_t) r * k, k16, k);
		}
}

#define F32_512_CASE(NT_, NR_) \
	case (NT_) * 32 + (NR_): \
		f32_tile_avx512(x, w, k, (NT_), (NR_), dots); \
		break

/* AVX-512 float kernel: 4 x 4 tiles. */
static TARGET_AVX512 void
gemm_f32_avx512(const gemm_f32_job *j, int t0, int t1, int o0, int o1)
{
	int			k = j->k;

	for (int o = o0; o < o1; o += 4)
	{
		int			nr = o1 - o < 4 ? o1 - o : 4;

		for (int t = t0; t < t1; t += 4)
		{
			int			nt = t1 - t < 4 ? t1 - t : 4;
			const float *x = j->x + (size_t) t * k;
			const float *w = j->w + (size_t) o * k;
			float		dots[16];

			switch (nt * 32 + nr)
			{
					F32_512_CASE(1, 1);
					F32_512_CASE(1, 2);
					F32_512_CASE(1, 3);
					F32_512_CASE(1, 4);
					F32_512_CASE(2, 1);
					F32_512_CASE(2, 2);
					F32_512_CASE(2, 3);
					F32_512_CASE(2, 4);
					F32_512_CASE(3, 1);
					F32_512_CASE(3, 2);
					F32_512_CASE(3, 3);
					F32_512_CASE(3, 4);
					F32_512_CASE(4, 1);
					F32_512_CASE(4, 2);
					F32_512_CASE(4, 3);
					F32_512_CASE(4, 4);
				default:
					return;		/* not reached */
			}
			for (int tt = 0; tt < nt; tt++)
				for (int r = 0; r < nr; r++)
					gemm_f32_epilogue(j->out + (size_t) (t + tt) * j->ldo + o + r,
									  dots[tt * nr + r], j->bias, o + r, j->accumulate);
		}
	}
}

/* NT x NR tile (NT * NR <= 4) of float dot products, AVX2 (two ymm per dot product). */
static inline __attribute__((always_inline)) TARGET_AVX2 void
f32_tile_avx2(const float *x, const float *w, int k, int NT, int NR, float *dots)
{
	__m256		lo[4],
				hi[4];
	int			k16 = k & ~15;

	for (int a = 0; a < NT * NR; a++)
		lo[a] = hi[a] = _mm256_setzero_ps();
	for (int i = 0; i < k16; i += 16)
	{
		__m256		xl[2],
					xh[2];

		for (int tt = 0; tt < NT; tt++)
		{
			xl[tt] = _mm256_loadu_ps(x + (size_t) tt * k + i);
			xh[tt] = _mm256_loadu_ps(x + (size_t) tt * k + i + 8);
		}
		for (int r = 0; r < NR; r++)
		{
			__m256		wl = _mm256_loadu_ps(w + (size_t) r * k + i);
			__m256		wh = _mm256_loadu_ps(w + (size_t) r * k + i + 8);

			for (int tt = 0; tt < NT; tt++)
			{
				lo[tt * NR + r] = _mm256_fmadd_ps(xl[tt], wl, lo[tt * NR + r]);
				hi[tt * NR + r] = _mm256_fmadd_ps(xh[tt], wh, hi[tt * NR + r]);
			}
		}
	}
	for (int tt = 0; tt < NT; tt++)
		for (int r = 0; r < NR; r++)
			dots[tt * NR + r] = dot_tail_fma(tree8_ps(_mm256_add_ps(lo[tt * NR + r],
																	hi[tt * NR + r])),
											 x + (size_t) tt * k, w + (size_t) r * k, k16, k);
}

#define F32_256_CASE(NT_, NR_) \
	case (NT_) * 32 + (NR_): \
		f32_tile_avx2(x, w, k, (NT_), (NR_), dots); \
		break

/* AVX2 float kernel: 2 x 2 tiles. */
static TARGET_AVX2 void
gemm_f32_avx2(const gemm_f32_job *j, int t0, int t1, int o0, int o1)
{
	int			k = j->k;

	for (int o = o0; o < o1; o += 2)
	{
		int			nr = o1 - o < 2 ? o1 - o : 2;

		for (int t = t0; t < t1; t += 2)
		{
			int			nt = t1 - t < 2 ? t1 - t : 2;
			const float *x = j->x + (size_t) t * k;
			const float *w = j->w + (size_t) o * k;
			float		dots[4];

			switch (nt * 32 + nr)
			{
					F32_256_CASE(1, 1);
					F32_256_CASE(1, 2);
					F32_256_CASE(2, 1);
					F32_256_CASE(2, 2);
				default:
					return;		/* not reached */
			}
			for (int tt = 0; tt < nt; tt++)
				for (int r = 0; r < nr; r++)
					gemm_f32_epilogue(j->out + (size_t) (t + tt) * j->ldo + o + r,
									  dots[tt * nr + r], j->bias, o + r, j->accumulate);
		}
	}
}

/* ---------------------------------------------------------------------------------------
 * Activation quantization, vectorized.  The maximum is exact in any order, and the per-element
 * operations are the scalar ones lane by lane: multiply by the same inverse, vmaxps/vminps with
 * the clamp constants as second operand (NaN -> -127, as in quantize_one), round to nearest
 * even.  So every path writes the same bytes.
 * --------------------------------------------------------------------------------------- */

/* One token's row, AVX-512. */
static TARGET_AVX512 void
quantize_row_avx512(const float *x, int k, int8_t *q, float *s)
{
	__m512		m = _mm512_setzero_ps();
	float		amax,
				inv;
	int			i;

	for (i = 0; i + 16 <= k; i += 16)
		m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i)), m);
	if (i < k)
	{
		__mmask16	tm = (__mmask16) ((1u << (k - i)) - 1);

		m = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(tm, x + i)), m);
	}
	amax = _mm512_reduce_max_ps(m);
	if (!row_scale(amax, s, &inv))
	{
		*s = 0.0f;
		memset(q, 0, k);
		return;
	}
	{
		const __m512 vinv = _mm512_set1_ps(inv);
		const __m512 lo = _mm512_set1_ps(-127.0f);
		const __m512 hi = _mm512_set1_ps(127.0f);

		for (i = 0; i + 16 <= k; i += 16)
		{
			__m512		v = _mm512_mul_ps(_mm512_loadu_ps(x + i), vinv);

			v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
			_mm_storeu_si128((__m128i *) (q + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
		}
		for (; i < k; i++)
			q[i] = quantize_one(x[i], inv);
	}
}

/* One token's row, AVX2. */
static TARGET_AVX2 void
quantize_row_avx2(const float *x, int k, int8_t *q, float *s)
{
	const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	__m256		m = _mm256_setzero_ps();
	__m128		m4;
	float		amax,
				inv;
	int			i;

	for (i = 0; i + 8 <= k; i += 8)
		m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask), m);
	m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
	m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
	m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
	amax = _mm_cvtss_f32(m4);
	for (; i < k; i++)
	{
		float		a = fabsf(x[i]);

		amax = a > amax ? a : amax;
	}
	if (!row_scale(amax, s, &inv))
	{
		*s = 0.0f;
		memset(q, 0, k);
		return;
	}
	{
		const __m256 vinv = _mm256_set1_ps(inv);
		const __m256 lo = _mm256_set1_ps(-127.0f);
		const __m256 hi = _mm256_set1_ps(127.0f);

		for (i = 0; i + 16 <= k; i += 16)
		{
			__m256		a = _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv);
			__m256		b = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vinv);
			__m256i		ia,
						ib;
			__m128i		w16;

			a = _mm256_min_ps(_mm256_max_ps(a, lo), hi);
			b = _mm256_min_ps(_mm256_max_ps(b, lo), hi);
			ia = _mm256_cvtps_epi32(a);
			ib = _mm256_cvtps_epi32(b);
			/* packs work within 128-bit halves: a0-3 b0-3 a4-7 b4-7, fixed by the permute */
			ia = _mm256_permute4x64_epi64(_mm256_packs_epi32(ia, ib), 0xD8);
			w16 = _mm_packs_epi16(_mm256_castsi256_si128(ia), _mm256_extracti128_si256(ia, 1));
			_mm_storeu_si128((__m128i *) (q + i), w16);
		}
		for (; i < k; i++)
			q[i] = quantize_one(x[i], inv);
	}
}

#endif							/* __x86_64__ */

/* ---------------------------------------------------------------------------------------
 * Work splitting
 * --------------------------------------------------------------------------------------- */

typedef struct gemm_split
{
	int			n_tok;
	int			n_out;
	int			tok_block;
	int			row_block;
	int			n_row_blocks;
} gemm_split;

/*
 * Chooses the tiles handed to the pool: channel blocks that are multiples of 16 (the kernels'
 * row groups) sized for about four tasks per thread, and token blocks for large batches so that
 * a task's activations stay in cache.  The split never changes results.
 */
static void
plan_split(gemm_split *sp, int n_tok, int n_out, int n_threads)
{
	int			want_tasks = n_threads > 1 ? 4 * n_threads : 1;
	int			rb;

	sp->n_tok = n_tok;
	sp->n_out = n_out;
	sp->tok_block = n_tok > 64 ? 64 : n_tok;
	rb = (n_out + want_tasks - 1) / want_tasks;
	rb = (rb + 15) & ~15;
	if (rb < 16)
		rb = 16;
	if (n_threads == 1 && n_tok > 64)
		rb = 64;
	sp->row_block = rb;
	sp->n_row_blocks = (n_out + rb - 1) / rb;
}

static int
split_tasks(const gemm_split *sp)
{
	return sp->n_row_blocks * ((sp->n_tok + sp->tok_block - 1) / sp->tok_block);
}

static void
split_tile(const gemm_split *sp, int task, int *t0, int *t1, int *o0, int *o1)
{
	int			rb = task % sp->n_row_blocks;
	int			tb = task / sp->n_row_blocks;

	*o0 = rb * sp->row_block;
	*o1 = *o0 + sp->row_block < sp->n_out ? *o0 + sp->row_block : sp->n_out;
	*t0 = tb * sp->tok_block;
	*t1 = *t0 + sp->tok_block < sp->n_tok ? *t0 + sp->tok_block : sp->n_tok;
}

typedef struct gemm_i8_task
{
	gemm_i8_job job;
	gemm_split	split;
	gemm_i8_kernel kernel;
} gemm_i8_task;

typedef struct gemm_f32_task
{
	gemm_f32_job job;
	gemm_split	split;
	gemm_f32_kernel kernel;
} gemm_f32_task;

/* Pool task: one tile of the split. */
static void
run_i8_task(void *arg, int task, int thread)
{
	gemm_i8_task *gt = arg;
	int			t0,
				t1,
				o0,
				o1;

	split_tile(&gt->split, task, &t0, &t1, &o0, &o1);
	gt->kernel(&gt->job, t0, t1, o0, o1);
}

static void
run_f32_task(void *arg, int task, int thread)
{
	gemm_f32_task *gt = arg;
	int			t0,
				t1,
				o0,
				o1;

	split_tile(&gt->split, task, &t0, &t1, &o0, &o1);
	gt->kernel(&gt->job, t0, t1, o0, o1);
}

/* W8A8 GEMM with the fused epilogue (gemm.h): picks the ISA's kernel and spreads tiles. */
void
cai_gemm_i8(cai_threadpool *pool, const int8_t *xq, const float *xs, int n_tok,
			const cai_qmatrix *w, const float *bias, float *out, int ldo, bool accumulate)
{
	gemm_i8_task gt;

	if (n_tok <= 0 || w->n_out <= 0)
		return;
	gt.job = (gemm_i8_job) {xq, xs, n_tok, w, bias, out, ldo, accumulate};
	switch (current_isa())
	{
#if defined(__x86_64__)
		case ISA_AVX512_VNNI:
			gt.kernel = gemm_i8_avx512;
			break;
		case ISA_AVX2:
			gt.kernel = gemm_i8_avx2;
			break;
#endif
		default:
			gt.kernel = gemm_i8_generic;
			break;
	}
	plan_split(&gt.split, n_tok, w->n_out, cai_threadpool_size(pool));
	cai_threadpool_run(pool, run_i8_task, &gt, split_tasks(&gt.split));
}

/* The float reference GEMM (gemm.h), in the fixed summation order of dot_f32_generic. */
void
cai_gemm_f32(cai_threadpool *pool, const float *x, int n_tok, int k,
			 const float *w, int n_out, const float *bias, float *out, int ldo,
			 bool accumulate)
{
	gemm_f32_task gt;

	if (n_tok <= 0 || n_out <= 0)
		return;
	gt.job = (gemm_f32_job) {x, n_tok, k, w, n_out, bias, out, ldo, accumulate};
	switch (current_isa())
	{
#if defined(__x86_64__)
		case ISA_AVX512_VNNI:
			gt.kernel = gemm_f32_avx512;
			break;
		case ISA_AVX2:
			gt.kernel = gemm_f32_avx2;
			break;
#endif
		default:
			gt.kernel = gemm_f32_generic;
			break;
	}
	plan_split(&gt.split, n_tok, n_out, cai_threadpool_size(pool));
	cai_threadpool_run(pool, run_f32_task, &gt, split_tasks(&gt.split));
}

/* Quantizes n_tok rows of k activations (see gemm.h; rounding in quantize_one). */
void
cai_quantize_act_i8(const float *x, int n_tok, int k, int8_t *q, float *s)
{
	void		(*row) (const float *, int, int8_t *, float *) = quantize_row_generic;

	switch (current_isa())
	{
#if defined(__x86_64__)
		case ISA_AVX512_VNNI:
			row = quantize_row_avx512;
			break;
		case ISA_AVX2:
			row = quantize_row_avx2;
			break;
#endif
		default:
			break;
	}
	for (int t = 0; t < n_tok; t++)
		row(x + (size_t) t * k, k, q + (size_t) t * k, s + t);
}
