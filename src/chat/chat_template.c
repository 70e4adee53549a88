/*
 * chat_template.c — the model families' chat formats, rendered straight to token ids.
 *
 * We do not run Jinja: a GGUF's tokenizer.chat_template is only read to recognise which
 * published format it is (and, for ChatML, which default system prompt it adds).  Rendering
 * appends, message by message, markup (tokenized with special tokens parsed) and content
 * (tokenized as plain text, or the caller's stored ids spliced in unchanged).  A message's
 * tokens depend only on the messages before it, so rendering messages [0..k) is always a token
 * prefix of rendering [0..k+1) — the property the prefix cache relies on.  The generation
 * prompt is likewise a prefix of the assistant message that answers it.
 *
 * SentencePiece models put a space in front of text that starts the prompt or follows a
 * special token; markup pieces follow that rule (as llama.cpp does when it tokenizes a whole
 * rendered prompt), and the Llama 2 format spells the space before content out.
 */
#include "chat_template.h"

#include "json.h"
#include "tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Default system prompts that known ChatML templates add when the conversation has none.  The
 * template struct points at one of these, so a default we do not know is not applied.
 */
static const char *const known_default_systems[] = {
	"You are a helpful AI assistant named SmolLM, trained by Hugging Face",	/* SmolLM2 */
	"You are a helpful assistant.",	/* Qwen1.5, Qwen2 */
	"You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",	/* Qwen2.5 */
	NULL
};

const char *
cai_chat_template_name(cai_template_kind kind)
{
	switch (kind)
	{
		case CAI_TEMPLATE_CHATML:
			return "chatml";
		case CAI_TEMPLATE_LLAMA3:
			return "llama3";
		case CAI_TEMPLATE_GEMMA:
			return "gemma";
		case CAI_TEMPLATE_LLAMA2:
			return "llama2";
		case CAI_TEMPLATE_ZEPHYR:
			return "zephyr";
	}
	return "unknown";
}

/* Fills out for kind: the end-of-turn token the format uses. */
static void
template_init(cai_template_kind kind, const cai_tokenizer *tok, cai_chat_template *out)
{
	out->kind = kind;
	out->default_system = NULL;
	switch (kind)
	{
		case CAI_TEMPLATE_CHATML:
			out->end_of_turn = cai_tokenizer_find(tok, "<|im_end|>");
			break;
		case CAI_TEMPLATE_LLAMA3:
			out->end_of_turn = cai_tokenizer_find(tok, "<|eot_id|>");
			break;
		case CAI_TEMPLATE_GEMMA:
			out->end_of_turn = cai_tokenizer_find(tok, "<end_of_turn>");
			break;
		case CAI_TEMPLATE_LLAMA2:
		case CAI_TEMPLATE_ZEPHYR:
			out->end_of_turn = -1;	/* turns end with EOS */
			break;
	}
	/* a marker the vocabulary lacks, or has only as plain text, cannot end a turn */
	if (out->end_of_turn >= 0 && !cai_tokenizer_is_special(tok, out->end_of_turn))
		out->end_of_turn = -1;
}

/*
 * The default system prompt of a ChatML template: the literal text between
 * "<|im_start|>system\n" and "<|im_end|>" in a Jinja string constant (so not one built from
 * message['content']), if it is one we know.  The newline may be written as a Jinja escape.
 */
static const char *
chatml_default_system(const char *jinja)
{
	static const char marker[] = "<|im_start|>system";
	const char *p = jinja;

	while ((p = strstr(p, marker)) != NULL)
	{
		const char *text = p + strlen(marker);
		const char *end;
		size_t		len;

		p = text;
		if (text[0] == '\n')
			text += 1;
		else if (text[0] == '\\' && text[1] == 'n')
			text += 2;
		else
			continue;
		end = strstr(text, "<|im_end|>");
		if (!end)
			break;
		len = (size_t) (end - text);
		/* quotes or braces mean an expression, not a constant */
		if (len == 0 || memchr(text, '\'', len) || memchr(text, '"', len) ||
			memchr(text, '{', len) || memchr(text, '}', len))
			continue;
		for (int i = 0; known_default_systems[i]; i++)
			if (strlen(known_default_systems[i]) == len &&
				memcmp(known_default_systems[i], text, len) == 0)
				return known_default_systems[i];
	}
	return NULL;
}

