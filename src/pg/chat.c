/*
 * chat.c — the SQL functions that generate: cai_new_conversation, cai_chat, cai_chat_stream,
 * cai_complete, cai_chat_completion, the typed replies cai_chat_json and cai_complete_json, and
 * CaiReplyToMessage, which the reply triggers (reply_trigger.c) and the job runners
 * (jobs_runner.c) answer a stored user turn with.
 *
 * All run in the caller's backend as the caller: they read the conversation (its stored token
 * ids included) with SPI, send the turns to the engine worker, wait for the reply, and store the
 * user and assistant turns in the caller's transaction.  Anything that fails raises an error
 * before a row is written, so a failed call leaves no half-written turn.
 *
 * A user turn gets exactly one reply: cai_chat inserts its user row with
 * cai_replying_in_function set, and the reply triggers (reply_trigger.c) leave such rows alone.
 */
#include "postgres.h"

#include "funcapi.h"
#include "libpq/libpq.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "cai.h"
#include "channel.h"
#include "chat.h"
#include "conversation.h"
#include "guc.h"
#include "options.h"
#include "protocol.h"
#include "replica.h"
#include "shmem.h"
#include "tools.h"

PG_FUNCTION_INFO_V1(pg_cai_new_conversation);
PG_FUNCTION_INFO_V1(pg_cai_chat);
PG_FUNCTION_INFO_V1(pg_cai_chat_stream);
PG_FUNCTION_INFO_V1(pg_cai_complete);
PG_FUNCTION_INFO_V1(pg_cai_complete_n);
PG_FUNCTION_INFO_V1(pg_cai_chat_completion);
PG_FUNCTION_INFO_V1(pg_cai_chat_json);
PG_FUNCTION_INFO_V1(pg_cai_complete_json);
PG_FUNCTION_INFO_V1(pg_cai_chat_json_text);
PG_FUNCTION_INFO_V1(pg_cai_complete_json_text);

/*
 * cache_salt
 *		The prefix-cache namespace of a request, from pg_cai.cache_isolation: computed here,
 *		never taken from the client.  conversation_id is 0 outside a conversation; such requests
 *		are isolated per role under "conversation".  The high bits keep the namespaces apart.
 */
static uint64
cache_salt(int64 conversation_id)
{
	switch (cai_cache_isolation)
	{
		case CAI_ISOLATION_NONE:
			return 0;
		case CAI_ISOLATION_CONVERSATION:
			if (conversation_id > 0)
				return (UINT64CONST(1) << 63) | (uint64) conversation_id;
			/* FALLTHROUGH */
		case CAI_ISOLATION_ROLE:
		default:
			return (UINT64CONST(1) << 62) | (uint64) GetUserId();
	}
}

/* Text in the database encoding -> UTF-8 for the engine. */
static char *
to_utf8(const char *text, int *len)
{
	char	   *converted = pg_server_to_any(text, *len, PG_UTF8);

	if (converted != text)
		*len = strlen(converted);
	return converted;
}

/* UTF-8 from the engine -> a text datum in the database encoding (validated). */
static text *
text_from_utf8(const char *utf8, Size len)
{
	char	   *converted = pg_any_to_server(utf8, (int) len, PG_UTF8);

	if (converted != utf8)
		return cstring_to_text(converted);
	return cstring_to_text_with_len(utf8, (int) len);
}

/* Appends one turn to a CHAT payload; n_tokens < 0 means "tokenize the content". */
static void
put_turn(cai_wbuf *buf, int role, const char *content, const int32 *tokens, int n_tokens)
{
	int			len = strlen(content);
	char	   *utf8 = to_utf8(content, &len);

	cai_wire_put_turn(buf, role, utf8, len, tokens, n_tokens);
}

/*
 * A typed reply's schema argument: jsonb (keys in jsonb's order), or JSON text (text and json
 * overloads: keys in the text's order).  NULL for an untyped call.
 */
typedef struct CaiSchemaArg
{
	Jsonb	   *jsonb;
	char	   *text;
} CaiSchemaArg;

static void
apply_schema(CaiOptions *options, const CaiSchemaArg *schema)
{
	if (schema == NULL)
		return;
	if (schema->jsonb)
		CaiOptionsSetSchema(options, schema->jsonb);
	else
		CaiOptionsSetSchemaText(options, schema->text);
}

