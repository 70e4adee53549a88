/* pg_cai--0.2--0.3.sql — upgrade of pg_cai from 0.2 to 0.3 (ALTER EXTENSION pg_cai UPDATE) */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION pg_cai UPDATE TO '0.3'" to load this file. \quit

--
-- pg_cai--0.1.sql and pg_cai--0.1--0.2.sql are frozen: a fresh CREATE EXTENSION runs them and
-- then this script, so a new database and an upgraded one get the same objects by the same
-- statements.  Every change of 0.3 goes here.
--

--
-- The prefix cache's disk tier (pg_cai.disk_cache_dir, pg_cai.disk_cache_size): pg_stat_cai
-- gains its columns at the end (blocks read back and the tokens they served, bytes read and
-- written, writes dropped, files evicted, its files and size now, its budget), so cai_stats()
-- and the view are made again with the same privileges.  cai_forget(conversation_id) drops a
-- conversation's cached KV from memory and disk.
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
	OUT stats_reset timestamptz,
	OUT model_id text,
	OUT disk_hits bigint,
	OUT disk_hit_tokens bigint,
	OUT disk_bytes_read bigint,
	OUT disk_bytes_written bigint,
	OUT disk_writes_dropped bigint,
	OUT disk_evictions bigint,
	OUT disk_files bigint,
	OUT disk_bytes bigint,
	OUT disk_budget_bytes bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'pg_cai_stats'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER
ROWS 1;
COMMENT ON FUNCTION cai_stats() IS
'the engine worker''s counters, one row per served model (the pg_stat_cai view)';

CREATE VIEW pg_stat_cai AS
SELECT s.worker_pid, s.status, s.model, s.device, s.engine_pid, s.engine_starts,
	   s.engine_started, s.engine_last_exit, s.requests_received, s.requests_completed,
	   s.requests_failed, s.requests_abandoned, s.requests_rejected, s.queued, s.waiting,
	   s.running, s.steps, s.avg_batch, s.prompt_tokens, s.prefill_tokens, s.generated_tokens,
	   s.cache_lookups, s.cache_lookup_tokens, s.cache_hit_tokens, s.cache_hit_rate,
	   s.cache_blocks, s.cache_bytes, s.cache_budget_bytes, s.cache_evictions,
	   s.kv_blocks_total, s.kv_blocks_free, s.kv_bytes_total, s.kv_bytes_used,
	   s.kv_tokens_held, s.gemm_fallbacks, s.busy_seconds, s.worker_started, s.stats_updated,
	   s.recent_tokens_per_second, s.stats_reset,
	   CASE WHEN s.busy_seconds > 0 THEN s.generated_tokens / s.busy_seconds END AS tokens_per_second,
	   j.jobs_pending, j.jobs_running, j.jobs_done, j.jobs_failed,
	   s.model_id,
	   s.disk_hits, s.disk_hit_tokens, s.disk_bytes_read, s.disk_bytes_written,
	   s.disk_writes_dropped, s.disk_evictions, s.disk_files, s.disk_bytes, s.disk_budget_bytes
FROM cai_stats() s,
	 LATERAL (SELECT count(*) FILTER (WHERE status = 'pending') AS jobs_pending,
					 count(*) FILTER (WHERE status = 'running') AS jobs_running,
					 count(*) FILTER (WHERE status = 'done') AS jobs_done,
					 count(*) FILTER (WHERE status = 'failed') AS jobs_failed
			  FROM cai.jobs) j;
COMMENT ON VIEW pg_stat_cai IS
'the pg_cai engine worker, one row per served model (model_id: the name calls pick it by): status, requests, tokens, batching (avg_batch: sequences per step), throughput (tokens_per_second: generated tokens per busy second; recent_tokens_per_second: over about the last 10 s), prefix cache and KV use, the reply jobs of the current database, and the prefix cache''s disk tier (disk_*: blocks read back and the tokens they served, bytes read and written, writes dropped, files evicted, files and bytes now, budget; 0 budget: no tier); counters count since stats_reset (cai_stat_reset()), gauges are current; queued (the intake ring) and the jobs are the worker''s and the database''s, repeated on each row';

REVOKE ALL ON FUNCTION cai_stats() FROM PUBLIC;
REVOKE ALL ON pg_stat_cai FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_stats() TO cai_user, pg_monitor;
GRANT SELECT ON pg_stat_cai TO cai_user, pg_monitor;

CREATE FUNCTION cai_forget(conversation_id bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'pg_cai_forget'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_forget(bigint) IS
'drops the conversation''s cached KV (the prefix cache''s blocks its turns made, in memory and in the disk tier) from every served model''s engine; its rows stay';
REVOKE ALL ON FUNCTION cai_forget(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_forget(bigint) TO cai_user;
