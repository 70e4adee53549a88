/*
 * cmd_chat.c — `cai chat`: an interactive multi-turn conversation on stdin/stdout.
 *
 * The conversation is kept the way pg_cai keeps it: every turn with its token ids, the
 * assistant's being the ids the model generated (re-tokenizing a reply's text can give other ids,
 * and the next turn would then miss the prefix cache from that point).  The engine's prefix cache
 * is on, so a follow-up turn computes only its new tokens; per-turn usage on stderr shows it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static struct
{
	const char *model;
	const char *system;
	int			max_tokens;
	float		temperature;
	float		top_p;
	int			top_k;
	uint64_t	seed;
	cli_penalties pen;
	int			threads;
	int			ctx;
	int			cache_mb;
	bool		quiet;
} chat_opts;

static const cli_option chat_options[] = {
	CLI_MODEL_OPTION(chat_opts),
	{
		.name = "system",
		.kind = CLI_OPT_STRING,
		.target = &chat_opts.system,
		.metavar = "TEXT",
		.help = "system message",
	},
	{
		.name = "max-tokens",
		.short_name = 'n',
		.kind = CLI_OPT_INT,
		.target = &chat_opts.max_tokens,
		.metavar = "N",
		.help = "reply tokens at most per turn (default 256)",
		.min = 1,
		.max = CAI_MAX_TOKENS_MAX,
	},
	CLI_SAMPLING_OPTIONS(chat_opts),
	CLI_PENALTY_OPTIONS(chat_opts),
	CLI_THREADS_OPTION(chat_opts),
	{
		.name = "ctx",
		.short_name = 'c',
		.kind = CLI_OPT_INT,
		.target = &chat_opts.ctx,
		.metavar = "N",
		.help = "context length; 0 = the model's, capped at 4096 (oldest turns are dropped to fit)",
		.min = 0,
		.max = 1 << 20,
	},
	{
		.name = "cache-mb",
		.kind = CLI_OPT_INT,
		.target = &chat_opts.cache_mb,
		.metavar = "MB",
		.help = "prefix cache budget in MiB; 0 = off (default 256)",
		.min = 0,
		.max = 1 << 20,
	},
	{
		.name = "quiet",
		.short_name = 'q',
		.kind = CLI_OPT_FLAG,
		.target = &chat_opts.quiet,
		.help = "no per-turn usage line on stderr",
	},
};

const cli_command cli_chat_command = {
	.name = "chat",
	.synopsis = "-m MODEL [options]",
	.summary = "chat interactively (multi-turn, with the prefix cache)",
	.description =
	"Reads one user message per line from stdin and streams each reply to stdout.  Lines\n"
	"starting with / are commands: /reset forgets the conversation, /quit ends it (so does\n"
	"end of input).  Ctrl-C interrupts a reply; at the prompt it quits.  After each reply a\n"
	"usage line on stderr shows prompt, cached and completion tokens and the decode speed.",
	.options = chat_options,
	.n_options = sizeof(chat_options) / sizeof(chat_options[0]),
};

/* One turn of the conversation, owning its text and ids. */
typedef struct chat_turn
{
	cai_role	role;
	char	   *content;		/* NULL for assistant turns (their ids are authoritative) */
	int32_t    *tokens;			/* NULL = tokenize content */
	int			n_tokens;
} chat_turn;

typedef struct conversation
{
	chat_turn  *turns;
	int			n;
	int			cap;
} conversation;

static void
turn_free(chat_turn *t)
{
	free(t->content);
	free(t->tokens);
	memset(t, 0, sizeof(*t));
}

static chat_turn *
conversation_push(conversation *c, cai_role role)
{
	chat_turn  *t;

	if (c->n == c->cap)
	{
		int			cap = c->cap ? c->cap * 2 : 16;
		chat_turn  *grown = realloc(c->turns, sizeof(chat_turn) * (size_t) cap);

		if (!grown)
			return NULL;
		c->turns = grown;
		c->cap = cap;
	}
	t = &c->turns[c->n++];
	memset(t, 0, sizeof(*t));
	t->role = role;
	return t;
}

