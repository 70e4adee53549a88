/*
 * fuzz_tokenizer.c — encoding arbitrary bytes and streaming detokenization of arbitrary token
 * ids, over byte-level BPE (each pre-tokenizer) and SentencePiece (with and without the space
 * prefix).
 *
 * Input: a flags byte (tokenizer, parse_special, continuation, a small output cap), a
 * length-prefixed text, then little-endian u16 token ids (mapped a little past both ends of the
 * vocabulary).  Invariants:
 *  - encoding succeeds, every id is in the vocabulary, and without parse_special no special
 *    token comes out;
 *  - the ids spell the text again: exactly for BPE; for SentencePiece with "▁" read as a space,
 *    after the one space the prefix adds (not checked with special tokens parsed, where every
 *    stretch after one gets a prefix);
 *  - streaming the ids (encoded ones, then the random ones) through cai_detokenizer_feed/flush
 *    with the documented buffer size writes nothing past it, hands out valid UTF-8 only, and
 *    gives exactly the "replace" decoding of the tokens' bytes, and a flush leaves nothing
 *    behind; with a tiny buffer nothing is written past it either.
 */
#include "fuzz_common.h"

#define MAX_TEXT 4096

static const char spm_space[] = "\xE2\x96\x81";

/* Streams ids through a detokenizer whose buffer is exactly the documented size. */
static void
check_stream(const cai_tokenizer *tok, int which, const int32_t *ids, int n)
{
	int			cap = 16 + 3 * cai_tokenizer_max_token_bytes(tok);
	char	   *buf = malloc(cap);
	size_t		ref_len;
	char	   *ref_bytes = fuzz_token_text(tok, ids, n, fuzz_tokenizer_space_prefix(which), &ref_len);
	char	   *ref = malloc(3 * ref_len + 4);
	size_t		want = fuzz_utf8_replace(ref_bytes, ref_len, ref);
	char	   *got = malloc(3 * ref_len + 4);
	size_t		got_len = 0;
	cai_detokenizer d;

	FUZZ_CHECK(buf && ref && got);
	cai_detokenizer_init(&d, tok);
	for (int i = 0; i <= n; i++)
	{
		int			k = i < n ? cai_detokenizer_feed(&d, tok, ids[i], buf, cap)
			: cai_detokenizer_flush(&d, buf, cap);

		FUZZ_CHECK(k >= 0 && k <= cap);
		FUZZ_CHECK(fuzz_utf8_valid(buf, k));
		FUZZ_CHECK(got_len + k <= want);
		memcpy(got + got_len, buf, k);
		got_len += k;
	}
	FUZZ_CHECK(got_len == want && memcmp(got, ref, want) == 0);
	FUZZ_CHECK(cai_detokenizer_flush(&d, buf, cap) == 0);	/* the flush left nothing behind */
	free(buf);
	free(ref_bytes);
	free(ref);
	free(got);
}

/* The same stream into a buffer of only cap bytes: truncated output, but never past cap. */
static void
check_stream_small(const cai_tokenizer *tok, const int32_t *ids, int n, int cap)
{
	char	   *buf = malloc(cap);
	cai_detokenizer d;

	FUZZ_CHECK(buf != NULL);
	cai_detokenizer_init(&d, tok);
	for (int i = 0; i < n; i++)
	{
		int			k = cai_detokenizer_feed(&d, tok, ids[i], buf, cap);

		FUZZ_CHECK(k >= 0 && k <= cap);
		k = cai_tokenizer_token_bytes(tok, ids[i], buf, cap);
		FUZZ_CHECK(k >= -1 && k <= cai_tokenizer_max_token_bytes(tok));
	}
	FUZZ_CHECK(cai_detokenizer_flush(&d, buf, cap) <= cap);
	free(buf);
}

/* text with every "▁" read as a space (SentencePiece's decoding of its pieces). */
static size_t
spm_spaces(const char *text, size_t len, char *out)
{
	size_t		n = 0;

	for (size_t i = 0; i < len;)
	{
		if (i + 3 <= len && memcmp(text + i, spm_space, 3) == 0)
		{
			out[n++] = ' ';
			i += 3;
		}
		else
			out[n++] = text[i++];
	}
	return n;
}

static void
check_encode(const cai_tokenizer *tok, int which, const char *text, size_t len,
			 bool parse_special, bool continuation, cai_tokens *out)
{
	cai_error	err;
	cai_status	st;
	int			n_vocab = cai_tokenizer_n_vocab(tok);

	st = continuation
		? cai_tokenizer_encode_continuation(tok, text, len, parse_special, out, &err)
		: cai_tokenizer_encode(tok, text, len, parse_special, out, &err);
	FUZZ_CHECK(st == CAI_OK);
	for (int i = 0; i < out->n; i++)
	{
		FUZZ_CHECK(out->ids[i] >= 0 && out->ids[i] < n_vocab);
		FUZZ_CHECK(parse_special || !cai_tokenizer_is_special(tok, out->ids[i]));
	}

	/* with the space prefix, each stretch after a special token gets one: not checked */
	if (fuzz_tokenizer_is_bpe(which) || !fuzz_tokenizer_space_prefix(which) || !parse_special)
	{
		size_t		got_len;
		char	   *got = fuzz_token_text(tok, out->ids, out->n, false, &got_len);
		char	   *want = malloc(len + 2);
		size_t		want_len = 0;

		FUZZ_CHECK(want != NULL);
		if (fuzz_tokenizer_is_bpe(which))
		{
			memcpy(want, text, len);
			want_len = len;
		}
		else
		{
			if (fuzz_tokenizer_space_prefix(which) && !continuation && len > 0)
				want[want_len++] = ' ';
			want_len += spm_spaces(text, len, want + want_len);
		}
		FUZZ_CHECK(got_len == want_len && memcmp(got, want, want_len) == 0);
		free(got);
		free(want);
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_input	in = {data, size};
	uint8_t		flags = fuzz_u8(&in);
	int			which = (flags & 7) % FUZZ_N_TOKENIZERS;
	bool		parse_special = flags & 8;
	bool		continuation = flags & 16;
	int			small_cap = 1 + (flags >> 5);
	const cai_tokenizer *tok = fuzz_tokenizer(which);
	int			n_vocab = cai_tokenizer_n_vocab(tok);
	size_t		len;
	char	   *text = fuzz_chunk(&in, MAX_TEXT, &len);
	cai_tokens	ids;

	cai_tokens_init(&ids);
	check_encode(tok, which, text, len, parse_special, continuation, &ids);
	check_stream(tok, which, ids.ids, ids.n);

	/* then ids from the input, some just outside the vocabulary */
	ids.n = 0;
	while (in.n >= 2)
		FUZZ_CHECK(cai_tokens_push(&ids, (int32_t) (fuzz_u16(&in) % (n_vocab + 8)) - 4));
	check_stream(tok, which, ids.ids, ids.n);
	check_stream_small(tok, ids.ids, ids.n, small_cap);

	/* the vocabulary look-up by text */
	{
		int32_t		id = cai_tokenizer_find(tok, text);

		FUZZ_CHECK(id >= -1 && id < n_vocab);
	}
	cai_tokens_free(&ids);
	free(text);
	return 0;
}
