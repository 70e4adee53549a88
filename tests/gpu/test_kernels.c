/*
 * test_kernels.c — each CUDA kernel against the engine's CPU code (cpu/gemm.c, cpu/ops.c, the
 * CPU backend's rotate, the sampler's ordering), element by element.
 *
 * Tolerances: the int8 GEMM's int32 accumulators are compared for equality, and every kernel
 * that replays a CPU kernel (epilogue, quantization, RMSNorm and its residual add, RoPE, SwiGLU,
 * GeGLU, rotation, embedding and its scale) must give the CPU's floats bit for bit.  Only the
 * float reference GEMM (cuBLASLt fp32, another summation order) is compared with a tolerance:
 * |gpu - cpu| <= 1e-5 * sum_i |x_i w_i| + 1e-6, a few units of fp32 rounding on the magnitude of
 * the terms; and the device-built rotary table (double precision on both sides, CUDA's libdevice
 * against glibc) within 2.5e-7.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/gemm.h"
#include "cpu/ops.h"
#include "threadpool.h"
#include "backend.h"
#include "gpu_util.h"
#include "quant.h"
#include "test.h"

/* A host int8 weight matrix with random values and positive per-row scales. */
typedef struct host_qmatrix
{
	cai_cpu_qmatrix m;		/* the CPU reference reads it row-major */
	int8_t	   *q;
	float	   *scale;
} host_qmatrix;

static bool
host_qmatrix_make(gpu_rng *r, int n_out, int k, host_qmatrix *h)
{
	h->q = malloc((size_t) n_out * k);
	h->scale = malloc((size_t) n_out * sizeof(float));
	if (!h->q || !h->scale)
		return false;
	gpu_fill_i8(r, h->q, (size_t) n_out * k);
	gpu_fill_f32(r, h->scale, (size_t) n_out, 1e-4f, 2e-2f);
	h->m.n_out = n_out;
	h->m.k = k;
	h->m.q = h->q;
	h->m.scale = h->scale;
	h->m.packed = false;		/* row-major, as uploaded */
	return true;
}

static void
host_qmatrix_free(host_qmatrix *h)
{
	free(h->q);
	free(h->scale);
}

TEST(gpu_gemm_i8_accumulators_exact)
{
	static const int shapes[][3] = {	/* n_out, k, n_tok */
		{64, 64, 1}, {70, 576, 3}, {1536, 576, 17}, {576, 1536, 64}, {4096, 576, 300},
		{49152, 576, 2},
	};
	gpu_rng		r;

	gpu_rng_seed(&r, 1);
	for (int pass = 0; pass < 2; pass++)
	{
		/* pass 1: the dp4a fallback that runs when cuBLASLt has no int8 kernel for a shape */
		if (pass == 1)
			setenv("CAI_CUDA_GEMM", "dp4a", 1);
		for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
		{
			int			m = shapes[s][0],
						k = shapes[s][1],
						n = shapes[s][2];
			host_qmatrix w;
			cai_cuda_qmatrix dw;
			int8_t	   *x = malloc((size_t) n * k);
			int32_t    *ref = malloc((size_t) n * m * sizeof(int32_t));
			int32_t    *got;
			int			ld;
			cai_error	err;

			if (!x || !ref || !host_qmatrix_make(&r, m, k, &w))
			{
				CHECK_MSG(false, "out of memory");
				return;
			}
			gpu_fill_i8(&r, x, (size_t) n * k);
			for (int t = 0; t < n; t++)
				for (int o = 0; o < m; o++)
				{
					int32_t		acc = 0;

					for (int i = 0; i < k; i++)
						acc += (int32_t) x[(size_t) t * k + i] * w.q[(size_t) o * k + i];
					ref[(size_t) t * m + o] = acc;
				}
			if (gpu_ok(cai_cuda_qmatrix_upload(gpu_ctx(), w.q, w.scale, m, k, "test", &dw, &err),
					   &err, "qmatrix upload"))
			{
				int32_t    *dacc;
				int8_t	   *dx = gpu_upload(x, (size_t) n * k);

				ld = dw.n_out_padded;
				dacc = gpu_alloc((size_t) n * ld * sizeof(int32_t));
				got = malloc((size_t) n * ld * sizeof(int32_t));
				if (dx && dacc && got &&
					gpu_ok(cai_cuda_gemm_i8_acc(gpu_ctx(), dx, n, &dw, dacc, ld, &err), &err,
						   "gemm") &&
					gpu_download(got, dacc, (size_t) n * ld * sizeof(int32_t)))
				{
					for (int t = 0; t < n; t++)
						if (!gpu_same_i32(got + (size_t) t * ld, ref + (size_t) t * m, m,
										  pass ? "dp4a accumulators" : "cublaslt accumulators"))
							break;
				}
				free(got);
				cai_cuda_qmatrix_free(gpu_ctx(), &dw);
			}
			host_qmatrix_free(&w);
			free(x);
			free(ref);
		}
	}
	unsetenv("CAI_CUDA_GEMM");
}

/*
 * The engine's GEMM shapes (SmolLM2-135M, Llama-1B, Llama-8B: fused QKV, output, gate/up, down,
 * LM head) at the batch sizes a step has, decode's n = 1 included, all run on cuBLASLt: a
 * dp4a fallback there would be a silent slow path.
 */
TEST(gpu_gemm_i8_no_fallback_on_model_shapes)
{
	static const int shapes[][2] = {	/* n_out, k */
		{960, 576}, {576, 576}, {3072, 576}, {576, 1536}, {49152, 576},
		{3072, 2048}, {2048, 2048}, {16384, 2048}, {2048, 8192},
		{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096},
	};
	static const int batches[] = {1, 2, 3, 16, 17, 64, 100, 256, 2048};
	uint64_t	before = cai_cuda_gemm_fallback_count(gpu_ctx());
	int			max_n = batches[sizeof(batches) / sizeof(batches[0]) - 1];

	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
	{
		int			m = shapes[s][0],
					k = shapes[s][1];
		cai_cuda_qmatrix dw;
		cai_error	err;
		int8_t	   *dx;
		int32_t    *dacc;

		if (!gpu_ok(cai_cuda_qmatrix_random(gpu_ctx(), m, k, 5 + (int) s, "test", &dw, &err), &err,
					"random qmatrix"))
			return;
		dx = gpu_alloc((size_t) max_n * k);
		dacc = gpu_alloc((size_t) max_n * dw.n_out_padded * sizeof(int32_t));
		if (!dx || !dacc)
		{
			CHECK_MSG(false, "out of device memory");
			cai_cuda_qmatrix_free(gpu_ctx(), &dw);
			return;
		}
		for (size_t b = 0; b < sizeof(batches) / sizeof(batches[0]); b++)
		{
			uint64_t	n0 = cai_cuda_gemm_fallback_count(gpu_ctx());

			if (!gpu_ok(cai_cuda_gemm_i8_acc(gpu_ctx(), dx, batches[b], &dw, dacc, dw.n_out_padded,
											 &err), &err, "gemm"))
				break;
			if (cai_cuda_gemm_fallback_count(gpu_ctx()) != n0)
			{
				fprintf(stderr, "    dp4a fallback at m=%d k=%d n=%d\n", m, k, batches[b]);
				CHECK_MSG(false, "an engine shape fell back to the dp4a kernel");
			}
		}
		cai_cuda_qmatrix_free(gpu_ctx(), &dw);
	}
	CHECK_EQ_INT((int) (cai_cuda_gemm_fallback_count(gpu_ctx()) - before), 0);
}

/*
 * Operands that start mid-allocation (4- and 16-byte aligned views, as row slices and column
 * blocks are) still give exact accumulators: the heuristic is told their real alignment, and
 * whatever runs must be right.
 */
