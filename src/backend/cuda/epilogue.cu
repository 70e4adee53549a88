/*
 * epilogue.cu — the int8 GEMM's fused epilogue (int32 -> float with both scales, bias,
 * activation, residual, optional re-quantization for the next GEMM) and per-token activation
 * quantization; cai_cuda_gemm_i8 strings the cuBLASLt product and the epilogue together.
 *
 * Bit-exactness with the CPU: the epilogue is the same sequence of correctly rounded float
 * operations as cpu/gemm.c's (the __f*_rn intrinsics keep nvcc from fusing a multiply and an add),
 * and quantization is the engine's rule (quant_row_scale/quant_one), whose max is exact in any
 * order.  So for identical int32 accumulators the floats, int8 values and scales are identical.
 */
#include "cuda_internal.cuh"

/* Elements per thread of the plain epilogue: one 16-byte load of int32 accumulators. */
#define EPI_VEC 4
#define EPI_THREADS 256
#define QUANT_THREADS 512

/*
 * Without re-quantization: a 2-D grid, blockIdx.y the token, each thread EPI_VEC consecutive
 * channels (ldacc is a multiple of 4, so the int4 load is aligned).
 */
static __global__ void
epilogue_kernel(const int32_t *__restrict__ acc, int ldacc, const float *__restrict__ xs,
				const float *__restrict__ ws, const float *__restrict__ bias, int n_out,
				float *out, int ldo, bool accumulate, int act)
{
	int			t = blockIdx.y;
	int			o0 = (blockIdx.x * blockDim.x + threadIdx.x) * EPI_VEC;
	float		s = xs[t];
	int4		a;
	int			av[EPI_VEC];
	float	   *row = out + (size_t) t * ldo;

	if (o0 >= n_out)
		return;
	a = *(const int4 *) (acc + (size_t) t * ldacc + o0);
	av[0] = a.x;
	av[1] = a.y;
	av[2] = a.z;
	av[3] = a.w;
#pragma unroll
	for (int j = 0; j < EPI_VEC; j++)
	{
		int			o = o0 + j;
		float		v;

		if (o >= n_out)
			break;
		v = epilogue_value(av[j], s, ws[o], bias, o, act);
		row[o] = accumulate ? __fadd_rn(row[o], v) : v;
	}
}

/*
 * With re-quantization: one block per token.  Pass 1 computes and stores each value and the
 * row's max |value|; pass 2 quantizes the stored values (each thread re-reads its own writes).
 * When there is no float output the value is recomputed instead of stored: the same expression
 * gives the same float.
 */
static __global__ void
epilogue_quant_kernel(const int32_t *__restrict__ acc, int ldacc, const float *__restrict__ xs,
					  const float *__restrict__ ws, const float *__restrict__ bias, int n_out,
					  float *out, int ldo, bool accumulate, int act, int8_t *__restrict__ q_out,
					  float *__restrict__ s_out)
{
	__shared__ float red[QUANT_THREADS / CUDA_WARP];
	int			t = blockIdx.x;
	float		s = xs[t];
	const int32_t *arow = acc + (size_t) t * ldacc;
	float	   *orow = out ? out + (size_t) t * ldo : NULL;
	int8_t	   *qrow = q_out + (size_t) t * n_out;
	float		amax = 0.0f;
	float		scale = 0.0f,
				inv = 0.0f;
	bool		nonzero;

	for (int o = threadIdx.x; o < n_out; o += blockDim.x)
	{
		float		v = epilogue_value(arow[o], s, ws[o], bias, o, act);

		if (orow)
		{
			if (accumulate)
				v = __fadd_rn(orow[o], v);
			orow[o] = v;
		}
		amax = fmaxf(amax, fabsf(v));
	}
	amax = block_max(amax, red);
	nonzero = quant_row_scale(amax, &scale, &inv);
	if (threadIdx.x == 0)
		s_out[t] = nonzero ? scale : 0.0f;
	for (int o = threadIdx.x; o < n_out; o += blockDim.x)
	{
		float		v = orow ? orow[o] : epilogue_value(arow[o], s, ws[o], bias, o, act);

		qrow[o] = nonzero ? quant_one(v, inv) : 0;
	}
}

/*
 * Element i of a row to quantize: x itself, or with a first digit (q1 != NULL, scale s1) its
 * rounding error x - (float) q1 * s1, rounded as the CPU rounds it (a product, then a difference).
 */
static __device__ __forceinline__ float
quantize_input(const float *xr, const int8_t *q1r, float s1, int i)
{
	return q1r ? __fsub_rn(xr[i], __fmul_rn((float) q1r[i], s1)) : xr[i];
}

/*
 * Per-token quantization of a float matrix, or of its rounding error against the first digit
 * q1, s1 (two-digit activations): one block per token, max then quantize.
 */
