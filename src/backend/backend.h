/*
 * backend.h — the compute backend's function table: the heavy operations of the forward pass.
 *
 * forward.c's forward is one readable pass over the layers that calls these operations through a
 * cai_backend; the CPU backend (cpu/backend_cpu.c) implements them with the thread pool and
 * SIMD kernels, a GPU backend implements the same table with its own kernels.  Pointers passed
 * to the operations are backend memory (host memory on the CPU backend): the forward allocates
 * its activations with ops->alloc.  Weights are the backend's too: a forward context has each
 * GEMM operand prepared once in the backend's own layout (prepare_i8) and every other weight
 * array copied where the backend reads it (weight_data), and passes only what those returned
 * (forward_weights.c).  The KV pool is passed as kv.c holds it.
 *
 * Every operation must be deterministic per token: a token's outputs depend only on its own
 * inputs (and, for attention, on its own sequence's KV), never on which other tokens share the
 * batch or how the work is split, so that a sequence's logits are bit-identical alone or batched.
 *
 * Shapes: activations are row-major [n_tok, width]; a "row" is one token.
 */
#ifndef CAI_BACKEND_H
#define CAI_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"
#include "kv.h"
#include "weights.h"

typedef struct cai_backend cai_backend;
struct cai_wcache_writer;
struct cai_wcache_view;

/* The ragged batch as the operations see it (built once per forward by forward.c). */
typedef struct cai_batch_layout
{
	int			n_tokens;		/* T: rows of every activation matrix */
	int			n_seqs;
	const int32_t *token_pos;	/* [T] position of each token in its sequence */
	const int32_t *token_seq;	/* [T] index of each token's sequence */
	const int32_t *seq_start;	/* [n_seqs] the sequence's first row; its rows are contiguous */
	const int32_t *seq_len;		/* [n_seqs] new tokens of the sequence */
	const int32_t *const *block_tables;	/* [n_seqs] block ids covering [0, pos + len) */
} cai_batch_layout;

/* Rotary position embedding of one model. */
typedef struct cai_rope_params
{
	int			n_rot;			/* rotated dimensions of each head (even, <= head_dim) */
	float		base;			/* theta_i = pos * freq_scale * base^(-2i/n_rot) / factor_i */
	float		freq_scale;		/* 1, or 1/factor for linear rope scaling */
	bool		neox;			/* rotate (i, i + n_rot/2) (NEOX) instead of (2i, 2i+1) (NORM) */
	const float *freq_factors;	/* [n_rot/2] divisors of the frequencies (Llama 3), or NULL */
} cai_rope_params;

/* One layer's attention geometry. */
typedef struct cai_attn_params
{
	int			n_heads;
	int			n_kv_heads;		/* each KV head serves n_heads / n_kv_heads query heads (GQA) */
	int			head_dim;
	int			window;			/* 0 = global causal; W = a token sees positions (pos-W, pos] */
	int			kv_layer;		/* index of the KV-owning layer whose blocks hold the keys */
	float		scale;			/* score scale, 1/sqrt(head_dim) */
} cai_attn_params;

/*
 * Attention scores are kept in base-2 units, so that the softmax's exponential is a power of two
 * (cpu/attention.h): every backend scales them by scale * log2(e), this float.
 */
#define CAI_ATTN_LOG2E 1.44269504088896341f

static inline float
cai_attn_score_scale(const cai_attn_params *ap)
{
	return ap->scale * CAI_ATTN_LOG2E;
}

/*
 * An orthogonal transform R of vectors of n floats, applied to activations before they are
 * quantized to int8 (calibrate.c's "rotations" say why).  n = n_pow2 * n_mix, and element i of a
 * vector is (c, j) with i = c * n_pow2 + j:
 *
 *   R = norm * (M kron H):  H the n_pow2 x n_pow2 Sylvester Hadamard matrix (entries +-1),
 *   M = mix, an n_mix x n_mix row-major table (n_mix == 1: M = [1]), norm = 1/sqrt(n).
 *
 * Every backend evaluates it in this order, without fused multiply-adds, so that all give the
 * same bits:
 *   1. per chunk c, for h = 1, 2, 4, ..., n_pow2/2, every pair (i, i + h) with (i & h) == 0:
 *      a = z[i], b = z[i + h]; z[i] = a + b; z[i + h] = a - b  (pairs of a stage are independent);
 *   2. n_mix == 1: y[j] = z[j] * norm; else y[c, j] = acc * norm with
 *      acc = mix[c][0] * z[0, j], then acc = acc + mix[c][c'] * z[c', j] for c' = 1 .. n_mix-1.
 */
