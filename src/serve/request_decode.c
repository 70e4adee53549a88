/*
 * request_decode.c — decodes and validates a request payload (see request_decode.h).
 */
#include <stdlib.h>
#include <string.h>

#include "request_decode.h"
#include "util.h"

/* A malformed payload's message count beyond which it is refused rather than attempted. */
#define MAX_MESSAGES (1 << 20)

void
cai_decoded_request_free(cai_decoded_request *req)
{
	cai_grammar_free(req->params.grammar);
	free(req->prompt);
	for (int i = 0; i < CAI_MAX_STOP_STRINGS; i++)
		free(req->stop[i]);
	free(req->user_tokens);
	free(req->ids);
	cai_tool_set_free(req->tools);
	free(req->tool_name);
	free(req->logit_bias);
	for (int i = 0; i < req->n_texts; i++)
		free(req->text_ids ? req->text_ids[i] : NULL);
	free(req->text_ids);
	free(req->text_n_ids);
	memset(req, 0, sizeof(*req));
}

/*
 * Sampling options from the generation block.  The range checks are the library's (cai.h's
 * request limits), run here so that a request out of range is refused before its prompt is
 * decoded or its schema compiled.
 */
static cai_status
decode_sampling(const cai_wire_generation *g, cai_decoded_request *out, cai_error *err)
{
	cai_sampling_params *sp = &out->params.sampling;
	cai_status	st;

	cai_sampling_params_default(sp);
	sp->temperature = g->temperature;
	sp->top_p = g->top_p;
	sp->top_k = g->top_k;
	sp->seed = g->seed;
	sp->max_tokens = g->max_tokens;
	sp->ignore_eos = g->ignore_eos;
	for (int i = 0; i < g->n_stop; i++)
	{
		/* stop strings become C strings: an empty one or one with a NUL byte cannot be meant */
		if (g->stop_len[i] == 0 || memchr(g->stop[i], '\0', g->stop_len[i]) != NULL)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"stop strings must be non-empty and must not contain NUL bytes");
		out->stop[i] = malloc((size_t) g->stop_len[i] + 1);
		if (!out->stop[i])
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory decoding a request");
		memcpy(out->stop[i], g->stop[i], g->stop_len[i]);
		out->stop[i][g->stop_len[i]] = '\0';
		sp->stop[i] = out->stop[i];
	}
	sp->n_stop = g->n_stop;
	sp->presence_penalty = g->presence_penalty;
	sp->frequency_penalty = g->frequency_penalty;
	sp->repetition_penalty = g->repetition_penalty;
	sp->min_p = g->min_p;
	sp->logprobs = g->logprobs;
	sp->top_logprobs = g->top_logprobs;
	sp->n_samples = g->n_samples;
	if (g->n_logit_bias > 0)
	{
		out->logit_bias = malloc(sizeof(cai_logit_bias) * (size_t) g->n_logit_bias);
		if (!out->logit_bias)
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory decoding a request");
		for (int i = 0; i < g->n_logit_bias; i++)
			out->logit_bias[i] = cai_wire_logit_bias_at(g, i);
		sp->logit_bias = out->logit_bias;
		sp->n_logit_bias = g->n_logit_bias;
	}
	if ((st = cai_sampling_params_check(sp, err)) != CAI_OK)
		return st;
	out->params.cache_salt = g->cache_salt;
	out->params.cache_owner = g->cache_owner;
	out->params.use_cache = g->use_cache;

	/* a JSON reply: the schema is compiled here, in the engine process, like any input */
	if (g->response_format != CAI_RESPONSE_TEXT && g->n_stop > 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"stop strings cannot be combined with a JSON response_format");
	if (g->response_format == CAI_RESPONSE_TEXT)
		return CAI_OK;
	st = g->response_format == CAI_RESPONSE_JSON_OBJECT ?
		cai_grammar_any_object(&out->params.grammar, err) :
		cai_grammar_from_schema(g->schema, g->schema_len, &out->params.grammar, err);
	if (st == CAI_OK)
		cai_grammar_set_whitespace(out->params.grammar, g->json_whitespace);
	return st;
}

/* A C string copy of payload text (a NUL byte inside ends it early; nothing else changes). */
static char *
copy_text(const char *text, uint32_t len)
{
	char	   *copy = malloc((size_t) len + 1);

	if (copy)
	{
		memcpy(copy, text, len);
		copy[len] = '\0';
	}
	return copy;
}

/*
 * The tool block that may follow a CHAT payload's turns: u8 tool_choice, text tools (JSON, empty
 * for none), text the named function, then per turn a text of its tool calls (JSON, empty for
 * none).  The tools are checked again here: the engine trusts no byte it did not check.
 */
