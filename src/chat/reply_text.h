/*
 * reply_text.h — the text of a reply as its tokens arrive: UTF-8-safe detokenization, stop
 * strings, and how much of the text is final and may be sent.
 *
 * A token can end in the middle of a UTF-8 sequence (byte tokens, emoji split over several
 * tokens), so a reply's text can stay empty for several tokens, and a stop string can be split
 * across tokens.  Text is matched as bytes (memmem, never strstr: a byte token can put a NUL in
 * the reply); what may still grow into a stop string is held back, so that a stop string is never
 * sent, and so is nothing after it.
 */
#ifndef CAI_REPLY_TEXT_H
#define CAI_REPLY_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"
#include "tokenizer.h"

typedef struct cai_reply_text
{
	cai_detokenizer detok;
	char	   *text;			/* all final text so far; NUL-terminated, never NULL */
	size_t		len;
	size_t		cap;
	size_t		emitted;		/* bytes already handed out by cai_reply_text_take */
	bool		stopped;		/* a stop string matched; the text ends before it */

	int			n_stop;
	char	   *stop[CAI_MAX_STOP_STRINGS]; /* copies */
	size_t		stop_len[CAI_MAX_STOP_STRINGS];
	size_t		max_stop_len;

	char	   *piece;			/* one token's detokenized text */
	int			piece_cap;
} cai_reply_text;

/*
 * Starts an empty reply with copies of the stop strings (each non-empty, NUL-terminated).
 * CAI_ERR_INVALID_ARGUMENT for an empty or missing stop string, CAI_ERR_NO_MEMORY.
 */
cai_status	cai_reply_text_init(cai_reply_text *rt, const cai_tokenizer *tok,
								const char *const *stop, int n_stop, cai_error *err);
void		cai_reply_text_free(cai_reply_text *rt);

/*
 * Appends a generated token's text (an incomplete UTF-8 tail waits for the next token).  A token
 * after a matched stop string adds nothing.  False when out of memory (the text is unchanged).
 */
bool		cai_reply_text_add_token(cai_reply_text *rt, const cai_tokenizer *tok, int32_t id);

/* The reply ends: an incomplete UTF-8 tail becomes U+FFFD.  False when out of memory. */
bool		cai_reply_text_finish(cai_reply_text *rt);

/*
 * The text that became final since the last call, in *text and *len (never NULL; may be
 * empty).  With last false, a suffix that could still grow into a stop string is held back; with
 * last true (the reply ends) everything up to a matched stop string is final.  Returns true once a stop
 * string has matched: the reply must end.
 */
bool		cai_reply_text_take(cai_reply_text *rt, bool last, const char **text, size_t *len);

#endif							/* CAI_REPLY_TEXT_H */