cai_status
cai_chat_template_detect(const char *jinja, const char *arch, const cai_tokenizer *tok,
						 cai_chat_template *out, cai_error *err)
{
	cai_template_kind kind;

	if (!tok || !out)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "tokenizer and template must not be null");

	/* the template's own markup says which format it is */
	if (jinja && strstr(jinja, "<|im_start|>"))
		kind = CAI_TEMPLATE_CHATML;
	else if (jinja && strstr(jinja, "<|start_header_id|>"))
		kind = CAI_TEMPLATE_LLAMA3;
	else if (jinja && strstr(jinja, "<start_of_turn>"))
		kind = CAI_TEMPLATE_GEMMA;
	else if (jinja && strstr(jinja, "<|user|>"))
		kind = CAI_TEMPLATE_ZEPHYR;
	else if (jinja && strstr(jinja, "[INST]"))
		kind = CAI_TEMPLATE_LLAMA2;
	/* no (recognisable) template: go by the vocabulary's markup tokens, then the architecture */
	else if (cai_tokenizer_is_special(tok, cai_tokenizer_find(tok, "<|im_start|>")))
		kind = CAI_TEMPLATE_CHATML;
	else if (cai_tokenizer_is_special(tok, cai_tokenizer_find(tok, "<|start_header_id|>")))
		kind = CAI_TEMPLATE_LLAMA3;
	else if (cai_tokenizer_is_special(tok, cai_tokenizer_find(tok, "<start_of_turn>")) ||
			 (arch && strncmp(arch, "gemma", 5) == 0))
		kind = CAI_TEMPLATE_GEMMA;
	else if (arch && strncmp(arch, "qwen", 4) == 0)
		kind = CAI_TEMPLATE_CHATML;
	else
		kind = CAI_TEMPLATE_LLAMA2;

	template_init(kind, tok, out);
	if (kind == CAI_TEMPLATE_CHATML && jinja)
		out->default_system = chatml_default_system(jinja);
	return CAI_OK;
}

cai_status
cai_chat_template_by_name(const char *name, const cai_tokenizer *tok,
						  cai_chat_template *out, cai_error *err)
{
	static const cai_template_kind kinds[] = {
		CAI_TEMPLATE_CHATML, CAI_TEMPLATE_LLAMA3, CAI_TEMPLATE_GEMMA, CAI_TEMPLATE_LLAMA2,
		CAI_TEMPLATE_ZEPHYR
	};

	if (!name || !tok || !out)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "template name, tokenizer and template must not be null");
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
		if (strcmp(name, cai_chat_template_name(kinds[i])) == 0)
		{
			template_init(kinds[i], tok, out);
			return CAI_OK;
		}
	return cai_fail(err, CAI_ERR_NOT_FOUND,
					"unknown chat template \"%s\" (known: chatml, llama3, gemma, llama2, zephyr)", name);
}

/* ---------------------------------------------------------------------------------------------
 * Rendering
 * ------------------------------------------------------------------------------------------- */

typedef struct render_ctx render_ctx;
static bool chat_has_tool_turns(const cai_chat_message *msgs, int n);
static void render_chatml_tools(render_ctx *r, const cai_chat_template *tmpl,
								const cai_chat_message *msgs, int n, bool gen);
static void render_llama3_tools(render_ctx *r, const cai_chat_message *msgs, int n, bool gen);
static cai_status render_generic_tools(const cai_chat_template *tmpl, const cai_tokenizer *tok,
									   const cai_chat_message *msgs, int n,
									   const cai_tool_set *tools, bool gen, cai_tokens *out,
									   int32_t (*content_spans)[2], cai_error *err);

struct render_ctx
{
	const cai_tokenizer *tok;
	cai_tokens *out;
	cai_error  *err;
	cai_status	status;			/* the first failure; later appends do nothing */
	const cai_chat_message *messages;	/* for content_spans: which message is being put */
	int32_t   (*content_spans)[2];	/* [n_messages] [start, end) of each content in out, or NULL */
	const cai_tool_set *tools;	/* tools to show the model, or NULL */
};

/*
 * True when text appended now starts a stretch of its own (the prompt's start, or just after a
 * special token): SentencePiece puts a space in front of such text.
 */
static bool
at_fresh_start(const render_ctx *r)
{
	return r->out->n == 0 || cai_tokenizer_is_special(r->tok, r->out->ids[r->out->n - 1]);
}

/* Appends the tokens of text, special tokens parsed if parse_special. */
static void
put_text(render_ctx *r, const char *text, size_t len, bool parse_special)
{
	if (r->status != CAI_OK || len == 0)
		return;
	if (at_fresh_start(r))
		r->status = cai_tokenizer_encode(r->tok, text, len, parse_special, r->out, r->err);
	else
		r->status = cai_tokenizer_encode_continuation(r->tok, text, len, parse_special,
													  r->out, r->err);
}

/* Appends markup: the format's own text, special tokens parsed. */
static void
put_markup(render_ctx *r, const char *markup)
{
	put_text(r, markup, strlen(markup), true);
}

static void
put_token(render_ctx *r, int32_t id)
{
	if (r->status != CAI_OK || id < 0)
		return;
	if (!cai_tokens_push(r->out, id))
		r->status = cai_fail(r->err, CAI_ERR_NO_MEMORY, "out of memory rendering a chat prompt");
}

static bool
is_trim_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/*
 * Appends a message's content: the caller's ids as they are, else its text as plain text
 * (never parsed for special tokens), trimmed where the format's template trims, with a space in
 * front where the format puts one.
 */
static void put_content_ids(render_ctx *r, const cai_chat_message *m, const char *text,
							size_t len, bool trim, bool space_before);

static void
put_content(render_ctx *r, const cai_chat_message *m, bool trim, bool space_before)
{
	const char *text = m->content ? m->content : "";
	size_t		len = strlen(text);

	if (r->status != CAI_OK)
		return;
	if (r->content_spans)
		r->content_spans[m - r->messages][0] = r->content_spans[m - r->messages][1] = r->out->n;
	put_content_ids(r, m, text, len, trim, space_before);
	if (r->content_spans)
		r->content_spans[m - r->messages][1] = r->out->n;
}

