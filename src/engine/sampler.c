/*
 * sampler.c — next-token selection from logits: greedy, temperature, top-k, top-p, seeded.
 *
 * Reproducibility is the point of this file.  Given the same logits, parameters and RNG state the
 * same token comes out, on every run and every IEEE-754 platform:
 *
 *   - the RNG is xoshiro256** (seeded through splitmix64), pure integer arithmetic;
 *   - candidates are ordered by a total order (logit descending, then id ascending), so top-k and
 *     top-p select the same set in the same order whatever the selection algorithm does with ties;
 *   - exp() is computed here with fixed float operations instead of the C library's expf, whose
 *     last bit differs between libm implementations, and floating-point contraction into FMA is
 *     switched off for it, so the same code gives the same bits with or without -mfma;
 *   - sums are accumulated in double in one fixed order (token id order, or sorted order).
 *
 * Cost (49152 tokens): greedy is a vectorized max and a scan for its first occurrence.  top-k is
 * a bounded heap over the vocabulary (O(n log k), not a full sort).  Temperature without top-k
 * exponentiates the whole vocabulary once (vectorized, with an AVX2 clone: util.h's CAI_CLONES);
 * top-p then finds the nucleus with radix histograms of the weights and sorts only the few tokens
 * at its edge (sample_full_vocabulary).  On the 2-core EPYC: greedy 7 us, temperature 49 us,
 * temperature with top-p 0.9 115-120 us per draw.  The engine samples a step's rows in parallel.
 */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/*
 * Functions computing sampling weights get this: no contraction of a*b+c into FMA (so the bits do
 * not depend on -mfma) and no trapping-math (so gcc may vectorize the selects; results unchanged).
 * clang spells the former as a pragma inside the function and vectorizes the selects anyway.
 */
#if defined(__clang__)
#define WEIGHT_FUNCTION
#define WEIGHT_FUNCTION_BODY _Pragma("clang fp contract(off)")
#else
#define WEIGHT_FUNCTION __attribute__((optimize("fp-contract=off", "no-trapping-math")))
#define WEIGHT_FUNCTION_BODY
#endif

/* ---------------------------------------------------------------------------------------------
 * RNG: xoshiro256** (Blackman and Vigna), state filled by splitmix64 so that any seed, 0
 * included, gives a well-mixed nonzero state.
 * ------------------------------------------------------------------------------------------- */

static uint64_t
splitmix64_next(uint64_t *x)
{
	uint64_t	z = (*x += UINT64_C(0x9E3779B97F4A7C15));

	z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
	return z ^ (z >> 31);
}