static cai_status
decode_tools(cai_reader *r, cai_chat_message *messages, int n_messages, char **tool_calls,
			 cai_decoded_request *out, cai_error *err)
{
	uint8_t		choice;
	const char *text;
	uint32_t	len;
	cai_status	st;

	if (!cai_get_u8(r, &choice) || choice > CAI_TOOL_CHOICE_NAMED || !cai_get_text(r, &text, &len))
		return cai_fail(err, CAI_ERR_INTERNAL, "malformed chat request: bad tool block");
	if (len > 0 && (st = cai_tool_set_parse(text, len, &out->tools, err)) != CAI_OK)
		return st;
	if (!cai_get_text(r, &text, &len) || !(out->tool_name = copy_text(text, len)))
		return cai_fail(err, CAI_ERR_INTERNAL, "malformed chat request: bad tool block");
	if (choice != CAI_TOOL_CHOICE_NONE && cai_tool_set_count(out->tools) == 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "tool_choice needs tools");
	out->params.tools = out->tools;
	out->params.tool_choice = choice;
	out->params.tool_name = out->tool_name;
	for (int i = 0; i < n_messages; i++)
	{
		if (!cai_get_text(r, &text, &len))
			return cai_fail(err, CAI_ERR_INTERNAL, "malformed chat request: bad tool calls of turn %d", i);
		if (len == 0)
			continue;
		if (!(tool_calls[i] = copy_text(text, len)))
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory decoding a request");
		messages[i].tool_calls = tool_calls[i];
	}
	return CAI_OK;
}

/* The turns of a CHAT payload through the chat template into the prompt. */
static cai_status
decode_chat(const cai_model *model, cai_reader *r, int max_prompt, bool truncate,
			cai_decoded_request *out, cai_error *err)
{
	cai_model_info info;
	cai_chat_message *messages = NULL;
	char	  **contents = NULL;
	char	  **tool_calls = NULL;
	int32_t   **ids = NULL;
	int32_t		n_messages;
	cai_prompt_params pp;
	cai_prompt	prompt;
	cai_status	st = CAI_OK;

	cai_model_get_info(model, &info);
	memset(&prompt, 0, sizeof(prompt));
	/* a turn takes at least 12 bytes: role, content length, token count */
	if (!cai_get_i32(r, &n_messages) || n_messages < 1 || n_messages > MAX_MESSAGES ||
		(size_t) n_messages > cai_reader_remaining(r) / 12)
		return cai_fail(err, CAI_ERR_INTERNAL, "malformed chat request: bad message count");

	messages = calloc((size_t) n_messages, sizeof(cai_chat_message));
	contents = calloc((size_t) n_messages, sizeof(char *));
	ids = calloc((size_t) n_messages, sizeof(int32_t *));
	tool_calls = calloc((size_t) n_messages, sizeof(char *));
	if (!messages || !contents || !ids || !tool_calls)
	{
		st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory decoding a request");
		goto done;
	}
	for (int i = 0; i < n_messages; i++)
	{
		int32_t		role;
		int32_t		n_tokens;
		const char *text;
		uint32_t	len;

		if (!cai_get_i32(r, &role) || role < CAI_ROLE_SYSTEM || role > CAI_ROLE_TOOL ||
			!cai_get_text(r, &text, &len) || !cai_get_i32(r, &n_tokens) || n_tokens < -1 ||
			(n_tokens > 0 && (size_t) n_tokens > cai_reader_remaining(r) / sizeof(int32_t)))
		{
			st = cai_fail(err, CAI_ERR_INTERNAL, "malformed chat request: bad turn %d", i);
			goto done;
		}
		contents[i] = copy_text(text, len);
		if (!contents[i])
		{
			st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory decoding a request");
			goto done;
		}
		messages[i].role = (cai_role) role;
		messages[i].content = contents[i];
		if (n_tokens >= 0)
		{
			bool		in_vocabulary = true;

			ids[i] = malloc(sizeof(int32_t) * (size_t) (n_tokens > 0 ? n_tokens : 1));
			if (!ids[i])
			{
				st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory decoding a request");
				goto done;
			}
			(void) cai_get_i32_array(r, n_tokens, ids[i]);

			/*
			 * Stored ids come from a table the caller may write: ids outside the vocabulary
			 * are not used, and the content is tokenized instead.
			 */
			for (int j = 0; j < n_tokens && in_vocabulary; j++)
				in_vocabulary = ids[i][j] >= 0 && ids[i][j] < info.n_vocab;
			if (in_vocabulary)
			{
				messages[i].tokens = ids[i];
				messages[i].n_tokens = n_tokens;
			}
		}
	}
	if (cai_reader_remaining(r) != 0 &&
		(st = decode_tools(r, messages, n_messages, tool_calls, out, err)) != CAI_OK)
		goto done;
	if (cai_reader_remaining(r) != 0)
	{
		st = cai_fail(err, CAI_ERR_INTERNAL, "malformed chat request: trailing bytes");
		goto done;
	}

	memset(&pp, 0, sizeof(pp));
	pp.tools = out->tools;
	pp.add_generation_prompt = true;
	pp.max_prompt_tokens = max_prompt;
	pp.truncate = truncate;
	st = cai_chat_build_prompt(model, messages, n_messages, &pp, &prompt, err);
	if (st != CAI_OK)
		goto done;
	out->prompt = prompt.ids;
	out->params.prompt = prompt.ids;
	out->params.n_prompt = prompt.n_ids;
	out->first_message = prompt.first_message;
	prompt.ids = NULL;
	if (prompt.n_last_content_ids > 0)
	{
		out->user_tokens = malloc(sizeof(int32_t) * (size_t) prompt.n_last_content_ids);
		if (!out->user_tokens)
		{
			st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory decoding a request");
			goto done;
		}
		memcpy(out->user_tokens, prompt.last_content_ids,
			   sizeof(int32_t) * (size_t) prompt.n_last_content_ids);
		out->n_user_tokens = prompt.n_last_content_ids;
	}

done:
	cai_prompt_free(&prompt);
	for (int i = 0; contents && i < n_messages; i++)
		free(contents[i]);
	for (int i = 0; ids && i < n_messages; i++)
		free(ids[i]);
	for (int i = 0; tool_calls && i < n_messages; i++)
		free(tool_calls[i]);
	free(tool_calls);
	free(contents);
	free(ids);
	free(messages);
	return st;
}