/*
 * keep_conversation_model
 *		A conversation keeps the model of its first reply (its stored turns carry that model's
 *		token ids): the options' model, or the default one, is recorded then; later, a model
 *		named by the call or the conversation's options must be that one.
 */
static void
keep_conversation_model(CaiConversation *conv, CaiOptions *options)
{
	if (conv->model == NULL)
	{
		options->model = (char *) CaiModelResolve(options->model);
		if (conv->has_model_column)
			CaiConversationSetModel(conv->id, options->model);
		return;
	}
	if (options->model != NULL && strcmp(options->model, conv->model) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("conversation " INT64_FORMAT " is answered by model \"%s\", not \"%s\"",
						conv->id, conv->model, options->model),
				 errdetail("A conversation keeps the model of its first reply: its stored turns carry that model's token ids."),
				 errhint("Leave the \"model\" option out, or start a new conversation for model \"%s\".",
						 options->model)));
	options->model = conv->model;
}

/*
 * start_conversation_turn
 *		Reads the conversation, merges its options under the call's, and posts a CHAT request
 *		with the system prompt, the stored turns (up to up_to_message when not 0) and, when
 *		message is not NULL, the new user turn.  A schema (the typed replies' argument), when
 *		given, constrains the reply over any response_format of the options.  *effective gets
 *		the options the request runs with.
 */
static CaiGeneration *
start_conversation_turn(int64 conversation_id, const char *message, Jsonb *call_options,
						int64 up_to_message, const CaiSchemaArg *schema, CaiOptions *effective)
{
	CaiConversation *conv;
	CaiOptions	options;
	cai_wbuf	payload;
	ListCell   *lc;
	int			n_messages;

	CaiOptionsInit(&options);
	CaiOptionsApply(&options, call_options);	/* report a bad call option first */

	conv = CaiConversationLoad(conversation_id, up_to_message);

	CaiOptionsInit(&options);
	CaiOptionsApply(&options, conv->options);
	CaiOptionsApply(&options, call_options);
	apply_schema(&options, schema);
	keep_conversation_model(conv, &options);
	*effective = options;
	/* a conversation stores one reply: which of n would be arbitrary */
	if (options.n_samples > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"n\" must be 1 in a conversation (got %d)", options.n_samples),
				 errdetail("A conversation stores one reply to each turn."),
				 errhint("Use cai_chat_completion for several choices.")));

	n_messages = list_length(conv->turns) + (conv->system_prompt ? 1 : 0) + (message ? 1 : 0);
	if (n_messages == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("conversation " INT64_FORMAT " has nothing to reply to", conversation_id)));

	CaiWireInit(&payload);
	CaiOptionsWriteGeneration(&payload, &options, cache_salt(conversation_id), conversation_id);
	cai_put_i32(&payload, n_messages);
	if (conv->system_prompt)
		put_turn(&payload, CAI_ROLE_SYSTEM, conv->system_prompt, NULL, -1);
	foreach(lc, conv->turns)
	{
		CaiTurn    *turn = (CaiTurn *) lfirst(lc);

		put_turn(&payload, turn->role, turn->content, turn->tokens,
				 turn->tokens ? turn->n_tokens : -1);
	}
	if (message)
		put_turn(&payload, CAI_ROLE_USER, message, NULL, -1);

	return CaiGenerationStartFor(CAI_REQUEST_CHAT, &payload, options.model, 1);
}

/*
 * refuse_cut_json
 *		A reply under a JSON response_format that max_tokens cut is not JSON: an error (nothing
 *		is stored, the caller's transaction fails) unless the options allow partial output.
 *		The end of a constrained reply is allowed only where its value is complete, so any
 *		finish but STOP means a cut value.
 */
static void
refuse_cut_json(const CaiGeneration *gen, const CaiOptions *options)
{
	if (options->response_format == CAI_RESPONSE_TEXT || options->allow_partial ||
		gen->final.finish == CAI_FINISH_STOP)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
			 errmsg("the reply was cut after %d tokens, before its JSON value was complete",
					gen->final.completion_tokens),
			 errhint("Raise max_tokens, ask for a smaller value, or pass {\"allow_partial\": true} to take the cut text.")));
}

