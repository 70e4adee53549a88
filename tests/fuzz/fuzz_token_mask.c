/*
 * fuzz_token_mask.c — constrained decoding over tokens (token_mask.c): a schema compiled from
 * the input, then a walk of tokens the input chooses among the allowed ones.
 *
 * Input: a flags byte (bits 0-2 modulo 5: the tokenizer: 0 the JSON-shaped BPE of
 * grammar_fixtures.h, 1-4 fuzz_common.h's tokenizers 0, 1, 4 and 5 (BPE smollm and llama-bpe,
 * SentencePiece with and without the space prefix); bit 3: the any-object grammar instead of
 * a schema; bits 4-6: the built-in schema), a schema
 * (a chunk: two length bytes, then the text; one that does not compile is replaced by a
 * built-in schema the flags pick), then choices: two bytes pick each token among the allowed
 * ones, one byte picks a token to try against the mask.  When the choices run out the walk
 * heads for the end (an end token, else a closing quote, brace or bracket, else any).
 *
 * Checks at every step: the mask is never empty while the value is incomplete; end tokens are
 * allowed exactly when it is complete; control tokens never are; accept() takes the picked and
 * the tried tokens exactly when their bits are set, and refusing leaves the mask as it was; a
 * clone goes on like its original.  At the end, the reply's text (as the detokenizer will
 * hold it) parses, is valid under the schema, holds no \u0000 and keeps the whitespace and
 * digit limits.
 *
 * Built by tests/fuzz/fuzz.mk like every tests/fuzz/fuzz_*.c; by hand: as fuzz_json_schema.c
 * says, with this file instead.
 */
#include "fuzz_common.h"

#include "grammar.h"
#include "grammar_fixtures.h"

#define MAX_STEPS 300
#define N_TOKENIZERS 5

