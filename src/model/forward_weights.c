/*
 * forward_weights.c — the model's weights made the forward context's backend's.
 *
 * The model holds its weights as loading produced them: int8 matrices row-major (weights.h) and
 * float arrays in host memory.  A context binds them once, when it is made: each GEMM operand
 * is prepared in the backend's own layout (prepare_i8: the CPU packs its panels, the CUDA
 * backend uploads) and every other array goes where the backend reads it (weight_data: the
 * host memory itself on the CPU, a device copy on a GPU).  The forward then passes only what
 * the binding returned, so a backend never maps a host address per call and never sees another
 * backend's layout.
 */
#include <stdlib.h>
#include <string.h>

#include "forward_internal.h"
#include "model_wcache.h"
#include "util.h"

/* Where the backend reads n floats of model memory at host; NULL for a NULL array. */
static cai_status
bind_floats(cai_backend *be, const float *host, size_t n, const float **out, cai_error *err)
{
	*out = NULL;
	if (!host)
		return CAI_OK;
	*out = be->ops->weight_data(be, host, n * sizeof(float), err);
	return *out ? CAI_OK : CAI_ERR_NO_MEMORY;
}

/* A rotation with its mixing table where the backend reads it. */
static cai_status
bind_rotation(cai_backend *be, const cai_rotation *host, cai_rotation *out, cai_error *err)
{
	*out = *host;
	if (host->n_mix <= 1 || !host->mix)
		return CAI_OK;
	return bind_floats(be, host->mix, (size_t) host->n_mix * host->n_mix, &out->mix, err);
}

cai_status
cai_forward_bind_layer(cai_forward_ctx *ctx, int l, cai_error *err)
{
	const cai_config *c = &ctx->model->cfg;
	const cai_layer_weights *w = &ctx->model->layers[l];
	cai_layer_operands *o = &ctx->w.layers[l];
	cai_backend *be = ctx->be;
	const size_t d = (size_t) c->d_model;
	const size_t hd = (size_t) c->head_dim;
	const size_t q_dim = (size_t) c->n_heads * hd;
	const size_t kv_dim = (size_t) c->n_kv_heads * hd;
	const size_t qkv = q_dim + 2 * kv_dim;
	const size_t d_ff = (size_t) c->d_ff;
	cai_status	st;

	if ((st = bind_floats(be, w->attn_norm, d, &o->attn_norm, err)) != CAI_OK ||
		(st = bind_floats(be, w->attn_norm_i8, d, &o->attn_norm_i8, err)) != CAI_OK ||
		(st = bind_floats(be, w->ffn_norm, d, &o->ffn_norm, err)) != CAI_OK ||
		(st = bind_floats(be, w->ffn_norm_i8, d, &o->ffn_norm_i8, err)) != CAI_OK ||
		(st = bind_floats(be, w->attn_q_norm, hd, &o->attn_q_norm, err)) != CAI_OK ||
		(st = bind_floats(be, w->attn_k_norm, hd, &o->attn_k_norm, err)) != CAI_OK ||
		(st = bind_floats(be, w->attn_post_norm, d, &o->attn_post_norm, err)) != CAI_OK ||
		(st = bind_floats(be, w->ffn_post_norm, d, &o->ffn_post_norm, err)) != CAI_OK ||
		(st = bind_floats(be, w->bqkv, qkv, &o->bqkv, err)) != CAI_OK ||
		(st = bind_floats(be, w->bqkv_i8, qkv, &o->bqkv_i8, err)) != CAI_OK ||
		(st = bind_floats(be, w->bq, q_dim, &o->bq, err)) != CAI_OK ||
		(st = bind_floats(be, w->bk, kv_dim, &o->bk, err)) != CAI_OK ||
		(st = bind_floats(be, w->bv, kv_dim, &o->bv, err)) != CAI_OK ||
		(st = bind_floats(be, w->f_wq, q_dim * d, &o->f_wq, err)) != CAI_OK ||
		(st = bind_floats(be, w->f_wk, kv_dim * d, &o->f_wk, err)) != CAI_OK ||
		(st = bind_floats(be, w->f_wv, kv_dim * d, &o->f_wv, err)) != CAI_OK ||
		(st = bind_floats(be, w->f_wo, d * q_dim, &o->f_wo, err)) != CAI_OK ||
		(st = bind_floats(be, w->f_gate, d_ff * d, &o->f_gate, err)) != CAI_OK ||
		(st = bind_floats(be, w->f_up, d_ff * d, &o->f_up, err)) != CAI_OK ||
		(st = bind_floats(be, w->f_down, d * d_ff, &o->f_down, err)) != CAI_OK)
		return st;
	return CAI_OK;
}

