/*
 * test_kv_disk.c — the prefix cache's disk tier: blocks written when cached and read back after
 * the memory cache lost them (evicted, or a new engine over the same directory), byte for byte;
 * a flipped byte, a truncated file or files swapped between two blocks are misses; salts stay
 * apart on disk; forgetting an owner and resetting remove the files; the byte budget evicts the
 * least recently used files; a directory that cannot be made or written leaves the cache working
 * in memory alone.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv.h"
#include "kv_disk.h"
#include "prefix_cache.h"
#include "test.h"

#define BT CAI_KV_BLOCK_TOKENS
#define FINGERPRINT UINT64_C(0x5eed)

/* One layer, one KV head, head_dim 4: 256-byte blocks. */
static cai_kv_layout
tiny_layout(void)
{
	cai_kv_layout layout = {0};

	layout.n_kv_layers = 1;
	layout.n_kv_heads = 1;
	layout.head_dim = 4;
	layout.layer_bytes = 2 * BT * 4 + 2 * BT * sizeof(float);
	layout.block_bytes = layout.layer_bytes;
	return layout;
}

/* The bytes of one block's file: header, one block of prefix tokens per depth, the KV. */
#define FILE_BYTES(depth) (88 + 4 * BT * (depth) + 256)

static void
make_temp_dir(char *buf, size_t len)
{
	snprintf(buf, len, "/tmp/cai_kv_disk.XXXXXX");
	if (!mkdtemp(buf))
		buf[0] = '\0';
}

static void
remove_tree(const char *dir)
{
	char		cmd[600];

	snprintf(cmd, sizeof(cmd), "chmod -R u+rwx '%s' 2>/dev/null; rm -rf '%s'", dir, dir);
	if (system(cmd) != 0)
		fprintf(stderr, "    could not remove %s\n", dir);
}

typedef struct tier
{
	cai_kv_pool *pool;
	cai_prefix_cache *cache;
	cai_kv_disk *disk;
} tier;

static int	log_lines;

static void
count_log(void *arg, const char *line)
{
	(void) arg;
	(void) line;
	log_lines++;
}

static cai_kv_disk *
open_disk(const char *dir, size_t budget)
{
	cai_kv_layout layout = tiny_layout();
	cai_kv_disk *disk = NULL;
	cai_error	err;

	if (cai_kv_disk_open(dir, budget, FINGERPRINT, &layout, "cpu", count_log, NULL, &disk,
						 &err) != CAI_OK)
		return NULL;
	return disk;
}

/* A pool of 64 blocks and a memory cache of budget_blocks over disk (which may be NULL). */
static bool
tier_make(tier *t, int budget_blocks, cai_kv_disk *disk)
{
	cai_kv_layout layout = tiny_layout();
	cai_error	err;

	memset(t, 0, sizeof(*t));
	if (cai_kv_pool_create(&layout, 64, &t->pool, &err) != CAI_OK)
		return false;
	if (cai_prefix_cache_create(t->pool, (size_t) budget_blocks * layout.block_bytes, FINGERPRINT,
								&t->cache, &err) != CAI_OK)
		return false;
	t->disk = disk;
	cai_prefix_cache_set_disk(t->cache, disk);
	return true;
}

/* Frees the memory cache and the pool, as an engine that goes away does; the disk stays. */
static void
tier_free_memory(tier *t)
{
	cai_prefix_cache_free(t->cache);
	cai_kv_pool_free(t->pool);
	t->cache = NULL;
	t->pool = NULL;
}

static void
fill_tokens(int32_t *tokens, int n, int tag)
{
	for (int i = 0; i < n; i++)
		tokens[i] = tag * 1000 + i;
}

/* The KV bytes the test writes into block number i of a sequence tagged tag. */
static uint8_t
kv_byte(int tag, int i, size_t j)
{
	return (uint8_t) (tag * 31 + i * 7 + j * 13 + 1);
}

/* Caches n_blocks full blocks of tokens (tagged tag) under salt and owner, with known KV. */
static void
cache_sequence(tier *t, uint64_t salt, uint64_t owner, const int32_t *tokens, int n_blocks,
			   int tag)
{
	int32_t		blocks[16];

	for (int i = 0; i < n_blocks; i++)
	{
		uint8_t    *kv;

		blocks[i] = cai_kv_block_alloc(t->pool);
		CHECK(blocks[i] >= 0);
		kv = cai_kv_block_layer(t->pool, blocks[i], 0);
		for (size_t j = 0; j < 256; j++)
			kv[j] = kv_byte(tag, i, j);
	}
	cai_prefix_cache_insert_owned(t->cache, salt, owner, tokens, n_blocks * BT, blocks, n_blocks);
	for (int i = 0; i < n_blocks; i++)
		cai_kv_block_unref(t->pool, blocks[i]);
}

