/*
 * model.c — a model: loading a GGUF file into the engine's int8 layout and the public model
 * API (the forward: forward.c; the description and tokens: model_text.c; chat prompts:
 * chat_prompt.c).
 *
 * Loading validates every tensor the architecture needs (presence, type, shape) before touching
 * any data, then converts each weight matrix row by row — dequantize the source row to float,
 * smooth and rotate it (see "rotations"), requantize it to symmetric int8 per output channel —
 * in parallel over a thread pool.  Q/K/V of a layer become one matrix (one GEMM), gate/up
 * another.
 */
#include "model.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "backend.h"
#include "cpu/ops.h"
#include "cpu/rounding.h"
#include "forward_internal.h"
#include "quant.h"
#include "util.h"

/* Rows of a weight matrix converted per load task. */
#define CONVERT_CHUNK_ROWS CAI_ROUNDING_ROWS

/* ---------------------------------------------------------------------------------------------
 * Allocations owned by a model
 * ------------------------------------------------------------------------------------------- */

typedef struct model_owned
{
	void	  **ptrs;
	int			n;
	int			cap;
} model_owned;

/* 64-byte aligned memory freed with the model; NULL when out of memory. */
static void *
model_alloc(cai_model *m, size_t bytes)
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
	free(model);
}

/* ---------------------------------------------------------------------------------------------
 * Configuration from metadata
 * ------------------------------------------------------------------------------------------- */

/*
 * Reads {arch}.{suffix} as an unsigned 32-bit value; def when absent and not required (a NULL
 * suffix, a key the architecture does not have, is absent).
 */
static cai_status
read_arch_u32(const gguf_file *f, const char *arch, const char *suffix, bool required,
			  uint32_t def, uint32_t *out, cai_error *err)
{
	char		key[160];

	if (!suffix)
	{
		*out = def;
		return CAI_OK;
	}
	snprintf(key, sizeof(key), "%s.%s", arch, suffix);
	if (!gguf_find_kv(f, key))
	{
		if (required)
			return cai_fail(err, CAI_ERR_FORMAT, "missing metadata key '%s'", key);
		*out = def;
		return CAI_OK;
	}
	if (!gguf_get_u32(f, key, out))
		return cai_fail(err, CAI_ERR_FORMAT,
						"metadata key '%s' is not an unsigned 32-bit integer", key);
	return CAI_OK;
}

static cai_status
read_arch_f32(const gguf_file *f, const char *arch, const char *suffix, bool required,
			  float def, float *out, cai_error *err)
{
	char		key[160];

	if (!suffix)
	{
		*out = def;
		return CAI_OK;
	}
	snprintf(key, sizeof(key), "%s.%s", arch, suffix);
	if (!gguf_find_kv(f, key))
	{
		if (required)
			return cai_fail(err, CAI_ERR_FORMAT, "missing metadata key '%s'", key);
		*out = def;
		return CAI_OK;
	}
	if (!gguf_get_f32(f, key, out) || !isfinite(*out))
		return cai_fail(err, CAI_ERR_FORMAT, "metadata key '%s' is not a finite number", key);
	return CAI_OK;
}

/* Sets each layer's KV index and the count of KV-owning layers from kv_source. */
cai_status
cai_config_update_kv_sharing(cai_config *cfg, cai_error *err)
{
	int			n = 0;

	for (int l = 0; l < cfg->n_layers; l++)
	{
		int			src = cfg->kv_source[l];

		if (src < 0 || src > l)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"layer %d reads the kv of layer %d; it must be an earlier layer or itself",
							l, src);
		if (cfg->kv_source[src] != src)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"layer %d reads the kv of layer %d, which does not own its kv", l, src);
		if (cfg->attn_window[l] < 0)
			return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
							"layer %d has a negative attention window", l);
		if (src == l)
			cfg->kv_index[l] = n++;
		else
			cfg->kv_index[l] = cfg->kv_index[src];
	}
	cfg->n_kv_layers = n;
	return CAI_OK;
}

/*
 * Each layer's attention window and KV source, as the description declares them (see
 * arch.h's cai_arch_attention); by default every layer attends globally and owns its KV.
 */
static cai_status
read_layer_attention(const gguf_file *f, cai_config *c, cai_error *err)
{
	const cai_arch_desc *a = c->arch;
	const char *arch = c->arch_name;
	uint32_t	window = 0;
	uint32_t	n_shared = 0;
	cai_status	st;

	if (a->attention.window_period > 0)
	{
		if ((st = read_arch_u32(f, arch, a->attention.window_key, true, 0, &window, err)) != CAI_OK)
			return st;
		if (window < 1 || window > (1u << 24))
			return cai_fail(err, CAI_ERR_FORMAT, "sliding window %u is out of range", window);
	}
	for (int l = 0; l < c->n_layers; l++)
	{
		bool		global = a->attention.window_period <= 0 ||
			l % a->attention.window_period == a->attention.window_period - 1;

		c->attn_window[l] = global ? 0 : (int) window;
		c->kv_source[l] = l;
	}
	if ((st = read_arch_u32(f, arch, a->attention.shared_kv_layers_key, false, 0, &n_shared,
							err)) != CAI_OK)
		return st;
	if (n_shared >= (uint32_t) c->n_layers)
		return cai_fail(err, CAI_ERR_FORMAT, "%u of %d layers share another layer's kv", n_shared,
						c->n_layers);
	for (int l = c->n_layers - (int) n_shared; l < c->n_layers; l++)
	{
		/* the last owning layer of the same kind */
		int			src = c->n_layers - (int) n_shared - 1;

		while (src >= 0 && (c->attn_window[src] > 0) != (c->attn_window[l] > 0))
			src--;
		if (src < 0)
			return cai_fail(err, CAI_ERR_FORMAT,
							"layer %d shares the kv of an earlier layer like it, but there is none", l);
		c->kv_source[l] = src;
	}
	return cai_config_update_kv_sharing(c, err);
}

