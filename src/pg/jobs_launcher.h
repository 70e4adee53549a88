/*
 * jobs_launcher.h — the job launcher: one background worker, connected to no database, that keeps
 * the job runners of every database in pg_cai.job_databases going.
 */
#ifndef PG_CAI_JOBS_LAUNCHER_H
#define PG_CAI_JOBS_LAUNCHER_H

#include "fmgr.h"

/* _PG_init, after CaiJobsShmemInit: registers the launcher when any database is listed */
extern void CaiJobLauncherRegister(void);

extern PGDLLEXPORT void CaiJobLauncherMain(Datum main_arg);

#endif							/* PG_CAI_JOBS_LAUNCHER_H */
