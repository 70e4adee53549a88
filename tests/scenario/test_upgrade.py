"""ALTER EXTENSION pg_cai UPDATE from 0.1: a database made with 0.1 and used (two roles'
conversations and turns with token ids, a pending reply job, a role's own grants) loses nothing,
its objects then equal a fresh installation's (pg_dump --binary-upgrade --schema-only, which
dumps an extension's objects one by one), and it works as a fresh one does: both roles chat in
their old conversations with row-level security intact, and the 0.2 objects are there.

The databases are not in pg_cai.job_databases, so no runner takes the job: it must survive the
upgrade as it was."""
import os
import re
import subprocess

from pgtest import Checks, psql, value

OLD, NEW = "cai_upgrade_old", "cai_upgrade_new"
ROLES = ("regress_upgrade_a", "regress_upgrade_b")
OPTS = '{"max_tokens": 4}'
c = Checks()


def pg_dump(db, *args):
    bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
    p = subprocess.run([os.path.join(bindir, "pg_dump"), "-d", db] + list(args),
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError("pg_dump %s failed: %s" % (db, p.stderr))
    return p.stdout


def schema_of(db):
    """The database's objects, extension members included, without what names OIDs or versions
    the two installations cannot share."""
    lines = []
    for line in pg_dump(db, "--schema-only", "--binary-upgrade", "--no-comments").splitlines():
        if "binary_upgrade_set_next_" in line or line.startswith("-- Dumped") or line.startswith("\\restrict") \
                or line.startswith("\\unrestrict"):
            continue
        # the empty extension's config-table OID arrays, the tables' transaction horizons and
        # their TOAST tables' OIDs
        line = re.sub(r"'\{[0-9,]*\}'", "'{...}'", line)
        line = re.sub(r"relfrozenxid = '[0-9]+', relminmxid = '[0-9]+'", "relfrozenxid = ..., relminmxid = ...", line)
        line = re.sub(r"^WHERE oid = '[0-9]+';$", "WHERE oid = ...;", line)
        # (16 dumps the config tables' sequences' positions, which the rows set)
        line = re.sub(r"setval\('([^']+)', [0-9]+, (true|false)\)", r"setval('\1', ...)", line)
        lines.append(line)
    return "\n".join(lines)


# columns that 0.2 adds to cai.jobs for embedding jobs, with their values on a reply job
JOB_COLUMNS_0_2 = ("'{\"kind\": \"reply\", \"owner\": null, \"target_table\": null, \"key_column\": null, "
                   "\"row_key\": null, \"text_column\": null, \"embedding_column\": null, "
                   "\"superseded_by\": null}'::jsonb")


def data_of(db):
    """Every row of the extension's tables, in a stable order: conversations without 0.2's model
    column (NULL after the upgrade, checked below), and a job's columns of 0.2 left out where
    they hold what every reply job holds."""
    return value("SELECT string_agg(t, E'\\n' ORDER BY t) FROM ("
                 " SELECT format('c %s', to_jsonb(c) - 'model') AS t FROM cai.conversations c"
                 " UNION ALL SELECT format('m %s', row_to_json(m)) FROM cai.messages m"
                 " UNION ALL SELECT format('j %s', CASE WHEN to_jsonb(j) @> " + JOB_COLUMNS_0_2 +
                 "   THEN to_jsonb(j) - ARRAY(SELECT jsonb_object_keys(" + JOB_COLUMNS_0_2 + "))"
                 "   ELSE to_jsonb(j) END) FROM cai.jobs j) rows", db=db)


for db in (OLD, NEW):
    psql("DROP DATABASE IF EXISTS %s" % db, db="postgres")
    value("CREATE DATABASE %s" % db, db="postgres")

# ---- a 0.1 database in use -------------------------------------------------------------------
value("CREATE EXTENSION pg_cai VERSION '0.1'", db=OLD)
for role in ROLES:
    psql("DROP ROLE IF EXISTS %s" % role, db="postgres")
    value("CREATE ROLE %s IN ROLE cai_user" % role, db="postgres")
c.check("the old database runs 0.1",
        value("SELECT extversion FROM pg_extension WHERE extname = 'pg_cai'", db=OLD) == "0.1")
convs = {}
for role in ROLES:
    convs[role] = value("SET ROLE %s; SELECT cai_new_conversation('You are brief.', '%s')"
                        % (role, OPTS), db=OLD)
    value("SET ROLE %s; SELECT cai_chat(%s, 'Hello!')" % (role, convs[role]), db=OLD)
# a reply trigger and a grant of the DBA's own, and a reply job left pending
SETUP = ("CREATE TRIGGER reply_later AFTER INSERT ON cai.messages FOR EACH ROW"
         " EXECUTE FUNCTION cai_enqueue_reply_trigger(); GRANT SELECT ON cai.jobs TO pg_monitor")
value(SETUP, db=OLD)
value("SET ROLE %s; INSERT INTO cai.messages (conversation_id, role, content)"
      " VALUES (%s, 'user', 'Answer me later.')" % (ROLES[0], convs[ROLES[0]]), db=OLD)
jobs = value("SELECT string_agg(status, ',') FROM cai.jobs", db=OLD)
c.check("the old database has a pending job", jobs == "pending", jobs)
before = data_of(OLD)

# ---- the upgrade -------------------------------------------------------------------------------
r = psql("ALTER EXTENSION pg_cai UPDATE", db=OLD)
c.check("ALTER EXTENSION pg_cai UPDATE succeeds", r.rc == 0, repr(r))
c.check("the old database runs 0.3",
        value("SELECT extversion FROM pg_extension WHERE extname = 'pg_cai'", db=OLD) == "0.3")
after = data_of(OLD)
c.check("no conversation, turn or job changed in the upgrade", after == before,
        "before:\n%s\nafter:\n%s" % (before, after))
c.check("the conversations' new model column is NULL until their next reply",
        value("SELECT count(*) FROM cai.conversations WHERE model IS NOT NULL", db=OLD) == "0")
c.check("the DBA's grant on cai.jobs is kept",
        value("SELECT has_table_privilege('pg_monitor', 'cai.jobs', 'SELECT')", db=OLD) == "t")

# ---- the same objects as a fresh 0.2 ---------------------------------------------------------
value("CREATE EXTENSION pg_cai", db=NEW)
value(SETUP, db=NEW)
old_schema, new_schema = schema_of(OLD), schema_of(NEW)
if old_schema != new_schema:
    import difflib
    diff = "\n".join(list(difflib.unified_diff(new_schema.splitlines(), old_schema.splitlines(),
                                               "fresh 0.2", "upgraded", lineterm=""))[:80])
else:
    diff = ""
c.check("the upgraded database's objects equal a fresh 0.2 installation's (pg_dump)",
        old_schema == new_schema and "cai_stat_reset" in new_schema, diff)

# ---- it works as a fresh one does ----------------------------------------------------------
for role in ROLES:
    r = psql("SET ROLE %s; SELECT cai_chat(%s, 'And again?', '%s');"
             " SELECT count(*) FROM cai.messages WHERE conversation_id = %s;"
             " SELECT count(*) FROM cai.conversations" % (role, convs[role], OPTS, convs[role]), db=OLD)
    rows = r.out.splitlines()
    # the first role's conversation also holds the turn its job waits on
    want = "5" if role == ROLES[0] else "4"
    c.check("%s chats on in its old conversation" % role,
            r.rc == 0 and len(rows) == 3 and rows[1] == want and rows[2] == "1", repr(r))
r = psql("SET ROLE %s; SELECT cai_chat(%s, 'Hi', '%s')" % (ROLES[1], convs[ROLES[0]], OPTS), db=OLD)
c.check("row-level security still hides one role's conversation from another",
        r.rc != 0 and "does not exist" in r.err, repr(r))
r = psql("SELECT cai_stat_reset() IS NOT NULL; SELECT stats_reset IS NOT NULL FROM pg_stat_cai", db=OLD)
c.check("the upgraded database has 0.2's cai_stat_reset and pg_stat_cai.stats_reset",
        r.rc == 0 and r.out.splitlines() == ["t", "t"], repr(r))

for db in (OLD, NEW):
    psql("DROP DATABASE IF EXISTS %s" % db, db="postgres")
for role in ROLES:
    psql("DROP ROLE IF EXISTS %s" % role, db="postgres")
c.done()