TEST(gpu_gemm_i8_unaligned_views_exact)
{
	static const int offsets[] = {4, 16, 36};
	const int	m = 1536,
				k = 576,
				n = 19;
	gpu_rng		r;
	host_qmatrix w;
	cai_cuda_qmatrix dw;
	cai_error	err;
	int8_t	   *x = malloc((size_t) n * k);
	int32_t    *ref = malloc((size_t) n * m * sizeof(int32_t));

	gpu_rng_seed(&r, 3);
	if (!x || !ref || !host_qmatrix_make(&r, m, k, &w))
	{
		CHECK_MSG(false, "out of memory");
		return;
	}
	gpu_fill_i8(&r, x, (size_t) n * k);
	for (int t = 0; t < n; t++)
		for (int o = 0; o < m; o++)
		{
			int32_t		acc = 0;

			for (int i = 0; i < k; i++)
				acc += (int32_t) x[(size_t) t * k + i] * w.q[(size_t) o * k + i];
			ref[(size_t) t * m + o] = acc;
		}
	if (gpu_ok(cai_cuda_qmatrix_upload(gpu_ctx(), w.q, w.scale, m, k, "test", &dw, &err), &err,
			   "qmatrix upload"))
	{
		int			ld = dw.n_out_padded;
		int8_t	   *dx_base = gpu_alloc((size_t) n * k + 64);
		int32_t    *dacc_base = gpu_alloc(((size_t) n * ld + 64) * sizeof(int32_t));
		int32_t    *got = malloc((size_t) n * ld * sizeof(int32_t));

		for (size_t o = 0; o < sizeof(offsets) / sizeof(offsets[0]) && dx_base && dacc_base && got; o++)
		{
			int8_t	   *dx = dx_base + offsets[o];
			int32_t    *dacc = dacc_base + offsets[o] / 4;

			if (!gpu_ok(cai_cuda_upload_sync(gpu_ctx(), dx, x, (size_t) n * k, &err), &err,
						"upload") ||
				!gpu_ok(cai_cuda_gemm_i8_acc(gpu_ctx(), dx, n, &dw, dacc, ld, &err), &err, "gemm") ||
				!gpu_download(got, dacc, (size_t) n * ld * sizeof(int32_t)))
				break;
			for (int t = 0; t < n; t++)
				if (!gpu_same_i32(got + (size_t) t * ld, ref + (size_t) t * m, m,
								  "accumulators of an unaligned view"))
					break;
		}
		free(got);
		cai_cuda_qmatrix_free(gpu_ctx(), &dw);
	}
	host_qmatrix_free(&w);
	free(x);
	free(ref);
}

/* One epilogue configuration against cai_gemm_i8 (+ quantization, + SiLU). */
static void
check_gemm_epilogue(gpu_rng *r, cai_threadpool *pool, int m, int k, int n, int ldo, bool bias,
					bool accumulate, bool requant, bool silu)
{
	host_qmatrix w;
	cai_cuda_qmatrix dw;
	cai_cuda_epilogue epi;
	float	   *x = malloc((size_t) n * k * sizeof(float));
	int8_t	   *xq = malloc((size_t) n * k);
	float	   *xs = malloc((size_t) n * sizeof(float));
	float	   *b = malloc((size_t) m * sizeof(float));
	float	   *out0 = malloc((size_t) n * ldo * sizeof(float));
	float	   *cpu = malloc((size_t) n * ldo * sizeof(float));
	float	   *got = malloc((size_t) n * ldo * sizeof(float));
	float	   *ones = malloc((size_t) m * sizeof(float));
	int8_t	   *cq = malloc((size_t) n * m);
	float	   *cs = malloc((size_t) n * sizeof(float));
	int8_t	   *gq = malloc((size_t) n * m);
	float	   *gs = malloc((size_t) n * sizeof(float));
	float	   *dout;
	cai_error	err;

	if (!x || !xq || !xs || !b || !out0 || !cpu || !got || !ones || !cq || !cs || !gq || !gs ||
		!host_qmatrix_make(r, m, k, &w))
	{
		CHECK_MSG(false, "out of memory");
		goto done;
	}
	gpu_fill_f32(r, x, (size_t) n * k, -3.0f, 3.0f);
	memset(x + (size_t) (n - 1) * k, 0, (size_t) k * sizeof(float));	/* a zero token row */
	if (n > 1)
		x[0] = 1e30f;			/* a row dominated by one huge value */
	cai_quantize_act_i8(x, n, k, xq, xs);
	gpu_fill_f32(r, b, (size_t) m, -1.0f, 1.0f);
	gpu_fill_f32(r, out0, (size_t) n * ldo, -5.0f, 5.0f);
	for (int i = 0; i < m; i++)
		ones[i] = 1.0f;

	/* the cpu: the engine's gemm, then (for the fused extras) its own activation and quantizer */
	memcpy(cpu, out0, (size_t) n * ldo * sizeof(float));
	cai_gemm_i8(pool, xq, xs, n, &w.m, bias ? b : NULL, cpu, ldo, accumulate && !silu);
	if (silu)
		for (int t = 0; t < n; t++)
			cai_op_swiglu_row(cpu + (size_t) t * ldo, ones, m, cpu + (size_t) t * ldo);
	if (requant)
		for (int t = 0; t < n; t++)
			cai_quantize_act_i8(cpu + (size_t) t * ldo, 1, m, cq + (size_t) t * m, cs + t);

	if (!gpu_ok(cai_cuda_qmatrix_upload(gpu_ctx(), w.q, w.scale, m, k, "test", &dw, &err), &err,
				"qmatrix upload"))
		goto done;
	memset(&epi, 0, sizeof(epi));
	epi.bias_dev = bias ? gpu_upload(b, (size_t) m * sizeof(float)) : NULL;
	epi.accumulate = accumulate && !silu;
	epi.activation = silu ? CAI_CUDA_ACT_SILU : CAI_CUDA_ACT_NONE;
	epi.q_out_dev = requant ? gpu_alloc((size_t) n * m) : NULL;
	epi.s_out_dev = requant ? gpu_alloc((size_t) n * sizeof(float)) : NULL;
	dout = gpu_upload(out0, (size_t) n * ldo * sizeof(float));
	if (dout &&
		gpu_ok(cai_cuda_gemm_i8(gpu_ctx(), gpu_upload(xq, (size_t) n * k),
								gpu_upload(xs, (size_t) n * sizeof(float)), n, &dw, dout, ldo,
								&epi, &err), &err, "gemm") &&
		gpu_download(got, dout, (size_t) n * ldo * sizeof(float)))
	{
		gpu_same_f32(got, cpu, (size_t) n * ldo, "gemm output");
		if (requant && gpu_download(gq, epi.q_out_dev, (size_t) n * m) &&
			gpu_download(gs, epi.s_out_dev, (size_t) n * sizeof(float)))
		{
			gpu_same_i8(gq, cq, (size_t) n * m, "requantized output");
			gpu_same_f32(gs, cs, (size_t) n, "requantized scales");
		}
	}
	cai_cuda_qmatrix_free(gpu_ctx(), &dw);
done:
	host_qmatrix_free(&w);
	free(x);
	free(xq);
	free(xs);
	free(b);
	free(out0);
	free(cpu);
	free(got);
	free(ones);
	free(cq);
	free(cs);
	free(gq);
	free(gs);
}

TEST(gpu_gemm_i8_epilogue_bit_exact)
{
	cai_threadpool *pool = cai_threadpool_create(2);
	gpu_rng		r;

	gpu_rng_seed(&r, 2);
	/* m, k, n, ldo, bias, accumulate, requant, silu */
	check_gemm_epilogue(&r, pool, 64, 64, 1, 64, false, false, false, false);
	check_gemm_epilogue(&r, pool, 70, 576, 5, 75, true, false, false, false);
	check_gemm_epilogue(&r, pool, 576, 1536, 33, 576, false, true, false, false);
	check_gemm_epilogue(&r, pool, 1728, 576, 9, 1728, true, false, true, false);
	check_gemm_epilogue(&r, pool, 576, 576, 17, 580, true, true, true, false);
	check_gemm_epilogue(&r, pool, 1536, 576, 4, 1536, true, false, true, true);
	/* decode sizes (the fused gemv): every token count to 8, padding rows, an odd ldo */
	for (int n = 1; n <= 8; n++)
		check_gemm_epilogue(&r, pool, 70, 1536, n, 75, n % 2 == 0, n % 3 != 0, n % 4 == 1, n % 2 == 1);
	cai_threadpool_free(pool);
}

