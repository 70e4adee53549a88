/*
 * sim_cache.c — the prefix cache's eviction policy alone, without a model: replays conversation
 * workloads through the cache API (src/engine/prefix_cache.h) over a small KV pool and reports
 * the hit rate over follow-up prompt tokens, to compare eviction policies in seconds rather than
 * through bench_cache.py's clusters.
 *
 * Each request does what the engine does for it: a lookup of prompt - 1 tokens reusing to the token
 * (full blocks plus a partial tail), blocks reserved for the rest (reclaiming from the cache when
 * the pool is short), then the prompt and reply but the last token offered back to the cache, and
 * the request's references dropped.  Token ids are random; the conversations share one salt and an
 * 88-token system prompt, as under pg_cai.cache_isolation = role (the default), or with "isolated"
 * each has its own salt.  The shapes follow bench_cache.py's defaults: a first prompt of ~530
 * tokens, follow-ups of 33..94 new tokens (user message and template markup), replies of 64 tokens.
 *
 * Workloads:
 *   round-robin  C conversations x T turns, turn 1 of each, then turn 2 of each, ...; budget
 *                "full" (all of it fits: no eviction) and "half" (half the blocks the full run
 *                ends with), as bench_cache.py's phases
 *   random-order the same conversations, each step the next turn of one drawn at random
 *   stale        the cache filled with 40 finished conversations first, then 2 conversations
 *                alternating for T turns: an active set that fits beside stale content
 *   shift        C conversations x T turns round-robin, then C new ones: how fast the cache
 *                turns over to the new set (hit rate of the second set)
 *   disk DIR     (only with a directory argument) the RAM tier sized to hold C conversations'
 *                histories, then 1x, 5x and 20x C conversations x T turns round-robin, with the
 *                disk tier (kv_disk.c, its files under DIR, a budget the whole run fits) and
 *                without: between two turns of one conversation every other one plays a turn, so
 *                beyond 1x its prefix has left memory; the tier's writes are waited for after each
 *                turn (an engine's turn lasts long enough for the writer to keep up)
 *
 * Build and run (from the repository root, after make):
 *
 *   cc -O2 -std=gnu11 -Isrc/common -Isrc/backend -Isrc/engine -o /tmp/sim_cache tests/bench/sim_cache.c build/libcai.a \
 *       -lxxhash -lm -lpthread -ldl
 *   /tmp/sim_cache [conversations 8] [turns 12] [isolated] [disk DIR]
 *
 * Another eviction policy can be measured by naming its prefix_cache.c before the library:
 *   cc ... tests/bench/sim_cache.c OTHER/prefix_cache.c build/libcai.a ...
 *
 * Not a test: it passes or fails nothing.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"
#include "kv_disk.h"
#include "prefix_cache.h"

#define BT CAI_KV_BLOCK_TOKENS
#define MAX_TOKENS 8192

typedef struct conv
{
	uint64_t	salt;
	int32_t		tokens[MAX_TOKENS];
	int			n;				/* history so far: prompts and replies */
	uint64_t	rng;
} conv;

typedef struct tally
{
	uint64_t	prompt_tokens;	/* follow-up turns only */
	uint64_t	hit_tokens;
	uint64_t	ceiling;		/* what the previous turn computed */
} tally;

static uint64_t
next_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static int
rand_between(uint64_t *s, int lo, int hi)
{
	return lo + (int) (next_rand(s) % (uint64_t) (hi - lo + 1));
}

static void
append_random(conv *c, int n)
{
	for (int i = 0; i < n && c->n < MAX_TOKENS; i++)
		c->tokens[c->n++] = (int32_t) (next_rand(&c->rng) % 49000) + 1;
}

static cai_kv_pool *
make_pool(int n_blocks)
{
	cai_kv_layout layout = {0};
	cai_kv_pool *pool = NULL;
	cai_error	err;

	layout.n_kv_layers = 1;
	layout.n_kv_heads = 1;
	layout.head_dim = 4;
	layout.layer_bytes = 2 * BT * 4 + 2 * BT * sizeof(float);
	layout.block_bytes = layout.layer_bytes;
	if (cai_kv_pool_create(&layout, n_blocks, &pool, &err) != CAI_OK)
	{
		fprintf(stderr, "pool: %s\n", err.message);
		exit(1);
	}
	return pool;
}

static cai_prefix_cache *
make_cache(cai_kv_pool *pool, int budget_blocks)
{
	cai_prefix_cache *cache = NULL;
	cai_error	err;

	if (cai_prefix_cache_create(pool, (size_t) budget_blocks * cai_kv_pool_layout(pool)->block_bytes,
								UINT64_C(0x5eed), &cache, &err) != CAI_OK)
	{
		fprintf(stderr, "cache: %s\n", err.message);
		exit(1);
	}
	return cache;
}

