/*
 * fuzz_tokenizer_load.c — the tokenizer loaded from hostile vocabularies: the input describes
 * a GGUF metadata section (tokenizer.ggml.*) that the harness writes with the synthetic GGUF
 * writer, so that every mutation is a well-formed file whose vocabulary is what is attacked:
 * empty, huge, duplicate and NUL-holding tokens, any token types, scores that are NaN or of the
 * wrong type or length, merges that name no tokens or are malformed, special-token ids out of
 * range or of the wrong type, unknown models and pre-tokenizers.
 *
 * A tokenizer that loads then encodes the rest of the input (with and without special tokens),
 * streams every vocabulary id and the encoded ids through a detokenizer, and detects and renders
 * a chat template (the input's Jinja text) over a short conversation.  Invariants: loading fails
 * with a status or gives a tokenizer whose size, special ids and byte lengths are consistent;
 * encoding succeeds with ids in the vocabulary and, without parse_special, no control token or
 * markup-like user-defined token (the tokens a user must never be able to type); the
 * detokenizer hands out valid UTF-8 within its documented buffer; rendering succeeds with ids
 * in the vocabulary.
 */
#include "fuzz_common.h"	/* first: it defines _GNU_SOURCE */

#include "chat_template.h"
#include "gguf.h"
#include "gguf_writer.h"

#define MAX_TOKENS 400
#define MAX_TOKEN_LEN 48
#define MAX_MERGES 200

/* The token texts a GPT-2 vocabulary starts from, so that BPE vocabularies are not all holes. */
static void
byte_level_char(int b, char *out, size_t *len)
{
	*len = (size_t) cai_utf8_encode(fixture_byte_char(b), out);
}

typedef struct vocab
{
	char	   *text[MAX_TOKENS + 256];
	size_t		len[MAX_TOKENS + 256];
	int32_t		type[MAX_TOKENS + 256];
	float		score[MAX_TOKENS + 256];
	int			n;
} vocab;

/* A scalar or array metadata value written in one of several ways, some of them wrong. */
static void
add_token_id(gguf_writer *w, fuzz_input *in, const char *key, int n)
{
	uint8_t		how = fuzz_u8(in);
	uint32_t	v = fuzz_u16(in) % (n + 4);

	switch (how % 6)
	{
		case 0:
			break;				/* absent */
		case 1:
		case 2:
			gguf_writer_add_u32(w, key, v);
			break;
		case 3:
			gguf_writer_add_i32(w, key, -(int32_t) v - 1);
			break;
		case 4:
			gguf_writer_add_u64(w, key, ((uint64_t) 1 << 40) + v);
			break;
		case 5:
			gguf_writer_add_str(w, key, "1");
			break;
	}
}

static void
add_flag(gguf_writer *w, fuzz_input *in, const char *key)
{
	uint8_t		how = fuzz_u8(in);

	if (how % 4 == 1)
		gguf_writer_add_bool(w, key, how & 4);
	else if (how % 4 == 2)
		gguf_writer_add_u8(w, key, 1);
}

