/*
 * attention.cu — the step plan (per-token positions and KV slots, per-sequence block tables, the
 * attention tiles) in fixed device buffers, the KV write, and causal GQA attention over the paged
 * int8 KV cache.
 *
 * Attention reproduces cpu/attention.c operation for operation, so that the GPU's output is the
 * CPU's bit for bit (and therefore independent of batching, like the CPU's).  Per query row
 * (one query head of one token) the CPU computes: the query quantized to int8 with its own scale;
 * exact int32 dot products with the int8 keys, times (q_scale * scale) * k_scale, scale being the
 * base-2 score scale (backend.h's cai_attn_score_scale); the row maximum; exp2(score - max) by
 * cpu/attention.h's polynomial; their total with the sixteen-partial-sum rule; and the
 * values accumulated in ascending position order, out[d] = fma(p_j * v_scale_j, v_j[d], out[d])
 * (one rounding per term; the float path multiplies then adds), all of it per segment of 256 positions at fixed boundaries, a row spanning several segments folding
 * them in order (cpu/attention.h's merge: the order is part of the value).  A block holds a tile
 * of query rows — every query head of one KV head (GQA/MQA share each K/V load) for consecutive
 * tokens of one sequence — and for each segment makes three passes over the tile's positions in
 * chunks of 32 keys:
 *   A  scores, then each row's maximum (exact in any order);
 *   B  the exponentials, summed per row into its sixteen partial sums in position order;
 *   C  the probabilities times value scales, accumulated into registers in position order;
 * then folds the segment's sums into each row's output registers.
 * Scores are recomputed in each pass from the int8 data (exact integers, so bit-identical) rather
 * than stored: a chunk's keys stay in shared memory and the tile's rows share them.
 *
 * The float reference path (a float KV shadow) is the same kernel with float queries and keys:
 * query * scale, eight-partial-sum dot products, value scale 1.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"

#define ATTN_THREADS 256
#define ATTN_CHUNK 32			/* keys per chunk: two KV blocks */
#define ATTN_SEGMENT 256		/* cpu/attention.h's CAI_ATTN_SEGMENT_TOKENS */
#define ATTN_WEIGHT_MAX 16383	/* cpu/attention_values.h's CAI_ATTN_WEIGHT_MAX */
#define ATTN_VSCALE_MIN 5.421010862427522e-20f	/* 2^-64: cpu/attention.h's CAI_ATTN_VSCALE_MIN */

/* Query rows per tile: 64 (head_dim <= 128) or 32 (head_dim 256), like the CPU's 64-row tiles. */
static int
tile_rows_for(int head_dim)
{
	return head_dim > 128 ? 32 : 64;
}

extern "C" bool
cai_cuda_attention_supports(int head_dim)
{
	return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

/* ---------------------------------------------------------------------------------------------
 * The step plan
 * ------------------------------------------------------------------------------------------- */

#define META_ALIGN 16

static size_t
align_up(size_t n)
{
	return (n + META_ALIGN - 1) & ~(size_t) (META_ALIGN - 1);
}

/* Byte offsets of the plan's sections for given capacities (block tables last: see upload). */
typedef struct meta_offsets
{
	size_t		counts;
	size_t		positions;
	size_t		slots;
	size_t		tokens;
	size_t		seqs;
	size_t		items;
	size_t		block_tables;
	size_t		total;
} meta_offsets;

static meta_offsets
meta_layout(int cap_tokens, int cap_seqs, int cap_items, int cap_bt)
{
	meta_offsets o;
	size_t		at = 0;

	o.counts = at;
	at = align_up(at + 4 * sizeof(int32_t));
	o.positions = at;
	at = align_up(at + (size_t) cap_tokens * sizeof(int32_t));
	o.slots = at;
	at = align_up(at + (size_t) cap_tokens * sizeof(int32_t));
	o.tokens = at;
	at = align_up(at + (size_t) cap_tokens * sizeof(int32_t));
	o.seqs = at;
	at = align_up(at + (size_t) cap_seqs * sizeof(attn_seq_rec));
	o.items = at;
	at = align_up(at + (size_t) cap_items * sizeof(attn_item_rec));
	o.block_tables = at;
	at = align_up(at + (size_t) cap_bt * sizeof(int32_t));
	o.total = at;
	return o;
}

/* Most tiles a step of these sizes can have. */
static int
max_items_for(int max_tokens, int max_seqs, int group, int tile_rows)
{
	long		n = (long) max_tokens * group / tile_rows + max_seqs + 1;

	return n > 0x7fffffff ? 0x7fffffff : (int) n;
}

/*
 * The plan's description for the kernels (ctx->meta): its sizes, where its arrays are on the
 * device, and the grid: the plan's own, or for a recorded graph one that covers every plan of
 * this padded size.
 */
static void
publish_plan(cai_cuda_ctx *ctx, const cai_cuda_seq_desc *seqs, int n_seqs, int n_tok, int item,
			 int group, int tile_rows, const attn_item_rec *irec, const meta_offsets *op,
			 bool for_graph)
{
	const meta_offsets o = *op;

	ctx->meta.n_tok = n_tok;
	ctx->meta.n_seqs = n_seqs;
	ctx->meta.n_items = item;
	ctx->meta.group = group;
	ctx->meta.tile_rows = tile_rows;
	ctx->meta.positions_dev = (const int32_t *) (ctx->meta_dev + o.positions);
	ctx->meta.slots_dev = (const int32_t *) (ctx->meta_dev + o.slots);
	ctx->meta.tokens_dev = (const int32_t *) (ctx->meta_dev + o.tokens);
	ctx->meta.seqs_dev = ctx->meta_dev + o.seqs;
	ctx->meta.items_dev = ctx->meta_dev + o.items;
	ctx->meta.counts_dev = (const int32_t *) (ctx->meta_dev + o.counts);
	ctx->meta.max_item_rows = 0;
	for (int i = 0; i < item; i++)
		if (irec[i].n_qrows > ctx->meta.max_item_rows)
			ctx->meta.max_item_rows = irec[i].n_qrows;
	ctx->meta.need_segments = 0;
	for (int s = 0; s < n_seqs; s++)
		if ((seqs[s].pos + seqs[s].n_new - 1) / ATTN_SEGMENT + 1 > ctx->meta.need_segments)
			ctx->meta.need_segments = (seqs[s].pos + seqs[s].n_new - 1) / ATTN_SEGMENT + 1;
	if (for_graph)
	{
		/*
		 * A graph keeps the grid it was captured with, so the grid covers every plan of this
		 * padded size: at most one tile per group of tile_rows rows plus one per sequence, and
		 * sequences have a row each.  The segments round up to a power of two, so that a graph
		 * captured at one context serves the following steps until the context doubles.
		 */
		int			bound = max_items_for(n_tok, n_tok, group, tile_rows);

		ctx->meta.grid_items = bound < ctx->meta_cap_items ? bound : ctx->meta_cap_items;
		ctx->meta.max_segments = 1;
		while (ctx->meta.max_segments < ctx->meta.need_segments)
			ctx->meta.max_segments *= 2;
	}
	else
	{
		ctx->meta.grid_items = item;
		ctx->meta.max_segments = ctx->meta.need_segments;
	}
}

/* Grows the plan buffers (device and page-locked host) to at least these capacities. */
static cai_status
meta_reserve(cai_cuda_ctx *ctx, int cap_tokens, int cap_seqs, int cap_items, int cap_bt,
			 cai_error *err)
{
	meta_offsets o;
	uint8_t    *dev = NULL;
	uint8_t    *host = NULL;

	if (cap_tokens <= ctx->meta_cap_tokens && cap_seqs <= ctx->meta_cap_seqs &&
		cap_items <= ctx->meta_cap_items && cap_bt <= ctx->meta_cap_bt && ctx->meta_dev)
		return CAI_OK;
	if (ctx->capturing)
		return cuda_fail(err, CAI_ERR_INTERNAL,
						 "the step plan outgrew its buffers while a cuda graph is captured");
	/* grow every section together, with headroom, so that growth is rare */
	if (cap_tokens < ctx->meta_cap_tokens)
		cap_tokens = ctx->meta_cap_tokens;
	if (cap_seqs < ctx->meta_cap_seqs)
		cap_seqs = ctx->meta_cap_seqs;
	if (cap_items < ctx->meta_cap_items)
		cap_items = ctx->meta_cap_items;
	if (cap_bt < ctx->meta_cap_bt)
		cap_bt = ctx->meta_cap_bt;
	o = meta_layout(cap_tokens, cap_seqs, cap_items, cap_bt);

	/* the old buffers may still be read by queued kernels or the last upload */
	CUDA_CHECK(cudaStreamSynchronize(ctx->stream), err, "the step plan");
	if (cudaMalloc((void **) &dev, o.total) != cudaSuccess)
	{
		cudaGetLastError();
		return cuda_fail(err, CAI_ERR_NO_MEMORY,
						 "out of device memory allocating the step plan (%zu bytes)", o.total);
	}
	if (cudaHostAlloc((void **) &host, o.total, cudaHostAllocPortable) != cudaSuccess)
	{
		cudaGetLastError();
		cudaFree(dev);
		return cuda_fail(err, CAI_ERR_NO_MEMORY,
						 "out of page-locked host memory for the step plan (%zu bytes)", o.total);
	}
	cudaFree(ctx->meta_dev);
	cudaFreeHost(ctx->meta_host);
	ctx->meta_dev = dev;
	ctx->meta_host = host;
	ctx->meta_bytes = o.total;
	ctx->meta_cap_tokens = cap_tokens;
	ctx->meta_cap_seqs = cap_seqs;
	ctx->meta_cap_items = cap_items;
	ctx->meta_cap_bt = cap_bt;
	ctx->meta_pending = false;
	/* captured graphs read the old buffers */
	cai_cuda_graph_reset(ctx);
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_step_reserve(cai_cuda_ctx *ctx, int max_tokens, int max_seqs, int max_blocks_per_seq,
					  int n_heads, int n_kv_heads, int head_dim, cai_error *err)
{
	int			group;

	if (max_tokens < 1 || max_seqs < 1 || max_blocks_per_seq < 1 || n_kv_heads < 1 ||
		n_heads % n_kv_heads != 0 || !cai_cuda_attention_supports(head_dim))
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "invalid step plan limits");
	group = n_heads / n_kv_heads;
	return meta_reserve(ctx, max_tokens, max_seqs,
						max_items_for(max_tokens, max_seqs, group, tile_rows_for(head_dim)),
						max_seqs * max_blocks_per_seq, err);
}

extern "C" cai_status
cai_cuda_step_plan(cai_cuda_ctx *ctx, const cai_cuda_seq_desc *seqs, int n_seqs,
				   const int32_t *tokens, int n_tok_padded, int n_heads, int n_kv_heads,
				   int head_dim, bool for_graph, const cai_cuda_step_meta **meta, cai_error *err)
{
	int			group,
				tile_rows;
	long		total = 0,
				n_items = 0,
				total_bt = 0;
	int			n_tok;
	meta_offsets o;
	int32_t    *counts,
			   *positions,
			   *slots,
			   *tok_out,
			   *bt;
	attn_seq_rec *srec;
	attn_item_rec *irec;
	int			row = 0,
				item = 0,
				bt_at = 0;
	size_t		used;
	cai_status	st;

	*meta = NULL;
	if (n_seqs < 0 || n_kv_heads < 1 || n_heads % n_kv_heads != 0)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "step plan: bad head counts %d/%d",
						 n_heads, n_kv_heads);
	if (!cai_cuda_attention_supports(head_dim))
		return cuda_fail(err, CAI_ERR_UNSUPPORTED,
						 "the cuda attention kernels support head_dim 64, 128 and 256, not %d",
						 head_dim);
	group = n_heads / n_kv_heads;
	tile_rows = tile_rows_for(head_dim);
	for (int s = 0; s < n_seqs; s++)
	{
		long		end = (long) seqs[s].pos + seqs[s].n_new;
		long		need = (end + CAI_CUDA_KV_BLOCK_TOKENS - 1) / CAI_CUDA_KV_BLOCK_TOKENS;

		if (seqs[s].n_new < 1 || seqs[s].pos < 0)
			return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "step plan: sequence %d is empty", s);
		if (seqs[s].n_blocks < need || !seqs[s].block_table)
			return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT,
							 "step plan: sequence %d's block table does not cover position %ld", s,
							 end - 1);
		total += seqs[s].n_new;
		total_bt += need;
		n_items += ((long) seqs[s].n_new * group + tile_rows - 1) / tile_rows;
	}
	if (total > 0x3fffffff || total_bt > 0x3fffffff || n_items > 0x3fffffff)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT, "step plan: the batch is too large");
	n_tok = (int) total > n_tok_padded ? (int) total : n_tok_padded;
	if ((st = meta_reserve(ctx, n_tok, n_seqs > 0 ? n_seqs : 1, (int) n_items + 1,
						   (int) total_bt + 1, err)) != CAI_OK)
		return st;

	/* the previous plan's upload must be done before its staging buffer is rewritten */
	if (ctx->meta_pending)
	{
		CUDA_CHECK(cudaEventSynchronize(ctx->meta_uploaded), err, "the step plan");
		ctx->meta_pending = false;
	}
	o = meta_layout(ctx->meta_cap_tokens, ctx->meta_cap_seqs, ctx->meta_cap_items,
					ctx->meta_cap_bt);
	counts = (int32_t *) (ctx->meta_host + o.counts);
	positions = (int32_t *) (ctx->meta_host + o.positions);
	slots = (int32_t *) (ctx->meta_host + o.slots);
	tok_out = (int32_t *) (ctx->meta_host + o.tokens);
	srec = (attn_seq_rec *) (ctx->meta_host + o.seqs);
	irec = (attn_item_rec *) (ctx->meta_host + o.items);
	bt = (int32_t *) (ctx->meta_host + o.block_tables);

	for (int s = 0; s < n_seqs; s++)
	{
		const cai_cuda_seq_desc *d = &seqs[s];
		int			need = (d->pos + d->n_new + CAI_CUDA_KV_BLOCK_TOKENS - 1) / CAI_CUDA_KV_BLOCK_TOKENS;
		int			rows = d->n_new * group;

		srec[s].row0 = row;
		srec[s].n_new = d->n_new;
		srec[s].pos = d->pos;
		srec[s].bt_offset = bt_at;
		for (int b = 0; b < need; b++)
		{
			if (d->block_table[b] < 0)
				return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT,
								 "step plan: sequence %d has a negative block id", s);
			bt[bt_at + b] = d->block_table[b];
		}
		for (int i = 0; i < d->n_new; i++)
		{
			int			p = d->pos + i;

			positions[row + i] = p;
			slots[row + i] = d->block_table[p / CAI_CUDA_KV_BLOCK_TOKENS] * CAI_CUDA_KV_BLOCK_TOKENS +
				p % CAI_CUDA_KV_BLOCK_TOKENS;
			tok_out[row + i] = tokens ? tokens[row + i] : 0;
		}
		for (int r0 = 0; r0 < rows; r0 += tile_rows)
		{
			irec[item].seq = s;
			irec[item].qrow0 = r0;
			irec[item].n_qrows = rows - r0 < tile_rows ? rows - r0 : tile_rows;
			irec[item].pad = 0;
			item++;
		}
		row += d->n_new;
		bt_at += need;
	}
	for (int t = row; t < n_tok; t++)
	{
		positions[t] = -1;
		slots[t] = -1;
		tok_out[t] = 0;
	}
	counts[0] = n_tok;
	counts[1] = n_seqs;
	counts[2] = item;
	counts[3] = 0;

	/* one copy: everything up to the end of the used block tables */
	used = o.block_tables + (size_t) bt_at * sizeof(int32_t);
	CUDA_CHECK(cudaMemcpyAsync(ctx->meta_dev, ctx->meta_host, used, cudaMemcpyHostToDevice,
							   ctx->stream), err, "the step plan upload");
	CUDA_CHECK(cudaEventRecord(ctx->meta_uploaded, ctx->stream), err, "the step plan upload");
	ctx->meta_pending = true;

	publish_plan(ctx, seqs, n_seqs, n_tok, item, group, tile_rows, irec, &o, for_graph);
	/* the block tables are addressed through the sequence records */
	*meta = &ctx->meta;
	return CAI_OK;
}

