/*
 * model_config.c — a model's config from its GGUF metadata.  The keys, their defaults, the
 * RoPE style, q/k/v biases and per-layer attention come from the architecture's description
 * (arch/arch.h); shapes are checked against the tensors later (model_load.c).
 */
#include "model_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

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

/*
 * Sets each layer's KV index, the count of KV-owning layers and which of them are windowed, from
 * kv_source and attn_window.  An owning layer's KV is windowed when every layer reading it
 * attends through a window: then no position older than the widest of those windows is ever read
 * again, and kv.h's pool may drop it.  Global owners take the first KV indexes and windowed
 * owners the last n_windowed_kv_layers, so each kind's parts of a block are contiguous.
 */
cai_status
cai_config_update_kv_sharing(cai_config *cfg, cai_error *err)
{
	int			n_global = 0;
	int			n_windowed = 0;
	int			window = 0;

	/* first kv_index holds a flag per owner: 1 while its KV can still be windowed */
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
		cfg->kv_index[l] = src == l && cfg->attn_window[l] > 0;
		if (cfg->attn_window[l] == 0)
			cfg->kv_index[src] = 0;
	}
	for (int l = 0; l < cfg->n_layers; l++)
	{
		if (cfg->kv_index[cfg->kv_source[l]] && cfg->attn_window[l] > window)
			window = cfg->attn_window[l];
		if (cfg->kv_source[l] == l && !cfg->kv_index[l])
			n_global++;
	}
	for (int l = 0, g = 0; l < cfg->n_layers; l++)
	{
		if (cfg->kv_source[l] != l)
			cfg->kv_index[l] = cfg->kv_index[cfg->kv_source[l]];
		else if (cfg->kv_index[l])
			cfg->kv_index[l] = n_global + n_windowed++;
		else
			cfg->kv_index[l] = g++;
	}
	cfg->n_kv_layers = n_global + n_windowed;
	cfg->n_windowed_kv_layers = n_windowed;
	cfg->kv_window = n_windowed > 0 ? window : 0;
	return CAI_OK;
}

/*
 * Each layer's attention window and KV source from the description's pattern (arch.h's
 * cai_arch_attention), given the file's window length and count of KV-sharing layers.
 */
cai_status
cai_config_layer_attention(cai_config *c, const cai_arch_attention *a, uint32_t window,
						   uint32_t n_shared, cai_error *err)
{
	if (a->window_period > 0 && (window < 1 || window > (1u << 24)))
		return cai_fail(err, CAI_ERR_FORMAT, "sliding window %u is out of range", window);
	if (n_shared >= (uint32_t) c->n_layers)
		return cai_fail(err, CAI_ERR_FORMAT, "%u of %d layers share another layer's kv", n_shared,
						c->n_layers);
	for (int l = 0; l < c->n_layers; l++)
	{
		bool		global = a->window_period <= 0 || l % a->window_period == a->window_period - 1;

		c->attn_window[l] = global ? 0 : (int) window;
		c->kv_source[l] = l;
	}
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

/* The same, reading the window length and shared-layer count the description names. */
static cai_status
read_layer_attention(const gguf_file *f, cai_config *c, cai_error *err)
{
	const cai_arch_attention *a = &c->arch->attention;
	uint32_t	window = 0;
	uint32_t	n_shared = 0;
	cai_status	st;

	if (a->window_period > 0 &&
		(st = read_arch_u32(f, c->arch_name, a->window_key, true, 0, &window, err)) != CAI_OK)
		return st;
	if ((st = read_arch_u32(f, c->arch_name, a->shared_kv_layers_key, false, 0, &n_shared,
							err)) != CAI_OK)
		return st;
	return cai_config_layer_attention(c, a, window, n_shared, err);
}

/*
 * The file's architecture, found among the descriptions (src/engine/arch), and what the
 * description decides for the whole model.  Refused when the engine lacks its norm placement
 * or activation, so that a new description cannot load a model the forward would miscompute.
 */
static cai_status
config_find_arch(const gguf_file *f, cai_config *c, cai_error *err)
{
	const char *arch = c->arch_name;
	const cai_arch_desc *a;

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
	if ((a->norm != CAI_NORM_PRE && a->norm != CAI_NORM_SANDWICH) ||
		(a->activation != CAI_ACT_SWIGLU && a->activation != CAI_ACT_GEGLU))
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"architecture '%s' needs a norm placement or activation the engine lacks", arch);
	c->arch = a;
	c->sandwich_norm = a->norm == CAI_NORM_SANDWICH;
	c->ffn_act = a->activation;
	c->rope_base_windowed = a->attention.window_period > 0 ? a->rope.base_windowed : 0.0f;
	return CAI_OK;
}

/*
 * The model's sizes (layers, widths, heads, context) and norm and rope constants, each range
 * checked here: every buffer of the load and the forward is sized from them, so a hostile file
 * must fail on them before anything is allocated.
 */
