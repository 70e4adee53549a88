/*
 * test_prefix_cache.c — the inter-turn prefix cache over a tiny KV pool: hits and partial hits,
 * partial blocks, eviction (stale blocks least recently used first, a stable subset under a
 * cycle larger than the cache, the newest unreused blocks making room), verification against
 * forced hash collisions, salt isolation, pinning, reclaim, reset, and a long random churn that
 * checks the byte budget, the pool's reference counts and the content of every block handed out
 * after every operation.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"
#include "prefix_cache.h"
#include "test.h"

#define BT CAI_KV_BLOCK_TOKENS

/* A pool whose blocks are 256 bytes: one layer, one KV head, head_dim 4. */
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
		return NULL;
	return pool;
}

static cai_prefix_cache *
make_cache(cai_kv_pool *pool, int budget_blocks)
{
	cai_prefix_cache *cache = NULL;
	cai_error	err;

	if (cai_prefix_cache_create(pool, (size_t) budget_blocks * cai_kv_pool_layout(pool)->block_bytes,
								UINT64_C(0x5eed), &cache, &err) != CAI_OK)
		return NULL;
	return cache;
}

/* tokens[i] = tag * 1000 + i: distinct sequences for distinct tags. */
static void
fill_tokens(int32_t *tokens, int n, int tag)
{
	for (int i = 0; i < n; i++)
		tokens[i] = tag * 1000 + i;
}

/* Allocates n blocks for the test (one reference each); false if the pool ran out. */
static bool
alloc_blocks(cai_kv_pool *pool, int32_t *blocks, int n)
{
	for (int i = 0; i < n; i++)
	{
		blocks[i] = cai_kv_block_alloc(pool);
		if (blocks[i] < 0)
			return false;
	}
	return true;
}

static void
unref_blocks(cai_kv_pool *pool, const int32_t *blocks, int n)
{
	for (int i = 0; i < n; i++)
		cai_kv_block_unref(pool, blocks[i]);
}

/* Allocates blocks for tokens, offers them to the cache, then drops the test's references. */
static void
insert_owned(cai_prefix_cache *cache, cai_kv_pool *pool, uint64_t salt, const int32_t *tokens,
			 int n_tokens, int32_t *blocks_out)
{
	int			n_blocks = (n_tokens + BT - 1) / BT;

	CHECK(alloc_blocks(pool, blocks_out, n_blocks));
	cai_prefix_cache_insert(cache, salt, tokens, n_tokens, blocks_out, n_blocks);
	unref_blocks(pool, blocks_out, n_blocks);
}

/* Looks up and immediately releases the references; returns the hit count. */
static int
probe(cai_prefix_cache *cache, cai_kv_pool *pool, uint64_t salt, const int32_t *tokens, int n,
	  int32_t *blocks_out)
{
	int32_t		scratch[64];
	int32_t    *out = blocks_out ? blocks_out : scratch;
	int			hit = cai_prefix_cache_lookup(cache, salt, tokens, n, out, 64);

	unref_blocks(pool, out, hit);
	return hit;
}

static cai_prefix_cache_stats
stats_of(const cai_prefix_cache *cache)
{
	cai_prefix_cache_stats s;

	cai_prefix_cache_get_stats(cache, &s);
	return s;
}

TEST(prefix_cache_full_hit_and_partial_last_block)
{
	cai_kv_pool *pool = make_pool(32);
	cai_prefix_cache *cache = make_cache(pool, 16);
	int32_t		tokens[4 * BT + 5];
	int32_t		blocks[5];
	int32_t		found[8];
	cai_prefix_cache_stats s;
	int			hit;

	CHECK(pool && cache);
	if (!pool || !cache)
		return;
	fill_tokens(tokens, 4 * BT + 5, 1);
	CHECK(alloc_blocks(pool, blocks, 5));
	/* five blocks offered, the fifth holds 5 tokens: four full blocks and a partial tail */
	cai_prefix_cache_insert(cache, 7, tokens, 4 * BT + 5, blocks, 5);
	s = stats_of(cache);
	CHECK_EQ_INT(s.blocks, 5);
	CHECK_EQ_INT(s.inserted_blocks, 5);
	CHECK_EQ_INT(s.bytes, 5 * 256);
	for (int i = 0; i < 5; i++)
		CHECK_EQ_INT(cai_kv_block_refcount(pool, blocks[i]), 2);

	hit = cai_prefix_cache_lookup(cache, 7, tokens, 4 * BT + 5, found, 8);
	CHECK_EQ_INT(hit, 4);
	for (int i = 0; i < hit; i++)
	{
		CHECK_EQ_INT(found[i], blocks[i]);
		CHECK_EQ_INT(cai_kv_block_refcount(pool, blocks[i]), 3);
	}
	unref_blocks(pool, found, hit);
	s = stats_of(cache);
	CHECK_EQ_INT(s.lookups, 1);
	CHECK_EQ_INT(s.lookup_tokens, 4 * BT + 5);
	CHECK_EQ_INT(s.hit_tokens, 4 * BT);

	/* max_blocks caps the answer; fewer tokens than a block find nothing */
	hit = cai_prefix_cache_lookup(cache, 7, tokens, 4 * BT, found, 3);
	CHECK_EQ_INT(hit, 3);
	unref_blocks(pool, found, hit);
	CHECK_EQ_INT(probe(cache, pool, 7, tokens, BT - 1, NULL), 0);
	/* the same 4 blocks again under 63 tokens: the fourth is partial, so three */
	CHECK_EQ_INT(probe(cache, pool, 7, tokens, 4 * BT - 1, NULL), 3);

	/* re-offering the same blocks adds nothing */
	cai_prefix_cache_insert(cache, 7, tokens, 4 * BT + 5, blocks, 5);
	CHECK_EQ_INT(stats_of(cache).blocks, 5);
	CHECK_EQ_INT(stats_of(cache).inserted_blocks, 5);
	for (int i = 0; i < 5; i++)
		CHECK_EQ_INT(cai_kv_block_refcount(pool, blocks[i]), 2);

	unref_blocks(pool, blocks, 5);
	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 32);
	cai_kv_pool_free(pool);
}

/* Looks up to the token and releases every reference taken; returns full blocks, sets *tail. */
static int
probe_tokens(cai_prefix_cache *cache, cai_kv_pool *pool, uint64_t salt, const int32_t *tokens,
			 int n, int max_tokens, cai_prefix_cache_tail *tail)
{
	int32_t		out[64];
	int			hit = cai_prefix_cache_lookup_tokens(cache, salt, tokens, n, max_tokens, out, 64,
													 tail);

	unref_blocks(pool, out, hit);
	if (tail->block >= 0)
		cai_kv_block_unref(pool, tail->block);
	return hit;
}