/* The reply's usage, as stored with the assistant turn. */
static CaiStoredUsage
stored_usage(const CaiGeneration *gen)
{
	CaiStoredUsage usage;

	usage.prompt_tokens = gen->final.prompt_tokens;
	usage.completion_tokens = gen->final.completion_tokens;
	usage.cached_tokens = gen->final.cached_tokens;
	usage.ttft_ms = gen->final.ttft_ms;
	return usage;
}

/* The reply's text in the database encoding, as a C string. */
static char *
reply_text(const CaiGeneration *gen)
{
	return text_to_cstring(text_from_utf8(gen->text.data, gen->text.len));
}

/*
 * insert_assistant_turn
 *		Stores the reply with its ids (when they say exactly what the text says) and usage;
 *		returns the new row's id.
 */
static int64
insert_assistant_turn(int64 conversation_id, const CaiGeneration *gen)
{
	CaiStoredUsage usage = stored_usage(gen);

	return CaiMessageInsert(conversation_id, "assistant", reply_text(gen),
							gen->final.tokens_exact ? gen->ids : NULL, gen->n_ids, &usage);
}

/*
 * CaiReplyToMessage
 *		Answers a user turn that is already stored: generates the reply from the conversation's
 *		turns up to and including message_id, stores the ids the worker tokenized that turn to and
 *		the reply, and returns the reply's id.  Runs as the current user (row-level security,
 *		grants and the prefix-cache salt are that role's) and locks the conversation row until
 *		the end of the transaction, like cai_chat.  Shared by cai_reply_trigger and the job
 *		runner (jobs_runner.c), so that a reply is produced the same way whoever asks.
 */
int64
CaiReplyToMessage(int64 conversation_id, int64 message_id, Jsonb *options)
{
	CaiGeneration *gen;
	CaiOptions	effective;

	gen = start_conversation_turn(conversation_id, NULL, options, message_id, NULL, &effective);
	CaiGenerationFinish(gen);
	refuse_cut_json(gen, &effective);

	if (gen->final.n_user_tokens > 0)
		CaiMessageSetTokens(message_id, gen->user_tokens, gen->final.n_user_tokens);
	return insert_assistant_turn(conversation_id, gen);
}

/*
 * store_exchange
 *		Stores the user turn (with the ids the worker tokenized it to) and the reply.
 */
static void
store_exchange(int64 conversation_id, const char *message, const CaiGeneration *gen)
{
	PG_TRY();
	{
		cai_replying_in_function = true;
		(void) CaiMessageInsert(conversation_id, "user", message,
								gen->final.n_user_tokens > 0 ? gen->user_tokens : NULL,
								gen->final.n_user_tokens, NULL);
	}
	PG_FINALLY();
	{
		cai_replying_in_function = false;
	}
	PG_END_TRY();

	(void) insert_assistant_turn(conversation_id, gen);
}

/* Raises an error for a NULL argument. */
static void
require_argument(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
}

/*
 * chat_arguments
 *		The conversation_id, message and options (argument optarg) arguments of cai_chat,
 *		cai_chat_stream and cai_chat_json.
 */
static void
chat_arguments(FunctionCallInfo fcinfo, int optarg, int64 *conversation_id, char **message,
			   Jsonb **options)
{
	char	   *function = get_func_name(fcinfo->flinfo->fn_oid);

	CaiRequireWritable(function ? function : "cai_chat");
	(void) CaiSharedStateOrError();
	require_argument(fcinfo, 0, "conversation_id");
	require_argument(fcinfo, 1, "message");
	*conversation_id = PG_GETARG_INT64(0);
	*message = text_to_cstring(PG_GETARG_TEXT_PP(1));
	if ((*message)[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("message must not be empty")));
	*options = PG_ARGISNULL(optarg) ? NULL : PG_GETARG_JSONB_P(optarg);
}

/*
 * cai_new_conversation(system_prompt text, options jsonb) -> bigint
 *		Creates a conversation owned by the current user.  Its options become the defaults of
 *		every turn.
 */