/* Fills m->cfg from the file's metadata (shapes checked against tensors later). */
static cai_status
read_config(cai_model *m, const char *path, cai_error *err)
{
	const gguf_file *f = m->gguf;
	cai_config *c = &m->cfg;
	const char *arch = c->arch_name;
	const cai_arch_desc *a;
	const cai_arch_keys *k;
	uint32_t	u;
	uint32_t	head_dim = 0;
	cai_status	st;
	gguf_str	s;
	float		factor;

	if (!gguf_get_cstr(f, "general.architecture", c->arch_name, sizeof(c->arch_name)))
		return cai_fail(err, CAI_ERR_FORMAT, "missing metadata key 'general.architecture'");
	a = cai_arch_find(arch);
	if (!a)
	{
		char		list[256];

		cai_arch_list(list, sizeof(list));
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"unsupported model architecture '%s' (supported: %s)", arch, list);
	}
	if (a->norm != CAI_NORM_PRE || a->activation != CAI_ACT_SWIGLU)
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"architecture '%s' needs a norm placement or activation the engine lacks", arch);
	c->arch = a;
	k = a->keys;

	if (!gguf_get_cstr(f, "general.name", c->name, sizeof(c->name)) || c->name[0] == '\0')
	{
		const char *base = strrchr(path, '/');

		snprintf(c->name, sizeof(c->name), "%s", base ? base + 1 : path);
	}

	if ((st = read_arch_u32(f, arch, k->block_count, true, 0, &u, err)) != CAI_OK)
		return st;
	c->n_layers = (int) u;
	if ((st = read_arch_u32(f, arch, k->embedding_length, true, 0, &u, err)) != CAI_OK)
		return st;
	c->d_model = (int) u;
	if ((st = read_arch_u32(f, arch, k->feed_forward_length, true, 0, &u, err)) != CAI_OK)
		return st;
	c->d_ff = (int) u;
	if ((st = read_arch_u32(f, arch, k->head_count, true, 0, &u, err)) != CAI_OK)
		return st;
	c->n_heads = (int) u;
	if ((st = read_arch_u32(f, arch, k->head_count_kv, false, u, &u, err)) != CAI_OK)
		return st;
	c->n_kv_heads = (int) u;
	if ((st = read_arch_u32(f, arch, k->context_length, false, 2048, &u, err)) != CAI_OK)
		return st;
	c->context_length = (int) u;
	if ((st = read_arch_f32(f, arch, k->rope_freq_base, false, a->rope.base, &c->rope_base,
							err)) != CAI_OK)
		return st;
	if ((st = read_arch_f32(f, arch, k->rms_norm_eps, true, 0, &c->norm_eps, err)) != CAI_OK)
		return st;

	if (c->n_layers < 1 || c->n_layers > 1024)
		return cai_fail(err, CAI_ERR_FORMAT, "%s.block_count %d is out of range", arch, c->n_layers);
	if (c->d_model < 1 || c->d_model > 65536 || c->d_ff < 1 || c->d_ff > 262144)
		return cai_fail(err, CAI_ERR_FORMAT, "embedding length %d or feed-forward length %d is out of range",
						c->d_model, c->d_ff);
	if (c->n_heads < 1 || c->n_heads > 1024 || c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads != 0)
		return cai_fail(err, CAI_ERR_FORMAT,
						"%d attention heads cannot share %d kv heads evenly", c->n_heads, c->n_kv_heads);
	if (c->context_length < 1)
		return cai_fail(err, CAI_ERR_FORMAT, "%s.context_length must be positive", arch);
	if (!(c->norm_eps > 0.0f) || !(c->rope_base > 0.0f))
		return cai_fail(err, CAI_ERR_FORMAT, "rms epsilon and rope base must be positive");

	/* head size: key_length when given, else d_model / n_heads */
	if ((st = read_arch_u32(f, arch, k->key_length, false, 0, &head_dim, err)) != CAI_OK)
		return st;
	if (head_dim == 0)
	{
		if (c->d_model % c->n_heads != 0)
			return cai_fail(err, CAI_ERR_FORMAT, "embedding length %d is not a multiple of %d heads",
							c->d_model, c->n_heads);
		head_dim = (uint32_t) (c->d_model / c->n_heads);
	}
	else
	{
		uint32_t	vlen;

		if ((st = read_arch_u32(f, arch, k->value_length, false, head_dim, &vlen, err)) != CAI_OK)
			return st;
		if (vlen != head_dim)
			return cai_fail(err, CAI_ERR_UNSUPPORTED,
							"key length %u differs from value length %u", head_dim, vlen);
	}
	c->head_dim = (int) head_dim;
	if (c->head_dim % 8 != 0 || c->head_dim > 512)
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"head size %d is not supported (a multiple of 8 up to 512)", c->head_dim);
	if ((st = read_arch_u32(f, arch, k->rope_dimension_count, false, head_dim, &u, err)) != CAI_OK)
		return st;
	c->n_rot = (int) u;
	if (c->n_rot < 2 || c->n_rot % 2 != 0 || c->n_rot > c->head_dim)
		return cai_fail(err, CAI_ERR_FORMAT, "rope dimension count %d does not fit head size %d",
						c->n_rot, c->head_dim);
	c->rope_neox = (a->rope.style == CAI_ROPE_NEOX);

	/* rope scaling: none or linear */
	c->rope_freq_scale = 1.0f;
	{
		char		key[160];

		snprintf(key, sizeof(key), "%s.%s", arch, k->rope_scaling_type ? k->rope_scaling_type : "");
		if (k->rope_scaling_type && gguf_get_str(f, key, &s) && !gguf_str_eq(s, "none"))
		{
			if (!gguf_str_eq(s, "linear"))
				return cai_fail(err, CAI_ERR_UNSUPPORTED, "unsupported rope scaling type '%.*s'",
								(int) (s.len > 32 ? 32 : s.len), s.ptr);
			if ((st = read_arch_f32(f, arch, k->rope_scaling_factor, true, 1, &factor, err)) != CAI_OK)
				return st;
			if (!(factor > 0.0f))
				return cai_fail(err, CAI_ERR_FORMAT, "rope scaling factor must be positive");
			c->rope_freq_scale = 1.0f / factor;
		}
		snprintf(key, sizeof(key), "%s.%s", arch, k->rope_scale_linear ? k->rope_scale_linear : "");
		if (k->rope_scale_linear && gguf_get_f32(f, key, &factor) && factor > 0.0f &&
			factor != 1.0f)
			c->rope_freq_scale = 1.0f / factor;
	}

	/* the GEMM kernels want every reduction length a multiple of 4 */
	if (c->d_model % 4 != 0 || c->d_ff % 4 != 0 || (c->n_heads * c->head_dim) % 4 != 0)
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"model widths must be multiples of 4 (d_model %d, d_ff %d)", c->d_model, c->d_ff);

	/* required biases, or optional ones the file has (layer 0 decides for every layer) */
	c->qkv_bias = a->qkv_bias == CAI_QKV_BIAS_REQUIRED;
	if (!c->qkv_bias && a->tensors->attn_q_bias)
	{
		char		name[96];

		snprintf(name, sizeof(name), "blk.0.%s", a->tensors->attn_q_bias);
		c->qkv_bias = gguf_find_tensor(f, name) != NULL;
	}
	c->attn_window = model_alloc(m, (size_t) c->n_layers * sizeof(int));
	c->kv_source = model_alloc(m, (size_t) c->n_layers * sizeof(int));
	c->kv_index = model_alloc(m, (size_t) c->n_layers * sizeof(int));
	if (!c->attn_window || !c->kv_source || !c->kv_index)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory reading the model config");
	return read_layer_attention(f, c, err);
}

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
						"(supported: f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q5_k, q6_k)",
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

/* The source tensors of one layer. */
typedef struct layer_sources
{
	const gguf_tensor *attn_norm,
			   *wq,
			   *wk,
			   *wv,
			   *wo,
			   *bq,
			   *bk,
			   *bv,
			   *ffn_norm,
			   *gate,
			   *up,
			   *down;
} layer_sources;