TEST(prefix_cache_partial_tail_reused_to_the_token)
{
	cai_kv_pool *pool = make_pool(16);
	cai_prefix_cache *cache = make_cache(pool, 16);
	int32_t		tokens[3 * BT + 8];
	int32_t		prompt[3 * BT + 8];
	int32_t		blocks[3];
	int32_t		found[8];
	cai_prefix_cache_tail tail;
	int			hit;

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	fill_tokens(tokens, 3 * BT + 8, 2);
	/* 47 tokens: two full blocks and a tail of 15 in the third */
	insert_owned(cache, pool, 0, tokens, 3 * BT - 1, blocks);
	CHECK_EQ_INT(stats_of(cache).blocks, 3);
	CHECK_EQ_INT(cai_kv_block_refcount(pool, blocks[2]), 1);

	/* a longer prompt agreeing on all 47: two blocks and the 15 rows, the tail referenced */
	hit = cai_prefix_cache_lookup_tokens(cache, 0, tokens, 3 * BT + 8, 3 * BT + 7, found, 8, &tail);
	CHECK_EQ_INT(hit, 2);
	CHECK_EQ_INT(tail.block, blocks[2]);
	CHECK_EQ_INT(tail.n_tokens, BT - 1);
	CHECK_EQ_INT(cai_kv_block_refcount(pool, blocks[2]), 2);
	unref_blocks(pool, found, hit);
	cai_kv_block_unref(pool, tail.block);
	CHECK_EQ_INT(stats_of(cache).hit_tokens, 3 * BT - 1);

	/* diverging at the tail's 8th token: 7 rows */
	memcpy(prompt, tokens, sizeof(prompt));
	prompt[2 * BT + 7] = -5;
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, prompt, 3 * BT + 8, 3 * BT + 8, &tail), 2);
	CHECK_EQ_INT(tail.n_tokens, 7);
	/* diverging at the tail's first token: no tail */
	prompt[2 * BT] = -5;
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, prompt, 3 * BT + 8, 3 * BT + 8, &tail), 2);
	CHECK_EQ_INT(tail.block, -1);
	CHECK_EQ_INT(tail.n_tokens, 0);
	/* max_tokens bounds the tail (the engine keeps the last prompt token to run) */
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, tokens, 3 * BT + 8, 2 * BT + 4, &tail), 2);
	CHECK_EQ_INT(tail.n_tokens, 4);
	/* another salt sees neither the blocks nor the tail */
	CHECK_EQ_INT(probe_tokens(cache, pool, 1, tokens, 3 * BT + 8, 3 * BT + 8, &tail), 0);
	CHECK_EQ_INT(tail.block, -1);
	/* the plain lookup still answers in full blocks */
	CHECK_EQ_INT(probe(cache, pool, 0, tokens, 3 * BT, NULL), 2);

	/* a prompt shorter than a block: a tail at the root, under its salt only */
	insert_owned(cache, pool, 3, tokens, 10, blocks);
	CHECK_EQ_INT(probe_tokens(cache, pool, 3, tokens, 12, 12, &tail), 0);
	CHECK_EQ_INT(tail.n_tokens, 10);
	CHECK_EQ_INT(tail.block, blocks[0]);
	CHECK_EQ_INT(probe_tokens(cache, pool, 4, tokens, 12, 12, &tail), 0);
	CHECK_EQ_INT(tail.n_tokens, 0);

	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 16);
	cai_kv_pool_free(pool);
}

TEST(prefix_cache_partial_tails_of_one_prefix)
{
	cai_kv_pool *pool = make_pool(16);
	cai_prefix_cache *cache = make_cache(pool, 16);
	int32_t		a[2 * BT];
	int32_t		b[2 * BT];
	int32_t		blocks[2];
	int32_t		covered[2];
	cai_prefix_cache_tail tail;

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	/* two continuations of one full block: a's tail of 9, b's of 12 diverging at its 4th */
	fill_tokens(a, 2 * BT, 3);
	memcpy(b, a, sizeof(b));
	for (int i = BT + 3; i < 2 * BT; i++)
		b[i] = -100 - i;
	insert_owned(cache, pool, 0, a, BT + 9, blocks);
	insert_owned(cache, pool, 0, b, BT + 12, blocks);
	CHECK_EQ_INT(stats_of(cache).blocks, 3);
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, a, 2 * BT, 2 * BT, &tail), 1);
	CHECK_EQ_INT(tail.n_tokens, 9);
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, b, 2 * BT, 2 * BT, &tail), 1);
	CHECK_EQ_INT(tail.n_tokens, 12);
	CHECK_EQ_INT(tail.block, blocks[1]);

	/* a tail that an existing one covers adds nothing */
	insert_owned(cache, pool, 0, a, BT + 5, covered);
	CHECK_EQ_INT(stats_of(cache).blocks, 3);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 16 - 3);
	/* a longer tail of a replaces the one it covers */
	insert_owned(cache, pool, 0, a, BT + 14, covered);
	CHECK_EQ_INT(stats_of(cache).blocks, 3);
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, a, 2 * BT, 2 * BT, &tail), 1);
	CHECK_EQ_INT(tail.n_tokens, 14);
	CHECK_EQ_INT(tail.block, covered[1]);
	/* a full block over a's tokens covers a's tail; b's stays */
	insert_owned(cache, pool, 0, a, 2 * BT, covered);
	CHECK_EQ_INT(stats_of(cache).blocks, 3);
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, b, 2 * BT, 2 * BT, &tail), 1);
	CHECK_EQ_INT(tail.n_tokens, 12);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 16 - 3);

	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 16);
	cai_kv_pool_free(pool);
}

static uint64_t
same_key_hash(const int32_t *tokens, int n, uint64_t seed)
{
	return 42;
}

TEST(prefix_cache_partial_tails_verified_and_evicted)
{
	cai_kv_pool *pool = make_pool(8);
	cai_prefix_cache *cache = make_cache(pool, 3);
	int32_t		a[BT];
	int32_t		b[BT];
	int32_t		blocks[2];
	cai_prefix_cache_tail tail;
	int32_t		found[4];

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	fill_tokens(a, BT, 4);
	fill_tokens(b, BT, 5);
	/* every key equal: the tokens alone decide */
	cai_prefix_cache_set_hash_for_testing(cache, same_key_hash);
	insert_owned(cache, pool, 0, a, 6, blocks);
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, b, BT, BT, &tail), 0);
	CHECK_EQ_INT(tail.block, -1);
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, a, BT, BT, &tail), 0);
	CHECK_EQ_INT(tail.n_tokens, 6);
	CHECK_EQ_INT(probe_tokens(cache, pool, 9, a, BT, BT, &tail), 0);
	CHECK_EQ_INT(tail.block, -1);
	cai_prefix_cache_set_hash_for_testing(cache, NULL);

	/* a tail a caller holds (between lookup and copy) survives reclaim; then it goes */
	insert_owned(cache, pool, 0, a, 6, blocks);
	CHECK_EQ_INT(cai_prefix_cache_lookup_tokens(cache, 0, a, BT, BT, found, 4, &tail), 0);
	CHECK_EQ_INT(tail.block, blocks[0]);
	CHECK_EQ_INT(cai_prefix_cache_reclaim(cache, 8), 0);
	CHECK_EQ_INT(stats_of(cache).blocks, 1);
	cai_kv_block_unref(pool, tail.block);
	CHECK_EQ_INT(cai_prefix_cache_reclaim(cache, 8), 1);
	CHECK_EQ_INT(stats_of(cache).blocks, 0);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 8);

	/* within a budget of 3: the least recently used tails go first */
	for (int i = 0; i < 4; i++)
	{
		fill_tokens(a, BT, 10 + i);
		insert_owned(cache, pool, 0, a, 3 + i, blocks);
		CHECK(stats_of(cache).blocks <= 3);
	}
	fill_tokens(a, BT, 10);
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, a, BT, BT, &tail), 0);
	CHECK_EQ_INT(tail.block, -1);
	fill_tokens(a, BT, 13);
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, a, BT, BT, &tail), 0);
	CHECK_EQ_INT(tail.n_tokens, 6);
	CHECK_EQ_INT(stats_of(cache).evictions, 2);	/* the reclaimed tail and the oldest */

	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 8);
	cai_kv_pool_free(pool);
}

