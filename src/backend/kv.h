/*
 * kv.h — the paged int8 KV cache (vLLM's PagedAttention layout).
 *
 * Memory is a pool of blocks of CAI_KV_BLOCK_TOKENS token slots.  A sequence owns a block table
 * (block ids in position order); position p lives in block_table[p / 16], slot p % 16.  One block
 * holds every KV-owning layer's keys and values for its 16 positions:
 *
 *   for each KV-owning layer, in KV index order (model.h's kv_index):
 *     k       int8  [16][n_kv_heads][head_dim]
 *     v       int8  [16][n_kv_heads][head_dim]
 *     k_scale float [16][n_kv_heads]      symmetric int8 scale per (token, kv-head)
 *     v_scale float [16][n_kv_heads]
 *     k2      int8  [16][n_kv_heads][head_dim]   only with two-digit keys (below)
 *
 * Two-digit keys (key_digits 2, the two_digit activation mode): each key element also carries
 * the rounding error of its int8 digit k, quantized to 1/254 of the step: x ~ s (k + k2 / 254)
 * with s = max|x| / 127 and k2 in [-127, 127], and k_scale holds s / 254, so that a query's
 * exact integer dot product with the key is q . (254 k + k2) (cpu/attention.h).  The k plane
 * is the one-digit key exactly, and the second plane sits after the scales, so every other
 * offset is the one-digit layout's.
 *
 * Blocks are reference-counted: a running sequence holds one reference on each of its blocks and
 * the prefix cache holds one on each block it keeps, so a cached block is shared in place (no copy)
 * and freed when the last reference goes.
 *
 * Windowed layers.  A layer whose KV is only ever read through a sliding window (Gemma 3's local
 * layers) never looks again at a position more than `window` tokens old.  The layout puts those
 * layers last (KV indexes n_kv_layers - n_windowed_layers and up), and a block's part for them,
 * its window part, lives in a second arena with its own free list: a block always has its global
 * part, but its window part can be dropped once no reader needs it.  So a
 * long sequence holds global KV for every position and windowed KV for about one window, which is
 * what makes Gemma 3's KV per token several times smaller than with every layer global.  Who
 * drops what is the engine's business (engine.c); a pool made by cai_kv_pool_create has a window
 * part for every block and cai_kv_block_alloc hands blocks out whole, so other users never see
 * a block without its window part.
 */
#ifndef CAI_KV_H
#define CAI_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"

#define CAI_KV_BLOCK_TOKENS 16

/* Two-digit keys: a key element is k_scale * (CAI_KV_KEY_DIGIT_BASE * k + k2). */
#define CAI_KV_KEY_DIGIT_BASE 254

typedef struct cai_kv_layout
{
	int			n_kv_layers;	/* layers that own KV */
	int			n_windowed_layers;	/* the last of them: read only through a window */
	int			window;			/* the widest window reading them (0 when there are none) */
	int			n_kv_heads;
	int			head_dim;
	int			key_digits;		/* 2: two-digit keys (the k2 plane); 1 (or 0): int8 keys */
	size_t		layer_bytes;	/* bytes of one layer's part of a block */
	size_t		block_bytes;	/* all KV-owning layers: a whole block */
} cai_kv_layout;

/* Bytes of a block's global part (the layers read at every distance) and of its window part. */
static inline size_t
cai_kv_global_part_bytes(const cai_kv_layout *L)
{
	return (size_t) (L->n_kv_layers - L->n_windowed_layers) * L->layer_bytes;
}

static inline size_t
cai_kv_window_part_bytes(const cai_kv_layout *L)
{
	return (size_t) L->n_windowed_layers * L->layer_bytes;
}

typedef struct cai_kv_pool cai_kv_pool;

/* A pool of n_blocks blocks, each with its window part. */
cai_status	cai_kv_pool_create(const cai_kv_layout *layout, int n_blocks, cai_kv_pool **out,
							   cai_error *err);

/* A pool of n_blocks global parts and n_window_parts window parts (at most n_blocks). */
cai_status	cai_kv_pool_create_windowed(const cai_kv_layout *layout, int n_blocks,
										int n_window_parts, cai_kv_pool **out, cai_error *err);
