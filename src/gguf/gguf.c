/*
 * gguf.c — a GGUF v2/v3 reader over a memory map (or a caller's buffer).
 *
 * The file is untrusted.  Parsing walks a cursor that checks every read against the bytes left,
 * and every count read from the file is compared with the bytes that count would need at the
 * least BEFORE anything is allocated for it, so a forged count of 2^60 fails with a message
 * instead of a huge malloc.  Tensor shapes are overflow-checked, tensor types must be known,
 * and each tensor's data must lie inside the file at an aligned offset, sharing no byte with
 * another tensor's (so weights never outgrow the file).  Once gguf_open returns, every pointer
 * and length in the gguf_file is safe to use.
 *
 * Layout (all little-endian):
 *   "GGUF" u32 version  u64 n_tensors  u64 n_kv
 *   n_kv x   { string key, u32 value_type, value }
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
 *   padding to general.alignment (default 32), then the data section.
 * A string is a u64 length and that many bytes; an array is u32 element type, u64 count, elements.
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant.h"
#include "safe_file.h"
#include "util.h"

#define GGUF_DEFAULT_ALIGNMENT 32

/*
 * The least bytes a kv pair (key length, empty key, value type, one-byte value) and a tensor
 * info (name length, empty name, n_dims, one dimension, type, offset) can occupy: the bounds
 * that make forged counts fail before allocation.
 */
#define GGUF_MIN_KV_BYTES (8 + 4 + 1)
#define GGUF_MIN_TENSOR_INFO_BYTES (8 + 4 + 8 + 4 + 8)

/*
 * The gguf_file the caller sees plus hash indexes of keys and tensor names (built at parse
 * time: they detect duplicates in O(n) and make look-ups O(1)).
 */
typedef struct gguf_file_private
{
	gguf_file	pub;			/* must be first: gguf_file pointers are cast back */
	uint32_t   *kv_index;		/* open addressing: slot -> kv index + 1, 0 = empty */
	size_t		kv_index_cap;	/* a power of two */
	uint32_t   *tensor_index;
	size_t		tensor_index_cap;
} gguf_file_private;

/* A bounds-checked reader over the file's bytes. */
typedef struct gguf_cursor
{
	const uint8_t *base;
	size_t		size;
	size_t		pos;
} gguf_cursor;

static size_t
cursor_left(const gguf_cursor *c)
{
	return c->size - c->pos;
}

static bool
cursor_read(gguf_cursor *c, void *dst, size_t n)
{
	if (n > cursor_left(c))
		return false;
	memcpy(dst, c->base + c->pos, n);
	c->pos += n;
	return true;
}

static bool
cursor_u32(gguf_cursor *c, uint32_t *v)
{
	return cursor_read(c, v, sizeof(*v));
}

static bool
cursor_u64(gguf_cursor *c, uint64_t *v)
{
	return cursor_read(c, v, sizeof(*v));
}

/* Reads a string (u64 length + bytes) whose bytes stay in the map. */
static bool
cursor_str(gguf_cursor *c, gguf_str *s)
{
	uint64_t	len;

	if (!cursor_u64(c, &len))
		return false;
	if (len > cursor_left(c))
		return false;
	s->ptr = (const char *) (c->base + c->pos);
	s->len = len;
	c->pos += (size_t) len;
	return true;
}

