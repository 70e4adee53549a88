/*
 * test_gguf.c — the GGUF reader, the test writer and the synthetic-model generator.
 *
 * Parsing: a writer-made file with every value type is read back field by field; the real
 * model (when present) has its known shapes.  Untrusted input: a valid file truncated at every
 * byte offset, specific corruptions of each field (huge counts and lengths, unknown types,
 * bad shapes, misaligned or out-of-range offsets, bad alignment, duplicates) and random byte
 * mutations must each fail cleanly with a message (or, for mutations, parse into something
 * whose every tensor lies inside the buffer).  Each parse gets an exact-size heap copy of the
 * bytes, so that running these tests under valgrind catches any read past the end.
 */
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "quant.h"
#include "synth_model.h"
#include "util.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static uint64_t
xorshift(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void
put_u32(uint8_t *img, int64_t off, uint32_t v)
{
	memcpy(img + off, &v, 4);
}

static void
put_u64(uint8_t *img, int64_t off, uint64_t v)
{
	memcpy(img + off, &v, 8);
}

static uint64_t
get_u64(const uint8_t *img, int64_t off)
{
	uint64_t	v;

	memcpy(&v, img + off, 8);
	return v;
}

/* Offset of the u32 value type of metadata pair i, and of its value. */
static int64_t
kv_type_offset(const gguf_writer *w, const uint8_t *img, uint64_t i)
{
	int64_t		off = gguf_writer_kv_offset(w, i);

	return off + 8 + (int64_t) get_u64(img, off);
}

static int64_t
kv_value_offset(const gguf_writer *w, const uint8_t *img, uint64_t i)
{
	return kv_type_offset(w, img, i) + 4;
}

/* Offset of tensor info i's n_dims field; its ne[d] follow, then type and offset. */
static int64_t
tensor_ndims_offset(const gguf_writer *w, const uint8_t *img, uint64_t i)
{
	int64_t		off = gguf_writer_tensor_info_offset(w, i);

	return off + 8 + (int64_t) get_u64(img, off);
}

static int64_t
tensor_type_offset(const gguf_writer *w, const uint8_t *img, uint64_t i)
{
	int64_t		nd = tensor_ndims_offset(w, img, i);
	uint32_t	n_dims;

	memcpy(&n_dims, img + nd, 4);
	return nd + 4 + 8 * (int64_t) n_dims;
}

/*
 * Parses an exact-size heap copy of img[0..size) and returns the status; on success it checks
 * that every tensor lies inside the copy, then closes.  err gets the message.
 */
static cai_status
parse_copy(const uint8_t *img, size_t size, cai_error *err)
{
	uint8_t    *copy = malloc(size ? size : 1);
	gguf_file  *f = (gguf_file *) 1;
	cai_status	st;

	if (!copy)
		return CAI_ERR_NO_MEMORY;
	memcpy(copy, img, size);
	cai_error_clear(err);
	st = gguf_open_memory(copy, size, &f, err);
	if (st == CAI_OK)
	{
		for (uint64_t i = 0; i < f->n_tensors; i++)
		{
			const gguf_tensor *t = &f->tensors[i];
			const uint8_t *p = t->data;

			CHECK(p >= copy && p + t->nbytes <= copy + size);
		}
		gguf_close(f);
	}
	else
	{
		CHECK(f == NULL);
		CHECK(err->status == st);
		CHECK(err->message[0] != '\0');
	}
	free(copy);
	return st;
}

/* Expects a corrupted image to fail with status and a message containing needle. */
#define EXPECT_FAIL(img, size, status, needle) do { \
	cai_error	_e; \
	cai_status	_st = parse_copy((img), (size), &_e); \
	CHECK_MSG(_st == (status), "status %d, expected %d (%s)", (int) _st, (int) (status), _e.message); \
	CHECK_MSG(strstr(_e.message, (needle)) != NULL, "message \"%s\" lacks \"%s\"", _e.message, (needle)); \
	CHECK_MSG(strncmp(_e.message, "gguf: ", 6) == 0, "message \"%s\"", _e.message); \
	} while (0)

/* The sample file's metadata pairs, in order (indexes used by the corruption tests). */
enum
{
	KV_U8, KV_I8, KV_U16, KV_I16, KV_U32, KV_I32, KV_U64, KV_I64, KV_F32, KV_F64, KV_BOOL,
	KV_STR, KV_EMPTY_STR, KV_ARR_I32, KV_ARR_F32, KV_ARR_U8, KV_ARR_BOOL, KV_ARR_STR,
	KV_ARR_EMPTY, KV_COUNT
};

static const char *const sample_strs[4] = {"alpha", "", "Ġthe", "<|im_end|>"};

/* The sample's tensors: F32 [4, 3], F16 [8], Q8_0 [64, 2], Q4_K [256], in this order. */
static float sample_f32[12];

/* A writer holding one pair of every value type and tensors of four types. */
static gguf_writer *
sample_writer(void)
{
	gguf_writer *w = gguf_writer_new();
	int32_t		ai[5] = {1, -2, 3, INT32_MIN, INT32_MAX};
	float		af[3] = {0.5f, -1.25f, 1e30f};
	uint8_t		au[4] = {0, 1, 254, 255};
	uint8_t		ab[3] = {1, 0, 1};
	int64_t		ne_f32[2] = {4, 3};
	int64_t		ne_f16[1] = {8};
	int64_t		ne_q8[2] = {64, 2};
	int64_t		ne_q4k[1] = {256};
	float		x[256];

	if (!w)
		return NULL;
	gguf_writer_add_u8(w, "t.u8", 200);
	gguf_writer_add_i8(w, "t.i8", -5);
	gguf_writer_add_u16(w, "t.u16", 60000);
	gguf_writer_add_i16(w, "t.i16", -3000);
	gguf_writer_add_u32(w, "t.u32", 4000000000u);
	gguf_writer_add_i32(w, "t.i32", -2000000000);
	gguf_writer_add_u64(w, "t.u64", (UINT64_C(1) << 63) + 5);
	gguf_writer_add_i64(w, "t.i64", -(INT64_C(1) << 40));
	gguf_writer_add_f32(w, "t.f32", 1.5f);
	gguf_writer_add_f64(w, "t.f64", -2.25);
	gguf_writer_add_bool(w, "t.bool", true);
	gguf_writer_add_str(w, "general.name", "h\xc3\xa9llo");
	gguf_writer_add_str(w, "t.empty", "");
	gguf_writer_add_arr(w, "t.arr_i32", GGUF_TYPE_INT32, ai, 5);
	gguf_writer_add_arr(w, "t.arr_f32", GGUF_TYPE_FLOAT32, af, 3);
	gguf_writer_add_arr(w, "t.arr_u8", GGUF_TYPE_UINT8, au, 4);
	gguf_writer_add_arr(w, "t.arr_bool", GGUF_TYPE_BOOL, ab, 3);
	gguf_writer_add_arr_str(w, "t.arr_str", sample_strs, 4);
	gguf_writer_add_arr(w, "t.arr_empty", GGUF_TYPE_UINT32, NULL, 0);

	for (int i = 0; i < 12; i++)
		sample_f32[i] = (float) i * 0.5f - 2.0f;
	for (int i = 0; i < 256; i++)
		x[i] = sinf((float) i * 0.1f);
	gguf_writer_add_tensor_f32(w, "a.f32", 2, ne_f32, GGML_TYPE_F32, sample_f32);
	gguf_writer_add_tensor_f32(w, "b.f16", 1, ne_f16, GGML_TYPE_F16, x);
	gguf_writer_add_tensor_f32(w, "c.q8_0", 2, ne_q8, GGML_TYPE_Q8_0, x);
	gguf_writer_add_tensor_f32(w, "d.q4_k", 1, ne_q4k, GGML_TYPE_Q4_K, x);
	return w;
}

