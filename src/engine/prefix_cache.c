/*
 * prefix_cache.c — the inter-turn prefix cache: a tree of full 16-token KV blocks, found by a
 * hash chain, verified token by token, kept under a byte budget by evicting stale leaves least
 * recently used first and otherwise protecting what has been reused.
 *
 * Partial tails.  A finished sequence's last, partly filled block is kept too, as a leaf after
 * the full block before it (its parent; none for a prompt shorter than a block) holding its 1..15
 * tokens.  All tails of one prefix are filed under one key, the hash of a marker token seeded with
 * the prefix's key, so the same chain (and with it the salt) names them; a lookup compares each
 * candidate's tokens with the prompt's and takes the longest common prefix.  A tail is never
 * written by the sequences that reuse it: the caller copies the matched rows into a block of its
 * own, since the rows after them are the new sequence's and would differ between continuations.
 * A tail that a later insert covers (its tokens are a prefix of the new block or tail) is dropped.
 *
 * Reuse inside a full block.  A prompt that leaves a cached chain in the middle of a full block
 * (a new question after a shared system prompt, a regenerated reply) or ends inside one reuses
 * that block's rows up to the last token it agrees on, the same way as a tail's: every full block
 * is also filed, by a second link, under its prefix's tail key, so one bucket lists all the
 * blocks and tails that may follow a prefix.  A tail whose tokens a full block after the same
 * prefix already holds is not stored.  Each lookup compares at most MAX_FOLLOWERS candidates, so
 * a prefix followed by thousands of blocks (every conversation's first question after one system
 * prompt) costs a bounded scan; the most recently filed come first.
 *
 * Windowed models.  A block whose window part (kv.h) was dropped is cached all the same: its
 * global KV serves every lookup that resumes later in the sequence.  Which points can be resumed
 * from is the engine's check (engine.c's request_admit), since it depends on the window; the cache
 * only prefers, between two copies of one block, the one that kept its window part.
 *
 * Keys.  Block i's key is XXH3-64 of its 16 token ids (as int32 bytes) seeded with block i-1's
 * key; block 0's seed is XXH3-64 of (model fingerprint, salt).  One key therefore names a whole
 * prefix, and a lookup walks the chain from the root, one hash probe per block.
 *
 * Verification.  A node records its parent, its salt and its tokens, and a probe only counts as a
 * hit when all three match what the walk expects.  By induction a hit at block i means the node's
 * whole path spells exactly tokens[0 .. 16 (i+1)) under the same salt, so a hash collision (or a
 * deliberately bad hash in tests) can cost a miss but never hand out another prefix's KV.  Keys
 * are unique in the table: a colliding block simply is not cached.
 *
 * Memory.  A node costs the bytes its block holds: the global part, plus the window part when it
 * kept one (kv.h; a model without windowed layers has only global parts), and the nodes' bytes
 * never exceed budget_bytes.  So the cache never holds more than budget_bytes / (global part)
 * nodes, nor more nodes than the pool has blocks, and the nodes and the hash buckets are
 * allocated once at creation and never grow: no allocation happens on the lookup or insert path,
 * and nothing there can fail for memory.
 *
 * Recency.  All nodes sit on one LRU list ordered by last use, oldest first, kept so that every
 * node comes after all of its descendants: a use touches its whole path, moving the deepest node to
 * the new end first and the root last.  Hence the oldest node is always a leaf, and evicting from
 * the old end removes a path bottom-up.  A leaf found at the old end whose block is pinned (a
 * running sequence holds it: pool refcount > 1) is in use right now, so it is treated as used now
 * and its path moves to the new end.  Each public call has its own tick; when the old end's node
 * already carries the current tick, every node has been used during this call and nothing is
 * evictable.  Cost: O(1) per eviction, plus O(depth) for each pinned path met at the old end, and
 * each pinned path is moved at most once per call; pinned leaves are bounded by the running
 * sequences, so an eviction never scans the cache.
 *
 * Eviction.  Least recently used alone fails the commonest overload: conversations that come back
 * in a cycle longer than the cache holds (many users chatting at once).  Each conversation's blocks
 * are then the oldest exactly when it is asked next, and every lookup misses.  So an insert evicts
 * the oldest leaf only when it is stale: unused for more than one and a half times the typical
 * interval after which a conversation comes back, a moving average over lookups of the ticks since
 * the last lookup that shared the longest prefix with this one (note_request; hits and misses
 * alike, so a cache thrashing from the start learns it too).  When the oldest leaf is not stale,
 * every cached block is in use at the pace prompts return, and the blocks that make room are the
 * newest that no lookup has reused yet (the fresh list, in the order nodes were made, leaving it
 * when a lookup reuses them), made by an earlier call: the previous turns' new blocks, whose
 * conversations, just served, are the last to come back.  When there is none, or it is pinned or
 * has children, the new block is not cached.  What has been reused stays: under a cycle the cache
 * keeps a stable set of conversations' prefixes and hits them every turn, rather than the most
 * recently used ones, which are the last to be asked again.  A conversation's latest turn is still
 * cached for an immediate follow-up (it evicts the turn before it), and content that stops coming
 * back turns stale and goes first, so a new set of conversations takes over after a few of its
 * intervals.  Reclaiming pool blocks for running sequences evicts least recently used leaves, stale
 * or not.  Cost: O(1) per eviction; a lookup adds one hash per full block of its prompt
 * (note_request) and takes its path off the fresh list (each node leaves it once).
 *
 * Disk tier.  With one (kv_disk.h), every full block an insert covers is queued for writing
 * unless the tier holds it, and so is every full block evicted (a dropped write gets a second
 * chance).  A lookup whose chain leaves memory at block i asks the tier for block i, i+1, ...
 * under the same keys, reads each back into a fresh pool block and files it as a node, so it
 * is a memory hit from then on; the tier verifies the whole prefix's tokens, the salt and the
 * parent key, so a disk hit is as certain as a memory one.  Memory may refuse a block (over
 * budget, the rest in use or not yet stale): an insert then still queues the refused blocks for
 * the tier, and a lookup hands the blocks it reads to the caller alone, uncached, so a working
 * set many times memory's size is served from disk.  Blocks read back are shared in
 * place like any other, which needs the KV in host memory (the engine attaches no tier when
 * a device holds it).  The tier allocates (a write's copy, a prefix's tokens): a failed
 * allocation drops that write or reads nothing, so the memory cache's paths still cannot fail.
 *
 * Owners.  A node records the conversation that first cached it.  Forgetting an owner drops its
 * nodes and everything below them (walking the LRU list from the old end meets children before
 * parents), and its files.
 *
 * Not thread-safe: the engine's step loop owns the cache, like the KV pool.
 */
