/*
 * test_windowed_kv.c — window-bounded KV (kv.h's window parts, engine.c's quotas): the pool's
 * window parts and their accounting; a Gemma-3-shaped model served with its local layers' KV
 * bounded to the window gives the same tokens as with every position kept, through chunked
 * prefill, batching, the prefix cache and its evictions; and at a 4096-token context Gemma 3
 * 270M's KV costs at least 3.5 times fewer bytes per token than with every layer global.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cai.h"
#include "kv.h"
#include "model.h"
#include "synth_model.h"
#include "test.h"

TEST(kv_pool_window_parts)
{
	cai_kv_layout L = {0};
	cai_kv_pool *pool = NULL;
	cai_error	err;
	int32_t		a,
				b,
				c;
	size_t		part = (size_t) CAI_KV_BLOCK_TOKENS * (2 * 8 + 2 * sizeof(float));

	L.n_kv_layers = 3;
	L.n_windowed_layers = 2;
	L.window = 32;
	L.n_kv_heads = 1;
	L.head_dim = 8;
	L.layer_bytes = (part + 63) & ~(size_t) 63;
	L.block_bytes = 3 * L.layer_bytes;
	CHECK(cai_kv_pool_create_windowed(&L, 4, 5, &pool, &err) == CAI_ERR_INVALID_ARGUMENT);
	CHECK(cai_kv_pool_create_windowed(&L, 4, 2, &pool, &err) == CAI_OK);
	if (!pool)
		return;
	CHECK_EQ_INT((int) cai_kv_pool_bytes(pool), (int) (4 * L.layer_bytes + 2 * 2 * L.layer_bytes));
	CHECK_EQ_INT((int) cai_kv_pool_bytes_in_use(pool), 0);

	/* whole blocks while window parts last */
	a = cai_kv_block_alloc(pool);
	b = cai_kv_block_alloc(pool);
	CHECK(a >= 0 && b >= 0);
	CHECK_EQ_INT(cai_kv_block_alloc(pool), -1);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 2);
	c = cai_kv_block_alloc_without_window(pool);
	CHECK(c >= 0 && !cai_kv_block_has_window(pool, c));
	CHECK(cai_kv_block_layer(pool, c, 0) != NULL);
	CHECK(cai_kv_block_layer(pool, c, 1) == NULL && cai_kv_block_layer(pool, c, 2) == NULL);
	CHECK(!cai_kv_block_add_window(pool, c));
	CHECK_EQ_INT((int) cai_kv_pool_bytes_in_use(pool), (int) (3 * L.layer_bytes + 2 * 2 * L.layer_bytes));

	/* a part dropped goes to the next block that asks; its global KV stays */
	memset(cai_kv_block_layer(pool, a, 0), 7, L.layer_bytes);
	memset(cai_kv_block_layer(pool, a, 2), 9, L.layer_bytes);
	memset(cai_kv_block_layer(pool, b, 1), 5, L.layer_bytes);
	cai_kv_block_drop_window(pool, a);
	CHECK(!cai_kv_block_has_window(pool, a) && cai_kv_block_layer(pool, a, 1) == NULL);
	CHECK_EQ_INT(cai_kv_block_layer(pool, a, 0)[L.layer_bytes - 1], 7);
	CHECK(cai_kv_block_add_window(pool, c));
	CHECK(cai_kv_block_layer(pool, c, 1) != NULL);
	CHECK(cai_kv_block_layer(pool, c, 1) != cai_kv_block_layer(pool, b, 1));
	CHECK(cai_kv_block_layer(pool, c, 2) == cai_kv_block_layer(pool, c, 1) + L.layer_bytes);

	/* rows are copied between window parts, and only global parts where one lacks its own */
	cai_kv_block_copy_rows(pool, b, c, 16);
	CHECK_EQ_INT(cai_kv_block_layer(pool, c, 1)[0], 5);
	cai_kv_block_copy_rows(pool, a, c, 16);
	CHECK_EQ_INT(cai_kv_block_layer(pool, c, 0)[0], 7);
	CHECK_EQ_INT(cai_kv_block_layer(pool, c, 1)[0], 5);

	/* the last reference frees the window part with the block; a second release changes nothing */
	cai_kv_block_ref(pool, c);
	cai_kv_block_unref(pool, c);
	CHECK_EQ_INT(cai_kv_pool_n_free_window_parts(pool), 0);
	cai_kv_block_unref(pool, c);
	cai_kv_block_unref(pool, c);
	CHECK_EQ_INT(cai_kv_pool_n_free_window_parts(pool), 1);
	cai_kv_block_unref(pool, a);
	cai_kv_block_unref(pool, b);
	CHECK_EQ_INT(cai_kv_pool_n_free_window_parts(pool), 2);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 4);
	CHECK_EQ_INT((int) cai_kv_pool_bytes_in_use(pool), 0);
	cai_kv_pool_free(pool);

	/* without windowed layers every block counts as whole */
	L.n_windowed_layers = 0;
	L.window = 0;
	CHECK(cai_kv_pool_create(&L, 2, &pool, &err) == CAI_OK);
	if (!pool)
		return;
	a = cai_kv_block_alloc_without_window(pool);
	CHECK(cai_kv_block_has_window(pool, a) && cai_kv_block_layer(pool, a, 2) != NULL);
	CHECK_EQ_INT(cai_kv_pool_n_window_parts(pool), 0);
	cai_kv_pool_free(pool);
}

