/*
 * test_attention.c — the CPU attention kernel (cpu/attention.c) on its own, over a KV pool of
 * random int8 keys and values: against exact attention in double precision, bit-identical on
 * every instruction-set path, each segment's softmax maximum exactly the largest score and its
 * value sums exactly the int8 value rule, and invariant to thread counts, batch compositions
 * and how a prefill is cut into steps, whether rows over the same blocks (samples of one prompt)
 * share a tile or not, for head sizes that take each value-pass path (32: no
 * 64-dimension vectors and no AMX; 64, 128, 256: both), contexts across many KV blocks, global
 * and windowed, with int8 keys and with two-digit keys (kv.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/attention.h"
#include "cpu/attention_sharing.h"
#include "cpu/gemm.h"
#include "cpu/ops.h"
#include "threadpool.h"
#include "kv.h"
#include "test.h"

#define N_HEADS 6
#define N_KV 2
#define GROUP (N_HEADS / N_KV)
#define MAX_CONTEXT 1400
#define MAX_STEP 256

typedef struct fixture
{
	int			hd;
	cai_kv_layout L;
	cai_kv_pool *pool;
	int			n_seqs;
	int			blocks_per_seq;
	int32_t    *tables;			/* [n_seqs][blocks_per_seq] */
	float	   *q;				/* [n_seqs][MAX_CONTEXT][N_HEADS * hd]: a query per position */
} fixture;

static float
uniform(uint64_t *s, float lo, float hi)
{
	return lo + (hi - lo) * (float) ((test_next_u64(s) >> 40) * (1.0 / 16777216.0));
}

static bool
fixture_open(fixture *f, int hd, int n_seqs, int key_digits)
{
	uint64_t	rng = 77 + (uint64_t) hd;
	size_t		part = (size_t) CAI_KV_BLOCK_TOKENS * cai_kv_token_layer_bytes(N_KV, hd, key_digits);
	cai_error	err;
	size_t		qn;

	memset(f, 0, sizeof(*f));
	f->hd = hd;
	f->L.n_kv_layers = 1;
	f->L.n_kv_heads = N_KV;
	f->L.head_dim = hd;
	f->L.key_digits = key_digits;
	f->L.layer_bytes = (part + 63) & ~(size_t) 63;
	f->L.block_bytes = f->L.layer_bytes;
	f->n_seqs = n_seqs;
	f->blocks_per_seq = (MAX_CONTEXT + CAI_KV_BLOCK_TOKENS - 1) / CAI_KV_BLOCK_TOKENS;
	if (cai_kv_pool_create(&f->L, n_seqs * f->blocks_per_seq, &f->pool, &err) != CAI_OK)
		return false;
	f->tables = malloc(sizeof(int32_t) * n_seqs * f->blocks_per_seq);
	qn = (size_t) n_seqs * MAX_CONTEXT * N_HEADS * hd;
	f->q = malloc(qn * sizeof(float));
	if (!f->tables || !f->q)
		return false;
	/* blocks interleaved across sequences, as a busy pool hands them out */
	for (int b = 0; b < f->blocks_per_seq; b++)
		for (int s = 0; s < n_seqs; s++)
			f->tables[s * f->blocks_per_seq + b] = cai_kv_block_alloc(f->pool);
	for (int blk = 0; blk < n_seqs * f->blocks_per_seq; blk++)
	{
		uint8_t    *p = cai_kv_block_layer(f->pool, blk, 0);
		float	   *ks = cai_kv_key_scales(&f->L, p);
		float	   *vs = cai_kv_value_scales(&f->L, p);

		for (size_t i = 0; i < (size_t) 2 * CAI_KV_BLOCK_TOKENS * N_KV * hd; i++)
			((int8_t *) p)[i] = (int8_t) ((int) (test_next_u64(&rng) % 255) - 127);
		if (key_digits == 2)
			for (size_t i = 0; i < (size_t) CAI_KV_BLOCK_TOKENS * N_KV * hd; i++)
				cai_kv_key_second_digits(&f->L, p)[i] = (int8_t) ((int) (test_next_u64(&rng) % 255) - 127);
		for (int i = 0; i < CAI_KV_BLOCK_TOKENS * N_KV; i++)
		{
			/*
			 * keys scaled so that the softmax is far from uniform, values per token; a
			 * two-digit key's scale is the unit of its second digit
			 */
			ks[i] = uniform(&rng, 0.1f, 0.4f) / sqrtf((float) hd)
				/ (key_digits == 2 ? (float) CAI_KV_KEY_DIGIT_BASE : 1.0f);
			vs[i] = uniform(&rng, 0.005f, 0.02f);
		}
	}
	for (size_t i = 0; i < qn; i++)
		f->q[i] = uniform(&rng, -2.0f, 2.0f);
	return true;
}

