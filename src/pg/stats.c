/*
 * stats.c — what SQL can see of the engine: cai_model_info(), the pg_stat_cai view's function
 * cai_stats(), cai_stat_reset() and cai_cache_reset().
 *
 * The worker publishes a summary of its model and its statistics in shared memory, so reading
 * them costs no round trip and works while the worker is busy.
 */
#include "postgres.h"

#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "channel.h"
#include "guc.h"
#include "protocol.h"
#include "shmem.h"

PG_FUNCTION_INFO_V1(pg_cai_model_info);
PG_FUNCTION_INFO_V1(pg_cai_stats);
PG_FUNCTION_INFO_V1(pg_cai_cache_reset);
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
 * cai_model_info() -> jsonb
 *		The loaded model and the device that serves it; without a model, the worker's status and
 *		the reason.  Takes the pg_cai lock in shared mode.
 */
Datum
pg_cai_model_info(PG_FUNCTION_ARGS)
{
	CaiSharedState *shared = CaiSharedStateOrError();
	CaiWorkerState state;
	CaiModelSummary model;
	char		reason[CAI_REASON_SIZE];
	char		hint[CAI_REASON_SIZE];
	StringInfoData out;

	LWLockAcquire(shared->lock, LW_SHARED);
	state = shared->state;
	model = shared->model;
	strlcpy(reason, shared->reason, sizeof(reason));
	strlcpy(hint, shared->hint, sizeof(hint));
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
						model.info.two_digit_activations ? "two_digit" : "int8", false);
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
}

/*
 * cai_stats() -> record
 *		One row of counters for pg_stat_cai.  Takes the pg_cai lock in shared mode.
 */
