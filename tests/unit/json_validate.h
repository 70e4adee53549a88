/*
 * json_validate.h — an independent reference for constrained decoding's output: validates a
 * parsed JSON value against a schema of grammar.h's subset with JSON Schema's own semantics
 * (keywords of other types ignored, additional properties allowed unless false, integers by
 * value, enum/const by JSON equality, exact decimal comparison of bounds), and checks the raw
 * text's limits (whitespace runs, digit counts, what PostgreSQL's jsonb accepts).  It shares
 * nothing with the matcher but the JSON parser (tested on its own in test_json.c).
 *
 * Used by test_grammar.c and tests/fuzz/fuzz_token_mask.c.
 */
#ifndef CAI_JSON_VALIDATE_H
#define CAI_JSON_VALIDATE_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

/* A number literal as sign, significant digits (no leading or trailing zeros), exponent. */
typedef struct jv_decimal
{
	bool		negative;
	char		digits[512];
	int			n;				/* 0: the value is zero */
	long		exp;			/* value = 0.digits * 10^exp */
} jv_decimal;

static inline void
jv_decimal_parse(const char *s, size_t len, jv_decimal *d)
{
	size_t		i = 0;
	long		point = 0;		/* digits before the point, after leading zeros */
	bool		seen_point = false,
				leading = true;
	long		e = 0;
	bool		eneg = false;

	memset(d, 0, sizeof(*d));
	if (i < len && s[i] == '-')
		d->negative = true, i++;
	for (; i < len && (s[i] == '.' || (s[i] >= '0' && s[i] <= '9')); i++)
	{
		if (s[i] == '.')
		{
			seen_point = true;
			continue;
		}
		if (leading && s[i] == '0')
		{
			if (seen_point)
				point--;
			continue;
		}
		leading = false;
		if (d->n < (int) sizeof(d->digits))
			d->digits[d->n++] = s[i];
		if (!seen_point)
			point++;
	}
	if (i < len && (s[i] == 'e' || s[i] == 'E'))
	{
		i++;
		if (i < len && (s[i] == '+' || s[i] == '-'))
			eneg = s[i++] == '-';
		for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
			if (e < 1000000000)
				e = e * 10 + (s[i] - '0');
	}
	while (d->n > 0 && d->digits[d->n - 1] == '0')
		d->n--;
	d->exp = point + (eneg ? -e : e);
	if (d->n == 0)
		d->negative = false;
}

/* -1, 0, 1 as a < b, a == b, a > b, exactly. */
static inline int
jv_decimal_cmp(const jv_decimal *a, const jv_decimal *b)
{
	int			sign = a->negative ? -1 : 1;

	if (a->n == 0 || b->n == 0)
	{
		if (a->n == 0 && b->n == 0)
			return 0;
		if (a->n == 0)
			return b->negative ? 1 : -1;
		return a->negative ? -1 : 1;
	}
	if (a->negative != b->negative)
		return a->negative ? -1 : 1;
	if (a->exp != b->exp)
		return a->exp < b->exp ? -sign : sign;
	for (int i = 0; i < a->n || i < b->n; i++)
	{
		char		x = i < a->n ? a->digits[i] : '0',
					y = i < b->n ? b->digits[i] : '0';

		if (x != y)
			return x < y ? -sign : sign;
	}
	return 0;
}

static inline int
jv_number_cmp(const json_value *a, const json_value *b)
{
	jv_decimal	x,
				y;

	jv_decimal_parse(a->u.number.text, a->u.number.len, &x);
	jv_decimal_parse(b->u.number.text, b->u.number.len, &y);
	return jv_decimal_cmp(&x, &y);
}

static inline bool
jv_is_integer(const json_value *v)
{
	jv_decimal	d;

	jv_decimal_parse(v->u.number.text, v->u.number.len, &d);
	return d.n == 0 || d.exp >= d.n;
}

/* JSON equality: numbers by value, objects regardless of member order. */
static inline bool
jv_equal(const json_value *a, const json_value *b)
{
	if (a->type != b->type)
		return false;
	switch (a->type)
	{
		case JSON_NUMBER:
			return jv_number_cmp(a, b) == 0;
		case JSON_STRING:
			return a->u.string.len == b->u.string.len &&
				memcmp(a->u.string.bytes, b->u.string.bytes, a->u.string.len) == 0;
		case JSON_ARRAY:
			if (a->u.array.n != b->u.array.n)
				return false;
			for (size_t i = 0; i < a->u.array.n; i++)
				if (!jv_equal(a->u.array.items[i], b->u.array.items[i]))
					return false;
			return true;
		case JSON_OBJECT:
			if (a->u.object.n != b->u.object.n)
				return false;
			for (size_t i = 0; i < a->u.object.n; i++)
			{
				const json_member *m = &a->u.object.members[i];
				bool		found = false;

				for (size_t j = 0; j < b->u.object.n && !found; j++)
				{
					const json_member *o = &b->u.object.members[j];

					found = o->key_len == m->key_len && memcmp(o->key, m->key, m->key_len) == 0 &&
						jv_equal(m->value, o->value);
				}
				if (!found)
					return false;
			}
			return true;
		default:
			return true;
	}
}

