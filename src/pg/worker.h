/*
 * worker.h — the engine worker: one background worker per cluster that owns the model.
 */
#ifndef PG_CAI_WORKER_H
#define PG_CAI_WORKER_H

extern void CaiWorkerInit(void);
extern PGDLLEXPORT void CaiWorkerMain(Datum main_arg);

#endif							/* PG_CAI_WORKER_H */
