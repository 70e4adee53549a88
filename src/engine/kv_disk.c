/*
 * kv_disk.c — the prefix cache's disk tier (see kv_disk.h).
 *
 * Layout.  <dir>/<16 hex digits>/ holds the files of one model and KV format (the digits hash
 * the fingerprint, the layout and the device), one per block: <16 hex digits of the key>.kv.
 * A file is
 *
 *   header   disk_header below (88 bytes, host byte order: the files never leave the machine)
 *   prefix   int32 [n_prefix]          every token id from the prompt's start through the block
 *   kv       the block's global part, layer by layer (kv.h), then its window part when flagged
 *
 * and header.checksum is XXH3-64 over all of it with the checksum field zeroed.  Keeping the whole
 * prefix costs 4 bytes a token per block (1% of a SmolLM2 block at 1,000 tokens of context) and
 * makes a hit as certain as the RAM cache's parent links: the tokens compared are the prompt's.
 *
 * Writes.  The caller copies the block into a job (the KV pool is not thread-safe, and an evicted
 * block is reused at once), the writer thread checksums it, creates <key>.tmp exclusively, writes,
 * and renames it into place, then files it in the index and evicts past the budget.  A crash
 * between the two leaves a .tmp, which the next open removes.  No fsync: a file torn by a power
 * loss fails its checksum and is a miss.
 *
 * Index.  Entries by key in a chained hash and on an LRU list (a hit or a write moves an entry to
 * the new end); opening fills them from the headers, oldest file first by modification time.  One
 * mutex guards the index, the queue and the statistics; file I/O happens outside it.  A read may
 * race an eviction: the open fails, or the file read was unlinked after the open; either way the
 * bytes read are verified.
 */
#include "kv_disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "safe_file.h"
#include "util.h"

#define DISK_MAGIC "CAIKVD1\n"
#define DISK_VERSION 1
#define FLAG_WINDOW 1u

/* The most writes waiting at once, and their bytes: a burst past this is dropped. */
#define QUEUE_MAX_JOBS 256
#define QUEUE_MAX_BYTES ((size_t) 64 * 1024 * 1024)

typedef struct disk_header
{
	char		magic[8];
	uint32_t	version;
	uint32_t	header_bytes;
	uint64_t	fingerprint;
	uint64_t	format;
	uint64_t	key;
	uint64_t	parent_key;
	uint64_t	salt;
	uint64_t	owner;
	uint32_t	n_prefix;
	uint32_t	flags;
	uint64_t	payload_bytes;
	uint64_t	checksum;
} disk_header;

_Static_assert(sizeof(disk_header) == 88, "disk_header has no padding");

typedef struct disk_entry
{
	uint64_t	key;
	uint64_t	owner;
	uint64_t	file_bytes;
	struct disk_entry *hash_next;
	struct disk_entry *lru_older;
	struct disk_entry *lru_newer;
} disk_entry;

typedef struct disk_job
{
	uint64_t	key;
	uint64_t	owner;
	size_t		bytes;
	uint8_t    *data;			/* the whole file, checksum still zero */
} disk_job;

struct cai_kv_disk
{
	char		path[4096];
	uint64_t	fingerprint;
	uint64_t	format;
	cai_kv_layout layout;
	size_t		budget_bytes;
	cai_kv_disk_log_fn log;
	void	   *log_arg;

	pthread_mutex_t lock;
	pthread_cond_t wake;		/* the writer: a job, or stop */
	pthread_cond_t idle;		/* waiters: the writer finished a job */
	pthread_t	writer;
	bool		writer_started;
	bool		stop;
	bool		writer_busy;
	uint64_t	busy_key;		/* the job the writer has in hand */
	uint64_t	busy_owner;
	bool		busy_cancelled; /* forgotten while in hand: not filed, removed */
	bool		writes_off;		/* the directory refused a write for good */

	disk_job	queue[QUEUE_MAX_JOBS];
	int			queue_head;
	int			queue_len;
	size_t		queue_bytes;

	disk_entry **buckets;
	int			bucket_bits;
	disk_entry *lru_oldest;
	disk_entry *lru_newest;
	uint64_t	tmp_counter;

	uint8_t    *scratch;		/* the caller's read buffer: a whole file */
	size_t		scratch_bytes;

	cai_kv_disk_stats stats;
};

