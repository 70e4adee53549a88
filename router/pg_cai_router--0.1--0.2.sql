/* pg_cai_router--0.1--0.2.sql — upgrade of pg_cai_router from 0.1 to 0.2 */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION pg_cai_router UPDATE TO '0.2'" to load this file. \quit

--
-- pg_cai_router--0.1.sql is frozen: a fresh CREATE EXTENSION runs it and then this script.
-- Every change of 0.2 goes here.
--

--
-- Who the nodes see: calls run there as the calling role, and nobody else can change that.
--
-- PL/Proxy builds its connect string from the server's partition option, then the options of the
-- user mapping for current_user (or of the PUBLIC one), and adds user=current_user only when the
-- mapping names no "user".  GRANT USAGE ON FOREIGN SERVER cai TO cai_user, which PL/Proxy needs,
-- also lets every cai_user run CREATE USER MAPPING FOR CURRENT_USER SERVER cai OPTIONS (user
-- 'someone_else'): PL/Proxy then connects to every node as that role, with whatever trust,
-- .pgpass line or certificate the router host has for it.  Three guards close that:
--
--   * cai_router_guard_ddl (ddl_command_end) refuses CREATE and ALTER USER MAPPING on a PL/Proxy
--     server from non-superusers, and ALTER SERVER on one from non-superusers; from superusers it
--     refuses a mapping whose "user" is not the mapped role (any "user" on the PUBLIC mapping), a
--     partition connect string that names a user or a password, and an owner that is not a
--     superuser (the server's owner may create any role's mapping).  ddl_command_start sees only
--     the command tag; ddl_command_end sees the mapping or server the command made, but DROP
--     reports nothing there, so
--   * cai_router_guard_drop (sql_drop) refuses DROP USER MAPPING (and DROP OWNED dropping one) on
--     a PL/Proxy server from non-superusers.
--   * Every routed call checks, before PL/Proxy connects (in the RUN ON functions, which the
--     cai_router.* PL/Proxy functions that cai_user may call directly evaluate first), that the
--     mapping PL/Proxy will use for the caller names no other role: defence against a mapping
--     made while the event triggers were off (session_replication_role = replica, or before 0.2).
--     The check reads the catalogs, not a record of who made the mapping: PL/Proxy's validator
--     accepts only "user" and "password" in a mapping, and only "user" changes who connects.
--

-- true when a user mapping's options name a user other than role (NULL: the PUBLIC mapping,
-- which must name none).  "user" in any case: PL/Proxy's validator accepts it case-insensitively.
CREATE FUNCTION cai_router.names_other_user(options text[], role name)
RETURNS boolean
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT EXISTS (SELECT FROM unnest(options) o
				   WHERE lower(split_part(o, '=', 1)) = 'user'
					 AND substr(o, strpos(o, '=') + 1) IS DISTINCT FROM role::text)
$$;

-- the PUBLIC mapping's options on server cai without its password: pg_user_mappings shows them
-- only to members of the server's owner
CREATE FUNCTION cai_router.public_mapping_options()
RETURNS text[]
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT array(SELECT o FROM unnest(um.umoptions) o WHERE lower(split_part(o, '=', 1)) <> 'password')
	FROM pg_catalog.pg_user_mapping um
	JOIN pg_catalog.pg_foreign_server s ON s.oid = um.umserver
	WHERE s.srvname = 'cai' AND um.umuser = 0
$$;
REVOKE ALL ON FUNCTION cai_router.public_mapping_options() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cai_router.public_mapping_options() TO cai_user, pg_monitor;

-- Raises 42501 when PL/Proxy would connect to the nodes as a role other than current_user (the
-- role PL/Proxy uses).  Two catalog lookups per routed call.  The caller's own mapping's options
-- are visible to it in pg_user_mappings whenever it has USAGE on the server, which PL/Proxy
-- requires anyway.
CREATE FUNCTION cai_router.check_caller()
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	opts text[];
	whose text := 'role ' || quote_ident(current_user);
BEGIN
	SELECT m.umoptions INTO opts FROM pg_catalog.pg_user_mappings m
	WHERE m.srvname = 'cai' AND m.umuser <> 0 AND m.usename = current_user;
	IF NOT FOUND THEN
		opts := cai_router.public_mapping_options();
		whose := 'PUBLIC';
	END IF;
	IF cai_router.names_other_user(opts, current_user) THEN
		RAISE EXCEPTION 'the user mapping for % on server "cai" connects to the nodes as another role', whose
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'PL/Proxy would run this call on the nodes as the role the mapping''s "user" option names.',
				  HINT = 'Calls through the router run on the nodes as the calling role. A superuser must drop or fix the mapping: ALTER USER MAPPING ... OPTIONS (DROP user).';
	END IF;
