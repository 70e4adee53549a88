/*
 * weight_cache.c — the cache file of prepared weights (weight_cache.h): its key, its parser,
 * its writer and the directory it lives in.
 */
#include "weight_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "safe_file.h"
#include "util.h"

static const char wcache_magic[8] = {'C', 'A', 'I', 'W', 'G', 'H', 'T', '\0'};

typedef struct wcache_header
{
	char		magic[8];
	uint32_t	version;
	uint32_t	n_sections;
	uint64_t	key;
	uint64_t	file_bytes;
	uint64_t	table_offset;
	uint64_t	checksum;
	uint64_t	reserved[2];
} wcache_header;

_Static_assert(sizeof(wcache_header) == CAI_WCACHE_HEADER_BYTES, "the header is 64 bytes");
_Static_assert(sizeof(cai_wcache_entry) == 24, "a table entry is 24 bytes");

/* ---------------------------------------------------------------------------------------------
 * The key
 * ------------------------------------------------------------------------------------------- */

uint64_t
cai_wcache_key(const cai_wcache_key_params *p)
{
	uint8_t		buf[128];
	size_t		n = 0;
	const uint32_t versions[6] = {
		CAI_WCACHE_FORMAT_VERSION, CAI_INT8_CONVERSION_VERSION, p->backend_layout,
		(uint32_t) sizeof(void *), 0x01020304u,	/* pointer width, byte order (as stored) */
		(uint32_t) p->file_weights | (uint32_t) p->gptq_rounding << 1 |
		(uint32_t) p->two_digit_activations << 2,
	};
	const uint64_t model[2] = {p->model_hash, p->model_bytes};
	const char *backend = p->backend ? p->backend : "";
	size_t		backend_len = strnlen(backend, 32);

	memcpy(buf + n, "pg_cai prepared weights", 23);
	n += 23;
	memcpy(buf + n, versions, sizeof(versions));
	n += sizeof(versions);
	memcpy(buf + n, model, sizeof(model));
	n += sizeof(model);
	memcpy(buf + n, backend, backend_len);
	n += backend_len;
	return XXH3_64bits_withSeed(buf, n, 0x7067636169776763ULL);
}

/* ---------------------------------------------------------------------------------------------
 * Reading
 * ------------------------------------------------------------------------------------------- */

/* The checksum of a file's bytes (data: the whole file; its header's checksum ignored). */
static uint64_t
wcache_checksum(const uint8_t *data, size_t size)
{
	wcache_header h;
	uint64_t	content = XXH3_64bits(data + sizeof(h), size - sizeof(h));

	memcpy(&h, data, sizeof(h));
	h.checksum = 0;
	return XXH3_64bits_withSeed(&h, sizeof(h), content);
}

/* Checks the table: every section after the header, aligned, in order, before the table. */
static cai_status
parse_table(const wcache_header *h, const uint8_t *base, cai_error *err)
{
	const cai_wcache_entry *table = (const cai_wcache_entry *) (base + h->table_offset);
	uint64_t	end = sizeof(wcache_header);

	for (uint32_t i = 0; i < h->n_sections; i++)
	{
		const cai_wcache_entry *e = &table[i];

		if (e->reserved != 0 || e->offset % CAI_WCACHE_ALIGN != 0 || e->offset < end ||
			e->offset > h->table_offset || e->bytes > h->table_offset - e->offset)
			return cai_fail(err, CAI_ERR_FORMAT,
							"weights cache section %u (offset %llu, %llu bytes) is out of place",
							i, (unsigned long long) e->offset, (unsigned long long) e->bytes);
		end = e->offset + e->bytes;
	}
	return CAI_OK;
}

