/*
 * forward_internal.h — the forward context and the per-layer forward, shared by forward.c and
 * the calibration (calibrate.c), which runs the float path layer by layer; not part of the
 * engine's interface.
 */
#ifndef CAI_FORWARD_INTERNAL_H
#define CAI_FORWARD_INTERNAL_H

#include "model.h"

/*
 * The float KV shadow.  The reference path needs float keys and values, which the int8 blocks
 * cannot give back, so the context keeps a float copy indexed like the pool (block id, layer,
 * slot) and grown on demand to the largest block id a reference forward touches; it is only
 * allocated by reference forwards (eval and tests).  A flag per (block, slot) records which
 * positions hold float KV from a reference forward; int8 forwards clear the flags of the slots
 * they overwrite, and a reference forward refuses a sequence whose earlier positions were not
 * computed on the reference path (cai_engine_score always starts at position 0).
 */
/*
 * One layer's weights where the context's backend reads them (forward_weights.c): its prepared
 * GEMM operands and its other arrays as weight_data gave them; NULL where the model has none.
 */
typedef struct cai_layer_operands
{
	const cai_weight *wqkv;		/* int8 or the file's formats (the model's file_weights); NULL
								 * until the model's int8 weights are complete */
	const cai_weight *wo;
	const cai_weight *w_gate_up;
	const cai_weight *w_down;
	const float *attn_norm, *attn_norm_i8, *ffn_norm, *ffn_norm_i8;
	const float *attn_q_norm, *attn_k_norm, *attn_post_norm, *ffn_post_norm;
	const float *bqkv, *bqkv_i8, *bq, *bk, *bv;
	const float *f_wq, *f_wk, *f_wv, *f_wo, *f_gate, *f_up, *f_down;
} cai_layer_operands;

/* The whole model's weights where the context's backend reads them. */
typedef struct cai_model_operands
{
	cai_layer_operands *layers;	/* [n_layers] */
	bool		int8;			/* the int8 path's operands are prepared */
	bool		file;			/* the file path's (gemm_blocks) are */
	const cai_bmatrix *file_embd;	/* the embedding table as the model holds it */
	const cai_weight *lm_head;
	cai_qmatrix tok_embd;		/* q and scale in backend memory */
	cai_qmatrix tok_embd_second_digit;	/* its second digits, or q == NULL */
	const float *out_norm, *out_norm_i8, *f_tok_embd, *f_lm_head;
	cai_rotation rot_model, rot_ff, rot_head;	/* mix in backend memory */
} cai_model_operands;

struct cai_forward_ctx
{
	const cai_model *model;
	cai_backend *be;
	cai_model_operands w;		/* the model's weights, the backend's copies */
	int			max_tokens;
	int			max_context;
	int			width;			/* max(d_model, q width, d_ff) */
	int			qkv_width;		/* q + k + v row of the fused projection */

	/* the batch, laid out per token */
	int32_t    *ids;			/* [max_tokens] */
	int32_t    *pos;
	int32_t    *seq;
	int32_t    *logit_rows;
	int32_t    *seq_start;		/* [max_tokens] (a sequence has at least one token) */
	int32_t    *seq_len;
	const int32_t **tables;

	/*
	 * Embeddings (CAI_LOGITS_EMBED): the last layer's output rows are the logit rows, then each
	 * embedded sequence's pooled rows; embed_seq[i] is the i-th embedded sequence, its rows
	 * start at output row embed_first[i] and number embed_rows[i].  attn_pos: the position
	 * each token attends up to, its own, or its text's last when the text attends both ways
	 * (bidirectional: some token's differs from its own).
	 */
	int			n_logit_rows;
	int			n_embed;
	int32_t    *embed_seq;		/* [max_tokens] */
	int32_t    *embed_first;
	int32_t    *embed_rows;
	int32_t    *attn_pos;		/* [max_tokens] */
	bool		bidirectional;

	/* activations (backend memory) */
	float	   *x;				/* [T, d_model] the residual stream */
	float	   *xn;				/* [T, width] float activations (reference path) */
	int8_t	   *xq;				/* [T, width] quantized activations (two-digit activations:
								 * [2T, width], an input's second digits after its first) */
	float	   *xs;				/* [T] their scales ([2T]); the file path: [T, width / 32] */
	int16_t    *xsum;			/* the file path: [T, width / 32] sums of each block's levels */
	float	   *digit_out;		/* both digits' GEMM products (backend add_digits), or NULL */
	size_t		digit_out_floats;	/* its size */
	float	   *qkv;			/* [T, qkv_width] */
	float	   *att;			/* [T, n_heads * head_dim] */
	float	   *gate_up;		/* [T, 2 * d_ff] */
	float	   *rope_cs;		/* [T, n_rot] cos/sin per token */
	float	   *rope_cs_windowed;	/* the same for windowed layers with their own RoPE, or NULL */
	float	   *xg;				/* [T, d_model] rows that need logits */

