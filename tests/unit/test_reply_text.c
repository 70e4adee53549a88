/*
 * test_reply_text.c — a reply's text as tokens arrive: stop strings against text that is still
 * empty or ends in a partial UTF-8 sequence, multi-byte stop strings, stop strings split across
 * tokens, NUL bytes, and a seeded randomized comparison with a whole-text reference.
 */
#include <stdlib.h>
#include <string.h>

#include "reply_text.h"
#include "test.h"
#include "tokenizer_fixtures.h"

/* fixture_bpe with one control token: byte b is token 1 + b; then the user-defined tokens */
#define BYTE(b) FIXTURE_BPE_BYTE(1, (unsigned char) (b))
#define TOKEN_WOR 257
#define TOKEN_LD 258
#define TOKEN_HELLO 259

static cai_tokenizer *
reply_tokenizer(void)
{
	static cai_tokenizer *tok;
	static const char *const controls[] = {"<|end|>"};
	static const char *const user[] = {"wor", "ld", "hello "};

	if (!tok)
		tok = fixture_bpe("gpt2", controls, 1, NULL, 0, user, 3, -1, 0, false);
	return tok;
}

/* What one reply produced: the pieces handed out, concatenated, and whether it stopped. */
typedef struct reply_run
{
	char		out[1024];
	size_t		out_len;
	int			n_empty_takes;	/* takes that handed out nothing */
	bool		stopped;
	bool		pieces_valid;	/* every piece was valid UTF-8 on its own */
	size_t		text_len[64];	/* the text's length after each token */
} reply_run;

static bool
utf8_valid(const char *s, size_t n)
{
	size_t		i = 0;

	while (i < n)
	{
		unsigned char c = (unsigned char) s[i];
		size_t		len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 :
			(c & 0xF8) == 0xF0 ? 4 : 0;

		if (len == 0 || i + len > n)
			return false;
		for (size_t k = 1; k < len; k++)
			if (((unsigned char) s[i + k] & 0xC0) != 0x80)
				return false;
		i += len;
	}
	return true;
}

/* Feeds ids one at a time like the engine does (the last one ends the reply). */
static void
run_reply(const int32_t *ids, int n, const char *const *stop, int n_stop, reply_run *run)
{
	cai_tokenizer *tok = reply_tokenizer();
	cai_reply_text rt;
	cai_error	err;

	memset(run, 0, sizeof(*run));
	run->pieces_valid = true;
	CHECK(tok != NULL);
	if (!tok)
		return;
	CHECK_EQ_INT(cai_reply_text_init(&rt, tok, stop, n_stop, &err), CAI_OK);
	for (int i = 0; i < n && !run->stopped; i++)
	{
		bool		last = i == n - 1;
		const char *piece;
		size_t		len;

		CHECK(cai_reply_text_add_token(&rt, tok, ids[i]));
		if (last)
			CHECK(cai_reply_text_finish(&rt));
		if (i < 64)
			run->text_len[i] = rt.len;
		run->stopped = cai_reply_text_take(&rt, last, &piece, &len);
		CHECK(piece != NULL);
		if (len == 0)
			run->n_empty_takes++;
		if (!utf8_valid(piece, len))
			run->pieces_valid = false;
		if (run->out_len + len < sizeof(run->out))
		{
			memcpy(run->out + run->out_len, piece, len);
			run->out_len += len;
		}
	}
	/* what was handed out is the whole text */
	CHECK_EQ_INT(run->out_len, rt.len);
	CHECK(memcmp(run->out, rt.text, rt.len) == 0);
	cai_reply_text_free(&rt);
}

static int
bytes_to_ids(const char *s, size_t n, int32_t *ids)
{
	for (size_t i = 0; i < n; i++)
		ids[i] = BYTE(s[i]);
	return (int) n;
}

