/*
 * test_rounding.c — GPTQ int8 rounding of weight rows (rounding.h).
 *
 * The factor must reconstruct the damped metric and not depend on the thread count; the
 * rounding must keep cai_quantize_row_i8's levels and scales, reduce to nearest rounding when
 * the metric is diagonal, treat rows independently, honour block-diagonal metrics, and — the
 * point of it — give a smaller output error e^T H e than nearest rounding on correlated inputs.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rounding.h"
#include "threadpool.h"
#include "quant.h"
#include "test.h"

static uint64_t
rng_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ULL;
}

static double
rng_gauss(uint64_t *s)
{
	double		u1 = ((rng_next(s) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
	double		u2 = (rng_next(s) >> 11) * (1.0 / 9007199254740992.0);

	return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/*
 * H = X^T X (k x k, float) over T inputs with correlated channels: x = z + 0.9 * z[j - 1] mixes
 * neighbours, and a few channels carry large values, as LLM activations do.
 */
static void
correlated_metric(uint64_t seed, int T, int k, float *h)
{
	double	   *x = malloc((size_t) T * k * sizeof(double));
	double	   *z = malloc((size_t) k * sizeof(double));

	for (int t = 0; t < T; t++)
	{
		for (int i = 0; i < k; i++)
			z[i] = rng_gauss(&seed) * (i % 17 == 3 ? 8.0 : 1.0);
		for (int i = 0; i < k; i++)
			x[(size_t) t * k + i] = z[i] + (i > 0 ? 0.9 * z[i - 1] : 0.0);
	}
	for (int a = 0; a < k; a++)
		for (int b = 0; b < k; b++)
		{
			double		sum = 0.0;

			for (int t = 0; t < T; t++)
				sum += x[(size_t) t * k + a] * x[(size_t) t * k + b];
			h[(size_t) a * k + b] = (float) sum;
		}
	free(x);
	free(z);
}

static double
mean_diag(const float *h, int k)
{
	double		m = 0.0;

	for (int i = 0; i < k; i++)
		m += h[(size_t) i * k + i];
	return m / k;
}

/* e^T H e in double for one row's rounding error. */
static double
output_error(const float *h, int k, const float *w, const int8_t *q, float scale)
{
	double		sum = 0.0;

	for (int a = 0; a < k; a++)
		for (int b = 0; b < k; b++)
			sum += ((double) w[a] - (double) q[a] * scale) * h[(size_t) a * k + b] *
				((double) w[b] - (double) q[b] * scale);
	return sum;
}

TEST(rounding_factor_reconstructs_metric_for_any_threads)
{
	const int	k = 80;			/* not a multiple of the factor's panel */
	float	   *h = malloc((size_t) k * k * sizeof(float));
	float	   *u1 = malloc((size_t) k * k * sizeof(float));
	float	   *u2 = malloc((size_t) k * k * sizeof(float));
	float		d1[80],
				d2[80];
	float		lambda;
	double		worst = 0.0;
	cai_threadpool *one = cai_threadpool_create(1);
	cai_threadpool *three = cai_threadpool_create(3);

	correlated_metric(11, 200, k, h);
	lambda = (float) (0.01 * mean_diag(h, k));
	memcpy(u1, h, (size_t) k * k * sizeof(float));
	memcpy(u2, h, (size_t) k * k * sizeof(float));
	CHECK(cai_rounding_metric_factor(one, u1, k, lambda, d1));
	CHECK(cai_rounding_metric_factor(three, u2, k, lambda, d2));

	/* same bits whatever the threads (upper triangle and diagonal inverses) */
	for (int i = 0; i < k; i++)
	{
		CHECK(memcmp(u1 + (size_t) i * k + i, u2 + (size_t) i * k + i,
					 (size_t) (k - i) * sizeof(float)) == 0);
		CHECK(d1[i] == d2[i]);
		CHECK(d1[i] == 1.0f / u1[(size_t) i * k + i]);
	}
	/* U^T U == H + lambda I, relative to the diagonal's size */
	for (int a = 0; a < k; a++)
		for (int b = a; b < k; b++)
		{
			double		sum = 0.0;
			double		want = h[(size_t) a * k + b] + (a == b ? lambda : 0.0f);
			double		err;

			for (int p = 0; p <= a; p++)
				sum += (double) u1[(size_t) p * k + a] * u1[(size_t) p * k + b];
			err = fabs(sum - want) / mean_diag(h, k);
			worst = err > worst ? err : worst;
		}
	CHECK_MSG(worst < 1e-5, "worst relative error %g", worst);

	/* not positive definite: refused */
	memset(u1, 0, (size_t) k * k * sizeof(float));
	CHECK(!cai_rounding_metric_factor(one, u1, k, 0.0f, d1));

	cai_threadpool_free(one);
	cai_threadpool_free(three);
	free(h);
	free(u1);
	free(u2);
}

/* Rounds rows with a metric made from h (block-diagonal with blocks of `block`). */
static void
round_with(cai_threadpool *pool, const float *h, int k, int block, float damp, const float *w,
		   int n, int8_t *q, float *scale)
{
	float	   *u = malloc((size_t) k * block * sizeof(float));
	float	   *inv = malloc((size_t) k * sizeof(float));
	float	   *e = malloc((size_t) k * CAI_ROUNDING_ROWS * sizeof(float));
	float		lambda = (float) (damp * mean_diag(h, k));
	cai_rounding_metric rm = {k, block, u, inv};

	for (int b = 0; b < k; b += block)
	{
		for (int i = 0; i < block; i++)
			memcpy(u + (size_t) b * block + (size_t) i * block,
				   h + (size_t) (b + i) * k + b, (size_t) block * sizeof(float));
		CHECK(cai_rounding_metric_factor(pool, u + (size_t) b * block, block, lambda, inv + b));
	}
	cai_round_rows_i8(w, n, k, &rm, q, scale, e);
	free(u);
	free(inv);
	free(e);
}

