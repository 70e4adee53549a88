"""Cancel and statement_timeout during a long generation return promptly; the worker drops the
request (its KV is freed) and keeps serving."""
import time

from pgtest import (Checks, LONG_OPTIONS, LONG_PROMPT, backend_pid, ensure_database, in_background,
                    psql, value, wait_for)

LIMIT_MS = 5000     # generous: both should take well under a second past the deadline

c = Checks()
ensure_database()
long_call = "SELECT cai_complete('%s', '%s')" % (LONG_PROMPT, LONG_OPTIONS)
abandoned_before = int(value("SELECT requests_abandoned FROM pg_stat_cai"))

# statement_timeout
r = psql("SET statement_timeout = '500ms'; " + long_call)
print("statement_timeout 500 ms: the call returned after %.0f ms" % r.ms)
c.check("statement_timeout raises its error", r.rc != 0 and "statement timeout" in r.err, repr(r))
c.check("statement_timeout returns within %d ms" % LIMIT_MS, r.ms < LIMIT_MS, "%.0f ms" % r.ms)

# pg_cancel_backend from another session
t, holder = in_background(long_call, app="cai_cancel_victim")
pid = wait_for(lambda: backend_pid("cai_cancel_victim"), 10)
time.sleep(0.5)
start = time.monotonic()
if pid:
    value("SELECT pg_cancel_backend(%d)" % pid)
t.join(60)
cancel_ms = (time.monotonic() - start) * 1000.0
r = holder[0]
print("pg_cancel_backend: the call returned %.0f ms after the cancel" % cancel_ms)
c.check("pg_cancel_backend cancels the call",
        pid is not None and r is not None and r.rc != 0 and "canceling statement due to user request" in r.err,
        repr(r))
c.check("pg_cancel_backend returns within %d ms" % LIMIT_MS, cancel_ms < LIMIT_MS, "%.0f ms" % cancel_ms)

# pg_terminate_backend of the client
t, holder = in_background(long_call, app="cai_terminate_victim")
pid = wait_for(lambda: backend_pid("cai_terminate_victim"), 10)
time.sleep(0.5)
if pid:
    value("SELECT pg_terminate_backend(%d)" % pid)
t.join(60)
c.check("a terminated client's call ends", holder[0] is not None and holder[0].rc != 0, repr(holder[0]))

# the worker dropped all three and serves others
idle = wait_for(lambda: value("SELECT running + waiting FROM pg_stat_cai") == "0", 5)
c.check("the worker dropped the abandoned sequences", idle is not None,
        value("SELECT running, waiting FROM pg_stat_cai"))
abandoned = int(value("SELECT requests_abandoned FROM pg_stat_cai"))
c.check("pg_stat_cai counts the abandoned requests", abandoned - abandoned_before >= 3,
        "%d -> %d" % (abandoned_before, abandoned))
r = psql("SELECT length(cai_complete('The capital of France is', '{\"max_tokens\": 4, \"ignore_eos\": true}')) > 0")
c.check("the worker keeps serving", r.rc == 0 and r.out == "t", repr(r))
c.done()
