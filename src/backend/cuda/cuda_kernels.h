/*
 * cuda_kernels.h — pg_cai's CUDA kernels behind a plain C API (build/libcai_cuda.so).
 *
 * This header is C, includes no CUDA header and no PostgreSQL header, so the engine, the GPU
 * tests and the benchmark (all compiled by gcc) can call it.  The shared object is dlopen()ed by
 * the engine only when pg_cai.device is auto or cuda, so a CPU-only server never loads libcudart.
 *
 * Conventions:
 *   - Every pointer named *_dev is device memory; every call that takes one enqueues work on the
 *     context's compute stream and returns without waiting (unless its comment says otherwise).
 *   - Every call that can fail returns a cai_status and fills err with a lower-case one-line
 *     message; a failed CUDA/cuBLASLt call is CAI_ERR_BACKEND, an exhausted device CAI_ERR_NO_MEMORY.
 *     Nothing here exits or aborts.
 *   - Layouts are the engine's (DESIGN §4, cpu/gemm.h, kv.h): weights int8 row-major [n_out, k] with
 *     a float scale per output channel; activations int8 row-major [n_tok, k] with a float scale
 *     per token; float tensors row-major [n_tok, ld].
 *   - The results are those of the CPU backend: int8 GEMM accumulators are identical integers and
 *     the epilogue is the same float expression in the same order (bit-identical floats); per-token
 *     quantization of identical floats gives identical int8 and scales; kernels that reduce
 *     floats (norms, softmax) differ from the CPU by rounding only (tests/gpu states the bounds).
 */
#ifndef CAI_CUDA_BACKEND_H
#define CAI_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CAI_CUDA_API __attribute__((visibility("default")))
#else
#define CAI_CUDA_API
#endif