static cai_status
find_layer_tensors(const gguf_file *f, const cai_config *c, int l, layer_sources *ls,
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
	FIND(ffn_norm, tn->ffn_norm, c->d_model, 0, true);
	FIND(gate, tn->ffn_gate, c->d_model, c->d_ff, true);
	FIND(up, tn->ffn_up, c->d_model, c->d_ff, true);
	FIND(down, tn->ffn_down, c->d_ff, c->d_model, true);
#undef FIND

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

/* ---------------------------------------------------------------------------------------------
 * Weight conversion (parallel)
 * ------------------------------------------------------------------------------------------- */

/*
 * One conversion task: rows [row0, row1) of a matrix.  The source rows are the GGUF tensor's
 * (dequantized; also stored to f when it is not NULL) or float rows fsrc.  When q is not NULL
 * each row, multiplied element-wise by col_scale and by row_scale[r] (both optional), then
 * rotated block by block (each rot->n values, when rot is not NULL), is quantized to int8: to
 * the nearest level, or, with rm, the job's rows together along that metric (cpu/rounding.h).
 * track_col_max: the source rows' per-column maxima of |value| go to the plan's col_max.
 */
typedef struct convert_job
{
	const gguf_tensor *src;		/* source tensor, or NULL when fsrc is given */
	const float *fsrc;			/* float source of row 0, or NULL */
	int			k;				/* row length (ne0) */
	int			row0;
	int			row1;
	int8_t	   *q;				/* int8 destination of row 0, or NULL */
	float	   *scale;			/* its scales */
	float	   *f;				/* float destination of row 0, or NULL */
	const float *col_scale;		/* [k] or NULL */
	const float *row_scale;		/* [rows] or NULL */
	const cai_rotation *rot;	/* or NULL */
	const cai_rounding_metric *rm;	/* error-compensating rounding along this metric, or NULL */
	bool		track_col_max;
} convert_job;

typedef struct convert_plan
{
	convert_job *jobs;
	int			n_jobs;
	int			cap;
	int			max_k;			/* the scratch rows' length */
	float	   *scratch;		/* [n_threads][2][max_k] */
	float	   *block;			/* [n_threads][block_floats]: rows rounded together (rm) */
	size_t		block_floats;
	float	   *col_max;		/* [n_threads][max_k] per-thread column maxima, or NULL */
	int			n_threads;
	atomic_int	failed;
	cai_error	error;
} convert_plan;

/* Adds the jobs converting a whole matrix of `rows` rows (see convert_job). */
static bool
plan_rows_compensated(convert_plan *p, const gguf_tensor *src, const float *fsrc, int k,
					  int rows, int8_t *q, float *scale, float *f, const float *col_scale,
					  const float *row_scale, const cai_rotation *rot,
					  const cai_rounding_metric *rm, bool track_col_max)
{
	for (int r = 0; r < rows; r += CONVERT_CHUNK_ROWS)
	{
		convert_job *j;

		if (p->n_jobs == p->cap)
		{
			int			cap = p->cap ? p->cap * 2 : 1024;
			convert_job *jobs = realloc(p->jobs, (size_t) cap * sizeof(convert_job));

			if (!jobs)
				return false;
			p->jobs = jobs;
			p->cap = cap;
		}
		j = &p->jobs[p->n_jobs++];
		j->src = src;
		j->fsrc = fsrc;
		j->k = k;
		j->row0 = r;
		j->row1 = r + CONVERT_CHUNK_ROWS < rows ? r + CONVERT_CHUNK_ROWS : rows;
		j->q = q;
		j->scale = scale;
		j->f = f;
		j->col_scale = col_scale;
		j->row_scale = row_scale;
		j->rot = rot;
		j->rm = rm;
		j->track_col_max = track_col_max;
	}
	return true;
}

/* The same with nearest rounding. */
static bool
plan_rows_rotated(convert_plan *p, const gguf_tensor *src, const float *fsrc, int k, int rows,
				  int8_t *q, float *scale, float *f, const float *col_scale,
				  const float *row_scale, const cai_rotation *rot, bool track_col_max)
{
	return plan_rows_compensated(p, src, fsrc, k, rows, q, scale, f, col_scale, row_scale, rot,
								 NULL, track_col_max);
}

/* The same without rotation or column maxima. */
static bool
plan_rows(convert_plan *p, const gguf_tensor *src, const float *fsrc, int k, int rows,
		  int8_t *q, float *scale, float *f, const float *col_scale, const float *row_scale)
{
	return plan_rows_rotated(p, src, fsrc, k, rows, q, scale, f, col_scale, row_scale, NULL,
							 false);
}

static void
convert_task(void *arg, int task, int thread)
{
	convert_plan *p = arg;
	const convert_job *j = &p->jobs[task];
	size_t		row_bytes = 0;
	float	   *tmp = p->scratch + (size_t) thread * 2 * p->max_k;
	float	   *scaled = tmp + p->max_k;
	float	   *block = p->block ? p->block + (size_t) thread * p->block_floats : NULL;
	cai_error	e;

	if (atomic_load(&p->failed))
		return;
	if (j->src && !ggml_row_bytes(j->src->type, j->k, &row_bytes))
		return;					/* validated before planning */
	for (int r = j->row0; r < j->row1; r++)
	{
		const float *row;

		if (j->fsrc)
			row = j->fsrc + (size_t) r * j->k;
		else
		{
			const uint8_t *src = (const uint8_t *) j->src->data + (size_t) r * row_bytes;
			float	   *dst = j->f ? j->f + (size_t) r * j->k : tmp;

			if (cai_dequantize_row(j->src->type, src, dst, j->k, &e) != CAI_OK)
			{
				if (atomic_exchange(&p->failed, 1) == 0)
					p->error = e;
				return;
			}
			row = dst;
		}
		if (j->track_col_max)
		{
			float	   *cm = p->col_max + (size_t) thread * p->max_k;

			for (int i = 0; i < j->k; i++)
				cm[i] = fabsf(row[i]) > cm[i] ? fabsf(row[i]) : cm[i];
		}
		if (!j->q)
			continue;
		if (j->col_scale || j->row_scale || j->rot)
		{
			float		rs = j->row_scale ? j->row_scale[r] : 1.0f;

			for (int i = 0; i < j->k; i++)
				scaled[i] = row[i] * (j->col_scale ? j->col_scale[i] : 1.0f) * rs;
			if (j->rot)
				for (int b = 0; b < j->k; b += j->rot->n)
					cai_op_rotate_vec(j->rot, scaled + b);
			row = scaled;
		}
		if (j->rm)
			memcpy(block + (size_t) (r - j->row0) * j->k, row, (size_t) j->k * sizeof(float));
		else
			cai_quantize_row_i8(row, j->k, j->q + (size_t) r * j->k, &j->scale[r]);
	}
	if (j->rm)
		cai_round_rows_i8(block, j->row1 - j->row0, j->k, j->rm, j->q + (size_t) j->row0 * j->k,
						  j->scale + j->row0, block + (size_t) CONVERT_CHUNK_ROWS * j->k);
}

/*
 * Runs the planned jobs on the pool and empties the plan.  col_max (k values, or NULL): receives
 * the column maxima of the jobs that tracked them (a maximum does not depend on the order).
 */
static cai_status
run_plan_col_max(cai_threadpool *pool, convert_plan *p, float *col_max, int k, cai_error *err)
{
	if (col_max)
		memset(p->col_max, 0, (size_t) p->n_threads * p->max_k * sizeof(float));
	cai_threadpool_run(pool, convert_task, p, p->n_jobs);
	p->n_jobs = 0;
	if (atomic_load(&p->failed))
	{
		if (err)
			*err = p->error;
		return p->error.status != CAI_OK ? p->error.status : CAI_ERR_FORMAT;
	}
	if (col_max)
		for (int i = 0; i < k; i++)
		{
			col_max[i] = 0.0f;
			for (int t = 0; t < p->n_threads; t++)
			{
				float		v = p->col_max[(size_t) t * p->max_k + i];

				col_max[i] = v > col_max[i] ? v : col_max[i];
			}
		}
	return CAI_OK;
}

/* Runs the planned jobs on the pool and empties the plan. */
static cai_status
run_plan(cai_threadpool *pool, convert_plan *p, cai_error *err)
{
	return run_plan_col_max(pool, p, NULL, 0, err);
}

/* The GEMM operands to pack for the CPU kernels (gemm.h), one pool task each. */
typedef struct pack_plan
{
	cai_qmatrix **mats;
	int			n;
	atomic_int	failed;
} pack_plan;

static void
pack_task(void *arg, int task, int thread)
{
	pack_plan  *p = arg;

	if (!cai_qmatrix_pack(p->mats[task]))
		atomic_store(&p->failed, 1);
}

/* Allocates a row-major int8 matrix [n_out, k] with its scales. */
static bool
alloc_qmatrix(cai_model *m, int n_out, int k, cai_qmatrix *out)
{
	int8_t	   *q = model_alloc(m, (size_t) n_out * k);
	float	   *scale = model_alloc(m, (size_t) n_out * sizeof(float));

	if (!q || !scale)
		return false;
	out->n_out = n_out;
	out->k = k;
	out->q = q;
	out->scale = scale;
	out->packed = false;
	m->weight_bytes += (size_t) n_out * k + (size_t) n_out * sizeof(float);
	return true;
}

/*
 * Rows [row0, row0 + n) of a matrix as a matrix of their own (sharing memory).  Of a packed
 * matrix, only a view starting at a multiple of CAI_QMATRIX_PANEL is a CPU GEMM operand; the
 * others (wk, wv when q_dim is not such a multiple) serve their scales and, for a GPU backend,
 * their place in the row-major device copy.
 */
static cai_qmatrix
qmatrix_rows(const cai_qmatrix *m, int row0, int n)
{
	cai_qmatrix v;

	v.n_out = n;
	v.k = m->k;
	v.q = m->q + (size_t) row0 * m->k;
	v.scale = m->scale + row0;
	v.packed = m->packed;
	return v;
}

/* The layer's views of its fused matrices, made once they are packed (views copy the flag). */
static void
layer_views(cai_layer_weights *w, const cai_config *c)
{
	int			q_dim = c->n_heads * c->head_dim;
	int			kv_dim = c->n_kv_heads * c->head_dim;

	w->wq = qmatrix_rows(&w->wqkv, 0, q_dim);
	w->wk = qmatrix_rows(&w->wqkv, q_dim, kv_dim);
	w->wv = qmatrix_rows(&w->wqkv, q_dim + kv_dim, kv_dim);
	w->w_gate = qmatrix_rows(&w->w_gate_up, 0, c->d_ff);
	w->w_up = qmatrix_rows(&w->w_gate_up, c->d_ff, c->d_ff);
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
	return model_alloc(m, bytes);
}

/* ---------------------------------------------------------------------------------------------
 * Fingerprint
 * ------------------------------------------------------------------------------------------- */

static size_t
value_type_bytes(gguf_value_type t)
{
	switch (t)
	{
		case GGUF_TYPE_UINT8:
		case GGUF_TYPE_INT8:
		case GGUF_TYPE_BOOL:
			return 1;
		case GGUF_TYPE_UINT16:
		case GGUF_TYPE_INT16:
			return 2;
		case GGUF_TYPE_UINT32:
		case GGUF_TYPE_INT32:
		case GGUF_TYPE_FLOAT32:
			return 4;
		case GGUF_TYPE_UINT64:
		case GGUF_TYPE_INT64:
		case GGUF_TYPE_FLOAT64:
			return 8;
		default:
			return 0;
	}
}

/*
 * XXH3-64 over the architecture and config, every tensor's name, type, shape and bytes, and
 * the tokenizer's metadata: two files give the same fingerprint only if they compute the same
 * function of the same tokens, which is what the prefix cache's keys must guarantee.
 */
static cai_status
compute_fingerprint(cai_model *m, cai_error *err)
{
	const gguf_file *f = m->gguf;
	const cai_config *c = &m->cfg;
	XXH3_state_t *state = XXH3_createState();
	int32_t		ints[12];
	float		floats[4];

	if (!state)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory hashing the model");
	XXH3_64bits_reset_withSeed(state, 0x70675f636169ULL);	/* "pg_cai" */
	XXH3_64bits_update(state, c->arch_name, strlen(c->arch_name) + 1);
	ints[0] = c->n_layers;
	ints[1] = c->d_model;
	ints[2] = c->n_heads;
	ints[3] = c->n_kv_heads;
	ints[4] = c->head_dim;
	ints[5] = c->d_ff;
	ints[6] = c->n_vocab;
	ints[7] = c->context_length;
	ints[8] = c->n_rot;
	ints[9] = c->rope_neox;
	ints[10] = c->tied_embeddings;
	ints[11] = c->qkv_bias;
	floats[0] = c->norm_eps;
	floats[1] = c->rope_base;
	floats[2] = c->rope_freq_scale;
	floats[3] = 0.0f;
	XXH3_64bits_update(state, ints, sizeof(ints));
	XXH3_64bits_update(state, floats, sizeof(floats));
	for (int l = 0; l < c->n_layers; l++)
	{
		int32_t		lay[2] = {c->attn_window[l], c->kv_source[l]};

		XXH3_64bits_update(state, lay, sizeof(lay));
	}
	for (uint64_t i = 0; i < f->n_tensors; i++)
	{
		const gguf_tensor *t = &f->tensors[i];
		int64_t		shape[GGUF_MAX_DIMS + 1];

		XXH3_64bits_update(state, t->name.ptr, t->name.len);
		for (int d = 0; d < GGUF_MAX_DIMS; d++)
			shape[d] = t->ne[d];
		shape[GGUF_MAX_DIMS] = t->type;
		XXH3_64bits_update(state, shape, sizeof(shape));
		XXH3_64bits_update(state, t->data, t->nbytes);
	}
	for (uint64_t i = 0; i < f->n_kv; i++)
	{
		const gguf_kv *kv = &f->kv[i];
		uint32_t	type = kv->type;

		if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10) != 0)
			continue;
		XXH3_64bits_update(state, kv->key.ptr, kv->key.len);
		XXH3_64bits_update(state, &type, sizeof(type));
		if (kv->type == GGUF_TYPE_STRING)
			XXH3_64bits_update(state, kv->v.str.ptr, kv->v.str.len);
		else if (kv->type == GGUF_TYPE_ARRAY)
		{
			uint32_t	et = kv->v.arr.elem_type;

			XXH3_64bits_update(state, &et, sizeof(et));
			XXH3_64bits_update(state, &kv->v.arr.n, sizeof(kv->v.arr.n));
			if (kv->v.arr.elem_type == GGUF_TYPE_STRING && kv->v.arr.strs)
			{
				for (uint64_t j = 0; j < kv->v.arr.n; j++)
				{
					XXH3_64bits_update(state, &kv->v.arr.strs[j].len, sizeof(uint64_t));
					XXH3_64bits_update(state, kv->v.arr.strs[j].ptr, kv->v.arr.strs[j].len);
				}
			}
			else if (value_type_bytes(kv->v.arr.elem_type) && kv->v.arr.data)
				XXH3_64bits_update(state, kv->v.arr.data,
								   kv->v.arr.n * value_type_bytes(kv->v.arr.elem_type));
		}
		else
			XXH3_64bits_update(state, &kv->v, sizeof(kv->v.u64));
	}
	m->fingerprint = XXH3_64bits_digest(state);
	XXH3_freeState(state);
	return CAI_OK;
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
	params->compensated_rounding = false;
}

