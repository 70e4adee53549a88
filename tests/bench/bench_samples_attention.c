/*
 * bench_samples_attention.c — micro-benchmark of a decode step's attention for n = 8 samples of
 * one prompt through the CPU backend's table (cpu/backend_cpu.c), one thread: the samples'
 * tables hold the same blocks below the fork and blocks of their own from there, as copy on
 * write leaves them, so that the backend's shared tiles (cpu/attention_sharing.h) apply.
 *
 * Not part of the Makefile; build and run by hand from the repository root after `make`:
 *
 *   gcc -O2 -std=gnu11 -Isrc/common -Isrc/gguf -Isrc/backend -o /tmp/bench_samples_attention \
 *       tests/bench/bench_samples_attention.c build/libcai.a -lxxhash -lpthread -lm -ldl
 *   /tmp/bench_samples_attention N_HEADS N_KV_HEADS POSITION FORK SHARED LAYERS
 *
 * e.g. `9 3 1000 992 1 30` (SmolLM2-135M: 30 layers of 9 query heads over 3 KV heads of 64) or
 * `32 8 1000 992 1 16` (the Llama 3.2 1B shape); FORK is the prompt's last full block's end and
 * SHARED 0 gives every sample blocks of its own throughout (8 unrelated sequences).  It prints
 * the best of 20 steps' attention over all the layers.
 *
 * Xeon AMX VM (model 167), 2026-12-02, SHARED 1, 1 thread, ms a step (SmolLM2 / 1B shapes):
 * before the shared tiles (3d93905) 7.92 / 12.59; sharing whole segments only (the samples'
 * own tiles from the segment the fork lies in) 4.08 / 6.43; sharing to the block, as now,
 * 3.36 / 5.97.  Unrelated sequences (SHARED 0) take 9.31 / 17.28.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend.h"
#include "kv.h"
#include "threadpool.h"

#define N_SAMPLES 8
#define HEAD_DIM 64

static double
now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

int
main(int argc, char **argv)
{
	int			n_heads,
				n_kv,
				pos,
				fork,
				shared,
				layers,
				per_seq;
	cai_kv_layout L = {0};
	cai_kv_pool *pool;
	cai_threadpool *threads;
	cai_backend *be;
	cai_error	err;
	int32_t    *tables;
	int32_t		token_pos[N_SAMPLES],
				token_seq[N_SAMPLES],
				start[N_SAMPLES],
				len[N_SAMPLES];
	const int32_t *table_of[N_SAMPLES];
	cai_batch_layout batch;
	float	   *q,
			   *out;
	double		best = 1e30;
	uint64_t	rng = 1;

	if (argc != 7)
	{
		fprintf(stderr, "usage: %s N_HEADS N_KV_HEADS POSITION FORK SHARED LAYERS\n", argv[0]);
		return 2;
	}
	n_heads = atoi(argv[1]);
	n_kv = atoi(argv[2]);
	pos = atoi(argv[3]);
	fork = atoi(argv[4]);
	shared = atoi(argv[5]);
	layers = atoi(argv[6]);
	if (n_kv <= 0 || n_heads % n_kv != 0 || pos < 1 || fork < 0 || fork > pos || layers < 1)
	{
		fprintf(stderr, "bad arguments\n");
		return 2;
	}
	L.n_kv_layers = 1;
	L.n_kv_heads = n_kv;
	L.head_dim = HEAD_DIM;
	L.key_digits = 1;
	L.layer_bytes = ((size_t) CAI_KV_BLOCK_TOKENS * cai_kv_token_layer_bytes(n_kv, HEAD_DIM, 1)
					 + 63) & ~(size_t) 63;
	L.block_bytes = L.layer_bytes;
	per_seq = pos / CAI_KV_BLOCK_TOKENS + 1;
	if (cai_kv_pool_create(&L, N_SAMPLES * per_seq, &pool, &err) != CAI_OK)
		return 1;
	tables = malloc(sizeof(int32_t) * N_SAMPLES * per_seq);
	q = malloc(sizeof(float) * N_SAMPLES * n_heads * HEAD_DIM);
	out = malloc(sizeof(float) * N_SAMPLES * n_heads * HEAD_DIM);
	if (!tables || !q || !out)
		return 1;
	/* random int8 keys and values, the samples' blocks interleaved as a busy pool hands them out */
	for (int b = 0; b < per_seq; b++)
		for (int s = 0; s < N_SAMPLES; s++)
			tables[s * per_seq + b] = cai_kv_block_alloc(pool);
	for (int blk = 0; blk < N_SAMPLES * per_seq; blk++)
	{
		uint8_t    *p = cai_kv_block_layer(pool, blk, 0);

		for (size_t i = 0; i < (size_t) 2 * CAI_KV_BLOCK_TOKENS * n_kv * HEAD_DIM; i++)
		{
			rng = rng * 6364136223846793005ull + 1442695040888963407ull;
			((int8_t *) p)[i] = (int8_t) ((int) ((rng >> 33) % 255) - 127);
		}
		for (int i = 0; i < CAI_KV_BLOCK_TOKENS * n_kv; i++)
		{
			cai_kv_key_scales(&L, p)[i] = 0.02f;
			cai_kv_value_scales(&L, p)[i] = 0.01f;
		}
	}
	/* the forks: sample 0's blocks below the fork */
	for (int s = 1; shared && s < N_SAMPLES; s++)
		for (int b = 0; b < fork / CAI_KV_BLOCK_TOKENS; b++)
			tables[s * per_seq + b] = tables[b];
	for (int s = 0; s < N_SAMPLES; s++)
	{
		token_pos[s] = pos;
		token_seq[s] = s;
		start[s] = s;
		len[s] = 1;
		table_of[s] = tables + (size_t) s * per_seq;
	}
	batch = (cai_batch_layout) {
		.n_tokens = N_SAMPLES, .n_seqs = N_SAMPLES, .token_pos = token_pos,
		.token_seq = token_seq, .seq_start = start, .seq_len = len, .block_tables = table_of
	};
	for (int i = 0; i < N_SAMPLES * n_heads * HEAD_DIM; i++)
		q[i] = (float) ((i * 7919) % 200 - 100) / 50.0f;

	threads = cai_threadpool_create(1);
	{
		cai_backend_limits limits = {.max_tokens = N_SAMPLES, .max_context = pos + 1,
		.max_width = n_heads * HEAD_DIM, .n_heads = n_heads, .n_kv_heads = n_kv,
		.head_dim = HEAD_DIM};

		if (!threads || cai_backend_cpu_create(threads, &limits, &be, &err) != CAI_OK)
			return 1;
	}
	{
		cai_attn_params ap = {.n_heads = n_heads, .n_kv_heads = n_kv, .head_dim = HEAD_DIM,
		.scale = 0.125f};

		for (int rep = 0; rep < 20; rep++)
		{
			double		t0 = now();

			for (int l = 0; l < layers; l++)
				be->ops->attention(be, &ap, &batch, q, n_heads * HEAD_DIM, pool, NULL, out,
								   n_heads * HEAD_DIM);
			if (now() - t0 < best)
				best = now() - t0;
		}
	}
	printf("%d heads over %d, position %d, fork %d, %s: %.3f ms a step of %d layers\n", n_heads,
		   n_kv, pos, fork, shared ? "shared" : "unrelated", best * 1e3, layers);
	cai_backend_free(be);
	cai_threadpool_free(threads);
	cai_kv_pool_free(pool);
	free(tables);
	free(q);
	free(out);
	return 0;
}
