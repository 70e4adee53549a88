/*
 * convert.h — planned, parallel conversion of weight rows to int8 (convert.c).
 */
#ifndef CAI_CONVERT_H
#define CAI_CONVERT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "cai.h"
#include "rounding.h"
#include "threadpool.h"
#include "gguf.h"

/* Rows of a weight matrix converted per load task. */
#define CONVERT_CHUNK_ROWS CAI_ROUNDING_ROWS

/*
 * One conversion task: rows [row0, row1) of a matrix.  The source rows are the GGUF tensor's
 * (dequantized; also stored to f when it is not NULL) or float rows fsrc.  When q is not NULL
 * each row, multiplied element-wise by col_scale and by row_scale[r] (both optional), then
 * rotated block by block (each rot->n values, when rot is not NULL, by the plan's rotate_on),
 * is quantized to int8: to
 * the nearest level, or, with rm, the job's rows together along that metric (rounding.h).
 * track_col_max: the source rows' per-column maxima of |value| go to the plan's col_max.
 */
typedef struct cai_convert_job
{
	const gguf_tensor *src;		/* source tensor, or NULL when fsrc is given */
	const float *fsrc;			/* float source of row 0, or NULL */
	int			k;				/* row length (ne0) */
	int			row0;
	int			row1;
	int8_t	   *q;				/* int8 destination of row 0, or NULL */
	float	   *scale;			/* its scales */
	float	   *f;				/* float destination of row 0, or NULL */
	const float *col_scale;		/* [k] or NULL */
	const float *row_scale;		/* [rows] or NULL */
	const cai_rotation *rot;	/* or NULL */
	const cai_rounding_metric *rm;	/* GPTQ rounding along this metric, or NULL */
	int8_t	   *q2;				/* with nearest rounding: each row's second digit (its
								 * rounding error quantized the same way) from row 0, or NULL */
	float	   *scale2;			/* their scales */
	bool		track_col_max;
} cai_convert_job;

typedef struct cai_convert_plan
{
	cai_convert_job *jobs;
	int			n_jobs;
	int			cap;
	int			max_k;			/* the scratch rows' length */
	float	   *scratch;		/* [n_threads][2][max_k] */
	float	   *block;			/* [n_threads][block_floats]: rows rounded together (rm) */
	size_t		block_floats;
	float	   *col_max;		/* [n_threads][max_k] per-thread column maxima, or NULL */
	int			n_threads;
	/*
	 * The backend whose rotate turns the rows of jobs that have rot, one row per call from the
	 * pool's threads: a host backend that runs a single row on its caller (the CPU backend of
	 * the calibration's forward).  Needed only while such jobs run.
	 */
	cai_backend *rotate_on;
	atomic_int	failed;
	cai_error	error;
} cai_convert_plan;


/* Adds the jobs converting a whole matrix of `rows` rows (see cai_convert_job). */
bool		cai_plan_rows_gptq(cai_convert_plan *p, const gguf_tensor *src, const float *fsrc,
							   int k, int rows, int8_t *q, float *scale, float *f,
							   const float *col_scale, const float *row_scale,
							   const cai_rotation *rot, const cai_rounding_metric *rm,
							   bool track_col_max);

/*
 * Nearest rounding with a second int8 digit per row: q2, scale2 get the rounding error of each
 * row's q, scale, quantized the same way (a table read as q * scale + q2 * scale2).
 */
bool		cai_plan_rows_two_digits(cai_convert_plan *p, const gguf_tensor *src, int k, int rows,
									 int8_t *q, float *scale, int8_t *q2, float *scale2, float *f,
									 bool track_col_max);

/* The same with nearest rounding. */
bool		cai_plan_rows_rotated(cai_convert_plan *p, const gguf_tensor *src, const float *fsrc,
								  int k, int rows, int8_t *q, float *scale, float *f,
								  const float *col_scale, const float *row_scale,
								  const cai_rotation *rot, bool track_col_max);

/* The same without rotation or column maxima. */
bool		cai_plan_rows(cai_convert_plan *p, const gguf_tensor *src, const float *fsrc, int k,
						  int rows, int8_t *q, float *scale, float *f, const float *col_scale,
						  const float *row_scale);

/*
 * Runs the planned jobs on the pool and empties the plan.  col_max (k values, or NULL): receives
 * the column maxima of the jobs that tracked them (a maximum does not depend on the order).
 */
cai_status	cai_run_plan_col_max(cai_threadpool *pool, cai_convert_plan *p, float *col_max, int k,
								 cai_error *err);

/* Runs the planned jobs on the pool and empties the plan. */
cai_status	cai_run_plan(cai_threadpool *pool, cai_convert_plan *p, cai_error *err);

#endif							/* CAI_CONVERT_H */