TEST(gpu_gemm_f32_near_cpu)
{
	cai_threadpool *pool = cai_threadpool_create(2);
	static const int shapes[][4] = {{64, 64, 3, 64}, {577, 576, 17, 600}, {1536, 576, 40, 1536}};
	gpu_rng		r;

	gpu_rng_seed(&r, 3);
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
	{
		int			m = shapes[s][0],
					k = shapes[s][1],
					n = shapes[s][2],
					ldo = shapes[s][3];

		for (int variant = 0; variant < 2; variant++)
		{
			bool		with_bias = variant == 1;
			bool		accumulate = variant == 1;
			float	   *x = malloc((size_t) n * k * sizeof(float));
			float	   *w = malloc((size_t) m * k * sizeof(float));
			float	   *b = malloc((size_t) m * sizeof(float));
			float	   *cpu = malloc((size_t) n * ldo * sizeof(float));
			float	   *got = malloc((size_t) n * ldo * sizeof(float));
			float	   *dout;
			cai_error	err;

			if (!x || !w || !b || !cpu || !got)
			{
				CHECK_MSG(false, "out of memory");
				return;
			}
			gpu_fill_f32(&r, x, (size_t) n * k, -1.0f, 1.0f);
			gpu_fill_f32(&r, w, (size_t) m * k, -0.2f, 0.2f);
			gpu_fill_f32(&r, b, (size_t) m, -1.0f, 1.0f);
			gpu_fill_f32(&r, cpu, (size_t) n * ldo, -2.0f, 2.0f);
			dout = gpu_upload(cpu, (size_t) n * ldo * sizeof(float));
			cai_gemm_f32(pool, x, n, k, w, m, with_bias ? b : NULL, cpu, ldo, accumulate);
			if (dout &&
				gpu_ok(cai_cuda_gemm_f32(gpu_ctx(), gpu_upload(x, (size_t) n * k * sizeof(float)),
										 n, k, gpu_upload(w, (size_t) m * k * sizeof(float)), m,
										 with_bias ? gpu_upload(b, (size_t) m * sizeof(float)) : NULL,
										 dout, ldo, accumulate, &err), &err, "float gemm") &&
				gpu_download(got, dout, (size_t) n * ldo * sizeof(float)))
			{
				size_t		bad = 0;

				for (int t = 0; t < n; t++)
					for (int o = 0; o < ldo; o++)
					{
						size_t		at = (size_t) t * ldo + o;
						double		mag = 0.0;

						if (o < m)
							for (int i = 0; i < k; i++)
								mag += fabs((double) x[(size_t) t * k + i] * w[(size_t) o * k + i]);
						/* untouched columns (o >= m) must be identical */
						if (!(fabs((double) got[at] - cpu[at]) <= (o < m ? 1e-5 * mag + 1e-6 : 0.0)))
							bad++;
					}
				CHECK_MSG(bad == 0, "float gemm %dx%dx%d: %zu elements outside tolerance", m, k,
						  n, bad);
			}
			free(x);
			free(w);
			free(b);
			free(cpu);
			free(got);
		}
	}
	cai_threadpool_free(pool);
}

/*
 * cai_cuda_quantize_second_digit against the CPU backend's quantize_second_digit (x [n, k] and its first
 * digit q1, s1): the second digit and its scales bit for bit.
 */
static bool
gpu_residual_matches(const float *x, int n, int k, const int8_t *q1, const float *s1)
{
	size_t		nk = (size_t) n * k;
	float	   *res = malloc((size_t) k * sizeof(float)),
			   *cs = malloc((size_t) n * sizeof(float)),
			   *gs = malloc((size_t) n * sizeof(float));
	int8_t	   *cq = malloc(nk),
			   *gq = malloc(nk),
			   *dq = gpu_alloc(nk);
	float	   *ds = gpu_alloc((size_t) n * sizeof(float));
	cai_error	err;
	bool		ok = res && cs && gs && cq && gq && dq && ds;

	for (int t = 0; ok && t < n; t++)
	{
		for (int i = 0; i < k; i++)
			res[i] = x[(size_t) t * k + i] - (float) q1[(size_t) t * k + i] * s1[t];
		cai_quantize_act_i8(res, 1, k, cq + (size_t) t * k, cs + t);
	}
	ok = ok && gpu_ok(cai_cuda_quantize_second_digit(gpu_ctx(), gpu_upload(x, nk * sizeof(float)), n, k,
											   gpu_upload(q1, nk),
											   gpu_upload(s1, (size_t) n * sizeof(float)), dq, ds,
											   &err), &err, "quantize residual") &&
		gpu_download(gq, dq, nk) && gpu_download(gs, ds, (size_t) n * sizeof(float));
	if (ok)
	{
		gpu_same_i8(gq, cq, nk, "second digit");
		gpu_same_f32(gs, cs, (size_t) n, "second digit's scales");
	}
	free(res);
	free(cs);
	free(gs);
	free(cq);
	free(gq);
	return ok;
}

TEST(gpu_quantize_bit_exact)
{
	static const int shapes[][3] = {{1, 64, 64}, {7, 576, 600}, {33, 100, 100}, {5, 1536, 1536}};
	gpu_rng		r;

	gpu_rng_seed(&r, 4);
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
	{
		int			n = shapes[s][0],
					k = shapes[s][1],
					ldx = shapes[s][2];
		float	   *x = malloc((size_t) n * ldx * sizeof(float));
		float	   *dense = malloc((size_t) n * k * sizeof(float));
		int8_t	   *cq = malloc((size_t) n * k),
				   *gq = malloc((size_t) n * k);
		float	   *cs = malloc((size_t) n * sizeof(float)),
				   *gs = malloc((size_t) n * sizeof(float));
		int8_t	   *dq = gpu_alloc((size_t) n * k);
		float	   *ds = gpu_alloc((size_t) n * sizeof(float));
		cai_error	err;

		if (!x || !dense || !cq || !gq || !cs || !gs || !dq || !ds)
		{
			CHECK_MSG(false, "out of memory");
			return;
		}
		gpu_fill_f32(&r, x, (size_t) n * ldx, -10.0f, 10.0f);
		if (n > 2)
		{
			memset(x + ldx, 0, (size_t) k * sizeof(float));	/* a zero row */
			x[2 * ldx + 1] = 3e37f;		/* a huge value */
			x[2 * ldx + 2] = 1e-40f;	/* a subnormal */
		}
		for (int t = 0; t < n; t++)
			memcpy(dense + (size_t) t * k, x + (size_t) t * ldx, (size_t) k * sizeof(float));
		cai_quantize_act_i8(dense, n, k, cq, cs);
		if (gpu_ok(cai_cuda_quantize_act(gpu_ctx(), gpu_upload(x, (size_t) n * ldx * sizeof(float)),
										 n, k, ldx, dq, ds, &err), &err, "quantize") &&
			gpu_download(gq, dq, (size_t) n * k) && gpu_download(gs, ds, (size_t) n * sizeof(float)))
		{
			gpu_same_i8(gq, cq, (size_t) n * k, "quantized");
			gpu_same_f32(gs, cs, (size_t) n, "scales");
		}
		/* the second digit of two-digit activations: the rounding error quantized again */
		if (!gpu_residual_matches(dense, n, k, cq, cs))
			CHECK_MSG(false, "second digits of %d x %d", n, k);
		free(x);
		free(dense);
		free(cq);
		free(gq);
		free(cs);
		free(gs);
	}
}