/* Device address of the block-table section (kernels get it from the plan's layout). */
static const int32_t *
meta_block_tables(const cai_cuda_ctx *ctx)
{
	meta_offsets o = meta_layout(ctx->meta_cap_tokens, ctx->meta_cap_seqs, ctx->meta_cap_items,
								 ctx->meta_cap_bt);

	return (const int32_t *) (ctx->meta_dev + o.block_tables);
}

/* Byte offset of the keys' second-digit plane in a layer part: after keys, values and scales. */
static __device__ __forceinline__ size_t
key2_plane_offset(int n_kv, int hd)
{
	return (size_t) 2 * CAI_CUDA_KV_BLOCK_TOKENS * n_kv * hd +
		(size_t) 2 * CAI_CUDA_KV_BLOCK_TOKENS * n_kv * sizeof(float);
}

/* ---------------------------------------------------------------------------------------------
 * KV write
 * ------------------------------------------------------------------------------------------- */

/*
 * grid (n_tok, n_kv_heads), two warps: warp 0 quantizes the key head, warp 1 the value head, with
 * cai_op_quantize_vec_i8's rule (the max is exact in any order; the rest is per element).  With
 * two-digit keys the key head takes cai_op_quantize_vec_two_digits' rule: the second digit
 * round((v - q) * 254) in the k2 plane, and the scale (max / 127) / 254.
 */
template <int HD>
static __global__ void
kv_write_kernel(uint8_t *pool, size_t block_bytes, size_t layer_off, int n_kv,
				const int32_t *__restrict__ slots, const float *__restrict__ k,
				const float *__restrict__ v, int ld, float *shadow, size_t sh_block_floats,
				size_t sh_layer_off, bool two_digit_keys)
{
	constexpr int PER_LANE = HD / CUDA_WARP;
	int			t = blockIdx.x;
	int			h = blockIdx.y;
	int			lane = threadIdx.x % CUDA_WARP;
	bool		is_v = threadIdx.x >= CUDA_WARP;
	int			slot_all = slots[t];
	int			block,
				slot;
	const float *src;
	uint8_t    *part;
	int8_t	   *dst;
	float	   *scale_dst;
	float		vals[PER_LANE];
	float		amax = 0.0f,
				scale = 0.0f,
				inv = 0.0f;
	bool		nonzero;
	size_t		at;

	if (slot_all < 0)
		return;
	block = slot_all / CAI_CUDA_KV_BLOCK_TOKENS;
	slot = slot_all % CAI_CUDA_KV_BLOCK_TOKENS;
	src = (is_v ? v : k) + (size_t) t * ld + (size_t) h * HD;
	part = pool + (size_t) block * block_bytes + layer_off;
	at = ((size_t) slot * n_kv + h) * HD;
	dst = (int8_t *) part + (is_v ? (size_t) CAI_CUDA_KV_BLOCK_TOKENS * n_kv * HD : 0) + at;
	scale_dst = (float *) (part + (size_t) 2 * CAI_CUDA_KV_BLOCK_TOKENS * n_kv * HD) +
		(is_v ? CAI_CUDA_KV_BLOCK_TOKENS * n_kv : 0) + slot * n_kv + h;

#pragma unroll
	for (int i = 0; i < PER_LANE; i++)
	{
		vals[i] = src[lane + i * CUDA_WARP];
		amax = fmaxf(amax, fabsf(vals[i]));
	}
	amax = warp_max(amax);
	nonzero = quant_row_scale(amax, &scale, &inv);
	if (two_digit_keys && !is_v)
	{
		int8_t	   *dst2 = (int8_t *) (part + key2_plane_offset(n_kv, HD)) + at;

#pragma unroll
		for (int i = 0; i < PER_LANE; i++)
		{
			float		x = __fmul_rn(vals[i], inv);
			float		r;

			x = x > -127.0f ? x : -127.0f;
			x = x < 127.0f ? x : 127.0f;
			r = rintf(x);
			dst[lane + i * CUDA_WARP] = nonzero ? (int8_t) (int) r : 0;
			dst2[lane + i * CUDA_WARP] = nonzero ?
				(int8_t) (int) rintf(__fmul_rn(__fsub_rn(x, r), (float) CAI_CUDA_KEY_DIGIT_BASE)) : 0;
		}
		if (lane == 0)
			*scale_dst = nonzero ? __fdiv_rn(scale, (float) CAI_CUDA_KEY_DIGIT_BASE) : 0.0f;
	}
	else
	{
#pragma unroll
		for (int i = 0; i < PER_LANE; i++)
			dst[lane + i * CUDA_WARP] = nonzero ? quant_one(vals[i], inv) : 0;
		if (lane == 0)
			*scale_dst = nonzero ? scale : 0.0f;
	}
	if (shadow)
	{
		float	   *sh = shadow + (size_t) block * sh_block_floats + sh_layer_off +
			(is_v ? (size_t) CAI_CUDA_KV_BLOCK_TOKENS * n_kv * HD : 0) + at;

#pragma unroll
		for (int i = 0; i < PER_LANE; i++)
			sh[lane + i * CUDA_WARP] = vals[i];
	}
}

