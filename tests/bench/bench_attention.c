/*
 * bench_attention.c — micro-benchmark of the CPU decode attention (cpu/attention.c) on
 * SmolLM2-135M's shape: 30 KV layers, 9 query heads over 3 KV heads of 64.
 *
 * Not part of the Makefile; build and run by hand from the repository root:
 *
 *   gcc -O3 -std=gnu11 -pthread -Isrc/common -Isrc/gguf -Isrc/backend -o /tmp/bench_attention \
 *       tests/bench/bench_attention.c src/backend/cpu/attention.c \
 *       src/backend/cpu/attention_values.c src/backend/cpu/gemm.c src/backend/cpu/ops.c \
 *       src/common/threadpool.c src/backend/kv.c src/common/util.c -lm
 *   /tmp/bench_attention [isa [context [batch]]]
 *   /tmp/bench_attention isa context prefill
 *
 * isa: generic, avx2, avx-vnni, avx512-vnni or avx512-amx (default: the best available); context:
 * positions each sequence attends to (default 48, the mean of `cai bench`'s decode runs);
 * batch: sequences decoding together (default 32).  With `prefill` instead of a batch, it times instead the
 * attention of a whole prompt of `context` tokens over one layer, cut into tiles as the CPU
 * backend cuts a prefill chunk (best of 12, one thread).  On the Intel Xeon VM of 2026-11-27,
 * `avx512-vnni 4096 prefill`, the best of alternating runs: 247 ms before the AVX-512 path
 * widened each value block once per tile and moved its hot loops (scores, exponentials, values)
 * into functions of their own, 183 ms after, 172 ms with the value sums held in registers over
 * chunks of eight blocks.  On an Intel Xeon VM without AMX (2.8 GHz, two 512-bit multiply
 * ports), 2026-11-27, min of four alternations: 162.9 ms, then 122.8 ms with whole key blocks
 * scored in pairs and each value vector loaded once per pair of rows (this benchmark's random
 * keys and values leave the weights' high plane dense: the real model's sparse one gains more).
 *
 * One "step" is what a decode step of `batch` sequences asks of attention: for every layer,
 * every (sequence, KV head) tile, one thread, in the order the CPU backend runs them.  It is
 * timed twice: hot (the same step again and again: its KV, 19 MB at 32 x 48 positions, stays in
 * the L3 cache) and cold (each step on
 * another copy of the KV, 256 MiB in all, so that it comes from DRAM as it does when a decode
 * step's 134 MB of weights have streamed through the caches in between).  Every figure is the
 * best of many batches of steps; per tile and per step, one thread.
 *
 * Results on the development machine (2-core AMD EPYC Zen 4 VM, AVX-512 VNNI), 2026-11-21,
 * defaults (32 sequences x 48 positions), alternating runs:
 *
 *                                        hot                    cold
 *   before (commit 97769a6)              4.06 ms, 1.41 us/tile   4.00 ms, 1.39 us/tile
 *   after                                3.30 ms, 1.15 us/tile   3.40 ms, 1.18 us/tile
 *
 * What changed: the key and value scales are prefetched with the keys and values (without any
 * prefetching a tile takes 2.0 us: even "hot" KV is an L3 trip per block), scores are made 16
 * lanes at a time, value rows are widened straight from memory, and the KV pool sits on
 * transparent huge pages.  Hot and cold are alike: the tile is bound by its
 * instructions (softmax, query quantization, the per-block set-up) more than by DRAM.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/attention.h"
#include "cpu/gemm.h"
#include "kv.h"

#define N_LAYERS 30
#define N_HEADS 9
#define N_KV 3
#define HD 64
#define COLD_BYTES ((size_t) 256 << 20)

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

static uint32_t
rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t) (rng_state >> 32);
}

typedef struct kv_copy
{
	cai_kv_pool *pool;
	int32_t    *tables;			/* [batch][blocks_per_seq] */
	const int32_t **table_rows;
} kv_copy;

