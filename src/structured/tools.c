/*
 * tools.c — tool declarations parsed and checked, written as Jinja's tojson does, and the
 * per-request constraint on generated calls (tools.h).
 */
#include "tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

/* ---------------------------------------------------------------------------------------------
 * tojson
 * ------------------------------------------------------------------------------------------- */

static bool
buf_str(cai_buf *out, const char *s)
{
	return cai_buf_append(out, s, strlen(s));
}

/* Decodes the UTF-8 sequence at s[0..len) (the parser has validated it); its length. */
static int
utf8_decode(const unsigned char *s, size_t len, uint32_t *cp)
{
	if (s[0] < 0x80 || len < 2)
		return *cp = s[0], 1;
	if ((s[0] & 0xe0) == 0xc0)
		return *cp = ((uint32_t) (s[0] & 0x1f) << 6) | (s[1] & 0x3f), 2;
	if ((s[0] & 0xf0) == 0xe0 && len >= 3)
		return *cp = ((uint32_t) (s[0] & 0x0f) << 12) | ((uint32_t) (s[1] & 0x3f) << 6) |
			(s[2] & 0x3f), 3;
	if (len >= 4)
		return *cp = ((uint32_t) (s[0] & 0x07) << 18) | ((uint32_t) (s[1] & 0x3f) << 12) |
			((uint32_t) (s[2] & 0x3f) << 6) | (s[3] & 0x3f), 4;
	return *cp = s[0], 1;
}

/*
 * A string as Python's json.dumps(ensure_ascii=True) writes it, then with the HTML-safe
 * escapes of Jinja's tojson (<, >, & and ' as \u escapes).
 */
