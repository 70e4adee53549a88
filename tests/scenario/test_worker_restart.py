"""The engine worker dies mid-request: the waiting backend errors out instead of hanging, the
worker comes back, and the next call works.  SIGTERM ends only the worker; SIGKILL makes
PostgreSQL restart every backend (crash recovery), after which the worker comes back too."""
import os
import signal
import time

from pgtest import (Checks, LONG_OPTIONS, LONG_PROMPT, backend_pid, ensure_database, in_background,
                    psql, value, wait_for, worker_pid, worker_ready)

c = Checks()
ensure_database()
long_call = "SELECT cai_complete('%s', '%s')" % (LONG_PROMPT, LONG_OPTIONS)
short_call = "SELECT length(cai_complete('Hello', '{\"max_tokens\": 4, \"ignore_eos\": true}')) > 0"


def kill_worker_mid_request(sig, app):
    """Starts a long call, kills the worker with sig while it runs; returns (result, ms, old pid)."""
    old = worker_pid()
    t, holder = in_background(long_call, app=app, timeout=120)
    wait_for(lambda: backend_pid(app), 10)
    wait_for(lambda: value("SELECT running FROM pg_stat_cai") == "1", 10)
    time.sleep(0.3)
    start = time.monotonic()
    os.kill(old, sig)
    t.join(120)
    return holder[0], (time.monotonic() - start) * 1000.0, old


# SIGTERM: the worker exits; its queue detaches
r, ms, old = kill_worker_mid_request(signal.SIGTERM, "cai_sigterm_victim")
print("SIGTERM: the waiting call failed %.0f ms after the signal" % ms)
c.check("SIGTERM: the waiting call fails with a clear error",
        r is not None and r.rc != 0 and "engine worker terminated while processing the request" in r.err,
        repr(r))
c.check("SIGTERM: the call returns within 5 s", ms < 5000, "%.0f ms" % ms)
back = wait_for(lambda: worker_ready() and worker_pid() != old, 60, 0.2)
c.check("SIGTERM: the worker comes back", back is not None, value("SELECT worker_pid, status FROM pg_stat_cai"))
r = psql(short_call)
c.check("SIGTERM: the next call works", r.rc == 0 and r.out == "t", repr(r))

# a call made while the worker is down waits for the next worker
old = worker_pid()
os.kill(old, signal.SIGTERM)
r = psql(short_call, timeout=120)
c.check("a call made while the worker restarts is served by the new worker",
        r.rc == 0 and r.out == "t", repr(r))

# SIGKILL: PostgreSQL restarts all backends
r, ms, old = kill_worker_mid_request(signal.SIGKILL, "cai_sigkill_victim")
print("SIGKILL: the waiting call ended %.0f ms after the signal" % ms)
c.check("SIGKILL: the waiting call ends with an error, not a hang",
        r is not None and r.rc != 0 and r.rc != -1, repr(r))
c.check("SIGKILL: the call returns within 10 s", ms < 10000, "%.0f ms" % ms)
back = wait_for(lambda: worker_ready() and worker_pid() != old, 120, 0.5)
c.check("SIGKILL: the server recovers and the worker comes back", back is not None, "")
r = psql(short_call)
c.check("SIGKILL: the next call works", r.rc == 0 and r.out == "t", repr(r))
c.done()
