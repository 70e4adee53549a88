/*
 * token_mask.c — the vocabulary index and the per-request state of constrained decoding (the
 * token half of grammar.h; the byte half is json_matcher.c).
 *
 * A token is allowed when the matcher takes all of its bytes.  Trying every token from every
 * state would cost the whole vocabulary's bytes per step; instead the index keeps
 *
 *  - a trie of every token's bytes: the allowed tokens are found by walking it from the
 *    matcher's state, feeding one byte per edge and abandoning a subtree at the first byte
 *    refused.  Outside strings almost every subtree dies at its first or second byte, so a
 *    walk visits a few hundred nodes;
 *  - for the inside of a string, where nearly every token is allowed and a walk would visit
 *    the whole trie: what each token does when read from between two characters of a string.
 *    That depends on its bytes alone: it is refused (a raw control byte, a bad escape, invalid
 *    UTF-8), or it stays inside the string adding k code points ("STAY"), or it closes the
 *    string after k code points and goes on with the bytes after the quote ("EXIT").  STAY
 *    tokens are kept as bitsets by k (allowed: k <= what maxLength leaves), EXIT tokens in a
 *    second trie of the bytes after their quote, walked from the state after the string
 *    (allowed: the walk takes the rest, and minLength <= count + k <= maxLength).
 *
 * The classification runs the matcher itself over each token (on a string-only grammar), so
 * the fast path and the byte-by-byte path cannot disagree on what a string takes.
 */
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "json_matcher.h"
#include "util.h"

/* STAY tokens with up to this many code points get cumulative bitsets; longer ones a list. */
#define STAY_BITSETS 64

/* ---------------------------------------------------------------------------------------------
 * Tries
 * ------------------------------------------------------------------------------------------- */

typedef struct trie_node
{
	uint32_t	first_child;	/* children are consecutive nodes */
	uint32_t	tok_first;		/* the entries that end here: ids[tok_first .. + tok_n] */
	uint32_t	tok_n;
	uint16_t	n_children;
	uint8_t		byte;			/* the edge from the parent */
} trie_node;

typedef struct trie
{
	trie_node  *nodes;			/* nodes[0] is the root */
	uint32_t	n_nodes;
	int32_t    *ids;			/* token ids in byte order */
	uint32_t   *ks;				/* EXIT trie: code points before the quote, parallel to ids */
	uint32_t	depth;			/* the longest entry */
} trie;

typedef struct trie_entry
{
	const unsigned char *bytes;
	uint32_t	len;
	int32_t		id;
	uint32_t	k;
} trie_entry;

