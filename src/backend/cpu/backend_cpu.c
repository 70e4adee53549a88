/*
 * backend_cpu.c — the CPU instance of the backend table (backend.h).
 *
 * Row operations split the batch's token rows into contiguous chunks over the thread pool
 * (inline on the caller when the work is small: a decode step runs about ten of them per
 * layer and a dispatch is not free); the GEMMs are cpu/gemm.c's; attention runs one task per
 * (sequence, KV head, tile of tokens), the most expensive tasks first because the pool hands
 * tasks out in index order; when a step has too few tiles to keep the threads busy (decode at
 * long context), each tile's segments (attention.h) are split over several tasks and merged by a
 * second round.  Decode rows over the same blocks (the samples of one prompt: attention_sharing.h)
 * take those blocks' segments in one shared tile per KV head and their own segments in tasks of
 * their own, merged by the same round.  None of this splitting changes a result: every kernel
 * computes a row from that row's inputs alone, and attention's segments are merged in one fixed
 * order.
 */
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "util.h"
#include "attention.h"
#include "attention_sharing.h"
#include "cpu_weight.h"
#include "gemm.h"
#include "gemm_blocks.h"
#include "ops.h"
#include "quant.h"
#include "threadpool.h"

/*
 * Elements of work below which a row operation runs on the caller alone.  The pool's workers
 * spin between the matrix products of a step, so a dispatch costs about a microsecond: the
 * 32-row norms, RoPE and KV writes of a batch-32 decode step (18-25 K elements, a few
 * microseconds each) are worth splitting; the single rows of batch 1 never are.
 */
#define ROWS_INLINE_WORK 8192

typedef struct attn_task
{
	int			seq;
	int			kv_head;
	int			t0;				/* first row */
	int			n_tok;
	int64_t		cost;			/* rows x positions: for ordering only */
	int			seg_begin;		/* a part: its segments [seg_begin, seg_end) */
	int			seg_end;
	/* a part's partials (NULL: the whole tile, into the output); a shared part's, one a member */
	const cai_attn_partials *pt;
	const int  *seqs;			/* a shared part's sequences (n_seqs of them), or NULL */
	int			n_seqs;
	int			own_from;		/* a shared part's first position of the members' own blocks */
} attn_task;

/* A tile computed in parts, merged from its partials once they are all written. */
typedef struct attn_merge
{
	int			kv_head;
	int			t0;
	int			n_tok;
	const cai_attn_partials *pt;
} attn_merge;

/* Tiles split at most per step (a split happens only below 2 tiles per thread). */
#define MAX_SPLIT_TILES(n_threads) (2 * (n_threads))

typedef struct cpu_backend
{
	cai_threadpool *pool;
	int			n_threads;
	cai_backend_limits limits;
	float	   *row_scratch;	/* [n_threads][max_width] */
	void	   *attn_memory;
	cai_attn_scratch *attn;		/* [n_threads] */
	attn_task  *tasks;			/* [max_tasks] */
	int			max_tasks;
	/* split tiles: each one's partials, in split_memory */
	cai_attn_partials *split;	/* [MAX_SPLIT_TILES] */
	float	   *split_memory;
	size_t		split_floats;	/* per split tile */
	/* shared tiles: the groups, their members, and each member's partials per KV head */
	cai_attn_share_group *share_groups;	/* [max_tokens / 2] */
	int		   *share_seqs;		/* [max_tokens] */
	int		   *share_taken;	/* [max_tokens] */
	cai_attn_partials *share_pt;	/* [n_kv_heads][members] */
	float	   *share_memory;	/* grown as a step needs */
	size_t		share_floats;
	/* the step's tiles computed in parts, for the merge round */
	attn_merge *merges;			/* [MAX_SPLIT_TILES + max_tokens * n_kv_heads] */
	/* the weights this backend prepared (freed with it) */
	cai_weight **weights;
	int			n_weights;
} cpu_backend;

static cpu_backend *
cpu_of(cai_backend *be)
{
	return (cpu_backend *) be->impl;
}

/* ---------------------------------------------------------------------------------------------
 * Running a row function over the pool
 * ------------------------------------------------------------------------------------------- */

typedef void (*rows_fn) (void *arg, int t0, int t1, int thread);

typedef struct rows_job
{
	rows_fn		fn;
	void	   *arg;
	int			n_rows;
	int			n_tasks;
} rows_job;

static void
rows_task(void *arg, int task, int thread)
{
	rows_job   *job = arg;
	int			t0 = (int) ((int64_t) job->n_rows * task / job->n_tasks);
	int			t1 = (int) ((int64_t) job->n_rows * (task + 1) / job->n_tasks);

	if (t1 > t0)
		job->fn(job->arg, t0, t1, thread);
}

/* Calls fn over [0, n_rows) in chunks; work_per_row sizes the decision to go parallel. */
static void
run_rows(cpu_backend *cb, int n_rows, int64_t work_per_row, rows_fn fn, void *arg)
{
	int64_t		work = (int64_t) n_rows * work_per_row;
	rows_job	job;

	if (n_rows <= 0)
		return;
	if (cb->n_threads <= 1 || n_rows == 1 || work < ROWS_INLINE_WORK)
	{
		fn(arg, 0, n_rows, 0);
		return;
	}
	job.fn = fn;
	job.arg = arg;
	job.n_rows = n_rows;
	job.n_tasks = cb->n_threads * 4;
	if (job.n_tasks > n_rows)
		job.n_tasks = n_rows;
	if (job.n_tasks > work / (ROWS_INLINE_WORK / 4))
		job.n_tasks = (int) (work / (ROWS_INLINE_WORK / 4));
	if (job.n_tasks < 2)
		job.n_tasks = 2;
	cai_threadpool_run(cb->pool, rows_task, &job, job.n_tasks);
}

/* ---------------------------------------------------------------------------------------------
 * Memory
 * ------------------------------------------------------------------------------------------- */

static void *
cpu_alloc(cai_backend *be, size_t bytes)
{
	void	   *p;

	if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
		return NULL;
	return p;
}

static void
cpu_free(cai_backend *be, void *ptr)
{
	free(ptr);
}

/* ---------------------------------------------------------------------------------------------
 * Embedding, gathering, norms, quantization
 * ------------------------------------------------------------------------------------------- */

typedef struct embed_args
{
	const cai_qmatrix *table_i8;
	const float *table_f32;
	int			d;
	const int32_t *ids;
	float	   *x;
} embed_args;

static void
embed_i8_rows(void *arg, int t0, int t1, int thread)
{
	embed_args *a = arg;
	int			d = a->table_i8->k;

	for (int t = t0; t < t1; t++)
		cai_op_dequant_row(a->table_i8->q + (size_t) a->ids[t] * d, a->table_i8->scale[a->ids[t]],
						   d, a->x + (size_t) t * d);
}