static void
fixture_close(fixture *f)
{
	cai_kv_pool_free(f->pool);
	free(f->tables);
	free(f->q);
}

/* Element d of KV head kvh's key in slot `slot` of layer part p, in units of its scale. */
static int32_t
key_digits_at(const fixture *f, uint8_t *p, int slot, int kvh, int d)
{
	size_t		at = ((size_t) slot * N_KV + kvh) * f->hd + d;
	int32_t		k = cai_kv_keys(&f->L, p)[at];

	if (f->L.key_digits == 2)
		return CAI_KV_KEY_DIGIT_BASE * k + cai_kv_key_second_digits(&f->L, p)[at];
	return k;
}

/* Exact attention in double of query head h of sequence s at pos over [lo, pos]. */
static void
exact_row(const fixture *f, int s, int pos, int h, int window, double scale, double *out)
{
	const int	hd = f->hd;
	const int32_t *table = f->tables + (size_t) s * f->blocks_per_seq;
	const float *qrow = f->q + ((size_t) s * MAX_CONTEXT + pos) * N_HEADS * hd + (size_t) h * hd;
	int			kvh = h / GROUP;
	int			lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
	double	   *score = malloc(sizeof(double) * (pos - lo + 1));
	double		m = -INFINITY,
				total = 0.0;

	for (int j = lo; j <= pos; j++)
	{
		uint8_t    *p = cai_kv_block_layer(f->pool, table[j / CAI_KV_BLOCK_TOKENS], 0);
		int			slot = j % CAI_KV_BLOCK_TOKENS;
		double		ks = cai_kv_key_scales(&f->L, p)[slot * N_KV + kvh];
		double		dot = 0.0;

		for (int d = 0; d < hd; d++)
			dot += (double) qrow[d] * key_digits_at(f, p, slot, kvh, d) * ks;
		score[j - lo] = dot * scale;
		m = score[j - lo] > m ? score[j - lo] : m;
	}
	for (int j = lo; j <= pos; j++)
	{
		score[j - lo] = exp(score[j - lo] - m);
		total += score[j - lo];
	}
	for (int d = 0; d < hd; d++)
		out[d] = 0.0;
	for (int j = lo; j <= pos; j++)
	{
		uint8_t    *p = cai_kv_block_layer(f->pool, table[j / CAI_KV_BLOCK_TOKENS], 0);
		int			slot = j % CAI_KV_BLOCK_TOKENS;
		const int8_t *v = cai_kv_values(&f->L, p) + ((size_t) slot * N_KV + kvh) * hd;
		double		c = score[j - lo] / total * cai_kv_value_scales(&f->L, p)[slot * N_KV + kvh];

		for (int d = 0; d < hd; d++)
			out[d] += c * v[d];
	}
	free(score);
}

#define MAX_STEP_SEQS 10

/*
 * A step: batch sequence i is fixture sequence seq[i] taking positions [first[i], +len[i]),
 * over its fixture table or, where tables[i] is set, that one (a fork's).
 */
typedef struct step
{
	int			n_seqs;
	int			seq[MAX_STEP_SEQS];
	int			first[MAX_STEP_SEQS];
	int			len[MAX_STEP_SEQS];
	const int32_t *tables[MAX_STEP_SEQS];
} step;

/* The batch layout of a step (arrays of MAX_STEP entries); returns its tokens. */
static int
step_layout(const fixture *f, const step *st, int32_t *pos, int32_t *tseq, int32_t *start,
			int32_t *len, const int32_t **tables, cai_batch_layout *bl)
{
	int			T = 0;

	for (int s = 0; s < st->n_seqs; s++)
	{
		start[s] = T;
		len[s] = st->len[s];
		tables[s] = st->tables[s] ? st->tables[s]
			: f->tables + (size_t) st->seq[s] * f->blocks_per_seq;
		for (int i = 0; i < st->len[s]; i++, T++)
		{
			pos[T] = st->first[s] + i;
			tseq[T] = s;
		}
	}
	bl->n_tokens = T;
	bl->n_seqs = st->n_seqs;
	bl->token_pos = pos;
	bl->token_seq = tseq;
	bl->seq_start = start;
	bl->seq_len = len;
	bl->block_tables = tables;
	return T;
}

