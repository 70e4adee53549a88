--
-- Gemma 3 270M through the worker: a base model, so raw completion (cai_complete), greedy.
-- Five of its six layers attend over a window of 512 tokens and the sixth over everything; the
-- texts below grow from ~600 to ~2000 tokens, so follow-ups resume well past the window.  The
-- prefix cache must not change a single reply: cache on, cache emptied before every call
-- (off), and a cache too small for the working set (evicting) give the same text.
--
-- Run by scripts/run-tests.sh on a cluster of its own serving the Gemma file
-- (scripts/fetch-model.sh gemma3-270m) with pg_cai.context_length = 4096.
--
SELECT cai_model_info()->>'arch' AS arch, cai_model_info()->>'layers' AS layers,
       cai_model_info()->>'kv_heads' AS kv_heads, cai_model_info()->>'head_dim' AS head_dim,
       cai_model_info()->>'context_length' AS context_length;
-- 15 of the 18 layers keep their KV for the last 512 positions only
SELECT cai_model_info()->>'kv_window' AS kv_window,
       cai_model_info()->>'kv_bytes_per_token' AS kv_bytes_per_token,
       cai_model_info()->>'kv_window_bytes_per_token' AS windowed_bytes_per_token;

-- raw text starts with the model's BOS token, as llama.cpp does
SELECT cai_complete('The capital of France is', '{"max_tokens": 8, "temperature": 0}');
SELECT cai_complete('def add(a, b):', '{"max_tokens": 16, "temperature": 0}');
SELECT cai_complete('Monday, Tuesday, Wednesday,', '{"max_tokens": 8, "temperature": 0}');

-- Two texts, each continued turn after turn, the turns of the two interleaved: each prompt is
-- the text's last prompt, its reply and the next part of the licence.  mode 'warm' keeps the
-- cache, 'cold' empties it before every call.
CREATE TABLE gemma_turns (mode text, doc text, turn int, prompt text, reply text,
                          hit_tokens bigint, PRIMARY KEY (mode, doc, turn));

CREATE FUNCTION gemma_play(mode text, n_turns int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	docs	text[] := ARRAY['GPL-3', 'GPL-2'];
	prompts	text[];
	reply	text;
	hits0	bigint;
BEGIN
	FOR d IN 1..2 LOOP
		prompts[d] := substr(pg_read_file('/usr/share/common-licenses/' || docs[d]), 1, 2500);
	END LOOP;
	FOR t IN 1..n_turns LOOP
		FOR d IN 1..2 LOOP
			IF mode = 'cold' THEN
				PERFORM cai_cache_reset();
			END IF;
			SELECT cache_hit_tokens INTO hits0 FROM pg_stat_cai;
			reply := cai_complete(prompts[d], '{"max_tokens": 16, "temperature": 0}');
			INSERT INTO gemma_turns
				SELECT mode, docs[d], t, prompts[d], reply, cache_hit_tokens - hits0 FROM pg_stat_cai;
			prompts[d] := prompts[d] || reply ||
				substr(pg_read_file('/usr/share/common-licenses/' || docs[d]), 2501 + (t - 1) * 1800, 1800);
		END LOOP;
	END LOOP;
END $$;

-- After a reload that changes pg_cai.host_cache_size: waits for the engine to serve again with
-- the budget expected.
CREATE FUNCTION gemma_wait_cache_budget(expected text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1..600 LOOP
		IF EXISTS (SELECT FROM pg_stat_cai
				   WHERE status = 'ready' AND cache_budget_bytes = pg_size_bytes(expected)) THEN
			RETURN true;
		END IF;
		PERFORM pg_sleep(0.1);
	END LOOP;
	RETURN false;
END $$;

SELECT gemma_play('warm', 4);
SELECT gemma_play('cold', 4);

-- every reply equal with and without the cache; each follow-up hit at least the whole previous
-- prompt (the previous call stored its prompt and reply)
SELECT w.doc, w.turn, w.reply, w.reply = c.reply AS same_without_cache,
       w.turn = 1 OR w.hit_tokens >= array_length(cai_tokenize(p.prompt), 1) AS hit_previous_prompt,
       c.hit_tokens = 0 AS cold_missed
FROM gemma_turns w
JOIN gemma_turns c ON c.mode = 'cold' AND c.doc = w.doc AND c.turn = w.turn
LEFT JOIN gemma_turns p ON p.mode = 'warm' AND p.doc = w.doc AND p.turn = w.turn - 1
WHERE w.mode = 'warm' ORDER BY w.doc DESC, w.turn;

-- a cache smaller than the two texts' KV: blocks are evicted while the turns run, some are
-- still hit, and the replies stay the same.  The cache keeps the global layers' KV of every
-- block but the local layers' only for the window before each stored end (at its last turn a
-- text holds about 2.8 MB of the first and 4.1 MB of the second), and a follow-up resumes only
-- after a whole window: 12 MB holds one text's turns but not both, so under LRU each text's
-- insert evicts the other's and only the first follow-up finds its text.  The disk tier is off
-- here, since it would serve the evicted blocks back (its own test is test_kv_disk_tier.py).
SELECT current_setting('pg_cai.host_cache_size') AS cache0 \gset
ALTER SYSTEM SET pg_cai.host_cache_size = '12MB';
ALTER SYSTEM SET pg_cai.disk_cache_size = 0;
SELECT pg_reload_conf();
SELECT gemma_wait_cache_budget('12MB') AS restarted_small;
SELECT cache_evictions AS evictions0 FROM pg_stat_cai \gset
SELECT gemma_play('small', 4);
SELECT cache_evictions > :evictions0 AS evicted FROM pg_stat_cai;
SELECT sum(s.hit_tokens) > 0 AS some_hits, bool_and(s.reply = w.reply) AS same_as_full_cache
FROM gemma_turns s JOIN gemma_turns w ON w.mode = 'warm' AND w.doc = s.doc AND w.turn = s.turn
WHERE s.mode = 'small';
SELECT doc, turn, hit_tokens > 0 AS hit FROM gemma_turns WHERE mode = 'small' ORDER BY turn, doc DESC;
ALTER SYSTEM RESET pg_cai.host_cache_size;
ALTER SYSTEM RESET pg_cai.disk_cache_size;
SELECT pg_reload_conf();
SELECT gemma_wait_cache_budget(:'cache0') AS restarted_default;

DROP TABLE gemma_turns;
DROP FUNCTION gemma_play(text, int);
DROP FUNCTION gemma_wait_cache_budget(text);