void		cai_kv_pool_free(cai_kv_pool *pool);

const cai_kv_layout *cai_kv_pool_layout(const cai_kv_pool *pool);
int			cai_kv_pool_n_blocks(const cai_kv_pool *pool);
int			cai_kv_pool_n_free(const cai_kv_pool *pool);
int			cai_kv_pool_n_window_parts(const cai_kv_pool *pool);	/* 0 without windowed layers */
int			cai_kv_pool_n_free_window_parts(const cai_kv_pool *pool);

/* Host bytes the pool holds, and the bytes of the parts in use now. */
size_t		cai_kv_pool_bytes(const cai_kv_pool *pool);
size_t		cai_kv_pool_bytes_in_use(const cai_kv_pool *pool);

/*
 * Takes a free block with refcount 1 and its window part, or returns -1 when either is short.
 * The _without_window form leaves the window part to cai_kv_block_add_window.
 */
int32_t		cai_kv_block_alloc(cai_kv_pool *pool);
int32_t		cai_kv_block_alloc_without_window(cai_kv_pool *pool);
void		cai_kv_block_ref(cai_kv_pool *pool, int32_t block);
void		cai_kv_block_unref(cai_kv_pool *pool, int32_t block);	/* frees at zero */
int			cai_kv_block_refcount(const cai_kv_pool *pool, int32_t block);

/*
 * A block's window part: whether it has one (always true without windowed layers), giving it one
 * (false when none is free; true if it had one), and giving it back (its windowed KV is lost: only
 * for positions no reader will attend to again).
 */
bool		cai_kv_block_has_window(const cai_kv_pool *pool, int32_t block);
bool		cai_kv_block_add_window(cai_kv_pool *pool, int32_t block);
void		cai_kv_block_drop_window(cai_kv_pool *pool, int32_t block);

/*
 * Copies the first n_rows token slots (keys, values and their scales, every KV-owning layer) of
 * block src into block dst in host memory: how a sequence takes a private copy of the rows it
 * reuses from a shared, partly filled cached block before writing the rows after them.  Window
 * parts are copied when both blocks have one.
 */
void		cai_kv_block_copy_rows(cai_kv_pool *pool, int32_t src, int32_t dst, int n_rows);

/*
 * Host address of a block's part for KV-owning layer index kv_layer (0..n_kv_layers-1); NULL for
 * a windowed layer of a block whose window part was dropped.
 */
uint8_t    *cai_kv_block_layer(cai_kv_pool *pool, int32_t block, int kv_layer);

/* Typed views into a block's layer part. */
static inline int8_t *
cai_kv_keys(const cai_kv_layout *L, uint8_t *layer_part)
{
	return (int8_t *) layer_part;
}

static inline int8_t *
cai_kv_values(const cai_kv_layout *L, uint8_t *layer_part)
{
	return (int8_t *) layer_part + (size_t) CAI_KV_BLOCK_TOKENS * L->n_kv_heads * L->head_dim;
}

static inline float *
cai_kv_key_scales(const cai_kv_layout *L, uint8_t *layer_part)
{
	return (float *) (layer_part + (size_t) 2 * CAI_KV_BLOCK_TOKENS * L->n_kv_heads * L->head_dim);
}

static inline float *
cai_kv_value_scales(const cai_kv_layout *L, uint8_t *layer_part)
{
	return cai_kv_key_scales(L, layer_part) + CAI_KV_BLOCK_TOKENS * L->n_kv_heads;
}

/* The keys' second digits (two-digit keys only). */
static inline int8_t *
cai_kv_key_second_digits(const cai_kv_layout *L, uint8_t *layer_part)
{
	return (int8_t *) (cai_kv_value_scales(L, layer_part) + CAI_KV_BLOCK_TOKENS * L->n_kv_heads);
}

/* Bytes one token's keys, values and scales take in one KV-owning layer. */
static inline size_t
cai_kv_token_layer_bytes(int n_kv_heads, int head_dim, int key_digits)
{
	return (size_t) n_kv_heads * ((key_digits == 2 ? 3 : 2) * (size_t) head_dim + 2 * sizeof(float));
}

#endif							/* CAI_KV_H */
