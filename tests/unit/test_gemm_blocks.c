/*
 * test_gemm_blocks.c — the file's own block weights: decoding levels, repacking, per-block
 * activation quantization and the GEMM on every ISA path (cpu/gemm_blocks.h), and the AVX-512
 * VNNI kernels on every machine: this file compiles cpu/gemm_blocks_vnni.c a second time
 * through SIMDe (Debian's libsimde-dev; no AVX-512 compiler flag), and that copy must give the
 * portable kernel's bits wherever the tests run; so must the 256-bit AVX-VNNI kernels' SIMDe
 * copy (test_gemm_blocks_avxvnni.c).
 */
#include "test.h"

#include <float.h>
#include <stdlib.h>

#if !__has_include(<simde/x86/avx512.h>)
#error "the unit tests need SIMDe's headers (Debian: apt-get install libsimde-dev)"
#endif
#define CAI_BLOCKS_SIMDE 1
#include "cpu/gemm_blocks_vnni.c"

#include "cpu/gemm.h"
#include "cpu/gemm_blocks.h"
#include "quant.h"
#include "threadpool.h"
#include "util.h"

/* cpu/gemm_blocks_avxvnni.c through SIMDe (test_gemm_blocks_avxvnni.c) */
cai_bkernel cai_bkernel_avxvnni_simde(ggml_type type);

static const ggml_type level_types[] = {
	GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
	GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
};
#define N_LEVEL_TYPES ((int) (sizeof(level_types) / sizeof(level_types[0])))

static uint32_t rng_state;

static uint32_t
next_rand(void)
{
	rng_state = rng_state * 1664525u + 1013904223u;
	return rng_state >> 8;
}

static float
rand_unit(void)
{
	return (float) (next_rand() % 20001) / 10000.0f - 1.0f;
}

/* Byte offsets of a block's fp16 scales (-1: none). */
static void
scale_offsets(ggml_type type, int *d, int *dmin)
{
	*d = 0;
	*dmin = -1;
	switch (type)
	{
		case GGML_TYPE_Q4_1:
		case GGML_TYPE_Q5_1:
		case GGML_TYPE_Q4_K:
		case GGML_TYPE_Q5_K:
			*dmin = 2;
			break;
		case GGML_TYPE_Q6_K:
			*d = 208;
			break;
		default:
			break;
	}
}

static void
put_half(uint8_t *p, float v)
{
	uint16_t	h = cai_fp32_to_fp16(v);

	memcpy(p, &h, sizeof(h));
}

/* rows x k of type: random levels and sub-block scales, small finite fp16 scales. */
static uint8_t *
random_tensor(ggml_type type, int rows, int k, size_t *row_bytes)
{
	const size_t bb = ggml_type_block_bytes(type);
	const int	per = (int) ggml_type_block_elems(type);
	uint8_t    *t;
	int			d,
				dmin;

	CHECK(ggml_row_bytes(type, k, row_bytes));
	t = malloc(*row_bytes * rows);
	scale_offsets(type, &d, &dmin);
	for (size_t i = 0; i < *row_bytes * rows; i++)
		t[i] = (uint8_t) next_rand();
	for (int r = 0; r < rows; r++)
		for (int b = 0; b < k / per; b++)
		{
			uint8_t    *blk = t + (size_t) r * *row_bytes + (size_t) b * bb;

			put_half(blk + d, 0.001f + 0.02f * (float) (next_rand() % 1000) / 1000.0f);
			if (dmin >= 0)
				put_half(blk + dmin, 0.03f * rand_unit());
		}
	return t;
}

TEST(block_levels_rebuild_dequantize_exactly)
{
	rng_state = 7;
	for (int ti = 0; ti < N_LEVEL_TYPES; ti++)
	{
		ggml_type	type = level_types[ti];
		size_t		row_bytes;
		uint8_t    *t = random_tensor(type, 1, 512, &row_bytes);
		float		ref[512];
		const int	per = (int) ggml_type_block_elems(type);
		int			bad = 0;

		CHECK(ggml_type_has_levels(type));
		CHECK(cai_dequantize_row(type, t, ref, 512, NULL) == CAI_OK);
		for (int b = 0; b < 512 / per; b++)
		{
			cai_block_levels lv;

			cai_block_levels_decode(type, t + (size_t) b * ggml_type_block_bytes(type), &lv);
			CHECK_EQ_INT(lv.n, per);
			for (int i = 0; i < per; i++)
				if (cai_block_levels_weight(&lv, i) != ref[b * per + i])
					bad++;
		}
		CHECK_MSG(bad == 0, "%s: %d weights differ from cai_dequantize_row", ggml_type_name(type), bad);
		free(t);
	}
	CHECK(!ggml_type_has_levels(GGML_TYPE_F16));
}