static const char *const builtin_schemas[] = {
	"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"
	"\"k\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120}},\"required\":[\"k\"]}",
	"{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"minLength\":2},{\"type\":\"number\","
	"\"exclusiveMinimum\":0.5,\"maximum\":9.25},{\"type\":\"null\"}]},\"maxItems\":4}",
	"{\"enum\":[\"red\",\"dark red\",1,10,100,null,{\"k\":[true]}]}",
	"true",
	"{\"type\":\"string\"}",
	"{\"type\":\"number\"}",
	"{\"$defs\":{\"p\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":[\"boolean\",\"null\"]}}}},"
	"\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/p\"},\"minItems\":1}",
	"{\"type\":\"object\"}",
};
#define N_BUILTIN ((int) (sizeof(builtin_schemas) / sizeof(builtin_schemas[0])))

typedef struct vocab
{
	cai_tokenizer *tok;
	cai_token_index *ix;
	int32_t		ends[2];
	int			n_ends;
	bool		drop_first_space;
} vocab;

/* Built once per process (libFuzzer keeps it), never freed. */
static vocab *
get_vocab(int which)
{
	static vocab vocabs[N_TOKENIZERS];
	static const int fuzz_ids[N_TOKENIZERS] = {-1, 0, 1, 4, 5};
	vocab	   *v = &vocabs[which];
	cai_error	err;

	if (v->ix)
		return v;
	if (fuzz_ids[which] < 0)
	{
		v->tok = fixture_json_bpe();
		v->ends[v->n_ends++] = FIXTURE_JSON_EOS;
	}
	else
	{
		v->tok = fuzz_tokenizer(fuzz_ids[which]);
		v->drop_first_space = fuzz_tokenizer_space_prefix(fuzz_ids[which]);
		v->ends[v->n_ends++] = cai_tokenizer_eos(v->tok);
		v->ends[v->n_ends++] = cai_tokenizer_find(v->tok, fuzz_tokenizer_is_bpe(fuzz_ids[which]) ?
												  "<|eot_id|>" : "<end_of_turn>");
	}
	FUZZ_CHECK(v->tok != NULL);
	FUZZ_CHECK(cai_token_index_create(v->tok, v->ends, v->n_ends, &v->ix, &err) == CAI_OK);
	return v;
}

static bool
bit(const uint64_t *bits, int32_t id)
{
	return bits[id >> 6] >> (id & 63) & 1;
}

static bool
is_end(const vocab *v, int32_t id)
{
	for (int i = 0; i < v->n_ends; i++)
		if (v->ends[i] == id)
			return true;
	return false;
}

/* accept() on a copy of st takes id exactly when the mask says so. */
static void
check_token(cai_grammar_state *st, int32_t id, const uint64_t *bits)
{
	cai_grammar_state *copy = NULL;
	cai_error	err;

	FUZZ_CHECK(cai_grammar_state_clone(st, &copy, &err) == CAI_OK);
	FUZZ_CHECK(cai_grammar_state_accept(copy, id) == bit(bits, id));
	cai_grammar_state_free(copy);
}

/* The token to take when the choices have run out: one that heads for the end. */
static int32_t
closing_token(const vocab *v, const uint64_t *bits, int n_vocab, int32_t fallback)
{
	static const char closers[] = "\"}]0";

	for (int i = 0; i < v->n_ends; i++)
		if (v->ends[i] >= 0 && bit(bits, v->ends[i]))
			return v->ends[i];
	for (const char *c = closers; *c; c++)
		for (int32_t id = 0; id < n_vocab; id++)
		{
			char		b[4];

			if (bit(bits, id) && cai_tokenizer_token_bytes(v->tok, id, b, sizeof(b)) == 1 && b[0] == *c)
				return id;
		}
	return fallback;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_input	in = {data, size};
	uint8_t		flags = fuzz_u8(&in);
	vocab	   *v = get_vocab((flags & 7) % N_TOKENIZERS);
	int			n_vocab = cai_token_index_n_vocab(v->ix);
	int			words = cai_token_index_mask_words(v->ix);
	size_t		schema_len;
	char	   *schema = fuzz_chunk(&in, 4096, &schema_len);
	const char *used = schema;
	cai_grammar *g = NULL;
	cai_grammar_state *st = NULL;
	cai_error	err;
	uint64_t   *bits = malloc(words * sizeof(uint64_t));
	uint64_t   *again = malloc(words * sizeof(uint64_t));
	int32_t    *allowed = malloc(n_vocab * sizeof(int32_t));
	int32_t		ids[MAX_STEPS];
	int			n_ids = 0;
	bool		ended = false;

	FUZZ_CHECK(bits && again && allowed);
	if (flags & 8)
	{
		used = NULL;
		FUZZ_CHECK(cai_grammar_any_object(&g, &err) == CAI_OK);
	}
	else if (cai_grammar_from_schema(schema, schema_len, &g, &err) != CAI_OK)
	{
		used = builtin_schemas[(flags >> 4) % N_BUILTIN];
		FUZZ_CHECK(cai_grammar_from_schema(used, strlen(used), &g, &err) == CAI_OK);
	}
	if (cai_grammar_state_create(g, v->ix, &st, &err) != CAI_OK)
	{
		/* a literal byte this vocabulary has no token for: refused up front, clearly */
		FUZZ_CHECK(strstr(err.message, "no token of the vocabulary") != NULL);
		goto done;
	}
	for (int step = 0; step < MAX_STEPS && !ended; step++)
	{
		bool		complete = cai_grammar_state_complete(st);
		int			n_allowed = 0;
		bool		end_allowed = false;
		int32_t		pick,
					tried;

		FUZZ_CHECK(cai_grammar_state_allowed(st, bits));
		for (int32_t id = 0; id < n_vocab; id++)
			if (bit(bits, id))
			{
				allowed[n_allowed++] = id;
				end_allowed |= is_end(v, id);
				FUZZ_CHECK(is_end(v, id) || !cai_tokenizer_is_special(v->tok, id));
			}
		for (int32_t id = n_vocab; id < words * 64; id++)
			FUZZ_CHECK(!bit(bits, id));
		FUZZ_CHECK(end_allowed == complete);
		FUZZ_CHECK(complete || n_allowed > 0);
		if (n_allowed == 0)
			break;

		/* a token the input names, tried against the mask; a refusal changes nothing */
		tried = (int32_t) ((fuzz_u8(&in) * 131u + (unsigned) step * 7919u) % (unsigned) n_vocab);
		check_token(st, tried, bits);
		if (!bit(bits, tried))
		{
			FUZZ_CHECK(!cai_grammar_state_accept(st, tried));
			FUZZ_CHECK(cai_grammar_state_allowed(st, again));
			FUZZ_CHECK(memcmp(again, bits, words * sizeof(uint64_t)) == 0);
		}

		pick = in.n >= 2 ? allowed[fuzz_u16(&in) % n_allowed] :
			closing_token(v, bits, n_vocab, allowed[step % n_allowed]);
		check_token(st, pick, bits);
		if (step % 16 == 15)
		{
			/* go on with a clone instead */
			cai_grammar_state *copy = NULL;

			FUZZ_CHECK(cai_grammar_state_clone(st, &copy, &err) == CAI_OK);
			cai_grammar_state_free(st);
			st = copy;
		}
		FUZZ_CHECK(cai_grammar_state_accept(st, pick));
		if (is_end(v, pick))
			ended = true;
		else
			ids[n_ids++] = pick;
	}
	if (ended)
	{
		size_t		len;
		char	   *text = fuzz_token_text(v->tok, ids, n_ids, v->drop_first_space, &len);
		char		buf[CAI_ERROR_MESSAGE_SIZE];
		const char *problem = fixture_reply_problem(used, text, len, buf, sizeof(buf));

		if (problem)
			fprintf(stderr, "%s: \"%.*s\" %s\n", used ? used : "any object", (int) len, text, problem);
		FUZZ_CHECK(problem == NULL);
		free(text);
	}
done:
	cai_grammar_state_free(st);
	cai_grammar_free(g);
	free(schema);
	free(bits);
	free(again);
	free(allowed);
	return 0;
}