	/* the float KV shadow (reference path only) */
	cai_kv_shadow shadow;
	uint8_t    *shadow_valid;	/* [shadow.n_blocks * 16] */
};

/*
 * The float path's taps: where it shows an observer each GEMM's input, the rows it has just
 * computed (the attention norm's output, the attention output, the FFN norm's output, the
 * activation's output).
 */
typedef enum cai_forward_tap
{
	CAI_TAP_ATTN_IN,			/* [n][d_model] the QKV projections' input */
	CAI_TAP_WO_IN,				/* [n][n_heads * head_dim] the output projection's input */
	CAI_TAP_FFN_IN,				/* [n][d_model] the gate and up projections' input */
	CAI_TAP_DOWN_IN				/* [n][d_ff] the down projection's input */
} cai_forward_tap;

/* Watches the float path's GEMM inputs (the calibration: calibrate.c); tap may not change x. */
typedef struct cai_forward_observer
{
	void		(*tap) (void *arg, cai_forward_tap tap, const float *x, int n_rows, int width);
	void	   *arg;
} cai_forward_observer;

/*
 * Makes the model's weights the backend's (forward_weights.c): every array the model has now,
 * and the int8 path's operands once the model's int8 weights are complete.
 */
cai_status	cai_forward_bind_weights(cai_forward_ctx *ctx, cai_error *err);

/*
 * Binds layer l's float arrays again after the model changed them (the calibration fills the
 * float reference weights layer by layer, after its context was made).
 */
cai_status	cai_forward_bind_layer(cai_forward_ctx *ctx, int l, cai_error *err);

/* Frees what cai_forward_bind_weights allocated on the host (the backend frees its copies). */
void		cai_forward_unbind_weights(cai_forward_ctx *ctx);

/* Checks the batch and lays it out per token; counts the rows that need logits. */
cai_status	cai_forward_layout_batch(const cai_model *model, cai_forward_ctx *ctx, cai_kv_pool *kv,
									 const cai_batch_seq *seqs, int n_seqs, int *n_tokens,
									 int *n_rows, cai_error *err);

/* Reference path bookkeeping: grow the shadow, check and mark which positions it holds. */
cai_status	cai_forward_shadow_prepare(cai_forward_ctx *ctx, cai_kv_pool *kv,
									   const cai_batch_seq *seqs, int n_seqs,
									   bool float_reference, cai_error *err);

/* Fills a batch layout from the context's per-token arrays (after cai_forward_layout_batch). */
void		cai_forward_batch_from_ctx(cai_forward_ctx *ctx, int T, int n_seqs,
									   cai_batch_layout *batch);

/* The rotary embedding of this model's global layers, or (windowed) of its windowed layers. */
void		cai_model_rope_params(const cai_model *model, bool windowed, cai_rope_params *rope);

/*
 * Per forward, after ctx->pos and ctx->x hold the batch's positions and token embeddings:
 * scales the embeddings as the architecture wants and fills the rotary angle tables.
 */
void		cai_forward_prepare(const cai_model *model, cai_forward_ctx *ctx, int n_tok);

/*
 * One transformer layer over the batch's T rows of ctx->x (in place), on the int8 path or the
 * float reference path.  out_rows (the last layer): only those rows' outputs are wanted, in
 * ctx->xg.  obs (float path, may be NULL) sees each GEMM's input (forward.c).
 */
void		cai_forward_layer_int8(const cai_model *model, cai_forward_ctx *ctx, cai_kv_pool *kv,
								   const cai_batch_layout *batch, int l, const int32_t *out_rows,
								   int n_out_rows);
void		cai_forward_layer_file(const cai_model *model, cai_forward_ctx *ctx, cai_kv_pool *kv,
								   const cai_batch_layout *batch, int l, const int32_t *out_rows,
								   int n_out_rows);
void		cai_forward_layer_float(const cai_model *model, cai_forward_ctx *ctx, cai_kv_pool *kv,
									const cai_batch_layout *batch, int l,
									const cai_forward_observer *obs, const int32_t *out_rows,
									int n_out_rows);

#endif							/* CAI_FORWARD_INTERNAL_H */
