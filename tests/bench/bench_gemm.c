/*
 * bench_gemm.c — micro-benchmark of the CPU GEMM kernels on SmolLM2-135M's shapes.
 *
 * Not part of the Makefile; build and run by hand from the repository root:
 *
 *   gcc -O3 -std=gnu11 -pthread -Isrc/engine -Isrc/backend -o /tmp/bench_gemm tests/bench/bench_gemm.c \
 *       src/backend/cpu/gemm.c src/engine/threadpool.c -lm
 *   /tmp/bench_gemm [isa [seconds-per-case [section]]]
 *
 * isa: generic, avx2 or avx512-vnni (default: the best available); section: shapes, decode,
 * dispatch or all (default).
 *
 * For each shape (k -> n_out) and batch (n_tok = 1, 8, 32, 512) it reports GOPS (2 * n_tok * k
 * * n_out operations per second) at 1 and 2 threads.  Single-token cases rotate over copies of
 * the weights totalling 256 MiB, so every call streams its weights from DRAM as a real decode
 * step does (the model is ~134 MB of int8); those lines also give the weight bandwidth in GB/s.
 * Then a whole decode step's worth of matrices (30 layers + LM head, all distinct) is timed,
 * and finally the machine's int8 peak is measured with a loop of independent vpdpbusd.
 * Every figure is the best of many ~1 ms batches, so that time lost to other processes counts
 * as little as possible.
 *
 * Results on the development machine (2-core AMD EPYC Zen 4 VM, 3.7 GHz, AVX-512 VNNI),
 * 2026-11-21, panel-packed weights (gemm.h).  Peak: one 512-bit vpdpbusd per cycle per core =
 * 64 multiply-adds = 128 ops, 3.7 GHz x 128 = 473 GOPS per core (the loop measures 473), 946
 * GOPS for both cores.  The machine is a shared VM: runs vary by 10-20%.
 *
 *   shape (k -> n_out)       n_tok=1 (GB/s)   n_tok=8       n_tok=32      n_tok=512
 *   576 -> 576,  1 thread     23.0             421 GOPS      413 GOPS      408 GOPS
 *   576 -> 192,  1 thread     22.5             417           413           410
 *   576 -> 1536, 1 thread     23.5             419           413           402
 *   1536 -> 576, 1 thread     24.4             438           432           427
 *   576 -> 49152, 1 thread    23.6             387           357           -
 *   576 -> 576,  2 threads    30.2             724           741           821
 *   576 -> 192,  2 threads    24.4             708           786           813
 *   576 -> 1536, 2 threads    35.4             811           812           818
 *   1536 -> 576, 2 threads    33.9             773           775           855
 *   576 -> 49152, 2 threads   35.7             802           750           -
 *
 * ("-": not run for the LM head.)  So batched and prefill products run at 85-92% of the core's
 * peak on one thread and 80-90% of the two cores' (the row-major kernel this layout replaced,
 * with its transposing reductions, measured 360-400 GOPS per core); one-token products stream
 * weights at 22-24 GB/s per core and 30-36 GB/s on two.  A whole decode step's matrices (134
 * MB) take 3.7 ms on two threads (36.6 GB/s, 272 tokens/s for the GEMMs alone) and 12.8 ms at
 * 32 tokens (2498 tokens/s): 9.2x, the ceiling of the engine's batch-32 over batch-1 ratio.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu/gemm.h"

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 88172645463325252ULL;

static uint64_t
rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static void *
xmalloc(size_t n)
{
	void	   *p = aligned_alloc(64, (n + 63) & ~(size_t) 63);

	if (!p)
	{
		fprintf(stderr, "out of memory\n");
		exit(1);
	}
	return p;
}

/* A weight matrix with random int8 values, scales and row sums. */
static void
make_matrix(cai_cpu_qmatrix *m, int n_out, int k)
{
	int8_t	   *q = xmalloc((size_t) n_out * k);
	float	   *s = xmalloc(sizeof(float) * n_out);

	for (size_t i = 0; i < (size_t) n_out * k; i++)
		q[i] = (int8_t) ((int) (rng() % 255) - 127);
	for (int o = 0; o < n_out; o++)
		s[o] = 1e-3f;
	m->n_out = n_out;
	m->k = k;
	m->q = q;
	m->scale = s;
	m->packed = false;
	if (!cai_cpu_qmatrix_pack(m))
	{
		fprintf(stderr, "out of memory\n");
		exit(1);
	}
}

