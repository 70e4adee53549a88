/*
 * test_backend.c — the CUDA backend table (src/backend/cuda/backend_cuda.c) against the CPU backend
 * table, operation by operation, on a small synthetic model: the same sequence of calls the
 * forward makes (embedding, norms, the rotations of the GEMM inputs fused with their
 * quantization, the fused QKV GEMM with biases, per-head q/k norms, RoPE and the rotation of q and k, KV write,
 * attention, the output projection into the residual, SwiGLU, the LM head into host logits;
 * then Gemma 3's GeGLU, sublayer output norm and embedding scale), over two steps of a ragged
 * batch (prefill, then a decode and a chunk), every intermediate compared.
 *
 * Each side is a forward context (forward.c) on its backend, so its weights are the ones the
 * context had the backend prepare (forward_weights.c): the fused QKV matrix, an LM head whose
 * rows the GPU pads to a multiple of 4, the rotations' mix tables.  This exercises what the
 * kernels' own tests cannot: those weights, host index arrays, the device mirror of a host KV
 * pool, host GEMM outputs, and error reporting.  The int8 path must match bit for bit; the
 * float reference path's GEMMs within 1e-5 * sum |x_i w_i| + 1e-6.
 *
 * On the default model, cai_model_forward runs on a CUDA forward context and on a CPU one: the
 * same logits, the same greedy tokens.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_cuda.h"
#include "threadpool.h"
#include "forward_internal.h"
#include "gpu_util.h"
#include "kv.h"
#include "model.h"
#include "test.h"

#define SM_D 128
#define SM_HEADS 2
#define SM_KV_HEADS 1
#define SM_HD 64
#define SM_FF 256
#define SM_VOCAB 302			/* not a multiple of 4: the GPU pads the LM head's rows */
#define SM_CTX 64
#define SM_QKV ((SM_HEADS + 2 * SM_KV_HEADS) * SM_HD)
#define SM_Q (SM_HEADS * SM_HD)
#define SM_KVD (SM_KV_HEADS * SM_HD)

/*
 * A one-layer llama-shaped model with qwen2-style QKV biases, in host memory.  Its rotations
 * mix chunks (rot_model 4 x 16 values, two per row; rot_ff 2 x 128), which make_rotation gives
 * models whose widths have small power-of-two parts, so the table's mix-table lookup runs too;
 * rot_head is SmolLM2's (one block of 64 per head).
 */
typedef struct synth_model
{
	cai_model	m;
	cai_layer_weights layer;
	int			attn_window[1];
	int			kv_source[1];
	int			kv_index[1];
	void	   *allocs[64];
	int			n_allocs;
} synth_model;

static void *
synth_alloc(synth_model *s, size_t bytes)
{
	void	   *p = calloc(1, bytes);

	if (p && s->n_allocs < 64)
		s->allocs[s->n_allocs++] = p;
	return p;
}

static bool
synth_qmatrix(synth_model *s, gpu_rng *r, int n_out, int k, cai_qmatrix *m)
{
	m->n_out = n_out;
	m->k = k;
	m->q = synth_alloc(s, (size_t) n_out * k);
	m->scale = synth_alloc(s, (size_t) n_out * sizeof(float));
	if (!m->q || !m->scale)
		return false;
	gpu_fill_i8(r, (int8_t *) m->q, (size_t) n_out * k);
	gpu_fill_f32(r, (float *) m->scale, (size_t) n_out, 0.5f / (127.0f * sqrtf((float) k)),
				 1.5f / (127.0f * sqrtf((float) k)));
	return true;
}

static float *
synth_floats(synth_model *s, gpu_rng *r, size_t n, float lo, float hi)
{
	float	   *p = synth_alloc(s, n * sizeof(float));

	if (p)
		gpu_fill_f32(r, p, n, lo, hi);
	return p;
}

/* A rotation of n_pow2 x n_mix values whose mix table holds random weights. */
static bool
synth_rotation(synth_model *s, gpu_rng *r, int n_pow2, int n_mix, cai_rotation *rot)
{
	rot->n = n_pow2 * n_mix;
	rot->n_pow2 = n_pow2;
	rot->n_mix = n_mix;
	rot->norm = (float) (1.0 / sqrt((double) rot->n));
	rot->mix = synth_floats(s, r, (size_t) n_mix * n_mix, -1.5f, 1.5f);
	return rot->mix != NULL;
}