/* Drops every turn from index `keep` on. */
static void
conversation_truncate(conversation *c, int keep)
{
	while (c->n > keep)
		turn_free(&c->turns[--c->n]);
}

static int32_t *
copy_ids(const int32_t *ids, int n)
{
	int32_t    *copy;

	if (n <= 0)
		return NULL;
	copy = malloc(sizeof(int32_t) * (size_t) n);
	if (copy)
		memcpy(copy, ids, sizeof(int32_t) * (size_t) n);
	return copy;
}

/* Renders the conversation into prompt ids (oldest turns dropped to leave room for a reply). */
static bool
build_chat_prompt(const cai_model *model, const conversation *c, int max_prompt_tokens,
				  cai_prompt *out)
{
	cai_chat_message *messages = calloc((size_t) c->n, sizeof(cai_chat_message));
	cai_prompt_params pp;
	cai_error	err = {0};
	cai_status	st;

	if (!messages)
	{
		cli_error("out of memory building the prompt");
		return false;
	}
	for (int i = 0; i < c->n; i++)
	{
		messages[i].role = c->turns[i].role;
		messages[i].content = c->turns[i].content;
		messages[i].tokens = c->turns[i].tokens;
		messages[i].n_tokens = c->turns[i].n_tokens;
	}
	memset(&pp, 0, sizeof(pp));
	pp.add_generation_prompt = true;
	pp.max_prompt_tokens = max_prompt_tokens;
	pp.truncate = true;
	memset(out, 0, sizeof(*out));
	st = cai_chat_build_prompt(model, messages, c->n, &pp, out, &err);
	free(messages);
	if (st != CAI_OK)
	{
		cli_report("could not build the chat prompt", &err);
		return false;
	}
	return true;
}

/* Strips a trailing newline (and carriage return) in place. */
static void
chomp(char *line)
{
	size_t		n = strlen(line);

	while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
		line[--n] = '\0';
}

/*
 * The sampling request of one turn.  The seed moves on with each completed turn, so that a
 * sampled conversation does not repeat its draws turn after turn.
 */
static void
chat_request(cai_request_params *rp, const cai_prompt *prompt, int turn_index)
{
	memset(rp, 0, sizeof(*rp));
	rp->prompt = prompt->ids;
	rp->n_prompt = prompt->n_ids;
	cai_sampling_params_default(&rp->sampling);
	rp->sampling.temperature = chat_opts.temperature;
	rp->sampling.top_p = chat_opts.top_p;
	rp->sampling.top_k = chat_opts.top_k;
	rp->sampling.seed = chat_opts.seed + (uint64_t) turn_index;
	rp->sampling.max_tokens = chat_opts.max_tokens;
	/* the pairs were checked once before the first turn */
	(void) cli_penalties_apply(&cli_chat_command, &chat_opts.pen, &rp->sampling);
	rp->use_cache = chat_opts.cache_mb > 0;
	rp->cache_salt = 0;
}

/*
 * Appends the reply as an assistant turn.  Its ids are kept without the end-of-turn token that
 * ended it: the template writes the turn's end itself when the conversation is rendered again.
 * False when out of memory.
 */
static bool
chat_store_reply(conversation *conv, const cli_generation *gen, const cai_model_info *info)
{
	int			n_reply = gen->tokens.n;
	chat_turn  *reply;

	if (n_reply > 0 && gen->finish == CAI_FINISH_STOP &&
		(gen->tokens.ids[n_reply - 1] == info->eot_token ||
		 gen->tokens.ids[n_reply - 1] == info->eos_token))
		n_reply--;
	reply = conversation_push(conv, CAI_ROLE_ASSISTANT);
	if (!reply)
		return false;
	reply->tokens = copy_ids(gen->tokens.ids, n_reply);
	reply->n_tokens = reply->tokens ? n_reply : 0;
	if (n_reply > 0 && !reply->tokens)
		return false;
	if (n_reply == 0)
		reply->content = strdup("");
	return true;
}

