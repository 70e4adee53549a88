/*
 * shmem.h — pg_cai's state in the main shared memory segment.
 *
 * One CaiSharedState per cluster: the engine worker's identity, per served model its engine's
 * health, a summary of the model and the latest statistics, and the intake ring of posted
 * requests (dsm handles).
 * Everything in it is protected by the "pg_cai" LWLock tranche's single lock, except the
 * generation counter, which is atomic so that waiting backends can poll it cheaply.
 */
#ifndef PG_CAI_SHMEM_H
#define PG_CAI_SHMEM_H

#include "port/atomics.h"
#include "storage/dsm.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "utils/timestamp.h"

#include "cai.h"
#include "guc.h"
#include "wire.h"

/* What the engine worker and its engine process are doing */
typedef enum CaiWorkerState
{
	CAI_WORKER_NOT_RUNNING = 0, /* not started yet, or exited and waiting for a restart */
	CAI_WORKER_LOADING,			/* an engine process is starting and loading the model */
	CAI_WORKER_READY,			/* serving */
	CAI_WORKER_FAILED,			/* up, but without a model: requests get the reason */
	CAI_WORKER_RESTARTING,		/* the engine process died; another starts after a backoff and
								 * loads the model */
	CAI_WORKER_UNRESPONSIVE		/* the engine has been silent for half its hang timeout */
} CaiWorkerState;

#define CAI_EXIT_TEXT_SIZE 128

#define CAI_REASON_SIZE 512

/* What SQL can learn about the model without asking the worker */
typedef struct CaiModelSummary
{
	char		path[MAXPGPATH];
	cai_wire_model info;		/* as the engine process reported it */
} CaiModelSummary;

/* Counters the worker keeps besides the engine's own */
typedef struct CaiWorkerCounters
{
	uint64		requests_received;	/* taken from the ring */
	uint64		requests_completed; /* answered with a result */
	uint64		requests_failed;	/* answered with an error */
	uint64		requests_abandoned; /* the backend left (cancel, timeout, error) */
	uint64		requests_client_lost;	/* of those, left because its client went away */
} CaiWorkerCounters;

/*
 * One served model and its engine process.  A slot is in use while its name is not empty; the
 * worker fills and empties slots as the configured models come and go.
 */
typedef struct CaiModelSlot
{
	char		name[CAI_MODEL_NAME_MAX + 1];	/* as configured; "" when the slot is free */
	CaiWorkerState state;
	char		reason[CAI_REASON_SIZE];	/* why the model is unavailable (FAILED) */
	char		hint[CAI_REASON_SIZE];
	CaiModelSummary model;

	/* the engine process (not a child of the postmaster: the worker starts it) */
	int			engine_pid;		/* 0 when none runs */
	uint64		engine_starts;	/* engine processes started for this model by this worker */
	TimestampTz engine_started; /* when the current (or last) one started */
	char		engine_last_exit[CAI_EXIT_TEXT_SIZE];	/* how the last one ended; "" if none did */

	/* statistics, refreshed by the worker after every step and when idle */
	cai_engine_stats engine_stats;
	CaiWorkerCounters counters;
	double		recent_tokens_per_second;	/* generated tokens per second, ~last 10 s */

	/* cai_stat_reset()'s base for this model (see CaiSharedState) */
	uint64		reset_engine_starts;
	cai_engine_stats engine_stats_base;
	CaiWorkerCounters counters_base;
} CaiModelSlot;

typedef struct CaiSharedState
{
	LWLock	   *lock;

	/* the engine worker */
	pg_atomic_uint64 generation;	/* bumped each time a worker starts */
	int			worker_pid;		/* 0 when not running */
	PGPROC	   *worker_proc;	/* whose latch to set; NULL when not running */
	TimestampTz worker_started;
	TimestampTz stats_updated;

	/* the models, each with its engine process */
	CaiModelSlot models[CAI_MAX_MODELS];

	/*
	 * cai_stat_reset(): the counters as they were at the last reset, which pg_stat_cai subtracts.
	 * The base belongs to one worker and one engine process: counters start again from zero when
	 * either is replaced, so a base of an earlier one no longer applies (stats.c).
	 */
	TimestampTz stats_reset;	/* 0 until the first reset */
	uint64		reset_worker_generation;

	/* intake ring of request segments, oldest at ring_head */
	int			ring_capacity;
	int			ring_head;
	int			ring_count;
	dsm_handle	ring[FLEXIBLE_ARRAY_MEMBER];
} CaiSharedState;

/* NULL unless pg_cai was loaded via shared_preload_libraries */
extern CaiSharedState *cai_shared;

extern void CaiShmemInit(void);
extern Size pg_cai_shmem_size(void);
extern CaiSharedState *CaiSharedStateOrError(void);

extern int	CaiSharedModelIndex(const char *name);
extern bool CaiRingPush(dsm_handle handle);
extern bool CaiRingPeek(dsm_handle *handle);
extern void CaiRingPop(dsm_handle handle);

#endif							/* PG_CAI_SHMEM_H */