extern "C" cai_status
cai_cuda_kv_write(cai_cuda_ctx *ctx, const cai_cuda_kv *kv, int kv_layer,
				  const cai_cuda_step_meta *meta, const float *k_dev, const float *v_dev, int ld,
				  const cai_cuda_kv_shadow *shadow, cai_error *err)
{
	dim3		grid(meta->n_tok, kv->n_kv_heads);
	size_t		layer_off = (size_t) kv_layer * kv->layer_bytes;
	float	   *sh = shadow ? shadow->data_dev : NULL;
	size_t		sh_block = shadow ? shadow->block_floats : 0;
	size_t		sh_layer = shadow ? (size_t) kv_layer * shadow->layer_floats : 0;

	if (meta->n_tok <= 0)
		return CAI_OK;
	cuda_capture_note_plan(ctx, meta);
	switch (kv->head_dim)
	{
		case 64:
			kv_write_kernel<64><<<grid, 2 * CUDA_WARP, 0, ctx->stream>>>(
				kv->pool_dev, kv->block_bytes, layer_off, kv->n_kv_heads, meta->slots_dev, k_dev,
				v_dev, ld, sh, sh_block, sh_layer, kv->key_digits == 2);
			break;
		case 128:
			kv_write_kernel<128><<<grid, 2 * CUDA_WARP, 0, ctx->stream>>>(
				kv->pool_dev, kv->block_bytes, layer_off, kv->n_kv_heads, meta->slots_dev, k_dev,
				v_dev, ld, sh, sh_block, sh_layer, kv->key_digits == 2);
			break;
		case 256:
			kv_write_kernel<256><<<grid, 2 * CUDA_WARP, 0, ctx->stream>>>(
				kv->pool_dev, kv->block_bytes, layer_off, kv->n_kv_heads, meta->slots_dev, k_dev,
				v_dev, ld, sh, sh_block, sh_layer, kv->key_digits == 2);
			break;
		default:
			return cuda_fail(err, CAI_ERR_UNSUPPORTED, "kv write: unsupported head_dim %d",
							 kv->head_dim);
	}
	CUDA_CHECK_LAUNCH(err, "the kv write kernel");
	return CAI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Attention
 * ------------------------------------------------------------------------------------------- */

/* Where a tile's K/V live: the int8 pool, or the float shadow (F). */
typedef struct attn_source
{
	const uint8_t *pool;
	size_t		block_bytes;
	size_t		layer_off;
	const float *shadow;
	size_t		sh_block_floats;
	size_t		sh_layer_off;
	int			n_kv;
	bool		two_digit_keys;	/* the int8 pool's keys have their k2 plane (kv.h) */
} attn_source;

/*
 * Shared memory of a block, carved from one dynamic allocation.  int8 path: queries as int8
 * words, keys as words with a one-word pad per row (conflict-free column reads), values as
 * bytes; float path: the same in floats.
 */
template <int HD, int R, bool F>
struct attn_smem
{
	static constexpr int QWORDS = HD / 4;
	static constexpr int KSTRIDE = F ? HD + 1 : HD / 4 + 1;	/* floats or words per key row */
	static constexpr size_t Q_BYTES = F ? (size_t) R * HD * 4 : (size_t) R * HD;
	static constexpr size_t K_BYTES = (size_t) ATTN_CHUNK * KSTRIDE * 4;
	static constexpr size_t V_BYTES = F ? (size_t) ATTN_CHUNK * HD * 4 : (size_t) ATTN_CHUNK * HD;
	static constexpr size_t E_STRIDE = ATTN_CHUNK + 1;
	static constexpr size_t OFF_Q = 0;
	static constexpr size_t OFF_K = OFF_Q + Q_BYTES;
	static constexpr size_t OFF_V = OFF_K + K_BYTES;
	static constexpr size_t OFF_KS = OFF_V + V_BYTES;
	static constexpr size_t OFF_VS = OFF_KS + ATTN_CHUNK * 4;
	static constexpr size_t OFF_QS = OFF_VS + ATTN_CHUNK * 4;
	static constexpr size_t OFF_E = OFF_QS + R * 4;
	static constexpr size_t OFF_M = OFF_E + (size_t) R * E_STRIDE * 4;
	static constexpr size_t OFF_INV = OFF_M + R * 4;
	static constexpr size_t OFF_PART = OFF_INV + R * 4;
	static constexpr size_t OFF_LO = OFF_PART + (size_t) R * 16 * 4;
	static constexpr size_t OFF_HI = OFF_LO + R * 4;
	static constexpr size_t OFF_ROW = OFF_HI + R * 4;	/* activation row of each query row */
	static constexpr size_t OFF_HEAD = OFF_ROW + R * 4; /* query head of each query row */
	/* each row's running merge state across segments, and the current segment's weights */
	static constexpr size_t OFF_RM = OFF_HEAD + R * 4;
	static constexpr size_t OFF_RL = OFF_RM + R * 4;
	static constexpr size_t OFF_WA = OFF_RL + R * 4;
	static constexpr size_t OFF_WB = OFF_WA + R * 4;
	/* int8 path: the segment's value scales, and each row's weight scale and output factor */
	static constexpr size_t OFF_VSEG = OFF_WB + R * 4;
	static constexpr size_t OFF_QINV = OFF_VSEG + ATTN_SEGMENT * 4;
	static constexpr size_t OFF_G = OFF_QINV + R * 4;
	static constexpr size_t BYTES = OFF_G + R * 4;
	/* two-digit keys: the chunk's second digits, laid out as the keys, past BYTES */
	static constexpr size_t OFF_K2 = BYTES;
	static constexpr size_t BYTES_K2 = BYTES + (F ? 0 : K_BYTES);
};

/*
 * One chunk of keys (and values) in flight: each thread's share of the chunk's 16-byte vectors,
 * held in registers between the global loads (issued a chunk ahead, so that their latency
 * overlaps the current chunk's arithmetic) and the stores to shared memory.
 */
template <int HD, int R, bool F>
struct chunk_regs
{
	static constexpr int VEC_PER_KEY = F ? HD / 4 : HD / 16;	/* 16-byte vectors per key row */
	static constexpr int TOTAL = ATTN_CHUNK * VEC_PER_KEY;
	static constexpr int NV = (TOTAL + ATTN_THREADS - 1) / ATTN_THREADS;
	int4		k[NV];
	int4		v[NV];
	float		ks;
	float		vs;
};

/* Address of the key row (values: + 16 * n_kv * HD elements) of a position. */
template <int HD, bool F>
static __device__ __forceinline__ const int4 *
kv_row(const attn_source &src, const int32_t *bt, int kvh, int pos, bool value)
{
	int			block = bt[pos / CAI_CUDA_KV_BLOCK_TOKENS];
	int			slot = pos % CAI_CUDA_KV_BLOCK_TOKENS;
	size_t		elem = ((size_t) slot * src.n_kv + kvh) * HD +
		(value ? (size_t) CAI_CUDA_KV_BLOCK_TOKENS * src.n_kv * HD : 0);

	if (F)
		return (const int4 *) (src.shadow + (size_t) block * src.sh_block_floats +
							   src.sh_layer_off + elem);
	return (const int4 *) (src.pool + (size_t) block * src.block_bytes + src.layer_off + elem);
}

/* Address of a position's second key digits (two-digit keys), after the layer part's scales. */
template <int HD>
static __device__ __forceinline__ const int4 *
kv_key2_row(const attn_source &src, const int32_t *bt, int kvh, int pos)
{
	int			block = bt[pos / CAI_CUDA_KV_BLOCK_TOKENS];
	int			slot = pos % CAI_CUDA_KV_BLOCK_TOKENS;
	size_t		off = key2_plane_offset(src.n_kv, HD) + ((size_t) slot * src.n_kv + kvh) * HD;

	return (const int4 *) (src.pool + (size_t) block * src.block_bytes + src.layer_off + off);
}

/*
 * A query row quantized per head with cai_op_quantize_vec_i8's rule, by one warp: q8 gets the
 * int8 values; the result (the same in every lane) is the row's scale times the score scale.
 */
template <int HD>
static __device__ __forceinline__ float
quantize_query(const float *qrow, int8_t *q8, float scale, int lane)
{
	float		amax = 0.0f,
				qs = 0.0f,
				inv = 0.0f;
	bool		nonzero;

	for (int d = lane; d < HD; d += CUDA_WARP)
		amax = fmaxf(amax, fabsf(qrow[d]));
	amax = warp_max(amax);
	nonzero = quant_row_scale(amax, &qs, &inv);
	for (int d = lane; d < HD; d += CUDA_WARP)
		q8[d] = nonzero ? quant_one(qrow[d], inv) : 0;
	return __fmul_rn(nonzero ? qs : 0.0f, scale);
}

/* The key and value scales of a position in the int8 pool. */
template <int HD>
static __device__ __forceinline__ void
kv_scales(const attn_source &src, const int32_t *bt, int kvh, int pos, float *ks, float *vs)
{
	int			block = bt[pos / CAI_CUDA_KV_BLOCK_TOKENS];
	int			slot = pos % CAI_CUDA_KV_BLOCK_TOKENS;
	const float *scales = (const float *) (src.pool + (size_t) block * src.block_bytes +
										   src.layer_off +
										   (size_t) 2 * CAI_CUDA_KV_BLOCK_TOKENS * src.n_kv * HD);

	*ks = scales[slot * src.n_kv + kvh];
	if (vs)
		*vs = scales[CAI_CUDA_KV_BLOCK_TOKENS * src.n_kv + slot * src.n_kv + kvh];
}

/*
 * cpu/attention.h's cai_attention_exp2, operation for operation: x clamped to [-126, 127] (a NaN
 * becomes -126, as the CPU's masks give), k = x rounded to nearest even by the 1.5 * 2^23 trick,
 * r = x - k (exact), the degree-6 polynomial (CAI_ATTN_EXP2_C1..C6) by Horner's rule with each
 * step fused and rounded once, as vfmadd and fmaf do, times 2^k: the CPU's result bit for bit.
 */
static __device__ __forceinline__ float
attn_exp2(float x)
{
	const float magic = 12582912.0f;
	float		k,
				r,
				p;

	x = x > -126.0f ? x : -126.0f;
	x = x < 127.0f ? x : 127.0f;
	k = __fsub_rn(__fadd_rn(x, magic), magic);
	r = __fsub_rn(x, k);
	p = __fmaf_rn(0.0001534581242594868f, r, 0.0013399930903688073f);
	p = __fmaf_rn(p, r, 0.009618489071726799f);
	p = __fmaf_rn(p, r, 0.05550328642129898f);
	p = __fmaf_rn(p, r, 0.24022646248340607f);
	p = __fmaf_rn(p, r, 0.6931471824645996f);
	p = __fmaf_rn(p, r, 1.0f);
	return exp_scale(p, k);
}

/*
 * The int8 path's value weights (cpu/attention.h): a row's weight scale 16383 / vmax for its
 * largest value scale vmax, and a position's weight round((e * v_scale) * qinv), to nearest even.
 */
static __device__ __forceinline__ float
weight_qinv(float vmax)
{
	return vmax >= ATTN_VSCALE_MIN ? __fdiv_rn((float) ATTN_WEIGHT_MAX, vmax) : 0.0f;
}

static __device__ __forceinline__ int
quantize_weight(float e, float v_scale, float qinv)
{
	return __float2int_rn(__fmul_rn(__fmul_rn(e, v_scale), qinv));
}

/*
 * A segment's softmax total from a row's sixteen partial sums (position i in partial i % 16):
 * cpu/attention.c's partials_total, pairs p[i] + p[i + 8], then the tree of eight.
 */
static __device__ __forceinline__ float
segment_total(const float *part)
{
	float		pairs[8];

#pragma unroll
	for (int i = 0; i < 8; i++)
		pairs[i] = __fadd_rn(part[i], part[i + 8]);
	return tree8(pairs);
}

/*
 * Issues the loads of chunk [c0, c0 + 32): keys, and with values the values and both scales.
 * Positions outside the tile's range [jlo, jhi] get zeros: pass C's zero-weight products must
 * stay zero (stale shared memory read as floats could be a NaN).
 */
template <int HD, int R, bool F>
static __device__ __forceinline__ void
fetch_chunk(const attn_source &src, const int32_t *bt, int kvh, int c0, int jlo, int jhi,
			bool values, chunk_regs<HD, R, F> &cr)
{
	typedef chunk_regs<HD, R, F> C;

#pragma unroll
	for (int n = 0; n < C::NV; n++)
	{
		int			i = threadIdx.x + n * ATTN_THREADS;
		int			j = i / C::VEC_PER_KEY;
		int			vec = i % C::VEC_PER_KEY;
		int			pos = c0 + j;

		cr.k[n] = make_int4(0, 0, 0, 0);
		cr.v[n] = make_int4(0, 0, 0, 0);
		if (i >= C::TOTAL || pos < jlo || pos > jhi)
			continue;
		cr.k[n] = kv_row<HD, F>(src, bt, kvh, pos, false)[vec];
		if (values)
			cr.v[n] = kv_row<HD, F>(src, bt, kvh, pos, true)[vec];
	}
	cr.ks = 0.0f;
	cr.vs = 0.0f;
	if (!F && threadIdx.x < ATTN_CHUNK)
	{
		int			pos = c0 + threadIdx.x;

		if (pos >= jlo && pos <= jhi)
			kv_scales<HD>(src, bt, kvh, pos, &cr.ks, values ? &cr.vs : NULL);
	}
}

/*
 * Stores a fetched chunk into shared memory (keys word by word into their padded rows).  With
 * two-digit keys the chunk's second digits are loaded here too, straight into their rows (not a
 * chunk ahead: their registers would not fit beside the rest).
 */
template <int HD, int R, bool F>
static __device__ __forceinline__ void
commit_chunk(const chunk_regs<HD, R, F> &cr, bool values, uint8_t *smem, const attn_source &src,
			 const int32_t *bt, int kvh, int c0, int jlo, int jhi)
{
	typedef attn_smem<HD, R, F> S;
	typedef chunk_regs<HD, R, F> C;

	if (!F && src.two_digit_keys)
		for (int i = threadIdx.x; i < C::TOTAL; i += ATTN_THREADS)
		{
			int			j = i / C::VEC_PER_KEY;
			int			vec = i % C::VEC_PER_KEY;
			int			pos = c0 + j;
			int4		k2 = make_int4(0, 0, 0, 0);
			int		   *kd = (int *) (smem + S::OFF_K2) + (size_t) j * S::KSTRIDE + vec * 4;

			if (pos >= jlo && pos <= jhi)
				k2 = kv_key2_row<HD>(src, bt, kvh, pos)[vec];
			kd[0] = k2.x;
			kd[1] = k2.y;
			kd[2] = k2.z;
			kd[3] = k2.w;
		}

#pragma unroll
	for (int n = 0; n < C::NV; n++)
	{
		int			i = threadIdx.x + n * ATTN_THREADS;
		int			j = i / C::VEC_PER_KEY;
		int			vec = i % C::VEC_PER_KEY;
		int		   *kd;

		if (i >= C::TOTAL)
			continue;
		kd = (int *) (smem + S::OFF_K) + (size_t) j * S::KSTRIDE + vec * 4;
		kd[0] = cr.k[n].x;
		kd[1] = cr.k[n].y;
		kd[2] = cr.k[n].z;
		kd[3] = cr.k[n].w;
		if (values)
			((int4 *) (smem + S::OFF_V))[i] = cr.v[n];
	}
	if (!F && threadIdx.x < ATTN_CHUNK)
	{
		((float *) (smem + S::OFF_KS))[threadIdx.x] = cr.ks;
		if (values)
			((float *) (smem + S::OFF_VS))[threadIdx.x] = cr.vs;
	}
}

/*
 * Two-digit keys: a query's dot with the keys' first digits, and k2 their second digits, into
 * the exact 254 (q . k) + q . k2.
 */
template <int QWORDS>
static __device__ __forceinline__ int
with_second_digits(int dot, const int *q, const int *k2)
{
	int			dot2 = 0;

#pragma unroll 8
	for (int w = 0; w < QWORDS; w++)
		dot2 = __dp4a(q[w], k2[w], dot2);
	return CAI_CUDA_KEY_DIGIT_BASE * dot + dot2;
}

/*
 * The score of query row r against chunk key j, exactly as the CPU computes it (two-digit keys:
 * the dot product 254 (q . k) + q . k2).
 */
template <int HD, int R, bool F>
static __device__ __forceinline__ float
attn_score(const uint8_t *smem, int r, int j, bool two_digit_keys)
{
	typedef attn_smem<HD, R, F> S;

	if (F)
	{
		const float *q = (const float *) (smem + S::OFF_Q) + (size_t) r * HD;
		const float *k = (const float *) (smem + S::OFF_K) + (size_t) j * S::KSTRIDE;
		float		acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};

		/* dot_f32: partial i % 8, in order, then the tree */
		for (int i = 0; i < HD; i += 8)
		{
#pragma unroll
			for (int l = 0; l < 8; l++)
				acc[l] = __fadd_rn(acc[l], __fmul_rn(q[i + l], k[i + l]));
		}
		return tree8(acc);
	}
	else
	{
		const int  *q = (const int *) (smem + S::OFF_Q) + (size_t) r * S::QWORDS;
		const int  *k = (const int *) (smem + S::OFF_K) + (size_t) j * S::KSTRIDE;
		const float *qs = (const float *) (smem + S::OFF_QS);
		const float *ks = (const float *) (smem + S::OFF_KS);
		int			dot = 0;

#pragma unroll 8
		for (int w = 0; w < S::QWORDS; w++)
			dot = __dp4a(q[w], k[w], dot);
		if (two_digit_keys)
			dot = with_second_digits<S::QWORDS>(dot, q, (const int *) (smem + S::OFF_K2) +
												(size_t) j * S::KSTRIDE);
		return __fmul_rn(__int2float_rn(dot), __fmul_rn(qs[r], ks[j]));
	}
}

