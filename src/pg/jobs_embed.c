/*
 * jobs_embed.c — how a job runner (jobs_runner.c) carries out an 'embed' job of cai.jobs, queued
 * by cai_embed_trigger (embed_trigger.c): the embedding of a row's text column, stored in its
 * embedding column.
 *
 * The runner claims the job as any other; here, inside the transaction that records its outcome:
 *   1. the job is re-read under its row lock; when a newer job of the same row is pending or
 *      running, this one is done at once (superseded_by names the newer), since that one will
 *      embed the row's text as it is then.  The newest job of a row is never superseded, and it
 *      was queued by the row's last change, so it runs after that change committed;
 *   2. as the role that wrote the row (SetUserIdAndSecContext, as for replies; the runner's
 *      search path stays pinned to pg_catalog, and every name is qualified), one statement
 *          UPDATE schema.table SET embedding = pg_cai_schema.cai_embed(text::text, 'model')
 *          WHERE key = 'row key'
 *      embeds and stores the row's current text.  Under READ COMMITTED an UPDATE that meets a
 *      row changed since its snapshot re-evaluates the row's newest version, the SET list
 *      included, so the stored embedding is always of the text the row holds when it is written;
 *      a row deleted meanwhile is simply not found;
 *   3. the job is marked done.
 * Errors propagate to the runner, which retries transient ones and fails the rest.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "jobs_embed.h"
#include "spi_plan.h"

static SPIPlanPtr load_embed_job_plan = NULL;
static SPIPlanPtr embed_done_plan = NULL;

/*
 * Reads the claimed job: false when it is no longer the runner's.  Fills the owner's name and oid
 * (InvalidOid when the role is gone), whether the owner may run cai_embed, the UPDATE to run and
 * the id of a newer pending or running job of the same row (0 when none).
 */
static bool
load_embed_job(int64 job_id, int32 attempts, char **owner_name, Oid *owner, bool *may_use,
			   char **statement, int64 *newer)
{
	Oid			types[2] = {INT8OID, INT4OID};
	Datum		values[2] = {Int64GetDatum(job_id), Int32GetDatum(attempts)};
	MemoryContext outer = CurrentMemoryContext;
	HeapTuple	row;
	TupleDesc	desc;
	bool		isnull;
	int			ret;

	ret = SPI_execute_plan(CaiKeepPlan(&load_embed_job_plan,
									 "SELECT j.owner, r.oid, "
									 "  coalesce(pg_catalog.has_function_privilege(r.oid, f.oid, 'EXECUTE'), false), "
									 "  pg_catalog.format('UPDATE %I.%I SET %I = %I.cai_embed(%I::pg_catalog.text, %L) WHERE %I = %L', "
									 "    n.nspname, c.relname, j.embedding_column, fn.nspname, j.text_column, "
									 "    j.options->>'model', j.key_column, j.row_key), "
									 "  (SELECT max(o.id) FROM cai.jobs o WHERE o.kind = 'embed' AND o.status IN ('pending', 'running') "
									 "    AND o.target_table = j.target_table AND o.row_key = j.row_key "
									 "    AND o.embedding_column = j.embedding_column AND o.id > j.id) "
									 "FROM cai.jobs j "
									 "JOIN pg_catalog.pg_class c ON c.oid = j.target_table "
									 "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
									 "JOIN pg_catalog.pg_extension x ON x.extname = 'pg_cai' "
									 "JOIN pg_catalog.pg_namespace fn ON fn.oid = x.extnamespace "
									 "LEFT JOIN pg_catalog.pg_roles r ON r.rolname = j.owner "
									 "LEFT JOIN LATERAL (SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace = fn.oid "
									 "  AND p.proname = 'cai_embed' AND p.proargtypes[0] = 'pg_catalog.text'::pg_catalog.regtype "
									 "  LIMIT 1) f ON true "
									 "WHERE j.id = $1 AND j.kind = 'embed' AND j.status = 'running' AND j.attempts = $2 "
									 "FOR UPDATE OF j",
									 2, types),
						   values, NULL, false, 1);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "could not read job " INT64_FORMAT ": %s", job_id, SPI_result_code_string(ret));
	if (SPI_processed == 0)
		return false;

	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	*owner = DatumGetObjectId(SPI_getbinval(row, desc, 2, &isnull));
	if (isnull)
		*owner = InvalidOid;
	*may_use = DatumGetBool(SPI_getbinval(row, desc, 3, &isnull));
	*newer = DatumGetInt64(SPI_getbinval(row, desc, 5, &isnull));
	if (isnull)
		*newer = 0;
	MemoryContextSwitchTo(outer);
	*owner_name = pstrdup(SPI_getvalue(row, desc, 1));
	*statement = pstrdup(SPI_getvalue(row, desc, 4));
	return true;
}

/* Marks the job done: superseded by newer (0: embedded). */
static void
mark_done(int64 job_id, int64 newer)
{
	Oid			types[2] = {INT8OID, INT8OID};
	Datum		values[2] = {Int64GetDatum(job_id), Int64GetDatum(newer)};
	char		nulls[2] = {' ', newer == 0 ? 'n' : ' '};
	int			ret;

	ret = SPI_execute_plan(CaiKeepPlan(&embed_done_plan,
									 "UPDATE cai.jobs SET status = 'done', error = NULL, superseded_by = $2, "
									 "finished_at = clock_timestamp() WHERE id = $1",
									 2, types),
						   values, nulls, false, 0);
	if (ret != SPI_OK_UPDATE || SPI_processed != 1)
		elog(ERROR, "could not mark job " INT64_FORMAT " done: %s", job_id,
			 SPI_result_code_string(ret));
}

/* See jobs_embed.h. */
bool
CaiAnswerEmbedJob(int64 job_id, int32 attempts)
{
	char	   *owner_name;
	Oid			owner;
	bool		may_use;
	char	   *statement;
	int64		newer;
	Oid			save_userid;
	int			save_sec_context;
	int			save_nestlevel;
	int			ret;

	SPI_connect();
	if (!load_embed_job(job_id, attempts, &owner_name, &owner, &may_use, &statement, &newer))
	{
		SPI_finish();
		return false;
	}
	if (newer != 0)
	{
		mark_done(job_id, newer);
		SPI_finish();
		return true;
	}
	if (!OidIsValid(owner))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("role \"%s\", who queued embedding job " INT64_FORMAT ", does not exist",
						owner_name, job_id)));
	if (!may_use)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role \"%s\", who queued embedding job " INT64_FORMAT ", may not use cai_embed",
						owner_name, job_id),
				 errhint("Grant cai_user to the role.")));

	/* as the writer, restricted like a reply job's owner (jobs_runner.c) */
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(owner, save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	save_nestlevel = NewGUCNestLevel();

	ret = SPI_execute(statement, false, 0);
	if (ret != SPI_OK_UPDATE)
		elog(ERROR, "could not store the embedding of job " INT64_FORMAT ": %s", job_id,
			 SPI_result_code_string(ret));

	AtEOXact_GUC(false, save_nestlevel);
	SetUserIdAndSecContext(save_userid, save_sec_context);

	mark_done(job_id, 0);
	SPI_finish();
	return true;
}