/* FNV-1a over a string: the hash of the key and tensor-name indexes. */
static uint64_t
hash_str(const char *p, size_t len)
{
	uint64_t	h = 0xcbf29ce484222325ULL;

	for (size_t i = 0; i < len; i++)
	{
		h ^= (uint8_t) p[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}

static bool
str_equal(gguf_str a, const char *p, size_t len)
{
	return a.len == len && memcmp(a.ptr, p, len) == 0;
}

/* Smallest power of two >= 2n (and >= 16), so the index stays at most half full. */
static size_t
index_capacity(uint64_t n)
{
	size_t		cap = 16;

	while (cap < 2 * n)
		cap *= 2;
	return cap;
}

/* Size in bytes of one element of a fixed-size value type; 0 for STRING, ARRAY and unknown. */
static size_t
value_type_size(uint32_t type)
{
	switch (type)
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

static bool
value_type_known(uint32_t type)
{
	return type <= GGUF_TYPE_FLOAT64;
}

/* The spec's name of a value type, for messages. */
const char *
gguf_value_type_name(gguf_value_type t)
{
	switch (t)
	{
		case GGUF_TYPE_UINT8:
			return "uint8";
		case GGUF_TYPE_INT8:
			return "int8";
		case GGUF_TYPE_UINT16:
			return "uint16";
		case GGUF_TYPE_INT16:
			return "int16";
		case GGUF_TYPE_UINT32:
			return "uint32";
		case GGUF_TYPE_INT32:
			return "int32";
		case GGUF_TYPE_FLOAT32:
			return "float32";
		case GGUF_TYPE_BOOL:
			return "bool";
		case GGUF_TYPE_STRING:
			return "string";
		case GGUF_TYPE_ARRAY:
			return "array";
		case GGUF_TYPE_UINT64:
			return "uint64";
		case GGUF_TYPE_INT64:
			return "int64";
		case GGUF_TYPE_FLOAT64:
			return "float64";
	}
	return "unknown";
}

/*
 * Decodes one fixed-size scalar at p into kv->v (integers widened to u64/i64, floats to f64,
 * bools to b).
 */
static void
decode_scalar(gguf_kv *kv, const uint8_t *p)
{
	switch (kv->type)
	{
		case GGUF_TYPE_UINT8:
			kv->v.u64 = p[0];
			break;
		case GGUF_TYPE_INT8:
			kv->v.i64 = (int8_t) p[0];
			break;
		case GGUF_TYPE_UINT16:
			{
				uint16_t	x;

				memcpy(&x, p, 2);
				kv->v.u64 = x;
				break;
			}
		case GGUF_TYPE_INT16:
			{
				int16_t		x;

				memcpy(&x, p, 2);
				kv->v.i64 = x;
				break;
			}
		case GGUF_TYPE_UINT32:
			{
				uint32_t	x;

				memcpy(&x, p, 4);
				kv->v.u64 = x;
				break;
			}
		case GGUF_TYPE_INT32:
			{
				int32_t		x;

				memcpy(&x, p, 4);
				kv->v.i64 = x;
				break;
			}
		case GGUF_TYPE_FLOAT32:
			{
				float		x;

				memcpy(&x, p, 4);
				kv->v.f64 = x;
				break;
			}
		case GGUF_TYPE_BOOL:
			kv->v.b = p[0] != 0;
			break;
		case GGUF_TYPE_UINT64:
			memcpy(&kv->v.u64, p, 8);
			break;
		case GGUF_TYPE_INT64:
			memcpy(&kv->v.i64, p, 8);
			break;
		case GGUF_TYPE_FLOAT64:
			memcpy(&kv->v.f64, p, 8);
			break;
		default:
			break;
	}
}

/* Prints a key or name for an error message: at most 100 bytes of it, so messages stay short. */
#define STR_ARG(s) (int) ((s).len > 100 ? 100 : (s).len), (s).ptr

/* Parses the value of kv (its key and type already read). */
static cai_status
parse_value(gguf_cursor *c, gguf_kv *kv, cai_error *err)
{
	size_t		elem_size;

	if (!value_type_known(kv->type))
		return cai_fail(err, CAI_ERR_FORMAT,
						"gguf: key '%.*s' has unknown value type %u",
						STR_ARG(kv->key), (unsigned) kv->type);

	if (kv->type == GGUF_TYPE_STRING)
	{
		if (!cursor_str(c, &kv->v.str))
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: string value of key '%.*s' extends past end of file",
							STR_ARG(kv->key));
		return CAI_OK;
	}

	if (kv->type != GGUF_TYPE_ARRAY)
	{
		elem_size = value_type_size(kv->type);
		if (elem_size > cursor_left(c))
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: value of key '%.*s' extends past end of file",
							STR_ARG(kv->key));
		decode_scalar(kv, c->base + c->pos);
		c->pos += elem_size;
		return CAI_OK;
	}

	/* an array: element type, count, elements */
	{
		uint32_t	elem_type;
		uint64_t	n;

		if (!cursor_u32(c, &elem_type) || !cursor_u64(c, &n))
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: array header of key '%.*s' extends past end of file",
							STR_ARG(kv->key));
		if (!value_type_known(elem_type))
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: array '%.*s' has unknown element type %u",
							STR_ARG(kv->key), (unsigned) elem_type);
		if (elem_type == GGUF_TYPE_ARRAY)
			return cai_fail(err, CAI_ERR_UNSUPPORTED,
							"gguf: array '%.*s' is an array of arrays, which is not supported",
							STR_ARG(kv->key));
		kv->v.arr.elem_type = (gguf_value_type) elem_type;
		kv->v.arr.n = n;
		kv->v.arr.data = c->base + c->pos;
		kv->v.arr.strs = NULL;

		if (elem_type == GGUF_TYPE_STRING)
		{
			/* every string takes at least its 8-byte length: bound n before allocating */
			if (n > cursor_left(c) / 8)
				return cai_fail(err, CAI_ERR_FORMAT,
								"gguf: array '%.*s' claims %llu strings but only %zu bytes remain",
								STR_ARG(kv->key), (unsigned long long) n, cursor_left(c));
			kv->v.arr.strs = malloc((size_t) (n ? n : 1) * sizeof(gguf_str));
			if (!kv->v.arr.strs)
				return cai_fail(err, CAI_ERR_NO_MEMORY,
								"gguf: out of memory for %llu strings of array '%.*s'",
								(unsigned long long) n, STR_ARG(kv->key));
			for (uint64_t i = 0; i < n; i++)
			{
				if (!cursor_str(c, &kv->v.arr.strs[i]))
					return cai_fail(err, CAI_ERR_FORMAT,
									"gguf: string %llu of array '%.*s' extends past end of file",
									(unsigned long long) i, STR_ARG(kv->key));
			}
			return CAI_OK;
		}

		elem_size = value_type_size(elem_type);
		if (n > cursor_left(c) / elem_size)
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: array '%.*s' of %llu %s elements extends past end of file",
							STR_ARG(kv->key), (unsigned long long) n,
							gguf_value_type_name((gguf_value_type) elem_type));
		c->pos += (size_t) n * elem_size;
		return CAI_OK;
	}
}

