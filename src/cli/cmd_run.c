/*
 * cmd_run.c — `cai run`: one completion, streamed to stdout.
 *
 * Without --chat the prompt is raw text (special-token text stays plain text; BOS first when the
 * model asks for it).  With --chat it is rendered through the model's chat template as one user
 * turn, after the --system message if given, ending with the assistant header.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "json_string.h"

static struct
{
	const char *model;
	const char *prompt;
	bool		chat;
	const char *system;
	int			max_tokens;
	float		temperature;
	float		top_p;
	int			top_k;
	uint64_t	seed;
	cli_penalties pen;
	int			threads;
	int			ctx;
	cli_string_list stop;
	bool		ignore_eos;
	cli_numerics numerics;
	bool		verbose;
	const char *json_schema;
	bool		json_object;
	bool		json_free_ws;
	bool		logprobs;
	int			top_logprobs;
	const char *tools;
	const char *tool_choice;
	int			samples;
} run_opts;

static const cli_option run_options[] = {
	CLI_MODEL_OPTION(run_opts),
	{
		.name = "prompt",
		.short_name = 'p',
		.kind = CLI_OPT_STRING,
		.target = &run_opts.prompt,
		.metavar = "PROMPT",
		.help = "the prompt text, or - to read it from stdin (required)",
	},
	{
		.name = "chat",
		.kind = CLI_OPT_FLAG,
		.target = &run_opts.chat,
		.help = "render the prompt as a user turn through the chat template",
	},
	{
		.name = "system",
		.kind = CLI_OPT_STRING,
		.target = &run_opts.system,
		.metavar = "TEXT",
		.help = "system message (with --chat)",
	},
	{
		.name = "max-tokens",
		.short_name = 'n',
		.kind = CLI_OPT_INT,
		.target = &run_opts.max_tokens,
		.metavar = "N",
		.help = "completion tokens at most (default 256)",
		.min = 1,
		.max = CAI_MAX_TOKENS_MAX,
	},
	CLI_SAMPLING_OPTIONS(run_opts),
	CLI_PENALTY_OPTIONS(run_opts),
	CLI_THREADS_OPTION(run_opts),
	{
		.name = "ctx",
		.short_name = 'c',
		.kind = CLI_OPT_INT,
		.target = &run_opts.ctx,
		.metavar = "N",
		.help = "context length; 0 = the model's, capped at 4096",
		.min = 0,
		.max = 1 << 20,
	},
	{
		.name = "stop",
		.kind = CLI_OPT_STRING_LIST,
		.target = &run_opts.stop,
		.metavar = "STR",
		.help = "stop when the reply contains STR (repeatable, up to 8)",
		.max_items = CAI_MAX_STOP_STRINGS,
		.max_len = CAI_STOP_MAX_BYTES,
	},
	{
		.name = "ignore-eos",
		.kind = CLI_OPT_FLAG,
		.target = &run_opts.ignore_eos,
		.help = "keep generating past end-of-turn, up to --max-tokens",
	},
	{
		.name = "samples",
		.kind = CLI_OPT_INT,
		.target = &run_opts.samples,
		.metavar = "N",
		.help = "N samples of the prompt (OpenAI's n), sample i seeded with --seed + i, "
		"printed one after another, each under a label (default 1)",
		.min = 1,
		.max = CAI_N_SAMPLES_MAX,
	},
	CLI_NUMERICS_OPTIONS(run_opts),
	CLI_JSON_OPTIONS(run_opts),
	{
		.name = "logprobs",
		.kind = CLI_OPT_FLAG,
		.target = &run_opts.logprobs,
		.help = "write each generated token's logprob to stderr, a JSON line per token",
	},
	{
		.name = "top-logprobs",
		.kind = CLI_OPT_INT,
		.target = &run_opts.top_logprobs,
		.metavar = "N",
		.help = "with --logprobs: also the N likeliest tokens at each step (0-20, default 0)",
		.min = 0,
		.max = CAI_TOP_LOGPROBS_MAX,
	},
	{
		.name = "tools",
		.kind = CLI_OPT_STRING,
		.target = &run_opts.tools,
		.metavar = "FILE",
		.help = "with --chat: offer the functions of FILE (OpenAI's tools array); prints the reply as JSON",
	},
	{
		.name = "tool-choice",
		.kind = CLI_OPT_STRING,
		.target = &run_opts.tool_choice,
		.metavar = "CHOICE",
		.help = "with --tools: auto (default), none, required, or a function's name to force",
	},
	{
		.name = "verbose",
		.short_name = 'v',
		.kind = CLI_OPT_FLAG,
		.target = &run_opts.verbose,
		.help = "print the prompt as tokenized, and token counts and speed at the end, to stderr",
	},
};

const cli_command cli_run_command = {
	.name = "run",
	.synopsis = "-m MODEL -p PROMPT [options]",
	.summary = "generate one completion for a prompt",
	.description =
	"Generates a completion for PROMPT and streams it to stdout.  Without --chat the prompt is\n"
	"raw text; with --chat it becomes a user turn in the model's chat template.",
	.options = run_options,
	.n_options = sizeof(run_options) / sizeof(run_options[0]),
};

/* A sample's text as it comes */
typedef struct sample_text
{
	char	   *data;
	size_t		len;
	size_t		cap;
} sample_text;

