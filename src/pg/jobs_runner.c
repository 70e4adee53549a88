/*
 * jobs_runner.c — a job runner of asynchronous replies: a background worker connected to one
 * database (started by the job launcher, jobs_launcher.c) that claims the oldest runnable job of
 * cai.jobs (FOR UPDATE SKIP LOCKED, so runners never take the same job), answers it as the
 * conversation's owner through the same code as cai_reply_trigger (CaiReplyToMessage: a client
 * of the engine worker like any backend, batched with everyone else), and stores the reply, the
 * job's outcome and a NOTIFY on channel cai_reply (payload: the conversation id) in one
 * transaction.  The enqueue trigger (reply_trigger.c) queues the jobs and wakes the runners.
 * Jobs of kind 'embed' (embed_trigger.c) are claimed, retried and failed the same way, and carried
 * out by jobs_embed.c instead of a reply; they belong to no conversation, and their end (done,
 * superseded or failed) is a NOTIFY on channel cai_embedding whose payload is the job's id: a
 * listener reads the job, row-level security permitting, rather than the payload, which every
 * listener of the database sees.
 *
 * A job's states (pg_cron's habit: explicit states, and work orphaned by a crash cleaned up):
 *
 *   pending --claim, committed--> running --reply + done + NOTIFY, one transaction--> done
 *                                    |--error (bad option, no such role, ...)--> failed + NOTIFY
 *                                    |--the engine process crashed while generating--> failed
 *                                    |     + NOTIFY, at the first crash: the turn may be what
 *                                    |     crashed it, so it is not retried blindly
 *                                    '--transient error (queue full, worker or engine restart
 *                                       for a reload)--> pending (the attempt is not counted;
 *                                       retried after a pause)
 *
 * The claim is committed on its own so that attempts counts every try, even one that kills the
 * server: a job claimed CAI_JOB_MAX_ATTEMPTS times without an answer fails, and one message
 * cannot crash the server forever.  From its claim until its outcome is committed, a job is held by
 * its runner with a session-level advisory lock (pg_locks: locktype advisory, classid
 * CAI_JOB_LOCK_CLASS, objid the job id's low 32 bits), which ends with the runner's process,
 * however it ends.  So a job 'running' that no process holds is orphaned — its runner died — and
 * before each claim, runners return such jobs to 'pending'.  A runner re-checks its claim (status
 * and attempts) under the job's row lock before it answers.
 *
 * A conversation's jobs are answered one after the other, in the order of their messages: a job
 * is runnable only when no older job of its conversation is pending or running.
 *
 * Runners act for the conversation's owner: while answering, the runner's user id is the owner's
 * (SetUserIdAndSecContext, as REFRESH MATERIALIZED VIEW does for a view's owner), so row-level
 * security, grants and the prefix-cache salt are the owner's, and an owner who may not execute
 * cai_chat gets no reply.
 *
 * The runner's statements are prepared once and kept (spi_plan.c), like every SPI statement of
 * pg_cai: a runner runs the same few again and again for as long as the server runs.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "chat.h"
#include "jobs_embed.h"
#include "jobs_runner.h"
#include "jobs_shmem.h"
#include "pg_compat.h"
#include "spi_plan.h"

/* a job claimed this many times without an answer fails */
#define CAI_JOB_MAX_ATTEMPTS 5
/* an idle runner looks for jobs this often even when nobody wakes it (prepared transactions) */
#define CAI_JOB_POLL_MS 5000
/* a runner waits this long after a transient error (the engine is full or restarting) */
#define CAI_JOB_RETRY_DELAY_MS 1000
/* a runner logs a retry for the same error again only after this (DEBUG1 meanwhile) */
#define CAI_JOB_RETRY_LOG_MS 60000

#define CAI_REPLY_CHANNEL "cai_reply"
#define CAI_EMBEDDING_CHANNEL "cai_embedding"

/* advisory lock class of jobs held by runners: "caij" */
#define CAI_JOB_LOCK_CLASS 0x6361696a

/* PgCaiJobRunner: its idle wait (pg_compat.h) */
static uint32 runner_wait_event = 0;

/* What a claim found */
typedef enum JobClaimResult
{
	CLAIM_NO_EXTENSION,			/* pg_cai is not installed in this database (yet) */
	CLAIM_NONE,					/* no runnable job */
	CLAIM_GAVE_UP,				/* the job had no attempt left: now failed */
	CLAIM_CLAIMED				/* the job is ours and running */
} JobClaimResult;