static cai_status convert_layers(cai_model *m, cai_threadpool *pool, convert_plan *plan,
							   const layer_sources *src, const gguf_tensor *t_embd,
							   const gguf_tensor *t_head, const float *head_wmax, bool fref,
							   bool compensated, cai_error *err);

/*
 * A power-of-two part this long is rotated as independent blocks without the mix (which costs
 * n_mix multiply-adds per value).  Measured on SmolLM2-135M (d_model 576 = 64 x 9, d_ff 1536 =
 * 512 x 3), KL of the int8 path over the first 2048 GPL-3 tokens: every width mixed 0.00391,
 * d_ff as blocks of 512 0.00393, d_model also as blocks of 64 0.00411 (top-1 96.6%, 96.3%,
 * 96.2%), while the mix of 9 more than doubles the time of a d_model rotation.
 */
#define ROTATION_BLOCK_ENOUGH 64

/*
 * The rotation of vectors of n values (backend.h's cai_rotation): n_pow2 the largest power of
 * two dividing n, and the n / n_pow2 chunks mixed by the discrete Hartley transform,
 * M[a][b] = cos(2 pi ab/m) + sin(2 pi ab/m), which is sqrt(m) times an orthogonal matrix for
 * every m (and symmetric, so R is its own inverse).  With chunks of ROTATION_BLOCK_ENOUGH or
 * more, or more than CAI_ROTATION_MAX_MIX chunks, the rotation covers n_pow2 values and a
 * vector is rotated as separate blocks.
 */
static bool
make_rotation(cai_model *m, int n, cai_rotation *r)
{
	int			p = 1;
	int			mix;
	float	   *t;

	while (n % (2 * p) == 0)
		p *= 2;
	mix = n / p;
	if (mix > CAI_ROTATION_MAX_MIX || p >= ROTATION_BLOCK_ENOUGH)
	{
		n = p;
		mix = 1;
	}
	t = model_alloc(m, (size_t) mix * mix * sizeof(float));
	if (!t)
		return false;
	for (int a = 0; a < mix; a++)
		for (int b = 0; b < mix; b++)
		{
			double		theta = 2.0 * M_PI * (double) ((a * b) % mix) / (double) mix;

			t[a * mix + b] = (float) (cos(theta) + sin(theta));
		}
	r->n = n;
	r->n_pow2 = p;
	r->n_mix = mix;
	r->mix = t;
	r->norm = (float) (1.0 / sqrt((double) n));
	return true;
}

/* Validates every tensor, allocates the engine's weights and converts them on a pool. */
static cai_status
load_weights(cai_model *m, const cai_model_params *params, cai_error *err)
{
	const gguf_file *f = m->gguf;
	cai_config *c = &m->cfg;
	const cai_arch_tensors *tn = c->arch->tensors;
	bool		fref = params->load_float_reference;
	int			q_dim = c->n_heads * c->head_dim;
	int			kv_dim = c->n_kv_heads * c->head_dim;
	const gguf_tensor *t_embd,
			   *t_out,
			   *t_out_norm,
			   *t_rope_freqs;
	float	   *head_wmax = NULL;
	layer_sources *src = NULL;
	convert_plan plan;
	pack_plan	pack = {0};
	cai_threadpool *pool = NULL;
	int			n_threads;
	cai_status	st;

	memset(&plan, 0, sizeof(plan));
	atomic_init(&plan.failed, 0);

	/* the vocabulary size comes from the embedding's shape */
	t_embd = gguf_find_tensor(f, tn->token_embd);
	if (!t_embd)
		return cai_fail(err, CAI_ERR_FORMAT, "missing tensor '%s'", tn->token_embd);
	if (t_embd->ne[1] < 1 || t_embd->ne[1] > (1 << 24))
		return cai_fail(err, CAI_ERR_FORMAT, "tensor '%s' has %lld rows", tn->token_embd,
						(long long) t_embd->ne[1]);
	c->n_vocab = (int) t_embd->ne[1];
	t_out = t_rope_freqs = NULL;
	if ((st = find_tensor(f, tn->token_embd, c->d_model, c->n_vocab, true, &t_embd, err)) != CAI_OK)
		return st;
	if (tn->output &&
		(st = find_tensor(f, tn->output, c->d_model, c->n_vocab, false, &t_out, err)) != CAI_OK)
		return st;
	if ((st = find_tensor(f, tn->output_norm, c->d_model, 0, true, &t_out_norm, err)) != CAI_OK)
		return st;
	if (tn->rope_freqs &&
		(st = find_tensor(f, tn->rope_freqs, c->n_rot / 2, 0, false, &t_rope_freqs, err)) != CAI_OK)
		return st;
	c->tied_embeddings = (t_out == NULL);

	src = calloc((size_t) c->n_layers, sizeof(layer_sources));
	m->layers = model_alloc(m, (size_t) c->n_layers * sizeof(cai_layer_weights));
	if (!src || !m->layers)
	{
		free(src);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory loading the model");
	}
	memset(m->layers, 0, (size_t) c->n_layers * sizeof(cai_layer_weights));
	for (int l = 0; l < c->n_layers; l++)
	{
		if ((st = find_layer_tensors(f, c, l, &src[l], err)) != CAI_OK)
		{
			free(src);
			return st;
		}
	}

	for (uint64_t i = 0; i < f->n_tensors; i++)
		m->n_params += f->tensors[i].n_elements;

	/* allocate everything; load the small vectors */
#define OOM() do { st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory loading the model weights"); goto done; } while (0)
	if (!alloc_qmatrix(m, c->n_vocab, c->d_model, &m->tok_embd))
		OOM();
	if (fref && !(m->f_tok_embd = alloc_floats(m, (size_t) c->n_vocab * c->d_model)))
		OOM();
	if (!alloc_qmatrix(m, c->n_vocab, c->d_model, &m->lm_head))	/* its own even when tied */
		OOM();
	if (t_out && fref && !(m->f_lm_head = alloc_floats(m, (size_t) c->n_vocab * c->d_model)))
		OOM();
	if (!make_rotation(m, c->d_model, &m->rot_model) || !make_rotation(m, c->d_ff, &m->rot_ff) ||
		!make_rotation(m, c->head_dim, &m->rot_head))
		OOM();
	for (int l = 0; l < c->n_layers; l++)
	{
		cai_layer_weights *w = &m->layers[l];
		layer_sources *s = &src[l];

		if (!alloc_qmatrix(m, q_dim + 2 * kv_dim, c->d_model, &w->wqkv) ||
			!alloc_qmatrix(m, c->d_model, q_dim, &w->wo) ||
			!alloc_qmatrix(m, 2 * c->d_ff, c->d_model, &w->w_gate_up) ||
			!alloc_qmatrix(m, c->d_model, c->d_ff, &w->w_down))
			OOM();
		if (fref)
		{
			if (!(w->f_wq = alloc_floats(m, (size_t) q_dim * c->d_model)) ||
				!(w->f_wk = alloc_floats(m, (size_t) kv_dim * c->d_model)) ||
				!(w->f_wv = alloc_floats(m, (size_t) kv_dim * c->d_model)) ||
				!(w->f_wo = alloc_floats(m, (size_t) c->d_model * q_dim)) ||
				!(w->f_gate = alloc_floats(m, (size_t) c->d_ff * c->d_model)) ||
				!(w->f_up = alloc_floats(m, (size_t) c->d_ff * c->d_model)) ||
				!(w->f_down = alloc_floats(m, (size_t) c->d_model * c->d_ff)))
				OOM();
		}
		if (!(w->attn_norm = alloc_floats(m, c->d_model)) ||
			!(w->ffn_norm = alloc_floats(m, c->d_model)) ||
			!(w->attn_norm_i8 = alloc_floats(m, c->d_model)) ||
			!(w->ffn_norm_i8 = alloc_floats(m, c->d_model)))
			OOM();
		m->weight_bytes += (size_t) 2 * c->d_model * sizeof(float);
		if ((st = load_vector(m, s->attn_norm, c->d_model, w->attn_norm, err)) != CAI_OK ||
			(st = load_vector(m, s->ffn_norm, c->d_model, w->ffn_norm, err)) != CAI_OK)
			goto done;
		if (c->qkv_bias)
		{
			if (!(w->bqkv = alloc_floats(m, (size_t) q_dim + 2 * kv_dim)) ||
				!(w->bqkv_i8 = alloc_floats(m, (size_t) q_dim + 2 * kv_dim)))
				OOM();
			w->bq = w->bqkv;
			w->bk = w->bqkv + q_dim;
			w->bv = w->bqkv + q_dim + kv_dim;
			if ((st = load_vector(m, s->bq, q_dim, w->bq, err)) != CAI_OK ||
				(st = load_vector(m, s->bk, kv_dim, w->bk, err)) != CAI_OK ||
				(st = load_vector(m, s->bv, kv_dim, w->bv, err)) != CAI_OK)
				goto done;
		}
	}
	if (!(m->out_norm = alloc_floats(m, c->d_model)) ||
		!(m->out_norm_i8 = alloc_floats(m, c->d_model)))
		OOM();
	if ((st = load_vector(m, t_out_norm, c->d_model, m->out_norm, err)) != CAI_OK)
		goto done;
	if (t_rope_freqs)
	{
		if (!(m->rope_freqs = alloc_floats(m, c->n_rot / 2)))
			OOM();
		if ((st = load_vector(m, t_rope_freqs, c->n_rot / 2, m->rope_freqs, err)) != CAI_OK)
			goto done;
		for (int i = 0; i < c->n_rot / 2; i++)
			if (!(m->rope_freqs[i] > 0.0f) || !isfinite(m->rope_freqs[i]))
			{
				st = cai_fail(err, CAI_ERR_FORMAT, "tensor '%s' holds a non-positive factor",
							  tn->rope_freqs);
				goto done;
			}
	}

	/* a pool for the conversion; scratch rows as long as any matrix row */
	n_threads = params->n_threads > 0 ? params->n_threads : cai_cpu_count();
	if (n_threads > 64)
		n_threads = 64;
	pool = cai_threadpool_create(n_threads);
	if (!pool)
		OOM();
	plan.max_k = c->d_model;
	if (q_dim > plan.max_k)
		plan.max_k = q_dim;
	if (c->d_ff > plan.max_k)
		plan.max_k = c->d_ff;
	plan.n_threads = n_threads;
	plan.scratch = malloc((size_t) n_threads * 2 * plan.max_k * sizeof(float));
	plan.col_max = malloc((size_t) n_threads * plan.max_k * sizeof(float));
	plan.block_floats = (size_t) 2 * CONVERT_CHUNK_ROWS * plan.max_k;
	plan.block = malloc((size_t) n_threads * plan.block_floats * sizeof(float));
	head_wmax = malloc((size_t) c->d_model * sizeof(float));
	if (!plan.scratch || !plan.col_max || !plan.block || !head_wmax)
		OOM();

	/*
	 * the embedding: plain requantization; the head's source (the embedding when tied) read for
	 * its column maxima, which its smoothing needs (convert_layers converts it)
	 */
	if (!plan_rows_rotated(&plan, t_embd, NULL, c->d_model, c->n_vocab, (int8_t *) m->tok_embd.q,
						   (float *) m->tok_embd.scale, m->f_tok_embd, NULL, NULL, NULL, !t_out))
		OOM();
	if (t_out && !plan_rows_rotated(&plan, t_out, NULL, c->d_model, c->n_vocab, NULL, NULL,
									m->f_lm_head, NULL, NULL, NULL, true))
		OOM();
	if ((st = run_plan_col_max(pool, &plan, head_wmax, c->d_model, err)) != CAI_OK)
		goto done;

	/* the layers and the head: calibrated, smoothed, rotated, requantized */
	if ((st = convert_layers(m, pool, &plan, src, t_embd, t_out ? t_out : t_embd, head_wmax,
							 fref, params->compensated_rounding, err)) != CAI_OK)
		goto done;

	/*
	 * the GEMM operands packed for the CPU kernels (the embedding is read by rows, and a GPU
	 * backend unpacks its copy on upload)
	 */
	pack.mats = malloc(((size_t) c->n_layers * 4 + 1) * sizeof(cai_qmatrix *));
	if (!pack.mats)
		OOM();
	pack.mats[pack.n++] = &m->lm_head;
	for (int l = 0; l < c->n_layers; l++)
	{
		pack.mats[pack.n++] = &m->layers[l].wqkv;
		pack.mats[pack.n++] = &m->layers[l].wo;
		pack.mats[pack.n++] = &m->layers[l].w_gate_up;
		pack.mats[pack.n++] = &m->layers[l].w_down;
	}
	cai_threadpool_run(pool, pack_task, &pack, pack.n);
	if (atomic_load(&pack.failed))
		OOM();
	for (int l = 0; l < c->n_layers; l++)
		layer_views(&m->layers[l], c);

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
	free(pack.mats);
	free(src);
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
 * (calibrated, see convert_layers), picks the chat template and fingerprints the model.
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
	m = calloc(1, sizeof(*m));
	if (!m || !(m->owned = calloc(1, sizeof(model_owned))))
	{
		free(m);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory loading the model");
	}
	if ((st = gguf_open(path, &m->gguf, err)) != CAI_OK ||
		(st = read_config(m, path, err)) != CAI_OK ||
		(st = load_tokenizer(m, err)) != CAI_OK ||
		(st = load_weights(m, params, err)) != CAI_OK ||
		(st = load_template(m, params, err)) != CAI_OK ||
		(st = compute_fingerprint(m, err)) != CAI_OK)
	{
		cai_model_free(m);
		return st;
	}
	*out = m;
	return CAI_OK;
}

