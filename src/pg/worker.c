/*
 * worker.c — the engine worker: intake of requests, relay to the engine process, supervision.
 *
 * One background worker per cluster.  It knows no database and no model: it attaches to each
 * posted request segment, relays the request's payload to the engine process (engine_process.c)
 * over their socket, and copies what the engine answers into the request's response queue.
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
 * must exceed the engine's longest step; the worker warns when a step takes half of it.
 *
 * A configuration reload that changes the engine's settings (pg_cai.model, device, threads,
 * context, cache size, ...) starts a new engine once the requests in flight have finished, or
 * after pg_cai.reload_grace, failing the rest with a retryable error; new requests wait in the
 * ring meanwhile.
 *
 * Each request is in one explicit state (pg_cron's habit), changed only by request_set_state:
 *
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
#include "shmem.h"
#include "worker.h"

/* PgCaiEngineWorker: the worker waiting for its latch or the engine (pg_compat.h) */
static uint32 worker_wait_event = 0;

typedef enum WorkerRequestState
{
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

typedef struct WorkerRequest
{
	dlist_node	node;
	MemoryContext context;		/* the request and its outbox live here */
	dsm_segment *seg;
	CaiRequestHeader *header;
	shm_mq_handle *mqh;
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

/* The worker is one process: its state is plain statics. */
static MemoryContext worker_context = NULL;
static uint64 worker_generation = 0;
static dlist_head worker_requests = DLIST_STATIC_INIT(worker_requests);
static uint64 next_request_id = 0;
static CaiWorkerCounters worker_counters;
static bool counters_changed = false;
static cai_engine_stats engine_stats;
static bool stats_received = false;
static TimestampTz last_stats_publish = 0;
static CaiWorkerState worker_state = CAI_WORKER_NOT_RUNNING;

/* The engine process and its supervision */
static CaiEngineProcess engine;
static WaitEventSet *wait_set = NULL;
static int	socket_event = -1;	/* the socket's position in wait_set; -1 when none */
static bool socket_wants_write = false;
static bool engine_ready = false;	/* it sent READY */
static bool engine_stopping = false;	/* the worker ends it: its exit is no crash */
static bool engine_reported_failure = false;	/* it sent FAILED: no restart until a reload */
static TimestampTz engine_start_time = 0;
static TimestampTz engine_ready_time = 0;
static TimestampTz next_start_time = 0; /* when to start one; 0: none planned */
static int	consecutive_crashes = 0;
static bool settings_served = false;	/* an engine with the current settings became ready */

/* Hang supervision of a ready engine */
static TimestampTz engine_last_heard = 0;	/* the last frame of any kind */
static bool engine_unresponsive = false;	/* silent for half of the hang timeout */
static bool engine_hung = false;	/* killed for its silence: its exit is no plain crash */
static bool engine_step_warned = false; /* logged that a step took half of the timeout */
static StringInfoData engine_settings;	/* the settings the last engine was started with */
static bool restart_pending = false;	/* a reload changed them: restart once drained */
static TimestampTz restart_deadline = 0;

static void worker_shutdown(int code, Datum arg);
static void worker_reload(void);
static void engine_start(void);
static void engine_receive(void);
static void engine_supervise(void);
static void engine_watch(TimestampTz now);
static void engine_send(void);
static void worker_intake(void);
static void worker_check_abandoned(void);
static bool worker_flush(WorkerRequest *req);
static void worker_flush_all(void);
static void worker_finish(WorkerRequest *req);
static void worker_publish_stats(bool force);
static long worker_timeout_ms(void);

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

static void
set_state(CaiWorkerState state)
{
	worker_state = state;
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	cai_shared->state = state;
	/* an unresponsive engine still holds its model: it may answer again */
	if (state != CAI_WORKER_READY && state != CAI_WORKER_UNRESPONSIVE)
		memset(&cai_shared->model, 0, sizeof(cai_shared->model));
	LWLockRelease(cai_shared->lock);
}

/*
 * set_failed
 *		Records why there is no model and logs it; calls fail at once with the reason.
 */
static void
set_failed(const char *reason, const char *hint)
{
	ereport(LOG,
			(errmsg("pg_cai engine worker has no model: %s", reason),
			 errhint("%s", hint)));
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	strlcpy(cai_shared->reason, reason, sizeof(cai_shared->reason));
	strlcpy(cai_shared->hint, hint, sizeof(cai_shared->hint));
	LWLockRelease(cai_shared->lock);
	set_state(CAI_WORKER_FAILED);
}

/*
 * CaiWorkerMain
 *		Entry point of the engine worker.
 */
void
CaiWorkerMain(Datum main_arg)
{
	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	/* the engine process is reaped with waitpid */
	pqsignal(SIGCHLD, SIG_DFL);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	worker_context = AllocSetContextCreate(TopMemoryContext,
										   "pg_cai worker",
										   ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(worker_context);
	initStringInfo(&engine_settings);
	CaiEngineProcessInit(&engine);

	/* Announce this incarnation. */
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	worker_generation = pg_atomic_add_fetch_u64(&cai_shared->generation, 1);
	cai_shared->worker_pid = MyProcPid;
	cai_shared->worker_proc = MyProc;
	cai_shared->worker_started = GetCurrentTimestamp();
	cai_shared->reason[0] = '\0';
	cai_shared->hint[0] = '\0';
	cai_shared->engine_pid = 0;
	memset(&cai_shared->engine_stats, 0, sizeof(cai_shared->engine_stats));
	LWLockRelease(cai_shared->lock);
	set_state(CAI_WORKER_LOADING);

	before_shmem_exit(worker_shutdown, (Datum) 0);

	next_start_time = GetCurrentTimestamp();
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

		engine_receive();
		engine_supervise();
		worker_intake();
		worker_check_abandoned();
		engine_send();

		/*
		 * Publish before delivering: a backend that has its reply and then reads pg_stat_cai
		 * must see counters that include its request (the engine sends its statistics ahead of
		 * the messages of a step in which a generation finished).
		 */
		worker_publish_stats(stats_received || counters_changed);
		worker_flush_all();

		if (wait_set == NULL)
		{
			wait_set = CaiCreateWaitEventSet(worker_context, 3);
			AddWaitEventToSet(wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
			AddWaitEventToSet(wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
			socket_event = -1;
			socket_wants_write = false;
			if (engine.sock >= 0)
				socket_event = AddWaitEventToSet(wait_set, WL_SOCKET_READABLE, engine.sock,
												 NULL, NULL);
		}
		if (socket_event >= 0 && socket_wants_write != (engine.out.len > engine.out_sent))
		{
			socket_wants_write = !socket_wants_write;
			ModifyWaitEvent(wait_set, socket_event,
							WL_SOCKET_READABLE | (socket_wants_write ? WL_SOCKET_WRITEABLE : 0),
							NULL);
		}
		(void) WaitEventSetWait(wait_set, worker_timeout_ms(), &event, 1,
								CaiWaitEvent("PgCaiEngineWorker", &worker_wait_event));
	}
}

/*
 * worker_timeout_ms
 *		How long the worker may sleep: until a planned engine start, a reload's deadline, the
 *		engine's silence crossing a threshold of its hang timeout, or a backend reading its
 *		outbox (a backend that reads sets the latch; the timeout only bounds a missed wake-up);
 *		otherwise a second, which bounds how stale the statistics get.
 */
static long
worker_timeout_ms(void)
{
	long		timeout = 1000;
	dlist_iter	iter;

	if (next_start_time != 0)
	{
		long		secs;
		int			usecs;

		TimestampDifference(GetCurrentTimestamp(), next_start_time, &secs, &usecs);
		timeout = Min(timeout, secs * 1000 + usecs / 1000 + 1);
	}
	if (restart_pending)
		timeout = Min(timeout, 100);
	if (engine_ready && cai_engine_hang_timeout_ms > 0)
	{
		/* wake for the next threshold of the engine's silence: half the timeout, then all */
		int			threshold = engine_unresponsive ? cai_engine_hang_timeout_ms :
			cai_engine_hang_timeout_ms / 2;
		long		secs;
		int			usecs;

		TimestampDifference(GetCurrentTimestamp(),
							TimestampTzPlusMilliseconds(engine_last_heard, threshold),
							&secs, &usecs);
		timeout = Min(timeout, secs * 1000 + usecs / 1000 + 1);
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
 *		Ends the engine process and tells backends the worker is gone.  Requests in flight see
 *		their queue detach when the process detaches its segments after this.
 */
static void
worker_shutdown(int code, Datum arg)
{
	char		exit_text[CAI_EXIT_TEXT_SIZE];

	if (engine.pid != 0)
		(void) CaiEngineProcessStop(&engine, true, exit_text, sizeof(exit_text));

	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	cai_shared->worker_pid = 0;
	cai_shared->worker_proc = NULL;
	cai_shared->engine_pid = 0;
	cai_shared->state = CAI_WORKER_NOT_RUNNING;
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
 *		The one place a request changes state, and the worker's counters with it.  rejected:
 *		an error that is the engine's admission refusal, which the engine counts itself.
 */
static void
request_set_state(WorkerRequest *req, WorkerRequestState state, bool rejected)
{
	bool		in_engine = req->state == REQUEST_SENT || req->state == REQUEST_STREAMING;

	switch (state)
	{
		case REQUEST_SENT:
		case REQUEST_STREAMING:
			break;
		case REQUEST_DONE:
			worker_counters.requests_completed++;
			break;
		case REQUEST_FAILED:
			if (!rejected)
				worker_counters.requests_failed++;
			break;
		case REQUEST_CANCELLED:
			if (in_engine)
			{
				size_t		frame = cai_frame_begin(&engine.out, CAI_FRAME_CANCEL, req->id);

				cai_frame_end(&engine.out, frame);
				worker_counters.requests_abandoned++;
			}
			break;
	}
	req->state = state;
	counters_changed = true;
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
 * fail_in_flight
 *		Fails every request the engine process has (it died, or is being replaced); returns how
 *		many.
 */
static int
fail_in_flight(int32 status, const char *message)
{
	dlist_iter	iter;
	int			n = 0;

	dlist_foreach(iter, &worker_requests)
	{
		WorkerRequest *req = dlist_container(WorkerRequest, node, iter.cur);

		if (req->state == REQUEST_SENT || req->state == REQUEST_STREAMING)
		{
			request_fail(req, status, message);
			n++;
		}
	}
	return n;
}

static int
count_in_flight(void)
{
	dlist_iter	iter;
	int			n = 0;

	dlist_foreach(iter, &worker_requests)
	{
		WorkerRequest *req = dlist_container(WorkerRequest, node, iter.cur);

		if (req->state == REQUEST_SENT || req->state == REQUEST_STREAMING)
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
	return true;
}

/*
 * worker_takes_requests
 *		Requests leave the ring while an engine serves (and no restart is pending, and it is not
 *		silent), or while the worker has no model, to hear why.  Otherwise they wait there for
 *		the engine, or for the one that replaces it.
 */
static bool
worker_takes_requests(void)
{
	if (worker_state == CAI_WORKER_FAILED)
		return true;
	return engine_ready && !engine_unresponsive && !restart_pending && !engine.closed;
}

/*
 * worker_intake
 *		Takes posted requests from the ring: attaches to each segment, becomes the sender of its
 *		response queue, and relays it to the engine (or answers it with the reason there is no
 *		model).  Takes the pg_cai lock briefly per request.
 */
static void
worker_intake(void)
{
	dsm_handle	handle;

	while (worker_takes_requests() && CaiRingPeek(&handle))
	{
		dsm_segment *seg;
		CaiRequestHeader *header;
		WorkerRequest *req;
		MemoryContext context;
		MemoryContext old;
		shm_mq	   *mq;

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

		/* Accept before popping: a successor worker finds the request if we die in between. */
		pg_atomic_write_u64(&header->accepted_generation, worker_generation);
		CaiRingPop(handle);

		context = AllocSetContextCreate(worker_context, "pg_cai request",
										ALLOCSET_SMALL_SIZES);
		old = MemoryContextSwitchTo(context);
		req = palloc0(sizeof(WorkerRequest));
		req->context = context;
		req->seg = seg;
		req->header = header;
		req->id = ++next_request_id;
		req->backend_pid = header->backend_pid;
		mq = (shm_mq *) ((char *) header + header->queue_offset);
		shm_mq_set_sender(mq, MyProc);
		req->mqh = shm_mq_attach(mq, seg, NULL);
		MemoryContextSwitchTo(old);

		dlist_push_tail(&worker_requests, &req->node);
		worker_counters.requests_received++;

		if (worker_state == CAI_WORKER_FAILED)
		{
			char		reason[CAI_REASON_SIZE];

			LWLockAcquire(cai_shared->lock, LW_SHARED);
			strlcpy(reason, cai_shared->reason, sizeof(reason));
			LWLockRelease(cai_shared->lock);
			req->state = REQUEST_SENT;	/* answered at once, as if by an engine */
			request_fail(req, CAI_WIRE_STATUS_MODEL_UNAVAILABLE, reason);
		}
		else
		{
			size_t		frame = cai_frame_begin(&engine.out, CAI_FRAME_REQUEST, req->id);

			cai_put_u32(&engine.out, header->kind);
			cai_put_bytes(&engine.out, (char *) header + header->payload_offset,
						  header->payload_size);
			cai_frame_end(&engine.out, frame);
			request_set_state(req, REQUEST_SENT, false);
		}
		(void) worker_flush(req);
	}
}

/* ---------------------------------------------------------------------------------------------
 * The engine process
 * ------------------------------------------------------------------------------------------- */

/* The engine binary: `cai`, installed beside the server's own programs. */
static void
engine_binary_path(char *path)
{
	strlcpy(path, my_exec_path, MAXPGPATH);
	get_parent_directory(path);
	join_path_components(path, path, "cai");
}

/* The model file: pg_cai.model, relative to the data directory unless absolute. */
static void
model_file_path(char *path)
{
	if (is_absolute_path(cai_model_path))
		strlcpy(path, cai_model_path, MAXPGPATH);
	else
		snprintf(path, MAXPGPATH, "%s/%s", DataDir, cai_model_path);
}

/*
 * engine_arguments
 *		The engine's command line from the settings, and those settings as one string to tell
 *		whether a reload changed them (max_queue_wait is applied to a running engine instead).
 */
static char **
engine_arguments(StringInfo settings)
{
	char		model[MAXPGPATH];
	char	  **args = palloc0(sizeof(char *) * 40);
	int			n = 0;

	model_file_path(model);
	args[n++] = pstrdup("pg_cai engine");
	args[n++] = pstrdup("serve");
	args[n++] = pstrdup("--fd");
	args[n++] = pstrdup("3");
	args[n++] = pstrdup("--model");
	args[n++] = pstrdup(model);
	args[n++] = pstrdup("--device");
	args[n++] = pstrdup(CaiDeviceSettingName(cai_device));
	args[n++] = pstrdup("--threads");
	args[n++] = psprintf("%d", cai_threads);
	args[n++] = pstrdup("--max-batch");
	args[n++] = psprintf("%d", cai_max_batch);
	args[n++] = pstrdup("--max-step-tokens");
	args[n++] = psprintf("%d", cai_max_step_tokens);
	args[n++] = pstrdup("--ctx");
	args[n++] = psprintf("%d", cai_context_length);
	args[n++] = pstrdup("--cache-mb");
	args[n++] = psprintf("%d", cai_host_cache_size_mb);
	args[n++] = pstrdup("--max-queue");
	args[n++] = psprintf("%d", cai_max_queue);
	if (cai_chat_template != NULL && cai_chat_template[0] != '\0')
	{
		args[n++] = pstrdup("--template");
		args[n++] = pstrdup(cai_chat_template);
	}
	args[n++] = pstrdup("--weights");
	args[n++] = pstrdup(cai_weights_mode_name((cai_weights_mode) cai_weights));
	if (cai_weight_rounding == CAI_ROUNDING_GPTQ)
		args[n++] = pstrdup("--gptq-rounding");
	if (cai_activation_precision == CAI_ACTIVATIONS_TWO_DIGIT)
		args[n++] = pstrdup("--two-digit-activations");
	if (cai_weights_cache != NULL && cai_weights_cache[0] != '\0')
	{
		args[n++] = pstrdup("--weights-cache");
		args[n++] = is_absolute_path(cai_weights_cache) ? pstrdup(cai_weights_cache) :
			psprintf("%s/%s", DataDir, cai_weights_cache);
	}
	resetStringInfo(settings);
	for (int i = 0; i < n; i++)
		appendStringInfo(settings, "%s%s", i > 0 ? " " : "", args[i]);
	args[n++] = pstrdup("--max-queue-wait-ms");
	args[n++] = psprintf("%d", cai_max_queue_wait_ms);
	Assert(n < 32);
	return args;
}

/* A new socket means a new wait event set; it is made before the next wait. */
static void
forget_wait_set(void)
{
	if (wait_set != NULL)
		FreeWaitEventSet(wait_set);
	wait_set = NULL;
	socket_event = -1;
}

/*
 * engine_start
 *		Starts an engine process with the current settings.  Without a model, or when the binary
 *		cannot be executed, the worker goes to the failed state instead.
 */
static void
engine_start(void)
{
	char		path[MAXPGPATH];
	char		reason[CAI_REASON_SIZE];
	char	  **args;
	MemoryContext old = MemoryContextSwitchTo(worker_context);

	args = engine_arguments(&engine_settings);
	MemoryContextSwitchTo(old);
	engine_ready = false;
	engine_stopping = false;
	engine_reported_failure = false;
	engine_unresponsive = false;
	engine_hung = false;
	engine_step_warned = false;

	if (cai_model_path == NULL || cai_model_path[0] == '\0')
	{
		engine_reported_failure = true;
		set_failed("no model is configured",
				   "Set pg_cai.model in postgresql.conf to the path of a GGUF model file and reload the configuration (SELECT pg_reload_conf()).");
		return;
	}

	engine_binary_path(path);
	if (!CaiEngineProcessStart(&engine, path, args, reason, sizeof(reason)))
	{
		engine_reported_failure = true;
		set_failed(reason,
				   "Install pg_cai completely: \"make install\" puts the cai program beside the server's programs.");
		return;
	}
	forget_wait_set();
	engine_start_time = GetCurrentTimestamp();

	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	cai_shared->engine_pid = engine.pid;
	cai_shared->engine_starts++;
	cai_shared->engine_started = engine_start_time;
	LWLockRelease(cai_shared->lock);
	/* after a crash the state says "restarting" until the new engine is ready */
	if (worker_state != CAI_WORKER_RESTARTING)
		set_state(CAI_WORKER_LOADING);

	ereport(LOG,
			(errmsg("pg_cai engine worker started engine process %d: %s", (int) engine.pid,
					engine_settings.data)));
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
 * engine_exited
 *		The engine process closed its socket, broke the protocol, was killed for its silence,
 *		or is being replaced: reaps it and decides what comes next.  A crash fails the requests
 *		in flight (a request that was running is never retried blindly: it may be what crashed
 *		the engine) and plans a restart after a backoff.
 */
static void
engine_exited(void)
{
	char		exit_text[CAI_EXIT_TEXT_SIZE];
	char		message[CAI_REASON_SIZE];
	int			pid = (int) engine.pid;
	bool		was_ready = engine_ready;
	bool		broken = engine.broken;
	bool		hung = engine_hung;
	const char *cause;
	TimestampTz now = GetCurrentTimestamp();
	int			n_failed;
	int			delay;

	(void) CaiEngineProcessStop(&engine, broken || engine_stopping, exit_text, sizeof(exit_text));
	forget_wait_set();
	engine_ready = false;
	engine_unresponsive = false;
	engine_hung = false;
	memset(&engine_stats, 0, sizeof(engine_stats));
	stats_received = true;
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	cai_shared->engine_pid = 0;
	strlcpy(cai_shared->engine_last_exit, exit_text, sizeof(cai_shared->engine_last_exit));
	LWLockRelease(cai_shared->lock);

	if (engine_stopping)
	{
		engine_stopping = false;
		ereport(LOG,
				(errmsg("pg_cai engine process %d stopped to apply a configuration change (%s)",
						pid, exit_text)));
		return;
	}
	if (engine_reported_failure)
		return;					/* it said why; the worker stays failed until a reload */

	cause = hung ? " after it stopped responding" :
		broken ? " after sending a malformed message" : "";
	if (hung)
		snprintf(message, sizeof(message),
				 "The engine process (PID %d) sent nothing for pg_cai.engine_hang_timeout (%d ms) and was killed (%s).",
				 pid, cai_engine_hang_timeout_ms, exit_text);
	else
		snprintf(message, sizeof(message), "The engine process (PID %d) %s%s.", pid, exit_text,
				 cause);
	n_failed = fail_in_flight(hung ? CAI_WIRE_STATUS_ENGINE_HUNG : CAI_WIRE_STATUS_ENGINE_CRASHED,
							  message);
	consecutive_crashes++;
	delay = restart_delay_ms(consecutive_crashes);
	next_start_time = TimestampTzPlusMilliseconds(now, delay);

	ereport(LOG,
			(errmsg("pg_cai engine process %d %s%s", pid, exit_text, cause),
			 errdetail("%d request(s) in flight failed; no PostgreSQL session was affected. The engine restarts in %d ms (crash %d in a row).",
					   n_failed, delay, consecutive_crashes)));

	/*
	 * A crash while loading a model that an engine with these settings has served is a
	 * restart like another (the new engine died young, say under memory pressure), until it
	 * happens too often in a row: then calls should fail with the reason instead of waiting.
	 */
	if (was_ready || (settings_served && consecutive_crashes <= LOAD_CRASHES_TOLERATED))
		set_state(CAI_WORKER_RESTARTING);
	else
	{
		char		reason[CAI_REASON_SIZE];

		snprintf(reason, sizeof(reason),
				 "the engine process crashed while loading the model (%s)", exit_text);
		set_failed(reason,
				   "See the server log; the engine is started again with a growing delay, or at once after a configuration reload.");
	}
}

/*
 * engine_watch
 *		Supervises a ready engine's heartbeat (any frame counts): silent for half of
 *		pg_cai.engine_hang_timeout, it is marked unresponsive; for all of it, it is killed, and
 *		engine_exited fails its requests and plans its restart.  The socket is read before this
 *		runs, so a worker that was itself held up does not blame the engine.
 */
static void
engine_watch(TimestampTz now)
{
	long		silent_ms;

	if (engine.pid == 0 || !engine_ready || cai_engine_hang_timeout_ms <= 0)
		return;
	silent_ms = (long) ((now - engine_last_heard) / 1000);
	if (silent_ms >= cai_engine_hang_timeout_ms)
	{
		ereport(LOG,
				(errmsg("pg_cai engine process %d stopped responding: nothing received for %ld ms, over pg_cai.engine_hang_timeout (%d ms); killing it",
						(int) engine.pid, silent_ms, cai_engine_hang_timeout_ms),
				 errdetail("Its %d request(s) in flight fail, and the engine is restarted.",
						   count_in_flight())));
		(void) kill(engine.pid, SIGKILL);
		engine_hung = true;
		engine_exited();
	}
	else if (!engine_unresponsive && silent_ms >= cai_engine_hang_timeout_ms / 2)
	{
		engine_unresponsive = true;
		set_state(CAI_WORKER_UNRESPONSIVE);
		ereport(LOG,
				(errmsg("pg_cai engine process %d is unresponsive: nothing received for %ld ms; it is killed at %d ms (pg_cai.engine_hang_timeout)",
						(int) engine.pid, silent_ms, cai_engine_hang_timeout_ms)));
	}
}

/*
 * engine_heard
 *		The engine sent something: it is alive.  An engine that was unresponsive serves again,
 *		and one that has served for STABLE_PERIOD_MS starts the crash backoff over.
 */
static void
engine_heard(TimestampTz now)
{
	engine_last_heard = now;
	if (engine_unresponsive && engine_ready)
	{
		engine_unresponsive = false;
		set_state(CAI_WORKER_READY);
		ereport(LOG,
				(errmsg("pg_cai engine process %d responds again", (int) engine.pid)));
	}
	if (engine_ready && consecutive_crashes > 0 &&
		TimestampDifferenceExceeds(engine_ready_time, now, STABLE_PERIOD_MS))
		consecutive_crashes = 0;
}

/*
 * engine_heartbeat_frame
 *		A heartbeat carries the engine's longest step so far: warn once per engine when one took
 *		half of the hang timeout, before a longer one gets the engine killed.
 */
static void
engine_heartbeat_frame(cai_reader *reader)
{
	double		longest_step;

	if (!cai_get_f64(reader, &longest_step))
	{
		engine.broken = true;
		return;
	}
	if (!engine_step_warned && cai_engine_hang_timeout_ms > 0 &&
		longest_step * 1000.0 >= cai_engine_hang_timeout_ms / 2.0)
	{
		engine_step_warned = true;
		ereport(WARNING,
				(errmsg("pg_cai engine process %d took %.1f s for one step, over half of pg_cai.engine_hang_timeout (%d ms)",
						(int) engine.pid, longest_step, cai_engine_hang_timeout_ms),
				 errhint("Raise pg_cai.engine_hang_timeout above the longest step, or lower pg_cai.max_step_tokens: an engine silent for the whole timeout is killed.")));
	}
}

/*
 * engine_ready_frame
 *		The engine says which model it serves: publish it and start taking requests.
 */
static void
engine_ready_frame(const char *body, uint32 len)
{
	cai_reader	reader;
	cai_wire_model model;
	char		path[MAXPGPATH];

	cai_reader_init(&reader, body, len);
	if (!cai_wire_get_model(&reader, &model))
	{
		engine.broken = true;
		return;
	}
	if (model.version != CAI_WIRE_VERSION)
	{
		char		reason[CAI_REASON_SIZE];

		snprintf(reason, sizeof(reason),
				 "the engine binary speaks protocol version %u, the extension version %u",
				 model.version, CAI_WIRE_VERSION);
		engine_reported_failure = true;
		engine.broken = true;
		set_failed(reason, "Install the cai program and the pg_cai library from the same build.");
		return;
	}
	model_file_path(path);
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	strlcpy(cai_shared->model.path, path, sizeof(cai_shared->model.path));
	cai_shared->model.info = model;
	cai_shared->reason[0] = '\0';
	cai_shared->hint[0] = '\0';
	LWLockRelease(cai_shared->lock);
	engine_ready = true;
	engine_ready_time = engine_last_heard = GetCurrentTimestamp();
	settings_served = true;
	set_state(CAI_WORKER_READY);

	ereport(LOG,
			(errmsg("pg_cai engine worker ready: model \"%s\" (%s), %s, context %d tokens, loaded in %.1f s, engine process %d",
					model.name, model.arch, model.device, model.context_length,
					model.load_seconds, (int) engine.pid)));
}

static WorkerRequest *
find_request(uint64 id)
{
	dlist_iter	iter;

	dlist_foreach(iter, &worker_requests)
	{
		WorkerRequest *req = dlist_container(WorkerRequest, node, iter.cur);

		if (req->id == id)
			return req;
	}
	return NULL;
}

/*
 * engine_frame
 *		One frame from the engine process.  Nothing it sends is trusted: a frame that does not
 *		parse marks the engine broken, and it is replaced.
 */
static void
engine_frame(const cai_frame_header *h, const char *body)
{
	cai_reader	reader;

	cai_reader_init(&reader, body, h->body_len);
	switch (h->type)
	{
		case CAI_FRAME_READY:
			engine_ready_frame(body, h->body_len);
			break;

		case CAI_FRAME_FAILED:
			{
				const char *reason;
				const char *hint;
				uint32		reason_len;
				uint32		hint_len;

				if (!cai_get_text(&reader, &reason, &reason_len) ||
					!cai_get_text(&reader, &hint, &hint_len))
				{
					engine.broken = true;
					break;
				}
				engine_reported_failure = true;
				set_failed(pnstrdup(reason, Min(reason_len, CAI_REASON_SIZE - 1)),
						   pnstrdup(hint, Min(hint_len, CAI_REASON_SIZE - 1)));
				break;
			}

		case CAI_FRAME_MESSAGE:
			{
				WorkerRequest *req = find_request(h->id);

				if (h->body_len < 1)
				{
					engine.broken = true;
					break;
				}
				/* a request the backend left, or one already answered: nothing to deliver */
				if (req != NULL &&
					(req->state == REQUEST_SENT || req->state == REQUEST_STREAMING))
					request_answered(req, body, h->body_len);
				break;
			}

		case CAI_FRAME_HEARTBEAT:
			engine_heartbeat_frame(&reader);
			break;

		case CAI_FRAME_STATS:
			if (!cai_wire_get_stats(&reader, &engine_stats))
				engine.broken = true;
			stats_received = true;
			break;

		case CAI_FRAME_LOG:
			{
				const char *line;
				uint32		len;

				if (!cai_get_text(&reader, &line, &len))
					engine.broken = true;
				else
					ereport(LOG, (errmsg("pg_cai engine process %d: %.*s", (int) engine.pid,
										 (int) Min(len, 1024), line)));
				break;
			}

		default:
			engine.broken = true;
			break;
	}
}

/*
 * engine_receive
 *		Handles what the engine process sent, and notices that it ended.
 */
static void
engine_receive(void)
{
	cai_frame_header h;
	const char *body;
	bool		heard = false;

	if (engine.pid == 0)
		return;
	CaiEngineProcessRead(&engine);
	while (!engine.broken && CaiEngineProcessNextFrame(&engine, &h, &body))
	{
		engine_frame(&h, body);
		heard = true;
	}
	if (engine.closed || engine.broken)
		engine_exited();
	else if (heard)
		engine_heard(GetCurrentTimestamp());
}

/*
 * engine_supervise
 *		Kills an engine that stopped responding, starts an engine when one is due, and replaces
 *		the running one when a reload changed its settings and its requests are done (or the
 *		grace is over).
 */
static void
engine_supervise(void)
{
	TimestampTz now = GetCurrentTimestamp();

	engine_watch(now);
	if (restart_pending && engine.pid != 0 &&
		(count_in_flight() == 0 || now >= restart_deadline))
	{
		(void) fail_in_flight(CAI_WIRE_STATUS_ENGINE_RESTARTED,
							  "The engine was restarted to apply a configuration change.");
		engine_stopping = true;
		engine_exited();
	}
	if (restart_pending && engine.pid == 0)
	{
		restart_pending = false;
		consecutive_crashes = 0;
		next_start_time = now;
	}
	if (engine.pid == 0 && next_start_time != 0 && now >= next_start_time)
	{
		next_start_time = 0;
		engine_start();
	}
}

/*
 * engine_send
 *		Writes what it can of the frames queued for the engine.
 */
static void
engine_send(void)
{
	if (engine.pid != 0)
		(void) CaiEngineProcessWrite(&engine);
	else
	{
		cai_wbuf_reset(&engine.out);
		engine.out_sent = 0;
	}
}

/*
 * worker_reload
 *		Applies a configuration reload: admission limits to the running engine at once; other
 *		engine settings by a new engine process.
 */
static void
worker_reload(void)
{
	StringInfoData settings;
	MemoryContext old;

	ProcessConfigFile(PGC_SIGHUP);

	if (engine.pid != 0)
	{
		size_t		frame = cai_frame_begin(&engine.out, CAI_FRAME_LIMITS, 0);

		cai_put_i32(&engine.out, cai_max_queue);
		cai_put_f64(&engine.out, (double) cai_max_queue_wait_ms);
		cai_frame_end(&engine.out, frame);
	}

	old = MemoryContextSwitchTo(worker_context);
	initStringInfo(&settings);
	(void) engine_arguments(&settings);
	MemoryContextSwitchTo(old);
	if (strcmp(settings.data, engine_settings.data) == 0)
		return;
	settings_served = false;

	if (engine.pid == 0)
	{
		/* none runs (no model, or a crash backoff): start one with the new settings now */
		consecutive_crashes = 0;
		next_start_time = GetCurrentTimestamp();
		ereport(LOG, (errmsg("pg_cai configuration changed: starting the engine")));
		return;
	}
	restart_pending = true;
	restart_deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), cai_reload_grace_ms);
	ereport(LOG,
			(errmsg("pg_cai configuration changed: the engine restarts with it once %d request(s) in flight finish, within %d ms",
					count_in_flight(), cai_reload_grace_ms)));
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
 *		Folds the tokens generated since the last call into an exponentially weighted rate with a
 *		time constant of RECENT_RATE_SECONDS of wall-clock time, idle time included, so the figure
 *		is the current throughput and decays to 0 when the engine goes quiet.  Weighting each
 *		interval by its length keeps the average right however irregular the calls are.  A new
 *		engine process counts from zero again.
 */
static double
update_recent_rate(TimestampTz now, uint64 generated_tokens)
{
	static TimestampTz last_time = 0;
	static uint64 last_tokens = 0;
	static double rate = 0.0;

	if (last_time != 0 && now > last_time && generated_tokens >= last_tokens)
	{
		double		dt = (double) (now - last_time) / USECS_PER_SEC;
		double		instant = (double) (generated_tokens - last_tokens) / dt;

		rate += (1.0 - exp(-dt / RECENT_RATE_SECONDS)) * (instant - rate);
	}
	last_time = now;
	last_tokens = generated_tokens;
	return rate;
}

/*
 * worker_publish_stats
 *		Copies the engine's latest statistics and the worker's counters into shared memory:
 *		when forced, else at most every second.  Takes the pg_cai lock exclusively.
 */
static void
worker_publish_stats(bool force)
{
	TimestampTz now = GetCurrentTimestamp();
	double		recent_rate;

	if (!force && !TimestampDifferenceExceeds(last_stats_publish, now, 1000))
		return;
	last_stats_publish = now;
	stats_received = false;
	counters_changed = false;
	recent_rate = update_recent_rate(now, engine_stats.generated_tokens);

	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	cai_shared->engine_stats = engine_stats;
	cai_shared->counters = worker_counters;
	cai_shared->stats_updated = now;
	cai_shared->recent_tokens_per_second = recent_rate;
	LWLockRelease(cai_shared->lock);
}
