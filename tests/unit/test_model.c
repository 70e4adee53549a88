/*
 * test_model.c — loading models (config, weight conversion, validation of bad files), model
 * info and description, tokens and chat prompts with truncation.
 */
#define _GNU_SOURCE				/* memmem */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/ops.h"
#include "model.h"
#include "quant.h"
#include "synth_model.h"
#include "test.h"

static void
temp_path(char *buf, size_t cap, const char *tag)
{
	snprintf(buf, cap, "/tmp/cai_test_model_%d_%s.gguf", (int) getpid(), tag);
}

/* Loads a GGUF image from memory through a temp file, with these parameters. */
static cai_status
load_image_with(const uint8_t *data, size_t size, const cai_model_params *params,
				cai_model **model, cai_error *err)
{
	char		path[128];
	FILE	   *f;
	cai_status	st;

	temp_path(path, sizeof(path), "image");
	f = fopen(path, "wb");
	if (!f)
		return CAI_ERR_IO;
	fwrite(data, 1, size, f);
	fclose(f);
	st = cai_model_load(path, params, model, err);
	unlink(path);
	return st;
}

/* The same with the default parameters (and the float reference when fref). */
static cai_status
load_image(const uint8_t *data, size_t size, bool fref, cai_model **model, cai_error *err)
{
	cai_model_params params;

	cai_model_params_default(&params);
	params.load_float_reference = fref;
	return load_image_with(data, size, &params, model, err);
}

static cai_status
load_config_with(const synth_model_config *cfg, const cai_model_params *params,
				 cai_model **model, cai_error *err)
{
	uint8_t    *data;
	size_t		size;
	cai_status	st = synth_model_write_buffer(cfg, &data, &size, err);

	*model = NULL;
	if (st != CAI_OK)
		return st;
	st = load_image_with(data, size, params, model, err);
	free(data);
	return st;
}

static cai_status
load_config(const synth_model_config *cfg, bool fref, cai_model **model, cai_error *err)
{
	cai_model_params params;

	/* one digit, nearest rounding: the numerics these checks' sizes and levels were written for */
	cai_model_params_default(&params);
	params.load_float_reference = fref;
	params.rounding = CAI_ROUNDING_NEAREST;
	params.activations = CAI_ACTIVATIONS_INT8;
	return load_config_with(cfg, &params, model, err);
}

/*
 * With the float reference, int8 weights and nearest rounding (the default, said explicitly):
 * the conversion's structure (smoothing, rotations, fused rows) can then be checked element by
 * element against cai_quantize_row_i8.
 */
static cai_status
load_config_nearest(const synth_model_config *cfg, cai_model **model, cai_error *err)
{
	cai_model_params params;

	cai_model_params_default(&params);
	params.load_float_reference = true;
	params.weights = CAI_WEIGHTS_INT8;
	params.rounding = CAI_ROUNDING_NEAREST;
	return load_config_with(cfg, &params, model, err);
}

/*
 * Every int8 row (read through the matrix's layout), dequantized, is within half a step of the
 * source row with its columns multiplied by col (NULL: 1).
 */
static bool
qmatrix_matches_scaled(const cai_qmatrix *m, int row0, const float *f, int n_rows,
					   const float *col)
{
	int8_t	   *q = malloc(m->k);
	bool		ok = q != NULL;

	for (int r = 0; ok && r < n_rows; r++)
	{
		float		s = m->scale[row0 + r];

		memcpy(q, m->q + (size_t) (row0 + r) * m->k, m->k);
		for (int i = 0; i < m->k; i++)
		{
			float		deq = q[i] * s;
			float		want = f[(size_t) r * m->k + i] * (col ? col[i] : 1.0f);

			if (fabsf(deq - want) > 0.5001f * s + 1e-7f)
				ok = false;
		}
	}
	free(q);
	return ok;
}

static bool
qmatrix_matches(const cai_qmatrix *m, int row0, const float *f, int n_rows)
{
	return qmatrix_matches_scaled(m, row0, f, n_rows, NULL);
}

static bool
is_power_of_two(float x)
{
	int			e;

	return x > 0.0f && frexpf(x, &e) == 0.5f;
}

/*
 * rot is the rotation calibrate.c documents for vectors of n values: n_pow2 * n_mix == n with
 * n_pow2 the largest power of two dividing n (or only n_pow2 when the mix would be too large),
 * the Hartley table, norm 1/sqrt(n).
 */
static bool
rotation_well_formed(const cai_rotation *rot, int n)
{
	int			p = 1;

	while (n % (2 * p) == 0)
		p *= 2;
	if (rot->n_pow2 != p || (n / p <= CAI_ROTATION_MAX_MIX ? rot->n != n || rot->n_mix != n / p :
							 rot->n != p || rot->n_mix != 1))
		return false;
	if (fabs(rot->norm - 1.0 / sqrt((double) rot->n)) > 1e-7)
		return false;
	for (int a = 0; a < rot->n_mix; a++)
		for (int b = 0; b < rot->n_mix; b++)
		{
			double		theta = 2.0 * M_PI * a * b / rot->n_mix;

			if (fabs(rot->mix[a * rot->n_mix + b] - (cos(theta) + sin(theta))) > 1e-6)
				return false;
		}
	return true;
}

/*
 * One int8 row is the quantization of the source row times col[] (NULL: 1) times row_mul,
 * rotated block by block: the same int8 values (q and have: k bytes of scratch each), and a
 * scale that is the expected one times scale_ratio (the up rows' pow2 factors are checked by
 * the caller through it).
 */
static bool
row_is(const cai_qmatrix *m, int r, const float *src, const float *col, float row_mul,
	   const cai_rotation *rot, float *tmp, int8_t *q, int8_t *have, float *scale_out)
{
	float		scale;

	for (int i = 0; i < m->k; i++)
		tmp[i] = src[i] * (col ? col[i] : 1.0f) * row_mul;
	for (int b = 0; b < m->k; b += rot->n)
		cai_op_rotate_vec(rot, tmp + b);
	cai_quantize_row_i8(tmp, m->k, q, &scale);
	memcpy(have, m->q + (size_t) r * m->k, m->k);
	*scale_out = scale;
	return memcmp(q, have, m->k) == 0;
}

static bool
rows_are(const cai_qmatrix *m, int row0, const float *f, int n_rows, const float *col,
		 const cai_rotation *rot)
{
	float	   *tmp = malloc(sizeof(float) * m->k);
	int8_t	   *q = malloc(2 * (size_t) m->k);
	bool		ok = tmp && q;

	for (int r = 0; r < n_rows && ok; r++)
	{
		float		scale;

		ok = row_is(m, row0 + r, f + (size_t) r * m->k, col, 1.0f, rot, tmp, q, q + m->k,
					&scale) && scale == m->scale[row0 + r];
	}
	free(tmp);
	free(q);
	return ok;
}