#include "prefix_cache.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "util.h"

typedef uint64_t (*block_hash_fn) (const int32_t *tokens, int n, uint64_t seed);

/* When a prompt with the prefix of this key was last looked up. */
typedef struct recent_root
{
	uint64_t	key;
	uint64_t	tick;
} recent_root;

typedef struct cache_node
{
	uint64_t	key;			/* hash of tokens seeded with the parent's key (or the root seed) */
	uint64_t	salt;			/* namespace; verified at the root so salts never meet */
	uint64_t	owner;			/* the conversation that first cached it (0: none) */
	struct cache_node *parent;	/* NULL for a prefix's first block */
	struct cache_node *hash_next;	/* bucket chain; free-list link while unused */
	struct cache_node *follower_next;	/* full blocks: the follower chain of their prefix's */
	struct cache_node *follower_prev;	/* tail key (doubly linked: O(1) removal) */
	struct cache_node *lru_older;
	struct cache_node *lru_newer;
	struct cache_node *fresh_older;	/* the fresh list: nodes no lookup has reused yet, */
	struct cache_node *fresh_newer;	/* in the order they were made */
	bool		fresh;
	uint64_t	last_used;		/* tick of the call that last used this node */
	int32_t		block;			/* KV pool block; the cache holds one reference on it */
	int32_t		n_children;
	int32_t		n_tokens;		/* CAI_KV_BLOCK_TOKENS, or 1..15 for a partial tail block */
	int32_t		tokens[CAI_KV_BLOCK_TOKENS];
	size_t		bytes;			/* what its block holds (block_cost) */
} cache_node;

struct cai_prefix_cache
{
	cai_kv_pool *pool;
	uint64_t	fingerprint;
	size_t		global_bytes;	/* a block's global part */
	size_t		window_bytes;	/* and its window part, if it kept one */
	size_t		budget_bytes;
	size_t		bytes;			/* held by the nodes */
	int			capacity;		/* most nodes the budget (and the pool) allow; 0 = disabled */

	cache_node *nodes;			/* [capacity], allocated once */
	cache_node *free_nodes;		/* unused nodes, linked by hash_next */
	int			n_nodes;

	cache_node **buckets;		/* [n_buckets], chains linked by hash_next */
	cache_node **follower_buckets;	/* [n_buckets]: full blocks by their prefix's tail key */
	int			bucket_bits;

	cache_node *lru_oldest;
	cache_node *lru_newest;
	uint64_t	tick;			/* advanced once per public call */
	uint64_t	reuse_ticks8;	/* typical interval between a prefix's lookups, in ticks x 8 */
	cache_node *fresh_oldest;
	cache_node *fresh_newest;
	cache_node *fresh_cursor;	/* newest fresh node made before this call's first new node */
	uint64_t	cursor_tick;	/* the call fresh_cursor was set in */
	struct recent_root *recent;	/* [n_buckets]: last lookup tick by prefix key */

	block_hash_fn hash;
	cai_kv_disk *disk;			/* the tier beneath, or NULL */
	const int  *window_reserve; /* window parts others hold a claim on, or NULL */
	cai_prefix_cache_stats stats;
};

/* The production block hash: XXH3-64 over the token ids' bytes. */
static uint64_t
xxh3_block_hash(const int32_t *tokens, int n, uint64_t seed)
{
	return XXH3_64bits_withSeed(tokens, (size_t) n * sizeof(int32_t), seed);
}

/* The seed of a prefix's first block: the model's fingerprint and the salt, mixed. */
static uint64_t
root_seed(const cai_prefix_cache *cache, uint64_t salt)
{
	uint64_t	words[2] = {cache->fingerprint, salt};

	return XXH3_64bits(words, sizeof(words));
}

/*
 * Bucket of a key.  Keys from XXH3 are already uniform, but the multiply keeps a poor test hash
 * from piling every key into one bucket.
 */
static size_t
bucket_of(const cai_prefix_cache *cache, uint64_t key)
{
	return (size_t) ((key * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - cache->bucket_bits));
}

/* The full-block node with this key (keys of full blocks are unique; partial ones are not). */
static cache_node *
hash_find(const cai_prefix_cache *cache, uint64_t key)
{
	cache_node *node = cache->buckets[bucket_of(cache, key)];

	while (node && (node->key != key || node->n_tokens != CAI_KV_BLOCK_TOKENS))
		node = node->hash_next;
	return node;
}

/*
 * The key under which the partial tails following a prefix are filed: the hash of one marker
 * token seeded with the prefix's key.  All tails of one prefix share it (they differ in their
 * tokens, which the lookup compares).  Should it equal a full block's key, nothing mixes: full
 * and partial nodes are told apart by their token count before anything else.
 */
static uint64_t
partial_key(const cai_prefix_cache *cache, uint64_t seed)
{
	static const int32_t marker[1] = {INT32_MIN};

	return cache->hash(marker, 1, seed);
}

/* Candidates compared when a lookup reuses part of a block (see the file comment). */
#define MAX_FOLLOWERS 256

static void
hash_insert(cai_prefix_cache *cache, cache_node *node)
{
	cache_node **head = &cache->buckets[bucket_of(cache, node->key)];

	node->hash_next = *head;
	*head = node;
}

static void
hash_remove(cai_prefix_cache *cache, cache_node *node)
{
	cache_node **link = &cache->buckets[bucket_of(cache, node->key)];

	while (*link && *link != node)
		link = &(*link)->hash_next;
	if (*link)
		*link = node->hash_next;
	node->hash_next = NULL;
}

/*
 * Files a full block under tail_key, the key of the tails that follow its prefix.  One prefix
 * may have thousands of followers in one chain, so the chain is doubly linked: removing a block
 * on eviction must not walk it.
 */