static bool
synth_build(synth_model *s, uint64_t seed)
{
	cai_config *c = &s->m.cfg;
	cai_layer_weights *w = &s->layer;
	gpu_rng		r;

	memset(s, 0, sizeof(*s));
	gpu_rng_seed(&r, seed);
	c->arch = &cai_arch_llama;
	strcpy(c->arch_name, "llama");
	strcpy(c->name, "synthetic");
	c->n_layers = 1;
	c->d_model = SM_D;
	c->n_heads = SM_HEADS;
	c->n_kv_heads = SM_KV_HEADS;
	c->head_dim = SM_HD;
	c->d_ff = SM_FF;
	c->n_vocab = SM_VOCAB;
	c->context_length = SM_CTX;
	c->norm_eps = 1e-5f;
	c->rope_base = 10000.0f;
	c->n_rot = SM_HD;
	c->rope_freq_scale = 1.0f;
	c->qkv_bias = true;
	c->attn_window = s->attn_window;
	c->kv_source = s->kv_source;
	c->kv_index = s->kv_index;
	c->n_kv_layers = 1;
	c->embed_scale = 1.0f;
	s->m.layers = w;
	s->m.has_float_reference = true;
	s->m.int8_complete = true;

	if (!synth_qmatrix(s, &r, SM_VOCAB, SM_D, &s->m.tok_embd) ||
		!synth_qmatrix(s, &r, SM_VOCAB, SM_D, &s->m.lm_head) ||
		!synth_qmatrix(s, &r, SM_QKV, SM_D, &w->wqkv) ||
		!synth_qmatrix(s, &r, SM_D, SM_Q, &w->wo) ||
		!synth_qmatrix(s, &r, 2 * SM_FF, SM_D, &w->w_gate_up) ||
		!synth_qmatrix(s, &r, SM_D, SM_FF, &w->w_down))
		return false;
	w->wq = cai_qmatrix_rows(&w->wqkv, 0, SM_Q);
	w->wk = cai_qmatrix_rows(&w->wqkv, SM_Q, SM_KVD);
	w->wv = cai_qmatrix_rows(&w->wqkv, SM_Q + SM_KVD, SM_KVD);
	w->w_gate = cai_qmatrix_rows(&w->w_gate_up, 0, SM_FF);
	w->w_up = cai_qmatrix_rows(&w->w_gate_up, SM_FF, SM_FF);
	w->attn_norm = synth_floats(s, &r, SM_D, 0.5f, 1.5f);
	w->ffn_norm = synth_floats(s, &r, SM_D, 0.5f, 1.5f);
	w->attn_norm_i8 = synth_floats(s, &r, SM_D, 0.5f, 1.5f);
	w->ffn_norm_i8 = synth_floats(s, &r, SM_D, 0.5f, 1.5f);
	w->bqkv = synth_floats(s, &r, SM_QKV, -0.5f, 0.5f);
	w->bqkv_i8 = synth_floats(s, &r, SM_QKV, -0.5f, 0.5f);
	s->m.out_norm = synth_floats(s, &r, SM_D, 0.5f, 1.5f);
	s->m.out_norm_i8 = synth_floats(s, &r, SM_D, 0.5f, 1.5f);
	s->m.f_tok_embd = synth_floats(s, &r, (size_t) SM_VOCAB * SM_D, -1.0f, 1.0f);
	s->m.f_lm_head = synth_floats(s, &r, (size_t) SM_VOCAB * SM_D, -0.1f, 0.1f);
	w->f_wq = synth_floats(s, &r, (size_t) SM_Q * SM_D, -0.1f, 0.1f);
	w->f_wk = synth_floats(s, &r, (size_t) SM_KVD * SM_D, -0.1f, 0.1f);
	w->f_wv = synth_floats(s, &r, (size_t) SM_KVD * SM_D, -0.1f, 0.1f);
	w->f_wo = synth_floats(s, &r, (size_t) SM_D * SM_Q, -0.1f, 0.1f);
	w->f_gate = synth_floats(s, &r, (size_t) SM_FF * SM_D, -0.1f, 0.1f);
	w->f_up = synth_floats(s, &r, (size_t) SM_FF * SM_D, -0.1f, 0.1f);
	w->f_down = synth_floats(s, &r, (size_t) SM_D * SM_FF, -0.1f, 0.1f);
	if (!w->attn_norm || !w->ffn_norm || !w->attn_norm_i8 || !w->ffn_norm_i8 || !w->bqkv ||
		!w->bqkv_i8 || !s->m.out_norm || !s->m.out_norm_i8 || !s->m.f_tok_embd ||
		!s->m.f_lm_head || !w->f_wq || !w->f_wk || !w->f_wv || !w->f_wo || !w->f_gate ||
		!w->f_up || !w->f_down ||
		!synth_rotation(s, &r, 16, 4, &s->m.rot_model) ||
		!synth_rotation(s, &r, 128, 2, &s->m.rot_ff) ||
		!synth_rotation(s, &r, SM_HD, 1, &s->m.rot_head))
		return false;
	w->bq = w->bqkv;
	w->bk = w->bqkv + SM_Q;
	w->bv = w->bqkv + SM_Q + SM_KVD;
	return true;
}

static void
synth_free(synth_model *s)
{
	for (int i = 0; i < s->n_allocs; i++)
		free(s->allocs[i]);
	s->n_allocs = 0;
}

/* One backend: its forward context (which made it and its weights) and activations. */
typedef struct side
{
	cai_forward_ctx *fc;
	cai_backend *be;			/* fc->be */
	bool		gpu;
	float	   *x,
			   *xn,
			   *qkv,
			   *att,
			   *gate_up,
			   *cs,
			   *xg;
	int8_t	   *xq;
	float	   *xs;
} side;

static bool
side_alloc(side *sd, int T)
{
	const cai_backend_ops *op = sd->be->ops;

	sd->x = op->alloc(sd->be, (size_t) T * SM_D * sizeof(float));
	sd->xn = op->alloc(sd->be, (size_t) T * SM_FF * sizeof(float));
	sd->qkv = op->alloc(sd->be, (size_t) T * SM_QKV * sizeof(float));
	sd->att = op->alloc(sd->be, (size_t) T * SM_Q * sizeof(float));
	sd->gate_up = op->alloc(sd->be, (size_t) T * 2 * SM_FF * sizeof(float));
	sd->cs = op->alloc(sd->be, (size_t) T * SM_HD * sizeof(float));
	sd->xg = op->alloc(sd->be, (size_t) T * SM_D * sizeof(float));
	sd->xq = op->alloc(sd->be, (size_t) T * SM_FF);
	sd->xs = op->alloc(sd->be, (size_t) T * sizeof(float));
	return sd->x && sd->xn && sd->qkv && sd->att && sd->gate_up && sd->cs && sd->xg && sd->xq &&
		sd->xs;
}

