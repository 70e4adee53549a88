/* pg_cai--0.1.sql — install script of pg_cai 0.1 */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION pg_cai" to load this file. \quit

--
-- The role that may chat.  Roles are cluster-wide: it is created once and kept when the
-- extension is dropped.  Grant it to the roles that should use pg_cai.
--
DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'cai_user') THEN
		CREATE ROLE cai_user NOLOGIN;
	END IF;
END
$$;

--
-- Tables: conversations and their turns, in schema cai.  Row-level security lets a role see and
-- change only the conversations it owns, and the turns of those.
--
CREATE SCHEMA cai;
COMMENT ON SCHEMA cai IS 'pg_cai conversations and their turns';
GRANT USAGE ON SCHEMA cai TO cai_user;

CREATE TABLE cai.conversations (
	id				bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	owner			name NOT NULL DEFAULT current_user,
	system_prompt	text,
	options			jsonb NOT NULL DEFAULT '{}'
					CHECK (jsonb_typeof(options) = 'object'),
	created_at		timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE cai.conversations IS 'pg_cai conversations; each role sees only its own (row-level security)';
COMMENT ON COLUMN cai.conversations.owner IS 'the role that owns the conversation';
COMMENT ON COLUMN cai.conversations.system_prompt IS 'the system turn that starts every prompt of the conversation, or NULL';
COMMENT ON COLUMN cai.conversations.options IS 'default generation options of every turn (overridden per call)';

CREATE TABLE cai.messages (
	id					bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	conversation_id		bigint NOT NULL REFERENCES cai.conversations (id) ON DELETE CASCADE,
	role				text NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
	content				text NOT NULL,
	tokens				int4[],
	prompt_tokens		int,
	completion_tokens	int,
	cached_tokens		int,
	ttft_ms				float8,
	created_at			timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX messages_conversation_id_idx ON cai.messages (conversation_id, id);
COMMENT ON TABLE cai.messages IS 'turns of pg_cai conversations, oldest first by id';
COMMENT ON COLUMN cai.messages.tokens IS 'the content''s token ids as the model saw (user) or generated (assistant) them; reused by later turns';
COMMENT ON COLUMN cai.messages.prompt_tokens IS 'assistant turns: tokens of the prompt that produced the reply';
COMMENT ON COLUMN cai.messages.completion_tokens IS 'assistant turns: tokens generated';
COMMENT ON COLUMN cai.messages.cached_tokens IS 'assistant turns: prompt tokens whose attention state came from the prefix cache';
COMMENT ON COLUMN cai.messages.ttft_ms IS 'assistant turns: milliseconds from the engine receiving the request to the first generated token (queue wait and prompt computation)';

ALTER TABLE cai.conversations ENABLE ROW LEVEL SECURITY;
ALTER TABLE cai.messages ENABLE ROW LEVEL SECURITY;

CREATE POLICY conversations_owner ON cai.conversations
	USING (owner = current_user)
	WITH CHECK (owner = current_user);
COMMENT ON POLICY conversations_owner ON cai.conversations IS 'a role sees and changes only the conversations it owns';

CREATE POLICY messages_owner ON cai.messages
	USING (EXISTS (SELECT FROM cai.conversations c
				   WHERE c.id = messages.conversation_id AND c.owner = current_user))
	WITH CHECK (EXISTS (SELECT FROM cai.conversations c
						WHERE c.id = messages.conversation_id AND c.owner = current_user));
COMMENT ON POLICY messages_owner ON cai.messages IS 'a role sees and changes only the turns of conversations it owns';

GRANT SELECT, INSERT, UPDATE, DELETE ON cai.conversations TO cai_user;
GRANT SELECT, INSERT, UPDATE, DELETE ON cai.messages TO cai_user;

-- pg_dump keeps the rows
SELECT pg_catalog.pg_extension_config_dump('cai.conversations', '');
SELECT pg_catalog.pg_extension_config_dump('cai.messages', '');

--
-- Functions.  All are VOLATILE, PARALLEL UNSAFE and SECURITY INVOKER: they run as the caller,
-- so grants and row-level security apply to what they read and write.
--
CREATE FUNCTION cai_new_conversation(system_prompt text DEFAULT NULL, options jsonb DEFAULT '{}')
RETURNS bigint
AS 'MODULE_PATHNAME', 'pg_cai_new_conversation'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_new_conversation(text, jsonb) IS
'creates a conversation owned by the current role; options become the defaults of its turns';

CREATE FUNCTION cai_chat(conversation_id bigint, message text, options jsonb DEFAULT '{}')
RETURNS text
AS 'MODULE_PATHNAME', 'pg_cai_chat'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_chat(bigint, text, jsonb) IS
'generates the reply to message in the conversation and stores both turns; options: max_tokens, temperature, top_p, top_k, seed, stop, truncate, ignore_eos';

CREATE FUNCTION cai_chat_stream(conversation_id bigint, message text, options jsonb DEFAULT '{}')
RETURNS SETOF text
AS 'MODULE_PATHNAME', 'pg_cai_chat_stream'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER ROWS 100;
COMMENT ON FUNCTION cai_chat_stream(bigint, text, jsonb) IS
'like cai_chat, but returns the reply piece by piece as it is generated (call it in the select list); stores both turns at the end';

CREATE FUNCTION cai_complete(prompt text, options jsonb DEFAULT '{}')
RETURNS text
AS 'MODULE_PATHNAME', 'pg_cai_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_complete(text, jsonb) IS
'continues raw text, without a chat template or a conversation';

CREATE FUNCTION cai_chat_completion(messages jsonb, options jsonb DEFAULT '{}')
RETURNS jsonb
AS 'MODULE_PATHNAME', 'pg_cai_chat_completion'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_chat_completion(jsonb, jsonb) IS
'OpenAI-style chat completion: an array of {role, content} in, a chat.completion object out; stores nothing';

-- Typed replies: the reply constrained to a JSON value valid against a JSON Schema (a subset,
-- compiled by the engine, which names any keyword it does not support), returned as jsonb.
CREATE FUNCTION cai_chat_json(conversation_id bigint, message text, schema jsonb,
							  options jsonb DEFAULT '{}')
RETURNS jsonb
AS 'MODULE_PATHNAME', 'pg_cai_chat_json'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_chat_json(bigint, text, jsonb, jsonb) IS
'like cai_chat, with the reply a JSON value valid against schema, returned as jsonb; an error, and nothing stored, when max_tokens cuts the value';

CREATE FUNCTION cai_complete_json(prompt text, schema jsonb, options jsonb DEFAULT '{}')
RETURNS jsonb
AS 'MODULE_PATHNAME', 'pg_cai_complete_json'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_complete_json(text, jsonb, jsonb) IS
'continues raw text with a JSON value valid against schema, returned as jsonb; an error when max_tokens cuts the value';

CREATE FUNCTION cai_tokenize(input text)
RETURNS int4[]
AS 'MODULE_PATHNAME', 'pg_cai_tokenize'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_tokenize(text) IS
'the model''s token ids for the text (special-token text stays plain text; no BOS)';

CREATE FUNCTION cai_detokenize(tokens int4[])
RETURNS text
AS 'MODULE_PATHNAME', 'pg_cai_detokenize'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_detokenize(int4[]) IS
'the text of the token ids, special tokens included as their text';

CREATE FUNCTION cai_model_info()
RETURNS jsonb
AS 'MODULE_PATHNAME', 'pg_cai_model_info'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_model_info() IS
'the loaded model (architecture, shapes, context) and the device serving it; without a model, the status and the reason';

CREATE FUNCTION cai_cache_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'pg_cai_cache_reset'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_cache_reset() IS
'empties the engine''s prefix cache of past turns (superusers only unless granted)';

CREATE FUNCTION cai_reply_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'pg_cai_reply_trigger'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_reply_trigger() IS
'AFTER INSERT FOR EACH ROW trigger on cai.messages that answers each inserted user turn synchronously; optional argument: options as JSON. CREATE TRIGGER reply AFTER INSERT ON cai.messages FOR EACH ROW EXECUTE FUNCTION cai_reply_trigger()';

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
	OUT recent_tokens_per_second float8)
RETURNS record
AS 'MODULE_PATHNAME', 'pg_cai_stats'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_stats() IS
'the engine worker''s counters (the pg_stat_cai view)';

CREATE VIEW pg_stat_cai AS SELECT * FROM cai_stats();
COMMENT ON VIEW pg_stat_cai IS
'the pg_cai engine worker: status, requests, tokens, batching, prefix cache and KV use';

--
-- Privileges: nothing for PUBLIC; cai_user may chat and read the statistics.  cai_cache_reset
-- stays with superusers: it slows every role's next turns.
--
REVOKE ALL ON FUNCTION cai_new_conversation(text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_chat(bigint, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_chat_stream(bigint, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_complete(text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_chat_completion(jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_chat_json(bigint, text, jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_complete_json(text, jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_tokenize(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_detokenize(int4[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_model_info() FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_cache_reset() FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_reply_trigger() FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_stats() FROM PUBLIC;
REVOKE ALL ON pg_stat_cai FROM PUBLIC;

GRANT EXECUTE ON FUNCTION cai_new_conversation(text, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_chat(bigint, text, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_chat_stream(bigint, text, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_complete(text, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_chat_completion(jsonb, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_chat_json(bigint, text, jsonb, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_complete_json(text, jsonb, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_tokenize(text) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_detokenize(int4[]) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_model_info() TO cai_user;
GRANT EXECUTE ON FUNCTION cai_reply_trigger() TO cai_user;
GRANT EXECUTE ON FUNCTION cai_stats() TO cai_user, pg_monitor;
GRANT SELECT ON pg_stat_cai TO cai_user, pg_monitor;

--
-- Reading conversations back, and scale-out.  On a data node behind the pg_cai_router extension
-- (PL/Proxy; README "Scaling out") a conversation's id says which partition owns it: the high
-- 16 bits of the 64-bit id are the partition number, so that a conversation's rows, its engine
-- and its cached KV stay on one node for its whole life and adding nodes moves nothing.
--
CREATE FUNCTION cai_conversations()
RETURNS TABLE (conversation_id bigint, system_prompt text, options jsonb, turns bigint,
			   created_at timestamptz)
LANGUAGE sql STABLE SECURITY INVOKER
AS $$
	SELECT c.id, c.system_prompt, c.options,
		   (SELECT count(*) FROM cai.messages m WHERE m.conversation_id = c.id), c.created_at
	FROM cai.conversations c ORDER BY c.id
$$;
COMMENT ON FUNCTION cai_conversations() IS
'the current role''s conversations (row-level security), with their number of stored turns';

CREATE FUNCTION cai_history(conversation_id bigint)
RETURNS TABLE (message_id bigint, role text, content text, prompt_tokens int,
			   completion_tokens int, cached_tokens int, created_at timestamptz)
LANGUAGE sql STABLE SECURITY INVOKER
AS $$
	SELECT m.id, m.role, m.content, m.prompt_tokens, m.completion_tokens, m.cached_tokens,
		   m.created_at
	FROM cai.messages m WHERE m.conversation_id = $1 ORDER BY m.id
$$;
COMMENT ON FUNCTION cai_history(bigint) IS
'the turns of one of the current role''s conversations, oldest first (none for another role''s)';

CREATE FUNCTION cai_set_partition(partition int)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
DECLARE
	first_id bigint;
	last_id bigint;
	stray bigint;
BEGIN
	IF partition IS NULL OR partition < 0 OR partition > 32767 THEN
		RAISE EXCEPTION 'partition must be between 0 and 32767, not %', partition
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- every role's conversations, row-level security aside: the caller is a superuser
	SELECT id INTO stray FROM cai.conversations WHERE (id >> 48) <> partition LIMIT 1;
	IF FOUND THEN
		RAISE EXCEPTION 'this node already holds conversations of partition %, not %', stray >> 48, partition
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Set a node''s partition before it holds conversations.';
	END IF;
	-- never hand out an id again: past the largest stored id and the sequence's last one
	SELECT pg_sequence_last_value(pg_get_serial_sequence('cai.conversations', 'id')) INTO last_id;
	first_id := greatest((partition::bigint << 48) + 1,
						 (SELECT coalesce(max(id), 0) + 1 FROM cai.conversations),
						 CASE WHEN last_id >> 48 = partition THEN last_id + 1 END);
	EXECUTE format('ALTER TABLE cai.conversations ALTER COLUMN id SET MINVALUE %s SET MAXVALUE %s SET START WITH %s RESTART WITH %s',
				   (partition::bigint << 48) + 1, ((partition::bigint + 1) << 48) - 1, first_id, first_id);
END
$$;
COMMENT ON FUNCTION cai_set_partition(int) IS
'makes this node''s new conversation ids carry partition number partition in their high 16 bits (superuser; for pg_cai_router)';

REVOKE ALL ON FUNCTION cai_conversations() FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_history(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_set_partition(int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_conversations() TO cai_user;
GRANT EXECUTE ON FUNCTION cai_history(bigint) TO cai_user;

--
-- Asynchronous replies (src/pg/jobs.c).  cai_enqueue_reply_trigger queues a job for each inserted
-- user turn, in the inserting transaction; after commit, the job runners of the databases listed
-- in pg_cai.job_databases answer the jobs as the conversation's owner and NOTIFY channel
-- cai_reply, with the conversation id as payload, when a job is done or has failed.
--
CREATE TABLE cai.jobs (
	id				bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	message_id		bigint NOT NULL UNIQUE REFERENCES cai.messages (id) ON DELETE CASCADE,
	conversation_id	bigint NOT NULL REFERENCES cai.conversations (id) ON DELETE CASCADE,
	options			jsonb NOT NULL DEFAULT '{}'
					CHECK (jsonb_typeof(options) = 'object'),
	status			text NOT NULL DEFAULT 'pending'
					CHECK (status IN ('pending', 'running', 'done', 'failed')),
	error			text,
	attempts		int NOT NULL DEFAULT 0,
	reply_id		bigint REFERENCES cai.messages (id) ON DELETE SET NULL,
	created_at		timestamptz NOT NULL DEFAULT now(),
	started_at		timestamptz,
	finished_at		timestamptz
);
CREATE INDEX jobs_open_idx ON cai.jobs (id) WHERE status IN ('pending', 'running');
CREATE INDEX jobs_conversation_id_idx ON cai.jobs (conversation_id, id);
CREATE INDEX jobs_reply_id_idx ON cai.jobs (reply_id);
COMMENT ON TABLE cai.jobs IS 'pg_cai reply jobs: user turns waiting for an asynchronous reply, and how each ended; each role sees only its own conversations'' jobs (row-level security)';
COMMENT ON COLUMN cai.jobs.message_id IS 'the user turn to answer (at most one job per turn)';
COMMENT ON COLUMN cai.jobs.conversation_id IS 'the conversation of the turn; the reply is generated as its owner';
COMMENT ON COLUMN cai.jobs.options IS 'generation options of the reply (the trigger''s argument), over the conversation''s own';
COMMENT ON COLUMN cai.jobs.status IS 'pending (waits for a runner), running, done (reply_id is the reply) or failed (see error)';
COMMENT ON COLUMN cai.jobs.error IS 'why the job failed, or why its last try hit a transient error (engine queue full, worker restarting) when it is pending again';
COMMENT ON COLUMN cai.jobs.attempts IS 'times a runner took the job and did not come back (its process ended) or finished it; after 5 the job fails';
COMMENT ON COLUMN cai.jobs.reply_id IS 'the assistant turn that answered the job';
COMMENT ON COLUMN cai.jobs.started_at IS 'when a runner took the job last';
COMMENT ON COLUMN cai.jobs.finished_at IS 'when the job ended (done or failed)';

ALTER TABLE cai.jobs ENABLE ROW LEVEL SECURITY;
-- A new job must name a turn of the same conversation, both the role's own: the foreign key alone
-- ignores row-level security, so without this another role could probe which message ids exist
-- or take a turn's one job slot before its owner's trigger does.
CREATE POLICY jobs_owner ON cai.jobs
	USING (EXISTS (SELECT FROM cai.conversations c
				   WHERE c.id = jobs.conversation_id AND c.owner = current_user))
	WITH CHECK (EXISTS (SELECT FROM cai.messages m
						JOIN cai.conversations c ON c.id = m.conversation_id
						WHERE m.id = jobs.message_id AND m.conversation_id = jobs.conversation_id
						AND c.owner = current_user));
COMMENT ON POLICY jobs_owner ON cai.jobs IS 'a role sees, queues and cancels only the jobs of conversations it owns, and queues them only for turns of those conversations';

-- the runners alone change a job's state; a role may queue (through the trigger) and cancel
GRANT SELECT, DELETE ON cai.jobs TO cai_user;
GRANT INSERT (message_id, conversation_id, options) ON cai.jobs TO cai_user;
SELECT pg_catalog.pg_extension_config_dump('cai.jobs', '');

CREATE FUNCTION cai_enqueue_reply_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'pg_cai_enqueue_reply_trigger'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_enqueue_reply_trigger() IS
'AFTER INSERT FOR EACH ROW trigger on cai.messages that queues a reply job in cai.jobs for each inserted user turn that is the newest of its conversation; a job runner answers it after commit and NOTIFYs cai_reply with the conversation id; optional argument: options as JSON. CREATE TRIGGER reply_later AFTER INSERT ON cai.messages FOR EACH ROW EXECUTE FUNCTION cai_enqueue_reply_trigger()';
REVOKE ALL ON FUNCTION cai_enqueue_reply_trigger() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_enqueue_reply_trigger() TO cai_user;

-- pg_stat_cai grows: throughput, and the jobs of the current database
CREATE OR REPLACE VIEW pg_stat_cai AS
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
'the pg_cai engine worker: status, requests, tokens, batching (avg_batch: sequences per step), throughput (tokens_per_second: generated tokens per busy second; recent_tokens_per_second: over about the last 10 s), prefix cache and KV use, and the reply jobs of the current database';