static int
entry_cmp(const void *a, const void *b)
{
	const trie_entry *x = a;
	const trie_entry *y = b;
	uint32_t	n = x->len < y->len ? x->len : y->len;
	int			r = n ? memcmp(x->bytes, y->bytes, n) : 0;

	if (r != 0)
		return r;
	if (x->len != y->len)
		return x->len < y->len ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

typedef struct trie_work
{
	uint32_t	node;
	uint32_t	lo;				/* entries [lo, hi) share the node's prefix */
	uint32_t	hi;
	uint32_t	depth;
} trie_work;

/*
 * Builds a trie over entries (sorted here), breadth first so that each node's children are
 * consecutive.  At most one node per entry byte, plus the root.
 */
static bool
trie_build(trie *t, trie_entry *e, uint32_t n, bool with_k)
{
	size_t		max_nodes = 1;
	trie_work  *queue;
	size_t		head = 0,
				tail = 0;

	memset(t, 0, sizeof(*t));
	for (uint32_t i = 0; i < n; i++)
	{
		max_nodes += e[i].len;
		if (e[i].len > t->depth)
			t->depth = e[i].len;
	}
	if (max_nodes > UINT32_MAX)
		return false;
	qsort(e, n, sizeof(trie_entry), entry_cmp);
	t->nodes = calloc(max_nodes, sizeof(trie_node));
	t->ids = malloc((n ? n : 1) * sizeof(int32_t));
	t->ks = with_k ? malloc((n ? n : 1) * sizeof(uint32_t)) : NULL;
	queue = malloc(max_nodes * sizeof(trie_work));
	if (!t->nodes || !t->ids || (with_k && !t->ks) || !queue)
	{
		free(queue);
		return false;
	}
	for (uint32_t i = 0; i < n; i++)
	{
		t->ids[i] = e[i].id;
		if (with_k)
			t->ks[i] = e[i].k;
	}
	t->n_nodes = 1;
	queue[tail++] = (trie_work) {0, 0, n, 0};
	while (head < tail)
	{
		trie_work	w = queue[head++];
		trie_node  *node = &t->nodes[w.node];
		uint32_t	i = w.lo;

		/* entries that end here sort first */
		while (i < w.hi && e[i].len == w.depth)
			i++;
		node->tok_first = w.lo;
		node->tok_n = i - w.lo;
		node->first_child = t->n_nodes;
		while (i < w.hi)
		{
			uint32_t	j = i;
			unsigned char b = e[i].bytes[w.depth];
			trie_node  *child = &t->nodes[t->n_nodes];

			while (j < w.hi && e[j].bytes[w.depth] == b)
				j++;
			child->byte = b;
			queue[tail++] = (trie_work) {t->n_nodes, i, j, w.depth + 1};
			t->n_nodes++;
			t->nodes[w.node].n_children++;
			i = j;
		}
	}
	free(queue);
	return true;
}

static void
trie_free(trie *t)
{
	free(t->nodes);
	free(t->ids);
	free(t->ks);
	memset(t, 0, sizeof(*t));
}

/* ---------------------------------------------------------------------------------------------
 * The index
 * ------------------------------------------------------------------------------------------- */

typedef struct long_stay
{
	int32_t		id;
	uint32_t	k;
} long_stay;

struct cai_token_index
{
	const cai_tokenizer *tok;
	int			n_vocab;
	int			words;
	bool		drop_first_space;	/* SentencePiece: the reply's first space is not text */
	unsigned char *bytes;		/* every token's bytes */
	uint32_t   *off;
	uint32_t   *len;
	uint8_t    *usable;			/* may be allowed for its bytes */
	bool		byte_alone[256];	/* some usable token is this byte alone */
	uint64_t   *end_bits;		/* the end tokens */
	trie		main;			/* every usable token */
	/* strings: see the top of the file */
	uint32_t	stay_k_max;		/* the most code points a STAY token adds */
	uint32_t	n_stay_sets;	/* stay_le[0 .. n_stay_sets) */
	uint64_t   *stay_le;		/* [k][words]: STAY tokens of at most k code points */
	uint64_t   *stay_all;
	long_stay  *long_stays;		/* STAY tokens beyond the bitsets */
	uint32_t	n_long_stays;
	trie		exits;			/* EXIT tokens by the bytes after their quote */
};

static void
set_bit(uint64_t *bits, int32_t id)
{
	bits[id >> 6] |= (uint64_t) 1 << (id & 63);
}

int
cai_token_index_n_vocab(const cai_token_index *ix)
{
	return ix->n_vocab;
}

int
cai_token_index_mask_words(const cai_token_index *ix)
{
	return ix->words;
}

void
cai_token_index_free(cai_token_index *ix)
{
	if (!ix)
		return;
	free(ix->bytes);
	free(ix->off);
	free(ix->len);
	free(ix->usable);
	free(ix->end_bits);
	trie_free(&ix->main);
	free(ix->stay_le);
	free(ix->stay_all);
	free(ix->long_stays);
	trie_free(&ix->exits);
	free(ix);
}

/* Copies every token's bytes; marks the usable ones. */
static cai_status
read_vocabulary(cai_token_index *ix, cai_error *err)
{
	size_t		total = 0;

	ix->off = malloc((size_t) ix->n_vocab * sizeof(uint32_t));
	ix->len = malloc((size_t) ix->n_vocab * sizeof(uint32_t));
	ix->usable = calloc((size_t) ix->n_vocab, 1);
	if (!ix->off || !ix->len || !ix->usable)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory indexing the vocabulary");
	for (int i = 0; i < ix->n_vocab; i++)
	{
		int			n = cai_tokenizer_token_bytes(ix->tok, i, NULL, 0);

		ix->len[i] = n > 0 ? (uint32_t) n : 0;
		ix->off[i] = (uint32_t) total;
		total += ix->len[i];
		if (total > UINT32_MAX)
			return cai_fail(err, CAI_ERR_UNSUPPORTED, "the vocabulary's tokens hold more than 4 GiB");
	}
	ix->bytes = malloc(total ? total : 1);
	if (!ix->bytes)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory indexing the vocabulary");
	for (int i = 0; i < ix->n_vocab; i++)
	{
		cai_tokenizer_token_bytes(ix->tok, i, (char *) ix->bytes + ix->off[i], (int) ix->len[i]);
		ix->usable[i] = ix->len[i] > 0 && !cai_tokenizer_is_special(ix->tok, i) &&
			!(ix->end_bits[i >> 6] >> (i & 63) & 1);
	}
	return CAI_OK;
}

/*
 * Masks never run empty when every byte the matcher may insist on next is a token by itself:
 * the printable ASCII of JSON's syntax and escapes, and the continuation bytes that complete a
 * character a token left unfinished.  Other bytes (UTF-8 lead bytes, DEL) are only ever
 * insisted on by a schema's literals (keys, enum and const values): cai_grammar_state_create()
 * checks those against byte_alone.
 */
static cai_status
check_byte_tokens(cai_token_index *ix, cai_error *err)
{
	for (int i = 0; i < ix->n_vocab; i++)
		if (ix->usable[i] && ix->len[i] == 1)
			ix->byte_alone[ix->bytes[ix->off[i]]] = true;
	for (int b = 0x20; b <= 0xBF; b++)
		if (!ix->byte_alone[b] && (b <= 0x7E || b >= 0x80))
			return cai_fail(err, CAI_ERR_UNSUPPORTED,
							"the vocabulary has no token for the byte 0x%02X alone, which constrained decoding needs",
							b);
	return CAI_OK;
}

/* What a token does when read between two characters of a string (see the top of the file). */
typedef enum string_class
{
	STRING_DEAD = 0,
	STRING_STAY,
	STRING_EXIT
} string_class;

/*
 * Runs the bytes through a string of probe's grammar (no bounds that matter); *k: the code
 * points before the end or the quote, *quote: the quote's position (EXIT).
 */
static int
classify(const cai_grammar *probe, cai_buf *buf, const unsigned char *bytes, uint32_t len,
		 uint32_t *k, uint32_t *quote)
{
	size_t		off = 0;

	buf->len = 0;
	if (!gm_start(probe, probe->root, buf) || gm_feed(probe, buf, 0, 1, '"') < 0)
		return -1;
	off = gm_thread_bytes((const gm_thread *) buf->data);
	for (uint32_t i = 0; i < len; i++)
	{
		const gm_thread *t = (const gm_thread *) (buf->data + off);
		uint32_t	before = gm_top(t)->x;
		size_t		next = buf->len;
		int			n = gm_feed(probe, buf, off, 1, bytes[i]);

		if (n < 0)
			return -1;
		if (n == 0)
			return STRING_DEAD;
		off = next;
		if (gm_top((const gm_thread *) (buf->data + off))->kind == FR_DOC)
		{
			*k = before;
			*quote = i;
			return STRING_EXIT;
		}
	}
	*k = gm_top((const gm_thread *) (buf->data + off))->x;
	return STRING_STAY;
}

static cai_status
build_string_classes(cai_token_index *ix, cai_error *err)
{
	cai_grammar *probe = gm_grammar_new();
	cai_buf		buf = {0};
	uint32_t   *k = calloc((size_t) ix->n_vocab, sizeof(uint32_t));
	uint8_t    *cls = calloc((size_t) ix->n_vocab, 1);
	trie_entry *exits = calloc((size_t) ix->n_vocab, sizeof(trie_entry));
	uint32_t	n_exits = 0;
	cai_status	st = CAI_OK;
	size_t		set_bytes;

	if (!probe || !k || !cls || !exits)
		goto oom;
	probe->root = gm_add_node(probe, GM_STRING);
	if (probe->root == UINT32_MAX)
		goto oom;
	probe->nodes[probe->root].max = GM_UNBOUNDED - 1;	/* counts every code point */
	if (!gm_grammar_finish(probe))
		goto oom;

	for (int i = 0; i < ix->n_vocab; i++)
	{
		uint32_t	quote = 0;
		int			c;

		if (!ix->usable[i])
			continue;
		c = classify(probe, &buf, ix->bytes + ix->off[i], ix->len[i], &k[i], &quote);
		if (c < 0)
			goto oom;
		cls[i] = (uint8_t) c;
		if (c == STRING_STAY && k[i] > ix->stay_k_max)
			ix->stay_k_max = k[i];
		if (c == STRING_EXIT)
			exits[n_exits++] = (trie_entry) {
				ix->bytes + ix->off[i] + quote + 1, ix->len[i] - quote - 1, i, k[i]
			};
	}

	ix->n_stay_sets = (ix->stay_k_max < STAY_BITSETS ? ix->stay_k_max : STAY_BITSETS) + 1;
	if (!cai_mul_size((size_t) ix->n_stay_sets * ix->words, sizeof(uint64_t), &set_bytes))
		goto oom;
	ix->stay_le = calloc(1, set_bytes);
	ix->stay_all = calloc((size_t) ix->words, sizeof(uint64_t));
	if (!ix->stay_le || !ix->stay_all)
		goto oom;
	for (int i = 0; i < ix->n_vocab; i++)
	{
		if (cls[i] != STRING_STAY)
			continue;
		set_bit(ix->stay_all, i);
		if (k[i] < ix->n_stay_sets)
			set_bit(ix->stay_le + (size_t) k[i] * ix->words, i);
		else
			ix->n_long_stays++;
	}
	/* cumulative: stay_le[k] holds every STAY token of at most k code points */
	for (uint32_t s = 1; s < ix->n_stay_sets; s++)
		for (int w = 0; w < ix->words; w++)
			ix->stay_le[(size_t) s * ix->words + w] |= ix->stay_le[(size_t) (s - 1) * ix->words + w];
	ix->long_stays = malloc((ix->n_long_stays ? ix->n_long_stays : 1) * sizeof(long_stay));
	if (!ix->long_stays)
		goto oom;
	ix->n_long_stays = 0;
	for (int i = 0; i < ix->n_vocab; i++)
		if (cls[i] == STRING_STAY && k[i] >= ix->n_stay_sets)
			ix->long_stays[ix->n_long_stays++] = (long_stay) {i, k[i]};
	if (!trie_build(&ix->exits, exits, n_exits, true))
		goto oom;
	goto done;
oom:
	st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory indexing the vocabulary");
done:
	cai_buf_free(&buf);
	cai_grammar_free(probe);
	free(k);
	free(cls);
	free(exits);
	return st;
}

cai_status
cai_token_index_create(const cai_tokenizer *tok, const int32_t *end_ids, int n_end,
					   cai_token_index **out, cai_error *err)
{
	cai_token_index *ix = calloc(1, sizeof(*ix));
	cai_detokenizer d;
	trie_entry *entries = NULL;
	uint32_t	n = 0;
	cai_status	st;

	*out = NULL;
	if (!ix)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory indexing the vocabulary");
	ix->tok = tok;
	ix->n_vocab = cai_tokenizer_n_vocab(tok);
	ix->words = (ix->n_vocab + 63) / 64;
	cai_detokenizer_init(&d, tok);
	ix->drop_first_space = d.at_start;
	ix->end_bits = calloc((size_t) ix->words ? (size_t) ix->words : 1, sizeof(uint64_t));
	if (!ix->end_bits)
	{
		cai_token_index_free(ix);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory indexing the vocabulary");
	}
	for (int i = 0; i < n_end; i++)
		if (end_ids[i] >= 0 && end_ids[i] < ix->n_vocab)
			set_bit(ix->end_bits, end_ids[i]);

	st = read_vocabulary(ix, err);
	if (st == CAI_OK)
		st = check_byte_tokens(ix, err);
	if (st == CAI_OK && !(entries = calloc((size_t) ix->n_vocab + 1, sizeof(trie_entry))))
		st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory indexing the vocabulary");
	if (st == CAI_OK)
	{
		for (int i = 0; i < ix->n_vocab; i++)
			if (ix->usable[i])
				entries[n++] = (trie_entry) {ix->bytes + ix->off[i], ix->len[i], i, 0};
		if (!trie_build(&ix->main, entries, n, false))
			st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory indexing the vocabulary");
	}
	free(entries);
	if (st == CAI_OK)
		st = build_string_classes(ix, err);
	if (st != CAI_OK)
	{
		cai_token_index_free(ix);
		return st;
	}
	*out = ix;
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * States
 * ------------------------------------------------------------------------------------------- */

/* One level of a trie walk: the node, its next child to try, and the node's set of threads. */
typedef struct walk_level
{
	uint32_t	node;
	uint32_t	next;
	size_t		off;			/* the set in work: [off, end) */
	size_t		end;
	int			n;
} walk_level;

struct cai_grammar_state
{
	const cai_grammar *g;
	const cai_token_index *ix;
	cai_buf		cur;			/* the matcher's state: n_cur threads */
	int			n_cur;
	bool		at_start;		/* no token accepted yet (a first space is dropped) */
	cai_buf		work;			/* sets of threads while walking or accepting */
	walk_level *levels;
	uint32_t	cap_levels;
};

cai_status
cai_grammar_state_create(const cai_grammar *g, const cai_token_index *ix,
						 cai_grammar_state **out, cai_error *err)
{
	cai_grammar_state *s;
	uint32_t	depth = (ix->main.depth > ix->exits.depth ? ix->main.depth : ix->exits.depth) + 2;

	*out = NULL;
	for (size_t i = 0; i < g->n_bytes; i++)
		if (!ix->byte_alone[(unsigned char) g->bytes[i]])
			return cai_fail(err, CAI_ERR_UNSUPPORTED,
							"the schema's literals hold the byte 0x%02X, which no token of the vocabulary is alone",
							(unsigned char) g->bytes[i]);
	s = calloc(1, sizeof(*s));
	if (!s || !(s->levels = malloc(depth * sizeof(walk_level))) || !gm_start(g, g->root, &s->cur))
	{
		cai_grammar_state_free(s);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory starting a grammar state");
	}
	s->cap_levels = depth;
	s->g = g;
	s->ix = ix;
	s->n_cur = 1;
	s->at_start = true;
	*out = s;
	return CAI_OK;
}

cai_status
cai_grammar_state_clone(const cai_grammar_state *s, cai_grammar_state **out, cai_error *err)
{
	cai_grammar_state *c;
	cai_status	st = cai_grammar_state_create(s->g, s->ix, &c, err);

	*out = NULL;
	if (st != CAI_OK)
		return st;
	c->cur.len = 0;
	if (!cai_buf_reserve(&c->cur, s->cur.len))
	{
		cai_grammar_state_free(c);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory copying a grammar state");
	}
	memcpy(c->cur.data, s->cur.data, s->cur.len);
	c->cur.len = s->cur.len;
	c->n_cur = s->n_cur;
	c->at_start = s->at_start;
	*out = c;
	return CAI_OK;
}

void
cai_grammar_state_free(cai_grammar_state *s)
{
	if (!s)
		return;
	cai_buf_free(&s->cur);
	cai_buf_free(&s->work);
	free(s->levels);
	free(s);
}

bool
cai_grammar_state_complete(const cai_grammar_state *s)
{
	size_t		off = 0;

	for (int i = 0; i < s->n_cur; i++)
	{
		const gm_thread *t = (const gm_thread *) (s->cur.data + off);

		if (gm_thread_complete(s->g, t))
			return true;
		off += gm_thread_bytes(t);
	}
	return false;
}

/* The code points an EXIT token may have read before its quote: [k_lo, k_hi]. */
typedef struct k_range
{
	uint32_t	lo;
	uint32_t	hi;
} k_range;

static void
mark_tokens(const trie *t, const trie_node *node, const k_range *kr, uint64_t *bits)
{
	for (uint32_t i = node->tok_first; i < node->tok_first + node->tok_n; i++)
		if (!kr || (t->ks[i] >= kr->lo && t->ks[i] <= kr->hi))
			set_bit(bits, t->ids[i]);
}

/*
 * Marks the tokens of trie t whose bytes the n threads at work[off..) take, walking depth
 * first.  skip_space: the root's ' ' edge is not fed (a SentencePiece reply's first space) and
 * the token that is only that space is not marked.  kr: EXIT trie filter.
 */
static bool
walk(cai_grammar_state *s, const trie *t, size_t off, int n, bool skip_space,
	 const k_range *kr, uint64_t *bits)
{
	int			sp = 0;

	mark_tokens(t, &t->nodes[0], kr, bits);
	s->levels[0] = (walk_level) {0, 0, off, s->work.len, n};
	while (sp >= 0)
	{
		walk_level *l = &s->levels[sp];
		const trie_node *node = &t->nodes[l->node];
		const trie_node *child;
		int			m;

		if (l->next == node->n_children)
		{
			s->work.len = l->off;
			sp--;
			continue;
		}
		child = &t->nodes[node->first_child + l->next++];
		s->work.len = l->end;
		if (skip_space && sp == 0 && child->byte == ' ')
		{
			if (!cai_buf_reserve(&s->work, l->end - l->off))
				return false;
			memcpy(s->work.data + s->work.len, s->work.data + l->off, l->end - l->off);
			s->work.len += l->end - l->off;
			m = l->n;
		}
		else
		{
			m = gm_feed(s->g, &s->work, l->off, l->n, child->byte);
			if (m < 0)
				return false;
			if (m == 0)
				continue;
			mark_tokens(t, child, kr, bits);
		}
		if (child->n_children > 0)
		{
			s->levels[sp + 1] = (walk_level) {
				(uint32_t) (child - t->nodes), 0, l->end, s->work.len, m
			};
			sp++;
		}
	}
	return true;
}

/* A thread inside a string: STAY bitsets, then the EXIT trie from the string's end. */
static bool
allow_in_string(cai_grammar_state *s, const gm_thread *t, const gm_node *n, uint32_t count,
				uint64_t *bits)
{
	const cai_token_index *ix = s->ix;
	uint64_t	remaining = n->max == GM_UNBOUNDED ? UINT64_MAX : (uint64_t) (n->max - count);
	k_range		kr = {count >= n->min ? 0 : n->min - count,
		remaining > UINT32_MAX ? UINT32_MAX : (uint32_t) remaining};
	const uint64_t *stay;
	size_t		off = s->work.len;

	if (remaining >= ix->stay_k_max)
		stay = ix->stay_all;
	else
	{
		stay = ix->stay_le + (size_t) (remaining < ix->n_stay_sets - 1 ? remaining : ix->n_stay_sets - 1) * ix->words;
		for (uint32_t i = 0; i < ix->n_long_stays; i++)
			if (ix->long_stays[i].k <= remaining)
				set_bit(bits, ix->long_stays[i].id);
	}
	for (int w = 0; w < ix->words; w++)
		bits[w] |= stay[w];
	if (kr.lo > kr.hi)
		return true;
	if (!gm_close_string(s->g, t, &s->work))
		return false;
	return walk(s, &ix->exits, off, 1, false, &kr, bits);
}

bool
cai_grammar_state_allowed(cai_grammar_state *s, uint64_t *bits)
{
	const cai_token_index *ix = s->ix;
	size_t		off = 0;
	int			n_rest = 0;

	memset(bits, 0, (size_t) ix->words * sizeof(uint64_t));
	s->work.len = 0;
	/* threads inside strings take the fast path; the others walk the trie together */
	for (int i = 0; i < s->n_cur; i++)
	{
		const gm_thread *t = (const gm_thread *) (s->cur.data + off);
		size_t		bytes = gm_thread_bytes(t);
		const gm_node *node;
		uint32_t	count;

		off += bytes;
		if (!(s->at_start && ix->drop_first_space) && gm_thread_in_plain_string(s->g, t, &node, &count))
			continue;
		if (!cai_buf_reserve(&s->work, bytes))
			goto oom;
		memcpy(s->work.data + s->work.len, t, bytes);
		s->work.len += bytes;
		n_rest++;
	}
	if (n_rest > 0 && !walk(s, &ix->main, 0, n_rest, s->at_start && ix->drop_first_space, NULL, bits))
		goto oom;
	off = 0;
	for (int i = 0; i < s->n_cur; i++)
	{
		const gm_thread *t = (const gm_thread *) (s->cur.data + off);
		const gm_node *node;
		uint32_t	count;

		off += gm_thread_bytes(t);
		s->work.len = 0;
		if (!(s->at_start && ix->drop_first_space) && gm_thread_in_plain_string(s->g, t, &node, &count) &&
			!allow_in_string(s, t, node, count, bits))
			goto oom;
	}
	if (cai_grammar_state_complete(s))
		for (int w = 0; w < ix->words; w++)
			bits[w] |= ix->end_bits[w];
	return true;
oom:
	memset(bits, 0xFF, (size_t) ix->words * sizeof(uint64_t));
	return false;
}

bool
cai_grammar_state_accept(cai_grammar_state *s, int32_t id)
{
	const cai_token_index *ix = s->ix;
	const unsigned char *b;
	uint32_t	len;
	size_t		off = 0;
	int			n;

	if (id < 0 || id >= ix->n_vocab)
		return false;
	if (ix->end_bits[id >> 6] >> (id & 63) & 1)
		return cai_grammar_state_complete(s);
	if (!ix->usable[id])
		return false;
	b = ix->bytes + ix->off[id];
	len = ix->len[id];
	if (s->at_start && ix->drop_first_space && b[0] == ' ')
		b++, len--;
	if (len == 0)
		return false;
	s->work.len = 0;
	if (!cai_buf_reserve(&s->work, s->cur.len))
		return false;
	memcpy(s->work.data, s->cur.data, s->cur.len);
	s->work.len = s->cur.len;
	n = s->n_cur;
	for (uint32_t i = 0; i < len; i++)
	{
		size_t		next = s->work.len;

		n = gm_feed(s->g, &s->work, off, n, b[i]);
		if (n <= 0)
			return false;
		off = next;
	}
	if (s->work.len - off > s->cur.len && !cai_buf_reserve(&s->cur, s->work.len - off - s->cur.len))
		return false;
	memcpy(s->cur.data, s->work.data + off, s->work.len - off);
	s->cur.len = s->work.len - off;
	s->n_cur = n;
	s->at_start = false;
	return true;
}