static void
side_free(side *sd)
{
	if (!sd->be)
		return;
	sd->be->ops->free(sd->be, sd->x);
	sd->be->ops->free(sd->be, sd->xn);
	sd->be->ops->free(sd->be, sd->qkv);
	sd->be->ops->free(sd->be, sd->att);
	sd->be->ops->free(sd->be, sd->gate_up);
	sd->be->ops->free(sd->be, sd->cs);
	sd->be->ops->free(sd->be, sd->xg);
	sd->be->ops->free(sd->be, sd->xq);
	sd->be->ops->free(sd->be, sd->xs);
	cai_forward_ctx_free(sd->fc);
}

/* Copies bytes of a backend buffer to host memory (the GPU's after its queued work). */
static bool
fetch(side *sd, void *dst, const void *src, size_t bytes)
{
	cai_error	err;

	if (!sd->gpu)
	{
		memcpy(dst, src, bytes);
		return true;
	}
	if (!gpu_ok(cai_cuda_backend_status(sd->be, &err), &err, "cuda backend"))
		return false;
	return gpu_download(dst, src, bytes);
}

/* Compares a buffer of both sides: bit for bit, or within the float GEMM tolerance. */
static void
compare(side *cpu, side *gpu, const void *cbuf, const void *gbuf, size_t bytes, bool is_float,
		const char *what)
{
	void	   *a = malloc(bytes),
			   *b = malloc(bytes);

	if (a && b && fetch(cpu, a, cbuf, bytes) && fetch(gpu, b, gbuf, bytes))
	{
		if (is_float)
			gpu_same_f32(b, a, bytes / sizeof(float), what);
		else
			gpu_same_i8(b, a, bytes, what);
	}
	free(a);
	free(b);
}

typedef struct step
{
	int			T;
	int			n_seqs;
	int32_t		ids[16];
	int32_t		pos[16];
	int32_t		seq[16];
	int32_t		start[4];
	int32_t		len[4];
	const int32_t *tables[4];
	int32_t		logit_rows[4];
	int			R;
	cai_batch_layout batch;
} step;

/*
 * Runs the int8 forward's calls on both sides (cai_model_forward's sequence over all rows, the
 * rows that want logits gathered at the end), comparing after every few calls.
 */
