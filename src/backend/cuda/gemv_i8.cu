/*
 * gemv_i8.cu — the int8 GEMM of a decode step: a few tokens against a weight matrix, with the
 * epilogue fused into the same kernel.
 *
 * At a handful of tokens the GEMM is a stream over the weights.  cuBLASLt's tensor-core tiles are
 * 64 or more tokens wide and, for so few, add a split-K reduction and leave most of the memory
 * bandwidth unused; the epilogue is then a third launch.  Here each block streams GEMV_ROWS weight
 * rows once, in 16-byte loads, against every token (each token's 16 bytes loaded once serve all
 * the block's rows), with dp4a into int32 accumulators reduced across the block.  int32 sums are
 * exact in any order, so the accumulators are cuBLASLt's, and the epilogue is the same expression
 * (epilogue_value): the floats are the same bit for bit.
 */
#include "cuda_internal.cuh"

#define GEMV_ROWS 4				/* weight rows per block; n_out_padded is a multiple of 4 */
#define GEMV_WARPS 8			/* warps per block, each a slice of k */

/*
 * A block per GEMV_ROWS weight rows, its warps splitting k (warp w takes the 16-byte columns
 * w * 32 + lane, + 256, ...), so that even a matrix of few rows has many blocks streaming it.
 * NT: the tokens the kernel is compiled for (n_tok <= NT).  With acc, it stores the int32 sums
 * (for the re-quantizing epilogue, which needs a whole row); else out = epilogue, or += with
 * accumulate.
 */
template <int NT>
static __global__ void __launch_bounds__(GEMV_WARPS * CUDA_WARP)
gemv_i8_kernel(const int8_t *__restrict__ x, const float *__restrict__ xs, int n_tok,
			   const int8_t *__restrict__ w, const float *__restrict__ ws, int n_out, int k,
			   const float *__restrict__ bias, int act, bool accumulate, float *out, int ldo,
			   int32_t *__restrict__ acc, int ldacc)
{
	__shared__ int red[GEMV_WARPS][GEMV_ROWS * NT];
	int			lane = threadIdx.x % CUDA_WARP;
	int			warp = threadIdx.x / CUDA_WARP;
	int			o0 = blockIdx.x * GEMV_ROWS;
	int			k16 = k / 16;
	const int4 *wrow[GEMV_ROWS];
	int			sum[GEMV_ROWS][NT];

#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
	{
		/* rows up to n_out_padded exist (zeros past n_out) */
		wrow[r] = (const int4 *) (w + (size_t) (o0 + r) * k);
#pragma unroll
		for (int t = 0; t < NT; t++)
			sum[r][t] = 0;
	}
#pragma unroll 2
	for (int i = warp * CUDA_WARP + lane; i < k16; i += GEMV_WARPS * CUDA_WARP)
	{
		int4		wv[GEMV_ROWS];

#pragma unroll
		for (int r = 0; r < GEMV_ROWS; r++)
			wv[r] = __ldg(wrow[r] + i);
#pragma unroll
		for (int t = 0; t < NT; t++)
		{
			int4		xv;

			if (t >= n_tok)
				break;
			xv = __ldg((const int4 *) (x + (size_t) t * k) + i);
#pragma unroll
			for (int r = 0; r < GEMV_ROWS; r++)
			{
				sum[r][t] = __dp4a(xv.x, wv[r].x, sum[r][t]);
				sum[r][t] = __dp4a(xv.y, wv[r].y, sum[r][t]);
				sum[r][t] = __dp4a(xv.z, wv[r].z, sum[r][t]);
				sum[r][t] = __dp4a(xv.w, wv[r].w, sum[r][t]);
			}
		}
	}
	/* int32 sums are exact in any order: across the warp, then across the warps */
#pragma unroll
	for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
		for (int t = 0; t < NT; t++)
		{
			for (int off = CUDA_WARP / 2; off > 0; off >>= 1)
				sum[r][t] += __shfl_xor_sync(0xffffffffu, sum[r][t], off);
			if (lane == 0)
				red[warp][r * NT + t] = sum[r][t];
		}
	__syncthreads();
	if (threadIdx.x < GEMV_ROWS * NT)
	{
		int			r = threadIdx.x / NT;
		int			t = threadIdx.x % NT;
		int			o = o0 + r;
		int			total = 0;

		if (o >= n_out || t >= n_tok)
			return;
#pragma unroll
		for (int wi = 0; wi < GEMV_WARPS; wi++)
			total += red[wi][threadIdx.x];
		if (acc)
			acc[(size_t) t * ldacc + o] = total;
		else
		{
			float		v = epilogue_value(total, xs[t], ws[o], bias, o, act);
			float	   *dst = out + (size_t) t * ldo + o;

			*dst = accumulate ? __fadd_rn(*dst, v) : v;
		}
	}
}

bool
cuda_gemv_i8_fits(const int8_t *xq_dev, int n_tok, const cai_cuda_qmatrix *w)
{
	return n_tok >= 1 && n_tok <= CUDA_GEMV_MAX_TOKENS && w->k % 16 == 0 &&
		((uintptr_t) xq_dev % 16) == 0 && ((uintptr_t) w->q_dev % 16) == 0 &&
		w->n_out_padded % GEMV_ROWS == 0;
}

cai_status
cuda_gemv_i8(cai_cuda_ctx *ctx, const int8_t *xq_dev, const float *xs_dev, int n_tok,
			 const cai_cuda_qmatrix *w, const cai_cuda_epilogue *epi, float *out_dev, int ldo,
			 int32_t *acc_dev, int ldacc, cai_error *err)
{
	int			blocks = div_up(w->n_out, GEMV_ROWS);
	const float *bias = acc_dev ? NULL : epi->bias_dev;
	int			act = acc_dev ? (int) CAI_CUDA_ACT_NONE : (int) epi->activation;
	bool		accumulate = !acc_dev && epi->accumulate;

#define GEMV_LAUNCH(NT) \
	gemv_i8_kernel<NT><<<blocks, GEMV_WARPS * CUDA_WARP, 0, ctx->stream>>>( \
		xq_dev, xs_dev, n_tok, w->q_dev, w->scale_dev, w->n_out, w->k, bias, act, accumulate, \
		out_dev, ldo, acc_dev, ldacc)
	if (n_tok == 1)
		GEMV_LAUNCH(1);
	else if (n_tok == 2)
		GEMV_LAUNCH(2);
	else if (n_tok <= 4)
		GEMV_LAUNCH(4);
	else
		GEMV_LAUNCH(8);
#undef GEMV_LAUNCH
	CUDA_CHECK_LAUNCH(err, "the int8 gemv");
	return CAI_OK;
}
