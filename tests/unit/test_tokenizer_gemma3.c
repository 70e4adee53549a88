/*
 * test_tokenizer_gemma3.c — Gemma 3's SentencePiece tokenizer (262144 tokens, no space prefix)
 * against llama.cpp on a 5000-line corpus, and its chat template on the real vocabulary.
 *
 * The goldens (tests/unit/data/gemma3_tokenizer_goldens.txt, written once by
 * tests/bench/gemma_tokenizer_goldens.py) hold each line with a hash of llama.cpp's ids.  Every
 * line must match except those holding Gemma's two user-defined multimodal markers,
 * <start_of_image> and <end_of_image>: llama.cpp matches user-defined tokens in any text, this
 * engine keeps markup-like ones out of message content (tokenizer.c's looks_like_markup); for
 * those lines the test checks that the marker did not become its token instead.  The
 * tests need the Gemma file (scripts/fetch-model.sh gemma3-270m): without it they are skipped,
 * which is what happens where models/ holds only SmolLM2.  $CAI_TEST_GEMMA_MODEL names
 * another copy.
 */
#define _GNU_SOURCE			/* memmem */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"

#include "chat_template.h"
#include "gguf.h"
#include "tokenizer.h"
#include "util.h"

static const char *
find_readable(const char *env, const char *const *candidates, int n)
{
	const char *e = getenv(env);

	if (e && *e)
		return access(e, R_OK) == 0 ? e : NULL;
	for (int i = 0; i < n; i++)
		if (access(candidates[i], R_OK) == 0)
			return candidates[i];
	return NULL;
}

static const char *
gemma_model_path(void)
{
	static const char *const c[] = {
		"models/gemma-3-270m-q4_k_m.gguf", "../models/gemma-3-270m-q4_k_m.gguf",
		"../../models/gemma-3-270m-q4_k_m.gguf",
	};

	return find_readable("CAI_TEST_GEMMA_MODEL", c, 3);
}

static const char *
goldens_path(void)
{
	static const char *const c[] = {
		"tests/unit/data/gemma3_tokenizer_goldens.txt", "data/gemma3_tokenizer_goldens.txt",
		"unit/data/gemma3_tokenizer_goldens.txt",
	};

	return find_readable("CAI_TEST_GEMMA_GOLDENS", c, 3);
}

static cai_tokenizer *
load_gemma_tokenizer(void)
{
	const char *path = gemma_model_path();
	gguf_file  *file;
	cai_tokenizer *tok = NULL;
	cai_error	err;

	if (!path || gguf_open(path, &file, &err) != CAI_OK)
		return NULL;
	if (cai_tokenizer_load(file, &tok, &err) != CAI_OK)
		fprintf(stderr, "    loading the Gemma tokenizer failed: %s\n", err.message);
	gguf_close(file);
	return tok;
}

/* The generator's FNV-1a 64 over the ids as little-endian int32. */
static uint64_t
fnv1a64_ids(const int32_t *ids, int n)
{
	uint64_t	h = UINT64_C(0xcbf29ce484222325);

	for (int i = 0; i < n; i++)
	{
		uint32_t	v = (uint32_t) ids[i];

		for (int b = 0; b < 4; b++)
		{
			h ^= (v >> (8 * b)) & 0xff;
			h *= UINT64_C(0x100000001b3);
		}
	}
	return h;
}

/* Undoes the generator's escapes in place; the unescaped length. */
static size_t
unescape(char *s)
{
	char	   *w = s;

	for (const char *r = s; *r; r++)
	{
		if (*r != '\\')
		{
			*w++ = *r;
			continue;
		}
		r++;
		switch (*r)
		{
			case 'n':
				*w++ = '\n';
				break;
			case 'r':
				*w++ = '\r';
				break;
			case 't':
				*w++ = '\t';
				break;
			case 'x':
				{
					char		hex[3] = {r[1], r[2], 0};

					*w++ = (char) strtol(hex, NULL, 16);
					r += 2;
					break;
				}
			default:			/* a backslash */
				*w++ = *r;
				break;
		}
	}
	return (size_t) (w - s);
}