/* put_content's work: the ids, or the text tokenized as the format does it. */
static void
put_content_ids(render_ctx *r, const cai_chat_message *m, const char *text, size_t len, bool trim,
				bool space_before)
{
	if (m->tokens)
	{
		if (!cai_tokens_append(r->out, m->tokens, m->n_tokens))
			r->status = cai_fail(r->err, CAI_ERR_NO_MEMORY, "out of memory rendering a chat prompt");
		return;
	}
	if (trim)
	{
		while (len > 0 && is_trim_space(text[0]))
		{
			text++;
			len--;
		}
		while (len > 0 && is_trim_space(text[len - 1]))
			len--;
	}
	if (space_before && len > 0)
	{
		/* one piece, so that the space joins the first word as it does in running text */
		char	   *spaced = malloc(len + 1);

		if (!spaced)
		{
			r->status = cai_fail(r->err, CAI_ERR_NO_MEMORY, "out of memory rendering a chat prompt");
			return;
		}
		spaced[0] = ' ';
		memcpy(spaced + 1, text, len);
		put_text(r, spaced, len + 1, false);
		free(spaced);
		return;
	}
	put_text(r, text, len, false);
}

/* Appends markup made of prefix, a role name and suffix. */
static void
put_role_markup(render_ctx *r, const char *prefix, const char *role, const char *suffix)
{
	char		buf[128];

	snprintf(buf, sizeof(buf), "%s%s%s", prefix, role, suffix);
	put_markup(r, buf);
}

static const char *
role_name(cai_role role)
{
	switch (role)
	{
		case CAI_ROLE_SYSTEM:
			return "system";
		case CAI_ROLE_USER:
			return "user";
		case CAI_ROLE_ASSISTANT:
			return "assistant";
		case CAI_ROLE_TOOL:
			return "tool";
	}
	return "user";
}

/* <|im_start|>role\ncontent<|im_end|>\n */
static void
render_chatml(render_ctx *r, const cai_chat_template *tmpl, const cai_chat_message *msgs, int n,
			  bool gen)
{
	if (r->tools || chat_has_tool_turns(msgs, n))
	{
		render_chatml_tools(r, tmpl, msgs, n, gen);
		return;
	}
	for (int i = 0; i < n; i++)
	{
		if (i == 0 && msgs[0].role != CAI_ROLE_SYSTEM && tmpl->default_system)
		{
			put_markup(r, "<|im_start|>system\n");
			put_text(r, tmpl->default_system, strlen(tmpl->default_system), false);
			put_markup(r, "<|im_end|>\n");
		}
		put_role_markup(r, "<|im_start|>", role_name(msgs[i].role), "\n");
		put_content(r, &msgs[i], false, false);
		put_markup(r, "<|im_end|>\n");
	}
	if (gen)
		put_markup(r, "<|im_start|>assistant\n");
}

