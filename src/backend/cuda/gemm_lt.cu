/*
 * gemm_lt.cu — the int8 and float GEMMs through cuBLASLt, with a cached algorithm choice per
 * shape, batch-size bucket and pointer alignment, and a dp4a fallback for shapes cuBLASLt has no
 * int8 kernel for (counted, and reported once per shape: it is far slower).
 *
 * Layouts.  cuBLASLt is column-major; the engine is row-major.  A row-major [R, C] matrix with row
 * stride ld is, unchanged in memory, a column-major [C, R] matrix with leading dimension ld.  So:
 *
 *   weights W  row-major [n_out, k]  ==  column-major [k, n_out], ld = k      -> A, op(A) = T
 *   tokens  X  row-major [n_tok, k]  ==  column-major [k, n_tok], ld = k      -> B, op(B) = N
 *   result  Y  row-major [n_tok, ldc] == column-major [n_out, n_tok], ld = ldc -> C = D
 *
 *   D[o, t] = sum_i op(A)[o, i] * B[i, t] = sum_i W[o, i] * X[t, i]          (m = n_out, n = n_tok)
 *
 * which is exactly the "TN" form, the only one Hopper's int8 tensor-core kernels accept in the
 * ordinary (non-COL32) orders.  Their other conditions: A and B CUDA_R_8I, C/D CUDA_R_32I,
 * compute CUBLAS_COMPUTE_32I with CUDA_R_32I alpha/beta; m and k multiples of 4 (k is one for every
 * supported model; m is padded to n_out_padded by cai_cuda_qmatrix_upload, with zero rows);
 * leading dimensions multiples of 4; pointers at least 4-byte aligned (cudaMalloc gives 256).
 *
 * Algorithm choice.  cublasLtMatmulAlgoGetHeuristic is asked once per (m, k, bucket of n) with the
 * context's explicit workspace as the limit, and the answer is kept in a small hash table; a step of
 * n tokens uses the choice of its bucket.  cuBLASLt validates an algorithm against the actual shape
 * before it launches anything, so if a bucket's choice does not fit an n inside the bucket, the
 * exact shape is asked for (and cached) instead.  Descriptors live on the stack (the *Init
 * functions), so a GEMM allocates nothing on the host.
 *
 * Alignment.  Without a preference the heuristic assumes 256-byte-aligned operands and may choose
 * a kernel that then refuses a view that starts mid-allocation (a weight's row slice, an
 * activation column block).  So each call passes its pointers' actual alignments (the largest
 * power of two dividing the address, up to 256) as the minimum-alignment preferences, and the
 * algorithm cache keys on them.  What is left as "not supported" falls back to dp4a (counted in
 * cai_cuda_gemm_fallback_count, reported on stderr once per shape); an invalid value from
 * cuBLASLt for the exact shape is an error, never a silent fallback.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"

#define ALGO_KIND_I8 0
#define ALGO_KIND_F32 1
#define ALGO_FLAG_BIAS 1
#define ALGO_FLAG_ACCUMULATE 2
#define ALGO_EXACT 0x100		/* the entry is for an exact n, not a bucket */

/* The bucket of n a heuristic answer is shared by: powers of two to 64, then steps of 64, 256. */
static int
n_bucket(int n)
{
	int			b = 1;

	if (n > 1024)
		return (n + 255) / 256 * 256;
	if (n > 64)
		return (n + 63) / 64 * 64;
	while (b < n)
		b *= 2;
	return b;
}

/* The alignment cuBLASLt may assume of a pointer: the largest power of two dividing it, <= 256. */
static int
pointer_alignment(const void *ptr)
{
	uintptr_t	a = (uintptr_t) ptr;
	int			align = 1;

	while (align < 256 && (a & (uintptr_t) align) == 0)
		align <<= 1;
	return align;
}

