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

--
-- Typed replies: schemas as JSON text, and stored options validated when they are written.
--
-- cai_chat_json and cai_complete_json also take their schema as text or json: the engine reads
-- it as written, so properties come out in the text's order (jsonb sorts an object's keys,
-- shortest first).  A string literal resolves to the text overload (PostgreSQL prefers the
-- string category for an unknown-type argument), so a call with a literal schema stays
-- unambiguous and keeps the order it was written in; a jsonb value still calls the jsonb one.
CREATE FUNCTION cai_chat_json(conversation_id bigint, message text, schema text,
							  options jsonb DEFAULT '{}')
RETURNS jsonb
AS 'MODULE_PATHNAME', 'pg_cai_chat_json_text'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_chat_json(bigint, text, text, jsonb) IS
'like cai_chat_json(bigint, text, jsonb, jsonb), the schema given as JSON text: properties are generated in the order the text has them';

CREATE FUNCTION cai_chat_json(conversation_id bigint, message text, schema json,
							  options jsonb DEFAULT '{}')
RETURNS jsonb
AS 'MODULE_PATHNAME', 'pg_cai_chat_json_text'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_chat_json(bigint, text, json, jsonb) IS
'like cai_chat_json(bigint, text, jsonb, jsonb), the schema given as json: properties are generated in the order the text has them';

CREATE FUNCTION cai_complete_json(prompt text, schema text, options jsonb DEFAULT '{}')
RETURNS jsonb
AS 'MODULE_PATHNAME', 'pg_cai_complete_json_text'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_complete_json(text, text, jsonb) IS
'like cai_complete_json(text, jsonb, jsonb), the schema given as JSON text: properties are generated in the order the text has them';

CREATE FUNCTION cai_complete_json(prompt text, schema json, options jsonb DEFAULT '{}')
RETURNS jsonb
AS 'MODULE_PATHNAME', 'pg_cai_complete_json_text'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_complete_json(text, json, jsonb) IS
'like cai_complete_json(text, jsonb, jsonb), the schema given as json: properties are generated in the order the text has them';

-- Options that are stored (a conversation's defaults, a job's, a reply trigger's argument) are
-- validated when they are written, their schema compiled by the engine's compiler, so that a
-- bad schema fails the statement that stores it instead of every later turn or job.  Rows
-- stored before this version are not revisited.
CREATE FUNCTION cai_validate_options(options jsonb)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pg_cai_validate_options'
LANGUAGE C VOLATILE PARALLEL SAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_validate_options(jsonb) IS
'true when the options are valid on their own (every key, and a response_format schema compiled); otherwise the error a call with them raises';

CREATE FUNCTION cai_check_options()
RETURNS trigger
AS 'MODULE_PATHNAME', 'pg_cai_check_options'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_check_options() IS
'BEFORE INSERT OR UPDATE OF options FOR EACH ROW trigger: validates the row''s options column (cai.conversations, cai.jobs)';

CREATE TRIGGER options_valid BEFORE INSERT OR UPDATE OF options ON cai.conversations
	FOR EACH ROW EXECUTE FUNCTION cai_check_options();
CREATE TRIGGER options_valid BEFORE INSERT OR UPDATE OF options ON cai.jobs
	FOR EACH ROW EXECUTE FUNCTION cai_check_options();

-- A reply trigger's argument is checked by CREATE TRIGGER itself (an event trigger at the end
-- of the command), not first when a user turn arrives.  A trigger created while event
-- triggers are off (session_replication_role = replica) is still checked when it fires.
CREATE FUNCTION cai_check_reply_trigger_options()
RETURNS event_trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	created record;
	options text;
BEGIN
	FOR created IN
		SELECT t.tgargs
		FROM pg_event_trigger_ddl_commands() c
		JOIN pg_trigger t ON t.oid = c.objid
		WHERE c.classid = 'pg_trigger'::regclass AND t.tgnargs > 0
		  AND t.tgfoid IN ('@extschema@.cai_reply_trigger()'::regprocedure,
						   '@extschema@.cai_enqueue_reply_trigger()'::regprocedure)
	LOOP
		-- the first argument, NUL-terminated in tgargs, is the options' JSON text
		options := convert_from(substring(created.tgargs
										  FOR position('\x00'::bytea IN created.tgargs) - 1),
								getdatabaseencoding());
		PERFORM @extschema@.cai_validate_options(options::jsonb);
	END LOOP;
END
$$;
COMMENT ON FUNCTION cai_check_reply_trigger_options() IS
'event trigger at the end of CREATE TRIGGER: validates the options argument of cai_reply_trigger and cai_enqueue_reply_trigger';

CREATE EVENT TRIGGER cai_reply_trigger_options ON ddl_command_end
	WHEN TAG IN ('CREATE TRIGGER')
	EXECUTE FUNCTION cai_check_reply_trigger_options();

REVOKE ALL ON FUNCTION cai_chat_json(bigint, text, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_chat_json(bigint, text, json, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_complete_json(text, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_complete_json(text, json, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_validate_options(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_check_options() FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_check_reply_trigger_options() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_chat_json(bigint, text, text, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_chat_json(bigint, text, json, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_complete_json(text, text, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_complete_json(text, json, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_validate_options(jsonb) TO cai_user;

-- ---------------------------------------------------------------------------------------------
-- Embeddings: cai_embed(text) and cai_embed(text[]).  A vector is real[], L2-normalized, the
-- model's final hidden states pooled as its GGUF says (mean when it names no pooling); cast
-- it to pgvector's vector where pgvector is installed (cai_embed(t)::vector).  model => NULL
-- is the model served; another name is refused unless it is that model's.  Not STRICT: a
-- NULL text is an error, not a NULL vector.
-- ---------------------------------------------------------------------------------------------

CREATE FUNCTION cai_embed(input text, model text DEFAULT NULL)
RETURNS real[]
AS 'MODULE_PATHNAME', 'pg_cai_embed'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_embed(text, text) IS
'the text''s embedding: the model''s final hidden states pooled (mean, cls or last, from the GGUF; mean when it names none) and L2-normalized';

CREATE FUNCTION cai_embed(inputs text[], model text DEFAULT NULL)
RETURNS TABLE (ordinality integer, embedding real[])
AS 'MODULE_PATHNAME', 'pg_cai_embed_texts'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER ROWS 10;
COMMENT ON FUNCTION cai_embed(text[], text) IS
'one row per text, in the array''s order (ordinality from 1): each text''s embedding, the texts batched in the engine';

REVOKE ALL ON FUNCTION cai_embed(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_embed(text[], text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_embed(text, text) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_embed(text[], text) TO cai_user;
