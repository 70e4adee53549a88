/*
 * channel.c — a backend's side of a request: post it, wait for answers, notice a dead worker.
 *
 * The pattern is PostgreSQL's src/test/modules/test_shm_mq: a dynamic shared memory segment
 * holds the request and a shm_mq; the backend is the queue's receiver, the engine worker its
 * sender.  The backend waits with non-blocking receives and WaitLatch, so that it can check, once
 * a second, that the worker that took the request still exists: shm_mq alone would wait forever
 * for a sender that never attaches.
 */
#include "postgres.h"

#include "libpq/libpq.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "cai.h"
#include "channel.h"
#include "shmem.h"

/* PgCaiReply: a backend waiting for its request's next message (pg_compat.h) */
static uint32 reply_wait_event = 0;

/*
 * A request whose worker stays away this long fails instead of waiting on.  The postmaster
 * restarts the worker a second after it exits, but under load it has been seen to take ten; a
 * call made meanwhile should be served by the next worker, not fail.
 */
#define CAI_WORKER_ABSENT_TIMEOUT_MS 30000

/* The model of the last request this backend posted: whose hint a MODEL_UNAVAILABLE error gets */
static char last_model[CAI_MODEL_NAME_MAX + 1];

/*
 * CaiModelResolve
 *		The name of the model a call asks for: requested, or the first configured model when
 *		NULL.  A name that this backend's pg_cai.models does not list is an error naming the
 *		configured ones.
 */
const char *
CaiModelResolve(const char *requested)
{
	CaiModelList list;

	CaiModelsConfigured(&list);
	if (requested == NULL)
		return pstrdup(list.entries[0].name);
	if (CaiModelsFind(&list, requested) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("pg_cai model \"%s\" is not configured", requested),
				 errdetail("Configured models: %s.", CaiModelsNames(&list)),
				 errhint("Name a model of pg_cai.models in the \"model\" option, or leave the option out for the first one.")));
	return requested;
}

/*
 * CaiModelArgument
 *		The model a SQL function's argument argno names (text), resolved as CaiModelResolve does:
 *		the first model when the function has no such argument or it is NULL.
 */
const char *
CaiModelArgument(FunctionCallInfo fcinfo, int argno)
{
	if (PG_NARGS() > argno && !PG_ARGISNULL(argno))
		return CaiModelResolve(text_to_cstring(PG_GETARG_TEXT_PP(argno)));
	return CaiModelResolve(NULL);
}

/*
 * CaiCheckModelReady
 *		Raises the model's reason when the worker runs without it.  A model that is loading or
 *		restarting is fine: requests wait for it.  Takes the pg_cai lock in shared mode.
 */
void
CaiCheckModelReady(const char *model)
{
	CaiSharedState *shared = CaiSharedStateOrError();
	CaiWorkerState state = CAI_WORKER_NOT_RUNNING;
	char		reason[CAI_REASON_SIZE];
	char		hint[CAI_REASON_SIZE];
	int			slot;

	LWLockAcquire(shared->lock, LW_SHARED);
	slot = CaiSharedModelIndex(model);
	if (slot >= 0)
	{
		state = shared->models[slot].state;
		strlcpy(reason, shared->models[slot].reason, sizeof(reason));
		strlcpy(hint, shared->models[slot].hint, sizeof(hint));
	}
	LWLockRelease(shared->lock);

	if (state == CAI_WORKER_FAILED)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_cai model is not available: %s", reason),
				 hint[0] ? errhint("%s", hint) : 0));
}

/*
 * CaiCheckWorkerReady
 *		CaiCheckModelReady for the default model.
 */
void
CaiCheckWorkerReady(void)
{
	CaiCheckModelReady(CaiModelResolve(NULL));
}

/*
 * channel_on_detach
 *		Runs whenever this backend detaches from a request segment: at the normal end, or on
 *		error, cancel or timeout through resource-owner cleanup.  Marks the request abandoned and
 *		wakes the worker so it drops the sequence at once.  Must not fail: it runs during abort.
 */
static void
channel_on_detach(dsm_segment *seg, Datum arg)
{
	CaiRequestHeader *header = (CaiRequestHeader *) DatumGetPointer(arg);
	PGPROC	   *worker;

	/*
	 * ClientConnectionLost is set however the loss was noticed: by client_check below, by
	 * client_connection_check_interval, or by a failed write of a streamed row.
	 */
	pg_atomic_write_u32(&header->abandoned,
						ClientConnectionLost ? CAI_ABANDONED_CLIENT_LOST : CAI_ABANDONED_DETACHED);

	/* A stale pointer is harmless: setting an unused latch does nothing. */
	worker = ((volatile CaiSharedState *) cai_shared)->worker_proc;
	if (worker != NULL)
		SetLatch(&worker->procLatch);
}