/*
 * The conversion of a layer (see model.h) is exactly as documented: the smoothing factors s are
 * the ratios of the source and int8-path norm weights (powers of two); QKV and gate/up rows are
 * the source rows times s, rotated by rot_model; V rows are first mixed per head by rot_head
 * (and so are the V biases); output projection rows are rotated per head block; each up row r
 * is divided by the down input's factor t_r (same int8 values, scale times 1/t_r, a power of
 * two); down rows are the source rows times t, rotated by rot_ff.
 */
static bool
layer_conversion_exact(const cai_model *model, int l)
{
	const cai_config *c = &model->cfg;
	const cai_layer_weights *w = &model->layers[l];
	int			d = c->d_model,
				hd = c->head_dim,
				q_dim = c->n_heads * hd,
				kv_dim = c->n_kv_heads * hd;
	float	   *s_attn = malloc(sizeof(float) * d);
	float	   *s_ffn = malloc(sizeof(float) * d);
	float	   *t = malloc(sizeof(float) * c->d_ff);
	float	   *tmp = malloc(sizeof(float) * (c->d_ff > d ? c->d_ff : d));
	float	   *wv = malloc(sizeof(float) * kv_dim * d);
	float	   *col = malloc(sizeof(float) * hd);
	int8_t	   *q = malloc(2 * (size_t) (c->d_ff > d ? c->d_ff : d));
	bool		ok = true;

	for (int j = 0; j < d; j++)
	{
		s_attn[j] = w->attn_norm[j] / w->attn_norm_i8[j];
		s_ffn[j] = w->ffn_norm[j] / w->ffn_norm_i8[j];
		ok = ok && is_power_of_two(s_attn[j]) && is_power_of_two(s_ffn[j]);
	}
	ok = ok && rows_are(&w->wqkv, 0, w->f_wq, q_dim, s_attn, &model->rot_model);
	ok = ok && rows_are(&w->wqkv, q_dim, w->f_wk, kv_dim, s_attn, &model->rot_model);

	/* V: each head's rows mixed by rot_head (every column of the head block is a vector) */
	memcpy(wv, w->f_wv, sizeof(float) * kv_dim * d);
	for (int h = 0; h < c->n_kv_heads; h++)
		for (int j = 0; j < d; j++)
		{
			for (int i = 0; i < hd; i++)
				col[i] = wv[(size_t) (h * hd + i) * d + j];
			for (int b = 0; b < hd; b += model->rot_head.n)
				cai_op_rotate_vec(&model->rot_head, col + b);
			for (int i = 0; i < hd; i++)
				wv[(size_t) (h * hd + i) * d + j] = col[i];
		}
	ok = ok && rows_are(&w->wqkv, q_dim + kv_dim, wv, kv_dim, s_attn, &model->rot_model);
	if (w->bqkv)
	{
		ok = ok && memcmp(w->bqkv_i8, w->bqkv, sizeof(float) * (q_dim + kv_dim)) == 0;
		for (int h = 0; h < c->n_kv_heads && ok; h++)
		{
			memcpy(col, w->bv + h * hd, sizeof(float) * hd);
			for (int b = 0; b < hd; b += model->rot_head.n)
				cai_op_rotate_vec(&model->rot_head, col + b);
			ok = memcmp(col, w->bqkv_i8 + q_dim + kv_dim + h * hd, sizeof(float) * hd) == 0;
		}
	}
	else
		ok = ok && w->bqkv_i8 == NULL;

	ok = ok && rows_are(&w->wo, 0, w->f_wo, d, NULL, &model->rot_head);
	ok = ok && rows_are(&w->w_gate_up, 0, w->f_gate, c->d_ff, s_ffn, &model->rot_model);
	for (int r = 0; r < c->d_ff && ok; r++)
	{
		float		scale;

		ok = row_is(&w->w_gate_up, c->d_ff + r, w->f_up + (size_t) r * d, s_ffn, 1.0f,
					&model->rot_model, tmp, q, q + d, &scale);
		t[r] = scale / w->w_up.scale[r];
		ok = ok && is_power_of_two(t[r]);
	}
	ok = ok && rows_are(&w->w_down, 0, w->f_down, d, t, &model->rot_ff);
	free(s_attn);
	free(s_ffn);
	free(t);
	free(tmp);
	free(wv);
	free(col);
	free(q);
	return ok;
}

/*
 * The LM head is its own int8 matrix: the float head's rows times the head input's smoothing
 * factors (out_norm / out_norm_i8, powers of two), rotated by rot_model; the embedding is the
 * plain requantization of its rows.
 */
static bool
head_conversion_exact(const cai_model *model)
{
	const cai_config *c = &model->cfg;
	float	   *s = malloc(sizeof(float) * c->d_model);
	bool		ok = model->lm_head.q != model->tok_embd.q;

	for (int j = 0; j < c->d_model; j++)
	{
		s[j] = model->out_norm[j] / model->out_norm_i8[j];
		ok = ok && is_power_of_two(s[j]);
	}
	ok = ok && rows_are(&model->lm_head, 0, model->f_lm_head, c->n_vocab, s, &model->rot_model);
	ok = ok && qmatrix_matches(&model->tok_embd, 0, model->f_tok_embd, c->n_vocab);
	ok = ok && rotation_well_formed(&model->rot_model, c->d_model);
	ok = ok && rotation_well_formed(&model->rot_ff, c->d_ff);
	ok = ok && rotation_well_formed(&model->rot_head, c->head_dim);
	free(s);
	return ok;
}

TEST(model_load_synthetic_llama)
{
	synth_model_config cfg;
	cai_model  *model;
	cai_error	err;
	const cai_config *c;
	int			q_dim,
				kv_dim;

	synth_model_default_config(&cfg);
	cfg.weight_type = GGML_TYPE_Q8_0;
	cfg.d_model = 64;
	CHECK(load_config_nearest(&cfg, &model, &err) == CAI_OK);
	if (!model)
		return;
	c = &model->cfg;
	CHECK(c->arch == &cai_arch_llama);
	CHECK(strcmp(c->name, "synthetic") == 0);
	CHECK_EQ_INT(c->n_layers, 2);
	CHECK_EQ_INT(c->d_model, 64);
	CHECK_EQ_INT(c->n_heads, 4);
	CHECK_EQ_INT(c->n_kv_heads, 2);
	CHECK_EQ_INT(c->head_dim, 16);
	CHECK_EQ_INT(c->n_rot, 16);
	CHECK_EQ_INT(c->d_ff, 128);
	CHECK_EQ_INT(c->n_vocab, synth_model_n_vocab());
	CHECK_EQ_INT(c->context_length, 256);
	CHECK(!c->rope_neox);
	CHECK(!c->qkv_bias);
	CHECK(c->tied_embeddings);
	CHECK_NEAR(c->rope_base, 10000.0, 1e-3);
	CHECK_NEAR(c->norm_eps, 1e-5, 1e-9);
	CHECK_EQ_INT(c->n_kv_layers, 2);
	CHECK(c->attn_window[0] == 0 && c->kv_source[1] == 1 && c->kv_index[1] == 1);

	/*
	 * int8 weights are the float source, smoothed, rotated, requantized per row; views cover
	 * the fused rows
	 */
	q_dim = c->n_heads * c->head_dim;
	kv_dim = c->n_kv_heads * c->head_dim;
	for (int l = 0; l < c->n_layers; l++)
	{
		const cai_layer_weights *w = &model->layers[l];

		CHECK_EQ_INT(w->wqkv.n_out, q_dim + 2 * kv_dim);
		CHECK(layer_conversion_exact(model, l));
		CHECK(w->wk.q == w->wqkv.q + (size_t) q_dim * c->d_model && w->wk.n_out == kv_dim);
		CHECK(w->w_up.scale == w->w_gate_up.scale + c->d_ff);
		CHECK(w->bq == NULL);
	}
	CHECK(head_conversion_exact(model));
	CHECK(model->f_lm_head == model->f_tok_embd);
	CHECK(model->has_float_reference);
	cai_model_free(model);
}

