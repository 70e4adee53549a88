/*
 * forward.c — the batched ragged forward pass (cai_model_forward), one pass over the layers,
 * llama2.c style, calling the backend table (backend.h) for every heavy operation (R: a
 * rotation, norms with the int8 path's smoothed weights; see calibrate.c's "rotations"):
 *
 *   x = embed(tokens) (* sqrt(d) where the architecture scales embeddings)
 *   per layer:  xq = quant(R rmsnorm(x));  qkv = xq Wqkv (+b);  [headnorm(q), headnorm(k)];
 *               rope(q, k);  R q, R k;  kv <- (k, v);  a = attention(q, kv);
 *               x += quant(a) Wo                        [sandwich: x += rmsnorm'(quant(a) Wo)]
 *               xq = quant(R rmsnorm(x));  gu = xq Wgate_up;
 *               x += quant(R act(g) * u) Wdown          [sandwich: x += rmsnorm'(...)]
 *   logits = quant(R rmsnorm(x[rows])) Wlm
 *
 * act is silu (SwiGLU) or gelu (GeGLU).  Windowed layers may rotate with their own RoPE base.
 *
 * Two-digit activations (cai_model_params.activations; auto takes them on a small model's int8
 * path, cai.h): per-token int8 inputs lose about as much to their rounding as the weights do.  In
 * this mode every int8 GEMM input x = q s also carries its rounding error, quantized the same way:
 * x ~ q s + q2 s2, about 15 bits; so do the embedding's rows, where the residual stream starts (on
 * Gemma 3 270M their rounding alone costs the int8 path a KL of 0.0016, an eighth of its total),
 * and so do the cached keys (kv.h's two-digit keys): on Gemma 3 the keys' int8 rounding, over
 * heads of 256, was 0.0029 of its 0.0096.  The mode's mean KL against float: SmolLM2-135M 0.0048 ->
 * 0.0024, Gemma 3 270M 0.0123 -> 0.0048 (GPL-3, windows of 512).  The GEMM runs on each digit with
 * the same int8 weights and kernels, the second accumulated into the first's output
 * (out = [out +] (q W + b), then out + q2 W), so every backend computes it with the operations
 * it has, at twice the GEMM work.  Where the backend can add the digits' products
 * (add_digits), one GEMM takes both digits as twice the rows and reads the weights once; the
 * bits are the same either way.  The keys cost a byte more per element of KV.
 *
 * The float reference path runs the same structure with float GEMMs over copies of the source
 * weights and no activation quantization; its attention reads a float shadow of the KV kept in
 * the forward context (forward_internal.h).  Each path has its own layer function, read top to
 * bottom (cai_forward_layer_int8, cai_forward_layer_float); what they share is the attention
 * between the projections.  The calibration (calibrate.c) runs single layers of the float path,
 * watching their GEMM inputs through an observer (cai_forward_observer).
 */
#include "forward_internal.h"
#include "model_wcache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

const cai_backend *
cai_forward_ctx_backend(const cai_forward_ctx *ctx)
{
	return ctx->be;
}

cai_status
cai_forward_kv_copy_rows(cai_forward_ctx *ctx, cai_kv_pool *kv, int32_t src, int32_t dst,
						 int n_rows, cai_error *err)
{
	if (!ctx->be->ops->kv_copy_rows)
		return cai_fail(err, CAI_ERR_UNSUPPORTED, "the %s backend cannot copy kv rows",
						ctx->be->ops->name);
	ctx->be->ops->kv_copy_rows(ctx->be, kv, src, dst, n_rows);
	if (ctx->shadow_valid && dst < ctx->shadow.n_blocks)
		memset(ctx->shadow_valid + (size_t) dst * CAI_KV_BLOCK_TOKENS, 0, CAI_KV_BLOCK_TOKENS);
	return CAI_OK;
}

/* cai_backend_factory for the CPU backend: arg is the thread pool. */
static cai_status
forward_cpu_backend_factory(void *arg, const cai_backend_limits *limits, cai_backend **out,
							cai_error *err)
{
	return cai_backend_cpu_create((cai_threadpool *) arg, limits, out, err);
}

/* Allocates the context (see model.h): the CPU backend over pool and the activations. */
cai_status
cai_forward_ctx_create(const cai_model *model, cai_threadpool *pool, int max_tokens,
					   int max_context, cai_forward_ctx **out, cai_error *err)
{
	return cai_forward_ctx_create_on(model, forward_cpu_backend_factory, pool, max_tokens,
									 max_context, out, err);
}

/* Refuses a backend that lacks an operation the model's architecture needs. */
static cai_status
backend_runs_model(const cai_backend_ops *op, const cai_config *c, bool file_weights,
				   cai_error *err)
{
	const int	q_dim = c->n_heads * c->head_dim;
	const char *missing = NULL;

	/* the file path's four operations, all or none */
	if (file_weights && !(op->prepare_blocks && op->quantize_blocks && op->gemm_blocks &&
						  op->embed_blocks))
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"the %s backend cannot multiply the file's own weight formats; load the "
						"model with weights 'int8'", op->name);
	/* the int8 path rotates its GEMM inputs (calibrate.c's "rotations"): a backend must offer that */
	if (!op->rotate || (c->qk_norm && !op->head_rmsnorm))
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"the %s backend lacks an operation this model needs (%s)", op->name,
						op->rotate ? "per-head query/key norms" : "rotating activations");
	/* a layer that reads another's KV multiplies by the query rows of its QKV matrix alone */
	for (int l = 0; l < c->n_layers; l++)
		if (c->kv_source[l] != l && q_dim % 16 != 0)
			return cai_fail(err, CAI_ERR_UNSUPPORTED,
							"layers that share KV need a query width that is a multiple of 16 (%d)",
							q_dim);
	/* the operations only some architectures use */
	if (c->ffn_act == CAI_ACT_GEGLU && !op->geglu)
		missing = "GeGLU";
	else if (c->sandwich_norm && !op->rmsnorm_add)
		missing = "sublayer output norms";
	else if (c->embed_scale != 1.0f && !op->scale)
		missing = "embedding scaling";
	if (missing)
		return cai_fail(err, CAI_ERR_UNSUPPORTED, "the %s backend lacks %s, which %s models need",
						op->name, missing, c->arch_name);
	return CAI_OK;
}