/*
 * CaiCheckRequestSize
 *		Refuses a request whose payload takes more than pg_cai.max_request_bytes: the engine
 *		decodes, tokenizes and templates a request in one piece, so its size bounds how long it
 *		holds the engine from everyone else's requests.
 */
void
CaiCheckRequestSize(Size bytes)
{
	if (bytes > (Size) cai_max_request_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("pg_cai request is larger than pg_cai.max_request_bytes (%d bytes)",
						cai_max_request_bytes),
				 errdetail("Its text and token ids take more than %zu bytes.", (size_t) bytes),
				 errhint("Send less text (a conversation sends its newest turns, up to pg_cai.max_request_messages), or ask a superuser to raise pg_cai.max_request_bytes.")));
}

/*
 * CaiChannelOpen
 *		CaiChannelOpenFor the default model.
 */
CaiChannel *
CaiChannelOpen(cai_request_kind kind, const cai_wbuf *payload)
{
	return CaiChannelOpenFor(kind, payload, NULL);
}

/*
 * CaiChannelOpenFor
 *		Creates the request segment for the named model (NULL: the default one), copies the
 *		payload into it, posts it and wakes the worker.  The channel is allocated in the current
 *		memory context, and the segment belongs to the current resource owner.  Takes the
 *		pg_cai lock briefly.
 */
CaiChannel *
CaiChannelOpenFor(cai_request_kind kind, const cai_wbuf *payload, const char *model)
{
	CaiChannel *channel;
	Size		payload_offset = MAXALIGN(sizeof(CaiRequestHeader));
	Size		queue_offset = payload_offset + MAXALIGN(payload->len);
	Size		total = queue_offset + CAI_RESPONSE_QUEUE_SIZE;
	char	   *base;
	CaiRequestHeader *header;

	CaiCheckRequestSize(payload->len);
	model = CaiModelResolve(model);
	CaiCheckModelReady(model);
	strlcpy(last_model, model, sizeof(last_model));
	if (payload->failed)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("pg_cai request is too large")));

	channel = palloc0(sizeof(CaiChannel));
	channel->seg = dsm_create(total, DSM_CREATE_NULL_IF_MAXSEGMENTS);
	if (channel->seg == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
				 errmsg("too many dynamic shared memory segments for another pg_cai request"),
				 errhint("Retry later, or raise max_connections.")));

	base = dsm_segment_address(channel->seg);
	header = (CaiRequestHeader *) base;
	header->magic = CAI_REQUEST_MAGIC;
	header->kind = kind;
	header->backend_pid = MyProcPid;
	header->role = GetUserId();
	strlcpy(header->model, model, sizeof(header->model));
	header->payload_offset = payload_offset;
	header->payload_size = payload->len;
	header->queue_offset = queue_offset;
	header->queue_size = CAI_RESPONSE_QUEUE_SIZE;
	pg_atomic_init_u32(&header->abandoned, 0);
	pg_atomic_init_u64(&header->accepted_generation, 0);
	if (payload->len > 0)
		memcpy(base + payload_offset, payload->data, payload->len);

	channel->header = header;
	channel->mq = shm_mq_create(base + queue_offset, CAI_RESPONSE_QUEUE_SIZE);
	shm_mq_set_receiver(channel->mq, MyProc);
	channel->mqh = shm_mq_attach(channel->mq, channel->seg, NULL);
	on_dsm_detach(channel->seg, channel_on_detach, PointerGetDatum(header));

	if (!CaiRingPush(dsm_segment_handle(channel->seg)))
	{
		CaiChannelClose(channel);
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("pg_cai request queue is full"),
				 errdetail("All %d places in the queue are taken by requests waiting for the engine worker.",
						   cai_shared->ring_capacity),
				 errhint("Retry later, or raise pg_cai.max_queue.")));
	}

	return channel;
}

/*
 * check_worker
 *		Fails the request when no worker will ever answer it: the worker that took it is gone,
 *		or no worker has run for CAI_WORKER_ABSENT_TIMEOUT_MS.  Takes the pg_cai lock in shared
 *		mode.
 */
