/*
 * fuzz_tools.c — the tools payload: declarations (tools.c) on arbitrary bytes, their rendering
 * in every family's tool format, and a walk of a generated call under the tool constraint.
 *
 * Input: a flags byte (bit 0: the Llama 3 format instead of Hermes; bit 1: "required" instead
 * of the first tool named), then the tools JSON text, all of the rest.  Checks:
 *  - cai_tool_set_parse: CAI_OK, or an error status with a message (never a crash);
 *  - for a set that parses: rendering a conversation with the tools, an assistant call and a
 *    tool result succeeds in the chatml, llama3 and gemma formats;
 *  - the constraint over the JSON-shaped tokenizer of grammar_fixtures.h: a walk of allowed
 *    tokens (chosen by a hash of the input) never meets an empty mask before the call is
 *    complete, accept() takes every allowed token, and a finished call reads back as a call
 *    of a declared tool (of the named one when one is named) whose arguments are valid under
 *    its schema (json_validate.h).
 *
 * Built by tests/fuzz/fuzz.mk like every tests/fuzz/fuzz_*.c.
 */
#include "fuzz_common.h"

#include "chat_template.h"
#include "grammar.h"
#include "grammar_fixtures.h"
#include "json.h"
#include "json_validate.h"
#include "tools.h"

#define MAX_STEPS 400

static void
check_render(const cai_tokenizer *tok, const cai_tool_set *set)
{
	static const char *const formats[] = {"chatml", "llama3", "gemma"};
	char		calls[256];
	cai_chat_message msgs[3];
	cai_chat_template tmpl;
	cai_error	err;

	snprintf(calls, sizeof(calls), "[{\"name\": \"%s\", \"arguments\": {\"a\": [1, \"<|im_end|>\"]}}]",
			 set->tools[0].name);
	memset(msgs, 0, sizeof(msgs));
	msgs[0] = (cai_chat_message) {CAI_ROLE_USER, "hi", NULL, 0, NULL};
	msgs[1] = (cai_chat_message) {CAI_ROLE_ASSISTANT, "", NULL, 0, calls};
	msgs[2] = (cai_chat_message) {CAI_ROLE_TOOL, "42", NULL, 0, NULL};
	for (int f = 0; f < 3; f++)
	{
		cai_tokens	t;

		cai_tokens_init(&t);
		FUZZ_CHECK(cai_chat_template_by_name(formats[f], tok, &tmpl, &err) == CAI_OK);
		FUZZ_CHECK(cai_chat_template_render_tools(&tmpl, tok, msgs, 3, set, true, &t, NULL, &err) == CAI_OK);
		cai_tokens_free(&t);
	}
}

/* A finished call reads back as a call of a declared tool whose arguments validate. */
static void
check_call(const char *text, size_t len, const uint8_t *tools, size_t size, const char *named)
{
	char	   *name = NULL,
			   *args = NULL;
	json_doc   *doc = NULL,
			   *inst = NULL;
	cai_error	err;
	bool		found = false;

	FUZZ_CHECK(cai_tool_reply_parse(text, len, &name, &args, &err) == CAI_OK);
	FUZZ_CHECK(!named || strcmp(name, named) == 0);
	FUZZ_CHECK(json_parse((const char *) tools, size, 0, &doc, &err) == CAI_OK);
	/* (a free-form argument object may repeat a key, as a typed reply's may) */
	FUZZ_CHECK(json_parse(args, strlen(args), JSON_DUPLICATE_KEYS, &inst, &err) == CAI_OK);
	for (size_t i = 0; i < json_doc_root(doc)->u.array.n; i++)
	{
		const json_value *fn = json_object_get(json_doc_root(doc)->u.array.items[i], "function");
		const json_value *params = json_object_get(fn, "parameters");

		if (strcmp(json_object_get(fn, "name")->u.string.bytes, name) != 0)
			continue;
		found = true;
		if (params)
			FUZZ_CHECK(jv_validate(params, params, json_doc_root(inst), 0));
	}
	FUZZ_CHECK(found);
	json_doc_free(doc);
	json_doc_free(inst);
	free(name);
	free(args);
}