static bool
tojson_string(const char *s, size_t len, cai_buf *out)
{
	const unsigned char *p = (const unsigned char *) s;
	char		esc[16];
	bool		ok = cai_buf_append(out, "\"", 1);

	for (size_t i = 0; i < len && ok;)
	{
		uint32_t	cp;
		int			n = utf8_decode(p + i, len - i, &cp);

		i += (size_t) n;
		if (cp == '"')
			ok = buf_str(out, "\\\"");
		else if (cp == '\\')
			ok = buf_str(out, "\\\\");
		else if (cp == '\n')
			ok = buf_str(out, "\\n");
		else if (cp == '\r')
			ok = buf_str(out, "\\r");
		else if (cp == '\t')
			ok = buf_str(out, "\\t");
		else if (cp == '\b')
			ok = buf_str(out, "\\b");
		else if (cp == '\f')
			ok = buf_str(out, "\\f");
		else if (cp < 0x20 || cp >= 0x7f || cp == '<' || cp == '>' || cp == '&' || cp == '\'')
		{
			if (cp >= 0x10000)
			{
				uint32_t	v = cp - 0x10000;

				snprintf(esc, sizeof(esc), "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
			}
			else
				snprintf(esc, sizeof(esc), "\\u%04x", cp);
			ok = buf_str(out, esc);
		}
		else
		{
			char		c = (char) cp;

			ok = cai_buf_append(out, &c, 1);
		}
	}
	return ok && cai_buf_append(out, "\"", 1);
}

static bool
tojson_newline(cai_buf *out, int indent, int depth)
{
	if (!cai_buf_append(out, "\n", 1))
		return false;
	for (int i = 0; i < indent * depth; i++)
		if (!cai_buf_append(out, " ", 1))
			return false;
	return true;
}

static bool tojson_value(const json_value *v, int indent, int depth, cai_buf *out);

static bool
tojson_object(const json_value *v, int indent, int depth, cai_buf *out)
{
	size_t		n = v->u.object.n;
	const json_member **sorted;
	bool		ok = true;

	if (n == 0)
		return buf_str(out, "{}");
	sorted = malloc(sizeof(*sorted) * n);
	if (!sorted)
		return false;
	for (size_t i = 0; i < n; i++)
		sorted[i] = &v->u.object.members[i];
	qsort(sorted, n, sizeof(*sorted), cai_json_member_ptr_cmp);
	ok = buf_str(out, "{");
	for (size_t i = 0; i < n && ok; i++)
	{
		if (i > 0)
			ok = buf_str(out, indent > 0 ? "," : ", ");
		if (ok && indent > 0)
			ok = tojson_newline(out, indent, depth + 1);
		ok = ok && tojson_string(sorted[i]->key, sorted[i]->key_len, out) &&
			buf_str(out, ": ") && tojson_value(sorted[i]->value, indent, depth + 1, out);
	}
	if (ok && indent > 0)
		ok = tojson_newline(out, indent, depth);
	free(sorted);
	return ok && buf_str(out, "}");
}

static bool
tojson_value(const json_value *v, int indent, int depth, cai_buf *out)
{
	bool		ok = true;

	switch (v->type)
	{
		case JSON_NULL:
			return buf_str(out, "null");
		case JSON_FALSE:
			return buf_str(out, "false");
		case JSON_TRUE:
			return buf_str(out, "true");
		case JSON_NUMBER:
			return cai_buf_append(out, v->u.number.text, v->u.number.len);
		case JSON_STRING:
			return tojson_string(v->u.string.bytes, v->u.string.len, out);
		case JSON_OBJECT:
			return tojson_object(v, indent, depth, out);
		case JSON_ARRAY:
			if (v->u.array.n == 0)
				return buf_str(out, "[]");
			ok = buf_str(out, "[");
			for (size_t i = 0; i < v->u.array.n && ok; i++)
			{
				if (i > 0)
					ok = buf_str(out, indent > 0 ? "," : ", ");
				if (ok && indent > 0)
					ok = tojson_newline(out, indent, depth + 1);
				ok = ok && tojson_value(v->u.array.items[i], indent, depth + 1, out);
			}
			if (ok && indent > 0)
				ok = tojson_newline(out, indent, depth);
			return ok && buf_str(out, "]");
	}
	return false;
}

bool
cai_tool_json_write(const json_value *v, int indent, cai_buf *out)
{
	return tojson_value(v, indent, 0, out);
}

/* ---------------------------------------------------------------------------------------------
 * Declarations
 * ------------------------------------------------------------------------------------------- */

cai_tool_format
cai_tool_format_for_template(int template_kind)
{
	/* Llama 3.x calls are bare JSON; every other family speaks (or is taught) Hermes' tags */
	return template_kind == 1 ? CAI_TOOL_FORMAT_LLAMA3 : CAI_TOOL_FORMAT_HERMES;
}

const char *
cai_tool_format_args_key(cai_tool_format format)
{
	return format == CAI_TOOL_FORMAT_LLAMA3 ? "parameters" : "arguments";
}

void
cai_tool_set_free(cai_tool_set *set)
{
	if (!set)
		return;
	for (int i = 0; i < set->n_tools; i++)
	{
		free(set->tools[i].name);
		free(set->tools[i].tool_json);
		free(set->tools[i].tool_json_indent);
		free(set->tools[i].params_json);
	}
	free(set->tools);
	free(set);
}

int
cai_tool_set_find(const cai_tool_set *set, const char *name)
{
	for (int i = 0; set && name && i < set->n_tools; i++)
		if (strcmp(set->tools[i].name, name) == 0)
			return i;
	return -1;
}

int
cai_tool_set_count(const cai_tool_set *set)
{
	return set ? set->n_tools : 0;
}

static char *
buf_take(cai_buf *b)
{
	char	   *s;

	if (!cai_buf_append(b, "", 1))
	{
		cai_buf_free(b);
		return NULL;
	}
	s = b->data;
	b->data = NULL;
	b->len = b->cap = 0;
	return s;
}

/* A function's name: what OpenAI allows ([a-zA-Z0-9_-], 1..64), so that it is safe in markup. */
static bool
valid_tool_name(const char *s, size_t len)
{
	if (len < 1 || len > 64)
		return false;
	for (size_t i = 0; i < len; i++)
	{
		char		c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			  c == '_' || c == '-'))
			return false;
	}
	return true;
}