TEST(model_load_synthetic_qwen2_untied)
{
	synth_model_config cfg;
	cai_model  *model;
	cai_error	err;

	synth_model_default_config(&cfg);
	cfg.arch = "qwen2";
	cfg.tied_embeddings = false;
	cfg.weight_type = GGML_TYPE_Q4_K;
	cfg.d_model = 256;
	cfg.n_heads = 4;
	cfg.n_kv_heads = 1;
	cfg.d_ff = 256;
	CHECK(load_config_nearest(&cfg, &model, &err) == CAI_OK);
	if (!model)
		return;
	CHECK(model->cfg.arch == &cai_arch_qwen2);
	CHECK(model->cfg.rope_neox);
	CHECK(model->cfg.qkv_bias);
	CHECK(!model->cfg.tied_embeddings);
	CHECK(model->f_lm_head != model->f_tok_embd);
	CHECK(head_conversion_exact(model));
	CHECK(layer_conversion_exact(model, 0));
	CHECK(layer_conversion_exact(model, 1));
	CHECK(model->layers[1].bq == model->layers[1].bqkv);
	CHECK(model->layers[1].bv == model->layers[1].bqkv + 256 + 64);
	cai_model_free(model);
}

static bool patch(uint8_t *data, size_t size, const char *from, const char *to);

/* qwen3: its per-head q/k norms load as the file has them; missing ones and biases are refused. */
/*
 * gemma3: the post-attention and post-FFN norms load exactly as the file has them, a missing one
 * is refused, and the description names the block and the attention pattern.
 */
TEST(model_load_synthetic_gemma3_and_its_errors)
{
	synth_model_config cfg;
	cai_model  *model;
	cai_error	err;
	uint8_t    *data;
	size_t		size;
	char	   *text = NULL;

	synth_model_default_config(&cfg);
	cfg.arch = "gemma3";
	cfg.n_layers = 6;
	cfg.sliding_window = 16;
	CHECK(load_config(&cfg, false, &model, &err) == CAI_OK);
	if (!model)
		return;
	CHECK(model->cfg.arch == &cai_arch_gemma3);
	CHECK(model->cfg.sandwich_norm && model->cfg.qk_norm && model->cfg.ffn_act == CAI_ACT_GEGLU);
	for (int l = 0; l < model->cfg.n_layers; l++)
	{
		static const char *const which[] = {"post_attention_norm.weight", "post_ffw_norm.weight"};

		for (int k = 0; k < 2; k++)
		{
			char		name[64];
			const gguf_tensor *t;
			const float *w = k == 0 ? model->layers[l].attn_post_norm : model->layers[l].ffn_post_norm;

			snprintf(name, sizeof(name), "blk.%d.%s", l, which[k]);
			t = gguf_find_tensor(model->gguf, name);
			CHECK(t && t->type == GGML_TYPE_F32 && w);
			if (t && w)
				CHECK(memcmp(t->data, w, sizeof(float) * model->cfg.d_model) == 0);
		}
		CHECK_EQ_INT(model->cfg.attn_window[l], l == 5 ? 0 : 16);
	}
	CHECK(cai_model_describe(model, &text, &err) == CAI_OK);
	CHECK(text && strstr(text, "attention: 5 sliding-window layers, 1 global") != NULL);
	CHECK(text && strstr(text, "windowed layers' rope: base 10000, unscaled") != NULL);
	CHECK(text && strstr(text, "block: norms before and after each sublayer, GeGLU FFN, "
						 "embeddings scaled by sqrt(d_model)") != NULL);
	cai_free(text);
	cai_model_free(model);

	/* a missing post-FFN norm */
	CHECK(synth_model_write_buffer(&cfg, &data, &size, &err) == CAI_OK);
	if (!data)
		return;
	CHECK(patch(data, size, "blk.2.post_ffw_norm.weight", "blk.2.post_ffw_norm.weighX"));
	CHECK(load_image(data, size, false, &model, &err) == CAI_ERR_FORMAT);
	CHECK_MSG(strstr(err.message, "missing tensor 'blk.2.post_ffw_norm.weight'") != NULL, "%s",
			  err.message);
	free(data);
}

TEST(model_load_synthetic_qwen3_and_its_errors)
{
	synth_model_config cfg;
	cai_model  *model;
	cai_error	err;
	uint8_t    *data;
	size_t		size;

	synth_model_default_config(&cfg);
	cfg.arch = "qwen3";
	cfg.head_dim = 32;
	CHECK(load_config(&cfg, false, &model, &err) == CAI_OK);
	if (!model)
		return;
	CHECK(model->cfg.arch == &cai_arch_qwen3);
	CHECK(model->cfg.rope_neox && model->cfg.qk_norm && !model->cfg.qkv_bias);
	CHECK_EQ_INT(model->cfg.head_dim, 32);
	for (int l = 0; l < model->cfg.n_layers; l++)
	{
		char		name[64];
		const gguf_tensor *tq,
				   *tk;

		snprintf(name, sizeof(name), "blk.%d.attn_q_norm.weight", l);
		tq = gguf_find_tensor(model->gguf, name);
		snprintf(name, sizeof(name), "blk.%d.attn_k_norm.weight", l);
		tk = gguf_find_tensor(model->gguf, name);
		CHECK(tq && tk && tq->type == GGML_TYPE_F32 && tk->type == GGML_TYPE_F32);
		if (tq && tk)
		{
			CHECK(memcmp(model->layers[l].attn_q_norm, tq->data, 32 * sizeof(float)) == 0);
			CHECK(memcmp(model->layers[l].attn_k_norm, tk->data, 32 * sizeof(float)) == 0);
		}
	}
	cai_model_free(model);

	/* a layer without its key norm */
	CHECK(synth_model_write_buffer(&cfg, &data, &size, &err) == CAI_OK);
	if (!data)
		return;
	CHECK(patch(data, size, "blk.1.attn_k_norm", "blk.1.attn_k_norX"));
	CHECK(load_image(data, size, false, &model, &err) == CAI_ERR_FORMAT);
	CHECK_MSG(strstr(err.message, "missing tensor 'blk.1.attn_k_norm.weight'") != NULL, "%s",
			  err.message);
	free(data);

	/* q/k/v biases, which qwen3 has none of, are refused rather than ignored */
	cfg.qkv_bias = true;
	CHECK(load_config(&cfg, false, &model, &err) == CAI_ERR_UNSUPPORTED);
	CHECK_MSG(strstr(err.message, "which architecture 'qwen3' does not use") != NULL, "%s",
			  err.message);
}

