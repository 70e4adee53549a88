/*
 * jobs_shmem.h — the asynchronous reply jobs' shared state: which databases' jobs run
 * (pg_cai.job_databases, parsed in the postmaster and inherited by every child), the job
 * launcher's identity and the job runners' slots, and the wake-up at commit of a transaction that
 * queued jobs.  The launcher (jobs_launcher.c), the runners (jobs_runner.c) and the enqueue
 * triggers (reply_trigger.c, embed_trigger.c) meet here and nowhere else.
 */
#ifndef PG_CAI_JOBS_SHMEM_H
#define PG_CAI_JOBS_SHMEM_H

#include "storage/proc.h"

/* _PG_init: parses pg_cai.job_databases and installs the jobs' shared memory hooks */
extern void CaiJobsShmemInit(void);

/* pg_cai.job_databases */
extern int	CaiJobDatabaseCount(void);
extern const char *CaiJobDatabaseName(int index);
extern bool CaiJobDatabaseIsListed(const char *name);

/* runner slots: pg_cai.job_workers for each listed database, database by database */
extern int	CaiJobSlotCount(void);

/* the launcher announces itself (MyProc) and leaves (NULL) */
extern void CaiJobsSetLauncher(PGPROC *proc);
extern int	CaiJobsLauncherPid(void);

/* a runner takes its slot at start and leaves it at exit */
extern void CaiJobsTakeSlot(int slot, Oid database);
extern void CaiJobsLeaveSlot(int slot);

/* wakes the database's runners, or the launcher when none runs; never fails */
extern void CaiJobsWakeRunners(Oid database);

/* a trigger queued a job of this transaction: wake the runners at its commit */
extern void CaiJobsWakeAtCommit(const char *what);

#endif							/* PG_CAI_JOBS_SHMEM_H */
