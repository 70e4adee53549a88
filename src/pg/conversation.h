/*
 * conversation.h — reading and writing cai.conversations and cai.messages through SPI.
 *
 * Every query runs as the calling role (the functions are SECURITY INVOKER), so grants and
 * row-level security decide what a caller may read and write; a conversation the caller cannot
 * see does not exist for it.
 */
#ifndef PG_CAI_CONVERSATION_H
#define PG_CAI_CONVERSATION_H

#include "nodes/pg_list.h"
#include "utils/jsonb.h"

typedef struct CaiTurn
{
	int			role;			/* cai_role */
	char	   *content;
	int32	   *tokens;			/* stored ids, or NULL */
	int			n_tokens;
} CaiTurn;

typedef struct CaiConversation
{
	int64		id;
	char	   *system_prompt;	/* NULL when none */
	Jsonb	   *options;		/* NULL when none */
	char	   *model;			/* the model that answers it; NULL until its first reply */
	bool		has_model_column;	/* the table has it (0.2 on) */
	List	   *turns;			/* CaiTurn *, oldest first */
} CaiConversation;

/* What a stored row says besides its content */
typedef struct CaiStoredUsage
{
	int			prompt_tokens;
	int			completion_tokens;
	int			cached_tokens;
	double		ttft_ms;		/* engine submit -> first token */
} CaiStoredUsage;

/* While true, cai_reply_trigger leaves inserted user rows alone (cai_chat answers them). */
extern bool cai_replying_in_function;

extern int64 CaiConversationCreate(const char *system_prompt, Jsonb *options);
extern CaiConversation *CaiConversationLoad(int64 id, int64 up_to_message);
extern void CaiConversationRequireVisible(int64 id);
extern int64 CaiMessageInsert(int64 conversation_id, const char *role, const char *content,
							  const int32 *tokens, int n_tokens, const CaiStoredUsage *usage);
extern void CaiConversationSetModel(int64 conversation_id, const char *model);
extern void CaiMessageSetTokens(int64 message_id, const int32 *tokens, int n_tokens);

#endif							/* PG_CAI_CONVERSATION_H */