/* Looks up tokens; returns the blocks hit, after checking their KV is the one cached. */
static int
lookup_checked(tier *t, uint64_t salt, const int32_t *tokens, int n_blocks, int tag)
{
	int32_t		out[16];
	int			hit = cai_prefix_cache_lookup(t->cache, salt, tokens, n_blocks * BT + 1, out, 16);

	for (int i = 0; i < hit; i++)
	{
		const uint8_t *kv = cai_kv_block_layer(t->pool, out[i], 0);
		bool		same = true;

		for (size_t j = 0; j < 256; j++)
			same = same && kv[j] == kv_byte(tag, i, j);
		CHECK_MSG(same, "block %d read back with other bytes", i);
		cai_kv_block_unref(t->pool, out[i]);
	}
	return hit;
}

/* The tier's files (*.kv), their names in names[] when not NULL. */
static int
list_files(cai_kv_disk *disk, char names[][300], int max)
{
	DIR		   *d = opendir(cai_kv_disk_path(disk));
	struct dirent *de;
	int			n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)) != NULL)
	{
		size_t		len = strlen(de->d_name);

		if (len > 3 && strcmp(de->d_name + len - 3, ".kv") == 0)
		{
			if (names && n < max)
				snprintf(names[n], 300, "%s/%s", cai_kv_disk_path(disk), de->d_name);
			n++;
		}
	}
	closedir(d);
	return n;
}

static cai_kv_disk_stats
disk_stats(cai_kv_disk *disk)
{
	cai_kv_disk_stats s;

	cai_kv_disk_get_stats(disk, &s);
	return s;
}

TEST(kv_disk_blocks_outlive_memory_and_the_engine)
{
	char		dir[64];
	tier		t;
	int32_t		a[3 * BT + 1], b[3 * BT + 1];
	struct stat st;
	char		names[8][300];

	make_temp_dir(dir, sizeof(dir));
	CHECK(dir[0] != '\0');
	CHECK(tier_make(&t, 3, open_disk(dir, 1 << 20)));
	CHECK(t.disk != NULL);
	if (!t.disk)
		return;
	fill_tokens(a, 3 * BT + 1, 1);
	fill_tokens(b, 3 * BT + 1, 2);

	/* cached, written off the caller's thread, then evicted from memory by another sequence */
	cache_sequence(&t, 1, 0, a, 3, 1);
	cai_kv_disk_flush(t.disk);
	CHECK_EQ_INT(list_files(t.disk, names, 8), 3);
	CHECK(stat(names[0], &st) == 0 && (st.st_mode & 0777) == 0600);
	CHECK(stat(cai_kv_disk_path(t.disk), &st) == 0 && (st.st_mode & 0777) == 0700);
	cache_sequence(&t, 1, 0, b, 3, 2);
	cai_kv_disk_flush(t.disk);
	CHECK_EQ_INT(list_files(t.disk, NULL, 0), 6);

	/* a's blocks come back from disk, byte for byte, and are memory hits from then on */
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 3, 1), 3);
	CHECK_EQ_INT(disk_stats(t.disk).hits, 3);
	CHECK_EQ_INT(disk_stats(t.disk).bytes_read, 3 * FILE_BYTES(2));
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 3, 1), 3);
	CHECK_EQ_INT(disk_stats(t.disk).hits, 3);

	/* a new engine (new memory cache, the tier reopened) finds both sequences from the headers */
	tier_free_memory(&t);
	cai_kv_disk_close(t.disk);
	CHECK(tier_make(&t, 8, open_disk(dir, 1 << 20)));
	CHECK(t.disk != NULL);
	if (t.disk)
	{
		CHECK_EQ_INT(disk_stats(t.disk).files, 6);
		CHECK_EQ_INT(lookup_checked(&t, 1, b, 3, 2), 3);
		CHECK_EQ_INT(lookup_checked(&t, 1, a, 3, 1), 3);
		/* a prompt that diverges in block 1 gets block 0 alone */
		a[BT + 3] = -7;
		CHECK_EQ_INT(lookup_checked(&t, 1, a, 3, 1), 1);
	}
	tier_free_memory(&t);
	cai_kv_disk_close(t.disk);

	/* another model (fingerprint) or KV format never sees these files */
	{
		cai_kv_layout other = tiny_layout();
		cai_kv_disk *d2 = NULL;
		cai_error	err;

		CHECK(cai_kv_disk_open(dir, 1 << 20, FINGERPRINT + 1, &other, "cpu", NULL, NULL, &d2,
							   &err) == CAI_OK);
		if (d2)
			CHECK_EQ_INT(disk_stats(d2).files, 0);
		cai_kv_disk_close(d2);
		other.key_digits = 2;
		CHECK(cai_kv_disk_open(dir, 1 << 20, FINGERPRINT, &other, "cpu", NULL, NULL, &d2,
							   &err) == CAI_OK);
		if (d2)
			CHECK_EQ_INT(disk_stats(d2).files, 0);
		cai_kv_disk_close(d2);
	}
	remove_tree(dir);
}

