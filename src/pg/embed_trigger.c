/*
 * embed_trigger.c — cai_embed_trigger(text_column, embedding_column [, key_column [, model]]):
 * keeps an embedding column in step with a text column.  key_column identifies the row (absent or
 * empty: the single-column primary key); model is a name of pg_cai.models (absent or empty: the
 * first), kept in the job's options.
 *
 * AFTER INSERT OR UPDATE FOR EACH ROW: when a row's text is new, or differs from the old row's,
 * the trigger queues an 'embed' job in cai.jobs in the writing transaction (a rolled-back write
 * queues nothing) and wakes the database's job runners at commit.  The job names the row by its
 * key, not its text: the runner (jobs_embed.c) embeds the text the row holds when the job runs,
 * so a job can never store the embedding of a text that was overwritten in the meantime, and the
 * last job of a row always runs after its last change committed.  Writing only the embedding
 * column does not queue anything (the trigger compares the texts), so the runner's own update
 * never loops, whatever the trigger's UPDATE OF list.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/relation.h"
#include "catalog/index.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/syscache.h"

#include "jobs_shmem.h"
#include "spi_plan.h"

PG_FUNCTION_INFO_V1(pg_cai_embed_trigger);

static SPIPlanPtr enqueue_embed_plan = NULL;

/* The attribute number of a trigger argument's column, or an error naming it. */
static AttrNumber
argument_column(Relation rel, const char *what, const char *name)
{
	AttrNumber	attnum = SPI_fnumber(RelationGetDescr(rel), name);

	if (attnum <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("cai_embed_trigger: %s column \"%s\" does not exist in table \"%s\"",
						what, name, RelationGetRelationName(rel))));
	return attnum;
}

/* The table's single-column primary key, or an error saying to name a key column. */
static AttrNumber
primary_key_column(Relation rel)
{
	Oid			index_oid;
	Relation	index;
	AttrNumber	attnum = InvalidAttrNumber;

	/* the index list sets rd_pkindex (RelationGetPrimaryKeyIndex's arguments vary by version) */
	list_free(RelationGetIndexList(rel));
	index_oid = rel->rd_pkindex;
	if (OidIsValid(index_oid))
	{
		index = relation_open(index_oid, AccessShareLock);
		if (index->rd_index->indnkeyatts == 1)
			attnum = index->rd_index->indkey.values[0];
		relation_close(index, AccessShareLock);
	}
	if (attnum <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
				 errmsg("cai_embed_trigger: table \"%s\" has no single-column primary key",
						RelationGetRelationName(rel)),
				 errhint("Name the column that identifies a row as the trigger's third argument.")));
	return attnum;
}

/* Whether a type is pgvector's vector (in whichever schema pgvector was installed). */
static bool
is_vector_type(Oid type)
{
	HeapTuple	tuple = SearchSysCache1(TYPEOID, ObjectIdGetDatum(type));
	bool		is_vector = false;

	if (HeapTupleIsValid(tuple))
	{
		is_vector = strcmp(NameStr(((Form_pg_type) GETSTRUCT(tuple))->typname), "vector") == 0;
		ReleaseSysCache(tuple);
	}
	return is_vector;
}

/* Whether the column's value is the same in both rows (both NULL counts as the same). */
static bool
column_unchanged(HeapTuple old_row, HeapTuple new_row, TupleDesc desc, AttrNumber attnum)
{
	Form_pg_attribute att = TupleDescAttr(desc, attnum - 1);
	bool		old_null;
	bool		new_null;
	Datum		old_value = heap_getattr(old_row, attnum, desc, &old_null);
	Datum		new_value = heap_getattr(new_row, attnum, desc, &new_null);

	if (old_null || new_null)
		return old_null && new_null;
	return datumIsEqual(old_value, new_value, att->attbyval, att->attlen);
}

/*
 * cai_embed_trigger(text_column, embedding_column [, key_column [, model]]) -> trigger
 *		Queues an embedding job for each inserted row and each updated row whose text changed.
 */