static void
disk_log(cai_kv_disk *disk, const char *fmt,...) __attribute__((format(printf, 2, 3)));

static void
disk_log(cai_kv_disk *disk, const char *fmt,...)
{
	char		line[512];
	va_list		ap;

	if (!disk->log)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	disk->log(disk->log_arg, line);
}

/* What a block of this layout holds on disk: its global part, and its window part if flagged. */
static size_t
payload_bytes(const cai_kv_layout *L, bool window)
{
	return cai_kv_global_part_bytes(L) + (window ? cai_kv_window_part_bytes(L) : 0);
}

static size_t
file_bytes(const cai_kv_layout *L, int n_prefix, bool window)
{
	return sizeof(disk_header) + (size_t) n_prefix * sizeof(int32_t) + payload_bytes(L, window);
}

static uint64_t
format_hash(const cai_kv_layout *L, const char *device)
{
	uint64_t	words[10] = {
		DISK_VERSION, CAI_KV_BLOCK_TOKENS, (uint64_t) L->n_kv_layers,
		(uint64_t) L->n_windowed_layers, (uint64_t) L->window, (uint64_t) L->n_kv_heads,
		(uint64_t) L->head_dim, (uint64_t) (L->key_digits == 2 ? 2 : 1), L->layer_bytes,
		L->block_bytes
	};

	return XXH3_64bits_withSeed(words, sizeof(words),
								XXH3_64bits(device ? device : "", device ? strlen(device) : 0));
}

static void
file_name(const cai_kv_disk *disk, uint64_t key, const char *suffix, char *out, size_t size)
{
	snprintf(out, size, "%s/%016llx%s", disk->path, (unsigned long long) key, suffix);
}

/* ---------------------------------------------------------------------------------------------
 * The index (callers hold the lock)
 * ------------------------------------------------------------------------------------------- */

static size_t
bucket_of(const cai_kv_disk *disk, uint64_t key)
{
	return (size_t) ((key * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - disk->bucket_bits));
}

static disk_entry *
index_find(const cai_kv_disk *disk, uint64_t key)
{
	disk_entry *e = disk->buckets[bucket_of(disk, key)];

	while (e && e->key != key)
		e = e->hash_next;
	return e;
}

static void
lru_unlink(cai_kv_disk *disk, disk_entry *e)
{
	if (e->lru_older)
		e->lru_older->lru_newer = e->lru_newer;
	else
		disk->lru_oldest = e->lru_newer;
	if (e->lru_newer)
		e->lru_newer->lru_older = e->lru_older;
	else
		disk->lru_newest = e->lru_older;
	e->lru_older = e->lru_newer = NULL;
}

static void
lru_append(cai_kv_disk *disk, disk_entry *e)
{
	e->lru_older = disk->lru_newest;
	e->lru_newer = NULL;
	if (disk->lru_newest)
		disk->lru_newest->lru_newer = e;
	else
		disk->lru_oldest = e;
	disk->lru_newest = e;
}

/* Files an entry as the most recently used; false for memory. */
static bool
index_add(cai_kv_disk *disk, uint64_t key, uint64_t owner, uint64_t bytes)
{
	disk_entry *e = index_find(disk, key);
	disk_entry **head;

	if (e)
	{
		disk->stats.bytes -= e->file_bytes;
		e->file_bytes = bytes;
		e->owner = owner;
		disk->stats.bytes += bytes;
		lru_unlink(disk, e);
		lru_append(disk, e);
		return true;
	}
	e = calloc(1, sizeof(*e));
	if (!e)
		return false;
	e->key = key;
	e->owner = owner;
	e->file_bytes = bytes;
	head = &disk->buckets[bucket_of(disk, key)];
	e->hash_next = *head;
	*head = e;
	lru_append(disk, e);
	disk->stats.files++;
	disk->stats.bytes += bytes;
	return true;
}

/* Unfiles e and removes its file. */
static void
index_remove(cai_kv_disk *disk, disk_entry *e)
{
	disk_entry **link = &disk->buckets[bucket_of(disk, e->key)];
	char		name[4200];

	while (*link && *link != e)
		link = &(*link)->hash_next;
	if (*link)
		*link = e->hash_next;
	lru_unlink(disk, e);
	disk->stats.files--;
	disk->stats.bytes -= e->file_bytes;
	file_name(disk, e->key, ".kv", name, sizeof(name));
	(void) unlink(name);
	free(e);
}

