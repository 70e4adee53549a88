/*
 * gemm_blocks_internal.h — what the block GEMM's kernels share (gemm_blocks.c, which repacks,
 * dispatches and holds the portable and AVX2 kernels, gemm_blocks_vnni.c, the AVX-512 VNNI
 * ones, and gemm_blocks_avxvnni.c, the 256-bit AVX-VNNI ones): one call's job, the layout's
 * index arithmetic, and the runner that splits a call's groups among threads.  The unit tests
 * compile both VNNI files a second time through SIMDe and run those copies through
 * cai_gemm_blocks_run, so this header is the seam between them.
 */
#ifndef CAI_GEMM_BLOCKS_INTERNAL_H
#define CAI_GEMM_BLOCKS_INTERNAL_H

#include "gemm_blocks.h"

/*
 * Q6_K's levels (-32..31) are stored plus this, unsigned (0..63), so that the kernels take them
 * straight into the unsigned operand of vpmaddubsw or vpdpbusd, without the sign step the
 * signed byte formats need, and subtract 32 times the activations' sum of each half block from
 * the exact sum.
 */
#define SPLIT16_LEVEL_OFFSET 32

/*
 * Where Q6_K's 2-bit high parts start in a group's block: after the 128 bytes of low nibbles
 * (gemm_blocks.h, "Layout").
 */
#define SPLIT16_HIGH_BITS 128

/* What one GEMM call's tasks share. */
typedef struct bgemm_job
{
	const int8_t *xq;
	const float *xs;
	const int16_t *xsum;
	const int16_t *xsum_lo;		/* split16: each block's first 16 levels' sum, else NULL */
	bool		superblocks;	/* a K-quant's activations one scale per super-block: its
								 * super-block arithmetic (gemm_blocks.h) */
	int			n_tok;
	const cai_cpu_bmatrix *w;
	int			n_out;
	const float *bias;
	float	   *out;
	int			ldo;
	bool		accumulate;
	int			groups_per_task;
	uint8_t    *unpacked;		/* split16 with more tokens than a tile: per thread, a group's
								 * levels a byte each ([threads][k / 32][256]), else NULL; or
								 * the scratch of a kernel that asks for it */

	/*
	 * With a kernel's scratch: the tokens' whole tiles of CAI_BTILE_TOKENS, each run of the
	 * kernel's tile_inputs inputs of the tile side by side (xq_tiles [tile][k / tile_inputs]
	 * [token][tile_inputs]) and each block's scales and sums as floats ([tile][k / 32][token]),
	 * else NULL.  A tile's block is then one run of memory: a
	 * token's inputs k bytes apart would put every row of it in the same few sets of the L1
	 * cache (k is a multiple of 2048 in the models that need the speed).
	 */
	const int8_t *xq_tiles;
	const float *xs_tiles;
	const float *xsum_tiles;
} bgemm_job;

#define CAI_BTILE_TOKENS 16

/*
 * A kernel: the rows of group g (of groups g .. g + step - 1 for a kernel that takes step
 * groups at once, called for every step-th group only) for all of the job's tokens.
 */
typedef void (*cai_bgroup_fn) (const bgemm_job *j, int g, int thread);

/*
 * A kernel, how many groups one call of it computes, and the scratch it takes per thread and
 * block of 32 inputs (in bgemm_job.unpacked) when a call has at least CAI_BSCRATCH_TOKENS
 * tokens (0: none; the kernel works without it, slower, where the allocation fails), with the
 * width of its tiles' runs of inputs (bgemm_job.xq_tiles; 0: a block, 32).
 */
typedef struct cai_bkernel
{
	cai_bgroup_fn fn;
	int			step;
	int			scratch_block;
	int			tile_inputs;
} cai_bkernel;

#define CAI_BSCRATCH_TOKENS 16

/* Index of the d (dmin) entries of group g and block b. */
static inline size_t
cai_bscale_index(const cai_cpu_bmatrix *m, int g, int b)
{
	const int	nb = m->k / CAI_BLOCK_ELEMS;

	if (m->k_quant)
		return ((size_t) g * (m->k / 256) + b / 8) * CAI_BLOCK_ROWS;
	return ((size_t) g * nb + b) * CAI_BLOCK_ROWS;
}

/* Index of the sub-block scales (mins) of group g and block b (k_quant). */
static inline size_t
cai_bsub_index(const cai_cpu_bmatrix *m, int g, int b)
{
	const int	nb = m->k / CAI_BLOCK_ELEMS;

	return ((size_t) g * nb + b) * CAI_BLOCK_ROWS * (m->split16 ? 2 : 1);
}

/*
 * Decoding streams the weights once, and a token is bound by the memory's latency more than by
 * its bandwidth: the hardware prefetcher follows a group's arrays (levels, scales, sub-block
 * scales, mins: up to five streams a group) too slowly, and on rows of 64 blocks (k = 2048)
 * not at all before they end.  So a kernel asks for what it will read a fixed distance ahead:
 * 16 blocks (2-4 KiB a group), into L2 (locality 2, prefetcht1), which tracks more misses at
 * once than L1 (distances of 8 to 48 blocks, into L1 or L2, measured alike on the EPYC Zen 4
 * VM: docs/benchmarks.md).
 */
