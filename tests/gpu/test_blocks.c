/*
 * test_blocks.c — the file's own block weights on the GPU (gemm_blocks.cu, blocks_pack.c, the
 * backend's four block operations) against the CPU backend's block GEMM (cpu/gemm_blocks.h).
 *
 * The repacking and the activations' quantization are exact: the weights the kernels multiply
 * are the CPU's bit for bit (the gpu_host_ test checks the repacking without a device, so it runs
 * in dry mode too), and q, s and sum equal cai_quantize_act_blocks'.  The GEMMs sum the same
 * per-block floats in another order (lanes, then a warp reduction; tiles of the tensor-core
 * kernel), so an output may differ from the CPU's by rounding: |gpu - cpu| <= 1e-5 * m + 1e-6,
 * m = sum_i |w_i x_i| over the dequantized operands (float sums of at most k / 32 terms in any
 * order stay well inside that).  A wrong level, scale, min, nibble half or block would miss by
 * about a whole term.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_cuda.h"
#include "cpu/gemm_blocks.h"
#include "gguf.h"
#include "kv.h"
#include "model.h"
#include "gpu_util.h"
#include "test.h"

typedef struct block_fmt
{
	ggml_type	type;
	const char *name;
	int			elems;			/* per source block */
	int			bytes;
	int			d_off;			/* the fp16 scale's offset */
	int			m_off;			/* the fp16 min's, or -1 */
} block_fmt;

static const block_fmt fmts[] = {
	{GGML_TYPE_Q4_0, "q4_0", 32, 18, 0, -1},
	{GGML_TYPE_Q4_1, "q4_1", 32, 20, 0, 2},
	{GGML_TYPE_Q5_0, "q5_0", 32, 22, 0, -1},
	{GGML_TYPE_Q5_1, "q5_1", 32, 24, 0, 2},
	{GGML_TYPE_Q8_0, "q8_0", 32, 34, 0, -1},
	{GGML_TYPE_Q4_K, "q4_k", 256, 144, 0, 2},
	{GGML_TYPE_Q5_K, "q5_k", 256, 176, 0, 2},
	{GGML_TYPE_Q6_K, "q6_k", 256, 210, 208, -1},
};

#define N_FMTS ((int) (sizeof(fmts) / sizeof(fmts[0])))

/* A random fp16 of magnitude 2^-9 .. 2^-4 (a sign with signed), little-endian at p. */
static void
put_half(gpu_rng *r, uint8_t *p, bool signed_)
{
	int			exp = gpu_rng_int(r, 6, 11);
	int			man = gpu_rng_int(r, 0, 1023);
	int			sign = signed_ ? gpu_rng_int(r, 0, 1) : 0;
	uint16_t	h = (uint16_t) ((sign << 15) | (exp << 10) | man);

	p[0] = (uint8_t) (h & 255);
	p[1] = (uint8_t) (h >> 8);
}

/* rows x k of format f: random bytes, with finite scales and mins. */
static uint8_t *
make_blocks(gpu_rng *r, const block_fmt *f, int rows, int k)
{
	size_t		n_blocks = (size_t) rows * (k / f->elems);
	uint8_t    *data = malloc(n_blocks * f->bytes);

	if (!data)
		return NULL;
	for (size_t i = 0; i < n_blocks * f->bytes; i++)
		data[i] = (uint8_t) gpu_rng_next(r);
	for (size_t b = 0; b < n_blocks; b++)
	{
		put_half(r, data + b * f->bytes + f->d_off, true);
		if (f->m_off >= 0)
			put_half(r, data + b * f->bytes + f->m_off, f->elems == 32);
	}
	return data;
}

/* Weight (o, i) of a repacked host matrix: the formula the kernels evaluate. */
static float
packed_weight(const cai_cuda_bmatrix_host *h, int o, int i)
{
	size_t		bi = (size_t) o * (h->k / 32) + i / 32;
	int			e = i % 32,
				q;
	const float *sc = h->sc + 2 * bi;

	if (h->nibble)
	{
		uint8_t		byte = h->q[bi * 16 + e % 16];

		q = e < 16 ? (byte & 15) : (byte >> 4);
	}
	else
		q = (int8_t) h->q[bi * 32 + e];
	if (h->split16)
		return (e < 16 ? sc[0] : sc[1]) * (float) q;
	return sc[0] * (float) q + sc[1];
}

