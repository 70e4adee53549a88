/*
 * stats.c — what SQL can see of the engine: cai_model_info(), the pg_stat_cai view's function
 * cai_stats(), cai_stat_reset(), cai_cache_reset() and cai_forget().
 *
 * The worker publishes a summary of its model and its statistics in shared memory, so reading
 * them costs no round trip and works while the worker is busy.
 */
#include "postgres.h"

#include "access/xlog.h"
#include "funcapi.h"
#include "utils/tuplestore.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "channel.h"
#include "conversation.h"
#include "guc.h"
#include "pg_compat.h"
#include "protocol.h"
#include "shmem.h"

PG_FUNCTION_INFO_V1(pg_cai_model_info);
PG_FUNCTION_INFO_V1(pg_cai_stats);
PG_FUNCTION_INFO_V1(pg_cai_cache_reset);
PG_FUNCTION_INFO_V1(pg_cai_forget);
PG_FUNCTION_INFO_V1(pg_cai_stat_reset);

static const char *
state_name(CaiWorkerState state)
{
	switch (state)
	{
		case CAI_WORKER_NOT_RUNNING:
			return "not running";
		case CAI_WORKER_LOADING:
			return "loading";
		case CAI_WORKER_READY:
			return "ready";
		case CAI_WORKER_FAILED:
			return "failed";
		case CAI_WORKER_RESTARTING:
			return "restarting";
		case CAI_WORKER_UNRESPONSIVE:
			return "unresponsive";
	}
	return "unknown";
}

static void
json_key_string(StringInfo out, const char *key, const char *value, bool first)
{
	if (!first)
		appendStringInfoString(out, ", ");
	escape_json(out, key);
	appendStringInfoString(out, ": ");
	escape_json(out, value);
}

static void
json_key_int(StringInfo out, const char *key, int64 value)
{
	appendStringInfoString(out, ", ");
	escape_json(out, key);
	appendStringInfo(out, ": " INT64_FORMAT, value);
}

/*
 * cai_model_info() -> jsonb, cai_model_info(model text) -> jsonb
 *		The loaded model (the default one, or the named one) and the device that serves it;
 *		without it, its status and the reason.  A name pg_cai.models does not list is an error.
 *		Takes the pg_cai lock in shared mode.
 */
Datum
pg_cai_model_info(PG_FUNCTION_ARGS)
{
	CaiSharedState *shared = CaiSharedStateOrError();
	CaiWorkerState state = CAI_WORKER_NOT_RUNNING;
	CaiModelSummary model;
	char		reason[CAI_REASON_SIZE] = "";
	char		hint[CAI_REASON_SIZE] = "";
	const char *name;
	int			slot;
	StringInfoData out;

	if (PG_NARGS() > 0 && PG_ARGISNULL(0))
		PG_RETURN_NULL();
	name = CaiModelResolve(PG_NARGS() > 0 ? text_to_cstring(PG_GETARG_TEXT_PP(0)) : NULL);

	memset(&model, 0, sizeof(model));
	LWLockAcquire(shared->lock, LW_SHARED);
	slot = CaiSharedModelIndex(name);
	if (slot >= 0)
	{
		state = shared->models[slot].state;
		model = shared->models[slot].model;
		strlcpy(reason, shared->models[slot].reason, sizeof(reason));
		strlcpy(hint, shared->models[slot].hint, sizeof(hint));
	}
	LWLockRelease(shared->lock);

	initStringInfo(&out);
	appendStringInfoChar(&out, '{');
	json_key_string(&out, "status", state_name(state), true);
	if (state == CAI_WORKER_READY)
	{
		json_key_string(&out, "name", model.info.name, false);
		json_key_string(&out, "arch", model.info.arch, false);
		json_key_string(&out, "path", model.path, false);
		json_key_string(&out, "chat_template", model.info.chat_template, false);
		json_key_int(&out, "layers", model.info.n_layers);
		json_key_int(&out, "d_model", model.info.d_model);
		json_key_int(&out, "heads", model.info.n_heads);
		json_key_int(&out, "kv_heads", model.info.n_kv_heads);
		json_key_int(&out, "head_dim", model.info.head_dim);
		json_key_int(&out, "d_ff", model.info.d_ff);
		json_key_int(&out, "vocab", model.info.n_vocab);
		json_key_int(&out, "trained_context", model.info.trained_context);
		json_key_int(&out, "context_length", model.info.context_length);
		json_key_int(&out, "params", model.info.n_params);
		json_key_int(&out, "weight_bytes", (int64) model.info.weight_bytes);
		json_key_int(&out, "kv_bytes_per_token", (int64) model.info.kv_bytes_per_token);
		json_key_int(&out, "kv_window", model.info.kv_window);
		json_key_string(&out, "weight_rounding",
						model.info.gptq_rounding ? "gptq" : "nearest", false);
		json_key_string(&out, "activation_precision",
						model.info.two_digit_activations ? "two_digit" :
						model.info.superblock_activations ? "int8_256" : "int8", false);
		json_key_string(&out, "weights", model.info.file_weights ? "file" : "int8", false);
		json_key_int(&out, "kv_window_bytes_per_token",
					 (int64) model.info.kv_window_bytes_per_token);
		json_key_string(&out, "device", model.info.device, false);
		json_key_string(&out, "device_reason", model.info.device_reason, false);
		appendStringInfo(&out, ", \"load_seconds\": %.3f", model.info.load_seconds);
	}
	else if (state == CAI_WORKER_FAILED)
	{
		json_key_string(&out, "reason", reason, false);
		json_key_string(&out, "hint", hint, false);
	}
	appendStringInfoChar(&out, '}');

	PG_RETURN_DATUM(DirectFunctionCall1(jsonb_in, CStringGetDatum(out.data)));
}