static void
cpu_embed_i8(cai_backend *be, const cai_qmatrix *table, const int32_t *ids, int n_tok, float *x)
{
	embed_args	a = {.table_i8 = table, .ids = ids, .x = x};

	run_rows(cpu_of(be), n_tok, table->k, embed_i8_rows, &a);
}

static void
embed_i8_add_rows(void *arg, int t0, int t1, int thread)
{
	embed_args *a = arg;
	int			d = a->table_i8->k;

	for (int t = t0; t < t1; t++)
	{
		const int8_t *q = a->table_i8->q + (size_t) a->ids[t] * d;
		float		s = a->table_i8->scale[a->ids[t]];
		float	   *x = a->x + (size_t) t * d;

		for (int i = 0; i < d; i++)
			x[i] = x[i] + (float) q[i] * s;
	}
}

static void
cpu_embed_i8_add(cai_backend *be, const cai_qmatrix *table, const int32_t *ids, int n_tok,
				 float *x)
{
	embed_args	a = {.table_i8 = table, .ids = ids, .x = x};

	run_rows(cpu_of(be), n_tok, 2 * table->k, embed_i8_add_rows, &a);
}

static void
cpu_embed_f32(cai_backend *be, const float *table, int d, const int32_t *ids, int n_tok,
			  float *x)
{
	for (int t = 0; t < n_tok; t++)
		memcpy(x + (size_t) t * d, table + (size_t) ids[t] * d, (size_t) d * sizeof(float));
}

static void
cpu_gather_rows(cai_backend *be, const float *src, int d, const int32_t *rows, int n_rows,
				float *dst)
{
	for (int i = 0; i < n_rows; i++)
		memcpy(dst + (size_t) i * d, src + (size_t) rows[i] * d, (size_t) d * sizeof(float));
}

/* A row operation's continuation (backend.h's cai_then_rotate) on row t, just written. */
static void
then_rotate_row(const cai_then_rotate *then, float *row, int t)
{
	int			width = then->n_vec * then->rot->n;

	for (int v = 0; v < then->n_vec; v++)
		cai_op_rotate_vec(then->rot, row + (size_t) v * then->rot->n);
	if (then->q)
		cai_quantize_act_i8(row, 1, width, then->q + (size_t) t * width, then->s + t);
}

/*
 * Work of a continuation per row: butterflies, the mix and the quantization, about
 * log2(n_pow2) + n_mix + 4 operations per element.
 */
static int64_t
then_work(const cai_then_rotate *then)
{
	return then ? (int64_t) then->n_vec * then->rot->n * 4 : 0;
}

typedef struct norm_args
{
	cpu_backend *cb;
	const float *x;
	const float *w;
	int			d;
	float		eps;
	float	   *out;
	int8_t	   *q;
	float	   *s;
	const cai_then_rotate *then;
} norm_args;

static void
rmsnorm_rows(void *arg, int t0, int t1, int thread)
{
	norm_args  *a = arg;

	for (int t = t0; t < t1; t++)
	{
		float	   *out = a->out + (size_t) t * a->d;

		cai_op_rmsnorm_row(a->x + (size_t) t * a->d, a->w, a->d, a->eps, out);
		if (a->then)
			then_rotate_row(a->then, out, t);
	}
}

static void
cpu_rmsnorm(cai_backend *be, const float *x, const float *w, int n_tok, int d, float eps,
			float *out, const cai_then_rotate *then)
{
	norm_args	a = {.cb = cpu_of(be), .x = x, .w = w, .d = d, .eps = eps, .out = out,
	.then = then};

	run_rows(a.cb, n_tok, d + then_work(then), rmsnorm_rows, &a);
}

typedef struct head_norm_args
{
	float	   *x;
	int			ldx;
	int			n_heads;
	int			head_dim;
	const float *w;
	float		eps;
} head_norm_args;

static void
head_rmsnorm_rows(void *arg, int t0, int t1, int thread)
{
	head_norm_args *a = arg;

	for (int t = t0; t < t1; t++)
		for (int h = 0; h < a->n_heads; h++)
		{
			float	   *head = a->x + (size_t) t * a->ldx + (size_t) h * a->head_dim;

			/* in place: the row kernel has summed the squares before it writes */
			cai_op_rmsnorm_row(head, a->w, a->head_dim, a->eps, head);
		}
}

static void
cpu_head_rmsnorm(cai_backend *be, float *x, int ldx, int n_tok, int n_heads, int head_dim,
				 const float *w, float eps)
{
	head_norm_args a = {.x = x, .ldx = ldx, .n_heads = n_heads, .head_dim = head_dim, .w = w,
	.eps = eps};

	run_rows(cpu_of(be), n_tok, (int64_t) n_heads * head_dim * 2, head_rmsnorm_rows, &a);
}

static void
quantize_rows(void *arg, int t0, int t1, int thread)
{
	norm_args  *a = arg;

	cai_quantize_act_i8(a->x + (size_t) t0 * a->d, t1 - t0, a->d, a->q + (size_t) t0 * a->d,
						a->s + t0);
}

static void
cpu_quantize(cai_backend *be, const float *x, int n_tok, int k, int8_t *q, float *s)
{
	norm_args	a = {.cb = cpu_of(be), .x = x, .d = k, .q = q, .s = s};

	run_rows(a.cb, n_tok, k, quantize_rows, &a);
}

typedef struct residual_args
{
	cpu_backend *cb;
	const float *x;
	int			k;
	const int8_t *q;
	const float *s;
	int8_t	   *q2;
	float	   *s2;
} residual_args;

static void
quantize_second_digit_rows(void *arg, int t0, int t1, int thread)
{
	residual_args *a = arg;
	float	   *r = a->cb->row_scratch + (size_t) thread * a->cb->limits.max_width;

	for (int t = t0; t < t1; t++)
	{
		const float *x = a->x + (size_t) t * a->k;
		const int8_t *q = a->q + (size_t) t * a->k;
		const float s = a->s[t];

		for (int i = 0; i < a->k; i++)
			r[i] = x[i] - (float) q[i] * s;
		cai_quantize_act_i8(r, 1, a->k, a->q2 + (size_t) t * a->k, a->s2 + t);
	}
}

static void
cpu_quantize_second_digit(cai_backend *be, const float *x, int n_tok, int k, const int8_t *q,
						  const float *s, int8_t *q2, float *s2)
{
	residual_args a = {.cb = cpu_of(be), .x = x, .k = k, .q = q, .s = s, .q2 = q2, .s2 = s2};

	run_rows(a.cb, n_tok, 2 * k, quantize_second_digit_rows, &a);
}

typedef struct digits_args
{
	const float *y;
	int			n_tok;
	int			n_out;
	const float *bias;
	float	   *out;
	int			ldo;
	bool		accumulate;
} digits_args;

