/*
 * stats.c — what SQL can see of the engine: cai_model_info(), the pg_stat_cai view's function
 * cai_stats(), and cai_cache_reset().
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
		json_key_string(&out, "name", model.name, false);
		json_key_string(&out, "arch", model.arch, false);
		json_key_string(&out, "path", model.path, false);
		json_key_string(&out, "chat_template", model.chat_template, false);
		json_key_int(&out, "layers", model.n_layers);
		json_key_int(&out, "d_model", model.d_model);
		json_key_int(&out, "heads", model.n_heads);
		json_key_int(&out, "kv_heads", model.n_kv_heads);
		json_key_int(&out, "head_dim", model.head_dim);
		json_key_int(&out, "d_ff", model.d_ff);
		json_key_int(&out, "vocab", model.n_vocab);
		json_key_int(&out, "trained_context", model.trained_context);
		json_key_int(&out, "context_length", model.context_length);
		json_key_int(&out, "params", model.n_params);
		json_key_int(&out, "weight_bytes", (int64) model.weight_bytes);
		json_key_int(&out, "kv_bytes_per_token", (int64) model.kv_bytes_per_token);
		json_key_string(&out, "device", model.device, false);
		json_key_string(&out, "device_reason", model.device_reason, false);
		appendStringInfo(&out, ", \"load_seconds\": %.3f", model.load_seconds);
	}
	else if (state == CAI_WORKER_FAILED)
	{
		json_key_string(&out, "reason", reason, false);
		json_key_string(&out, "hint", hint, false);
	}
	appendStringInfoChar(&out, '}');

	PG_RETURN_DATUM(DirectFunctionCall1(jsonb_in, CStringGetDatum(out.data)));
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
	Datum		values[40];
	bool		nulls[40];
	int			i = 0;
	int			pid;
	CaiWorkerState state;
	char		model_name[128];
	char		device[128];
	cai_engine_stats es;
	CaiWorkerCounters counters;
	int			queued;
	TimestampTz started;
	TimestampTz updated;
	double		recent_rate;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	LWLockAcquire(shared->lock, LW_SHARED);
	pid = shared->worker_pid;
	state = shared->state;
	strlcpy(model_name, shared->model.name, sizeof(model_name));
	strlcpy(device, shared->model.device, sizeof(device));
	es = shared->engine_stats;
	counters = shared->counters;
	queued = shared->ring_count;
	started = shared->worker_started;
	updated = shared->stats_updated;
	recent_rate = shared->recent_tokens_per_second;
	LWLockRelease(shared->lock);

	memset(nulls, 0, sizeof(nulls));

	values[i] = Int32GetDatum(pid);
	nulls[i++] = (pid == 0);
	values[i++] = CStringGetTextDatum(state_name(state));
	values[i] = CStringGetTextDatum(model_name);
	nulls[i++] = (state != CAI_WORKER_READY);
	values[i] = CStringGetTextDatum(device);
	nulls[i++] = (state != CAI_WORKER_READY);
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
	values[i++] = Float8GetDatum(es.busy_seconds);
	values[i] = TimestampTzGetDatum(started);
	nulls[i++] = (started == 0);
	values[i] = TimestampTzGetDatum(updated);
	nulls[i++] = (updated == 0);
	values[i++] = Float8GetDatum(recent_rate);

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
	StringInfoData payload;
	CaiChannel *channel;
	char	   *data;
	Size		len;

	(void) CaiSharedStateOrError();
	initStringInfo(&payload);
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
