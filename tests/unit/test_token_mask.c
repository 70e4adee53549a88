/*
 * test_token_mask.c — masks of allowed tokens (token_mask.c) over in-memory tokenizers: a
 * byte-level BPE vocabulary with JSON-shaped tokens (grammar_fixtures.h), SentencePiece ones
 * with and without the space prefix, and the real model's when it is there.
 *
 * The central check: random walks that pick random allowed tokens until the value is complete,
 * where at every step every token of the vocabulary is tried with accept() and must be taken
 * exactly when its bit is set, the mask is never empty before the value is complete, and the
 * text at the end parses, validates against the schema (json_validate.h, independent of the
 * matcher), is storable as jsonb and keeps the whitespace and digit limits.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "grammar.h"
#include "test.h"
#include "grammar_fixtures.h"

#define MAX_WALK 2000

/* ---------------------------------------------------------------------------------------------
 * Tokenizers
 * ------------------------------------------------------------------------------------------- */

static cai_tokenizer *
json_spm(bool space_prefix)
{
	static const char *const controls[] = {"<end_of_turn>"};

	return fixture_spm(space_prefix, controls, 1);
}

#define SPM_END_OF_TURN (259 + FIXTURE_SPM_N_PIECES)

static bool
bit(const uint64_t *bits, int32_t id)
{
	return bits[id >> 6] >> (id & 63) & 1;
}

/* ---------------------------------------------------------------------------------------------
 * Random walks
 * ------------------------------------------------------------------------------------------- */

typedef struct walk_result
{
	char		text[65536];
	size_t		len;
	int32_t		tokens[MAX_WALK];
	int			n_tokens;
	bool		complete;
} walk_result;

static uint64_t
next_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static bool
is_end(int32_t id, const int32_t *ends, int n_ends)
{
	for (int i = 0; i < n_ends; i++)
		if (ends[i] == id)
			return true;
	return false;
}

/*
 * Checks one mask against accept(): every token is tried on a copy of the state.  Also that a
 * refused token leaves the state as it was (its mask unchanged).
 */
static void
check_mask_exhaustively(cai_grammar_state *st, const uint64_t *bits, int n_vocab, int words)
{
	cai_grammar_state *copy = NULL;
	cai_error	err;
	int			mismatches = 0;
	int32_t		refused = -1;

	for (int32_t id = 0; id < n_vocab && mismatches < 5; id++)
	{
		bool		took;

		if (!copy && cai_grammar_state_clone(st, &copy, &err) != CAI_OK)
		{
			CHECK_MSG(false, "clone: %s", err.message);
			return;
		}
		took = cai_grammar_state_accept(copy, id);
		if (took != bit(bits, id))
		{
			CHECK_MSG(false, "token %d: allowed %d, accept %d", id, bit(bits, id), took);
			mismatches++;
		}
		if (took)
		{
			cai_grammar_state_free(copy);
			copy = NULL;
		}
		else
			refused = id;
	}
	cai_grammar_state_free(copy);
	if (refused >= 0)
	{
		uint64_t   *again = malloc(words * sizeof(uint64_t));

		CHECK(!cai_grammar_state_accept(st, refused));
		CHECK(cai_grammar_state_allowed(st, again));
		CHECK(memcmp(again, bits, words * sizeof(uint64_t)) == 0);
		free(again);
	}
}

/*
 * Walks from the start of a reply, picking random allowed tokens (an end token as soon as one is
 * allowed, mostly; closing tokens more often after a while) until an end token.  Every stride-th
 * step, up to `exhaustive` of them, checks every token against accept().
 */
