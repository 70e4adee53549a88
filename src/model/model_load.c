/*
 * model_load.c — a GGUF file into the engine's model: validates every tensor the architecture
 * needs (presence, type, shape) before touching any data, allocates the int8 weights and
 * converts each weight matrix row by row — dequantize the source row to float, smooth and
 * rotate it (calibrate.c), requantize it to symmetric int8 per output channel — in parallel
 * over a thread pool (convert.c).  Q/K/V of a layer become one matrix (one GEMM), gate/up
 * another.  Then the tokenizer, the chat template and the fingerprint.
 */
#include "model_internal.h"
#include "model_wcache.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"
#include "util.h"

/* ---------------------------------------------------------------------------------------------
 * Tensor validation
 * ------------------------------------------------------------------------------------------- */

/*
 * Finds tensor name and checks it against the expected shape: a matrix [ne1 rows of ne0]
 * (GGUF's ne0 is the contiguous "in" dimension) or, with ne1 == 0, a vector of ne0.
 */
static cai_status
find_tensor(const gguf_file *f, const char *name, int64_t ne0, int64_t ne1, bool required,
			const gguf_tensor **out, cai_error *err)
{
	const gguf_tensor *t = gguf_find_tensor(f, name);
	size_t		row_bytes;
	int64_t		rows = ne1 ? ne1 : 1;

	*out = NULL;
	if (!t)
		return required ? cai_fail(err, CAI_ERR_FORMAT, "missing tensor '%s'", name) : CAI_OK;
	if (!ggml_type_can_dequantize(t->type))
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"tensor '%s' has type %s, which the engine cannot read "
						"(supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k)",
						name, ggml_type_name(t->type));
	if (t->ne[0] != ne0 || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1)
	{
		if (ne1)
			return cai_fail(err, CAI_ERR_FORMAT,
							"tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
							name, (long long) t->ne[0], (long long) t->ne[1],
							(long long) t->ne[2], (long long) t->ne[3],
							(long long) ne0, (long long) ne1);
		return cai_fail(err, CAI_ERR_FORMAT,
						"tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld]",
						name, (long long) t->ne[0], (long long) t->ne[1],
						(long long) t->ne[2], (long long) t->ne[3], (long long) ne0);
	}
	if (!ggml_row_bytes(t->type, ne0, &row_bytes))
		return cai_fail(err, CAI_ERR_FORMAT,
						"tensor '%s': a row of %lld values is not a whole number of %s blocks",
						name, (long long) ne0, ggml_type_name(t->type));
	if (t->nbytes < row_bytes * (size_t) rows || !t->data)
		return cai_fail(err, CAI_ERR_FORMAT, "tensor '%s' holds fewer bytes than its shape needs",
						name);
	*out = t;
	return CAI_OK;
}

static cai_status
find_layer_tensors(const gguf_file *f, const cai_config *c, int l, cai_layer_sources *ls,
				   cai_error *err)
{
	const cai_arch_tensors *tn = c->arch->tensors;
	const bool	bias = c->arch->qkv_bias == CAI_QKV_BIAS_REQUIRED;
	int			q_dim = c->n_heads * c->head_dim;
	int			kv_dim = c->n_kv_heads * c->head_dim;
	char		name[96];
	cai_status	st;

	/* a tensor the architecture does not name is absent */
#define FIND(field, suffix, ne0, ne1, required) \
	do { \
		ls->field = NULL; \
		if (!(suffix)) \
			break; \
		snprintf(name, sizeof(name), "blk.%d.%s", l, (suffix)); \
		if ((st = find_tensor(f, name, (ne0), (ne1), (required), &ls->field, err)) != CAI_OK) \
			return st; \
	} while (0)

	FIND(attn_norm, tn->attn_norm, c->d_model, 0, true);
	FIND(wq, tn->attn_q, c->d_model, q_dim, true);
	FIND(wk, tn->attn_k, c->d_model, kv_dim, true);
	FIND(wv, tn->attn_v, c->d_model, kv_dim, true);
	FIND(wo, tn->attn_output, q_dim, c->d_model, true);
	FIND(bq, tn->attn_q_bias, q_dim, 0, bias);
	FIND(bk, tn->attn_k_bias, kv_dim, 0, bias);
	FIND(bv, tn->attn_v_bias, kv_dim, 0, bias);
	FIND(q_norm, tn->attn_q_norm, c->head_dim, 0, c->qk_norm);
	FIND(k_norm, tn->attn_k_norm, c->head_dim, 0, c->qk_norm);
	FIND(attn_post_norm, c->sandwich_norm ? tn->attn_post_norm : NULL, c->d_model, 0, true);
	FIND(ffn_post_norm, c->sandwich_norm ? tn->ffn_post_norm : NULL, c->d_model, 0, true);
	FIND(ffn_norm, tn->ffn_norm, c->d_model, 0, true);
	FIND(gate, tn->ffn_gate, c->d_model, c->d_ff, true);
	FIND(up, tn->ffn_up, c->d_model, c->d_ff, true);
	FIND(down, tn->ffn_down, c->d_ff, c->d_model, true);
#undef FIND

	/* an architecture without q/k/v biases must not have them ignored */
	if (c->arch->qkv_bias == CAI_QKV_BIAS_NONE && (ls->bq || ls->bk || ls->bv))
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"layer %d has q/k/v biases, which architecture '%s' does not use", l,
						c->arch_name);

	/* q/k/v biases: all three or none, the same in every layer (layer 0 decides) */
	if ((ls->bq != NULL) != (ls->bk != NULL) || (ls->bq != NULL) != (ls->bv != NULL) ||
		(ls->bq != NULL) != c->qkv_bias)
		return cai_fail(err, CAI_ERR_FORMAT,
						"layer %d has q/k/v biases unlike the other projections or layers", l);

	/* biases this engine does not apply must not be ignored silently */
	if (!tn->attn_output_bias)
		return CAI_OK;
	snprintf(name, sizeof(name), "blk.%d.%s", l, tn->attn_output_bias);
	if (gguf_find_tensor(f, name))
		return cai_fail(err, CAI_ERR_UNSUPPORTED, "tensor '%s' (an output projection bias) is not supported",
						name);
	return CAI_OK;
}

