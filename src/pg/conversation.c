/*
 * conversation.c — reads and writes conversations and their turns with SPI, as the caller.
 *
 * Plans are prepared once per backend and kept (spi_plan.c).  The plan cache replans them
 * when the calling role changes, so row-level security is applied for whoever calls.  Results
 * are copied into the caller's memory context before SPI_finish.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"

#include "conversation.h"
#include "guc.h"
#include "options.h"
#include "protocol.h"
#include "spi_plan.h"

PG_FUNCTION_INFO_V1(pg_cai_validate_options);
PG_FUNCTION_INFO_V1(pg_cai_check_options);

bool		cai_replying_in_function = false;

static SPIPlanPtr create_plan = NULL;
static SPIPlanPtr lock_plan = NULL;
static SPIPlanPtr visible_plan = NULL;
static SPIPlanPtr count_plan = NULL;
static SPIPlanPtr turns_plan = NULL;
static SPIPlanPtr insert_plan = NULL;
static SPIPlanPtr set_tokens_plan = NULL;
static SPIPlanPtr set_model_plan = NULL;

/* An int4[] datum built from ids (n >= 0). */
static Datum
ids_to_array(const int32 *ids, int n)
{
	Datum	   *elems = palloc(sizeof(Datum) * Max(n, 1));
	int			i;

	for (i = 0; i < n; i++)
		elems[i] = Int32GetDatum(ids[i]);
	return PointerGetDatum(construct_array(elems, n, INT4OID, sizeof(int32), true,
										   TYPALIGN_INT));
}

/*
 * CaiConversationCreate
 *		Inserts a conversation owned by the current user and returns its id.
 */
int64
CaiConversationCreate(const char *system_prompt, Jsonb *options)
{
	Oid			argtypes[2] = {TEXTOID, JSONBOID};
	Datum		values[2];
	char		nulls[2] = {' ', ' '};
	SPIPlanPtr	plan;
	bool		isnull;
	int64		id;
	int			ret;

	SPI_connect();
	plan = CaiKeepPlan(&create_plan,
					 "INSERT INTO cai.conversations (system_prompt, options) "
					 "VALUES ($1, $2) RETURNING id",
					 2, argtypes);
	if (system_prompt != NULL)
		values[0] = CStringGetTextDatum(system_prompt);
	else
	{
		values[0] = (Datum) 0;
		nulls[0] = 'n';
	}
	values[1] = JsonbPGetDatum(options);

	ret = SPI_execute_plan(plan, values, nulls, false, 1);
	if (ret != SPI_OK_INSERT_RETURNING || SPI_processed != 1)
		elog(ERROR, "could not insert conversation: %s", SPI_result_code_string(ret));
	id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	return id;
}

static int
role_from_text(const char *role)
{
	if (strcmp(role, "system") == 0)
		return CAI_ROLE_SYSTEM;
	if (strcmp(role, "assistant") == 0)
		return CAI_ROLE_ASSISTANT;
	return CAI_ROLE_USER;
}

/*
 * history_window
 *		How many of a conversation's n_turns newest stored turns a request carries: all of them
 *		up to max_turns, else between max_turns / 2 and max_turns.  The engine derives where it
 *		truncates from the history it is given (chat_prompt.c), so a window sliding by one
 *		exchange each turn would move that cut every turn and cost the prefix cache its hits;
 *		this one starts at a multiple of max_turns / 2 turns and stays put while that many turns
 *		are added.  The engine could never keep more than a context of tokens anyway, and older
 *		turns cost every call their reading, sending and tokenizing.
 */
static int64
history_window(int64 n_turns, int max_turns)
{
	int64		step = Max(max_turns / 2, 1);
	int64		skip;

	if (n_turns <= max_turns)
		return n_turns;
	skip = ((n_turns - max_turns + step - 1) / step) * step;
	return n_turns - skip;
}

/*
 * Runs plan, a query of conversation id's row, into SPI_tuptable; a conversation the caller
 * cannot see (row-level security) is reported as not existing.
 */
