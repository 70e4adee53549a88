/*
 * json_matcher.c — the byte-level pushdown matcher over a compiled JSON grammar (see
 * json_matcher.h), and the bookkeeping of building a grammar.
 *
 * A byte is read by the thread's top frame.  A frame that finishes its value pops itself and
 * tells its parent (value_done).  Numbers and literals that could still grow ("1" of enum
 * [1, 10]) end only when a byte that cannot continue them arrives: they pop and hand that byte
 * to their parent.  A value that starts on a choice (anyOf) forks: step() stops before the
 * value and says which choice; gm_feed() starts one copy of the thread per alternative.
 * Alternatives are never choices themselves, so a byte forks at most once.
 */
#include "json_matcher.h"

#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "util.h"

/* ---------------------------------------------------------------------------------------------
 * Phases
 * ------------------------------------------------------------------------------------------- */

enum
{
	DOC_BEFORE = 0, DOC_IN, DOC_DONE
};

/* objects and arrays, schema-driven or any */
enum
{
	CT_OPEN = 0,				/* after the opening bracket */
	CT_KEY,						/* reading a declared key (objects) */
	CT_IN_KEY,					/* a key string frame is above (any objects) */
	CT_AFTER_KEY,
	CT_BEFORE_VALUE,			/* after ':' (objects) or ',' (arrays) */
	CT_IN_VALUE,
	CT_AFTER_VALUE,
	CT_AFTER_COMMA				/* objects: a key must come */
};

enum
{
	STR_PLAIN = GM_STRING_PLAIN,
	STR_UTF8,					/* c0 continuation bytes to come, c1 the next one's range */
	STR_ESCAPE,					/* after a backslash */
	STR_HEX,					/* \u: c0 digits read, u their value */
	STR_NEED_BACKSLASH,			/* after a high surrogate escape */
	STR_NEED_U,
	STR_LOW_HEX					/* the low surrogate's digits: c0 read */
};

/* the range of the next continuation byte (STR_UTF8's c1) */
enum
{
	CONT_80_BF = 0, CONT_A0_BF, CONT_80_9F, CONT_90_BF, CONT_80_8F
};

enum
{
	NUM_START = 0,
	NUM_MINUS,
	NUM_INT,					/* c0 integer digits, u their value */
	NUM_DOT,
	NUM_FRAC,					/* c1 fraction digits, w their value */
	NUM_E,
	NUM_EXP_SIGN,
	NUM_EXP						/* x exponent digits */
};

typedef enum step_result
{
	STEP_DEAD = 0,
	STEP_OK,
	STEP_FORK					/* a choice starts on this byte: *fork names it */
} step_result;

/* 10^0 .. 10^19 fit 64 bits; the rest are 10^19 times them */
static const uint64_t pow10_u64[20] = {
	1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL, 100000000ULL,
	1000000000ULL, 10000000000ULL, 100000000000ULL, 1000000000000ULL, 10000000000000ULL,
	100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL,
	1000000000000000000ULL, 10000000000000000000ULL
};

gm_i128
gm_pow10(int k)
{
	return k < 20 ? (gm_i128) pow10_u64[k] : (gm_i128) pow10_u64[19] * pow10_u64[k - 19];
}

/* ---------------------------------------------------------------------------------------------
 * Frames
 * ------------------------------------------------------------------------------------------- */

static gm_frame *
top(gm_thread *t)
{
	return &t->frames[t->depth - 1];
}

static bool
push(const cai_grammar *g, gm_thread *t, gm_frame_kind kind, uint32_t node)
{
	gm_frame   *f;

	if (t->depth >= g->max_frames)
		return false;
	f = &t->frames[t->depth++];
	memset(f, 0, sizeof(*f));
	f->kind = (uint8_t) kind;
	f->node = node;
	return true;
}

/*
 * Whitespace between tokens: at most GM_MAX_WS bytes in a row, or in a compact grammar one
 * space where spaced JSON has one (after_separator: right after a ':' or a ',').
 */
static step_result
take_ws(const cai_grammar *g, gm_thread *t, uint8_t b, bool after_separator)
{
	if (g->whitespace == CAI_JSON_WS_COMPACT)
	{
		if (b != ' ' || !after_separator || t->ws > 0)
			return STEP_DEAD;
	}
	else if (t->ws >= GM_MAX_WS)
		return STEP_DEAD;
	t->ws++;
	return STEP_OK;
}

/* The top frame's value is complete: pop it and move its parent on. */
static void
pop_value(const cai_grammar *g, gm_thread *t)
{
	gm_frame   *p;

	t->depth--;
	p = top(t);
	switch (p->kind)
	{
		case FR_DOC:
			p->phase = DOC_DONE;
			break;
		case FR_ARRAY:
			{
				const gm_node *n = &g->nodes[p->node];
				uint32_t	limit = n->max != GM_UNBOUNDED ? n->max : n->min;

				/* counted only as far as the bounds need, so that equal states are equal */
				if (p->x < limit)
					p->x++;
				p->phase = CT_AFTER_VALUE;
				break;
			}
		case FR_ANY_OBJECT:
			p->phase = p->phase == CT_IN_KEY ? CT_AFTER_KEY : CT_AFTER_VALUE;
			break;
		default:
			p->phase = CT_AFTER_VALUE;
			break;
	}
}

