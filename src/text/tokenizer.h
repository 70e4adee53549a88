/*
 * tokenizer.h — the model's tokenizer, read from GGUF metadata (tokenizer.ggml.*).
 *
 * Two families:
 *  - byte-level BPE ("gpt2" model): GPT-2 byte-to-unicode mapping, merges by rank, with the
 *    pre-tokenizer chosen by tokenizer.ggml.pre (smollm, llama-bpe/llama3, qwen2, gpt2, default)
 *  - SentencePiece-style ("llama" model, also Gemma): score-driven merges, "▁" for spaces,
 *    byte-fallback tokens <0xNN>
 * Control/special tokens are matched only when parse_special is true; plain text never yields one.
 */
#ifndef CAI_TOKENIZER_H
#define CAI_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"
#include "gguf.h"
#include "util.h"

typedef struct cai_tokenizer cai_tokenizer;

cai_status	cai_tokenizer_load(const gguf_file *file, cai_tokenizer **out, cai_error *err);
void		cai_tokenizer_free(cai_tokenizer *tok);

int			cai_tokenizer_n_vocab(const cai_tokenizer *tok);
int32_t		cai_tokenizer_bos(const cai_tokenizer *tok);	/* -1 if none */
int32_t		cai_tokenizer_eos(const cai_tokenizer *tok);	/* -1 if none */
bool		cai_tokenizer_add_bos(const cai_tokenizer *tok);	/* tokenizer.ggml.add_bos_token */

/* The id whose vocabulary text is exactly `text` ("<|im_end|>"), or -1. */
int32_t		cai_tokenizer_find(const cai_tokenizer *tok, const char *text);

/* True for control/special tokens (token_type CONTROL or USER_DEFINED special text). */
bool		cai_tokenizer_is_special(const cai_tokenizer *tok, int32_t id);

/* Appends the ids of text to out (no BOS). */
cai_status	cai_tokenizer_encode(const cai_tokenizer *tok, const char *text, size_t len,
								 bool parse_special, cai_tokens *out, cai_error *err);

/*
 * As cai_tokenizer_encode, for text that continues a sequence already begun (chat templates
 * render a prompt piece by piece): no SentencePiece space prefix is put at its start.
 */
cai_status	cai_tokenizer_encode_continuation(const cai_tokenizer *tok, const char *text,
											  size_t len, bool parse_special, cai_tokens *out,
											  cai_error *err);

/* The longest byte string any single token stands for (sizes detokenizer buffers). */
int			cai_tokenizer_max_token_bytes(const cai_tokenizer *tok);

/*
 * The bytes token id stands for (byte-level decoding, "▁" -> " ", <0xNN> -> the byte; special
 * tokens -> their text).  Returns the length; writes at most cap bytes; -1 for a bad id.
 */
int			cai_tokenizer_token_bytes(const cai_tokenizer *tok, int32_t id, char *buf, int cap);

/*
 * Incremental, UTF-8-safe detokenization: feed ids one at a time; only complete UTF-8 sequences
 * come out (an incomplete tail waits for the next token; invalid bytes become U+FFFD).
 */
typedef struct cai_detokenizer
{
	unsigned char pending[8];
	int			n_pending;
	bool		at_start;		/* SentencePiece: drop the leading space of the first piece */
} cai_detokenizer;

void		cai_detokenizer_init(cai_detokenizer *d, const cai_tokenizer *tok);

/*
 * Writes the newly complete text for id to out and returns its length.  out must hold >= 64 +
 * the longest token's bytes; 16 + 3 * cai_tokenizer_max_token_bytes() covers even a token of
 * nothing but invalid bytes.  Nothing is ever written past cap.
 */
int			cai_detokenizer_feed(cai_detokenizer *d, const cai_tokenizer *tok, int32_t id,
								 char *out, int cap);

/* Emits what is left (as U+FFFD for an incomplete sequence). */
int			cai_detokenizer_flush(cai_detokenizer *d, char *out, int cap);

#endif							/* CAI_TOKENIZER_H */
