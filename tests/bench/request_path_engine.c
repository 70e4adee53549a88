/*
 * request_path_engine.c — the engine-only half of tests/bench/bench_request_path.sh.
 *
 * Times what a one-token cai_complete costs inside the engine alone: tokenize the prompt, submit
 * it with max_tokens = 1, step until it finishes.  The SQL half (pgbench) adds the request path:
 * SPI-free argument handling, the DSM segment and queues, two latch wake-ups and the reply.
 *
 *   request_path_engine MODEL CALLS THREADS PROMPT
 *
 * Prints one line per statistic, in milliseconds per call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cai.h"

static double
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
}

static int
compare_double(const void *a, const void *b)
{
	double		x = *(const double *) a;
	double		y = *(const double *) b;

	return (x > y) - (x < y);
}

/* One call: tokenize, submit for one token, step until done.  Returns 0 on success. */
static int
one_call(cai_model *model, cai_engine *engine, const char *prompt)
{
	cai_error	err;
	int32_t    *ids = NULL;
	int			n_ids = 0;
	cai_request_params params;
	uint64_t	request_id;
	bool		done = false;

	if (cai_tokenize(model, prompt, strlen(prompt), false, &ids, &n_ids, &err) != CAI_OK)
	{
		fprintf(stderr, "tokenize: %s\n", err.message);
		return 1;
	}
	memset(&params, 0, sizeof(params));
	params.prompt = ids;
	params.n_prompt = n_ids;
	cai_sampling_params_default(&params.sampling);
	params.sampling.max_tokens = 1;
	params.cache_salt = 1;
	params.use_cache = true;
	if (cai_engine_submit(engine, &params, &request_id, &err) != CAI_OK)
	{
		fprintf(stderr, "submit: %s\n", err.message);
		cai_free(ids);
		return 1;
	}
	cai_free(ids);

	while (!done)
	{
		const cai_event *events;
		int			n_events;
		int			i;

		if (cai_engine_step(engine, &events, &n_events, &err) != CAI_OK)
		{
			fprintf(stderr, "step: %s\n", err.message);
			return 1;
		}
		for (i = 0; i < n_events; i++)
			if (events[i].request_id == request_id && events[i].finish != CAI_FINISH_NONE)
				done = true;
	}
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
	int			calls;
	int			threads;
	double	   *ms;
	double		sum = 0;
	int			i;

	if (argc != 5)
	{
		fprintf(stderr, "usage: %s MODEL CALLS THREADS PROMPT\n", argv[0]);
		return 2;
	}
	calls = atoi(argv[2]);
	threads = atoi(argv[3]);
	if (calls < 1)
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
	engine_params.context_length = 1024;
	engine_params.host_cache_bytes = 64u << 20;
	if (cai_engine_create(model, &engine_params, &engine, &err) != CAI_OK)
	{
		fprintf(stderr, "engine: %s\n", err.message);
		return 1;
	}

	ms = malloc(sizeof(double) * calls);
	if (ms == NULL)
		return 1;

	/* warm-up, as pgbench's first calls are */
	for (i = 0; i < 5; i++)
		if (one_call(model, engine, argv[4]) != 0)
			return 1;

	for (i = 0; i < calls; i++)
	{
		double		start = now_ms();

		if (one_call(model, engine, argv[4]) != 0)
			return 1;
		ms[i] = now_ms() - start;
		sum += ms[i];
	}
	qsort(ms, calls, sizeof(double), compare_double);
	printf("engine_calls %d\n", calls);
	printf("engine_mean_ms %.3f\n", sum / calls);
	printf("engine_median_ms %.3f\n", ms[calls / 2]);
	printf("engine_p99_ms %.3f\n", ms[(int) (calls * 0.99)]);

	free(ms);
	cai_engine_free(engine);
	cai_model_free(model);
	return 0;
}
