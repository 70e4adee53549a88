/*
 * jobs_shmem.c — the asynchronous reply jobs' shared state (jobs_shmem.h).
 *
 * The jobs own their shared memory: _PG_init installs their own shmem request and startup hooks
 * beside pg_cai's main ones (shmem.c), so that the main segment knows nothing of jobs.  The
 * state is small and changes only when a launcher or runner starts or stops, so it shares the
 * pg_cai lock (shmem.h) rather than having a tranche of its own.
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/memutils.h"
#include "utils/varlena.h"

#include "guc.h"
#include "jobs_shmem.h"
#include "shmem.h"

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

/* pg_cai.job_databases, parsed in the postmaster by CaiJobsShmemInit and inherited by every child */
static char **job_database_names = NULL;
static int	n_job_databases = 0;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/*
 * parse_job_databases
 *		Splits pg_cai.job_databases into job_database_names, kept for the life of the process.
 *		The setting's check hook (guc.c) has accepted the list already.
 */
static void
parse_job_databases(void)
{
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
}

int
CaiJobDatabaseCount(void)
{
	return n_job_databases;
}

const char *
CaiJobDatabaseName(int index)
{
	Assert(index >= 0 && index < n_job_databases);
	return job_database_names[index];
}

/* True when pg_cai.job_databases lists the database. */
bool
CaiJobDatabaseIsListed(const char *name)
{
	int			i;

	for (i = 0; i < n_job_databases; i++)
	{
		if (strcmp(job_database_names[i], name) == 0)
			return true;
	}
	return false;
}

/* Runner slots: every listed database gets pg_cai.job_workers of them. */
int
CaiJobSlotCount(void)
{
	return n_job_databases * cai_job_workers;
}

/* Bytes of shared memory the runners' slots need. */
static Size
jobs_shmem_size(void)
{
	return add_size(offsetof(CaiJobsShared, slots),
					mul_size(CaiJobSlotCount(), sizeof(CaiJobRunnerSlot)));
}

static void
jobs_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();

	RequestAddinShmemSpace(jobs_shmem_size());
}

/*
 * jobs_shmem_startup
 *		Creates or attaches to the runners' slots.  Like the main segment's state, they start
 *		empty after a crash: the launcher and every runner are gone then too.
 */
static void
jobs_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	jobs_shared = ShmemInitStruct("pg_cai jobs", jobs_shmem_size(), &found);
	if (!found)
	{
		memset(jobs_shared, 0, jobs_shmem_size());
		jobs_shared->n_slots = CaiJobSlotCount();
	}
	LWLockRelease(AddinShmemInitLock);
}

/*
 * CaiJobsShmemInit
 *		Parses pg_cai.job_databases and installs the jobs' shared memory hooks.  Called from
 *		_PG_init in the postmaster, after the settings are defined; the slots are sized from the
 *		list, so it is parsed here, before the request hook runs.
 */
void
CaiJobsShmemInit(void)
{
	parse_job_databases();

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = jobs_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = jobs_shmem_startup;
}

/*
 * CaiJobsSetLauncher
 *		Records the launcher's process (MyProc), or that it left (NULL).  Takes the pg_cai lock
 *		exclusively.
 */
void
CaiJobsSetLauncher(PGPROC *proc)
{
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	jobs_shared->launcher = proc;
	jobs_shared->launcher_pid = proc != NULL ? MyProcPid : 0;
	LWLockRelease(cai_shared->lock);
}

/* The running launcher's pid, 0 when none runs.  Takes the pg_cai lock in shared mode. */
int
CaiJobsLauncherPid(void)
{
	int			pid;

	LWLockAcquire(cai_shared->lock, LW_SHARED);
	pid = jobs_shared->launcher_pid;
	LWLockRelease(cai_shared->lock);
	return pid;
}

/* Makes the calling runner the holder of the slot (0 to CaiJobSlotCount() - 1). */
void
CaiJobsTakeSlot(int slot, Oid database)
{
	CaiJobRunnerSlot *s = &jobs_shared->slots[slot];

	Assert(slot >= 0 && slot < jobs_shared->n_slots);
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	s->database = database;
	s->pid = MyProcPid;
	s->proc = MyProc;
	LWLockRelease(cai_shared->lock);
}

/* Frees the slot if the calling runner still holds it. */
void
CaiJobsLeaveSlot(int slot)
{
	CaiJobRunnerSlot *s = &jobs_shared->slots[slot];

	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	if (s->pid == MyProcPid)
	{
		s->pid = 0;
		s->proc = NULL;
		s->database = InvalidOid;
	}
	LWLockRelease(cai_shared->lock);
}

/*
 * CaiJobsWakeRunners
 *		Sets the latch of every runner serving the database; with none running, wakes the
 *		launcher so that it starts them now (a database created since it last looked).  Takes the
 *		pg_cai lock in shared mode.  Must not fail: it runs at commit.
 */
void
CaiJobsWakeRunners(Oid database)
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

/* did this transaction queue a job (wake the runners at commit)? */
static bool jobs_queued_in_xact = false;
static bool warned_in_xact = false;
static bool xact_callback_registered = false;

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
				CaiJobsWakeRunners(MyDatabaseId);
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

/*
 * CaiJobsWakeAtCommit
 *		Arranges for the database's runners to be woken at commit, and warns (once per
 *		transaction) when no runner will ever serve this database.  what names the queued
 *		work in the warning ("reply", "embedding").
 */
void
CaiJobsWakeAtCommit(const char *what)
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
		if (dbname != NULL && !CaiJobDatabaseIsListed(dbname))
			ereport(WARNING,
					(errmsg("no pg_cai job runner serves database \"%s\"", dbname),
					 errdetail("The %s is queued in cai.jobs and waits until a job runner serves this database.", what),
					 errhint("Add the database to pg_cai.job_databases and restart the server.")));
	}
}