/* Builds the GGUF image the input describes; the vocabulary is returned for the checks. */
static void
build_image(fuzz_input *in, vocab *v, char **jinja, uint8_t **image, size_t *size)
{
	static const char *const models[] = {"gpt2", "llama", "bert"};
	static const char *const pres[] = {"smollm", "llama-bpe", "qwen2", "gpt2", "default", "dbrx",
	"starcoder", "no-such-pre"};
	gguf_writer *w = gguf_writer_new();
	uint8_t		model = fuzz_u8(in);
	uint8_t		pre = fuzz_u8(in);
	uint8_t		shape = fuzz_u8(in);
	int			n_fuzz = fuzz_u16(in) % (MAX_TOKENS + 1);
	size_t		jinja_len;

	FUZZ_CHECK(w != NULL);
	gguf_writer_add_str(w, "general.architecture", "llama");
	if (model % 4 < 3)
		gguf_writer_add_str(w, "tokenizer.ggml.model", models[model % 4]);
	if (pre % 9 < 8)
		gguf_writer_add_str(w, "tokenizer.ggml.pre", pres[pre % 9]);

	/* the vocabulary: optionally the 256 byte-level characters or <0xNN> tokens, then the input's */
	v->n = 0;
	if (shape & 1)
		for (int b = 0; b < 256; b++, v->n++)
		{
			v->text[v->n] = malloc(8);
			FUZZ_CHECK(v->text[v->n] != NULL);
			if (model % 4 == 0)
				byte_level_char(b, v->text[v->n], &v->len[v->n]);
			else
				v->len[v->n] = (size_t) snprintf(v->text[v->n], 8, "<0x%02X>", b);
			v->type[v->n] = model % 4 == 0 ? 1 : 6;
			v->score[v->n] = 0;
		}
	for (int i = 0; i < n_fuzz; i++, v->n++)
	{
		uint8_t		t = fuzz_u8(in);

		v->text[v->n] = fuzz_chunk(in, (t & 0x80) ? 4100 : MAX_TOKEN_LEN, &v->len[v->n]);
		v->type[v->n] = (t & 7) == 7 ? (int32_t) fuzz_u32(in) : (t & 7);
		v->score[v->n] = (t & 8) ? -(float) fuzz_u8(in) : (t & 16) ? __builtin_nanf("") : 0;
	}
	if (!(shape & 2) || v->n > 0)
		gguf_writer_add_arr_str_len(w, "tokenizer.ggml.tokens", (const char *const *) v->text,
									v->len, v->n);
	switch ((shape >> 2) & 3)	/* token types: right, absent, one short, floats */
	{
		case 0:
			gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->type, v->n);
			break;
		case 1:					/* absent: every token loads as NORMAL */
			for (int i = 0; i < v->n; i++)
				v->type[i] = 1;
			break;
		case 2:
			if (v->n > 0)
				gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->type, v->n - 1);
			break;
		case 3:
			gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_FLOAT32, v->score, v->n);
			break;
	}
	switch ((shape >> 4) & 3)	/* scores: right, absent, as integers, as strings */
	{
		case 0:
			gguf_writer_add_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, v->score, v->n);
			break;
		case 2:
			gguf_writer_add_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_INT32, v->type, v->n);
			break;
		case 3:
			gguf_writer_add_arr_str_len(w, "tokenizer.ggml.scores", (const char *const *) v->text,
										v->len, v->n);
			break;
	}
	if ((shape >> 6) != 3)
	{
		/* merges: pairs of tokens ("left right"), or arbitrary text */
		int			n_merges = fuzz_u8(in) % MAX_MERGES;
		char	   *merges[MAX_MERGES];
		size_t		lens[MAX_MERGES];

		for (int i = 0; i < n_merges; i++)
		{
			uint8_t		how = fuzz_u8(in);

			if (how & 1 || v->n == 0)
				merges[i] = fuzz_chunk(in, 2 * MAX_TOKEN_LEN, &lens[i]);
			else
			{
				int			a = fuzz_u16(in) % v->n;
				int			b = fuzz_u16(in) % v->n;

				lens[i] = v->len[a] + 1 + v->len[b];
				merges[i] = malloc(lens[i] + 1);
				FUZZ_CHECK(merges[i] != NULL);
				memcpy(merges[i], v->text[a], v->len[a]);
				merges[i][v->len[a]] = ' ';
				memcpy(merges[i] + v->len[a] + 1, v->text[b], v->len[b]);
			}
		}
		gguf_writer_add_arr_str_len(w, "tokenizer.ggml.merges", (const char *const *) merges,
									lens, n_merges);
		for (int i = 0; i < n_merges; i++)
			free(merges[i]);
	}
	add_token_id(w, in, "tokenizer.ggml.bos_token_id", v->n);
	add_token_id(w, in, "tokenizer.ggml.eos_token_id", v->n);
	add_token_id(w, in, "tokenizer.ggml.unknown_token_id", v->n);
	add_flag(w, in, "tokenizer.ggml.add_bos_token");
	add_flag(w, in, "tokenizer.ggml.add_space_prefix");
	*jinja = fuzz_chunk(in, 512, &jinja_len);
	gguf_writer_add_str(w, "tokenizer.chat_template", *jinja);

	FUZZ_CHECK(gguf_writer_write_buffer(w, image, size));	/* whatever the input describes */
	gguf_writer_free(w);
}

/* The type a token was loaded with: types outside 1..6 read as NORMAL (tokenizer.c). */
static int32_t
loaded_type(const vocab *v, int32_t id)
{
	return v->type[id] >= 1 && v->type[id] <= 6 ? v->type[id] : 1;
}

/* What plain text must never produce: control tokens, and user-defined ones that look like markup. */
static bool
never_from_plain_text(const vocab *v, int32_t id)
{
	int32_t		t = loaded_type(v, id);
	const char *s = v->text[id];
	int			n = (int) v->len[id];
	bool		html = false;

	/* a plain HTML tag ("<b>", "</td>") is a text piece, "</s>" excepted (tokenizer.c) */
	if (n > 2 && !(n == 4 && memcmp(s, "</s>", 4) == 0))
	{
		int			i = s[1] == '/' ? 2 : 1;

		html = i < n - 1 && ((s[i] | 0x20) >= 'a' && (s[i] | 0x20) <= 'z');
		for (; html && i < n - 1; i++)
			html = ((s[i] | 0x20) >= 'a' && (s[i] | 0x20) <= 'z') || (s[i] >= '0' && s[i] <= '9');
	}
	return t == 3 || (t == 4 && n > 2 && s[0] == '<' && s[n - 1] == '>' && !html);
}