static inline const json_value *
jv_get(const json_value *obj, const char *key)
{
	if (!obj || obj->type != JSON_OBJECT)
		return NULL;
	for (size_t i = 0; i < obj->u.object.n; i++)
		if (strcmp(obj->u.object.members[i].key, key) == 0)
			return obj->u.object.members[i].value;
	return NULL;
}

static inline const json_value *
jv_resolve(const json_value *root, const char *ref)
{
	const json_value *v = root;
	char		seg[256];

	if (ref[0] != '#')
		return NULL;
	ref++;
	while (v && *ref == '/')
	{
		size_t		n = 0;

		for (ref++; *ref && *ref != '/' && n + 1 < sizeof(seg); ref++)
		{
			if (ref[0] == '~' && (ref[1] == '0' || ref[1] == '1'))
				seg[n++] = *++ref == '0' ? '~' : '/';
			else
				seg[n++] = *ref;
		}
		seg[n] = '\0';
		if (v->type == JSON_ARRAY)
		{
			size_t		i = (size_t) strtoul(seg, NULL, 10);

			v = i < v->u.array.n ? v->u.array.items[i] : NULL;
		}
		else
			v = jv_get(v, seg);
	}
	return *ref ? NULL : v;
}

static inline size_t
jv_code_points(const json_value *s)
{
	size_t		n = 0;

	for (size_t i = 0; i < s->u.string.len; i++)
		n += ((unsigned char) s->u.string.bytes[i] & 0xC0) != 0x80;
	return n;
}

static inline bool
jv_type_is(const json_value *v, const char *type)
{
	if (strcmp(type, "integer") == 0)
		return v->type == JSON_NUMBER && jv_is_integer(v);
	if (strcmp(type, "number") == 0)
		return v->type == JSON_NUMBER;
	if (strcmp(type, "string") == 0)
		return v->type == JSON_STRING;
	if (strcmp(type, "object") == 0)
		return v->type == JSON_OBJECT;
	if (strcmp(type, "array") == 0)
		return v->type == JSON_ARRAY;
	if (strcmp(type, "boolean") == 0)
		return v->type == JSON_TRUE || v->type == JSON_FALSE;
	if (strcmp(type, "null") == 0)
		return v->type == JSON_NULL;
	return false;
}

/* inst against the numeric keyword kw of schema s: cmp must be in [lo, hi]. */
static inline bool
jv_bound(const json_value *s, const char *kw, const json_value *inst, int lo, int hi)
{
	const json_value *b = jv_get(s, kw);
	int			c;

	if (!b || b->type != JSON_NUMBER)
		return true;
	c = jv_number_cmp(inst, b);
	return c >= lo && c <= hi;
}

static inline bool
jv_validate(const json_value *root, const json_value *s, const json_value *inst, int depth)
{
	const json_value *k;

	if (depth > 200)
		return false;
	if (s->type == JSON_TRUE)
		return true;
	if (s->type == JSON_FALSE)
		return false;
	if ((k = jv_get(s, "$ref")))
	{
		const json_value *t = jv_resolve(root, k->u.string.bytes);

		if (!t || !jv_validate(root, t, inst, depth + 1))
			return false;
	}
	if ((k = jv_get(s, "anyOf")))
	{
		bool		any = false;

		for (size_t i = 0; i < k->u.array.n && !any; i++)
			any = jv_validate(root, k->u.array.items[i], inst, depth + 1);
		if (!any)
			return false;
	}
	if ((k = jv_get(s, "type")))
	{
		bool		any = false;

		if (k->type == JSON_STRING)
			any = jv_type_is(inst, k->u.string.bytes);
		for (size_t i = 0; k->type == JSON_ARRAY && i < k->u.array.n && !any; i++)
			any = jv_type_is(inst, k->u.array.items[i]->u.string.bytes);
		if (!any)
			return false;
	}
	if ((k = jv_get(s, "const")) && !jv_equal(k, inst))
		return false;
	if ((k = jv_get(s, "enum")))
	{
		bool		any = false;

		for (size_t i = 0; i < k->u.array.n && !any; i++)
			any = jv_equal(k->u.array.items[i], inst);
		if (!any)
			return false;
	}
	if (inst->type == JSON_STRING)
	{
		if ((k = jv_get(s, "minLength")) && jv_code_points(inst) < strtod(k->u.number.text, NULL))
			return false;
		if ((k = jv_get(s, "maxLength")) && jv_code_points(inst) > strtod(k->u.number.text, NULL))
			return false;
	}
	if (inst->type == JSON_NUMBER)
	{
		const json_value *xmin = jv_get(s, "exclusiveMinimum"),
				   *xmax = jv_get(s, "exclusiveMaximum");

		if (!jv_bound(s, "minimum", inst, xmin && xmin->type == JSON_TRUE ? 1 : 0, 1) ||
			!jv_bound(s, "maximum", inst, -1, xmax && xmax->type == JSON_TRUE ? -1 : 0) ||
			!jv_bound(s, "exclusiveMinimum", inst, 1, 1) ||
			!jv_bound(s, "exclusiveMaximum", inst, -1, -1))
			return false;
	}
	if (inst->type == JSON_ARRAY)
	{
		if ((k = jv_get(s, "minItems")) && inst->u.array.n < strtod(k->u.number.text, NULL))
			return false;
		if ((k = jv_get(s, "maxItems")) && inst->u.array.n > strtod(k->u.number.text, NULL))
			return false;
		if ((k = jv_get(s, "items")))
			for (size_t i = 0; i < inst->u.array.n; i++)
				if (!jv_validate(root, k, inst->u.array.items[i], depth + 1))
					return false;
	}
	if (inst->type == JSON_OBJECT)
	{
		const json_value *props = jv_get(s, "properties");
		const json_value *add = jv_get(s, "additionalProperties");

		if ((k = jv_get(s, "required")))
			for (size_t i = 0; i < k->u.array.n; i++)
				if (!jv_get(inst, k->u.array.items[i]->u.string.bytes))
					return false;
		for (size_t i = 0; i < inst->u.object.n; i++)
		{
			const json_member *m = &inst->u.object.members[i];
			const json_value *ps = props ? jv_get(props, m->key) : NULL;

			if (ps && !jv_validate(root, ps, m->value, depth + 1))
				return false;
			if (!ps && add && add->type == JSON_FALSE)
				return false;
		}
	}
	return true;
}

