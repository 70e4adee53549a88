/*
 * cmd_bench.c — `cai bench`: prefill and batched decode throughput of the engine, as JSON.
 *
 * Prefill: one request with a prompt of --prompt-tokens tokens and max_tokens 1, timed from
 * submit to its finish (the prompt's forward, chunked by the engine's step budget, plus the first
 * token).  Decode at batch B: B requests with short distinct prompts submitted together, run with
 * ignore_eos to --gen-tokens each; only steps in which all B sequences decode are timed (prefill
 * steps and a ragged tail are left out), and throughput is the tokens those steps produced over
 * their wall time.  Each figure is the median of --repeat runs, after one warm-up, with the best
 * run alongside (on a shared machine contention only ever slows a run down).  Only --follow-up
 * (below) uses the prefix cache, so nothing else is reused between runs.  Tokens are greedy
 * unless --temp is given (then each decode sequence b draws with seed --seed + b, so that
 * sampling's cost is in the figures).
 * With --long-prompts N,N,... the prefill runs in rounds: the --prompt-tokens prompt, then each
 * long prompt followed by the --prompt-tokens prompt again, so that every long run sits between
 * two short ones; each long length's rate over the mean of its two neighbours' rates is taken
 * per round and its median reported.  On a shared machine whose speed drifts from second to
 * second, that ratio varies far less than one of rates measured in separate runs.
 * With --follow-up N every prompt length P above is also measured as a conversation's next turn:
 * per round, with the prefix cache emptied, the prompt of P tokens runs once with the cache,
 * then the same prompt with N more tokens, whose first P come from the cache; the report gives
 * that follow-up's time and the cold time of the same P + N tokens without the cache, timed
 * right after it, and the median per-round ratio cold / follow-up (what bench_cache.py's TTFT
 * on/off ratio is, without PostgreSQL).  With --disk-cache-dir DIR as well, each round first
 * caches the prompt in the prefix cache's disk tier there (kv_disk.h), and a second engine, whose
 * memory cache is empty as after a restart, times the follow-up with the prompt read back from
 * disk; the report adds that time and cold / disk.
 * With --json-schema FILE (or --json-object) every request is constrained to it, so that the
 * grammar's masks are in the figures; pick a schema whose values run past --gen-tokens (a long
 * minLength, many minItems), since a constrained request ends where its value does.
 * With --samples N one request of N parallel samples (OpenAI's n) of the --prompt-tokens prompt
 * runs --gen-tokens each, timed as a decode run is (steps in which all N decode), beside the
 * same request with one sample; the report gives both aggregate rates, their ratio, and the
 * most KV blocks in use during each (the samples share the prompt's blocks).
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "json_string.h"

static struct
{
	const char *model;
	int			threads;
	const char *isa;
	cli_numerics numerics;
	cli_int_list batches;
	int			prompt_tokens;
	cli_int_list long_prompts;
	int			follow_up;
	const char *disk_cache_dir;
	int			gen_tokens;
	int			decode_prompt_tokens;
	int			step_tokens;
	int			repeat;
	bool		json_only;
	float		temperature;
	float		top_p;
	int			top_k;
	uint64_t	seed;
	const char *json_schema;
	bool		json_object;
	bool		json_free_ws;
	int			n_samples;
} bench_opts;

static const cli_option bench_options[] = {
	CLI_MODEL_OPTION(bench_opts),
	CLI_THREADS_OPTION(bench_opts),
	CLI_ISA_OPTION(bench_opts),
	CLI_NUMERICS_OPTIONS(bench_opts),
	{
		.name = "batches",
		.short_name = 'b',
		.kind = CLI_OPT_INT_LIST,
		.target = &bench_opts.batches,
		.metavar = "B,B,...",
		.help = "decode batch sizes (default 1,8,32)",
		.min = 1,
		.max = 4096,
	},
	{
		.name = "samples",
		.kind = CLI_OPT_INT,
		.target = &bench_opts.n_samples,
		.metavar = "N",
		.help = "also decode N parallel samples of the --prompt-tokens prompt against one "
		"(aggregate tokens/s, KV blocks in use; file comment)",
		.min = 1,
		.max = CAI_N_SAMPLES_MAX,
	},
	{
		.name = "prompt-tokens",
		.short_name = 'p',
		.kind = CLI_OPT_INT,
		.target = &bench_opts.prompt_tokens,
		.metavar = "N",
		.help = "prefill prompt length (default 512)",
		.min = 1,
		.max = 1 << 20,
	},
	{
		.name = "long-prompts",
		.kind = CLI_OPT_INT_LIST,
		.target = &bench_opts.long_prompts,
		.metavar = "N,N,...",
		.help = "also prefill these lengths, each between two --prompt-tokens runs, and report "
		"each one's rate over theirs (file comment)",
		.min = 1,
		.max = 1 << 20,
	},
	{
		.name = "follow-up",
		.kind = CLI_OPT_INT,
		.target = &bench_opts.follow_up,
		.metavar = "N",
		.help = "also time N new tokens after each prompt length cached, against the same "
		"tokens cold (file comment)",
		.min = 1,
		.max = 1 << 20,
	},
	{
		.name = "disk-cache-dir",
		.kind = CLI_OPT_STRING,
		.target = &bench_opts.disk_cache_dir,
		.metavar = "DIR",
		.help = "with --follow-up, also time each follow-up from the disk tier in DIR, read back "
		"by a new engine (file comment)",
	},
	{
		.name = "gen-tokens",
		.short_name = 'g',
		.kind = CLI_OPT_INT,
		.target = &bench_opts.gen_tokens,
		.metavar = "N",
		.help = "tokens generated per sequence in the decode runs (default 64)",
		.min = 2,
		.max = 1 << 20,
	},
	{
		.name = "decode-prompt-tokens",
		.kind = CLI_OPT_INT,
		.target = &bench_opts.decode_prompt_tokens,
		.metavar = "N",
		.help = "prompt length of each decode-run sequence (default 16)",
		.min = 1,
		.max = 1 << 20,
	},
	{
		.name = "step-tokens",
		.kind = CLI_OPT_INT,
		.target = &bench_opts.step_tokens,
		.metavar = "N",
		.help = "engine token budget per step (default 512)",
		.min = 1,
		.max = 1 << 20,
	},
	{
		.name = "repeat",
		.short_name = 'r',
		.kind = CLI_OPT_INT,
		.target = &bench_opts.repeat,
		.metavar = "N",
		.help = "runs per figure; the median is reported (default 3)",
		.min = 1,
		.max = 1000,
	},
	{
		.name = "json",
		.kind = CLI_OPT_FLAG,
		.target = &bench_opts.json_only,
		.help = "print only the JSON (no progress on stderr)",
	},
	CLI_SAMPLING_OPTIONS(bench_opts),
	CLI_JSON_OPTIONS(bench_opts),
};

const cli_command cli_bench_command = {
	.name = "bench",
	.synopsis = "-m MODEL [options]",
	.summary = "measure prefill and batched decode tokens/s (JSON)",
	.description =
	"Measures prefill tokens/s for one prompt of --prompt-tokens tokens and aggregate decode\n"
	"tokens/s at each batch size, and prints them as JSON on stdout.",
	.options = bench_options,
	.n_options = sizeof(bench_options) / sizeof(bench_options[0]),
};

/* Text the benchmark prompts are cut from (any ordinary prose does). */
static const char bench_text[] =
	"The history of databases is a history of moving computation closer to data. Early systems "
	"stored records on tape and processed them in batches; relational engines brought declarative "
	"queries, transactions and indexes; later, extensions let users add their own types, "
	"functions and access methods. Running a language model inside the database continues that "
	"line: the conversation lives in tables, access control applies to it like to any other row, "
	"and a reply is computed where the history already is. Doing this well asks for the same care "
	"as any other part of a server: bounded memory, predictable latency under load, clean "
	"cancellation, and errors that explain themselves. ";

