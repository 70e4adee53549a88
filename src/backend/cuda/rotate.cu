/*
 * rotate.cu — the int8 path's activation rotation (backend.h's cai_rotation): Walsh-Hadamard
 * butterflies within each chunk of n_pow2 values, the mix of a vector's n_mix chunks, the
 * 1/sqrt(n) norm; optionally followed by the row's per-token int8 quantization.
 *
 * Results are cai_op_rotate_vec's and cai_quantize_act_i8's bit for bit.  backend.h fixes the
 * evaluation order, and each value here goes through exactly that sequence of correctly rounded
 * float operations (the __f*_rn intrinsics forbid contraction): the butterflies of a stage are
 * independent pairs (a + b, a - b), so doing a stage's pairs in parallel changes no value; the
 * mix of each output sums its n_mix products in chunk order in one thread; the norm is one
 * product at the end (cai_op_rotate_vec folds it into its last butterfly store, the same
 * rounding of the same operands).
 *
 * Blocks per token: a group of the token's vectors is loaded into shared memory, its butterfly
 * stages run with a barrier between stages, and the rotated values go back to x in place (the
 * CPU backend rotates in place as well, quantizing or not).  With quantization and one block per
 * token, the block then reduces max |value| over the whole row and quantizes what it wrote: the
 * barrier in block_max makes the block's own global writes visible to all its threads.  A step
 * of few tokens spreads a row's vectors over several blocks instead, whose maxima meet in an
 * atomic max and a second kernel quantizes.
 */
#include "cuda_internal.cuh"

#define ROTATE_THREADS_MAX 1024

/* Floats of shared memory a group of vectors may take when vectors are small (16 KiB). */
#define ROTATE_GROUP_FLOATS 4096

/* Below this many tokens a block takes fewer vectors, so that a row's vectors spread over SMs. */
#define ROTATE_FEW_TOKENS 32
#define ROTATE_FEW_TOKENS_FLOATS 512

/*
 * blockIdx.y the token; blockIdx.x a share of its groups of vectors.  With q and one block per
 * token, the block quantizes its row itself; with several, each block leaves its max |value| in
 * amax[t] (as bits: the order of non-negative floats is their bits' order, so atomicMax is the
 * exact max in any order) and quantize_rotated_kernel quantizes after.
 */
static __global__ void
rotate_kernel(float *x, int ldx, int n_vec, int n, int log2_pow2, int n_mix,
			  const float *__restrict__ mix, float norm, int group, int8_t *__restrict__ q,
			  float *__restrict__ s, unsigned int *__restrict__ amax_bits)
{
	extern __shared__ float z[];
	__shared__ float red[ROTATE_THREADS_MAX / CUDA_WARP];
	int			t = blockIdx.y;
	int			n_pow2 = 1 << log2_pow2;
	float	   *row = x + (size_t) t * ldx;
	int			width = n_vec * n;
	float		amax = 0.0f;
	float		scale = 0.0f,
				inv = 0.0f;
	bool		nonzero;

	for (int v0 = blockIdx.x * group; v0 < n_vec; v0 += gridDim.x * group)
	{
		int			len = (n_vec - v0 < group ? n_vec - v0 : group) * n;
		float	   *vec = row + (size_t) v0 * n;

		__syncthreads();		/* the previous group's reads of z are done */
		for (int i = threadIdx.x; i < len; i += blockDim.x)
			z[i] = vec[i];

		/*
		 * stage h = 2^lh: pairs (i, i + h) with (i & h) == 0; chunks start at multiples of
		 * n_pow2, which 2h divides, so numbering the pairs over the whole group stays inside
		 * chunks
		 */
		for (int lh = 0; lh < log2_pow2; lh++)
		{
			int			h = 1 << lh;

			__syncthreads();
			for (int k = threadIdx.x; k < len / 2; k += blockDim.x)
			{
				int			i = ((k >> lh) << (lh + 1)) + (k & (h - 1));
				float		a = z[i],
							b = z[i + h];

				z[i] = __fadd_rn(a, b);
				z[i + h] = __fsub_rn(a, b);
			}
		}
		__syncthreads();

		for (int i = threadIdx.x; i < len; i += blockDim.x)
		{
			float		y;

			if (n_mix == 1)
				y = __fmul_rn(z[i], norm);
			else
			{
				/* y[c, j] = (mix[c][0] z[0, j] + mix[c][1] z[1, j] + ...) * norm, c' in order */
				int			e = i % n;
				int			c = e / n_pow2;
				const float *zj = z + (i - e) + e % n_pow2;
				const float *mc = mix + (size_t) c * n_mix;
				float		acc = __fmul_rn(mc[0], zj[0]);

				for (int c2 = 1; c2 < n_mix; c2++)
					acc = __fadd_rn(acc, __fmul_rn(mc[c2], zj[(size_t) c2 * n_pow2]));
				y = __fmul_rn(acc, norm);
			}
			vec[i] = y;
			amax = fmaxf(amax, fabsf(y));
		}
	}
	if (!q)
		return;
	amax = block_max(amax, red);
	if (gridDim.x > 1)
	{
		if (threadIdx.x == 0)
			atomicMax(&amax_bits[t], __float_as_uint(amax));
		return;
	}
	nonzero = quant_row_scale(amax, &scale, &inv);
	if (threadIdx.x == 0)
		s[t] = nonzero ? scale : 0.0f;
	for (int i = threadIdx.x; i < width; i += blockDim.x)
		q[(size_t) t * width + i] = nonzero ? quant_one(row[i], inv) : 0;
}

