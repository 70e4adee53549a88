/*
 * fuzz_reply_text.c — a reply's text (src/chat/reply_text.c) over random token streams and
 * random stop strings.
 *
 * Input: a tokenizer byte, the number of stop strings (0..8, more is refused) and each as a
 * length-prefixed byte string, then operations: a byte whose low three bits are 0 takes the
 * final text so far, any other is followed by a u16 token id (mapped a little past both ends of
 * the vocabulary).  At the end the reply finishes and the last take hands out the rest.
 * Invariants:
 *  - an empty stop string is refused, and nothing else is;
 *  - every piece handed out is valid UTF-8, and the pieces concatenate to the final text;
 *  - the final text is the detokenized text (the same ids through a plain detokenizer) cut
 *    before the first stop string that starts at a character boundary, "first" as a streaming
 *    reader sees it: after the first token whose text completes a match, the earliest match;
 *  - so no stop string starting at a character boundary is ever handed out, and the reply says
 *    it stopped exactly when one matched.
 */
#include "fuzz_common.h"
#include "reply_text.h"

#define MAX_STOP_LEN 24

/* The earliest stop string match starting at a character boundary of s[0..len), or -1. */
static long
first_stop(const char *s, size_t len, char *const *stop, int n_stop)
{
	for (size_t p = 0; p < len; p++)
	{
		if (fuzz_is_continuation((unsigned char) s[p]))
			continue;
		for (int i = 0; i < n_stop; i++)
		{
			size_t		k = strlen(stop[i]);

			if (k <= len - p && memcmp(s + p, stop[i], k) == 0)
				return (long) p;
		}
	}
	return -1;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_input	in = {data, size};
	int			which = fuzz_u8(&in) % FUZZ_N_TOKENIZERS;
	const cai_tokenizer *tok = fuzz_tokenizer(which);
	int			n_vocab = cai_tokenizer_n_vocab(tok);
	int			n_stop = fuzz_u8(&in) % (CAI_MAX_STOP_STRINGS + 2);
	char	   *stop[CAI_MAX_STOP_STRINGS + 1];
	bool		any_empty = false;
	cai_reply_text rt;
	cai_error	err;
	cai_status	st;
	cai_tokens	ids;
	char	   *out = NULL;
	size_t		out_len = 0;
	size_t		out_cap = 0;
	bool		stopped = false;

	for (int i = 0; i < n_stop; i++)
	{
		size_t		len;

		stop[i] = fuzz_chunk(&in, MAX_STOP_LEN, &len);
		any_empty |= stop[i][0] == '\0';
	}
	st = cai_reply_text_init(&rt, tok, (const char *const *) stop, n_stop, &err);
	if (n_stop > CAI_MAX_STOP_STRINGS || any_empty)
	{
		FUZZ_CHECK(st == CAI_ERR_INVALID_ARGUMENT);
		goto done_stops;
	}
	FUZZ_CHECK(st == CAI_OK);

	cai_tokens_init(&ids);
	for (bool last = false;;)
	{
		const char *piece;
		size_t		len;
		bool		take = last;

		if (!last && in.n == 0)
		{
			FUZZ_CHECK(cai_reply_text_finish(&rt));
			last = take = true;
		}
		else if (!last && (fuzz_u8(&in) & 7) == 0)
			take = true;
		else if (!last)
		{
			int32_t		id = (int32_t) (fuzz_u16(&in) % (n_vocab + 8)) - 4;

			FUZZ_CHECK(cai_tokens_push(&ids, id));
			FUZZ_CHECK(cai_reply_text_add_token(&rt, tok, id));
		}
		if (!take)
			continue;
		stopped = cai_reply_text_take(&rt, last, &piece, &len);
		FUZZ_CHECK(piece != NULL && fuzz_utf8_valid(piece, len));
		if (out_len + len + 1 > out_cap)
		{
			out_cap = 2 * (out_len + len + 1);
			out = realloc(out, out_cap);
			FUZZ_CHECK(out != NULL);
		}
		memcpy(out + out_len, piece, len);
		out_len += len;
		/* what was handed out is final text */
		FUZZ_CHECK(out_len <= rt.len && memcmp(out, rt.text, out_len) == 0);
		if (last)
			break;
	}
	FUZZ_CHECK(out_len == rt.len && rt.text[rt.len] == '\0');
	FUZZ_CHECK(first_stop(out, out_len, stop, n_stop) < 0);

	/*
	 * The reference: the text as each token completes it, through a plain detokenizer; the
	 * first prefix holding a match decides where the reply ends.
	 */
	{
		int			cap = 16 + 3 * cai_tokenizer_max_token_bytes(tok);
		size_t		full_cap = (size_t) (ids.n + 1) * cap + 1;
		char	   *full = malloc(full_cap);
		size_t		full_len = 0;
		long		cut = -1;
		cai_detokenizer d;

		FUZZ_CHECK(full != NULL);
		cai_detokenizer_init(&d, tok);
		for (int i = 0; i <= ids.n && cut < 0; i++)
		{
			full_len += i < ids.n ? cai_detokenizer_feed(&d, tok, ids.ids[i], full + full_len, cap)
				: cai_detokenizer_flush(&d, full + full_len, cap);
			cut = first_stop(full, full_len, stop, n_stop);
		}
		FUZZ_CHECK(stopped == (cut >= 0));
		if (cut >= 0)
			full_len = (size_t) cut;
		FUZZ_CHECK(out_len == full_len && memcmp(out, full, full_len) == 0);
		free(full);
	}

	cai_tokens_free(&ids);
	free(out);
	cai_reply_text_free(&rt);
done_stops:
	for (int i = 0; i < n_stop; i++)
		free(stop[i]);
	return 0;
}