/* Removes the least recently used files until incoming more bytes fit the budget. */
static void
index_evict(cai_kv_disk *disk, uint64_t incoming)
{
	while (disk->lru_oldest && disk->stats.bytes + incoming > disk->budget_bytes)
	{
		index_remove(disk, disk->lru_oldest);
		disk->stats.evictions++;
	}
}

/* ---------------------------------------------------------------------------------------------
 * The writer
 * ------------------------------------------------------------------------------------------- */

static void
job_drop(cai_kv_disk *disk, int i)
{
	disk_job   *job = &disk->queue[(disk->queue_head + i) % QUEUE_MAX_JOBS];

	disk->queue_bytes -= job->bytes;
	free(job->data);
	job->data = NULL;
}

/* Writes a job's file; returns 0 or the errno of the failure. */
static int
write_file(cai_kv_disk *disk, const disk_job *job, uint64_t serial)
{
	char		tmp[4200];
	char		name[4200];
	cai_error	err;
	int			e = 0;
	int			fd;
	size_t		done = 0;

	snprintf(tmp, sizeof(tmp), "%s/%016llx.%llu.tmp", disk->path, (unsigned long long) job->key,
			 (unsigned long long) serial);
	file_name(disk, job->key, ".kv", name, sizeof(name));
	fd = cai_safe_create(tmp, &err, &e);
	if (fd < 0)
		return e ? e : EIO;
	while (done < job->bytes)
	{
		ssize_t		n = write(fd, job->data + done, job->bytes - done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
		{
			e = n < 0 ? errno : ENOSPC;
			break;
		}
		done += (size_t) n;
	}
	if (close(fd) != 0 && e == 0)
		e = errno;
	if (e == 0 && rename(tmp, name) != 0)
		e = errno;
	if (e != 0)
		(void) unlink(tmp);
	return e;
}

static void *
writer_main(void *arg)
{
	cai_kv_disk *disk = arg;

	pthread_mutex_lock(&disk->lock);
	for (;;)
	{
		disk_job	job;
		uint64_t	serial;
		int			e;

		while (disk->queue_len == 0 && !disk->stop)
			pthread_cond_wait(&disk->wake, &disk->lock);
		if (disk->stop)
			break;
		job = disk->queue[disk->queue_head];
		disk->queue[disk->queue_head].data = NULL;
		disk->queue_head = (disk->queue_head + 1) % QUEUE_MAX_JOBS;
		disk->queue_len--;
		disk->queue_bytes -= job.bytes;
		if (disk->writes_off || index_find(disk, job.key) || job.bytes > disk->budget_bytes)
		{
			/* a block already on disk is no loss */
			if (!index_find(disk, job.key))
				disk->stats.writes_dropped++;
			free(job.data);
			pthread_cond_broadcast(&disk->idle);
			continue;
		}
		/* room first, so the tier never holds more than its budget */
		index_evict(disk, job.bytes);
		disk->writer_busy = true;
		disk->busy_key = job.key;
		disk->busy_owner = job.owner;
		disk->busy_cancelled = false;
		serial = ++disk->tmp_counter;
		pthread_mutex_unlock(&disk->lock);

		((disk_header *) job.data)->checksum = XXH3_64bits(job.data, job.bytes);
		e = write_file(disk, &job, serial);

		pthread_mutex_lock(&disk->lock);
		disk->writer_busy = false;
		if (e == 0 && disk->busy_cancelled)
		{
			char		name[4200];

			file_name(disk, job.key, ".kv", name, sizeof(name));
			(void) unlink(name);
		}
		else if (e == 0)
		{
			if (index_add(disk, job.key, job.owner, job.bytes))
			{
				disk->stats.blocks_written++;
				disk->stats.bytes_written += job.bytes;
			}
			else
			{
				char		name[4200];

				file_name(disk, job.key, ".kv", name, sizeof(name));
				(void) unlink(name);
				disk->stats.writes_dropped++;
			}
		}
		else
		{
			disk->stats.writes_dropped++;
			if (e == ENOSPC || e == EDQUOT)
			{
				/* the disk is fuller than the budget thought: give room back and go on */
				if (!disk->lru_oldest)
					disk_log(disk, "no space left in \"%s\"; this block is not kept", disk->path);
				for (int i = 0; i < 8 && disk->lru_oldest; i++)
				{
					index_remove(disk, disk->lru_oldest);
					disk->stats.evictions++;
				}
			}
			else
			{
				disk->writes_off = true;
				disk_log(disk, "cannot write in \"%s\": %s; blocks are kept in memory only",
						 disk->path, strerror(e));
			}
		}
		free(job.data);
		pthread_cond_broadcast(&disk->idle);
	}
	pthread_mutex_unlock(&disk->lock);
	return NULL;
}

/* Waits, holding the lock, until the writer has no job in hand. */
static void
wait_writer_idle(cai_kv_disk *disk)
{
	while (disk->writer_busy)
		pthread_cond_wait(&disk->idle, &disk->lock);
}

/* ---------------------------------------------------------------------------------------------
 * Opening: the index from the files' headers
 * ------------------------------------------------------------------------------------------- */

typedef struct found_file
{
	uint64_t	key;
	uint64_t	owner;
	uint64_t	bytes;
	struct timespec mtime;
} found_file;

static int
found_cmp(const void *a, const void *b)
{
	const found_file *x = a;
	const found_file *y = b;

	if (x->mtime.tv_sec != y->mtime.tv_sec)
		return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
	if (x->mtime.tv_nsec != y->mtime.tv_nsec)
		return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
	return 0;
}

/* Whether name is <16 hex digits><suffix>, with the digits' value in *key. */
static bool
parse_name(const char *name, const char *suffix, uint64_t *key)
{
	char	   *end;

	if (strlen(name) != 16 + strlen(suffix) || strcmp(name + 16, suffix) != 0)
		return false;
	for (int i = 0; i < 16; i++)
		if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
			return false;
	*key = strtoull(name, &end, 16);
	return end == name + 16;
}

/*
 * A file's header, checked against what this tier holds and the file's size; false (and the
 * file is removed) when it does not fit.  The checksum is left to the read.
 */
static bool
read_header(cai_kv_disk *disk, const char *name, uint64_t key, found_file *out)
{
	char		path[4200];
	disk_header h;
	off_t		size;
	cai_error	err;
	int			fd;
	bool		ok;
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s", disk->path, name);
	fd = cai_safe_open_regular(path, &size, &err, NULL);
	if (fd < 0)
		return false;
	ok = pread(fd, &h, sizeof(h), 0) == (ssize_t) sizeof(h) && fstat(fd, &st) == 0;
	close(fd);
	ok = ok && memcmp(h.magic, DISK_MAGIC, 8) == 0 && h.version == DISK_VERSION &&
		h.header_bytes == sizeof(h) && h.fingerprint == disk->fingerprint &&
		h.format == disk->format && h.key == key && h.n_prefix > 0 &&
		h.n_prefix % CAI_KV_BLOCK_TOKENS == 0 && h.n_prefix <= (1u << 24) &&
		h.payload_bytes == payload_bytes(&disk->layout, (h.flags & FLAG_WINDOW) != 0) &&
		(uint64_t) size == file_bytes(&disk->layout, (int) h.n_prefix,
									  (h.flags & FLAG_WINDOW) != 0);
	if (!ok)
	{
		(void) unlink(path);
		return false;
	}
	out->key = key;
	out->owner = h.owner;
	out->bytes = (uint64_t) size;
	out->mtime = st.st_mtim;
	return true;
}

static cai_status
index_directory(cai_kv_disk *disk, cai_error *err)
{
	DIR		   *d = opendir(disk->path);
	struct dirent *de;
	found_file *found = NULL;
	size_t		n = 0;
	size_t		cap = 0;
	int			removed = 0;

	if (!d)
		return cai_fail(err, CAI_ERR_IO, "could not open \"%s\": %s", disk->path,
						strerror(errno));
	while ((de = readdir(d)) != NULL)
	{
		uint64_t	key;
		size_t		len = strlen(de->d_name);

		if (de->d_name[0] == '.')
			continue;
		if (len > 4 && strcmp(de->d_name + len - 4, ".tmp") == 0)
		{
			char		path[4200];

			/* an interrupted write */
			snprintf(path, sizeof(path), "%s/%s", disk->path, de->d_name);
			(void) unlink(path);
			continue;
		}
		if (!parse_name(de->d_name, ".kv", &key))
			continue;
		if (n == cap)
		{
			size_t		new_cap = cap ? cap * 2 : 256;
			found_file *grown = realloc(found, new_cap * sizeof(*found));

			if (!grown)
			{
				free(found);
				closedir(d);
				return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory indexing \"%s\"",
								disk->path);
			}
			found = grown;
			cap = new_cap;
		}
		if (read_header(disk, de->d_name, key, &found[n]))
			n++;
		else
			removed++;
	}
	closedir(d);
	if (n > 1)
		qsort(found, n, sizeof(*found), found_cmp);
	for (size_t i = 0; i < n; i++)
		if (!index_add(disk, found[i].key, found[i].owner, found[i].bytes))
		{
			free(found);
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory indexing \"%s\"",
							disk->path);
		}
	free(found);
	index_evict(disk, 0);
	if (removed > 0)
		disk_log(disk, "removed %d unreadable files from \"%s\"", removed, disk->path);
	return CAI_OK;
}

