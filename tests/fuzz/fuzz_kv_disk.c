/*
 * fuzz_kv_disk.c — a file of the prefix cache's disk tier (src/engine/kv_disk.c) of any bytes:
 * the headers read when the tier opens and indexes its directory, then the whole file read back
 * by a lookup.
 *
 * Input: a flags byte, a mode byte, a token byte, then the file's bytes.  Flags: bit 0 the
 * layout (one layer, or two with a windowed second one, fuzz_kv_disk.h), bit 1 whether the lookup
 * takes a window part, bit 2 the harness writes the right checksum over the mutated bytes (so
 * that the checks after it are reached), bit 3 the pool's only window part is taken beforehand,
 * bits 4-5 what the lookup expects differently from the file (nothing, the parent key, the salt,
 * or the prefix token the token byte picks), bit 6 a byte budget one byte short of the file the
 * tier opens over, bit 7 the file is named by another key than its header's.  The file is
 * written into a fresh directory, in the subdirectory the tier uses and named by the key its
 * header holds, the tier is opened there and the block looked up with the key, parent key, salt
 * and prefix tokens the file holds (when its token count is a whole number of blocks it holds;
 * else one block of zero tokens).  Mode bit 0: the tier opens over a sound stand-in of that
 * block (no window part, no KV), and the file replaces it between the open and the lookup (as
 * another engine process over the same directory, or a hand, may do), so that the lookup's own
 * checks meet what the open's would have refused.
 *
 * What must hold, checked against a model of the format written here from kv_disk.c's comments:
 * the file is indexed at open exactly when its header fits the tier, its name and its size, and
 * the budget holds it (else it is removed); a lookup hits exactly when the file is indexed, its
 * header, size and checksum are right and the lookup expects what it holds; a hit hands back the
 * file's owner and a block whose bytes are the file's KV (the window part only when the file has
 * one, the lookup takes it and the pool had one free); a file that fails a check is removed, a
 * sound file another prefix asked for stays; the statistics' files and bytes always say what the
 * directory holds, and the tier leaves nothing else there.  No crash, no read out of bounds, no
 * leak.
 */

#include "fuzz_common.h"		/* first: it defines _GNU_SOURCE */

#include <xxhash.h>

#include "fuzz_kv_disk.h"

static char base_dir[256];
static char sub_name[2][17];
static uint64_t formats[2];

static void
init(void)
{
	for (int which = 0; which < 2; which++)
	{
		size_t		n;
		uint8_t    *f = fuzz_kvd_make_file(which, 1, false, 1, 2, 3, 4, 0, &n, sub_name[which]);

		memcpy(&formats[which], f + FUZZ_KVD_OFF_FORMAT, sizeof(uint64_t));
		free(f);
	}
	snprintf(base_dir, sizeof(base_dir), "%s/cai_fuzz_kvd.XXXXXX",
			 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(base_dir))
	{
		perror("fuzz_kv_disk: mkdtemp");
		abort();
	}
}

static void
remove_base(void)
{
	fuzz_kvd_remove_tree(base_dir);
}

static uint64_t
get_u64(const uint8_t *file, size_t size, size_t off)
{
	uint64_t	v = 0;

	if (off + 8 <= size)
		memcpy(&v, file + off, 8);
	return v;
}

static uint32_t
get_u32(const uint8_t *file, size_t size, size_t off)
{
	uint32_t	v = 0;

	if (off + 4 <= size)
		memcpy(&v, file + off, 4);
	return v;
}

static bool
exists(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0;
}

/* The names of what dir holds besides . and .. (at most the one file expected). */
static int
count_entries(const char *dir)
{
	DIR		   *d = opendir(dir);
	struct dirent *de;
	int			n = 0;

	FUZZ_CHECK(d != NULL);
	while ((de = readdir(d)) != NULL)
		if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
			n++;
	closedir(d);
	return n;
}

