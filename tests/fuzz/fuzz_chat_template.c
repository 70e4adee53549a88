/*
 * fuzz_chat_template.c — chat template detection from an arbitrary tokenizer.chat_template
 * string (or a template name), and rendering of arbitrary message lists: roles (invalid ones
 * too), contents, stored token ids (out of range ones too), with and without the generation
 * prompt, through cai_chat_template_render_spans over each fixture tokenizer and through
 * cai_chat_build_prompt (truncation limits) over a tiny synthetic model.
 *
 * Input: a flags byte, the Jinja text, an architecture, a template name, max_prompt_tokens,
 * then the messages (role, kind, content or ids).  Invariants:
 *  - detection always succeeds, its end-of-turn token is -1 or a special token; a name is found
 *    exactly when it is one of the five;
 *  - rendering refuses invalid messages with CAI_ERR_INVALID_ARGUMENT and leaves the output as it
 *    was; otherwise every id is in the vocabulary, stored ids land unchanged where the content
 *    span says, rendering messages [0, k) is a token prefix of rendering [0, k+1), and the
 *    generation prompt is a prefix of the assistant turn that answers it;
 *  - cai_chat_build_prompt's prompt fits max_prompt_tokens, equals the rendering of the messages
 *    it says it kept, hands back the last message's stored ids; CAI_ERR_CONTEXT_FULL only when
 *    even the shortest allowed rendering (the system messages and the last one) does not fit.
 */
#include "fuzz_common.h"	/* first: it defines _GNU_SOURCE */

#include "chat_template.h"
#include "model.h"

#define MAX_MESSAGES 10
#define MAX_CONTENT 256
#define MAX_JINJA 1024
#define MAX_IDS 24

static const char *const template_names[] = {"chatml", "llama3", "gemma", "llama2", "zephyr"};

/* A tiny model for cai_chat_build_prompt, loaded once. */
static cai_model *
tiny_model(void)
{
	static cai_model *model;

	if (!model)
	{
		synth_model_config cfg;
		cai_model_params params;
		cai_error	err;
		uint8_t    *image;
		size_t		size;

		synth_model_default_config(&cfg);
		cfg.n_layers = 1;
		cfg.d_model = 32;
		cfg.d_ff = 64;
		FUZZ_CHECK(synth_model_write_buffer(&cfg, &image, &size, &err) == CAI_OK);
		cai_model_params_default(&params);
		params.n_threads = 1;
		FUZZ_CHECK(fuzz_model_load(image, size, &params, &model, &err) == CAI_OK);
		free(image);
	}
	return model;
}

typedef struct fuzz_messages
{
	cai_chat_message m[MAX_MESSAGES];
	int			n;
	char	   *content[MAX_MESSAGES];
	int32_t		ids[MAX_MESSAGES][MAX_IDS];
} fuzz_messages;

static void
read_messages(fuzz_input *in, fuzz_messages *msgs)
{
	msgs->n = 1 + fuzz_u8(in) % MAX_MESSAGES;
	for (int i = 0; i < msgs->n; i++)
	{
		cai_chat_message *m = &msgs->m[i];
		uint8_t		role = fuzz_u8(in);
		uint8_t		kind = fuzz_u8(in);
		size_t		len;

		m->role = (role & 3) < 3 ? (cai_role) (role & 3) : (cai_role) (role >> 2) - 8;
		msgs->content[i] = fuzz_chunk(in, MAX_CONTENT, &len);
		m->content = (kind & 2) ? NULL : msgs->content[i];
		m->tokens = NULL;
		m->n_tokens = 0;
		m->tool_calls = NULL;
		if (kind & 1)
		{
			m->tokens = msgs->ids[i];
			m->n_tokens = (kind >> 2) % (MAX_IDS + 1);
			if (m->n_tokens == MAX_IDS && (kind & 0x80))
				m->n_tokens = -1;
			for (int k = 0; k < MAX_IDS; k++)
				msgs->ids[i][k] = (int32_t) (fuzz_u16(in) % 400) - 2;
		}
	}
}

