/*
 * gemm_blocks.cu — GEMMs over the file's own block weights (cai_cuda_bmatrix: 4-bit nibbles or
 * signed bytes, a float scale pair per row and block of 32) with activations quantized per
 * block of 32, or for the K-quants per 256 with the scale repeated in each block
 * (cpu/gemm_blocks.h's arithmetic: per block, sa * (ws * isum + wm * asum); the CPU sums a
 * K-quant's super-block in integers first, the same value in another order).
 *
 * Layout.  Row-major by rows, then blocks: a row's blocks are contiguous, so a warp whose lanes
 * take consecutive blocks of one row reads 16 (nibbles) or 32 (bytes) consecutive bytes per lane,
 * one coalesced 512- or 1024-byte run.  Nibble byte j of a block holds element j in its low
 * nibble and element j + 16 in its high one (GGUF's Q4_0 order), so a masked 32-bit word is four
 * consecutive elements ready for dp4a.  The scales are floats, (d * sc) and the min, computed
 * once at repacking: the kernels then do no fp16 or sub-scale decoding in the inner loop.
 *
 * Two kernels: a GEMV for decode (n_tok <= CUDA_GEMV_MAX_TOKENS), which streams the nibbles with
 * dp4a and is bound by memory bandwidth; and a tiled kernel for prefill that widens a tile of
 * weights to int8 in shared memory and multiplies on the int8 tensor cores (WMMA 16x16x16),
 * each k-block of 32 in int32 before its scales take it to a float accumulator (the scales are
 * per 32 inputs, so int32 sums cannot run longer).  Neither is bit-identical to the CPU (the
 * float sums run in another order); tests/gpu bounds the difference.
 */
#include <mma.h>

#include "cuda_internal.cuh"

#define BLK 32					/* inputs per block */
#define GEMV_BLK_WARPS 4		/* warps per block of the GEMV */
#define GEMV_BLK_ROWS 2			/* rows per warp: each activation load serves both */
#define MMA_TOK 64				/* tokens per tile of the prefill kernel */
#define MMA_OUT 64				/* rows per tile */
#define MMA_WARPS 4				/* warp w: tokens [16 w, 16 w + 16) x all 64 rows */

/* ---------------------------------------------------------------------------------------------
 * Activations per block of 32
 * ------------------------------------------------------------------------------------------- */

/*
 * One warp per group of `group` blocks of 32 sharing a scale (the K-quants': 8), a lane per
 * element of each block: cai_quantize_act_blocks' arithmetic (the same maximum, rounded
 * division and product, rintf), so q, s and sum are the CPU's bit for bit.
 */
static __global__ void
quantize_blocks_kernel(const float *__restrict__ x, int n_groups, int group,
					   int8_t *__restrict__ q, float *__restrict__ s, int16_t *__restrict__ sum)
{
	int			grp = blockIdx.x * (blockDim.x / CUDA_WARP) + threadIdx.x / CUDA_WARP;
	int			lane = threadIdx.x % CUDA_WARP;
	size_t		first;
	float		amax = 0.0f,
				inv;

	if (grp >= n_groups)
		return;
	first = (size_t) grp * group;
	for (int b = 0; b < group; b++)
		amax = fmaxf(amax, fabsf(x[(first + b) * BLK + lane]));
	for (int off = CUDA_WARP / 2; off > 0; off >>= 1)
		amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
	inv = amax > 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
	for (int b = 0; b < group; b++)
	{
		size_t		blk = first + b;
		float		v = x[blk * BLK + lane];
		int			qi = 0,
					total;

		if (amax > 0.0f && !isinf(inv))
		{
			v = __fmul_rn(v, inv);
			v = v > -127.0f ? v : -127.0f;
			v = v < 127.0f ? v : 127.0f;
			qi = (int) rintf(v);
		}
		q[blk * BLK + lane] = (int8_t) qi;
		total = qi;
		for (int off = CUDA_WARP / 2; off > 0; off >>= 1)
			total += __shfl_xor_sync(0xffffffffu, total, off);
		if (lane == 0)
		{
			s[blk] = amax > 0.0f && !isinf(inv) ? __fdiv_rn(amax, 127.0f) : 0.0f;
			sum[blk] = (int16_t) total;
		}
	}
}