/* Runs the step's attention on `threads` threads; out: [tokens][N_HEADS * hd]. */
static bool
run_step(const fixture *f, const step *st, int threads, int window, float *out, int *n_tokens)
{
	const int	hd = f->hd;
	cai_threadpool *pool = cai_threadpool_create(threads);
	cai_backend_limits limits = {.max_tokens = MAX_STEP, .max_context = MAX_CONTEXT,
	.max_width = N_HEADS * hd, .n_heads = N_HEADS, .n_kv_heads = N_KV, .head_dim = hd};
	cai_attn_params ap = {.n_heads = N_HEADS, .n_kv_heads = N_KV, .head_dim = hd,
	.window = window, .kv_layer = 0, .scale = 1.0f / sqrtf((float) hd)};
	cai_backend *be = NULL;
	cai_error	err;
	int32_t		pos[MAX_STEP],
				tseq[MAX_STEP],
				start[MAX_STEP_SEQS],
				len[MAX_STEP_SEQS];
	const int32_t *tables[MAX_STEP_SEQS];
	float	   *q;
	int			T;
	cai_batch_layout bl;

	if (!pool || cai_backend_cpu_create(pool, &limits, &be, &err) != CAI_OK)
	{
		cai_threadpool_free(pool);
		return false;
	}
	T = step_layout(f, st, pos, tseq, start, len, tables, &bl);
	q = malloc(sizeof(float) * T * N_HEADS * hd);
	for (int t = 0; t < T; t++)
		memcpy(q + (size_t) t * N_HEADS * hd,
			   f->q + ((size_t) st->seq[tseq[t]] * MAX_CONTEXT + pos[t]) * N_HEADS * hd,
			   sizeof(float) * N_HEADS * hd);
	memset(out, 0xff, sizeof(float) * T * N_HEADS * hd);	/* NaN: every element is written */
	be->ops->attention(be, &ap, &bl, q, N_HEADS * hd, f->pool, NULL, out, N_HEADS * hd);
	*n_tokens = T;
	free(q);
	cai_backend_free(be);
	cai_threadpool_free(pool);
	return true;
}

/* Every instruction-set path, the ones this machine lacks skipped by cai_cpu_force_isa. */
static const char *const paths[] = {"avx512-amx", "avx512-vnni", "avx-vnni", "avx2", "generic"};

static const int head_sizes[] = {32, 64, 128, 256};
static const int windows[] = {0, 100, 700};

#define N_OF(a) ((int) (sizeof(a) / sizeof((a)[0])))

/* Each head size with int8 keys, then each with two-digit keys. */
#define N_CONFIGS (2 * N_OF(head_sizes))

static int
config_key_digits(int c)
{
	return c < N_OF(head_sizes) ? 1 : 2;
}

/*
 * Within a small error of exact attention: the int8 path quantizes each query to 8 bits and
 * each segment's weights to 14, so errors are a fraction of a percent of the output's size;
 * a value landing in the wrong dimension or block would be off by the output's whole size.
 */
TEST(attention_close_to_exact)
{
	for (int c = 0; c < N_CONFIGS; c++)
	{
		fixture		f;
		int			hd = head_sizes[c % N_OF(head_sizes)];
		int			digits = config_key_digits(c);
		float	   *out = malloc(sizeof(float) * MAX_STEP * N_HEADS * hd);
		double	   *ref = malloc(sizeof(double) * hd);
		double		worst = 0.0;

		CHECK(fixture_open(&f, hd, 1, digits));
		for (int w = 0; w < N_OF(windows); w++)
		{
			/* a prefill chunk of 70 tokens deep in the context, then decodes */
			step		chunk = {.n_seqs = 1, .seq = {0}, .first = {1100}, .len = {70}};
			static const int decode_at[] = {0, 7, 15, 16, 333, 1399};
			int			T;

			CHECK(run_step(&f, &chunk, 2, windows[w], out, &T));
			for (int t = 0; t < T; t += 23)
				for (int h = 0; h < N_HEADS; h++)
				{
					double		norm = 0.0,
								err = 0.0;

					exact_row(&f, 0, 1100 + t, h, windows[w], 1.0 / sqrt((double) hd), ref);
					for (int d = 0; d < hd; d++)
					{
						double		e = fabs(out[((size_t) t * N_HEADS + h) * hd + d] - ref[d]);

						norm = fabs(ref[d]) > norm ? fabs(ref[d]) : norm;
						err = e > err ? e : err;
					}
					worst = err / norm > worst ? err / norm : worst;
				}
			for (int i = 0; i < N_OF(decode_at); i++)
			{
				step		one = {.n_seqs = 1, .seq = {0}, .first = {decode_at[i]}, .len = {1}};

				CHECK(run_step(&f, &one, 1, windows[w], out, &T));
				for (int h = 0; h < N_HEADS; h++)
				{
					double		norm = 0.0,
								err = 0.0;

					exact_row(&f, 0, decode_at[i], h, windows[w], 1.0 / sqrt((double) hd), ref);
					for (int d = 0; d < hd; d++)
					{
						double		e = fabs(out[(size_t) h * hd + d] - ref[d]);

						norm = fabs(ref[d]) > norm ? fabs(ref[d]) : norm;
						err = e > err ? e : err;
					}
					worst = err / norm > worst ? err / norm : worst;
				}
			}
		}
		CHECK_MSG(worst < 0.06, "head size %d, %d-digit keys: largest error %.4f of the output's "
				  "size", hd, digits, worst);
		free(out);
		free(ref);
		fixture_close(&f);
	}
}