/* A Gemma-3-shaped synthetic model: 1 KV head, every 6th layer global, the others windowed. */
static cai_model *
load_gemma_shape(int n_layers, int d_model, int n_heads, int head_dim, int window, int context,
				 uint64_t seed)
{
	synth_model_config cfg;
	cai_model_params mp;
	cai_model  *model = NULL;
	cai_error	err;
	char		path[256];

	synth_model_default_config(&cfg);
	cfg.arch = "gemma3";
	cfg.n_layers = n_layers;
	cfg.d_model = d_model;
	cfg.n_heads = n_heads;
	cfg.n_kv_heads = 1;
	cfg.head_dim = head_dim;
	cfg.d_ff = 2 * d_model;
	cfg.sliding_window = window;
	cfg.context_length = context;
	cfg.rope_base = 1000000.0f;
	cfg.rms_eps = 1e-6f;
	cfg.seed = seed;
	snprintf(path, sizeof(path), "/tmp/cai_test_windowed_%d.gguf", (int) getpid());
	if (synth_model_write(path, &cfg, &err) != CAI_OK)
	{
		fprintf(stderr, "    synth_model_write: %s\n", err.message);
		return NULL;
	}
	/* one-digit keys: the KV sizes below are the int8 layout's */
	cai_model_params_default(&mp);
	mp.n_threads = 2;
	mp.activations = CAI_ACTIVATIONS_INT8;
	if (cai_model_load(path, &mp, &model, &err) != CAI_OK)
		fprintf(stderr, "    cai_model_load: %s\n", err.message);
	unlink(path);
	return model;
}

static cai_engine *
windowed_engine(cai_model *model, bool whole_kv, int max_running, int step_tokens,
				int context, size_t cache_bytes)
{
	cai_engine_params ep;
	cai_engine *engine = NULL;
	cai_error	err;

	cai_engine_params_default(&ep);
	ep.device = "cpu";
	ep.n_threads = 2;
	ep.max_running = max_running;
	ep.max_step_tokens = step_tokens;
	ep.context_length = context;
	ep.host_cache_bytes = cache_bytes;
	ep.whole_kv = whole_kv;
	if (cai_engine_create(model, &ep, &engine, &err) != CAI_OK)
		fprintf(stderr, "    cai_engine_create: %s\n", err.message);
	return engine;
}

#define MAX_REPLY 48

typedef struct reply
{
	int32_t		tokens[MAX_REPLY];
	int			n_tokens;
	int			cached_tokens;
	bool		done;
} reply;

/*
 * Runs n requests submitted together to the end; with stats, checks after every step that the
 * running requests' window parts stay within the pool and that the pool's bytes add up.
 */