extern "C" cai_status
cai_cuda_quantize_blocks(cai_cuda_ctx *ctx, const float *x_dev, int n_tok, int k, int group,
						 int8_t *q_dev, float *s_dev, int16_t *sum_dev, cai_error *err)
{
	int			n_groups;
	const int	warps = 8;

	if (group < 1 || k % (BLK * group) != 0)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT,
						 "block quantization needs a multiple of %d inputs (%d)", BLK * group, k);
	n_groups = n_tok * (k / (BLK * group));
	if (n_groups <= 0)
		return CAI_OK;
	quantize_blocks_kernel<<<div_up(n_groups, warps), warps * CUDA_WARP, 0, ctx->stream>>>(
		x_dev, n_groups, group, q_dev, s_dev, sum_dev);
	CUDA_CHECK_LAUNCH(err, "the block quantize kernel");
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Decode: the GEMV
 * ------------------------------------------------------------------------------------------- */

/*
 * The float value of one block: sa * (ws * isum + wm * asum), or with a scale per 16 inputs
 * (Q6_K, no min) sa * (s_lo * isum_lo + s_hi * isum_hi).  Rounded operations, no contraction.
 */
static __device__ __forceinline__ float
block_term(float2 sc, bool split16, int lo, int hi, int asum, float sa)
{
	float		t = split16 ?
		__fadd_rn(__fmul_rn(sc.x, (float) lo), __fmul_rn(sc.y, (float) hi)) :
		__fadd_rn(__fmul_rn(sc.x, (float) (lo + hi)), __fmul_rn(sc.y, (float) asum));

	return __fmul_rn(sa, t);
}

/*
 * Integer sums of one block of one row against one token's 32 levels (a = elements 0..15,
 * b = 16..31): lo over elements 0..15, hi over 16..31.
 */
template <bool NIBBLE>
static __device__ __forceinline__ void
block_dot(const int4 *w, int4 a, int4 b, int *lo, int *hi)
{
	int			l = 0,
				h = 0;

	if (NIBBLE)
	{
		int4		v = w[0];

		l = __dp4a(v.x & 0x0f0f0f0f, a.x, l);
		l = __dp4a(v.y & 0x0f0f0f0f, a.y, l);
		l = __dp4a(v.z & 0x0f0f0f0f, a.z, l);
		l = __dp4a(v.w & 0x0f0f0f0f, a.w, l);
		h = __dp4a((v.x >> 4) & 0x0f0f0f0f, b.x, h);
		h = __dp4a((v.y >> 4) & 0x0f0f0f0f, b.y, h);
		h = __dp4a((v.z >> 4) & 0x0f0f0f0f, b.z, h);
		h = __dp4a((v.w >> 4) & 0x0f0f0f0f, b.w, h);
	}
	else
	{
		int4		v0 = w[0],
					v1 = w[1];

		l = __dp4a(v0.x, a.x, l);
		l = __dp4a(v0.y, a.y, l);
		l = __dp4a(v0.z, a.z, l);
		l = __dp4a(v0.w, a.w, l);
		h = __dp4a(v1.x, b.x, h);
		h = __dp4a(v1.y, b.y, h);
		h = __dp4a(v1.z, b.z, h);
		h = __dp4a(v1.w, b.w, h);
	}
	*lo = l;
	*hi = h;
}

/*
 * Each warp takes GEMV_BLK_ROWS rows; its lanes take the rows' blocks lane, lane + 32, ...
 * (coalesced: consecutive lanes, consecutive blocks of a row), each block's activations loaded
 * once for all the warp's rows.  A lane keeps a float per (row, token) and the warp sums them
 * at the end.  NT: the tokens compiled for (n_tok <= NT).
 */