/* The same bits on every instruction-set path the machine has (at least two run here). */
TEST(attention_isa_paths_identical)
{
	char		original[32];

	snprintf(original, sizeof(original), "%s", cai_cpu_isa());
	for (int c = 0; c < N_CONFIGS; c++)
	{
		fixture		f;
		int			hd = head_sizes[c % N_OF(head_sizes)];
		int			digits = config_key_digits(c);
		size_t		n = (size_t) MAX_STEP * N_HEADS * hd;
		float	   *ref = malloc(sizeof(float) * n);
		float	   *got = malloc(sizeof(float) * n);
		step		st = {.n_seqs = 3, .seq = {0, 1, 0}, .first = {1300, 650, 17}, .len = {1, 90, 40}};

		CHECK(fixture_open(&f, hd, 2, digits));
		for (int w = 0; w < N_OF(windows); w++)
		{
			int			tested = 0,
						T;

			for (int p = 0; p < N_OF(paths); p++)
			{
				if (!cai_cpu_force_isa(paths[p]))
					continue;
				CHECK(run_step(&f, &st, 2, windows[w], tested ? got : ref, &T));
				if (tested)
					CHECK_MSG(memcmp(ref, got, sizeof(float) * T * N_HEADS * hd) == 0,
							  "head size %d window %d: the %s path differs", hd, windows[w],
							  paths[p]);
				tested++;
			}
			CHECK(tested >= 2);
		}
		cai_cpu_force_isa(original);
		free(ref);
		free(got);
		fixture_close(&f);
	}
}

/*
 * A token's rows are the same bits whatever else runs: decode alone on 1-3 threads, decode in a
 * batch of four, and the same position as the last row of a prefill chunk, in the middle of a
 * chunk cut elsewhere, or the last row of a five-token tile split over the threads.
 */
TEST(attention_invariant_to_threads_batches_and_cuts)
{
	for (int c = 0; c < N_CONFIGS; c++)
	{
		fixture		f;
		int			hd = head_sizes[c % N_OF(head_sizes)];
		int			digits = config_key_digits(c);
		size_t		row = (size_t) N_HEADS * hd;
		float	   *alone = malloc(sizeof(float) * MAX_STEP * row);
		float	   *other = malloc(sizeof(float) * MAX_STEP * row);

		CHECK(fixture_open(&f, hd, 4, digits));
		for (int w = 0; w < N_OF(windows); w++)
		{
			step		base = {.n_seqs = 1, .seq = {0}, .first = {1299}, .len = {1}};
			step		batched = {.n_seqs = 4, .seq = {2, 0, 1, 3}, .first = {40, 1299, 900, 7},
			.len = {1, 1, 3, 1}};
			step		prefill = {.n_seqs = 1, .seq = {0}, .first = {1200}, .len = {100}};
			step		cut = {.n_seqs = 2, .seq = {1, 0}, .first = {3, 1250}, .len = {60, 77}};
			/* a short follow-up: one tile per KV head, split over the threads' segments */
			step		follow_up = {.n_seqs = 1, .seq = {0}, .first = {1295}, .len = {5}};
			int			T;

			CHECK(run_step(&f, &base, 1, windows[w], alone, &T));
			for (int threads = 1; threads <= 3; threads++)
			{
				CHECK(run_step(&f, &base, threads, windows[w], other, &T));
				CHECK_MSG(memcmp(alone, other, sizeof(float) * row) == 0,
						  "hd %d window %d: decode alone on %d threads", hd, windows[w], threads);
				CHECK(run_step(&f, &batched, threads, windows[w], other, &T));
				CHECK_MSG(memcmp(alone, other + row, sizeof(float) * row) == 0,
						  "hd %d window %d: decode in a batch on %d threads", hd, windows[w],
						  threads);
				CHECK(run_step(&f, &prefill, threads, windows[w], other, &T));
				CHECK_MSG(memcmp(alone, other + 99 * row, sizeof(float) * row) == 0,
						  "hd %d window %d: a prefill's last row on %d threads", hd, windows[w],
						  threads);
				CHECK(run_step(&f, &cut, threads, windows[w], other, &T));
				CHECK_MSG(memcmp(alone, other + (60 + 49) * row, sizeof(float) * row) == 0,
						  "hd %d window %d: a row inside another cut of the prefill, %d threads",
						  hd, windows[w], threads);
				CHECK(run_step(&f, &follow_up, threads, windows[w], other, &T));
				CHECK_MSG(memcmp(alone, other + 4 * row, sizeof(float) * row) == 0,
						  "hd %d window %d: the last row of a split five-token tile, %d threads",
						  hd, windows[w], threads);
			}
		}
		free(alone);
		free(other);
		fixture_close(&f);
	}
}

