/*
 * norm_rope.cu — the per-token kernels between the GEMMs: RMSNorm fused with int8 quantization
 * or added into the residual stream, rotary embeddings, SwiGLU and GeGLU fused with quantization,
 * the embedding lookups, their scaling and row gathers.
 * Each computes an element with the same sequence of correctly rounded float operations as
 * cpu/ops.c (the __f*_rn intrinsics forbid contraction), so results are the CPU's bit for bit.
 *
 * Each "fused with quantization" kernel runs one block per token: the row's values are produced,
 * optionally stored as floats, their max |value| reduced over the block, and the row quantized
 * with the engine's rule.  The quantization pass recomputes each value with the same expression
 * rather than keeping the row in shared memory: identical inputs give the identical float, and
 * the row stays in L1/L2 between the passes.
 */
#include "cuda_internal.cuh"

#define ROW_THREADS_MAX 512

static int
row_threads(int n)
{
	int			t = (n + CUDA_WARP - 1) / CUDA_WARP * CUDA_WARP;

	return t > ROW_THREADS_MAX ? ROW_THREADS_MAX : (t < CUDA_WARP ? CUDA_WARP : t);
}

/* ---------------------------------------------------------------------------------------------
 * RMSNorm
 * ------------------------------------------------------------------------------------------- */

/*
 * 1 / sqrt(mean(row^2) + eps) for a block's row, the sum of squares as ops.c's sum_squares:
 * threads 0..7 sum x[i]^2 for i = j, j + 8, ... below the last multiple of 8, in order; thread 8
 * sums the tail in order; thread 0 combines them with the fixed tree.  Every thread of the block
 * calls it and gets the value; part (9 floats) and inv are the caller's shared memory.
 */
static __device__ float
row_inv_rms(const float *row, int d, float eps, float *part, float *inv)
{
	int			n8 = d & ~7;

	if (threadIdx.x < 8)
	{
		float		acc = 0.0f;
		int			i = threadIdx.x;

		/*
		 * Sixteen loads issued together, then their squares added in order: the chain waits on
		 * one load latency per sixteen additions instead of one per addition.
		 */
		for (; i + 15 * 8 < n8; i += 16 * 8)
		{
			float		v[16];

#pragma unroll
			for (int k = 0; k < 16; k++)
				v[k] = row[i + 8 * k];
#pragma unroll
			for (int k = 0; k < 16; k++)
				acc = __fadd_rn(acc, __fmul_rn(v[k], v[k]));
		}
		for (; i < n8; i += 8)
			acc = __fadd_rn(acc, __fmul_rn(row[i], row[i]));
		part[threadIdx.x] = acc;
	}
	else if (threadIdx.x == 8)
	{
		float		tail = 0.0f;

		for (int i = n8; i < d; i++)
			tail = __fadd_rn(tail, __fmul_rn(row[i], row[i]));
		part[8] = tail;
	}
	__syncthreads();
	if (threadIdx.x == 0)
	{
		float		ms = __fdiv_rn(__fadd_rn(tree8(part), part[8]), (float) d);

		*inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
	}
	__syncthreads();
	return *inv;
}

/*
 * One block per token.  The sum of squares follows ops.c's sum_squares exactly: lane j < 8 of the
 * first warp sums x[i]^2 for i = j, j + 8, ... below the last multiple of 8, in order; lane 8 sums
 * the tail in order; thread 0 combines them with the fixed tree.  Those eight chains are serial by
 * definition (a float sum's order is part of its value), so they must not wait on global memory:
 * the whole block first stages the row in shared memory with coalesced loads (when it fits, which
 * it does for every d up to 12288), and the chains and both later passes read it from there.
 * With add, y is the residual stream the normed row is added to (cai_op_rmsnorm_add_row:
 * y + (x * inv) * w, each operation rounded), as a sandwiched sublayer's output goes into it.
 */
#define RMSNORM_STAGE_MAX_BYTES (48 * 1024)