static void
run_int8_step(const synth_model *s, side *cpu, side *gpu, cai_kv_pool *kv, const step *st)
{
	const cai_model *m = &s->m;
	int			T = st->T;
	int			R = st->R;
	int			nv_model = SM_D / m->rot_model.n;
	int			nv_ff = SM_FF / m->rot_ff.n;
	int			nv_head = (SM_HEADS + SM_KV_HEADS) * SM_HD / m->rot_head.n;
	cai_rope_params rp = {SM_HD, 10000.0f, 1.0f, false, NULL};
	cai_attn_params ap = {SM_HEADS, SM_KV_HEADS, SM_HD, 0, 0, 1.0f / 8.0f};
	float		clog[4 * SM_VOCAB],
				glog[4 * SM_VOCAB];
	side	   *sides[2] = {cpu, gpu};
	static float qk_norm_w[2 * SM_HD];	/* query then key norm weights */

	for (int j = 0; j < 2 * SM_HD; j++)
		qk_norm_w[j] = 1.0f + 0.01f * (float) ((j * 37) % 23 - 11);

	for (int i = 0; i < 2; i++)
	{
		side	   *sd = sides[i];
		const cai_model_operands *W = &sd->fc->w;

		sd->be->ops->embed_i8(sd->be, &W->tok_embd, st->ids, T, sd->x);
		sd->be->ops->rope_prepare(sd->be, &rp, st->pos, T, sd->cs);
	}
	compare(cpu, gpu, cpu->x, gpu->x, (size_t) T * SM_D * 4, true, "embedding");
	compare(cpu, gpu, cpu->cs, gpu->cs, (size_t) T * SM_HD * 4, true, "rope angles");
	for (int i = 0; i < 2; i++)
	{
		side	   *sd = sides[i];
		const cai_model_operands *W = &sd->fc->w;
		const cai_layer_operands *w = &W->layers[0];
		const cai_backend_ops *op = sd->be->ops;

		op->rmsnorm(sd->be, sd->x, w->attn_norm_i8, T, SM_D, 1e-5f, sd->xn, NULL);
		op->rotate(sd->be, &W->rot_model, sd->xn, SM_D, T, nv_model, sd->xq, sd->xs);
		op->gemm_i8(sd->be, sd->xq, sd->xs, T, w->wqkv, SM_QKV, w->bqkv_i8, sd->qkv,
					SM_QKV, false);
	}
	compare(cpu, gpu, cpu->xn, gpu->xn, (size_t) T * SM_D * 4, true, "rotated attention input");
	compare(cpu, gpu, cpu->xq, gpu->xq, (size_t) T * SM_D, false, "attention input (int8)");
	compare(cpu, gpu, cpu->xs, gpu->xs, (size_t) T * 4, true, "attention input scales");
	compare(cpu, gpu, cpu->qkv, gpu->qkv, (size_t) T * SM_QKV * 4, true, "qkv projection");
	/* the query rows alone (a layer that reads another layer's KV), into the attention buffer */
	for (int i = 0; i < 2; i++)
	{
		side	   *sd = sides[i];
		const cai_layer_operands *w = &sd->fc->w.layers[0];

		sd->be->ops->gemm_i8(sd->be, sd->xq, sd->xs, T, w->wqkv, SM_Q, w->bqkv_i8, sd->att, SM_Q,
							 false);
	}
	compare(cpu, gpu, cpu->att, gpu->att, (size_t) T * SM_Q * 4, true, "q rows of the projection");

	/* per-head query and key norms (qwen3, gemma3), in place on q and k, before RoPE */
	for (int i = 0; i < 2; i++)
	{
		side	   *sd = sides[i];
		const cai_backend_ops *op = sd->be->ops;

		cai_error	err;
		/* weights are where the backend reads them (the GPU's copy) */
		const float *qkn = op->weight_data(sd->be, qk_norm_w, sizeof(qk_norm_w), &err);

		if (!qkn)
		{
			CHECK_MSG(false, "weight_data: %s", err.message);
			return;
		}
		op->head_rmsnorm(sd->be, sd->qkv, SM_QKV, T, SM_HEADS, SM_HD, qkn, 1e-6f);
		op->head_rmsnorm(sd->be, sd->qkv + SM_Q, SM_QKV, T, SM_KV_HEADS, SM_HD, qkn + SM_HD,
						 1e-6f);
	}
	compare(cpu, gpu, cpu->qkv, gpu->qkv, (size_t) T * SM_QKV * 4, true, "per-head q/k norms");
	for (int i = 0; i < 2; i++)
	{
		side	   *sd = sides[i];
		const cai_model_operands *W = &sd->fc->w;
		const cai_backend_ops *op = sd->be->ops;

		op->rope(sd->be, &rp, sd->cs, sd->qkv, SM_QKV, T, SM_HEADS + SM_KV_HEADS, SM_HD, NULL);
		op->rotate(sd->be, &W->rot_head, sd->qkv, SM_QKV, T, nv_head, NULL, NULL);
		op->kv_write(sd->be, &ap, &st->batch, sd->qkv + SM_Q, sd->qkv + SM_Q + SM_KVD, SM_QKV, kv,
					 NULL);
		op->attention(sd->be, &ap, &st->batch, sd->qkv, SM_QKV, kv, NULL, sd->att, SM_Q);
	}
	compare(cpu, gpu, cpu->qkv, gpu->qkv, (size_t) T * SM_QKV * 4, true,
			"rope and head rotation of q and k (v untouched)");
	compare(cpu, gpu, cpu->att, gpu->att, (size_t) T * SM_Q * 4, true, "attention");
	for (int i = 0; i < 2; i++)
	{
		side	   *sd = sides[i];
		const cai_model_operands *W = &sd->fc->w;
		const cai_layer_operands *w = &W->layers[0];
		const cai_backend_ops *op = sd->be->ops;

		op->quantize(sd->be, sd->att, T, SM_Q, sd->xq, sd->xs);
		op->gemm_i8(sd->be, sd->xq, sd->xs, T, w->wo, SM_D, NULL, sd->x, SM_D, true);
		op->rmsnorm(sd->be, sd->x, w->ffn_norm_i8, T, SM_D, 1e-5f, sd->xn, NULL);
		op->rotate(sd->be, &W->rot_model, sd->xn, SM_D, T, nv_model, sd->xq, sd->xs);
		op->gemm_i8(sd->be, sd->xq, sd->xs, T, w->w_gate_up, 2 * SM_FF, NULL, sd->gate_up,
					2 * SM_FF, false);
	}
	compare(cpu, gpu, cpu->xq, gpu->xq, (size_t) T * SM_D, false, "ffn input (int8)");
	compare(cpu, gpu, cpu->gate_up, gpu->gate_up, (size_t) T * 2 * SM_FF * 4, true, "gate/up");
	for (int i = 0; i < 2; i++)
	{
		side	   *sd = sides[i];
		const cai_model_operands *W = &sd->fc->w;
		const cai_backend_ops *op = sd->be->ops;

		op->swiglu(sd->be, sd->gate_up, T, SM_FF, sd->xn, NULL);
		op->rotate(sd->be, &W->rot_ff, sd->xn, SM_FF, T, nv_ff, sd->xq, sd->xs);
	}
	compare(cpu, gpu, cpu->xn, gpu->xn, (size_t) T * SM_FF * 4, true, "rotated swiglu output");
	compare(cpu, gpu, cpu->xq, gpu->xq, (size_t) T * SM_FF, false, "down input (int8)");
	compare(cpu, gpu, cpu->xs, gpu->xs, (size_t) T * 4, true, "down input scales");
	for (int i = 0; i < 2; i++)
	{
		side	   *sd = sides[i];
		const cai_model_operands *W = &sd->fc->w;
		const cai_layer_operands *w = &W->layers[0];
		const cai_backend_ops *op = sd->be->ops;

		op->gemm_i8(sd->be, sd->xq, sd->xs, T, w->w_down, SM_D, NULL, sd->x, SM_D, true);
		op->gather_rows(sd->be, sd->x, SM_D, st->logit_rows, R, sd->xg);
		op->rmsnorm(sd->be, sd->xg, W->out_norm_i8, R, SM_D, 1e-5f, sd->xn, NULL);
		op->rotate(sd->be, &W->rot_model, sd->xn, SM_D, R, nv_model, sd->xq, sd->xs);
		/* the caller's logits are host memory: the gpu computes them on the device, downloads */
		op->gemm_i8(sd->be, sd->xq, sd->xs, R, W->lm_head, SM_VOCAB, NULL, i == 0 ? clog : glog,
					SM_VOCAB, false);
	}
	compare(cpu, gpu, cpu->x, gpu->x, (size_t) T * SM_D * 4, true, "residual stream");
	compare(cpu, gpu, cpu->xg, gpu->xg, (size_t) R * SM_D * 4, true, "gathered rows");
	compare(cpu, gpu, cpu->xq, gpu->xq, (size_t) R * SM_D, false, "lm head input (int8)");
	{
		cai_error	err;

		if (gpu_ok(cai_cuda_backend_status(gpu->be, &err), &err, "cuda backend"))
			gpu_same_f32(glog, clog, (size_t) R * SM_VOCAB, "logits");
	}

	/*
	 * Gemma 3's operations on the same rows: GeGLU with its rotation and quantization for the
	 * down GEMM, a sublayer's output (the first T rows of gate/up, width SM_D) normed into the
	 * residual stream, and the embedding scale
	 */
	for (int i = 0; i < 2; i++)
	{
		side	   *sd = sides[i];
		const cai_model_operands *W = &sd->fc->w;
		const cai_layer_operands *w = &W->layers[0];
		const cai_backend_ops *op = sd->be->ops;
		const cai_then_rotate to_ff = {.rot = &W->rot_ff, .n_vec = nv_ff, .q = sd->xq,
		.s = sd->xs};

		op->geglu(sd->be, sd->gate_up, T, SM_FF, sd->xn, &to_ff);
		op->rmsnorm_add(sd->be, sd->gate_up, w->ffn_norm_i8, T, SM_D, 1e-6f, sd->x);
		op->scale(sd->be, sd->x, T, SM_D, sqrtf((float) SM_D));
	}
	compare(cpu, gpu, cpu->xn, gpu->xn, (size_t) T * SM_FF * 4, true, "rotated geglu output");
	compare(cpu, gpu, cpu->xq, gpu->xq, (size_t) T * SM_FF, false, "geglu output (int8)");
	compare(cpu, gpu, cpu->xs, gpu->xs, (size_t) T * 4, true, "geglu output scales");
	compare(cpu, gpu, cpu->x, gpu->x, (size_t) T * SM_D * 4, true,
			"residual stream after rmsnorm_add and scale");
}