/* Allocates the context on the backend factory(arg, ...) makes; the context owns it. */
cai_status
cai_forward_ctx_create_on(const cai_model *model, cai_backend_factory factory, void *arg,
						  int max_tokens, int max_context, cai_forward_ctx **out, cai_error *err)
{
	const cai_config *c = &model->cfg;
	cai_forward_ctx *ctx;
	cai_backend_limits lim;
	int			q_dim = c->n_heads * c->head_dim;
	size_t		T;
	cai_status	st;

	*out = NULL;
	if (model->gemm_sources_released)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"the model's int8 weights were released to the backend that serves it");
	if (max_tokens < 1 || max_context < 1 || max_tokens > (1 << 20) || max_context > (1 << 24))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"forward context needs 1..%d tokens and a positive context", 1 << 20);
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory creating the forward context");
	ctx->model = model;
	ctx->max_tokens = max_tokens;
	ctx->max_context = max_context;
	ctx->width = c->d_model;
	if (q_dim > ctx->width)
		ctx->width = q_dim;
	if (c->d_ff > ctx->width)
		ctx->width = c->d_ff;
	ctx->qkv_width = q_dim + 2 * c->n_kv_heads * c->head_dim;

	lim.max_tokens = max_tokens;
	lim.max_context = max_context;
	lim.max_width = ctx->width;
	lim.n_heads = c->n_heads;
	lim.n_kv_heads = c->n_kv_heads;
	lim.head_dim = c->head_dim;
	if ((st = factory(arg, &lim, &ctx->be, err)) != CAI_OK)
	{
		free(ctx);
		return st;
	}
	if ((st = backend_runs_model(ctx->be->ops, c, model->file_weights, err)) != CAI_OK)
	{
		cai_backend_free(ctx->be);
		free(ctx);
		return st;
	}

	T = (size_t) max_tokens;
	ctx->ids = malloc(T * sizeof(int32_t));
	ctx->pos = malloc(T * sizeof(int32_t));
	ctx->seq = malloc(T * sizeof(int32_t));
	ctx->logit_rows = malloc(T * sizeof(int32_t));
	ctx->seq_start = malloc(T * sizeof(int32_t));
	ctx->seq_len = malloc(T * sizeof(int32_t));
	ctx->tables = malloc(T * sizeof(int32_t *));
	ctx->embed_seq = malloc(T * sizeof(int32_t));
	ctx->embed_first = malloc(T * sizeof(int32_t));
	ctx->embed_rows = malloc(T * sizeof(int32_t));
	ctx->attn_pos = malloc(T * sizeof(int32_t));
	ctx->x = ctx->be->ops->alloc(ctx->be, T * c->d_model * sizeof(float));
	ctx->xn = ctx->be->ops->alloc(ctx->be, T * ctx->width * sizeof(float));
	ctx->xq = ctx->be->ops->alloc(ctx->be, (model->two_digit_activations ? 2 : 1) * T * ctx->width);
	if (model->file_weights)
	{
		/* a scale and a sum per block of 32 (the file path's activations) */
		ctx->xs = ctx->be->ops->alloc(ctx->be, T * (ctx->width / 32) * sizeof(float));
		ctx->xsum = ctx->be->ops->alloc(ctx->be, T * (ctx->width / 32) * sizeof(int16_t));
		if (!ctx->xsum)
		{
			cai_forward_ctx_free(ctx);
			return cai_fail(err, CAI_ERR_NO_MEMORY,
							"out of memory allocating activations for %d tokens", max_tokens);
		}
	}
	else
		ctx->xs = ctx->be->ops->alloc(ctx->be,
									  (model->two_digit_activations ? 2 : 1) * T * sizeof(float));
	if (model->two_digit_activations)
	{
		size_t		widest = (size_t) 2 * c->d_ff > (size_t) ctx->qkv_width ?
			(size_t) 2 * c->d_ff : (size_t) ctx->qkv_width;

		const cai_backend_ops *ops = ctx->be->ops;	/* static: outlives the context */

		if (!ops->quantize_second_digit || !ops->embed_i8_add || !ops->two_digit_keys)
		{
			cai_forward_ctx_free(ctx);
			return cai_fail(err, CAI_ERR_UNSUPPORTED,
							"the %s backend cannot run two-digit activations%s", ops->name,
							ops->two_digit_keys ? "" : " (its attention has no two-digit keys)");
		}
		if (ctx->be->ops->add_digits)
		{
			ctx->digit_out_floats = 2 * T * widest;
			ctx->digit_out = ctx->be->ops->alloc(ctx->be, ctx->digit_out_floats * sizeof(float));
		}
		if (ctx->be->ops->add_digits && !ctx->digit_out)
		{
			cai_forward_ctx_free(ctx);
			return cai_fail(err, CAI_ERR_NO_MEMORY,
							"out of memory allocating activations for %d tokens", max_tokens);
		}
	}
	ctx->qkv = ctx->be->ops->alloc(ctx->be, T * ctx->qkv_width * sizeof(float));
	ctx->att = ctx->be->ops->alloc(ctx->be, T * q_dim * sizeof(float));
	ctx->gate_up = ctx->be->ops->alloc(ctx->be, T * 2 * c->d_ff * sizeof(float));
	ctx->rope_cs = ctx->be->ops->alloc(ctx->be, T * c->n_rot * sizeof(float));
	if (c->rope_base_windowed > 0.0f &&
		!(ctx->rope_cs_windowed = ctx->be->ops->alloc(ctx->be, T * c->n_rot * sizeof(float))))
	{
		cai_forward_ctx_free(ctx);
		return cai_fail(err, CAI_ERR_NO_MEMORY,
						"out of memory allocating activations for %d tokens", max_tokens);
	}
	ctx->xg = ctx->be->ops->alloc(ctx->be, T * c->d_model * sizeof(float));
	if (!ctx->ids || !ctx->pos || !ctx->seq || !ctx->logit_rows || !ctx->seq_start ||
		!ctx->seq_len || !ctx->tables || !ctx->embed_seq || !ctx->embed_first ||
		!ctx->embed_rows || !ctx->attn_pos || !ctx->x || !ctx->xn || !ctx->xq || !ctx->xs ||
		!ctx->qkv || !ctx->att || !ctx->gate_up || !ctx->rope_cs || !ctx->xg)
	{
		cai_forward_ctx_free(ctx);
		return cai_fail(err, CAI_ERR_NO_MEMORY,
						"out of memory allocating activations for %d tokens", max_tokens);
	}
	if ((st = cai_forward_bind_weights(ctx, err)) != CAI_OK)
	{
		cai_forward_ctx_free(ctx);
		return st;
	}
	*out = ctx;
	return CAI_OK;
}