static void
check_stats(cai_kv_disk *disk, bool on_disk, size_t size, const char *path)
{
	cai_kv_disk_stats st;

	cai_kv_disk_get_stats(disk, &st);
	FUZZ_CHECK(exists(path) == on_disk);
	FUZZ_CHECK(st.files == (on_disk ? 1 : 0));
	FUZZ_CHECK(st.bytes == (on_disk ? size : 0));
	FUZZ_CHECK(st.blocks_written == 0 && st.bytes_written == 0 && st.writes_dropped == 0);
}

/* Puts a file in place the way the tier's writer does: a temporary name, renamed over path. */
static void
put_file(const char *path, const uint8_t *bytes, size_t n)
{
	char		tmp[4200];
	int			fd;

	snprintf(tmp, sizeof(tmp), "%s/put.tmp", base_dir);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	FUZZ_CHECK(fd >= 0);
	FUZZ_CHECK(write(fd, bytes, n) == (ssize_t) n);
	close(fd);
	FUZZ_CHECK(rename(tmp, path) == 0);
}

static size_t
payload_for(const cai_kv_layout *L, uint32_t file_flags)
{
	return cai_kv_global_part_bytes(L) + ((file_flags & 1) ? cai_kv_window_part_bytes(L) : 0);
}

/* What both the open and a lookup require of a header, but the token count and the key. */
static bool
header_fits(const uint8_t *file, size_t n, const cai_kv_layout *L, int which)
{
	uint32_t	n_prefix = get_u32(file, n, FUZZ_KVD_OFF_N_PREFIX);
	size_t		payload = payload_for(L, get_u32(file, n, FUZZ_KVD_OFF_FLAGS));

	return n >= FUZZ_KVD_HEADER_BYTES &&
		memcmp(file, "CAIKVD1\n", 8) == 0 && get_u32(file, n, 8) == 1 &&
		get_u32(file, n, 12) == FUZZ_KVD_HEADER_BYTES &&
		get_u64(file, n, FUZZ_KVD_OFF_FINGERPRINT) == FUZZ_KVD_FINGERPRINT &&
		get_u64(file, n, FUZZ_KVD_OFF_FORMAT) == formats[which] &&
		get_u64(file, n, FUZZ_KVD_OFF_PAYLOAD) == payload &&
		n == FUZZ_KVD_HEADER_BYTES + (size_t) n_prefix * 4 + payload;
}

