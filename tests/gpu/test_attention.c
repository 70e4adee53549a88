/*
 * test_attention.c — the KV write and paged attention kernels against the CPU backend's
 * kv_write and attention operations (cpu/backend_cpu.c, cpu/attention.c), bit for bit: the
 * int8 blocks and scales the new tokens leave behind, and every output element.
 *
 * Each case runs two steps on both sides: a history step (whole prompts from position 0, i.e.
 * ragged causal prefill) and a step of new tokens after that history (decodes and prefill
 * chunks mixed in one batch), over randomly permuted block tables.  A case may go on with decode
 * steps replayed from a captured CUDA graph, captured again whenever the plan outgrows it.  Its
 * keys are int8, or two-digit keys (kv.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "threadpool.h"
#include "gpu_util.h"
#include "kv.h"
#include "test.h"

#define MAX_SEQS 4

typedef struct attn_case
{
	const char *name;
	int			n_heads;
	int			n_kv_heads;
	int			head_dim;
	int			window;
	int			n_kv_layers;
	int			kv_layer;
	bool		shadow;			/* the float reference path */
	bool		graph_padding;	/* plan for a graph: padding rows, capacity grid */
	int			n_seqs;
	int			hist[MAX_SEQS];	/* positions already in the cache */
	int			n_new[MAX_SEQS];	/* new tokens of the second step */
	int			graph_steps;	/* then decode steps (a token per sequence) from a cuda graph */
	int			expect_captures;	/* captures those steps take */
	int			key_digits;		/* 2: two-digit keys (kv.h); 0 or 1: int8 keys */
} attn_case;

/* Host side of one step: the batch layout both backends read. */
typedef struct step_data
{
	int			T;
	int32_t		pos[4096];
	int32_t		seq[4096];
	int32_t		start[MAX_SEQS];
	int32_t		len[MAX_SEQS];
	const int32_t *tables[MAX_SEQS];
	cai_batch_layout batch;
	cai_cuda_seq_desc descs[MAX_SEQS];
	int			n_seqs;
} step_data;

