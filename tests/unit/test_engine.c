/*
 * test_engine.c — the engine API end to end on a synthetic model: continuous batching is
 * invisible in the tokens (batch invariance), the prefix cache never changes a token (hits,
 * partial hits, after evictions), stop strings, cancel, admission errors, chunked prefill.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cai.h"
#include "cpu/gemm.h"
#include "json.h"
#include "model.h"
#include "step_cost.h"
#include "synth_model.h"
#include "test.h"

#define MAX_GEN 64

typedef struct run_result
{
	int32_t		tokens[MAX_GEN];
	int			n_tokens;
	char		text[4096];
	size_t		text_len;
	cai_finish_reason finish;
	cai_usage	usage;
	size_t		first_text_len; /* text reported with the first token */
} run_result;

static char model_path[256];
static cai_model *shared_model;

/* Loads (once) a small llama-shaped synthetic model shared by the tests of this file. */
static cai_model *
engine_test_model(void)
{
	synth_model_config cfg;
	cai_error	err;
	cai_model_params mp;

	if (shared_model)
		return shared_model;
	synth_model_default_config(&cfg);
	cfg.n_layers = 2;
	cfg.d_model = 64;
	cfg.n_heads = 4;
	cfg.n_kv_heads = 2;
	cfg.d_ff = 128;
	cfg.context_length = 512;
	cfg.seed = 7;
	snprintf(model_path, sizeof(model_path), "/tmp/cai_test_engine_%d.gguf", (int) getpid());
	if (synth_model_write(model_path, &cfg, &err) != CAI_OK)
	{
		fprintf(stderr, "    synth_model_write: %s\n", err.message);
		return NULL;
	}
	cai_model_params_default(&mp);
	mp.n_threads = 2;
	if (cai_model_load(model_path, &mp, &shared_model, &err) != CAI_OK)
	{
		fprintf(stderr, "    cai_model_load: %s\n", err.message);
		shared_model = NULL;
	}
	unlink(model_path);
	return shared_model;
}

static cai_engine *
make_engine_context(int n_threads, int max_running, int step_tokens, size_t cache_bytes,
					int max_queue, int context)
{
	cai_engine_params ep;
	cai_engine *engine = NULL;
	cai_error	err;
	cai_model  *model = engine_test_model();

	if (!model)
		return NULL;
	cai_engine_params_default(&ep);
	ep.device = "cpu";
	ep.n_threads = n_threads;
	ep.max_running = max_running;
	ep.max_step_tokens = step_tokens;
	ep.context_length = context;
	ep.host_cache_bytes = cache_bytes;
	ep.max_queue = max_queue;
	if (cai_engine_create(model, &ep, &engine, &err) != CAI_OK)
		fprintf(stderr, "    cai_engine_create: %s\n", err.message);
	return engine;
}

static cai_engine *
make_engine(int n_threads, int max_running, int step_tokens, size_t cache_bytes, int max_queue)
{
	return make_engine_context(n_threads, max_running, step_tokens, cache_bytes, max_queue, 256);
}

/* Deterministic pseudo-random prompt of n tokens from the synthetic vocabulary. */
static void
make_prompt(int32_t *out, int n, uint32_t seed)
{
	uint32_t	x = seed * 2654435761u + 12345u;

	for (int i = 0; i < n; i++)
	{
		x = x * 1664525u + 1013904223u;
		out[i] = SYNTH_FIRST_BYTE_TOKEN + (int32_t) ((x >> 8) % 300u);
	}
}

/*
 * Submits n requests at once and steps until all finish, collecting each one's tokens, text,
 * finish reason and usage.  Returns false on any engine error.
 */
static bool
run_batch(cai_engine *engine, cai_request_params *reqs, int n, run_result *results)
{
	uint64_t	ids[64];
	int			done = 0;
	cai_error	err;

	memset(results, 0, sizeof(run_result) * n);
	for (int i = 0; i < n; i++)
	{
		reqs[i].user_data = &results[i];
		if (cai_engine_submit(engine, &reqs[i], &ids[i], &err) != CAI_OK)
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
			run_result *r = events[e].user_data;

			if (events[e].token >= 0 && r->n_tokens < MAX_GEN)
				r->tokens[r->n_tokens++] = events[e].token;
			if (events[e].token >= 0 && r->n_tokens == 1)
				r->first_text_len = events[e].text_len;
			if (r->text_len + events[e].text_len < sizeof(r->text))
			{
				memcpy(r->text + r->text_len, events[e].text, events[e].text_len);
				r->text_len += events[e].text_len;
			}
			if (events[e].finish != CAI_FINISH_NONE)
			{
				r->finish = events[e].finish;
				r->usage = events[e].usage;
				done++;
			}
		}
	}
	return true;
}

static cai_request_params
request(const int32_t *prompt, int n, float temperature, uint64_t seed, int max_tokens)
{
	cai_request_params p;

	memset(&p, 0, sizeof(p));
	p.prompt = prompt;
	p.n_prompt = n;
	cai_sampling_params_default(&p.sampling);
	p.sampling.temperature = temperature;
	p.sampling.seed = seed;
	p.sampling.max_tokens = max_tokens;
	p.sampling.ignore_eos = true;
	return p;
}

static bool
same_tokens(const run_result *a, const run_result *b)
{
	return a->n_tokens == b->n_tokens &&
		memcmp(a->tokens, b->tokens, sizeof(int32_t) * a->n_tokens) == 0;
}

TEST(engine_batch_invariance_seeded_and_greedy)
{
	int32_t		prompts[32][80];
	cai_request_params reqs[32];
	run_result *alone = calloc(2, sizeof(run_result));
	run_result *crowd = calloc(32, sizeof(run_result));
	cai_engine *engine = make_engine(2, 32, 96, 0, 64);

	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	for (int i = 0; i < 32; i++)
		make_prompt(prompts[i], 20 + (i * 7) % 60, 100 + i);

	/* request 0 seeded, request 1 greedy: alone */
	reqs[0] = request(prompts[0], 20, 0.9f, 1234, 24);
	reqs[1] = request(prompts[1], 27, 0.0f, 0, 24);
	CHECK(run_batch(engine, &reqs[0], 1, &alone[0]));
	CHECK(run_batch(engine, &reqs[1], 1, &alone[1]));

	/* the same two among 30 others with other lengths, seeds and temperatures */
	for (int i = 0; i < 32; i++)
		if (i > 1)
			reqs[i] = request(prompts[i], 20 + (i * 7) % 60, 0.5f + 0.03f * i, 77 + i, 10 + i % 20);
	CHECK(run_batch(engine, reqs, 32, crowd));
	CHECK_EQ_INT(crowd[0].n_tokens, 24);
	CHECK(same_tokens(&alone[0], &crowd[0]));
	CHECK(same_tokens(&alone[1], &crowd[1]));
	CHECK(strcmp(alone[0].text, crowd[0].text) == 0);

	cai_engine_free(engine);
	free(alone);
	free(crowd);
}

/*
 * cai_cpu_use_isa: an unknown path is refused with its name, and the generic path, picked
 * over the best one here, gives an engine that says so and the same tokens.
 */
TEST(engine_cpu_path_choice)
{
	char		best[32];
	int32_t		prompt[60];
	cai_request_params req;
	run_result *runs = calloc(2, sizeof(run_result));
	cai_error	err = {0};
	cai_engine *engine;

	snprintf(best, sizeof(best), "%s", cai_cpu_isa());
	CHECK_EQ_INT(cai_cpu_use_isa("avx1024", &err), CAI_ERR_INVALID_ARGUMENT);
	CHECK(strstr(err.message, "avx1024") != NULL);
	CHECK_EQ_INT(cai_cpu_use_isa(NULL, &err), CAI_ERR_INVALID_ARGUMENT);
	CHECK(strcmp(cai_cpu_isa(), best) == 0);

	make_prompt(prompt, 60, 7);
	req = request(prompt, 60, 0.0f, 0, 16);
	for (int i = 0; i < 2; i++)
	{
		CHECK_EQ_INT(cai_cpu_use_isa(i == 0 ? best : "generic", &err), CAI_OK);
		engine = make_engine(2, 4, 96, 0, 8);
		CHECK(engine != NULL);
		if (!engine)
			break;
		CHECK(strstr(cai_engine_device(engine), i == 0 ? best : "generic") != NULL);
		CHECK(run_batch(engine, &req, 1, &runs[i]));
		cai_engine_free(engine);
	}
	CHECK(same_tokens(&runs[0], &runs[1]));
	CHECK_EQ_INT(cai_cpu_use_isa(best, &err), CAI_OK);
	free(runs);
}