/*
 * Needs no device: every format's repacked weights equal the CPU's (cai_cpu_bmatrix_row) for
 * every element, and hostile input (a NaN scale, a partial block) is refused.
 */
TEST(gpu_host_block_repack_matches_cpu)
{
	gpu_rng		r;

	gpu_rng_seed(&r, 39);
	for (int fi = 0; fi < N_FMTS; fi++)
	{
		const block_fmt *f = &fmts[fi];
		const int	rows = 5,
					k = 512;
		uint8_t    *data = make_blocks(&r, f, rows, k);
		cai_cuda_bmatrix_host h;
		cai_cpu_bmatrix cm;
		float	   *ref = malloc(k * sizeof(float)),
				   *got = malloc(k * sizeof(float));
		cai_error	err;

		if (!data || !ref || !got)
		{
			CHECK(false);
			free(data);
			free(ref);
			free(got);
			return;
		}
		CHECK(gpu_ok(cai_cuda_bmatrix_pack(f->type, data, rows, k, &h, &err), &err, f->name));
		CHECK(gpu_ok(cai_cpu_bmatrix_pack(f->type, data, rows, k, &cm, &err), &err, f->name));
		for (int o = 0; o < rows && h.q && cm.mem; o++)
		{
			cai_cpu_bmatrix_row(&cm, o, ref);
			for (int i = 0; i < k; i++)
				got[i] = packed_weight(&h, o, i);
			CHECK_MSG(gpu_near_f32(got, ref, k, 0.0, 0.0, f->name), "%s row %d", f->name, o);
		}
		cai_cuda_bmatrix_host_free(&h);
		cai_cpu_bmatrix_free(&cm);
		/* a NaN scale (fp16 0x7e00) in the last row, and a row that is not whole blocks */
		data[(size_t) (rows - 1) * (k / f->elems) * f->bytes + f->d_off] = 0x00;
		data[(size_t) (rows - 1) * (k / f->elems) * f->bytes + f->d_off + 1] = 0x7e;
		CHECK_EQ_INT(cai_cuda_bmatrix_pack(f->type, data, rows, k, &h, &err), CAI_ERR_FORMAT);
		CHECK_EQ_INT(cai_cuda_bmatrix_pack(f->type, data, rows, f->elems / 2, &h, &err),
					 CAI_ERR_FORMAT);
		free(data);
		free(ref);
		free(got);
	}
}

/* |gpu - cpu| <= 1e-5 * sum_i |w_i x_i| + 1e-6 for every output; see the top of the file. */
static bool
blocks_near(const float *gpu, const float *cpu, const float *mag, int n_tok, int n_out, int ldo,
			const char *what)
{
	int			bad = 0;

	for (int t = 0; t < n_tok; t++)
		for (int o = 0; o < n_out; o++)
		{
			double		g = gpu[(size_t) t * ldo + o],
						c = cpu[(size_t) t * ldo + o];
			double		tol = 1e-5 * mag[(size_t) t * n_out + o] + 1e-6;

			if (!(fabs(g - c) <= tol) && bad++ < 5)
				fprintf(stderr, "    %s: [%d, %d] gpu %.9g cpu %.9g tol %.3g\n", what, t, o, g,
						c, tol);
		}
	return bad == 0;
}

/* One GEMM case of one format and path against cai_gemm_blocks_portable. */
typedef struct gemm_case
{
	int			n_out;
	int			k;
	int			n_tok;
	bool		bias;
	bool		accumulate;
} gemm_case;

