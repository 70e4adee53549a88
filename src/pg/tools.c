/*
 * tools.c — tool calling in cai_chat_completion (tools.h).
 *
 * The declarations are checked here with the engine's own parser (cai_tool_set_parse), so a
 * bad one is refused before any request is sent, and again by the engine process, which trusts
 * no payload.  The engine renders them in the model family's format and constrains the calls.
 */
#include "postgres.h"

#include "common/jsonapi.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"

#include "pg_compat.h"
#include "tools.h"

#define TOOL_CHOICE_SHAPE "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}"

static JsonbValue *
field(JsonbContainer *object, const char *key)
{
	return getKeyJsonValueFromContainer(object, key, strlen(key), NULL);
}

static char *
to_utf8(const char *text)
{
	return pg_server_to_any(text, strlen(text), PG_UTF8);
}

/* The text of a jsonb container (keys in jsonb's order). */
static char *
container_text(JsonbContainer *c)
{
	return JsonbToCString(NULL, c, VARSIZE_ANY_EXHDR(c));
}

/* Checks the "tools" value and keeps it as UTF-8 JSON text. */
static void
take_tools(JsonbValue *value, CaiToolOptions *tools)
{
	cai_tool_set *set = NULL;
	cai_error	err;
	cai_status	st;
	char	   *text;

	if (value->type == jbvNull)
		return;
	if (value->type != jbvBinary || !JsonContainerIsArray(value->val.binary.data))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"tools\" must be an array of {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}")));
	text = to_utf8(container_text(value->val.binary.data));
	memset(&err, 0, sizeof(err));
	st = cai_tool_set_parse(text, strlen(text), &set, &err);
	if (st == CAI_OK)
		tools->n_tools = cai_tool_set_count(set);
	cai_tool_set_free(set);
	if (st == CAI_ERR_NO_MEMORY)
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("%s", err.message)));
	if (st != CAI_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"tools\" is invalid: %s", err.message)));
	tools->tools_json = tools->n_tools > 0 ? text : NULL;
}

/* "none", "auto", "required" or {"type": "function", "function": {"name": ...}} */
static void
take_tool_choice(JsonbValue *value, CaiToolOptions *tools)
{
	if (value->type == jbvString)
	{
		char	   *s = pnstrdup(value->val.string.val, value->val.string.len);

		if (strcmp(s, "none") == 0)
			tools->choice = CAI_TOOL_CHOICE_NONE;
		else if (strcmp(s, "auto") == 0)
			tools->choice = CAI_TOOL_CHOICE_AUTO;
		else if (strcmp(s, "required") == 0)
			tools->choice = CAI_TOOL_CHOICE_REQUIRED;
		else
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("option \"tool_choice\" must be " TOOL_CHOICE_SHAPE),
					 errdetail("Got \"%s\".", s)));
		return;
	}
	if (value->type == jbvBinary && JsonContainerIsObject(value->val.binary.data))
	{
		JsonbValue *type = field(value->val.binary.data, "type");
		JsonbValue *fn = field(value->val.binary.data, "function");
		JsonbValue *name = fn && fn->type == jbvBinary && JsonContainerIsObject(fn->val.binary.data) ?
			field(fn->val.binary.data, "name") : NULL;

		if (type && type->type == jbvString && type->val.string.len == 8 &&
			memcmp(type->val.string.val, "function", 8) == 0 && name && name->type == jbvString)
		{
			tools->choice = CAI_TOOL_CHOICE_NAMED;
			tools->name = pnstrdup(name->val.string.val, name->val.string.len);
			return;
		}
	}
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("option \"tool_choice\" must be " TOOL_CHOICE_SHAPE)));
}

/* Whether the named function is among the declarations (checked by the engine's parser). */
static bool
tool_declared(const char *tools_json, const char *name)
{
	cai_tool_set *set = NULL;
	cai_error	err;
	bool		found;

	if (cai_tool_set_parse(tools_json, strlen(tools_json), &set, &err) != CAI_OK)
		return false;
	found = cai_tool_set_find(set, name) >= 0;
	cai_tool_set_free(set);
	return found;
}