static bool
sample_text_append(sample_text *t, const char *bytes, size_t len)
{
	if (t->len + len + 1 > t->cap)
	{
		size_t		cap = (t->len + len + 1) * 2;
		char	   *data = realloc(t->data, cap);

		if (!data)
			return false;
		t->data = data;
		t->cap = cap;
	}
	memcpy(t->data + t->len, bytes, len);
	t->len += len;
	t->data[t->len] = '\0';
	return true;
}

/*
 * Runs a request of several samples to its end and prints each one's text under a label
 * ("[sample 0]"), in order.  Their tokens come interleaved, step by step, so nothing streams.
 */
static int
run_samples(cai_engine *engine, const cai_request_params *rp)
{
	int			n = rp->sampling.n_samples;
	sample_text text[CAI_N_SAMPLES_MAX];
	cai_finish_reason finish[CAI_N_SAMPLES_MAX];
	int			n_tokens[CAI_N_SAMPLES_MAX];
	int			done = 0;
	int			rc = CLI_EXIT_OK;
	uint64_t	id;
	cai_error	err = {0};
	double		start = cli_now();

	memset(text, 0, sizeof(text));
	memset(n_tokens, 0, sizeof(n_tokens));
	if (cai_engine_submit(engine, rp, &id, &err) != CAI_OK)
		return cli_report("could not submit the request", &err);
	while (done < n && rc == CLI_EXIT_OK)
	{
		const cai_event *events;
		int			n_events;

		if (cli_interrupted())
		{
			cai_engine_cancel(engine, id);
			fprintf(stderr, "cai: interrupted\n");
			rc = CLI_EXIT_ERROR;
			break;
		}
		if (cai_engine_step(engine, &events, &n_events, &err) != CAI_OK)
			rc = cli_report("engine step failed", &err);
		for (int i = 0; i < n_events && rc == CLI_EXIT_OK; i++)
		{
			const cai_event *ev = &events[i];

			n_tokens[ev->sample] += ev->token >= 0;
			if (!sample_text_append(&text[ev->sample], ev->text, ev->text_len))
				rc = cli_error("out of memory collecting the samples");
			if (ev->finish == CAI_FINISH_ERROR)
				rc = cli_error("generation failed: %s", ev->error ? ev->error : "unknown error");
			else if (ev->finish != CAI_FINISH_NONE)
			{
				finish[ev->sample] = ev->finish;
				done++;
			}
		}
	}
	for (int i = 0; i < n && rc == CLI_EXIT_OK; i++)
	{
		printf("[sample %d]\n%.*s", i, (int) text[i].len, text[i].data ? text[i].data : "");
		if (text[i].len == 0 || text[i].data[text[i].len - 1] != '\n')
			putchar('\n');
		if (run_opts.verbose)
			fprintf(stderr, "[sample %d] %d tokens (%s)\n", i, n_tokens[i],
					finish[i] == CAI_FINISH_STOP ? "stop" : "length");
	}
	fflush(stdout);
	if (rc == CLI_EXIT_OK && run_opts.verbose)
	{
		int			total = 0;

		for (int i = 0; i < n; i++)
			total += n_tokens[i];
		fprintf(stderr, "[%s] %d samples, %d tokens in all, %.1f tokens/s in all\n",
				cai_engine_device(engine), n, total, total / (cli_now() - start));
	}
	for (int i = 0; i < n; i++)
		free(text[i].data);
	return rc;
}