/* The rows rotated by several blocks each, quantized with their max (blockIdx.y the token). */
static __global__ void
quantize_rotated_kernel(const float *__restrict__ x, int ldx, int width,
						const unsigned int *__restrict__ amax_bits, int8_t *__restrict__ q,
						float *__restrict__ s)
{
	int			t = blockIdx.y;
	int			i = blockIdx.x * blockDim.x + threadIdx.x;
	float		scale = 0.0f,
				inv = 0.0f;
	bool		nonzero = quant_row_scale(__uint_as_float(amax_bits[t]), &scale, &inv);

	if (blockIdx.x == 0 && threadIdx.x == 0)
		s[t] = nonzero ? scale : 0.0f;
	if (i < width)
		q[(size_t) t * width + i] = nonzero ? quant_one(x[(size_t) t * ldx + i], inv) : 0;
}

/*
 * Vectors of n floats one block rotates at a time: up to ROTATE_GROUP_FLOATS, or for a step of
 * few tokens up to ROTATE_FEW_TOKENS_FLOATS, so that a row's vectors spread over more blocks.
 */
static int
rotate_group(int n, int n_vec, int n_tok)
{
	int			g = (n_tok < ROTATE_FEW_TOKENS ? ROTATE_FEW_TOKENS_FLOATS : ROTATE_GROUP_FLOATS) / n;

	if (g < 1)
		g = 1;
	return g < n_vec ? g : n_vec;
}

/*
 * Called once by cai_cuda_ctx_create: lets the kernel take all the shared memory a block may have,
 * for vectors longer than the default 48 KiB hold (function attributes are set before any launch,
 * never while a graph is being captured).
 */
cai_status
cuda_rotate_init(cai_cuda_ctx *ctx, cai_error *err)
{
	if (ctx->prop.sharedMemPerBlockOptin > 48 * 1024)
		CUDA_CHECK(cudaFuncSetAttribute(rotate_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
										(int) (ctx->prop.sharedMemPerBlockOptin -
											   ROTATE_THREADS_MAX / CUDA_WARP * sizeof(float))),
				   err, "the rotation kernel's shared memory");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_rotate(cai_cuda_ctx *ctx, const cai_cuda_rotation *rot, float *x_dev, int ldx,
				int n_tok, int n_vec, int8_t *q_dev, float *s_dev, cai_error *err)
{
	int			group,
				threads,
				blocks,
				log2_pow2 = 0;
	size_t		smem,
				limit;

	if (n_tok <= 0 || n_vec <= 0)
		return CAI_OK;
	if (rot->n_pow2 < 1 || (rot->n_pow2 & (rot->n_pow2 - 1)) != 0 || rot->n_mix < 1 ||
		rot->n != rot->n_pow2 * rot->n_mix)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT,
						 "rotate: %d values are not %d (a power of two) times %d chunks", rot->n,
						 rot->n_pow2, rot->n_mix);
	if (rot->n_mix > 1 && !rot->mix_dev)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "rotate: %d chunks without a mix table",
						 rot->n_mix);
	if ((long) n_vec * rot->n > ldx)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT,
						 "rotate: %d vectors of %d do not fit rows of %d", n_vec, rot->n, ldx);
	if (q_dev && !s_dev)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "rotate: q without s");
	while ((1 << log2_pow2) < rot->n_pow2)
		log2_pow2++;
	group = rotate_group(rot->n, n_vec, n_tok);
	smem = (size_t) group * rot->n * sizeof(float);
	limit = ctx->prop.sharedMemPerBlockOptin > 48 * 1024 ?
		ctx->prop.sharedMemPerBlockOptin - ROTATE_THREADS_MAX / CUDA_WARP * sizeof(float) :
		48 * 1024;
	if (smem > limit)
		return cuda_fail(err, CAI_ERR_UNSUPPORTED,
						 "rotate: vectors of %d floats exceed a block's shared memory", rot->n);
	threads = (group * rot->n / 2 + CUDA_WARP - 1) / CUDA_WARP * CUDA_WARP;
	threads = threads > ROTATE_THREADS_MAX ? ROTATE_THREADS_MAX :
		(threads < CUDA_WARP ? CUDA_WARP : threads);
	blocks = div_up(n_vec, group);
	if (n_tok > 65535)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "rotate: too many tokens (%d)", n_tok);
	if (q_dev && blocks > 1)
	{
		cai_status	st = cuda_scratch_reserve(ctx, &ctx->rotate_amax, &ctx->rotate_amax_elems,
											  (size_t) n_tok, sizeof(unsigned int),
											  "the rotation's row maxima", err);

		if (st != CAI_OK)
			return st;
		CUDA_CHECK(cudaMemsetAsync(ctx->rotate_amax, 0, (size_t) n_tok * sizeof(unsigned int),
								   ctx->stream), err, "the rotation's row maxima");
	}
	rotate_kernel<<<dim3(blocks, n_tok), threads, smem, ctx->stream>>>(
		x_dev, ldx, n_vec, rot->n, log2_pow2, rot->n_mix, rot->mix_dev, rot->norm, group, q_dev,
		s_dev, (unsigned int *) ctx->rotate_amax);
	CUDA_CHECK_LAUNCH(err, "the rotation kernel");
	if (q_dev && blocks > 1)
	{
		int			width = n_vec * rot->n;

		quantize_rotated_kernel<<<dim3(div_up(width, 256), n_tok), 256, 0, ctx->stream>>>(
			x_dev, ldx, width, (const unsigned int *) ctx->rotate_amax, q_dev, s_dev);
		CUDA_CHECK_LAUNCH(err, "the rotation's quantization");
	}
	return CAI_OK;
}