TEST(prefix_cache_partial_hit_diverging_mid_block)
{
	cai_kv_pool *pool = make_pool(32);
	cai_prefix_cache *cache = make_cache(pool, 16);
	int32_t		a[4 * BT];
	int32_t		b[4 * BT];
	int32_t		a_blocks[4];
	int32_t		found[4];
	int			hit;

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	fill_tokens(a, 4 * BT, 3);
	insert_owned(cache, pool, 0, a, 4 * BT, a_blocks);

	/* b shares blocks 0-1, and block 2 differs only in its last token */
	memcpy(b, a, sizeof(a));
	b[3 * BT - 1] = -5;
	hit = cai_prefix_cache_lookup(cache, 0, b, 4 * BT, found, 4);
	CHECK_EQ_INT(hit, 2);
	CHECK_EQ_INT(found[0], a_blocks[0]);
	CHECK_EQ_INT(found[1], a_blocks[1]);
	unref_blocks(pool, found, hit);

	/* divergence at the first token of block 2 */
	memcpy(b, a, sizeof(a));
	b[2 * BT] = -5;
	CHECK_EQ_INT(probe(cache, pool, 0, b, 4 * BT, NULL), 2);

	/* divergence in block 0 loses everything, even though blocks 1-3 agree */
	memcpy(b, a, sizeof(a));
	b[3] = -5;
	CHECK_EQ_INT(probe(cache, pool, 0, b, 4 * BT, NULL), 0);
	CHECK_EQ_INT(stats_of(cache).collisions, 0);

	/* b's divergent tail is cached under a's first two blocks; both now hit in full */
	memcpy(b, a, sizeof(a));
	b[3 * BT - 1] = -5;
	{
		int32_t		b_blocks[4];

		CHECK(alloc_blocks(pool, b_blocks, 4));
		cai_prefix_cache_insert(cache, 0, b, 4 * BT, b_blocks, 4);
		/* blocks 0-1 were cached already: a's copies stay, b's own copies are not taken */
		CHECK_EQ_INT(cai_kv_block_refcount(pool, b_blocks[0]), 1);
		CHECK_EQ_INT(cai_kv_block_refcount(pool, b_blocks[2]), 2);
		unref_blocks(pool, b_blocks, 4);
		CHECK_EQ_INT(stats_of(cache).blocks, 6);
		hit = cai_prefix_cache_lookup(cache, 0, b, 4 * BT, found, 4);
		CHECK_EQ_INT(hit, 4);
		CHECK_EQ_INT(found[0], a_blocks[0]);
		CHECK_EQ_INT(found[2], b_blocks[2]);
		unref_blocks(pool, found, hit);
	}
	CHECK_EQ_INT(probe(cache, pool, 0, a, 4 * BT, NULL), 4);

	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 32);
	cai_kv_pool_free(pool);
}

/*
 * A prompt that leaves a cached chain inside a full block, or ends inside one, reuses that
 * block's rows to the token (the caller copies them), like a tail's; a tail that a full block
 * after the same prefix already holds is not stored again; many blocks after one prefix (every
 * conversation's first question after a shared system prompt) are still found.
 */
TEST(prefix_cache_reuses_full_blocks_to_the_token)
{
	enum
	{
		N_FOLLOWERS = 300
	};
	cai_kv_pool *pool = make_pool(2 * N_FOLLOWERS + 32);
	cai_prefix_cache *cache = make_cache(pool, 2 * N_FOLLOWERS + 16);
	int32_t		a[3 * BT];
	int32_t		b[3 * BT];
	int32_t		a_blocks[3];
	int32_t		blocks[3];
	cai_prefix_cache_tail tail;

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	fill_tokens(a, 3 * BT, 4);
	insert_owned(cache, pool, 0, a, 3 * BT, a_blocks);
	CHECK_EQ_INT(stats_of(cache).blocks, 3);

	/* b leaves a's chain at block 1's 10th token: block 0 whole, then 9 rows of a's block 1 */
	memcpy(b, a, sizeof(b));
	b[BT + 9] = -7;
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, b, 3 * BT, 3 * BT - 1, &tail), 1);
	CHECK_EQ_INT(tail.block, a_blocks[1]);
	CHECK_EQ_INT(tail.n_tokens, 9);
	/* the caller's reference on the block was taken and given back */
	CHECK_EQ_INT(cai_kv_block_refcount(pool, a_blocks[1]), 1);

	/* a prompt that ends inside a's block 2: the rows up to its last token but one */
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, a, 2 * BT + 6, 2 * BT + 5, &tail), 2);
	CHECK_EQ_INT(tail.block, a_blocks[2]);
	CHECK_EQ_INT(tail.n_tokens, 5);
	/* inside the first block: a root follower */
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, a, 8, 7, &tail), 0);
	CHECK_EQ_INT(tail.block, a_blocks[0]);
	CHECK_EQ_INT(tail.n_tokens, 7);
	/* another salt reuses nothing */
	CHECK_EQ_INT(probe_tokens(cache, pool, 1, a, 8, 7, &tail), 0);
	CHECK_EQ_INT(tail.block, -1);

	/* a sequence that stops inside a's block 1: its tail is a's block 1 already, not stored */
	insert_owned(cache, pool, 0, a, BT + 11, blocks);
	CHECK_EQ_INT(stats_of(cache).blocks, 3);
	CHECK_EQ_INT(cai_kv_block_refcount(pool, blocks[1]), 0);

	/* many full blocks after a's block 0, each diverging at its 4th token; the latest wins */
	for (int f = 0; f < N_FOLLOWERS; f++)
	{
		memcpy(b, a, sizeof(b));
		for (int i = BT + 3; i < 2 * BT; i++)
			b[i] = -1000 * (f + 1) - i;
		insert_owned(cache, pool, 0, b, 2 * BT, blocks);
	}
	CHECK_EQ_INT(stats_of(cache).blocks, 3 + N_FOLLOWERS);
	/* the last inserted agrees on 12 tokens of a prompt that follows it */
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, b, 2 * BT, BT + 12, &tail), 1);
	CHECK_EQ_INT(tail.block, blocks[1]);
	CHECK_EQ_INT(tail.n_tokens, 12);
	/* a's own block 1, filed first, is past the bounded scan: 3 shared tokens from a follower */
	CHECK_EQ_INT(probe_tokens(cache, pool, 0, a, 2 * BT, BT + 12, &tail), 1);
	CHECK_EQ_INT(tail.n_tokens, 3);

	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 2 * N_FOLLOWERS + 32);
	cai_kv_pool_free(pool);
}

TEST(prefix_cache_miss_after_eviction)
{
	cai_kv_pool *pool = make_pool(16);
	cai_prefix_cache *cache = make_cache(pool, 4);
	int32_t		a[4 * BT];
	int32_t		b[4 * BT];
	int32_t		blocks[4];
	cai_prefix_cache_stats s;

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	fill_tokens(a, 4 * BT, 4);
	fill_tokens(b, 4 * BT, 5);
	insert_owned(cache, pool, 0, a, 4 * BT, blocks);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 12);
	insert_owned(cache, pool, 0, b, 4 * BT, blocks);
	s = stats_of(cache);
	CHECK_EQ_INT(s.blocks, 4);
	CHECK_EQ_INT(s.evictions, 4);
	CHECK(s.bytes <= s.budget_bytes);
	/* a's blocks went back to the pool */
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 12);
	CHECK_EQ_INT(probe(cache, pool, 0, a, 4 * BT, NULL), 0);
	CHECK_EQ_INT(probe(cache, pool, 0, b, 4 * BT, NULL), 4);

	/* one more block evicts only b's deepest block: paths are evicted bottom-up */
	insert_owned(cache, pool, 0, a, BT, blocks);
	CHECK_EQ_INT(probe(cache, pool, 0, b, 4 * BT, NULL), 3);
	CHECK_EQ_INT(probe(cache, pool, 0, a, 4 * BT, NULL), 1);

	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 16);
	cai_kv_pool_free(pool);
}

