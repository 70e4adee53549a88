/*
 * model_wcache.h — a model's use of the weights cache (weight_cache.h): the model load maps a
 * valid file instead of converting, and the first forward context on the CPU writes one when
 * there was none (model_load.c, forward_weights.c).  Not part of the engine's interface.
 */
#ifndef CAI_MODEL_WCACHE_H
#define CAI_MODEL_WCACHE_H

#include "model.h"
#include "weight_cache.h"

struct cai_model_wcache
{
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
};

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
 * PENDING: writes the cache file from the model's sections and the backend's prepared w[0, n)
 * (export_weights), and removes the model's stale files.  A failure is kept in the report,
 * never the caller's: the weights are prepared either way.
 */
void		cai_model_wcache_store(const cai_model *m, cai_backend *be, const cai_weight *const *w,
								   int n, double prepare_seconds);

/* Unmaps and frees m->wcache (model.c). */
void		cai_model_wcache_free(cai_model *m);

#endif							/* CAI_MODEL_WCACHE_H */
