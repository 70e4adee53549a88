/*
 * common.c — what several `cai` commands share: error reporting, model loading, raw-text
 * tokenization, file reading, Ctrl-C handling and the streaming generation loop.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "json_string.h"

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

int
cli_report(const char *what, const cai_error *err)
{
	fprintf(stderr, "cai: %s: %s: %s\n", what, cai_status_name(err->status),
			err->message[0] ? err->message : "(no detail)");
	return CLI_EXIT_ERROR;
}

int
cli_error(const char *fmt, ...)
{
	va_list		ap;

	fprintf(stderr, "cai: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return CLI_EXIT_ERROR;
}

double
cli_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

bool
cli_numerics_apply(const cli_numerics *numerics, cai_model_params *params)
{
	params->weights_cache = numerics->weights_cache;
	if (numerics->weights && !cai_weights_mode_parse(numerics->weights, &params->weights))
	{
		cli_error("unknown --weights mode \"%s\" (auto, file or int8)", numerics->weights);
		return false;
	}
	if (numerics->weight_rounding &&
		!cai_rounding_mode_parse(numerics->weight_rounding, &params->rounding))
	{
		cli_error("unknown --weight-rounding mode \"%s\" (auto, nearest or gptq)",
				  numerics->weight_rounding);
		return false;
	}
	if (numerics->activations &&
		!cai_activations_mode_parse(numerics->activations, &params->activations))
	{
		cli_error("unknown --activations mode \"%s\" (auto, int8, two_digit or int8_256)",
				  numerics->activations);
		return false;
	}
	if (numerics->gptq_rounding)
		params->rounding = CAI_ROUNDING_GPTQ;
	if (numerics->two_digit_activations)
		params->activations = CAI_ACTIVATIONS_TWO_DIGIT;
	return true;
}

/* ---------------------------------------------------------------------------------------------
 * Models and tokens
 * ------------------------------------------------------------------------------------------- */

cai_model  *
cli_load_model(const char *path, int n_threads, bool float_reference,
			   const cli_numerics *numerics)
{
	cai_model_params params;
	cai_model  *model = NULL;
	cai_error	err = {0};
	char		what[600];

	cai_model_params_default(&params);
	params.n_threads = n_threads;
	params.load_float_reference = float_reference;
	if (numerics && !cli_numerics_apply(numerics, &params))
		return NULL;
	if (cai_model_load(path, &params, &model, &err) != CAI_OK)
	{
		snprintf(what, sizeof(what), "could not load model \"%s\"", path);
		cli_report(what, &err);
		return NULL;
	}
	return model;
}

bool
cli_report_weights_cache(const cai_model *model, const char *prefix)
{
	cai_weights_cache_report r;

	cai_model_weights_cache_report(model, &r);
	if (r.refused[0])
		fprintf(stderr, "%s: weights: cache %s refused, rebuilt: %s\n", prefix, r.path, r.refused);
	switch (r.state)
	{
		case CAI_WEIGHTS_CACHE_OFF:
			break;
		case CAI_WEIGHTS_CACHE_MAPPED:
			fprintf(stderr, "%s: weights: mapped from cache %s in %.2f s (%.1f MB)\n", prefix,
					r.path, r.seconds, (double) r.file_bytes / 1e6);
			break;
		case CAI_WEIGHTS_CACHE_PENDING:
			fprintf(stderr, "%s: weights: converted in %.2f s, caching to %s\n", prefix,
					r.seconds, r.path);
			break;
		case CAI_WEIGHTS_CACHE_WRITTEN:
			fprintf(stderr, "%s: weights: converted in %.2f s, cached to %s (%.1f MB)\n", prefix,
					r.seconds, r.path, (double) r.file_bytes / 1e6);
			break;
		case CAI_WEIGHTS_CACHE_FAILED:
			fprintf(stderr, "%s: weights: converted in %.2f s, not cached to %s: %s\n", prefix,
					r.seconds, r.path, r.failure[0] ? r.failure : "not written");
			break;
	}
	return r.state == CAI_WEIGHTS_CACHE_PENDING;
}

void
cli_report_weights_cache_end(const cai_model *model, const char *prefix)
{
	cai_weights_cache_report r;

	cai_model_weights_cache_report(model, &r);
	if (r.state == CAI_WEIGHTS_CACHE_WRITTEN)
		fprintf(stderr, "%s: weights: cached to %s (%.1f MB)\n", prefix, r.path,
				(double) r.file_bytes / 1e6);
	else if (r.state == CAI_WEIGHTS_CACHE_FAILED)
		fprintf(stderr, "%s: weights: not cached to %s: %s\n", prefix, r.path,
				r.failure[0] ? r.failure : "not written");
}