Datum
pg_cai_stats(PG_FUNCTION_ARGS)
{
	CaiSharedState *shared = CaiSharedStateOrError();
	TupleDesc	tupdesc;
	Datum		values[41];
	bool		nulls[41];
	int			i = 0;
	int			pid;
	CaiWorkerState state;
	char		model_name[128];
	char		device[128];
	int			engine_pid;
	uint64		engine_starts;
	TimestampTz engine_started;
	char		engine_last_exit[CAI_EXIT_TEXT_SIZE];
	cai_engine_stats es;
	CaiWorkerCounters counters;
	int			queued;
	TimestampTz started;
	TimestampTz updated;
	double		recent_rate;
	TimestampTz stats_reset;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	LWLockAcquire(shared->lock, LW_SHARED);
	pid = shared->worker_pid;
	state = shared->state;
	strlcpy(model_name, shared->model.info.name, sizeof(model_name));
	strlcpy(device, shared->model.info.device, sizeof(device));
	engine_pid = shared->engine_pid;
	engine_starts = shared->engine_starts;
	engine_started = shared->engine_started;
	strlcpy(engine_last_exit, shared->engine_last_exit, sizeof(engine_last_exit));
	es = shared->engine_stats;
	counters = shared->counters;
	queued = shared->ring_count;
	started = shared->worker_started;
	updated = shared->stats_updated;
	recent_rate = shared->recent_tokens_per_second;
	stats_reset = shared->stats_reset;
	if (stats_reset != 0 &&
		shared->reset_worker_generation == pg_atomic_read_u64(&shared->generation))
	{
		subtract_worker_counters(&counters, &shared->counters_base);
		if (shared->reset_engine_starts == engine_starts)
			subtract_engine_counters(&es, &shared->engine_stats_base);
	}
	LWLockRelease(shared->lock);

	memset(nulls, 0, sizeof(nulls));

	values[i] = Int32GetDatum(pid);
	nulls[i++] = (pid == 0);
	values[i++] = CStringGetTextDatum(state_name(state));
	values[i] = CStringGetTextDatum(model_name);
	nulls[i++] = (state != CAI_WORKER_READY);
	values[i] = CStringGetTextDatum(device);
	nulls[i++] = (state != CAI_WORKER_READY);
	values[i] = Int32GetDatum(engine_pid);
	nulls[i++] = (engine_pid == 0);
	values[i++] = Int64GetDatum((int64) engine_starts);
	values[i] = TimestampTzGetDatum(engine_started);
	nulls[i++] = (engine_started == 0);
	values[i] = CStringGetTextDatum(engine_last_exit);
	nulls[i++] = (engine_last_exit[0] == '\0');
	values[i++] = Int64GetDatum((int64) counters.requests_received);
	values[i++] = Int64GetDatum((int64) counters.requests_completed);
	values[i++] = Int64GetDatum((int64) counters.requests_failed);
	values[i++] = Int64GetDatum((int64) counters.requests_abandoned);
	values[i++] = Int64GetDatum((int64) es.requests_rejected);
	values[i++] = Int32GetDatum(queued);
	values[i++] = Int32GetDatum(es.waiting);
	values[i++] = Int32GetDatum(es.running);
	values[i++] = Int64GetDatum((int64) es.steps);
	values[i] = Float8GetDatum(es.steps > 0 ? (double) es.step_sequences / es.steps : 0.0);
	nulls[i++] = (es.steps == 0);
	values[i++] = Int64GetDatum((int64) es.prompt_tokens);
	values[i++] = Int64GetDatum((int64) es.prefill_tokens);
	values[i++] = Int64GetDatum((int64) es.generated_tokens);
	values[i++] = Int64GetDatum((int64) es.cache_lookups);
	values[i++] = Int64GetDatum((int64) es.cache_lookup_tokens);
	values[i++] = Int64GetDatum((int64) es.cache_hit_tokens);
	values[i] = Float8GetDatum(es.cache_lookup_tokens > 0 ?
							   (double) es.cache_hit_tokens / es.cache_lookup_tokens : 0.0);
	nulls[i++] = (es.cache_lookup_tokens == 0);
	values[i++] = Int64GetDatum((int64) es.cache_blocks);
	values[i++] = Int64GetDatum((int64) es.cache_bytes);
	values[i++] = Int64GetDatum((int64) es.cache_budget_bytes);
	values[i++] = Int64GetDatum((int64) es.cache_evictions);
	values[i++] = Int32GetDatum(es.kv_blocks_total);
	values[i++] = Int32GetDatum(es.kv_blocks_free);
	values[i++] = Int64GetDatum((int64) es.kv_bytes_total);
	values[i++] = Int64GetDatum((int64) es.kv_bytes_used);
	values[i++] = Int64GetDatum((int64) es.kv_tokens_held);
	values[i++] = Int64GetDatum((int64) es.gemm_fallbacks);
	values[i++] = Float8GetDatum(es.busy_seconds);
	values[i] = TimestampTzGetDatum(started);
	nulls[i++] = (started == 0);
	values[i] = TimestampTzGetDatum(updated);
	nulls[i++] = (updated == 0);
	values[i++] = Float8GetDatum(recent_rate);
	/* pg_stat_cai of 0.1 (before ALTER EXTENSION pg_cai UPDATE) has no stats_reset column */
	if (tupdesc->natts > i)
	{
		values[i] = TimestampTzGetDatum(stats_reset);
		nulls[i++] = (stats_reset == 0);
	}

	Assert(i == tupdesc->natts);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * cai_cache_reset() -> void
 *		Empties the engine's prefix cache.  Blocks pinned by running requests go when those
 *		finish.
 */
Datum
pg_cai_cache_reset(PG_FUNCTION_ARGS)
{
	cai_wbuf	payload;
	CaiChannel *channel;
	char	   *data;
	Size		len;

	(void) CaiSharedStateOrError();
	CaiWireInit(&payload);
	channel = CaiChannelOpen(CAI_REQUEST_CACHE_RESET, &payload);
	CaiChannelReceive(channel, &data, &len);
	if (data[0] == CAI_MSG_ERROR)
	{
		char	   *copy = palloc(len - 1);

		memcpy(copy, data + 1, len - 1);
		CaiChannelClose(channel);
		CaiRaiseWorkerError(copy, len - 1);
	}
	CaiChannelClose(channel);
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
	shared->reset_engine_starts = shared->engine_starts;
	shared->engine_stats_base = shared->engine_stats;
	shared->counters_base = shared->counters;
	LWLockRelease(shared->lock);
	PG_RETURN_TIMESTAMPTZ(now);
}