TEST(block_matrix_rows_equal_the_file)
{
	rng_state = 11;
	for (int ti = 0; ti < N_LEVEL_TYPES; ti++)
	{
		ggml_type	type = level_types[ti];
		const int	rows = 13,
					k = 512;
		size_t		row_bytes;
		uint8_t    *t = random_tensor(type, rows, k, &row_bytes);
		cai_cpu_bmatrix m;
		float		ref[512],
					got[512];
		int			bad = 0;

		CHECK(cai_cpu_bmatrix_supports(type));
		CHECK(cai_cpu_bmatrix_pack(type, t, rows, k, &m, NULL) == CAI_OK);
		CHECK_EQ_INT(m.n_groups, 2);
		for (int r = 0; r < rows; r++)
		{
			cai_dequantize_row(type, t + (size_t) r * row_bytes, ref, k, NULL);
			cai_cpu_bmatrix_row(&m, r, got);
			for (int i = 0; i < k; i++)
				bad += got[i] != ref[i];
		}
		CHECK_MSG(bad == 0, "%s: %d repacked weights differ", ggml_type_name(type), bad);
		cai_cpu_bmatrix_free(&m);
		free(t);
	}
}

TEST(block_matrix_refuses_hostile_blocks)
{
	cai_cpu_bmatrix m;
	cai_error	err;
	size_t		row_bytes;
	uint8_t    *t;
	const float bad_scales[] = {NAN, INFINITY, -INFINITY};

	rng_state = 3;
	for (int ti = 0; ti < N_LEVEL_TYPES; ti++)
		for (int s = 0; s < 3; s++)
			for (int which = 0; which < 2; which++)
			{
				ggml_type	type = level_types[ti];
				int			d,
							dmin;

				scale_offsets(type, &d, &dmin);
				if (which == 1 && dmin < 0)
					continue;
				t = random_tensor(type, 9, 256, &row_bytes);
				/* the last row's last block */
				put_half(t + 8 * row_bytes + row_bytes - ggml_type_block_bytes(type) +
						 (which ? dmin : d), bad_scales[s]);
				CHECK_MSG(cai_cpu_bmatrix_pack(type, t, 9, 256, &m, &err) == CAI_ERR_FORMAT,
						  "%s with a %g scale was accepted", ggml_type_name(type),
						  (double) bad_scales[s]);
				CHECK(strstr(err.message, "row 8") != NULL);
				CHECK(m.mem == NULL);
				free(t);
			}
	/* not whole blocks; an unsupported type */
	t = random_tensor(GGML_TYPE_Q4_K, 1, 256, &row_bytes);
	CHECK(cai_cpu_bmatrix_pack(GGML_TYPE_Q4_K, t, 1, 96, &m, &err) == CAI_ERR_FORMAT);
	CHECK(cai_cpu_bmatrix_pack(GGML_TYPE_F16, t, 1, 64, &m, &err) == CAI_ERR_UNSUPPORTED);
	free(t);
}

TEST(block_activations_quantize_per_block)
{
	float		x[2 * 64];
	int8_t		q[2 * 64];
	float		s[4];
	int16_t		sum[4];

	for (int i = 0; i < 128; i++)
		x[i] = (float) (i % 37) * 0.25f - 4.0f;
	for (int i = 32; i < 64; i++)
		x[i] = 0.0f;			/* a block of zeros */
	x[70] = 100.0f;				/* an outlier scales only its own block */
	cai_quantize_act_blocks(x, 2, 64, 1, q, s, sum);
	CHECK(s[1] == 0.0f && sum[1] == 0);
	CHECK(s[2] == 100.0f / 127.0f);
	CHECK(s[3] < 1.0f);
	for (int b = 0; b < 4; b++)
	{
		int			total = 0;

		for (int i = 0; i < 32; i++)
		{
			total += q[32 * b + i];
			if (s[b] > 0.0f)
				CHECK(fabsf(q[32 * b + i] * s[b] - x[32 * b + i]) <= s[b] * 0.5f + 1e-6f);
		}
		CHECK_EQ_INT(sum[b], total);
	}
}

