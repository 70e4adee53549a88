/*
 * gguf_writer.c — the in-memory GGUF v3 builder and block quantizers the tests use to make
 * synthetic models and corrupt files (see gguf_writer.h).
 *
 * Metadata is serialized as it is added into one growing byte buffer; tensors keep their
 * converted bytes until the image is written.  The quantizers follow ggml's block layouts
 * (documented in src/gguf/quant.c) with simple, deterministic scale choices: they exist to
 * produce valid blocks, not to match llama.cpp's quantization quality bit for bit.
 */
#include "gguf_writer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"
#include "util.h"

typedef struct writer_tensor
{
	char	   *name;
	uint32_t	n_dims;
	int64_t		ne[GGUF_MAX_DIMS];
	ggml_type	type;
	uint8_t    *data;			/* NULL for a generated tensor */
	size_t		nbytes;
	gguf_tensor_gen gen;
	void	   *gen_state;		/* as added: each write starts from a copy */
	size_t		gen_state_size;
} writer_tensor;

/* A growable byte buffer. */
typedef struct byte_buf
{
	uint8_t    *p;
	size_t		len;
	size_t		cap;
} byte_buf;

struct gguf_writer
{
	bool		failed;
	char		error[256];
	uint32_t	alignment;
	byte_buf	kv;				/* serialized metadata pairs */
	uint64_t	n_kv;
	size_t	   *kv_starts;		/* offset of each pair within kv */
	size_t		kv_starts_cap;
	writer_tensor *tensors;
	uint64_t	n_tensors;
	size_t		tensors_cap;
	/* offsets in the last written image */
	size_t		image_kv_start;
	size_t	   *image_tensor_info;
	size_t		image_data_start;
	bool		written;
};

/* Records the first failure (later ones keep the first message). */
static void
writer_fail(gguf_writer *w, const char *fmt, const char *arg)
{
	if (w->failed)
		return;
	w->failed = true;
	snprintf(w->error, sizeof(w->error), fmt, arg ? arg : "");
}

/* Grows b to hold extra more bytes; false when that overflows or fails. */
static bool
buf_reserve(byte_buf *b, size_t extra)
{
	size_t		need;
	size_t		cap;
	uint8_t    *p;

	if (!cai_add_size(b->len, extra, &need))
		return false;
	if (need <= b->cap)
		return true;
	cap = b->cap ? b->cap : 256;
	while (cap < need)
	{
		if (!cai_mul_size(cap, 2, &cap))
			return false;
	}
	p = realloc(b->p, cap);
	if (!p)
		return false;
	b->p = p;
	b->cap = cap;
	return true;
}

/* Appends bytes to b, failing the writer when out of memory. */
static void
buf_put(gguf_writer *w, byte_buf *b, const void *data, size_t n)
{
	if (w->failed)
		return;
	if (!buf_reserve(b, n))
	{
		writer_fail(w, "out of memory%s", "");
		return;
	}
	if (n)
		memcpy(b->p + b->len, data, n);
	b->len += n;
}

static void
buf_u32(gguf_writer *w, byte_buf *b, uint32_t v)
{
	buf_put(w, b, &v, 4);
}

static void
buf_u64(gguf_writer *w, byte_buf *b, uint64_t v)
{
	buf_put(w, b, &v, 8);
}

static void
buf_str(gguf_writer *w, byte_buf *b, const char *s, size_t len)
{
	buf_u64(w, b, (uint64_t) len);
	buf_put(w, b, s, len);
}

/* An empty writer with the default alignment (32). */
gguf_writer *
gguf_writer_new(void)
{
	gguf_writer *w = calloc(1, sizeof(*w));

	if (w)
		w->alignment = 32;
	return w;
}

void
gguf_writer_free(gguf_writer *w)
{
	if (!w)
		return;
	for (uint64_t i = 0; i < w->n_tensors; i++)
	{
		free(w->tensors[i].name);
		free(w->tensors[i].data);
		free(w->tensors[i].gen_state);
	}
	free(w->tensors);
	free(w->kv.p);
	free(w->kv_starts);
	free(w->image_tensor_info);
	free(w);
}

const char *
gguf_writer_error(const gguf_writer *w)
{
	return w->failed ? w->error : "";
}

