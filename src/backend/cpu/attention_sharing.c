/*
 * attention_sharing.c — groups of decode rows over the same KV blocks (attention_sharing.h).
 *
 * Greedy, in sequence order: the first sequence not yet taken leads a group and takes every later
 * one that starts its rows where it does and shares at least a block with it from there; the
 * group shares the blocks all its members share with the leader.  Tables are compared block by
 * block from the rows' first position, so sequences that share nothing part at the first
 * comparison.
 */
#include "attention_sharing.h"

#include <limits.h>

#include "attention.h"
#include "kv.h"

#define SEG CAI_ATTN_SEGMENT_TOKENS
#define BLOCK CAI_KV_BLOCK_TOKENS

/*
 * The first block, from lo's, that tables a and b do not hold alike, or limit if they hold
 * every block before it alike.
 */
static int
shared_until(const int32_t *a, const int32_t *b, int lo, int limit)
{
	int			k = lo / BLOCK;

	while (k < limit && a[k] == b[k])
		k++;
	return k;
}

int
cai_attention_share_groups(const cai_attn_params *ap, const cai_batch_layout *batch,
						   int max_members, int *seqs, int *taken,
						   cai_attn_share_group *groups)
{
	int			n_groups = 0;
	int			n_members = 0;

	for (int s = 0; s < batch->n_seqs; s++)
		taken[s] = 0;
	for (int a = 0; a < batch->n_seqs && max_members >= 2; a++)
	{
		int			pos_a = batch->token_pos[batch->seq_start[a]];
		int			lo = cai_attention_first_position(ap, pos_a);
		int			own_block = INT_MAX;
		cai_attn_share_group g = {.first = n_members, .n = 1};

		if (taken[a] || batch->seq_len[a] != 1)
			continue;
		seqs[n_members] = a;
		for (int u = a + 1; u < batch->n_seqs && g.n < max_members; u++)
		{
			int			pos_u = batch->token_pos[batch->seq_start[u]];
			/* never the block that holds either position: each writes its own there */
			int			limit = (pos_a < pos_u ? pos_a : pos_u) / BLOCK;
			int			end;

			if (taken[u] || batch->seq_len[u] != 1 || cai_attention_first_position(ap, pos_u) != lo)
				continue;
			end = shared_until(batch->block_tables[a], batch->block_tables[u], lo, limit);
			if (end <= lo / BLOCK)
				continue;
			taken[u] = 1;
			seqs[n_members + g.n++] = u;
			if (end < own_block)
				own_block = end;
		}
		if (g.n < 2)
			continue;
		taken[a] = 1;
		g.own_from = own_block * BLOCK;
		g.seg_begin = lo / SEG;
		g.seg_end = (g.own_from + SEG - 1) / SEG;
		groups[n_groups++] = g;
		n_members += g.n;
	}
	return n_groups;
}