static void
step_init(step *st, int n_seqs, const int *first, const int *count, const int32_t *const *tables,
		  gpu_rng *r)
{
	int			T = 0;

	memset(st, 0, sizeof(*st));
	for (int s = 0; s < n_seqs; s++)
	{
		st->start[s] = T;
		st->len[s] = count[s];
		st->tables[s] = tables[s];
		for (int i = 0; i < count[s]; i++)
		{
			st->ids[T] = gpu_rng_int(r, 0, SM_VOCAB - 1);
			st->pos[T] = first[s] + i;
			st->seq[T] = s;
			T++;
		}
		st->logit_rows[st->R++] = T - 1;
	}
	st->T = T;
	st->n_seqs = n_seqs;
	st->batch.n_tokens = T;
	st->batch.n_seqs = n_seqs;
	st->batch.token_pos = st->pos;
	st->batch.token_seq = st->seq;
	st->batch.seq_start = st->start;
	st->batch.seq_len = st->len;
	st->batch.block_tables = st->tables;
}

/* Both backends over the synthetic model, a host KV pool and a thread pool. */
typedef struct fixture
{
	synth_model model;
	cai_threadpool *tp;
	cai_kv_pool *kv;
	side		cpu;
	side		gpu;
} fixture;

/* cai_backend_factory of the CUDA sides: the backend with the parameters at arg. */
static cai_status
cuda_factory(void *arg, const cai_backend_limits *limits, cai_backend **out, cai_error *err)
{
	cai_cuda_backend_params p = *(const cai_cuda_backend_params *) arg;

	p.limits = *limits;
	return cai_cuda_backend_create(&p, out, err);
}

/* A forward context on the CPU (params NULL) or on the CUDA backend, as a side. */
static bool
side_open(side *sd, const cai_model *m, cai_threadpool *tp, const cai_cuda_backend_params *params,
		  int max_tokens, int max_context)
{
	cai_error	err;
	cai_status	st;

	st = params ? cai_forward_ctx_create_on(m, cuda_factory, (void *) params, max_tokens,
											max_context, &sd->fc, &err) :
		cai_forward_ctx_create(m, tp, max_tokens, max_context, &sd->fc, &err);
	if (!gpu_ok(st, &err, params ? "cuda forward context" : "cpu forward context"))
		return false;
	sd->be = sd->fc->be;
	sd->gpu = params != NULL;
	return true;
}

static bool
fixture_open(fixture *f)
{
	cai_cuda_backend_params p;
	cai_kv_layout L = {0};
	cai_error	err;
	size_t		part = (size_t) CAI_KV_BLOCK_TOKENS * SM_KV_HEADS * (2 * SM_HD + 2 * sizeof(float));

	memset(f, 0, sizeof(*f));
	if (!synth_build(&f->model, 77))
	{
		CHECK_MSG(false, "out of memory building the model");
		return false;
	}
	f->tp = cai_threadpool_create(2);
	L.n_kv_layers = 1;
	L.n_kv_heads = SM_KV_HEADS;
	L.head_dim = SM_HD;
	L.layer_bytes = (part + 63) & ~(size_t) 63;
	L.block_bytes = L.layer_bytes;
	if (!gpu_ok(cai_kv_pool_create(&L, 12, &f->kv, &err), &err, "kv pool") ||
		!side_open(&f->cpu, &f->model.m, f->tp, NULL, 16, SM_CTX))
		return false;
	memset(&p, 0, sizeof(p));
	p.device = 0;
	p.model = &f->model.m;
	p.kv_pool_layout = cai_kv_pool_layout;
	p.kv_pool_n_blocks = cai_kv_pool_n_blocks;
	if (!side_open(&f->gpu, &f->model.m, f->tp, &p, 16, SM_CTX))
		return false;
	fprintf(stderr, "    %s\n", cai_cuda_backend_device(f->gpu.be));
	if (!side_alloc(&f->cpu, 16) || !side_alloc(&f->gpu, 16))
	{
		CHECK_MSG(false, "backend allocation failed");
		return false;
	}
	return true;
}

