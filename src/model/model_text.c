/*
 * model_text.c — the model as text: its description (cai_model_describe) and the token API
 * over its tokenizer (cai_tokenize, cai_detokenize).
 */
#include "model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"
#include "util.h"

/* ---------------------------------------------------------------------------------------------
 * cai_model_describe
 * ------------------------------------------------------------------------------------------- */

typedef struct strbuf
{
	char	   *p;
	size_t		len;
	size_t		cap;
	bool		oom;
} strbuf;

static void sb_printf(strbuf *sb, const char *fmt,...) __attribute__((format(printf, 2, 3)));

static void
sb_printf(strbuf *sb, const char *fmt,...)
{
	va_list		ap;
	int			n;

	if (sb->oom)
		return;
	for (;;)
	{
		size_t		room = sb->cap - sb->len;

		va_start(ap, fmt);
		n = vsnprintf(sb->p ? sb->p + sb->len : NULL, sb->p ? room : 0, fmt, ap);
		va_end(ap);
		if (n < 0)
		{
			sb->oom = true;
			return;
		}
		if (sb->p && (size_t) n < room)
		{
			sb->len += (size_t) n;
			return;
		}
		{
			size_t		cap = sb->cap ? sb->cap * 2 : 4096;
			char	   *p;

			while (cap < sb->len + (size_t) n + 1)
				cap *= 2;
			p = realloc(sb->p, cap);
			if (!p)
			{
				sb->oom = true;
				return;
			}
			sb->p = p;
			sb->cap = cap;
		}
	}
}

static void
sb_append(strbuf *sb, const char *data, size_t n)
{
	if (sb->oom)
		return;
	if (sb->cap - sb->len <= n)
	{
		size_t		cap = sb->cap ? sb->cap : 4096;
		char	   *p;

		while (cap - sb->len <= n)
			cap *= 2;
		p = realloc(sb->p, cap);
		if (!p)
		{
			sb->oom = true;
			return;
		}
		sb->p = p;
		sb->cap = cap;
	}
	memcpy(sb->p + sb->len, data, n);
	sb->len += n;
	sb->p[sb->len] = '\0';
}

/* Prints a metadata string, escaping control characters and eliding the middle of long ones. */
static void
sb_put_gguf_str(strbuf *sb, gguf_str s, size_t max)
{
	sb_printf(sb, "\"");
	for (uint64_t i = 0; i < s.len; i++)
	{
		unsigned char ch = (unsigned char) s.ptr[i];

		if (i == max)
		{
			sb_printf(sb, "...\" (%llu bytes)", (unsigned long long) s.len);
			return;
		}
		if (ch == '\n')
			sb_printf(sb, "\\n");
		else if (ch == '"' || ch == '\\')
			sb_printf(sb, "\\%c", ch);
		else if (ch < 0x20)
			sb_printf(sb, "\\x%02x", ch);
		else
			sb_printf(sb, "%c", ch);
	}
	sb_printf(sb, "\"");
}

/*
 * A key or tensor name for "%.*s": at most 1000 bytes of it.  The cast to int alone would turn a
 * length of 2^31 or more into a negative precision, which printf reads as none at all: it would
 * print until a NUL, past the name.
 */
#define NAME_ARG(s) (int) ((s).len > 1000 ? 1000 : (s).len), (s).ptr