/*
 * Inserts entry idx (whose name is s) into an open-addressing index; false if an entry with
 * the same name is already there.
 */
static bool
index_insert(uint32_t *index, size_t cap, gguf_str s, uint32_t idx,
			 const gguf_str *(*name_of) (const gguf_file *, uint32_t), const gguf_file *f)
{
	size_t		slot = (size_t) hash_str(s.ptr, (size_t) s.len) & (cap - 1);

	while (index[slot] != 0)
	{
		const gguf_str *other = name_of(f, index[slot] - 1);

		if (str_equal(*other, s.ptr, (size_t) s.len))
			return false;
		slot = (slot + 1) & (cap - 1);
	}
	index[slot] = idx + 1;
	return true;
}

static const gguf_str *
kv_name(const gguf_file *f, uint32_t i)
{
	return &f->kv[i].key;
}

static const gguf_str *
tensor_name(const gguf_file *f, uint32_t i)
{
	return &f->tensors[i].name;
}

/* Looks a name up in an index; -1 when absent. */
static int64_t
index_lookup(const uint32_t *index, size_t cap, const char *name,
			 const gguf_str *(*name_of) (const gguf_file *, uint32_t), const gguf_file *f)
{
	size_t		len;
	size_t		slot;

	if (!index || !name)
		return -1;
	len = strlen(name);
	slot = (size_t) hash_str(name, len) & (cap - 1);
	while (index[slot] != 0)
	{
		if (str_equal(*name_of(f, index[slot] - 1), name, len))
			return index[slot] - 1;
		slot = (slot + 1) & (cap - 1);
	}
	return -1;
}

