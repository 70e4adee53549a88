/*
 * model_wcache.c — a model's weights cache (model_wcache.h): which file, mapped or not, and the
 * int8 path's own tables and vectors in it.
 *
 * Besides the GEMM matrices (the backend's sections), the int8 path's conversion makes the
 * embedding's int8 rows (and their second digits), and the norm weights and biases with the
 * smoothing folded in; the file holds those first, in a fixed order, so that a mapped model
 * runs without calibrating.  The file path converts nothing of its own: only the backend's
 * repacked matrices are in its files.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_internal.h"
#include "model_wcache.h"
#include "safe_file.h"
#include "util.h"

#define TAG(a, b, c, d) ((uint32_t) (a) | (uint32_t) (b) << 8 | (uint32_t) (c) << 16 | (uint32_t) (d) << 24)
#define TAG_EMBD_Q TAG('E', 'M', 'q', ' ')
#define TAG_EMBD_SCALE TAG('E', 'M', 's', 'c')
#define TAG_EMBD2_Q TAG('E', '2', 'q', ' ')
#define TAG_EMBD2_SCALE TAG('E', '2', 's', 'c')
#define TAG_VECTOR TAG('V', 'E', 'C', 'f')

cai_status
cai_model_wcache_open(cai_model *m, const char *model_path, const cai_model_params *params,
					  bool file, cai_error *err)
{
	struct cai_model_wcache *c;
	cai_wcache_key_params kp;
	cai_error	why;
	double		start = cai_now_seconds();
	struct stat dir_st;
	cai_status	st;

	if (!params->weights_cache || !params->weights_cache[0] || params->load_float_reference)
		return CAI_OK;
	c = calloc(1, sizeof(*c));
	if (!c || !(c->dir = strdup(params->weights_cache)) || !(c->model_path = strdup(model_path)))
	{
		if (c)
			free(c->dir);
		free(c);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory opening the weights cache");
	}
	m->wcache = c;
	c->state = CAI_WEIGHTS_CACHE_PENDING;
	memset(&kp, 0, sizeof(kp));
	kp.model_hash = m->content_hash;
	kp.model_bytes = m->gguf->size;
	kp.file_weights = file;
	kp.gptq_rounding = !file && (params->rounding == CAI_ROUNDING_GPTQ);
	kp.two_digit_activations = (params->activations == CAI_ACTIVATIONS_TWO_DIGIT);
	kp.backend = "cpu";
	kp.backend_layout = cai_backend_cpu_weights_layout();
	c->key = cai_wcache_key(&kp);
	if (!cai_wcache_path(c->dir, model_path, c->key, c->path, sizeof(c->path)))
	{
		c->state = CAI_WEIGHTS_CACHE_FAILED;
		snprintf(c->failure, sizeof(c->failure), "the cache directory's path is too long");
		return CAI_OK;
	}
	/*
	 * A directory that anyone but the server's user can write is not used at all: another user
	 * could plant a file of their choosing (the checksum is no signature) or a link there.  One
	 * that does not exist yet is made, safe, by the writer.
	 */
	if (lstat(c->dir, &dir_st) == 0 && cai_safe_dir_check(c->dir, &why) != CAI_OK)
	{
		c->state = CAI_WEIGHTS_CACHE_FAILED;
		snprintf(c->failure, sizeof(c->failure), "%s", why.message);
		return CAI_OK;
	}
	st = cai_wcache_map_open(c->path, c->key, &c->map, &why);
	if (st == CAI_OK)
	{
		c->state = CAI_WEIGHTS_CACHE_MAPPED;
		c->file_bytes = c->map.size;
		c->seconds = cai_now_seconds() - start;
		/* the bound holds at a start that writes nothing too (a crashed writer's file goes) */
		cai_wcache_remove_stale(c->dir, model_path, c->path);
	}
	else if (st != CAI_ERR_NOT_FOUND)
	{
		/* never trusted: it is rewritten (the writer renames over it) */
		snprintf(c->refused, sizeof(c->refused), "%s", why.message);
	}
	return CAI_OK;
}

/* The next section as an array of exactly bytes bytes. */
static const void *
take(const cai_wcache_view *v, uint32_t *cursor, uint32_t tag, size_t bytes, cai_error *err)
{
	const void *data = NULL;
	size_t		got = 0;

	if (cai_wcache_next(v, cursor, tag, &data, &got, err) != CAI_OK)
		return NULL;
	if (got != bytes)
	{
		cai_fail(err, CAI_ERR_FORMAT, "weights cache section %u holds %zu bytes, expected %zu",
				 *cursor - 1, got, bytes);
		return NULL;
	}
	return data;
}

/* Drops a mapped file that did not fit: the caller converts, and the file is rewritten. */
static bool
refuse_mapped(struct cai_model_wcache *c, const cai_error *why)
{
	cai_wcache_map_close(&c->map);
	c->state = CAI_WEIGHTS_CACHE_PENDING;
	c->file_bytes = 0;
	snprintf(c->refused, sizeof(c->refused), "%s", why->message);
	return false;
}