static step_result step(const cai_grammar *g, gm_thread *t, uint8_t b, uint32_t *fork);
static bool start_value(const cai_grammar *g, gm_thread *t, uint32_t node, uint8_t b);

/* The value of node starts with byte b. */
static step_result
begin(const cai_grammar *g, gm_thread *t, uint32_t node, uint8_t b, uint32_t *fork)
{
	if (g->nodes[node].kind == GM_ANYOF)
	{
		*fork = node;
		return STEP_FORK;
	}
	return start_value(g, t, node, b) ? STEP_OK : STEP_DEAD;
}

/* An "any JSON" value starting with b, inside level containers of its own. */
static bool
start_any(const cai_grammar *g, gm_thread *t, int level, bool object_only, uint8_t b)
{
	uint32_t	fork;

	if (b == '{' || (b == '[' && !object_only))
	{
		if (level >= GM_ANY_DEPTH)
			return false;
		if (!push(g, t, b == '{' ? FR_ANY_OBJECT : FR_ANY_ARRAY, 0))
			return false;
		top(t)->c0 = (uint8_t) (level + 1);
		return true;
	}
	if (object_only)
		return false;
	if (b == '"')
		return push(g, t, FR_STRING, g->any_string);
	if (b == '-' || json_is_digit(b))
		return push(g, t, FR_NUMBER, g->any_number) && step(g, t, b, &fork) == STEP_OK;
	if (b == 't' || b == 'f' || b == 'n')
		return push(g, t, FR_LITERAL, g->any_word) && step(g, t, b, &fork) == STEP_OK;
	return false;
}

static bool
start_value(const cai_grammar *g, gm_thread *t, uint32_t node, uint8_t b)
{
	const gm_node *n = &g->nodes[node];
	uint32_t	fork;

	switch ((gm_kind) n->kind)
	{
		case GM_ANY:
			return start_any(g, t, 0, n->object_only, b);
		case GM_STRING:
			return b == '"' && push(g, t, FR_STRING, node);
		case GM_NUMBER:
			return push(g, t, FR_NUMBER, node) && step(g, t, b, &fork) == STEP_OK;
		case GM_LITERALS:
			return push(g, t, FR_LITERAL, node) && step(g, t, b, &fork) == STEP_OK;
		case GM_OBJECT:
			return b == '{' && push(g, t, FR_OBJECT, node);
		case GM_ARRAY:
			return b == '[' && push(g, t, FR_ARRAY, node);
		case GM_ANYOF:
			break;
	}
	return false;
}

/* ---------------------------------------------------------------------------------------------
 * Strings
 * ------------------------------------------------------------------------------------------- */

/* One more code point, if the maximum allows it. */
static bool
count_code_point(const gm_node *n, gm_frame *f)
{
	uint32_t	limit = n->max != GM_UNBOUNDED ? n->max : n->min;

	if (n->max != GM_UNBOUNDED && f->x >= n->max)
		return false;
	if (f->x < limit)
		f->x++;
	return true;
}

static bool
continuation_ok(uint8_t range, uint8_t b)
{
	switch (range)
	{
		case CONT_A0_BF:
			return b >= 0xA0 && b <= 0xBF;
		case CONT_80_9F:
			return b >= 0x80 && b <= 0x9F;
		case CONT_90_BF:
			return b >= 0x90 && b <= 0xBF;
		case CONT_80_8F:
			return b >= 0x80 && b <= 0x8F;
		default:
			return b >= 0x80 && b <= 0xBF;
	}
}

static void
back_to_plain(gm_frame *f)
{
	f->phase = STR_PLAIN;
	f->c0 = f->c1 = 0;
	f->u = 0;
}

