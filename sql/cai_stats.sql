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