static void
fixture_close(fixture *f)
{
	side_free(&f->cpu);
	side_free(&f->gpu);
	cai_kv_pool_free(f->kv);
	cai_threadpool_free(f->tp);
	synth_free(&f->model);
}

TEST(gpu_backend_table_int8_forward_bit_exact)
{
	fixture		f;
	int32_t		table0[4] = {7, 2, 9, 0},
				table1[4] = {5, 11, 3, 1};
	const int32_t *tables[2] = {table0, table1};
	gpu_rng		r;
	step		st;

	gpu_rng_seed(&r, 12);
	if (fixture_open(&f))
	{
		/* step 1: two prompts from position 0; step 2: a decode and a chunk after them */
		int			first1[2] = {0, 0},
					count1[2] = {5, 3};
		int			first2[2] = {5, 3},
					count2[2] = {1, 6};

		step_init(&st, 2, first1, count1, tables, &r);
		run_int8_step(&f.model, &f.cpu, &f.gpu, f.kv, &st);
		step_init(&st, 2, first2, count2, tables, &r);
		run_int8_step(&f.model, &f.cpu, &f.gpu, f.kv, &st);
		/* no GEMM of these shapes (8 and 7 rows) left cuBLASLt for the fallback kernel */
		CHECK(f.gpu.be->ops->gemm_fallbacks != NULL);
		if (f.gpu.be->ops->gemm_fallbacks)
			CHECK_EQ_INT((int) f.gpu.be->ops->gemm_fallbacks(f.gpu.be), 0);
	}
	fixture_close(&f);
}

/*
 * A cached partial block is reused by copying its first rows into a block of the new sequence's
 * own (kv_copy_rows): after the copy, a step that goes on from those rows in the copies must
 * attend exactly as the CPU does over its host copies.  Rows the GPU failed to copy would leave
 * its mirror's copies empty and the attention (and all after it) different.
 */
TEST(gpu_backend_kv_copy_rows_then_continue)
{
	fixture		f;
	int32_t		table0[4] = {7, 2, 9, 0},
				table1[4] = {5, 11, 3, 1};
	int32_t		copy0[4] = {4, 2, 9, 0},
				copy1[4] = {6, 11, 3, 1};
	const int32_t *tables[2] = {table0, table1};
	const int32_t *copies[2] = {copy0, copy1};
	gpu_rng		r;
	step		st;

	gpu_rng_seed(&r, 21);
	if (fixture_open(&f))
	{
		int			first1[2] = {0, 0},
					count1[2] = {5, 3};
		/* all 5 rows of the first, 2 of the second's 3 (a tail matched part way) */
		int			first2[2] = {5, 2},
					count2[2] = {2, 4};
		side	   *sides[2] = {&f.cpu, &f.gpu};

		step_init(&st, 2, first1, count1, tables, &r);
		run_int8_step(&f.model, &f.cpu, &f.gpu, f.kv, &st);
		for (int i = 0; i < 2; i++)
		{
			CHECK(sides[i]->be->ops->kv_copy_rows != NULL);
			if (!sides[i]->be->ops->kv_copy_rows)
				goto done;
			sides[i]->be->ops->kv_copy_rows(sides[i]->be, f.kv, 7, 4, 5);
			sides[i]->be->ops->kv_copy_rows(sides[i]->be, f.kv, 5, 6, 2);
		}
		step_init(&st, 2, first2, count2, copies, &r);
		run_int8_step(&f.model, &f.cpu, &f.gpu, f.kv, &st);
	}
done:
	fixture_close(&f);
}

TEST(gpu_backend_table_float_path)
{
	fixture		f;
	gpu_rng		r;
	int32_t		ids[6];

	gpu_rng_seed(&r, 13);
	for (int i = 0; i < 6; i++)
		ids[i] = gpu_rng_int(&r, 0, SM_VOCAB - 1);
	if (fixture_open(&f))
	{
		side	   *sides[2] = {&f.cpu, &f.gpu};
		float		clog[6 * SM_VOCAB],
					glog[6 * SM_VOCAB];
		float	   *c = malloc((size_t) 6 * SM_QKV * sizeof(float)),
				   *g = malloc((size_t) 6 * SM_QKV * sizeof(float));

		for (int i = 0; i < 2; i++)
		{
			side	   *sd = sides[i];
			const cai_backend_ops *op = sd->be->ops;
			const cai_model_operands *W = &sd->fc->w;
			const cai_layer_operands *w = &W->layers[0];

			op->embed_f32(sd->be, W->f_tok_embd, SM_D, ids, 6, sd->x);
			op->rmsnorm(sd->be, sd->x, w->attn_norm, 6, SM_D, 1e-5f, sd->xn, NULL);
			op->gemm_f32(sd->be, sd->xn, 6, SM_D, w->f_wq, SM_Q, w->bq, sd->qkv, SM_QKV, false);
			op->gemm_f32(sd->be, sd->xn, 6, SM_D, w->f_wk, SM_KVD, w->bk, sd->qkv + SM_Q, SM_QKV,
						 false);
			op->gemm_f32(sd->be, sd->xn, 6, SM_D, W->f_lm_head, SM_VOCAB, NULL,
						 i == 0 ? clog : glog, SM_VOCAB, false);
			op->gemm_f32(sd->be, sd->xn, 6, SM_D, w->f_gate, SM_FF, NULL, sd->gate_up, 2 * SM_FF,
						 false);
			op->gemm_f32(sd->be, sd->xn, 6, SM_D, w->f_up, SM_FF, NULL, sd->gate_up + SM_FF,
						 2 * SM_FF, false);
			op->swiglu(sd->be, sd->gate_up, 6, SM_FF, sd->xg, NULL);
		}
		compare(&f.cpu, &f.gpu, f.cpu.x, f.gpu.x, (size_t) 6 * SM_D * 4, true, "float embedding");
		compare(&f.cpu, &f.gpu, f.cpu.xn, f.gpu.xn, (size_t) 6 * SM_D * 4, true, "float rmsnorm");
		if (c && g && fetch(&f.cpu, c, f.cpu.qkv, (size_t) 6 * SM_QKV * 4) &&
			fetch(&f.gpu, g, f.gpu.qkv, (size_t) 6 * SM_QKV * 4))
		{
			/* q and k columns: fp32 GEMMs in another summation order */
			for (int t = 0; t < 6; t++)
				gpu_near_f32(g + t * SM_QKV, c + t * SM_QKV, SM_Q + SM_KVD, 1e-4, 1e-4,
							 "float q/k projection");
		}
		gpu_near_f32(glog, clog, (size_t) 6 * SM_VOCAB, 1e-4, 1e-4, "float logits");
		free(c);
		free(g);
	}
	fixture_close(&f);
}