static void
random_walk(const cai_grammar *g, const cai_token_index *ix, const cai_tokenizer *tok,
			const int32_t *ends, int n_ends, bool drop_first_space, uint64_t seed,
			int exhaustive, int stride, walk_result *w)
{
	cai_grammar_state *st;
	cai_error	err;
	int			n_vocab = cai_token_index_n_vocab(ix);
	int			words = cai_token_index_mask_words(ix);
	uint64_t   *bits = malloc(words * sizeof(uint64_t));
	int32_t    *allowed = malloc(n_vocab * sizeof(int32_t));
	uint64_t	rng = seed * 0x9E3779B97F4A7C15ull + 1;
	static const char closers[] = "\"}]1";

	w->len = 0;
	w->n_tokens = 0;
	w->complete = false;
	if (cai_grammar_state_create(g, ix, &st, &err) != CAI_OK)
	{
		CHECK_MSG(false, "state: %s", err.message);
		free(bits);
		free(allowed);
		return;
	}
	for (int step = 0; step < MAX_WALK; step++)
	{
		int			n_allowed = 0,
					n_closers = 0;
		int32_t		pick = -1,
					end_allowed = -1;
		int32_t		closer_ids[8];
		bool		complete = cai_grammar_state_complete(st);

		CHECK(cai_grammar_state_allowed(st, bits));
		for (int32_t id = 0; id < n_vocab; id++)
			if (bit(bits, id))
			{
				if (is_end(id, ends, n_ends))
					end_allowed = id;
				else
					allowed[n_allowed++] = id;
				CHECK_MSG(is_end(id, ends, n_ends) || !cai_tokenizer_is_special(tok, id),
						  "special token %d allowed", id);
			}
		for (int i = words * 64 - 1; i >= n_vocab; i--)
			CHECK(!bit(bits, i));
		CHECK_MSG((end_allowed >= 0) == complete, "end tokens %s while the value is %scomplete",
				  end_allowed >= 0 ? "allowed" : "refused", complete ? "" : "in");
		if (!complete && n_allowed == 0)
		{
			CHECK_MSG(false, "empty mask at step %d after \"%.*s\"", step, (int) w->len, w->text);
			break;
		}
		if (step % stride == 0 && step / stride < exhaustive)
			check_mask_exhaustively(st, bits, n_vocab, words);
		if (end_allowed >= 0 && (n_allowed == 0 || next_rand(&rng) % 8 != 0))
			pick = end_allowed;
		else
		{
			if (step > 150)
				for (const char *c = closers; *c; c++)
				{
					char		raw[2] = {*c, 0};

					for (int32_t id = 0; id < n_vocab && n_closers < 8; id++)
					{
						char		b[8];

						if (bit(bits, id) && cai_tokenizer_token_bytes(tok, id, b, sizeof(b)) == 1 &&
							b[0] == raw[0])
							closer_ids[n_closers++] = id;
					}
				}
			if (n_closers > 0 && next_rand(&rng) % 4 != 0)
				pick = closer_ids[next_rand(&rng) % n_closers];
			else
				pick = allowed[next_rand(&rng) % n_allowed];
		}
		if (!cai_grammar_state_accept(st, pick))
		{
			CHECK_MSG(false, "allowed token %d refused", pick);
			break;
		}
		w->tokens[w->n_tokens++] = pick;
		if (is_end(pick, ends, n_ends))
		{
			w->complete = true;
			break;
		}
		{
			char		b[512];
			int			n = cai_tokenizer_token_bytes(tok, pick, b, sizeof(b));
			int			skip = drop_first_space && w->len == 0 && w->n_tokens == 1 && b[0] == ' ';

			if (w->len + n < sizeof(w->text))
			{
				memcpy(w->text + w->len, b + skip, n - skip);
				w->len += n - skip;
			}
		}
	}
	CHECK_MSG(w->complete, "the walk did not finish: \"%.*s\"", (int) w->len, w->text);
	cai_grammar_state_free(st);
	free(bits);
	free(allowed);
}

/* The walk's text parses, validates, suits jsonb and keeps the limits. */
static void
check_walk_text(const char *schema, const walk_result *w)
{
	char		buf[CAI_ERROR_MESSAGE_SIZE];
	const char *problem = w->complete ? fixture_reply_problem(schema, w->text, w->len, buf, sizeof(buf)) : NULL;

	CHECK_MSG(!problem, "%s: \"%.*s\" %s", schema ? schema : "any object", (int) w->len, w->text, problem);
}

/* Schemas walked on every tokenizer; NULL is the any-object grammar. */
static const char *const walk_schemas[] = {
	"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"k\":{\"type\":\"integer\"}},\"required\":[\"name\"]}",
	"{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}",
	"{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":3},\"minItems\":1,\"maxItems\":4}",
	"{\"type\":\"integer\",\"minimum\":1,\"maximum\":100}",
	"{\"type\":\"number\",\"minimum\":-1.5,\"exclusiveMaximum\":20}",
	"{\"type\":\"number\"}",
	"{\"enum\":[\"red\",\"dark red\",1,10,100,null,{\"k\":[true]}]}",
	"{\"anyOf\":[{\"type\":\"string\",\"maxLength\":1},{\"type\":\"string\",\"minLength\":3},{\"type\":\"boolean\"},"
	"{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"null\"}},\"required\":[\"k\"]},"
	"{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"array\"}}}]}",
	"{\"$defs\":{\"p\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":[\"string\",\"null\"]},\"b\":{\"const\":\"x\"}}}},"
	"\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/p\"}}",
	"true",
	"{\"type\":\"array\",\"items\":{\"type\":\"object\"},\"maxItems\":2}",
	NULL,
};
#define N_WALK_SCHEMAS ((int) (sizeof(walk_schemas) / sizeof(walk_schemas[0])))