TEST(prefix_cache_lru_order)
{
	cai_kv_pool *pool = make_pool(16);
	cai_prefix_cache *cache = make_cache(pool, 4);
	int32_t		a[2 * BT];
	int32_t		b[2 * BT];
	int32_t		c[2 * BT];
	int32_t		blocks[2];

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	fill_tokens(a, 2 * BT, 6);
	fill_tokens(b, 2 * BT, 7);
	fill_tokens(c, 2 * BT, 8);
	insert_owned(cache, pool, 0, a, 2 * BT, blocks);
	insert_owned(cache, pool, 0, b, 2 * BT, blocks);
	/* a is older, but using it makes b the least recently used */
	CHECK_EQ_INT(probe(cache, pool, 0, a, 2 * BT, NULL), 2);
	insert_owned(cache, pool, 0, c, 2 * BT, blocks);
	CHECK_EQ_INT(probe(cache, pool, 0, b, 2 * BT, NULL), 0);
	CHECK_EQ_INT(probe(cache, pool, 0, a, 2 * BT, NULL), 2);
	CHECK_EQ_INT(probe(cache, pool, 0, c, 2 * BT, NULL), 2);

	/*
	 * Using only a's first block protects it, not a's second block, once that block has gone
	 * unused for longer than these prefixes typically come back (two more lookups of c): stale
	 * blocks go least recently used first.
	 */
	CHECK_EQ_INT(probe(cache, pool, 0, c, 2 * BT, NULL), 2);
	CHECK_EQ_INT(probe(cache, pool, 0, a, BT, NULL), 1);
	CHECK_EQ_INT(probe(cache, pool, 0, c, 2 * BT, NULL), 2);
	CHECK_EQ_INT(probe(cache, pool, 0, c, 2 * BT, NULL), 2);
	insert_owned(cache, pool, 0, b, BT, blocks);
	CHECK_EQ_INT(probe(cache, pool, 0, a, 2 * BT, NULL), 1);
	CHECK_EQ_INT(probe(cache, pool, 0, c, 2 * BT, NULL), 2);
	CHECK_EQ_INT(probe(cache, pool, 0, b, 2 * BT, NULL), 1);

	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 16);
	cai_kv_pool_free(pool);
}

/* Whether play_turn's conversations share one salt and their first block (a system prompt). */
static bool turn_shared_prefix = false;

/*
 * One turn of conversation tag: looks its prompt of n_blocks blocks up, then offers the prompt
 * back; returns the blocks the lookup hit.  Each conversation has its own salt, or, with
 * turn_shared_prefix, all have salt 0 and the same first block.
 */
static int
play_turn(cai_prefix_cache *cache, cai_kv_pool *pool, int tag, int n_blocks)
{
	int32_t		tokens[8 * BT];
	int32_t		blocks[8];
	uint64_t	salt = turn_shared_prefix ? 0 : (uint64_t) tag;
	int			hit;

	fill_tokens(tokens, n_blocks * BT, tag);
	if (turn_shared_prefix)
		fill_tokens(tokens, BT, 39);
	hit = probe(cache, pool, salt, tokens, n_blocks * BT, NULL);
	insert_owned(cache, pool, salt, tokens, n_blocks * BT, blocks);
	return hit;
}

/*
 * Conversations that come back in a cycle longer than the cache holds: least recently used
 * eviction always drops the conversation asked next and nothing is ever hit.  The cache instead
 * keeps what it holds (every block in it is reused once a cycle) and hits it every turn.
 */
static void
check_cycle_keeps_a_stable_subset(bool shared_prefix)
{
	cai_kv_pool *pool = make_pool(32);
	cai_prefix_cache *cache = make_cache(pool, 8);
	int			hits_late = 0;

	turn_shared_prefix = shared_prefix;
	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	/* 4 conversations growing by a block a turn: 24 blocks by the end, 8 cached */
	for (int turn = 0; turn < 6; turn++)
	{
		for (int c = 0; c < 4; c++)
		{
			int			hit = play_turn(cache, pool, 40 + c, turn + 1);

			if (turn >= 3)
				hits_late += hit;
			CHECK(stats_of(cache).bytes <= stats_of(cache).budget_bytes);
		}
	}
	/*
	 * Most of the 8 cached blocks are hit on each of the last 3 turns (the blocks a turn adds
	 * push out the previous turn's, which no lookup has reused yet)
	 */
	CHECK(hits_late >= 3 * 6);
	CHECK_EQ_INT(stats_of(cache).blocks, 8);

	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 32);
	cai_kv_pool_free(pool);
	turn_shared_prefix = false;
}

TEST(prefix_cache_cycle_larger_than_the_cache_keeps_a_stable_subset)
{
	check_cycle_keeps_a_stable_subset(false);
}

/*
 * The same when every conversation starts with one system prompt under one salt: that prefix
 * recurs at every request, the conversations' own blocks only once a cycle, and the latter is
 * the interval that tells whether the oldest block is stale.
 */
TEST(prefix_cache_cycle_with_a_shared_system_prompt_keeps_a_stable_subset)
{
	check_cycle_keeps_a_stable_subset(true);
}

/*
 * Keeping what is cached must not shut new conversations out for good: blocks unused for longer
 * than cached prefixes typically come back are stale and go least recently used first.
 */
TEST(prefix_cache_stale_blocks_make_room_for_active_conversations)
{
	cai_kv_pool *pool = make_pool(32);
	cai_prefix_cache *cache = make_cache(pool, 8);

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	/* a cycle of 4 conversations of 2 blocks fills the cache, then stops */
	for (int turn = 0; turn < 3; turn++)
		for (int c = 0; c < 4; c++)
			CHECK_EQ_INT(play_turn(cache, pool, 50 + c, 2), turn > 0 ? 2 : 0);
	CHECK_EQ_INT(stats_of(cache).blocks, 8);

	/*
	 * Two new conversations take turns, growing to 3 blocks each (6 fit): soon each hits all of
	 * its previous turn
	 */
	for (int turn = 0; turn < 6; turn++)
		for (int c = 0; c < 2; c++)
		{
			int			hit = play_turn(cache, pool, 60 + c, turn < 3 ? turn + 1 : 3);

			if (turn >= 2)
				CHECK_EQ_INT(hit, turn < 3 ? turn : 3);
		}
	CHECK_EQ_INT(stats_of(cache).blocks, 8);

	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 32);
	cai_kv_pool_free(pool);
}

/*
 * When nothing is stale, the newest blocks no lookup has reused yet make room (so a
 * conversation's latest turn is cached for its next one), unless a sequence holds them; the
 * reused ones stay, and with no such room the new blocks are not cached.
 */
