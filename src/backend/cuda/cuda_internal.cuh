/*
 * cuda_internal.cuh — what the kernels' translation units share: the context structure, error
 * helpers that turn CUDA/cuBLASLt failures into a cai_status with a message, and small device
 * helpers (warp and block reductions, the engine's int8 quantization rule).
 *
 * Not installed and not included by the engine: only the kernels' .cu files include it.
 */
#ifndef CAI_CUDA_INTERNAL_CUH
#define CAI_CUDA_INTERNAL_CUH

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_kernels.h"

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

/* Formats err and returns status (libcai_cuda.so links nothing of libcai, so not cai_fail). */
cai_status	cuda_fail(cai_error *err, cai_status status, const char *fmt, ...)
			__attribute__((format(printf, 3, 4)));

/* A failed runtime call: CAI_ERR_NO_MEMORY for allocation failures, else CAI_ERR_BACKEND. */
cai_status	cuda_fail_rt(cai_error *err, cudaError_t code, const char *what);

/* A failed cuBLASLt call. */
cai_status	cuda_fail_lt(cai_error *err, cublasStatus_t code, const char *what);

#define CUDA_CHECK(call, err, what) \
	do { \
		cudaError_t cuda_check_rc_ = (call); \
		if (cuda_check_rc_ != cudaSuccess) \
			return cuda_fail_rt((err), cuda_check_rc_, (what)); \
	} while (0)

#define LT_CHECK(call, err, what) \
	do { \
		cublasStatus_t lt_check_rc_ = (call); \
		if (lt_check_rc_ != CUBLAS_STATUS_SUCCESS) \
			return cuda_fail_lt((err), lt_check_rc_, (what)); \
	} while (0)

/* After a kernel launch: a bad configuration or an earlier asynchronous fault shows here. */
#define CUDA_CHECK_LAUNCH(err, what) CUDA_CHECK(cudaGetLastError(), (err), (what))

/* ---------------------------------------------------------------------------------------------
 * The context
 * ------------------------------------------------------------------------------------------- */

/* One cached cuBLASLt algorithm choice for an int8 or float GEMM shape (see gemm_lt.cu). */
typedef struct gemm_algo_entry
{
	int			kind;			/* 0 int8, 1 float (with/without bias, accumulate) */
	int			m;
	int			n;				/* the batch-size bucket or the exact n */
	int			k;
	int			flags;			/* bias/accumulate bits, exactness */
	int			ldc;			/* the output's leading dimension */
	int			align;			/* the operands' alignments (gemm_lt.cu's alignment_key) */
	bool		found;			/* false: the heuristic returned nothing for this shape */
	bool		fallback_logged;	/* the dp4a fallback for this key was reported once */
	cublasLtMatmulAlgo_t algo;
} gemm_algo_entry;

#define CUDA_XFER_EVENTS 64		/* ring of transfer-completion events */
#define CUDA_MAX_GRAPHS 32

/* The step metadata records as the device reads them (attention.cu builds them). */
typedef struct attn_seq_rec
{
	int			row0;			/* first activation row of the sequence */
	int			n_new;
	int			pos;			/* position of the first new token */
	int			bt_offset;		/* offset of its block table in the block-table section */
} attn_seq_rec;

typedef struct attn_item_rec
{
	int			seq;
	int			qrow0;			/* first query row of the tile: row = token_local * group + g */
	int			n_qrows;
	int			pad;
} attn_item_rec;

struct cai_cuda_ctx
{
	int			device;
	cudaDeviceProp prop;
	cudaStream_t stream;		/* compute */
	cudaStream_t copy_stream;	/* KV transfers */
	cudaEvent_t compute_mark;	/* "compute work so far" for the copy stream to wait on */
	cudaEvent_t copy_mark;		/* "uploads so far" for the compute stream to wait on */

	cudaEvent_t xfer_events[CUDA_XFER_EVENTS];
	uint64_t	xfer_issued;	/* tickets handed out (ticket n uses event n % ring) */
	uint64_t	xfer_completed; /* every ticket <= this is known complete */

	/* cuBLASLt */
	cublasLtHandle_t lt;
	void	   *lt_workspace;
	size_t		lt_workspace_bytes;
	gemm_algo_entry *algos;
	int			n_algos;
	int			cap_algos;
	uint64_t	gemm_fallbacks; /* int8 GEMMs that ran on the dp4a kernel, not cuBLASLt */

	/* int32 GEMM output scratch */
	int32_t    *acc;
	size_t		acc_elems;

	/* each row's best candidate key of a greedy argmax (sampling.cu) */
	void	   *argmax_best;
	size_t		argmax_best_elems;