/* Allocates a row-major int8 matrix [n_out, k] with its scales. */
static bool
alloc_qmatrix(cai_model *m, int n_out, int k, cai_qmatrix *out)
{
	int8_t	   *q = cai_model_alloc(m, (size_t) n_out * k);
	float	   *scale = cai_model_alloc(m, (size_t) n_out * sizeof(float));

	if (!q || !scale)
		return false;
	out->n_out = n_out;
	out->k = k;
	out->q = q;
	out->scale = scale;
	m->weight_bytes += (size_t) n_out * k + (size_t) n_out * sizeof(float);
	return true;
}

/* The layer's views of its fused matrices. */
static void
layer_views(cai_layer_weights *w, const cai_config *c)
{
	int			q_dim = c->n_heads * c->head_dim;
	int			kv_dim = c->n_kv_heads * c->head_dim;

	w->wq = cai_qmatrix_rows(&w->wqkv, 0, q_dim);
	w->wk = cai_qmatrix_rows(&w->wqkv, q_dim, kv_dim);
	w->wv = cai_qmatrix_rows(&w->wqkv, q_dim + kv_dim, kv_dim);
	w->w_gate = cai_qmatrix_rows(&w->w_gate_up, 0, c->d_ff);
	w->w_up = cai_qmatrix_rows(&w->w_gate_up, c->d_ff, c->d_ff);
}

/* Dequantizes a (validated) vector tensor of n values into float memory owned by the model. */
static cai_status
load_vector(cai_model *m, const gguf_tensor *t, int n, float *dst, cai_error *err)
{
	cai_status	st = cai_dequantize_row(t->type, t->data, dst, n, err);

	if (st == CAI_OK)
		m->weight_bytes += (size_t) n * sizeof(float);
	return st;
}

static float *
alloc_floats(cai_model *m, size_t n)
{
	size_t		bytes;

	if (!cai_mul_size(n, sizeof(float), &bytes))
		return NULL;
	return cai_model_alloc(m, bytes);
}

/* ---------------------------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------------------------- */

void
cai_model_params_default(cai_model_params *params)
{
	params->n_threads = 0;
	params->load_float_reference = false;
	params->chat_template = NULL;
	params->rounding = CAI_ROUNDING_AUTO;
	params->activations = CAI_ACTIVATIONS_AUTO;
	params->weights = CAI_WEIGHTS_AUTO;
	params->auto_file_min_weights = CAI_AUTO_FILE_MIN_WEIGHTS;
	params->weights_cache = NULL;
}

/* The settings' names, indexed by their enums' values, each list ended by NULL. */
static const char *const weights_mode_names[] = {"auto", "file", "int8", NULL};
static const char *const rounding_names[] = {"auto", "nearest", "gptq", NULL};
static const char *const activations_names[] = {"auto", "int8", "two_digit", "int8_256", NULL};

static const char *
mode_name(const char *const *names, int value)
{
	for (int i = 0; names[i]; i++)
		if (i == value)
			return names[i];
	return NULL;
}

/* The index of name in names, or -1. */
static int
mode_parse(const char *const *names, const char *name)
{
	for (int i = 0; name && names[i]; i++)
		if (strcmp(name, names[i]) == 0)
			return i;
	return -1;
}

const char *
cai_weights_mode_name(cai_weights_mode mode)
{
	return mode_name(weights_mode_names, (int) mode);
}

bool
cai_weights_mode_parse(const char *name, cai_weights_mode *mode)
{
	int			i = mode_parse(weights_mode_names, name);

	if (i >= 0)
		*mode = (cai_weights_mode) i;
	return i >= 0;
}

const char *
cai_rounding_mode_name(cai_rounding_mode rounding)
{
	return mode_name(rounding_names, (int) rounding);
}