/*
 * One thread or three: the same tokens, for one request and for a batch whose rows are sampled
 * on different threads (temperature, top-p, top-k and greedy rows mixed).
 */
TEST(engine_thread_count_invariance)
{
	int32_t		prompts[6][50];
	cai_request_params reqs[6];
	run_result *one = calloc(6, sizeof(run_result));
	run_result *three = calloc(6, sizeof(run_result));
	cai_engine *e1 = make_engine(1, 6, 64, 0, 8);
	cai_engine *e3 = make_engine(3, 6, 64, 0, 8);

	if (!e1 || !e3 || !one || !three)
	{
		CHECK(e1 && e3 && one && three);
		goto done;
	}
	for (int i = 0; i < 6; i++)
		make_prompt(prompts[i], 20 + 6 * i, 9 + i);
	reqs[0] = request(prompts[5], 50, 0.7f, 99, 32);
	CHECK(run_batch(e1, reqs, 1, one));
	reqs[0] = request(prompts[5], 50, 0.7f, 99, 32);
	CHECK(run_batch(e3, reqs, 1, three));
	CHECK(same_tokens(&one[0], &three[0]));

	for (int pass = 0; pass < 2; pass++)
	{
		for (int i = 0; i < 6; i++)
		{
			reqs[i] = request(prompts[i], 20 + 6 * i, i == 5 ? 0.0f : 0.6f + 0.1f * i, 500 + i, 24);
			reqs[i].sampling.top_p = i % 2 ? 0.9f : 1.0f;
			reqs[i].sampling.top_k = i == 2 ? 20 : 0;
		}
		CHECK(run_batch(pass ? e3 : e1, reqs, 6, pass ? three : one));
	}
	for (int i = 0; i < 6; i++)
	{
		CHECK_EQ_INT(one[i].n_tokens, 24);
		CHECK(same_tokens(&one[i], &three[i]));
	}
done:
	cai_engine_free(e1);
	cai_engine_free(e3);
	free(one);
	free(three);
}

TEST(engine_prefix_cache_never_changes_tokens)
{
	int32_t		turn1[70];
	int32_t		turn2[200];
	int32_t		branch[200];
	cai_request_params req;
	run_result	r1,
				hit,
				miss,
				partial,
				partial_off;
	int			n2;
	cai_engine *on = make_engine(2, 8, 64, 8 << 20, 8);
	cai_engine *off = make_engine(2, 8, 64, 0, 8);

	if (!on || !off)
	{
		CHECK(on && off);
		return;
	}
	/* turn 1: 70 prompt tokens, greedy reply */
	make_prompt(turn1, 70, 5);
	req = request(turn1, 70, 0.0f, 0, 20);
	req.use_cache = true;
	CHECK(run_batch(on, &req, 1, &r1));
	CHECK_EQ_INT(r1.usage.cached_tokens, 0);

	/* turn 2 = turn 1 + its reply + new tokens: everything of turn 1 that filled blocks hits */
	memcpy(turn2, turn1, sizeof(turn1));
	memcpy(turn2 + 70, r1.tokens, sizeof(int32_t) * r1.n_tokens);
	n2 = 70 + r1.n_tokens;
	make_prompt(turn2 + n2, 30, 6);
	n2 += 30;
	req = request(turn2, n2, 0.0f, 0, 20);
	req.use_cache = true;
	CHECK(run_batch(on, &req, 1, &hit));
	/*
	 * turn 1 computed 70 + 19 positions (its last sampled token never ran, so it has no KV):
	 * 5 full blocks and a tail of 9, all reused
	 */
	CHECK_EQ_INT(hit.usage.cached_tokens, 89);
	req = request(turn2, n2, 0.0f, 0, 20);
	CHECK(run_batch(off, &req, 1, &miss));
	CHECK_EQ_INT(miss.usage.cached_tokens, 0);
	CHECK(same_tokens(&hit, &miss));

	/*
	 * a branch sharing 40 tokens with turn 2, then diverging mid-block: 2 blocks hit and the 8
	 * agreeing rows of the third are copied
	 */
	memcpy(branch, turn2, sizeof(int32_t) * 40);
	make_prompt(branch + 40, 60, 8);
	req = request(branch, 100, 0.0f, 0, 20);
	req.use_cache = true;
	CHECK(run_batch(on, &req, 1, &partial));
	CHECK_EQ_INT(partial.usage.cached_tokens, 40);
	req = request(branch, 100, 0.0f, 0, 20);
	CHECK(run_batch(off, &req, 1, &partial_off));
	CHECK(same_tokens(&partial, &partial_off));

	cai_engine_free(on);
	cai_engine_free(off);
}

TEST(engine_prefix_cache_after_evictions)
{
	int32_t		prompt[64];
	int32_t		other[64];
	cai_request_params req;
	run_result	first,
				again,
				churn;
	cai_engine_stats stats;
	cai_model_info info;
	cai_engine *engine;

	if (!engine_test_model())
	{
		CHECK(0);
		return;
	}
	cai_model_get_info(engine_test_model(), &info);
	/* a budget of 6 blocks: every new prompt evicts older ones */
	engine = make_engine(2, 4, 64, 6 * 16 * info.kv_bytes_per_token, 8);
	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	make_prompt(prompt, 64, 11);
	req = request(prompt, 64, 0.0f, 0, 8);
	req.use_cache = true;
	CHECK(run_batch(engine, &req, 1, &first));
	for (int i = 0; i < 6; i++)
	{
		make_prompt(other, 64, 200 + i);
		req = request(other, 64, 0.0f, 0, 8);
		req.use_cache = true;
		CHECK(run_batch(engine, &req, 1, &churn));
		cai_engine_get_stats(engine, &stats);
		CHECK(stats.cache_bytes <= stats.cache_budget_bytes);
	}
	cai_engine_get_stats(engine, &stats);
	CHECK(stats.cache_evictions > 0);
	req = request(prompt, 64, 0.0f, 0, 8);
	req.use_cache = true;
	CHECK(run_batch(engine, &req, 1, &again));
	CHECK(same_tokens(&first, &again));
	cai_engine_free(engine);
}

/*
 * Multi-turn conversations whose turns end mid-block, run with the cache on (a budget so small
 * that turns evict each other) and off: greedy replies must be identical, and each follow-up must
 * reuse everything its previous turn computed, to the token, while that turn is still cached.
 */