	/* the row maxima of a rotation spread over several blocks per token (rotate.cu) */
	void	   *rotate_amax;
	size_t		rotate_amax_elems;

	/* split attention's per-segment partial results (attention.cu) */
	void	   *attn_split;
	size_t		attn_split_floats;

	/* step metadata: one device buffer and a pinned host staging copy of it */
	uint8_t    *meta_dev;
	uint8_t    *meta_host;
	size_t		meta_bytes;
	cudaEvent_t meta_uploaded;	/* the staging buffer may be rewritten once this completes */
	bool		meta_pending;
	cai_cuda_step_meta meta;
	int			meta_cap_tokens;
	int			meta_cap_seqs;
	int			meta_cap_bt;
	int			meta_cap_items;

	/* graphs */
	bool		capturing;
	int			graph_keys[CUDA_MAX_GRAPHS];
	cudaGraphExec_t graph_exec[CUDA_MAX_GRAPHS];
	int			n_graphs;

	/*
	 * The step plan a graph's kernels were captured with (rows 0: none read one): a replay must
	 * come with a plan of as many rows whose split attention needs no more segments, and of
	 * small tiles if the capture ran the decode attention kernel.
	 */
	int			capture_rows;
	int			capture_segments;
	bool		capture_decode_tiles;	/* the capture's attention assumed tiles of few rows */
	int			graph_rows[CUDA_MAX_GRAPHS];
	int			graph_segments[CUDA_MAX_GRAPHS];
	bool		graph_decode_tiles[CUDA_MAX_GRAPHS];
};

/* Query rows a tile may have for the decode attention kernel (attention.cu). */
#define CUDA_DECODE_TILE_ROWS 16

/* Called by every kernel launch that reads the step plan: a capture under way remembers it. */
static inline void
cuda_capture_note_plan(cai_cuda_ctx *ctx, const cai_cuda_step_meta *meta)
{
	if (!ctx->capturing)
		return;
	ctx->capture_rows = meta->n_tok;
	ctx->capture_segments = meta->max_segments;
}

/* Grows a device scratch buffer (refused while capturing); contents are not kept. */
cai_status	cuda_scratch_reserve(cai_cuda_ctx *ctx, void **buf, size_t *have, size_t want,
								 size_t elem_bytes, const char *what, cai_error *err);

void		cuda_gemm_free_cache(cai_cuda_ctx *ctx);

/* The decode-step int8 GEMM (gemv_i8.cu): up to this many tokens, k a multiple of 16. */
#define CUDA_GEMV_MAX_TOKENS 8
bool		cuda_gemv_i8_fits(const int8_t *xq_dev, int n_tok, const cai_cuda_qmatrix *w);

/* With acc_dev: the int32 sums into acc (epi unused); else the epilogue into out. */
cai_status	cuda_gemv_i8(cai_cuda_ctx *ctx, const int8_t *xq_dev, const float *xs_dev, int n_tok,
						 const cai_cuda_qmatrix *w, const cai_cuda_epilogue *epi, float *out_dev,
						 int ldo, int32_t *acc_dev, int ldacc, cai_error *err);

/* Sets the attention kernels' function attributes (once, at context creation). */
cai_status	cuda_attention_init(cai_cuda_ctx *ctx, cai_error *err);

/* Sets the rotation kernel's shared-memory limit (once, at context creation). */
cai_status	cuda_rotate_init(cai_cuda_ctx *ctx, cai_error *err);

/* ---------------------------------------------------------------------------------------------
 * Device helpers
 * ------------------------------------------------------------------------------------------- */

#define CUDA_WARP 32