static step_result
step_string(const cai_grammar *g, gm_thread *t, gm_frame *f, uint8_t b)
{
	const gm_node *n = &g->nodes[f->node];
	int			h;

	t->ws = 0;					/* a space inside a string is text, not whitespace */
	switch (f->phase)
	{
		case STR_PLAIN:
			if (b == '"')
			{
				if (f->x < n->min)
					return STEP_DEAD;
				pop_value(g, t);
				return STEP_OK;
			}
			if (b < 0x20)
				return STEP_DEAD;
			if (b < 0x80)
			{
				if (!count_code_point(n, f))
					return STEP_DEAD;
				if (b == '\\')
					f->phase = STR_ESCAPE;
				return STEP_OK;
			}
			/* a UTF-8 lead byte (Unicode table 3-7): how many continuation bytes, which range */
			if (b >= 0xC2 && b <= 0xDF)
				f->c0 = 1, f->c1 = CONT_80_BF;
			else if (b == 0xE0)
				f->c0 = 2, f->c1 = CONT_A0_BF;
			else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF)
				f->c0 = 2, f->c1 = CONT_80_BF;
			else if (b == 0xED)
				f->c0 = 2, f->c1 = CONT_80_9F;
			else if (b == 0xF0)
				f->c0 = 3, f->c1 = CONT_90_BF;
			else if (b >= 0xF1 && b <= 0xF3)
				f->c0 = 3, f->c1 = CONT_80_BF;
			else if (b == 0xF4)
				f->c0 = 3, f->c1 = CONT_80_8F;
			else
				return STEP_DEAD;
			if (!count_code_point(n, f))
				return STEP_DEAD;
			f->phase = STR_UTF8;
			return STEP_OK;
		case STR_UTF8:
			if (!continuation_ok(f->c1, b))
				return STEP_DEAD;
			f->c1 = CONT_80_BF;
			if (--f->c0 == 0)
				back_to_plain(f);
			return STEP_OK;
		case STR_ESCAPE:
			if (b == 'u')
			{
				f->phase = STR_HEX;
				return STEP_OK;
			}
			if (!strchr("\"\\/bfnrt", b) || b == 0)
				return STEP_DEAD;
			back_to_plain(f);
			return STEP_OK;
		case STR_HEX:
			if ((h = json_hex_value(b)) < 0)
				return STEP_DEAD;
			f->u = f->u * 16 + (uint64_t) h;
			f->c0++;
			/* "\uDC".."\uDF" could only become an unpaired low surrogate */
			if (f->c0 == 2 && f->u >= 0xDC && f->u <= 0xDF)
				return STEP_DEAD;
			if (f->c0 < 4)
				return STEP_OK;
			if (f->u == 0)
				return STEP_DEAD;	/* jsonb refuses \u0000 */
			if (f->u >= 0xD800 && f->u <= 0xDBFF)
			{
				f->phase = STR_NEED_BACKSLASH;
				f->c0 = 0;
				f->u = 0;
				return STEP_OK;
			}
			back_to_plain(f);
			return STEP_OK;
		case STR_NEED_BACKSLASH:
			if (b != '\\')
				return STEP_DEAD;
			f->phase = STR_NEED_U;
			return STEP_OK;
		case STR_NEED_U:
			if (b != 'u')
				return STEP_DEAD;
			f->phase = STR_LOW_HEX;
			return STEP_OK;
		case STR_LOW_HEX:
			if ((h = json_hex_value(b)) < 0)
				return STEP_DEAD;
			/* a low surrogate: DC00..DFFF */
			if ((f->c0 == 0 && h != 0xD) || (f->c0 == 1 && h < 0xC))
				return STEP_DEAD;
			if (++f->c0 == 4)
				back_to_plain(f);
			return STEP_OK;
	}
	return STEP_DEAD;
}

/* ---------------------------------------------------------------------------------------------
 * Numbers
 * ------------------------------------------------------------------------------------------- */

/* Does the signed interval of magnitudes [a, b] meet the node's bounds? */
static bool
meets_bounds(const gm_node *n, bool negative, gm_i128 a, gm_i128 b)
{
	gm_i128		lo = negative ? -b : a;
	gm_i128		hi = negative ? -a : b;

	return lo <= n->hi && hi >= n->lo;
}

/*
 * Whether some number that starts with what the frame has read (as if it had just read it:
 * phase, digits) lies within the node's bounds, given the digit limits.  The magnitudes a
 * prefix can still reach are, for each final count of integer digits, one interval; after the
 * point, one interval.
 */
static bool
number_feasible(const gm_node *n, const gm_frame *f)
{
	gm_i128		scale = GM_SCALE;
	bool		negative = f->y != 0;

	if (f->phase == NUM_START || f->phase == NUM_MINUS)
		return meets_bounds(n, negative, 0, n->integer ? (gm_pow10(GM_INT_DIGITS) - 1) * scale :
							GM_MAX_MAGNITUDE);
	if (f->phase == NUM_INT)
	{
		int			last = f->u == 0 ? f->c0 : GM_INT_DIGITS;	/* "0" cannot grow */

		for (int digits = f->c0; digits <= last; digits++)
		{
			gm_i128		p = gm_pow10(digits - f->c0);
			gm_i128		a = (gm_i128) f->u * p * scale;
			gm_i128		b = ((gm_i128) f->u + 1) * p * scale - (n->integer ? scale : 1);

			if (meets_bounds(n, negative, a, b))
				return true;
			if (!negative && a > n->hi)
				break;
			if (negative && -a < n->lo)
				break;
		}
		return false;
	}
	/* after the point: the integer part is fixed, the fraction so far is c1 digits */
	{
		gm_i128		unit = gm_pow10(GM_FRAC_DIGITS - f->c1);
		gm_i128		a = (gm_i128) f->u * scale + (gm_i128) f->w * unit;

		return meets_bounds(n, negative, a, a + unit - 1);
	}
}