/*
 * The int8 path runs two blocks per SM (at most 128 registers, no spills); the float reference
 * path, whose key chunks take four times the registers, one block with everything in registers.
 */
template <int HD, int R, bool F>
static __global__ void __launch_bounds__(ATTN_THREADS, F ? 1 : 2)
attention_kernel(attn_source src, const int32_t *__restrict__ counts,
				 const attn_seq_rec *__restrict__ seqs, const attn_item_rec *__restrict__ items,
				 const int32_t *__restrict__ block_tables, const float *__restrict__ q, int ldq,
				 float *__restrict__ out, int ldo, int group, int window, float scale,
				 int split_segs, float *__restrict__ part_o, float *__restrict__ part_ml)
{
	typedef attn_smem<HD, R, F> S;
	constexpr int PAIRS = R * HD / ATTN_THREADS;	/* (row, dim) outputs per thread */
	constexpr int SCORE_PAIRS = R * ATTN_CHUNK / ATTN_THREADS;
	extern __shared__ __align__(16) uint8_t smem[];
	float	   *E = (float *) (smem + S::OFF_E);
	float	   *row_m = (float *) (smem + S::OFF_M);
	float	   *row_inv = (float *) (smem + S::OFF_INV);
	float	   *part = (float *) (smem + S::OFF_PART);
	int		   *row_lo = (int *) (smem + S::OFF_LO);
	int		   *row_hi = (int *) (smem + S::OFF_HI);
	int		   *row_act = (int *) (smem + S::OFF_ROW);
	int		   *row_head = (int *) (smem + S::OFF_HEAD);
	float	   *row_M = (float *) (smem + S::OFF_RM);
	float	   *row_L = (float *) (smem + S::OFF_RL);
	float	   *row_wa = (float *) (smem + S::OFF_WA);
	float	   *row_wb = (float *) (smem + S::OFF_WB);
	float	   *vseg = (float *) (smem + S::OFF_VSEG);
	float	   *row_qinv = (float *) (smem + S::OFF_QINV);
	float	   *row_g = (float *) (smem + S::OFF_G);
	int			kvh = blockIdx.y;
	int			warp = threadIdx.x / CUDA_WARP;
	int			lane = threadIdx.x % CUDA_WARP;
	attn_item_rec it;
	attn_seq_rec sq;
	const int32_t *bt;
	int			jlo,
				jhi,
				c_first;
	float		acc[PAIRS];
	int			iacc[PAIRS];	/* the int8 path's exact value sums */
	chunk_regs<HD, R, F> cr;

	if ((int) blockIdx.x >= counts[2])
		return;
	it = items[blockIdx.x];
	sq = seqs[it.seq];
	bt = block_tables + sq.bt_offset;

	/* each query row's token, head and position range; empty range for unused rows */
	for (int r = threadIdx.x; r < R; r += ATTN_THREADS)
	{
		if (r < it.n_qrows)
		{
			int			qr = it.qrow0 + r;
			int			tl = qr / group;
			int			pos = sq.pos + tl;
			int			lo = 0;

			if (window > 0 && pos - window + 1 > 0)
				lo = pos - window + 1;
			row_lo[r] = lo;
			row_hi[r] = pos;
			row_act[r] = sq.row0 + tl;
			row_head[r] = kvh * group + qr % group;
		}
		else
		{
			row_lo[r] = 1;
			row_hi[r] = 0;
			row_act[r] = 0;
			row_head[r] = 0;
		}
		row_m[r] = -INFINITY;
#pragma unroll
		for (int k = 0; k < 16; k++)
			part[r * 16 + k] = 0.0f;
	}
	__syncthreads();

	/* queries: one warp per row; int8 per head with cai_op_quantize_vec_i8's rule, or float */
	for (int r = warp; r < it.n_qrows; r += ATTN_THREADS / CUDA_WARP)
	{
		const float *qrow = q + (size_t) row_act[r] * ldq + (size_t) row_head[r] * HD;

		if (F)
		{
			float	   *qf = (float *) (smem + S::OFF_Q) + (size_t) r * HD;

			for (int d = lane; d < HD; d += CUDA_WARP)
				qf[d] = __fmul_rn(qrow[d], scale);
		}
		else
		{
			float		qs = quantize_query<HD>(qrow, (int8_t *) (smem + S::OFF_Q) + (size_t) r * HD,
												scale, lane);

			if (lane == 0)
				((float *) (smem + S::OFF_QS))[r] = qs;
		}
	}
	jlo = row_lo[0];
	jhi = row_hi[it.n_qrows - 1];
	__syncthreads();

	{
		constexpr int RSTEP = ATTN_THREADS / HD;
		int			d = threadIdx.x % HD;
		int			r0 = threadIdx.x / HD;

		/*
		 * Rows past the item's real query rows (a decode tile has a few of R) take no work: a
		 * warp's threads share r0 (HD >= 32), so the test below is uniform across the warp.
		 */
		int			real_pairs = r0 < it.n_qrows ? (it.n_qrows - r0 + RSTEP - 1) / RSTEP : 0;
		float		out_acc[PAIRS];
		int			seg_first = jlo / ATTN_SEGMENT;
		int			seg_last = jhi / ATTN_SEGMENT;
		const int	n_heads = (int) gridDim.y * group;

		/* split: this block's one segment, its sums left in the partials for the merge */
		if (split_segs > 0)
		{
			if ((int) blockIdx.z < seg_first || (int) blockIdx.z > seg_last)
				return;
			seg_first = seg_last = (int) blockIdx.z;
		}
#pragma unroll
		for (int k = 0; k < PAIRS; k++)
			out_acc[k] = 0.0f;

		for (int seg = seg_first; seg <= seg_last; seg++)
		{
			int			seg_lo = seg * ATTN_SEGMENT > jlo ? seg * ATTN_SEGMENT : jlo;
			int			seg_hi = seg * ATTN_SEGMENT + ATTN_SEGMENT - 1 < jhi ?
				seg * ATTN_SEGMENT + ATTN_SEGMENT - 1 : jhi;

			/* chunks never straddle a segment: 256 is a multiple of 32 */
			c_first = seg_lo / ATTN_CHUNK * ATTN_CHUNK;
			for (int r = threadIdx.x; r < R; r += ATTN_THREADS)
			{
				row_m[r] = -INFINITY;
#pragma unroll
				for (int k = 0; k < 16; k++)
					part[r * 16 + k] = 0.0f;
			}
			if (!F)
				for (int j = threadIdx.x; j < ATTN_SEGMENT; j += ATTN_THREADS)
				{
					int			pos = seg * ATTN_SEGMENT + j;
					float		ks;

					if (pos >= seg_lo && pos <= seg_hi)
						kv_scales<HD>(src, bt, kvh, pos, &ks, &vseg[j]);
				}
			__syncthreads();

			/*
			 * pass A: every row's maximum score in the segment.  Each pass walks the chunks with
			 * the next chunk's loads issued before the current chunk's arithmetic.
			 */
			fetch_chunk<HD, R, F>(src, bt, kvh, c_first, seg_lo, seg_hi, false, cr);
			for (int c0 = c_first; c0 <= seg_hi; c0 += ATTN_CHUNK)
			{
				commit_chunk<HD, R, F>(cr, false, smem, src, bt, kvh, c0, seg_lo, seg_hi);
				__syncthreads();
				if (c0 + ATTN_CHUNK <= seg_hi)
					fetch_chunk<HD, R, F>(src, bt, kvh, c0 + ATTN_CHUNK, seg_lo, seg_hi, false, cr);
#pragma unroll
				for (int k = 0; k < SCORE_PAIRS; k++)
				{
					int			p = threadIdx.x + k * ATTN_THREADS;
					int			r = p / ATTN_CHUNK;
					int			j = p % ATTN_CHUNK;
					int			pos = c0 + j;

					if (pos >= seg_lo && pos <= seg_hi && pos >= row_lo[r] && pos <= row_hi[r])
						E[r * S::E_STRIDE + j] = attn_score<HD, R, F>(smem, r, j, src.two_digit_keys);
				}
				__syncthreads();
				/* a warp per real row, a lane per key: a maximum is the same in any order */
				for (int r = warp; r < it.n_qrows; r += ATTN_THREADS / CUDA_WARP)
				{
					int			pos = c0 + lane;
					float		m = -INFINITY;

					if (pos >= seg_lo && pos <= seg_hi && pos >= row_lo[r] && pos <= row_hi[r])
						m = E[r * S::E_STRIDE + lane];
					m = warp_max(m);
					if (lane == 0 && m > row_m[r])
						row_m[r] = m;
				}
				__syncthreads();
			}

			/* pass B: exponentials into each row's sixteen partial sums (i % 16, in order) */
			fetch_chunk<HD, R, F>(src, bt, kvh, c_first, seg_lo, seg_hi, false, cr);
			for (int c0 = c_first; c0 <= seg_hi; c0 += ATTN_CHUNK)
			{
				commit_chunk<HD, R, F>(cr, false, smem, src, bt, kvh, c0, seg_lo, seg_hi);
				__syncthreads();
				if (c0 + ATTN_CHUNK <= seg_hi)
					fetch_chunk<HD, R, F>(src, bt, kvh, c0 + ATTN_CHUNK, seg_lo, seg_hi, false, cr);
#pragma unroll
				for (int k = 0; k < SCORE_PAIRS; k++)
				{
					int			p = threadIdx.x + k * ATTN_THREADS;
					int			r = p / ATTN_CHUNK;
					int			j = p % ATTN_CHUNK;
					int			pos = c0 + j;

					if (pos >= seg_lo && pos <= seg_hi && pos >= row_lo[r] && pos <= row_hi[r])
						E[r * S::E_STRIDE + j] =
							attn_exp2(__fsub_rn(attn_score<HD, R, F>(smem, r, j, src.two_digit_keys), row_m[r]));
				}
				__syncthreads();
				/*
				 * Partial sum lane16 of a real row takes the row's positions i = pos - lo with
				 * i % 16 == lane16, in order: at most two per chunk, visited directly.
				 */
				for (int p = threadIdx.x; p < it.n_qrows * 16; p += ATTN_THREADS)
				{
					int			r = p / 16;
					int			lane16 = p % 16;
					int			lo = row_lo[r] > seg_lo ? row_lo[r] : seg_lo;
					int			hi = row_hi[r] < seg_hi ? row_hi[r] : seg_hi;
					int			c_lo = c0 > lo ? c0 : lo;
					int			c_hi = c0 + ATTN_CHUNK - 1 < hi ? c0 + ATTN_CHUNK - 1 : hi;
					int			pos = c_lo + (((lane16 - (c_lo - lo)) % 16) + 16) % 16;
					float		sum = part[p];

					for (; pos <= c_hi; pos += 16)
						sum = __fadd_rn(sum, E[r * S::E_STRIDE + (pos - c0)]);
					part[p] = sum;
				}
				__syncthreads();
			}

			/* int8 path: each real row's largest value scale over its range (a warp per row) */
			if (!F)
			{
				for (int r = warp; r < it.n_qrows; r += ATTN_THREADS / CUDA_WARP)
				{
					int			lo = row_lo[r] > seg_lo ? row_lo[r] : seg_lo;
					int			hi = row_hi[r] < seg_hi ? row_hi[r] : seg_hi;
					float		vm = 0.0f;

					for (int pos = lo + lane; pos <= hi; pos += CUDA_WARP)
						vm = fmaxf(vm, vseg[pos - seg * ATTN_SEGMENT]);
					vm = warp_max(vm);
					if (lane == 0)
						row_g[r] = vm;
				}
				__syncthreads();
			}

			/*
			 * The segment's total, its normalizer (the int8 path's weight scale and output
			 * factor), and the weights folding it into each row's output
			 * (cpu/attention.c's fold_segment): a row's first segment starts its state.
			 */
			for (int r = threadIdx.x; r < R; r += ATTN_THREADS)
			{
				int			lo = row_lo[r] > seg_lo ? row_lo[r] : seg_lo;
				int			hi = row_hi[r] < seg_hi ? row_hi[r] : seg_hi;
				int			n = hi - lo + 1;
				float		l;

				if (n <= 0)
				{
					row_inv[r] = 0.0f;
					continue;
				}
				l = segment_total(part + r * 16);
				row_inv[r] = __fdiv_rn(1.0f, l);
				if (!F && r < it.n_qrows)
				{
					float		vmax = row_g[r];

					row_qinv[r] = weight_qinv(vmax);
					row_g[r] = __fdiv_rn(__fdiv_rn(vmax, (float) ATTN_WEIGHT_MAX), l);
				}
				if (split_segs > 0 && r < it.n_qrows)
				{
					size_t		at = ((size_t) row_act[r] * n_heads + row_head[r]) * split_segs + seg;

					part_ml[2 * at] = row_m[r];
					part_ml[2 * at + 1] = l;
				}
				if (lo == row_lo[r])
				{
					row_M[r] = row_m[r];
					row_L[r] = l;
					row_wa[r] = 0.0f;
					row_wb[r] = 1.0f;
				}
				else
				{
					float		mn = row_m[r] > row_M[r] ? row_m[r] : row_M[r];
					float		a = __fmul_rn(attn_exp2(__fsub_rn(row_M[r], mn)), row_L[r]);
					float		b = __fmul_rn(attn_exp2(__fsub_rn(row_m[r], mn)), l);
					float		ln = __fadd_rn(a, b);

					row_wa[r] = __fdiv_rn(a, ln);
					row_wb[r] = __fdiv_rn(b, ln);
					row_M[r] = mn;
					row_L[r] = ln;
				}
			}
			__syncthreads();

			/*
			 * pass C: values.  A thread owns one dimension d of rows r0, r0 + RSTEP, ...; a
			 * position outside a row's range gets weight 0.  The float path accumulates in
			 * ascending position order (adding 0 * v, v finite, leaves a sum that started at +0
			 * unchanged, so the result is the CPU's sum over the row's own positions); the int8
			 * path sums its quantized weights times the values exactly (attention.h).
			 */
#pragma unroll
			for (int k = 0; k < PAIRS; k++)
			{
				acc[k] = 0.0f;
				iacc[k] = 0;
			}
			fetch_chunk<HD, R, F>(src, bt, kvh, c_first, seg_lo, seg_hi, true, cr);
			for (int c0 = c_first; c0 <= seg_hi; c0 += ATTN_CHUNK)
			{
				commit_chunk<HD, R, F>(cr, true, smem, src, bt, kvh, c0, seg_lo, seg_hi);
				__syncthreads();
				if (c0 + ATTN_CHUNK <= seg_hi)
					fetch_chunk<HD, R, F>(src, bt, kvh, c0 + ATTN_CHUNK, seg_lo, seg_hi, true, cr);
#pragma unroll
				for (int k = 0; k < SCORE_PAIRS; k++)
				{
					int			p = threadIdx.x + k * ATTN_THREADS;
					int			r = p / ATTN_CHUNK;
					int			j = p % ATTN_CHUNK;
					int			pos = c0 + j;
					float		w = 0.0f;
					int			qw = 0;

					if (pos >= seg_lo && pos <= seg_hi && pos >= row_lo[r] && pos <= row_hi[r])
					{
						float		e = attn_exp2(__fsub_rn(attn_score<HD, R, F>(smem, r, j, src.two_digit_keys), row_m[r]));

						if (F)
							w = __fmul_rn(e, row_inv[r]);
						else
							qw = quantize_weight(e, vseg[pos - seg * ATTN_SEGMENT], row_qinv[r]);
					}
					if (F)
						E[r * S::E_STRIDE + j] = w;
					else
						((int *) E)[r * S::E_STRIDE + j] = qw;
				}
				__syncthreads();
				for (int j = 0; j < ATTN_CHUNK; j++)
				{
					if (F)
					{
						float		v = ((const float *) (smem + S::OFF_V))[j * HD + d];

#pragma unroll
						for (int k = 0; k < PAIRS; k++)
							if (k < real_pairs)
								acc[k] = __fadd_rn(acc[k],
												   __fmul_rn(E[(r0 + k * RSTEP) * S::E_STRIDE + j], v));
					}
					else
					{
						int			v = ((const int8_t *) (smem + S::OFF_V))[j * HD + d];

#pragma unroll
						for (int k = 0; k < PAIRS; k++)
							if (k < real_pairs)
								iacc[k] += ((const int *) E)[(r0 + k * RSTEP) * S::E_STRIDE + j] * v;
					}
				}
				__syncthreads();
			}

			/* the segment folded into the rows that meet it, or left for the merge */
#pragma unroll
			for (int k = 0; k < PAIRS; k++)
			{
				int			r = r0 + k * RSTEP;

				if (k >= real_pairs || row_lo[r] > seg_hi || row_hi[r] < seg_lo)
					continue;
				if (!F)
					acc[k] = __fmul_rn(__int2float_rn(iacc[k]), row_g[r]);
				if (split_segs > 0)
					part_o[(((size_t) row_act[r] * n_heads + row_head[r]) * split_segs + seg) * HD + d] =
						acc[k];
				else
					out_acc[k] = __fadd_rn(__fmul_rn(row_wa[r], out_acc[k]), __fmul_rn(row_wb[r], acc[k]));
			}
			__syncthreads();
		}
		if (split_segs > 0)
			return;
#pragma unroll
		for (int k = 0; k < PAIRS; k++)
		{
			int			r = r0 + k * RSTEP;

			if (r < it.n_qrows)
				out[(size_t) row_act[r] * ldo + (size_t) row_head[r] * HD + d] = out_acc[k];
		}
	}
}