TEST(engine_prefix_cache_reuses_to_the_token_across_turns)
{
	enum
	{
		N_CONV = 3, N_TURNS = 4, MAX_LEN = 240
	};
	int32_t		conv[N_CONV][MAX_LEN];
	int			len[N_CONV];
	int			computed[N_CONV];
	cai_request_params req;
	run_result	on_r,
				off_r;
	cai_engine_stats stats;
	cai_model_info info;
	cai_engine *on;
	cai_engine *off;
	int			full_reuses = 0;

	/*
	 * Greedy, and seeded sampling at a high temperature: this small random model's greedy choice
	 * barely depends on its KV, while a sampled draw moves with any change in the probabilities.
	 */
	const float temperature[N_CONV] = {0.0f, 1.5f, CAI_TEMPERATURE_MAX};

	if (!engine_test_model())
	{
		CHECK(0);
		return;
	}
	cai_model_get_info(engine_test_model(), &info);
	/* 12 blocks: about one conversation's history, so the others' get evicted */
	on = make_engine(2, 4, 64, 12 * 16 * info.kv_bytes_per_token, 8);
	off = make_engine(2, 4, 64, 0, 8);
	if (!on || !off)
	{
		CHECK(on && off);
		goto done;
	}
	for (int c = 0; c < N_CONV; c++)
	{
		/* first prompts of 21, 37, 45 tokens: none a multiple of 16 */
		len[c] = 21 + 16 * c - 8 * (c == 2);
		make_prompt(conv[c], len[c], 700 + c);
		computed[c] = 0;
	}
	for (int t = 0; t < N_TURNS; t++)
	{
		for (int c = 0; c < N_CONV; c++)
		{
			int			reply = 5 + (3 * t + c) % 7;
			int			user = 3 + (5 * t + 2 * c) % 9;

			req = request(conv[c], len[c], temperature[c], 31 + t, reply);
			req.use_cache = true;
			req.cache_salt = 1;
			CHECK(run_batch(on, &req, 1, &on_r));
			req = request(conv[c], len[c], temperature[c], 31 + t, reply);
			CHECK(run_batch(off, &req, 1, &off_r));
			CHECK(same_tokens(&on_r, &off_r));
			CHECK_EQ_INT(off_r.usage.cached_tokens, 0);
			/* never more than the previous turn computed, nor all of the prompt */
			CHECK(on_r.usage.cached_tokens <= computed[c]);
			CHECK(on_r.usage.cached_tokens < len[c]);
			if (t > 0 && on_r.usage.cached_tokens == computed[c])
				full_reuses++;
			/* this turn computed its prompt and all but its last reply token */
			computed[c] = len[c] + on_r.n_tokens - 1;
			if (len[c] + on_r.n_tokens + user > MAX_LEN)
				goto done;
			memcpy(conv[c] + len[c], on_r.tokens, sizeof(int32_t) * on_r.n_tokens);
			len[c] += on_r.n_tokens;
			make_prompt(conv[c] + len[c], user, 900 + 10 * t + c);
			len[c] += user;
		}
	}
	cai_engine_get_stats(on, &stats);
	CHECK(stats.cache_evictions > 0);
	CHECK(stats.cache_bytes <= stats.cache_budget_bytes);

	/* the last conversation's next turn, just after its previous one: reused to the token */
	{
		int			c = N_CONV - 1;

		req = request(conv[c], len[c], 0.0f, 0, 4);
		req.use_cache = true;
		req.cache_salt = 1;
		CHECK(run_batch(on, &req, 1, &on_r));
		CHECK_EQ_INT(on_r.usage.cached_tokens, computed[c]);
		CHECK(computed[c] % 16 != 0);
		/* and another salt reuses nothing of it */
		req = request(conv[c], len[c], 0.0f, 0, 4);
		req.use_cache = true;
		req.cache_salt = 2;
		CHECK(run_batch(on, &req, 1, &off_r));
		CHECK_EQ_INT(off_r.usage.cached_tokens, 0);
		CHECK(same_tokens(&on_r, &off_r));
	}
	CHECK(full_reuses > 0);
	/* nothing runs now: every block is free or the cache's, and none once the cache is emptied */
	cai_engine_get_stats(on, &stats);
	CHECK_EQ_INT(stats.kv_blocks_free + (int) stats.cache_blocks, stats.kv_blocks_total);
	cai_engine_cache_reset(on);
	cai_engine_get_stats(on, &stats);
	CHECK_EQ_INT(stats.kv_blocks_free, stats.kv_blocks_total);
done:
	cai_engine_free(on);
	cai_engine_free(off);
}

TEST(engine_stop_strings_cut_text)
{
	int32_t		prompt[30];
	cai_request_params req;
	run_result	full,
				cut;
	char		stop[8];
	const char *at;
	cai_engine *engine = make_engine(2, 4, 64, 0, 8);

	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	make_prompt(prompt, 30, 3);
	req = request(prompt, 30, 0.0f, 0, 40);
	CHECK(run_batch(engine, &req, 1, &full));
	CHECK(full.text_len > 12);
	if (full.text_len <= 12)
		return;
	/* a stop string taken from the middle of the unconstrained reply */
	memcpy(stop, full.text + 8, 3);
	stop[3] = '\0';
	at = strstr(full.text, stop);
	req = request(prompt, 30, 0.0f, 0, 40);
	req.sampling.n_stop = 1;
	req.sampling.stop[0] = stop;
	CHECK(run_batch(engine, &req, 1, &cut));
	CHECK_EQ_INT(cut.finish, CAI_FINISH_STOP);
	CHECK_EQ_INT(cut.text_len, at - full.text);
	CHECK(strncmp(cut.text, full.text, cut.text_len) == 0);
	CHECK(strstr(cut.text, stop) == NULL);
	cai_engine_free(engine);
}

/*
 * A stop string while the reply's text is still empty: the first token is an incomplete UTF-8
 * sequence (a lead byte), so no text exists yet when the stop strings are first checked.
 */
TEST(engine_stop_strings_before_any_text)
{
	int32_t		prompt[20];
	cai_request_params req;
	run_result	full,
				stopped;
	const char *stop = "zzz";
	int			found = 0;
	cai_engine *engine = make_engine(2, 4, 64, 0, 8);

	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	for (uint32_t seed = 1; seed < 400 && found < 3; seed++)
	{
		make_prompt(prompt, 20, seed);
		req = request(prompt, 20, 0.0f, 0, 6);
		CHECK(run_batch(engine, &req, 1, &full));
		if (full.first_text_len != 0)
			continue;
		found++;
		req.sampling.n_stop = 1;
		req.sampling.stop[0] = stop;
		CHECK(run_batch(engine, &req, 1, &stopped));
		CHECK(same_tokens(&full, &stopped));
		CHECK_EQ_INT(stopped.finish, CAI_FINISH_LENGTH);
		CHECK_EQ_INT(stopped.first_text_len, 0);
		CHECK_EQ_INT(stopped.text_len, full.text_len);
		CHECK(memcmp(stopped.text, full.text, full.text_len) == 0);
	}
	CHECK_MSG(found == 3, "only %d prompts start their reply with an incomplete character", found);
	cai_engine_free(engine);
}

TEST(engine_cancel_frees_kv)
{
	int32_t		prompt[100];
	cai_request_params req;
	uint64_t	id;
	cai_error	err;
	cai_engine_stats before,
				during,
				after;
	const cai_event *events;
	int			n_events;
	cai_engine *engine = make_engine(2, 4, 32, 0, 8);

	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	cai_engine_get_stats(engine, &before);
	make_prompt(prompt, 100, 4);
	req = request(prompt, 100, 0.0f, 0, 50);
	CHECK(cai_engine_submit(engine, &req, &id, &err) == CAI_OK);
	CHECK(cai_engine_step(engine, &events, &n_events, &err) == CAI_OK);
	cai_engine_get_stats(engine, &during);
	CHECK(during.kv_blocks_free < before.kv_blocks_free);
	CHECK_EQ_INT(during.running, 1);
	CHECK(cai_engine_cancel(engine, id) == CAI_OK);
	CHECK(cai_engine_cancel(engine, id) == CAI_ERR_NOT_FOUND);
	cai_engine_get_stats(engine, &after);
	CHECK_EQ_INT(after.kv_blocks_free, before.kv_blocks_free);
	CHECK_EQ_INT(after.running, 0);
	CHECK_EQ_INT(after.requests_cancelled, 1);
	CHECK(!cai_engine_has_work(engine));
	cai_engine_free(engine);
}

/* One field of a default request set to an edge value: does the library accept it? */
static cai_status
check_edge(void (*set) (cai_sampling_params *sp, double v), double v, cai_error *err)
{
	cai_sampling_params sp;

	cai_sampling_params_default(&sp);
	set(&sp, v);
	return cai_sampling_params_check(&sp, err);
}

static void
set_temperature(cai_sampling_params *sp, double v)
{
	sp->temperature = (float) v;
}

static void
set_top_p(cai_sampling_params *sp, double v)
{
	sp->top_p = (float) v;
}

static void
set_top_k(cai_sampling_params *sp, double v)
{
	sp->top_k = (int) v;
}

static void
set_max_tokens(cai_sampling_params *sp, double v)
{
	sp->max_tokens = (int) v;
}

/* n_stop copies of a stop string of v bytes */
static void
set_stops(cai_sampling_params *sp, int n, size_t len)
{
	static char text[CAI_STOP_MAX_BYTES + 2];

	memset(text, 'x', sizeof(text) - 1);
	text[len] = '\0';
	sp->n_stop = n;
	for (int i = 0; i < n && i < CAI_MAX_STOP_STRINGS; i++)
		sp->stop[i] = text;
}

