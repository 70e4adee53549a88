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

--
-- Several models per server (pg_cai.models), each served by its own engine process.
-- pg_stat_cai has one row per served model; model_id, at the end, is the name calls pick it by
-- (the "model" option; "default" for the one model of pg_cai.model), while model stays the
-- name the model file gives itself.  cai_stats() becomes a set-returning function, so it and
-- its view are made again, with the same privileges.  cai_model_info(model) reports one model;
-- cai_model_info() keeps reporting the default one.  cai.conversations.model records the model
-- a conversation is answered by (below).
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
	OUT model_id text)
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
	   s.model_id
FROM cai_stats() s,
	 LATERAL (SELECT count(*) FILTER (WHERE status = 'pending') AS jobs_pending,
					 count(*) FILTER (WHERE status = 'running') AS jobs_running,
					 count(*) FILTER (WHERE status = 'done') AS jobs_done,
					 count(*) FILTER (WHERE status = 'failed') AS jobs_failed
			  FROM cai.jobs) j;
COMMENT ON VIEW pg_stat_cai IS
'the pg_cai engine worker, one row per served model (model_id: the name calls pick it by): status, requests, tokens, batching (avg_batch: sequences per step), throughput (tokens_per_second: generated tokens per busy second; recent_tokens_per_second: over about the last 10 s), prefix cache and KV use, and the reply jobs of the current database; counters count since stats_reset (cai_stat_reset()), gauges are current; queued (the intake ring) and the jobs are the worker''s and the database''s, repeated on each row';

REVOKE ALL ON FUNCTION cai_stats() FROM PUBLIC;
REVOKE ALL ON pg_stat_cai FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_stats() TO cai_user, pg_monitor;
GRANT SELECT ON pg_stat_cai TO cai_user, pg_monitor;