typedef struct cai_rotation
{
	int			n;
	int			n_pow2;
	int			n_mix;			/* <= CAI_ROTATION_MAX_MIX */
	const float *mix;			/* [n_mix * n_mix] */
	float		norm;
} cai_rotation;

#define CAI_ROTATION_MAX_MIX 64

/*
 * What a row operation (rmsnorm, rope, swiglu) does next to the rows it has just written, in the
 * same pass: rotates them in place by rot, n_vec consecutive vectors of rot->n floats per row,
 * and when q is not NULL quantizes each row's n_vec * rot->n rotated values per token into
 * q[t * n_vec * rot->n], s[t].  The result is exactly that of the operation followed by
 * rotate(); a NULL continuation does nothing.  (A batch-32 decode step runs ninety of these
 * rotations: done in the pass that wrote the rows, each costs no hand-off and no second trip
 * of the rows through the caches.)
 */
typedef struct cai_then_rotate
{
	const cai_rotation *rot;
	int			n_vec;
	int8_t	   *q;
	float	   *s;
} cai_then_rotate;

/*
 * A float copy of the KV for the reference path, indexed like the int8 pool:
 * data + block * block_floats + kv_layer * layer_floats, then keys [16][n_kv_heads][head_dim]
 * followed by values [16][n_kv_heads][head_dim].  Covers blocks [0, n_blocks).
 */
typedef struct cai_kv_shadow
{
	float	   *data;
	int			n_blocks;
	size_t		layer_floats;	/* 2 * 16 * n_kv_heads * head_dim */
	size_t		block_floats;	/* layer_floats * n_kv_layers */
} cai_kv_shadow;

/* How a decode step runs on a backend that records steps as graphs (step_graph_begin). */
typedef enum cai_step_graph
{
	CAI_STEP_PLAIN,				/* run the step's operations as usual */
	CAI_STEP_CAPTURE,			/* run them: the backend records them, step_graph_end runs them */
	CAI_STEP_REPLAYED			/* the backend ran the whole step: skip the operations */
} cai_step_graph;