bool
cli_load_grammar(const char *schema_file, bool json_object, bool free_whitespace,
				 cai_grammar **out)
{
	cai_json_whitespace ws = free_whitespace ? CAI_JSON_WS_FREE : CAI_JSON_WS_COMPACT;

	cai_error	err = {0};
	char		what[600];
	char	   *text;
	size_t		len = 0;

	*out = NULL;
	if (json_object)
	{
		if (cai_grammar_any_object(out, &err) == CAI_OK)
		{
			cai_grammar_set_whitespace(*out, ws);
			return true;
		}
		cli_report("could not make the JSON object grammar", &err);
		return false;
	}
	if (!schema_file)
		return true;
	text = cli_read_file(schema_file, &len);
	if (!text)
		return false;
	if (cai_grammar_from_schema(text, len, out, &err) != CAI_OK)
	{
		snprintf(what, sizeof(what), "could not use the JSON Schema in \"%s\"", schema_file);
		cli_report(what, &err);
		*out = NULL;
	}
	else
		cai_grammar_set_whitespace(*out, ws);
	free(text);
	return *out != NULL;
}

/*
 * Whether raw text starts with the BOS token (tokenizer.ggml.add_bos_token): a BOS id alone does
 * not say so (SmolLM2 has one and sets the flag false).  The engine's COMPLETE requests follow
 * the same rule (request_decode.c).
 */
bool
cli_model_adds_bos(const cai_model *model)
{
	cai_model_info info;

	cai_model_get_info(model, &info);
	return info.add_bos;
}

bool
cli_tokens_append(cli_tokens *t, const int32_t *ids, int n)
{
	if (n <= 0)
		return true;
	if (t->n + n > t->cap)
	{
		int			cap = t->cap ? t->cap : 64;
		int32_t    *grown;

		while (cap < t->n + n)
			cap *= 2;
		grown = realloc(t->ids, sizeof(int32_t) * (size_t) cap);
		if (!grown)
			return false;
		t->ids = grown;
		t->cap = cap;
	}
	memcpy(t->ids + t->n, ids, sizeof(int32_t) * (size_t) n);
	t->n += n;
	return true;
}

void
cli_tokens_free(cli_tokens *t)
{
	free(t->ids);
	t->ids = NULL;
	t->n = 0;
	t->cap = 0;
}

bool
cli_tokenize_raw(const cai_model *model, const char *text, cli_tokens *out)
{
	cai_model_info info;
	cai_error	err = {0};
	int32_t    *ids = NULL;
	int			n_ids = 0;
	bool		ok;

	cai_model_get_info(model, &info);
	if (cli_model_adds_bos(model) && info.bos_token >= 0 &&
		!cli_tokens_append(out, &info.bos_token, 1))
	{
		cli_error("out of memory tokenizing the prompt");
		return false;
	}
	if (cai_tokenize(model, text, strlen(text), false, &ids, &n_ids, &err) != CAI_OK)
	{
		cli_report("could not tokenize the text", &err);
		return false;
	}
	ok = cli_tokens_append(out, ids, n_ids);
	cai_free(ids);
	if (!ok)
		cli_error("out of memory tokenizing the prompt");
	return ok;
}

char *
cli_read_file(const char *path, size_t *len)
{
	bool		is_stdin = strcmp(path, "-") == 0;
	FILE	   *f = is_stdin ? stdin : fopen(path, "rb");
	char	   *buf = NULL;
	size_t		n = 0;
	size_t		cap = 0;

	if (!f)
	{
		cli_error("could not open \"%s\": %s", path, strerror(errno));
		return NULL;
	}
	for (;;)
	{
		size_t		got;

		if (n + 65536 + 1 > cap)
		{
			size_t		new_cap = cap ? cap * 2 : 131072;
			char	   *grown = realloc(buf, new_cap);

			if (!grown)
			{
				free(buf);
				if (!is_stdin)
					fclose(f);
				cli_error("out of memory reading \"%s\"", path);
				return NULL;
			}
			buf = grown;
			cap = new_cap;
		}
		got = fread(buf + n, 1, cap - n - 1, f);
		n += got;
		if (got == 0)
			break;
	}
	if (ferror(f))
	{
		cli_error("could not read \"%s\": %s", path, strerror(errno));
		free(buf);
		if (!is_stdin)
			fclose(f);
		return NULL;
	}
	if (!is_stdin)
		fclose(f);
	buf[n] = '\0';
	if (len)
		*len = n;
	return buf;
}

/* ---------------------------------------------------------------------------------------------
 * Ctrl-C
 * ------------------------------------------------------------------------------------------- */

/* Set by the SIGINT handler; the only state a signal handler may touch. */
static volatile sig_atomic_t interrupt_pending;

static void
handle_interrupt(int signo)
{
	(void) signo;
	interrupt_pending = 1;
}

/*
 * SIGINT sets a flag that the generation loop checks between steps (it cancels the request).
 * No SA_RESTART, so a read from the terminal returns EINTR and the chat loop can end.
 */
void
cli_install_interrupt_handler(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = handle_interrupt;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
}

bool
cli_interrupted(void)
{
	return interrupt_pending != 0;
}

void
cli_clear_interrupt(void)
{
	interrupt_pending = 0;
}

/* ---------------------------------------------------------------------------------------------
 * Generation
 * ------------------------------------------------------------------------------------------- */