/*
 * A working set larger than memory: a turn whose blocks memory refuses (over budget, everything
 * else in use) still reaches the disk, and a lookup whose blocks memory cannot take back still
 * gets them, byte for byte, as the caller's own.
 */
TEST(kv_disk_serves_what_memory_cannot_hold)
{
	char		dir[64];
	tier		t;
	int32_t		a[2 * BT + 1], b[3 * BT + 1];
	int32_t		pinned[2];
	cai_prefix_cache_stats cs;

	make_temp_dir(dir, sizeof(dir));
	CHECK(tier_make(&t, 2, open_disk(dir, 1 << 20)));
	CHECK(t.disk != NULL);
	if (!t.disk)
		return;
	fill_tokens(a, 2 * BT + 1, 1);
	fill_tokens(b, 3 * BT + 1, 2);

	/* a fills memory and a running sequence holds it */
	cache_sequence(&t, 1, 0, a, 2, 1);
	CHECK_EQ_INT(cai_prefix_cache_lookup(t.cache, 1, a, 2 * BT + 1, pinned, 2), 2);

	/* b's turn finishes: memory cannot take a block of it, the disk takes all three */
	cache_sequence(&t, 1, 0, b, 3, 2);
	cai_kv_disk_flush(t.disk);
	cai_prefix_cache_get_stats(t.cache, &cs);
	CHECK_EQ_INT(cs.blocks, 2);
	CHECK_EQ_INT(list_files(t.disk, NULL, 0), 5);

	/* b's next turn, a still held: read back uncached, the caller's references alone */
	CHECK_EQ_INT(lookup_checked(&t, 1, b, 3, 2), 3);
	CHECK_EQ_INT(disk_stats(t.disk).hits, 3);
	cai_prefix_cache_get_stats(t.cache, &cs);
	CHECK_EQ_INT(cs.blocks, 2);
	CHECK_EQ_INT(cs.disk_hit_tokens, 3 * BT);
	CHECK_EQ_INT(cai_kv_pool_n_free(t.pool), 64 - 2);

	cai_kv_block_unref(t.pool, pinned[0]);
	cai_kv_block_unref(t.pool, pinned[1]);
	tier_free_memory(&t);
	cai_kv_disk_close(t.disk);
	remove_tree(dir);
}

/* Writes bytes at offset of path (or truncates it to offset when bytes is NULL). */
static bool
tamper(const char *path, off_t offset, const void *bytes, size_t len)
{
	int			fd = open(path, O_WRONLY);
	bool		ok;

	if (fd < 0)
		return false;
	ok = bytes ? pwrite(fd, bytes, len, offset) == (ssize_t) len : ftruncate(fd, offset) == 0;
	close(fd);
	return ok;
}

static bool
read_whole(const char *path, uint8_t *buf, size_t len)
{
	FILE	   *f = fopen(path, "rb");
	bool		ok;

	if (!f)
		return false;
	ok = fread(buf, 1, len, f) == len;
	fclose(f);
	return ok;
}

static bool
write_whole(const char *path, const uint8_t *buf, size_t len)
{
	FILE	   *f = fopen(path, "wb");
	bool		ok;

	if (!f)
		return false;
	ok = fwrite(buf, 1, len, f) == len;
	return fclose(f) == 0 && ok;
}

