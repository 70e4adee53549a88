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
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
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

/*
 * ISA_AVX512_AMX is ISA_AVX512_VNNI with AMX int8 tiles for the int8 GEMM's whole tiles and
 * the attention's scores (the same integers).  ISA_AVX_VNNI is ISA_AVX2 with the block GEMM's
 * 256-bit vpdpbusd kernels (gemm_blocks_avxvnni.c), for CPUs that have AVX-VNNI but no AVX-512;
 * its int8 GEMM, float GEMM and quantization are the AVX2 ones.
 */
typedef enum gemm_isa
{
	ISA_UNSET = 0,
	ISA_GENERIC,
	ISA_AVX2,
	ISA_AVX512_VNNI,
	ISA_AVX512_AMX,
	ISA_AVX_VNNI,
} gemm_isa;

/*
 * The path in use.  This is process-wide on purpose: it describes the CPU, is computed once,
 * and is only changed by tests through cai_cpu_force_isa.
 */
static _Atomic int selected_isa = ISA_UNSET;

#if defined(__x86_64__) && defined(__linux__)
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/*
 * AMX int8 tiles: the CPU must have them (CPUID leaf 7: AMX-TILE and AMX-INT8), the OS must
 * manage their state (XCR0 bits 17 and 18), and Linux lends the 8 KB of tile data only to a
 * process that asks (arch_prctl ARCH_REQ_XCOMP_PERM; the grant covers all its threads).
 * Anything missing leaves the process on avx512-vnni, which gives the same integers.
 */
static bool
amx_int8_available(void)
{
	unsigned int a,
				b,
				c,
				d;
	uint32_t	xcr0_lo,
				xcr0_hi;

	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE))
		return false;
	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25)))
		return false;
	__asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
	if ((xcr0_lo & (3u << 17)) != (3u << 17))
		return false;
	return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}
#endif

#if defined(__x86_64__)
/*
 * AVX-VNNI (CPUID leaf 7 subleaf 1, EAX bit 4) and F16C from CPUID itself: not every compiler's
 * __builtin_cpu_supports knows their names.  The OS's saving of the ymm state is what AVX2's
 * own check already covers.
 */
static bool
avx_vnni_available(void)
{
	unsigned int a,
				b,
				c,
				d;

	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_F16C))
		return false;
	return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4)) != 0;
}
#endif

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
		case ISA_AVX_VNNI:
			return isa_available(ISA_AVX2) && avx_vnni_available();
#if defined(__linux__)
		case ISA_AVX512_AMX:
			return isa_available(ISA_AVX512_VNNI) && amx_int8_available();
#endif
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
		if (isa_available(ISA_AVX512_AMX))
			isa = ISA_AVX512_AMX;
		else if (isa_available(ISA_AVX512_VNNI))
			isa = ISA_AVX512_VNNI;
		else if (isa_available(ISA_AVX_VNNI))
			isa = ISA_AVX_VNNI;
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
		case ISA_AVX512_AMX:
			return "avx512-amx";
		case ISA_AVX512_VNNI:
			return "avx512-vnni";
		case ISA_AVX_VNNI:
			return "avx-vnni";
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

static const gemm_isa all_isas[] = {ISA_GENERIC, ISA_AVX2, ISA_AVX_VNNI, ISA_AVX512_VNNI,
	ISA_AVX512_AMX};

bool
cai_cpu_isa_known(const char *name)
{
	for (size_t i = 0; name && i < sizeof(all_isas) / sizeof(all_isas[0]); i++)
		if (strcmp(name, isa_name(all_isas[i])) == 0)
			return true;
	return false;
}

/* Switches to the named path if this CPU has it. */
bool
cai_cpu_force_isa(const char *name)
{
	for (size_t i = 0; name && i < sizeof(all_isas) / sizeof(all_isas[0]); i++)
	{
		if (strcmp(name, isa_name(all_isas[i])) == 0)
		{
			if (!isa_available(all_isas[i]))
				return false;
			atomic_store_explicit(&selected_isa, all_isas[i], memory_order_relaxed);
			return true;
		}
	}
	return false;
}

/* ---------------------------------------------------------------------------------------
 * Weight preparation and activation quantization
 * --------------------------------------------------------------------------------------- */