static void
follower_insert(cai_prefix_cache *cache, cache_node *node, uint64_t tail_key)
{
	cache_node **head = &cache->follower_buckets[bucket_of(cache, tail_key)];

	node->follower_prev = NULL;
	node->follower_next = *head;
	if (*head)
		(*head)->follower_prev = node;
	*head = node;
}

static void
follower_remove(cai_prefix_cache *cache, cache_node *node, uint64_t tail_key)
{
	if (node->follower_prev)
		node->follower_prev->follower_next = node->follower_next;
	else
		cache->follower_buckets[bucket_of(cache, tail_key)] = node->follower_next;
	if (node->follower_next)
		node->follower_next->follower_prev = node->follower_prev;
	node->follower_next = NULL;
	node->follower_prev = NULL;
}

static void
lru_unlink(cai_prefix_cache *cache, cache_node *node)
{
	if (node->lru_older)
		node->lru_older->lru_newer = node->lru_newer;
	else
		cache->lru_oldest = node->lru_newer;
	if (node->lru_newer)
		node->lru_newer->lru_older = node->lru_older;
	else
		cache->lru_newest = node->lru_older;
	node->lru_older = node->lru_newer = NULL;
}

static void
lru_append_newest(cai_prefix_cache *cache, cache_node *node)
{
	node->lru_older = cache->lru_newest;
	node->lru_newer = NULL;
	if (cache->lru_newest)
		cache->lru_newest->lru_newer = node;
	else
		cache->lru_oldest = node;
	cache->lru_newest = node;
}

/* Places node just older than anchor (which is on the list). */
static void
lru_insert_before(cai_prefix_cache *cache, cache_node *node, cache_node *anchor)
{
	node->lru_newer = anchor;
	node->lru_older = anchor->lru_older;
	if (anchor->lru_older)
		anchor->lru_older->lru_newer = node;
	else
		cache->lru_oldest = node;
	anchor->lru_older = node;
}

/*
 * Marks node and all its ancestors used now.  Moving the deepest first and the root last keeps
 * every node newer than its descendants, which is what makes the oldest node a leaf.
 */
static void
touch_path(cai_prefix_cache *cache, cache_node *node)
{
	for (; node; node = node->parent)
	{
		lru_unlink(cache, node);
		lru_append_newest(cache, node);
		node->last_used = cache->tick;
	}
}

static bool
block_pinned(const cai_prefix_cache *cache, const cache_node *node)
{
	return cai_kv_block_refcount(cache->pool, node->block) > 1;
}

/* Whether node is the block that follows parent, under salt, with these tokens. */
static bool
node_matches(const cache_node *node, const cache_node *parent, uint64_t salt,
			 const int32_t *tokens)
{
	return node->n_tokens == CAI_KV_BLOCK_TOKENS && node->parent == parent && node->salt == salt
		&& memcmp(node->tokens, tokens, sizeof(node->tokens)) == 0;
}

/* Whether node is a partial tail that follows parent under salt (its tokens are compared apart). */
static bool
partial_follows(const cache_node *node, uint64_t key, const cache_node *parent, uint64_t salt)
{
	return node->key == key && node->n_tokens < CAI_KV_BLOCK_TOKENS && node->parent == parent
		&& node->salt == salt;
}

/* Whether node is a full block filed under tail_key that follows parent under salt. */
static bool
full_follows(const cache_node *node, const cache_node *parent, uint64_t salt)
{
	return node->n_tokens == CAI_KV_BLOCK_TOKENS && node->parent == parent && node->salt == salt;
}

/* The key a full block is filed under as a follower: its prefix's tail key. */
static uint64_t
follower_key(const cai_prefix_cache *cache, const cache_node *node)
{
	return partial_key(cache, node->parent ? node->parent->key : root_seed(cache, node->salt));
}

/* Length of the common prefix of a[0..n) and b[0..n). */
static int
common_prefix(const int32_t *a, const int32_t *b, int n)
{
	int			i = 0;

	while (i < n && a[i] == b[i])
		i++;
	return i;
}

static void
fresh_unlink(cai_prefix_cache *cache, cache_node *node)
{
	if (!node->fresh)
		return;
	if (node == cache->fresh_cursor)
		cache->fresh_cursor = node->fresh_older;
	if (node->fresh_older)
		node->fresh_older->fresh_newer = node->fresh_newer;
	else
		cache->fresh_oldest = node->fresh_newer;
	if (node->fresh_newer)
		node->fresh_newer->fresh_older = node->fresh_older;
	else
		cache->fresh_newest = node->fresh_older;
	node->fresh_older = node->fresh_newer = NULL;
	node->fresh = false;
}

static void
fresh_append(cai_prefix_cache *cache, cache_node *node)
{
	node->fresh_older = cache->fresh_newest;
	node->fresh_newer = NULL;
	if (cache->fresh_newest)
		cache->fresh_newest->fresh_newer = node;
	else
		cache->fresh_oldest = node;
	cache->fresh_newest = node;
	node->fresh = true;
}

/*
 * A lookup reused node and its ancestors: none of them is fresh any more.  A fresh node's
 * ancestors may be reused ones, never the other way round, so the walk stops at the first node
 * that is not fresh.
 */
static void
mark_reused(cai_prefix_cache *cache, cache_node *node)
{
	for (; node && node->fresh; node = node->parent)
		fresh_unlink(cache, node);
}

/*
 * Queues a full node's block for the disk tier unless it holds it: the node's whole prefix is
 * gathered from its path.  A failed allocation only skips the write.
 */
static void
spill(cai_prefix_cache *cache, const cache_node *node)
{
	cai_kv_disk_block b;
	const cache_node *p;
	int32_t    *prefix;
	int			depth = 0;

	if (!cache->disk || node->n_tokens != CAI_KV_BLOCK_TOKENS ||
		cai_kv_disk_contains(cache->disk, node->key))
		return;
	for (p = node; p; p = p->parent)
		depth++;
	prefix = malloc((size_t) depth * CAI_KV_BLOCK_TOKENS * sizeof(int32_t));
	if (!prefix)
		return;
	b.n_prefix = depth * CAI_KV_BLOCK_TOKENS;
	for (p = node; p; p = p->parent)
		memcpy(prefix + (size_t) --depth * CAI_KV_BLOCK_TOKENS, p->tokens, sizeof(p->tokens));
	b.key = node->key;
	b.parent_key = node->parent ? node->parent->key : root_seed(cache, node->salt);
	b.salt = node->salt;
	b.owner = node->owner;
	b.prefix = prefix;
	cai_kv_disk_store(cache->disk, &b, cache->pool, node->block);
	free(prefix);
}