TEST(rounding_gptq_rows_lower_output_error)
{
	const int	k = 96;
	const int	n = 37;			/* a partial set of rows */
	uint64_t	seed = 5;
	float	   *h = malloc((size_t) k * k * sizeof(float));
	float	   *w = malloc((size_t) n * k * sizeof(float));
	int8_t	   *q = malloc((size_t) n * k);
	int8_t	   *qn = malloc((size_t) n * k);
	int8_t		q1[96];
	float		scale[37],
				sn[37],
				s1;
	double		err_comp = 0.0,
				err_near = 0.0;
	cai_threadpool *pool = cai_threadpool_create(2);

	correlated_metric(21, 400, k, h);
	for (int i = 0; i < n * k; i++)
		w[i] = (float) (rng_gauss(&seed) * 0.05);
	round_with(pool, h, k, k, 0.01, w, n, q, scale);
	for (int r = 0; r < n; r++)
	{
		cai_quantize_row_i8(w + (size_t) r * k, k, qn + (size_t) r * k, &sn[r]);
		CHECK(scale[r] == sn[r]);	/* the same levels */
		for (int i = 0; i < k; i++)
			CHECK(q[(size_t) r * k + i] >= -127 && q[(size_t) r * k + i] <= 127);
		err_comp += output_error(h, k, w + (size_t) r * k, q + (size_t) r * k, scale[r]);
		err_near += output_error(h, k, w + (size_t) r * k, qn + (size_t) r * k, sn[r]);
	}
	/* on these inputs GPTQ removes most of the output error */
	CHECK_MSG(err_comp < 0.6 * err_near, "output error %g GPTQ, %g nearest",
			  err_comp, err_near);
	CHECK(memcmp(q, qn, (size_t) n * k) != 0);

	/* a row's result depends on that row alone */
	round_with(pool, h, k, k, 0.01, w + (size_t) 7 * k, 1, q1, &s1);
	CHECK(memcmp(q1, q + (size_t) 7 * k, k) == 0);
	CHECK(s1 == scale[7]);

	cai_threadpool_free(pool);
	free(h);
	free(w);
	free(q);
	free(qn);
}

TEST(rounding_diagonal_metric_is_nearest_rounding)
{
	const int	k = 64;
	const int	n = 64;
	uint64_t	seed = 9;
	float	   *h = calloc((size_t) k * k, sizeof(float));
	float	   *w = malloc((size_t) n * k * sizeof(float));
	int8_t	   *q = malloc((size_t) n * k);
	int8_t	   *qn = malloc((size_t) n * k);
	float		scale[64],
				sn[64];
	cai_threadpool *pool = cai_threadpool_create(2);

	for (int i = 0; i < k; i++)
		h[(size_t) i * k + i] = (float) (1.0 + i);
	for (int i = 0; i < n * k; i++)
		w[i] = (float) rng_gauss(&seed);
	memset(w + (size_t) 3 * k, 0, (size_t) k * sizeof(float));	/* an all-zero row */
	round_with(pool, h, k, k, 0.01, w, n, q, scale);
	for (int r = 0; r < n; r++)
		cai_quantize_row_i8(w + (size_t) r * k, k, qn + (size_t) r * k, &sn[r]);
	CHECK(memcmp(q, qn, (size_t) n * k) == 0);
	CHECK(memcmp(scale, sn, sizeof(scale)) == 0);
	CHECK(scale[3] == 0.0f);

	cai_threadpool_free(pool);
	free(h);
	free(w);
	free(q);
	free(qn);
}

TEST(rounding_block_metric_ignores_cross_terms)
{
	const int	k = 96;
	const int	block = 32;
	const int	n = 5;
	uint64_t	seed = 13;
	float	   *h = malloc((size_t) k * k * sizeof(float));
	float	   *hz = malloc((size_t) k * k * sizeof(float));
	float	   *w = malloc((size_t) n * k * sizeof(float));
	int8_t	   *qb = malloc((size_t) n * k);
	int8_t	   *qz = malloc((size_t) n * k);
	float		sb[5],
				sz[5];
	cai_threadpool *pool = cai_threadpool_create(2);

	correlated_metric(31, 300, k, h);
	for (int i = 0; i < n * k; i++)
		w[i] = (float) rng_gauss(&seed);
	/* the full metric with the cross-block terms zeroed rounds exactly like the block metric */
	for (int a = 0; a < k; a++)
		for (int b = 0; b < k; b++)
			hz[(size_t) a * k + b] = a / block == b / block ? h[(size_t) a * k + b] : 0.0f;
	round_with(pool, h, k, block, 0.01, w, n, qb, sb);
	round_with(pool, hz, k, k, 0.01, w, n, qz, sz);
	CHECK(memcmp(qb, qz, (size_t) n * k) == 0);
	CHECK(memcmp(sb, sz, sizeof(sb)) == 0);

	cai_threadpool_free(pool);
	free(h);
	free(hz);
	free(w);
	free(qb);
	free(qz);
}
