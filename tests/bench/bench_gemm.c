/*
 * bench_gemm.c — micro-benchmark of the CPU GEMM kernels on SmolLM2-135M's shapes.
 *
 * Not part of the Makefile; build and run by hand from the repository root:
 *
 *   gcc -O3 -std=gnu11 -pthread -Isrc/common -Isrc/gguf -Isrc/backend -o /tmp/bench_gemm \
 *       tests/bench/bench_gemm.c src/backend/cpu/gemm.c src/backend/cpu/gemm_blocks.c \
 *       src/backend/cpu/gemm_blocks_vnni.c src/backend/cpu/gemm_blocks_avxvnni.c \
 *       src/common/threadpool.c src/gguf/quant.c src/common/util.c -lm
 *   /tmp/bench_gemm [isa [seconds-per-case [section [formats [n_tok]]]]]
 *
 * isa: generic, avx2, avx-vnni or avx512-vnni (default: the best available); section: shapes, decode,
 * dispatch, all (default; the sections above), blocks or blocks-nohead (below; formats, e.g.
 * "int8,q6_k", and n_tok restrict them).
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
 *
 * Section blocks: the block-weight GEMM (gemm_blocks.h) in Q4_0, Q4_K, Q6_K and Q8_0 beside the
 * int8 GEMM, on Llama-3.2-1B's shapes (2048 -> 8192, 8192 -> 2048, 2048 -> 512 (a key or value
 * projection, whose weights stay in L2, so that its GOPS are the kernel's without memory), and
 * the 2048 -> 128256 LM head for one token), random valid blocks, activations quantized
 * beforehand (not timed), at 1, 8, 16 (one AMX tile), 64 and 512 tokens.
 * One token: us per call and GB/s of the weight bytes the kernel reads (packed: Q4_0 4.5 bits a
 * weight, Q4_K 4.625, Q6_K 6.73 (4 + 2 bits a level), Q8_0 8.5, int8 8), rotating over copies of
 * 256 MiB or more; more tokens: GOPS.  One-thread cases also give the figures per second of the
 * thread's CPU time, which leaves out time slices other processes took.
 *
 * Results, 2026-11-28, on a 2-core AMD EPYC VM with AVX2 and no AVX-512, shared with other
 * work (load average 8-11 during the runs: wall times are 2-3x the CPU times and 2 threads ran
 * no faster than 1), median of 3 runs, before the int16 accumulation of Q5/Q6_K; one thread,
 * CPU time:
 *
 *   shape (k -> n_out)    format   n_tok=1          n_tok=64   n_tok=512
 *   2048 -> 8192          int8     1367 us 12.3 GB/s  33.0 GOPS  32.7 GOPS
 *                         q4_0     1512 us  6.2       34.4       30.8
 *                         q4_k     1831 us  5.3       32.6       29.0
 *                         q6_k     3339 us  5.4       24.4       21.9
 *                         q8_0     2582 us  6.9       26.2       24.1
 *   8192 -> 2048          int8     1346 us 12.5       33.8       33.5
 *                         q4_0     1392 us  6.8       34.4       32.7
 *                         q4_k     1715 us  5.7       32.5       30.4
 *                         q6_k     3601 us  5.0       24.9       23.6
 *                         q8_0     2245 us  7.9       26.7       24.8
 *   2048 -> 128256        int8     27.8 ms  9.5
 *                         q4_0     23.2 ms  6.4
 *                         q4_k     30.0 ms  5.1
 *                         q6_k     40.4 ms  7.0
 *                         q8_0     36.1 ms  7.7
 *
 * So prefill of the 4-bit formats runs at the int8 GEMM's rate per core and the byte formats
 * at 70-80% of it; one token takes about as long as int8 although Q4 streams half the bytes:
 * the kernel does about twice int8's instructions per weight (nibble unpacking, a broadcast per
 * 4 inputs, per-block scales), so on this machine decode is bound by instructions, not memory.
 * With the int16 accumulation of Q5/Q6_K (same bits), Q6_K at 64 tokens went from 24.3 to
 * 28.9 GOPS (2048 -> 8192) and from 22.8 to 29.5 (8192 -> 2048); Q8_0 unchanged.
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
#include "cpu/gemm_blocks.h"
#include "quant.h"
#include "util.h"

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

/* ---------------------------------------------------------------------------------------
 * Block weights (gemm_blocks.h) beside the int8 GEMM, on Llama-3.2-1B's shapes
 * --------------------------------------------------------------------------------------- */

static const shape llama_shapes[] = {
	{2048, 8192, "gate/up"},
	{8192, 2048, "down"},
	{2048, 512, "k/v"},
	{2048, 128256, "lm head"},
};

/* One matrix format under test: int8 (gemm.h) when is_i8, else a block type. */
typedef struct bcase
{
	bool		is_i8;
	ggml_type	type;
	int			n_tok;
	int			k;
	int			n_out;
	int			copies;
	cai_cpu_qmatrix *qm;
	cai_cpu_bmatrix *bm;
	int8_t	   *xq;
	float	   *xs;			/* int8: per token; blocks: per token and block of 32 */
	int16_t    *xsum;
	int			group;			/* blocks per activation scale (1, or a K-quant's 8) */
	float	   *out;
} bcase;