static void
add_digits_rows(void *arg, int t0, int t1, int thread)
{
	digits_args *a = arg;

	for (int t = t0; t < t1; t++)
	{
		const float *y1 = a->y + (size_t) t * a->n_out;
		const float *y2 = a->y + (size_t) (a->n_tok + t) * a->n_out;
		float	   *out = a->out + (size_t) t * a->ldo;

		for (int o = 0; o < a->n_out; o++)
		{
			float		v = a->bias ? y1[o] + a->bias[o] : y1[o];

			if (a->accumulate)
				v = out[o] + v;
			out[o] = v + y2[o];
		}
	}
}

static void
cpu_add_digits(cai_backend *be, const float *y, int n_tok, int n_out, const float *bias,
			   float *out, int ldo, bool accumulate)
{
	digits_args a = {.y = y, .n_tok = n_tok, .n_out = n_out, .bias = bias, .out = out,
	.ldo = ldo, .accumulate = accumulate};

	run_rows(cpu_of(be), n_tok, (int64_t) n_out * 3, add_digits_rows, &a);
}

/* ---------------------------------------------------------------------------------------------
 * GEMMs
 * ------------------------------------------------------------------------------------------- */

static void
cpu_gemm_i8(cai_backend *be, const int8_t *xq, const float *xs, int n_tok, const cai_weight *w,
			int n_out, const float *bias, float *out, int ldo, bool accumulate)
{
	cai_cpu_qmatrix m = w->m;

	/* the first n_out channels: whole panels of the packed layout (backend.h) */
	m.n_out = n_out;
	cai_gemm_i8(cpu_of(be)->pool, xq, xs, n_tok, &m, bias, out, ldo, accumulate);
}

/* ---------------------------------------------------------------------------------------------
 * Weights
 * ------------------------------------------------------------------------------------------- */

typedef struct prepare_job
{
	const cai_qmatrix *const *src;
	cai_weight **out;
	atomic_int	failed;
} prepare_job;

/* Copies one matrix and its scales into memory of the weight's own and packs it. */
static void
prepare_task(void *arg, int task, int thread)
{
	prepare_job *job = arg;
	const cai_qmatrix *src = job->src[task];
	size_t		bytes = (size_t) src->n_out * src->k;
	cai_weight *w = calloc(1, sizeof(*w));
	void	   *q = NULL;
	float	   *scale = malloc((size_t) src->n_out * sizeof(float));

	(void) thread;
	if (!w || !scale || posix_memalign(&q, 64, bytes ? bytes : 64) != 0)
	{
		free(w);
		free(scale);
		atomic_store(&job->failed, 1);
		return;
	}
	memcpy(q, src->q, bytes);
	memcpy(scale, src->scale, (size_t) src->n_out * sizeof(float));
	w->m = (cai_cpu_qmatrix) {.n_out = src->n_out, .k = src->k, .q = q, .scale = scale};
	job->out[task] = w;
	if (!cai_cpu_qmatrix_pack(&w->m))
		atomic_store(&job->failed, 1);
}

static void
free_weight(cai_weight *w)
{
	if (!w)
		return;
	if (w->mapped)
	{
		/* its memory is the weights cache's mapping, which the model unmaps */
		free(w);
		return;
	}
	free((void *) w->m.q);
	free((void *) w->m.scale);
	for (int i = 0; i < w->n_parts; i++)
		cai_cpu_bmatrix_free(&w->parts[i]);
	free(w);
}

static cai_status
cpu_prepare_i8(cai_backend *be, const cai_qmatrix *const *src, int n, const cai_weight **out,
			   cai_error *err)
{
	cpu_backend *cb = cpu_of(be);
	cai_weight **made = calloc((size_t) (n > 0 ? n : 1), sizeof(*made));
	cai_weight **list = realloc(cb->weights, (size_t) (cb->n_weights + n) * sizeof(*list));
	prepare_job job = {.src = src, .out = made};

	if (list)
		cb->weights = list;
	if (!made || !list)
	{
		free(made);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory preparing the weights");
	}
	atomic_init(&job.failed, 0);
	cai_threadpool_run(cb->pool, prepare_task, &job, n);
	if (atomic_load(&job.failed))
	{
		for (int i = 0; i < n; i++)
			free_weight(made[i]);
		free(made);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory preparing the weights");
	}
	for (int i = 0; i < n; i++)
	{
		cb->weights[cb->n_weights++] = made[i];
		out[i] = made[i];
	}
	free(made);
	return CAI_OK;
}

/* Keeps made[0, n) in the backend's list (freed with it), or frees them all when list is NULL. */
static cai_status
keep_weights(cpu_backend *cb, cai_weight **made, int n, const cai_weight **out, cai_error *err)
{
	cai_weight **list = realloc(cb->weights, (size_t) (cb->n_weights + n) * sizeof(*list));

	if (!list)
	{
		for (int i = 0; i < n; i++)
			free_weight(made[i]);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory preparing the weights");
	}
	cb->weights = list;
	for (int i = 0; i < n; i++)
	{
		cb->weights[cb->n_weights++] = made[i];
		out[i] = made[i];
	}
	return CAI_OK;
}

typedef struct prepare_blocks_job
{
	const cai_bmatrix *const *src;
	cai_weight **out;
	cai_error  *errs;			/* one per matrix */
} prepare_blocks_job;

/* Repacks every part of one block matrix (a task per matrix: each is packed by one thread). */
static void
prepare_blocks_task(void *arg, int task, int thread)
{
	prepare_blocks_job *job = arg;
	const cai_bmatrix *src = job->src[task];
	cai_weight *w = calloc(1, sizeof(*w));

	(void) thread;
	job->errs[task].status = CAI_OK;
	if (!w)
	{
		cai_fail(&job->errs[task], CAI_ERR_NO_MEMORY, "out of memory preparing the weights");
		return;
	}
	job->out[task] = w;
	for (int i = 0; i < src->n_parts; i++)
	{
		const cai_bmatrix_part *p = &src->part[i];

		size_t		row_bytes = 0;

		if (cai_cpu_bmatrix_pack(p->type, p->data, p->rows, src->k, &w->parts[i],
								 &job->errs[task]) != CAI_OK)
			return;
		w->n_parts = i + 1;
		/*
		 * the source pages leave resident memory as soon as their copy is made, so a model
		 * never holds both whole (read again, they come from the page cache)
		 */
		if (ggml_row_bytes(p->type, src->k, &row_bytes))
			cai_unmap_pages(p->data, row_bytes * (size_t) p->rows);
	}
}

static cai_status
cpu_prepare_blocks(cai_backend *be, const cai_bmatrix *const *src, int n, const cai_weight **out,
				   cai_error *err)
{
	cpu_backend *cb = cpu_of(be);
	cai_weight **made = calloc((size_t) (n > 0 ? n : 1), sizeof(*made));
	cai_error  *errs = calloc((size_t) (n > 0 ? n : 1), sizeof(*errs));
	prepare_blocks_job job = {.src = src, .out = made, .errs = errs};
	cai_status	st = CAI_OK;

	if (!made || !errs)
	{
		free(made);
		free(errs);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory preparing the weights");
	}
	cai_threadpool_run(cb->pool, prepare_blocks_task, &job, n);
	for (int i = 0; i < n && st == CAI_OK; i++)
		if (errs[i].status != CAI_OK)
		{
			st = errs[i].status;
			if (err)
				*err = errs[i];
		}
	if (st != CAI_OK)
		for (int i = 0; i < n; i++)
			free_weight(made[i]);
	else
		st = keep_weights(cb, made, n, out, err);
	free(made);
	free(errs);
	return st;
}