Jsonb *
CaiToolOptionsTake(Jsonb *options, CaiToolOptions *tools)
{
	JsonbValue *value;
	bool		choice_given = false;

	memset(tools, 0, sizeof(*tools));
	if (options == NULL || !JB_ROOT_IS_OBJECT(options))
		return options;		/* CaiOptionsApply says what is wrong with it */
	if ((value = field(&options->root, "tools")) != NULL)
		take_tools(value, tools);
	if ((value = field(&options->root, "tool_choice")) != NULL && value->type != jbvNull)
	{
		take_tool_choice(value, tools);
		choice_given = true;
	}
	if (!choice_given)
		tools->choice = tools->n_tools > 0 ? CAI_TOOL_CHOICE_AUTO : CAI_TOOL_CHOICE_NONE;
	if ((tools->choice == CAI_TOOL_CHOICE_REQUIRED || tools->choice == CAI_TOOL_CHOICE_NAMED) &&
		tools->n_tools == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"tool_choice\" needs a non-empty \"tools\" option")));
	if (tools->choice == CAI_TOOL_CHOICE_AUTO && tools->n_tools == 0)
		tools->choice = CAI_TOOL_CHOICE_NONE;
	if (tools->choice == CAI_TOOL_CHOICE_NAMED && !tool_declared(tools->tools_json, to_utf8(tools->name)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"tool_choice\" names function \"%s\", which is not among the tools",
						tools->name)));
	options = DatumGetJsonbP(DirectFunctionCall2(jsonb_delete, JsonbPGetDatum(options),
												 CStringGetTextDatum("tools")));
	options = DatumGetJsonbP(DirectFunctionCall2(jsonb_delete, JsonbPGetDatum(options),
												 CStringGetTextDatum("tool_choice")));
	return options;
}

static void
bad_tool_calls(int index, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("message %d has invalid \"tool_calls\"", index),
			 errdetail("%s", detail),
			 errhint("Each call is {\"id\": ..., \"type\": \"function\", \"function\": {\"name\": ..., \"arguments\": \"<JSON text>\"}}.")));
}

/* An assistant message's tool_calls as the engine's [{"name", "arguments"}] text. */
static char *
message_calls(JsonbValue *calls, int index)
{
	StringInfoData out;
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	elem;
	int			n = 0;

	if (calls->type != jbvBinary || !JsonContainerIsArray(calls->val.binary.data))
		bad_tool_calls(index, "\"tool_calls\" is not an array.");
	initStringInfo(&out);
	appendStringInfoChar(&out, '[');
	it = JsonbIteratorInit(calls->val.binary.data);
	while ((tok = JsonbIteratorNext(&it, &elem, true)) != WJB_DONE)
	{
		JsonbValue *fn,
				   *name,
				   *args;
		char	   *args_text;
		JsonLexContext *lex;

		if (tok != WJB_ELEM)
			continue;
		if (elem.type != jbvBinary || !JsonContainerIsObject(elem.val.binary.data) ||
			!(fn = field(elem.val.binary.data, "function")) || fn->type != jbvBinary ||
			!JsonContainerIsObject(fn->val.binary.data))
			bad_tool_calls(index, "A call has no \"function\" object.");
		name = field(fn->val.binary.data, "name");
		args = field(fn->val.binary.data, "arguments");
		if (!name || name->type != jbvString)
			bad_tool_calls(index, "A call's function has no string \"name\".");
		if (!args || args->type != jbvString)
			bad_tool_calls(index, "A call's function has no string \"arguments\".");
		args_text = pnstrdup(args->val.string.val, args->val.string.len);
		lex = CaiJsonLexContext(args_text, strlen(args_text));
		if (pg_parse_json(lex, &nullSemAction) != JSON_SUCCESS)
			bad_tool_calls(index, "A call's \"arguments\" is not JSON text.");
		if (n++ > 0)
			appendStringInfoChar(&out, ',');
		appendStringInfoString(&out, "{\"name\": ");
		escape_json(&out, pnstrdup(name->val.string.val, name->val.string.len));
		appendStringInfo(&out, ", \"arguments\": %s}", args_text);
	}
	appendStringInfoChar(&out, ']');
	return n > 0 ? to_utf8(out.data) : "";
}

