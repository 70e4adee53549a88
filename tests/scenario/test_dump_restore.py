"""pg_dump and pg_restore: a database in use (two roles' conversations, an asynchronous reply
trigger on cai.messages, a pending reply job, an embedding trigger on a user table) is dumped in
custom and in plain format and restored into new databases.  Each restore reports no error, holds the same rows and the same triggers, queued
no job while its rows came back, and goes on as the original would: a conversation continues, new
conversations start, and an inserted user turn (or note) gets its job queued.

The databases are not in pg_cai.job_databases, so no runner takes the jobs: they stay pending."""
import os
import subprocess
import tempfile

from pgtest import Checks, ensure_database, psql, value

SRC = "cai_dump_src"
TARGETS = {"custom": "cai_dump_custom", "plain": "cai_dump_plain"}
ROLES = ("regress_dump_a", "regress_dump_b")
OPTS = '{"max_tokens": 4}'
BINDIR = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
c = Checks()


def run(program, *args):
    return subprocess.run([os.path.join(BINDIR, program)] + list(args), capture_output=True,
                          text=True, timeout=300)


def data_of(db):
    """Every row of pg_cai's tables and of the user's table, in a stable order."""
    return value("SELECT string_agg(t, E'\\n' ORDER BY t) FROM ("
                 " SELECT format('c %s', to_jsonb(c)) AS t FROM cai.conversations c"
                 " UNION ALL SELECT format('m %s', to_jsonb(m)) FROM cai.messages m"
                 " UNION ALL SELECT format('j %s', to_jsonb(j)) FROM cai.jobs j"
                 " UNION ALL SELECT format('t %s', to_jsonb(t)) FROM cai.triggers t"
                 " UNION ALL SELECT format('n %s', to_jsonb(n)) FROM public.notes n) rows", db=db)


def triggers_of(db):
    return value("SELECT string_agg(tgrelid::regclass || ' ' || tgname || ' ' || tgenabled::text, ', '"
                 " ORDER BY tgrelid::regclass::text, tgname) FROM pg_trigger"
                 " WHERE tgrelid IN ('cai.messages'::regclass, 'public.notes'::regclass)"
                 " AND NOT tgisinternal", db=db)


ensure_database()     # and with it the cluster's role cai_user
for db in [SRC] + list(TARGETS.values()):
    psql("DROP DATABASE IF EXISTS %s" % db, db="postgres")
for role in ROLES:
    psql("DROP ROLE IF EXISTS %s" % role, db="postgres")
    value("CREATE ROLE %s IN ROLE cai_user" % role, db="postgres")

# ---- a database in use ----------------------------------------------------------------------
value("CREATE DATABASE %s" % SRC, db="postgres")
value("CREATE EXTENSION pg_cai", db=SRC)
convs = {}
for role in ROLES:
    convs[role] = value("SET ROLE %s; SELECT cai_new_conversation('You are brief.', '%s')"
                        % (role, OPTS), db=SRC)
    value("SET ROLE %s; SELECT cai_chat(%s, 'Hello!')" % (role, convs[role]), db=SRC)
# the README's asynchronous reply trigger (made under another name and renamed, disabled and
# enabled again: its record follows), a trigger made and dropped again (its record goes), and an
# embedding trigger on a table of the user's
value("CREATE TRIGGER answer_later AFTER INSERT ON cai.messages FOR EACH ROW"
      " EXECUTE FUNCTION cai_enqueue_reply_trigger('%s');"
      " ALTER TRIGGER answer_later ON cai.messages RENAME TO reply_later;"
      " ALTER TABLE cai.messages DISABLE TRIGGER reply_later;"
      " ALTER TABLE cai.messages ENABLE TRIGGER reply_later;"
      " CREATE TRIGGER reply_now AFTER INSERT ON cai.messages FOR EACH ROW"
      " EXECUTE FUNCTION cai_reply_trigger();"
      " DROP TRIGGER reply_now ON cai.messages;"
      " CREATE TABLE public.notes (id bigint PRIMARY KEY, body text, embedding real[]);"
      " GRANT ALL ON public.notes TO cai_user;"
      " CREATE TRIGGER notes_embed AFTER INSERT OR UPDATE OF body ON public.notes"
      " FOR EACH ROW EXECUTE FUNCTION cai_embed_trigger('body', 'embedding')" % OPTS, db=SRC)