/* Frees the context (NULL is fine). */
void
cai_forward_ctx_free(cai_forward_ctx *ctx)
{
	if (!ctx)
		return;
	if (ctx->be)
	{
		/* a weights cache file this context's weights are being written to is finished first */
		cai_model_wcache_join(ctx->model, ctx->be);
		const cai_backend_ops *ops = ctx->be->ops;

		ops->free(ctx->be, ctx->x);
		ops->free(ctx->be, ctx->xn);
		ops->free(ctx->be, ctx->xq);
		ops->free(ctx->be, ctx->xs);
		if (ctx->xsum)
			ops->free(ctx->be, ctx->xsum);
		if (ctx->digit_out)
			ops->free(ctx->be, ctx->digit_out);
		ops->free(ctx->be, ctx->qkv);
		ops->free(ctx->be, ctx->att);
		ops->free(ctx->be, ctx->gate_up);
		ops->free(ctx->be, ctx->rope_cs);
		if (ctx->rope_cs_windowed)
			ops->free(ctx->be, ctx->rope_cs_windowed);
		ops->free(ctx->be, ctx->xg);
		cai_backend_free(ctx->be);
	}
	cai_forward_unbind_weights(ctx);
	free(ctx->ids);
	free(ctx->pos);
	free(ctx->seq);
	free(ctx->logit_rows);
	free(ctx->seq_start);
	free(ctx->seq_len);
	free(ctx->tables);
	free(ctx->embed_seq);
	free(ctx->embed_first);
	free(ctx->embed_rows);
	free(ctx->attn_pos);
	free(ctx->shadow.data);
	free(ctx->shadow_valid);
	free(ctx);
}

/* Grows the float KV shadow to cover blocks [0, n_blocks). */
static cai_status
shadow_reserve(cai_forward_ctx *ctx, const cai_kv_layout *L, int n_blocks, cai_error *err)
{
	size_t		layer_floats = (size_t) 2 * CAI_KV_BLOCK_TOKENS * L->n_kv_heads * L->head_dim;
	size_t		block_floats = layer_floats * L->n_kv_layers;
	size_t		bytes;
	float	   *data;
	uint8_t    *valid;

	if (n_blocks <= ctx->shadow.n_blocks)
		return CAI_OK;
	if (!cai_mul_size((size_t) n_blocks, block_floats * sizeof(float), &bytes))
		return cai_fail(err, CAI_ERR_NO_MEMORY, "float kv shadow size overflows");
	data = realloc(ctx->shadow.data, bytes);
	if (!data)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory growing the float kv shadow");
	ctx->shadow.data = data;
	valid = realloc(ctx->shadow_valid, (size_t) n_blocks * CAI_KV_BLOCK_TOKENS);
	if (!valid)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory growing the float kv shadow");
	memset(valid + (size_t) ctx->shadow.n_blocks * CAI_KV_BLOCK_TOKENS, 0,
		   (size_t) (n_blocks - ctx->shadow.n_blocks) * CAI_KV_BLOCK_TOKENS);
	ctx->shadow_valid = valid;
	ctx->shadow.n_blocks = n_blocks;
	ctx->shadow.layer_floats = layer_floats;
	ctx->shadow.block_floats = block_floats;
	return CAI_OK;
}

/*
 * After the logit rows (R of them), the rows each embedded sequence pools: all of its rows
 * for mean pooling, its first or its last.  A model that is not causal lets an embedded text's
 * tokens attend to the whole text: each attends up to the text's last position.  Returns the
 * output rows in all.
 */
static int
layout_embed_rows(const cai_model *model, cai_forward_ctx *ctx, const cai_batch_seq *seqs,
				  int n_embed, int R)
{
	const cai_config *c = &model->cfg;

	ctx->n_logit_rows = R;
	ctx->n_embed = n_embed;
	ctx->bidirectional = false;
	for (int i = 0; i < n_embed; i++)
	{
		int			s = ctx->embed_seq[i];
		int			first = ctx->seq_start[s];
		int			n = seqs[s].n_tokens;

		ctx->embed_first[i] = R;
		if (c->pooling == CAI_POOLING_CLS)
			ctx->logit_rows[R++] = first;
		else if (c->pooling == CAI_POOLING_LAST)
			ctx->logit_rows[R++] = first + n - 1;
		else
			for (int t = 0; t < n; t++)
				ctx->logit_rows[R++] = first + t;
		ctx->embed_rows[i] = R - ctx->embed_first[i];
		if (!c->causal && n > 1)
		{
			for (int t = 0; t < n; t++)
				ctx->attn_pos[first + t] = n - 1;
			ctx->bidirectional = true;
		}
	}
	return R;
}

/* Checks the batch and lays it out per token; counts the rows that need logits. */
cai_status
cai_forward_layout_batch(const cai_model *model, cai_forward_ctx *ctx, cai_kv_pool *kv,
			 const cai_batch_seq *seqs, int n_seqs, int *n_tokens, int *n_rows, cai_error *err)
{
	int			T = 0;
	int			R = 0;
	int			n_embed = 0;
	int			pool_blocks = cai_kv_pool_n_blocks(kv);
	const cai_kv_layout *L = cai_kv_pool_layout(kv);

	if (n_seqs < 1 || !seqs)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "a forward needs at least one sequence");
	for (int s = 0; s < n_seqs; s++)
	{
		const cai_batch_seq *q = &seqs[s];
		int			end;

		if (q->n_tokens < 1 || !q->tokens)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "sequence %d brings no tokens", s);
		if (q->n_tokens > ctx->max_tokens - T)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"the batch has more than the %d tokens this forward context holds",
							ctx->max_tokens);
		if (q->pos < 0 || q->pos > ctx->max_context - q->n_tokens)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"sequence %d reaches position %lld, past the context of %d", s,
							(long long) q->pos + q->n_tokens, ctx->max_context);
		end = q->pos + q->n_tokens;
		if (!q->block_table || q->n_blocks < (end + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"sequence %d's block table does not cover position %d", s, end - 1);
		for (int b = 0; b < (end + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS; b++)
			if (q->block_table[b] < 0 || q->block_table[b] >= pool_blocks)
				return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
								"sequence %d uses kv block %d, outside the pool", s,
								q->block_table[b]);
		/* the windowed layers read back to window_lo and write to end - 1 */
		if (L->n_windowed_layers > 0)
		{
			int			window_lo = q->pos - L->window + 1 > 0 ? q->pos - L->window + 1 : 0;

			for (int b = window_lo / CAI_KV_BLOCK_TOKENS; b <= (end - 1) / CAI_KV_BLOCK_TOKENS; b++)
				if (!cai_kv_block_has_window(kv, q->block_table[b]))
					return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
									"sequence %d's kv block %d has no window part for position %d",
									s, q->block_table[b], b * CAI_KV_BLOCK_TOKENS);
		}
		if (q->logits != CAI_LOGITS_NONE && q->logits != CAI_LOGITS_LAST &&
			q->logits != CAI_LOGITS_ALL && q->logits != CAI_LOGITS_EMBED)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "sequence %d has an unknown logits mode", s);
		if (q->logits == CAI_LOGITS_EMBED && q->pos != 0)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"sequence %d is embedded from position %d: a text is embedded whole",
							s, q->pos);

		ctx->seq_start[s] = T;
		ctx->seq_len[s] = q->n_tokens;
		ctx->tables[s] = q->block_table;
		for (int i = 0; i < q->n_tokens; i++)
		{
			int32_t		id = q->tokens[i];

			if (id < 0 || id >= model->cfg.n_vocab)
				return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
								"token id %d is outside the vocabulary of %d", id, model->cfg.n_vocab);
			ctx->ids[T] = id;
			ctx->pos[T] = q->pos + i;
			ctx->attn_pos[T] = q->pos + i;
			ctx->seq[T] = s;
			if (q->logits == CAI_LOGITS_ALL || (q->logits == CAI_LOGITS_LAST && i == q->n_tokens - 1))
				ctx->logit_rows[R++] = T;
			T++;
		}
		if (q->logits == CAI_LOGITS_EMBED)
			ctx->embed_seq[n_embed++] = s;
	}
	*n_tokens = T;
	*n_rows = layout_embed_rows(model, ctx, seqs, n_embed, R);
	return CAI_OK;
}