TEST(reply_text_stop_with_empty_text_and_partial_utf8)
{
	/* an emoji's four bytes as four tokens: the text stays empty for three of them */
	static const char emoji[] = "\xF0\x9F\x98\x80";
	const char *const stop[] = {"zzz"};
	int32_t		ids[8];
	reply_run	run;
	int			n = bytes_to_ids(emoji, 4, ids);

	ids[n++] = BYTE('!');
	run_reply(ids, n, stop, 1, &run);
	CHECK(!run.stopped);
	CHECK_EQ_INT(run.n_empty_takes, 3);
	CHECK_EQ_INT(run.out_len, 5);
	CHECK(memcmp(run.out, "\xF0\x9F\x98\x80!", 5) == 0);
	CHECK(run.pieces_valid);

	/* the reply ends inside the emoji: the tail becomes U+FFFD */
	run_reply(ids, 2, stop, 1, &run);
	CHECK(!run.stopped);
	CHECK_EQ_INT(run.out_len, 3);
	CHECK(memcmp(run.out, "\xEF\xBF\xBD", 3) == 0);
}

TEST(reply_text_multibyte_stop_string)
{
	/* "ab😀cd" byte by byte, stop at the emoji: only "ab" is handed out */
	static const char text[] = "ab\xF0\x9F\x98\x80" "cd";
	const char *const stop[] = {"\xF0\x9F\x98\x80"};
	int32_t		ids[16];
	reply_run	run;
	int			n = bytes_to_ids(text, strlen(text), ids);

	run_reply(ids, n, stop, 1, &run);
	CHECK(run.stopped);
	CHECK_EQ_INT(run.out_len, 2);
	CHECK(memcmp(run.out, "ab", 2) == 0);

	/* "é" as a stop string: "café" stops before it, "cafe" does not */
	{
		const char *const e_acute[] = {"\xC3\xA9"};

		n = bytes_to_ids("caf\xC3\xA9", 5, ids);
		run_reply(ids, n, e_acute, 1, &run);
		CHECK(run.stopped);
		CHECK_EQ_INT(run.out_len, 3);
		n = bytes_to_ids("cafe", 4, ids);
		run_reply(ids, n, e_acute, 1, &run);
		CHECK(!run.stopped);
		CHECK_EQ_INT(run.out_len, 4);
	}
}

TEST(reply_text_stop_split_across_tokens)
{
	const char *const stop[] = {"world"};
	int32_t		ids[] = {TOKEN_HELLO, TOKEN_WOR, TOKEN_LD, BYTE('!')};
	int32_t		near_miss[] = {TOKEN_HELLO, TOKEN_WOR, BYTE('m'), BYTE('!')};
	reply_run	run;

	run_reply(ids, 4, stop, 1, &run);
	CHECK(run.stopped);
	CHECK_EQ_INT(run.out_len, 6);
	CHECK(memcmp(run.out, "hello ", 6) == 0);

	/* "wor" is held back while it could become "world", then handed out */
	run_reply(near_miss, 4, stop, 1, &run);
	CHECK(!run.stopped);
	CHECK_EQ_INT(run.out_len, 11);
	CHECK(memcmp(run.out, "hello worm!", 11) == 0);

	/* a held-back prefix at the very end of the reply is handed out */
	run_reply(ids, 2, stop, 1, &run);
	CHECK(!run.stopped);
	CHECK_EQ_INT(run.out_len, 9);
	CHECK(memcmp(run.out, "hello wor", 9) == 0);
}

TEST(reply_text_nul_bytes_and_boundaries)
{
	/* a NUL byte in the reply does not hide a stop string after it */
	const char *const stop[] = {"xy"};
	int32_t		ids[] = {BYTE('a'), BYTE(0), BYTE('x'), BYTE('y'), BYTE('b')};
	reply_run	run;

	run_reply(ids, 5, stop, 1, &run);
	CHECK(run.stopped);
	CHECK_EQ_INT(run.out_len, 2);
	CHECK(run.out[0] == 'a' && run.out[1] == '\0');

	/* a stop string that starts inside a character never cuts it in two */
	{
		const char *const tail_byte[] = {"\xA9"};
		int			n = bytes_to_ids("caf\xC3\xA9!", 6, ids);

		run_reply(ids, n, tail_byte, 1, &run);
		CHECK(!run.stopped);
		CHECK_EQ_INT(run.out_len, 6);
		CHECK(run.pieces_valid);
	}

	/* the earliest of several stop strings wins, wherever it is in the list */
	{
		const char *const two[] = {"b!", "a"};
		int32_t		more[] = {BYTE('x'), BYTE('a'), BYTE('b'), BYTE('!')};

		run_reply(more, 4, two, 2, &run);
		CHECK(run.stopped);
		CHECK_EQ_INT(run.out_len, 1);
		CHECK(run.out[0] == 'x');
	}
}