bool
cai_rounding_mode_parse(const char *name, cai_rounding_mode *rounding)
{
	int			i = mode_parse(rounding_names, name);

	if (i >= 0)
		*rounding = (cai_rounding_mode) i;
	return i >= 0;
}

const char *
cai_activations_mode_name(cai_activations_mode precision)
{
	return mode_name(activations_names, (int) precision);
}

bool
cai_activations_mode_parse(const char *name, cai_activations_mode *precision)
{
	int			i = mode_parse(activations_names, name);

	if (i >= 0)
		*precision = (cai_activations_mode) i;
	return i >= 0;
}

static cai_status
oom(cai_error *err)
{
	return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory loading the model weights");
}

/*
 * A layer's arrays: its int8 matrices (converted later), its float reference copies when kept,
 * and its norms and biases, loaded now.
 */
static cai_status
load_layer_arrays(cai_model *m, const cai_layer_sources *s, cai_layer_weights *w, bool fref,
				  bool int8, cai_error *err)
{
	const cai_config *c = &m->cfg;
	const int	q_dim = c->n_heads * c->head_dim;
	const int	kv_dim = c->n_kv_heads * c->head_dim;
	cai_status	st;

	if (int8 &&
		(!alloc_qmatrix(m, q_dim + 2 * kv_dim, c->d_model, &w->wqkv) ||
		 !alloc_qmatrix(m, c->d_model, q_dim, &w->wo) ||
		 !alloc_qmatrix(m, 2 * c->d_ff, c->d_model, &w->w_gate_up) ||
		 !alloc_qmatrix(m, c->d_model, c->d_ff, &w->w_down)))
		return oom(err);
	if (fref)
	{
		if (!(w->f_wq = alloc_floats(m, (size_t) q_dim * c->d_model)) ||
			!(w->f_wk = alloc_floats(m, (size_t) kv_dim * c->d_model)) ||
			!(w->f_wv = alloc_floats(m, (size_t) kv_dim * c->d_model)) ||
			!(w->f_wo = alloc_floats(m, (size_t) c->d_model * q_dim)) ||
			!(w->f_gate = alloc_floats(m, (size_t) c->d_ff * c->d_model)) ||
			!(w->f_up = alloc_floats(m, (size_t) c->d_ff * c->d_model)) ||
			!(w->f_down = alloc_floats(m, (size_t) c->d_model * c->d_ff)))
			return oom(err);
	}
	if (!(w->attn_norm = alloc_floats(m, c->d_model)) ||
		!(w->ffn_norm = alloc_floats(m, c->d_model)) ||
		(int8 && !(w->attn_norm_i8 = alloc_floats(m, c->d_model))) ||
		(int8 && !(w->ffn_norm_i8 = alloc_floats(m, c->d_model))))
		return oom(err);
	m->weight_bytes += (size_t) 2 * c->d_model * sizeof(float);
	if ((st = load_vector(m, s->attn_norm, c->d_model, w->attn_norm, err)) != CAI_OK ||
		(st = load_vector(m, s->ffn_norm, c->d_model, w->ffn_norm, err)) != CAI_OK)
		return st;
	if (c->qk_norm)
	{
		if (!(w->attn_q_norm = alloc_floats(m, c->head_dim)) ||
			!(w->attn_k_norm = alloc_floats(m, c->head_dim)))
			return oom(err);
		if ((st = load_vector(m, s->q_norm, c->head_dim, w->attn_q_norm, err)) != CAI_OK ||
			(st = load_vector(m, s->k_norm, c->head_dim, w->attn_k_norm, err)) != CAI_OK)
			return st;
	}
	if (c->sandwich_norm)
	{
		if (!(w->attn_post_norm = alloc_floats(m, c->d_model)) ||
			!(w->ffn_post_norm = alloc_floats(m, c->d_model)))
			return oom(err);
		m->weight_bytes += (size_t) 2 * c->d_model * sizeof(float);
		if ((st = load_vector(m, s->attn_post_norm, c->d_model, w->attn_post_norm, err)) != CAI_OK ||
			(st = load_vector(m, s->ffn_post_norm, c->d_model, w->ffn_post_norm, err)) != CAI_OK)
			return st;
	}
	if (c->qkv_bias)
	{
		if (!(w->bqkv = alloc_floats(m, (size_t) q_dim + 2 * kv_dim)) ||
			(int8 && !(w->bqkv_i8 = alloc_floats(m, (size_t) q_dim + 2 * kv_dim))))
			return oom(err);
		w->bq = w->bqkv;
		w->bk = w->bqkv + q_dim;
		w->bv = w->bqkv + q_dim + kv_dim;
		if ((st = load_vector(m, s->bq, q_dim, w->bq, err)) != CAI_OK ||
			(st = load_vector(m, s->bk, kv_dim, w->bk, err)) != CAI_OK ||
			(st = load_vector(m, s->bv, kv_dim, w->bv, err)) != CAI_OK)
			return st;
	}
	return CAI_OK;
}