TEST(prefix_cache_newest_unreused_blocks_make_room_unless_pinned)
{
	cai_kv_pool *pool = make_pool(32);
	cai_prefix_cache *cache = make_cache(pool, 8);
	int32_t		r[2 * BT];
	int32_t		s[2 * BT];
	int32_t		r_blocks[2];
	int32_t		s_blocks[2];

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	fill_tokens(r, 2 * BT, 74);
	fill_tokens(s, 2 * BT, 75);
	/* three conversations of 2 blocks, each reused every third lookup */
	for (int turn = 0; turn < 4; turn++)
		for (int c = 0; c < 3; c++)
			play_turn(cache, pool, 70 + c, 2);
	CHECK_EQ_INT(stats_of(cache).blocks, 6);

	/* r fills the cache; s needs r's room while a sequence still holds r: not cached */
	CHECK(alloc_blocks(pool, r_blocks, 2));
	cai_prefix_cache_insert(cache, 74, r, 2 * BT, r_blocks, 2);
	insert_owned(cache, pool, 75, s, 2 * BT, s_blocks);
	CHECK_EQ_INT(stats_of(cache).evictions, 0);
	CHECK_EQ_INT(stats_of(cache).blocks, 8);

	/* r released: s takes its place, the reused conversations stay */
	unref_blocks(pool, r_blocks, 2);
	insert_owned(cache, pool, 75, s, 2 * BT, s_blocks);
	CHECK_EQ_INT(stats_of(cache).evictions, 2);
	CHECK_EQ_INT(probe(cache, pool, 75, s, 2 * BT, NULL), 2);
	CHECK_EQ_INT(probe(cache, pool, 74, r, 2 * BT, NULL), 0);
	for (int c = 0; c < 3; c++)
	{
		int32_t		tokens[2 * BT];

		fill_tokens(tokens, 2 * BT, 70 + c);
		CHECK_EQ_INT(probe(cache, pool, (uint64_t) (70 + c), tokens, 2 * BT, NULL), 2);
	}

	/* s has been reused and nothing is fresh or stale: a new conversation is not cached */
	fill_tokens(r, 2 * BT, 76);
	insert_owned(cache, pool, 76, r, 2 * BT, r_blocks);
	CHECK_EQ_INT(stats_of(cache).evictions, 2);
	CHECK_EQ_INT(probe(cache, pool, 76, r, 2 * BT, NULL), 0);
	CHECK_EQ_INT(probe(cache, pool, 75, s, 2 * BT, NULL), 2);

	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 32);
	cai_kv_pool_free(pool);
}

/* Every block gets the same key. */
static uint64_t
constant_hash(const int32_t *tokens, int n, uint64_t seed)
{
	return 42;
}

/* A block's key ignores its prefix: the same block at two places collides. */
static uint64_t
prefix_blind_hash(const int32_t *tokens, int n, uint64_t seed)
{
	uint64_t	h = 1469598103934665603ULL;

	for (int i = 0; i < n; i++)
		h = (h ^ (uint32_t) tokens[i]) * 1099511628211ULL;
	return h;
}

TEST(prefix_cache_forced_collisions_are_rejected)
{
	cai_kv_pool *pool = make_pool(32);
	cai_prefix_cache *cache = make_cache(pool, 16);
	int32_t		a[4 * BT];
	int32_t		b[4 * BT];
	int32_t		a_blocks[4];
	int32_t		b_blocks[4];
	int32_t		found[4];
	uint64_t	collisions;
	int			hit;

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	cai_prefix_cache_set_hash_for_testing(cache, constant_hash);
	fill_tokens(a, 4 * BT, 9);
	fill_tokens(b, 4 * BT, 10);

	/* a's block 1 collides with a's block 0 (other parent): only block 0 gets in */
	insert_owned(cache, pool, 0, a, 4 * BT, a_blocks);
	CHECK_EQ_INT(stats_of(cache).blocks, 1);
	CHECK_EQ_INT(stats_of(cache).collisions, 1);

	/* b's block 0 has a's key but other tokens: rejected, counted, nothing handed out */
	collisions = stats_of(cache).collisions;
	found[0] = -1;
	hit = cai_prefix_cache_lookup(cache, 0, b, 4 * BT, found, 4);
	CHECK_EQ_INT(hit, 0);
	CHECK_EQ_INT(found[0], -1);
	CHECK_EQ_INT(stats_of(cache).collisions, collisions + 1);
	CHECK_EQ_INT(cai_kv_block_refcount(pool, a_blocks[0]), 1);

	/* inserting b cannot displace a's node */
	insert_owned(cache, pool, 0, b, 4 * BT, b_blocks);
	CHECK_EQ_INT(stats_of(cache).blocks, 1);
	hit = cai_prefix_cache_lookup(cache, 0, a, 4 * BT, found, 4);
	CHECK_EQ_INT(hit, 1);
	CHECK_EQ_INT(found[0], a_blocks[0]);
	unref_blocks(pool, found, hit);

	/* the same tokens under another salt hit the key but not the namespace */
	CHECK_EQ_INT(probe(cache, pool, 1, a, 4 * BT, NULL), 0);

	/* a prefix-blind hash: b = (a's block 1, ...) finds a's block 1 by key, wrong parent */
	cai_prefix_cache_set_hash_for_testing(cache, prefix_blind_hash);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 32);
	insert_owned(cache, pool, 0, a, 2 * BT, a_blocks);
	CHECK_EQ_INT(stats_of(cache).blocks, 2);
	memcpy(b, a + BT, BT * sizeof(int32_t));
	collisions = stats_of(cache).collisions;
	CHECK_EQ_INT(probe(cache, pool, 0, b, 2 * BT, NULL), 0);
	CHECK_EQ_INT(stats_of(cache).collisions, collisions + 1);
	CHECK_EQ_INT(probe(cache, pool, 0, a, 2 * BT, NULL), 2);

	/* back to XXH3: no collision between those two */
	cai_prefix_cache_set_hash_for_testing(cache, NULL);
	insert_owned(cache, pool, 0, a, 2 * BT, a_blocks);
	collisions = stats_of(cache).collisions;
	CHECK_EQ_INT(probe(cache, pool, 0, b, 2 * BT, NULL), 0);
	CHECK_EQ_INT(stats_of(cache).collisions, collisions);

	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 32);
	cai_kv_pool_free(pool);
}

TEST(prefix_cache_salts_isolate)
{
	cai_kv_pool *pool = make_pool(32);
	cai_prefix_cache *cache = make_cache(pool, 16);
	int32_t		a[3 * BT];
	int32_t		blocks_1[3];
	int32_t		blocks_2[3];
	int32_t		found[3];
	int			hit;

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	fill_tokens(a, 3 * BT, 11);
	insert_owned(cache, pool, 1, a, 3 * BT, blocks_1);
	CHECK_EQ_INT(probe(cache, pool, 2, a, 3 * BT, NULL), 0);
	CHECK_EQ_INT(probe(cache, pool, 0, a, 3 * BT, NULL), 0);
	CHECK_EQ_INT(probe(cache, pool, 1, a, 3 * BT, NULL), 3);

	/* the same tokens cached under salt 2 get their own blocks */
	insert_owned(cache, pool, 2, a, 3 * BT, blocks_2);
	CHECK_EQ_INT(stats_of(cache).blocks, 6);
	hit = cai_prefix_cache_lookup(cache, 2, a, 3 * BT, found, 3);
	CHECK_EQ_INT(hit, 3);
	for (int i = 0; i < hit; i++)
		CHECK_EQ_INT(found[i], blocks_2[i]);
	unref_blocks(pool, found, hit);
	hit = cai_prefix_cache_lookup(cache, 1, a, 3 * BT, found, 3);
	CHECK_EQ_INT(hit, 3);
	for (int i = 0; i < hit; i++)
		CHECK_EQ_INT(found[i], blocks_1[i]);
	unref_blocks(pool, found, hit);
	CHECK_EQ_INT(probe(cache, pool, 0, a, 3 * BT, NULL), 0);

	/* a cache for another model (fingerprint) shares nothing either */
	{
		cai_prefix_cache *other = NULL;
		cai_error	err;

		CHECK(cai_prefix_cache_create(pool, 16 * 256, 0xfeed, &other, &err) == CAI_OK);
		if (other)
		{
			CHECK_EQ_INT(probe(other, pool, 1, a, 3 * BT, NULL), 0);
			cai_prefix_cache_free(other);
		}
	}
	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 32);
	cai_kv_pool_free(pool);
}