/*
 * The text of a COMPLETE payload, tokenized, the oldest part cut when it is too long.  Raw text
 * starts with the BOS token where the model asks for it (tokenizer.ggml.add_bos_token: Gemma and
 * Llama do, SmolLM2 does not), as llama.cpp and `cai run` do: without it a Gemma model continues
 * text it has never seen start that way, and its output degenerates.
 */
static cai_status
decode_complete(const cai_model *model, cai_reader *r, int context_length, int max_prompt,
				bool truncate, cai_decoded_request *out, cai_error *err)
{
	const char *text;
	uint32_t	len;
	int32_t    *ids = NULL;
	int			n_ids = 0;
	cai_model_info info;
	int			n_bos;
	cai_status	st;

	if (!cai_get_text(r, &text, &len) || cai_reader_remaining(r) != 0)
		return cai_fail(err, CAI_ERR_INTERNAL, "malformed completion request");
	st = cai_tokenize(model, text, len, false, &ids, &n_ids, err);
	if (st != CAI_OK)
		return st;
	if (n_ids == 0)
	{
		cai_free(ids);
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "prompt has no tokens");
	}
	cai_model_get_info(model, &info);
	n_bos = info.add_bos && info.bos_token >= 0 ? 1 : 0;
	if (n_bos + n_ids > max_prompt)
	{
		if (!truncate || max_prompt <= n_bos)
		{
			cai_free(ids);
			return cai_fail(err, CAI_ERR_CONTEXT_FULL,
							"the prompt is %d tokens, more than the limit of %d (the context of %d tokens less %d kept for the reply)",
							n_bos + n_ids, max_prompt, context_length, context_length - max_prompt);
		}
		/* keep the most recent text (after the BOS token) */
		memmove(ids, ids + (n_ids - (max_prompt - n_bos)),
				sizeof(int32_t) * (size_t) (max_prompt - n_bos));
		n_ids = max_prompt - n_bos;
	}
	if (n_bos)
	{
		int32_t    *with_bos = malloc(sizeof(int32_t) * (size_t) (n_ids + 1));

		if (!with_bos)
		{
			cai_free(ids);
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing the prompt");
		}
		with_bos[0] = info.bos_token;
		memcpy(with_bos + 1, ids, sizeof(int32_t) * (size_t) n_ids);
		cai_free(ids);
		ids = with_bos;
		n_ids++;
	}
	out->prompt = ids;
	out->params.prompt = ids;
	out->params.n_prompt = n_ids;
	return CAI_OK;
}

/*
 * The texts of an EMBED payload, each tokenized as a COMPLETE prompt is (BOS first where the
 * model asks for it).  Length is the engine's business: it refuses a text longer than a step.
 */