TEST(kv_disk_damaged_files_are_misses)
{
	char		dir[64];
	tier		t;
	int32_t		a[BT + 1], b[BT + 1];
	char		names[4][300];
	uint8_t		fa[FILE_BYTES(1)], fb[FILE_BYTES(1)];
	uint8_t		flip;

	make_temp_dir(dir, sizeof(dir));
	CHECK(tier_make(&t, 8, open_disk(dir, 1 << 20)));
	CHECK(t.disk != NULL);
	if (!t.disk)
		return;
	fill_tokens(a, BT + 1, 1);
	fill_tokens(b, BT + 1, 2);

	/* a flipped KV byte: the checksum fails, the lookup misses, the file goes */
	cache_sequence(&t, 1, 0, a, 1, 1);
	cai_kv_disk_flush(t.disk);
	CHECK_EQ_INT(list_files(t.disk, names, 4), 1);
	CHECK(read_whole(names[0], fa, sizeof(fa)));
	flip = fa[sizeof(fa) - 5] ^ 0x10;
	CHECK(tamper(names[0], sizeof(fa) - 5, &flip, 1));
	tier_free_memory(&t);
	CHECK(tier_make(&t, 8, t.disk));
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 1, 1), 0);
	CHECK_EQ_INT(disk_stats(t.disk).misses, 1);
	CHECK_EQ_INT(list_files(t.disk, NULL, 0), 0);

	/* a flipped prefix token: a miss */
	cache_sequence(&t, 1, 0, a, 1, 1);
	cai_kv_disk_flush(t.disk);
	CHECK_EQ_INT(list_files(t.disk, names, 4), 1);
	CHECK(tamper(names[0], 88 + 4, "\x01\x00\x00\x00", 4));
	tier_free_memory(&t);
	CHECK(tier_make(&t, 8, t.disk));
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 1, 1), 0);

	/* a truncated file: a miss when read, and dropped by the next open's index */
	cache_sequence(&t, 1, 0, a, 1, 1);
	cai_kv_disk_flush(t.disk);
	CHECK_EQ_INT(list_files(t.disk, names, 4), 1);
	CHECK(tamper(names[0], FILE_BYTES(1) - 100, NULL, 0));
	tier_free_memory(&t);
	CHECK(tier_make(&t, 8, t.disk));
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 1, 1), 0);
	cache_sequence(&t, 1, 0, a, 1, 1);
	cai_kv_disk_flush(t.disk);
	CHECK_EQ_INT(list_files(t.disk, names, 4), 1);
	CHECK(tamper(names[0], 40, NULL, 0));
	tier_free_memory(&t);
	cai_kv_disk_close(t.disk);
	CHECK(tier_make(&t, 8, open_disk(dir, 1 << 20)));
	CHECK(t.disk != NULL);
	if (!t.disk)
		return;
	CHECK_EQ_INT(disk_stats(t.disk).files, 0);
	CHECK_EQ_INT(list_files(t.disk, NULL, 0), 0);

	/* two blocks' files swapped: each is a sound file of the other block, so both miss */
	cache_sequence(&t, 1, 0, a, 1, 1);
	cache_sequence(&t, 1, 0, b, 1, 2);
	cai_kv_disk_flush(t.disk);
	CHECK_EQ_INT(list_files(t.disk, names, 4), 2);
	CHECK(read_whole(names[0], fa, sizeof(fa)) && read_whole(names[1], fb, sizeof(fb)));
	CHECK(write_whole(names[0], fb, sizeof(fb)) && write_whole(names[1], fa, sizeof(fa)));
	tier_free_memory(&t);
	CHECK(tier_make(&t, 8, t.disk));
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 1, 1), 0);
	CHECK_EQ_INT(lookup_checked(&t, 1, b, 1, 2), 0);
	CHECK_EQ_INT(disk_stats(t.disk).hits, 0);
	/* and the next open's index, which reads the headers, drops them */
	tier_free_memory(&t);
	cai_kv_disk_close(t.disk);
	CHECK(tier_make(&t, 8, open_disk(dir, 1 << 20)));
	if (t.disk)
		CHECK_EQ_INT(disk_stats(t.disk).files, 0);
	tier_free_memory(&t);
	cai_kv_disk_close(t.disk);
	remove_tree(dir);
}

TEST(kv_disk_salts_stay_apart)
{
	char		dir[64];
	tier		t;
	int32_t		a[2 * BT + 1];

	make_temp_dir(dir, sizeof(dir));
	CHECK(tier_make(&t, 8, open_disk(dir, 1 << 20)));
	if (!t.disk)
	{
		CHECK(t.disk != NULL);
		return;
	}
	fill_tokens(a, 2 * BT + 1, 1);
	cache_sequence(&t, 11, 0, a, 2, 1);
	cai_kv_disk_flush(t.disk);
	tier_free_memory(&t);
	CHECK(tier_make(&t, 8, t.disk));
	CHECK_EQ_INT(lookup_checked(&t, 12, a, 2, 1), 0);
	CHECK_EQ_INT(disk_stats(t.disk).hits, 0);
	CHECK_EQ_INT(lookup_checked(&t, 11, a, 2, 1), 2);
	tier_free_memory(&t);
	cai_kv_disk_close(t.disk);
	remove_tree(dir);
}