static __global__ void
rmsnorm_kernel(const float *__restrict__ x, const float *__restrict__ w, int d, float eps,
			   float *__restrict__ y, int8_t *__restrict__ q, float *__restrict__ s, bool staged,
			   bool add)
{
	extern __shared__ float row_sh[];
	__shared__ float part[9];
	__shared__ float red[ROW_THREADS_MAX / CUDA_WARP];
	__shared__ float inv_shared;
	int			t = blockIdx.x;
	const float *xr = x + (size_t) t * d;
	const float *row = xr;
	float		inv;
	float		amax = 0.0f;
	float		scale = 0.0f,
				qinv = 0.0f;
	bool		nonzero;

	if (staged)
	{
		for (int i = threadIdx.x; i < d; i += blockDim.x)
			row_sh[i] = xr[i];
		__syncthreads();
		row = row_sh;
	}
	inv = row_inv_rms(row, d, eps, part, &inv_shared);

	for (int i = threadIdx.x; i < d; i += blockDim.x)
	{
		float		v = __fmul_rn(__fmul_rn(row[i], inv), w[i]);

		if (add)
			y[(size_t) t * d + i] = __fadd_rn(y[(size_t) t * d + i], v);
		else if (y)
			y[(size_t) t * d + i] = v;
		amax = fmaxf(amax, fabsf(v));
	}
	if (!q)
		return;
	amax = block_max(amax, red);
	nonzero = quant_row_scale(amax, &scale, &qinv);
	if (threadIdx.x == 0)
		s[t] = nonzero ? scale : 0.0f;
	for (int i = threadIdx.x; i < d; i += blockDim.x)
		q[(size_t) t * d + i] =
			nonzero ? quant_one(__fmul_rn(__fmul_rn(row[i], inv), w[i]), qinv) : 0;
}

static cai_status
rmsnorm(cai_cuda_ctx *ctx, const float *x_dev, const float *w_dev, int n_tok, int d, float eps,
		float *y_dev, int8_t *q_dev, float *s_dev, bool add, cai_error *err)
{
	size_t		stage_bytes = (size_t) d * sizeof(float);
	bool		staged = stage_bytes <= RMSNORM_STAGE_MAX_BYTES;

	if (n_tok <= 0)
		return CAI_OK;
	if (q_dev && !s_dev)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "rmsnorm: q without s");
	rmsnorm_kernel<<<n_tok, row_threads(d), staged ? stage_bytes : 0, ctx->stream>>>(
		x_dev, w_dev, d, eps, y_dev, q_dev, s_dev, staged, add);
	CUDA_CHECK_LAUNCH(err, "the rmsnorm kernel");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_rmsnorm(cai_cuda_ctx *ctx, const float *x_dev, const float *w_dev, int n_tok, int d,
				 float eps, float *y_dev, int8_t *q_dev, float *s_dev, cai_error *err)
{
	return rmsnorm(ctx, x_dev, w_dev, n_tok, d, eps, y_dev, q_dev, s_dev, false, err);
}

extern "C" cai_status
cai_cuda_rmsnorm_add(cai_cuda_ctx *ctx, const float *y_dev, const float *w_dev, int n_tok, int d,
					 float eps, float *x_dev, cai_error *err)
{
	if (!x_dev)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "rmsnorm_add: no residual to add to");
	return rmsnorm(ctx, y_dev, w_dev, n_tok, d, eps, x_dev, NULL, NULL, true, err);
}

/*
 * Per-head RMSNorm in place (the query and key norms of Qwen3 and Gemma 3): one warp per
 * (token, head).  The sum of squares follows sum_squares like rmsnorm_kernel (lanes 0..7 the
 * eight chains, lane 8 the tail, the fixed tree); every lane has read its part of the head
 * before any lane writes, so normalizing in place is safe.
 */
static __global__ void
head_rmsnorm_kernel(float *__restrict__ x, int ldx, int n_heads, int head_dim,
					const float *__restrict__ w, float eps)
{
	__shared__ float part[9];
	__shared__ float inv_shared;
	int			t = blockIdx.x / n_heads;
	int			h = blockIdx.x % n_heads;
	float	   *row = x + (size_t) t * ldx + (size_t) h * head_dim;
	float		inv;

	inv = row_inv_rms(row, head_dim, eps, part, &inv_shared);
	for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
		row[i] = __fmul_rn(__fmul_rn(row[i], inv), w[i]);
}

extern "C" cai_status
cai_cuda_head_rmsnorm(cai_cuda_ctx *ctx, float *x_dev, int ldx, int n_tok, int n_heads,
					  int head_dim, const float *w_dev, float eps, cai_error *err)
{
	long		blocks = (long) n_tok * n_heads;

	if (blocks <= 0)
		return CAI_OK;
	if (blocks > 0x7fffffffL)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "head rmsnorm: too many heads");
	head_rmsnorm_kernel<<<(unsigned) blocks, CUDA_WARP, 0, ctx->stream>>>(x_dev, ldx, n_heads,
																		head_dim, w_dev, eps);
	CUDA_CHECK_LAUNCH(err, "the head rmsnorm kernel");
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Rotary embeddings
 * ------------------------------------------------------------------------------------------- */