/*
 * Shared: every conversation under one salt, starting with the same 88-token system prompt and
 * template, as with pg_cai.cache_isolation = role (the default); else one salt per conversation
 * (cache_isolation = conversation).
 */
static bool shared = true;

static void
conv_init(conv *c, int index)
{
	c->salt = shared ? 0 : UINT64_C(0x1000) + (uint64_t) index;
	c->rng = UINT64_C(0x9E3779B97F4A7C15) * (uint64_t) (index + 1);
	c->n = 0;
	if (shared)
	{
		uint64_t	rng = UINT64_C(0x5DEECE66D);

		for (int i = 0; i < 88; i++)
			c->tokens[c->n++] = (int32_t) (next_rand(&rng) % 49000) + 1;
	}
}

/*
 * One turn: the new user message joins the history, the prompt is looked up and computed, the
 * reply is generated, and prompt + reply - 1 tokens go back to the cache.
 */
static void
play_turn(cai_prefix_cache *cache, cai_kv_pool *pool, conv *c, tally *t)
{
	static int32_t table[MAX_TOKENS / BT + 1];
	cai_prefix_cache_tail tail = {.block = -1, .n_tokens = 0};
	bool		follow_up = c->n > (shared ? 88 : 0);
	int			computed_before = follow_up ? c->n - 1 : 0;
	int			n_prompt;
	int			n_total;
	int			need;
	int			matched;
	int			hit;

	if (!follow_up)
		append_random(c, rand_between(&c->rng, 500, 560) - c->n);
	else
		append_random(c, rand_between(&c->rng, 33, 94));
	n_prompt = c->n;
	n_total = n_prompt + 64;
	need = (n_total + BT - 1) / BT;

	matched = cai_prefix_cache_lookup_tokens(cache, c->salt, c->tokens, n_prompt, n_prompt - 1,
											 table, (n_prompt - 1) / BT, &tail);
	hit = matched * BT + (tail.block >= 0 ? tail.n_tokens : 0);
	if (cai_kv_pool_n_free(pool) < need - matched)
		cai_prefix_cache_reclaim(cache, need - matched);
	for (int i = matched; i < need; i++)
	{
		table[i] = cai_kv_block_alloc(pool);
		if (table[i] < 0)
		{
			fprintf(stderr, "pool exhausted\n");
			exit(1);
		}
	}
	if (tail.block >= 0)
		cai_kv_block_unref(pool, tail.block);	/* the rows are copied; no KV is simulated */

	append_random(c, 64);
	cai_prefix_cache_insert(cache, c->salt, c->tokens, n_total - 1, table, need);
	for (int i = 0; i < need; i++)
		cai_kv_block_unref(pool, table[i]);

	if (follow_up && t)
	{
		t->prompt_tokens += (uint64_t) n_prompt;
		t->hit_tokens += (uint64_t) hit;
		t->ceiling += (uint64_t) computed_before;
	}
}

static void
print_row(const char *workload, const char *budget, int budget_blocks, const tally *t,
		  const cai_prefix_cache *cache)
{
	cai_prefix_cache_stats s;

	cai_prefix_cache_get_stats(cache, &s);
	printf("%-12s %-6s %6d blocks  hit %5.1f %%  (ceiling %5.1f %%)  evictions %llu\n", workload,
		   budget, budget_blocks, 100.0 * (double) t->hit_tokens / (double) t->prompt_tokens,
		   100.0 * (double) t->ceiling / (double) t->prompt_tokens,
		   (unsigned long long) s.evictions);
}

/*
 * Round-robin over n_conv conversations, or, when shuffled, the next turn of a conversation
 * drawn at random among those with turns left; returns the blocks cached at the end.
 */