TEST(tokenizer_gemma3_matches_llama_cpp_corpus)
{
	const char *gpath = goldens_path();
	cai_tokenizer *tok;
	FILE	   *f;
	char	   *line = NULL;
	size_t		cap = 0;
	ssize_t		len;
	int			n_lines = 0,
				n_bad = 0,
				n_full = 0,
				n_protected = 0;
	cai_tokens	ids;
	cai_error	err;

	if (!gemma_model_path())
		SKIP("Gemma 3 model not found (scripts/fetch-model.sh gemma3-270m)");
	CHECK_MSG(gpath != NULL, "tests/unit/data/gemma3_tokenizer_goldens.txt not found");
	tok = load_gemma_tokenizer();
	CHECK(tok != NULL);
	if (!gpath || !tok)
	{
		cai_tokenizer_free(tok);
		return;
	}
	CHECK_EQ_INT(cai_tokenizer_n_vocab(tok), 262144);
	f = fopen(gpath, "r");
	CHECK(f != NULL);
	cai_tokens_init(&ids);
	while (f && (len = getline(&line, &cap, f)) > 0)
	{
		char	   *hash_s,
				   *count_s,
				   *text,
				   *full,
				   *save = NULL;
		uint64_t	want_hash;
		int			want_n;
		size_t		text_len;

		if (line[0] == '#')
			continue;
		if (line[len - 1] == '\n')
			line[--len] = '\0';
		hash_s = strtok_r(line, "\t", &save);
		count_s = strtok_r(NULL, "\t", &save);
		text = strtok_r(NULL, "\t", &save);
		full = strtok_r(NULL, "\t", &save);
		if (!hash_s || !count_s || !text)
		{
			CHECK_MSG(false, "malformed goldens record %d", n_lines + 1);
			break;
		}
		want_hash = strtoull(hash_s, NULL, 16);
		want_n = atoi(count_s);
		text_len = unescape(text);
		ids.n = 0;
		n_lines++;
		if (cai_tokenizer_encode(tok, text, text_len, false, &ids, &err) != CAI_OK)
		{
			CHECK_MSG(false, "line %d: encode failed: %s", n_lines, err.message);
			continue;
		}
		if (full)
		{
			/* the first records carry the ids themselves: compare them one by one */
			char	   *p = full;
			bool		same = true;

			for (int i = 0; i < want_n; i++)
			{
				long		v = strtol(p, &p, 10);

				same = same && i < ids.n && ids.ids[i] == v;
			}
			same = same && ids.n == want_n;
			CHECK_MSG(same, "line %d (\"%.60s\"): ids differ from llama.cpp's %s", n_lines, text, full);
			n_full++;
		}
		if (memmem(text, text_len, "<start_of_image>", 16) ||
			memmem(text, text_len, "<end_of_image>", 14))
		{
			for (int i = 0; i < ids.n; i++)
				CHECK_MSG(!cai_tokenizer_is_special(tok, ids.ids[i]),
						  "line %d: content produced the special token %d", n_lines, ids.ids[i]);
			n_protected++;
			continue;
		}
		if (ids.n != want_n || fnv1a64_ids(ids.ids, ids.n) != want_hash)
		{
			if (n_bad < 10)
				CHECK_MSG(false, "line %d (\"%.60s\"): %d ids, llama.cpp %d (or other ids)",
						  n_lines, text, ids.n, want_n);
			n_bad++;
		}
	}
	CHECK_MSG(n_bad == 0, "%d of %d lines tokenize unlike llama.cpp", n_bad, n_lines);
	CHECK_MSG(n_lines >= 5000 && n_full >= 20, "only %d lines (%d with full ids) in the goldens",
			  n_lines, n_full);
	CHECK_MSG(n_protected * 20 < n_lines, "%d of %d lines hold a multimodal marker", n_protected,
			  n_lines);
	cai_tokens_free(&ids);
	free(line);
	if (f)
		fclose(f);
	cai_tokenizer_free(tok);
}

/*
 * The file has no template: the architecture picks Gemma's, whose turns end with the special
 * <end_of_turn> (106); the rendering equals llama.cpp's tokenization of the same text with
 * special tokens parsed, BOS (2) first.
 */
TEST(tokenizer_gemma3_chat_template)
{
	static const cai_chat_message chat[] = {
		{CAI_ROLE_SYSTEM, "Be brief.", NULL, 0, NULL},
		{CAI_ROLE_USER, "Hello", NULL, 0, NULL},
		{CAI_ROLE_ASSISTANT, "Hi!", NULL, 0, NULL},
	};
	static const int32_t want[] = {
		2, 105, 2364, 107, 3912, 8652, 236761, 108, 9259, 106, 107, 105, 4368, 107, 10979,
		236888, 106, 107, 105, 4368, 107
	};
	cai_tokenizer *tok;
	cai_chat_template tmpl;
	cai_tokens	out;
	cai_error	err;

	if (!gemma_model_path())
		SKIP("Gemma 3 model not found (scripts/fetch-model.sh gemma3-270m)");
	tok = load_gemma_tokenizer();
	CHECK(tok != NULL);
	if (!tok)
		return;
	CHECK_EQ_INT(cai_chat_template_detect(NULL, "gemma3", tok, &tmpl, &err), CAI_OK);
	CHECK_EQ_INT(tmpl.kind, CAI_TEMPLATE_GEMMA);
	CHECK_EQ_INT(tmpl.end_of_turn, 106);
	CHECK_EQ_INT(cai_tokenizer_bos(tok), 2);
	cai_tokens_init(&out);
	CHECK_EQ_INT(cai_chat_template_render(&tmpl, tok, chat, 3, true, &out, &err), CAI_OK);
	CHECK_EQ_INT(out.n, (int) (sizeof(want) / sizeof(want[0])));
	CHECK(out.n == (int) (sizeof(want) / sizeof(want[0])) &&
		  memcmp(out.ids, want, sizeof(want)) == 0);
	cai_tokens_free(&out);
	cai_tokenizer_free(tok);
}