static cai_status
cpu_export_weights(cai_backend *be, const cai_weight *const *w, int n,
				   struct cai_wcache_writer *out, cai_error *err)
{
	(void) be;
	return cai_cpu_export_weights(w, n, out, err);
}

static cai_status
cpu_import_weights(cai_backend *be, const struct cai_wcache_view *in, uint32_t *cursor,
				   const cai_qmatrix *const *i8, const cai_bmatrix *const *blocks, int n,
				   const cai_weight **out, cai_error *err)
{
	cai_weight **made = calloc((size_t) (n > 0 ? n : 1), sizeof(*made));
	cai_status	st;

	if (!made)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory mapping the weights");
	st = cai_cpu_import_weights(in, cursor, i8, blocks, n, made, err);
	if (st != CAI_OK)
		for (int i = 0; i < n; i++)
			free_weight(made[i]);
	else
		st = keep_weights(cpu_of(be), made, n, out, err);
	free(made);
	return st;
}

/* A prompt's activations quantized in parallel: a task per run of tokens. */
typedef struct quantize_job
{
	const float *x;
	int			n_tok;
	int			k;
	int			group;
	int			tokens_per_task;
	int8_t	   *q;
	float	   *s;
	int16_t    *sum;
} quantize_job;

#define QUANTIZE_TASK_TOKENS 16	/* less is not worth waking a thread */

static void
quantize_task(void *arg, int task, int thread)
{
	const quantize_job *j = arg;
	const int	t0 = task * j->tokens_per_task;
	const int	n = j->n_tok - t0 < j->tokens_per_task ? j->n_tok - t0 : j->tokens_per_task;
	const size_t nb = j->k / CAI_BLOCK_ELEMS;

	(void) thread;
	cai_quantize_act_blocks(j->x + (size_t) t0 * j->k, n, j->k, j->group,
							j->q + (size_t) t0 * j->k, j->s + t0 * nb, j->sum + t0 * nb);
}

/*
 * The blocks per activation scale for w: with super-block activations asked for, a K-quant
 * part's super-block (every part reads that group: the others' arithmetic is per block), else 1.
 */
static int
act_group_of(const cai_weight *w, bool superblocks)
{
	int			group = 1;

	for (int i = 0; superblocks && i < w->n_parts; i++)
		if (cai_act_group(w->parts[i].type) > group)
			group = cai_act_group(w->parts[i].type);
	return group;
}

static void
cpu_quantize_blocks(cai_backend *be, const float *x, int n_tok, int k, const cai_weight *w,
					bool superblocks, int8_t *q, float *s, int16_t *sum)
{
	cai_threadpool *pool = cpu_of(be)->pool;
	const int	threads = pool ? cai_threadpool_size(pool) : 1;
	quantize_job job = {x, n_tok, k, act_group_of(w, superblocks), QUANTIZE_TASK_TOKENS, q, s, sum};

	if (threads < 2 || n_tok < 2 * QUANTIZE_TASK_TOKENS)
	{
		cai_quantize_act_blocks(x, n_tok, k, job.group, q, s, sum);
		return;
	}
	/* a few tasks per thread, so that a thread another process holds up delays little */
	if (job.tokens_per_task * threads * 4 < n_tok)
		job.tokens_per_task = (n_tok + threads * 4 - 1) / (threads * 4);
	cai_threadpool_run(pool, quantize_task, &job,
					   (n_tok + job.tokens_per_task - 1) / job.tokens_per_task);
}

/* Each part's rows in turn: part i covers rows [row0, row0 + its rows) of the stacked matrix. */
static void
cpu_gemm_blocks(cai_backend *be, const int8_t *xq, const float *xs, const int16_t *xsum,
				int n_tok, const cai_weight *w, bool superblocks, int n_out, const float *bias,
				float *out, int ldo, bool accumulate)
{
	const int	group = act_group_of(w, superblocks);
	int			row0 = 0;

	for (int i = 0; i < w->n_parts && row0 < n_out; i++)
	{
		const cai_cpu_bmatrix *p = &w->parts[i];
		int			rows = n_out - row0 < p->n_out ? n_out - row0 : p->n_out;

		cai_gemm_blocks(cpu_of(be)->pool, xq, xs, xsum, group, n_tok, p, rows,
						bias ? bias + row0 : NULL, out + row0, ldo, accumulate);
		row0 += p->n_out;
	}
}

/* Rows of a block table dequantized from the model's mapping of the file. */
static void
cpu_embed_blocks(cai_backend *be, const cai_bmatrix *table, const int32_t *ids, int n_tok,
				 float *x)
{
	(void) be;
	for (int t = 0; t < n_tok; t++)
	{
		int			row = ids[t];

		for (int i = 0; i < table->n_parts; i++)
		{
			const cai_bmatrix_part *p = &table->part[i];
			size_t		row_bytes = 0;

			if (row >= p->rows)
			{
				row -= p->rows;
				continue;
			}
			ggml_row_bytes(p->type, table->k, &row_bytes);
			cai_dequantize_row(p->type, (const uint8_t *) p->data + (size_t) row * row_bytes,
							   x + (size_t) t * table->k, table->k, NULL);
			break;
		}
	}
}

/* The CPU reads model memory where it is. */
static const void *
cpu_weight_data(cai_backend *be, const void *host, size_t bytes, cai_error *err)
{
	(void) be;
	(void) bytes;
	(void) err;
	return host;
}

static void
cpu_gemm_f32(cai_backend *be, const float *x, int n_tok, int k, const float *w, int n_out,
			 const float *bias, float *out, int ldo, bool accumulate)
{
	cai_gemm_f32(cpu_of(be)->pool, x, n_tok, k, w, n_out, bias, out, ldo, accumulate);
}

/* ---------------------------------------------------------------------------------------------
 * RoPE, SwiGLU
 * ------------------------------------------------------------------------------------------- */

typedef struct rope_args
{
	const cai_rope_params *rp;
	const int32_t *pos;
	float	   *cs;
	const float *cs_in;
	float	   *x;
	int			ldx;
	int			n_heads;
	int			head_dim;
	const cai_then_rotate *then;
} rope_args;

static void
rope_prepare_rows(void *arg, int t0, int t1, int thread)
{
	rope_args  *a = arg;

	for (int t = t0; t < t1; t++)
		cai_op_rope_angles(a->rp, a->pos[t], a->cs + (size_t) t * a->rp->n_rot);
}

