/*
 * pg_cai.c — module entry of pg_cai, chat completion inside PostgreSQL.
 *
 * _PG_init only wires subsystems together: settings (src/pg/guc.c), shared memory
 * (src/pg/shmem.c), the asynchronous reply jobs' own shared memory (src/pg/jobs_shmem.c), the
 * engine worker (src/pg/worker.c) and the job launcher (src/pg/jobs_launcher.c).  It never touches
 * the model or a GPU: those belong to the worker process alone.  pg_cai must be loaded through
 * shared_preload_libraries; loaded any other way it defines nothing and its SQL functions say so.
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"

#include "guc.h"
#include "jobs_launcher.h"
#include "jobs_shmem.h"
#include "shmem.h"
#include "worker.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;

	CaiGucInit();
	CaiShmemInit();
	CaiJobsShmemInit();
	CaiWorkerInit();
	CaiJobLauncherRegister();
}
