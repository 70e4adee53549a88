/*
 * json.c — strict JSON parsing into a tree, and compact serialization (see json.h).
 *
 * Recursive descent; recursion is bounded by JSON_MAX_DEPTH.  Every node, string and member
 * array lives in one arena owned by the document, so freeing is one walk over its blocks.
 */
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"
#include "util.h"

/* ---------------------------------------------------------------------------------------------
 * The arena
 * ------------------------------------------------------------------------------------------- */

typedef struct arena_block
{
	struct arena_block *next;
	size_t		used;
	size_t		cap;
	_Alignas(16) unsigned char data[];
} arena_block;

struct json_doc
{
	arena_block *blocks;
	json_value *root;
};

#define ARENA_BLOCK 16384

static void *
arena_alloc(json_doc *doc, size_t n)
{
	arena_block *b = doc->blocks;
	void	   *p;

	n = (n + 15) & ~(size_t) 15;
	if (n == 0)
		n = 16;
	if (!b || b->cap - b->used < n)
	{
		size_t		cap = n > ARENA_BLOCK ? n : ARENA_BLOCK;
		size_t		bytes;

		if (!cai_add_size(sizeof(arena_block), cap, &bytes))
			return NULL;
		b = malloc(bytes);
		if (!b)
			return NULL;
		b->used = 0;
		b->cap = cap;
		b->next = doc->blocks;
		doc->blocks = b;
	}
	p = b->data + b->used;
	b->used += n;
	return p;
}

void
json_doc_free(json_doc *doc)
{
	if (!doc)
		return;
	while (doc->blocks)
	{
		arena_block *next = doc->blocks->next;

		free(doc->blocks);
		doc->blocks = next;
	}
	free(doc);
}

const json_value *
json_doc_root(const json_doc *doc)
{
	return doc->root;
}

/* ---------------------------------------------------------------------------------------------
 * The parser
 * ------------------------------------------------------------------------------------------- */

typedef struct parser
{
	json_doc   *doc;
	const char *s;
	size_t		len;
	size_t		pos;
	cai_error  *err;
	cai_status	status;			/* of the first failure */
	unsigned	flags;
	/* scratch for unescaping a string (reused) */
	char	   *scratch;
	size_t		scratch_cap;
} parser;

static bool
fail_at(parser *p, size_t at, const char *what)
{
	if (p->status == CAI_OK)
		p->status = cai_fail(p->err, CAI_ERR_INVALID_ARGUMENT, "invalid JSON at byte %zu: %s",
							 at, what);
	return false;
}

static bool
fail_oom(parser *p)
{
	if (p->status == CAI_OK)
		p->status = cai_fail(p->err, CAI_ERR_NO_MEMORY, "out of memory parsing JSON");
	return false;
}

static void
skip_ws(parser *p)
{
	while (p->pos < p->len && json_is_ws(p->s[p->pos]))
		p->pos++;
}

/* Four hex digits at p->pos (which it advances), or -1. */
static int
parse_hex4(parser *p)
{
	int			v = 0;

	if (p->len - p->pos < 4)
		return -1;
	for (int i = 0; i < 4; i++)
	{
		int			h = json_hex_value(p->s[p->pos + i]);

		if (h < 0)
			return -1;
		v = v * 16 + h;
	}
	p->pos += 4;
	return v;
}