static void
check_worker(CaiChannel *channel)
{
	uint64		accepted = pg_atomic_read_u64(&channel->header->accepted_generation);
	uint64		current = pg_atomic_read_u64(&cai_shared->generation);
	int			pid;

	if (accepted != 0 && accepted != current && shm_mq_get_sender(channel->mq) == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_cai engine worker terminated before it started the request"),
				 errhint("The worker restarts by itself; retry the call.")));

	LWLockAcquire(cai_shared->lock, LW_SHARED);
	pid = cai_shared->worker_pid;
	LWLockRelease(cai_shared->lock);

	if (pid != 0)
		channel->worker_missing_since = 0;
	else if (channel->worker_missing_since == 0)
		channel->worker_missing_since = GetCurrentTimestamp();
	else if (TimestampDifferenceExceeds(channel->worker_missing_since, GetCurrentTimestamp(),
										CAI_WORKER_ABSENT_TIMEOUT_MS))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_cai engine worker is not running"),
				 errhint("Check the server log for why the worker exited.")));
}

/*
 * How often a waiting backend looks whether its client has gone, whatever
 * client_connection_check_interval says: a reply nobody will read should not hold a place in
 * the engine's batch.  One poll of the socket each time costs nothing beside a token's work.
 */
#define CAI_CLIENT_CHECK_MS 200

/*
 * client_check
 *		Notices a client that has closed its connection while this backend waits for the engine,
 *		every CAI_CLIENT_CHECK_MS, as client_connection_check_interval would: the next
 *		CHECK_FOR_INTERRUPTS raises PostgreSQL's own "connection to client lost" FATAL, the
 *		transaction is rolled back (nothing of the turn is stored), and the detach tells the
 *		worker to drop the request.  Backends without a client (background workers, a
 *		single-user backend) have nothing to check.
 */
static void
client_check(CaiChannel *channel)
{
	TimestampTz now;

	if (whereToSendOutput != DestRemote || MyProcPort == NULL || ClientConnectionLost)
		return;
	now = GetCurrentTimestamp();
	if (channel->client_checked != 0 &&
		!TimestampDifferenceExceeds(channel->client_checked, now, CAI_CLIENT_CHECK_MS))
		return;
	channel->client_checked = now;
	if (!pq_check_connection())
	{
		ClientConnectionLost = true;
		InterruptPending = true;
	}
}

/*
 * CaiChannelReceive
 *		Waits for the next response message.  *data points into the queue's buffer and stays
 *		valid until the next call.  Interrupts are served while waiting: pg_cancel_backend and
 *		statement_timeout raise their error here, which detaches the channel.
 */
void
CaiChannelReceive(CaiChannel *channel, char **data, Size *len)
{
	for (;;)
	{
		shm_mq_result res;
		void	   *msg;
		Size		nbytes;

		res = shm_mq_receive(channel->mqh, &nbytes, &msg, true);
		if (res == SHM_MQ_SUCCESS)
		{
			if (nbytes < 1)
				ereport(ERROR,
						(errcode(ERRCODE_INTERNAL_ERROR),
						 errmsg("pg_cai engine worker sent an empty message")));
			*data = msg;
			*len = nbytes;
			return;
		}
		if (res == SHM_MQ_DETACHED)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("pg_cai engine worker terminated while processing the request"),
					 errhint("The worker restarts by itself; retry the call.")));

		check_worker(channel);

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 CAI_CLIENT_CHECK_MS,
						 CaiWaitEvent("PgCaiReply", &reply_wait_event));
		ResetLatch(MyLatch);
		/* after ResetLatch: the check may reset the latch too, and the queue is read next */
		client_check(channel);
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * CaiChannelClose
 *		Detaches from the request; the worker drops whatever is left of it.
 */
void
CaiChannelClose(CaiChannel *channel)
{
	if (channel->seg != NULL)
	{
		shm_mq_detach(channel->mqh);
		dsm_detach(channel->seg);
		channel->seg = NULL;
		channel->mqh = NULL;
		channel->mq = NULL;
		channel->header = NULL;
	}
}

/*
 * CaiRaiseWorkerError
 *		Turns a CAI_MSG_ERROR body (int32 status, message) into an ereport with a fitting
 *		errcode and hint.
 */