/* A pool holding `batch` sequences of `context` positions of random int8 KV. */
static void
make_copy(kv_copy *c, const cai_kv_layout *L, int batch, int blocks_per_seq)
{
	cai_error	err;
	int			n_blocks = batch * blocks_per_seq;

	if (cai_kv_pool_create(L, n_blocks, &c->pool, &err) != CAI_OK)
	{
		fprintf(stderr, "kv pool: %s\n", err.message);
		exit(1);
	}
	c->tables = malloc(sizeof(int32_t) * n_blocks);
	c->table_rows = malloc(sizeof(int32_t *) * batch);
	/* blocks handed out interleaved across sequences, as a busy server's pool would */
	for (int b = 0; b < blocks_per_seq; b++)
		for (int s = 0; s < batch; s++)
			c->tables[s * blocks_per_seq + b] = cai_kv_block_alloc(c->pool);
	for (int s = 0; s < batch; s++)
		c->table_rows[s] = c->tables + (size_t) s * blocks_per_seq;
	for (int blk = 0; blk < n_blocks; blk++)
		for (int l = 0; l < N_LAYERS; l++)
		{
			uint8_t    *part = cai_kv_block_layer(c->pool, blk, l);
			float	   *ks = cai_kv_key_scales(L, part);
			float	   *vs = cai_kv_value_scales(L, part);

			for (size_t i = 0; i < (size_t) 2 * CAI_KV_BLOCK_TOKENS * N_KV * HD; i++)
				((int8_t *) part)[i] = (int8_t) ((int) (rng() % 255) - 127);
			for (int i = 0; i < CAI_KV_BLOCK_TOKENS * N_KV; i++)
			{
				ks[i] = 0.01f + (rng() % 1000) * 1e-5f;
				vs[i] = 0.01f + (rng() % 1000) * 1e-5f;
			}
		}
}