/* Sets *err (when not NULL) to status and the formatted message; returns status. */
cai_status	cai_cuda_fail(cai_error *err, cai_status status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* ---------------------------------------------------------------------------------------------
 * Devices and contexts
 * ------------------------------------------------------------------------------------------- */

typedef struct cai_cuda_ctx cai_cuda_ctx;

/*
 * Number of usable CUDA devices; 0 when there is no device, no driver, or the driver is too old
 * for this build (the reason goes to why, if not NULL).
 */
CAI_CUDA_API int cai_cuda_device_count(char *why, size_t why_len);

/*
 * Opens a device: a compute stream, a copy stream for KV transfers, a cuBLASLt handle with an
 * explicit workspace.  Fails with CAI_ERR_UNSUPPORTED on a device older than compute capability
 * 8.0 (no int8 tensor-core GEMM through cuBLASLt's ordinary layouts).
 */
CAI_CUDA_API cai_status cai_cuda_ctx_create(int device, cai_cuda_ctx **out, cai_error *err);
CAI_CUDA_API void cai_cuda_ctx_free(cai_cuda_ctx *ctx);

typedef struct cai_cuda_device_info
{
	int			device;
	char		name[256];		/* "NVIDIA H100 80GB HBM3" */
	int			cc_major;
	int			cc_minor;
	int			sm_count;
	size_t		total_bytes;
	size_t		free_bytes;		/* at the time of the call */
	size_t		l2_bytes;
} cai_cuda_device_info;

CAI_CUDA_API void cai_cuda_get_device_info(cai_cuda_ctx *ctx, cai_cuda_device_info *info);

/* Waits for all work of the context (both streams); reports any asynchronous kernel error. */
CAI_CUDA_API cai_status cai_cuda_sync(cai_cuda_ctx *ctx, cai_error *err);

/* ---------------------------------------------------------------------------------------------
 * Memory
 * ------------------------------------------------------------------------------------------- */

/* Device memory; what names the allocation in the out-of-memory message ("kv cache"). */
CAI_CUDA_API cai_status cai_cuda_malloc(cai_cuda_ctx *ctx, size_t bytes, const char *what,
										void **out_dev, cai_error *err);
CAI_CUDA_API void cai_cuda_free(cai_cuda_ctx *ctx, void *ptr_dev);

/* Page-locked host memory (host prefix-cache blocks, staging), for asynchronous copies. */
CAI_CUDA_API cai_status cai_cuda_host_alloc(cai_cuda_ctx *ctx, size_t bytes, const char *what,
											void **out, cai_error *err);
CAI_CUDA_API void cai_cuda_host_free(cai_cuda_ctx *ctx, void *ptr);

/*
 * Page-locks an existing host range (the engine's host KV pool, allocated by kv.c) so that block
 * copies to and from it are asynchronous DMA; unregister before freeing it.
 */
CAI_CUDA_API cai_status cai_cuda_host_register(cai_cuda_ctx *ctx, void *ptr, size_t bytes,
											   cai_error *err);
CAI_CUDA_API void cai_cuda_host_unregister(cai_cuda_ctx *ctx, void *ptr);

/* Copies on the compute stream.  Asynchronous when the host side is page-locked. */
CAI_CUDA_API cai_status cai_cuda_upload(cai_cuda_ctx *ctx, void *dst_dev, const void *src,
										size_t bytes, cai_error *err);
CAI_CUDA_API cai_status cai_cuda_download(cai_cuda_ctx *ctx, void *dst, const void *src_dev,
										  size_t bytes, cai_error *err);
CAI_CUDA_API cai_status cai_cuda_memset(cai_cuda_ctx *ctx, void *dst_dev, int value, size_t bytes,
										cai_error *err);

/* Device-to-device copy on the compute stream. */
CAI_CUDA_API cai_status cai_cuda_copy_device(cai_cuda_ctx *ctx, void *dst_dev, const void *src_dev,
											 size_t bytes, cai_error *err);

/* Uploads now and waits (model weights at load). */
CAI_CUDA_API cai_status cai_cuda_upload_sync(cai_cuda_ctx *ctx, void *dst_dev, const void *src,
											 size_t bytes, cai_error *err);

/* Fills n int8 values with a seeded pseudo-random pattern in [-127, 127] (benchmarks, tests). */
CAI_CUDA_API cai_status cai_cuda_fill_random_i8(cai_cuda_ctx *ctx, int8_t *dst_dev, size_t n,
												uint64_t seed, cai_error *err);

/* Fills n floats with lo + (hi - lo) * u, u a seeded pseudo-random value in [0, 1). */
CAI_CUDA_API cai_status cai_cuda_fill_random_f32(cai_cuda_ctx *ctx, float *dst_dev, size_t n,
												 float lo, float hi, uint64_t seed,
												 cai_error *err);

/* ---------------------------------------------------------------------------------------------
 * KV transfers between host blocks and device blocks (their own stream, ordered by events)
 *
 * The device KV pool has the layout of kv.h: block b starts at pool_dev + b * block_bytes.
 * Uploads (cached prefixes into device blocks) run on the copy stream and the compute stream
 * waits for them before its next kernel.  Downloads (new blocks into the host cache) first wait
 * for the compute work enqueued so far, then copy; the host reads a downloaded block only after
 * cai_cuda_transfer_wait (or cai_cuda_transfer_done) on the ticket returned.
 * ------------------------------------------------------------------------------------------- */

CAI_CUDA_API cai_status cai_cuda_kv_upload_blocks(cai_cuda_ctx *ctx, uint8_t *pool_dev,
												  size_t block_bytes, const int32_t *dev_blocks,
												  const void *const *host_blocks, int n_blocks,
												  uint64_t *ticket, cai_error *err);
CAI_CUDA_API cai_status cai_cuda_kv_download_blocks(cai_cuda_ctx *ctx, const uint8_t *pool_dev,
													size_t block_bytes, const int32_t *dev_blocks,
													void *const *host_blocks, int n_blocks,
													uint64_t *ticket, cai_error *err);
/* True when the transfer with this ticket (and every earlier one) has completed. */
CAI_CUDA_API bool cai_cuda_transfer_done(cai_cuda_ctx *ctx, uint64_t ticket);
CAI_CUDA_API cai_status cai_cuda_transfer_wait(cai_cuda_ctx *ctx, uint64_t ticket, cai_error *err);

/* ---------------------------------------------------------------------------------------------
 * GEMMs (cuBLASLt)
 * ------------------------------------------------------------------------------------------- */

/* A device int8 weight matrix; see cai_cuda_qmatrix_upload. */
typedef struct cai_cuda_qmatrix
{
	int			n_out;			/* output channels */
	int			n_out_padded;	/* rows allocated: n_out rounded up to 4 (cuBLASLt int8 wants m % 4 == 0) */
	int			k;				/* input features, a multiple of 4 */
	int8_t	   *q_dev;			/* [n_out_padded, k]; padding rows are zeros */
	float	   *scale_dev;		/* [n_out_padded]; padding scales are zeros */
} cai_cuda_qmatrix;

/* Copies a host int8 matrix (q [n_out, k], scale [n_out]) to the device. */
CAI_CUDA_API cai_status cai_cuda_qmatrix_upload(cai_cuda_ctx *ctx, const int8_t *q,
												const float *scale, int n_out, int k,
												const char *what, cai_cuda_qmatrix *out,
												cai_error *err);
/* Allocates one and fills it with seeded random values (benchmarks: no file needed). */
CAI_CUDA_API cai_status cai_cuda_qmatrix_random(cai_cuda_ctx *ctx, int n_out, int k,
												uint64_t seed, const char *what,
												cai_cuda_qmatrix *out, cai_error *err);
CAI_CUDA_API void cai_cuda_qmatrix_free(cai_cuda_ctx *ctx, cai_cuda_qmatrix *m);

typedef enum cai_cuda_activation
{
	CAI_CUDA_ACT_NONE = 0,
	CAI_CUDA_ACT_SILU			/* x / (1 + exp(-x)), with ops.h's polynomial exp */
} cai_cuda_activation;

/*
 * What the fused epilogue does after the int32 product, per element, in this order:
 *   v = ((float) acc * xs[t]) * ws[o];   v = v + bias[o];   v = act(v);   out = v  or  out + v
 * (without an activation, exactly the CPU epilogue of cpu/gemm.c, each operation rounded, no
 * fused multiply-add), then, when q_out is set, per-token int8 quantization of each whole output
 * row as stored (q_out [n_tok, n_out], s_out [n_tok]) for the next GEMM, identical to
 * cai_quantize_act_i8 of those floats.
 */
typedef struct cai_cuda_epilogue
{
	const float *bias_dev;		/* [n_out] or NULL */
	bool		accumulate;		/* out += v (the residual stream) */
	cai_cuda_activation activation;
	int8_t	   *q_out_dev;		/* [n_tok, n_out] or NULL */
	float	   *s_out_dev;		/* [n_tok] (with q_out) */
} cai_cuda_epilogue;

/*
 * out[t, o] for t < n_tok, o < w->n_out (row stride ldo floats) from xq [n_tok, w->k] int8 and
 * xs [n_tok]: one cuBLASLt int8 GEMM into an int32 scratch, then one epilogue kernel.
 * epi may be NULL (store, no bias).  out_dev may be NULL when only q_out is wanted.
 */
CAI_CUDA_API cai_status cai_cuda_gemm_i8(cai_cuda_ctx *ctx, const int8_t *xq_dev,
										 const float *xs_dev, int n_tok,
										 const cai_cuda_qmatrix *w, float *out_dev, int ldo,
										 const cai_cuda_epilogue *epi, cai_error *err);

/*
 * The int32 product alone: acc[t, o] = sum_i xq[t, i] * w.q[o, i], row stride ldacc int32
 * (ldacc >= w->n_out_padded, a multiple of 4).  Tests compare it with the CPU integer by integer.
 */
CAI_CUDA_API cai_status cai_cuda_gemm_i8_acc(cai_cuda_ctx *ctx, const int8_t *xq_dev, int n_tok,
											 const cai_cuda_qmatrix *w, int32_t *acc_dev,
											 int ldacc, cai_error *err);

/*
 * int8 GEMMs that ran on the dp4a fallback kernel (cuBLASLt had no int8 kernel for their shape
 * and alignments) since the context was created; each shape is also reported once on stderr.
 */
CAI_CUDA_API uint64_t cai_cuda_gemm_fallback_count(const cai_cuda_ctx *ctx);

/*
 * The file's own block weights on the device (gemm_blocks.cu): levels as nibbles (Q4_0, Q4_1,
 * Q4_K: [n_out][k / 32][16], byte j = element j low, element j + 16 high) or signed bytes (Q5_x,
 * Q6_K, Q8_0: [n_out][k / 32][32]), and per row and block a float pair sc: (scale, min), a
 * weight being scale * level + min, or with split16 (Q6_K) (scale of inputs 0..15, of 16..31).
 */
typedef struct cai_cuda_bmatrix
{
	int			n_out;
	int			k;				/* a multiple of 32 */
	bool		nibble;
	bool		split16;
	uint8_t    *q_dev;
	float	   *sc_dev;			/* [n_out][k / 32][2] */
} cai_cuda_bmatrix;

/* The same on the host, as blocks_pack.c repacks a GGUF tensor (q and sc one allocation each). */
typedef struct cai_cuda_bmatrix_host
{
	int			n_out;
	int			k;
	bool		nibble;
	bool		split16;
	int			act_group;		/* blocks of 32 one activation scale spans in its GEMM: the
								 * format's own block (a K-quant's 256: 8), as on the CPU */
	uint8_t    *q;
	float	   *sc;
	size_t		q_bytes;
	size_t		sc_bytes;
	size_t		source_bytes;	/* of the tensor rows it was repacked from */
} cai_cuda_bmatrix_host;

/*
 * Repacks rows [0, rows) of a tensor of GGUF type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
 * Q6_K; rows of k elements, back to back) into out.  A scale that is not a finite number, a k
 * that is not a whole number of blocks or another type is refused.
 */
CAI_CUDA_API cai_status cai_cuda_bmatrix_pack(int type, const void *data, int rows, int k,
											  cai_cuda_bmatrix_host *out, cai_error *err);
CAI_CUDA_API void cai_cuda_bmatrix_host_free(cai_cuda_bmatrix_host *m);

/* Copies a repacked matrix to the device (freed by cai_cuda_bmatrix_free). */
CAI_CUDA_API cai_status cai_cuda_bmatrix_upload(cai_cuda_ctx *ctx, const cai_cuda_bmatrix_host *h,
												const char *what, cai_cuda_bmatrix *out,
												cai_error *err);
CAI_CUDA_API void cai_cuda_bmatrix_free(cai_cuda_ctx *ctx, cai_cuda_bmatrix *m);

/*
 * Int8 quantization of x [n_tok, k] with one scale per `group` blocks of 32 (1, or 8 for the
 * K-quants): cai_quantize_act_blocks' bits (q, s, sum).
 */
CAI_CUDA_API cai_status cai_cuda_quantize_blocks(cai_cuda_ctx *ctx, const float *x_dev, int n_tok,
												 int k, int group, int8_t *q_dev, float *s_dev,
												 int16_t *sum_dev, cai_error *err);

/* Which kernel a block GEMM runs: by n_tok (the GEMV up to 8 tokens), or one named (tests). */
typedef enum cai_cuda_blocks_path
{
	CAI_CUDA_BLOCKS_AUTO = 0,
	CAI_CUDA_BLOCKS_GEMV,		/* dp4a over the nibbles; n_tok <= 8 */
	CAI_CUDA_BLOCKS_MMA			/* int8 tensor cores over tiles widened in shared memory */
} cai_cuda_blocks_path;

/*
 * out[t, o] (=|+=) x[t, :] . W[o, :] (+ bias[o]) for o < n_out <= w->n_out from xq [n_tok, k]
 * (16-byte aligned), xs and xsum [n_tok, k / 32] (cai_cuda_quantize_blocks).  Per block:
 * sa * (scale * isum + min * asum) in float, accumulated over the blocks.
 */
CAI_CUDA_API cai_status cai_cuda_gemm_blocks(cai_cuda_ctx *ctx, const int8_t *xq_dev,
											 const float *xs_dev, const int16_t *xsum_dev,
											 int n_tok, const cai_cuda_bmatrix *w, int n_out,
											 const float *bias_dev, float *out_dev, int ldo,
											 bool accumulate, cai_cuda_blocks_path path,
											 cai_error *err);

/* x[t, :] = row ids[t] of table dequantized (scale * level + min: the CPU's weight exactly). */
CAI_CUDA_API cai_status cai_cuda_embed_blocks(cai_cuda_ctx *ctx, const cai_cuda_bmatrix *table,
											  const int32_t *ids_dev, int n_tok, float *x_dev,
											  cai_error *err);

/*
 * Float reference GEMM (fp32 compute, no TF32): out[t, o] (=|+=) sum_i x[t, i] * w[o, i]
 * (+ bias[o]); w row-major [n_out, k].
 */
CAI_CUDA_API cai_status cai_cuda_gemm_f32(cai_cuda_ctx *ctx, const float *x_dev, int n_tok, int k,
										  const float *w_dev, int n_out, const float *bias_dev,
										  float *out_dev, int ldo, bool accumulate,
										  cai_error *err);

/* ---------------------------------------------------------------------------------------------
 * Per-token kernels (each the CPU's cpu/ops.c or cpu/gemm.c arithmetic, operation for operation)
 * ------------------------------------------------------------------------------------------- */

/* cai_quantize_act_i8 on the device: q [n_tok, k], s [n_tok]; x row stride ldx. */
CAI_CUDA_API cai_status cai_cuda_quantize_act(cai_cuda_ctx *ctx, const float *x_dev, int n_tok,
											  int k, int ldx, int8_t *q_dev, float *s_dev,
											  cai_error *err);

/* backend.h's quantize_second_digit on the device: x [n_tok, k] and its first digit q1, s1. */
CAI_CUDA_API cai_status cai_cuda_quantize_second_digit(cai_cuda_ctx *ctx, const float *x_dev,
													   int n_tok, int k, const int8_t *q1_dev,
													   const float *s1_dev, int8_t *q_dev,
													   float *s_dev, cai_error *err);

/*
 * cai_op_rmsnorm_row per token: y = (x * inv) * w, inv = 1 / sqrt(sum(x^2) / d + eps), the sum of
 * squares taken with ops.h's eight-partial-sum rule (partial i % 8 in order, the fixed tree, then
 * the tail), so the result is bit-identical to the CPU's.  Writes y to y_dev when not NULL and its
 * per-token int8 quantization to q_dev/s_dev when q_dev is not NULL.
 */
CAI_CUDA_API cai_status cai_cuda_rmsnorm(cai_cuda_ctx *ctx, const float *x_dev, const float *w_dev,
										 int n_tok, int d, float eps, float *y_dev,
										 int8_t *q_dev, float *s_dev, cai_error *err);

/*
 * cai_op_rmsnorm_add_row per token (backend.h's rmsnorm_add, Gemma 3's sublayer output norms):
 * x += (y * inv) * w, inv as cai_cuda_rmsnorm's, every operation rounded; bit-identical to the
 * CPU's.  x_dev and y_dev [n_tok, d] must not overlap.
 */
CAI_CUDA_API cai_status cai_cuda_rmsnorm_add(cai_cuda_ctx *ctx, const float *y_dev,
											 const float *w_dev, int n_tok, int d, float eps,
											 float *x_dev, cai_error *err);

/*
 * cai_op_rmsnorm_row in place on each of n_heads heads of head_dim at x[t * ldx + h * head_dim],
 * with the same weights w [head_dim] for every head (backend.h's head_rmsnorm); bit-identical to
 * the CPU's.
 */
CAI_CUDA_API cai_status cai_cuda_head_rmsnorm(cai_cuda_ctx *ctx, float *x_dev, int ldx, int n_tok,
											  int n_heads, int head_dim, const float *w_dev,
											  float eps, cai_error *err);

/*
 * Rotary angles: cs[t, 2i] = table[pos[t], 2i] (cos), cs[t, 2i + 1] (sin), i < n_rot / 2, from a
 * per-position table [n_pos, n_rot] the caller built with the CPU's own arithmetic
 * (cai_op_rope_angles); positions outside [0, n_pos) get the identity rotation.
 */
CAI_CUDA_API cai_status cai_cuda_rope_gather(cai_cuda_ctx *ctx, const float *table_dev, int n_pos,
											 int n_rot, const int32_t *pos_dev, int n_tok,
											 float *cs_dev, cai_error *err);

/*
 * Builds such a table on the device: theta = pos * freq_scale * base^(-2i / n_rot) in double
 * precision (no frequency factors).  Benchmarks use it; the engine uploads the host-built table.
 */
CAI_CUDA_API cai_status cai_cuda_rope_table(cai_cuda_ctx *ctx, float *table_dev, int n_pos,
											int n_rot, double base, double freq_scale,
											cai_error *err);

/*
 * cai_op_rope_row per token: rotates the first n_rot dimensions of each of n_heads heads of
 * head_dim at x[t * ldx + h * head_dim], pairs (2i, 2i+1), or (i, i + n_rot/2) when neox, by the
 * angles in cs [n_tok, n_rot]: x0' = x0 c - x1 s, x1' = x0 s + x1 c, every product rounded.
 */
CAI_CUDA_API cai_status cai_cuda_rope(cai_cuda_ctx *ctx, const float *cs_dev, float *x_dev, int ldx,
									  int n_tok, int n_heads, int head_dim, int n_rot, bool neox,
									  cai_error *err);

/*
 * SwiGLU over gate_up [n_tok, 2 * d_ff] (gate then up per token): h = silu(g) * u with
 * cai_op_swiglu_row's arithmetic (its polynomial exp); h to h_dev [n_tok, d_ff] when not NULL,
 * its per-token quantization to q_dev/s_dev when q_dev is not NULL.
 */
CAI_CUDA_API cai_status cai_cuda_swiglu(cai_cuda_ctx *ctx, const float *gate_up_dev, int n_tok,
										int d_ff, float *h_dev, int8_t *q_dev, float *s_dev,
										cai_error *err);

/*
 * GeGLU, the same way: h = gelu(g) * u with cai_op_geglu_row's arithmetic (gelu's tanh
 * approximation as g * sigmoid(z), through the same polynomial exp).
 */
CAI_CUDA_API cai_status cai_cuda_geglu(cai_cuda_ctx *ctx, const float *gate_up_dev, int n_tok,
									   int d_ff, float *h_dev, int8_t *q_dev, float *s_dev,
									   cai_error *err);

/*
 * backend.h's cai_rotation on the device: vectors of n = n_pow2 * n_mix floats, element
 * c * n_pow2 + j of a vector being (chunk c, j); mix_dev the [n_mix, n_mix] table (NULL when
 * n_mix == 1); norm = 1/sqrt(n).
 */
typedef struct cai_cuda_rotation
{
	int			n;
	int			n_pow2;			/* a power of two */
	int			n_mix;
	const float *mix_dev;
	float		norm;
} cai_cuda_rotation;

/*
 * cai_op_rotate_vec on each of the n_vec consecutive vectors at x[t * ldx] of every token, in
 * place and in backend.h's order (butterflies of growing span per chunk, then the mix summed in
 * chunk order, then the norm; every operation rounded, no contraction), so the floats are the
 * CPU's bit for bit.  When q_dev is not NULL, each token's n_vec * n rotated values are then
 * quantized as cai_quantize_act_i8 does to q [n_tok, n_vec * n], s [n_tok].
 */
CAI_CUDA_API cai_status cai_cuda_rotate(cai_cuda_ctx *ctx, const cai_cuda_rotation *rot,
										float *x_dev, int ldx, int n_tok, int n_vec,
										int8_t *q_dev, float *s_dev, cai_error *err);

/* x[t, :] = q[ids[t], :] * scale[ids[t]] (the int8 table); ids outside the table give zeros. */
CAI_CUDA_API cai_status cai_cuda_embed_i8(cai_cuda_ctx *ctx, const cai_cuda_qmatrix *table,
										  const int32_t *ids_dev, int n_tok, float *x_dev,
										  cai_error *err);
/* x[t, :] += the same (a two-digit table's second digits); ids outside the table add nothing. */
CAI_CUDA_API cai_status cai_cuda_embed_i8_add(cai_cuda_ctx *ctx, const cai_cuda_qmatrix *table,
											  const int32_t *ids_dev, int n_tok, float *x_dev,
											  cai_error *err);

/* x[t, :] *= s, each product rounded as cpu_scale's (Gemma 3's embeddings times sqrt(d)). */
CAI_CUDA_API cai_status cai_cuda_scale(cai_cuda_ctx *ctx, float *x_dev, int n_tok, int d, float s,
									   cai_error *err);

/* x[t, :] = table[ids[t], :] for a float table [n_rows, d]. */
CAI_CUDA_API cai_status cai_cuda_embed_f32(cai_cuda_ctx *ctx, const float *table_dev, int n_rows,
										   int d, const int32_t *ids_dev, int n_tok, float *x_dev,
										   cai_error *err);

/* dst[i, :] = src[rows[i], :], width d. */
CAI_CUDA_API cai_status cai_cuda_gather_rows(cai_cuda_ctx *ctx, const float *src_dev, int d,
											 const int32_t *rows_dev, int n_rows, float *dst_dev,
											 cai_error *err);

/* Argmax per row of logits [n_rows, ld] over n_vocab (lowest id wins ties, like cai_sample). */
CAI_CUDA_API cai_status cai_cuda_argmax(cai_cuda_ctx *ctx, const float *logits_dev, int n_rows,
										int n_vocab, int ld, int32_t *ids_dev, cai_error *err);

/*
 * The k largest logits of each row in descending order (ties: lower id first), k <= 64:
 * vals [n_rows, k], ids [n_rows, k].  With them the host applies top-k sampling to a short list
 * instead of downloading a whole vocabulary of logits per sequence.
 */
CAI_CUDA_API cai_status cai_cuda_topk(cai_cuda_ctx *ctx, const float *logits_dev, int n_rows,
									  int n_vocab, int ld, int k, float *vals_dev,
									  int32_t *ids_dev, cai_error *err);

/* ---------------------------------------------------------------------------------------------
 * The paged int8 KV cache and attention
 * ------------------------------------------------------------------------------------------- */

#define CAI_CUDA_KV_BLOCK_TOKENS 16
#define CAI_CUDA_KEY_DIGIT_BASE 254	/* kv.h's CAI_KV_KEY_DIGIT_BASE */

/* The device KV pool; one block has kv.h's layout, layer part at kv_layer * layer_bytes. */
typedef struct cai_cuda_kv
{
	uint8_t    *pool_dev;
	int			n_blocks;
	size_t		block_bytes;
	size_t		layer_bytes;
	int			n_kv_heads;
	int			head_dim;		/* 64, 128 or 256 */
	int			key_digits;		/* 2: kv.h's two-digit keys (the k2 plane after the scales) */
} cai_cuda_kv;

/*
 * The float KV of the reference path on the device, indexed like backend.h's cai_kv_shadow:
 * data + block * block_floats + kv_layer * layer_floats, keys [16][n_kv_heads][head_dim] then
 * values.
 */
typedef struct cai_cuda_kv_shadow
{
	float	   *data_dev;
	int			n_blocks;
	size_t		layer_floats;
	size_t		block_floats;
} cai_cuda_kv_shadow;

/* True when the attention kernels support this head_dim (64, 128, 256). */
CAI_CUDA_API bool cai_cuda_attention_supports(int head_dim);

/* One sequence of a ragged batch, as the host knows it (host pointers). */
typedef struct cai_cuda_seq_desc
{
	int			n_new;			/* new tokens in this step */
	int			pos;			/* position of the first new token */
	const int32_t *block_table; /* block ids covering [0, pos + n_new) */
	int			n_blocks;
} cai_cuda_seq_desc;

/*
 * A step's metadata, in fixed device buffers owned by the context (so that a captured CUDA graph
 * reads the current step's values): per token its position and KV slot (block * 16 + offset, -1
 * for padding rows), per sequence its rows and block table, and the attention work list (one item
 * per tile of query rows of one sequence, times the KV heads).  Built on the host by
 * cai_cuda_step_plan, uploaded with one copy, valid until the next plan.
 */
typedef struct cai_cuda_step_meta
{
	int			n_tok;			/* rows, padding included */
	int			n_seqs;
	int			n_items;		/* attention tiles */
	int			group;			/* query heads per KV head */
	int			tile_rows;		/* query rows per tile */
	const int32_t *positions_dev;	/* [n_tok] */
	const int32_t *slots_dev;	/* [n_tok] */
	const int32_t *tokens_dev;	/* [n_tok] (when tokens were given to the plan) */
	const void *seqs_dev;		/* internal: per-sequence records */
	const void *items_dev;		/* internal: attention tiles */
	const int32_t *counts_dev;	/* internal: n_tok, n_seqs, n_items on the device */
	int			grid_items;		/* grid size the attention kernel launches with */
	int			max_item_rows;	/* query rows of the largest tile */
	int			need_segments;	/* segments (cpu/attention.h) the longest row reaches */
	int			max_segments;	/* segments a split attention launches: need_segments, or in a
								 * plan for a graph that rounded up to a power of two */
} cai_cuda_step_meta;

/*
 * Plans a step: rows of sequence i follow those of sequence i - 1 in the activations (no padding
 * between them); n_tok_padded >= the sum of n_new adds padding rows at the end (a graph replays a
 * fixed batch-size bucket); tokens (host, one id per new token) may be NULL.  head_dim sizes the
 * tiles.  for_graph: the attention grid is a bound for every plan of n_tok_padded rows (unchanged
 * from step to step, surplus blocks return at once) instead of the exact count, and the split
 * attention's segments round up to a power of two, so that a captured graph stays valid while
 * the context grows (cai_cuda_graph_launch refuses a plan the graph does not cover).  Fails if a
 * block table does not cover its sequence.
 */
CAI_CUDA_API cai_status cai_cuda_step_plan(cai_cuda_ctx *ctx, const cai_cuda_seq_desc *seqs,
										   int n_seqs, const int32_t *tokens, int n_tok_padded,
										   int n_heads, int n_kv_heads, int head_dim,
										   bool for_graph, const cai_cuda_step_meta **meta,
										   cai_error *err);

/*
 * Reserves the plan buffers for steps of up to max_tokens rows, max_seqs sequences and
 * max_blocks_per_seq blocks each, so that no allocation happens while a graph is captured.
 */
CAI_CUDA_API cai_status cai_cuda_step_reserve(cai_cuda_ctx *ctx, int max_tokens, int max_seqs,
											  int max_blocks_per_seq, int n_heads,
											  int n_kv_heads, int head_dim, cai_error *err);

/*
 * The CPU's kv_write: quantizes the new tokens' keys and values (k_dev, v_dev rows of stride ld,
 * head h at h * head_dim) per (token, kv head) with cai_op_quantize_vec_i8's rule and stores them
 * in their slots of KV-owning layer kv_layer; with shadow, also stores the floats there.  Rows
 * whose slot is -1 (padding) are skipped.
 */
CAI_CUDA_API cai_status cai_cuda_kv_write(cai_cuda_ctx *ctx, const cai_cuda_kv *kv, int kv_layer,
										  const cai_cuda_step_meta *meta, const float *k_dev,
										  const float *v_dev, int ld,
										  const cai_cuda_kv_shadow *shadow, cai_error *err);

/*
 * Causal attention of every new token over its own sequence's paged KV (its own K/V written
 * first), cpu/attention.c's arithmetic exactly: for query head h of a token at position p, the
 * positions lo = max(0, p - window + 1) (window 0: lo = 0) through p; the query quantized to int8
 * per head, exact int32 scores times (q_scale * scale * k_scale), scale in base-2 units (backend.h's
 * cai_attn_score_scale), the row maximum subtracted, the polynomial exp2, the
 * sixteen-partial-sum total, and values accumulated in ascending position order.  With shadow, the float reference path (float query times scale, eight-partial-sum dot
 * products, float values).  q [n_tok, n_heads * head_dim] (row stride ldq), out likewise (ldo).
 * Every query head of one KV head is in one block, sharing each K/V load (GQA/MQA).
 */
CAI_CUDA_API cai_status cai_cuda_attention(cai_cuda_ctx *ctx, const cai_cuda_kv *kv, int kv_layer,
										   const cai_cuda_step_meta *meta, const float *q_dev,
										   int ldq, float *out_dev, int ldo, int n_heads,
										   int window, float scale,
										   const cai_cuda_kv_shadow *shadow, cai_error *err);

/*
 * Reserves the scratch a split attention of this plan needs (its per-segment partials), so that
 * a graph captured next can split: a capture cannot allocate.
 */
CAI_CUDA_API cai_status cai_cuda_attention_reserve(cai_cuda_ctx *ctx,
												   const cai_cuda_step_meta *meta,
												   int n_kv_heads, int head_dim, cai_error *err);

/* ---------------------------------------------------------------------------------------------
 * CUDA graphs (the decode step per batch-size bucket)
 * ------------------------------------------------------------------------------------------- */

/*
 * Begins capturing the compute stream.  Everything enqueued until cai_cuda_graph_end is recorded
 * instead of run.  Allocations are refused during a capture: reserve first.
 */
CAI_CUDA_API cai_status cai_cuda_graph_begin(cai_cuda_ctx *ctx, cai_error *err);

/* Ends the capture and stores the instantiated graph under key (replacing any). */
CAI_CUDA_API cai_status cai_cuda_graph_end(cai_cuda_ctx *ctx, int key, cai_error *err);

/* Abandons a capture after a failure (the stream is usable again). */
CAI_CUDA_API void cai_cuda_graph_abort(cai_cuda_ctx *ctx);

/* True when a graph is stored under key and can replay the current step plan. */
CAI_CUDA_API bool cai_cuda_graph_has(cai_cuda_ctx *ctx, int key);

/* Launches the graph stored under key on the compute stream. */
CAI_CUDA_API cai_status cai_cuda_graph_launch(cai_cuda_ctx *ctx, int key, cai_error *err);

/* Drops every stored graph (after weights or buffers move). */
CAI_CUDA_API void cai_cuda_graph_reset(cai_cuda_ctx *ctx);

/* The batch-size bucket a step of n_tok rows is padded to for graph replay (0: too large). */
CAI_CUDA_API int cai_cuda_graph_bucket(int n_tok);

/* ---------------------------------------------------------------------------------------------
 * Micro-benchmarks (tests/bench): device-time of copies and GEMMs
 * ------------------------------------------------------------------------------------------- */

/* Median device-to-device copy bandwidth over reps copies of bytes (read + written bytes / s). */
CAI_CUDA_API cai_status cai_cuda_measure_copy_bandwidth(cai_cuda_ctx *ctx, size_t bytes, int reps,
														double *bytes_per_s, cai_error *err);

/*
 * Median time of one int8 GEMM through the same path as cai_cuda_gemm_i8_acc: a weight of m
 * output rows and k inputs applied to n tokens.
 */
CAI_CUDA_API cai_status cai_cuda_measure_gemm_i8(cai_cuda_ctx *ctx, int m, int n, int k, int reps,
												 double *seconds, cai_error *err);

/* Device timers on the compute stream (events). */
typedef struct cai_cuda_timer cai_cuda_timer;

CAI_CUDA_API cai_status cai_cuda_timer_create(cai_cuda_ctx *ctx, cai_cuda_timer **out,
											  cai_error *err);
CAI_CUDA_API void cai_cuda_timer_free(cai_cuda_timer *timer);
CAI_CUDA_API cai_status cai_cuda_timer_start(cai_cuda_ctx *ctx, cai_cuda_timer *timer,
											 cai_error *err);
/* Records the end, waits for it, and returns the device time between start and stop. */
CAI_CUDA_API cai_status cai_cuda_timer_stop(cai_cuda_ctx *ctx, cai_cuda_timer *timer,
											double *seconds, cai_error *err);

#ifdef __cplusplus
}
#endif

#endif							/* CAI_CUDA_BACKEND_H */