END
$$;

-- the RUN ON functions, now checking the caller first
CREATE OR REPLACE FUNCTION cai_router.partition_of(conversation_id bigint)
RETURNS int4
LANGUAGE plpgsql STABLE SECURITY INVOKER
AS $$
DECLARE
	p int4 := (conversation_id >> 48)::int4;
BEGIN
	PERFORM cai_router.check_caller();
	IF conversation_id IS NULL OR conversation_id <= 0
	   OR NOT EXISTS (SELECT FROM cai_router.nodes WHERE partition = p) THEN
		RAISE EXCEPTION 'conversation % does not exist', conversation_id
			USING ERRCODE = 'undefined_object',
				  HINT = 'Create one with cai_new_conversation(). A role sees only the conversations it owns.';
	END IF;
	RETURN p;
END
$$;

CREATE OR REPLACE FUNCTION cai_router.next_node()
RETURNS int4
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$
	SELECT cai_router.check_caller();
	SELECT (nextval('cai_router.placement') % greatest(count(*), 1))::int4 FROM cai_router.nodes
$$;

CREATE OR REPLACE FUNCTION cai_router.any_node()
RETURNS int4
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$
	SELECT cai_router.check_caller();
	SELECT floor(random() * greatest(count(*), 1))::int4 FROM cai_router.nodes
$$;

CREATE OR REPLACE FUNCTION cai_router.all_nodes()
RETURNS SETOF int4
LANGUAGE sql STABLE SECURITY INVOKER
AS $$
	SELECT cai_router.check_caller();
	SELECT partition FROM cai_router.nodes ORDER BY partition
$$;

-- PL/Proxy uses a partition's connect string as it is, without the caller's user, whenever it
-- contains "user=" anywhere (a substring test), e.g. inside another option's value
ALTER TABLE cai_router.nodes ADD CONSTRAINT nodes_connstr_no_user CHECK (strpos(connstr, 'user=') = 0);

CREATE FUNCTION cai_router.is_plproxy_server(server oid)
RETURNS boolean
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT EXISTS (SELECT FROM pg_catalog.pg_foreign_server s
				   JOIN pg_catalog.pg_foreign_data_wrapper w ON w.oid = s.srvfdw
				   WHERE s.oid = server AND w.fdwname = 'plproxy')
$$;

CREATE FUNCTION cai_router.is_superuser()
RETURNS boolean
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT coalesce((SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user), false)
$$;

-- Raises unless the PL/Proxy server's owner is a superuser and its partitions' connect strings
-- leave the user to PL/Proxy (run as a superuser: after ALTER SERVER, and once below)
CREATE FUNCTION cai_router.check_server(server oid)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	srv record;
	bad text;
BEGIN
	SELECT s.srvname, s.srvoptions, r.rolname AS owner, r.rolsuper INTO srv
	FROM pg_catalog.pg_foreign_server s JOIN pg_catalog.pg_roles r ON r.oid = s.srvowner
	WHERE s.oid = server;
	IF NOT srv.rolsuper THEN
		RAISE EXCEPTION 'the owner of PL/Proxy server "%" must be a superuser', srv.srvname
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = format('Role "%s" is not; the owner of the server may create any role''s user mapping.', srv.owner);
	END IF;
	SELECT o INTO bad FROM unnest(srv.srvoptions) o
	WHERE o ~ '^p[0-9]+='
	  AND (strpos(o, 'user=') > 0 OR o ~* '(^|=|[[:space:]])(user|password)[[:space:]]*=')
	LIMIT 1;
	IF bad IS NOT NULL THEN
		RAISE EXCEPTION 'a partition of PL/Proxy server "%" names a user or a password', srv.srvname
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = format('Option %s; the router connects to the nodes as the calling role.', split_part(bad, '=', 1)),
				  HINT = 'Register nodes with cai_router_add_node(), whose connect strings name neither.';
	END IF;
END
$$;

CREATE FUNCTION cai_router.guard_ddl()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	cmd record;
	m record;
	opts text[];
	su boolean := cai_router.is_superuser();
