/*
 * model.h — a loaded model (config, int8 weights, tokenizer, template) and its forward pass.
 *
 * The forward takes a ragged batch: each sequence brings its own new tokens (1 for a decode,
 * many for a prefill chunk), its first position and its block table; there is no padding.
 * A sequence's logits are bit-identical whether it runs alone or in a batch, with any thread
 * count: int8 GEMMs accumulate exactly in int32 and every float reduction runs in a fixed
 * per-token order.
 */
#ifndef CAI_MODEL_H
#define CAI_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "arch/arch.h"
#include "backend.h"
#include "cai.h"
#include "chat_template.h"
#include "threadpool.h"
#include "gguf.h"
#include "kv.h"
#include "tokenizer.h"
#include "weights.h"

typedef struct cai_config
{
	const cai_arch_desc *arch;	/* what the generic loader and forward follow */
	char		arch_name[32];
	char		name[128];
	int			n_layers;
	int			d_model;
	int			n_heads;
	int			n_kv_heads;
	int			head_dim;
	int			d_ff;
	int			n_vocab;
	int			context_length;
	float		norm_eps;
	float		rope_base;
	int			n_rot;			/* rotated dimensions per head ({arch}.rope.dimension_count) */
	bool		rope_neox;		/* rotate (i, i + n_rot/2) instead of (2i, 2i+1): the
								 * description's RoPE style */
	float		rope_freq_scale;	/* 1, or 1/factor with linear rope scaling */
	float		rope_base_windowed;	/* > 0: windowed layers' own base (unscaled); 0: none */
	float		embed_scale;	/* the token embedding's multiplier (1 or sqrt(d_model)) */
	bool		sandwich_norm;	/* each sublayer's output is RMSNormed before it is added */
	cai_arch_activation ffn_act;	/* the FFN's gate activation */
	bool		tied_embeddings;	/* LM head = token embedding */
	bool		qkv_bias;		/* required by the description, or present in the file */
	bool		qk_norm;		/* per-head RMSNorm of queries and keys before RoPE */
	/* per layer, from the description (tests change them, then cai_config_update_kv_sharing) */
	int		   *attn_window;	/* [n_layers] 0 = global, else a sliding window in tokens */
	int		   *kv_source;		/* [n_layers] layer whose KV this layer reads (itself = owns) */
	int		   *kv_index;		/* [n_layers] index among KV-owning layers of kv_source[l] */
	int			n_kv_layers;
	int			n_windowed_kv_layers;	/* the last of the KV indexes: read only through windows */
	int			kv_window;		/* the widest window reading them; 0 when there are none */
	/* embeddings (cai_embed): how a text's final hidden states become one vector */
	cai_pooling pooling;		/* {arch}.pooling_type; mean when the file names none */
	bool		causal;			/* {arch}.attention.causal (default true): false lets an
								 * embedded text's tokens attend both ways */
} cai_config;

/*
 * One transformer layer's weights: int8 [out, in] row-major with per-channel scales (weights.h;
 * a backend prepares its own copy).  Q, K and V are one matrix (one GEMM per layer) and wq, wk,
 * wv are views of its row ranges; likewise gate and up.
 *
 * The int8 matrices are smoothed and rotated (calibrate.c's "rotations"): activations at a GEMM's
 * input have outlier channels that per-token int8 quantization handles badly, so input channel j
 * is divided by a power of two s_j chosen at load from a short calibration pass (SmoothQuant)
 * and the weight column j is multiplied by it; then the input is rotated by an orthogonal R at
 * run time and every weight row by the same R at load, which spreads what is left of the
 * outliers over all channels.  For the attention and FFN inputs the division is folded into the
 * norm weights (attn_norm_i8, ffn_norm_i8); for the down projection's input it is folded into
 * the up projection's rows.  V rows are also rotated per head (and Wo's columns to match).  The
 * float reference copies (f_*), attn_norm/ffn_norm and bqkv are the source's.
 */
