/*
 * e2e_greedy.c — the whole engine on the GPU against the whole engine on the CPU: greedy tokens
 * over a few hundred steps, one sequence alone and a ragged batch of 16 (half of it sampled with
 * a seed, since a random-weight model's greedy reply soon repeats one token, while seeded
 * sampling turns any difference in the probabilities into different tokens), through the public
 * engine API (cai_engine_submit / cai_engine_step), so scheduling, chunked prefill, the KV pool,
 * sampling and every backend operation are exercised exactly as the server runs them.
 *
 *   e2e_greedy --write-model PATH [gemma3]     writes the SmolLM2-shaped synthetic model, or
 *                                              the Gemma-3-shaped one
 *   e2e_greedy MODEL OUT.json [--steps N] [--devices cpu,cuda] [--two-digit-activations]
 *                             [--weights file --agree-steps N]
 *
 * --two-digit-activations loads the model in that mode (pg_cai.activation_precision = two_digit).
 * --weights file multiplies the file's own block weights (pg_cai.weights = file).  That path is
 * not bit-identical across backends (the GPU sums the per-block floats in another order), so
 * --agree-steps N asks only that every request's tokens agree for its first N steps; a later
 * difference is reported (first_difference) but accepted.  Without it, all must be equal.
 *
 * The int8 path is bit-identical across backends by design (kernels/README.md), so the tokens
 * must be equal, not merely close.  Without a CUDA device the CPU half still runs and the JSON
 * says why the GPU half was skipped; the exit status is 0 then, 1 when the devices disagree or
 * a run fails.  The CUDA library is found by the engine's loader (CAI_CUDA_LIBRARY, say).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cai.h"
#include "synth_model.h"

#define RAGGED 16
#define MAX_RUNS (1 + RAGGED)

/* One device's results: the lone sequence, then the ragged batch. */
typedef struct device_run
{
	const char *device;
	char		backend[256];	/* cai_engine_device() */
	char		error[512];		/* empty when the run completed */
	bool		skipped;		/* the device is absent: error says why */
	int32_t    *tokens[MAX_RUNS];
	int			n_tokens[MAX_RUNS];
	double		seconds;
} device_run;

/* The prompts: seeded ids over the synthetic vocabulary, lengths spread from 1 to ~400. */
typedef struct workload
{
	int32_t    *prompt[MAX_RUNS];
	int			n_prompt[MAX_RUNS];
	int			max_tokens[MAX_RUNS];
} workload;