/*
 * cai.h's request limits, at each edge: the edge itself is accepted, the next value past it
 * refused with a message that names the field and its range.
 */
TEST(engine_request_limits_at_their_edges)
{
	struct
	{
		const char *name;
		void		(*set) (cai_sampling_params *sp, double v);
		double		ok;
		double		refused;
		const char *range;
	}			edges[] = {
		{"temperature", set_temperature, 0.0, -0.0001, "between 0 and 2"},
		{"temperature", set_temperature, CAI_TEMPERATURE_MAX,
		nextafterf((float) CAI_TEMPERATURE_MAX, 3.0f), "between 0 and 2"},
		{"temperature", set_temperature, 0.0, NAN, "between 0 and 2"},
		{"top_p", set_top_p, 1.0, nextafterf(1.0f, 2.0f), "greater than 0 and at most 1"},
		{"top_p", set_top_p, 1e-30, 0.0, "greater than 0 and at most 1"},
		{"top_k", set_top_k, 0, -1, "between 0 and 1000000"},
		{"top_k", set_top_k, CAI_TOP_K_MAX, CAI_TOP_K_MAX + 1, "between 0 and 1000000"},
		{"max_tokens", set_max_tokens, 1, 0, "between 1 and 1048576"},
		{"max_tokens", set_max_tokens, CAI_MAX_TOKENS_MAX, CAI_MAX_TOKENS_MAX + 1,
		"between 1 and 1048576"},
	};
	cai_sampling_params sp;
	cai_error	err;

	CHECK(CAI_TEMPERATURE_MAX == 2.0);
	for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++)
	{
		CHECK_MSG(check_edge(edges[i].set, edges[i].ok, &err) == CAI_OK, "%s %g: %s",
				  edges[i].name, edges[i].ok, err.message);
		CHECK_MSG(check_edge(edges[i].set, edges[i].refused, &err) == CAI_ERR_INVALID_ARGUMENT,
				  "%s %.9g accepted", edges[i].name, edges[i].refused);
		CHECK_MSG(strstr(err.message, edges[i].name) && strstr(err.message, edges[i].range),
				  "%s %g: \"%s\"", edges[i].name, edges[i].refused, err.message);
	}

	/* stop strings: as many as CAI_MAX_STOP_STRINGS of CAI_STOP_MAX_BYTES each, not empty */
	cai_sampling_params_default(&sp);
	set_stops(&sp, CAI_MAX_STOP_STRINGS, CAI_STOP_MAX_BYTES);
	CHECK(cai_sampling_params_check(&sp, &err) == CAI_OK);
	set_stops(&sp, CAI_MAX_STOP_STRINGS + 1, 1);
	CHECK(cai_sampling_params_check(&sp, &err) == CAI_ERR_INVALID_ARGUMENT);
	CHECK(strstr(err.message, "at most 8 strings") != NULL);
	set_stops(&sp, 1, CAI_STOP_MAX_BYTES + 1);
	CHECK(cai_sampling_params_check(&sp, &err) == CAI_ERR_INVALID_ARGUMENT);
	CHECK(strstr(err.message, "at most 256 bytes") != NULL);
	set_stops(&sp, 1, 0);
	CHECK(cai_sampling_params_check(&sp, &err) == CAI_ERR_INVALID_ARGUMENT);
	CHECK(strstr(err.message, "empty") != NULL);
}

TEST(engine_admission_errors)
{
	int32_t		prompt[300];
	cai_request_params req;
	uint64_t	id;
	cai_error	err;
	run_result	capped;
	cai_engine *engine = make_engine(2, 2, 64, 0, 2);

	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	make_prompt(prompt, 300, 1);

	/* longer than the context (256) */
	req = request(prompt, 300, 0.0f, 0, 8);
	CHECK(cai_engine_submit(engine, &req, &id, &err) == CAI_ERR_CONTEXT_FULL);
	CHECK(strstr(err.message, "context") != NULL);

	/* token outside the vocabulary */
	prompt[3] = 1 << 20;
	req = request(prompt, 10, 0.0f, 0, 8);
	CHECK(cai_engine_submit(engine, &req, &id, &err) == CAI_ERR_INVALID_ARGUMENT);
	make_prompt(prompt, 300, 1);

	/* bad sampling parameters: submit checks cai.h's request limits */
	req = request(prompt, 10, -1.0f, 0, 8);
	CHECK(cai_engine_submit(engine, &req, &id, &err) == CAI_ERR_INVALID_ARGUMENT);
	req = request(prompt, 10, 0.0f, 0, 0);
	CHECK(cai_engine_submit(engine, &req, &id, &err) == CAI_ERR_INVALID_ARGUMENT);
	req = request(prompt, 10, nextafterf((float) CAI_TEMPERATURE_MAX, 3.0f), 0, 8);
	CHECK(cai_engine_submit(engine, &req, &id, &err) == CAI_ERR_INVALID_ARGUMENT);
	CHECK(strstr(err.message, "temperature must be between 0 and 2") != NULL);
	req = request(prompt, 10, 0.0f, 0, 8);
	req.sampling.top_k = CAI_TOP_K_MAX + 1;
	CHECK(cai_engine_submit(engine, &req, &id, &err) == CAI_ERR_INVALID_ARGUMENT);
	CHECK(strstr(err.message, "top_k") != NULL);

	/*
	 * 2 batch slots are free and the queue holds 2 more: a burst of 4 is taken before any step
	 * runs, the fifth is refused at once
	 */
	req = request(prompt, 10, 0.0f, 0, 8);
	for (int i = 0; i < 4; i++)
		CHECK(cai_engine_submit(engine, &req, &id, &err) == CAI_OK);
	CHECK(cai_engine_submit(engine, &req, &id, &err) == CAI_ERR_QUEUE_FULL);
	while (cai_engine_has_work(engine))
	{
		const cai_event *events;
		int			n_events;

		CHECK(cai_engine_step(engine, &events, &n_events, &err) == CAI_OK);
	}

	/* max_tokens beyond the context: stops at the context with LENGTH */
	req = request(prompt, 250, 0.0f, 0, 100);
	CHECK(run_batch(engine, &req, 1, &capped));
	CHECK_EQ_INT(capped.finish, CAI_FINISH_LENGTH);
	CHECK_EQ_INT(capped.n_tokens, 6);
	cai_engine_free(engine);
}

TEST(engine_chunked_prefill_keeps_decodes_flowing)
{
	int32_t		short_prompt[4][10];
	int32_t		long_prompt[200];
	cai_request_params reqs[4];
	uint64_t	ids[5];
	cai_error	err;
	int			steps_with_all_decodes = 0;
	int			steps_during_prefill = 0;
	cai_engine *engine = make_engine(2, 8, 32, 0, 8);

	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	for (int i = 0; i < 4; i++)
	{
		make_prompt(short_prompt[i], 10, 50 + i);
		reqs[i] = request(short_prompt[i], 10, 0.0f, 0, 40);
		CHECK(cai_engine_submit(engine, &reqs[i], &ids[i], &err) == CAI_OK);
	}
	/* let the four start decoding, then add a 200-token prompt: the budget is 32 per step */
	for (int s = 0; s < 3; s++)
	{
		const cai_event *events;
		int			n_events;

		CHECK(cai_engine_step(engine, &events, &n_events, &err) == CAI_OK);
	}
	make_prompt(long_prompt, 200, 9);
	{
		cai_request_params lp = request(long_prompt, 200, 0.0f, 0, 4);

		CHECK(cai_engine_submit(engine, &lp, &ids[4], &err) == CAI_OK);
	}
	/* while the long prompt prefills (200 / (32 - 4) = 8 steps), every decode advances */
	for (int s = 0; s < 7; s++)
	{
		const cai_event *events;
		int			n_events;
		int			decode_events = 0;

		CHECK(cai_engine_step(engine, &events, &n_events, &err) == CAI_OK);
		for (int e = 0; e < n_events; e++)
			if (events[e].request_id != ids[4] && events[e].token >= 0)
				decode_events++;
		steps_during_prefill++;
		if (decode_events == 4)
			steps_with_all_decodes++;
	}
	CHECK_EQ_INT(steps_with_all_decodes, steps_during_prefill);
	cai_engine_free(engine);
}

