"""cai_embed through the worker from many sessions at once: every session's vectors are the ones
a lone session gets (the engine batches texts of different sessions together and a vector does
not depend on its batch); a call cancelled by statement_timeout mid-way leaves the engine
serving; and, where pgvector is installed, cai_embed(t)::vector casts and orders by distance
(skipped, saying so, where it is not)."""
import threading

from pgtest import Checks, ensure_database, in_background, psql, value

TEXTS = ["a cat sat on the mat", "PostgreSQL stores rows in pages", "bananas are yellow",
         "the engine batches requests", "x", "a longer text about databases, indexes and vectors"]
ARRAY = "ARRAY[%s]" % ", ".join("'%s'" % t.replace("'", "''") for t in TEXTS)

ensure_database()
c = Checks()

baseline = [value("SELECT cai_embed('%s')::text" % t.replace("'", "''")) for t in TEXTS]
c.check("one vector per text, alone", len(baseline) == len(TEXTS) and all(baseline), "")

# eight sessions, each embedding the texts (rotated, so that every step mixes texts) three times
results = {}
lock = threading.Lock()
jobs = []
for s in range(8):
    rot = TEXTS[s % len(TEXTS):] + TEXTS[:s % len(TEXTS)]
    arr = "ARRAY[%s]" % ", ".join("'%s'" % t.replace("'", "''") for t in rot)
    sql = "\n".join("SELECT ordinality || '|' || embedding::text FROM cai_embed(%s) "
                    "ORDER BY ordinality;" % arr for _ in range(3))
    jobs.append((s, rot, in_background(sql, app="cai_embed_%d" % s)))
ok = True
why = ""
for s, rot, (thread, holder) in jobs:
    thread.join(300)
    r = holder[0]
    if r is None or r.rc != 0:
        ok, why = False, "session %d: %r" % (s, r)
        continue
    rows = r.out.splitlines()
    if len(rows) != 3 * len(rot):
        ok, why = False, "session %d: %d rows" % (s, len(rows))
        continue
    for k, row in enumerate(rows):
        n, vec = row.split("|", 1)
        if int(n) != k % len(rot) + 1 or vec != baseline[TEXTS.index(rot[k % len(rot)])]:
            ok, why = False, "session %d row %d differs" % (s, k)
c.check("8 concurrent sessions get, in order, the vectors a lone session gets", ok, why)

# a large call cut by statement_timeout: the engine drops its texts and keeps serving
r = psql("SET statement_timeout = '300ms';\n"
         "SELECT count(*) FROM cai_embed(ARRAY(SELECT 'text ' || i || ' ' || repeat('word ', 60) "
         "FROM generate_series(1, 1000) i));")
c.check("a cancelled cai_embed fails with the timeout", r.rc != 0 and "statement timeout" in r.err,
        repr(r))
c.check("the engine serves the next call, with the same vector",
        value("SELECT cai_embed('%s')::text" % TEXTS[0]) == baseline[0], "")

r = psql("CREATE EXTENSION IF NOT EXISTS vector;")
if r.rc != 0:
    print("SKIP pgvector is not installed here: the ::vector cast is not tested (%s)"
          % r.err.splitlines()[-1][:120])
else:
    r = psql("SELECT vector_dims(cai_embed('hello')::vector);\n"
             "WITH d(t) AS (SELECT unnest(%s)) "
             "SELECT t FROM d ORDER BY cai_embed(t)::vector <=> cai_embed('a cat sat on a mat')::vector "
             "LIMIT 1;" % ARRAY)
    lines = r.out.splitlines()
    c.check("cai_embed(t)::vector casts, and orders by cosine distance",
            r.rc == 0 and lines[0].isdigit() and int(lines[0]) > 0 and lines[1] == TEXTS[0],
            repr(r))
c.done()
