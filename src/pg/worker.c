/*
 * worker.c — the engine worker: loads the model, takes requests, runs the engine, streams tokens.
 *
 * One background worker per cluster owns the model (and the GPU, where there is one).  It knows
 * no database: it attaches to each posted request segment, turns the request into token ids,
 * submits it to the engine, and runs engine steps while any request waits or runs; each step's
 * tokens go back over the request's response queue.  Between steps it takes new requests and
 * drops the ones whose backend went away (cancel, statement_timeout, error), which frees their
 * KV at once.
 *
 * A request moves through these states (pg_cron's habit: one explicit state per request):
 *
 *   REQUEST_RUNNING   submitted to the engine; token events are forwarded as they come
 *   REQUEST_DRAINING  answered (final result or error queued); waiting for the backend to read
 *                     the rest of its queue, then detached
 *
 * The worker never blocks on a backend: every send is non-blocking, and what does not fit in a
 * response queue waits in the request's outbox until the backend reads.
 *
 * If the model cannot be loaded the worker logs why, records the reason in shared memory and
 * stays up, answering every request with that reason.  It waits on its latch with
 * PG_WAIT_EXTENSION: PostgreSQL 15 has no API for named custom wait events, so pg_stat_activity
 * shows wait_event "Extension" for the worker and for backends waiting on it.
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
#include "storage/pmsignal.h"
#include "storage/dsm.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/shm_mq.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "cai.h"
#include "guc.h"
#include "protocol.h"
#include "shmem.h"
#include "worker.h"

typedef enum WorkerRequestState
{
	REQUEST_RUNNING,
	REQUEST_DRAINING
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
	MemoryContext context;		/* everything below lives here */
	dsm_segment *seg;
	CaiRequestHeader *header;
	shm_mq_handle *mqh;
	CaiRequestKind kind;
	WorkerRequestState state;
	int			backend_pid;

	/* generation requests */
	bool		in_engine;
	uint64		engine_id;
	StringInfoData text;		/* text sent so far */
	int32	   *generated;		/* generated ids, end-of-turn excluded */
	int			n_generated;
	int			generated_capacity;
	int32	   *user_tokens;	/* the last turn's content ids (CHAT) */
	int			n_user_tokens;
	int			first_message;

	OutboxMessage *outbox_head;
	OutboxMessage *outbox_tail;
} WorkerRequest;

/* The worker's state: a single process, so plain statics are the natural home. */
static MemoryContext worker_context = NULL;
static cai_model *worker_model = NULL;
static cai_engine *worker_engine = NULL;
static cai_model_info worker_model_info;
static int	worker_context_length = 0;
static uint64 worker_generation = 0;
static dlist_head worker_requests = DLIST_STATIC_INIT(worker_requests);
static CaiWorkerCounters worker_counters;
static TimestampTz last_stats_publish = 0;
static bool generation_finished = false;	/* a generation was answered since the last publish */

static void worker_shutdown(int code, Datum arg);
static void worker_load_model(void);
static void worker_intake(void);
static void worker_start_request(WorkerRequest *req);
static void worker_step(void);
static void worker_check_abandoned(void);
static bool worker_flush(WorkerRequest *req);
static void worker_flush_all(void);
static void worker_finish(WorkerRequest *req);
static void worker_publish_stats(bool force);

/*
 * CaiWorkerInit
 *		Registers the engine worker with the postmaster.  Called from _PG_init.  The worker is
 *		restarted one second after it exits abnormally (a crash, pg_terminate_backend).
 */
void
CaiWorkerInit(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS;
	worker.bgw_start_time = BgWorkerStart_PostmasterStart;
	worker.bgw_restart_time = 1;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "pg_cai");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "CaiWorkerMain");
	snprintf(worker.bgw_name, BGW_MAXLEN, "pg_cai engine worker");
	snprintf(worker.bgw_type, BGW_MAXLEN, "pg_cai engine worker");
	worker.bgw_main_arg = (Datum) 0;
	worker.bgw_notify_pid = 0;
	RegisterBackgroundWorker(&worker);
}

/*
 * Signals are blocked around engine calls that may start threads, so that the engine's threads
 * inherit a mask with every signal blocked: PostgreSQL's handlers must only run on the main
 * thread.  A signal that arrives meanwhile is delivered when the mask is restored.
 */