/* log2 of an alignment, 0..8 */
static int
alignment_code(int align)
{
	int			code = 0;

	while ((1 << code) < align)
		code++;
	return code;
}

/* The alignments of A (the weight), B (the tokens) and C = D, 4 bits of log2 each. */
static int
alignment_key(const void *a, const void *b, const void *c)
{
	return alignment_code(pointer_alignment(a)) |
		alignment_code(pointer_alignment(b)) << 4 |
		alignment_code(pointer_alignment(c)) << 8;
}

/* The algorithm cache's key: everything the heuristic's answer depends on. */
typedef struct algo_key
{
	int			kind;
	int			m;
	int			n;				/* the bucket, or the exact n with ALGO_EXACT */
	int			k;
	int			flags;
	int			ldc;
	int			align;
} algo_key;

static bool
entry_matches(const gemm_algo_entry *e, const algo_key *key)
{
	return e->kind == key->kind && e->m == key->m && e->n == key->n && e->k == key->k &&
		e->flags == key->flags && e->ldc == key->ldc && e->align == key->align;
}

static uint64_t
algo_hash(const algo_key *key)
{
	uint64_t	h = 1469598103934665603ull;
	int			v[7] = {key->kind, key->m, key->n, key->k, key->flags, key->ldc, key->align};

	for (int i = 0; i < 7; i++)
	{
		h ^= (uint64_t) (uint32_t) v[i];
		h *= 1099511628211ull;
	}
	return h ^ (h >> 29);
}

/* Finds the entry for a key, or the empty slot where it belongs (open addressing). */
static gemm_algo_entry *
algo_slot(gemm_algo_entry *table, int cap, const algo_key *key)
{
	uint64_t	i = algo_hash(key) & (uint64_t) (cap - 1);

	for (;;)
	{
		gemm_algo_entry *e = &table[i];

		if (e->m == 0 || entry_matches(e, key))
			return e;
		i = (i + 1) & (uint64_t) (cap - 1);
	}
}

static cai_status
algo_cache_grow(cai_cuda_ctx *ctx, cai_error *err)
{
	int			cap = ctx->cap_algos ? ctx->cap_algos * 2 : 256;
	gemm_algo_entry *t = (gemm_algo_entry *) calloc((size_t) cap, sizeof(gemm_algo_entry));

	if (!t)
		return cuda_fail(err, CAI_ERR_NO_MEMORY, "out of memory growing the gemm algorithm cache");
	for (int i = 0; i < ctx->cap_algos; i++)
	{
		gemm_algo_entry *e = &ctx->algos[i];

		if (e->m != 0)
		{
			algo_key	key = {e->kind, e->m, e->n, e->k, e->flags, e->ldc, e->align};

			*algo_slot(t, cap, &key) = *e;
		}
	}
	free(ctx->algos);
	ctx->algos = t;
	ctx->cap_algos = cap;
	return CAI_OK;
}

void
cuda_gemm_free_cache(cai_cuda_ctx *ctx)
{
	free(ctx->algos);
	ctx->algos = NULL;
	ctx->cap_algos = 0;
	ctx->n_algos = 0;
}

/* The problem of one GEMM call, with its descriptors initialized in place. */
typedef struct lt_problem
{
	cublasLtMatmulDescOpaque_t desc;
	cublasLtMatrixLayoutOpaque_t a;
	cublasLtMatrixLayoutOpaque_t b;
	cublasLtMatrixLayoutOpaque_t c;
} lt_problem;

/*
 * Asks cuBLASLt for its best algorithm for the problem's descriptors, with shape n (the caller's
 * bucket or exact n).  found=false when none exists (the caller then falls back).
 */
