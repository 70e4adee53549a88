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
 * product: score = (float) dot * ((q_scale * s2) * k_scale), with s2 = scale * log2(e)
(cai_attn_score_scale): scores are in base-2 units, so the softmax's exponential is exp2.  Integer dot products have no
 * rounding order, so the kernel may block and vectorize them freely (AVX-512 VNNI scores 16 keys
 * per instruction from a transposed copy of the block, AMX int8 tiles a 16-row tile at a time).
 * With two-digit keys (kv.h) dot = 254 (q . k) + q . k2, both products by the same kernels (a
 * block at a time, so AMX does not batch a segment's blocks), still exact: at most
 * 512 * 127 * (254 * 127 + 127) < 2^31 for the largest head size.
 * Softmax is fp32 with the maximum m subtracted: e_j = exp2(score_j - m) (the attention's exp2,
 * below) and the total l: position i of the row's part of the segment is added, in order, into
 * partial sum i % 16, and l = tree(p[0] + p[8], ..., p[7] + p[15]) with ops.h's tree of eight.
 * The values are weighted by integers, so that their sums are exact too: over the row's
 * positions j of the segment (below), with v_scale_j the value row's scale and vmax = max
 * v_scale_j,
 *   qinv = 16383 / vmax (0 when vmax < CAI_ATTN_VSCALE_MIN);
 *   w_j = round((e_j * v_scale_j) * qinv), to nearest, ties to even: 14 bits, 0 .. 16383;
 *   o[d] = (float) (sum_j w_j * v_j[d]) * ((vmax / 16383) / l),
 * each float operation rounded once, in that order.  The int32 sum is the same integer however
 * it is blocked (cpu/attention_values.c: vpdpbusd, AMX tdpbusd, AVX2 or plain C; the GPU's
 * integer multiply-adds), so every path gives the same bits, and the weights' quantization
 * error (at most half a step of 1/16383 of the largest weight) is far below the int8 values'.
 * Float reference path (shadow KV): the same passes with float queries (times s2) and keys, the
 * dot product summed with the eight-partial-sum rule of ops.h, and the values by a multiply then
 * an add.
 *
 * Segments: the reduction order along the context.  Positions are cut into segments of
 * CAI_ATTN_SEGMENT_TOKENS at fixed absolute boundaries (a constant of the numerics, never of the
 * thread count).  For a query row with positions [lo, pos], each segment s it meets gets the
 * one-pass softmax above over its own part of the row: its maximum m_s, total l_s and normalized
 * value sum o_s.  A row inside one segment takes o_s as it is, so
 * short rows keep the single-pass arithmetic; a longer row folds its segments in order into a
 * running state (M, L, out), starting from its first segment's (m, l, o):
 *   M' = max(M, m_s);  a = exp2(M - M') * L;  b = exp2(m_s - M') * l_s  (the attention's exp2);
 *   L' = a + b;  out = (a / L') * out + (b / L') * o_s, element by element.
 * Segments are therefore independent until the merge, so a long row's segments may be computed
 * by different threads (or GPU blocks) and merged later with the same bits: the CPU backend
 * splits a tile's segments across its threads when a step has too few tiles for them (decode
 * at long context), and src/backend/cuda/attention.cu follows the same order.
 *
 * Every score, softmax and output element of a query row is therefore a fixed function of that
 * row's query, its position range and its sequence's KV: the tile a token lands in, the batch,
 * the split and the thread do not change a bit of it.
 */
#ifndef CAI_CPU_ATTENTION_H
#define CAI_CPU_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "kv.h"

/* Per-thread scratch of the attention kernel. */
typedef struct cai_attn_scratch
{
	/* rows are padded to a multiple of 16 query rows */
	float	   *scores;			/* [rows][256 + 16] one segment's scores, then probabilities */
	int8_t	   *q_i8;			/* [rows][head_dim] quantized queries */
	float	   *q_f32;			/* [rows][head_dim] queries times the score scale (reference path) */
	float	   *q_scale;		/* [rows] q_scale * score scale (cai_attn_score_scale) */
	int32_t    *q_sum;			/* [rows] sum of each quantized query (VNNI's offset) */
	int8_t	   *k_t;			/* [blocks][head_dim/4][16][4] keys of one head, transposed: one
								 * block's, or a segment's (AMX) */
	float	   *k_scales;		/* [256] the segment's key scales of one head (AMX) */
	int32_t    *dots;			/* [rows][16] exact query-key dot products of one block */
	int8_t	   *k2_t;			/* [head_dim/4][16][4] one block's second key digits, transposed */
	int32_t    *dots2;			/* [rows][16] the rows' dot products with them */
	float	   *values;			/* one block's float values of one head (reference path) */
	float	   *v_scales;		/* [256] the segment's value scales of one head */
	float	   *v_scale_max;	/* [256] their running maximum */
	uint8_t    *w_lo;			/* [rows][256] the rows' quantized weights, low 7 bits */
	uint8_t    *w_hi;			/* [rows][256] and high 7 bits (attention_values.h) */
	int8_t	   *v_quads;		/* [64][head_dim][4] the segment's values in groups of four */
	int32_t    *v_sums;			/* [rows][2][head_dim] the rows' integer value sums */
	int32_t    *row_quads;		/* [rows] groups of four positions each row's weights cover */
	float	   *row_g;			/* [rows] (vmax / 16383) / l */
	int32_t    *row_lo;			/* [rows] first position each row attends to */
	int32_t    *row_hi;			/* [rows] last position (the token's own) */
	float	   *seg_o;			/* [rows][head_dim] one segment's value sums */
	float	   *seg_m;			/* [rows] the current segment's maximum score */
	float	   *seg_l;			/* [rows] and total of exponentials */
	float	   *fold;			/* [7][rows + 8] rows' running merge state and fold weights */
	/* a shared tile's own blocks (cai_attention_shared_part): one token's rows at a time */
	float	   *own_vs;			/* [256] a row's value scales, the shared ones then its own */
	uint8_t    *own_w_lo;		/* [n_group][256] the rows' weight planes from the own blocks */
	uint8_t    *own_w_hi;
	int32_t    *own_sums;		/* [n_group][2][head_dim] their value sums */
} cai_attn_scratch;

