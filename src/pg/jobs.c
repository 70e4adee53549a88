/*
 * jobs.c — asynchronous replies: a user turn inserted into cai.messages is answered later by a
 * background job runner, which stores the reply and NOTIFYs the client.
 *
 *   cai_enqueue_reply_trigger()  AFTER INSERT FOR EACH ROW on cai.messages: queues a row in
 *                                cai.jobs in the inserting transaction, so a rolled-back insert
 *                                leaves no job, and wakes the database's runners at commit.
 *   job launcher                 one background worker, started when pg_cai.job_databases is
 *                                set, connected to no database: starts pg_cai.job_workers runners
 *                                for each listed database that exists, and restarts them.
 *   job runner                   a background worker connected to one database: claims the
 *                                oldest runnable job (FOR UPDATE SKIP LOCKED, so runners never
 *                                take the same job), answers it as the conversation's owner
 *                                through the same code as cai_reply_trigger (a client of the
 *                                engine worker like any backend, batched with everyone else),
 *                                and stores the reply, the job's outcome and a NOTIFY on channel
 *                                cai_reply (payload: the conversation id) in one transaction.
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
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_database.h"
#include "catalog/pg_language.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "commands/dbcommands.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"
#include "utils/wait_event.h"

#include "chat.h"
#include "conversation.h"
#include "guc.h"
#include "jobs.h"
#include "options.h"
#include "pg_compat.h"
#include "shmem.h"
#include "spi_plan.h"

/* PgCaiJobLauncher, PgCaiJobRunner: their idle waits (pg_compat.h) */
static uint32 launcher_wait_event = 0;
static uint32 runner_wait_event = 0;

PG_FUNCTION_INFO_V1(pg_cai_enqueue_reply_trigger);

/* a job claimed this many times without an answer fails */
#define CAI_JOB_MAX_ATTEMPTS 5
/* an idle runner looks for jobs this often even when nobody wakes it (prepared transactions) */
#define CAI_JOB_POLL_MS 5000
/* a runner waits this long after a transient error (the engine is full or restarting) */
#define CAI_JOB_RETRY_DELAY_MS 1000
/* a runner logs a retry for the same error again only after this (DEBUG1 meanwhile) */
#define CAI_JOB_RETRY_LOG_MS 60000
/* the launcher looks for listed databases that do not exist yet this often */
#define CAI_JOB_LAUNCHER_CHECK_MS 10000
/* a stopped runner is started again after this, doubled while runners keep failing at once */
#define CAI_JOB_RESTART_MS 1000
#define CAI_JOB_RESTART_MAX_MS 60000

#define CAI_REPLY_CHANNEL "cai_reply"

/* advisory lock class of jobs held by runners: "caij" */
#define CAI_JOB_LOCK_CLASS 0x6361696a

/* One job runner's place in shared memory */
typedef struct CaiJobRunnerSlot
{
	Oid			database;		/* whose jobs it answers; InvalidOid while unused */
	int			pid;			/* 0 while not running */
	PGPROC	   *proc;			/* whose latch a committed enqueue sets */
} CaiJobRunnerSlot;

/* Protected by the pg_cai lock (cai_shared->lock) */
typedef struct CaiJobsShared
{
	PGPROC	   *launcher;		/* NULL while the launcher is not running */
	int			launcher_pid;	/* 0 while the launcher is not running */
	int			n_slots;
	CaiJobRunnerSlot slots[FLEXIBLE_ARRAY_MEMBER];
} CaiJobsShared;

static CaiJobsShared *jobs_shared = NULL;

/* pg_cai.job_databases, parsed in the postmaster by CaiJobsInit and inherited by every child */
static char **job_database_names = NULL;
static int	n_job_databases = 0;

/* backends: did this transaction queue a job (wake the runners at commit)? */
static bool jobs_queued_in_xact = false;
static bool warned_in_xact = false;
static bool xact_callback_registered = false;

/* ---------------------------------------------------------------------------------------------
 * Settings, shared memory, registration
 * ------------------------------------------------------------------------------------------- */

/*
 * CaiJobsInit
 *		Parses pg_cai.job_databases and, when it lists any database, registers the job launcher.
 *		Called from _PG_init in the postmaster, after the settings are defined.
 */