/* Reads the general.alignment value (any non-negative integer type), validating it. */
static cai_status
read_alignment(const gguf_kv *kv, size_t *alignment, cai_error *err)
{
	uint64_t	a;

	switch (kv->type)
	{
		case GGUF_TYPE_UINT8:
		case GGUF_TYPE_UINT16:
		case GGUF_TYPE_UINT32:
		case GGUF_TYPE_UINT64:
			a = kv->v.u64;
			break;
		case GGUF_TYPE_INT8:
		case GGUF_TYPE_INT16:
		case GGUF_TYPE_INT32:
		case GGUF_TYPE_INT64:
			if (kv->v.i64 <= 0)
				return cai_fail(err, CAI_ERR_FORMAT,
								"gguf: general.alignment %lld is not a positive power of two",
								(long long) kv->v.i64);
			a = (uint64_t) kv->v.i64;
			break;
		default:
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: general.alignment has type %s, expected an integer",
							gguf_value_type_name(kv->type));
	}
	/* 1 GiB is far beyond any real alignment and keeps the padding arithmetic safe */
	if (a == 0 || (a & (a - 1)) != 0 || a > ((uint64_t) 1 << 30))
		return cai_fail(err, CAI_ERR_FORMAT,
						"gguf: general.alignment %llu is not a power of two (at most 2^30)",
						(unsigned long long) a);
	*alignment = (size_t) a;
	return CAI_OK;
}

/* Frees everything parse allocated (not the map). */
static void
free_parsed(gguf_file_private *pf)
{
	gguf_file  *f = &pf->pub;

	if (f->kv)
	{
		for (uint64_t i = 0; i < f->n_kv; i++)
		{
			if (f->kv[i].type == GGUF_TYPE_ARRAY)
				free(f->kv[i].v.arr.strs);
		}
	}
	free(f->kv);
	free(f->tensors);
	free(pf->kv_index);
	free(pf->tensor_index);
	f->kv = NULL;
	f->tensors = NULL;
	pf->kv_index = NULL;
	pf->tensor_index = NULL;
}

/* Reads the tensor infos and validates each tensor's shape and type. */
static cai_status
parse_tensor_infos(gguf_cursor *c, gguf_file_private *pf, cai_error *err)
{
	gguf_file  *f = &pf->pub;

	for (uint64_t i = 0; i < f->n_tensors; i++)
	{
		gguf_tensor *t = &f->tensors[i];
		uint32_t	type;
		int64_t		n_elements = 1;
		int64_t		block;
		size_t		nbytes;

		if (!cursor_str(c, &t->name))
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: name of tensor %llu extends past end of file",
							(unsigned long long) i);
		/* the count is bumped only when the info is complete: free_parsed needs no care here */
		if (!cursor_u32(c, &t->n_dims))
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: info of tensor '%.*s' extends past end of file",
							STR_ARG(t->name));
		if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: tensor '%.*s' has %u dimensions (expected 1 to %d)",
							STR_ARG(t->name), (unsigned) t->n_dims, GGUF_MAX_DIMS);
		for (int d = 0; d < GGUF_MAX_DIMS; d++)
			t->ne[d] = 1;
		for (uint32_t d = 0; d < t->n_dims; d++)
		{
			uint64_t	ne;

			if (!cursor_u64(c, &ne))
				return cai_fail(err, CAI_ERR_FORMAT,
								"gguf: info of tensor '%.*s' extends past end of file",
								STR_ARG(t->name));
			if (ne == 0 || ne > (uint64_t) INT64_MAX)
				return cai_fail(err, CAI_ERR_FORMAT,
								"gguf: tensor '%.*s' dimension %u is %lld (must be positive)",
								STR_ARG(t->name), (unsigned) d, (long long) ne);
			t->ne[d] = (int64_t) ne;
			if (__builtin_mul_overflow(n_elements, t->ne[d], &n_elements))
				return cai_fail(err, CAI_ERR_FORMAT,
								"gguf: tensor '%.*s' element count overflows",
								STR_ARG(t->name));
		}
		if (!cursor_u32(c, &type) || !cursor_u64(c, &t->offset))
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: info of tensor '%.*s' extends past end of file",
							STR_ARG(t->name));
		t->type = (ggml_type) type;
		block = ggml_type_block_elems(t->type);
		if (block == 0)
			return cai_fail(err, CAI_ERR_UNSUPPORTED,
							"gguf: tensor '%.*s' has ggml type %u, which this engine does not know",
							STR_ARG(t->name), (unsigned) type);
		if (t->ne[0] % block != 0)
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: tensor '%.*s' of type %s has a row of %lld elements, not a multiple of its block size %lld",
							STR_ARG(t->name), ggml_type_name(t->type),
							(long long) t->ne[0], (long long) block);
		if (!ggml_row_bytes(t->type, n_elements, &nbytes))
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: tensor '%.*s' byte size overflows", STR_ARG(t->name));
		t->n_elements = n_elements;
		t->nbytes = nbytes;
		if (!index_insert(pf->tensor_index, pf->tensor_index_cap, t->name, (uint32_t) i,
						  tensor_name, f))
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: duplicate tensor name '%.*s'", STR_ARG(t->name));
	}
	return CAI_OK;
}