void
CaiRaiseWorkerError(const char *body, Size len)
{
	cai_reader	reader;
	int32		status = CAI_ERR_INTERNAL;
	char	   *message;

	cai_reader_init(&reader, body, len);
	if (!cai_get_i32(&reader, &status))
		status = CAI_ERR_INTERNAL;
	message = pnstrdup(body + reader.pos, len - reader.pos);

	switch (status)
	{
		case CAI_WIRE_STATUS_MODEL_UNAVAILABLE:
			{
				char		hint[CAI_REASON_SIZE];
				int			slot;

				hint[0] = '\0';
				LWLockAcquire(cai_shared->lock, LW_SHARED);
				slot = CaiSharedModelIndex(last_model);
				if (slot >= 0)
					strlcpy(hint, cai_shared->models[slot].hint, sizeof(hint));
				LWLockRelease(cai_shared->lock);
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("pg_cai model is not available: %s", message),
						 hint[0] ? errhint("%s", hint) : 0));
				break;
			}
		case CAI_WIRE_STATUS_ENGINE_CRASHED:

			/*
			 * Not retried by anyone: the request may be what crashed the engine (a reply job
			 * fails on it, src/pg/jobs.c).  58000: an error outside PostgreSQL itself.
			 */
			ereport(ERROR,
					(errcode(ERRCODE_SYSTEM_ERROR),
					 errmsg("pg_cai engine process crashed while running this request"),
					 errdetail("%s", message),
					 errhint("The engine restarts by itself and other sessions are not affected; the request was not retried.")));
			break;
		case CAI_WIRE_STATUS_ENGINE_HUNG:
			/* like a crash: the request may be what hung the engine */
			ereport(ERROR,
					(errcode(ERRCODE_SYSTEM_ERROR),
					 errmsg("pg_cai engine process stopped responding while running this request"),
					 errdetail("%s", message),
					 errhint("The engine was killed and restarts by itself, and other sessions are not affected; the request was not retried.")));
			break;
		case CAI_WIRE_STATUS_ENGINE_RESTARTED:
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("pg_cai engine was restarted before this request finished"),
					 errdetail("%s", message),
					 errhint("Retry the call.")));
			break;
		case CAI_ERR_INVALID_ARGUMENT:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s", message)));
			break;
		case CAI_ERR_CONTEXT_FULL:
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("%s", message),
					 errhint("Shorten the input, lower max_tokens, or pass {\"truncate\": true} to drop the oldest turns.")));
			break;
		case CAI_ERR_QUEUE_FULL:
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("pg_cai engine refused the request: %s", message),
					 errhint("Retry later, or raise pg_cai.max_queue.")));
			break;
		case CAI_ERR_NO_MEMORY:
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("pg_cai engine is out of memory: %s", message)));
			break;
		case CAI_ERR_NOT_FOUND:
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("%s", message)));
			break;
		default:
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("pg_cai engine failed: %s", message),
					 errdetail("Engine status: %s.", cai_status_name((cai_status) status))));
			break;
	}
	pg_unreachable();
}

/*
 * CaiGenerationStart
 *		Posts a CHAT or COMPLETE request to the default model.
 */
CaiGeneration *
CaiGenerationStart(cai_request_kind kind, const cai_wbuf *payload)
{
	return CaiGenerationStartFor(kind, payload, NULL, 1);
}

/*
 * CaiGenerationStartFor
 *		Posts a CHAT or COMPLETE request to the named model (NULL: the default one) whose
 *		payload asks for n_samples samples.
 */
CaiGeneration *
CaiGenerationStartFor(cai_request_kind kind, const cai_wbuf *payload, const char *model,
					  int n_samples)
{
	CaiGeneration *gen = palloc0(sizeof(CaiGeneration));

	initStringInfo(&gen->text);
	gen->n_samples = n_samples;
	if (n_samples > 1)
	{
		gen->samples = palloc0(sizeof(CaiGeneration) * n_samples);
		for (int i = 0; i < n_samples; i++)
			initStringInfo(&gen->samples[i].text);
	}
	gen->channel = CaiChannelOpenFor(kind, payload, model);
	return gen;
}

/*
 * keep_logprobs
 *		Stores the pending logprobs as those of generated id gen->n_ids, which is about to be
 *		appended; ids that came without logprobs before it get none (n_top -1).
 */
static void
keep_logprobs(CaiGeneration *gen)
{
	if (gen->logprobs_capacity <= gen->n_ids)
	{
		int			old = gen->logprobs_capacity;

		gen->logprobs_capacity = Max(64, gen->n_ids * 2);
		gen->logprobs = gen->logprobs == NULL ?
			palloc(sizeof(CaiTokenLogprobs) * gen->logprobs_capacity) :
			repalloc(gen->logprobs, sizeof(CaiTokenLogprobs) * gen->logprobs_capacity);
		for (int i = old; i < gen->logprobs_capacity; i++)
		{
			memset(&gen->logprobs[i], 0, sizeof(CaiTokenLogprobs));
			gen->logprobs[i].lp.n_top = -1;
		}
	}
	gen->logprobs[gen->n_ids] = gen->pending;
}