/* One declaration {"type": "function", "function": {"name", "description", "parameters"}}. */
static cai_status
parse_tool(const json_value *t, int i, cai_tool *out, cai_error *err)
{
	const json_value *type = json_object_get(t, "type");
	const json_value *fn = json_object_get(t, "function");
	const json_value *name;
	const json_value *params;
	const json_value *desc;
	cai_buf		b = {0};
	cai_grammar *g = NULL;
	cai_status	st;

	if (t->type != JSON_OBJECT)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "tools[%d] is not an object", i);
	if (!type || type->type != JSON_STRING || strcmp(type->u.string.bytes, "function") != 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "tools[%d] must have \"type\": \"function\"", i);
	if (!fn || fn->type != JSON_OBJECT)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "tools[%d] has no \"function\" object", i);
	for (size_t k = 0; k < fn->u.object.n; k++)
	{
		const char *key = fn->u.object.members[k].key;

		if (strcmp(key, "name") != 0 && strcmp(key, "description") != 0 &&
			strcmp(key, "parameters") != 0 && strcmp(key, "strict") != 0)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"tools[%d].function has an unknown key \"%s\"", i, key);
	}
	name = json_object_get(fn, "name");
	if (!name || name->type != JSON_STRING)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "tools[%d].function has no \"name\" string", i);
	if (!valid_tool_name(name->u.string.bytes, name->u.string.len))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"tools[%d].function.name must be 1 to 64 letters, digits, '_' or '-'", i);
	desc = json_object_get(fn, "description");
	if (desc && desc->type != JSON_STRING)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"tools[%d].function.description must be a string", i);
	params = json_object_get(fn, "parameters");
	if (params && params->type != JSON_OBJECT)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"tools[%d].function.parameters must be a JSON Schema object", i);

	out->name = strdup(name->u.string.bytes);
	if (!out->name)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory reading tools");
	if (params)
	{
		if (!json_serialize(params, &b) || !(out->params_json = buf_take(&b)))
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory reading tools");
	}
	else if (!(out->params_json = strdup("{\"type\": \"object\", \"properties\": {}}")))
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory reading tools");

	/* the schema alone first, so that its error names the tool */
	st = cai_grammar_from_schema(out->params_json, strlen(out->params_json), &g, err);
	cai_grammar_free(g);
	if (st != CAI_OK)
	{
		cai_error	inner = *err;

		return cai_fail(err, st, "tools[%d] (\"%s\").function.parameters: %s", i, out->name,
						inner.message);
	}
	if (!cai_tool_json_write(t, 0, &b) || !(out->tool_json = buf_take(&b)) ||
		!cai_tool_json_write(t, 4, &b) || !(out->tool_json_indent = buf_take(&b)))
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory reading tools");
	return CAI_OK;
}

cai_status
cai_tool_set_parse(const char *json, size_t len, cai_tool_set **out, cai_error *err)
{
	json_doc   *doc = NULL;
	const json_value *root;
	cai_tool_set *set;
	cai_status	st;

	*out = NULL;
	st = json_parse(json, len, 0, &doc, err);
	if (st != CAI_OK)
		return st;
	root = json_doc_root(doc);
	if (root->type != JSON_ARRAY)
	{
		json_doc_free(doc);
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "tools must be an array of tool declarations");
	}
	if (root->u.array.n > CAI_MAX_TOOLS)
	{
		json_doc_free(doc);
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "at most %d tools may be given, not %zu",
						CAI_MAX_TOOLS, root->u.array.n);
	}
	set = calloc(1, sizeof(*set));
	if (set)
		set->tools = calloc(root->u.array.n ? root->u.array.n : 1, sizeof(cai_tool));
	if (!set || !set->tools)
	{
		free(set);
		json_doc_free(doc);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory reading tools");
	}
	for (size_t i = 0; i < root->u.array.n && st == CAI_OK; i++)
	{
		set->n_tools++;
		st = parse_tool(root->u.array.items[i], (int) i, &set->tools[i], err);
		if (st == CAI_OK && cai_tool_set_find(set, set->tools[i].name) != (int) i)
			st = cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "tools[%zu]: the function name \"%s\" is declared twice",
						  i, set->tools[i].name);
	}
	json_doc_free(doc);
	if (st != CAI_OK)
	{
		cai_tool_set_free(set);
		return st;
	}
	*out = set;
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The grammar of a call
 * ------------------------------------------------------------------------------------------- */