cai_status
cai_wcache_parse(const void *data, size_t size, uint64_t key, bool verify_checksum,
				 cai_wcache_view *out, cai_error *err)
{
	const uint8_t *base = data;
	wcache_header h;

	memset(out, 0, sizeof(*out));
	if (size < sizeof(h))
		return cai_fail(err, CAI_ERR_FORMAT, "weights cache truncated: %zu bytes", size);
	if (((uintptr_t) data & 7) != 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "weights cache bytes not aligned");
	memcpy(&h, base, sizeof(h));
	if (memcmp(h.magic, wcache_magic, sizeof(wcache_magic)) != 0)
		return cai_fail(err, CAI_ERR_FORMAT, "not a weights cache file (bad magic)");
	if (h.version != CAI_WCACHE_FORMAT_VERSION)
		return cai_fail(err, CAI_ERR_FORMAT, "weights cache format version %u, expected %u",
						h.version, CAI_WCACHE_FORMAT_VERSION);
	if (h.key != key)
		return cai_fail(err, CAI_ERR_FORMAT,
						"weights cache key %016llx, expected %016llx (another model or settings)",
						(unsigned long long) h.key, (unsigned long long) key);
	if (h.file_bytes != size)
		return cai_fail(err, CAI_ERR_FORMAT, "weights cache truncated: %zu bytes, header says %llu",
						size, (unsigned long long) h.file_bytes);
	if (h.reserved[0] != 0 || h.reserved[1] != 0 || h.table_offset < sizeof(h) ||
		h.table_offset % 8 != 0 || h.table_offset > size ||
		h.n_sections > (size - h.table_offset) / sizeof(cai_wcache_entry) ||
		h.table_offset + (uint64_t) h.n_sections * sizeof(cai_wcache_entry) != size)
		return cai_fail(err, CAI_ERR_FORMAT,
						"weights cache table (%u sections at %llu) does not fit the file",
						h.n_sections, (unsigned long long) h.table_offset);
	if (parse_table(&h, base, err) != CAI_OK)
		return CAI_ERR_FORMAT;
	if (verify_checksum && wcache_checksum(base, size) != h.checksum)
		return cai_fail(err, CAI_ERR_FORMAT, "weights cache checksum mismatch (corrupt file)");
	out->base = base;
	out->size = size;
	out->key = key;
	out->n_sections = h.n_sections;
	out->table = (const cai_wcache_entry *) (base + h.table_offset);
	return CAI_OK;
}

cai_status
cai_wcache_next(const cai_wcache_view *v, uint32_t *cursor, uint32_t tag, const void **data,
				size_t *bytes, cai_error *err)
{
	const cai_wcache_entry *e;

	if (*cursor >= v->n_sections)
		return cai_fail(err, CAI_ERR_FORMAT, "weights cache has %u sections, section %u wanted",
						v->n_sections, *cursor);
	e = &v->table[*cursor];
	if (e->tag != tag)
		return cai_fail(err, CAI_ERR_FORMAT, "weights cache section %u is tagged %08x, not %08x",
						*cursor, e->tag, tag);
	*data = v->base + e->offset;
	*bytes = (size_t) e->bytes;
	(*cursor)++;
	return CAI_OK;
}