TEST(gpu_rmsnorm_bit_exact)
{
	static const int shapes[][2] = {{1, 576}, {9, 100}, {3, 4096}, {17, 7}, {64, 576}};
	gpu_rng		r;

	gpu_rng_seed(&r, 5);
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
	{
		int			n = shapes[s][0],
					d = shapes[s][1];
		size_t		nd = (size_t) n * d;
		float	   *x = malloc(nd * sizeof(float)),
				   *w = malloc((size_t) d * sizeof(float)),
				   *cy = malloc(nd * sizeof(float)),
				   *gy = malloc(nd * sizeof(float));
		int8_t	   *cq = malloc(nd),
				   *gq = malloc(nd);
		float	   *cs = malloc((size_t) n * sizeof(float)),
				   *gs = malloc((size_t) n * sizeof(float));
		float	   *dx,
				   *dw,
				   *dy = gpu_alloc(nd * sizeof(float)),
				   *ds = gpu_alloc((size_t) n * sizeof(float));
		int8_t	   *dq = gpu_alloc(nd);
		cai_error	err;

		if (!x || !w || !cy || !gy || !cq || !gq || !cs || !gs || !dy || !ds || !dq)
		{
			CHECK_MSG(false, "out of memory");
			return;
		}
		gpu_fill_f32(&r, x, nd, -4.0f, 4.0f);
		gpu_fill_f32(&r, w, (size_t) d, 0.5f, 1.5f);
		for (int t = 0; t < n; t++)
			cai_op_rmsnorm_row(x + (size_t) t * d, w, d, 1e-5f, cy + (size_t) t * d);
		cai_quantize_act_i8(cy, n, d, cq, cs);
		dx = gpu_upload(x, nd * sizeof(float));
		dw = gpu_upload(w, (size_t) d * sizeof(float));
		if (gpu_ok(cai_cuda_rmsnorm(gpu_ctx(), dx, dw, n, d, 1e-5f, dy, NULL, NULL, &err), &err,
				   "rmsnorm") &&
			gpu_download(gy, dy, nd * sizeof(float)))
			gpu_same_f32(gy, cy, nd, "rmsnorm");
		if (gpu_ok(cai_cuda_rmsnorm(gpu_ctx(), dx, dw, n, d, 1e-5f, NULL, dq, ds, &err), &err,
				   "rmsnorm_quant") &&
			gpu_download(gq, dq, nd) && gpu_download(gs, ds, (size_t) n * sizeof(float)))
		{
			gpu_same_i8(gq, cq, nd, "rmsnorm quantized");
			gpu_same_f32(gs, cs, (size_t) n, "rmsnorm scales");
		}
		free(x);
		free(w);
		free(cy);
		free(gy);
		free(cq);
		free(gq);
		free(cs);
		free(gs);
	}
}

/*
 * A sandwiched sublayer's output normed into the residual stream (cai_op_rmsnorm_add_row):
 * widths with a tail past the last multiple of 8, Gemma 3 270M's 640, and one too wide for
 * the kernel to stage the row in shared memory.
 */
TEST(gpu_rmsnorm_add_bit_exact)
{
	static const int shapes[][2] = {{1, 640}, {9, 100}, {17, 7}, {40, 640}, {3, 4096}, {2, 13000}};
	gpu_rng		r;

	gpu_rng_seed(&r, 15);
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
	{
		int			n = shapes[s][0],
					d = shapes[s][1];
		size_t		nd = (size_t) n * d;
		float	   *y = malloc(nd * sizeof(float)),
				   *w = malloc((size_t) d * sizeof(float)),
				   *cx = malloc(nd * sizeof(float)),
				   *gx = malloc(nd * sizeof(float));
		float	   *dx;
		cai_error	err;

		if (!y || !w || !cx || !gx)
		{
			CHECK_MSG(false, "out of memory");
			return;
		}
		gpu_fill_f32(&r, y, nd, -40.0f, 40.0f);
		gpu_fill_f32(&r, w, (size_t) d, -2.0f, 2.0f);
		gpu_fill_f32(&r, cx, nd, -8.0f, 8.0f);
		dx = gpu_upload(cx, nd * sizeof(float));
		for (int t = 0; t < n; t++)
			cai_op_rmsnorm_add_row(y + (size_t) t * d, w, d, 1e-6f, cx + (size_t) t * d);
		if (gpu_ok(cai_cuda_rmsnorm_add(gpu_ctx(), gpu_upload(y, nd * sizeof(float)),
										gpu_upload(w, (size_t) d * sizeof(float)), n, d, 1e-6f,
										dx, &err), &err, "rmsnorm_add") &&
			gpu_download(gx, dx, nd * sizeof(float)))
			gpu_same_f32(gx, cx, nd, "rmsnorm_add");
		free(y);
		free(w);
		free(cx);
		free(gx);
		gpu_free_all();
	}
}

/* One rope configuration: gather + rotate against cai_op_rope_angles + cai_op_rope_row. */
static void
check_rope(gpu_rng *r, int n_tok, int n_heads, int head_dim, int n_rot, bool neox,
		   bool factors, int n_pos)
{
	cai_rope_params rp;
	float		freq_factors[128];
	int			ldx = n_heads * head_dim + 8;
	float	   *table = malloc((size_t) n_pos * n_rot * sizeof(float));
	float	   *x = malloc((size_t) n_tok * ldx * sizeof(float));
	float	   *cpu = malloc((size_t) n_tok * ldx * sizeof(float));
	float	   *got = malloc((size_t) n_tok * ldx * sizeof(float));
	float	   *ccs = malloc((size_t) n_tok * n_rot * sizeof(float));
	float	   *gcs = malloc((size_t) n_tok * n_rot * sizeof(float));
	int32_t    *pos = malloc((size_t) n_tok * sizeof(int32_t));
	float	   *dcs = gpu_alloc((size_t) n_tok * n_rot * sizeof(float));
	float	   *dx;
	cai_error	err;

	if (!table || !x || !cpu || !got || !ccs || !gcs || !pos || !dcs)
	{
		CHECK_MSG(false, "out of memory");
		goto done;
	}
	for (int i = 0; i < n_rot / 2; i++)
		freq_factors[i] = gpu_rng_float(r, 1.0f, 8.0f);
	rp.n_rot = n_rot;
	rp.base = neox ? 1000000.0f : 10000.0f;
	rp.freq_scale = factors ? 0.5f : 1.0f;
	rp.neox = neox;
	rp.freq_factors = factors ? freq_factors : NULL;
	for (int p = 0; p < n_pos; p++)
		cai_op_rope_angles(&rp, p, table + (size_t) p * n_rot);
	for (int t = 0; t < n_tok; t++)
	{
		pos[t] = t == 0 ? n_pos - 1 : gpu_rng_int(r, 0, n_pos - 1);
		memcpy(ccs + (size_t) t * n_rot, table + (size_t) pos[t] * n_rot, (size_t) n_rot * sizeof(float));
	}
	gpu_fill_f32(r, x, (size_t) n_tok * ldx, -2.0f, 2.0f);
	memcpy(cpu, x, (size_t) n_tok * ldx * sizeof(float));
	for (int t = 0; t < n_tok; t++)
		cai_op_rope_row(&rp, ccs + (size_t) t * n_rot, cpu + (size_t) t * ldx, n_heads, head_dim);

	dx = gpu_upload(x, (size_t) n_tok * ldx * sizeof(float));
	if (dx &&
		gpu_ok(cai_cuda_rope_gather(gpu_ctx(), gpu_upload(table, (size_t) n_pos * n_rot * sizeof(float)),
									n_pos, n_rot, gpu_upload(pos, (size_t) n_tok * sizeof(int32_t)),
									n_tok, dcs, &err), &err, "rope gather") &&
		gpu_ok(cai_cuda_rope(gpu_ctx(), dcs, dx, ldx, n_tok, n_heads, head_dim, n_rot, neox, &err),
			   &err, "rope") &&
		gpu_download(gcs, dcs, (size_t) n_tok * n_rot * sizeof(float)) &&
		gpu_download(got, dx, (size_t) n_tok * ldx * sizeof(float)))
	{
		gpu_same_f32(gcs, ccs, (size_t) n_tok * n_rot, "rope angles");
		gpu_same_f32(got, cpu, (size_t) n_tok * ldx, "rotated rows");
	}
	/* the device-built table (benchmarks) agrees with the host's to float rounding */
	if (!factors)
	{
		float	   *dt = gpu_alloc((size_t) n_pos * n_rot * sizeof(float));
		float	   *gt = malloc((size_t) n_pos * n_rot * sizeof(float));

		if (dt && gt &&
			gpu_ok(cai_cuda_rope_table(gpu_ctx(), dt, n_pos, n_rot, rp.base, rp.freq_scale, &err),
				   &err, "rope table") &&
			gpu_download(gt, dt, (size_t) n_pos * n_rot * sizeof(float)))
			gpu_near_f32(gt, table, (size_t) n_pos * n_rot, 2.5e-7, 0.0, "device rope table");
		free(gt);
	}
done:
	free(table);
	free(x);
	free(cpu);
	free(got);
	free(ccs);
	free(gcs);
	free(pos);
}