bool
cai_model_wcache_take_int8(cai_model *m)
{
	struct cai_model_wcache *c = m->wcache;
	const cai_config *cf = &m->cfg;
	const cai_wcache_view *v = &c->map.view;
	const size_t vocab = (size_t) cf->n_vocab;
	const size_t d = (size_t) cf->d_model;
	const size_t qkv = (size_t) (cf->n_heads + 2 * cf->n_kv_heads) * cf->head_dim;
	uint32_t	cursor = 0;
	cai_error	why;
	const void *q,
			   *s;

	/* the embedding's rows, and their second digits with two-digit activations */
	if (!(q = take(v, &cursor, TAG_EMBD_Q, vocab * d, &why)) ||
		!(s = take(v, &cursor, TAG_EMBD_SCALE, vocab * sizeof(float), &why)))
		return refuse_mapped(c, &why);
	m->tok_embd = (cai_qmatrix) {.n_out = cf->n_vocab, .k = cf->d_model, .q = q, .scale = s};
	if (m->two_digit_activations)
	{
		if (!(q = take(v, &cursor, TAG_EMBD2_Q, vocab * d, &why)) ||
			!(s = take(v, &cursor, TAG_EMBD2_SCALE, vocab * sizeof(float), &why)))
			return refuse_mapped(c, &why);
		m->tok_embd_second_digit = (cai_qmatrix) {.n_out = cf->n_vocab, .k = cf->d_model,
		.q = q, .scale = s};
	}
	/* read only: the model never writes its vectors after the load */
	if (!(m->out_norm_i8 = (float *) take(v, &cursor, TAG_VECTOR, d * sizeof(float), &why)))
		return refuse_mapped(c, &why);
	for (int l = 0; l < cf->n_layers; l++)
	{
		cai_layer_weights *w = &m->layers[l];

		if (!(w->attn_norm_i8 = (float *) take(v, &cursor, TAG_VECTOR, d * sizeof(float), &why)) ||
			!(w->ffn_norm_i8 = (float *) take(v, &cursor, TAG_VECTOR, d * sizeof(float), &why)) ||
			(cf->qkv_bias &&
			 !(w->bqkv_i8 = (float *) take(v, &cursor, TAG_VECTOR, qkv * sizeof(float), &why))))
			return refuse_mapped(c, &why);
	}
	c->cursor = cursor;
	return true;
}

cai_status
cai_model_wcache_write_model(const cai_model *m, cai_wcache_writer *w, cai_error *err)
{
	const cai_config *cf = &m->cfg;
	const size_t vocab = (size_t) cf->n_vocab;
	const size_t d = (size_t) cf->d_model;
	const size_t qkv = (size_t) (cf->n_heads + 2 * cf->n_kv_heads) * cf->head_dim;
	cai_status	st;

	if (m->file_weights)
		return CAI_OK;
	if ((st = cai_wcache_add(w, TAG_EMBD_Q, m->tok_embd.q, vocab * d, err)) != CAI_OK ||
		(st = cai_wcache_add(w, TAG_EMBD_SCALE, m->tok_embd.scale, vocab * sizeof(float), err)) != CAI_OK)
		return st;
	if (m->two_digit_activations &&
		((st = cai_wcache_add(w, TAG_EMBD2_Q, m->tok_embd_second_digit.q, vocab * d, err)) != CAI_OK ||
		 (st = cai_wcache_add(w, TAG_EMBD2_SCALE, m->tok_embd_second_digit.scale,
							  vocab * sizeof(float), err)) != CAI_OK))
		return st;
	if ((st = cai_wcache_add(w, TAG_VECTOR, m->out_norm_i8, d * sizeof(float), err)) != CAI_OK)
		return st;
	for (int l = 0; l < cf->n_layers; l++)
	{
		const cai_layer_weights *lw = &m->layers[l];

		if ((st = cai_wcache_add(w, TAG_VECTOR, lw->attn_norm_i8, d * sizeof(float), err)) != CAI_OK ||
			(st = cai_wcache_add(w, TAG_VECTOR, lw->ffn_norm_i8, d * sizeof(float), err)) != CAI_OK ||
			(cf->qkv_bias &&
			 (st = cai_wcache_add(w, TAG_VECTOR, lw->bqkv_i8, qkv * sizeof(float), err)) != CAI_OK))
			return st;
	}
	return CAI_OK;
}

void
cai_model_wcache_free(cai_model *m)
{
	struct cai_model_wcache *c = m->wcache;

	if (!c)
		return;
	cai_model_wcache_join(m, NULL);
	free(c->writing);
	cai_wcache_map_close(&c->map);
	free(c->dir);
	free(c->model_path);
	free(c);
	m->wcache = NULL;
}

void
cai_model_weights_cache_report(const cai_model *model, cai_weights_cache_report *out)
{
	const struct cai_model_wcache *c = model->wcache;

	memset(out, 0, sizeof(*out));
	out->path = out->refused = out->failure = "";
	if (!c)
		return;
	out->state = cai_model_wcache_state(c);
	out->path = c->path;
	out->refused = c->refused;
	out->failure = c->failure;
	out->seconds = c->seconds;
	out->file_bytes = c->file_bytes;
}