/* True when messages render (valid roles; stored ids in the vocabulary). */
static bool
messages_valid(const cai_chat_message *m, int n, int n_vocab)
{
	for (int i = 0; i < n; i++)
	{
		if (m[i].role != CAI_ROLE_SYSTEM && m[i].role != CAI_ROLE_USER &&
			m[i].role != CAI_ROLE_ASSISTANT && m[i].role != CAI_ROLE_TOOL)
			return false;
		if (m[i].role == CAI_ROLE_TOOL && m[i].tokens)
			return false;			/* a tool result renders from its text */
		if (m[i].tokens && m[i].n_tokens < 0)
			return false;
		for (int k = 0; m[i].tokens && k < m[i].n_tokens; k++)
			if (m[i].tokens[k] < 0 || m[i].tokens[k] >= n_vocab)
				return false;
	}
	return true;
}

/* a[0..n) == b[0..n) (either may be NULL when n is 0) */
static bool
ids_equal(const int32_t *a, const int32_t *b, int n)
{
	return n == 0 || memcmp(a, b, (size_t) n * sizeof(int32_t)) == 0;
}

static bool
is_prefix(const cai_tokens *a, const cai_tokens *b)
{
	return a->n <= b->n && ids_equal(a->ids, b->ids, a->n);
}

static bool
is_trim_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* s[0..*len) without white space at either end. */
static const char *
trim(const char *s, size_t *len)
{
	while (*len > 0 && is_trim_space(s[0]))
		s++, (*len)--;
	while (*len > 0 && is_trim_space(s[*len - 1]))
		(*len)--;
	return s;
}

/*
 * The ids a message's text became: never a special token (content is not parsed for them), and
 * with byte-level BPE exactly the text, or (formats that trim) the trimmed text, possibly after
 * one space (Llama 2 spells it out).
 */
static void
check_content(const cai_chat_template *tmpl, const cai_tokenizer *tok, bool bpe,
			  const cai_chat_message *m, const int32_t *ids, int n)
{
	const char *text = m->content ? m->content : "";
	size_t		len = strlen(text);
	size_t		got_len;
	char	   *got;
	const char *g;

	for (int i = 0; i < n; i++)
		FUZZ_CHECK(!cai_tokenizer_is_special(tok, ids[i]));
	if (!bpe)
		return;
	got = fuzz_token_text(tok, ids, n, false, &got_len);
	g = got;
	if (tmpl->kind != CAI_TEMPLATE_CHATML && tmpl->kind != CAI_TEMPLATE_ZEPHYR)
	{
		text = trim(text, &len);
		g = trim(got, &got_len);
	}
	FUZZ_CHECK(got_len == len && memcmp(g, text, len) == 0);
	free(got);
}

/*
 * Renders m[0..n) into out (emptied first); checks the spans, the ids and (bpe: a byte-level
 * BPE tokenizer) the contents.
 */
static cai_status
render(const cai_chat_template *tmpl, const cai_tokenizer *tok, bool bpe,
	   const cai_chat_message *m, int n, bool gen, cai_tokens *out)
{
	int32_t		spans[MAX_MESSAGES][2];
	cai_error	err;
	cai_status	st;
	int			n_vocab = cai_tokenizer_n_vocab(tok);

	out->n = 0;
	FUZZ_CHECK(cai_tokens_push(out, 12345));	/* rendering appends; a failure leaves this */
	st = cai_chat_template_render_spans(tmpl, tok, m, n, gen, out, spans, &err);
	FUZZ_CHECK(out->n >= 1 && out->ids[0] == 12345);
	memmove(out->ids, out->ids + 1, (size_t) (out->n - 1) * sizeof(int32_t));
	out->n--;
	if (st != CAI_OK)
	{
		FUZZ_CHECK(out->n == 0);
		return st;
	}
	for (int i = 0; i < out->n; i++)
		FUZZ_CHECK(out->ids[i] >= 0 && out->ids[i] < n_vocab);
	for (int i = 0; i < n; i++)
	{
		int32_t		start = spans[i][0] - 1;
		int32_t		end = spans[i][1] - 1;

		if (spans[i][0] < 0)
		{
			FUZZ_CHECK(spans[i][1] < 0);
			continue;
		}
		FUZZ_CHECK(start >= 0 && start <= end && end <= out->n);
		if (m[i].tokens)
			FUZZ_CHECK(end - start == m[i].n_tokens &&
					   ids_equal(out->ids + start, m[i].tokens, m[i].n_tokens));
		else
			check_content(tmpl, tok, bpe, &m[i], out->ids + start, end - start);
	}
	return CAI_OK;
}