/*
 * The activations' quantization gives the portable bits on every path: random blocks, and
 * blocks with what a vector maximum or rounding could treat differently (NaN, infinities,
 * signed zeros, denormals, halves that round to even, values at the clamp).
 */
TEST(block_activations_same_bits_every_isa)
{
	static const char *const isas[] = {"avx2", "avx-vnni", "avx512-vnni", "avx512-amx"};
	enum
	{
		N_TOK = 7, K = 256, NB = K / 32
	};
	const char *orig = cai_cpu_isa();
	float		x[N_TOK * K];
	int8_t		want_q[N_TOK * K],
				got_q[N_TOK * K];
	float		want_s[N_TOK * NB],
				got_s[N_TOK * NB];
	int16_t		want_sum[N_TOK * NB],
				got_sum[N_TOK * NB];
	int			tried = 0;

	rng_state = 23;
	for (int i = 0; i < N_TOK * K; i++)
		x[i] = rand_unit() * (i % 5 == 0 ? 30.0f : 1.0f);
	/* token 1: one special value per block */
	x[1 * K + 0 * 32 + 3] = NAN;
	x[1 * K + 1 * 32 + 31] = INFINITY;
	x[1 * K + 2 * 32 + 7] = -INFINITY;
	for (int i = 0; i < 32; i++)
	{
		x[1 * K + 3 * 32 + i] = i % 2 ? -0.0f : 0.0f;	/* a block of signed zeros */
		x[1 * K + 4 * 32 + i] = 1e-40f * (float) (i - 16);	/* denormals */
		x[1 * K + 5 * 32 + i] = (float) (i - 16) * 0.5f;
	}
	/* max 127: every level a half step away from an integer, rounding to even both ways */
	for (int i = 0; i < 32; i++)
		x[1 * K + 6 * 32 + i] = i == 0 ? 127.0f : (float) (i - 16) + 0.5f;
	/* a NaN after the block's largest value in the same lane of eight */
	x[2 * K + 3] = 50.0f;
	x[2 * K + 27] = NAN;
	x[1 * K + 7 * 32 + 9] = FLT_MAX;
	x[1 * K + 7 * 32 + 10] = -FLT_MAX;

	for (int group = 1; group <= CAI_KQUANT_BLOCKS; group += CAI_KQUANT_BLOCKS - 1)
	{
		CHECK(cai_cpu_force_isa("generic"));
		cai_quantize_act_blocks(x, N_TOK, K, group, want_q, want_s, want_sum);
		for (size_t isa = 0; isa < sizeof(isas) / sizeof(isas[0]); isa++)
		{
			if (!cai_cpu_force_isa(isas[isa]))
				continue;
			tried++;
			memset(got_q, 0x55, sizeof(got_q));
			cai_quantize_act_blocks(x, N_TOK, K, group, got_q, got_s, got_sum);
			CHECK_MSG(memcmp(got_q, want_q, sizeof(got_q)) == 0, "levels differ on %s (group %d)",
					  isas[isa], group);
			CHECK_MSG(memcmp(got_s, want_s, sizeof(got_s)) == 0, "scales differ on %s (group %d)",
					  isas[isa], group);
			CHECK_MSG(memcmp(got_sum, want_sum, sizeof(got_sum)) == 0, "sums differ on %s (group %d)",
					  isas[isa], group);
		}
	}
	CHECK(cai_cpu_force_isa(orig));
	if (tried == 0)
		SKIP("no vector path on this CPU");
}