/* A string at p->pos (its opening quote); the unescaped bytes go to the arena. */
static bool
parse_string(parser *p, const char **out, size_t *out_len)
{
	size_t		n = 0;
	size_t		start = p->pos;
	char	   *copy;

	p->pos++;					/* the opening quote */
	for (;;)
	{
		unsigned char c;

		if (p->pos >= p->len)
			return fail_at(p, start, "unterminated string");
		c = (unsigned char) p->s[p->pos];
		/* an unescaped character takes at most 4 bytes, an escape at most 4 (a pair: 12 -> 4) */
		if (!cai_grow((void **) &p->scratch, &p->scratch_cap, n + 5, 1))
			return fail_oom(p);
		if (c == '"')
		{
			p->pos++;
			break;
		}
		if (c < 0x20)
			return fail_at(p, p->pos, "control character in a string (it must be escaped)");
		if (c == '\\')
		{
			size_t		esc = p->pos;
			char		e;

			if (p->pos + 1 >= p->len)
				return fail_at(p, esc, "unterminated escape in a string");
			e = p->s[p->pos + 1];
			p->pos += 2;
			switch (e)
			{
				case '"':
				case '\\':
				case '/':
					p->scratch[n++] = e;
					break;
				case 'b':
					p->scratch[n++] = '\b';
					break;
				case 'f':
					p->scratch[n++] = '\f';
					break;
				case 'n':
					p->scratch[n++] = '\n';
					break;
				case 'r':
					p->scratch[n++] = '\r';
					break;
				case 't':
					p->scratch[n++] = '\t';
					break;
				case 'u':
					{
						int			hi = parse_hex4(p);
						uint32_t	cpt;

						if (hi < 0)
							return fail_at(p, esc, "\\u must be followed by four hex digits");
						cpt = (uint32_t) hi;
						if (hi >= 0xDC00 && hi <= 0xDFFF)
							return fail_at(p, esc, "unpaired low surrogate escape");
						if (hi >= 0xD800 && hi <= 0xDBFF)
						{
							int			lo;

							if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
								return fail_at(p, esc, "unpaired high surrogate escape");
							p->pos += 2;
							lo = parse_hex4(p);
							if (lo < 0xDC00 || lo > 0xDFFF)
								return fail_at(p, esc, "unpaired high surrogate escape");
							cpt = 0x10000 + (((uint32_t) hi - 0xD800) << 10) + ((uint32_t) lo - 0xDC00);
						}
						n += cai_utf8_encode(cpt, p->scratch + n);
						break;
					}
				default:
					return fail_at(p, esc, "invalid escape in a string");
			}
			continue;
		}
		if (c < 0x80)
		{
			p->scratch[n++] = (char) c;
			p->pos++;
		}
		else
		{
			uint32_t	cpt;
			int			k = cai_utf8_decode((const unsigned char *) p->s + p->pos,
											p->len - p->pos, &cpt);

			if (k == 0)
				return fail_at(p, p->pos, "invalid UTF-8 in a string");
			memcpy(p->scratch + n, p->s + p->pos, k);
			n += k;
			p->pos += k;
		}
	}
	copy = arena_alloc(p->doc, n + 1);
	if (!copy)
		return fail_oom(p);
	memcpy(copy, p->scratch, n);
	copy[n] = '\0';
	*out = copy;
	*out_len = n;
	return true;
}

/* A number at p->pos: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static bool
parse_number(parser *p, json_value *v)
{
	size_t		start = p->pos;
	size_t		i = p->pos;
	char	   *copy;

	if (i < p->len && p->s[i] == '-')
		i++;
	if (i >= p->len || !json_is_digit(p->s[i]))
		return fail_at(p, start, "invalid number");
	if (p->s[i] == '0')
	{
		i++;
		if (i < p->len && json_is_digit(p->s[i]))
			return fail_at(p, start, "leading zero in a number");
	}
	else
		while (i < p->len && json_is_digit(p->s[i]))
			i++;
	if (i < p->len && p->s[i] == '.')
	{
		i++;
		if (i >= p->len || !json_is_digit(p->s[i]))
			return fail_at(p, start, "a number's fraction needs a digit");
		while (i < p->len && json_is_digit(p->s[i]))
			i++;
	}
	if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E'))
	{
		i++;
		if (i < p->len && (p->s[i] == '+' || p->s[i] == '-'))
			i++;
		if (i >= p->len || !json_is_digit(p->s[i]))
			return fail_at(p, start, "a number's exponent needs a digit");
		while (i < p->len && json_is_digit(p->s[i]))
			i++;
	}
	v->type = JSON_NUMBER;
	copy = arena_alloc(p->doc, i - start + 1);
	if (!copy)
		return fail_oom(p);
	memcpy(copy, p->s + start, i - start);
	copy[i - start] = '\0';
	v->u.number.text = copy;
	v->u.number.len = i - start;
	p->pos = i;
	return true;
}

static bool parse_value(parser *p, json_value *v, int depth);

/* A growable array of values or members while a container is being parsed. */
typedef struct gather
{
	void	   *items;
	size_t		n;
	size_t		cap;
} gather;

static bool
gather_push(gather *g, const void *item, size_t size)
{
	if (!cai_grow(&g->items, &g->cap, g->n + 1, size))
		return false;
	memcpy((char *) g->items + g->n * size, item, size);
	g->n++;
	return true;
}

/* Moves a gathered array into the arena. */
static void *
gather_finish(parser *p, gather *g, size_t size)
{
	void	   *out = arena_alloc(p->doc, g->n * size);

	if (out && g->n)
		memcpy(out, g->items, g->n * size);
	free(g->items);
	g->items = NULL;
	return out;
}