/* Starts a metadata pair: records its offset and writes the key and value type. */
static void
begin_kv(gguf_writer *w, const char *key, gguf_value_type type)
{
	if (w->failed)
		return;
	if (w->n_kv == w->kv_starts_cap)
	{
		size_t		cap = w->kv_starts_cap ? 2 * w->kv_starts_cap : 32;
		size_t	   *p = realloc(w->kv_starts, cap * sizeof(size_t));

		if (!p)
		{
			writer_fail(w, "out of memory%s", "");
			return;
		}
		w->kv_starts = p;
		w->kv_starts_cap = cap;
	}
	w->kv_starts[w->n_kv++] = w->kv.len;
	buf_str(w, &w->kv, key, strlen(key));
	buf_u32(w, &w->kv, (uint32_t) type);
}

static void
add_scalar(gguf_writer *w, const char *key, gguf_value_type type, const void *v, size_t n)
{
	begin_kv(w, key, type);
	buf_put(w, &w->kv, v, n);
}

/* The scalar adders: one metadata pair each, in the GGUF value type of their name. */
void
gguf_writer_add_u8(gguf_writer *w, const char *key, uint8_t v)
{
	add_scalar(w, key, GGUF_TYPE_UINT8, &v, 1);
}

void
gguf_writer_add_i8(gguf_writer *w, const char *key, int8_t v)
{
	add_scalar(w, key, GGUF_TYPE_INT8, &v, 1);
}

void
gguf_writer_add_u16(gguf_writer *w, const char *key, uint16_t v)
{
	add_scalar(w, key, GGUF_TYPE_UINT16, &v, 2);
}

void
gguf_writer_add_i16(gguf_writer *w, const char *key, int16_t v)
{
	add_scalar(w, key, GGUF_TYPE_INT16, &v, 2);
}

void
gguf_writer_add_u32(gguf_writer *w, const char *key, uint32_t v)
{
	add_scalar(w, key, GGUF_TYPE_UINT32, &v, 4);
}

void
gguf_writer_add_i32(gguf_writer *w, const char *key, int32_t v)
{
	add_scalar(w, key, GGUF_TYPE_INT32, &v, 4);
}

void
gguf_writer_add_u64(gguf_writer *w, const char *key, uint64_t v)
{
	add_scalar(w, key, GGUF_TYPE_UINT64, &v, 8);
}

void
gguf_writer_add_i64(gguf_writer *w, const char *key, int64_t v)
{
	add_scalar(w, key, GGUF_TYPE_INT64, &v, 8);
}

void
gguf_writer_add_f32(gguf_writer *w, const char *key, float v)
{
	add_scalar(w, key, GGUF_TYPE_FLOAT32, &v, 4);
}

void
gguf_writer_add_f64(gguf_writer *w, const char *key, double v)
{
	add_scalar(w, key, GGUF_TYPE_FLOAT64, &v, 8);
}

void
gguf_writer_add_bool(gguf_writer *w, const char *key, bool v)
{
	uint8_t		b = v ? 1 : 0;

	add_scalar(w, key, GGUF_TYPE_BOOL, &b, 1);
}

void
gguf_writer_add_str(gguf_writer *w, const char *key, const char *s)
{
	gguf_writer_add_str_len(w, key, s, strlen(s));
}

void
gguf_writer_add_str_len(gguf_writer *w, const char *key, const char *s, size_t len)
{
	begin_kv(w, key, GGUF_TYPE_STRING);
	buf_str(w, &w->kv, s, len);
}

/* Element size of the fixed-size value types, 0 otherwise. */
static size_t
elem_size(gguf_value_type t)
{
	switch (t)
	{
		case GGUF_TYPE_UINT8:
		case GGUF_TYPE_INT8:
		case GGUF_TYPE_BOOL:
			return 1;
		case GGUF_TYPE_UINT16:
		case GGUF_TYPE_INT16:
			return 2;
		case GGUF_TYPE_UINT32:
		case GGUF_TYPE_INT32:
		case GGUF_TYPE_FLOAT32:
			return 4;
		case GGUF_TYPE_UINT64:
		case GGUF_TYPE_INT64:
		case GGUF_TYPE_FLOAT64:
			return 8;
		default:
			return 0;
	}
}