/* <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> */
static void
render_llama3(render_ctx *r, const cai_chat_message *msgs, int n, bool gen)
{
	if (r->tools || chat_has_tool_turns(msgs, n))
	{
		render_llama3_tools(r, msgs, n, gen);
		return;
	}
	for (int i = 0; i < n; i++)
	{
		put_role_markup(r, "<|start_header_id|>", role_name(msgs[i].role), "<|end_header_id|>\n\n");
		put_content(r, &msgs[i], true, false);
		put_markup(r, "<|eot_id|>");
	}
	if (gen)
		put_markup(r, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/*
 * <start_of_turn>user\ncontent<end_of_turn>\n, "model" for the assistant.  Gemma has no system
 * role: a leading system prompt opens the first user turn ("system\n\nuser text").
 */
static void
render_gemma(render_ctx *r, const cai_chat_message *msgs, int n, bool gen)
{
	bool		turn_open = false;	/* a user turn holding the system prompt is open */
	int			i = 0;

	if (n > 0 && msgs[0].role == CAI_ROLE_SYSTEM)
	{
		put_markup(r, "<start_of_turn>user\n");
		put_content(r, &msgs[0], true, false);
		put_markup(r, "\n\n");
		turn_open = true;
		i = 1;
	}
	for (; i < n; i++)
	{
		bool		model = msgs[i].role == CAI_ROLE_ASSISTANT;

		if (turn_open && !model)
		{
			put_content(r, &msgs[i], true, false);
			put_markup(r, "<end_of_turn>\n");
			turn_open = false;
			continue;
		}
		if (turn_open)
		{
			put_markup(r, "<end_of_turn>\n");
			turn_open = false;
		}
		put_markup(r, model ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
		put_content(r, &msgs[i], true, false);
		put_markup(r, "<end_of_turn>\n");
	}
	if (gen)
	{
		if (turn_open)
			put_markup(r, "<end_of_turn>\n");
		put_markup(r, "<start_of_turn>model\n");
	}
}

/*
 * <s>[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] assistant</s><s>[INST] user [/INST]
 * (Llama 2's template; BOS opens every user turn, the assistant's reply ends with EOS).
 */
static void
render_llama2(render_ctx *r, const cai_chat_message *msgs, int n, bool gen)
{
	int32_t		bos = cai_tokenizer_add_bos(r->tok) ? cai_tokenizer_bos(r->tok) : -1;
	bool		inst_open = false;	/* "[INST] <<SYS>>...<</SYS>>\n\n" awaits the user's text */
	int			i = 0;

	if (n > 0 && msgs[0].role == CAI_ROLE_SYSTEM)
	{
		put_token(r, bos);
		put_markup(r, "[INST] <<SYS>>\n");
		put_content(r, &msgs[0], true, false);
		put_markup(r, "\n<</SYS>>\n\n");
		inst_open = true;
		i = 1;
	}
	for (; i < n; i++)
	{
		if (msgs[i].role == CAI_ROLE_ASSISTANT)
		{
			if (inst_open)
			{
				put_markup(r, " [/INST]");
				inst_open = false;
			}
			put_content(r, &msgs[i], true, true);
			put_token(r, cai_tokenizer_eos(r->tok));
			continue;
		}
		if (inst_open)
		{
			put_content(r, &msgs[i], true, false);
			inst_open = false;
		}
		else
		{
			put_token(r, bos);
			put_markup(r, "[INST]");
			put_content(r, &msgs[i], true, true);
		}
		put_markup(r, " [/INST]");
	}
	if (gen && inst_open)
		put_markup(r, " [/INST]");
}

/* <|role|>\ncontent</s>\n ; generation prompt <|assistant|>\n (TinyLlama-chat, Zephyr) */
static void
render_zephyr(render_ctx *r, const cai_chat_message *msgs, int n, bool gen)
{
	for (int i = 0; i < n; i++)
	{
		put_role_markup(r, "<|", role_name(msgs[i].role), "|>\n");
		put_content(r, &msgs[i], false, false);
		put_token(r, cai_tokenizer_eos(r->tok));
		put_markup(r, "\n");
	}
	if (gen)
		put_markup(r, "<|assistant|>\n");
}

cai_status
cai_chat_template_render(const cai_chat_template *tmpl, const cai_tokenizer *tok,
						 const cai_chat_message *messages, int n_messages,
						 bool add_generation_prompt, cai_tokens *out, cai_error *err)
{
	return cai_chat_template_render_spans(tmpl, tok, messages, n_messages, add_generation_prompt,
										  out, NULL, err);
}

cai_status
cai_chat_template_render_spans(const cai_chat_template *tmpl, const cai_tokenizer *tok,
							   const cai_chat_message *messages, int n_messages,
							   bool add_generation_prompt, cai_tokens *out,
							   int32_t (*content_spans)[2], cai_error *err)
{
	return cai_chat_template_render_tools(tmpl, tok, messages, n_messages, NULL,
										  add_generation_prompt, out, content_spans, err);
}

/*
 * Tool results and calls are rendered wrapped in the family's markup (and results are grouped
 * into one turn), so no span of the output is their content alone: they report none.
 */
static void
drop_tool_spans(const cai_chat_message *messages, int n, int32_t (*content_spans)[2])
{
	for (int i = 0; content_spans && i < n; i++)
		if (messages[i].role == CAI_ROLE_TOOL || messages[i].tool_calls)
			content_spans[i][0] = content_spans[i][1] = -1;
}

cai_status
cai_chat_template_render_tools(const cai_chat_template *tmpl, const cai_tokenizer *tok,
							   const cai_chat_message *messages, int n_messages,
							   const cai_tool_set *tools, bool add_generation_prompt,
							   cai_tokens *out, int32_t (*content_spans)[2], cai_error *err)
{
	render_ctx	r;
	int			n_before;

	if (!tmpl || !tok || !out || n_messages < 0 || (n_messages > 0 && !messages))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "invalid arguments to render a chat prompt");
	for (int i = 0; i < n_messages; i++)
	{
		const cai_chat_message *m = &messages[i];

		if (m->role != CAI_ROLE_SYSTEM && m->role != CAI_ROLE_USER &&
			m->role != CAI_ROLE_ASSISTANT && m->role != CAI_ROLE_TOOL)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "message %d has an unknown role (%d)",
							i, (int) m->role);
		if (m->tokens && (m->role == CAI_ROLE_TOOL || m->tool_calls))
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"message %d is a tool %s and renders from its text: it cannot carry "
							"stored tokens", i, m->role == CAI_ROLE_TOOL ? "result" : "call");
		if (m->tokens)
		{
			if (m->n_tokens < 0)
				return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "message %d has a negative token count", i);
			for (int k = 0; k < m->n_tokens; k++)
				if (m->tokens[k] < 0 || m->tokens[k] >= cai_tokenizer_n_vocab(tok))
					return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
									"message %d holds token id %d, outside the vocabulary of %d",
									i, m->tokens[k], cai_tokenizer_n_vocab(tok));
		}
	}

	r.tok = tok;
	r.out = out;
	r.err = err;
	r.status = CAI_OK;
	r.messages = messages;
	r.content_spans = content_spans;
	r.tools = tools && tools->n_tools > 0 ? tools : NULL;
	/* the formats without tool markup of their own get the generic one, as plain turns */
	if ((r.tools || chat_has_tool_turns(messages, n_messages)) &&
		tmpl->kind != CAI_TEMPLATE_CHATML && tmpl->kind != CAI_TEMPLATE_LLAMA3)
	{
		r.status = render_generic_tools(tmpl, tok, messages, n_messages, r.tools,
										add_generation_prompt, out, content_spans, err);
		drop_tool_spans(messages, n_messages, content_spans);
		return r.status;
	}
	for (int i = 0; content_spans && i < n_messages; i++)
		content_spans[i][0] = content_spans[i][1] = -1;	/* a message the format drops */
	n_before = out->n;

	if (tmpl->kind != CAI_TEMPLATE_LLAMA2 && cai_tokenizer_add_bos(tok))
		put_token(&r, cai_tokenizer_bos(tok));
	switch (tmpl->kind)
	{
		case CAI_TEMPLATE_CHATML:
			render_chatml(&r, tmpl, messages, n_messages, add_generation_prompt);
			break;
		case CAI_TEMPLATE_LLAMA3:
			render_llama3(&r, messages, n_messages, add_generation_prompt);
			break;
		case CAI_TEMPLATE_GEMMA:
			render_gemma(&r, messages, n_messages, add_generation_prompt);
			break;
		case CAI_TEMPLATE_LLAMA2:
			render_llama2(&r, messages, n_messages, add_generation_prompt);
			break;
		case CAI_TEMPLATE_ZEPHYR:
			render_zephyr(&r, messages, n_messages, add_generation_prompt);
			break;
		default:
			r.status = cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "unknown chat template kind %d",
								(int) tmpl->kind);
			break;
	}
	if (r.status != CAI_OK)
		out->n = n_before;		/* nothing half-rendered is left behind */
	drop_tool_spans(messages, n_messages, content_spans);
	return r.status;
}