TEST(prefix_cache_pinned_blocks_are_never_evicted)
{
	cai_kv_pool *pool = make_pool(16);
	cai_prefix_cache *cache = make_cache(pool, 2);
	int32_t		a[2 * BT];
	int32_t		b[2 * BT];
	int32_t		a_blocks[2];
	int32_t		b_blocks[2];

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	fill_tokens(a, 2 * BT, 12);
	fill_tokens(b, 2 * BT, 13);
	/* the test keeps its references on a: a running sequence */
	CHECK(alloc_blocks(pool, a_blocks, 2));
	cai_prefix_cache_insert(cache, 0, a, 2 * BT, a_blocks, 2);

	/* b does not fit, and nothing may make room */
	insert_owned(cache, pool, 0, b, 2 * BT, b_blocks);
	CHECK_EQ_INT(stats_of(cache).blocks, 2);
	CHECK_EQ_INT(stats_of(cache).evictions, 0);
	CHECK_EQ_INT(probe(cache, pool, 0, b, 2 * BT, NULL), 0);
	CHECK_EQ_INT(cai_prefix_cache_reclaim(cache, 16), 0);
	CHECK_EQ_INT(probe(cache, pool, 0, a, 2 * BT, NULL), 2);

	/* releasing a's leaf only: one block of b fits, a's first block stays */
	cai_kv_block_unref(pool, a_blocks[1]);
	insert_owned(cache, pool, 0, b, 2 * BT, b_blocks);
	CHECK_EQ_INT(stats_of(cache).evictions, 1);
	CHECK_EQ_INT(probe(cache, pool, 0, a, 2 * BT, NULL), 1);
	CHECK_EQ_INT(probe(cache, pool, 0, b, 2 * BT, NULL), 1);
	CHECK_EQ_INT(cai_kv_block_refcount(pool, a_blocks[0]), 2);

	cai_kv_block_unref(pool, a_blocks[0]);
	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 16);
	cai_kv_pool_free(pool);
}

/*
 * An insert that extends a cached prefix with copies of its own must not evict the node it is
 * extending, even when that node is the only unpinned leaf left.
 */
TEST(prefix_cache_insert_keeps_the_prefix_it_extends)
{
	cai_kv_pool *pool = make_pool(8);
	cai_prefix_cache *cache = make_cache(pool, 1);
	int32_t		a[2 * BT];
	int32_t		a_blocks[2];
	int32_t		copies[2];
	int32_t		found[2];
	int			hit;

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	fill_tokens(a, 2 * BT, 19);
	insert_owned(cache, pool, 0, a, BT, a_blocks);
	/* the caller recomputed block 0 into a copy of its own, and adds block 1 */
	CHECK(alloc_blocks(pool, copies, 2));
	cai_prefix_cache_insert(cache, 0, a, 2 * BT, copies, 2);
	CHECK_EQ_INT(stats_of(cache).blocks, 1);
	CHECK_EQ_INT(stats_of(cache).evictions, 0);
	CHECK_EQ_INT(cai_kv_block_refcount(pool, copies[1]), 1);
	hit = cai_prefix_cache_lookup(cache, 0, a, 2 * BT, found, 2);
	CHECK_EQ_INT(hit, 1);
	CHECK_EQ_INT(found[0], a_blocks[0]);
	unref_blocks(pool, found, hit);
	unref_blocks(pool, copies, 2);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 7);
	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 8);
	cai_kv_pool_free(pool);
}

TEST(prefix_cache_reclaim_frees_unpinned_leaves)
{
	cai_kv_pool *pool = make_pool(8);
	cai_prefix_cache *cache = make_cache(pool, 8);
	int32_t		a[4 * BT];
	int32_t		b[4 * BT];
	int32_t		blocks[4];
	int32_t		held[2];
	int			hit;

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	fill_tokens(a, 4 * BT, 14);
	fill_tokens(b, 4 * BT, 15);
	insert_owned(cache, pool, 0, a, 4 * BT, blocks);
	insert_owned(cache, pool, 0, b, 4 * BT, blocks);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 0);

	/* a is older: its three deepest blocks go */
	CHECK_EQ_INT(cai_prefix_cache_reclaim(cache, 3), 3);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 3);
	CHECK_EQ_INT(probe(cache, pool, 0, a, 4 * BT, NULL), 1);
	CHECK_EQ_INT(probe(cache, pool, 0, b, 4 * BT, NULL), 4);
	CHECK_EQ_INT(cai_prefix_cache_reclaim(cache, 2), 0);	/* already enough */

	/* a sequence holds b's first two blocks: reclaiming everything leaves exactly those */
	hit = cai_prefix_cache_lookup(cache, 0, b, 2 * BT, held, 2);
	CHECK_EQ_INT(hit, 2);
	CHECK_EQ_INT(cai_prefix_cache_reclaim(cache, 8), 3);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 6);
	CHECK_EQ_INT(stats_of(cache).blocks, 2);
	CHECK_EQ_INT(probe(cache, pool, 0, b, 4 * BT, NULL), 2);
	unref_blocks(pool, held, hit);
	CHECK_EQ_INT(cai_prefix_cache_reclaim(cache, 8), 2);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 8);
	CHECK_EQ_INT(stats_of(cache).blocks, 0);

	cai_prefix_cache_free(cache);
	cai_kv_pool_free(pool);
}

/*
 * A windowed model's blocks (kv.h): one global and two windowed layers of 256 bytes each.  A node
 * costs what its block holds, so blocks that dropped their window part cost a third; between two
 * copies of a block the cache keeps the one with its window part; and evicting a leaf takes the
 * ancestors it leaves as leaves without windowed KV, which no lookup could resume from.
 */
TEST(prefix_cache_counts_window_parts_and_drops_windowless_leaves)
{
	cai_kv_layout layout = {0};
	cai_kv_pool *pool = NULL;
	cai_prefix_cache *cache = NULL;
	cai_error	err;
	int32_t		a[4 * BT];
	int32_t		b[2 * BT];
	int32_t		blocks[4];
	int32_t		copy;
	size_t		part;

	layout.n_kv_layers = 3;
	layout.n_windowed_layers = 2;
	layout.window = BT;
	layout.n_kv_heads = 1;
	layout.head_dim = 4;
	layout.layer_bytes = 2 * BT * 4 + 2 * BT * sizeof(float);
	layout.block_bytes = 3 * layout.layer_bytes;
	part = layout.layer_bytes;
	CHECK(cai_kv_pool_create_windowed(&layout, 16, 8, &pool, &err) == CAI_OK);
	/* a budget of 8 global parts, or 2 whole blocks and 2 global parts */
	CHECK(pool && cai_prefix_cache_create(pool, 8 * part, UINT64_C(0x5eed), &cache, &err) == CAI_OK);
	if (!pool || !cache)
		goto done;

	/* a's four blocks, only the last two with window parts: 1 + 1 + 3 + 3 parts */
	fill_tokens(a, 4 * BT, 21);
	for (int i = 0; i < 4; i++)
		blocks[i] = i < 2 ? cai_kv_block_alloc_without_window(pool) : cai_kv_block_alloc(pool);
	cai_prefix_cache_insert(cache, 0, a, 4 * BT, blocks, 4);
	unref_blocks(pool, blocks, 4);
	CHECK_EQ_INT((int) stats_of(cache).blocks, 4);
	CHECK_EQ_INT((int) stats_of(cache).bytes, (int) (8 * part));

	/*
	 * b shares nothing with a and needs room: a's deepest block goes first, and with it its
	 * ancestors up to the first one that keeps windowed KV (the third), not the first two.
	 */
	fill_tokens(b, 2 * BT, 22);
	blocks[0] = cai_kv_block_alloc_without_window(pool);
	blocks[1] = cai_kv_block_alloc_without_window(pool);
	cai_prefix_cache_insert(cache, 0, b, 2 * BT, blocks, 2);
	unref_blocks(pool, blocks, 2);
	CHECK_EQ_INT(probe(cache, pool, 0, a, 4 * BT, NULL), 3);
	CHECK_EQ_INT(probe(cache, pool, 0, b, 2 * BT, NULL), 2);
	CHECK_EQ_INT((int) stats_of(cache).bytes, (int) (7 * part));

	/* a's third block evicted next takes the two windowless ones before it along */
	CHECK_EQ_INT(cai_prefix_cache_reclaim(cache, cai_kv_pool_n_free(pool) + 1), 3);
	CHECK_EQ_INT(probe(cache, pool, 0, a, 4 * BT, NULL), 0);
	CHECK_EQ_INT((int) stats_of(cache).bytes, (int) (2 * part));

	/* offered a copy of b's first block that kept its window part, the cache takes it */
	copy = cai_kv_block_alloc(pool);
	blocks[0] = copy;
	cai_prefix_cache_insert(cache, 0, b, BT, blocks, 1);
	CHECK_EQ_INT(cai_kv_block_refcount(pool, copy), 2);
	cai_kv_block_unref(pool, copy);
	CHECK_EQ_INT(probe(cache, pool, 0, b, BT, blocks), 1);
	CHECK_EQ_INT(blocks[0], copy);
	CHECK_EQ_INT((int) stats_of(cache).bytes, (int) (4 * part));
done:
	cai_prefix_cache_free(cache);
	cai_kv_pool_free(pool);
}