/*
 * A short prompt admitted behind a long one gets a fair share of the prefill budget: it finishes
 * its prefill (its first token is out) in the first step, while the long one also advances, and
 * both replies are what each gets alone.
 */
TEST(engine_prefill_shared_fairly)
{
	int32_t		long_prompt[120];
	int32_t		short_prompt[10];
	cai_request_params reqs[2];
	run_result	alone[2];
	run_result	shared[2];
	uint64_t	ids[2];
	cai_error	err;
	cai_engine_stats stats;
	const cai_event *events;
	int			n_events;
	int			short_tokens = 0;
	int			long_tokens = 0;
	int			done = 0;
	cai_engine *engine = make_engine(2, 4, 32, 0, 8);

	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	make_prompt(long_prompt, 120, 21);
	make_prompt(short_prompt, 10, 22);
	reqs[0] = request(long_prompt, 120, 0.0f, 0, 6);
	reqs[1] = request(short_prompt, 10, 0.0f, 0, 6);
	CHECK(run_batch(engine, &reqs[0], 1, &alone[0]));
	CHECK(run_batch(engine, &reqs[1], 1, &alone[1]));
	cai_engine_free(engine);

	engine = make_engine(2, 4, 32, 0, 8);
	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	memset(shared, 0, sizeof(shared));
	for (int i = 0; i < 2; i++)
	{
		reqs[i].user_data = &shared[i];
		CHECK(cai_engine_submit(engine, &reqs[i], &ids[i], &err) == CAI_OK);
	}
	/* the first step: the long one admitted first, the short one second, a 32-token budget */
	CHECK(cai_engine_step(engine, &events, &n_events, &err) == CAI_OK);
	for (int e = 0; e < n_events; e++)
	{
		short_tokens += events[e].request_id == ids[1] && events[e].token >= 0;
		long_tokens += events[e].request_id == ids[0] && events[e].token >= 0;
	}
	cai_engine_get_stats(engine, &stats);
	CHECK_EQ_INT(short_tokens, 1);
	CHECK_EQ_INT(long_tokens, 0);
	/* the whole budget went to prefill: the short prompt's 10 tokens and 22 of the long one's */
	CHECK_EQ_INT((int) stats.prefill_tokens, 32);

	for (int e = 0; e < n_events; e++)
	{
		run_result *r = events[e].user_data;

		if (events[e].token >= 0)
			r->tokens[r->n_tokens++] = events[e].token;
		done += events[e].finish != CAI_FINISH_NONE;
	}
	for (int s = 0; done < 2 && s < 100; s++)
	{
		CHECK(cai_engine_step(engine, &events, &n_events, &err) == CAI_OK);
		for (int e = 0; e < n_events; e++)
		{
			run_result *r = events[e].user_data;

			if (events[e].token >= 0 && r->n_tokens < MAX_GEN)
				r->tokens[r->n_tokens++] = events[e].token;
			done += events[e].finish != CAI_FINISH_NONE;
		}
	}
	CHECK_EQ_INT(done, 2);
	CHECK(same_tokens(&shared[0], &alone[0]));
	CHECK(same_tokens(&shared[1], &alone[1]));
	cai_engine_free(engine);
}

/* One step: its events' tokens go to their run_result; counts finishes and the step's prefill. */
static bool
step_and_collect(cai_engine *engine, int *done, int *prefill_tokens)
{
	const cai_event *events;
	int			n_events;
	cai_error	err;
	cai_engine_stats before,
				after;

	cai_engine_get_stats(engine, &before);
	if (cai_engine_step(engine, &events, &n_events, &err) != CAI_OK)
	{
		fprintf(stderr, "    step: %s\n", err.message);
		return false;
	}
	cai_engine_get_stats(engine, &after);
	*prefill_tokens = (int) (after.prefill_tokens - before.prefill_tokens);
	for (int e = 0; e < n_events; e++)
	{
		run_result *r = events[e].user_data;

		if (events[e].token >= 0 && r->n_tokens < MAX_GEN)
			r->tokens[r->n_tokens++] = events[e].token;
		if (events[e].finish != CAI_FINISH_NONE)
		{
			r->finish = events[e].finish;
			(*done)++;
		}
	}
	return true;
}

/*
 * While requests decode, a step carries only the prefill tokens that cost what its decodes
 * cost (at least 32): pinned so that this is the floor, a 200-token prompt admitted beside four
 * decoding requests advances 32 tokens a step instead of taking its whole prefill into one slow
 * step, the four decode every step meanwhile, and every reply is what it is alone.  Pinned so
 * that a step's fixed cost dwarfs its tokens', the same prompt goes in one step, as it does
 * whenever nothing decodes.
 */
TEST(engine_prefill_capped_while_decoding)
{
	int32_t		short_prompt[4][10];
	int32_t		long_prompt[200];
	cai_request_params reqs[5];
	run_result	alone[5];
	run_result	shared[5];
	uint64_t	ids[5];
	cai_error	err;
	cai_engine_stats stats;
	uint64_t	steps0;
	int			prefill;
	cai_engine *engine = make_engine(2, 8, 256, 0, 8);

	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	for (int i = 0; i < 4; i++)
	{
		make_prompt(short_prompt[i], 10, 60 + i);
		reqs[i] = request(short_prompt[i], 10, 0.0f, 0, 40);
	}
	make_prompt(long_prompt, 200, 31);
	reqs[4] = request(long_prompt, 200, 0.0f, 0, 4);
	for (int i = 0; i < 5; i++)
		CHECK(run_batch(engine, &reqs[i], 1, &alone[i]));

	/* alone, nothing decodes: the long prompt's prefill is one step, then three decodes */
	cai_engine_pin_step_cost(engine, 0.0, 1e-4);
	cai_engine_get_stats(engine, &stats);
	steps0 = stats.steps;
	CHECK(run_batch(engine, &reqs[4], 1, &shared[4]));
	cai_engine_get_stats(engine, &stats);
	CHECK_EQ_INT((int) (stats.steps - steps0), 4);

	for (int pass = 0; pass < 2; pass++)
	{
		int			done = 0;
		int			steps_to_first = 0;
		int			decoding_steps = 0;

		/* pass 0: the cap is the floor; pass 1: it is above the budget */
		cai_engine_pin_step_cost(engine, pass == 0 ? 0.0 : 1.0, 1e-4);
		memset(shared, 0, sizeof(shared));
		for (int i = 0; i < 5; i++)
			reqs[i].user_data = &shared[i];
		for (int i = 0; i < 4; i++)
			CHECK(cai_engine_submit(engine, &reqs[i], &ids[i], &err) == CAI_OK);
		/* the four prefill together (nothing decodes yet: 40 tokens), then decode */
		CHECK(step_and_collect(engine, &done, &prefill));
		CHECK_EQ_INT(prefill, 40);
		CHECK(step_and_collect(engine, &done, &prefill));
		CHECK(cai_engine_submit(engine, &reqs[4], &ids[4], &err) == CAI_OK);
		while (shared[4].n_tokens == 0 && steps_to_first < 50)
		{
			int			decoded_before = 0,
						decoded_after = 0;

			for (int i = 0; i < 4; i++)
				decoded_before += shared[i].n_tokens;
			CHECK(step_and_collect(engine, &done, &prefill));
			for (int i = 0; i < 4; i++)
				decoded_after += shared[i].n_tokens;
			decoding_steps += decoded_after - decoded_before == 4;
			steps_to_first++;
			if (pass == 0)
				CHECK_EQ_INT(prefill, shared[4].n_tokens == 0 ? 32 : 200 - 6 * 32);
			else
				CHECK_EQ_INT(prefill, 200);
		}
		CHECK_EQ_INT(steps_to_first, pass == 0 ? 7 : 1);
		CHECK_EQ_INT(decoding_steps, steps_to_first);
		for (int s = 0; done < 5 && s < 100; s++)
			CHECK(step_and_collect(engine, &done, &prefill));
		CHECK_EQ_INT(done, 5);
		for (int i = 0; i < 5; i++)
			CHECK(same_tokens(&shared[i], &alone[i]));
	}
	cai_engine_free(engine);
}

/*
 * Short prompts (at most 32 tokens left, a follow-up after a cache hit) prefilling beside a long
 * one count with the decodes: nothing decodes, yet the step carries their 20 tokens and 32 of
 * the long prompt's (cost pinned so that the cap is the floor), not the long prompt's 200, so
 * their first tokens do not wait for a 220-token step; replies are what each gets alone.
 */