static void
block_signals(sigset_t *saved)
{
	sigset_t	all;

	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, saved);
}

static void
restore_signals(const sigset_t *saved)
{
	sigprocmask(SIG_SETMASK, saved, NULL);
}

/* Copies an engine string into a fixed buffer; NULL becomes "". */
static void
copy_string(char *dst, Size size, const char *src)
{
	strlcpy(dst, src ? src : "", size);
}

/*
 * set_failed
 *		Records why there is no model (takes the pg_cai lock) and logs it.
 */
static void
set_failed(const char *reason, const char *hint)
{
	ereport(LOG,
			(errmsg("pg_cai engine worker has no model: %s", reason),
			 errhint("%s", hint)));

	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	cai_shared->state = CAI_WORKER_FAILED;
	copy_string(cai_shared->reason, sizeof(cai_shared->reason), reason);
	copy_string(cai_shared->hint, sizeof(cai_shared->hint), hint);
	LWLockRelease(cai_shared->lock);
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
	BackgroundWorkerUnblockSignals();

	worker_context = AllocSetContextCreate(TopMemoryContext,
										   "pg_cai worker",
										   ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(worker_context);

	/* Announce this incarnation. */
	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	worker_generation = pg_atomic_add_fetch_u64(&cai_shared->generation, 1);
	cai_shared->worker_pid = MyProcPid;
	cai_shared->worker_proc = MyProc;
	cai_shared->state = CAI_WORKER_LOADING;
	cai_shared->worker_started = GetCurrentTimestamp();
	cai_shared->reason[0] = '\0';
	cai_shared->hint[0] = '\0';
	memset(&cai_shared->model, 0, sizeof(cai_shared->model));
	memset(&cai_shared->engine_stats, 0, sizeof(cai_shared->engine_stats));
	LWLockRelease(cai_shared->lock);

	before_shmem_exit(worker_shutdown, (Datum) 0);

	worker_load_model();

	for (;;)
	{
		bool		busy;

		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();

		/* WaitLatch notices postmaster death only when idle; a busy loop must look too */
		if (!PostmasterIsAlive())
			proc_exit(1);

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			if (worker_engine != NULL)
				cai_engine_set_admission_limits(worker_engine, cai_max_queue,
												(double) cai_max_queue_wait_ms);
		}

		worker_intake();
		worker_check_abandoned();
		if (worker_engine != NULL && cai_engine_has_work(worker_engine))
			worker_step();

		/*
		 * Publish before delivering: a backend that has its reply and then reads pg_stat_cai
		 * must see counters that include its request.  While busy, at most every 100 ms unless
		 * a generation finished in this step; going idle, the final state.
		 */
		busy = worker_engine != NULL && cai_engine_has_work(worker_engine);
		worker_publish_stats(!busy || generation_finished);
		generation_finished = false;
		worker_flush_all();

		if (!busy)
		{
			bool		outbox_pending = false;
			dlist_iter	iter;

			dlist_foreach(iter, &worker_requests)
			{
				WorkerRequest *req = dlist_container(WorkerRequest, node, iter.cur);

				if (req->outbox_head != NULL)
					outbox_pending = true;
			}

			/*
			 * A backend reading its queue sets our latch, so the timeout only bounds how stale
			 * the published statistics get.
			 */
			(void) WaitLatch(MyLatch,
							 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 outbox_pending ? 100L : 1000L,
							 PG_WAIT_EXTENSION);
		}
	}
}

/*
 * worker_shutdown
 *		Frees the engine (joining its threads) and tells backends the worker is gone.  Requests
 *		in flight see their queue detach when the process detaches its segments after this.
 */
static void
worker_shutdown(int code, Datum arg)
{
	sigset_t	saved;

	block_signals(&saved);
	if (worker_engine != NULL)
		cai_engine_free(worker_engine);
	if (worker_model != NULL)
		cai_model_free(worker_model);
	worker_engine = NULL;
	worker_model = NULL;
	restore_signals(&saved);

	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	cai_shared->worker_pid = 0;
	cai_shared->worker_proc = NULL;
	cai_shared->state = CAI_WORKER_NOT_RUNNING;
	LWLockRelease(cai_shared->lock);
}

