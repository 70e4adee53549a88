/*
 * backend_cuda.c — the CUDA instance of the backend table: backend.h's operations on the
 * device, through the kernels of cuda_kernels.h (see backend_cuda.h for what happens to each
 * kind of pointer an operation receives).
 *
 * Every operation computes what the CPU backend computes, bit for bit, on the int8 path: the
 * kernels replay cpu/ops.c, cpu/gemm.c and cpu/attention.c operation for operation, and the
 * rotary table is built here on the host by rope.h's cai_rope_angles, the CPU's own code.  The
 * float reference path's GEMMs run through cuBLASLt in fp32 and differ from the CPU's by rounding.
 *
 * C, compiled by the host compiler against the engine's headers; it calls only the C API of the
 * kernels and links nothing of libcai.
 */
#include "backend_cuda.h"
#include "rope.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* One model weight array copied to the device (weight_data). */
typedef struct weight_range
{
	const uint8_t *host;
	size_t		bytes;
	uint8_t    *dev;
} weight_range;

/*
 * A GEMM operand: the model's row-major int8 matrix on the device (prepare_i8), or the file's
 * block matrix, each source part repacked to cai_cuda_bmatrix (prepare_blocks), stacked by rows.
 */
struct cai_weight
{
	cai_cuda_qmatrix m;
	int			n_parts;		/* 0: an int8 matrix */
	int			act_group;		/* blocks of 32 its activations' scale spans with super-block
								 * activations (the largest block of its parts' formats: 8 for
								 * a K-quant); the kernels' per-block arithmetic takes either */
	cai_cuda_bmatrix parts[CAI_BMATRIX_MAX_PARTS];
	const void *src[CAI_BMATRIX_MAX_PARTS];	/* the parts' host data (the embedding finds a
											 * table the head shares by it) */
};

/* One buffer handed out by ops->alloc. */
typedef struct dev_buffer
{
	uint8_t    *ptr;
	size_t		bytes;
} dev_buffer;

/* The device copy of one host KV pool. */
typedef struct kv_mirror
{
	const cai_kv_pool *host;
	cai_cuda_kv kv;
	int			n_kv_layers;
} kv_mirror;

#define MAX_KV_MIRRORS 4

/* The rotary table of one set of rope parameters: [max_context, n_rot] (cos, sin) pairs. */
typedef struct rope_table
{
	int			n_rot;
	float		base;
	float		freq_scale;
	const float *freq_factors;
	float	   *dev;
} rope_table;

#define MAX_ROPE_TABLES 4

/* Batch sizes recorded as graphs (larger decode steps run their operations). */
#define CUDA_GRAPH_MAX_TOKENS 256

typedef struct cuda_backend
{
	cai_cuda_ctx *ctx;
	cai_cuda_backend_params params;
	cai_cuda_device_info info;
	char		device_desc[320];

	weight_range *weights;		/* the arrays weight_data copied */
	int			n_weights;
	int			cap_weights;
	cai_weight **matrices;		/* the GEMM operands prepare_i8 made */
	int			n_matrices;
	size_t		weight_bytes;

	dev_buffer *buffers;
	int			n_buffers;
	int			cap_buffers;

	kv_mirror	kv[MAX_KV_MIRRORS];
	int			n_kv;
	cai_cuda_kv_shadow shadow;	/* device mirror of the float KV shadow */
	size_t		shadow_floats;

	rope_table	rope[MAX_ROPE_TABLES];
	int			n_rope;

	/* per-call index arrays on the device */
	int32_t    *ids_dev;		/* [max_tokens] */
	int32_t    *pos_dev;
	int32_t    *rows_dev;
	int32_t    *staging_host;	/* [3 * max_tokens] page-locked */
	int			staging_used;	/* ints of it used by this forward */

	/* GEMM outputs bound for host memory */
	float	   *hostout_dev;
	size_t		hostout_floats;

	/* the step plan of the current forward */
	bool		plan_stale;
	const cai_cuda_step_meta *meta;
	int			plan_n_tokens;
	int			plan_n_seqs;
	bool		plan_for_graph; /* a plan a recorded step can replay (cai_cuda_step_plan) */
	int32_t    *plan_key;		/* [4 * max_tokens]: start, len, pos, table pointer hash */

	/*
	 * Decode steps as CUDA graphs (step_graph_begin), one per batch size: a size is recorded at
	 * its second step (the first, plain, sizes every scratch buffer), and replayed after.
	 */
	bool		graphs_enabled;	/* CAI_CUDA_GRAPHS=0 turns them off */
	cai_step_graph graph_mode;	/* of the step under way */
	int			graph_key;		/* its batch size */
	const void *graph_owner;	/* the forward context the graphs were recorded with */
	const cai_kv_pool *graph_kv;
	bool		graph_warm[CUDA_GRAPH_MAX_TOKENS + 1];	/* a plain step of this size ran */
	bool		graph_refused[CUDA_GRAPH_MAX_TOKENS + 1];	/* its recording failed */
	float	   *graph_logits;	/* the step's host logits */
	size_t		graph_logit_floats;
	int32_t    *row_ids;		/* 0, 1, 2, ...: a decode step's rows that want logits */
	uint64_t	graph_captures;
	uint64_t	graph_replays;

	/* the first failure since the last status call */
	bool		failed;
	cai_error	error;
} cuda_backend;

static cuda_backend *
cb_of(cai_backend *be)
{
	return (cuda_backend *) be->impl;
}

/* ---------------------------------------------------------------------------------------------
 * Errors (cai_cuda_fail is cuda_error.c's)
 * ------------------------------------------------------------------------------------------- */

/* Keeps the first failure; later operations see cb->failed and do nothing. */
static void
be_record(cuda_backend *cb, const cai_error *e)
{
	if (cb->failed)
		return;
	cb->failed = true;
	cb->error = *e;
}

static void
be_recordf(cuda_backend *cb, cai_status status, const char *fmt, ...)
{
	va_list		ap;

	if (cb->failed)
		return;
	cb->failed = true;
	cb->error.status = status;
	va_start(ap, fmt);
	vsnprintf(cb->error.message, sizeof(cb->error.message), fmt, ap);
	va_end(ap);
}

/* Records e when st is not CAI_OK; true when the operation may go on. */
static bool
be_check(cuda_backend *cb, cai_status st, const cai_error *e)
{
	if (st == CAI_OK)
		return true;
	be_record(cb, e);
	return false;
}

/* ---------------------------------------------------------------------------------------------
 * Pointers: device buffers, model weights, host memory
 * ------------------------------------------------------------------------------------------- */

static bool
is_device_buffer(const cuda_backend *cb, const void *p)
{
	const uint8_t *b = p;

	for (int i = 0; i < cb->n_buffers; i++)
		if (b >= cb->buffers[i].ptr && b < cb->buffers[i].ptr + cb->buffers[i].bytes)
			return true;
	return false;
}

/* A read-only activation operand: a device buffer as is; else a recorded failure. */
static const void *
operand(cuda_backend *cb, const void *p, const char *what)
{
	if (!p)
		return NULL;
	if (is_device_buffer(cb, p))
		return p;
	be_recordf(cb, CAI_ERR_INTERNAL, "cuda backend: %s at %p is not backend memory", what, p);
	return NULL;
}

/* An output operand: must be a device buffer. */
static bool
output_ok(cuda_backend *cb, const void *p, const char *what)
{
	if (p && is_device_buffer(cb, p))
		return true;
	be_recordf(cb, CAI_ERR_INTERNAL, "cuda backend: %s at %p is not backend memory", what, p);
	return false;
}

/* ---------------------------------------------------------------------------------------------
 * Weights: made the backend's when a forward context is made (backend.h's prepare_i8 and
 * weight_data), so the operations receive device pointers and never look a host address up
 * ------------------------------------------------------------------------------------------- */

/* Bytes of page-locked memory the weights pass through on their way to the device. */
#define UPLOAD_CHUNK (8u << 20)

/*
 * Copies bytes of host memory to dev through a page-locked buffer: a copy from pageable memory
 * would be staged by the driver anyway, one small piece at a time, and cannot overlap anything.
 */
static cai_status
upload_pinned(cuda_backend *cb, void *dev, const void *host, size_t bytes, cai_error *err)
{
	void	   *pinned = NULL;
	size_t		chunk = bytes < UPLOAD_CHUNK ? bytes : UPLOAD_CHUNK;
	cai_status	st;

	if (bytes == 0)
		return CAI_OK;
	if ((st = cai_cuda_host_alloc(cb->ctx, chunk, "a weight upload", &pinned, err)) != CAI_OK)
		return st;
	for (size_t off = 0; off < bytes && st == CAI_OK; off += chunk)
	{
		size_t		n = bytes - off < chunk ? bytes - off : chunk;

		memcpy(pinned, (const uint8_t *) host + off, n);
		/* synchronous: the next piece reuses the page-locked buffer */
		st = cai_cuda_upload_sync(cb->ctx, (uint8_t *) dev + off, pinned, n, err);
	}
	cai_cuda_host_free(cb->ctx, pinned);
	return st;
}