static void
check_block_gemm(gpu_rng *r, const block_fmt *f, const gemm_case *c, cai_cuda_blocks_path path)
{
	const int	k = c->k,
				nb = k / 32,
				ldo = c->n_out + 3;
	uint8_t    *data = make_blocks(r, f, c->n_out, k);
	float	   *x = malloc((size_t) c->n_tok * k * sizeof(float)),
			   *xs = malloc((size_t) c->n_tok * nb * sizeof(float)),
			   *b = malloc((size_t) c->n_out * sizeof(float)),
			   *init = malloc((size_t) c->n_tok * ldo * sizeof(float)),
			   *cpu = malloc((size_t) c->n_tok * ldo * sizeof(float)),
			   *got = malloc((size_t) c->n_tok * ldo * sizeof(float)),
			   *mag = calloc((size_t) c->n_tok * c->n_out, sizeof(float)),
			   *wrow = malloc((size_t) k * sizeof(float));
	int8_t	   *xq = malloc((size_t) c->n_tok * k);
	int16_t    *xsum = malloc((size_t) c->n_tok * nb * sizeof(int16_t));
	cai_cuda_bmatrix_host h = {0};
	cai_cuda_bmatrix dw = {0};
	cai_cpu_bmatrix cm = {0};
	cai_error	err;
	char		what[96];

	snprintf(what, sizeof(what), "%s %dx%d n_tok %d%s%s %s", f->name, c->n_out, k, c->n_tok,
			 c->bias ? " bias" : "", c->accumulate ? " accumulate" : "",
			 path == CAI_CUDA_BLOCKS_GEMV ? "gemv" : "mma");
	if (!data || !x || !xs || !b || !init || !cpu || !got || !mag || !wrow || !xq || !xsum)
	{
		CHECK(false);
		goto done;
	}
	gpu_fill_f32(r, x, (size_t) c->n_tok * k, -2.0f, 2.0f);
	memset(x, 0, 32 * sizeof(float));	/* a block of zeros: scale 0 */
	gpu_fill_f32(r, b, (size_t) c->n_out, -1.0f, 1.0f);
	gpu_fill_f32(r, init, (size_t) c->n_tok * ldo, -1.0f, 1.0f);
	cai_quantize_act_blocks(x, c->n_tok, k, 1, xq, xs, xsum);
	if (!gpu_ok(cai_cuda_bmatrix_pack(f->type, data, c->n_out, k, &h, &err), &err, what) ||
		!gpu_ok(cai_cpu_bmatrix_pack(f->type, data, c->n_out, k, &cm, &err), &err, what) ||
		!gpu_ok(cai_cuda_bmatrix_upload(gpu_ctx(), &h, what, &dw, &err), &err, what))
		goto done;
	for (int o = 0; o < c->n_out; o++)
	{
		cai_cpu_bmatrix_row(&cm, o, wrow);
		for (int t = 0; t < c->n_tok; t++)
			for (int i = 0; i < k; i++)
				mag[(size_t) t * c->n_out + o] +=
					fabsf(wrow[i] * (float) xq[(size_t) t * k + i] * xs[(size_t) t * nb + i / 32]);
	}
	memcpy(cpu, init, (size_t) c->n_tok * ldo * sizeof(float));
	cai_gemm_blocks_portable(xq, xs, xsum, 1, c->n_tok, &cm, c->n_out, c->bias ? b : NULL, cpu, ldo,
							 c->accumulate);
	{
		float	   *dout = gpu_upload(init, (size_t) c->n_tok * ldo * sizeof(float));

		if (gpu_ok(cai_cuda_gemm_blocks(gpu_ctx(), gpu_upload(xq, (size_t) c->n_tok * k),
										gpu_upload(xs, (size_t) c->n_tok * nb * sizeof(float)),
										gpu_upload(xsum, (size_t) c->n_tok * nb * sizeof(int16_t)),
										c->n_tok, &dw, c->n_out,
										c->bias ? gpu_upload(b, c->n_out * sizeof(float)) : NULL,
										dout, ldo, c->accumulate, path, &err), &err, what) &&
			gpu_sync() && gpu_download(got, dout, (size_t) c->n_tok * ldo * sizeof(float)))
			CHECK_MSG(blocks_near(got, cpu, mag, c->n_tok, c->n_out, ldo, what), "%s", what);
	}
done:
	cai_cuda_bmatrix_free(gpu_ctx(), &dw);
	cai_cuda_bmatrix_host_free(&h);
	if (cm.mem)
		cai_cpu_bmatrix_free(&cm);
	free(data), free(x), free(xs), free(b), free(init), free(cpu), free(got), free(mag);
	free(wrow), free(xq), free(xsum);
}