/*
 * The decode kernel: tiles of at most CUDA_DECODE_TILE_ROWS query rows (a decode step's token has `group`
 * rows), one block per (tile, KV head, segment).  Where attention_kernel walks a segment in
 * chunks of 32 keys, three times, with barriers and a global-load latency per chunk, this kernel
 * loads the whole segment's keys, values and scales into shared memory at once, computes each
 * score once, and leaves the segment's (max, sum) and value sums in the partials for
 * attention_merge_kernel.  The operations and their order are attention_kernel's split path's
 * (the same query quantization, score, exponential, sixteen partial sums, largest value
 * scale, quantized weights and exact integer value sums; positions outside a row's range,
 * zero-weight there, are skipped), so the results are the same bits.
 */

template <int HD>
struct decode_smem
{
	static constexpr int QWORDS = HD / 4;
	static constexpr int KSTRIDE = HD / 4 + 1;	/* words per key row: conflict-free column reads */
	static constexpr size_t OFF_K = 0;
	static constexpr size_t OFF_V = OFF_K + (size_t) ATTN_SEGMENT * KSTRIDE * 4;
	static constexpr size_t OFF_KS = OFF_V + (size_t) ATTN_SEGMENT * HD;
	static constexpr size_t OFF_VS = OFF_KS + ATTN_SEGMENT * 4;
	static constexpr size_t OFF_E = OFF_VS + ATTN_SEGMENT * 4;
	static constexpr size_t OFF_Q = OFF_E + (size_t) CUDA_DECODE_TILE_ROWS * ATTN_SEGMENT * 4;
	static constexpr size_t OFF_QS = OFF_Q + (size_t) CUDA_DECODE_TILE_ROWS * HD;
	static constexpr size_t OFF_M = OFF_QS + CUDA_DECODE_TILE_ROWS * 4;
	static constexpr size_t OFF_INV = OFF_M + CUDA_DECODE_TILE_ROWS * 4;
	static constexpr size_t OFF_PART = OFF_INV + CUDA_DECODE_TILE_ROWS * 4;
	static constexpr size_t OFF_LO = OFF_PART + CUDA_DECODE_TILE_ROWS * 16 * 4;
	static constexpr size_t OFF_HI = OFF_LO + CUDA_DECODE_TILE_ROWS * 4;
	static constexpr size_t OFF_ROW = OFF_HI + CUDA_DECODE_TILE_ROWS * 4;
	static constexpr size_t OFF_HEAD = OFF_ROW + CUDA_DECODE_TILE_ROWS * 4;
	static constexpr size_t OFF_G = OFF_HEAD + CUDA_DECODE_TILE_ROWS * 4;
	static constexpr size_t BYTES = OFF_G + CUDA_DECODE_TILE_ROWS * 4;
	/* two-digit keys: the segment's second digits, laid out as the keys, past BYTES */
	static constexpr size_t OFF_K2 = BYTES;
	static constexpr size_t BYTES_K2 = BYTES + (size_t) ATTN_SEGMENT * KSTRIDE * 4;
};