Datum
pg_cai_new_conversation(PG_FUNCTION_ARGS)
{
	char	   *system_prompt = NULL;
	Jsonb	   *options = NULL;

	CaiRequireWritable("cai_new_conversation");
	(void) CaiSharedStateOrError();
	if (!PG_ARGISNULL(0))
		system_prompt = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (!PG_ARGISNULL(1))
	{
		options = PG_GETARG_JSONB_P(1);
		CaiOptionsValidate(options);
	}
	else
		options = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum("{}")));

	PG_RETURN_INT64(CaiConversationCreate(system_prompt, options));
}

/*
 * cai_chat(conversation_id bigint, message text, options jsonb) -> text
 *		Generates the reply to message in the conversation and stores both turns.  Locks the
 *		conversation row until the end of the transaction.
 */
Datum
pg_cai_chat(PG_FUNCTION_ARGS)
{
	int64		conversation_id;
	char	   *message;
	Jsonb	   *options;
	CaiGeneration *gen;
	CaiOptions	effective;

	chat_arguments(fcinfo, 2, &conversation_id, &message, &options);

	gen = start_conversation_turn(conversation_id, message, options, 0, NULL, &effective);
	CaiGenerationFinish(gen);
	refuse_cut_json(gen, &effective);
	store_exchange(conversation_id, message, gen);

	PG_RETURN_TEXT_P(text_from_utf8(gen->text.data, gen->text.len));
}

/*
 * reply_as_jsonb
 *		A constrained reply as jsonb.  The engine only lets a value end where it is complete, so a
 *		reply that did not end there was cut by max_tokens: an error, never invalid JSON.
 */
static Datum
reply_as_jsonb(const CaiGeneration *gen)
{
	if (gen->final.finish != CAI_FINISH_STOP)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("the reply was cut after %d tokens, before its JSON value was complete",
						gen->final.completion_tokens),
				 errhint("Raise max_tokens, or ask for a smaller value.")));
	return DirectFunctionCall1(jsonb_in, CStringGetDatum(reply_text(gen)));
}

/* The schema argument of a typed reply, jsonb or JSON text (text, json): required. */
static CaiSchemaArg
schema_argument(FunctionCallInfo fcinfo, int argno, bool as_text)
{
	CaiSchemaArg schema = {NULL, NULL};

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("schema must not be null"),
				 errhint("Pass a JSON Schema, or '{\"type\": \"object\"}' for any object.")));
	if (as_text)
		schema.text = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	else
		schema.jsonb = PG_GETARG_JSONB_P(argno);
	return schema;
}

/* cai_chat_json with its schema as jsonb or as JSON text. */
static Datum
chat_json(FunctionCallInfo fcinfo, bool schema_as_text)
{
	int64		conversation_id;
	char	   *message;
	Jsonb	   *options;
	CaiSchemaArg schema;
	CaiGeneration *gen;
	CaiOptions	effective;
	Datum		result;

	chat_arguments(fcinfo, 3, &conversation_id, &message, &options);
	schema = schema_argument(fcinfo, 2, schema_as_text);

	gen = start_conversation_turn(conversation_id, message, options, 0, &schema, &effective);
	CaiGenerationFinish(gen);
	result = reply_as_jsonb(gen);
	store_exchange(conversation_id, message, gen);
	PG_RETURN_DATUM(result);
}

/*
 * cai_chat_json(conversation_id bigint, message text, schema jsonb, options jsonb) -> jsonb
 *		Like cai_chat, with the reply constrained to a JSON value valid against schema and
 *		returned as jsonb.  Both turns are stored only when the value is complete.
 */
Datum
pg_cai_chat_json(PG_FUNCTION_ARGS)
{
	return chat_json(fcinfo, false);
}

/*
 * cai_chat_json(conversation_id bigint, message text, schema text | json, options jsonb)
 *		-> jsonb
 *		The same with the schema as JSON text, read as written: properties are generated in
 *		the text's order (jsonb sorts keys).  A string literal resolves to the text overload.
 */
Datum
pg_cai_chat_json_text(PG_FUNCTION_ARGS)
{
	return chat_json(fcinfo, true);
}

/* cai_chat_stream's state across calls */
typedef struct StreamState
{
	int64		conversation_id;
	char	   *message;
	CaiOptions	options;		/* the request's, merged */
	CaiGeneration *gen;
	ExprContext *econtext;
} StreamState;

