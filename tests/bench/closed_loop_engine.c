/*
 * closed_loop_engine.c — the engine-only half of tests/bench/bench_pgbench.sh.
 *
 * Runs the work pgbench's clients give the server, without PostgreSQL: CLIENTS requests in flight
 * at all times, each the same chat as bench_pgbench.sh's script (system prompt "You are a
 * helpful assistant.", user turn "Tell me something about the number C-N.", through the model's
 * chat template), greedy, ignore_eos, MAX_TOKENS tokens, the prefix cache on (so the system
 * prompt's blocks are shared, as in the server).  When a request finishes, its client submits the
 * next at once.  The engine is configured like the benchmark's cluster (pg_cai.conf plus
 * max_batch): context 1024, a 64 MB prefix cache, a step budget of 512 tokens.
 *
 *   closed_loop_engine MODEL THREADS CLIENTS SECONDS MAX_TOKENS MAX_BATCH
 *
 * Prints one line: clients, requests finished, requests/s, completion tokens/s, p50 and p99
 * latency (submit to finish, ms), and the mean number of tokens generated per step.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cai.h"

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

typedef struct client
{
	int			id;
	double		submitted;		/* when its request in flight was submitted */
} client;

/* Submits client c's next request: bench_pgbench.sh's chat with a fresh random number. */
static int
submit_next(cai_model *model, cai_engine *engine, client *c, int max_tokens, uint64_t *rng)
{
	char		user[128];
	cai_chat_message messages[2];
	cai_prompt_params pp = {.add_generation_prompt = true};
	cai_prompt	prompt;
	cai_request_params params;
	uint64_t	request_id;
	cai_error	err;

	*rng = *rng * 6364136223846793005ULL + 1442695040888963407ULL;
	snprintf(user, sizeof(user), "Tell me something about the number %d-%d.", c->id + 1,
			 (int) ((*rng >> 33) % 1000000) + 1);
	memset(messages, 0, sizeof(messages));
	messages[0].role = CAI_ROLE_SYSTEM;
	messages[0].content = "You are a helpful assistant.";
	messages[1].role = CAI_ROLE_USER;
	messages[1].content = user;
	if (cai_chat_build_prompt(model, messages, 2, &pp, &prompt, &err) != CAI_OK)
	{
		fprintf(stderr, "prompt: %s\n", err.message);
		return 1;
	}
	memset(&params, 0, sizeof(params));
	params.prompt = prompt.ids;
	params.n_prompt = prompt.n_ids;
	cai_sampling_params_default(&params.sampling);
	params.sampling.temperature = 0.0f;
	params.sampling.max_tokens = max_tokens;
	params.sampling.ignore_eos = true;
	params.cache_salt = 1;
	params.use_cache = true;
	params.user_data = c;
	c->submitted = now_s();
	if (cai_engine_submit(engine, &params, &request_id, &err) != CAI_OK)
	{
		fprintf(stderr, "submit: %s\n", err.message);
		cai_prompt_free(&prompt);
		return 1;
	}
	cai_prompt_free(&prompt);
	return 0;
}

int
main(int argc, char **argv)
{
	cai_model_params model_params;
	cai_engine_params engine_params;
	cai_model  *model;
	cai_engine *engine;
	cai_error	err;
	int			threads,
				n_clients,
				max_tokens,
				max_batch;
	double		seconds;
	client	   *clients;
	double	   *latency;
	int			n_latency = 0,
				cap_latency = 1024;
	long		tokens = 0,
				steps = 0;
	uint64_t	rng = 1;
	double		t0,
				t_end;

	if (argc != 7)
	{
		fprintf(stderr, "usage: %s MODEL THREADS CLIENTS SECONDS MAX_TOKENS MAX_BATCH\n", argv[0]);
		return 2;
	}
	threads = atoi(argv[2]);
	n_clients = atoi(argv[3]);
	seconds = atof(argv[4]);
	max_tokens = atoi(argv[5]);
	max_batch = atoi(argv[6]);
	if (n_clients < 1 || seconds <= 0 || max_tokens < 1 || max_batch < 1)
		return 2;

	cai_model_params_default(&model_params);
	model_params.n_threads = threads;
	if (cai_model_load(argv[1], &model_params, &model, &err) != CAI_OK)
	{
		fprintf(stderr, "load: %s\n", err.message);
		return 1;
	}
	cai_engine_params_default(&engine_params);
	engine_params.device = "cpu";
	engine_params.n_threads = threads;
	engine_params.max_running = max_batch;
	engine_params.max_step_tokens = 512;
	engine_params.context_length = 1024;
	engine_params.max_queue = n_clients + 8;
	engine_params.host_cache_bytes = 64u << 20;
	if (cai_engine_create(model, &engine_params, &engine, &err) != CAI_OK)
	{
		fprintf(stderr, "engine: %s\n", err.message);
		return 1;
	}
	clients = calloc((size_t) n_clients, sizeof(client));
	latency = malloc(sizeof(double) * (size_t) cap_latency);
	if (!clients || !latency)
		return 1;

	/* all clients start together; the first requests are the warm-up (pgbench's too) */
	for (int i = 0; i < n_clients; i++)
	{
		clients[i].id = i;
		if (submit_next(model, engine, &clients[i], max_tokens, &rng) != 0)
			return 1;
	}
	t0 = now_s();
	t_end = t0 + seconds;
	for (;;)
	{
		const cai_event *events;
		int			n_events;
		double		now;
		bool		timed = now_s() >= t0 + 2.0;	/* after a warm-up of 2 s */

		if (cai_engine_step(engine, &events, &n_events, &err) != CAI_OK)
		{
			fprintf(stderr, "step: %s\n", err.message);
			return 1;
		}
		now = now_s();
		if (now >= t_end + 2.0)
			break;
		if (timed)
			steps++;
		for (int i = 0; i < n_events; i++)
		{
			client	   *c = events[i].user_data;

			if (events[i].finish == CAI_FINISH_ERROR)
			{
				fprintf(stderr, "request failed: %s\n", events[i].error);
				return 1;
			}
			if (timed && events[i].token >= 0)
				tokens++;
			if (events[i].finish == CAI_FINISH_NONE)
				continue;
			if (timed)
			{
				if (n_latency == cap_latency)
				{
					cap_latency *= 2;
					latency = realloc(latency, sizeof(double) * (size_t) cap_latency);
					if (!latency)
						return 1;
				}
				latency[n_latency++] = (now - c->submitted) * 1000.0;
			}
			if (submit_next(model, engine, c, max_tokens, &rng) != 0)
				return 1;
		}
	}
	qsort(latency, (size_t) n_latency, sizeof(double), compare_double);
	printf("clients %d requests %d requests/s %.2f completion/s %.1f p50_ms %.0f p99_ms %.0f "
		   "avg_batch %.1f\n",
		   n_clients, n_latency, n_latency / seconds, tokens / seconds,
		   n_latency ? latency[(int) (n_latency * 0.50)] : 0.0,
		   n_latency ? latency[(int) (n_latency * 0.99)] : 0.0,
		   steps ? (double) tokens / steps : 0.0);
	free(latency);
	free(clients);
	cai_engine_free(engine);
	cai_model_free(model);
	return 0;
}
