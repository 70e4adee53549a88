/*
 * reply_text.c — a reply's text as tokens arrive, with stop strings (see reply_text.h).
 */
#define _GNU_SOURCE				/* memmem */
#include <stdlib.h>
#include <string.h>

#include "reply_text.h"
#include "util.h"

/* True for the second and later bytes of a UTF-8 sequence. */
static inline bool
is_continuation_byte(unsigned char c)
{
	return (c & 0xC0) == 0x80;
}

cai_status
cai_reply_text_init(cai_reply_text *rt, const cai_tokenizer *tok, const char *const *stop,
					int n_stop, cai_error *err)
{
	memset(rt, 0, sizeof(*rt));
	if (n_stop < 0 || n_stop > CAI_MAX_STOP_STRINGS)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "at most %d stop strings are allowed",
						CAI_MAX_STOP_STRINGS);
	for (int i = 0; i < n_stop; i++)
		if (stop == NULL || stop[i] == NULL || stop[i][0] == '\0')
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "stop strings must not be empty");

	/* cai_detokenizer_feed's bound for a token of nothing but invalid bytes, and some room */
	rt->piece_cap = 64 + 3 * cai_tokenizer_max_token_bytes(tok);
	rt->piece = malloc(rt->piece_cap);
	rt->cap = 256;
	rt->text = malloc(rt->cap);
	if (!rt->piece || !rt->text)
	{
		cai_reply_text_free(rt);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory for a reply's text");
	}
	rt->text[0] = '\0';
	for (int i = 0; i < n_stop; i++)
	{
		rt->stop_len[i] = strlen(stop[i]);
		rt->stop[i] = malloc(rt->stop_len[i] + 1);
		if (!rt->stop[i])
		{
			cai_reply_text_free(rt);
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory for a reply's stop strings");
		}
		memcpy(rt->stop[i], stop[i], rt->stop_len[i] + 1);
		if (rt->stop_len[i] > rt->max_stop_len)
			rt->max_stop_len = rt->stop_len[i];
		rt->n_stop = i + 1;
	}
	cai_detokenizer_init(&rt->detok, tok);
	return CAI_OK;
}

void
cai_reply_text_free(cai_reply_text *rt)
{
	for (int i = 0; i < rt->n_stop; i++)
		free(rt->stop[i]);
	free(rt->piece);
	free(rt->text);
	memset(rt, 0, sizeof(*rt));
}

/*
 * The earliest match of a stop string that starts at or after from and at a character boundary
 * (a stop string that begins with a continuation byte must not cut a character in two); -1 if
 * none.
 */
static long
find_stop(const cai_reply_text *rt, size_t from)
{
	long		best = -1;

	for (int i = 0; i < rt->n_stop; i++)
	{
		size_t		at = from;

		while (at + rt->stop_len[i] <= rt->len)
		{
			const char *hit = memmem(rt->text + at, rt->len - at, rt->stop[i], rt->stop_len[i]);
			size_t		pos;

			if (!hit)
				break;
			pos = (size_t) (hit - rt->text);
			if (best >= 0 && pos >= (size_t) best)
				break;
			if (!is_continuation_byte((unsigned char) rt->text[pos]))
			{
				best = (long) pos;
				break;
			}
			at = pos + 1;
		}
	}
	return best;
}

/* Appends bytes and cuts the text at a stop string that the new bytes complete. */
static bool
append(cai_reply_text *rt, const char *s, size_t n)
{
	size_t		old_len = rt->len;
	size_t		from;
	long		hit;

	if (n == 0 || rt->stopped)
		return true;
	if (rt->len + n + 1 > rt->cap)
	{
		size_t		cap = rt->cap;
		char	   *text;

		while (cap < rt->len + n + 1)
			cap *= 2;
		text = realloc(rt->text, cap);
		if (!text)
			return false;
		rt->text = text;
		rt->cap = cap;
	}
	memcpy(rt->text + rt->len, s, n);
	rt->len += n;
	rt->text[rt->len] = '\0';

	if (rt->n_stop == 0)
		return true;

	/*
	 * A match not found before must end in the new bytes, so it starts at most max_stop_len - 1
	 * bytes before them; and never before what was emitted, which held back every suffix that
	 * could still grow into a stop string.
	 */
	from = old_len >= rt->max_stop_len - 1 ? old_len - (rt->max_stop_len - 1) : 0;
	if (from < rt->emitted)
		from = rt->emitted;
	hit = find_stop(rt, from);
	if (hit >= 0)
	{
		rt->len = (size_t) hit;
		rt->text[rt->len] = '\0';
		rt->stopped = true;
	}
	return true;
}

bool
cai_reply_text_add_token(cai_reply_text *rt, const cai_tokenizer *tok, int32_t id)
{
	int			n;

	if (rt->stopped)
		return true;
	n = cai_detokenizer_feed(&rt->detok, tok, id, rt->piece, rt->piece_cap);
	return n <= 0 || append(rt, rt->piece, (size_t) n);
}

bool
cai_reply_text_finish(cai_reply_text *rt)
{
	int			n;

	if (rt->stopped)
		return true;
	n = cai_detokenizer_flush(&rt->detok, rt->piece, rt->piece_cap);
	return n <= 0 || append(rt, rt->piece, (size_t) n);
}

/* Where final text ends while the reply goes on: before any suffix that is a stop string's start. */
static size_t
safe_end(const cai_reply_text *rt)
{
	size_t		avail = rt->len - rt->emitted;
	size_t		keep = rt->max_stop_len > 0 ? rt->max_stop_len - 1 : 0;
	size_t		end = rt->len;

	if (keep > avail)
		keep = avail;
	for (; keep > 0; keep--)
	{
		const char *tail = rt->text + rt->len - keep;

		for (int i = 0; i < rt->n_stop; i++)
			if (rt->stop_len[i] > keep && memcmp(tail, rt->stop[i], keep) == 0)
			{
				end = rt->len - keep;
				goto found;
			}
	}
found:
	/* never hand out half a character (the text itself is valid UTF-8) */
	while (end > rt->emitted && end < rt->len && is_continuation_byte((unsigned char) rt->text[end]))
		end--;
	return end;
}

bool
cai_reply_text_take(cai_reply_text *rt, bool last, const char **text, size_t *len)
{
	size_t		end = (last || rt->stopped) ? rt->len : safe_end(rt);

	*text = rt->text + rt->emitted;
	*len = end - rt->emitted;
	rt->emitted = end;
	return rt->stopped;
}