template <int NT, bool NIBBLE>
static __global__ void __launch_bounds__(GEMV_BLK_WARPS * CUDA_WARP)
gemv_blocks_kernel(const int8_t *__restrict__ xq, const float *__restrict__ xs,
				   const int16_t *__restrict__ xsum, int n_tok, const uint8_t *__restrict__ wq,
				   const float2 *__restrict__ wsc, bool split16, int n_out, int k,
				   const float *__restrict__ bias, float *out, int ldo, bool accumulate)
{
	const int	nb = k / BLK;
	const int	bytes = NIBBLE ? 16 : 32;
	int			lane = threadIdx.x % CUDA_WARP;
	int			o0 = (blockIdx.x * GEMV_BLK_WARPS + threadIdx.x / CUDA_WARP) * GEMV_BLK_ROWS;
	float		acc[GEMV_BLK_ROWS][NT];

	if (o0 >= n_out)
		return;
#pragma unroll
	for (int r = 0; r < GEMV_BLK_ROWS; r++)
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[r][t] = 0.0f;
	for (int b = lane; b < nb; b += CUDA_WARP)
	{
		const int4 *wp[GEMV_BLK_ROWS];
		float2		sc[GEMV_BLK_ROWS];

#pragma unroll
		for (int r = 0; r < GEMV_BLK_ROWS; r++)
		{
			/* a row past n_out reads the last row again and is never stored */
			int			o = o0 + r < n_out ? o0 + r : n_out - 1;

			wp[r] = (const int4 *) (wq + ((size_t) o * nb + b) * bytes);
			sc[r] = __ldg(wsc + (size_t) o * nb + b);
		}
#pragma unroll
		for (int t = 0; t < NT; t++)
		{
			const int4 *xp = (const int4 *) (xq + (size_t) t * k + (size_t) b * BLK);
			int4		a,
						bb;
			float		sa;
			int			asum;

			if (t >= n_tok)
				break;
			a = __ldg(xp);
			bb = __ldg(xp + 1);
			sa = __ldg(xs + (size_t) t * nb + b);
			asum = xsum[(size_t) t * nb + b];
#pragma unroll
			for (int r = 0; r < GEMV_BLK_ROWS; r++)
			{
				int			lo,
							hi;

				block_dot<NIBBLE>(wp[r], a, bb, &lo, &hi);
				acc[r][t] = __fadd_rn(acc[r][t], block_term(sc[r], split16, lo, hi, asum, sa));
			}
		}
	}
#pragma unroll
	for (int r = 0; r < GEMV_BLK_ROWS; r++)
#pragma unroll
		for (int t = 0; t < NT; t++)
		{
			float		v = acc[r][t];
			int			o = o0 + r;

			for (int off = CUDA_WARP / 2; off > 0; off >>= 1)
				v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
			if (lane == 0 && t < n_tok && o < n_out)
			{
				float	   *dst = out + (size_t) t * ldo + o;

				if (bias)
					v = __fadd_rn(v, bias[o]);
				*dst = accumulate ? __fadd_rn(*dst, v) : v;
			}
		}
}

template <bool NIBBLE>
static void
gemv_blocks_launch(cai_cuda_ctx *ctx, const int8_t *xq, const float *xs, const int16_t *xsum,
				   int n_tok, const cai_cuda_bmatrix *w, int n_out, const float *bias, float *out,
				   int ldo, bool accumulate)
{
	int			grid = div_up(n_out, GEMV_BLK_WARPS * GEMV_BLK_ROWS);
	const float2 *sc = (const float2 *) w->sc_dev;

#define GEMV_BLOCKS_LAUNCH(NT) \
	gemv_blocks_kernel<NT, NIBBLE><<<grid, GEMV_BLK_WARPS * CUDA_WARP, 0, ctx->stream>>>( \
		xq, xs, xsum, n_tok, w->q_dev, sc, w->split16, n_out, w->k, bias, out, ldo, accumulate)
	if (n_tok == 1)
		GEMV_BLOCKS_LAUNCH(1);
	else if (n_tok == 2)
		GEMV_BLOCKS_LAUNCH(2);
	else if (n_tok <= 4)
		GEMV_BLOCKS_LAUNCH(4);
	else
		GEMV_BLOCKS_LAUNCH(8);
#undef GEMV_BLOCKS_LAUNCH
}

/* ---------------------------------------------------------------------------------------------
 * Prefill: int8 tensor cores
 * ------------------------------------------------------------------------------------------- */