/* A tensor's data range, for the overlap check. */
typedef struct data_range
{
	uint64_t	offset;
	size_t		nbytes;
	uint32_t	tensor;
} data_range;

static int
compare_ranges(const void *a, const void *b)
{
	const data_range *x = a;
	const data_range *y = b;

	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/*
 * Tensors must not share bytes (llama.cpp even wants them back to back).  Besides being what
 * every writer does, this bounds what loading can cost by the file's size: without it a small
 * file could describe a thousand layers whose tensors all alias one blob, and the loader would
 * allocate and convert every one of them.
 */
static cai_status
check_tensors_disjoint(const gguf_file *f, cai_error *err)
{
	data_range *r;

	if (f->n_tensors < 2)
		return CAI_OK;
	r = malloc((size_t) f->n_tensors * sizeof(data_range));
	if (!r)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "gguf: out of memory checking tensor offsets");
	for (uint64_t i = 0; i < f->n_tensors; i++)
		r[i] = (data_range) {f->tensors[i].offset, f->tensors[i].nbytes, (uint32_t) i};
	qsort(r, (size_t) f->n_tensors, sizeof(data_range), compare_ranges);
	for (uint64_t i = 1; i < f->n_tensors; i++)
	{
		/* both ranges lie inside the file, so the sum cannot wrap */
		if (r[i - 1].offset + r[i - 1].nbytes > r[i].offset)
		{
			const gguf_tensor *a = &f->tensors[r[i - 1].tensor];
			const gguf_tensor *b = &f->tensors[r[i].tensor];

			free(r);
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: the data of tensors '%.*s' and '%.*s' overlap",
							STR_ARG(a->name), STR_ARG(b->name));
		}
	}
	free(r);
	return CAI_OK;
}