static void
cpu_rope_prepare(cai_backend *be, const cai_rope_params *rp, const int32_t *pos, int n_tok,
				 float *cs)
{
	rope_args	a = {.rp = rp, .pos = pos, .cs = cs};

	/* a cos, a sin and a pow per angle: count them as 64 elements of work */
	run_rows(cpu_of(be), n_tok, (int64_t) rp->n_rot * 32, rope_prepare_rows, &a);
}

static void
rope_rows(void *arg, int t0, int t1, int thread)
{
	rope_args  *a = arg;

	for (int t = t0; t < t1; t++)
	{
		float	   *row = a->x + (size_t) t * a->ldx;

		cai_op_rope_row(a->rp, a->cs_in + (size_t) t * a->rp->n_rot, row, a->n_heads,
						a->head_dim);
		if (a->then)
			then_rotate_row(a->then, row, t);
	}
}

static void
cpu_rope(cai_backend *be, const cai_rope_params *rp, const float *cs, float *x, int ldx,
		 int n_tok, int n_heads, int head_dim, const cai_then_rotate *then)
{
	rope_args	a = {.rp = rp, .cs_in = cs, .x = x, .ldx = ldx, .n_heads = n_heads,
	.head_dim = head_dim, .then = then};

	run_rows(cpu_of(be), n_tok, (int64_t) n_heads * rp->n_rot + then_work(then), rope_rows, &a);
}

typedef struct swiglu_args
{
	cpu_backend *cb;
	const float *gate_up;
	int			d_ff;
	float	   *out;
	const cai_then_rotate *then;
} swiglu_args;

static void
swiglu_rows(void *arg, int t0, int t1, int thread)
{
	swiglu_args *a = arg;

	for (int t = t0; t < t1; t++)
	{
		const float *g = a->gate_up + (size_t) t * 2 * a->d_ff;
		float	   *out = a->out + (size_t) t * a->d_ff;

		cai_op_swiglu_row(g, g + a->d_ff, a->d_ff, out);
		if (a->then)
			then_rotate_row(a->then, out, t);
	}
}

static void
cpu_swiglu(cai_backend *be, const float *gate_up, int n_tok, int d_ff, float *out,
		   const cai_then_rotate *then)
{
	swiglu_args a = {.cb = cpu_of(be), .gate_up = gate_up, .d_ff = d_ff, .out = out,
	.then = then};

	run_rows(a.cb, n_tok, (int64_t) d_ff * 4 + then_work(then), swiglu_rows, &a);
}

static void
geglu_rows(void *arg, int t0, int t1, int thread)
{
	swiglu_args *a = arg;

	for (int t = t0; t < t1; t++)
	{
		const float *g = a->gate_up + (size_t) t * 2 * a->d_ff;
		float	   *out = a->out + (size_t) t * a->d_ff;

		cai_op_geglu_row(g, g + a->d_ff, a->d_ff, out);
		if (a->then)
			then_rotate_row(a->then, out, t);
	}
}

static void
cpu_geglu(cai_backend *be, const float *gate_up, int n_tok, int d_ff, float *out,
		  const cai_then_rotate *then)
{
	swiglu_args a = {.cb = cpu_of(be), .gate_up = gate_up, .d_ff = d_ff, .out = out,
	.then = then};

	run_rows(a.cb, n_tok, (int64_t) d_ff * 6 + then_work(then), geglu_rows, &a);
}

static void
rmsnorm_add_rows(void *arg, int t0, int t1, int thread)
{
	norm_args  *a = arg;

	for (int t = t0; t < t1; t++)
		cai_op_rmsnorm_add_row(a->x + (size_t) t * a->d, a->w, a->d, a->eps,
							   a->out + (size_t) t * a->d);
}

static void
cpu_rmsnorm_add(cai_backend *be, const float *y, const float *w, int n_tok, int d, float eps,
				float *x)
{
	norm_args	a = {.cb = cpu_of(be), .x = y, .w = w, .d = d, .eps = eps, .out = x};

	run_rows(a.cb, n_tok, (int64_t) d * 3, rmsnorm_add_rows, &a);
}

static void
cpu_scale(cai_backend *be, float *x, int n_tok, int d, float s)
{
	size_t		n = (size_t) n_tok * d;

	for (size_t i = 0; i < n; i++)
		x[i] = x[i] * s;
}

/* ---------------------------------------------------------------------------------------------
 * Rotation
 * ------------------------------------------------------------------------------------------- */

typedef struct rotate_args
{
	cai_then_rotate rotation;
	float	   *x;
	int			ldx;
} rotate_args;

static void
rotate_rows(void *arg, int t0, int t1, int thread)
{
	rotate_args *a = arg;

	for (int t = t0; t < t1; t++)
		then_rotate_row(&a->rotation, a->x + (size_t) t * a->ldx, t);
}

static void
cpu_rotate(cai_backend *be, const cai_rotation *rot, float *x, int ldx, int n_tok, int n_vec,
		   int8_t *q, float *s)
{
	rotate_args a = {.rotation = {.rot = rot, .n_vec = n_vec, .q = q, .s = s}, .x = x, .ldx = ldx};

	run_rows(cpu_of(be), n_tok, then_work(&a.rotation), rotate_rows, &a);
}

/* ---------------------------------------------------------------------------------------------
 * KV cache and attention
 * ------------------------------------------------------------------------------------------- */

typedef struct kv_write_args
{
	const cai_attn_params *ap;
	const cai_batch_layout *batch;
	const float *k;
	const float *v;
	int			ld;
	cai_kv_pool *kv;
	const cai_kv_shadow *shadow;
} kv_write_args;

static void
kv_write_rows(void *arg, int t0, int t1, int thread)
{
	kv_write_args *a = arg;
	const cai_kv_layout *L = cai_kv_pool_layout(a->kv);
	int			n_kv = a->ap->n_kv_heads;
	int			hd = a->ap->head_dim;

	for (int t = t0; t < t1; t++)
	{
		int			pos = a->batch->token_pos[t];
		int32_t		block = a->batch->block_tables[a->batch->token_seq[t]][pos / CAI_KV_BLOCK_TOKENS];
		int			slot = pos % CAI_KV_BLOCK_TOKENS;
		uint8_t    *part = cai_kv_block_layer(a->kv, block, a->ap->kv_layer);
		int8_t	   *keys = cai_kv_keys(L, part);
		int8_t	   *values = cai_kv_values(L, part);
		float	   *kscale = cai_kv_key_scales(L, part);
		float	   *vscale = cai_kv_value_scales(L, part);

		for (int h = 0; h < n_kv; h++)
		{
			const float *kr = a->k + (size_t) t * a->ld + (size_t) h * hd;
			const float *vr = a->v + (size_t) t * a->ld + (size_t) h * hd;
			size_t		at = ((size_t) slot * n_kv + h) * hd;

			if (L->key_digits == 2)
				cai_op_quantize_vec_two_digits(kr, hd, keys + at, cai_kv_key_second_digits(L, part) + at,
											   &kscale[slot * n_kv + h]);
			else
				cai_op_quantize_vec_i8(kr, hd, keys + at, &kscale[slot * n_kv + h]);
			cai_op_quantize_vec_i8(vr, hd, values + at, &vscale[slot * n_kv + h]);
			if (a->shadow)
			{
				float	   *sk = a->shadow->data + (size_t) block * a->shadow->block_floats
					+ (size_t) a->ap->kv_layer * a->shadow->layer_floats;
				float	   *sv = sk + (size_t) CAI_KV_BLOCK_TOKENS * n_kv * hd;

				memcpy(sk + at, kr, (size_t) hd * sizeof(float));
				memcpy(sv + at, vr, (size_t) hd * sizeof(float));
			}
		}
	}
}