/*
 * Every format, both kernels: n_tok 1, 3 and 8 on the GEMV and on the tensor cores, 9, 64 and 70
 * (a partial tile) on the tensor cores; n_out of a partial group (37, 130); bias and accumulate;
 * k of 256 multiples (K-quants) and, for the 32-element formats, 96.
 */
TEST(gpu_blocks_gemm_near_cpu)
{
	static const gemm_case cases[] = {
		{37, 256, 1, true, false},
		{130, 512, 3, false, true},
		{64, 768, 8, true, true},
		{37, 256, 9, false, false},
		{130, 512, 64, true, false},
		{72, 256, 70, true, true},
	};
	gpu_rng		r;

	gpu_rng_seed(&r, 4);
	for (int fi = 0; fi < N_FMTS; fi++)
	{
		for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++)
		{
			if (cases[ci].n_tok <= 8)
				check_block_gemm(&r, &fmts[fi], &cases[ci], CAI_CUDA_BLOCKS_GEMV);
			check_block_gemm(&r, &fmts[fi], &cases[ci], CAI_CUDA_BLOCKS_MMA);
		}
		if (fmts[fi].elems == 32)
		{
			gemm_case	c96 = {29, 96, 2, true, true};

			check_block_gemm(&r, &fmts[fi], &c96, CAI_CUDA_BLOCKS_GEMV);
			check_block_gemm(&r, &fmts[fi], &c96, CAI_CUDA_BLOCKS_MMA);
		}
	}
}

/*
 * The activations per block of 32 and per super-block of 256 (the K-quants'): q, s and sum the
 * CPU's bit for bit (zero blocks included).
 */
TEST(gpu_blocks_quantize_bit_exact)
{
	const int	n_tok = 7,
				k = 768,
				nb = k / 32;
	float	   *x = malloc((size_t) n_tok * k * sizeof(float)),
			   *s = malloc((size_t) n_tok * nb * sizeof(float)),
			   *gs = malloc((size_t) n_tok * nb * sizeof(float));
	int8_t	   *q = malloc((size_t) n_tok * k),
			   *gq = malloc((size_t) n_tok * k);
	int16_t    *sum = malloc((size_t) n_tok * nb * sizeof(int16_t)),
			   *gsum = malloc((size_t) n_tok * nb * sizeof(int16_t));
	gpu_rng		r;
	cai_error	err;

	gpu_rng_seed(&r, 32);
	for (int group = 1; group <= 8 && x && s && gs && q && gq && sum && gsum; group += 7)
	{
		float	   *dx,
				   *ds;
		int8_t	   *dq;
		int16_t    *dsum;

		gpu_fill_f32(&r, x, (size_t) n_tok * k, -3.0f, 3.0f);
		memset(x + 64, 0, 32 * sizeof(float));
		x[200] = 1e-30f;		/* a block whose 127 / max overflows: zeros */
		for (int i = 201; i < 224; i++)
			x[i] = 0.0f;
		cai_quantize_act_blocks(x, n_tok, k, group, q, s, sum);
		dx = gpu_upload(x, (size_t) n_tok * k * sizeof(float));
		dq = gpu_alloc((size_t) n_tok * k);
		ds = gpu_alloc((size_t) n_tok * nb * sizeof(float));
		dsum = gpu_alloc((size_t) n_tok * nb * sizeof(int16_t));
		if (gpu_ok(cai_cuda_quantize_blocks(gpu_ctx(), dx, n_tok, k, group, dq, ds, dsum, &err), &err,
				   "block quantize") && gpu_sync() &&
			gpu_download(gq, dq, (size_t) n_tok * k) &&
			gpu_download(gs, ds, (size_t) n_tok * nb * sizeof(float)) &&
			gpu_download(gsum, dsum, (size_t) n_tok * nb * sizeof(int16_t)))
		{
			CHECK(gpu_same_i8(gq, q, (size_t) n_tok * k, "block levels"));
			CHECK(gpu_same_f32(gs, s, (size_t) n_tok * nb, "block scales"));
			CHECK(memcmp(gsum, sum, (size_t) n_tok * nb * sizeof(int16_t)) == 0);
		}
	}
	CHECK(x && s && gs && q && gq && sum && gsum);
	free(x), free(s), free(gs), free(q), free(gq), free(sum), free(gsum);
}


