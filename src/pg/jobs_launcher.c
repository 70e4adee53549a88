/*
 * jobs_launcher.c — the job launcher of asynchronous replies: one background worker, started
 * when pg_cai.job_databases is set and connected to no database, that starts pg_cai.job_workers
 * job runners (jobs_runner.c) for each listed database that exists, and restarts them when they
 * stop.
 *
 * Runners are dynamic background workers that the postmaster never restarts itself
 * (BGW_NEVER_RESTART): the launcher does, with a backoff while they keep dying at once, so that
 * a dropped database or a runner that cannot start is not retried in a tight loop.  A listed
 * database that does not exist yet is looked for again every CAI_JOB_LAUNCHER_CHECK_MS, or at
 * once when a committed enqueue in it wakes the launcher.
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "guc.h"
#include "jobs_launcher.h"
#include "jobs_shmem.h"
#include "pg_compat.h"

/* the launcher looks for listed databases that do not exist yet this often */
#define CAI_JOB_LAUNCHER_CHECK_MS 10000
/* a stopped runner is started again after this, doubled while runners keep failing at once */
#define CAI_JOB_RESTART_MS 1000
#define CAI_JOB_RESTART_MAX_MS 60000
/* a runner that stopped within this of its start counts as failing at once */
#define CAI_JOB_QUICK_EXIT_MS 30000
/* the backoff doubles at most this many times */
#define CAI_JOB_MAX_DOUBLINGS 6

/* PgCaiJobLauncher: its idle wait (pg_compat.h) */
static uint32 launcher_wait_event = 0;

/* What the launcher knows of each runner slot (CaiJobSlotCount()) and each listed database */
typedef struct LauncherState
{
	BackgroundWorkerHandle **handles;	/* per slot: its runner, NULL while none runs */
	TimestampTz *next_start;	/* per slot: not started again before this */
	TimestampTz *started_at;	/* per slot: when its runner was last started */
	int		   *quick_exits;	/* per slot: runners in a row that stopped at once */
	bool	   *reported;		/* per database: its absence is logged already */
} LauncherState;

/*
 * CaiJobLauncherRegister
 *		Registers the job launcher when pg_cai.job_databases lists any database.  Called from
 *		_PG_init in the postmaster, after CaiJobsShmemInit has parsed the list.
 */