cai_status
cai_kv_disk_open(const char *dir, size_t budget_bytes, uint64_t fingerprint,
				 const cai_kv_layout *layout, const char *device, cai_kv_disk_log_fn log,
				 void *log_arg, cai_kv_disk **out, cai_error *err)
{
	cai_kv_disk *disk;
	cai_status	st;
	size_t		one;
	size_t		n_expected;
	int			bits = 6;

	*out = NULL;
	if (!dir || !dir[0] || budget_bytes == 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "the disk tier needs a directory and a budget");
	if (!layout || layout->block_bytes == 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "the disk tier needs a non-empty kv block");
	disk = calloc(1, sizeof(*disk));
	if (!disk)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory opening the disk tier");
	disk->fingerprint = fingerprint;
	disk->layout = *layout;
	disk->format = format_hash(layout, device);
	disk->budget_bytes = budget_bytes;
	disk->stats.budget_bytes = budget_bytes;
	disk->log = log;
	disk->log_arg = log_arg;
	pthread_mutex_init(&disk->lock, NULL);
	pthread_cond_init(&disk->wake, NULL);
	pthread_cond_init(&disk->idle, NULL);

	if (strlen(dir) > 4000)
	{
		cai_kv_disk_close(disk);
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "disk cache directory name is too long");
	}
	st = cai_safe_dir_make(dir, err);
	if (st == CAI_OK)
	{
		uint64_t	words[2] = {fingerprint, disk->format};

		snprintf(disk->path, sizeof(disk->path), "%s/%016llx", dir,
				 (unsigned long long) XXH3_64bits(words, sizeof(words)));
		st = cai_safe_dir_make(disk->path, err);
	}
	if (st != CAI_OK)
	{
		cai_kv_disk_close(disk);
		return st;
	}

	one = file_bytes(layout, CAI_KV_BLOCK_TOKENS, true);
	n_expected = budget_bytes / one + 1;
	while (bits < 22 && ((size_t) 1 << bits) < n_expected)
		bits++;
	disk->bucket_bits = bits;
	disk->buckets = calloc((size_t) 1 << bits, sizeof(disk_entry *));
	if (!disk->buckets)
	{
		cai_kv_disk_close(disk);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory opening the disk tier");
	}
	st = index_directory(disk, err);
	if (st != CAI_OK)
	{
		cai_kv_disk_close(disk);
		return st;
	}
	if (pthread_create(&disk->writer, NULL, writer_main, disk) != 0)
	{
		cai_kv_disk_close(disk);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "could not start the disk tier's writer");
	}
	disk->writer_started = true;
	*out = disk;
	return CAI_OK;
}