/*
 * One user turn: the line as the user's message, the reply streamed to stdout and kept in the
 * conversation.  A turn that does not complete (interrupted, or refused) is forgotten, as a
 * failed cai_chat() stores nothing, and the chat goes on.  CLI_EXIT_ERROR only when out of
 * memory, which ends the chat.
 */
static int
chat_one_turn(const cai_model *model, cai_engine *engine, const cai_model_info *info,
			  conversation *conv, int ctx, const char *line, int *turn_index)
{
	chat_turn  *user;
	cai_prompt	prompt;
	cai_request_params rp;
	cli_generation gen;
	int			turn_rc;
	bool		stored;

	user = conversation_push(conv, CAI_ROLE_USER);
	if (!user || !(user->content = strdup(line)))
	{
		cli_error("out of memory");
		return CLI_EXIT_ERROR;
	}
	if (!build_chat_prompt(model, conv, ctx - chat_opts.max_tokens, &prompt))
	{
		conversation_truncate(conv, conv->n - 1);
		return CLI_EXIT_OK;
	}
	/* keep the user turn's ids, as pg_cai stores them with the row */
	user->tokens = copy_ids(prompt.last_content_ids, prompt.n_last_content_ids);
	user->n_tokens = user->tokens ? prompt.n_last_content_ids : 0;

	chat_request(&rp, &prompt, *turn_index);
	memset(&gen, 0, sizeof(gen));
	turn_rc = cli_generate(engine, &rp, stdout, &gen);
	cai_prompt_free(&prompt);
	if (gen.text_bytes == 0 || !gen.ends_with_newline)
		fputc('\n', stdout);
	fflush(stdout);
	if (turn_rc != CLI_EXIT_OK || gen.cancelled)
	{
		if (gen.cancelled)
			fprintf(stderr, "(interrupted)\n");
		conversation_truncate(conv, conv->n - 1);
		cli_tokens_free(&gen.tokens);
		cli_clear_interrupt();
		return CLI_EXIT_OK;
	}

	stored = chat_store_reply(conv, &gen, info);
	cli_tokens_free(&gen.tokens);
	if (!stored)
	{
		cli_error("out of memory");
		return CLI_EXIT_ERROR;
	}
	(*turn_index)++;

	if (!chat_opts.quiet)
	{
		int			n = gen.usage.completion_tokens;

		fprintf(stderr, "[prompt %d tokens (%d cached), completion %d, first token %.0f ms, "
				"%.1f tokens/s]\n", gen.usage.prompt_tokens, gen.usage.cached_tokens, n,
				gen.usage.ttft_ms,
				n > 1 && gen.decode_seconds > 0 ? (n - 1) / gen.decode_seconds : 0.0);
	}
	return CLI_EXIT_OK;
}

typedef enum chat_line_kind
{
	CHAT_LINE_END,				/* end of input, or /quit */
	CHAT_LINE_DONE,				/* empty, or a command already carried out */
	CHAT_LINE_MESSAGE			/* a message for the model */
} chat_line_kind;

/*
 * Reads the next line (prompting when interactive) and carries out the commands: /quit and
 * /exit end the chat, /reset forgets all but the first n_fixed turns.
 */
static chat_line_kind
chat_read_line(char **line, size_t *line_cap, bool interactive, conversation *conv, int n_fixed)
{
	if (interactive)
	{
		fprintf(stderr, "> ");
		fflush(stderr);
	}
	errno = 0;
	if (getline(line, line_cap, stdin) < 0)
	{
		if (interactive)
			fputc('\n', stderr);
		return CHAT_LINE_END;	/* end of input, or Ctrl-C at the prompt */
	}
	chomp(*line);
	if ((*line)[0] == '\0')
		return CHAT_LINE_DONE;
	if (strcmp(*line, "/quit") == 0 || strcmp(*line, "/exit") == 0)
		return CHAT_LINE_END;
	if (strcmp(*line, "/reset") == 0)
	{
		conversation_truncate(conv, n_fixed);
		fprintf(stderr, "(conversation forgotten)\n");
		return CHAT_LINE_DONE;
	}
	if ((*line)[0] == '/')
	{
		fprintf(stderr, "commands: /reset, /quit\n");
		return CHAT_LINE_DONE;
	}
	return CHAT_LINE_MESSAGE;
}