TEST(kv_disk_forget_and_reset_remove_the_files)
{
	char		dir[64];
	tier		t;
	int32_t		a[2 * BT + 1], b[2 * BT + 1], c[3 * BT + 1];

	make_temp_dir(dir, sizeof(dir));
	CHECK(tier_make(&t, 16, open_disk(dir, 1 << 20)));
	if (!t.disk)
	{
		CHECK(t.disk != NULL);
		return;
	}
	fill_tokens(a, 2 * BT + 1, 1);
	fill_tokens(b, 2 * BT + 1, 2);
	/* c continues a: cached by another owner after a's blocks */
	memcpy(c, a, sizeof(a));
	fill_tokens(c + 2 * BT, BT + 1, 3);
	cache_sequence(&t, 1, 7, a, 2, 1);
	cache_sequence(&t, 1, 8, b, 2, 2);
	cache_sequence(&t, 1, 9, c, 3, 1);
	cai_kv_disk_flush(t.disk);
	CHECK_EQ_INT(list_files(t.disk, NULL, 0), 5);

	/* 7's blocks go from memory, with 9's block after them, and 7's files go from disk */
	CHECK_EQ_INT(cai_prefix_cache_forget_owner(t.cache, 7), 3);
	CHECK_EQ_INT(list_files(t.disk, NULL, 0), 3);
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 2, 1), 0);
	CHECK_EQ_INT(lookup_checked(&t, 1, b, 2, 2), 2);
	tier_free_memory(&t);
	CHECK(tier_make(&t, 16, t.disk));
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 2, 1), 0);
	CHECK_EQ_INT(lookup_checked(&t, 1, b, 2, 2), 2);

	/* reset: no file left */
	cai_kv_disk_reset(t.disk);
	CHECK_EQ_INT(list_files(t.disk, NULL, 0), 0);
	CHECK_EQ_INT(disk_stats(t.disk).files, 0);
	CHECK_EQ_INT(disk_stats(t.disk).bytes, 0);
	tier_free_memory(&t);
	cai_kv_disk_close(t.disk);
	remove_tree(dir);
}

TEST(kv_disk_budget_evicts_least_recently_used_files)
{
	char		dir[64];
	tier		t;
	int32_t		a[BT + 1], b[BT + 1], c[BT + 1];

	make_temp_dir(dir, sizeof(dir));
	CHECK(tier_make(&t, 16, open_disk(dir, 2 * FILE_BYTES(1))));
	if (!t.disk)
	{
		CHECK(t.disk != NULL);
		return;
	}
	fill_tokens(a, BT + 1, 1);
	fill_tokens(b, BT + 1, 2);
	fill_tokens(c, BT + 1, 3);
	cache_sequence(&t, 1, 0, a, 1, 1);
	cache_sequence(&t, 1, 0, b, 1, 2);
	cai_kv_disk_flush(t.disk);
	/* a is read back (used) after b was written: b is the least recently used */
	tier_free_memory(&t);
	CHECK(tier_make(&t, 16, t.disk));
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 1, 1), 1);
	cache_sequence(&t, 1, 0, c, 1, 3);
	cai_kv_disk_flush(t.disk);
	CHECK_EQ_INT(list_files(t.disk, NULL, 0), 2);
	CHECK_EQ_INT(disk_stats(t.disk).evictions, 1);
	CHECK(disk_stats(t.disk).bytes <= 2 * FILE_BYTES(1));
	tier_free_memory(&t);
	CHECK(tier_make(&t, 16, t.disk));
	CHECK_EQ_INT(lookup_checked(&t, 1, b, 1, 2), 0);
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 1, 1), 1);
	CHECK_EQ_INT(lookup_checked(&t, 1, c, 1, 3), 1);
	tier_free_memory(&t);
	cai_kv_disk_close(t.disk);
	remove_tree(dir);
}