static uint8_t *
sample_image(gguf_writer **wout, size_t *size)
{
	gguf_writer *w = sample_writer();
	uint8_t    *img = NULL;

	*wout = w;
	if (!w || !gguf_writer_write_buffer(w, &img, size))
		return NULL;
	return img;
}

/* ---- parsing ---------------------------------------------------------------------------- */

TEST(gguf_parse_writer_file)
{
	gguf_writer *w;
	size_t		size;
	uint8_t    *img = sample_image(&w, &size);
	gguf_file  *f = NULL;
	cai_error	err;
	uint64_t	u;
	uint32_t	u32;
	float		fl;
	bool		b;
	gguf_str	s;
	char		buf[8];
	int64_t		iv;
	const gguf_kv *kv;
	const gguf_tensor *t;

	CHECK(img != NULL);
	if (!img)
	{
		gguf_writer_free(w);
		return;
	}
	CHECK_EQ_INT(gguf_open_memory(img, size, &f, &err), CAI_OK);
	if (!f)
	{
		fprintf(stderr, "    %s\n", err.message);
		free(img);
		gguf_writer_free(w);
		return;
	}
	CHECK_EQ_INT(f->version, 3);
	CHECK_EQ_INT(f->n_kv, KV_COUNT);
	CHECK_EQ_INT(f->n_tensors, 4);
	CHECK_EQ_INT(f->alignment, 32);

	/* scalars, widened, and the getters' type and range rules */
	CHECK(gguf_get_u64(f, "t.u8", &u) && u == 200);
	CHECK(gguf_find_kv(f, "t.i8")->v.i64 == -5);
	CHECK(!gguf_get_u64(f, "t.i8", &u));	/* negative */
	CHECK(gguf_get_u32(f, "t.u16", &u32) && u32 == 60000);
	CHECK(gguf_find_kv(f, "t.i16")->v.i64 == -3000);
	CHECK(gguf_get_u32(f, "t.u32", &u32) && u32 == 4000000000u);
	CHECK(gguf_find_kv(f, "t.i32")->v.i64 == -2000000000);
	CHECK(gguf_get_u64(f, "t.u64", &u) && u == (UINT64_C(1) << 63) + 5);
	CHECK(!gguf_get_u32(f, "t.u64", &u32));	/* out of range */
	CHECK(gguf_find_kv(f, "t.i64")->v.i64 == -(INT64_C(1) << 40));
	CHECK(gguf_get_f32(f, "t.f32", &fl) && fl == 1.5f);
	CHECK(gguf_get_f32(f, "t.f64", &fl) && fl == -2.25f);
	CHECK(gguf_get_f32(f, "t.u16", &fl) && fl == 60000.0f);	/* ints read as floats */
	CHECK(gguf_get_f32(f, "t.i8", &fl) && fl == -5.0f);
	CHECK(gguf_get_bool(f, "t.bool", &b) && b);
	CHECK(!gguf_get_bool(f, "t.u8", &b));
	CHECK(!gguf_get_u64(f, "t.bool", &u));
	CHECK(!gguf_get_f32(f, "general.name", &fl));
	CHECK(gguf_get_str(f, "general.name", &s) && s.len == 6 && memcmp(s.ptr, "h\xc3\xa9llo", 6) == 0);
	CHECK(gguf_str_eq(s, "h\xc3\xa9llo"));
	CHECK(!gguf_str_eq(s, "h\xc3\xa9ll"));
	CHECK(gguf_get_cstr(f, "general.name", buf, sizeof(buf)) && strcmp(buf, "h\xc3\xa9llo") == 0);
	CHECK(gguf_get_cstr(f, "general.name", buf, 4) && strcmp(buf, "h\xc3\xa9") == 0);
	CHECK(!gguf_get_cstr(f, "general.name", buf, 0));
	CHECK(!gguf_get_cstr(f, "t.u8", buf, sizeof(buf)));
	CHECK(gguf_get_str(f, "t.empty", &s) && s.len == 0);
	CHECK(!gguf_get_str(f, "t.u32", &s));
	CHECK(gguf_find_kv(f, "missing") == NULL);
	CHECK(!gguf_get_u64(f, "missing", &u));
	CHECK(gguf_find_kv(f, "t.u") == NULL);		/* a prefix is not a match */

	/* arrays */
	kv = gguf_find_kv(f, "t.arr_i32");
	CHECK(kv && kv->type == GGUF_TYPE_ARRAY && kv->v.arr.elem_type == GGUF_TYPE_INT32 && kv->v.arr.n == 5);
	CHECK(gguf_arr_get_i64(kv, 3, &iv) && iv == INT32_MIN);
	CHECK(gguf_arr_get_i64(kv, 4, &iv) && iv == INT32_MAX);
	CHECK(gguf_arr_get_f32(kv, 1, &fl) && fl == -2.0f);
	CHECK(!gguf_arr_get_i64(kv, 5, &iv));
	CHECK(!gguf_arr_get_str(kv, 0, &s));
	kv = gguf_find_kv(f, "t.arr_f32");
	CHECK(gguf_arr_get_f32(kv, 2, &fl) && fl == 1e30f);
	CHECK(!gguf_arr_get_i64(kv, 0, &iv));
	kv = gguf_find_kv(f, "t.arr_u8");
	CHECK(gguf_arr_get_i64(kv, 3, &iv) && iv == 255);
	kv = gguf_find_kv(f, "t.arr_bool");
	CHECK(kv && kv->v.arr.elem_type == GGUF_TYPE_BOOL && kv->v.arr.n == 3 && kv->v.arr.data[1] == 0);
	kv = gguf_find_kv(f, "t.arr_str");
	CHECK(kv && kv->v.arr.elem_type == GGUF_TYPE_STRING && kv->v.arr.n == 4 && kv->v.arr.strs);
	for (int i = 0; i < 4; i++)
		CHECK(gguf_arr_get_str(kv, (uint64_t) i, &s) && gguf_str_eq(s, sample_strs[i]));
	CHECK(!gguf_arr_get_str(kv, 4, &s));
	CHECK(!gguf_arr_get_f32(kv, 0, &fl));
	CHECK(!gguf_arr_get_str(gguf_find_kv(f, "t.u8"), 0, &s));
	kv = gguf_find_kv(f, "t.arr_empty");
	CHECK(kv && kv->v.arr.n == 0 && !gguf_arr_get_i64(kv, 0, &iv));

	/* tensors */
	t = gguf_find_tensor(f, "a.f32");
	CHECK(t && t->type == GGML_TYPE_F32 && t->n_dims == 2 && t->ne[0] == 4 && t->ne[1] == 3 &&
		  t->ne[2] == 1 && t->ne[3] == 1 && t->n_elements == 12 && t->nbytes == 48);
	if (t)
		CHECK(memcmp(t->data, sample_f32, 48) == 0);
	t = gguf_find_tensor(f, "b.f16");
	CHECK(t && t->type == GGML_TYPE_F16 && t->n_dims == 1 && t->nbytes == 16);
	t = gguf_find_tensor(f, "c.q8_0");
	CHECK(t && t->type == GGML_TYPE_Q8_0 && t->n_elements == 128 && t->nbytes == 4 * 34);
	t = gguf_find_tensor(f, "d.q4_k");
	CHECK(t && t->type == GGML_TYPE_Q4_K && t->nbytes == 144);
	if (t)
		CHECK((const uint8_t *) t->data + t->nbytes == img + size);	/* the last one ends the file */
	CHECK(gguf_find_tensor(f, "a.f3") == NULL);
	CHECK(gguf_find_tensor(f, NULL) == NULL);
	for (uint64_t i = 0; i < f->n_tensors; i++)
	{
		const uint8_t *p = f->tensors[i].data;

		CHECK(f->tensors[i].offset % 32 == 0);
		CHECK((size_t) (p - img) == (size_t) gguf_writer_data_offset(w) + f->tensors[i].offset);
	}
	CHECK(strcmp(gguf_value_type_name(GGUF_TYPE_FLOAT64), "float64") == 0);
	CHECK(strcmp(gguf_value_type_name((gguf_value_type) 42), "unknown") == 0);
	gguf_close(f);
	gguf_close(NULL);
	free(img);
	gguf_writer_free(w);
}

