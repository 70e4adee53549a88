--
-- The prefix cache seen from SQL: follow-up turns reuse the attention KV of the stored history
-- (to the token, never the prompt's last token), greedy replies are the same with the
-- cache and without it, namespaces (pg_cai.cache_isolation = role | conversation | none) keep
-- prefixes apart, cai_cache_reset() empties the cache, and pg_stat_cai counts all of it.
--
-- The model's text is not pinned here (it changes with the engine's numerics); what is checked
-- is structure: equalities between runs and cached_tokens derived from the rules:
--   * a finished turn caches the blocks of what it computed: its prompt and its reply less the
--     last sampled token (never fed back), i.e. (prompt_tokens + completion_tokens - 1) / 16 blocks;
--   * a lookup reuses, to the token, all that a cached sequence shares with the new prompt, at
--     most prompt_tokens - 1 (the last prompt token is always run, to give the first reply token);
--   * a follow-up prompt is the previous prompt, the stored reply ids, then the new user turn:
--     ChatML adds 11 tokens per exchange (<|im_end|> \n <|im_start|> user \n before the user
--     content, <|im_end|> \n <|im_start|> ass istant \n after it).
--
SELECT cai_cache_reset();

\set sys 'You are a helpful assistant.'
\set t1 'What is the capital of France? Answer briefly.'
\set t2 'And of Germany?'
\set t3 'Which of the two cities is larger?'
\set t4 'Name a river in each.'
\set b2 'Which river flows through it?'