static __global__ void
rope_gather_kernel(const float *__restrict__ table, int n_pos, int n_rot,
				   const int32_t *__restrict__ pos, int n_tok, float *__restrict__ cs)
{
	long		idx = blockIdx.x * (long) blockDim.x + threadIdx.x;
	int			t = (int) (idx / n_rot);
	int			j = (int) (idx % n_rot);
	int			p;

	if (t >= n_tok)
		return;
	p = pos[t];
	if (p < 0 || p >= n_pos)
		cs[idx] = (j % 2 == 0) ? 1.0f : 0.0f;
	else
		cs[idx] = table[(size_t) p * n_rot + j];
}

extern "C" cai_status
cai_cuda_rope_gather(cai_cuda_ctx *ctx, const float *table_dev, int n_pos, int n_rot,
					 const int32_t *pos_dev, int n_tok, float *cs_dev, cai_error *err)
{
	long		n = (long) n_tok * n_rot;

	if (n <= 0)
		return CAI_OK;
	rope_gather_kernel<<<div_up(n, 256), 256, 0, ctx->stream>>>(table_dev, n_pos, n_rot, pos_dev,
																n_tok, cs_dev);
	CUDA_CHECK_LAUNCH(err, "the rope gather kernel");
	return CAI_OK;
}

static __global__ void
rope_table_kernel(float *table, int n_pos, int n_rot, double base, double freq_scale)
{
	int			half = n_rot / 2;
	long		idx = blockIdx.x * (long) blockDim.x + threadIdx.x;
	int			i = (int) (idx % half);
	long		p = idx / half;
	double		theta;

	if (p >= n_pos)
		return;
	theta = (double) p * freq_scale * pow(base, -2.0 * i / (double) n_rot);
	table[2 * idx] = (float) cos(theta);
	table[2 * idx + 1] = (float) sin(theta);
}

extern "C" cai_status
cai_cuda_rope_table(cai_cuda_ctx *ctx, float *table_dev, int n_pos, int n_rot, double base,
					double freq_scale, cai_error *err)
{
	long		n = (long) n_pos * (n_rot / 2);

	if (n <= 0)
		return CAI_OK;
	rope_table_kernel<<<div_up(n, 256), 256, 0, ctx->stream>>>(table_dev, n_pos, n_rot, base,
															   freq_scale);
	CUDA_CHECK_LAUNCH(err, "the rope table kernel");
	return CAI_OK;
}