/* Whether len bytes are whole, valid UTF-8 (a token may hold part of a character). */
static bool
utf8_is_whole(const unsigned char *p, size_t len)
{
	size_t		i = 0;

	while (i < len)
	{
		int			n = p[i] < 0x80 ? 1 : (p[i] >> 5) == 0x6 ? 2 : (p[i] >> 4) == 0xe ? 3 :
			(p[i] >> 3) == 0x1e ? 4 : 0;

		if (n == 0 || i + n > len)
			return false;
		for (int k = 1; k < n; k++)
			if ((p[i + k] & 0xc0) != 0x80)
				return false;
		i += n;
	}
	return true;
}

/*
 * Writes one token's "token" and "bytes" fields: the text when its bytes are whole UTF-8, else
 * the bytes outside ASCII as \xNN (OpenAI's way), and the exact bytes as numbers.
 */
static void
write_token_fields(FILE *out, const cai_model *model, int32_t token)
{
	char	   *text = NULL;
	size_t		len = 0;
	cai_error	err = {0};

	if (cai_detokenize(model, &token, 1, &text, &len, &err) != CAI_OK)
		len = 0;
	fputs("\"token\": ", out);
	if (len == 0 || utf8_is_whole((const unsigned char *) text, len))
		json_write_string(out, len ? text : "");
	else
	{
		fputc('"', out);
		for (size_t i = 0; i < len; i++)
		{
			unsigned char c = (unsigned char) text[i];

			if (c >= 0x80 || c < 0x20 || c == '"' || c == '\\')
				fprintf(out, "\\\\x%02x", c);
			else
				fputc(c, out);
		}
		fputc('"', out);
	}
	fputs(", \"bytes\": [", out);
	for (size_t i = 0; i < len; i++)
		fprintf(out, "%s%u", i ? ", " : "", (unsigned char) text[i]);
	fputc(']', out);
	cai_free(text);
}

/* One JSON line: {"id": N, "token": "...", "bytes": [...], "logprob": x, "top_logprobs": [...]} */
static void
write_logprobs_line(FILE *out, const cai_model *model, int32_t token, const cai_token_logprobs *lp)
{
	fprintf(out, "{\"id\": %d, ", token);
	write_token_fields(out, model, token);
	fprintf(out, ", \"logprob\": %.9g, \"top_logprobs\": [", (double) lp->logprob);
	for (int i = 0; i < lp->n_top; i++)
	{
		fprintf(out, "%s{\"id\": %d, ", i ? ", " : "", lp->top_token[i]);
		write_token_fields(out, model, lp->top_token[i]);
		fprintf(out, ", \"logprob\": %.9g}", (double) lp->top_logprob[i]);
	}
	fputs("]}\n", out);
}

/* See cli.h. */
int
cli_generate(cai_engine *engine, const cai_request_params *params, FILE *out,
			 cli_generation *gen)
{
	cai_error	err = {0};
	uint64_t	id;
	double		first_token_time = 0.0;
	bool		done = false;

	gen->finish = CAI_FINISH_NONE;
	gen->cancelled = false;
	gen->ends_with_newline = false;
	gen->text_bytes = 0;
	gen->decode_seconds = 0.0;
	memset(&gen->usage, 0, sizeof(gen->usage));

	if (cai_engine_submit(engine, params, &id, &err) != CAI_OK)
		return cli_report("could not submit the request", &err);

	while (!done)
	{
		const cai_event *events;
		int			n_events;
		cai_status	st;

		if (cli_interrupted())
		{
			cai_engine_cancel(engine, id);
			gen->cancelled = true;
			gen->usage.completion_tokens = gen->tokens.n;
			break;
		}
		st = cai_engine_step(engine, &events, &n_events, &err);
		for (int i = 0; i < n_events; i++)
		{
			const cai_event *ev = &events[i];

			if (ev->request_id != id)
				continue;
			if (ev->token >= 0)
			{
				if (first_token_time == 0.0)
					first_token_time = cli_now();
				if (!cli_tokens_append(&gen->tokens, &ev->token, 1))
				{
					cai_engine_cancel(engine, id);
					return cli_error("out of memory collecting generated tokens");
				}
				if (gen->logprobs_out && gen->model && ev->logprobs)
					write_logprobs_line(gen->logprobs_out, gen->model, ev->token, ev->logprobs);
			}
			if (ev->text_len > 0)
			{
				if (out)
				{
					fwrite(ev->text, 1, ev->text_len, out);
					fflush(out);
				}
				gen->text_bytes += ev->text_len;
				gen->ends_with_newline = ev->text[ev->text_len - 1] == '\n';
			}
			if (ev->finish != CAI_FINISH_NONE)
			{
				gen->finish = ev->finish;
				gen->usage = ev->usage;
				done = true;
				if (ev->finish == CAI_FINISH_ERROR)
					return cli_error("generation failed: %s", ev->error ? ev->error : "unknown error");
			}
		}
		if (st != CAI_OK)
			return cli_report("engine step failed", &err);
		if (!done && !cai_engine_has_work(engine))
			return cli_error("the engine dropped the request without finishing it");
	}
	if (first_token_time > 0.0)
		gen->decode_seconds = cli_now() - first_token_time;
	return CLI_EXIT_OK;
}