int
CaiToolMessage(JsonbContainer *message, int index, const char *role, char **content,
			   CaiToolOptions *tools)
{
	JsonbValue *c = field(message, "content");
	JsonbValue *calls = field(message, "tool_calls");
	char	   *call_text = "";
	int			role_id;

	if (strcmp(role, "tool") == 0)
	{
		JsonbValue *id = field(message, "tool_call_id");

		if (!id || id->type != jbvString)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("message %d has role \"tool\" but no string \"tool_call_id\"", index)));
		role_id = CAI_ROLE_TOOL;
		tools->any_tool_turn = true;
	}
	else
		role_id = strcmp(role, "assistant") == 0 ? CAI_ROLE_ASSISTANT : -1;
	if (calls && calls->type != jbvNull)
	{
		if (role_id != CAI_ROLE_ASSISTANT)
			bad_tool_calls(index, "Only assistant messages make tool calls.");
		call_text = message_calls(calls, index);
		tools->any_tool_turn = tools->any_tool_turn || call_text[0] != '\0';
	}
	if (c && c->type == jbvString)
		*content = pnstrdup(c->val.string.val, c->val.string.len);
	else if ((!c || c->type == jbvNull) && call_text[0] != '\0')
		*content = "";
	else
		*content = NULL;
	tools->calls = lappend(tools->calls, call_text);
	return role_id;
}

void
CaiToolWriteBlock(cai_wbuf *payload, const CaiToolOptions *tools)
{
	const char *name = tools->name ? to_utf8(tools->name) : "";
	ListCell   *lc;

	if (tools->n_tools == 0 && !tools->any_tool_turn)
		return;
	cai_put_u8(payload, (uint8) tools->choice);
	cai_put_text(payload, tools->tools_json ? tools->tools_json : "",
				 tools->tools_json ? strlen(tools->tools_json) : 0);
	cai_put_text(payload, name, strlen(name));
	foreach(lc, tools->calls)
	{
		const char *calls = lfirst(lc);

		cai_put_text(payload, calls, strlen(calls));
	}
}

/* Appends ", \"tool_calls\": [...]" for one call, with an id of random hex. */
static void
append_call(StringInfo out, const char *name, const char *arguments)
{
	uint8		bytes[12];
	char	   *server_name = pg_any_to_server(name, strlen(name), PG_UTF8);
	char	   *server_args = pg_any_to_server(arguments, strlen(arguments), PG_UTF8);

	if (!pg_strong_random(bytes, sizeof(bytes)))
		memset(bytes, 0, sizeof(bytes));
	appendStringInfoString(out, "\"tool_calls\": [{\"id\": \"call_");
	for (int i = 0; i < (int) sizeof(bytes); i++)
		appendStringInfo(out, "%02x", bytes[i]);
	appendStringInfoString(out, "\", \"type\": \"function\", \"function\": {\"name\": ");
	escape_json(out, server_name);
	appendStringInfoString(out, ", \"arguments\": ");
	escape_json(out, server_args);
	appendStringInfoString(out, "}}]");
}

void
CaiToolAppendChoice(StringInfo out, const char *reply, bool cut, const CaiToolOptions *tools,
					bool allow_partial)
{
	char	   *utf8 = to_utf8(reply);
	char	   *name = NULL;
	char	   *arguments = NULL;
	cai_error	err;
	bool		is_call = false;

	if (tools->choice != CAI_TOOL_CHOICE_NONE && !cut)
		is_call = cai_tool_reply_parse(utf8, strlen(utf8), &name, &arguments, &err) == CAI_OK &&
			tool_declared(tools->tools_json, name);
	if (!is_call && tools->choice != CAI_TOOL_CHOICE_NONE && cut && !allow_partial &&
		(tools->choice != CAI_TOOL_CHOICE_AUTO || strspn(utf8, " \t\r\n") < strlen(utf8)) &&
		(tools->choice != CAI_TOOL_CHOICE_AUTO || utf8[strspn(utf8, " \t\r\n")] == '<' ||
		 utf8[strspn(utf8, " \t\r\n")] == '{'))
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("the tool call was cut by max_tokens before it was complete"),
				 errhint("Raise max_tokens, or set \"allow_partial\": true to get the partial text.")));
	appendStringInfoString(out, "\"message\": {\"role\": \"assistant\", \"content\": ");
	if (is_call)
	{
		appendStringInfoString(out, "null, ");
		append_call(out, name, arguments);
		appendStringInfoString(out, "}, \"finish_reason\": \"tool_calls\"");
	}
	else
	{
		escape_json(out, reply);
		appendStringInfo(out, "}, \"finish_reason\": \"%s\"", cut ? "length" : "stop");
	}
	if (name)
		cai_free(name);
	if (arguments)
		cai_free(arguments);
}