void
cai_kv_disk_close(cai_kv_disk *disk)
{
	if (!disk)
		return;
	pthread_mutex_lock(&disk->lock);
	disk->stop = true;
	pthread_cond_broadcast(&disk->wake);
	pthread_mutex_unlock(&disk->lock);
	if (disk->writer_started)
		pthread_join(disk->writer, NULL);
	while (disk->queue_len > 0)
	{
		job_drop(disk, 0);
		disk->queue_head = (disk->queue_head + 1) % QUEUE_MAX_JOBS;
		disk->queue_len--;
	}
	if (disk->buckets)
	{
		for (size_t b = 0; b < ((size_t) 1 << disk->bucket_bits); b++)
		{
			disk_entry *e = disk->buckets[b];

			while (e)
			{
				disk_entry *next = e->hash_next;

				free(e);
				e = next;
			}
		}
		free(disk->buckets);
	}
	free(disk->scratch);
	pthread_cond_destroy(&disk->idle);
	pthread_cond_destroy(&disk->wake);
	pthread_mutex_destroy(&disk->lock);
	free(disk);
}

/* Whether the queue holds a write of key (the lock held). */
static bool
queued(const cai_kv_disk *disk, uint64_t key)
{
	for (int i = 0; i < disk->queue_len; i++)
		if (disk->queue[(disk->queue_head + i) % QUEUE_MAX_JOBS].key == key)
			return true;
	return disk->writer_busy && disk->busy_key == key;
}