/* A device buffer of the backend (ops->alloc) filled from host memory. */
static void *
be_upload(cai_backend *be, const void *host, size_t bytes)
{
	void	   *p = be->ops->alloc(be, bytes);
	cai_error	err;

	if (p && host && !gpu_ok(cai_cuda_upload_sync(gpu_ctx(), p, host, bytes, &err), &err, "upload"))
		return NULL;
	return p;
}

/* sum_i |w(o, i) x(t, i)| of the two parts' repacked weights and the quantized activations. */
static void
backend_mag(const cai_bmatrix *m, const int8_t *xq, const float *xs, int n_tok, int n_out,
			float *mag)
{
	int			row0 = 0;

	memset(mag, 0, (size_t) n_tok * n_out * sizeof(float));
	for (int pi = 0; pi < m->n_parts; pi++)
	{
		cai_cuda_bmatrix_host h;
		cai_error	err;

		if (!gpu_ok(cai_cuda_bmatrix_pack(m->part[pi].type, m->part[pi].data, m->part[pi].rows,
										  m->k, &h, &err), &err, "repack"))
			return;
		for (int o = 0; o < h.n_out && row0 + o < n_out; o++)
			for (int t = 0; t < n_tok; t++)
				for (int i = 0; i < m->k; i++)
					mag[(size_t) t * n_out + row0 + o] +=
						fabsf(packed_weight(&h, o, i) * (float) xq[(size_t) t * m->k + i] *
							  xs[(size_t) t * (m->k / 32) + i / 32]);
		row0 += h.n_out;
		cai_cuda_bmatrix_host_free(&h);
	}
}

/*
 * One batch of n_tok through both backends' quantize_blocks and gemm_blocks: all rows into
 * backend memory; then the first 24 rows with a bias, accumulated into host memory.
 */