/* Removes a leaf: unlinks it everywhere and drops the cache's reference on its block. */
static void
remove_leaf(cai_prefix_cache *cache, cache_node *node)
{
	fresh_unlink(cache, node);
	hash_remove(cache, node);
	if (node->n_tokens == CAI_KV_BLOCK_TOKENS)
		follower_remove(cache, node, follower_key(cache, node));
	lru_unlink(cache, node);
	if (node->parent)
		node->parent->n_children--;
	cai_kv_block_unref(cache->pool, node->block);
	node->parent = NULL;
	node->hash_next = cache->free_nodes;
	cache->free_nodes = node;
	cache->n_nodes--;
	cache->bytes -= node->bytes;
}

/* The bytes a cached block holds. */
static size_t
block_cost(const cai_prefix_cache *cache, int32_t block)
{
	return cache->global_bytes +
		(cache->window_bytes > 0 && cai_kv_block_has_window(cache->pool, block) ? cache->window_bytes : 0);
}

/*
 * The next block index after depth whose prefix key note_request records: two per octave
 * (0, 1, 2, 3, 5, 7, 11, 15, 23, 31, ...), so a prompt records O(log n) keys.
 */
static int
next_noted_depth(int depth)
{
	int			m = depth + 1;

	if (m < 4)
		return m;
	if ((m & (m - 1)) == 0)
		return m + m / 2 - 1;
	return m / 3 * 4 - 1;
}

/*
 * Records the interval since a prompt was last looked up, in a moving average: the typical
 * interval after which a conversation comes back.  "The same prompt" is the longest prefix of
 * this one, at the depths next_noted_depth lists, that an earlier lookup also had: a system
 * prompt shared by every conversation recurs at every request, while the conversation's own
 * blocks recur when it comes back.  Misses count as much as hits, so a cache that has thrashed
 * from the start still learns the interval.  The table remembers keys, not blocks (it is sized
 * with the buckets and direct-mapped: a clash only loses a sample).  One sample may at most
 * double the average, so a conversation resumed after a long pause does not make everything
 * look fresh.  Costs one hash per full block of the prompt.
 */
static void
note_request(cai_prefix_cache *cache, const int32_t *tokens, int n, uint64_t seed)
{
	int			n_full = n / CAI_KV_BLOCK_TOKENS;
	uint64_t	key = seed;
	uint64_t	seen = 0;
	int			depth = 0;

	for (int i = 0; i < (n_full > 0 ? n_full : 1); i++)
	{
		recent_root *slot;

		key = cache->hash(tokens + (size_t) i * CAI_KV_BLOCK_TOKENS,
						  n_full > 0 ? CAI_KV_BLOCK_TOKENS : n, key);
		if (i != depth)
			continue;
		depth = next_noted_depth(depth);
		slot = &cache->recent[bucket_of(cache, key)];
		if (slot->key == key && slot->tick > 0)
			seen = slot->tick;
		slot->key = key;
		slot->tick = cache->tick;
	}
	if (seen > 0)
	{
		uint64_t	sample = (cache->tick - seen) * 8;

		if (cache->reuse_ticks8 == 0)
			cache->reuse_ticks8 = sample;
		else
		{
			if (sample > 2 * cache->reuse_ticks8)
				sample = 2 * cache->reuse_ticks8;
			cache->reuse_ticks8 = cache->reuse_ticks8 - cache->reuse_ticks8 / 8 + sample / 8;
		}
	}
}

/*
 * Evicts the least recently used leaf that no sequence holds, other than protect (the node an
 * insert is about to extend).  Unless force, that leaf must be stale; when it is not, the newest
 * fresh node from an earlier call goes instead, if it is an unpinned leaf.  Returns false when
 * nothing may go: see the file comment.
 */
static bool
evict_one(cai_prefix_cache *cache, const cache_node *protect, bool force)
{
	for (;;)
	{
		cache_node *oldest = cache->lru_oldest;
		cache_node *parent;

		/* the list is ordered by tick: if the oldest was used in this call, all were */
		if (!oldest || oldest->last_used == cache->tick)
			return false;

		/*
		 * n_children > 0 cannot happen while descendants stay older than ancestors; were it to,
		 * moving the path along is still safe.
		 */
		if (oldest == protect || oldest->n_children > 0 || block_pinned(cache, oldest))
		{
			touch_path(cache, oldest);
			continue;
		}
		/* stale: unused for over one and a half typical intervals */
		if (!force && cache->reuse_ticks8 > 0
			&& (cache->tick - oldest->last_used) * 8
			<= cache->reuse_ticks8 + cache->reuse_ticks8 / 2)
		{
			cache_node *newest = cache->cursor_tick == cache->tick ? cache->fresh_cursor : NULL;

			if (!newest || newest == protect || newest->n_children > 0
				|| block_pinned(cache, newest))
				return false;
			oldest = newest;
		}
		parent = oldest->parent;
		spill(cache, oldest);
		remove_leaf(cache, oldest);
		cache->stats.evictions++;

		/*
		 * A windowed model resumes only after a window of kept windowed KV (engine.c), so a
		 * leaf whose block dropped its window part can serve no lookup: such ancestors go too.
		 */
		while (parent && parent != protect && parent->n_children == 0 &&
			   !cai_kv_block_has_window(cache->pool, parent->block) && !block_pinned(cache, parent))
		{
			cache_node *up = parent->parent;

			spill(cache, parent);
			remove_leaf(cache, parent);
			cache->stats.evictions++;
			parent = up;
		}
		return true;
	}
}

