/*
 * weight_cache.h — the backend's prepared weights kept in a file, so that the next engine
 * process with the same model and the same settings maps them instead of converting again.
 *
 * Converting a model's weights is the expensive part of a start: the int8 path requantizes
 * every matrix (calibrated, smoothed, rotated: seconds to tens of seconds on a 1B-8B model), the
 * file path repacks every block matrix.  An engine restarts after a crash, a reload or a new
 * `cai run`, always with the same bytes to make.  So the first start writes what it prepared
 * into one cache file (a temporary file, fsync, rename: a reader sees a whole file or none),
 * and later starts map that file read-only and point the weights into it: nothing is
 * converted, nothing is copied, and the weights' resident memory is the file's pages, which
 * the page cache shares with the next engine.
 *
 * The file is a container of sections, each a tagged blob 64-byte aligned, and knows nothing
 * of what they hold: the model (its int8 tables and vectors) and the backend (its prepared
 * matrices, backend.h's export_weights) each write and read their own, in order.
 *
 *   header (64 bytes): magic "CAIWGHT\0", format version, section count, key, file size,
 *                      table offset, checksum
 *   sections, each at a multiple of 64
 *   table: per section {tag, 0, offset, bytes}
 *
 * The checksum is XXH3-64 of the header (checksum field zero) seeded with XXH3-64 of every
 * byte after it.  A file whose magic, version, key, size, table or checksum does not hold is
 * refused, never trusted: it is rebuilt.  The key (cai_wcache_key) names everything that
 * changes the prepared bytes; a file of another key is another model or other settings.
 *
 * Integers are stored in the machine's order: the file is a cache for the machine that wrote
 * it (the key holds the byte order and pointer width, so another machine's file is refused).
 */
#ifndef CAI_WEIGHT_CACHE_H
#define CAI_WEIGHT_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"

#define CAI_WCACHE_FORMAT_VERSION 1
#define CAI_WCACHE_ALIGN 64
#define CAI_WCACHE_HEADER_BYTES 64
#define CAI_WCACHE_SUFFIX ".caiw"

/*
 * The version of what the int8 path's conversion produces (convert.c, calibrate.c: the
 * calibration text, smoothing, rotations, rounding).  Raise it with any change to those that
 * changes a converted byte: a cache keyed with the old number is then refused and rebuilt.
 */
#define CAI_INT8_CONVERSION_VERSION 1

/* Everything that decides the prepared bytes (see cai_wcache_key). */
typedef struct cai_wcache_key_params
{
	uint64_t	model_hash;		/* model_fingerprint.c: every tensor's bytes, config, tokenizer */
	uint64_t	model_bytes;	/* the file's size */
	bool		file_weights;	/* the file's own formats (else int8) */
	bool		gptq_rounding;
	bool		two_digit_activations;
	const char *backend;		/* whose layout the prepared matrices are in: "cpu" */
	uint32_t	backend_layout; /* that backend's layout version(s), folded into one number */
} cai_wcache_key_params;

/* The key of a cache file: XXH3-64 of the parameters and this build's format versions. */
uint64_t	cai_wcache_key(const cai_wcache_key_params *p);

/* One section as the table describes it. */
typedef struct cai_wcache_entry
{
	uint32_t	tag;			/* what the writer says it is; checked by its reader */
	uint32_t	reserved;
	uint64_t	offset;
	uint64_t	bytes;
} cai_wcache_entry;

/* A validated cache file in memory (cai_wcache_parse); points into the caller's bytes. */
typedef struct cai_wcache_view
{
	const uint8_t *base;
	size_t		size;
	uint64_t	key;
	uint32_t	n_sections;
	const cai_wcache_entry *table;
} cai_wcache_view;

/*
 * Validates size bytes at data as a cache file of key: the header, the table (every section
 * inside the file, aligned, after the header, before the table, in order, not overlapping)
 * and, when verify_checksum, the checksum.  CAI_ERR_FORMAT with the reason on any mismatch.
 * data must be 8-byte aligned (a mapping is).
 */
cai_status	cai_wcache_parse(const void *data, size_t size, uint64_t key, bool verify_checksum,
							 cai_wcache_view *out, cai_error *err);

/*
 * Section *cursor of v, which must carry tag, into *data and *bytes; advances the cursor.
 * CAI_ERR_FORMAT when there is none left or its tag differs.
 */
cai_status	cai_wcache_next(const cai_wcache_view *v, uint32_t *cursor, uint32_t tag,
							const void **data, size_t *bytes, cai_error *err);

/* Writing: sections streamed to a temporary file next to path, committed by rename. */
typedef struct cai_wcache_writer cai_wcache_writer;

cai_status	cai_wcache_writer_open(const char *path, uint64_t key, cai_wcache_writer **out,
								   cai_error *err);
cai_status	cai_wcache_add(cai_wcache_writer *w, uint32_t tag, const void *data, size_t bytes,
						   cai_error *err);
/* Writes the table and the header, fsyncs, renames over path and fsyncs the directory; frees w. */
cai_status	cai_wcache_writer_commit(cai_wcache_writer *w, cai_error *err);
/* Removes the temporary file and frees w (NULL is fine). */
void		cai_wcache_writer_abort(cai_wcache_writer *w);

/* A cache file's image in memory, read and checked. */
typedef struct cai_wcache_map
{
	void	   *addr;
	size_t		size;
	cai_wcache_view view;
} cai_wcache_map;

/*
 * Reads path into memory and validates it (checksum included) as a file of key.  CAI_ERR_NOT_FOUND when
 * there is no such file, CAI_ERR_FORMAT when it is refused (err says why), CAI_ERR_IO when it
 * cannot be read.
 */
cai_status	cai_wcache_map_open(const char *path, uint64_t key, cai_wcache_map *out,
								cai_error *err);
void		cai_wcache_map_close(cai_wcache_map *m);

/*
 * The cache file of a model in dir: dir/<the model file's base name>-<key in hex>.caiw (the
 * name sanitized to letters, digits, '.', '-' and '_').  false when it does not fit.
 */
bool		cai_wcache_path(const char *dir, const char *model_path, uint64_t key, char *out,
							size_t out_size);

/*
 * Keeps the cache bounded: removes every other file of the same model base name in dir (other
 * settings, an older model of that name, a temporary file a crash left), keeping only keep.
 * Returns how many it removed.
 */
int			cai_wcache_remove_stale(const char *dir, const char *model_path, const char *keep);

/* Creates dir and its missing parents (mode 0700). */
cai_status	cai_wcache_make_dir(const char *dir, cai_error *err);

#endif							/* CAI_WEIGHT_CACHE_H */