int
cmd_chat(int argc, char **argv)
{
	char	   *positional[1];
	int			n_positional;
	int			rc;
	cai_model  *model = NULL;
	cai_engine *engine = NULL;
	cai_model_info info;
	cai_engine_params ep;
	cai_error	err = {0};
	conversation conv = {0};
	int			n_fixed;		/* turns /reset keeps: the system message */
	int			ctx;
	char	   *line = NULL;
	size_t		line_cap = 0;
	bool		interactive = isatty(STDIN_FILENO);
	int			turn_index = 0;
	chat_line_kind kind;

	memset(&chat_opts, 0, sizeof(chat_opts));
	chat_opts.max_tokens = 256;
	chat_opts.top_p = 1.0f;
	cli_penalties_default(&chat_opts.pen);
	chat_opts.cache_mb = 256;
	rc = cli_parse(&cli_chat_command, argc, argv, positional, &n_positional);
	if (rc != CLI_EXIT_OK)
		return rc < 0 ? CLI_EXIT_OK : rc;
	if (!chat_opts.model)
		return cli_usage_error(&cli_chat_command, "missing -m MODEL");
	{
		cai_sampling_params check;

		cai_sampling_params_default(&check);
		if (!cli_penalties_apply(&cli_chat_command, &chat_opts.pen, &check))
			return CLI_EXIT_USAGE;
	}

	rc = CLI_EXIT_ERROR;
	model = cli_load_model(chat_opts.model, chat_opts.threads, false, NULL);
	if (!model)
		goto done;
	cai_model_get_info(model, &info);
	ctx = chat_opts.ctx > 0 ? chat_opts.ctx :
		(info.context_length > 0 && info.context_length < 4096 ? info.context_length : 4096);
	if (chat_opts.max_tokens >= ctx)
	{
		rc = cli_usage_error(&cli_chat_command, "--max-tokens (%d) must be below the context (%d)",
							 chat_opts.max_tokens, ctx);
		goto done;
	}

	cai_engine_params_default(&ep);
	ep.n_threads = chat_opts.threads;
	ep.max_running = 1;
	ep.context_length = ctx;
	ep.host_cache_bytes = (size_t) chat_opts.cache_mb << 20;
	if (cai_engine_create(model, &ep, &engine, &err) != CAI_OK)
	{
		cli_report("could not create the engine", &err);
		goto done;
	}
	/* the engine's backend holds its own copy of the int8 matrices now */
	cai_model_release_gemm_sources(model);
	if (!chat_opts.quiet)
		fprintf(stderr, "cai chat: %s on %s; /quit or end of input ends, /reset forgets\n",
				info.name, cai_engine_device(engine));

	if (chat_opts.system)
	{
		chat_turn  *t = conversation_push(&conv, CAI_ROLE_SYSTEM);

		if (!t || !(t->content = strdup(chat_opts.system)))
		{
			cli_error("out of memory");
			goto done;
		}
	}
	n_fixed = conv.n;
	cli_install_interrupt_handler();

	while ((kind = chat_read_line(&line, &line_cap, interactive, &conv, n_fixed)) != CHAT_LINE_END)
	{
		if (kind == CHAT_LINE_MESSAGE &&
			chat_one_turn(model, engine, &info, &conv, ctx, line, &turn_index) != CLI_EXIT_OK)
			goto done;
	}
	rc = CLI_EXIT_OK;

done:
	conversation_truncate(&conv, 0);
	free(conv.turns);
	free(line);
	if (engine)
		cai_engine_free(engine);
	if (model)
		cai_model_free(model);
	return rc;
}