/*
 * A tile of MMA_TOK tokens x MMA_OUT rows per block.  Per k-block of 32 the block stages the
 * tokens' levels and the rows' levels widened to int8 in shared memory, each as two halves of
 * 16 inputs ([half][row][16]: WMMA wants 32-byte aligned fragments, and a half is one k16 step),
 * then each warp multiplies its 16 tokens by the 4 fragments of 16 rows: one int32 fragment per
 * block of 32 (two, one per half, for a scale per 16), stored to the warp's scratch and scaled
 * into the float accumulators each lane keeps for the elements it owns.
 */
template <bool NIBBLE>
static __global__ void __launch_bounds__(MMA_WARPS * CUDA_WARP)
mma_blocks_kernel(const int8_t *__restrict__ xq, const float *__restrict__ xs,
				  const int16_t *__restrict__ xsum, int n_tok, const uint8_t *__restrict__ wq,
				  const float2 *__restrict__ wsc, bool split16, int n_out, int k,
				  const float *__restrict__ bias, float *out, int ldo, bool accumulate)
{
	using namespace nvcuda;
	__shared__ __align__(128) int8_t sa_q[2][MMA_TOK][16];
	__shared__ __align__(128) int8_t sw_q[2][MMA_OUT][16];
	__shared__ __align__(128) int scratch[MMA_WARPS][2][16 * 16];
	__shared__ float s_xs[MMA_TOK];
	__shared__ int s_xsum[MMA_TOK];
	__shared__ float2 s_wsc[MMA_OUT];
	const int	nb = k / BLK;
	const int	bytes = NIBBLE ? 16 : 32;
	const int	t0 = blockIdx.y * MMA_TOK;
	const int	o0 = blockIdx.x * MMA_OUT;
	const int	tid = threadIdx.x;
	const int	warp = tid / CUDA_WARP;
	const int	lane = tid % CUDA_WARP;
	float		acc[MMA_OUT / 16][8];

#pragma unroll
	for (int n = 0; n < MMA_OUT / 16; n++)
#pragma unroll
		for (int e = 0; e < 8; e++)
			acc[n][e] = 0.0f;
	for (int b = 0; b < nb; b++)
	{
		/* stage: tokens' halves (a thread per 16 bytes), rows' levels, the scales */
		{
			int			row = tid / 2,
						half = tid % 2,
						t = t0 + row;
			int4		v = make_int4(0, 0, 0, 0);

			if (t < n_tok)
				v = __ldg((const int4 *) (xq + (size_t) t * k + (size_t) b * BLK) + half);
			*(int4 *) sa_q[half][row] = v;
		}
		if (tid < MMA_OUT)
		{
			int			o = o0 + tid;
			int4		lo = make_int4(0, 0, 0, 0),
						hi = make_int4(0, 0, 0, 0);
			float2		sc = make_float2(0.0f, 0.0f);

			if (o < n_out)
			{
				const int4 *p = (const int4 *) (wq + ((size_t) o * nb + b) * bytes);

				lo = __ldg(p);
				if (NIBBLE)
				{
					/* widened: low nibbles are inputs 0..15, high nibbles 16..31 */
					hi = make_int4((lo.x >> 4) & 0x0f0f0f0f, (lo.y >> 4) & 0x0f0f0f0f,
								   (lo.z >> 4) & 0x0f0f0f0f, (lo.w >> 4) & 0x0f0f0f0f);
					lo = make_int4(lo.x & 0x0f0f0f0f, lo.y & 0x0f0f0f0f, lo.z & 0x0f0f0f0f,
								   lo.w & 0x0f0f0f0f);
				}
				else
					hi = __ldg(p + 1);
				sc = __ldg(wsc + (size_t) o * nb + b);
			}
			*(int4 *) sw_q[0][tid] = lo;
			*(int4 *) sw_q[1][tid] = hi;
			s_wsc[tid] = sc;
		}
		else if (tid - MMA_OUT < MMA_TOK)
		{
			int			i = tid - MMA_OUT,
						t = t0 + i;

			s_xs[i] = t < n_tok ? xs[(size_t) t * nb + b] : 0.0f;
			s_xsum[i] = t < n_tok ? xsum[(size_t) t * nb + b] : 0;
		}
		__syncthreads();
		{
			wmma::fragment<wmma::matrix_a, 16, 16, 16, signed char, wmma::row_major> fa[2];
			wmma::fragment<wmma::matrix_b, 16, 16, 16, signed char, wmma::col_major> fb;
			wmma::fragment<wmma::accumulator, 16, 16, 16, int> fc[2];

			wmma::load_matrix_sync(fa[0], &sa_q[0][warp * 16][0], 16);
			wmma::load_matrix_sync(fa[1], &sa_q[1][warp * 16][0], 16);
#pragma unroll
			for (int n = 0; n < MMA_OUT / 16; n++)
			{
				wmma::fill_fragment(fc[0], 0);
				wmma::load_matrix_sync(fb, &sw_q[0][n * 16][0], 16);
				wmma::mma_sync(fc[0], fa[0], fb, fc[0]);
				wmma::load_matrix_sync(fb, &sw_q[1][n * 16][0], 16);
				if (split16)
				{
					wmma::fill_fragment(fc[1], 0);
					wmma::mma_sync(fc[1], fa[1], fb, fc[1]);
					wmma::store_matrix_sync(scratch[warp][1], fc[1], 16, wmma::mem_row_major);
				}
				else
					wmma::mma_sync(fc[0], fa[1], fb, fc[0]);
				wmma::store_matrix_sync(scratch[warp][0], fc[0], 16, wmma::mem_row_major);
				__syncwarp();
#pragma unroll
				for (int e = 0; e < 8; e++)
				{
					int			idx = lane + e * CUDA_WARP;
					int			i = warp * 16 + idx / 16;	/* token in the tile */
					int			j = n * 16 + idx % 16;	/* row in the tile */
					int			lo = scratch[warp][0][idx];
					int			hi = split16 ? scratch[warp][1][idx] : 0;

					acc[n][e] = __fadd_rn(acc[n][e], block_term(s_wsc[j], split16, lo, hi,
																s_xsum[i], s_xs[i]));
				}
				__syncwarp();
			}
		}
		__syncthreads();
	}
#pragma unroll
	for (int n = 0; n < MMA_OUT / 16; n++)
#pragma unroll
		for (int e = 0; e < 8; e++)
		{
			int			idx = lane + e * CUDA_WARP;
			int			t = t0 + warp * 16 + idx / 16;
			int			o = o0 + n * 16 + idx % 16;
			float		v = acc[n][e];

			if (t >= n_tok || o >= n_out)
				continue;
			if (bias)
				v = __fadd_rn(v, bias[o]);
			if (accumulate)
				v = __fadd_rn(out[(size_t) t * ldo + o], v);
			out[(size_t) t * ldo + o] = v;
		}
}

