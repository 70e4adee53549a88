/*
 * json_schema.c — compiles a JSON Schema (the subset grammar.h lists) to a grammar the matcher
 * walks (json_matcher.h).
 *
 * Every subschema becomes a node; a schema with no value (false, an empty numeric range, an
 * enum the rest of the schema rules out) compiles to UNSAT, which a choice or an optional
 * property drops and a required place turns into an error.  So the grammar never leads the
 * matcher where no value can be completed.  $ref targets are compiled once and shared; a
 * target met again while it is being compiled is a cycle.
 */
#define _GNU_SOURCE				/* qsort_r */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "json.h"
#include "json_matcher.h"
#include "util.h"

#define NODE_ERROR UINT32_MAX
#define NODE_UNSAT (UINT32_MAX - 1)
#define MAX_NESTING 128			/* subschemas inside each other, $refs followed included */
#define PATH_CAP 256
#define MAX_MIN_COUNT (1u << 30) /* the largest minLength / minItems */

typedef struct ref_memo
{
	const json_value *target;
	uint32_t	node;
} ref_memo;

typedef struct compiler
{
	cai_grammar *g;
	const json_value *doc;		/* the whole schema, for $ref */
	cai_error  *err;
	cai_status	status;
	char		path[PATH_CAP];	/* JSON pointer of the subschema being compiled */
	size_t		path_len;
	const json_value *stack[MAX_NESTING];	/* subschemas being compiled */
	int			depth;
	ref_memo   *memo;
	size_t		n_memo;
	size_t		cap_memo;
	uint32_t	any_value;		/* the shared "any JSON value" node, or NODE_ERROR */
} compiler;

/* ---------------------------------------------------------------------------------------------
 * Errors and paths
 * ------------------------------------------------------------------------------------------- */

static const char *
where(const compiler *c)
{
	return c->path_len ? c->path : "the root";
}

