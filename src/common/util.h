/*
 * util.h — small helpers shared by the engine's modules (not part of the public API).
 */
#ifndef CAI_UTIL_H
#define CAI_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"

/*
 * A loop function built for AVX2 and for baseline x86-64, the clone picked at load time.  Only
 * for code whose every float operation is lane-wise and whose multiply-adds cannot contract
 * (AVX2 here does not include FMA): then both clones give the same bits.
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CAI_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CAI_CLONES
#endif

/* Sets err (if not NULL) and returns status, so that call sites read `return cai_fail(...)`. */
cai_status	cai_fail(cai_error *err, cai_status status, const char *fmt, ...)
			__attribute__((format(printf, 3, 4)));

/* Clears err to CAI_OK. */
void		cai_error_clear(cai_error *err);

/* A growable array of token ids. */
typedef struct cai_tokens
{
	int32_t    *ids;
	int			n;
	int			cap;
} cai_tokens;

void		cai_tokens_init(cai_tokens *t);
void		cai_tokens_free(cai_tokens *t);
bool		cai_tokens_push(cai_tokens *t, int32_t id);	/* false on out of memory */
bool		cai_tokens_append(cai_tokens *t, const int32_t *ids, int n);

/* Overflow-checked size arithmetic: false when the result does not fit. */
static inline bool
cai_mul_size(size_t a, size_t b, size_t *out)
{
	return !__builtin_mul_overflow(a, b, out);
}

static inline bool
cai_add_size(size_t a, size_t b, size_t *out)
{
	return !__builtin_add_overflow(a, b, out);
}

/*
 * Grows the array *items (room for *cap elements of size bytes) to hold at least need elements,
 * at least doubling.  False, leaving it as it was, when out of memory or beyond size_t.
 */
bool		cai_grow(void **items, size_t *cap, size_t need, size_t size);

/* A growable byte buffer. */
typedef struct cai_buf
{
	char	   *data;
	size_t		len;
	size_t		cap;
} cai_buf;

bool		cai_buf_reserve(cai_buf *b, size_t extra);	/* room for len + extra; false: OOM */
bool		cai_buf_append(cai_buf *b, const void *bytes, size_t n);
void		cai_buf_free(cai_buf *b);

/* Monotonic clock in seconds. */
double		cai_now_seconds(void);

/*
 * Memory for a large, long-lived table (weights, the KV pool): 64-byte aligned, and from 2 MiB
 * up aligned to 2 MiB and offered to the kernel for transparent huge pages.  A decode step
 * touches each layer's part of every sequence's KV blocks, kilobytes spread over hundreds of
 * megabytes: on 4 KiB pages nearly every block costs a TLB miss.  NULL when out of memory;
 * release with free().
 */
void	   *cai_alloc_large(size_t bytes);

/*
 * Drops the whole pages of [p, p + bytes) of a read-only file mapping from resident memory
 * (they are read again from the page cache if touched).
 */
void		cai_unmap_pages(const void *p, size_t bytes);

/* Number of online CPUs (at least 1). */
int			cai_cpu_count(void);

/* IEEE half and bfloat16 conversions. */
float		cai_fp16_to_fp32(uint16_t h);
uint16_t	cai_fp32_to_fp16(float f);
float		cai_bf16_to_fp32(uint16_t b);

#endif							/* CAI_UTIL_H */