cai_status
cai_model_wcache_import(const cai_model *m, cai_backend *be, const cai_qmatrix *const *i8,
						const cai_bmatrix *const *blocks, int n, const cai_weight **out,
						bool *imported, cai_error *err)
{
	struct cai_model_wcache *c = m->wcache;
	uint32_t	cursor = c->cursor;
	double		start = cai_now_seconds();
	cai_error	why;

	*imported = false;
	if (!be->ops->import_weights)
	{
		/* the int8 path's matrices are only in the file: this backend cannot run the model */
		if (!m->file_weights)
			return cai_fail(err, CAI_ERR_UNSUPPORTED,
							"the %s backend cannot use the weights mapped from cache \"%s\"; "
							"load the model without a weights cache for it", be->ops->name, c->path);
		return CAI_OK;
	}
	if (be->ops->import_weights(be, &c->map.view, &cursor, i8, blocks, n, out, &why) == CAI_OK)
	{
		c->seconds += cai_now_seconds() - start;
		*imported = true;
		return CAI_OK;
	}
	/*
	 * A file that passed its key and checksum but does not fit is a bug's, never used: removed,
	 * so that the next start converts and writes it again
	 */
	(void) unlink(c->path);
	if (!m->file_weights)
		return cai_fail(err, CAI_ERR_FORMAT, "weights cache \"%s\" refused (removed): %s", c->path,
						why.message);
	refuse_mapped(c, &why);
	return CAI_OK;
}

/* What the writer thread needs: the model's cache, the backend and the weights to export. */
struct cai_model_wcache_writing
{
	pthread_t	thread;
	bool		threaded;		/* thread was started (else the file was written in place) */
	const cai_model *m;
	cai_backend *be;
	const cai_weight **w;		/* a copy of the caller's array */
	int			n;
};

/* Ends the writer's work: the reason kept before the state says FAILED. */
static void
store_failed(struct cai_model_wcache *c, const char *why)
{
	snprintf(c->failure, sizeof(c->failure), "%s", why);
	__atomic_store_n(&c->state, CAI_WEIGHTS_CACHE_FAILED, __ATOMIC_RELEASE);
}

/* Writes the file (the writer thread's body, or the caller's without one). */
static void
write_file(struct cai_model_wcache_writing *job)
{
	const cai_model *m = job->m;
	struct cai_model_wcache *c = m->wcache;
	cai_backend *be = job->be;
	cai_wcache_writer *writer = NULL;
	struct stat st;
	cai_error	why;

	if (!be->ops->export_weights)
	{
		snprintf(why.message, sizeof(why.message), "the %s backend cannot export its weights",
				 be->ops->name);
		store_failed(c, why.message);
		return;
	}
	if (cai_wcache_make_dir(c->dir, &why) != CAI_OK ||
		cai_wcache_writer_open(c->path, c->key, &writer, &why) != CAI_OK ||
		cai_model_wcache_write_model(m, writer, &why) != CAI_OK ||
		be->ops->export_weights(be, job->w, job->n, writer, &why) != CAI_OK)
	{
		cai_wcache_writer_abort(writer);
		store_failed(c, why.message);
		return;
	}
	if (cai_wcache_writer_commit(writer, &why) != CAI_OK)
	{
		store_failed(c, why.message);
		return;
	}
	c->file_bytes = stat(c->path, &st) == 0 ? (size_t) st.st_size : 0;
	/* the bound: one file per model name, the one just written */
	cai_wcache_remove_stale(c->dir, c->model_path, c->path);
	__atomic_store_n(&c->state, CAI_WEIGHTS_CACHE_WRITTEN, __ATOMIC_RELEASE);
}

static void *
writer_main(void *arg)
{
	write_file(arg);
	return NULL;
}

void
cai_model_wcache_store(const cai_model *m, cai_backend *be, const cai_weight *const *w, int n,
					   double prepare_seconds)
{
	struct cai_model_wcache *c = m->wcache;
	struct cai_model_wcache_writing *job;

	if (c->writing)
		return;
	c->seconds += prepare_seconds;
	job = calloc(1, sizeof(*job));
	if (!job || !(job->w = malloc((size_t) (n > 0 ? n : 1) * sizeof(*job->w))))
	{
		free(job);
		store_failed(c, "out of memory writing the weights cache");
		return;
	}
	memcpy(job->w, w, (size_t) n * sizeof(*w));
	job->m = m;
	job->be = be;
	job->n = n;
	c->writing = job;
	job->threaded = pthread_create(&job->thread, NULL, writer_main, job) == 0;
	if (!job->threaded)
		write_file(job);
}

void
cai_model_wcache_join(const cai_model *m, const cai_backend *be)
{
	struct cai_model_wcache *c = m->wcache;
	struct cai_model_wcache_writing *job = c ? c->writing : NULL;

	if (!job || (be && job->be != be) || !job->be)
		return;
	if (job->threaded)
		(void) pthread_join(job->thread, NULL);
	job->threaded = false;
	/* done: the backend may go; a later context finds the file written (or why not) */
	job->be = NULL;
	free(job->w);
	job->w = NULL;
}
