/*
 * fuzz_kv_disk.c — a file of the prefix cache's disk tier (src/engine/kv_disk.c) of any bytes:
 * the headers read when the tier opens and indexes its directory, then the whole file read back
 * by a lookup.
 *
 * Input: a flags byte, a token byte, then the file's bytes.  Flags: bit 0 the layout (one layer,
 * or two with a windowed second one, fuzz_kv_disk.h), bit 1 whether the lookup takes a window
 * part, bit 2 the harness writes the right checksum over the mutated bytes (so that the checks
 * after it are reached), bit 3 the pool's only window part is taken beforehand, bits 4-5 what the
 * lookup expects differently from the file (nothing, the parent key, the salt, or the prefix
 * token the token byte picks), bit 6 a byte budget one byte short of the file.  The file is
 * written into a fresh directory under the subdirectory and name the tier uses (the key is read
 * from where the header keeps it), the tier is opened there and the block looked up with the
 * key, parent key, salt and prefix tokens the file holds (when its token count is a whole
 * number of blocks; else one block of zero tokens).
 *
 * What must hold, checked against a model of the format written here from kv_disk.c's comments:
 * the file is indexed at open exactly when its header fits the tier and its size, and the budget
 * holds it (else it is removed); a lookup hits exactly when it is indexed, its checksum is right
 * and the lookup expects what it holds; a hit hands back the file's owner and a block whose
 * bytes are the file's KV (the window part only when the file has one, the lookup takes it and
 * the pool had one free); a file whose checksum fails is removed, a sound file another prefix
 * asked for stays; the statistics' files and bytes always say what the directory holds, and the
 * tier leaves nothing else there.  No crash, no read out of bounds, no leak.
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

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool ready;
	uint8_t		flags,
				token_pick;
	int			which;
	cai_kv_layout L;
	size_t		n;
	uint8_t    *file;
	char		dir[4200];
	char		path[4200];
	int			fd;
	uint64_t	key;
	uint32_t	n_prefix,
				file_flags;
	int			lookup_n;
	int32_t    *prefix;
	int			perturb;
	size_t		budget;
	bool		header_ok,
				indexed,
				checksum_ok,
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
	if (size < 2)
		return 0;
	flags = data[0];
	token_pick = data[1];
	which = flags & 1;
	L = fuzz_kvd_layout(which);
	n = size - 2;
	/* exactly the file's bytes, so that the model below reads nothing past them */
	file = malloc(n ? n : 1);
	memcpy(file, data + 2, n);
	if ((flags & 4) && n >= FUZZ_KVD_HEADER_BYTES)
	{
		uint64_t	sum;

		memset(file + FUZZ_KVD_OFF_CHECKSUM, 0, 8);
		sum = XXH3_64bits(file, n);
		memcpy(file + FUZZ_KVD_OFF_CHECKSUM, &sum, 8);
	}
	key = get_u64(file, n, FUZZ_KVD_OFF_KEY);
	n_prefix = get_u32(file, n, FUZZ_KVD_OFF_N_PREFIX);
	file_flags = get_u32(file, n, FUZZ_KVD_OFF_FLAGS);

	snprintf(dir, sizeof(dir), "%s/%s", base_dir, sub_name[which]);
	if (mkdir(dir, 0700) != 0 && errno != EEXIST)
	{
		perror(dir);
		abort();
	}
	snprintf(path, sizeof(path), "%s/%016llx.kv", dir, (unsigned long long) key);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	FUZZ_CHECK(fd >= 0);
	FUZZ_CHECK(write(fd, file, n) == (ssize_t) n);
	close(fd);

	/* the header the tier's open accepts */
	{
		bool		w = (file_flags & 1) != 0;
		size_t		payload = cai_kv_global_part_bytes(&L) + (w ? cai_kv_window_part_bytes(&L) : 0);

		header_ok = n >= FUZZ_KVD_HEADER_BYTES &&
			memcmp(file, "CAIKVD1\n", 8) == 0 && get_u32(file, n, 8) == 1 &&
			get_u32(file, n, 12) == FUZZ_KVD_HEADER_BYTES &&
			get_u64(file, n, FUZZ_KVD_OFF_FINGERPRINT) == FUZZ_KVD_FINGERPRINT &&
			get_u64(file, n, FUZZ_KVD_OFF_FORMAT) == formats[which] &&
			n_prefix > 0 && n_prefix % CAI_KV_BLOCK_TOKENS == 0 && n_prefix <= (1u << 24) &&
			get_u64(file, n, FUZZ_KVD_OFF_PAYLOAD) == payload &&
			n == FUZZ_KVD_HEADER_BYTES + (size_t) n_prefix * 4 + payload;
	}
	budget = (flags & 64) ? (n > 1 ? n - 1 : 1) : (size_t) 1 << 20;
	indexed = header_ok && n <= budget;

	FUZZ_CHECK(cai_kv_disk_open(base_dir, budget, FUZZ_KVD_FINGERPRINT, &L, FUZZ_KVD_DEVICE, NULL,
								NULL, &disk, &err) == CAI_OK);
	FUZZ_CHECK(strcmp(cai_kv_disk_path(disk), dir) == 0);
	check_stats(disk, indexed, n, path);
	FUZZ_CHECK(cai_kv_disk_contains(disk, key) == indexed);

	/* the lookup: what the file holds, but for the perturbation */
	lookup_n = n_prefix > 0 && n_prefix % CAI_KV_BLOCK_TOKENS == 0 &&
		(size_t) n_prefix * 4 <= (n > FUZZ_KVD_HEADER_BYTES ? n - FUZZ_KVD_HEADER_BYTES : 0)
		? (int) n_prefix : CAI_KV_BLOCK_TOKENS;
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

		perturb = (flags >> 4) & 3;
		if (perturb == 1)
			b.parent_key++;
		else if (perturb == 2)
			b.salt ^= 0x80;
		else if (perturb == 3)
			prefix[token_pick % lookup_n]++;

		checksum_ok = n >= FUZZ_KVD_HEADER_BYTES;
		if (checksum_ok)
		{
			uint64_t	stored = get_u64(file, n, FUZZ_KVD_OFF_CHECKSUM);

			memset(file + FUZZ_KVD_OFF_CHECKSUM, 0, 8);
			checksum_ok = XXH3_64bits(file, n) == stored;
			memcpy(file + FUZZ_KVD_OFF_CHECKSUM, &stored, 8);
		}
		/* an indexed file holds lookup_n tokens: its size says so */
		expect_hit = indexed && checksum_ok && perturb == 0;

		pool = fuzz_kvd_pool(which);
		if (flags & 8)
			held = cai_kv_block_alloc(pool);
		block = cai_kv_disk_load(disk, &b, pool, (flags & 2) != 0, &owner);
	}

	cai_kv_disk_get_stats(disk, &st);
	if (getenv("FUZZ_VERBOSE"))
		fprintf(stderr, "fuzz_kv_disk: %zu bytes, header %s, %s, checksum %s, %s\n", n,
				header_ok ? "fits" : "refused", indexed ? "indexed" : "not indexed",
				checksum_ok ? "right" : "wrong", block >= 0 ? "hit" : "miss");
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
		/* a file that fails its checksum goes; a sound one another prefix asked for stays */
		check_stats(disk, indexed && checksum_ok, n, path);
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
	free(file);
	return 0;
}
