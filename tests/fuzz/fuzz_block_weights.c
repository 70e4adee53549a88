/*
 * fuzz_block_weights.c — the CPU's block-weight GEMM (backend/cpu/gemm_blocks.h) over hostile
 * GGUF blocks: cai_cpu_bmatrix_pack of any bytes as Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K,
 * Q8_0 (and a few types it has no kernel for), then cai_gemm_blocks.
 *
 * Input: a type byte, rows - 1, a k byte (bit 7: k any multiple of 32, which is not whole
 * K-quant blocks; else 1..4 of the type's blocks), the rows the GEMM computes, tokens - 1, flags
 * (bias, accumulate, thread pool, a K-quant's super-block activations), the activations' scale exponent, then the tensor's bytes
 * (rows * ggml_row_bytes), then the activations (an int8 per input) and biases.
 *
 * What must hold: a type without a kernel is CAI_ERR_UNSUPPORTED and a k that is not whole
 * blocks CAI_ERR_FORMAT; a tensor holding a NaN or infinite fp16 d (or dmin) is CAI_ERR_FORMAT
 * naming the first such row and block, with nothing allocated; otherwise every repacked row
 * is exactly cai_dequantize_row of the file's row, and the GEMM (finite scales, bounded
 * levels and activations) gives finite outputs, the same bits as the portable kernel, close
 * to a double-precision sum over the file's levels, and leaves the rows past n_out alone.
 */
#include "fuzz_common.h"		/* first: it defines _GNU_SOURCE */

#include <float.h>
#include <math.h>

#include "cpu/gemm_blocks.h"
#include "quant.h"
#include "threadpool.h"
#include "util.h"

#define MAX_ROWS 16
#define MAX_TOK 6
#define MAX_K 512

/* The eight types with levels first; then types the block GEMM refuses (one the engine does not know). */
static const ggml_type types[] = {
	GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
	GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
	GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q2_K, GGML_TYPE_Q8_1, (ggml_type) 99,
};
#define N_TYPES ((int) (sizeof(types) / sizeof(types[0])))
#define N_LEVEL_TYPES 8

/*
 * Byte offsets of a block's fp16 d and dmin (-1: none), from ggml's block structs rather than
 * the engine's decoder: the harness's own idea of which scales must be finite.
 */
static void
scale_offsets(ggml_type type, int *d, int *dmin)
{
	*d = 0;
	*dmin = -1;
	if (type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_1 || type == GGML_TYPE_Q4_K ||
		type == GGML_TYPE_Q5_K)
		*dmin = 2;
	else if (type == GGML_TYPE_Q6_K)
		*d = 208;				/* ql[128], qh[64], scales[16], then d */
}

static bool
half_finite(const uint8_t *p)
{
	return ((p[0] | p[1] << 8) & 0x7c00) != 0x7c00;
}

/* The first (row, block) with a scale that is not finite; false when there is none. */
static bool
first_bad_scale(ggml_type type, const uint8_t *t, int rows, int k, size_t row_bytes,
				int *row, int *block)
{
	const int	per = (int) ggml_type_block_elems(type);
	const size_t bb = ggml_type_block_bytes(type);
	int			d,
				dmin;

	scale_offsets(type, &d, &dmin);
	for (int r = 0; r < rows; r++)
		for (int b = 0; b < k / per; b++)
		{
			const uint8_t *blk = t + (size_t) r * row_bytes + (size_t) b * bb;

			if (!half_finite(blk + d) || (dmin >= 0 && !half_finite(blk + dmin)))
			{
				*row = r;
				*block = b;
				return true;
			}
		}
	return false;
}

/*
 * out[t][o] in double from the file's levels (cai_block_levels_decode, which the unit tests
 * tie to cai_dequantize_row), and a bound on the float kernels' rounding: every product the
 * kernels round is at most bound (the sum of |ws q| + |wm| times |activation|).
 */