/*
 * stream_shutdown
 *		Runs when the query stops reading rows early (LIMIT, a closed cursor): detaches, and the
 *		worker drops the generation.  Nothing is stored for an unfinished reply.
 */
static void
stream_shutdown(Datum arg)
{
	StreamState *state = (StreamState *) DatumGetPointer(arg);

	if (state->gen != NULL && !state->gen->done)
		CaiChannelClose(state->gen->channel);
}

/*
 * cai_chat_stream(conversation_id bigint, message text, options jsonb) -> SETOF text
 *		Like cai_chat, but returns the reply as it is generated, one row per piece of text.
 *		Called in the select list (SELECT cai_chat_stream(...)), rows reach the client as they
 *		come; in FROM, PostgreSQL collects all rows first.  Both turns are stored once the reply
 *		is complete.
 */
Datum
pg_cai_chat_stream(PG_FUNCTION_ARGS)
{
	FuncCallContext *funcctx;
	StreamState *state;
	MemoryContext old;
	const char *piece;
	Size		len;

	if (SRF_IS_FIRSTCALL())
	{
		ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
		int64		conversation_id;
		char	   *message;
		Jsonb	   *options;

		funcctx = SRF_FIRSTCALL_INIT();
		old = MemoryContextSwitchTo(funcctx->multi_call_memory_ctx);

		chat_arguments(fcinfo, 2, &conversation_id, &message, &options);
		state = palloc0(sizeof(StreamState));
		state->conversation_id = conversation_id;
		state->message = message;
		state->gen = start_conversation_turn(conversation_id, message, options, 0, NULL,
											 &state->options);
		state->econtext = rsinfo->econtext;
		RegisterExprContextCallback(rsinfo->econtext, stream_shutdown, PointerGetDatum(state));
		funcctx->user_fctx = state;

		MemoryContextSwitchTo(old);
	}

	funcctx = SRF_PERCALL_SETUP();
	state = (StreamState *) funcctx->user_fctx;

	/*
	 * The executor has sent the previous row to the client by now, into the connection's output
	 * buffer, which PostgreSQL flushes only when the query ends: send it before waiting for the
	 * next piece, so that each row leaves as it is made.  Only a client of this backend's own
	 * connection is concerned; a row going elsewhere (a function's loop, a tuplestore) is not
	 * in that buffer.
	 */
	if (whereToSendOutput == DestRemote)
		pq_flush();

	for (;;)
	{
		bool		more;

		old = MemoryContextSwitchTo(funcctx->multi_call_memory_ctx);
		more = CaiGenerationNext(state->gen, &piece, &len);
		MemoryContextSwitchTo(old);

		if (!more)
			break;
		if (len > 0)
			SRF_RETURN_NEXT(funcctx, PointerGetDatum(text_from_utf8(piece, len)));
	}

	/* the pieces are out already, but a cut JSON reply is not stored */
	refuse_cut_json(state->gen, &state->options);
	store_exchange(state->conversation_id, state->message, state->gen);
	UnregisterExprContextCallback(state->econtext, stream_shutdown, PointerGetDatum(state));
	SRF_RETURN_DONE(funcctx);
}

/*
 * start_completion
 *		Posts a COMPLETE request for the prompt argument (argument 0) with options (argument
 *		optarg), constrained to schema when one is given; *effective gets the options.  With
 *		n_samples 0 it asks for one completion (an "n" option above 1 is refused), else for
 *		n_samples, whatever the options say.
 */
static CaiGeneration *
start_completion(FunctionCallInfo fcinfo, int optarg, const CaiSchemaArg *schema,
				 int n_samples, CaiOptions *effective)
{
	char	   *prompt;
	int			len;
	CaiOptions	options;
	cai_wbuf	payload;

	(void) CaiSharedStateOrError();
	require_argument(fcinfo, 0, "prompt");
	prompt = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (prompt[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("prompt must not be empty")));

	CaiOptionsInit(&options);
	if (!PG_ARGISNULL(optarg))
		CaiOptionsApply(&options, PG_GETARG_JSONB_P(optarg));
	apply_schema(&options, schema);
	if (n_samples > 0)
		options.n_samples = n_samples;
	else if (options.n_samples > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"n\" must be 1 here (got %d)", options.n_samples),
				 errdetail("This function returns one completion."),
				 errhint("Use cai_complete_n(prompt, n, options) for n completions.")));
	*effective = options;

	len = strlen(prompt);
	prompt = to_utf8(prompt, &len);

	CaiWireInit(&payload);
	CaiOptionsWriteGeneration(&payload, &options, cache_salt(0), 0);
	cai_put_text(&payload, prompt, len);

	return CaiGenerationStartFor(CAI_REQUEST_COMPLETE, &payload, options.model,
								 options.n_samples);
}