static __device__ __forceinline__ float
warp_max(float v)
{
	for (int o = CUDA_WARP / 2; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

static __device__ __forceinline__ float
warp_sum(float v)
{
	for (int o = CUDA_WARP / 2; o > 0; o >>= 1)
		v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/*
 * Block-wide max of non-negative values; every thread gets the result.  scratch holds one float
 * per warp.  Exact whatever the order, so it matches the CPU's sequential max bit for bit.
 */
static __device__ __forceinline__ float
block_max(float v, float *scratch)
{
	int			lane = threadIdx.x % CUDA_WARP;
	int			warp = threadIdx.x / CUDA_WARP;
	int			n_warps = (blockDim.x + CUDA_WARP - 1) / CUDA_WARP;

	v = warp_max(v);
	__syncthreads();			/* scratch may still be read by a previous reduction */
	if (lane == 0)
		scratch[warp] = v;
	__syncthreads();
	v = lane < n_warps ? scratch[lane] : 0.0f;
	return warp_max(v);
}

/*
 * The engine's per-token int8 rule (cpu/gemm.c): amax = max|x|; a row with amax not > 0, or
 * whose 127/amax overflows, quantizes to zeros with scale 0; else scale = amax / 127,
 * inv = 127 / amax, q = rint(clamp(x * inv, -127, 127)).  Every operation is a correctly rounded
 * IEEE one (no contraction), so identical floats give identical int8 and scales on both backends.
 */
static __device__ __forceinline__ bool
quant_row_scale(float amax, float *scale, float *inv)
{
	float		r;

	if (!(amax > 0.0f))
		return false;
	r = __fdiv_rn(127.0f, amax);
	if (isinf(r))
		return false;
	*scale = __fdiv_rn(amax, 127.0f);
	*inv = r;
	return true;
}

static __device__ __forceinline__ int8_t
quant_one(float x, float inv)
{
	float		v = __fmul_rn(x, inv);

	v = v > -127.0f ? v : -127.0f;
	v = v < 127.0f ? v : 127.0f;
	return (int8_t) (int) rintf(v);
}

/* The exp's frame: x clamped to [-87, 88] in place, and n = x log2(e) rounded to nearest. */
static __device__ __forceinline__ float
exp_reduce(float *x)
{
	const float magic = 12582912.0f;

	*x = *x > -87.0f ? *x : -87.0f;
	*x = *x < 88.0f ? *x : 88.0f;
	return __fsub_rn(__fadd_rn(__fmul_rn(*x, 1.44269504088896341f), magic), magic);
}

/* p * 2^n, 2^n built in the exponent bits. */
static __device__ __forceinline__ float
exp_scale(float p, float n)
{
	return __fmul_rn(p, __int_as_float(((int) n + 127) << 23));
}

/*
 * ops.h's cai_v8f_exp for one lane, operation for operation: clamp to [-87, 88], n = x log2(e)
 * rounded to nearest by the 1.5 * 2^23 trick, r = x - n ln2 in two parts, the degree-6 Taylor
 * polynomial of e^r by Horner, times 2^n built in the exponent bits.  Every step is a correctly
 * rounded float operation (no contraction on either side), so the result is the CPU's bit for bit.
 */
static __device__ __forceinline__ float
exp_poly(float x)
{
	float		n = exp_reduce(&x),
				r,
				p;

	r = __fsub_rn(x, __fmul_rn(n, 0.693145751953125f));
	r = __fsub_rn(r, __fmul_rn(n, 1.428606765330187e-06f));
	p = __fdiv_rn(1.0f, 720.0f);
	p = __fadd_rn(__fmul_rn(p, r), __fdiv_rn(1.0f, 120.0f));
	p = __fadd_rn(__fmul_rn(p, r), __fdiv_rn(1.0f, 24.0f));
	p = __fadd_rn(__fmul_rn(p, r), __fdiv_rn(1.0f, 6.0f));
	p = __fadd_rn(__fmul_rn(p, r), 0.5f);
	p = __fadd_rn(__fmul_rn(p, r), 1.0f);
	p = __fadd_rn(__fmul_rn(p, r), 1.0f);
	return exp_scale(p, n);
}

/* silu(g) = g / (1 + exp(-g)), as cai_op_swiglu_row computes it. */
static __device__ __forceinline__ float
act_silu(float g)
{
	return __fdiv_rn(g, __fadd_rn(1.0f, exp_poly(-g)));
}

static __device__ __forceinline__ float
apply_activation(float v, int act)
{
	if (act == CAI_CUDA_ACT_SILU)
		return act_silu(v);
	return v;
}

/*
 * The int8 GEMM epilogue's element: int32 sum -> float with both scales, bias, activation
 * (cpu/gemm.c's sequence of correctly rounded operations).
 */
static __device__ __forceinline__ float
epilogue_value(int32_t acc, float xs, float ws, const float *bias, int o, int act)
{
	float		v = __fmul_rn(__fmul_rn(__int2float_rn(acc), xs), ws);

	if (bias)
		v = __fadd_rn(v, bias[o]);
	return apply_activation(v, act);
}

/* ops.h's cai_v8f_sum: the fixed tree over eight partial sums. */
static __device__ __forceinline__ float
tree8(const float *a)
{
	return __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[4]), __fadd_rn(a[2], a[6])),
					 __fadd_rn(__fadd_rn(a[1], a[5]), __fadd_rn(a[3], a[7])));
}

/* Ceiling division for launch sizes. */
static inline int
div_up(long a, long b)
{
	return (int) ((a + b - 1) / b);
}

#endif							/* CAI_CUDA_INTERNAL_CUH */