static void
read_conversation_row(SPIPlanPtr plan, int64 id, bool read_only)
{
	Datum		values[1] = {Int64GetDatum(id)};
	int			ret = SPI_execute_plan(plan, values, NULL, read_only, 1);

	if (ret != SPI_OK_SELECT)
		elog(ERROR, "could not read conversation: %s", SPI_result_code_string(ret));
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("conversation " INT64_FORMAT " does not exist", id),
				 errhint("Create one with cai_new_conversation(). A role sees only the conversations it owns.")));
}

/*
 * CaiConversationRequireVisible
 *		Raises CaiConversationLoad's "does not exist" error unless the caller sees conversation
 *		id (row-level security), reading it without a lock: for the functions that only need
 *		to know the caller may name it, which a hot standby serves too.
 */
void
CaiConversationRequireVisible(int64 id)
{
	Oid			types[1] = {INT8OID};
	SPIPlanPtr	plan;

	SPI_connect();
	plan = CaiKeepPlan(&visible_plan, "SELECT 1 FROM cai.conversations WHERE id = $1", 1, types);
	read_conversation_row(plan, id, true);
	SPI_finish();
}

/*
 * CaiConversationLoad
 *		Reads a conversation and its turns (those with id <= up_to_message when that is not 0;
 *		of those, only the newest pg_cai.max_request_messages allow, see history_window),
 *		locking the conversation row FOR NO KEY UPDATE so that concurrent turns of one
 *		conversation take their turn.  (Not FOR UPDATE: the trigger runs after its INSERT took
 *		FOR KEY SHARE through the foreign key, and two such inserts upgrading to FOR UPDATE would
 *		deadlock.)  A conversation the caller cannot see (row-level security) is reported
 *		as not existing.  The result is allocated in the current memory context.
 */
