/*
 * sampling.cu — token selection helpers on the device: greedy argmax per row, and the k best
 * logits per row so that the host's sampler works on a short candidate list.
 *
 * Both use the sampler's total order on candidates: logit descending, then id ascending (so the
 * lowest id wins ties); NaN logits are never chosen.  A row with no candidate (all NaN) gets -1.
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

/*
 * The sampler's order as one 64-bit key, larger first: the logit's bits made monotone (-0 taken
 * as +0, which compares equal to it), then the id inverted, so that the lower id of equal logits
 * has the larger key.  Every real key is above 0, which stands for "no candidate".
 */
static __device__ __forceinline__ unsigned long long
rank_key(float v, int i)
{
	unsigned int u = v == 0.0f ? 0u : __float_as_uint(v);

	u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
	return ((unsigned long long) u << 32) | (unsigned int) ~i;
}

#define ARGMAX_CHUNK 4096

/*
 * Greedy argmax over a grid of (chunk, row): each block's best key joins the row's by atomicMax,
 * a maximum that is the same in any order, so a long vocabulary is read by many SMs at once.
 */
static __global__ void
argmax_chunk_kernel(const float *__restrict__ logits, int n_vocab, int ld,
					unsigned long long *__restrict__ best)
{
	const float *row = logits + (size_t) blockIdx.y * ld;
	int			end = (blockIdx.x + 1) * ARGMAX_CHUNK < n_vocab ? (blockIdx.x + 1) * ARGMAX_CHUNK :
		n_vocab;
	unsigned long long key = 0;

	for (int i = blockIdx.x * ARGMAX_CHUNK + threadIdx.x; i < end; i += blockDim.x)
	{
		float		v = row[i];
		unsigned long long k;

		if (v != v)
			continue;			/* NaN */
		k = rank_key(v, i);
		key = k > key ? k : key;
	}
	for (int o = CUDA_WARP / 2; o > 0; o >>= 1)
	{
		unsigned long long k = __shfl_xor_sync(0xffffffffu, key, o);

		key = k > key ? k : key;
	}
	if (threadIdx.x % CUDA_WARP == 0 && key != 0)
		atomicMax(&best[blockIdx.y], key);
}

static __global__ void
argmax_finish_kernel(const unsigned long long *__restrict__ best, int n_rows,
					 int32_t *__restrict__ ids)
{
	int			r = blockIdx.x * blockDim.x + threadIdx.x;

	if (r < n_rows)
		ids[r] = best[r] == 0 ? -1 : (int32_t) ~(unsigned int) (best[r] & 0xffffffffu);
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
	cai_status	st;

	if (n_rows <= 0)
		return CAI_OK;
	if (n_rows > 65535)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "argmax: too many rows (%d)", n_rows);
	st = cuda_scratch_reserve(ctx, &ctx->argmax_best, &ctx->argmax_best_elems, (size_t) n_rows,
							  sizeof(unsigned long long), "the argmax keys", err);
	if (st != CAI_OK)
		return st;
	CUDA_CHECK(cudaMemsetAsync(ctx->argmax_best, 0, (size_t) n_rows * sizeof(unsigned long long),
							   ctx->stream), err, "the argmax keys");
	argmax_chunk_kernel<<<dim3(div_up(n_vocab, ARGMAX_CHUNK), n_rows), SAMPLE_THREADS, 0,
		ctx->stream>>>(logits_dev, n_vocab, ld, (unsigned long long *) ctx->argmax_best);
	CUDA_CHECK_LAUNCH(err, "the argmax kernel");
	argmax_finish_kernel<<<div_up(n_rows, SAMPLE_THREADS), SAMPLE_THREADS, 0, ctx->stream>>>(
		(const unsigned long long *) ctx->argmax_best, n_rows, ids_dev);
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