cai_status
cai_wcache_map_open(const char *path, uint64_t key, cai_wcache_map *out, cai_error *err)
{
	off_t		size = 0;
	int			open_errno = 0;
	int			fd;
	uint8_t    *addr;
	size_t		done = 0;
	cai_status	s;

	memset(out, 0, sizeof(*out));
	/* a link or a FIFO planted at the name is refused (and replaced by the next write) */
	fd = cai_safe_open_regular(path, &size, err, &open_errno);
	if (fd < 0)
		return open_errno == ENOENT ? CAI_ERR_NOT_FOUND : CAI_ERR_IO;
	if ((size_t) size < CAI_WCACHE_HEADER_BYTES)
	{
		close(fd);
		return cai_fail(err, CAI_ERR_FORMAT, "weights cache truncated: %lld bytes",
						(long long) size);
	}

	/*
	 * Read into memory of its own rather than mapped: the file's pages are 4 KiB, on which a
	 * decode step streaming every weight misses the TLB at every page and the hardware
	 * prefetcher stops at each page's end; huge pages (cai_alloc_large) measured 15-20 % more
	 * decode tokens/s on a 1B model.  The checksum reads every byte at once anyway, and what
	 * is checked is then what the GEMMs read.
	 */
	addr = cai_alloc_large((size_t) size);
	if (!addr)
	{
		close(fd);
		return cai_fail(err, CAI_ERR_IO, "out of memory for weights cache \"%s\" (%lld bytes)",
						path, (long long) size);
	}
	while (done < (size_t) size)
	{
		ssize_t		got = read(fd, addr + done, (size_t) size - done);

		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
		{
			int			read_errno = got < 0 ? errno : 0;

			close(fd);
			free(addr);
			return cai_fail(err, CAI_ERR_IO, "could not read weights cache \"%s\": %s", path,
							read_errno ? strerror(read_errno) : "the file shrank while read");
		}
		done += (size_t) got;
	}
	close(fd);
	s = cai_wcache_parse(addr, (size_t) size, key, true, &out->view, err);
	if (s != CAI_OK)
	{
		free(addr);
		return s;
	}
	out->addr = addr;
	out->size = (size_t) size;
	return CAI_OK;
}

void
cai_wcache_map_close(cai_wcache_map *m)
{
	if (m && m->addr)
		free(m->addr);
	if (m)
		memset(m, 0, sizeof(*m));
}

/* ---------------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------------- */

struct cai_wcache_writer
{
	int			fd;
	uint64_t	key;
	uint64_t	offset;			/* bytes written so far */
	XXH3_state_t *hash;			/* of every byte after the header */
	cai_wcache_entry *table;
	uint32_t	n_sections;
	uint32_t	cap;
	char	   *path;
	char	   *tmp_path;
};

/* Writes bytes at the writer's end, hashing them. */
static cai_status
write_all(cai_wcache_writer *w, const void *data, size_t bytes, cai_error *err)
{
	const uint8_t *p = data;

	XXH3_64bits_update(w->hash, data, bytes);
	while (bytes > 0)
	{
		ssize_t		n = write(w->fd, p, bytes > ((size_t) 1 << 30) ? ((size_t) 1 << 30) : bytes);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return cai_fail(err, CAI_ERR_IO, "could not write weights cache \"%s\": %s",
							w->tmp_path, n < 0 ? strerror(errno) : "short write");
		p += n;
		bytes -= (size_t) n;
		w->offset += (uint64_t) n;
	}
	return CAI_OK;
}

static cai_status
pad_to(cai_wcache_writer *w, uint64_t align, cai_error *err)
{
	static const uint8_t zeros[CAI_WCACHE_ALIGN];
	size_t		pad = (size_t) ((align - w->offset % align) % align);

	return pad ? write_all(w, zeros, pad, err) : CAI_OK;
}