static int
round_robin(int n_conv, int turns, int budget_blocks, const char *label, bool shuffled)
{
	int			seq_blocks = (MAX_TOKENS + BT - 1) / BT;
	cai_kv_pool *pool = make_pool(budget_blocks + seq_blocks + 8);
	cai_prefix_cache *cache = make_cache(pool, budget_blocks);
	conv	   *convs = calloc((size_t) n_conv, sizeof(conv));
	tally		t = {0};
	cai_prefix_cache_stats s;

	for (int i = 0; i < n_conv; i++)
		conv_init(&convs[i], i);
	if (!shuffled)
	{
		for (int turn = 0; turn < turns; turn++)
			for (int i = 0; i < n_conv; i++)
				play_turn(cache, pool, &convs[i], &t);
	}
	else
	{
		uint64_t	rng = UINT64_C(0x2545F4914F6CDD1D);
		int		   *left = malloc((size_t) n_conv * sizeof(int));
		int			total = n_conv * turns;

		for (int i = 0; i < n_conv; i++)
			left[i] = turns;
		while (total > 0)
		{
			int			pick = (int) (next_rand(&rng) % (uint64_t) total);
			int			i = 0;

			while (pick >= left[i])
				pick -= left[i++];
			left[i]--;
			total--;
			play_turn(cache, pool, &convs[i], &t);
		}
		free(left);
	}
	if (label)
		print_row(shuffled ? "random-order" : "round-robin", label, budget_blocks, &t, cache);
	cai_prefix_cache_get_stats(cache, &s);
	cai_prefix_cache_free(cache);
	cai_kv_pool_free(pool);
	free(convs);
	return (int) s.blocks;
}

static void
stale_then_active(int turns, int budget_blocks)
{
	int			seq_blocks = (MAX_TOKENS + BT - 1) / BT;
	cai_kv_pool *pool = make_pool(budget_blocks + seq_blocks + 8);
	cai_prefix_cache *cache = make_cache(pool, budget_blocks);
	conv	   *convs = calloc(42, sizeof(conv));
	tally		t = {0};

	/* 40 finished conversations of 3 turns each, one after the other */
	for (int i = 0; i < 40; i++)
	{
		conv_init(&convs[i], 100 + i);
		for (int turn = 0; turn < 3; turn++)
			play_turn(cache, pool, &convs[i], NULL);
	}
	conv_init(&convs[40], 200);
	conv_init(&convs[41], 201);
	for (int turn = 0; turn < turns; turn++)
		for (int i = 40; i < 42; i++)
			play_turn(cache, pool, &convs[i], &t);
	print_row("stale+2", "half", budget_blocks, &t, cache);
	cai_prefix_cache_free(cache);
	cai_kv_pool_free(pool);
	free(convs);
}

static void
shift(int n_conv, int turns, int budget_blocks)
{
	int			seq_blocks = (MAX_TOKENS + BT - 1) / BT;
	cai_kv_pool *pool = make_pool(budget_blocks + seq_blocks + 8);
	cai_prefix_cache *cache = make_cache(pool, budget_blocks);
	conv	   *convs = calloc((size_t) n_conv * 2, sizeof(conv));
	tally		t = {0};

	for (int i = 0; i < 2 * n_conv; i++)
		conv_init(&convs[i], 300 + i);
	for (int turn = 0; turn < turns; turn++)
		for (int i = 0; i < n_conv; i++)
			play_turn(cache, pool, &convs[i], NULL);
	for (int turn = 0; turn < turns; turn++)
		for (int i = n_conv; i < 2 * n_conv; i++)
			play_turn(cache, pool, &convs[i], &t);
	print_row("shift", "half", budget_blocks, &t, cache);
	cai_prefix_cache_free(cache);
	cai_kv_pool_free(pool);
	free(convs);
}

static void
disk_log(void *arg, const char *line)
{
	(void) arg;
	fprintf(stderr, "disk tier: %s\n", line);
}

/*
 * Round-robin over n_conv conversations under a RAM budget of budget_blocks, with a disk tier
 * under dir (emptied first) when dir is not NULL; prints one row.
 */
