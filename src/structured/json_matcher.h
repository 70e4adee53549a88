/*
 * json_matcher.h — a compiled JSON grammar (what json_schema.c makes of a schema) and the
 * byte-level matcher that walks it.  Internal to the engine: grammar.h is the API.
 *
 * The grammar is a graph of nodes without cycles: a string with length bounds, a number with
 * bounds, a set of literal serializations (enum/const, booleans, null), an object with its
 * declared properties in order, an array of one item schema, a choice (anyOf) among nodes that
 * are never choices themselves, and "any JSON value" (nesting bounded).
 *
 * The matcher is a pushdown automaton over bytes.  A thread is a stack of frames, one per value
 * being read (the document at the bottom); a matcher state is a set of threads, because a
 * choice forks one thread per alternative at the first byte of the value, and the alternatives
 * that the bytes rule out die.  Every state the matcher can reach can still be completed to a
 * valid value: the compiler rejects schemas with no value, and every frame refuses a byte
 * after which it could not end (a number beyond its bounds, a string over its maximum length, a
 * required property skipped, a lone surrogate escape).
 */
#ifndef CAI_JSON_MATCHER_H
#define CAI_JSON_MATCHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"
#include "util.h"

#define GM_MAX_WS 16			/* whitespace bytes in a row between tokens */
#define GM_ANY_DEPTH 16			/* arrays and objects nested inside an "any JSON" value */
#define GM_INT_DIGITS 19
#define GM_FRAC_DIGITS 16
#define GM_EXP_DIGITS 3
#define GM_UNBOUNDED UINT32_MAX /* no maximum length or item count */
#define GM_MAX_FRAMES 256		/* deepest stack a compiled grammar may need */
#define GM_MAX_THREADS 256		/* most threads (live anyOf alternatives) a grammar may need */

/* Numbers are compared as integers scaled by 10^GM_FRAC_DIGITS. */
typedef __int128 gm_i128;

typedef enum gm_kind
{
	GM_ANY = 0,
	GM_STRING,
	GM_NUMBER,
	GM_LITERALS,
	GM_OBJECT,
	GM_ARRAY,
	GM_ANYOF
} gm_kind;

typedef struct gm_node
{
	gm_i128		lo;				/* GM_NUMBER: bounds, scaled, on the value grid (inclusive) */
	gm_i128		hi;
	uint8_t		kind;
	bool		integer;		/* GM_NUMBER: integers only (no fraction, no exponent) */
	bool		bounded;		/* GM_NUMBER: bounds given (no exponent then) */
	bool		object_only;	/* GM_ANY: an object at the top ({"type": "json_object"}) */
	uint32_t	min;			/* GM_STRING: code points; GM_ARRAY: items */
	uint32_t	max;			/* likewise, GM_UNBOUNDED for none */
	uint32_t	child;			/* GM_ARRAY: the item node */
	uint32_t	first;			/* GM_OBJECT: props, GM_LITERALS: lits, GM_ANYOF: alts */
	uint32_t	count;
} gm_node;

typedef struct gm_prop
{
	uint32_t	key_off;		/* the key's serialization, quotes included, in bytes[] */
	uint32_t	key_len;
	uint32_t	value;			/* node */
	uint32_t	last;			/* index (in the object) of the last property that may come
								 * next when this one is the first that may: the first
								 * required one from here on, else the last */
	bool		required;
	bool		rest_optional;	/* every property from this one on is optional */
} gm_prop;

typedef struct gm_lit
{
	uint32_t	off;			/* serialization in bytes[]; sorted within a node */
	uint32_t	len;
} gm_lit;

struct cai_grammar
{
	gm_node    *nodes;
	uint32_t	n_nodes;
	gm_prop    *props;
	uint32_t	n_props;
	gm_lit	   *lits;
	uint32_t	n_lits;
	uint32_t   *alts;
	uint32_t	n_alts;
	char	   *bytes;
	size_t		n_bytes;
	size_t		cap_nodes,
				cap_props,
				cap_lits,
				cap_alts,
				cap_bytes;

	uint32_t	root;
	uint32_t	any_string;		/* the implicit nodes of "any JSON" values */
	uint32_t	any_number;
	uint32_t	any_word;		/* true, false, null */
	uint32_t	max_frames;		/* deepest stack, the document frame included */
	uint32_t	max_threads;	/* most live threads */
	uint32_t	max_alts;		/* widest choice */
	uint8_t		whitespace;		/* cai_json_whitespace */
};

/* ---------------------------------------------------------------------------------------------
 * Building a grammar (json_schema.c)
 * ------------------------------------------------------------------------------------------- */

