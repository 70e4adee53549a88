/*
 * sampler.h — next-token selection from logits: greedy, temperature, top-k, top-p, seeded.
 *
 * Reproducible: the same logits, parameters and RNG state always give the same token.  The RNG
 * (one per request) advances exactly once per sampled token, never for greedy.
 */
#ifndef CAI_SAMPLER_H
#define CAI_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "cai.h"

typedef struct cai_rng
{
	uint64_t	s[4];			/* xoshiro256** state */
} cai_rng;

void		cai_rng_seed(cai_rng *rng, uint64_t seed);
uint64_t	cai_rng_next(cai_rng *rng);
double		cai_rng_uniform(cai_rng *rng);	/* [0, 1) */

/* Scratch for sampling over a vocabulary of n_vocab (sized once per engine). */
typedef struct cai_sampler_scratch
{
	int			n_vocab;
	float	   *prob;			/* [n_vocab] */
	int32_t    *index;			/* [n_vocab] */
	float	   *masked;			/* [n_vocab] logits with the disallowed at -inf */
	int32_t    *count;			/* [n_vocab] zero between calls: token counts of the penalties */
} cai_sampler_scratch;

cai_status	cai_sampler_scratch_init(cai_sampler_scratch *s, int n_vocab, cai_error *err);
void		cai_sampler_scratch_free(cai_sampler_scratch *s);

/*
 * Picks a token.  temperature <= 0: argmax (lowest id wins ties).  Otherwise: top-k (if > 0),
 * softmax at the temperature, top-p nucleus (if < 1), then one uniform draw from rng.
 * Never returns an id in `banned` (n_banned ids), e.g. EOS when ignore_eos.
 */
int32_t		cai_sample(const cai_sampling_params *p, cai_rng *rng, const float *logits,
					   int n_vocab, const int32_t *banned, int n_banned,
					   cai_sampler_scratch *scratch);

/*
 * As cai_sample, among the tokens whose bit is set in allowed (bit i % 64 of word i / 64; NULL:
 * every token): the others are sampled as if their logit were -inf, so greedy picks the best
 * allowed token and a draw never lands outside the set.  The RNG advances as in cai_sample.
 * allowed must not be empty.
 */
int32_t		cai_sample_masked(const cai_sampling_params *p, cai_rng *rng, const float *logits,
							  int n_vocab, const uint64_t *allowed, const int32_t *banned,
							  int n_banned, cai_sampler_scratch *scratch);

/*
 * True when p asks for anything cai_sampler_adjust does (penalties, logit_bias, min_p) or for
 * logprobs, i.e. when cai_sample_adjusted cannot just hand the logits to cai_sample_masked.
 */
bool		cai_sampling_adjusts(const cai_sampling_params *p);

/*
 * out[i] = logits[i] adjusted, in this order: -inf outside `allowed` (NULL: all allowed), and
 * for `banned`; repetition_penalty over the distinct tokens among the last CAI_REPEAT_LAST_N of
 * history[0..n_history) (prompt and reply); presence and frequency penalty over the reply,
 * history[n_prompt..n_history); logit_bias (-CAI_LOGIT_BIAS_MAX: -inf); then min_p, which sets
 * to -inf every token whose probability at temperature 1 is below min_p times the largest.
 * count must hold n_vocab zeros; it holds zeros again on return.  Ids outside the vocabulary in
 * history or logit_bias are skipped.
 */
void		cai_sampler_adjust(const cai_sampling_params *p, const float *logits, int n_vocab,
							   const uint64_t *allowed, const int32_t *banned, int n_banned,
							   const int32_t *history, int n_history, int n_prompt, float *out,
							   int32_t *count);

/*
 * The log-softmax of logits / temperature (temperature <= 0: 1) at token, and the top_n
 * (at most CAI_TOP_LOGPROBS_MAX) most likely tokens, best first, lowest id on ties; tokens at
 * -inf are never listed.  Sums in double.
 */
void		cai_sampler_logprobs(const float *logits, int n_vocab, float temperature,
								 int32_t token, int top_n, cai_token_logprobs *out);

/*
 * The whole sampling of a token: cai_sampler_adjust into scratch->masked, then cai_sample on
 * it, then (when p->logprobs and lp) the logprobs of that same adjusted distribution.  Without
 * adjustments or logprobs it is exactly cai_sample_masked (same bits, same RNG use).
 */
int32_t		cai_sample_adjusted(const cai_sampling_params *p, cai_rng *rng, const float *logits,
								int n_vocab, const uint64_t *allowed, const int32_t *banned,
								int n_banned, const int32_t *history, int n_history,
								int n_prompt, cai_sampler_scratch *scratch,
								cai_token_logprobs *lp);

#endif							/* CAI_SAMPLER_H */