static cai_grammar *
grammar_for(const char *schema)
{
	cai_grammar *g = NULL;
	cai_error	err;
	cai_status	st = schema ? cai_grammar_from_schema(schema, strlen(schema), &g, &err) :
		cai_grammar_any_object(&g, &err);

	CHECK_MSG(st == CAI_OK, "%s: %s", schema ? schema : "any object", err.message);
	return g;
}

/* Walks every schema `walks` times; exhaustive checks as random_walk() says. */
static void
walk_all(const cai_tokenizer *tok, const int32_t *ends, int n_ends, bool drop_first_space,
		 int walks, int exhaustive, int stride)
{
	cai_token_index *ix = NULL;
	cai_error	err;
	walk_result *w = malloc(sizeof(walk_result));

	CHECK_MSG(cai_token_index_create(tok, ends, n_ends, &ix, &err) == CAI_OK, "index: %s", err.message);
	for (int s = 0; ix && s < N_WALK_SCHEMAS; s++)
	{
		cai_grammar *g = grammar_for(walk_schemas[s]);
		int			failures = test_current_failures;

		for (int i = 0; g && i < walks && test_current_failures == failures; i++)
		{
			random_walk(g, ix, tok, ends, n_ends, drop_first_space, (uint64_t) (s * 1000 + i + 1),
						exhaustive, stride, w);
			check_walk_text(walk_schemas[s], w);
		}
		cai_grammar_free(g);
	}
	cai_token_index_free(ix);
	free(w);
}

TEST(token_mask_walks_bpe)
{
	cai_tokenizer *tok = fixture_json_bpe();
	int32_t		ends[] = {1};

	CHECK(tok != NULL);
	if (tok)
		walk_all(tok, ends, 1, false, 12, MAX_WALK, 1);
	cai_tokenizer_free(tok);
}

TEST(token_mask_walks_sentencepiece)
{
	for (int prefix = 0; prefix < 2; prefix++)
	{
		cai_tokenizer *tok = json_spm(prefix);
		int32_t		ends[] = {2, SPM_END_OF_TURN};	/* </s>, <end_of_turn> */

		CHECK(tok != NULL);
		if (tok)
			walk_all(tok, ends, 2, prefix, 8, MAX_WALK, 1);
		cai_tokenizer_free(tok);
	}
}

/* ---------------------------------------------------------------------------------------------
 * Specific masks
 * ------------------------------------------------------------------------------------------- */

typedef struct fixture
{
	cai_tokenizer *tok;
	cai_token_index *ix;
	cai_grammar *g;
	cai_grammar_state *st;
	uint64_t   *bits;
} fixture;

static bool
fixture_open(fixture *f, const char *schema)
{
	int32_t		ends[] = {1};
	cai_error	err;

	memset(f, 0, sizeof(*f));
	f->tok = fixture_json_bpe();
	if (!f->tok || cai_token_index_create(f->tok, ends, 1, &f->ix, &err) != CAI_OK)
		return false;
	f->g = grammar_for(schema);
	if (!f->g || cai_grammar_state_create(f->g, f->ix, &f->st, &err) != CAI_OK)
		return false;
	f->bits = calloc(cai_token_index_mask_words(f->ix), sizeof(uint64_t));
	return f->bits && cai_grammar_state_allowed(f->st, f->bits);
}

static void
fixture_close(fixture *f)
{
	cai_grammar_state_free(f->st);
	cai_grammar_free(f->g);
	cai_token_index_free(f->ix);
	cai_tokenizer_free(f->tok);
	free(f->bits);
}