/* True when no two of the model's tokens decode to the same bytes. */
static bool
tokens_distinct(const cai_model *model)
{
	int			n = cai_tokenizer_n_vocab(model->tokenizer);
	char	  (*text)[64] = calloc((size_t) n, 64);
	int		   *len = calloc((size_t) n, sizeof(int));
	bool		ok = text && len;

	for (int i = 0; ok && i < n; i++)
		ok = (len[i] = cai_tokenizer_token_bytes(model->tokenizer, i, text[i], 64)) >= 0;
	for (int i = 0; ok && i < n; i++)
		for (int j = i + 1; ok && j < n; j++)
			ok = len[i] != len[j] || memcmp(text[i], text[j], (size_t) len[i]) != 0;
	free(text);
	free(len);
	return ok;
}

/* The synthetic vocabulary padded to a real model's size, and borrowed from another file. */
TEST(model_load_synthetic_padded_vocabulary)
{
	synth_model_config cfg;
	cai_model  *model;
	cai_error	err;
	char		path[128];
	uint8_t    *a = NULL,
			   *b = NULL;
	size_t		na,
				nb;
	FILE	   *f;

	synth_model_default_config(&cfg);
	cfg.n_vocab = 1000;
	CHECK(load_config(&cfg, false, &model, &err) == CAI_OK);
	if (!model)
		return;
	CHECK_EQ_INT(model->cfg.n_vocab, 1000);
	CHECK_EQ_INT(cai_tokenizer_n_vocab(model->tokenizer), 1000);
	/* every padding token is a word of its own: found by its text, and decodes to letters */
	for (int32_t id = synth_model_n_vocab(); id < 1000; id++)
	{
		char		buf[64];
		int			len = cai_tokenizer_token_bytes(model->tokenizer, id, buf, sizeof(buf) - 1);
		int			letters = 0;

		CHECK(len >= 4);
		for (int i = 0; i < len; i++)
			letters += buf[i] >= 'a' && buf[i] <= 'z';
		CHECK(letters == len || (buf[0] == ' ' && letters == len - 1));
	}
	{
		cai_tokens	toks;

		cai_tokens_init(&toks);
		/* no merge reaches a padding token */
		CHECK(cai_tokenizer_encode(model->tokenizer, "Hello world, bapa cebe", 22, false,
								   &toks, &err) == CAI_OK);
		for (int i = 0; i < toks.n; i++)
			CHECK(toks.ids[i] < synth_model_n_vocab());
		cai_tokens_free(&toks);
	}
	CHECK(tokens_distinct(model));
	cai_model_free(model);

	/* a vocabulary below the tokenizer's own is refused */
	cfg.n_vocab = 100;
	CHECK(synth_model_write_buffer(&cfg, &a, &na, &err) == CAI_ERR_INVALID_ARGUMENT);

	/*
	 * the tokenizer borrowed from a file of the built-in one, padded the same way, gives the
	 * same file; and the streamed file is the buffer byte for byte
	 */
	temp_path(path, sizeof(path), "vocab");
	synth_model_default_config(&cfg);
	CHECK(synth_model_write(path, &cfg, &err) == CAI_OK);
	cfg.n_vocab = 600;
	CHECK(synth_model_write_buffer(&cfg, &a, &na, &err) == CAI_OK);
	cfg.vocab_from = path;
	CHECK(synth_model_write_buffer(&cfg, &b, &nb, &err) == CAI_OK);
	CHECK(a && b && na == nb && memcmp(a, b, na) == 0);
	free(b);
	b = NULL;
	CHECK(synth_model_write(path, &cfg, &err) == CAI_OK);
	f = fopen(path, "rb");
	if (f && (b = malloc(na + 1)) != NULL)
		CHECK(fread(b, 1, na + 1, f) == na && memcmp(a, b, na) == 0);
	if (f)
		fclose(f);

	/* padding a padded vocabulary again skips the words it already has */
	cfg.vocab_from = NULL;
	CHECK(synth_model_write(path, &cfg, &err) == CAI_OK);
	cfg.vocab_from = path;
	cfg.n_vocab = 700;
	CHECK(load_config(&cfg, false, &model, &err) == CAI_OK);
	if (model)
	{
		CHECK_EQ_INT(cai_tokenizer_n_vocab(model->tokenizer), 700);
		CHECK(tokens_distinct(model));
		cai_model_free(model);
	}
	unlink(path);
	free(a);
	free(b);
}

/* Llama 3's rope_freqs.weight becomes the rotary embedding's frequency divisors. */
TEST(model_load_llama3_rope_freqs)
{
	synth_model_config cfg;
	cai_model  *model;
	cai_error	err;
	float		want[8];

	synth_model_default_config(&cfg);
	cfg.rope_base = 500000.0f;
	cfg.llama3_factor = 8.0f;
	cfg.llama3_low_freq_factor = 1.0f;
	cfg.llama3_high_freq_factor = 4.0f;
	cfg.llama3_original_context = 64;
	CHECK(load_config(&cfg, false, &model, &err) == CAI_OK);
	if (!model)
		return;
	CHECK_EQ_INT(model->cfg.n_rot, 16);
	synth_model_llama3_rope_factors(&cfg, 16, want);
	CHECK(model->rope_freqs != NULL);
	if (model->rope_freqs)
		CHECK(memcmp(model->rope_freqs, want, sizeof(want)) == 0);
	/* the three bands: unscaled, blended, divided by the factor */
	CHECK(want[0] == 1.0f);
	CHECK(want[1] > 1.0f && want[1] < 8.0f);
	CHECK(want[7] == 8.0f);
	cai_model_free(model);

	/* without the tensor: no divisors */
	cfg.llama3_factor = 0.0f;
	CHECK(load_config(&cfg, false, &model, &err) == CAI_OK);
	if (!model)
		return;
	CHECK(model->rope_freqs == NULL);
	cai_model_free(model);
}

/* Every int8 matrix of a model's layers and head, for comparing two conversions. */
static int
model_matrices(const cai_model *m, const cai_qmatrix **out)
{
	int			n = 0;

	out[n++] = &m->lm_head;
	for (int l = 0; l < m->cfg.n_layers; l++)
	{
		out[n++] = &m->layers[l].wqkv;
		out[n++] = &m->layers[l].wo;
		out[n++] = &m->layers[l].w_gate_up;
		out[n++] = &m->layers[l].w_down;
	}
	return n;
}

/*
 * GPTQ rounding picks among the same levels as nearest rounding: every
 * scale is the same, the int8 values move by a level or two where they move at all, and many
 * do move; and the conversion is the same bits for any number of load threads.
 */