static __global__ void
quantize_kernel(const float *__restrict__ x, int k, int ldx, const int8_t *__restrict__ q1,
				const float *__restrict__ s1, int8_t *__restrict__ q, float *__restrict__ s)
{
	__shared__ float red[QUANT_THREADS / CUDA_WARP];
	int			t = blockIdx.x;
	const float *xr = x + (size_t) t * ldx;
	const int8_t *q1r = q1 ? q1 + (size_t) t * k : NULL;
	float		s1t = q1 ? s1[t] : 0.0f;
	int8_t	   *qr = q + (size_t) t * k;
	float		amax = 0.0f;
	float		scale = 0.0f,
				inv = 0.0f;
	bool		nonzero;

	for (int i = threadIdx.x; i < k; i += blockDim.x)
		amax = fmaxf(amax, fabsf(quantize_input(xr, q1r, s1t, i)));
	amax = block_max(amax, red);
	nonzero = quant_row_scale(amax, &scale, &inv);
	if (threadIdx.x == 0)
		s[t] = nonzero ? scale : 0.0f;
	for (int i = threadIdx.x; i < k; i += blockDim.x)
		qr[i] = nonzero ? quant_one(quantize_input(xr, q1r, s1t, i), inv) : 0;
}

/* Threads for a one-block-per-row kernel over rows of n elements: a multiple of 32, <= 512. */
static int
row_threads(int n)
{
	int			t = (n + CUDA_WARP - 1) / CUDA_WARP * CUDA_WARP;

	return t > QUANT_THREADS ? QUANT_THREADS : (t < CUDA_WARP ? CUDA_WARP : t);
}

extern "C" cai_status
cai_cuda_quantize_act(cai_cuda_ctx *ctx, const float *x_dev, int n_tok, int k, int ldx,
					  int8_t *q_dev, float *s_dev, cai_error *err)
{
	if (n_tok <= 0)
		return CAI_OK;
	quantize_kernel<<<n_tok, row_threads(k), 0, ctx->stream>>>(x_dev, k, ldx, NULL, NULL, q_dev,
																 s_dev);
	CUDA_CHECK_LAUNCH(err, "the quantize kernel");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_quantize_second_digit(cai_cuda_ctx *ctx, const float *x_dev, int n_tok, int k,
							   const int8_t *q1_dev, const float *s1_dev, int8_t *q_dev,
							   float *s_dev, cai_error *err)
{
	if (n_tok <= 0)
		return CAI_OK;
	quantize_kernel<<<n_tok, row_threads(k), 0, ctx->stream>>>(x_dev, k, k, q1_dev, s1_dev,
																 q_dev, s_dev);
	CUDA_CHECK_LAUNCH(err, "the residual quantize kernel");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_gemm_i8(cai_cuda_ctx *ctx, const int8_t *xq_dev, const float *xs_dev, int n_tok,
				 const cai_cuda_qmatrix *w, float *out_dev, int ldo,
				 const cai_cuda_epilogue *epi, cai_error *err)
{
	cai_cuda_epilogue none = {NULL, false, CAI_CUDA_ACT_NONE, NULL, NULL};
	int			ldacc = w->n_out_padded;
	cai_status	st;

	if (n_tok <= 0)
		return CAI_OK;
	if (!epi)
		epi = &none;
	if (!out_dev && (!epi->q_out_dev || epi->accumulate))
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT,
						 "int8 gemm without a float output needs q_out and no accumulation");
	if (epi->q_out_dev && !epi->s_out_dev)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "int8 gemm: q_out without s_out");
	if (out_dev && ldo < w->n_out)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "int8 gemm: ldo %d < n_out %d", ldo,
						 w->n_out);
	/* a decode step's few tokens: one kernel, the epilogue fused unless it re-quantizes */
	if (cuda_gemv_i8_fits(xq_dev, n_tok, w) && !epi->q_out_dev)
		return cuda_gemv_i8(ctx, xq_dev, xs_dev, n_tok, w, epi, out_dev, ldo, NULL, 0, err);
	st = cuda_scratch_reserve(ctx, (void **) &ctx->acc, &ctx->acc_elems,
							  (size_t) n_tok * (size_t) ldacc, sizeof(int32_t),
							  "the int32 gemm accumulator", err);
	if (st != CAI_OK)
		return st;
	if (cuda_gemv_i8_fits(xq_dev, n_tok, w))
		st = cuda_gemv_i8(ctx, xq_dev, xs_dev, n_tok, w, epi, NULL, 0, ctx->acc, ldacc, err);
	else
		st = cai_cuda_gemm_i8_acc(ctx, xq_dev, n_tok, w, ctx->acc, ldacc, err);
	if (st != CAI_OK)
		return st;

	if (epi->q_out_dev)
	{
		epilogue_quant_kernel<<<n_tok, row_threads(w->n_out), 0, ctx->stream>>>(
			ctx->acc, ldacc, xs_dev, w->scale_dev, epi->bias_dev, w->n_out, out_dev, ldo,
			epi->accumulate, (int) epi->activation, epi->q_out_dev, epi->s_out_dev);
		CUDA_CHECK_LAUNCH(err, "the int8 gemm epilogue (with quantization)");
	}
	else
	{
		dim3		grid(div_up(w->n_out, EPI_THREADS * EPI_VEC), n_tok);

		if (n_tok > 65535)
			return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "too many tokens for one gemm (%d)",
							 n_tok);
		epilogue_kernel<<<grid, EPI_THREADS, 0, ctx->stream>>>(
			ctx->acc, ldacc, xs_dev, w->scale_dev, epi->bias_dev, w->n_out, out_dev, ldo,
			epi->accumulate, (int) epi->activation);
		CUDA_CHECK_LAUNCH(err, "the int8 gemm epilogue");
	}
	return CAI_OK;
}
