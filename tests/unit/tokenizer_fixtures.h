/*
 * tokenizer_fixtures.h — small tokenizers built in memory (through a GGUF image written by
 * tests/synth/gguf_writer) for test_tokenizer.c and test_chat_template.c.
 *
 *  - fixture_bpe(): a byte-level BPE vocabulary: control tokens first (ids 0..), then the 256
 *    byte tokens in byte order (GPT-2 byte-to-unicode characters), then one token per merge
 *    rule, then user-defined tokens.
 *  - fixture_spm(): a SentencePiece vocabulary: <unk> <s> </s>, <0x00>..<0xFF>, the pieces of
 *    FIXTURE_SPM_PIECES with their scores, then extra control tokens.  scripts/tokenizer_reference.py
 *    builds the same vocabulary to get llama.cpp's ids for it.
 */
#ifndef CAI_TOKENIZER_FIXTURES_H
#define CAI_TOKENIZER_FIXTURES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_writer.h"
#include "tokenizer.h"
#include "unicode.h"

#define FIXTURE_TYPE_NORMAL 1
#define FIXTURE_TYPE_UNKNOWN 2
#define FIXTURE_TYPE_CONTROL 3
#define FIXTURE_TYPE_USER_DEFINED 4
#define FIXTURE_TYPE_BYTE 6

/* GPT-2's byte-to-unicode mapping, written independently of the tokenizer's own. */
static inline uint32_t
fixture_byte_char(int byte)
{
	int			n = 0;

	for (int b = 0; b < 256; b++)
	{
		bool		printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);

		if (b == byte)
			return printable ? (uint32_t) b : 256 + (uint32_t) n;
		if (!printable)
			n++;
	}
	return 0;
}

/* Writes w to memory and loads a tokenizer from it (NULL on failure, *status says why). */
static inline cai_tokenizer *
fixture_load(gguf_writer *w, cai_status *status, cai_error *err)
{
	uint8_t    *data = NULL;
	size_t		size = 0;
	gguf_file  *file = NULL;
	cai_tokenizer *tok = NULL;
	cai_error	local;

	if (!err)
		err = &local;
	*status = CAI_ERR_INTERNAL;
	if (!gguf_writer_write_buffer(w, &data, &size))
	{
		gguf_writer_free(w);
		return NULL;
	}
	gguf_writer_free(w);
	*status = gguf_open_memory(data, size, &file, err);
	if (*status == CAI_OK)
	{
		*status = cai_tokenizer_load(file, &tok, err);
		gguf_close(file);
	}
	free(data);
	return tok;
}

/*
 * The GGUF metadata of a byte-level BPE tokenizer (NULL when out of memory).  merges are in
 * vocabulary notation ("Ġ t"); bos/eos are ids (-1: key left out).
 */
static inline gguf_writer *
fixture_bpe_writer(const char *pre, const char *const *controls, int n_controls,
				   const char *const *merges, int n_merges, const char *const *user_defined,
				   int n_user_defined, int32_t bos, int32_t eos, bool add_bos)
{
	int			n = n_controls + 256 + n_merges + n_user_defined;
	char	  **tokens = calloc(n, sizeof(char *));
	int32_t    *types = calloc(n, sizeof(int32_t));
	gguf_writer *w = gguf_writer_new();
	gguf_writer *done_w = NULL;
	int			k = 0;

	if (!tokens || !types || !w)
		goto done;
	for (int i = 0; i < n_controls; i++, k++)
	{
		tokens[k] = strdup(controls[i]);
		types[k] = FIXTURE_TYPE_CONTROL;
	}
	for (int b = 0; b < 256; b++, k++)
	{
		tokens[k] = calloc(5, 1);
		if (tokens[k])
			cai_utf8_encode(fixture_byte_char(b), tokens[k]);
		types[k] = FIXTURE_TYPE_NORMAL;
	}
	for (int i = 0; i < n_merges; i++, k++)
	{
		const char *space = strchr(merges[i], ' ');

		tokens[k] = calloc(strlen(merges[i]) + 1, 1);
		if (tokens[k] && space)
		{
			memcpy(tokens[k], merges[i], space - merges[i]);
			strcat(tokens[k], space + 1);
		}
		types[k] = FIXTURE_TYPE_NORMAL;
	}
	for (int i = 0; i < n_user_defined; i++, k++)
	{
		tokens[k] = strdup(user_defined[i]);
		types[k] = FIXTURE_TYPE_USER_DEFINED;
	}
	for (int i = 0; i < n; i++)
		if (!tokens[i])
			goto done;

	gguf_writer_add_str(w, "general.architecture", "llama");
	gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
	gguf_writer_add_str(w, "tokenizer.ggml.pre", pre);
	gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *) tokens, n);
	gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, n);
	gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, n_merges);
	if (bos >= 0)
		gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t) bos);
	if (eos >= 0)
		gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t) eos);
	gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
	done_w = w;
	w = NULL;
done:
	if (w)
		gguf_writer_free(w);
	if (tokens)
		for (int i = 0; i < n; i++)
			free(tokens[i]);
	free(tokens);
	free(types);
	return done_w;
}

/* The byte-level BPE tokenizer of fixture_bpe_writer, loaded. */
static inline cai_tokenizer *
fixture_bpe(const char *pre, const char *const *controls, int n_controls,
			const char *const *merges, int n_merges, const char *const *user_defined,
			int n_user_defined, int32_t bos, int32_t eos, bool add_bos)
{
	gguf_writer *w = fixture_bpe_writer(pre, controls, n_controls, merges, n_merges,
										user_defined, n_user_defined, bos, eos, add_bos);
	cai_status	st;

	return w ? fixture_load(w, &st, NULL) : NULL;
}