/* ---------------------------------------------------------------------------------------------
 * Tool calls (tools.h): the tools in the system prompt, assistant turns that made calls, and
 * the tools' results, in the family's format.
 *
 * Text we write around caller data is tokenized as markup, so that a marker such as Qwen's
 * <tool_call> becomes its own token as llama.cpp's rendering makes it; the caller data in it is
 * safe there: tool JSON is written by tojson (no '<' survives its escapes) and function names
 * are checked identifiers.  Message contents stay plain text.
 * ------------------------------------------------------------------------------------------- */

static bool
chat_has_tool_turns(const cai_chat_message *msgs, int n)
{
	for (int i = 0; i < n; i++)
		if (msgs[i].role == CAI_ROLE_TOOL || (msgs[i].tool_calls && msgs[i].tool_calls[0]))
			return true;
	return false;
}

static bool
buf_put(cai_buf *b, const char *s)
{
	return cai_buf_append(b, s, strlen(s));
}

/* Hermes' tool block (Qwen2.5/Qwen3's text), from "# Tools" to the last "</tool_call>". */
static bool
hermes_tools_text(const cai_tool_set *tools, cai_buf *b)
{
	bool		ok = buf_put(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
							 "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");

	for (int i = 0; ok && i < tools->n_tools; i++)
		ok = buf_put(b, "\n") && buf_put(b, tools->tools[i].tool_json);
	return ok && buf_put(b, "\n</tools>\n\nFor each function call, return a json object with function name "
						 "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
						 "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
}

/*
 * The calls of an assistant turn (tool_calls JSON: [{"name", "arguments"}, ...]) in format:
 * HERMES <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>, one per line; LLAMA3
 * {"name": "f", "parameters": {...}}, one per line.
 */
static cai_status
tool_calls_text(const char *calls, cai_tool_format format, cai_buf *b, cai_error *err)
{
	json_doc   *doc = NULL;
	const json_value *root;
	bool		ok = true;
	cai_status	st = json_parse(calls, strlen(calls), 0, &doc, err);

	if (st != CAI_OK)
		return st;
	root = json_doc_root(doc);
	if (root->type != JSON_ARRAY)
		ok = false;
	for (size_t i = 0; ok && i < root->u.array.n; i++)
	{
		const json_value *c = root->u.array.items[i];
		const json_value *name = c->type == JSON_OBJECT ? json_object_get(c, "name") : NULL;
		const json_value *args = c->type == JSON_OBJECT ? json_object_get(c, "arguments") : NULL;

		if (!name || name->type != JSON_STRING || !args)
		{
			json_doc_free(doc);
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"an assistant message's tool call %zu has no name or arguments", i);
		}
		ok = (i == 0 || buf_put(b, "\n")) &&
			buf_put(b, format == CAI_TOOL_FORMAT_HERMES ? "<tool_call>\n{\"name\": " : "{\"name\": ") &&
			cai_tool_json_write(name, 0, b) && buf_put(b, ", \"") &&
			buf_put(b, cai_tool_format_args_key(format)) && buf_put(b, "\": ") &&
			cai_tool_json_write(args, 0, b) &&
			buf_put(b, format == CAI_TOOL_FORMAT_HERMES ? "}\n</tool_call>" : "}");
	}
	json_doc_free(doc);
	if (!ok)
		return root && root->type != JSON_ARRAY ?
			cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "an assistant message's tool calls are not an array") :
			cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory rendering tool calls");
	return CAI_OK;
}

