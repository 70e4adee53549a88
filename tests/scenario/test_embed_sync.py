"""Embeddings kept in step with their text: cai_embed_trigger queues an 'embed' job in cai.jobs when
a row's text is inserted or changes, and a job runner stores cai_embed of the row's text, as the
role that wrote it.

A rolled-back write queues nothing; a write that leaves the text alone queues nothing (the runner's
own update included); jobs are the writer's alone (row-level security) and cannot be queued in
another role's name; bad trigger arguments are clear errors.  Then 32 concurrent writers insert and
rewrite rows, some rolling back: when the jobs have drained, every row's embedding is cai_embed of
its final text (none lost, none stale), no job failed, and each row has exactly one embedding.  The
scenario cluster's pg_cai.job_databases lists this database.
"""
import random
import threading
import time

from pgtest import Checks, DB, ensure_database, psql, value, wait_for
from pqlib import Conn

WRITERS = 32
TRANSACTIONS = 6
WRITER = "scenario_embed_writer"
OTHER = "scenario_embed_other"

c = Checks()
ensure_database()


def as_writer(sql, role=WRITER):
    return psql("SET ROLE %s; %s" % (role, sql))


def open_jobs():
    return int(value("SELECT count(*) FROM cai.jobs WHERE kind = 'embed' AND status IN ('pending', 'running')"))


def drained(timeout=300):
    return wait_for(lambda: open_jobs() == 0, timeout, interval=0.3) is not None


def stale_rows():
    """Rows whose embedding is not cai_embed of their text (as the writer computes it)."""
    return as_writer("SELECT count(*) FROM embed_docs WHERE embedding IS DISTINCT FROM cai_embed(body) "
                     "OR (embedding IS NULL AND body IS NOT NULL)")


value("DROP TABLE IF EXISTS embed_docs, embed_nokey, embed_badtype; "
      "DO $$ BEGIN "
      "IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '%s') THEN CREATE ROLE %s IN ROLE cai_user; END IF; "
      "IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '%s') THEN CREATE ROLE %s IN ROLE cai_user; END IF; "
      "END $$; DELETE FROM cai.jobs WHERE kind = 'embed'; GRANT CREATE ON SCHEMA public TO %s"
      % (WRITER, WRITER, OTHER, OTHER, WRITER))
r = as_writer("CREATE TABLE embed_docs (id bigint PRIMARY KEY, body text, tag text, embedding real[]); "
              "CREATE TRIGGER embed_docs_sync AFTER INSERT OR UPDATE ON embed_docs FOR EACH ROW "
              "EXECUTE FUNCTION cai_embed_trigger('body', 'embedding'); "
              "GRANT SELECT ON embed_docs TO %s" % OTHER)
c.check("the writer creates a table with the embedding trigger", r.rc == 0, repr(r))

# ---- one row: inserted, embedded by a runner as its writer ---------------------------------
r = as_writer("INSERT INTO embed_docs (id, body) VALUES (1, 'PostgreSQL is a database.')")
c.check("the insert queues one embed job, owned by the writer",
        r.rc == 0 and value("SELECT count(*), min(owner), min(row_key), min(key_column) FROM cai.jobs "
                            "WHERE kind = 'embed'") == "1|%s|1|id" % WRITER, repr(r))
c.check("the job is done", drained(120),
        value("SELECT count(*) || ' jobs: ' || string_agg(DISTINCT status || ' ' || coalesce(error, ''), '; ') "
              "FROM cai.jobs WHERE kind = 'embed'"))
row = as_writer("SELECT embedding = cai_embed(body), array_length(embedding, 1) > 0 FROM embed_docs WHERE id = 1")
c.check("the row holds cai_embed of its text", row.rc == 0 and row.out == "t|t", repr(row))

# ---- what queues nothing --------------------------------------------------------------------
r = as_writer("BEGIN; INSERT INTO embed_docs (id, body) VALUES (2, 'rolled back'); ROLLBACK; "
              "UPDATE embed_docs SET tag = 'x' WHERE id = 1; "
              "UPDATE embed_docs SET body = body WHERE id = 1; "
              "SELECT count(*) FROM cai.jobs WHERE kind = 'embed'")
c.check("a rolled-back insert and writes that keep the text queue no job (the runner's own update "
        "neither)", r.rc == 0 and r.out == "1", repr(r))

# ---- a changed text is embedded again ---------------------------------------------------------
r = as_writer("UPDATE embed_docs SET body = 'pgvector stores vectors.' WHERE id = 1")
c.check("a new text is embedded again", r.rc == 0 and drained(120) and stale_rows().out == "0",
        repr(stale_rows()))