TEST(model_gptq_rounding_keeps_levels)
{
	synth_model_config cfg;
	cai_model_params params;
	cai_model  *near = NULL,
			   *comp = NULL,
			   *comp1 = NULL;
	cai_error	err;
	const cai_qmatrix *mn[1 + 4 * 8],
			   *mc[1 + 4 * 8],
			   *m1[1 + 4 * 8];
	int			n;
	long		moved = 0,
				total = 0,
				far = 0;

	synth_model_default_config(&cfg);
	cai_model_params_default(&params);
	params.rounding = CAI_ROUNDING_NEAREST;
	params.activations = CAI_ACTIVATIONS_INT8;
	CHECK(load_config_with(&cfg, &params, &near, &err) == CAI_OK);
	params.rounding = CAI_ROUNDING_GPTQ;
	params.n_threads = 2;
	CHECK(load_config_with(&cfg, &params, &comp, &err) == CAI_OK);
	params.n_threads = 1;
	CHECK(load_config_with(&cfg, &params, &comp1, &err) == CAI_OK);
	if (!near || !comp || !comp1 || near->cfg.n_layers > 8)
		goto out;
	n = model_matrices(near, mn);
	model_matrices(comp, mc);
	model_matrices(comp1, m1);
	for (int i = 0; i < n; i++)
	{
		int8_t	   *a = malloc(mn[i]->k),
				   *b = malloc(mn[i]->k),
				   *c = malloc(mn[i]->k);

		CHECK(memcmp(mn[i]->scale, mc[i]->scale, (size_t) mn[i]->n_out * sizeof(float)) == 0);
		for (int r = 0; r < mn[i]->n_out; r++)
		{
			memcpy(a, mn[i]->q + (size_t) r * mn[i]->k, mn[i]->k);
			memcpy(b, mc[i]->q + (size_t) r * mc[i]->k, mc[i]->k);
			memcpy(c, m1[i]->q + (size_t) r * m1[i]->k, m1[i]->k);
			CHECK(memcmp(b, c, mn[i]->k) == 0);
			for (int j = 0; j < mn[i]->k; j++)
			{
				int			dq = abs((int) a[j] - (int) b[j]);

				moved += dq != 0;
				far += dq > 2;
				total++;
			}
		}
		free(a);
		free(b);
		free(c);
	}
	CHECK_MSG(moved > total / 20, "%ld of %ld values moved", moved, total);
	CHECK_MSG(far < total / 100, "%ld of %ld values moved by more than two levels", far, total);
out:
	cai_model_free(near);
	cai_model_free(comp);
	cai_model_free(comp1);
}

TEST(model_fingerprint)
{
	synth_model_config cfg;
	cai_model  *a,
			   *b,
			   *c;
	cai_error	err;

	synth_model_default_config(&cfg);
	CHECK(load_config(&cfg, false, &a, &err) == CAI_OK);
	CHECK(load_config(&cfg, false, &b, &err) == CAI_OK);
	cfg.seed = 2;
	CHECK(load_config(&cfg, false, &c, &err) == CAI_OK);
	if (a && b && c)
	{
		CHECK(a->fingerprint != 0);
		CHECK(a->fingerprint == b->fingerprint);
		CHECK(a->fingerprint != c->fingerprint);
	}
	cai_model_free(a);
	cai_model_free(b);
	cai_model_free(c);
}

/* Replaces the first occurrence of `from` in the image by `to` (same length). */
static bool
patch(uint8_t *data, size_t size, const char *from, const char *to)
{
	uint8_t    *p = memmem(data, size, from, strlen(from));

	if (!p || strlen(from) != strlen(to))
		return false;
	memcpy(p, to, strlen(to));
	return true;
}

TEST(model_bad_files)
{
	synth_model_config cfg;
	uint8_t    *data;
	size_t		size;
	cai_model  *model = NULL;
	cai_error	err;
	uint8_t    *copy;
	uint8_t    *p;
	int64_t		ne1 = 32;
	char		path[128];

	synth_model_default_config(&cfg);
	CHECK(synth_model_write_buffer(&cfg, &data, &size, &err) == CAI_OK);
	if (!data)
		return;
	copy = malloc(size);

	/* a missing tensor */
	memcpy(copy, data, size);
	CHECK(patch(copy, size, "blk.1.ffn_up.weight", "blk.1.ffn_uX.weight"));
	CHECK(load_image(copy, size, false, &model, &err) == CAI_ERR_FORMAT);
	CHECK(model == NULL);
	CHECK_MSG(strstr(err.message, "missing tensor 'blk.1.ffn_up.weight'") != NULL, "%s", err.message);

	/* a wrong shape: attn_q's row count halved */
	memcpy(copy, data, size);
	p = memmem(copy, size, "blk.0.attn_q.weight", 19);
	CHECK(p != NULL);
	if (p)
	{
		/* name, then n_dims (u32), ne[0] (i64), ne[1] (i64) */
		memcpy(p + 19 + 4 + 8, &ne1, sizeof(ne1));
		CHECK(load_image(copy, size, false, &model, &err) == CAI_ERR_FORMAT);
		CHECK_MSG(strstr(err.message, "tensor 'blk.0.attn_q.weight' has shape [64, 32, 1, 1], expected [64, 64]") != NULL,
				  "%s", err.message);
	}

	/* an architecture the engine lacks */
	memcpy(copy, data, size);
	CHECK(patch(copy, size, "llama", "mamba"));
	CHECK(load_image(copy, size, false, &model, &err) == CAI_ERR_UNSUPPORTED);
	CHECK_MSG(strstr(err.message, "unsupported model architecture 'mamba' (supported: llama, qwen2, qwen3, gemma3)") != NULL,
			  "%s", err.message);

	/* a missing hyperparameter */
	memcpy(copy, data, size);
	CHECK(patch(copy, size, "llama.feed_forward_length", "llama.feed_forward_lengtX"));
	CHECK(load_image(copy, size, false, &model, &err) == CAI_ERR_FORMAT);
	CHECK_MSG(strstr(err.message, "llama.feed_forward_length") != NULL, "%s", err.message);

	/* heads that do not divide */
	memcpy(copy, data, size);
	p = memmem(copy, size, "llama.attention.head_count_kv", 29);
	CHECK(p != NULL);
	if (p)
	{
		uint32_t	three = 3;

		/* key, then the value type (u32), then the value */
		memcpy(p + 29 + 4, &three, sizeof(three));
		CHECK(load_image(copy, size, false, &model, &err) == CAI_ERR_FORMAT);
		CHECK_MSG(strstr(err.message, "kv heads") != NULL, "%s", err.message);
	}

	/* truncated */
	CHECK(load_image(data, size / 2, false, &model, &err) != CAI_OK);
	CHECK(model == NULL);

	/* not there */
	temp_path(path, sizeof(path), "absent");
	CHECK(cai_model_load(path, NULL, &model, &err) == CAI_ERR_IO);

	/* and the intact image loads */
	CHECK(load_image(data, size, false, &model, &err) == CAI_OK);
	cai_model_free(model);
	free(copy);
	free(data);

	/* qwen2 without one of its biases */
	cfg.arch = "qwen2";
	CHECK(synth_model_write_buffer(&cfg, &data, &size, &err) == CAI_OK);
	if (!data)
		return;
	CHECK(patch(data, size, "blk.1.attn_k.bias", "blk.1.attn_k.biaX"));
	CHECK(load_image(data, size, false, &model, &err) == CAI_ERR_FORMAT);
	CHECK_MSG(strstr(err.message, "missing tensor 'blk.1.attn_k.bias'") != NULL, "%s", err.message);
	free(data);
}

