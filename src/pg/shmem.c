/*
 * shmem.c — pg_cai's shared memory: sizing, initialization, and the intake ring.
 *
 * The ring holds the dsm handles of posted requests in arrival order.  Backends push; the one
 * engine worker peeks at the oldest, attaches to it, marks it accepted, and only then pops it, so
 * that a worker dying between the two steps leaves the request in the ring for its successor
 * instead of losing it.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/shmem.h"

#include "guc.h"
#include "shmem.h"

CaiSharedState *cai_shared = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/*
 * ring_capacity
 *		Places in the intake ring: room for a burst that fills every running slot and the whole
 *		queue at once, so that admission is decided by the engine (max_queue waiting requests,
 *		max_queue_wait) rather than by how quickly the worker drains the ring.  The ring refuses
 *		requests itself only while the worker is not taking them (loading, restarting).
 */
static int
ring_capacity(void)
{
	return cai_max_queue + cai_max_batch;
}

/*
 * pg_cai_shmem_size
 *		Bytes of the main shared memory segment pg_cai needs.
 */
Size
pg_cai_shmem_size(void)
{
	return add_size(offsetof(CaiSharedState, ring),
					mul_size(ring_capacity(), sizeof(dsm_handle)));
}

static void
cai_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();

	RequestAddinShmemSpace(pg_cai_shmem_size());
	RequestNamedLWLockTranche("pg_cai", 1);
}

/*
 * cai_shmem_startup
 *		Creates or attaches to the shared state.  Runs in the postmaster at start and after a
 *		crash, when the whole segment is fresh: nothing survives from a crashed worker.
 */
static void
cai_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);

	cai_shared = ShmemInitStruct("pg_cai", pg_cai_shmem_size(), &found);
	if (!found)
	{
		memset(cai_shared, 0, pg_cai_shmem_size());
		cai_shared->lock = &(GetNamedLWLockTranche("pg_cai"))->lock;
		pg_atomic_init_u64(&cai_shared->generation, 0);
		cai_shared->ring_capacity = ring_capacity();
	}

	LWLockRelease(AddinShmemInitLock);
}

/*
 * CaiShmemInit
 *		Installs the shared memory hooks.  Called from _PG_init in the postmaster.
 */
void
CaiShmemInit(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = cai_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = cai_shmem_startup;
}

/*
 * CaiSharedStateOrError
 *		The shared state, or an error telling the user how to load pg_cai properly.
 */
CaiSharedState *
CaiSharedStateOrError(void)
{
	if (cai_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_cai must be loaded via shared_preload_libraries"),
				 errhint("Add pg_cai to shared_preload_libraries in postgresql.conf and restart the server.")));
	return cai_shared;
}

/*
 * CaiSharedModelIndex
 *		The slot of the served model of that name, or -1.  The caller holds the pg_cai lock.
 */
int
CaiSharedModelIndex(const char *name)
{
	for (int i = 0; i < CAI_MAX_MODELS; i++)
	{
		if (cai_shared->models[i].name[0] != '\0' &&
			strcmp(cai_shared->models[i].name, name) == 0)
			return i;
	}
	return -1;
}

/*
 * CaiRingPush
 *		Appends a request handle and wakes the engine worker; false when the ring is full.
 *		Takes the pg_cai lock exclusively.
 */
bool
CaiRingPush(dsm_handle handle)
{
	bool		pushed = false;
	PGPROC	   *worker = NULL;

	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	if (cai_shared->ring_count < cai_shared->ring_capacity)
	{
		int			slot = (cai_shared->ring_head + cai_shared->ring_count) %
		cai_shared->ring_capacity;

		cai_shared->ring[slot] = handle;
		cai_shared->ring_count++;
		pushed = true;
		worker = cai_shared->worker_proc;
	}
	LWLockRelease(cai_shared->lock);

	if (worker != NULL)
		SetLatch(&worker->procLatch);
	return pushed;
}

/*
 * CaiRingPeek
 *		The oldest posted handle, left in the ring; false when the ring is empty.  Takes the
 *		pg_cai lock in shared mode.  Only the engine worker consumes the ring.
 */
bool
CaiRingPeek(dsm_handle *handle)
{
	bool		found = false;

	LWLockAcquire(cai_shared->lock, LW_SHARED);
	if (cai_shared->ring_count > 0)
	{
		*handle = cai_shared->ring[cai_shared->ring_head];
		found = true;
	}
	LWLockRelease(cai_shared->lock);
	return found;
}

/*
 * CaiRingPop
 *		Removes the oldest handle, which must be the one CaiRingPeek returned.  Takes the pg_cai
 *		lock exclusively.
 */
void
CaiRingPop(dsm_handle handle)
{
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	if (cai_shared->ring_count > 0 &&
		cai_shared->ring[cai_shared->ring_head] == handle)
	{
		cai_shared->ring_head = (cai_shared->ring_head + 1) % cai_shared->ring_capacity;
		cai_shared->ring_count--;
	}
	LWLockRelease(cai_shared->lock);
}