/* Reference path bookkeeping: grow the shadow, check and mark which positions it holds. */
cai_status
cai_forward_shadow_prepare(cai_forward_ctx *ctx, cai_kv_pool *kv, const cai_batch_seq *seqs,
						   int n_seqs, bool float_reference, cai_error *err)
{
	if (float_reference)
	{
		int			max_block = -1;
		cai_status	st;

		for (int s = 0; s < n_seqs; s++)
		{
			int			nb = (seqs[s].pos + seqs[s].n_tokens + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS;

			for (int b = 0; b < nb; b++)
				if (seqs[s].block_table[b] > max_block)
					max_block = seqs[s].block_table[b];
		}
		if ((st = shadow_reserve(ctx, cai_kv_pool_layout(kv), max_block + 1, err)) != CAI_OK)
			return st;
		for (int s = 0; s < n_seqs; s++)
		{
			for (int p = 0; p < seqs[s].pos; p++)
			{
				int32_t		b = seqs[s].block_table[p / CAI_KV_BLOCK_TOKENS];

				if (!ctx->shadow_valid[(size_t) b * CAI_KV_BLOCK_TOKENS + p % CAI_KV_BLOCK_TOKENS])
					return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
									"the float reference path needs every earlier position of a "
									"sequence computed on that path (position %d was not)", p);
			}
		}
	}
	if (!ctx->shadow_valid)
		return CAI_OK;
	for (int s = 0; s < n_seqs; s++)
	{
		for (int p = seqs[s].pos; p < seqs[s].pos + seqs[s].n_tokens; p++)
		{
			int32_t		b = seqs[s].block_table[p / CAI_KV_BLOCK_TOKENS];

			if (b < ctx->shadow.n_blocks)
				ctx->shadow_valid[(size_t) b * CAI_KV_BLOCK_TOKENS + p % CAI_KV_BLOCK_TOKENS] =
					float_reference;
		}
	}
	return CAI_OK;
}

/* The rotary embedding of this model's global layers or of its windowed ones. */
void
cai_model_rope_params(const cai_model *model, bool windowed, cai_rope_params *rope)
{
	rope->n_rot = model->cfg.n_rot;
	rope->base = model->cfg.rope_base;
	rope->freq_scale = model->cfg.rope_freq_scale;
	rope->neox = model->cfg.rope_neox;
	rope->freq_factors = model->rope_freqs;
	if (windowed && model->cfg.rope_base_windowed > 0.0f)
	{
		/* the windowed layers' own RoPE: its base, unscaled (arch.h's cai_arch_rope) */
		rope->base = model->cfg.rope_base_windowed;
		rope->freq_scale = 1.0f;
		rope->freq_factors = NULL;
	}
}

/* Scales the embeddings in ctx->x and fills the rotary tables for ctx->pos. */
void
cai_forward_prepare(const cai_model *model, cai_forward_ctx *ctx, int n_tok)
{
	const cai_config *c = &model->cfg;
	cai_backend *be = ctx->be;
	cai_rope_params rope;

	if (c->embed_scale != 1.0f)
		be->ops->scale(be, ctx->x, n_tok, c->d_model, c->embed_scale);
	cai_model_rope_params(model, false, &rope);
	be->ops->rope_prepare(be, &rope, ctx->pos, n_tok, ctx->rope_cs);
	if (ctx->rope_cs_windowed)
	{
		cai_model_rope_params(model, true, &rope);
		be->ops->rope_prepare(be, &rope, ctx->pos, n_tok, ctx->rope_cs_windowed);
	}
}

/*
 * out = [out +] ctx->xq W (+ bias) for the n rows of a GEMM input quantized into ctx->xq, xs
 * from x [n, k]; with two-digit activations, then out += (x's second digit) W (forward.c's
 * header).
 */
static void
gemm_input(cai_forward_ctx *ctx, const float *x, int n, int k, const cai_weight *w, int n_out,
		   const float *bias, float *out, int ldo, bool accumulate)
{
	cai_backend *be = ctx->be;
	const cai_backend_ops *op = be->ops;
	int8_t	   *q = ctx->xq;
	float	   *s = ctx->xs;

	if (!ctx->model->two_digit_activations)
	{
		op->gemm_i8(be, q, s, n, w, n_out, bias, out, ldo, accumulate);
		return;
	}
	/* the second digits right after the first: one GEMM can take both as its rows */
	op->quantize_second_digit(be, x, n, k, q, s, q + (size_t) n * k, s + n);
	if (ctx->digit_out && (size_t) 2 * n * n_out <= ctx->digit_out_floats)
	{
		op->gemm_i8(be, q, s, 2 * n, w, n_out, NULL, ctx->digit_out, n_out, false);
		op->add_digits(be, ctx->digit_out, n, n_out, bias, out, ldo, accumulate);
		return;
	}
	op->gemm_i8(be, q, s, n, w, n_out, bias, out, ldo, accumulate);
	op->gemm_i8(be, q + (size_t) n * k, s + n, n, w, n_out, NULL, out, ldo, true);
}