/*
 * worker_load_model
 *		Loads pg_cai.model and creates the engine.  On failure the worker stays up without a
 *		model (state FAILED) and says why, once in the log and in every answer.
 */
static void
worker_load_model(void)
{
	char		path[MAXPGPATH];
	cai_model_params model_params;
	cai_engine_params engine_params;
	cai_error	err;
	cai_status	status;
	sigset_t	saved;
	TimestampTz start = GetCurrentTimestamp();
	long		secs;
	int			usecs;
	char		reason[CAI_REASON_SIZE];

	if (cai_model_path == NULL || cai_model_path[0] == '\0')
	{
		set_failed("no model is configured",
				   "Set pg_cai.model in postgresql.conf to the path of a GGUF model file and restart the server.");
		return;
	}

	if (is_absolute_path(cai_model_path))
		strlcpy(path, cai_model_path, sizeof(path));
	else
		snprintf(path, sizeof(path), "%s/%s", DataDir, cai_model_path);

	memset(&err, 0, sizeof(err));
	cai_model_params_default(&model_params);
	model_params.n_threads = cai_threads;
	if (cai_chat_template != NULL && cai_chat_template[0] != '\0')
		model_params.chat_template = cai_chat_template;

	ereport(LOG, (errmsg("pg_cai engine worker loading model \"%s\"", path)));

	block_signals(&saved);
	status = cai_model_load(path, &model_params, &worker_model, &err);
	restore_signals(&saved);
	if (status != CAI_OK)
	{
		worker_model = NULL;
		snprintf(reason, sizeof(reason), "could not load model \"%s\": %s", path, err.message);
		set_failed(reason,
				   "Check pg_cai.model and the server log, then restart the server. Until then every pg_cai call fails with this error.");
		return;
	}

	cai_model_get_info(worker_model, &worker_model_info);
	if (cai_context_length > 0)
		worker_context_length = cai_context_length;
	else
		worker_context_length = Min(worker_model_info.context_length, 4096);

	cai_engine_params_default(&engine_params);
	engine_params.device = CaiDeviceSettingName(cai_device);
	engine_params.n_threads = cai_threads;
	engine_params.max_running = cai_max_batch;
	engine_params.max_step_tokens = cai_max_step_tokens;
	engine_params.context_length = worker_context_length;
	engine_params.max_queue = cai_max_queue;
	engine_params.max_queue_wait_ms = (double) cai_max_queue_wait_ms;
	engine_params.host_cache_bytes = (size_t) cai_host_cache_size_mb * 1024 * 1024;

	block_signals(&saved);
	status = cai_engine_create(worker_model, &engine_params, &worker_engine, &err);
	restore_signals(&saved);
	if (status != CAI_OK)
	{
		worker_engine = NULL;
		cai_model_free(worker_model);
		worker_model = NULL;
		snprintf(reason, sizeof(reason), "could not start the engine for model \"%s\": %s",
				 path, err.message);
		set_failed(reason,
				   "Check pg_cai.device, pg_cai.context_length and pg_cai.max_batch and the server log, then restart the server.");
		return;
	}

	TimestampDifference(start, GetCurrentTimestamp(), &secs, &usecs);

	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	{
		CaiModelSummary *m = &cai_shared->model;

		copy_string(m->path, sizeof(m->path), path);
		copy_string(m->arch, sizeof(m->arch), worker_model_info.arch);
		copy_string(m->name, sizeof(m->name), worker_model_info.name);
		copy_string(m->chat_template, sizeof(m->chat_template), worker_model_info.chat_template);
		copy_string(m->device, sizeof(m->device), cai_engine_device(worker_engine));
		copy_string(m->device_reason, sizeof(m->device_reason),
					cai_engine_device_reason(worker_engine));
		m->n_layers = worker_model_info.n_layers;
		m->d_model = worker_model_info.d_model;
		m->n_heads = worker_model_info.n_heads;
		m->n_kv_heads = worker_model_info.n_kv_heads;
		m->head_dim = worker_model_info.head_dim;
		m->d_ff = worker_model_info.d_ff;
		m->n_vocab = worker_model_info.n_vocab;
		m->trained_context = worker_model_info.context_length;
		m->context_length = worker_context_length;
		m->n_params = worker_model_info.n_params;
		m->weight_bytes = worker_model_info.weight_bytes;
		m->kv_bytes_per_token = worker_model_info.kv_bytes_per_token;
		m->load_seconds = secs + usecs / 1e6;
	}
	cai_shared->state = CAI_WORKER_READY;
	LWLockRelease(cai_shared->lock);

	ereport(LOG,
			(errmsg("pg_cai engine worker ready: model \"%s\" (%s), %s, context %d tokens, loaded in %.1f s",
					worker_model_info.name ? worker_model_info.name : "",
					worker_model_info.arch ? worker_model_info.arch : "",
					cai_engine_device(worker_engine),
					worker_context_length,
					secs + usecs / 1e6)));
}