/* Parses and validates the whole file in pf->pub.base/size. */
static cai_status
parse_file(gguf_file_private *pf, cai_error *err)
{
	gguf_file  *f = &pf->pub;
	gguf_cursor c = {f->base, f->size, 0};
	uint32_t	version;
	uint64_t	n_tensors;
	uint64_t	n_kv;
	size_t		data_start;
	size_t		data_size;
	cai_status	st;

	if (f->size < 4 || memcmp(f->base, "GGUF", 4) != 0)
		return cai_fail(err, CAI_ERR_FORMAT, "gguf: not a gguf file (bad magic)");
	c.pos = 4;
	if (!cursor_u32(&c, &version) || !cursor_u64(&c, &n_tensors) || !cursor_u64(&c, &n_kv))
		return cai_fail(err, CAI_ERR_FORMAT,
						"gguf: header truncated (file is %zu bytes)", f->size);
	if (version == 0x03000000 || version == 0x02000000)
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"gguf: big-endian gguf files are not supported");
	if (version != 2 && version != 3)
		return cai_fail(err, CAI_ERR_UNSUPPORTED,
						"gguf: version %u is not supported (expected 2 or 3)", (unsigned) version);
	f->version = version;

	/* bound the counts by the bytes left before allocating anything for them */
	if (n_kv > cursor_left(&c) / GGUF_MIN_KV_BYTES)
		return cai_fail(err, CAI_ERR_FORMAT,
						"gguf: header claims %llu metadata pairs but the file has only %zu bytes left",
						(unsigned long long) n_kv, cursor_left(&c));
	if (n_tensors > cursor_left(&c) / GGUF_MIN_TENSOR_INFO_BYTES)
		return cai_fail(err, CAI_ERR_FORMAT,
						"gguf: header claims %llu tensors but the file has only %zu bytes left",
						(unsigned long long) n_tensors, cursor_left(&c));
	if (n_kv > UINT32_MAX - 1 || n_tensors > UINT32_MAX - 1)
		return cai_fail(err, CAI_ERR_FORMAT, "gguf: too many metadata pairs or tensors");

	f->kv = calloc((size_t) (n_kv ? n_kv : 1), sizeof(gguf_kv));
	f->tensors = calloc((size_t) (n_tensors ? n_tensors : 1), sizeof(gguf_tensor));
	pf->kv_index_cap = index_capacity(n_kv);
	pf->kv_index = calloc(pf->kv_index_cap, sizeof(uint32_t));
	pf->tensor_index_cap = index_capacity(n_tensors);
	pf->tensor_index = calloc(pf->tensor_index_cap, sizeof(uint32_t));
	if (!f->kv || !f->tensors || !pf->kv_index || !pf->tensor_index)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "gguf: out of memory for the file's index");

	f->alignment = GGUF_DEFAULT_ALIGNMENT;
	for (uint64_t i = 0; i < n_kv; i++)
	{
		gguf_kv    *kv = &f->kv[i];
		uint32_t	type;

		if (!cursor_str(&c, &kv->key))
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: key of metadata pair %llu extends past end of file",
							(unsigned long long) i);
		if (!cursor_u32(&c, &type))
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: type of key '%.*s' extends past end of file",
							STR_ARG(kv->key));
		/* counted before parsing the value so that free_parsed frees a partial string array */
		kv->type = (gguf_value_type) type;
		kv->v.arr.strs = NULL;
		f->n_kv = i + 1;
		st = parse_value(&c, kv, err);
		if (st != CAI_OK)
			return st;
		if (!index_insert(pf->kv_index, pf->kv_index_cap, kv->key, (uint32_t) i, kv_name, f))
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: duplicate metadata key '%.*s'", STR_ARG(kv->key));
		if (gguf_str_eq(kv->key, "general.alignment"))
		{
			st = read_alignment(kv, &f->alignment, err);
			if (st != CAI_OK)
				return st;
		}
	}

	f->n_tensors = n_tensors;
	st = parse_tensor_infos(&c, pf, err);
	if (st != CAI_OK)
		return st;

	/* the data section starts at the next multiple of the alignment */
	data_start = (c.pos + f->alignment - 1) & ~(f->alignment - 1);
	data_size = data_start < f->size ? f->size - data_start : 0;
	for (uint64_t i = 0; i < n_tensors; i++)
	{
		gguf_tensor *t = &f->tensors[i];

		if (t->offset % f->alignment != 0)
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: tensor '%.*s' offset %llu is not a multiple of the alignment %zu",
							STR_ARG(t->name), (unsigned long long) t->offset, f->alignment);
		if (t->offset > data_size || t->nbytes > data_size - t->offset)
			return cai_fail(err, CAI_ERR_FORMAT,
							"gguf: tensor '%.*s' data [offset %llu, %zu bytes] extends past end of file (%zu bytes)",
							STR_ARG(t->name), (unsigned long long) t->offset, t->nbytes, f->size);
		t->data = f->base + data_start + t->offset;
	}
	return check_tensors_disjoint(f, err);
}

/* Allocates the private struct around a buffer and parses it; on failure frees all but the map. */
static cai_status
open_buffer(const uint8_t *data, size_t size, void *map, size_t map_size,
			gguf_file **out, cai_error *err)
{
	gguf_file_private *pf = calloc(1, sizeof(*pf));
	cai_status	st;

	if (!pf)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "gguf: out of memory");
	pf->pub.base = data;
	pf->pub.size = size;
	st = parse_file(pf, err);
	if (st != CAI_OK)
	{
		free_parsed(pf);
		free(pf);
		return st;
	}
	pf->pub.map = map;
	pf->pub.map_size = map_size;
	*out = &pf->pub;
	return CAI_OK;
}