/* Accepts the BPE tokens spelled raw (each must exist and be allowed). */
static void
feed(fixture *f, const char *const *raw)
{
	for (int i = 0; raw[i]; i++)
	{
		int32_t		id = fixture_json_token(f->tok, raw[i]);

		CHECK_MSG(id >= 0, "no token %s", raw[i]);
		CHECK(cai_grammar_state_allowed(f->st, f->bits));
		CHECK_MSG(id >= 0 && bit(f->bits, id), "token \"%s\" not allowed", raw[i]);
		CHECK_MSG(id >= 0 && cai_grammar_state_accept(f->st, id), "token \"%s\" refused", raw[i]);
	}
	CHECK(cai_grammar_state_allowed(f->st, f->bits));
}

static bool
allowed_raw(fixture *f, const char *raw)
{
	int32_t		id = fixture_json_token(f->tok, raw);

	CHECK_MSG(id >= 0, "no token %s", raw);
	return id >= 0 && bit(f->bits, id);
}

#define RAW(...) ((const char *const[]) {__VA_ARGS__, NULL})

TEST(token_mask_end_tokens_only_when_complete)
{
	fixture		f;

	if (!fixture_open(&f, "{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"integer\"}}}"))
	{
		CHECK(false);
		fixture_close(&f);
		return;
	}
	cai_grammar_state_allowed(f.st, f.bits);
	CHECK(!bit(f.bits, 0) && !bit(f.bits, 1));	/* control tokens: never; end: not yet */
	CHECK(!cai_grammar_state_accept(f.st, 1));
	CHECK(!cai_grammar_state_accept(f.st, 0));
	CHECK(!cai_grammar_state_accept(f.st, -1));
	CHECK(!cai_grammar_state_accept(f.st, cai_token_index_n_vocab(f.ix)));
	feed(&f, RAW("{\"", "k\"", ":", "1", "0", "}"));
	CHECK(cai_grammar_state_complete(f.st));
	/* complete: the end token and nothing else */
	for (int i = 0; i < cai_token_index_n_vocab(f.ix); i++)
		CHECK_MSG(bit(f.bits, i) == (i == 1), "token %d", i);
	CHECK(cai_grammar_state_accept(f.st, 1));
	CHECK(cai_grammar_state_complete(f.st));
	fixture_close(&f);

	/* a number that is the whole reply: the end token, and digits too */
	if (fixture_open(&f, "{\"type\":\"integer\",\"minimum\":1,\"maximum\":100}"))
	{
		CHECK(allowed_raw(&f, "1") && allowed_raw(&f, "10") && allowed_raw(&f, "100"));
		CHECK(!allowed_raw(&f, "101") && !allowed_raw(&f, "0") && !allowed_raw(&f, "-1") && !allowed_raw(&f, "00"));
		CHECK(!bit(f.bits, 1));
		feed(&f, RAW("10"));
		CHECK(bit(f.bits, 1) && allowed_raw(&f, "0") && !allowed_raw(&f, "1") && !allowed_raw(&f, "00"));
		feed(&f, RAW("0"));
		CHECK(bit(f.bits, 1));
		for (int i = 0; i < cai_token_index_n_vocab(f.ix); i++)
			CHECK_MSG(bit(f.bits, i) == (i == 1), "token %d after 100", i);
	}
	fixture_close(&f);
}

TEST(token_mask_string_lengths_with_multibyte_tokens)
{
	fixture		f;

	if (fixture_open(&f, "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}"))
	{
		feed(&f, RAW("\""));
		/* nothing read: closing is too short; "éé" (2) fits, the emoji pair escape is one */
		CHECK(!allowed_raw(&f, "\"") && !allowed_raw(&f, "\"\"") && !allowed_raw(&f, "a\""));
		CHECK(allowed_raw(&f, "\xC3\xA9\xC3\xA9") && allowed_raw(&f, "\xC3\xA9\"") == false);
		CHECK(allowed_raw(&f, "abc") && allowed_raw(&f, "\\ud83d\\uDE00") && allowed_raw(&f, "\xE6\x97"));
		feed(&f, RAW("\xC3\xA9", "\xE6\x97"));
		/* 2 code points read (the second one unfinished): only its continuation byte */
		CHECK(allowed_raw(&f, "\xA5") && !allowed_raw(&f, "\x97\xA5") && !allowed_raw(&f, "\"") &&
			  !allowed_raw(&f, "a"));
		feed(&f, RAW("\xA5"));
		CHECK(allowed_raw(&f, "\"") && allowed_raw(&f, "\",") == false && allowed_raw(&f, "a") &&
			  allowed_raw(&f, "a\"") && !allowed_raw(&f, "ab") && allowed_raw(&f, "\xC3\xA9\"") &&
			  !allowed_raw(&f, "\xC3\xA9\xC3\xA9") && allowed_raw(&f, "\\n"));
		feed(&f, RAW("\\n"));
		/* full: only the closing quote */
		CHECK(allowed_raw(&f, "\"") && !allowed_raw(&f, "a") && !allowed_raw(&f, "a\"") &&
			  !allowed_raw(&f, "\\") && !allowed_raw(&f, "\xC3"));
	}
	fixture_close(&f);
}

