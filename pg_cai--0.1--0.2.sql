/* pg_cai--0.1--0.2.sql — upgrade of pg_cai from 0.1 to 0.2 (ALTER EXTENSION pg_cai UPDATE) */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION pg_cai UPDATE TO '0.2'" to load this file. \quit

--
-- pg_cai--0.1.sql is frozen: a fresh CREATE EXTENSION runs it and then this script, so a new
-- database and an upgraded one get the same objects by the same statements.  Every change of
-- 0.2 goes here.
--

--
-- pg_stat_cai gains stats_reset, and a superuser's cai_stat_reset() zeroes its counters.  A
-- function's OUT columns cannot change in place: the view and its function are made again, with
-- the same privileges.
--
DROP VIEW pg_stat_cai;
DROP FUNCTION cai_stats();

CREATE FUNCTION cai_stats(
	OUT worker_pid int,
	OUT status text,
	OUT model text,
	OUT device text,
	OUT engine_pid int,
	OUT engine_starts bigint,
	OUT engine_started timestamptz,
	OUT engine_last_exit text,
	OUT requests_received bigint,
	OUT requests_completed bigint,
	OUT requests_failed bigint,
	OUT requests_abandoned bigint,
	OUT requests_rejected bigint,
	OUT queued int,
	OUT waiting int,
	OUT running int,
	OUT steps bigint,
	OUT avg_batch float8,
	OUT prompt_tokens bigint,
	OUT prefill_tokens bigint,
	OUT generated_tokens bigint,
	OUT cache_lookups bigint,
	OUT cache_lookup_tokens bigint,
	OUT cache_hit_tokens bigint,
	OUT cache_hit_rate float8,
	OUT cache_blocks bigint,
	OUT cache_bytes bigint,
	OUT cache_budget_bytes bigint,
	OUT cache_evictions bigint,
	OUT kv_blocks_total int,
	OUT kv_blocks_free int,
	OUT kv_bytes_total bigint,
	OUT kv_bytes_used bigint,
	OUT kv_tokens_held bigint,
	OUT gemm_fallbacks bigint,
	OUT busy_seconds float8,
	OUT worker_started timestamptz,
	OUT stats_updated timestamptz,
	OUT recent_tokens_per_second float8,
	OUT stats_reset timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'pg_cai_stats'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_stats() IS
'the engine worker''s counters (the pg_stat_cai view)';

CREATE VIEW pg_stat_cai AS
SELECT s.*,
	   CASE WHEN s.busy_seconds > 0 THEN s.generated_tokens / s.busy_seconds END AS tokens_per_second,
	   j.jobs_pending, j.jobs_running, j.jobs_done, j.jobs_failed
FROM cai_stats() s,
	 LATERAL (SELECT count(*) FILTER (WHERE status = 'pending') AS jobs_pending,
					 count(*) FILTER (WHERE status = 'running') AS jobs_running,
					 count(*) FILTER (WHERE status = 'done') AS jobs_done,
					 count(*) FILTER (WHERE status = 'failed') AS jobs_failed
			  FROM cai.jobs) j;
COMMENT ON VIEW pg_stat_cai IS
'the pg_cai engine worker: status, requests, tokens, batching (avg_batch: sequences per step), throughput (tokens_per_second: generated tokens per busy second; recent_tokens_per_second: over about the last 10 s), prefix cache and KV use, and the reply jobs of the current database; counters count since stats_reset (cai_stat_reset()), gauges are current';

REVOKE ALL ON FUNCTION cai_stats() FROM PUBLIC;
REVOKE ALL ON pg_stat_cai FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_stats() TO cai_user, pg_monitor;
GRANT SELECT ON pg_stat_cai TO cai_user, pg_monitor;

CREATE FUNCTION cai_stat_reset()
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'pg_cai_stat_reset'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_stat_reset() IS
'zeroes pg_stat_cai''s counters (requests, steps, tokens, cache lookups and hits, busy time) and returns the reset time, shown as stats_reset; superusers only';
REVOKE ALL ON FUNCTION cai_stat_reset() FROM PUBLIC;
