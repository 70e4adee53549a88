/*
 * chat.h — generating from SQL: what the job runner and the reply triggers share with cai_chat.
 */
#ifndef PG_CAI_CHAT_H
#define PG_CAI_CHAT_H

#include "fmgr.h"
#include "utils/jsonb.h"

extern int64 CaiReplyToMessage(int64 conversation_id, int64 message_id, Jsonb *options);

#endif							/* PG_CAI_CHAT_H */