/* The int8 path's rotation of a GEMM input of `width` per row, quantized into ctx->xq, xs. */
static cai_then_rotate
gemm_input_rotation(cai_forward_ctx *ctx, const cai_rotation *rot, int width)
{
	return (cai_then_rotate) {.rot = rot, .n_vec = width / rot->n, .q = ctx->xq, .s = ctx->xs};
}

/* The attention parameters of layer l. */
static cai_attn_params
layer_attn_params(const cai_config *c, int l)
{
	cai_attn_params ap;

	ap.n_heads = c->n_heads;
	ap.n_kv_heads = c->n_kv_heads;
	ap.head_dim = c->head_dim;
	ap.window = c->attn_window[l];
	ap.kv_layer = c->kv_index[l];
	ap.scale = c->arch->attention.scale > 0.0f ? c->arch->attention.scale :
		1.0f / sqrtf((float) c->head_dim);
	return ap;
}

/*
 * The part of a layer both paths share, from the projected q, k, v rows in ctx->qkv to the
 * attention output in ctx->att: per-head query and key norms (Qwen3, Gemma 3), RoPE, the KV
 * write (a layer reading another's KV writes none) and attention.  to_heads (the int8 path)
 * also rotates every q and k head after RoPE, which leaves their dot products as they were
 * (calibrate.c's "rotations"); shadow (the float path) is the float copy of the KV it reads.
 *
 * On both paths q and k arrive here in the source's basis: the int8 path's smoothing acts on
 * the GEMM's input channels and its head rotation comes after RoPE, so the source norm weights
 * apply as they are.
 */
static void
layer_attention(const cai_model *model, cai_forward_ctx *ctx, cai_kv_pool *kv,
				const cai_batch_layout *batch, int l, const cai_then_rotate *to_heads,
				const cai_kv_shadow *shadow)
{
	const cai_config *c = &model->cfg;
	const cai_layer_operands *w = &ctx->w.layers[l];
	cai_backend *be = ctx->be;
	const cai_backend_ops *op = be->ops;
	const int	T = batch->n_tokens;
	const int	q_dim = c->n_heads * c->head_dim;
	const int	kv_dim = c->n_kv_heads * c->head_dim;
	const int	qkv_w = ctx->qkv_width;
	const bool	owns_kv = c->kv_source[l] == l;
	const int	n_qk_heads = owns_kv ? c->n_heads + c->n_kv_heads : c->n_heads;
	const bool	own_rope = c->attn_window[l] > 0 && ctx->rope_cs_windowed;
	float	   *q = ctx->qkv;
	float	   *k = ctx->qkv + q_dim;
	float	   *v = ctx->qkv + q_dim + kv_dim;
	cai_attn_params ap = layer_attn_params(c, l);
	cai_rope_params rope;

	if (c->qk_norm)
	{
		op->head_rmsnorm(be, q, qkv_w, T, c->n_heads, c->head_dim, w->attn_q_norm, c->norm_eps);
		if (owns_kv)
			op->head_rmsnorm(be, k, qkv_w, T, c->n_kv_heads, c->head_dim, w->attn_k_norm,
							 c->norm_eps);
	}
	cai_model_rope_params(model, own_rope, &rope);
	op->rope(be, &rope, own_rope ? ctx->rope_cs_windowed : ctx->rope_cs, q, qkv_w, T,
			 n_qk_heads, c->head_dim, to_heads);
	if (owns_kv)
		op->kv_write(be, &ap, batch, k, v, qkv_w, kv, shadow);
	if (ctx->bidirectional)
	{
		/* the same batch, each token attending up to its attn_pos (written just above) */
		cai_batch_layout both_ways = *batch;

		both_ways.token_pos = ctx->attn_pos;
		op->attention(be, &ap, &both_ways, q, qkv_w, kv, shadow, ctx->att, q_dim);
	}
	else
		op->attention(be, &ap, batch, q, qkv_w, kv, shadow, ctx->att, q_dim);
}

/*
 * The rows the rest of a layer works on.  In the last layer (out_rows) only those rows'
 * outputs are wanted: every row has written its K/V and attended, but the output projection and
 * the FFN run on the n_out_rows rows alone, gathered with their attention outputs into ctx->xg
 * and ctx->qkv (free again).  Returns the number of rows: T, or n_out_rows.
 */
static int
layer_output_rows(cai_forward_ctx *ctx, const cai_config *c, int T, const int32_t *out_rows,
				  int n_out_rows, float **x, float **att)
{
	cai_backend *be = ctx->be;

	*x = ctx->x;
	*att = ctx->att;
	if (!out_rows)
		return T;
	be->ops->gather_rows(be, ctx->x, c->d_model, out_rows, n_out_rows, ctx->xg);
	be->ops->gather_rows(be, ctx->att, c->n_heads * c->head_dim, out_rows, n_out_rows, ctx->qkv);
	*x = ctx->xg;
	*att = ctx->qkv;
	return n_out_rows;
}

/*
 * One transformer layer on the int8 path over the batch's T rows of ctx->x (in place): every
 * GEMM input is normed or activated, rotated and quantized by the operation that writes it,
 * and the GEMMs run on int8.  A sandwiched sublayer (Gemma 3) writes its output to ctx->gate_up
 * (free until the FFN) and norms it on its way into x.  out_rows: layer_output_rows.
 */