void
CaiJobLauncherRegister(void)
{
	BackgroundWorker worker;

	if (CaiJobDatabaseCount() == 0)
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

static void
launcher_shutdown(int code, Datum arg)
{
	CaiJobsSetLauncher(NULL);
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
 * runner_is_running
 *		True while the slot's runner runs.  When it has stopped, forgets it and schedules its
 *		restart: after CAI_JOB_RESTART_MS, doubled for each runner in a row that stopped soon
 *		after its start, so that runners that cannot work do not spin.  Exits when the
 *		postmaster is gone.
 */
static bool
runner_is_running(LauncherState *ls, int slot, TimestampTz now)
{
	pid_t		pid;
	BgwHandleStatus status;

	if (ls->handles[slot] == NULL)
		return false;
	status = GetBackgroundWorkerPid(ls->handles[slot], &pid);
	if (status == BGWH_POSTMASTER_DIED)
		proc_exit(1);
	if (status != BGWH_STOPPED)
		return true;

	pfree(ls->handles[slot]);
	ls->handles[slot] = NULL;
	if (TimestampDifferenceExceeds(ls->started_at[slot], now, CAI_JOB_QUICK_EXIT_MS))
		ls->quick_exits[slot] = 0;
	else
		ls->quick_exits[slot] = Min(ls->quick_exits[slot] + 1, CAI_JOB_MAX_DOUBLINGS);
	ls->next_start[slot] =
		TimestampTzPlusMilliseconds(now, Min(CAI_JOB_RESTART_MS << ls->quick_exits[slot],
											 CAI_JOB_RESTART_MAX_MS));
	return false;
}

/*
 * database_to_serve
 *		The oid of listed database d when runners can connect to it; otherwise InvalidOid, logged
 *		once until the database appears (runners wait for it quietly after that).
 */
static Oid
database_to_serve(LauncherState *ls, int d)
{
	const char *dbname = CaiJobDatabaseName(d);
	Oid			database = lookup_database(dbname);

	if (!OidIsValid(database) && !ls->reported[d])
		ereport(LOG,
				(errmsg("pg_cai job runners wait for database \"%s\", listed in pg_cai.job_databases, to exist and accept connections",
						dbname)));
	ls->reported[d] = !OidIsValid(database);
	return database;
}

/*
 * tend_database
 *		Starts the runners of listed database d that are due: not running, and past their
 *		restart time.  The database is looked up at most once, and only when a runner is due,
 *		since that takes a transaction.  Returns timeout, lowered to the next restart time of a
 *		runner that is not due yet.
 */
static long
tend_database(LauncherState *ls, int d, TimestampTz now, long timeout)
{
	const char *dbname = CaiJobDatabaseName(d);
	Oid			database = InvalidOid;
	bool		looked_up = false;
	int			w;

	for (w = 0; w < cai_job_workers; w++)
	{
		int			slot = d * cai_job_workers + w;

		if (runner_is_running(ls, slot, now))
			continue;

		if (now < ls->next_start[slot])
		{
			long		secs;
			int			usecs;

			TimestampDifference(now, ls->next_start[slot], &secs, &usecs);
			timeout = Min(timeout, secs * 1000 + usecs / 1000 + 1);
			continue;
		}

		if (!looked_up)
		{
			database = database_to_serve(ls, d);
			looked_up = true;
		}
		if (!OidIsValid(database))
			break;

		ls->handles[slot] = start_runner(slot, database, dbname);
		ls->started_at[slot] = now;
		if (ls->handles[slot] == NULL)
		{
			ereport(LOG,
					(errmsg("could not start a pg_cai job runner for database \"%s\": no background worker slot is free",
							dbname),
					 errhint("Raise max_worker_processes, or lower pg_cai.job_workers.")));
			ls->next_start[slot] = TimestampTzPlusMilliseconds(now, CAI_JOB_LAUNCHER_CHECK_MS);
		}
	}
	return timeout;
}

/* The launcher's bookkeeping, zeroed, for the life of the process. */
static LauncherState *
launcher_state_create(void)
{
	int			n_slots = CaiJobSlotCount();
	LauncherState *ls = MemoryContextAllocZero(TopMemoryContext, sizeof(LauncherState));

	ls->handles = MemoryContextAllocZero(TopMemoryContext, sizeof(*ls->handles) * n_slots);
	ls->next_start = MemoryContextAllocZero(TopMemoryContext, sizeof(*ls->next_start) * n_slots);
	ls->started_at = MemoryContextAllocZero(TopMemoryContext, sizeof(*ls->started_at) * n_slots);
	ls->quick_exits = MemoryContextAllocZero(TopMemoryContext, sizeof(*ls->quick_exits) * n_slots);
	ls->reported = MemoryContextAllocZero(TopMemoryContext,
										  sizeof(*ls->reported) * CaiJobDatabaseCount());
	return ls;
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
	LauncherState *ls;

	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	ls = launcher_state_create();

	CaiJobsSetLauncher(MyProc);
	before_shmem_exit(launcher_shutdown, (Datum) 0);

	ereport(LOG,
			(errmsg("pg_cai job launcher started: %d runner(s) for each of %d database(s)",
					cai_job_workers, CaiJobDatabaseCount())));

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
		for (d = 0; d < CaiJobDatabaseCount(); d++)
			timeout = tend_database(ls, d, now, timeout);

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Max(timeout, 1L),
						 CaiWaitEvent("PgCaiJobLauncher", &launcher_wait_event));
	}
}
