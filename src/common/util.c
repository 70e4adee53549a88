/*
 * util.c — errors, token vectors, clocks and number conversions shared by the engine.
 */
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

cai_status
cai_fail(cai_error *err, cai_status status, const char *fmt, ...)
{
	if (err)
	{
		va_list		ap;

		err->status = status;
		va_start(ap, fmt);
		vsnprintf(err->message, sizeof(err->message), fmt, ap);
		va_end(ap);
	}
	return status;
}

void
cai_error_clear(cai_error *err)
{
	if (err)
	{
		err->status = CAI_OK;
		err->message[0] = '\0';
	}
}

const char *
cai_status_name(cai_status status)
{
	switch (status)
	{
		case CAI_OK:
			return "ok";
		case CAI_ERR_INVALID_ARGUMENT:
			return "invalid argument";
		case CAI_ERR_IO:
			return "i/o error";
		case CAI_ERR_FORMAT:
			return "malformed file";
		case CAI_ERR_UNSUPPORTED:
			return "unsupported";
		case CAI_ERR_NO_MEMORY:
			return "out of memory";
		case CAI_ERR_CONTEXT_FULL:
			return "context full";
		case CAI_ERR_QUEUE_FULL:
			return "queue full";
		case CAI_ERR_NOT_FOUND:
			return "not found";
		case CAI_ERR_BACKEND:
			return "backend error";
		case CAI_ERR_INTERNAL:
			return "internal error";
	}
	return "unknown status";
}

void
cai_free(void *ptr)
{
	free(ptr);
}

void
cai_tokens_init(cai_tokens *t)
{
	t->ids = NULL;
	t->n = 0;
	t->cap = 0;
}

void
cai_tokens_free(cai_tokens *t)
{
	free(t->ids);
	cai_tokens_init(t);
}

static bool
cai_tokens_reserve(cai_tokens *t, int need)
{
	int			cap;
	int32_t    *ids;

	if (need <= t->cap)
		return true;
	cap = t->cap ? t->cap : 16;
	while (cap < need)
	{
		if (cap > (1 << 29))
			return false;
		cap *= 2;
	}
	ids = realloc(t->ids, (size_t) cap * sizeof(int32_t));
	if (!ids)
		return false;
	t->ids = ids;
	t->cap = cap;
	return true;
}

bool
cai_tokens_push(cai_tokens *t, int32_t id)
{
	if (!cai_tokens_reserve(t, t->n + 1))
		return false;
	t->ids[t->n++] = id;
	return true;
}

bool
cai_tokens_append(cai_tokens *t, const int32_t *ids, int n)
{
	if (n <= 0)
		return true;
	if (!cai_tokens_reserve(t, t->n + n))
		return false;
	memcpy(t->ids + t->n, ids, (size_t) n * sizeof(int32_t));
	t->n += n;
	return true;
}

bool
cai_grow(void **items, size_t *cap, size_t need, size_t size)
{
	size_t		n = *cap ? *cap : 8;
	size_t		bytes;
	void	   *p;

	if (need <= *cap)
		return true;
	while (n < need)
		if (!cai_mul_size(n, 2, &n))
			return false;
	if (!cai_mul_size(n, size, &bytes) || !(p = realloc(*items, bytes)))
		return false;
	*items = p;
	*cap = n;
	return true;
}

bool
cai_buf_reserve(cai_buf *b, size_t extra)
{
	size_t		need;

	return cai_add_size(b->len, extra, &need) && cai_grow((void **) &b->data, &b->cap, need, 1);
}

bool
cai_buf_append(cai_buf *b, const void *bytes, size_t n)
{
	if (!cai_buf_reserve(b, n))
		return false;
	if (n)
		memcpy(b->data + b->len, bytes, n);
	b->len += n;
	return true;
}

void
cai_buf_free(cai_buf *b)
{
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
}

double
cai_now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

#define HUGE_PAGE_BYTES ((size_t) 2 << 20)

void *
cai_alloc_large(size_t bytes)
{
	void	   *p;

	if (bytes < HUGE_PAGE_BYTES)
		return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
	if (posix_memalign(&p, HUGE_PAGE_BYTES, bytes) != 0)
		return NULL;
#ifdef MADV_HUGEPAGE
	/* only advice: where huge pages are off or scarce this fails or falls back, harmlessly */
	(void) madvise(p, bytes, MADV_HUGEPAGE);
#endif
	return p;
}

void
cai_unmap_pages(const void *p, size_t bytes)
{
	const uintptr_t page = (uintptr_t) sysconf(_SC_PAGESIZE);
	uintptr_t	lo = ((uintptr_t) p + page - 1) & ~(page - 1);
	uintptr_t	hi = ((uintptr_t) p + bytes) & ~(page - 1);

	/* only the whole pages inside the range: its neighbours may still be read */
	if (hi > lo)
		(void) madvise((void *) lo, hi - lo, MADV_DONTNEED);
}

int
cai_cpu_count(void)
{
	long		n = sysconf(_SC_NPROCESSORS_ONLN);

	return n > 0 ? (int) n : 1;
}

float
cai_fp16_to_fp32(uint16_t h)
{
	uint32_t	sign = (uint32_t) (h & 0x8000) << 16;
	uint32_t	exp = (h >> 10) & 0x1f;
	uint32_t	mant = h & 0x3ff;
	uint32_t	bits;
	float		f;

	if (exp == 0)
	{
		if (mant == 0)
			bits = sign;
		else
		{
			/* subnormal: value = mant * 2^-24 */
			f = (float) mant * (1.0f / 16777216.0f);
			return (h & 0x8000) ? -f : f;
		}
	}
	else if (exp == 31)
		bits = sign | 0x7f800000u | (mant << 13);
	else
		bits = sign | ((exp + 112) << 23) | (mant << 13);
	memcpy(&f, &bits, sizeof(f));
	return f;
}

uint16_t
cai_fp32_to_fp16(float f)
{
	uint32_t	x;
	uint32_t	sign;
	int32_t		exp;
	uint32_t	mant;

	memcpy(&x, &f, sizeof(x));
	sign = (x >> 16) & 0x8000;
	exp = (int32_t) ((x >> 23) & 0xff) - 127 + 15;
	mant = x & 0x7fffff;

	if (((x >> 23) & 0xff) == 0xff)		/* inf or nan */
		return (uint16_t) (sign | 0x7c00 | (mant ? 0x200 : 0));
	if (exp >= 31)
		return (uint16_t) (sign | 0x7c00);
	if (exp <= 0)
	{
		/* subnormal or zero, round to nearest even */
		uint32_t	m;
		uint32_t	shift;
		uint32_t	r;

		if (exp < -10)
			return (uint16_t) sign;
		m = mant | 0x800000;
		shift = (uint32_t) (14 - exp);
		r = m >> shift;
		if ((m >> (shift - 1)) & 1)
		{
			if ((m & ((1u << (shift - 1)) - 1)) || (r & 1))
				r++;
		}
		return (uint16_t) (sign | r);
	}
	else
	{
		uint32_t	r = ((uint32_t) exp << 10) | (mant >> 13);

		/* round to nearest even; a carry into the exponent is correct behaviour */
		if ((mant & 0x1000) && ((mant & 0x2fff) != 0))
			r++;
		return (uint16_t) (sign | r);
	}
}

float
cai_bf16_to_fp32(uint16_t b)
{
	uint32_t	bits = (uint32_t) b << 16;
	float		f;

	memcpy(&f, &bits, sizeof(f));
	return f;
}
