/*
 * worker.c — the engine worker: intake of requests, relay to the engine process, supervision.
 *
 * One background worker per cluster.  It knows no database and no model: it attaches to each
 * posted request segment, relays the request's payload to the engine process of the model the
 * request names (engine_process.c) over their socket, and copies what the engine answers into
 * the request's response queue.
 * Between those it drops the requests whose backend went away (cancel, statement_timeout,
 * error), telling the engine, which frees their KV at once.
 *
 * The model, the KV pool, the prefix cache, the threads and the device live in the engine
 * process, which attaches nothing of PostgreSQL's shared memory: when it dies, by any signal or
 * exit, this worker fails the requests that were in flight with a clear error, logs why, and
 * starts another after a backoff; no PostgreSQL session is dropped.  The requests still in the
 * intake ring wait for the new engine, and pg_stat_cai says "restarting" until it has loaded the
 * model.  The backoff grows with crashes in a row and starts over once an engine has served
 * for STABLE_PERIOD_MS.  A crash while the model loads puts the worker in the failed state
 * (calls fail at once with the reason) until a retry loads it, unless an engine with the same
 * settings has served before and the crashes in a row are few: then it is a restart like
 * another.  An engine that says it cannot load the model is not retried until the
 * configuration changes.
 *
 * A hung engine is treated as a crashed one.  Once it is ready, the engine's step loop sends
 * a heartbeat several times a second between its steps and while idle (src/serve/serve.c);
 * an engine silent for half of pg_cai.engine_hang_timeout shows as "unresponsive" (new requests
 * wait in the ring), and one silent for the whole timeout is killed with SIGKILL, its requests
 * in flight fail, and it is restarted.  A step is one unit to the heartbeat, so the timeout
 * must exceed the engine's longest step; the worker warns when a step takes half of it.  While
 * it loads, the engine sends heartbeats as long as the load makes progress
 * (src/serve/load_watch.c): one silent for the whole timeout is killed too, and the model goes
 * to the failed state with that reason (calls waiting for it fail at once) until a retry, after
 * the crash backoff, loads it.
 *
 * A configuration reload that changes the engine's settings (pg_cai.model, device, threads,
 * context, cache size, ...) starts a new engine once the requests in flight have finished, or
 * after pg_cai.reload_grace, failing the rest with a retryable error; new requests wait in the
 * ring meanwhile.
 *
 * Several models (pg_cai.models) are served by one engine process each, every one supervised as
 * above on its own: an EngineSlot holds one engine's process, socket, state, restart backoff,
 * hang watch and statistics, and its model's row of shared memory (CaiModelSlot) has the same
 * index.  A crash, hang or restart of one engine fails only its own requests.  A reload compares
 * the configured list with the running one: it starts the engines of added models, stops those
 * of removed ones (their requests fail, naming the model), and restarts only those whose file or
 * settings changed.  pg_cai.threads and pg_cai.host_cache_size are split equally among the
 * models configured when an engine starts; adding or removing a model does not restart the
 * others to split again.  With one model, a request that its engine cannot take yet (loading,
 * restarting) waits in the intake ring, where a successor worker finds it; with several, such a
 * request is taken from the ring and waits in the worker (REQUEST_WAITING), up to the ring's
 * size per model, so that the other models' requests behind it pass.
 *
 * Each request is in one explicit state (pg_cron's habit), changed only by request_set_state:
 *
 *   WAITING    taken from the ring; its model's engine cannot take it yet (several models),
 *              or its role has pg_cai.max_requests_per_role requests in that engine already
 *   SENT       relayed to the engine process; nothing back yet
 *   STREAMING  the engine is sending tokens
 *   DONE       answered; waiting for the backend to read the rest of its queue
 *   FAILED     answered with an error; likewise
 *   CANCELLED  the backend left: the engine is told and the request forgotten
 *
 * The worker never blocks on a backend or on the engine: sends are non-blocking, what does not
 * fit a response queue waits in the request's outbox, and what does not fit the socket waits in
 * the engine's output buffer.  It waits on its latch and the engine's socket with
 * the wait event PgCaiEngineWorker (PostgreSQL 17 on; "Extension" before), and shows in
 * pg_stat_activity with backend_type "pg_cai engine worker".
 */
#include "postgres.h"

#include <math.h>
#include <signal.h>
#include <unistd.h>

#include "lib/ilist.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/dsm.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/pmsignal.h"
#include "storage/proc.h"
#include "storage/shm_mq.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "cai.h"
#include "engine_process.h"
#include "guc.h"
#include "pg_compat.h"
#include "protocol.h"
#include "replica.h"
#include "shmem.h"
#include "worker.h"

/* PgCaiEngineWorker: the worker waiting for its latch or the engine (pg_compat.h) */
static uint32 worker_wait_event = 0;

typedef enum WorkerRequestState
{
	REQUEST_WAITING,
	REQUEST_SENT,
	REQUEST_STREAMING,
	REQUEST_DONE,
	REQUEST_FAILED,
	REQUEST_CANCELLED
} WorkerRequestState;

/* A response message that did not fit in the response queue yet */
typedef struct OutboxMessage
{
	struct OutboxMessage *next;
	Size		len;
	char		data[FLEXIBLE_ARRAY_MEMBER];
} OutboxMessage;

typedef struct EngineSlot EngineSlot;

typedef struct WorkerRequest
{
	dlist_node	node;
	MemoryContext context;		/* the request and its outbox live here */
	dsm_segment *seg;
	CaiRequestHeader *header;
	shm_mq_handle *mqh;
	EngineSlot *engine;			/* the engine of its model; NULL for an unknown model */
	uint64		id;				/* its id on the engine's socket */
	WorkerRequestState state;
	int			backend_pid;
	OutboxMessage *outbox_head;
	OutboxMessage *outbox_tail;
} WorkerRequest;

/* An engine that has served this long has proved its settings: the backoff starts over */
#define STABLE_PERIOD_MS 10000
/* Restart delays after crashes in a row: none, then 0.5 s doubling up to 10 s */
#define RESTART_DELAY_FIRST_MS 500
#define RESTART_DELAY_MAX_MS 10000
/* Crashes in a row while loading a model that loaded before, before the worker gives up */
#define LOAD_CRASHES_TOLERATED 5

/*
 * One served model: its engine process and the supervision of it.  Slot i of engines[] is
 * published in cai_shared->models[i].
 */
struct EngineSlot
{
	bool		active;			/* a configured model occupies the slot */
	int			index;			/* in engines[] and cai_shared->models[] */
	char		name[CAI_MODEL_NAME_MAX + 1];
	char		path[MAXPGPATH];	/* as configured */
	CaiWorkerState state;

	CaiEngineProcess proc;
	int			socket_event;	/* the socket's position in wait_set; -1 when none */
	bool		socket_wants_write;
	bool		ready;			/* it sent READY */
	bool		stopping;		/* the worker ends it: its exit is no crash */
	bool		reported_failure;	/* it sent FAILED: no restart until a reload */
	TimestampTz start_time;
	TimestampTz ready_time;
	TimestampTz next_start_time;	/* when to start one; 0: none planned */
	int			consecutive_crashes;
	bool		settings_served;	/* an engine with the current settings became ready */

	/* hang supervision of a ready engine */
	TimestampTz last_heard;		/* the last frame of any kind */
	bool		unresponsive;	/* silent for half of the hang timeout */
	bool		hung;			/* killed for its silence: its exit is no plain crash */
	bool		step_warned;	/* logged that a step took half of the timeout */
	StringInfoData settings;	/* the settings the last engine was started with */
	bool		restart_pending;	/* a reload changed them: restart once drained */
	TimestampTz restart_deadline;

	/* statistics */
	cai_engine_stats stats;
	bool		stats_received;
	CaiWorkerCounters counters;
	bool		counters_changed;
	int			n_waiting;		/* its requests in REQUEST_WAITING */
	uint64		n_refused_for_role; /* refused: their role's waiting requests filled its share */
	TimestampTz rate_time;		/* update_recent_rate's state */
	uint64		rate_tokens;
	double		rate;
};

/* The worker is one process: its state is plain statics. */
static MemoryContext worker_context = NULL;
static uint64 worker_generation = 0;
static dlist_head worker_requests = DLIST_STATIC_INIT(worker_requests);
static uint64 next_request_id = 0;
static TimestampTz last_stats_publish = 0;
static EngineSlot engines[CAI_MAX_MODELS];
static WaitEventSet *wait_set = NULL;