static cai_status
lt_heuristic(cai_cuda_ctx *ctx, lt_problem *p, int codes, bool *found, cublasLtMatmulAlgo_t *algo,
			 cai_error *err)
{
	cublasLtMatmulPreferenceOpaque_t pref;
	cublasLtMatmulHeuristicResult_t result;
	int			count = 0;
	cublasStatus_t rc;
	uint32_t	align_a = 1u << (codes & 15),
				align_b = 1u << ((codes >> 4) & 15),
				align_c = 1u << ((codes >> 8) & 15);

	*found = false;
	LT_CHECK(cublasLtMatmulPreferenceInit(&pref), err, "cublasLtMatmulPreferenceInit");
	LT_CHECK(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
												  &ctx->lt_workspace_bytes,
												  sizeof(ctx->lt_workspace_bytes)),
			 err, "cublasLtMatmulPreferenceSetAttribute");
	LT_CHECK(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
												  &align_a, sizeof(align_a)),
			 err, "cublasLtMatmulPreferenceSetAttribute");
	LT_CHECK(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
												  &align_b, sizeof(align_b)),
			 err, "cublasLtMatmulPreferenceSetAttribute");
	LT_CHECK(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
												  &align_c, sizeof(align_c)),
			 err, "cublasLtMatmulPreferenceSetAttribute");
	LT_CHECK(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
												  &align_c, sizeof(align_c)),
			 err, "cublasLtMatmulPreferenceSetAttribute");
	memset(&result, 0, sizeof(result));
	rc = cublasLtMatmulAlgoGetHeuristic(ctx->lt, &p->desc, &p->a, &p->b, &p->c, &p->c, &pref, 1,
										&result, &count);
	if (rc == CUBLAS_STATUS_NOT_SUPPORTED || (rc == CUBLAS_STATUS_SUCCESS && count == 0))
		return CAI_OK;
	if (rc != CUBLAS_STATUS_SUCCESS)
		return cuda_fail_lt(err, rc, "cublasLtMatmulAlgoGetHeuristic");
	if (result.state != CUBLAS_STATUS_SUCCESS)
		return CAI_OK;
	*algo = result.algo;
	*found = true;
	return CAI_OK;
}

/*
 * Looks up (or asks for and caches) the algorithm for the key.  The problem descriptors are
 * built by init_problem(p, n) for whatever n the question is asked about.
 */
typedef cai_status (*init_problem_fn) (lt_problem *p, int n, const void *arg, cai_error *err);

static cai_status
algo_lookup(cai_cuda_ctx *ctx, const algo_key *asked, init_problem_fn init, const void *arg,
			gemm_algo_entry **out, cai_error *err)
{
	gemm_algo_entry *e;
	lt_problem	p;
	cai_status	st;
	algo_key	key = *asked;

	if (!(key.flags & ALGO_EXACT))
		key.n = n_bucket(key.n);
	if (ctx->n_algos * 2 >= ctx->cap_algos && (st = algo_cache_grow(ctx, err)) != CAI_OK)
		return st;
	e = algo_slot(ctx->algos, ctx->cap_algos, &key);
	if (e->m == 0)
	{
		if ((st = init(&p, key.n, arg, err)) != CAI_OK)
			return st;
		e->kind = key.kind;
		e->m = key.m;
		e->n = key.n;
		e->k = key.k;
		e->flags = key.flags;
		e->ldc = key.ldc;
		e->align = key.align;
		e->fallback_logged = false;
		st = lt_heuristic(ctx, &p, key.align, &e->found, &e->algo, err);
		if (st != CAI_OK)
		{
			memset(e, 0, sizeof(*e));
			return st;
		}
		ctx->n_algos++;
	}
	*out = e;
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * int8
 * ------------------------------------------------------------------------------------------- */

typedef struct i8_shape
{
	int			m;				/* n_out_padded */
	int			k;
	int			ldc;
} i8_shape;

static cai_status
init_problem_i8(lt_problem *p, int n, const void *arg, cai_error *err)
{
	const i8_shape *s = (const i8_shape *) arg;
	cublasOperation_t op_t = CUBLAS_OP_T,
				op_n = CUBLAS_OP_N;

	LT_CHECK(cublasLtMatmulDescInit(&p->desc, CUBLAS_COMPUTE_32I, CUDA_R_32I), err,
			 "cublasLtMatmulDescInit");
	LT_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t,
											sizeof(op_t)), err, "cublasLtMatmulDescSetAttribute");
	LT_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n,
											sizeof(op_n)), err, "cublasLtMatmulDescSetAttribute");
	/* A: W as column-major [k, m]; B: X as column-major [k, n]; C: column-major [m, n] */
	LT_CHECK(cublasLtMatrixLayoutInit(&p->a, CUDA_R_8I, (uint64_t) s->k, (uint64_t) s->m, s->k),
			 err, "cublasLtMatrixLayoutInit");
	LT_CHECK(cublasLtMatrixLayoutInit(&p->b, CUDA_R_8I, (uint64_t) s->k, (uint64_t) n, s->k),
			 err, "cublasLtMatrixLayoutInit");
	LT_CHECK(cublasLtMatrixLayoutInit(&p->c, CUDA_R_32I, (uint64_t) s->m, (uint64_t) n, s->ldc),
			 err, "cublasLtMatrixLayoutInit");
	return CAI_OK;
}