extern "C" cai_status
cai_cuda_gemm_blocks(cai_cuda_ctx *ctx, const int8_t *xq_dev, const float *xs_dev,
					 const int16_t *xsum_dev, int n_tok, const cai_cuda_bmatrix *w, int n_out,
					 const float *bias_dev, float *out_dev, int ldo, bool accumulate,
					 cai_cuda_blocks_path path, cai_error *err)
{
	bool		gemv;

	if (n_tok <= 0 || n_out <= 0)
		return CAI_OK;
	if (n_out > w->n_out || w->k % BLK != 0 || ((uintptr_t) xq_dev % 16) != 0)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT,
						 "block gemm: %d rows of %d, k %d, or an unaligned input", n_out, w->n_out,
						 w->k);
	gemv = path == CAI_CUDA_BLOCKS_GEMV ||
		(path == CAI_CUDA_BLOCKS_AUTO && n_tok <= CUDA_GEMV_MAX_TOKENS);
	if (gemv && n_tok > CUDA_GEMV_MAX_TOKENS)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "the block gemv takes at most %d tokens",
						 CUDA_GEMV_MAX_TOKENS);
	if (gemv && w->nibble)
		gemv_blocks_launch<true>(ctx, xq_dev, xs_dev, xsum_dev, n_tok, w, n_out, bias_dev,
								 out_dev, ldo, accumulate);
	else if (gemv)
		gemv_blocks_launch<false>(ctx, xq_dev, xs_dev, xsum_dev, n_tok, w, n_out, bias_dev,
								  out_dev, ldo, accumulate);
	else
	{
		dim3		grid(div_up(n_out, MMA_OUT), div_up(n_tok, MMA_TOK));
		const float2 *sc = (const float2 *) w->sc_dev;

		if (w->nibble)
			mma_blocks_kernel<true><<<grid, MMA_WARPS * CUDA_WARP, 0, ctx->stream>>>(
				xq_dev, xs_dev, xsum_dev, n_tok, w->q_dev, sc, w->split16, n_out, w->k,
				bias_dev, out_dev, ldo, accumulate);
		else
			mma_blocks_kernel<false><<<grid, MMA_WARPS * CUDA_WARP, 0, ctx->stream>>>(
				xq_dev, xs_dev, xsum_dev, n_tok, w->q_dev, sc, w->split16, n_out, w->k,
				bias_dev, out_dev, ldo, accumulate);
	}
	CUDA_CHECK_LAUNCH(err, "the block gemm");
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Embedding
 * ------------------------------------------------------------------------------------------- */