/* Positions per segment of the reduction order (a multiple of the KV block). */
#define CAI_ATTN_SEGMENT_TOKENS 256

/* Below this largest value scale a segment's values weigh nothing (16383 / vmax stays finite). */
#define CAI_ATTN_VSCALE_MIN 0x1p-64f

/*
 * The attention's exp2: x clamped to [CAI_ATTN_EXP2_LO, CAI_ATTN_EXP2_HI], k = x rounded to the
 * nearest integer (ties to even), r = x - k (exact, |r| <= 1/2), 2^r by the degree-6 polynomial
 * below (Horner's rule, each step a fused multiply-add rounded once), times 2^k.  Its
 * coefficients are a minimax fit of 2^r on [-1/2, 1/2] (its constant rounds to 1, so exp2(0) = 1
 * exactly): relative error 8e-8 in float, under the natural exp's 2e-7 that it replaced.  Scores
 * in base 2 save the multiply by log2(e) and the two-part reduction of a natural exp: the
 * softmax's hottest loop runs twelve vector instructions per sixteen scores instead of sixteen.
 * The GPU's attention computes the same with __fmaf_rn.
 */
#define CAI_ATTN_EXP2_LO (-126.0f)
#define CAI_ATTN_EXP2_HI 127.0f
#define CAI_ATTN_EXP2_C1 0.6931471824645996f
#define CAI_ATTN_EXP2_C2 0.24022646248340607f
#define CAI_ATTN_EXP2_C3 0.05550328642129898f
#define CAI_ATTN_EXP2_C4 0.009618489071726799f
#define CAI_ATTN_EXP2_C5 0.0013399930903688073f
#define CAI_ATTN_EXP2_C6 0.0001534581242594868f

float		cai_attention_exp2(float x);

/* The first position a row at pos attends to (its window's, or 0). */
static inline int
cai_attention_first_position(const cai_attn_params *ap, int pos)
{
	return ap->window > 0 && pos - ap->window + 1 > 0 ? pos - ap->window + 1 : 0;
}

/* Segments a row of a context of max_context positions can meet. */
int			cai_attention_max_segments(int max_context);

/*
 * A split tile's partial results: for each of its segments [seg0, seg0 + n_segs) and query row
 * r (tile rows, token-major), the segment's value sums o[(s - seg0) * rows + r][head_dim] and
 * its maximum and total m, l[r * n_segs + (s - seg0)] (rows that do not meet a segment leave
 * theirs unwritten).
 */
typedef struct cai_attn_partials
{
	float	   *o;
	float	   *m;
	float	   *l;
	int			seg0;
	int			n_segs;
} cai_attn_partials;

/* The segments [first, last] the rows of a tile of n_tok tokens from t0 meet. */
void		cai_attention_tile_segments(const cai_attn_params *ap, const cai_batch_layout *batch,
										int t0, int n_tok, int *first, int *last);

/*
 * One part of a split tile: segments [seg_begin, seg_end) of the tile's rows into partials (the
 * tile's own, shared by its parts), instead of out.  cai_attention_merge then writes the rows'
 * outputs from all the parts: the same bits as cai_attention_tile.
 */
void		cai_attention_tile_part(const cai_attn_params *ap, const cai_batch_layout *batch,
									int seq, int kv_head, int t0, int n_tok, const float *q,
									int ldq, cai_kv_pool *kv, const cai_kv_shadow *shadow,
									int seg_begin, int seg_end, const cai_attn_partials *partials,
									cai_attn_scratch *s);
/* Sequences a shared tile takes at most, for a GQA group of n_group query heads per KV head. */
int			cai_attention_shared_max_seqs(int n_group);

/*
 * A shared tile: segments [seg_begin, seg_end) of the one-token rows of n_seqs sequences
 * seqs[] (at most cai_attention_shared_max_seqs) whose block tables hold the same blocks below
 * position own_from (block-aligned, at most every row's position), rows that all start at the
 * same position (the samples of one prompt, or conversations on one cached prefix).  The shared
 * blocks are read, transposed and packed once for all the rows, which are tall enough for AMX;
 * from own_from on, in the segment that holds it, each sequence's rows read their own blocks,
 * and their integer value sums add those blocks' to the shared ones' (exact, so the bits do not
 * move).  Each sequence's rows land in its own partials[i], the bits its own tile part would
 * have written, for cai_attention_merge to finish with its other segments.
 */
void		cai_attention_shared_part(const cai_attn_params *ap, const cai_batch_layout *batch,
									  const int *seqs, int n_seqs, int kv_head, const float *q,
									  int ldq, cai_kv_pool *kv, int seg_begin, int seg_end,
									  int own_from, const cai_attn_partials *partials,
									  cai_attn_scratch *s);
void		cai_attention_merge(const cai_attn_params *ap, const cai_batch_layout *batch,
								int kv_head, int t0, int n_tok, const cai_attn_partials *partials,
								float *out, int ldo);

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