TEST(token_mask_escapes_keep_jsonb_happy)
{
	fixture		f;

	if (fixture_open(&f, "{\"type\":\"string\"}"))
	{
		feed(&f, RAW("\""));
		CHECK(!allowed_raw(&f, "\\u0000") && allowed_raw(&f, "\\u000") && allowed_raw(&f, "\\ud83d") &&
			  allowed_raw(&f, "\\ud83d\\uDE00") && !allowed_raw(&f, "\\uDE00") && !allowed_raw(&f, "\n") &&
			  !allowed_raw(&f, "a\n"));
		feed(&f, RAW("\\u000"));
		CHECK(allowed_raw(&f, "1") && !allowed_raw(&f, "0") && !allowed_raw(&f, "00"));
		feed(&f, RAW("1", "\\ud83d"));
		/* a high surrogate: only the low one may follow */
		CHECK(allowed_raw(&f, "\\") && allowed_raw(&f, "\\u") && allowed_raw(&f, "\\uDE00") &&
			  !allowed_raw(&f, "\\u00e9") && !allowed_raw(&f, "\\n") && !allowed_raw(&f, "\"") &&
			  !allowed_raw(&f, "a") && !allowed_raw(&f, "\\ud83d"));
	}
	fixture_close(&f);
}

TEST(token_mask_whitespace_runs_are_bounded)
{
	fixture		f;

	if (fixture_open(&f, "{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"null\"}}}"))
	{
		feed(&f, RAW("{", "    ", "    ", "    "));
		CHECK(allowed_raw(&f, "    ") && allowed_raw(&f, " ") && allowed_raw(&f, "\n "));
		feed(&f, RAW("  ", " "));
		/* 15 in a row: one more, not two */
		CHECK(allowed_raw(&f, " ") && allowed_raw(&f, "\n") && !allowed_raw(&f, "  ") && !allowed_raw(&f, "\n "));
		feed(&f, RAW("\n"));
		CHECK(!allowed_raw(&f, " ") && !allowed_raw(&f, "\n") && allowed_raw(&f, "\"k\"") &&
			  allowed_raw(&f, "}"));
		feed(&f, RAW("\"k\"", "    ", "    ", "    ", "    ", ":"));
		CHECK(allowed_raw(&f, "    ") && allowed_raw(&f, "nul"));
	}
	fixture_close(&f);
}

TEST(token_mask_keys_and_structure)
{
	fixture		f;

	if (fixture_open(&f, "{\"type\":\"object\",\"properties\":{\"name\":{\"enum\":[\"red\",\"ab\"]},"
					 "\"k\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":1}},\"required\":[\"k\"]}"))
	{
		CHECK(allowed_raw(&f, "{") && allowed_raw(&f, "{\"") && !allowed_raw(&f, "{}") && !allowed_raw(&f, "[") &&
			  allowed_raw(&f, " ") && !allowed_raw(&f, "\""));
		feed(&f, RAW("{\""));
		CHECK(allowed_raw(&f, "n") && allowed_raw(&f, "k\"") && !allowed_raw(&f, "a") && !allowed_raw(&f, "\""));
		feed(&f, RAW("n", "a", "m", "e", "\":", " "));
		CHECK(allowed_raw(&f, "\"red\"") && allowed_raw(&f, "\"") && allowed_raw(&f, "\"a") &&
			  !allowed_raw(&f, "\"\"") && !allowed_raw(&f, "\"k"));
		feed(&f, RAW("\"red\""));
		CHECK(allowed_raw(&f, ",") && allowed_raw(&f, ", ") && !allowed_raw(&f, "}") && !allowed_raw(&f, "},"));
		feed(&f, RAW(",", "\"k\":", "[1"));
		/* maxItems 1: the number may grow, the array may only close */
		CHECK(allowed_raw(&f, "]") && allowed_raw(&f, "]}") && allowed_raw(&f, "0") && allowed_raw(&f, "00") &&
			  !allowed_raw(&f, ",") && !allowed_raw(&f, "}"));
		feed(&f, RAW("]}"));
		CHECK(cai_grammar_state_complete(f.st));
	}
	fixture_close(&f);
}