static uint32_t
fail(compiler *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static uint32_t
fail(compiler *c, const char *fmt, ...)
{
	char		msg[CAI_ERROR_MESSAGE_SIZE];
	va_list		ap;

	if (c->status == CAI_OK)
	{
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
		c->status = cai_fail(c->err, CAI_ERR_INVALID_ARGUMENT, "%s at %s", msg, where(c));
	}
	return NODE_ERROR;
}

static uint32_t
fail_oom(compiler *c)
{
	if (c->status == CAI_OK)
		c->status = cai_fail(c->err, CAI_ERR_NO_MEMORY, "out of memory compiling a JSON schema");
	return NODE_ERROR;
}

/* Appends "/" and a pointer segment (~ and / escaped, control bytes shown as ?); the old length. */
static size_t
path_push(compiler *c, const char *seg, size_t n)
{
	size_t		old = c->path_len;
	size_t		len = old;

	if (len < PATH_CAP - 1)
		c->path[len++] = '/';
	for (size_t i = 0; i < n && len < PATH_CAP - 2; i++)
	{
		unsigned char ch = (unsigned char) seg[i];

		if (ch == '~' || ch == '/')
		{
			c->path[len++] = '~';
			c->path[len++] = ch == '~' ? '0' : '1';
		}
		else
			c->path[len++] = ch < 0x20 ? '?' : (char) ch;
	}
	c->path[len] = '\0';
	c->path_len = len;
	return old;
}

static size_t
path_push_index(compiler *c, const char *key, size_t i)
{
	char		num[24];
	size_t		old = path_push(c, key, strlen(key));

	snprintf(num, sizeof(num), "%zu", i);
	path_push(c, num, strlen(num));
	return old;
}

static void
path_pop(compiler *c, size_t old)
{
	c->path_len = old;
	c->path[old] = '\0';
}

/* ---------------------------------------------------------------------------------------------
 * Keyword values
 * ------------------------------------------------------------------------------------------- */

/*
 * A number literal as an integer scaled by 10^16, truncated toward zero: *inexact when digits
 * were dropped, *huge when it is beyond 10^36 (then *scaled is meaningless).
 */
static void
decimal_scaled(const char *s, size_t len, bool *negative, gm_i128 *scaled, bool *inexact,
			   bool *huge)
{
	char		digits[64];		/* significant digits kept; more only sets *inexact */
	int			n_digits = 0;
	long		n_significant = 0;	/* significant digits, including those not kept */
	long		point_shift = 0;	/* fraction digits among the significant ones */
	long		exponent = 0;
	bool		exp_negative = false;
	bool		dropped_nonzero = false;
	size_t		i = 0;

	*negative = false;
	if (i < len && s[i] == '-')
	{
		*negative = true;
		i++;
	}
	for (bool frac = false; i < len && (s[i] == '.' || (s[i] >= '0' && s[i] <= '9')); i++)
	{
		if (s[i] == '.')
		{
			frac = true;
			continue;
		}
		if (frac)
			point_shift++;
		if (n_significant == 0 && s[i] == '0')
			continue;			/* leading zeros */
		n_significant++;
		if (n_digits < (int) sizeof(digits))
			digits[n_digits++] = s[i];
		else if (s[i] != '0')
			dropped_nonzero = true;
	}
	if (i < len && (s[i] == 'e' || s[i] == 'E'))
	{
		i++;
		if (i < len && (s[i] == '+' || s[i] == '-'))
			exp_negative = s[i++] == '-';
		for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
			if (exponent < 100000000)
				exponent = exponent * 10 + (s[i] - '0');
		if (exp_negative)
			exponent = -exponent;
	}
	*scaled = 0;
	*inexact = false;
	*huge = false;
	if (n_significant == 0)
		return;
	/* value = 0.d1d2... * 10^(n_significant - point_shift + exponent); scaled: + 16 */
	{
		long		int_digits = n_significant - point_shift + exponent + GM_FRAC_DIGITS;

		if (int_digits > 37)
		{
			*huge = true;
			return;
		}
		/* the first int_digits significant digits are the integer part of the scaled value */
		for (long k = 0; k < int_digits; k++)
			*scaled = *scaled * 10 + (k < n_digits ? digits[k] - '0' : 0);
		for (long k = int_digits < 0 ? 0 : int_digits; k < n_digits; k++)
			if (digits[k] != '0')
				*inexact = true;
		if (dropped_nonzero && int_digits < n_significant)
			*inexact = true;
	}
}

static gm_i128
floor_div(gm_i128 a, gm_i128 b)
{
	gm_i128		q = a / b;

	return (a % b != 0 && a < 0) ? q - 1 : q;
}

static gm_i128
ceil_div(gm_i128 a, gm_i128 b)
{
	gm_i128		q = a / b;

	return (a % b != 0 && a > 0) ? q + 1 : q;
}

/* Sentinel beyond every generated magnitude. */
#define HUGE_UNITS (gm_pow10(37))

/* The bound v on the grid: the least grid value >= v (up) or the greatest <= v (down). */
static gm_i128
bound_on_grid(const json_value *v, gm_i128 grid, bool up)
{
	bool		negative,
				inexact,
				huge;
	gm_i128		t;

	decimal_scaled(v->u.number.text, v->u.number.len, &negative, &t, &inexact, &huge);
	if (huge)
		return negative ? -HUGE_UNITS : HUGE_UNITS;
	if (up)
		return ceil_div(negative ? -t : t + inexact, grid) * grid;
	return floor_div(negative ? -t - inexact : t, grid) * grid;
}

/* A non-negative integer keyword (5 and 5.0 alike), capped at cap (larger: cap). */
static bool
get_count(compiler *c, const json_value *v, const char *name, uint32_t cap, uint32_t *out)
{
	bool		negative,
				inexact,
				huge;
	gm_i128		t;
	gm_i128		scale = GM_SCALE;

	if (v->type == JSON_NUMBER)
	{
		decimal_scaled(v->u.number.text, v->u.number.len, &negative, &t, &inexact, &huge);
		if ((!negative || (!huge && t == 0)) && !inexact && (huge || t % scale == 0))
		{
			*out = (huge || t / scale > cap) ? cap : (uint32_t) (t / scale);
			return true;
		}
	}
	fail(c, "\"%s\" must be a non-negative integer", name);
	return false;
}

static bool
is_annotation(const char *k)
{
	static const char *const names[] = {
		"title", "description", "$schema", "$id", "$comment", "default", "examples",
		"deprecated", "readOnly", "writeOnly", NULL
	};

	for (int i = 0; names[i]; i++)
		if (strcmp(k, names[i]) == 0)
			return true;
	return false;
}

/* Keywords that constrain a value, and the type each applies to (NULL: any). */
static const struct
{
	const char *name;
	const char *type;
}			keywords[] = {
	{"type", NULL}, {"enum", NULL}, {"const", NULL}, {"anyOf", NULL}, {"$ref", NULL},
	{"properties", "object"}, {"required", "object"}, {"additionalProperties", "object"},
	{"propertyOrdering", "object"},
	{"items", "array"}, {"minItems", "array"}, {"maxItems", "array"},
	{"minLength", "string"}, {"maxLength", "string"},
	{"minimum", "number"}, {"maximum", "number"}, {"exclusiveMinimum", "number"},
	{"exclusiveMaximum", "number"},
};
#define N_KEYWORDS ((int) (sizeof(keywords) / sizeof(keywords[0])))

static int
keyword_index(const char *k)
{
	for (int i = 0; i < N_KEYWORDS; i++)
		if (strcmp(k, keywords[i].name) == 0)
			return i;
	return -1;
}

/* ---------------------------------------------------------------------------------------------
 * Nodes
 * ------------------------------------------------------------------------------------------- */

static uint32_t compile(compiler *c, const json_value *s);

static uint32_t
new_node(compiler *c, gm_kind kind)
{
	uint32_t	n = gm_add_node(c->g, kind);

	return n == UINT32_MAX ? fail_oom(c) : n;
}

static uint32_t
any_value(compiler *c)
{
	if (c->any_value == NODE_ERROR)
		c->any_value = new_node(c, GM_ANY);
	return c->any_value;
}

/* A choice among nodes (UNSAT ones dropped, choices flattened, repeats dropped). */
static uint32_t
make_choice(compiler *c, const uint32_t *alts, size_t n)
{
	uint32_t   *flat = NULL;
	size_t		n_flat = 0,
				cap = 0;
	uint32_t	node = NODE_UNSAT;

	for (size_t i = 0; i < n; i++)
	{
		const gm_node *a;
		uint32_t	first = 0,
					count = 1;

		if (alts[i] == NODE_UNSAT)
			continue;
		a = &c->g->nodes[alts[i]];
		if (a->kind == GM_ANYOF)
			first = a->first, count = a->count;
		for (uint32_t k = 0; k < count; k++)
		{
			uint32_t	v = a->kind == GM_ANYOF ? c->g->alts[first + k] : alts[i];
			bool		seen = false;

			for (size_t j = 0; j < n_flat && !seen; j++)
				seen = flat[j] == v;
			if (seen)
				continue;
			if (!cai_grow((void **) &flat, &cap, n_flat + 1, sizeof(uint32_t)))
			{
				free(flat);
				return fail_oom(c);
			}
			flat[n_flat++] = v;
		}
	}
	if (n_flat == 1)
		node = flat[0];
	else if (n_flat > 1)
	{
		node = new_node(c, GM_ANYOF);
		if (node != NODE_ERROR)
		{
			c->g->nodes[node].first = c->g->n_alts;
			c->g->nodes[node].count = (uint32_t) n_flat;
			for (size_t j = 0; j < n_flat; j++)
				if (!gm_add_alt(c->g, flat[j]))
				{
					node = fail_oom(c);
					break;
				}
		}
	}
	free(flat);
	return node;
}

static int
lit_cmp(const void *a, const void *b, void *arg)
{
	const cai_grammar *g = arg;
	const gm_lit *x = a;
	const gm_lit *y = b;
	uint32_t	n = x->len < y->len ? x->len : y->len;
	int			r = memcmp(g->bytes + x->off, g->bytes + y->off, n);

	if (r != 0)
		return r;
	return x->len < y->len ? -1 : x->len > y->len;
}

/*
 * Whether PostgreSQL's numeric input (so jsonb) takes the number literal: an exponent below
 * INT_MAX / 2 in magnitude, then a leading digit below 10^131072 (base-10000 weight 32767) and
 * at most 16383 digits after the point once the exponent is applied.
 */
static bool
number_storable(const char *s, size_t len)
{
	size_t		i = 0;
	long long	int_digits = 0,		/* after leading zeros */
				frac_digits = 0,
				frac_zeros = 0,		/* zeros after the point before the first other digit */
				exponent = 0;
	bool		nonzero = false,
				exp_negative = false;

	if (i < len && s[i] == '-')
		i++;
	for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
		if (nonzero || s[i] != '0')
		{
			nonzero = true;
			int_digits++;
		}
	if (i < len && s[i] == '.')
		for (i++; i < len && s[i] >= '0' && s[i] <= '9'; i++)
		{
			frac_digits++;
			if (!nonzero && s[i] == '0')
				frac_zeros++;
			else
				nonzero = true;
		}
	if (i < len && (s[i] == 'e' || s[i] == 'E'))
	{
		i++;
		if (i < len && (s[i] == '+' || s[i] == '-'))
			exp_negative = s[i++] == '-';
		for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
			if (exponent < 4000000000LL)
				exponent = exponent * 10 + (s[i] - '0');
		if (exp_negative)
			exponent = -exponent;
	}
	if (exponent >= INT32_MAX / 2 || exponent <= -(INT32_MAX / 2))
		return false;
	if (frac_digits - exponent > 16383)
		return false;
	/* the leading digit's power of ten */
	return !nonzero || (int_digits > 0 ? int_digits - 1 : -frac_zeros - 1) + exponent <= 131071;
}

/* Why jsonb could not store literal v (a string with \u0000, a number out of range), or NULL. */
static const char *
literal_unstorable(const json_value *v)
{
	const char *why = NULL;

	switch (v->type)
	{
		case JSON_STRING:
			return memchr(v->u.string.bytes, '\0', v->u.string.len) ? "a string with \\u0000" : NULL;
		case JSON_NUMBER:
			return number_storable(v->u.number.text, v->u.number.len) ? NULL : "a number out of numeric's range";
		case JSON_ARRAY:
			for (size_t i = 0; i < v->u.array.n && !why; i++)
				why = literal_unstorable(v->u.array.items[i]);
			return why;
		case JSON_OBJECT:
			for (size_t i = 0; i < v->u.object.n && !why; i++)
				why = memchr(v->u.object.members[i].key, '\0', v->u.object.members[i].key_len) ?
					"a string with \\u0000" : literal_unstorable(v->u.object.members[i].value);
			return why;
		default:
			return NULL;
	}
}

/*
 * A node for the values vals[0..n) that `rest` accepts (rest == NODE_ERROR: all of them),
 * sorted by serialization, without repeats.
 */
static uint32_t
make_literals(compiler *c, const json_value *const *vals, size_t n, uint32_t rest,
			  const char *keyword)
{
	cai_grammar *g = c->g;
	gm_lit	   *lits = calloc(n ? n : 1, sizeof(gm_lit));
	size_t		kept = 0;
	cai_buf	buf = {0};
	uint32_t	node = NODE_UNSAT;

	if (!lits)
		return fail_oom(c);
	for (size_t i = 0; i < n; i++)
	{
		int			ok;
		const char *why = literal_unstorable(vals[i]);

		if (why)
		{
			free(lits);
			cai_buf_free(&buf);
			return fail(c, "\"%s\" holds %s, which PostgreSQL's jsonb cannot store", keyword, why);
		}
		buf.len = 0;
		if (!json_serialize(vals[i], &buf) || buf.len > UINT32_MAX)
			goto oom;
		ok = rest == NODE_ERROR ? 1 : gm_accepts(g, rest, buf.data, buf.len);
		if (ok < 0)
			goto oom;
		if (!ok)
			continue;
		lits[kept].len = (uint32_t) buf.len;
		if (!gm_add_bytes(g, buf.data, buf.len, &lits[kept].off))
			goto oom;
		kept++;
	}
	cai_buf_free(&buf);
	if (kept > 0)
	{
		qsort_r(lits, kept, sizeof(gm_lit), lit_cmp, g);
		node = new_node(c, GM_LITERALS);
		if (node != NODE_ERROR)
		{
			g->nodes[node].first = g->n_lits;
			for (size_t i = 0; i < kept; i++)
			{
				if (i > 0 && lit_cmp(&lits[i - 1], &lits[i], g) == 0)
					continue;
				if (!gm_add_lit(g, &lits[i]))
				{
					free(lits);
					return fail_oom(c);
				}
				g->nodes[node].count++;
			}
		}
	}
	free(lits);
	return node;
oom:
	free(lits);
	cai_buf_free(&buf);
	return fail_oom(c);
}

/* ---------------------------------------------------------------------------------------------
 * Typed schemas
 * ------------------------------------------------------------------------------------------- */

/* The keywords of one schema object, by keyword_index(). */
typedef struct schema_keys
{
	const json_value *v[N_KEYWORDS];
} schema_keys;

static const json_value *
key(const schema_keys *k, const char *name)
{
	return k->v[keyword_index(name)];
}

/* A minimum and maximum count (minLength/maxLength, minItems/maxItems): 0 and unbounded if absent. */
static bool
get_bounds(compiler *c, const schema_keys *k, const char *min_name, const char *max_name,
		   uint32_t *min, uint32_t *max)
{
	const json_value *v;

	*min = 0;
	*max = GM_UNBOUNDED;
	if ((v = key(k, min_name)) && !get_count(c, v, min_name, MAX_MIN_COUNT, min))
		return false;
	if ((v = key(k, max_name)) && !get_count(c, v, max_name, GM_UNBOUNDED - 1, max))
		return false;
	if (*min > *max)
	{
		fail(c, "\"%s\" is greater than \"%s\"", min_name, max_name);
		return false;
	}
	return true;
}

static uint32_t
compile_string(compiler *c, const schema_keys *k)
{
	uint32_t	min,
				max,
				node;

	if (!get_bounds(c, k, "minLength", "maxLength", &min, &max))
		return NODE_ERROR;
	node = new_node(c, GM_STRING);
	if (node != NODE_ERROR)
	{
		c->g->nodes[node].min = min;
		c->g->nodes[node].max = max;
	}
	return node;
}

static uint32_t
compile_number(compiler *c, const schema_keys *k, bool integer)
{
	const json_value *min = key(k, "minimum"),
			   *max = key(k, "maximum"),
			   *xmin = key(k, "exclusiveMinimum"),
			   *xmax = key(k, "exclusiveMaximum");
	gm_i128		grid = integer ? GM_SCALE : 1;
	gm_i128		limit = integer ? (gm_pow10(GM_INT_DIGITS) - 1) * GM_SCALE : GM_MAX_MAGNITUDE;
	gm_i128		lo = -limit,
				hi = limit;
	bool		bounded = false;
	uint32_t	node;

	if (min && max && bound_on_grid(min, 1, false) > bound_on_grid(max, 1, true))
		return fail(c, "\"minimum\" is greater than \"maximum\"");
	if (min)
	{
		bool		exclusive = xmin && xmin->type == JSON_TRUE;
		gm_i128		b = exclusive ? bound_on_grid(min, grid, false) + grid : bound_on_grid(min, grid, true);

		lo = b > lo ? b : lo;
		bounded = true;
	}
	if (max)
	{
		bool		exclusive = xmax && xmax->type == JSON_TRUE;
		gm_i128		b = exclusive ? bound_on_grid(max, grid, true) - grid : bound_on_grid(max, grid, false);

		hi = b < hi ? b : hi;
		bounded = true;
	}
	if (xmin && xmin->type == JSON_NUMBER)
	{
		gm_i128		b = bound_on_grid(xmin, grid, false) + grid;

		lo = b > lo ? b : lo;
		bounded = true;
	}
	if (xmax && xmax->type == JSON_NUMBER)
	{
		gm_i128		b = bound_on_grid(xmax, grid, true) - grid;

		hi = b < hi ? b : hi;
		bounded = true;
	}
	if (lo > hi)
		return NODE_UNSAT;
	node = new_node(c, GM_NUMBER);
	if (node != NODE_ERROR)
	{
		gm_node    *n = &c->g->nodes[node];

		n->integer = integer;
		n->bounded = bounded;
		n->lo = lo;
		n->hi = hi;
	}
	return node;
}

static uint32_t
compile_array(compiler *c, const schema_keys *k)
{
	uint32_t	min,
				max,
				items,
				node;
	const json_value *v;

	if (!get_bounds(c, k, "minItems", "maxItems", &min, &max))
		return NODE_ERROR;
	v = key(k, "items");
	if (v)
	{
		size_t		old = path_push(c, "items", 5);

		items = compile(c, v);
		if (items == NODE_UNSAT && min > 0)
			fail(c, "the item schema admits no value, and \"minItems\" asks for items");
		path_pop(c, old);
		if (items == NODE_ERROR || c->status != CAI_OK)
			return NODE_ERROR;
	}
	else
		items = any_value(c);
	if (items == NODE_UNSAT)
		max = 0;				/* only [] */
	node = new_node(c, GM_ARRAY);
	if (node != NODE_ERROR)
	{
		c->g->nodes[node].min = min;
		c->g->nodes[node].max = max;
		c->g->nodes[node].child = items == NODE_UNSAT ? any_value(c) : items;
	}
	return node;
}

static bool
names_member(const json_value *arr, const char *name, size_t len)
{
	for (size_t i = 0; arr && i < arr->u.array.n; i++)
	{
		const json_value *r = arr->u.array.items[i];

		if (r->u.string.len == len && memcmp(r->u.string.bytes, name, len) == 0)
			return true;
	}
	return false;
}

/*
 * The order in which an object's properties are generated, as indexes into props: the names of
 * "propertyOrdering" first (Gemini's keyword: a schema that went through jsonb has lost its
 * text's order), then the properties it leaves out, in the schema's order.  NULL after an
 * error.
 */
static size_t *
property_order(compiler *c, const json_value *props, const json_value *ordering)
{
	size_t		n = props->u.object.n;
	size_t	   *order = calloc(n ? n : 1, sizeof(size_t));
	bool	   *placed = calloc(n ? n : 1, sizeof(bool));
	size_t		k = 0;

	if (!order || !placed)
	{
		free(order);
		free(placed);
		fail_oom(c);
		return NULL;
	}
	for (size_t i = 0; ordering && i < ordering->u.array.n; i++)
	{
		const json_value *name = ordering->u.array.items[i];
		size_t		j;

		for (j = 0; j < n; j++)
			if (props->u.object.members[j].key_len == name->u.string.len &&
				memcmp(props->u.object.members[j].key, name->u.string.bytes, name->u.string.len) == 0)
				break;
		if (j == n || placed[j])
		{
			if (j == n)
				fail(c, "\"propertyOrdering\" names \"%s\", which is not in \"properties\"",
					 name->u.string.bytes);
			else
				fail(c, "\"propertyOrdering\" names \"%s\" twice", name->u.string.bytes);
			free(order);
			free(placed);
			return NULL;
		}
		placed[j] = true;
		order[k++] = j;
	}
	for (size_t j = 0; j < n; j++)
		if (!placed[j])
			order[k++] = j;
	free(placed);
	return order;
}

static uint32_t
compile_object(compiler *c, const schema_keys *k)
{
	const json_value *props = key(k, "properties");
	const json_value *required = key(k, "required");
	const json_value *additional = key(k, "additionalProperties");
	cai_grammar *g = c->g;
	gm_prop    *list = NULL;
	size_t	   *order;
	size_t		n = 0;
	cai_buf	buf = {0};
	uint32_t	node;

	if (key(k, "propertyOrdering") && !props)
		return fail(c, "\"propertyOrdering\" without \"properties\"");
	for (size_t i = 0; required && i < required->u.array.n; i++)
	{
		const json_value *r = required->u.array.items[i];

		if (!props || !json_object_get(props, r->u.string.bytes) ||
			strlen(r->u.string.bytes) != r->u.string.len)
			return fail(c, "\"required\" names \"%s\", which is not in \"properties\"",
						r->u.string.bytes);
	}
	if (!props)
	{
		/* nothing declared: any object, unless no property is allowed at all */
		if (additional && additional->type == JSON_FALSE)
			return new_node(c, GM_OBJECT);
		node = new_node(c, GM_ANY);
		if (node != NODE_ERROR)
			g->nodes[node].object_only = true;
		return node;
	}

	order = property_order(c, props, key(k, "propertyOrdering"));
	if (!order)
		return NODE_ERROR;
	list = calloc(props->u.object.n ? props->u.object.n : 1, sizeof(gm_prop));
	if (!list)
	{
		free(order);
		return fail_oom(c);
	}
	for (size_t i = 0; i < props->u.object.n; i++)
	{
		const json_member *m = &props->u.object.members[order[i]];
		bool		req = names_member(required, m->key, m->key_len);
		size_t		old = path_push(c, "properties", 10);
		uint32_t	value;

		path_push(c, m->key, m->key_len);
		if (memchr(m->key, '\0', m->key_len))
			value = fail(c, "a property name holds \\u0000, which PostgreSQL's jsonb cannot store");
		else
			value = compile(c, m->value);
		if (value == NODE_UNSAT && req)
			value = fail(c, "property \"%s\" is required, but its schema admits no value", m->key);
		path_pop(c, old);
		if (value == NODE_ERROR)
			goto error;
		if (value == NODE_UNSAT)
			continue;			/* an optional property that can never appear */
		buf.len = 0;
		if (!json_serialize_string(m->key, m->key_len, &buf) || buf.len > UINT32_MAX ||
			!gm_add_bytes(g, buf.data, buf.len, &list[n].key_off))
		{
			fail_oom(c);
			goto error;
		}
		list[n].key_len = (uint32_t) buf.len;
		list[n].value = value;
		list[n].required = req;
		n++;
	}
	/* who may come first from each index on, and whether the rest is optional */
	for (size_t i = n; i-- > 0;)
	{
		list[i].rest_optional = !list[i].required && (i + 1 == n || list[i + 1].rest_optional);
		list[i].last = (uint32_t) i;
		if (!list[i].required && i + 1 < n)
			list[i].last = list[i + 1].last;
	}
	node = new_node(c, GM_OBJECT);
	if (node == NODE_ERROR)
		goto error;
	g->nodes[node].first = g->n_props;
	g->nodes[node].count = (uint32_t) n;
	for (size_t i = 0; i < n; i++)
		if (!gm_add_prop(g, &list[i]))
		{
			fail_oom(c);
			goto error;
		}
	free(order);
	free(list);
	cai_buf_free(&buf);
	return node;
error:
	free(order);
	free(list);
	cai_buf_free(&buf);
	return NODE_ERROR;
}

/*
 * The value types of the type-specific keywords, checked whatever types the schema allows:
 * a malformed keyword is an error even where it would not apply.
 */
static bool
check_keyword_values(compiler *c, const schema_keys *k)
{
	static const char *const counts[] = {"minLength", "maxLength", "minItems", "maxItems"};
	static const char *const bounds[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
	const json_value *v;
	uint32_t	ignored;

	for (int i = 0; i < 4; i++)
		if ((v = key(k, counts[i])) && !get_count(c, v, counts[i], GM_UNBOUNDED, &ignored))
			return false;
	for (int i = 0; i < 4; i++)
		if ((v = key(k, bounds[i])) && v->type != JSON_NUMBER &&
			!(i >= 2 && (v->type == JSON_TRUE || v->type == JSON_FALSE)))
		{
			fail(c, "\"%s\" must be a number%s", bounds[i], i >= 2 ? " (or, draft 4, a boolean)" : "");
			return false;
		}
	if ((v = key(k, "properties")) && v->type != JSON_OBJECT)
	{
		fail(c, "\"properties\" must be an object");
		return false;
	}
	if ((v = key(k, "required")))
	{
		bool		ok = v->type == JSON_ARRAY;

		for (size_t i = 0; ok && i < v->u.array.n; i++)
			ok = v->u.array.items[i]->type == JSON_STRING;
		if (!ok)
		{
			fail(c, "\"required\" must be an array of strings");
			return false;
		}
	}
	if ((v = key(k, "propertyOrdering")))
	{
		bool		ok = v->type == JSON_ARRAY;

		for (size_t i = 0; ok && i < v->u.array.n; i++)
			ok = v->u.array.items[i]->type == JSON_STRING &&
				strlen(v->u.array.items[i]->u.string.bytes) == v->u.array.items[i]->u.string.len;
		if (!ok)
		{
			fail(c, "\"propertyOrdering\" must be an array of property names");
			return false;
		}
	}
	if ((v = key(k, "items")) && v->type == JSON_ARRAY)
	{
		fail(c, "unsupported JSON Schema keyword \"items\" with an array (tuple) value");
		return false;
	}
	if ((v = key(k, "additionalProperties")) && v->type != JSON_TRUE && v->type != JSON_FALSE &&
		!(v->type == JSON_OBJECT && v->u.object.n == 0))
	{
		fail(c, "unsupported JSON Schema keyword \"additionalProperties\" with a schema value (only true or false)");
		return false;
	}
	return true;
}

/* The names in "type" (a string or an array of them) as bits of type_names. */
static const char *const type_names[] = {
	"string", "number", "integer", "object", "array", "boolean", "null"
};
#define N_TYPES 7
#define TYPE_BIT(name) (1u << type_index(name))

static int
type_index(const char *name)
{
	for (int i = 0; i < N_TYPES; i++)
		if (strcmp(name, type_names[i]) == 0)
			return i;
	return -1;
}

static bool
parse_types(compiler *c, const json_value *v, unsigned *types)
{
	size_t		n = v->type == JSON_ARRAY ? v->u.array.n : 1;

	*types = 0;
	if (v->type != JSON_STRING && v->type != JSON_ARRAY)
	{
		fail(c, "\"type\" must be a string or an array of strings");
		return false;
	}
	for (size_t i = 0; i < n; i++)
	{
		const json_value *t = v->type == JSON_ARRAY ? v->u.array.items[i] : v;
		int			ti = t->type == JSON_STRING ? type_index(t->u.string.bytes) : -1;

		if (t->type != JSON_STRING)
		{
			fail(c, "\"type\" must be a string or an array of strings");
			return false;
		}
		if (ti < 0 || strlen(t->u.string.bytes) != t->u.string.len)
		{
			fail(c, "unknown type \"%s\" in \"type\"", t->u.string.bytes);
			return false;
		}
		*types |= 1u << ti;
	}
	if (*types == 0)
	{
		fail(c, "\"type\" must name at least one type");
		return false;
	}
	return true;
}

/* The type-specific part of a schema: one node per type allowed, as a choice. */
static uint32_t
compile_types(compiler *c, const schema_keys *k, unsigned types)
{
	uint32_t	alts[N_TYPES];
	size_t		n = 0;

	if (types & TYPE_BIT("string"))
		alts[n++] = compile_string(c, k);
	if (types & (TYPE_BIT("number") | TYPE_BIT("integer")))
		alts[n++] = compile_number(c, k, !(types & TYPE_BIT("number")));
	if (types & TYPE_BIT("object"))
		alts[n++] = compile_object(c, k);
	if (types & TYPE_BIT("array"))
		alts[n++] = compile_array(c, k);
	if (types & (TYPE_BIT("boolean") | TYPE_BIT("null")))
	{
		/* booleans and null: their words in one literal node */
		json_value	words[3];
		const json_value *ptrs[3];
		size_t		n_words = 0;

		memset(words, 0, sizeof(words));
		if (types & TYPE_BIT("boolean"))
		{
			words[n_words++].type = JSON_FALSE;
			words[n_words++].type = JSON_TRUE;
		}
		if (types & TYPE_BIT("null"))
			words[n_words++].type = JSON_NULL;
		for (size_t i = 0; i < n_words; i++)
			ptrs[i] = &words[i];
		alts[n++] = make_literals(c, ptrs, n_words, NODE_ERROR, "type");
	}
	for (size_t i = 0; i < n; i++)
		if (alts[i] == NODE_ERROR)
			return NODE_ERROR;
	return make_choice(c, alts, n);
}

static uint32_t
compile_enum(compiler *c, const schema_keys *k, uint32_t rest)
{
	const json_value *e = key(k, "enum");
	const json_value *cst = key(k, "const");
	const json_value **vals;
	size_t		n = 0;
	uint32_t	node;

	if (e && (e->type != JSON_ARRAY || e->u.array.n == 0))
		return fail(c, "\"enum\" must be a non-empty array");
	vals = calloc(e ? e->u.array.n : 1, sizeof(*vals));
	if (!vals)
		return fail_oom(c);
	if (cst && e)
	{
		/* both: the const, if the enum has it */
		cai_buf	a = {0},
					b = {0};
		bool		ok = json_serialize(cst, &a);

		for (size_t i = 0; ok && i < e->u.array.n && n == 0; i++)
		{
			b.len = 0;
			ok = json_serialize(e->u.array.items[i], &b);
			if (ok && a.len == b.len && memcmp(a.data, b.data, a.len) == 0)
				vals[n++] = cst;
		}
		cai_buf_free(&a);
		cai_buf_free(&b);
		if (!ok)
		{
			free(vals);
			return fail_oom(c);
		}
	}
	else if (cst)
		vals[n++] = cst;
	else
		for (size_t i = 0; i < e->u.array.n; i++)
			vals[n++] = e->u.array.items[i];
	node = make_literals(c, vals, n, rest, cst ? "const" : "enum");
	free(vals);
	return node;
}

/* ---------------------------------------------------------------------------------------------
 * $ref and anyOf
 * ------------------------------------------------------------------------------------------- */

/* The value a "#/a/b" pointer names in the document, or NULL. */
static const json_value *
resolve_pointer(const json_value *doc, const char *ref, size_t len)
{
	const json_value *v = doc;
	size_t		i = 1;			/* after '#' */
	char	   *seg = malloc(len + 1);

	if (!seg)
		return NULL;
	while (v && i < len)
	{
		size_t		n = 0;

		if (ref[i] != '/')
		{
			v = NULL;
			break;
		}
		for (i++; i < len && ref[i] != '/'; i++)
		{
			if (ref[i] == '~' && i + 1 < len && (ref[i + 1] == '0' || ref[i + 1] == '1'))
				seg[n++] = ref[++i] == '0' ? '~' : '/';
			else
				seg[n++] = ref[i];
		}
		seg[n] = '\0';
		if (v->type == JSON_OBJECT)
		{
			const json_value *next = NULL;

			for (size_t m = 0; m < v->u.object.n && !next; m++)
				if (v->u.object.members[m].key_len == n && memcmp(v->u.object.members[m].key, seg, n) == 0)
					next = v->u.object.members[m].value;
			v = next;
		}
		else if (v->type == JSON_ARRAY)
		{
			size_t		idx = 0;
			bool		ok = n > 0 && n < 10 && (seg[0] != '0' || n == 1);

			for (size_t d = 0; ok && d < n; d++)
			{
				ok = seg[d] >= '0' && seg[d] <= '9';
				idx = idx * 10 + (size_t) (seg[d] - '0');
			}
			v = ok && idx < v->u.array.n ? v->u.array.items[idx] : NULL;
		}
		else
			v = NULL;
	}
	free(seg);
	return v;
}

static uint32_t
compile_ref(compiler *c, const json_value *ref)
{
	const json_value *target;
	char		saved[PATH_CAP];
	size_t		saved_len = c->path_len;
	uint32_t	node;

	if (ref->type != JSON_STRING)
		return fail(c, "\"$ref\" must be a string");
	if (ref->u.string.len == 0 || ref->u.string.bytes[0] != '#')
		return fail(c, "unsupported $ref \"%s\" (only references inside the schema, \"#/...\")",
					ref->u.string.bytes);
	target = resolve_pointer(c->doc, ref->u.string.bytes, ref->u.string.len);
	if (!target)
		return fail(c, "$ref \"%s\" does not resolve", ref->u.string.bytes);
	for (int i = 0; i < c->depth; i++)
		if (c->stack[i] == target)
			return fail(c, "$ref \"%s\" is recursive (a cycle of references)", ref->u.string.bytes);
	for (size_t i = 0; i < c->n_memo; i++)
		if (c->memo[i].target == target)
			return c->memo[i].node;

	/* errors inside the target name the target's place */
	memcpy(saved, c->path, saved_len + 1);
	snprintf(c->path, PATH_CAP, "%s", ref->u.string.bytes + 1);
	c->path_len = strlen(c->path);
	node = compile(c, target);
	memcpy(c->path, saved, saved_len + 1);
	c->path_len = saved_len;
	if (node == NODE_ERROR)
		return NODE_ERROR;
	if (!cai_grow((void **) &c->memo, &c->cap_memo, c->n_memo + 1, sizeof(ref_memo)))
		return fail_oom(c);
	c->memo[c->n_memo].target = target;
	c->memo[c->n_memo].node = node;
	c->n_memo++;
	return node;
}

static uint32_t
compile_any_of(compiler *c, const json_value *arr)
{
	uint32_t   *alts;
	uint32_t	node = NODE_ERROR;

	if (arr->type != JSON_ARRAY || arr->u.array.n == 0)
		return fail(c, "\"anyOf\" must be a non-empty array of schemas");
	alts = calloc(arr->u.array.n, sizeof(uint32_t));
	if (!alts)
		return fail_oom(c);
	for (size_t i = 0; i < arr->u.array.n; i++)
	{
		size_t		old = path_push_index(c, "anyOf", i);

		alts[i] = compile(c, arr->u.array.items[i]);
		path_pop(c, old);
		if (alts[i] == NODE_ERROR)
			goto done;
	}
	node = make_choice(c, alts, arr->u.array.n);
done:
	free(alts);
	return node;
}

/* ---------------------------------------------------------------------------------------------
 * A schema
 * ------------------------------------------------------------------------------------------- */

static uint32_t
compile_object_schema(compiler *c, const json_value *s)
{
	schema_keys k;
	unsigned	types = 0;
	int			n_constraints = 0;
	uint32_t	rest;

	memset(&k, 0, sizeof(k));
	for (size_t i = 0; i < s->u.object.n; i++)
	{
		const json_member *m = &s->u.object.members[i];
		int			ki;

		if (strlen(m->key) != m->key_len)
			return fail(c, "unsupported JSON Schema keyword with a \\u0000 in its name");
		if (is_annotation(m->key))
			continue;
		if (strcmp(m->key, "$defs") == 0 || strcmp(m->key, "definitions") == 0)
		{
			if (m->value->type != JSON_OBJECT)
				return fail(c, "\"%s\" must be an object of schemas", m->key);
			continue;			/* compiled when referenced */
		}
		ki = keyword_index(m->key);
		if (ki < 0)
			return fail(c, "unsupported JSON Schema keyword \"%s\"", m->key);
		k.v[ki] = m->value;
		n_constraints++;
	}

	if (key(&k, "$ref") || key(&k, "anyOf"))
	{
		const char *which = key(&k, "$ref") ? "$ref" : "anyOf";

		if (n_constraints > 1)
			return fail(c, "unsupported: \"%s\" beside other constraints (put them inside the referenced schema or each alternative)", which);
		return key(&k, "$ref") ? compile_ref(c, key(&k, "$ref")) : compile_any_of(c, key(&k, "anyOf"));
	}

	if (!check_keyword_values(c, &k))
		return NODE_ERROR;
	if (key(&k, "type") && !parse_types(c, key(&k, "type"), &types))
		return NODE_ERROR;
	if (!key(&k, "type"))
		/* no type: the types the keywords speak of, else any */
		for (int i = 0; i < N_KEYWORDS; i++)
			if (k.v[i] && keywords[i].type)
				types |= TYPE_BIT(keywords[i].type);

	if (types == 0)
		rest = NODE_ERROR;		/* any value */
	else
	{
		rest = compile_types(c, &k, types);
		if (rest == NODE_ERROR)
			return NODE_ERROR;
	}
	if (key(&k, "enum") || key(&k, "const"))
		return rest == NODE_UNSAT ? NODE_UNSAT : compile_enum(c, &k, rest);
	return types == 0 ? any_value(c) : rest;
}

static uint32_t
compile(compiler *c, const json_value *s)
{
	uint32_t	node;

	if (s->type == JSON_TRUE)
		return any_value(c);
	if (s->type == JSON_FALSE)
		return NODE_UNSAT;
	if (s->type != JSON_OBJECT)
		return fail(c, "a schema must be an object or a boolean");
	if (c->depth >= MAX_NESTING)
		return fail(c, "schemas nested more than %d deep (counting $refs)", MAX_NESTING);
	c->stack[c->depth++] = s;
	node = compile_object_schema(c, s);
	c->depth--;
	return c->status == CAI_OK ? node : NODE_ERROR;
}

static cai_status
finish(compiler *c, uint32_t root, cai_grammar **out)
{
	if (c->status == CAI_OK && root == NODE_UNSAT)
		fail(c, "the schema admits no value");
	if (c->status == CAI_OK)
	{
		c->g->root = root;
		if (!gm_grammar_finish(c->g))
			c->status = cai_fail(c->err, CAI_ERR_INVALID_ARGUMENT,
								 "the schema is too complex: it nests deeper than %d values or has more than %d alternatives open at once",
								 GM_MAX_FRAMES - 1, GM_MAX_THREADS);
	}
	if (c->status != CAI_OK)
	{
		cai_grammar_free(c->g);
		return c->status;
	}
	*out = c->g;
	return CAI_OK;
}

cai_status
cai_grammar_from_schema(const char *schema, size_t len, cai_grammar **out, cai_error *err)
{
	compiler	c;
	json_doc   *doc = NULL;
	cai_status	st;
	uint32_t	root;

	*out = NULL;
	st = json_parse(schema, len, 0, &doc, err);
	if (st != CAI_OK)
	{
		if ((st == CAI_ERR_INVALID_ARGUMENT || st == CAI_ERR_UNSUPPORTED) && err)
		{
			char		msg[CAI_ERROR_MESSAGE_SIZE];

			snprintf(msg, sizeof(msg), "%s", err->message);
			if (st == CAI_ERR_UNSUPPORTED)
				cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "the JSON schema %s", msg);
			else
				cai_fail(err, st, "the JSON schema is not valid JSON: %s", msg);
		}
		return st == CAI_ERR_UNSUPPORTED ? CAI_ERR_INVALID_ARGUMENT : st;
	}
	memset(&c, 0, sizeof(c));
	c.doc = json_doc_root(doc);
	c.err = err;
	c.status = CAI_OK;
	c.any_value = NODE_ERROR;
	c.g = gm_grammar_new();
	if (!c.g)
	{
		json_doc_free(doc);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory compiling a JSON schema");
	}
	root = compile(&c, c.doc);
	st = finish(&c, root, out);
	free(c.memo);
	json_doc_free(doc);
	return st;
}

cai_status
cai_grammar_any_object(cai_grammar **out, cai_error *err)
{
	compiler	c;

	*out = NULL;
	memset(&c, 0, sizeof(c));
	c.err = err;
	c.status = CAI_OK;
	c.g = gm_grammar_new();
	if (!c.g)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory making a grammar");
	c.any_value = new_node(&c, GM_ANY);
	if (c.any_value != NODE_ERROR)
		c.g->nodes[c.any_value].object_only = true;
	return finish(&c, c.any_value, out);
}