/* The byte token of byte b in fixture_bpe's vocabulary. */
#define FIXTURE_BPE_BYTE(n_controls, b) ((n_controls) + (b))

/* The SentencePiece pieces after <unk> <s> </s> and the 256 byte tokens (ids 259..). */
#define FIXTURE_SPM_FIRST_PIECE 259
static const struct __attribute__((unused))
{
	const char *piece;
	float		score;
}			fixture_spm_pieces[] = {
	{"\u2581", -1}, {"e", -2}, {"l", -3}, {"o", -4}, {"h", -5}, {"w", -6}, {"r", -7}, {"d", -8},
	{"H", -9}, {"t", -10}, {"a", -11}, {"n", -12}, {"!", -13}, {"\u00e9", -14}, {"\u65e5", -15},
	{"\u672c", -16}, {"ll", -20}, {"he", -21}, {"\u2581t", -22}, {"\u2581the", -23}, {"llo", -24},
	{"ello", -25}, {"\u2581H", -26}, {"\u2581He", -27}, {"\u2581Hello", -28}, {"\u2581w", -29},
	{"or", -30}, {"\u2581wor", -31}, {"ld", -32}, {"\u2581world", -33}, {"an", -34},
	{"\u2581an", -35}, {"\u2581and", -36}, {"\u2581\u65e5\u672c", -37}, {"\u2581\u2581", -38},
	{"\u2581\u00e9", -39}, {"th", -40},
};
#define FIXTURE_SPM_N_PIECES ((int) (sizeof(fixture_spm_pieces) / sizeof(fixture_spm_pieces[0])))

/*
 * The GGUF metadata of the SentencePiece tokenizer (NULL when out of memory); extra control
 * tokens get ids after the pieces.
 */
static inline gguf_writer *
fixture_spm_writer(bool add_space_prefix, const char *const *controls, int n_controls)
{
	int			n = 259 + FIXTURE_SPM_N_PIECES + n_controls;
	char	  **tokens = calloc(n, sizeof(char *));
	int32_t    *types = calloc(n, sizeof(int32_t));
	float	   *scores = calloc(n, sizeof(float));
	gguf_writer *w = gguf_writer_new();
	gguf_writer *done_w = NULL;
	int			k = 0;

	if (!tokens || !types || !scores || !w)
		goto done;
	tokens[k] = strdup("<unk>");
	types[k++] = FIXTURE_TYPE_UNKNOWN;
	tokens[k] = strdup("<s>");
	types[k++] = FIXTURE_TYPE_CONTROL;
	tokens[k] = strdup("</s>");
	types[k++] = FIXTURE_TYPE_CONTROL;
	for (int b = 0; b < 256; b++, k++)
	{
		tokens[k] = calloc(8, 1);
		if (tokens[k])
			snprintf(tokens[k], 8, "<0x%02X>", b);
		types[k] = FIXTURE_TYPE_BYTE;
	}
	for (int i = 0; i < FIXTURE_SPM_N_PIECES; i++, k++)
	{
		tokens[k] = strdup(fixture_spm_pieces[i].piece);
		scores[k] = fixture_spm_pieces[i].score;
		types[k] = FIXTURE_TYPE_NORMAL;
	}
	for (int i = 0; i < n_controls; i++, k++)
	{
		tokens[k] = strdup(controls[i]);
		types[k] = FIXTURE_TYPE_CONTROL;
	}
	for (int i = 0; i < n; i++)
		if (!tokens[i])
			goto done;

	gguf_writer_add_str(w, "general.architecture", "llama");
	gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
	gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *) tokens, n);
	gguf_writer_add_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, n);
	gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, n);
	gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
	gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
	gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
	gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", true);
	gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", add_space_prefix);
	done_w = w;
	w = NULL;
done:
	if (w)
		gguf_writer_free(w);
	if (tokens)
		for (int i = 0; i < n; i++)
			free(tokens[i]);
	free(tokens);
	free(types);
	free(scores);
	return done_w;
}

/* The SentencePiece tokenizer of fixture_spm_writer, loaded. */
static inline cai_tokenizer *
fixture_spm(bool add_space_prefix, const char *const *controls, int n_controls)
{
	gguf_writer *w = fixture_spm_writer(add_space_prefix, controls, n_controls);
	cai_status	st;

	return w ? fixture_load(w, &st, NULL) : NULL;
}

/* Concatenates the bytes of ids (special tokens as their text) into a malloc'd C string. */
static inline char *
fixture_detokenize(const cai_tokenizer *tok, const int32_t *ids, int n)
{
	size_t		cap = 64;
	size_t		len = 0;
	char	   *s = malloc(cap);

	for (int i = 0; s && i < n; i++)
	{
		int			k = cai_tokenizer_token_bytes(tok, ids[i], NULL, 0);

		if (k < 0)
			k = 0;
		if (len + k + 1 > cap)
		{
			char	   *t;

			while (len + k + 1 > cap)
				cap *= 2;
			t = realloc(s, cap);
			if (!t)
			{
				free(s);
				return NULL;
			}
			s = t;
		}
		cai_tokenizer_token_bytes(tok, ids[i], s + len, k);
		len += k;
	}
	if (s)
		s[len] = '\0';
	return s;
}

#endif							/* CAI_TOKENIZER_FIXTURES_H */