/*
 * cai_complete(prompt text, options jsonb) -> text
 *		Continues raw text, without a chat template or a conversation.
 */
Datum
pg_cai_complete(PG_FUNCTION_ARGS)
{
	CaiOptions	effective;
	CaiGeneration *gen = start_completion(fcinfo, 1, NULL, 0, &effective);

	CaiGenerationFinish(gen);
	refuse_cut_json(gen, &effective);
	PG_RETURN_TEXT_P(text_from_utf8(gen->text.data, gen->text.len));
}

/*
 * cai_complete_n(prompt text, n integer, options jsonb) -> text[]
 *		n continuations of raw text drawn side by side from one prefill of the prompt; element
 *		i is the one cai_complete gives with seed + i (element 1 with the seed itself).
 */
Datum
pg_cai_complete_n(PG_FUNCTION_ARGS)
{
	CaiOptions	effective;
	CaiGeneration *gen;
	Datum	   *elems;
	int			n;

	require_argument(fcinfo, 1, "n");
	n = PG_GETARG_INT32(1);
	if (n < 1 || n > CAI_N_SAMPLES_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"n\" must be between 1 and %d", CAI_N_SAMPLES_MAX),
				 errdetail("Got %d.", n)));
	gen = start_completion(fcinfo, 2, NULL, n, &effective);
	CaiGenerationFinish(gen);
	elems = palloc(sizeof(Datum) * n);
	for (int i = 0; i < n; i++)
	{
		const CaiGeneration *sample = n > 1 ? &gen->samples[i] : gen;

		refuse_cut_json(sample, &effective);
		elems[i] = PointerGetDatum(text_from_utf8(sample->text.data, sample->text.len));
	}
	PG_RETURN_ARRAYTYPE_P(construct_array(elems, n, TEXTOID, -1, false, TYPALIGN_INT));
}

/*
 * cai_complete_json(prompt text, schema jsonb, options jsonb) -> jsonb
 *		Continues raw text with a JSON value valid against schema, returned as jsonb.
 */
Datum
pg_cai_complete_json(PG_FUNCTION_ARGS)
{
	CaiSchemaArg schema = schema_argument(fcinfo, 1, false);
	CaiOptions	effective;
	CaiGeneration *gen = start_completion(fcinfo, 2, &schema, 0, &effective);

	CaiGenerationFinish(gen);
	PG_RETURN_DATUM(reply_as_jsonb(gen));
}

/*
 * cai_complete_json(prompt text, schema text | json, options jsonb) -> jsonb
 *		The same with the schema as JSON text, its properties generated in the text's order.
 */
Datum
pg_cai_complete_json_text(PG_FUNCTION_ARGS)
{
	CaiSchemaArg schema = schema_argument(fcinfo, 1, true);
	CaiOptions	effective;
	CaiGeneration *gen = start_completion(fcinfo, 2, &schema, 0, &effective);

	CaiGenerationFinish(gen);
	PG_RETURN_DATUM(reply_as_jsonb(gen));
}

static void
bad_messages(const char *detail_fmt, int index)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("messages must be a JSON array of objects with \"role\" and \"content\""),
			 errdetail_internal(detail_fmt, index),
			 errhint("Example: '[{\"role\": \"user\", \"content\": \"Hello\"}]'.")));
}

/* The value of key in a jsonb object container, or NULL when the key is absent. */
static JsonbValue *
object_field(JsonbContainer *object, const char *key)
{
	return getKeyJsonValueFromContainer(object, key, strlen(key), NULL);
}

/*
 * append_token_entry
 *		One {token, logprob, bytes} of OpenAI's logprobs.  A token can stand for part of a
 *		character; its text then shows the bytes as \xNN (OpenAI's way), while bytes holds them
 *		exactly, so that consecutive entries' bytes concatenate to the reply.
 */
