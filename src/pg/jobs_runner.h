/*
 * jobs_runner.h — a job runner: a background worker connected to one database that answers its
 * asynchronous reply jobs (cai.jobs).  The job launcher starts runners by this entry point's name.
 */
#ifndef PG_CAI_JOBS_RUNNER_H
#define PG_CAI_JOBS_RUNNER_H

#include "fmgr.h"

extern PGDLLEXPORT void CaiJobRunnerMain(Datum main_arg);

#endif							/* PG_CAI_JOBS_RUNNER_H */
