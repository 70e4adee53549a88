/* pg_cai_router--0.1.sql — install script of pg_cai_router 0.1 (for the router database) */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION pg_cai_router CASCADE" to load this file. \quit

--
-- The router holds no conversations.  Each pg_cai function here has the name and signature of
-- the data nodes' own and is a PL/Proxy function: it runs the same call on one node (a
-- conversation's), on any node (calls without a conversation), or on all of them (cluster-wide
-- views), over an ordinary connection made as the calling role (PL/Proxy appends
-- user=current_user to a connect string that names no user), so grants, row-level security and
-- the per-role cache salt hold on every node as they do on one.
--
-- A conversation id names its partition in its high 16 bits (cai_set_partition on each node),
-- so routing needs no lookup and adding a node moves nothing.  PL/Proxy wants a power-of-two
-- partition count: the cluster gets the next power of two at or above the node count, and the
-- partitions beyond the nodes repeat the first nodes' connect strings; no conversation id and no
-- "any node" pick ever lands on them.
--
DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'cai_user') THEN
		CREATE ROLE cai_user NOLOGIN;
	END IF;
END
$$;

CREATE SCHEMA cai_router;
COMMENT ON SCHEMA cai_router IS 'pg_cai_router: the data nodes and the routing functions';
GRANT USAGE ON SCHEMA cai_router TO cai_user;

CREATE TABLE cai_router.nodes (
	partition	int PRIMARY KEY CHECK (partition BETWEEN 0 AND 32767),
	name		text NOT NULL UNIQUE,
	connstr		text NOT NULL,
	-- the router connects as the calling role: a user or password here would be shared by all
	CHECK (connstr !~* '(^|[[:space:]])(user|password)[[:space:]]*=')
);
COMMENT ON TABLE cai_router.nodes IS
'pg_cai data nodes: partition number (the high 16 bits of the conversation ids the node creates), a name for errors, a libpq connect string without user or password';
GRANT SELECT ON cai_router.nodes TO cai_user;
-- pg_dump keeps the nodes; after a restore, SELECT cai_router.sync_cluster() rebuilds the
-- PL/Proxy cluster's partitions from them
SELECT pg_catalog.pg_extension_config_dump('cai_router.nodes', '');

-- round-robin placement of new conversations
CREATE SEQUENCE cai_router.placement;
GRANT USAGE ON SEQUENCE cai_router.placement TO cai_user;

CREATE SERVER cai FOREIGN DATA WRAPPER plproxy OPTIONS (connection_lifetime '1800', p0 'dbname=unconfigured');
-- no user or password: PL/Proxy connects as the calling role
CREATE USER MAPPING FOR PUBLIC SERVER cai;
GRANT USAGE ON FOREIGN SERVER cai TO cai_user;

--
-- Nodes.  cai_router_add_node registers a node and rewrites the PL/Proxy cluster's partitions;
-- the node itself must have had cai_set_partition(partition) before it holds conversations.
--
CREATE FUNCTION cai_router.sync_cluster()
RETURNS void
LANGUAGE plpgsql SECURITY INVOKER
AS $$
DECLARE
	n int;
	p2 int := 1;
	opts text := '';
	existing text[];
BEGIN
	SELECT count(*) INTO n FROM cai_router.nodes;
	IF n > 0 AND (SELECT max(partition) FROM cai_router.nodes) <> n - 1 THEN
		RAISE EXCEPTION 'node partitions must be 0 .. %, without gaps', n - 1
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	WHILE p2 < greatest(n, 1) LOOP
		p2 := p2 * 2;
	END LOOP;
	-- one ALTER SERVER: PL/Proxy validates the partition count after every statement
	SELECT array_agg(split_part(o, '=', 1)) INTO existing
	FROM pg_foreign_server s, unnest(s.srvoptions) o
	WHERE s.srvname = 'cai' AND o ~ '^p[0-9]+=';
	FOR i IN 0 .. p2 - 1 LOOP
		opts := opts || CASE WHEN i > 0 THEN ', ' ELSE '' END ||
			format('%s %I %L', CASE WHEN ('p' || i) = ANY (existing) THEN 'SET' ELSE 'ADD' END,
				   'p' || i,
				   coalesce((SELECT connstr FROM cai_router.nodes WHERE partition = i % greatest(n, 1)),
							'dbname=unconfigured'));
	END LOOP;
	FOR i IN p2 .. 32767 LOOP
		EXIT WHEN NOT ('p' || i) = ANY (existing);
		opts := opts || format(', DROP %I', 'p' || i);
	END LOOP;
	EXECUTE format('ALTER SERVER cai OPTIONS (%s)', opts);