/* kv.h's block layout for this model: each KV-owning layer's part 64-byte aligned. */
void
cai_model_kv_layout(const cai_model *model, cai_kv_layout *out)
{
	const cai_config *c = &model->cfg;
	size_t		part = (size_t) CAI_KV_BLOCK_TOKENS * c->n_kv_heads *
		(2 * (size_t) c->head_dim + 2 * sizeof(float));

	out->n_kv_layers = c->n_kv_layers;
	out->n_kv_heads = c->n_kv_heads;
	out->head_dim = c->head_dim;
	out->layer_bytes = (part + 63) & ~(size_t) 63;	/* each layer's part 64-byte aligned */
	out->block_bytes = out->layer_bytes * (size_t) c->n_kv_layers;
}

/* Fills info; its strings point into the model. */
void
cai_model_get_info(const cai_model *model, cai_model_info *info)
{
	const cai_config *c = &model->cfg;

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
	info->kv_bytes_per_token = (size_t) c->n_kv_layers * c->n_kv_heads *
		(2 * (size_t) c->head_dim + 2 * sizeof(float));
	info->fingerprint = model->fingerprint;
	info->bos_token = cai_tokenizer_bos(model->tokenizer);
	info->add_bos = info->bos_token >= 0 && cai_tokenizer_add_bos(model->tokenizer);
	info->eos_token = cai_tokenizer_eos(model->tokenizer);
	info->eot_token = model->tmpl.end_of_turn >= 0 ? model->tmpl.end_of_turn : info->eos_token;
}

/* ---------------------------------------------------------------------------------------------
 * Calibrated conversion of the layers (SmoothQuant, then rotations)
 * ------------------------------------------------------------------------------------------- */

/*
 * Rotations.  Per-token (and per-row) int8 quantization loses the most on vectors whose energy
 * sits in a few channels, as LLM activations' does: the scale follows the outliers and the other
 * channels get few levels.  An orthogonal R that mixes every channel into many others (Hadamard
 * transforms of 64 or more values, backend.h's cai_rotation) makes the vector close to
 * Gaussian, its maximum a few standard deviations (QuaRot, Ashkboos et al. 2024).  Since
 * (R x) . (R w) = x . w, the int8 path rotates each GEMM input at run time (the backend's rotate
 * op, fused with the per-token quantization) and stores each weight row rotated by the same R:
 *   - attention, FFN and LM head inputs: rmsnorm with the smoothed norm weight, then rot_model;
 *     rows R (w * s);
 *   - the down projection's input: silu(g) * u / s_down, then rot_ff; rows R (w * s_down);
 *   - values: Wv's rows are mixed per head by rot_head at load, so every head of the attention
 *     output arrives rotated (attention is linear in V) and Wo's columns are rotated per head to
 *     match — nothing to do at run time, and the int8 V cache holds rotated values too;
 *   - queries and keys: each head rotated by rot_head after RoPE (which R does not commute
 *     with), leaving their dot products as they were, for the int8 K cache and query.
 * The smoothing stays, before the rotation: it shrinks the outlier channels before R spreads
 * them, and it makes the weights' rounding error smallest where the activations are largest
 * (AWQ's observation), which rotating alone does not do.  The residual stream is not rotated,
 * so the embedding is a plain requantization; the head gets its own smoothed, rotated copy.
 *
 * Measured on SmolLM2-135M-Instruct (Q4_1) with `cai eval` over the first 2048 tokens of the
 * GPL-3 text, KL(float || int8) of each source alone (everything else float), smoothing only ->
 * smoothing and rotation: weights 0.0059 -> 0.0020; QKV input 0.0024 -> 0.0002; Wo input
 * 0.0004 -> 0.0002; gate/up input 0.0023 -> 0.0005; down input 0.0083 -> 0.0004; LM head input
 * 0.0072 -> 0.0002; int8 KV 0.0015 -> 0.0004; int8 queries 0.0005 -> 0.0001.  All together:
 * KL 0.029 -> 0.0041, top-1 agreement 90.3% -> 96.2%, perplexity +2.9% -> +0.6%; over the
 * whole text KL 0.0325 -> 0.0048, 89.7% -> 95.8%, +2.6% -> +0.55%.  The weights' part is about
 * half of what is left and does not shrink with finer activation scales: per-channel int8
 * requantization of the Q4_1 weights alone, everything else float, agrees on 96.8% over the
 * whole text (KL 0.0023; per matrix kind, per-group scales and 9-bit ablations in the README's
 * "int8 fidelity"), and the activations alone on 97.05%.
 */

/*
 * Migration strength: s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) moves that much of an input
 * channel's range from the activation (quantized per token at run time) to the weight column
 * (quantized per output row at load).  Measured on SmolLM2-135M-Instruct: without rotation,
 * alpha 0.4 to 0.6 gave the best agreement (0.5 is the SmoothQuant paper's default and the
 * middle of that plateau); with rotation, alpha 0.35 or 0.65 at any single site moves the
 * total KL above by less than 10%, in either direction.
 */
#define SMOOTH_ALPHA 0.5

/*
 * Calibration.  A float forward over the calibration text gives each GEMM input's statistics:
 * per-channel maxima over its first SMOOTHING_TOKENS tokens for the smoothing, and over all
 * CALIBRATION_TOKENS the second moment H that error-compensating rounding needs (see
 * "compensated rounding"; without it the forward stops at SMOOTHING_TOKENS).  Measured on
 * SmolLM2-135M-Instruct (whole GPL-3 text, compensated rounding): maxima over 512 tokens
 * instead of 64 smooth more (larger maxima) and lose (KL 0.00426 -> 0.00451).
 */
