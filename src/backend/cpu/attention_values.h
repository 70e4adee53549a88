/*
 * attention_values.h — the int8 attention's value pass: exact integer sums of quantized
 * softmax weights times int8 values (the arithmetic is attention.h's; this is its inner loop).
 *
 * A segment's weights arrive as two planes of bytes per query row, lo = q & 127 and
 * hi = q >> 7 for a weight q in [0, CAI_ATTN_WEIGHT_MAX], positions from a block-aligned base;
 * its values are packed once per segment and KV head into groups of four positions,
 * vq[quad][d][i] = v[4 * quad + i][d], the layout of a 4-byte dot-product instruction's signed
 * operand (and of an AMX B tile).  The sums are sums[r][d] = sum lo * v and sums[r][hd + d] =
 * sum hi * v over the row's quads: integers, exact in any order and any blocking, so every path
 * below gives the same ones.  Seven-bit planes keep AVX2's saturating 16-bit pair sums
 * (2 * 127 * 128) in range.
 */
#ifndef CAI_CPU_ATTENTION_VALUES_H
#define CAI_CPU_ATTENTION_VALUES_H

#include <stddef.h>
#include <stdint.h>

/* The largest quantized weight: 14 bits, two 7-bit planes. */
#define CAI_ATTN_WEIGHT_MAX 16383

typedef enum attn_value_path
{
	ATTN_VALUES_GENERIC = 0,
	ATTN_VALUES_AVX2,
	ATTN_VALUES_AVX512,			/* AVX-512 VNNI (vpdpbusd) */
	ATTN_VALUES_AMX				/* AMX int8 tiles (tdpbusd), tiles configured by the caller */
} attn_value_path;

/*
 * Packs n_quads groups of four positions into vq ([n_quads][hd][4]): positions 16 * b + slot
 * come from block b's rows, blocks[b] + slot * stride (hd int8 values each); quads of blocks
 * b >= n_blocks are zeros.  hd is a multiple of 8.
 */
void		attn_pack_values(attn_value_path path, const int8_t *const *blocks, int n_blocks,
							 size_t stride, int hd, int n_quads, int8_t *vq);

/*
 * sums[r * 2 * hd + ...] for rows [0, rows): row r's planes w_lo/w_hi + r * ld_w over its first
 * row_quads[r] quads (rows with none are left unwritten).  The AMX path takes rows in tiles of
 * 16 (rows a multiple of 16, every row's planes zero past its quads up to the tile's longest,
 * rounded up to 64 positions, and sums room for all of them); hd is a multiple of 32 there, of
 * 8 elsewhere.  The AVX-512 path takes rows in pairs and reads the high planes in whole 64-byte
 * vectors, to skip their zero quads: every row's planes zero past its quads up to its pair's
 * longest, rounded up to 64 positions.
 */
void		attn_value_sums(attn_value_path path, const uint8_t *w_lo, const uint8_t *w_hi,
							int ld_w, const int8_t *vq, int hd, int rows, const int *row_quads,
							int32_t *sums);

#endif							/* CAI_CPU_ATTENTION_VALUES_H */
