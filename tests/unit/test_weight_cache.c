/*
 * test_weight_cache.c — prepared weights kept in a cache file (weight_cache.h): the container
 * refuses what it did not write whole, a model mapped from it computes the bits of a fresh
 * conversion on both weight paths, a bad file is refused and rebuilt, and nothing in the cache
 * directory is followed, truncated or blocked on.
 */
#include "test.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model.h"
#include "model_wcache.h"
#include "threadpool.h"
#include "util.h"
#include "weight_cache.h"

const char *test_real_model_path(void);

/* A fresh directory for one test's cache files. */
static void
make_dir(char *dir, size_t size, const char *tag)
{
	snprintf(dir, size, "/tmp/cai_test_wcache_%d_%s", (int) getpid(), tag);
	(void) mkdir(dir, 0700);
}

/* Removes dir and the files in it. */
static void
remove_dir(const char *dir)
{
	DIR		   *d = opendir(dir);
	struct dirent *e;
	char		path[600];

	while (d && (e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
		{
			snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
			unlink(path);
		}
	if (d)
		closedir(d);
	rmdir(dir);
}

static int
count_files(const char *dir)
{
	DIR		   *d = opendir(dir);
	struct dirent *e;
	int			n = 0;

	while (d && (e = readdir(d)) != NULL)
		n += e->d_name[0] != '.';
	if (d)
		closedir(d);
	return n;
}

static size_t
file_size(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 ? (size_t) st.st_size : 0;
}

/* Reads a whole file into 8-byte aligned memory. */
static uint8_t *
read_file(const char *path, size_t *size)
{
	FILE	   *f = fopen(path, "rb");
	uint8_t    *data = NULL;

	*size = file_size(path);
	if (f && posix_memalign((void **) &data, 64, *size + 64) == 0 &&
		fread(data, 1, *size, f) != *size)
	{
		free(data);
		data = NULL;
	}
	if (f)
		fclose(f);
	return data;
}

static void
flip_byte(const char *path, size_t at)
{
	FILE	   *f = fopen(path, "r+b");
	int			c;

	if (!f)
		return;
	fseek(f, (long) at, SEEK_SET);
	c = fgetc(f);
	fseek(f, (long) at, SEEK_SET);
	fputc(c ^ 0x5a, f);
	fclose(f);
}

/* Writes three sections of key into path. */
static bool
write_sample(const char *path, uint64_t key)
{
	static const char a[] = "first section";
	uint8_t		b[1000];
	cai_wcache_writer *w;
	cai_error	err;

	for (int i = 0; i < (int) sizeof(b); i++)
		b[i] = (uint8_t) (i * 7);
	return cai_wcache_writer_open(path, key, &w, &err) == CAI_OK &&
		cai_wcache_add(w, 1, a, sizeof(a), &err) == CAI_OK &&
		cai_wcache_add(w, 2, b, sizeof(b), &err) == CAI_OK &&
		cai_wcache_add(w, 3, NULL, 0, &err) == CAI_OK &&
		cai_wcache_writer_commit(w, &err) == CAI_OK;
}

/* The container: sections back in order; truncation, corruption, other keys refused. */
TEST(weight_cache_container)
{
	char		dir[256],
				path[400];
	cai_wcache_map map;
	cai_error	err;
	const void *data;
	size_t		bytes,
				size;
	uint32_t	cursor = 0;
	uint8_t    *raw;
	cai_wcache_view v;

	make_dir(dir, sizeof(dir), "container");
	snprintf(path, sizeof(path), "%s/sample.caiw", dir);
	CHECK(write_sample(path, 42));
	CHECK(cai_wcache_map_open(path, 42, &map, &err) == CAI_OK);
	CHECK(cai_wcache_next(&map.view, &cursor, 1, &data, &bytes, &err) == CAI_OK);
	CHECK(bytes == sizeof("first section") && memcmp(data, "first section", bytes) == 0);
	CHECK(((uintptr_t) data) % CAI_WCACHE_ALIGN == 0);
	CHECK(cai_wcache_next(&map.view, &cursor, 3, &data, &bytes, &err) == CAI_ERR_FORMAT);
	CHECK(cai_wcache_next(&map.view, &cursor, 2, &data, &bytes, &err) == CAI_OK);
	CHECK(bytes == 1000 && ((const uint8_t *) data)[999] == (uint8_t) (999 * 7));
	CHECK(cai_wcache_next(&map.view, &cursor, 3, &data, &bytes, &err) == CAI_OK && bytes == 0);
	CHECK(cai_wcache_next(&map.view, &cursor, 4, &data, &bytes, &err) == CAI_ERR_FORMAT);
	cai_wcache_map_close(&map);

	/* another key: another model or other settings */
	CHECK(cai_wcache_map_open(path, 43, &map, &err) == CAI_ERR_FORMAT);
	CHECK_MSG(strstr(err.message, "key") != NULL, "%s", err.message);
	/* every truncation and every flipped byte is refused */
	raw = read_file(path, &size);
	CHECK(raw != NULL);
	for (size_t cut = 0; raw && cut < size; cut += 1 + cut / 7)
		CHECK_MSG(cai_wcache_parse(raw, cut, 42, true, &v, &err) != CAI_OK, "cut at %zu", cut);
	for (size_t at = 0; raw && at < size; at++)
	{
		raw[at] ^= 0x01;
		CHECK_MSG(cai_wcache_parse(raw, size, 42, true, &v, &err) == CAI_ERR_FORMAT,
				  "flipped byte %zu accepted", at);
		raw[at] ^= 0x01;
	}
	CHECK(raw && cai_wcache_parse(raw, size, 42, true, &v, &err) == CAI_OK && v.n_sections == 3);
	free(raw);
	/* a file cut short on disk */
	CHECK(truncate(path, (off_t) size - 1) == 0);
	CHECK(cai_wcache_map_open(path, 42, &map, &err) == CAI_ERR_FORMAT);
	CHECK(cai_wcache_map_open("/nonexistent/x.caiw", 42, &map, &err) == CAI_ERR_NOT_FOUND);
	remove_dir(dir);
}

/* Whether path holds exactly text. */
static bool
file_is(const char *path, const char *text)
{
	char		buf[64] = {0};
	FILE	   *f = fopen(path, "rb");
	size_t		n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;

	if (f)
		fclose(f);
	return n == strlen(text) && memcmp(buf, text, n) == 0;
}

/*
 * The files the cache finds in its directory are never followed, truncated or blocked on: a
 * link at the file's name is refused and replaced (its target untouched), a link at the
 * temporary name a writer with this pid once used is passed over, a FIFO is refused at once
 * (in a child with an alarm, so that a regression fails instead of hanging the suite), and a
 * directory others can write is refused.
 */
TEST(weight_cache_files_never_followed)
{
	char		dir[256],
				path[400],
				victim[400],
				old_tmp[500];
	cai_wcache_map map;
	cai_error	err;
	struct stat st;
	pid_t		child;
	int			status = 0;
	FILE	   *f;

	make_dir(dir, sizeof(dir), "links");
	snprintf(path, sizeof(path), "%s/sample.caiw", dir);
	snprintf(victim, sizeof(victim), "/tmp/cai_test_wcache_%d_victim", (int) getpid());
	f = fopen(victim, "wb");
	CHECK(f != NULL);
	if (f)
	{
		fputs("precious", f);
		fclose(f);
	}

	CHECK(symlink(victim, path) == 0);
	CHECK(cai_wcache_map_open(path, 42, &map, &err) == CAI_ERR_IO);
	CHECK_MSG(strstr(err.message, "symbolic link") != NULL, "%s", err.message);
	snprintf(old_tmp, sizeof(old_tmp), "%s.%d.tmp", path, (int) getpid());
	CHECK(symlink(victim, old_tmp) == 0);
	CHECK(write_sample(path, 42));
	CHECK(file_is(victim, "precious"));
	CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode));
	CHECK(cai_wcache_map_open(path, 42, &map, &err) == CAI_OK);
	cai_wcache_map_close(&map);
	unlink(old_tmp);

	unlink(path);
	CHECK(mkfifo(path, 0600) == 0);
	child = fork();
	if (child == 0)
	{
		alarm(10);
		_exit(cai_wcache_map_open(path, 42, &map, &err) == CAI_ERR_IO &&
			  strstr(err.message, "not a regular file") != NULL ? 0 : 1);
	}
	CHECK(child > 0 && waitpid(child, &status, 0) == child);
	CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a FIFO as the cache file: status %d",
			  status);
	CHECK(write_sample(path, 42));
	CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode));

	CHECK(chmod(dir, 0770) == 0);
	CHECK(cai_wcache_make_dir(dir, &err) == CAI_ERR_IO);
	CHECK_MSG(strstr(err.message, "writable by group or others") != NULL, "%s", err.message);
	CHECK(chmod(dir, 0700) == 0);
	CHECK(cai_wcache_make_dir(dir, &err) == CAI_OK);
	remove_dir(dir);
	unlink(victim);
}

