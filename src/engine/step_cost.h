/*
 * step_cost.h — the engine's running estimate of what a step costs: a fixed part, paid by every
 * step whatever its length (streaming the weights, the thread pool's barriers, sampling), and a
 * part per token of the batch, fitted to the steps the engine has run.
 *
 * The scheduler uses it to keep decodes flowing while a long prompt prefills: with requests
 * decoding, a step carries no more prefill tokens than cost what the decode-only step costs, so
 * a long prompt at most doubles the others' inter-token time instead of making each of their
 * steps as slow as a full-budget prefill (Sarathi-Serve's stall-free batching).
 */
#ifndef CAI_STEP_COST_H
#define CAI_STEP_COST_H

#include <stdbool.h>

typedef struct cai_step_cost
{
	/* exponentially decayed sums over steps of 1, x, y, x^2, xy (x: tokens, y: seconds) */
	double		w,
				sx,
				sy,
				sxx,
				sxy;
	double		fixed_seconds;	/* a step's cost with no token in it */
	double		token_seconds;	/* each token's (decode or prefill: one row of every GEMM) */
	bool		known;			/* a fit has been made (or the costs were pinned) */
	bool		pinned;			/* set by cai_step_cost_pin: steps no longer move it */
} cai_step_cost;

void		cai_step_cost_init(cai_step_cost *cost);

/* One step of n_tokens tokens took seconds: the fit moves towards it. */
void		cai_step_cost_observe(cai_step_cost *cost, int n_tokens, double seconds);

/* Fixes the estimate (tests and benchmarks); a negative argument returns to measuring. */
void		cai_step_cost_pin(cai_step_cost *cost, double fixed_seconds, double token_seconds);

/*
 * The prefill tokens a step whose latency-bound part has n_bound tokens (decodes, the last
 * tokens of short prompts) may carry besides: those costing what a step of that part alone
 * costs, within [floor, budget]; the whole budget when n_bound is 0 or nothing is known yet.
 */
int			cai_step_cost_prefill_cap(const cai_step_cost *cost, int n_bound, int floor,
									  int budget);

#endif							/* CAI_STEP_COST_H */