/* The attention of a prompt of `context` tokens over one layer, in prefill tiles. */
static int
bench_prefill(const cai_kv_layout *L, int context)
{
	int			blocks = (context + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS;
	int			group = N_HEADS / N_KV;
	int			tile = cai_attention_tile_tokens(group);
	kv_copy		c;
	int32_t    *pos = malloc(sizeof(int32_t) * context);
	int32_t    *seq = calloc(context, sizeof(int32_t));
	int32_t		start = 0,
				len = context;
	float	   *q = malloc(sizeof(float) * context * N_HEADS * HD);
	float	   *out = malloc(sizeof(float) * context * N_HEADS * HD);
	void	   *scratch_mem = aligned_alloc(64, (cai_attention_scratch_bytes(context, group, HD) + 63) & ~(size_t) 63);
	cai_attn_scratch scratch;
	cai_attn_params ap = {.n_heads = N_HEADS, .n_kv_heads = N_KV, .head_dim = HD, .window = 0,
	.scale = 0.125f, .kv_layer = 0};
	double		best = 1e30;

	make_copy(&c, L, 1, blocks);
	for (int t = 0; t < context; t++)
		pos[t] = t;
	for (int i = 0; i < context * N_HEADS * HD; i++)
		q[i] = (float) ((int) (rng() % 2001) - 1000) * 1e-3f;
	cai_attention_scratch_init(&scratch, scratch_mem, context, group, HD);
	for (int rep = 0; rep < 12; rep++)
	{
		cai_batch_layout bl = {.n_tokens = context, .n_seqs = 1, .token_pos = pos,
			.token_seq = seq, .seq_start = &start, .seq_len = &len,
		.block_tables = c.table_rows};
		double		t0 = now();

		for (int t = 0; t < context; t += tile)
			for (int h = 0; h < N_KV; h++)
				cai_attention_tile(&ap, &bl, 0, h, t, context - t < tile ? context - t : tile, q,
								   N_HEADS * HD, c.pool, NULL, out, N_HEADS * HD, &scratch);
		if (now() - t0 < best)
			best = now() - t0;
	}
	printf("prefill attention, %s, %d tokens, one layer of %d/%d heads of %d, one thread: "
		   "%.1f ms\n", cai_cpu_isa(), context, N_HEADS, N_KV, HD, best * 1e3);
	return 0;
}

int
main(int argc, char **argv)
{
	const char *isa = argc > 1 ? argv[1] : NULL;
	int			context = argc > 2 ? atoi(argv[2]) : 48;
	int			batch = argc > 3 ? atoi(argv[3]) : 32;
	int			blocks_per_seq = (context + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS;
	cai_kv_layout L = {0};
	size_t		part = (size_t) CAI_KV_BLOCK_TOKENS * N_KV * (2 * (size_t) HD + 2 * sizeof(float));
	int			n_copies;
	kv_copy    *copies;
	int32_t    *pos,
			   *seq,
			   *start,
			   *len;
	float	   *q,
			   *out;
	cai_attn_scratch scratch;
	void	   *scratch_mem;
	cai_attn_params ap = {.n_heads = N_HEADS, .n_kv_heads = N_KV, .head_dim = HD, .window = 0,
	.scale = 0.125f};

	if (isa && !cai_cpu_force_isa(isa))
	{
		fprintf(stderr, "this CPU cannot run %s\n", isa);
		return 1;
	}
	L.n_kv_layers = N_LAYERS;
	L.n_kv_heads = N_KV;
	L.head_dim = HD;
	L.layer_bytes = (part + 63) & ~(size_t) 63;
	L.block_bytes = L.layer_bytes * N_LAYERS;
	if (argc > 3 && strcmp(argv[3], "prefill") == 0 && context >= 1)
		return bench_prefill(&L, context);
	if (context < 1 || batch < 1)
	{
		fprintf(stderr, "usage: bench_attention [isa [context [batch | prefill]]]\n");
		return 1;
	}
	n_copies = (int) (COLD_BYTES / (L.block_bytes * batch * blocks_per_seq)) + 1;
	copies = calloc(n_copies, sizeof(kv_copy));
	for (int i = 0; i < n_copies; i++)
		make_copy(&copies[i], &L, batch, blocks_per_seq);

	/* one decode token per sequence, at position context - 1 */
	pos = malloc(sizeof(int32_t) * batch);
	seq = malloc(sizeof(int32_t) * batch);
	start = malloc(sizeof(int32_t) * batch);
	len = malloc(sizeof(int32_t) * batch);
	for (int s = 0; s < batch; s++)
	{
		pos[s] = context - 1;
		seq[s] = start[s] = s;
		len[s] = 1;
	}
	q = malloc(sizeof(float) * batch * N_HEADS * HD);
	out = malloc(sizeof(float) * batch * N_HEADS * HD);
	for (int i = 0; i < batch * N_HEADS * HD; i++)
		q[i] = (float) ((int) (rng() % 2001) - 1000) * 1e-3f;
	scratch_mem = aligned_alloc(64, (cai_attention_scratch_bytes(context, N_HEADS / N_KV, HD) + 63) & ~(size_t) 63);
	cai_attention_scratch_init(&scratch, scratch_mem, context, N_HEADS / N_KV, HD);

	printf("decode attention, %s, %d sequences x %d positions, %d layers, %d/%d heads of %d, "
		   "one thread\n", cai_cpu_isa(), batch, context, N_LAYERS, N_HEADS, N_KV, HD);
	for (int cold = 0; cold < 2; cold++)
	{
		double		best = 1e30;
		int			copy = 0;

		for (int rep = 0; rep < 40; rep++)
		{
			double		t0 = now();
			int			steps = 8;

			for (int st = 0; st < steps; st++)
			{
				kv_copy    *c = &copies[cold ? copy : 0];
				cai_batch_layout bl = {.n_tokens = batch, .n_seqs = batch, .token_pos = pos,
					.token_seq = seq, .seq_start = start, .seq_len = len,
				.block_tables = c->table_rows};

				copy = (copy + 1) % n_copies;
				for (int l = 0; l < N_LAYERS; l++)
				{
					ap.kv_layer = l;
					for (int s = 0; s < batch; s++)
						for (int h = 0; h < N_KV; h++)
							cai_attention_tile(&ap, &bl, s, h, s, 1, q, N_HEADS * HD, c->pool,
											   NULL, out, N_HEADS * HD, &scratch);
				}
			}
			if ((now() - t0) / steps < best)
				best = (now() - t0) / steps;
		}
		printf("  %s: %.3f ms per step, %.3f us per tile\n", cold ? "cold" : "hot ",
			   best * 1e3, best * 1e6 / (N_LAYERS * batch * N_KV));
	}
	return 0;
}