void
CaiJobsInit(void)
{
	BackgroundWorker worker;
	MemoryContext old;
	char	   *raw;
	List	   *names = NIL;
	ListCell   *lc;
	int			i = 0;

	if (cai_job_databases == NULL || cai_job_databases[0] == '\0')
		return;

	old = MemoryContextSwitchTo(TopMemoryContext);
	raw = pstrdup(cai_job_databases);
	if (!SplitIdentifierString(raw, ',', &names))
		elog(ERROR, "invalid list syntax in pg_cai.job_databases");	/* the check hook said so */
	n_job_databases = list_length(names);
	job_database_names = palloc(sizeof(char *) * Max(n_job_databases, 1));
	foreach(lc, names)
		job_database_names[i++] = pstrdup((char *) lfirst(lc));
	MemoryContextSwitchTo(old);

	if (n_job_databases == 0)
		return;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 1;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "pg_cai");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "CaiJobLauncherMain");
	snprintf(worker.bgw_name, BGW_MAXLEN, "pg_cai job launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "pg_cai job launcher");
	worker.bgw_main_arg = (Datum) 0;
	worker.bgw_notify_pid = 0;
	RegisterBackgroundWorker(&worker);
}

/* Runner slots: every listed database gets pg_cai.job_workers of them. */
static int
job_slot_count(void)
{
	return n_job_databases * cai_job_workers;
}

/*
 * CaiJobsShmemSize
 *		Bytes of shared memory the job runners' slots need.
 */
Size
CaiJobsShmemSize(void)
{
	return add_size(offsetof(CaiJobsShared, slots),
					mul_size(job_slot_count(), sizeof(CaiJobRunnerSlot)));
}

/*
 * CaiJobsShmemStartup
 *		Creates or attaches to the runners' slots.  Called from pg_cai's shmem startup hook with
 *		AddinShmemInitLock held.
 */
void
CaiJobsShmemStartup(void)
{
	bool		found;

	jobs_shared = ShmemInitStruct("pg_cai jobs", CaiJobsShmemSize(), &found);
	if (!found)
	{
		memset(jobs_shared, 0, CaiJobsShmemSize());
		jobs_shared->n_slots = job_slot_count();
	}
}

/* True when pg_cai.job_databases lists the database. */
static bool
database_is_listed(const char *name)
{
	int			i;

	for (i = 0; i < n_job_databases; i++)
	{
		if (strcmp(job_database_names[i], name) == 0)
			return true;
	}
	return false;
}

/*
 * wake_runners
 *		Sets the latch of every runner serving the database; with none running, wakes the
 *		launcher so that it starts them now (a database created since it last looked).  Takes the
 *		pg_cai lock in shared mode.  Must not fail: it runs at commit.
 */
static void
wake_runners(Oid database)
{
	int			i;
	bool		woke = false;
	PGPROC	   *launcher;

	if (jobs_shared == NULL || cai_shared == NULL)
		return;

	LWLockAcquire(cai_shared->lock, LW_SHARED);
	for (i = 0; i < jobs_shared->n_slots; i++)
	{
		CaiJobRunnerSlot *slot = &jobs_shared->slots[i];

		if (slot->database == database && slot->proc != NULL)
		{
			SetLatch(&slot->proc->procLatch);
			woke = true;
		}
	}
	launcher = jobs_shared->launcher;
	LWLockRelease(cai_shared->lock);

	if (!woke && launcher != NULL)
		SetLatch(&launcher->procLatch);
}

/*
 * jobs_xact_callback
 *		Wakes the runners once a transaction that queued jobs has committed: woken earlier, they
 *		would not see the jobs yet.  A prepared transaction's jobs are found by the runners' poll
 *		after COMMIT PREPARED.
 */
static void
jobs_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
			if (jobs_queued_in_xact)
				wake_runners(MyDatabaseId);
			jobs_queued_in_xact = false;
			warned_in_xact = false;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
			jobs_queued_in_xact = false;
			warned_in_xact = false;
			break;
		default:
			break;
	}
}

/* ---------------------------------------------------------------------------------------------
 * The trigger
 * ------------------------------------------------------------------------------------------- */

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
 * CaiCheckOneReplyTrigger
 *		Raises an error when the table has another enabled row-level INSERT trigger that answers
 *		user turns (cai_reply_trigger or cai_enqueue_reply_trigger): each would answer the turn,
 *		and a user turn gets exactly one reply.  Called by both triggers before they do anything.
 */
void
CaiCheckOneReplyTrigger(TriggerData *trigdata)
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


