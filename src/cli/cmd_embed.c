/*
 * cmd_embed.c — `cai embed`: embeddings of texts, one vector per text.
 *
 * The texts are the -p options, or the lines of FILE ("-": stdin; empty lines skipped).  They
 * go through the engine batched, as the engine process runs cai_embed's: every text an embed
 * request, many per step.  --float computes each alone on the float reference path instead
 * (for comparisons with other engines).  Each text is raw text, BOS first when the model asks
 * for it, as `cai run` tokenizes a prompt.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static struct
{
	const char *model;
	cli_string_list prompts;
	bool		json;
	bool		float_reference;
	int			threads;
	int			batch;
	int			step_tokens;
	cli_numerics numerics;
	bool		verbose;
} embed_opts;

static const cli_option embed_options[] = {
	CLI_MODEL_OPTION(embed_opts),
	{
		.name = "prompt",
		.short_name = 'p',
		.kind = CLI_OPT_STRING_LIST,
		.target = &embed_opts.prompts,
		.metavar = "TEXT",
		.help = "a text to embed (repeatable, up to 16); or give FILE",
	},
	{
		.name = "json",
		.kind = CLI_OPT_FLAG,
		.target = &embed_opts.json,
		.help = "print one JSON array of vectors instead of a line of numbers per text",
	},
	{
		.name = "float",
		.kind = CLI_OPT_FLAG,
		.target = &embed_opts.float_reference,
		.help = "the float reference path, each text alone (slow; for comparisons)",
	},
	CLI_THREADS_OPTION(embed_opts),
	{
		.name = "batch",
		.short_name = 'b',
		.kind = CLI_OPT_INT,
		.target = &embed_opts.batch,
		.metavar = "N",
		.help = "texts in one engine step at most (default 32)",
		.min = 1,
		.max = 1024,
	},
	{
		.name = "step-tokens",
		.kind = CLI_OPT_INT,
		.target = &embed_opts.step_tokens,
		.metavar = "N",
		.help = "tokens in one engine step at most, the longest text allowed (default 2048)",
		.min = 16,
		.max = 1 << 16,
	},
	CLI_NUMERICS_OPTIONS(embed_opts),
	{
		.name = "verbose",
		.short_name = 'v',
		.kind = CLI_OPT_FLAG,
		.target = &embed_opts.verbose,
		.help = "print texts, tokens and the embedding time to stderr",
	},
};

const cli_command cli_embed_command = {
	.name = "embed",
	.synopsis = "-m MODEL (-p TEXT ... | FILE) [options]",
	.summary = "embed texts: one L2-normalized vector per text",
	.description =
	"Prints the embedding of each text: the model's final hidden states pooled as its GGUF says\n"
	"(mean when it names no pooling) and L2-normalized, one line of numbers per text (or one\n"
	"JSON array with --json).  The texts are the -p options, or the lines of FILE (- for stdin).",
	.options = embed_options,
	.n_options = sizeof(embed_options) / sizeof(embed_options[0]),
	.positional = "FILE",
	.min_positional = 0,
	.max_positional = 1,
};

/* The texts: the -p options, or FILE's non-empty lines (pointing into *buffer). */
static bool
collect_texts(const char *file, char **buffer, const char ***texts, int *n_texts)
{
	int			cap = 16;
	char	   *line;

	*texts = malloc(sizeof(char *) * (size_t) cap);
	if (!*texts)
		return false;
	*n_texts = 0;
	if (!file)
	{
		for (int i = 0; i < embed_opts.prompts.n; i++)
			(*texts)[(*n_texts)++] = embed_opts.prompts.items[i];
		return true;
	}
	if (!(*buffer = cli_read_file(file, NULL)))
		return false;
	for (line = strtok(*buffer, "\n"); line; line = strtok(NULL, "\n"))
	{
		if (line[0] == '\0')
			continue;
		if (*n_texts == cap)
		{
			const char **grown = realloc(*texts, sizeof(char *) * (size_t) cap * 2);

			if (!grown)
				return false;
			*texts = grown;
			cap *= 2;
		}
		(*texts)[(*n_texts)++] = line;
	}
	return true;
}

/* Submits every text as an embed request and steps the engine until all are in out[i * d]. */
static int
embed_batched(cai_engine *engine, const cli_tokens *ids, int n_texts, int d, float *out)
{
	int			done = 0;
	int			next = 0;
	cai_error	err = {0};

	while (done < n_texts)
	{
		const cai_event *events;
		int			n_events;

		/* keep a step's worth of texts waiting beside the running ones */
		for (;;)
		{
			cai_engine_stats st;
			cai_request_params rp;
			uint64_t	id;

			cai_engine_get_stats(engine, &st);
			if (next >= n_texts || st.waiting >= embed_opts.batch)
				break;
			memset(&rp, 0, sizeof(rp));
			rp.prompt = ids[next].ids;
			rp.n_prompt = ids[next].n;
			rp.embed = true;
			rp.user_data = (void *) (intptr_t) next;
			cai_sampling_params_default(&rp.sampling);
			if (cai_engine_submit(engine, &rp, &id, &err) != CAI_OK)
			{
				fprintf(stderr, "cai: could not embed text %d: %s\n", next + 1, err.message);
				return CLI_EXIT_ERROR;
			}
			next++;
		}
		if (cai_engine_step(engine, &events, &n_events, &err) != CAI_OK)
			return cli_report("the engine step failed", &err);
		for (int i = 0; i < n_events; i++)
		{
			int			t = (int) (intptr_t) events[i].user_data;

			if (events[i].finish == CAI_FINISH_NONE)
				continue;
			if (!events[i].embedding)
			{
				fprintf(stderr, "cai: text %d: %s\n", t + 1,
						events[i].error ? events[i].error : "no embedding");
				return CLI_EXIT_ERROR;
			}
			memcpy(out + (size_t) t * d, events[i].embedding, sizeof(float) * (size_t) d);
			done++;
		}
	}
	return CLI_EXIT_OK;
}