/* Whether the number read so far is a whole number within the bounds. */
static bool
number_accepting(const gm_node *n, const gm_frame *f)
{
	gm_i128		v;

	switch (f->phase)
	{
		case NUM_INT:
			break;
		case NUM_FRAC:
			if (f->c1 == 0)
				return false;
			break;
		case NUM_EXP:
			return f->x > 0;
		default:
			return false;
	}
	if (!n->bounded)
		return true;
	v = (gm_i128) f->u * GM_SCALE + (gm_i128) f->w * gm_pow10(GM_FRAC_DIGITS - f->c1);
	if (f->y)
		v = -v;
	return v >= n->lo && v <= n->hi;
}

/* The frame's number continued by b, or false (f unchanged) when b cannot continue it. */
static bool
number_advance(const gm_node *n, gm_frame *f, uint8_t b)
{
	gm_frame	next = *f;

	switch (f->phase)
	{
		case NUM_START:
			if (b == '-')
			{
				next.phase = NUM_MINUS;
				next.y = 1;
				break;
			}
			/* fall through */
		case NUM_MINUS:
		case NUM_INT:
			if (json_is_digit(b))
			{
				if (f->phase == NUM_INT && (f->u == 0 || f->c0 >= GM_INT_DIGITS))
					return false;	/* no leading zero; at most 19 digits */
				next.phase = NUM_INT;
				next.u = f->u * 10 + (uint64_t) (b - '0');
				next.c0++;
				break;
			}
			if (f->phase != NUM_INT)
				return false;
			if (b == '.' && !n->integer)
			{
				next.phase = NUM_DOT;
				break;
			}
			if ((b == 'e' || b == 'E') && !n->integer && !n->bounded)
			{
				next.phase = NUM_E;
				break;
			}
			return false;
		case NUM_DOT:
		case NUM_FRAC:
			if (json_is_digit(b))
			{
				if (f->c1 >= GM_FRAC_DIGITS)
					return false;
				next.phase = NUM_FRAC;
				next.w = f->w * 10 + (uint64_t) (b - '0');
				next.c1++;
				break;
			}
			if (f->phase == NUM_FRAC && (b == 'e' || b == 'E') && !n->bounded)
			{
				next.phase = NUM_E;
				break;
			}
			return false;
		case NUM_E:
			if (b == '+' || b == '-')
			{
				next.phase = NUM_EXP_SIGN;
				break;
			}
			/* fall through */
		case NUM_EXP_SIGN:
		case NUM_EXP:
			if (!json_is_digit(b) || f->x >= GM_EXP_DIGITS)
				return false;
			next.phase = NUM_EXP;
			next.x++;			/* the exponent's value never matters: no bounds with one */
			break;
		default:
			return false;
	}
	if (n->bounded && !number_feasible(n, &next))
		return false;
	*f = next;
	return true;
}

/* ---------------------------------------------------------------------------------------------
 * Literals (enum, const, true/false/null)
 * ------------------------------------------------------------------------------------------- */

static const char *
lit_bytes(const cai_grammar *g, const gm_lit *l)
{
	return g->bytes + l->off;
}

static bool
literal_accepting(const cai_grammar *g, const gm_frame *f)
{
	const gm_node *n = &g->nodes[f->node];

	return g->lits[n->first + f->x].len == f->u;
}

/*
 * The literals of a node are sorted, so the ones that share the prefix read so far are
 * consecutive, starting at the frame's candidate x (u bytes read), and ordered by their next
 * byte: the first that continues with b is found by binary search.
 */
static step_result
step_literal(const cai_grammar *g, gm_thread *t, gm_frame *f, uint8_t b)
{
	const gm_node *n = &g->nodes[f->node];
	const gm_lit *lits = g->lits + n->first;
	const gm_lit *cur = &lits[f->x];
	const char *prefix = lit_bytes(g, cur);
	size_t		pos = f->u;
	uint32_t	lo = f->x,
				hi = n->count;
	uint32_t	fork;

	/* the first literal not below prefix + b */
	while (lo < hi)
	{
		uint32_t	mid = lo + (hi - lo) / 2;
		const gm_lit *l = &lits[mid];
		size_t		common = l->len < pos ? l->len : pos;
		int			c = memcmp(lit_bytes(g, l), prefix, common);

		if (c == 0)				/* a literal that ends at pos sorts before prefix + b */
			c = l->len <= pos ? -1 : (int) (uint8_t) lit_bytes(g, l)[pos] - (int) b;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < n->count && lits[lo].len > pos && (uint8_t) lit_bytes(g, &lits[lo])[pos] == b &&
		memcmp(lit_bytes(g, &lits[lo]), prefix, pos) == 0)
	{
		const gm_lit *l = &lits[lo];
		const gm_lit *after = lo + 1 < n->count ? &lits[lo + 1] : NULL;

		f->x = lo;
		f->u = pos + 1;
		/* complete, and no other literal continues it: done */
		if (l->len == pos + 1 &&
			!(after && after->len > pos + 1 && memcmp(lit_bytes(g, after), lit_bytes(g, l), pos + 1) == 0))
			pop_value(g, t);
		return STEP_OK;
	}
	if (cur->len != pos)
		return STEP_DEAD;
	/* a complete literal that b does not continue ends before b */
	pop_value(g, t);
	return step(g, t, b, &fork);
}

