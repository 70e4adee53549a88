/*
 * tokenizer.c — byte-level BPE and SentencePiece-style tokenizers read from GGUF metadata.
 *
 * Encoding a text runs in three stages:
 *  1. special tokens: the text is cut at every special token it contains (longest match at the
 *     leftmost position).  Control tokens are recognised only when the caller asks
 *     (parse_special); plain user-defined tokens (text the vocabulary treats as one piece, like
 *     Gemma's runs of spaces) are recognised in any text, as llama.cpp and HF tokenizers do.
 *  2. byte-level BPE: the pre-tokenizer splits each stretch of text into words (hand-written
 *     scanners equivalent to the models' split regexes), each word's bytes become the GPT-2
 *     byte-level characters, and merges apply lowest rank first (ties: leftmost first), using a
 *     hash map over (left id, right id) built at load and a lazy-deletion binary heap.
 *     SentencePiece: spaces become U+2581, an optional space prefix goes in front, adjacent
 *     pieces merge highest score first into vocabulary pieces, and what no piece covers falls
 *     back to <0xNN> byte tokens.
 *  3. ids are appended to the caller's vector.
 *
 * A merge never yields a special token, so plain text can never produce a control token.
 * Invalid UTF-8 is kept byte for byte (each invalid byte is a code point of class "other" for
 * the pre-tokenizer), so decode(encode(s)) == s for any bytes with byte-level BPE.
 * The tokenizer is read-only after load and may be shared by threads: encoding keeps its
 * scratch memory per call.
 */
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "unicode.h"

/* tokenizer.ggml.token_type values (llama.cpp's llama_token_type). */
#define TOKEN_TYPE_NORMAL 1
#define TOKEN_TYPE_UNKNOWN 2
#define TOKEN_TYPE_CONTROL 3
#define TOKEN_TYPE_USER_DEFINED 4
#define TOKEN_TYPE_UNUSED 5
#define TOKEN_TYPE_BYTE 6

/* Per-token flags computed at load. */
#define TOKEN_SPECIAL 0x01		/* control-like: recognised in text only with parse_special */
#define TOKEN_ALWAYS 0x02		/* plain user-defined piece: recognised in any text */
#define TOKEN_MERGEABLE 0x04	/* may be the result of a merge */

/* Longest accepted token text; real vocabularies stay far below. */
#define MAX_TOKEN_TEXT 4096

/* "▁" (U+2581), SentencePiece's visible space. */
#define SPM_SPACE "\xE2\x96\x81"
#define SPM_SPACE_LEN 3

typedef enum tokenizer_kind
{
	TOKENIZER_BPE,				/* byte-level BPE ("gpt2") */
	TOKENIZER_SPM				/* SentencePiece-style ("llama") */
} tokenizer_kind;

/* The byte-level BPE pre-tokenizers (the split regex each model was trained with). */
typedef enum pretokenizer
{
	PRE_GPT2,					/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
	PRE_DIGITS_GPT2,			/* each \p{N} alone first, then the GPT-2 split (SmolLM, StarCoder) */
	PRE_LLAMA3,					/* (?i:'s|..)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
								 * \s*[\r\n]+|\s+(?!\S)|\s+ */
	PRE_QWEN2					/* the Llama 3 split with single digits: \p{N} */
} pretokenizer;

/* One merge rule of the BPE: (left, right) -> result, applied in rank order. */
typedef struct merge_slot
{
	uint64_t	pair;			/* (left id << 32) | right id */
	int32_t		rank;			/* -1: empty slot */
	int32_t		result;
} merge_slot;

struct cai_tokenizer
{
	tokenizer_kind kind;
	pretokenizer pre;
	int			n_vocab;

	/* vocabulary text (as stored in the GGUF), NUL-terminated strings in one arena */
	char	   *text;
	uint32_t   *text_off;
	uint32_t   *text_len;

	/* what each token decodes to (byte-level / "▁" / <0xNN> undone), in one arena */
	char	   *bytes;
	uint32_t   *bytes_off;
	uint32_t   *bytes_len;
	int			max_token_bytes;

	float	   *scores;			/* SentencePiece merge priority (0 when absent) */
	uint8_t    *type;			/* TOKEN_TYPE_* */
	uint8_t    *flags;			/* TOKEN_* */

	/* text -> id: open addressing, slot holds id or -1; capacity a power of two */
	int32_t    *vocab_index;
	size_t		vocab_mask;

	/* BPE merges: open addressing over merge_slot; capacity a power of two */
	merge_slot *merges;
	size_t		merges_mask;

	/* BPE: the token of each byte's byte-level character; SPM: the <0xNN> token; -1 if none */
	int32_t		byte_token[256];

	/* BPE: each byte's byte-level character as UTF-8 (at most U+0143: two bytes) */
	char		byte_char[256][2];
	uint8_t		byte_char_len[256];

	/* special token matching: first bytes that can start one, and the distinct lengths */
	bool		special_first[256];
	int		   *special_lengths;	/* descending */
	int			n_special_lengths;

	int32_t		bos;
	int32_t		eos;
	int32_t		unk;			/* <unk>, for what no token covers; -1: drop it */
	bool		add_bos;
	bool		add_space_prefix;	/* SentencePiece: put a space in front of the text */
	bool		ignore_merges;	/* Llama 3: a word that is a token is taken whole */
};

/* ---------------------------------------------------------------------------------------------
 * GPT-2's byte <-> character mapping
 * ------------------------------------------------------------------------------------------- */

/*
 * GPT-2 maps each byte to a printable code point: the printable Latin-1 bytes ('!'..'~',
 * '¡'..'¬', '®'..'ÿ') to themselves, the other 68 in byte order to U+0100, U+0101, ...
 */
static uint32_t
gpt2_byte_to_cpt(int byte)
{
	int			n = 0;

	if ((byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) ||
		(byte >= 0xAE && byte <= 0xFF))
		return (uint32_t) byte;
	for (int b = 0; b < byte; b++)
		if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)))
			n++;
	return 256 + (uint32_t) n;
}

/* The inverse: the byte a byte-level code point stands for, or -1. */
static int
gpt2_cpt_to_byte(uint32_t cpt)
{
	if ((cpt >= 0x21 && cpt <= 0x7E) || (cpt >= 0xA1 && cpt <= 0xAC) ||
		(cpt >= 0xAE && cpt <= 0xFF))
		return (int) cpt;
	if (cpt >= 256 && cpt < 256 + 68)
	{
		int			n = (int) (cpt - 256);

		for (int b = 0; b < 256; b++)
			if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)))
				if (n-- == 0)
					return b;
	}
	return -1;
}

/* ---------------------------------------------------------------------------------------------
 * Hash maps
 * ------------------------------------------------------------------------------------------- */

static size_t
pow2_at_least(size_t n)
{
	size_t		cap = 16;

	while (cap < n)
		cap <<= 1;
	return cap;
}

static uint64_t
hash_pair(uint64_t pair)
{
	/* a 64-bit finalizer (splitmix64): adjacent ids spread over the table */
	pair ^= pair >> 30;
	pair *= UINT64_C(0xbf58476d1ce4e5b9);
	pair ^= pair >> 27;
	pair *= UINT64_C(0x94d049bb133111eb);
	pair ^= pair >> 31;
	return pair;
}

/* The id whose vocabulary text is exactly s[0..len), or -1. */
static int32_t
vocab_lookup(const cai_tokenizer *tok, const char *s, size_t len)
{
	size_t		slot = (size_t) XXH3_64bits(s, len) & tok->vocab_mask;

	for (;;)
	{
		int32_t		id = tok->vocab_index[slot];

		if (id < 0)
			return -1;
		if (tok->text_len[id] == len && memcmp(tok->text + tok->text_off[id], s, len) == 0)
			return id;
		slot = (slot + 1) & tok->vocab_mask;
	}
}