static void worker_shutdown(int code, Datum arg);
static void worker_reload(void);
static void engine_start(EngineSlot *e);
static void engine_exited(EngineSlot *e);
static void engine_receive(EngineSlot *e);
static void engine_supervise(EngineSlot *e);
static void engine_watch(EngineSlot *e, TimestampTz now);
static void engine_send(EngineSlot *e);
static void worker_intake(void);
static bool worker_dispatch_waiting(void);
static void worker_check_abandoned(void);
static bool worker_flush(WorkerRequest *req);
static void worker_flush_all(void);
static void worker_finish(WorkerRequest *req);
static void worker_publish_stats(bool force);
static long worker_timeout_ms(void);
static void relay_request(WorkerRequest *req);
static void request_fail(WorkerRequest *req, int32 status, const char *message);

/*
 * CaiWorkerInit
 *		Registers the engine worker with the postmaster.  Called from _PG_init.  The worker is
 *		restarted one second after it exits abnormally (a crash, pg_terminate_backend).  It
 *		connects to no database, like the logical replication launcher, so that it shows in
 *		pg_stat_activity with its waits.
 */
void
CaiWorkerInit(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_ConsistentState;
	worker.bgw_restart_time = 1;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "pg_cai");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "CaiWorkerMain");
	snprintf(worker.bgw_name, BGW_MAXLEN, "pg_cai engine worker");
	snprintf(worker.bgw_type, BGW_MAXLEN, "pg_cai engine worker");
	worker.bgw_main_arg = (Datum) 0;
	worker.bgw_notify_pid = 0;
	RegisterBackgroundWorker(&worker);
}

/* ---------------------------------------------------------------------------------------------
 * Shared state
 * ------------------------------------------------------------------------------------------- */

static CaiModelSlot *
shared_slot(EngineSlot *e)
{
	return &cai_shared->models[e->index];
}

static void
set_state(EngineSlot *e, CaiWorkerState state)
{
	CaiModelSlot *slot = shared_slot(e);

	e->state = state;
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	slot->state = state;
	/* an unresponsive engine still holds its model: it may answer again */
	if (state != CAI_WORKER_READY && state != CAI_WORKER_UNRESPONSIVE)
		memset(&slot->model, 0, sizeof(slot->model));
	LWLockRelease(cai_shared->lock);
}

/*
 * set_failed
 *		Records why the model is unavailable and logs it; its calls fail at once with the
 *		reason.
 */
static void
set_failed(EngineSlot *e, const char *reason, const char *hint)
{
	CaiModelSlot *slot = shared_slot(e);

	if (strcmp(e->name, CAI_DEFAULT_MODEL_NAME) == 0)
		ereport(LOG,
				(errmsg("pg_cai engine worker has no model: %s", reason),
				 errhint("%s", hint)));
	else
		ereport(LOG,
				(errmsg("pg_cai engine worker has no model \"%s\": %s", e->name, reason),
				 errhint("%s", hint)));
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	strlcpy(slot->reason, reason, sizeof(slot->reason));
	strlcpy(slot->hint, hint, sizeof(slot->hint));
	LWLockRelease(cai_shared->lock);
	set_state(e, CAI_WORKER_FAILED);
}

/* The number of models served, which pg_cai.threads and pg_cai.host_cache_size are split by. */
static int
active_engines(void)
{
	int			n = 0;

	for (int i = 0; i < CAI_MAX_MODELS; i++)
		n += engines[i].active ? 1 : 0;
	return n;
}

/*
 * engine_activate
 *		Puts a configured model in a free slot and plans its engine's start now.  A slot whose
 *		shared row already names the model (an earlier worker served it) is taken first and
 *		keeps its engine_starts and engine_last_exit, as a single model's did across worker
 *		restarts.  Takes the pg_cai lock exclusively.
 */
static EngineSlot *
engine_activate(const CaiModelEntry *entry)
{
	EngineSlot *e = NULL;
	CaiModelSlot *slot;
	bool		same_model;

	LWLockAcquire(cai_shared->lock, LW_SHARED);
	for (int i = 0; i < CAI_MAX_MODELS && e == NULL; i++)
		if (!engines[i].active && strcmp(cai_shared->models[i].name, entry->name) == 0)
			e = &engines[i];
	LWLockRelease(cai_shared->lock);
	for (int i = 0; i < CAI_MAX_MODELS && e == NULL; i++)
		if (!engines[i].active && cai_shared->models[i].name[0] == '\0')
			e = &engines[i];
	for (int i = 0; i < CAI_MAX_MODELS && e == NULL; i++)
		if (!engines[i].active)
			e = &engines[i];
	Assert(e != NULL);			/* the list holds at most CAI_MAX_MODELS */

	/* a slot's settings buffer outlives its models */
	resetStringInfo(&e->settings);
	e->active = true;
	strlcpy(e->name, entry->name, sizeof(e->name));
	strlcpy(e->path, entry->path, sizeof(e->path));
	e->state = CAI_WORKER_LOADING;
	e->consecutive_crashes = 0;
	e->settings_served = false;
	e->restart_pending = false;
	e->next_start_time = GetCurrentTimestamp();
	memset(&e->stats, 0, sizeof(e->stats));
	memset(&e->counters, 0, sizeof(e->counters));
	e->stats_received = e->counters_changed = true;
	e->n_waiting = 0;
	e->n_refused_for_role = 0;
	e->rate_time = 0;
	e->rate_tokens = 0;
	e->rate = 0.0;

	slot = shared_slot(e);
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	same_model = strcmp(slot->name, e->name) == 0;
	if (same_model)
	{
		uint64		starts = slot->engine_starts;
		TimestampTz started = slot->engine_started;
		char		last_exit[CAI_EXIT_TEXT_SIZE];

		strlcpy(last_exit, slot->engine_last_exit, sizeof(last_exit));
		memset(slot, 0, sizeof(*slot));
		slot->engine_starts = starts;
		slot->engine_started = started;
		strlcpy(slot->engine_last_exit, last_exit, sizeof(slot->engine_last_exit));
	}
	else
		memset(slot, 0, sizeof(*slot));
	strlcpy(slot->name, e->name, sizeof(slot->name));
	slot->state = CAI_WORKER_LOADING;
	LWLockRelease(cai_shared->lock);
	return e;
}

static EngineSlot *
find_engine(const char *name)
{
	for (int i = 0; i < CAI_MAX_MODELS; i++)
	{
		if (engines[i].active && strcmp(engines[i].name, name) == 0)
			return &engines[i];
	}
	return NULL;
}

/* The engine of the first configured model: the default of requests that name none. */
static EngineSlot *
default_engine(void)
{
	CaiModelList list;

	CaiModelsConfigured(&list);
	return find_engine(list.entries[0].name);
}

/*
 * CaiWorkerMain
 *		Entry point of the engine worker.
 */
