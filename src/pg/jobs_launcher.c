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

/* PgCaiJobLauncher: its idle wait (pg_compat.h) */
static uint32 launcher_wait_event = 0;

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
 * CaiJobLauncherMain
 *		Entry point of the job launcher: keeps pg_cai.job_workers runners going for every database
 *		in pg_cai.job_databases that exists.  The postmaster tells it (SIGUSR1, which sets its
 *		latch) whenever a runner starts or stops.
 */
void
CaiJobLauncherMain(Datum main_arg)
{
	int			n_slots = CaiJobSlotCount();
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
	reported = MemoryContextAllocZero(TopMemoryContext, sizeof(*reported) * CaiJobDatabaseCount());

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
		{
			const char *dbname = CaiJobDatabaseName(d);
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