/* The merge rule for (left, right), or NULL. */
static const merge_slot *
merge_lookup(const cai_tokenizer *tok, int32_t left, int32_t right)
{
	uint64_t	pair = ((uint64_t) (uint32_t) left << 32) | (uint32_t) right;
	size_t		slot = (size_t) hash_pair(pair) & tok->merges_mask;

	for (;;)
	{
		const merge_slot *m = &tok->merges[slot];

		if (m->rank < 0)
			return NULL;
		if (m->pair == pair)
			return m;
		slot = (slot + 1) & tok->merges_mask;
	}
}

/* ---------------------------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------------------------- */

void
cai_tokenizer_free(cai_tokenizer *tok)
{
	if (!tok)
		return;
	free(tok->text);
	free(tok->text_off);
	free(tok->text_len);
	free(tok->bytes);
	free(tok->bytes_off);
	free(tok->bytes_len);
	free(tok->scores);
	free(tok->type);
	free(tok->flags);
	free(tok->vocab_index);
	free(tok->merges);
	free(tok->special_lengths);
	free(tok);
}

/* Reads a token id key; -1 when absent or out of range. */
static int32_t
read_token_id(const gguf_file *file, const char *key, int n_vocab)
{
	uint64_t	v;

	if (gguf_get_u64(file, key, &v) && v < (uint64_t) n_vocab)
		return (int32_t) v;
	return -1;
}

/*
 * The tokenizer.ggml.pre names we implement (llama.cpp's names), by the split regex each uses.
 * "default" (no name written) is GPT-2's split, as HF's GPT-2 tokenizer has it.
 */
static const struct
{
	const char *name;
	pretokenizer pre;
	bool		ignore_merges;
}			pretokenizer_names[] = {
	{"gpt-2", PRE_GPT2, false}, {"gpt2", PRE_GPT2, false}, {"phi-2", PRE_GPT2, false},
	{"default", PRE_GPT2, false}, {"mpt", PRE_GPT2, false}, {"olmo", PRE_GPT2, false},
	{"jais", PRE_GPT2, false},
	{"smollm", PRE_DIGITS_GPT2, false}, {"starcoder", PRE_DIGITS_GPT2, false},
	{"refact", PRE_DIGITS_GPT2, false}, {"command-r", PRE_DIGITS_GPT2, false},
	{"codeshell", PRE_DIGITS_GPT2, false}, {"exaone", PRE_DIGITS_GPT2, false},
	{"minerva", PRE_DIGITS_GPT2, false},
	{"llama-bpe", PRE_LLAMA3, true}, {"llama3", PRE_LLAMA3, true}, {"llama-v3", PRE_LLAMA3, true},
	{"dbrx", PRE_LLAMA3, true}, {"smaug-bpe", PRE_LLAMA3, true}, {"falcon3", PRE_LLAMA3, true},
	{"qwen2", PRE_QWEN2, false}, {"stablelm2", PRE_QWEN2, false},
	{"deepseek-r1-qwen", PRE_QWEN2, false},
};

/* Maps tokenizer.ggml.pre to a pre-tokenizer; false for one we do not implement. */
static bool
pretokenizer_from_name(const char *name, pretokenizer *pre, bool *ignore_merges)
{
	for (size_t i = 0; i < sizeof(pretokenizer_names) / sizeof(pretokenizer_names[0]); i++)
		if (strcmp(name, pretokenizer_names[i].name) == 0)
		{
			*pre = pretokenizer_names[i].pre;
			*ignore_merges = pretokenizer_names[i].ignore_merges;
			return true;
		}
	return false;
}

/* Reads tokens, scores and types into the tokenizer's arrays. */
static cai_status
load_vocab(cai_tokenizer *tok, const gguf_file *file, cai_error *err)
{
	const gguf_kv *tokens = gguf_find_kv(file, "tokenizer.ggml.tokens");
	const gguf_kv *scores = gguf_find_kv(file, "tokenizer.ggml.scores");
	const gguf_kv *types = gguf_find_kv(file, "tokenizer.ggml.token_type");
	size_t		total = 0;
	int			n;

	if (!tokens || tokens->type != GGUF_TYPE_ARRAY || tokens->v.arr.elem_type != GGUF_TYPE_STRING)
		return cai_fail(err, CAI_ERR_FORMAT, "tokenizer.ggml.tokens is missing or not a string array");
	if (tokens->v.arr.n == 0 || tokens->v.arr.n > (1u << 24))
		return cai_fail(err, CAI_ERR_FORMAT, "vocabulary size %llu is out of range",
						(unsigned long long) tokens->v.arr.n);
	n = (int) tokens->v.arr.n;
	tok->n_vocab = n;
	if (scores && (scores->type != GGUF_TYPE_ARRAY || scores->v.arr.n != (uint64_t) n))
		return cai_fail(err, CAI_ERR_FORMAT, "tokenizer.ggml.scores does not have %d entries", n);
	if (types && (types->type != GGUF_TYPE_ARRAY || types->v.arr.n != (uint64_t) n))
		return cai_fail(err, CAI_ERR_FORMAT, "tokenizer.ggml.token_type does not have %d entries", n);

	for (int i = 0; i < n; i++)
	{
		gguf_str	s;

		if (!gguf_arr_get_str(tokens, i, &s))
			return cai_fail(err, CAI_ERR_FORMAT, "token %d is not a string", i);
		if (s.len > MAX_TOKEN_TEXT)
			return cai_fail(err, CAI_ERR_FORMAT, "token %d is %llu bytes long", i,
							(unsigned long long) s.len);
		total += s.len + 1;
	}
	if (total > UINT32_MAX / 2)
		return cai_fail(err, CAI_ERR_FORMAT, "vocabulary text is too large");

	tok->text = malloc(total);
	tok->text_off = malloc(sizeof(uint32_t) * n);
	tok->text_len = malloc(sizeof(uint32_t) * n);
	tok->scores = calloc(n, sizeof(float));
	tok->type = malloc(n);
	tok->flags = calloc(n, 1);
	if (!tok->text || !tok->text_off || !tok->text_len || !tok->scores || !tok->type || !tok->flags)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory loading a vocabulary of %d tokens", n);

	total = 0;
	for (int i = 0; i < n; i++)
	{
		gguf_str	s;
		int64_t		t = TOKEN_TYPE_NORMAL;

		gguf_arr_get_str(tokens, i, &s);
		memcpy(tok->text + total, s.ptr, s.len);
		tok->text[total + s.len] = '\0';
		tok->text_off[i] = (uint32_t) total;
		tok->text_len[i] = (uint32_t) s.len;
		total += s.len + 1;

		if (scores && !gguf_arr_get_f32(scores, i, &tok->scores[i]))
			return cai_fail(err, CAI_ERR_FORMAT, "tokenizer.ggml.scores[%d] is not a number", i);
		if (types && !gguf_arr_get_i64(types, i, &t))
			return cai_fail(err, CAI_ERR_FORMAT, "tokenizer.ggml.token_type[%d] is not an integer", i);
		if (t < TOKEN_TYPE_NORMAL || t > TOKEN_TYPE_BYTE)
			t = TOKEN_TYPE_NORMAL;	/* undefined (0) or unknown types: treat as ordinary */
		tok->type[i] = (uint8_t) t;
	}
	return CAI_OK;
}

/*
 * True for a plain HTML tag, "<" optionally "/", a letter, then letters and digits, ">" ("<b>",
 * "</td>", "<h1>").  Gemma's vocabulary has such tags as user-defined pieces so that HTML text
 * tokenizes into them; they are text, not markup of the model's own.
 */