TEST(model_info_and_describe)
{
	synth_model_config cfg;
	cai_model  *model;
	cai_model_info info;
	cai_kv_layout layout;
	cai_error	err;
	char	   *text = NULL;

	synth_model_default_config(&cfg);
	CHECK(load_config(&cfg, false, &model, &err) == CAI_OK);
	if (!model)
		return;
	cai_model_get_info(model, &info);
	CHECK(strcmp(info.arch, "llama") == 0);
	CHECK(strcmp(info.name, "synthetic") == 0);
	CHECK(strcmp(info.chat_template, "chatml") == 0);
	CHECK_EQ_INT(info.n_layers, 2);
	CHECK_EQ_INT(info.head_dim, 16);
	CHECK_EQ_INT(info.n_vocab, synth_model_n_vocab());
	CHECK(info.n_params > 0);
	CHECK(info.weight_bytes > 0);
	/* 2 layers x 2 kv heads x (16 + 16 int8 + 2 float scales) */
	CHECK_EQ_INT(info.kv_bytes_per_token, 2 * 2 * (32 + 8));
	CHECK(info.fingerprint == model->fingerprint);
	CHECK_EQ_INT(info.eos_token, SYNTH_TOKEN_IM_END);
	CHECK_EQ_INT(info.eot_token, SYNTH_TOKEN_IM_END);

	cai_model_kv_layout(model, &layout);
	CHECK_EQ_INT(layout.n_kv_layers, 2);
	CHECK(layout.layer_bytes >= (size_t) 16 * 2 * (32 + 8) && layout.layer_bytes % 64 == 0);
	CHECK_EQ_INT(layout.block_bytes, 2 * layout.layer_bytes);

	CHECK(cai_model_describe(model, &text, &err) == CAI_OK);
	CHECK(text && strstr(text, "architecture: llama") != NULL);
	CHECK(text && strstr(text, "blk.1.ffn_down.weight") != NULL);
	CHECK(text && strstr(text, "llama.block_count = 2") != NULL);
	cai_free(text);
	cai_model_free(model);
}

TEST(model_tokens_and_prompt_truncation)
{
	synth_model_config cfg;
	cai_model  *model;
	cai_error	err;
	int32_t    *ids = NULL;
	int			n = 0;
	char	   *text = NULL;
	size_t		len = 0;
	cai_chat_message msgs[7] = {
		{CAI_ROLE_SYSTEM, "be brief", NULL, 0, NULL},
		{CAI_ROLE_USER, "first question, quite a long one with many words in it", NULL, 0, NULL},
		{CAI_ROLE_ASSISTANT, "first answer, also long enough to matter here", NULL, 0, NULL},
		{CAI_ROLE_USER, "second question", NULL, 0, NULL},
		{CAI_ROLE_ASSISTANT, "second answer", NULL, 0, NULL},
		{CAI_ROLE_USER, "third", NULL, 0, NULL},
		{CAI_ROLE_USER, "the last message", NULL, 0, NULL},
	};
	cai_prompt_params pp = {true, 0, true, NULL};
	cai_prompt	full,
				cut;
	int32_t    *last = NULL;
	int			n_last = 0;

	synth_model_default_config(&cfg);
	CHECK(load_config(&cfg, false, &model, &err) == CAI_OK);
	if (!model)
		return;

	CHECK(cai_tokenize(model, "hello world", 11, false, &ids, &n, &err) == CAI_OK);
	CHECK(n > 0);
	CHECK(cai_detokenize(model, ids, n, &text, &len, &err) == CAI_OK);
	CHECK(text && strcmp(text, "hello world") == 0 && len == 11);
	cai_free(text);
	cai_free(ids);
	ids = NULL;
	n = -1;
	CHECK(cai_tokenize(model, "", 0, false, &ids, &n, &err) == CAI_OK);
	CHECK_EQ_INT(n, 0);
	cai_free(ids);
	{
		int32_t		bad = synth_model_n_vocab() + 5;

		CHECK(cai_detokenize(model, &bad, 1, &text, &len, &err) == CAI_ERR_INVALID_ARGUMENT);
	}

	/* no limit: everything kept */
	CHECK(cai_chat_build_prompt(model, msgs, 7, &pp, &full, &err) == CAI_OK);
	CHECK_EQ_INT(full.first_message, 0);
	CHECK(cai_tokenize(model, msgs[6].content, strlen(msgs[6].content), false, &last, &n_last, &err) == CAI_OK);
	CHECK_EQ_INT(full.n_last_content_ids, n_last);
	CHECK(memcmp(full.last_content_ids, last, sizeof(int32_t) * n_last) == 0);

	/*
	 * a limit a bit below the full size: the oldest turns go until what is kept takes at most
	 * half the limit (truncation with hysteresis); the system prompt stays
	 */
	pp.max_prompt_tokens = full.n_ids - 3;
	CHECK(cai_chat_build_prompt(model, msgs, 7, &pp, &cut, &err) == CAI_OK);
	CHECK(cut.n_ids <= pp.max_prompt_tokens / 2);
	CHECK_EQ_INT(cut.first_message, 5);
	/* the system turn opens both prompts identically */
	CHECK(cut.n_ids > 8 && memcmp(cut.ids, full.ids, sizeof(int32_t) * 8) == 0);
	/* and the kept tail is the same tokens */
	CHECK(memcmp(cut.ids + cut.n_ids - 20, full.ids + full.n_ids - 20, sizeof(int32_t) * 20) == 0);
	cai_prompt_free(&cut);

	/* refusing to truncate */
	pp.truncate = false;
	CHECK(cai_chat_build_prompt(model, msgs, 7, &pp, &cut, &err) == CAI_ERR_CONTEXT_FULL);
	CHECK_MSG(strstr(err.message, "more than the limit") != NULL, "%s", err.message);
	CHECK(cut.ids == NULL);

	/* even the last message alone does not fit */
	pp.truncate = true;
	pp.max_prompt_tokens = 4;
	CHECK(cai_chat_build_prompt(model, msgs, 7, &pp, &cut, &err) == CAI_ERR_CONTEXT_FULL);
	CHECK_MSG(strstr(err.message, "last message") != NULL, "%s", err.message);

	/* stored token ids are spliced as given */
	msgs[6].tokens = last;
	msgs[6].n_tokens = n_last;
	msgs[6].content = NULL;
	pp.max_prompt_tokens = 0;
	CHECK(cai_chat_build_prompt(model, msgs, 7, &pp, &cut, &err) == CAI_OK);
	CHECK_EQ_INT(cut.n_ids, full.n_ids);
	CHECK(memcmp(cut.ids, full.ids, sizeof(int32_t) * full.n_ids) == 0);
	cai_prompt_free(&cut);

	/* a message with nothing in it */
	msgs[6].tokens = NULL;
	CHECK(cai_chat_build_prompt(model, msgs, 7, &pp, &cut, &err) == CAI_ERR_INVALID_ARGUMENT);

	cai_free(last);
	cai_prompt_free(&full);
	cai_model_free(model);
}