/* ---------------------------------------------------------------------------------------------
 * Answers
 * ------------------------------------------------------------------------------------------- */

/*
 * queue_message
 *		Appends a response message (type byte + body) to the request's outbox.
 */
static void
queue_message(WorkerRequest *req, char type, const void *body, Size body_len,
			  const void *tail, Size tail_len)
{
	OutboxMessage *msg;

	msg = MemoryContextAlloc(req->context,
							 offsetof(OutboxMessage, data) + 1 + body_len + tail_len);
	msg->next = NULL;
	msg->len = 1 + body_len + tail_len;
	msg->data[0] = type;
	if (body_len > 0)
		memcpy(msg->data + 1, body, body_len);
	if (tail_len > 0)
		memcpy(msg->data + 1 + body_len, tail, tail_len);

	if (req->outbox_tail != NULL)
		req->outbox_tail->next = msg;
	else
		req->outbox_head = msg;
	req->outbox_tail = msg;
}

/*
 * answer_error
 *		Queues an error as the request's answer; the request then only drains.
 */
static void
answer_error(WorkerRequest *req, int32 status, const char *message)
{
	queue_message(req, CAI_MSG_ERROR, &status, sizeof(status), message, strlen(message));
	req->state = REQUEST_DRAINING;
	worker_counters.requests_failed++;
}

static void
answer_errorf(WorkerRequest *req, int32 status, const char *fmt,...) pg_attribute_printf(3, 4);

static void
answer_errorf(WorkerRequest *req, int32 status, const char *fmt,...)
{
	char		message[CAI_ERROR_MESSAGE_SIZE];
	va_list		args;

	va_start(args, fmt);
	vsnprintf(message, sizeof(message), fmt, args);
	va_end(args);
	answer_error(req, status, message);
}

/* Queues a result message as the request's answer. */
static void
answer_result(WorkerRequest *req, char type, const void *body, Size body_len,
			  const void *tail, Size tail_len)
{
	queue_message(req, type, body, body_len, tail, tail_len);
	req->state = REQUEST_DRAINING;
	worker_counters.requests_completed++;
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
	return true;
}

/*
 * worker_intake
 *		Takes every posted request from the ring: attaches to its segment, becomes the sender of
 *		its response queue, and starts it.  Takes the pg_cai lock briefly per request.
 */
static void
worker_intake(void)
{
	dsm_handle	handle;

	while (CaiRingPeek(&handle))
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
		req->kind = (CaiRequestKind) header->kind;
		req->backend_pid = header->backend_pid;
		req->state = REQUEST_RUNNING;
		initStringInfo(&req->text);

		mq = (shm_mq *) ((char *) header + header->queue_offset);
		shm_mq_set_sender(mq, MyProc);
		req->mqh = shm_mq_attach(mq, seg, NULL);

		MemoryContextSwitchTo(old);

		dlist_push_tail(&worker_requests, &req->node);
		worker_counters.requests_received++;

		worker_start_request(req);
		(void) worker_flush(req);
	}
}

/*
 * start_generation
 *		Parses a CHAT or COMPLETE payload, builds the prompt and submits it to the engine.
 *		Anything wrong becomes the request's error answer.
 */