/* counters minus their values at the last reset: what accumulated since */
static void
subtract_worker_counters(CaiWorkerCounters *counters, const CaiWorkerCounters *base)
{
	counters->requests_received -= base->requests_received;
	counters->requests_completed -= base->requests_completed;
	counters->requests_failed -= base->requests_failed;
	counters->requests_abandoned -= base->requests_abandoned;
	counters->requests_client_lost -= base->requests_client_lost;
}

/* the engine's cumulative counters since the last reset; its gauges (running, KV and cache in use) stay */
static void
subtract_engine_counters(cai_engine_stats *es, const cai_engine_stats *base)
{
	es->steps -= base->steps;
	es->step_sequences -= base->step_sequences;
	es->prompt_tokens -= base->prompt_tokens;
	es->prefill_tokens -= base->prefill_tokens;
	es->generated_tokens -= base->generated_tokens;
	es->requests_finished -= base->requests_finished;
	es->requests_cancelled -= base->requests_cancelled;
	es->requests_rejected -= base->requests_rejected;
	es->busy_seconds -= base->busy_seconds;
	es->cache_lookups -= base->cache_lookups;
	es->cache_lookup_tokens -= base->cache_lookup_tokens;
	es->cache_hit_tokens -= base->cache_hit_tokens;
	es->cache_evictions -= base->cache_evictions;
	es->gemm_fallbacks -= base->gemm_fallbacks;
	es->disk_hits -= base->disk_hits;
	es->disk_hit_tokens -= base->disk_hit_tokens;
	es->disk_bytes_read -= base->disk_bytes_read;
	es->disk_bytes_written -= base->disk_bytes_written;
	es->disk_writes_dropped -= base->disk_writes_dropped;
	es->disk_evictions -= base->disk_evictions;
}

/* One model's row of pg_stat_cai, as read under the lock */
typedef struct StatsRow
{
	char		name[CAI_MODEL_NAME_MAX + 1];
	CaiWorkerState state;
	char		model_name[128];
	char		device[128];
	int			engine_pid;
	uint64		engine_starts;
	TimestampTz engine_started;
	char		engine_last_exit[CAI_EXIT_TEXT_SIZE];
	cai_engine_stats es;
	CaiWorkerCounters counters;
	double		recent_rate;
} StatsRow;

/*
 * read_stats_rows
 *		The rows of pg_stat_cai: one per served model, or, before the worker has any, one for
 *		the first configured model, not running.  Takes the pg_cai lock in shared mode.
 */
