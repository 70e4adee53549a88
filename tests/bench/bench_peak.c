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
 * Eight independent accumulators hide the latencies.  Then the memory's read bandwidth: 1 and 2
 * threads (or the number given) each summing their part of a 1 GiB buffer with 256-bit loads,
 * the best of 5 passes: the rate decode's weight streaming can approach (bench_engine.py's
 * --read-bandwidth takes it).  Not part of the Makefile; from the repository root:
 *
 *   gcc -O2 -pthread -o /tmp/bench_peak tests/bench/bench_peak.c && /tmp/bench_peak [threads]
 *
 * Comparing a GEMM's multiply-adds per second (per thread) with these says how much of what the
 * instructions allow it reaches; docs/benchmarks.md uses them for the ceilings of its goals.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

#define READ_BYTES ((size_t) 1 << 30)

typedef struct reader
{
	const uint8_t *p;
	size_t		n;
	long long	sum;
} reader;

/* Sums a part of the buffer with four independent accumulators of 256-bit loads. */
__attribute__((target("avx2"))) static void *
read_part(void *arg)
{
	reader	   *r = arg;
	__m256i		s0 = _mm256_setzero_si256(),
				s1 = s0,
				s2 = s0,
				s3 = s0;

	for (size_t i = 0; i + 128 <= r->n; i += 128)
	{
		s0 = _mm256_add_epi64(s0, _mm256_load_si256((const __m256i *) (r->p + i)));
		s1 = _mm256_add_epi64(s1, _mm256_load_si256((const __m256i *) (r->p + i + 32)));
		s2 = _mm256_add_epi64(s2, _mm256_load_si256((const __m256i *) (r->p + i + 64)));
		s3 = _mm256_add_epi64(s3, _mm256_load_si256((const __m256i *) (r->p + i + 96)));
	}
	s0 = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
	r->sum = _mm256_extract_epi64(s0, 0) + _mm256_extract_epi64(s0, 3);
	return NULL;
}

/* GB/s of threads reading buf (READ_BYTES) at once, the best of 5 passes. */
static double
read_bandwidth(const uint8_t *buf, int threads, long long *checksum)
{
	double		best = 0;

	for (int pass = 0; pass < 5; pass++)
	{
		pthread_t	tid[64];
		reader		r[64];
		double		t = now();

		for (int i = 0; i < threads; i++)
		{
			r[i].p = buf + READ_BYTES / threads * i;
			r[i].n = READ_BYTES / threads;
			pthread_create(&tid[i], NULL, read_part, &r[i]);
		}
		for (int i = 0; i < threads; i++)
		{
			pthread_join(tid[i], NULL);
			*checksum += r[i].sum;
		}
		t = now() - t;
		if (READ_BYTES / t / 1e9 > best)
			best = READ_BYTES / t / 1e9;
	}
	return best;
}

__attribute__((target("avx2"))) int
main(int argc, char **argv)
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

	{
		int			max_threads = argc > 1 ? atoi(argv[1]) : 2;
		uint8_t    *buf = aligned_alloc(64, READ_BYTES);
		long long	checksum = 0;

		if (!buf || max_threads < 1 || max_threads > 64)
			return 1;
		memset(buf, 1, READ_BYTES);
		for (int threads = 1; threads <= max_threads; threads = threads < max_threads && threads * 2 > max_threads ? max_threads : threads * 2)
			printf("read bandwidth, %d thread%s: %.1f GB/s\n", threads, threads > 1 ? "s" : "",
				   read_bandwidth(buf, threads, &checksum));
		printf("(checksum %lld)\n", checksum);
		free(buf);
	}
	return 0;
}
