/*
 * bench_disk_steps.c — whether the prefix cache's disk tier slows the engine's steps while it
 * writes: the duration of every decode step of a closed loop of conversations, with the tier and
 * without, in alternating rounds.
 *
 * CLIENTS conversations run at once, each turn the history so far plus NEW random tokens, greedy,
 * ignore_eos, REPLY tokens; when a turn finishes, the next turn of the same conversation is
 * submitted at once, and a conversation past 900 tokens starts over as a new one.  Every finished
 * turn inserts its blocks into the prefix cache (64 MB, which holds every live conversation, so
 * nothing is read back from disk): with the tier each new full block is queued for the tier's
 * writer thread, which writes it while the following steps run.  That thread is the only
 * difference between the two conditions.
 *
 * A decode step is one that computed no prompt token (the engine's prefill_tokens counter did not
 * move): only those are compared, since a step with a prefill chunk costs what its chunk costs.
 * Each round runs one condition for STEPS decode steps after a warm-up of 20 steps, on a new
 * engine (the tier's directory emptied); the conditions alternate, the first one rotating.
 * Prints each round's p50 and p99, then per condition the median over rounds of p50 and p99, the
 * p99 over all rounds' steps pooled, and what the tier wrote and dropped.
 *
 *   cc -O2 -std=gnu11 -Isrc/common -o /tmp/bench_disk_steps tests/bench/bench_disk_steps.c \
 *       build/libcai.a -lxxhash -lm -lpthread -ldl
 *   /tmp/bench_disk_steps MODEL THREADS DIR [CLIENTS 4] [ROUNDS 6] [STEPS 300] [NEW 48] [REPLY 32]
 *
 * DIR must be a directory of the caller's own (mode 0700); its contents are removed.
 * Not a test: it passes or fails nothing.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cai.h"

#define MAX_HISTORY 1024
#define RESTART_AT 900

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int
compare_double(const void *a, const void *b)
{
	double		x = *(const double *) a;
	double		y = *(const double *) b;

	return (x > y) - (x < y);
}

/* The q-quantile of v[0..n) (sorted in place), nearest rank. */
static double
quantile(double *v, int n, double q)
{
	int			i;

	if (n == 0)
		return 0.0;
	qsort(v, (size_t) n, sizeof(double), compare_double);
	i = (int) (q * n + 0.999999) - 1;
	if (i < 0)
		i = 0;
	if (i >= n)
		i = n - 1;
	return v[i];
}

typedef struct conversation
{
	int32_t		tokens[MAX_HISTORY];
	int			n;
	uint64_t	owner;
	uint64_t	rng;
} conversation;

static uint64_t next_owner = 1;

static int32_t
random_token(uint64_t *rng)
{
	*rng = *rng * 6364136223846793005ULL + 1442695040888963407ULL;
	/* well inside every vocabulary this is run with, clear of the low special ids */
	return (int32_t) (1000 + (*rng >> 33) % 20000);
}

static int
submit_turn(cai_engine *engine, conversation *c, int n_new, int n_reply)
{
	cai_request_params params;
	uint64_t	request_id;
	cai_error	err;

	if (c->n + n_new + n_reply > RESTART_AT)
	{
		c->n = 0;
		c->owner = next_owner++;
	}
	for (int i = 0; i < n_new; i++)
		c->tokens[c->n++] = random_token(&c->rng);
	memset(&params, 0, sizeof(params));
	params.prompt = c->tokens;
	params.n_prompt = c->n;
	cai_sampling_params_default(&params.sampling);
	params.sampling.temperature = 0.0f;
	params.sampling.max_tokens = n_reply;
	params.sampling.ignore_eos = true;
	params.cache_salt = 1;
	params.cache_owner = c->owner;
	params.use_cache = true;
	params.user_data = c;
	if (cai_engine_submit(engine, &params, &request_id, &err) != CAI_OK)
	{
		fprintf(stderr, "submit: %s\n", err.message);
		return 1;
	}
	return 0;
}

typedef struct round_result
{
	double	   *steps_ms;
	int			n_steps;
	double		p50;
	double		p99;
	uint64_t	bytes_written;
	uint64_t	blocks_dropped;
	uint64_t	disk_hits;
	double		mean_batch;
} round_result;