cai_status
cai_prefix_cache_create(cai_kv_pool *pool, size_t budget_bytes, uint64_t fingerprint,
						cai_prefix_cache **out, cai_error *err)
{
	cai_prefix_cache *cache;
	const cai_kv_layout *L;
	size_t		capacity;

	*out = NULL;
	if (!pool)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "prefix cache needs a kv pool");
	L = cai_kv_pool_layout(pool);
	if (L->block_bytes == 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "prefix cache needs a non-empty kv block");

	cache = calloc(1, sizeof(*cache));
	if (!cache)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory allocating the prefix cache");
	cache->pool = pool;
	cache->fingerprint = fingerprint;
	cache->global_bytes = cai_kv_global_part_bytes(L);
	cache->window_bytes = cai_kv_window_part_bytes(L);
	cache->budget_bytes = budget_bytes;
	cache->hash = xxh3_block_hash;
	cache->stats.budget_bytes = budget_bytes;

	/*
	 * Each sane node holds a distinct pool block, so the pool size caps the node count as well as
	 * the budget does; a budget larger than the pool must not cost node memory for nothing.
	 */
	capacity = budget_bytes / (cache->global_bytes > 0 ? cache->global_bytes : 1);
	if (capacity > (size_t) cai_kv_pool_n_blocks(pool))
		capacity = (size_t) cai_kv_pool_n_blocks(pool);
	cache->capacity = (int) capacity;

	if (capacity > 0)
	{
		int			bits = 4;

		while (((size_t) 1 << bits) < capacity)
			bits++;
		cache->bucket_bits = bits;
		cache->nodes = calloc(capacity, sizeof(cache_node));
		cache->buckets = calloc((size_t) 1 << bits, sizeof(cache_node *));
		cache->follower_buckets = calloc((size_t) 1 << bits, sizeof(cache_node *));
		cache->recent = calloc((size_t) 1 << bits, sizeof(recent_root));
		if (!cache->nodes || !cache->buckets || !cache->follower_buckets || !cache->recent)
		{
			cai_prefix_cache_free(cache);
			return cai_fail(err, CAI_ERR_NO_MEMORY,
							"out of memory allocating a prefix cache of %zu blocks", capacity);
		}
		for (size_t i = capacity; i > 0; i--)
		{
			cache->nodes[i - 1].hash_next = cache->free_nodes;
			cache->free_nodes = &cache->nodes[i - 1];
		}
	}
	*out = cache;
	return CAI_OK;
}

void
cai_prefix_cache_free(cai_prefix_cache *cache)
{
	if (!cache)
		return;
	cai_prefix_cache_reset(cache);
	free(cache->nodes);
	free(cache->buckets);
	free(cache->follower_buckets);
	free(cache->recent);
	free(cache);
}

/*
 * The block after parent that agrees longest with tokens[0..n) (n < 16): a partial tail, or a
 * full block the prompt leaves or ends inside.  Tails sit in one bucket under partial_key and
 * full blocks in the follower bucket under the same key; each candidate's own tokens are
 * compared, so a hit is verified like a full block's.  At most MAX_FOLLOWERS candidates are
 * compared.  Returns the node (NULL if none shares a first token) and the matched length in
 * *matched.
 */
static cache_node *
best_partial(const cai_prefix_cache *cache, const cache_node *parent, uint64_t salt, uint64_t seed,
			 const int32_t *tokens, int n, int *matched)
{
	uint64_t	key = partial_key(cache, seed);
	cache_node *best = NULL;
	int			compared = 0;

	*matched = 0;
	for (cache_node *node = cache->buckets[bucket_of(cache, key)];
		 node && compared < MAX_FOLLOWERS; node = node->hash_next)
	{
		int			len;

		if (!partial_follows(node, key, parent, salt))
			continue;
		compared++;
		len = common_prefix(node->tokens, tokens, node->n_tokens < n ? node->n_tokens : n);
		if (len > *matched)
		{
			*matched = len;
			best = node;
		}
	}
	for (cache_node *node = cache->follower_buckets[bucket_of(cache, key)];
		 node && compared < MAX_FOLLOWERS && *matched < n; node = node->follower_next)
	{
		int			len;

		if (!full_follows(node, parent, salt))
			continue;
		compared++;
		len = common_prefix(node->tokens, tokens, n);
		if (len > *matched)
		{
			*matched = len;
			best = node;
		}
	}
	return best;
}

static cache_node *new_node(cai_prefix_cache *cache, cache_node *parent, size_t bytes);

/*
 * Reads the full block of key, which follows parent and holds tokens[16 depth .. 16 depth + 16),
 * back from the disk tier into a new node; NULL on a miss, or when there is no room for it.
 * seed is the key before it (the root seed at depth 0).
 */
static int32_t
read_from_disk(cai_prefix_cache *cache, uint64_t salt, uint64_t seed, uint64_t key,
			   const int32_t *tokens, int depth, uint64_t *owner)
{
	cai_kv_disk_block b = {
		.key = key, .parent_key = seed, .salt = salt, .owner = 0, .prefix = tokens,
		.n_prefix = (depth + 1) * CAI_KV_BLOCK_TOKENS
	};
	bool		with_window = !cache->window_reserve ||
		cai_kv_pool_n_free_window_parts(cache->pool) > *cache->window_reserve;

	return cai_kv_disk_load(cache->disk, &b, cache->pool, with_window, owner);
}

/*
 * When the block was read but memory has no room for it (everything else pinned or still in
 * use), *uncached gets it, the caller's alone, and NULL is returned; else *uncached is -1.
 */
static cache_node *
fetch_from_disk(cai_prefix_cache *cache, cache_node *parent, uint64_t salt, uint64_t seed,
				uint64_t key, const int32_t *tokens, int depth, int32_t *uncached)
{
	uint64_t	owner = 0;
	int32_t		block = read_from_disk(cache, salt, seed, key, tokens, depth, &owner);
	cache_node *node;

	*uncached = -1;
	if (block < 0)
		return NULL;
	node = new_node(cache, parent, block_cost(cache, block));
	if (!node)
	{
		*uncached = block;
		cache->stats.disk_hit_tokens += CAI_KV_BLOCK_TOKENS;
		return NULL;
	}
	/* the allocation's reference is the cache's */
	node->key = key;
	node->salt = salt;
	node->owner = owner;
	node->block = block;
	node->n_tokens = CAI_KV_BLOCK_TOKENS;
	memcpy(node->tokens, tokens + (size_t) depth * CAI_KV_BLOCK_TOKENS, sizeof(node->tokens));
	hash_insert(cache, node);
	follower_insert(cache, node, partial_key(cache, seed));
	cache->stats.inserted_blocks++;
	cache->stats.disk_hit_tokens += CAI_KV_BLOCK_TOKENS;
	return node;
}