TEST(gguf_open_file_and_errors)
{
	char		path[64];
	gguf_writer *w = sample_writer();
	gguf_file  *f = (gguf_file *) 1;
	cai_error	err;
	FILE	   *fp;
	pid_t		child;
	int			status = 0;

	snprintf(path, sizeof(path), "/tmp/cai_test_gguf_%d.gguf", (int) getpid());
	CHECK(w && gguf_writer_write_file(w, path));
	CHECK_EQ_INT(gguf_open(path, &f, &err), CAI_OK);
	if (f && f != (gguf_file *) 1)
	{
		const gguf_tensor *t = gguf_find_tensor(f, "a.f32");

		CHECK(f->map != NULL);
		CHECK(t && memcmp(t->data, sample_f32, 48) == 0);
		gguf_close(f);
	}
	gguf_writer_free(w);

	/* a file too short to be a gguf file, an empty one, a missing one, a directory */
	fp = fopen(path, "wb");
	CHECK(fp != NULL);
	if (fp)
	{
		fwrite("GGUF\3\0\0\0", 1, 8, fp);
		fclose(fp);
	}
	CHECK_EQ_INT(gguf_open(path, &f, &err), CAI_ERR_FORMAT);
	CHECK(f == NULL && strstr(err.message, "too small") != NULL);
	fp = fopen(path, "wb");
	if (fp)
		fclose(fp);
	CHECK_EQ_INT(gguf_open(path, &f, &err), CAI_ERR_FORMAT);
	unlink(path);
	CHECK_EQ_INT(gguf_open(path, &f, &err), CAI_ERR_IO);
	CHECK(f == NULL && strstr(err.message, path) != NULL);
	CHECK_EQ_INT(gguf_open("/tmp", &f, &err), CAI_ERR_IO);
	CHECK_EQ_INT(gguf_open(NULL, &f, &err), CAI_ERR_INVALID_ARGUMENT);

	/*
	 * a FIFO named as the model is refused at once, not waited on for a writer (in a child with
	 * an alarm, so that a regression fails instead of hanging the suite)
	 */
	CHECK(mkfifo(path, 0600) == 0);
	child = fork();
	if (child == 0)
	{
		alarm(10);
		_exit(gguf_open(path, &f, &err) == CAI_ERR_IO &&
			  strstr(err.message, "not a regular file") != NULL ? 0 : 1);
	}
	CHECK(child > 0 && waitpid(child, &status, 0) == child);
	CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a FIFO as the model: status %d",
			  status);
	unlink(path);
	CHECK_EQ_INT(gguf_open_memory(NULL, 10, &f, &err), CAI_ERR_INVALID_ARGUMENT);
	CHECK_EQ_INT(gguf_open_memory("", 0, &f, &err), CAI_ERR_FORMAT);
}

TEST(gguf_alignment)
{
	const uint32_t aligns[3] = {1, 8, 256};

	for (int a = 0; a < 3; a++)
	{
		gguf_writer *w = gguf_writer_new();
		float		x[64] = {0};
		int64_t		ne[1] = {3};
		int64_t		ne2[1] = {64};
		uint8_t    *img;
		size_t		size;
		gguf_file  *f;
		cai_error	err;

		gguf_writer_set_alignment(w, aligns[a]);
		gguf_writer_add_tensor_f32(w, "x", 1, ne, GGML_TYPE_F32, x);
		gguf_writer_add_tensor_f32(w, "y", 1, ne2, GGML_TYPE_Q4_0, x);
		CHECK(gguf_writer_write_buffer(w, &img, &size));
		CHECK_EQ_INT(gguf_open_memory(img, size, &f, &err), CAI_OK);
		if (f)
		{
			const gguf_tensor *y = gguf_find_tensor(f, "y");

			CHECK_EQ_INT(f->alignment, aligns[a]);
			CHECK(y && y->offset == (aligns[a] == 1 ? 12 : (aligns[a] == 8 ? 16 : 256)));
			CHECK(y && ((const uint8_t *) y->data - img) % aligns[a] == 0);
			gguf_close(f);
		}
		free(img);
		gguf_writer_free(w);
	}
}