template <int HD>
static __global__ void __launch_bounds__(ATTN_THREADS, 1)
attention_decode_kernel(attn_source src, const int32_t *__restrict__ counts,
						const attn_seq_rec *__restrict__ seqs,
						const attn_item_rec *__restrict__ items,
						const int32_t *__restrict__ block_tables, const float *__restrict__ q,
						int ldq, int group, int window, float scale, int split_segs,
						float *__restrict__ part_o, float *__restrict__ part_ml)
{
	typedef decode_smem<HD> S;
	constexpr int VPK = HD / 16;	/* 16-byte vectors per key or value row */
	constexpr int NV = ATTN_SEGMENT * VPK / ATTN_THREADS;
	extern __shared__ __align__(16) uint8_t smem[];
	int		   *K = (int *) (smem + S::OFF_K);
	int8_t	   *V = (int8_t *) (smem + S::OFF_V);
	float	   *KS = (float *) (smem + S::OFF_KS);
	float	   *VS = (float *) (smem + S::OFF_VS);
	float	   *E = (float *) (smem + S::OFF_E);
	float	   *QS = (float *) (smem + S::OFF_QS);
	float	   *row_m = (float *) (smem + S::OFF_M);
	float	   *row_qinv = (float *) (smem + S::OFF_INV);
	float	   *part = (float *) (smem + S::OFF_PART);
	int		   *row_lo = (int *) (smem + S::OFF_LO);
	int		   *row_hi = (int *) (smem + S::OFF_HI);
	int		   *row_act = (int *) (smem + S::OFF_ROW);
	int		   *row_head = (int *) (smem + S::OFF_HEAD);
	float	   *row_g = (float *) (smem + S::OFF_G);
	int		   *W = (int *) E;	/* the weights, in place of the exponentials */
	int			kvh = blockIdx.y;
	int			seg = blockIdx.z;
	int			seg_base = seg * ATTN_SEGMENT;
	int			warp = threadIdx.x / CUDA_WARP;
	int			lane = threadIdx.x % CUDA_WARP;
	const int	n_heads = (int) gridDim.y * group;
	attn_item_rec it;
	attn_seq_rec sq;
	const int32_t *bt;
	int			n_rows,
				seg_lo,
				seg_hi;

	if ((int) blockIdx.x >= counts[2])
		return;
	it = items[blockIdx.x];
	sq = seqs[it.seq];
	bt = block_tables + sq.bt_offset;
	n_rows = it.n_qrows;

	/* the tile's rows (attention_kernel's rule); the block's segment of the tile's range */
	{
		int			first_pos = sq.pos + it.qrow0 / group;
		int			last_pos = sq.pos + (it.qrow0 + n_rows - 1) / group;
		int			jlo = window > 0 && first_pos - window + 1 > 0 ? first_pos - window + 1 : 0;

		if (seg < jlo / ATTN_SEGMENT || seg > last_pos / ATTN_SEGMENT)
			return;
		seg_lo = seg_base > jlo ? seg_base : jlo;
		seg_hi = seg_base + ATTN_SEGMENT - 1 < last_pos ? seg_base + ATTN_SEGMENT - 1 : last_pos;
	}
	for (int r = threadIdx.x; r < n_rows; r += ATTN_THREADS)
	{
		int			qr = it.qrow0 + r;
		int			tl = qr / group;
		int			pos = sq.pos + tl;
		int			lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;

		/* the row's positions within this segment (empty when it ends before or starts after) */
		row_lo[r] = lo > seg_lo ? lo : seg_lo;
		row_hi[r] = pos < seg_hi ? pos : seg_hi;
		row_act[r] = sq.row0 + tl;
		row_head[r] = kvh * group + qr % group;
#pragma unroll
		for (int k = 0; k < 16; k++)
			part[r * 16 + k] = 0.0f;
	}

	/* the segment's keys, values and scales: every load issued before any store */
	{
		int4		kr[NV],
					vr[NV];

#pragma unroll
		for (int n = 0; n < NV; n++)
		{
			int			i = threadIdx.x + n * ATTN_THREADS;
			int			pos = seg_base + i / VPK;

			kr[n] = make_int4(0, 0, 0, 0);
			vr[n] = make_int4(0, 0, 0, 0);
			if (pos >= seg_lo && pos <= seg_hi)
			{
				kr[n] = kv_row<HD, false>(src, bt, kvh, pos, false)[i % VPK];
				vr[n] = kv_row<HD, false>(src, bt, kvh, pos, true)[i % VPK];
			}
		}
		for (int j = threadIdx.x; j < ATTN_SEGMENT; j += ATTN_THREADS)
		{
			int			pos = seg_base + j;

			if (pos >= seg_lo && pos <= seg_hi)
				kv_scales<HD>(src, bt, kvh, pos, &KS[j], &VS[j]);
		}
#pragma unroll
		for (int n = 0; n < NV; n++)
		{
			int			i = threadIdx.x + n * ATTN_THREADS;
			int		   *kd = K + (size_t) (i / VPK) * S::KSTRIDE + (i % VPK) * 4;

			kd[0] = kr[n].x;
			kd[1] = kr[n].y;
			kd[2] = kr[n].z;
			kd[3] = kr[n].w;
			((int4 *) V)[i] = vr[n];
		}
	}
	/* two-digit keys: the second digits, into their rows beside the keys' */
	if (src.two_digit_keys)
		for (int i = threadIdx.x; i < ATTN_SEGMENT * VPK; i += ATTN_THREADS)
		{
			int			pos = seg_base + i / VPK;
			int4		k2 = make_int4(0, 0, 0, 0);
			int		   *kd = (int *) (smem + S::OFF_K2) + (size_t) (i / VPK) * S::KSTRIDE +
				(i % VPK) * 4;

			if (pos >= seg_lo && pos <= seg_hi)
				k2 = kv_key2_row<HD>(src, bt, kvh, pos)[i % VPK];
			kd[0] = k2.x;
			kd[1] = k2.y;
			kd[2] = k2.z;
			kd[3] = k2.w;
		}
	__syncthreads();

	/* queries: a warp per row, int8 per head with cai_op_quantize_vec_i8's rule */
	for (int r = warp; r < n_rows; r += ATTN_THREADS / CUDA_WARP)
	{
		const float *qrow = q + (size_t) row_act[r] * ldq + (size_t) row_head[r] * HD;
		float		qs = quantize_query<HD>(qrow, (int8_t *) (smem + S::OFF_Q) + (size_t) r * HD,
											scale, lane);

		if (lane == 0)
			QS[r] = qs;
	}
	__syncthreads();

	/* every score once: a thread per (row, key), keys along the warp */
	for (int p = threadIdx.x; p < n_rows * ATTN_SEGMENT; p += ATTN_THREADS)
	{
		int			r = p / ATTN_SEGMENT;
		int			j = p % ATTN_SEGMENT;
		int			pos = seg_base + j;

		if (pos >= row_lo[r] && pos <= row_hi[r])
		{
			const int  *qw = (const int *) (smem + S::OFF_Q) + (size_t) r * S::QWORDS;
			const int  *kw = K + (size_t) j * S::KSTRIDE;
			int			dot = 0;

#pragma unroll 8
			for (int w = 0; w < S::QWORDS; w++)
				dot = __dp4a(qw[w], kw[w], dot);
			if (src.two_digit_keys)
				dot = with_second_digits<S::QWORDS>(dot, qw, (const int *) (smem + S::OFF_K2) +
													(size_t) j * S::KSTRIDE);
			E[r * ATTN_SEGMENT + j] = __fmul_rn(__int2float_rn(dot), __fmul_rn(QS[r], KS[j]));
		}
	}
	__syncthreads();

	/*
	 * each row's maximum score and largest value scale: a warp per row (a maximum is the same
	 * in any order)
	 */
	for (int r = warp; r < n_rows; r += ATTN_THREADS / CUDA_WARP)
	{
		float		m = -INFINITY;
		float		vm = 0.0f;

		for (int pos = row_lo[r] + lane; pos <= row_hi[r]; pos += CUDA_WARP)
		{
			m = fmaxf(m, E[r * ATTN_SEGMENT + (pos - seg_base)]);
			vm = fmaxf(vm, VS[pos - seg_base]);
		}
		m = warp_max(m);
		vm = warp_max(vm);
		if (lane == 0)
		{
			row_m[r] = m;
			row_g[r] = vm;
		}
	}
	__syncthreads();

	/* the exponentials in place */
	for (int p = threadIdx.x; p < n_rows * ATTN_SEGMENT; p += ATTN_THREADS)
	{
		int			r = p / ATTN_SEGMENT;
		int			pos = seg_base + p % ATTN_SEGMENT;

		if (pos >= row_lo[r] && pos <= row_hi[r])
			E[p] = attn_exp2(__fsub_rn(E[p], row_m[r]));
	}
	__syncthreads();

	/* sixteen partial sums (i % 16, in order), then the row's sum and normalizer */
	for (int p = threadIdx.x; p < n_rows * 16; p += ATTN_THREADS)
	{
		int			r = p / 16;
		int			lane16 = p % 16;
		int			lo = row_lo[r];
		int			n = row_hi[r] - lo + 1;
		float		sum = 0.0f;

		for (int i = lane16; i < n; i += 16)
			sum = __fadd_rn(sum, E[r * ATTN_SEGMENT + (lo + i - seg_base)]);
		part[p] = sum;
	}
	__syncthreads();
	for (int r = threadIdx.x; r < n_rows; r += ATTN_THREADS)
	{
		int			n = row_hi[r] - row_lo[r] + 1;
		float		l;

		if (n <= 0)
			continue;
		l = segment_total(part + r * 16);
		row_qinv[r] = weight_qinv(row_g[r]);
		row_g[r] = __fdiv_rn(__fdiv_rn(row_g[r], (float) ATTN_WEIGHT_MAX), l);
		{
			size_t		at = ((size_t) row_act[r] * n_heads + row_head[r]) * split_segs + seg;

			part_ml[2 * at] = row_m[r];
			part_ml[2 * at + 1] = l;
		}
	}
	__syncthreads();

	/* the quantized weights in place (attention.h) */
	for (int p = threadIdx.x; p < n_rows * ATTN_SEGMENT; p += ATTN_THREADS)
	{
		int			r = p / ATTN_SEGMENT;
		int			j = p % ATTN_SEGMENT;
		int			pos = seg_base + j;

		if (pos >= row_lo[r] && pos <= row_hi[r])
			W[p] = quantize_weight(E[p], VS[j], row_qinv[r]);
	}
	__syncthreads();

	/* values: a thread per (row, dimension), the exact integer sum, then its one scaling */
	for (int p = threadIdx.x; p < n_rows * HD; p += ATTN_THREADS)
	{
		int			r = p / HD;
		int			d = p % HD;
		int			lo = row_lo[r] - seg_base;
		int			hi = row_hi[r] - seg_base;
		const int  *w = W + r * ATTN_SEGMENT;
		int			acc = 0;

		if (hi < lo)
			continue;
#pragma unroll 4
		for (int j = lo; j <= hi; j++)
			acc += w[j] * (int) V[j * HD + d];
		part_o[(((size_t) row_act[r] * n_heads + row_head[r]) * split_segs + seg) * HD + d] =
			__fmul_rn(__int2float_rn(acc), row_g[r]);
	}
}