static void
append_token_entry(StringInfo out, const char *bytes, int len, float logprob)
{
	StringInfoData text;

	initStringInfo(&text);
	if (pg_verifymbstr(bytes, len, true) && GetDatabaseEncoding() == PG_UTF8)
		appendBinaryStringInfo(&text, bytes, len);
	else
		for (int i = 0; i < len; i++)
		{
			if ((unsigned char) bytes[i] < 0x80 && bytes[i] != '\0')
				appendStringInfoChar(&text, bytes[i]);
			else
				appendStringInfo(&text, "\\x%02x", (unsigned char) bytes[i]);
		}
	appendStringInfoString(out, "{\"token\": ");
	escape_json(out, text.data);
	/* %.9g keeps a float's every bit; a -inf cannot be JSON and is never listed */
	appendStringInfo(out, ", \"logprob\": %.9g, \"bytes\": [", (double) logprob);
	for (int i = 0; i < len; i++)
		appendStringInfo(out, "%s%d", i ? ", " : "", (unsigned char) bytes[i]);
	appendStringInfoChar(out, ']');
	pfree(text.data);
}

/*
 * append_logprobs
 *		choices[0].logprobs: null unless asked for, else {"content": [one entry per generated
 *		token, with its top_logprobs]}.
 */
static void
append_logprobs(StringInfo out, const CaiGeneration *gen, const CaiOptions *options)
{
	if (!options->logprobs)
	{
		appendStringInfoString(out, "null");
		return;
	}
	appendStringInfoString(out, "{\"content\": [");
	for (int i = 0, listed = 0; i < gen->n_ids && gen->logprobs != NULL; i++)
	{
		const CaiTokenLogprobs *t = &gen->logprobs[i];

		if (t->lp.n_top < 0)
			continue;
		if (listed++ > 0)
			appendStringInfoString(out, ", ");
		append_token_entry(out, t->bytes[0], t->bytes_len[0], t->lp.logprob);
		appendStringInfoString(out, ", \"top_logprobs\": [");
		for (int j = 0; j < t->lp.n_top; j++)
		{
			if (j > 0)
				appendStringInfoString(out, ", ");
			append_token_entry(out, t->bytes[1 + j], t->bytes_len[1 + j], t->lp.top_logprob[j]);
			appendStringInfoChar(out, '}');
		}
		appendStringInfoString(out, "]}");
	}
	appendStringInfoString(out, "]}");
}

/*
 * cai_chat_completion(messages jsonb, options jsonb) -> jsonb
 *		An OpenAI-style chat completion: messages in, a chat.completion object out.  Stores
 *		nothing.
 */
