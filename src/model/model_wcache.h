/*
 * model_wcache.h — a model's use of the weights cache (weight_cache.h): the model load maps a
 * valid file instead of converting, and the first forward context on the CPU writes one when
 * there was none (model_load.c, forward_weights.c).  Not part of the engine's interface.
 */
#ifndef CAI_MODEL_WCACHE_H
#define CAI_MODEL_WCACHE_H

#include <pthread.h>
#include <stdbool.h>

#include "model.h"
#include "weight_cache.h"

struct cai_model_wcache_writing;

struct cai_model_wcache
{
	/* read and written atomically: the writer thread ends PENDING (WRITTEN or FAILED) */
	cai_weights_cache_state state;
	char	   *dir;
	char	   *model_path;
	char		path[4096];
	uint64_t	key;
	cai_wcache_map map;			/* MAPPED: the file */
	uint32_t	cursor;			/* MAPPED: the backend's first section */
	double		seconds;
	size_t		file_bytes;
	char		refused[CAI_ERROR_MESSAGE_SIZE + 64];
	char		failure[CAI_ERROR_MESSAGE_SIZE + 64];
	struct cai_model_wcache_writing *writing;	/* the writer thread, once started */
};

/* c->state, which a writer thread may be ending */
static inline cai_weights_cache_state
cai_model_wcache_state(const struct cai_model_wcache *c)
{
	return __atomic_load_n(&c->state, __ATOMIC_ACQUIRE);
}

/*
 * Sets up m->wcache when params ask for a cache (and no float reference, which conversion
 * makes): the key from m->content_hash and the settings, file the weights mode chosen.  A valid
 * file is mapped (MAPPED); none, or one refused (the reason kept), leaves it PENDING.  Fails
 * only when out of memory.
 */
cai_status	cai_model_wcache_open(cai_model *m, const char *model_path,
								  const cai_model_params *params, bool file, cai_error *err);

/*
 * MAPPED, int8: points the model's int8 tables and vectors (what conversion makes besides the
 * GEMM matrices) into the file.  On a mismatch the file is dropped (PENDING, reason kept) and
 * false returned: the caller converts.
 */
bool		cai_model_wcache_take_int8(cai_model *m);

/* The model's own sections of a file (int8: the tables and vectors above; file: none). */
cai_status	cai_model_wcache_write_model(const cai_model *m, cai_wcache_writer *w, cai_error *err);

/*
 * MAPPED: the backend's prepared GEMM operands made from the file (backend.h's import_weights)
 * into out; *imported false when the caller must prepare them instead (a file-path file the
 * backend cannot or could not import).  A file that does not fit is removed.
 */
cai_status	cai_model_wcache_import(const cai_model *m, cai_backend *be,
									const cai_qmatrix *const *i8, const cai_bmatrix *const *blocks,
									int n, const cai_weight **out, bool *imported,
									cai_error *err);

/*
 * PENDING: starts a thread that writes the cache file from the model's sections and the
 * backend's prepared w[0, n) (export_weights), then removes the model's stale files, and ends
 * the state WRITTEN or FAILED (the reason kept in the report, never the caller's: the weights
 * are prepared either way).  Writing and syncing a 1B model's file takes seconds that the
 * engine spends answering instead.  The weights and the model's sections must stay unchanged
 * until cai_model_wcache_join for be; a second call (another context) starts nothing.  Without
 * a thread the file is written before it returns.
 */
void		cai_model_wcache_store(const cai_model *m, cai_backend *be, const cai_weight *const *w,
								   int n, double prepare_seconds);

/*
 * Waits for the writer thread that cai_model_wcache_store started with backend be (any
 * backend when be is NULL); nothing to wait for is fine.  Before be frees its weights.
 */
void		cai_model_wcache_join(const cai_model *m, const cai_backend *be);

/* Unmaps and frees m->wcache (model.c). */
void		cai_model_wcache_free(cai_model *m);

#endif							/* CAI_MODEL_WCACHE_H */