/*
 * The merge of a split attention: each query row's segments folded in order from the partials
 * (cpu/attention.c's cai_attention_merge, operation for operation).  One block per tile and KV
 * head, like the attention kernel; a thread per (row, dimension), each following its row's fold.
 */
static __global__ void __launch_bounds__(ATTN_THREADS, 1)
attention_merge_kernel(const int32_t *__restrict__ counts, const attn_seq_rec *__restrict__ seqs,
					   const attn_item_rec *__restrict__ items, const float *__restrict__ part_o,
					   const float *__restrict__ part_ml, int split_segs, float *__restrict__ out,
					   int ldo, int group, int window, int hd)
{
	attn_item_rec it;
	attn_seq_rec sq;
	int			n_heads = (int) gridDim.y * group;

	if ((int) blockIdx.x >= counts[2])
		return;
	it = items[blockIdx.x];
	sq = seqs[it.seq];
	for (int p = threadIdx.x; p < it.n_qrows * hd; p += blockDim.x)
	{
		int			r = p / hd;
		int			d = p % hd;
		int			qr = it.qrow0 + r;
		int			tl = qr / group;
		int			pos = sq.pos + tl;
		int			lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
		int			act = sq.row0 + tl;
		int			head = (int) blockIdx.y * group + qr % group;
		size_t		base = ((size_t) act * n_heads + head) * split_segs;
		int			first = lo / ATTN_SEGMENT;
		float		o = part_o[(base + first) * hd + d];
		float		M = part_ml[2 * (base + first)];
		float		L = part_ml[2 * (base + first) + 1];

		for (int sg = first + 1; sg <= pos / ATTN_SEGMENT; sg++)
		{
			float		m = part_ml[2 * (base + sg)];
			float		l = part_ml[2 * (base + sg) + 1];
			float		mn = m > M ? m : M;
			float		a = __fmul_rn(attn_exp2(__fsub_rn(M, mn)), L);
			float		b = __fmul_rn(attn_exp2(__fsub_rn(m, mn)), l);
			float		ln = __fadd_rn(a, b);

			o = __fadd_rn(__fmul_rn(__fdiv_rn(a, ln), o),
						  __fmul_rn(__fdiv_rn(b, ln), part_o[(base + sg) * hd + d]));
			M = mn;
			L = ln;
		}
		out[(size_t) act * ldo + (size_t) head * hd + d] = o;
	}
}

/* Raises an instance's dynamic shared-memory limit when it needs more than the default 48 KB. */
/*
 * Raises an instance's dynamic shared-memory limit when it needs more than the default 48 KB: to
 * what two-digit keys take (BYTES_K2) where the device has it (optin: its per-block maximum),
 * else to BYTES, and cai_cuda_attention then refuses two-digit keys with that instance.
 */
template <int HD, int R, bool F>
static cai_status
attention_prepare_instance(size_t optin, cai_error *err)
{
	typedef attn_smem<HD, R, F> S;
	size_t		bytes = S::BYTES_K2 <= optin ? S::BYTES_K2 : S::BYTES;

	if (bytes > 48 * 1024)
		CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<HD, R, F>,
										cudaFuncAttributeMaxDynamicSharedMemorySize,
										(int) bytes), err, "the attention kernel's shared memory");
	return CAI_OK;
}

