/*
 * kv.h — the paged int8 KV cache (vLLM's PagedAttention layout).
 *
 * Memory is a pool of blocks of CAI_KV_BLOCK_TOKENS token slots.  A sequence owns a block table
 * (block ids in position order); position p lives in block_table[p / 16], slot p % 16.  One block
 * holds every KV-owning layer's keys and values for its 16 positions:
 *
 *   for each layer l with kv_source[l] == l (in layer order):
 *     k       int8  [16][n_kv_heads][head_dim]
 *     v       int8  [16][n_kv_heads][head_dim]
 *     k_scale float [16][n_kv_heads]      symmetric int8 scale per (token, kv-head)
 *     v_scale float [16][n_kv_heads]
 *
 * Blocks are reference-counted: a running sequence holds one reference on each of its blocks and
 * the prefix cache holds one on each block it keeps, so a cached block is shared in place (no copy)
 * and freed when the last reference goes.
 */
#ifndef CAI_KV_H
#define CAI_KV_H

#include <stddef.h>
#include <stdint.h>

#include "cai.h"

#define CAI_KV_BLOCK_TOKENS 16

typedef struct cai_kv_layout
{
	int			n_kv_layers;	/* layers that own KV */
	int			n_kv_heads;
	int			head_dim;
	size_t		layer_bytes;	/* bytes of one layer's part of a block */
	size_t		block_bytes;	/* all KV-owning layers */
} cai_kv_layout;

typedef struct cai_kv_pool cai_kv_pool;

cai_status	cai_kv_pool_create(const cai_kv_layout *layout, int n_blocks, cai_kv_pool **out,
							   cai_error *err);
void		cai_kv_pool_free(cai_kv_pool *pool);

const cai_kv_layout *cai_kv_pool_layout(const cai_kv_pool *pool);
int			cai_kv_pool_n_blocks(const cai_kv_pool *pool);
int			cai_kv_pool_n_free(const cai_kv_pool *pool);

/* Takes a free block with refcount 1, or returns -1 when none is free. */
int32_t		cai_kv_block_alloc(cai_kv_pool *pool);
void		cai_kv_block_ref(cai_kv_pool *pool, int32_t block);
void		cai_kv_block_unref(cai_kv_pool *pool, int32_t block);	/* frees at zero */
int			cai_kv_block_refcount(const cai_kv_pool *pool, int32_t block);

/*
 * Copies the first n_rows token slots (keys, values and their scales, every KV-owning layer) of
 * block src into block dst in host memory: how a sequence takes a private copy of the rows it
 * reuses from a shared, partly filled cached block before writing the rows after them.
 */
void		cai_kv_block_copy_rows(cai_kv_pool *pool, int32_t src, int32_t dst, int n_rows);

/* Host address of a block's part for KV-owning layer index kv_layer (0..n_kv_layers-1). */
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

#endif							/* CAI_KV_H */