/*
 * The fallback int8 GEMM: one warp per output channel and tile of FALLBACK_TOKENS tokens, dp4a
 * over k/4 packed words, a warp-shuffle reduction per token.  The weight row is read once per
 * tile, not once per token.  Exact like every int32 accumulation; used when cuBLASLt has no int8
 * kernel for a shape, and by the tests as a second opinion.
 */
#define FALLBACK_TOKENS 8

static __global__ void
gemm_i8_dp4a_kernel(const int8_t *__restrict__ x, const int8_t *__restrict__ w, int n_tok,
					int m, int k, int32_t *__restrict__ acc, int ldc)
{
	int			lane = threadIdx.x % CUDA_WARP;
	int			o = blockIdx.x * (blockDim.x / CUDA_WARP) + threadIdx.x / CUDA_WARP;
	int			t0 = blockIdx.y * FALLBACK_TOKENS;
	int			nt = n_tok - t0 < FALLBACK_TOKENS ? n_tok - t0 : FALLBACK_TOKENS;
	const int  *wr;
	int			sum[FALLBACK_TOKENS];

	if (o >= m || nt <= 0)
		return;
	wr = (const int *) (w + (size_t) o * k);
#pragma unroll
	for (int j = 0; j < FALLBACK_TOKENS; j++)
		sum[j] = 0;
	for (int i = lane; i < k / 4; i += CUDA_WARP)
	{
		int			wv = wr[i];

#pragma unroll
		for (int j = 0; j < FALLBACK_TOKENS; j++)
			if (j < nt)
				sum[j] = __dp4a(((const int *) (x + (size_t) (t0 + j) * k))[i], wv, sum[j]);
	}
#pragma unroll
	for (int j = 0; j < FALLBACK_TOKENS; j++)
	{
		for (int off = CUDA_WARP / 2; off > 0; off >>= 1)
			sum[j] += __shfl_xor_sync(0xffffffffu, sum[j], off);
		if (lane == 0 && j < nt)
			acc[(size_t) (t0 + j) * ldc + o] = sum[j];
	}
}

static cai_status
gemm_i8_fallback(cai_cuda_ctx *ctx, const int8_t *xq, int n_tok, const cai_cuda_qmatrix *w,
				 int32_t *acc, int ldc, cai_error *err)
{
	dim3		grid(div_up(w->n_out_padded, 8), div_up(n_tok, FALLBACK_TOKENS));

	if (grid.y > 65535)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "too many tokens for one gemm (%d)", n_tok);
	gemm_i8_dp4a_kernel<<<grid, 256, 0, ctx->stream>>>(xq, w->q_dev, n_tok, w->n_out_padded, w->k,
													   acc, ldc);
	CUDA_CHECK_LAUNCH(err, "the dp4a int8 gemm");
	return CAI_OK;
}