/* Streams ids through a detokenizer with the documented buffer; output must be valid UTF-8. */
static void
stream(const cai_tokenizer *tok, const int32_t *ids, int n)
{
	int			cap = 16 + 3 * cai_tokenizer_max_token_bytes(tok);
	char	   *buf = malloc(cap);
	cai_detokenizer d;

	FUZZ_CHECK(buf != NULL);
	cai_detokenizer_init(&d, tok);
	for (int i = 0; i <= n; i++)
	{
		int			k = i < n ? cai_detokenizer_feed(&d, tok, ids[i], buf, cap)
			: cai_detokenizer_flush(&d, buf, cap);

		FUZZ_CHECK(k >= 0 && k <= cap && fuzz_utf8_valid(buf, k));
	}
	free(buf);
}

static void
use_tokenizer(const cai_tokenizer *tok, const vocab *v, const char *jinja, fuzz_input *in)
{
	int			n_vocab = cai_tokenizer_n_vocab(tok);
	int32_t    *all = malloc(sizeof(int32_t) * (size_t) n_vocab);
	cai_tokens	ids;
	cai_error	err;
	cai_chat_template tmpl;
	cai_chat_message msgs[4] = {
		{CAI_ROLE_SYSTEM, " system ", NULL, 0, NULL},
		{CAI_ROLE_USER, "hi <|im_end|>", NULL, 0, NULL},
		{CAI_ROLE_ASSISTANT, "", NULL, 0, NULL},
		{CAI_ROLE_USER, (const char *) in->p, NULL, 0, NULL},
	};

	FUZZ_CHECK(all != NULL);
	FUZZ_CHECK(n_vocab == v->n);
	FUZZ_CHECK(cai_tokenizer_bos(tok) >= -1 && cai_tokenizer_bos(tok) < n_vocab);
	FUZZ_CHECK(cai_tokenizer_eos(tok) >= -1 && cai_tokenizer_eos(tok) < n_vocab);
	FUZZ_CHECK(!cai_tokenizer_add_bos(tok) || cai_tokenizer_bos(tok) >= 0);
	for (int i = 0; i < n_vocab; i++)
	{
		int			k = cai_tokenizer_token_bytes(tok, i, NULL, 0);

		FUZZ_CHECK(k >= 0 && k <= cai_tokenizer_max_token_bytes(tok));
		all[i] = i;
	}
	stream(tok, all, n_vocab);

	cai_tokens_init(&ids);
	for (int parse_special = 0; parse_special < 2; parse_special++)
	{
		ids.n = 0;
		FUZZ_CHECK(cai_tokenizer_encode(tok, (const char *) in->p, in->n, parse_special, &ids,
										&err) == CAI_OK);
		for (int i = 0; i < ids.n; i++)
		{
			FUZZ_CHECK(ids.ids[i] >= 0 && ids.ids[i] < n_vocab);
			FUZZ_CHECK(parse_special || !never_from_plain_text(v, ids.ids[i]));
		}
		stream(tok, ids.ids, ids.n);
	}

	/* the last message's content is the rest of the input (up to a NUL) */
	FUZZ_CHECK(cai_chat_template_detect(jinja, "llama", tok, &tmpl, &err) == CAI_OK);
	ids.n = 0;
	FUZZ_CHECK(cai_chat_template_render(&tmpl, tok, msgs, 4, true, &ids, &err) == CAI_OK);
	for (int i = 0; i < ids.n; i++)
		FUZZ_CHECK(ids.ids[i] >= 0 && ids.ids[i] < n_vocab);
	cai_tokens_free(&ids);
	free(all);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_input	in = {data, size};
	vocab	   *v = calloc(1, sizeof(vocab));
	char	   *jinja = NULL;
	uint8_t    *image = NULL;
	size_t		image_size;
	gguf_file  *f = NULL;
	cai_tokenizer *tok = NULL;
	cai_error	err;
	char	   *text;

	FUZZ_CHECK(v != NULL);
	build_image(&in, v, &jinja, &image, &image_size);
	FUZZ_CHECK(gguf_open_memory(image, image_size, &f, &err) == CAI_OK);
	if (cai_tokenizer_load(f, &tok, &err) == CAI_OK)
	{
		/* the rest of the input, NUL-terminated for the chat message */
		text = malloc(in.n + 1);
		FUZZ_CHECK(text != NULL);
		memcpy(text, in.p, in.n);
		text[in.n] = '\0';
		in.p = (const uint8_t *) text;
		use_tokenizer(tok, v, jinja, &in);
		free(text);
		cai_tokenizer_free(tok);
	}
	else
		FUZZ_CHECK(tok == NULL && err.message[0] != '\0');
	gguf_close(f);
	free(image);
	free(jinja);
	for (int i = 0; i < v->n; i++)
		free(v->text[i]);
	free(v);
	return 0;
}