/* Accepts count copies of token id; false at the first refusal. */
static bool
accept_times(cai_grammar_state *st, int32_t id, int count)
{
	for (int i = 0; i < count; i++)
		if (!cai_grammar_state_accept(st, id))
			return false;
	return true;
}

TEST(token_mask_sentencepiece_drops_the_first_space)
{
	cai_grammar *g = grammar_for("{\"type\":\"boolean\"}");

	for (int prefix = 0; prefix < 2 && g; prefix++)
	{
		cai_tokenizer *tok = json_spm(prefix);
		cai_token_index *ix = NULL;
		cai_grammar_state *st = NULL;
		cai_error	err;
		int32_t		ends[] = {2};
		uint64_t	bits[8];
		int32_t		space = cai_tokenizer_find(tok, "\u2581"),
					spaces = cai_tokenizer_find(tok, "\u2581\u2581"),
					space_t = cai_tokenizer_find(tok, "\u2581t"),
					space_the = cai_tokenizer_find(tok, "\u2581the"),
					t = cai_tokenizer_find(tok, "t"),
					byte_space = cai_tokenizer_find(tok, "<0x20>");

		CHECK(space >= 0 && spaces >= 0 && space_t >= 0 && space_the >= 0 && t >= 0 && byte_space >= 0);
		if (cai_token_index_create(tok, ends, 1, &ix, &err) != CAI_OK ||
			cai_grammar_state_create(g, ix, &st, &err) != CAI_OK || cai_token_index_mask_words(ix) > 8)
		{
			CHECK_MSG(false, "%s", err.message);
			cai_token_index_free(ix);
			cai_tokenizer_free(tok);
			break;
		}
		CHECK(cai_grammar_state_allowed(st, bits));
		CHECK(bit(bits, space_t) && bit(bits, t) && bit(bits, spaces) && !bit(bits, space_the));
		/* with the prefix, the reply's first space is not text: a space alone reads nothing */
		CHECK(bit(bits, space) == !prefix && bit(bits, byte_space) == !prefix);
		CHECK(cai_grammar_state_accept(st, space) == !prefix);
		cai_grammar_state_free(st);

		/* "▁▁" first reads one space with the prefix, two without: 16 in all, not 17 */
		CHECK(cai_grammar_state_create(g, ix, &st, &err) == CAI_OK);
		CHECK(accept_times(st, spaces, 1) && accept_times(st, space, 14));
		CHECK(cai_grammar_state_accept(st, space) == (bool) prefix);
		CHECK(!cai_grammar_state_accept(st, space));
		cai_grammar_state_free(st);

		/* "▁t" first reads "t" with the prefix, " t" without; either way "true" follows */
		CHECK(cai_grammar_state_create(g, ix, &st, &err) == CAI_OK);
		CHECK(cai_grammar_state_accept(st, space_t));
		CHECK(cai_grammar_state_allowed(st, bits));
		CHECK(!bit(bits, space_t) && !bit(bits, t) && !bit(bits, space));
		CHECK(cai_grammar_state_accept(st, cai_tokenizer_find(tok, "r")) &&
			  cai_grammar_state_accept(st, cai_tokenizer_find(tok, "<0x75>")) &&
			  cai_grammar_state_accept(st, cai_tokenizer_find(tok, "e")));
		CHECK(cai_grammar_state_complete(st));
		cai_grammar_state_free(st);
		cai_token_index_free(ix);
		cai_tokenizer_free(tok);
	}
	cai_grammar_free(g);
}

