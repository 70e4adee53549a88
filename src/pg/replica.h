/*
 * replica.h — pg_cai beside hot standbys and base backups: the writing functions' refusal on a
 * read-only server, and the weights cache kept out of base backups.
 */
#ifndef PG_CAI_REPLICA_H
#define PG_CAI_REPLICA_H

extern void CaiRequireWritable(const char *function);
extern void CaiWeightsCacheMoveOldDefault(void);

#endif							/* PG_CAI_REPLICA_H */
