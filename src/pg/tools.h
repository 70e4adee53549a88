/*
 * tools.h — tool calling in cai_chat_completion: the "tools" and "tool_choice" options, tool
 * turns of the messages, and calls in the reply (OpenAI's shapes).
 */
#ifndef PG_CAI_TOOLS_H
#define PG_CAI_TOOLS_H

#include "lib/stringinfo.h"
#include "nodes/pg_list.h"
#include "utils/jsonb.h"

#include "cai.h"
#include "wire.h"

typedef struct CaiToolOptions
{
	char	   *tools_json;		/* the declarations as UTF-8 JSON text, NULL for none */
	int			n_tools;
	int			choice;			/* cai_tool_choice */
	char	   *name;			/* CAI_TOOL_CHOICE_NAMED: the function */
	List	   *calls;			/* per message: its tool calls as UTF-8 JSON text, or "" */
	bool		any_tool_turn;	/* a message is a tool result or made calls */
} CaiToolOptions;

/*
 * Takes "tools" and "tool_choice" out of a call's options (checked, errors naming the option)
 * and returns the options without them (NULL stays NULL).
 */
extern Jsonb *CaiToolOptionsTake(Jsonb *options, CaiToolOptions *tools);

/*
 * A message's tool parts: its role id (tool results are CAI_ROLE_TOOL), its content (NULL
 * content allowed for an assistant message that makes calls) and its calls, noted in tools.
 */
extern int	CaiToolMessage(JsonbContainer *message, int index, const char *role,
						   char **content, CaiToolOptions *tools);

/* The tool block of a CHAT payload (wire.h), written when tools or tool turns are present. */
extern void CaiToolWriteBlock(cai_wbuf *payload, const CaiToolOptions *tools);

/*
 * Appends the choice's "message" and "finish_reason" members for the reply text: a call
 * (message.tool_calls, content null, finish_reason "tool_calls") when tools are on and the reply
 * is one, else the text.
 */
extern void CaiToolAppendChoice(StringInfo out, const char *reply, bool cut,
								const CaiToolOptions *tools, bool allow_partial);

#endif							/* PG_CAI_TOOLS_H */