/* The real model's metadata and shapes, and row values as the gguf Python package reads them. */
TEST(gguf_real_model)
{
	const char *path = test_real_model_path();
	gguf_file  *f;
	cai_error	err;
	uint32_t	u;
	float		fl;
	gguf_str	s;
	const gguf_kv *kv;
	const gguf_tensor *t;
	int			n_by_type[40] = {0};
	float	   *row;

	if (!path)
		SKIP("real model not present");
	CHECK_EQ_INT(gguf_open(path, &f, &err), CAI_OK);
	if (!f)
		return;
	CHECK(gguf_get_str(f, "general.architecture", &s) && gguf_str_eq(s, "llama"));
	CHECK(gguf_get_u32(f, "llama.block_count", &u) && u == 30);
	CHECK(gguf_get_u32(f, "llama.embedding_length", &u) && u == 576);
	CHECK(gguf_get_u32(f, "llama.feed_forward_length", &u) && u == 1536);
	CHECK(gguf_get_u32(f, "llama.attention.head_count", &u) && u == 9);
	CHECK(gguf_get_u32(f, "llama.attention.head_count_kv", &u) && u == 3);
	CHECK(gguf_get_u32(f, "llama.context_length", &u) && u == 8192);
	CHECK(gguf_get_f32(f, "llama.rope.freq_base", &fl) && fl == 100000.0f);
	CHECK(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &fl) && fl == 1e-5f);
	CHECK(gguf_get_str(f, "tokenizer.ggml.pre", &s) && gguf_str_eq(s, "smollm"));
	CHECK(gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &u) && u == 2);
	kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
	CHECK(kv && kv->v.arr.n == 49152);
	CHECK(gguf_arr_get_str(kv, 2, &s) && gguf_str_eq(s, "<|im_end|>"));
	CHECK(gguf_arr_get_str(kv, 49151, &s) && s.len > 0);
	kv = gguf_find_kv(f, "tokenizer.ggml.merges");
	CHECK(kv && kv->v.arr.n == 48900 && gguf_arr_get_str(kv, 0, &s) && gguf_str_eq(s, "Ġ t"));

	CHECK_EQ_INT(f->n_tensors, 272);
	for (uint64_t i = 0; i < f->n_tensors; i++)
		n_by_type[f->tensors[i].type]++;
	CHECK_EQ_INT(n_by_type[GGML_TYPE_F32], 61);
	CHECK_EQ_INT(n_by_type[GGML_TYPE_Q4_1], 210);
	CHECK_EQ_INT(n_by_type[GGML_TYPE_Q8_0], 1);
	t = gguf_find_tensor(f, "token_embd.weight");
	CHECK(t && t->type == GGML_TYPE_Q8_0 && t->ne[0] == 576 && t->ne[1] == 49152);
	t = gguf_find_tensor(f, "blk.29.attn_k.weight");
	CHECK(t && t->type == GGML_TYPE_Q4_1 && t->ne[0] == 576 && t->ne[1] == 192);
	t = gguf_find_tensor(f, "blk.0.ffn_down.weight");
	CHECK(t && t->ne[0] == 1536 && t->ne[1] == 576);
	CHECK(gguf_find_tensor(f, "output_norm.weight") != NULL);
	CHECK(gguf_find_tensor(f, "output.weight") == NULL);	/* tied embeddings */

	/* row 5 of two tensors: the first values and rms that gguf-py's dequantizer gives */
	row = malloc(1536 * sizeof(float));
	if (row)
	{
		const struct
		{
			const char *name;
			float		first[4];
			double		rms;
		}			ref[2] = {
			{"token_embd.weight", {-0.00799560547f, -0.0399780273f, -0.0319824219f, 0.0159912109f}, 0.137233273},
			{"blk.0.attn_q.weight", {0.076171875f, -0.274658203f, -0.0407714844f, 0.894775391f}, 0.339694886},
		};

		for (int r = 0; r < 2; r++)
		{
			size_t		row_bytes;
			double		sq = 0;

			t = gguf_find_tensor(f, ref[r].name);
			if (!t || !ggml_row_bytes(t->type, t->ne[0], &row_bytes))
			{
				CHECK(false);
				continue;
			}
			CHECK_EQ_INT(cai_dequantize_row(t->type, (const uint8_t *) t->data + 5 * row_bytes,
											row, t->ne[0], &err), CAI_OK);
			for (int i = 0; i < 4; i++)
				CHECK_NEAR(row[i], ref[r].first[i], 1e-8);
			for (int i = 0; i < t->ne[0]; i++)
				sq += (double) row[i] * row[i];
			CHECK_NEAR(sqrt(sq / (double) t->ne[0]), ref[r].rms, 1e-6);
		}
		free(row);
	}
	gguf_close(f);
}

/* ---- untrusted input -------------------------------------------------------------------- */

TEST(gguf_truncated_everywhere)
{
	gguf_writer *w;
	size_t		size;
	uint8_t    *img = sample_image(&w, &size);
	int			wrong = 0;

	CHECK(img != NULL);
	if (!img)
	{
		gguf_writer_free(w);
		return;
	}
	/* the full image parses; every strict prefix fails as malformed */
	{
		cai_error	err;

		CHECK_EQ_INT(parse_copy(img, size, &err), CAI_OK);
	}
	for (size_t n = 0; n < size; n++)
	{
		cai_error	err;
		cai_status	st = parse_copy(img, n, &err);

		if (st != CAI_ERR_FORMAT && wrong++ < 5)
			fprintf(stderr, "    truncated at %zu: status %d (%s)\n", n, (int) st, err.message);
	}
	CHECK_EQ_INT(wrong, 0);
	free(img);
	gguf_writer_free(w);
}

TEST(gguf_corrupt_header_and_metadata)
{
	gguf_writer *w;
	size_t		size;
	uint8_t    *img = sample_image(&w, &size);
	uint8_t    *c;

	if (!img || !(c = malloc(size)))
	{
		CHECK(false);
		free(img);
		gguf_writer_free(w);
		return;
	}
#define RESET() memcpy(c, img, size)

	RESET();
	c[0] = 'X';
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "bad magic");
	RESET();
	put_u32(c, 4, 1);
	EXPECT_FAIL(c, size, CAI_ERR_UNSUPPORTED, "version 1");
	RESET();
	put_u32(c, 4, 4);
	EXPECT_FAIL(c, size, CAI_ERR_UNSUPPORTED, "version 4");
	RESET();
	put_u32(c, 4, 0x03000000);
	EXPECT_FAIL(c, size, CAI_ERR_UNSUPPORTED, "big-endian");
	RESET();
	put_u32(c, 4, 2);			/* v2 has the same layout: accepted */
	{
		cai_error	err;

		CHECK_EQ_INT(parse_copy(c, size, &err), CAI_OK);
	}

	/* counts far beyond the file: refused before allocating */
	RESET();
	put_u64(c, 8, UINT64_C(1) << 60);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "tensors");
	RESET();
	put_u64(c, 16, UINT64_C(1) << 60);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "metadata pairs but the file has only");
	RESET();
	put_u64(c, 16, UINT64_C(1) << 30);	/* fits in 32 bits: only the byte bound stops it */
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "metadata pairs but the file has only");
	RESET();
	put_u64(c, 8, UINT64_C(1) << 30);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "tensors but the file has only");
	RESET();
	put_u64(c, 16, UINT64_MAX);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "metadata pairs");
	RESET();
	put_u64(c, 16, KV_COUNT + 1);	/* one pair more than there is: runs into the tensor infos */
	{
		cai_error	err;

		CHECK(parse_copy(c, size, &err) != CAI_OK);
	}

	/* string lengths */
	RESET();
	put_u64(c, gguf_writer_kv_offset(w, 0), UINT64_C(1) << 63);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "key of metadata pair 0");
	RESET();
	put_u64(c, kv_value_offset(w, img, KV_STR), UINT64_MAX);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "'general.name'");
	RESET();
	put_u64(c, kv_value_offset(w, img, KV_STR), size);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "past end of file");

	/* value types */
	RESET();
	put_u32(c, kv_type_offset(w, img, KV_U32), 13);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "unknown value type 13");
	RESET();
	put_u32(c, kv_type_offset(w, img, KV_U32), UINT32_MAX);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "unknown value type");

	/* arrays: element type, counts */
	RESET();
	put_u32(c, kv_value_offset(w, img, KV_ARR_I32), 99);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "unknown element type 99");
	RESET();
	put_u32(c, kv_value_offset(w, img, KV_ARR_I32), GGUF_TYPE_ARRAY);
	EXPECT_FAIL(c, size, CAI_ERR_UNSUPPORTED, "array of arrays");
	RESET();
	put_u64(c, kv_value_offset(w, img, KV_ARR_I32) + 4, UINT64_C(1) << 62);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "'t.arr_i32'");
	RESET();
	put_u64(c, kv_value_offset(w, img, KV_ARR_I32) + 4, UINT64_MAX);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "'t.arr_i32'");
	RESET();
	put_u64(c, kv_value_offset(w, img, KV_ARR_STR) + 4, UINT64_C(1) << 60);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "strings but only");
	RESET();
	/* the array's third string (after "alpha" and "") claims 2^40 bytes */
	put_u64(c, kv_value_offset(w, img, KV_ARR_STR) + 12 + 13 + 8, UINT64_C(1) << 40);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "string 2 of array 't.arr_str'");

	/* duplicate key: rename t.i8 to t.u8 */
	RESET();
	memcpy(c + gguf_writer_kv_offset(w, KV_I8) + 8, "t.u8", 4);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "duplicate metadata key 't.u8'");