static SPIPlanPtr later_turn_plan = NULL;
static SPIPlanPtr enqueue_plan = NULL;

/*
 * note_job_queued
 *		Arranges for the database's runners to be woken at commit, and warns (once per
 *		transaction) when no runner will ever serve this database.
 */
static void
note_job_queued(void)
{
	if (!xact_callback_registered)
	{
		RegisterXactCallback(jobs_xact_callback, NULL);
		xact_callback_registered = true;
	}
	jobs_queued_in_xact = true;

	if (!warned_in_xact)
	{
		char	   *dbname = get_database_name(MyDatabaseId);

		warned_in_xact = true;
		if (dbname != NULL && !database_is_listed(dbname))
			ereport(WARNING,
					(errmsg("no pg_cai job runner serves database \"%s\"", dbname),
					 errdetail("The reply is queued in cai.jobs and waits until a job runner serves this database."),
					 errhint("Add the database to pg_cai.job_databases and restart the server.")));
	}
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

	if (!CaiReadTriggeredTurn(fcinfo, "cai_enqueue_reply_trigger", &turn))
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
		note_job_queued();
	return PointerGetDatum(NULL);
}

/* ---------------------------------------------------------------------------------------------
 * The launcher
 * ------------------------------------------------------------------------------------------- */

static void
launcher_shutdown(int code, Datum arg)
{
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	jobs_shared->launcher = NULL;
	jobs_shared->launcher_pid = 0;
	LWLockRelease(cai_shared->lock);
}

/*
 * lookup_database
 *		The oid of a listed database that runners can connect to, or InvalidOid (not created
 *		yet, or not accepting connections).  Runs its own transaction.
 */
static Oid
lookup_database(const char *name)
{
	Oid			oid = InvalidOid;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tuple;

	/*
	 * A process connected to no database can read shared catalogs only with a plain heap scan
	 * (as the logical replication launcher does): index scans and the syscache need a database.
	 */
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tuple);

		if (strcmp(NameStr(db->datname), name) == 0)
		{
			if (db->datallowconn)
				oid = db->oid;
			break;
		}
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return oid;
}

/*
 * start_runner
 *		Registers a dynamic background worker that runs the database's jobs in the given slot.
 *		The launcher is told when it stops and restarts it itself (BGW_NEVER_RESTART), so that a
 *		dropped database is not retried forever.
 */
static BackgroundWorkerHandle *
start_runner(int slot, Oid database, const char *dbname)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "pg_cai");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "CaiJobRunnerMain");
	snprintf(worker.bgw_name, BGW_MAXLEN, "pg_cai job runner %d for database %s",
			 slot % cai_job_workers + 1, dbname);
	snprintf(worker.bgw_type, BGW_MAXLEN, "pg_cai job runner");
	worker.bgw_main_arg = Int32GetDatum(slot);
	memcpy(worker.bgw_extra, &database, sizeof(Oid));
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		return NULL;
	return handle;
}

/*
 * CaiJobLauncherMain
 *		Entry point of the job launcher: keeps pg_cai.job_workers runners going for every database
 *		in pg_cai.job_databases that exists.  The postmaster tells it (SIGUSR1, which sets its
 *		latch) whenever a runner starts or stops.
 */
