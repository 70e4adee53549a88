/*
 * fuzz_prefix_cache.c — random sequences of prefix-cache operations against a small KV pool.
 *
 * The harness plays the engine: up to SEQS running sequences, each with its tokens (from a small
 * alphabet, so prefixes repeat) under a salt, and the pool blocks it holds a reference on.  A
 * sequence starts with a lookup to the token (full blocks, then a partial tail), copies the
 * tail's matched rows into a fresh block of its own (the tail itself is never written), takes
 * fresh blocks for the rest of its tokens, and writes into each row it computes a signature of
 * (salt, every token up to and including that row's), as a forward pass writes KV that depends on
 * the whole prefix.  Then it may be offered to the cache (its last block partly filled, or
 * fewer blocks than tokens), and released.  Other operations: extra references taken and dropped (pins), reclaim, reset, a
 * weak hash that collides on purpose, and insert/lookup calls with bad arguments.
 *
 * Input: the pool size, the budget (in blocks), then one byte per operation followed by its
 * operands.  Invariants after every operation:
 *  - every block's reference count is the harness's references plus the cache's nodes on it,
 *    and the pool's free count is the number of blocks at zero;
 *  - the cache never holds more bytes than its budget;
 *  - every row a lookup hands out (all 16 of a full block, the matched ones of a tail) holds the
 *    signature of exactly the looked-up prefix (a hit is verified token for token: never another
 *    prefix's or another salt's KV), and a tail matches no more than the tokens allowed; a tail
 *    some sequence wrote into after reusing it would fail this check at its next hit;
 *  - after releasing everything and a reset, every block is free (no leak).
 */
#include "fuzz_common.h"
#include "kv.h"
#include "prefix_cache.h"

#define SEQS 6
#define MAX_SEQ_BLOCKS 8
#define MAX_TOKENS (MAX_SEQ_BLOCKS * CAI_KV_BLOCK_TOKENS + CAI_KV_BLOCK_TOKENS - 1)
#define MAX_POOL 48

typedef struct fuzz_seq
{
	bool		live;
	uint64_t	salt;
	int32_t		tokens[MAX_TOKENS];
	int			n_tokens;
	int32_t		blocks[MAX_SEQ_BLOCKS + 1];
	int			n_blocks;
	int			n_computed;		/* tokens whose rows are written */
} fuzz_seq;

typedef struct harness
{
	cai_kv_pool *pool;
	cai_prefix_cache *cache;
	int			n_pool;
	size_t		budget;
	fuzz_seq	seqs[SEQS];
	int			pins[MAX_POOL];	/* extra references the harness took */
} harness;

/* A collision-prone hash: few distinct keys, so lookups meet other prefixes' nodes. */
static uint64_t
weak_hash(const int32_t *tokens, int n, uint64_t seed)
{
	return (seed & 3) ^ (uint64_t) (tokens[0] & 1) ^ (uint64_t) (tokens[n - 1] & 2);
}

/* What row end-1 of a block must hold when it follows tokens[0 .. end) under salt. */
static uint64_t
signature(uint64_t salt, const int32_t *tokens, int end)
{
	uint64_t	sig = 0x9E3779B97F4A7C15ULL ^ (salt * 0xC2B2AE3D27D4EB4FULL);

	for (int i = 0; i < end; i++)
		sig = (sig ^ (uint64_t) (uint32_t) tokens[i]) * 0x100000001B3ULL + (uint64_t) i;
	return sig;
}

/* Each row's 8 key bytes (one head of 8) hold its signature. */
static uint8_t *
row_of(harness *h, int32_t block, int row)
{
	return cai_kv_block_layer(h->pool, block, 0) + (size_t) row * 8;
}

/* Computes rows [from, to) of block index b of tokens: what a forward pass would write. */
static void
write_rows(harness *h, int32_t block, uint64_t salt, const int32_t *tokens, int b, int from,
		   int to)
{
	for (int r = from; r < to; r++)
	{
		uint64_t	sig = signature(salt, tokens, b * CAI_KV_BLOCK_TOKENS + r + 1);

		memcpy(row_of(h, block, r), &sig, sizeof(sig));
	}
}

static bool
has_rows(harness *h, int32_t block, uint64_t salt, const int32_t *tokens, int b, int n_rows)
{
	for (int r = 0; r < n_rows; r++)
	{
		uint64_t	sig = signature(salt, tokens, b * CAI_KV_BLOCK_TOKENS + r + 1);

		if (memcmp(row_of(h, block, r), &sig, sizeof(sig)) != 0)
			return false;
	}
	return true;
}

