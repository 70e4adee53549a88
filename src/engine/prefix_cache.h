/*
 * prefix_cache.h — the inter-turn KV cache: hash-chained token blocks in a tree, in a byte budget.
 *
 * Character.AI's stateful caching with Mooncake's hash chain: the key of a full 16-token block i
 * is XXH3-64(tokens of block i, seed = key of block i-1); a finished sequence's partly filled
 * last block is kept as a partial tail after its prefix and reused to the token (SGLang); block 0's seed mixes the model's
 * fingerprint with a server-side salt (a role or conversation id), so namespaces never meet.
 * Each node keeps its tokens, and a hit is verified against them (xxHash is not collision-proof).
 * Nodes form a tree by parent link.  The cache holds one KV-pool reference per node's block; a
 * running sequence holds its own, so "pinned" = pool refcount > 1.  Eviction removes leaves whose
 * block is not pinned, until the byte budget holds: stale ones least recently used first, else
 * the newest that no lookup has reused; blocks in steady reuse stay (see prefix_cache.c).
 */
#ifndef CAI_PREFIX_CACHE_H
#define CAI_PREFIX_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"
#include "kv.h"
#include "kv_disk.h"

typedef struct cai_prefix_cache cai_prefix_cache;

typedef struct cai_prefix_cache_stats
{
	uint64_t	lookups;
	uint64_t	lookup_tokens;	/* tokens offered to lookups (full blocks only count if hit) */
	uint64_t	hit_tokens;
	uint64_t	inserted_blocks;
	uint64_t	evictions;
	uint64_t	collisions;		/* key matched, tokens did not */
	uint64_t	disk_hit_tokens;	/* of hit_tokens, those in blocks read back from the disk tier */
	uint64_t	blocks;			/* nodes now */
	size_t		bytes;			/* what the blocks hold (kv.h: global parts, and window parts kept) */
	size_t		budget_bytes;
} cai_prefix_cache_stats;

/* budget_bytes 0 disables the cache (lookups miss, inserts do nothing). */
cai_status	cai_prefix_cache_create(cai_kv_pool *pool, size_t budget_bytes, uint64_t fingerprint,
									cai_prefix_cache **out, cai_error *err);
void		cai_prefix_cache_free(cai_prefix_cache *cache);	/* drops all its references */

/*
 * Finds the longest cached prefix of tokens[0..n) in full blocks, at most max_blocks.  Writes
 * the block ids to blocks_out, takes one pool reference on each for the caller, marks them used,
 * and returns how many blocks matched.  With a disk tier, blocks read back that memory has no
 * room for (everything else in use) are returned all the same, the caller's reference their only
 * one.
 */
int			cai_prefix_cache_lookup(cai_prefix_cache *cache, uint64_t salt, const int32_t *tokens,
									int n, int32_t *blocks_out, int max_blocks);

/* A partial block matched after the full ones (block -1 when none). */
typedef struct cai_prefix_cache_tail
{
	int32_t		block;			/* cached block whose first n_tokens rows continue the prefix */
	int			n_tokens;		/* 1..15 */
} cai_prefix_cache_tail;

/*
 * Like cai_prefix_cache_lookup, reusing to the token: matches at most max_tokens tokens, full
 * blocks first (at most max_blocks), then the longest cached partial tail that continues them
 * token by token.  The tail's block is shared by every sequence that matches it and must not be
 * written: the caller copies its first tail->n_tokens rows into a block it owns.  The lookup
 * takes one pool reference on the tail's block for the caller (drop it after the copy), so an
 * eviction in between cannot free it.  Returns the full blocks matched.
 */
int			cai_prefix_cache_lookup_tokens(cai_prefix_cache *cache, uint64_t salt,
										   const int32_t *tokens, int n, int max_tokens,
										   int32_t *blocks_out, int max_blocks,
										   cai_prefix_cache_tail *tail);

/*
 * Offers a sequence's blocks: blocks[i] holds tokens[16 i .. 16 i + 16); when n_tokens is not a
 * multiple of 16 and blocks[n_tokens / 16] is given, its first n_tokens % 16 rows are cached as a
 * partial tail.  Blocks already cached under the same chain are skipped; new ones get a node and
 * a cache reference.  Evicts to stay within the budget; a block that cannot fit (everything else
 * pinned, or in steady reuse) is not inserted.
 */
void		cai_prefix_cache_insert(cai_prefix_cache *cache, uint64_t salt, const int32_t *tokens,
									int n_tokens, const int32_t *blocks, int n_blocks);

/*
 * As cai_prefix_cache_insert, with the conversation the blocks belong to (0: none): a block
 * records the owner that first cached it, which cai_prefix_cache_forget_owner goes by.
 */
void		cai_prefix_cache_insert_owned(cai_prefix_cache *cache, uint64_t salt, uint64_t owner,
										  const int32_t *tokens, int n_tokens,
										  const int32_t *blocks, int n_blocks);

/*
 * Puts a disk tier under the cache (NULL: none; the caller keeps it and closes it after the
 * cache).  Full blocks are then written to it when inserted or evicted, and a lookup that
 * misses in memory reads the rest of the chain back from it, when the pool has free blocks.
 */
void		cai_prefix_cache_set_disk(cai_prefix_cache *cache, cai_kv_disk *disk);

/*
 * Window parts the pool must keep free for others (the engine's running requests' unused
 * quotas, read at each use): a block read back from disk takes a window part only beyond them.
 * NULL: none reserved.
 */
void		cai_prefix_cache_set_window_reserve(cai_prefix_cache *cache, const int *reserved);

/*
 * Drops every node owner first cached, and every node after one (a chain never lacks its
 * start), from memory and, with a disk tier, every file of owner's.  Returns the nodes dropped.
 */
int			cai_prefix_cache_forget_owner(cai_prefix_cache *cache, uint64_t owner);

/* Drops every node (and its reference). */
void		cai_prefix_cache_reset(cai_prefix_cache *cache);

/* Frees unpinned LRU leaves until at least n pool blocks are free; returns blocks freed. */
int			cai_prefix_cache_reclaim(cai_prefix_cache *cache, int n_blocks_wanted);

void		cai_prefix_cache_get_stats(const cai_prefix_cache *cache, cai_prefix_cache_stats *out);

/* Tests only: replaces XXH3 with hash(tokens, seed) to force collisions. */
void		cai_prefix_cache_set_hash_for_testing(cai_prefix_cache *cache,
												  uint64_t (*hash) (const int32_t *tokens, int n,
																	uint64_t seed));

#endif							/* CAI_PREFIX_CACHE_H */
