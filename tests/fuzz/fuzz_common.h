/*
 * fuzz_common.h — what the libFuzzer targets share: a reader that carves typed values out of
 * the input, an independent UTF-8 checker and "replace" decoder (the references the engine's
 * output is compared with), the in-memory tokenizers of tests/unit/tokenizer_fixtures.h, and
 * loading a GGUF image as a model.
 *
 * A target reports a broken invariant with FUZZ_CHECK, which prints where and aborts, so that
 * libFuzzer records the input as a crash like any sanitizer report.
 */
#ifndef CAI_FUZZ_COMMON_H
#define CAI_FUZZ_COMMON_H

#define _GNU_SOURCE				/* memfd_create */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cai.h"
#include "synth_model.h"
#include "tokenizer.h"
#include "tokenizer_fixtures.h"

#define FUZZ_CHECK(cond) do { \
	if (!(cond)) { \
		fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
		abort(); \
	} } while (0)

/* ---------------------------------------------------------------------------------------------
 * Carving the input
 * ------------------------------------------------------------------------------------------- */

typedef struct fuzz_input
{
	const uint8_t *p;
	size_t		n;
} fuzz_input;

static inline uint8_t
fuzz_u8(fuzz_input *in)
{
	if (in->n == 0)
		return 0;
	in->n--;
	return *in->p++;
}

static inline uint16_t
fuzz_u16(fuzz_input *in)
{
	return (uint16_t) (fuzz_u8(in) | fuzz_u8(in) << 8);
}

static inline uint32_t
fuzz_u32(fuzz_input *in)
{
	return (uint32_t) fuzz_u16(in) | (uint32_t) fuzz_u16(in) << 16;
}

static inline bool
fuzz_bool(fuzz_input *in)
{
	return fuzz_u8(in) & 1;
}

/* Up to len bytes of the input (fewer at its end); *got says how many. */
static inline const uint8_t *
fuzz_take(fuzz_input *in, size_t len, size_t *got)
{
	const uint8_t *p = in->p;

	if (len > in->n)
		len = in->n;
	in->p += len;
	in->n -= len;
	*got = len;
	return p;
}

/*
 * A chunk of at most max bytes whose length is the next input byte (two bytes when max > 255),
 * copied to a malloc'd buffer with a NUL after it (the chunk itself may hold NULs).
 */
static inline char *
fuzz_chunk(fuzz_input *in, size_t max, size_t *len)
{
	size_t		want = max > 255 ? fuzz_u16(in) : fuzz_u8(in);
	const uint8_t *p = fuzz_take(in, want % (max + 1), len);
	char	   *s = malloc(*len + 1);

	FUZZ_CHECK(s != NULL);
	memcpy(s, p, *len);
	s[*len] = '\0';
	return s;
}

/* ---------------------------------------------------------------------------------------------
 * UTF-8 references, written from the Unicode standard's table 3-7 (not the engine's decoder)
 * ------------------------------------------------------------------------------------------- */

/*
 * The length of the well-formed sequence at s, or 0; *subpart gets the length of the maximal
 * ill-formed subpart there (the bytes one U+FFFD replaces) when it is not well formed.
 */
static inline int
fuzz_utf8_sequence(const unsigned char *s, size_t len, size_t *subpart)
{
	/* lead bytes, the sequence length, the range of the second byte (table 3-7) */
	static const struct
	{
		unsigned char first,
					last,
					need,
					lo,
					hi;
	}			leads[] = {
		{0xC2, 0xDF, 2, 0x80, 0xBF}, {0xE0, 0xE0, 3, 0xA0, 0xBF}, {0xE1, 0xEC, 3, 0x80, 0xBF},
		{0xED, 0xED, 3, 0x80, 0x9F}, {0xEE, 0xEF, 3, 0x80, 0xBF}, {0xF0, 0xF0, 4, 0x90, 0xBF},
		{0xF1, 0xF3, 4, 0x80, 0xBF}, {0xF4, 0xF4, 4, 0x80, 0x8F},
	};

	*subpart = 1;
	if (s[0] < 0x80)
		return 1;
	for (size_t i = 0; i < sizeof(leads) / sizeof(leads[0]); i++)
	{
		size_t		k;

		if (s[0] < leads[i].first || s[0] > leads[i].last)
			continue;
		for (k = 1; k < leads[i].need && k < len; k++)
			if (k == 1 ? (s[1] < leads[i].lo || s[1] > leads[i].hi) : (s[k] < 0x80 || s[k] > 0xBF))
				break;
		if (k == leads[i].need)
			return k;
		*subpart = k;
		return 0;
	}
	return 0;
}