bool
cai_kv_disk_contains(cai_kv_disk *disk, uint64_t key)
{
	bool		found;

	pthread_mutex_lock(&disk->lock);
	found = index_find(disk, key) != NULL || queued(disk, key);
	pthread_mutex_unlock(&disk->lock);
	return found;
}

bool
cai_kv_disk_store(cai_kv_disk *disk, const cai_kv_disk_block *b, cai_kv_pool *pool, int32_t block)
{
	const cai_kv_layout *L = &disk->layout;
	int			n_global = L->n_kv_layers - L->n_windowed_layers;
	bool		window = L->n_windowed_layers > 0 && cai_kv_block_has_window(pool, block);
	size_t		bytes;
	disk_job	job;
	disk_header *h;
	uint8_t    *p;
	bool		full;

	if (!b->prefix || b->n_prefix <= 0 || b->n_prefix % CAI_KV_BLOCK_TOKENS != 0)
		return false;
	bytes = file_bytes(L, b->n_prefix, window);

	pthread_mutex_lock(&disk->lock);
	if (index_find(disk, b->key) || queued(disk, b->key))
	{
		pthread_mutex_unlock(&disk->lock);
		return false;
	}
	full = disk->writes_off || disk->queue_len == QUEUE_MAX_JOBS ||
		disk->queue_bytes + bytes > QUEUE_MAX_BYTES || bytes > disk->budget_bytes;
	if (full)
	{
		disk->stats.writes_dropped++;
		pthread_mutex_unlock(&disk->lock);
		return false;
	}
	pthread_mutex_unlock(&disk->lock);

	job.key = b->key;
	job.owner = b->owner;
	job.bytes = bytes;
	job.data = malloc(bytes);
	if (!job.data)
		return false;
	h = (disk_header *) job.data;
	memset(h, 0, sizeof(*h));
	memcpy(h->magic, DISK_MAGIC, 8);
	h->version = DISK_VERSION;
	h->header_bytes = sizeof(*h);
	h->fingerprint = disk->fingerprint;
	h->format = disk->format;
	h->key = b->key;
	h->parent_key = b->parent_key;
	h->salt = b->salt;
	h->owner = b->owner;
	h->n_prefix = (uint32_t) b->n_prefix;
	h->flags = window ? FLAG_WINDOW : 0;
	h->payload_bytes = payload_bytes(L, window);
	p = job.data + sizeof(*h);
	memcpy(p, b->prefix, (size_t) b->n_prefix * sizeof(int32_t));
	p += (size_t) b->n_prefix * sizeof(int32_t);
	for (int l = 0; l < (window ? L->n_kv_layers : n_global); l++)
	{
		memcpy(p, cai_kv_block_layer(pool, block, l), L->layer_bytes);
		p += L->layer_bytes;
	}

	pthread_mutex_lock(&disk->lock);
	if (disk->queue_len == QUEUE_MAX_JOBS || disk->queue_bytes + bytes > QUEUE_MAX_BYTES)
	{
		disk->stats.writes_dropped++;
		pthread_mutex_unlock(&disk->lock);
		free(job.data);
		return false;
	}
	disk->queue[(disk->queue_head + disk->queue_len) % QUEUE_MAX_JOBS] = job;
	disk->queue_len++;
	disk->queue_bytes += bytes;
	pthread_cond_signal(&disk->wake);
	pthread_mutex_unlock(&disk->lock);
	return true;
}