/* An int8 table read by rows: its q and scales where the backend keeps them (weight_data). */
static cai_status
bind_table(cai_backend *be, const cai_qmatrix *m, cai_qmatrix *out, cai_error *err)
{
	const void *q = be->ops->weight_data(be, m->q, (size_t) m->n_out * m->k, err);
	const void *scale = q ? be->ops->weight_data(be, m->scale, (size_t) m->n_out * sizeof(float),
												err) : NULL;

	if (!q || !scale)
		return CAI_ERR_NO_MEMORY;
	*out = *m;
	out->q = q;
	out->scale = scale;
	return CAI_OK;
}

/*
 * The n GEMM operands out of i8 (or blocks, i8 NULL): mapped from the model's weights cache
 * where it has one, else prepared by the backend (and the cache written when it has none yet).
 */
static cai_status
make_operands(cai_forward_ctx *ctx, const cai_qmatrix *const *i8, const cai_bmatrix *const *blocks,
			  int n, const cai_weight **out, cai_error *err)
{
	const cai_model *m = ctx->model;
	cai_backend *be = ctx->be;
	double		start = cai_now_seconds();
	bool		imported = false;
	cai_status	st;

	if (m->wcache && cai_model_wcache_state(m->wcache) == CAI_WEIGHTS_CACHE_MAPPED &&
		((st = cai_model_wcache_import(m, be, i8, blocks, n, out, &imported, err)) != CAI_OK ||
		 imported))
		return st;
	st = i8 ? be->ops->prepare_i8(be, i8, n, out, err) : be->ops->prepare_blocks(be, blocks, n, out, err);
	if (st == CAI_OK && m->wcache && cai_model_wcache_state(m->wcache) == CAI_WEIGHTS_CACHE_PENDING)
		cai_model_wcache_store(m, be, out, n, cai_now_seconds() - start);
	return st;
}

/*
 * Every GEMM operand of the model made in one call, in one order (the head, then each layer's
 * QKV, O, gate-up and down): the int8 matrices (prepare_i8), or the file's own (prepare_blocks).
 */
static cai_status
prepare_gemm_operands(cai_forward_ctx *ctx, bool file, cai_error *err)
{
	const cai_model *m = ctx->model;
	const int	n_layers = m->cfg.n_layers;
	const int	n = 1 + 4 * n_layers;
	const cai_qmatrix **i8 = file ? NULL : malloc((size_t) n * sizeof(*i8));
	const cai_bmatrix **blocks = file ? malloc((size_t) n * sizeof(*blocks)) : NULL;
	const cai_weight **out = calloc((size_t) n, sizeof(*out));
	cai_status	st;

	if (!out || (file ? !blocks : !i8))
		st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory preparing the weights");
	else if (file)
	{
		blocks[0] = &m->file_head;
		for (int l = 0; l < n_layers; l++)
		{
			const cai_layer_weights *w = &m->layers[l];

			blocks[1 + 4 * l] = &w->file_qkv;
			blocks[2 + 4 * l] = &w->file_o;
			blocks[3 + 4 * l] = &w->file_gate_up;
			blocks[4 + 4 * l] = &w->file_down;
		}
		st = make_operands(ctx, NULL, blocks, n, out, err);
	}
	else
	{
		i8[0] = &m->lm_head;
		for (int l = 0; l < n_layers; l++)
		{
			const cai_layer_weights *w = &m->layers[l];

			i8[1 + 4 * l] = &w->wqkv;
			i8[2 + 4 * l] = &w->wo;
			i8[3 + 4 * l] = &w->w_gate_up;
			i8[4 + 4 * l] = &w->w_down;
		}
		st = make_operands(ctx, i8, NULL, n, out, err);
	}
	if (st == CAI_OK)
	{
		ctx->w.lm_head = out[0];
		for (int l = 0; l < n_layers; l++)
		{
			ctx->w.layers[l].wqkv = out[1 + 4 * l];
			ctx->w.layers[l].wo = out[2 + 4 * l];
			ctx->w.layers[l].w_gate_up = out[3 + 4 * l];
			ctx->w.layers[l].w_down = out[4 + 4 * l];
		}
	}
	free(i8);
	free(blocks);
	free(out);
	return st;
}

