/*
 * chat.h — generating from SQL: what the job runner shares with cai_chat and the reply trigger.
 */
#ifndef PG_CAI_CHAT_H
#define PG_CAI_CHAT_H

#include "fmgr.h"
#include "utils/jsonb.h"

extern int64 CaiReplyToMessage(int64 conversation_id, int64 message_id, Jsonb *options);

/* The user turn a reply trigger saw inserted into cai.messages. */
typedef struct CaiTriggeredTurn
{
	int64		message_id;
	int64		conversation_id;
	Jsonb	   *options;		/* the trigger's argument, validated; '{}' when absent */
} CaiTriggeredTurn;

extern bool CaiReadTriggeredTurn(FunctionCallInfo fcinfo, const char *trigger_name,
								 CaiTriggeredTurn *turn);

#endif							/* PG_CAI_CHAT_H */