#undef RESET
	free(c);
	free(img);
	gguf_writer_free(w);
}

TEST(gguf_corrupt_tensor_infos)
{
	gguf_writer *w;
	size_t		size;
	uint8_t    *img = sample_image(&w, &size);
	uint8_t    *c;
	int64_t		nd0,
				nd2,
				type0,
				type2,
				type3;

	if (!img || !(c = malloc(size)))
	{
		CHECK(false);
		free(img);
		gguf_writer_free(w);
		return;
	}
	nd0 = tensor_ndims_offset(w, img, 0);	/* a.f32 [4, 3] */
	nd2 = tensor_ndims_offset(w, img, 2);	/* c.q8_0 [64, 2] */
	type0 = tensor_type_offset(w, img, 0);
	type2 = tensor_type_offset(w, img, 2);
	type3 = tensor_type_offset(w, img, 3);	/* d.q4_k, the last */
#define RESET() memcpy(c, img, size)

	RESET();
	put_u64(c, gguf_writer_tensor_info_offset(w, 1), UINT64_C(1) << 50);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "name of tensor 1");

	/* dimensions */
	RESET();
	put_u32(c, nd0, 5);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "has 5 dimensions");
	RESET();
	put_u32(c, nd0, 0);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "has 0 dimensions");
	RESET();
	put_u64(c, nd0 + 4, 0);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "dimension 0 is 0");
	RESET();
	put_u64(c, nd0 + 12, (uint64_t) -3);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "dimension 1 is -3");
	RESET();
	put_u64(c, nd2 + 4, UINT64_C(1) << 40);		/* 2^40 x 2^40: the element count overflows */
	put_u64(c, nd2 + 12, UINT64_C(1) << 40);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "element count overflows");
	RESET();
	put_u64(c, nd0 + 4, UINT64_C(1) << 31);		/* 2^62 floats: 2^64 bytes overflow */
	put_u64(c, nd0 + 12, UINT64_C(1) << 31);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "byte size overflows");
	RESET();
	put_u64(c, nd0 + 4, UINT64_C(1) << 30);		/* fits in size_t, not in the file */
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "extends past end of file");
	RESET();
	put_u64(c, nd2 + 4, 48);	/* not a whole number of 32-element blocks */
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "not a multiple of its block size 32");

	/* types */
	RESET();
	put_u32(c, type0, 4);		/* Q4_2, removed from ggml */
	EXPECT_FAIL(c, size, CAI_ERR_UNSUPPORTED, "ggml type 4");
	RESET();
	put_u32(c, type0, 1000);
	EXPECT_FAIL(c, size, CAI_ERR_UNSUPPORTED, "ggml type 1000");
	RESET();
	put_u32(c, type0, GGML_TYPE_Q8_1);		/* known but not dequantizable: parses */
	put_u64(c, nd0 + 4, 32);
	put_u64(c, nd0 + 12, 1);
	{
		cai_error	err;

		CHECK_EQ_INT(parse_copy(c, size, &err), CAI_OK);
	}

	/* offsets */
	RESET();
	put_u64(c, type2 + 4, get_u64(img, type2 + 4) + 1);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "not a multiple of the alignment 32");
	RESET();
	put_u64(c, type3 + 4, get_u64(img, type3 + 4) + 32);	/* aligned, but runs past the end */
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "tensor 'd.q4_k' data [offset");
	RESET();
	put_u64(c, type3 + 4, UINT64_C(1) << 63);
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "extends past end of file");
	RESET();
	put_u64(c, type3 + 4, UINT64_MAX - 31);		/* aligned; offset + nbytes would wrap */
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "extends past end of file");

	/* tensors sharing bytes: aliases would let a small file stand for huge weights */
	RESET();
	put_u64(c, type3 + 4, get_u64(img, type2 + 4));
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "the data of tensors 'c.q8_0' and 'd.q4_k' overlap");
	RESET();
	put_u64(c, type2 + 4, get_u64(img, type2 + 4) + 32);	/* into d.q4_k's first bytes */
	EXPECT_FAIL(c, size, CAI_ERR_FORMAT, "overlap");
#undef RESET
	free(c);
	free(img);
	gguf_writer_free(w);
}

TEST(gguf_corrupt_alignment_and_duplicates)
{
	gguf_writer *w = gguf_writer_new();
	float		x[32] = {0};
	int64_t		ne[1] = {32};
	uint8_t    *img;
	size_t		size;
	int64_t		val;

	gguf_writer_set_alignment(w, 64);	/* writes general.alignment as pair 0 */
	gguf_writer_add_tensor_f32(w, "t", 1, ne, GGML_TYPE_F32, x);
	CHECK(gguf_writer_write_buffer(w, &img, &size));
	val = kv_value_offset(w, img, 0);
	put_u32(img, val, 48);
	EXPECT_FAIL(img, size, CAI_ERR_FORMAT, "alignment 48 is not a power of two");
	put_u32(img, val, 0);
	EXPECT_FAIL(img, size, CAI_ERR_FORMAT, "alignment 0 is not a power of two");
	put_u32(img, val, 0x80000000u);
	EXPECT_FAIL(img, size, CAI_ERR_FORMAT, "is not a power of two");
	put_u32(img, kv_type_offset(w, img, 0), GGUF_TYPE_FLOAT32);
	EXPECT_FAIL(img, size, CAI_ERR_FORMAT, "general.alignment has type float32");
	free(img);
	gguf_writer_free(w);

	/* the writer does not check names, so it can make a file with a repeated one */
	w = gguf_writer_new();
	gguf_writer_add_u32(w, "k", 1);
	gguf_writer_add_tensor_f32(w, "blk.0.attn_q.weight", 1, ne, GGML_TYPE_F32, x);
	gguf_writer_add_tensor_f32(w, "other", 1, ne, GGML_TYPE_F32, x);
	gguf_writer_add_tensor_f32(w, "blk.0.attn_q.weight", 1, ne, GGML_TYPE_F32, x);
	CHECK(gguf_writer_write_buffer(w, &img, &size));
	EXPECT_FAIL(img, size, CAI_ERR_FORMAT, "duplicate tensor name 'blk.0.attn_q.weight'");
	free(img);
	gguf_writer_free(w);

	w = gguf_writer_new();
	gguf_writer_add_u32(w, "k", 1);
	gguf_writer_add_str(w, "k", "again");
	CHECK(gguf_writer_write_buffer(w, &img, &size));
	EXPECT_FAIL(img, size, CAI_ERR_FORMAT, "duplicate metadata key 'k'");
	free(img);
	gguf_writer_free(w);
}

