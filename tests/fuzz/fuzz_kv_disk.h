/*
 * fuzz_kv_disk.h — what fuzz_kv_disk.c and gen_corpus.c share about the disk tier's files: the
 * two small KV layouts the target opens the tier with, its fixed fingerprint and device, and a
 * block file made by the tier itself (store, flush, read back), from which the seeds are cut and
 * the target learns the names the tier gives its subdirectory and files.
 */
#ifndef CAI_FUZZ_KV_DISK_H
#define CAI_FUZZ_KV_DISK_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "kv.h"
#include "kv_disk.h"

#define FUZZ_KVD_FINGERPRINT UINT64_C(0xf0a2d15c5eed0001)
#define FUZZ_KVD_DEVICE "cpu"
#define FUZZ_KVD_HEADER_BYTES 88
/* offsets of the header's fields (kv_disk.c's disk_header, host byte order) */
#define FUZZ_KVD_OFF_FINGERPRINT 16
#define FUZZ_KVD_OFF_FORMAT 24
#define FUZZ_KVD_OFF_KEY 32
#define FUZZ_KVD_OFF_PARENT 40
#define FUZZ_KVD_OFF_SALT 48
#define FUZZ_KVD_OFF_OWNER 56
#define FUZZ_KVD_OFF_N_PREFIX 64
#define FUZZ_KVD_OFF_FLAGS 68
#define FUZZ_KVD_OFF_PAYLOAD 72
#define FUZZ_KVD_OFF_CHECKSUM 80

/*
 * Layout 0: one layer, one KV head, head_dim 4 (256-byte blocks).  Layout 1: two layers, the
 * second read through a 32-token window, so that a file may or may not carry a window part.
 */
static inline cai_kv_layout
fuzz_kvd_layout(int which)
{
	cai_kv_layout L = {0};

	L.n_kv_layers = which ? 2 : 1;
	L.n_windowed_layers = which ? 1 : 0;
	L.window = which ? 32 : 0;
	L.n_kv_heads = 1;
	L.head_dim = 4;
	L.layer_bytes = 2 * CAI_KV_BLOCK_TOKENS * 4 + 2 * CAI_KV_BLOCK_TOKENS * sizeof(float);
	L.block_bytes = (size_t) L.n_kv_layers * L.layer_bytes;
	return L;
}

/* A pool of 3 blocks (one window part for layout 1). */
static inline cai_kv_pool *
fuzz_kvd_pool(int which)
{
	cai_kv_layout L = fuzz_kvd_layout(which);
	cai_kv_pool *pool = NULL;
	cai_error	err;

	if ((which ? cai_kv_pool_create_windowed(&L, 3, 1, &pool, &err)
		 : cai_kv_pool_create(&L, 3, &pool, &err)) != CAI_OK)
	{
		fprintf(stderr, "fuzz_kv_disk: pool: %s\n", err.message);
		abort();
	}
	return pool;
}

/* Removes dir's files and dir itself (one level of subdirectories, as the tier makes). */
static inline void
fuzz_kvd_remove_tree(const char *dir)
{
	DIR		   *d = opendir(dir);
	struct dirent *de;
	char		path[4200];

	while (d && (de = readdir(d)) != NULL)
	{
		struct stat st;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
			fuzz_kvd_remove_tree(path);
		else
			(void) unlink(path);
	}
	if (d)
		closedir(d);
	(void) rmdir(dir);
}

/*
 * Has the tier (layout which) write one block of depth * 16 prefix tokens (window part or not)
 * and returns the file's bytes (malloc'd, *size) and, in subdir (>= 17 bytes), the name of the
 * subdirectory the tier keeps them in.  The KV and tokens are a pattern of seed.
 */
static inline uint8_t *
fuzz_kvd_make_file(int which, int depth, bool window, uint64_t key, uint64_t parent,
				   uint64_t salt, uint64_t owner, unsigned seed, size_t *size, char *subdir)
{
	cai_kv_layout L = fuzz_kvd_layout(which);
	char		dir[256];
	char		path[4200];
	const char *tier_path;
	cai_kv_pool *pool = fuzz_kvd_pool(which);
	cai_kv_disk *disk = NULL;
	cai_error	err;
	int32_t		prefix[64 * CAI_KV_BLOCK_TOKENS];
	cai_kv_disk_block b = {key, parent, salt, owner, prefix, depth * CAI_KV_BLOCK_TOKENS};
	int32_t		block;
	uint8_t    *data;
	FILE	   *f;
	long		n;

	if (depth < 1 || depth > 64)
		abort();
	snprintf(dir, sizeof(dir), "%s/cai_fuzz_kvd.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(dir) ||
		cai_kv_disk_open(dir, 1 << 20, FUZZ_KVD_FINGERPRINT, &L, FUZZ_KVD_DEVICE, NULL, NULL,
						 &disk, &err) != CAI_OK)
	{
		fprintf(stderr, "fuzz_kv_disk: cannot open a tier in %s\n", dir);
		abort();
	}
	for (int i = 0; i < b.n_prefix; i++)
		prefix[i] = (int32_t) ((seed * 7919u + (unsigned) i * 104729u) % 49152u);
	block = window ? cai_kv_block_alloc(pool) : cai_kv_block_alloc_without_window(pool);
	for (int l = 0; l < (window ? L.n_kv_layers : L.n_kv_layers - L.n_windowed_layers); l++)
	{
		uint8_t    *part = cai_kv_block_layer(pool, block, l);

		for (size_t i = 0; i < L.layer_bytes; i++)
			part[i] = (uint8_t) (seed * 31u + (unsigned) l * 101u + (unsigned) i * 13u);
	}
	if (!cai_kv_disk_store(disk, &b, pool, block))
		abort();
	cai_kv_disk_flush(disk);
	tier_path = cai_kv_disk_path(disk);
	snprintf(subdir, 17, "%s", tier_path + strlen(tier_path) - 16);
	snprintf(path, sizeof(path), "%s/%016llx.kv", tier_path, (unsigned long long) key);
	f = fopen(path, "rb");
	if (!f || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) <= 0 || fseek(f, 0, SEEK_SET) != 0 ||
		!(data = malloc((size_t) n)) || fread(data, 1, (size_t) n, f) != (size_t) n)
	{
		fprintf(stderr, "fuzz_kv_disk: the tier wrote no %s\n", path);
		abort();
	}
	fclose(f);
	*size = (size_t) n;
	cai_kv_disk_close(disk);
	cai_kv_block_unref(pool, block);
	cai_kv_pool_free(pool);
	fuzz_kvd_remove_tree(dir);
	return data;
}

#endif							/* CAI_FUZZ_KV_DISK_H */