/* Appends b's text as markup (see above for why that is safe) and empties b. */
static void
put_buf_markup(render_ctx *r, cai_buf *b)
{
	if (r->status == CAI_OK)
		put_text(r, b->data, b->len, true);
	b->len = 0;
}

/* The first occurrence of marker in text[0..len), or NULL. */
static const char *
find_bytes(const char *text, size_t len, const char *marker)
{
	size_t		m = strlen(marker);

	for (size_t i = 0; i + m <= len; i++)
		if (memcmp(text + i, marker, m) == 0)
			return text + i;
	return NULL;
}

/*
 * Appends text as plain text, except the tool markers the vocabulary has as tokens of their own
 * (Qwen's <tool_call>, Qwen3's <tool_response>): those become their tokens.  That is how
 * llama.cpp tokenizes a rendered template, which cuts the text only at such tokens.
 */
static void
put_tool_text(render_ctx *r, const char *text, size_t len)
{
	static const char *const markers[] = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"};

	while (r->status == CAI_OK && len > 0)
	{
		size_t		cut = len;
		int32_t		id = -1;
		size_t		mlen = 0;

		for (int k = 0; k < 4; k++)
		{
			int32_t		t = cai_tokenizer_find(r->tok, markers[k]);
			const char *at;

			if (!cai_tokenizer_is_special(r->tok, t))
				continue;
			at = find_bytes(text, len, markers[k]);
			if (at && (size_t) (at - text) < cut)
			{
				cut = (size_t) (at - text);
				id = t;
				mlen = strlen(markers[k]);
			}
		}
		put_text(r, text, cut, false);
		put_token(r, id);
		text += cut + mlen;
		len -= cut + mlen;
	}
}

/* The calls of m after before (NULL: "\n", m's content and "\n"), through put_tool_text. */
static void
put_tool_calls(render_ctx *r, const cai_chat_message *m, cai_tool_format format, const char *before)
{
	cai_buf		b = {0};

	if (r->status != CAI_OK)
		return;
	if (before ? !buf_put(&b, before) :
		(!buf_put(&b, "\n") || !buf_put(&b, m->content) || !buf_put(&b, "\n")))
		r->status = cai_fail(r->err, CAI_ERR_NO_MEMORY, "out of memory rendering tool calls");
	else if ((r->status = tool_calls_text(m->tool_calls, format, &b, r->err)) == CAI_OK)
		put_tool_text(r, b.data, b.len);
	cai_buf_free(&b);
}

/*
 * Qwen's system turn with the tools: the system prompt (or the default), then the block.  The
 * prompt and the block up to its first marker are one plain text, as llama.cpp tokenizes them
 * (".\n\n" is one token where the prompt ends with a period); the rest is markup.
 */
static void
put_chatml_tools_system(render_ctx *r, const cai_chat_template *tmpl, const cai_chat_message *sys)
{
	cai_buf		b = {0};
	const char *lead = sys ? (sys->content ? sys->content : "") : tmpl->default_system;
	size_t		plain;

	put_markup(r, "<|im_start|>system\n");
	if (sys && sys->tokens)
	{
		/* stored ids are spliced as they are: the block starts a piece of its own */
		put_content(r, sys, false, false);
		lead = "";
	}
	if (!buf_put(&b, lead ? lead : "") || !buf_put(&b, lead ? "\n\n" : "") ||
		!hermes_tools_text(r->tools, &b) || !buf_put(&b, "<|im_end|>\n") ||
		!cai_buf_append(&b, "", 1))
	{
		r->status = cai_fail(r->err, CAI_ERR_NO_MEMORY, "out of memory rendering tools");
		cai_buf_free(&b);
		return;
	}
	if (sys && sys->tokens)
		memmove(b.data, b.data + 2, b.len - 2);	/* no prompt text: no "\n\n" from it */
	plain = strlen(b.data) - strlen("<|im_end|>\n");
	if (sys && !sys->tokens && r->content_spans)
		r->content_spans[sys - r->messages][0] = r->out->n;
	put_tool_text(r, b.data, plain);
	if (sys && !sys->tokens && r->content_spans)
		r->content_spans[sys - r->messages][1] = r->out->n;
	put_markup(r, "<|im_end|>\n");
	cai_buf_free(&b);
}

/*
 * The results msgs[i..] (consecutive tool messages) in one user turn, each
 * "\n<tool_response>\n...\n</tool_response>", as one text; returns the index after them.
 */