TEST(gpu_rope_bit_exact)
{
	gpu_rng		r;

	gpu_rng_seed(&r, 6);
	check_rope(&r, 13, 12, 64, 64, false, false, 4096);	/* llama: q and k heads of SmolLM2 */
	check_rope(&r, 5, 6, 128, 128, true, false, 512);	/* qwen2 */
	check_rope(&r, 7, 4, 128, 64, true, true, 2048);	/* partial rotation, frequency factors */
}

/*
 * The gated FFN's activation (gelu: GeGLU, else SwiGLU) against cai_op_geglu_row or
 * cai_op_swiglu_row, as floats and fused with quantization, on widths with and without a tail
 * past the CPU's last eight-lane vector; values from -12 to 12 and beyond, where the exp clamps.
 */
static void
check_glu(bool gelu, uint64_t seed)
{
	static const int shapes[][2] = {{1, 1536}, {11, 100}, {40, 1536}, {3, 7}, {6, 2048}};
	const char *name = gelu ? "geglu" : "swiglu";
	gpu_rng		r;

	gpu_rng_seed(&r, seed);
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
	{
		int			n = shapes[s][0],
					d_ff = shapes[s][1];
		size_t		nh = (size_t) n * d_ff;
		float	   *gu = malloc(2 * nh * sizeof(float)),
				   *ch = malloc(nh * sizeof(float)),
				   *gh = malloc(nh * sizeof(float));
		int8_t	   *cq = malloc(nh),
				   *gq = malloc(nh);
		float	   *cs = malloc((size_t) n * sizeof(float)),
				   *gs = malloc((size_t) n * sizeof(float));
		float	   *dgu,
				   *dh = gpu_alloc(nh * sizeof(float)),
				   *ds = gpu_alloc((size_t) n * sizeof(float));
		int8_t	   *dq = gpu_alloc(nh);
		cai_error	err;

		if (!gu || !ch || !gh || !cq || !gq || !cs || !gs || !dh || !ds || !dq)
		{
			CHECK_MSG(false, "out of memory");
			return;
		}
		gpu_fill_f32(&r, gu, 2 * nh, -12.0f, 12.0f);
		gu[0] = -100.0f;		/* exp clamps */
		gu[1] = 100.0f;
		for (int t = 0; t < n; t++)
		{
			const float *g = gu + (size_t) t * 2 * d_ff;

			if (gelu)
				cai_op_geglu_row(g, g + d_ff, d_ff, ch + (size_t) t * d_ff);
			else
				cai_op_swiglu_row(g, g + d_ff, d_ff, ch + (size_t) t * d_ff);
		}
		cai_quantize_act_i8(ch, n, d_ff, cq, cs);
		dgu = gpu_upload(gu, 2 * nh * sizeof(float));
		if (gpu_ok((gelu ? cai_cuda_geglu : cai_cuda_swiglu)(gpu_ctx(), dgu, n, d_ff, dh, NULL,
															 NULL, &err), &err, name) &&
			gpu_download(gh, dh, nh * sizeof(float)))
			gpu_same_f32(gh, ch, nh, name);
		if (gpu_ok((gelu ? cai_cuda_geglu : cai_cuda_swiglu)(gpu_ctx(), dgu, n, d_ff, NULL, dq, ds,
															 &err), &err, name) &&
			gpu_download(gq, dq, nh) && gpu_download(gs, ds, (size_t) n * sizeof(float)))
		{
			gpu_same_i8(gq, cq, nh, gelu ? "geglu quantized" : "swiglu quantized");
			gpu_same_f32(gs, cs, (size_t) n, gelu ? "geglu scales" : "swiglu scales");
		}
		free(gu);
		free(ch);
		free(gh);
		free(cq);
		free(gq);
		free(cs);
		free(gs);
	}
}

TEST(gpu_swiglu_bit_exact)
{
	check_glu(false, 7);
}

TEST(gpu_geglu_bit_exact)
{
	check_glu(true, 17);
}

/*
 * Bitwise equality of float outputs where a NaN may stand (a NaN input spreads through the
 * butterflies): NaN on both sides passes whatever its payload, which IEEE leaves to the hardware.
 */
static bool
same_or_both_nan(const float *gpu, const float *cpu, size_t n, const char *what)
{
	size_t		bad = 0;

	for (size_t i = 0; i < n; i++)
	{
		if (memcmp(&gpu[i], &cpu[i], sizeof(float)) == 0 || (isnan(gpu[i]) && isnan(cpu[i])))
			continue;
		if (bad++ < 5)
			fprintf(stderr, "    %s[%zu]: gpu %.9g cpu %.9g\n", what, i, gpu[i], cpu[i]);
	}
	CHECK_MSG(bad == 0, "%s: %zu of %zu floats differ from the cpu", what, bad, n);
	return bad == 0;
}

/* One rotation shape: n_vec vectors of n_pow2 * n_mix values per row, pad more values after. */
typedef struct rotate_case
{
	int			n_pow2;
	int			n_mix;
	int			n_vec;
	int			n_tok;
	int			pad;			/* ldx - n_vec * n: values the rotation must leave alone */
} rotate_case;

/*
 * The CPU backend's rotate (cai_op_rotate_vec per vector, then cai_quantize_act_i8 per row)
 * against cai_cuda_rotate, in place and fused with quantization, on random rows (never all
 * zeros) and, with three rows or more, a row dominated by one huge value and a row of tiny
 * values whose max gives the zero scale (127 / max overflows; subnormals go through the
 * butterflies).  with_nan puts a NaN in the last row: it spreads to a chunk's values, which
 * quantize to -127 while the row's scale comes from the others.  The mix table is the engine's
 * (discrete Hartley, cos + sin) or random weights; every float, int8 and scale is compared.
 */