void
CaiWorkerMain(Datum main_arg)
{
	CaiModelList list;

	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	/* the engine processes are reaped with waitpid */
	pqsignal(SIGCHLD, SIG_DFL);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	worker_context = AllocSetContextCreate(TopMemoryContext,
										   "pg_cai worker",
										   ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(worker_context);
	for (int i = 0; i < CAI_MAX_MODELS; i++)
	{
		memset(&engines[i], 0, sizeof(engines[i]));
		engines[i].index = i;
		engines[i].socket_event = -1;
		initStringInfo(&engines[i].settings);
		CaiEngineProcessInit(&engines[i].proc);
	}

	/* Announce this incarnation. */
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	worker_generation = pg_atomic_add_fetch_u64(&cai_shared->generation, 1);
	cai_shared->worker_pid = MyProcPid;
	cai_shared->worker_proc = MyProc;
	cai_shared->worker_started = GetCurrentTimestamp();
	LWLockRelease(cai_shared->lock);

	before_shmem_exit(worker_shutdown, (Datum) 0);

	CaiWeightsCacheMoveOldDefault();

	/* the configured models; rows an earlier worker left for others are cleared */
	CaiModelsConfigured(&list);
	for (int i = 0; i < list.n; i++)
		(void) engine_activate(&list.entries[i]);
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < CAI_MAX_MODELS; i++)
		if (!engines[i].active)
			memset(&cai_shared->models[i], 0, sizeof(CaiModelSlot));
	LWLockRelease(cai_shared->lock);

	for (;;)
	{
		WaitEvent	event;

		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();

		/* WaitEventSetWait notices postmaster death only while waiting; a busy loop looks too */
		if (!PostmasterIsAlive())
			proc_exit(1);

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			worker_reload();
		}

		for (int i = 0; i < CAI_MAX_MODELS; i++)
			engine_receive(&engines[i]);
		for (int i = 0; i < CAI_MAX_MODELS; i++)
			engine_supervise(&engines[i]);
		worker_dispatch_waiting();
		worker_intake();
		worker_check_abandoned();
		for (int i = 0; i < CAI_MAX_MODELS; i++)
			engine_send(&engines[i]);

		/*
		 * Publish before delivering: a backend that has its reply and then reads pg_stat_cai
		 * must see counters that include its request (the engine sends its statistics ahead of
		 * the messages of a step in which a generation finished).
		 */
		worker_publish_stats(false);
		worker_flush_all();
		/* a finished request makes room for its role's next one at once */
		if (worker_dispatch_waiting())
			for (int i = 0; i < CAI_MAX_MODELS; i++)
				engine_send(&engines[i]);

		if (wait_set == NULL)
		{
			wait_set = CaiCreateWaitEventSet(worker_context, 2 + CAI_MAX_MODELS);
			AddWaitEventToSet(wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
			AddWaitEventToSet(wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
			for (int i = 0; i < CAI_MAX_MODELS; i++)
			{
				engines[i].socket_event = -1;
				engines[i].socket_wants_write = false;
				if (engines[i].proc.sock >= 0)
					engines[i].socket_event =
						AddWaitEventToSet(wait_set, WL_SOCKET_READABLE, engines[i].proc.sock,
										  NULL, NULL);
			}
		}
		for (int i = 0; i < CAI_MAX_MODELS; i++)
		{
			EngineSlot *e = &engines[i];

			if (e->socket_event >= 0 &&
				e->socket_wants_write != (e->proc.out.len > e->proc.out_sent))
			{
				e->socket_wants_write = !e->socket_wants_write;
				ModifyWaitEvent(wait_set, e->socket_event,
								WL_SOCKET_READABLE | (e->socket_wants_write ? WL_SOCKET_WRITEABLE : 0),
								NULL);
			}
		}
		(void) WaitEventSetWait(wait_set, worker_timeout_ms(), &event, 1,
								CaiWaitEvent("PgCaiEngineWorker", &worker_wait_event));
	}
}

/* Milliseconds from now until t, rounded up; 0 when t has passed. */
static long
ms_until(TimestampTz t)
{
	long		secs;
	int			usecs;

	TimestampDifference(GetCurrentTimestamp(), t, &secs, &usecs);
	return secs * 1000 + usecs / 1000 + 1;
}

/*
 * worker_timeout_ms
 *		How long the worker may sleep: until a planned engine start, a reload's deadline, an
 *		engine's silence crossing a threshold of its hang timeout, or a backend reading its
 *		outbox (a backend that reads sets the latch; the timeout only bounds a missed wake-up);
 *		otherwise a second, which bounds how stale the statistics get.
 */
static long
worker_timeout_ms(void)
{
	long		timeout = 1000;
	dlist_iter	iter;

	for (int i = 0; i < CAI_MAX_MODELS; i++)
	{
		EngineSlot *e = &engines[i];

		if (!e->active)
			continue;
		if (e->next_start_time != 0)
			timeout = Min(timeout, ms_until(e->next_start_time));
		if (e->restart_pending)
			timeout = Min(timeout, 100);
		if (e->proc.pid != 0 && !e->ready && cai_engine_hang_timeout_ms > 0)
			timeout = Min(timeout,
						  ms_until(TimestampTzPlusMilliseconds(e->last_heard,
															   cai_engine_hang_timeout_ms)));
		if (e->ready && cai_engine_hang_timeout_ms > 0)
		{
			/* wake for the next threshold of the engine's silence: half the timeout, then all */
			int			threshold = e->unresponsive ? cai_engine_hang_timeout_ms :
				cai_engine_hang_timeout_ms / 2;

			timeout = Min(timeout,
						  ms_until(TimestampTzPlusMilliseconds(e->last_heard, threshold)));
		}
	}
	dlist_foreach(iter, &worker_requests)
	{
		WorkerRequest *req = dlist_container(WorkerRequest, node, iter.cur);

		if (req->outbox_head != NULL)
			return Min(timeout, 100);
	}
	return timeout;
}

/*
 * worker_shutdown
 *		Ends the engine processes and tells backends the worker is gone.  Requests in flight see
 *		their queue detach when the process detaches its segments after this.
 */
static void
worker_shutdown(int code, Datum arg)
{
	char		exit_text[CAI_EXIT_TEXT_SIZE];

	/* ask them all first: each may take a moment to go */
	for (int i = 0; i < CAI_MAX_MODELS; i++)
		if (engines[i].proc.pid != 0)
			(void) kill(engines[i].proc.pid, SIGTERM);
	for (int i = 0; i < CAI_MAX_MODELS; i++)
		if (engines[i].proc.pid != 0)
			(void) CaiEngineProcessStop(&engines[i].proc, true, exit_text, sizeof(exit_text));

	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	cai_shared->worker_pid = 0;
	cai_shared->worker_proc = NULL;
	for (int i = 0; i < CAI_MAX_MODELS; i++)
	{
		cai_shared->models[i].engine_pid = 0;
		cai_shared->models[i].state = CAI_WORKER_NOT_RUNNING;
	}
	LWLockRelease(cai_shared->lock);
}

/* ---------------------------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------------------------- */

/*
 * queue_message
 *		Appends a response message (type byte + body + tail) to the request's outbox.
 */
static void
queue_message(WorkerRequest *req, const void *head, Size head_len, const void *tail,
			  Size tail_len)
{
	OutboxMessage *msg;

	msg = MemoryContextAlloc(req->context, offsetof(OutboxMessage, data) + head_len + tail_len);
	msg->next = NULL;
	msg->len = head_len + tail_len;
	if (head_len > 0)
		memcpy(msg->data, head, head_len);
	if (tail_len > 0)
		memcpy(msg->data + head_len, tail, tail_len);

	if (req->outbox_tail != NULL)
		req->outbox_tail->next = msg;
	else
		req->outbox_head = msg;
	req->outbox_tail = msg;
}

/*
 * request_set_state
 *		The one place a request changes state, and its model's counters with it.  rejected:
 *		an error that is the engine's admission refusal, which the engine counts itself.
 */
static void
request_set_state(WorkerRequest *req, WorkerRequestState state, bool rejected)
{
	EngineSlot *e = req->engine;
	bool		in_engine = req->state == REQUEST_SENT || req->state == REQUEST_STREAMING;
	CaiWorkerCounters unused = {0};
	CaiWorkerCounters *counters = e != NULL ? &e->counters : &unused;

	if (req->state == REQUEST_WAITING && state != REQUEST_WAITING && e != NULL)
		e->n_waiting--;
	switch (state)
	{
		case REQUEST_WAITING:
			if (e != NULL)
				e->n_waiting++;
			break;
		case REQUEST_SENT:
		case REQUEST_STREAMING:
			break;
		case REQUEST_DONE:
			counters->requests_completed++;
			break;
		case REQUEST_FAILED:
			if (!rejected)
				counters->requests_failed++;
			break;
		case REQUEST_CANCELLED:
			if (in_engine && e != NULL)
			{
				size_t		frame = cai_frame_begin(&e->proc.out, CAI_FRAME_CANCEL, req->id);

				cai_frame_end(&e->proc.out, frame);
			}
			if (in_engine || req->state == REQUEST_WAITING)
			{
				counters->requests_abandoned++;
				if (pg_atomic_read_u32(&req->header->abandoned) == CAI_ABANDONED_CLIENT_LOST)
					counters->requests_client_lost++;
			}
			break;
	}
	req->state = state;
	if (e != NULL)
		e->counters_changed = true;
}

/* Answers a request with an error of the worker's own. */
static void
request_fail(WorkerRequest *req, int32 status, const char *message)
{
	char		type = CAI_MSG_ERROR;
	char		head[1 + sizeof(int32)];

	head[0] = type;
	memcpy(head + 1, &status, sizeof(status));
	queue_message(req, head, sizeof(head), message, strlen(message));
	request_set_state(req, REQUEST_FAILED, false);
}

/*
 * request_refuse
 *		Answers a request with the worker's own admission refusal (SQLSTATE 53400 in the
 *		backend), counted as the engine counts its own: as rejected, not failed.
 */
static void
request_refuse(WorkerRequest *req, const char *message)
{
	char		head[1 + sizeof(int32)];
	int32		status = CAI_ERR_QUEUE_FULL;

	head[0] = CAI_MSG_ERROR;
	memcpy(head + 1, &status, sizeof(status));
	queue_message(req, head, sizeof(head), message, strlen(message));
	request_set_state(req, REQUEST_FAILED, true);
}

/*
 * fail_in_flight
 *		Fails every request the engine process has (it died, or is being replaced), and with
 *		waiting too, those still waiting for it; returns how many.
 */
static int
fail_in_flight(EngineSlot *e, bool waiting, int32 status, const char *message)
{
	dlist_iter	iter;
	int			n = 0;

	dlist_foreach(iter, &worker_requests)
	{
		WorkerRequest *req = dlist_container(WorkerRequest, node, iter.cur);

		if (req->engine == e &&
			(req->state == REQUEST_SENT || req->state == REQUEST_STREAMING ||
			 (waiting && req->state == REQUEST_WAITING)))
		{
			request_fail(req, status, message);
			n++;
		}
	}
	return n;
}

static int
count_in_flight(EngineSlot *e)
{
	dlist_iter	iter;
	int			n = 0;

	dlist_foreach(iter, &worker_requests)
	{
		WorkerRequest *req = dlist_container(WorkerRequest, node, iter.cur);

		if (req->engine == e &&
			(req->state == REQUEST_SENT || req->state == REQUEST_STREAMING))
			n++;
	}
	return n;
}

/*
 * request_answered
 *		A response message from the engine for req: queued for its backend.  Every message but
 *		a token (or a token's logprobs, or a sample's start or end) ends the request.
 */
static void
request_answered(WorkerRequest *req, const char *msg, Size len)
{
	queue_message(req, msg, len, NULL, 0);
	if (msg[0] == CAI_MSG_TOKEN || msg[0] == CAI_MSG_LOGPROBS || msg[0] == CAI_MSG_SAMPLE ||
		msg[0] == CAI_MSG_SAMPLE_END)
		request_set_state(req, REQUEST_STREAMING, false);
	else if (msg[0] == CAI_MSG_ERROR)
	{
		int32		status = CAI_ERR_INTERNAL;

		if (len >= 1 + sizeof(int32))
			memcpy(&status, msg + 1, sizeof(status));
		request_set_state(req, REQUEST_FAILED, status == CAI_ERR_QUEUE_FULL);
	}
	else
		request_set_state(req, REQUEST_DONE, false);
}

/* ---------------------------------------------------------------------------------------------
 * Intake
 * ------------------------------------------------------------------------------------------- */

/*
 * header_is_valid
 *		True when the segment holds a request laid out within its bounds.
 */
static bool
header_is_valid(dsm_segment *seg, const CaiRequestHeader *header)
{
	Size		map_len = dsm_segment_map_length(seg);

	if (map_len < sizeof(CaiRequestHeader) || header->magic != CAI_REQUEST_MAGIC)
		return false;
	if (header->payload_offset > map_len || header->payload_size > map_len - header->payload_offset)
		return false;
	if (header->queue_offset > map_len || header->queue_size > map_len - header->queue_offset)
		return false;
	if (header->queue_offset % MAXIMUM_ALIGNOF != 0 || header->queue_size < 1024)
		return false;
	if (header->payload_size > CAI_FRAME_MAX_BODY - sizeof(uint32))
		return false;
	if (memchr(header->model, '\0', sizeof(header->model)) == NULL)
		return false;
	return true;
}

/*
 * engine_takes_requests
 *		An engine takes requests while it serves (and no restart is pending, and it is not
 *		silent).  Otherwise they wait for it, or for the one that replaces it.
 */
static bool
engine_takes_requests(EngineSlot *e)
{
	return e->ready && !e->unresponsive && !e->restart_pending && !e->proc.closed;
}

/*
 * role_share
 *		How many requests of one role an engine may hold (pg_cai.max_requests_per_role); 0 for
 *		no limit.
 */
static int
role_share(void)
{
	return cai_max_requests_per_role;
}

/*
 * role_requests
 *		The requests of role that engine e holds (relayed, not finished), and, in *waiting,
 *		those that wait in the worker for it.
 */
static int
role_requests(EngineSlot *e, Oid role, int *waiting)
{
	dlist_iter	iter;
	int			n = 0;

	*waiting = 0;
	dlist_foreach(iter, &worker_requests)
	{
		WorkerRequest *req = dlist_container(WorkerRequest, node, iter.cur);

		if (req->engine != e || req->header->role != role)
			continue;
		if (req->state == REQUEST_SENT || req->state == REQUEST_STREAMING)
			n++;
		else if (req->state == REQUEST_WAITING)
			(*waiting)++;
	}
	return n;
}

/*
 * role_has_room
 *		Whether req's role may have one more request in its engine: one role cannot take every
 *		place of the batch and of the engine's queue, whatever it sends.
 */
static bool
role_has_room(WorkerRequest *req)
{
	int			share = role_share();
	int			waiting;

	return share == 0 || role_requests(req->engine, req->header->role, &waiting) < share;
}

/*
 * relay_request
 *		Sends a request to its engine, or answers it with the reason its model is unavailable.
 */
static void
relay_request(WorkerRequest *req)
{
	EngineSlot *e = req->engine;

	if (e->state == CAI_WORKER_FAILED)
	{
		char		reason[CAI_REASON_SIZE];

		LWLockAcquire(cai_shared->lock, LW_SHARED);
		strlcpy(reason, shared_slot(e)->reason, sizeof(reason));
		LWLockRelease(cai_shared->lock);
		/* answered at once, as if by an engine */
		request_set_state(req, REQUEST_SENT, false);
		request_fail(req, CAI_WIRE_STATUS_MODEL_UNAVAILABLE, reason);
	}
	else
	{
		CaiRequestHeader *header = req->header;
		size_t		frame = cai_frame_begin(&e->proc.out, CAI_FRAME_REQUEST, req->id);

		cai_put_u32(&e->proc.out, header->kind);
		cai_put_bytes(&e->proc.out, (char *) header + header->payload_offset,
					  header->payload_size);
		cai_frame_end(&e->proc.out, frame);
		request_set_state(req, REQUEST_SENT, false);
	}
}

/*
 * request_take
 *		Makes a WorkerRequest of an attached, valid request segment: becomes the sender of its
 *		response queue.  The caller has marked it accepted and popped it from the ring.
 */
static WorkerRequest *
request_take(dsm_segment *seg, CaiRequestHeader *header, EngineSlot *e)
{
	MemoryContext context;
	MemoryContext old;
	WorkerRequest *req;
	shm_mq	   *mq;

	context = AllocSetContextCreate(worker_context, "pg_cai request", ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(context);
	req = palloc0(sizeof(WorkerRequest));
	req->context = context;
	req->seg = seg;
	req->header = header;
	req->engine = e;
	req->id = ++next_request_id;
	req->backend_pid = header->backend_pid;
	req->state = REQUEST_SENT;	/* as if relayed, until it is */
	mq = (shm_mq *) ((char *) header + header->queue_offset);
	shm_mq_set_sender(mq, MyProc);
	req->mqh = shm_mq_attach(mq, seg, NULL);
	MemoryContextSwitchTo(old);

	dlist_push_tail(&worker_requests, &req->node);
	if (e != NULL)
	{
		e->counters.requests_received++;
		e->counters_changed = true;
	}
	return req;
}

/*
 * worker_intake
 *		Takes posted requests from the ring: attaches to each segment, becomes the sender of its
 *		response queue, and relays it to its model's engine (or answers it with the reason the
 *		model is unavailable).  A request whose engine cannot take it yet stays in the ring with
 *		one model; with several it waits in the worker, up to the ring's size per model.  Takes
 *		the pg_cai lock briefly per request.
 */
static void
worker_intake(void)
{
	dsm_handle	handle;
	bool		several = active_engines() > 1;

	/* with one model, nothing leaves the ring while its engine cannot take it (no attach) */
	if (!several)
	{
		EngineSlot *only = default_engine();

		if (only != NULL && !engine_takes_requests(only) && only->state != CAI_WORKER_FAILED)
			return;
	}

	while (CaiRingPeek(&handle))
	{
		dsm_segment *seg;
		CaiRequestHeader *header;
		WorkerRequest *req;
		EngineSlot *e;

		seg = dsm_attach(handle);
		if (seg == NULL)
		{
			/* the backend gave up before we got here; its segment is gone */
			CaiRingPop(handle);
			continue;
		}

		header = dsm_segment_address(seg);
		if (!header_is_valid(seg, header))
		{
			ereport(LOG,
					(errmsg("pg_cai engine worker ignored a malformed request segment")));
			CaiRingPop(handle);
			dsm_detach(seg);
			continue;
		}

		e = header->model[0] != '\0' ? find_engine(header->model) : default_engine();
		if (e != NULL && !engine_takes_requests(e) && e->state != CAI_WORKER_FAILED &&
			(!several || e->n_waiting >= cai_shared->ring_capacity))
		{
			/* it waits in the ring for its engine, and those behind it with it */
			dsm_detach(seg);
			break;
		}

		/* Accept before popping: a successor worker finds the request if we die in between. */
		pg_atomic_write_u64(&header->accepted_generation, worker_generation);
		CaiRingPop(handle);
		req = request_take(seg, header, e);

		if (e == NULL)
		{
			CaiModelList list;

			CaiModelsConfigured(&list);
			request_fail(req, CAI_ERR_NOT_FOUND,
						 psprintf("pg_cai model \"%s\" is not configured (configured: %s)",
								  header->model, CaiModelsNames(&list)));
		}
		else if (e->state == CAI_WORKER_FAILED ||
				 (engine_takes_requests(e) && role_has_room(req)))
			relay_request(req);
		else if (engine_takes_requests(e))
		{
			int			waiting;

			(void) role_requests(e, header->role, &waiting);
			if (waiting >= cai_max_queue)
			{
				request_refuse(req,
							   psprintf("the queue is full for its role: %d requests running or queued in the engine (pg_cai.max_requests_per_role) and %d waiting behind them",
										role_share(), waiting));
				e->n_refused_for_role++;
			}
			else
				request_set_state(req, REQUEST_WAITING, false);
		}
		else
			request_set_state(req, REQUEST_WAITING, false);
		(void) worker_flush(req);
	}
}

/*
 * worker_dispatch_waiting
 *		Relays the requests waiting in the worker whose engine now takes them and whose role has
 *		room in it, oldest first, and answers those whose model became unavailable.  Returns
 *		whether it relayed or answered any.
 */
static bool
worker_dispatch_waiting(void)
{
	dlist_iter	iter;
	bool		any = false;
	List	   *full = NIL;		/* "engine/role" pairs found without room in this pass */

	dlist_foreach(iter, &worker_requests)
	{
		WorkerRequest *req = dlist_container(WorkerRequest, node, iter.cur);
		bool		relay;

		if (req->state != REQUEST_WAITING)
			continue;
		if (req->engine->state == CAI_WORKER_FAILED)
			relay = true;
		else if (!engine_takes_requests(req->engine))
			relay = false;
		else
		{
			/* counting a role's requests walks the list: once per full role, not per request */
			int64		key = ((int64) (req->engine - engines) << 32) | req->header->role;
			bool		known_full = false;
			ListCell   *lc;

			foreach(lc, full)
				known_full |= *(int64 *) lfirst(lc) == key;
			relay = !known_full && role_has_room(req);
			if (!relay && !known_full)
			{
				int64	   *k = palloc(sizeof(int64));

				*k = key;
				full = lappend(full, k);
			}
		}
		if (relay)
		{
			relay_request(req);
			any = true;
		}
	}
	list_free_deep(full);
	return any;
}

/* ---------------------------------------------------------------------------------------------
 * The engine processes
 * ------------------------------------------------------------------------------------------- */

/* The engine binary: `cai`, installed beside the server's own programs. */
static void
engine_binary_path(char *path)
{
	strlcpy(path, my_exec_path, MAXPGPATH);
	get_parent_directory(path);
	join_path_components(path, path, "cai");
}

/* The model file: its configured path, relative to the data directory unless absolute. */
static void
model_file_path(EngineSlot *e, char *path)
{
	if (is_absolute_path(e->path))
		strlcpy(path, e->path, MAXPGPATH);
	else
		snprintf(path, MAXPGPATH, "%s/%s", DataDir, e->path);
}

/*
 * engine_share
 *		An engine's share of a budget split among the served models: all of it with one model
 *		(so the single-model form runs as it always did), else an equal share, at least
 *		minimum.  A total of 0 for threads means all online cores.
 */
static int
engine_share(int total, int minimum, bool is_threads)
{
	int			n = active_engines();

	if (n <= 1)
		return total;
	if (is_threads && total == 0)
	{
		long		cores = sysconf(_SC_NPROCESSORS_ONLN);

		total = cores > 0 ? (int) cores : 1;
	}
	return Max(total / n, minimum);
}

/*
 * engine_arguments
 *		The engine's command line from the settings, and those settings as one string to tell
 *		whether a reload changed them (max_queue_wait is applied to a running engine instead).
 *		The string holds pg_cai.threads, pg_cai.host_cache_size and pg_cai.disk_cache_size as
 *		set, not the engine's share of them, so that adding or removing another model does not
 *		restart this one.
 */
static char **
engine_arguments(EngineSlot *e, StringInfo settings)
{
	char		model[MAXPGPATH];
	char	  **args = palloc0(sizeof(char *) * 40);
	int			n = 0;

	model_file_path(e, model);
	args[n++] = pstrdup("pg_cai engine");
	args[n++] = pstrdup("serve");
	args[n++] = pstrdup("--fd");
	args[n++] = pstrdup("3");
	args[n++] = pstrdup("--model");
	args[n++] = pstrdup(model);
	args[n++] = pstrdup("--device");
	args[n++] = pstrdup(CaiDeviceSettingName(cai_device));
	args[n++] = pstrdup("--threads");
	args[n++] = psprintf("%d", engine_share(cai_threads, 1, true));
	args[n++] = pstrdup("--max-batch");
	args[n++] = psprintf("%d", cai_max_batch);
	args[n++] = pstrdup("--max-step-tokens");
	args[n++] = psprintf("%d", cai_max_step_tokens);
	args[n++] = pstrdup("--ctx");
	args[n++] = psprintf("%d", cai_context_length);
	args[n++] = pstrdup("--cache-mb");
	args[n++] = psprintf("%d", engine_share(cai_host_cache_size_mb, 0, false));
	args[n++] = pstrdup("--max-queue");
	args[n++] = psprintf("%d", cai_max_queue);
	if (cai_disk_cache_dir != NULL && cai_disk_cache_dir[0] != '\0' && cai_disk_cache_size_mb > 0)
	{
		args[n++] = pstrdup("--disk-cache-dir");
		args[n++] = is_absolute_path(cai_disk_cache_dir) ? pstrdup(cai_disk_cache_dir) :
			psprintf("%s/%s", DataDir, cai_disk_cache_dir);
		args[n++] = pstrdup("--disk-cache-mb");
		args[n++] = psprintf("%d", engine_share(cai_disk_cache_size_mb, 0, false));
	}
	if (cai_chat_template != NULL && cai_chat_template[0] != '\0')
	{
		args[n++] = pstrdup("--template");
		args[n++] = pstrdup(cai_chat_template);
	}
	args[n++] = pstrdup("--weights");
	args[n++] = pstrdup(cai_weights_mode_name((cai_weights_mode) cai_weights));
	args[n++] = pstrdup("--weight-rounding");
	args[n++] = pstrdup(cai_rounding_mode_name((cai_rounding_mode) cai_weight_rounding));
	args[n++] = pstrdup("--activations");
	args[n++] = pstrdup(cai_activations_mode_name((cai_activations_mode) cai_activation_precision));
	if (cai_weights_cache != NULL && cai_weights_cache[0] != '\0')
	{
		args[n++] = pstrdup("--weights-cache");
		args[n++] = is_absolute_path(cai_weights_cache) ? pstrdup(cai_weights_cache) :
			psprintf("%s/%s", DataDir, cai_weights_cache);
	}
	resetStringInfo(settings);
	for (int i = 0; i < n; i++)
	{
		/* the shares are written as the settings are */
		if (i > 0 && strcmp(args[i - 1], "--threads") == 0)
			appendStringInfo(settings, " %d", cai_threads);
		else if (i > 0 && strcmp(args[i - 1], "--cache-mb") == 0)
			appendStringInfo(settings, " %d", cai_host_cache_size_mb);
		else if (i > 0 && strcmp(args[i - 1], "--disk-cache-mb") == 0)
			appendStringInfo(settings, " %d", cai_disk_cache_size_mb);
		else
			appendStringInfo(settings, "%s%s", i > 0 ? " " : "", args[i]);
	}
	args[n++] = pstrdup("--max-queue-wait-ms");
	args[n++] = psprintf("%d", cai_max_queue_wait_ms);
	Assert(n < 40);
	return args;
}

/* A new socket means a new wait event set; it is made before the next wait. */
static void
forget_wait_set(void)
{
	if (wait_set != NULL)
		FreeWaitEventSet(wait_set);
	wait_set = NULL;
	for (int i = 0; i < CAI_MAX_MODELS; i++)
		engines[i].socket_event = -1;
}

/*
 * engine_start
 *		Starts an engine process for the slot's model with the current settings.  Without a
 *		model file, or when the binary cannot be executed, the model goes to the failed state
 *		instead.
 */
static void
engine_start(EngineSlot *e)
{
	char		path[MAXPGPATH];
	char		reason[CAI_REASON_SIZE];
	char	  **args;
	StringInfoData command;
	CaiModelSlot *slot = shared_slot(e);
	MemoryContext old = MemoryContextSwitchTo(worker_context);

	args = engine_arguments(e, &e->settings);
	MemoryContextSwitchTo(old);
	e->ready = false;
	e->stopping = false;
	e->reported_failure = false;
	e->unresponsive = false;
	e->hung = false;
	e->step_warned = false;

	if (e->path[0] == '\0')
	{
		e->reported_failure = true;
		set_failed(e, "no model is configured",
				   "Set pg_cai.model in postgresql.conf to the path of a GGUF model file and reload the configuration (SELECT pg_reload_conf()).");
		return;
	}

	engine_binary_path(path);
	if (!CaiEngineProcessStart(&e->proc, path, args, reason, sizeof(reason)))
	{
		e->reported_failure = true;
		set_failed(e, reason,
				   "Install pg_cai completely: \"make install\" puts the cai program beside the server's programs.");
		return;
	}
	forget_wait_set();
	e->start_time = e->last_heard = GetCurrentTimestamp();
	/* the command line as run (with its shares of threads and cache), max_queue_wait aside */
	initStringInfo(&command);
	for (int i = 0; args[i] != NULL && strcmp(args[i], "--max-queue-wait-ms") != 0; i++)
		appendStringInfo(&command, "%s%s", i > 0 ? " " : "", args[i]);

	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	slot->engine_pid = e->proc.pid;
	slot->engine_starts++;
	slot->engine_started = e->start_time;
	LWLockRelease(cai_shared->lock);
	/* after a crash the state says "restarting" until the new engine is ready */
	if (e->state != CAI_WORKER_RESTARTING)
		set_state(e, CAI_WORKER_LOADING);

	ereport(LOG,
			(errmsg("pg_cai engine worker started engine process %d%s%s%s: %s", (int) e->proc.pid,
					active_engines() > 1 ? " for model \"" : "",
					active_engines() > 1 ? e->name : "",
					active_engines() > 1 ? "\"" : "",
					command.data)));
	pfree(command.data);
}

/* The delay before restarting an engine after the given number of consecutive quick crashes. */
static int
restart_delay_ms(int crashes)
{
	int			delay = RESTART_DELAY_FIRST_MS;

	if (crashes <= 1)
		return 0;
	for (int i = 2; i < crashes && delay < RESTART_DELAY_MAX_MS; i++)
		delay *= 2;
	return Min(delay, RESTART_DELAY_MAX_MS);
}

/*
 * engine_reap
 *		Ends the slot's engine process, reaps it and publishes how it ended.
 */
static void
engine_reap(EngineSlot *e, char *exit_text)
{
	CaiModelSlot *slot = shared_slot(e);

	(void) CaiEngineProcessStop(&e->proc, e->proc.broken || e->stopping, exit_text,
								CAI_EXIT_TEXT_SIZE);
	forget_wait_set();
	e->ready = false;
	e->unresponsive = false;
	memset(&e->stats, 0, sizeof(e->stats));
	e->stats_received = true;
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	slot->engine_pid = 0;
	strlcpy(slot->engine_last_exit, exit_text, sizeof(slot->engine_last_exit));
	LWLockRelease(cai_shared->lock);
}

/*
 * engine_exited
 *		The engine process closed its socket, broke the protocol, was killed for its silence,
 *		or is being replaced: reaps it and decides what comes next.  A crash fails the requests
 *		in flight in it, and only those (a request that was running is never retried blindly:
 *		it may be what crashed the engine), and plans a restart after a backoff.
 */
static void
engine_exited(EngineSlot *e)
{
	char		exit_text[CAI_EXIT_TEXT_SIZE];
	char		message[CAI_REASON_SIZE];
	int			pid = (int) e->proc.pid;
	bool		was_ready = e->ready;
	bool		broken = e->proc.broken;
	bool		hung = e->hung;
	const char *cause;
	TimestampTz now = GetCurrentTimestamp();
	int			n_failed;
	int			delay;

	engine_reap(e, exit_text);
	e->hung = false;

	if (e->stopping)
	{
		e->stopping = false;
		ereport(LOG,
				(errmsg("pg_cai engine process %d stopped to apply a configuration change (%s)",
						pid, exit_text)));
		return;
	}
	if (e->reported_failure)
		return;					/* it said why; the model stays failed until a reload */

	cause = hung && !was_ready ? " after its load made no progress" :
		hung ? " after it stopped responding" :
		broken ? " after sending a malformed message" : "";
	if (hung)
		snprintf(message, sizeof(message),
				 "The engine process (PID %d) sent nothing for pg_cai.engine_hang_timeout (%d ms) and was killed (%s).",
				 pid, cai_engine_hang_timeout_ms, exit_text);
	else
		snprintf(message, sizeof(message), "The engine process (PID %d) %s%s.", pid, exit_text,
				 cause);
	n_failed = fail_in_flight(e, false,
							  hung ? CAI_WIRE_STATUS_ENGINE_HUNG : CAI_WIRE_STATUS_ENGINE_CRASHED,
							  message);
	e->consecutive_crashes++;
	delay = restart_delay_ms(e->consecutive_crashes);
	e->next_start_time = TimestampTzPlusMilliseconds(now, delay);

	ereport(LOG,
			(errmsg("pg_cai engine process %d %s%s", pid, exit_text, cause),
			 active_engines() > 1 ?
			 errdetail("It served model \"%s\"; its %d request(s) in flight failed, the other models' requests and PostgreSQL's sessions were not affected. The engine restarts in %d ms (crash %d in a row).",
					   e->name, n_failed, delay, e->consecutive_crashes) :
			 errdetail("%d request(s) in flight failed; no PostgreSQL session was affected. The engine restarts in %d ms (crash %d in a row).",
					   n_failed, delay, e->consecutive_crashes)));

	/*
	 * A crash while loading a model that an engine with these settings has served is a
	 * restart like another (the new engine died young, say under memory pressure), until it
	 * happens too often in a row: then calls should fail with the reason instead of waiting.
	 * A load that stalled has kept the calls waiting for the whole hang timeout already: they
	 * fail with the reason at once.
	 */
	if (hung && !was_ready)
	{
		char		reason[CAI_REASON_SIZE];

		snprintf(reason, sizeof(reason),
				 "the engine process made no progress loading the model for pg_cai.engine_hang_timeout (%d ms) and was killed",
				 cai_engine_hang_timeout_ms);
		set_failed(e, reason,
				   "The load is retried with a growing delay. See the server log; check that the model file (pg_cai.model), the weights cache directory (pg_cai.weights_cache) and the device are usable, or raise pg_cai.engine_hang_timeout.");
	}
	else if (was_ready || (e->settings_served && e->consecutive_crashes <= LOAD_CRASHES_TOLERATED))
		set_state(e, CAI_WORKER_RESTARTING);
	else
	{
		char		reason[CAI_REASON_SIZE];

		snprintf(reason, sizeof(reason),
				 "the engine process crashed while loading the model (%s)", exit_text);
		set_failed(e, reason,
				   "See the server log; the engine is started again with a growing delay, or at once after a configuration reload.");
	}
}

/*
 * engine_watch
 *		Supervises a ready engine's heartbeat (any frame counts): silent for half of
 *		pg_cai.engine_hang_timeout, it is marked unresponsive; for all of it, it is killed, and
 *		engine_exited fails its requests and plans its restart.  A loading engine silent for
 *		the whole timeout (its load made no progress) is killed likewise.  The socket is read
 *		before this runs, so a worker that was itself held up does not blame the engine.
 */
static void
engine_watch(EngineSlot *e, TimestampTz now)
{
	long		silent_ms;

	if (e->proc.pid == 0 || cai_engine_hang_timeout_ms <= 0)
		return;
	silent_ms = (long) ((now - e->last_heard) / 1000);
	if (!e->ready)
	{
		/* loading: heartbeats come only while the load makes progress */
		if (silent_ms < cai_engine_hang_timeout_ms)
			return;
		ereport(LOG,
				(errmsg("pg_cai engine process %d made no progress loading the model for %ld ms, over pg_cai.engine_hang_timeout (%d ms); killing it",
						(int) e->proc.pid, silent_ms, cai_engine_hang_timeout_ms),
				 errdetail("A loading engine says it is alive only while its load uses CPU time or reads from storage: a model file or weights cache that cannot be read, or a device that does not answer, stalls it.")));
		(void) kill(e->proc.pid, SIGKILL);
		e->hung = true;
		engine_exited(e);
		return;
	}
	if (silent_ms >= cai_engine_hang_timeout_ms)
	{
		ereport(LOG,
				(errmsg("pg_cai engine process %d stopped responding: nothing received for %ld ms, over pg_cai.engine_hang_timeout (%d ms); killing it",
						(int) e->proc.pid, silent_ms, cai_engine_hang_timeout_ms),
				 errdetail("Its %d request(s) in flight fail, and the engine is restarted.",
						   count_in_flight(e))));
		(void) kill(e->proc.pid, SIGKILL);
		e->hung = true;
		engine_exited(e);
	}
	else if (!e->unresponsive && silent_ms >= cai_engine_hang_timeout_ms / 2)
	{
		e->unresponsive = true;
		set_state(e, CAI_WORKER_UNRESPONSIVE);
		ereport(LOG,
				(errmsg("pg_cai engine process %d is unresponsive: nothing received for %ld ms; it is killed at %d ms (pg_cai.engine_hang_timeout)",
						(int) e->proc.pid, silent_ms, cai_engine_hang_timeout_ms)));
	}
}

/*
 * engine_heard
 *		The engine sent something: it is alive.  An engine that was unresponsive serves again,
 *		and one that has served for STABLE_PERIOD_MS starts the crash backoff over.
 */
static void
engine_heard(EngineSlot *e, TimestampTz now)
{
	e->last_heard = now;
	if (e->unresponsive && e->ready)
	{
		e->unresponsive = false;
		set_state(e, CAI_WORKER_READY);
		ereport(LOG,
				(errmsg("pg_cai engine process %d responds again", (int) e->proc.pid)));
	}
	if (e->ready && e->consecutive_crashes > 0 &&
		TimestampDifferenceExceeds(e->ready_time, now, STABLE_PERIOD_MS))
		e->consecutive_crashes = 0;
}

/*
 * engine_heartbeat_frame
 *		A heartbeat carries the engine's longest step so far: warn once per engine when one took
 *		half of the hang timeout, before a longer one gets the engine killed.
 */
static void
engine_heartbeat_frame(EngineSlot *e, cai_reader *reader)
{
	double		longest_step;

	if (!cai_get_f64(reader, &longest_step))
	{
		e->proc.broken = true;
		return;
	}
	if (!e->step_warned && cai_engine_hang_timeout_ms > 0 &&
		longest_step * 1000.0 >= cai_engine_hang_timeout_ms / 2.0)
	{
		e->step_warned = true;
		ereport(WARNING,
				(errmsg("pg_cai engine process %d took %.1f s for one step, over half of pg_cai.engine_hang_timeout (%d ms)",
						(int) e->proc.pid, longest_step, cai_engine_hang_timeout_ms),
				 errhint("Raise pg_cai.engine_hang_timeout above the longest step, or lower pg_cai.max_step_tokens: an engine silent for the whole timeout is killed.")));
	}
}

/*
 * engine_ready_frame
 *		The engine says which model it serves: publish it and start taking requests.
 */
static void
engine_ready_frame(EngineSlot *e, const char *body, uint32 len)
{
	cai_reader	reader;
	cai_wire_model model;
	char		path[MAXPGPATH];
	CaiModelSlot *slot = shared_slot(e);

	cai_reader_init(&reader, body, len);
	if (!cai_wire_get_model(&reader, &model))
	{
		e->proc.broken = true;
		return;
	}
	if (model.version != CAI_WIRE_VERSION)
	{
		char		reason[CAI_REASON_SIZE];

		snprintf(reason, sizeof(reason),
				 "the engine binary speaks protocol version %u, the extension version %u",
				 model.version, CAI_WIRE_VERSION);
		e->reported_failure = true;
		e->proc.broken = true;
		set_failed(e, reason, "Install the cai program and the pg_cai library from the same build.");
		return;
	}
	model_file_path(e, path);
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	strlcpy(slot->model.path, path, sizeof(slot->model.path));
	slot->model.info = model;
	slot->reason[0] = '\0';
	slot->hint[0] = '\0';
	LWLockRelease(cai_shared->lock);
	e->ready = true;
	e->ready_time = e->last_heard = GetCurrentTimestamp();
	e->settings_served = true;
	set_state(e, CAI_WORKER_READY);

	ereport(LOG,
			(errmsg("pg_cai engine worker ready: model \"%s\" (%s), %s, context %d tokens, loaded in %.1f s, engine process %d",
					model.name, model.arch, model.device, model.context_length,
					model.load_seconds, (int) e->proc.pid),
			 active_engines() > 1 ? errdetail("It serves model \"%s\".", e->name) : 0));
}

static WorkerRequest *
find_request(EngineSlot *e, uint64 id)
{
	dlist_iter	iter;

	dlist_foreach(iter, &worker_requests)
	{
		WorkerRequest *req = dlist_container(WorkerRequest, node, iter.cur);

		if (req->id == id && req->engine == e)
			return req;
	}
	return NULL;
}

/* A FAILED frame: the engine cannot load its model, and says why. */
static void
engine_failed_frame(EngineSlot *e, cai_reader *reader)
{
	const char *reason;
	const char *hint;
	uint32		reason_len;
	uint32		hint_len;

	if (!cai_get_text(reader, &reason, &reason_len) ||
		!cai_get_text(reader, &hint, &hint_len))
	{
		e->proc.broken = true;
		return;
	}
	e->reported_failure = true;
	set_failed(e, pnstrdup(reason, Min(reason_len, CAI_REASON_SIZE - 1)),
			   pnstrdup(hint, Min(hint_len, CAI_REASON_SIZE - 1)));
}

/*
 * engine_frame
 *		One frame from an engine process.  Nothing it sends is trusted: a frame that does not
 *		parse marks the engine broken, and it is replaced.
 */
static void
engine_frame(EngineSlot *e, const cai_frame_header *h, const char *body)
{
	cai_reader	reader;

	cai_reader_init(&reader, body, h->body_len);
	switch (h->type)
	{
		case CAI_FRAME_READY:
			engine_ready_frame(e, body, h->body_len);
			break;

		case CAI_FRAME_FAILED:
			engine_failed_frame(e, &reader);
			break;

		case CAI_FRAME_MESSAGE:
			{
				WorkerRequest *req = find_request(e, h->id);

				if (h->body_len < 1)
				{
					e->proc.broken = true;
					break;
				}
				/* a request the backend left, or one already answered: nothing to deliver */
				if (req != NULL &&
					(req->state == REQUEST_SENT || req->state == REQUEST_STREAMING))
					request_answered(req, body, h->body_len);
				break;
			}

		case CAI_FRAME_HEARTBEAT:
			engine_heartbeat_frame(e, &reader);
			break;

		case CAI_FRAME_STATS:
			if (!cai_wire_get_stats(&reader, &e->stats))
				e->proc.broken = true;
			e->stats_received = true;
			break;

		case CAI_FRAME_LOG:
			{
				const char *line;
				uint32		len;

				if (!cai_get_text(&reader, &line, &len))
					e->proc.broken = true;
				else
					ereport(LOG, (errmsg("pg_cai engine process %d: %.*s", (int) e->proc.pid,
										 (int) Min(len, 1024), line)));
				break;
			}

		default:
			e->proc.broken = true;
			break;
	}
}

/*
 * engine_receive
 *		Handles what the slot's engine process sent, and notices that it ended.
 */
static void
engine_receive(EngineSlot *e)
{
	cai_frame_header h;
	const char *body;
	bool		heard = false;

	if (e->proc.pid == 0)
		return;
	CaiEngineProcessRead(&e->proc);
	while (!e->proc.broken && CaiEngineProcessNextFrame(&e->proc, &h, &body))
	{
		engine_frame(e, &h, body);
		heard = true;
	}
	if (e->proc.closed || e->proc.broken)
		engine_exited(e);
	else if (heard)
		engine_heard(e, GetCurrentTimestamp());
}

/*
 * engine_supervise
 *		Kills an engine that stopped responding, starts an engine when one is due, and replaces
 *		the running one when a reload changed its settings and its requests are done (or the
 *		grace is over).
 */
static void
engine_supervise(EngineSlot *e)
{
	TimestampTz now = GetCurrentTimestamp();

	if (!e->active)
		return;
	engine_watch(e, now);
	if (e->restart_pending && e->proc.pid != 0 &&
		(count_in_flight(e) == 0 || now >= e->restart_deadline))
	{
		(void) fail_in_flight(e, false, CAI_WIRE_STATUS_ENGINE_RESTARTED,
							  "The engine was restarted to apply a configuration change.");
		e->stopping = true;
		engine_exited(e);
	}
	if (e->restart_pending && e->proc.pid == 0)
	{
		e->restart_pending = false;
		e->consecutive_crashes = 0;
		e->next_start_time = now;
	}
	if (e->proc.pid == 0 && e->next_start_time != 0 && now >= e->next_start_time)
	{
		e->next_start_time = 0;
		engine_start(e);
	}
}

/*
 * engine_send
 *		Writes what it can of the frames queued for the slot's engine.
 */
static void
engine_send(EngineSlot *e)
{
	if (e->proc.pid != 0)
		(void) CaiEngineProcessWrite(&e->proc);
	else
	{
		cai_wbuf_reset(&e->proc.out);
		e->proc.out_sent = 0;
	}
}

/*
 * engine_deactivate
 *		A reload removed the slot's model: its engine stops now, its requests (in flight and
 *		waiting) fail naming the model, and the slot is freed.  Takes the pg_cai lock.
 */
static void
engine_deactivate(EngineSlot *e)
{
	char		exit_text[CAI_EXIT_TEXT_SIZE];
	char	   *message;
	int			n_failed;
	int			pid = (int) e->proc.pid;

	message = psprintf("pg_cai model \"%s\" was removed from pg_cai.models by a configuration reload",
					   e->name);
	n_failed = fail_in_flight(e, true, CAI_ERR_NOT_FOUND, message);
	if (e->proc.pid != 0)
	{
		e->stopping = true;
		engine_reap(e, exit_text);
		e->stopping = false;
	}
	ereport(LOG,
			(errmsg("pg_cai configuration changed: model \"%s\" is no longer served", e->name),
			 pid != 0 ?
			 errdetail("Its engine process %d was stopped; %d request(s) failed.", pid, n_failed) :
			 errdetail("%d request(s) failed.", n_failed)));
	/* requests already answered keep their slot pointer until delivered: only its name goes */
	e->active = false;
	e->restart_pending = false;
	e->next_start_time = 0;
	e->ready = false;
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	memset(shared_slot(e), 0, sizeof(CaiModelSlot));
	LWLockRelease(cai_shared->lock);
}

/*
 * engine_reconfigure
 *		Applies a reload to one configured model's engine: admission limits at once; other
 *		settings, or another file, by a new engine process once its requests are done.
 */
static void
engine_reconfigure(EngineSlot *e, const CaiModelEntry *entry)
{
	StringInfoData settings;
	MemoryContext old;

	if (e->proc.pid != 0)
	{
		size_t		frame = cai_frame_begin(&e->proc.out, CAI_FRAME_LIMITS, 0);

		cai_put_i32(&e->proc.out, cai_max_queue);
		cai_put_f64(&e->proc.out, (double) cai_max_queue_wait_ms);
		cai_frame_end(&e->proc.out, frame);
	}

	strlcpy(e->path, entry->path, sizeof(e->path));
	old = MemoryContextSwitchTo(worker_context);
	initStringInfo(&settings);
	(void) engine_arguments(e, &settings);
	MemoryContextSwitchTo(old);
	if (strcmp(settings.data, e->settings.data) == 0)
		return;
	e->settings_served = false;

	if (e->proc.pid == 0)
	{
		/* none runs (no model, or a crash backoff): start one with the new settings now */
		e->consecutive_crashes = 0;
		e->next_start_time = GetCurrentTimestamp();
		ereport(LOG, (errmsg("pg_cai configuration changed: starting the engine%s%s%s",
							 active_engines() > 1 ? " of model \"" : "",
							 active_engines() > 1 ? e->name : "",
							 active_engines() > 1 ? "\"" : "")));
		return;
	}
	e->restart_pending = true;
	e->restart_deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), cai_reload_grace_ms);
	ereport(LOG,
			(errmsg("pg_cai configuration changed: the engine%s%s%s restarts with it once %d request(s) in flight finish, within %d ms",
					active_engines() > 1 ? " of model \"" : "",
					active_engines() > 1 ? e->name : "",
					active_engines() > 1 ? "\"" : "",
					count_in_flight(e), cai_reload_grace_ms)));
}