TEST(gpu_backend_reports_failures)
{
	fixture		f;

	if (fixture_open(&f))
	{
		float		not_backend_memory[SM_D];
		cai_error	err;
		cai_status	st;

		memset(not_backend_memory, 0, sizeof(not_backend_memory));
		/* an input that is not an allocation of the backend */
		f.gpu.be->ops->rmsnorm(f.gpu.be, not_backend_memory, f.gpu.fc->w.layers[0].attn_norm, 1,
							   SM_D, 1e-5f, f.gpu.xn, NULL);
		/* later operations do nothing until the failure is collected */
		f.gpu.be->ops->quantize(f.gpu.be, f.gpu.x, 1, SM_D, f.gpu.xq, f.gpu.xs);
		st = cai_cuda_backend_status(f.gpu.be, &err);
		CHECK(st != CAI_OK);
		CHECK_MSG(strstr(err.message, "is not backend memory") != NULL,
				  "message: %s", err.message);
		/* collected: the backend works again */
		CHECK(cai_cuda_backend_status(f.gpu.be, &err) == CAI_OK);
	}
	fixture_close(&f);
}

/* ---------------------------------------------------------------------------------------------
 * The default model end to end: greedy tokens of both backends
 * ------------------------------------------------------------------------------------------- */

/*
 * Step it of a greedy two-sequence run: both prompts from position 0 in one ragged step
 * (it == 0), then one token each, next[s] at position pos[s] (advanced here).  Logits: the last
 * row of each sequence.
 */
static void
greedy_step(step *st, int it, int32_t *const prompt_ids[2], const int n_prompt[2],
			const int32_t next[2], int pos[2], const int32_t *const tables[2])
{
	int			T = 0;

	memset(st, 0, sizeof(*st));
	for (int s = 0; s < 2; s++)
	{
		int			n = it == 0 ? n_prompt[s] : 1;

		st->start[s] = T;
		st->len[s] = n;
		st->tables[s] = tables[s];
		for (int i = 0; i < n; i++)
		{
			st->ids[T] = it == 0 ? prompt_ids[s][i] : next[s];
			st->pos[T] = pos[s] + i;
			st->seq[T] = s;
			T++;
		}
		st->logit_rows[s] = T - 1;
		pos[s] += n;
	}
	st->T = T;
	st->R = 2;
	st->n_seqs = 2;
	st->batch.n_tokens = T;
	st->batch.n_seqs = 2;
	st->batch.token_pos = st->pos;
	st->batch.token_seq = st->seq;
	st->batch.seq_start = st->start;
	st->batch.seq_len = st->len;
	st->batch.block_tables = st->tables;
}

static int32_t
argmax_row(const float *l, int n)
{
	int32_t		best = 0;

	for (int i = 1; i < n; i++)
		if (l[i] > l[best])
			best = i;
	return best;
}

/* The default model, its two prompts tokenized, a thread pool and a KV pool per backend. */
typedef struct model_fixture
{
	cai_model  *model;
	cai_threadpool *tp;
	cai_kv_pool *kv[2];
	int32_t    *prompt_ids[2];
	int			n_prompt[2];
	int32_t		tables[2][4];
	const int32_t *table_ptrs[2];
} model_fixture;

#define MODEL_N_DECODE 16

/*
 * Loads the default model (false with no failure when it is absent: the caller skips) and
 * prepares two KV pools of the same layout, interleaved block tables of 4 blocks (64
 * positions) and the prompts.
 */
static bool
model_fixture_open(model_fixture *f, bool *absent)
{
	static const char *prompts[2] = {"The capital of France is", "Write a haiku about databases:"};
	const char *path = test_real_model_path();
	cai_model_params mp;
	cai_kv_layout L = {0};
	cai_error	err;

	memset(f, 0, sizeof(*f));
	*absent = path == NULL;
	if (!path)
		return false;
	cai_model_params_default(&mp);
	if (!gpu_ok(cai_model_load(path, &mp, &f->model, &err), &err, "model load"))
		return false;
	for (int s = 0; s < 2; s++)
	{
		if (!gpu_ok(cai_tokenize(f->model, prompts[s], strlen(prompts[s]), false,
								 &f->prompt_ids[s], &f->n_prompt[s], &err), &err, "tokenize"))
			return false;
		/*
		 * A model with a small vocabulary (the GPU kit's SmolLM2-shaped synthetic one, through
		 * CAI_TEST_MODEL) spells the prompts in more tokens; their first 8 are prompt enough.
		 */
		if (f->n_prompt[s] > 8)
			f->n_prompt[s] = 8;
	}
	if (f->n_prompt[0] + f->n_prompt[1] > 16 || f->n_prompt[0] + MODEL_N_DECODE + 1 > 64 ||
		f->n_prompt[1] + MODEL_N_DECODE + 1 > 64)
	{
		CHECK_MSG(false, "prompts longer than this test's step buffers");
		return false;
	}
	cai_model_kv_layout(f->model, &L);
	for (int k = 0; k < 2; k++)
		if (!gpu_ok(cai_kv_pool_create(&L, 2 * 4 + 2, &f->kv[k], &err), &err, "kv pool"))
			return false;
	for (int s = 0; s < 2; s++)
	{
		for (int b = 0; b < 4; b++)
			f->tables[s][b] = 2 * b + s;	/* interleaved blocks */
		f->table_ptrs[s] = f->tables[s];
	}
	f->tp = cai_threadpool_create(2);
	return f->tp != NULL;
}