Datum
pg_cai_chat_completion(PG_FUNCTION_ARGS)
{
	Jsonb	   *messages;
	CaiOptions	options;
	cai_wbuf	payload;
	cai_wbuf	turns;
	StringInfoData out;
	CaiGeneration *gen;
	CaiToolOptions tools;
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	elem;
	int			n_messages = 0;
	char		model_name[128];
	const char *model;
	int			slot;
	uint8		random_bytes[12];
	char		id[64];
	int			i;

	(void) CaiSharedStateOrError();
	require_argument(fcinfo, 0, "messages");
	messages = PG_GETARG_JSONB_P(0);
	if (!JB_ROOT_IS_ARRAY(messages) || JB_ROOT_IS_SCALAR(messages))
		bad_messages("The value is not an array.", 0);

	CaiOptionsInit(&options);
	/* tools and tool_choice are this function's own options */
	if (!PG_ARGISNULL(1))
		CaiOptionsApply(&options, CaiToolOptionsTake(PG_GETARG_JSONB_P(1), &tools));
	else
		(void) CaiToolOptionsTake(NULL, &tools);

	CaiWireInit(&turns);
	it = JsonbIteratorInit(&messages->root);
	while ((tok = JsonbIteratorNext(&it, &elem, true)) != WJB_DONE)
	{
		JsonbValue *role;
		char	   *content;
		char	   *role_text;
		int			role_id;

		if (tok != WJB_ELEM)
			continue;
		n_messages++;
		if (n_messages > cai_max_request_messages)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("messages has more than pg_cai.max_request_messages (%d) elements",
							cai_max_request_messages),
					 errhint("Send only the newest messages: the model sees at most a context of tokens. A superuser can raise pg_cai.max_request_messages.")));
		if (elem.type != jbvBinary || !JsonContainerIsObject(elem.val.binary.data))
			bad_messages("Element %d is not an object.", n_messages);
		role = object_field(elem.val.binary.data, "role");
		if (role == NULL || role->type != jbvString)
			bad_messages("Element %d has no string \"role\".", n_messages);

		role_text = pnstrdup(role->val.string.val, role->val.string.len);
		/* tool results, and assistant content that may be null beside tool calls */
		role_id = CaiToolMessage(elem.val.binary.data, n_messages, role_text, &content, &tools);
		if (strcmp(role_text, "system") == 0)
			role_id = CAI_ROLE_SYSTEM;
		else if (strcmp(role_text, "user") == 0)
			role_id = CAI_ROLE_USER;
		else if (role_id < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("unrecognized role \"%s\" in message %d", role_text, n_messages),
					 errhint("Valid roles are system, user, assistant and tool.")));
		if (content == NULL)
			bad_messages("Element %d has no string \"content\".", n_messages);

		put_turn(&turns, role_id, content, NULL, -1);
		CaiCheckRequestSize(turns.len);
	}
	if (n_messages == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("messages must not be empty")));

	CaiWireInit(&payload);
	CaiOptionsWriteGeneration(&payload, &options, cache_salt(0), 0);
	cai_put_i32(&payload, n_messages);
	cai_put_bytes(&payload, turns.data, turns.len);
	CaiToolWriteBlock(&payload, &tools);

	gen = CaiGenerationStartFor(CAI_REQUEST_CHAT, &payload, options.model, options.n_samples);
	CaiGenerationFinish(gen);

	model_name[0] = '\0';
	model = CaiModelResolve(options.model);
	LWLockAcquire(cai_shared->lock, LW_SHARED);
	slot = CaiSharedModelIndex(model);
	if (slot >= 0)
		strlcpy(model_name, cai_shared->models[slot].model.info.name, sizeof(model_name));
	LWLockRelease(cai_shared->lock);

	if (!pg_strong_random(random_bytes, sizeof(random_bytes)))
		memset(random_bytes, 0, sizeof(random_bytes));
	strcpy(id, "chatcmpl-");
	for (i = 0; i < (int) sizeof(random_bytes); i++)
		sprintf(id + strlen(id), "%02x", random_bytes[i]);

	initStringInfo(&out);
	appendStringInfoString(&out, "{\"id\": ");
	escape_json(&out, id);
	appendStringInfoString(&out, ", \"object\": \"chat.completion\", \"created\": ");
	appendStringInfo(&out, INT64_FORMAT,
					 (int64) timestamptz_to_time_t(GetCurrentTimestamp()));
	appendStringInfoString(&out, ", \"model\": ");
	escape_json(&out, model_name);
	appendStringInfoString(&out, ", \"choices\": [");
	for (i = 0; i < options.n_samples; i++)
	{
		const CaiGeneration *sample = gen->samples ? &gen->samples[i] : gen;

		appendStringInfo(&out, "%s{\"index\": %d, ", i > 0 ? ", " : "", i);
		CaiToolAppendChoice(&out, reply_text(sample), sample->final.finish == CAI_FINISH_LENGTH,
							&tools, options.allow_partial);
		appendStringInfoString(&out, ", \"logprobs\": ");
		append_logprobs(&out, sample, &options);
		appendStringInfoChar(&out, '}');
	}
	appendStringInfoString(&out, "], ");
	appendStringInfo(&out,
					 "\"usage\": {\"prompt_tokens\": %d, \"completion_tokens\": %d, \"total_tokens\": %d, "
					 "\"prompt_tokens_details\": {\"cached_tokens\": %d}}}",
					 gen->final.prompt_tokens, gen->final.completion_tokens,
					 gen->final.prompt_tokens + gen->final.completion_tokens,
					 gen->final.cached_tokens);

	PG_RETURN_DATUM(DirectFunctionCall1(jsonb_in, CStringGetDatum(out.data)));
}
