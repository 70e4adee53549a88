/*
 * cmd_eval.c — `cai eval`: how much the int8 path costs in accuracy, measured on a text file.
 *
 * The file is tokenized and cut into consecutive windows of --ctx tokens; each window is scored
 * from position 0 (teacher forcing) on the int8 path and on the float reference path (the
 * source weights dequantized to fp32).  Over every position that predicts a next token it
 * reports each path's perplexity, how often the two paths' argmax agree, and the mean
 * KL(float || int8) of their next-token distributions.  With --logits-out DIR it also writes
 * the scored tokens and both paths' logits there, so that other engines can be compared against
 * the same float reference (tests/bench/bench_fidelity.py does that with llama.cpp).
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "json_string.h"

static struct
{
	const char *model;
	int			ctx;
	int			max_tokens;
	int			threads;
	bool		json_only;
	cli_numerics numerics;
	const char *logits_out;
} eval_opts;

static const cli_option eval_options[] = {
	CLI_MODEL_OPTION(eval_opts),
	{
		.name = "ctx",
		.short_name = 'c',
		.kind = CLI_OPT_INT,
		.target = &eval_opts.ctx,
		.metavar = "N",
		.help = "window length in tokens (default 512)",
		.min = 2,
		.max = 1 << 20,
	},
	{
		.name = "max-tokens",
		.short_name = 'n',
		.kind = CLI_OPT_INT,
		.target = &eval_opts.max_tokens,
		.metavar = "N",
		.help = "evaluate at most the first N tokens of the file; 0 = all",
		.min = 0,
		.max = 1 << 30,
	},
	CLI_THREADS_OPTION(eval_opts),
	{
		.name = "json",
		.kind = CLI_OPT_FLAG,
		.target = &eval_opts.json_only,
		.help = "print only the JSON (no human line)",
	},
	CLI_NUMERICS_OPTIONS(eval_opts),
	{
		.name = "logits-out",
		.kind = CLI_OPT_STRING,
		.target = &eval_opts.logits_out,
		.metavar = "DIR",
		.help = "also write the scored tokens and both paths' logits to DIR",
	},
};

const cli_command cli_eval_command = {
	.name = "eval",
	.synopsis = "-m MODEL [options] FILE",
	.summary = "perplexity and int8-vs-float agreement on a text file",
	.description =
	"Scores FILE in windows of --ctx tokens on the int8 path and on the float reference path,\n"
	"and prints both perplexities, the top-1 agreement and the mean KL(float || int8) as JSON\n"
	"on stdout, with a one-line summary on stderr.  --logits-out DIR (an existing directory)\n"
	"also writes the scored tokens (tokens.i32: int32, window after window) and each path's\n"
	"logits (int8.f32, float.f32: float32 [tokens][n_vocab]), 4 * n_vocab bytes per token each.",
	.options = eval_options,
	.n_options = sizeof(eval_options) / sizeof(eval_options[0]),
	.positional = "FILE",
	.min_positional = 1,
	.max_positional = 1,
};

typedef struct eval_totals
{
	long		positions;
	double		nll_int8;		/* sum of -log p(next token) */
	double		nll_float;
	double		kl;				/* sum of KL(float || int8) */
	long		top1_agree;
	double		seconds_int8;
	double		seconds_float;
} eval_totals;

/* log(sum(exp(row))) in double, and the row's argmax (lowest id on ties). */
static double
log_sum_exp(const float *row, int n, int *argmax)
{
	float		max = -FLT_MAX;
	int			best = 0;
	double		sum = 0.0;

	for (int v = 0; v < n; v++)
		if (row[v] > max)
		{
			max = row[v];
			best = v;
		}
	for (int v = 0; v < n; v++)
		sum += exp((double) row[v] - max);
	*argmax = best;
	return max + log(sum);
}

/* Accumulates one window's statistics from its int8 and float logits. */
static void
accumulate_window(const int32_t *tokens, int n, const float *q, const float *f, int n_vocab,
				  eval_totals *t)
{
	for (int i = 0; i + 1 < n; i++)
	{
		const float *qr = q + (size_t) i * n_vocab;
		const float *fr = f + (size_t) i * n_vocab;
		int			next = tokens[i + 1];
		int			q_arg;
		int			f_arg;
		double		q_lse = log_sum_exp(qr, n_vocab, &q_arg);
		double		f_lse = log_sum_exp(fr, n_vocab, &f_arg);
		double		kl = 0.0;

		for (int v = 0; v < n_vocab; v++)
		{
			double		log_pf = fr[v] - f_lse;
			double		log_pq = qr[v] - q_lse;

			kl += exp(log_pf) * (log_pf - log_pq);
		}
		t->nll_int8 += q_lse - qr[next];
		t->nll_float += f_lse - fr[next];
		t->kl += kl;
		t->top1_agree += q_arg == f_arg;
		t->positions++;
	}
}