/*
 * Appends the schema v with every local $ref ("#/...") moved under base, the JSON pointer
 * where v sits in the combined schema, so that references still find their targets.
 */
static bool
write_rebased(const json_value *v, const char *base, cai_buf *out)
{
	bool		ok = true;

	if (v->type == JSON_ARRAY)
	{
		ok = buf_str(out, "[");
		for (size_t i = 0; i < v->u.array.n && ok; i++)
			ok = (i == 0 || buf_str(out, ",")) && write_rebased(v->u.array.items[i], base, out);
		return ok && buf_str(out, "]");
	}
	if (v->type != JSON_OBJECT)
		return json_serialize(v, out);
	ok = buf_str(out, "{");
	for (size_t i = 0; i < v->u.object.n && ok; i++)
	{
		const json_member *m = &v->u.object.members[i];

		ok = (i == 0 || buf_str(out, ",")) && json_serialize_string(m->key, m->key_len, out) &&
			buf_str(out, ":");
		if (ok && strcmp(m->key, "$ref") == 0 && m->value->type == JSON_STRING &&
			m->value->u.string.bytes[0] == '#')
		{
			cai_buf		ref = {0};

			ok = buf_str(&ref, "#") && buf_str(&ref, base) &&
				cai_buf_append(&ref, m->value->u.string.bytes + 1, m->value->u.string.len - 1) &&
				json_serialize_string(ref.data, ref.len, out);
			cai_buf_free(&ref);
		}
		else if (ok)
			ok = write_rebased(m->value, base, out);
	}
	return ok && buf_str(out, "}");
}

/*
 * The schema of one call among tools (all of them, or the one named only):
 * {"anyOf": [{"type": "object", "properties": {"name": {"const": NAME}, KEY: PARAMETERS},
 * "required": ["name", KEY]}, ...]}.
 */