/*
 * Truncation with hysteresis: a long conversation played turn by turn, each request the whole
 * history so far (as cai_chat sends it), under a small budget.
 */
#define HYST_TURNS 60
#define HYST_BUDGET 1200

/* Message i of the long conversation: a system prompt, then user and assistant turns. */
static void
hysteresis_message(int i, char *buf, size_t size, cai_chat_message *m)
{
	int			words = 1 + (i * 7) % 5;
	size_t		used;

	memset(m, 0, sizeof(*m));
	if (i == 0)
	{
		m->role = CAI_ROLE_SYSTEM;
		m->content = "You are a patient assistant who plans projects.";
		return;
	}
	m->role = i % 2 == 1 ? CAI_ROLE_USER : CAI_ROLE_ASSISTANT;
	used = (size_t) snprintf(buf, size, "%s %d:", m->role == CAI_ROLE_USER ? "question" : "answer",
							 i);
	for (int w = 0; w < words && used + 16 < size; w++)
		used += (size_t) snprintf(buf + used, size - used, " word%d", (i + w) % 17);
	m->content = buf;
}

/* The prompt of the request ending at message last (a user message) under budget. */
static cai_status
hysteresis_prompt(const cai_model *model, cai_chat_message *msgs, int last, int budget,
				  cai_prompt *out, cai_error *err)
{
	cai_prompt_params pp = {true, budget, true, NULL};

	return cai_chat_build_prompt(model, msgs, last + 1, &pp, out, err);
}

/* Prompt tokens of the system prompt and msgs[first..last], untruncated. */
static int
hysteresis_length(const cai_model *model, cai_chat_message *msgs, int first, int last)
{
	cai_chat_message kept[2 * HYST_TURNS + 1];
	cai_prompt	p;
	cai_error	err;
	int			n = 0,
				length;

	kept[n++] = msgs[0];
	for (int i = first; i <= last; i++)
		kept[n++] = msgs[i];
	if (cai_chat_build_prompt(model, kept, n, NULL, &p, &err) != CAI_OK)
		return -1;
	length = p.n_ids;
	cai_prompt_free(&p);
	return length;
}

TEST(chat_truncation_keeps_its_cut_until_the_history_overflows)
{
	synth_model_config cfg;
	cai_model  *model;
	cai_error	err;
	static char texts[2 * HYST_TURNS + 1][256];
	cai_chat_message msgs[2 * HYST_TURNS + 1];
	cai_prompt	prev = {0};
	cai_prompt	system_only;
	cai_prompt_params no_gen = {false, 0, true, NULL};
	int			truncated = 0,
				cuts = 0,
				prefix_kept = 0;

	synth_model_default_config(&cfg);
	CHECK(load_config(&cfg, false, &model, &err) == CAI_OK);
	if (!model)
		return;
	for (int i = 0; i <= 2 * HYST_TURNS; i++)
		hysteresis_message(i, texts[i], sizeof(texts[i]), &msgs[i]);
	CHECK(cai_chat_build_prompt(model, msgs, 1, &no_gen, &system_only, &err) == CAI_OK);

	for (int turn = 1; turn <= HYST_TURNS; turn++)
	{
		int			last = 2 * turn - 1;
		cai_prompt	p;

		if (hysteresis_prompt(model, msgs, last, HYST_BUDGET, &p, &err) != CAI_OK)
		{
			CHECK_MSG(false, "turn %d: %s", turn, err.message);
			break;
		}
		/* never over the budget, and the system prompt opens every prompt */
		CHECK_MSG(p.n_ids <= HYST_BUDGET, "turn %d: %d tokens", turn, p.n_ids);
		CHECK(p.n_ids > system_only.n_ids &&
			  memcmp(p.ids, system_only.ids, sizeof(int32_t) * system_only.n_ids) == 0);
		/* a kept history starts with a user turn */
		CHECK(p.first_message == 0 || msgs[p.first_message].role == CAI_ROLE_USER);
		if (p.first_message > 1)
			truncated++;
		if (turn > 1)
		{
			CHECK(p.first_message >= prev.first_message);
			if (p.first_message == prev.first_message)
			{
				/* the same cut: the last prompt is this one's prefix, as the cache needs */
				CHECK_MSG(prev.n_ids < p.n_ids &&
						  memcmp(prev.ids, p.ids, sizeof(int32_t) * prev.n_ids) == 0,
						  "turn %d: the prompt's prefix changed", turn);
				prefix_kept += p.first_message > 1;
			}
			else
			{
				int			from = prev.first_message > 1 ? prev.first_message : 1;

				/* it moved only because the last cut overflowed, and to half the budget */
				cuts++;
				CHECK_MSG(hysteresis_length(model, msgs, from, last) > HYST_BUDGET,
						  "turn %d: the cut moved from %d to %d without an overflow", turn,
						  prev.first_message, p.first_message);
				CHECK_MSG(p.n_ids <= HYST_BUDGET / 2, "turn %d: %d tokens after a cut", turn,
						  p.n_ids);
				/* and no further than needed: one turn fewer dropped would be over half */
				CHECK(hysteresis_length(model, msgs, p.first_message - 2, last) > HYST_BUDGET / 2);
			}
		}
		cai_prompt_free(&prev);
		prev = p;
	}
	/* the conversation went well past the budget, and most truncated turns kept their prefix */
	CHECK_MSG(truncated >= HYST_TURNS / 2, "%d truncated turns", truncated);
	CHECK_MSG(cuts >= 3 && prefix_kept >= 3 * cuts, "%d cuts, %d turns kept the prefix", cuts,
			  prefix_kept);

	/* stateless: the same history gives the same cut, asked for again or on its own */
	{
		cai_prompt	again;

		CHECK(hysteresis_prompt(model, msgs, 2 * HYST_TURNS - 1, HYST_BUDGET, &again, &err) == CAI_OK);
		CHECK_EQ_INT(again.first_message, prev.first_message);
		CHECK(again.n_ids == prev.n_ids &&
			  memcmp(again.ids, prev.ids, sizeof(int32_t) * prev.n_ids) == 0);
		cai_prompt_free(&again);
	}
	cai_prompt_free(&prev);
	cai_prompt_free(&system_only);
	cai_model_free(model);
}

