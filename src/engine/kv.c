/*
 * kv.c — the paged KV block pool: one host allocation of n_blocks blocks, a free list and a
 * reference count per block (see kv.h for the block layout and the sharing rules).
 */
#include "kv.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

struct cai_kv_pool
{
	cai_kv_layout layout;
	int			n_blocks;
	uint8_t    *memory;			/* n_blocks * block_bytes, 64-byte aligned */
	int32_t    *refcount;		/* [n_blocks] */
	int32_t    *free_list;		/* stack of free block ids */
	int			n_free;
};

cai_status
cai_kv_pool_create(const cai_kv_layout *layout, int n_blocks, cai_kv_pool **out, cai_error *err)
{
	cai_kv_pool *pool;
	size_t		bytes;

	*out = NULL;
	if (n_blocks <= 0 || layout->block_bytes == 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "kv pool needs at least one block");
	if (!cai_mul_size((size_t) n_blocks, layout->block_bytes, &bytes))
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "kv pool size overflows");

	pool = calloc(1, sizeof(*pool));
	if (!pool)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory allocating the kv pool");
	pool->layout = *layout;
	pool->n_blocks = n_blocks;
	pool->refcount = calloc((size_t) n_blocks, sizeof(int32_t));
	pool->free_list = malloc((size_t) n_blocks * sizeof(int32_t));
	pool->memory = cai_alloc_large(bytes);
	if (!pool->refcount || !pool->free_list || !pool->memory)
	{
		cai_kv_pool_free(pool);
		return cai_fail(err, CAI_ERR_NO_MEMORY,
						"out of memory allocating %d kv blocks (%zu bytes)", n_blocks, bytes);
	}
	/* pop order = ascending ids, which keeps fresh pools' layouts easy to reason about */
	for (int i = 0; i < n_blocks; i++)
		pool->free_list[i] = n_blocks - 1 - i;
	pool->n_free = n_blocks;
	*out = pool;
	return CAI_OK;
}

void
cai_kv_pool_free(cai_kv_pool *pool)
{
	if (!pool)
		return;
	free(pool->memory);
	free(pool->refcount);
	free(pool->free_list);
	free(pool);
}

const cai_kv_layout *
cai_kv_pool_layout(const cai_kv_pool *pool)
{
	return &pool->layout;
}

int
cai_kv_pool_n_blocks(const cai_kv_pool *pool)
{
	return pool->n_blocks;
}

int
cai_kv_pool_n_free(const cai_kv_pool *pool)
{
	return pool->n_free;
}

int32_t
cai_kv_block_alloc(cai_kv_pool *pool)
{
	int32_t		block;

	if (pool->n_free == 0)
		return -1;
	block = pool->free_list[--pool->n_free];
	pool->refcount[block] = 1;
	return block;
}

void
cai_kv_block_ref(cai_kv_pool *pool, int32_t block)
{
	pool->refcount[block]++;
}

void
cai_kv_block_unref(cai_kv_pool *pool, int32_t block)
{
	if (pool->refcount[block] <= 0)
		return;					/* a double release is a bug, but never corrupt the free list */
	if (--pool->refcount[block] == 0)
		pool->free_list[pool->n_free++] = block;
}

int
cai_kv_block_refcount(const cai_kv_pool *pool, int32_t block)
{
	return pool->refcount[block];
}

uint8_t *
cai_kv_block_layer(cai_kv_pool *pool, int32_t block, int kv_layer)
{
	return pool->memory + (size_t) block * pool->layout.block_bytes
		+ (size_t) kv_layer * pool->layout.layer_bytes;
}

void
cai_kv_block_copy_rows(cai_kv_pool *pool, int32_t src, int32_t dst, int n_rows)
{
	const cai_kv_layout *L = &pool->layout;
	size_t		row_values = (size_t) L->n_kv_heads * L->head_dim;

	if (src == dst || n_rows <= 0)
		return;
	if (n_rows > CAI_KV_BLOCK_TOKENS)
		n_rows = CAI_KV_BLOCK_TOKENS;
	for (int l = 0; l < L->n_kv_layers; l++)
	{
		uint8_t    *from = cai_kv_block_layer(pool, src, l);
		uint8_t    *to = cai_kv_block_layer(pool, dst, l);

		memcpy(cai_kv_keys(L, to), cai_kv_keys(L, from), (size_t) n_rows * row_values);
		memcpy(cai_kv_values(L, to), cai_kv_values(L, from), (size_t) n_rows * row_values);
		memcpy(cai_kv_key_scales(L, to), cai_kv_key_scales(L, from),
			   (size_t) n_rows * L->n_kv_heads * sizeof(float));
		memcpy(cai_kv_value_scales(L, to), cai_kv_value_scales(L, from),
			   (size_t) n_rows * L->n_kv_heads * sizeof(float));
	}
}