TEST(prefix_cache_reset_and_free_release_everything)
{
	cai_kv_pool *pool = make_pool(16);
	cai_prefix_cache *cache = make_cache(pool, 16);
	int32_t		a[4 * BT];
	int32_t		kept[4];
	int32_t		blocks[4];

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	fill_tokens(a, 4 * BT, 16);
	CHECK(alloc_blocks(pool, kept, 4));
	cai_prefix_cache_insert(cache, 3, a, 4 * BT, kept, 4);
	fill_tokens(a, 4 * BT, 17);
	insert_owned(cache, pool, 3, a, 4 * BT, blocks);
	CHECK_EQ_INT(stats_of(cache).blocks, 8);

	cai_prefix_cache_reset(cache);
	CHECK_EQ_INT(stats_of(cache).blocks, 0);
	CHECK_EQ_INT(stats_of(cache).bytes, 0);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 12);
	for (int i = 0; i < 4; i++)
		CHECK_EQ_INT(cai_kv_block_refcount(pool, kept[i]), 1);
	CHECK_EQ_INT(probe(cache, pool, 3, a, 4 * BT, NULL), 0);
	unref_blocks(pool, kept, 4);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 16);

	/* the cache works after a reset, and free drops what it holds */
	insert_owned(cache, pool, 3, a, 4 * BT, blocks);
	CHECK_EQ_INT(probe(cache, pool, 3, a, 4 * BT, NULL), 4);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 12);
	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 16);
	cai_kv_pool_free(pool);
}

TEST(prefix_cache_disabled_by_zero_budget)
{
	cai_kv_pool *pool = make_pool(8);
	cai_prefix_cache *cache = make_cache(pool, 0);
	int32_t		a[2 * BT];
	int32_t		blocks[2];

	if (!pool || !cache)
	{
		CHECK(false);
		return;
	}
	fill_tokens(a, 2 * BT, 18);
	CHECK(alloc_blocks(pool, blocks, 2));
	cai_prefix_cache_insert(cache, 0, a, 2 * BT, blocks, 2);
	CHECK_EQ_INT(cai_kv_block_refcount(pool, blocks[0]), 1);
	CHECK_EQ_INT(probe(cache, pool, 0, a, 2 * BT, NULL), 0);
	CHECK_EQ_INT(stats_of(cache).blocks, 0);
	CHECK_EQ_INT(cai_prefix_cache_reclaim(cache, 8), 0);
	unref_blocks(pool, blocks, 2);
	cai_prefix_cache_free(cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(pool), 8);
	cai_kv_pool_free(pool);
}

/* ---- random churn ---------------------------------------------------------------------------- */

#define CHURN_POOL_BLOCKS 48
#define CHURN_BUDGET_BLOCKS 20
#define CHURN_MAX_BLOCKS 8
#define CHURN_MAX_TOKENS (CHURN_MAX_BLOCKS * BT)
#define CHURN_LIBRARY 12
#define CHURN_RUNNING 4

typedef struct churn_seq
{
	int32_t		tokens[CHURN_MAX_TOKENS];
	int			n_tokens;
	uint64_t	salt;
	int32_t		blocks[CHURN_MAX_BLOCKS];
	int			n_blocks;
	int			n_cached;		/* leading blocks that came from the cache */
	bool		live;
} churn_seq;

typedef struct churn_state
{
	cai_kv_pool *pool;
	cai_prefix_cache *cache;
	uint64_t	rng;
	int			holders[CHURN_POOL_BLOCKS];	/* references the test holds per block */
	churn_seq	library[CHURN_LIBRARY];	/* past conversations to share prefixes with */
	churn_seq	running[CHURN_RUNNING];
	int			wrong_blocks;
} churn_state;

static uint32_t
churn_rand(churn_state *st, uint32_t bound)
{
	st->rng ^= st->rng << 13;
	st->rng ^= st->rng >> 7;
	st->rng ^= st->rng << 17;
	return (uint32_t) ((st->rng >> 11) % bound);
}

/* What block i of tokens must hold: a checksum of the salt and the whole prefix up to it. */
static uint64_t
prefix_stamp(uint64_t salt, const int32_t *tokens, int n_tokens)
{
	uint64_t	h = 14695981039346656037ULL ^ salt;

	for (int i = 0; i < n_tokens; i++)
		h = (h ^ (uint32_t) tokens[i]) * 1099511628211ULL;
	return h ^ (uint64_t) n_tokens;
}

static void
stamp_block(churn_state *st, int32_t block, uint64_t stamp)
{
	memcpy(cai_kv_block_layer(st->pool, block, 0), &stamp, sizeof(stamp));
}

static uint64_t
block_stamp(churn_state *st, int32_t block)
{
	uint64_t	stamp;

	memcpy(&stamp, cai_kv_block_layer(st->pool, block, 0), sizeof(stamp));
	return stamp;
}

/* Checks that each of the first hit blocks holds the KV of exactly this prefix. */
static void
check_hit_content(churn_state *st, uint64_t salt, const int32_t *tokens, const int32_t *blocks,
				  int hit)
{
	for (int i = 0; i < hit; i++)
		if (block_stamp(st, blocks[i]) != prefix_stamp(salt, tokens, (i + 1) * BT))
			st->wrong_blocks++;
}

static void
churn_release(churn_state *st, churn_seq *seq)
{
	for (int i = 0; i < seq->n_blocks; i++)
	{
		cai_kv_block_unref(st->pool, seq->blocks[i]);
		st->holders[seq->blocks[i]]--;
	}
	seq->live = false;
	seq->n_blocks = 0;
}