TEST(chat_truncation_of_huge_turns)
{
	synth_model_config cfg;
	cai_model  *model;
	cai_error	err;
	static char texts[2 * HYST_TURNS + 1][256];
	static char huge[16384];
	cai_chat_message msgs[2 * HYST_TURNS + 1];
	cai_prompt	p;
	size_t		used = 0;

	synth_model_default_config(&cfg);
	CHECK(load_config(&cfg, false, &model, &err) == CAI_OK);
	if (!model)
		return;
	for (int i = 0; i <= 2 * HYST_TURNS; i++)
		hysteresis_message(i, texts[i], sizeof(texts[i]), &msgs[i]);
	while (used + 16 < sizeof(huge))
		used += (size_t) snprintf(huge + used, sizeof(huge) - used, " word%d", (int) (used % 13));

	/* a last message that does not fit alone is refused, as before */
	msgs[21].content = huge;
	CHECK(hysteresis_prompt(model, msgs, 21, HYST_BUDGET, &p, &err) == CAI_ERR_CONTEXT_FULL);
	CHECK_MSG(strstr(err.message, "last message") != NULL, "%s", err.message);

	/* later turns cut past it (its request failed, and so would every one that kept it) */
	msgs[22].content = "an answer";
	CHECK(hysteresis_prompt(model, msgs, 23, HYST_BUDGET, &p, &err) == CAI_OK);
	CHECK_EQ_INT(p.first_message, 23);
	cai_prompt_free(&p);
	CHECK(hysteresis_prompt(model, msgs, 29, HYST_BUDGET, &p, &err) == CAI_OK);
	CHECK(p.first_message == 23 && p.n_ids <= HYST_BUDGET);
	cai_prompt_free(&p);

	/* a huge reply in the history: the next turn cuts past it too */
	msgs[21].content = texts[21];
	msgs[40].content = huge;
	CHECK(hysteresis_prompt(model, msgs, 41, HYST_BUDGET, &p, &err) == CAI_OK);
	CHECK_EQ_INT(p.first_message, 41);
	CHECK(p.n_ids <= HYST_BUDGET);
	cai_prompt_free(&p);

	/* refusing to truncate refuses, however the history would be cut */
	{
		cai_prompt_params pp = {true, HYST_BUDGET, false, NULL};

		CHECK(cai_chat_build_prompt(model, msgs, 42, &pp, &p, &err) == CAI_ERR_CONTEXT_FULL);
		CHECK_MSG(strstr(err.message, "more than the limit") != NULL, "%s", err.message);
	}
	cai_model_free(model);
}

TEST(model_real_smollm2)
{
	const char *path = test_real_model_path();
	cai_model  *model;
	cai_model_info info;
	cai_error	err;
	int32_t    *ids = NULL;
	int			n = 0;
	static const int32_t expect[] = {1780, 314, 260, 3575, 282, 4649, 47};

	if (!path)
		SKIP("real model not found");
	CHECK(cai_model_load(path, NULL, &model, &err) == CAI_OK);
	if (!model)
		return;
	cai_model_get_info(model, &info);
	CHECK(strcmp(info.arch, "llama") == 0);
	CHECK_EQ_INT(info.n_layers, 30);
	CHECK_EQ_INT(info.d_model, 576);
	CHECK_EQ_INT(info.n_heads, 9);
	CHECK_EQ_INT(info.n_kv_heads, 3);
	CHECK_EQ_INT(info.head_dim, 64);
	CHECK_EQ_INT(info.d_ff, 1536);
	CHECK_EQ_INT(info.n_vocab, 49152);
	CHECK(model->cfg.tied_embeddings);
	CHECK(!model->cfg.rope_neox);
	CHECK_NEAR(model->cfg.rope_base, 100000.0, 1e-2);
	CHECK(strcmp(info.chat_template, "chatml") == 0);
	CHECK_EQ_INT(info.eot_token, 2);
	/* 134.5M parameters in the file */
	CHECK(info.n_params > 130000000 && info.n_params < 140000000);
	/* ids as llama.cpp gives them */
	CHECK(cai_tokenize(model, "What is the capital of France?", 30, false, &ids, &n, &err) == CAI_OK);
	CHECK_EQ_INT(n, 7);
	CHECK(n == 7 && memcmp(ids, expect, sizeof(expect)) == 0);
	cai_free(ids);
	cai_model_free(model);
}

/* The calibrated conversion gives the same weights with any number of load threads. */
TEST(model_load_thread_invariant)
{
	synth_model_config cfg;
	uint8_t    *data;
	size_t		size;
	char		path[128];
	FILE	   *f;
	cai_model  *a = NULL,
			   *b = NULL;
	cai_model_params params;
	cai_error	err;

	synth_model_default_config(&cfg);
	cfg.arch = "qwen2";
	cfg.n_layers = 3;
	CHECK(synth_model_write_buffer(&cfg, &data, &size, &err) == CAI_OK);
	if (!data)
		return;
	temp_path(path, sizeof(path), "threads");
	f = fopen(path, "wb");
	CHECK(f != NULL);
	if (!f)
	{
		free(data);
		return;
	}
	fwrite(data, 1, size, f);
	fclose(f);
	free(data);
	cai_model_params_default(&params);
	params.n_threads = 1;
	CHECK(cai_model_load(path, &params, &a, &err) == CAI_OK);
	params.n_threads = 3;
	CHECK(cai_model_load(path, &params, &b, &err) == CAI_OK);
	unlink(path);
	if (a && b)
	{
		for (int l = 0; l < a->cfg.n_layers; l++)
		{
			const cai_layer_weights *x = &a->layers[l],
					   *y = &b->layers[l];
			size_t		d = (size_t) a->cfg.d_model;

			CHECK(memcmp(x->attn_norm_i8, y->attn_norm_i8, d * sizeof(float)) == 0);
			CHECK(memcmp(x->ffn_norm_i8, y->ffn_norm_i8, d * sizeof(float)) == 0);
			CHECK(memcmp(x->wqkv.q, y->wqkv.q, (size_t) x->wqkv.n_out * x->wqkv.k) == 0);
			CHECK(memcmp(x->w_gate_up.q, y->w_gate_up.q, (size_t) x->w_gate_up.n_out * x->w_gate_up.k) == 0);
			CHECK(memcmp(x->w_gate_up.scale, y->w_gate_up.scale, (size_t) x->w_gate_up.n_out * sizeof(float)) == 0);
			CHECK(memcmp(x->w_down.q, y->w_down.q, (size_t) x->w_down.n_out * x->w_down.k) == 0);
			CHECK(memcmp(x->wo.q, y->wo.q, (size_t) x->wo.n_out * x->wo.k) == 0);
			CHECK(memcmp(x->bqkv_i8, y->bqkv_i8, (size_t) x->wqkv.n_out * sizeof(float)) == 0);
		}
		CHECK(memcmp(a->out_norm_i8, b->out_norm_i8, (size_t) a->cfg.d_model * sizeof(float)) == 0);
		CHECK(memcmp(a->lm_head.q, b->lm_head.q, (size_t) a->lm_head.n_out * a->lm_head.k) == 0);
		CHECK(memcmp(a->lm_head.scale, b->lm_head.scale, (size_t) a->lm_head.n_out * sizeof(float)) == 0);
	}
	cai_model_free(a);
	cai_model_free(b);
}