cai_status
cai_wcache_writer_open(const char *path, uint64_t key, cai_wcache_writer **out, cai_error *err)
{
	cai_wcache_writer *w = calloc(1, sizeof(*w));
	size_t		len = strlen(path) + 32;
	wcache_header h;

	*out = NULL;
	if (!w || !(w->path = strdup(path)) || !(w->tmp_path = malloc(len)) ||
		!(w->hash = XXH3_createState()))
	{
		cai_wcache_writer_abort(w);
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory writing the weights cache");
	}
	/*
	 * Created exclusively, never through a link: a name that exists (a file or a link someone
	 * planted, a crashed writer's file) is passed over for another.  The pid makes the name this
	 * writer's, so that cai_wcache_remove_stale spares a live one's; the random part makes it
	 * unguessable.
	 */
	w->fd = -1;
	for (int attempt = 0; attempt < 8 && w->fd < 0; attempt++)
	{
		uint32_t	nonce;
		int			create_errno = 0;

		if (getrandom(&nonce, sizeof(nonce), GRND_NONBLOCK) != (ssize_t) sizeof(nonce))
			nonce = (uint32_t) XXH3_64bits_withSeed(&attempt, sizeof(attempt),
													(uint64_t) (cai_now_seconds() * 1e9));
		snprintf(w->tmp_path, len, "%s.%d.%08x.tmp", path, (int) getpid(), (unsigned) nonce);
		w->fd = cai_safe_create(w->tmp_path, err, &create_errno);
		if (w->fd < 0 && create_errno != EEXIST)
			break;
	}
	if (w->fd < 0)
	{
		free(w->tmp_path);
		w->tmp_path = NULL;
		cai_wcache_writer_abort(w);
		return CAI_ERR_IO;
	}
	w->key = key;
	XXH3_64bits_reset(w->hash);
	/* a zero header for now: a file cut short here has no magic and is refused */
	memset(&h, 0, sizeof(h));
	if (write(w->fd, &h, sizeof(h)) != (ssize_t) sizeof(h))
	{
		cai_status	s = cai_fail(err, CAI_ERR_IO, "could not write weights cache \"%s\": %s",
								 w->tmp_path, strerror(errno));

		cai_wcache_writer_abort(w);
		return s;
	}
	w->offset = sizeof(h);
	*out = w;
	return CAI_OK;
}

cai_status
cai_wcache_add(cai_wcache_writer *w, uint32_t tag, const void *data, size_t bytes,
			   cai_error *err)
{
	cai_status	s;

	if (w->n_sections == w->cap)
	{
		uint32_t	cap = w->cap ? 2 * w->cap : 64;
		cai_wcache_entry *t = realloc(w->table, (size_t) cap * sizeof(*t));

		if (!t)
			return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory writing the weights cache");
		w->table = t;
		w->cap = cap;
	}
	if ((s = pad_to(w, CAI_WCACHE_ALIGN, err)) != CAI_OK)
		return s;
	w->table[w->n_sections] = (cai_wcache_entry) {.tag = tag, .offset = w->offset, .bytes = bytes};
	if (bytes > 0 && (s = write_all(w, data, bytes, err)) != CAI_OK)
		return s;
	w->n_sections++;
	return CAI_OK;
}

/* fsync of the directory holding path, so that the rename is durable too. */
static void
sync_parent(const char *path)
{
	char	   *dir = strdup(path);
	char	   *slash = dir ? strrchr(dir, '/') : NULL;
	int			fd;

	if (!dir)
		return;
	if (slash == dir)
		slash[1] = '\0';
	else if (slash)
		*slash = '\0';
	fd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0)
	{
		(void) fsync(fd);
		close(fd);
	}
	free(dir);
}

cai_status
cai_wcache_writer_commit(cai_wcache_writer *w, cai_error *err)
{
	wcache_header h;
	cai_status	s;

	if ((s = pad_to(w, 8, err)) != CAI_OK)
		goto fail;
	memset(&h, 0, sizeof(h));
	memcpy(h.magic, wcache_magic, sizeof(h.magic));
	h.version = CAI_WCACHE_FORMAT_VERSION;
	h.n_sections = w->n_sections;
	h.key = w->key;
	h.table_offset = w->offset;
	if (w->n_sections > 0 &&
		(s = write_all(w, w->table, (size_t) w->n_sections * sizeof(*w->table), err)) != CAI_OK)
		goto fail;
	h.file_bytes = w->offset;
	h.checksum = XXH3_64bits_withSeed(&h, sizeof(h), XXH3_64bits_digest(w->hash));
	if (pwrite(w->fd, &h, sizeof(h), 0) != (ssize_t) sizeof(h) || fsync(w->fd) != 0)
	{
		s = cai_fail(err, CAI_ERR_IO, "could not write weights cache \"%s\": %s", w->tmp_path,
					 strerror(errno));
		goto fail;
	}
	close(w->fd);
	w->fd = -1;
	if (rename(w->tmp_path, w->path) != 0)
	{
		s = cai_fail(err, CAI_ERR_IO, "could not rename weights cache \"%s\": %s", w->tmp_path,
					 strerror(errno));
		goto fail;
	}
	sync_parent(w->path);
	free(w->tmp_path);
	w->tmp_path = NULL;
	cai_wcache_writer_abort(w);
	return CAI_OK;

fail:
	cai_wcache_writer_abort(w);
	return s;
}