static void
start_generation(WorkerRequest *req, CaiReader *reader)
{
	CaiGenerationParams gp;
	cai_sampling_params sampling;
	cai_request_params params;
	cai_error	err;
	cai_status	status;
	int32	   *prompt_ids = NULL;
	int			n_prompt = 0;
	int			max_prompt;
	int			i;
	cai_prompt	prompt;
	bool		have_prompt = false;

	memset(&err, 0, sizeof(err));
	memset(&prompt, 0, sizeof(prompt));

	if (!cai_get_bytes(reader, &gp, sizeof(gp)) ||
		gp.n_stop < 0 || gp.n_stop > CAI_MAX_STOP_STRINGS || gp.max_tokens < 1)
	{
		answer_error(req, CAI_ERR_INTERNAL, "malformed generation request");
		return;
	}

	cai_sampling_params_default(&sampling);
	sampling.temperature = gp.temperature;
	sampling.top_p = gp.top_p;
	sampling.top_k = gp.top_k;
	sampling.seed = gp.seed;
	sampling.max_tokens = gp.max_tokens;
	sampling.ignore_eos = gp.ignore_eos;
	sampling.n_stop = gp.n_stop;
	for (i = 0; i < gp.n_stop; i++)
	{
		const char *text;
		uint32		len;

		if (!cai_get_text(reader, &text, &len))
		{
			answer_error(req, CAI_ERR_INTERNAL, "malformed stop string in request");
			return;
		}
		sampling.stop[i] = pnstrdup(text, len);
	}

	/* Leave room for the reply: at most half the context is reserved for it. */
	max_prompt = worker_context_length - Min(gp.max_tokens, worker_context_length / 2);

	if (req->kind == CAI_REQUEST_CHAT)
	{
		cai_chat_message *messages;
		cai_prompt_params prompt_params;

		if (gp.n_messages < 1 ||
			(Size) gp.n_messages > cai_reader_remaining(reader) / (3 * sizeof(int32)))
		{
			answer_error(req, CAI_ERR_INTERNAL, "malformed chat request");
			return;
		}
		messages = palloc0(sizeof(cai_chat_message) * gp.n_messages);
		for (i = 0; i < gp.n_messages; i++)
		{
			int32		role;
			int32		n_tokens;
			const char *text;
			uint32		len;

			if (!cai_get_int32(reader, &role) || role < CAI_TURN_SYSTEM || role > CAI_TURN_ASSISTANT ||
				!cai_get_text(reader, &text, &len) ||
				!cai_get_int32(reader, &n_tokens) || n_tokens < -1 ||
				(Size) Max(n_tokens, 0) > cai_reader_remaining(reader) / sizeof(int32))
			{
				answer_error(req, CAI_ERR_INTERNAL, "malformed chat turn in request");
				return;
			}
			messages[i].role = (cai_role) role;
			messages[i].content = pnstrdup(text, len);
			if (n_tokens >= 0)
			{
				int32	   *ids = palloc(sizeof(int32) * Max(n_tokens, 1));
				int			j;

				(void) cai_get_int32_array(reader, n_tokens, ids);

				/*
				 * Stored ids come from a table the caller may write: ids outside the
				 * vocabulary are not used, and the content is tokenized instead.
				 */
				for (j = 0; j < n_tokens; j++)
				{
					if (ids[j] < 0 || ids[j] >= worker_model_info.n_vocab)
						break;
				}
				if (j == n_tokens)
				{
					messages[i].tokens = ids;
					messages[i].n_tokens = n_tokens;
				}
			}
		}

		prompt_params.add_generation_prompt = true;
		prompt_params.max_prompt_tokens = max_prompt;
		prompt_params.truncate = gp.truncate;
		status = cai_chat_build_prompt(worker_model, messages, gp.n_messages, &prompt_params,
									   &prompt, &err);
		if (status != CAI_OK)
		{
			answer_error(req, status, err.message);
			return;
		}
		have_prompt = true;
		prompt_ids = prompt.ids;
		n_prompt = prompt.n_ids;
		req->first_message = prompt.first_message;
		if (prompt.n_last_content_ids > 0)
		{
			req->user_tokens = palloc(sizeof(int32) * prompt.n_last_content_ids);
			memcpy(req->user_tokens, prompt.last_content_ids,
				   sizeof(int32) * prompt.n_last_content_ids);
			req->n_user_tokens = prompt.n_last_content_ids;
		}
	}
	else
	{
		const char *text;
		uint32		len;
		int32	   *ids = NULL;
		int			n_ids = 0;

		if (!cai_get_text(reader, &text, &len))
		{
			answer_error(req, CAI_ERR_INTERNAL, "malformed completion request");
			return;
		}
		status = cai_tokenize(worker_model, text, len, false, &ids, &n_ids, &err);
		if (status != CAI_OK)
		{
			answer_error(req, status, err.message);
			return;
		}
		prompt_ids = palloc(sizeof(int32) * Max(n_ids, 1));
		if (n_ids > 0)
			memcpy(prompt_ids, ids, sizeof(int32) * n_ids);
		cai_free(ids);
		n_prompt = n_ids;

		if (n_prompt > max_prompt)
		{
			if (!gp.truncate)
			{
				answer_errorf(req, CAI_ERR_CONTEXT_FULL,
							  "the prompt is %d tokens, more than the limit of %d (the context of %d tokens less %d kept for the reply)",
							  n_prompt, max_prompt, worker_context_length,
							  worker_context_length - max_prompt);
				return;
			}
			/* keep the most recent text */
			memmove(prompt_ids, prompt_ids + (n_prompt - max_prompt), sizeof(int32) * max_prompt);
			n_prompt = max_prompt;
		}
		if (n_prompt == 0)
		{
			answer_error(req, CAI_ERR_INVALID_ARGUMENT, "prompt has no tokens");
			return;
		}
	}

	memset(&params, 0, sizeof(params));
	params.prompt = prompt_ids;
	params.n_prompt = n_prompt;
	params.sampling = sampling;
	params.cache_salt = gp.cache_salt;
	params.use_cache = gp.use_cache;
	params.user_data = req;

	status = cai_engine_submit(worker_engine, &params, &req->engine_id, &err);
	if (have_prompt)
		cai_prompt_free(&prompt);
	if (status != CAI_OK)
	{
		answer_error(req, status, err.message);
		return;
	}
	req->in_engine = true;
}