TEST(kv_disk_unusable_directory_leaves_memory_alone)
{
	char		dir[64], path[128];
	tier		t;
	int32_t		a[2 * BT + 1];
	cai_kv_disk *disk;
	int			fd;

	make_temp_dir(dir, sizeof(dir));
	fill_tokens(a, 2 * BT + 1, 1);

	/* a path through a regular file cannot be a directory: no tier */
	snprintf(path, sizeof(path), "%s/file", dir);
	fd = open(path, O_CREAT | O_WRONLY, 0600);
	CHECK(fd >= 0);
	close(fd);
	snprintf(path, sizeof(path), "%s/file/kv", dir);
	CHECK(open_disk(path, 1 << 20) == NULL);
	/* a directory others may write is refused */
	snprintf(path, sizeof(path), "%s/open", dir);
	CHECK(mkdir(path, 0777) == 0 && chmod(path, 0777) == 0);
	CHECK(open_disk(path, 1 << 20) == NULL);

	/* the directory removed after opening: writes are dropped with one log line, memory
	 * serves on */
	snprintf(path, sizeof(path), "%s/gone", dir);
	disk = open_disk(path, 1 << 20);
	CHECK(disk != NULL);
	if (!disk)
		return;
	remove_tree(path);
	log_lines = 0;
	CHECK(tier_make(&t, 8, disk));
	cache_sequence(&t, 1, 0, a, 2, 1);
	cai_kv_disk_flush(disk);
	CHECK_EQ_INT(log_lines, 1);
	CHECK_EQ_INT(disk_stats(disk).blocks_written, 0);
	CHECK(disk_stats(disk).writes_dropped >= 1);
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 2, 1), 2);
	tier_free_memory(&t);
	CHECK(tier_make(&t, 8, disk));
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 2, 1), 0);
	cache_sequence(&t, 1, 0, a, 2, 1);
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 2, 1), 2);
	tier_free_memory(&t);
	cai_kv_disk_close(disk);

	remove_tree(dir);
}

TEST(kv_disk_read_only_directory_leaves_memory_alone)
{
	char		dir[64], path[128];
	tier		t;
	int32_t		a[2 * BT + 1];
	cai_kv_disk *disk;

	if (geteuid() == 0)
		SKIP("root writes a read-only directory");
	make_temp_dir(dir, sizeof(dir));
	fill_tokens(a, 2 * BT + 1, 1);
	/* read-only before opening: no tier */
	snprintf(path, sizeof(path), "%s/ro", dir);
	CHECK(mkdir(path, 0700) == 0 && chmod(path, 0500) == 0);
	CHECK(open_disk(path, 1 << 20) == NULL);

	/* read-only after opening: writes are dropped with one log line, memory serves on */
	snprintf(path, sizeof(path), "%s/later", dir);
	disk = open_disk(path, 1 << 20);
	CHECK(disk != NULL);
	if (!disk)
		return;
	CHECK(chmod(cai_kv_disk_path(disk), 0500) == 0);
	log_lines = 0;
	CHECK(tier_make(&t, 8, disk));
	cache_sequence(&t, 1, 0, a, 2, 1);
	cai_kv_disk_flush(disk);
	CHECK_EQ_INT(log_lines, 1);
	CHECK_EQ_INT(disk_stats(disk).blocks_written, 0);
	CHECK(disk_stats(disk).writes_dropped >= 1);
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 2, 1), 2);
	/* nothing reached the disk: a lookup that misses memory misses there too */
	tier_free_memory(&t);
	CHECK(tier_make(&t, 8, disk));
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 2, 1), 0);
	cache_sequence(&t, 1, 0, a, 2, 1);
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 2, 1), 2);
	tier_free_memory(&t);
	cai_kv_disk_close(disk);
	remove_tree(dir);
}

/* A block hash that ignores the tokens: every prefix of one length collides. */
static uint64_t
colliding_hash(const int32_t *tokens, int n, uint64_t seed)
{
	(void) tokens;
	return seed * 31 + (uint64_t) n;
}

TEST(kv_disk_colliding_keys_are_verified_token_by_token)
{
	char		dir[64];
	tier		t;
	int32_t		a[2 * BT + 1], b[2 * BT + 1];

	make_temp_dir(dir, sizeof(dir));
	CHECK(tier_make(&t, 8, open_disk(dir, 1 << 20)));
	if (!t.disk)
	{
		CHECK(t.disk != NULL);
		return;
	}
	fill_tokens(a, 2 * BT + 1, 1);
	fill_tokens(b, 2 * BT + 1, 2);
	cai_prefix_cache_set_hash_for_testing(t.cache, colliding_hash);
	cache_sequence(&t, 1, 0, a, 2, 1);
	cai_kv_disk_flush(t.disk);
	CHECK_EQ_INT(list_files(t.disk, NULL, 0), 2);

	/* b's keys are a's: the files are sound, of the same salt and chain, but not b's tokens */
	tier_free_memory(&t);
	CHECK(tier_make(&t, 8, t.disk));
	cai_prefix_cache_set_hash_for_testing(t.cache, colliding_hash);
	CHECK_EQ_INT(lookup_checked(&t, 1, b, 2, 2), 0);
	CHECK_EQ_INT(disk_stats(t.disk).hits, 0);
	/* and a's own prompt still finds them: a collision costs a miss, not the files */
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 2, 1), 2);
	tier_free_memory(&t);
	cai_kv_disk_close(t.disk);
	remove_tree(dir);
}