/* x[t, i] = ws * q + wm of row ids[t]: a product exact in float, then one rounded add. */
static __global__ void
embed_blocks_kernel(const uint8_t *__restrict__ wq, const float2 *__restrict__ wsc, bool nibble,
					bool split16, int k, const int32_t *__restrict__ ids, float *x)
{
	const int	nb = k / BLK;
	int			t = blockIdx.y;
	int			row = ids[t];

	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < k; i += gridDim.x * blockDim.x)
	{
		int			b = i / BLK,
					e = i % BLK,
					q;
		float2		sc = wsc[(size_t) row * nb + b];
		float		v;

		if (nibble)
		{
			uint8_t		byte = wq[((size_t) row * nb + b) * 16 + e % 16];

			q = e < 16 ? (byte & 15) : (byte >> 4);
		}
		else
			q = (int8_t) wq[((size_t) row * nb + b) * 32 + e];
		if (split16)
			v = __fmul_rn(e < 16 ? sc.x : sc.y, (float) q);
		else
			v = __fadd_rn(__fmul_rn(sc.x, (float) q), sc.y);
		x[(size_t) t * k + i] = v;
	}
}

extern "C" cai_status
cai_cuda_embed_blocks(cai_cuda_ctx *ctx, const cai_cuda_bmatrix *table, const int32_t *ids_dev,
					  int n_tok, float *x_dev, cai_error *err)
{
	dim3		grid(div_up(table->k, 256), n_tok);

	if (n_tok <= 0)
		return CAI_OK;
	embed_blocks_kernel<<<grid, 256, 0, ctx->stream>>>(table->q_dev, (const float2 *) table->sc_dev,
													   table->nibble, table->split16, table->k,
													   ids_dev, x_dev);
	CUDA_CHECK_LAUNCH(err, "the block embedding kernel");
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Device copies (tests and benchmarks; the backend uploads through its page-locked staging)
 * ------------------------------------------------------------------------------------------- */

static cai_status
bmatrix_copy(const cai_cuda_bmatrix_host *h, const char *what, cai_cuda_bmatrix *out,
			 cai_error *err)
{
	CUDA_CHECK(cudaMalloc((void **) &out->q_dev, h->q_bytes), err, what);
	CUDA_CHECK(cudaMalloc((void **) &out->sc_dev, h->sc_bytes), err, what);
	CUDA_CHECK(cudaMemcpy(out->q_dev, h->q, h->q_bytes, cudaMemcpyHostToDevice), err, what);
	CUDA_CHECK(cudaMemcpy(out->sc_dev, h->sc, h->sc_bytes, cudaMemcpyHostToDevice), err, what);
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_bmatrix_upload(cai_cuda_ctx *ctx, const cai_cuda_bmatrix_host *h, const char *what,
						cai_cuda_bmatrix *out, cai_error *err)
{
	cai_status	st;

	memset(out, 0, sizeof(*out));
	out->n_out = h->n_out;
	out->k = h->k;
	out->nibble = h->nibble;
	out->split16 = h->split16;
	if ((st = bmatrix_copy(h, what, out, err)) != CAI_OK)
		cai_cuda_bmatrix_free(ctx, out);
	return st;
}

extern "C" void
cai_cuda_bmatrix_free(cai_cuda_ctx *ctx, cai_cuda_bmatrix *m)
{
	(void) ctx;
	cudaFree(m->q_dev);
	cudaFree(m->sc_dev);
	m->q_dev = NULL;
	m->sc_dev = NULL;
}