/* How answering a job ended */
typedef enum JobOutcome
{
	JOB_DONE,					/* the reply is stored */
	JOB_LOST,					/* someone else took it over between claim and answer */
	JOB_FAILED,					/* failed for good, with its error */
	JOB_RETRY					/* a transient error: pending again */
} JobOutcome;

typedef struct JobClaim
{
	int64		id;
	int64		conversation_id;	/* a reply job's; 0 for an embedding job */
	int32		attempts;
	bool		embed;			/* kind 'embed' (jobs_embed.c), else a reply */
} JobClaim;

static int	runner_slot = -1;
static MemoryContext runner_context = NULL;

/* The last retry this runner logged, and the retries with the same error it did not log since */
static char *retry_logged_reason = NULL;
static TimestampTz retry_logged_at = 0;
static int	retries_not_logged = 0;

/* The runner's statements, prepared once (spi_plan.c) */
static SPIPlanPtr extension_plan = NULL;
static SPIPlanPtr running_jobs_plan = NULL;
static SPIPlanPtr reset_orphans_plan = NULL;
static SPIPlanPtr claim_plan = NULL;
static SPIPlanPtr load_job_plan = NULL;
static SPIPlanPtr job_done_plan = NULL;
static SPIPlanPtr job_failed_plan = NULL;

static void
runner_shutdown(int code, Datum arg)
{
	CaiJobsLeaveSlot(runner_slot);
}

/*
 * launcher_is_gone
 *		True when the launcher that started this runner has exited.  A new launcher knows nothing
 *		of its predecessor's runners and starts its own, so the old ones leave.
 */
static bool
launcher_is_gone(void)
{
	return CaiJobsLauncherPid() != MyBgworkerEntry->bgw_notify_pid;
}

/*
 * Queues the NOTIFY that tells listeners the job ended: a reply job's conversation on cai_reply,
 * an embedding job's own id on cai_embedding.
 */
static void
notify_job_end(const JobClaim *claim)
{
	char		payload[32];

	snprintf(payload, sizeof(payload), INT64_FORMAT,
			 claim->embed ? claim->id : claim->conversation_id);
	Async_Notify(claim->embed ? CAI_EMBEDDING_CHANNEL : CAI_REPLY_CHANNEL, payload);
}

/* Opens a transaction with a snapshot and SPI, for the runner's own statements. */
static void
runner_begin(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
}

static void
runner_commit(void)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
}

/* The advisory lock that says a runner holds the job (see the header comment). */
static void
job_lock_tag(LOCKTAG *tag, int64 job_id)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, CAI_JOB_LOCK_CLASS, (uint32) job_id, 2);
}

/*
 * reset_orphaned_jobs
 *		Returns to 'pending' every running job that no runner holds: its runner died (a crash, a
 *		terminated process) before committing the outcome.  A job is tested by trying its
 *		advisory lock; the lock taken for the test lasts until the end of the transaction, so the
 *		job cannot be claimed in between.  Runs inside the caller's transaction, with SPI.
 */