#define SMOOTHING_TOKENS 64
#define CALIBRATION_TOKENS 512

/*
 * The calibration text: prose of several kinds, numbers, code, SQL, chat turns and a little
 * French, German and Spanish, so that the channels a model uses for each show up in the
 * statistics.  It begins with the short text the smoothing was tuned on.
 */
static const char calibration_text[] =
	"The history of science is full of surprises. In 1905 a young patent clerk in Bern "
	"wrote four papers that changed physics, and water still boils at 100 degrees at sea "
	"level. The capital of France is Paris.\n"
	"def add(a, b):\n"
	"    return a + b\n"
	"User: could you summarise this briefly, please?\n"
	"Assistant: Of course! Here it is.\n"
	"\n"
	"On the morning the river froze, the ferryman walked across it for the first time in "
	"forty years. He had carried teachers, soldiers, brides and goats from one bank to the "
	"other, and now the ice carried him. Halfway over he stopped, listened to the long "
	"creak under his boots, and laughed at how small the distance really was.\n"
	"\n"
	"How a refrigerator works: a pump compresses a gas until it is hot, the heat leaves "
	"through the coils at the back, and the cooled fluid expands inside the box, where it "
	"takes heat from the food. Nothing is destroyed; heat is only moved from one place to "
	"another, which is why the kitchen gets a little warmer while the milk stays cold.\n"
	"\n"
	"Recipe for a simple tomato soup (serves 4):\n"
	"1. Soften one chopped onion and two cloves of garlic in olive oil for 8 minutes.\n"
	"2. Add 800 g of tomatoes, 500 ml of stock, salt and a pinch of sugar.\n"
	"3. Simmer for 20 minutes, blend until smooth, and finish with basil.\n"
	"\n"
	"Dear Ms. Okafor,\n"
	"Thank you for your letter of 14 March. We have reviewed the invoice (no. 2023-0417) "
	"and agree that the second delivery arrived late. A credit of $125.50 will appear on "
	"your next statement. Please let us know if there is anything else we can do.\n"
	"Kind regards,\n"
	"Tomasz Nowak, Customer Service\n"
	"\n"
	"SELECT name, count(*) AS orders FROM customers JOIN orders USING (customer_id) WHERE "
	"created_at > now() - interval '30 days' GROUP BY name ORDER BY orders DESC LIMIT 10;\n"
	"\n"
	"User: What is the difference between weather and climate?\n"
	"Assistant: Weather is what happens in the atmosphere over hours or days: rain this "
	"afternoon, a warm week in May. Climate is the pattern of weather over decades in a "
	"region, such as the average summer temperature or how often droughts occur. A single "
	"cold day says little about the climate.\n"
	"User: Thanks! And why is the sky blue?\n"
	"Assistant: Sunlight contains every colour. Air molecules scatter short wavelengths, "
	"like blue, much more than long ones, like red, so blue light reaches your eyes from "
	"every direction of the sky.\n"
	"\n"
	"for (int i = 0; i < n; i++) {\n"
	"    if (values[i] > best) best = values[i];\n"
	"}\n"
	"printf(\"maximum: %d\\n\", best);\n"
	"\n"
	"The committee met on Tuesday and approved the budget by seven votes to two. Members "
	"raised concerns about the cost of repairing the old library, estimated at 2.4 million "
	"euros, but agreed that the building should remain open while the work is carried out "
	"in stages.\n"
	"\n"
	"Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. Plants, "
	"algae and some bacteria do it, and almost every food chain on Earth begins with them. "
	"A large oak can release enough oxygen in a season for several people to breathe.\n"
	"\n"
	"Il pleuvait depuis trois jours quand elle a enfin ouvert la lettre. Das Wetter war "
	"schlecht, aber wir sind trotzdem gegangen. El tren sale a las nueve y media.\n"
	"\n"
	"Tips for a job interview: read about the company beforehand, prepare two or three "
	"questions of your own, arrive ten minutes early, and answer with concrete examples "
	"from your experience rather than general claims.\n"
	"\n"
	"In mathematics, a prime number has exactly two divisors, one and itself. The first "
	"few are 2, 3, 5, 7, 11 and 13. Euclid proved more than two thousand years ago that "
	"there are infinitely many of them: multiply any finite list of primes together, add "
	"one, and the result has a prime factor missing from the list.\n"
	"\n"
	"User: Write a haiku about autumn.\n"
	"Assistant: Red leaves on the path,\n"
	"a cold wind counts them slowly,\n"
	"the year exhales gold.\n"
	"\n"
	"import json\n"
	"with open(\"config.json\") as f:\n"
	"    settings = json.load(f)\n"
	"print(settings.get(\"timeout\", 30))\n"
	"\n"
	"She looked at the map again. The road they needed was not on it, or perhaps it was "
	"the thin grey line that wandered off the edge of the paper near the lake. \"We'll ask "
	"at the next village,\" he said, although neither of them had seen a village for an "
	"hour.\n"
	"\n"
	"Terms of use: by creating an account you agree not to share your password, not to "
	"upload content that you do not have the right to distribute, and to tell us promptly "
	"if you believe your account has been used without your permission.\n";

/*
 * The smoothing factors of one GEMM input: s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) over the
 * calibration tokens (x_max) and the columns j of the consuming matrices (wmax), rounded to a
 * power of two so that folding it into weights and norms is exact.  Channels without signal
 * keep 1.
 */
static void
smoothing_factors_wmax(const float *x_max, int k, const float *wmax, float *s)
{
	for (int j = 0; j < k; j++)
	{
		double		v;
		int			e;

		if (!(x_max[j] > 0.0f) || !(wmax[j] > 0.0f) || !isfinite(x_max[j]))
		{
			s[j] = 1.0f;
			continue;
		}
		v = pow((double) x_max[j], SMOOTH_ALPHA) / pow((double) wmax[j], 1.0 - SMOOTH_ALPHA);
		e = (int) lrint(log2(v));
		e = e < -30 ? -30 : (e > 30 ? 30 : e);
		s[j] = ldexpf(1.0f, e);
	}
}

/* The same from the consuming matrices' columns (wmax: scratch of k floats). */
static void
smoothing_factors(const float *x_max, int k, const float *const *w, const int *w_rows, int n_w,
				  float *wmax, float *s)
{
	/* column maxima, walking the matrices row by row */
	for (int j = 0; j < k; j++)
		wmax[j] = 0.0f;
	for (int m = 0; m < n_w; m++)
		for (int r = 0; r < w_rows[m]; r++)
		{
			const float *row = w[m] + (size_t) r * k;

			for (int j = 0; j < k; j++)
			{
				float		a = fabsf(row[j]);

				wmax[j] = a > wmax[j] ? a : wmax[j];
			}
		}
	smoothing_factors_wmax(x_max, k, wmax, s);
}

/*
 * Rotates the rows of each head block of a [n_heads * hd, k] float matrix: W_h <- R W_h, i.e.
 * every column of the block is a vector rotated by rot (rot->n == hd, or hd split into blocks).
 * col: scratch of hd floats.
 */
static void
rotate_head_rows(float *w, int n_heads, int hd, int k, const cai_rotation *rot, float *col)
{
	for (int h = 0; h < n_heads; h++)
	{
		float	   *block = w + (size_t) h * hd * k;

		for (int j = 0; j < k; j++)
		{
			for (int i = 0; i < hd; i++)
				col[i] = block[(size_t) i * k + j];
			for (int b = 0; b < hd; b += rot->n)
				cai_op_rotate_vec(rot, col + b);
			for (int i = 0; i < hd; i++)
				block[(size_t) i * k + j] = col[i];
		}
	}
}

/*
 * Compensated rounding.  Every matrix of the layers and the head is rounded to int8 along the
 * second moment H of the inputs it meets (cpu/rounding.h, GPTQ), measured over the calibration
 * tokens as the int8 path sees them (smoothed and rotated).  Measured on SmolLM2-135M-Instruct
 * over the whole GPL-3 text, against nearest rounding: KL(float || int8) 0.00478 -> 0.00426,
 * top-1 agreement 95.80% -> 96.27%, perplexity +0.55% -> +0.14%; load time on two cores
 * 0.9 s -> about 4 s (the calibration forward over 512 tokens instead of 64, H, the factors and
 * the rounding itself).  Not the default (cai_model_params.compensated_rounding): besides the
 * load time, a better average does not make every greedy reply closer — the regression suite's
 * "What is the capital of France?" (with a system prompt) sits on a float near-tie (logits
 * 24.144 vs 24.049 for its first token); nearest rounding keeps the order (23.857 vs 23.832),
 * compensated rounding flips it (24.073 vs 24.087) and the reply turns into French.
 *
 * Wide inputs get a block-diagonal metric (METRIC_BLOCK_MAX): on SmolLM2's down projection
 * (1536 inputs) blocks of 512 measured as well as the full H, for a ninth of the factoring
 * work, and the memory stays k * 512 floats for any width.  Damping: ROUNDING_DAMP times H's
 * mean diagonal; 0.1, 0.3 and 1 gave KL 0.00375, 0.00349 and 0.00361 (first 2048 tokens).
 */
#define METRIC_FULL_MAX 1024
#define METRIC_BLOCK_MAX 512
#define ROUNDING_DAMP 0.3

/* The metric's block for k inputs: all of them, or the largest divisor of k within the cap. */
static int
metric_block(int k)
{
	if (k <= METRIC_FULL_MAX)
		return k;
	for (int b = METRIC_BLOCK_MAX; b > 1; b--)
		if (k % b == 0)
			return b;
	return 1;
}