static inline uint64_t
rotl64(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

/* Seeds the generator; the same seed always gives the same stream. */
void
cai_rng_seed(cai_rng *rng, uint64_t seed)
{
	uint64_t	x = seed;

	for (int i = 0; i < 4; i++)
		rng->s[i] = splitmix64_next(&x);
}

/* Returns the next 64 random bits and advances the state. */
uint64_t
cai_rng_next(cai_rng *rng)
{
	uint64_t   *s = rng->s;
	uint64_t	result = rotl64(s[1] * 5, 7) * 9;
	uint64_t	t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl64(s[3], 45);
	return result;
}

/* Returns a uniform double in [0, 1) built from the top 53 bits of one draw. */
double
cai_rng_uniform(cai_rng *rng)
{
	return (double) (cai_rng_next(rng) >> 11) * 0x1.0p-53;
}

/* ---------------------------------------------------------------------------------------------
 * Scratch
 * ------------------------------------------------------------------------------------------- */

/* Allocates the per-engine scratch for a vocabulary of n_vocab tokens. */
cai_status
cai_sampler_scratch_init(cai_sampler_scratch *s, int n_vocab, cai_error *err)
{
	s->n_vocab = 0;
	s->prob = NULL;
	s->index = NULL;
	s->masked = NULL;
	s->count = NULL;
	if (n_vocab <= 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"sampler vocabulary size must be positive, got %d", n_vocab);
	s->prob = malloc(sizeof(float) * (size_t) n_vocab);
	s->index = malloc(sizeof(int32_t) * (size_t) n_vocab);
	s->masked = malloc(sizeof(float) * (size_t) n_vocab);
	s->count = calloc((size_t) n_vocab, sizeof(int32_t));
	if (s->prob == NULL || s->index == NULL || s->masked == NULL || s->count == NULL)
	{
		cai_sampler_scratch_free(s);
		return cai_fail(err, CAI_ERR_NO_MEMORY,
						"out of memory allocating sampler scratch for %d tokens", n_vocab);
	}
	s->n_vocab = n_vocab;
	return CAI_OK;
}

/* Frees the scratch (safe on a zeroed or already freed one). */
void
cai_sampler_scratch_free(cai_sampler_scratch *s)
{
	free(s->prob);
	free(s->index);
	free(s->masked);
	free(s->count);
	s->count = NULL;
	s->prob = NULL;
	s->index = NULL;
	s->masked = NULL;
	s->n_vocab = 0;
}

/* ---------------------------------------------------------------------------------------------
 * Deterministic exp
 * ------------------------------------------------------------------------------------------- */

/*
 * exp(x) for x <= 0 in float, with the same bits everywhere: round-to-nearest range reduction
 * x = k ln2 + r (|r| <= ln2/2, ln2 split in two so that k ln2 is exact), a degree-6 Taylor
 * polynomial for e^r (truncation error < 2e-7 relative), and 2^k put into the exponent field.
 * Accurate to a few ulp, which is far below what sampling can notice.  x below -87 (where the
 * result would be subnormal) and NaN give 0; x above 0 is treated as 0.  Written with selects
 * instead of branches, and compiled without trapping-math (which changes no result, only what
 * gcc may assume about FP exception flags), so that the loop over the vocabulary vectorizes.
 */
WEIGHT_FUNCTION
static inline float
exp_nonpositive(float x)
{
	WEIGHT_FUNCTION_BODY
	const float log2e = 1.44269504088896341f;
	const float ln2_hi = 0.693145751953125f;	/* 13 significant bits: k * ln2_hi exact */
	const float ln2_lo = 1.42860682030941723e-6f;
	const float round_magic = 12582912.0f;	/* 1.5 * 2^23: adding it rounds to an integer */
	float		clamped = x < 0.0f ? x : 0.0f;
	float		y = clamped >= -87.0f ? clamped : -87.0f;	/* NaN becomes -87 here, 0 below */
	float		shifted = y * log2e + round_magic;
	float		k = shifted - round_magic;
	float		r = (y - k * ln2_hi) - k * ln2_lo;
	float		r2;
	float		r4;
	float		p;
	float		alive;
	union
	{
		float		f;
		int32_t		i;
	}			scale;

	/* Estrin's scheme: shorter dependency chains than Horner, so vector iterations overlap */
	r2 = r * r;
	r4 = r2 * r2;
	p = (1.0f + r) + r2 * (0.5f + r * (1.0f / 6.0f)) +
		r4 * ((1.0f / 24.0f + r * (1.0f / 120.0f)) + r2 * (1.0f / 720.0f));
	scale.i = ((int32_t) k + 127) << 23;
	alive = x >= -87.0f ? 1.0f : 0.0f;	/* a select of constants vectorizes; NaN gives 0 */
	return p * scale.f * alive;
}

/*
 * prob[i] = exp((logits[i] - max_logit) / temperature) for the whole vocabulary.  Carries the
 * same optimize attribute as exp_nonpositive so that the latter inlines and the loop vectorizes
 * (gcc does not inline across differing optimize attributes).
 */
WEIGHT_FUNCTION CAI_CLONES
static void
exp_weights_all(float *prob, const float *logits, int n, float max_logit, float temperature)
{
	WEIGHT_FUNCTION_BODY
	for (int i = 0; i < n; i++)
		prob[i] = exp_nonpositive((logits[i] - max_logit) / temperature);
}

/* prob[j] = exp((logits[ids[j]] - max_logit) / temperature) for candidates ids[0..n). */
WEIGHT_FUNCTION
static void
exp_weights_of(float *prob, const float *logits, const int32_t *ids, int n, float max_logit,
			   float temperature)
{
	WEIGHT_FUNCTION_BODY
	for (int j = 0; j < n; j++)
		prob[j] = exp_nonpositive((logits[ids[j]] - max_logit) / temperature);
}

/* ---------------------------------------------------------------------------------------------
 * Candidate ordering
 * ------------------------------------------------------------------------------------------- */

/* The sort key of a logit: NaN ranks with -inf so that the order stays total. */
static inline float
logit_key(float v)
{
	return isnan(v) ? -INFINITY : v;
}

/* True when token a ranks before token b: higher logit, or the same logit and a lower id. */
static inline bool
ranks_before(const float *logits, int32_t a, int32_t b)
{
	float		va = logit_key(logits[a]);
	float		vb = logit_key(logits[b]);

	return va > vb || (va == vb && a < b);
}

/*
 * Restores the heap property below position i of heap[0..n) in which the root is the candidate
 * that ranks LAST (a min-heap by rank), so that the root is the one to evict.
 */
static void
heap_sift_down(int32_t *heap, int n, int i, const float *logits)
{
	for (;;)
	{
		int			worst = i;
		int			left = 2 * i + 1;
		int			right = left + 1;

		if (left < n && ranks_before(logits, heap[worst], heap[left]))
			worst = left;
		if (right < n && ranks_before(logits, heap[worst], heap[right]))
			worst = right;
		if (worst == i)
			return;
		int32_t		tmp = heap[i];

		heap[i] = heap[worst];
		heap[worst] = tmp;
		i = worst;
	}
}

/*
 * Sorts a min-heap (by rank) into rank order, best first: repeatedly moving the worst remaining
 * candidate to the end is exactly heapsort's extraction.
 */
static void
heap_sort_in_place(int32_t *heap, int n, const float *logits)
{
	for (int end = n - 1; end > 0; end--)
	{
		int32_t		tmp = heap[0];

		heap[0] = heap[end];
		heap[end] = tmp;
		heap_sift_down(heap, end, 0, logits);
	}
}

/* Sorts ids[0..n) into rank order, best first. */
static void
sort_by_rank(int32_t *ids, int n, const float *logits)
{
	for (int i = n / 2 - 1; i >= 0; i--)
		heap_sift_down(ids, n, i, logits);
	heap_sort_in_place(ids, n, logits);
}

static inline bool
is_banned(int32_t id, const int32_t *banned, int n_banned)
{
	for (int i = 0; i < n_banned; i++)
		if (banned[i] == id)
			return true;
	return false;
}

/*
 * The largest logit, NaN ignored (-inf when there is none).  A branch-free max that vectorizes.
 */
WEIGHT_FUNCTION CAI_CLONES
static float
max_logit_of(const float *logits, int n)
{
	WEIGHT_FUNCTION_BODY
	float		lane[8];
	float		best;
	int			i = 0;

	for (int l = 0; l < 8; l++)
		lane[l] = -INFINITY;
	for (; i + 8 <= n; i += 8)
		for (int l = 0; l < 8; l++)
			lane[l] = logits[i + l] > lane[l] ? logits[i + l] : lane[l];
	best = -INFINITY;
	for (; i < n; i++)
		best = logits[i] > best ? logits[i] : best;
	for (int l = 0; l < 8; l++)
		best = lane[l] > best ? lane[l] : best;
	return best;
}

/*
 * The best allowed token: highest logit, lowest id on ties, NaN ranking as -inf.  -1 only when
 * every id is banned.  Usually the lowest id holding the maximum is allowed, found by two fast
 * passes; when it is banned, a full scan consults the banned list for each would-be new best.
 */
static int32_t
argmax_allowed(const float *logits, int n_vocab, const int32_t *banned, int n_banned)
{
	float		max = max_logit_of(logits, n_vocab);
	int32_t		best = -1;
	float		best_value = -INFINITY;

	if (max > -INFINITY)
	{
		for (int32_t i = 0; i < n_vocab; i++)
			if (logits[i] == max)
			{
				if (!is_banned(i, banned, n_banned))
					return i;
				break;
			}
	}
	for (int32_t i = 0; i < n_vocab; i++)
	{
		float		v = logit_key(logits[i]);

		if ((best < 0 || v > best_value) && !is_banned(i, banned, n_banned))
		{
			best = i;
			best_value = v;
		}
	}
	return best;
}

/*
 * Keeps the k best allowed tokens in index[0..*n_out) in rank order, best first, with a bounded
 * heap: O(n_vocab log k) and no full sort.
 */
static void
select_top_k(const float *logits, int n_vocab, int k, const int32_t *banned, int n_banned,
			 int32_t *index, int *n_out)
{
	int			n = 0;

	for (int32_t i = 0; i < n_vocab; i++)
	{
		if (n == k && !ranks_before(logits, i, index[0]))
			continue;
		if (is_banned(i, banned, n_banned))
			continue;
		if (n < k)
		{
			/* grow the heap: sift the new leaf up while it ranks after its parent */
			int			pos = n++;

			index[pos] = i;
			while (pos > 0)
			{
				int			parent = (pos - 1) / 2;

				if (!ranks_before(logits, index[parent], index[pos]))
					break;
				int32_t		tmp = index[parent];

				index[parent] = index[pos];
				index[pos] = tmp;
				pos = parent;
			}
		}
		else
		{
			index[0] = i;
			heap_sift_down(index, n, 0, logits);
		}
	}
	heap_sort_in_place(index, n, logits);
	*n_out = n;
}

/*
 * Picks from candidates ids[0..n) (any fixed order) with weights w[0..n): the first candidate
 * at which the running sum exceeds u * total.  Rounding can leave the target unreached by a hair;
 * then the last candidate of nonzero weight is the answer.
 */
static int32_t
draw_weighted(const int32_t *ids, const float *w, int n, double u)
{
	double		total = 0.0;
	double		target;
	double		running = 0.0;
	int32_t		last_nonzero = ids[0];

	for (int i = 0; i < n; i++)
		total += w[i];
	target = u * total;
	for (int i = 0; i < n; i++)
	{
		if (w[i] <= 0.0f)
			continue;
		running += w[i];
		last_nonzero = ids[i];
		if (running > target)
			return ids[i];
	}
	return last_nonzero;
}

/*
 * Top-k path: index[0..n) holds the k best candidates in rank order.  Softmax over them at the
 * temperature, optional nucleus, then the draw.  prob[j] is candidate j's weight.
 */
static int32_t
sample_candidates(const float *logits, const int32_t *index, int n, float temperature,
				  float top_p, double u, float *prob)
{
	float		max_logit = logit_key(logits[index[0]]);
	double		total = 0.0;
	int			n_keep = n;

	exp_weights_of(prob, logits, index, n, max_logit, temperature);
	for (int j = 0; j < n; j++)
		total += prob[j];
	if (top_p < 1.0f)
	{
		double		need = (double) top_p * total;
		double		running = 0.0;

		for (n_keep = 0; n_keep < n;)
		{
			running += prob[n_keep++];
			if (running >= need)
				break;
		}
	}
	return draw_weighted(index, prob, n_keep, u);
}

/*
 * Sum of weights w[0..n) in a fixed order: four interleaved double accumulators (so the adds do
 * not wait on each other), combined in a fixed order.
 */
static double
sum_weights(const float *w, int n)
{
	double		lane[4] = {0.0, 0.0, 0.0, 0.0};
	int			i = 0;

	for (; i + 4 <= n; i += 4)
	{
		lane[0] += w[i];
		lane[1] += w[i + 1];
		lane[2] += w[i + 2];
		lane[3] += w[i + 3];
	}
	for (; i < n; i++)
		lane[0] += w[i];
	return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

/*
 * Radix histogram for the nucleus.  A positive float's bit pattern grows with its value, so
 * histograms over its bits order weights without comparisons: first by the top 12 bits (sign,
 * exponent, 3 mantissa bits; weights lie in (0, 1], so below 1024), then, inside the bucket where
 * the nucleus ends, by the next 10 bits, then the last 10.
 */
#define RADIX_BUCKETS 1024
#define RADIX_FEW_ENOUGH 64		/* a cut bucket this small is sorted, not narrowed */

static inline uint32_t
weight_bits(float w)
{
	union
	{
		float		f;
		uint32_t	u;
	}			bits;

	bits.f = w;
	return bits.u;
}

/* True when ids[0..n) are already in rank order (ties of equal logits gathered in id order). */
static bool
in_rank_order(const int32_t *ids, int n, const float *logits)
{
	for (int j = 1; j < n; j++)
		if (!ranks_before(logits, ids[j - 1], ids[j]))
			return false;
	return true;
}

/*
 * The bucket where the nucleus ends: walking from the heaviest bucket down, the first whose mass
 * brings *above (the mass of the buckets walked so far) to `need`.  The last nonempty bucket if
 * rounding leaves the sum a hair short.  *above gets the mass of the heavier buckets.
 */
static uint32_t
find_cut_bucket(const double *bucket_mass, double need, double *above)
{
	int			last_nonempty = -1;

	for (int b = RADIX_BUCKETS - 1; b >= 0; b--)
	{
		if (bucket_mass[b] <= 0.0)
			continue;
		if (*above + bucket_mass[b] >= need)
			return (uint32_t) b;
		last_nonempty = b;
		*above += bucket_mass[b];
	}
	/* short by rounding: take the lightest nonempty bucket back out of *above */
	if (last_nonempty >= 0)
	{
		*above -= bucket_mass[last_nonempty];
		return (uint32_t) last_nonempty;
	}
	return 0;
}

/*
 * Temperature (and top-p) over the whole vocabulary, no top-k.  prob[i] is token i's weight
 * exp((l_i - max) / T), 0 for banned tokens.
 *
 * Without top-p the draw walks ids in order.  With top-p the nucleus is the shortest rank-ordered
 * prefix holding p of the mass; sorting the vocabulary to find it would dominate a decode step.
 * Instead radix histograms of the weights' bits (see above) narrow down the bucket where the
 * cumulative mass, taken from the heaviest bucket down, reaches p: every token of a heavier bucket
 * is in the nucleus, and only the cut bucket's tokens (usually a handful) are sorted by rank to
 * place the cut.  The draw then walks the nucleus in id order.  Cost: two to four passes over the
 * vocabulary, whatever the distribution's shape (many tied logits included).
 */
static int32_t
sample_full_vocabulary(const float *logits, int n_vocab, const int32_t *banned, int n_banned,
					   float max_logit, float temperature, float top_p, double u,
					   cai_sampler_scratch *scratch)
{
	float	   *prob = scratch->prob;
	int32_t    *index = scratch->index;
	double		lane_mass[4][RADIX_BUCKETS];	/* 32 KiB of stack */
	double		bucket_mass[RADIX_BUCKETS];
	double		total = 0.0;
	double		need = 0.0;
	double		above = 0.0;
	double		nucleus_mass;
	double		target;
	double		running = 0.0;
	uint32_t	prefix;			/* the cut bucket: weights with bits >> shift == prefix */
	int			shift;
	int			n_cut = 0;
	int32_t		cut_token;
	int32_t		last_taken = -1;

	exp_weights_all(prob, logits, n_vocab, max_logit, temperature);
	for (int b = 0; b < n_banned; b++)
		if (banned[b] >= 0 && banned[b] < n_vocab)
			prob[banned[b]] = 0.0f;

	if (!(top_p < 1.0f))
	{
		total = sum_weights(prob, n_vocab);
		target = u * total;
		for (int32_t i = 0; i < n_vocab; i++)
		{
			if (prob[i] <= 0.0f)
				continue;
			running += prob[i];
			last_taken = i;
			if (running > target)
				return i;
		}
		return last_taken;
	}

	/*
	 * Level 1: the top 12 bits of every weight.  Neighbouring tokens often share a bucket, and a
	 * single histogram would then serialize on that bucket's read-add-write; four interleaved
	 * histograms (token i into the (i % 4)-th), summed in a fixed order, do not.
	 */
	memset(lane_mass, 0, sizeof(lane_mass));
	for (int32_t i = 0; i < n_vocab; i++)
		if (prob[i] > 0.0f)
			lane_mass[i & 3][weight_bits(prob[i]) >> 20] += prob[i];
	for (int b = 0; b < RADIX_BUCKETS; b++)
		bucket_mass[b] = (lane_mass[0][b] + lane_mass[1][b]) + (lane_mass[2][b] + lane_mass[3][b]);
	for (int b = RADIX_BUCKETS - 1; b >= 0; b--)
		total += bucket_mass[b];
	need = (double) top_p * total;
	prefix = find_cut_bucket(bucket_mass, need, &above);
	shift = 20;
	for (int32_t i = 0; i < n_vocab; i++)
		if (prob[i] > 0.0f && (weight_bits(prob[i]) >> shift) == prefix)
			index[n_cut++] = i;
	if (n_cut == 0)				/* not reached: the argmax weighs 1 */
		return argmax_allowed(logits, n_vocab, banned, n_banned);

	/*
	 * Levels 2 and 3 narrow a large cut bucket by the next 10 bits each, unless it is already in
	 * rank order (tied logits, gathered in id order), which needs no sort at all.
	 */
	while (n_cut > RADIX_FEW_ENOUGH && shift > 0 && !in_rank_order(index, n_cut, logits))
	{
		int			level_shift = shift - 10;
		uint32_t	cut;
		int			kept = 0;

		memset(lane_mass, 0, sizeof(lane_mass));
		for (int j = 0; j < n_cut; j++)
			lane_mass[j & 3][(weight_bits(prob[index[j]]) >> level_shift) & (RADIX_BUCKETS - 1)] +=
				prob[index[j]];
		for (int b = 0; b < RADIX_BUCKETS; b++)
			bucket_mass[b] = (lane_mass[0][b] + lane_mass[1][b]) +
				(lane_mass[2][b] + lane_mass[3][b]);
		cut = find_cut_bucket(bucket_mass, need, &above);
		for (int j = 0; j < n_cut; j++)
			if (((weight_bits(prob[index[j]]) >> level_shift) & (RADIX_BUCKETS - 1)) == cut)
				index[kept++] = index[j];
		n_cut = kept;
		prefix = (prefix << 10) | cut;
		shift = level_shift;
	}
	if (!in_rank_order(index, n_cut, logits))
		sort_by_rank(index, n_cut, logits);
	nucleus_mass = above;
	cut_token = index[n_cut - 1];
	for (int j = 0; j < n_cut; j++)
	{
		nucleus_mass += prob[index[j]];
		if (nucleus_mass >= need)
		{
			cut_token = index[j];
			break;
		}
	}

	/* the draw: nucleus tokens in id order */
	target = u * nucleus_mass;
	for (int32_t i = 0; i < n_vocab; i++)
	{
		uint32_t	key;

		if (prob[i] <= 0.0f)
			continue;
		key = weight_bits(prob[i]) >> shift;
		if (key < prefix || (key == prefix && ranks_before(logits, cut_token, i)))
			continue;
		running += prob[i];
		last_taken = i;
		if (running > target)
			return i;
	}
	return last_taken;
}

/*
 * Picks the next token; see sampler.h.  Returns -1 only when no token is allowed (n_vocab <= 0
 * or every id banned).  With temperature > 0 the RNG advances exactly once, whatever path is
 * taken, so that a request's random stream does not depend on its logits.
 */
int32_t
cai_sample(const cai_sampling_params *p, cai_rng *rng, const float *logits, int n_vocab,
		   const int32_t *banned, int n_banned, cai_sampler_scratch *scratch)
{
	int32_t		best;
	double		u;
	float		max_logit;
	float		temperature = p->temperature;
	float		top_p = p->top_p;
	int			top_k = p->top_k;

	if (n_vocab <= 0 || logits == NULL)
		return -1;
	if (banned == NULL)
		n_banned = 0;
	best = argmax_allowed(logits, n_vocab, banned, n_banned);
	if (!(temperature > 0.0f))	/* 0, negative or NaN: greedy */
		return best;

	u = cai_rng_uniform(rng);
	if (best < 0 || scratch == NULL || scratch->n_vocab < n_vocab)
		return best;
	max_logit = logit_key(logits[best]);
	/* nothing to weigh: all allowed logits -inf, or +inf dominates everything */
	if (isinf(max_logit))
		return best;
	if (top_k == 1 || top_p <= 0.0f)
		return best;

	if (top_k > 0 && top_k < n_vocab - n_banned)
	{
		int			n;

		select_top_k(logits, n_vocab, top_k, banned, n_banned, scratch->index, &n);
		return sample_candidates(logits, scratch->index, n, temperature, top_p, u, scratch->prob);
	}
	return sample_full_vocabulary(logits, n_vocab, banned, n_banned, max_logit, temperature,
								  top_p, u, scratch);
}

int32_t
cai_sample_masked(const cai_sampling_params *p, cai_rng *rng, const float *logits, int n_vocab,
				  const uint64_t *allowed, const int32_t *banned, int n_banned,
				  cai_sampler_scratch *scratch)
{
	float	   *masked;

	if (allowed == NULL)
		return cai_sample(p, rng, logits, n_vocab, banned, n_banned, scratch);
	if (scratch == NULL || scratch->n_vocab < n_vocab || n_vocab <= 0 || logits == NULL)
		return -1;
	masked = scratch->masked;
	/* a word at a time: grammars allow long runs of the vocabulary or almost none of it */
	for (int w = 0; w * 64 < n_vocab; w++)
	{
		int			base = w * 64;
		int			n = n_vocab - base < 64 ? n_vocab - base : 64;
		uint64_t	bits = allowed[w];

		if (bits == 0)
			for (int i = 0; i < n; i++)
				masked[base + i] = -INFINITY;
		else if (bits == ~UINT64_C(0))
			memcpy(masked + base, logits + base, sizeof(float) * (size_t) n);
		else
			for (int i = 0; i < n; i++)
				masked[base + i] = (bits >> i) & 1 ? logits[base + i] : -INFINITY;
	}
	return cai_sample(p, rng, masked, n_vocab, banned, n_banned, scratch);
}

/* ---------------------------------------------------------------------------------------------
 * Penalties, logit_bias, min_p, logprobs
 * ------------------------------------------------------------------------------------------- */

/*
 * A zeroed cai_sampling_params (a caller that did not call cai_sampling_params_default) means
 * no repetition penalty, not a division by zero: only a positive value other than 1 applies.
 */
static inline bool
repetition_active(const cai_sampling_params *p)
{
	return p->repetition_penalty > 0.0f && p->repetition_penalty != 1.0f;
}

bool
cai_sampling_adjusts(const cai_sampling_params *p)
{
	return p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f ||
		repetition_active(p) || p->min_p > 0.0f || p->n_logit_bias > 0 || p->logprobs;
}

/* logits -> out with the grammar's mask and the banned ids at -inf */
static void
copy_allowed(const float *logits, int n_vocab, const uint64_t *allowed, const int32_t *banned,
			 int n_banned, float *out)
{
	if (allowed == NULL)
		memcpy(out, logits, sizeof(float) * (size_t) n_vocab);
	else
		for (int i = 0; i < n_vocab; i++)
			out[i] = (allowed[i / 64] >> (i % 64)) & 1 ? logits[i] : -INFINITY;
	for (int b = 0; b < n_banned; b++)
		if (banned[b] >= 0 && banned[b] < n_vocab)
			out[banned[b]] = -INFINITY;
}

/*
 * The penalties that look at earlier tokens.  count[] marks each token once (so that a token
 * seen five times is penalized once by repetition_penalty, and once with its count by the
 * others) and is cleared again while applying, so the cost is the history's length, never the
 * vocabulary's.
 */
static void
apply_history_penalties(const cai_sampling_params *p, int n_vocab, const int32_t *history,
						int n_history, int n_prompt, float *out, int32_t *count)
{
	if (repetition_active(p))
	{
		int			from = n_history > CAI_REPEAT_LAST_N ? n_history - CAI_REPEAT_LAST_N : 0;
		float		rp = p->repetition_penalty;

		for (int i = from; i < n_history; i++)
		{
			int32_t		t = history[i];

			if (t < 0 || t >= n_vocab || count[t]++ > 0)
				continue;
			/* llama.cpp's rule: a positive logit shrinks, a negative one grows more negative */
			out[t] = out[t] > 0.0f ? out[t] / rp : out[t] * rp;
		}
		for (int i = from; i < n_history; i++)
			if (history[i] >= 0 && history[i] < n_vocab)
				count[history[i]] = 0;
	}
	if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f)
	{
		int			from = n_prompt < 0 ? 0 : n_prompt;

		for (int i = from; i < n_history; i++)
			if (history[i] >= 0 && history[i] < n_vocab)
				count[history[i]]++;
		for (int i = from; i < n_history; i++)
		{
			int32_t		t = history[i];

			if (t < 0 || t >= n_vocab || count[t] == 0)
				continue;
			/* OpenAI's definition: presence once, frequency per occurrence in the reply */
			out[t] -= p->presence_penalty + p->frequency_penalty * (float) count[t];
			count[t] = 0;
		}
	}
}

void
cai_sampler_adjust(const cai_sampling_params *p, const float *logits, int n_vocab,
				   const uint64_t *allowed, const int32_t *banned, int n_banned,
				   const int32_t *history, int n_history, int n_prompt, float *out,
				   int32_t *count)
{
	copy_allowed(logits, n_vocab, allowed, banned, n_banned, out);
	if (history != NULL && n_history > 0)
		apply_history_penalties(p, n_vocab, history, n_history, n_prompt, out, count);
	for (int b = 0; b < p->n_logit_bias; b++)
	{
		int32_t		t = p->logit_bias[b].token;

		if (t < 0 || t >= n_vocab)
			continue;
		/* OpenAI's -100 means "never", not "rarely": a large logit must not overcome it */
		if (p->logit_bias[b].bias <= (float) -CAI_LOGIT_BIAS_MAX)
			out[t] = -INFINITY;
		else
			out[t] += p->logit_bias[b].bias;
	}
	if (p->min_p > 0.0f)
	{
		/* p_i < min_p * p_max  <=>  l_i < l_max + ln(min_p), at temperature 1 (llama.cpp's) */
		float		max = max_logit_of(out, n_vocab);
		float		threshold = max + logf(p->min_p);

		if (max > -INFINITY && max < INFINITY)
			for (int i = 0; i < n_vocab; i++)
				if (!(out[i] >= threshold))
					out[i] = -INFINITY;
	}
}

/* True when (value a, id a) ranks before (value b, id b): higher, then lower id. */
static inline bool
logprob_before(float va, int32_t a, float vb, int32_t b)
{
	return va > vb || (va == vb && a < b);
}

void
cai_sampler_logprobs(const float *logits, int n_vocab, float temperature, int32_t token,
					 int top_n, cai_token_logprobs *out)
{
	double		inv_t = temperature > 0.0f ? 1.0 / (double) temperature : 1.0;
	float		max = max_logit_of(logits, n_vocab);
	double		sum = 0.0;
	double		log_z;

	memset(out, 0, sizeof(*out));
	if (top_n > CAI_TOP_LOGPROBS_MAX)
		top_n = CAI_TOP_LOGPROBS_MAX;
	if (!(max > -INFINITY) || max == INFINITY)
	{
		out->logprob = token >= 0 && token < n_vocab && logits[token] == max ? 0.0f : -INFINITY;
		return;
	}
	for (int i = 0; i < n_vocab; i++)
		if (logits[i] > -INFINITY)
			sum += exp(((double) logits[i] - max) * inv_t);
	log_z = log(sum);
	out->logprob = token >= 0 && token < n_vocab && logits[token] > -INFINITY ?
		(float) (((double) logits[token] - max) * inv_t - log_z) : -INFINITY;

	/* insertion into a sorted list of at most 20: a token that cannot enter costs a compare */
	for (int32_t i = 0; i < n_vocab && top_n > 0; i++)
	{
		float		v = logits[i];
		int			pos;

		if (!(v > -INFINITY))
			continue;
		if (out->n_top == top_n &&
			!logprob_before(v, i, logits[out->top_token[top_n - 1]], out->top_token[top_n - 1]))
			continue;
		pos = out->n_top < top_n ? out->n_top++ : top_n - 1;
		while (pos > 0 && logprob_before(v, i, logits[out->top_token[pos - 1]],
										 out->top_token[pos - 1]))
		{
			out->top_token[pos] = out->top_token[pos - 1];
			pos--;
		}
		out->top_token[pos] = i;
	}
	for (int j = 0; j < out->n_top; j++)
		out->top_logprob[j] =
			(float) (((double) logits[out->top_token[j]] - max) * inv_t - log_z);
}

int32_t
cai_sample_adjusted(const cai_sampling_params *p, cai_rng *rng, const float *logits, int n_vocab,
					const uint64_t *allowed, const int32_t *banned, int n_banned,
					const int32_t *history, int n_history, int n_prompt,
					cai_sampler_scratch *scratch, cai_token_logprobs *lp)
{
	float	   *adjusted;
	int32_t		token;

	if (!cai_sampling_adjusts(p))
		return cai_sample_masked(p, rng, logits, n_vocab, allowed, banned, n_banned, scratch);
	if (scratch == NULL || scratch->n_vocab < n_vocab || n_vocab <= 0 || logits == NULL)
		return -1;
	adjusted = scratch->masked;
	cai_sampler_adjust(p, logits, n_vocab, allowed, banned, banned ? n_banned : 0, history,
					   n_history, n_prompt, adjusted, scratch->count);
	token = cai_sample(p, rng, adjusted, n_vocab, banned, n_banned, scratch);
	if (p->logprobs && lp != NULL)
		cai_sampler_logprobs(adjusted, n_vocab, p->temperature, token, p->top_logprobs, lp);
	return token;
}