static void
reference(const cai_cpu_bmatrix *m, ggml_type type, const uint8_t *t, size_t row_bytes, int o,
		  const int8_t *xq, const float *xs, int tok, double *ref, double *bound)
{
	const int	per = (int) ggml_type_block_elems(type);
	const size_t bb = ggml_type_block_bytes(type);
	const int	nb = m->k / 32;

	*ref = 0.0;
	*bound = 0.0;
	for (int sb = 0; sb < m->k / per; sb++)
	{
		cai_block_levels lv;
		double		d,
					dmin;

		cai_block_levels_decode(type, t + (size_t) o * row_bytes + (size_t) sb * bb, &lv);
		d = cai_fp16_to_fp32(lv.d);
		dmin = lv.has_min ? cai_fp16_to_fp32(lv.dmin) : 0.0;
		for (int i = 0; i < lv.n; i++)
		{
			const int	at = sb * per + i;
			const double a = (double) xq[(size_t) tok * m->k + at] * xs[(size_t) tok * nb + at / 32];
			double		ws = d,
						wm;

			if (lv.k_quant)
				ws = d * (lv.split16 ? lv.sc[i / 16] : lv.sc[i / 32]);
			if (lv.has_min)
				wm = lv.k_quant ? dmin * lv.m[i / 32] : dmin;
			else
				wm = ws * lv.zero;
			*ref += (ws * lv.q[i] + wm) * a;
			*bound += (fabs(ws * lv.q[i]) + fabs(wm)) * fabs(a);
		}
	}
}

static cai_threadpool *
pool_of_two(void)
{
	static cai_threadpool *pool;

	if (!pool)
		pool = cai_threadpool_create(2);
	FUZZ_CHECK(pool != NULL);
	return pool;
}