/* A device copy of bytes at host with tail_pad zero bytes after it; NULL with err set. */
static void *
device_copy(cuda_backend *cb, const void *host, size_t bytes, size_t tail_pad, const char *what,
			cai_error *err)
{
	void	   *dev = NULL;

	if (cai_cuda_malloc(cb->ctx, bytes + tail_pad, what, &dev, err) != CAI_OK)
		return NULL;
	if (upload_pinned(cb, dev, host, bytes, err) != CAI_OK ||
		(tail_pad > 0 &&
		 cai_cuda_memset(cb->ctx, (uint8_t *) dev + bytes, 0, tail_pad, err) != CAI_OK))
	{
		cai_cuda_free(cb->ctx, dev);
		return NULL;
	}
	cb->weight_bytes += bytes + tail_pad;
	return dev;
}

/*
 * weight_data: the device copy of a model array, one per host array (tied embeddings, a bias
 * and its views share it when the first copy covers them).
 */
static const void *
cuda_weight_data(cai_backend *be, const void *host, size_t bytes, cai_error *err)
{
	cuda_backend *cb = cb_of(be);
	weight_range *w;
	void	   *dev;

	if (!host)
		return NULL;
	for (int i = 0; i < cb->n_weights; i++)
		if ((const uint8_t *) host >= cb->weights[i].host &&
			(const uint8_t *) host + bytes <= cb->weights[i].host + cb->weights[i].bytes)
			return cb->weights[i].dev + ((const uint8_t *) host - cb->weights[i].host);
	if (cb->n_weights == cb->cap_weights)
	{
		int			cap = cb->cap_weights ? cb->cap_weights * 2 : 64;
		weight_range *n = realloc(cb->weights, (size_t) cap * sizeof(weight_range));

		if (!n)
		{
			cai_cuda_fail(err, CAI_ERR_NO_MEMORY, "out of memory recording weights");
			return NULL;
		}
		cb->weights = n;
		cb->cap_weights = cap;
	}
	if (!(dev = device_copy(cb, host, bytes ? bytes : 1, 0, "a model weight", err)))
		return NULL;
	w = &cb->weights[cb->n_weights++];
	w->host = host;
	w->bytes = bytes;
	w->dev = dev;
	return dev;
}

static void
free_matrix(cuda_backend *cb, cai_weight *w)
{
	if (!w)
		return;
	cai_cuda_free(cb->ctx, w->m.q_dev);
	cai_cuda_free(cb->ctx, w->m.scale_dev);
	for (int i = 0; i < w->n_parts; i++)
	{
		cai_cuda_free(cb->ctx, w->parts[i].q_dev);
		cai_cuda_free(cb->ctx, w->parts[i].sc_dev);
	}
	free(w);
}

/*
 * prepare_i8: each matrix uploaded as the model holds it, row-major (cuBLASLt's TN layout), with
 * up to three zero rows past the end so that a GEMM over n_out rounded up to 4 stays in bounds.
 */