static inline bool
fuzz_utf8_valid(const char *s, size_t len)
{
	for (size_t p = 0; p < len;)
	{
		size_t		subpart;
		int			k = fuzz_utf8_sequence((const unsigned char *) s + p, len - p, &subpart);

		if (k == 0)
			return false;
		p += k;
	}
	return true;
}

/*
 * s decoded as UTF-8 with errors replaced, as Python's bytes.decode("utf-8", "replace") does:
 * one U+FFFD per maximal ill-formed subpart.  out must hold 3 * len bytes; returns the length.
 */
static inline size_t
fuzz_utf8_replace(const char *s, size_t len, char *out)
{
	size_t		n = 0;

	for (size_t p = 0; p < len;)
	{
		size_t		subpart;
		int			k = fuzz_utf8_sequence((const unsigned char *) s + p, len - p, &subpart);

		if (k > 0)
		{
			memcpy(out + n, s + p, k);
			n += k;
			p += k;
		}
		else
		{
			memcpy(out + n, "\xEF\xBF\xBD", 3);
			n += 3;
			p += subpart;
		}
	}
	return n;
}

/* True for the second and later bytes of a UTF-8 sequence. */
static inline bool
fuzz_is_continuation(unsigned char c)
{
	return (c & 0xC0) == 0x80;
}

/* ---------------------------------------------------------------------------------------------
 * Tokenizers and models
 * ------------------------------------------------------------------------------------------- */

/*
 * The tokenizers the text targets run over: byte-level BPE with each pre-tokenizer, with
 * ChatML, Llama 3 and Gemma markup as control tokens, a markup-looking user-defined token (which
 * acts as a control token) and two plain ones; then SentencePiece with and without the space
 * prefix.  The BPE merges are the synthetic model's.  Built once, never freed (libFuzzer keeps
 * the process).
 */
#define FUZZ_N_TOKENIZERS 6
#define FUZZ_N_BPE 4

static const char *const fuzz_controls[] = {
	"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>",
	"<|eot_id|>", "<start_of_turn>", "<end_of_turn>"
};
#define FUZZ_N_CONTROLS ((int) (sizeof(fuzz_controls) / sizeof(fuzz_controls[0])))

static inline cai_tokenizer *
fuzz_tokenizer(int i)
{
	static cai_tokenizer *toks[FUZZ_N_TOKENIZERS];
	static const char *const pres[FUZZ_N_BPE] = {"smollm", "llama-bpe", "qwen2", "gpt2"};
	static const char *const user[] = {"<tool_call>", "  ", "ab"};

	i %= FUZZ_N_TOKENIZERS;
	if (!toks[i])
	{
		if (i < FUZZ_N_BPE)
		{
			int			n = synth_model_n_merges();
			const char **merges = malloc(sizeof(char *) * n);

			FUZZ_CHECK(merges != NULL);
			for (int k = 0; k < n; k++)
				merges[k] = synth_model_merge(k);
			toks[i] = fixture_bpe(pres[i], fuzz_controls, FUZZ_N_CONTROLS, merges, n, user, 3,
								  1, 2, i == 1);
			free(merges);
		}
		else
			toks[i] = fixture_spm(i == FUZZ_N_BPE, fuzz_controls, FUZZ_N_CONTROLS);
		FUZZ_CHECK(toks[i] != NULL);
	}
	return toks[i];
}

static inline bool
fuzz_tokenizer_is_bpe(int i)
{
	return i % FUZZ_N_TOKENIZERS < FUZZ_N_BPE;
}

