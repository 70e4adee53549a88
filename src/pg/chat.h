/*
 * chat.h — generating from SQL: what the job runner shares with cai_chat and the reply trigger.
 */
#ifndef PG_CAI_CHAT_H
#define PG_CAI_CHAT_H

#include "utils/jsonb.h"

extern int64 CaiReplyToMessage(int64 conversation_id, int64 message_id, Jsonb *options);

#endif							/* PG_CAI_CHAT_H */
