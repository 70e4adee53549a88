--
-- pg_stat_cai shows the worker, its requests, tokens and the prefix cache; cai_cache_reset
-- empties the cache.  (Runs after the chat tests, so the counters are not zero.)
--
SELECT status, worker_pid IS NOT NULL AS has_pid, model IS NOT NULL AS has_model,
       length(device) > 0 AS has_device, worker_started IS NOT NULL AS started
FROM pg_stat_cai;
-- the engine runs in a process of its own, started by the worker (the scenario tests kill it)
SELECT engine_pid IS NOT NULL AND engine_pid <> worker_pid AS engine_has_own_process,
       engine_starts >= 1 AS started_once, engine_started IS NOT NULL AS engine_started
FROM pg_stat_cai;
-- the worker shows in pg_stat_activity (with no database), the engine process does not
SELECT a.backend_type, a.datname, a.wait_event_type
FROM pg_stat_activity a, pg_stat_cai s WHERE a.pid = s.worker_pid;
-- its waits have a name from PostgreSQL 17 on (custom wait events), the generic one before
SELECT a.wait_event = CASE WHEN current_setting('server_version_num')::int >= 170000
                           THEN 'PgCaiEngineWorker' ELSE 'Extension' END AS wait_event_named
FROM pg_stat_activity a, pg_stat_cai s WHERE a.pid = s.worker_pid;
SELECT count(*) AS engine_in_pg_stat_activity
FROM pg_stat_activity a, pg_stat_cai s WHERE a.pid = s.engine_pid;
SELECT requests_received > 0 AS received, requests_completed > 0 AS completed,
       requests_failed > 0 AS failed, generated_tokens > 0 AS generated,
       prompt_tokens >= prefill_tokens AS prefill_saved, cache_hit_tokens > 0 AS cache_hits,
       cache_hit_rate > 0 AND cache_hit_rate <= 1 AS hit_rate, steps > 0 AS stepped,
       kv_blocks_total > 0 AS has_kv, cache_budget_bytes = 64 * 1024 * 1024 AS budget
FROM pg_stat_cai;
-- the KV pool's bytes (idle: only the prefix cache holds any), and no GEMM on a fallback kernel
SELECT kv_bytes_total > 0 AS kv_bytes, kv_bytes_used = cache_bytes AS used_is_cache,
       kv_tokens_held = 0 AS none_running, gemm_fallbacks = 0 AS no_fallbacks
FROM pg_stat_cai;

-- a request is counted
SELECT requests_received AS before FROM pg_stat_cai \gset
SELECT cai_tokenize('counting');
SELECT requests_received - :before AS new_requests FROM pg_stat_cai;

-- a repeated prompt hits the cache; after a reset it does not
SELECT cai_new_conversation('You are a helpful assistant. Answer in one short sentence.') AS conv \gset
SELECT length(cai_chat(:conv, 'Name a color.', '{"max_tokens": 4}')) > 0 AS replied;
SELECT cai_new_conversation('You are a helpful assistant. Answer in one short sentence.') AS conv2 \gset
SELECT length(cai_chat(:conv2, 'Name a color.', '{"max_tokens": 4}')) > 0 AS replied;
SELECT cai_cache_reset();
SELECT cache_blocks, cache_bytes FROM pg_stat_cai;
SELECT cai_new_conversation('You are a helpful assistant. Answer in one short sentence.') AS conv3 \gset
SELECT length(cai_chat(:conv3, 'Name a color.', '{"max_tokens": 4}')) > 0 AS replied;
SELECT c.id = :conv2 AS second, m.cached_tokens > 0 AS cache_hit
FROM cai.messages m JOIN cai.conversations c ON c.id = m.conversation_id
WHERE c.id IN (:conv2, :conv3) AND m.role = 'assistant' ORDER BY c.id;
SELECT running, waiting, queued FROM pg_stat_cai;

-- cai_stat_reset zeroes the counters, keeps the gauges (the cache still holds blocks) and says
-- when; pg_stat_cai counts again from there
SELECT cache_blocks AS blocks_before FROM pg_stat_cai \gset
SELECT cai_stat_reset() AS reset_at \gset
SELECT stats_reset = :'reset_at' AS reset_shown, requests_received, requests_completed,
       steps, prompt_tokens, generated_tokens, cache_lookups, cache_hit_tokens,
       busy_seconds = 0 AS not_busy, cache_blocks = :blocks_before AS cache_kept
FROM pg_stat_cai;
SELECT length(cai_complete('One, two,', '{"max_tokens": 2}')) > 0 AS completed;
SELECT requests_received, requests_completed, generated_tokens > 0 AS generated,
       stats_reset = :'reset_at' AS same_reset
FROM pg_stat_cai;
-- only superusers may reset
SELECT has_function_privilege('cai_user', 'cai_stat_reset()', 'EXECUTE') AS cai_user_may_reset;
CREATE ROLE regress_cai_stats_user IN ROLE cai_user;
SET ROLE regress_cai_stats_user;
SELECT cai_stat_reset();
RESET ROLE;
DROP ROLE regress_cai_stats_user;