/* Test hook: CAI_CUDA_GEMM=dp4a forces the fallback (read once per call; cheap). */
static bool
force_fallback(void)
{
	const char *v = getenv("CAI_CUDA_GEMM");

	return v && strcmp(v, "dp4a") == 0;
}

/* cuBLASLt has no int8 kernel for this shape: count it, say so once per key, run dp4a. */
static cai_status
gemm_i8_unsupported(cai_cuda_ctx *ctx, gemm_algo_entry *e, const int8_t *xq, int n_tok,
					const cai_cuda_qmatrix *w, int32_t *acc, int ldc, cai_error *err)
{
	ctx->gemm_fallbacks++;
	if (!e->fallback_logged)
	{
		e->fallback_logged = true;
		fprintf(stderr, "pg_cai cuda: cuBLASLt has no int8 kernel for m=%d n=%d k=%d ldc=%d "
				"(alignments %d/%d/%d bytes): using the slower dp4a kernel\n",
				w->n_out_padded, n_tok, w->k, ldc, 1 << (e->align & 15),
				1 << ((e->align >> 4) & 15), 1 << ((e->align >> 8) & 15));
	}
	return gemm_i8_fallback(ctx, xq, n_tok, w, acc, ldc, err);
}

extern "C" uint64_t
cai_cuda_gemm_fallback_count(const cai_cuda_ctx *ctx)
{
	return ctx->gemm_fallbacks;
}

extern "C" cai_status
cai_cuda_gemm_i8_acc(cai_cuda_ctx *ctx, const int8_t *xq_dev, int n_tok,
					 const cai_cuda_qmatrix *w, int32_t *acc_dev, int ldacc, cai_error *err)
{
	i8_shape	shape = {w->n_out_padded, w->k, ldacc};
	algo_key	key = {ALGO_KIND_I8, shape.m, n_tok, shape.k, 0, ldacc,
	alignment_key(w->q_dev, xq_dev, acc_dev)};
	gemm_algo_entry *e;
	lt_problem	p;
	cai_status	st;
	cublasStatus_t rc;
	int32_t		alpha = 1,
				beta = 0;

	if (n_tok <= 0)
		return CAI_OK;
	if (w->k % 4 != 0 || w->n_out_padded % 4 != 0 || ldacc % 4 != 0 || ldacc < w->n_out_padded)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT,
						 "int8 gemm needs k, padded rows and ldc multiples of 4 (k=%d m=%d ldc=%d)",
						 w->k, w->n_out_padded, ldacc);
	if (force_fallback())
		return gemm_i8_fallback(ctx, xq_dev, n_tok, w, acc_dev, ldacc, err);

	if ((st = algo_lookup(ctx, &key, init_problem_i8, &shape, &e, err)) != CAI_OK)
		return st;
	if ((st = init_problem_i8(&p, n_tok, &shape, err)) != CAI_OK)
		return st;
	rc = CUBLAS_STATUS_NOT_SUPPORTED;
	if (e->found)
		rc = cublasLtMatmul(ctx->lt, &p.desc, &alpha, w->q_dev, &p.a, xq_dev, &p.b, &beta,
							acc_dev, &p.c, acc_dev, &p.c, &e->algo, ctx->lt_workspace,
							ctx->lt_workspace_bytes, ctx->stream);
	if (rc == CUBLAS_STATUS_NOT_SUPPORTED || rc == CUBLAS_STATUS_INVALID_VALUE)
	{
		/* the bucket's choice does not fit this n: ask about the exact shape */
		key.flags |= ALGO_EXACT;
		if ((st = algo_lookup(ctx, &key, init_problem_i8, &shape, &e, err)) != CAI_OK)
			return st;
		if (!e->found)
			return gemm_i8_unsupported(ctx, e, xq_dev, n_tok, w, acc_dev, ldacc, err);
		rc = cublasLtMatmul(ctx->lt, &p.desc, &alpha, w->q_dev, &p.a, xq_dev, &p.b, &beta,
							acc_dev, &p.c, acc_dev, &p.c, &e->algo, ctx->lt_workspace,
							ctx->lt_workspace_bytes, ctx->stream);
		/* the heuristic's own answer for this exact problem: only "not supported" falls back */
		if (rc == CUBLAS_STATUS_NOT_SUPPORTED)
			return gemm_i8_unsupported(ctx, e, xq_dev, n_tok, w, acc_dev, ldacc, err);
	}
	if (rc != CUBLAS_STATUS_SUCCESS)
		return cuda_fail_lt(err, rc, "cublasLtMatmul (int8)");
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * float
 * ------------------------------------------------------------------------------------------- */

