/*
 * kv_disk.h — the prefix cache's disk tier: full KV blocks kept in files, so that a conversation's
 * cached prefix outlives RAM's budget and the engine process itself (Mooncake's DRAM + SSD pool).
 *
 * One file per full 16-token block, named by the block's chain key, in a subdirectory per model
 * fingerprint and KV format: a block is only ever found by the model and layout that made it.  A
 * file holds a header (the chain key, the key of the block before it, the salt, the owner, the
 * fingerprint, the format), the token ids of the whole prefix through the block, and the KV, all
 * under one XXH3-64 checksum.  A read verifies every field and every token against what the
 * lookup expects, so a torn, truncated, swapped or tampered file is a miss, never wrong KV.
 *
 * Writes leave the caller's thread at once: a block is copied into a bounded queue and a writer
 * thread writes it (to a temporary name, renamed into place); when the queue is full the block is
 * dropped, not waited for.  Reads run on the caller's thread (the engine reads when it admits a
 * request, before its step).  The tier's files are kept under a byte budget, least recently used
 * first out.  Opening indexes the directory by reading each file's header only.  Any I/O failure
 * degrades to a miss or a dropped write with one log line; nothing here fails a request.
 *
 * Thread-safe as used: one caller thread (the engine's step loop) and the tier's writer thread.
 */
#ifndef CAI_KV_DISK_H
#define CAI_KV_DISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"
#include "kv.h"

typedef struct cai_kv_disk cai_kv_disk;

typedef struct cai_kv_disk_stats
{
	uint64_t	hits;			/* blocks read back and verified */
	uint64_t	misses;			/* reads refused: missing, short, corrupt or mismatched file */
	uint64_t	bytes_read;
	uint64_t	bytes_written;
	uint64_t	blocks_written;
	uint64_t	writes_dropped;	/* queue full, file too large, or a write that failed */
	uint64_t	evictions;		/* files removed to stay within the budget */
	uint64_t	files;			/* files now */
	uint64_t	bytes;			/* their size now */
	uint64_t	budget_bytes;
} cai_kv_disk_stats;

/* What names a block, and what a read must find in its file. */
typedef struct cai_kv_disk_block
{
	uint64_t	key;			/* the block's chain key */
	uint64_t	parent_key;		/* the key before it (the root seed for a prefix's first block) */
	uint64_t	salt;
	uint64_t	owner;			/* the conversation that first cached it (0: none) */
	const int32_t *prefix;		/* the token ids of the whole prefix through this block */
	int			n_prefix;		/* a multiple of CAI_KV_BLOCK_TOKENS, at least one block */
} cai_kv_disk_block;

typedef void (*cai_kv_disk_log_fn) (void *arg, const char *line);

/*
 * Opens the tier under dir (created, mode 0700, if missing; it must be the server's own, see
 * safe_file.h) for blocks of this layout made by the model with this fingerprint; device names
 * where the KV was computed, so that another backend's numerics never meet these.  Indexes the
 * files there, removes leftovers of an interrupted write, evicts to budget_bytes and starts the
 * writer thread.  log (may be NULL) receives the lines that say why the tier degraded.  An error
 * means no tier: the caller goes on with RAM alone.
 */
cai_status	cai_kv_disk_open(const char *dir, size_t budget_bytes, uint64_t fingerprint,
							 const cai_kv_layout *layout, const char *device,
							 cai_kv_disk_log_fn log, void *log_arg, cai_kv_disk **out,
							 cai_error *err);

/* Stops the writer (the write in hand finishes, queued ones are dropped) and frees the tier. */
void		cai_kv_disk_close(cai_kv_disk *disk);

/* Whether a file or a queued write holds the block of this key. */
bool		cai_kv_disk_contains(cai_kv_disk *disk, uint64_t key);

/*
 * Queues block (of pool) for writing under b's names, unless the tier already holds that key.
 * Copies the block's bytes before returning; never blocks on I/O.  Returns whether it was queued.
 */
bool		cai_kv_disk_store(cai_kv_disk *disk, const cai_kv_disk_block *b, cai_kv_pool *pool,
							  int32_t block);

/*
 * Reads the block of b->key back into a new block of pool (refcount 1, the caller's), after
 * verifying the file's checksum and that its names and every prefix token are b's, with the
 * file's owner in *owner_out (may be NULL).  The block gets the file's window part only when
 * with_window allows it and the pool has one free (else its global part alone).  -1 on a miss,
 * or when the pool has no free block.  A file that fails its checksum or does not fit the
 * layout is removed.
 */
int32_t		cai_kv_disk_load(cai_kv_disk *disk, const cai_kv_disk_block *b, cai_kv_pool *pool,
							 bool with_window, uint64_t *owner_out);

/* Removes every block of owner (files and queued writes); returns the files removed. */
int			cai_kv_disk_forget_owner(cai_kv_disk *disk, uint64_t owner);

/* Removes every block (files and queued writes). */
void		cai_kv_disk_reset(cai_kv_disk *disk);

/* Waits until every queued write is done (tests and benchmarks). */
void		cai_kv_disk_flush(cai_kv_disk *disk);

void		cai_kv_disk_get_stats(cai_kv_disk *disk, cai_kv_disk_stats *out);

/* The directory the files of this tier live in (under the dir given to open). */
const char *cai_kv_disk_path(const cai_kv_disk *disk);

#endif							/* CAI_KV_DISK_H */