/*
 * worker_reload
 *		Applies a configuration reload model by model: the engines of removed models stop, those
 *		of added ones start, and each remaining one restarts only when its own settings changed.
 */
static void
worker_reload(void)
{
	CaiModelList list;

	ProcessConfigFile(PGC_SIGHUP);
	CaiModelsConfigured(&list);

	for (int i = 0; i < CAI_MAX_MODELS; i++)
		if (engines[i].active && CaiModelsFind(&list, engines[i].name) < 0)
			engine_deactivate(&engines[i]);
	for (int i = 0; i < list.n; i++)
	{
		EngineSlot *e = find_engine(list.entries[i].name);

		if (e != NULL)
			engine_reconfigure(e, &list.entries[i]);
		else
		{
			(void) engine_activate(&list.entries[i]);
			ereport(LOG,
					(errmsg("pg_cai configuration changed: model \"%s\" is added", list.entries[i].name)));
		}
	}
}

/* ---------------------------------------------------------------------------------------------
 * Delivery and clean-up
 * ------------------------------------------------------------------------------------------- */

/*
 * worker_check_abandoned
 *		Drops requests whose backend detached before the answer was complete; the engine drops
 *		their sequences at once.
 */
static void
worker_check_abandoned(void)
{
	dlist_mutable_iter iter;

	dlist_foreach_modify(iter, &worker_requests)
	{
		WorkerRequest *req = dlist_container(WorkerRequest, node, iter.cur);

		if (pg_atomic_read_u32(&req->header->abandoned) != 0)
		{
			request_set_state(req, REQUEST_CANCELLED, false);
			worker_finish(req);
		}
	}
}