static uint64_t
next_random(uint64_t *state)
{
	uint64_t	z = (*state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static void
make_workload(workload *w, int n_vocab, int steps)
{
	static const int lengths[RAGGED] = {1, 3, 16, 17, 31, 64, 65, 100, 127, 128, 129, 200, 255,
	300, 333, 400};
	uint64_t	state = 20261125;

	for (int r = 0; r < MAX_RUNS; r++)
	{
		int			n = r == 0 ? 32 : lengths[r - 1];

		w->n_prompt[r] = n;
		w->prompt[r] = malloc(sizeof(int32_t) * n);
		for (int i = 0; i < n; i++)
			w->prompt[r][i] = SYNTH_FIRST_BYTE_TOKEN +
				(int32_t) (next_random(&state) % (uint64_t) (n_vocab - SYNTH_FIRST_BYTE_TOKEN));
		/* ragged ends too: sequences leave the batch at different steps */
		w->max_tokens[r] = r == 0 ? steps : steps / 2 + (r * 37) % (steps / 2 + 1);
	}
}

static double
now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Runs requests [first, first + n) together to the end; false with run->error on a failure. */
static bool
run_batch(cai_engine *engine, const workload *w, int first, int n, device_run *run)
{
	cai_error	err;
	int			open = n;

	for (int r = first; r < first + n; r++)
	{
		cai_request_params rp;
		uint64_t	id;

		memset(&rp, 0, sizeof(rp));
		rp.prompt = w->prompt[r];
		rp.n_prompt = w->n_prompt[r];
		cai_sampling_params_default(&rp.sampling);
		rp.sampling.temperature = r % 2 == 1 ? 1.0f : 0.0f;
		rp.sampling.seed = (uint64_t) r;
		rp.sampling.max_tokens = w->max_tokens[r];
		rp.sampling.ignore_eos = true;
		rp.user_data = (void *) (intptr_t) r;
		run->tokens[r] = malloc(sizeof(int32_t) * w->max_tokens[r]);
		run->n_tokens[r] = 0;
		if (cai_engine_submit(engine, &rp, &id, &err) != CAI_OK)
		{
			snprintf(run->error, sizeof(run->error), "submit: %.480s", err.message);
			return false;
		}
	}
	while (open > 0)
	{
		const cai_event *events;
		int			n_events;

		if (cai_engine_step(engine, &events, &n_events, &err) != CAI_OK)
		{
			snprintf(run->error, sizeof(run->error), "step: %.480s", err.message);
			return false;
		}
		for (int e = 0; e < n_events; e++)
		{
			int			r = (int) (intptr_t) events[e].user_data;

			if (events[e].token >= 0 && run->n_tokens[r] < w->max_tokens[r])
				run->tokens[r][run->n_tokens[r]++] = events[e].token;
			if (events[e].finish == CAI_FINISH_ERROR)
			{
				snprintf(run->error, sizeof(run->error), "request %d: %.400s", r,
						 events[e].error ? events[e].error : "failed");
				return false;
			}
			if (events[e].finish != CAI_FINISH_NONE)
				open--;
		}
	}
	return true;
}

static void
run_device(cai_model *model, const workload *w, device_run *run)
{
	cai_engine_params ep;
	cai_engine *engine;
	cai_error	err;
	double		t0 = now_seconds();

	cai_engine_params_default(&ep);
	ep.device = run->device;
	ep.max_running = RAGGED;
	ep.context_length = 1024;
	ep.host_cache_bytes = 0;
	if (cai_engine_create(model, &ep, &engine, &err) != CAI_OK)
	{
		/* an absent device is a skip; any other failure of the GPU half is a failure */
		run->skipped = strcmp(run->device, "cpu") != 0 && err.status == CAI_ERR_UNSUPPORTED;
		snprintf(run->error, sizeof(run->error), "%s", err.message);
		return;
	}
	snprintf(run->backend, sizeof(run->backend), "%s", cai_engine_device(engine));
	if (run_batch(engine, w, 0, 1, run))
		run_batch(engine, w, 1, RAGGED, run);
	cai_engine_free(engine);
	run->seconds = now_seconds() - t0;
}

static void
write_json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++)
	{
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char) *s < 0x20)
			fprintf(f, "\\u%04x", *s);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

static void
write_run(FILE *f, const device_run *run)
{
	fprintf(f, "{\"device\": ");
	write_json_string(f, run->device);
	fprintf(f, ", \"backend\": ");
	write_json_string(f, run->backend);
	fprintf(f, ", \"status\": \"%s\", \"error\": ",
			run->skipped ? "skipped" : run->error[0] ? "failed" : "passed");
	write_json_string(f, run->error);
	fprintf(f, ", \"seconds\": %.3f, \"tokens\": [", run->seconds);
	for (int r = 0; r < MAX_RUNS; r++)
	{
		fprintf(f, "%s[", r ? ", " : "");
		for (int i = 0; i < run->n_tokens[r]; i++)
			fprintf(f, "%s%d", i ? "," : "", run->tokens[r][i]);
		fputc(']', f);
	}
	fprintf(f, "]}");
}

/* The request and step of the earliest token where b differs from a, or -1. */
static int
first_difference(const device_run *a, const device_run *b, int *step)
{
	int			req = -1;

	/* the earliest step of any request: --agree-steps bounds every request by it */
	for (int r = 0; r < MAX_RUNS; r++)
	{
		int			n = a->n_tokens[r] < b->n_tokens[r] ? a->n_tokens[r] : b->n_tokens[r];
		int			at = -1;

		for (int i = 0; i < n && at < 0; i++)
			if (a->tokens[r][i] != b->tokens[r][i])
				at = i;
		if (at < 0 && a->n_tokens[r] != b->n_tokens[r])
			at = n;
		if (at >= 0 && (req < 0 || at < *step))
		{
			req = r;
			*step = at;
		}
	}
	return req;
}