static void
cpu_kv_write(cai_backend *be, const cai_attn_params *ap, const cai_batch_layout *batch,
			 const float *k, const float *v, int ld, cai_kv_pool *kv,
			 const cai_kv_shadow *shadow)
{
	kv_write_args a = {.ap = ap, .batch = batch, .k = k, .v = v, .ld = ld, .kv = kv,
	.shadow = shadow};

	run_rows(cpu_of(be), batch->n_tokens, (int64_t) 4 * ap->n_kv_heads * ap->head_dim,
			 kv_write_rows, &a);
}

typedef struct attn_args
{
	cpu_backend *cb;
	const cai_attn_params *ap;
	const cai_batch_layout *batch;
	const float *q;
	int			ldq;
	cai_kv_pool *kv;
	const cai_kv_shadow *shadow;
	float	   *out;
	int			ldo;
} attn_args;

static void
attention_task(void *arg, int task, int thread)
{
	attn_args  *a = arg;
	const attn_task *t = &a->cb->tasks[task];

	if (t->seqs)
		cai_attention_shared_part(a->ap, a->batch, t->seqs, t->n_seqs, t->kv_head, a->q, a->ldq,
								  a->kv, t->seg_begin, t->seg_end, t->own_from, t->pt,
								  &a->cb->attn[thread]);
	else if (t->pt)
		cai_attention_tile_part(a->ap, a->batch, t->seq, t->kv_head, t->t0, t->n_tok, a->q,
								a->ldq, a->kv, a->shadow, t->seg_begin, t->seg_end, t->pt,
								&a->cb->attn[thread]);
	else
		cai_attention_tile(a->ap, a->batch, t->seq, t->kv_head, t->t0, t->n_tok, a->q, a->ldq,
						   a->kv, a->shadow, a->out, a->ldo, &a->cb->attn[thread]);
}

static void
attention_merge_task(void *arg, int task, int thread)
{
	attn_args  *a = arg;
	const attn_merge *m = &a->cb->merges[task];

	cai_attention_merge(a->ap, a->batch, m->kv_head, m->t0, m->n_tok, m->pt, a->out, a->ldo);
}

/* Most expensive first; ties in (seq, row, head, segment) order. */
static int
compare_tasks(const void *x, const void *y)
{
	const attn_task *a = x;
	const attn_task *b = y;

	if (a->cost != b->cost)
		return a->cost > b->cost ? -1 : 1;
	if (a->t0 != b->t0)
		return a->t0 < b->t0 ? -1 : 1;
	if (a->kv_head != b->kv_head)
		return a->kv_head - b->kv_head;
	return a->seg_begin - b->seg_begin;
}

/*
 * Splits the step's n_tiles whole tiles (tasks[0..n_tiles)) over their segments when there are
 * too few tasks for the threads: about four tasks per thread, each a run of consecutive
 * segments.  The parts past a tile's first go after the n_tasks tasks there are; each split tile
 * is added to the merges.  Returns the number of tasks.
 */
static int
split_tiles(cpu_backend *cb, const cai_attn_params *ap, const cai_batch_layout *batch,
			int n_tiles, int n_tasks, int *n_merges)
{
	int			want = 4 * cb->n_threads;
	int			n_split = 0;

	if (cb->n_threads < 2 || n_tasks >= 2 * cb->n_threads || !cb->split_memory)
		return n_tasks;
	for (int i = 0; i < n_tiles && n_split < MAX_SPLIT_TILES(cb->n_threads); i++)
	{
		attn_task	tile = cb->tasks[i];
		cai_attn_partials *pt = &cb->split[n_split];
		int			first,
					last,
					n_segs,
					k;

		cai_attention_tile_segments(ap, batch, tile.t0, tile.n_tok, &first, &last);
		n_segs = last - first + 1;
		k = (want + n_tiles - 1) / n_tiles;
		if (k > n_segs)
			k = n_segs;
		if (k < 2 || n_tasks + k - 1 > cb->max_tasks)
			continue;
		{
			int			rows = tile.n_tok * (ap->n_heads / ap->n_kv_heads);
			float	   *mem = cb->split_memory + (size_t) n_split * cb->split_floats;

			pt->seg0 = first;
			pt->n_segs = n_segs;
			pt->o = mem;
			pt->m = mem + (size_t) n_segs * rows * ap->head_dim;
			pt->l = pt->m + (size_t) rows * n_segs;
		}
		cb->merges[(*n_merges)++] = (attn_merge) {
			.kv_head = tile.kv_head, .t0 = tile.t0, .n_tok = tile.n_tok, .pt = pt
		};
		n_split++;
		/* the tile's slot takes its first part; the others go to the end */
		for (int p = 0; p < k; p++)
		{
			attn_task  *t = p == 0 ? &cb->tasks[i] : &cb->tasks[n_tasks++];

			*t = tile;
			t->seg_begin = first + (int) ((int64_t) n_segs * p / k);
			t->seg_end = first + (int) ((int64_t) n_segs * (p + 1) / k);
			t->cost = tile.cost / k;
			t->pt = pt;
		}
	}
	return n_tasks;
}

/*
 * The step's groups of decode rows over the same blocks (attention_sharing.h), with partials for
 * each member and KV head laid out in share_memory: share_pt[h * members + m].  Returns the
 * number of groups (none when the memory cannot be had: the rows then take tiles of their
 * own); *n_members gets the members.
 */