static void
print_vectors(const float *v, int n_texts, int d)
{
	if (embed_opts.json)
		fputc('[', stdout);
	for (int t = 0; t < n_texts; t++)
	{
		if (embed_opts.json)
			fputs(t > 0 ? ",\n[" : "[", stdout);
		for (int j = 0; j < d; j++)
			printf(embed_opts.json ? (j > 0 ? ",%.9g" : "%.9g") : (j > 0 ? " %.9g" : "%.9g"),
				   v[(size_t) t * d + j]);
		fputs(embed_opts.json ? "]" : "\n", stdout);
	}
	if (embed_opts.json)
		fputs("]\n", stdout);
}

int
cmd_embed(int argc, char **argv)
{
	char	   *positional[1];
	int			n_positional;
	int			rc;
	char	   *buffer = NULL;
	const char **texts = NULL;
	int			n_texts = 0;
	cli_tokens *ids = NULL;
	float	   *vectors = NULL;
	cai_model  *model = NULL;
	cai_engine *engine = NULL;
	cai_engine_params ep;
	cai_model_info info;
	cai_error	err = {0};
	long		n_tokens = 0;
	double		t0;

	memset(&embed_opts, 0, sizeof(embed_opts));
	embed_opts.batch = 32;
	embed_opts.step_tokens = 2048;
	rc = cli_parse(&cli_embed_command, argc, argv, positional, &n_positional);
	if (rc != CLI_EXIT_OK)
		return rc < 0 ? CLI_EXIT_OK : rc;
	if (!embed_opts.model)
		return cli_usage_error(&cli_embed_command, "missing -m MODEL");
	if ((embed_opts.prompts.n > 0) == (n_positional > 0))
		return cli_usage_error(&cli_embed_command, "give -p TEXT or a FILE of lines, not %s",
							   n_positional > 0 ? "both" : "neither");

	rc = CLI_EXIT_ERROR;
	if (!collect_texts(n_positional > 0 ? positional[0] : NULL, &buffer, &texts, &n_texts))
	{
		cli_error("out of memory reading the texts");
		goto done;
	}
	if (n_texts == 0)
	{
		cli_error("no text to embed");
		goto done;
	}
	model = cli_load_model(embed_opts.model, embed_opts.threads, embed_opts.float_reference,
						   &embed_opts.numerics);
	if (!model)
		goto done;
	cai_model_get_info(model, &info);
	ids = calloc((size_t) n_texts, sizeof(cli_tokens));
	vectors = malloc(sizeof(float) * (size_t) n_texts * (size_t) info.d_model);
	if (!ids || !vectors)
	{
		cli_error("out of memory");
		goto done;
	}
	for (int t = 0; t < n_texts; t++)
	{
		if (!cli_tokenize_raw(model, texts[t], &ids[t]))
			goto done;
		if (ids[t].n == 0)
		{
			cli_error("text %d is empty", t + 1);
			goto done;
		}
		n_tokens += ids[t].n;
	}

	cai_engine_params_default(&ep);
	ep.n_threads = embed_opts.threads;
	ep.max_running = embed_opts.batch;
	ep.max_step_tokens = embed_opts.step_tokens;
	ep.max_queue = 2 * embed_opts.batch;
	if (cai_engine_create(model, &ep, &engine, &err) != CAI_OK)
	{
		cli_report("could not create the engine", &err);
		goto done;
	}
	if (!embed_opts.float_reference)
		cai_model_release_gemm_sources(model);

	t0 = cli_now();
	if (embed_opts.float_reference)
	{
		rc = CLI_EXIT_OK;
		for (int t = 0; t < n_texts && rc == CLI_EXIT_OK; t++)
			if (cai_engine_embed(engine, ids[t].ids, ids[t].n, true,
								 vectors + (size_t) t * info.d_model, &err) != CAI_OK)
				rc = cli_report("could not embed the text", &err);
	}
	else
		rc = embed_batched(engine, ids, n_texts, info.d_model, vectors);
	if (rc != CLI_EXIT_OK)
		goto done;
	if (embed_opts.verbose)
	{
		double		s = cli_now() - t0;

		fprintf(stderr, "[%s] %d texts, %ld tokens, %d dimensions (%s pooling%s) in %.3f s: "
				"%.1f texts/s, %.0f tokens/s\n", cai_engine_device(engine), n_texts, n_tokens,
				info.d_model, cai_pooling_name(info.pooling), info.causal ? "" : ", both ways",
				s, s > 0 ? n_texts / s : 0.0, s > 0 ? n_tokens / s : 0.0);
	}
	print_vectors(vectors, n_texts, info.d_model);
	fflush(stdout);

done:
	if (ids)
		for (int t = 0; t < n_texts; t++)
			cli_tokens_free(&ids[t]);
	free(ids);
	free(vectors);
	free(texts);
	free(buffer);
	if (engine)
		cai_engine_free(engine);
	if (model)
		cai_model_free(model);
	return rc;
}