END
$$;

CREATE FUNCTION cai_router_add_node(name text, connstr text)
RETURNS int
LANGUAGE plpgsql SECURITY INVOKER
AS $$
DECLARE
	p int;
BEGIN
	SELECT coalesce(max(partition) + 1, 0) INTO p FROM cai_router.nodes;
	INSERT INTO cai_router.nodes VALUES (p, name, connstr);
	PERFORM cai_router.sync_cluster();
	RETURN p;
END
$$;
COMMENT ON FUNCTION cai_router_add_node(text, text) IS
'registers a data node (superuser); returns the partition number to give it with cai_set_partition';

--
-- Where a call goes
--
CREATE FUNCTION cai_router.partition_of(conversation_id bigint)
RETURNS int4
LANGUAGE plpgsql STABLE SECURITY INVOKER
AS $$
DECLARE
	p int4 := (conversation_id >> 48)::int4;
BEGIN
	IF conversation_id IS NULL OR conversation_id <= 0
	   OR NOT EXISTS (SELECT FROM cai_router.nodes WHERE partition = p) THEN
		RAISE EXCEPTION 'conversation % does not exist', conversation_id
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create one with cai_new_conversation(). A role sees only the conversations it owns.';
	END IF;
	RETURN p;
END
$$;

CREATE FUNCTION cai_router.next_node()
RETURNS int4
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$
	SELECT (nextval('cai_router.placement') % greatest(count(*), 1))::int4 FROM cai_router.nodes
$$;

CREATE FUNCTION cai_router.any_node()
RETURNS int4
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$
	SELECT floor(random() * greatest(count(*), 1))::int4 FROM cai_router.nodes
$$;

CREATE FUNCTION cai_router.all_nodes()
RETURNS SETOF int4
LANGUAGE sql STABLE SECURITY INVOKER
AS $$
	SELECT partition FROM cai_router.nodes ORDER BY partition
$$;

