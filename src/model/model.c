/*
 * model.c — a loaded model's lifetime (the allocations it owns), its KV layout and its public
 * info.  Loading is model_load.c's (config: model_config.c; weights: convert.c, calibrate.c),
 * the forward forward.c's, the text API (describe, tokens) model_text.c's.
 */
#include "model_internal.h"
#include "model_wcache.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Allocations owned by a model
 * ------------------------------------------------------------------------------------------- */

typedef struct model_owned
{
	void	  **ptrs;
	int			n;
	int			cap;
} model_owned;

/* An empty model with its allocation list; NULL when out of memory. */
cai_model *
cai_model_new(void)
{
	cai_model  *m = calloc(1, sizeof(*m));

	if (!m || !(m->owned = calloc(1, sizeof(model_owned))))
	{
		free(m);
		return NULL;
	}
	return m;
}

/* 64-byte aligned memory freed with the model; NULL when out of memory. */
void *
cai_model_alloc(cai_model *m, size_t bytes)
{
	model_owned *o = m->owned;
	void	   *p;

	if (o->n == o->cap)
	{
		int			cap = o->cap ? o->cap * 2 : 256;
		void	  **ptrs = realloc(o->ptrs, (size_t) cap * sizeof(void *));

		if (!ptrs)
			return NULL;
		o->ptrs = ptrs;
		o->cap = cap;
	}
	if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
		return NULL;
	o->ptrs[o->n++] = p;
	return p;
}

/* Frees one allocation of cai_model_alloc before the model goes (NULL is fine). */
static void
model_free_one(cai_model *m, const void *p)
{
	model_owned *o = m->owned;

	if (!p)
		return;
	for (int i = 0; i < o->n; i++)
		if (o->ptrs[i] == p)
		{
			free(o->ptrs[i]);
			o->ptrs[i] = o->ptrs[--o->n];
			return;
		}
}

static void
release_qmatrix(cai_model *m, cai_qmatrix *q)
{
	model_free_one(m, q->q);
	model_free_one(m, q->scale);
	q->q = NULL;
	q->scale = NULL;
}

/* Frees the row-major GEMM matrices, which the backend that serves has prepared its copy of. */
void
cai_model_release_gemm_sources(cai_model *m)
{
	/* the file's own matrices: the backend dropped their pages as it repacked them */
	if (m->file_weights)
		return;
	if (!m->int8_complete)
		return;
	release_qmatrix(m, &m->lm_head);
	for (int l = 0; l < m->cfg.n_layers; l++)
	{
		cai_layer_weights *w = &m->layers[l];

		release_qmatrix(m, &w->wqkv);
		release_qmatrix(m, &w->wo);
		release_qmatrix(m, &w->w_gate_up);
		release_qmatrix(m, &w->w_down);
		w->wq = w->wk = w->wv = w->wqkv;
		w->w_gate = w->w_up = w->w_gate_up;
	}
	m->int8_complete = false;
	m->gemm_sources_released = true;
}

/* Frees everything the model owns (NULL is fine). */
void
cai_model_free(cai_model *model)
{
	model_owned *o;

	if (!model)
		return;
	o = model->owned;
	if (o)
	{
		for (int i = 0; i < o->n; i++)
			free(o->ptrs[i]);
		free(o->ptrs);
		free(o);
	}
	cai_tokenizer_free(model->tokenizer);
	gguf_close(model->gguf);
	/* last: the model's int8 tables may point into the mapping */
	cai_model_wcache_free(model);
	free(model);
}

/* kv.h's block layout for this model: each KV-owning layer's part 64-byte aligned. */
void
cai_model_kv_layout(const cai_model *model, cai_kv_layout *out)
{
	const cai_config *c = &model->cfg;
	int			key_digits = model->two_digit_activations ? 2 : 1;
	size_t		part = (size_t) CAI_KV_BLOCK_TOKENS *
		cai_kv_token_layer_bytes(c->n_kv_heads, c->head_dim, key_digits);

	out->n_kv_layers = c->n_kv_layers;
	out->n_windowed_layers = c->n_windowed_kv_layers;
	out->window = c->kv_window;
	out->n_kv_heads = c->n_kv_heads;
	out->head_dim = c->head_dim;
	out->key_digits = key_digits;
	out->layer_bytes = (part + 63) & ~(size_t) 63;	/* each layer's part 64-byte aligned */
	out->block_bytes = out->layer_bytes * (size_t) c->n_kv_layers;
}

/* Fills info; its strings point into the model. */
void
cai_model_get_info(const cai_model *model, cai_model_info *info)
{
	const cai_config *c = &model->cfg;
	cai_kv_layout L;
	size_t		token_layer_bytes;

	cai_model_kv_layout(model, &L);
	token_layer_bytes = cai_kv_token_layer_bytes(L.n_kv_heads, L.head_dim, L.key_digits);

	memset(info, 0, sizeof(*info));
	info->arch = c->arch_name;
	info->name = c->name;
	info->chat_template = cai_chat_template_name(model->tmpl.kind);
	info->n_layers = c->n_layers;
	info->d_model = c->d_model;
	info->n_heads = c->n_heads;
	info->n_kv_heads = c->n_kv_heads;
	info->head_dim = c->head_dim;
	info->d_ff = c->d_ff;
	info->n_vocab = c->n_vocab;
	info->context_length = c->context_length;
	info->n_params = model->n_params;
	info->weight_bytes = model->weight_bytes;
	info->kv_bytes_per_token = (size_t) c->n_kv_layers * token_layer_bytes;
	info->kv_window_bytes_per_token = (size_t) c->n_windowed_kv_layers * token_layer_bytes;
	info->kv_window = c->kv_window;
	info->gptq_rounding = model->gptq_rounding;
	info->two_digit_activations = model->two_digit_activations;
	info->superblock_activations = model->superblock_activations;
	info->file_weights = model->file_weights;
	info->pooling = model->cfg.pooling;
	info->causal = model->cfg.causal;
	info->fingerprint = model->fingerprint;
	info->bos_token = cai_tokenizer_bos(model->tokenizer);
	info->add_bos = info->bos_token >= 0 && cai_tokenizer_add_bos(model->tokenizer);
	info->eos_token = cai_tokenizer_eos(model->tokenizer);
	info->eot_token = model->tmpl.end_of_turn >= 0 ? model->tmpl.end_of_turn : info->eos_token;
}