/* An empty grammar with the implicit nodes of "any JSON"; NULL when out of memory. */
cai_grammar *gm_grammar_new(void);

/* Appends a node (zeroed but for kind, max = GM_UNBOUNDED); its index, or UINT32_MAX. */
uint32_t	gm_add_node(cai_grammar *g, gm_kind kind);
bool		gm_add_bytes(cai_grammar *g, const void *bytes, size_t n, uint32_t *off);
bool		gm_add_prop(cai_grammar *g, const gm_prop *prop);
bool		gm_add_lit(cai_grammar *g, const gm_lit *lit);
bool		gm_add_alt(cai_grammar *g, uint32_t node);

/*
 * Fills max_frames, max_threads and max_alts from the graph under root.  False when the
 * grammar needs more than GM_MAX_FRAMES frames or GM_MAX_THREADS threads.
 */
bool		gm_grammar_finish(cai_grammar *g);

/*
 * True when the bytes are one complete value of node (as the document's value), e.g. to keep
 * only the enum values that the rest of a schema admits.  -1 when out of memory.
 */
int			gm_accepts(const cai_grammar *g, uint32_t node, const char *bytes, size_t len);

/* Numbers: 10^k as gm_i128 (k <= 38), and the scale of the value grid. */
gm_i128		gm_pow10(int k);
#define GM_SCALE (gm_pow10(GM_FRAC_DIGITS))
/* The largest magnitude a generated number can have (19 integer and 16 fraction digits). */
#define GM_MAX_MAGNITUDE (gm_pow10(GM_INT_DIGITS + GM_FRAC_DIGITS) - 1)

/* ---------------------------------------------------------------------------------------------
 * Threads and matching
 * ------------------------------------------------------------------------------------------- */

typedef enum gm_frame_kind
{
	FR_DOC = 0,
	FR_STRING,
	FR_NUMBER,
	FR_LITERAL,
	FR_OBJECT,
	FR_ARRAY,
	FR_ANY_OBJECT,
	FR_ANY_ARRAY
} gm_frame_kind;

/* String frame phases (the others are private to json_matcher.c). */
#define GM_STRING_PLAIN 0

/*
 * One value being read.  Fields not used by a kind and phase are zero, so that equal threads
 * are equal bytes.
 */
typedef struct gm_frame
{
	uint32_t	node;
	uint8_t		kind;
	uint8_t		phase;
	uint8_t		c0;
	uint8_t		c1;
	uint32_t	x;
	uint32_t	y;
	uint64_t	u;
	uint64_t	w;
} gm_frame;

typedef struct gm_thread
{
	uint32_t	depth;			/* frames in use */
	uint32_t	ws;				/* whitespace bytes just read in a row */
	gm_frame	frames[];
} gm_thread;

static inline size_t
gm_thread_bytes(const gm_thread *t)
{
	return sizeof(gm_thread) + (size_t) t->depth * sizeof(gm_frame);
}

static inline const gm_frame *
gm_top(const gm_thread *t)
{
	return &t->frames[t->depth - 1];
}

/* Sets of threads are held back to back in a cai_buf (util.h). */

/* Appends the start thread of a document whose value is node; false when out of memory. */
bool		gm_start(const cai_grammar *g, uint32_t node, cai_buf *buf);

/*
 * Appends to buf the threads that follow from the n threads at buf->data + off on byte b,
 * without duplicates.  Returns how many (0: the byte is refused), -1 when out of memory.  The
 * input stays where it is (buf->data may move: hold offsets, not pointers).
 */
int			gm_feed(const cai_grammar *g, cai_buf *buf, size_t off, int n, uint8_t b);

/* The bytes n threads starting at p take. */
size_t		gm_set_bytes(const unsigned char *p, int n);

/* True when the thread's text is a complete value (the document may end here). */
bool		gm_thread_complete(const cai_grammar *g, const gm_thread *t);

/*
 * For a thread whose top frame is a string between characters (no escape or UTF-8 sequence
 * under way): true, with the string's node and the code points read so far (counted only as
 * far as the node's bounds need).
 */
bool		gm_thread_in_plain_string(const cai_grammar *g, const gm_thread *t,
									  const gm_node **node, uint32_t *count);

/*
 * Appends the thread t as it is after its top frame, a string, closes (the closing quote
 * accepted whatever its length).
 */
bool		gm_close_string(const cai_grammar *g, const gm_thread *t, cai_buf *buf);

#endif							/* CAI_JSON_MATCHER_H */
