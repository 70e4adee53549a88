/*
 * fuzz_gguf.c — the GGUF reader and the model loader on arbitrary bytes.
 *
 * The bytes are opened with gguf_open_memory; a file that opens is walked through every
 * accessor (each metadata pair by key and type, each array element, each tensor by name, its
 * first and last data byte, a dequantized first row), and its tokenizer is loaded.  Then the same
 * bytes go through cai_model_load (from a memory file: the path the server takes, mmap and all),
 * (with GPTQ rounding or the float reference for some input sizes), and a model that
 * loads is described, tokenizes and detokenizes, and builds a chat prompt.
 * The seeds are tiny synthetic models (tests/fuzz/gen_corpus.c), so mutations reach the loader's
 * shape and type checks, not only the header.  Invariants: nothing but the sanitizers' and
 * these: a failed open or load reports a status other than CAI_OK with a message; look-ups of
 * what the file holds find it.
 */
#include "fuzz_common.h"
#include "gguf.h"
#include "quant.h"

/* A dequantized row is capped at this many values (the fuzzer's files are small anyway). */
#define MAX_ROW 4096

/* Reads the first and last of n bytes at p, so that ASan checks they lie in the buffer. */
static void
touch(const void *p, size_t n)
{
	volatile uint8_t sink;

	if (n == 0)
		return;
	sink = ((const uint8_t *) p)[0];
	sink = ((const uint8_t *) p)[n - 1];
	(void) sink;
}

/* Every accessor over one metadata pair. */
static void
walk_kv(const gguf_file *f, const gguf_kv *kv)
{
	char		key[256];
	uint64_t	u64;
	uint32_t	u32;
	float		f32;
	bool		b;
	gguf_str	s;
	char		buf[8];

	/* look it up by name when the name is a C string that fits */
	if (kv->key.len < sizeof(key) && !memchr(kv->key.ptr, '\0', kv->key.len))
	{
		memcpy(key, kv->key.ptr, kv->key.len);
		key[kv->key.len] = '\0';
		FUZZ_CHECK(gguf_find_kv(f, key) == kv);
		FUZZ_CHECK(gguf_str_eq(kv->key, key));
		gguf_get_u64(f, key, &u64);
		gguf_get_u32(f, key, &u32);
		gguf_get_f32(f, key, &f32);
		gguf_get_bool(f, key, &b);
		if (gguf_get_str(f, key, &s))
			touch(s.ptr, s.len);
		gguf_get_cstr(f, key, buf, sizeof(buf));
	}
	(void) gguf_value_type_name(kv->type);
	if (kv->type != GGUF_TYPE_ARRAY)
		return;
	for (uint64_t i = 0; i <= kv->v.arr.n && i < 4096; i++)
	{
		int64_t		i64;
		bool		in = i < kv->v.arr.n;

		if (gguf_arr_get_str(kv, i, &s))
		{
			FUZZ_CHECK(in && kv->v.arr.elem_type == GGUF_TYPE_STRING);
			touch(s.ptr, s.len);
		}
		if (gguf_arr_get_f32(kv, i, &f32) || gguf_arr_get_i64(kv, i, &i64))
			FUZZ_CHECK(in);
	}
}

/* Every accessor over one tensor, and its first row dequantized. */
static void
walk_tensor(const gguf_file *f, const gguf_tensor *t)
{
	char		name[256];
	size_t		row_bytes;

	if (t->name.len < sizeof(name) && !memchr(t->name.ptr, '\0', t->name.len))
	{
		memcpy(name, t->name.ptr, t->name.len);
		name[t->name.len] = '\0';
		FUZZ_CHECK(gguf_find_tensor(f, name) == t);
	}
	FUZZ_CHECK(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS);
	FUZZ_CHECK(t->data != NULL || t->nbytes == 0);
	touch(t->data, t->nbytes);
	(void) ggml_type_name(t->type);
	if (ggml_type_can_dequantize(t->type) && t->ne[0] <= MAX_ROW &&
		ggml_row_bytes(t->type, t->ne[0], &row_bytes))
	{
		float		row[MAX_ROW];
		cai_error	err;

		FUZZ_CHECK(row_bytes <= t->nbytes);
		FUZZ_CHECK(cai_dequantize_row(t->type, t->data, row, t->ne[0], &err) == CAI_OK);
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	gguf_file  *f = NULL;
	cai_error	err;
	cai_status	st;
	cai_model  *model = NULL;
	cai_model_params params;

	st = gguf_open_memory(data, size, &f, &err);
	if (st != CAI_OK)
	{
		FUZZ_CHECK(f == NULL && err.status == st && err.message[0] != '\0');
		return 0;
	}
	for (uint64_t i = 0; i < f->n_kv; i++)
		walk_kv(f, &f->kv[i]);
	for (uint64_t i = 0; i < f->n_tensors; i++)
		walk_tensor(f, &f->tensors[i]);
	{
		cai_tokenizer *tok = NULL;

		st = cai_tokenizer_load(f, &tok, &err);
		FUZZ_CHECK((st == CAI_OK) == (tok != NULL));
		cai_tokenizer_free(tok);
	}
	gguf_close(f);

	cai_model_params_default(&params);
	params.n_threads = 1;
	/* the loader's other paths, picked by the input's size so that a crash input replays */
	params.rounding = size % 4 == 1 ? CAI_ROUNDING_GPTQ : CAI_ROUNDING_NEAREST;
	params.activations = CAI_ACTIVATIONS_INT8;
	params.load_float_reference = size % 4 == 2;
	st = fuzz_model_load(data, size, &params, &model, &err);
	if (getenv("FUZZ_VERBOSE"))	/* which check an input reaches, when growing the corpus */
		fprintf(stderr, "model load: %s\n", st == CAI_OK ? "ok" : err.message);
	FUZZ_CHECK((st == CAI_OK) == (model != NULL));
	if (st != CAI_OK)
		FUZZ_CHECK(err.status == st && err.message[0] != '\0');
	else
	{
		fuzz_use_model(model);
		cai_model_free(model);
	}
	return 0;
}