static void
compare_gemm(gpu_rng *r, cai_backend *gb, cai_backend *cb, const cai_bmatrix *src,
			 const cai_weight *gw, const cai_weight *cw, int n_tok)
{
	const int	k = src->k,
				nb = k / 32,
				n_out = src->n_out,
				part = 24;
	size_t		nx = (size_t) n_tok * k;
	float	   *x = malloc(nx * sizeof(float)),
			   *bias = malloc((size_t) n_out * sizeof(float)),
			   *got = malloc((size_t) n_tok * n_out * sizeof(float)),
			   *host = malloc((size_t) n_tok * n_out * sizeof(float)),
			   *mag = malloc((size_t) n_tok * n_out * sizeof(float));
	float	   *cx = cb->ops->alloc(cb, nx * sizeof(float)),
			   *cs = cb->ops->alloc(cb, (size_t) n_tok * nb * sizeof(float)),
			   *cout = cb->ops->alloc(cb, (size_t) n_tok * n_out * sizeof(float));
	int8_t	   *cq = cb->ops->alloc(cb, nx);
	int16_t    *csum = cb->ops->alloc(cb, (size_t) n_tok * nb * sizeof(int16_t));
	float	   *gx,
			   *gs,
			   *gout;
	int8_t	   *gq;
	int16_t    *gsum;
	const float *gbias;
	cai_error	err;

	if (!x || !bias || !got || !host || !mag || !cx || !cs || !cout || !cq || !csum)
	{
		CHECK(false);
		goto done;
	}
	gpu_fill_f32(r, x, nx, -2.0f, 2.0f);
	gpu_fill_f32(r, bias, (size_t) n_out, -1.0f, 1.0f);
	gpu_fill_f32(r, host, (size_t) n_tok * n_out, -1.0f, 1.0f);
	memcpy(cx, x, nx * sizeof(float));
	gx = be_upload(gb, x, nx * sizeof(float));
	gq = be_upload(gb, NULL, nx);
	gs = be_upload(gb, NULL, (size_t) n_tok * nb * sizeof(float));
	gsum = be_upload(gb, NULL, (size_t) n_tok * nb * sizeof(int16_t));
	gout = be_upload(gb, NULL, (size_t) n_tok * n_out * sizeof(float));
	gbias = gb->ops->weight_data(gb, bias, (size_t) n_out * sizeof(float), &err);
	if (!gx || !gq || !gs || !gsum || !gout || !gbias)
	{
		CHECK(false);
		goto done;
	}
	cb->ops->quantize_blocks(cb, cx, n_tok, k, cw, false, cq, cs, csum);
	gb->ops->quantize_blocks(gb, gx, n_tok, k, gw, false, gq, gs, gsum);
	backend_mag(src, cq, cs, n_tok, n_out, mag);
	cb->ops->gemm_blocks(cb, cq, cs, csum, n_tok, cw, false, n_out, NULL, cout, n_out, false);
	gb->ops->gemm_blocks(gb, gq, gs, gsum, n_tok, gw, false, n_out, NULL, gout, n_out, false);
	if (gpu_ok(gb->ops->sync(gb, &err), &err, "block gemm") &&
		gpu_download(got, gout, (size_t) n_tok * n_out * sizeof(float)))
		CHECK(blocks_near(got, cout, mag, n_tok, n_out, n_out, "backend block gemm"));
	/* the first rows only (a multiple of 8), bias, accumulated into host memory */
	memcpy(cout, host, (size_t) n_tok * n_out * sizeof(float));
	cb->ops->gemm_blocks(cb, cq, cs, csum, n_tok, cw, false, part, bias, cout, n_out, true);
	gb->ops->gemm_blocks(gb, gq, gs, gsum, n_tok, gw, false, part, gbias, host, n_out, true);
	if (gpu_ok(gb->ops->sync(gb, &err), &err, "block gemm to host"))
		CHECK(blocks_near(host, cout, mag, n_tok, part, n_out, "backend block gemm to host"));
done:
	free(x), free(bias), free(got), free(host), free(mag);
}

/* Both backends' embed_blocks of the same ids: the same floats. */
static void
compare_embed(cai_backend *gb, cai_backend *cb, const cai_bmatrix *table)
{
	const int32_t ids[5] = {3, 49, 0, 17, 3};
	const int	k = table->k;
	float	   *cx = cb->ops->alloc(cb, 5 * (size_t) k * sizeof(float)),
			   *gx = be_upload(gb, NULL, 5 * (size_t) k * sizeof(float)),
			   *got = malloc(5 * (size_t) k * sizeof(float));
	cai_error	err;

	if (!cx || !gx || !got)
	{
		CHECK(false);
		free(got);
		return;
	}
	/* the CPU first: the CUDA backend drops the table's pages (zeros here) once it has uploaded it */
	cb->ops->embed_blocks(cb, table, ids, 5, cx);
	gb->ops->embed_blocks(gb, table, ids, 5, gx);
	if (gpu_ok(gb->ops->sync(gb, &err), &err, "block embedding") &&
		gpu_download(got, gx, 5 * (size_t) k * sizeof(float)))
		CHECK(gpu_near_f32(got, cx, 5 * (size_t) k, 0.0, 0.0, "block embedding"));
	free(got);
}

/* A model the backend's parameters need (its weights are not read by these operations). */
static cai_model blocks_model;