/*
 * Forks of fixture sequence 0: sample i's table holds sequence 0's blocks below fork_block and
 * fixture sequence i's from there on (its own, as copy-on-write gives a sample).
 */
static void
fork_tables(const fixture *f, int n, int fork_block, int32_t *forks)
{
	for (int i = 0; i < n; i++)
		for (int b = 0; b < f->blocks_per_seq; b++)
			forks[(size_t) i * f->blocks_per_seq + b] =
				f->tables[(size_t) (b < fork_block ? 0 : i) * f->blocks_per_seq + b];
}

/*
 * Rows over the same blocks: eight samples forked from one prompt (fork mid-segment, on a
 * segment's edge, and inside the first segment), decoding at one position or, without a window,
 * at several, beside an unrelated decode and a prefill chunk; the groups the planner finds are
 * the ones expected, and every row is the bits it has alone, on 1-3 threads and every
 * instruction-set path (a shared tile of 24 rows scores on AMX where a lone row cannot, and the
 * segment a fork lies in mixes the shared blocks with each sample's own).
 */
TEST(attention_shared_blocks_same_bits)
{
	static const int forks[] = {62, 48, 5};	/* positions 992, 768 (a segment's edge), 80 */
	char		original[32];

	snprintf(original, sizeof(original), "%s", cai_cpu_isa());
	for (int c = 0; c < N_CONFIGS; c++)
	{
		fixture		f;
		int			hd = head_sizes[c % N_OF(head_sizes)];
		int			digits = config_key_digits(c);
		size_t		row = (size_t) N_HEADS * hd;
		float	   *alone = malloc(sizeof(float) * MAX_STEP * row);
		float	   *got = malloc(sizeof(float) * MAX_STEP * row);
		int32_t    *tables;

		CHECK(fixture_open(&f, hd, 9, digits));
		tables = malloc(sizeof(int32_t) * 8 * f.blocks_per_seq);
		for (int fk = 0; fk < N_OF(forks); fk++)
		{
			fork_tables(&f, 8, forks[fk], tables);
			for (int w = 0; w < N_OF(windows); w++)
			{
				/* samples 0-7 (batch 1, 2, 4-9), an unrelated decode and a prefill chunk */
				step		st = {.n_seqs = 10, .seq = {8, 0, 1, 8, 2, 3, 4, 5, 6, 7},
				.len = {1, 1, 1, 40, 1, 1, 1, 1, 1, 1}};
				int32_t		pos[MAX_STEP],
							tseq[MAX_STEP],
							start[MAX_STEP_SEQS],
							len[MAX_STEP_SEQS];
				const int32_t *tb[MAX_STEP_SEQS];
				cai_attn_params ap = {.n_heads = N_HEADS, .n_kv_heads = N_KV, .head_dim = hd,
				.window = windows[w]};
				cai_batch_layout bl;
				cai_attn_share_group groups[MAX_STEP_SEQS / 2];
				int			members[MAX_STEP_SEQS],
							taken[MAX_STEP_SEQS],
							n_groups,
							T;

				for (int i = 0; i < 10; i++)
				{
					int			sample = st.seq[i];

					/* one position with a window; without, samples 4-7 a few tokens further */
					st.first[i] = 1290 + (windows[w] == 0 && sample >= 4 ? sample : 0);
					if (i != 0 && i != 3)
						st.tables[i] = tables + (size_t) sample * f.blocks_per_seq;
				}
				st.first[0] = 700;
				st.first[3] = 1000;
				T = step_layout(&f, &st, pos, tseq, start, len, tb, &bl);
				n_groups = cai_attention_share_groups(&ap, &bl,
													  cai_attention_shared_max_seqs(GROUP),
													  members, taken, groups);
				/* the samples share the blocks from their rows' first below the fork */
				{
					int			lo = windows[w] > 0 ? 1290 - windows[w] + 1 : 0;
					int			fork = forks[fk] * CAI_KV_BLOCK_TOKENS;
					int			seg_end = (fork + CAI_ATTN_SEGMENT_TOKENS - 1) /
						CAI_ATTN_SEGMENT_TOKENS;

					CHECK_MSG(n_groups == (forks[fk] > lo / CAI_KV_BLOCK_TOKENS) &&
							  (n_groups == 0 || (groups[0].n == 8 && groups[0].own_from == fork &&
												 groups[0].seg_begin == lo / CAI_ATTN_SEGMENT_TOKENS &&
												 groups[0].seg_end == seg_end &&
												 members[0] == 1 && members[7] == 9 &&
												 !taken[0] && !taken[3])),
							  "fork %d window %d: %d groups, the first of %d sharing [%d, %d) "
							  "up to %d", forks[fk], windows[w], n_groups,
							  n_groups ? groups[0].n : 0, n_groups ? groups[0].seg_begin : 0,
							  n_groups ? groups[0].seg_end : 0, n_groups ? groups[0].own_from : 0);
				}
				/* each row alone, on the machine's own path */
				cai_cpu_force_isa(original);
				for (int i = 0; i < 10; i++)
				{
					step		one = {.n_seqs = 1, .seq = {st.seq[i]},
					.first = {st.first[i] + st.len[i] - 1}, .len = {1},
					.tables = {st.tables[i]}};
					int			T1;

					CHECK(run_step(&f, &one, 1, windows[w], alone + (size_t) i * row, &T1));
				}
				for (int p = 0; p < N_OF(paths); p++)
				{
					if (!cai_cpu_force_isa(paths[p]))
						continue;
					for (int threads = 1; threads <= 3; threads++)
					{
						CHECK(run_step(&f, &st, threads, windows[w], got, &T));
						for (int i = 0; i < 10; i++)
							CHECK_MSG(memcmp(alone + (size_t) i * row,
											 got + (size_t) (start[i] + len[i] - 1) * row,
											 sizeof(float) * row) == 0,
									  "hd %d digits %d fork %d window %d %s, %d threads: batch "
									  "sequence %d differs from its row alone", hd, digits,
									  forks[fk], windows[w], paths[p], threads, i);
					}
				}
			}
		}
		cai_cpu_force_isa(original);
		free(tables);
		free(alone);
		free(got);
		fixture_close(&f);
	}
}