/* The final norm, and the RoPE frequency factors where the file has them (Llama 3.x). */
static cai_status
load_output_vectors(cai_model *m, const gguf_tensor *t_out_norm, const gguf_tensor *t_rope_freqs,
					cai_error *err)
{
	const cai_config *c = &m->cfg;
	cai_status	st;

	if (!(m->out_norm = alloc_floats(m, c->d_model)) ||
		!(m->out_norm_i8 = alloc_floats(m, c->d_model)))
		return oom(err);
	if ((st = load_vector(m, t_out_norm, c->d_model, m->out_norm, err)) != CAI_OK)
		return st;
	if (t_rope_freqs)
	{
		if (!(m->rope_freqs = alloc_floats(m, c->n_rot / 2)))
			return oom(err);
		if ((st = load_vector(m, t_rope_freqs, c->n_rot / 2, m->rope_freqs, err)) != CAI_OK)
			return st;
		for (int i = 0; i < c->n_rot / 2; i++)
			if (!(m->rope_freqs[i] > 0.0f) || !isfinite(m->rope_freqs[i]))
				return cai_fail(err, CAI_ERR_FORMAT, "tensor '%s' holds a non-positive factor",
								c->arch->tensors->rope_freqs);
	}
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The file's own formats
 * ------------------------------------------------------------------------------------------- */

/* Whether the GEMMs can multiply tensor t's levels as they are (quant.h's cai_block_levels). */
static bool
has_file_format(const gguf_tensor *t)
{
	return ggml_type_has_levels(t->type) && t->ne[0] % 32 == 0;
}

/*
 * Decides cai_model_params.weights for this file: *file when every GEMM matrix (the head, or
 * the embedding when tied, and each layer's seven) is in a format with levels, and for auto
 * when the matrices hold at least params->auto_file_min_weights weights.
 */
static cai_status
choose_weights(const cai_model_params *params, const cai_config *c, const cai_layer_sources *src,
			   const gguf_tensor *t_head, bool *file, int64_t *n_matrix_weights, cai_error *err)
{
	const gguf_tensor *other = has_file_format(t_head) ? NULL : t_head;
	int64_t		n_weights = t_head->n_elements;

	for (int l = 0; l < c->n_layers; l++)
	{
		const gguf_tensor *const mats[] = {src[l].wq, src[l].wk, src[l].wv, src[l].wo,
		src[l].gate, src[l].up, src[l].down};

		for (int i = 0; i < 7; i++)
		{
			n_weights += mats[i]->n_elements;
			if (!other && !has_file_format(mats[i]))
				other = mats[i];
		}
	}
	*n_matrix_weights = n_weights;
	*file = params->weights != CAI_WEIGHTS_INT8 && !other &&
		(params->weights == CAI_WEIGHTS_FILE || n_weights >= params->auto_file_min_weights);
	if (params->weights == CAI_WEIGHTS_FILE && other)
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"weights 'file' needs every matrix in a block format the engine multiplies "
						"directly (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k), but tensor "
						"'%.*s' is %s; use weights 'int8' or 'auto'",
						(int) other->name.len, other->name.ptr, ggml_type_name(other->type));
	return CAI_OK;
}

/*
 * params with auto numerics decided (cai.h, CAI_AUTO_FILE_MIN_WEIGHTS): GPTQ rounding and two
 * digits for the int8 path of a model under auto_file_min_weights matrix weights, nearest and
 * one digit otherwise.  What is set explicitly stays.
 */
static cai_model_params
decide_numerics(const cai_model_params *params, bool file, int64_t n_matrix_weights)
{
	cai_model_params decided = *params;
	const bool	precise = !file && n_matrix_weights < params->auto_file_min_weights;

	if (decided.rounding == CAI_ROUNDING_AUTO)
		decided.rounding = precise ? CAI_ROUNDING_GPTQ : CAI_ROUNDING_NEAREST;
	if (decided.activations == CAI_ACTIVATIONS_AUTO)
		decided.activations = precise ? CAI_ACTIVATIONS_TWO_DIGIT : CAI_ACTIVATIONS_INT8;
	return decided;
}

/* b = the tensors parts[0, n) stacked by rows (each validated: rows of k). */
static void
bmatrix_of(cai_bmatrix *b, int k, const gguf_tensor *const *parts, int n)
{
	memset(b, 0, sizeof(*b));
	b->k = k;
	b->n_parts = n;
	for (int i = 0; i < n; i++)
	{
		b->part[i].type = parts[i]->type;
		b->part[i].rows = (int) parts[i]->ne[1];
		b->part[i].data = parts[i]->data;
		b->n_out += b->part[i].rows;
	}
}

/* A float reference copy of a validated tensor (cai eval's float path). */
static cai_status
load_float_copy(cai_model *m, const gguf_tensor *t, float **out, cai_error *err)
{
	if (!(*out = alloc_floats(m, (size_t) t->n_elements)))
		return oom(err);
	return cai_dequantize_row(t->type, t->data, *out, t->n_elements, err);
}