static cai_status
call_schema(const cai_tool_set *tools, const char *only, const char *key, cai_buf *out,
			cai_error *err)
{
	bool		ok = buf_str(out, "{\"anyOf\":[");
	int			n = 0;

	for (int i = 0; i < tools->n_tools && ok; i++)
	{
		const cai_tool *t = &tools->tools[i];
		json_doc   *doc = NULL;
		char		base[96];
		cai_status	st;

		if (only && strcmp(only, t->name) != 0)
			continue;
		st = json_parse(t->params_json, strlen(t->params_json), 0, &doc, err);
		if (st != CAI_OK)
			return st;
		snprintf(base, sizeof(base), "/anyOf/%d/properties/%s", n, key);
		ok = (n == 0 || buf_str(out, ",")) &&
			buf_str(out, "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":") &&
			json_serialize_string(t->name, strlen(t->name), out) &&
			buf_str(out, "},\"") && buf_str(out, key) && buf_str(out, "\":") &&
			write_rebased(json_doc_root(doc), base, out) &&
			buf_str(out, "},\"required\":[\"name\",\"") && buf_str(out, key) &&
			buf_str(out, "\"],\"additionalProperties\":false}");
		json_doc_free(doc);
		n++;
	}
	if (ok && n == 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "tool_choice names \"%s\", which is not among the tools",
						only ? only : "");
	if (!ok || !buf_str(out, "]}"))
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory compiling the tools' grammar");
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The state
 * ------------------------------------------------------------------------------------------- */

typedef enum tool_phase
{
	PHASE_UNDECIDED = 0,		/* "auto": the first token decides */
	PHASE_TEXT,					/* a plain reply: nothing constrained */
	PHASE_MARKER,				/* inside the opening marker */
	PHASE_CALL					/* inside the call's JSON */
} tool_phase;

struct cai_tool_state
{
	cai_grammar *grammar;
	cai_grammar_state *json;
	const cai_tokenizer *tok;
	const cai_token_index *index;
	const char *marker;			/* "" when the call is the bare JSON object */
	size_t		marker_len;
	size_t		marker_pos;		/* bytes of the marker generated */
	int32_t		marker_token;	/* the vocabulary's single token for the marker, or -1 */
	tool_phase	phase;
	char	   *bytes;			/* scratch for a token's bytes */
	int			bytes_cap;
};

cai_status
cai_tool_state_create(const cai_tool_set *tools, const char *forced_name, bool forced,
					  cai_tool_format format, const cai_tokenizer *tok,
					  const cai_token_index *index, cai_tool_state **out, cai_error *err)
{
	cai_tool_state *s;
	cai_buf		schema = {0};
	cai_status	st;

	*out = NULL;
	if (!tools || tools->n_tools == 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "tool_choice needs tools");
	s = calloc(1, sizeof(*s));
	if (!s)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory compiling the tools' grammar");
	s->tok = tok;
	s->index = index;
	/* the newline is Qwen's; the JSON after it is compact (see below) */
	s->marker = format == CAI_TOOL_FORMAT_HERMES ? "<tool_call>\n" : "";
	s->marker_len = strlen(s->marker);
	s->marker_token = s->marker_len ? cai_tokenizer_find(tok, "<tool_call>") : -1;
	s->phase = forced ? (s->marker_len ? PHASE_MARKER : PHASE_CALL) : PHASE_UNDECIDED;
	s->bytes_cap = cai_tokenizer_max_token_bytes(tok) + 1;
	s->bytes = malloc((size_t) s->bytes_cap);
	st = s->bytes ? call_schema(tools, forced_name, cai_tool_format_args_key(format), &schema, err) :
		cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory compiling the tools' grammar");
	if (st == CAI_OK)
		st = cai_grammar_from_schema(schema.data, schema.len, &s->grammar, err);
	/*
	 * Compact JSON, as the templates render calls: free whitespace lets a small model fill a
	 * call with newlines until max_tokens
	 */
	if (st == CAI_OK)
		cai_grammar_set_whitespace(s->grammar, CAI_JSON_WS_COMPACT);
	if (st == CAI_OK)
		st = cai_grammar_state_create(s->grammar, index, &s->json, err);
	cai_buf_free(&schema);
	if (st != CAI_OK)
	{
		cai_tool_state_free(s);
		return st;
	}
	*out = s;
	return CAI_OK;
}

void
cai_tool_state_free(cai_tool_state *state)
{
	if (!state)
		return;
	cai_grammar_state_free(state->json);
	cai_grammar_free(state->grammar);
	free(state->bytes);
	free(state);
}

bool
cai_tool_state_in_call(const cai_tool_state *state)
{
	return state->phase == PHASE_MARKER || state->phase == PHASE_CALL;
}

/* True when token id may come next inside the marker. */
static bool
marker_allows(cai_tool_state *s, int32_t id)
{
	int			n;

	if (id == s->marker_token && s->marker_pos == 0)
		return true;
	if (cai_tokenizer_is_special(s->tok, id))
		return false;
	n = cai_tokenizer_token_bytes(s->tok, id, s->bytes, s->bytes_cap);
	/* pieces that end inside or exactly at the marker's end: the JSON starts on a fresh token */
	return n > 0 && n <= s->bytes_cap && (size_t) n <= s->marker_len - s->marker_pos &&
		memcmp(s->bytes, s->marker + s->marker_pos, (size_t) n) == 0;
}

int
cai_tool_state_allowed(cai_tool_state *state, uint64_t *bits)
{
	int			n_vocab;

	switch (state->phase)
	{
		case PHASE_UNDECIDED:
		case PHASE_TEXT:
			return 0;
		case PHASE_CALL:
			return cai_grammar_state_allowed(state->json, bits) ? 1 : -1;
		case PHASE_MARKER:
			n_vocab = cai_token_index_n_vocab(state->index);
			memset(bits, 0, sizeof(uint64_t) * (size_t) cai_token_index_mask_words(state->index));
			for (int32_t id = 0; id < n_vocab; id++)
				if (marker_allows(state, id))
					bits[id / 64] |= UINT64_C(1) << (id % 64);
			return 1;
	}
	return -1;
}

/* Advances the marker by id (allowed); the call's JSON starts once the marker is whole. */
static void
marker_advance(cai_tool_state *s, int32_t id)
{
	if (id == s->marker_token)
		s->marker_pos += strlen("<tool_call>");
	else
		s->marker_pos += (size_t) cai_tokenizer_token_bytes(s->tok, id, s->bytes, s->bytes_cap);
	if (s->marker_pos >= s->marker_len)
		s->phase = PHASE_CALL;
}

/* Under "auto", whether the first token starts a call (and then takes it). */
static bool
undecided_accept(cai_tool_state *s, int32_t id)
{
	int			n;
	bool		blank = true;

	if (s->marker_len > 0)
	{
		s->phase = marker_allows(s, id) ? PHASE_MARKER : PHASE_TEXT;
		if (s->phase == PHASE_MARKER)
			marker_advance(s, id);
		return true;
	}
	/* a bare-JSON call starts with its object: whitespace alone does not decide */
	n = cai_tokenizer_token_bytes(s->tok, id, s->bytes, s->bytes_cap);
	for (int i = 0; i < n && i < s->bytes_cap; i++)
		blank = blank && json_is_ws((unsigned char) s->bytes[i]);
	if (n > 0 && !blank && !cai_tokenizer_is_special(s->tok, id) &&
		cai_grammar_state_accept(s->json, id))
		s->phase = PHASE_CALL;
	else
		s->phase = PHASE_TEXT;
	return true;
}

bool
cai_tool_state_accept(cai_tool_state *state, int32_t id)
{
	switch (state->phase)
	{
		case PHASE_UNDECIDED:
			return undecided_accept(state, id);
		case PHASE_TEXT:
			return true;
		case PHASE_MARKER:
			if (!marker_allows(state, id))
				return false;
			marker_advance(state, id);
			return true;
		case PHASE_CALL:
			return cai_grammar_state_accept(state->json, id);
	}
	return false;
}

/* ---------------------------------------------------------------------------------------------
 * Reading a reply back
 * ------------------------------------------------------------------------------------------- */

static bool
skip_prefix(const char **p, const char *end, const char *prefix)
{
	size_t		n = strlen(prefix);

	if ((size_t) (end - *p) < n || memcmp(*p, prefix, n) != 0)
		return false;
	*p += n;
	return true;
}

cai_status
cai_tool_reply_parse(const char *text, size_t len, char **name, char **arguments, cai_error *err)
{
	const char *p = text;
	const char *end = text + len;
	json_doc   *doc = NULL;
	const json_value *root;
	const json_value *n;
	const json_value *args;
	cai_buf		b = {0};
	cai_status	st;

	*name = *arguments = NULL;
	while (p < end && json_is_ws((unsigned char) *p))
		p++;
	(void) skip_prefix(&p, end, "<tool_call>");
	while (end > p && json_is_ws((unsigned char) end[-1]))
		end--;
	if ((size_t) (end - p) >= strlen("</tool_call>") &&
		memcmp(end - strlen("</tool_call>"), "</tool_call>", strlen("</tool_call>")) == 0)
		end -= strlen("</tool_call>");
	/*
	 * An argument the schema leaves free ("type": "object" alone) may repeat a key: the
	 * constraint cannot rule that out, and RFC 8259 only says keys SHOULD be unique (jsonb keeps
	 * the last), so a constrained call always reads back.
	 */
	st = json_parse(p, (size_t) (end - p), JSON_DUPLICATE_KEYS, &doc, err);
	if (st != CAI_OK)
		return st;
	root = json_doc_root(doc);
	n = root->type == JSON_OBJECT ? json_object_get(root, "name") : NULL;
	args = root->type == JSON_OBJECT ? json_object_get(root, "arguments") : NULL;
	if (!args && root->type == JSON_OBJECT)
		args = json_object_get(root, "parameters");
	if (!n || n->type != JSON_STRING || !args)
	{
		json_doc_free(doc);
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "the reply is not a tool call");
	}
	*name = strdup(n->u.string.bytes);
	if (*name && json_serialize(args, &b) && cai_buf_append(&b, "", 1))
		*arguments = b.data;
	else
		cai_buf_free(&b);
	json_doc_free(doc);
	if (!*name || !*arguments)
	{
		free(*name);
		*name = NULL;
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory reading a tool call");
	}
	return CAI_OK;
}