static cai_status
cuda_prepare_i8(cai_backend *be, const cai_qmatrix *const *src, int n, const cai_weight **out,
				cai_error *err)
{
	cuda_backend *cb = cb_of(be);
	cai_weight **list = realloc(cb->matrices, (size_t) (cb->n_matrices + n) * sizeof(*list));

	if (!list)
		return cai_cuda_fail(err, CAI_ERR_NO_MEMORY, "out of memory preparing the weights");
	cb->matrices = list;
	for (int i = 0; i < n; i++)
	{
		const cai_qmatrix *m = src[i];
		cai_weight *w;

		if (m->k % 4 != 0)
			return cai_cuda_fail(err, CAI_ERR_UNSUPPORTED,
						   "the cuda backend needs weight rows of a multiple of 4 columns (%d)",
						   m->k);
		if (!(w = calloc(1, sizeof(*w))))
			return cai_cuda_fail(err, CAI_ERR_NO_MEMORY, "out of memory preparing the weights");
		w->m.n_out = m->n_out;
		w->m.n_out_padded = (m->n_out + 3) / 4 * 4;
		w->m.k = m->k;
		w->m.q_dev = device_copy(cb, m->q, (size_t) m->n_out * m->k, (size_t) 3 * m->k,
								 "a weight matrix", err);
		w->m.scale_dev = w->m.q_dev ?
			device_copy(cb, m->scale, (size_t) m->n_out * sizeof(float), 3 * sizeof(float),
						"a weight matrix's scales", err) : NULL;
		if (!w->m.q_dev || !w->m.scale_dev)
		{
			free_matrix(cb, w);
			return CAI_ERR_NO_MEMORY;
		}
		cb->matrices[cb->n_matrices++] = w;
		out[i] = w;
	}
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Host index arrays: page-locked staging
 * ------------------------------------------------------------------------------------------- */

/*
 * A forward begins (embed is its first operation).  Waiting for the previous forward's work here
 * costs nothing in the usual step (the host has just waited for its logits) and makes the whole
 * staging buffer free again; it also marks the step plan stale.
 */
static bool
stage_begin_forward(cuda_backend *cb)
{
	cai_error	e;

	cb->staging_used = 0;
	cb->plan_stale = true;
	return be_check(cb, cai_cuda_sync(cb->ctx, &e), &e);
}

/* Copies n host ints to dst on the device (stream-ordered; the staging slot is not reused). */
static bool
stage_ints(cuda_backend *cb, const int32_t *host, int n, int32_t *dst)
{
	int			cap = 3 * cb->params.limits.max_tokens;
	int32_t    *slot;
	cai_error	e;

	if (n <= 0)
		return true;
	if (n > cb->params.limits.max_tokens)
	{
		be_recordf(cb, CAI_ERR_INVALID_ARGUMENT,
				   "cuda backend: %d rows exceed the backend's limit of %d", n,
				   cb->params.limits.max_tokens);
		return false;
	}
	if (cb->staging_used + n > cap)
	{
		/* more staging than one forward needs: wait for the copies, then start over */
		if (!be_check(cb, cai_cuda_sync(cb->ctx, &e), &e))
			return false;
		cb->staging_used = 0;
	}
	slot = cb->staging_host + cb->staging_used;
	memcpy(slot, host, (size_t) n * sizeof(int32_t));
	cb->staging_used += n;
	return be_check(cb, cai_cuda_upload(cb->ctx, dst, slot, (size_t) n * sizeof(int32_t), &e), &e);
}

/*
 * The token ids of a forward (its first operation): staged and uploaded, or, while a step is
 * recorded, already uploaded by step_graph_begin (and the previous step already waited for).
 */
static bool
step_inputs(cuda_backend *cb, const int32_t *ids, int n_tok)
{
	if (cb->graph_mode == CAI_STEP_CAPTURE)
		return true;
	return stage_begin_forward(cb) && stage_ints(cb, ids, n_tok, cb->ids_dev);
}

/* The rows a gather reads: staged, or while recording, the identity step_graph_begin uploaded. */
static bool
stage_rows(cuda_backend *cb, const int32_t *rows, int n_rows)
{
	if (cb->graph_mode != CAI_STEP_CAPTURE)
		return stage_ints(cb, rows, n_rows, cb->rows_dev);
	if (n_rows != cb->graph_key || memcmp(rows, cb->row_ids, (size_t) n_rows * sizeof(int32_t)) != 0)
	{
		be_recordf(cb, CAI_ERR_INTERNAL, "cuda backend: a recorded step gathers other rows");
		return false;
	}
	return true;
}

/* ---------------------------------------------------------------------------------------------
 * Memory
 * ------------------------------------------------------------------------------------------- */

static void *
cuda_alloc(cai_backend *be, size_t bytes)
{
	cuda_backend *cb = cb_of(be);
	void	   *p = NULL;
	cai_error	e;

	if (cb->n_buffers == cb->cap_buffers)
	{
		int			cap = cb->cap_buffers ? cb->cap_buffers * 2 : 16;
		dev_buffer *n = realloc(cb->buffers, (size_t) cap * sizeof(dev_buffer));

		if (!n)
			return NULL;
		cb->buffers = n;
		cb->cap_buffers = cap;
	}
	if (cai_cuda_malloc(cb->ctx, bytes ? bytes : 64, "activations", &p, &e) != CAI_OK)
	{
		be_record(cb, &e);
		return NULL;
	}
	cb->buffers[cb->n_buffers].ptr = p;
	cb->buffers[cb->n_buffers].bytes = bytes ? bytes : 64;
	cb->n_buffers++;
	return p;
}

static void
cuda_free_buffer(cai_backend *be, void *ptr)
{
	cuda_backend *cb = cb_of(be);

	if (!ptr)
		return;
	for (int i = 0; i < cb->n_buffers; i++)
		if (cb->buffers[i].ptr == ptr)
		{
			cai_cuda_free(cb->ctx, ptr);
			cb->buffers[i] = cb->buffers[--cb->n_buffers];
			return;
		}
}

/* ---------------------------------------------------------------------------------------------
 * Embedding, gathering, norms, quantization
 * ------------------------------------------------------------------------------------------- */

/* x = the table's rows, or x + them (add: a two-digit table's second digits) */
static void
embed_rows_i8(cai_backend *be, const cai_qmatrix *table, const int32_t *ids, int n_tok, float *x,
			  bool add)
{
	cuda_backend *cb = cb_of(be);
	cai_cuda_qmatrix t = {.n_out = table->n_out, .n_out_padded = table->n_out, .k = table->k,
	.q_dev = (int8_t *) table->q, .scale_dev = (float *) table->scale};
	cai_error	e;

	if (cb->failed || !step_inputs(cb, ids, n_tok) || !output_ok(cb, x, "embedding output"))
		return;
	be_check(cb, add ? cai_cuda_embed_i8_add(cb->ctx, &t, cb->ids_dev, n_tok, x, &e)
			 : cai_cuda_embed_i8(cb->ctx, &t, cb->ids_dev, n_tok, x, &e), &e);
}

static void
cuda_embed_i8(cai_backend *be, const cai_qmatrix *table, const int32_t *ids, int n_tok, float *x)
{
	embed_rows_i8(be, table, ids, n_tok, x, false);
}

static void
cuda_embed_i8_add(cai_backend *be, const cai_qmatrix *table, const int32_t *ids, int n_tok,
				  float *x)
{
	embed_rows_i8(be, table, ids, n_tok, x, true);
}

static void
cuda_embed_f32(cai_backend *be, const float *table, int d, const int32_t *ids, int n_tok,
			   float *x)
{
	cuda_backend *cb = cb_of(be);
	cai_error	e;

	if (cb->failed || !step_inputs(cb, ids, n_tok) || !output_ok(cb, x, "embedding output"))
		return;
	be_check(cb, cai_cuda_embed_f32(cb->ctx, table, cb->params.model->cfg.n_vocab, d,
									cb->ids_dev, n_tok, x, &e), &e);
}

static void
cuda_gather_rows(cai_backend *be, const float *src, int d, const int32_t *rows, int n_rows,
				 float *dst)
{
	cuda_backend *cb = cb_of(be);
	const float *s;
	cai_error	e;

	if (cb->failed || n_rows <= 0)
		return;
	s = operand(cb, src, "gather source");
	if (!s || !output_ok(cb, dst, "gather output") || !stage_rows(cb, rows, n_rows))
		return;
	be_check(cb, cai_cuda_gather_rows(cb->ctx, s, d, cb->rows_dev, n_rows, dst, &e), &e);
}

static void cuda_rotate(cai_backend *be, const cai_rotation *rot, float *x, int ldx, int n_tok,
						int n_vec, int8_t *q, float *s);

/* A row operation's continuation (backend.h): rotate() on the rows it wrote, after it. */
static void
then_rotate(cai_backend *be, const cai_then_rotate *then, float *x, int ldx, int n_tok)
{
	if (then)
		cuda_rotate(be, then->rot, x, ldx, n_tok, then->n_vec, then->q, then->s);
}

static void
cuda_rmsnorm(cai_backend *be, const float *x, const float *w, int n_tok, int d, float eps,
			 float *out, const cai_then_rotate *then)
{
	cuda_backend *cb = cb_of(be);
	cai_error	e;

	if (cb->failed || !operand(cb, x, "norm input") || !output_ok(cb, out, "norm output"))
		return;
	be_check(cb, cai_cuda_rmsnorm(cb->ctx, x, w, n_tok, d, eps, out, NULL, NULL, &e), &e);
	then_rotate(be, then, out, d, n_tok);
}

static void
cuda_rmsnorm_add(cai_backend *be, const float *y, const float *w, int n_tok, int d, float eps,
				 float *x)
{
	cuda_backend *cb = cb_of(be);
	cai_error	e;

	if (cb->failed || !operand(cb, y, "sublayer output") || !output_ok(cb, x, "residual stream"))
		return;
	be_check(cb, cai_cuda_rmsnorm_add(cb->ctx, y, w, n_tok, d, eps, x, &e), &e);
}

static void
cuda_head_rmsnorm(cai_backend *be, float *x, int ldx, int n_tok, int n_heads, int head_dim,
				  const float *w, float eps)
{
	cuda_backend *cb = cb_of(be);
	cai_error	e;

	if (cb->failed || !output_ok(cb, x, "query/key norm rows"))
		return;
	be_check(cb, cai_cuda_head_rmsnorm(cb->ctx, x, ldx, n_tok, n_heads, head_dim, w, eps, &e),
			 &e);
}

static void
cuda_quantize(cai_backend *be, const float *x, int n_tok, int k, int8_t *q, float *s)
{
	cuda_backend *cb = cb_of(be);
	cai_error	e;

	if (cb->failed || !operand(cb, x, "quantize input") || !output_ok(cb, q, "quantize output") ||
		!output_ok(cb, s, "quantize scales"))
		return;
	be_check(cb, cai_cuda_quantize_act(cb->ctx, x, n_tok, k, k, q, s, &e), &e);
}

static void
cuda_quantize_second_digit(cai_backend *be, const float *x, int n_tok, int k, const int8_t *q,
						   const float *s, int8_t *q2, float *s2)
{
	cuda_backend *cb = cb_of(be);
	cai_error	e;

	if (cb->failed || !operand(cb, x, "residual input") || !operand(cb, q, "first digit") ||
		!operand(cb, s, "first digit's scales") || !output_ok(cb, q2, "second digit") ||
		!output_ok(cb, s2, "second digit's scales"))
		return;
	be_check(cb, cai_cuda_quantize_second_digit(cb->ctx, x, n_tok, k, q, s, q2, s2, &e), &e);
}

/* ---------------------------------------------------------------------------------------------
 * GEMMs
 * ------------------------------------------------------------------------------------------- */

/*
 * A GEMM output outside backend memory (the caller's logits): computed into a device buffer,
 * then downloaded; with accumulate, the host values are uploaded first.  Returns the device
 * pointer to compute into, or NULL after recording a failure.
 */
static float *
host_output_begin(cuda_backend *cb, float *out, int n_tok, int ldo, bool accumulate)
{
	size_t		floats = (size_t) n_tok * ldo;
	cai_error	e;

	if (floats > cb->hostout_floats)
	{
		void	   *p = NULL;

		if (!be_check(cb, cai_cuda_sync(cb->ctx, &e), &e))
			return NULL;
		/* recorded steps write their logits into the old buffer */
		cai_cuda_graph_reset(cb->ctx);
		cai_cuda_free(cb->ctx, cb->hostout_dev);
		cb->hostout_dev = NULL;
		cb->hostout_floats = 0;
		if (!be_check(cb, cai_cuda_malloc(cb->ctx, floats * sizeof(float), "logits", &p, &e), &e))
			return NULL;
		cb->hostout_dev = p;
		cb->hostout_floats = floats;
	}
	if (accumulate &&
		!be_check(cb, cai_cuda_upload(cb->ctx, cb->hostout_dev, out, floats * sizeof(float), &e),
				  &e))
		return NULL;
	return cb->hostout_dev;
}

static void
host_output_end(cuda_backend *cb, float *out, int n_tok, int ldo)
{
	cai_error	e;

	/* a recorded step's logits come down after it ran (step_graph_end) */
	if (cb->failed || cb->graph_mode == CAI_STEP_CAPTURE)
		return;
	if (be_check(cb, cai_cuda_download(cb->ctx, out, cb->hostout_dev,
									   (size_t) n_tok * ldo * sizeof(float), &e), &e))
		be_check(cb, cai_cuda_sync(cb->ctx, &e), &e);
}

static void
cuda_gemm_i8(cai_backend *be, const int8_t *xq, const float *xs, int n_tok, const cai_weight *w,
			 int n_out, const float *bias, float *out, int ldo, bool accumulate)
{
	cuda_backend *cb = cb_of(be);
	cai_cuda_qmatrix m = w->m;
	cai_cuda_epilogue epi;
	bool		to_host;
	float	   *dst = out;
	cai_error	e;

	if (cb->failed || n_tok <= 0 || !operand(cb, xq, "gemm input") ||
		!operand(cb, xs, "gemm input scales"))
		return;
	/* the first n_out rows: rows past them (or the zero padding) stay within the allocation */
	m.n_out = n_out;
	m.n_out_padded = (n_out + 3) / 4 * 4;
	memset(&epi, 0, sizeof(epi));
	epi.accumulate = accumulate;
	epi.bias_dev = bias;
	to_host = !is_device_buffer(cb, out);
	if (to_host && !(dst = host_output_begin(cb, out, n_tok, ldo, accumulate)))
		return;
	if (!be_check(cb, cai_cuda_gemm_i8(cb->ctx, xq, xs, n_tok, &m, dst, ldo, &epi, &e), &e))
		return;
	if (to_host)
		host_output_end(cb, out, n_tok, ldo);
}

static void
cuda_gemm_f32(cai_backend *be, const float *x, int n_tok, int k, const float *w, int n_out,
			  const float *bias, float *out, int ldo, bool accumulate)
{
	cuda_backend *cb = cb_of(be);
	bool		to_host;
	float	   *dst = out;
	cai_error	e;

	if (cb->failed || n_tok <= 0 || !operand(cb, x, "float gemm input"))
		return;
	to_host = !is_device_buffer(cb, out);
	if (to_host && !(dst = host_output_begin(cb, out, n_tok, ldo, accumulate)))
		return;
	if (!be_check(cb, cai_cuda_gemm_f32(cb->ctx, x, n_tok, k, w, n_out, bias, dst, ldo,
										accumulate, &e), &e))
		return;
	if (to_host)
		host_output_end(cb, out, n_tok, ldo);
}

/* ---------------------------------------------------------------------------------------------
 * The file's own block weights (gemm_blocks.cu)
 * ------------------------------------------------------------------------------------------- */

/*
 * The whole pages of a repacked source leave resident memory once the device has its copy (the
 * model's mapping of the file: read again, they come from the page cache), as the CPU backend
 * does, so the host does not keep a second copy of the weights the GPU holds.
 */
static void
drop_source_pages(const void *p, size_t bytes)
{
	const uintptr_t page = (uintptr_t) sysconf(_SC_PAGESIZE);
	uintptr_t	lo = ((uintptr_t) p + page - 1) & ~(page - 1);
	uintptr_t	hi = ((uintptr_t) p + bytes) & ~(page - 1);

	if (hi > lo)
		(void) madvise((void *) lo, hi - lo, MADV_DONTNEED);
}

/* Part i of src repacked on the host (blocks_pack.c) and uploaded into w->parts[i]. */
static cai_status
upload_block_part(cuda_backend *cb, const cai_bmatrix *src, int i, cai_weight *w, cai_error *err)
{
	const cai_bmatrix_part *p = &src->part[i];
	cai_cuda_bmatrix_host h;
	cai_cuda_bmatrix *d = &w->parts[i];
	cai_status	st;

	if ((st = cai_cuda_bmatrix_pack((int) p->type, p->data, p->rows, src->k, &h, err)) != CAI_OK)
		return st;
	d->n_out = h.n_out;
	d->k = h.k;
	d->nibble = h.nibble;
	d->split16 = h.split16;
	w->src[i] = p->data;
	w->n_parts = i + 1;
	if (h.act_group > w->act_group)
		w->act_group = h.act_group;
	d->q_dev = device_copy(cb, h.q, h.q_bytes, 0, "a block weight matrix", err);
	d->sc_dev = d->q_dev ? device_copy(cb, h.sc, h.sc_bytes, 0, "a block matrix's scales", err)
		: NULL;
	cai_cuda_bmatrix_host_free(&h);
	if (!d->q_dev || !d->sc_dev)
		return CAI_ERR_NO_MEMORY;
	drop_source_pages(p->data, h.source_bytes);
	return CAI_OK;
}

/* One block matrix on the device, kept in cb->matrices (freed with the backend). */
static cai_status
make_block_matrix(cuda_backend *cb, const cai_bmatrix *src, cai_weight **out, cai_error *err)
{
	cai_weight **list = realloc(cb->matrices, (size_t) (cb->n_matrices + 1) * sizeof(*list));
	cai_weight *w;

	if (!list)
		return cai_cuda_fail(err, CAI_ERR_NO_MEMORY, "out of memory preparing the weights");
	cb->matrices = list;
	if (src->k % 32 != 0 || src->n_parts < 1 || src->n_parts > CAI_BMATRIX_MAX_PARTS)
		return cai_cuda_fail(err, CAI_ERR_UNSUPPORTED,
					   "the cuda backend cannot multiply a block matrix of %d parts of rows of %d",
					   src->n_parts, src->k);
	if (!(w = calloc(1, sizeof(*w))))
		return cai_cuda_fail(err, CAI_ERR_NO_MEMORY, "out of memory preparing the weights");
	for (int i = 0; i < src->n_parts; i++)
	{
		cai_status	st = upload_block_part(cb, src, i, w, err);

		if (st != CAI_OK)
		{
			free_matrix(cb, w);
			return st;
		}
	}
	cb->matrices[cb->n_matrices++] = w;
	*out = w;
	return CAI_OK;
}

/*
 * prepare_blocks: each part repacked on the host into the kernels' layout (nibbles stay
 * nibbles; 5- and 6-bit levels become bytes; scales become floats) and uploaded.
 */
static cai_status
cuda_prepare_blocks(cai_backend *be, const cai_bmatrix *const *src, int n, const cai_weight **out,
					cai_error *err)
{
	cuda_backend *cb = cb_of(be);

	for (int i = 0; i < n; i++)
	{
		cai_weight *w;
		cai_status	st = make_block_matrix(cb, src[i], &w, err);

		if (st != CAI_OK)
			return st;
		out[i] = w;
	}
	return CAI_OK;
}

static void
cuda_quantize_blocks(cai_backend *be, const float *x, int n_tok, int k, const cai_weight *w,
					 bool superblocks, int8_t *q, float *s, int16_t *sum)
{
	cuda_backend *cb = cb_of(be);
	cai_error	e;

	if (cb->failed || !operand(cb, x, "block quantize input") ||
		!output_ok(cb, q, "block quantize output") || !output_ok(cb, s, "block scales") ||
		!output_ok(cb, sum, "block sums"))
		return;
	be_check(cb, cai_cuda_quantize_blocks(cb->ctx, x, n_tok, k,
										  superblocks && w->act_group > 1 ? w->act_group : 1, q, s,
										  sum, &e), &e);
}

/* Each part's rows in turn, as on the CPU: part i covers rows [row0, row0 + its rows). */
static void
cuda_gemm_blocks(cai_backend *be, const int8_t *xq, const float *xs, const int16_t *xsum,
				 int n_tok, const cai_weight *w, bool superblocks, int n_out, const float *bias,
				 float *out, int ldo, bool accumulate)
{
	cuda_backend *cb = cb_of(be);
	bool		to_host;
	float	   *dst = out;
	int			row0 = 0;
	cai_error	e;

	if (cb->failed || n_tok <= 0 || !operand(cb, xq, "block gemm input") ||
		!operand(cb, xs, "block gemm scales") || !operand(cb, xsum, "block gemm sums"))
		return;
	if (w->n_parts == 0)
	{
		be_recordf(cb, CAI_ERR_INTERNAL, "cuda backend: a block gemm of an int8 matrix");
		return;
	}
	to_host = !is_device_buffer(cb, out);
	if (to_host && !(dst = host_output_begin(cb, out, n_tok, ldo, accumulate)))
		return;
	for (int i = 0; i < w->n_parts && row0 < n_out; i++)
	{
		const cai_cuda_bmatrix *p = &w->parts[i];
		int			rows = n_out - row0 < p->n_out ? n_out - row0 : p->n_out;

		if (!be_check(cb, cai_cuda_gemm_blocks(cb->ctx, xq, xs, xsum, n_tok, p, rows,
											   bias ? bias + row0 : NULL, dst + row0, ldo,
											   accumulate, CAI_CUDA_BLOCKS_AUTO, &e), &e))
			return;
		row0 += p->n_out;
	}
	if (to_host)
		host_output_end(cb, out, n_tok, ldo);
}

/*
 * The device copy of an embedding table: the head's when the model ties them (the same file
 * data), else one made at the first embedding (a plain step: the first of each size is never
 * recorded) and kept.
 */
static const cai_weight *
block_table_for(cuda_backend *cb, const cai_bmatrix *table)
{
	cai_weight *w;
	cai_error	e;

	for (int i = 0; i < cb->n_matrices; i++)
	{
		const cai_weight *m = cb->matrices[i];

		if (m->n_parts == 1 && table->n_parts == 1 && m->src[0] == table->part[0].data &&
			m->parts[0].n_out == table->n_out && m->parts[0].k == table->k)
			return m;
	}
	if (table->n_parts != 1)
	{
		be_recordf(cb, CAI_ERR_UNSUPPORTED,
				   "cuda backend: an embedding table of %d parts", table->n_parts);
		return NULL;
	}
	if (!be_check(cb, make_block_matrix(cb, table, &w, &e), &e))
		return NULL;
	return w;
}

static void
cuda_embed_blocks(cai_backend *be, const cai_bmatrix *table, const int32_t *ids, int n_tok,
				  float *x)
{
	cuda_backend *cb = cb_of(be);
	const cai_weight *t;
	cai_error	e;

	if (cb->failed || !step_inputs(cb, ids, n_tok) || !output_ok(cb, x, "embedding output") ||
		!(t = block_table_for(cb, table)))
		return;
	be_check(cb, cai_cuda_embed_blocks(cb->ctx, &t->parts[0], cb->ids_dev, n_tok, x, &e), &e);
}

/* ---------------------------------------------------------------------------------------------
 * RoPE, SwiGLU
 * ------------------------------------------------------------------------------------------- */

/*
 * The rotary table of these parameters for every position below max_context, built on the host by
 * rope.h's cai_rope_angles, the CPU's own formula (so the same floats), and uploaded once.
 */
static const rope_table *
rope_table_for(cuda_backend *cb, const cai_rope_params *rp)
{
	int			n_pos = cb->params.limits.max_context;
	rope_table *t;
	float	   *host;
	void	   *dev = NULL;
	cai_error	e;

	for (int i = 0; i < cb->n_rope; i++)
	{
		t = &cb->rope[i];
		if (t->n_rot == rp->n_rot && t->base == rp->base && t->freq_scale == rp->freq_scale &&
			t->freq_factors == rp->freq_factors)
			return t;
	}
	if (cb->n_rope == MAX_ROPE_TABLES)
	{
		be_recordf(cb, CAI_ERR_UNSUPPORTED, "cuda backend: more than %d rope configurations",
				   MAX_ROPE_TABLES);
		return NULL;
	}
	host = malloc((size_t) n_pos * rp->n_rot * sizeof(float));
	if (!host)
	{
		be_recordf(cb, CAI_ERR_NO_MEMORY, "out of memory building the rope table");
		return NULL;
	}
	for (int pos = 0; pos < n_pos; pos++)
		cai_rope_angles(rp, pos, host + (size_t) pos * rp->n_rot);
	if (!be_check(cb, cai_cuda_malloc(cb->ctx, (size_t) n_pos * rp->n_rot * sizeof(float),
									  "the rope table", &dev, &e), &e) ||
		!be_check(cb, cai_cuda_upload_sync(cb->ctx, dev, host,
										   (size_t) n_pos * rp->n_rot * sizeof(float), &e), &e))
	{
		cai_cuda_free(cb->ctx, dev);
		free(host);
		return NULL;
	}
	free(host);
	t = &cb->rope[cb->n_rope++];
	t->n_rot = rp->n_rot;
	t->base = rp->base;
	t->freq_scale = rp->freq_scale;
	t->freq_factors = rp->freq_factors;
	t->dev = dev;
	return t;
}

static void
cuda_rope_prepare(cai_backend *be, const cai_rope_params *rp, const int32_t *pos, int n_tok,
				  float *cs)
{
	cuda_backend *cb = cb_of(be);
	const rope_table *t;
	cai_error	e;

	if (cb->failed || n_tok <= 0)
		return;
	for (int i = 0; i < n_tok; i++)
		if (pos[i] < 0 || pos[i] >= cb->params.limits.max_context)
		{
			be_recordf(cb, CAI_ERR_INVALID_ARGUMENT,
					   "cuda backend: position %d is outside the context of %d", pos[i],
					   cb->params.limits.max_context);
			return;
		}
	/* a recorded step's positions were uploaded before the recording began */
	if (!(t = rope_table_for(cb, rp)) || !output_ok(cb, cs, "rope angles") ||
		(cb->graph_mode != CAI_STEP_CAPTURE && !stage_ints(cb, pos, n_tok, cb->pos_dev)))
		return;
	be_check(cb, cai_cuda_rope_gather(cb->ctx, t->dev, cb->params.limits.max_context, rp->n_rot,
									  cb->pos_dev, n_tok, cs, &e), &e);
}

static void
cuda_rope(cai_backend *be, const cai_rope_params *rp, const float *cs, float *x, int ldx,
		  int n_tok, int n_heads, int head_dim, const cai_then_rotate *then)
{
	cuda_backend *cb = cb_of(be);
	cai_error	e;

	if (cb->failed || !operand(cb, cs, "rope angles") || !output_ok(cb, x, "rope input"))
		return;
	be_check(cb, cai_cuda_rope(cb->ctx, cs, x, ldx, n_tok, n_heads, head_dim, rp->n_rot, rp->neox,
							   &e), &e);
	then_rotate(be, then, x, ldx, n_tok);
}

/* The gated FFN's activation (gelu: GeGLU, else SwiGLU) written as floats, then rotated. */
static void
glu_rows(cai_backend *be, bool gelu, const float *gate_up, int n_tok, int d_ff, float *out,
		 const cai_then_rotate *then)
{
	cuda_backend *cb = cb_of(be);
	cai_error	e;

	if (cb->failed || !operand(cb, gate_up, gelu ? "geglu input" : "swiglu input") ||
		!output_ok(cb, out, gelu ? "geglu output" : "swiglu output"))
		return;
	be_check(cb, (gelu ? cai_cuda_geglu : cai_cuda_swiglu)(cb->ctx, gate_up, n_tok, d_ff, out,
															NULL, NULL, &e), &e);
	then_rotate(be, then, out, d_ff, n_tok);
}

static void
cuda_swiglu(cai_backend *be, const float *gate_up, int n_tok, int d_ff, float *out,
			const cai_then_rotate *then)
{
	glu_rows(be, false, gate_up, n_tok, d_ff, out, then);
}

static void
cuda_geglu(cai_backend *be, const float *gate_up, int n_tok, int d_ff, float *out,
		   const cai_then_rotate *then)
{
	glu_rows(be, true, gate_up, n_tok, d_ff, out, then);
}

static void
cuda_scale(cai_backend *be, float *x, int n_tok, int d, float s)
{
	cuda_backend *cb = cb_of(be);
	cai_error	e;

	if (cb->failed || !output_ok(cb, x, "scaled rows"))
		return;
	be_check(cb, cai_cuda_scale(cb->ctx, x, n_tok, d, s, &e), &e);
}

/* ---------------------------------------------------------------------------------------------
 * Rotation
 * ------------------------------------------------------------------------------------------- */

/* The rotation of the int8 path's GEMM inputs, in place, optionally fused with quantization. */
static void
cuda_rotate(cai_backend *be, const cai_rotation *rot, float *x, int ldx, int n_tok, int n_vec,
			int8_t *q, float *s)
{
	cuda_backend *cb = cb_of(be);
	cai_cuda_rotation r;
	cai_error	e;

	if (cb->failed || n_tok <= 0 || n_vec <= 0 || !output_ok(cb, x, "rotation input"))
		return;
	if (q && (!output_ok(cb, q, "rotation output") || !output_ok(cb, s, "rotation scales")))
		return;
	r.n = rot->n;
	r.n_pow2 = rot->n_pow2;
	r.n_mix = rot->n_mix;
	r.norm = rot->norm;
	r.mix_dev = rot->n_mix > 1 ? rot->mix : NULL;
	be_check(cb, cai_cuda_rotate(cb->ctx, &r, x, ldx, n_tok, n_vec, q, s, &e), &e);
}

/* ---------------------------------------------------------------------------------------------
 * KV cache and attention
 * ------------------------------------------------------------------------------------------- */

/* The device mirror of a host KV pool, created on first sight. */
static const kv_mirror *
kv_mirror_for(cuda_backend *cb, const cai_kv_pool *kv)
{
	const cai_kv_layout *L = cb->params.kv_pool_layout(kv);
	int			n_blocks = cb->params.kv_pool_n_blocks(kv);
	kv_mirror  *m = NULL;
	void	   *dev = NULL;
	size_t		bytes;
	cai_error	e;

	for (int i = 0; i < cb->n_kv; i++)
	{
		kv_mirror  *k = &cb->kv[i];

		if (k->host != kv)
			continue;
		if (k->kv.n_blocks == n_blocks && k->kv.block_bytes == L->block_bytes &&
			k->kv.layer_bytes == L->layer_bytes && k->kv.n_kv_heads == L->n_kv_heads &&
			k->kv.head_dim == L->head_dim && k->kv.key_digits == (L->key_digits == 2 ? 2 : 1))
			return k;
		/* a new pool at a freed pool's address: replace the mirror (recorded steps read the old) */
		if (!be_check(cb, cai_cuda_sync(cb->ctx, &e), &e))
			return NULL;
		cai_cuda_graph_reset(cb->ctx);
		cai_cuda_free(cb->ctx, k->kv.pool_dev);
		m = k;
		break;
	}
	if (!m)
	{
		if (cb->n_kv == MAX_KV_MIRRORS)
		{
			be_recordf(cb, CAI_ERR_UNSUPPORTED, "cuda backend: more than %d kv pools",
					   MAX_KV_MIRRORS);
			return NULL;
		}
		m = &cb->kv[cb->n_kv++];
	}
	memset(m, 0, sizeof(*m));
	if (!cai_cuda_attention_supports(L->head_dim))
	{
		be_recordf(cb, CAI_ERR_UNSUPPORTED, "cuda backend: head_dim %d is not supported",
				   L->head_dim);
		return NULL;
	}
	bytes = (size_t) n_blocks * L->block_bytes;
	if (!be_check(cb, cai_cuda_malloc(cb->ctx, bytes, "the kv cache", &dev, &e), &e) ||
		!be_check(cb, cai_cuda_memset(cb->ctx, dev, 0, bytes, &e), &e))
	{
		cai_cuda_free(cb->ctx, dev);
		m->host = NULL;
		return NULL;
	}
	m->host = kv;
	m->kv.pool_dev = dev;
	m->kv.n_blocks = n_blocks;
	m->kv.block_bytes = L->block_bytes;
	m->kv.layer_bytes = L->layer_bytes;
	m->kv.n_kv_heads = L->n_kv_heads;
	m->kv.head_dim = L->head_dim;
	m->kv.key_digits = L->key_digits == 2 ? 2 : 1;
	m->n_kv_layers = L->n_kv_layers;
	return m;
}

/* The device mirror of the float KV shadow, grown (contents kept) to the host's size. */
static const cai_cuda_kv_shadow *
shadow_for(cuda_backend *cb, const cai_kv_shadow *shadow)
{
	size_t		floats;
	void	   *dev = NULL;
	cai_error	e;

	if (!shadow)
		return NULL;
	floats = (size_t) shadow->n_blocks * shadow->block_floats;
	if (floats > cb->shadow_floats || shadow->block_floats != cb->shadow.block_floats)
	{
		if (!be_check(cb, cai_cuda_malloc(cb->ctx, floats * sizeof(float), "the float kv shadow",
										  &dev, &e), &e) ||
			!be_check(cb, cai_cuda_memset(cb->ctx, dev, 0, floats * sizeof(float), &e), &e))
		{
			cai_cuda_free(cb->ctx, dev);
			return NULL;
		}
		if (cb->shadow.data_dev && shadow->block_floats == cb->shadow.block_floats &&
			!be_check(cb, cai_cuda_copy_device(cb->ctx, dev, cb->shadow.data_dev,
											   cb->shadow_floats * sizeof(float), &e), &e))
		{
			cai_cuda_free(cb->ctx, dev);
			return NULL;
		}
		if (!be_check(cb, cai_cuda_sync(cb->ctx, &e), &e))
		{
			cai_cuda_free(cb->ctx, dev);
			return NULL;
		}
		cai_cuda_free(cb->ctx, cb->shadow.data_dev);
		cb->shadow.data_dev = dev;
		cb->shadow_floats = floats;
	}
	cb->shadow.n_blocks = shadow->n_blocks;
	cb->shadow.layer_floats = shadow->layer_floats;
	cb->shadow.block_floats = shadow->block_floats;
	return &cb->shadow;
}

/*
 * The step plan for this batch: built at the first KV operation of a forward (embed marks the
 * plan stale), or again if the batch's shape differs from the planned one.
 */
static bool
plan_for(cuda_backend *cb, const cai_attn_params *ap, const cai_batch_layout *batch,
		 bool for_graph)
{
	cai_cuda_seq_desc *descs;
	bool		same = !cb->plan_stale && cb->meta && batch->n_tokens == cb->plan_n_tokens &&
		batch->n_seqs == cb->plan_n_seqs && for_graph == cb->plan_for_graph;
	cai_error	e;
	cai_status	st;

	if (batch->n_seqs > cb->params.limits.max_tokens ||
		batch->n_tokens > cb->params.limits.max_tokens)
	{
		be_recordf(cb, CAI_ERR_INVALID_ARGUMENT, "cuda backend: the batch exceeds its limits");
		return false;
	}
	for (int s = 0; same && s < batch->n_seqs; s++)
	{
		int32_t    *k = cb->plan_key + 4 * s;

		same = k[0] == batch->seq_start[s] && k[1] == batch->seq_len[s] &&
			k[2] == batch->token_pos[batch->seq_start[s]] &&
			k[3] == (int32_t) (uintptr_t) batch->block_tables[s];
	}
	if (same && cb->meta->group == ap->n_heads / ap->n_kv_heads)
		return true;

	descs = malloc((size_t) (batch->n_seqs > 0 ? batch->n_seqs : 1) * sizeof(cai_cuda_seq_desc));
	if (!descs)
	{
		be_recordf(cb, CAI_ERR_NO_MEMORY, "out of memory planning a step");
		return false;
	}
	for (int s = 0; s < batch->n_seqs; s++)
	{
		int			start = batch->seq_start[s];

		if (start != (s == 0 ? 0 : batch->seq_start[s - 1] + batch->seq_len[s - 1]))
		{
			free(descs);
			be_recordf(cb, CAI_ERR_INVALID_ARGUMENT,
					   "cuda backend: sequence rows must follow each other in order");
			return false;
		}
		descs[s].n_new = batch->seq_len[s];
		descs[s].pos = batch->token_pos[start];
		descs[s].block_table = batch->block_tables[s];
		descs[s].n_blocks = (descs[s].pos + descs[s].n_new + CAI_KV_BLOCK_TOKENS - 1) /
			CAI_KV_BLOCK_TOKENS;
	}
	st = cai_cuda_step_plan(cb->ctx, descs, batch->n_seqs, NULL, batch->n_tokens, ap->n_heads,
							ap->n_kv_heads, ap->head_dim, for_graph, &cb->meta, &e);
	free(descs);
	if (!be_check(cb, st, &e))
		return false;
	for (int s = 0; s < batch->n_seqs; s++)
	{
		int32_t    *k = cb->plan_key + 4 * s;

		k[0] = batch->seq_start[s];
		k[1] = batch->seq_len[s];
		k[2] = batch->token_pos[batch->seq_start[s]];
		k[3] = (int32_t) (uintptr_t) batch->block_tables[s];
	}
	cb->plan_n_tokens = batch->n_tokens;
	cb->plan_n_seqs = batch->n_seqs;
	cb->plan_for_graph = for_graph;
	cb->plan_stale = false;
	return true;
}

static void
cuda_kv_write(cai_backend *be, const cai_attn_params *ap, const cai_batch_layout *batch,
			  const float *k, const float *v, int ld, cai_kv_pool *kv,
			  const cai_kv_shadow *shadow)
{
	cuda_backend *cb = cb_of(be);
	const kv_mirror *m;
	const cai_cuda_kv_shadow *sh = NULL;
	cai_error	e;

	if (cb->failed || batch->n_tokens <= 0)
		return;
	if (!(m = kv_mirror_for(cb, kv)) ||
		!plan_for(cb, ap, batch, cb->graph_mode == CAI_STEP_CAPTURE) ||
		!operand(cb, k, "keys") || !operand(cb, v, "values"))
		return;
	if (shadow && !(sh = shadow_for(cb, shadow)))
		return;
	be_check(cb, cai_cuda_kv_write(cb->ctx, &m->kv, ap->kv_layer, cb->meta, k, v, ld, sh, &e), &e);
}

/*
 * The KV lives in the device mirror (block ids as on the host), so a cached tail's rows are
 * copied there, on the compute stream: ordered after the writes that made them and before the
 * forward that attends over the copy.  Each layer part keeps the host layout: keys, values,
 * their scales, then (two-digit keys) the keys' second digits, each [16][...], so the first
 * n_rows of each region are contiguous.
 */
static void
cuda_kv_copy_rows(cai_backend *be, cai_kv_pool *kv, int32_t src, int32_t dst, int n_rows)
{
	cuda_backend *cb = cb_of(be);
	const kv_mirror *m;
	size_t		row_bytes;
	size_t		scale_bytes;
	size_t		offset[5];
	size_t		bytes[5];
	int			regions;
	cai_error	e;

	if (cb->failed || src == dst || n_rows <= 0)
		return;
	if (!(m = kv_mirror_for(cb, kv)))
		return;
	if (n_rows > CAI_KV_BLOCK_TOKENS)
		n_rows = CAI_KV_BLOCK_TOKENS;
	row_bytes = (size_t) m->kv.n_kv_heads * m->kv.head_dim;
	scale_bytes = (size_t) m->kv.n_kv_heads * sizeof(float);
	offset[0] = 0;
	offset[1] = CAI_KV_BLOCK_TOKENS * row_bytes;
	offset[2] = 2 * CAI_KV_BLOCK_TOKENS * row_bytes;
	offset[3] = offset[2] + CAI_KV_BLOCK_TOKENS * scale_bytes;
	offset[4] = offset[3] + CAI_KV_BLOCK_TOKENS * scale_bytes;	/* two-digit keys' k2 plane */
	bytes[0] = bytes[1] = bytes[4] = (size_t) n_rows * row_bytes;
	bytes[2] = bytes[3] = (size_t) n_rows * scale_bytes;
	regions = m->kv.key_digits == 2 ? 5 : 4;
	for (size_t part = 0; part + m->kv.layer_bytes <= m->kv.block_bytes; part += m->kv.layer_bytes)
	{
		uint8_t    *from = m->kv.pool_dev + (size_t) src * m->kv.block_bytes + part;
		uint8_t    *to = m->kv.pool_dev + (size_t) dst * m->kv.block_bytes + part;

		for (int r = 0; r < regions; r++)
			if (!be_check(cb, cai_cuda_copy_device(cb->ctx, to + offset[r], from + offset[r],
												   bytes[r], &e), &e))
				return;
	}
}

static void
cuda_attention(cai_backend *be, const cai_attn_params *ap, const cai_batch_layout *batch,
			   const float *q, int ldq, cai_kv_pool *kv, const cai_kv_shadow *shadow, float *out,
			   int ldo)
{
	cuda_backend *cb = cb_of(be);
	const kv_mirror *m;
	const cai_cuda_kv_shadow *sh = NULL;
	cai_error	e;

	if (cb->failed || batch->n_tokens <= 0)
		return;
	if (!(m = kv_mirror_for(cb, kv)) ||
		!plan_for(cb, ap, batch, cb->graph_mode == CAI_STEP_CAPTURE) ||
		!operand(cb, q, "queries") || !output_ok(cb, out, "attention output"))
		return;
	if (shadow && !(sh = shadow_for(cb, shadow)))
		return;
	be_check(cb, cai_cuda_attention(cb->ctx, &m->kv, ap->kv_layer, cb->meta, q, ldq, out, ldo,
									ap->n_heads, ap->window, cai_attn_score_scale(ap), sh, &e), &e);
}

/* ---------------------------------------------------------------------------------------------
 * The instance
 * ------------------------------------------------------------------------------------------- */

static void
cuda_destroy(cai_backend *be)
{
	cuda_backend *cb;

	if (!be)
		return;
	cb = cb_of(be);
	if (cb)
	{
		if (cb->ctx)
		{
			cai_error	e;

			cai_cuda_sync(cb->ctx, &e);
			for (int i = 0; i < cb->n_weights; i++)
				cai_cuda_free(cb->ctx, cb->weights[i].dev);
			for (int i = 0; i < cb->n_matrices; i++)
				free_matrix(cb, cb->matrices[i]);
			for (int i = 0; i < cb->n_buffers; i++)
				cai_cuda_free(cb->ctx, cb->buffers[i].ptr);
			for (int i = 0; i < cb->n_kv; i++)
				cai_cuda_free(cb->ctx, cb->kv[i].kv.pool_dev);
			for (int i = 0; i < cb->n_rope; i++)
				cai_cuda_free(cb->ctx, cb->rope[i].dev);
			cai_cuda_free(cb->ctx, cb->shadow.data_dev);
			cai_cuda_free(cb->ctx, cb->ids_dev);
			cai_cuda_free(cb->ctx, cb->pos_dev);
			cai_cuda_free(cb->ctx, cb->rows_dev);
			cai_cuda_free(cb->ctx, cb->hostout_dev);
			cai_cuda_host_free(cb->ctx, cb->staging_host);
			cai_cuda_ctx_free(cb->ctx);
		}
		free(cb->weights);
		free(cb->matrices);
		free(cb->buffers);
		free(cb->plan_key);
		free(cb->row_ids);
		free(cb);
	}
	free(be);
}

static uint64_t
cuda_gemm_fallbacks(const cai_backend *be)
{
	return cai_cuda_gemm_fallback_count(((const cuda_backend *) be->impl)->ctx);
}

/* The forward's closing call (backend.h's sync): waits, and reports the first failure. */
static cai_status
cuda_sync_op(cai_backend *be, cai_error *err)
{
	cb_of(be)->graph_mode = CAI_STEP_PLAIN;
	return cai_cuda_backend_status(be, err);
}

/* ---------------------------------------------------------------------------------------------
 * Decode steps as CUDA graphs
 * ------------------------------------------------------------------------------------------- */

/* Forgets every recorded step (another forward context or KV pool: other buffers). */
static void
graphs_forget(cuda_backend *cb, const void *owner, const cai_kv_pool *kv)
{
	cai_cuda_graph_reset(cb->ctx);
	memset(cb->graph_warm, 0, sizeof(cb->graph_warm));
	memset(cb->graph_refused, 0, sizeof(cb->graph_refused));
	cb->graph_owner = owner;
	cb->graph_kv = kv;
}

/*
 * backend.h's step_graph_begin.  The step's inputs go up first, outside any recording: the token
 * ids, the positions, the rows that want logits (all of them) and a step plan made for a graph,
 * with the split attention's scratch reserved for it.  Then the graph of this batch size
 * replays, if one covers the plan; or the operations that follow are recorded; or, the first
 * time a size comes, they run plainly and size every buffer a recording will need.
 */
static cai_step_graph
cuda_step_graph_begin(cai_backend *be, const void *owner, const cai_kv_pool *kv,
					  const cai_batch_layout *batch, const int32_t *ids, float *logits,
					  int n_vocab)
{
	cuda_backend *cb = cb_of(be);
	const cai_config *c = &cb->params.model->cfg;
	cai_attn_params ap = {0};
	int			T = batch->n_tokens;
	size_t		floats = (size_t) T * n_vocab;
	cai_error	e;

	if (cb->failed || !cb->graphs_enabled || T < 1 || T > CUDA_GRAPH_MAX_TOKENS ||
		T > cb->params.limits.max_tokens)
		return CAI_STEP_PLAIN;
	if (owner != cb->graph_owner || kv != cb->graph_kv)
		graphs_forget(cb, owner, kv);
	if (cb->graph_refused[T])
		return CAI_STEP_PLAIN;
	if (!cb->graph_warm[T])
	{
		cb->graph_warm[T] = true;
		return CAI_STEP_PLAIN;
	}
	for (int i = 0; i < T; i++)
		if (batch->token_pos[i] < 0 || batch->token_pos[i] >= cb->params.limits.max_context)
			return CAI_STEP_PLAIN;	/* the operations report it */
	if (floats > cb->hostout_floats || cb->n_kv == 0)
		return CAI_STEP_PLAIN;		/* a plain step allocates them */

	ap.n_heads = c->n_heads;
	ap.n_kv_heads = c->n_kv_heads;
	ap.head_dim = c->head_dim;
	if (!stage_begin_forward(cb) || !stage_ints(cb, ids, T, cb->ids_dev) ||
		!stage_ints(cb, batch->token_pos, T, cb->pos_dev) ||
		!stage_ints(cb, cb->row_ids, T, cb->rows_dev) || !plan_for(cb, &ap, batch, true) ||
		!be_check(cb, cai_cuda_attention_reserve(cb->ctx, cb->meta, c->n_kv_heads, c->head_dim,
												 &e), &e))
		return CAI_STEP_PLAIN;	/* the operations meet the failure and skip; sync reports it */

	cb->graph_key = T;
	cb->graph_logits = logits;
	cb->graph_logit_floats = floats;
	if (cai_cuda_graph_has(cb->ctx, T))
	{
		if (!be_check(cb, cai_cuda_graph_launch(cb->ctx, T, &e), &e) ||
			!be_check(cb, cai_cuda_download(cb->ctx, logits, cb->hostout_dev,
											floats * sizeof(float), &e), &e))
			return CAI_STEP_PLAIN;
		cb->graph_replays++;
		cb->graph_mode = CAI_STEP_REPLAYED;
		return CAI_STEP_REPLAYED;
	}
	if (cai_cuda_graph_begin(cb->ctx, &e) != CAI_OK)
		return CAI_STEP_PLAIN;
	cb->graph_mode = CAI_STEP_CAPTURE;
	return CAI_STEP_CAPTURE;
}

/*
 * backend.h's step_graph_end: the recording made into this size's graph and run, and the
 * logits on their way down.  A recording that failed (an operation refused inside it) is
 * abandoned with its error, and this size is not recorded again: false, the step runs plainly.
 */
static bool
cuda_step_graph_end(cai_backend *be)
{
	cuda_backend *cb = cb_of(be);
	int			T = cb->graph_key;
	cai_error	e;

	if (cb->graph_mode != CAI_STEP_CAPTURE)
		return true;
	cb->graph_mode = CAI_STEP_PLAIN;
	if (cb->failed || cai_cuda_graph_end(cb->ctx, T, &e) != CAI_OK ||
		cai_cuda_graph_launch(cb->ctx, T, &e) != CAI_OK)
	{
		cai_cuda_graph_abort(cb->ctx);
		cb->failed = false;
		cb->graph_refused[T] = true;
		return false;
	}
	cb->graph_captures++;
	be_check(cb, cai_cuda_download(cb->ctx, cb->graph_logits, cb->hostout_dev,
								   cb->graph_logit_floats * sizeof(float), &e), &e);
	return true;
}

void
cai_cuda_backend_graph_counts(const cai_backend *be, uint64_t *captures, uint64_t *replays)
{
	const cuda_backend *cb = be->impl;

	*captures = cb->graph_captures;
	*replays = cb->graph_replays;
}

static const cai_backend_ops cuda_ops = {
	.name = "cuda",
	.destroy = cuda_destroy,
	.sync = cuda_sync_op,
	.alloc = cuda_alloc,
	.free = cuda_free_buffer,
	.prepare_i8 = cuda_prepare_i8,
	.weight_data = cuda_weight_data,
	.embed_i8 = cuda_embed_i8,
	.embed_i8_add = cuda_embed_i8_add,
	.embed_f32 = cuda_embed_f32,
	.gather_rows = cuda_gather_rows,
	.rmsnorm = cuda_rmsnorm,
	.head_rmsnorm = cuda_head_rmsnorm,
	.quantize = cuda_quantize,
	.quantize_second_digit = cuda_quantize_second_digit,
	.gemm_i8 = cuda_gemm_i8,
	.gemm_f32 = cuda_gemm_f32,
	.prepare_blocks = cuda_prepare_blocks,
	.quantize_blocks = cuda_quantize_blocks,
	.gemm_blocks = cuda_gemm_blocks,
	.embed_blocks = cuda_embed_blocks,
	.rope_prepare = cuda_rope_prepare,
	.rope = cuda_rope,
	.swiglu = cuda_swiglu,
	.geglu = cuda_geglu,
	.rmsnorm_add = cuda_rmsnorm_add,
	.scale = cuda_scale,
	.kv_write = cuda_kv_write,
	.kv_copy_rows = cuda_kv_copy_rows,
	.two_digit_keys = true,
	.attention = cuda_attention,
	.rotate = cuda_rotate,
	.gemm_fallbacks = cuda_gemm_fallbacks,
	.step_graph_begin = cuda_step_graph_begin,
	.step_graph_end = cuda_step_graph_end,
};

cai_status
cai_cuda_backend_create(const cai_cuda_backend_params *params, cai_backend **out, cai_error *err)
{
	const cai_backend_limits *lim = &params->limits;
	cai_backend *be;
	cuda_backend *cb;
	size_t		max_tok;
	cai_status	st;
	char		why[256];
	int			n_dev;

	*out = NULL;
	if (!params->model || !params->kv_pool_layout || !params->kv_pool_n_blocks ||
		lim->max_tokens <= 0 || lim->max_context <= 0 || lim->n_heads <= 0 ||
		lim->n_kv_heads <= 0 || lim->n_heads % lim->n_kv_heads != 0)
		return cai_cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "invalid cuda backend parameters");
	if (!cai_cuda_attention_supports(lim->head_dim))
		return cai_cuda_fail(err, CAI_ERR_UNSUPPORTED,
					   "the cuda backend supports head_dim 64, 128 and 256, not %d",
					   lim->head_dim);
	n_dev = cai_cuda_device_count(why, sizeof(why));
	if (n_dev <= 0)
		return cai_cuda_fail(err, CAI_ERR_UNSUPPORTED, "no cuda device: %s", why);

	be = calloc(1, sizeof(*be));
	cb = calloc(1, sizeof(*cb));
	if (!be || !cb)
	{
		free(be);
		free(cb);
		return cai_cuda_fail(err, CAI_ERR_NO_MEMORY, "out of memory creating the cuda backend");
	}
	be->ops = &cuda_ops;
	be->impl = cb;
	cb->params = *params;
	max_tok = (size_t) lim->max_tokens;

	if ((st = cai_cuda_ctx_create(params->device, &cb->ctx, err)) != CAI_OK)
		goto fail;
	cb->plan_key = malloc(4 * max_tok * sizeof(int32_t));
	cb->row_ids = malloc(max_tok * sizeof(int32_t));
	if (!cb->plan_key || !cb->row_ids)
	{
		st = cai_cuda_fail(err, CAI_ERR_NO_MEMORY, "out of memory creating the cuda backend");
		goto fail;
	}
	if ((st = cai_cuda_malloc(cb->ctx, max_tok * sizeof(int32_t), "token ids",
							  (void **) &cb->ids_dev, err)) != CAI_OK ||
		(st = cai_cuda_malloc(cb->ctx, max_tok * sizeof(int32_t), "positions",
							  (void **) &cb->pos_dev, err)) != CAI_OK ||
		(st = cai_cuda_malloc(cb->ctx, max_tok * sizeof(int32_t), "row indexes",
							  (void **) &cb->rows_dev, err)) != CAI_OK ||
		(st = cai_cuda_host_alloc(cb->ctx, 3 * max_tok * sizeof(int32_t), "index staging",
								  (void **) &cb->staging_host, err)) != CAI_OK)
		goto fail;
	/* plan buffers for the largest step, so that steps never allocate */
	if ((st = cai_cuda_step_reserve(cb->ctx, lim->max_tokens, lim->max_tokens,
									(lim->max_context + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS,
									lim->n_heads, lim->n_kv_heads, lim->head_dim, err)) != CAI_OK)
		goto fail;
	for (size_t i = 0; i < max_tok; i++)
		cb->row_ids[i] = (int32_t) i;
	{
		const char *g = getenv("CAI_CUDA_GRAPHS");

		cb->graphs_enabled = !(g && strcmp(g, "0") == 0);
	}
	/* the weights come when a forward context prepares them (prepare_i8, weight_data) */
	cai_cuda_get_device_info(cb->ctx, &cb->info);
	*out = be;
	return CAI_OK;

fail:
	cuda_destroy(be);
	return st;
}

cai_status
cai_cuda_backend_status(cai_backend *be, cai_error *err)
{
	cuda_backend *cb = cb_of(be);
	cai_error	e;

	if (!cb->failed && cai_cuda_sync(cb->ctx, &e) != CAI_OK)
		be_record(cb, &e);
	if (!cb->failed)
		return CAI_OK;
	cb->failed = false;
	if (err)
		*err = cb->error;
	return cb->error.status;
}

const char *
cai_cuda_backend_device(const cai_backend *be)
{
	cuda_backend *cb = be->impl;
	const cai_cuda_device_info *info = &cb->info;

	/* formatted when asked: the weights arrive after creation */
	snprintf(cb->device_desc, sizeof(cb->device_desc),
			 "cuda (%s, cc %d.%d, %d SMs, %.1f GiB; %.0f MiB of weights)", info->name,
			 info->cc_major, info->cc_minor, info->sm_count, info->total_bytes / 1073741824.0,
			 cb->weight_bytes / 1048576.0);
	return cb->device_desc;
}