/*
 * CaiGenerationNext
 *		Waits for the next piece of the reply.  Returns true with the new text (possibly empty:
 *		a token can complete no character yet), or false once the generation is done, when
 *		gen->final and gen->user_tokens are set and the channel is closed.
 */
bool
CaiGenerationNext(CaiGeneration *gen, const char **piece, Size *len)
{
	char	   *data;
	Size		nbytes;

	CaiGeneration *owner = gen;

	if (gen->done)
		return false;

	CaiChannelReceive(gen->channel, &data, &nbytes);
	/* a sample's text, ids and logprobs are its own */
	if (gen->samples)
		gen = &gen->samples[gen->current];
	switch (data[0])
	{
		case CAI_MSG_SAMPLE:
			{
				int32		sample;

				if (owner->samples == NULL || nbytes != 1 + sizeof(int32))
					break;
				memcpy(&sample, data + 1, sizeof(sample));
				if (sample < 0 || sample >= owner->n_samples)
					break;
				owner->current = sample;
				*piece = "";
				*len = 0;
				return true;
			}

		case CAI_MSG_SAMPLE_END:
			{
				cai_reader	reader;

				cai_reader_init(&reader, data + 1, nbytes - 1);
				if (owner->samples == NULL || !cai_wire_get_final(&reader, &gen->final))
					break;
				gen->done = true;
				*piece = "";
				*len = 0;
				return true;
			}

		case CAI_MSG_TOKEN:
			{
				int32		token;
				Size		text_len;

				if (nbytes < 1 + sizeof(int32))
					break;
				memcpy(&token, data + 1, sizeof(token));
				if (token >= 0)
				{
					if (gen->n_ids == gen->ids_capacity)
					{
						gen->ids_capacity = Max(64, gen->ids_capacity * 2);
						gen->ids = gen->ids == NULL ?
							palloc(sizeof(int32) * gen->ids_capacity) :
							repalloc(gen->ids, sizeof(int32) * gen->ids_capacity);
					}
					if (gen->logprobs_pending)
						keep_logprobs(gen);
					gen->ids[gen->n_ids++] = token;
				}
				gen->logprobs_pending = false;
				text_len = nbytes - 1 - sizeof(int32);
				appendBinaryStringInfo(&gen->text, data + 1 + sizeof(int32), (int) text_len);
				*piece = gen->text.data + gen->text.len - text_len;
				*len = text_len;
				return true;
			}

		case CAI_MSG_LOGPROBS:
			{
				cai_reader	reader;

				bool		ok;

				cai_reader_init(&reader, data + 1, nbytes - 1);
				ok = cai_wire_get_logprobs(&reader, &gen->pending.lp);
				for (int i = 0; ok && i <= gen->pending.lp.n_top; i++)
				{
					const char *bytes;
					uint32		len;

					ok = cai_get_text(&reader, &bytes, &len) && len < MaxAllocSize;
					if (ok)
					{
						gen->pending.bytes[i] = pnstrdup(bytes, len);
						gen->pending.bytes_len[i] = (int) len;
					}
				}
				if (!ok)
					break;
				gen->logprobs_pending = true;
				*piece = gen->text.data + gen->text.len;
				*len = 0;
				return true;
			}

		case CAI_MSG_FINAL:
			{
				cai_reader	reader;

				gen = owner;

				cai_reader_init(&reader, data + 1, nbytes - 1);
				if (!cai_wire_get_final(&reader, &gen->final) ||
					(Size) gen->final.n_user_tokens != cai_reader_remaining(&reader) / sizeof(int32))
					break;
				gen->user_tokens = palloc(sizeof(int32) * Max(gen->final.n_user_tokens, 1));
				(void) cai_get_i32_array(&reader, gen->final.n_user_tokens, gen->user_tokens);
				gen->done = true;
				CaiChannelClose(gen->channel);
				return false;
			}

		case CAI_MSG_ERROR:
			{
				char	   *copy = palloc(nbytes - 1);

				memcpy(copy, data + 1, nbytes - 1);
				CaiChannelClose(owner->channel);
				CaiRaiseWorkerError(copy, nbytes - 1);
			}
	}

	ereport(ERROR,
			(errcode(ERRCODE_INTERNAL_ERROR),
			 errmsg("pg_cai engine worker sent a malformed message of type %d", data[0])));
	return false;
}

/*
 * CaiGenerationFinish
 *		Waits until the generation is done.
 */
void
CaiGenerationFinish(CaiGeneration *gen)
{
	const char *piece;
	Size		len;

	while (CaiGenerationNext(gen, &piece, &len))
		;
}