TEST(engine_prefill_capped_beside_short_prompts)
{
	int32_t		short_prompt[2][10];
	int32_t		long_prompt[200];
	cai_request_params reqs[3];
	run_result	alone[3];
	run_result	shared[3];
	uint64_t	id;
	cai_error	err;
	int			done = 0;
	int			prefill;
	cai_engine *engine = make_engine(2, 8, 256, 0, 8);

	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	make_prompt(long_prompt, 200, 41);
	reqs[0] = request(long_prompt, 200, 0.0f, 0, 4);
	for (int i = 0; i < 2; i++)
	{
		make_prompt(short_prompt[i], 10, 42 + i);
		reqs[1 + i] = request(short_prompt[i], 10, 0.0f, 0, 8);
	}
	for (int i = 0; i < 3; i++)
		CHECK(run_batch(engine, &reqs[i], 1, &alone[i]));

	cai_engine_pin_step_cost(engine, 0.0, 1e-4);
	memset(shared, 0, sizeof(shared));
	for (int i = 0; i < 3; i++)
	{
		reqs[i].user_data = &shared[i];
		CHECK(cai_engine_submit(engine, &reqs[i], &id, &err) == CAI_OK);
	}
	CHECK(step_and_collect(engine, &done, &prefill));
	CHECK_EQ_INT(prefill, 20 + 32);
	CHECK_EQ_INT(shared[0].n_tokens, 0);
	CHECK_EQ_INT(shared[1].n_tokens, 1);
	CHECK_EQ_INT(shared[2].n_tokens, 1);
	for (int s = 0; done < 3 && s < 100; s++)
		CHECK(step_and_collect(engine, &done, &prefill));
	CHECK_EQ_INT(done, 3);
	for (int i = 0; i < 3; i++)
		CHECK(same_tokens(&shared[i], &alone[i]));
	cai_engine_free(engine);
}

/*
 * The step cost fit: steps costing 4 ms plus 0.2 ms a token give back those two figures, and
 * the prefill cap is what costs a decode-only step (4 ms / 0.2 ms + 8 decodes = 28), or the
 * floor, or the whole budget when nothing decodes or nothing is known.
 */
TEST(step_cost_fit_and_prefill_cap)
{
	cai_step_cost cost;

	cai_step_cost_init(&cost);
	CHECK_EQ_INT(cai_step_cost_prefill_cap(&cost, 8, 16, 504), 504);
	/* steps all of one length say nothing of a token's cost */
	for (int i = 0; i < 50; i++)
		cai_step_cost_observe(&cost, 8, 0.004 + 8 * 0.0002);
	CHECK(!cost.known);
	CHECK_EQ_INT(cai_step_cost_prefill_cap(&cost, 8, 16, 504), 504);
	for (int i = 0; i < 300; i++)
	{
		int			n = 8 + (i % 5 == 0 ? 504 : i % 3 * 20);

		cai_step_cost_observe(&cost, n, 0.004 + n * 0.0002);
	}
	CHECK(cost.known);
	CHECK(fabs(cost.fixed_seconds - 0.004) < 1e-6);
	CHECK(fabs(cost.token_seconds - 0.0002) < 1e-9);
	CHECK_EQ_INT(cai_step_cost_prefill_cap(&cost, 8, 16, 504), 28);
	CHECK_EQ_INT(cai_step_cost_prefill_cap(&cost, 8, 32, 504), 32);
	CHECK_EQ_INT(cai_step_cost_prefill_cap(&cost, 0, 32, 512), 512);
	CHECK_EQ_INT(cai_step_cost_prefill_cap(&cost, 8, 16, 20), 20);

	/* the machine slows down (another process takes the CPU): the fit follows */
	for (int i = 0; i < 2000; i++)
	{
		int			n = 8 + (i % 5 == 0 ? 504 : i % 3 * 20);

		cai_step_cost_observe(&cost, n, 0.012 + n * 0.0004);
	}
	CHECK(fabs(cost.fixed_seconds - 0.012) < 1e-5);
	CHECK(fabs(cost.token_seconds - 0.0004) < 1e-8);

	/* pinned, steps no longer move it; unpinned, it measures again from nothing */
	cai_step_cost_pin(&cost, 0.002, 0.0001);
	cai_step_cost_observe(&cost, 100, 1.0);
	CHECK_EQ_INT(cai_step_cost_prefill_cap(&cost, 8, 16, 504), 28);
	cai_step_cost_pin(&cost, -1.0, -1.0);
	CHECK(!cost.known);
}

TEST(engine_score_matches_generation)
{
	int32_t		prompt[40];
	int32_t		all[60];
	cai_request_params req;
	run_result	r;
	cai_error	err;
	cai_model_info info;
	float	   *logits;
	cai_engine *engine = make_engine(2, 4, 64, 0, 8);

	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	cai_model_get_info(engine_test_model(), &info);
	make_prompt(prompt, 40, 21);
	req = request(prompt, 40, 0.0f, 0, 16);
	CHECK(run_batch(engine, &req, 1, &r));
	memcpy(all, prompt, sizeof(prompt));
	memcpy(all + 40, r.tokens, sizeof(int32_t) * 16);
	logits = malloc(sizeof(float) * 56 * info.n_vocab);
	CHECK(cai_engine_score(engine, all, 56, false, logits, &err) == CAI_OK);
	/* greedy generation = argmax of teacher-forced logits at every generated position */
	for (int i = 0; i < 16; i++)
	{
		const float *row = logits + (size_t) (39 + i) * info.n_vocab;
		int			best = 0;

		for (int v = 1; v < info.n_vocab; v++)
			if (row[v] > row[best])
				best = v;
		CHECK_EQ_INT(best, r.tokens[i]);
	}
	free(logits);
	cai_engine_free(engine);
}

TEST(engine_early_rejection_on_estimated_wait)
{
	int32_t		prompt[40];
	cai_request_params req;
	run_result	r;
	uint64_t	id;
	cai_error	err;
	cai_engine_stats stats;
	cai_engine *engine = make_engine(2, 1, 64, 0, 16);

	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	make_prompt(prompt, 40, 2);
	/* one finished request teaches the engine how long a request takes */
	req = request(prompt, 40, 0.0f, 0, 16);
	CHECK(run_batch(engine, &req, 1, &r));
	cai_engine_get_stats(engine, &stats);
	CHECK(stats.mean_service_ms > 0.0);

	/* with one slot, a second queued request would wait a whole request's time */
	cai_engine_set_admission_limits(engine, 16, stats.mean_service_ms / 2.0);
	CHECK(cai_engine_submit(engine, &req, &id, &err) == CAI_OK);
	CHECK(cai_engine_estimate_wait_ms(engine) >= stats.mean_service_ms);
	CHECK(cai_engine_submit(engine, &req, &id, &err) == CAI_ERR_QUEUE_FULL);
	CHECK(strstr(err.message, "estimated wait") != NULL);
	cai_engine_get_stats(engine, &stats);
	CHECK_EQ_INT(stats.requests_rejected, 1);
	cai_engine_free(engine);
}

/*
 * The content ids cai_chat_build_prompt hands back for storage must render the same prompt as
 * the text did, in every format (trimming and SentencePiece spaces included): otherwise the
 * next turn, built from stored ids, would miss the prefix cache from that message on.
 */