/* An array of fixed-size elements copied from data. */
void
gguf_writer_add_arr(gguf_writer *w, const char *key, gguf_value_type elem_type,
					const void *data, uint64_t n)
{
	size_t		size = elem_size(elem_type);
	size_t		total;

	if (size == 0)
	{
		writer_fail(w, "gguf_writer_add_arr: '%s' needs a fixed-size element type", key);
		return;
	}
	if (!cai_mul_size((size_t) n, size, &total))
	{
		writer_fail(w, "gguf_writer_add_arr: '%s' is too large", key);
		return;
	}
	begin_kv(w, key, GGUF_TYPE_ARRAY);
	buf_u32(w, &w->kv, (uint32_t) elem_type);
	buf_u64(w, &w->kv, n);
	buf_put(w, &w->kv, data, total);
}

/* An array of C strings. */
void
gguf_writer_add_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n)
{
	gguf_writer_add_arr_str_len(w, key, strs, NULL, n);
}

/* An array of strings of the given lengths (NULL lens: C strings). */
void
gguf_writer_add_arr_str_len(gguf_writer *w, const char *key, const char *const *strs,
							const size_t *lens, uint64_t n)
{
	begin_kv(w, key, GGUF_TYPE_ARRAY);
	buf_u32(w, &w->kv, (uint32_t) GGUF_TYPE_STRING);
	buf_u64(w, &w->kv, n);
	for (uint64_t i = 0; i < n; i++)
		buf_str(w, &w->kv, strs[i], lens ? lens[i] : strlen(strs[i]));
}

/* Sets the data alignment; one other than 32 is also written as general.alignment. */
void
gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment)
{
	if (alignment == 0 || (alignment & (alignment - 1)) != 0)
	{
		writer_fail(w, "gguf_writer_set_alignment: not a power of two%s", "");
		return;
	}
	w->alignment = alignment;
	if (alignment != 32)
		gguf_writer_add_u32(w, "general.alignment", alignment);
}

/* Appends a tensor entry taking ownership of data (freed on failure). */
static void
push_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const int64_t *ne,
			ggml_type type, uint8_t *data, size_t nbytes)
{
	writer_tensor *t;

	if (w->failed)
	{
		free(data);
		return;
	}
	if (w->n_tensors == w->tensors_cap)
	{
		size_t		cap = w->tensors_cap ? 2 * w->tensors_cap : 32;
		writer_tensor *p = realloc(w->tensors, cap * sizeof(writer_tensor));

		if (!p)
		{
			free(data);
			writer_fail(w, "out of memory%s", "");
			return;
		}
		w->tensors = p;
		w->tensors_cap = cap;
	}
	t = &w->tensors[w->n_tensors];
	memset(t, 0, sizeof(*t));
	t->name = strdup(name);
	if (!t->name)
	{
		free(data);
		writer_fail(w, "out of memory%s", "");
		return;
	}
	t->n_dims = n_dims;
	for (int d = 0; d < GGUF_MAX_DIMS; d++)
		t->ne[d] = d < (int) n_dims ? ne[d] : 1;
	t->type = type;
	t->data = data;
	t->nbytes = nbytes;
	w->n_tensors++;
}

/* Element count of a shape, or -1 if it is not a valid 1..4-dimensional positive shape. */
static int64_t
shape_elements(uint32_t n_dims, const int64_t *ne)
{
	int64_t		n = 1;

	if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
		return -1;
	for (uint32_t d = 0; d < n_dims; d++)
	{
		if (ne[d] <= 0 || __builtin_mul_overflow(n, ne[d], &n))
			return -1;
	}
	return n;
}

/* A tensor from raw bytes of its type, checked against its shape. */
void
gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const int64_t *ne,
					   ggml_type type, const void *data, size_t nbytes)
{
	int64_t		n = shape_elements(n_dims, ne);
	size_t		expect;
	uint8_t    *copy;

	if (w->failed)
		return;
	if (n < 0 || !ggml_row_bytes(type, n, &expect) || expect != nbytes)
	{
		writer_fail(w, "gguf_writer_add_tensor: '%s' has a bad shape, type or size", name);
		return;
	}
	copy = malloc(nbytes ? nbytes : 1);
	if (!copy)
	{
		writer_fail(w, "out of memory%s", "");
		return;
	}
	memcpy(copy, data, nbytes);
	push_tensor(w, name, n_dims, ne, type, copy, nbytes);
}