/* Every setting that changes the prepared bytes changes the key. */
TEST(weight_cache_key_covers_settings)
{
	cai_wcache_key_params base = {
		.model_hash = 0x1234, .model_bytes = 1000, .backend = "cpu", .backend_layout = 0x10001,
	};
	cai_wcache_key_params p;
	uint64_t	k = cai_wcache_key(&base);

	p = base;
	CHECK(cai_wcache_key(&p) == k);
	p.model_hash++;
	CHECK(cai_wcache_key(&p) != k);
	p = base;
	p.model_bytes++;
	CHECK(cai_wcache_key(&p) != k);
	p = base;
	p.file_weights = true;
	CHECK(cai_wcache_key(&p) != k);
	p = base;
	p.gptq_rounding = true;
	CHECK(cai_wcache_key(&p) != k);
	p = base;
	p.two_digit_activations = true;
	CHECK(cai_wcache_key(&p) != k);
	p = base;
	p.backend = "cuda";
	CHECK(cai_wcache_key(&p) != k);
	p = base;
	p.backend_layout = 0x10002;
	CHECK(cai_wcache_key(&p) != k);
	CHECK(cai_backend_cpu_weights_layout() != 0);
}

/* Loads the real model with the cache in dir (NULL: none). */
static cai_model *
load(const char *path, const char *dir, cai_weights_mode mode, bool two_digit)
{
	cai_model_params params;
	cai_model  *model = NULL;
	cai_error	err;

	cai_model_params_default(&params);
	params.n_threads = 2;
	params.weights = mode;
	params.weights_cache = dir;
	params.activations = two_digit ? CAI_ACTIVATIONS_TWO_DIGIT : CAI_ACTIVATIONS_INT8;
	if (cai_model_load(path, &params, &model, &err) != CAI_OK)
		fprintf(stderr, "    load: %s\n", err.message);
	return model;
}