/*
 * worker_start_request
 *		Parses the request and either answers it at once (tokenize, detokenize, cache reset,
 *		errors) or submits it to the engine.
 */
static void
worker_start_request(WorkerRequest *req)
{
	CaiReader	reader;
	MemoryContext old;
	cai_error	err;
	cai_status	status;

	memset(&err, 0, sizeof(err));

	if (worker_engine == NULL)
	{
		char		reason[CAI_REASON_SIZE];

		LWLockAcquire(cai_shared->lock, LW_SHARED);
		strlcpy(reason, cai_shared->reason, sizeof(reason));
		LWLockRelease(cai_shared->lock);
		answer_error(req, CAI_STATUS_MODEL_UNAVAILABLE, reason);
		return;
	}

	cai_reader_init(&reader, (char *) req->header + req->header->payload_offset,
					req->header->payload_size);
	old = MemoryContextSwitchTo(req->context);

	switch (req->kind)
	{
		case CAI_REQUEST_CHAT:
		case CAI_REQUEST_COMPLETE:
			{
				sigset_t	saved;

				block_signals(&saved);
				start_generation(req, &reader);
				restore_signals(&saved);
				break;
			}

		case CAI_REQUEST_TOKENIZE:
			{
				const char *text;
				uint32		len;
				int32	   *ids = NULL;
				int			n_ids = 0;

				if (!cai_get_text(&reader, &text, &len))
				{
					answer_error(req, CAI_ERR_INTERNAL, "malformed tokenize request");
					break;
				}
				status = cai_tokenize(worker_model, text, len, false, &ids, &n_ids, &err);
				if (status != CAI_OK)
				{
					answer_error(req, status, err.message);
					break;
				}
				{
					int32		count = n_ids;

					answer_result(req, CAI_MSG_IDS, &count, sizeof(count),
								  ids, sizeof(int32) * n_ids);
				}
				cai_free(ids);
				break;
			}

		case CAI_REQUEST_DETOKENIZE:
			{
				int32		count;
				int32	   *ids;
				char	   *text = NULL;
				size_t		len = 0;
				int			i;

				if (!cai_get_int32(&reader, &count) || count < 0 ||
					(Size) count > cai_reader_remaining(&reader) / sizeof(int32))
				{
					answer_error(req, CAI_ERR_INTERNAL, "malformed detokenize request");
					break;
				}
				ids = palloc(sizeof(int32) * Max(count, 1));
				(void) cai_get_int32_array(&reader, count, ids);
				for (i = 0; i < count; i++)
				{
					if (ids[i] < 0 || ids[i] >= worker_model_info.n_vocab)
						break;
				}
				if (i < count)
				{
					answer_errorf(req, CAI_ERR_INVALID_ARGUMENT,
								  "token id %d is out of range: the vocabulary has %d tokens",
								  ids[i], worker_model_info.n_vocab);
					break;
				}
				status = cai_detokenize(worker_model, ids, count, &text, &len, &err);
				if (status != CAI_OK)
				{
					answer_error(req, status, err.message);
					break;
				}
				answer_result(req, CAI_MSG_TEXT, text, len, NULL, 0);
				cai_free(text);
				break;
			}

		case CAI_REQUEST_CACHE_RESET:
			cai_engine_cache_reset(worker_engine);
			answer_result(req, CAI_MSG_OK, NULL, 0, NULL, 0);
			worker_publish_stats(true);
			break;

		default:
			answer_errorf(req, CAI_ERR_INTERNAL, "unknown request kind %u", req->header->kind);
			break;
	}

	MemoryContextSwitchTo(old);
}