/*
 * Random mutations of 1-4 bytes anywhere before the data section: any outcome is fine as long
 * as it is a clean one (parse_copy checks failures carry a message and successes keep every
 * tensor inside the buffer; valgrind checks the rest).
 */
TEST(gguf_random_mutations)
{
	gguf_writer *w;
	size_t		size;
	uint8_t    *img = sample_image(&w, &size);
	uint8_t    *c;
	uint64_t	rs = 0x9e3779b97f4a7c15ULL;
	size_t		meta;
	int			n_ok = 0;

	if (!img || !(c = malloc(size)))
	{
		CHECK(false);
		free(img);
		gguf_writer_free(w);
		return;
	}
	meta = (size_t) gguf_writer_data_offset(w);
	for (int iter = 0; iter < 3000; iter++)
	{
		int			n = 1 + (int) (xorshift(&rs) % 4);
		cai_error	err;

		memcpy(c, img, size);
		for (int k = 0; k < n; k++)
		{
			size_t		pos = (size_t) (xorshift(&rs) % meta);
			uint64_t	r = xorshift(&rs);

			/* mostly random bytes, sometimes extreme ones (0x00, 0xff, 0x80) */
			c[pos] = (r & 3) == 0 ? 0xff : (r & 3) == 1 ? 0x00 : (r & 3) == 2 ? 0x80 : (uint8_t) (r >> 8);
		}
		if (parse_copy(c, size, &err) == CAI_OK)
			n_ok++;
	}
	/* some mutations hit string bytes or values and still parse; most break something */
	CHECK(n_ok > 0 && n_ok < 3000);
	free(c);
	free(img);
	gguf_writer_free(w);
}

/* ---- the synthetic models --------------------------------------------------------------- */

static gguf_file *
open_synth(const synth_model_config *cfg, uint8_t **img)
{
	size_t		size;
	cai_error	err;
	gguf_file  *f = NULL;

	if (synth_model_write_buffer(cfg, img, &size, &err) != CAI_OK)
	{
		fprintf(stderr, "    synth: %s\n", err.message);
		return NULL;
	}
	if (gguf_open_memory(*img, size, &f, &err) != CAI_OK)
		fprintf(stderr, "    gguf: %s\n", err.message);
	return f;
}

static bool
has_tensor(const gguf_file *f, const char *name, int64_t ne0, int64_t ne1, ggml_type type)
{
	const gguf_tensor *t = gguf_find_tensor(f, name);

	if (!t)
		fprintf(stderr, "    missing tensor %s\n", name);
	return t && t->ne[0] == ne0 && t->ne[1] == ne1 && t->type == type &&
		t->n_dims == (uint32_t) (ne1 > 1 ? 2 : 1);
}

TEST(synth_vocabulary)
{
	int			n = synth_model_n_vocab();
	char		a[64],
				b[64];

	CHECK(n % 4 == 0);
	CHECK_EQ_INT(n, SYNTH_FIRST_MERGE_TOKEN + synth_model_n_merges());
	CHECK(synth_model_token(SYNTH_TOKEN_IM_END, a, sizeof(a)) > 0 && strcmp(a, "<|im_end|>") == 0);
	CHECK(synth_model_token(SYNTH_FIRST_BYTE_TOKEN, a, sizeof(a)) == 1 && strcmp(a, "!") == 0);
	/* bytes 0x20 and 0x0a are the 33rd and 11th non-printable bytes: U+0120 and U+010A */
	CHECK(synth_model_token(SYNTH_FIRST_BYTE_TOKEN + 188 + 32, a, sizeof(a)) == 2 && strcmp(a, "Ġ") == 0);
	CHECK(synth_model_token(SYNTH_FIRST_BYTE_TOKEN + 188 + 10, a, sizeof(a)) == 2 && strcmp(a, "Ċ") == 0);
	CHECK(synth_model_token(SYNTH_FIRST_BYTE_TOKEN + 255, a, sizeof(a)) == 2 && strcmp(a, "Ń") == 0);
	CHECK(synth_model_token(SYNTH_FIRST_BYTE_TOKEN + 187, a, sizeof(a)) == 2 && strcmp(a, "ÿ") == 0);
	CHECK(synth_model_token(n, a, sizeof(a)) == -1);
	CHECK(synth_model_token(-1, a, sizeof(a)) == -1);
	CHECK(synth_model_token(SYNTH_TOKEN_IM_END, a, 5) == -1);

	/* all tokens distinct */
	for (int i = 0; i < n; i++)
	{
		synth_model_token(i, a, sizeof(a));
		for (int j = i + 1; j < n; j++)
		{
			synth_model_token(j, b, sizeof(b));
			CHECK_MSG(strcmp(a, b) != 0, "tokens %d and %d are both \"%s\"", i, j, a);
		}
	}
	/* every merge's parts are tokens earlier in the vocabulary, its result is its own token */
	for (int m = 0; m < synth_model_n_merges(); m++)
	{
		const char *merge = synth_model_merge(m);
		const char *sp = strchr(merge, ' ');
		bool		left = false,
					right = false;

		CHECK(sp && strchr(sp + 1, ' ') == NULL);
		if (!sp)
			continue;
		for (int i = 0; i < SYNTH_FIRST_MERGE_TOKEN + m; i++)
		{
			synth_model_token(i, a, sizeof(a));
			left |= strlen(a) == (size_t) (sp - merge) && strncmp(a, merge, (size_t) (sp - merge)) == 0;
			right |= strcmp(a, sp + 1) == 0;
		}
		CHECK_MSG(left && right, "merge \"%s\" has a part that is not an earlier token", merge);
		synth_model_token(SYNTH_FIRST_MERGE_TOKEN + m, a, sizeof(a));
		snprintf(b, sizeof(b), "%.*s%s", (int) (sp - merge), merge, sp + 1);
		CHECK(strcmp(a, b) == 0);
	}
	CHECK(synth_model_merge(synth_model_n_merges()) == NULL);
}