int
cai_prefix_cache_lookup_tokens(cai_prefix_cache *cache, uint64_t salt, const int32_t *tokens,
							   int n, int max_tokens, int32_t *blocks_out, int max_blocks,
							   cai_prefix_cache_tail *tail)
{
	cache_node *parent = NULL;
	cache_node *last_used = NULL;
	uint64_t	seed;
	int			n_full;
	int			matched = 0;
	int			tail_tokens = 0;
	bool		off_memory = false;

	if (tail)
	{
		tail->block = -1;
		tail->n_tokens = 0;
	}
	cache->stats.lookups++;
	if (n > 0)
		cache->stats.lookup_tokens += (uint64_t) n;
	if (max_tokens > n)
		max_tokens = n;
	if (cache->capacity == 0 || max_tokens <= 0 || !tokens)
		return 0;

	cache->tick++;
	n_full = max_tokens / CAI_KV_BLOCK_TOKENS;
	if (n_full > max_blocks)
		n_full = max_blocks;
	if (!blocks_out)
		n_full = 0;
	seed = root_seed(cache, salt);
	note_request(cache, tokens, n, seed);

	while (matched < n_full)
	{
		const int32_t *block_tokens = tokens + (size_t) matched * CAI_KV_BLOCK_TOKENS;
		uint64_t	key = cache->hash(block_tokens, CAI_KV_BLOCK_TOKENS, seed);
		cache_node *node = off_memory ? NULL : hash_find(cache, key);

		if (!node && cache->disk)
		{
			int32_t		block = -1;

			/*
			 * Past a block memory could not take, the rest of the chain cannot be cached either
			 * (a node never lacks its parent): the caller gets the blocks read alone.
			 */
			if (off_memory)
			{
				block = read_from_disk(cache, salt, seed, key, tokens, matched, NULL);
				if (block >= 0)
					cache->stats.disk_hit_tokens += CAI_KV_BLOCK_TOKENS;
			}
			else
				node = fetch_from_disk(cache, parent, salt, seed, key, tokens, matched, &block);
			if (block >= 0)
			{
				blocks_out[matched++] = block;	/* the read's reference is the caller's */
				off_memory = true;
				seed = key;
				continue;
			}
		}
		if (!node)
			break;
		if (!node_matches(node, parent, salt, block_tokens))
		{
			cache->stats.collisions++;
			break;
		}
		cai_kv_block_ref(cache->pool, node->block);
		blocks_out[matched++] = node->block;
		parent = node;
		seed = key;
	}
	last_used = parent;

	/*
	 * After the last full hit, the tokens up to the next block boundary may agree with the start
	 * of a cached tail or full block after it: the longest agreement is reused to the token.
	 */
	if (tail && !off_memory)
	{
		int			rest = max_tokens - matched * CAI_KV_BLOCK_TOKENS;
		cache_node *node;

		if (rest > CAI_KV_BLOCK_TOKENS - 1)
			rest = CAI_KV_BLOCK_TOKENS - 1;
		node = rest > 0 ? best_partial(cache, parent, salt, seed,
									   tokens + (size_t) matched * CAI_KV_BLOCK_TOKENS, rest,
									   &tail_tokens) : NULL;
		if (node)
		{
			cai_kv_block_ref(cache->pool, node->block);
			tail->block = node->block;
			tail->n_tokens = tail_tokens;
			last_used = node;
		}
	}

	mark_reused(cache, last_used);
	if (last_used)
		touch_path(cache, last_used);
	cache->stats.hit_tokens += (uint64_t) matched * CAI_KV_BLOCK_TOKENS + (uint64_t) tail_tokens;
	return matched;
}

int
cai_prefix_cache_lookup(cai_prefix_cache *cache, uint64_t salt, const int32_t *tokens, int n,
						int32_t *blocks_out, int max_blocks)
{
	return cai_prefix_cache_lookup_tokens(cache, salt, tokens, n, n, blocks_out, max_blocks, NULL);
}

/*
 * Takes an unused node for a new child of parent, evicting to stay within the budget; NULL when
 * everything left is pinned.  The new node is placed just older than its parent and given the
 * parent's tick, which keeps the list ordered by tick and the parent newer than its descendants
 * until the insert touches the whole path.
 */
static cache_node *
new_node(cai_prefix_cache *cache, cache_node *parent, size_t bytes)
{
	cache_node *node;

	if (bytes > cache->budget_bytes)
		return NULL;
	/* what was fresh before this call's first new node may make room for it */
	if (cache->cursor_tick != cache->tick)
	{
		cache->fresh_cursor = cache->fresh_newest;
		cache->cursor_tick = cache->tick;
	}
	while (cache->n_nodes >= cache->capacity || !cache->free_nodes ||
		   cache->bytes + bytes > cache->budget_bytes)
	{
		if (!evict_one(cache, parent, false))
			return NULL;
	}
	node = cache->free_nodes;
	cache->free_nodes = node->hash_next;
	node->hash_next = NULL;
	cache->n_nodes++;
	cache->bytes += bytes;
	node->bytes = bytes;

	node->parent = parent;
	node->n_children = 0;
	fresh_append(cache, node);
	if (parent)
	{
		parent->n_children++;
		node->last_used = parent->last_used;
		lru_insert_before(cache, node, parent);
	}
	else
	{
		node->last_used = cache->tick;
		lru_append_newest(cache, node);
	}
	return node;
}

/*
 * Removes the partial tails after parent that tokens[0..n) now covers (their tokens are a prefix
 * of it), so a conversation that grew past a tail does not keep the stale one: every lookup that
 * would hit the tail hits at least as far on the longer entry.  A pinned tail stays.
 */