--
-- The SQL surface, in two layers.  cai_router.<name> are the PL/Proxy functions: the same names
-- and signatures as the nodes' functions, each running the same call where it belongs.  The
-- public functions of those names call them and turn PL/Proxy's connection failures, which
-- carry SQLSTATE XX000 and a libpq message, and a node's shutdown errors (57P01-57P03) into
-- an error that names the node
-- (cai_router.node_unreachable); every other error, the nodes' own included, passes unchanged.
--
CREATE FUNCTION cai_router.node_unreachable(message text, state text, partition int DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY INVOKER
AS $$
DECLARE
	port text := substring(message FROM 'port ([0-9]+) failed');
	node record;
BEGIN
	-- a node shutting down or restarting answers with its own 57P0x; PL/Proxy's connection
	-- failures are XX000 with libpq's words
	IF state NOT IN ('57P01', '57P02', '57P03') AND
	   message !~ '(PQconnectPoll|could not connect|connection to server|server closed the connection|no connection to the server|terminating connection|database system is)' THEN
		RETURN;
	END IF;
	SELECT * INTO node FROM cai_router.nodes
	WHERE (port IS NOT NULL AND
		   connstr ~ ('(^|[[:space:]])port[[:space:]]*=[[:space:]]*' || port || '([[:space:]]|$)'))
	   OR (port IS NULL AND nodes.partition = node_unreachable.partition)
	ORDER BY nodes.partition LIMIT 1;
	RAISE EXCEPTION 'pg_cai node % is unreachable',
		coalesce(format('"%s" (partition %s)', node.name, node.partition), 'of this cluster')
		USING ERRCODE = 'connection_failure',
			  DETAIL = message,
			  HINT = 'Conversations on the other nodes are not affected; this node''s continue when it is back.';
END
$$;

CREATE FUNCTION cai_router.cai_new_conversation(system_prompt text, options jsonb)
RETURNS bigint AS $$
	CLUSTER 'cai';
	RUN ON cai_router.next_node();
	SELECT cai_new_conversation($1, $2);
$$ LANGUAGE plproxy;

CREATE FUNCTION cai_new_conversation(system_prompt text DEFAULT NULL, options jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
BEGIN
	RETURN cai_router.cai_new_conversation($1, $2);
EXCEPTION WHEN internal_error OR admin_shutdown OR crash_shutdown OR cannot_connect_now THEN
	PERFORM cai_router.node_unreachable(SQLERRM, SQLSTATE);
	RAISE;
END
$$;

CREATE FUNCTION cai_router.cai_chat(conversation_id bigint, message text, options jsonb)
RETURNS text AS $$
	CLUSTER 'cai';
	RUN ON cai_router.partition_of(conversation_id);
	SELECT cai_chat($1, $2, $3);
$$ LANGUAGE plproxy;

CREATE FUNCTION cai_chat(conversation_id bigint, message text, options jsonb DEFAULT '{}')
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
BEGIN
	RETURN cai_router.cai_chat($1, $2, $3);
EXCEPTION WHEN internal_error OR admin_shutdown OR crash_shutdown OR cannot_connect_now THEN
	PERFORM cai_router.node_unreachable(SQLERRM, SQLSTATE, ($1 >> 48)::int);
	RAISE;
END
$$;

CREATE FUNCTION cai_router.cai_chat_stream(conversation_id bigint, message text, options jsonb)
RETURNS SETOF text AS $$
	CLUSTER 'cai';
	RUN ON cai_router.partition_of(conversation_id);
	SELECT cai_chat_stream($1, $2, $3);
$$ LANGUAGE plproxy;

CREATE FUNCTION cai_chat_stream(conversation_id bigint, message text, options jsonb DEFAULT '{}')
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
BEGIN
	RETURN QUERY SELECT * FROM cai_router.cai_chat_stream($1, $2, $3);
EXCEPTION WHEN internal_error OR admin_shutdown OR crash_shutdown OR cannot_connect_now THEN
	PERFORM cai_router.node_unreachable(SQLERRM, SQLSTATE, ($1 >> 48)::int);
	RAISE;
END
$$;

CREATE FUNCTION cai_router.cai_chat_json(conversation_id bigint, message text, schema jsonb, options jsonb)
RETURNS jsonb AS $$
	CLUSTER 'cai';
	RUN ON cai_router.partition_of(conversation_id);
	SELECT cai_chat_json($1, $2, $3, $4);
$$ LANGUAGE plproxy;

CREATE FUNCTION cai_chat_json(conversation_id bigint, message text, schema jsonb, options jsonb DEFAULT '{}')
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
BEGIN
	RETURN cai_router.cai_chat_json($1, $2, $3, $4);
EXCEPTION WHEN internal_error OR admin_shutdown OR crash_shutdown OR cannot_connect_now THEN
	PERFORM cai_router.node_unreachable(SQLERRM, SQLSTATE, ($1 >> 48)::int);
	RAISE;
END
$$;

CREATE FUNCTION cai_router.cai_history(conversation_id bigint)
RETURNS TABLE (message_id bigint, role text, content text, prompt_tokens int,
			   completion_tokens int, cached_tokens int, created_at timestamptz) AS $$
	CLUSTER 'cai';
	RUN ON cai_router.partition_of(conversation_id);
	SELECT * FROM cai_history($1);
$$ LANGUAGE plproxy;

CREATE FUNCTION cai_history(conversation_id bigint)
RETURNS TABLE (message_id bigint, role text, content text, prompt_tokens int,
			   completion_tokens int, cached_tokens int, created_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
BEGIN
	RETURN QUERY SELECT * FROM cai_router.cai_history($1);
EXCEPTION WHEN internal_error OR admin_shutdown OR crash_shutdown OR cannot_connect_now THEN
	PERFORM cai_router.node_unreachable(SQLERRM, SQLSTATE, ($1 >> 48)::int);
	RAISE;
END
$$;

CREATE FUNCTION cai_router.cai_conversations()
RETURNS TABLE (conversation_id bigint, system_prompt text, options jsonb, turns bigint,
			   created_at timestamptz) AS $$
	CLUSTER 'cai';
	RUN ON cai_router.all_nodes();
	SELECT * FROM cai_conversations();
$$ LANGUAGE plproxy;

CREATE FUNCTION cai_conversations()
RETURNS TABLE (conversation_id bigint, system_prompt text, options jsonb, turns bigint,
			   created_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
BEGIN
	RETURN QUERY SELECT * FROM cai_router.cai_conversations();
EXCEPTION WHEN internal_error OR admin_shutdown OR crash_shutdown OR cannot_connect_now THEN
	PERFORM cai_router.node_unreachable(SQLERRM, SQLSTATE);
	RAISE;
END
$$;

CREATE FUNCTION cai_router.cai_complete(prompt text, options jsonb)
RETURNS text AS $$
	CLUSTER 'cai';
	RUN ON cai_router.any_node();
	SELECT cai_complete($1, $2);
$$ LANGUAGE plproxy;

CREATE FUNCTION cai_complete(prompt text, options jsonb DEFAULT '{}')
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
BEGIN
	RETURN cai_router.cai_complete($1, $2);
EXCEPTION WHEN internal_error OR admin_shutdown OR crash_shutdown OR cannot_connect_now THEN
	PERFORM cai_router.node_unreachable(SQLERRM, SQLSTATE);
	RAISE;
END
$$;

CREATE FUNCTION cai_router.cai_complete_json(prompt text, schema jsonb, options jsonb)
RETURNS jsonb AS $$
	CLUSTER 'cai';
	RUN ON cai_router.any_node();
	SELECT cai_complete_json($1, $2, $3);
$$ LANGUAGE plproxy;

CREATE FUNCTION cai_complete_json(prompt text, schema jsonb, options jsonb DEFAULT '{}')
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
BEGIN
	RETURN cai_router.cai_complete_json($1, $2, $3);
EXCEPTION WHEN internal_error OR admin_shutdown OR crash_shutdown OR cannot_connect_now THEN
	PERFORM cai_router.node_unreachable(SQLERRM, SQLSTATE);
	RAISE;
END
$$;

CREATE FUNCTION cai_router.cai_chat_completion(messages jsonb, options jsonb)
RETURNS jsonb AS $$
	CLUSTER 'cai';
	RUN ON cai_router.any_node();
	SELECT cai_chat_completion($1, $2);
$$ LANGUAGE plproxy;

CREATE FUNCTION cai_chat_completion(messages jsonb, options jsonb DEFAULT '{}')
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
BEGIN
	RETURN cai_router.cai_chat_completion($1, $2);
EXCEPTION WHEN internal_error OR admin_shutdown OR crash_shutdown OR cannot_connect_now THEN
	PERFORM cai_router.node_unreachable(SQLERRM, SQLSTATE);
	RAISE;
END
$$;

CREATE FUNCTION cai_router.cai_tokenize(input text)
RETURNS int4[] AS $$
	CLUSTER 'cai';
	RUN ON cai_router.any_node();
	SELECT cai_tokenize($1);
$$ LANGUAGE plproxy;

CREATE FUNCTION cai_tokenize(input text)
RETURNS int4[]
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
BEGIN
	RETURN cai_router.cai_tokenize($1);
EXCEPTION WHEN internal_error OR admin_shutdown OR crash_shutdown OR cannot_connect_now THEN
	PERFORM cai_router.node_unreachable(SQLERRM, SQLSTATE);
	RAISE;
END
$$;

CREATE FUNCTION cai_router.cai_detokenize(tokens int4[])
RETURNS text AS $$
	CLUSTER 'cai';
	RUN ON cai_router.any_node();
	SELECT cai_detokenize($1);
$$ LANGUAGE plproxy;

CREATE FUNCTION cai_detokenize(tokens int4[])
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
BEGIN
	RETURN cai_router.cai_detokenize($1);
EXCEPTION WHEN internal_error OR admin_shutdown OR crash_shutdown OR cannot_connect_now THEN
	PERFORM cai_router.node_unreachable(SQLERRM, SQLSTATE);
	RAISE;
END
$$;

CREATE FUNCTION cai_router.cai_model_info()
RETURNS jsonb AS $$
	CLUSTER 'cai';
	RUN ON cai_router.any_node();
	SELECT cai_model_info();
$$ LANGUAGE plproxy;

CREATE FUNCTION cai_model_info()
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
BEGIN
	RETURN cai_router.cai_model_info();
EXCEPTION WHEN internal_error OR admin_shutdown OR crash_shutdown OR cannot_connect_now THEN
	PERFORM cai_router.node_unreachable(SQLERRM, SQLSTATE);
	RAISE;
END
$$;

CREATE FUNCTION cai_router.cai_cluster_stats()
RETURNS TABLE (node text, stats jsonb) AS $$
	CLUSTER 'cai';
	RUN ON cai_router.all_nodes();
	SELECT current_setting('cluster_name') AS node, to_jsonb(s) AS stats FROM pg_stat_cai s;
$$ LANGUAGE plproxy;

CREATE FUNCTION cai_cluster_stats()
RETURNS TABLE (node text, stats jsonb)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
BEGIN
	RETURN QUERY SELECT * FROM cai_router.cai_cluster_stats();
EXCEPTION WHEN internal_error OR admin_shutdown OR crash_shutdown OR cannot_connect_now THEN
	PERFORM cai_router.node_unreachable(SQLERRM, SQLSTATE);
	RAISE;
END
$$;

REVOKE ALL ON FUNCTION cai_router_add_node(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_router.sync_cluster() FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_router.node_unreachable(text, text, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_router.node_unreachable(text, text, int) TO cai_user;
REVOKE ALL ON FUNCTION cai_new_conversation(text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_chat(bigint, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_chat_stream(bigint, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_chat_json(bigint, text, jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_history(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_conversations() FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_complete(text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_complete_json(text, jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_chat_completion(jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_tokenize(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_detokenize(int4[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_model_info() FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_cluster_stats() FROM PUBLIC;

GRANT EXECUTE ON FUNCTION cai_new_conversation(text, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_chat(bigint, text, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_chat_stream(bigint, text, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_chat_json(bigint, text, jsonb, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_history(bigint) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_conversations() TO cai_user;
GRANT EXECUTE ON FUNCTION cai_complete(text, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_complete_json(text, jsonb, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_chat_completion(jsonb, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_tokenize(text) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_detokenize(int4[]) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_model_info() TO cai_user;
GRANT EXECUTE ON FUNCTION cai_cluster_stats() TO cai_user, pg_monitor;
REVOKE ALL ON FUNCTION cai_router.cai_new_conversation(text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_router.cai_chat(bigint, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_router.cai_chat_stream(bigint, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_router.cai_chat_json(bigint, text, jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_router.cai_history(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_router.cai_conversations() FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_router.cai_complete(text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_router.cai_complete_json(text, jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_router.cai_chat_completion(jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_router.cai_tokenize(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_router.cai_detokenize(int4[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_router.cai_model_info() FROM PUBLIC;
REVOKE ALL ON FUNCTION cai_router.cai_cluster_stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_router.cai_new_conversation(text, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_router.cai_chat(bigint, text, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_router.cai_chat_stream(bigint, text, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_router.cai_chat_json(bigint, text, jsonb, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_router.cai_history(bigint) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_router.cai_conversations() TO cai_user;
GRANT EXECUTE ON FUNCTION cai_router.cai_complete(text, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_router.cai_complete_json(text, jsonb, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_router.cai_chat_completion(jsonb, jsonb) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_router.cai_tokenize(text) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_router.cai_detokenize(int4[]) TO cai_user;
GRANT EXECUTE ON FUNCTION cai_router.cai_model_info() TO cai_user;
GRANT EXECUTE ON FUNCTION cai_router.cai_cluster_stats() TO cai_user;
GRANT EXECUTE ON FUNCTION cai_router.cai_cluster_stats() TO pg_monitor;
