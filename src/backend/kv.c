/*
 * kv.c — the paged KV block pool: a host arena of n_blocks global parts and one of window parts,
 * a free list for each and a reference count per block (see kv.h for the block layout, the
 * sharing rules and the window parts).
 */
#include "kv.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

struct cai_kv_pool
{
	cai_kv_layout layout;
	size_t		global_bytes;	/* one block's global part */
	size_t		window_bytes;	/* one block's window part (0 without windowed layers) */
	int			n_blocks;
	uint8_t    *memory;			/* n_blocks global parts, 64-byte aligned */
	int32_t    *refcount;		/* [n_blocks] */
	int32_t    *free_list;		/* stack of free block ids */
	int			n_free;
	int			n_window_parts;
	uint8_t    *window_memory;	/* n_window_parts window parts */
	int32_t    *window_of;		/* [n_blocks] the block's window part, or -1 */
	int32_t    *free_windows;	/* stack of free window parts */
	int			n_free_windows;
};

cai_status
cai_kv_pool_create_windowed(const cai_kv_layout *layout, int n_blocks, int n_window_parts,
							cai_kv_pool **out, cai_error *err)
{
	cai_kv_pool *pool;
	size_t		bytes;
	size_t		window_bytes;

	*out = NULL;
	if (n_blocks <= 0 || layout->block_bytes == 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "kv pool needs at least one block");
	if (layout->n_windowed_layers < 0 || layout->n_windowed_layers > layout->n_kv_layers ||
		layout->block_bytes < (size_t) layout->n_kv_layers * layout->layer_bytes)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "kv pool layout is inconsistent");
	if (layout->n_windowed_layers == 0)
		n_window_parts = 0;
	else if (n_window_parts < 1 || n_window_parts > n_blocks)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
						"kv pool needs between 1 and %d window parts", n_blocks);

	pool = calloc(1, sizeof(*pool));
	if (!pool)
		return cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory allocating the kv pool");
	pool->layout = *layout;
	pool->global_bytes = cai_kv_global_part_bytes(layout);
	pool->window_bytes = cai_kv_window_part_bytes(layout);
	pool->n_blocks = n_blocks;
	pool->n_window_parts = n_window_parts;
	if (!cai_mul_size((size_t) n_blocks, pool->global_bytes, &bytes) ||
		!cai_mul_size((size_t) n_window_parts, pool->window_bytes, &window_bytes))
	{
		free(pool);
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "kv pool size overflows");
	}
	pool->refcount = calloc((size_t) n_blocks, sizeof(int32_t));
	pool->free_list = malloc((size_t) n_blocks * sizeof(int32_t));
	pool->window_of = malloc((size_t) n_blocks * sizeof(int32_t));
	pool->free_windows = malloc((size_t) (n_window_parts > 0 ? n_window_parts : 1) * sizeof(int32_t));
	/* an arena may be empty (every layer windowed, or none): still a valid pointer */
	pool->memory = cai_alloc_large(bytes > 0 ? bytes : 64);
	pool->window_memory = cai_alloc_large(window_bytes > 0 ? window_bytes : 64);
	if (!pool->refcount || !pool->free_list || !pool->window_of || !pool->free_windows ||
		!pool->memory || !pool->window_memory)
	{
		cai_kv_pool_free(pool);
		return cai_fail(err, CAI_ERR_NO_MEMORY,
						"out of memory allocating %d kv blocks (%zu bytes)", n_blocks,
						bytes + window_bytes);
	}
	/* pop order = ascending ids, which keeps fresh pools' layouts easy to reason about */
	for (int i = 0; i < n_blocks; i++)
	{
		pool->free_list[i] = n_blocks - 1 - i;
		pool->window_of[i] = -1;
	}
	pool->n_free = n_blocks;
	for (int i = 0; i < n_window_parts; i++)
		pool->free_windows[i] = n_window_parts - 1 - i;
	pool->n_free_windows = n_window_parts;
	*out = pool;
	return CAI_OK;
}

cai_status
cai_kv_pool_create(const cai_kv_layout *layout, int n_blocks, cai_kv_pool **out, cai_error *err)
{
	return cai_kv_pool_create_windowed(layout, n_blocks, n_blocks, out, err);
}