static int
plan_shared_tiles(cpu_backend *cb, const cai_attn_params *ap, const cai_batch_layout *batch,
				  int *n_members)
{
	const int	group = ap->n_heads / ap->n_kv_heads;
	const int	SEG = CAI_ATTN_SEGMENT_TOKENS;
	int			n_groups = cai_attention_share_groups(ap, batch, cai_attention_shared_max_seqs(group),
													  cb->share_seqs, cb->share_taken,
													  cb->share_groups);
	int			members;
	size_t		need = 0;
	float	   *mem;

	*n_members = 0;
	if (n_groups == 0)
		return 0;
	members = cb->share_groups[n_groups - 1].first + cb->share_groups[n_groups - 1].n;
	for (int m = 0; m < members; m++)
	{
		int			pos = batch->token_pos[batch->seq_start[cb->share_seqs[m]]];
		int			lo = cai_attention_first_position(ap, pos);
		size_t		n_segs = (size_t) (pos / SEG - lo / SEG + 1);

		need += (size_t) ap->n_kv_heads * n_segs * group * ((size_t) ap->head_dim + 2);
	}
	if (need > cb->share_floats)
	{
		float	   *grown = realloc(cb->share_memory, need * sizeof(float));

		if (!grown)
		{
			memset(cb->share_taken, 0, (size_t) batch->n_seqs * sizeof(int));
			return 0;
		}
		cb->share_memory = grown;
		cb->share_floats = need;
	}
	mem = cb->share_memory;
	for (int h = 0; h < ap->n_kv_heads; h++)
		for (int m = 0; m < members; m++)
		{
			cai_attn_partials *pt = &cb->share_pt[(size_t) h * members + m];
			int			pos = batch->token_pos[batch->seq_start[cb->share_seqs[m]]];
			int			lo = cai_attention_first_position(ap, pos);

			pt->seg0 = lo / SEG;
			pt->n_segs = pos / SEG - lo / SEG + 1;
			pt->o = mem;
			pt->m = mem + (size_t) pt->n_segs * group * ap->head_dim;
			pt->l = pt->m + (size_t) group * pt->n_segs;
			mem = pt->l + (size_t) group * pt->n_segs;
		}
	*n_members = members;
	return n_groups;
}

/*
 * The shared tiles' tasks after the n_tasks there are: for each group and KV head, its shared
 * segments (cut into parts when there are few of them for the threads) and each member's own
 * segments after them, every member added to the merges.  Returns the number of tasks.
 */
static int
add_shared_tasks(cpu_backend *cb, const cai_batch_layout *batch, int n_kv, int n_groups,
				 int members, int n_tasks, int *n_merges)
{
	const int	SEG = CAI_ATTN_SEGMENT_TOKENS;
	int			want = 4 * cb->n_threads;
	int			spare = cb->max_tasks - n_tasks;
	int			k_most;

	if (n_groups == 0)
		return n_tasks;
	/*
	 * One shared part and a part per member, per KV head, always fit (a member has no whole tile
	 * of its own, and there are at most half as many groups as members); what is left bounds the
	 * extra shared parts.
	 */
	for (int gi = 0; gi < n_groups; gi++)
		spare -= n_kv * (1 + cb->share_groups[gi].n);
	k_most = 1 + spare / (n_groups * n_kv);
	for (int gi = 0; gi < n_groups; gi++)
	{
		const cai_attn_share_group *g = &cb->share_groups[gi];
		const int  *seqs = cb->share_seqs + g->first;
		int			n_shared = g->seg_end - g->seg_begin;
		int			k = (want + n_groups * n_kv - 1) / (n_groups * n_kv);

		if (k > n_shared)
			k = n_shared;
		if (k > k_most)
			k = k_most;
		for (int h = 0; h < n_kv; h++)
		{
			const cai_attn_partials *pts = &cb->share_pt[(size_t) h * members + g->first];

			for (int p = 0; p < k; p++)
				cb->tasks[n_tasks++] = (attn_task) {
					.seq = seqs[0], .kv_head = h, .t0 = batch->seq_start[seqs[0]],
					.n_tok = g->n, .cost = (int64_t) g->n * n_shared * SEG / k,
					.seg_begin = g->seg_begin + n_shared * p / k,
					.seg_end = g->seg_begin + n_shared * (p + 1) / k,
					.pt = pts, .seqs = seqs, .n_seqs = g->n, .own_from = g->own_from
				};
			for (int i = 0; i < g->n; i++)
			{
				int			t0 = batch->seq_start[seqs[i]];

				/* the member's segments past the shared tile's, if it reaches them */
				if (batch->token_pos[t0] >= g->seg_end * SEG)
					cb->tasks[n_tasks++] = (attn_task) {
						.seq = seqs[i], .kv_head = h, .t0 = t0, .n_tok = 1,
						.cost = batch->token_pos[t0] + 1 - (int64_t) g->seg_end * SEG,
						.seg_begin = g->seg_end, .seg_end = INT_MAX, .pt = &pts[i]
					};
				cb->merges[(*n_merges)++] = (attn_merge) {
					.kv_head = h, .t0 = t0, .n_tok = 1, .pt = &pts[i]
				};
			}
		}
	}
	return n_tasks;
}

static void
cpu_attention(cai_backend *be, const cai_attn_params *ap, const cai_batch_layout *batch,
			  const float *q, int ldq, cai_kv_pool *kv, const cai_kv_shadow *shadow,
			  float *out, int ldo)
{
	cpu_backend *cb = cpu_of(be);
	int			group = ap->n_heads / ap->n_kv_heads;
	int			tile = cai_attention_tile_tokens(group);
	int			n_tasks = 0;
	int			n_tiles;
	int			n_merges = 0;
	int			n_groups = 0;
	int			members = 0;
	attn_args	a = {.cb = cb, .ap = ap, .batch = batch, .q = q, .ldq = ldq, .kv = kv,
	.shadow = shadow, .out = out, .ldo = ldo};

	/* the float reference path keeps its tiles per sequence */
	if (!shadow && batch->n_seqs >= 2)
		n_groups = plan_shared_tiles(cb, ap, batch, &members);
	for (int s = 0; s < batch->n_seqs; s++)
	{
		int			start = batch->seq_start[s];
		int			len = batch->seq_len[s];

		if (n_groups > 0 && cb->share_taken[s])
			continue;
		for (int off = 0; off < len; off += tile)
		{
			int			n = len - off < tile ? len - off : tile;
			int			last = batch->token_pos[start + off + n - 1];
			int			first_lo = ap->window > 0 ? batch->token_pos[start + off] - ap->window + 1 : 0;
			int64_t		span = last - (first_lo > 0 ? first_lo : 0) + 1;

			for (int h = 0; h < ap->n_kv_heads; h++)
				cb->tasks[n_tasks++] = (attn_task) {
					.seq = s, .kv_head = h, .t0 = start + off, .n_tok = n, .cost = span * n
				};
		}
	}
	n_tiles = n_tasks;
	n_tasks = add_shared_tasks(cb, batch, ap->n_kv_heads, n_groups, members, n_tasks, &n_merges);
	n_tasks = split_tiles(cb, ap, batch, n_tiles, n_tasks, &n_merges);
	if (n_tasks > 1)
		qsort(cb->tasks, n_tasks, sizeof(attn_task), compare_tasks);
	cai_threadpool_run(cb->pool, attention_task, &a, n_tasks);
	if (n_merges > 0)
		cai_threadpool_run(cb->pool, attention_merge_task, &a, n_merges);
}