/* One GEMM of every format on every path; each must equal the portable kernel's bits. */
static void
check_gemm_paths(ggml_type type, int rows, int k, int n_tok, cai_threadpool *pool)
{
	static const char *const isas[] = {"generic", "avx2", "avx-vnni", "avx512-vnni", "avx512-amx"};
	const char *orig = cai_cpu_isa();
	size_t		row_bytes;
	uint8_t    *t = random_tensor(type, rows, k, &row_bytes);
	float	   *x = malloc(sizeof(float) * n_tok * k);
	int8_t	   *xq = malloc((size_t) n_tok * k);
	float	   *xs = malloc(sizeof(float) * n_tok * k / 32);
	int16_t    *xsum = malloc(sizeof(int16_t) * n_tok * k / 32);
	float	   *bias = malloc(sizeof(float) * rows);
	float	   *want = malloc(sizeof(float) * n_tok * rows);
	float	   *got = malloc(sizeof(float) * n_tok * rows);
	float	   *w = malloc(sizeof(float) * k);
	cai_cpu_bmatrix m;

	for (int i = 0; i < n_tok * k; i++)
		x[i] = rand_unit() * (i % 7 == 0 ? 8.0f : 1.0f);
	for (int o = 0; o < rows; o++)
		bias[o] = rand_unit();
	CHECK(cai_cpu_bmatrix_pack(type, t, rows, k, &m, NULL) == CAI_OK);
	/* per-block activations; for a K-quant also super-block ones, their own arithmetic */
	for (int group = 1; group <= cai_act_group(type); group += CAI_KQUANT_BLOCKS - 1)
	{
		cai_quantize_act_blocks(x, n_tok, k, group, xq, xs, xsum);

		/* acc 0: a bias; 1: accumulating; 2: accumulating with a bias */
		for (int acc = 0; acc < 3; acc++)
		{
			const float *b = acc == 1 ? NULL : bias;

			for (int i = 0; i < n_tok * rows; i++)
				want[i] = got[i] = (float) i * 0.5f;
			cai_gemm_blocks_portable(xq, xs, xsum, group, n_tok, &m, rows, b, want, rows, acc >= 1);
			/* close to the float product of the same weights and quantized activations */
			for (int o = 0; o < rows; o++)
			{
				cai_cpu_bmatrix_row(&m, o, w);
				for (int tk = 0; tk < n_tok; tk++)
				{
					double		ref = (acc >= 1 ? (double) (tk * rows + o) * 0.5 : 0.0) + (b ? bias[o] : 0.0);

					for (int i = 0; i < k; i++)
						ref += (double) w[i] * xq[tk * k + i] * xs[(tk * k + i) / 32];
					CHECK_NEAR(want[tk * rows + o], ref, 1e-3 * (1.0 + fabs(ref)));
				}
			}
			for (int isa = 0; isa < 7; isa++)
			{
				int			bad = 0;

				if (isa >= 5)
				{
					/* the VNNI kernels (512- and 256-bit) through SIMDe, on any CPU */
					for (int i = 0; i < n_tok * rows; i++)
						got[i] = (float) i * 0.5f;
					cai_gemm_blocks_run(pool, isa == 5 ? cai_bkernel_vnni_simde(type) :
										cai_bkernel_avxvnni_simde(type), xq, xs, xsum, group, n_tok, &m,
										rows, b, got, rows, acc >= 1);
					for (int i = 0; i < n_tok * rows; i++)
						bad += memcmp(&got[i], &want[i], sizeof(float)) != 0;
					CHECK_MSG(bad == 0, "%s through SIMDe's %s, %d tokens, activations' group %d: %d "
							  "outputs differ from the portable kernel", ggml_type_name(type),
							  isa == 5 ? "AVX-512 VNNI" : "AVX-VNNI", n_tok, group, bad);
					continue;
				}

				if (!cai_cpu_force_isa(isas[isa]))
					continue;
				for (int i = 0; i < n_tok * rows; i++)
					got[i] = (float) i * 0.5f;
				cai_gemm_blocks(pool, xq, xs, xsum, group, n_tok, &m, rows, b, got, rows, acc >= 1);
				for (int i = 0; i < n_tok * rows; i++)
					bad += memcmp(&got[i], &want[i], sizeof(float)) != 0;
				CHECK_MSG(bad == 0, "%s on %s, %d tokens, activations' group %d: %d outputs differ "
						  "from the portable kernel", ggml_type_name(type), isas[isa], n_tok, group, bad);
			}
		}
	}
	CHECK(cai_cpu_force_isa(orig));
	cai_cpu_bmatrix_free(&m);
	free(t);
	free(x);
	free(xq);
	free(xs);
	free(xsum);
	free(bias);
	free(want);
	free(got);
	free(w);
}