void
cai_forward_layer_int8(const cai_model *model, cai_forward_ctx *ctx, cai_kv_pool *kv,
					   const cai_batch_layout *batch, int l, const int32_t *out_rows,
					   int n_out_rows)
{
	const cai_config *c = &model->cfg;
	const cai_layer_operands *w = &ctx->w.layers[l];
	cai_backend *be = ctx->be;
	const cai_backend_ops *op = be->ops;
	const int	T = batch->n_tokens;
	const int	d = c->d_model;
	const int	q_dim = c->n_heads * c->head_dim;
	const int	d_ff = c->d_ff;
	const bool	owns_kv = c->kv_source[l] == l;
	const int	n_qk_heads = owns_kv ? c->n_heads + c->n_kv_heads : c->n_heads;
	float	   *sub_out = ctx->gate_up;
	float	   *x,
			   *att;
	int			n;

	/* the rotations of calibrate.c, done by the operation that writes the rows */
	const cai_then_rotate to_model = gemm_input_rotation(ctx, &ctx->w.rot_model, d);
	const cai_then_rotate to_ff = gemm_input_rotation(ctx, &ctx->w.rot_ff, d_ff);
	const cai_then_rotate to_heads = {.rot = &ctx->w.rot_head,
	.n_vec = n_qk_heads * c->head_dim / ctx->w.rot_head.n};

	/* attention: the q, k, v projections (a layer reading another's KV computes q only) */
	op->rmsnorm(be, ctx->x, w->attn_norm_i8, T, d, c->norm_eps, ctx->xn, &to_model);
	gemm_input(ctx, ctx->xn, T, d, w->wqkv, owns_kv ? ctx->qkv_width : q_dim, w->bqkv_i8,
			   ctx->qkv, ctx->qkv_width, false);
	layer_attention(model, ctx, kv, batch, l, &to_heads, NULL);
	if ((n = layer_output_rows(ctx, c, T, out_rows, n_out_rows, &x, &att)) == 0)
		return;

	/* x += the attention output projection */
	op->quantize(be, att, n, q_dim, ctx->xq, ctx->xs);
	gemm_input(ctx, att, n, q_dim, w->wo, d, NULL, c->sandwich_norm ? sub_out : x, d,
			   !c->sandwich_norm);
	if (c->sandwich_norm)
		op->rmsnorm_add(be, sub_out, w->attn_post_norm, n, d, c->norm_eps, x);

	/* x += down(act(gate(x)) * up(x)) */
	op->rmsnorm(be, x, w->ffn_norm_i8, n, d, c->norm_eps, ctx->xn, &to_model);
	gemm_input(ctx, ctx->xn, n, d, w->w_gate_up, 2 * d_ff, NULL, ctx->gate_up, 2 * d_ff, false);
	if (c->ffn_act == CAI_ACT_GEGLU)
		op->geglu(be, ctx->gate_up, n, d_ff, ctx->xn, &to_ff);
	else
		op->swiglu(be, ctx->gate_up, n, d_ff, ctx->xn, &to_ff);
	gemm_input(ctx, ctx->xn, n, d_ff, w->w_down, d, NULL, c->sandwich_norm ? sub_out : x, d,
			   !c->sandwich_norm);
	if (c->sandwich_norm)
		op->rmsnorm_add(be, sub_out, w->ffn_post_norm, n, d, c->norm_eps, x);
}

/* out = [out +] x W (+ bias) on the file path: x [n, k] quantized per block, then the GEMM. */
static void
file_gemm(cai_forward_ctx *ctx, const float *x, int n, int k, const cai_weight *w, int n_out,
		  const float *bias, float *out, int ldo, bool accumulate)
{
	cai_backend *be = ctx->be;

	const bool	superblocks = ctx->model->superblock_activations;

	be->ops->quantize_blocks(be, x, n, k, w, superblocks, ctx->xq, ctx->xs, ctx->xsum);
	be->ops->gemm_blocks(be, ctx->xq, ctx->xs, ctx->xsum, n, w, superblocks, n_out, bias, out, ldo,
						 accumulate);
}

/*
 * One transformer layer on the file path over the batch's T rows of ctx->x (in place): the
 * GEMMs multiply the file's own weight levels by activations quantized per block of 32, so the
 * norms, biases and projections are the source's (no smoothing, no rotation of the inputs);
 * only the query and key heads are rotated after RoPE, for the int8 KV (a rotation both share
 * leaves their dot products as they were).  Otherwise the int8 layer's structure.
 */
void
cai_forward_layer_file(const cai_model *model, cai_forward_ctx *ctx, cai_kv_pool *kv,
					   const cai_batch_layout *batch, int l, const int32_t *out_rows,
					   int n_out_rows)
{
	const cai_config *c = &model->cfg;
	const cai_layer_operands *w = &ctx->w.layers[l];
	cai_backend *be = ctx->be;
	const cai_backend_ops *op = be->ops;
	const int	T = batch->n_tokens;
	const int	d = c->d_model;
	const int	q_dim = c->n_heads * c->head_dim;
	const int	d_ff = c->d_ff;
	const bool	owns_kv = c->kv_source[l] == l;
	const int	n_qk_heads = owns_kv ? c->n_heads + c->n_kv_heads : c->n_heads;
	const cai_then_rotate to_heads = {.rot = &ctx->w.rot_head,
	.n_vec = n_qk_heads * c->head_dim / ctx->w.rot_head.n};
	float	   *sub_out = ctx->gate_up;
	float	   *x,
			   *att;
	int			n;

	/* attention: the q, k, v projections (a layer reading another's KV computes q only) */
	op->rmsnorm(be, ctx->x, w->attn_norm, T, d, c->norm_eps, ctx->xn, NULL);
	file_gemm(ctx, ctx->xn, T, d, w->wqkv, owns_kv ? ctx->qkv_width : q_dim, w->bqkv, ctx->qkv,
			  ctx->qkv_width, false);
	layer_attention(model, ctx, kv, batch, l, &to_heads, NULL);
	if ((n = layer_output_rows(ctx, c, T, out_rows, n_out_rows, &x, &att)) == 0)
		return;

	/* x += the attention output projection */
	file_gemm(ctx, att, n, q_dim, w->wo, d, NULL, c->sandwich_norm ? sub_out : x, d,
			  !c->sandwich_norm);
	if (c->sandwich_norm)
		op->rmsnorm_add(be, sub_out, w->attn_post_norm, n, d, c->norm_eps, x);

	/* x += down(act(gate(x)) * up(x)) */
	op->rmsnorm(be, x, w->ffn_norm, n, d, c->norm_eps, ctx->xn, NULL);
	file_gemm(ctx, ctx->xn, n, d, w->w_gate_up, 2 * d_ff, NULL, ctx->gate_up, 2 * d_ff, false);
	if (c->ffn_act == CAI_ACT_GEGLU)
		op->geglu(be, ctx->gate_up, n, d_ff, ctx->xn, NULL);
	else
		op->swiglu(be, ctx->gate_up, n, d_ff, ctx->xn, NULL);
	file_gemm(ctx, ctx->xn, n, d_ff, w->w_down, d, NULL, c->sandwich_norm ? sub_out : x, d,
			  !c->sandwich_norm);
	if (c->sandwich_norm)
		op->rmsnorm_add(be, sub_out, w->ffn_post_norm, n, d, c->norm_eps, x);
}

/* Shows a GEMM input of the float path to its observer, if any. */
static inline void
observe(const cai_forward_observer *obs, cai_forward_tap tap, const float *x, int n, int width)
{
	if (obs)
		obs->tap(obs->arg, tap, x, n, width);
}

/*
 * One transformer layer on the float reference path over the batch's T rows of ctx->x (in
 * place), in the source's basis with float GEMMs and the float shadow of the KV.  obs, if not
 * NULL, sees each GEMM's input as it is computed (the calibration's inputs: calibrate.c).
 * Sandwiched sublayers and out_rows as cai_forward_layer_int8.
 */