static void
check_invariants(harness *h)
{
	int			held[MAX_POOL] = {0};
	long		cache_refs = 0;
	int			n_zero = 0;
	cai_prefix_cache_stats stats;

	for (int s = 0; s < SEQS; s++)
		for (int b = 0; h->seqs[s].live && b < h->seqs[s].n_blocks; b++)
			held[h->seqs[s].blocks[b]]++;
	for (int b = 0; b < h->n_pool; b++)
	{
		int			rc = cai_kv_block_refcount(h->pool, b);

		held[b] += h->pins[b];
		FUZZ_CHECK(rc >= held[b]);
		cache_refs += rc - held[b];
		n_zero += rc == 0;
	}
	cai_prefix_cache_get_stats(h->cache, &stats);
	FUZZ_CHECK(cai_kv_pool_n_free(h->pool) == n_zero);
	FUZZ_CHECK(cache_refs == (long) stats.blocks);
	FUZZ_CHECK(stats.bytes <= h->budget);
}

static void
release_seq(harness *h, fuzz_seq *s)
{
	for (int b = 0; s->live && b < s->n_blocks; b++)
		cai_kv_block_unref(h->pool, s->blocks[b]);
	s->live = false;
}

/* A fresh block, reclaiming cache blocks when the pool is dry; -1 when none can be had. */
static int32_t
fresh_block(harness *h)
{
	for (;;)
	{
		int32_t		block = cai_kv_block_alloc(h->pool);

		if (block >= 0 || cai_prefix_cache_reclaim(h->cache, 1) <= 0)
			return block;
	}
}

/*
 * Starts sequence s: tokens from the input, a lookup to the token, the tail's rows copied into a
 * block of its own, fresh blocks for the rest.
 */
static void
start_seq(harness *h, fuzz_seq *s, fuzz_input *in)
{
	int			n_full;
	int			hit;
	int			max_blocks = fuzz_u8(in) % (MAX_SEQ_BLOCKS + 2);
	uint8_t		alphabet = 1 + fuzz_u8(in) % 4;
	uint8_t		mode = fuzz_u8(in);
	int			max_tokens;
	cai_prefix_cache_tail tail;

	release_seq(h, s);
	s->salt = fuzz_u8(in) % 3;
	s->n_tokens = fuzz_u8(in) % (MAX_TOKENS + 1);
	for (int i = 0; i < s->n_tokens; i++)
		s->tokens[i] = in->n ? fuzz_u8(in) % alphabet : i % alphabet;
	n_full = s->n_tokens / CAI_KV_BLOCK_TOKENS;
	if (max_blocks > MAX_SEQ_BLOCKS)
		max_blocks = MAX_SEQ_BLOCKS;
	/* like the engine, sometimes keep the last tokens to run */
	max_tokens = s->n_tokens - (mode & 3);

	if (mode & 4)
	{
		hit = cai_prefix_cache_lookup(h->cache, s->salt, s->tokens, s->n_tokens, s->blocks,
									  max_blocks);
		tail.block = -1;
		tail.n_tokens = 0;
		max_tokens = s->n_tokens;
	}
	else
		hit = cai_prefix_cache_lookup_tokens(h->cache, s->salt, s->tokens, s->n_tokens, max_tokens,
											 s->blocks, max_blocks, &tail);
	FUZZ_CHECK(hit >= 0 && hit <= n_full && hit <= max_blocks);
	FUZZ_CHECK(hit * CAI_KV_BLOCK_TOKENS <= (max_tokens > 0 ? max_tokens : 0));
	for (int b = 0; b < hit; b++)
	{
		FUZZ_CHECK(s->blocks[b] >= 0 && s->blocks[b] < h->n_pool);
		FUZZ_CHECK(cai_kv_block_refcount(h->pool, s->blocks[b]) >= 2);
		FUZZ_CHECK(has_rows(h, s->blocks[b], s->salt, s->tokens, b, CAI_KV_BLOCK_TOKENS));
	}
	s->n_blocks = hit;
	s->n_computed = hit * CAI_KV_BLOCK_TOKENS;
	s->live = true;

	if (tail.block >= 0)
	{
		int32_t		own;

		FUZZ_CHECK(tail.n_tokens >= 1 && tail.n_tokens < CAI_KV_BLOCK_TOKENS);
		FUZZ_CHECK(hit * CAI_KV_BLOCK_TOKENS + tail.n_tokens <= max_tokens);
		FUZZ_CHECK(tail.block < h->n_pool);
		/* the cache's reference and the one the lookup took for the copy */
		FUZZ_CHECK(cai_kv_block_refcount(h->pool, tail.block) >= 2);
		FUZZ_CHECK(has_rows(h, tail.block, s->salt, s->tokens, hit, tail.n_tokens));
		own = hit < MAX_SEQ_BLOCKS + 1 ? fresh_block(h) : -1;
		/* the held reference keeps the tail through the reclaim fresh_block may do */
		FUZZ_CHECK(has_rows(h, tail.block, s->salt, s->tokens, hit, tail.n_tokens));
		if (own >= 0)
		{
			cai_kv_block_copy_rows(h->pool, tail.block, own, tail.n_tokens);
			s->blocks[s->n_blocks++] = own;
			s->n_computed += tail.n_tokens;
		}
		cai_kv_block_unref(h->pool, tail.block);
	}
	else
		FUZZ_CHECK(tail.n_tokens == 0);

	/* the forward pass: rows for the rest of the tokens, in the tail's copy and fresh blocks */
	while (s->n_computed < s->n_tokens)
	{
		int			b = s->n_computed / CAI_KV_BLOCK_TOKENS;
		int			from = s->n_computed % CAI_KV_BLOCK_TOKENS;
		int			to = s->n_tokens - b * CAI_KV_BLOCK_TOKENS;

		if (to > CAI_KV_BLOCK_TOKENS)
			to = CAI_KV_BLOCK_TOKENS;
		if (b >= s->n_blocks)
		{
			int32_t		block = b < MAX_SEQ_BLOCKS + 1 ? fresh_block(h) : -1;

			if (block < 0)
				break;
			s->blocks[s->n_blocks++] = block;
		}
		write_rows(h, s->blocks[b], s->salt, s->tokens, b, from, to);
		s->n_computed = b * CAI_KV_BLOCK_TOKENS + to;
	}
}