/* The GEMM inputs of a layer; the head's input reuses SITE_ATTN's storage (same width). */
typedef enum gemm_site
{
	SITE_ATTN,					/* QKV input */
	SITE_WO,
	SITE_FFN,					/* gate/up input */
	SITE_DOWN,
	N_SITES
} gemm_site;

/* The metrics of one layer's GEMM inputs, with their storage. */
typedef struct site_metrics
{
	cai_rounding_metric rm[N_SITES];
	float	   *h[N_SITES];		/* each k * metric_block(k) floats */
	float	   *inv_diag[N_SITES];
	float	   *xt;				/* [k][T] scratch: one input's rows transposed */
	float	   *row;			/* [k] scratch */
} site_metrics;

static bool
site_metrics_alloc(site_metrics *sm, const int k[N_SITES], int T)
{
	int			kmax = 0;

	memset(sm, 0, sizeof(*sm));
	for (int i = 0; i < N_SITES; i++)
	{
		sm->h[i] = malloc((size_t) k[i] * metric_block(k[i]) * sizeof(float));
		sm->inv_diag[i] = malloc((size_t) k[i] * sizeof(float));
		kmax = k[i] > kmax ? k[i] : kmax;
		if (!sm->h[i] || !sm->inv_diag[i])
			return false;
	}
	sm->xt = malloc((size_t) kmax * T * sizeof(float));
	sm->row = malloc((size_t) kmax * sizeof(float));
	return sm->xt && sm->row;
}

static void
site_metrics_free(site_metrics *sm)
{
	for (int i = 0; i < N_SITES; i++)
	{
		free(sm->h[i]);
		free(sm->inv_diag[i]);
	}
	free(sm->xt);
	free(sm->row);
}

/*
 * The rounding metric of one GEMM input: H = sum_t x_t x_t^T over the calibration rows x [T][k]
 * as the int8 path sees them, each divided by s (when not NULL) and rotated by rot block by
 * block; its diagonal blocks made with one float GEMM each over the transposed rows, then
 * factored.  which: the storage slot in sm.  NULL when H cannot be factored (nearest rounding
 * then).
 */
static const cai_rounding_metric *
site_metric(cai_forward_ctx *ctx, cai_threadpool *pool, site_metrics *sm, gemm_site which,
			const float *x, int T, int k, const float *s, const cai_rotation *rot)
{
	cai_rounding_metric *rm = &sm->rm[which];
	const int	block = metric_block(k);
	float	   *h = sm->h[which];
	double		mean = 0.0;
	float		lambda;

	for (int t = 0; t < T; t++)
	{
		for (int i = 0; i < k; i++)
			sm->row[i] = x[(size_t) t * k + i] / (s ? s[i] : 1.0f);
		for (int b = 0; b < k; b += rot->n)
			cai_op_rotate_vec(rot, sm->row + b);
		for (int i = 0; i < k; i++)
			sm->xt[(size_t) i * T + t] = sm->row[i];
	}
	for (int b = 0; b < k; b += block)
	{
		float	   *hb = h + (size_t) b * block;
		const float *xb = sm->xt + (size_t) b * T;

		ctx->be->ops->gemm_f32(ctx->be, xb, block, T, xb, block, NULL, hb, block, false);
		for (int i = 0; i < block; i++)
			mean += hb[(size_t) i * block + i];
	}
	mean /= k;
	if (!(mean > 0.0) || !isfinite(mean))
		return NULL;
	lambda = (float) (ROUNDING_DAMP * mean);
	for (int b = 0; b < k; b += block)
		if (!cai_rounding_metric_factor(pool, h + (size_t) b * block, block, lambda,
										sm->inv_diag[which] + b))
			return NULL;
	rm->k = k;
	rm->block = block;
	rm->u = h;
	rm->inv_diag = sm->inv_diag[which];
	return rm;
}

/*
 * Converts every layer: dequantizes its matrices to float, runs the layer on the float path
 * over the calibration tokens (the float output of the previous layers) to record the maxima
 * of its GEMM inputs (and the inputs themselves, for the rounding metrics), derives the
 * smoothing factors, and quantizes the smoothed, rotated matrices to int8.  One layer's float
 * weights are alive at a time unless the float reference is kept.  compensated: round along the
 * inputs' metrics (see "compensated rounding") rather than to nearest.
 */