void
CaiJobLauncherMain(Datum main_arg)
{
	int			n_slots = job_slot_count();
	BackgroundWorkerHandle **handles;
	TimestampTz *next_start;
	TimestampTz *started_at;
	int		   *quick_exits;
	bool	   *reported;

	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	handles = MemoryContextAllocZero(TopMemoryContext, sizeof(*handles) * n_slots);
	next_start = MemoryContextAllocZero(TopMemoryContext, sizeof(*next_start) * n_slots);
	started_at = MemoryContextAllocZero(TopMemoryContext, sizeof(*started_at) * n_slots);
	quick_exits = MemoryContextAllocZero(TopMemoryContext, sizeof(*quick_exits) * n_slots);
	reported = MemoryContextAllocZero(TopMemoryContext, sizeof(*reported) * n_job_databases);

	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	jobs_shared->launcher = MyProc;
	jobs_shared->launcher_pid = MyProcPid;
	LWLockRelease(cai_shared->lock);
	before_shmem_exit(launcher_shutdown, (Datum) 0);

	ereport(LOG,
			(errmsg("pg_cai job launcher started: %d runner(s) for each of %d database(s)",
					cai_job_workers, n_job_databases)));

	for (;;)
	{
		long		timeout = CAI_JOB_LAUNCHER_CHECK_MS;
		TimestampTz now;
		int			d;

		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		now = GetCurrentTimestamp();
		for (d = 0; d < n_job_databases; d++)
		{
			const char *dbname = job_database_names[d];
			Oid			database = InvalidOid;
			bool		looked_up = false;
			int			w;

			for (w = 0; w < cai_job_workers; w++)
			{
				int			slot = d * cai_job_workers + w;

				if (handles[slot] != NULL)
				{
					pid_t		pid;
					BgwHandleStatus status = GetBackgroundWorkerPid(handles[slot], &pid);

					if (status == BGWH_POSTMASTER_DIED)
						proc_exit(1);
					if (status != BGWH_STOPPED)
						continue;

					/* it stopped: start it again, later when runners keep dying at once */
					pfree(handles[slot]);
					handles[slot] = NULL;
					if (TimestampDifferenceExceeds(started_at[slot], now, 30000))
						quick_exits[slot] = 0;
					else
						quick_exits[slot] = Min(quick_exits[slot] + 1, 6);
					next_start[slot] =
						TimestampTzPlusMilliseconds(now, Min(CAI_JOB_RESTART_MS << quick_exits[slot],
															 CAI_JOB_RESTART_MAX_MS));
				}

				if (now < next_start[slot])
				{
					long		secs;
					int			usecs;

					TimestampDifference(now, next_start[slot], &secs, &usecs);
					timeout = Min(timeout, secs * 1000 + usecs / 1000 + 1);
					continue;
				}

				if (!looked_up)
				{
					database = lookup_database(dbname);
					looked_up = true;
					if (!OidIsValid(database) && !reported[d])
						ereport(LOG,
								(errmsg("pg_cai job runners wait for database \"%s\", listed in pg_cai.job_databases, to exist and accept connections",
										dbname)));
					reported[d] = !OidIsValid(database);
				}
				if (!OidIsValid(database))
					break;

				handles[slot] = start_runner(slot, database, dbname);
				started_at[slot] = now;
				if (handles[slot] == NULL)
				{
					ereport(LOG,
							(errmsg("could not start a pg_cai job runner for database \"%s\": no background worker slot is free",
									dbname),
							 errhint("Raise max_worker_processes, or lower pg_cai.job_workers.")));
					next_start[slot] = TimestampTzPlusMilliseconds(now, CAI_JOB_LAUNCHER_CHECK_MS);
				}
			}
		}

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Max(timeout, 1L),
						 CaiWaitEvent("PgCaiJobLauncher", &launcher_wait_event));
	}
}

/* ---------------------------------------------------------------------------------------------
 * The runner
 * ------------------------------------------------------------------------------------------- */

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
	int64		conversation_id;
	int32		attempts;
} JobClaim;

static int	runner_slot = -1;
static MemoryContext runner_context = NULL;

/* The last retry this runner logged, and the retries with the same error it did not log since */
static char *retry_logged_reason = NULL;
static TimestampTz retry_logged_at = 0;
static int	retries_not_logged = 0;

static void
runner_shutdown(int code, Datum arg)
{
	CaiJobRunnerSlot *slot = &jobs_shared->slots[runner_slot];

	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	if (slot->pid == MyProcPid)
	{
		slot->pid = 0;
		slot->proc = NULL;
		slot->database = InvalidOid;
	}
	LWLockRelease(cai_shared->lock);
}

/*
 * launcher_is_gone
 *		True when the launcher that started this runner has exited.  A new launcher knows nothing
 *		of its predecessor's runners and starts its own, so the old ones leave.
 */
static bool
launcher_is_gone(void)
{
	int			pid;

	LWLockAcquire(cai_shared->lock, LW_SHARED);
	pid = jobs_shared->launcher_pid;
	LWLockRelease(cai_shared->lock);
	return pid != MyBgworkerEntry->bgw_notify_pid;
}

