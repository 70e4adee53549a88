/*
 * rounding.c — GPTQ int8 rounding of weight rows (see rounding.h).
 *
 * Both loops that matter run over eight-lane vectors along independent lanes and are built for
 * AVX2 (without FMA) and baseline x86-64 with target_clones, like ops.c; contraction is off for
 * the file, so the clones agree bit for bit and a model converts to the same int8 weights on
 * every x86-64 CPU given the same metric.
 */
#pragma GCC optimize("fp-contract=off")

#include "rounding.h"

#include <math.h>
#include <string.h>

#include "quant.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CAI_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CAI_CLONES
#endif

/*
 * Eight float lanes, loaded and stored through memcpy (no alignment assumed): the model's own,
 * not the CPU backend's, whose kernels this arithmetic is not.  Macros, because a function that
 * takes or returns a 32-byte vector draws GCC's ABI warnings on baseline x86-64.
 */
typedef float v8f __attribute__((vector_size(32)));

#define v8f_load_to(v, p) memcpy(&(v), (p), sizeof(v8f))
#define v8f_store(p, v) memcpy((p), &(v), sizeof(v8f))
#define v8f_set1(x) ((v8f) {(x), (x), (x), (x), (x), (x), (x), (x)})

/* Rows of H factored at a time before the trailing rows are updated (any value gives the same bits). */
#define FACTOR_PANEL 32

/* Trailing rows per pool task. */
#define FACTOR_TASK_ROWS 16

/* h[i][l] -= s * p[l] for l in [from, k), eight lanes at a time (no reduction). */
CAI_CLONES static void
axpy_neg(float *hi, const float *p, float s, int from, int k)
{
	v8f			sv = v8f_set1(s);
	int			l = from;

	for (; l + 8 <= k; l += 8)
	{
		v8f			h,
					pv;

		v8f_load_to(h, hi + l);
		v8f_load_to(pv, p + l);
		h = h - sv * pv;
		v8f_store(hi + l, h);
	}
	for (; l < k; l++)
		hi[l] -= s * p[l];
}

typedef struct factor_job
{
	float	   *h;
	int			n;
	int			p0;				/* the panel's rows [p0, p1), already factored */
	int			p1;
} factor_job;

/* Trailing rows of one task: row i gets every panel row's update, in the panel's order. */
static void
factor_trailing_task(void *arg, int task, int thread)
{
	const factor_job *j = arg;
	int			i0 = j->p1 + task * FACTOR_TASK_ROWS;
	int			i1 = i0 + FACTOR_TASK_ROWS < j->n ? i0 + FACTOR_TASK_ROWS : j->n;

	for (int i = i0; i < i1; i++)
	{
		float	   *hi = j->h + (size_t) i * j->n;

		for (int p = j->p0; p < j->p1; p++)
		{
			const float *hp = j->h + (size_t) p * j->n;

			axpy_neg(hi, hp, hp[i], i, j->n);
		}
	}
}

/*
 * Right-looking Cholesky on the upper triangle, FACTOR_PANEL rows at a time: element (i, l)
 * receives the updates of rows p = 0, 1, .., i - 1 in that order whatever the panel width or the
 * split of the trailing rows between threads, so the factor is the same bits for any of them.
 */
bool
cai_rounding_metric_factor(cai_threadpool *pool, float *h, int n, float lambda, float *inv_diag)
{
	for (int i = 0; i < n; i++)
		h[(size_t) i * n + i] += lambda;
	for (int p0 = 0; p0 < n; p0 += FACTOR_PANEL)
	{
		int			p1 = p0 + FACTOR_PANEL < n ? p0 + FACTOR_PANEL : n;
		factor_job	job = {h, n, p0, p1};

		/* the panel's rows, each updated by the panel rows above it */
		for (int j = p0; j < p1; j++)
		{
			float	   *hj = h + (size_t) j * n;
			float		d = hj[j];
			float		inv;

			if (!(d > 0.0f) || !isfinite(d))
				return false;
			d = sqrtf(d);
			inv = 1.0f / d;
			hj[j] = d;
			inv_diag[j] = inv;
			for (int l = j + 1; l < n; l++)
				hj[l] *= inv;
			for (int i = j + 1; i < p1; i++)
				axpy_neg(h + (size_t) i * n, hj, hj[i], i, n);
		}
		if (p1 < n)
			cai_threadpool_run(pool, factor_trailing_task, &job,
							   (n - p1 + FACTOR_TASK_ROWS - 1) / FACTOR_TASK_ROWS);
	}
	return true;
}

/*
 * The correction of one element for all CAI_ROUNDING_ROWS rows at once:
 * acc[r] = sum_{j < count} u[j] * e[j][r], in the order of j in every lane.
 */
CAI_CLONES static void
rows_correction(const float *u, const float *e, int count, float *acc)
{
	v8f			a[CAI_ROUNDING_ROWS / 8];

	for (int x = 0; x < CAI_ROUNDING_ROWS / 8; x++)
		a[x] = v8f_set1(0.0f);
	for (int j = 0; j < count; j++)
	{
		v8f			s = v8f_set1(u[j]);
		const float *ej = e + (size_t) j * CAI_ROUNDING_ROWS;

		for (int x = 0; x < CAI_ROUNDING_ROWS / 8; x++)
		{
			v8f			ev;

			v8f_load_to(ev, ej + 8 * x);
			a[x] = a[x] + s * ev;
		}
	}
	for (int x = 0; x < CAI_ROUNDING_ROWS / 8; x++)
		v8f_store(acc + 8 * x, a[x]);
}

void
cai_round_rows_i8(const float *w, int n, int k, const cai_rounding_metric *rm, int8_t *q,
				  float *scale, float *e)
{
	const int	B = rm->block;
	float		inv[CAI_ROUNDING_ROWS];
	float		sc[CAI_ROUNDING_ROWS];
	float		acc[CAI_ROUNDING_ROWS];

	/* the levels: cai_quantize_row_i8's scales; rows past n are zeros that round to zero */
	for (int r = 0; r < CAI_ROUNDING_ROWS; r++)
	{
		float		amax = 0.0f;

		for (int i = 0; r < n && i < k; i++)
		{
			float		a = fabsf(w[(size_t) r * k + i]);

			amax = a > amax ? a : amax;
		}
		if (!(amax > 0.0f) || !isfinite(amax))
			sc[r] = inv[r] = 0.0f;
		else
		{
			sc[r] = amax / 127.0f;
			inv[r] = 127.0f / amax;
		}
		if (r < n)
			scale[r] = sc[r];
	}

	/* block by block, each from its last element to its first (see rounding.h) */
	for (int b0 = 0; b0 < k; b0 += B)
	{
		const float *ub = rm->u + (size_t) b0 * B;

		for (int il = B - 1; il >= 0; il--)
		{
			int			i = b0 + il;

			rows_correction(ub + (size_t) il * B + il + 1, e + (size_t) (i + 1) * CAI_ROUNDING_ROWS,
							B - 1 - il, acc);
			for (int r = 0; r < CAI_ROUNDING_ROWS; r++)
			{
				float		x = r < n ? w[(size_t) r * k + i] : 0.0f;
				float		v = cai_i8_level_clamp(roundf((x + acc[r] * rm->inv_diag[i]) *
														  inv[r]));

				if (r < n)
					q[(size_t) r * k + i] = (int8_t) v;
				e[(size_t) i * CAI_ROUNDING_ROWS + r] = x - v * sc[r];
			}
		}
	}
}