static void
reset_orphaned_jobs(void)
{
	Datum	   *orphans;
	int			n_orphans = 0;
	uint64		i;
	int			ret;

	ret = SPI_execute_plan(CaiKeepPlan(&running_jobs_plan,
									 "SELECT id FROM cai.jobs WHERE status = 'running'",
									 0, NULL),
						   NULL, NULL, true, 0);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "could not look for orphaned jobs: %s", SPI_result_code_string(ret));
	if (SPI_processed == 0)
		return;

	orphans = palloc(sizeof(Datum) * SPI_processed);
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		int64		id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
													 1, &isnull));
		LOCKTAG		tag;

		job_lock_tag(&tag, id);
		if (LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL)
			orphans[n_orphans++] = Int64GetDatum(id);
	}
	if (n_orphans > 0)
	{
		Oid			argtypes[1] = {INT8ARRAYOID};
		Datum		values[1];

		values[0] = PointerGetDatum(construct_array(orphans, n_orphans, INT8OID, sizeof(int64),
													FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
		ret = SPI_execute_plan(CaiKeepPlan(&reset_orphans_plan,
										 "UPDATE cai.jobs SET status = 'pending', started_at = NULL "
										 "WHERE id = ANY ($1) AND status = 'running'",
										 1, argtypes),
							   values, NULL, false, 0);
		if (ret != SPI_OK_UPDATE)
			elog(ERROR, "could not reset orphaned jobs: %s", SPI_result_code_string(ret));
		if (SPI_processed > 0)
			ereport(LOG,
					(errmsg("pg_cai job runner returned %llu orphaned job(s) to pending",
							(unsigned long long) SPI_processed),
					 errdetail("Their runner ended before it finished them.")));
	}
}

/*
 * claim_next_job
 *		In a transaction of its own: returns orphaned jobs to pending, then claims the oldest
 *		runnable pending job: marks it running, counts the attempt and takes its advisory lock
 *		(kept past commit, until release_job), or fails it when it has no attempt left.
 */
static JobClaimResult
claim_next_job(JobClaim *claim)
{
	JobClaimResult result;
	Datum		max_attempts = Int32GetDatum(CAI_JOB_MAX_ATTEMPTS);
	Oid			argtypes[1] = {INT4OID};
	bool		isnull;
	int			ret;

	runner_begin("claiming a pg_cai reply job");

	ret = SPI_execute_plan(CaiKeepPlan(&extension_plan,
									 "SELECT pg_catalog.to_regclass('cai.jobs') IS NOT NULL",
									 0, NULL),
						   NULL, NULL, true, 1);
	if (ret != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not look for cai.jobs: %s", SPI_result_code_string(ret));
	if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
	{
		runner_commit();
		return CLAIM_NO_EXTENSION;
	}

	reset_orphaned_jobs();

	ret = SPI_execute_plan(CaiKeepPlan(&claim_plan,
									 "UPDATE cai.jobs j SET "
									 "  status = CASE WHEN j.attempts >= $1 THEN 'failed' ELSE 'running' END, "
									 "  attempts = CASE WHEN j.attempts >= $1 THEN j.attempts ELSE j.attempts + 1 END, "
									 "  started_at = CASE WHEN j.attempts >= $1 THEN j.started_at ELSE clock_timestamp() END, "
									 "  finished_at = CASE WHEN j.attempts >= $1 THEN clock_timestamp() END, "
									 "  error = CASE WHEN j.attempts >= $1 "
									 "    THEN 'gave up after ' || j.attempts || ' attempts' || coalesce(': ' || j.error, '') "
									 "    ELSE j.error END "
									 "WHERE j.id = (SELECT p.id FROM cai.jobs p "
									 "  WHERE p.status = 'pending' AND NOT EXISTS ("
									 "    SELECT FROM cai.jobs e WHERE e.conversation_id = p.conversation_id "
									 "    AND e.id < p.id AND e.status IN ('pending', 'running')) "
									 "  ORDER BY p.id LIMIT 1 FOR UPDATE SKIP LOCKED) "
									 "RETURNING j.id, coalesce(j.conversation_id, 0), j.attempts, j.status = 'running', "
									 "  j.kind = 'embed'",
									 1, argtypes),
						   &max_attempts, NULL, false, 1);
	if (ret != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "could not claim a job: %s", SPI_result_code_string(ret));

	if (SPI_processed == 0)
		result = CLAIM_NONE;
	else
	{
		HeapTuple	row = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;

		claim->id = DatumGetInt64(SPI_getbinval(row, desc, 1, &isnull));
		claim->conversation_id = DatumGetInt64(SPI_getbinval(row, desc, 2, &isnull));
		claim->attempts = DatumGetInt32(SPI_getbinval(row, desc, 3, &isnull));
		claim->embed = DatumGetBool(SPI_getbinval(row, desc, 5, &isnull));
		if (DatumGetBool(SPI_getbinval(row, desc, 4, &isnull)))
		{
			LOCKTAG		tag;

			job_lock_tag(&tag, claim->id);
			(void) LockAcquire(&tag, ExclusiveLock, true, false);
			result = CLAIM_CLAIMED;
		}
		else
		{
			result = CLAIM_GAVE_UP;
			notify_job_end(claim);
			ereport(LOG,
					(errmsg("pg_cai job " INT64_FORMAT " failed: gave up after %d attempts",
							claim->id, claim->attempts)));
		}
	}

	runner_commit();
	return result;
}

/* Lets go of a claimed job once its outcome is committed. */
static void
release_job(const JobClaim *claim)
{
	LOCKTAG		tag;

	job_lock_tag(&tag, claim->id);
	(void) LockRelease(&tag, ExclusiveLock, true);
}

/*
 * answer_job
 *		Answers a claimed job inside the current transaction: re-checks the claim under the job's
 *		row lock (waiting out a sibling's brief lock on it, such as a claim query's), becomes the
 *		conversation's owner, generates and stores the reply, becomes the runner again, marks the
 *		job done and queues the NOTIFY.  Errors propagate.
 */
static JobOutcome
answer_job(const JobClaim *claim)
{
	Oid			load_types[2] = {INT8OID, INT4OID};
	Datum		load_values[2];
	Oid			done_types[2] = {INT8OID, INT8OID};
	Datum		done_values[2];
	HeapTuple	row;
	TupleDesc	desc;
	bool		isnull;
	bool		owner_missing;
	bool		may_use;
	int64		message_id;
	bool		is_user_turn;
	char	   *owner_name;
	Oid			owner = InvalidOid;
	Jsonb	   *options;
	Oid			save_userid;
	int			save_sec_context;
	int			save_nestlevel;
	int64		reply_id;
	int			ret;
	MemoryContext outer = CurrentMemoryContext;

	SPI_connect();
	load_values[0] = Int64GetDatum(claim->id);
	load_values[1] = Int32GetDatum(claim->attempts);
	ret = SPI_execute_plan(CaiKeepPlan(&load_job_plan,
									 "SELECT j.message_id, m.role, m.conversation_id = j.conversation_id, j.options, "
									 "  c.owner, r.oid, r.oid IS NULL, "
									 "  coalesce((SELECT pg_catalog.bool_and(pg_catalog.has_function_privilege(r.oid, p.oid, 'EXECUTE')) "
									 "    FROM pg_catalog.pg_proc p "
									 "    JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass "
									 "      AND d.objid = p.oid AND d.deptype = 'e' "
									 "    JOIN pg_catalog.pg_extension x ON x.oid = d.refobjid AND x.extname = 'pg_cai' "
									 "    WHERE p.proname = 'cai_chat'), false) "
									 "FROM cai.jobs j "
									 "JOIN cai.messages m ON m.id = j.message_id "
									 "JOIN cai.conversations c ON c.id = j.conversation_id "
									 "LEFT JOIN pg_catalog.pg_roles r ON r.rolname = c.owner "
									 "WHERE j.id = $1 AND j.status = 'running' AND j.attempts = $2 "
									 "FOR UPDATE OF j",
									 2, load_types),
						   load_values, NULL, false, 1);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "could not read job " INT64_FORMAT ": %s", claim->id,
			 SPI_result_code_string(ret));
	if (SPI_processed == 0)
	{
		SPI_finish();
		return JOB_LOST;
	}

	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	message_id = DatumGetInt64(SPI_getbinval(row, desc, 1, &isnull));
	is_user_turn = strcmp(SPI_getvalue(row, desc, 2), "user") == 0 &&
		DatumGetBool(SPI_getbinval(row, desc, 3, &isnull));
	owner_missing = DatumGetBool(SPI_getbinval(row, desc, 7, &isnull));
	if (!owner_missing)
		owner = DatumGetObjectId(SPI_getbinval(row, desc, 6, &isnull));
	may_use = DatumGetBool(SPI_getbinval(row, desc, 8, &isnull));

	MemoryContextSwitchTo(outer);
	owner_name = pstrdup(SPI_getvalue(row, desc, 5));
	options = DatumGetJsonbPCopy(SPI_getbinval(row, desc, 4, &isnull));
	SPI_finish();

	if (!is_user_turn)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("message " INT64_FORMAT " is not a user turn of conversation " INT64_FORMAT,
						message_id, claim->conversation_id)));
	if (owner_missing)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("role \"%s\", the owner of conversation " INT64_FORMAT ", does not exist",
						owner_name, claim->conversation_id)));
	if (!may_use)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role \"%s\", the owner of conversation " INT64_FORMAT ", may not use pg_cai",
						owner_name, claim->conversation_id),
				 errhint("Grant cai_user to the role.")));

	/*
	 * Answer as the owner.  Like REFRESH MATERIALIZED VIEW, lock the user id and restrict what
	 * code run on the owner's behalf (policies, triggers) may leave behind, and undo any setting
	 * it changes.
	 */
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(owner, save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	save_nestlevel = NewGUCNestLevel();

	reply_id = CaiReplyToMessage(claim->conversation_id, message_id, options);

	AtEOXact_GUC(false, save_nestlevel);
	SetUserIdAndSecContext(save_userid, save_sec_context);

	SPI_connect();
	done_values[0] = Int64GetDatum(claim->id);
	done_values[1] = Int64GetDatum(reply_id);
	ret = SPI_execute_plan(CaiKeepPlan(&job_done_plan,
									 "UPDATE cai.jobs SET status = 'done', error = NULL, reply_id = $2, "
									 "finished_at = clock_timestamp() WHERE id = $1",
									 2, done_types),
						   done_values, NULL, false, 0);
	if (ret != SPI_OK_UPDATE || SPI_processed != 1)
		elog(ERROR, "could not mark job " INT64_FORMAT " done: %s", claim->id,
			 SPI_result_code_string(ret));
	SPI_finish();

	notify_job_end(claim);
	return JOB_DONE;
}