-- Plays user turns in a new conversation (greedy, short replies).  cold = empty the cache before
-- every turn: the cache is then of no use, which is the cache-off reference.
CREATE FUNCTION cache_play(turns text[], cold boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
	conv bigint := cai_new_conversation('You are a helpful assistant.');
	turn text;
BEGIN
	FOREACH turn IN ARRAY turns LOOP
		IF cold THEN
			PERFORM cai_cache_reset();
		END IF;
		PERFORM cai_chat(conv, turn, '{"max_tokens": 24}');
	END LOOP;
	RETURN conv;
END
$$;

-- One row per exchange: the reply's usage with the previous exchange's numbers beside it.
CREATE VIEW cache_exchanges WITH (security_invoker = true) AS
SELECT a.conversation_id, row_number() OVER w AS turn,
       a.prompt_tokens, a.completion_tokens, a.cached_tokens, a.content AS reply,
       a.tokens AS reply_ids, u.tokens AS user_ids,
       lag(a.prompt_tokens) OVER w AS prev_prompt,
       lag(a.completion_tokens) OVER w AS prev_completion,
       lag(array_length(a.tokens, 1)) OVER w AS prev_reply_len
FROM cai.messages a
CROSS JOIN LATERAL (SELECT tokens FROM cai.messages u
                    WHERE u.conversation_id = a.conversation_id AND u.role = 'user' AND u.id < a.id
                    ORDER BY u.id DESC LIMIT 1) u
WHERE a.role = 'assistant'
WINDOW w AS (PARTITION BY a.conversation_id ORDER BY a.id);

-- 1. a multi-turn conversation: every follow-up turn reuses all it can of the history
SELECT cache_lookups AS lookups0, cache_lookup_tokens AS lookup_tokens0,
       cache_hit_tokens AS hit_tokens0 FROM pg_stat_cai \gset
SELECT cache_play(ARRAY[:'t1', :'t2', :'t3', :'t4']) AS a \gset

-- the prompt is the previous one plus the stored reply ids and the new user ids, nothing else
-- (so it matches the cached sequence token for token); the hit is exactly what the previous
-- turn computed, to the token (its prompt and reply but the last sampled token, which never went
-- through the model), and stops before the new user turn
SELECT turn,
       cached_tokens > 0 AS hit,
       prompt_tokens = prev_prompt + prev_reply_len + array_length(user_ids, 1) + 11 AS prompt_from_ids,
       cached_tokens = prev_prompt + prev_completion - 1 AS hit_is_computed_history,
       cached_tokens < prompt_tokens - array_length(user_ids, 1) AS stops_before_user_turn
FROM cache_exchanges WHERE conversation_id = :a ORDER BY turn;

-- pg_stat_cai counted these four lookups, their prompt tokens and their hits
SELECT s.cache_lookups - :lookups0 AS new_lookups,
       s.cache_lookup_tokens - :lookup_tokens0 = sum(e.prompt_tokens) AS lookup_tokens_counted,
       s.cache_hit_tokens - :hit_tokens0 = sum(e.cached_tokens) AS hit_tokens_counted,
       s.cache_hit_rate BETWEEN 0 AND 1 AS rate_in_range,
       abs(s.cache_hit_rate - s.cache_hit_tokens::float8 / s.cache_lookup_tokens) < 1e-9 AS rate_is_ratio,
       s.cache_bytes <= s.cache_budget_bytes AS within_budget,
       s.cache_bytes = s.cache_blocks * 16 * (cai_model_info()->>'kv_bytes_per_token')::bigint AS bytes_are_blocks,
       -- every turn's blocks are a prefix of the last turn's: one chain of whole blocks and the
       -- last turn's partly filled tail, nothing duplicated
       s.cache_blocks = max((e.prompt_tokens + e.completion_tokens - 1 + 15) / 16) AS one_chain
FROM pg_stat_cai s, cache_exchanges e
WHERE e.conversation_id = :a
GROUP BY s.cache_lookups, s.cache_lookup_tokens, s.cache_hit_tokens, s.cache_hit_rate,
         s.cache_bytes, s.cache_budget_bytes, s.cache_blocks;
SELECT cache_blocks AS blocks_a FROM pg_stat_cai \gset

-- 2. the same conversation with the cache off (emptied before every turn), then again with the
-- whole history cached: the same replies, id for id
SELECT cache_play(ARRAY[:'t1', :'t2', :'t3', :'t4'], cold => true) AS a_cold \gset
SELECT cache_blocks AS blocks_cold FROM pg_stat_cai \gset
SELECT cache_play(ARRAY[:'t1', :'t2', :'t3', :'t4']) AS a_warm \gset
SELECT x.turn, c.cached_tokens AS cold_cached,
       -- every turn's prompt is a prefix of the cached chain: all of it but its last token
       w.cached_tokens = w.prompt_tokens - 1 AS warm_hit_all_it_can,
       x.reply = c.reply AND x.reply_ids = c.reply_ids AND x.user_ids = c.user_ids AS same_as_cold,
       x.reply = w.reply AND x.reply_ids = w.reply_ids AND x.user_ids = w.user_ids AS same_as_warm,
       x.prompt_tokens = c.prompt_tokens AND x.prompt_tokens = w.prompt_tokens AS same_prompts
FROM cache_exchanges x
JOIN cache_exchanges c ON c.conversation_id = :a_cold AND c.turn = x.turn
JOIN cache_exchanges w ON w.conversation_id = :a_warm AND w.turn = x.turn
WHERE x.conversation_id = :a ORDER BY x.turn;
-- the cold run left only its last turn's chain, and the warm replay added nothing: each of its
-- turns' blocks, and the partly filled last one, is already a block of that chain
SELECT :blocks_cold = :blocks_a AS cold_left_one_chain,
       cache_blocks - :blocks_a AS warm_added_blocks FROM pg_stat_cai;

-- 3. a conversation that shares the first exchange, then diverges: its first turn hits all of its
-- prompt but the last token; its second reuses its own first exchange (its prompt and reply less
-- the last sampled token) and, from the first conversation's chain, the 5 template tokens that
-- open the next user turn, up to the first token of the user's text, where the two differ; and
-- it replies as a cold run does
SELECT cache_play(ARRAY[:'t1', :'b2']) AS b \gset
SELECT cache_play(ARRAY[:'t1', :'b2'], cold => true) AS b_cold \gset
SELECT x.turn, x.cached_tokens > 0 AS hit,
       x.cached_tokens = CASE x.turn
           WHEN 1 THEN x.prompt_tokens - 1
           ELSE x.prev_prompt + x.prev_completion - 1 + 5 END AS hit_as_expected,
       c.cached_tokens AS cold_cached,
       x.reply = c.reply AND x.reply_ids = c.reply_ids AS same_as_cold
FROM cache_exchanges x
JOIN cache_exchanges c ON c.conversation_id = :b_cold AND c.turn = x.turn
WHERE x.conversation_id = :b ORDER BY x.turn;

-- 4. role isolation (the default): another role's identical prompt finds nothing; the same
-- role's second identical conversation finds the first one's blocks
CREATE ROLE regress_cai_cache_r1 IN ROLE cai_user;
CREATE ROLE regress_cai_cache_r2 IN ROLE cai_user;
SHOW pg_cai.cache_isolation;
SET ROLE regress_cai_cache_r1;
SELECT cache_play(ARRAY[:'t1']) AS r1_first \gset
SET ROLE regress_cai_cache_r2;
SELECT cache_play(ARRAY[:'t1']) AS r2_first \gset
SET ROLE regress_cai_cache_r1;
SELECT cache_play(ARRAY[:'t1']) AS r1_second \gset
RESET ROLE;
SELECT e.conversation_id = :r1_first AS r1_first, e.conversation_id = :r2_first AS r2_first,
       e.cached_tokens, e.cached_tokens = e.prompt_tokens - 1 AS hit_all_it_can,
       e.reply_ids = x.reply_ids AS same_reply
FROM cache_exchanges e
JOIN cache_exchanges x ON x.conversation_id = :a AND x.turn = 1
WHERE e.conversation_id IN (:r1_first, :r2_first, :r1_second) ORDER BY e.conversation_id;
-- only a superuser chooses the isolation
SET ROLE regress_cai_cache_r1;
SET pg_cai.cache_isolation = none;
RESET ROLE;

-- 5. conversation isolation: a new conversation starts cold even though this role has the
-- same prefix cached, its own follow-up turn hits, and a third conversation starts cold again.
-- A request outside a conversation (cai_chat_completion) falls back to the role's namespace.
SET pg_cai.cache_isolation = conversation;
SELECT cache_play(ARRAY[:'t1', :'t2']) AS d \gset
SELECT cache_play(ARRAY[:'t1']) AS e \gset
SELECT conversation_id = :d AS first_conversation, turn, cached_tokens > 0 AS hit,
       cached_tokens = prev_prompt + prev_completion - 1 AS hit_is_own_history
FROM cache_exchanges WHERE conversation_id IN (:d, :e) ORDER BY conversation_id, turn;
SELECT r->'usage'->'prompt_tokens_details'->'cached_tokens' AS cached_tokens,
       (r->'usage'->'prompt_tokens_details'->>'cached_tokens')::int =
       (r->'usage'->>'prompt_tokens')::int - 1 AS hit_from_role
FROM cai_chat_completion(jsonb_build_array(
         jsonb_build_object('role', 'system', 'content', :'sys'),
         jsonb_build_object('role', 'user', 'content', :'t1')),
     '{"max_tokens": 1}') AS r;

-- 6. no isolation: a prefix one role computed serves another
SET pg_cai.cache_isolation = none;
SET ROLE regress_cai_cache_r1;
SELECT cache_play(ARRAY[:'t4']) AS none_r1 \gset
SET ROLE regress_cai_cache_r2;
SELECT cache_play(ARRAY[:'t4']) AS none_r2 \gset
RESET ROLE;
RESET pg_cai.cache_isolation;
SELECT conversation_id = :none_r1 AS r1, cached_tokens > 0 AS hit,
       cached_tokens = prompt_tokens - 1 AS hit_all_it_can
FROM cache_exchanges WHERE conversation_id IN (:none_r1, :none_r2) ORDER BY conversation_id;

-- 7. cai_cache_reset: not for cai_user; a superuser or a role granted EXECUTE empties the cache
SELECT cache_blocks > 0 AS cache_holds_blocks FROM pg_stat_cai;
SET ROLE regress_cai_cache_r1;
SELECT cai_cache_reset();
RESET ROLE;
CREATE ROLE regress_cai_cache_admin;
GRANT EXECUTE ON FUNCTION cai_cache_reset() TO regress_cai_cache_admin;
SET ROLE regress_cai_cache_admin;
SELECT cai_cache_reset();
RESET ROLE;
SELECT cache_blocks, cache_bytes FROM pg_stat_cai;
-- and the next turn of a cached conversation starts from nothing
SELECT cai_chat(:a, :'t1', '{"max_tokens": 1}') IS NOT NULL AS replied;
SELECT cached_tokens FROM cai.messages
WHERE conversation_id = :a AND role = 'assistant' ORDER BY id DESC LIMIT 1;

REVOKE EXECUTE ON FUNCTION cai_cache_reset() FROM regress_cai_cache_admin;
DELETE FROM cai.conversations
WHERE owner IN ('regress_cai_cache_r1', 'regress_cai_cache_r2')
   OR id IN (:a, :a_cold, :a_warm, :b, :b_cold, :d, :e);
DROP ROLE regress_cai_cache_r1, regress_cai_cache_r2, regress_cai_cache_admin;
DROP VIEW cache_exchanges;
DROP FUNCTION cache_play(text[], boolean);