/*
 * Packs a row-major matrix in place (the layout: gemm.h).  A panel's packed bytes occupy the
 * bytes its rows did, so one panel of scratch suffices.
 */
bool
cai_cpu_qmatrix_pack(cai_cpu_qmatrix *m)
{
	const int	k = m->k;
	int8_t	   *rows;

	if (m->packed || m->n_out <= 0 || k <= 0 || k % 4 != 0)
		return true;			/* nothing to do, or stays row-major (the generic kernel) */
	rows = malloc((size_t) CAI_QMATRIX_PANEL * k);
	if (!rows)
		return false;
	for (int p = 0; p * CAI_QMATRIX_PANEL < m->n_out; p++)
	{
		int			r = cai_cpu_qmatrix_panel_width(m, p);
		uint8_t    *base = (uint8_t *) m->q + (size_t) p * CAI_QMATRIX_PANEL * k;

		memcpy(rows, base, (size_t) r * k);
		for (int g = 0; g < k / 4; g++)
			for (int c = 0; c < r; c++)
				for (int b = 0; b < 4; b++)
					base[(size_t) g * 4 * r + 4 * c + b] =
						(uint8_t) rows[(size_t) c * k + 4 * g + b] ^ 0x80;
	}
	free(rows);
	m->packed = true;
	return true;
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
	const cai_cpu_qmatrix *w;
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

/* Portable int8 kernel for row-major matrices: one int32 dot product per output. */
static void
gemm_i8_rowmajor(const gemm_i8_job *j, int t0, int t1, int o0, int o1)
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

/* Portable int8 kernel over the panel layout: 16 int32 sums per token and panel. */
static void
gemm_i8_generic(const gemm_i8_job *j, int t0, int t1, int o0, int o1)
{
	const int	k = j->w->k;

	for (int o = o0; o < o1; o += CAI_QMATRIX_PANEL)
	{
		int			r = cai_cpu_qmatrix_panel_width(j->w, o / CAI_QMATRIX_PANEL);
		const uint8_t *base = (const uint8_t *) j->w->q + (size_t) o * k;

		for (int t = t0; t < t1; t++)
		{
			const int8_t *x = j->xq + (size_t) t * k;
			int32_t		acc[CAI_QMATRIX_PANEL] = {0};

			for (int g = 0; g < k / 4; g++)
			{
				const uint8_t *wg = base + (size_t) g * 4 * r;

				for (int c = 0; c < r; c++)
					for (int b = 0; b < 4; b++)
						acc[c] += (int32_t) x[4 * g + b] * (int8_t) (wg[4 * c + b] ^ 0x80);
			}
			for (int c = 0; c < r; c++)
				gemm_epilogue(j->out + (size_t) t * j->ldo + o + c, acc[c], j->xs[t],
							  j->w->scale[o + c], j->bias, o + c, j->accumulate);
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
 * AVX-512 VNNI over the panel layout
 *
 * vpdpbusd multiplies unsigned bytes by signed bytes, summing groups of 4 into int32 lanes.
 * The packed weights are stored biased (w ^ 0x80 == w + 128 as an unsigned byte), so one
 * 64-byte load is 16 channels x 4 inputs of unsigned operands, and the 4 activation bytes of
 * one token broadcast to every lane are the signed ones: lane c accumulates
 * sum (w + 128) * x = sum w * x + 128 * sum x, and the token's sum of x (xsum, computed once
 * per task) is subtracted in the epilogue.  No horizontal reduction: each accumulator already
 * holds 16 channels' dot products.  The arithmetic wraps modulo 2^32, so the result is exact
 * whenever every partial sum fits (k * 255 * 127 < 2^31, i.e. k < 66,000).
 *
 * Tiles are NT tokens x NB panels (NT <= 4, NB <= VNNI_GROUP_PANELS), fully unrolled for
 * constant NT and NB.  Each 4-input step loads NB weight vectors and NT broadcasts and issues
 * NT * NB vpdpbusd.  A group of VNNI_GROUP_PANELS panels stays in L1 while the kernel runs over
 * all the task's tokens, and its token tiles share the prefetching of the next group (each a
 * slice of it, so that the memory stays busy when a few tokens make the product memory-bound,
 * as at 8 tokens).  One token (decode) is the NT = 1 case, streaming the group's panels.
 *
 * Measured on the 2-core EPYC (Zen 4, 3.7 GHz, one 512-bit vpdpbusd per cycle per core: peak
 * 473 int8 GOPS per core), against the row-major 4 x 4 dot-product tiles with a transposing
 * reduction this replaced: bench_gemm 10-18% more GOPS per core on the layers' shapes (e.g.
 * 576 -> 576 at 32 tokens 368 -> 425), and in `cai bench` on SmolLM2 with 2 threads prefill
 * 1950 -> 2120 tokens/s, batch-1 decode 225 -> 254, batch-32 1690 -> 1735 (alternating runs).
 * --------------------------------------------------------------------------------------- */
#if defined(__x86_64__)

#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))
#define TARGET_AVX2 __attribute__((target("avx2,fma")))

/*
 * Software prefetch of weights ahead of use.  Weights are streamed from DRAM once per call
 * (the model is far bigger than the caches), and the hardware prefetcher alone leaves a core at
 * about half of the bandwidth it can pull: prefetching into L2 (T1; the L2 can track more misses
 * than L1) one tile group ahead measured about 1.8x the single-thread decode bandwidth of no
 * prefetch or of prefetching into L1 on the 2-core EPYC (Zen 4) this was tuned on.
 */
#define PF_HINT _MM_HINT_T1

/*
 * Panels per group: 2 (32 channels, 18 KB of weights at k = 576, which L1 keeps beside the
 * activations).  Groups of 3 or 4 panels issue fewer loads per vpdpbusd but spill to L2: in
 * `cai bench` they measured 4-8% slower prefill.
 */
#define VNNI_GROUP_PANELS 2

/* Tokens per xsum batch (a task's token block is at most 64, see plan_split). */
#define XSUM_TOKENS 64

/* xsum[t] = sum of token t's k activation bytes, for n tokens. */
static TARGET_AVX512 void
vnni_token_sums(const int8_t *x, int k, int n, int32_t *xsum)
{
	const __m512i ones = _mm512_set1_epi8(1);

	for (int t = 0; t < n; t++)
	{
		const int8_t *row = x + (size_t) t * k;
		__m512i		s = _mm512_setzero_si512();
		int			i;

		for (i = 0; i + 64 <= k; i += 64)
			s = _mm512_dpbusd_epi32(s, ones, _mm512_loadu_si512(row + i));
		if (i < k)
			s = _mm512_dpbusd_epi32(s, ones,
									_mm512_maskz_loadu_epi8((~0ULL) >> (64 - (k - i)), row + i));
		xsum[t] = _mm512_reduce_add_epi32(s);
	}
}

/*
 * acc[tt * NB + b] = the biased dot products of tokens x[tt] with the NB full panels at w
 * (consecutive, 16 * k bytes each).  Of the NB panels at pf (if not NULL), steps [pf_g0, pf_g1)
 * are prefetched: the tiles of a group share the next group's prefetching, so that memory
 * stays busy while every tile computes.
 */
static inline __attribute__((always_inline)) TARGET_AVX512 void
vnni_panels(const int8_t *x, const uint8_t *w, int k, int NT, int NB, const uint8_t *pf,
			int pf_g0, int pf_g1, __m512i *acc)
{
	const size_t ps = (size_t) CAI_QMATRIX_PANEL * k;

	for (int a = 0; a < NT * NB; a++)
		acc[a] = _mm512_setzero_si512();
	for (int g = 0; g < k / 4; g++)
	{
		__m512i		wv[VNNI_GROUP_PANELS];

#pragma GCC unroll 4
		for (int b = 0; b < NB; b++)
		{
			wv[b] = _mm512_loadu_si512(w + b * ps + (size_t) g * 64);
			if (pf && g >= pf_g0 && g < pf_g1)
				_mm_prefetch((const char *) (pf + b * ps + (size_t) g * 64), PF_HINT);
		}
#pragma GCC unroll 4
		for (int tt = 0; tt < NT; tt++)
		{
			int32_t		x4;
			__m512i		xb;

			memcpy(&x4, x + (size_t) tt * k + 4 * g, 4);
			xb = _mm512_set1_epi32(x4);
#pragma GCC unroll 4
			for (int b = 0; b < NB; b++)
				acc[tt * NB + b] = _mm512_dpbusd_epi32(acc[tt * NB + b], wv[b], xb);
		}
	}
}

/* The same for one panel of width r < 16 (the matrix's last): 4 * r bytes per step. */
static inline __attribute__((always_inline)) TARGET_AVX512 void
vnni_partial_panel(const int8_t *x, const uint8_t *w, int k, int r, int NT, __m512i *acc)
{
	const __mmask16 m = (__mmask16) ((1u << r) - 1);

	for (int tt = 0; tt < NT; tt++)
		acc[tt] = _mm512_setzero_si512();
	for (int g = 0; g < k / 4; g++)
	{
		__m512i		wv = _mm512_maskz_loadu_epi32(m, w + (size_t) g * 4 * r);

		for (int tt = 0; tt < NT; tt++)
		{
			int32_t		x4;

			memcpy(&x4, x + (size_t) tt * k + 4 * g, 4);
			acc[tt] = _mm512_dpbusd_epi32(acc[tt], wv, _mm512_set1_epi32(x4));
		}
	}
}

/* The epilogue of token t's channels o.. (the lanes in m) from a biased accumulator. */
static inline __attribute__((always_inline)) TARGET_AVX512 void
vnni_epilogue(const gemm_i8_job *j, int t, int o, __m512i acc, int32_t xsum, __mmask16 m)
{
	float	   *dst = j->out + (size_t) t * j->ldo + o;
	__m512i		sums = _mm512_sub_epi32(acc, _mm512_set1_epi32((int32_t) ((uint32_t) xsum << 7)));
	__m512		v;

	GEMM_EPILOGUE(v, _mm512_cvtepi32_ps(sums), _mm512_set1_ps(j->xs[t]),
				  _mm512_maskz_loadu_ps(m, j->w->scale + o), j->bias != NULL,
				  _mm512_maskz_loadu_ps(m, j->bias + o), j->accumulate,
				  _mm512_maskz_loadu_ps(m, dst));
	_mm512_mask_storeu_ps(dst, m, v);
}

/* One NT x NB tile of full panels: tokens t.., channels o.., then its epilogue. */
static inline __attribute__((always_inline)) TARGET_AVX512 void
vnni_tile(const gemm_i8_job *j, int t, int o, int NT, int NB, const int32_t *xsum,
		  const uint8_t *pf, int pf_g0, int pf_g1)
{
	const int	k = j->w->k;
	__m512i		acc[4 * VNNI_GROUP_PANELS];

	vnni_panels(j->xq + (size_t) t * k, (const uint8_t *) j->w->q + (size_t) o * k, k, NT, NB,
				pf, pf_g0, pf_g1, acc);
	for (int tt = 0; tt < NT; tt++)
		for (int b = 0; b < NB; b++)
			vnni_epilogue(j, t + tt, o + b * CAI_QMATRIX_PANEL, acc[tt * NB + b], xsum[tt],
						  (__mmask16) 0xFFFF);
}

#define VNNI_TILE_CASE(NT_, NB_) \
	case (NT_) * 8 + (NB_): \
		if (pf) \
			vnni_tile(j, t, o, (NT_), (NB_), xsum, pf, pf_g0, pf_g1); \
		else \
			vnni_tile(j, t, o, (NT_), (NB_), xsum, NULL, 0, 0); \
		break

/* A tile of nt <= 4 tokens x nb <= 2 full panels (the shape picks an unrolled instance). */
static TARGET_AVX512 void
vnni_tile_any(const gemm_i8_job *j, int t, int nt, int o, int nb, const int32_t *xsum,
			  const uint8_t *pf, int pf_g0, int pf_g1)
{
	switch (nt * 8 + nb)
	{
			VNNI_TILE_CASE(1, 1);
			VNNI_TILE_CASE(1, 2);
			VNNI_TILE_CASE(2, 1);
			VNNI_TILE_CASE(2, 2);
			VNNI_TILE_CASE(3, 1);
			VNNI_TILE_CASE(3, 2);
			VNNI_TILE_CASE(4, 1);
			VNNI_TILE_CASE(4, 2);
		default:
			break;				/* not reached: the caller keeps nt in 1..4, nb in 1..2 */
	}
}

/* Tokens t.. (nt <= 4) against the last panel, of r < 16 channels at o. */
static TARGET_AVX512 void
vnni_tile_partial(const gemm_i8_job *j, int t, int nt, int o, int r, const int32_t *xsum)
{
	const int	k = j->w->k;
	const int8_t *x = j->xq + (size_t) t * k;
	const uint8_t *w = (const uint8_t *) j->w->q + (size_t) o * k;
	__m512i		acc[4];

	switch (nt)
	{
		case 1:
			vnni_partial_panel(x, w, k, r, 1, acc);
			break;
		case 2:
			vnni_partial_panel(x, w, k, r, 2, acc);
			break;
		case 3:
			vnni_partial_panel(x, w, k, r, 3, acc);
			break;
		default:
			vnni_partial_panel(x, w, k, r, 4, acc);
			break;
	}
	for (int tt = 0; tt < nt; tt++)
		vnni_epilogue(j, t + tt, o, acc[tt], xsum[tt], (__mmask16) ((1u << r) - 1));
}

/* AVX-512 VNNI kernel for one task's tile range (o0 is a panel boundary). */
static TARGET_AVX512 void
gemm_i8_avx512(const gemm_i8_job *j, int t0, int t1, int o0, int o1)
{
	const int	k = j->w->k;
	const int	group = VNNI_GROUP_PANELS * CAI_QMATRIX_PANEL;
	const int	full_end = o1 - (o1 - o0) % CAI_QMATRIX_PANEL;	/* past the full panels */
	const uint8_t *wq = (const uint8_t *) j->w->q;
	int32_t		xsum[XSUM_TOKENS];

	for (int tc = t0; tc < t1; tc += XSUM_TOKENS)
	{
		int			tce = tc + XSUM_TOKENS < t1 ? tc + XSUM_TOKENS : t1;
		int			n_tiles = (tce - tc + 3) / 4;
		int			o = o0;

		vnni_token_sums(j->xq + (size_t) tc * k, k, tce - tc, xsum);
		for (; o < full_end; o += group)
		{
			int			nb = (full_end - o) / CAI_QMATRIX_PANEL;
			const uint8_t *pf = o + 2 * group <= full_end ? wq + (size_t) (o + group) * k : NULL;

			nb = nb < VNNI_GROUP_PANELS ? nb : VNNI_GROUP_PANELS;
			for (int t = tc; t < tce; t += 4)
			{
				int			i = (t - tc) / 4;

				vnni_tile_any(j, t, tce - t < 4 ? tce - t : 4, o, nb, xsum + (t - tc), pf,
							  i * (k / 4) / n_tiles, (i + 1) * (k / 4) / n_tiles);
			}
		}
		if (full_end < o1)
			for (int t = tc; t < tce; t += 4)
				vnni_tile_partial(j, t, tce - t < 4 ? tce - t : 4, full_end, o1 - full_end,
								  xsum + (t - tc));
	}
}

/* ---------------------------------------------------------------------------------------
 * AMX over the panel layout
 *
 * A full panel's 16 steps of 64 bytes for inputs [64c, 64c + 64) are exactly an AMX B tile (row
 * g: the 16 channels' 4 biased bytes of step g), so tdpbsud (signed activations times unsigned
 * weights) gives vpdpbusd's biased int32 sums for 16 tokens x 16 channels at once, and the
 * VNNI epilogue finishes them: the same integers, the same bits.  Tiles 0-3 hold the sums of
 * four panels for 16 tokens, tile 4 the tokens' 64 inputs, tiles 6 and 7 the panels' steps in
 * turn.  Only where k is a multiple of 64 and for whole tiles of 16 tokens; the rest of a task
 * goes to the AVX-512 kernel.
 * --------------------------------------------------------------------------------------- */

#define TARGET_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,amx-tile,amx-int8")))

typedef struct amx_tile_config
{
	uint8_t		palette;
	uint8_t		start_row;
	uint8_t		reserved[14];
	uint16_t	bytes_per_row[16];
	uint8_t		rows[16];
} amx_tile_config;

TARGET_AMX void
cai_amx_configure(void)
{
	amx_tile_config cfg;

	memset(&cfg, 0, sizeof(cfg));
	cfg.palette = 1;
	for (int t = 0; t < 8; t++)
	{
		cfg.rows[t] = 16;
		cfg.bytes_per_row[t] = 64;
	}
	/* (not _tile_loadconfig: GCC 12 does not see that it reads the whole struct, and drops stores) */
	__asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

TARGET_AMX void
cai_amx_release(void)
{
	_tile_release();
}

/* Panels per AMX group: four tiles of sums. */
#define AMX_GROUP_PANELS 4

/* Panel b's step-c tile into tile B, then tile C += tokens (tile 4) x it. */
#define AMX_PANEL_STEP(C, B, b) \
	do { \
		_tile_loadd(B, w + (size_t) (b) * CAI_QMATRIX_PANEL * k + (size_t) c * 1024, 64); \
		_tile_dpbsud(C, 4, B); \
	} while (0)

/* The epilogue of 16 tokens from t x nb panels from o, from their biased sums. */
static inline __attribute__((always_inline)) TARGET_AMX void
amx_epilogue(const gemm_i8_job *j, int t, int o, int nb, const int32_t *xsum,
			 int32_t sums[16][AMX_GROUP_PANELS * CAI_QMATRIX_PANEL])
{
	for (int tt = 0; tt < 16; tt++)
		for (int b = 0; b < nb; b++)
			vnni_epilogue(j, t + tt, o + b * CAI_QMATRIX_PANEL,
						  _mm512_load_si512(sums[tt] + b * CAI_QMATRIX_PANEL), xsum[tt],
						  (__mmask16) 0xFFFF);
}

/*
 * AMX kernel for one task's tile range (o0 is a panel boundary).  A group's sums go through the
 * epilogue only after the next group's products are under way: vector loads right after the
 * tile stores would wait for them.
 */
static TARGET_AMX void
gemm_i8_amx(const gemm_i8_job *j, int t0, int t1, int o0, int o1)
{
	const int	k = j->w->k;
	const int	full_end = o1 - (o1 - o0) % CAI_QMATRIX_PANEL;
	const int	t_end = t0 + (t1 - t0) / 16 * 16;	/* past the whole tiles of tokens */
	const int	group = AMX_GROUP_PANELS * CAI_QMATRIX_PANEL;
	int32_t		xsum[2][16];	/* by token block, in turn */
	int32_t		sums[2][16][AMX_GROUP_PANELS * CAI_QMATRIX_PANEL] __attribute__((aligned(64)));
	const int32_t *prev_xsum = NULL;
	int			prev_t = 0,
				prev_o = 0,
				prev_nb = 0,
				buf = 0;

	if (k % 64 != 0 || t_end == t0 || full_end == o0)
	{
		gemm_i8_avx512(j, t0, t1, o0, o1);
		return;
	}
	cai_amx_configure();
	/* group after group, their sums in buffers taken in turn */
	for (int t = t0; t < t_end; t += 16)
	{
		int32_t    *block_xsum = xsum[(t - t0) / 16 % 2];

		vnni_token_sums(j->xq + (size_t) t * k, k, 16, block_xsum);
		for (int o = o0; o < full_end; o += group, buf ^= 1)
		{
			const uint8_t *w = (const uint8_t *) j->w->q + (size_t) o * k;
			int			nb = (full_end - o) / CAI_QMATRIX_PANEL;

			nb = nb < AMX_GROUP_PANELS ? nb : AMX_GROUP_PANELS;
			_tile_zero(0);
			_tile_zero(1);
			_tile_zero(2);
			_tile_zero(3);
			for (int c = 0; c < k / 64; c++)
			{
				_tile_loadd(4, j->xq + (size_t) t * k + 64 * c, k);
				AMX_PANEL_STEP(0, 6, 0);
				if (nb > 1)
					AMX_PANEL_STEP(1, 7, 1);
				if (nb > 2)
					AMX_PANEL_STEP(2, 6, 2);
				if (nb > 3)
					AMX_PANEL_STEP(3, 7, 3);
			}
			_tile_stored(0, sums[buf][0], sizeof(sums[buf][0]));
			if (nb > 1)
				_tile_stored(1, sums[buf][0] + CAI_QMATRIX_PANEL, sizeof(sums[buf][0]));
			if (nb > 2)
				_tile_stored(2, sums[buf][0] + 2 * CAI_QMATRIX_PANEL, sizeof(sums[buf][0]));
			if (nb > 3)
				_tile_stored(3, sums[buf][0] + 3 * CAI_QMATRIX_PANEL, sizeof(sums[buf][0]));
			if (prev_xsum)
				amx_epilogue(j, prev_t, prev_o, prev_nb, prev_xsum, sums[buf ^ 1]);
			prev_xsum = block_xsum;
			prev_t = t;
			prev_o = o;
			prev_nb = nb;
		}
	}
	amx_epilogue(j, prev_t, prev_o, prev_nb, prev_xsum, sums[buf ^ 1]);
	cai_amx_release();
	if (full_end < o1)
		gemm_i8_avx512(j, t0, t_end, full_end, o1);
	if (t_end < t1)
		gemm_i8_avx512(j, t_end, t1, o0, o1);
}
#undef AMX_PANEL_STEP

/* ---------------------------------------------------------------------------------------
 * AVX2 over the panel layout
 *
 * No unsigned-by-signed dot product here beyond vpmaddubsw, whose int16 pair sums would
 * saturate on biased weights (2 * 255 * 127), so the weights are unbiased back to signed
 * (xor 0x80) and the sign trick is used: |w| (unsigned) times sign(x, w) (x with w's sign)
 * equals w * x; vpmaddubsw sums pairs to int16, which cannot saturate because |w|, |x| <= 127
 * (2 * 127 * 127 = 32258), and vpmaddwd with ones widens pairs to int32, so each int32 lane
 * holds one channel's 4-input step, as in the VNNI layout.  One 32-byte vector is half a
 * panel's step (8 channels); tiles are up to 2 tokens x one panel.  No offset correction.
 * --------------------------------------------------------------------------------------- */

/* acc[tt * 2 + h] += the dot products of token tt with the half panels at w (step 4 * r bytes). */
static inline __attribute__((always_inline)) TARGET_AVX2 void
avx2_panel(const int8_t *x, const uint8_t *w, int k, int r, int NT, bool full,
		   const uint8_t *pf, __m256i *acc)
{
	const __m256i flip = _mm256_set1_epi8((char) 0x80);
	const __m256i ones = _mm256_set1_epi16(1);
	const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(r), lane);
	const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(r - 8), lane);
	const size_t step = full ? 64 : (size_t) 4 * r;

	for (int a = 0; a < 2 * NT; a++)
		acc[a] = _mm256_setzero_si256();
	for (int g = 0; g < k / 4; g++)
	{
		const uint8_t *wg = w + (size_t) g * step;
		__m256i		wv[2],
					aw[2];

		if (full)
		{
			wv[0] = _mm256_loadu_si256((const __m256i *) wg);
			wv[1] = _mm256_loadu_si256((const __m256i *) (wg + 32));
			if (pf)
				_mm_prefetch((const char *) (pf + (size_t) g * 64), PF_HINT);
		}
		else
		{
			wv[0] = _mm256_maskload_epi32((const int *) wg, m0);
			wv[1] = _mm256_maskload_epi32((const int *) (wg + 32), m1);
		}
		for (int h = 0; h < 2; h++)
		{
			wv[h] = _mm256_xor_si256(wv[h], flip);	/* signed weights */
			aw[h] = _mm256_abs_epi8(wv[h]);
		}
		for (int tt = 0; tt < NT; tt++)
		{
			int32_t		x4;
			__m256i		xb;

			memcpy(&x4, x + (size_t) tt * k + 4 * g, 4);
			xb = _mm256_set1_epi32(x4);
			for (int h = 0; h < 2; h++)
			{
				__m256i		p = _mm256_maddubs_epi16(aw[h], _mm256_sign_epi8(xb, wv[h]));

				acc[tt * 2 + h] = _mm256_add_epi32(acc[tt * 2 + h], _mm256_madd_epi16(p, ones));
			}
		}
	}
}