/*
 * worker_flush
 *		Sends what fits of the request's outbox, without waiting.  Returns false when the
 *		request was forgotten (its backend left, or its answer is complete and delivered).
 */
static bool
worker_flush(WorkerRequest *req)
{
	while (req->outbox_head != NULL)
	{
		OutboxMessage *msg = req->outbox_head;
		shm_mq_result res;

		res = shm_mq_send(req->mqh, msg->len, msg->data, true, true);
		if (res == SHM_MQ_WOULD_BLOCK)
			return true;
		if (res == SHM_MQ_DETACHED)
		{
			request_set_state(req, REQUEST_CANCELLED, false);
			worker_finish(req);
			return false;
		}
		req->outbox_head = msg->next;
		if (req->outbox_head == NULL)
			req->outbox_tail = NULL;
		pfree(msg);
	}

	if (req->state == REQUEST_DONE || req->state == REQUEST_FAILED)
	{
		worker_finish(req);
		return false;
	}
	return true;
}

static void
worker_flush_all(void)
{
	dlist_mutable_iter iter;

	dlist_foreach_modify(iter, &worker_requests)
	{
		WorkerRequest *req = dlist_container(WorkerRequest, node, iter.cur);

		(void) worker_flush(req);
	}
}

/*
 * worker_finish
 *		Detaches from the request's queue and segment and frees it.
 */