CREATE FUNCTION cai_model_info(model text)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'pg_cai_model_info'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_model_info(text) IS
'the served model of that name (pg_cai.models; "default" for pg_cai.model) and the device that serves it; without it, its status and the reason';
REVOKE ALL ON FUNCTION cai_model_info(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_model_info(text) TO cai_user;

-- A conversation keeps the model of its first reply: its stored turns carry that model's token
-- ids.  NULL until the first reply (and for conversations of 0.1 until their next one).
ALTER TABLE cai.conversations ADD COLUMN model text;
COMMENT ON COLUMN cai.conversations.model IS
'the model (pg_cai.models; "default" for pg_cai.model) that answers the conversation, recorded by its first reply; a call naming another is refused';

--
-- Embedding jobs: keeping an embedding column in step with a text column (src/pg/embed_trigger.c,
-- src/pg/jobs_embed.c).  cai_embed_trigger queues a job of kind 'embed' in cai.jobs when a row's
-- text is inserted or changes, in the writing transaction; the job runners then compute the
-- embedding from the row's text as it is when the job runs, as the role that wrote it, and store
-- it in the row.  A job for a row that has a newer pending or running job of its own is
-- superseded (done without computing), so a burst of edits costs one embedding.
--
ALTER TABLE cai.jobs
	ALTER COLUMN message_id DROP NOT NULL,
	ALTER COLUMN conversation_id DROP NOT NULL,
	ADD COLUMN kind text NOT NULL DEFAULT 'reply' CHECK (kind IN ('reply', 'embed')),
	ADD COLUMN owner name,
	ADD COLUMN target_table regclass,
	ADD COLUMN key_column name,
	ADD COLUMN row_key text,
	ADD COLUMN text_column name,
	ADD COLUMN embedding_column name,
	ADD COLUMN superseded_by bigint,
	ADD CONSTRAINT jobs_kind_fields CHECK (CASE kind
		WHEN 'reply' THEN message_id IS NOT NULL AND conversation_id IS NOT NULL
		ELSE message_id IS NULL AND conversation_id IS NULL AND owner IS NOT NULL
			 AND target_table IS NOT NULL AND key_column IS NOT NULL AND row_key IS NOT NULL
			 AND text_column IS NOT NULL AND embedding_column IS NOT NULL END);
CREATE INDEX jobs_embed_row_idx ON cai.jobs (target_table, row_key, id)
	WHERE kind = 'embed' AND status IN ('pending', 'running');
COMMENT ON COLUMN cai.jobs.kind IS 'reply: answer a user turn; embed: fill a row''s embedding column from its text column';
COMMENT ON COLUMN cai.jobs.owner IS 'embed: the role that wrote the row; the embedding is computed and stored as it';
COMMENT ON COLUMN cai.jobs.target_table IS 'embed: the table of the row';
COMMENT ON COLUMN cai.jobs.key_column IS 'embed: the column that identifies the row (the trigger''s third argument, or the single-column primary key)';
COMMENT ON COLUMN cai.jobs.row_key IS 'embed: the row''s key value, as text';
COMMENT ON COLUMN cai.jobs.text_column IS 'embed: the column whose text is embedded';
COMMENT ON COLUMN cai.jobs.embedding_column IS 'embed: the real[] (or pgvector vector) column that receives the embedding';
COMMENT ON COLUMN cai.jobs.superseded_by IS 'embed: done without computing, because this newer job of the same row was pending or running';

CREATE POLICY jobs_embed_owner ON cai.jobs
	USING (kind = 'embed' AND owner = current_user)
	WITH CHECK (kind = 'embed' AND owner = current_user);
COMMENT ON POLICY jobs_embed_owner ON cai.jobs IS 'a role sees, queues and cancels only the embedding jobs of rows it wrote, and queues them only as itself';
GRANT INSERT (kind, owner, target_table, key_column, row_key, text_column, embedding_column)
	ON cai.jobs TO cai_user;

CREATE FUNCTION cai_embed_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'pg_cai_embed_trigger'
LANGUAGE C;
COMMENT ON FUNCTION cai_embed_trigger() IS
'AFTER INSERT OR UPDATE FOR EACH ROW trigger that keeps an embedding column in step with a text column: queues an embedding job in cai.jobs when a row''s text is new or changed; a job runner fills the embedding after commit (cai_embed of the row''s text as it is then, as the role that wrote it). Arguments: the text column, the embedding column, optionally the key column (empty or absent: the single-column primary key) and the model (a name of pg_cai.models; empty or absent: the first). CREATE TRIGGER docs_embed AFTER INSERT OR UPDATE OF body ON docs FOR EACH ROW EXECUTE FUNCTION cai_embed_trigger(''body'', ''embedding'')';
REVOKE ALL ON FUNCTION cai_embed_trigger() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_embed_trigger() TO cai_user;

--
-- n parallel samples (the "n" option, 1 to 16): the prompt is prefilled once and the samples
-- share its KV.  cai_chat_completion returns n choices; cai_complete returns one completion and
-- refuses n > 1, pointing here: cai_complete_n returns the n completions as an array, element
-- i + 1 drawn with seed + i (so each is what cai_complete gives with that seed).
--
CREATE FUNCTION cai_complete_n(prompt text, n integer, options jsonb DEFAULT '{}')
RETURNS text[]
AS 'MODULE_PATHNAME', 'pg_cai_complete_n'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_complete_n(text, integer, jsonb) IS
'n continuations of raw text (1 to 16) from one prefill of the prompt, element i + 1 drawn with seed + i';
REVOKE ALL ON FUNCTION cai_complete_n(text, integer, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_complete_n(text, integer, jsonb) TO cai_user;

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

--
-- The tokenizer of a named model: with several models (pg_cai.models) each has its own
-- vocabulary.  The two-argument forms sit beside the one-argument ones (an added parameter with a
-- default would make a one-argument call ambiguous); they are not STRICT, so that a NULL model
-- means the first one, and a NULL input still gives NULL.
--
CREATE FUNCTION cai_tokenize(input text, model text)
RETURNS int4[]
AS 'MODULE_PATHNAME', 'pg_cai_tokenize'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_tokenize(text, text) IS
'the token ids of the text for the named model of pg_cai.models (NULL: the first)';

CREATE FUNCTION cai_detokenize(tokens int4[], model text)
RETURNS text
AS 'MODULE_PATHNAME', 'pg_cai_detokenize'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_detokenize(int4[], text) IS
'the text of the token ids for the named model of pg_cai.models (NULL: the first)';

REVOKE ALL ON FUNCTION cai_tokenize(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_detokenize(int4[], text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_tokenize(text, text) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_detokenize(int4[], text) TO cai_user;