/*
 * The logits of every position of a fixed prompt (V * n floats, malloc'd), computed by a fresh
 * forward context on model; NULL when it could not run.
 */
static float *
prompt_logits(cai_model *model, int n)
{
	static const int32_t tokens[] = {1, 1780, 314, 260, 3575, 282, 4649, 47, 2, 1820, 3575, 9};
	cai_threadpool *pool = cai_threadpool_create(2);
	cai_kv_layout layout;
	cai_kv_pool *kv = NULL;
	cai_forward_ctx *ctx = NULL;
	cai_error	err;
	int32_t		table[4];
	float	   *logits = malloc(sizeof(float) * (size_t) n * model->cfg.n_vocab);
	cai_batch_seq s = {tokens, n, 0, table, 4, CAI_LOGITS_ALL};
	bool		ok;

	cai_model_kv_layout(model, &layout);
	ok = pool && logits && cai_kv_pool_create(&layout, 4, &kv, &err) == CAI_OK &&
		cai_forward_ctx_create(model, pool, 16, 64, &ctx, &err) == CAI_OK;
	if (!ok)
		fprintf(stderr, "    forward context: %s\n", err.message);
	for (int i = 0; ok && i < 4; i++)
		table[i] = cai_kv_block_alloc(kv);
	if (ok && cai_model_forward(model, ctx, kv, &s, 1, logits, false, &err) != CAI_OK)
	{
		fprintf(stderr, "    forward: %s\n", err.message);
		ok = false;
	}
	cai_forward_ctx_free(ctx);
	cai_kv_pool_free(kv);
	cai_threadpool_free(pool);
	if (!ok)
	{
		free(logits);
		return NULL;
	}
	return logits;
}