/* ---------------------------------------------------------------------------------------------
 * Objects and arrays
 * ------------------------------------------------------------------------------------------- */

/*
 * A declared key: the candidates are the properties from x to props[x].last (those after x
 * may only come if the ones skipped are optional); y is the first candidate whose key starts
 * with the u bytes read.
 */
static step_result
step_key(const cai_grammar *g, gm_frame *f, const gm_prop *props, uint8_t b)
{
	const gm_prop *cur = &props[f->y];
	const char *cur_key = g->bytes + cur->key_off;
	size_t		pos = f->u;

	for (uint32_t j = f->y; j <= props[f->x].last; j++)
	{
		const gm_prop *p = &props[j];
		const char *key = g->bytes + p->key_off;

		if (p->key_len > pos && (uint8_t) key[pos] == b &&
			(j == f->y || memcmp(key, cur_key, pos) == 0))
		{
			f->y = j;
			f->u = pos + 1;
			if (f->u == p->key_len)
			{
				f->phase = CT_AFTER_KEY;
				f->u = 0;
			}
			return STEP_OK;
		}
	}
	return STEP_DEAD;
}

static step_result
step_object(const cai_grammar *g, gm_thread *t, gm_frame *f, uint8_t b, uint32_t *fork)
{
	const gm_node *n = &g->nodes[f->node];
	const gm_prop *props = n->count ? g->props + n->first : NULL;	/* none may be declared */

	if (f->phase == CT_KEY)
		return step_key(g, f, props, b);
	if (json_is_ws(b))
		return take_ws(g, t, b, f->phase == CT_BEFORE_VALUE || f->phase == CT_AFTER_COMMA);
	switch (f->phase)
	{
		case CT_OPEN:
			if (b == '}' && (n->count == 0 || props[0].rest_optional))
				break;
			if (b != '"' || n->count == 0)
				return STEP_DEAD;
			f->phase = CT_KEY;
			f->x = f->y = 0;
			f->u = 1;
			return STEP_OK;
		case CT_AFTER_COMMA:
			if (b != '"')
				return STEP_DEAD;
			f->phase = CT_KEY;
			f->y = f->x;
			f->u = 1;
			return STEP_OK;
		case CT_AFTER_KEY:
			if (b != ':')
				return STEP_DEAD;
			f->phase = CT_BEFORE_VALUE;
			return STEP_OK;
		case CT_BEFORE_VALUE:
			f->phase = CT_IN_VALUE;
			return begin(g, t, props[f->y].value, b, fork);
		case CT_AFTER_VALUE:
			if (b == ',' && f->y + 1 < n->count)
			{
				f->phase = CT_AFTER_COMMA;
				f->x = f->y + 1;
				return STEP_OK;
			}
			if (b == '}' && (f->y + 1 >= n->count || props[f->y + 1].rest_optional))
				break;
			return STEP_DEAD;
		default:
			return STEP_DEAD;
	}
	pop_value(g, t);			/* the closing brace */
	return STEP_OK;
}

static step_result
step_array(const cai_grammar *g, gm_thread *t, gm_frame *f, uint8_t b, uint32_t *fork)
{
	const gm_node *n = &g->nodes[f->node];

	/* an array is before a value only after a comma */
	if (json_is_ws(b))
		return take_ws(g, t, b, f->phase == CT_BEFORE_VALUE);
	switch (f->phase)
	{
		case CT_OPEN:
			if (b == ']' && n->min == 0)
				break;
			if (n->max == 0)
				return STEP_DEAD;
			f->phase = CT_IN_VALUE;
			return begin(g, t, n->child, b, fork);
		case CT_BEFORE_VALUE:
			f->phase = CT_IN_VALUE;
			return begin(g, t, n->child, b, fork);
		case CT_AFTER_VALUE:
			if (b == ',' && f->x < n->max)
			{
				f->phase = CT_BEFORE_VALUE;
				return STEP_OK;
			}
			if (b == ']' && f->x >= n->min)
				break;
			return STEP_DEAD;
		default:
			return STEP_DEAD;
	}
	pop_value(g, t);			/* the closing bracket */
	return STEP_OK;
}