/* One thread per (token, head, pair). */
static __global__ void
rope_kernel(const float *__restrict__ cs, float *x, int ldx, int n_tok, int n_heads,
			int head_dim, int n_rot, int neox)
{
	int			half = n_rot / 2;
	long		idx = blockIdx.x * (long) blockDim.x + threadIdx.x;
	int			i = (int) (idx % half);
	int			h = (int) ((idx / half) % n_heads);
	int			t = (int) (idx / ((long) half * n_heads));
	float	   *xh;
	float		c,
				sn,
				x0,
				x1;
	int			i0,
				i1;

	if (t >= n_tok)
		return;
	c = cs[(size_t) t * n_rot + 2 * i];
	sn = cs[(size_t) t * n_rot + 2 * i + 1];
	xh = x + (size_t) t * ldx + (size_t) h * head_dim;
	i0 = neox ? i : 2 * i;
	i1 = neox ? i + half : 2 * i + 1;
	x0 = xh[i0];
	x1 = xh[i1];
	xh[i0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
	xh[i1] = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
}

extern "C" cai_status
cai_cuda_rope(cai_cuda_ctx *ctx, const float *cs_dev, float *x_dev, int ldx, int n_tok,
			  int n_heads, int head_dim, int n_rot, bool neox, cai_error *err)
{
	long		n = (long) n_tok * n_heads * (n_rot / 2);

	if (n <= 0)
		return CAI_OK;
	if (n_rot % 2 != 0 || n_rot > head_dim)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "rope: n_rot %d does not fit head_dim %d",
						 n_rot, head_dim);
	rope_kernel<<<div_up(n, 256), 256, 0, ctx->stream>>>(cs_dev, x_dev, ldx, n_tok, n_heads,
														 head_dim, n_rot, neox ? 1 : 0);
	CUDA_CHECK_LAUNCH(err, "the rope kernel");
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * SwiGLU, GeGLU
 * ------------------------------------------------------------------------------------------- */

/* The gated FFN's activation of the gate, a template argument: each kernel is built for one. */
enum glu_act
{
	GLU_SILU,
	GLU_GELU
};

/* ops.c's GELU_C1 and GELU_C3: 2 sqrt(2/pi) and 2 sqrt(2/pi) 0.044715 */
#define GELU_C1 1.5957691216057308f
#define GELU_C3 0.07135481627159786f

/*
 * gelu's tanh approximation as cai_op_geglu_row computes it, g * sigmoid(z) with
 * z = g (C1 + C3 g^2): the exp of -z and the division of silu's, every step rounded.
 */
static __device__ __forceinline__ float
act_gelu(float g)
{
	float		z = __fmul_rn(g, __fadd_rn(GELU_C1, __fmul_rn(GELU_C3, __fmul_rn(g, g))));

	return __fdiv_rn(g, __fadd_rn(1.0f, exp_poly(-z)));
}

/* act(g) * u: cai_op_swiglu_row's or cai_op_geglu_row's expression. */
template <int ACT>
static __device__ __forceinline__ float
glu_value(float g, float u)
{
	return __fmul_rn(ACT == GLU_GELU ? act_gelu(g) : act_silu(g), u);
}

template <int ACT>
static __global__ void
glu_kernel(const float *__restrict__ gate_up, int d_ff, float *__restrict__ h,
		   int8_t *__restrict__ q, float *__restrict__ s)
{
	__shared__ float red[ROW_THREADS_MAX / CUDA_WARP];
	int			t = blockIdx.x;
	const float *gr = gate_up + (size_t) t * 2 * d_ff;
	const float *ur = gr + d_ff;
	float		amax = 0.0f;
	float		scale = 0.0f,
				inv = 0.0f;
	bool		nonzero;

	for (int i = threadIdx.x; i < d_ff; i += blockDim.x)
	{
		float		v = glu_value<ACT>(gr[i], ur[i]);

		if (h)
			h[(size_t) t * d_ff + i] = v;
		amax = fmaxf(amax, fabsf(v));
	}
	if (!q)
		return;
	amax = block_max(amax, red);
	nonzero = quant_row_scale(amax, &scale, &inv);
	if (threadIdx.x == 0)
		s[t] = nonzero ? scale : 0.0f;
	for (int i = threadIdx.x; i < d_ff; i += blockDim.x)
		q[(size_t) t * d_ff + i] = nonzero ? quant_one(glu_value<ACT>(gr[i], ur[i]), inv) : 0;
}

/* Without quantization every element is independent: a 2-D grid, blockIdx.y the token. */
template <int ACT>
static __global__ void
glu_store_kernel(const float *__restrict__ gate_up, int d_ff, float *__restrict__ h)
{
	int			t = blockIdx.y;
	int			i = blockIdx.x * blockDim.x + threadIdx.x;
	const float *gr = gate_up + (size_t) t * 2 * d_ff;

	if (i < d_ff)
		h[(size_t) t * d_ff + i] = glu_value<ACT>(gr[i], gr[d_ff + i]);
}

template <int ACT>
static cai_status
glu(cai_cuda_ctx *ctx, const float *gate_up_dev, int n_tok, int d_ff, float *h_dev,
	int8_t *q_dev, float *s_dev, const char *what, cai_error *err)
{
	if (n_tok <= 0)
		return CAI_OK;
	if (q_dev && !s_dev)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "%s: q without s", what);
	if (!q_dev && n_tok <= 65535)
	{
		/* a decode step's few rows would leave all but a few SMs idle in one block per row */
		glu_store_kernel<ACT><<<dim3(div_up(d_ff, 256), n_tok), 256, 0, ctx->stream>>>(
			gate_up_dev, d_ff, h_dev);
	}
	else
		glu_kernel<ACT><<<n_tok, row_threads(d_ff), 0, ctx->stream>>>(gate_up_dev, d_ff, h_dev,
																	   q_dev, s_dev);
	CUDA_CHECK_LAUNCH(err, ACT == GLU_GELU ? "the geglu kernel" : "the swiglu kernel");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_swiglu(cai_cuda_ctx *ctx, const float *gate_up_dev, int n_tok, int d_ff, float *h_dev,
				int8_t *q_dev, float *s_dev, cai_error *err)
{
	return glu<GLU_SILU>(ctx, gate_up_dev, n_tok, d_ff, h_dev, q_dev, s_dev, "swiglu", err);
}

extern "C" cai_status
cai_cuda_geglu(cai_cuda_ctx *ctx, const float *gate_up_dev, int n_tok, int d_ff, float *h_dev,
			   int8_t *q_dev, float *s_dev, cai_error *err)
{
	return glu<GLU_GELU>(ctx, gate_up_dev, n_tok, d_ff, h_dev, q_dev, s_dev, "geglu", err);
}

/* ---------------------------------------------------------------------------------------------
 * Embedding and row gathers
 * ------------------------------------------------------------------------------------------- */

/* x = the rows dequantized, or x + them (add: a two-digit table's second digits) */
static __global__ void
embed_i8_kernel(const int8_t *__restrict__ table, const float *__restrict__ scale, int n_vocab,
				int d, const int32_t *__restrict__ ids, int n_tok, float *__restrict__ x, bool add)
{
	long		idx = blockIdx.x * (long) blockDim.x + threadIdx.x;
	int			t = (int) (idx / d);
	int			i = (int) (idx % d);
	int			id;

	if (t >= n_tok)
		return;
	id = ids[t];
	if (id < 0 || id >= n_vocab)
	{
		if (!add)
			x[idx] = 0.0f;
	}
	else
	{
		float		v = __fmul_rn((float) table[(size_t) id * d + i], scale[id]);

		x[idx] = add ? __fadd_rn(x[idx], v) : v;
	}
}

static cai_status
embed_i8(cai_cuda_ctx *ctx, const cai_cuda_qmatrix *table, const int32_t *ids_dev, int n_tok,
		 float *x_dev, bool add, cai_error *err)
{
	long		n = (long) n_tok * table->k;

	if (n <= 0)
		return CAI_OK;
	embed_i8_kernel<<<div_up(n, 256), 256, 0, ctx->stream>>>(table->q_dev, table->scale_dev,
															 table->n_out, table->k, ids_dev,
															 n_tok, x_dev, add);
	CUDA_CHECK_LAUNCH(err, "the embedding kernel");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_embed_i8(cai_cuda_ctx *ctx, const cai_cuda_qmatrix *table, const int32_t *ids_dev,
				  int n_tok, float *x_dev, cai_error *err)
{
	return embed_i8(ctx, table, ids_dev, n_tok, x_dev, false, err);
}

extern "C" cai_status
cai_cuda_embed_i8_add(cai_cuda_ctx *ctx, const cai_cuda_qmatrix *table, const int32_t *ids_dev,
					  int n_tok, float *x_dev, cai_error *err)
{
	return embed_i8(ctx, table, ids_dev, n_tok, x_dev, true, err);
}

/* x *= s element by element, each product rounded as cpu_scale's (Gemma's embedding scale). */
static __global__ void
scale_kernel(float *__restrict__ x, long n, float s)
{
	long		i = blockIdx.x * (long) blockDim.x + threadIdx.x;

	if (i < n)
		x[i] = __fmul_rn(x[i], s);
}

extern "C" cai_status
cai_cuda_scale(cai_cuda_ctx *ctx, float *x_dev, int n_tok, int d, float s, cai_error *err)
{
	long		n = (long) n_tok * d;

	if (n <= 0)
		return CAI_OK;
	scale_kernel<<<div_up(n, 256), 256, 0, ctx->stream>>>(x_dev, n, s);
	CUDA_CHECK_LAUNCH(err, "the scale kernel");
	return CAI_OK;
}

/* dst[r, :] = src[rows[r], :] (rows NULL: the identity); out-of-range rows give zeros. */
static __global__ void
gather_kernel(const float *__restrict__ src, int n_src, int d, const int32_t *__restrict__ rows,
			  int n_rows, float *__restrict__ dst)
{
	long		idx = blockIdx.x * (long) blockDim.x + threadIdx.x;
	int			r = (int) (idx / d);
	int			i = (int) (idx % d);
	int			from;

	if (r >= n_rows)
		return;
	from = rows[r];
	dst[idx] = (from >= 0 && from < n_src) ? src[(size_t) from * d + i] : 0.0f;
}

extern "C" cai_status
cai_cuda_embed_f32(cai_cuda_ctx *ctx, const float *table_dev, int n_rows, int d,
				   const int32_t *ids_dev, int n_tok, float *x_dev, cai_error *err)
{
	long		n = (long) n_tok * d;

	if (n <= 0)
		return CAI_OK;
	gather_kernel<<<div_up(n, 256), 256, 0, ctx->stream>>>(table_dev, n_rows, d, ids_dev, n_tok,
														   x_dev);
	CUDA_CHECK_LAUNCH(err, "the float embedding kernel");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_gather_rows(cai_cuda_ctx *ctx, const float *src_dev, int d, const int32_t *rows_dev,
					 int n_rows, float *dst_dev, cai_error *err)
{
	long		n = (long) n_rows * d;

	if (n <= 0)
		return CAI_OK;
	/* the rows are the caller's; any int index is in range of its own matrix */
	gather_kernel<<<div_up(n, 256), 256, 0, ctx->stream>>>(src_dev, 0x7fffffff, d, rows_dev,
														   n_rows, dst_dev);
	CUDA_CHECK_LAUNCH(err, "the row gather kernel");
	return CAI_OK;
}