static void
model_fixture_close(model_fixture *f)
{
	for (int k = 0; k < 2; k++)
		cai_kv_pool_free(f->kv[k]);
	cai_threadpool_free(f->tp);
	for (int s = 0; s < 2; s++)
		cai_free(f->prompt_ids[s]);
	cai_model_free(f->model);
}

/* The forward of one greedy step (greedy_step's) on a side, logits of each sequence's last row. */
static cai_status
greedy_forward(side *sd, const cai_model *m, cai_kv_pool *kv, const step *st,
			   int32_t (*tables)[4], float *logits, cai_error *err)
{
	cai_batch_seq seqs[2];

	for (int s = 0; s < 2; s++)
	{
		seqs[s].tokens = st->ids + st->start[s];
		seqs[s].n_tokens = st->len[s];
		seqs[s].pos = st->pos[st->start[s]];
		seqs[s].block_table = tables[s];
		seqs[s].n_blocks = 4;
		seqs[s].logits = CAI_LOGITS_LAST;
	}
	return cai_model_forward(m, sd->fc, kv, seqs, 2, logits, false, err);
}

/*
 * The engine's forward (cai_model_forward) on a CUDA forward context against a CPU one: a
 * ragged prefill of two prompts, then greedy decoding of both together; identical logits and
 * tokens at every step.  With graphs, the decode steps are recorded at the second and replayed
 * after; without (CAI_CUDA_GRAPHS=0), every step runs its operations.
 */
static void
greedy_matches_cpu(bool graphs)
{
	model_fixture f;
	bool		absent;
	side		cpu = {0},
				gpu = {0};
	float	   *clog = NULL,
			   *glog = NULL;
	cai_cuda_backend_params p;
	cai_error	err;

	if (!model_fixture_open(&f, &absent))
	{
		model_fixture_close(&f);
		if (absent)
			SKIP("the default model is not in models/ (make model)");
		return;
	}
	memset(&p, 0, sizeof(p));
	p.device = 0;
	p.model = f.model;
	p.kv_pool_layout = cai_kv_pool_layout;
	p.kv_pool_n_blocks = cai_kv_pool_n_blocks;
	if (!graphs)
		setenv("CAI_CUDA_GRAPHS", "0", 1);	/* read when the backend is made */
	if (!side_open(&cpu, f.model, f.tp, NULL, 16, 64) ||
		!side_open(&gpu, f.model, f.tp, &p, 16, 64))
		goto done;
	unsetenv("CAI_CUDA_GRAPHS");
	clog = malloc((size_t) 2 * f.model->cfg.n_vocab * sizeof(float));
	glog = malloc((size_t) 2 * f.model->cfg.n_vocab * sizeof(float));
	if (!clog || !glog)
		goto done;

	/* prefill both prompts in one ragged step, then decode both together, greedily */
	{
		int			pos[2] = {0, 0};
		int32_t		next[2] = {0, 0};
		static step st;

		for (int it = 0; it <= MODEL_N_DECODE; it++)
		{
			greedy_step(&st, it, f.prompt_ids, f.n_prompt, next, pos, f.table_ptrs);
			if (!gpu_ok(greedy_forward(&cpu, f.model, f.kv[0], &st, f.tables, clog, &err), &err,
						"cpu forward") ||
				!gpu_ok(greedy_forward(&gpu, f.model, f.kv[1], &st, f.tables, glog, &err), &err,
						"cuda forward"))
				break;
			if (!gpu_same_f32(glog, clog, (size_t) 2 * f.model->cfg.n_vocab, "logits"))
			{
				fprintf(stderr, "    (step %d)\n", it);
				break;
			}
			for (int s = 0; s < 2; s++)
			{
				int32_t		c = argmax_row(clog + (size_t) s * f.model->cfg.n_vocab,
										   f.model->cfg.n_vocab);

				CHECK_EQ_INT(argmax_row(glog + (size_t) s * f.model->cfg.n_vocab,
										f.model->cfg.n_vocab), c);
				next[s] = c;
			}
		}
	}
	{
		uint64_t	captures,
					replays;

		/* step 0 prefills; step 1, the first decode of two, sizes the buffers; step 2 records */
		cai_cuda_backend_graph_counts(gpu.be, &captures, &replays);
		CHECK_EQ_INT((int) captures, graphs ? 1 : 0);
		CHECK_EQ_INT((int) replays, graphs ? MODEL_N_DECODE - 2 : 0);
	}
done:
	unsetenv("CAI_CUDA_GRAPHS");
	free(clog);
	free(glog);
	side_free(&cpu);
	side_free(&gpu);
	model_fixture_close(&f);
}

TEST(gpu_backend_default_model_greedy_matches_cpu)
{
	greedy_matches_cpu(false);
}

TEST(gpu_backend_decode_steps_replayed_as_graphs)
{
	greedy_matches_cpu(true);
}