static bool
run_together(cai_engine *engine, cai_request_params *reqs, int n, reply *out)
{
	uint64_t	id;
	int			done = 0;
	cai_error	err;

	memset(out, 0, sizeof(reply) * n);
	for (int i = 0; i < n; i++)
	{
		reqs[i].user_data = &out[i];
		if (cai_engine_submit(engine, &reqs[i], &id, &err) != CAI_OK)
		{
			fprintf(stderr, "    submit: %s\n", err.message);
			return false;
		}
	}
	while (done < n)
	{
		const cai_event *events;
		int			n_events;

		if (cai_engine_step(engine, &events, &n_events, &err) != CAI_OK)
		{
			fprintf(stderr, "    step: %s\n", err.message);
			return false;
		}
		for (int e = 0; e < n_events; e++)
		{
			reply	   *r = events[e].user_data;

			if (events[e].token >= 0 && r->n_tokens < MAX_REPLY)
				r->tokens[r->n_tokens++] = events[e].token;
			if (events[e].finish != CAI_FINISH_NONE)
			{
				if (events[e].finish == CAI_FINISH_ERROR)
					fprintf(stderr, "    request failed: %s\n", events[e].error);
				r->cached_tokens = events[e].usage.cached_tokens;
				r->done = events[e].finish != CAI_FINISH_ERROR;
				done++;
			}
		}
	}
	for (int i = 0; i < n; i++)
		if (!out[i].done)
			return false;
	return true;
}

static void
random_tokens(int32_t *out, int n, uint32_t seed)
{
	uint32_t	x = seed * 2654435761u + 99u;

	for (int i = 0; i < n; i++)
	{
		x = x * 1664525u + 1013904223u;
		out[i] = SYNTH_FIRST_BYTE_TOKEN + (int32_t) ((x >> 8) % 300u);
	}
}

/*
 * Conversations played turn by turn on two engines over one model, one dropping the windowed
 * layers' KV behind the window and one keeping it all: the same tokens every turn.  Sampled at a
 * high temperature (seeded), since this small random model's greedy choice barely depends on
 * its KV while a sampled draw moves with any change in the probabilities.  Prefill chunks of
 * 24 tokens cross the window of 40 tokens; three conversations run batched; a cache of a few
 * conversations' worth evicts; each turn resumes after the previous one, inside a block.
 */