/* One round on a new engine: the tier under dir, or none when dir is NULL. */
static int
run_round(cai_model *model, int threads, const char *dir, int n_clients, int n_steps, int n_new,
		  int n_reply, uint64_t seed, round_result *out)
{
	cai_engine_params ep;
	cai_engine *engine;
	cai_engine_stats st;
	cai_error	err;
	conversation *convs = calloc((size_t) n_clients, sizeof(conversation));
	uint64_t	prefill_before;
	uint64_t	decoding = 0;
	int			warm = 0;

	out->steps_ms = malloc(sizeof(double) * (size_t) n_steps);
	out->n_steps = 0;
	if (!convs || !out->steps_ms)
		return 1;
	cai_engine_params_default(&ep);
	ep.device = "cpu";
	ep.n_threads = threads;
	ep.max_running = n_clients;
	ep.max_step_tokens = 512;
	ep.context_length = MAX_HISTORY + 64;
	ep.max_queue = n_clients + 8;
	ep.host_cache_bytes = (size_t) 64 << 20;
	if (dir)
	{
		ep.disk_cache_dir = dir;
		ep.disk_cache_bytes = (size_t) 4 << 30;
	}
	if (cai_engine_create(model, &ep, &engine, &err) != CAI_OK)
	{
		fprintf(stderr, "engine: %s\n", err.message);
		return 1;
	}
	if (dir)
		cai_engine_cache_reset(engine);	/* the previous round's files */
	for (int i = 0; i < n_clients; i++)
	{
		convs[i].rng = seed * 0x9E3779B97F4A7C15ULL + (uint64_t) i + 1;
		convs[i].owner = next_owner++;
		if (submit_turn(engine, &convs[i], n_new, n_reply) != 0)
			return 1;
	}
	cai_engine_get_stats(engine, &st);
	prefill_before = st.prefill_tokens;
	while (out->n_steps < n_steps)
	{
		const cai_event *events;
		int			n_events;
		double		t0 = now_s();
		double		ms;

		if (cai_engine_step(engine, &events, &n_events, &err) != CAI_OK)
		{
			fprintf(stderr, "step: %s\n", err.message);
			return 1;
		}
		ms = (now_s() - t0) * 1000.0;
		cai_engine_get_stats(engine, &st);
		if (st.prefill_tokens == prefill_before && n_events > 0)
		{
			if (warm >= 20)
			{
				decoding += (uint64_t) n_events;
				out->steps_ms[out->n_steps++] = ms;
			}
			else
				warm++;
		}
		prefill_before = st.prefill_tokens;
		for (int i = 0; i < n_events; i++)
		{
			conversation *c = events[i].user_data;

			if (events[i].finish == CAI_FINISH_ERROR)
			{
				fprintf(stderr, "request failed: %s\n", events[i].error);
				return 1;
			}
			if (events[i].token >= 0 && c->n < MAX_HISTORY)
				c->tokens[c->n++] = events[i].token;
			if (events[i].finish != CAI_FINISH_NONE &&
				submit_turn(engine, c, n_new, n_reply) != 0)
				return 1;
		}
	}
	cai_engine_get_stats(engine, &st);
	out->bytes_written = st.disk_bytes_written;
	out->blocks_dropped = st.disk_writes_dropped;
	out->disk_hits = st.disk_hits;
	out->mean_batch = (double) decoding / out->n_steps;
	if (dir)
		cai_engine_cache_reset(engine);
	cai_engine_free(engine);
	free(convs);
	{
		double	   *copy = malloc(sizeof(double) * (size_t) out->n_steps);

		if (!copy)
			return 1;
		memcpy(copy, out->steps_ms, sizeof(double) * (size_t) out->n_steps);
		out->p50 = quantile(copy, out->n_steps, 0.50);
		out->p99 = quantile(copy, out->n_steps, 0.99);
		free(copy);
	}
	return 0;
}