void
cai_wcache_writer_abort(cai_wcache_writer *w)
{
	if (!w)
		return;
	if (w->fd > 0)
		close(w->fd);
	if (w->tmp_path)
		(void) unlink(w->tmp_path);
	if (w->hash)
		XXH3_freeState(w->hash);
	free(w->table);
	free(w->path);
	free(w->tmp_path);
	free(w);
}

/* ---------------------------------------------------------------------------------------------
 * The directory
 * ------------------------------------------------------------------------------------------- */

/* The model file's base name as a file name prefix (unsafe characters become '_'). */
static void
model_stem(const char *model_path, char *out, size_t out_size)
{
	const char *base = strrchr(model_path, '/');
	size_t		n = 0;

	base = base ? base + 1 : model_path;
	for (; *base && n + 1 < out_size && n < 128; base++)
	{
		char		c = *base;
		bool		ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			(c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';

		out[n++] = ok ? c : '_';
	}
	out[n] = '\0';
}

bool
cai_wcache_path(const char *dir, const char *model_path, uint64_t key, char *out,
				size_t out_size)
{
	char		stem[160];
	int			n;

	model_stem(model_path, stem, sizeof(stem));
	n = snprintf(out, out_size, "%s/%s-%016llx%s", dir, stem, (unsigned long long) key,
				 CAI_WCACHE_SUFFIX);
	return n > 0 && (size_t) n < out_size;
}

/*
 * Whether name is one of stem's cache files: stem-<16 hex>.caiw, or a temporary file
 * stem-<16 hex>.caiw.<pid>.tmp whose writer is gone.
 */
static bool
is_stale_candidate(const char *name, const char *stem)
{
	size_t		len = strlen(stem);
	const char *p = name + len;
	const char *tmp;
	long		pid;

	if (strncmp(name, stem, len) != 0 || *p++ != '-')
		return false;
	for (int i = 0; i < 16; i++, p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	if (strncmp(p, CAI_WCACHE_SUFFIX, strlen(CAI_WCACHE_SUFFIX)) != 0)
		return false;
	p += strlen(CAI_WCACHE_SUFFIX);
	if (*p == '\0')
		return true;
	if (*p++ != '.' || !(tmp = strstr(p, ".tmp")) || strcmp(tmp, ".tmp") != 0)
		return false;
	pid = strtol(p, NULL, 10);
	/* a writer still alive (or one we may not signal) keeps its file */
	return pid > 0 && kill((pid_t) pid, 0) != 0 && errno == ESRCH;
}

int
cai_wcache_remove_stale(const char *dir, const char *model_path, const char *keep)
{
	char		stem[160];
	const char *keep_name = keep ? strrchr(keep, '/') : NULL;
	DIR		   *d = opendir(dir);
	struct dirent *e;
	int			removed = 0;

	if (!d)
		return 0;
	keep_name = keep_name ? keep_name + 1 : keep;
	model_stem(model_path, stem, sizeof(stem));
	while ((e = readdir(d)) != NULL)
	{
		char		path[4096];

		if ((keep_name && strcmp(e->d_name, keep_name) == 0) ||
			!is_stale_candidate(e->d_name, stem))
			continue;
		if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) < (int) sizeof(path) &&
			unlink(path) == 0)
			removed++;
	}
	closedir(d);
	return removed;
}

cai_status
cai_wcache_make_dir(const char *dir, cai_error *err)
{
	return cai_safe_dir_make(dir, err);
}