/*
 * Opens and validates a GGUF file through a read-only private memory map.  On failure *out is
 * NULL and nothing stays mapped or allocated.
 */
cai_status
gguf_open(const char *path, gguf_file **out, cai_error *err)
{
	int			fd;
	off_t		size = 0;
	cai_error	why;
	void	   *map;
	cai_status	status;

	if (!out)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "gguf: no output pointer");
	*out = NULL;
	if (!path)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "gguf: no file path");
	/* a FIFO or a device named as the model must not block the load: only a regular file */
	fd = cai_safe_open_regular_follow(path, &size, &why, NULL);
	if (fd < 0)
		return cai_fail(err, CAI_ERR_IO, "gguf: %s", why.message);
	if (size < 24)
	{
		close(fd);
		return cai_fail(err, CAI_ERR_FORMAT,
						"gguf: \"%s\" is %lld bytes, too small to be a gguf file",
						path, (long long) size);
	}
	map = mmap(NULL, (size_t) size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (map == MAP_FAILED)
		return cai_fail(err, CAI_ERR_IO, "gguf: could not map \"%s\": %s", path, strerror(errno));

	status = open_buffer(map, (size_t) size, map, (size_t) size, out, err);
	if (status != CAI_OK)
		munmap(map, (size_t) size);
	return status;
}

/* Opens and validates a GGUF image in a caller-owned buffer that must outlive the result. */
cai_status
gguf_open_memory(const void *data, size_t size, gguf_file **out, cai_error *err)
{
	if (!out)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "gguf: no output pointer");
	*out = NULL;
	if (!data && size > 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "gguf: no buffer");
	return open_buffer(data, size, NULL, 0, out, err);
}

/* Frees the index and unmaps the file (if gguf_open mapped it). */
void
gguf_close(gguf_file *file)
{
	gguf_file_private *pf = (gguf_file_private *) file;

	if (!file)
		return;
	if (file->map)
		munmap(file->map, file->map_size);
	free_parsed(pf);
	free(pf);
}

/* The metadata pair named key, via the hash index; NULL when absent. */
const gguf_kv *
gguf_find_kv(const gguf_file *file, const char *key)
{
	const gguf_file_private *pf = (const gguf_file_private *) file;
	int64_t		i;

	if (!file)
		return NULL;
	i = index_lookup(pf->kv_index, pf->kv_index_cap, key, kv_name, file);
	return i < 0 ? NULL : &file->kv[i];
}

/* The tensor named name, via the hash index; NULL when absent. */
const gguf_tensor *
gguf_find_tensor(const gguf_file *file, const char *name)
{
	const gguf_file_private *pf = (const gguf_file_private *) file;
	int64_t		i;

	if (!file)
		return NULL;
	i = index_lookup(pf->tensor_index, pf->tensor_index_cap, name, tensor_name, file);
	return i < 0 ? NULL : &file->tensors[i];
}

/* Integer value types, by signedness. */
static bool
is_unsigned_type(gguf_value_type t)
{
	return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 ||
		t == GGUF_TYPE_UINT64;
}

static bool
is_signed_type(gguf_value_type t)
{
	return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 ||
		t == GGUF_TYPE_INT64;
}

/* Reads an integer-typed key as an unsigned value; false for negative values and other types. */
bool
gguf_get_u64(const gguf_file *file, const char *key, uint64_t *out)
{
	const gguf_kv *kv = gguf_find_kv(file, key);

	if (!kv)
		return false;
	if (is_unsigned_type(kv->type))
	{
		*out = kv->v.u64;
		return true;
	}
	if (is_signed_type(kv->type) && kv->v.i64 >= 0)
	{
		*out = (uint64_t) kv->v.i64;
		return true;
	}
	return false;
}

/* Reads an integer-typed key that fits in 32 bits unsigned. */
bool
gguf_get_u32(const gguf_file *file, const char *key, uint32_t *out)
{
	uint64_t	v;

	if (!gguf_get_u64(file, key, &v) || v > UINT32_MAX)
		return false;
	*out = (uint32_t) v;
	return true;
}

