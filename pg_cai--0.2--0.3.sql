/* pg_cai--0.2--0.3.sql — upgrade of pg_cai from 0.2 to 0.3 (ALTER EXTENSION pg_cai UPDATE) */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION pg_cai UPDATE TO '0.3'" to load this file. \quit

--
-- pg_cai--0.1.sql and pg_cai--0.1--0.2.sql are frozen: a fresh CREATE EXTENSION runs them and
-- then this script, so a new database and an upgraded one get the same objects by the same
-- statements.  Every change of 0.3 goes here.
--

--
-- pg_stat_cai gains columns at the end, so cai_stats() and the view are made again with the same
-- privileges:
-- * requests_client_lost: a request whose client closes its connection is dropped (the backend
--   notices while it waits for the engine, whatever client_connection_check_interval says) and
--   counted;
-- * the prefix cache's disk tier (pg_cai.disk_cache_dir, pg_cai.disk_cache_size): blocks read
--   back and the tokens they served, bytes read and written, writes dropped, files evicted, its
--   files and size now, its budget.
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
	OUT requests_client_lost bigint,
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
	   s.model_id, s.requests_client_lost,
	   s.disk_hits, s.disk_hit_tokens, s.disk_bytes_read, s.disk_bytes_written,
	   s.disk_writes_dropped, s.disk_evictions, s.disk_files, s.disk_bytes, s.disk_budget_bytes
FROM cai_stats() s,
	 LATERAL (SELECT count(*) FILTER (WHERE status = 'pending') AS jobs_pending,
					 count(*) FILTER (WHERE status = 'running') AS jobs_running,
					 count(*) FILTER (WHERE status = 'done') AS jobs_done,
					 count(*) FILTER (WHERE status = 'failed') AS jobs_failed
			  FROM cai.jobs) j;
COMMENT ON VIEW pg_stat_cai IS
'the pg_cai engine worker, one row per served model (model_id: the name calls pick it by): status, requests, tokens, batching (avg_batch: sequences per step), throughput (tokens_per_second: generated tokens per busy second; recent_tokens_per_second: over about the last 10 s), prefix cache and KV use, and the reply jobs of the current database; requests_client_lost: of requests_abandoned, those whose client closed its connection before the reply was complete; the prefix cache''s disk tier (disk_*: blocks read back and the tokens they served, bytes read and written, writes dropped, files evicted, files and bytes now, budget; 0 budget: no tier); counters count since stats_reset (cai_stat_reset()), gauges are current; queued (the intake ring) and the jobs are the worker''s and the database''s, repeated on each row';

REVOKE ALL ON FUNCTION cai_stats() FROM PUBLIC;
REVOKE ALL ON pg_stat_cai FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_stats() TO cai_user, pg_monitor;
GRANT SELECT ON pg_stat_cai TO cai_user, pg_monitor;

--
-- cai_validate_options follows the rule every other function does: PARALLEL UNSAFE (it was
-- declared PARALLEL SAFE in 0.2).
--
ALTER FUNCTION cai_validate_options(jsonb) PARALLEL UNSAFE;
-- Backups: what a restored database needs to go on is in what pg_dump writes.
--
-- The identity sequences of the configuration tables are dumped with their positions, so that
-- a restored database hands out ids after the restored rows' (the rows alone leave each sequence
-- at 1, and the next cai_chat would fail on messages_pkey).
--
SELECT pg_catalog.pg_extension_config_dump('cai.conversations_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('cai.messages_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('cai.jobs_id_seq', '');

--
-- Triggers on pg_cai's tables (a reply trigger on cai.messages, say) are not in a dump: pg_dump
-- leaves out everything that hangs off an extension's tables but their rows.  So each such
-- trigger is also kept as a row of cai.triggers, a configuration table that is dumped; an event
-- trigger records it when it is created, renamed, enabled or disabled, and forgets it when it is
-- dropped.  When pg_restore puts a row back, cai.triggers' own trigger creates the trigger it
-- describes.  Triggers that call one of pg_cai's internal functions (the extension's own, made
-- by its scripts) are not recorded; the reply and embedding triggers are.
--
-- The rows must come back after cai.messages' and cai.jobs' rows, or the recreated reply trigger
-- would queue jobs for the restored turns: pg_dump orders the data of configuration tables by
-- their foreign keys, so restore_after_job, which is always NULL, references cai.jobs for that
-- order alone.  (A parallel pg_restore keeps no such order between any extension's configuration
-- tables, cai.messages' and cai.conversations' included: restore a database with pg_cai without
-- -j.)
--
CREATE TABLE cai.triggers (
	table_name			regclass NOT NULL,
	trigger_name		name NOT NULL,
	definition			text NOT NULL CHECK (definition ~ '^CREATE (CONSTRAINT )?TRIGGER '),
	enabled				"char" NOT NULL DEFAULT 'O' CHECK (enabled IN ('O', 'D', 'R', 'A')),
	restore_after_job	bigint REFERENCES cai.jobs (id) ON DELETE SET NULL
						CHECK (restore_after_job IS NULL),
	PRIMARY KEY (table_name, trigger_name)
);
COMMENT ON TABLE cai.triggers IS 'the triggers on pg_cai''s tables that are not the extension''s own (reply triggers, say), kept as rows so that pg_dump keeps them: pg_restore recreates each from its row';
COMMENT ON COLUMN cai.triggers.table_name IS 'the pg_cai table the trigger is on';
COMMENT ON COLUMN cai.triggers.definition IS 'the trigger''s CREATE TRIGGER statement (pg_get_triggerdef, names qualified)';
COMMENT ON COLUMN cai.triggers.enabled IS 'pg_trigger.tgenabled: O (enabled), D (disabled), R (replica), A (always)';
COMMENT ON COLUMN cai.triggers.restore_after_job IS 'always NULL: its foreign key makes pg_dump restore these rows after cai.jobs''s';
SELECT pg_catalog.pg_extension_config_dump('cai.triggers', '');