static void
walk(const cai_tokenizer *tok, const cai_token_index *index, const cai_tool_set *set,
	 uint8_t flags, const uint8_t *data, size_t size)
{
	cai_tool_format format = flags & 1 ? CAI_TOOL_FORMAT_LLAMA3 : CAI_TOOL_FORMAT_HERMES;
	const char *named = flags & 2 ? NULL : set->tools[0].name;
	int			words = cai_token_index_mask_words(index);
	int			n_vocab = cai_token_index_n_vocab(index);
	uint64_t   *bits = malloc(sizeof(uint64_t) * (size_t) words);
	cai_tool_state *state = NULL;
	cai_error	err;
	cai_buf		text = {0};
	uint64_t	h = 1469598103934665603ull;
	char		piece[256];

	for (size_t i = 0; i < size; i++)
		h = (h ^ data[i]) * 1099511628211ull;
	FUZZ_CHECK(bits);
	/* a declared schema that no value satisfies is refused here, not earlier */
	if (cai_tool_state_create(set, named, true, format, tok, index, &state, &err) != CAI_OK)
	{
		free(bits);
		return;
	}
	for (int step = 0; step < MAX_STEPS; step++)
	{
		int			n_allowed = 0,
					pick;
		int32_t		id = -1;
		bool		end = false;

		FUZZ_CHECK(cai_tool_state_allowed(state, bits) == 1);
		for (int t = 0; t < n_vocab; t++)
			n_allowed += (bits[t / 64] >> (t % 64)) & 1;
		FUZZ_CHECK(n_allowed > 0);
		h = h * 6364136223846793005ull + 1442695040888963407ull;
		pick = (int) ((h >> 33) % (uint64_t) n_allowed);
		for (int t = 0; t < n_vocab && id < 0; t++)
			if (((bits[t / 64] >> (t % 64)) & 1) && pick-- == 0)
				id = t;
		/* heading for the end in the second half of the walk: take an end token when allowed */
		for (int t = 0; step > MAX_STEPS / 2 && t < n_vocab; t++)
			if (((bits[t / 64] >> (t % 64)) & 1) && cai_tokenizer_is_special(tok, t))
				id = t, end = true;
		end = end || cai_tokenizer_is_special(tok, id);
		FUZZ_CHECK(cai_tool_state_accept(state, id));
		if (end)
		{
			check_call(text.data ? text.data : "", text.len, data, size, named);
			break;
		}
		{
			int			n = cai_tokenizer_token_bytes(tok, id, piece, sizeof(piece));

			FUZZ_CHECK(n >= 0 && n <= (int) sizeof(piece));
			FUZZ_CHECK(cai_buf_append(&text, piece, (size_t) n));
		}
	}
	cai_buf_free(&text);
	cai_tool_state_free(state);
	free(bits);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static cai_tokenizer *tok;
	static cai_token_index *index;
	cai_tool_set *set = NULL;
	cai_error	err;
	cai_status	st;

	if (size < 1)
		return 0;
	if (!tok)
	{
		int32_t		end = FIXTURE_JSON_EOS;

		tok = fixture_json_bpe();
		FUZZ_CHECK(tok && cai_token_index_create(tok, &end, 1, &index, &err) == CAI_OK);
	}
	st = cai_tool_set_parse((const char *) data + 1, size - 1, &set, &err);
	if (st != CAI_OK)
	{
		FUZZ_CHECK(set == NULL && err.message[0] != '\0');
		return 0;
	}
	if (cai_tool_set_count(set) > 0)
	{
		check_render(tok, set);
		walk(tok, index, set, data[0], data + 1, size - 1);
	}
	cai_tool_set_free(set);
	return 0;
}