TEST(token_mask_index_needs_every_byte_alone)
{
	cai_tokenizer *tok = fixture_json_bpe();
	cai_token_index *ix = NULL;
	cai_grammar *g = grammar_for("{\"const\":\"\xc3\xa9\"}");
	cai_grammar_state *st = NULL;
	cai_error	err;
	int32_t		ends[] = {1, FIXTURE_BPE_BYTE(FIXTURE_JSON_CONTROLS, '"')};
	int32_t		lead[] = {1, FIXTURE_BPE_BYTE(FIXTURE_JSON_CONTROLS, 0xC3)};

	/* the quote as an end token: no token is the quote alone any more */
	CHECK(cai_token_index_create(tok, ends, 2, &ix, &err) == CAI_ERR_UNSUPPORTED);
	CHECK_MSG(strcmp(err.message, "the vocabulary has no token for the byte 0x22 alone, which constrained decoding needs") == 0,
			  "%s", err.message);
	CHECK(ix == NULL);
	/* a lead byte: fine for the index, but not for a schema whose literal needs it */
	CHECK(cai_token_index_create(tok, lead, 2, &ix, &err) == CAI_OK);
	CHECK(cai_grammar_state_create(g, ix, &st, &err) == CAI_ERR_UNSUPPORTED);
	CHECK_MSG(strcmp(err.message, "the schema's literals hold the byte 0xC3, which no token of the vocabulary is alone") == 0,
			  "%s", err.message);
	CHECK(st == NULL);
	cai_token_index_free(ix);
	cai_grammar_free(g);
	cai_tokenizer_free(tok);
}

/* ---------------------------------------------------------------------------------------------
 * Threads and the real vocabulary
 * ------------------------------------------------------------------------------------------- */

typedef struct thread_job
{
	const cai_grammar *g;
	const cai_token_index *ix;
	const cai_tokenizer *tok;
	const int32_t *ends;
	int			n_ends;
	uint64_t	seed;
	walk_result *w;
} thread_job;

static void *
thread_walk(void *arg)
{
	thread_job *j = arg;

	random_walk(j->g, j->ix, j->tok, j->ends, j->n_ends, false, j->seed, 0, 1, j->w);
	return NULL;
}

/* States on several threads sharing one grammar and index give what one thread alone gives. */
static void
check_threads_agree(const cai_tokenizer *tok, const int32_t *ends, int n_ends)
{
	enum
	{
		N = 4
	};
	cai_token_index *ix = NULL;
	cai_grammar *g = grammar_for(walk_schemas[0]);
	cai_error	err;
	pthread_t	th[N];
	thread_job	jobs[N];
	walk_result *alone = malloc(sizeof(walk_result));

	if (!g || cai_token_index_create(tok, ends, n_ends, &ix, &err) != CAI_OK)
	{
		CHECK(false);
		cai_grammar_free(g);
		free(alone);
		return;
	}
	for (uint64_t seed = 1; seed <= 3; seed++)
	{
		random_walk(g, ix, tok, ends, n_ends, false, seed, 0, 1, alone);
		for (int i = 0; i < N; i++)
		{
			jobs[i] = (thread_job) {g, ix, tok, ends, n_ends, seed, malloc(sizeof(walk_result))};
			pthread_create(&th[i], NULL, thread_walk, &jobs[i]);
		}
		for (int i = 0; i < N; i++)
		{
			pthread_join(th[i], NULL);
			CHECK(jobs[i].w->n_tokens == alone->n_tokens &&
				  memcmp(jobs[i].w->tokens, alone->tokens, alone->n_tokens * sizeof(int32_t)) == 0);
			free(jobs[i].w);
		}
	}
	free(alone);
	cai_grammar_free(g);
	cai_token_index_free(ix);
}

TEST(token_mask_threads_share_grammar_and_index)
{
	cai_tokenizer *tok = fixture_json_bpe();
	int32_t		ends[] = {1};

	if (tok)
		check_threads_agree(tok, ends, 1);
	cai_tokenizer_free(tok);
}

TEST(token_mask_real_vocabulary)
{
	const char *path = test_real_model_path();
	gguf_file  *file = NULL;
	cai_tokenizer *tok = NULL;
	cai_error	err;
	int32_t		ends[2];

	if (!path)
		SKIP("no real model (models/ or CAI_TEST_MODEL)");
	if (gguf_open(path, &file, &err) != CAI_OK || cai_tokenizer_load(file, &tok, &err) != CAI_OK)
	{
		CHECK_MSG(false, "%s: %s", path, err.message);
		if (file)
			gguf_close(file);
		return;
	}
	ends[0] = cai_tokenizer_eos(tok);
	ends[1] = cai_tokenizer_find(tok, "<|im_end|>");
	/* every token tried on every 5th step, 6 steps a walk (the whole vocabulary per step) */
	walk_all(tok, ends, ends[1] >= 0 ? 2 : 1, false, 2, 6, 5);
	check_threads_agree(tok, ends, ends[1] >= 0 ? 2 : 1);
	cai_tokenizer_free(tok);
	gguf_close(file);
}