CaiConversation *
CaiConversationLoad(int64 id, int64 up_to_message)
{
	MemoryContext caller = CurrentMemoryContext;
	MemoryContext spi_context;
	CaiConversation *conv;
	Oid			lock_types[1] = {INT8OID};
	Oid			turn_types[3] = {INT8OID, INT8OID, INT8OID};
	Datum		values[3];
	int64		n_stored;
	int64		n_window;
	int			max_turns;
	SPIPlanPtr	plan;
	int			ret;
	uint64		i;
	bool		isnull;
	Datum		d;

	SPI_connect();
	spi_context = CurrentMemoryContext;

	/* the model column came with 0.2: read through to_jsonb so that 0.1's table reads too */
	plan = CaiKeepPlan(&lock_plan,
					 "SELECT system_prompt, options, to_jsonb(c) ->> 'model', to_jsonb(c) ? 'model' "
					 "FROM cai.conversations c WHERE id = $1 FOR NO KEY UPDATE",
					 1, lock_types);
	read_conversation_row(plan, id, false);

	MemoryContextSwitchTo(caller);
	conv = palloc0(sizeof(CaiConversation));
	conv->id = id;
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
		conv->system_prompt = TextDatumGetCString(d);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
	if (!isnull)
		conv->options = DatumGetJsonbPCopy(d);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull);
	if (!isnull)
		conv->model = TextDatumGetCString(d);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 4, &isnull);
	conv->has_model_column = !isnull && DatumGetBool(d);
	MemoryContextSwitchTo(spi_context);

	/* the request also carries the system prompt and the new turn */
	max_turns = Max(cai_max_request_messages - 2, 1);
	values[0] = Int64GetDatum(id);
	values[1] = Int64GetDatum(up_to_message > 0 ? up_to_message : PG_INT64_MAX);
	plan = CaiKeepPlan(&count_plan,
					 "SELECT count(*) FROM cai.messages WHERE conversation_id = $1 AND id <= $2",
					 2, turn_types);
	/* not read-only: a trigger's own INSERT of the turn to answer must be seen */
	ret = SPI_execute_plan(plan, values, NULL, false, 1);
	if (ret != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not count messages: %s", SPI_result_code_string(ret));
	n_stored = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
										   &isnull));
	n_window = history_window(n_stored, max_turns);

	plan = CaiKeepPlan(&turns_plan,
					 "SELECT role, content, tokens FROM "
					 "(SELECT id, role, content, tokens FROM cai.messages "
					 " WHERE conversation_id = $1 AND id <= $2 ORDER BY id DESC LIMIT $3) newest "
					 "ORDER BY id",
					 3, turn_types);
	values[2] = Int64GetDatum(n_window);
	ret = SPI_execute_plan(plan, values, NULL, false, 0);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "could not read messages: %s", SPI_result_code_string(ret));

	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		CaiTurn    *turn;
		char	   *role;

		role = TextDatumGetCString(SPI_getbinval(tuple, desc, 1, &isnull));
		/* a history cut short starts with a user turn, not a reply to what was left out */
		if (n_window < n_stored && conv->turns == NIL &&
			role_from_text(role) == CAI_ROLE_ASSISTANT)
			continue;
		MemoryContextSwitchTo(caller);
		turn = palloc0(sizeof(CaiTurn));
		turn->role = role_from_text(role);
		d = SPI_getbinval(tuple, desc, 2, &isnull);
		turn->content = isnull ? pstrdup("") : TextDatumGetCString(d);
		d = SPI_getbinval(tuple, desc, 3, &isnull);
		turn->tokens = NULL;
		turn->n_tokens = 0;
		if (!isnull)
		{
			ArrayType  *arr = DatumGetArrayTypeP(d);
			Datum	   *elems;
			bool	   *elem_nulls;
			int			n;
			int			j;
			bool		usable = true;

			deconstruct_array(arr, INT4OID, sizeof(int32), true, TYPALIGN_INT,
							  &elems, &elem_nulls, &n);
			for (j = 0; j < n; j++)
				if (elem_nulls[j])
					usable = false;

			/* ids with holes cannot be trusted: the text is tokenized afresh */
			if (usable)
			{
				turn->tokens = palloc(sizeof(int32) * Max(n, 1));
				for (j = 0; j < n; j++)
					turn->tokens[j] = DatumGetInt32(elems[j]);
				turn->n_tokens = n;
			}
		}
		conv->turns = lappend(conv->turns, turn);
		MemoryContextSwitchTo(spi_context);
	}

	SPI_finish();
	return conv;
}

/*
 * CaiConversationSetModel
 *		Records the model that answers the conversation (cai.conversations.model), which it
 *		keeps from then on.  The caller has locked the row (CaiConversationLoad).
 */
void
CaiConversationSetModel(int64 conversation_id, const char *model)
{
	Oid			argtypes[2] = {INT8OID, TEXTOID};
	Datum		values[2];
	int			ret;

	SPI_connect();
	values[0] = Int64GetDatum(conversation_id);
	values[1] = CStringGetTextDatum(model);
	ret = SPI_execute_plan(CaiKeepPlan(&set_model_plan,
									   "UPDATE cai.conversations SET model = $2 WHERE id = $1",
									   2, argtypes),
						   values, NULL, false, 0);
	if (ret != SPI_OK_UPDATE)
		elog(ERROR, "could not record the model of conversation " INT64_FORMAT ": %s",
			 conversation_id, SPI_result_code_string(ret));
	SPI_finish();
}

/*
 * CaiMessageInsert
 *		Inserts one turn and returns its id.  tokens may be NULL (stored as NULL), usage too.
 *		cai_replying_in_function must be set by the caller when inserting a user turn that it
 *		answers itself.
 */