TEST(engine_windowed_kv_gives_the_same_tokens)
{
	enum
	{
		N_CONV = 3, N_TURNS = 5, MAX_LEN = 400
	};
	cai_model  *model = load_gemma_shape(6, 64, 2, 32, 40, 512, 41);
	cai_engine *bounded = NULL;
	cai_engine *whole = NULL;
	cai_model_info info;
	int32_t		conv[N_CONV][MAX_LEN];
	int			len[N_CONV];
	int			computed[N_CONV] = {0};
	cai_request_params reqs[N_CONV];
	reply		rb[N_CONV],
				rw[N_CONV];
	cai_engine_stats sb,
				sw;
	int			resumed_at_end = 0;
	int			hits = 0;

	CHECK(model != NULL);
	if (!model)
		return;
	cai_model_get_info(model, &info);
	CHECK_EQ_INT(info.kv_window, 40);
	/* 5 of 6 layers windowed */
	CHECK_EQ_INT((int) (6 * info.kv_window_bytes_per_token), (int) (5 * info.kv_bytes_per_token));

	/* room for about one conversation and a half in the cache */
	bounded = windowed_engine(model, false, 4, 24, 512, 36 * 16 * info.kv_bytes_per_token);
	whole = windowed_engine(model, true, 4, 24, 512, 36 * 16 * info.kv_bytes_per_token);
	if (!bounded || !whole)
	{
		CHECK(bounded && whole);
		goto done;
	}
	cai_engine_get_stats(bounded, &sb);
	cai_engine_get_stats(whole, &sw);
	CHECK(sb.kv_bytes_total < sw.kv_bytes_total);
	CHECK_EQ_INT(sb.kv_blocks_total, sw.kv_blocks_total);

	for (int c = 0; c < N_CONV; c++)
	{
		len[c] = 70 + 29 * c;
		random_tokens(conv[c], len[c], 300 + c);
	}
	for (int t = 0; t < N_TURNS; t++)
	{
		for (int c = 0; c < N_CONV; c++)
		{
			memset(&reqs[c], 0, sizeof(reqs[c]));
			reqs[c].prompt = conv[c];
			reqs[c].n_prompt = len[c];
			cai_sampling_params_default(&reqs[c].sampling);
			reqs[c].sampling.temperature = CAI_TEMPERATURE_MAX;
			reqs[c].sampling.seed = 17 + 5 * t + c;
			reqs[c].sampling.max_tokens = 9 + 7 * ((t + c) % 3);
			reqs[c].sampling.ignore_eos = true;
			reqs[c].use_cache = true;
			reqs[c].cache_salt = 1;
		}
		CHECK(run_together(bounded, reqs, N_CONV, rb));
		CHECK(run_together(whole, reqs, N_CONV, rw));
		for (int c = 0; c < N_CONV; c++)
		{
			int			user = 11 + (7 * t + 3 * c) % 13;

			CHECK_EQ_INT(rb[c].n_tokens, rw[c].n_tokens);
			CHECK(memcmp(rb[c].tokens, rw[c].tokens, sizeof(int32_t) * rb[c].n_tokens) == 0);
			CHECK(rb[c].cached_tokens <= computed[c]);
			hits += rb[c].cached_tokens > 0;
			resumed_at_end += t > 0 && rb[c].cached_tokens == computed[c];
			computed[c] = len[c] + rb[c].n_tokens - 1;
			if (len[c] + rb[c].n_tokens + user > MAX_LEN)
				continue;
			memcpy(conv[c] + len[c], rb[c].tokens, sizeof(int32_t) * rb[c].n_tokens);
			len[c] += rb[c].n_tokens;
			random_tokens(conv[c] + len[c], user, 500 + 10 * t + c);
			len[c] += user;
		}
	}
	CHECK(hits > 0);
	CHECK(resumed_at_end > 0);
	cai_engine_get_stats(bounded, &sb);
	cai_engine_get_stats(whole, &sw);
	CHECK(sb.cache_evictions > 0);
	/* within the same budget the cache keeps more blocks: most hold no windowed KV */
	CHECK(sb.cache_bytes <= sb.cache_budget_bytes && sw.cache_bytes <= sw.cache_budget_bytes);
	CHECK(sb.cache_blocks > sw.cache_blocks);

	/*
	 * A prompt that leaves the first turn of a conversation long before its end: the windowed KV
	 * there was dropped, so only the engine that kept it all reuses those positions.
	 */
	{
		int32_t		prompt[100];

		memcpy(prompt, conv[2], 90 * sizeof(int32_t));
		random_tokens(prompt + 90, 10, 999);
		memset(&reqs[0], 0, sizeof(reqs[0]));
		reqs[0].prompt = prompt;
		reqs[0].n_prompt = 100;
		cai_sampling_params_default(&reqs[0].sampling);
		reqs[0].sampling.temperature = CAI_TEMPERATURE_MAX;
		reqs[0].sampling.seed = 5;
		reqs[0].sampling.max_tokens = 6;
		reqs[0].sampling.ignore_eos = true;
		reqs[0].use_cache = true;
		reqs[0].cache_salt = 1;
		cai_engine_cache_reset(bounded);
		cai_engine_cache_reset(whole);
		/* the first turn alone again, stored afresh by both */
		reqs[1] = reqs[0];
		reqs[1].prompt = conv[2];
		reqs[1].n_prompt = 128;
		reqs[1].sampling.max_tokens = 12;
		CHECK(run_together(bounded, &reqs[1], 1, rb));
		CHECK(run_together(whole, &reqs[1], 1, rw));
		CHECK(run_together(bounded, reqs, 1, rb));
		CHECK(run_together(whole, reqs, 1, rw));
		CHECK(memcmp(rb[0].tokens, rw[0].tokens, sizeof(int32_t) * rb[0].n_tokens) == 0);
		CHECK_EQ_INT(rw[0].cached_tokens, 90);
		CHECK_EQ_INT(rb[0].cached_tokens, 0);
	}

	/* idle: every window part is free or the cache's; none once the cache is emptied */
	cai_engine_cache_reset(bounded);
	cai_engine_get_stats(bounded, &sb);
	CHECK_EQ_INT(sb.kv_blocks_free, sb.kv_blocks_total);
	CHECK_EQ_INT((int) sb.kv_bytes_used, 0);
done:
	cai_engine_free(bounded);
	cai_engine_free(whole);
	cai_model_free(model);
}