/*
 * The score of KV head kvh's position j for a query quantized to qq with scale qs (query scale
 * times attention scale), with the kernel's arithmetic: the exact integer dot (with two-digit
 * keys, of 254 k + k2), then dot * (key scale * qs).
 */
static float
reference_score(const fixture *f, int kvh, const int8_t *qq, float qs, int j)
{
	const int	hd = f->hd;
	uint8_t    *blk = cai_kv_block_layer(f->pool, f->tables[j / CAI_KV_BLOCK_TOKENS], 0);
	int			slot = j % CAI_KV_BLOCK_TOKENS;
	float		ks = cai_kv_key_scales(&f->L, blk)[slot * N_KV + kvh];
	int32_t		dot = 0;

	for (int d = 0; d < hd; d++)
		dot += (int32_t) qq[d] * key_digits_at(f, blk, slot, kvh, d);
	return (float) dot * (ks * qs);
}

/* The largest of those scores over positions [a, e]. */
static float
reference_max_score(const fixture *f, int kvh, const int8_t *qq, float qs, int a, int e)
{
	float		m = -INFINITY;

	for (int j = a; j <= e; j++)
	{
		float		score = reference_score(f, kvh, qq, qs, j);

		m = score > m ? score : m;
	}
	return m;
}

/*
 * attention.h's softmax total of positions [a, e] of KV head kvh given their maximum m, written
 * out here on its own: e_j = cai_attention_exp2(score_j - m), position i = j - a added in order
 * into partial sum i % 16, then the pairs p[i] + p[i + 8] and the tree of eight.
 */