/* Builds the prompt ids: raw text, or one chat turn (after an optional system message). */
static bool
build_run_prompt(const cai_model *model, const char *prompt, const cai_tool_set *tools,
				 cli_tokens *ids)
{
	cai_chat_message messages[2];
	int			n_messages = 0;
	cai_prompt_params pp;
	cai_prompt	built;
	cai_error	err = {0};
	bool		ok;

	if (!run_opts.chat)
		return cli_tokenize_raw(model, prompt, ids);

	memset(messages, 0, sizeof(messages));
	if (run_opts.system)
	{
		messages[n_messages].role = CAI_ROLE_SYSTEM;
		messages[n_messages++].content = run_opts.system;
	}
	messages[n_messages].role = CAI_ROLE_USER;
	messages[n_messages++].content = prompt;
	memset(&pp, 0, sizeof(pp));
	pp.add_generation_prompt = true;
	pp.tools = tools;
	memset(&built, 0, sizeof(built));
	if (cai_chat_build_prompt(model, messages, n_messages, &pp, &built, &err) != CAI_OK)
	{
		cli_report("could not build the chat prompt", &err);
		return false;
	}
	ok = cli_tokens_append(ids, built.ids, built.n_ids);
	cai_prompt_free(&built);
	if (!ok)
		cli_error("out of memory building the prompt");
	return ok;
}

/*
 * Reads --tools FILE (an OpenAI tools array) and --tool-choice; false after a usage message
 * that names the option.
 */
static bool
load_tools(cai_tool_set **tools, cai_tool_choice *choice)
{
	size_t		len = 0;
	char	   *json = cli_read_file(run_opts.tools, &len);
	cai_error	err = {0};
	const char *c = run_opts.tool_choice ? run_opts.tool_choice : "auto";

	if (!json)
		return false;
	if (cai_tool_set_parse(json, len, tools, &err) != CAI_OK)
	{
		free(json);
		cli_usage_error(&cli_run_command, "--tools: %s", err.message);
		return false;
	}
	free(json);
	if (cai_tool_set_count(*tools) == 0)
	{
		cli_usage_error(&cli_run_command, "--tools: the array declares no function");
		return false;
	}
	if (strcmp(c, "none") == 0)
		*choice = CAI_TOOL_CHOICE_NONE;
	else if (strcmp(c, "auto") == 0)
		*choice = CAI_TOOL_CHOICE_AUTO;
	else if (strcmp(c, "required") == 0)
		*choice = CAI_TOOL_CHOICE_REQUIRED;
	else if (cai_tool_set_find(*tools, c) >= 0)
		*choice = CAI_TOOL_CHOICE_NAMED;
	else
	{
		cli_usage_error(&cli_run_command, "--tool-choice must be none, auto, required or a "
						"function of --tools, got \"%s\"", c);
		return false;
	}
	return true;
}

/*
 * Prints a reply made with --tools as one JSON line: {"tool_call": {"name": ..., "arguments":
 * {...}}} when the reply is a call of a declared function, else {"content": "..."}, with the
 * finish reason ("tool_calls", "stop" or "length").
 */
static int
print_tool_reply(const char *text, size_t len, const cli_generation *gen,
				 const cai_tool_set *tools)
{
	char	   *name = NULL;
	char	   *arguments = NULL;
	cai_error	err = {0};

	if (gen->finish == CAI_FINISH_STOP &&
		cai_tool_reply_parse(text, len, &name, &arguments, &err) == CAI_OK &&
		cai_tool_set_find(tools, name) >= 0)
	{
		fputs("{\"tool_call\": {\"name\": ", stdout);
		json_write_string(stdout, name);
		fprintf(stdout, ", \"arguments\": %s}, \"finish_reason\": \"tool_calls\"}\n", arguments);
	}
	else
	{
		fputs("{\"content\": ", stdout);
		json_write_string(stdout, text);
		fprintf(stdout, ", \"finish_reason\": \"%s\"}\n",
				gen->finish == CAI_FINISH_STOP ? "stop" : "length");
	}
	cai_free(name);
	cai_free(arguments);
	return CLI_EXIT_OK;
}