/* A tensor from floats, quantized to type here. */
void
gguf_writer_add_tensor_f32(gguf_writer *w, const char *name, uint32_t n_dims,
						   const int64_t *ne, ggml_type type, const float *x)
{
	int64_t		n = shape_elements(n_dims, ne);
	size_t		nbytes;
	uint8_t    *data;

	if (w->failed)
		return;
	if (n < 0 || ne[0] % ggml_type_block_elems(type) != 0 || !ggml_row_bytes(type, n, &nbytes))
	{
		writer_fail(w, "gguf_writer_add_tensor_f32: '%s' has a bad shape for its type", name);
		return;
	}
	data = malloc(nbytes ? nbytes : 1);
	if (!data)
	{
		writer_fail(w, "out of memory%s", "");
		return;
	}
	if (!gguf_quantize(type, x, n, data))
	{
		free(data);
		writer_fail(w, "gguf_writer_add_tensor_f32: no quantizer for the type of '%s'", name);
		return;
	}
	push_tensor(w, name, n_dims, ne, type, data, nbytes);
}

/* A tensor generated at write time: only its shape, generator and state are kept. */
void
gguf_writer_add_tensor_gen(gguf_writer *w, const char *name, uint32_t n_dims, const int64_t *ne,
						   ggml_type type, gguf_tensor_gen gen, const void *state,
						   size_t state_size)
{
	int64_t		n = shape_elements(n_dims, ne);
	size_t		nbytes;
	void	   *copy;

	if (w->failed)
		return;
	if (n < 0 || !gen || ne[0] % ggml_type_block_elems(type) != 0 ||
		!ggml_row_bytes(type, n, &nbytes))
	{
		writer_fail(w, "gguf_writer_add_tensor_gen: '%s' has a bad shape for its type", name);
		return;
	}
	copy = malloc(state_size ? state_size : 1);
	if (!copy)
	{
		writer_fail(w, "out of memory%s", "");
		return;
	}
	if (state_size)
		memcpy(copy, state, state_size);
	push_tensor(w, name, n_dims, ne, type, NULL, nbytes);
	if (w->failed)
	{
		free(copy);
		return;
	}
	w->tensors[w->n_tensors - 1].gen = gen;
	w->tensors[w->n_tensors - 1].gen_state = copy;
	w->tensors[w->n_tensors - 1].gen_state_size = state_size;
}

static size_t
align_up(size_t x, size_t a)
{
	return (x + a - 1) & ~(a - 1);
}

/* Where the image's bytes go: a growing buffer or a file. */
typedef struct image_sink
{
	byte_buf   *buf;			/* non-NULL: append here */
	FILE	   *file;			/* else write here */
	const char *path;
} image_sink;

static void
sink_put(gguf_writer *w, image_sink *sink, const void *data, size_t n)
{
	if (w->failed || n == 0)
		return;
	if (sink->buf)
		buf_put(w, sink->buf, data, n);
	else if (fwrite(data, 1, n, sink->file) != n)
		writer_fail(w, "could not write \"%s\"", sink->path);
}

/* Header, metadata and tensor infos (with each tensor's data offset). */
static void
layout_head(gguf_writer *w, byte_buf *out)
{
	uint64_t	offset = 0;

	buf_put(w, out, "GGUF", 4);
	buf_u32(w, out, 3);
	buf_u64(w, out, w->n_tensors);
	buf_u64(w, out, w->n_kv);
	w->image_kv_start = out->len;
	buf_put(w, out, w->kv.p, w->kv.len);
	for (uint64_t i = 0; i < w->n_tensors; i++)
	{
		writer_tensor *t = &w->tensors[i];

		w->image_tensor_info[i] = out->len;
		buf_str(w, out, t->name, strlen(t->name));
		buf_u32(w, out, t->n_dims);
		for (uint32_t d = 0; d < t->n_dims; d++)
			buf_u64(w, out, (uint64_t) t->ne[d]);
		buf_u32(w, out, (uint32_t) t->type);
		buf_u64(w, out, offset);
		offset = align_up(offset + t->nbytes, w->alignment);
	}
	w->image_data_start = align_up(out->len, w->alignment);
}