int
cai_json_member_ptr_cmp(const void *a, const void *b)
{
	const json_member *x = *(const json_member *const *) a;
	const json_member *y = *(const json_member *const *) b;
	size_t		n = x->key_len < y->key_len ? x->key_len : y->key_len;
	int			c = memcmp(x->key, y->key, n);

	if (c != 0)
		return c;
	return x->key_len < y->key_len ? -1 : x->key_len > y->key_len;
}

/* Fails when two members of obj have the same key (sorting a copy of the member pointers). */
static bool
check_duplicate_keys(parser *p, const json_value *obj)
{
	size_t		n = obj->u.object.n;
	const json_member **sorted;

	if (n < 2)
		return true;
	sorted = malloc(n * sizeof(*sorted));
	if (!sorted)
		return fail_oom(p);
	for (size_t i = 0; i < n; i++)
		sorted[i] = &obj->u.object.members[i];
	qsort(sorted, n, sizeof(*sorted), cai_json_member_ptr_cmp);
	for (size_t i = 1; i < n; i++)
		if (cai_json_member_ptr_cmp(&sorted[i - 1], &sorted[i]) == 0)
		{
			const json_member *later = sorted[i] > sorted[i - 1] ? sorted[i] : sorted[i - 1];

			free(sorted);
			return fail_at(p, later->value->offset, "duplicate key in an object");
		}
	free(sorted);
	return true;
}

/* The key of an object member and its colon, at p->pos. */
static bool
parse_key(parser *p, json_member *m)
{
	skip_ws(p);
	if (p->pos >= p->len || p->s[p->pos] != '"')
		return fail_at(p, p->pos, "expected a string key in an object");
	if (!parse_string(p, &m->key, &m->key_len))
		return false;
	skip_ws(p);
	if (p->pos >= p->len || p->s[p->pos] != ':')
		return fail_at(p, p->pos, "expected ':' after an object key");
	p->pos++;
	return true;
}