# ---- each job's end is a NOTIFY on cai_embedding naming the job --------------------------------
listener = Conn(DB, "cai_embed_listener")
listener.exec("LISTEN cai_embedding")


def notified(count, timeout=60):
    """The payloads of the next count notifications (fewer if the timeout comes first)."""
    got, deadline = [], time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += [n for n in listener.notifies(deadline - time.monotonic())]
    c.check("notifications come on cai_embedding only", all(n[0] == "cai_embedding" for n in got), repr(got))
    return [n[1] for n in got]


def job_ids(row_key, table="embed_docs"):
    return value("SELECT string_agg(id::text, ',' ORDER BY id) FROM cai.jobs WHERE kind = 'embed' "
                 "AND row_key = '%s' AND target_table = '%s'::regclass" % (row_key, table)).split(",")


# ---- a burst of edits costs one embedding --------------------------------------------------
r = as_writer("BEGIN; INSERT INTO embed_docs (id, body) VALUES (3, 'one'); "
              "UPDATE embed_docs SET body = 'two' WHERE id = 3; UPDATE embed_docs SET body = 'three' WHERE id = 3; "
              "COMMIT")
burst = value("SELECT string_agg(CASE WHEN superseded_by IS NULL THEN status ELSE 'superseded' END, ',' ORDER BY id) "
              "FROM cai.jobs WHERE kind = 'embed' AND row_key = '3'") if r.rc == 0 and drained(120) else repr(r)
row = as_writer("SELECT embedding = cai_embed('three') FROM embed_docs WHERE id = 3")
c.check("three writes committed together: the first two jobs are superseded, the last embeds the final text",
        burst == "superseded,superseded,done" and row.out == "t", "%s; %r" % (burst, row))
notes = notified(3)
c.check("each of the three jobs' ends is a NOTIFY cai_embedding with its id", sorted(notes, key=int) == job_ids(3),
        "%r against %r" % (notes, job_ids(3)))

# ---- the model: a name of pg_cai.models, kept in the job's options ----------------------------
r = as_writer("CREATE TABLE embed_models (id int PRIMARY KEY, body text, embedding real[]); "
              "CREATE TRIGGER named AFTER INSERT ON embed_models FOR EACH ROW "
              "EXECUTE FUNCTION cai_embed_trigger('body', 'embedding', '', 'default'); "
              "INSERT INTO embed_models VALUES (1, 'named model')")
ok = r.rc == 0 and drained(120)
row = as_writer("SELECT embedding = cai_embed(body, model => 'default') FROM embed_models")
c.check("a trigger naming the model 'default' (key: the primary key) embeds with it",
        ok and row.out == "t" and value("SELECT options->>'model' FROM cai.jobs WHERE kind = 'embed' "
                                        "AND target_table = 'embed_models'::regclass") == "default", repr(row))
r = as_writer("DROP TRIGGER named ON embed_models; CREATE TRIGGER unknown AFTER INSERT ON embed_models "
              "FOR EACH ROW EXECUTE FUNCTION cai_embed_trigger('body', 'embedding', 'id', 'no_such_model'); "
              "INSERT INTO embed_models VALUES (2, 'unknown model')")
failed = wait_for(lambda: value("SELECT status || ': ' || coalesce(error, '') FROM cai.jobs WHERE kind = 'embed' "
                                "AND row_key = '2' AND target_table = 'embed_models'::regclass").startswith("failed"),
                  120, interval=0.3)
err = value("SELECT error FROM cai.jobs WHERE kind = 'embed' AND row_key = '2' "
            "AND target_table = 'embed_models'::regclass")
c.check("a job for a model that is not configured fails, naming it", failed is not None
        and 'pg_cai model "no_such_model" is not configured' in err, err)
notes = notified(2)
c.check("the named model's job and the failed job each sent their NOTIFY",
        sorted(notes, key=int) == job_ids(1, "embed_models") + job_ids(2, "embed_models"),
        "%r against %r" % (notes, job_ids(1, "embed_models") + job_ids(2, "embed_models")))
listener.close()
value("DROP TABLE embed_models")

# ---- the jobs are the writer's --------------------------------------------------------------
r = as_writer("SELECT count(*) FROM cai.jobs WHERE kind = 'embed'", role=OTHER)
c.check("another role sees none of the writer's embed jobs", r.rc == 0 and r.out == "0", repr(r))
r = as_writer("INSERT INTO cai.jobs (kind, owner, target_table, key_column, row_key, text_column, "
              "embedding_column) VALUES ('embed', '%s', 'embed_docs', 'id', '1', 'body', 'embedding')" % WRITER,
              role=OTHER)
c.check("a role cannot queue an embed job in another role's name",
        r.rc != 0 and "row-level security" in r.err, repr(r))