static cai_status
decode_embed(const cai_model *model, cai_reader *r, cai_decoded_request *out, cai_error *err)
{
	int32_t		n_texts;
	cai_model_info info;
	int			n_bos;

	cai_model_get_info(model, &info);
	n_bos = info.add_bos && info.bos_token >= 0 ? 1 : 0;
	if (!cai_get_i32(r, &n_texts) || n_texts < 1 || n_texts > CAI_EMBED_MAX_TEXTS)
		return cai_fail(err, CAI_ERR_INTERNAL, "malformed embedding request");
	out->text_ids = calloc((size_t) n_texts, sizeof(int32_t *));
	out->text_n_ids = calloc((size_t) n_texts, sizeof(int));
	if (!out->text_ids || !out->text_n_ids)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory decoding a request");
	out->n_texts = n_texts;
	for (int i = 0; i < n_texts; i++)
	{
		const char *text;
		uint32_t	len;
		int32_t    *ids = NULL;
		int			n_ids = 0;
		cai_status	st;

		if (!cai_get_text(r, &text, &len))
			return cai_fail(err, CAI_ERR_INTERNAL, "malformed embedding request");
		if ((st = cai_tokenize(model, text, len, false, &ids, &n_ids, err)) != CAI_OK)
			return st;
		if (n_ids == 0)
		{
			cai_free(ids);
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "text %d to embed is empty", i + 1);
		}
		out->text_ids[i] = malloc(sizeof(int32_t) * (size_t) (n_ids + n_bos));
		if (!out->text_ids[i])
		{
			cai_free(ids);
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory decoding a request");
		}
		if (n_bos)
			out->text_ids[i][0] = info.bos_token;
		memcpy(out->text_ids[i] + n_bos, ids, sizeof(int32_t) * (size_t) n_ids);
		out->text_n_ids[i] = n_ids + n_bos;
		cai_free(ids);
	}
	if (cai_reader_remaining(r) != 0)
		return cai_fail(err, CAI_ERR_INTERNAL, "malformed embedding request");
	return CAI_OK;
}

cai_status
cai_request_decode(const cai_model *model, int context_length, uint32_t kind,
				   const void *payload, size_t len, cai_decoded_request *out, cai_error *err)
{
	cai_reader	r;
	cai_status	st = CAI_OK;

	memset(out, 0, sizeof(*out));
	cai_reader_init(&r, payload, len);
	out->kind = (cai_request_kind) kind;

	switch (kind)
	{
		case CAI_REQUEST_CHAT:
		case CAI_REQUEST_COMPLETE:
			{
				cai_wire_generation g;
				int			max_prompt;

				if (!cai_wire_get_generation(&r, &g))
					return cai_fail(err, CAI_ERR_INTERNAL,
									"malformed generation request: bad options block");
				st = decode_sampling(&g, out, err);
				if (st != CAI_OK)
					break;
				/* leave room for the reply: at most half the context is reserved for it */
				max_prompt = context_length - (g.max_tokens < context_length / 2 ?
											   g.max_tokens : context_length / 2);
				if (kind == CAI_REQUEST_CHAT)
					st = decode_chat(model, &r, max_prompt, g.truncate, out, err);
				else
					st = decode_complete(model, &r, context_length, max_prompt, g.truncate, out,
										 err);
				break;
			}

		case CAI_REQUEST_TOKENIZE:
			if (!cai_get_text(&r, &out->text, &out->text_len) || cai_reader_remaining(&r) != 0)
				return cai_fail(err, CAI_ERR_INTERNAL, "malformed tokenize request");
			break;

		case CAI_REQUEST_DETOKENIZE:
			{
				int32_t		count;
				cai_model_info info;

				cai_model_get_info(model, &info);
				if (!cai_get_i32(&r, &count) || count < 0 ||
					(size_t) count != cai_reader_remaining(&r) / sizeof(int32_t) ||
					cai_reader_remaining(&r) % sizeof(int32_t) != 0)
					return cai_fail(err, CAI_ERR_INTERNAL, "malformed detokenize request");
				out->ids = malloc(sizeof(int32_t) * (size_t) (count > 0 ? count : 1));
				if (!out->ids)
					return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory decoding a request");
				(void) cai_get_i32_array(&r, count, out->ids);
				out->n_ids = count;
				for (int i = 0; i < count; i++)
					if (out->ids[i] < 0 || out->ids[i] >= info.n_vocab)
					{
						st = cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
									  "token id %d is out of range: the vocabulary has %d tokens",
									  out->ids[i], info.n_vocab);
						break;
					}
				break;
			}

		case CAI_REQUEST_EMBED:
			st = decode_embed(model, &r, out, err);
			break;

		case CAI_REQUEST_CACHE_RESET:
			if (cai_reader_remaining(&r) != 0)
				return cai_fail(err, CAI_ERR_INTERNAL, "malformed cache reset request");
			break;

		case CAI_REQUEST_CACHE_FORGET:
			if (!cai_get_u64(&r, &out->owner) || cai_reader_remaining(&r) != 0)
				return cai_fail(err, CAI_ERR_INTERNAL, "malformed cache forget request");
			break;

		default:
			return cai_fail(err, CAI_ERR_INTERNAL, "unknown request kind %u", kind);
	}
	if (st != CAI_OK)
		cai_decoded_request_free(out);
	return st;
}
