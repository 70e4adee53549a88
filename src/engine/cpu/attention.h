/*
 * attention.h — causal GQA attention over the paged KV cache on the CPU.
 *
 * The unit of work is a tile: up to cai_attention_tile_tokens() consecutive new tokens of one
 * sequence and one KV head, i.e. tile_tokens x (n_heads / n_kv_heads) query rows sharing the
 * same keys.  A tile walks the sequence's KV blocks once per pass, so a prefill chunk reads
 * each block once per tile, not once per token.
 *
 * Arithmetic (int8 path).  Each query head is quantized to int8 with its own scale (the
 * activation rule of cpu/gemm.h) and scored against the int8 keys with an exact int32 dot
 * product: score = (float) dot * ((q_scale * scale) * k_scale).  Integer dot products have no
 * rounding order, so the kernel may block and vectorize them freely (AVX-512 VNNI scores 16 keys
 * per instruction from a transposed copy of the block).  Softmax is fp32 with the row maximum
 * subtracted; the weighted sum of values runs over positions in ascending order, vectorized
 * across head dimensions: out[d] += (p_j * v_scale_j) * (float) v_j[d], the query heads of a
 * token sharing each value row load.  No fused multiply-add anywhere, so every ISA path gives
 * the same bits.
 * Float reference path (shadow KV): the same passes with float queries and keys, the dot product
 * summed with the eight-partial-sum rule of ops.h.
 *
 * Every score, softmax and output element of a query row is therefore a fixed function of that
 * row's query, its position range and its sequence's KV: the tile a token lands in, the batch
 * and the thread do not change a bit of it.
 */
#ifndef CAI_CPU_ATTENTION_H
#define CAI_CPU_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "../backend.h"
#include "../kv.h"

/* Per-thread scratch of the attention kernel. */
typedef struct cai_attn_scratch
{
	/* rows are padded to a multiple of 8 query rows */
	float	   *scores;			/* [rows][span] scores, then probabilities */
	int8_t	   *q_i8;			/* [rows][head_dim] quantized queries */
	float	   *q_f32;			/* [rows][head_dim] scaled float queries (reference path) */
	float	   *q_scale;		/* [rows] q_scale * scale */
	int32_t    *q_sum;			/* [rows] sum of each quantized query (VNNI's offset) */
	int8_t	   *k_t;			/* [head_dim/4][16][4] one block's keys of one head, transposed */
	int32_t    *dots;			/* [rows][16] exact query-key dot products of one block */
	float	   *values;			/* [16][head_dim] one block's values of one head, as float */
	int32_t    *row_lo;			/* [rows] first position each row attends to */
	int32_t    *row_hi;			/* [rows] last position (the token's own) */
} cai_attn_scratch;

/* Tokens per tile for a GQA group of n_group query heads per KV head. */
int			cai_attention_tile_tokens(int n_group);

/* Bytes of one thread's scratch (cai_attn_scratch_init lays it out in one allocation). */
size_t		cai_attention_scratch_bytes(int max_context, int n_group, int head_dim);
void		cai_attention_scratch_init(cai_attn_scratch *s, void *memory, int max_context,
									   int n_group, int head_dim);

/*
 * Attention of rows [t0, t0 + n_tok) of sequence seq (all in one sequence, consecutive
 * positions) for KV head kv_head and its query heads.  q, out: [T, ld] activation matrices.
 */
void		cai_attention_tile(const cai_attn_params *ap, const cai_batch_layout *batch, int seq,
							   int kv_head, int t0, int n_tok, const float *q, int ldq,
							   cai_kv_pool *kv, const cai_kv_shadow *shadow, float *out, int ldo,
							   cai_attn_scratch *s);

#endif							/* CAI_CPU_ATTENTION_H */