# ---- bad trigger arguments ------------------------------------------------------------------
for setup, message in (
        ("CREATE TABLE embed_nokey (body text, embedding real[]); CREATE TRIGGER t AFTER INSERT ON embed_nokey "
         "FOR EACH ROW EXECUTE FUNCTION cai_embed_trigger('body', 'embedding'); "
         "INSERT INTO embed_nokey VALUES ('x')", 'table "embed_nokey" has no single-column primary key'),
        ("CREATE TABLE embed_badtype (id int PRIMARY KEY, body text, embedding text); CREATE TRIGGER t AFTER INSERT "
         "ON embed_badtype FOR EACH ROW EXECUTE FUNCTION cai_embed_trigger('body', 'embedding'); "
         "INSERT INTO embed_badtype VALUES (1, 'x')", 'embedding column "embedding" is of type text, not real[] or vector'),
        ("CREATE TEMP TABLE embed_nocol (id int PRIMARY KEY, body text); CREATE TRIGGER t AFTER INSERT "
         "ON embed_nocol FOR EACH ROW EXECUTE FUNCTION cai_embed_trigger('body', 'vec'); "
         "INSERT INTO embed_nocol VALUES (1, 'x')", 'embedding column "vec" does not exist in table "embed_nocol"'),
        ("CREATE TEMP TABLE embed_before (id int PRIMARY KEY, body text, embedding real[]); CREATE TRIGGER t "
         "BEFORE INSERT ON embed_before FOR EACH ROW EXECUTE FUNCTION cai_embed_trigger('body', 'embedding'); "
         "INSERT INTO embed_before VALUES (1, 'x')", "must be an AFTER INSERT OR UPDATE FOR EACH ROW trigger")):
    r = as_writer(setup)
    c.check("refused: %s" % message, r.rc != 0 and message in r.err, repr(r))
value("DROP TABLE IF EXISTS embed_nokey, embed_badtype")

# ---- 32 concurrent writers ------------------------------------------------------------------
words = ("red green blue database vector query index table row column embedding search answer "
         "model token cache engine batch trigger job").split()
committed = []
errors = []
lock = threading.Lock()


def writer(n):
    rnd = random.Random(n)
    for t in range(TRANSACTIONS):
        key = 1000 + rnd.randrange(48)
        text = " ".join(rnd.choice(words) for _ in range(rnd.randrange(3, 12)))
        end = "ROLLBACK" if rnd.random() < 0.2 else "COMMIT"
        r = as_writer("BEGIN; INSERT INTO embed_docs (id, body) VALUES (%d, '%s') "
                      "ON CONFLICT (id) DO UPDATE SET body = excluded.body; %s" % (key, text, end))
        with lock:
            if r.rc != 0:
                errors.append(r)
            elif end == "COMMIT":
                committed.append(key)


start = time.monotonic()
threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
for th in threads:
    th.start()
for th in threads:
    th.join()
c.check("%d writers x %d transactions ran without error" % (WRITERS, TRANSACTIONS), not errors,
        repr(errors[:2]))
c.check("the jobs drain", drained(600), "%d open" % open_jobs())
print("%d committed writes to %d rows; drained %.1f s after the writers started"
      % (len(committed), len(set(committed)), time.monotonic() - start))
counts = value("SELECT count(*) FILTER (WHERE status = 'done' AND superseded_by IS NULL), "
               "count(*) FILTER (WHERE superseded_by IS NOT NULL), count(*) FILTER (WHERE status = 'failed'), "
               "count(*) FROM cai.jobs WHERE kind = 'embed' AND row_key::bigint >= 1000")
embedded, superseded, failed, jobs = (int(x) for x in counts.split("|"))
print("embed jobs: %d queued, %d embedded, %d superseded, %d failed" % (jobs, embedded, superseded, failed))
c.check("one job per committed write, none failed, each embedded or superseded",
        jobs == len(committed) and failed == 0 and embedded + superseded == jobs, counts)
lost = stale_rows()
c.check("0 lost: every row's embedding is cai_embed of its final text", lost.rc == 0 and lost.out == "0",
        repr(lost))
rows = as_writer("SELECT count(*), count(*) FILTER (WHERE embedding IS NULL) FROM embed_docs WHERE id >= 1000")
c.check("0 duplicated: each written row is one row with one embedding",
        rows.rc == 0 and rows.out == "%d|0" % len(set(committed)), repr(rows))

value("DROP TABLE embed_docs; DELETE FROM cai.jobs WHERE kind = 'embed'; "
      "REVOKE CREATE ON SCHEMA public FROM %s" % WRITER)
c.done()