/* ---------------------------------------------------------------------------------------------
 * The instance
 * ------------------------------------------------------------------------------------------- */

static void
cpu_destroy(cai_backend *be)
{
	cpu_backend *cb;

	if (!be)
		return;
	cb = cpu_of(be);
	if (cb)
	{
		free(cb->row_scratch);
		free(cb->attn_memory);
		free(cb->attn);
		free(cb->tasks);
		free(cb->split);
		free(cb->split_memory);
		free(cb->share_groups);
		free(cb->share_seqs);
		free(cb->share_taken);
		free(cb->share_pt);
		free(cb->share_memory);
		free(cb->merges);
		for (int i = 0; i < cb->n_weights; i++)
			free_weight(cb->weights[i]);
		free(cb->weights);
		free(cb);
	}
	free(be);
}

/* The CPU backend attends over the host pool itself, so the copy is the pool's. */
static void
cpu_kv_copy_rows(cai_backend *be, cai_kv_pool *kv, int32_t src, int32_t dst, int n_rows)
{
	(void) be;
	cai_kv_block_copy_rows(kv, src, dst, n_rows);
}

static const cai_backend_ops cpu_ops = {
	.name = "cpu",
	.destroy = cpu_destroy,
	.alloc = cpu_alloc,
	.free = cpu_free,
	.embed_i8 = cpu_embed_i8,
	.embed_i8_add = cpu_embed_i8_add,
	.embed_f32 = cpu_embed_f32,
	.gather_rows = cpu_gather_rows,
	.rmsnorm = cpu_rmsnorm,
	.head_rmsnorm = cpu_head_rmsnorm,
	.quantize = cpu_quantize,
	.quantize_second_digit = cpu_quantize_second_digit,
	.add_digits = cpu_add_digits,
	.prepare_i8 = cpu_prepare_i8,
	.weight_data = cpu_weight_data,
	.gemm_i8 = cpu_gemm_i8,
	.gemm_f32 = cpu_gemm_f32,
	.prepare_blocks = cpu_prepare_blocks,
	.quantize_blocks = cpu_quantize_blocks,
	.gemm_blocks = cpu_gemm_blocks,
	.embed_blocks = cpu_embed_blocks,
	.export_weights = cpu_export_weights,
	.import_weights = cpu_import_weights,
	.rope_prepare = cpu_rope_prepare,
	.rope = cpu_rope,
	.swiglu = cpu_swiglu,
	.geglu = cpu_geglu,
	.rmsnorm_add = cpu_rmsnorm_add,
	.scale = cpu_scale,
	.kv_write = cpu_kv_write,
	.two_digit_keys = true,
	.kv_copy_rows = cpu_kv_copy_rows,
	.attention = cpu_attention,
	.rotate = cpu_rotate,
};

cai_status
cai_backend_cpu_create(cai_threadpool *pool, const cai_backend_limits *limits,
					   cai_backend **out, cai_error *err)
{
	cai_backend *be;
	cpu_backend *cb;
	int			group;
	size_t		scratch_bytes;
	size_t		total;

	*out = NULL;
	if (limits->max_tokens <= 0 || limits->max_context <= 0 || limits->max_width <= 0 ||
		limits->n_heads <= 0 || limits->n_kv_heads <= 0 || limits->head_dim <= 0 ||
		limits->n_heads % limits->n_kv_heads != 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "invalid cpu backend limits");

	be = calloc(1, sizeof(*be));
	cb = calloc(1, sizeof(*cb));
	if (!be || !cb)
	{
		free(be);
		free(cb);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory creating the cpu backend");
	}
	be->ops = &cpu_ops;
	be->impl = cb;
	cb->pool = pool;
	cb->n_threads = cai_threadpool_size(pool);
	cb->limits = *limits;

	group = limits->n_heads / limits->n_kv_heads;
	scratch_bytes = cai_attention_scratch_bytes(limits->max_context, group, limits->head_dim);
	/* a tile per KV head per sequence at most, and every sequence has at least one token */
	cb->max_tasks = (limits->max_tokens + limits->max_tokens) * limits->n_kv_heads;
	cb->row_scratch = malloc((size_t) cb->n_threads * limits->max_width * sizeof(float));
	cb->attn = calloc((size_t) cb->n_threads, sizeof(cai_attn_scratch));
	cb->tasks = malloc((size_t) cb->max_tasks * sizeof(attn_task));

	/*
	 * Split tiles' partials: a tile's rows' sums for each segment, maxima and totals.  Without
	 * this memory (a huge context) tiles are simply not split.
	 */
	{
		size_t		rows = (size_t) cai_attention_tile_tokens(group) * group;
		size_t		segs = (size_t) cai_attention_max_segments(limits->max_context);

		cb->split_floats = segs * rows * (size_t) limits->head_dim + 2 * rows * segs;
		cb->split = calloc(MAX_SPLIT_TILES(cb->n_threads), sizeof(cai_attn_partials));
		if (cb->n_threads > 1 && cb->split_floats < ((size_t) 1 << 28) / MAX_SPLIT_TILES(cb->n_threads))
			cb->split_memory = malloc(cb->split_floats * MAX_SPLIT_TILES(cb->n_threads) * sizeof(float));
	}
	if (!cai_mul_size(scratch_bytes, (size_t) cb->n_threads, &total) ||
		posix_memalign(&cb->attn_memory, 64, total) != 0)
		cb->attn_memory = NULL;
	/* shared tiles: at most every sequence a member, each with partials per KV head */
	cb->share_groups = calloc((size_t) limits->max_tokens / 2 + 1, sizeof(cai_attn_share_group));
	cb->share_seqs = calloc((size_t) limits->max_tokens, sizeof(int));
	cb->share_taken = calloc((size_t) limits->max_tokens, sizeof(int));
	cb->share_pt = calloc((size_t) limits->max_tokens * limits->n_kv_heads,
						  sizeof(cai_attn_partials));
	cb->merges = calloc(MAX_SPLIT_TILES(cb->n_threads) +
						(size_t) limits->max_tokens * limits->n_kv_heads, sizeof(attn_merge));
	if (!cb->row_scratch || !cb->attn || !cb->tasks || !cb->attn_memory || !cb->split ||
		!cb->share_groups || !cb->share_seqs || !cb->share_taken || !cb->share_pt ||
		!cb->merges)
	{
		cpu_destroy(be);
		return cai_fail(err, CAI_ERR_NO_MEMORY,
						"out of memory allocating cpu backend scratch (%zu bytes per thread)",
						scratch_bytes);
	}
	for (int i = 0; i < cb->n_threads; i++)
		cai_attention_scratch_init(&cb->attn[i], (uint8_t *) cb->attn_memory + (size_t) i * scratch_bytes,
								   limits->max_context, group, limits->head_dim);
	*out = be;
	return CAI_OK;
}

void
cai_backend_free(cai_backend *be)
{
	if (be)
		be->ops->destroy(be);
}