TEST(gemm_blocks_same_bits_every_isa_threads_tokens)
{
	cai_threadpool *pool = cai_threadpool_create(3);

	rng_state = 19;
	for (int ti = 0; ti < N_LEVEL_TYPES; ti++)
	{
		check_gemm_paths(level_types[ti], 21, 512, 1, NULL);
		check_gemm_paths(level_types[ti], 21, 512, 6, pool);
		check_gemm_paths(level_types[ti], 64, 256, 9, pool);
		check_gemm_paths(level_types[ti], 40, 512, 23, pool);
		/* two whole AMX tiles of 16 tokens and three more, an odd last group */
		check_gemm_paths(level_types[ti], 24, 256, 35, pool);
		/*
		 * the K-quants' AMX kernel: more tiles than it takes at once (8), more pairs of groups
		 * than a call takes (4), a partial last group in a pair and one alone
		 */
		check_gemm_paths(level_types[ti], 75, 512, 149, pool);
		check_gemm_paths(level_types[ti], 69, 256, 131, NULL);
	}
	cai_threadpool_free(pool);
}

/*
 * Batches without a whole tile of 16 tokens on the tile unit (8 at a time, the rest on VNNI):
 * a decode step of 8, 8 and a few more, and the 8 after one and two whole tiles of 16 (their
 * scratch widened, the batch's own widening beside it); rows making whole pairs of groups, a
 * lone partial group, and more groups than the threads' tasks hold; k of one and of several
 * super-blocks; on avx512-amx where the CPU has it, against the portable bits.
 */
TEST(gemm_blocks_amx_small_batches_same_bits)
{
	static const struct
	{
		int			rows,
					k,
					n_tok;
	}			cases[] = {
		{32, 768, 8}, {19, 256, 8}, {13, 512, 8}, {75, 256, 8}, {32, 768, 13}, {19, 256, 16 + 8},
		{40, 512, 2 * 16 + 8 + 3},
	};
	cai_threadpool *pool = cai_threadpool_create(2);

	rng_state = 29;
	for (int ti = 0; ti < N_LEVEL_TYPES; ti++)
		for (int i = 0; i < (int) (sizeof(cases) / sizeof(cases[0])); i++)
			check_gemm_paths(level_types[ti], cases[i].rows, cases[i].k, cases[i].n_tok,
							 i % 2 ? pool : NULL);
	cai_threadpool_free(pool);
}

/*
 * The 256-bit kernels' tiles (4, 2, 1 tokens) in every combination a batch of up to 17 makes,
 * Q6_K's widened scratch (more tokens than a tile) and not, odd row counts whose last group is
 * partial, with and without bias and accumulation: on avx-vnni where the CPU has it, and
 * through SIMDe everywhere (check_gemm_paths runs both).
 */
TEST(gemm_blocks_avx_vnni_tiles_same_bits)
{
	static const int n_toks[] = {1, 2, 3, 5, 8, 17};
	cai_threadpool *pool = cai_threadpool_create(2);

	rng_state = 23;
	for (int ti = 0; ti < N_LEVEL_TYPES; ti++)
		for (int i = 0; i < (int) (sizeof(n_toks) / sizeof(n_toks[0])); i++)
			check_gemm_paths(level_types[ti], i % 2 ? 13 : 27, 512, n_toks[i], i % 2 ? pool : NULL);
	cai_threadpool_free(pool);
}

TEST(gemm_blocks_first_rows_only)
{
	size_t		row_bytes;
	uint8_t    *t;
	cai_cpu_bmatrix m;
	int8_t		xq[64];
	float		xs[2] = {0.01f, 0.02f};
	int16_t		xsum[2] = {0, 0};
	float		out[24];

	rng_state = 5;
	t = random_tensor(GGML_TYPE_Q4_0, 24, 64, &row_bytes);
	for (int i = 0; i < 64; i++)
	{
		xq[i] = (int8_t) (i - 32);
		xsum[i / 32] += xq[i];
	}
	CHECK(cai_cpu_bmatrix_pack(GGML_TYPE_Q4_0, t, 24, 64, &m, NULL) == CAI_OK);
	for (int i = 0; i < 24; i++)
		out[i] = -1.0f;
	cai_gemm_blocks(NULL, xq, xs, xsum, 1, 1, &m, 16, NULL, out, 24, false);
	for (int i = 16; i < 24; i++)
		CHECK(out[i] == -1.0f);
	CHECK(out[0] != -1.0f);
	cai_cpu_bmatrix_free(&m);
	free(t);
}

