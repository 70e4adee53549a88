/*
 * gguf.h — a GGUF v3 (also v2) reader over a memory map.
 *
 * The file is untrusted input: gguf_open validates every count, length, offset and size against
 * the file before anything else reads it, so code using a gguf_file never reads out of bounds.
 * Strings point into the map and are NOT NUL-terminated (use gguf_str and its length).
 */
#ifndef CAI_GGUF_H
#define CAI_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"

/* Metadata value types (the GGUF spec's gguf_metadata_value_type). */
typedef enum gguf_value_type
{
	GGUF_TYPE_UINT8 = 0,
	GGUF_TYPE_INT8 = 1,
	GGUF_TYPE_UINT16 = 2,
	GGUF_TYPE_INT16 = 3,
	GGUF_TYPE_UINT32 = 4,
	GGUF_TYPE_INT32 = 5,
	GGUF_TYPE_FLOAT32 = 6,
	GGUF_TYPE_BOOL = 7,
	GGUF_TYPE_STRING = 8,
	GGUF_TYPE_ARRAY = 9,
	GGUF_TYPE_UINT64 = 10,
	GGUF_TYPE_INT64 = 11,
	GGUF_TYPE_FLOAT64 = 12
} gguf_value_type;

/* Tensor element types (ggml_type numbering as written in GGUF files). */
typedef enum ggml_type
{
	GGML_TYPE_F32 = 0,
	GGML_TYPE_F16 = 1,
	GGML_TYPE_Q4_0 = 2,
	GGML_TYPE_Q4_1 = 3,
	GGML_TYPE_Q5_0 = 6,
	GGML_TYPE_Q5_1 = 7,
	GGML_TYPE_Q8_0 = 8,
	GGML_TYPE_Q8_1 = 9,
	GGML_TYPE_Q2_K = 10,
	GGML_TYPE_Q3_K = 11,
	GGML_TYPE_Q4_K = 12,
	GGML_TYPE_Q5_K = 13,
	GGML_TYPE_Q6_K = 14,
	GGML_TYPE_Q8_K = 15,
	GGML_TYPE_I8 = 24,
	GGML_TYPE_I16 = 25,
	GGML_TYPE_I32 = 26,
	GGML_TYPE_I64 = 27,
	GGML_TYPE_F64 = 28,
	GGML_TYPE_BF16 = 30
} ggml_type;

typedef struct gguf_str
{
	const char *ptr;			/* into the map; not NUL-terminated */
	uint64_t	len;
} gguf_str;

typedef struct gguf_kv
{
	gguf_str	key;
	gguf_value_type type;
	union
	{
		uint64_t	u64;		/* any unsigned integer type, widened */
		int64_t		i64;		/* any signed integer type, widened */
		double		f64;		/* FLOAT32 or FLOAT64, widened */
		bool		b;
		gguf_str	str;
		struct
		{
			gguf_value_type elem_type;
			uint64_t	n;
			const uint8_t *data;	/* first element (fixed-size element types) */
			gguf_str   *strs;	/* STRING arrays: n validated strings (owned by the gguf_file) */
		}			arr;
	}			v;
} gguf_kv;

#define GGUF_MAX_DIMS 4

typedef struct gguf_tensor
{
	gguf_str	name;
	uint32_t	n_dims;
	int64_t		ne[GGUF_MAX_DIMS];	/* ne[0] is the contiguous (innermost) dimension; unused = 1 */
	ggml_type	type;
	uint64_t	offset;			/* relative to the data section */
	const void *data;			/* into the map; validated to hold nbytes */
	size_t		nbytes;
	int64_t		n_elements;
} gguf_tensor;

typedef struct gguf_file
{
	uint32_t	version;
	uint64_t	n_kv;
	gguf_kv    *kv;
	uint64_t	n_tensors;
	gguf_tensor *tensors;
	size_t		alignment;
	const uint8_t *base;		/* start of the file's bytes */
	size_t		size;
	/* private */
	void	   *map;			/* NULL for gguf_open_memory */
	size_t		map_size;
} gguf_file;

/* Opens and validates a file. On failure *out is NULL, err says why, nothing leaks. */
cai_status	gguf_open(const char *path, gguf_file **out, cai_error *err);

/* Same over a caller-owned buffer that must outlive the gguf_file (tests, fuzzing). */
cai_status	gguf_open_memory(const void *data, size_t size, gguf_file **out, cai_error *err);

void		gguf_close(gguf_file *file);

/* Look-ups return NULL/false when absent or of an incompatible type. */
const gguf_kv *gguf_find_kv(const gguf_file *file, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *file, const char *name);

bool		gguf_get_u64(const gguf_file *file, const char *key, uint64_t *out);	/* any int type >= 0 */
bool		gguf_get_u32(const gguf_file *file, const char *key, uint32_t *out);	/* range-checked */
bool		gguf_get_f32(const gguf_file *file, const char *key, float *out);	/* float or int types */
bool		gguf_get_bool(const gguf_file *file, const char *key, bool *out);
bool		gguf_get_str(const gguf_file *file, const char *key, gguf_str *out);

/* Copies a string value into buf as a NUL-terminated C string (truncating). */
bool		gguf_get_cstr(const gguf_file *file, const char *key, char *buf, size_t cap);

/* Array element access with bounds and type checks. */
bool		gguf_arr_get_str(const gguf_kv *kv, uint64_t i, gguf_str *out);
bool		gguf_arr_get_f32(const gguf_kv *kv, uint64_t i, float *out);
bool		gguf_arr_get_i64(const gguf_kv *kv, uint64_t i, int64_t *out);	/* any int elem type */

/* True when s equals the NUL-terminated c string. */
bool		gguf_str_eq(gguf_str s, const char *c);

const char *gguf_value_type_name(gguf_value_type t);

#endif							/* CAI_GGUF_H */
