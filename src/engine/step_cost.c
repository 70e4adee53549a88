/*
 * step_cost.c — a step's cost as fixed + per-token, fitted by least squares with forgetting
 * (see step_cost.h).
 *
 * Linear in the batch's tokens because each token is one row of every matrix product, while the
 * weights are read once per step whatever its length; attention over long contexts bends that
 * line, and other processes' load moves it, so old steps are forgotten (DECAY) and the fit
 * follows the machine as it is now.
 */
#include "step_cost.h"

#include <string.h>

/*
 * Each step's weight in the sums shrinks by this factor per later step: about the last hundred
 * steps count (a second or two of decoding on a CPU), enough to span prefill-carrying and
 * decode-only steps, short enough to follow a change of load.
 */
#define DECAY 0.99

/*
 * Below this variance of the steps' token counts (tokens^2) the slope is noise: the steps were
 * all of about one length and say nothing of what one more token costs.
 */
#define MIN_TOKEN_VARIANCE 4.0

void
cai_step_cost_init(cai_step_cost *cost)
{
	memset(cost, 0, sizeof(*cost));
}

void
cai_step_cost_observe(cai_step_cost *cost, int n_tokens, double seconds)
{
	double		x = n_tokens;
	double		mean_x,
				var_x,
				cov,
				slope,
				intercept;

	if (cost->pinned || n_tokens <= 0 || !(seconds >= 0.0))
		return;
	cost->w = cost->w * DECAY + 1.0;
	cost->sx = cost->sx * DECAY + x;
	cost->sy = cost->sy * DECAY + seconds;
	cost->sxx = cost->sxx * DECAY + x * x;
	cost->sxy = cost->sxy * DECAY + x * seconds;

	mean_x = cost->sx / cost->w;
	var_x = cost->sxx / cost->w - mean_x * mean_x;
	if (var_x < MIN_TOKEN_VARIANCE)
		return;					/* keep the last fit */
	cov = cost->sxy / cost->w - mean_x * cost->sy / cost->w;
	slope = cov / var_x;
	if (!(slope > 0.0))
		return;
	intercept = cost->sy / cost->w - slope * mean_x;
	/* attention's growth with context can tilt the line below the origin: no step is free */
	cost->fixed_seconds = intercept > 0.0 ? intercept : 0.0;
	cost->token_seconds = slope;
	cost->known = true;
}

void
cai_step_cost_pin(cai_step_cost *cost, double fixed_seconds, double token_seconds)
{
	cai_step_cost_init(cost);
	if (fixed_seconds < 0.0 || !(token_seconds > 0.0))
		return;
	cost->fixed_seconds = fixed_seconds;
	cost->token_seconds = token_seconds;
	cost->known = true;
	cost->pinned = true;
}

int
cai_step_cost_prefill_cap(const cai_step_cost *cost, int n_bound, int floor, int budget)
{
	double		cap;

	if (n_bound <= 0 || !cost->known || budget <= floor)
		return budget;
	/* prefill tokens p with p * token_seconds <= fixed_seconds + n_bound * token_seconds */
	cap = cost->fixed_seconds / cost->token_seconds + n_bound;
	if (cap < floor)
		return floor;
	if (cap >= budget)
		return budget;
	return (int) (cap + 0.5);
}