BEGIN
	FOR cmd IN SELECT * FROM pg_catalog.pg_event_trigger_ddl_commands() LOOP
		IF cmd.classid = 'pg_catalog.pg_user_mapping'::regclass THEN
			SELECT um.srvid, um.srvname, um.umuser, um.usename INTO m
			FROM pg_catalog.pg_user_mappings um WHERE um.umid = cmd.objid;
			CONTINUE WHEN NOT FOUND OR NOT cai_router.is_plproxy_server(m.srvid);
			IF NOT su THEN
				RAISE EXCEPTION 'permission denied to % on PL/Proxy server "%"', lower(cmd.command_tag), m.srvname
					USING ERRCODE = 'insufficient_privilege',
						  DETAIL = 'Only superusers may create or change user mappings on the router''s servers: a mapping decides which role the nodes see.';
			END IF;
			SELECT um.umoptions INTO opts FROM pg_catalog.pg_user_mapping um WHERE um.oid = cmd.objid;
			IF cai_router.names_other_user(opts, CASE WHEN m.umuser = 0 THEN NULL ELSE m.usename END) THEN
				RAISE EXCEPTION 'a user mapping on PL/Proxy server "%" must not name another role', m.srvname
					USING ERRCODE = 'insufficient_privilege',
						  DETAIL = format('The mapping for %s names a "user"; PL/Proxy would run its calls on the nodes as that role.',
										  CASE WHEN m.umuser = 0 THEN 'PUBLIC' ELSE quote_ident(m.usename) END),
						  HINT = 'Calls through the router run on the nodes as the calling role: leave "user" out, or name the mapped role itself.';
			END IF;
		ELSIF cmd.classid = 'pg_catalog.pg_foreign_server'::regclass THEN
			CONTINUE WHEN NOT cai_router.is_plproxy_server(cmd.objid);
			IF NOT su THEN
				RAISE EXCEPTION 'permission denied to alter PL/Proxy server %', cmd.object_identity
					USING ERRCODE = 'insufficient_privilege';
			END IF;
			PERFORM cai_router.check_server(cmd.objid);
		END IF;
	END LOOP;
END
$$;

CREATE FUNCTION cai_router.guard_drop()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	obj record;
BEGIN
	IF cai_router.is_superuser() THEN
		RETURN;
	END IF;
	-- a dropped mapping's address is (role, server name)
	FOR obj IN SELECT * FROM pg_catalog.pg_event_trigger_dropped_objects()
			   WHERE object_type = 'user mapping' LOOP
		IF EXISTS (SELECT FROM pg_catalog.pg_foreign_server s
				   WHERE s.srvname = obj.address_args[1] AND cai_router.is_plproxy_server(s.oid)) THEN
			RAISE EXCEPTION 'permission denied to drop user mapping on PL/Proxy server "%"', obj.address_args[1]
				USING ERRCODE = 'insufficient_privilege',
					  DETAIL = 'Only superusers may create, change or drop user mappings on the router''s servers.';
		END IF;
	END LOOP;
END
$$;

CREATE EVENT TRIGGER cai_router_guard_ddl ON ddl_command_end
	WHEN TAG IN ('CREATE USER MAPPING', 'ALTER USER MAPPING', 'ALTER SERVER')
	EXECUTE FUNCTION cai_router.guard_ddl();
CREATE EVENT TRIGGER cai_router_guard_drop ON sql_drop
	WHEN TAG IN ('DROP USER MAPPING', 'DROP OWNED')
	EXECUTE FUNCTION cai_router.guard_drop();

-- what 0.1 may have left: the server as it is now, and mappings that name another role (their
-- roles' routed calls now fail with 42501 until a superuser fixes them)
SELECT cai_router.check_server(oid) FROM pg_catalog.pg_foreign_server WHERE srvname = 'cai';
DO $$
DECLARE
	m record;
BEGIN
	FOR m IN SELECT um.umuser, r.rolname FROM pg_catalog.pg_user_mapping um
			 JOIN pg_catalog.pg_foreign_server s ON s.oid = um.umserver
			 LEFT JOIN pg_catalog.pg_roles r ON r.oid = um.umuser
			 WHERE s.srvname = 'cai'
			   AND cai_router.names_other_user(um.umoptions, CASE WHEN um.umuser = 0 THEN NULL ELSE r.rolname END) LOOP
		RAISE WARNING 'the user mapping for % on server "cai" names another role: that role''s routed calls are refused',
			coalesce(quote_ident(m.rolname), 'PUBLIC')
			USING HINT = 'Drop the mapping, or its "user" option.';
	END LOOP;
END
$$;