/*
 * Gemma 3 270M's KV shape (18 layers, every 6th global, 1 KV head of 256, window 512) at a
 * 4096-token context: the pool's own accounting, while the sequence runs, against every layer
 * global (kv_bytes_per_token).  The model's other sizes are small: they do not change the KV.
 */
TEST(engine_windowed_kv_bytes_per_token_at_4096)
{
	cai_model  *model = load_gemma_shape(18, 32, 1, 256, 512, 4096, 43);
	cai_engine *engine = NULL;
	cai_model_info info;
	cai_request_params req;
	int32_t    *prompt = malloc(4090 * sizeof(int32_t));
	uint64_t	id;
	cai_error	err;
	double		ratio = 0.0;
	int			done = 0;

	CHECK(model != NULL && prompt != NULL);
	if (!model || !prompt)
		goto done;
	cai_model_get_info(model, &info);
	CHECK_EQ_INT(info.kv_window, 512);
	CHECK_EQ_INT((int) info.kv_bytes_per_token, 18 * (2 * 256 + 2 * 4));
	engine = windowed_engine(model, false, 1, 512, 4096, 0);
	if (!engine)
	{
		CHECK(engine != NULL);
		goto done;
	}
	random_tokens(prompt, 4090, 77);
	memset(&req, 0, sizeof(req));
	req.prompt = prompt;
	req.n_prompt = 4090;
	cai_sampling_params_default(&req.sampling);
	req.sampling.temperature = 0.0f;
	req.sampling.max_tokens = 6;
	req.sampling.ignore_eos = true;
	CHECK(cai_engine_submit(engine, &req, &id, &err) == CAI_OK);
	while (!done)
	{
		const cai_event *events;
		int			n_events;
		cai_engine_stats st;

		if (cai_engine_step(engine, &events, &n_events, &err) != CAI_OK)
		{
			CHECK(0);
			break;
		}
		cai_engine_get_stats(engine, &st);
		/* the last steps with the request running: 4090 to 4094 positions held */
		if (st.kv_tokens_held >= 4090)
		{
			double		per_token = (double) st.kv_bytes_used / (double) st.kv_tokens_held;

			ratio = (double) info.kv_bytes_per_token / per_token;
			CHECK(st.kv_bytes_used <= st.kv_bytes_total);
		}
		for (int e = 0; e < n_events; e++)
			done |= events[e].finish != CAI_FINISH_NONE;
	}
	fprintf(stderr, "    %zu bytes per token all global, %.0f window-bounded: %.2fx smaller\n",
			info.kv_bytes_per_token, ratio > 0 ? info.kv_bytes_per_token / ratio : 0.0, ratio);
	CHECK(ratio >= 3.5);
done:
	cai_engine_free(engine);
	cai_model_free(model);
	free(prompt);
}

/* Scoring (cai eval) keeps a window behind each chunk: the same logits as keeping everything. */
TEST(engine_windowed_kv_scores_the_same)
{
	cai_model  *model = load_gemma_shape(6, 64, 2, 32, 40, 512, 45);
	cai_engine *bounded = NULL;
	cai_engine *whole = NULL;
	int32_t		tokens[300];
	float	   *lb = NULL;
	float	   *lw = NULL;
	int			V;
	cai_error	err;

	CHECK(model != NULL);
	if (!model)
		return;
	V = model->cfg.n_vocab;
	bounded = windowed_engine(model, false, 1, 24, 512, 0);
	whole = windowed_engine(model, true, 1, 24, 512, 0);
	lb = malloc(sizeof(float) * 300 * V);
	lw = malloc(sizeof(float) * 300 * V);
	CHECK(bounded && whole && lb && lw);
	if (!bounded || !whole || !lb || !lw)
		goto done;
	random_tokens(tokens, 300, 61);
	CHECK(cai_engine_score(bounded, tokens, 300, false, lb, &err) == CAI_OK);
	CHECK(cai_engine_score(whole, tokens, 300, false, lw, &err) == CAI_OK);
	CHECK(memcmp(lb, lw, sizeof(float) * 300 * V) == 0);
	/* and again: every window part went back */
	CHECK(cai_engine_score(bounded, tokens, 300, false, lw, &err) == CAI_OK);
	CHECK(memcmp(lb, lw, sizeof(float) * 300 * V) == 0);
done:
	free(lb);
	free(lw);
	cai_engine_free(bounded);
	cai_engine_free(whole);
	cai_model_free(model);
}