typedef struct f32_shape
{
	int			m;
	int			k;
	int			ldc;
	const float *bias;
} f32_shape;

static cai_status
init_problem_f32(lt_problem *p, int n, const void *arg, cai_error *err)
{
	const f32_shape *s = (const f32_shape *) arg;
	cublasOperation_t op_t = CUBLAS_OP_T,
				op_n = CUBLAS_OP_N;

	LT_CHECK(cublasLtMatmulDescInit(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), err,
			 "cublasLtMatmulDescInit");
	LT_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t,
											sizeof(op_t)), err, "cublasLtMatmulDescSetAttribute");
	LT_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n,
											sizeof(op_n)), err, "cublasLtMatmulDescSetAttribute");
	if (s->bias)
	{
		cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;

		/* the bias has one entry per row of D, i.e. per output channel */
		LT_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
												sizeof(epi)), err,
				 "cublasLtMatmulDescSetAttribute");
		LT_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
												&s->bias, sizeof(s->bias)), err,
				 "cublasLtMatmulDescSetAttribute");
	}
	LT_CHECK(cublasLtMatrixLayoutInit(&p->a, CUDA_R_32F, (uint64_t) s->k, (uint64_t) s->m, s->k),
			 err, "cublasLtMatrixLayoutInit");
	LT_CHECK(cublasLtMatrixLayoutInit(&p->b, CUDA_R_32F, (uint64_t) s->k, (uint64_t) n, s->k),
			 err, "cublasLtMatrixLayoutInit");
	LT_CHECK(cublasLtMatrixLayoutInit(&p->c, CUDA_R_32F, (uint64_t) s->m, (uint64_t) n, s->ldc),
			 err, "cublasLtMatrixLayoutInit");
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_gemm_f32(cai_cuda_ctx *ctx, const float *x_dev, int n_tok, int k, const float *w_dev,
				  int n_out, const float *bias_dev, float *out_dev, int ldo, bool accumulate,
				  cai_error *err)
{
	f32_shape	shape = {n_out, k, ldo, bias_dev};
	gemm_algo_entry *e;
	lt_problem	p;
	cai_status	st;
	cublasStatus_t rc;
	float		alpha = 1.0f,
				beta = accumulate ? 1.0f : 0.0f;
	algo_key	key = {ALGO_KIND_F32, n_out, n_tok, k,
		(bias_dev ? ALGO_FLAG_BIAS : 0) | (accumulate ? ALGO_FLAG_ACCUMULATE : 0), ldo,
	alignment_key(w_dev, x_dev, out_dev)};

	if (n_tok <= 0)
		return CAI_OK;
	if (ldo < n_out)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "float gemm: ldo %d < n_out %d", ldo,
						 n_out);
	st = algo_lookup(ctx, &key, init_problem_f32, &shape, &e, err);
	if (st != CAI_OK)
		return st;
	if ((st = init_problem_f32(&p, n_tok, &shape, err)) != CAI_OK)
		return st;
	rc = CUBLAS_STATUS_NOT_SUPPORTED;
	if (e->found)
		rc = cublasLtMatmul(ctx->lt, &p.desc, &alpha, w_dev, &p.a, x_dev, &p.b, &beta, out_dev,
							&p.c, out_dev, &p.c, &e->algo, ctx->lt_workspace,
							ctx->lt_workspace_bytes, ctx->stream);
	if (rc == CUBLAS_STATUS_NOT_SUPPORTED || rc == CUBLAS_STATUS_INVALID_VALUE)
	{
		key.flags |= ALGO_EXACT;
		st = algo_lookup(ctx, &key, init_problem_f32, &shape, &e, err);
		if (st != CAI_OK)
			return st;
		if (!e->found)
			return cuda_fail(err, CAI_ERR_UNSUPPORTED,
							 "cublaslt has no float gemm for m=%d n=%d k=%d", n_out, n_tok, k);
		rc = cublasLtMatmul(ctx->lt, &p.desc, &alpha, w_dev, &p.a, x_dev, &p.b, &beta, out_dev,
							&p.c, out_dev, &p.c, &e->algo, ctx->lt_workspace,
							ctx->lt_workspace_bytes, ctx->stream);
	}
	if (rc != CUBLAS_STATUS_SUCCESS)
		return cuda_fail_lt(err, rc, "cublasLtMatmul (float)");
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Weight matrices
 * ------------------------------------------------------------------------------------------- */