value("SET ROLE %s; INSERT INTO cai.messages (conversation_id, role, content)"
      " VALUES (%s, 'user', 'Answer me later.'); INSERT INTO public.notes VALUES (1, 'The cat is Tom.')"
      % (ROLES[0], convs[ROLES[0]]), db=SRC)
jobs = value("SELECT string_agg(kind || ' ' || status, ',' ORDER BY id) FROM cai.jobs", db=SRC)
c.check("the database in use has a pending reply job and a pending embedding job",
        jobs == "reply pending,embed pending", jobs)
recorded = value("SELECT string_agg(table_name || ' ' || trigger_name || ' ' || enabled::text, ',')"
                 " FROM cai.triggers", db=SRC)
c.check("the reply trigger on cai.messages is recorded in cai.triggers, under its name, enabled",
        recorded == "cai.messages reply_later O", recorded)
before_data, before_triggers = data_of(SRC), triggers_of(SRC)

# ---- dump, restore ----------------------------------------------------------------------------
work = tempfile.mkdtemp(prefix="pg_cai_dump.")
custom, plain = os.path.join(work, "src.dump"), os.path.join(work, "src.sql")
p = run("pg_dump", "-Fc", "-d", SRC, "-f", custom)
c.check("pg_dump -Fc succeeds", p.returncode == 0, p.stderr)
p = run("pg_dump", "-Fp", "-d", SRC, "-f", plain)
c.check("pg_dump -Fp succeeds", p.returncode == 0, p.stderr)

for how, db in TARGETS.items():
    value("CREATE DATABASE %s" % db, db="postgres")
    if how == "plain":
        p = run("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", db, "-f", plain)
    else:
        p = run("pg_restore", "-d", db, custom)
    errors = [l for l in p.stderr.splitlines() if "ERROR" in l or "error" in l]
    c.check("%s: the restore reports no error" % how, p.returncode == 0 and not errors,
            "rc=%d %s" % (p.returncode, p.stderr[-2000:]))
    after = data_of(db)
    c.check("%s: every row is back, and no job was queued while they came back" % how,
            after == before_data, "before:\n%s\nafter:\n%s" % (before_data, after))
    got = triggers_of(db)
    c.check("%s: the reply and embedding triggers are back, enabled" % how,
            got == before_triggers, "%s, not %s" % (got, before_triggers))

    a, b = ROLES
    r = psql("SET ROLE %s; SELECT cai_chat(%s, 'And again?', '%s') <> '';"
             " SELECT count(*) FROM cai.messages WHERE conversation_id = %s"
             % (b, convs[b], OPTS, convs[b]), db=db)
    c.check("%s: a restored conversation continues (cai_chat)" % how,
            r.rc == 0 and r.out.splitlines() == ["t", "4"], repr(r))
    r = psql("SET ROLE %s; SELECT cai_new_conversation() > (SELECT max(id) FROM cai.conversations)"
             % a, db=db)
    c.check("%s: a new conversation starts after the restored ones" % how,
            r.rc == 0 and r.out == "t", repr(r))
    r = psql("SET ROLE %s; INSERT INTO cai.messages (conversation_id, role, content)"
             " VALUES (%s, 'user', 'Later, please.') RETURNING id;"
             " SELECT string_agg(status || ' ' || options::text, ',') FROM cai.jobs"
             " WHERE message_id = (SELECT max(id) FROM cai.messages)" % (b, convs[b]), db=db)
    rows = r.out.splitlines()
    c.check("%s: an inserted user turn gets its reply job queued, with the trigger's options" % how,
            r.rc == 0 and len(rows) == 2 and rows[1] == "pending %s" % OPTS, repr(r))
    r = psql("SET ROLE %s; INSERT INTO public.notes VALUES (2, 'The dog is Rex.');"
             " SELECT count(*) FROM cai.jobs WHERE kind = 'embed' AND row_key = '2' AND status = 'pending'"
             % a, db=db)
    c.check("%s: an inserted note gets its embedding job queued" % how,
            r.rc == 0 and r.out == "1", repr(r))

for db in [SRC] + list(TARGETS.values()):
    psql("DROP DATABASE IF EXISTS %s" % db, db="postgres")
for role in ROLES:
    psql("DROP ROLE IF EXISTS %s" % role, db="postgres")
subprocess.run(["rm", "-rf", work])
c.done()