/* A generated tensor's bytes, produced and converted a few rows at a time. */
static void
emit_generated(gguf_writer *w, image_sink *sink, writer_tensor *t)
{
	int64_t		row = t->ne[0];
	int64_t		n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
	int64_t		chunk = row * (((int64_t) 1 << 20) / row > 0 ? ((int64_t) 1 << 20) / row : 1);
	size_t		cap = 0;
	float	   *x = malloc((size_t) chunk * sizeof(float));
	uint8_t    *q = NULL;
	void	   *state = malloc(t->gen_state_size ? t->gen_state_size : 1);

	if (x && ggml_row_bytes(t->type, chunk, &cap))
		q = malloc(cap);
	if (!x || !q || !state)
		writer_fail(w, "out of memory%s", "");
	else
		memcpy(state, t->gen_state, t->gen_state_size);
	for (int64_t done = 0; done < n && !w->failed; done += chunk)
	{
		int64_t		m = n - done < chunk ? n - done : chunk;
		size_t		nbytes = 0;

		t->gen(state, x, m);
		if (!ggml_row_bytes(t->type, m, &nbytes) || !gguf_quantize(t->type, x, m, q))
			writer_fail(w, "no quantizer for the type of '%s'", t->name);
		else
			sink_put(w, sink, q, nbytes);
	}
	free(x);
	free(q);
	free(state);
}

/* Lays out the image: header, metadata, tensor infos, padding, aligned tensor data. */
static bool
write_image(gguf_writer *w, image_sink *sink)
{
	byte_buf	head = {0};
	size_t		pos;
	size_t	   *info;
	static const uint8_t zeros[64] = {0};

	if (w->failed)
		return false;
	info = realloc(w->image_tensor_info, (w->n_tensors ? w->n_tensors : 1) * sizeof(size_t));
	if (!info)
	{
		writer_fail(w, "out of memory%s", "");
		return false;
	}
	w->image_tensor_info = info;
	layout_head(w, &head);
	sink_put(w, sink, head.p, head.len);
	pos = head.len;
	free(head.p);
	for (uint64_t i = 0; i < w->n_tensors && !w->failed; i++)
	{
		writer_tensor *t = &w->tensors[i];
		size_t		pad = align_up(pos, w->alignment) - pos;

		while (pad > 0 && !w->failed)
		{
			size_t		n = pad < sizeof(zeros) ? pad : sizeof(zeros);

			sink_put(w, sink, zeros, n);
			pad -= n;
			pos += n;
		}
		if (t->gen)
			emit_generated(w, sink, t);
		else
			sink_put(w, sink, t->data, t->nbytes);
		pos += t->nbytes;
	}
	if (w->failed)
		return false;
	w->written = true;
	return true;
}

bool
gguf_writer_write_buffer(gguf_writer *w, uint8_t **data, size_t *size)
{
	byte_buf	out = {0};
	image_sink	sink = {&out, NULL, NULL};

	*data = NULL;
	*size = 0;
	if (!write_image(w, &sink))
	{
		free(out.p);
		return false;
	}
	*data = out.p;
	*size = out.len;
	return true;
}

/* Writes the image to path, streaming the tensors' data. */
bool
gguf_writer_write_file(gguf_writer *w, const char *path)
{
	image_sink	sink = {NULL, NULL, path};
	bool		ok;

	if (w->failed)
		return false;
	sink.file = fopen(path, "wb");
	if (!sink.file)
	{
		writer_fail(w, "could not create \"%s\"", path);
		return false;
	}
	ok = write_image(w, &sink);
	if (fclose(sink.file) != 0 && ok)
	{
		writer_fail(w, "could not write \"%s\"", path);
		ok = false;
	}
	return ok;
}

/* Field offsets in the last written image, for tests that corrupt them. */
int64_t
gguf_writer_kv_offset(const gguf_writer *w, uint64_t i)
{
	if (!w->written || i >= w->n_kv)
		return -1;
	return (int64_t) (w->image_kv_start + w->kv_starts[i]);
}

int64_t
gguf_writer_tensor_info_offset(const gguf_writer *w, uint64_t i)
{
	if (!w->written || i >= w->n_tensors)
		return -1;
	return (int64_t) w->image_tensor_info[i];
}