static int
read_stats_rows(CaiSharedState *shared, StatsRow *rows, int *worker_pid, int *queued,
				TimestampTz *started, TimestampTz *updated, TimestampTz *stats_reset)
{
	int			n = 0;
	bool		reset_applies;

	memset(rows, 0, sizeof(StatsRow) * CAI_MAX_MODELS);
	LWLockAcquire(shared->lock, LW_SHARED);
	*worker_pid = shared->worker_pid;
	*queued = shared->ring_count;
	*started = shared->worker_started;
	*updated = shared->stats_updated;
	*stats_reset = shared->stats_reset;
	reset_applies = shared->stats_reset != 0 &&
		shared->reset_worker_generation == pg_atomic_read_u64(&shared->generation);
	for (int i = 0; i < CAI_MAX_MODELS; i++)
	{
		CaiModelSlot *slot = &shared->models[i];
		StatsRow   *row = &rows[n];

		if (slot->name[0] == '\0')
			continue;
		strlcpy(row->name, slot->name, sizeof(row->name));
		row->state = slot->state;
		strlcpy(row->model_name, slot->model.info.name, sizeof(row->model_name));
		strlcpy(row->device, slot->model.info.device, sizeof(row->device));
		row->engine_pid = slot->engine_pid;
		row->engine_starts = slot->engine_starts;
		row->engine_started = slot->engine_started;
		strlcpy(row->engine_last_exit, slot->engine_last_exit, sizeof(row->engine_last_exit));
		row->es = slot->engine_stats;
		row->counters = slot->counters;
		row->recent_rate = slot->recent_tokens_per_second;
		if (reset_applies)
		{
			subtract_worker_counters(&row->counters, &slot->counters_base);
			if (slot->reset_engine_starts == row->engine_starts)
				subtract_engine_counters(&row->es, &slot->engine_stats_base);
		}
		n++;
	}
	LWLockRelease(shared->lock);

	if (n == 0)
	{
		CaiModelList list;

		CaiModelsConfigured(&list);
		strlcpy(rows[0].name, list.entries[0].name, sizeof(rows[0].name));
		rows[0].state = CAI_WORKER_NOT_RUNNING;
		n = 1;
	}
	return n;
}

/*
 * stats_tuple
 *		One row of pg_stat_cai in the shape tupdesc asks for: 0.1's, which ends at
 *		recent_tokens_per_second, or later ones with stats_reset and the model's name (0.2),
 *		then (0.3) requests_client_lost and the disk tier's columns.
 */