/* ---------------------------------------------------------------------------------------------
 * Engine steps
 * ------------------------------------------------------------------------------------------- */

/* True when the token ends a turn and is not part of the content. */
static bool
is_end_token(int32 token)
{
	return token == worker_model_info.eos_token || token == worker_model_info.eot_token;
}

/*
 * finish_generation
 *		Queues the final message of a generation request: usage and the ids to store.
 */
static void
finish_generation(WorkerRequest *req, const cai_event *ev)
{
	CaiFinal	final;
	char	   *text = NULL;
	size_t		len = 0;
	cai_error	err;

	memset(&final, 0, sizeof(final));
	final.finish = ev->finish;
	final.prompt_tokens = ev->usage.prompt_tokens;
	final.cached_tokens = ev->usage.cached_tokens;
	final.completion_tokens = ev->usage.completion_tokens;
	final.queue_ms = ev->usage.queue_ms;
	final.ttft_ms = ev->usage.ttft_ms;
	final.total_ms = ev->usage.total_ms;
	final.first_message = req->first_message;
	final.n_user_tokens = req->n_user_tokens;

	/*
	 * Stored ids must say exactly what the stored text says, or the next turn would feed the
	 * model something else than the conversation shows (a withheld stop string, say).
	 */
	memset(&err, 0, sizeof(err));
	if (cai_detokenize(worker_model, req->generated, req->n_generated, &text, &len, &err) == CAI_OK)
	{
		final.tokens_exact = (len == (size_t) req->text.len &&
							  memcmp(text, req->text.data, len) == 0);
		cai_free(text);
	}

	req->in_engine = false;
	answer_result(req, CAI_MSG_FINAL, &final, sizeof(final),
				  req->user_tokens, sizeof(int32) * req->n_user_tokens);
	generation_finished = true;
}

/*
 * handle_event
 *		Forwards one engine event to its request.
 */
static void
handle_event(const cai_event *ev)
{
	WorkerRequest *req = (WorkerRequest *) ev->user_data;
	MemoryContext old;

	if (req == NULL || !req->in_engine)
		return;

	old = MemoryContextSwitchTo(req->context);

	if (ev->finish == CAI_FINISH_ERROR)
	{
		req->in_engine = false;
		answer_error(req, CAI_ERR_BACKEND, ev->error ? ev->error : "generation failed");
		MemoryContextSwitchTo(old);
		return;
	}

	if (ev->token >= 0 || ev->text_len > 0)
	{
		int32		token = (ev->token >= 0 && !is_end_token(ev->token)) ? ev->token : -1;

		if (token >= 0)
		{
			if (req->n_generated == req->generated_capacity)
			{
				req->generated_capacity = Max(64, req->generated_capacity * 2);
				if (req->generated == NULL)
					req->generated = palloc(sizeof(int32) * req->generated_capacity);
				else
					req->generated = repalloc(req->generated,
											  sizeof(int32) * req->generated_capacity);
			}
			req->generated[req->n_generated++] = token;
		}
		if (ev->text_len > 0)
			appendBinaryStringInfo(&req->text, ev->text, (int) ev->text_len);
		queue_message(req, CAI_MSG_TOKEN, &token, sizeof(token), ev->text, ev->text_len);
	}

	if (ev->finish != CAI_FINISH_NONE)
		finish_generation(req, ev);

	MemoryContextSwitchTo(old);
}

