/*
 * grammar_fixtures.h — what the tests of constrained decoding share (test_token_mask.c and
 * tests/fuzz/fuzz_token_mask.c): a byte-level BPE vocabulary of JSON-shaped tokens (quotes with
 * punctuation, escapes, \u0000 and surrogate escapes, runs of spaces, digits, keys, pieces of
 * multi-byte characters), and the check of a finished reply's text against its schema.
 */
#ifndef CAI_GRAMMAR_FIXTURES_H
#define CAI_GRAMMAR_FIXTURES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "json_validate.h"
#include "tokenizer_fixtures.h"

/* BPE merges as raw bytes; each side is a byte or an earlier merge's result. */
static const char *const fixture_json_merges[][2] = {
	{"\"", ","}, {"\"", ":"}, {"{", "\""}, {"\"", "}"}, {"\"", "]"}, {" ", " "}, {"  ", "  "},
	{"\n", " "}, {"\n", "  "}, {"\\", "n"}, {"\\", "\""}, {"\\", "u"}, {"\\u", "0"}, {"\\u0", "0"},
	{"\\u00", "0"}, {"\\u000", "0"}, {"\\u00", "e"}, {"\\u00e", "9"}, {"\\u", "d"}, {"\\ud", "8"},
	{"\\ud8", "3"}, {"\\ud83", "d"}, {"\\u", "D"}, {"\\uD", "E"}, {"\\uDE", "0"}, {"\\uDE0", "0"},
	{"\\ud83d", "\\uDE00"}, {"1", "0"}, {"10", "0"}, {"10", "1"}, {"0", "0"}, {"-", "1"},
	{"1", "."}, {".", "5"}, {"e", "5"}, {"1", "e"}, {"t", "r"}, {"tr", "u"}, {"tru", "e"},
	{"n", "u"}, {"nu", "l"}, {"nul", "l"}, {"f", "a"}, {"fa", "l"}, {"fal", "s"}, {"fals", "e"},
	{"a", "b"}, {"ab", "c"}, {"\"", "a"}, {"a", "\""}, {"a", "\","}, {"\"a", "\""}, {"a", "\n"},
	{"}", ","}, {"]", "}"}, {"}", "}"}, {",", " "}, {":", " "}, {"\":", " "}, {"\",", " "},
	{"\",", "\n"}, {"\"", "\""}, {"[", "]"}, {"{", "}"}, {"[", "\""}, {"[", "{"}, {"[", "1"},
	{"\xC3", "\xA9"}, {"\xE6", "\x97"}, {"\xE6\x97", "\xA5"}, {"\xF0", "\x9F"}, {"\x98", "\x80"},
	{"\xF0\x9F", "\x98\x80"}, {"\xA9", "\""}, {"\xC3\xA9", "\xC3\xA9"}, {"\xC3\xA9", "\""},
	{"\x97", "\xA5"}, {"\"", "n"}, {"\"n", "a"}, {"\"na", "m"}, {"\"nam", "e"}, {"\"name", "\""},
	{"\"name\"", ":"}, {"r", "e"}, {"re", "d"}, {"\"", "red"}, {"\"red", "\""}, {"k", "\""},
	{"\"", "k"}, {"\"k", "\""}, {"\"k\"", ":"},
};
#define FIXTURE_JSON_N_MERGES ((int) (sizeof(fixture_json_merges) / sizeof(fixture_json_merges[0])))
#define FIXTURE_JSON_CONTROLS 2	/* <|endoftext|> (special), <|im_end|> (EOS) */
#define FIXTURE_JSON_EOS 1

/* Writes raw bytes in GPT-2's byte-to-unicode notation; the length. */
static inline size_t
fixture_json_notation(const char *raw, char *out)
{
	size_t		n = 0;

	for (; *raw; raw++)
		n += cai_utf8_encode(fixture_byte_char((unsigned char) *raw), out + n);
	out[n] = '\0';
	return n;
}

/* The JSON-shaped BPE tokenizer (NULL when it cannot be built). */
static inline cai_tokenizer *
fixture_json_bpe(void)
{
	static const char *const controls[] = {"<|endoftext|>", "<|im_end|>"};
	char	   *merges[FIXTURE_JSON_N_MERGES];
	cai_tokenizer *tok;

	for (int i = 0; i < FIXTURE_JSON_N_MERGES; i++)
	{
		/* "L R": the two halves in notation, one space between */
		size_t		l;

		merges[i] = malloc(64);
		if (!merges[i])
		{
			while (i-- > 0)
				free(merges[i]);
			return NULL;
		}
		l = fixture_json_notation(fixture_json_merges[i][0], merges[i]);
		merges[i][l] = ' ';
		fixture_json_notation(fixture_json_merges[i][1], merges[i] + l + 1);
	}
	tok = fixture_bpe("smollm", controls, FIXTURE_JSON_CONTROLS, (const char *const *) merges,
					  FIXTURE_JSON_N_MERGES, NULL, 0, -1, FIXTURE_JSON_EOS, false);
	for (int i = 0; i < FIXTURE_JSON_N_MERGES; i++)
		free(merges[i]);
	return tok;
}

/* The id of fixture_json_bpe's token whose bytes are raw, or -1. */
static inline int32_t
fixture_json_token(const cai_tokenizer *tok, const char *raw)
{
	char		n[256];

	if (strlen(raw) * 2 >= sizeof(n))
		return -1;
	fixture_json_notation(raw, n);
	return cai_tokenizer_find(tok, n);
}

/*
 * What is wrong with a finished reply's text under schema (NULL: the any-object grammar), as a
 * message in buf, or NULL when nothing is: it must parse (a free object may repeat a key), be
 * valid, hold no \u0000 (jsonb), and keep the whitespace and digit limits.
 */
static inline const char *
fixture_reply_problem(const char *schema, const char *text, size_t len, char *buf, size_t cap)
{
	json_doc   *s = NULL,
			   *v = NULL;
	cai_error	err;
	const char *problem = NULL;

	if (json_parse(text, len, JSON_DUPLICATE_KEYS, &v, &err) != CAI_OK)
	{
		snprintf(buf, cap, "does not parse: %.400s", err.message);
		return buf;
	}
	if (schema && json_parse(schema, strlen(schema), 0, &s, &err) != CAI_OK)
		problem = "the schema does not parse";
	else if (schema && !jv_validate(json_doc_root(s), json_doc_root(s), json_doc_root(v), 0))
		problem = "is not valid under the schema";
	else if (!schema && json_doc_root(v)->type != JSON_OBJECT)
		problem = "is not an object";
	else if (!jv_jsonb_ok(json_doc_root(v)))
		problem = "holds \\u0000";
	else if (!jv_text_limits(text, len, schema))
		problem = "breaks the whitespace or digit limits";
	json_doc_free(s);
	json_doc_free(v);
	if (problem)
		snprintf(buf, cap, "%s", problem);
	return problem ? buf : NULL;
}

#endif							/* CAI_GRAMMAR_FIXTURES_H */