static HeapTuple
stats_tuple(TupleDesc tupdesc, const StatsRow *row, int pid, int queued, TimestampTz started,
			TimestampTz updated, TimestampTz stats_reset)
{
	Datum		values[53];
	bool		nulls[53];
	int			i = 0;
	const cai_engine_stats *es = &row->es;
	const CaiWorkerCounters *counters = &row->counters;

	memset(nulls, 0, sizeof(nulls));

	values[i] = Int32GetDatum(pid);
	nulls[i++] = (pid == 0);
	values[i++] = CStringGetTextDatum(state_name(row->state));
	values[i] = CStringGetTextDatum(row->model_name);
	nulls[i++] = (row->state != CAI_WORKER_READY);
	values[i] = CStringGetTextDatum(row->device);
	nulls[i++] = (row->state != CAI_WORKER_READY);
	values[i] = Int32GetDatum(row->engine_pid);
	nulls[i++] = (row->engine_pid == 0);
	values[i++] = Int64GetDatum((int64) row->engine_starts);
	values[i] = TimestampTzGetDatum(row->engine_started);
	nulls[i++] = (row->engine_started == 0);
	values[i] = CStringGetTextDatum(row->engine_last_exit);
	nulls[i++] = (row->engine_last_exit[0] == '\0');
	values[i++] = Int64GetDatum((int64) counters->requests_received);
	values[i++] = Int64GetDatum((int64) counters->requests_completed);
	values[i++] = Int64GetDatum((int64) counters->requests_failed);
	values[i++] = Int64GetDatum((int64) counters->requests_abandoned);
	values[i++] = Int64GetDatum((int64) es->requests_rejected);
	values[i++] = Int32GetDatum(queued);
	values[i++] = Int32GetDatum(es->waiting);
	values[i++] = Int32GetDatum(es->running);
	values[i++] = Int64GetDatum((int64) es->steps);
	values[i] = Float8GetDatum(es->steps > 0 ? (double) es->step_sequences / es->steps : 0.0);
	nulls[i++] = (es->steps == 0);
	values[i++] = Int64GetDatum((int64) es->prompt_tokens);
	values[i++] = Int64GetDatum((int64) es->prefill_tokens);
	values[i++] = Int64GetDatum((int64) es->generated_tokens);
	values[i++] = Int64GetDatum((int64) es->cache_lookups);
	values[i++] = Int64GetDatum((int64) es->cache_lookup_tokens);
	values[i++] = Int64GetDatum((int64) es->cache_hit_tokens);
	values[i] = Float8GetDatum(es->cache_lookup_tokens > 0 ?
							   (double) es->cache_hit_tokens / es->cache_lookup_tokens : 0.0);
	nulls[i++] = (es->cache_lookup_tokens == 0);
	values[i++] = Int64GetDatum((int64) es->cache_blocks);
	values[i++] = Int64GetDatum((int64) es->cache_bytes);
	values[i++] = Int64GetDatum((int64) es->cache_budget_bytes);
	values[i++] = Int64GetDatum((int64) es->cache_evictions);
	values[i++] = Int32GetDatum(es->kv_blocks_total);
	values[i++] = Int32GetDatum(es->kv_blocks_free);
	values[i++] = Int64GetDatum((int64) es->kv_bytes_total);
	values[i++] = Int64GetDatum((int64) es->kv_bytes_used);
	values[i++] = Int64GetDatum((int64) es->kv_tokens_held);
	values[i++] = Int64GetDatum((int64) es->gemm_fallbacks);
	values[i++] = Float8GetDatum(es->busy_seconds);
	values[i] = TimestampTzGetDatum(started);
	nulls[i++] = (started == 0);
	values[i] = TimestampTzGetDatum(updated);
	nulls[i++] = (updated == 0);
	values[i++] = Float8GetDatum(row->recent_rate);
	/* pg_stat_cai of 0.1 (before ALTER EXTENSION pg_cai UPDATE) has no stats_reset column */
	if (tupdesc->natts > i)
	{
		values[i] = TimestampTzGetDatum(stats_reset);
		nulls[i++] = (stats_reset == 0);
	}
	if (tupdesc->natts > i)
		values[i++] = CStringGetTextDatum(row->name);
	/* 0.3's: the requests dropped because their client went away */
	if (tupdesc->natts > i)
		values[i++] = Int64GetDatum((int64) counters->requests_client_lost);
	/* 0.3: the prefix cache's disk tier */
	if (tupdesc->natts > i)
	{
		values[i++] = Int64GetDatum((int64) es->disk_hits);
		values[i++] = Int64GetDatum((int64) es->disk_hit_tokens);
		values[i++] = Int64GetDatum((int64) es->disk_bytes_read);
		values[i++] = Int64GetDatum((int64) es->disk_bytes_written);
		values[i++] = Int64GetDatum((int64) es->disk_writes_dropped);
		values[i++] = Int64GetDatum((int64) es->disk_evictions);
		values[i++] = Int64GetDatum((int64) es->disk_files);
		values[i++] = Int64GetDatum((int64) es->disk_bytes);
		values[i++] = Int64GetDatum((int64) es->disk_budget_bytes);
	}

	Assert(i == tupdesc->natts);
	return heap_form_tuple(tupdesc, values, nulls);
}

/*
 * cai_stats() -> SETOF record
 *		The rows of pg_stat_cai: one per served model (the worker's and the intake ring's
 *		columns repeat on each).  Declared as returning one record (0.1's cai_stats), it returns
 *		the first.  Takes the pg_cai lock in shared mode.
 */
Datum
pg_cai_stats(PG_FUNCTION_ARGS)
{
	CaiSharedState *shared = CaiSharedStateOrError();
	TupleDesc	tupdesc;
	StatsRow	rows[CAI_MAX_MODELS];
	int			n;
	int			pid;
	int			queued;
	TimestampTz started;
	TimestampTz updated;
	TimestampTz stats_reset;
	ReturnSetInfo *rsinfo;

	n = read_stats_rows(shared, rows, &pid, &queued, &started, &updated, &stats_reset);
	if (!fcinfo->flinfo->fn_retset)
	{
		if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "return type must be a row type");
		PG_RETURN_DATUM(HeapTupleGetDatum(stats_tuple(tupdesc, &rows[0], pid, queued, started,
													  updated, stats_reset)));
	}

	CaiInitMaterializedSRF(fcinfo);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	for (int i = 0; i < n; i++)
	{
		HeapTuple	tuple = stats_tuple(rsinfo->setDesc, &rows[i], pid, queued, started,
										updated, stats_reset);

		tuplestore_puttuple(rsinfo->setResult, tuple);
	}
	return (Datum) 0;
}