static cai_weights_cache_state
state_of(const cai_model *model, cai_weights_cache_report *r)
{
	cai_model_weights_cache_report(model, r);
	return r->state;
}

/*
 * One weights mode on the real model: a first load converts and writes the file, a second maps
 * it and converts nothing (its matrices are not even allocated), and both compute the same
 * bits as a load without a cache.
 */
static void
check_mapped_equals_converted(const char *tag, cai_weights_mode mode, bool two_digit)
{
	const char *path = test_real_model_path();
	const int	n = 12;
	char		dir[256];
	cai_model  *model;
	cai_weights_cache_report r;
	float	   *fresh = NULL,
			   *first = NULL,
			   *mapped = NULL;
	size_t		bytes = 0;
	int			V = 0;

	make_dir(dir, sizeof(dir), tag);
	if ((model = load(path, NULL, mode, two_digit)) != NULL)
	{
		V = model->cfg.n_vocab;
		CHECK(state_of(model, &r) == CAI_WEIGHTS_CACHE_OFF);
		fresh = prompt_logits(model, n);
		cai_model_free(model);
	}
	if ((model = load(path, dir, mode, two_digit)) != NULL)
	{
		CHECK(state_of(model, &r) == CAI_WEIGHTS_CACHE_PENDING && r.refused[0] == '\0');
		first = prompt_logits(model, n);
		CHECK_MSG(state_of(model, &r) == CAI_WEIGHTS_CACHE_WRITTEN, "%s", r.failure);
		bytes = r.file_bytes;
		CHECK(bytes > 0 && bytes == file_size(r.path));
		cai_model_free(model);
	}
	if ((model = load(path, dir, mode, two_digit)) != NULL)
	{
		CHECK(state_of(model, &r) == CAI_WEIGHTS_CACHE_MAPPED);
		CHECK(r.file_bytes == bytes && r.refused[0] == '\0');
		/* nothing converted: the int8 path's matrices were never made */
		CHECK(model->file_weights || model->layers[0].wqkv.q == NULL);
		mapped = prompt_logits(model, n);
		CHECK(state_of(model, &r) == CAI_WEIGHTS_CACHE_MAPPED);
		cai_model_free(model);
	}
	CHECK(fresh && first && mapped);
	if (fresh && first && mapped)
	{
		CHECK_MSG(memcmp(fresh, first, sizeof(float) * (size_t) n * V) == 0,
				  "%s: the writing load's logits differ from a plain load's", tag);
		CHECK_MSG(memcmp(fresh, mapped, sizeof(float) * (size_t) n * V) == 0,
				  "%s: the mapped weights' logits differ from a fresh conversion's", tag);
	}
	CHECK_EQ_INT(count_files(dir), 1);
	free(fresh);
	free(first);
	free(mapped);
	remove_dir(dir);
}

TEST(weight_cache_int8_mapped_equals_converted)
{
	if (!test_real_model_path())
		SKIP("real model not found");
	check_mapped_equals_converted("int8", CAI_WEIGHTS_INT8, false);
}

TEST(weight_cache_file_mapped_equals_converted)
{
	if (!test_real_model_path())
		SKIP("real model not found");
	check_mapped_equals_converted("file", CAI_WEIGHTS_FILE, false);
}

/* Two-digit activations add the embedding's second digits to the file. */
TEST(weight_cache_int8_two_digit_mapped_equals_converted)
{
	if (!test_real_model_path())
		SKIP("real model not found");
	check_mapped_equals_converted("int8x2", CAI_WEIGHTS_INT8, true);
}

/*
 * The file is written while the forward context that converted lives (the engine answers
 * meanwhile), not when it goes: polled with a generous deadline, never timed.
 */