int
cmd_run(int argc, char **argv)
{
	char	   *positional[1];
	int			n_positional;
	int			rc;
	char	   *stdin_prompt = NULL;
	const char *prompt;
	cai_model  *model = NULL;
	cai_engine *engine = NULL;
	bool		cache_pending = false;
	cai_engine_params ep;
	cai_request_params rp;
	cai_error	err = {0};
	cli_tokens	ids = {0};
	cli_generation gen;
	cai_tool_set *tools = NULL;
	cai_tool_choice tool_choice = CAI_TOOL_CHOICE_NONE;
	FILE	   *reply = NULL;
	char	   *reply_text = NULL;
	size_t		reply_len = 0;

	memset(&run_opts, 0, sizeof(run_opts));
	run_opts.max_tokens = 256;
	run_opts.samples = 1;
	run_opts.top_p = 1.0f;
	cli_penalties_default(&run_opts.pen);
	rc = cli_parse(&cli_run_command, argc, argv, positional, &n_positional);
	if (rc != CLI_EXIT_OK)
		return rc < 0 ? CLI_EXIT_OK : rc;
	if (!run_opts.model)
		return cli_usage_error(&cli_run_command, "missing -m MODEL");
	if (!run_opts.prompt)
		return cli_usage_error(&cli_run_command, "missing -p PROMPT");
	if (run_opts.system && !run_opts.chat)
		return cli_usage_error(&cli_run_command, "--system needs --chat");
	if (run_opts.json_schema && run_opts.json_object)
		return cli_usage_error(&cli_run_command, "give --json-schema or --json-object, not both");
	if (run_opts.top_logprobs > 0 && !run_opts.logprobs)
		return cli_usage_error(&cli_run_command, "--top-logprobs needs --logprobs");
	if (run_opts.tools && !run_opts.chat)
		return cli_usage_error(&cli_run_command, "--tools needs --chat");
	if (run_opts.tool_choice && !run_opts.tools)
		return cli_usage_error(&cli_run_command, "--tool-choice needs --tools");
	if (run_opts.tools && (run_opts.json_schema || run_opts.json_object))
		return cli_usage_error(&cli_run_command, "give --tools or a JSON reply option, not both");
	if (run_opts.samples > 1 && (run_opts.tools || run_opts.logprobs))
		return cli_usage_error(&cli_run_command, "--samples above 1 takes neither --tools nor --logprobs");
	if (run_opts.tools && !load_tools(&tools, &tool_choice))
		return CLI_EXIT_USAGE;
	{
		cai_sampling_params check;

		/* a bad --logit-bias pair is a usage error before the model loads */
		cai_sampling_params_default(&check);
		if (!cli_penalties_apply(&cli_run_command, &run_opts.pen, &check))
			return CLI_EXIT_USAGE;
	}

	prompt = run_opts.prompt;
	if (strcmp(prompt, "-") == 0)
	{
		stdin_prompt = cli_read_file("-", NULL);
		if (!stdin_prompt)
			return CLI_EXIT_ERROR;
		prompt = stdin_prompt;
	}

	memset(&gen, 0, sizeof(gen));
	rc = CLI_EXIT_ERROR;
	model = cli_load_model(run_opts.model, run_opts.threads, false, &run_opts.numerics);
	if (!model)
		goto done;
	if (!build_run_prompt(model, prompt, tools, &ids))
		goto done;
	if (ids.n == 0)
	{
		cli_error("the prompt is empty");
		goto done;
	}

	if (run_opts.verbose)
	{
		char	   *shown = NULL;
		size_t		shown_len = 0;

		if (cai_detokenize(model, ids.ids, ids.n, &shown, &shown_len, &err) == CAI_OK)
			fprintf(stderr, "[prompt, %d tokens]\n%s\n[end of prompt]\n", ids.n, shown);
		cai_free(shown);
	}

	cai_engine_params_default(&ep);
	ep.n_threads = run_opts.threads;
	ep.max_running = run_opts.samples;
	ep.context_length = run_opts.ctx;
	if (cai_engine_create(model, &ep, &engine, &err) != CAI_OK)
	{
		cli_report("could not create the engine", &err);
		goto done;
	}
	/* the engine's backend holds its own copy of the int8 matrices now */
	cai_model_release_gemm_sources(model);
	cache_pending = cli_report_weights_cache(model, "cai");

	memset(&rp, 0, sizeof(rp));
	rp.prompt = ids.ids;
	rp.n_prompt = ids.n;
	cai_sampling_params_default(&rp.sampling);
	rp.sampling.temperature = run_opts.temperature;
	rp.sampling.top_p = run_opts.top_p;
	rp.sampling.top_k = run_opts.top_k;
	rp.sampling.seed = run_opts.seed;
	rp.sampling.max_tokens = run_opts.max_tokens;
	rp.sampling.ignore_eos = run_opts.ignore_eos;
	(void) cli_penalties_apply(&cli_run_command, &run_opts.pen, &rp.sampling);
	rp.sampling.n_stop = run_opts.stop.n;
	for (int i = 0; i < run_opts.stop.n; i++)
		rp.sampling.stop[i] = run_opts.stop.items[i];
	rp.sampling.logprobs = run_opts.logprobs;
	rp.sampling.top_logprobs = run_opts.top_logprobs;
	rp.use_cache = false;
	rp.tools = tools;
	rp.tool_choice = tool_choice;
	rp.tool_name = tool_choice == CAI_TOOL_CHOICE_NAMED ? run_opts.tool_choice : NULL;
	if (!cli_load_grammar(run_opts.json_schema, run_opts.json_object, run_opts.json_free_ws,
						  &rp.grammar))
		goto done;

	rp.sampling.n_samples = run_opts.samples;

	cli_install_interrupt_handler();
	if (run_opts.samples > 1)
	{
		rc = run_samples(engine, &rp);
		goto done;
	}
	gen.logprobs_out = run_opts.logprobs ? stderr : NULL;
	gen.model = model;
	/* with tools the reply is printed whole, as JSON, once it is known to be a call or not */
	if (tools && !(reply = open_memstream(&reply_text, &reply_len)))
	{
		cli_error("out of memory");
		goto done;
	}
	rc = cli_generate(engine, &rp, tools ? reply : stdout, &gen);
	if (reply)
		fclose(reply);
	if (tools && rc == CLI_EXIT_OK && !gen.cancelled)
		rc = print_tool_reply(reply_text, reply_len, &gen, tools);
	else if (gen.text_bytes > 0 && !gen.ends_with_newline)
		fputc('\n', stdout);
	fflush(stdout);
	if (rc == CLI_EXIT_OK && gen.cancelled)
	{
		fprintf(stderr, "cai: interrupted\n");
		rc = CLI_EXIT_ERROR;
	}
	if (rc == CLI_EXIT_OK && run_opts.verbose)
	{
		int			n = gen.usage.completion_tokens;

		fprintf(stderr, "[%s] prompt %d tokens, completion %d tokens (%s), first token %.0f ms, "
				"%.1f tokens/s\n", cai_engine_device(engine), gen.usage.prompt_tokens, n,
				gen.finish == CAI_FINISH_STOP ? "stop" : "length", gen.usage.ttft_ms,
				n > 1 && gen.decode_seconds > 0 ? (n - 1) / gen.decode_seconds : 0.0);
	}

done:
	cli_tokens_free(&ids);
	cli_tokens_free(&gen.tokens);
	if (engine)
		cai_engine_free(engine);
	if (model && cache_pending)
		cli_report_weights_cache_end(model, "cai");
	if (model)
		cai_model_free(model);
	free(stdin_prompt);
	cai_tool_set_free(tools);
	free(reply_text);
	return rc;
}