static void
summarize(const char *label, round_result *r, int n_rounds)
{
	double	   *p50 = malloc(sizeof(double) * (size_t) n_rounds);
	double	   *p99 = malloc(sizeof(double) * (size_t) n_rounds);
	double	   *all;
	int			n_all = 0;
	uint64_t	written = 0,
				dropped = 0,
				hits = 0;

	for (int i = 0; i < n_rounds; i++)
		n_all += r[i].n_steps;
	all = malloc(sizeof(double) * (size_t) n_all);
	if (!p50 || !p99 || !all)
		return;
	n_all = 0;
	for (int i = 0; i < n_rounds; i++)
	{
		p50[i] = r[i].p50;
		p99[i] = r[i].p99;
		memcpy(all + n_all, r[i].steps_ms, sizeof(double) * (size_t) r[i].n_steps);
		n_all += r[i].n_steps;
		written += r[i].bytes_written;
		dropped += r[i].blocks_dropped;
		hits += r[i].disk_hits;
	}
	printf("| %s | %d | %.2f ms | %.2f ms | %.2f ms | %.1f MB | %llu | %llu |\n", label, n_all,
		   quantile(p50, n_rounds, 0.5), quantile(p99, n_rounds, 0.5), quantile(all, n_all, 0.99),
		   written / 1e6, (unsigned long long) dropped, (unsigned long long) hits);
	free(p50);
	free(p99);
	free(all);
}

int
main(int argc, char **argv)
{
	cai_model_params mp;
	cai_model  *model;
	cai_error	err;
	const char *dir;
	int			threads,
				n_clients,
				n_rounds,
				n_steps,
				n_new,
				n_reply;
	round_result *with_tier,
			   *without;

	if (argc < 4)
	{
		fprintf(stderr, "usage: %s MODEL THREADS DIR [CLIENTS] [ROUNDS] [STEPS] [NEW] [REPLY]\n",
				argv[0]);
		return 2;
	}
	threads = atoi(argv[2]);
	dir = argv[3];
	n_clients = argc > 4 ? atoi(argv[4]) : 4;
	n_rounds = argc > 5 ? atoi(argv[5]) : 6;
	n_steps = argc > 6 ? atoi(argv[6]) : 300;
	n_new = argc > 7 ? atoi(argv[7]) : 48;
	n_reply = argc > 8 ? atoi(argv[8]) : 32;
	if (threads < 1 || n_clients < 1 || n_rounds < 1 || n_steps < 1 || n_new < 1 ||
		n_reply < 1 || n_new + n_reply > RESTART_AT)
	{
		fprintf(stderr, "bad arguments\n");
		return 2;
	}
	cai_model_params_default(&mp);
	mp.n_threads = threads;
	if (cai_model_load(argv[1], &mp, &model, &err) != CAI_OK)
	{
		fprintf(stderr, "load: %s\n", err.message);
		return 1;
	}
	with_tier = calloc((size_t) n_rounds, sizeof(round_result));
	without = calloc((size_t) n_rounds, sizeof(round_result));
	if (!with_tier || !without)
		return 1;
	printf("%d conversations at once, turns of %d new tokens and %d reply tokens, %d threads, "
		   "%d decode steps per round\n", n_clients, n_new, n_reply, threads, n_steps);
	for (int r = 0; r < n_rounds; r++)
	{
		for (int k = 0; k < 2; k++)
		{
			bool		tier = ((r + k) % 2) == 0;
			round_result *res = tier ? &with_tier[r] : &without[r];

			if (run_round(model, threads, tier ? dir : NULL, n_clients, n_steps, n_new, n_reply,
						  (uint64_t) r + 1, res) != 0)
				return 1;
			printf("round %d %-12s decode steps p50 %.2f ms p99 %.2f ms, batch %.2f, "
				   "%.1f MB written, %llu dropped\n", r + 1, tier ? "with tier" : "without",
				   res->p50, res->p99, res->mean_batch, res->bytes_written / 1e6,
				   (unsigned long long) res->blocks_dropped);
			fflush(stdout);
		}
	}
	printf("\n| condition | decode steps | p50 (median of rounds) | p99 (median of rounds) | "
		   "p99 (all steps) | written | writes dropped | disk hits |\n");
	printf("|---|---|---|---|---|---|---|---|\n");
	summarize("without the tier", without, n_rounds);
	summarize("with the tier", with_tier, n_rounds);
	cai_model_free(model);
	return 0;
}