/*
 * A file read back and found sound may not be the one indexed: another engine process over the
 * same directory can have replaced it (a block with its window part over one without), so the
 * budget counts the size read (the lock held).
 */
static void
note_size(cai_kv_disk *disk, uint64_t key, uint64_t bytes)
{
	disk_entry *e = index_find(disk, key);

	if (e && e->file_bytes != bytes)
	{
		disk->stats.bytes -= e->file_bytes;
		disk->stats.bytes += bytes;
		e->file_bytes = bytes;
	}
}

/* A read that failed verification: the file goes, so that it is not read again. */
static void
refuse(cai_kv_disk *disk, uint64_t key, bool remove)
{
	disk_entry *e;

	pthread_mutex_lock(&disk->lock);
	disk->stats.misses++;
	if (remove && (e = index_find(disk, key)) != NULL)
		index_remove(disk, e);
	pthread_mutex_unlock(&disk->lock);
}

int32_t
cai_kv_disk_load(cai_kv_disk *disk, const cai_kv_disk_block *b, cai_kv_pool *pool,
				 bool with_window, uint64_t *owner_out)
{
	const cai_kv_layout *L = &disk->layout;
	int			n_global = L->n_kv_layers - L->n_windowed_layers;
	char		name[4200];
	disk_header h;
	off_t		size;
	cai_error	err;
	int			fd;
	size_t		done = 0;
	bool		window;
	int32_t		block;
	uint8_t    *p;

	if (!b->prefix || b->n_prefix <= 0 || b->n_prefix % CAI_KV_BLOCK_TOKENS != 0)
		return -1;
	pthread_mutex_lock(&disk->lock);
	if (!index_find(disk, b->key))
	{
		pthread_mutex_unlock(&disk->lock);
		return -1;
	}
	pthread_mutex_unlock(&disk->lock);
	if (cai_kv_pool_n_free(pool) == 0)
		return -1;

	file_name(disk, b->key, ".kv", name, sizeof(name));
	fd = cai_safe_open_regular(name, &size, &err, NULL);
	if (fd < 0)
	{
		refuse(disk, b->key, true);
		return -1;
	}
	if ((size_t) size != file_bytes(L, b->n_prefix, true) && (size_t) size != file_bytes(L, b->n_prefix, false))
	{
		close(fd);
		refuse(disk, b->key, true);
		return -1;
	}
	if (disk->scratch_bytes < (size_t) size)
	{
		uint8_t    *grown = realloc(disk->scratch, (size_t) size);

		if (!grown)
		{
			close(fd);
			return -1;
		}
		disk->scratch = grown;
		disk->scratch_bytes = (size_t) size;
	}
	while (done < (size_t) size)
	{
		ssize_t		n = pread(fd, disk->scratch + done, (size_t) size - done, (off_t) done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		done += (size_t) n;
	}
	close(fd);
	if (done != (size_t) size)
	{
		refuse(disk, b->key, true);
		return -1;
	}

	/* every byte under the checksum, then every name and token against the lookup's */
	memcpy(&h, disk->scratch, sizeof(h));
	window = (h.flags & FLAG_WINDOW) != 0;
	((disk_header *) disk->scratch)->checksum = 0;
	if (XXH3_64bits(disk->scratch, (size_t) size) != h.checksum ||
		memcmp(h.magic, DISK_MAGIC, 8) != 0 || h.version != DISK_VERSION ||
		h.header_bytes != sizeof(h) || h.fingerprint != disk->fingerprint ||
		h.format != disk->format || h.n_prefix != (uint32_t) b->n_prefix ||
		h.payload_bytes != payload_bytes(L, window) ||
		(size_t) size != file_bytes(L, b->n_prefix, window))
	{
		refuse(disk, b->key, true);
		return -1;
	}
	if (h.key != b->key || h.parent_key != b->parent_key || h.salt != b->salt ||
		memcmp(disk->scratch + sizeof(h), b->prefix, (size_t) b->n_prefix * sizeof(int32_t)) != 0)
	{
		/* a sound file that is another prefix's (a key collision): a miss, and it stays */
		pthread_mutex_lock(&disk->lock);
		note_size(disk, b->key, (uint64_t) size);
		pthread_mutex_unlock(&disk->lock);
		refuse(disk, b->key, false);
		return -1;
	}

	if (L->n_windowed_layers > 0 && !with_window)
		window = false;
	block = window || L->n_windowed_layers == 0 ? cai_kv_block_alloc(pool)
		: cai_kv_block_alloc_without_window(pool);
	if (block < 0 && window)
	{
		/* no window part free: the global part alone still serves a later resume point */
		block = cai_kv_block_alloc_without_window(pool);
		window = false;
	}
	if (block < 0)
		return -1;
	if (owner_out)
		*owner_out = h.owner;
	p = disk->scratch + sizeof(h) + (size_t) b->n_prefix * sizeof(int32_t);
	for (int l = 0; l < (window ? L->n_kv_layers : n_global); l++)
	{
		memcpy(cai_kv_block_layer(pool, block, l), p, L->layer_bytes);
		p += L->layer_bytes;
	}

	pthread_mutex_lock(&disk->lock);
	{
		disk_entry *e = index_find(disk, b->key);

		if (e)
		{
			lru_unlink(disk, e);
			lru_append(disk, e);
		}
	}
	note_size(disk, b->key, (uint64_t) size);
	disk->stats.hits++;
	disk->stats.bytes_read += (uint64_t) size;
	pthread_mutex_unlock(&disk->lock);
	return block;
}

int
cai_kv_disk_forget_owner(cai_kv_disk *disk, uint64_t owner)
{
	int			removed = 0;
	int			kept = 0;

	pthread_mutex_lock(&disk->lock);
	/* queued writes of owner go unwritten; the one in hand is removed once written */
	for (int i = 0; i < disk->queue_len; i++)
	{
		int			slot = (disk->queue_head + i) % QUEUE_MAX_JOBS;

		if (disk->queue[slot].owner == owner)
			job_drop(disk, i);
		else
			disk->queue[(disk->queue_head + kept++) % QUEUE_MAX_JOBS] = disk->queue[slot];
	}
	disk->queue_len = kept;
	if (disk->writer_busy && disk->busy_owner == owner)
		disk->busy_cancelled = true;
	for (size_t b = 0; b < ((size_t) 1 << disk->bucket_bits); b++)
	{
		disk_entry *e = disk->buckets[b];

		while (e)
		{
			disk_entry *next = e->hash_next;

			if (e->owner == owner)
			{
				index_remove(disk, e);
				removed++;
			}
			e = next;
		}
	}
	wait_writer_idle(disk);
	pthread_mutex_unlock(&disk->lock);
	return removed;
}

void
cai_kv_disk_reset(cai_kv_disk *disk)
{
	DIR		   *d;
	struct dirent *de;

	pthread_mutex_lock(&disk->lock);
	while (disk->queue_len > 0)
	{
		job_drop(disk, 0);
		disk->queue_head = (disk->queue_head + 1) % QUEUE_MAX_JOBS;
		disk->queue_len--;
	}
	if (disk->writer_busy)
		disk->busy_cancelled = true;
	wait_writer_idle(disk);
	while (disk->lru_oldest)
		index_remove(disk, disk->lru_oldest);
	/* files the index does not list (refused at open, or left by a failed rename) go too */
	d = opendir(disk->path);
	while (d && (de = readdir(d)) != NULL)
	{
		uint64_t	key;
		size_t		len = strlen(de->d_name);

		if (parse_name(de->d_name, ".kv", &key) ||
			(len > 4 && strcmp(de->d_name + len - 4, ".tmp") == 0 && de->d_name[0] != '.'))
		{
			char		path[4200];

			snprintf(path, sizeof(path), "%s/%s", disk->path, de->d_name);
			(void) unlink(path);
		}
	}
	if (d)
		closedir(d);
	pthread_mutex_unlock(&disk->lock);
}

void
cai_kv_disk_flush(cai_kv_disk *disk)
{
	pthread_mutex_lock(&disk->lock);
	while (disk->queue_len > 0 || disk->writer_busy)
		pthread_cond_wait(&disk->idle, &disk->lock);
	pthread_mutex_unlock(&disk->lock);
}

void
cai_kv_disk_get_stats(cai_kv_disk *disk, cai_kv_disk_stats *out)
{
	pthread_mutex_lock(&disk->lock);
	*out = disk->stats;
	pthread_mutex_unlock(&disk->lock);
}

const char *
cai_kv_disk_path(const cai_kv_disk *disk)
{
	return disk->path;
}
