/*
 * reply_trigger.c — the triggers that answer user turns inserted into cai.messages:
 *
 *   cai_reply_trigger()          answers the turn at once, in the inserting transaction, through
 *                                the same code as cai_chat (chat.c).
 *   cai_enqueue_reply_trigger()  queues a row in cai.jobs in the inserting transaction, so a
 *                                rolled-back insert leaves no job, and wakes the database's job
 *                                runners (jobs_runner.c) at commit.
 *
 * A user turn gets exactly one reply: cai_chat inserts its user row with
 * cai_replying_in_function set and both triggers leave such rows alone; and each trigger refuses
 * to work while the other (or a second copy of itself) is attached to the same table.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_language.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/syscache.h"

#include "chat.h"
#include "conversation.h"
#include "jobs_shmem.h"
#include "options.h"
#include "shmem.h"
#include "spi_plan.h"

PG_FUNCTION_INFO_V1(pg_cai_reply_trigger);
PG_FUNCTION_INFO_V1(pg_cai_enqueue_reply_trigger);

/* The user turn a reply trigger saw inserted into cai.messages */
typedef struct CaiTriggeredTurn
{
	int64		message_id;
	int64		conversation_id;
	Jsonb	   *options;		/* the trigger's argument, validated; '{}' when absent */
} CaiTriggeredTurn;

static SPIPlanPtr later_turn_plan = NULL;
static SPIPlanPtr enqueue_plan = NULL;

/*
 * reply_trigger_kind
 *		The SQL name of the pg_cai reply trigger function a trigger calls, or NULL when it calls
 *		something else.  Looks the function up in the syscache.
 */
static const char *
reply_trigger_kind(Oid funcoid)
{
	HeapTuple	tuple;
	const char *kind = NULL;

	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(funcoid));
	if (!HeapTupleIsValid(tuple))
		return NULL;
	if (((Form_pg_proc) GETSTRUCT(tuple))->prolang == ClanguageId)
	{
		bool		isnull;
		Datum		src = SysCacheGetAttr(PROCOID, tuple, Anum_pg_proc_prosrc, &isnull);

		if (!isnull)
		{
			char	   *symbol = TextDatumGetCString(src);

			if (strcmp(symbol, "pg_cai_reply_trigger") == 0)
				kind = "cai_reply_trigger";
			else if (strcmp(symbol, "pg_cai_enqueue_reply_trigger") == 0)
				kind = "cai_enqueue_reply_trigger";
			pfree(symbol);
		}
	}
	ReleaseSysCache(tuple);
	return kind;
}

/*
 * check_one_reply_trigger
 *		Raises an error when the table has another enabled row-level INSERT trigger that answers
 *		user turns (cai_reply_trigger or cai_enqueue_reply_trigger): each would answer the turn,
 *		and a user turn gets exactly one reply.  Called by both triggers before they do anything.
 */
static void
check_one_reply_trigger(TriggerData *trigdata)
{
	TriggerDesc *desc = trigdata->tg_relation->trigdesc;
	Trigger    *mine = trigdata->tg_trigger;
	int			i;

	if (desc == NULL)
		return;
	for (i = 0; i < desc->numtriggers; i++)
	{
		Trigger    *other = &desc->triggers[i];
		const char *other_kind;

		if (other->tgoid == mine->tgoid || other->tgenabled == TRIGGER_DISABLED ||
			!TRIGGER_FOR_ROW(other->tgtype) || !TRIGGER_FOR_INSERT(other->tgtype))
			continue;
		other_kind = reply_trigger_kind(other->tgfoid);
		if (other_kind != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
					 errmsg("table \"%s\" has more than one pg_cai reply trigger",
							RelationGetRelationName(trigdata->tg_relation)),
					 errdetail("Triggers \"%s\" (%s) and \"%s\" (%s) would each answer the user turn.",
							   mine->tgname, reply_trigger_kind(mine->tgfoid),
							   other->tgname, other_kind),
					 errhint("Drop or disable one of them: a user turn gets exactly one reply.")));
	}
}

/* A column of the trigger's row by name; errors when the table lacks it. */
static Datum
trigger_column(TriggerData *trigdata, const char *trigger_name, const char *name, bool *isnull)
{
	TupleDesc	desc = RelationGetDescr(trigdata->tg_relation);
	int			attno = SPI_fnumber(desc, name);

	if (attno <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("%s must be attached to cai.messages", trigger_name),
				 errdetail("Table \"%s\" has no column \"%s\".",
						   RelationGetRelationName(trigdata->tg_relation), name)));
	return heap_getattr(trigdata->tg_trigtuple, attno, desc, isnull);
}

/*
 * read_triggered_turn
 *		The shared prologue of the reply triggers (cai_reply_trigger, cai_enqueue_reply_trigger):
 *		checks that fcinfo is an AFTER INSERT FOR EACH ROW trigger on cai.messages (trigger_name
 *		names it in errors) and reads the inserted row.  Returns false for a row not to answer:
 *		not a user turn, or one that cai_chat inserted and answers itself.  An empty message is
 *		an error; the trigger's optional argument is validated as options ('{}' when absent).
 */