/*
 * The file's own formats: no conversion at all.  The matrices stay in the model's mapping of
 * the file (each backend repacks them when a forward context is made); the small vectors are
 * loaded as for the int8 path; the float reference, when asked for, is dequantized directly.
 */
static cai_status
load_file_weights(cai_model *m, const cai_layer_sources *src, const gguf_tensor *t_embd,
				  const gguf_tensor *t_out, const gguf_tensor *t_out_norm,
				  const gguf_tensor *t_rope_freqs, bool fref, bool two_digit_keys, cai_error *err)
{
	const cai_config *c = &m->cfg;
	const int	q_dim = c->n_heads * c->head_dim;
	cai_status	st;

	/* the file path rotates only the query and key heads (forward.c): the others stay unused */
	if (!cai_model_make_rotation(m, c->d_model, &m->rot_model) ||
		!cai_model_make_rotation(m, c->d_ff, &m->rot_ff) ||
		!cai_model_make_rotation(m, c->head_dim, &m->rot_head))
		return oom(err);
	for (int l = 0; l < c->n_layers; l++)
	{
		const cai_layer_sources *s = &src[l];
		cai_layer_weights *w = &m->layers[l];
		const gguf_tensor *qkv[] = {s->wq, s->wk, s->wv};
		const gguf_tensor *gate_up[] = {s->gate, s->up};
		const gguf_tensor *const mats[] = {s->wq, s->wk, s->wv, s->wo, s->gate, s->up, s->down};
		float	  **const fcopy[] = {&w->f_wq, &w->f_wk, &w->f_wv, &w->f_wo, &w->f_gate, &w->f_up,
		&w->f_down};

		if ((st = load_layer_arrays(m, s, w, fref, false, err)) != CAI_OK)
			return st;
		bmatrix_of(&w->file_qkv, c->d_model, qkv, 3);
		bmatrix_of(&w->file_o, q_dim, &s->wo, 1);
		bmatrix_of(&w->file_gate_up, c->d_model, gate_up, 2);
		bmatrix_of(&w->file_down, c->d_ff, &s->down, 1);
		for (int i = 0; i < 7; i++)
		{
			m->weight_bytes += mats[i]->nbytes;
			if (fref && (st = cai_dequantize_row(mats[i]->type, mats[i]->data, *fcopy[i],
												 mats[i]->n_elements, err)) != CAI_OK)
				return st;
		}
	}
	if ((st = load_output_vectors(m, t_out_norm, t_rope_freqs, err)) != CAI_OK)
		return st;
	bmatrix_of(&m->file_embd, c->d_model, &t_embd, 1);
	bmatrix_of(&m->file_head, c->d_model, t_out ? &t_out : &t_embd, 1);
	m->weight_bytes += t_embd->nbytes + (t_out ? t_out->nbytes : 0);
	if (fref)
	{
		if ((st = load_float_copy(m, t_embd, &m->f_tok_embd, err)) != CAI_OK)
			return st;
		if (!t_out)
			m->f_lm_head = m->f_tok_embd;
		else if ((st = load_float_copy(m, t_out, &m->f_lm_head, err)) != CAI_OK)
			return st;
	}
	m->has_float_reference = fref;
	m->file_weights = true;
	/*
	 * What stays int8 on this path is the KV; two-digit activations give its keys a second
	 * digit (kv.h), the GEMMs' inputs being finer already (a scale per 32)
	 */
	m->two_digit_activations = two_digit_keys;
	return CAI_OK;
}

/* A conversion plan's per-thread scratch: rows as long as any matrix row. */
static bool
conversion_plan_init(cai_convert_plan *plan, const cai_config *c, int n_threads)
{
	const int	q_dim = c->n_heads * c->head_dim;

	plan->max_k = c->d_model;
	if (q_dim > plan->max_k)
		plan->max_k = q_dim;
	if (c->d_ff > plan->max_k)
		plan->max_k = c->d_ff;
	plan->n_threads = n_threads;
	plan->scratch = malloc((size_t) n_threads * 2 * plan->max_k * sizeof(float));
	plan->col_max = malloc((size_t) n_threads * plan->max_k * sizeof(float));
	plan->block_floats = (size_t) 2 * CONVERT_CHUNK_ROWS * plan->max_k;
	plan->block = malloc((size_t) n_threads * plan->block_floats * sizeof(float));
	return plan->scratch && plan->col_max && plan->block;
}

/* The tensors a model's weights come from (find_model_tensors). */
typedef struct model_tensors
{
	const gguf_tensor *embd,
			   *out,			/* NULL when the head is the embedding */
			   *out_norm,
			   *rope_freqs;		/* NULL when the file has none */
	cai_layer_sources *layers;	/* [n_layers], malloc'd */
} model_tensors;

/*
 * Finds and validates every tensor the weights come from (the vocabulary size from the
 * embedding's shape), counts the parameters and allocates the model's layers.
 */