typedef struct cai_layer_weights
{
	float	   *attn_norm;		/* [d_model] */
	cai_qmatrix wqkv;			/* [(n_heads + 2*n_kv_heads)*head_dim, d_model] */
	cai_qmatrix wq;				/* [n_heads*head_dim, d_model]		rows of wqkv */
	cai_qmatrix wk;				/* [n_kv_heads*head_dim, d_model]	rows of wqkv */
	cai_qmatrix wv;				/* [n_kv_heads*head_dim, d_model]	rows of wqkv */
	cai_qmatrix wo;				/* [d_model, n_heads*head_dim] */
	float	   *bqkv;			/* qwen2 biases [q + k + v widths] or NULL */
	float	   *bq, *bk, *bv;	/* views of bqkv or NULL */
	float	   *bqkv_i8;		/* the int8 path's: bqkv with the V part rotated, or NULL */
	float	   *attn_q_norm;	/* [head_dim] per-head query norm weights (qk_norm) or NULL; */
	float	   *attn_k_norm;	/* the key's: both paths apply them (q, k are unrotated there) */
	float	   *ffn_norm;		/* [d_model] */
	float	   *attn_post_norm;	/* [d_model] norm of the attention output, or NULL */
	float	   *ffn_post_norm;	/* [d_model] norm of the FFN output, or NULL */
	float	   *attn_norm_i8;	/* [d_model] the int8 path's norm weights: the source ones */
	float	   *ffn_norm_i8;	/* divided by the smoothing factors folded into the GEMMs */
	cai_qmatrix w_gate_up;		/* [2*d_ff, d_model]: gate rows, then up rows */
	cai_qmatrix w_gate;			/* [d_ff, d_model]		rows of w_gate_up */
	cai_qmatrix w_up;			/* [d_ff, d_model]		rows of w_gate_up */
	cai_qmatrix w_down;			/* [d_model, d_ff] */
	/* the file's own matrices (the model's file_weights): Q, K, V stacked, gate and up stacked */
	cai_bmatrix file_qkv, file_o, file_gate_up, file_down;
	/* float reference copies of the source weights (NULL unless load_float_reference) */
	float	   *f_wq, *f_wk, *f_wv, *f_wo, *f_gate, *f_up, *f_down;
} cai_layer_weights;

struct cai_model
{
	cai_config	cfg;
	gguf_file  *gguf;
	cai_tokenizer *tokenizer;
	cai_chat_template tmpl;
	cai_qmatrix tok_embd;		/* [n_vocab, d_model], int8 per row */
	cai_qmatrix tok_embd_second_digit;	/* each row's second digit (two-digit activations), or
									 * q == NULL */
	cai_qmatrix lm_head;		/* [n_vocab, d_model] smoothed and rotated (its own when tied) */
	float	   *f_tok_embd;		/* float reference (NULL unless loaded) */
	float	   *f_lm_head;		/* == f_tok_embd when tied */
	float	   *out_norm;		/* [d_model] */
	float	   *out_norm_i8;	/* [d_model] the int8 path's: out_norm / the head's smoothing */
	cai_rotation rot_model;		/* rotations of the int8 path's GEMM inputs: d_model wide, */
	cai_rotation rot_ff;		/* d_ff wide (the down projection's input), */
	cai_rotation rot_head;		/* and head_dim wide (queries, keys, values) */
	float	   *rope_freqs;		/* [n_rot/2] frequency divisors (rope_freqs.weight) or NULL */
	cai_layer_weights *layers;
	int64_t		n_params;
	size_t		weight_bytes;
	uint64_t	fingerprint;
	bool		has_float_reference;
	bool		gptq_rounding;	/* its int8 weights were rounded along the inputs */
	bool		two_digit_activations;	/* the forward's GEMM inputs carry a second digit */
	bool		superblock_activations; /* the file's K-quants' inputs one scale per 256 */
	bool		int8_complete;	/* the int8 weights are converted (a backend may prepare them) */
	bool		file_weights;	/* the GEMMs read the file's own formats (file_* below), and
								 * the int8 matrices are not made */
	cai_bmatrix file_embd;		/* the embedding as the file holds it (file_weights) */
	cai_bmatrix file_head;		/* the LM head (the embedding when tied) */
	bool		gemm_sources_released;	/* cai_model_release_gemm_sources ran */
	uint64_t	content_hash;	/* the file's config, tensors and tokenizer (model_fingerprint.c) */
	struct cai_model_wcache *wcache;	/* the weights cache in use, or NULL (model_wcache.h) */
	void	   *owned;			/* allocations to free (model.c's business) */
};