/* The epilogue of token t's r channels at o from exact dot products (8 per half). */
static inline __attribute__((always_inline)) TARGET_AVX2 void
avx2_epilogue(const gemm_i8_job *j, int t, int o, const __m256i *acc, int r)
{
	float	   *dst = j->out + (size_t) t * j->ldo + o;

	if (r == CAI_QMATRIX_PANEL)
	{
		for (int h = 0; h < 2; h++)
		{
			__m256		v;

			GEMM_EPILOGUE(v, _mm256_cvtepi32_ps(acc[h]), _mm256_set1_ps(j->xs[t]),
						  _mm256_loadu_ps(j->w->scale + o + 8 * h), j->bias != NULL,
						  _mm256_loadu_ps(j->bias + o + 8 * h), j->accumulate,
						  _mm256_loadu_ps(dst + 8 * h));
			_mm256_storeu_ps(dst + 8 * h, v);
		}
	}
	else
	{
		int32_t		sums[CAI_QMATRIX_PANEL];

		_mm256_storeu_si256((__m256i *) sums, acc[0]);
		_mm256_storeu_si256((__m256i *) (sums + 8), acc[1]);
		for (int c = 0; c < r; c++)
			gemm_epilogue(dst + c, sums[c], j->xs[t], j->w->scale[o + c], j->bias, o + c,
						  j->accumulate);
	}
}

