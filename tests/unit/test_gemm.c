/*
 * test_gemm.c — the CPU int8 and float GEMMs and per-token activation quantization.
 *
 * The int8 GEMM must be exact: every path (generic, AVX2, AVX-512 VNNI) is compared against an
 * int64 reference accumulation pushed through the same epilogue expression, and against each
 * other bit for bit; results must not depend on threads or on how many tokens share a call.
 * The float GEMM must be invariant to batching and threads within a path and close to a double
 * reference.  W8A8 quantization error is checked against the bound derived in
 * gemm_i8_close_to_f32.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/gemm.h"
#include "test.h"

static const char *const all_isas[] = {"generic", "avx2", "avx-vnni", "avx512-vnni", "avx512-amx"};

#define N_ISAS ((int) (sizeof(all_isas) / sizeof(all_isas[0])))

/* xorshift64*: deterministic test data. */
static uint64_t
rng_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ULL;
}

static int8_t
rng_i8(uint64_t *s)
{
	return (int8_t) ((int) (rng_next(s) % 255) - 127);
}

static float
rng_uniform(uint64_t *s)
{
	return (float) ((rng_next(s) >> 40) * (1.0 / 16777216.0));
}

/* Standard normal via Box-Muller. */
static float
rng_gauss(uint64_t *s)
{
	double		u1 = ((rng_next(s) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
	double		u2 = (rng_next(s) >> 11) * (1.0 / 9007199254740992.0);

	return (float) (sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

/*
 * The kernels' epilogue, recomputed: ((float) acc * xs) * ws, + bias, then store or add.
 * volatile keeps every step rounded to float (no fused multiply-add).
 */
static float
ref_epilogue(float prev, int64_t acc, float xs, float ws, const float *bias, int o,
			 bool accumulate)
{
	volatile float v = (float) (int32_t) acc * xs;

	v = v * ws;
	if (bias)
		v = v + bias[o];
	return accumulate ? prev + v : v;
}

/* Restores the automatically chosen ISA after a test forced one. */
static const char *
saved_isa(void)
{
	return cai_cpu_isa();
}

/* A random int8 problem. */
typedef struct i8_problem
{
	int			n_tok,
				k,
				n_out;
	int8_t	   *x;
	float	   *xs;
	int8_t	   *wrow;			/* the weights row-major: the reference's */
	int8_t	   *wq;				/* the matrix's bytes (packed unless asked otherwise) */
	float	   *ws;
	float	   *bias;
	cai_cpu_qmatrix m;
} i8_problem;

/* A random problem; its matrix packed for the fast kernels unless row_major. */
static bool
i8_problem_make_layout(i8_problem *p, int n_tok, int k, int n_out, uint64_t seed, bool extreme,
					   bool row_major)
{
	memset(p, 0, sizeof(*p));
	p->n_tok = n_tok;
	p->k = k;
	p->n_out = n_out;
	p->x = malloc((size_t) n_tok * k);
	p->xs = malloc(sizeof(float) * n_tok);
	p->wrow = malloc((size_t) n_out * k);
	p->wq = malloc((size_t) n_out * k);
	p->ws = malloc(sizeof(float) * n_out);
	p->bias = malloc(sizeof(float) * n_out);
	if (!p->x || !p->xs || !p->wrow || !p->wq || !p->ws || !p->bias)
		return false;
	for (size_t i = 0; i < (size_t) n_tok * k; i++)
		p->x[i] = extreme ? (i % 3 ? -127 : 127) : rng_i8(&seed);
	for (size_t i = 0; i < (size_t) n_out * k; i++)
		p->wrow[i] = extreme ? ((i / 7) % 2 ? -127 : 127) : rng_i8(&seed);
	memcpy(p->wq, p->wrow, (size_t) n_out * k);
	for (int t = 0; t < n_tok; t++)
		p->xs[t] = (t % 5 == 4) ? 0.0f : 1e-3f * (1.0f + 3.0f * rng_uniform(&seed));
	for (int o = 0; o < n_out; o++)
	{
		p->ws[o] = 1e-2f * (0.5f + rng_uniform(&seed));
		p->bias[o] = rng_uniform(&seed) - 0.5f;
	}
	p->m = (cai_cpu_qmatrix) {n_out, k, p->wq, p->ws, false};
	return row_major || cai_cpu_qmatrix_pack(&p->m);
}

static bool
i8_problem_make(i8_problem *p, int n_tok, int k, int n_out, uint64_t seed, bool extreme)
{
	return i8_problem_make_layout(p, n_tok, k, n_out, seed, extreme, false);
}

static void
i8_problem_free(i8_problem *p)
{
	free(p->x);
	free(p->xs);
	free(p->wrow);
	free(p->wq);
	free(p->ws);
	free(p->bias);
}

/* Counts outputs differing from the int64 reference pushed through the epilogue. */
static int
i8_mismatches(const i8_problem *p, const float *out, const float *prev, int ldo, bool bias,
			  bool accumulate)
{
	int			bad = 0;

	for (int t = 0; t < p->n_tok; t++)
		for (int o = 0; o < p->n_out; o++)
		{
			int64_t		acc = 0;
			float		want;

			for (int i = 0; i < p->k; i++)
				acc += (int64_t) p->x[(size_t) t * p->k + i] * p->wrow[(size_t) o * p->k + i];
			want = ref_epilogue(prev[(size_t) t * ldo + o], acc, p->xs[t], p->ws[o],
								bias ? p->bias : NULL, o, accumulate);
			if (memcmp(&want, &out[(size_t) t * ldo + o], sizeof(float)) != 0)
				bad++;
		}
	return bad;
}

/*
 * Packing: every byte lands where the layout says (a hand-computed position in a full and in
 * the partial last panel, stored biased), and reading rows back gives the original matrix.
 */
TEST(gemm_qmatrix_pack_layout_round_trip)
{
	enum {N = 37, K = 12};			/* two full panels and one of 5 channels */
	int8_t		orig[N * K],
				q[N * K],
				row[K];
	float		s[N];
	cai_cpu_qmatrix m;
	uint64_t	seed = 3;

	for (int i = 0; i < N * K; i++)
		orig[i] = i == 0 ? -127 : rng_i8(&seed);
	memcpy(q, orig, sizeof(q));
	for (int o = 0; o < N; o++)
		s[o] = 1.0f;
	m = (cai_cpu_qmatrix) {N, K, q, s, false};
	CHECK(cai_cpu_qmatrix_pack(&m) && m.packed);
	/* channel 3, inputs 4..7 (step 1) of panel 0: offset 1 * 64 + 3 * 4 */
	for (int b = 0; b < 4; b++)
		CHECK_EQ_INT((uint8_t) q[64 + 12 + b], (uint8_t) orig[3 * K + 4 + b] ^ 0x80);
	/* channel 34 (c = 2 of the 5-wide last panel), step 2: 32 * K + 2 * 20 + 2 * 4 */
	for (int b = 0; b < 4; b++)
		CHECK_EQ_INT((uint8_t) q[32 * K + 40 + 8 + b], (uint8_t) orig[34 * K + 8 + b] ^ 0x80);
	CHECK_EQ_INT((uint8_t) q[0], 0x01);	/* -127 biased */
	for (int o = 0; o < N; o++)
	{
		cai_cpu_qmatrix_row(&m, o, row);
		CHECK(memcmp(row, orig + o * K, K) == 0);
	}
	{
		int8_t		all[N * K];

		cai_cpu_qmatrix_unpack(&m, all);
		CHECK(memcmp(all, orig, sizeof(all)) == 0);
	}
	/* packing twice is a no-op */
	CHECK(cai_cpu_qmatrix_pack(&m));
	cai_cpu_qmatrix_row(&m, 36, row);
	CHECK(memcmp(row, orig + 36 * K, K) == 0);
}

/*
 * Every available path, odd shapes (k a multiple of 4 but not of 64, channels not a multiple of
 * any block) and k of one and of three 64-input AMX tiles, with and without bias, store and accumulate, padded output rows; must equal the
 * int64 reference exactly.  The "extreme" data (all +-127) drives the AVX2 sign trick and the
 * VNNI offset correction to their limits.  Some matrices stay row-major (the portable kernel
 * every path falls back to for them).
 */
TEST(gemm_i8_exact_every_isa)
{
	static const int toks[] = {1, 3, 17, 64, 70};
	static const int ks[] = {36, 64, 192, 580};
	static const int outs[] = {1, 7, 48, 130};
	const char *orig = saved_isa();
	cai_threadpool *pool = cai_threadpool_create(2);
	uint64_t	seed = 7;
	int			tested_isas = 0;

	CHECK(pool != NULL);
	for (int isa = 0; isa < N_ISAS; isa++)
	{
		if (!cai_cpu_force_isa(all_isas[isa]))
			continue;
		tested_isas++;
		for (int a = 0; a < 5; a++)
			for (int b = 0; b < 4; b++)
				for (int c = 0; c < 4; c++)
				{
					i8_problem p;
					int			ldo = outs[c] + 3;
					size_t		n_out_f = (size_t) toks[a] * ldo;
					float	   *out = malloc(sizeof(float) * n_out_f);
					float	   *prev = malloc(sizeof(float) * n_out_f);
					int			mode = (a + b + c) % 4;	/* bias x accumulate */
					bool		bias = mode & 1;
					bool		accumulate = mode & 2;
					bool		extreme = (a + b + c) % 3 == 0;
					bool		row_major = (a + 2 * b + c) % 5 == 0;

					CHECK(out && prev && i8_problem_make_layout(&p, toks[a], ks[b], outs[c],
																 seed++, extreme, row_major));
					for (size_t i = 0; i < n_out_f; i++)
						prev[i] = out[i] = rng_uniform(&seed);
					cai_gemm_i8((a & 1) ? pool : NULL, p.x, p.xs, p.n_tok, &p.m,
								bias ? p.bias : NULL, out, ldo, accumulate);
					CHECK_MSG(i8_mismatches(&p, out, prev, ldo, bias, accumulate) == 0,
							  "isa %s n_tok %d k %d n_out %d bias %d acc %d row-major %d",
							  all_isas[isa], toks[a], ks[b], outs[c], bias, accumulate,
							  row_major);
					/* the padding between rows is untouched */
					for (int t = 0; t < p.n_tok; t++)
						for (int o = p.n_out; o < ldo; o++)
							CHECK(out[(size_t) t * ldo + o] == prev[(size_t) t * ldo + o]);
					i8_problem_free(&p);
					free(out);
					free(prev);
				}
	}
	CHECK(tested_isas >= 1);
	CHECK(cai_cpu_force_isa(orig));
	cai_threadpool_free(pool);
}

/*
 * Bit-identical across paths, thread counts and batch sizes: token t computed alone equals
 * token t computed in a batch of 64, with 1 or 2 threads, on every available ISA.
 */
TEST(gemm_i8_identical_across_isas_threads_batches)
{
	enum {T = 64, K = 580, N = 333};
	const char *orig = saved_isa();
	cai_threadpool *pool2 = cai_threadpool_create(2);
	i8_problem	p;
	float	   *ref = malloc(sizeof(float) * T * N);
	float	   *out = malloc(sizeof(float) * T * N);
	bool		have_ref = false;

	CHECK(pool2 && ref && out && i8_problem_make(&p, T, K, N, 99, false));
	for (int isa = 0; isa < N_ISAS; isa++)
	{
		if (!cai_cpu_force_isa(all_isas[isa]))
			continue;
		for (int threads = 1; threads <= 2; threads++)
		{
			cai_threadpool *pool = threads == 2 ? pool2 : NULL;

			cai_gemm_i8(pool, p.x, p.xs, T, &p.m, p.bias, out, N, false);
			if (!have_ref)
			{
				memcpy(ref, out, sizeof(float) * T * N);
				have_ref = true;
			}
			CHECK_MSG(memcmp(ref, out, sizeof(float) * T * N) == 0, "isa %s threads %d batch",
					  all_isas[isa], threads);
			/* one token at a time, and in uneven sub-batches */
			memset(out, 0, sizeof(float) * T * N);
			for (int t = 0; t < T;)
			{
				int			n = (t % 3 == 0) ? 1 : (t % 3 == 1 ? 5 : 9);

				if (n > T - t)
					n = T - t;
				cai_gemm_i8(pool, p.x + (size_t) t * K, p.xs + t, n, &p.m, p.bias,
							out + (size_t) t * N, N, false);
				t += n;
			}
			CHECK_MSG(memcmp(ref, out, sizeof(float) * T * N) == 0,
					  "isa %s threads %d sub-batches", all_isas[isa], threads);
		}
	}
	CHECK(cai_cpu_force_isa(orig));
	i8_problem_free(&p);
	free(ref);
	free(out);
	cai_threadpool_free(pool2);
}

/* Rows of zero scale (x quantized from an all-zero row) give exactly 0, or the bias. */
TEST(gemm_i8_zero_rows)
{
	enum {K = 68, N = 19};
	float		x[2 * K] = {0};
	int8_t		xq[2 * K];
	float		xs[2];
	i8_problem	p;
	float		out[2 * N];

	CHECK(i8_problem_make(&p, 1, K, N, 5, false));
	for (int i = 0; i < K; i++)
		x[K + i] = (float) i - 30.0f;
	cai_quantize_act_i8(x, 2, K, xq, xs);
	CHECK(xs[0] == 0.0f);
	cai_gemm_i8(NULL, xq, xs, 2, &p.m, NULL, out, N, false);
	for (int o = 0; o < N; o++)
		CHECK(out[o] == 0.0f);
	cai_gemm_i8(NULL, xq, xs, 2, &p.m, p.bias, out, N, false);
	for (int o = 0; o < N; o++)
		CHECK(out[o] == p.bias[o]);
	i8_problem_free(&p);
}

/* Double-precision reference of the float GEMM. */
static double
f32_ref_dot(const float *x, const float *w, int k)
{
	double		s = 0;

	for (int i = 0; i < k; i++)
		s += (double) x[i] * w[i];
	return s;
}

/*
 * The float GEMM per path: within |error| <= k * 2^-22 * sum|x*w| of a double reference (a
 * loose bound for float summation of k terms), and bit-identical whatever the batch split and
 * the thread count.  The two FMA paths (AVX2, AVX-512) implement the same order, so they must
 * agree with each other bit for bit too.
 */
TEST(gemm_f32_fixed_order_every_isa)
{
	enum {T = 33, N = 45};
	static const int ks[] = {4, 20, 576, 580};
	const char *orig = saved_isa();
	cai_threadpool *pool = cai_threadpool_create(2);
	float	   *fma_ref[4] = {NULL};

	CHECK(pool != NULL);
	for (int isa = 0; isa < N_ISAS; isa++)
	{
		if (!cai_cpu_force_isa(all_isas[isa]))
			continue;
		for (int b = 0; b < 4; b++)
		{
			uint64_t	seed = 11 + b;
			int			k = ks[b];
			float	   *x = malloc(sizeof(float) * T * k);
			float	   *w = malloc(sizeof(float) * N * k);
			float		bias[N];
			float	   *out = malloc(sizeof(float) * T * N);
			float	   *one = malloc(sizeof(float) * T * N);
			int			far = 0;

			CHECK(x && w && out && one);
			for (int i = 0; i < T * k; i++)
				x[i] = rng_gauss(&seed);
			for (int i = 0; i < N * k; i++)
				w[i] = rng_gauss(&seed);
			for (int o = 0; o < N; o++)
				bias[o] = rng_gauss(&seed);
			cai_gemm_f32(pool, x, T, k, w, N, bias, out, N, false);
			for (int t = 0; t < T; t++)
				for (int o = 0; o < N; o++)
				{
					double		mag = 0;

					for (int i = 0; i < k; i++)
						mag += fabs((double) x[t * k + i] * w[o * k + i]);
					if (fabs(out[t * N + o] - (f32_ref_dot(x + t * k, w + o * k, k) + bias[o])) >
						k * ldexp(1.0, -22) * mag + 1e-6 * fabs(bias[o]))
						far++;
				}
			CHECK_MSG(far == 0, "isa %s k %d: %d outputs far from the reference", all_isas[isa],
					  k, far);
			/* token by token, one thread, accumulating onto zeros: the same bits */
			memset(one, 0, sizeof(float) * T * N);
			for (int t = 0; t < T; t++)
				cai_gemm_f32(NULL, x + (size_t) t * k, 1, k, w, N, bias, one + (size_t) t * N, N,
							 true);
			CHECK_MSG(memcmp(out, one, sizeof(float) * T * N) == 0, "isa %s k %d batching",
					  all_isas[isa], k);
			if (strcmp(all_isas[isa], "generic") != 0)
			{
				if (!fma_ref[b])
				{
					fma_ref[b] = out;
					out = NULL;
				}
				else
					CHECK_MSG(memcmp(out, fma_ref[b], sizeof(float) * T * N) == 0,
							  "isa %s k %d differs from the other FMA path", all_isas[isa], k);
			}
			free(x);
			free(w);
			free(out);
			free(one);
		}
	}
	for (int b = 0; b < 4; b++)
		free(fma_ref[b]);
	CHECK(cai_cpu_force_isa(orig));
	cai_threadpool_free(pool);
}

/*
 * W8A8 against the float GEMM on Gaussian data.  Rounding to a grid of step D = max/127 leaves
 * a uniform error of variance D^2 / 12 per element.  For k = 576 Gaussian values max|x| is
 * about 3.3 sigma (rarely above 4 sigma), so the relative error variance of one quantized
 * vector is (3.3/127)^2 / 12 = 5.6e-5 (at 4 sigma, 8.3e-5).  A dot product of two independently
 * quantized vectors picks up both errors: relative variance 2 * 5.6e-5, i.e. about 1.06% RMS
 * (1.3% at the 4-sigma extreme).  The relative Frobenius error over many outputs concentrates
 * at that value, so it must be below 2% and, as a check that quantization really happened,
 * above 0.5%.
 */
TEST(gemm_i8_close_to_f32)
{
	enum {T = 16, K = 576, N = 256};
	const char *orig = saved_isa();
	float	   *x = malloc(sizeof(float) * T * K);
	float	   *w = malloc(sizeof(float) * N * K);
	int8_t	   *xq = malloc((size_t) T * K);
	int8_t	   *wq = malloc((size_t) N * K);
	float		xs[T],
				ws[N];
	float	   *yf = malloc(sizeof(float) * T * N);
	float	   *yq = malloc(sizeof(float) * T * N);
	uint64_t	seed = 2024;
	cai_cpu_qmatrix m = {N, K, wq, ws, false};

	CHECK(x && w && xq && wq && yf && yq);
	for (int i = 0; i < T * K; i++)
		x[i] = rng_gauss(&seed);
	for (int i = 0; i < N * K; i++)
		w[i] = 0.05f * rng_gauss(&seed);
	/* weights quantized per channel the same way activations are per token */
	cai_quantize_act_i8(w, N, K, wq, ws);
	CHECK(cai_cpu_qmatrix_pack(&m));
	for (int isa = 0; isa < N_ISAS; isa++)
	{
		double		num = 0,
					den = 0,
					rel;

		if (!cai_cpu_force_isa(all_isas[isa]))
			continue;
		cai_quantize_act_i8(x, T, K, xq, xs);
		cai_gemm_i8(NULL, xq, xs, T, &m, NULL, yq, N, false);
		cai_gemm_f32(NULL, x, T, K, w, N, NULL, yf, N, false);
		for (int i = 0; i < T * N; i++)
		{
			num += ((double) yq[i] - yf[i]) * ((double) yq[i] - yf[i]);
			den += (double) yf[i] * yf[i];
		}
		rel = sqrt(num / den);
		CHECK_MSG(rel < 0.02 && rel > 0.005, "isa %s relative error %g", all_isas[isa], rel);
	}
	CHECK(cai_cpu_force_isa(orig));
	free(x);
	free(w);
	free(xq);
	free(wq);
	free(yf);
	free(yq);
}

/*
 * Activation quantization: scale = max|x| / 127, q = rint(x * (127 / max|x|)) clamped to
 * [-127, 127]; a zero (or subnormal-only) row gives scale 0 and zeros; huge values do not
 * overflow; a negative extreme maps to -127; every path gives the same bytes and scales.
 */
TEST(gemm_quantize_act_edge_cases)
{
	enum {K = 100};
	const char *orig = saved_isa();
	float		x[6 * K];
	int8_t		q[6 * K],
				q0[6 * K];
	float		s[6],
				s0[6];
	uint64_t	seed = 3;
	bool		have_ref = false;

	for (int i = 0; i < K; i++)
	{
		x[i] = 0.0f;			/* row 0: zeros */
		x[K + i] = (i == 37) ? -5.0f : (float) (i % 9) * 0.5f - 2.0f;	/* row 1: negative max */
		x[2 * K + i] = (i % 2 ? -3e38f : 1e30f) * rng_uniform(&seed);	/* row 2: huge */
		x[2 * K + 11] = -3.2e38f;
		x[3 * K + i] = rng_gauss(&seed);	/* row 3: ordinary */
		x[4 * K + i] = (i % 4) ? 1e-41f : -2e-40f;	/* row 4: subnormal only */
		x[5 * K + i] = (float) (i % 255) - 127.0f;	/* row 5: max 127, scale 1 */
	}
	x[3 * K + 50] = 0.5f * 4.0f;
	for (int isa = 0; isa < N_ISAS; isa++)
	{
		if (!cai_cpu_force_isa(all_isas[isa]))
			continue;
		cai_quantize_act_i8(x, 6, K, q, s);

		CHECK(s[0] == 0.0f);
		for (int i = 0; i < K; i++)
			CHECK_EQ_INT(q[i], 0);

		CHECK(s[1] == 5.0f / 127.0f);
		CHECK_EQ_INT(q[K + 37], -127);
		for (int i = 0; i < K; i++)
		{
			CHECK(q[K + i] >= -127 && q[K + i] <= 127);
			CHECK_EQ_INT(q[K + i], (int) rintf(x[K + i] * (127.0f / 5.0f)));
		}

		CHECK(s[2] == 3.2e38f / 127.0f);
		CHECK(isfinite(s[2]));
		CHECK_EQ_INT(q[2 * K + 11], -127);
		for (int i = 0; i < K; i++)
			CHECK(q[2 * K + i] >= -127 && q[2 * K + i] <= 127);

		for (int i = 0; i < K; i++)
		{
			float		amax = 0;

			for (int j = 0; j < K; j++)
				amax = fmaxf(amax, fabsf(x[3 * K + j]));
			CHECK_EQ_INT(q[3 * K + i], (int) rintf(x[3 * K + i] * (127.0f / amax)));
			CHECK(fabsf(q[3 * K + i] * s[3] - x[3 * K + i]) <= 0.5f * s[3] * 1.0001f);
		}

		CHECK(s[4] == 0.0f);
		for (int i = 0; i < K; i++)
			CHECK_EQ_INT(q[4 * K + i], 0);

		CHECK(s[5] == 1.0f);
		for (int i = 0; i < K; i++)
			CHECK_EQ_INT(q[5 * K + i], (int) x[5 * K + i]);

		if (!have_ref)
		{
			memcpy(q0, q, sizeof(q));
			memcpy(s0, s, sizeof(s));
			have_ref = true;
		}
		CHECK_MSG(memcmp(q0, q, sizeof(q)) == 0 && memcmp(s0, s, sizeof(s)) == 0,
				  "isa %s differs", all_isas[isa]);
	}
	CHECK(cai_cpu_force_isa(orig));
}

/* Lengths around the vector widths quantize the same on every path (tails, masks). */
TEST(gemm_quantize_act_identical_lengths)
{
	const char *orig = saved_isa();
	float		x[3 * 203];
	int8_t		q[3 * 203],
				q0[3 * 203];
	float		s[3],
				s0[3];
	uint64_t	seed = 8;

	for (int i = 0; i < 3 * 203; i++)
		x[i] = rng_gauss(&seed) * (i % 7 == 0 ? 10.0f : 1.0f);
	for (int k = 1; k <= 203; k += 3)
	{
		bool		have_ref = false;

		for (int isa = 0; isa < N_ISAS; isa++)
		{
			if (!cai_cpu_force_isa(all_isas[isa]))
				continue;
			memset(q, 0x55, sizeof(q));
			cai_quantize_act_i8(x, 3, k, q, s);
			if (!have_ref)
			{
				memcpy(q0, q, sizeof(q));
				memcpy(s0, s, sizeof(s));
				have_ref = true;
			}
			CHECK_MSG(memcmp(q0, q, sizeof(q)) == 0 && memcmp(s0, s, sizeof(s)) == 0,
					  "isa %s k %d", all_isas[isa], k);
			if (3 * k < (int) sizeof(q))
				CHECK(q[3 * k] == 0x55);	/* nothing written past n_tok * k */
		}
	}
	CHECK(cai_cpu_force_isa(orig));
}

TEST(gemm_isa_selection)
{
	const char *orig = cai_cpu_isa();

	CHECK(strcmp(orig, "generic") == 0 || strcmp(orig, "avx2") == 0 ||
		  strcmp(orig, "avx-vnni") == 0 || strcmp(orig, "avx512-vnni") == 0 ||
		  strcmp(orig, "avx512-amx") == 0);
	/* AMX only where the AVX-512 path also runs: the GEMMs are that path's */
	if (cai_cpu_force_isa("avx512-amx"))
		CHECK(cai_cpu_force_isa("avx512-vnni"));
	/* likewise AVX-VNNI and AVX2, whose kernels it runs outside the block GEMM */
	if (cai_cpu_force_isa("avx-vnni"))
		CHECK(cai_cpu_force_isa("avx2"));
	CHECK(cai_cpu_isa_known("avx-vnni"));
	CHECK(cai_cpu_force_isa("generic"));
	CHECK(strcmp(cai_cpu_isa(), "generic") == 0);
	CHECK(!cai_cpu_force_isa("sse9"));
	CHECK(!cai_cpu_force_isa(NULL));
	CHECK(strcmp(cai_cpu_isa(), "generic") == 0);
	CHECK(cai_cpu_force_isa(orig));
	CHECK(strcmp(cai_cpu_isa(), orig) == 0);
}
