/*
 * sampling.cu — token selection helpers on the device: greedy argmax per row, and the k best
 * logits per row so that the host's sampler works on a short candidate list.
 *
 * Both use the sampler's total order on candidates: logit descending, then id ascending (so the
 * lowest id wins ties); NaN logits are never chosen.
 */
#include "cuda_internal.cuh"

#define SAMPLE_THREADS 256

/* True when (v, i) comes before (bv, bi) in the order: larger logit, then lower id. */
static __device__ __forceinline__ bool
ranks_before(float v, int i, float bv, int bi)
{
	return v > bv || (v == bv && i < bi);
}

/*
 * The best candidate of a row that ranks strictly after (after_v, after_i), reduced over the
 * block; every thread gets it.  after_i < 0 means no bound.
 */
static __device__ void
block_best_after(const float *row, int n, float after_v, int after_i, float *out_v, int *out_i)
{
	__shared__ float sv[SAMPLE_THREADS / CUDA_WARP];
	__shared__ int si[SAMPLE_THREADS / CUDA_WARP];
	float		bv = -INFINITY;
	int			bi = 0x7fffffff;
	int			lane = threadIdx.x % CUDA_WARP;
	int			warp = threadIdx.x / CUDA_WARP;

	for (int i = threadIdx.x; i < n; i += blockDim.x)
	{
		float		v = row[i];

		if (v != v)
			continue;			/* NaN */
		if (after_i >= 0 && !ranks_before(after_v, after_i, v, i))
			continue;			/* already taken */
		if (ranks_before(v, i, bv, bi))
		{
			bv = v;
			bi = i;
		}
	}
	for (int o = CUDA_WARP / 2; o > 0; o >>= 1)
	{
		float		ov = __shfl_xor_sync(0xffffffffu, bv, o);
		int			oi = __shfl_xor_sync(0xffffffffu, bi, o);

		if (ranks_before(ov, oi, bv, bi))
		{
			bv = ov;
			bi = oi;
		}
	}
	__syncthreads();
	if (lane == 0)
	{
		sv[warp] = bv;
		si[warp] = bi;
	}
	__syncthreads();
	bv = lane < (int) (blockDim.x / CUDA_WARP) ? sv[lane] : -INFINITY;
	bi = lane < (int) (blockDim.x / CUDA_WARP) ? si[lane] : 0x7fffffff;
	for (int o = CUDA_WARP / 2; o > 0; o >>= 1)
	{
		float		ov = __shfl_xor_sync(0xffffffffu, bv, o);
		int			oi = __shfl_xor_sync(0xffffffffu, bi, o);

		if (ranks_before(ov, oi, bv, bi))
		{
			bv = ov;
			bi = oi;
		}
	}
	*out_v = bv;
	*out_i = bi;
}

static __global__ void
argmax_kernel(const float *__restrict__ logits, int n_vocab, int ld, int32_t *__restrict__ ids)
{
	float		v;
	int			i;

	block_best_after(logits + (size_t) blockIdx.x * ld, n_vocab, 0.0f, -1, &v, &i);
	if (threadIdx.x == 0)
		ids[blockIdx.x] = i < n_vocab ? i : -1;
}

/* k rounds of "the best candidate after the last one taken": exact, and k is small. */
static __global__ void
topk_kernel(const float *__restrict__ logits, int n_vocab, int ld, int k,
			float *__restrict__ vals, int32_t *__restrict__ ids)
{
	const float *row = logits + (size_t) blockIdx.x * ld;
	float		last_v = 0.0f;
	int			last_i = -1;

	for (int r = 0; r < k; r++)
	{
		float		v;
		int			i;

		block_best_after(row, n_vocab, last_v, last_i, &v, &i);
		if (i >= n_vocab)
		{
			/* fewer than k candidates (NaNs): pad, the same in every thread */
			if (threadIdx.x == 0)
				for (int p = r; p < k; p++)
				{
					vals[(size_t) blockIdx.x * k + p] = -INFINITY;
					ids[(size_t) blockIdx.x * k + p] = -1;
				}
			break;
		}
		if (threadIdx.x == 0)
		{
			vals[(size_t) blockIdx.x * k + r] = v;
			ids[(size_t) blockIdx.x * k + r] = i;
		}
		last_v = v;
		last_i = i;
	}
}

extern "C" cai_status
cai_cuda_argmax(cai_cuda_ctx *ctx, const float *logits_dev, int n_rows, int n_vocab, int ld,
				int32_t *ids_dev, cai_error *err)
{
	if (n_rows <= 0)
		return CAI_OK;
	argmax_kernel<<<n_rows, SAMPLE_THREADS, 0, ctx->stream>>>(logits_dev, n_vocab, ld, ids_dev);
	CUDA_CHECK_LAUNCH(err, "the argmax kernel");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_topk(cai_cuda_ctx *ctx, const float *logits_dev, int n_rows, int n_vocab, int ld, int k,
			  float *vals_dev, int32_t *ids_dev, cai_error *err)
{
	if (n_rows <= 0)
		return CAI_OK;
	if (k < 1 || k > 64)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "top-k on the device takes 1..64, not %d",
						 k);
	topk_kernel<<<n_rows, SAMPLE_THREADS, 0, ctx->stream>>>(logits_dev, n_vocab, ld, k, vals_dev,
															ids_dev);
	CUDA_CHECK_LAUNCH(err, "the top-k kernel");
	return CAI_OK;
}