TEST(kv_disk_blocks_evicted_from_memory_are_written)
{
	char		dir[64];
	tier		t;
	cai_kv_disk *disk;
	int32_t		a[2 * BT + 1], b[2 * BT + 1];

	make_temp_dir(dir, sizeof(dir));
	disk = open_disk(dir, 1 << 20);
	CHECK(disk != NULL);
	if (!disk)
		return;
	fill_tokens(a, 2 * BT + 1, 1);
	fill_tokens(b, 2 * BT + 1, 2);
	/* a is cached while no tier is attached (as when its write was dropped) */
	CHECK(tier_make(&t, 2, NULL));
	cache_sequence(&t, 1, 0, a, 2, 1);
	cai_prefix_cache_set_disk(t.cache, disk);
	t.disk = disk;
	CHECK_EQ_INT(list_files(disk, NULL, 0), 0);
	/* b takes a's place in memory: a's blocks go to disk on their way out */
	cache_sequence(&t, 1, 0, b, 2, 2);
	cai_kv_disk_flush(disk);
	CHECK_EQ_INT(list_files(disk, NULL, 0), 4);
	tier_free_memory(&t);
	CHECK(tier_make(&t, 8, disk));
	CHECK_EQ_INT(lookup_checked(&t, 1, a, 2, 1), 2);
	tier_free_memory(&t);
	cai_kv_disk_close(disk);
	remove_tree(dir);
}

/* Two layers, the second read through a window (kv.h): a block's window part may be dropped. */
static bool
windowed_tier(tier *t, cai_kv_disk **disk, const char *dir)
{
	cai_kv_layout layout = tiny_layout();
	cai_error	err;

	layout.n_kv_layers = 2;
	layout.n_windowed_layers = 1;
	layout.window = 32;
	layout.block_bytes = 2 * layout.layer_bytes;
	memset(t, 0, sizeof(*t));
	if (!*disk && cai_kv_disk_open(dir, 1 << 20, FINGERPRINT, &layout, "cpu", NULL, NULL, disk,
								   &err) != CAI_OK)
		return false;
	if (cai_kv_pool_create_windowed(&layout, 16, 4, &t->pool, &err) != CAI_OK ||
		cai_prefix_cache_create(t->pool, 8 * layout.block_bytes, FINGERPRINT, &t->cache,
								&err) != CAI_OK)
		return false;
	t->disk = *disk;
	cai_prefix_cache_set_disk(t->cache, *disk);
	return true;
}

TEST(kv_disk_windowed_blocks_keep_what_they_had)
{
	char		dir[64];
	tier		t;
	cai_kv_disk *disk = NULL;
	int32_t		a[2 * BT + 1], blocks[2], out[2];
	int			reserve = 1000;

	make_temp_dir(dir, sizeof(dir));
	CHECK(windowed_tier(&t, &disk, dir));
	if (!disk)
		return;
	fill_tokens(a, 2 * BT + 1, 1);
	/* block 0 dropped its window part (behind the window), block 1 kept it */
	blocks[0] = cai_kv_block_alloc_without_window(t.pool);
	blocks[1] = cai_kv_block_alloc(t.pool);
	for (int i = 0; i < 2; i++)
		for (int l = 0; l < 2; l++)
		{
			uint8_t    *kv = cai_kv_block_layer(t.pool, blocks[i], l);

			for (size_t j = 0; kv && j < 256; j++)
				kv[j] = kv_byte(l + 1, i, j);
		}
	cai_prefix_cache_insert(t.cache, 1, a, 2 * BT, blocks, 2);
	cai_kv_block_unref(t.pool, blocks[0]);
	cai_kv_block_unref(t.pool, blocks[1]);
	cai_kv_disk_flush(disk);
	tier_free_memory(&t);

	CHECK(windowed_tier(&t, &disk, dir));
	CHECK_EQ_INT(cai_prefix_cache_lookup(t.cache, 1, a, 2 * BT + 1, out, 2), 2);
	CHECK(!cai_kv_block_has_window(t.pool, out[0]));
	CHECK(cai_kv_block_has_window(t.pool, out[1]));
	for (int i = 0; i < 2; i++)
		for (int l = 0; l < 2; l++)
		{
			const uint8_t *kv = cai_kv_block_layer(t.pool, out[i], l);
			bool		same = true;

			if (!kv)
				continue;
			for (size_t j = 0; j < 256; j++)
				same = same && kv[j] == kv_byte(l + 1, i, j);
			CHECK_MSG(same, "block %d layer %d read back with other bytes", i, l);
		}
	cai_kv_block_unref(t.pool, out[0]);
	cai_kv_block_unref(t.pool, out[1]);
	tier_free_memory(&t);

	/* window parts others have a claim on are not taken: the global part alone comes back */
	CHECK(windowed_tier(&t, &disk, dir));
	cai_prefix_cache_set_window_reserve(t.cache, &reserve);
	CHECK_EQ_INT(cai_prefix_cache_lookup(t.cache, 1, a, 2 * BT + 1, out, 2), 2);
	CHECK(!cai_kv_block_has_window(t.pool, out[1]));
	CHECK_EQ_INT(cai_kv_pool_n_free_window_parts(t.pool), 4);
	cai_kv_block_unref(t.pool, out[0]);
	cai_kv_block_unref(t.pool, out[1]);
	tier_free_memory(&t);
	cai_kv_disk_close(disk);
	remove_tree(dir);
}

