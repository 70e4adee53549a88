/*
 * rounding.h — GPTQ int8 rounding of weight rows, for the model's
 * conversion.
 *
 * Rounding each weight to its nearest level makes every element's error as small as it can be
 * alone.  What the model feels is the error of the matrix's outputs, which for one row with
 * rounding error e over inputs x_t is sum_t (x_t . e)^2 = e^T H e, H = sum_t x_t x_t^T the
 * second moment of the inputs the row meets (from calibration text).  GPTQ (Frantar et al.
 * 2022) rounds the elements one after another and lets each choice cancel, along H, the error
 * the previous ones left.  The form used here is Babai's nearest-plane algorithm, which is GPTQ
 * with the elements taken in reverse order (Chen et al. 2025): with H = U^T U, U upper
 * triangular (Cholesky),
 * e^T H e = |U e|^2 and (U e)_i = sum_{j >= i} U_ij e_j; going from the last element to the
 * first, element i takes the level nearest to w_i + (sum_{j > i} U_ij e_j) / U_ii, which makes
 * (U e)_i as small as the grid allows given the elements already rounded.  No inverse of H is
 * needed.
 *
 * The levels are those of cai_quantize_row_i8 (per-row scale max|w| / 127, q in [-127, 127]):
 * only which level each element takes changes, so the int8 layout and every kernel stay as they
 * are.
 *
 * Determinism: every loop here is written over independent lanes (rows of U, rows of the
 * weight block), never as a reduction split across lanes, and this file is built without
 * multiply-add contraction, so the AVX2 and baseline clones give the same bits.
 */
#ifndef CAI_ROUNDING_H
#define CAI_ROUNDING_H

#include <stdbool.h>
#include <stdint.h>

#include "threadpool.h"

/*
 * The metric of one matrix's inputs, factored.  It may be block-diagonal: the inputs split into
 * consecutive blocks of `block` values whose cross terms are taken as zero (H's diagonal blocks
 * alone), which makes factoring and rounding cheaper by the number of blocks and keeps the
 * metric's memory at k * block floats for wide matrices.
 */
typedef struct cai_rounding_metric
{
	int			k;
	int			block;			/* divides k; k for a full metric */
	const float *u;				/* [k / block][block][block]: block b's U_b, upper triangular,
								 * H_b = U_b^T U_b (nothing below the diagonals is read) */
	const float *inv_diag;		/* [k] 1 / (U_b)_ii, block after block */
} cai_rounding_metric;

/* Weight rows rounded together by cai_round_rows_i8. */
#define CAI_ROUNDING_ROWS 64

/*
 * Factors one block H (n x n, row-major; only the upper triangle is read) in place: H + lambda I
 * = U^T U with U written over H's upper triangle, and inv_diag[i] = 1 / U_ii.  The damping
 * lambda (a fraction of H's mean diagonal, say) keeps inputs the calibration never exercised
 * (zero rows of H) harmless: they round to nearest.  Runs the trailing updates on the pool.
 * False if H + lambda I is not positive definite (a NaN in the calibration, say); the caller
 * then rounds to nearest.
 */
bool		cai_rounding_metric_factor(cai_threadpool *pool, float *h, int n, float lambda,
									   float *inv_diag);

/*
 * Rounds n (<= CAI_ROUNDING_ROWS) rows w [n][k] to q [n][k] with scales scale [n], choosing the
 * levels along rm (rm->k == k).  Each row's result depends on that row alone.  e: scratch of
 * k * CAI_ROUNDING_ROWS floats.
 */
void		cai_round_rows_i8(const float *w, int n, int k, const cai_rounding_metric *rm,
							  int8_t *q, float *scale, float *e);

#endif							/* CAI_ROUNDING_H */