int64_t
gguf_writer_data_offset(const gguf_writer *w)
{
	return w->written ? (int64_t) w->image_data_start : -1;
}

/* ---- quantizers ------------------------------------------------------------------------- */

/* Float to bfloat16 by round-to-nearest-even on the dropped 16 bits. */
uint16_t
gguf_fp32_to_bf16(float f)
{
	uint32_t	x;

	memcpy(&x, &f, sizeof(x));
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t) ((x >> 16) | 0x0040);		/* quiet NaN */
	x += 0x7fff + ((x >> 16) & 1);
	return (uint16_t) (x >> 16);
}

/* Stores f as little-endian fp16. */
static void
store_half(uint8_t *p, float f)
{
	uint16_t	h = cai_fp32_to_fp16(f);

	memcpy(p, &h, 2);
}

/* The value an fp16 store of f reads back as. */
static float
round_half(float f)
{
	return cai_fp16_to_fp32(cai_fp32_to_fp16(f));
}

/* The smallest fp16 value >= f (f >= 0 and finite): scales that must cover a range round up. */
static float
round_half_up(float f)
{
	uint16_t	h = cai_fp32_to_fp16(f);

	if (cai_fp16_to_fp32(h) < f)
		h++;
	return cai_fp16_to_fp32(h);
}

static int
clamp_int(int v, int lo, int hi)
{
	return v < lo ? lo : (v > hi ? hi : v);
}

/* Q8_0: d = max|x| / 127 per block of 32. */
static void
quantize_q8_0(const float *x, int64_t n, uint8_t *dst)
{
	for (int64_t b = 0; b < n / 32; b++, x += 32, dst += 34)
	{
		float		amax = 0.0f;
		float		d;
		float		id;

		for (int j = 0; j < 32; j++)
			amax = fmaxf(amax, fabsf(x[j]));
		d = round_half(amax / 127.0f);
		id = d != 0.0f ? 1.0f / d : 0.0f;
		store_half(dst, d);
		for (int j = 0; j < 32; j++)
			dst[2 + j] = (uint8_t) (int8_t) clamp_int((int) roundf(x[j] * id), -127, 127);
	}
}

/* Q4_0: d = (signed extreme) / -8 per block of 32, q = round(x / d) + 8. */
static void
quantize_q4_0(const float *x, int64_t n, uint8_t *dst)
{
	for (int64_t b = 0; b < n / 32; b++, x += 32, dst += 18)
	{
		float		max = 0.0f;		/* the value of largest magnitude, with its sign */
		float		d;
		float		id;

		for (int j = 0; j < 32; j++)
		{
			if (fabsf(x[j]) > fabsf(max))
				max = x[j];
		}
		/* the extreme maps to -8 exactly; its opposite extreme saturates at 7 */
		d = round_half(max / -8.0f);
		id = d != 0.0f ? 1.0f / d : 0.0f;
		store_half(dst, d);
		for (int j = 0; j < 16; j++)
		{
			int			lo = clamp_int((int) roundf(x[j] * id) + 8, 0, 15);
			int			hi = clamp_int((int) roundf(x[j + 16] * id) + 8, 0, 15);

			dst[2 + j] = (uint8_t) (lo | (hi << 4));
		}
	}
}

/* Q4_1: d = (max - min) / 15 and m = min per block of 32, q = round((x - m) / d). */
static void
quantize_q4_1(const float *x, int64_t n, uint8_t *dst)
{
	for (int64_t b = 0; b < n / 32; b++, x += 32, dst += 20)
	{
		float		min = x[0];
		float		max = x[0];
		float		d;
		float		id;

		for (int j = 1; j < 32; j++)
		{
			min = fminf(min, x[j]);
			max = fmaxf(max, x[j]);
		}
		d = round_half((max - min) / 15.0f);
		min = round_half(min);
		id = d != 0.0f ? 1.0f / d : 0.0f;
		store_half(dst, d);
		store_half(dst + 2, min);
		for (int j = 0; j < 16; j++)
		{
			int			lo = clamp_int((int) roundf((x[j] - min) * id), 0, 15);
			int			hi = clamp_int((int) roundf((x[j + 16] - min) * id), 0, 15);

			dst[4 + j] = (uint8_t) (lo | (hi << 4));
		}
	}
}