static void
check_rotate(gpu_rng *r, cai_backend *cpu_be, const rotate_case *rc, bool hartley, bool with_nan)
{
	int			p = rc->n_pow2,
				m = rc->n_mix,
				n = p * m,
				width = rc->n_vec * n,
				ldx = width + rc->pad,
				T = rc->n_tok;
	size_t		nx = (size_t) T * ldx,
				nq = (size_t) T * width;
	float	   *mix = malloc((size_t) m * m * sizeof(float));
	float	   *x = malloc(nx * sizeof(float)),
			   *cpu = malloc(nx * sizeof(float)),
			   *cpu_qx = malloc(nx * sizeof(float)),
			   *got = malloc(nx * sizeof(float));
	int8_t	   *cq = malloc(nq),
			   *gq = malloc(nq);
	float	   *cs = malloc((size_t) T * sizeof(float)),
			   *gs = malloc((size_t) T * sizeof(float));
	int8_t	   *dq = gpu_alloc(nq);
	float	   *ds = gpu_alloc((size_t) T * sizeof(float));
	cai_rotation rot;
	cai_cuda_rotation grot;
	char		what[96];
	float	   *dx;
	cai_error	err;

	if (!mix || !x || !cpu || !cpu_qx || !got || !cq || !gq || !cs || !gs || !dq || !ds)
	{
		CHECK_MSG(false, "out of memory");
		goto done;
	}
	for (int a = 0; a < m; a++)
		for (int b = 0; b < m; b++)
		{
			double		theta = 2.0 * M_PI * (double) ((a * b) % m) / (double) m;

			mix[a * m + b] = hartley ? (float) (cos(theta) + sin(theta)) :
				gpu_rng_float(r, -1.5f, 1.5f);
		}
	rot.n = n;
	rot.n_pow2 = p;
	rot.n_mix = m;
	rot.mix = mix;
	rot.norm = (float) (1.0 / sqrt((double) n));
	gpu_fill_f32(r, x, nx, -3.0f, 3.0f);
	if (T >= 3)
	{
		x[ldx + 1] = 1e30f;		/* row 1: one huge value */
		for (int i = 0; i < ldx; i++)
			x[2 * (size_t) ldx + i] *= 1e-38f;	/* row 2: max below 127 / FLT_MAX */
	}
	if (with_nan)
		x[(size_t) (T - 1) * ldx + width / 2] = NAN;
	memcpy(cpu, x, nx * sizeof(float));
	memcpy(cpu_qx, x, nx * sizeof(float));
	cpu_be->ops->rotate(cpu_be, &rot, cpu, ldx, T, rc->n_vec, NULL, NULL);
	cpu_be->ops->rotate(cpu_be, &rot, cpu_qx, ldx, T, rc->n_vec, cq, cs);

	grot.n = n;
	grot.n_pow2 = p;
	grot.n_mix = m;
	grot.mix_dev = m > 1 ? gpu_upload(mix, (size_t) m * m * sizeof(float)) : NULL;
	grot.norm = rot.norm;
	snprintf(what, sizeof(what), "rotate %d x %d, %d vectors, %d tokens, pad %d", p, m,
			 rc->n_vec, T, rc->pad);

	/* in place, floats only */
	dx = gpu_upload(x, nx * sizeof(float));
	if (dx &&
		gpu_ok(cai_cuda_rotate(gpu_ctx(), &grot, dx, ldx, T, rc->n_vec, NULL, NULL, &err), &err,
			   what) &&
		gpu_download(got, dx, nx * sizeof(float)))
		same_or_both_nan(got, cpu, nx, what);

	/* fused with the per-token quantization: the floats in place, the int8 and the scales */
	dx = gpu_upload(x, nx * sizeof(float));
	if (dx &&
		gpu_ok(cai_cuda_rotate(gpu_ctx(), &grot, dx, ldx, T, rc->n_vec, dq, ds, &err), &err,
			   what) &&
		gpu_download(got, dx, nx * sizeof(float)) && gpu_download(gq, dq, nq) &&
		gpu_download(gs, ds, (size_t) T * sizeof(float)))
	{
		same_or_both_nan(got, cpu_qx, nx, what);
		gpu_same_i8(gq, cq, nq, what);
		gpu_same_f32(gs, cs, (size_t) T, what);
		if (T >= 3)
			CHECK_MSG(cs[2] == 0.0f && cs[0] > 0.0f, "%s: the tiny row's scale is %g", what, cs[2]);
	}
done:
	free(mix);
	free(x);
	free(cpu);
	free(cpu_qx);
	free(got);
	free(cq);
	free(gq);
	free(cs);
	free(gs);
}

TEST(gpu_rotate_bit_exact)
{
	static const rotate_case cases[] = {
		/* n_pow2, n_mix, n_vec, n_tok, pad */
		{64, 1, 9, 13, 0},		/* SmolLM2 rot_model: d_model 576 as 9 blocks of 64 */
		{512, 1, 3, 13, 0},		/* SmolLM2 rot_ff: d_ff 1536 as 3 blocks of 512 */
		{64, 1, 12, 7, 192},	/* SmolLM2 rot_head: q and k heads of a 960-wide qkv row, V left */
		{128, 1, 7, 5, 0},		/* qwen2-0.5b: d_model 896 */
		{256, 1, 19, 3, 0},		/* qwen2-0.5b: d_ff 4864 */
		{128, 1, 40, 3, 1024},	/* llama-8b heads: 32 + 8 of 128, 8 V heads left */
		{2048, 1, 1, 3, 0},		/* llama-1b: d_model 2048 */
		{8192, 1, 1, 3, 0},		/* llama-1b: d_ff 8192 */
		{4096, 1, 1, 3, 0},		/* llama-8b: d_model */
		{2048, 1, 7, 3, 0},		/* llama-8b: d_ff 14336 as 7 blocks of 2048 */
		{16384, 1, 1, 3, 0},	/* longer than 48 KiB of shared memory */
		/* mixed chunks (make_rotation below 64-value chunks) and other block structures */
		{16, 3, 1, 11, 0},
		{32, 9, 1, 6, 5},
		{1, 7, 3, 5, 1},		/* no butterflies: the mix alone */
		{8, 5, 2, 4, 3},
		{2, 63, 1, 3, 0},
		{4, 64, 1, 3, 0},		/* the largest mix */
		{32, 45, 2, 3, 0},
		{64, 3, 2, 3, 0},
		{16, 4, 2, 5, 7},
		{1, 1, 5, 3, 0},		/* n = 1: the norm alone */
		/* many tokens: a block per token takes all its vectors (fewer spread them over blocks) */
		{512, 1, 3, 33, 0},
		{64, 1, 9, 40, 0},
	};
	cai_backend_limits lim = {64, 16, 16384, 1, 1, 64};
	cai_backend *cpu_be = NULL;
	cai_error	err;
	gpu_rng		r;

	if (!gpu_ok(cai_backend_cpu_create(NULL, &lim, &cpu_be, &err), &err, "cpu backend"))
		return;
	gpu_rng_seed(&r, 14);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
	{
		check_rotate(&r, cpu_be, &cases[i], i % 2 == 0, false);
		gpu_free_all();
	}
	/* a NaN input, with and without a mix */
	check_rotate(&r, cpu_be, &cases[0], true, true);
	check_rotate(&r, cpu_be, &cases[12], false, true);
	cai_backend_free(cpu_be);
}