/*
 * Through the backend table: a two-part matrix (Q4_K rows over Q6_K rows, as a QKV matrix may
 * be) multiplied on the CUDA backend and on the CPU backend, into backend memory and into host
 * memory (the logits' way), all rows and the first 24; then the embedding of a Q8_0 table,
 * exactly.
 */
TEST(gpu_backend_block_ops_match_cpu)
{
	const int	k = 256,
				rows0 = 24,
				rows1 = 16,
				n_out = rows0 + rows1;
	cai_backend_limits lim = {.max_tokens = 40, .max_context = 64, .max_width = 512,
	.n_heads = 2, .n_kv_heads = 1, .head_dim = 64};
	cai_cuda_backend_params p;
	cai_backend *gb = NULL,
			   *cb = NULL;
	gpu_rng		r;
	cai_error	err;

	memset(&p, 0, sizeof(p));
	p.limits = lim;
	p.model = &blocks_model;
	p.kv_pool_layout = cai_kv_pool_layout;
	p.kv_pool_n_blocks = cai_kv_pool_n_blocks;
	gpu_rng_seed(&r, 7);
	if (!gpu_ok(cai_cuda_backend_create(&p, &gb, &err), &err, "cuda backend") ||
		!gpu_ok(cai_backend_cpu_create(NULL, &lim, &cb, &err), &err, "cpu backend"))
		goto done;
	{
		/*
		 * both backends drop the pages of what they repacked (zeros, in malloc'd memory): each
		 * gets its own copy, and a0, a1 stay for the tolerance
		 */
		uint8_t    *a0 = make_blocks(&r, &fmts[5], rows0, k),
				   *a1 = make_blocks(&r, &fmts[7], rows1, k),
				   *c0 = malloc((size_t) rows0 * (k / 256) * 144),
				   *c1 = malloc((size_t) rows1 * (k / 256) * 210),
				   *g0 = malloc((size_t) rows0 * (k / 256) * 144),
				   *g1 = malloc((size_t) rows1 * (k / 256) * 210),
				   *emb = make_blocks(&r, &fmts[4], 50, k);
		cai_bmatrix gm = {.n_out = n_out, .k = k, .n_parts = 2},
					cmx,
					et = {.n_out = 50, .k = k, .n_parts = 1};
		cai_bmatrix gsrc_m;
		const cai_bmatrix *gsrc[1] = {&gsrc_m},
				   *csrc[1] = {&cmx};
		const cai_weight *gw = NULL,
				   *cw = NULL;

		memcpy(c0, a0, (size_t) rows0 * 144);
		memcpy(c1, a1, (size_t) rows1 * 210);
		memcpy(g0, a0, (size_t) rows0 * 144);
		memcpy(g1, a1, (size_t) rows1 * 210);
		gm.part[0] = (cai_bmatrix_part) {GGML_TYPE_Q4_K, rows0, a0};
		gm.part[1] = (cai_bmatrix_part) {GGML_TYPE_Q6_K, rows1, a1};
		cmx = gm;
		cmx.part[0].data = c0;
		cmx.part[1].data = c1;
		gsrc_m = gm;
		gsrc_m.part[0].data = g0;
		gsrc_m.part[1].data = g1;
		et.part[0] = (cai_bmatrix_part) {GGML_TYPE_Q8_0, 50, emb};
		if (gpu_ok(gb->ops->prepare_blocks(gb, gsrc, 1, &gw, &err), &err, "cuda prepare_blocks") &&
			gpu_ok(cb->ops->prepare_blocks(cb, csrc, 1, &cw, &err), &err, "cpu prepare_blocks"))
		{
			compare_gemm(&r, gb, cb, &gm, gw, cw, 5);
			compare_gemm(&r, gb, cb, &gm, gw, cw, 40);
			compare_embed(gb, cb, &et);
		}
		free(a0), free(a1), free(c0), free(c1), free(g0), free(g1), free(emb);
	}
done:
	cai_backend_free(gb);
	cai_backend_free(cb);
}
