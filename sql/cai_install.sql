--
-- What CREATE EXTENSION pg_cai installs: functions and their properties, tables, row-level
-- security, privileges, settings, and the model the test cluster loads.
--
SELECT p.proname, oidvectortypes(p.proargtypes) AS args, p.prorettype::regtype AS returns,
       p.provolatile AS vol, p.proparallel AS par, p.prosecdef AS secdef, p.proisstrict AS strict,
       obj_description(p.oid, 'pg_proc') IS NOT NULL AS commented
FROM pg_proc p
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'pg_cai'
ORDER BY 1, 2;

-- nobody may execute them through PUBLIC; cai_user may use all but cai_cache_reset
SELECT p.proname,
       EXISTS (SELECT FROM aclexplode(p.proacl) a WHERE a.grantee = 0) AS public_execute,
       has_function_privilege('cai_user', p.oid, 'EXECUTE') AS cai_user_execute
FROM pg_proc p
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'pg_cai'
ORDER BY 1;

SELECT rolcanlogin FROM pg_roles WHERE rolname = 'cai_user';

SELECT table_name, column_name, data_type, is_nullable, column_default
FROM information_schema.columns
WHERE table_schema = 'cai'
ORDER BY table_name, ordinal_position;

SELECT relname, relrowsecurity, obj_description(oid, 'pg_class') IS NOT NULL AS commented
FROM pg_class WHERE relnamespace = 'cai'::regnamespace AND relkind = 'r' ORDER BY 1;

SELECT tablename, policyname, cmd, qual, with_check FROM pg_policies WHERE schemaname = 'cai' ORDER BY 1;

SELECT has_table_privilege('cai_user', 'cai.conversations', 'SELECT, INSERT, UPDATE, DELETE') AS conversations,
       has_table_privilege('cai_user', 'cai.messages', 'SELECT, INSERT, UPDATE, DELETE') AS messages,
       has_table_privilege('cai_user', 'pg_stat_cai', 'SELECT') AS stats_view;

-- settings: pg_cai.model names a file and is postmaster-level; cache_isolation is superuser-only
SELECT name, setting, unit, context, vartype FROM pg_settings
WHERE name LIKE 'pg_cai.%' AND name <> 'pg_cai.model' ORDER BY name;
SELECT context, setting <> '' AS set FROM pg_settings WHERE name = 'pg_cai.model';
SET pg_cai.max_tokens = 7;
SHOW pg_cai.max_tokens;
RESET pg_cai.max_tokens;
SET pg_cai.device = 'cpu';
SET pg_cai.no_such_setting = 1;

-- the model of the test cluster
SELECT key FROM jsonb_object_keys(cai_model_info()) AS key ORDER BY key;
SELECT m->>'status' AS status, m->>'arch' AS arch, m->>'chat_template' AS template,
       m->'layers' AS layers, m->'d_model' AS d_model, m->'heads' AS heads, m->'kv_heads' AS kv_heads,
       m->'head_dim' AS head_dim, m->'d_ff' AS d_ff, m->'vocab' AS vocab,
       m->'context_length' AS context, length(m->>'device') > 0 AS has_device,
       length(m->>'device_reason') > 0 AS says_why
FROM cai_model_info() AS m;
-- the numerics settings' values; their old names ('compensated', 'int8x2') are still accepted
-- for one release but not listed; both default to auto
SELECT name, enumvals, boot_val FROM pg_settings
WHERE name IN ('pg_cai.weight_rounding', 'pg_cai.activation_precision') ORDER BY name;
ALTER SYSTEM SET pg_cai.weight_rounding = 'compensated';
ALTER SYSTEM SET pg_cai.activation_precision = 'int8x2';
ALTER SYSTEM SET pg_cai.activation_precision = 'int8x3';
ALTER SYSTEM RESET pg_cai.weight_rounding;
ALTER SYSTEM RESET pg_cai.activation_precision;
-- the engine reports how it rounded the weights (pg_cai.weight_rounding)
SELECT cai_model_info()->>'weight_rounding' AS weight_rounding, current_setting('pg_cai.weight_rounding') AS setting;
-- and how it quantizes its GEMMs' inputs (pg_cai.activation_precision)
SELECT cai_model_info()->>'activation_precision' AS activation_precision,
       current_setting('pg_cai.activation_precision') AS setting;