static float
reference_total(const fixture *f, int kvh, const int8_t *qq, float qs, int a, int e, float m)
{
	float		part[16] = {0};
	float		pair[8];

	for (int j = a; j <= e; j++)
		part[(j - a) % 16] += cai_attention_exp2(reference_score(f, kvh, qq, qs, j) - m);
	for (int i = 0; i < 8; i++)
		pair[i] = part[i] + part[i + 8];
	return ((pair[0] + pair[4]) + (pair[2] + pair[6])) + ((pair[1] + pair[5]) + (pair[3] + pair[7]));
}

/*
 * Whether o[0..hd) is attention.h's int8 value rule for positions [a, e] of KV head kvh, given
 * the segment's maximum m and total l: e_j = cai_attention_exp2(score_j - m), vmax the largest
 * value scale, w_j = round((e_j * v_scale_j) * (16383 / vmax)), and
 * o[d] = (float) (sum_j w_j * v_j[d]) * ((vmax / 16383) / l), written out here on its own.
 */
static bool
value_rule_holds(const fixture *f, int kvh, const int8_t *qq, float qs, int a, int e, float m,
				 float l, const float *o)
{
	const int	hd = f->hd;
	int32_t		w[CAI_ATTN_SEGMENT_TOKENS];
	float		vmax = 0.0f,
				qinv,
				g;

	for (int j = a; j <= e; j++)
	{
		uint8_t    *blk = cai_kv_block_layer(f->pool, f->tables[j / CAI_KV_BLOCK_TOKENS], 0);
		float		vs = cai_kv_value_scales(&f->L, blk)[j % CAI_KV_BLOCK_TOKENS * N_KV + kvh];

		vmax = vs > vmax ? vs : vmax;
	}
	qinv = vmax >= CAI_ATTN_VSCALE_MIN ? 16383.0f / vmax : 0.0f;
	for (int j = a; j <= e; j++)
	{
		uint8_t    *blk = cai_kv_block_layer(f->pool, f->tables[j / CAI_KV_BLOCK_TOKENS], 0);
		float		vs = cai_kv_value_scales(&f->L, blk)[j % CAI_KV_BLOCK_TOKENS * N_KV + kvh];
		float		prod = cai_attention_exp2(reference_score(f, kvh, qq, qs, j) - m) * vs;

		w[j - a] = (int32_t) rintf(prod * qinv);
	}
	g = (vmax / 16383.0f) / l;
	for (int d = 0; d < hd; d++)
	{
		int32_t		sum = 0;

		for (int j = a; j <= e; j++)
		{
			uint8_t    *blk = cai_kv_block_layer(f->pool, f->tables[j / CAI_KV_BLOCK_TOKENS], 0);
			const int8_t *v = cai_kv_values(&f->L, blk) +
				((size_t) (j % CAI_KV_BLOCK_TOKENS) * N_KV + kvh) * hd;

			sum += w[j - a] * v[d];
		}
		if (o[d] != (float) sum * g)
			return false;
	}
	return true;
}

/*
 * The segments of a tile over sequence 0's n_tok tokens from position t_first, all KV heads, on
 * the current path (a part's partials over all the tile's segments) whose maximum differs from
 * the reference's (*wrong_max), or whose value sums break the int8 value rule (*wrong_values).
 */
static void
count_wrong_segments(const fixture *f, const cai_attn_params *ap, int t_first, int n_tok,
					 cai_attn_scratch *s, float *po, float *pm, float *pl, int *wrong_max,
					 int *wrong_total, int *wrong_values)
{
	const int	hd = f->hd;
	const int	SEG = CAI_ATTN_SEGMENT_TOKENS;
	int32_t		pos[MAX_STEP],
				tseq[MAX_STEP],
				start = 0,
				len = n_tok;
	const int32_t *tables[1] = {f->tables};
	cai_batch_layout bl = {.n_tokens = n_tok, .n_seqs = 1, .token_pos = pos, .token_seq = tseq,
	.seq_start = &start, .seq_len = &len, .block_tables = tables};
	cai_attn_partials pt = {.o = po, .m = pm, .l = pl};
	int8_t		qq[256];
	int			last;

	*wrong_max = *wrong_total = *wrong_values = 0;
	for (int t = 0; t < n_tok; t++)
	{
		pos[t] = t_first + t;
		tseq[t] = 0;
	}
	cai_attention_tile_segments(ap, &bl, 0, n_tok, &pt.seg0, &last);
	pt.n_segs = last - pt.seg0 + 1;
	for (int kvh = 0; kvh < N_KV; kvh++)
	{
		cai_attention_tile_part(ap, &bl, 0, kvh, 0, n_tok, f->q + (size_t) t_first * N_HEADS * hd,
								N_HEADS * hd, f->pool, NULL, pt.seg0, last + 1, &pt, s);
		for (int r = 0; r < n_tok * GROUP; r++)
		{
			int			p = pos[r / GROUP];
			int			h = kvh * GROUP + r % GROUP;
			int			lo = ap->window > 0 && p - ap->window + 1 > 0 ? p - ap->window + 1 : 0;
			float		qs;

			cai_op_quantize_vec_i8(f->q + (size_t) p * N_HEADS * hd + (size_t) h * hd, hd, qq, &qs);
			qs = qs * cai_attn_score_scale(ap);
			for (int sg = lo / SEG; sg <= p / SEG; sg++)
			{
				int			a = sg * SEG > lo ? sg * SEG : lo;
				int			e = sg * SEG + SEG - 1 < p ? sg * SEG + SEG - 1 : p;
				int			k = sg - pt.seg0;
				float		m = pm[(size_t) r * pt.n_segs + k];

				if (m != reference_max_score(f, kvh, qq, qs, a, e))
					(*wrong_max)++;
				if (pl[(size_t) r * pt.n_segs + k] != reference_total(f, kvh, qq, qs, a, e, m))
					(*wrong_total)++;
				if (!value_rule_holds(f, kvh, qq, qs, a, e, m, pl[(size_t) r * pt.n_segs + k],
									  po + ((size_t) k * n_tok * GROUP + r) * hd))
					(*wrong_values)++;
			}
		}
	}
}