/* The config, then every metadata pair and tensor, as text (free with cai_free). */
cai_status
cai_model_describe(const cai_model *model, char **text, cai_error *err)
{
	const cai_config *c = &model->cfg;
	const gguf_file *f = model->gguf;
	strbuf		sb = {0};
	cai_model_info info;

	*text = NULL;
	cai_model_get_info(model, &info);
	sb_printf(&sb, "model: %s\n", c->name);
	sb_printf(&sb, "architecture: %s\n", c->arch_name);
	sb_printf(&sb, "file: gguf v%u, %llu tensors, %llu metadata keys\n", f->version,
			  (unsigned long long) f->n_tensors, (unsigned long long) f->n_kv);
	sb_printf(&sb, "layers: %d, d_model: %d, heads: %d (kv heads: %d, head size: %d), d_ff: %d\n",
			  c->n_layers, c->d_model, c->n_heads, c->n_kv_heads, c->head_dim, c->d_ff);
	sb_printf(&sb, "vocabulary: %d, context: %d, rms eps: %g\n", c->n_vocab, c->context_length,
			  (double) c->norm_eps);
	sb_printf(&sb, "rope: %s, %d of %d dimensions, base %g%s%s\n",
			  c->rope_neox ? "neox (halves)" : "normal (adjacent pairs)", c->n_rot, c->head_dim,
			  (double) c->rope_base, c->rope_freq_scale != 1.0f ? ", linear scaling" : "",
			  model->rope_freqs ? ", frequency factors" : "");
	if (c->rope_base_windowed > 0.0f)
		sb_printf(&sb, "windowed layers' rope: base %g, unscaled\n", (double) c->rope_base_windowed);
	{
		int			n_windowed = 0;

		for (int l = 0; l < c->n_layers; l++)
			n_windowed += c->attn_window[l] > 0;
		if (n_windowed > 0)
			sb_printf(&sb, "attention: %d sliding-window layers, %d global\n", n_windowed,
					  c->n_layers - n_windowed);
	}
	sb_printf(&sb, "block: %s, %s FFN%s\n",
			  c->sandwich_norm ? "norms before and after each sublayer" : "pre-norm",
			  c->ffn_act == CAI_ACT_GEGLU ? "GeGLU" : "SwiGLU",
			  c->embed_scale != 1.0f ? ", embeddings scaled by sqrt(d_model)" : "");
	sb_printf(&sb, "embeddings: %s, q/k/v biases: %s, per-head q/k norms: %s\n",
			  c->tied_embeddings ? "tied (the head reuses token_embd)" : "separate output head",
			  c->qkv_bias ? "yes" : "no", c->qk_norm ? "yes" : "no");
	sb_printf(&sb, "chat template: %s\n", info.chat_template ? info.chat_template : "?");
	sb_printf(&sb, "parameters: %lld, engine weights: %.1f MiB (int8 + scales), kv: %zu bytes per token\n",
			  (long long) model->n_params, (double) model->weight_bytes / (1024.0 * 1024.0),
			  info.kv_bytes_per_token);
	if (info.kv_window > 0)
		sb_printf(&sb, "windowed kv: %zu of those bytes per token, kept for the last %d positions "
				  "(%zu bytes per token at a %d-token context)\n", info.kv_window_bytes_per_token,
				  info.kv_window, info.kv_bytes_per_token - info.kv_window_bytes_per_token +
				  info.kv_window_bytes_per_token * (size_t) (info.kv_window < 4096 ? info.kv_window : 4096) / 4096,
				  4096);
	sb_printf(&sb, "tokens: bos %d, eos %d, end of turn %d\n", info.bos_token, info.eos_token,
			  info.eot_token);
	sb_printf(&sb, "fingerprint: %016llx\n", (unsigned long long) model->fingerprint);

	sb_printf(&sb, "\nmetadata:\n");
	for (uint64_t i = 0; i < f->n_kv; i++)
	{
		const gguf_kv *kv = &f->kv[i];

		sb_printf(&sb, "  %.*s = ", NAME_ARG(kv->key));
		switch (kv->type)
		{
			case GGUF_TYPE_STRING:
				sb_put_gguf_str(&sb, kv->v.str, 120);
				break;
			case GGUF_TYPE_ARRAY:
				sb_printf(&sb, "[%s x %llu]", gguf_value_type_name(kv->v.arr.elem_type),
						  (unsigned long long) kv->v.arr.n);
				break;
			case GGUF_TYPE_FLOAT32:
			case GGUF_TYPE_FLOAT64:
				sb_printf(&sb, "%g", kv->v.f64);
				break;
			case GGUF_TYPE_BOOL:
				sb_printf(&sb, "%s", kv->v.b ? "true" : "false");
				break;
			case GGUF_TYPE_INT8:
			case GGUF_TYPE_INT16:
			case GGUF_TYPE_INT32:
			case GGUF_TYPE_INT64:
				sb_printf(&sb, "%lld", (long long) kv->v.i64);
				break;
			default:
				sb_printf(&sb, "%llu", (unsigned long long) kv->v.u64);
				break;
		}
		sb_printf(&sb, "\n");
	}
	sb_printf(&sb, "\ntensors:\n");
	for (uint64_t i = 0; i < f->n_tensors; i++)
	{
		const gguf_tensor *t = &f->tensors[i];

		sb_printf(&sb, "  %-32.*s %-5s [", NAME_ARG(t->name), ggml_type_name(t->type));
		for (uint32_t d = 0; d < t->n_dims; d++)
			sb_printf(&sb, "%s%lld", d ? ", " : "", (long long) t->ne[d]);
		sb_printf(&sb, "]\n");
	}
	if (sb.oom || !sb.p)
	{
		free(sb.p);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory describing the model");
	}
	*text = sb.p;
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Tokens
 * ------------------------------------------------------------------------------------------- */

cai_status
cai_tokenize(const cai_model *model, const char *text, size_t len, bool parse_special,
			 int32_t **ids, int *n_ids, cai_error *err)
{
	cai_tokens	toks;
	cai_status	st;

	*ids = NULL;
	*n_ids = 0;
	if (!text && len > 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "no text to tokenize");
	cai_tokens_init(&toks);
	st = cai_tokenizer_encode(model->tokenizer, text ? text : "", len, parse_special, &toks, err);
	if (st != CAI_OK)
	{
		cai_tokens_free(&toks);
		return st;
	}
	if (!toks.ids)
	{
		/* an empty result is still a valid, freeable array */
		toks.ids = malloc(sizeof(int32_t));
		if (!toks.ids)
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory tokenizing");
	}
	*ids = toks.ids;
	*n_ids = toks.n;
	return CAI_OK;
}

/* The concatenated bytes of the tokens, NUL-terminated (free with cai_free). */
cai_status
cai_detokenize(const cai_model *model, const int32_t *ids, int n_ids, char **text, size_t *len,
			   cai_error *err)
{
	strbuf		sb = {0};
	char		small[256];

	*text = NULL;
	if (len)
		*len = 0;
	if (n_ids < 0 || (n_ids > 0 && !ids))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "invalid token array");
	sb_append(&sb, "", 0);
	for (int i = 0; i < n_ids && !sb.oom; i++)
	{
		int			n = cai_tokenizer_token_bytes(model->tokenizer, ids[i], small, sizeof(small));

		if (n < 0)
		{
			free(sb.p);
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "token id %d is outside the vocabulary",
							ids[i]);
		}
		if ((size_t) n <= sizeof(small))
			sb_append(&sb, small, (size_t) n);
		else
		{
			/* a token longer than the stack buffer: ask again with room for it */
			char	   *big = malloc((size_t) n);

			if (!big)
			{
				free(sb.p);
				return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory detokenizing");
			}
			cai_tokenizer_token_bytes(model->tokenizer, ids[i], big, n);
			sb_append(&sb, big, (size_t) n);
			free(big);
		}
	}
	if (sb.oom || !sb.p)
	{
		free(sb.p);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory detokenizing");
	}
	*text = sb.p;
	if (len)
		*len = sb.len;
	return CAI_OK;
}
