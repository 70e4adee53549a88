/*
 * bench_peak.c — the most int8 multiply-adds per second one thread of this CPU does with each of
 * the AVX2 instruction sequences the CPU kernels are built on, operands in registers (no memory,
 * no unpacking, no scales): the ceiling any GEMM made of that sequence can approach.
 *
 *   int8 x int8   vpsignb, vpmaddubsw, vpmaddwd, vpaddd per 32 multiply-adds: the int8 GEMM
 *                 (cpu/gemm.c) and the byte formats Q8_0, Q5_*, Q6_K (cpu/gemm_blocks.c)
 *   4-bit x int8  vpmaddubsw, vpaddw per 32, one vpmaddwd per 8 of those: the nibble formats
 *                 Q4_0, Q4_1, Q4_K, whose unsigned levels need no sign step and whose int16 sums
 *                 cannot overflow within a block
 *
 * Eight independent accumulators hide the latencies.  Not part of the Makefile; from the
 * repository root:
 *
 *   gcc -O2 -o /tmp/bench_peak tests/bench/bench_peak.c && /tmp/bench_peak
 *
 * Comparing a GEMM's multiply-adds per second (per thread) with these says how much of what the
 * instructions allow it reaches; docs/benchmarks.md uses them for the ceilings of its goals.
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define STEPS 100000000L
#define FOR8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)

static double
now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("avx2"))) int
main(void)
{
	const __m256i ones = _mm256_set1_epi16(1);
	const __m256i x = _mm256_set1_epi8(-5);
	__m256i		total = _mm256_setzero_si256();
	double		t;

#define DECLARE(i) __m256i w##i = _mm256_set1_epi8(3 + i), a##i = _mm256_setzero_si256();
	FOR8(DECLARE)
/* an empty asm that "changes" each weight register, so nothing is hoisted out of the loop */
#define OPAQUE(i) __asm__ volatile("" : "+x"(w##i));
#define ADD_TO_TOTAL(i) total = _mm256_add_epi32(total, a##i);
#define ZERO(i) a##i = _mm256_setzero_si256();

	t = now();
	for (long s = 0; s < STEPS; s++)
	{
#define SIGN_STEP(i) a##i = _mm256_add_epi32(a##i, _mm256_madd_epi16( \
		_mm256_maddubs_epi16(w##i, _mm256_sign_epi8(x, w##i)), ones));
		FOR8(SIGN_STEP)
		FOR8(OPAQUE)
	}
	t = now() - t;
	FOR8(ADD_TO_TOTAL)
	printf("int8 x int8 (vpsignb vpmaddubsw vpmaddwd vpaddd): %.1f G multiply-adds/s per thread\n",
		   STEPS * 8.0 * 32 / t / 1e9);

	FOR8(ZERO)
	t = now();
	for (long s = 0; s < STEPS; s++)
	{
#define NIBBLE_STEP(i) a##i = _mm256_add_epi16(a##i, _mm256_maddubs_epi16(w##i, x));
		FOR8(NIBBLE_STEP)
		total = _mm256_add_epi32(total, _mm256_madd_epi16(a0, ones));
		FOR8(OPAQUE)
	}
	t = now() - t;
	FOR8(ADD_TO_TOTAL)
	printf("4-bit x int8 (vpmaddubsw vpaddw, a vpmaddwd per 8): %.1f G multiply-adds/s per thread\n",
		   STEPS * 8.0 * 32 / t / 1e9);
	/* the sums are printed so that the loops are not optimized away */
	printf("(checksum %d)\n", _mm256_extract_epi32(total, 0));
	return 0;
}