void
cai_kv_pool_free(cai_kv_pool *pool)
{
	if (!pool)
		return;
	free(pool->memory);
	free(pool->window_memory);
	free(pool->refcount);
	free(pool->free_list);
	free(pool->window_of);
	free(pool->free_windows);
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

int
cai_kv_pool_n_window_parts(const cai_kv_pool *pool)
{
	return pool->n_window_parts;
}

int
cai_kv_pool_n_free_window_parts(const cai_kv_pool *pool)
{
	return pool->n_free_windows;
}

size_t
cai_kv_pool_bytes(const cai_kv_pool *pool)
{
	return (size_t) pool->n_blocks * pool->global_bytes +
		(size_t) pool->n_window_parts * pool->window_bytes;
}

size_t
cai_kv_pool_bytes_in_use(const cai_kv_pool *pool)
{
	return (size_t) (pool->n_blocks - pool->n_free) * pool->global_bytes +
		(size_t) (pool->n_window_parts - pool->n_free_windows) * pool->window_bytes;
}

int32_t
cai_kv_block_alloc_without_window(cai_kv_pool *pool)
{
	int32_t		block;

	if (pool->n_free == 0)
		return -1;
	block = pool->free_list[--pool->n_free];
	pool->refcount[block] = 1;
	pool->window_of[block] = -1;
	return block;
}

int32_t
cai_kv_block_alloc(cai_kv_pool *pool)
{
	int32_t		block;

	if (pool->n_free == 0 || (pool->n_window_parts > 0 && pool->n_free_windows == 0))
		return -1;
	block = cai_kv_block_alloc_without_window(pool);
	cai_kv_block_add_window(pool, block);
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
	{
		cai_kv_block_drop_window(pool, block);
		pool->free_list[pool->n_free++] = block;
	}
}

int
cai_kv_block_refcount(const cai_kv_pool *pool, int32_t block)
{
	return pool->refcount[block];
}

bool
cai_kv_block_has_window(const cai_kv_pool *pool, int32_t block)
{
	return pool->n_window_parts == 0 || pool->window_of[block] >= 0;
}

bool
cai_kv_block_add_window(cai_kv_pool *pool, int32_t block)
{
	if (cai_kv_block_has_window(pool, block))
		return true;
	if (pool->n_free_windows == 0)
		return false;
	pool->window_of[block] = pool->free_windows[--pool->n_free_windows];
	return true;
}

void
cai_kv_block_drop_window(cai_kv_pool *pool, int32_t block)
{
	if (pool->window_of[block] < 0)
		return;
	pool->free_windows[pool->n_free_windows++] = pool->window_of[block];
	pool->window_of[block] = -1;
}

uint8_t *
cai_kv_block_layer(cai_kv_pool *pool, int32_t block, int kv_layer)
{
	int			n_global = pool->layout.n_kv_layers - pool->layout.n_windowed_layers;

	if (kv_layer < n_global)
		return pool->memory + (size_t) block * pool->global_bytes
			+ (size_t) kv_layer * pool->layout.layer_bytes;
	if (pool->window_of[block] < 0)
		return NULL;
	return pool->window_memory + (size_t) pool->window_of[block] * pool->window_bytes
		+ (size_t) (kv_layer - n_global) * pool->layout.layer_bytes;
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

		if (!from || !to)
			continue;
		memcpy(cai_kv_keys(L, to), cai_kv_keys(L, from), (size_t) n_rows * row_values);
		memcpy(cai_kv_values(L, to), cai_kv_values(L, from), (size_t) n_rows * row_values);
		memcpy(cai_kv_key_scales(L, to), cai_kv_key_scales(L, from),
			   (size_t) n_rows * L->n_kv_heads * sizeof(float));
		memcpy(cai_kv_value_scales(L, to), cai_kv_value_scales(L, from),
			   (size_t) n_rows * L->n_kv_heads * sizeof(float));
		if (L->key_digits == 2)
			memcpy(cai_kv_key_second_digits(L, to), cai_kv_key_second_digits(L, from),
				   (size_t) n_rows * row_values);
	}
}