static bool
is_html_tag(const char *s, uint32_t len)
{
	uint32_t	i = s[1] == '/' ? 2 : 1;

	/*
	 * except "</s>", SentencePiece's end-of-sequence text: llama.cpp makes a token spelled so
	 * an end-of-generation control token whatever its type, and so does this engine
	 */
	if (len == 4 && memcmp(s, "</s>", 4) == 0)
		return false;

	if (i >= len - 1 || !((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
		return false;
	for (; i < len - 1; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
			  (s[i] >= '0' && s[i] <= '9')))
			return false;
	return true;
}

/*
 * True for a user-defined token that reads as markup ("<start_of_turn>", "<tool_call>",
 * "<start_of_image>"): such tokens act as control tokens, so that a user cannot type them into
 * a prompt.  (llama.cpp matches every user-defined token in any text; this engine departs from
 * it for these.)  HTML tags are ordinary text pieces.
 */
static bool
looks_like_markup(const char *s, uint32_t len)
{
	return len > 2 && s[0] == '<' && s[len - 1] == '>' && !is_html_tag(s, len);
}

/* Computes token flags and builds the text -> id index. */
static cai_status
index_vocab(cai_tokenizer *tok, cai_error *err)
{
	size_t		cap = pow2_at_least((size_t) tok->n_vocab * 2);

	tok->vocab_index = malloc(sizeof(int32_t) * cap);
	if (!tok->vocab_index)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory indexing the vocabulary");
	memset(tok->vocab_index, 0xFF, sizeof(int32_t) * cap);
	tok->vocab_mask = cap - 1;

	for (int i = 0; i < tok->n_vocab; i++)
	{
		const char *s = tok->text + tok->text_off[i];
		uint32_t	len = tok->text_len[i];
		size_t		slot;

		switch (tok->type[i])
		{
			case TOKEN_TYPE_CONTROL:
			case TOKEN_TYPE_UNKNOWN:
				tok->flags[i] = TOKEN_SPECIAL;
				break;
			case TOKEN_TYPE_USER_DEFINED:
				tok->flags[i] = looks_like_markup(s, len) ? TOKEN_SPECIAL : (TOKEN_ALWAYS | TOKEN_MERGEABLE);
				break;
			case TOKEN_TYPE_BYTE:
				tok->flags[i] = 0;	/* reached only by byte fallback */
				break;
			default:
				tok->flags[i] = TOKEN_MERGEABLE;
				break;
		}
		if (len == 0)
			continue;
		/* first of duplicate texts wins */
		slot = (size_t) XXH3_64bits(s, len) & tok->vocab_mask;
		for (;;)
		{
			int32_t		id = tok->vocab_index[slot];

			if (id < 0)
			{
				tok->vocab_index[slot] = i;
				break;
			}
			if (tok->text_len[id] == len && memcmp(tok->text + tok->text_off[id], s, len) == 0)
				break;
			slot = (slot + 1) & tok->vocab_mask;
		}
	}
	return CAI_OK;
}

/* BPE: reads tokenizer.ggml.merges into the pair -> (rank, result) map. */
static cai_status
load_merges(cai_tokenizer *tok, const gguf_file *file, cai_error *err)
{
	const gguf_kv *merges = gguf_find_kv(file, "tokenizer.ggml.merges");
	char		buf[2 * MAX_TOKEN_TEXT + 2];
	size_t		cap;
	uint64_t	n;

	if (!merges)
		return cai_fail(err, CAI_ERR_FORMAT, "tokenizer.ggml.merges is missing");
	if (merges->type != GGUF_TYPE_ARRAY || merges->v.arr.elem_type != GGUF_TYPE_STRING)
		return cai_fail(err, CAI_ERR_FORMAT, "tokenizer.ggml.merges is not a string array");
	n = merges->v.arr.n;
	if (n > (1u << 24))
		return cai_fail(err, CAI_ERR_FORMAT, "%llu merges is too many", (unsigned long long) n);

	cap = pow2_at_least((size_t) n * 2 + 2);
	tok->merges = malloc(sizeof(merge_slot) * cap);
	if (!tok->merges)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory loading %llu merges",
						(unsigned long long) n);
	for (size_t i = 0; i < cap; i++)
		tok->merges[i].rank = -1;
	tok->merges_mask = cap - 1;

	for (uint64_t r = 0; r < n; r++)
	{
		gguf_str	s;
		const char *space;
		size_t		left_len;
		int32_t		left;
		int32_t		right;
		int32_t		result;
		uint64_t	pair;
		size_t		slot;

		if (!gguf_arr_get_str(merges, r, &s))
			return cai_fail(err, CAI_ERR_FORMAT, "merge %llu is not a string", (unsigned long long) r);
		/* "left right"; the separator is the first space after the first byte */
		space = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
		if (!space || s.len > sizeof(buf) - 1)
			return cai_fail(err, CAI_ERR_FORMAT, "merge %llu is not of the form \"left right\"",
							(unsigned long long) r);
		left_len = (size_t) (space - s.ptr);
		left = vocab_lookup(tok, s.ptr, left_len);
		right = vocab_lookup(tok, space + 1, s.len - left_len - 1);
		memcpy(buf, s.ptr, left_len);
		memcpy(buf + left_len, space + 1, s.len - left_len - 1);
		result = vocab_lookup(tok, buf, s.len - 1);
		/* a rule whose pieces are not tokens can never fire; one yielding a special token must not */
		if (left < 0 || right < 0 || result < 0 || !(tok->flags[result] & TOKEN_MERGEABLE))
			continue;

		pair = ((uint64_t) (uint32_t) left << 32) | (uint32_t) right;
		slot = (size_t) hash_pair(pair) & tok->merges_mask;
		while (tok->merges[slot].rank >= 0 && tok->merges[slot].pair != pair)
			slot = (slot + 1) & tok->merges_mask;
		if (tok->merges[slot].rank >= 0)
			continue;			/* a duplicate rule: the first (lower rank) stands */
		tok->merges[slot].pair = pair;
		tok->merges[slot].rank = (int32_t) r;
		tok->merges[slot].result = result;
	}
	return CAI_OK;
}

/* Parses "<0xNN>" into its byte value; -1 if s is not such a token. */
static int
parse_byte_token(const char *s, uint32_t len)
{
	int			v = 0;

	if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
		return -1;
	for (int i = 3; i < 5; i++)
	{
		char		c = s[i];

		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= c - '0';
		else if (c >= 'A' && c <= 'F')
			v |= c - 'A' + 10;
		else if (c >= 'a' && c <= 'f')
			v |= c - 'a' + 10;
		else
			return -1;
	}
	return v;
}

/* Finds each byte's token: its byte-level character (BPE) or its <0xNN> token (SPM). */
static void
find_byte_tokens(cai_tokenizer *tok)
{
	for (int b = 0; b < 256; b++)
		tok->byte_token[b] = -1;
	if (tok->kind == TOKENIZER_BPE)
	{
		for (int b = 0; b < 256; b++)
		{
			char		utf8[4];
			int			n = cai_utf8_encode(gpt2_byte_to_cpt(b), utf8);

			memcpy(tok->byte_char[b], utf8, n);
			tok->byte_char_len[b] = (uint8_t) n;
			tok->byte_token[b] = vocab_lookup(tok, utf8, n);
			/*
			 * A vocabulary that makes a byte's character a control token must not let plain
			 * text produce it: the byte is then one the vocabulary lacks (see tok->unk).
			 */
			if (tok->byte_token[b] >= 0 && (tok->flags[tok->byte_token[b]] & TOKEN_SPECIAL))
				tok->byte_token[b] = -1;
		}
	}
	else
	{
		for (int i = 0; i < tok->n_vocab; i++)
		{
			int			b;

			if (tok->type[i] != TOKEN_TYPE_BYTE)
				continue;
			b = parse_byte_token(tok->text + tok->text_off[i], tok->text_len[i]);
			if (b >= 0 && tok->byte_token[b] < 0)
				tok->byte_token[b] = i;
		}
	}
}

/*
 * Writes the bytes token i stands for into out (room for 3x its text).  Byte-level BPE text is
 * mapped back to bytes; SentencePiece "▁" becomes a space and <0xNN> its byte; control and
 * user-defined tokens are their text as is.
 */
static uint32_t
decode_token_text(const cai_tokenizer *tok, int i, char *out)
{
	const unsigned char *s = (const unsigned char *) tok->text + tok->text_off[i];
	uint32_t	len = tok->text_len[i];
	uint32_t	n = 0;
	uint8_t		type = tok->type[i];

	if (type == TOKEN_TYPE_CONTROL || type == TOKEN_TYPE_UNKNOWN ||
		(type == TOKEN_TYPE_USER_DEFINED && tok->kind == TOKENIZER_BPE))
	{
		memcpy(out, s, len);
		return len;
	}
	if (tok->kind == TOKENIZER_SPM && type == TOKEN_TYPE_BYTE)
	{
		int			b = parse_byte_token((const char *) s, len);

		if (b >= 0)
		{
			out[0] = (char) b;
			return 1;
		}
		memcpy(out, s, len);
		return len;
	}
	for (uint32_t p = 0; p < len;)
	{
		uint32_t	cpt;
		int			k = cai_utf8_decode(s + p, len - p, &cpt);

		if (k == 0)
		{
			out[n++] = (char) s[p++];	/* malformed vocabulary text: keep the byte */
			continue;
		}
		if (tok->kind == TOKENIZER_BPE)
		{
			int			b = gpt2_cpt_to_byte(cpt);

			if (b >= 0)
				out[n++] = (char) b;
			else
			{
				memcpy(out + n, s + p, k);
				n += k;
			}
		}
		else if (cpt == 0x2581)
			out[n++] = ' ';
		else
		{
			memcpy(out + n, s + p, k);
			n += k;
		}
		p += k;
	}
	return n;
}

/* Precomputes every token's decoded bytes. */
static cai_status
build_token_bytes(cai_tokenizer *tok, cai_error *err)
{
	size_t		total = 0;
	char		tmp[MAX_TOKEN_TEXT];

	for (int i = 0; i < tok->n_vocab; i++)
		total += tok->text_len[i];	/* decoding never lengthens a token */
	tok->bytes = malloc(total + 1);
	tok->bytes_off = malloc(sizeof(uint32_t) * tok->n_vocab);
	tok->bytes_len = malloc(sizeof(uint32_t) * tok->n_vocab);
	if (!tok->bytes || !tok->bytes_off || !tok->bytes_len)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory decoding the vocabulary");

	total = 0;
	tok->max_token_bytes = 0;
	for (int i = 0; i < tok->n_vocab; i++)
	{
		uint32_t	n = decode_token_text(tok, i, tmp);

		memcpy(tok->bytes + total, tmp, n);
		tok->bytes_off[i] = (uint32_t) total;
		tok->bytes_len[i] = n;
		total += n;
		if ((int) n > tok->max_token_bytes)
			tok->max_token_bytes = (int) n;
	}
	return CAI_OK;
}

/* Collects what special-token matching needs: possible first bytes and distinct lengths. */
static cai_status
index_special_tokens(cai_tokenizer *tok, cai_error *err)
{
	bool	   *seen_len = calloc(MAX_TOKEN_TEXT + 1, sizeof(bool));
	int			n = 0;

	if (!seen_len)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory indexing special tokens");
	memset(tok->special_first, 0, sizeof(tok->special_first));
	for (int i = 0; i < tok->n_vocab; i++)
	{
		uint32_t	len = tok->text_len[i];

		if (!(tok->flags[i] & (TOKEN_SPECIAL | TOKEN_ALWAYS)) || len == 0)
			continue;
		if (vocab_lookup(tok, tok->text + tok->text_off[i], len) != i)
			continue;			/* shadowed by an earlier token with the same text */
		tok->special_first[(unsigned char) tok->text[tok->text_off[i]]] = true;
		if (!seen_len[len])
			n++;
		seen_len[len] = true;
	}
	tok->special_lengths = malloc(sizeof(int) * (n + 1));
	if (!tok->special_lengths)
	{
		free(seen_len);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory indexing special tokens");
	}
	tok->n_special_lengths = 0;
	for (int len = MAX_TOKEN_TEXT; len >= 1; len--)
		if (seen_len[len])
			tok->special_lengths[tok->n_special_lengths++] = len;
	free(seen_len);
	return CAI_OK;
}

cai_status
cai_tokenizer_load(const gguf_file *file, cai_tokenizer **out, cai_error *err)
{
	cai_tokenizer *tok;
	char		model[64];
	char		pre[64];
	cai_status	st;

	*out = NULL;
	if (!gguf_get_cstr(file, "tokenizer.ggml.model", model, sizeof(model)))
		return cai_fail(err, CAI_ERR_FORMAT, "tokenizer.ggml.model is missing");

	tok = calloc(1, sizeof(*tok));
	if (!tok)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory allocating a tokenizer");

	if (strcmp(model, "gpt2") == 0)
	{
		tok->kind = TOKENIZER_BPE;
		/* llama.cpp's fallback when the converter wrote no pre-tokenizer name */
		if (!gguf_get_cstr(file, "tokenizer.ggml.pre", pre, sizeof(pre)))
			strcpy(pre, "default");
		if (!pretokenizer_from_name(pre, &tok->pre, &tok->ignore_merges))
		{
			cai_tokenizer_free(tok);
			return cai_fail(err, CAI_ERR_UNSUPPORTED, "unsupported pre-tokenizer \"%s\"", pre);
		}
	}
	else if (strcmp(model, "llama") == 0)
		tok->kind = TOKENIZER_SPM;
	else
	{
		cai_tokenizer_free(tok);
		return cai_fail(err, CAI_ERR_UNSUPPORTED, "unsupported tokenizer model \"%s\"", model);
	}

	if ((st = load_vocab(tok, file, err)) != CAI_OK ||
		(st = index_vocab(tok, err)) != CAI_OK ||
		(tok->kind == TOKENIZER_BPE && (st = load_merges(tok, file, err)) != CAI_OK) ||
		(st = build_token_bytes(tok, err)) != CAI_OK ||
		(st = index_special_tokens(tok, err)) != CAI_OK)
	{
		cai_tokenizer_free(tok);
		return st;
	}
	find_byte_tokens(tok);

	tok->bos = read_token_id(file, "tokenizer.ggml.bos_token_id", tok->n_vocab);
	tok->eos = read_token_id(file, "tokenizer.ggml.eos_token_id", tok->n_vocab);
	tok->unk = read_token_id(file, "tokenizer.ggml.unknown_token_id", tok->n_vocab);
	/*
	 * Only a real <unk> stands in for what no token covers.  SmolLM2 names <|endoftext|> (a
	 * control token) as its unknown token: bytes its vocabulary lacks are dropped instead, as
	 * llama.cpp does, so that text can never turn into a control token.
	 */
	if (tok->unk >= 0 && tok->type[tok->unk] != TOKEN_TYPE_UNKNOWN)
		tok->unk = -1;
	/* defaults as llama.cpp has them: SentencePiece models want BOS and a space prefix */
	if (!gguf_get_bool(file, "tokenizer.ggml.add_bos_token", &tok->add_bos))
		tok->add_bos = tok->kind == TOKENIZER_SPM || tok->pre == PRE_LLAMA3;
	if (!gguf_get_bool(file, "tokenizer.ggml.add_space_prefix", &tok->add_space_prefix))
		tok->add_space_prefix = tok->kind == TOKENIZER_SPM;
	if (tok->kind == TOKENIZER_BPE)
		tok->add_space_prefix = false;
	if (tok->bos < 0)
		tok->add_bos = false;

	*out = tok;
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Accessors
 * ------------------------------------------------------------------------------------------- */

int
cai_tokenizer_n_vocab(const cai_tokenizer *tok)
{
	return tok->n_vocab;
}

int32_t
cai_tokenizer_bos(const cai_tokenizer *tok)
{
	return tok->bos;
}

int32_t
cai_tokenizer_eos(const cai_tokenizer *tok)
{
	return tok->eos;
}

bool
cai_tokenizer_add_bos(const cai_tokenizer *tok)
{
	return tok->add_bos;
}

int32_t
cai_tokenizer_find(const cai_tokenizer *tok, const char *text)
{
	if (!text || !*text)
		return -1;
	return vocab_lookup(tok, text, strlen(text));
}

bool
cai_tokenizer_is_special(const cai_tokenizer *tok, int32_t id)
{
	return id >= 0 && id < tok->n_vocab && (tok->flags[id] & TOKEN_SPECIAL);
}

int
cai_tokenizer_max_token_bytes(const cai_tokenizer *tok)
{
	return tok->max_token_bytes;
}

int
cai_tokenizer_token_bytes(const cai_tokenizer *tok, int32_t id, char *buf, int cap)
{
	uint32_t	n;

	if (id < 0 || id >= tok->n_vocab)
		return -1;
	n = tok->bytes_len[id];
	if (buf && cap > 0)
		memcpy(buf, tok->bytes + tok->bytes_off[id], (size_t) n < (size_t) cap ? n : (size_t) cap);
	return (int) n;
}

/* ---------------------------------------------------------------------------------------------
 * Encoding: per-call scratch memory
 * ------------------------------------------------------------------------------------------- */

/* A candidate merge in the heap: BPE orders by rank, SentencePiece by score (both leftmost first). */
typedef struct merge_candidate
{
	float		priority;		/* lower pops first: rank, or minus the score */
	int32_t		left;			/* symbol index */
	int32_t		right;
	int32_t		result;			/* the merged token */
	int32_t		size;			/* SentencePiece: bytes the merged piece spans */
} merge_candidate;

typedef struct encode_scratch
{
	/* code points of the text being pre-tokenized */
	uint32_t   *cpt;
	uint8_t    *cls;			/* cai_unicode_class, or CLASS_NONE past the end */
	uint32_t   *off;			/* byte offset of each code point, plus one past the end */
	size_t		cpt_cap;

	/* symbols of the word (BPE) or text (SPM) being merged */
	int32_t    *sym_id;			/* BPE: the symbol's token */
	int32_t    *sym_start;		/* SPM: byte span of the symbol */
	int32_t    *sym_len;
	int32_t    *sym_prev;
	int32_t    *sym_next;
	size_t		sym_cap;

	merge_candidate *heap;
	size_t		heap_n;
	size_t		heap_cap;

	char	   *buf;			/* byte-level word text / escaped SentencePiece text */
	size_t		buf_cap;
} encode_scratch;

#define CLASS_NONE 4

static void
scratch_free(encode_scratch *s)
{
	free(s->cpt);
	free(s->cls);
	free(s->off);
	free(s->sym_id);
	free(s->sym_start);
	free(s->sym_len);
	free(s->sym_prev);
	free(s->sym_next);
	free(s->heap);
	free(s->buf);
}

/* Grows *p to hold n elements of size elem; false on out of memory. */
static bool
grow_array(void **p, size_t *cap, size_t n, size_t elem)
{
	void	   *q;
	size_t		new_cap = *cap ? *cap : 64;
	size_t		bytes;

	if (n <= *cap)
		return true;
	while (new_cap < n)
		new_cap *= 2;
	if (!cai_mul_size(new_cap, elem, &bytes) || !(q = realloc(*p, bytes)))
		return false;
	*p = q;
	*cap = new_cap;
	return true;
}

static bool
scratch_reserve_symbols(encode_scratch *s, size_t n)
{
	size_t		cap;
	void	   *arrays[5] = {s->sym_id, s->sym_start, s->sym_len, s->sym_prev, s->sym_next};

	if (n <= s->sym_cap)
		return true;
	for (int i = 0; i < 5; i++)
	{
		cap = s->sym_cap;
		if (!grow_array(&arrays[i], &cap, n, sizeof(int32_t)))
		{
			/* keep what was reallocated so far owned by the scratch */
			s->sym_id = arrays[0];
			s->sym_start = arrays[1];
			s->sym_len = arrays[2];
			s->sym_prev = arrays[3];
			s->sym_next = arrays[4];
			return false;
		}
	}
	s->sym_id = arrays[0];
	s->sym_start = arrays[1];
	s->sym_len = arrays[2];
	s->sym_prev = arrays[3];
	s->sym_next = arrays[4];
	s->sym_cap = cap;
	return true;
}

static bool
scratch_reserve_cpts(encode_scratch *s, size_t n)
{
	size_t		cap1 = s->cpt_cap;
	size_t		cap2 = s->cpt_cap;
	size_t		cap3 = s->cpt_cap;
	bool		ok;

	if (n <= s->cpt_cap)
		return true;
	ok = grow_array((void **) &s->cpt, &cap1, n, sizeof(uint32_t)) &&
		grow_array((void **) &s->cls, &cap2, n, sizeof(uint8_t)) &&
		grow_array((void **) &s->off, &cap3, n, sizeof(uint32_t));
	if (ok)
		s->cpt_cap = cap1;
	return ok;
}

/* Orders candidates: lower priority first, then the leftmost. */
static inline bool
candidate_before(const merge_candidate *a, const merge_candidate *b)
{
	return a->priority < b->priority || (a->priority == b->priority && a->left < b->left);
}

static bool
heap_push(encode_scratch *s, merge_candidate c)
{
	size_t		i;

	if (!grow_array((void **) &s->heap, &s->heap_cap, s->heap_n + 1, sizeof(merge_candidate)))
		return false;
	i = s->heap_n++;
	while (i > 0)
	{
		size_t		parent = (i - 1) / 2;

		if (!candidate_before(&c, &s->heap[parent]))
			break;
		s->heap[i] = s->heap[parent];
		i = parent;
	}
	s->heap[i] = c;
	return true;
}

static merge_candidate
heap_pop(encode_scratch *s)
{
	merge_candidate top = s->heap[0];
	merge_candidate last = s->heap[--s->heap_n];
	size_t		i = 0;
	size_t		n = s->heap_n;

	for (;;)
	{
		size_t		child = 2 * i + 1;

		if (child >= n)
			break;
		if (child + 1 < n && candidate_before(&s->heap[child + 1], &s->heap[child]))
			child++;
		if (!candidate_before(&s->heap[child], &last))
			break;
		s->heap[i] = s->heap[child];
		i = child;
	}
	if (n > 0)
		s->heap[i] = last;
	return top;
}

/* ---------------------------------------------------------------------------------------------
 * Byte-level BPE
 * ------------------------------------------------------------------------------------------- */

/* Queues the merge of symbols left and right, if there is a rule for them. */
static bool
bpe_consider(const cai_tokenizer *tok, encode_scratch *s, int32_t left, int32_t right)
{
	const merge_slot *m;
	merge_candidate c;

	if (left < 0 || right < 0 || s->sym_id[left] < 0 || s->sym_id[right] < 0)
		return true;
	m = merge_lookup(tok, s->sym_id[left], s->sym_id[right]);
	if (!m)
		return true;
	c.priority = (float) m->rank;
	c.left = left;
	c.right = right;
	c.result = m->result;
	c.size = 0;
	return heap_push(s, c);
}

/*
 * Encodes one pre-tokenized word w[0..n) (raw bytes) with byte-level BPE.
 * Merge ranks go up to ~2^24, which a float holds exactly.
 */
static cai_status
bpe_word(const cai_tokenizer *tok, encode_scratch *s, const unsigned char *w, size_t n,
		 cai_tokens *out, cai_error *err)
{
	if (n == 0)
		return CAI_OK;

	if (tok->ignore_merges)
	{
		/* Llama 3: a word that is itself a token is taken whole */
		size_t		len = 0;
		int32_t		id;

		if (!grow_array((void **) &s->buf, &s->buf_cap, n * 2, 1))
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing");
		for (size_t i = 0; i < n; i++)
		{
			memcpy(s->buf + len, tok->byte_char[w[i]], tok->byte_char_len[w[i]]);
			len += tok->byte_char_len[w[i]];
		}
		id = vocab_lookup(tok, s->buf, len);
		if (id >= 0 && (tok->flags[id] & TOKEN_MERGEABLE))
			return cai_tokens_push(out, id) ? CAI_OK :
				cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing");
	}

	if (n == 1)
	{
		int32_t		id = tok->byte_token[w[0]] >= 0 ? tok->byte_token[w[0]] : tok->unk;

		if (id >= 0 && !cai_tokens_push(out, id))
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing");
		return CAI_OK;
	}

	if (n > INT32_MAX / 4 || !scratch_reserve_symbols(s, n))
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing");
	for (size_t i = 0; i < n; i++)
	{
		s->sym_id[i] = tok->byte_token[w[i]];
		s->sym_prev[i] = (int32_t) i - 1;
		s->sym_next[i] = i + 1 < n ? (int32_t) i + 1 : -1;
	}
	s->heap_n = 0;
	for (size_t i = 0; i + 1 < n; i++)
		if (!bpe_consider(tok, s, (int32_t) i, (int32_t) i + 1))
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing");

	while (s->heap_n > 0)
	{
		merge_candidate c = heap_pop(s);
		const merge_slot *m;
		int32_t		l = c.left;
		int32_t		r = c.right;

		/* stale: either side changed or is gone since this candidate was queued */
		if (s->sym_next[l] != r || s->sym_id[l] < 0 || s->sym_id[r] < 0)
			continue;
		m = merge_lookup(tok, s->sym_id[l], s->sym_id[r]);
		if (!m || m->result != c.result || (float) m->rank != c.priority)
			continue;

		s->sym_id[l] = c.result;
		s->sym_next[l] = s->sym_next[r];
		if (s->sym_next[r] >= 0)
			s->sym_prev[s->sym_next[r]] = l;
		s->sym_id[r] = -1;
		s->sym_next[r] = -2;	/* removed */
		if (!bpe_consider(tok, s, s->sym_prev[l], l) ||
			!bpe_consider(tok, s, l, s->sym_next[l]))
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing");
	}

	for (int32_t i = 0; i >= 0; i = s->sym_next[i])
	{
		int32_t		id = s->sym_id[i] >= 0 ? s->sym_id[i] : tok->unk;

		if (id >= 0 && !cai_tokens_push(out, id))
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing");
	}
	return CAI_OK;
}

/* Decodes text[0..len) into code points with their classes; invalid bytes become class OTHER. */
static bool
decode_cpts(encode_scratch *s, const unsigned char *text, size_t len, size_t *n_out)
{
	size_t		n = 0;

	if (!scratch_reserve_cpts(s, len + 1))
		return false;
	for (size_t p = 0; p < len;)
	{
		uint32_t	cpt;
		int			k = cai_utf8_decode(text + p, len - p, &cpt);

		if (k == 0)
		{
			s->cpt[n] = 0xFFFD;
			s->cls[n] = CAI_UNICODE_OTHER;
			k = 1;
		}
		else
		{
			s->cpt[n] = cpt;
			s->cls[n] = (uint8_t) cai_unicode_class_of(cpt);
		}
		s->off[n] = (uint32_t) p;
		p += k;
		n++;
	}
	s->off[n] = (uint32_t) len;
	*n_out = n;
	return true;
}

/*
 * The GPT-2 split over code points [a, b), calling emit for each word.  The scanner is the
 * regex  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+  written out:
 * at each position the first alternative that matches wins.
 */
typedef struct split_ctx
{
	const cai_tokenizer *tok;
	encode_scratch *s;
	const unsigned char *text;
	cai_tokens *out;
	cai_error  *err;
	cai_status	status;
	size_t		end;			/* one past the last code point of the current piece */
} split_ctx;

static inline int
class_at(const split_ctx *x, size_t i)
{
	return i < x->end ? x->s->cls[i] : CLASS_NONE;
}

static inline uint32_t
cpt_at(const split_ctx *x, size_t i)
{
	return i < x->end ? x->s->cpt[i] : 0xFFFFFFFF;
}

/* Emits code points [from, to) as a word. */
static void
emit_word(split_ctx *x, size_t from, size_t to)
{
	size_t		b0;
	size_t		b1;

	if (from >= to || x->status != CAI_OK)
		return;
	b0 = x->s->off[from];
	b1 = x->s->off[to];
	x->status = bpe_word(x->tok, x->s, x->text + b0, b1 - b0, x->out, x->err);
}

static inline uint32_t
ascii_lower(uint32_t c)
{
	return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

/*
 * Length of a contraction ('s 't 're 've 'm 'll 'd) at i, 0 if none; case-insensitive for
 * Llama 3 and Qwen2, whose regex says (?i:...).
 */
static size_t
contraction_at(const split_ctx *x, size_t i, bool any_case)
{
	uint32_t	c1;
	uint32_t	c2;

	if (cpt_at(x, i) != '\'' || i + 1 >= x->end)
		return 0;
	c1 = cpt_at(x, i + 1);
	c2 = cpt_at(x, i + 2);
	if (any_case)
	{
		c1 = ascii_lower(c1);
		c2 = ascii_lower(c2);
	}
	if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
		return 2;
	if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
		return 3;
	return 0;
}

/* Counts the white space run at i. */
static size_t
space_run(const split_ctx *x, size_t i)
{
	size_t		n = 0;

	while (class_at(x, i + n) == CAI_UNICODE_SPACE)
		n++;
	return n;
}

static void
split_gpt2(split_ctx *x, size_t a, size_t b)
{
	size_t		pos = a;

	x->end = b;
	while (pos < b && x->status == CAI_OK)
	{
		uint32_t	c = cpt_at(x, pos);
		int			k = class_at(x, pos);
		int			k2 = c == ' ' ? class_at(x, pos + 1) : k;
		size_t		start = pos;
		size_t		n;

		if ((n = contraction_at(x, pos, false)) > 0)
		{
			emit_word(x, pos, pos + n);
			pos += n;
			continue;
		}
		/* ' ?\p{L}+', ' ?\p{N}+' and ' ?[^\s\p{L}\p{N}]+' */
		if (k2 == CAI_UNICODE_LETTER || k2 == CAI_UNICODE_NUMBER || k2 == CAI_UNICODE_OTHER)
		{
			pos += (c == ' ');
			while (class_at(x, pos) == k2)
				pos++;
			emit_word(x, start, pos);
			continue;
		}
		n = space_run(x, pos);
		if (n > 1 && pos + n < b)
		{
			/* '\s+(?!\S)': leave the last space to prefix the word that follows */
			pos += n - 1;
		}
		else if (n > 0)
			pos += n;			/* '\s+' */
		else
			pos++;
		emit_word(x, start, pos);
	}
}

/*
 * The Llama 3 split (Qwen2 when max_digits is 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+
 */
static void
split_llama3(split_ctx *x, size_t a, size_t b, int max_digits)
{
	size_t		pos = a;

	x->end = b;
	while (pos < b && x->status == CAI_OK)
	{
		uint32_t	c = cpt_at(x, pos);
		int			k = class_at(x, pos);
		size_t		start = pos;
		size_t		n;
		size_t		last_newline;
		int			k2;

		if ((n = contraction_at(x, pos, true)) > 0)
		{
			emit_word(x, pos, pos + n);
			pos += n;
			continue;
		}
		/* [^\r\n\p{L}\p{N}]?\p{L}+ */
		if (c != '\r' && c != '\n' && k != CAI_UNICODE_NUMBER &&
			(k == CAI_UNICODE_LETTER || class_at(x, pos + 1) == CAI_UNICODE_LETTER))
		{
			pos++;
			while (class_at(x, pos) == CAI_UNICODE_LETTER)
				pos++;
			emit_word(x, start, pos);
			continue;
		}
		/* \p{N}{1,max_digits} */
		if (k == CAI_UNICODE_NUMBER)
		{
			while (class_at(x, pos) == CAI_UNICODE_NUMBER && pos - start < (size_t) max_digits)
				pos++;
			emit_word(x, start, pos);
			continue;
		}
		/* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
		k2 = c == ' ' ? class_at(x, pos + 1) : k;
		if (k2 == CAI_UNICODE_OTHER)
		{
			pos += (c == ' ');
			while (class_at(x, pos) == CAI_UNICODE_OTHER)
				pos++;
			while (cpt_at(x, pos) == '\r' || cpt_at(x, pos) == '\n')
				pos++;
			emit_word(x, start, pos);
			continue;
		}
		n = 0;
		last_newline = 0;
		while (class_at(x, pos + n) == CAI_UNICODE_SPACE)
		{
			uint32_t	c2 = cpt_at(x, pos + n);

			n++;
			if (c2 == '\r' || c2 == '\n')
				last_newline = n;
		}
		if (last_newline > 0)
			pos += last_newline;	/* \s*[\r\n]+ */
		else if (n > 1 && pos + n < b)
			pos += n - 1;		/* \s+(?!\S) */
		else if (n > 0)
			pos += n;			/* \s+ */
		else
			pos++;
		emit_word(x, start, pos);
	}
}

/* Pre-tokenizes and BPE-encodes text[0..len), which holds no special token. */
static cai_status
bpe_encode_text(const cai_tokenizer *tok, encode_scratch *s, const char *text, size_t len,
				cai_tokens *out, cai_error *err)
{
	split_ctx	x;
	size_t		n;

	if (len == 0)
		return CAI_OK;
	if (len > UINT32_MAX / 2 || !decode_cpts(s, (const unsigned char *) text, len, &n))
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing %zu bytes", len);

	x.tok = tok;
	x.s = s;
	x.text = (const unsigned char *) text;
	x.out = out;
	x.err = err;
	x.status = CAI_OK;

	switch (tok->pre)
	{
		case PRE_GPT2:
			split_gpt2(&x, 0, n);
			break;
		case PRE_DIGITS_GPT2:
			{
				/* every digit is a piece of its own; the GPT-2 split runs between them */
				size_t		piece = 0;

				for (size_t i = 0; i <= n && x.status == CAI_OK; i++)
				{
					if (i < n && s->cls[i] != CAI_UNICODE_NUMBER)
						continue;
					split_gpt2(&x, piece, i);
					if (i < n)
					{
						x.end = n;
						emit_word(&x, i, i + 1);
					}
					piece = i + 1;
				}
				break;
			}
		case PRE_LLAMA3:
			split_llama3(&x, 0, n, 3);
			break;
		case PRE_QWEN2:
			split_llama3(&x, 0, n, 1);
			break;
	}
	return x.status;
}

/* ---------------------------------------------------------------------------------------------
 * SentencePiece
 * ------------------------------------------------------------------------------------------- */

/* Queues the merge of pieces left and right if their concatenation is a vocabulary piece. */
static bool
spm_consider(const cai_tokenizer *tok, encode_scratch *s, int32_t left, int32_t right)
{
	merge_candidate c;
	int32_t		id;
	int32_t		size;

	if (left < 0 || right < 0)
		return true;
	size = s->sym_len[left] + s->sym_len[right];
	id = vocab_lookup(tok, s->buf + s->sym_start[left], (size_t) size);
	if (id < 0 || !(tok->flags[id] & TOKEN_MERGEABLE))
		return true;
	c.priority = -tok->scores[id];
	c.left = left;
	c.right = right;
	c.result = id;
	c.size = size;
	return heap_push(s, c);
}

/* Emits piece [start, start+len) of the escaped text: its token, else its bytes' tokens. */
static bool
spm_emit_piece(const cai_tokenizer *tok, const char *p, int32_t len, cai_tokens *out)
{
	int32_t		id = vocab_lookup(tok, p, (size_t) len);

	if (id >= 0 && (tok->flags[id] & TOKEN_MERGEABLE))
		return cai_tokens_push(out, id);
	for (int32_t i = 0; i < len; i++)
	{
		int32_t		b = tok->byte_token[(unsigned char) p[i]];

		if (b < 0)
			b = tok->unk;
		if (b >= 0 && !cai_tokens_push(out, b))
			return false;
	}
	return true;
}

/*
 * SentencePiece-encodes text[0..len) (no special token in it): spaces become "▁", a "▁" goes in
 * front when space_prefix, then adjacent pieces merge best score first (leftmost on ties).
 */
static cai_status
spm_encode_text(const cai_tokenizer *tok, encode_scratch *s, const char *text, size_t len,
				bool space_prefix, cai_tokens *out, cai_error *err)
{
	size_t		n = 0;
	size_t		cap;
	int32_t		n_sym = 0;

	if (len == 0)
		return CAI_OK;
	if (len > INT32_MAX / 8)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "text of %zu bytes is too long to tokenize", len);
	cap = (len + 1) * SPM_SPACE_LEN;
	if (!grow_array((void **) &s->buf, &s->buf_cap, cap, 1))
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing %zu bytes", len);

	if (space_prefix)
	{
		memcpy(s->buf, SPM_SPACE, SPM_SPACE_LEN);
		n = SPM_SPACE_LEN;
	}
	for (size_t i = 0; i < len; i++)
	{
		if (text[i] == ' ')
		{
			memcpy(s->buf + n, SPM_SPACE, SPM_SPACE_LEN);
			n += SPM_SPACE_LEN;
		}
		else
			s->buf[n++] = text[i];
	}

	if (!scratch_reserve_symbols(s, n))
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing %zu bytes", len);

	/* initial pieces: one per character (an invalid byte is a piece of its own) */
	for (size_t p = 0; p < n;)
	{
		uint32_t	cpt;
		int			k = cai_utf8_decode((const unsigned char *) s->buf + p, n - p, &cpt);

		if (k == 0)
			k = 1;
		s->sym_start[n_sym] = (int32_t) p;
		s->sym_len[n_sym] = k;
		s->sym_prev[n_sym] = n_sym - 1;
		s->sym_next[n_sym] = -1;
		if (n_sym > 0)
			s->sym_next[n_sym - 1] = n_sym;
		n_sym++;
		p += k;
	}

	s->heap_n = 0;
	for (int32_t i = 0; i + 1 < n_sym; i++)
		if (!spm_consider(tok, s, i, i + 1))
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing");
	while (s->heap_n > 0)
	{
		merge_candidate c = heap_pop(s);
		int32_t		l = c.left;
		int32_t		r = c.right;

		/* stale: either piece grew or went away since this candidate was queued */
		if (s->sym_len[l] == 0 || s->sym_len[r] == 0 || s->sym_next[l] != r ||
			s->sym_len[l] + s->sym_len[r] != c.size)
			continue;
		s->sym_len[l] += s->sym_len[r];
		s->sym_len[r] = 0;
		s->sym_next[l] = s->sym_next[r];
		if (s->sym_next[r] >= 0)
			s->sym_prev[s->sym_next[r]] = l;
		if (!spm_consider(tok, s, s->sym_prev[l], l) ||
			!spm_consider(tok, s, l, s->sym_next[l]))
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing");
	}

	for (int32_t i = 0; i >= 0 && n_sym > 0; i = s->sym_next[i])
		if (!spm_emit_piece(tok, s->buf + s->sym_start[i], s->sym_len[i], out))
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing");
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Encoding: the entry points
 * ------------------------------------------------------------------------------------------- */

/* The special token starting at text[0..left), or -1. */
static int32_t
match_special(const cai_tokenizer *tok, const char *text, size_t left, bool parse_special)
{
	if (!tok->special_first[(unsigned char) text[0]])
		return -1;
	for (int i = 0; i < tok->n_special_lengths; i++)
	{
		size_t		len = (size_t) tok->special_lengths[i];
		int32_t		id;

		if (len > left)
			continue;
		id = vocab_lookup(tok, text, len);
		if (id < 0)
			continue;
		if ((tok->flags[id] & TOKEN_ALWAYS) || (parse_special && (tok->flags[id] & TOKEN_SPECIAL)))
			return id;
	}
	return -1;
}

/* Encodes a stretch of text holding no special token. */
static cai_status
encode_plain(const cai_tokenizer *tok, encode_scratch *s, const char *text, size_t len,
			 bool space_prefix, cai_tokens *out, cai_error *err)
{
	if (tok->kind == TOKENIZER_BPE)
		return bpe_encode_text(tok, s, text, len, out, err);
	return spm_encode_text(tok, s, text, len, space_prefix, out, err);
}

static cai_status
encode(const cai_tokenizer *tok, const char *text, size_t len, bool parse_special,
	   bool continuation, cai_tokens *out, cai_error *err)
{
	encode_scratch s;
	cai_status	st = CAI_OK;
	size_t		plain_start = 0;
	size_t		pos = 0;

	/*
	 * SentencePiece puts a space in front of the text, and (as llama.cpp does) of each stretch
	 * of text that follows a special token.
	 */
	bool		after_special = !continuation;

	if (!tok || !out || (!text && len > 0))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "tokenizer, text and output must not be null");
	memset(&s, 0, sizeof(s));

	while (pos < len && st == CAI_OK)
	{
		int32_t		id = match_special(tok, text + pos, len - pos, parse_special);

		if (id < 0)
		{
			pos++;
			continue;
		}
		if (pos > plain_start)
			st = encode_plain(tok, &s, text + plain_start, pos - plain_start,
							  tok->add_space_prefix && after_special, out, err);
		if (st == CAI_OK && !cai_tokens_push(out, id))
			st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing");
		after_special = true;
		pos += tok->text_len[id];
		plain_start = pos;
	}
	if (st == CAI_OK && len > plain_start)
		st = encode_plain(tok, &s, text + plain_start, len - plain_start,
						  tok->add_space_prefix && after_special, out, err);
	scratch_free(&s);
	return st;
}

cai_status
cai_tokenizer_encode(const cai_tokenizer *tok, const char *text, size_t len,
					 bool parse_special, cai_tokens *out, cai_error *err)
{
	return encode(tok, text, len, parse_special, false, out, err);
}

cai_status
cai_tokenizer_encode_continuation(const cai_tokenizer *tok, const char *text, size_t len,
								  bool parse_special, cai_tokens *out, cai_error *err)
{
	return encode(tok, text, len, parse_special, true, out, err);
}

/* ---------------------------------------------------------------------------------------------
 * Streaming detokenization
 * ------------------------------------------------------------------------------------------- */

void
cai_detokenizer_init(cai_detokenizer *d, const cai_tokenizer *tok)
{
	d->n_pending = 0;
	d->at_start = tok->kind == TOKENIZER_SPM && tok->add_space_prefix;
}

/* Appends n bytes to out[*w..cap); bytes that do not fit are dropped (cap is the hard limit). */
static void
put_bytes(char *out, int cap, int *w, const void *bytes, int n)
{
	if (n > cap - *w)
		n = cap - *w;
	if (n > 0)
	{
		memcpy(out + *w, bytes, n);
		*w += n;
	}
}

/*
 * Length of the maximal ill-formed subpart at s (>= 1): the bytes one U+FFFD replaces, as
 * Unicode recommends and Python's "replace" error handler does.
 */
static size_t
ill_formed_length(const unsigned char *s, size_t len)
{
	size_t		k = 1;

	while (k < len && k < 4 && cai_utf8_incomplete(s, k + 1))
		k++;
	return k;
}

/*
 * Copies the well-formed UTF-8 of s[0..len) to out, U+FFFD for each ill-formed subpart; an
 * incomplete sequence at the very end is not copied.  Returns the bytes consumed.
 */
static size_t
emit_utf8(const unsigned char *s, size_t len, char *out, int cap, int *w)
{
	size_t		p = 0;

	while (p < len)
	{
		uint32_t	cpt;
		int			k;
		size_t		run = p;

		/* fast path over ASCII */
		while (run < len && s[run] < 0x80)
			run++;
		if (run > p)
		{
			put_bytes(out, cap, w, s + p, (int) (run - p));
			p = run;
			continue;
		}
		k = cai_utf8_decode(s + p, len - p, &cpt);
		if (k > 0)
		{
			put_bytes(out, cap, w, s + p, k);
			p += k;
			continue;
		}
		if (cai_utf8_incomplete(s + p, len - p))
			break;				/* the rest may be completed by the next token */
		k = (int) ill_formed_length(s + p, len - p);
		put_bytes(out, cap, w, CAI_UTF8_REPLACEMENT, 3);
		p += k;
	}
	return p;
}

int
cai_detokenizer_feed(cai_detokenizer *d, const cai_tokenizer *tok, int32_t id,
					 char *out, int cap)
{
	const unsigned char *b;
	size_t		n;
	int			w = 0;

	if (id < 0 || id >= tok->n_vocab || cap <= 0)
		return 0;
	b = (const unsigned char *) tok->bytes + tok->bytes_off[id];
	n = tok->bytes_len[id];

	if (d->at_start && n > 0 && !(tok->flags[id] & TOKEN_SPECIAL))
	{
		/* SentencePiece: the space the encoder put in front of the text is not the text's */
		if (b[0] == ' ')
		{
			b++;
			n--;
		}
		d->at_start = false;
	}

	/* first complete (or give up on) the sequence left over from earlier tokens */
	while (d->n_pending > 0 && n > 0)
	{
		unsigned char buf[8];
		size_t		have = (size_t) d->n_pending;
		size_t		take = n < 4 ? n : 4;
		size_t		used;

		memcpy(buf, d->pending, have);
		memcpy(buf + have, b, take);
		if (cai_utf8_incomplete(buf, have + take))
		{
			/* still incomplete: the whole token joins the pending bytes */
			memcpy(d->pending + have, b, take);
			d->n_pending += (int) take;
			return w;
		}
		used = emit_utf8(buf, have + take, out, cap, &w);
		if (used >= have)
		{
			/* the pending bytes went out (whole, or as U+FFFD) */
			d->n_pending = 0;
			b += used - have;
			n -= used - have;
		}
		else
		{
			/* only part of the pending bytes could be resolved; keep the rest */
			memmove(d->pending, d->pending + used, have - used);
			d->n_pending = (int) (have - used);
		}
	}

	if (n > 0)
	{
		size_t		used = emit_utf8(b, n, out, cap, &w);

		/* at most 3 bytes remain: an incomplete sequence */
		memcpy(d->pending, b + used, n - used);
		d->n_pending = (int) (n - used);
	}
	return w;
}

int
cai_detokenizer_flush(cai_detokenizer *d, char *out, int cap)
{
	int			w = 0;

	if (d->n_pending > 0)
		put_bytes(out, cap, &w, CAI_UTF8_REPLACEMENT, 3);
	d->n_pending = 0;
	return w;
}