int64
CaiMessageInsert(int64 conversation_id, const char *role, const char *content,
				 const int32 *tokens, int n_tokens, const CaiStoredUsage *usage)
{
	Oid			argtypes[8] = {INT8OID, TEXTOID, TEXTOID, INT4ARRAYOID, INT4OID, INT4OID, INT4OID,
	FLOAT8OID};
	Datum		values[8];
	char		nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	SPIPlanPtr	plan;
	bool		isnull;
	int64		id;
	int			ret;

	SPI_connect();
	plan = CaiKeepPlan(&insert_plan,
					 "INSERT INTO cai.messages (conversation_id, role, content, tokens, "
					 "prompt_tokens, completion_tokens, cached_tokens, ttft_ms) "
					 "VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
					 8, argtypes);
	values[0] = Int64GetDatum(conversation_id);
	values[1] = CStringGetTextDatum(role);
	values[2] = CStringGetTextDatum(content);
	if (tokens != NULL)
		values[3] = ids_to_array(tokens, n_tokens);
	else
		nulls[3] = 'n';
	if (usage != NULL)
	{
		values[4] = Int32GetDatum(usage->prompt_tokens);
		values[5] = Int32GetDatum(usage->completion_tokens);
		values[6] = Int32GetDatum(usage->cached_tokens);
		values[7] = Float8GetDatum(usage->ttft_ms);
	}
	else
		nulls[4] = nulls[5] = nulls[6] = nulls[7] = 'n';

	ret = SPI_execute_plan(plan, values, nulls, false, 1);
	if (ret != SPI_OK_INSERT_RETURNING || SPI_processed != 1)
		elog(ERROR, "could not insert message: %s", SPI_result_code_string(ret));
	id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	return id;
}

/*
 * CaiMessageSetTokens
 *		Stores the token ids of an existing turn (the trigger's user row).
 */
void
CaiMessageSetTokens(int64 message_id, const int32 *tokens, int n_tokens)
{
	Oid			argtypes[2] = {INT8OID, INT4ARRAYOID};
	Datum		values[2];
	SPIPlanPtr	plan;
	int			ret;

	SPI_connect();
	plan = CaiKeepPlan(&set_tokens_plan,
					 "UPDATE cai.messages SET tokens = $2 WHERE id = $1",
					 2, argtypes);
	values[0] = Int64GetDatum(message_id);
	values[1] = ids_to_array(tokens, n_tokens);
	ret = SPI_execute_plan(plan, values, NULL, false, 0);
	if (ret != SPI_OK_UPDATE)
		elog(ERROR, "could not update message: %s", SPI_result_code_string(ret));
	SPI_finish();
}

/*
 * cai_validate_options(options jsonb) -> boolean
 *		True when options are valid on their own, schema included (compiled by the engine's
 *		compiler in this backend); otherwise the error a call with them would raise.  The
 *		reply triggers' event trigger checks their argument with it at CREATE TRIGGER.
 */
Datum
pg_cai_validate_options(PG_FUNCTION_ARGS)
{
	if (PG_ARGISNULL(0))
		PG_RETURN_BOOL(true);
	CaiOptionsValidate(PG_GETARG_JSONB_P(0));
	PG_RETURN_BOOL(true);
}

/*
 * cai_check_options() -> trigger
 *		BEFORE INSERT OR UPDATE OF options FOR EACH ROW on cai.conversations and cai.jobs:
 *		validates the row's stored options as they are written, however they are written
 *		(cai_new_conversation, the enqueue trigger, or a direct INSERT/UPDATE), so that bad
 *		options fail once, here, rather than every later turn or job.
 */
Datum
pg_cai_check_options(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	HeapTuple	tuple;
	TupleDesc	desc;
	int			attno;
	Datum		options;
	bool		isnull;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		TRIGGER_FIRED_BY_DELETE(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("cai_check_options must be fired BEFORE INSERT OR UPDATE FOR EACH ROW")));
	tuple = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ? trigdata->tg_newtuple :
		trigdata->tg_trigtuple;
	desc = RelationGetDescr(trigdata->tg_relation);
	attno = SPI_fnumber(desc, "options");
	if (attno <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("cai_check_options must be attached to a table with an \"options\" column")));
	options = heap_getattr(tuple, attno, desc, &isnull);
	if (!isnull)
		CaiOptionsValidate(DatumGetJsonbP(options));
	return PointerGetDatum(tuple);
}