typedef struct cai_backend_ops
{
	const char *name;

	/* Frees the instance (cai_backend_free calls this). */
	void		(*destroy) (cai_backend *be);

	/*
	 * Waits for queued work and reports the first failure since the last call (the operations
	 * return nothing, so an asynchronous backend keeps its first error); NULL = never fails.
	 * forward.c calls it at the end of every forward.
	 */
	cai_status	(*sync) (cai_backend *be, cai_error *err);

	/* Activation memory of this backend (64-byte aligned); NULL when out of memory. */
	void	   *(*alloc) (cai_backend *be, size_t bytes);
	void		(*free) (cai_backend *be, void *ptr);

	/*
	 * Weights.  prepare_i8 makes the n row-major matrices src[i] GEMM operands out[i] in this
	 * backend's own layout (the CPU packs panels, a GPU uploads); weight_data returns where this
	 * backend reads the bytes of model memory at host (the CPU: host itself; a GPU: a device
	 * copy made now, the same one for the same host array).  Both run when a forward context is
	 * made, never per forward; what they return lives until the backend is destroyed, and the
	 * model's arrays may be freed once they returned.  On failure they set err (and
	 * weight_data returns NULL).
	 */
	cai_status	(*prepare_i8) (cai_backend *be, const cai_qmatrix *const *src, int n,
							   const cai_weight **out, cai_error *err);
	const void *(*weight_data) (cai_backend *be, const void *host, size_t bytes, cai_error *err);

	/*
	 * x[t, :] = table row ids[t], dequantized (int8 table: q and scale where weight_data put
	 * them) or copied (float table [n, d]).
	 */
	void		(*embed_i8) (cai_backend *be, const cai_qmatrix *table, const int32_t *ids,
							 int n_tok, float *x);
	/*
	 * x[t, :] += table row ids[t] dequantized: the second digits of a two-digit table, each
	 * element (float) q * scale added to the first's.  Optional (two-digit activations).
	 */
	void		(*embed_i8_add) (cai_backend *be, const cai_qmatrix *table, const int32_t *ids,
								 int n_tok, float *x);
	void		(*embed_f32) (cai_backend *be, const float *table, int d, const int32_t *ids,
							  int n_tok, float *x);

	/* dst[i, :] = src[rows[i], :] for i < n_rows; width d. */
	void		(*gather_rows) (cai_backend *be, const float *src, int d, const int32_t *rows,
								int n_rows, float *dst);

	/* out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * w (fp32); then (row stride d). */
	void		(*rmsnorm) (cai_backend *be, const float *x, const float *w, int n_tok, int d,
							float eps, float *out, const cai_then_rotate *then);

	/*
	 * Per-head rmsnorm in place: each of n_heads heads of head_dim at x[t * ldx + h * head_dim]
	 * becomes cai_op_rmsnorm_row(head, w, head_dim, eps), the same w [head_dim] for every head
	 * (the query or key norm of Qwen3 and Gemma 3).
	 */
	void		(*head_rmsnorm) (cai_backend *be, float *x, int ldx, int n_tok, int n_heads,
								 int head_dim, const float *w, float eps);

	/* Per-token int8 quantization of x [n_tok, k]. */
	void		(*quantize) (cai_backend *be, const float *x, int n_tok, int k, int8_t *q,
							 float *s);

	/*
	 * The second digit of x [n_tok, k] quantized to q, s: its rounding error r = x - (float) q
	 * * s per element (a product rounded, then a difference: no fused multiply-add),
	 * quantized per token to q2, s2 by cai_quantize_act_i8's rule.  Optional: a backend
	 * without it cannot run models loaded with two-digit activations (forward.c).
	 */
	void		(*quantize_second_digit) (cai_backend *be, const float *x, int n_tok, int k,
										  const int8_t *q, const float *s, int8_t *q2, float *s2);

	/*
	 * Two-digit activations' sum: y [2 * n_tok, n_out] holds gemm_i8's products (no bias, no
	 * accumulation) of an input's first digit, rows [0, n_tok), then of its second; out[t, o] =
	 * [out +] (y1 + bias), then + y2: the bits of the first digit's GEMM with the bias and the
	 * accumulation followed by the second's accumulated, from one GEMM over both digits (the
	 * weights read once).  Optional: without it the forward runs the GEMM once per digit.
	 */
	void		(*add_digits) (cai_backend *be, const float *y, int n_tok, int n_out,
							   const float *bias, float *out, int ldo, bool accumulate);

	/*
	 * W8A8 GEMM with fused epilogue and its float reference (cpu/gemm.h semantics).  gemm_i8
	 * computes the first n_out channels of the prepared w (all of them, or a multiple of 16:
	 * the query rows of a fused QKV matrix).
	 */
	void		(*gemm_i8) (cai_backend *be, const int8_t *xq, const float *xs, int n_tok,
							const cai_weight *w, int n_out, const float *bias, float *out,
							int ldo, bool accumulate);
	void		(*gemm_f32) (cai_backend *be, const float *x, int n_tok, int k, const float *w,
							 int n_out, const float *bias, float *out, int ldo, bool accumulate);

	/*
	 * The file's own block weights (weights.h's cai_bmatrix; cpu/gemm_blocks.h's semantics).
	 * Optional, all four or none: a backend without them runs a model only with int8 weights.
	 *
	 * prepare_blocks: prepare_i8 for block matrices (repacked once, never requantized).
	 * quantize_blocks: x [n_tok, k] to int8 per block of 32 (with superblocks, per 256 where w
	 *   has a K-quant part: cpu/gemm_blocks.h's super-block activations): q [n_tok, k], s and
	 *   sum [n_tok, k / 32] (each block's scale and the sum of its levels).
	 * gemm_blocks: out[t, o] (=|+=) x[t, :] . W[o, :] (+ bias[o]) from quantize_blocks' output
	 *   for the same w and superblocks, for the first n_out rows of w (a multiple of 8 when
	 *   fewer than all).
	 * embed_blocks: x[t, :] = row ids[t] of table, dequantized exactly.
	 */
	cai_status	(*prepare_blocks) (cai_backend *be, const cai_bmatrix *const *src, int n,
								   const cai_weight **out, cai_error *err);
	void		(*quantize_blocks) (cai_backend *be, const float *x, int n_tok, int k,
									const cai_weight *w, bool superblocks, int8_t *q, float *s,
									int16_t *sum);
	void		(*gemm_blocks) (cai_backend *be, const int8_t *xq, const float *xs,
								const int16_t *xsum, int n_tok, const cai_weight *w,
								bool superblocks, int n_out, const float *bias, float *out,
								int ldo, bool accumulate);
	void		(*embed_blocks) (cai_backend *be, const cai_bmatrix *table, const int32_t *ids,
								 int n_tok, float *x);

	/*
	 * Prepared weights that outlive the process (weight_cache.h).  Optional, both or neither:
	 * a backend without them prepares its weights at every start.
	 *
	 * export_weights: appends what prepare_i8 or prepare_blocks returned for w[0, n) to out, as
	 *   sections of the backend's own: each struct's scalar fields, its memory as one blob and
	 *   where its pointers point in that blob.
	 * import_weights: makes the same weights from in's sections at *cursor (advanced past
	 *   them), each checked against the shape it must have (i8[i], or blocks[i] with i8 NULL);
	 *   they point into in's memory, which must outlive the backend, and copy nothing.  A
	 *   section that does not fit sets err (CAI_ERR_FORMAT) and makes nothing.
	 */
	cai_status	(*export_weights) (cai_backend *be, const cai_weight *const *w, int n,
								   struct cai_wcache_writer *out, cai_error *err);
	cai_status	(*import_weights) (cai_backend *be, const struct cai_wcache_view *in,
								   uint32_t *cursor, const cai_qmatrix *const *i8,
								   const cai_bmatrix *const *blocks, int n,
								   const cai_weight **out, cai_error *err);

	/* cs[t, 2i] = cos(theta_i(pos[t])), cs[t, 2i+1] = sin(...), i < n_rot/2. */
	void		(*rope_prepare) (cai_backend *be, const cai_rope_params *rp, const int32_t *pos,
								 int n_tok, float *cs);

	/* Rotates n_heads heads of head_dim at x[t * ldx + h * head_dim] in place; then (stride ldx). */
	void		(*rope) (cai_backend *be, const cai_rope_params *rp, const float *cs, float *x,
						 int ldx, int n_tok, int n_heads, int head_dim,
						 const cai_then_rotate *then);

	/*
	 * gate_up [n_tok, 2 * d_ff] holds gate then up of each token: h = silu(gate) * up, written
	 * as float (then: rotated and quantized for the down projection; row stride d_ff).
	 */
	void		(*swiglu) (cai_backend *be, const float *gate_up, int n_tok, int d_ff,
						   float *out, const cai_then_rotate *then);

	/*
	 * Operations only some architectures need (forward.c refuses a model that needs one its
	 * backend lacks, NULL):
	 *
	 * geglu: swiglu with gelu (tanh approximation) in place of silu.
	 * rmsnorm_add: x[t, :] += rmsnorm(y[t, :]) * w (row stride d for both).
	 * scale: x[t, :] *= s (row stride d).
	 */
	void		(*geglu) (cai_backend *be, const float *gate_up, int n_tok, int d_ff,
						  float *out, const cai_then_rotate *then);
	void		(*rmsnorm_add) (cai_backend *be, const float *y, const float *w, int n_tok, int d,
								float eps, float *x);
	void		(*scale) (cai_backend *be, float *x, int n_tok, int d, float s);

	/*
	 * Writes the new tokens' keys k[t * ld + h * head_dim] and values v[...] into their slots of
	 * layer ap->kv_layer: int8 with a scale per (token, kv-head), and in float into shadow
	 * when it is not NULL (the reference path).
	 */
	void		(*kv_write) (cai_backend *be, const cai_attn_params *ap,
							 const cai_batch_layout *batch, const float *k, const float *v,
							 int ld, cai_kv_pool *kv, const cai_kv_shadow *shadow);

	/* kv_write and attention take pools of two-digit keys (kv.h) too: two-digit activations */
	bool		two_digit_keys;

	/*
	 * Copies the first n_rows slots of block src into block dst, every KV-owning layer, where
	 * this backend keeps the KV (NULL: the backend cannot, and partial cached blocks are not
	 * reused on it).
	 */
	void		(*kv_copy_rows) (cai_backend *be, cai_kv_pool *kv, int32_t src, int32_t dst,
								 int n_rows);

	/*
	 * Causal (window-limited) GQA attention of every token's query heads q[t * ldq + h * hd]
	 * over positions of its own sequence, reading int8 KV (shadow == NULL) or the float shadow;
	 * writes out[t * ldo + h * hd].
	 */
	void		(*attention) (cai_backend *be, const cai_attn_params *ap,
							  const cai_batch_layout *batch, const float *q, int ldq,
							  cai_kv_pool *kv, const cai_kv_shadow *shadow, float *out,
							  int ldo);

	/*
	 * Rotates n_vec consecutive vectors of rot->n floats at x[t * ldx] of every token in place
	 * (cai_rotation's order).  When q is not NULL, each token's n_vec * rot->n rotated values
	 * are then quantized per token (cai_quantize_act_i8's rule) to q[t * n_vec * rot->n], s[t].
	 */
	void		(*rotate) (cai_backend *be, const cai_rotation *rot, float *x, int ldx,
						   int n_tok, int n_vec, int8_t *q, float *s);

	/*
	 * How many int8 GEMMs so far ran on a slower fallback kernel than the backend's own (the
	 * CUDA backend's dp4a kernel, where cuBLASLt has no int8 kernel for the shape); NULL: the
	 * backend has none.  Reported by pg_stat_cai and cai bench so a slow path is never silent.
	 */
	uint64_t	(*gemm_fallbacks) (const cai_backend *be);

	/*
	 * Optional (NULL: every step runs its operations): a decode step (every sequence one new
	 * token, every row's logits wanted, the int8 path) replayed as a recorded graph.  forward.c
	 * calls it before the step's operations with an owner (the forward context: a recording is
	 * valid for its buffers only), the KV pool, the layout, the token ids and the host logits
	 * [n_tokens][n_vocab].  After CAI_STEP_CAPTURE it runs the operations, then step_graph_end,
	 * which runs what was recorded; false there means the recording failed and nothing ran,
	 * and forward.c runs the operations again, plainly.  sync reports failures as after any step.
	 */
	cai_step_graph (*step_graph_begin) (cai_backend *be, const void *owner, const cai_kv_pool *kv,
										const cai_batch_layout *batch, const int32_t *ids,
										float *logits, int n_vocab);
	bool		(*step_graph_end) (cai_backend *be);
} cai_backend_ops;