/* The GEMM of a packed matrix: see the header comment for what must hold. */
static void
check_gemm(const cai_cpu_bmatrix *m, ggml_type type, const uint8_t *t, size_t row_bytes,
		   fuzz_input *in, int n_out, int n_tok, uint8_t flags, int scale_exp)
{
	const int	k = m->k;
	const int	nb = k / 32;
	const bool	use_bias = flags & 1;
	const bool	accumulate = flags & 2;
	cai_threadpool *pool = flags & 4 ? pool_of_two() : NULL;
	/* a K-quant's super-block activations, or per-block ones */
	const int	group = flags & 8 ? cai_act_group(m->type) : 1;
	static float x[MAX_TOK * MAX_K];
	static int8_t xq[MAX_TOK * MAX_K];
	static float xs[MAX_TOK * MAX_K / 32];
	static int16_t xsum[MAX_TOK * MAX_K / 32];
	static float bias[MAX_ROWS],
				init[MAX_TOK * MAX_ROWS],
				got[MAX_TOK * MAX_ROWS],
				want[MAX_TOK * MAX_ROWS];
	const int	rows = m->n_out;

	for (int i = 0; i < n_tok * k; i++)
		x[i] = ldexpf((float) (int8_t) fuzz_u8(in), scale_exp);
	for (int o = 0; o < rows; o++)
		bias[o] = (float) (int8_t) fuzz_u8(in) * 0.25f;
	for (int i = 0; i < n_tok * rows; i++)
		init[i] = (float) (i % 7) - 3.0f;
	cai_quantize_act_blocks(x, n_tok, k, group, xq, xs, xsum);
	for (int i = 0; i < n_tok * nb; i++)
	{
		int			total = 0;

		for (int e = 0; e < 32; e++)
			total += xq[i * 32 + e];
		FUZZ_CHECK(isfinite(xs[i]) && xs[i] >= 0.0f);
		FUZZ_CHECK(xsum[i] == total);
	}

	memcpy(got, init, sizeof(float) * n_tok * rows);
	memcpy(want, init, sizeof(float) * n_tok * rows);
	cai_gemm_blocks(pool, xq, xs, xsum, group, n_tok, m, n_out, use_bias ? bias : NULL, got, rows,
					accumulate);
	cai_gemm_blocks_portable(xq, xs, xsum, group, n_tok, m, n_out, use_bias ? bias : NULL, want,
							 rows, accumulate);
	for (int tk = 0; tk < n_tok; tk++)
		for (int o = 0; o < rows; o++)
		{
			const int	i = tk * rows + o;
			double		ref,
						bound;

			FUZZ_CHECK(memcmp(&got[i], &want[i], sizeof(float)) == 0);
			if (o >= n_out)
			{
				FUZZ_CHECK(memcmp(&got[i], &init[i], sizeof(float)) == 0);
				continue;
			}
			FUZZ_CHECK(isfinite(got[i]));
			reference(m, type, t, row_bytes, o, xq, xs, tk, &ref, &bound);
			if (use_bias)
				ref += bias[o];
			if (accumulate)
				ref += init[i];
			/* a rounding per product and per addition of the nb blocks, and the epilogue's */
			FUZZ_CHECK(fabs(got[i] - ref) <=
					   (nb + 8) * 2.0 * FLT_EPSILON * (bound + fabs(ref) + 8.0) + 4 * FLT_MIN);
		}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_input	in = {data, size};
	const ggml_type type = types[fuzz_u8(&in) % N_TYPES];
	const bool	levels = ggml_type_has_levels(type);
	const int	rows = 1 + fuzz_u8(&in) % MAX_ROWS;
	const uint8_t kb = fuzz_u8(&in);
	const int	n_out = 1 + fuzz_u8(&in) % rows;
	const int	n_tok = 1 + fuzz_u8(&in) % MAX_TOK;
	const uint8_t flags = fuzz_u8(&in);
	const int	scale_exp = (int) (fuzz_u8(&in) % 81) - 40;
	const int64_t per = ggml_type_block_elems(type);
	int			k;
	size_t		row_bytes,
				got_bytes;
	const uint8_t *p;
	uint8_t    *t;
	cai_cpu_bmatrix m;
	cai_error	err;
	cai_status	st;
	int			bad_row,
				bad_block;

	if (kb & 0x80 || per == 0)
		k = 32 * (1 + (kb & 0x7f) % (MAX_K / 32));
	else
		k = (int) per * (1 + (kb & 0x7f) % 4);
	if (k > MAX_K)
		k = 256 * (MAX_K / 256);

	FUZZ_CHECK(cai_cpu_bmatrix_supports(type) == levels);
	if (!levels)
	{
		static const uint8_t none[1];

		st = cai_cpu_bmatrix_pack(type, none, rows, k, &m, &err);
		FUZZ_CHECK(st == CAI_ERR_UNSUPPORTED && m.mem == NULL && err.message[0]);
		return 0;
	}
	if (k % per != 0)
	{
		static const uint8_t none[1];

		st = cai_cpu_bmatrix_pack(type, none, rows, k, &m, &err);
		FUZZ_CHECK(st == CAI_ERR_FORMAT && m.mem == NULL && err.message[0]);
		return 0;
	}

	/*
	 * cai_cpu_bmatrix_pack reads rows * ggml_row_bytes(type, k) bytes and is given no length:
	 * its callers check the tensor first.  For a model that is gguf.c's parse_tensor_infos
	 * (nbytes = ggml_row_bytes of all the tensor's elements) and open_buffer (offset + nbytes
	 * within the file), then model_load.c's find_tensor (nbytes >= row_bytes * rows for the
	 * shape it expects).  The harness does the same and skips a tensor the input cannot hold,
	 * which the engine would refuse; the bytes it passes sit alone in a buffer of exactly that
	 * size so that AddressSanitizer sees any read past it.
	 */
	FUZZ_CHECK(ggml_row_bytes(type, k, &row_bytes));
	p = fuzz_take(&in, row_bytes * rows, &got_bytes);
	if (got_bytes < row_bytes * rows)
		return 0;
	t = malloc(got_bytes);
	FUZZ_CHECK(t != NULL);
	memcpy(t, p, got_bytes);

	st = cai_cpu_bmatrix_pack(type, t, rows, k, &m, &err);
	if (getenv("FUZZ_VERBOSE"))	/* which check an input reaches, when growing the corpus */
		fprintf(stderr, "%s %d x %d, gemm %d rows x %d tokens: %s\n", ggml_type_name(type), rows,
				k, n_out, n_tok, st == CAI_OK ? "packed" : err.message);
	if (first_bad_scale(type, t, rows, k, row_bytes, &bad_row, &bad_block))
	{
		char		where[64];

		snprintf(where, sizeof(where), "(row %d, block %d)", bad_row, bad_block);
		FUZZ_CHECK(st == CAI_ERR_FORMAT);
		FUZZ_CHECK(m.mem == NULL);
		FUZZ_CHECK(strstr(err.message, where) != NULL);
		free(t);
		return 0;
	}
	FUZZ_CHECK(st == CAI_OK);
	FUZZ_CHECK(m.n_out == rows && m.k == k && m.n_groups == (rows + 7) / 8 && m.type == type);
	{
		static float row[MAX_K],
					deq[MAX_K];

		for (int r = 0; r < rows; r++)
		{
			cai_cpu_bmatrix_row(&m, r, row);
			FUZZ_CHECK(cai_dequantize_row(type, t + (size_t) r * row_bytes, deq, k, NULL) == CAI_OK);
			for (int i = 0; i < k; i++)
				FUZZ_CHECK(row[i] == deq[i]);	/* a zero of either sign */
		}
	}
	check_gemm(&m, type, t, row_bytes, &in, n_out, n_tok, flags, scale_exp);
	cai_cpu_bmatrix_free(&m);
	free(t);
	return 0;
}