Datum
pg_cai_embed_trigger(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Trigger    *trigger;
	Relation	rel;
	TupleDesc	desc;
	HeapTuple	row;
	AttrNumber	text_att;
	AttrNumber	key_att;
	AttrNumber	embedding_att;
	Oid			embedding_type;
	bool		key_null;
	Datum		key;
	Oid			key_type;
	Oid			key_out;
	bool		key_varlena;
	Oid			types[6] = {OIDOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID};
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	int			ret;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("cai_embed_trigger: not called by the trigger manager")));
	if (!TRIGGER_FIRED_AFTER(trigdata->tg_event) || !TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!(TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) || TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event)))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("cai_embed_trigger must be an AFTER INSERT OR UPDATE FOR EACH ROW trigger")));
	trigger = trigdata->tg_trigger;
	if (trigger->tgnargs < 2 || trigger->tgnargs > 4)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cai_embed_trigger takes the text column, the embedding column and optionally the key column and the model"),
				 errhint("EXECUTE FUNCTION cai_embed_trigger('body', 'embedding')")));

	rel = trigdata->tg_relation;
	desc = RelationGetDescr(rel);
	text_att = argument_column(rel, "text", trigger->tgargs[0]);
	embedding_att = argument_column(rel, "embedding", trigger->tgargs[1]);
	embedding_type = TupleDescAttr(desc, embedding_att - 1)->atttypid;
	if (embedding_type != FLOAT4ARRAYOID && !is_vector_type(embedding_type))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("cai_embed_trigger: embedding column \"%s\" is of type %s, not real[] or vector",
						trigger->tgargs[1], format_type_be(embedding_type))));
	key_att = trigger->tgnargs >= 3 && trigger->tgargs[2][0] != '\0' ?
		argument_column(rel, "key", trigger->tgargs[2]) : primary_key_column(rel);

	row = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ? trigdata->tg_newtuple :
		trigdata->tg_trigtuple;
	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) &&
		column_unchanged(trigdata->tg_trigtuple, row, desc, text_att))
		return PointerGetDatum(NULL);

	key = heap_getattr(row, key_att, desc, &key_null);
	if (key_null)
		ereport(ERROR,
				(errcode(ERRCODE_NOT_NULL_VIOLATION),
				 errmsg("cai_embed_trigger: the key column \"%s\" of a row is null",
						NameStr(TupleDescAttr(desc, key_att - 1)->attname)),
				 errdetail("An embedding job finds its row by the key.")));
	key_type = TupleDescAttr(desc, key_att - 1)->atttypid;
	getTypeOutputInfo(key_type, &key_out, &key_varlena);

	values[0] = ObjectIdGetDatum(RelationGetRelid(rel));
	values[1] = CStringGetTextDatum(NameStr(TupleDescAttr(desc, key_att - 1)->attname));
	values[2] = CStringGetTextDatum(OidOutputFunctionCall(key_out, key));
	values[3] = CStringGetTextDatum(trigger->tgargs[0]);
	values[4] = CStringGetTextDatum(trigger->tgargs[1]);
	if (trigger->tgnargs == 4 && trigger->tgargs[3][0] != '\0')
		values[5] = CStringGetTextDatum(trigger->tgargs[3]);
	else
		nulls[5] = 'n';

	SPI_connect();
	ret = SPI_execute_plan(CaiKeepPlan(&enqueue_embed_plan,
									 "INSERT INTO cai.jobs (kind, owner, target_table, key_column, row_key, "
									 "text_column, embedding_column, options) "
									 "VALUES ('embed', current_user, $1, $2, $3, $4, $5, "
									 "CASE WHEN $6 IS NULL THEN '{}'::jsonb "
									 "ELSE jsonb_build_object('model', $6) END)",
									 6, types),
						   values, nulls, false, 0);
	if (ret != SPI_OK_INSERT)
		elog(ERROR, "could not queue an embedding job: %s", SPI_result_code_string(ret));
	SPI_finish();

	CaiJobsWakeAtCommit("embedding");
	return PointerGetDatum(NULL);
}