-- Records (or updates the record of) one trigger, under its current name, when it is one that is
-- kept: a trigger on a pg_cai table (but cai.triggers) that calls a reply or embedding trigger
-- function, or a function that is not pg_cai's.
CREATE FUNCTION cai_record_trigger(trigger_oid oid)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
	INSERT INTO cai.triggers (table_name, trigger_name, definition, enabled)
	SELECT t.tgrelid, t.tgname, pg_get_triggerdef(t.oid), t.tgenabled
	FROM pg_trigger t
	JOIN pg_depend tab ON tab.classid = 'pg_class'::regclass AND tab.objid = t.tgrelid
		AND tab.refclassid = 'pg_extension'::regclass AND tab.deptype = 'e'
	JOIN pg_extension e ON e.oid = tab.refobjid AND e.extname = 'pg_cai'
	WHERE t.oid = $1 AND NOT t.tgisinternal AND t.tgrelid <> 'cai.triggers'::regclass
	  AND (t.tgfoid IN ('@extschema@.cai_reply_trigger()'::regprocedure,
						'@extschema@.cai_enqueue_reply_trigger()'::regprocedure,
						'@extschema@.cai_embed_trigger()'::regprocedure)
		   OR NOT EXISTS (SELECT FROM pg_depend f
						  WHERE f.classid = 'pg_proc'::regclass AND f.objid = t.tgfoid
							AND f.refclassid = 'pg_extension'::regclass
							AND f.refobjid = e.oid AND f.deptype = 'e'))
	ON CONFLICT (table_name, trigger_name) DO UPDATE
		SET definition = EXCLUDED.definition, enabled = EXCLUDED.enabled;
$$;
COMMENT ON FUNCTION cai_record_trigger(oid) IS
'keeps the trigger''s current definition, name and state in cai.triggers when it is one that is recorded';

-- The event trigger's function: SECURITY DEFINER, because it fires for whoever runs the DDL
-- and cai.triggers is written by its owner alone; it reads nothing but the catalogs.
CREATE FUNCTION cai_track_triggers()
RETURNS event_trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	cmd record;
	table_trigger record;
BEGIN
	-- records go by table and name: OIDs differ in a restored or upgraded database
	IF TG_EVENT = 'sql_drop' THEN
		DELETE FROM cai.triggers r
		USING pg_event_trigger_dropped_objects() d
		WHERE d.object_type = 'trigger'
		  AND (SELECT ARRAY[n.nspname::text, c.relname::text, r.trigger_name::text]
			   FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			   WHERE c.oid = r.table_name) = d.address_names;
		RETURN;
	END IF;
	FOR cmd IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
		-- the extension's own scripts make the triggers it owns
		CONTINUE WHEN cmd.in_extension;
		IF cmd.classid = 'pg_trigger'::regclass THEN
			IF cmd.command_tag = 'ALTER TRIGGER' THEN
				-- a rename: the record under the old name goes
				DELETE FROM cai.triggers r USING pg_trigger t
				WHERE t.oid = cmd.objid AND r.table_name = t.tgrelid
				  AND NOT EXISTS (SELECT FROM pg_trigger o
								  WHERE o.tgrelid = r.table_name AND o.tgname = r.trigger_name);
			END IF;
			PERFORM @extschema@.cai_record_trigger(cmd.objid);
		ELSIF cmd.classid = 'pg_class'::regclass THEN
			-- ALTER TABLE ... ENABLE | DISABLE TRIGGER: the table's triggers' states
			FOR table_trigger IN SELECT oid FROM pg_trigger
								 WHERE tgrelid = cmd.objid AND NOT tgisinternal LOOP
				PERFORM @extschema@.cai_record_trigger(table_trigger.oid);
			END LOOP;
		END IF;
	END LOOP;