TEST(gpu_embedding_and_gather_bit_exact)
{
	const int	vocab = 1003,
				d = 576,
				n = 37;
	gpu_rng		r;
	int8_t	   *tq = malloc((size_t) vocab * d);
	float	   *ts = malloc((size_t) vocab * sizeof(float));
	float	   *tf = malloc((size_t) vocab * d * sizeof(float));
	int32_t    *ids = malloc((size_t) n * sizeof(int32_t));
	float	   *cpu = malloc((size_t) n * d * sizeof(float));
	float	   *got = malloc((size_t) n * d * sizeof(float));
	float	   *dx = gpu_alloc((size_t) n * d * sizeof(float));
	int32_t    *dids;
	cai_cuda_qmatrix table;
	cai_error	err;

	gpu_rng_seed(&r, 8);
	if (!tq || !ts || !tf || !ids || !cpu || !got || !dx)
	{
		CHECK_MSG(false, "out of memory");
		goto done;
	}
	gpu_fill_i8(&r, tq, (size_t) vocab * d);
	gpu_fill_f32(&r, ts, (size_t) vocab, 1e-3f, 1e-1f);
	gpu_fill_f32(&r, tf, (size_t) vocab * d, -1.0f, 1.0f);
	for (int t = 0; t < n; t++)
		ids[t] = t == 0 ? vocab - 1 : gpu_rng_int(&r, 0, vocab - 1);
	dids = gpu_upload(ids, (size_t) n * sizeof(int32_t));

	for (int t = 0; t < n; t++)
		cai_op_dequant_row(tq + (size_t) ids[t] * d, ts[ids[t]], d, cpu + (size_t) t * d);
	if (gpu_ok(cai_cuda_qmatrix_upload(gpu_ctx(), tq, ts, vocab, d, "table", &table, &err), &err,
			   "table upload"))
	{
		if (gpu_ok(cai_cuda_embed_i8(gpu_ctx(), &table, dids, n, dx, &err), &err, "embed_i8") &&
			gpu_download(got, dx, (size_t) n * d * sizeof(float)))
			gpu_same_f32(got, cpu, (size_t) n * d, "int8 embedding");
		/* a two-digit table's second digits added (the same table serves as one here) */
		for (int t = 0; t < n; t++)
			for (int i = 0; i < d; i++)
				cpu[(size_t) t * d + i] = cpu[(size_t) t * d + i] +
					(float) tq[(size_t) ids[t] * d + i] * ts[ids[t]];
		if (gpu_ok(cai_cuda_embed_i8_add(gpu_ctx(), &table, dids, n, dx, &err), &err,
				   "embed_i8_add") &&
			gpu_download(got, dx, (size_t) n * d * sizeof(float)))
			gpu_same_f32(got, cpu, (size_t) n * d, "int8 embedding, second digits added");
		cai_cuda_qmatrix_free(gpu_ctx(), &table);
	}

	for (int t = 0; t < n; t++)
		memcpy(cpu + (size_t) t * d, tf + (size_t) ids[t] * d, (size_t) d * sizeof(float));
	if (gpu_ok(cai_cuda_embed_f32(gpu_ctx(), gpu_upload(tf, (size_t) vocab * d * sizeof(float)),
								  vocab, d, dids, n, dx, &err), &err, "embed_f32") &&
		gpu_download(got, dx, (size_t) n * d * sizeof(float)))
		gpu_same_f32(got, cpu, (size_t) n * d, "float embedding");

	/* gather: rows of the float table chosen by the same ids */
	if (gpu_ok(cai_cuda_gather_rows(gpu_ctx(), gpu_upload(tf, (size_t) vocab * d * sizeof(float)),
									d, dids, n, dx, &err), &err, "gather") &&
		gpu_download(got, dx, (size_t) n * d * sizeof(float)))
		gpu_same_f32(got, cpu, (size_t) n * d, "gathered rows");
done:
	free(tq);
	free(ts);
	free(tf);
	free(ids);
	free(cpu);
	free(got);
}

/*
 * Gemma 3's embedding scale against the CPU backend's scale: widths with a tail, several
 * tokens, factors sqrt(d) and others, values that overflow to infinity and subnormals.
 */
TEST(gpu_scale_bit_exact)
{
	static const int shapes[][2] = {{1, 640}, {7, 100}, {5, 7}, {33, 1152}};
	cai_backend_limits lim = {64, 16, 2048, 1, 1, 64};
	cai_backend *cpu_be = NULL;
	cai_error	err;
	gpu_rng		r;

	if (!gpu_ok(cai_backend_cpu_create(NULL, &lim, &cpu_be, &err), &err, "cpu backend"))
		return;
	gpu_rng_seed(&r, 16);
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
	{
		int			n = shapes[s][0],
					d = shapes[s][1];
		size_t		nd = (size_t) n * d;
		float		f = s % 2 == 0 ? sqrtf((float) d) : gpu_rng_float(&r, 0.1f, 40.0f);
		float	   *x = malloc(nd * sizeof(float)),
				   *got = malloc(nd * sizeof(float));
		float	   *dx;

		if (!x || !got)
		{
			CHECK_MSG(false, "out of memory");
			free(x);
			free(got);
			break;
		}
		gpu_fill_f32(&r, x, nd, -3.0f, 3.0f);
		x[0] = 3.0e38f;			/* overflows to infinity */
		x[nd - 1] = -1.0e-40f;	/* subnormal */
		dx = gpu_upload(x, nd * sizeof(float));
		cpu_be->ops->scale(cpu_be, x, n, d, f);
		if (gpu_ok(cai_cuda_scale(gpu_ctx(), dx, n, d, f, &err), &err, "scale") &&
			gpu_download(got, dx, nd * sizeof(float)))
			gpu_same_f32(got, x, nd, "scaled rows");
		free(x);
		free(got);
		gpu_free_all();
	}
	cai_backend_free(cpu_be);
}

/* The sampler's order: larger logit first, lower id on ties; NaN never. */
static bool
ranks_before(float v, int i, float bv, int bi)
{
	return v > bv || (v == bv && i < bi);
}

TEST(gpu_argmax_and_topk_match_the_sampler_order)
{
	const int	rows = 6,
				vocab = 49152,
				k = 40;
	gpu_rng		r;
	float	   *logits = malloc((size_t) rows * vocab * sizeof(float));
	int32_t    *gids = malloc((size_t) rows * k * sizeof(int32_t));
	float	   *gvals = malloc((size_t) rows * k * sizeof(float));
	int32_t    *dargmax = gpu_alloc((size_t) rows * sizeof(int32_t));
	int32_t    *dids = gpu_alloc((size_t) rows * k * sizeof(int32_t));
	float	   *dvals = gpu_alloc((size_t) rows * k * sizeof(float));
	float	   *dl;
	cai_error	err;

	gpu_rng_seed(&r, 9);
	if (!logits || !gids || !gvals || !dargmax || !dids || !dvals)
	{
		CHECK_MSG(false, "out of memory");
		goto done;
	}
	gpu_fill_f32(&r, logits, (size_t) rows * vocab, -20.0f, 20.0f);
	/* planted: ties of the maximum (the lower id must win), NaNs, a repeated value in the top k */
	logits[0 * vocab + 777] = 50.0f;
	logits[0 * vocab + 30000] = 50.0f;
	logits[1 * vocab + 5] = NAN;
	logits[1 * vocab + 6] = 60.0f;
	logits[2 * vocab + 49151] = 70.0f;
	for (int i = 0; i < 10; i++)
		logits[3 * vocab + 100 + i * 997] = 30.0f;
	dl = gpu_upload(logits, (size_t) rows * vocab * sizeof(float));

	if (gpu_ok(cai_cuda_argmax(gpu_ctx(), dl, rows, vocab, vocab, dargmax, &err), &err, "argmax") &&
		gpu_ok(cai_cuda_topk(gpu_ctx(), dl, rows, vocab, vocab, k, dvals, dids, &err), &err, "topk") &&
		gpu_download(gids, dids, (size_t) rows * k * sizeof(int32_t)) &&
		gpu_download(gvals, dvals, (size_t) rows * k * sizeof(float)))
	{
		int32_t		am[6];

		if (!gpu_download(am, dargmax, sizeof(am)))
			goto done;
		CHECK_EQ_INT(am[0], 777);
		CHECK_EQ_INT(am[1], 6);
		CHECK_EQ_INT(am[2], 49151);
		for (int row = 0; row < rows; row++)
		{
			const float *l = logits + (size_t) row * vocab;
			float		last_v = INFINITY;
			int			last_i = -1;

			/* reference: k rounds of the best candidate after the previous one */
			for (int j = 0; j < k; j++)
			{
				float		bv = -INFINITY;
				int			bi = vocab;

				for (int i = 0; i < vocab; i++)
				{
					if (l[i] != l[i] || (last_i >= 0 && !ranks_before(last_v, last_i, l[i], i)))
						continue;
					if (ranks_before(l[i], i, bv, bi))
					{
						bv = l[i];
						bi = i;
					}
				}
				if (j == 0)
					CHECK_EQ_INT(am[row], bi);
				CHECK_EQ_INT(gids[row * k + j], bi);
				CHECK(gvals[row * k + j] == bv);
				last_v = bv;
				last_i = bi;
			}
		}
	}

	/*
	 * Rows the device argmax reads as many chunks: one all NaN (no candidate: -1), one where -0
	 * at a lower id ties +0 at a higher one (equal logits: the lower id), one of -inf alone.
	 */
	{
		const float minus_zero = -0.0f;
		float	   *special = logits;
		int32_t		am[3];

		for (int i = 0; i < vocab; i++)
		{
			special[i] = NAN;
			special[vocab + i] = -5.0f;
			special[2 * (size_t) vocab + i] = -INFINITY;
		}
		special[vocab + 20] = minus_zero;
		special[vocab + 9000] = 0.0f;
		special[2 * (size_t) vocab + 40000] = NAN;
		dl = gpu_upload(special, (size_t) 3 * vocab * sizeof(float));
		if (dl && gpu_ok(cai_cuda_argmax(gpu_ctx(), dl, 3, vocab, vocab, dargmax, &err), &err,
						 "argmax") && gpu_download(am, dargmax, sizeof(am)))
		{
			CHECK_EQ_INT(am[0], -1);
			CHECK_EQ_INT(am[1], 20);
			CHECK_EQ_INT(am[2], 0);
		}
	}
done:
	free(logits);
	free(gids);
	free(gvals);
}