#define CAI_BPREFETCH_LINE 64
#define CAI_BPREFETCH_LOCALITY 2
#define CAI_BPREFETCH_BLOCKS 16

/* Asks for the line of base + offset when the entry of `entry` bytes there is its first. */
static inline void
cai_bprefetch_entry(const void *base, size_t offset, size_t entry)
{
	const char *p = (const char *) base + offset;

	if ((uintptr_t) p % CAI_BPREFETCH_LINE < entry)
		__builtin_prefetch(p, 0, CAI_BPREFETCH_LOCALITY);
}

/*
 * Group's block b: its levels and, where block b's entry is the first of a cache line, that
 * line of each scale array (so every line once, whatever the entry's size).
 */
static inline void
cai_bprefetch_block(const cai_cpu_bmatrix *m, int group, int b)
{
	const int	nb = m->k / CAI_BLOCK_ELEMS;
	const size_t bbytes = (m->nibble ? 16 : m->split16 ? 24 : 32) * CAI_BLOCK_ROWS;
	const uint8_t *q = m->q + ((size_t) group * nb + b) * bbytes;
	const size_t sub = (m->split16 ? 2 : 1) * CAI_BLOCK_ROWS;

	for (size_t o = 0; o < bbytes; o += CAI_BPREFETCH_LINE)
		__builtin_prefetch(q + o, 0, CAI_BPREFETCH_LOCALITY);
	if (!m->k_quant || b % CAI_KQUANT_BLOCKS == 0)
	{
		const size_t at = cai_bscale_index(m, group, b) * sizeof(uint16_t);

		cai_bprefetch_entry(m->d, at, CAI_BLOCK_ROWS * sizeof(uint16_t));
		if (m->has_min)
			cai_bprefetch_entry(m->dmin, at, CAI_BLOCK_ROWS * sizeof(uint16_t));
	}
	if (m->k_quant)
	{
		cai_bprefetch_entry(m->sc, cai_bsub_index(m, group, b), sub);
		if (m->has_min)
			cai_bprefetch_entry(m->m, cai_bsub_index(m, group, b), sub);
	}
}

/*
 * What a kernel walking groups g .. g + groups - 1 together, block by block, reads `ahead`
 * blocks after block b; past the rows' end the next groups' first blocks, so that they do not
 * start cold (a task's groups are consecutive, and the arrays hold groups one after another).
 */
static inline void
cai_bprefetch_ahead(const cai_cpu_bmatrix *m, int g, int groups, int b, int ahead)
{
	const int	nb = m->k / CAI_BLOCK_ELEMS;
	int			next = b + ahead;
	int			first = g;

	if (next >= nb)
	{
		next -= nb;
		first = g + groups;
		if (next >= nb)
			return;
	}
	for (int i = 0; i < groups && first + i < m->n_groups; i++)
		cai_bprefetch_block(m, first + i, next);
}

/* The epilogue of every kernel: the row's sum, the bias and the accumulation. */
static inline void
cai_bstore_result(const bgemm_job *j, int t, int o, float acc)
{
	float	   *dst = j->out + (size_t) t * j->ldo + o;
	float		v = acc;

	if (j->bias)
		v = v + j->bias[o];
	*dst = j->accumulate ? *dst + v : v;
}

/*
 * cai_gemm_blocks with the given kernel (one of the type's: it reads the type's layout, and for
 * a K-quant the arithmetic of act_group's activations).
 */
void		cai_gemm_blocks_run(cai_threadpool *pool, cai_bkernel kernel, const int8_t *xq,
								const float *xs, const int16_t *xsum, int act_group, int n_tok,
								const cai_cpu_bmatrix *w, int n_out, const float *bias,
								float *out, int ldo, bool accumulate);

/*
 * The AVX-512 VNNI kernel of type (fn NULL where there is none): gemm_blocks_vnni.c, built
 * natively; its SIMDe copy in the unit tests is cai_bkernel_vnni_simde.  cai_bkernel_amx: the
 * same with AMX tiles for whole tiles of 16 tokens (the avx512-amx path only), for a K-quant
 * with super-block activations (superblocks) or per-block ones.
 */
cai_bkernel cai_bkernel_vnni(ggml_type type);
cai_bkernel cai_bkernel_amx(ggml_type type, bool superblocks);

/*
 * The AVX-VNNI (256-bit) kernel of type (fn NULL where there is none): gemm_blocks_avxvnni.c,
 * for the avx-vnni path; its SIMDe copy in the unit tests is cai_bkernel_avxvnni_simde.
 */
cai_bkernel cai_bkernel_avxvnni(ggml_type type);

#endif							/* CAI_GEMM_BLOCKS_INTERNAL_H */