/* Sizes a backend instance prepares its scratch for. */
typedef struct cai_backend_limits
{
	int			max_tokens;		/* rows of one forward */
	int			max_context;	/* positions of one sequence */
	int			max_width;		/* widest activation row (d_model, q width, d_ff) */
	int			n_heads;
	int			n_kv_heads;
	int			head_dim;
} cai_backend_limits;

struct cai_backend
{
	const cai_backend_ops *ops;
	void	   *impl;			/* the backend's private state */
};

/* Creates the backend a forward context runs on, sized by limits (see cai_forward_ctx_create_on). */
typedef cai_status (*cai_backend_factory) (void *arg, const cai_backend_limits *limits,
										   cai_backend **out, cai_error *err);

/* The CPU backend over a thread pool (threadpool.h; NULL = run on the caller alone). */
typedef struct cai_threadpool cai_threadpool;
cai_status	cai_backend_cpu_create(cai_threadpool *pool, const cai_backend_limits *limits,
								   cai_backend **out, cai_error *err);
void		cai_backend_free(cai_backend *be);

/*
 * The version of the CPU backend's prepared layouts (its int8 panels and block groups), which a
 * weights cache's key holds: a file of another layout is refused.
 */
uint32_t	cai_backend_cpu_weights_layout(void);

#endif							/* CAI_BACKEND_H */