static cai_status
config_read_sizes(const gguf_file *f, cai_config *c, cai_error *err)
{
	const char *arch = c->arch_name;
	const cai_arch_keys *k = c->arch->keys;
	uint32_t	u;
	cai_status	st;

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
	if ((st = read_arch_f32(f, arch, k->rope_freq_base, false, c->arch->rope.base, &c->rope_base,
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
	return CAI_OK;
}

/*
 * The head size (key_length when given, else d_model / n_heads) and the rotated part of it,
 * within what the attention kernels take.
 */
static cai_status
config_read_head(const gguf_file *f, cai_config *c, cai_error *err)
{
	const char *arch = c->arch_name;
	const cai_arch_keys *k = c->arch->keys;
	uint32_t	head_dim = 0;
	uint32_t	u;
	cai_status	st;

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
	c->embed_scale = c->arch->embed_scale_sqrt_d ? sqrtf((float) c->d_model) : 1.0f;
	if (c->head_dim % 8 != 0 || c->head_dim > 512)
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"head size %d is not supported (a multiple of 8 up to 512)", c->head_dim);
	if ((st = read_arch_u32(f, arch, k->rope_dimension_count, false, head_dim, &u, err)) != CAI_OK)
		return st;
	c->n_rot = (int) u;
	if (c->n_rot < 2 || c->n_rot % 2 != 0 || c->n_rot > c->head_dim)
		return cai_fail(err, CAI_ERR_FORMAT, "rope dimension count %d does not fit head size %d",
						c->n_rot, c->head_dim);
	c->rope_neox = (c->arch->rope.style == CAI_ROPE_NEOX);
	return CAI_OK;
}

/* Rope scaling: none or linear (the only kind the rope kernels apply). */
static cai_status
config_read_rope_scaling(const gguf_file *f, cai_config *c, cai_error *err)
{
	const char *arch = c->arch_name;
	const cai_arch_keys *k = c->arch->keys;
	char		key[160];
	gguf_str	s;
	float		factor;
	cai_status	st;

	c->rope_freq_scale = 1.0f;
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
	return CAI_OK;
}

const char *
cai_pooling_name(cai_pooling pooling)
{
	switch (pooling)
	{
		case CAI_POOLING_NONE:
			return "none";
		case CAI_POOLING_MEAN:
			return "mean";
		case CAI_POOLING_CLS:
			return "cls";
		case CAI_POOLING_LAST:
			return "last";
		case CAI_POOLING_RANK:
			return "rank";
	}
	return "?";
}

/*
 * The embedding keys: {arch}.pooling_type and {arch}.attention.causal.  A chat model's file
 * names neither; its embeddings are the mean of its hidden states (what sentence encoders
 * built on decoders default to), over causal attention.
 */
static cai_status
config_read_embedding(const gguf_file *f, cai_config *c, cai_error *err)
{
	char		key[160];
	uint32_t	pooling;
	cai_status	st;

	if ((st = read_arch_u32(f, c->arch_name, "pooling_type", false, CAI_POOLING_MEAN, &pooling,
							err)) != CAI_OK)
		return st;
	if (pooling > CAI_POOLING_RANK)
		return cai_fail(err, CAI_ERR_FORMAT, "%s.pooling_type %u is not a known pooling",
						c->arch_name, pooling);
	c->pooling = (cai_pooling) pooling;
	c->causal = true;
	snprintf(key, sizeof(key), "%s.attention.causal", c->arch_name);
	if (gguf_find_kv(f, key) && !gguf_get_bool(f, key, &c->causal))
		return cai_fail(err, CAI_ERR_FORMAT, "metadata key '%s' is not a boolean", key);
	return CAI_OK;
}

/* Fills m->cfg from the file's metadata (shapes checked against tensors later). */
cai_status
cai_model_read_config(cai_model *m, const char *path, cai_error *err)
{
	const gguf_file *f = m->gguf;
	cai_config *c = &m->cfg;
	const cai_arch_desc *a;
	cai_status	st;

	if ((st = config_find_arch(f, c, err)) != CAI_OK)
		return st;
	a = c->arch;
	if (!gguf_get_cstr(f, "general.name", c->name, sizeof(c->name)) || c->name[0] == '\0')
	{
		const char *base = strrchr(path, '/');

		snprintf(c->name, sizeof(c->name), "%s", base ? base + 1 : path);
	}
	if ((st = config_read_sizes(f, c, err)) != CAI_OK ||
		(st = config_read_head(f, c, err)) != CAI_OK ||
		(st = config_read_rope_scaling(f, c, err)) != CAI_OK ||
		(st = config_read_embedding(f, c, err)) != CAI_OK)
		return st;

	/* the GEMM kernels want every reduction length a multiple of 4 */
	if (c->d_model % 4 != 0 || c->d_ff % 4 != 0 || (c->n_heads * c->head_dim) % 4 != 0)
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"model widths must be multiples of 4 (d_model %d, d_ff %d)", c->d_model, c->d_ff);

	/* required biases, or optional ones the file has (layer 0 decides for every layer) */
	c->qkv_bias = a->qkv_bias == CAI_QKV_BIAS_REQUIRED;
	if (a->qkv_bias == CAI_QKV_BIAS_OPTIONAL && a->tensors->attn_q_bias)
	{
		char		name[96];

		snprintf(name, sizeof(name), "blk.0.%s", a->tensors->attn_q_bias);
		c->qkv_bias = gguf_find_tensor(f, name) != NULL;
	}
	/* per-head query/key norms: every layer has them when the architecture names them */
	c->qk_norm = a->tensors->attn_q_norm != NULL && a->tensors->attn_k_norm != NULL;
	c->attn_window = cai_model_alloc(m, (size_t) c->n_layers * sizeof(int));
	c->kv_source = cai_model_alloc(m, (size_t) c->n_layers * sizeof(int));
	c->kv_index = cai_model_alloc(m, (size_t) c->n_layers * sizeof(int));
	if (!c->attn_window || !c->kv_source || !c->kv_index)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory reading the model config");
	return read_layer_attention(f, c, err);
}