TEST(weight_cache_written_while_the_context_lives)
{
	const char *path = test_real_model_path();
	char		dir[256];
	cai_model  *model;
	cai_threadpool *pool;
	cai_forward_ctx *ctx = NULL;
	cai_weights_cache_report r;
	cai_error	err;
	double		deadline;

	if (!path)
		SKIP("real model not found");
	make_dir(dir, sizeof(dir), "live");
	if ((model = load(path, dir, CAI_WEIGHTS_FILE, false)) == NULL)
	{
		CHECK(model != NULL);
		remove_dir(dir);
		return;
	}
	pool = cai_threadpool_create(2);
	CHECK(pool && cai_forward_ctx_create(model, pool, 16, 64, &ctx, &err) == CAI_OK);
	deadline = cai_now_seconds() + 120.0;
	while (state_of(model, &r) == CAI_WEIGHTS_CACHE_PENDING && cai_now_seconds() < deadline)
		usleep(10000);
	CHECK_MSG(state_of(model, &r) == CAI_WEIGHTS_CACHE_WRITTEN, "%s", r.failure);
	CHECK(r.file_bytes > 0 && r.file_bytes == file_size(r.path));
	CHECK_EQ_INT(count_files(dir), 1);
	cai_forward_ctx_free(ctx);
	cai_threadpool_free(pool);
	cai_model_free(model);
	remove_dir(dir);
}

/*
 * A corrupt or truncated file is refused (the reason kept), the weights converted and the file
 * rewritten, after which it maps again; another mode gets another file, and the model keeps one.
 */
TEST(weight_cache_bad_file_refused_and_rebuilt)
{
	const char *path = test_real_model_path();
	char		dir[256],
				file[4096] = "";
	cai_model  *model;
	cai_weights_cache_report r;
	float	   *good = NULL,
			   *rebuilt = NULL;
	size_t		bytes = 0;
	int			V = 0;

	if (!path)
		SKIP("real model not found");
	make_dir(dir, sizeof(dir), "bad");
	if ((model = load(path, dir, CAI_WEIGHTS_FILE, false)) != NULL)
	{
		V = model->cfg.n_vocab;
		good = prompt_logits(model, 8);
		CHECK(state_of(model, &r) == CAI_WEIGHTS_CACHE_WRITTEN);
		snprintf(file, sizeof(file), "%s", r.path);
		bytes = r.file_bytes;
		cai_model_free(model);
	}
	for (int round = 0; round < 3; round++)
	{
		/* a byte of the weights flipped; the file cut short; its header's key changed */
		if (round == 0)
			flip_byte(file, bytes / 2);
		else if (round == 1)
			CHECK(truncate(file, (off_t) bytes / 3) == 0);
		else
			flip_byte(file, 16);
		if ((model = load(path, dir, CAI_WEIGHTS_FILE, false)) == NULL)
			continue;
		CHECK(state_of(model, &r) == CAI_WEIGHTS_CACHE_PENDING);
		CHECK_MSG(strstr(r.refused, round == 0 ? "checksum" : round == 1 ? "truncated" : "key") != NULL,
				  "round %d: %s", round, r.refused);
		rebuilt = prompt_logits(model, 8);
		CHECK(state_of(model, &r) == CAI_WEIGHTS_CACHE_WRITTEN && r.file_bytes == bytes);
		CHECK(good && rebuilt && memcmp(good, rebuilt, sizeof(float) * 8 * V) == 0);
		free(rebuilt);
		cai_model_free(model);
		if ((model = load(path, dir, CAI_WEIGHTS_FILE, false)) != NULL)
		{
			CHECK(state_of(model, &r) == CAI_WEIGHTS_CACHE_MAPPED);
			cai_model_free(model);
		}
	}
	/* the int8 path is another key, and the model's older file goes */
	if ((model = load(path, dir, CAI_WEIGHTS_INT8, false)) != NULL)
	{
		CHECK(state_of(model, &r) == CAI_WEIGHTS_CACHE_PENDING && r.refused[0] == '\0');
		CHECK(strcmp(r.path, file) != 0);
		free(prompt_logits(model, 1));
		CHECK(state_of(model, &r) == CAI_WEIGHTS_CACHE_WRITTEN);
		cai_model_free(model);
	}
	CHECK_EQ_INT(count_files(dir), 1);
	CHECK(file_size(file) == 0);
	free(good);
	remove_dir(dir);
}