static cai_status
find_model_tensors(cai_model *m, model_tensors *t, cai_error *err)
{
	const gguf_file *f = m->gguf;
	cai_config *c = &m->cfg;
	const cai_arch_tensors *tn = c->arch->tensors;
	cai_status	st;

	/* the vocabulary size comes from the embedding's shape */
	t->embd = gguf_find_tensor(f, tn->token_embd);
	if (!t->embd)
		return cai_fail(err, CAI_ERR_FORMAT, "missing tensor '%s'", tn->token_embd);
	if (t->embd->ne[1] < 1 || t->embd->ne[1] > (1 << 24))
		return cai_fail(err, CAI_ERR_FORMAT, "tensor '%s' has %lld rows", tn->token_embd,
						(long long) t->embd->ne[1]);
	c->n_vocab = (int) t->embd->ne[1];
	if ((st = find_tensor(f, tn->token_embd, c->d_model, c->n_vocab, true, &t->embd, err)) != CAI_OK)
		return st;
	if (tn->output &&
		(st = find_tensor(f, tn->output, c->d_model, c->n_vocab, false, &t->out, err)) != CAI_OK)
		return st;
	if ((st = find_tensor(f, tn->output_norm, c->d_model, 0, true, &t->out_norm, err)) != CAI_OK)
		return st;
	if (tn->rope_freqs &&
		(st = find_tensor(f, tn->rope_freqs, c->n_rot / 2, 0, false, &t->rope_freqs, err)) != CAI_OK)
		return st;
	c->tied_embeddings = (t->out == NULL);

	t->layers = calloc((size_t) c->n_layers, sizeof(cai_layer_sources));
	m->layers = cai_model_alloc(m, (size_t) c->n_layers * sizeof(cai_layer_weights));
	if (!t->layers || !m->layers)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory loading the model");
	memset(m->layers, 0, (size_t) c->n_layers * sizeof(cai_layer_weights));
	for (int l = 0; l < c->n_layers; l++)
		if ((st = find_layer_tensors(f, c, l, &t->layers[l], err)) != CAI_OK)
			return st;

	for (uint64_t i = 0; i < f->n_tensors; i++)
		m->n_params += f->tensors[i].n_elements;
	return CAI_OK;
}

/*
 * The int8 path's weights: everything allocated, the small vectors loaded, then every matrix
 * dequantized, calibrated, smoothed, rotated and requantized over a thread pool (convert.c,
 * calibrate.c).
 */
static cai_status
load_int8_weights(cai_model *m, const cai_model_params *params, const model_tensors *t,
				  cai_error *err)
{
	cai_config *c = &m->cfg;
	bool		fref = params->load_float_reference;
	const gguf_tensor *t_embd = t->embd,
			   *t_out = t->out;
	const cai_layer_sources *src = t->layers;
	float	   *head_wmax = NULL;
	cai_convert_plan plan;
	cai_threadpool *pool = NULL;
	int			n_threads;
	cai_status	st;

	memset(&plan, 0, sizeof(plan));
	atomic_init(&plan.failed, 0);

	/* allocate everything; load the small vectors */
#define OOM() do { st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory loading the model weights"); goto done; } while (0)
	if (!alloc_qmatrix(m, c->n_vocab, c->d_model, &m->tok_embd))
		OOM();
	if ((params->activations == CAI_ACTIVATIONS_TWO_DIGIT) &&
		!alloc_qmatrix(m, c->n_vocab, c->d_model, &m->tok_embd_second_digit))
		OOM();
	if (fref && !(m->f_tok_embd = alloc_floats(m, (size_t) c->n_vocab * c->d_model)))
		OOM();
	if (!alloc_qmatrix(m, c->n_vocab, c->d_model, &m->lm_head))	/* its own even when tied */
		OOM();
	if (t_out && fref && !(m->f_lm_head = alloc_floats(m, (size_t) c->n_vocab * c->d_model)))
		OOM();
	if (!cai_model_make_rotation(m, c->d_model, &m->rot_model) || !cai_model_make_rotation(m, c->d_ff, &m->rot_ff) ||
		!cai_model_make_rotation(m, c->head_dim, &m->rot_head))
		OOM();
	for (int l = 0; l < c->n_layers; l++)
		if ((st = load_layer_arrays(m, &src[l], &m->layers[l], fref, true, err)) != CAI_OK)
			goto done;
	if ((st = load_output_vectors(m, t->out_norm, t->rope_freqs, err)) != CAI_OK)
		goto done;

	/* a pool for the conversion */
	n_threads = params->n_threads > 0 ? params->n_threads : cai_cpu_count();
	if (n_threads > 64)
		n_threads = 64;
	pool = cai_threadpool_create(n_threads);
	head_wmax = malloc((size_t) c->d_model * sizeof(float));
	if (!pool || !head_wmax || !conversion_plan_init(&plan, c, n_threads))
		OOM();

	/*
	 * the embedding: plain requantization; the head's source (the embedding when tied) read for
	 * its column maxima, which its smoothing needs (cai_convert_layers converts it)
	 */
	if (m->tok_embd_second_digit.q)
	{
		/* with two-digit activations the embedding's rows, the first of them, get two too */
		if (!cai_plan_rows_two_digits(&plan, t_embd, c->d_model, c->n_vocab,
									  (int8_t *) m->tok_embd.q, (float *) m->tok_embd.scale,
									  (int8_t *) m->tok_embd_second_digit.q,
									  (float *) m->tok_embd_second_digit.scale, m->f_tok_embd, !t_out))
			OOM();
	}
	else if (!cai_plan_rows_rotated(&plan, t_embd, NULL, c->d_model, c->n_vocab,
									(int8_t *) m->tok_embd.q, (float *) m->tok_embd.scale,
									m->f_tok_embd, NULL, NULL, NULL, !t_out))
		OOM();
	if (t_out && !cai_plan_rows_rotated(&plan, t_out, NULL, c->d_model, c->n_vocab, NULL, NULL,
										m->f_lm_head, NULL, NULL, NULL, true))
		OOM();
	if ((st = cai_run_plan_col_max(pool, &plan, head_wmax, c->d_model, err)) != CAI_OK)
		goto done;

	/* the layers and the head: calibrated, smoothed, rotated, requantized */
	if ((st = cai_convert_layers(m, pool, &plan, src, t_embd, t_out ? t_out : t_embd, head_wmax,
							 fref, (params->rounding == CAI_ROUNDING_GPTQ), err)) != CAI_OK)
		goto done;
	m->gptq_rounding = (params->rounding == CAI_ROUNDING_GPTQ);
	/* set after calibration, which reads one-digit inputs as the weights were rounded for them */
	m->two_digit_activations = (params->activations == CAI_ACTIVATIONS_TWO_DIGIT);

	/* each backend prepares its own copy of the int8 weights (backend.h's prepare_i8) */
	for (int l = 0; l < c->n_layers; l++)
		layer_views(&m->layers[l], c);
	m->int8_complete = true;

	/* the tied head's float reference is the embedding */
	if (!t_out)
		m->f_lm_head = m->f_tok_embd;
	m->has_float_reference = fref;
	st = CAI_OK;
#undef OOM

done:
	cai_threadpool_free(pool);
	free(plan.jobs);
	free(plan.scratch);
	free(plan.block);
	free(plan.col_max);
	free(head_wmax);
	return st;
}