END
$$;
COMMENT ON FUNCTION cai_track_triggers() IS
'event trigger: keeps cai.triggers in step with the triggers on pg_cai''s tables';

CREATE EVENT TRIGGER cai_track_triggers ON ddl_command_end
	WHEN TAG IN ('CREATE TRIGGER', 'ALTER TRIGGER', 'ALTER TABLE')
	EXECUTE FUNCTION cai_track_triggers();
CREATE EVENT TRIGGER cai_track_dropped_triggers ON sql_drop
	WHEN TAG IN ('DROP TRIGGER')
	EXECUTE FUNCTION cai_track_triggers();

-- A database upgraded from 0.2 may have triggers on cai.messages already: recorded now.
SELECT cai_record_trigger(t.oid)
FROM pg_trigger t WHERE t.tgrelid IN ('cai.messages'::regclass, 'cai.conversations'::regclass,
									 'cai.jobs'::regclass)
ORDER BY t.oid;

-- A row put back (by pg_restore, or by hand) creates its trigger, in the state it had, unless the
-- table has a trigger of that name.
CREATE FUNCTION cai_restore_trigger()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	existing oid;
BEGIN
	SELECT oid INTO existing FROM pg_trigger
	WHERE tgrelid = NEW.table_name AND tgname = NEW.trigger_name;
	IF existing IS NULL THEN
		-- the row is pg_get_triggerdef's output; anything else is not run (a restore is often a
		-- superuser's, and only the extension's owner may write cai.triggers, but a row edited
		-- by hand must not become arbitrary SQL)
		IF NEW.definition !~ '^CREATE (CONSTRAINT )?TRIGGER [^;]*$' THEN
			RAISE EXCEPTION 'cai.triggers row "%" does not hold a single CREATE TRIGGER statement',
				NEW.trigger_name
				USING ERRCODE = 'invalid_object_definition';
		END IF;
		EXECUTE NEW.definition;
		SELECT oid INTO existing FROM pg_trigger
		WHERE tgrelid = NEW.table_name AND tgname = NEW.trigger_name;
		IF existing IS NULL THEN
			RAISE EXCEPTION 'the definition of trigger "%" creates no trigger of that name on table %',
				NEW.trigger_name, NEW.table_name
				USING ERRCODE = 'invalid_object_definition';
		END IF;
		IF NEW.enabled <> 'O' THEN
			EXECUTE format('ALTER TABLE %s %s TRIGGER %I', NEW.table_name,
						   CASE NEW.enabled WHEN 'D' THEN 'DISABLE' WHEN 'R' THEN 'ENABLE REPLICA'
						   ELSE 'ENABLE ALWAYS' END, NEW.trigger_name);
		END IF;
	END IF;
	RETURN NULL;
END
$$;
COMMENT ON FUNCTION cai_restore_trigger() IS
'AFTER INSERT trigger on cai.triggers: creates the trigger a restored row describes';

CREATE TRIGGER restore_trigger AFTER INSERT ON cai.triggers
	FOR EACH ROW EXECUTE FUNCTION cai_restore_trigger();

REVOKE ALL ON FUNCTION cai_record_trigger(oid) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_track_triggers() FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_restore_trigger() FROM PUBLIC;

--
-- cai_forget(conversation_id) drops a conversation's cached KV from memory and the disk tier.
--
CREATE FUNCTION cai_forget(conversation_id bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'pg_cai_forget'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY INVOKER;
COMMENT ON FUNCTION cai_forget(bigint) IS
'drops the conversation''s cached KV (the prefix cache''s blocks its turns made, in memory and in the disk tier) from every served model''s engine; its rows stay';
REVOKE ALL ON FUNCTION cai_forget(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_forget(bigint) TO cai_user;

--
-- cai_set_partition says so on a hot standby, instead of failing at its ALTER TABLE.
--
CREATE OR REPLACE FUNCTION cai_set_partition(partition int)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
DECLARE
	first_id bigint;
	last_id bigint;
	stray bigint;
BEGIN
	IF pg_is_in_recovery() THEN
		RAISE EXCEPTION 'cannot execute cai_set_partition on a hot standby'
			USING ERRCODE = 'read_only_sql_transaction',
				  DETAIL = 'cai_set_partition changes the conversations'' id sequence, and a server in recovery is read-only.',
				  HINT = 'Call it on the primary; a standby follows its partition.';
	END IF;
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