/* The header the open accepts for a file named by name_key. */
static bool
open_accepts(const uint8_t *file, size_t n, const cai_kv_layout *L, int which, uint64_t name_key)
{
	uint32_t	n_prefix = get_u32(file, n, FUZZ_KVD_OFF_N_PREFIX);

	return header_fits(file, n, L, which) && get_u64(file, n, FUZZ_KVD_OFF_KEY) == name_key &&
		n_prefix > 0 && n_prefix % CAI_KV_BLOCK_TOKENS == 0 && n_prefix <= (1u << 24);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool ready;
	uint8_t		flags,
				mode,
				token_pick;
	bool		swap;
	int			which;
	cai_kv_layout L;
	size_t		n;
	uint8_t    *file;
	uint8_t    *standin = NULL;
	size_t		standin_bytes = 0;
	size_t		opened_bytes;
	char		dir[4200];
	char		path[4200];
	uint64_t	key;
	uint32_t	n_prefix,
				file_flags;
	int			lookup_n;
	int32_t    *prefix;
	int			perturb;
	size_t		budget;
	bool		indexed,
				sound,
				names_match,
				expect_hit;
	cai_kv_disk *disk = NULL;
	cai_kv_disk_stats st;
	cai_kv_pool *pool;
	cai_error	err;
	int32_t		held = -1;
	int32_t		block;
	uint64_t	owner = 0;

	if (!ready)
	{
		init();
		atexit(remove_base);
		ready = true;
	}
	if (size < 3)
		return 0;
	flags = data[0];
	mode = data[1];
	token_pick = data[2];
	swap = (mode & 1) != 0;
	which = flags & 1;
	L = fuzz_kvd_layout(which);
	n = size - 3;
	/* exactly the file's bytes, so that the model below reads nothing past them */
	file = malloc(n ? n : 1);
	memcpy(file, data + 3, n);
	if ((flags & 4) && n >= FUZZ_KVD_HEADER_BYTES)
	{
		uint64_t	sum;

		memset(file + FUZZ_KVD_OFF_CHECKSUM, 0, 8);
		sum = XXH3_64bits(file, n);
		memcpy(file + FUZZ_KVD_OFF_CHECKSUM, &sum, 8);
	}
	key = get_u64(file, n, FUZZ_KVD_OFF_KEY) ^ ((flags & 128) ? 1 : 0);
	n_prefix = get_u32(file, n, FUZZ_KVD_OFF_N_PREFIX);
	file_flags = get_u32(file, n, FUZZ_KVD_OFF_FLAGS);

	/* the lookup's token count: the file's when it holds that many */
	lookup_n = n_prefix > 0 && n_prefix % CAI_KV_BLOCK_TOKENS == 0 && n_prefix <= (1u << 24) &&
		(size_t) n_prefix * 4 <= (n > FUZZ_KVD_HEADER_BYTES ? n - FUZZ_KVD_HEADER_BYTES : 0)
		? (int) n_prefix : CAI_KV_BLOCK_TOKENS;

	snprintf(dir, sizeof(dir), "%s/%s", base_dir, sub_name[which]);
	if (mkdir(dir, 0700) != 0 && errno != EEXIST)
	{
		perror(dir);
		abort();
	}
	snprintf(path, sizeof(path), "%s/%016llx.kv", dir, (unsigned long long) key);
	if (swap)
	{
		/* a sound block of the lookup's names and token count, without a window part */
		uint32_t	v;
		uint64_t	w;

		standin_bytes = FUZZ_KVD_HEADER_BYTES + (size_t) lookup_n * 4 + payload_for(&L, 0);
		standin = calloc(1, standin_bytes);
		memcpy(standin, "CAIKVD1\n", 8);
		v = 1;
		memcpy(standin + 8, &v, 4);
		v = FUZZ_KVD_HEADER_BYTES;
		memcpy(standin + 12, &v, 4);
		w = FUZZ_KVD_FINGERPRINT;
		memcpy(standin + FUZZ_KVD_OFF_FINGERPRINT, &w, 8);
		memcpy(standin + FUZZ_KVD_OFF_FORMAT, &formats[which], 8);
		memcpy(standin + FUZZ_KVD_OFF_KEY, &key, 8);
		v = (uint32_t) lookup_n;
		memcpy(standin + FUZZ_KVD_OFF_N_PREFIX, &v, 4);
		w = payload_for(&L, 0);
		memcpy(standin + FUZZ_KVD_OFF_PAYLOAD, &w, 8);
		put_file(path, standin, standin_bytes);
		opened_bytes = standin_bytes;
		indexed = open_accepts(standin, standin_bytes, &L, which, key);
		FUZZ_CHECK(indexed);
	}
	else
	{
		put_file(path, file, n);
		opened_bytes = n;
		indexed = open_accepts(file, n, &L, which, key);
	}
	budget = (flags & 64) ? (opened_bytes > 1 ? opened_bytes - 1 : 1) : (size_t) 1 << 20;
	indexed = indexed && opened_bytes <= budget;

	FUZZ_CHECK(cai_kv_disk_open(base_dir, budget, FUZZ_KVD_FINGERPRINT, &L, FUZZ_KVD_DEVICE, NULL,
								NULL, &disk, &err) == CAI_OK);
	FUZZ_CHECK(strcmp(cai_kv_disk_path(disk), dir) == 0);
	check_stats(disk, indexed, opened_bytes, path);
	FUZZ_CHECK(cai_kv_disk_contains(disk, key) == indexed);
	if (swap)
		put_file(path, file, n);

	/* what the lookup finds: a file it accepts, holding what it expects or another prefix's */
	sound = header_fits(file, n, &L, which) && n_prefix == (uint32_t) lookup_n;
	if (sound)
	{
		uint64_t	stored = get_u64(file, n, FUZZ_KVD_OFF_CHECKSUM);

		memset(file + FUZZ_KVD_OFF_CHECKSUM, 0, 8);
		sound = XXH3_64bits(file, n) == stored;
		memcpy(file + FUZZ_KVD_OFF_CHECKSUM, &stored, 8);
	}
	perturb = (flags >> 4) & 3;
	names_match = get_u64(file, n, FUZZ_KVD_OFF_KEY) == key && perturb == 0;
	expect_hit = indexed && sound && names_match;

	prefix = calloc((size_t) lookup_n, sizeof(int32_t));
	if (n > FUZZ_KVD_HEADER_BYTES)
		memcpy(prefix, file + FUZZ_KVD_HEADER_BYTES,
			   n - FUZZ_KVD_HEADER_BYTES < (size_t) lookup_n * 4 ? n - FUZZ_KVD_HEADER_BYTES
			   : (size_t) lookup_n * 4);
	{
		cai_kv_disk_block b = {
			key, get_u64(file, n, FUZZ_KVD_OFF_PARENT), get_u64(file, n, FUZZ_KVD_OFF_SALT),
			0, prefix, lookup_n
		};

		if (perturb == 1)
			b.parent_key++;
		else if (perturb == 2)
			b.salt ^= 0x80;
		else if (perturb == 3)
			prefix[token_pick % lookup_n]++;

		pool = fuzz_kvd_pool(which);
		if (flags & 8)
			held = cai_kv_block_alloc(pool);
		block = cai_kv_disk_load(disk, &b, pool, (flags & 2) != 0, &owner);
	}

	cai_kv_disk_get_stats(disk, &st);
	if (getenv("FUZZ_VERBOSE"))
		fprintf(stderr, "fuzz_kv_disk: %zu bytes%s, %s, %s, %s\n", n,
				swap ? " (swapped in after the open)" : "", indexed ? "indexed" : "not indexed",
				sound ? "sound" : "refused", block >= 0 ? "hit" : "miss");
	if (block >= 0)
	{
		const uint8_t *payload = file + FUZZ_KVD_HEADER_BYTES + (size_t) lookup_n * 4;
		bool		file_window = which && (file_flags & 1);
		bool		want_window = file_window && (flags & 2) && !(flags & 8);

		FUZZ_CHECK(expect_hit);
		FUZZ_CHECK(st.hits == 1 && st.misses == 0 && st.bytes_read == n);
		FUZZ_CHECK(owner == get_u64(file, n, FUZZ_KVD_OFF_OWNER));
		FUZZ_CHECK(cai_kv_block_refcount(pool, block) == 1);
		FUZZ_CHECK(memcmp(cai_kv_block_layer(pool, block, 0), payload, L.layer_bytes) == 0);
		if (which)
		{
			FUZZ_CHECK(cai_kv_block_has_window(pool, block) == want_window);
			if (want_window)
				FUZZ_CHECK(memcmp(cai_kv_block_layer(pool, block, 1), payload + L.layer_bytes,
								  L.layer_bytes) == 0);
		}
		check_stats(disk, true, n, path);
		cai_kv_block_unref(pool, block);
	}
	else
	{
		FUZZ_CHECK(!expect_hit);
		FUZZ_CHECK(st.hits == 0 && st.bytes_read == 0);
		/* a lookup reads only what was indexed; one it reads and refuses is a miss */
		FUZZ_CHECK(st.misses == (indexed ? 1 : 0));
		if (indexed)
			/* a file that fails a check goes; a sound one another prefix asked for stays */
			check_stats(disk, sound, n, path);
		else
		{
			/* the open removed it, or it came after the open: the tier holds nothing */
			FUZZ_CHECK(st.files == 0 && st.bytes == 0);
			FUZZ_CHECK(exists(path) == swap);
		}
	}
	if (held >= 0)
		cai_kv_block_unref(pool, held);
	FUZZ_CHECK(cai_kv_pool_n_free(pool) == 3);
	cai_kv_disk_close(disk);
	cai_kv_pool_free(pool);

	/* nothing but the file (when it stayed) in the tier's directory */
	FUZZ_CHECK(count_entries(dir) == (exists(path) ? 1 : 0));
	(void) unlink(path);
	free(prefix);
	free(standin);
	free(file);
	return 0;
}