/* A tool result, or an assistant turn that made calls. */
static bool
is_tool_turn(const cai_chat_message *m)
{
	return m->role == CAI_ROLE_TOOL || (m->tool_calls && m->tool_calls[0]);
}

static bool
any_tool_turn(const cai_chat_message *m, int n)
{
	for (int i = 0; i < n; i++)
		if (is_tool_turn(&m[i]))
			return true;
	return false;
}

/* Rendering over one tokenizer: validity, and the prefix properties the prefix cache needs. */
static void
check_render(const cai_chat_template *tmpl, const cai_tokenizer *tok, bool bpe,
			 const fuzz_messages *msgs)
{
	bool		valid = messages_valid(msgs->m, msgs->n, cai_tokenizer_n_vocab(tok));
	cai_tokens	prev,
				cur,
				gen;
	cai_status	st;

	cai_tokens_init(&prev);
	cai_tokens_init(&cur);
	cai_tokens_init(&gen);
	st = render(tmpl, tok, bpe, msgs->m, msgs->n, true, &cur);
	FUZZ_CHECK(valid ? st == CAI_OK : st == CAI_ERR_INVALID_ARGUMENT);
	if (valid)
	{
		FUZZ_CHECK(render(tmpl, tok, bpe, msgs->m, 0, false, &prev) == CAI_OK);
		for (int k = 1; k <= msgs->n; k++)
		{
			FUZZ_CHECK(render(tmpl, tok, bpe, msgs->m, k, false, &cur) == CAI_OK);
			/*
			 * A conversation's first tool turn moves a family to its tool form (Llama 3.1's
			 * opens with its dated system preamble), so the prefix holds from there on.
			 */
			if (!(is_tool_turn(&msgs->m[k - 1]) && !any_tool_turn(msgs->m, k - 1)))
				FUZZ_CHECK(is_prefix(&prev, &cur));
			if (k >= 2 && msgs->m[k - 1].role == CAI_ROLE_ASSISTANT)
			{
				FUZZ_CHECK(render(tmpl, tok, bpe, msgs->m, k - 1, true, &gen) == CAI_OK);
				FUZZ_CHECK(is_prefix(&gen, &cur));
			}
			prev.n = 0;
			FUZZ_CHECK(cai_tokens_append(&prev, cur.ids, cur.n));
		}
	}
	cai_tokens_free(&prev);
	cai_tokens_free(&cur);
	cai_tokens_free(&gen);
}

/* cai_chat_build_prompt over the tiny model, with the detected template in it. */
static void
check_build_prompt(cai_model *model, const fuzz_messages *msgs, const cai_prompt_params *params)
{
	const cai_chat_message *m = msgs->m;
	int			n = msgs->n;
	bool		valid = messages_valid(m, n, model->cfg.n_vocab);
	cai_prompt	prompt;
	cai_error	err;
	cai_status	st;
	cai_chat_message kept[MAX_MESSAGES];
	int			n_kept = 0;
	cai_tokens	ref;

	for (int i = 0; i < n; i++)
		valid &= m[i].tokens != NULL || m[i].content != NULL;
	st = cai_chat_build_prompt(model, m, n, params, &prompt, &err);
	if (!valid || params->max_prompt_tokens < 0)
	{
		FUZZ_CHECK(st == CAI_ERR_INVALID_ARGUMENT);
		FUZZ_CHECK(prompt.ids == NULL && prompt.last_content_ids == NULL);
		return;
	}
	FUZZ_CHECK(st == CAI_OK || st == CAI_ERR_CONTEXT_FULL);
	cai_tokens_init(&ref);
	if (st == CAI_ERR_CONTEXT_FULL)
	{
		/* even the messages it may not drop are over the limit */
		FUZZ_CHECK(params->max_prompt_tokens > 0);
		for (int i = 0; i < n; i++)
			if (m[i].role == CAI_ROLE_SYSTEM || i == n - 1 || !params->truncate)
				kept[n_kept++] = m[i];
		FUZZ_CHECK(render(&model->tmpl, model->tokenizer, true, kept, n_kept,
						  params->add_generation_prompt, &ref) == CAI_OK);
		FUZZ_CHECK(ref.n > params->max_prompt_tokens);
		FUZZ_CHECK(prompt.ids == NULL);
		cai_tokens_free(&ref);
		return;
	}
	FUZZ_CHECK(params->max_prompt_tokens == 0 || prompt.n_ids <= params->max_prompt_tokens);
	FUZZ_CHECK(prompt.first_message >= 0 && prompt.first_message <= n - 1);
	FUZZ_CHECK(params->truncate || prompt.first_message == 0);
	for (int i = 0; i < n; i++)
		if (m[i].role == CAI_ROLE_SYSTEM || i >= prompt.first_message)
			kept[n_kept++] = m[i];
	FUZZ_CHECK(render(&model->tmpl, model->tokenizer, true, kept, n_kept, params->add_generation_prompt,
					  &ref) == CAI_OK);
	FUZZ_CHECK(ref.n == prompt.n_ids && ids_equal(ref.ids, prompt.ids, ref.n));
	if (m[n - 1].tokens)
		FUZZ_CHECK(prompt.n_last_content_ids == m[n - 1].n_tokens &&
				   ids_equal(prompt.last_content_ids, m[n - 1].tokens, m[n - 1].n_tokens));
	FUZZ_CHECK(prompt.n_last_content_ids >= 0 && prompt.n_last_content_ids <= prompt.n_ids);
	cai_tokens_free(&ref);
	cai_prompt_free(&prompt);
}

