/*
 * gpu_util.c — helpers of the GPU tests (see gpu_util.h).
 */
#include "gpu_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

#define MAX_TEST_BUFFERS 256
#define MAX_REPORTED 5

/* The running test's device buffers (tests run one at a time). */
static void *test_buffers[MAX_TEST_BUFFERS];
static int	n_test_buffers;

void
gpu_rng_seed(gpu_rng *r, uint64_t seed)
{
	r->s = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
	if (r->s == 0)
		r->s = 1;
}

uint64_t
gpu_rng_next(gpu_rng *r)
{
	r->s ^= r->s >> 12;
	r->s ^= r->s << 25;
	r->s ^= r->s >> 27;
	return r->s * 0x2545f4914f6cdd1dull;
}

float
gpu_rng_float(gpu_rng *r, float lo, float hi)
{
	return lo + (hi - lo) * (float) ((gpu_rng_next(r) >> 40) * (1.0 / 16777216.0));
}

int
gpu_rng_int(gpu_rng *r, int lo, int hi)
{
	return lo + (int) (gpu_rng_next(r) % (uint64_t) (hi - lo + 1));
}

void
gpu_fill_f32(gpu_rng *r, float *x, size_t n, float lo, float hi)
{
	for (size_t i = 0; i < n; i++)
		x[i] = gpu_rng_float(r, lo, hi);
	/* never all zeros, even for a degenerate range */
	if (n > 0 && x[0] == 0.0f)
		x[0] = hi != 0.0f ? hi : 1.0f;
}

void
gpu_fill_i8(gpu_rng *r, int8_t *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] = (int8_t) gpu_rng_int(r, -127, 127);
	if (n > 0 && x[0] == 0)
		x[0] = 1;
}

void *
gpu_alloc(size_t bytes)
{
	void	   *p = NULL;
	cai_error	err;

	if (n_test_buffers == MAX_TEST_BUFFERS)
	{
		CHECK_MSG(false, "too many test buffers");
		return NULL;
	}
	if (!gpu_ok(cai_cuda_malloc(gpu_ctx(), bytes, "a test buffer", &p, &err), &err, "malloc"))
		return NULL;
	/* poison: 0xff bytes are NaN as floats and -1 as integers */
	if (!gpu_ok(cai_cuda_memset(gpu_ctx(), p, 0xff, bytes, &err), &err, "memset"))
		return NULL;
	test_buffers[n_test_buffers++] = p;
	return p;
}

void *
gpu_upload(const void *host, size_t bytes)
{
	void	   *p = gpu_alloc(bytes);
	cai_error	err;

	if (p && !gpu_ok(cai_cuda_upload_sync(gpu_ctx(), p, host, bytes, &err), &err, "upload"))
		return NULL;
	return p;
}

bool
gpu_download(void *host, const void *dev, size_t bytes)
{
	cai_error	err;

	return gpu_ok(cai_cuda_download(gpu_ctx(), host, dev, bytes, &err), &err, "download") &&
		gpu_sync();
}

void
gpu_free_all(void)
{
	for (int i = 0; i < n_test_buffers; i++)
		cai_cuda_free(gpu_ctx(), test_buffers[i]);
	n_test_buffers = 0;
}

bool
gpu_sync(void)
{
	cai_error	err;

	return gpu_ok(cai_cuda_sync(gpu_ctx(), &err), &err, "sync");
}

bool
gpu_ok(cai_status st, const cai_error *err, const char *what)
{
	if (st == CAI_OK)
		return true;
	CHECK_MSG(false, "%s: %s", what, err ? err->message : "failed");
	return false;
}

bool
gpu_same_f32(const float *gpu, const float *cpu, size_t n, const char *what)
{
	size_t		bad = 0;

	for (size_t i = 0; i < n; i++)
	{
		if (memcmp(&gpu[i], &cpu[i], sizeof(float)) == 0)
			continue;
		if (bad++ < MAX_REPORTED)
		{
			uint32_t	gb,
						cb;

			memcpy(&gb, &gpu[i], sizeof(gb));
			memcpy(&cb, &cpu[i], sizeof(cb));
			fprintf(stderr, "    %s[%zu]: gpu %.9g (0x%08x) cpu %.9g (0x%08x)\n", what, i,
					gpu[i], gb, cpu[i], cb);
		}
	}
	CHECK_MSG(bad == 0, "%s: %zu of %zu floats differ from the cpu", what, bad, n);
	return bad == 0;
}

bool
gpu_same_i8(const int8_t *gpu, const int8_t *cpu, size_t n, const char *what)
{
	size_t		bad = 0;

	for (size_t i = 0; i < n; i++)
	{
		if (gpu[i] == cpu[i])
			continue;
		if (bad++ < MAX_REPORTED)
			fprintf(stderr, "    %s[%zu]: gpu %d cpu %d\n", what, i, gpu[i], cpu[i]);
	}
	CHECK_MSG(bad == 0, "%s: %zu of %zu int8 values differ from the cpu", what, bad, n);
	return bad == 0;
}

bool
gpu_same_i32(const int32_t *gpu, const int32_t *cpu, size_t n, const char *what)
{
	size_t		bad = 0;

	for (size_t i = 0; i < n; i++)
	{
		if (gpu[i] == cpu[i])
			continue;
		if (bad++ < MAX_REPORTED)
			fprintf(stderr, "    %s[%zu]: gpu %d cpu %d\n", what, i, gpu[i], cpu[i]);
	}
	CHECK_MSG(bad == 0, "%s: %zu of %zu int32 values differ from the reference", what, bad, n);
	return bad == 0;
}

bool
gpu_near_f32(const float *gpu, const float *cpu, size_t n, double abs_tol, double rel_tol,
			 const char *what)
{
	size_t		bad = 0;
	double		worst = 0.0;

	for (size_t i = 0; i < n; i++)
	{
		double		d = fabs((double) gpu[i] - (double) cpu[i]);
		double		tol = abs_tol + rel_tol * fabs((double) cpu[i]);

		if (d <= tol)			/* false for NaN */
		{
			if (d > worst)
				worst = d;
			continue;
		}
		if (bad++ < MAX_REPORTED)
			fprintf(stderr, "    %s[%zu]: gpu %.9g cpu %.9g (|diff| %.3g > %.3g)\n", what, i,
					gpu[i], cpu[i], d, tol);
	}
	CHECK_MSG(bad == 0, "%s: %zu of %zu floats outside tolerance", what, bad, n);
	return bad == 0;
}