/*
 * cache_request_all
 *		Sends a cache request (kind, with payload's bytes) to every served model's engine and
 *		waits for each to answer.  With several models, one that is unavailable has no cache
 *		and is passed over.
 */
static void
cache_request_all(cai_request_kind kind, const cai_wbuf *body)
{
	CaiModelList list;

	(void) CaiSharedStateOrError();
	CaiModelsConfigured(&list);
	for (int m = 0; m < list.n; m++)
	{
		cai_wbuf	payload;
		CaiChannel *channel;
		char	   *data;
		Size		len;
		int			slot;
		bool		failed;

		LWLockAcquire(cai_shared->lock, LW_SHARED);
		slot = CaiSharedModelIndex(list.entries[m].name);
		failed = slot >= 0 && cai_shared->models[slot].state == CAI_WORKER_FAILED;
		LWLockRelease(cai_shared->lock);
		if (failed && list.n > 1)
			continue;

		CaiWireInit(&payload);
		if (body)
			cai_put_bytes(&payload, body->data, body->len);
		channel = CaiChannelOpenFor(kind, &payload, list.entries[m].name);
		CaiChannelReceive(channel, &data, &len);
		if (data[0] == CAI_MSG_ERROR)
		{
			char	   *copy = palloc(len - 1);

			memcpy(copy, data + 1, len - 1);
			CaiChannelClose(channel);
			CaiRaiseWorkerError(copy, len - 1);
		}
		CaiChannelClose(channel);
	}
}

/*
 * cai_cache_reset() -> void
 *		Empties the prefix cache of every served model's engine, in memory and on disk.  Blocks
 *		pinned by running requests go when those finish.
 */
Datum
pg_cai_cache_reset(PG_FUNCTION_ARGS)
{
	cache_request_all(CAI_REQUEST_CACHE_RESET, NULL);
	PG_RETURN_VOID();
}

/*
 * cai_forget(conversation_id bigint) -> void
 *		Drops the conversation's cached KV from every served model's engine, in memory and in
 *		the disk tier: the blocks its turns cached first, and any cached after them.  The caller
 *		must see the conversation (row-level security applies), whose row is locked like a
 *		turn's, so that a turn in progress finishes (and caches) first.
 */
Datum
pg_cai_forget(PG_FUNCTION_ARGS)
{
	int64		conversation_id;
	cai_wbuf	body;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("conversation_id must not be null")));
	conversation_id = PG_GETARG_INT64(0);

	/*
	 * On the primary, wait for a turn of the conversation in progress (its row lock), so that
	 * the blocks its reply caches are gone too; a standby stores no turns, so it only checks
	 * that the caller may name the conversation.
	 */
	if (RecoveryInProgress())
		CaiConversationRequireVisible(conversation_id);
	else
		(void) CaiConversationLoad(conversation_id, 0);
	CaiWireInit(&body);
	cai_put_u64(&body, (uint64) conversation_id);
	cache_request_all(CAI_REQUEST_CACHE_FORGET, &body);
	PG_RETURN_VOID();
}

/*
 * cai_stat_reset() -> timestamptz
 *		Zeroes pg_stat_cai's counters (requests, steps, tokens, cache lookups and hits, busy time)
 *		by remembering their current values, and returns the reset time, which pg_stat_cai shows
 *		as stats_reset.  Gauges (queued, running, cache and KV in use) and engine_starts are not
 *		counters and stay.  Takes the pg_cai lock exclusively; execution is granted to no one
 *		but superusers by the install script.
 */
Datum
pg_cai_stat_reset(PG_FUNCTION_ARGS)
{
	CaiSharedState *shared = CaiSharedStateOrError();
	TimestampTz now = GetCurrentTimestamp();

	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	shared->stats_reset = now;
	shared->reset_worker_generation = pg_atomic_read_u64(&shared->generation);
	for (int i = 0; i < CAI_MAX_MODELS; i++)
	{
		CaiModelSlot *slot = &shared->models[i];

		slot->reset_engine_starts = slot->engine_starts;
		slot->engine_stats_base = slot->engine_stats;
		slot->counters_base = slot->counters;
	}
	LWLockRelease(shared->lock);
	PG_RETURN_TIMESTAMPTZ(now);
}