/*
 * is_transient
 *		True for errors that say "not now" rather than "never": the engine's queue is full, the
 *		worker or the engine is restarting for a reload, out of memory, a lock conflict.  Such a
 *		job is tried again.  An engine crash (ERRCODE_SYSTEM_ERROR) is not among them.
 */
static bool
is_transient(int sqlerrcode)
{
	switch (sqlerrcode)
	{
		case ERRCODE_CONFIGURATION_LIMIT_EXCEEDED:
		case ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE:
		case ERRCODE_INSUFFICIENT_RESOURCES:
		case ERRCODE_OUT_OF_MEMORY:
		case ERRCODE_T_R_DEADLOCK_DETECTED:
		case ERRCODE_T_R_SERIALIZATION_FAILURE:
			return true;
		default:
			return false;
	}
}

/*
 * log_failure
 *		Logs a job's failure, or that it will be retried.  Jobs wait out a missing model or an
 *		engine restart by retrying every CAI_JOB_RETRY_DELAY_MS, so a retry with the error this
 *		runner logged last is logged again only after CAI_JOB_RETRY_LOG_MS, with the count of
 *		the retries in between (each of those at DEBUG1).
 */
static void
log_failure(const JobClaim *claim, bool retry, const char *reason)
{
	TimestampTz now = GetCurrentTimestamp();
	char	   *job = claim->embed ?
		psprintf("pg_cai embedding job " INT64_FORMAT " (attempt %d)", claim->id, claim->attempts) :
		psprintf("pg_cai job " INT64_FORMAT " (conversation " INT64_FORMAT ", attempt %d)",
				 claim->id, claim->conversation_id, claim->attempts);

	if (retry && retry_logged_reason != NULL && strcmp(reason, retry_logged_reason) == 0 &&
		!TimestampDifferenceExceeds(retry_logged_at, now, CAI_JOB_RETRY_LOG_MS))
	{
		retries_not_logged++;
		ereport(DEBUG1, (errmsg("%s will be retried: %s", job, reason)));
		return;
	}
	ereport(LOG,
			(errmsg("%s %s: %s", job, retry ? "will be retried" : "failed", reason),
			 retry && retries_not_logged > 0 ?
			 errdetail("Since its last such line, this runner retried jobs %d more time(s) after the error logged there.",
					   retries_not_logged) : 0));
	if (retry)
	{
		if (retry_logged_reason != NULL)
			pfree(retry_logged_reason);
		retry_logged_reason = MemoryContextStrdup(TopMemoryContext, reason);
		retry_logged_at = now;
		retries_not_logged = 0;
	}
}