TEST(engine_stored_content_ids_render_like_text)
{
	static const char *formats[] = {"chatml", "llama3", "gemma", "llama2", "zephyr"};
	synth_model_config cfg;
	cai_error	err;
	char		path[256];

	synth_model_default_config(&cfg);
	cfg.n_layers = 1;
	cfg.d_model = 32;
	cfg.n_heads = 2;
	cfg.n_kv_heads = 1;
	cfg.d_ff = 64;
	snprintf(path, sizeof(path), "/tmp/cai_test_template_%d.gguf", (int) getpid());
	CHECK(synth_model_write(path, &cfg, &err) == CAI_OK);

	for (size_t f = 0; f < sizeof(formats) / sizeof(formats[0]); f++)
	{
		cai_model_params mp;
		cai_model  *model = NULL;
		cai_prompt	from_text,
					from_ids;
		cai_chat_message msgs[2] = {
			{CAI_ROLE_SYSTEM, "  Be brief.\n", NULL, 0, NULL},
			{CAI_ROLE_USER, "  Hello   there, world!  \n", NULL, 0, NULL},
		};
		cai_prompt_params pp = {.add_generation_prompt = true};

		cai_model_params_default(&mp);
		mp.chat_template = formats[f];
		if (cai_model_load(path, &mp, &model, &err) != CAI_OK)
		{
			CHECK_MSG(0, "%s: %s", formats[f], err.message);
			continue;
		}
		CHECK(cai_chat_build_prompt(model, msgs, 2, &pp, &from_text, &err) == CAI_OK);
		CHECK_MSG(from_text.n_last_content_ids > 0, "%s", formats[f]);
		{
			/* the prompt is the format's own rendering of the texts */
			cai_tokens	direct;

			cai_tokens_init(&direct);
			CHECK(cai_chat_template_render(&model->tmpl, model->tokenizer, msgs, 2, true, &direct,
										   &err) == CAI_OK);
			CHECK_MSG(direct.n == from_text.n_ids &&
					  memcmp(direct.ids, from_text.ids, sizeof(int32_t) * direct.n) == 0,
					  "%s: the prompt differs from the template's rendering of the text", formats[f]);
			cai_tokens_free(&direct);
		}
		msgs[1].tokens = from_text.last_content_ids;
		msgs[1].n_tokens = from_text.n_last_content_ids;
		CHECK(cai_chat_build_prompt(model, msgs, 2, &pp, &from_ids, &err) == CAI_OK);
		CHECK_MSG(from_ids.n_ids == from_text.n_ids &&
				  memcmp(from_ids.ids, from_text.ids, sizeof(int32_t) * from_text.n_ids) == 0,
				  "%s: stored ids render differently from the text", formats[f]);
		cai_prompt_free(&from_text);
		cai_prompt_free(&from_ids);
		cai_model_free(model);
	}
	unlink(path);
}

/* A grammar for the constrained-request tests (the engine takes each one over). */
static cai_grammar *
test_grammar(const char *schema)
{
	cai_grammar *g = NULL;
	cai_error	err;

	if (cai_grammar_from_schema(schema, strlen(schema), &g, &err) != CAI_OK)
		fprintf(stderr, "    schema: %s\n", err.message);
	return g;
}

/*
 * Constrained requests (JSON Schema, any object) share a batch with unconstrained ones, greedy
 * and sampled: each one's tokens are those it gets alone, every finished value is valid JSON
 * the grammar allows, and a reply cut by max_tokens says so.
 */
TEST(engine_constrained_requests_batch_invariant)
{
	static const char *const schemas[] = {
		"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\", \"minimum\": 1, "
		"\"maximum\": 50}, \"b\": {\"enum\": [\"x\", \"yz\"]}}, \"required\": [\"a\", \"b\"]}",
		"{\"type\": \"array\", \"items\": {\"type\": \"string\", \"maxLength\": 3}, \"maxItems\": 3}",
		"{\"type\": \"boolean\"}",
	};
	int32_t		prompts[12][40];
	cai_request_params reqs[12];
	run_result *alone = calloc(12, sizeof(run_result));
	run_result *crowd = calloc(12, sizeof(run_result));
	cai_engine *engine = make_engine(2, 12, 96, 0, 16);
	int			n_values = 0;

	if (!engine || !alone || !crowd)
	{
		CHECK(engine && alone && crowd);
		goto done;
	}
	for (int pass = 0; pass < 2; pass++)
	{
		for (int i = 0; i < 12; i++)
		{
			make_prompt(prompts[i], 12 + 2 * i, 300 + i);
			reqs[i] = request(prompts[i], 12 + 2 * i, i % 2 ? 0.8f : 0.0f, 5 + i, 48);
			reqs[i].sampling.ignore_eos = false;
			if (i % 4 == 3)
				continue;		/* unconstrained beside the others */
			if (i % 4 == 2)
				CHECK_EQ_INT(cai_grammar_any_object(&reqs[i].grammar, NULL), CAI_OK);
			else
				reqs[i].grammar = test_grammar(schemas[i % 3]);
		}
		if (pass == 0)
			for (int i = 0; i < 12; i++)
				CHECK(run_batch(engine, &reqs[i], 1, &alone[i]));
		else
			CHECK(run_batch(engine, reqs, 12, crowd));
	}
	for (int i = 0; i < 12; i++)
	{
		CHECK_MSG(same_tokens(&alone[i], &crowd[i]), "request %d differs batched", i);
		if (i % 4 == 3 || alone[i].finish != CAI_FINISH_STOP)
			continue;
		n_values++;
		/* a finished constrained reply is a whole JSON value */
		{
			json_doc   *doc = NULL;
			cai_error	err;

			CHECK_MSG(json_parse(alone[i].text, alone[i].text_len, 0, &doc, &err) == CAI_OK,
					  "request %d: %.*s", i, (int) alone[i].text_len, alone[i].text);
			json_doc_free(doc);
		}
	}
	CHECK_MSG(n_values >= 4, "only %d constrained replies finished", n_values);
	/* a stop string beside a grammar is refused, and the grammar freed (no leak under ASan) */
	{
		uint64_t	id;
		cai_error	err;
		const char *stop = "}";

		reqs[0] = request(prompts[0], 12, 0.0f, 0, 8);
		reqs[0].sampling.n_stop = 1;
		reqs[0].sampling.stop[0] = stop;
		reqs[0].grammar = test_grammar(schemas[2]);
		CHECK_EQ_INT(cai_engine_submit(engine, &reqs[0], &id, &err), CAI_ERR_INVALID_ARGUMENT);
	}
done:
	if (engine)
		cai_engine_free(engine);
	free(alone);
	free(crowd);
}

/*
 * Steps one request of params->sampling.n_samples samples to its end, collecting each sample's
 * tokens by cai_event.sample; *peak_used gets the most KV blocks in use after any step.
 */
static bool
run_samples(cai_engine *engine, cai_request_params *params, run_result *results, int *peak_used)
{
	int			n = params->sampling.n_samples;
	int			done = 0;
	uint64_t	id;
	cai_error	err;

	memset(results, 0, sizeof(run_result) * n);
	*peak_used = 0;
	if (cai_engine_submit(engine, params, &id, &err) != CAI_OK)
	{
		fprintf(stderr, "    submit: %s\n", err.message);
		return false;
	}
	while (done < n)
	{
		const cai_event *events;
		int			n_events;
		cai_engine_stats st;

		if (cai_engine_step(engine, &events, &n_events, &err) != CAI_OK)
			return false;
		cai_engine_get_stats(engine, &st);
		if (st.kv_blocks_total - st.kv_blocks_free > *peak_used)
			*peak_used = st.kv_blocks_total - st.kv_blocks_free;
		for (int e = 0; e < n_events; e++)
		{
			run_result *r = &results[events[e].sample];

			if (events[e].request_id != id || events[e].sample < 0 || events[e].sample >= n)
				return false;
			if (events[e].token >= 0 && r->n_tokens < MAX_GEN)
				r->tokens[r->n_tokens++] = events[e].token;
			if (events[e].finish != CAI_FINISH_NONE)
			{
				r->finish = events[e].finish;
				r->usage = events[e].usage;
				done++;
			}
		}
	}
	return !cai_engine_has_work(engine);
}

/*
 * n parallel samples: sample i is the request with n 1 and seed + i, token for token, for a
 * prompt that ends inside a block (its rows copied into each sample's own block) and one that
 * ends on a block's edge; samples that wrote into a shared block would differ.  A prompt past an
 * attention segment (300 tokens) has the samples' steps read its first 256 positions in shared
 * tiles (cpu/attention_sharing.h): a row that took other bits there would draw other tokens.
 * With the prefix cache on, the second run reuses the prompt and gives the same samples.
 */