static void
drop_covered_tails(cai_prefix_cache *cache, const cache_node *parent, uint64_t salt,
				   uint64_t seed, const int32_t *tokens, int n, const cache_node *keep)
{
	uint64_t	key = partial_key(cache, seed);
	cache_node *node = cache->buckets[bucket_of(cache, key)];

	while (node)
	{
		cache_node *next = node->hash_next;

		if (node != keep && partial_follows(node, key, parent, salt) && node->n_tokens <= n
			&& common_prefix(node->tokens, tokens, node->n_tokens) == node->n_tokens
			&& !block_pinned(cache, node))
			remove_leaf(cache, node);
		node = next;
	}
}

/* Whether block is one the caller may share: a live block of the pool. */
static bool
block_held(const cai_prefix_cache *cache, int32_t block)
{
	return block >= 0 && block < cai_kv_pool_n_blocks(cache->pool)
		&& cai_kv_block_refcount(cache->pool, block) > 0;
}

/*
 * Caches tokens[0..n) (1..15 of them) held in the first rows of block as a partial tail after
 * parent, unless a tail or full block already there covers them.  Returns the node that now covers them, or
 * NULL when none could be made (over budget with everything else pinned).
 */
static cache_node *
insert_tail(cai_prefix_cache *cache, cache_node *parent, uint64_t salt, uint64_t owner,
			uint64_t seed, const int32_t *tokens, int n, int32_t block)
{
	uint64_t	key = partial_key(cache, seed);
	cache_node *node;

	for (node = cache->buckets[bucket_of(cache, key)]; node; node = node->hash_next)
	{
		if (partial_follows(node, key, parent, salt) && node->n_tokens >= n
			&& common_prefix(node->tokens, tokens, n) == n)
			return node;
	}
	/* a full block after the same prefix that begins with these tokens serves them as well
	 * (among the MAX_FOLLOWERS most recent: one further back is simply not found) */
	node = cache->follower_buckets[bucket_of(cache, key)];
	for (int seen = 0; node && seen < MAX_FOLLOWERS; node = node->follower_next, seen++)
	{
		if (full_follows(node, parent, salt) && common_prefix(node->tokens, tokens, n) == n)
			return node;
	}
	if (!block_held(cache, block))
		return NULL;
	node = new_node(cache, parent, block_cost(cache, block));
	if (!node)
		return NULL;
	node->key = key;
	node->salt = salt;
	node->owner = owner;
	node->block = block;
	node->n_tokens = n;
	memset(node->tokens, 0, sizeof(node->tokens));
	memcpy(node->tokens, tokens, (size_t) n * sizeof(int32_t));
	hash_insert(cache, node);
	cai_kv_block_ref(cache->pool, block);
	cache->stats.inserted_blocks++;
	drop_covered_tails(cache, parent, salt, seed, tokens, n, node);
	return node;
}

/*
 * Queues full blocks from .. n_full - 1 of tokens (blocks[] the caller's, seed the key before
 * block from) for the disk tier without caching them in memory: the chain goes on on disk.
 */
static void
store_uncached(cai_prefix_cache *cache, uint64_t salt, uint64_t owner, const int32_t *tokens,
			   int from, int n_full, const int32_t *blocks, uint64_t seed)
{
	if (!cache->disk)
		return;
	for (int i = from; i < n_full; i++)
	{
		const int32_t *block_tokens = tokens + (size_t) i * CAI_KV_BLOCK_TOKENS;
		uint64_t	key = cache->hash(block_tokens, CAI_KV_BLOCK_TOKENS, seed);
		cai_kv_disk_block b = {
			.key = key, .parent_key = seed, .salt = salt, .owner = owner,
			.prefix = tokens, .n_prefix = (i + 1) * CAI_KV_BLOCK_TOKENS
		};

		if (!block_held(cache, blocks[i]))
			break;
		cai_kv_disk_store(cache->disk, &b, cache->pool, blocks[i]);
		seed = key;
	}
}

void
cai_prefix_cache_insert(cai_prefix_cache *cache, uint64_t salt, const int32_t *tokens,
						int n_tokens, const int32_t *blocks, int n_blocks)
{
	cai_prefix_cache_insert_owned(cache, salt, 0, tokens, n_tokens, blocks, n_blocks);
}

