/*
 * jobs.h — asynchronous replies: the cai.jobs queue, the trigger that fills it, and the
 * background workers that answer it (one launcher; job runners per database).
 */
#ifndef PG_CAI_JOBS_H
#define PG_CAI_JOBS_H

#include "commands/trigger.h"

/* _PG_init: parses pg_cai.job_databases and registers the launcher */
extern void CaiJobsInit(void);

/* shared memory: called from shmem.c's request and startup hooks */
extern Size CaiJobsShmemSize(void);
extern void CaiJobsShmemStartup(void);

/* errors unless the trigger firing is the only reply trigger on its table */
extern void CaiCheckOneReplyTrigger(TriggerData *trigdata);

extern PGDLLEXPORT void CaiJobLauncherMain(Datum main_arg);
extern PGDLLEXPORT void CaiJobRunnerMain(Datum main_arg);

#endif							/* PG_CAI_JOBS_H */