/* Reads a float- or integer-typed key as a float. */
bool
gguf_get_f32(const gguf_file *file, const char *key, float *out)
{
	const gguf_kv *kv = gguf_find_kv(file, key);

	if (!kv)
		return false;
	if (kv->type == GGUF_TYPE_FLOAT32 || kv->type == GGUF_TYPE_FLOAT64)
		*out = (float) kv->v.f64;
	else if (is_unsigned_type(kv->type))
		*out = (float) kv->v.u64;
	else if (is_signed_type(kv->type))
		*out = (float) kv->v.i64;
	else
		return false;
	return true;
}

/* Reads a BOOL key. */
bool
gguf_get_bool(const gguf_file *file, const char *key, bool *out)
{
	const gguf_kv *kv = gguf_find_kv(file, key);

	if (!kv || kv->type != GGUF_TYPE_BOOL)
		return false;
	*out = kv->v.b;
	return true;
}

/* Reads a STRING key (pointing into the file; not NUL-terminated). */
bool
gguf_get_str(const gguf_file *file, const char *key, gguf_str *out)
{
	const gguf_kv *kv = gguf_find_kv(file, key);

	if (!kv || kv->type != GGUF_TYPE_STRING)
		return false;
	*out = kv->v.str;
	return true;
}

/* Copies a STRING key into buf as a C string, truncated to cap - 1 bytes. */
bool
gguf_get_cstr(const gguf_file *file, const char *key, char *buf, size_t cap)
{
	gguf_str	s;
	size_t		n;

	if (!buf || cap == 0 || !gguf_get_str(file, key, &s))
		return false;
	n = s.len < cap - 1 ? (size_t) s.len : cap - 1;
	memcpy(buf, s.ptr, n);
	buf[n] = '\0';
	return true;
}

/* Element i of a STRING array. */
bool
gguf_arr_get_str(const gguf_kv *kv, uint64_t i, gguf_str *out)
{
	if (!kv || kv->type != GGUF_TYPE_ARRAY || kv->v.arr.elem_type != GGUF_TYPE_STRING ||
		i >= kv->v.arr.n)
		return false;
	*out = kv->v.arr.strs[i];
	return true;
}

/* Decodes array element i (a fixed-size type) into a scalar kv, for the typed getters below. */
static bool
arr_element(const gguf_kv *kv, uint64_t i, gguf_kv *elem)
{
	size_t		size;

	if (!kv || kv->type != GGUF_TYPE_ARRAY || i >= kv->v.arr.n)
		return false;
	size = value_type_size(kv->v.arr.elem_type);
	if (size == 0)
		return false;
	elem->type = kv->v.arr.elem_type;
	decode_scalar(elem, kv->v.arr.data + (size_t) i * size);
	return true;
}

/* Element i of a float or integer array, as a float. */
bool
gguf_arr_get_f32(const gguf_kv *kv, uint64_t i, float *out)
{
	gguf_kv		e;

	if (!arr_element(kv, i, &e))
		return false;
	if (e.type == GGUF_TYPE_FLOAT32 || e.type == GGUF_TYPE_FLOAT64)
		*out = (float) e.v.f64;
	else if (is_unsigned_type(e.type))
		*out = (float) e.v.u64;
	else if (is_signed_type(e.type))
		*out = (float) e.v.i64;
	else
		return false;
	return true;
}

/* Element i of an integer array (unsigned values above INT64_MAX fail). */
bool
gguf_arr_get_i64(const gguf_kv *kv, uint64_t i, int64_t *out)
{
	gguf_kv		e;

	if (!arr_element(kv, i, &e))
		return false;
	if (is_signed_type(e.type))
		*out = e.v.i64;
	else if (is_unsigned_type(e.type) && e.v.u64 <= (uint64_t) INT64_MAX)
		*out = (int64_t) e.v.u64;
	else
		return false;
	return true;
}

/* True when s holds exactly the bytes of the C string c. */
bool
gguf_str_eq(gguf_str s, const char *c)
{
	size_t		len = strlen(c);

	return s.len == len && memcmp(s.ptr, c, len) == 0;
}