static void
free_matrix(cai_cpu_qmatrix *m)
{
	free((void *) m->q);
	free((void *) m->scale);
}

typedef struct shape
{
	int			k;
	int			n_out;
	const char *what;
} shape;

static const shape shapes[] = {
	{576, 576, "q/o proj"},
	{576, 192, "k/v proj"},
	{576, 1536, "gate/up"},
	{1536, 576, "down"},
	{576, 49152, "lm head"},
};

/*
 * Seconds per call: the best of many short batches (about 1 ms each), so that time slices
 * lost to other processes on this small machine do not count.
 */
static double
best_per_call(cai_threadpool *pool, const int8_t *xq, const float *xs, int n_tok,
			  const cai_cpu_qmatrix *ms, int copies, float *out, int ldo, double seconds)
{
	double		start = now();
	double		best = 1e30;
	long		calls = 0;
	int			batch = 1;

	/* calibrate a batch of about 1 ms */
	for (;;)
	{
		double		t0 = now();

		for (int r = 0; r < batch; r++)
			cai_gemm_i8(pool, xq, xs, n_tok, &ms[(calls++) % copies], NULL, out, ldo, false);
		if (now() - t0 > 1e-3 || batch >= (1 << 20))
			break;
		batch *= 2;
	}
	while (now() - start < seconds)
	{
		double		t0 = now(),
					el;

		for (int r = 0; r < batch; r++)
			cai_gemm_i8(pool, xq, xs, n_tok, &ms[(calls++) % copies], NULL, out, ldo, false);
		el = (now() - t0) / batch;
		if (el < best)
			best = el;
	}
	return best;
}

static void
bench_shape(cai_threadpool *pool, const shape *sh, int n_tok, double seconds)
{
	size_t		wbytes = (size_t) sh->k * sh->n_out;
	int			copies = 1;
	cai_cpu_qmatrix *ms;
	int8_t	   *xq = xmalloc((size_t) n_tok * sh->k);
	float	   *xs = xmalloc(sizeof(float) * n_tok);
	float	   *out = xmalloc(sizeof(float) * n_tok * sh->n_out);
	long		iters;
	double		el;
	double		ops;

	if (n_tok == 1)
	{
		copies = (int) ((256u << 20) / wbytes);
		if (copies < 2)
			copies = 2;
	}
	ms = xmalloc(sizeof(cai_cpu_qmatrix) * copies);
	for (int c = 0; c < copies; c++)
		make_matrix(&ms[c], sh->n_out, sh->k);
	for (size_t i = 0; i < (size_t) n_tok * sh->k; i++)
		xq[i] = (int8_t) ((int) (rng() % 255) - 127);
	for (int t = 0; t < n_tok; t++)
		xs[t] = 1e-2f;
	cai_gemm_i8(pool, xq, xs, n_tok, &ms[0], NULL, out, sh->n_out, false);
	el = best_per_call(pool, xq, xs, n_tok, ms, copies, out, sh->n_out, seconds);
	iters = 1;
	ops = 2.0 * n_tok * sh->k * (double) sh->n_out * iters;
	printf("  %-9s k=%-5d n_out=%-6d n_tok=%-4d threads=%d  %8.1f GOPS  %8.2f us/call",
		   sh->what, sh->k, sh->n_out, n_tok, cai_threadpool_size(pool), ops / el * 1e-9,
		   el / iters * 1e6);
	if (n_tok == 1)
		printf("  %6.1f GB/s weights", wbytes * (double) iters / el * 1e-9);
	printf("\n");
	for (int c = 0; c < copies; c++)
		free_matrix(&ms[c]);
	free(ms);
	free(xq);
	free(xs);
	free(out);
}