/*
 * n samples on a windowed model: the samples share the prompt's blocks, whose window parts the
 * first sample drops behind the window as it goes, and each sample's own blocks take and drop
 * theirs.  Sample i is the request with n 1 and seed + i on an engine that keeps all the KV,
 * and the pool gets every block and window part back.
 */
TEST(engine_windowed_kv_samples_share_the_prompt)
{
	cai_model  *model = load_gemma_shape(6, 64, 2, 32, 40, 512, 43);
	cai_engine *bounded = NULL;
	cai_engine *whole = NULL;
	int32_t		prompt[90];
	reply		together[4],
				alone;
	cai_engine_stats before,
				after;

	CHECK(model != NULL);
	if (!model)
		return;
	bounded = windowed_engine(model, false, 4, 24, 512, 0);
	whole = windowed_engine(model, true, 4, 24, 512, 0);
	if (!bounded || !whole)
	{
		CHECK(bounded && whole);
		goto done;
	}
	random_tokens(prompt, 90, 77);
	cai_engine_get_stats(bounded, &before);
	{
		cai_request_params req;
		uint64_t	id;
		cai_error	err;
		int			done = 0;

		memset(&req, 0, sizeof(req));
		memset(together, 0, sizeof(together));
		req.prompt = prompt;
		req.n_prompt = 90;
		cai_sampling_params_default(&req.sampling);
		req.sampling.temperature = CAI_TEMPERATURE_MAX;
		req.sampling.seed = 11;
		req.sampling.max_tokens = 45;	/* the window of 40 passes the prompt's end */
		req.sampling.ignore_eos = true;
		req.sampling.n_samples = 4;
		CHECK(cai_engine_submit(bounded, &req, &id, &err) == CAI_OK);
		while (done < 4 && cai_engine_has_work(bounded))
		{
			const cai_event *events;
			int			n_events;

			if (cai_engine_step(bounded, &events, &n_events, &err) != CAI_OK)
			{
				CHECK_MSG(false, "step: %s", err.message);
				break;
			}
			for (int e = 0; e < n_events; e++)
			{
				reply	   *r = &together[events[e].sample];

				if (events[e].token >= 0 && r->n_tokens < MAX_REPLY)
					r->tokens[r->n_tokens++] = events[e].token;
				if (events[e].finish != CAI_FINISH_NONE)
				{
					r->done = events[e].finish != CAI_FINISH_ERROR;
					done++;
				}
			}
		}
		CHECK_EQ_INT(done, 4);
		for (int i = 0; i < 4; i++)
		{
			req.sampling.n_samples = 1;
			req.sampling.seed = 11 + i;
			CHECK(run_together(whole, &req, 1, &alone));
			CHECK(together[i].done);
			CHECK_EQ_INT(together[i].n_tokens, 45);
			CHECK(alone.n_tokens == together[i].n_tokens &&
				  memcmp(alone.tokens, together[i].tokens, sizeof(int32_t) * alone.n_tokens) == 0);
		}
	}
	cai_engine_get_stats(bounded, &after);
	CHECK_EQ_INT(after.kv_blocks_free, before.kv_blocks_free);
	CHECK(after.kv_bytes_used == before.kv_bytes_used);
done:
	cai_engine_free(bounded);
	cai_engine_free(whole);
	cai_model_free(model);
}