/*
 * The int8 path's weights from a mapped weights cache: the small vectors loaded as usual, the
 * tables and vectors conversion would make pointed into the file, and the GEMM matrices left
 * to the backend, which maps its own prepared copies (forward_weights.c).  *taken is false
 * when the file did not fit (the caller converts instead).
 */
static cai_status
load_int8_mapped(cai_model *m, const cai_model_params *params, const model_tensors *t,
				 bool *taken, cai_error *err)
{
	const cai_config *c = &m->cfg;
	const int	qkv = (c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
	const size_t vocab_bytes = (size_t) c->n_vocab * c->d_model + (size_t) c->n_vocab * 4;
	cai_status	st;

	*taken = false;
	for (int l = 0; l < c->n_layers; l++)
		if ((st = load_layer_arrays(m, &t->layers[l], &m->layers[l], false, false, err)) != CAI_OK)
			return st;
	if ((st = load_output_vectors(m, t->out_norm, t->rope_freqs, err)) != CAI_OK)
		return st;
	if (!cai_model_make_rotation(m, c->d_model, &m->rot_model) ||
		!cai_model_make_rotation(m, c->d_ff, &m->rot_ff) ||
		!cai_model_make_rotation(m, c->head_dim, &m->rot_head))
		return oom(err);
	/* which sections the file holds depends on it */
	m->two_digit_activations = (params->activations == CAI_ACTIVATIONS_TWO_DIGIT);
	if (!cai_model_wcache_take_int8(m))
	{
		m->two_digit_activations = false;
		m->weight_bytes = 0;
		return CAI_OK;
	}
	/* the GEMM matrices' shapes, without their bytes: the backend's copies are in the file */
	m->lm_head = (cai_qmatrix) {.n_out = c->n_vocab, .k = c->d_model};
	m->weight_bytes += vocab_bytes * (m->two_digit_activations ? 3 : 2);
	for (int l = 0; l < c->n_layers; l++)
	{
		cai_layer_weights *w = &m->layers[l];

		w->wqkv = (cai_qmatrix) {.n_out = qkv, .k = c->d_model};
		w->wo = (cai_qmatrix) {.n_out = c->d_model, .k = c->n_heads * c->head_dim};
		w->w_gate_up = (cai_qmatrix) {.n_out = 2 * c->d_ff, .k = c->d_model};
		w->w_down = (cai_qmatrix) {.n_out = c->d_model, .k = c->d_ff};
		w->wq = w->wk = w->wv = w->wqkv;
		w->w_gate = w->w_up = w->w_gate_up;
		m->weight_bytes += (size_t) qkv * (c->d_model + 4) +
			(size_t) c->d_model * (c->n_heads * c->head_dim + 4) +
			(size_t) 2 * c->d_ff * (c->d_model + 4) + (size_t) c->d_model * (c->d_ff + 4);
	}
	m->gptq_rounding = (params->rounding == CAI_ROUNDING_GPTQ);
	m->int8_complete = true;
	*taken = true;
	return CAI_OK;
}

/*
 * The weights: the file's own formats or int8 (cai_model_params.weights), converted, or mapped
 * from a weights cache of the same model and settings; auto numerics are decided here, once the
 * weights mode and the model's size are known.
 */
static cai_status
load_weights(cai_model *m, const char *path, const cai_model_params *asked, cai_error *err)
{
	model_tensors t;
	bool		file = false;
	bool		mapped = false;
	int64_t		n_matrix_weights = 0;
	double		start = cai_now_seconds();
	cai_model_params decided;
	const cai_model_params *params = &decided;
	cai_status	st;

	memset(&t, 0, sizeof(t));
	if ((st = find_model_tensors(m, &t, err)) != CAI_OK ||
		(st = choose_weights(asked, &m->cfg, t.layers, t.out ? t.out : t.embd, &file,
							 &n_matrix_weights, err)) != CAI_OK)
	{
		free(t.layers);
		return st;
	}
	decided = decide_numerics(asked, file, n_matrix_weights);
	if ((st = cai_model_wcache_open(m, path, params, file, err)) == CAI_OK)
	{
		if (file)
		{
			st = load_file_weights(m, t.layers, t.embd, t.out, t.out_norm, t.rope_freqs,
								   params->load_float_reference,
								   (params->activations == CAI_ACTIVATIONS_TWO_DIGIT), err);
			m->superblock_activations = (params->activations == CAI_ACTIVATIONS_INT8_256);
		}
		else if (m->wcache && m->wcache->state == CAI_WEIGHTS_CACHE_MAPPED)
			st = load_int8_mapped(m, params, &t, &mapped, err);
		if (st == CAI_OK && !file && !mapped)
			st = load_int8_weights(m, params, &t, err);
		/* the conversion's time so far; a forward context adds its preparation's */
		if (m->wcache && m->wcache->state != CAI_WEIGHTS_CACHE_MAPPED)
			m->wcache->seconds = cai_now_seconds() - start;
	}
	free(t.layers);
	return st;
}

/* The tokenizer (before the weights: calibration tokenizes its text). */
static cai_status
load_tokenizer(cai_model *m, cai_error *err)
{
	return cai_tokenizer_load(m->gguf, &m->tokenizer, err);
}

/* The chat template, and the tokenizer checked against the embedding. */
static cai_status
load_template(cai_model *m, const cai_model_params *params, cai_error *err)
{
	cai_status	st;
	gguf_str	s;
	char	   *jinja = NULL;

	if (cai_tokenizer_n_vocab(m->tokenizer) > m->cfg.n_vocab)
		return cai_fail(err, CAI_ERR_FORMAT,
						"the tokenizer has %d tokens but the embedding only %d rows",
						cai_tokenizer_n_vocab(m->tokenizer), m->cfg.n_vocab);
	if (params->chat_template && params->chat_template[0])
		return cai_chat_template_by_name(params->chat_template, m->tokenizer, &m->tmpl, err);
	if (gguf_get_str(m->gguf, "tokenizer.chat_template", &s))
	{
		jinja = malloc(s.len + 1);
		if (!jinja)
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory reading the chat template");
		memcpy(jinja, s.ptr, s.len);
		jinja[s.len] = '\0';
	}
	st = cai_chat_template_detect(jinja, m->cfg.arch_name, m->tokenizer, &m->tmpl, err);
	free(jinja);
	return st;
}

/*
 * Opens and validates the file, reads the config and the tokenizer, converts the weights
 * (calibrated, see cai_convert_layers), picks the chat template and fingerprints the model.
 */
cai_status
cai_model_load(const char *path, const cai_model_params *params, cai_model **out,
			   cai_error *err)
{
	cai_model_params defaults;
	cai_model  *m;
	cai_status	st;

	*out = NULL;
	if (!path)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "no model path given");
	if (!params)
	{
		cai_model_params_default(&defaults);
		params = &defaults;
	}
	m = cai_model_new();
	if (!m)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory loading the model");
	if ((st = gguf_open(path, &m->gguf, err)) != CAI_OK ||
		(st = cai_model_read_config(m, path, err)) != CAI_OK ||
		(st = load_tokenizer(m, err)) != CAI_OK ||
		(st = cai_model_content_hash(m, err)) != CAI_OK ||
		(st = load_weights(m, path, params, err)) != CAI_OK ||
		(st = load_template(m, params, err)) != CAI_OK ||
		(st = cai_model_fingerprint(m, err)) != CAI_OK)
	{
		cai_model_free(m);
		return st;
	}
	*out = m;
	return CAI_OK;
}