static cai_status
qmatrix_alloc(cai_cuda_ctx *ctx, int n_out, int k, const char *what, cai_cuda_qmatrix *out,
			  cai_error *err)
{
	cai_status	st;
	size_t		q_bytes;

	memset(out, 0, sizeof(*out));
	if (n_out <= 0 || k <= 0 || k % 4 != 0)
		return cuda_fail(err, CAI_ERR_UNSUPPORTED,
						 "%s: the cuda backend needs k to be a positive multiple of 4 (n_out=%d k=%d)",
						 what, n_out, k);
	out->n_out = n_out;
	out->n_out_padded = (n_out + 3) / 4 * 4;
	out->k = k;
	q_bytes = (size_t) out->n_out_padded * (size_t) k;
	if ((st = cai_cuda_malloc(ctx, q_bytes, what, (void **) &out->q_dev, err)) != CAI_OK)
		return st;
	if ((st = cai_cuda_malloc(ctx, (size_t) out->n_out_padded * sizeof(float), what,
							  (void **) &out->scale_dev, err)) != CAI_OK)
	{
		cai_cuda_qmatrix_free(ctx, out);
		return st;
	}
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_qmatrix_upload(cai_cuda_ctx *ctx, const int8_t *q, const float *scale, int n_out, int k,
						const char *what, cai_cuda_qmatrix *out, cai_error *err)
{
	cai_status	st;
	size_t		pad_rows;

	if ((st = qmatrix_alloc(ctx, n_out, k, what, out, err)) != CAI_OK)
		return st;
	pad_rows = (size_t) (out->n_out_padded - n_out);
	if ((st = cai_cuda_upload(ctx, out->q_dev, q, (size_t) n_out * k, err)) != CAI_OK ||
		(st = cai_cuda_upload(ctx, out->scale_dev, scale, (size_t) n_out * sizeof(float),
							  err)) != CAI_OK ||
		(pad_rows > 0 &&
		 ((st = cai_cuda_memset(ctx, out->q_dev + (size_t) n_out * k, 0, pad_rows * k,
								err)) != CAI_OK ||
		  (st = cai_cuda_memset(ctx, out->scale_dev + n_out, 0, pad_rows * sizeof(float),
								err)) != CAI_OK)) ||
		(st = cai_cuda_sync(ctx, err)) != CAI_OK)
	{
		cai_cuda_qmatrix_free(ctx, out);
		return st;
	}
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_qmatrix_random(cai_cuda_ctx *ctx, int n_out, int k, uint64_t seed, const char *what,
						cai_cuda_qmatrix *out, cai_error *err)
{
	cai_status	st;

	if ((st = qmatrix_alloc(ctx, n_out, k, what, out, err)) != CAI_OK)
		return st;
	/* scales near 1/(127 sqrt(k)) keep activations of a random network in a sane range */
	if ((st = cai_cuda_fill_random_i8(ctx, out->q_dev, (size_t) out->n_out_padded * k, seed,
									  err)) != CAI_OK ||
		(st = cai_cuda_fill_random_f32(ctx, out->scale_dev, (size_t) out->n_out_padded,
									   0.5f / (127.0f * sqrtf((float) k)),
									   1.5f / (127.0f * sqrtf((float) k)), seed ^ 0x5ca1e,
									   err)) != CAI_OK)
	{
		cai_cuda_qmatrix_free(ctx, out);
		return st;
	}
	return CAI_OK;
}

extern "C" void
cai_cuda_qmatrix_free(cai_cuda_ctx *ctx, cai_cuda_qmatrix *m)
{
	cai_cuda_free(ctx, m->q_dev);
	cai_cuda_free(ctx, m->scale_dev);
	memset(m, 0, sizeof(*m));
}

/* ---------------------------------------------------------------------------------------------
 * The GEMM micro-benchmark
 * ------------------------------------------------------------------------------------------- */

static int
compare_double(const void *a, const void *b)
{
	double		x = *(const double *) a,
				y = *(const double *) b;

	return x < y ? -1 : x > y;
}

extern "C" cai_status
cai_cuda_measure_gemm_i8(cai_cuda_ctx *ctx, int m, int n, int k, int reps, double *seconds,
						 cai_error *err)
{
	cai_cuda_qmatrix w;
	int8_t	   *x = NULL;
	int32_t    *acc = NULL;
	cai_cuda_timer *timer = NULL;
	double	   *times = NULL;
	cai_status	st;

	*seconds = 0.0;
	if (reps < 1)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "gemm probe needs reps >= 1");
	memset(&w, 0, sizeof(w));
	times = (double *) calloc((size_t) reps, sizeof(double));
	if (!times)
		return cuda_fail(err, CAI_ERR_NO_MEMORY, "out of memory");
	if ((st = cai_cuda_qmatrix_random(ctx, m, k, 11, "the gemm probe", &w, err)) != CAI_OK ||
		(st = cai_cuda_malloc(ctx, (size_t) n * k, "the gemm probe", (void **) &x, err)) != CAI_OK ||
		(st = cai_cuda_malloc(ctx, (size_t) n * w.n_out_padded * sizeof(int32_t), "the gemm probe",
							  (void **) &acc, err)) != CAI_OK ||
		(st = cai_cuda_fill_random_i8(ctx, x, (size_t) n * k, 13, err)) != CAI_OK ||
		(st = cai_cuda_timer_create(ctx, &timer, err)) != CAI_OK)
		goto done;
	for (int r = -2; r < reps; r++)
	{
		double		s;

		if ((st = cai_cuda_timer_start(ctx, timer, err)) != CAI_OK ||
			(st = cai_cuda_gemm_i8_acc(ctx, x, n, &w, acc, w.n_out_padded, err)) != CAI_OK ||
			(st = cai_cuda_timer_stop(ctx, timer, &s, err)) != CAI_OK)
			goto done;
		if (r >= 0)
			times[r] = s;
	}
	qsort(times, (size_t) reps, sizeof(double), compare_double);
	*seconds = times[reps / 2];
	st = CAI_OK;
done:
	cai_cuda_timer_free(timer);
	cai_cuda_free(ctx, x);
	cai_cuda_free(ctx, acc);
	cai_cuda_qmatrix_free(ctx, &w);
	free(times);
	return st;
}
