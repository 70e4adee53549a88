/*
 * gguf_writer.h — an in-memory GGUF v3 builder for tests: metadata of every type, tensors in
 * any ggml type (raw bytes, or floats quantized here), written to a file or a malloc'd buffer.
 *
 * Calls never abort: the first failure (out of memory, a bad argument) makes the writer sticky-
 * failed, later calls do nothing, and the write functions return false with the reason in
 * gguf_writer_error().  Tests can therefore chain adds and check once.
 *
 * Output layout: header, metadata in insertion order, tensor infos in insertion order, padding
 * to the alignment, then each tensor's data at an aligned offset.  There is no padding after the
 * last tensor, so any truncation of the output cuts into something the reader needs.
 */
#ifndef CAI_GGUF_WRITER_H
#define CAI_GGUF_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);		/* NULL when out of memory */
void		gguf_writer_free(gguf_writer *w);

/* The reason of the first failure, or "" */
const char *gguf_writer_error(const gguf_writer *w);

/* Data alignment (a power of two); a value other than 32 also writes general.alignment. */
void		gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment);

/* Scalars. */
void		gguf_writer_add_u8(gguf_writer *w, const char *key, uint8_t v);
void		gguf_writer_add_i8(gguf_writer *w, const char *key, int8_t v);
void		gguf_writer_add_u16(gguf_writer *w, const char *key, uint16_t v);
void		gguf_writer_add_i16(gguf_writer *w, const char *key, int16_t v);
void		gguf_writer_add_u32(gguf_writer *w, const char *key, uint32_t v);
void		gguf_writer_add_i32(gguf_writer *w, const char *key, int32_t v);
void		gguf_writer_add_u64(gguf_writer *w, const char *key, uint64_t v);
void		gguf_writer_add_i64(gguf_writer *w, const char *key, int64_t v);
void		gguf_writer_add_f32(gguf_writer *w, const char *key, float v);
void		gguf_writer_add_f64(gguf_writer *w, const char *key, double v);
void		gguf_writer_add_bool(gguf_writer *w, const char *key, bool v);
void		gguf_writer_add_str(gguf_writer *w, const char *key, const char *s);
void		gguf_writer_add_str_len(gguf_writer *w, const char *key, const char *s, size_t len);

/* An array of n fixed-size elements (little-endian, as in memory on x86) of elem_type. */
void		gguf_writer_add_arr(gguf_writer *w, const char *key, gguf_value_type elem_type,
								const void *data, uint64_t n);

/* An array of n NUL-terminated strings. */
void		gguf_writer_add_arr_str(gguf_writer *w, const char *key, const char *const *strs,
									uint64_t n);

/* An array of n strings of lens[i] bytes each (NUL bytes allowed; lens NULL: C strings). */
void		gguf_writer_add_arr_str_len(gguf_writer *w, const char *key, const char *const *strs,
										const size_t *lens, uint64_t n);

/*
 * A tensor from raw bytes of its type (copied); nbytes must equal the size its shape and type
 * give.  ne has n_dims entries, ne[0] innermost.
 */
void		gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims,
								   const int64_t *ne, ggml_type type, const void *data,
								   size_t nbytes);

/* A tensor from floats, converted to type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K). */
void		gguf_writer_add_tensor_f32(gguf_writer *w, const char *name, uint32_t n_dims,
									   const int64_t *ne, ggml_type type, const float *x);

/*
 * A tensor whose values a generator produces when the image is written, so that a model far
 * larger than memory can be written: gen(state, x, n) fills x with the tensor's next n values
 * (called in order, in chunks of whole rows), which are then converted to type as in
 * gguf_writer_add_tensor_f32.  state_size bytes of state are copied and handed to every call.
 */
typedef void (*gguf_tensor_gen) (void *state, float *x, int64_t n);

void		gguf_writer_add_tensor_gen(gguf_writer *w, const char *name, uint32_t n_dims,
									   const int64_t *ne, ggml_type type, gguf_tensor_gen gen,
									   const void *state, size_t state_size);

/*
 * Writes the file image to a malloc'd buffer (*data, free() it) or a file.  The file is
 * written a tensor at a time: only the metadata and one chunk of a generated tensor are held.
 */
bool		gguf_writer_write_buffer(gguf_writer *w, uint8_t **data, size_t *size);
bool		gguf_writer_write_file(gguf_writer *w, const char *path);

/*
 * Byte offsets in the last written image, for tests that corrupt specific fields: where
 * metadata pair i starts (its key length), where tensor info i starts (its name length), and
 * where the data section starts.  -1 for an index out of range or before any write.
 */
int64_t		gguf_writer_kv_offset(const gguf_writer *w, uint64_t i);
int64_t		gguf_writer_tensor_info_offset(const gguf_writer *w, uint64_t i);
int64_t		gguf_writer_data_offset(const gguf_writer *w);

/*
 * Quantizes n floats (a whole number of blocks) into type's block format at dst, which must
 * hold ggml_row_bytes(type, n) bytes.  False for types without a quantizer or a partial block.
 * Scales are rounded to fp16 before the values are quantized against them, so the round-trip
 * error bounds are: Q8_0 d/2, Q4_0 d (the extreme of the far sign saturates at 7d), Q4_1 d/2
 * (plus the fp16 rounding of the minimum).
 */
bool		gguf_quantize(ggml_type type, const float *x, int64_t n, void *dst);

/* Float to bfloat16, rounding to nearest even (NaN stays NaN). */
uint16_t	gguf_fp32_to_bf16(float f);

#endif							/* CAI_GGUF_WRITER_H */