/*
 * record_failure
 *		In a fresh transaction: puts a job that hit a transient error back to pending, without
 *		counting the attempt (a job waits out an overload however long it lasts; attempts limits
 *		only runs that never came back), or marks it failed with the error's message and tells
 *		listeners.  Only a job still in the state this runner claimed is changed.
 */
static JobOutcome
record_failure(const JobClaim *claim, ErrorData *edata)
{
	bool		retry = is_transient(edata->sqlerrcode);
	Oid			argtypes[4] = {INT8OID, INT4OID, TEXTOID, BOOLOID};
	Datum		values[4];
	int			ret;
	const char *reason = edata->message ? edata->message : "unknown error";

	/* an engine crash says which signal in its detail: keep that with the job */
	if (edata->sqlerrcode == ERRCODE_SYSTEM_ERROR && edata->detail)
		reason = psprintf("%s: %s", reason, edata->detail);
	log_failure(claim, retry, reason);

	runner_begin("recording a failed pg_cai reply job");
	values[0] = Int64GetDatum(claim->id);
	values[1] = Int32GetDatum(claim->attempts);
	values[2] = CStringGetTextDatum(reason);
	values[3] = BoolGetDatum(retry);
	ret = SPI_execute_plan(CaiKeepPlan(&job_failed_plan,
									 "UPDATE cai.jobs SET error = $3, "
									 "status = CASE WHEN $4 THEN 'pending' ELSE 'failed' END, "
									 "attempts = CASE WHEN $4 THEN attempts - 1 ELSE attempts END, "
									 "started_at = CASE WHEN $4 THEN NULL ELSE started_at END, "
									 "finished_at = CASE WHEN $4 THEN NULL ELSE clock_timestamp() END "
									 "WHERE id = $1 AND status = 'running' AND attempts = $2",
									 4, argtypes),
						   values, NULL, false, 0);
	if (ret != SPI_OK_UPDATE)
		elog(ERROR, "could not record the failure of job " INT64_FORMAT ": %s", claim->id,
			 SPI_result_code_string(ret));
	if (SPI_processed > 0 && !retry)
		notify_job_end(claim);
	runner_commit();

	return retry ? JOB_RETRY : JOB_FAILED;
}