/* The int8 path's operands: the GEMM matrices prepared, the embedding as data. */
static cai_status
bind_int8(cai_forward_ctx *ctx, cai_error *err)
{
	const cai_model *m = ctx->model;
	cai_backend *be = ctx->be;
	cai_status	st;

	if ((st = prepare_gemm_operands(ctx, false, err)) != CAI_OK)
		return st;
	/* the embedding is read by rows, as the model holds it (and its second digits) */
	if ((st = bind_table(be, &m->tok_embd, &ctx->w.tok_embd, err)) != CAI_OK)
		return st;
	if (m->tok_embd_second_digit.q &&
		(st = bind_table(be, &m->tok_embd_second_digit, &ctx->w.tok_embd_second_digit, err)) != CAI_OK)
		return st;
	ctx->w.int8 = true;
	return CAI_OK;
}

/* The file path's operands: every block matrix repacked; the embedding read where the model maps it. */
static cai_status
bind_file(cai_forward_ctx *ctx, cai_error *err)
{
	cai_status	st = prepare_gemm_operands(ctx, true, err);

	if (st == CAI_OK)
	{
		ctx->w.file_embd = &ctx->model->file_embd;
		ctx->w.file = true;
	}
	return st;
}

cai_status
cai_forward_bind_weights(cai_forward_ctx *ctx, cai_error *err)
{
	const cai_model *m = ctx->model;
	const cai_config *c = &m->cfg;
	const size_t d = (size_t) c->d_model;
	const size_t vocab_floats = (size_t) c->n_vocab * d;
	cai_backend *be = ctx->be;
	cai_status	st;

	if (!be->ops->prepare_i8 || !be->ops->weight_data)
		return cai_fail(err, CAI_ERR_UNSUPPORTED, "the %s backend cannot hold model weights",
						be->ops->name);
	ctx->w.layers = calloc((size_t) c->n_layers, sizeof(cai_layer_operands));
	if (!ctx->w.layers)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory binding the weights");
	for (int l = 0; l < c->n_layers; l++)
		if ((st = cai_forward_bind_layer(ctx, l, err)) != CAI_OK)
			return st;
	if ((st = bind_floats(be, m->out_norm, d, &ctx->w.out_norm, err)) != CAI_OK ||
		(st = bind_floats(be, m->out_norm_i8, d, &ctx->w.out_norm_i8, err)) != CAI_OK ||
		(st = bind_floats(be, m->f_tok_embd, vocab_floats, &ctx->w.f_tok_embd, err)) != CAI_OK ||
		(st = bind_floats(be, m->f_lm_head, vocab_floats, &ctx->w.f_lm_head, err)) != CAI_OK ||
		(st = bind_rotation(be, &m->rot_model, &ctx->w.rot_model, err)) != CAI_OK ||
		(st = bind_rotation(be, &m->rot_ff, &ctx->w.rot_ff, err)) != CAI_OK ||
		(st = bind_rotation(be, &m->rot_head, &ctx->w.rot_head, err)) != CAI_OK)
		return st;
	if (m->file_weights)
		return bind_file(ctx, err);
	return m->int8_complete ? bind_int8(ctx, err) : CAI_OK;
}

void
cai_forward_unbind_weights(cai_forward_ctx *ctx)
{
	free(ctx->w.layers);
	memset(&ctx->w, 0, sizeof(ctx->w));
}