/* rows x k of type: random levels and sub-block scales, small finite fp16 d (and dmin). */
static uint8_t *
random_blocks(ggml_type type, int rows, int k)
{
	const size_t bb = ggml_type_block_bytes(type);
	const size_t n_blocks = (size_t) rows * (k / ggml_type_block_elems(type));
	const size_t d_at = type == GGML_TYPE_Q6_K ? 208 : 0;
	const bool	has_min = type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_1 ||
		type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K;
	uint8_t    *t = xmalloc(n_blocks * bb);

	for (size_t i = 0; i + 8 <= n_blocks * bb; i += 8)
	{
		uint64_t	r = rng();

		memcpy(t + i, &r, 8);
	}
	for (size_t b = 0; b < n_blocks; b++)
	{
		uint16_t	d = cai_fp32_to_fp16(1e-3f + 1e-5f * (float) (rng() % 1000));
		uint16_t	dmin = cai_fp32_to_fp16(-1e-3f * (float) (rng() % 30));

		memcpy(t + b * bb + d_at, &d, 2);
		if (has_min)
			memcpy(t + b * bb + 2, &dmin, 2);
	}
	return t;
}

/* Weight bytes one call streams: what the kernel reads, packed. */
static double
case_weight_bytes(const bcase *c)
{
	return c->is_i8 ? (double) c->k * c->n_out : (double) c->bm[0].bytes;
}

static void
bcase_setup(bcase *c, bool is_i8, ggml_type type, const shape *sh, int n_tok)
{
	const int	nb = sh->k / CAI_BLOCK_ELEMS;
	float	   *x = xmalloc(sizeof(float) * n_tok * sh->k);
	double		one;

	memset(c, 0, sizeof(*c));
	c->is_i8 = is_i8;
	c->type = type;
	c->n_tok = n_tok;
	c->k = sh->k;
	c->n_out = sh->n_out;
	c->xq = xmalloc((size_t) n_tok * sh->k);
	c->xs = xmalloc(sizeof(float) * n_tok * nb);
	c->xsum = xmalloc(sizeof(int16_t) * n_tok * nb);
	c->out = xmalloc(sizeof(float) * n_tok * sh->n_out);
	for (size_t i = 0; i < (size_t) n_tok * sh->k; i++)
		x[i] = (float) ((int) (rng() % 2001) - 1000) * 1e-3f;
	/* BENCH_SUPERBLOCKS=1: the K-quants with super-block activations (gemm_blocks.h) */
	c->group = !is_i8 && getenv("BENCH_SUPERBLOCKS") && atoi(getenv("BENCH_SUPERBLOCKS")) ?
		cai_act_group(type) : 1;
	cai_quantize_act_blocks(x, n_tok, sh->k, c->group, c->xq, c->xs, c->xsum);
	free(x);
	if (is_i8)
		one = (double) sh->k * sh->n_out;
	else
	{
		size_t		row_bytes;

		if (!ggml_row_bytes(type, sh->k, &row_bytes))
			exit(1);
		one = (double) row_bytes * sh->n_out * 1.1;
	}
	/* a single token streams its weights from DRAM: copies totalling 256 MiB or more */
	c->copies = n_tok == 1 ? (int) ((256u << 20) / one) : 1;
	if (c->copies < (n_tok == 1 ? 2 : 1))
		c->copies = n_tok == 1 ? 2 : 1;
	if (is_i8)
	{
		c->qm = xmalloc(sizeof(cai_cpu_qmatrix) * c->copies);
		for (int i = 0; i < c->copies; i++)
			make_matrix(&c->qm[i], sh->n_out, sh->k);
	}
	else
	{
		uint8_t    *t = random_blocks(type, sh->n_out, sh->k);

		c->bm = xmalloc(sizeof(cai_cpu_bmatrix) * c->copies);
		for (int i = 0; i < c->copies; i++)
			if (cai_cpu_bmatrix_pack(type, t, sh->n_out, sh->k, &c->bm[i], NULL) != CAI_OK)
			{
				fprintf(stderr, "packing %s failed\n", ggml_type_name(type));
				exit(1);
			}
		free(t);
	}
}

static void
bcase_free(bcase *c)
{
	for (int i = 0; i < c->copies; i++)
		if (c->is_i8)
			free_matrix(&c->qm[i]);
		else
			cai_cpu_bmatrix_free(&c->bm[i]);
	free(c->qm);
	free(c->bm);
	free(c->xq);
	free(c->xs);
	free(c->xsum);
	free(c->out);
}

static void
bcase_call(cai_threadpool *pool, const bcase *c, long call)
{
	int			i = (int) (call % c->copies);

	if (c->is_i8)
	{
		/* gemm.h's scales are per token: the first blocks' stand in */
		cai_gemm_i8(pool, c->xq, c->xs, c->n_tok, &c->qm[i], NULL, c->out, c->n_out, false);
	}
	else
		cai_gemm_blocks(pool, c->xq, c->xs, c->xsum, c->group, c->n_tok, &c->bm[i], c->n_out, NULL,
						c->out, c->n_out, false);
}