static void
round_robin_disk(int n_conv, int turns, int budget_blocks, const char *dir, const char *scale)
{
	int			seq_blocks = (MAX_TOKENS + BT - 1) / BT;
	cai_kv_pool *pool = make_pool(budget_blocks + seq_blocks + 8);
	cai_prefix_cache *cache = make_cache(pool, budget_blocks);
	cai_kv_disk *disk = NULL;
	conv	   *convs = calloc((size_t) n_conv, sizeof(conv));
	tally		t = {0};
	cai_prefix_cache_stats s;
	cai_kv_disk_stats ds = {0};
	cai_error	err;

	if (!convs)
	{
		fprintf(stderr, "out of memory\n");
		exit(1);
	}
	if (dir)
	{
		if (cai_kv_disk_open(dir, (size_t) 64 << 30, UINT64_C(0x5eed), cai_kv_pool_layout(pool),
							 "cpu", disk_log, NULL, &disk, &err) != CAI_OK)
		{
			fprintf(stderr, "disk tier: %s\n", err.message);
			exit(1);
		}
		cai_kv_disk_reset(disk);
		cai_prefix_cache_set_disk(cache, disk);
	}
	for (int i = 0; i < n_conv; i++)
		conv_init(&convs[i], 1000 + i);
	for (int turn = 0; turn < turns; turn++)
		for (int i = 0; i < n_conv; i++)
		{
			play_turn(cache, pool, &convs[i], &t);
			if (disk)
				cai_kv_disk_flush(disk);
		}
	cai_prefix_cache_get_stats(cache, &s);
	if (disk)
		cai_kv_disk_get_stats(disk, &ds);
	printf("| %s | %d | %s | %.2f %% | %.2f %% | %.2f | %llu | %llu | %llu |\n", scale, n_conv,
		   disk ? "RAM + disk" : "RAM only",
		   100.0 * (double) t.hit_tokens / (double) t.prompt_tokens,
		   100.0 * (double) t.ceiling / (double) t.prompt_tokens,
		   100.0 * ((double) t.ceiling - (double) t.hit_tokens) / (double) t.prompt_tokens,
		   (unsigned long long) s.evictions, (unsigned long long) ds.hits,
		   (unsigned long long) ds.writes_dropped);
	if (disk)
		fprintf(stderr, "  %s %d: disk hits %llu misses %llu written %llu files %llu evictions %llu, lookups %llu\n", scale, n_conv,
				(unsigned long long) ds.hits, (unsigned long long) ds.misses,
				(unsigned long long) ds.blocks_written, (unsigned long long) ds.files,
				(unsigned long long) ds.evictions, (unsigned long long) s.lookups);
	fflush(stdout);
	if (disk)
	{
		cai_prefix_cache_set_disk(cache, NULL);
		cai_kv_disk_reset(disk);
		cai_kv_disk_close(disk);
	}
	cai_prefix_cache_free(cache);
	cai_kv_pool_free(pool);
	free(convs);
}

/*
 * The disk tier against RAM alone when conversations outnumber what RAM holds: the RAM budget is
 * what n_conv conversations' histories end with, the workload 1x, 5x and 20x n_conv of them.
 */
static void
disk_tier(int n_conv, int turns, const char *dir)
{
	static const int scales[] = {1, 5, 20};
	int			budget = round_robin(n_conv, turns, 1 << 16, NULL, false);

	printf("\nthe disk tier: a RAM budget of %d blocks (%d conversations x %d turns), files under %s\n\n",
		   budget, n_conv, turns, dir);
	printf("| conversations / RAM tier | conversations | tiers | hit rate | ceiling | "
		   "ceiling - hit (points) | RAM evictions | disk hits (blocks) | writes dropped |\n");
	printf("|---|---|---|---|---|---|---|---|---|\n");
	for (int i = 0; i < 3; i++)
	{
		char		scale[16];

		snprintf(scale, sizeof(scale), "%dx", scales[i]);
		round_robin_disk(n_conv * scales[i], turns, budget, NULL, scale);
		round_robin_disk(n_conv * scales[i], turns, budget, dir, scale);
	}
}

int
main(int argc, char **argv)
{
	int			n_conv = argc > 1 ? atoi(argv[1]) : 8;
	int			turns = argc > 2 ? atoi(argv[2]) : 12;
	int			full;
	const char *disk_dir = NULL;

	for (int i = 3; i < argc; i++)
	{
		if (strcmp(argv[i], "isolated") == 0)
			shared = false;
		else if (strcmp(argv[i], "disk") == 0 && i + 1 < argc)
			disk_dir = argv[++i];
		else
		{
			fprintf(stderr, "usage: sim_cache [conversations] [turns] [isolated] [disk DIR]\n");
			return 2;
		}
	}
	if (n_conv < 1 || turns < 1 || turns * 160 + 600 > MAX_TOKENS)
	{
		fprintf(stderr, "usage: sim_cache [conversations] [turns] [isolated] [disk DIR]\n");
		return 2;
	}
	if (disk_dir)
	{
		disk_tier(n_conv, turns, disk_dir);
		return 0;
	}
	printf("%d conversations x %d turns, %s\n", n_conv, turns,
		   shared ? "one salt and a shared 88-token system prompt (cache_isolation = role)"
		   : "a salt per conversation (cache_isolation = conversation)");
	full = round_robin(n_conv, turns, 1 << 16, NULL, false);
	round_robin(n_conv, turns, full, "full", false);
	round_robin(n_conv, turns, full / 2, "half", false);
	round_robin(n_conv, turns, full / 4, "quarter", false);
	round_robin(n_conv, turns, full / 2, "half", true);
	stale_then_active(turns, full / 2);
	shift(n_conv, turns, full / 2);
	return 0;
}