static void
worker_finish(WorkerRequest *req)
{
	dlist_delete(&req->node);
	shm_mq_detach(req->mqh);
	dsm_detach(req->seg);
	MemoryContextDelete(req->context);
}

/* ---------------------------------------------------------------------------------------------
 * Statistics
 * ------------------------------------------------------------------------------------------- */

/* time constant of pg_stat_cai's recent_tokens_per_second */
#define RECENT_RATE_SECONDS 10.0

/*
 * update_recent_rate
 *		Folds the tokens the engine generated since the last call into an exponentially
 *		weighted rate with a time constant of RECENT_RATE_SECONDS of wall-clock time, idle time
 *		included, so the figure is the current throughput and decays to 0 when the engine goes
 *		quiet.  Weighting each interval by its length keeps the average right however irregular
 *		the calls are.  A new engine process counts from zero again.
 */
static double
update_recent_rate(EngineSlot *e, TimestampTz now)
{
	uint64		generated_tokens = e->stats.generated_tokens;

	if (e->rate_time != 0 && now > e->rate_time && generated_tokens >= e->rate_tokens)
	{
		double		dt = (double) (now - e->rate_time) / USECS_PER_SEC;
		double		instant = (double) (generated_tokens - e->rate_tokens) / dt;

		e->rate += (1.0 - exp(-dt / RECENT_RATE_SECONDS)) * (instant - e->rate);
	}
	e->rate_time = now;
	e->rate_tokens = generated_tokens;
	return e->rate;
}