static double
thread_cpu_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*
 * Seconds per call, the best of batches of about 1 ms (at least two batches), in wall time and
 * in the calling thread's CPU time (*cpu): on one thread the latter leaves out the time slices
 * other processes took, which on this shared machine can be most of the wall time.
 */
static double
bcase_best(cai_threadpool *pool, const bcase *c, double seconds, double *cpu)
{
	double		start,
				best = 1e30;
	long		calls = 0;
	int			batch = 1;
	int			rounds = 0;

	*cpu = 1e30;
	for (;;)
	{
		double		t0 = now();

		for (int r = 0; r < batch; r++)
			bcase_call(pool, c, calls++);
		if (now() - t0 > 1e-3 || batch >= (1 << 20))
			break;
		batch *= 2;
	}
	start = now();
	while (now() - start < seconds || rounds < 2)
	{
		double		t0 = now(),
					c0 = thread_cpu_now(),
					el,
					cel;

		for (int r = 0; r < batch; r++)
			bcase_call(pool, c, calls++);
		el = (now() - t0) / batch;
		cel = (thread_cpu_now() - c0) / batch;
		if (el < best)
			best = el;
		if (cel < *cpu)
			*cpu = cel;
		rounds++;
	}
	return best;
}

/*
 * Each format (int8 and the block types) on each shape: us per call, and for one token the GB/s
 * of weight bytes streamed (the packed bytes the kernel reads: Q4_0 4.5 bits a weight, Q4_K
 * 4.625, Q6_K 6.73 (4 + 2 bits a level), Q8_0 8.5, int8 8), for more tokens GOPS
 * (2 n_tok k n_out per second).  Activations are quantized beforehand (not timed) for both.
 */
static void
bench_blocks(double seconds, int max_threads, bool with_lm_head, const char *only_formats,
			 int only_tokens)
{
	static const int toks[] = {1, 8, 16, 64, 512};
	static const ggml_type btypes[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0};
	const int	n_formats = 1 + (int) (sizeof(btypes) / sizeof(btypes[0]));

	printf("block weights vs int8 (%s)\n", cai_cpu_isa());
	for (size_t s = 0; s < sizeof(llama_shapes) / sizeof(llama_shapes[0]); s++)
		for (size_t t = 0; t < sizeof(toks) / sizeof(toks[0]); t++)
		{
			const shape *sh = &llama_shapes[s];

			if (sh->n_out > 10000 && (toks[t] > 1 || !with_lm_head))
				continue;
			if (only_tokens && toks[t] != only_tokens)
				continue;
			for (int f = 0; f < n_formats; f++)
			{
				const char *name = f ? ggml_type_name(btypes[f - 1]) : "int8";
				bcase		c;

				if (only_formats && !strstr(only_formats, name))
					continue;

				bcase_setup(&c, f == 0, f ? btypes[f - 1] : GGML_TYPE_F32, sh, toks[t]);
				for (int threads = 1; threads <= max_threads; threads++)
				{
					cai_threadpool *pool = cai_threadpool_create(threads);
					const double ops = 2.0 * toks[t] * sh->k * (double) sh->n_out;
					double		el,
								cpu;

					if (!pool)
						exit(1);
					bcase_call(pool, &c, 0);
					el = bcase_best(pool, &c, seconds, &cpu);
					printf("  %-7s %-5s k=%-5d n_out=%-6d n_tok=%-3d threads=%d  %9.1f us/call",
						   sh->what, f ? ggml_type_name(btypes[f - 1]) : "int8", sh->k, sh->n_out,
						   toks[t], threads, el * 1e6);
					if (toks[t] == 1)
						printf("  %6.1f GB/s weights (%.1f MB)", case_weight_bytes(&c) / el * 1e-9,
							   case_weight_bytes(&c) * 1e-6);
					else
						printf("  %7.1f GOPS", ops / el * 1e-9);
					/* one thread: the same per CPU second */
					if (threads == 1 && toks[t] == 1)
						printf("  [cpu %9.1f us, %6.1f GB/s]", cpu * 1e6, case_weight_bytes(&c) / cpu * 1e-9);
					else if (threads == 1)
						printf("  [cpu %9.1f us, %7.1f GOPS]", cpu * 1e6, ops / cpu * 1e-9);
					printf("\n");
					fflush(stdout);
					cai_threadpool_free(pool);
				}
				bcase_free(&c);
			}
		}
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
	if (!strcmp(section, "blocks") || !strcmp(section, "blocks-nohead"))
	{
		/* optionally only some formats ("int8,q4_0") and one token count */
		bench_blocks(seconds, 2, !strcmp(section, "blocks"), argc > 4 ? argv[4] : NULL,
					 argc > 5 ? atoi(argv[5]) : 0);
		return 0;
	}
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