static void
bench_f32(cai_threadpool *pool, int n_tok, int k, int n_out, double seconds)
{
	float	   *x = xmalloc(sizeof(float) * n_tok * k);
	float	   *w = xmalloc(sizeof(float) * k * n_out);
	float	   *out = xmalloc(sizeof(float) * n_tok * n_out);
	long		iters = 0;
	double		t0,
				el;

	for (size_t i = 0; i < (size_t) n_tok * k; i++)
		x[i] = (float) (rng() % 1000) * 1e-3f;
	for (size_t i = 0; i < (size_t) n_out * k; i++)
		w[i] = (float) (rng() % 1000) * 1e-3f;
	t0 = now();
	do
	{
		cai_gemm_f32(pool, x, n_tok, k, w, n_out, NULL, out, n_out, false);
		iters++;
		el = now() - t0;
	} while (el < seconds);
	printf("  f32 k=%d n_out=%d n_tok=%d threads=%d  %8.1f GFLOPS\n", k, n_out, n_tok,
		   cai_threadpool_size(pool), 2.0 * n_tok * k * (double) n_out * iters / el * 1e-9);
	free(x);
	free(w);
	free(out);
}

/* One decode step's matrices (SmolLM2-135M: 30 layers, then the LM head), all distinct. */
static void
bench_decode_step(cai_threadpool *pool, int n_tok, double seconds)
{
	enum {LAYERS = 30};
	static const int lk[7] = {576, 576, 576, 576, 576, 576, 1536};
	static const int lo[7] = {576, 192, 192, 576, 1536, 1536, 576};
	cai_cpu_qmatrix *ms = xmalloc(sizeof(cai_cpu_qmatrix) * (LAYERS * 7 + 1));
	int8_t	   *xq = xmalloc((size_t) n_tok * 1536);
	float	   *xs = xmalloc(sizeof(float) * n_tok);
	float	   *out = xmalloc(sizeof(float) * n_tok * 49152);
	int			n = 0;
	double		start,
				best = 1e30,
				bytes = 0;

	for (int l = 0; l < LAYERS; l++)
		for (int i = 0; i < 7; i++)
		{
			make_matrix(&ms[n++], lo[i], lk[i]);
			bytes += (double) lo[i] * lk[i];
		}
	make_matrix(&ms[n++], 49152, 576);
	bytes += 49152.0 * 576;
	for (int i = 0; i < n_tok * 1536; i++)
		xq[i] = (int8_t) ((int) (rng() % 255) - 127);
	for (int t = 0; t < n_tok; t++)
		xs[t] = 1e-2f;
	start = now();
	while (now() - start < seconds)
	{
		double		t0 = now(),
					el;

		for (int i = 0; i < n; i++)
			cai_gemm_i8(pool, xq, xs, n_tok, &ms[i], NULL, out, ms[i].n_out, false);
		el = now() - t0;
		if (el < best)
			best = el;
	}
	printf("  decode step n_tok=%d threads=%d: %.3f ms/step (%d matmuls, %.0f MB), %.1f GB/s, "
		   "%.0f tokens/s GEMM-only (best step)\n", n_tok, cai_threadpool_size(pool), best * 1e3, n,
		   bytes * 1e-6, bytes / best * 1e-9, n_tok / best);
	for (int i = 0; i < n; i++)
		free_matrix(&ms[i]);
	free(ms);
	free(xq);
	free(xs);
	free(out);
}

/* A task that busy-waits for *arg seconds. */
static void
busy_task(void *arg, int task, int thread)
{
	double		until = now() + *(double *) arg;

	(void) task;
	(void) thread;
	while (now() < until)
		;
}