static int
write_model(const char *path, const char *shape)
{
	synth_model_config cfg;
	cai_error	err;

	synth_model_default_config(&cfg);
	cfg.weight_type = GGML_TYPE_Q4_1;
	cfg.embd_type = GGML_TYPE_Q8_0;
	if (shape == NULL)
	{
		/* SmolLM2-135M's shape and weight type, over the synthetic vocabulary */
		cfg.name = "synthetic SmolLM2-135M shape";
		cfg.n_layers = 30;
		cfg.d_model = 576;
		cfg.n_heads = 9;
		cfg.n_kv_heads = 3;
		cfg.d_ff = 1536;
		cfg.context_length = 2048;
		cfg.rope_base = 100000.0f;
		cfg.seed = 135;
	}
	else if (strcmp(shape, "gemma3") == 0)
	{
		/*
		 * Gemma 3 270M's layer (width 640, four query heads of 256 on one KV head, GeGLU of
		 * 2048, sandwich and q/k norms, embeddings scaled by sqrt(640)) in six layers: five
		 * local ones, then a global one.  A window of 128, shorter than most prompts, so that
		 * windows cut in at prefill and while decoding.  The head is untied: tied to these
		 * random embeddings scaled up, it would make each token its own successor, and every
		 * sequence would repeat one token whatever the layers computed.
		 */
		cfg.arch = "gemma3";
		cfg.name = "synthetic Gemma-3-270M shape";
		cfg.n_layers = 6;
		cfg.d_model = 640;
		cfg.n_heads = 4;
		cfg.n_kv_heads = 1;
		cfg.head_dim = 256;
		cfg.d_ff = 2048;
		cfg.sliding_window = 128;
		cfg.context_length = 2048;
		cfg.rope_base = 1000000.0f;
		cfg.rms_eps = 1e-6f;
		cfg.tokenizer_pre = "default";
		cfg.seed = 270;
		cfg.tied_embeddings = false;
	}
	else
	{
		fprintf(stderr, "e2e_greedy: unknown model shape %s (gemma3, or none: SmolLM2)\n", shape);
		return 2;
	}
	if (synth_model_write(path, &cfg, &err) != CAI_OK)
	{
		fprintf(stderr, "e2e_greedy: %s\n", err.message);
		return 1;
	}
	printf("e2e_greedy: wrote %s (%s)\n", path, cfg.name);
	return 0;
}