static int
put_chatml_results(render_ctx *r, const cai_chat_message *msgs, int i, int n)
{
	cai_buf		b = {0};
	bool		ok = true;
	int			first = i;

	for (; i < n && msgs[i].role == CAI_ROLE_TOOL && ok; i++)
		ok = buf_put(&b, "\n<tool_response>\n") && buf_put(&b, msgs[i].content ? msgs[i].content : "") &&
			buf_put(&b, "\n</tool_response>");
	put_markup(r, "<|im_start|>user");
	if (!ok)
		r->status = cai_fail(r->err, CAI_ERR_NO_MEMORY, "out of memory rendering tool results");
	for (int k = first; r->content_spans && k < i; k++)
		r->content_spans[k][0] = r->out->n;
	put_tool_text(r, b.data, b.len);
	for (int k = first; r->content_spans && k < i; k++)
		r->content_spans[k][1] = r->out->n;
	put_markup(r, "<|im_end|>\n");
	cai_buf_free(&b);
	return i;
}

/* ChatML with Qwen2.5/Qwen3's tool markup (their templates' output for the same messages). */
static void
render_chatml_tools(render_ctx *r, const cai_chat_template *tmpl, const cai_chat_message *msgs,
					int n, bool gen)
{
	int			i = 0;

	if (r->tools)
	{
		put_chatml_tools_system(r, tmpl, n > 0 && msgs[0].role == CAI_ROLE_SYSTEM ? &msgs[0] : NULL);
		i = n > 0 && msgs[0].role == CAI_ROLE_SYSTEM ? 1 : 0;
	}
	else if (n > 0 && msgs[0].role != CAI_ROLE_SYSTEM && tmpl->default_system)
	{
		put_markup(r, "<|im_start|>system\n");
		put_text(r, tmpl->default_system, strlen(tmpl->default_system), false);
		put_markup(r, "<|im_end|>\n");
	}
	for (; i < n; i++)
	{
		const cai_chat_message *m = &msgs[i];

		if (m->role == CAI_ROLE_TOOL)
		{
			i = put_chatml_results(r, msgs, i, n) - 1;
			continue;
		}
		if (m->role == CAI_ROLE_ASSISTANT && m->tool_calls && m->tool_calls[0])
		{
			put_markup(r, "<|im_start|>assistant");
			if (m->tokens && m->n_tokens > 0)
			{
				put_markup(r, "\n");
				put_content(r, m, false, false);
			}
			/* "\n" + content + the calls: one text, as llama.cpp tokenizes it */
			put_tool_calls(r, m, CAI_TOOL_FORMAT_HERMES,
						   m->tokens || !(m->content && m->content[0]) ? "\n" : NULL);
			put_markup(r, "<|im_end|>\n");
			continue;
		}
		put_role_markup(r, "<|im_start|>", role_name(m->role), "\n");
		put_content(r, m, false, false);
		put_markup(r, "<|im_end|>\n");
	}
	if (gen)
		put_markup(r, "<|im_start|>assistant\n");
}

/*
 * A tool's result as Llama 3.1's template writes it: through tojson (a string is "iterable" to
 * Jinja, so even text comes out quoted).  Plain text to the tokenizer: it is caller data.
 */
static void
put_tool_result_json(render_ctx *r, const cai_chat_message *m)
{
	json_value	v;
	cai_buf		b = {0};
	const char *text = m->content ? m->content : "";

	if (r->status != CAI_OK)
		return;
	memset(&v, 0, sizeof(v));
	v.type = JSON_STRING;
	v.u.string.bytes = text;
	v.u.string.len = strlen(text);
	if (r->content_spans)
		r->content_spans[m - r->messages][0] = r->out->n;
	if (!cai_tool_json_write(&v, 0, &b))
		r->status = cai_fail(r->err, CAI_ERR_NO_MEMORY, "out of memory rendering tools");
	else
		put_text(r, b.data, b.len, false);
	if (r->content_spans)
		r->content_spans[m - r->messages][1] = r->out->n;
	cai_buf_free(&b);
}

/*
 * Llama 3.1's JSON tool calling (its template's defaults: tools in the first user message, the
 * date of 26 Jul 2024): the tools (tojson, indent 4) open the first user message, a call is the
 * assistant's whole turn, results are "ipython" turns.
 */