/* Packs eight 6-bit scales and mins into a K-quant's 12 scale bytes (see quant.c). */
static void
pack_k_scales(const uint8_t *sc, const uint8_t *m, uint8_t *out)
{
	for (int j = 0; j < 4; j++)
	{
		out[j] = (uint8_t) ((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
		out[j + 4] = (uint8_t) ((m[j] & 63) | ((m[j + 4] >> 4) << 6));
		out[j + 8] = (uint8_t) ((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
	}
}

/*
 * Q4_K and Q5_K: per 32-element sub-block an affine scale and a non-negative min
 * (x ~ d sc q - dmin m), the sub-block scales and mins themselves quantized to 6 bits against
 * the fp16 super-block d and dmin.  nmax is 15 (Q4_K) or 31 (Q5_K).  Scales and mins round up,
 * so every value is inside the sub-block's grid and the error is at most half a step.
 */
static void
quantize_k_affine(const float *x, int nmax, uint8_t *sc6, uint8_t *m6, float *d_out,
				  float *dmin_out, uint8_t *q)
{
	float		lo[8];
	float		hi[8];
	float		need[8];
	float		max_need = 0.0f;
	float		max_min = 0.0f;
	float		d;
	float		dmin;

	for (int s = 0; s < 8; s++)
	{
		lo[s] = 0.0f;
		hi[s] = x[32 * s];
		for (int l = 0; l < 32; l++)
		{
			lo[s] = fminf(lo[s], x[32 * s + l]);
			hi[s] = fmaxf(hi[s], x[32 * s + l]);
		}
		max_min = fmaxf(max_min, -lo[s]);
	}
	/* mins first (rounded up, so the grid starts at or below the smallest value) */
	dmin = round_half_up(max_min / 63.0f);
	for (int s = 0; s < 8; s++)
	{
		m6[s] = (uint8_t) (dmin > 0.0f ? clamp_int((int) ceilf(-lo[s] / dmin), 0, 63) : 0);
		/* the step that makes the grid reach the largest value from that start */
		need[s] = (hi[s] + dmin * m6[s]) / (float) nmax;
		max_need = fmaxf(max_need, need[s]);
	}
	d = round_half_up(max_need / 63.0f);
	for (int s = 0; s < 8; s++)
	{
		float		step;
		float		offset = dmin * m6[s];

		sc6[s] = (uint8_t) (d > 0.0f ? clamp_int((int) ceilf(need[s] / d), 0, 63) : 0);
		step = d * sc6[s];
		for (int l = 0; l < 32; l++)
		{
			float		v = x[32 * s + l] + offset;

			q[32 * s + l] = (uint8_t) (step > 0.0f ?
									   clamp_int((int) roundf(v / step), 0, nmax) : 0);
		}
	}
	*d_out = d;
	*dmin_out = dmin;
}

/* Q4_K: the affine sub-blocks packed as block_q4_K. */
static void
quantize_q4_k(const float *x, int64_t n, uint8_t *dst)
{
	for (int64_t b = 0; b < n / 256; b++, x += 256, dst += 144)
	{
		uint8_t		sc6[8],
					m6[8],
					q[256];
		float		d,
					dmin;

		quantize_k_affine(x, 15, sc6, m6, &d, &dmin, q);
		store_half(dst, d);
		store_half(dst + 2, dmin);
		pack_k_scales(sc6, m6, dst + 4);
		for (int g = 0; g < 4; g++)
		{
			for (int l = 0; l < 32; l++)
				dst[16 + 32 * g + l] = (uint8_t) (q[64 * g + l] | (q[64 * g + 32 + l] << 4));
		}
	}
}

/* Q5_K: as Q4_K with 5-bit values, the fifth bit in qh. */
static void
quantize_q5_k(const float *x, int64_t n, uint8_t *dst)
{
	for (int64_t b = 0; b < n / 256; b++, x += 256, dst += 176)
	{
		uint8_t		sc6[8],
					m6[8],
					q[256];
		float		d,
					dmin;
		uint8_t    *qh = dst + 16;
		uint8_t    *qs = dst + 48;

		quantize_k_affine(x, 31, sc6, m6, &d, &dmin, q);
		store_half(dst, d);
		store_half(dst + 2, dmin);
		pack_k_scales(sc6, m6, dst + 4);
		memset(qh, 0, 32);
		for (int g = 0; g < 4; g++)
		{
			for (int l = 0; l < 32; l++)
			{
				int			q0 = q[64 * g + l];
				int			q1 = q[64 * g + 32 + l];

				qs[32 * g + l] = (uint8_t) ((q0 & 15) | ((q1 & 15) << 4));
				qh[l] |= (uint8_t) (((q0 >> 4) << (2 * g)) | ((q1 >> 4) << (2 * g + 1)));
			}
		}
	}
}

/* Q6_K: per 16-element sub-block a signed int8 scale against the fp16 d; q in [-32, 31]. */
static void
quantize_q6_k(const float *x, int64_t n, uint8_t *dst)
{
	for (int64_t b = 0; b < n / 256; b++, x += 256, dst += 210)
	{
		float		sub[16];
		float		amax_sub = 0.0f;
		float		d;
		int8_t		sc[16];
		uint8_t    *ql = dst;
		uint8_t    *qh = dst + 128;

		for (int s = 0; s < 16; s++)
		{
			float		max = 0.0f;

			for (int l = 0; l < 16; l++)
			{
				if (fabsf(x[16 * s + l]) > fabsf(max))
					max = x[16 * s + l];
			}
			sub[s] = max / -32.0f;
			amax_sub = fmaxf(amax_sub, fabsf(sub[s]));
		}
		/*
		 * Sub-block scales round away from zero (d up, so they fit in 127), so that
		 * |x / step| <= 32 and only the +32 end saturates (to 31).
		 */
		d = round_half_up(amax_sub / 127.0f);
		for (int s = 0; s < 16; s++)
		{
			int			mag = d > 0.0f ? clamp_int((int) ceilf(fabsf(sub[s]) / d), 0, 127) : 0;

			sc[s] = (int8_t) (sub[s] < 0.0f ? -mag : mag);
		}
		memset(ql, 0, 128);
		memset(qh, 0, 64);
		for (int e = 0; e < 256; e++)
		{
			float		step = d * sc[e / 16];
			int			q = step != 0.0f ? clamp_int((int) roundf(x[e] / step), -32, 31) : 0;
			int			u = q + 32;		/* 0..63 */
			int			h = e / 128;
			int			r = e % 128;
			int			k = r / 32;
			int			l = r % 32;

			ql[64 * h + l + 32 * (k & 1)] |= (uint8_t) ((u & 15) << (k >= 2 ? 4 : 0));
			qh[32 * h + l] |= (uint8_t) ((u >> 4) << (2 * k));
		}
		memcpy(dst + 192, sc, 16);
		store_half(dst + 208, d);
	}
}

/* Converts n floats to type's block format at dst (see gguf_writer.h). */
bool
gguf_quantize(ggml_type type, const float *x, int64_t n, void *dst)
{
	uint8_t    *out = dst;
	int64_t		block = ggml_type_block_elems(type);

	if (block == 0 || n < 0 || n % block != 0)
		return false;
	switch (type)
	{
		case GGML_TYPE_F32:
			memcpy(out, x, (size_t) n * sizeof(float));
			return true;
		case GGML_TYPE_F16:
			for (int64_t i = 0; i < n; i++)
				store_half(out + 2 * i, x[i]);
			return true;
		case GGML_TYPE_BF16:
			for (int64_t i = 0; i < n; i++)
			{
				uint16_t	b = gguf_fp32_to_bf16(x[i]);

				memcpy(out + 2 * i, &b, 2);
			}
			return true;
		case GGML_TYPE_Q8_0:
			quantize_q8_0(x, n, out);
			return true;
		case GGML_TYPE_Q4_0:
			quantize_q4_0(x, n, out);
			return true;
		case GGML_TYPE_Q4_1:
			quantize_q4_1(x, n, out);
			return true;
		case GGML_TYPE_Q4_K:
			quantize_q4_k(x, n, out);
			return true;
		case GGML_TYPE_Q5_K:
			quantize_q5_k(x, n, out);
			return true;
		case GGML_TYPE_Q6_K:
			quantize_q6_k(x, n, out);
			return true;
		default:
			return false;
	}
}