void
cai_forward_layer_float(const cai_model *model, cai_forward_ctx *ctx, cai_kv_pool *kv,
						const cai_batch_layout *batch, int l, const cai_forward_observer *obs,
						const int32_t *out_rows, int n_out_rows)
{
	const cai_config *c = &model->cfg;
	const cai_layer_operands *w = &ctx->w.layers[l];
	cai_backend *be = ctx->be;
	const cai_backend_ops *op = be->ops;
	const int	T = batch->n_tokens;
	const int	d = c->d_model;
	const int	q_dim = c->n_heads * c->head_dim;
	const int	kv_dim = c->n_kv_heads * c->head_dim;
	const int	qkv_w = ctx->qkv_width;
	const int	d_ff = c->d_ff;
	float	   *sub_out = ctx->gate_up;
	float	   *x,
			   *att;
	int			n;

	/* attention: the q, k, v projections (a layer reading another's KV computes q only) */
	op->rmsnorm(be, ctx->x, w->attn_norm, T, d, c->norm_eps, ctx->xn, NULL);
	observe(obs, CAI_TAP_ATTN_IN, ctx->xn, T, d);
	op->gemm_f32(be, ctx->xn, T, d, w->f_wq, q_dim, w->bq, ctx->qkv, qkv_w, false);
	if (c->kv_source[l] == l)
	{
		op->gemm_f32(be, ctx->xn, T, d, w->f_wk, kv_dim, w->bk, ctx->qkv + q_dim, qkv_w, false);
		op->gemm_f32(be, ctx->xn, T, d, w->f_wv, kv_dim, w->bv, ctx->qkv + q_dim + kv_dim, qkv_w,
					 false);
	}
	layer_attention(model, ctx, kv, batch, l, NULL, &ctx->shadow);
	if ((n = layer_output_rows(ctx, c, T, out_rows, n_out_rows, &x, &att)) == 0)
		return;

	/* x += the attention output projection */
	observe(obs, CAI_TAP_WO_IN, att, n, q_dim);
	op->gemm_f32(be, att, n, q_dim, w->f_wo, d, NULL, c->sandwich_norm ? sub_out : x, d,
				 !c->sandwich_norm);
	if (c->sandwich_norm)
		op->rmsnorm_add(be, sub_out, w->attn_post_norm, n, d, c->norm_eps, x);

	/* x += down(act(gate(x)) * up(x)) */
	op->rmsnorm(be, x, w->ffn_norm, n, d, c->norm_eps, ctx->xn, NULL);
	observe(obs, CAI_TAP_FFN_IN, ctx->xn, n, d);
	op->gemm_f32(be, ctx->xn, n, d, w->f_gate, d_ff, NULL, ctx->gate_up, 2 * d_ff, false);
	op->gemm_f32(be, ctx->xn, n, d, w->f_up, d_ff, NULL, ctx->gate_up + d_ff, 2 * d_ff, false);
	if (c->ffn_act == CAI_ACT_GEGLU)
		op->geglu(be, ctx->gate_up, n, d_ff, ctx->xn, NULL);
	else
		op->swiglu(be, ctx->gate_up, n, d_ff, ctx->xn, NULL);
	observe(obs, CAI_TAP_DOWN_IN, ctx->xn, n, d_ff);
	op->gemm_f32(be, ctx->xn, n, d_ff, w->f_down, d, NULL, c->sandwich_norm ? sub_out : x, d,
				 !c->sandwich_norm);
	if (c->sandwich_norm)
		op->rmsnorm_add(be, sub_out, w->ffn_post_norm, n, d, c->norm_eps, x);
}

/* Fills a batch layout from the context's per-token arrays (after cai_forward_layout_batch). */
void
cai_forward_batch_from_ctx(cai_forward_ctx *ctx, int T, int n_seqs, cai_batch_layout *batch)
{
	batch->n_tokens = T;
	batch->n_seqs = n_seqs;
	batch->token_pos = ctx->pos;
	batch->token_seq = ctx->seq;
	batch->seq_start = ctx->seq_start;
	batch->seq_len = ctx->seq_len;
	batch->block_tables = ctx->tables;
}

/* The embeddings of the T tokens into ctx->x, on either path. */
static void
embed_tokens(cai_forward_ctx *ctx, int d, int T, bool f)
{
	cai_backend *be = ctx->be;

	if (f)
	{
		be->ops->embed_f32(be, ctx->w.f_tok_embd, d, ctx->ids, T, ctx->x);
		return;
	}
	if (ctx->w.file)
	{
		be->ops->embed_blocks(be, ctx->w.file_embd, ctx->ids, T, ctx->x);
		return;
	}
	be->ops->embed_i8(be, &ctx->w.tok_embd, ctx->ids, T, ctx->x);
	if (ctx->w.tok_embd_second_digit.q)
		be->ops->embed_i8_add(be, &ctx->w.tok_embd_second_digit, ctx->ids, T, ctx->x);
}

/* The logits of the R rows in ctx->xg (the last layer's output rows), on either path. */
static void
output_logits(const cai_model *model, cai_forward_ctx *ctx, int R, bool f, float *logits)
{
	const cai_config *c = &model->cfg;
	cai_backend *be = ctx->be;
	const int	d = c->d_model;

	if (f)
	{
		be->ops->rmsnorm(be, ctx->xg, ctx->w.out_norm, R, d, c->norm_eps, ctx->xn, NULL);
		be->ops->gemm_f32(be, ctx->xn, R, d, ctx->w.f_lm_head, c->n_vocab, NULL, logits,
						  c->n_vocab, false);
	}
	else if (ctx->w.file)
	{
		be->ops->rmsnorm(be, ctx->xg, ctx->w.out_norm, R, d, c->norm_eps, ctx->xn, NULL);
		file_gemm(ctx, ctx->xn, R, d, ctx->w.lm_head, c->n_vocab, NULL, logits, c->n_vocab, false);
	}
	else
	{
		const cai_then_rotate to_model = gemm_input_rotation(ctx, &ctx->w.rot_model, d);

		be->ops->rmsnorm(be, ctx->xg, ctx->w.out_norm_i8, R, d, c->norm_eps, ctx->xn, &to_model);
		gemm_input(ctx, ctx->xn, R, d, ctx->w.lm_head, c->n_vocab, NULL, logits, c->n_vocab,
				   false);
	}
}