/* Starts a sequence: a new turn of a past conversation, or a fresh one; reuses what is cached. */
static void
churn_start(churn_state *st, churn_seq *seq)
{
	const churn_seq *base = &st->library[churn_rand(st, CHURN_LIBRARY)];
	int			keep = 0;
	int			needed;
	int			hit;

	seq->salt = churn_rand(st, 3);
	if (base->n_tokens > 0 && churn_rand(st, 4) != 0)
	{
		seq->salt = base->salt;
		keep = (int) churn_rand(st, (uint32_t) base->n_tokens + 1);
		if (keep >= CHURN_MAX_TOKENS)
			keep = CHURN_MAX_TOKENS - 1;
		memcpy(seq->tokens, base->tokens, (size_t) keep * sizeof(int32_t));
	}
	seq->n_tokens = keep + 1 + (int) churn_rand(st, (uint32_t) (CHURN_MAX_TOKENS - keep));
	if (seq->n_tokens > CHURN_MAX_TOKENS)
		seq->n_tokens = CHURN_MAX_TOKENS;
	/* a small vocabulary makes accidental agreement (and mid-block divergence) common */
	for (int i = keep; i < seq->n_tokens; i++)
		seq->tokens[i] = (int32_t) churn_rand(st, 3);

	hit = cai_prefix_cache_lookup(st->cache, seq->salt, seq->tokens, seq->n_tokens, seq->blocks,
								  CHURN_MAX_BLOCKS);
	check_hit_content(st, seq->salt, seq->tokens, seq->blocks, hit);
	for (int i = 0; i < hit; i++)
		st->holders[seq->blocks[i]]++;
	seq->n_blocks = hit;
	seq->n_cached = hit;
	seq->live = true;

	needed = (seq->n_tokens + BT - 1) / BT;
	while (seq->n_blocks < needed)
	{
		int32_t		block = cai_kv_block_alloc(st->pool);
		int			end;

		if (block < 0 && cai_prefix_cache_reclaim(st->cache, 1) > 0)
			block = cai_kv_block_alloc(st->pool);
		if (block < 0)
		{
			churn_release(st, seq);	/* out of KV: the request is refused */
			return;
		}
		st->holders[block]++;
		end = (seq->n_blocks + 1) * BT;
		if (end > seq->n_tokens)
			end = seq->n_tokens;
		stamp_block(st, block, prefix_stamp(seq->salt, seq->tokens, end));
		seq->blocks[seq->n_blocks++] = block;
	}
}

/* Checks the budget and that every block's refcount is the test's holds plus the cache's one. */
static bool
churn_consistent(churn_state *st)
{
	cai_prefix_cache_stats s;
	uint64_t	cached = 0;
	int			n_zero = 0;
	bool		ok = true;

	cai_prefix_cache_get_stats(st->cache, &s);
	if (s.bytes > s.budget_bytes || s.bytes != s.blocks * 256)
		ok = false;
	for (int b = 0; b < CHURN_POOL_BLOCKS; b++)
	{
		int			extra = cai_kv_block_refcount(st->pool, b) - st->holders[b];

		if (extra != 0 && extra != 1)
			ok = false;
		cached += (uint64_t) extra;
		if (cai_kv_block_refcount(st->pool, b) == 0)
			n_zero++;
	}
	if (cached != s.blocks || n_zero != cai_kv_pool_n_free(st->pool))
		ok = false;
	return ok && st->wrong_blocks == 0;
}

/* A weak hash: 32 keys in all, so collisions are constant, yet the budget still fills. */
static uint64_t
weak_hash(const int32_t *tokens, int n, uint64_t seed)
{
	uint64_t	h = seed;

	for (int i = 0; i < n; i++)
		h = h * 31 + (uint32_t) tokens[i];
	return (h ^ (h >> 17)) & 31;
}

static void
run_churn(uint64_t (*hash) (const int32_t *, int, uint64_t), int n_ops, uint64_t seed)
{
	churn_state *st = calloc(1, sizeof(churn_state));
	cai_prefix_cache_stats s;
	int			op = 0;

	CHECK(st != NULL);
	if (!st)
		return;
	st->rng = seed;
	st->pool = make_pool(CHURN_POOL_BLOCKS);
	st->cache = st->pool ? make_cache(st->pool, CHURN_BUDGET_BLOCKS) : NULL;
	CHECK(st->pool && st->cache);
	if (!st->pool || !st->cache)
		goto done;
	if (hash)
		cai_prefix_cache_set_hash_for_testing(st->cache, hash);

	for (op = 0; op < n_ops; op++)
	{
		uint32_t	what = churn_rand(st, 10);
		churn_seq  *seq = &st->running[churn_rand(st, CHURN_RUNNING)];

		if (what < 4)
		{
			/* finish a sequence: offer its blocks, remember it as a conversation, release */
			if (!seq->live)
				churn_start(st, seq);
			else
			{
				cai_prefix_cache_insert(st->cache, seq->salt, seq->tokens, seq->n_tokens,
										seq->blocks, seq->n_blocks);
				st->library[churn_rand(st, CHURN_LIBRARY)] = *seq;
				churn_release(st, seq);
			}
		}
		else if (what < 5)
		{
			if (seq->live)
				churn_release(st, seq);	/* cancelled: nothing offered */
		}
		else if (what < 7)
		{
			/* a running sequence's cached blocks are pinned: still cached, same ids */
			if (seq->live && seq->n_cached > 0)
			{
				int32_t		found[CHURN_MAX_BLOCKS];
				int			hit = cai_prefix_cache_lookup(st->cache, seq->salt, seq->tokens,
														  seq->n_tokens, found, seq->n_cached);

				CHECK_EQ_INT(hit, seq->n_cached);
				for (int i = 0; i < hit; i++)
					CHECK_EQ_INT(found[i], seq->blocks[i]);
				unref_blocks(st->pool, found, hit);
			}
		}
		else if (what < 9)
		{
			/* a bare lookup of some past conversation's prefix */
			const churn_seq *past = &st->library[churn_rand(st, CHURN_LIBRARY)];
			int32_t		found[CHURN_MAX_BLOCKS];
			int			n = (int) churn_rand(st, (uint32_t) past->n_tokens + 1);
			int			hit = cai_prefix_cache_lookup(st->cache, past->salt, past->tokens, n,
													  found, CHURN_MAX_BLOCKS);

			check_hit_content(st, past->salt, past->tokens, found, hit);
			unref_blocks(st->pool, found, hit);
		}
		else
			cai_prefix_cache_reclaim(st->cache, (int) churn_rand(st, 12));

		if (!churn_consistent(st) || test_current_failures > 0)
		{
			CHECK_MSG(false, "inconsistent after op %d (wrong blocks %d)", op, st->wrong_blocks);
			break;
		}
	}

	cai_prefix_cache_get_stats(st->cache, &s);
	if (getenv("CAI_TEST_VERBOSE"))
		fprintf(stderr, "    %d ops: %llu lookups, %llu/%llu tokens hit, %llu inserted, "
				"%llu evicted, %llu collisions\n", op,
				(unsigned long long) s.lookups, (unsigned long long) s.hit_tokens,
				(unsigned long long) s.lookup_tokens, (unsigned long long) s.inserted_blocks,
				(unsigned long long) s.evictions, (unsigned long long) s.collisions);
	/* the churn must have exercised hits, collisions (weak hash) and evictions */
	CHECK(s.hit_tokens > 0);
	CHECK(s.evictions > 0);
	if (hash)
		CHECK(s.collisions > 0);

	for (int i = 0; i < CHURN_RUNNING; i++)
		if (st->running[i].live)
			churn_release(st, &st->running[i]);
	CHECK(churn_consistent(st));
	cai_prefix_cache_reset(st->cache);
	CHECK_EQ_INT(cai_kv_pool_n_free(st->pool), CHURN_POOL_BLOCKS);

done:
	cai_prefix_cache_free(st->cache);
	cai_kv_pool_free(st->pool);
	free(st);
}

TEST(prefix_cache_random_churn_keeps_budget_and_refcounts)
{
	run_churn(NULL, 20000, UINT64_C(0x9e3779b97f4a7c15));
}

TEST(prefix_cache_random_churn_under_colliding_hash)
{
	run_churn(weak_hash, 20000, UINT64_C(0x2545f4914f6cdd1d));
}