/* Objects and arrays inside an "any JSON" value; c0 is their nesting level. */
static step_result
step_any_container(const cai_grammar *g, gm_thread *t, gm_frame *f, uint8_t b)
{
	bool		object = f->kind == FR_ANY_OBJECT;
	uint8_t		close = object ? '}' : ']';

	if (json_is_ws(b))
		return take_ws(g, t, b, f->phase == CT_BEFORE_VALUE || f->phase == CT_AFTER_COMMA);
	switch (f->phase)
	{
		case CT_OPEN:
			if (b == close)
				break;
			/* fall through */
		case CT_AFTER_COMMA:
		case CT_BEFORE_VALUE:
			if (object && f->phase != CT_BEFORE_VALUE)
			{
				if (b != '"')
					return STEP_DEAD;
				f->phase = CT_IN_KEY;
				return push(g, t, FR_STRING, g->any_string) ? STEP_OK : STEP_DEAD;
			}
			f->phase = CT_IN_VALUE;
			return start_any(g, t, f->c0, false, b) ? STEP_OK : STEP_DEAD;
		case CT_AFTER_KEY:
			if (b != ':')
				return STEP_DEAD;
			f->phase = CT_BEFORE_VALUE;
			return STEP_OK;
		case CT_AFTER_VALUE:
			if (b == ',')
			{
				f->phase = object ? CT_AFTER_COMMA : CT_BEFORE_VALUE;
				return STEP_OK;
			}
			if (b == close)
				break;
			return STEP_DEAD;
		default:
			return STEP_DEAD;
	}
	pop_value(g, t);
	return STEP_OK;
}

/* ---------------------------------------------------------------------------------------------
 * One byte
 * ------------------------------------------------------------------------------------------- */

static step_result
step(const cai_grammar *g, gm_thread *t, uint8_t b, uint32_t *fork)
{
	gm_frame   *f = top(t);

	if (!json_is_ws(b))
		t->ws = 0;
	switch ((gm_frame_kind) f->kind)
	{
		case FR_DOC:
			if (f->phase != DOC_BEFORE)
				return STEP_DEAD;
			if (json_is_ws(b))
				return take_ws(g, t, b, false);
			f->phase = DOC_IN;
			return begin(g, t, f->node, b, fork);
		case FR_STRING:
			return step_string(g, t, f, b);
		case FR_NUMBER:
			{
				const gm_node *n = &g->nodes[f->node];

				if (number_advance(n, f, b))
					return STEP_OK;
				if (!number_accepting(n, f))
					return STEP_DEAD;
				pop_value(g, t);	/* the number ended before b */
				return step(g, t, b, fork);
			}
		case FR_LITERAL:
			return step_literal(g, t, f, b);
		case FR_OBJECT:
			return step_object(g, t, f, b, fork);
		case FR_ARRAY:
			return step_array(g, t, f, b, fork);
		case FR_ANY_OBJECT:
		case FR_ANY_ARRAY:
			return step_any_container(g, t, f, b);
	}
	return STEP_DEAD;
}

/* ---------------------------------------------------------------------------------------------
 * Sets of threads
 * ------------------------------------------------------------------------------------------- */

size_t
gm_set_bytes(const unsigned char *p, int n)
{
	size_t		bytes = 0;

	for (int i = 0; i < n; i++)
		bytes += gm_thread_bytes((const gm_thread *) (p + bytes));
	return bytes;
}

bool
gm_start(const cai_grammar *g, uint32_t node, cai_buf *buf)
{
	gm_thread  *t;

	if (!cai_buf_reserve(buf, sizeof(gm_thread) + sizeof(gm_frame)))
		return false;
	t = (gm_thread *) (buf->data + buf->len);
	t->depth = 0;
	t->ws = 0;
	if (!push(g, t, FR_DOC, node))
		return false;
	buf->len += gm_thread_bytes(t);
	return true;
}

/* Appends a copy of the thread at buf->data + off with room for one more frame. */
static gm_thread *
append_copy(cai_buf *buf, size_t off)
{
	size_t		bytes = gm_thread_bytes((const gm_thread *) (buf->data + off));
	gm_thread  *t;

	if (!cai_buf_reserve(buf, bytes + sizeof(gm_frame)))
		return NULL;
	t = (gm_thread *) (buf->data + buf->len);
	memcpy(t, buf->data + off, bytes);
	return t;
}

/* Drops the threads of the set at buf->data + start (n of them) that equal an earlier one. */
static int
dedupe(cai_buf *buf, size_t start, int n)
{
	size_t		kept_end = start;
	int			kept = 0;
	size_t		off = start;

	for (int i = 0; i < n; i++)
	{
		gm_thread  *t = (gm_thread *) (buf->data + off);
		size_t		bytes = gm_thread_bytes(t);
		bool		dup = false;

		for (size_t o = start; o < kept_end && !dup;)
		{
			const gm_thread *k = (const gm_thread *) (buf->data + o);
			size_t		kb = gm_thread_bytes(k);

			dup = kb == bytes && memcmp(k, t, bytes) == 0;
			o += kb;
		}
		if (!dup)
		{
			if (off != kept_end)
				memmove(buf->data + kept_end, t, bytes);
			kept_end += bytes;
			kept++;
		}
		off += bytes;
	}
	buf->len = kept_end;
	return kept;
}