/*
 * The pool's dispatch cost: back-to-back jobs of n_tasks tasks of 2 us each; the overhead is
 * the time per job beyond n_tasks * 2 us / threads.
 */
static void
bench_dispatch(cai_threadpool *pool, int n_tasks)
{
	double		best = 1e30,
				start = now(),
				task_seconds = 2e-6;

	while (now() - start < 0.3)
	{
		double		t0 = now(),
					el;

		for (int r = 0; r < 1000; r++)
			cai_threadpool_run(pool, busy_task, &task_seconds, n_tasks);
		el = (now() - t0) / 1000;
		if (el < best)
			best = el;
	}
	printf("  dispatch threads=%d n_tasks=%d x 2 us: %.2f us/job, overhead %.2f us\n",
		   cai_threadpool_size(pool), n_tasks, best * 1e6,
		   (best - n_tasks * task_seconds / cai_threadpool_size(pool)) * 1e6);
}

#if defined(__x86_64__)
/* Independent vpdpbusd chains on registers: the core's int8 multiply-add peak. */
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) static double
vnni_peak_gops(double seconds)
{
	__m512i		a[12];
	__m512i		x = _mm512_set1_epi8(3),
				y = _mm512_set1_epi8(-2);
	double		start = now(),
				best = 1e30;
	int32_t		sink[16];

	for (int i = 0; i < 12; i++)
		a[i] = _mm512_set1_epi32(i);
	while (now() - start < seconds)
	{
		double		t0 = now(),
					el;

		for (int r = 0; r < 100000; r++)
		{
			for (int i = 0; i < 12; i++)
				a[i] = _mm512_dpbusd_epi32(a[i], x, y);
			__asm__("" : "+v"(x), "+v"(y));
		}
		el = now() - t0;
		if (el < best)
			best = el;
	}
	for (int i = 1; i < 12; i++)
		a[0] = _mm512_add_epi32(a[0], a[i]);
	_mm512_storeu_si512(sink, a[0]);
	if (sink[0] == 12345)
		printf(" ");
	/* 12 instructions x 64 multiply-adds x 2 operations */
	return 100000 * 12.0 * 64 * 2 / best * 1e-9;
}
#endif

int
main(int argc, char **argv)
{
	static const int toks[] = {1, 8, 32, 512};
	double		seconds = argc > 2 ? atof(argv[2]) : 0.3;
	const char *section = argc > 3 ? argv[3] : "all";
	bool		all = strcmp(section, "all") == 0;

	if (argc > 1 && !cai_cpu_force_isa(argv[1]))
	{
		fprintf(stderr, "isa %s not available\n", argv[1]);
		return 1;
	}
	printf("isa: %s\n", cai_cpu_isa());
	for (int threads = 1; threads <= 2; threads++)
	{
		cai_threadpool *pool = cai_threadpool_create(threads);

		if (!pool)
			return 1;
		for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]) && (all || !strcmp(section, "shapes")); s++)
			for (size_t t = 0; t < sizeof(toks) / sizeof(toks[0]); t++)
			{
				if (shapes[s].n_out > 10000 && toks[t] > 32)
					continue;
				bench_shape(pool, &shapes[s], toks[t], seconds);
			}
		if (all || !strcmp(section, "dispatch"))
		{
			bench_dispatch(pool, 2);
			bench_dispatch(pool, 8);
		}
		if (all || !strcmp(section, "decode"))
		{
			bench_decode_step(pool, 1, 3 * seconds);
			bench_decode_step(pool, 8, 3 * seconds);
			bench_decode_step(pool, 32, 3 * seconds);
		}
		if (all)
		{
			bench_f32(pool, 1, 576, 1536, seconds);
			bench_f32(pool, 32, 576, 1536, seconds);
		}
		cai_threadpool_free(pool);
	}
#if defined(__x86_64__)
	if (all && __builtin_cpu_supports("avx512vnni"))
		printf("vpdpbusd peak, one core: %.1f GOPS\n", vnni_peak_gops(0.5));
#endif
	return 0;
}