/*
 * A file replaced after the tier indexed it (another engine process over the same directory
 * wrote the block with its window part over one without): a sound read hits, and the tier's
 * bytes count the file there now, not the one it indexed.
 */
TEST(kv_disk_replaced_file_is_counted_at_its_size)
{
	char		dir[64],
				other_dir[64];
	char		from[4200],
				to[4200];
	cai_kv_layout layout = tiny_layout();
	cai_kv_pool *pool = NULL;
	cai_kv_disk *disk = NULL,
			   *other = NULL;
	cai_kv_disk_stats st;
	cai_error	err;
	int32_t		a[BT];
	cai_kv_disk_block b = {0x1234, 0x99, 0, 7, a, BT};
	int32_t		bare,
				whole,
				out;
	struct stat sb;

	layout.n_kv_layers = 2;
	layout.n_windowed_layers = 1;
	layout.window = 32;
	layout.block_bytes = 2 * layout.layer_bytes;
	make_temp_dir(dir, sizeof(dir));
	make_temp_dir(other_dir, sizeof(other_dir));
	CHECK(cai_kv_pool_create_windowed(&layout, 4, 2, &pool, &err) == CAI_OK);
	CHECK(cai_kv_disk_open(dir, 1 << 20, FINGERPRINT, &layout, "cpu", NULL, NULL, &disk,
						   &err) == CAI_OK);
	CHECK(cai_kv_disk_open(other_dir, 1 << 20, FINGERPRINT, &layout, "cpu", NULL, NULL, &other,
						   &err) == CAI_OK);
	if (!pool || !disk || !other)
		return;
	fill_tokens(a, BT, 3);
	bare = cai_kv_block_alloc_without_window(pool);
	whole = cai_kv_block_alloc(pool);
	for (int l = 0; l < 2; l++)
	{
		uint8_t    *kv = cai_kv_block_layer(pool, whole, l);

		memset(kv, 0x40 + l, layout.layer_bytes);
		if (l == 0)
			memset(cai_kv_block_layer(pool, bare, l), 0x20, layout.layer_bytes);
	}
	CHECK(cai_kv_disk_store(disk, &b, pool, bare));
	CHECK(cai_kv_disk_store(other, &b, pool, whole));
	cai_kv_disk_flush(disk);
	cai_kv_disk_flush(other);
	cai_kv_disk_get_stats(disk, &st);
	CHECK_EQ_INT((int) st.bytes, FILE_BYTES(1));

	snprintf(from, sizeof(from), "%s/%016llx.kv", cai_kv_disk_path(other), 0x1234ULL);
	snprintf(to, sizeof(to), "%s/%016llx.kv", cai_kv_disk_path(disk), 0x1234ULL);
	CHECK(rename(from, to) == 0);
	CHECK(stat(to, &sb) == 0 && sb.st_size == FILE_BYTES(1) + 256);
	out = cai_kv_disk_load(disk, &b, pool, true, NULL);
	CHECK(out >= 0);
	if (out >= 0)
	{
		CHECK(cai_kv_block_has_window(pool, out));
		CHECK(cai_kv_block_layer(pool, out, 1)[0] == 0x41);
		cai_kv_block_unref(pool, out);
	}
	cai_kv_disk_get_stats(disk, &st);
	CHECK_EQ_INT((int) st.files, 1);
	CHECK_EQ_INT((int) st.bytes, (int) sb.st_size);

	cai_kv_block_unref(pool, bare);
	cai_kv_block_unref(pool, whole);
	cai_kv_disk_close(disk);
	cai_kv_disk_close(other);
	cai_kv_pool_free(pool);
	remove_tree(dir);
	remove_tree(other_dir);
}