TEST(reply_text_rejects_empty_stop_strings)
{
	cai_reply_text rt;
	cai_error	err;
	const char *const empty[] = {""};

	CHECK_EQ_INT(cai_reply_text_init(&rt, reply_tokenizer(), empty, 1, &err),
				 CAI_ERR_INVALID_ARGUMENT);
	CHECK_EQ_INT(cai_reply_text_init(&rt, reply_tokenizer(), NULL, 9, &err),
				 CAI_ERR_INVALID_ARGUMENT);
}

static uint32_t
next_random(uint32_t *state)
{
	*state = *state * 1664525u + 1013904223u;
	return *state >> 8;
}

/*
 * Random byte-token streams (mostly UTF-8 fragments) with random stop strings taken from the
 * stream's own bytes, against a reference over the whole unstopped text: the reply ends at the
 * first token after which some stop string (starting at a character boundary) is complete, cut
 * where the earliest of the complete ones starts; every piece is valid UTF-8.
 */
TEST(reply_text_randomized_against_whole_text)
{
	static const char *const alphabet[] = {
		"a", "b", " ", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xCC\x81", "\xD7\x90",
		"\x80", "\xC3", "\xF0\x9F"
	};
	uint32_t	rng = 12345;

	for (int trial = 0; trial < 3000; trial++)
	{
		char		bytes[64];
		int			n_bytes = 0;
		int32_t		ids[64];
		char		stops[3][8];
		const char *stop_ptrs[3];
		int			n_stop = 1 + (int) (next_random(&rng) % 3);
		reply_run	full;
		reply_run	cut;
		size_t		expect;

		while (n_bytes < 40)
		{
			const char *piece = alphabet[next_random(&rng) % 11];
			size_t		len = strlen(piece);

			memcpy(bytes + n_bytes, piece, len);
			n_bytes += (int) len;
		}
		bytes_to_ids(bytes, (size_t) n_bytes, ids);
		run_reply(ids, n_bytes, NULL, 0, &full);

		for (int s = 0; s < n_stop; s++)
		{
			size_t		from = next_random(&rng) % full.out_len;
			size_t		len = 1 + next_random(&rng) % 6;

			if (from + len > full.out_len)
				len = full.out_len - from;
			memcpy(stops[s], full.out + from, len);
			stops[s][len] = '\0';
			if (next_random(&rng) % 4 == 0)
				stops[s][len - 1] = 'z';	/* sometimes a near miss */
			if (stops[s][0] == '\0')
				stops[s][0] = 'q';
			stop_ptrs[s] = stops[s];
		}
		run_reply(ids, n_bytes, stop_ptrs, n_stop, &cut);

		expect = full.out_len;
		for (int t = 0; t < n_bytes && expect == full.out_len; t++)
			for (int s = 0; s < n_stop; s++)
			{
				size_t		len = strlen(stops[s]);

				for (size_t at = 0; at + len <= full.text_len[t] && at < expect; at++)
					if (((unsigned char) full.out[at] & 0xC0) != 0x80 &&
						memcmp(full.out + at, stops[s], len) == 0)
					{
						expect = at;
						break;
					}
			}
		CHECK_MSG(cut.out_len == expect && memcmp(cut.out, full.out, expect) == 0,
				  "trial %d: got %zu bytes, expected %zu", trial, cut.out_len, expect);
		CHECK_MSG(cut.stopped == (expect < full.out_len),
				  "trial %d: stopped %d", trial, (int) cut.stopped);
		CHECK(cut.pieces_valid);
		CHECK(full.pieces_valid);

		if (test_current_failures > 0)
			break;
	}
}