/* Lays out a step of n_new[s] tokens at positions first[s].. (sequences with 0 are left out). */
static void
step_layout(step_data *sd, const attn_case *c, const int *first, const int *n_new,
			int32_t *const *tables)
{
	int			T = 0,
				ns = 0;

	for (int s = 0; s < c->n_seqs; s++)
	{
		if (n_new[s] <= 0)
			continue;
		sd->start[ns] = T;
		sd->len[ns] = n_new[s];
		sd->tables[ns] = tables[s];
		sd->descs[ns].n_new = n_new[s];
		sd->descs[ns].pos = first[s];
		sd->descs[ns].block_table = tables[s];
		sd->descs[ns].n_blocks = (first[s] + n_new[s] + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS;
		for (int i = 0; i < n_new[s]; i++)
		{
			sd->pos[T] = first[s] + i;
			sd->seq[T] = ns;
			T++;
		}
		ns++;
	}
	sd->T = T;
	sd->n_seqs = ns;
	sd->batch.n_tokens = T;
	sd->batch.n_seqs = ns;
	sd->batch.token_pos = sd->pos;
	sd->batch.token_seq = sd->seq;
	sd->batch.seq_start = sd->start;
	sd->batch.seq_len = sd->len;
	sd->batch.block_tables = sd->tables;
}

/* The fixed buffers a captured graph reads and writes, and how often it was captured. */
typedef struct graph_state
{
	float	   *qkv;
	float	   *out;
	int			captures;
} graph_state;

#define GRAPH_KEY 7

/* Enqueues one step's KV write and attention (directly, or into a capture). */
static bool
enqueue_step(const attn_case *c, const cai_cuda_step_meta *meta, const cai_cuda_kv *dkv,
			 const cai_cuda_kv_shadow *dshadow, float scale, const float *dqkv, float *dout,
			 cai_error *err)
{
	int			q_dim = c->n_heads * c->head_dim;
	int			kv_dim = c->n_kv_heads * c->head_dim;
	int			qkv_w = q_dim + 2 * kv_dim;

	return cai_cuda_kv_write(gpu_ctx(), dkv, c->kv_layer, meta, dqkv + q_dim,
							 dqkv + q_dim + kv_dim, qkv_w, dshadow, err) == CAI_OK &&
		cai_cuda_attention(gpu_ctx(), dkv, c->kv_layer, meta, dqkv, qkv_w, dout, q_dim,
						   c->n_heads, c->window, scale, dshadow, err) == CAI_OK;
}

/*
 * A decode step through a graph: the plan for rows = T + padding, then a replay of the stored
 * graph, or (when it does not cover this plan, which a replay must then refuse) a warm-up run
 * that sizes the scratch, a capture and a replay.  gout receives the rows.
 */
static bool
graph_step(const attn_case *c, const step_data *sd, int rows, const float *qkv,
		   const cai_cuda_kv *dkv, const cai_cuda_kv_shadow *dshadow, float scale,
		   graph_state *g, float *gout)
{
	int			q_dim = c->n_heads * c->head_dim;
	int			qkv_w = q_dim + 2 * c->n_kv_heads * c->head_dim;
	const cai_cuda_step_meta *meta;
	cai_error	err;

	if (!g->qkv)
	{
		int			max_blocks = 0;

		for (int s = 0; s < c->n_seqs; s++)
		{
			int			nb = (c->hist[s] + c->n_new[s] + c->graph_steps + CAI_KV_BLOCK_TOKENS - 1) /
				CAI_KV_BLOCK_TOKENS;

			max_blocks = nb > max_blocks ? nb : max_blocks;
		}
		/* plan buffers that never move, or every growth would drop the graph */
		if (!(g->qkv = gpu_alloc((size_t) rows * qkv_w * sizeof(float))) ||
			!(g->out = gpu_alloc((size_t) rows * q_dim * sizeof(float))) ||
			!gpu_ok(cai_cuda_step_reserve(gpu_ctx(), rows, c->n_seqs, max_blocks, c->n_heads,
										  c->n_kv_heads, c->head_dim, &err), &err, "reserve"))
			return false;
	}
	if (!gpu_ok(cai_cuda_upload_sync(gpu_ctx(), g->qkv, qkv, (size_t) rows * qkv_w * sizeof(float),
									 &err), &err, "graph input") ||
		!gpu_ok(cai_cuda_step_plan(gpu_ctx(), sd->descs, sd->n_seqs, NULL, rows, c->n_heads,
								   c->n_kv_heads, c->head_dim, true, &meta, &err), &err, "plan"))
		return false;
	if (!cai_cuda_graph_has(gpu_ctx(), GRAPH_KEY))
	{
		if (g->captures > 0)
			CHECK_MSG(cai_cuda_graph_launch(gpu_ctx(), GRAPH_KEY, &err) == CAI_ERR_NOT_FOUND,
					  "a graph replayed a plan it does not cover");
		if (!gpu_ok(enqueue_step(c, meta, dkv, dshadow, scale, g->qkv, g->out, &err) ? CAI_OK
					: CAI_ERR_INTERNAL, &err, "warm-up") ||
			!gpu_ok(cai_cuda_graph_begin(gpu_ctx(), &err), &err, "begin"))
			return false;
		if (!enqueue_step(c, meta, dkv, dshadow, scale, g->qkv, g->out, &err))
		{
			cai_cuda_graph_abort(gpu_ctx());
			CHECK_MSG(false, "capture: %s", err.message);
			return false;
		}
		if (!gpu_ok(cai_cuda_graph_end(gpu_ctx(), GRAPH_KEY, &err), &err, "end"))
			return false;
		g->captures++;
		CHECK(cai_cuda_graph_has(gpu_ctx(), GRAPH_KEY));
	}
	return gpu_ok(cai_cuda_graph_launch(gpu_ctx(), GRAPH_KEY, &err), &err, "replay") &&
		gpu_download(gout, g->out, (size_t) rows * q_dim * sizeof(float));
}

static void
run_case(const attn_case *c)
{
	int			q_dim = c->n_heads * c->head_dim;
	int			kv_dim = c->n_kv_heads * c->head_dim;
	int			qkv_w = q_dim + 2 * kv_dim;
	int			n_blocks = 0,
				max_ctx = 0;
	cai_kv_layout L = {0};
	cai_kv_pool *pool = NULL;
	cai_threadpool *tp = cai_threadpool_create(2);
	cai_backend *cpu = NULL;
	cai_backend_limits lim;
	cai_attn_params ap;
	cai_cuda_kv dkv = {0};
	cai_kv_shadow shadow = {0};
	cai_cuda_kv_shadow dshadow = {0};
	int32_t    *tables[MAX_SEQS] = {0};
	int32_t    *perm = NULL;
	graph_state graph = {0};
	float	   *qkv = NULL,
			   *cout = NULL,
			   *gout = NULL;
	gpu_rng		r;
	cai_error	err;
	size_t		part;

	fprintf(stderr, "    case %s\n", c->name);
	gpu_rng_seed(&r, (uint64_t) c->n_heads * 1000 + c->head_dim + c->window);
	for (int s = 0; s < c->n_seqs; s++)
	{
		int			end = c->hist[s] + c->n_new[s] + c->graph_steps;

		n_blocks += (end + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS;
		if (end > max_ctx)
			max_ctx = end;
	}
	n_blocks += 3;				/* blocks no sequence uses */

	part = (size_t) CAI_KV_BLOCK_TOKENS *
		cai_kv_token_layer_bytes(c->n_kv_heads, c->head_dim, c->key_digits);
	L.n_kv_layers = c->n_kv_layers;
	L.n_kv_heads = c->n_kv_heads;
	L.head_dim = c->head_dim;
	L.key_digits = c->key_digits;
	L.layer_bytes = (part + 63) & ~(size_t) 63;
	L.block_bytes = L.layer_bytes * c->n_kv_layers;
	if (cai_kv_pool_create(&L, n_blocks, &pool, &err) != CAI_OK)
	{
		CHECK_MSG(false, "kv pool: %s", err.message);
		goto done;
	}
	memset(cai_kv_block_layer(pool, 0, 0), 0, (size_t) n_blocks * L.block_bytes);

	lim.max_tokens = 4096;
	lim.max_context = max_ctx;
	lim.max_width = qkv_w;
	lim.n_heads = c->n_heads;
	lim.n_kv_heads = c->n_kv_heads;
	lim.head_dim = c->head_dim;
	if (cai_backend_cpu_create(tp, &lim, &cpu, &err) != CAI_OK)
	{
		CHECK_MSG(false, "cpu backend: %s", err.message);
		goto done;
	}

	/* block tables: a random permutation of the pool handed out in order */
	perm = malloc((size_t) n_blocks * sizeof(int32_t));
	if (!perm)
		goto done;
	for (int i = 0; i < n_blocks; i++)
		perm[i] = i;
	for (int i = n_blocks - 1; i > 0; i--)
	{
		int			j = gpu_rng_int(&r, 0, i);
		int32_t		t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	{
		int			at = 0;

		for (int s = 0; s < c->n_seqs; s++)
		{
			int			nb = (c->hist[s] + c->n_new[s] + c->graph_steps + CAI_KV_BLOCK_TOKENS - 1) /
				CAI_KV_BLOCK_TOKENS;

			tables[s] = perm + at;
			at += nb;
		}
	}

	/* the pools outlive the steps' buffers: allocated here, freed at the end */
	if (!gpu_ok(cai_cuda_malloc(gpu_ctx(), (size_t) n_blocks * L.block_bytes, "test kv",
								(void **) &dkv.pool_dev, &err), &err, "kv pool") ||
		!gpu_ok(cai_cuda_memset(gpu_ctx(), dkv.pool_dev, 0, (size_t) n_blocks * L.block_bytes, &err),
				&err, "memset"))
		goto done;
	dkv.n_blocks = n_blocks;
	dkv.block_bytes = L.block_bytes;
	dkv.layer_bytes = L.layer_bytes;
	dkv.n_kv_heads = c->n_kv_heads;
	dkv.head_dim = c->head_dim;
	dkv.key_digits = c->key_digits == 2 ? 2 : 1;
	if (c->shadow)
	{
		shadow.n_blocks = n_blocks;
		shadow.layer_floats = (size_t) 2 * CAI_KV_BLOCK_TOKENS * kv_dim;
		shadow.block_floats = shadow.layer_floats * c->n_kv_layers;
		shadow.data = calloc((size_t) n_blocks * shadow.block_floats, sizeof(float));
		if (!gpu_ok(cai_cuda_malloc(gpu_ctx(), (size_t) n_blocks * shadow.block_floats * sizeof(float),
									"test shadow", (void **) &dshadow.data_dev, &err), &err,
					"shadow"))
			goto done;
		dshadow.n_blocks = n_blocks;
		dshadow.layer_floats = shadow.layer_floats;
		dshadow.block_floats = shadow.block_floats;
		if (!shadow.data || !dshadow.data_dev ||
			!gpu_ok(cai_cuda_memset(gpu_ctx(), dshadow.data_dev, 0,
									(size_t) n_blocks * shadow.block_floats * sizeof(float), &err),
					&err, "memset"))
			goto done;
	}

	ap.n_heads = c->n_heads;
	ap.n_kv_heads = c->n_kv_heads;
	ap.head_dim = c->head_dim;
	ap.window = c->window;
	ap.kv_layer = c->kv_layer;
	ap.scale = 1.0f / sqrtf((float) c->head_dim);

	for (int step = 0; step < 2 + c->graph_steps; step++)
	{
		static step_data sd;
		int			first[MAX_SEQS],
					count[MAX_SEQS];
		const cai_cuda_step_meta *meta;
		float	   *dqkv,
				   *dout;
		int			T,
					pad;

		for (int s = 0; s < c->n_seqs; s++)
		{
			first[s] = step == 0 ? 0 : step == 1 ? c->hist[s] : c->hist[s] + c->n_new[s] + step - 2;
			count[s] = step == 0 ? c->hist[s] : step == 1 ? c->n_new[s] : 1;
		}
		step_layout(&sd, c, first, count, tables);
		T = sd.T;
		if (T == 0)
			continue;
		pad = c->graph_padding ? 5 : 0;
		qkv = malloc((size_t) (T + pad) * qkv_w * sizeof(float));
		cout = malloc((size_t) T * q_dim * sizeof(float));
		gout = malloc((size_t) (T + pad) * q_dim * sizeof(float));
		if (!qkv || !cout || !gout)
		{
			CHECK_MSG(false, "out of memory");
			goto done;
		}
		gpu_fill_f32(&r, qkv, (size_t) (T + pad) * qkv_w, -2.0f, 2.0f);
		/* a zero query head: its int8 scale is 0, so every score is 0 */
		memset(qkv, 0, (size_t) c->head_dim * sizeof(float));

		/* cpu */
		cpu->ops->kv_write(cpu, &ap, &sd.batch, qkv + q_dim, qkv + q_dim + kv_dim, qkv_w, pool,
						   c->shadow ? &shadow : NULL);
		cpu->ops->attention(cpu, &ap, &sd.batch, qkv, qkv_w, pool, c->shadow ? &shadow : NULL,
							cout, q_dim);

		/* gpu */
		if (step >= 2)
		{
			if (!graph_step(c, &sd, T + pad, qkv, &dkv, c->shadow ? &dshadow : NULL, cai_attn_score_scale(&ap),
							&graph, gout))
				goto done;
		}
		else if (!(dqkv = gpu_upload(qkv, (size_t) (T + pad) * qkv_w * sizeof(float))) ||
			!(dout = gpu_alloc((size_t) (T + pad) * q_dim * sizeof(float))) ||
			!gpu_ok(cai_cuda_step_plan(gpu_ctx(), sd.descs, sd.n_seqs, NULL, T + pad, c->n_heads,
									   c->n_kv_heads, c->head_dim, c->graph_padding, &meta, &err),
					&err, "plan") ||
			!gpu_ok(cai_cuda_kv_write(gpu_ctx(), &dkv, c->kv_layer, meta, dqkv + q_dim,
									  dqkv + q_dim + kv_dim, qkv_w, c->shadow ? &dshadow : NULL,
									  &err), &err, "kv write") ||
			!gpu_ok(cai_cuda_attention(gpu_ctx(), &dkv, c->kv_layer, meta, dqkv, qkv_w, dout, q_dim,
									   c->n_heads, c->window, cai_attn_score_scale(&ap),
									   c->shadow ? &dshadow : NULL, &err), &err, "attention") ||
			!gpu_download(gout, dout, (size_t) (T + pad) * q_dim * sizeof(float)))
			goto done;
		gpu_same_f32(gout, cout, (size_t) T * q_dim, step == 0 ? "prefill attention" : "step attention");
		if (pad > 0)
		{
			/* padding rows are left alone: still the 0xff poison */
			bool		untouched = true;

			for (size_t i = (size_t) T * q_dim; i < (size_t) (T + pad) * q_dim; i++)
				untouched &= isnan(gout[i]);
			CHECK_MSG(untouched, "attention wrote padding rows");
		}

		/* the KV the step's tokens left in their blocks: int8 values and scales */
		{
			uint8_t    *blocks = malloc((size_t) n_blocks * L.block_bytes);

			if (blocks && gpu_download(blocks, dkv.pool_dev, (size_t) n_blocks * L.block_bytes))
			{
				size_t		bad = 0;

				for (int t = 0; t < T; t++)
				{
					int32_t		b = sd.tables[sd.seq[t]][sd.pos[t] / CAI_KV_BLOCK_TOKENS];
					int			slot = sd.pos[t] % CAI_KV_BLOCK_TOKENS;
					size_t		off = (size_t) b * L.block_bytes + (size_t) c->kv_layer * L.layer_bytes;
					uint8_t    *cpart = cai_kv_block_layer(pool, b, c->kv_layer);
					uint8_t    *gpart = blocks + off;

					for (int h = 0; h < c->n_kv_heads; h++)
					{
						size_t		at = ((size_t) slot * c->n_kv_heads + h) * c->head_dim;
						size_t		v_off = (size_t) CAI_KV_BLOCK_TOKENS * kv_dim;
						size_t		s_off = 2 * v_off;
						size_t		si = (size_t) slot * c->n_kv_heads + h;

						bad += memcmp(gpart + at, cpart + at, c->head_dim) != 0;
						bad += memcmp(gpart + v_off + at, cpart + v_off + at, c->head_dim) != 0;
						bad += memcmp(gpart + s_off + 4 * si, cpart + s_off + 4 * si, 4) != 0;
						bad += memcmp(gpart + s_off + 4 * (CAI_KV_BLOCK_TOKENS * c->n_kv_heads + si),
									  cpart + s_off + 4 * (CAI_KV_BLOCK_TOKENS * c->n_kv_heads + si),
									  4) != 0;
						if (c->key_digits == 2)
						{
							size_t		k2_off = (size_t) ((uint8_t *) cai_kv_key_second_digits(&L, cpart) - cpart);

							bad += memcmp(gpart + k2_off + at, cpart + k2_off + at, c->head_dim) != 0;
						}
					}
				}
				CHECK_MSG(bad == 0, "%zu key/value heads or scales differ from the cpu's", bad);
			}
			free(blocks);
		}
		free(qkv);
		free(cout);
		free(gout);
		qkv = cout = gout = NULL;
	}
	if (c->graph_steps > 0)
		CHECK_MSG(graph.captures == c->expect_captures,
				  "%d graph captures for %d decode steps, expected %d", graph.captures,
				  c->graph_steps, c->expect_captures);
done:
	cai_cuda_graph_reset(gpu_ctx());
	free(qkv);
	free(cout);
	free(gout);
	free(perm);
	cai_cuda_free(gpu_ctx(), dkv.pool_dev);
	cai_cuda_free(gpu_ctx(), dshadow.data_dev);
	free(shadow.data);
	cai_backend_free(cpu);
	cai_kv_pool_free(pool);
	cai_threadpool_free(tp);
}

TEST(gpu_attention_gqa_ragged_batch)
{
	/* SmolLM2's geometry: 9 query heads over 3 KV heads; tiles of 64 rows cut tokens in thirds */
	attn_case	c = {"gqa 9/3 hd64", 9, 3, 64, 0, 1, 0, false, false, 4,
		{0, 50, 20, 130}, {37, 1, 13, 1}, 0, 0, 1};

	run_case(&c);
}

TEST(gpu_attention_mha_head_dim_128)
{
	attn_case	c = {"mha 4/4 hd128", 4, 4, 128, 0, 2, 1, false, false, 2, {70, 33}, {1, 1}, 0, 0, 1};

	run_case(&c);
}

TEST(gpu_attention_mqa_sliding_window)
{
	attn_case	c = {"mqa 8/1 hd64 window 24", 8, 1, 64, 24, 1, 0, false, false, 3,
		{40, 100, 7}, {9, 3, 30}, 0, 0, 1};

	run_case(&c);
}

TEST(gpu_attention_head_dim_256)
{
	attn_case	c = {"gqa 4/2 hd256", 4, 2, 256, 0, 1, 0, false, false, 2, {20, 45}, {5, 1}, 0, 0, 1};

	run_case(&c);
}

TEST(gpu_attention_float_reference_path)
{
	attn_case	c = {"shadow gqa 4/2 hd64", 4, 2, 64, 0, 2, 1, true, false, 2, {30, 17}, {2, 5}, 0, 0, 1};

	run_case(&c);
}

TEST(gpu_attention_long_context_decode)
{
	attn_case	c = {"long 2/1 hd128", 2, 1, 128, 0, 1, 0, false, false, 2, {1000, 333}, {1, 1}, 0, 0, 1};

	/*
	 * the decode kernel (a block per tile, KV head and segment); the tiled kernel split along
	 * the context and merged; then each block of the tiled kernel walking its segments
	 */
	run_case(&c);
	setenv("CAI_CUDA_ATTENTION", "tiled", 1);
	c.name = "long 2/1 hd128, tiled";
	run_case(&c);
	setenv("CAI_CUDA_ATTENTION", "whole", 1);
	c.name = "long 2/1 hd128, not split";
	run_case(&c);
	unsetenv("CAI_CUDA_ATTENTION");
}

/*
 * Rows across several of the 256-position segments (cpu/attention.h), prefill chunks whose rows
 * straddle a segment boundary, with a window, and on the float reference path: the same bits.
 */
TEST(gpu_attention_segments_prefill_and_window)
{
	attn_case	c = {"segments gqa 9/3 hd64 window 300", 9, 3, 64, 300, 1, 0, false, false, 2,
		{700, 240}, {40, 30}, 0, 0, 1};

	run_case(&c);
	setenv("CAI_CUDA_ATTENTION", "whole", 1);
	c.name = "segments gqa 9/3 hd64 window 300, not split";
	run_case(&c);
	unsetenv("CAI_CUDA_ATTENTION");
}

TEST(gpu_attention_segments_float_reference_path)
{
	attn_case	c = {"segments shadow mqa 4/1 hd256", 4, 1, 256, 0, 1, 0, true, false, 1,
		{600}, {3}, 0, 0, 1};

	run_case(&c);
}

TEST(gpu_attention_graph_plan_with_padding)
{
	attn_case	c = {"graph plan 9/3 hd64", 9, 3, 64, 0, 1, 0, false, true, 3,
		{16, 31, 5}, {1, 1, 1}, 0, 0, 1};

	run_case(&c);
}

/* The decode kernel with a window that starts in the segment before, and with head_dim 256. */
TEST(gpu_attention_decode_kernel_window_and_head_dim_256)
{
	attn_case	w = {"decode mqa 8/1 hd64 window 24", 8, 1, 64, 24, 1, 0, false, false, 3,
		{270, 40, 7}, {1, 1, 2}, 0, 0, 1};
	attn_case	h = {"decode gqa 4/2 hd256 long", 4, 2, 256, 0, 1, 0, false, false, 2,
		{600, 257}, {3, 1}, 0, 0, 1};

	run_case(&w);
	run_case(&h);
}

/*
 * Decode steps replayed from a captured graph, its attention split along the context: the
 * longest row crosses from two segments to three (rounded up: four), which the graph captured
 * for two does not cover, so it is refused and captured again.  Every step equals the CPU.
 */
TEST(gpu_attention_graph_replays_split_decode)
{
	attn_case	c = {"graph decode 9/3 hd64", 9, 3, 64, 0, 1, 0, false, true, 3,
		{500, 200, 40}, {1, 1, 1}, 14, 2, 1};

	run_case(&c);
}

/*
 * Two-digit keys (the two_digit mode): the second digits the KV write leaves and the scores
 * 254 (q . k) + q . k2 of the tiled kernel (a prefill across segments, windowed), of the decode
 * kernel at head size 256 (its largest shared memory), and of decode steps replayed as graphs.
 */
TEST(gpu_attention_two_digit_keys)
{
	attn_case	tiled = {"two-digit keys gqa 9/3 hd64 window 300", 9, 3, 64, 300, 1, 0, false,
		false, 2, {700, 240}, {40, 30}, 0, 0, 2};
	attn_case	decode = {"two-digit keys mqa 4/1 hd256 decode", 4, 1, 256, 0, 2, 1, false, false,
		2, {600, 257}, {1, 3}, 0, 0, 2};
	attn_case	graph = {"two-digit keys graph decode 9/3 hd64", 9, 3, 64, 0, 1, 0, false, true, 3,
		{500, 200, 40}, {1, 1, 1}, 14, 2, 2};

	run_case(&tiled);
	run_case(&decode);
	run_case(&graph);
}