/* True for the SentencePiece tokenizer that puts a space in front of the text. */
static inline bool
fuzz_tokenizer_space_prefix(int i)
{
	return i % FUZZ_N_TOKENIZERS == FUZZ_N_BPE;
}

/*
 * The bytes ids stand for as the streaming detokenizer sees them: concatenated, ids outside the
 * vocabulary adding nothing, and, when drop_first_space (SentencePiece with a space prefix), the
 * leading space of the first non-empty ordinary token dropped.  malloc'd (3 * *len + 4 bytes,
 * room for fuzz_utf8_replace), *len its length.
 */
static inline char *
fuzz_token_text(const cai_tokenizer *tok, const int32_t *ids, int n, bool drop_first_space,
				size_t *len)
{
	size_t		total = 0;
	char	   *s;

	for (int i = 0; i < n; i++)
	{
		int			k = cai_tokenizer_token_bytes(tok, ids[i], NULL, 0);

		total += k > 0 ? (size_t) k : 0;
	}
	s = malloc(3 * total + 4);
	FUZZ_CHECK(s != NULL);
	*len = 0;
	for (int i = 0; i < n; i++)
	{
		int			k = cai_tokenizer_token_bytes(tok, ids[i], s + *len, (int) (total - *len));

		if (k <= 0)
			continue;
		if (drop_first_space && !cai_tokenizer_is_special(tok, ids[i]))
		{
			drop_first_space = false;
			if (s[*len] == ' ')
			{
				memmove(s + *len, s + *len + 1, k - 1);
				k--;
			}
		}
		*len += k;
	}
	return s;
}

/*
 * Loads a GGUF image as a model through a memory file (cai_model_load takes a path; the file is
 * mapped, so closing it afterwards is fine).
 */
static inline cai_status
fuzz_model_load(const uint8_t *data, size_t size, const cai_model_params *params,
				cai_model **out, cai_error *err)
{
	char		path[64];
	int			fd = memfd_create("fuzz-gguf", MFD_CLOEXEC);
	size_t		done = 0;
	cai_status	st;

	FUZZ_CHECK(fd >= 0);
	while (done < size)
	{
		ssize_t		k = write(fd, data + done, size - done);

		FUZZ_CHECK(k > 0);
		done += (size_t) k;
	}
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	st = cai_model_load(path, params, out, err);
	close(fd);
	return st;
}

/* What a loaded model offers a caller, once: info, description, tokens, a chat prompt. */
static inline void
fuzz_use_model(cai_model *model)
{
	cai_model_info info;
	char	   *text = NULL;
	int32_t    *ids = NULL;
	int			n_ids = 0;
	size_t		len;
	cai_error	err;
	cai_chat_message msgs[2] = {
		{CAI_ROLE_SYSTEM, "Be brief.", NULL, 0, NULL},
		{CAI_ROLE_USER, "Hello <|im_end|> world 12345 \xF0\x9F\x98\x80", NULL, 0, NULL},
	};
	cai_prompt	prompt;

	cai_model_get_info(model, &info);
	FUZZ_CHECK(info.n_vocab > 0 && info.arch && info.name && info.chat_template);
	FUZZ_CHECK(cai_model_describe(model, &text, &err) == CAI_OK);
	cai_free(text);
	FUZZ_CHECK(cai_tokenize(model, msgs[1].content, strlen(msgs[1].content), true, &ids, &n_ids,
							&err) == CAI_OK);
	FUZZ_CHECK(cai_detokenize(model, ids, n_ids, &text, &len, &err) == CAI_OK);
	cai_free(text);
	cai_free(ids);
	FUZZ_CHECK(cai_chat_build_prompt(model, msgs, 2, NULL, &prompt, &err) == CAI_OK);
	for (int i = 0; i < prompt.n_ids; i++)
		FUZZ_CHECK(prompt.ids[i] >= 0 && prompt.ids[i] < info.n_vocab);
	cai_prompt_free(&prompt);
}

#endif							/* CAI_FUZZ_COMMON_H */