/* The files --logits-out writes, in the order of eval_dump.files. */
static const char *const dump_names[] = {"tokens.i32", "int8.f32", "float.f32"};

typedef struct eval_dump
{
	FILE	   *files[3];
} eval_dump;

/* Creates (truncates) the --logits-out files in dir; false after reporting an error. */
static bool
eval_dump_open(eval_dump *d, const char *dir)
{
	for (int i = 0; i < 3; i++)
	{
		char		path[4096];

		snprintf(path, sizeof(path), "%s/%s", dir, dump_names[i]);
		d->files[i] = fopen(path, "wb");
		if (!d->files[i])
		{
			cli_error("could not create \"%s\": %s", path, strerror(errno));
			return false;
		}
	}
	return true;
}

/* Appends one window; false after reporting an error (a full disk, most likely). */
static bool
eval_dump_window(eval_dump *d, const char *dir, const int32_t *tokens, int n, const float *q,
				 const float *f, int n_vocab)
{
	const void *data[3] = {tokens, q, f};
	size_t		items[3] = {(size_t) n, (size_t) n * n_vocab, (size_t) n * n_vocab};

	for (int i = 0; i < 3; i++)
		if (fwrite(data[i], 4, items[i], d->files[i]) != items[i])
		{
			cli_error("could not write \"%s/%s\": %s", dir, dump_names[i], strerror(errno));
			return false;
		}
	return true;
}

/* Closes the files; false after reporting an error when a write could not be completed. */
static bool
eval_dump_close(eval_dump *d, const char *dir)
{
	bool		ok = true;

	for (int i = 0; i < 3; i++)
	{
		if (d->files[i] && fclose(d->files[i]) != 0 && ok)
		{
			cli_error("could not write \"%s/%s\": %s", dir, dump_names[i], strerror(errno));
			ok = false;
		}
		d->files[i] = NULL;
	}
	return ok;
}