int
main(int argc, char **argv)
{
	const char *model_path,
			   *out_path;
	const char *devices = "cpu,cuda";
	int			steps = 300;
	bool		two_digit_activations = false;
	const char *weights = NULL;
	int			agree_steps = -1;	/* -1: every step */
	bool		accepted = false;
	cai_model_params mp;
	cai_model  *model;
	cai_model_info info;
	cai_error	err;
	workload	w;
	device_run	runs[2];
	int			n_runs = 0;
	FILE	   *f;
	int			rc = 0;
	int			diff_req = -1,
				diff_step = 0;
	bool		compared = false;

	if ((argc == 3 || argc == 4) && strcmp(argv[1], "--write-model") == 0)
		return write_model(argv[2], argc == 4 ? argv[3] : NULL);
	if (argc < 3)
	{
		fprintf(stderr, "usage: e2e_greedy --write-model PATH [gemma3]\n"
				"       e2e_greedy MODEL OUT.json [--steps N] [--devices cpu,cuda] "
				"[--two-digit-activations] [--weights int8|file] [--agree-steps N]\n");
		return 2;
	}
	model_path = argv[1];
	out_path = argv[2];
	for (int i = 3; i < argc; i++)
	{
		if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
			steps = atoi(argv[++i]);
		else if (strcmp(argv[i], "--devices") == 0 && i + 1 < argc)
			devices = argv[++i];
		else if (strcmp(argv[i], "--two-digit-activations") == 0)
			two_digit_activations = true;
		else if (strcmp(argv[i], "--weights") == 0 && i + 1 < argc)
			weights = argv[++i];
		else if (strcmp(argv[i], "--agree-steps") == 0 && i + 1 < argc)
			agree_steps = atoi(argv[++i]);
		else
		{
			fprintf(stderr, "e2e_greedy: unknown argument %s\n", argv[i]);
			return 2;
		}
	}
	if (steps < 2 || steps > 600)
	{
		fprintf(stderr, "e2e_greedy: --steps must be 2..600\n");
		return 2;
	}

	cai_model_params_default(&mp);
	mp.rounding = CAI_ROUNDING_NEAREST;
	mp.activations = two_digit_activations ? CAI_ACTIVATIONS_TWO_DIGIT : CAI_ACTIVATIONS_INT8;
	if (weights && !cai_weights_mode_parse(weights, &mp.weights))
	{
		fprintf(stderr, "e2e_greedy: unknown weights mode %s\n", weights);
		return 2;
	}
	if (cai_model_load(model_path, &mp, &model, &err) != CAI_OK)
	{
		fprintf(stderr, "e2e_greedy: %s\n", err.message);
		return 1;
	}
	cai_model_get_info(model, &info);
	make_workload(&w, info.n_vocab, steps);

	memset(runs, 0, sizeof(runs));
	if (strstr(devices, "cpu"))
		runs[n_runs++].device = "cpu";
	if (strstr(devices, "cuda"))
		runs[n_runs++].device = "cuda";
	for (int d = 0; d < n_runs; d++)
	{
		run_device(model, &w, &runs[d]);
		if (runs[d].skipped)
			printf("e2e_greedy: %s skipped: %s\n", runs[d].device, runs[d].error);
		else if (runs[d].error[0])
		{
			printf("e2e_greedy: %s failed: %s\n", runs[d].device, runs[d].error);
			rc = 1;
		}
		else
			printf("e2e_greedy: %s (%s): %d sequences, %.1f s\n", runs[d].device, runs[d].backend,
				   MAX_RUNS, runs[d].seconds);
	}
	if (n_runs == 2 && !runs[0].error[0] && !runs[1].error[0])
	{
		compared = true;
		diff_req = first_difference(&runs[0], &runs[1], &diff_step);
		accepted = diff_req >= 0 && agree_steps >= 0 && diff_step >= agree_steps;
		if (diff_req >= 0)
		{
			printf("e2e_greedy: tokens differ: request %d (%s) at step %d%s\n", diff_req,
				   diff_req == 0 ? "alone" : "ragged batch", diff_step,
				   accepted ? " (after the steps that must agree: accepted)" : "");
			if (!accepted)
				rc = 1;
		}
		else
			printf("e2e_greedy: the GPU's tokens equal the CPU's (%d sequences, up to %d steps)\n",
				   MAX_RUNS, steps);
	}

	f = fopen(out_path, "w");
	if (!f)
	{
		perror(out_path);
		return 1;
	}
	fprintf(f, "{\"model\": ");
	write_json_string(f, model_path);
	fprintf(f, ", \"steps\": %d, \"agree_steps\": %d, \"weights\": \"%s\", \"sequences\": %d, "
			"\"prompt_lengths\": [", steps, agree_steps < 0 ? steps : agree_steps,
			weights ? weights : "int8", MAX_RUNS);
	for (int r = 0; r < MAX_RUNS; r++)
		fprintf(f, "%s%d", r ? "," : "", w.n_prompt[r]);
	fprintf(f, "], \"compared\": %s, \"equal\": %s, \"first_difference\": ",
			compared ? "true" : "false", compared && (diff_req < 0 || accepted) ? "true" : "false");
	if (diff_req >= 0)
		fprintf(f, "{\"request\": %d, \"step\": %d}", diff_req, diff_step);
	else
		fprintf(f, "null");
	fprintf(f, ", \"runs\": [");
	for (int d = 0; d < n_runs; d++)
	{
		if (d)
			fprintf(f, ", ");
		write_run(f, &runs[d]);
	}
	fprintf(f, "]}\n");
	fclose(f);

	for (int d = 0; d < n_runs; d++)
		for (int r = 0; r < MAX_RUNS; r++)
			free(runs[d].tokens[r]);
	for (int r = 0; r < MAX_RUNS; r++)
		free(w.prompt[r]);
	cai_model_free(model);
	return rc;
}