/* An array or an object at p->pos: its items (members) gathered, then moved to the arena. */
static bool
parse_container(parser *p, json_value *v, int depth)
{
	bool		object = p->s[p->pos] == '{';
	char		close = object ? '}' : ']';
	size_t		size = object ? sizeof(json_member) : sizeof(json_value *);
	gather		g = {0};
	void	   *items;

	p->pos++;
	v->type = object ? JSON_OBJECT : JSON_ARRAY;
	skip_ws(p);
	if (p->pos < p->len && p->s[p->pos] == close)
		p->pos++;
	else
		for (;;)
		{
			json_member m = {0};

			if (object && !parse_key(p, &m))
				break;
			m.value = arena_alloc(p->doc, sizeof(json_value));
			if (!m.value || !gather_push(&g, object ? (void *) &m : (void *) &m.value, size))
			{
				fail_oom(p);
				break;
			}
			if (!parse_value(p, m.value, depth + 1))
				break;
			skip_ws(p);
			if (p->pos < p->len && (p->s[p->pos] == ',' || p->s[p->pos] == close))
			{
				if (p->s[p->pos++] == ',')
					continue;
				break;
			}
			fail_at(p, p->pos, object ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
			break;
		}
	if (p->status != CAI_OK)
	{
		free(g.items);
		return false;
	}
	items = gather_finish(p, &g, size);
	if (!items)
		return fail_oom(p);
	if (!object)
	{
		v->u.array.items = items;
		v->u.array.n = g.n;
		return true;
	}
	v->u.object.members = items;
	v->u.object.n = g.n;
	return (p->flags & JSON_DUPLICATE_KEYS) || check_duplicate_keys(p, v);
}

/* Matches the literal word at p->pos. */
static bool
parse_word(parser *p, const char *word, json_type type, json_value *v)
{
	size_t		n = strlen(word);

	if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
		return fail_at(p, p->pos, "unexpected character");
	p->pos += n;
	v->type = type;
	return true;
}

static bool
parse_value(parser *p, json_value *v, int depth)
{
	memset(v, 0, sizeof(*v));
	skip_ws(p);
	v->offset = p->pos;
	if (p->pos >= p->len)
		return fail_at(p, p->pos, "unexpected end of text, expected a value");
	switch (p->s[p->pos])
	{
		case '{':
		case '[':
			if (depth >= JSON_MAX_DEPTH)
			{
				/* a limit of the parser's, not a fault of the text's */
				if (p->status == CAI_OK)
					p->status = cai_fail(p->err, CAI_ERR_UNSUPPORTED,
										 "nests deeper than %d arrays and objects at byte %zu",
										 JSON_MAX_DEPTH, p->pos);
				return false;
			}
			return parse_container(p, v, depth);
		case '"':
			v->type = JSON_STRING;
			return parse_string(p, &v->u.string.bytes, &v->u.string.len);
		case 't':
			return parse_word(p, "true", JSON_TRUE, v);
		case 'f':
			return parse_word(p, "false", JSON_FALSE, v);
		case 'n':
			return parse_word(p, "null", JSON_NULL, v);
		default:
			if (p->s[p->pos] == '-' || json_is_digit(p->s[p->pos]))
				return parse_number(p, v);
			return fail_at(p, p->pos, "unexpected character");
	}
}

cai_status
json_parse(const char *text, size_t len, unsigned flags, json_doc **out, cai_error *err)
{
	parser		p = {0};
	json_doc   *doc;

	*out = NULL;
	if (!text && len > 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "no JSON text");
	doc = calloc(1, sizeof(*doc));
	if (!doc)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory parsing JSON");
	p.doc = doc;
	p.s = text ? text : "";
	p.len = len;
	p.err = err;
	p.status = CAI_OK;
	p.flags = flags;
	doc->root = arena_alloc(doc, sizeof(json_value));
	if (!doc->root)
		fail_oom(&p);
	else if (parse_value(&p, doc->root, 0))
	{
		skip_ws(&p);
		if (p.pos < p.len)
			fail_at(&p, p.pos, "unexpected text after the value");
	}
	free(p.scratch);
	if (p.status != CAI_OK)
	{
		json_doc_free(doc);
		return p.status;
	}
	*out = doc;
	return CAI_OK;
}

const json_value *
json_object_get(const json_value *obj, const char *key)
{
	size_t		n = strlen(key);

	if (!obj || obj->type != JSON_OBJECT)
		return NULL;
	for (size_t i = 0; i < obj->u.object.n; i++)
	{
		const json_member *m = &obj->u.object.members[i];

		if (m->key_len == n && memcmp(m->key, key, n) == 0)
			return m->value;
	}
	return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Serialization
 * ------------------------------------------------------------------------------------------- */

bool
json_serialize_string(const char *s, size_t len, cai_buf *out)
{
	size_t		run = 0;

	if (!cai_buf_append(out, "\"", 1))
		return false;
	for (size_t i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];
		char		esc[8];
		int			n = 0;

		if (c == '"' || c == '\\')
			n = snprintf(esc, sizeof(esc), "\\%c", c);
		else if (c < 0x20)
		{
			char		letter = c == '\b' ? 'b' : c == '\f' ? 'f' : c == '\n' ? 'n' :
				c == '\r' ? 'r' : c == '\t' ? 't' : 0;

			n = letter ? snprintf(esc, sizeof(esc), "\\%c", letter) :
				snprintf(esc, sizeof(esc), "\\u%04x", c);
		}
		if (n == 0)
			continue;
		if (!cai_buf_append(out, s + run, i - run) || !cai_buf_append(out, esc, (size_t) n))
			return false;
		run = i + 1;
	}
	return cai_buf_append(out, s + run, len - run) && cai_buf_append(out, "\"", 1);
}

bool
json_serialize(const json_value *v, cai_buf *out)
{
	switch (v->type)
	{
		case JSON_NULL:
			return cai_buf_append(out, "null", 4);
		case JSON_FALSE:
			return cai_buf_append(out, "false", 5);
		case JSON_TRUE:
			return cai_buf_append(out, "true", 4);
		case JSON_NUMBER:
			return cai_buf_append(out, v->u.number.text, v->u.number.len);
		case JSON_STRING:
			return json_serialize_string(v->u.string.bytes, v->u.string.len, out);
		case JSON_ARRAY:
			if (!cai_buf_append(out, "[", 1))
				return false;
			for (size_t i = 0; i < v->u.array.n; i++)
				if ((i > 0 && !cai_buf_append(out, ",", 1)) || !json_serialize(v->u.array.items[i], out))
					return false;
			return cai_buf_append(out, "]", 1);
		case JSON_OBJECT:
			if (!cai_buf_append(out, "{", 1))
				return false;
			for (size_t i = 0; i < v->u.object.n; i++)
			{
				const json_member *m = &v->u.object.members[i];

				if ((i > 0 && !cai_buf_append(out, ",", 1)) ||
					!json_serialize_string(m->key, m->key_len, out) ||
					!cai_buf_append(out, ":", 1) || !json_serialize(m->value, out))
					return false;
			}
			return cai_buf_append(out, "}", 1);
	}
	return false;
}