static bool
read_triggered_turn(FunctionCallInfo fcinfo, const char *trigger_name, CaiTriggeredTurn *turn)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	Datum		d;
	bool		isnull;
	char	   *content;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("%s must be called as a trigger", trigger_name)));
	if (!TRIGGER_FIRED_AFTER(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("%s must be fired AFTER INSERT FOR EACH ROW", trigger_name)));
	rel = trigdata->tg_relation;
	if (RelationGetNamespace(rel) != get_namespace_oid("cai", true) ||
		strcmp(RelationGetRelationName(rel), "messages") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("%s must be attached to cai.messages", trigger_name)));
	(void) CaiSharedStateOrError();

	d = trigger_column(trigdata, trigger_name, "role", &isnull);
	if (isnull || strcmp(TextDatumGetCString(d), "user") != 0 || cai_replying_in_function)
		return false;
	check_one_reply_trigger(trigdata);

	d = trigger_column(trigdata, trigger_name, "content", &isnull);
	content = isnull ? "" : TextDatumGetCString(d);
	if (content[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("message must not be empty")));
	turn->message_id = DatumGetInt64(trigger_column(trigdata, trigger_name, "id", &isnull));
	turn->conversation_id = DatumGetInt64(trigger_column(trigdata, trigger_name,
														 "conversation_id", &isnull));
	turn->options = DatumGetJsonbP(DirectFunctionCall1(jsonb_in,
													   CStringGetDatum(trigdata->tg_trigger->tgnargs > 0
																	   ? trigdata->tg_trigger->tgargs[0]
																	   : "{}")));
	CaiOptionsValidate(turn->options);
	return true;
}

/*
 * cai_reply_trigger() -> trigger
 *		AFTER INSERT FOR EACH ROW on cai.messages: answers each inserted user turn
 *		synchronously, in the inserting transaction, and stores the reply.  An optional trigger
 *		argument holds options as JSON text.  Rows that cai_chat inserts are left alone: it
 *		answers them itself.
 */
Datum
pg_cai_reply_trigger(PG_FUNCTION_ARGS)
{
	CaiTriggeredTurn turn;

	if (!read_triggered_turn(fcinfo, "cai_reply_trigger", &turn))
		return PointerGetDatum(NULL);
	(void) CaiReplyToMessage(turn.conversation_id, turn.message_id, turn.options);

	return PointerGetDatum(NULL);
}

/*
 * cai_enqueue_reply_trigger() -> trigger
 *		AFTER INSERT FOR EACH ROW on cai.messages: queues a reply job for each inserted user turn
 *		that is the newest turn of its conversation when its statement ends (so that importing a
 *		history of user and assistant turns queues nothing for the answered ones).  The job is
 *		part of the inserting transaction; the job runners answer it after commit.  An optional
 *		trigger argument holds options as JSON text, validated here.  Rows that cai_chat inserts
 *		are left alone: it answers them itself.
 */
Datum
pg_cai_enqueue_reply_trigger(PG_FUNCTION_ARGS)
{
	CaiTriggeredTurn turn;
	bool		isnull;
	int64		message_id;
	int64		conversation_id;
	Jsonb	   *options;
	Oid			later_types[2] = {INT8OID, INT8OID};
	Oid			enqueue_types[3] = {INT8OID, INT8OID, JSONBOID};
	Datum		values[3];
	bool		later;
	int			ret;

	if (!read_triggered_turn(fcinfo, "cai_enqueue_reply_trigger", &turn))
		return PointerGetDatum(NULL);
	message_id = turn.message_id;
	conversation_id = turn.conversation_id;
	options = turn.options;

	SPI_connect();

	values[0] = Int64GetDatum(conversation_id);
	values[1] = Int64GetDatum(message_id);
	ret = SPI_execute_plan(CaiKeepPlan(&later_turn_plan,
									 "SELECT EXISTS (SELECT FROM cai.messages "
									 "WHERE conversation_id = $1 AND id > $2)",
									 2, later_types),
						   values, NULL, false, 1);
	if (ret != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read later turns: %s", SPI_result_code_string(ret));
	later = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));

	if (!later)
	{
		values[0] = Int64GetDatum(message_id);
		values[1] = Int64GetDatum(conversation_id);
		values[2] = JsonbPGetDatum(options);
		ret = SPI_execute_plan(CaiKeepPlan(&enqueue_plan,
										 "INSERT INTO cai.jobs (message_id, conversation_id, options) "
										 "VALUES ($1, $2, $3) ON CONFLICT (message_id) DO NOTHING",
										 3, enqueue_types),
							   values, NULL, false, 0);
		if (ret != SPI_OK_INSERT)
			elog(ERROR, "could not queue a reply job: %s", SPI_result_code_string(ret));
	}

	SPI_finish();

	if (!later)
		CaiJobsWakeAtCommit("reply");
	return PointerGetDatum(NULL);
}
