/*
 * chat_template.h — chat prompt formats, rendered straight to token ids.
 *
 * The formats are the model families' published templates, recognised from the GGUF's
 * tokenizer.chat_template (a Jinja source we do not execute) or chosen by name.  Markup is
 * tokenized with special tokens parsed; message content never is (parse_special false), and
 * content ids given by the caller are spliced in unchanged so that a stored conversation renders
 * to exactly the tokens that were cached.
 */
#ifndef CAI_CHAT_TEMPLATE_H
#define CAI_CHAT_TEMPLATE_H

#include "cai.h"
#include "tokenizer.h"
#include "util.h"

typedef enum cai_template_kind
{
	CAI_TEMPLATE_CHATML = 0,	/* <|im_start|>role\n...<|im_end|>\n  (SmolLM2, Qwen2) */
	CAI_TEMPLATE_LLAMA3,		/* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
	CAI_TEMPLATE_GEMMA,			/* <start_of_turn>user\n...<end_of_turn>\n (no system role) */
	CAI_TEMPLATE_LLAMA2,		/* [INST] <<SYS>>...<</SYS>> ... [/INST] (Llama 2) */
	CAI_TEMPLATE_ZEPHYR			/* <|user|>\n...</s>\n<|assistant|>\n (TinyLlama-chat, Zephyr) */
} cai_template_kind;

typedef struct cai_chat_template
{
	cai_template_kind kind;
	int32_t		end_of_turn;	/* the token that ends an assistant turn (-1: use EOS) */
	const char *default_system; /* system prompt the template adds when none is given, or NULL */
} cai_chat_template;

/* Picks the template from jinja source (may be NULL) and the architecture name. */
cai_status	cai_chat_template_detect(const char *jinja, const char *arch,
									 const cai_tokenizer *tok, cai_chat_template *out,
									 cai_error *err);

/* "chatml", "llama3", "gemma", "llama2", "zephyr"; CAI_ERR_NOT_FOUND for others. */
cai_status	cai_chat_template_by_name(const char *name, const cai_tokenizer *tok,
									  cai_chat_template *out, cai_error *err);

const char *cai_chat_template_name(cai_template_kind kind);

/*
 * Appends the rendering of messages[0..n) to out; with add_generation_prompt, ends with the
 * assistant header.  BOS is included when the tokenizer wants one.
 */
cai_status	cai_chat_template_render(const cai_chat_template *tmpl, const cai_tokenizer *tok,
									 const cai_chat_message *messages, int n_messages,
									 bool add_generation_prompt, cai_tokens *out,
									 cai_error *err);

/*
 * The same, also reporting where each message's content landed: content_spans[i] = [start, end)
 * token indices in out ({-1, -1} for a message the format leaves out).  The ids of a content
 * rendered from text are exactly what a stored turn must keep to render the same tokens later.
 */
cai_status	cai_chat_template_render_spans(const cai_chat_template *tmpl,
										   const cai_tokenizer *tok,
										   const cai_chat_message *messages, int n_messages,
										   bool add_generation_prompt, cai_tokens *out,
										   int32_t (*content_spans)[2], cai_error *err);

/*
 * As cai_chat_template_render_spans, showing the model tools (NULL: none) in its family's tool
 * format (tools.h); assistant messages with tool_calls and CAI_ROLE_TOOL messages render in that
 * format too, with or without tools.
 */
cai_status	cai_chat_template_render_tools(const cai_chat_template *tmpl,
										   const cai_tokenizer *tok,
										   const cai_chat_message *messages, int n_messages,
										   const cai_tool_set *tools, bool add_generation_prompt,
										   cai_tokens *out, int32_t (*content_spans)[2],
										   cai_error *err);

#endif							/* CAI_CHAT_TEMPLATE_H */