/* No NUL in any string or key: jsonb refuses \u0000 (the parser already refuses lone surrogates). */
static inline bool
jv_jsonb_ok(const json_value *v)
{
	switch (v->type)
	{
		case JSON_STRING:
			return memchr(v->u.string.bytes, '\0', v->u.string.len) == NULL;
		case JSON_ARRAY:
			for (size_t i = 0; i < v->u.array.n; i++)
				if (!jv_jsonb_ok(v->u.array.items[i]))
					return false;
			return true;
		case JSON_OBJECT:
			for (size_t i = 0; i < v->u.object.n; i++)
				if (memchr(v->u.object.members[i].key, '\0', v->u.object.members[i].key_len) ||
					!jv_jsonb_ok(v->u.object.members[i].value))
					return false;
			return true;
		default:
			return true;
	}
}

/*
 * Whether text keeps a compact grammar's whitespace (CAI_JSON_WS_COMPACT): outside strings,
 * nothing but single spaces, each right after a ':' or a ','.
 */
static inline bool
jv_compact_ws(const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++)
	{
		char		c = s[i];

		if (c == '"')
		{
			for (i++; i < len && s[i] != '"'; i++)
				if (s[i] == '\\')
					i++;
			continue;
		}
		if ((c == ' ' || c == '\t' || c == '\n' || c == '\r') &&
			(c != ' ' || i == 0 || (s[i - 1] != ':' && s[i - 1] != ',')))
			return false;
	}
	return true;
}

/*
 * The raw text's limits outside strings: at most 16 whitespace bytes in a row, numbers of at
 * most 19 integer, 16 fraction and 3 exponent digits unless the number is written as such in
 * `literals` (the schema's text: enum and const values are generated as written).  Inside
 * strings, raw bytes are the parser's business.
 */
static inline bool
jv_text_limits(const char *s, size_t len, const char *literals)
{
	int			ws = 0;

	for (size_t i = 0; i < len;)
	{
		char		c = s[i];

		if (c == '"')
		{
			for (i++; i < len && s[i] != '"'; i++)
				if (s[i] == '\\')
					i++;
			i++;
			ws = 0;
			continue;
		}
		if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
		{
			if (++ws > 16)
				return false;
			i++;
			continue;
		}
		ws = 0;
		if (c == '-' || (c >= '0' && c <= '9'))
		{
			int			counts[3] = {0, 0, 0};
			int			part = 0;
			size_t		start = i;

			if (c == '-')
				i++;
			for (; i < len; i++)
			{
				if (s[i] >= '0' && s[i] <= '9')
					counts[part]++;
				else if (s[i] == '.' && part == 0)
					part = 1;
				else if ((s[i] == 'e' || s[i] == 'E') && part < 2)
					part = 2;
				else if ((s[i] == '+' || s[i] == '-') && part == 2 && counts[2] == 0)
					;
				else
					break;
			}
			if (counts[0] > 19 || counts[1] > 16 || counts[2] > 3)
			{
				char	   *number = strndup(s + start, i - start);
				bool		literal = number && literals && strstr(literals, number);

				free(number);
				if (!literal)
					return false;
			}
			continue;
		}
		i++;
	}
	return true;
}

#endif							/* CAI_JSON_VALIDATE_H */