TEST(engine_samples_equal_their_seeds_alone)
{
	int32_t		prompt[300];
	int			lengths[3] = {100, 96, 300};
	run_result *alone = calloc(4, sizeof(run_result));
	run_result *together = calloc(4, sizeof(run_result));
	cai_engine *engine = make_engine_context(2, 8, 32, 1 << 20, 8, 512);
	int			peak;

	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	make_prompt(prompt, 300, 21);
	for (int l = 0; l < 3; l++)
		for (int pass = 0; pass < 2; pass++)
		{
			cai_request_params req = request(prompt, lengths[l], 2.0f, 1234, 20);

			req.use_cache = pass == 1;
			req.sampling.n_samples = 4;
			req.sampling.presence_penalty = 0.5f;	/* each sample's penalties see its reply */
			CHECK(run_samples(engine, &req, together, &peak));
			/* the first run left the prompt in the cache: the second reuses it */
			if (pass == 1)
				CHECK(run_samples(engine, &req, together, &peak));
			for (int i = 0; i < 4; i++)
			{
				cai_request_params one = request(prompt, lengths[l], 2.0f, 1234 + i, 20);

				one.sampling.presence_penalty = 0.5f;

				CHECK(run_samples(engine, &one, &alone[i], &peak));
				CHECK_EQ_INT(together[i].n_tokens, 20);
				CHECK(same_tokens(&alone[i], &together[i]));
				CHECK_EQ_INT(together[i].finish, CAI_FINISH_LENGTH);
				CHECK_EQ_INT(together[i].usage.prompt_tokens, lengths[l]);
				CHECK_EQ_INT(together[i].usage.completion_tokens, 20);
			}
			/* the seeds make different samples */
			CHECK(!same_tokens(&together[0], &together[1]));
			if (pass == 1)
				CHECK(together[3].usage.cached_tokens > 0);
		}
	cai_engine_free(engine);
	free(alone);
	free(together);
}

/*
 * n = 8 holds one prompt's KV and eight replies': at most the prompt's blocks, eight replies'
 * blocks and one more block per sample (the copy of the prompt's last, partly filled block).
 * Every reference goes when the samples finish, and when the request is cancelled while it
 * prefills (the samples wait to fork) or while it decodes.
 */
TEST(engine_samples_share_the_prompt_kv)
{
	int32_t		prompt[100];
	run_result *results = calloc(8, sizeof(run_result));
	cai_engine *engine = make_engine(2, 8, 32, 0, 8);
	cai_engine_stats before,
				after;
	cai_request_params req;
	int			peak;
	int			prompt_blocks = (100 + 15) / 16;
	int			reply_blocks = (20 + 15) / 16;
	uint64_t	id;
	cai_error	err;
	const cai_event *events;
	int			n_events;

	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	make_prompt(prompt, 100, 22);
	req = request(prompt, 100, 0.7f, 5, 20);
	req.sampling.n_samples = 8;
	cai_engine_get_stats(engine, &before);
	CHECK(run_samples(engine, &req, results, &peak));
	CHECK(peak > 0);
	CHECK(peak <= prompt_blocks + 8 * reply_blocks + 8);
	/* eight prompts would be 8 x 7 blocks */
	CHECK(peak < 2 * prompt_blocks + 8 * reply_blocks + 8);
	for (int i = 0; i < 8; i++)
		CHECK_EQ_INT(results[i].n_tokens, 20);
	cai_engine_get_stats(engine, &after);
	CHECK_EQ_INT(after.kv_blocks_free, before.kv_blocks_free);
	CHECK_EQ_INT((int) (after.requests_finished - before.requests_finished), 1);

	/* cancelled after one prefill chunk (32 of 100 tokens), then after a few decodes */
	for (int steps = 1; steps <= 6; steps += 5)
	{
		CHECK(cai_engine_submit(engine, &req, &id, &err) == CAI_OK);
		for (int s = 0; s < steps; s++)
			CHECK(cai_engine_step(engine, &events, &n_events, &err) == CAI_OK);
		cai_engine_get_stats(engine, &after);
		CHECK_EQ_INT(after.running, 8);
		CHECK(after.kv_blocks_free < before.kv_blocks_free);
		/* positions held: the prompt's 96 in full blocks once, then each sample's own copy of
		 * the last block's 4 and its reply (summed per sample, 8 prompts would be 800+) */
		CHECK(after.kv_tokens_held > 0);
		CHECK(after.kv_tokens_held <= (uint64_t) (96 + 8 * (4 + 20)));
		if (steps > 1)
			CHECK(after.kv_tokens_held > 96);
		CHECK(cai_engine_cancel(engine, id) == CAI_OK);
		CHECK(cai_engine_cancel(engine, id) == CAI_ERR_NOT_FOUND);
		cai_engine_get_stats(engine, &after);
		CHECK_EQ_INT(after.kv_blocks_free, before.kv_blocks_free);
		CHECK_EQ_INT(after.running, 0);
	}
	cai_engine_free(engine);
	free(results);
}

/* n: its range in the one table of limits, more samples than batch slots, tools. */
TEST(engine_samples_limits)
{
	int32_t		prompt[20];
	cai_request_params req;
	cai_sampling_params sp;
	uint64_t	id;
	cai_error	err;
	cai_engine *engine = make_engine(2, 4, 32, 0, 8);

	cai_sampling_params_default(&sp);
	CHECK_EQ_INT(sp.n_samples, 1);
	sp.n_samples = CAI_N_SAMPLES_MAX;
	CHECK(cai_sampling_params_check(&sp, &err) == CAI_OK);
	sp.n_samples = 0;
	CHECK(cai_sampling_params_check(&sp, &err) == CAI_ERR_INVALID_ARGUMENT);
	CHECK(strstr(err.message, "n must be between 1 and 16 (got 0)") != NULL);
	sp.n_samples = CAI_N_SAMPLES_MAX + 1;
	CHECK(cai_sampling_params_check(&sp, &err) == CAI_ERR_INVALID_ARGUMENT);
	CHECK(strstr(err.message, "n must be between 1 and 16 (got 17)") != NULL);
	if (!engine)
	{
		CHECK(engine != NULL);
		return;
	}
	make_prompt(prompt, 20, 23);
	req = request(prompt, 20, 0.5f, 1, 4);
	req.sampling.n_samples = 5;
	CHECK(cai_engine_submit(engine, &req, &id, &err) == CAI_ERR_INVALID_ARGUMENT);
	CHECK(strstr(err.message, "n must be at most the engine's max_running, 4 (got 5)") != NULL);
	req.sampling.n_samples = 17;
	CHECK(cai_engine_submit(engine, &req, &id, &err) == CAI_ERR_INVALID_ARGUMENT);
	CHECK(strstr(err.message, "n must be between 1 and 16") != NULL);
	CHECK(!cai_engine_has_work(engine));
	cai_engine_free(engine);
}

/*
 * n samples of a constrained reply share the grammar, each with its own state: sample i is the
 * request with n 1 and seed + i.  The samples end at different steps, and whichever is freed
 * last frees the grammar (ASan would see a use after free or a leak).
 */
TEST(engine_samples_share_a_grammar)
{
	static const char *const schema =
		"{\"type\": \"array\", \"items\": {\"type\": \"string\", \"maxLength\": 3}, \"maxItems\": 3}";
	int32_t		prompt[30];
	run_result *alone = calloc(3, sizeof(run_result));
	run_result *together = calloc(3, sizeof(run_result));
	cai_engine *engine = make_engine(2, 4, 64, 0, 8);
	cai_request_params req;
	int			peak;

	if (!engine || !alone || !together)
	{
		CHECK(engine && alone && together);
		goto done;
	}
	make_prompt(prompt, 30, 31);
	req = request(prompt, 30, 0.9f, 50, 40);
	req.sampling.ignore_eos = false;
	req.grammar = test_grammar(schema);
	req.sampling.n_samples = 3;
	CHECK(run_samples(engine, &req, together, &peak));
	for (int i = 0; i < 3; i++)
	{
		cai_request_params one = request(prompt, 30, 0.9f, 50 + i, 40);

		one.sampling.ignore_eos = false;
		one.grammar = test_grammar(schema);
		CHECK(run_samples(engine, &one, &alone[i], &peak));
		CHECK_MSG(same_tokens(&alone[i], &together[i]), "sample %d differs from its seed alone", i);
	}
	CHECK(!same_tokens(&together[0], &together[1]) || !same_tokens(&together[1], &together[2]));
done:
	cai_engine_free(engine);
	free(alone);
	free(together);
}