static void
render_llama3_tools(render_ctx *r, const cai_chat_message *msgs, int n, bool gen)
{
	bool		tools_put = r->tools == NULL;
	int			i = 0;

	/* Llama 3.1's system turn, always there, with its default date */
	put_markup(r, "<|start_header_id|>system<|end_header_id|>\n\n");
	put_markup(r, r->tools ? "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" :
			   "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
	if (n > 0 && msgs[0].role == CAI_ROLE_SYSTEM)
		put_content(r, &msgs[i++], true, false);
	put_markup(r, "<|eot_id|>");
	for (; i < n; i++)
	{
		const cai_chat_message *m = &msgs[i];

		if (m->role == CAI_ROLE_ASSISTANT && m->tool_calls && m->tool_calls[0])
		{
			put_markup(r, "<|start_header_id|>assistant<|end_header_id|>\n\n");
			put_tool_calls(r, m, CAI_TOOL_FORMAT_LLAMA3, "");
			put_markup(r, "<|eot_id|>");
			continue;
		}
		put_role_markup(r, "<|start_header_id|>", m->role == CAI_ROLE_TOOL ? "ipython" :
						role_name(m->role), "<|end_header_id|>\n\n");
		if (!tools_put && m->role == CAI_ROLE_USER)
		{
			cai_buf		b = {0};
			bool		ok = buf_put(&b, "Given the following functions, please respond with a JSON for a "
									 "function call with its proper arguments that best answers the given "
									 "prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
									 "dictionary of argument name and its value}.Do not use variables.\n\n");

			for (int t = 0; ok && t < r->tools->n_tools; t++)
				ok = buf_put(&b, r->tools->tools[t].tool_json_indent) && buf_put(&b, "\n\n");
			if (!ok)
				r->status = cai_fail(r->err, CAI_ERR_NO_MEMORY, "out of memory rendering tools");
			put_buf_markup(r, &b);
			cai_buf_free(&b);
			tools_put = true;
		}
		if (m->role == CAI_ROLE_TOOL)
			put_tool_result_json(r, m);
		else
			put_content(r, m, true, false);
		put_markup(r, "<|eot_id|>");
	}
	if (gen)
		put_markup(r, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* A copy of text[0..len) + suffix, or NULL when out of memory. */
static char *
concat_text(const char *a, const char *b, const char *c)
{
	size_t		la = strlen(a),
				lb = strlen(b),
				lc = strlen(c);
	char	   *s = malloc(la + lb + lc + 1);

	if (s)
	{
		memcpy(s, a, la);
		memcpy(s + la, b, lb);
		memcpy(s + la + lb, c, lc + 1);
	}
	return s;
}

/*
 * The generic format, for templates without tool markup (SmolLM2's is ChatML, which takes
 * Qwen's; Gemma, Llama 2, Zephyr here): Hermes' text in plain turns of the family's own
 * markup.  The tool block follows the system prompt (a system turn of its own when there is
 * none); calls are assistant text; each result is a user turn "<tool_response>\n...\n
 * </tool_response>".  All of it is plain text to the tokenizer.
 */
static cai_status
render_generic_tools(const cai_chat_template *tmpl, const cai_tokenizer *tok,
					 const cai_chat_message *msgs, int n, const cai_tool_set *tools, bool gen,
					 cai_tokens *out, int32_t (*content_spans)[2], cai_error *err)
{
	int			shift = tools && !(n > 0 && msgs[0].role == CAI_ROLE_SYSTEM) ? 1 : 0;
	cai_chat_message *m2 = calloc((size_t) n + 1, sizeof(*m2));
	char	  **owned = calloc((size_t) n + 1, sizeof(char *));
	int32_t   (*spans2)[2] = content_spans ? calloc((size_t) n + 1, sizeof(*spans2)) : NULL;
	cai_buf		b = {0};
	cai_status	st = CAI_OK;

	if (!m2 || !owned || (content_spans && !spans2) ||
		(tools && (!buf_put(&b, "\n\n") || !hermes_tools_text(tools, &b) || !cai_buf_append(&b, "", 1))))
		st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory rendering tools");
	for (int i = 0; st == CAI_OK && i < n; i++)
	{
		const cai_chat_message *m = &msgs[i];
		cai_buf		calls = {0};

		m2[i + shift] = *m;
		m2[i + shift].tool_calls = NULL;
		if (i == 0 && tools && !shift)
			owned[i] = concat_text(m->content ? m->content : "", "", "");
		else if (m->role == CAI_ROLE_TOOL)
		{
			m2[i + shift].role = CAI_ROLE_USER;
			owned[i] = concat_text("<tool_response>\n", m->content ? m->content : "", "\n</tool_response>");
		}
		else if (m->tool_calls && m->tool_calls[0])
		{
			if ((st = tool_calls_text(m->tool_calls, CAI_TOOL_FORMAT_HERMES, &calls, err)) != CAI_OK)
				break;
			if (!cai_buf_append(&calls, "", 1))
				st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory rendering tools");
			else
				owned[i] = concat_text(m->content ? m->content : "", m->content && m->content[0] ? "\n" : "",
									   calls.data);
			cai_buf_free(&calls);
		}
		else
			continue;
		if (st == CAI_OK && !owned[i])
			st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory rendering tools");
		m2[i + shift].content = owned[i];
		m2[i + shift].tokens = NULL;	/* the text changed: tokenize it */
	}
	if (st == CAI_OK && tools)
	{
		/* the block follows the system prompt in one plain text */
		char	   *sys = concat_text(shift ? "" : owned[0], "", shift ? b.data + 2 : b.data);

		if (!sys)
			st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory rendering tools");
		else
		{
			free(owned[n]);
			owned[n] = sys;
			m2[0].role = CAI_ROLE_SYSTEM;
			m2[0].content = sys;
			m2[0].tokens = NULL;
			m2[0].tool_calls = NULL;
		}
	}
	if (st == CAI_OK)
		st = cai_chat_template_render_tools(tmpl, tok, m2, n + shift, NULL, gen, out, spans2, err);
	for (int i = 0; st == CAI_OK && content_spans && i < n; i++)
	{
		content_spans[i][0] = spans2[i + shift][0];
		content_spans[i][1] = spans2[i + shift][1];
	}
	for (int i = 0; owned && i <= n; i++)
		free(owned[i]);
	free(owned);
	free(m2);
	free(spans2);
	cai_buf_free(&b);
	return st;
}