void
cai_pool_embedding(const float *rows, int n, int d, cai_pooling pooling, float *out)
{
	double		sumsq = 0.0;
	double		inv;

	for (int j = 0; j < d; j++)
	{
		double		acc = 0.0;

		if (pooling == CAI_POOLING_CLS)
			acc = rows[j];
		else if (pooling == CAI_POOLING_LAST)
			acc = rows[(size_t) (n - 1) * d + j];
		else
		{
			for (int t = 0; t < n; t++)
				acc += rows[(size_t) t * d + j];
			acc /= n;
		}
		out[j] = (float) acc;
		sumsq += acc * acc;
	}
	/* a zero vector stays zero: no direction to keep */
	inv = sumsq > 0.0 ? 1.0 / sqrt(sumsq) : 0.0;
	for (int j = 0; j < d; j++)
		out[j] = (float) (out[j] * inv);
}

/*
 * The embedded sequences' vectors: their pooled rows of ctx->xg (after the logit rows) through
 * the output norm (the source's weights: the residual stream is in the source's basis on every
 * path), pooled and normalized into the rows after the logits' (model.h).  The normed rows are
 * read on the host: forward refuses embeddings on a backend whose memory is not.
 */
static void
output_embeddings(const cai_model *model, cai_forward_ctx *ctx, float *logits)
{
	const cai_config *c = &model->cfg;
	cai_backend *be = ctx->be;
	const int	d = c->d_model;
	const int	R0 = ctx->n_logit_rows;
	int			n_rows = 0;

	for (int i = 0; i < ctx->n_embed; i++)
		n_rows += ctx->embed_rows[i];
	be->ops->rmsnorm(be, ctx->xg + (size_t) R0 * d, ctx->w.out_norm, n_rows, d, c->norm_eps,
					 ctx->xn, NULL);
	for (int i = 0; i < ctx->n_embed; i++)
		cai_pool_embedding(ctx->xn + (size_t) (ctx->embed_first[i] - R0) * d,
						   ctx->embed_rows[i], d, c->pooling,
						   logits + (size_t) (R0 + i) * c->n_vocab);
}

/*
 * A step's operations on the int8 path or the float reference path (f): the embeddings and
 * rotary angles of its T tokens, the layers (the last one only for the R rows that need logits,
 * in ctx->xg), and those rows' logits.
 */
static void
forward_step(const cai_model *model, cai_forward_ctx *ctx, cai_kv_pool *kv,
			 const cai_batch_layout *batch, bool f, int R, float *logits)
{
	const cai_config *c = &model->cfg;
	const int	T = batch->n_tokens;

	embed_tokens(ctx, c->d_model, T, f);
	cai_forward_prepare(model, ctx, T);
	for (int l = 0; l < c->n_layers; l++)
	{
		const int32_t *out_rows = l == c->n_layers - 1 ? ctx->logit_rows : NULL;

		if (f)
			cai_forward_layer_float(model, ctx, kv, batch, l, NULL, out_rows, R);
		else if (ctx->w.file)
			cai_forward_layer_file(model, ctx, kv, batch, l, out_rows, R);
		else
			cai_forward_layer_int8(model, ctx, kv, batch, l, out_rows, R);
	}
	if (ctx->n_logit_rows > 0)
		output_logits(model, ctx, ctx->n_logit_rows, f, logits);
	if (ctx->n_embed > 0)
		output_embeddings(model, ctx, logits);
}

/*
 * The forward over a ragged batch (model.h).  Checks the batch, lays it out per token and runs
 * the step's operations (forward_step), or has the backend replay a recorded decode step.
 */
cai_status
cai_model_forward(const cai_model *model, cai_forward_ctx *ctx, cai_kv_pool *kv,
				  const cai_batch_seq *seqs, int n_seqs, float *logits,
				  bool float_reference, cai_error *err)
{
	const cai_config *c = &model->cfg;
	cai_backend *be = ctx->be;
	const cai_backend_ops *op = be->ops;
	const cai_kv_layout *L = cai_kv_pool_layout(kv);
	cai_kv_layout want;
	const bool	f = float_reference;
	cai_batch_layout batch;
	cai_step_graph mode;
	int			T = 0,
				R = 0;
	cai_status	st;

	if (ctx->model != model)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "the forward context belongs to another model");
	if (f && !model->has_float_reference)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"the float reference path needs the model loaded with load_float_reference");
	if (!f && !ctx->w.int8 && !ctx->w.file)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"the forward context was made before the model's int8 weights were complete");
	cai_model_kv_layout(model, &want);
	if (L->n_kv_layers != want.n_kv_layers || L->n_kv_heads != want.n_kv_heads ||
		L->head_dim != want.head_dim || L->layer_bytes < want.layer_bytes ||
		L->n_windowed_layers != want.n_windowed_layers || L->window < want.window ||
		(L->key_digits == 2) != (want.key_digits == 2))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "the kv pool's layout does not fit the model");
	if ((st = cai_forward_layout_batch(model, ctx, kv, seqs, n_seqs, &T, &R, err)) != CAI_OK)
		return st;
	if (R > 0 && !logits)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "logits were requested but no buffer given");
	if (ctx->n_embed > 0 && (c->d_model > c->n_vocab || strcmp(op->name, "cpu") != 0 ||
							 (c->pooling != CAI_POOLING_MEAN && c->pooling != CAI_POOLING_CLS &&
							  c->pooling != CAI_POOLING_LAST)))
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						c->d_model > c->n_vocab ? "embeddings wider than the vocabulary are not supported" :
						strcmp(op->name, "cpu") != 0 ? "embeddings run on the cpu backend only" :
						"the model's pooling (%s) gives no embedding of a text",
						cai_pooling_name(c->pooling));
	if ((st = cai_forward_shadow_prepare(ctx, kv, seqs, n_seqs, f, err)) != CAI_OK)
		return st;
	cai_forward_batch_from_ctx(ctx, T, n_seqs, &batch);

	/*
	 * A decode step (every sequence one new token, so every row wants logits) may be a graph
	 * the backend recorded before: it then runs the whole step itself.
	 */
	mode = CAI_STEP_PLAIN;
	if (!f && op->step_graph_begin && R == T && T == n_seqs && ctx->n_embed == 0)
		mode = op->step_graph_begin(be, ctx, kv, &batch, ctx->ids, logits, c->n_vocab);
	if (mode != CAI_STEP_REPLAYED)
	{
		forward_step(model, ctx, kv, &batch, f, R, logits);
		/* a recording that failed ran nothing: the step again, as usual */
		if (mode == CAI_STEP_CAPTURE && !op->step_graph_end(be))
			forward_step(model, ctx, kv, &batch, f, R, logits);
	}
	/* an asynchronous backend reports its first failure here */
	if (op->sync)
		return op->sync(be, err);
	return CAI_OK;
}