TEST(gpu_kv_block_transfers_round_trip)
{
	const size_t block_bytes = 30 * 6656;	/* SmolLM2's block: 30 layers */
	const int	n = 6;
	int32_t		dev_blocks[6] = {3, 4, 5, 9, 0, 7};	/* a run of three, then scattered */
	gpu_rng		r;
	uint8_t    *host_in = NULL,
			   *host_out = NULL,
			   *pool;
	const void *in_ptrs[6];
	void	   *out_ptrs[6];
	uint64_t	up = 0,
				down = 0;
	cai_error	err;

	gpu_rng_seed(&r, 10);
	pool = gpu_alloc(10 * block_bytes);
	if (!pool ||
		!gpu_ok(cai_cuda_host_alloc(gpu_ctx(), n * block_bytes, "test", (void **) &host_in, &err),
				&err, "host alloc") ||
		!gpu_ok(cai_cuda_host_alloc(gpu_ctx(), n * block_bytes, "test", (void **) &host_out, &err),
				&err, "host alloc"))
		goto done;
	gpu_fill_i8(&r, (int8_t *) host_in, n * block_bytes);
	memset(host_out, 0, n * block_bytes);
	for (int i = 0; i < n; i++)
	{
		in_ptrs[i] = host_in + (size_t) i * block_bytes;
		out_ptrs[i] = host_out + (size_t) (n - 1 - i) * block_bytes;	/* reversed on the way back */
	}
	if (!gpu_ok(cai_cuda_kv_upload_blocks(gpu_ctx(), pool, block_bytes, dev_blocks, in_ptrs, n, &up,
										  &err), &err, "upload") ||
		!gpu_ok(cai_cuda_kv_download_blocks(gpu_ctx(), pool, block_bytes, dev_blocks, out_ptrs, n,
											&down, &err), &err, "download") ||
		!gpu_ok(cai_cuda_transfer_wait(gpu_ctx(), down, &err), &err, "wait"))
		goto done;
	CHECK(up > 0 && down > up);
	CHECK(cai_cuda_transfer_done(gpu_ctx(), up));
	CHECK(cai_cuda_transfer_done(gpu_ctx(), down));
	for (int i = 0; i < n; i++)
		CHECK_MSG(memcmp(host_out + (size_t) (n - 1 - i) * block_bytes,
						 host_in + (size_t) i * block_bytes, block_bytes) == 0,
				  "block %d came back different", i);
done:
	cai_cuda_host_free(gpu_ctx(), host_in);
	cai_cuda_host_free(gpu_ctx(), host_out);
}

TEST(gpu_graph_replays_with_new_inputs)
{
	const int	m = 576,
				k = 576,
				n = 16;
	cai_threadpool *pool = cai_threadpool_create(2);
	gpu_rng		r;
	host_qmatrix w;
	cai_cuda_qmatrix dw;
	float	   *x = malloc((size_t) n * k * sizeof(float));
	int8_t	   *xq = malloc((size_t) n * k);
	float	   *xs = malloc((size_t) n * sizeof(float));
	float	   *cpu = malloc((size_t) n * m * sizeof(float));
	float	   *got = malloc((size_t) n * m * sizeof(float));
	float	   *dx = gpu_alloc((size_t) n * k * sizeof(float));
	int8_t	   *dq = gpu_alloc((size_t) n * k);
	float	   *ds = gpu_alloc((size_t) n * sizeof(float));
	float	   *dout = gpu_alloc((size_t) n * m * sizeof(float));
	const int	key = 4242;
	cai_error	err;

	gpu_rng_seed(&r, 11);
	if (!x || !xq || !xs || !cpu || !got || !dx || !dq || !ds || !dout ||
		!host_qmatrix_make(&r, m, k, &w))
	{
		CHECK_MSG(false, "out of memory");
		goto out;
	}
	if (!gpu_ok(cai_cuda_qmatrix_upload(gpu_ctx(), w.q, w.scale, m, k, "test", &dw, &err), &err,
				"upload"))
		goto done;
	/* load the kernels, warm the algorithm cache and size the scratch outside the capture */
	if (!gpu_ok(cai_cuda_quantize_act(gpu_ctx(), dx, n, k, k, dq, ds, &err), &err, "warm-up") ||
		!gpu_ok(cai_cuda_gemm_i8(gpu_ctx(), dq, ds, n, &dw, dout, m, NULL, &err), &err, "warm-up"))
		goto freew;
	if (!gpu_ok(cai_cuda_graph_begin(gpu_ctx(), &err), &err, "begin"))
		goto freew;
	if (cai_cuda_quantize_act(gpu_ctx(), dx, n, k, k, dq, ds, &err) != CAI_OK ||
		cai_cuda_gemm_i8(gpu_ctx(), dq, ds, n, &dw, dout, m, NULL, &err) != CAI_OK)
	{
		cai_cuda_graph_abort(gpu_ctx());
		CHECK_MSG(false, "capture: %s", err.message);
		goto freew;
	}
	if (!gpu_ok(cai_cuda_graph_end(gpu_ctx(), key, &err), &err, "end"))
		goto freew;
	CHECK(cai_cuda_graph_has(gpu_ctx(), key));
	for (int round = 0; round < 3; round++)
	{
		cai_error	e2;

		gpu_fill_f32(&r, x, (size_t) n * k, -2.0f, 2.0f);
		cai_quantize_act_i8(x, n, k, xq, xs);
		cai_gemm_i8(pool, xq, xs, n, &w.m, NULL, cpu, m, false);
		if (!gpu_ok(cai_cuda_upload_sync(gpu_ctx(), dx, x, (size_t) n * k * sizeof(float), &e2),
					&e2, "input") ||
			!gpu_ok(cai_cuda_graph_launch(gpu_ctx(), key, &e2), &e2, "launch") ||
			!gpu_download(got, dout, (size_t) n * m * sizeof(float)))
			break;
		gpu_same_f32(got, cpu, (size_t) n * m, "graph replay");
	}
	cai_cuda_graph_reset(gpu_ctx());
	CHECK(!cai_cuda_graph_has(gpu_ctx(), key));
freew:
	cai_cuda_qmatrix_free(gpu_ctx(), &dw);
done:
	host_qmatrix_free(&w);
out:
	free(x);
	free(xq);
	free(xs);
	free(cpu);
	free(got);
	cai_threadpool_free(pool);
}

TEST(gpu_graph_buckets)
{
	CHECK_EQ_INT(cai_cuda_graph_bucket(1), 1);
	CHECK_EQ_INT(cai_cuda_graph_bucket(3), 4);
	CHECK_EQ_INT(cai_cuda_graph_bucket(64), 64);
	CHECK_EQ_INT(cai_cuda_graph_bucket(65), 128);
	CHECK_EQ_INT(cai_cuda_graph_bucket(200), 256);
	CHECK_EQ_INT(cai_cuda_graph_bucket(512), 512);
	CHECK_EQ_INT(cai_cuda_graph_bucket(513), 0);
	CHECK_EQ_INT(cai_cuda_graph_bucket(0), 0);
}