static void
insert_seq(harness *h, fuzz_seq *s, fuzz_input *in)
{
	int			n_blocks = s->n_blocks;
	int			n_tokens = s->n_computed;

	if (!s->live)
		return;
	if (fuzz_u8(in) & 1)
		n_blocks = fuzz_u8(in) % (s->n_blocks + 1);	/* offer fewer blocks than tokens */
	if (n_tokens > n_blocks * CAI_KV_BLOCK_TOKENS)
		n_tokens = n_blocks * CAI_KV_BLOCK_TOKENS;
	if (fuzz_u8(in) & 1)
		n_tokens -= fuzz_u8(in) % (n_tokens + 1);	/* offer fewer tokens: a shorter tail */
	cai_prefix_cache_insert(h->cache, s->salt, s->tokens, n_tokens, s->blocks, n_blocks);
}

/* Calls with arguments a buggy caller might pass: they must be ignored, not crash. */
static void
bad_calls(harness *h, fuzz_input *in)
{
	int32_t		tokens[2 * CAI_KV_BLOCK_TOKENS] = {0};
	int32_t		blocks[2];
	int32_t		out[2];

	blocks[0] = (int32_t) fuzz_u8(in) - 64;	/* out of range, or a free block */
	blocks[1] = (int32_t) fuzz_u8(in) - 64;
	if (blocks[0] >= 0 && blocks[0] < h->n_pool && cai_kv_block_refcount(h->pool, blocks[0]) > 0)
		blocks[0] = -1;
	if (blocks[1] >= 0 && blocks[1] < h->n_pool && cai_kv_block_refcount(h->pool, blocks[1]) > 0)
		blocks[1] = h->n_pool;
	tokens[0] = fuzz_u8(in);
	cai_prefix_cache_insert(h->cache, 7, tokens, 2 * CAI_KV_BLOCK_TOKENS, blocks, 2);
	cai_prefix_cache_insert(h->cache, 7, tokens, -5, blocks, 2);
	cai_prefix_cache_insert(h->cache, 7, NULL, 32, blocks, 2);
	cai_prefix_cache_insert(h->cache, 7, tokens, 32, NULL, 2);
	FUZZ_CHECK(cai_prefix_cache_lookup(h->cache, 7, tokens, 2 * CAI_KV_BLOCK_TOKENS, out, 0) == 0);
	FUZZ_CHECK(cai_prefix_cache_lookup(h->cache, 7, tokens, -1, out, 2) == 0);
	FUZZ_CHECK(cai_prefix_cache_lookup(h->cache, 7, NULL, 32, out, 2) == 0);
	FUZZ_CHECK(cai_prefix_cache_lookup(h->cache, 7, tokens, 32, NULL, 2) == 0);
	FUZZ_CHECK(cai_prefix_cache_lookup(h->cache, 7, tokens, 15, out, 2) == 0);
	{
		cai_prefix_cache_tail tail;

		FUZZ_CHECK(cai_prefix_cache_lookup_tokens(h->cache, 7, tokens, 32, -3, out, 2, &tail) == 0);
		FUZZ_CHECK(tail.block == -1 && tail.n_tokens == 0);
		FUZZ_CHECK(cai_prefix_cache_lookup_tokens(h->cache, 7, NULL, 32, 32, out, 2, &tail) == 0);
		FUZZ_CHECK(tail.block == -1);
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_input	in = {data, size};
	cai_kv_layout layout = {.n_kv_layers = 1, .n_kv_heads = 1, .head_dim = 8};
	harness		h;
	cai_error	err;

	memset(&h, 0, sizeof(h));
	layout.layer_bytes = 2 * CAI_KV_BLOCK_TOKENS * 8 + 2 * CAI_KV_BLOCK_TOKENS * sizeof(float);
	layout.block_bytes = layout.layer_bytes;
	h.n_pool = 1 + fuzz_u8(&in) % MAX_POOL;
	h.budget = (size_t) (fuzz_u8(&in) % (2 * MAX_POOL)) * layout.block_bytes + fuzz_u8(&in) % 3;
	FUZZ_CHECK(cai_kv_pool_create(&layout, h.n_pool, &h.pool, &err) == CAI_OK);
	FUZZ_CHECK(cai_prefix_cache_create(h.pool, h.budget, fuzz_u32(&in), &h.cache, &err) == CAI_OK);

	while (in.n > 0)
	{
		uint8_t		op = fuzz_u8(&in);
		fuzz_seq   *s = &h.seqs[(op >> 4) % SEQS];
		int32_t		block = (int32_t) (fuzz_u8(&in) % h.n_pool);

		switch (op & 15)
		{
			case 0:
			case 1:
			case 2:
				start_seq(&h, s, &in);
				break;
			case 3:
			case 4:
				insert_seq(&h, s, &in);
				break;
			case 5:
				release_seq(&h, s);
				break;
			case 6:				/* pin a block some sequence or the cache holds */
				if (cai_kv_block_refcount(h.pool, block) > 0)
				{
					cai_kv_block_ref(h.pool, block);
					h.pins[block]++;
				}
				break;
			case 7:
				if (h.pins[block] > 0)
				{
					cai_kv_block_unref(h.pool, block);
					h.pins[block]--;
				}
				break;
			case 8:
				{
					int			free_before = cai_kv_pool_n_free(h.pool);
					int			freed = cai_prefix_cache_reclaim(h.cache, fuzz_u8(&in) % (MAX_POOL + 2));

					FUZZ_CHECK(freed >= 0 && freed == cai_kv_pool_n_free(h.pool) - free_before);
					break;
				}
			case 9:
				{
					cai_prefix_cache_stats stats;

					cai_prefix_cache_reset(h.cache);
					cai_prefix_cache_get_stats(h.cache, &stats);
					FUZZ_CHECK(stats.blocks == 0 && stats.bytes == 0);
					break;
				}
			case 10:
				cai_prefix_cache_set_hash_for_testing(h.cache, (op >> 4) & 1 ? weak_hash : NULL);
				break;
			case 11:
				bad_calls(&h, &in);
				break;
			default:
				break;
		}
		check_invariants(&h);
	}

	for (int s = 0; s < SEQS; s++)
		release_seq(&h, &h.seqs[s]);
	for (int b = 0; b < h.n_pool; b++)
		while (h.pins[b]-- > 0)
			cai_kv_block_unref(h.pool, b);
	cai_prefix_cache_reset(h.cache);
	FUZZ_CHECK(cai_kv_pool_n_free(h.pool) == h.n_pool);
	cai_prefix_cache_free(h.cache);
	cai_kv_pool_free(h.pool);
	return 0;
}