static cai_status
convert_layers(cai_model *m, cai_threadpool *pool, convert_plan *plan, const layer_sources *src,
			   const gguf_tensor *t_embd, const gguf_tensor *t_head, const float *head_wmax,
			   bool fref, bool compensated, cai_error *err)
{
	const cai_config *c = &m->cfg;
	const int	d = c->d_model;
	const int	q_dim = c->n_heads * c->head_dim;
	const int	kv_dim = c->n_kv_heads * c->head_dim;
	const int	d_ff = c->d_ff;
	cai_tokens	cal;
	cai_forward_ctx *ctx = NULL;
	cai_kv_pool *kv = NULL;
	cai_kv_layout layout;
	int32_t		table[(CALIBRATION_TOKENS + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS];
	int			n_blocks;
	cai_batch_seq seq;
	cai_batch_layout batch;
	cai_rope_params rope;
	cai_activation_stats stats = {0};
	float	   *s_attn = NULL,
			   *s_ffn = NULL,
			   *s_down = NULL,
			   *inv_down = NULL,
			   *s_head = NULL,
			   *wmax = NULL;	/* column maxima scratch */
	float	   *tmp = NULL;		/* one layer's float weights when no reference is kept */
	float	   *wv_rot = NULL;	/* the V rows of a layer, rotated per head */
	float	   *col = NULL;		/* one head's column */
	site_metrics sm = {0};
	const cai_rounding_metric *rm_attn = NULL,
			   *rm_wo = NULL,
			   *rm_ffn = NULL,
			   *rm_down = NULL;
	size_t		tmp_floats = (size_t) (q_dim + 2 * kv_dim) * d + (size_t) d * q_dim + (size_t) 3 * d_ff * d;
	size_t		row_bytes;
	int			T,
				R;
	cai_status	st = CAI_OK;

	/* the calibration tokens */
	cai_tokens_init(&cal);
	if ((st = cai_tokenizer_encode(m->tokenizer, calibration_text, strlen(calibration_text), false,
								   &cal, err)) != CAI_OK)
		goto done;
	for (int i = 0; i < cal.n; i++)
		if (cal.ids[i] < 0 || cal.ids[i] >= c->n_vocab)
			cal.ids[i] = 0;
	while (cal.n < 8)			/* a vocabulary that makes few tokens: any ids do */
		if (!cai_tokens_push(&cal, cal.n % c->n_vocab))
			break;
	T = compensated ? CALIBRATION_TOKENS : SMOOTHING_TOKENS;
	T = cal.n < T ? cal.n : T;
	stats.max_rows = SMOOTHING_TOKENS;

#define OOM() do { st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory calibrating the model"); goto done; } while (0)
	stats.attn_in = malloc((size_t) d * sizeof(float));
	stats.ffn_in = malloc((size_t) d * sizeof(float));
	stats.down_in = malloc((size_t) d_ff * sizeof(float));
	s_attn = malloc((size_t) d * sizeof(float));
	s_ffn = malloc((size_t) d * sizeof(float));
	s_down = malloc((size_t) d_ff * sizeof(float));
	inv_down = malloc((size_t) d_ff * sizeof(float));
	s_head = malloc((size_t) d * sizeof(float));
	wmax = malloc((size_t) (d > d_ff ? d : d_ff) * sizeof(float));
	wv_rot = malloc((size_t) kv_dim * d * sizeof(float));
	col = malloc((size_t) c->head_dim * sizeof(float));
	if (!fref)
		tmp = malloc(tmp_floats * sizeof(float));
	if (!stats.attn_in || !stats.ffn_in || !stats.down_in || !s_attn || !s_ffn || !s_down ||
		!inv_down || !s_head || !wmax || !wv_rot || !col || (!fref && !tmp))
		OOM();
	if (compensated)
	{
		const int	site_k[N_SITES] = {[SITE_ATTN] = d, [SITE_WO] = q_dim, [SITE_FFN] = d,
		[SITE_DOWN] = d_ff};

		stats.attn_x = malloc((size_t) T * d * sizeof(float));
		stats.wo_x = malloc((size_t) T * q_dim * sizeof(float));
		stats.ffn_x = malloc((size_t) T * d * sizeof(float));
		stats.down_x = malloc((size_t) T * d_ff * sizeof(float));
		if (!stats.attn_x || !stats.wo_x || !stats.ffn_x || !stats.down_x ||
			!site_metrics_alloc(&sm, site_k, T))
			OOM();
	}

	/* a one-sequence float forward over the calibration tokens */
	if ((st = cai_forward_ctx_create(m, pool, T, T, &ctx, err)) != CAI_OK)
		goto done;
	cai_model_kv_layout(m, &layout);
	n_blocks = (T + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS;
	if ((st = cai_kv_pool_create(&layout, n_blocks, &kv, err)) != CAI_OK)
		goto done;
	for (int b = 0; b < n_blocks; b++)
		table[b] = cai_kv_block_alloc(kv);
	seq = (cai_batch_seq) {cal.ids, T, 0, table, n_blocks, CAI_LOGITS_NONE};
	if ((st = cai_forward_layout_batch(m, ctx, kv, &seq, 1, &T, &R, err)) != CAI_OK ||
		(st = cai_forward_shadow_prepare(ctx, kv, &seq, 1, true, err)) != CAI_OK)
		goto done;
	cai_forward_batch_from_ctx(ctx, T, 1, &batch);
	cai_model_rope_params(m, &rope);
	ctx->be->ops->rope_prepare(ctx->be, &rope, ctx->pos, T, ctx->rope_cs);
	if (!ggml_row_bytes(t_embd->type, d, &row_bytes))
	{
		st = cai_fail(err, CAI_ERR_INTERNAL, "embedding row size");
		goto done;
	}
	for (int t = 0; t < T; t++)
		if ((st = cai_dequantize_row(t_embd->type, (const uint8_t *) t_embd->data +
									 (size_t) ctx->ids[t] * row_bytes,
									 ctx->x + (size_t) t * d, d, err)) != CAI_OK)
			goto done;

	for (int l = 0; l < c->n_layers; l++)
	{
		cai_layer_weights *w = &m->layers[l];
		const layer_sources *ls = &src[l];
		int8_t	   *qkv = (int8_t *) w->wqkv.q;
		float	   *qkv_scale = (float *) w->wqkv.scale;
		int8_t	   *gu = (int8_t *) w->w_gate_up.q;
		float	   *gu_scale = (float *) w->w_gate_up.scale;
		bool		owns_kv = c->kv_source[l] == l;

		/* float weights of the layer: the reference copies, or the scratch */
		if (!fref)
		{
			w->f_wq = tmp;
			w->f_wk = w->f_wq + (size_t) q_dim * d;
			w->f_wv = w->f_wk + (size_t) kv_dim * d;
			w->f_wo = w->f_wv + (size_t) kv_dim * d;
			w->f_gate = w->f_wo + (size_t) d * q_dim;
			w->f_up = w->f_gate + (size_t) d_ff * d;
			w->f_down = w->f_up + (size_t) d_ff * d;
		}
		if (!plan_rows(plan, ls->wq, NULL, d, q_dim, NULL, NULL, w->f_wq, NULL, NULL) ||
			!plan_rows(plan, ls->wk, NULL, d, kv_dim, NULL, NULL, w->f_wk, NULL, NULL) ||
			!plan_rows(plan, ls->wv, NULL, d, kv_dim, NULL, NULL, w->f_wv, NULL, NULL) ||
			!plan_rows(plan, ls->wo, NULL, q_dim, d, NULL, NULL, w->f_wo, NULL, NULL) ||
			!plan_rows(plan, ls->gate, NULL, d, d_ff, NULL, NULL, w->f_gate, NULL, NULL) ||
			!plan_rows(plan, ls->up, NULL, d, d_ff, NULL, NULL, w->f_up, NULL, NULL) ||
			!plan_rows(plan, ls->down, NULL, d_ff, d, NULL, NULL, w->f_down, NULL, NULL))
			OOM();
		if ((st = run_plan(pool, plan, err)) != CAI_OK)
			goto done;

		/* the layer in float over the calibration tokens, recording its GEMM inputs */
		memset(stats.attn_in, 0, (size_t) d * sizeof(float));
		memset(stats.ffn_in, 0, (size_t) d * sizeof(float));
		memset(stats.down_in, 0, (size_t) d_ff * sizeof(float));
		cai_forward_layer(m, ctx, kv, &batch, &rope, l, true, &stats, NULL, 0);

		/* smoothing factors and the int8 path's norms */
		{
			const float *wa[3] = {w->f_wq, w->f_wk, w->f_wv};
			const int	ra[3] = {q_dim, kv_dim, kv_dim};
			const float *wb[2] = {w->f_gate, w->f_up};
			const int	rb[2] = {d_ff, d_ff};
			const float *wc[1] = {w->f_down};
			const int	rc[1] = {d};

			smoothing_factors(stats.attn_in, d, wa, ra, owns_kv ? 3 : 1, wmax, s_attn);
			smoothing_factors(stats.ffn_in, d, wb, rb, 2, wmax, s_ffn);
			smoothing_factors(stats.down_in, d_ff, wc, rc, 1, wmax, s_down);
		}
		for (int j = 0; j < d; j++)
		{
			w->attn_norm_i8[j] = w->attn_norm[j] / s_attn[j];
			w->ffn_norm_i8[j] = w->ffn_norm[j] / s_ffn[j];
		}
		for (int j = 0; j < d_ff; j++)
			inv_down[j] = 1.0f / s_down[j];
		if (compensated)
		{
			rm_attn = site_metric(ctx, pool, &sm, SITE_ATTN, stats.attn_x, T, d, s_attn,
								  &m->rot_model);
			rm_wo = site_metric(ctx, pool, &sm, SITE_WO, stats.wo_x, T, q_dim, NULL, &m->rot_head);
			rm_ffn = site_metric(ctx, pool, &sm, SITE_FFN, stats.ffn_x, T, d, s_ffn, &m->rot_model);
			rm_down = site_metric(ctx, pool, &sm, SITE_DOWN, stats.down_x, T, d_ff, s_down,
								  &m->rot_ff);
		}

		/*
		 * V rows (and their biases) rotated per head, so that the attention output of every
		 * head arrives rotated (attention is linear in V) and the output projection's columns
		 * are rotated to match
		 */
		memcpy(wv_rot, w->f_wv, (size_t) kv_dim * d * sizeof(float));
		rotate_head_rows(wv_rot, c->n_kv_heads, c->head_dim, d, &m->rot_head, col);
		if (w->bqkv)
		{
			memcpy(w->bqkv_i8, w->bqkv, (size_t) (q_dim + 2 * kv_dim) * sizeof(float));
			rotate_head_rows(w->bqkv_i8 + q_dim + kv_dim, c->n_kv_heads, c->head_dim, 1,
							 &m->rot_head, col);
		}

		/*
		 * quantize: columns times their input's factor, then rotated as the input is at run
		 * time; up rows divided by the down input's factor
		 */
		if (!plan_rows_compensated(plan, NULL, w->f_wq, d, q_dim, qkv, qkv_scale, NULL, s_attn, NULL,
							   &m->rot_model, rm_attn, false) ||
			!plan_rows_compensated(plan, NULL, w->f_wk, d, kv_dim, qkv + (size_t) q_dim * d,
							   qkv_scale + q_dim, NULL, s_attn, NULL, &m->rot_model, rm_attn, false) ||
			!plan_rows_compensated(plan, NULL, wv_rot, d, kv_dim, qkv + (size_t) (q_dim + kv_dim) * d,
							   qkv_scale + q_dim + kv_dim, NULL, s_attn, NULL, &m->rot_model, rm_attn,
							   false) ||
			!plan_rows_compensated(plan, NULL, w->f_wo, q_dim, d, (int8_t *) w->wo.q,
							   (float *) w->wo.scale, NULL, NULL, NULL, &m->rot_head, rm_wo, false) ||
			!plan_rows_compensated(plan, NULL, w->f_gate, d, d_ff, gu, gu_scale, NULL, s_ffn, NULL,
							   &m->rot_model, rm_ffn, false) ||
			!plan_rows_compensated(plan, NULL, w->f_up, d, d_ff, gu + (size_t) d_ff * d,
							   gu_scale + d_ff, NULL, s_ffn, inv_down, &m->rot_model, rm_ffn, false) ||
			!plan_rows_compensated(plan, NULL, w->f_down, d_ff, d, (int8_t *) w->w_down.q,
							   (float *) w->w_down.scale, NULL, s_down, NULL, &m->rot_ff, rm_down, false))
			OOM();
		if ((st = run_plan(pool, plan, err)) != CAI_OK)
			goto done;
		if (!fref)
			w->f_wq = w->f_wk = w->f_wv = w->f_wo = w->f_gate = w->f_up = w->f_down = NULL;
	}

	/*
	 * The LM head: its input is the final norm's output, smoothed against the head's columns
	 * and rotated like the layers' inputs; the head (the embedding when tied) gets its own
	 * int8 copy
	 */
	ctx->be->ops->rmsnorm(ctx->be, ctx->x, m->out_norm, T, d, c->norm_eps, ctx->xn, NULL);
	memset(stats.attn_in, 0, (size_t) d * sizeof(float));
	cai_record_max_abs(ctx->xn, T < stats.max_rows ? T : stats.max_rows, d, stats.attn_in);
	smoothing_factors_wmax(stats.attn_in, d, head_wmax, s_head);
	for (int j = 0; j < d; j++)
		m->out_norm_i8[j] = m->out_norm[j] / s_head[j];
	if (compensated)
		rm_attn = site_metric(ctx, pool, &sm, SITE_ATTN, ctx->xn, T, d, s_head, &m->rot_model);
	if (!plan_rows_compensated(plan, t_head, NULL, d, c->n_vocab, (int8_t *) m->lm_head.q,
						   (float *) m->lm_head.scale, NULL, s_head, NULL, &m->rot_model, rm_attn, false))
		OOM();
	if ((st = run_plan(pool, plan, err)) != CAI_OK)
		goto done;
#undef OOM

done:
	if (st != CAI_OK && !fref)
		for (int l = 0; l < c->n_layers; l++)
		{
			cai_layer_weights *w = &m->layers[l];

			w->f_wq = w->f_wk = w->f_wv = w->f_wo = w->f_gate = w->f_up = w->f_down = NULL;
		}
	cai_kv_pool_free(kv);
	cai_forward_ctx_free(ctx);
	cai_tokens_free(&cal);
	free(stats.attn_in);
	free(stats.ffn_in);
	free(stats.down_in);
	free(s_attn);
	free(s_ffn);
	free(s_down);
	free(inv_down);
	free(s_head);
	free(wmax);
	free(wv_rot);
	free(col);
	free(tmp);
	free(stats.attn_x);
	free(stats.wo_x);
	free(stats.ffn_x);
	free(stats.down_x);
	site_metrics_free(&sm);
	return st;
}