TEST(synth_llama_default)
{
	synth_model_config cfg;
	uint8_t    *img = NULL;
	gguf_file  *f;
	gguf_str	s;
	uint32_t	u;
	float		fl;
	bool		b;
	const gguf_kv *kv;
	int			n_vocab = synth_model_n_vocab();

	synth_model_default_config(&cfg);
	f = open_synth(&cfg, &img);
	CHECK(f != NULL);
	if (!f)
	{
		free(img);
		return;
	}
	CHECK(gguf_get_str(f, "general.architecture", &s) && gguf_str_eq(s, "llama"));
	CHECK(gguf_get_u32(f, "llama.block_count", &u) && u == 2);
	CHECK(gguf_get_u32(f, "llama.embedding_length", &u) && u == 64);
	CHECK(gguf_get_u32(f, "llama.feed_forward_length", &u) && u == 128);
	CHECK(gguf_get_u32(f, "llama.attention.head_count", &u) && u == 4);
	CHECK(gguf_get_u32(f, "llama.attention.head_count_kv", &u) && u == 2);
	CHECK(gguf_get_u32(f, "llama.context_length", &u) && u == 256);
	CHECK(gguf_get_u32(f, "llama.rope.dimension_count", &u) && u == 16);
	CHECK(gguf_get_u32(f, "llama.vocab_size", &u) && u == (uint32_t) n_vocab);
	CHECK(gguf_get_f32(f, "llama.rope.freq_base", &fl) && fl == 10000.0f);
	CHECK(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &fl) && fl == 1e-5f);
	CHECK(gguf_find_kv(f, "llama.attention.key_length") == NULL);
	CHECK(gguf_get_str(f, "tokenizer.ggml.model", &s) && gguf_str_eq(s, "gpt2"));
	CHECK(gguf_get_str(f, "tokenizer.ggml.pre", &s) && gguf_str_eq(s, "smollm"));
	CHECK(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b) && !b);
	CHECK(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &u) && u == SYNTH_TOKEN_IM_START);
	CHECK(gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &u) && u == SYNTH_TOKEN_IM_END);
	CHECK(gguf_get_str(f, "tokenizer.chat_template", &s) && s.len > 0);
	{
		char		tmpl[1024];

		CHECK(gguf_get_cstr(f, "tokenizer.chat_template", tmpl, sizeof(tmpl)));
		CHECK(strstr(tmpl, "'<|im_start|>' + message['role']") != NULL);
		CHECK(strstr(tmpl, "add_generation_prompt") != NULL);
	}
	kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
	CHECK(kv && kv->v.arr.n == (uint64_t) n_vocab);
	for (int i = 0; kv && i < n_vocab; i++)
	{
		char		t[64];

		synth_model_token(i, t, sizeof(t));
		CHECK(gguf_arr_get_str(kv, (uint64_t) i, &s) && gguf_str_eq(s, t));
	}
	kv = gguf_find_kv(f, "tokenizer.ggml.token_type");
	CHECK(kv && kv->v.arr.elem_type == GGUF_TYPE_INT32 && kv->v.arr.n == (uint64_t) n_vocab);
	for (int i = 0; kv && i < n_vocab; i++)
	{
		int64_t		ty;

		CHECK(gguf_arr_get_i64(kv, (uint64_t) i, &ty) && ty == (i < 3 ? 3 : 1));
	}
	kv = gguf_find_kv(f, "tokenizer.ggml.merges");
	CHECK(kv && kv->v.arr.n == (uint64_t) synth_model_n_merges());
	CHECK(gguf_arr_get_str(kv, 8, &s) && gguf_str_eq(s, "Ġt he"));

	/* 1 embedding + 2 x 9 + output_norm, tied: no output.weight */
	CHECK_EQ_INT(f->n_tensors, 20);
	CHECK(has_tensor(f, "token_embd.weight", 64, n_vocab, GGML_TYPE_F32));
	CHECK(has_tensor(f, "output_norm.weight", 64, 1, GGML_TYPE_F32));
	CHECK(gguf_find_tensor(f, "output.weight") == NULL);
	for (int l = 0; l < 2; l++)
	{
		char		name[64];

#define LAYER(suffix, ne0, ne1) (snprintf(name, sizeof(name), "blk.%d.%s", l, suffix), \
								 has_tensor(f, name, ne0, ne1, GGML_TYPE_F32))
		CHECK(LAYER("attn_norm.weight", 64, 1));
		CHECK(LAYER("attn_q.weight", 64, 64));
		CHECK(LAYER("attn_k.weight", 64, 32));
		CHECK(LAYER("attn_v.weight", 64, 32));
		CHECK(LAYER("attn_output.weight", 64, 64));
		CHECK(LAYER("ffn_norm.weight", 64, 1));
		CHECK(LAYER("ffn_gate.weight", 64, 128));
		CHECK(LAYER("ffn_up.weight", 64, 128));
		CHECK(LAYER("ffn_down.weight", 128, 64));
#undef LAYER
		snprintf(name, sizeof(name), "blk.%d.attn_q.bias", l);
		CHECK(gguf_find_tensor(f, name) == NULL);
	}

	/* weight statistics: projections std 0.5/sqrt(fan_in), norms around 1 */
	{
		const gguf_tensor *t = gguf_find_tensor(f, "blk.1.ffn_down.weight");
		const float *x = t->data;
		double		sum = 0,
					sq = 0;

		for (int64_t i = 0; i < t->n_elements; i++)
		{
			sum += x[i];
			sq += (double) x[i] * x[i];
		}
		CHECK_NEAR(sqrt(sq / (double) t->n_elements), 0.5 / sqrt(128.0), 0.1 * 0.5 / sqrt(128.0));
		CHECK(fabs(sum / (double) t->n_elements) < 0.01);
		t = gguf_find_tensor(f, "blk.0.attn_norm.weight");
		x = t->data;
		sum = 0;
		for (int64_t i = 0; i < t->n_elements; i++)
			sum += x[i];
		CHECK_NEAR(sum / 64.0, 1.0, 0.05);
	}
	gguf_close(f);
	free(img);
}