/*
 * worker_step
 *		Runs one engine step and forwards its events.  If the step itself fails, every request
 *		in the engine gets the error and is dropped: the engine's state is not trusted further
 *		for them.
 */
static void
worker_step(void)
{
	const cai_event *events = NULL;
	int			n_events = 0;
	cai_error	err;
	cai_status	status;
	sigset_t	saved;
	int			i;

	memset(&err, 0, sizeof(err));
	block_signals(&saved);
	status = cai_engine_step(worker_engine, &events, &n_events, &err);
	restore_signals(&saved);

	if (status != CAI_OK)
	{
		dlist_iter	iter;

		ereport(LOG,
				(errmsg("pg_cai engine step failed: %s", err.message)));
		dlist_foreach(iter, &worker_requests)
		{
			WorkerRequest *req = dlist_container(WorkerRequest, node, iter.cur);

			if (req->in_engine)
			{
				MemoryContext old = MemoryContextSwitchTo(req->context);

				(void) cai_engine_cancel(worker_engine, req->engine_id);
				req->in_engine = false;
				answer_error(req, status, err.message);
				MemoryContextSwitchTo(old);
			}
		}
		return;
	}

	for (i = 0; i < n_events; i++)
		handle_event(&events[i]);
}

/* ---------------------------------------------------------------------------------------------
 * Delivery and clean-up
 * ------------------------------------------------------------------------------------------- */

/*
 * worker_abandon
 *		The backend is gone: drop the request from the engine (freeing its KV) and forget it.
 */
static void
worker_abandon(WorkerRequest *req)
{
	if (req->in_engine)
	{
		(void) cai_engine_cancel(worker_engine, req->engine_id);
		req->in_engine = false;
	}
	if (req->state == REQUEST_RUNNING)
		worker_counters.requests_abandoned++;
	worker_finish(req);
}

/*
 * worker_check_abandoned
 *		Drops requests whose backend detached before the answer was complete.
 */
static void
worker_check_abandoned(void)
{
	dlist_mutable_iter iter;

	dlist_foreach_modify(iter, &worker_requests)
	{
		WorkerRequest *req = dlist_container(WorkerRequest, node, iter.cur);

		if (pg_atomic_read_u32(&req->header->abandoned) != 0)
			worker_abandon(req);
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
			worker_abandon(req);
			return false;
		}
		req->outbox_head = msg->next;
		if (req->outbox_head == NULL)
			req->outbox_tail = NULL;
		pfree(msg);
	}

	if (req->state == REQUEST_DRAINING)
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

/* time constant of pg_stat_cai's recent_tokens_per_second */
#define RECENT_RATE_SECONDS 10.0

/*
 * update_recent_rate
 *		Folds the tokens generated since the last call into an exponentially weighted rate with a
 *		time constant of RECENT_RATE_SECONDS of wall-clock time, idle time included, so the figure
 *		is the current throughput and decays to 0 when the engine goes quiet.  Weighting each
 *		interval by its length keeps the average right however irregular the calls are.
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
 *		Copies the engine's statistics and the worker's counters into shared memory, at most
 *		every 100 ms unless forced.  Takes the pg_cai lock exclusively.
 */
static void
worker_publish_stats(bool force)
{
	TimestampTz now = GetCurrentTimestamp();
	cai_engine_stats stats;
	double		recent_rate;

	if (!force && !TimestampDifferenceExceeds(last_stats_publish, now, 100))
		return;
	last_stats_publish = now;

	memset(&stats, 0, sizeof(stats));
	if (worker_engine != NULL)
		cai_engine_get_stats(worker_engine, &stats);
	recent_rate = update_recent_rate(now, stats.generated_tokens);

	LWLockAcquire(cai_shared->lock, LW_EXCLUSIVE);
	cai_shared->engine_stats = stats;
	cai_shared->counters = worker_counters;
	cai_shared->stats_updated = now;
	cai_shared->recent_tokens_per_second = recent_rate;
	LWLockRelease(cai_shared->lock);
}