/* Picks the template: by name, or detected from the Jinja text and the architecture. */
static void
pick_template(uint8_t flags, const char *jinja, const char *arch, const char *name,
			  const cai_tokenizer *tok, cai_chat_template *tmpl)
{
	cai_error	err;

	if (flags & 4)
	{
		bool		known = false;

		for (size_t i = 0; i < sizeof(template_names) / sizeof(template_names[0]); i++)
			known |= strcmp(name, template_names[i]) == 0;
		if (cai_chat_template_by_name(name, tok, tmpl, &err) == CAI_OK)
		{
			FUZZ_CHECK(known);
			return;
		}
		FUZZ_CHECK(!known);
	}
	FUZZ_CHECK(cai_chat_template_detect(jinja, arch, tok, tmpl, &err) == CAI_OK);
	FUZZ_CHECK(tmpl->end_of_turn == -1 || cai_tokenizer_is_special(tok, tmpl->end_of_turn));
	FUZZ_CHECK(strcmp(cai_chat_template_name(tmpl->kind), "unknown") != 0);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_input	in = {data, size};
	uint8_t		flags = fuzz_u8(&in);
	uint8_t		arch_pick = fuzz_u8(&in);
	size_t		len;
	char	   *jinja = fuzz_chunk(&in, MAX_JINJA, &len);
	char	   *arch_text = fuzz_chunk(&in, 16, &len);
	char	   *name = fuzz_chunk(&in, 16, &len);
	static const char *const archs[] = {NULL, "llama", "qwen2", "gemma3"};
	const char *arch = arch_pick < 4 ? archs[arch_pick] : arch_text;
	cai_prompt_params params;
	fuzz_messages msgs;
	cai_chat_template tmpl;
	cai_model  *model = tiny_model();
	const cai_tokenizer *tok = fuzz_tokenizer(flags >> 5);

	memset(&params, 0, sizeof(params));	/* fields not drawn below (tools) stay unset */
	params.max_prompt_tokens = (int16_t) fuzz_u16(&in);
	params.add_generation_prompt = flags & 1;
	params.truncate = flags & 2;
	read_messages(&in, &msgs);

	pick_template(flags, (flags & 8) ? NULL : jinja, arch, name, tok, &tmpl);
	check_render(&tmpl, tok, fuzz_tokenizer_is_bpe(flags >> 5), &msgs);

	pick_template(flags, (flags & 8) ? NULL : jinja, arch, name, model->tokenizer, &model->tmpl);
	check_build_prompt(model, &msgs, &params);

	for (int i = 0; i < msgs.n; i++)
		free(msgs.content[i]);
	free(jinja);
	free(arch_text);
	free(name);
	return 0;
}
