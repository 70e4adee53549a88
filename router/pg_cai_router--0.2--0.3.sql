/* pg_cai_router--0.2--0.3.sql — upgrade of pg_cai_router from 0.2 to 0.3 */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION pg_cai_router UPDATE TO '0.3'" to load this file. \quit

--
-- pg_cai_router--0.1.sql and pg_cai_router--0.1--0.2.sql are frozen: a fresh CREATE EXTENSION
-- runs them and then this script.  Every change of 0.3 goes here.
--

--
-- A node that refuses the caller's login is not unreachable.  The router connects to the nodes
-- as the calling role, so a role that is missing on a node, may not log in there (pg_hba.conf,
-- NOLOGIN, no CONNECT on the database) or has no password for it in the router's password file
-- fails there; PL/Proxy reports that, like a node that is down, as XX000 with libpq's words.
-- It is now SQLSTATE 28000 naming the node and the role, with the node's own message as the
-- detail; a node that is down stays 08006.
--
CREATE OR REPLACE FUNCTION cai_router.node_unreachable(message text, state text, partition int DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY INVOKER
AS $$
DECLARE
	port text := substring(message FROM 'port ([0-9]+) failed');
	refusal text := substring(message FROM '((role "[^"]*" does not exist|role "[^"]*" is not permitted to log in|[A-Za-z]* ?authentication failed for user|no pg_hba\.conf entry for|pg_hba\.conf rejects connection|permission denied for database|fe_sendauth: no password supplied).*)$');
	node record;
	which text;
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
	which := coalesce(format('"%s" (partition %s)', node.name, node.partition), 'of this cluster');
	IF state = 'XX000' AND refusal IS NOT NULL THEN
		RAISE EXCEPTION 'pg_cai node % refused the login of role "%": the role is missing there or not allowed to log in',
			which, current_user
			USING ERRCODE = 'invalid_authorization_specification',
				  DETAIL = format('The node says: %s', btrim(refusal, E' \n')),
				  HINT = 'Calls through the router run on the nodes as the calling role: it must exist on every node, may log in there (pg_hba.conf, CONNECT on the database) and, where the nodes ask for passwords, have one in the router''s password file. scripts/scale-out.sh add-role does all three.';
	END IF;
	RAISE EXCEPTION 'pg_cai node % is unreachable', which
		USING ERRCODE = 'connection_failure',
			  DETAIL = message,
			  HINT = 'Conversations on the other nodes are not affected; this node''s continue when it is back.';
END
$$;