int
gm_feed(const cai_grammar *g, cai_buf *buf, size_t off, int n, uint8_t b)
{
	size_t		out_start = buf->len;
	int			n_out = 0;

	for (int i = 0; i < n; i++)
	{
		size_t		in_bytes = gm_thread_bytes((const gm_thread *) (buf->data + off));
		size_t		work_off = buf->len;
		gm_thread  *t = append_copy(buf, off);
		uint32_t	fork = 0;
		step_result r;

		if (!t)
			return -1;
		r = step(g, t, b, &fork);
		if (r == STEP_OK)
		{
			buf->len += gm_thread_bytes(t);
			n_out++;
		}
		else if (r == STEP_FORK)
		{
			const gm_node *choice = &g->nodes[fork];
			size_t		template_bytes = gm_thread_bytes(t);

			/* the copy so far is the template: each alternative starts on a copy of it */
			buf->len += template_bytes;
			for (uint32_t a = 0; a < choice->count; a++)
			{
				gm_thread  *alt = append_copy(buf, work_off);

				if (!alt)
					return -1;
				if (start_value(g, alt, g->alts[choice->first + a], b))
				{
					buf->len += gm_thread_bytes(alt);
					n_out++;
				}
			}
			memmove(buf->data + work_off, buf->data + work_off + template_bytes,
					buf->len - work_off - template_bytes);
			buf->len -= template_bytes;
		}
		off += in_bytes;
	}
	return n_out > 1 ? dedupe(buf, out_start, n_out) : n_out;
}

bool
gm_thread_complete(const cai_grammar *g, const gm_thread *t)
{
	const gm_frame *f = gm_top(t);

	if (f->kind == FR_DOC)
		return f->phase == DOC_DONE;
	if (t->depth != 2)
		return false;
	if (f->kind == FR_NUMBER)
		return number_accepting(&g->nodes[f->node], f);
	if (f->kind == FR_LITERAL)
		return literal_accepting(g, f);
	return false;
}

bool
gm_thread_in_plain_string(const cai_grammar *g, const gm_thread *t, const gm_node **node,
						  uint32_t *count)
{
	const gm_frame *f = gm_top(t);

	if (f->kind != FR_STRING || f->phase != STR_PLAIN)
		return false;
	*node = &g->nodes[f->node];
	*count = f->x;
	return true;
}

bool
gm_close_string(const cai_grammar *g, const gm_thread *t, cai_buf *buf)
{
	gm_thread  *c;
	size_t		bytes = gm_thread_bytes(t);

	if (!cai_buf_reserve(buf, bytes))
		return false;
	c = (gm_thread *) (buf->data + buf->len);
	memcpy(c, t, bytes);
	c->ws = 0;
	pop_value(g, c);
	buf->len += gm_thread_bytes(c);
	return true;
}

int
gm_accepts(const cai_grammar *g, uint32_t node, const char *bytes, size_t len)
{
	cai_buf		buf = {0};
	size_t		off = 0;
	int			n = 1;
	int			result = 0;

	if (!gm_start(g, node, &buf))
		return -1;
	for (size_t i = 0; i < len && n > 0; i++)
	{
		size_t		next = buf.len;

		n = gm_feed(g, &buf, off, n, (uint8_t) bytes[i]);
		if (n < 0)
		{
			cai_buf_free(&buf);
			return -1;
		}
		/* keep only the new set at the front */
		memmove(buf.data, buf.data + next, buf.len - next);
		buf.len -= next;
		off = 0;
	}
	for (int i = 0; i < n && !result; i++)
	{
		const gm_thread *t = (const gm_thread *) (buf.data + off);

		result = gm_thread_complete(g, t);
		off += gm_thread_bytes(t);
	}
	cai_buf_free(&buf);
	return result;
}

/* ---------------------------------------------------------------------------------------------
 * Building
 * ------------------------------------------------------------------------------------------- */

/* Appends one element of size bytes to an array of the grammar (n counts, at most 2^32 - 2). */
static bool
append(void **items, size_t *cap, uint32_t *n, const void *item, size_t size)
{
	if (*n >= UINT32_MAX - 1 || !cai_grow(items, cap, (size_t) *n + 1, size))
		return false;
	memcpy((char *) *items + (size_t) *n * size, item, size);
	(*n)++;
	return true;
}

uint32_t
gm_add_node(cai_grammar *g, gm_kind kind)
{
	gm_node		n;

	memset(&n, 0, sizeof(n));
	n.kind = (uint8_t) kind;
	n.max = GM_UNBOUNDED;
	if (!append((void **) &g->nodes, &g->cap_nodes, &g->n_nodes, &n, sizeof(n)))
		return UINT32_MAX;
	return g->n_nodes - 1;
}