TEST(synth_qwen2_untied_custom_head_dim)
{
	synth_model_config cfg;
	uint8_t    *img = NULL;
	gguf_file  *f;
	uint32_t	u;
	gguf_str	s;
	int			n_vocab = synth_model_n_vocab();

	synth_model_default_config(&cfg);
	cfg.arch = "qwen2";
	cfg.n_layers = 3;
	cfg.n_heads = 4;
	cfg.n_kv_heads = 1;
	cfg.head_dim = 32;			/* n_heads * head_dim = 128 != d_model */
	cfg.tied_embeddings = false;
	cfg.weight_type = GGML_TYPE_Q8_0;
	cfg.embd_type = GGML_TYPE_F16;
	cfg.tokenizer_pre = "qwen2";
	cfg.chat_template = "{{ custom }}";
	f = open_synth(&cfg, &img);
	CHECK(f != NULL);
	if (!f)
	{
		free(img);
		return;
	}
	CHECK(gguf_get_str(f, "general.architecture", &s) && gguf_str_eq(s, "qwen2"));
	CHECK(gguf_get_u32(f, "qwen2.block_count", &u) && u == 3);
	CHECK(gguf_get_u32(f, "qwen2.attention.key_length", &u) && u == 32);
	CHECK(gguf_get_u32(f, "qwen2.attention.value_length", &u) && u == 32);
	CHECK(gguf_get_u32(f, "qwen2.rope.dimension_count", &u) && u == 32);
	CHECK(gguf_get_str(f, "tokenizer.ggml.pre", &s) && gguf_str_eq(s, "qwen2"));
	CHECK(gguf_get_str(f, "tokenizer.chat_template", &s) && gguf_str_eq(s, "{{ custom }}"));
	CHECK(gguf_find_kv(f, "llama.block_count") == NULL);
	CHECK_EQ_INT(f->n_tensors, 1 + 3 * 12 + 2);
	CHECK(has_tensor(f, "token_embd.weight", 64, n_vocab, GGML_TYPE_F16));
	CHECK(has_tensor(f, "output.weight", 64, n_vocab, GGML_TYPE_Q8_0));
	CHECK(has_tensor(f, "blk.2.attn_q.weight", 64, 128, GGML_TYPE_Q8_0));
	CHECK(has_tensor(f, "blk.2.attn_k.weight", 64, 32, GGML_TYPE_Q8_0));
	CHECK(has_tensor(f, "blk.2.attn_output.weight", 128, 64, GGML_TYPE_Q8_0));
	CHECK(has_tensor(f, "blk.2.attn_q.bias", 128, 1, GGML_TYPE_F32));
	CHECK(has_tensor(f, "blk.2.attn_k.bias", 32, 1, GGML_TYPE_F32));
	CHECK(has_tensor(f, "blk.2.attn_v.bias", 32, 1, GGML_TYPE_F32));
	gguf_close(f);
	free(img);
}

/*
 * Each weight type stores the same seeded floats: dequantized, every type is close to the F32
 * model's values (so the writer's quantizers and the reader's decoders agree end to end).
 */
TEST(synth_every_weight_type)
{
	const ggml_type types[] = {
		GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
		GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K
	};
	const double max_rel_rms[] = {0.001, 0.005, 0.01, 0.15, 0.12, 0.15, 0.08, 0.04};
	synth_model_config cfg;
	uint8_t    *ref_img = NULL;
	gguf_file  *ref;
	const gguf_tensor *rt;
	float	   *y;

	synth_model_default_config(&cfg);
	cfg.d_model = 256;
	cfg.d_ff = 512;
	cfg.n_heads = 4;
	cfg.n_kv_heads = 4;
	cfg.n_layers = 1;
	ref = open_synth(&cfg, &ref_img);
	CHECK(ref != NULL);
	if (!ref)
	{
		free(ref_img);
		return;
	}
	rt = gguf_find_tensor(ref, "blk.0.ffn_down.weight");
	y = malloc((size_t) rt->n_elements * sizeof(float));
	for (size_t k = 0; y && k < sizeof(types) / sizeof(types[0]); k++)
	{
		uint8_t    *img = NULL;
		gguf_file  *f;
		const gguf_tensor *t;
		const float *x = rt->data;
		cai_error	err;
		double		se = 0,
					sx = 0;

		cfg.weight_type = types[k];
		cfg.embd_type = types[k];
		f = open_synth(&cfg, &img);
		CHECK_MSG(f != NULL, "type %s", ggml_type_name(types[k]));
		if (!f)
		{
			free(img);
			continue;
		}
		CHECK(gguf_find_tensor(f, "token_embd.weight")->type == types[k]);
		t = gguf_find_tensor(f, "blk.0.ffn_down.weight");
		CHECK(t && t->type == types[k] && t->ne[0] == 512 && t->ne[1] == 256);
		CHECK_EQ_INT(cai_dequantize_row(t->type, t->data, y, t->n_elements, &err), CAI_OK);
		for (int64_t i = 0; i < t->n_elements; i++)
		{
			se += (double) (y[i] - x[i]) * (y[i] - x[i]);
			sx += (double) x[i] * x[i];
		}
		CHECK_MSG(sqrt(se / sx) < max_rel_rms[k], "%s: relative rms error %g",
				  ggml_type_name(types[k]), sqrt(se / sx));
		gguf_close(f);
		free(img);
	}
	free(y);
	gguf_close(ref);
	free(ref_img);
}

TEST(synth_deterministic_and_checked)
{
	synth_model_config cfg;
	uint8_t    *a = NULL,
			   *b = NULL;
	size_t		na,
				nb;
	cai_error	err;
	char		path[64];
	gguf_file  *f;

	synth_model_default_config(&cfg);
	CHECK_EQ_INT(synth_model_write_buffer(&cfg, &a, &na, &err), CAI_OK);
	CHECK_EQ_INT(synth_model_write_buffer(&cfg, &b, &nb, &err), CAI_OK);
	CHECK(a && b && na == nb && memcmp(a, b, na) == 0);
	free(b);
	cfg.seed = 2;
	CHECK_EQ_INT(synth_model_write_buffer(&cfg, &b, &nb, &err), CAI_OK);
	CHECK(a && b && na == nb && memcmp(a, b, na) != 0);
	free(a);
	free(b);

	/* to a file */
	snprintf(path, sizeof(path), "/tmp/cai_test_synth_%d.gguf", (int) getpid());
	CHECK_EQ_INT(synth_model_write(path, &cfg, &err), CAI_OK);
	CHECK_EQ_INT(gguf_open(path, &f, &err), CAI_OK);
	if (f)
		gguf_close(f);
	unlink(path);
	CHECK_EQ_INT(synth_model_write("/nonexistent-dir/x.gguf", &cfg, &err), CAI_ERR_IO);

	/* configs that cannot be built */
	synth_model_default_config(&cfg);
	cfg.weight_type = GGML_TYPE_Q4_K;	/* 64-wide rows are not whole 256-element blocks */
	CHECK_EQ_INT(synth_model_write_buffer(&cfg, &a, &na, &err), CAI_ERR_INVALID_ARGUMENT);
	CHECK(a == NULL && strstr(err.message, "q4_k") != NULL);
	synth_model_default_config(&cfg);
	cfg.n_kv_heads = 3;
	CHECK_EQ_INT(synth_model_write_buffer(&cfg, &a, &na, &err), CAI_ERR_INVALID_ARGUMENT);
	synth_model_default_config(&cfg);
	cfg.n_heads = 5;
	cfg.n_kv_heads = 5;
	CHECK_EQ_INT(synth_model_write_buffer(&cfg, &a, &na, &err), CAI_ERR_INVALID_ARGUMENT);
	synth_model_default_config(&cfg);
	cfg.arch = "gpt9";
	CHECK_EQ_INT(synth_model_write_buffer(&cfg, &a, &na, &err), CAI_ERR_INVALID_ARGUMENT);
	synth_model_default_config(&cfg);
	cfg.weight_type = GGML_TYPE_Q2_K;
	CHECK_EQ_INT(synth_model_write_buffer(&cfg, &a, &na, &err), CAI_ERR_INVALID_ARGUMENT);
}