void
cai_prefix_cache_insert_owned(cai_prefix_cache *cache, uint64_t salt, uint64_t owner,
							  const int32_t *tokens, int n_tokens, const int32_t *blocks,
							  int n_blocks)
{
	cache_node *parent = NULL;
	cache_node *last = NULL;
	uint64_t	seed;
	int			n_full;
	int			n_rest;
	int			i;

	if (cache->capacity == 0 || n_tokens <= 0 || n_blocks <= 0 || !tokens || !blocks)
		return;

	cache->tick++;
	n_full = n_tokens / CAI_KV_BLOCK_TOKENS;
	if (n_full > n_blocks)
		n_full = n_blocks;
	n_rest = n_tokens - n_full * CAI_KV_BLOCK_TOKENS;
	if (n_rest >= CAI_KV_BLOCK_TOKENS || n_full >= n_blocks)
		n_rest = 0;				/* the caller holds no block for the tail */
	seed = root_seed(cache, salt);

	for (i = 0; i < n_full; i++)
	{
		const int32_t *block_tokens = tokens + (size_t) i * CAI_KV_BLOCK_TOKENS;
		uint64_t	key = cache->hash(block_tokens, CAI_KV_BLOCK_TOKENS, seed);
		cache_node *node = hash_find(cache, key);

		if (node)
		{
			/*
			 * Already cached: keep the cached block even if the caller's differs (its copy holds
			 * the same KV and simply is not cached).  A key owned by another prefix means this
			 * block cannot be cached, nor anything after it: a node never lacks its parent.
			 */
			if (!node_matches(node, parent, salt, block_tokens))
			{
				cache->stats.collisions++;
				break;
			}
			/*
			 * ... unless the cached copy has lost its window part (kv.h) and the caller's has
			 * one: then the caller's copy can be resumed from and the cached one cannot.
			 */
			if (!cai_kv_block_has_window(cache->pool, node->block) && block_held(cache, blocks[i])
				&& cai_kv_block_has_window(cache->pool, blocks[i]) &&
				cache->bytes + cache->window_bytes <= cache->budget_bytes)
			{
				cai_kv_block_ref(cache->pool, blocks[i]);
				cai_kv_block_unref(cache->pool, node->block);
				node->block = blocks[i];
				cache->bytes += cache->window_bytes;
				node->bytes += cache->window_bytes;
			}
		}
		else
		{
			/* only a block the caller holds can be shared; a free one would be reused */
			if (!block_held(cache, blocks[i]))
				break;
			node = new_node(cache, parent, block_cost(cache, blocks[i]));
			if (!node)
			{
				/*
				 * Over budget with everything else pinned or still in use: memory keeps none of
				 * the rest, but the tier can, so a working set larger than memory is still served.
				 */
				store_uncached(cache, salt, owner, tokens, i, n_full, blocks, seed);
				break;
			}
			node->key = key;
			node->salt = salt;
			node->owner = owner;
			node->block = blocks[i];
			node->n_tokens = CAI_KV_BLOCK_TOKENS;
			memcpy(node->tokens, block_tokens, sizeof(node->tokens));
			hash_insert(cache, node);
			follower_insert(cache, node, partial_key(cache, seed));
			cai_kv_block_ref(cache->pool, node->block);
			cache->stats.inserted_blocks++;
			/* a tail this block extends is now reached through it */
			drop_covered_tails(cache, parent, salt, seed, block_tokens, CAI_KV_BLOCK_TOKENS,
							   NULL);
		}
		/* the finished turn's blocks go to disk too, off this thread, unless already there */
		if (cache->disk)
		{
			cai_kv_disk_block b = {
				.key = key, .parent_key = seed, .salt = salt, .owner = node->owner,
				.prefix = tokens, .n_prefix = (i + 1) * CAI_KV_BLOCK_TOKENS
			};

			cai_kv_disk_store(cache->disk, &b, cache->pool, node->block);
		}
		parent = node;
		last = node;
		seed = key;
	}

	/* the tail, only after an unbroken chain: a node never lacks its parent */
	if (i == n_full && n_rest > 0)
	{
		cache_node *tail = insert_tail(cache, parent, salt, owner, seed,
									   tokens + (size_t) n_full * CAI_KV_BLOCK_TOKENS, n_rest,
									   blocks[n_full]);

		if (tail)
			last = tail;
	}

	if (last)
		touch_path(cache, last);
}

void
cai_prefix_cache_reset(cai_prefix_cache *cache)
{
	cache_node *node;

	if (!cache || cache->capacity == 0)
		return;
	/* oldest first is leaves before their parents, though any order would do here */
	while ((node = cache->lru_oldest) != NULL)
	{
		lru_unlink(cache, node);
		cai_kv_block_unref(cache->pool, node->block);
	}
	memset(cache->buckets, 0, ((size_t) 1 << cache->bucket_bits) * sizeof(cache_node *));
	memset(cache->follower_buckets, 0,
		   ((size_t) 1 << cache->bucket_bits) * sizeof(cache_node *));
	cache->free_nodes = NULL;
	cache->fresh_oldest = cache->fresh_newest = cache->fresh_cursor = NULL;
	for (int i = cache->capacity; i > 0; i--)
	{
		cache->nodes[i - 1].fresh = false;
		cache->nodes[i - 1].fresh_older = NULL;
		cache->nodes[i - 1].fresh_newer = NULL;
		cache->nodes[i - 1].parent = NULL;
		cache->nodes[i - 1].follower_next = NULL;
		cache->nodes[i - 1].follower_prev = NULL;
		cache->nodes[i - 1].n_children = 0;
		cache->nodes[i - 1].hash_next = cache->free_nodes;
		cache->free_nodes = &cache->nodes[i - 1];
	}
	cache->n_nodes = 0;
	cache->bytes = 0;
}

int
cai_prefix_cache_reclaim(cai_prefix_cache *cache, int n_blocks_wanted)
{
	int			free_before = cai_kv_pool_n_free(cache->pool);

	if (cache->capacity == 0)
		return 0;
	cache->tick++;
	while (cai_kv_pool_n_free(cache->pool) < n_blocks_wanted)
	{
		if (!evict_one(cache, NULL, true))
			break;
	}
	return cai_kv_pool_n_free(cache->pool) - free_before;
}

void
cai_prefix_cache_set_disk(cai_prefix_cache *cache, cai_kv_disk *disk)
{
	cache->disk = cache->capacity > 0 ? disk : NULL;
}

void
cai_prefix_cache_set_window_reserve(cai_prefix_cache *cache, const int *reserved)
{
	cache->window_reserve = reserved;
}

/* Whether node or one of its ancestors belongs to owner. */
static bool
path_owned_by(const cache_node *node, uint64_t owner)
{
	for (; node; node = node->parent)
		if (node->owner == owner)
			return true;
	return false;
}

int
cai_prefix_cache_forget_owner(cai_prefix_cache *cache, uint64_t owner)
{
	cache_node *node;
	int			dropped = 0;

	if (cache->disk)
		cai_kv_disk_forget_owner(cache->disk, owner);
	if (cache->capacity == 0)
		return 0;
	/* descendants are older than their ancestors: from the old end, children go first */
	node = cache->lru_oldest;
	while (node)
	{
		cache_node *newer = node->lru_newer;

		if (path_owned_by(node, owner) && node->n_children == 0)
		{
			remove_leaf(cache, node);
			dropped++;
		}
		node = newer;
	}
	return dropped;
}

void
cai_prefix_cache_get_stats(const cai_prefix_cache *cache, cai_prefix_cache_stats *out)
{
	*out = cache->stats;
	out->blocks = (uint64_t) cache->n_nodes;
	out->bytes = cache->bytes;
}

/*
 * Replaces the block hash (NULL restores XXH3).  Existing keys were made by the old hash, so the
 * cache is emptied first.
 */
void
cai_prefix_cache_set_hash_for_testing(cai_prefix_cache *cache,
									  uint64_t (*hash) (const int32_t *tokens, int n,
														uint64_t seed))
{
	cai_prefix_cache_reset(cache);
	cache->hash = hash ? hash : xxh3_block_hash;
}