/* Tokens t.. (nt <= 2) against the panel at o of r channels. */
static TARGET_AVX2 void
avx2_tile(const gemm_i8_job *j, int t, int nt, int o, int r, const uint8_t *pf)
{
	const int	k = j->w->k;
	const int8_t *x = j->xq + (size_t) t * k;
	const uint8_t *w = (const uint8_t *) j->w->q + (size_t) o * k;
	__m256i		acc[4];

	if (r < CAI_QMATRIX_PANEL)
	{
		if (nt == 2)
			avx2_panel(x, w, k, r, 2, false, NULL, acc);
		else
			avx2_panel(x, w, k, r, 1, false, NULL, acc);
	}
	else if (nt == 2)
		avx2_panel(x, w, k, r, 2, true, pf, acc);
	else
		avx2_panel(x, w, k, r, 1, true, pf, acc);
	for (int tt = 0; tt < nt; tt++)
		avx2_epilogue(j, t + tt, o, acc + 2 * tt, r);
}

/* AVX2 int8 kernel for one task's tile range: panel by panel, 2 tokens at a time. */
static TARGET_AVX2 void
gemm_i8_avx2(const gemm_i8_job *j, int t0, int t1, int o0, int o1)
{
	const int	k = j->w->k;
	const uint8_t *wq = (const uint8_t *) j->w->q;

	for (int o = o0; o < o1; o += CAI_QMATRIX_PANEL)
	{
		int			r = o1 - o < CAI_QMATRIX_PANEL ? o1 - o : CAI_QMATRIX_PANEL;
		const uint8_t *pf = o + 2 * CAI_QMATRIX_PANEL <= o1 ?
			wq + (size_t) (o + CAI_QMATRIX_PANEL) * k : NULL;

		for (int t = t0; t < t1; t += 2)
			avx2_tile(j, t, t1 - t < 2 ? t1 - t : 2, o, r, t == t0 ? pf : NULL);
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
 * Chooses the tiles handed to the pool: channel blocks that are multiples of 16 (whole panels
 * of the packed layout) sized for about four tasks per thread, and token blocks for large batches so that
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
			const cai_cpu_qmatrix *w, const float *bias, float *out, int ldo, bool accumulate)
{
	gemm_i8_task gt;

	if (n_tok <= 0 || w->n_out <= 0)
		return;
	gt.job = (gemm_i8_job) {xq, xs, n_tok, w, bias, out, ldo, accumulate};
	switch (w->packed ? current_isa() : ISA_UNSET)
	{
		case ISA_UNSET:
			gt.kernel = gemm_i8_rowmajor;	/* not packed: correct everywhere, not fast */
			break;
#if defined(__x86_64__)
		case ISA_AVX512_VNNI:
			gt.kernel = gemm_i8_avx512;
			break;
		case ISA_AVX512_AMX:
			gt.kernel = gemm_i8_amx;
			break;
		case ISA_AVX2:
		case ISA_AVX_VNNI:
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
		case ISA_AVX512_AMX:
			gt.kernel = gemm_f32_avx512;
			break;
		case ISA_AVX2:
		case ISA_AVX_VNNI:
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
		case ISA_AVX512_AMX:
			row = quantize_row_avx512;
			break;
		case ISA_AVX2:
		case ISA_AVX_VNNI:
			row = quantize_row_avx2;
			break;
#endif
		default:
			break;
	}
	for (int t = 0; t < n_tok; t++)
		row(x + (size_t) t * k, k, q + (size_t) t * k, s + t);
}
