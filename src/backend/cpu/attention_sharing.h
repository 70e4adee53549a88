/*
 * attention_sharing.h — which decode rows of a step read the same KV blocks.
 *
 * The n samples of one prompt (copy-on-write forks, engine/README.md) and conversations on one
 * cached prefix hold the same physical blocks for their common tokens.  A step's attention reads
 * those blocks once per sequence; grouped, it reads them once for all (cai_attention_shared_part),
 * with the same bits.  This finds the groups: sequences of one new token each whose rows start at
 * the same position (no window, or the same position) and whose tables hold the same blocks from
 * there on, for a block at least.
 */
#ifndef CAI_CPU_ATTENTION_SHARING_H
#define CAI_CPU_ATTENTION_SHARING_H

#include "backend.h"

typedef struct cai_attn_share_group
{
	int			first;			/* its members: seqs[first .. first + n) */
	int			n;				/* at least 2 */
	int			own_from;		/* the first position of a block they do not all share */
	int			seg_begin;		/* the shared tile's segments: [seg_begin, seg_end), the last */
	int			seg_end;		/* the one that holds own_from - 1 */
} cai_attn_share_group;

/*
 * Finds the step's groups of at most max_members sequences each (cai_attention_shared_max_seqs:
 * one shared tile holds them all).  seqs and taken (work space) need batch->n_seqs entries
 * each and groups batch->n_seqs / 2.  Returns the number of groups; a sequence is in one group
 * at most, and the members of a group appear in seqs in ascending order.  own_from is never past
 * the block that holds a member's position (that block is the member's own: it writes there).
 */
int			cai_attention_share_groups(const cai_attn_params *ap, const cai_batch_layout *batch,
									   int max_members, int *seqs, int *taken,
									   cai_attn_share_group *groups);

#endif							/* CAI_CPU_ATTENTION_SHARING_H */