int
cmd_eval(int argc, char **argv)
{
	char	   *positional[1];
	int			n_positional;
	int			rc;
	char	   *text = NULL;
	size_t		text_len = 0;
	cai_model  *model = NULL;
	cai_engine *engine = NULL;
	cai_model_info info;
	cai_engine_params ep;
	cai_error	err = {0};
	cli_tokens	tokens = {0};
	float	   *logits_q = NULL;
	float	   *logits_f = NULL;
	eval_totals totals;
	int			n_windows = 0;
	int			n_eval;
	eval_dump	dump = {{NULL}};

	memset(&eval_opts, 0, sizeof(eval_opts));
	eval_opts.ctx = 512;
	rc = cli_parse(&cli_eval_command, argc, argv, positional, &n_positional);
	if (rc != CLI_EXIT_OK)
		return rc < 0 ? CLI_EXIT_OK : rc;
	if (!eval_opts.model)
		return cli_usage_error(&cli_eval_command, "missing -m MODEL");

	memset(&totals, 0, sizeof(totals));
	rc = CLI_EXIT_ERROR;
	text = cli_read_file(positional[0], &text_len);
	if (!text)
		goto done;
	if (strlen(text) != text_len)
	{
		cli_error("\"%s\" contains NUL bytes; eval expects a text file", positional[0]);
		goto done;
	}
	model = cli_load_model(eval_opts.model, eval_opts.threads, true, &eval_opts.numerics);
	if (!model)
		goto done;
	cai_model_get_info(model, &info);
	if (!cli_tokenize_raw(model, text, &tokens))
		goto done;
	n_eval = tokens.n;
	if (eval_opts.max_tokens > 0 && n_eval > eval_opts.max_tokens)
		n_eval = eval_opts.max_tokens;
	if (n_eval < 2)
	{
		cli_error("\"%s\" has %d tokens; at least 2 are needed", positional[0], n_eval);
		goto done;
	}

	cai_engine_params_default(&ep);
	ep.n_threads = eval_opts.threads;
	ep.max_running = 1;
	ep.context_length = eval_opts.ctx < 16 ? 16 : eval_opts.ctx;	/* the engine's minimum */
	if (cai_engine_create(model, &ep, &engine, &err) != CAI_OK)
	{
		cli_report("could not create the engine", &err);
		goto done;
	}
	logits_q = malloc(sizeof(float) * (size_t) eval_opts.ctx * (size_t) info.n_vocab);
	logits_f = malloc(sizeof(float) * (size_t) eval_opts.ctx * (size_t) info.n_vocab);
	if (!logits_q || !logits_f)
	{
		cli_error("out of memory for %d x %d logits", eval_opts.ctx, info.n_vocab);
		goto done;
	}
	if (eval_opts.logits_out && !eval_dump_open(&dump, eval_opts.logits_out))
		goto done;

	for (int start = 0; start + 1 < n_eval; start += eval_opts.ctx)
	{
		int			n = n_eval - start < eval_opts.ctx ? n_eval - start : eval_opts.ctx;
		double		t0;

		if (n < 2)
			break;
		t0 = cli_now();
		if (cai_engine_score(engine, tokens.ids + start, n, false, logits_q, &err) != CAI_OK)
		{
			cli_report("int8 scoring failed", &err);
			goto done;
		}
		totals.seconds_int8 += cli_now() - t0;
		t0 = cli_now();
		if (cai_engine_score(engine, tokens.ids + start, n, true, logits_f, &err) != CAI_OK)
		{
			cli_report("float reference scoring failed", &err);
			goto done;
		}
		totals.seconds_float += cli_now() - t0;
		if (eval_opts.logits_out &&
			!eval_dump_window(&dump, eval_opts.logits_out, tokens.ids + start, n, logits_q,
							  logits_f, info.n_vocab))
			goto done;
		accumulate_window(tokens.ids + start, n, logits_q, logits_f, info.n_vocab, &totals);
		n_windows++;
		if (!eval_opts.json_only)
			fprintf(stderr, "  window %d: %d tokens, running perplexity int8 %.4f float %.4f\n",
					n_windows, n, exp(totals.nll_int8 / totals.positions),
					exp(totals.nll_float / totals.positions));
	}

	if (!eval_dump_close(&dump, eval_opts.logits_out))
		goto done;

	{
		double		ppl_q = exp(totals.nll_int8 / totals.positions);
		double		ppl_f = exp(totals.nll_float / totals.positions);
		double		agree = (double) totals.top1_agree / totals.positions;
		double		mean_kl = totals.kl / totals.positions;
		long		scored_tokens = totals.positions + n_windows;

		printf("{\n  \"model\": ");
		json_write_string(stdout, eval_opts.model);
		printf(",\n  \"file\": ");
		json_write_string(stdout, positional[0]);
		/* the numerics as decided at load (auto resolved) */
		printf(",\n  \"weights\": \"%s\",\n  \"weight_rounding\": \"%s\",\n"
			   "  \"activation_precision\": \"%s\"", info.file_weights ? "file" : "int8",
			   info.gptq_rounding ? "gptq" : "nearest",
			   info.two_digit_activations ? "two_digit" :
			   info.superblock_activations ? "int8_256" : "int8");
		printf(",\n  \"tokens\": %d,\n  \"ctx\": %d,\n  \"windows\": %d,\n  \"positions\": %ld,\n",
			   n_eval, eval_opts.ctx, n_windows, totals.positions);
		printf("  \"perplexity_int8\": %.6f,\n  \"perplexity_float\": %.6f,\n", ppl_q, ppl_f);
		printf("  \"top1_agreement\": %.6f,\n  \"mean_kl_float_int8\": %.8f,\n", agree, mean_kl);
		printf("  \"score_tokens_per_second_int8\": %.2f,\n"
			   "  \"score_tokens_per_second_float\": %.2f\n}\n",
			   scored_tokens / totals.seconds_int8, scored_tokens / totals.seconds_float);
		fflush(stdout);
		if (!eval_opts.json_only)
			fprintf(stderr, "%s: %ld positions in %d windows of %d: perplexity int8 %.4f, "
					"float %.4f (%+.2f%%); top-1 agreement %.2f%%; mean KL(float||int8) %.5f\n",
					positional[0], totals.positions, n_windows, eval_opts.ctx, ppl_q, ppl_f,
					100.0 * (ppl_q / ppl_f - 1.0), 100.0 * agree, mean_kl);
	}
	rc = CLI_EXIT_OK;

done:
	eval_dump_close(&dump, eval_opts.logits_out);
	free(text);
	free(logits_q);
	free(logits_f);
	cli_tokens_free(&tokens);
	if (engine)
		cai_engine_free(engine);
	if (model)
		cai_model_free(model);
	return rc;
}