/*
 * worker_publish_stats
 *		Copies the engines' latest statistics and the worker's counters into shared memory:
 *		when any changed or when forced, else at most every second.  Takes the pg_cai lock
 *		exclusively.
 */
static void
worker_publish_stats(bool force)
{
	TimestampTz now = GetCurrentTimestamp();
	double		rates[CAI_MAX_MODELS];

	for (int i = 0; i < CAI_MAX_MODELS; i++)
		force |= engines[i].active && (engines[i].stats_received || engines[i].counters_changed);
	if (!force && !TimestampDifferenceExceeds(last_stats_publish, now, 1000))
		return;
	last_stats_publish = now;
	for (int i = 0; i < CAI_MAX_MODELS; i++)
	{
		engines[i].stats_received = false;
		engines[i].counters_changed = false;
		rates[i] = engines[i].active ? update_recent_rate(&engines[i], now) : 0.0;
	}

	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < CAI_MAX_MODELS; i++)
	{
		CaiModelSlot *slot = &cai_shared->models[i];

		if (!engines[i].active)
			continue;
		slot->engine_stats = engines[i].stats;
		/* requests the worker holds for their engine wait as much as those in its queue */
		slot->engine_stats.waiting += engines[i].n_waiting;
		slot->engine_stats.requests_rejected += engines[i].n_refused_for_role;
		slot->counters = engines[i].counters;
		slot->recent_tokens_per_second = rates[i];
	}
	cai_shared->stats_updated = now;
	LWLockRelease(cai_shared->lock);
}