/*
 * run_job
 *		Answers a claimed job in one transaction; on error, rolls it back and records the
 *		failure in another.
 */
static JobOutcome
run_job(const JobClaim *claim)
{
	volatile JobOutcome outcome = JOB_FAILED;
	ErrorData  *edata = NULL;
	char		activity[128];

	if (claim->embed)
		snprintf(activity, sizeof(activity), "running pg_cai embedding job " INT64_FORMAT,
				 claim->id);
	else
		snprintf(activity, sizeof(activity), "answering pg_cai reply job " INT64_FORMAT
				 " of conversation " INT64_FORMAT, claim->id, claim->conversation_id);

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);

	PG_TRY();
	{
		if (claim->embed)
		{
			outcome = CaiAnswerEmbedJob(claim->id, claim->attempts) ? JOB_DONE : JOB_LOST;
			if (outcome == JOB_DONE)
				notify_job_end(claim);
		}
		else
			outcome = answer_job(claim);
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(runner_context);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
	}
	PG_END_TRY();
	pgstat_report_activity(STATE_IDLE, NULL);

	if (edata != NULL)
	{
		outcome = record_failure(claim, edata);
		FreeErrorData(edata);
	}
	return outcome;
}

/*
 * CaiJobRunnerMain
 *		Entry point of a job runner: main_arg is its slot, bgw_extra the database's oid.  Answers
 *		jobs one at a time while there are any, then sleeps on its latch until a committed enqueue
 *		wakes it (or CAI_JOB_POLL_MS passes).
 */
void
CaiJobRunnerMain(Datum main_arg)
{
	Oid			database;

	runner_slot = DatumGetInt32(main_arg);
	memcpy(&database, MyBgworkerEntry->bgw_extra, sizeof(Oid));

	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();

	if (runner_slot < 0 || runner_slot >= CaiJobSlotCount())
		elog(ERROR, "pg_cai job runner started with slot %d of %d", runner_slot,
			 CaiJobSlotCount());

	BackgroundWorkerInitializeConnectionByOid(database, InvalidOid, 0);

	/*
	 * The runner is a superuser acting for other roles: resolve names in the system catalogs
	 * only, so that no role's objects can stand in for the ones meant.  (pg_cai's own queries
	 * name their schema.)
	 */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);

	runner_context = AllocSetContextCreate(TopMemoryContext, "pg_cai job runner",
										   ALLOCSET_DEFAULT_SIZES);

	CaiJobsTakeSlot(runner_slot, database);
	before_shmem_exit(runner_shutdown, (Datum) 0);

	for (;;)
	{
		JobClaim	claim;
		long		wait_ms = CAI_JOB_POLL_MS;

		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		MemoryContextReset(runner_context);
		if (launcher_is_gone())
		{
			ereport(LOG,
					(errmsg("pg_cai job runner exits: the job launcher that started it has exited")));
			proc_exit(0);
		}

		switch (claim_next_job(&claim))
		{
			case CLAIM_NO_EXTENSION:
			case CLAIM_NONE:
				break;
			case CLAIM_GAVE_UP:
				continue;
			case CLAIM_CLAIMED:
				{
					JobOutcome	outcome = run_job(&claim);

					release_job(&claim);
					if (outcome != JOB_RETRY)
						continue;
					wait_ms = CAI_JOB_RETRY_DELAY_MS;
					break;
				}
		}

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 wait_ms,
						 CaiWaitEvent("PgCaiJobRunner", &runner_wait_event));
	}
}
