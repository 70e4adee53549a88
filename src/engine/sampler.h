/*
 * sampler.h — next-token selection from logits: greedy, temperature, top-k, top-p, seeded.
 *
 * Reproducible: the same logits, parameters and RNG state always give the same token.  The RNG
 * (one per request) advances exactly once per sampled token, never for greedy.
 */
#ifndef CAI_SAMPLER_H
#define CAI_SAMPLER_H

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

#endif							/* CAI_SAMPLER_H */