/*
 * A part of a split tile leaves each segment's maximum, total and value sums in its partials;
 * on every path, for a decode-sized tile and a prefill-sized one:
 * - the maximum is the exact largest score.  Every path shares the maximum's code and the
 *   softmax does not depend on it mathematically, so only this shows a lane left out of it;
 * - the total follows the sixteen-partial-sum rule and the value sums the int8 value rule
 *   (attention.h), both computed here on their own: the arithmetic the GPU reproduces, pinned
 *   down whatever the paths agree on among themselves.
 */
TEST(attention_segment_maxima_and_values_exact)
{
	const int	max_tok = cai_attention_tile_tokens(GROUP);
	const int	max_rows = max_tok * GROUP;
	const int	max_segs = cai_attention_max_segments(MAX_CONTEXT);
	char		original[32];

	snprintf(original, sizeof(original), "%s", cai_cpu_isa());
	for (int c = 0; c < N_CONFIGS; c++)
	{
		fixture		f;
		int			hd = head_sizes[c % N_OF(head_sizes)];
		int			digits = config_key_digits(c);
		void	   *mem = malloc(cai_attention_scratch_bytes(MAX_CONTEXT, GROUP, hd));
		float	   *po = malloc(sizeof(float) * max_segs * max_rows * hd);
		float	   *pm = malloc(sizeof(float) * max_rows * max_segs);
		float	   *pl = malloc(sizeof(float) * max_rows * max_segs);
		cai_attn_scratch s;

		CHECK(fixture_open(&f, hd, 1, digits));
		cai_attention_scratch_init(&s, mem, MAX_CONTEXT, GROUP, hd);
		for (int w = 0; w < N_OF(windows); w++)
		{
			cai_attn_params ap = {.n_heads = N_HEADS, .n_kv_heads = N_KV, .head_dim = hd,
			.window = windows[w], .kv_layer = 0, .scale = 1.0f / sqrtf((float) hd)};

			for (int p = 0; p < N_OF(paths); p++)
			{
				if (!cai_cpu_force_isa(paths[p]))
					continue;
				for (int n_tok = 1; n_tok <= max_tok; n_tok += max_tok - 1)
				{
					int			wrong_max,
								wrong_total,
								wrong_values;

					count_wrong_segments(&f, &ap, 1300 - n_tok, n_tok, &s, po, pm, pl, &wrong_max,
										 &wrong_total, &wrong_values);
					CHECK_MSG(wrong_max == 0, "hd %d window %d, %d-token tile, %s: %d segment "
							  "maxima differ", hd, windows[w], n_tok, paths[p], wrong_max);
					CHECK_MSG(wrong_total == 0, "hd %d window %d, %d-token tile, %s: %d segment "
							  "totals differ", hd, windows[w], n_tok, paths[p], wrong_total);
					CHECK_MSG(wrong_values == 0, "hd %d window %d, %d-token tile, %s: %d segments' "
							  "value sums break the rule", hd, windows[w], n_tok, paths[p],
							  wrong_values);
				}
			}
		}
		cai_cpu_force_isa(original);
		free(mem);
		free(po);
		free(pm);
		free(pl);
		fixture_close(&f);
	}
}