template <int HD>
static cai_status
decode_prepare_instance(size_t optin, cai_error *err)
{
	typedef decode_smem<HD> S;
	size_t		bytes = S::BYTES_K2 <= optin ? S::BYTES_K2 : S::BYTES;

	CUDA_CHECK(cudaFuncSetAttribute(attention_decode_kernel<HD>,
									cudaFuncAttributeMaxDynamicSharedMemorySize,
									(int) bytes), err,
			   "the decode attention kernel's shared memory");
	return CAI_OK;
}

/*
 * Called once by cai_cuda_ctx_create: function attributes are set before any launch, never
 * while a graph is being captured.
 */
cai_status
cuda_attention_init(cai_cuda_ctx *ctx, cai_error *err)
{
	cai_status	st;
	size_t		optin = ctx->prop.sharedMemPerBlockOptin;

	if ((st = decode_prepare_instance<64>(optin, err)) != CAI_OK ||
		(st = decode_prepare_instance<128>(optin, err)) != CAI_OK ||
		(st = decode_prepare_instance<256>(optin, err)) != CAI_OK ||
		(st = attention_prepare_instance<64, 64, false>(optin, err)) != CAI_OK ||
		(st = attention_prepare_instance<64, 64, true>(optin, err)) != CAI_OK ||
		(st = attention_prepare_instance<128, 64, false>(optin, err)) != CAI_OK ||
		(st = attention_prepare_instance<128, 64, true>(optin, err)) != CAI_OK ||
		(st = attention_prepare_instance<256, 32, false>(optin, err)) != CAI_OK ||
		(st = attention_prepare_instance<256, 32, true>(optin, err)) != CAI_OK)
		return st;
	return CAI_OK;
}

/* The floats of per-segment partials a split attention of this plan writes. */
static size_t
split_partials_floats(const cai_cuda_step_meta *meta, int n_kv, int head_dim)
{
	return (size_t) meta->n_tok * meta->group * n_kv * meta->max_segments * (head_dim + 2);
}

/*
 * Whether to split a step's attention along the context: when its tiles leave most SMs idle
 * (decode at long context) and the partials fit the scratch (grown on demand, within 256 MB).
 * Splitting or not gives the same bits (cpu/attention.h's segments).
 */
static bool
attention_split(cai_cuda_ctx *ctx, const cai_cuda_step_meta *meta, int n_kv, int head_dim)
{
	size_t		floats = split_partials_floats(meta, n_kv, head_dim);
	const char *hook = getenv("CAI_CUDA_ATTENTION");	/* tests: "whole" never splits */
	cai_error	e;

	if ((hook && strcmp(hook, "whole") == 0) || meta->max_segments < 2 ||
		(long) meta->grid_items * n_kv >= 2L * ctx->prop.multiProcessorCount ||
		floats > ((size_t) 256 << 20) / sizeof(float))
		return false;
	/* a capture cannot allocate: it splits only into partials reserved before (its warm-up) */
	if (ctx->capturing)
		return ctx->attn_split && ctx->attn_split_floats >= floats;
	return cuda_scratch_reserve(ctx, &ctx->attn_split, &ctx->attn_split_floats, floats,
								sizeof(float), "split attention partials", &e) == CAI_OK;
}

extern "C" cai_status
cai_cuda_attention_reserve(cai_cuda_ctx *ctx, const cai_cuda_step_meta *meta, int n_kv_heads,
						   int head_dim, cai_error *err)
{
	size_t		floats = split_partials_floats(meta, n_kv_heads, head_dim);

	if (meta->max_segments < 1 || floats > ((size_t) 256 << 20) / sizeof(float))
		return CAI_OK;			/* such a plan does not split */
	return cuda_scratch_reserve(ctx, &ctx->attn_split, &ctx->attn_split_floats, floats,
								sizeof(float), "split attention partials", err);
}

/*
 * Whether a step's tiles go to the decode kernel: every tile has at most CUDA_DECODE_TILE_ROWS rows and
 * the partials fit the scratch (grown on demand, within 256 MB; a capture only uses what its
 * warm-up reserved).  The test hook CAI_CUDA_ATTENTION=tiled keeps them on attention_kernel.
 */
static bool
decode_fits(cai_cuda_ctx *ctx, const cai_cuda_step_meta *meta, int n_kv, int head_dim)
{
	size_t		floats = split_partials_floats(meta, n_kv, head_dim);
	const char *hook = getenv("CAI_CUDA_ATTENTION");
	cai_error	e;

	if ((hook && (strcmp(hook, "tiled") == 0 || strcmp(hook, "whole") == 0)) ||
		meta->max_item_rows > CUDA_DECODE_TILE_ROWS || meta->max_segments < 1 ||
		floats > ((size_t) 256 << 20) / sizeof(float))
		return false;
	if (ctx->capturing)
		return ctx->attn_split && ctx->attn_split_floats >= floats;
	return cuda_scratch_reserve(ctx, &ctx->attn_split, &ctx->attn_split_floats, floats,
								sizeof(float), "split attention partials", &e) == CAI_OK;
}

template <int HD, int R, bool F>
static cai_status
launch_attention(cai_cuda_ctx *ctx, const attn_source &src, const cai_cuda_step_meta *meta,
				 int n_kv, const float *q, int ldq, float *out, int ldo, int window, float scale,
				 cai_error *err)
{
	typedef attn_smem<HD, R, F> S;
	bool		split;

	if (src.two_digit_keys && (S::BYTES_K2 > ctx->prop.sharedMemPerBlockOptin ||
							   decode_smem<HD>::BYTES_K2 > ctx->prop.sharedMemPerBlockOptin))
		return cuda_fail(err, CAI_ERR_UNSUPPORTED,
						 "attention: two-digit keys of head_dim %d need %zu bytes of shared "
						 "memory per block; this device allows %zu", HD,
						 decode_smem<HD>::BYTES_K2, (size_t) ctx->prop.sharedMemPerBlockOptin);
	if (!F && decode_fits(ctx, meta, n_kv, HD))
	{
		int			segs = meta->max_segments;
		float	   *dpart_o = (float *) ctx->attn_split;
		float	   *dpart_ml = dpart_o + (size_t) meta->n_tok * meta->group * n_kv * segs * HD;

		cuda_capture_note_plan(ctx, meta);
		if (ctx->capturing)
			ctx->capture_decode_tiles = true;
		attention_decode_kernel<HD><<<dim3(meta->grid_items, n_kv, segs), ATTN_THREADS,
			src.two_digit_keys ? decode_smem<HD>::BYTES_K2 : decode_smem<HD>::BYTES,
			ctx->stream>>>(
			src, meta->counts_dev, (const attn_seq_rec *) meta->seqs_dev,
			(const attn_item_rec *) meta->items_dev, meta_block_tables(ctx), q, ldq, meta->group,
			window, scale, segs, dpart_o, dpart_ml);
		CUDA_CHECK_LAUNCH(err, "the decode attention kernel");
		attention_merge_kernel<<<dim3(meta->grid_items, n_kv), ATTN_THREADS, 0, ctx->stream>>>(
			meta->counts_dev, (const attn_seq_rec *) meta->seqs_dev,
			(const attn_item_rec *) meta->items_dev, dpart_o, dpart_ml, segs, out, ldo,
			meta->group, window, HD);
		CUDA_CHECK_LAUNCH(err, "the attention merge kernel");
		return CAI_OK;
	}
	split = attention_split(ctx, meta, n_kv, HD);
	int			segs = split ? meta->max_segments : 0;
	float	   *part_o = split ? (float *) ctx->attn_split : NULL;
	float	   *part_ml = split ? part_o + (size_t) meta->n_tok * meta->group * n_kv * segs * HD : NULL;
	dim3		grid(meta->grid_items, n_kv, split ? segs : 1);

	cuda_capture_note_plan(ctx, meta);
	attention_kernel<HD, R, F><<<grid, ATTN_THREADS, src.two_digit_keys ? S::BYTES_K2 : S::BYTES,
		ctx->stream>>>(
		src, meta->counts_dev, (const attn_seq_rec *) meta->seqs_dev,
		(const attn_item_rec *) meta->items_dev, meta_block_tables(ctx), q, ldq, out, ldo,
		meta->group, window, scale, segs, part_o, part_ml);
	CUDA_CHECK_LAUNCH(err, "the attention kernel");
	if (split)
	{
		attention_merge_kernel<<<dim3(meta->grid_items, n_kv), ATTN_THREADS, 0, ctx->stream>>>(
			meta->counts_dev, (const attn_seq_rec *) meta->seqs_dev,
			(const attn_item_rec *) meta->items_dev, part_o, part_ml, segs, out, ldo, meta->group,
			window, HD);
		CUDA_CHECK_LAUNCH(err, "the attention merge kernel");
	}
	return CAI_OK;
}

extern "C" cai_status
cai_cuda_attention(cai_cuda_ctx *ctx, const cai_cuda_kv *kv, int kv_layer,
				   const cai_cuda_step_meta *meta, const float *q_dev, int ldq, float *out_dev,
				   int ldo, int n_heads, int window, float scale, const cai_cuda_kv_shadow *shadow,
				   cai_error *err)
{
	attn_source src;
	int			n_kv = kv->n_kv_heads;

	if (meta->grid_items <= 0)
		return CAI_OK;
	if (n_heads != meta->group * n_kv)
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT,
						 "attention: %d heads do not match the plan's %d x %d", n_heads,
						 meta->group, n_kv);
	if (meta->tile_rows != tile_rows_for(kv->head_dim))
		return cuda_fail(err, CAI_ERR_INVALID_ARGUMENT,
						 "attention: the step was planned for another head_dim");
	memset(&src, 0, sizeof(src));
	src.pool = kv->pool_dev;
	src.block_bytes = kv->block_bytes;
	src.layer_off = (size_t) kv_layer * kv->layer_bytes;
	src.n_kv = n_kv;
	src.two_digit_keys = kv->key_digits == 2 && !shadow;
	if (shadow)
	{
		src.shadow = shadow->data_dev;
		src.sh_block_floats = shadow->block_floats;
		src.sh_layer_off = (size_t) kv_layer * shadow->layer_floats;
	}
#define LAUNCH(HD, R) \
	(shadow ? launch_attention<HD, R, true>(ctx, src, meta, n_kv, q_dev, ldq, out_dev, ldo, \
											window, scale, err) \
	 : launch_attention<HD, R, false>(ctx, src, meta, n_kv, q_dev, ldq, out_dev, ldo, window, \
									  scale, err))
	switch (kv->head_dim)
	{
		case 64:
			return LAUNCH(64, 64);
		case 128:
			return LAUNCH(128, 64);
		case 256:
			return LAUNCH(256, 32);
#undef LAUNCH
		default:
			return cuda_fail(err, CAI_ERR_UNSUPPORTED,
							 "the cuda attention kernels support head_dim 64, 128 and 256, not %d",
							 kv->head_dim);
	}
}