/* Queues the NOTIFY that tells listeners a job of the conversation ended. */
static void
notify_conversation(int64 conversation_id)
{
	char		payload[32];

	snprintf(payload, sizeof(payload), INT64_FORMAT, conversation_id);
	Async_Notify(CAI_REPLY_CHANNEL, payload);
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

	ret = SPI_execute("SELECT id FROM cai.jobs WHERE status = 'running'", true, 0);
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
		ret = SPI_execute_with_args("UPDATE cai.jobs SET status = 'pending', started_at = NULL "
									"WHERE id = ANY ($1) AND status = 'running'",
									1, argtypes, values, NULL, false, 0);
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

	ret = SPI_execute("SELECT pg_catalog.to_regclass('cai.jobs') IS NOT NULL", true, 1);
	if (ret != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not look for cai.jobs: %s", SPI_result_code_string(ret));
	if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
	{
		runner_commit();
		return CLAIM_NO_EXTENSION;
	}

	reset_orphaned_jobs();

	ret = SPI_execute_with_args(
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
								"RETURNING j.id, j.conversation_id, j.attempts, j.status = 'running'",
								1, argtypes, &max_attempts, NULL, false, 1);
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
			notify_conversation(claim->conversation_id);
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
	ret = SPI_execute_with_args(
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
								2, load_types, load_values, NULL, false, 1);
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
	ret = SPI_execute_with_args("UPDATE cai.jobs SET status = 'done', error = NULL, reply_id = $2, "
								"finished_at = clock_timestamp() WHERE id = $1",
								2, done_types, done_values, NULL, false, 0);
	if (ret != SPI_OK_UPDATE || SPI_processed != 1)
		elog(ERROR, "could not mark job " INT64_FORMAT " done: %s", claim->id,
			 SPI_result_code_string(ret));
	SPI_finish();

	notify_conversation(claim->conversation_id);
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

	if (retry && retry_logged_reason != NULL && strcmp(reason, retry_logged_reason) == 0 &&
		!TimestampDifferenceExceeds(retry_logged_at, now, CAI_JOB_RETRY_LOG_MS))
	{
		retries_not_logged++;
		ereport(DEBUG1,
				(errmsg("pg_cai job " INT64_FORMAT " (conversation " INT64_FORMAT ", attempt %d) will be retried: %s",
						claim->id, claim->conversation_id, claim->attempts, reason)));
		return;
	}
	ereport(LOG,
			(errmsg("pg_cai job " INT64_FORMAT " (conversation " INT64_FORMAT ", attempt %d) %s: %s",
					claim->id, claim->conversation_id, claim->attempts,
					retry ? "will be retried" : "failed", reason),
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
	ret = SPI_execute_with_args("UPDATE cai.jobs SET error = $3, "
								"status = CASE WHEN $4 THEN 'pending' ELSE 'failed' END, "
								"attempts = CASE WHEN $4 THEN attempts - 1 ELSE attempts END, "
								"started_at = CASE WHEN $4 THEN NULL ELSE started_at END, "
								"finished_at = CASE WHEN $4 THEN NULL ELSE clock_timestamp() END "
								"WHERE id = $1 AND status = 'running' AND attempts = $2",
								4, argtypes, values, NULL, false, 0);
	if (ret != SPI_OK_UPDATE)
		elog(ERROR, "could not record the failure of job " INT64_FORMAT ": %s", claim->id,
			 SPI_result_code_string(ret));
	if (SPI_processed > 0 && !retry)
		notify_conversation(claim->conversation_id);
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

	snprintf(activity, sizeof(activity), "answering pg_cai reply job " INT64_FORMAT
			 " of conversation " INT64_FORMAT, claim->id, claim->conversation_id);

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);

	PG_TRY();
	{
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
	CaiJobRunnerSlot *slot;

	runner_slot = DatumGetInt32(main_arg);
	memcpy(&database, MyBgworkerEntry->bgw_extra, sizeof(Oid));

	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();

	if (runner_slot < 0 || runner_slot >= jobs_shared->n_slots)
		elog(ERROR, "pg_cai job runner started with slot %d of %d", runner_slot,
			 jobs_shared->n_slots);

	BackgroundWorkerInitializeConnectionByOid(database, InvalidOid, 0);

	/*
	 * The runner is a superuser acting for other roles: resolve names in the system catalogs
	 * only, so that no role's objects can stand in for the ones meant.  (pg_cai's own queries
	 * name their schema.)
	 */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);

	runner_context = AllocSetContextCreate(TopMemoryContext, "pg_cai job runner",
										   ALLOCSET_DEFAULT_SIZES);

	slot = &jobs_shared->slots[runner_slot];
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	slot->database = database;
	slot->pid = MyProcPid;
	slot->proc = MyProc;
	LWLockRelease(cai_shared->lock);
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
