/*
 * tools.h — function calling: OpenAI-shaped tool declarations, their rendering in a model
 * family's tool format, and the constraint that keeps a generated call valid.
 *
 * Formats (chosen from the chat template):
 *
 *   HERMES  Qwen2.5/Qwen3's: the tools as JSON lines inside <tools></tools> in the system
 *           prompt; a call is <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>;
 *           tool results come back in a user turn inside <tool_response></tool_response>.
 *           Also the generic format of templates that have no tool format of their own
 *           (SmolLM2, Gemma, Llama 2, Zephyr): the same text, through their own turn markup.
 *   LLAMA3  Llama 3.1/3.2's JSON calls: the tools (JSON, indented by 4) open the first user
 *           message; a call is the whole reply {"name": ..., "parameters": {...}}; results
 *           come back in "ipython" turns.
 *
 * Tool JSON is rendered as Jinja's tojson writes it (keys sorted, ", " and ": " separators,
 * non-ASCII and <>&' as \u escapes), so that a prompt equals what the published templates make.
 *
 * The constraint: a call is a JSON object whose "name" is one of the offered tools and whose
 * arguments follow that tool's parameters schema, compiled into one grammar (json_schema.c).
 * With tool_choice "auto" the first generated token decides: a token that starts the format's
 * opening marker (HERMES: <tool_call>; LLAMA3: the object's "{") starts a call and everything
 * after it is constrained; any other token makes the reply plain text.  With "required" or a
 * named function the reply is constrained from its first token.
 */
#ifndef CAI_TOOLS_H
#define CAI_TOOLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"
#include "grammar.h"
#include "json.h"
#include "tokenizer.h"
#include "util.h"

#define CAI_MAX_TOOLS 128		/* the grammar's choice among tools stays within its limits */

typedef enum cai_tool_format
{
	CAI_TOOL_FORMAT_HERMES = 0,
	CAI_TOOL_FORMAT_LLAMA3
} cai_tool_format;

typedef struct cai_tool
{
	char	   *name;			/* function.name, NUL-terminated */
	char	   *tool_json;		/* the whole declaration as tojson writes it */
	char	   *tool_json_indent;	/* the same, tojson(indent=4) */
	char	   *params_json;	/* function.parameters, compact, as given */
} cai_tool;

struct cai_tool_set
{
	cai_tool   *tools;
	int			n_tools;
};

/* The format a template kind (chat_template.h) uses. */
cai_tool_format cai_tool_format_for_template(int template_kind);

/* The argument key of a format's calls: "arguments" or "parameters". */
const char *cai_tool_format_args_key(cai_tool_format format);

/*
 * Appends v as Jinja's tojson filter writes it (Python's json.dumps with sort_keys, ensure_ascii
 * and HTML-safe escapes); indent > 0 puts members on lines of their own, indent spaces deep.
 * False when out of memory.
 */
bool		cai_tool_json_write(const json_value *v, int indent, cai_buf *out);

/* ---------------------------------------------------------------------------------------------
 * The constraint of a request
 * ------------------------------------------------------------------------------------------- */

typedef struct cai_tool_state cai_tool_state;

/*
 * A state over the calls of tools (only the one named forced_name when not NULL), in format,
 * for a model with tokenizer tok.  forced: a call from the first token ("required", a named
 * function); else "auto".  The state owns its grammar.
 */
cai_status	cai_tool_state_create(const cai_tool_set *tools, const char *forced_name, bool forced,
								  cai_tool_format format, const cai_tokenizer *tok,
								  const cai_token_index *index, cai_tool_state **out,
								  cai_error *err);
void		cai_tool_state_free(cai_tool_state *state);

/*
 * The tokens allowed next, as grammar.h's bitset.  Returns 1 when bits holds the mask, 0 when
 * the next token is free (a text reply, or the first token under "auto"), -1 when out of memory.
 */
int			cai_tool_state_allowed(cai_tool_state *state, uint64_t *bits);

/* Advances by token id; false when the token is not allowed or out of memory. */
bool		cai_tool_state_accept(cai_tool_state *state, int32_t id);

/* True once the reply has started a call. */
bool		cai_tool_state_in_call(const cai_tool_state *state);

#endif							/* CAI_TOOLS_H */