/* What the engine asks of one sequence in a forward. */
typedef enum cai_logits_mode
{
	CAI_LOGITS_NONE = 0,		/* a prefill chunk that does not end the prompt */
	CAI_LOGITS_LAST,			/* logits of the last new token (decode, end of prefill) */
	CAI_LOGITS_ALL,				/* logits of every new token (scoring) */
	CAI_LOGITS_EMBED			/* the whole text at once (pos 0): its pooled, L2-normalized
								 * final hidden state (cai_config.pooling), attending both
								 * ways when the model is not causal */
} cai_logits_mode;

typedef struct cai_batch_seq
{
	const int32_t *tokens;		/* the new tokens */
	int			n_tokens;
	int			pos;			/* position of tokens[0]; KV for [0, pos) is already in blocks */
	const int32_t *block_table; /* covers positions [0, pos + n_tokens) */
	int			n_blocks;
	cai_logits_mode logits;
} cai_batch_seq;

/*
 * Per-engine scratch for forwards of up to max_tokens tokens in one batch, each sequence at
 * most max_context positions long; everything a forward needs is allocated here (the CPU
 * backend over pool, activations, attention scratch), so a forward does not allocate.  The one
 * exception is the float reference path's KV shadow, grown on first use (see forward_internal.h).
 */
typedef struct cai_forward_ctx cai_forward_ctx;

cai_status	cai_forward_ctx_create(const cai_model *model, cai_threadpool *pool, int max_tokens,
								   int max_context, cai_forward_ctx **out, cai_error *err);
/*
 * The same on a backend made by factory(arg, limits, ...) instead of the CPU backend over pool:
 * the engine passes the CUDA backend's constructor here.  The context owns the backend.
 */
struct cai_backend_limits;
struct cai_backend;
cai_status	cai_forward_ctx_create_on(const cai_model *model,
									  cai_status (*factory) (void *arg,
															 const struct cai_backend_limits *limits,
															 struct cai_backend **out,
															 cai_error *err),
									  void *arg, int max_tokens, int max_context,
									  cai_forward_ctx **out, cai_error *err);

void		cai_forward_ctx_free(cai_forward_ctx *ctx);

/* The backend the context runs on. */
const struct cai_backend *cai_forward_ctx_backend(const cai_forward_ctx *ctx);

/*
 * Copies the first n_rows KV slots of block src into block dst where the context's backend keeps
 * the KV, and forgets dst's float-shadow rows (the reference path recomputes from position 0).
 * CAI_ERR_UNSUPPORTED when the backend cannot copy rows.
 */
cai_status	cai_forward_kv_copy_rows(cai_forward_ctx *ctx, cai_kv_pool *kv, int32_t src,
									 int32_t dst, int n_rows, cai_error *err);

/*
 * Runs the model over the batch, writing the new tokens' K/V into their blocks and the requested
 * logits into logits: rows in sequence order, one per LAST sequence and n_tokens per ALL sequence
 * ([rows, n_vocab]), then one row per EMBED sequence, in sequence order, whose first d_model
 * floats are its embedding (d_model <= n_vocab).  Sequences must be distinct, each with >= 1
 * token.
 *
 * float_reference: the fp32 path over the source weights (unsmoothed, no activation
 * quantization), its attention over a float copy of the KV kept in ctx (the blocks still
 * receive int8 KV).  It needs every earlier position of a sequence computed on the float path
 * by the same ctx (eval and tests score from position 0); otherwise CAI_ERR_INVALID_ARGUMENT.
 */
cai_status	cai_model_forward(const cai_model *model, cai_forward_ctx *ctx, cai_kv_pool *kv,
							  const cai_batch_seq *seqs, int n_seqs, float *logits,
							  bool float_reference, cai_error *err);

/*
 * Recomputes kv_index and n_kv_layers after kv_source was changed (tests share a layer's KV
 * with a later layer this way).  Each kv_source[l] must be <= l and own its KV.
 */
cai_status	cai_config_update_kv_sharing(cai_config *cfg, cai_error *err);

/*
 * Pools n rows of d floats (a text's final hidden states, after the output norm) into out[d]
 * as pooling says (mean, the first row, the last row), then L2-normalizes it in double.
 * Shared by the forward and the unit tests' reference.
 */
void		cai_pool_embedding(const float *rows, int n, int d, cai_pooling pooling, float *out);

/* The KV layout this model needs (for cai_kv_pool_create). */
void		cai_model_kv_layout(const cai_model *model, cai_kv_layout *out);

#endif							/* CAI_MODEL_H */