/*
 * Levels at their extremes (every byte of every block one fill value, so Q8_0's -128, Q6_K's
 * -32, Q5's -16 and 31 and all-ones nibbles) against activations all at -127 or +127: the
 * integer sums at their largest, where a narrower accumulator in a kernel would overflow.
 */
TEST(gemm_blocks_extreme_levels_same_bits)
{
	static const uint8_t fills[] = {0x00, 0xFF, 0x80, 0x7F};
	const int	rows = 8,
				k = 256;
	int8_t		xq[256];
	float		xs[8];
	int16_t		xsum[8];
	float		want[8],
				got[8];

	for (int ti = 0; ti < N_LEVEL_TYPES; ti++)
		for (int fi = 0; fi < 4; fi++)
			for (int sign = -1; sign <= 1; sign += 2)
			{
				ggml_type	type = level_types[ti];
				const size_t bb = ggml_type_block_bytes(type);
				const int	per = (int) ggml_type_block_elems(type);
				size_t		row_bytes;
				uint8_t    *t;
				cai_cpu_bmatrix m;
				int			d,
							dmin,
							bad = 0;

				CHECK(ggml_row_bytes(type, k, &row_bytes));
				t = malloc(row_bytes * rows);
				memset(t, fills[fi], row_bytes * rows);
				scale_offsets(type, &d, &dmin);
				for (int b = 0; b < rows * (k / per); b++)
				{
					put_half(t + b * bb + d, 1.0f);
					if (dmin >= 0)
						put_half(t + b * bb + dmin, 0.5f);
				}
				for (int i = 0; i < k; i++)
					xq[i] = (int8_t) (127 * sign);
				for (int b = 0; b < k / 32; b++)
				{
					xs[b] = 1.0f;
					xsum[b] = (int16_t) (32 * 127 * sign);
				}
				CHECK(cai_cpu_bmatrix_pack(type, t, rows, k, &m, NULL) == CAI_OK);
				for (int group = 1; group <= CAI_KQUANT_BLOCKS; group += CAI_KQUANT_BLOCKS - 1)
				{
					bad = 0;
					cai_gemm_blocks_portable(xq, xs, xsum, group, 1, &m, rows, NULL, want, rows,
											 false);
					cai_gemm_blocks(NULL, xq, xs, xsum, group, 1, &m, rows, NULL, got, rows, false);
					for (int o = 0; o < rows; o++)
						bad += memcmp(&got[o], &want[o], sizeof(float)) != 0;
					CHECK_MSG(bad == 0, "%s, bytes 0x%02x, activations %d x 127, group %d: %d rows "
							  "differ", ggml_type_name(type), fills[fi], sign, group, bad);
					bad = 0;
					cai_gemm_blocks_run(NULL, cai_bkernel_vnni_simde(type), xq, xs, xsum, group, 1,
										&m, rows, NULL, got, rows, false);
					for (int o = 0; o < rows; o++)
						bad += memcmp(&got[o], &want[o], sizeof(float)) != 0;
					CHECK_MSG(bad == 0, "%s through SIMDe's VNNI, bytes 0x%02x, activations %d x 127, "
							  "group %d: %d rows differ", ggml_type_name(type), fills[fi], sign,
							  group, bad);
					bad = 0;
					cai_gemm_blocks_run(NULL, cai_bkernel_avxvnni_simde(type), xq, xs, xsum, group,
										1, &m, rows, NULL, got, rows, false);
					for (int o = 0; o < rows; o++)
						bad += memcmp(&got[o], &want[o], sizeof(float)) != 0;
					CHECK_MSG(bad == 0, "%s through SIMDe's AVX-VNNI, bytes 0x%02x, activations %d x "
							  "127, group %d: %d rows differ", ggml_type_name(type), fills[fi],
							  sign, group, bad);
				}
				cai_cpu_bmatrix_free(&m);
				free(t);
			}
}