/* Fills out with n token ids cut from the bench text at a rotating offset (distinct prompts). */
static bool
make_prompt(const cai_model *model, const cli_tokens *base, int n, int offset, cli_tokens *out)
{
	cai_model_info info;

	out->n = 0;
	cai_model_get_info(model, &info);
	if (cli_model_adds_bos(model) && info.bos_token >= 0)
	{
		if (!cli_tokens_append(out, &info.bos_token, 1))
			return false;
	}
	while (out->n < n)
	{
		int			start = offset % base->n;
		int			take = base->n - start;

		if (take > n - out->n)
			take = n - out->n;
		if (!cli_tokens_append(out, base->ids + start, take))
			return false;
		offset = 0;
	}
	return true;
}

static int
compare_double(const void *a, const void *b)
{
	double		x = *(const double *) a;
	double		y = *(const double *) b;

	return (x > y) - (x < y);
}

static double
median(double *v, int n)
{
	qsort(v, n, sizeof(double), compare_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/*
 * A benchmark request; `stream` picks its seed when sampling.  False (reported) when its
 * grammar could not be made.
 */
static bool
bench_request(cai_request_params *rp, const cli_tokens *prompt, int max_tokens, int stream)
{
	memset(rp, 0, sizeof(*rp));
	rp->prompt = prompt->ids;
	rp->n_prompt = prompt->n;
	cai_sampling_params_default(&rp->sampling);
	rp->sampling.temperature = bench_opts.temperature;
	rp->sampling.top_p = bench_opts.top_p;
	rp->sampling.top_k = bench_opts.top_k;
	rp->sampling.seed = bench_opts.seed + (uint64_t) stream;
	rp->sampling.max_tokens = max_tokens;
	rp->sampling.ignore_eos = true;
	rp->use_cache = false;
	return cli_load_grammar(bench_opts.json_schema, bench_opts.json_object, bench_opts.json_free_ws,
							&rp->grammar);
}

/*
 * One prefill run: seconds from submit to the first token.  cache_salt 0 leaves the prefix cache
 * alone; another looks up and inserts in that namespace, and *cached_tokens (when given) says
 * how much of the prompt it reused.
 */
static int
run_prefill_cached(cai_engine *engine, const cli_tokens *prompt, uint64_t cache_salt,
				   double *seconds, int *cached_tokens)
{
	cai_request_params rp;
	cli_generation gen;
	double		t0;
	int			rc;

	if (!bench_request(&rp, prompt, 1, 0))
		return CLI_EXIT_ERROR;
	rp.use_cache = cache_salt != 0;
	rp.cache_salt = cache_salt;
	memset(&gen, 0, sizeof(gen));
	t0 = cli_now();
	rc = cli_generate(engine, &rp, NULL, &gen);
	*seconds = cli_now() - t0;
	if (cached_tokens)
		*cached_tokens = gen.usage.cached_tokens;
	cli_tokens_free(&gen.tokens);
	return rc;
}

static int
run_prefill(cai_engine *engine, const cli_tokens *prompt, double *seconds)
{
	return run_prefill_cached(engine, prompt, 0, seconds, NULL);
}

typedef struct follow_up_result
{
	double	   *seconds;		/* [round] the follow-up's time, prefix cached */
	double	   *cold_seconds;	/* [round] the same tokens without the cache */
	double	   *ratio;			/* [round] cold / follow-up */
	int			cached_tokens;	/* what the last round's follow-up reused */
	double	   *disk_seconds;	/* [round] --disk-cache-dir: the follow-up from disk */
	double	   *disk_ratio;		/* [round] cold / from disk */
	int			disk_cached_tokens;
} follow_up_result;

/* The prefix-cache namespace of --follow-up's runs (any but 0, which means no cache). */
#define FOLLOW_UP_SALT 1

/* The namespace --disk-cache-dir's runs cache under, apart from FOLLOW_UP_SALT's blocks. */
#define FOLLOW_UP_DISK_SALT 2

/*
 * --disk-cache-dir: caches prompt in engine's memory and disk tier, waits for the writes, and
 * times longer on a new engine of the same parameters (its memory empty, as after a restart),
 * which reads the prompt's blocks back from disk.  Then empties the cache, disk included.
 */
static int
run_follow_up_from_disk(cai_engine *engine, cai_model *model, const cai_engine_params *ep,
						const cli_tokens *prompt, const cli_tokens *longer,
						follow_up_result *res, int round)
{
	cai_engine *fresh = NULL;
	cai_error	err = {0};
	double		prime;
	int			cached = 0;
	int			rc;

	if (run_prefill_cached(engine, prompt, FOLLOW_UP_DISK_SALT, &prime, NULL) != CLI_EXIT_OK)
		return CLI_EXIT_ERROR;
	cai_engine_cache_flush(engine);
	if (cai_engine_create(model, ep, &fresh, &err) != CAI_OK)
		return cli_report("could not create the engine", &err);
	rc = run_prefill_cached(fresh, longer, FOLLOW_UP_DISK_SALT, &res->disk_seconds[round],
							&cached);
	cai_engine_free(fresh);
	cai_engine_cache_reset(engine);
	if (rc != CLI_EXIT_OK)
		return rc;
	/* the disk keeps full blocks only: the partial last one (under 16 tokens) is recomputed */
	if (cached <= prompt->n - 16)
		return cli_error("the follow-up read %d of the %d cached tokens back from disk (is %s "
						 "the server's own directory?)", cached, prompt->n,
						 bench_opts.disk_cache_dir);
	res->disk_cached_tokens = cached;
	return CLI_EXIT_OK;
}

/*
 * One round of --follow-up for `prompt` (P tokens), the cache emptied: caches it, then times
 * the prompt extended by n_new tokens from the cache and cold (and from disk first, with
 * --disk-cache-dir).  The extension is cut from the bench text at another offset, so it is not a
 * repeat of the prompt's own opening.
 */
static int
run_follow_up(cai_engine *engine, cai_model *model, const cai_engine_params *ep,
			  const cli_tokens *base, const cli_tokens *prompt, int n_new,
			  follow_up_result *res, int round)
{
	cli_tokens	longer = {0};
	cli_tokens	tail = {0};
	double		prime;
	int			cached = 0;
	int			rc = CLI_EXIT_ERROR;

	if (!make_prompt(model, base, n_new, 53, &tail) ||
		!cli_tokens_append(&longer, prompt->ids, prompt->n) ||
		!cli_tokens_append(&longer, tail.ids + (tail.n - n_new), n_new))
	{
		cli_error("out of memory building the follow-up prompt");
		goto done;
	}
	if (bench_opts.disk_cache_dir &&
		run_follow_up_from_disk(engine, model, ep, prompt, &longer, res, round) != CLI_EXIT_OK)
		goto done;
	if (run_prefill_cached(engine, prompt, FOLLOW_UP_SALT, &prime, NULL) != CLI_EXIT_OK ||
		run_prefill_cached(engine, &longer, FOLLOW_UP_SALT, &res->seconds[round],
						   &cached) != CLI_EXIT_OK ||
		run_prefill(engine, &longer, &res->cold_seconds[round]) != CLI_EXIT_OK)
		goto done;
	if (cached < prompt->n)
	{
		cli_error("the follow-up reused %d of the %d cached tokens", cached, prompt->n);
		goto done;
	}
	res->cached_tokens = cached;
	res->ratio[round] = res->cold_seconds[round] / res->seconds[round];
	if (bench_opts.disk_cache_dir)
		res->disk_ratio[round] = res->cold_seconds[round] / res->disk_seconds[round];
	rc = CLI_EXIT_OK;
done:
	cli_tokens_free(&longer);
	cli_tokens_free(&tail);
	return rc;
}

typedef struct decode_result
{
	int			steps;			/* timed steps (all sequences decoding) */
	long		tokens;			/* tokens produced in them */
	double		seconds;		/* their wall time */
} decode_result;

/* One decode run at batch size `batch`; see the file comment for what is timed. */
static int
run_decode(cai_engine *engine, const cai_model *model, const cli_tokens *base, int batch,
		   decode_result *res)
{
	cli_tokens *prompts = calloc((size_t) batch, sizeof(cli_tokens));
	bool	   *started = calloc((size_t) batch, sizeof(bool));
	int			n_started = 0;
	int			rc = CLI_EXIT_OK;
	cai_error	err = {0};

	memset(res, 0, sizeof(*res));
	if (!prompts || !started)
	{
		free(prompts);
		free(started);
		return cli_error("out of memory setting up the decode run");
	}
	for (int b = 0; b < batch && rc == CLI_EXIT_OK; b++)
	{
		cai_request_params rp;
		uint64_t	id;

		if (!make_prompt(model, base, bench_opts.decode_prompt_tokens, 37 * b, &prompts[b]))
		{
			rc = cli_error("out of memory building prompts");
			break;
		}
		if (!bench_request(&rp, &prompts[b], bench_opts.gen_tokens, b))
		{
			rc = CLI_EXIT_ERROR;
			break;
		}
		rp.user_data = (void *) (intptr_t) b;
		if (cai_engine_submit(engine, &rp, &id, &err) != CAI_OK)
			rc = cli_report("could not submit a decode request", &err);
	}

	while (rc == CLI_EXIT_OK && cai_engine_has_work(engine))
	{
		const cai_event *events;
		int			n_events;
		int			n_tokens = 0;
		bool		all_decoding = n_started == batch;
		double		t0 = cli_now();
		double		t1;

		if (cai_engine_step(engine, &events, &n_events, &err) != CAI_OK)
		{
			rc = cli_report("engine step failed", &err);
			break;
		}
		t1 = cli_now();
		for (int i = 0; i < n_events; i++)
		{
			int			b = (int) (intptr_t) events[i].user_data;

			if (events[i].finish == CAI_FINISH_ERROR)
				rc = cli_error("decode request failed: %s",
							   events[i].error ? events[i].error : "unknown error");
			if (events[i].token < 0)
				continue;
			n_tokens++;
			if (b >= 0 && b < batch && !started[b])
			{
				started[b] = true;
				n_started++;
			}
		}
		/* a step counts when every sequence was already decoding and each produced a token */
		if (all_decoding && n_tokens == batch)
		{
			res->steps++;
			res->tokens += n_tokens;
			res->seconds += t1 - t0;
		}
	}
	for (int b = 0; b < batch; b++)
		cli_tokens_free(&prompts[b]);
	free(prompts);
	free(started);
	if (rc == CLI_EXIT_OK && res->steps == 0)
		rc = cli_error("no decode step ran with all %d sequences (is --gen-tokens too small?)",
					   batch);
	return rc;
}

/*
 * One request of n samples of prompt run to its end: its decode steps timed as run_decode's,
 * and the most KV blocks in use after any step in *peak_blocks.
 */
static int
run_samples_decode(cai_engine *engine, const cli_tokens *prompt, int n, decode_result *res,
				   int *peak_blocks)
{
	cai_request_params rp;
	cai_error	err = {0};
	uint64_t	id;
	bool		decoding = false;
	int			rc = CLI_EXIT_OK;

	memset(res, 0, sizeof(*res));
	*peak_blocks = 0;
	if (!bench_request(&rp, prompt, bench_opts.gen_tokens, 0))
		return CLI_EXIT_ERROR;
	rp.sampling.n_samples = n;
	if (cai_engine_submit(engine, &rp, &id, &err) != CAI_OK)
		return cli_report("could not submit the samples' request", &err);
	while (rc == CLI_EXIT_OK && cai_engine_has_work(engine))
	{
		const cai_event *events;
		int			n_events;
		int			n_tokens = 0;
		double		t0 = cli_now();
		double		t1;
		cai_engine_stats es;

		if (cai_engine_step(engine, &events, &n_events, &err) != CAI_OK)
			return cli_report("engine step failed", &err);
		t1 = cli_now();
		for (int i = 0; i < n_events; i++)
		{
			if (events[i].finish == CAI_FINISH_ERROR)
				rc = cli_error("the samples' request failed: %s",
							   events[i].error ? events[i].error : "unknown error");
			n_tokens += events[i].token >= 0;
		}
		cai_engine_get_stats(engine, &es);
		if (es.kv_blocks_total - es.kv_blocks_free > *peak_blocks)
			*peak_blocks = es.kv_blocks_total - es.kv_blocks_free;
		/* the samples all fork at the prefill's last step, which is not a decode step */
		if (decoding && n_tokens == n)
		{
			res->steps++;
			res->tokens += n_tokens;
			res->seconds += t1 - t0;
		}
		decoding |= n_tokens > 0;
	}
	if (rc == CLI_EXIT_OK && res->steps == 0)
		rc = cli_error("no decode step ran with all %d samples (is --gen-tokens too small?)", n);
	return rc;
}

/*
 * What the runs measure and what they run on, from the allocations to the report: one struct,
 * so that each phase of cmd_bench is a function of it and one function frees it all.
 */
typedef struct bench_run
{
	cai_model  *model;
	cai_engine *engine;
	cai_model_info info;
	cli_tokens	base;			/* the benchmark text without BOS: prompts are cut from it */
	cli_tokens	prompt;			/* --prompt-tokens */
	int			n_long;
	cli_tokens	long_prompts[CLI_LIST_MAX];
	double	   *samples;		/* [round], reused by each phase */
	double		prefill_median;
	double		prefill_best;
	double	   *long_seconds;	/* [long prompt][round] */
	double	   *long_ratio;
	follow_up_result follow_ups[CLI_LIST_MAX + 1];	/* the prompt, then each long one */
	cai_engine_params engine_params;	/* the engine's, for --disk-cache-dir's second one */
	double	   *decode_tps;		/* [batch size] */
	decode_result *decode_best;
	double		samples_tps[2];	/* --samples: one sample, then N, the median rates */
	int			samples_peak_blocks[2];
} bench_run;

/* The per-round and per-batch arrays; false (reported) when out of memory. */
static bool
bench_alloc(bench_run *run)
{
	int			rounds = bench_opts.repeat;

	run->samples = calloc((size_t) rounds, sizeof(double));
	run->decode_tps = calloc((size_t) bench_opts.batches.n, sizeof(double));
	run->decode_best = calloc((size_t) bench_opts.batches.n, sizeof(decode_result));
	run->long_seconds = calloc((size_t) (run->n_long + 1) * rounds, sizeof(double));
	run->long_ratio = calloc((size_t) (run->n_long + 1) * rounds, sizeof(double));
	if (!run->samples || !run->decode_tps || !run->decode_best || !run->long_seconds ||
		!run->long_ratio)
		return cli_error("out of memory"), false;
	for (int i = 0; bench_opts.follow_up > 0 && i <= run->n_long; i++)
	{
		follow_up_result *f = &run->follow_ups[i];

		f->seconds = calloc((size_t) rounds, sizeof(double));
		f->cold_seconds = calloc((size_t) rounds, sizeof(double));
		f->ratio = calloc((size_t) rounds, sizeof(double));
		f->disk_seconds = calloc((size_t) rounds, sizeof(double));
		f->disk_ratio = calloc((size_t) rounds, sizeof(double));
		if (!f->seconds || !f->cold_seconds || !f->ratio || !f->disk_seconds || !f->disk_ratio)
			return cli_error("out of memory"), false;
	}
	return true;
}

static void
bench_free(bench_run *run)
{
	cli_tokens_free(&run->base);
	cli_tokens_free(&run->prompt);
	for (int i = 0; i < run->n_long; i++)
		cli_tokens_free(&run->long_prompts[i]);
	free(run->long_seconds);
	free(run->long_ratio);
	for (int i = 0; i <= run->n_long; i++)
	{
		free(run->follow_ups[i].seconds);
		free(run->follow_ups[i].cold_seconds);
		free(run->follow_ups[i].ratio);
		free(run->follow_ups[i].disk_seconds);
		free(run->follow_ups[i].disk_ratio);
	}
	free(run->samples);
	free(run->decode_tps);
	free(run->decode_best);
	if (run->engine)
		cai_engine_free(run->engine);
	if (run->model)
		cai_model_free(run->model);
}

/* The disk tier's notes (why it is off). */
static void
bench_log(void *arg, const char *line)
{
	(void) arg;
	fprintf(stderr, "cai bench: %s\n", line);
}

/*
 * The model and an engine sized for every phase: the largest batch, and a context that holds
 * the longest prompt with its follow-up as well as a decode sequence.  Then the text prompts
 * are cut from.  False (reported) on failure.
 */
static bool
bench_setup(bench_run *run, int max_batch, int longest)
{
	cai_engine_params ep;
	cai_error	err = {0};

	if (bench_opts.isa && cai_cpu_use_isa(bench_opts.isa, &err) != CAI_OK)
		return cli_report("could not pick the CPU kernels", &err), false;
	run->model = cli_load_model(bench_opts.model, bench_opts.threads, false, &bench_opts.numerics);
	if (!run->model)
		return false;
	cai_model_get_info(run->model, &run->info);

	cai_engine_params_default(&ep);
	ep.n_threads = bench_opts.threads;
	ep.max_running = max_batch;
	ep.max_step_tokens = bench_opts.step_tokens;
	ep.context_length = longest + bench_opts.follow_up + 8;
	if (bench_opts.n_samples > 0 &&
		ep.context_length < bench_opts.prompt_tokens + bench_opts.gen_tokens + 8)
		ep.context_length = bench_opts.prompt_tokens + bench_opts.gen_tokens + 8;
	if (ep.context_length < bench_opts.decode_prompt_tokens + bench_opts.gen_tokens + 8)
		ep.context_length = bench_opts.decode_prompt_tokens + bench_opts.gen_tokens + 8;
	ep.max_queue = max_batch + 8;
	/* emptied before every follow-up round, so it only ever holds one prompt's blocks */
	ep.host_cache_bytes = bench_opts.follow_up > 0 ? (size_t) 1 << 30 : 0;
	if (bench_opts.follow_up > 0 && bench_opts.disk_cache_dir)
	{
		ep.disk_cache_dir = bench_opts.disk_cache_dir;
		ep.disk_cache_bytes = (size_t) 4 << 30;
		ep.log = bench_log;
	}
	run->engine_params = ep;
	if (cai_engine_create(run->model, &ep, &run->engine, &err) != CAI_OK)
		return cli_report("could not create the engine", &err), false;
	if (!cli_tokenize_raw(run->model, bench_text, &run->base) || run->base.n < 2)
		return false;
	/* the text without its BOS is what prompts are cut from */
	if (cli_model_adds_bos(run->model))
	{
		memmove(run->base.ids, run->base.ids + 1, sizeof(int32_t) * (size_t) (run->base.n - 1));
		run->base.n--;
	}
	return true;
}

/*
 * Prefill: a warm-up (page the weights in, start the threads), then each round times the
 * prompt and each long prompt, the latter against the mean rate of the prompt runs around it,
 * so that a machine whose speed drifts does not bias the ratio.
 */
static int
bench_prefill(bench_run *run, bool progress)
{
	cli_tokens *prompt = &run->prompt;
	int			rounds = bench_opts.repeat;

	if (!make_prompt(run->model, &run->base,
					 bench_opts.prompt_tokens < 64 ? bench_opts.prompt_tokens : 64, 0, prompt) ||
		run_prefill(run->engine, prompt, &run->samples[0]) != CLI_EXIT_OK)
		return CLI_EXIT_ERROR;

	if (!make_prompt(run->model, &run->base, bench_opts.prompt_tokens, 0, prompt))
		return cli_error("out of memory building the prompt");
	for (int i = 0; i < run->n_long; i++)
		if (!make_prompt(run->model, &run->base, bench_opts.long_prompts.items[i], 0,
						 &run->long_prompts[i]))
			return cli_error("out of memory building the prompts");
	for (int r = 0; r < rounds; r++)
	{
		double		before;

		if (run_prefill(run->engine, prompt, &before) != CLI_EXIT_OK)
			return CLI_EXIT_ERROR;
		run->samples[r] = before;
		if (progress)
			fprintf(stderr, "  prefill %d tokens: %.1f tokens/s\n", prompt->n, prompt->n / before);
		for (int i = 0; i < run->n_long; i++)
		{
			const cli_tokens *lp = &run->long_prompts[i];
			double		t,
						after;

			if (run_prefill(run->engine, lp, &t) != CLI_EXIT_OK ||
				run_prefill(run->engine, prompt, &after) != CLI_EXIT_OK)
				return CLI_EXIT_ERROR;
			run->long_seconds[i * rounds + r] = t;
			run->long_ratio[i * rounds + r] =
				(lp->n / t) / (0.5 * (prompt->n / before + prompt->n / after));
			if (progress)
				fprintf(stderr, "  prefill %d tokens: %.1f tokens/s, %.1f %% of the %d-token rate "
						"around it\n", lp->n, lp->n / t,
						100.0 * run->long_ratio[i * rounds + r], prompt->n);
			before = after;
		}
	}
	run->prefill_median = median(run->samples, rounds);
	run->prefill_best = run->samples[0];	/* median() sorted them: the shortest time is first */
	return CLI_EXIT_OK;
}

/*
 * --follow-up: each prompt as a cached conversation's next turn, against the same turn cold.
 * The cache is emptied first, so that each measures its own prompt's blocks only.
 */
static int
bench_follow_ups(bench_run *run, bool progress)
{
	for (int r = 0; bench_opts.follow_up > 0 && r < bench_opts.repeat; r++)
		for (int i = 0; i <= run->n_long; i++)
		{
			const cli_tokens *p = i == 0 ? &run->prompt : &run->long_prompts[i - 1];
			follow_up_result *f = &run->follow_ups[i];

			cai_engine_cache_reset(run->engine);
			if (run_follow_up(run->engine, run->model, &run->engine_params, &run->base, p,
							  bench_opts.follow_up, f, r) != CLI_EXIT_OK)
				return CLI_EXIT_ERROR;
			if (progress)
				fprintf(stderr, "  follow-up of %d tokens after %d cached: %.1f ms, cold %.1f ms "
						"(%.1fx)\n", bench_opts.follow_up, f->cached_tokens,
						1000.0 * f->seconds[r], 1000.0 * f->cold_seconds[r], f->ratio[r]);
			if (progress && bench_opts.disk_cache_dir)
				fprintf(stderr, "  the same from disk after a restart, %d cached: %.1f ms "
						"(%.1fx)\n", f->disk_cached_tokens, 1000.0 * f->disk_seconds[r],
						f->disk_ratio[r]);
		}
	return CLI_EXIT_OK;
}

/* Decode at each batch size: the median rate over the rounds, and the best round. */
static int
bench_decode(bench_run *run, bool progress)
{
	for (int i = 0; i < bench_opts.batches.n; i++)
	{
		int			batch = bench_opts.batches.items[i];

		for (int r = 0; r < bench_opts.repeat; r++)
		{
			decode_result res;

			if (run_decode(run->engine, run->model, &run->base, batch, &res) != CLI_EXIT_OK)
				return CLI_EXIT_ERROR;
			run->samples[r] = res.tokens / res.seconds;
			if (r == 0 || run->samples[r] > run->decode_best[i].tokens / run->decode_best[i].seconds)
				run->decode_best[i] = res;
			if (progress)
				fprintf(stderr, "  decode batch %d: %.1f tokens/s (%d steps, %.1f ms/step)\n",
						batch, run->samples[r], res.steps, 1000.0 * res.seconds / res.steps);
		}
		run->decode_tps[i] = median(run->samples, bench_opts.repeat);
	}
	return CLI_EXIT_OK;
}

/*
 * --samples: one request of one sample of the prompt, then one of N, each over the rounds
 * (after a warm-up of N): the median aggregate decode rates and the most KV blocks in use.
 */
static int
bench_samples(bench_run *run, bool progress)
{
	int			counts[2] = {1, bench_opts.n_samples};
	decode_result res;
	int			peak;

	if (bench_opts.n_samples == 0)
		return CLI_EXIT_OK;
	if (run_samples_decode(run->engine, &run->prompt, counts[1], &res, &peak) != CLI_EXIT_OK)
		return CLI_EXIT_ERROR;
	for (int k = 0; k < 2; k++)
	{
		for (int r = 0; r < bench_opts.repeat; r++)
		{
			if (run_samples_decode(run->engine, &run->prompt, counts[k], &res, &peak) != CLI_EXIT_OK)
				return CLI_EXIT_ERROR;
			run->samples[r] = res.tokens / res.seconds;
			run->samples_peak_blocks[k] = peak;
			if (progress)
				fprintf(stderr, "  %d sample(s) of %d prompt tokens: %.1f tokens/s in all "
						"(%d steps, %.1f ms/step), %d KV blocks in use at most\n", counts[k],
						run->prompt.n, run->samples[r], res.steps,
						1000.0 * res.seconds / res.steps, peak);
		}
		run->samples_tps[k] = median(run->samples, bench_opts.repeat);
	}
	return CLI_EXIT_OK;
}

/* The report's header: what ran, on what, with which numerics and sampling. */
static void
bench_print_header(const bench_run *run)
{
	printf("{\n  \"engine\": \"pg_cai\",\n  \"model\": ");
	json_write_string(stdout, bench_opts.model);
	printf(",\n  \"model_name\": ");
	json_write_string(stdout, run->info.name);
	printf(",\n  \"device\": ");
	json_write_string(stdout, cai_engine_device(run->engine));
	printf(",\n  \"threads\": %d,\n  \"repeat\": %d,\n", bench_opts.threads, bench_opts.repeat);
	printf("  \"weights\": \"%s\",\n", run->info.file_weights ? "file" : "int8");
	printf("  \"weight_bytes\": %zu,\n", run->info.weight_bytes);
	printf("  \"weight_rounding\": \"%s\",\n  \"activation_precision\": \"%s\",\n",
		   run->info.gptq_rounding ? "gptq" : "nearest",
		   run->info.two_digit_activations ? "two_digit" :
		   run->info.superblock_activations ? "int8_256" : "int8");
	printf("  \"sampling\": {\"temperature\": %g, \"top_p\": %g, \"top_k\": %d, \"seed\": %llu},\n",
		   bench_opts.temperature, bench_opts.top_p, bench_opts.top_k,
		   (unsigned long long) bench_opts.seed);
}

/* The report on stdout, one JSON object (tests/bench/bench_engine.py reads it). */
static void
bench_print_json(const bench_run *run, bool progress)
{
	int			rounds = bench_opts.repeat;
	cai_engine_stats es;

	bench_print_header(run);
	printf("  \"prefill\": {\"prompt_tokens\": %d, \"step_tokens\": %d, \"seconds\": %.6f, "
		   "\"tokens_per_second\": %.2f, \"best_tokens_per_second\": %.2f},\n",
		   run->prompt.n, bench_opts.step_tokens, run->prefill_median,
		   run->prefill_median > 0 ? run->prompt.n / run->prefill_median : 0.0,
		   run->prefill_best > 0 ? run->prompt.n / run->prefill_best : 0.0);
	printf("  \"long_prefill\": [");
	for (int i = 0; i < run->n_long; i++)
	{
		double	   *sec = run->long_seconds + (size_t) i * rounds;
		double		t = median(sec, rounds);
		double		ratio = median(run->long_ratio + (size_t) i * rounds, rounds);
		int			n = run->long_prompts[i].n;

		printf("%s\n    {\"prompt_tokens\": %d, \"seconds\": %.6f, \"tokens_per_second\": %.2f, "
			   "\"best_tokens_per_second\": %.2f, \"ratio_to_prompt_tokens\": %.4f}",
			   i ? "," : "", n, t, n / t, n / sec[0], ratio);
	}
	printf("%s],\n", run->n_long ? "\n  " : "");
	printf("  \"follow_up\": [");
	for (int i = 0; bench_opts.follow_up > 0 && i <= run->n_long; i++)
	{
		const follow_up_result *f = &run->follow_ups[i];

		printf("%s\n    {\"cached_tokens\": %d, \"new_tokens\": %d, \"seconds\": %.6f, "
			   "\"cold_seconds\": %.6f, \"cold_over_follow_up\": %.3f",
			   i ? "," : "", f->cached_tokens, bench_opts.follow_up,
			   median(f->seconds, rounds), median(f->cold_seconds, rounds),
			   median(f->ratio, rounds));
		if (bench_opts.disk_cache_dir)
			printf(", \"disk_cached_tokens\": %d, \"disk_seconds\": %.6f, "
				   "\"cold_over_disk\": %.3f", f->disk_cached_tokens,
				   median(f->disk_seconds, rounds), median(f->disk_ratio, rounds));
		printf("}");
	}
	printf("%s],\n", bench_opts.follow_up > 0 ? "\n  " : "");
	printf("  \"decode\": [");
	for (int i = 0; i < bench_opts.batches.n; i++)
	{
		int			batch = bench_opts.batches.items[i];
		const decode_result *best = &run->decode_best[i];

		printf("%s\n    {\"batch\": %d, \"prompt_tokens\": %d, \"gen_tokens\": %d, "
			   "\"timed_steps\": %d, \"ms_per_step\": %.3f, \"tokens_per_second\": %.2f, "
			   "\"tokens_per_second_per_sequence\": %.2f, \"best_tokens_per_second\": %.2f}",
			   i ? "," : "", batch, bench_opts.decode_prompt_tokens, bench_opts.gen_tokens,
			   best->steps, 1000.0 * batch / run->decode_tps[i], run->decode_tps[i],
			   run->decode_tps[i] / batch, best->tokens / best->seconds);
	}
	printf("\n  ],\n");
	if (bench_opts.n_samples > 0)
		printf("  \"samples\": {\"n\": %d, \"prompt_tokens\": %d, \"gen_tokens\": %d, "
			   "\"tokens_per_second\": %.2f, \"one_sample_tokens_per_second\": %.2f, "
			   "\"ratio\": %.3f, \"kv_blocks_peak\": %d, \"one_sample_kv_blocks_peak\": %d, "
			   "\"kv_block_tokens\": 16},\n",
			   bench_opts.n_samples, run->prompt.n, bench_opts.gen_tokens, run->samples_tps[1],
			   run->samples_tps[0], run->samples_tps[1] / run->samples_tps[0],
			   run->samples_peak_blocks[1], run->samples_peak_blocks[0]);
	/* a GEMM on a slower fallback kernel (the GPU's dp4a path) would skew every figure */
	cai_engine_get_stats(run->engine, &es);
	printf("  \"gemm_fallbacks\": %llu\n}\n", (unsigned long long) es.gemm_fallbacks);
	if (progress && es.gemm_fallbacks > 0)
		fprintf(stderr, "  warning: %llu int8 GEMMs ran on the fallback kernel\n",
				(unsigned long long) es.gemm_fallbacks);
	fflush(stdout);
}

int
cmd_bench(int argc, char **argv)
{
	char	   *positional[1];
	int			n_positional;
	int			rc;
	int			max_batch = 1;
	int			longest;
	bool		progress;
	bench_run	run;

	memset(&run, 0, sizeof(run));
	memset(&bench_opts, 0, sizeof(bench_opts));
	bench_opts.batches.items[0] = 1;
	bench_opts.batches.items[1] = 8;
	bench_opts.batches.items[2] = 32;
	bench_opts.batches.n = 3;
	bench_opts.prompt_tokens = 512;
	bench_opts.gen_tokens = 64;
	bench_opts.decode_prompt_tokens = 16;
	bench_opts.step_tokens = 512;
	bench_opts.repeat = 3;
	bench_opts.top_p = 1.0f;
	rc = cli_parse(&cli_bench_command, argc, argv, positional, &n_positional);
	if (rc != CLI_EXIT_OK)
		return rc < 0 ? CLI_EXIT_OK : rc;
	if (!bench_opts.model)
		return cli_usage_error(&cli_bench_command, "missing -m MODEL");
	if (bench_opts.json_schema && bench_opts.json_object)
		return cli_usage_error(&cli_bench_command, "give --json-schema or --json-object, not both");
	progress = !bench_opts.json_only;
	for (int i = 0; i < bench_opts.batches.n; i++)
		if (bench_opts.batches.items[i] > max_batch)
			max_batch = bench_opts.batches.items[i];
	if (bench_opts.n_samples > max_batch)
		max_batch = bench_opts.n_samples;

	run.n_long = bench_opts.long_prompts.n;
	longest = bench_opts.prompt_tokens;
	for (int i = 0; i < run.n_long; i++)
		if (bench_opts.long_prompts.items[i] > longest)
			longest = bench_opts.long_prompts.items[i];

	rc = CLI_EXIT_ERROR;
	if (!bench_alloc(&run) || !bench_setup(&run, max_batch, longest))
		goto done;
	if (progress)
		fprintf(stderr, "cai bench: %s on %s\n", run.info.name, cai_engine_device(run.engine));
	if (bench_prefill(&run, progress) != CLI_EXIT_OK ||
		bench_follow_ups(&run, progress) != CLI_EXIT_OK ||
		bench_decode(&run, progress) != CLI_EXIT_OK ||
		bench_samples(&run, progress) != CLI_EXIT_OK)
		goto done;
	bench_print_json(&run, progress);
	rc = CLI_EXIT_OK;

done:
	bench_free(&run);
	return rc;
}
