/*
 * convert.c — weight conversion, parallel over a thread pool: each job dequantizes rows of a
 * GGUF tensor (or takes float rows), optionally scales and rotates them, and requantizes them
 * to int8 per row, to the nearest level or along a rounding metric (rounding.h).
 */
#include "convert.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

/* Adds the jobs converting a whole matrix of `rows` rows (see cai_convert_job). */
bool
cai_plan_rows_gptq(cai_convert_plan *p, const gguf_tensor *src, const float *fsrc, int k,
				   int rows, int8_t *q, float *scale, float *f, const float *col_scale,
				   const float *row_scale, const cai_rotation *rot,
				   const cai_rounding_metric *rm, bool track_col_max)
{
	for (int r = 0; r < rows; r += CONVERT_CHUNK_ROWS)
	{
		cai_convert_job *j;

		if (p->n_jobs == p->cap)
		{
			int			cap = p->cap ? p->cap * 2 : 1024;
			cai_convert_job *jobs = realloc(p->jobs, (size_t) cap * sizeof(cai_convert_job));

			if (!jobs)
				return false;
			p->jobs = jobs;
			p->cap = cap;
		}
		j = &p->jobs[p->n_jobs++];
		j->src = src;
		j->fsrc = fsrc;
		j->k = k;
		j->row0 = r;
		j->row1 = r + CONVERT_CHUNK_ROWS < rows ? r + CONVERT_CHUNK_ROWS : rows;
		j->q = q;
		j->scale = scale;
		j->f = f;
		j->col_scale = col_scale;
		j->row_scale = row_scale;
		j->rot = rot;
		j->rm = rm;
		j->q2 = NULL;
		j->scale2 = NULL;
		j->track_col_max = track_col_max;
	}
	return true;
}

/* The same with nearest rounding. */
bool
cai_plan_rows_rotated(cai_convert_plan *p, const gguf_tensor *src, const float *fsrc, int k,
					  int rows, int8_t *q, float *scale, float *f, const float *col_scale,
					  const float *row_scale, const cai_rotation *rot, bool track_col_max)
{
	return cai_plan_rows_gptq(p, src, fsrc, k, rows, q, scale, f, col_scale, row_scale, rot,
							  NULL, track_col_max);
}

/* Nearest rounding and each row's second digit (convert.h). */
bool
cai_plan_rows_two_digits(cai_convert_plan *p, const gguf_tensor *src, int k, int rows, int8_t *q,
						 float *scale, int8_t *q2, float *scale2, float *f, bool track_col_max)
{
	int			first = p->n_jobs;

	if (!cai_plan_rows_rotated(p, src, NULL, k, rows, q, scale, f, NULL, NULL, NULL,
							   track_col_max))
		return false;
	for (int i = first; i < p->n_jobs; i++)
	{
		p->jobs[i].q2 = q2;
		p->jobs[i].scale2 = scale2;
	}
	return true;
}

/* The same without rotation or column maxima. */
bool
cai_plan_rows(cai_convert_plan *p, const gguf_tensor *src, const float *fsrc, int k, int rows,
		  int8_t *q, float *scale, float *f, const float *col_scale, const float *row_scale)
{
	return cai_plan_rows_rotated(p, src, fsrc, k, rows, q, scale, f, col_scale, row_scale, NULL,
							 false);
}

static void
convert_task(void *arg, int task, int thread)
{
	cai_convert_plan *p = arg;
	const cai_convert_job *j = &p->jobs[task];
	size_t		row_bytes = 0;
	float	   *tmp = p->scratch + (size_t) thread * 2 * p->max_k;
	float	   *scaled = tmp + p->max_k;
	float	   *block = p->block ? p->block + (size_t) thread * p->block_floats : NULL;
	cai_error	e;

	if (atomic_load(&p->failed))
		return;
	if (j->src && !ggml_row_bytes(j->src->type, j->k, &row_bytes))
		return;					/* validated before planning */
	for (int r = j->row0; r < j->row1; r++)
	{
		const float *row;

		if (j->fsrc)
			row = j->fsrc + (size_t) r * j->k;
		else
		{
			const uint8_t *src = (const uint8_t *) j->src->data + (size_t) r * row_bytes;
			float	   *dst = j->f ? j->f + (size_t) r * j->k : tmp;

			if (cai_dequantize_row(j->src->type, src, dst, j->k, &e) != CAI_OK)
			{
				if (atomic_exchange(&p->failed, 1) == 0)
					p->error = e;
				return;
			}
			row = dst;
		}
		if (j->track_col_max)
		{
			float	   *cm = p->col_max + (size_t) thread * p->max_k;

			for (int i = 0; i < j->k; i++)
				cm[i] = fabsf(row[i]) > cm[i] ? fabsf(row[i]) : cm[i];
		}
		if (!j->q)
			continue;
		if (j->col_scale || j->row_scale || j->rot)
		{
			float		rs = j->row_scale ? j->row_scale[r] : 1.0f;

			for (int i = 0; i < j->k; i++)
				scaled[i] = row[i] * (j->col_scale ? j->col_scale[i] : 1.0f) * rs;
			if (j->rot)
				p->rotate_on->ops->rotate(p->rotate_on, j->rot, scaled, j->k, 1,
										  j->k / j->rot->n, NULL, NULL);
			row = scaled;
		}
		if (j->rm)
			memcpy(block + (size_t) (r - j->row0) * j->k, row, (size_t) j->k * sizeof(float));
		else
		{
			int8_t	   *q = j->q + (size_t) r * j->k;

			cai_quantize_row_i8(row, j->k, q, &j->scale[r]);
			if (j->q2)
			{
				/* the second digit: the rounding error (a product, then a difference) */
				for (int i = 0; i < j->k; i++)
					scaled[i] = row[i] - (float) q[i] * j->scale[r];
				cai_quantize_row_i8(scaled, j->k, j->q2 + (size_t) r * j->k, &j->scale2[r]);
			}
		}
	}
	if (j->rm)
		cai_round_rows_i8(block, j->row1 - j->row0, j->k, j->rm, j->q + (size_t) j->row0 * j->k,
						  j->scale + j->row0, block + (size_t) CONVERT_CHUNK_ROWS * j->k);
}

/*
 * Runs the planned jobs on the pool and empties the plan.  col_max (k values, or NULL): receives
 * the column maxima of the jobs that tracked them (a maximum does not depend on the order).
 */
cai_status
cai_run_plan_col_max(cai_threadpool *pool, cai_convert_plan *p, float *col_max, int k,
					 cai_error *err)
{
	if (col_max)
		memset(p->col_max, 0, (size_t) p->n_threads * p->max_k * sizeof(float));
	cai_threadpool_run(pool, convert_task, p, p->n_jobs);
	p->n_jobs = 0;
	if (atomic_load(&p->failed))
	{
		if (err)
			*err = p->error;
		return p->error.status != CAI_OK ? p->error.status : CAI_ERR_FORMAT;
	}
	if (col_max)
		for (int i = 0; i < k; i++)
		{
			col_max[i] = 0.0f;
			for (int t = 0; t < p->n_threads; t++)
			{
				float		v = p->col_max[(size_t) t * p->max_k + i];

				col_max[i] = v > col_max[i] ? v : col_max[i];
			}
		}
	return CAI_OK;
}

/* Runs the planned jobs on the pool and empties the plan. */
cai_status
cai_run_plan(cai_threadpool *pool, cai_convert_plan *p, cai_error *err)
{
	return cai_run_plan_col_max(pool, p, NULL, 0, err);
}