bool
gm_add_bytes(cai_grammar *g, const void *bytes, size_t n, uint32_t *off)
{
	size_t		need;

	if (!cai_add_size(g->n_bytes, n, &need) || need > UINT32_MAX ||
		!cai_grow((void **) &g->bytes, &g->cap_bytes, need, 1))
		return false;
	memcpy(g->bytes + g->n_bytes, bytes, n);
	*off = (uint32_t) g->n_bytes;
	g->n_bytes = need;
	return true;
}

bool
gm_add_prop(cai_grammar *g, const gm_prop *prop)
{
	return append((void **) &g->props, &g->cap_props, &g->n_props, prop, sizeof(*prop));
}

bool
gm_add_lit(cai_grammar *g, const gm_lit *lit)
{
	return append((void **) &g->lits, &g->cap_lits, &g->n_lits, lit, sizeof(*lit));
}

bool
gm_add_alt(cai_grammar *g, uint32_t node)
{
	return append((void **) &g->alts, &g->cap_alts, &g->n_alts, &node, sizeof(node));
}

cai_grammar *
gm_grammar_new(void)
{
	cai_grammar *g = calloc(1, sizeof(*g));
	static const char *const words[] = {"false", "null", "true"};	/* sorted */

	if (!g)
		return NULL;
	g->max_frames = GM_MAX_FRAMES;
	g->any_string = gm_add_node(g, GM_STRING);
	g->any_number = gm_add_node(g, GM_NUMBER);
	g->any_word = gm_add_node(g, GM_LITERALS);
	if (g->any_word == UINT32_MAX)
	{
		cai_grammar_free(g);
		return NULL;
	}
	g->nodes[g->any_word].first = g->n_lits;
	for (int i = 0; i < 3; i++)
	{
		gm_lit		l = {0, (uint32_t) strlen(words[i])};

		if (!gm_add_bytes(g, words[i], l.len, &l.off) || !gm_add_lit(g, &l))
		{
			cai_grammar_free(g);
			return NULL;
		}
	}
	g->nodes[g->any_word].count = 3;
	return g;
}

void
cai_grammar_set_whitespace(cai_grammar *g, cai_json_whitespace ws)
{
	g->whitespace = (uint8_t) ws;
}

void
cai_grammar_free(cai_grammar *g)
{
	if (!g)
		return;
	free(g->nodes);
	free(g->props);
	free(g->lits);
	free(g->alts);
	free(g->bytes);
	free(g);
}

/*
 * Frames (depth) and threads a node's values need: a choice adds its alternatives' threads,
 * a container needs the most of any one child, since only one child is open at a time.
 * Memoized per node (the graph is a DAG).
 */
static void
measure(const cai_grammar *g, uint32_t node, uint32_t *depth, uint32_t *threads,
		uint32_t *max_alts)
{
	const gm_node *n = &g->nodes[node];
	uint32_t	d = 1,
				t = 1;

	if (depth[node])
		return;
	switch ((gm_kind) n->kind)
	{
		case GM_ANY:
			d = GM_ANY_DEPTH + 1;
			break;
		case GM_STRING:
		case GM_NUMBER:
		case GM_LITERALS:
			break;
		case GM_OBJECT:
			for (uint32_t i = 0; i < n->count; i++)
			{
				uint32_t	v = g->props[n->first + i].value;

				measure(g, v, depth, threads, max_alts);
				if (depth[v] + 1 > d)
					d = depth[v] + 1;
				if (threads[v] > t)
					t = threads[v];
			}
			break;
		case GM_ARRAY:
			measure(g, n->child, depth, threads, max_alts);
			d = depth[n->child] + 1;
			t = threads[n->child];
			break;
		case GM_ANYOF:
			t = 0;
			if (n->count > *max_alts)
				*max_alts = n->count;
			for (uint32_t i = 0; i < n->count; i++)
			{
				uint32_t	v = g->alts[n->first + i];

				measure(g, v, depth, threads, max_alts);
				if (depth[v] > d)
					d = depth[v];
				t = t + threads[v] > GM_MAX_THREADS ? GM_MAX_THREADS + 1 : t + threads[v];
			}
			break;
	}
	depth[node] = d > GM_MAX_FRAMES ? GM_MAX_FRAMES + 1 : d;
	threads[node] = t;
}

bool
gm_grammar_finish(cai_grammar *g)
{
	uint32_t   *depth = calloc(g->n_nodes, sizeof(uint32_t));
	uint32_t   *threads = calloc(g->n_nodes, sizeof(uint32_t));
	uint32_t	max_alts = 1;
	bool		ok;

	if (!depth || !threads)
	{
		free(depth);
		free(threads);
		return false;
	}
	measure(g, g->root, depth, threads, &max_alts);
	g->max_frames = depth[g->root] + 1;
	g->max_threads = threads[g->root];
	g->max_alts = max_alts;
	ok = g->max_frames <= GM_MAX_FRAMES && g->max_threads <= GM_MAX_THREADS;
	free(depth);
	free(threads);
	return ok;
}
