"""Restarts after engine crashes: while a new engine loads the model after a crash, pg_stat_cai says
'restarting' (not 'loading', never 'failed'), and a call made meanwhile waits and succeeds; an
engine killed while it loads the model (after one with the same settings has served) is restarted
like another instead of leaving the worker without a model; and once an engine has served for the
stable period (10 s), the next crash is crash 1 again and the engine restarts at once."""
import os
import re
import signal
import threading
import time

from pgtest import Checks, ensure_database, log_text, value, wait_for
from pqlib import Conn, PqError

STABLE_PERIOD_S = 10
c = Checks()
ensure_database()


monitor = Conn("cai_scenario", "cai_restart_monitor")


def status_and_pid():
    status, pid = monitor.exec("SELECT status, engine_pid FROM pg_stat_cai")[0]
    return status, (int(pid) if pid is not None else None)


def call_in_background():
    """Starts a cai_tokenize call in a thread; returns (thread, holder)."""
    holder = {}

    def run():
        conn = Conn("cai_scenario", "cai_restart_caller")
        try:
            holder["outcome"] = ("ok", conn.value("SELECT array_length(cai_tokenize('hello'), 1)"))
        except PqError as e:
            holder["outcome"] = ("error", str(e))
        finally:
            conn.close()

    t = threading.Thread(target=run)
    t.start()
    return t, holder


def noticed(old_pid):
    """Waits until the worker has seen old_pid die (a call made before that may still be relayed
    to the dying engine, and fails with it); returns the statuses seen."""
    seen = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, pid = status_and_pid()
        seen.append(status)
        if status != "ready" or pid != old_pid:
            break
        time.sleep(0.005)
    return seen


def watch_until_ready(old_pid, on_new_pid=None, timeout=60):
    """Polls pg_stat_cai until an engine other than old_pid is ready; returns the statuses seen.
    on_new_pid(pid, status) is called once, when a new engine pid first shows."""
    seen = []
    called = False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, pid = status_and_pid()
        seen.append(status)
        if pid is not None and pid != old_pid and not called and on_new_pid is not None:
            called = True
            on_new_pid(pid, status)
        if pid is not None and pid != old_pid and status == "ready":
            break
        time.sleep(0.01)
    return seen


wait_for(lambda: status_and_pid()[0] == "ready", 60, 0.1)
# the engine serving now has been up for a while in most runs; make sure the backoff is clear
time.sleep(STABLE_PERIOD_S + 1)

# ---- 1. a crash, a call while the new engine loads ----------------------------------------------
first = status_and_pid()[1]
log_before = len(log_text())
os.kill(first, signal.SIGKILL)
seen = noticed(first)
caller, outcome = call_in_background()
seen += watch_until_ready(first)
caller.join(60)
c.check("after a crash pg_stat_cai says 'restarting' until the new engine is ready",
        "restarting" in seen and "loading" not in seen and "failed" not in seen, repr(sorted(set(seen))))
c.check("a call made while the engine restarts waits and succeeds",
        outcome.get("outcome", ("none",))[0] == "ok", repr(outcome.get("outcome")))
c.check("the log says crash 1, restarting at once",
        ("pg_cai engine process %d terminated by signal 9" % first) in log_text()[log_before:] and
        "The engine restarts in 0 ms (crash 1 in a row)" in log_text()[log_before:],
        log_text()[log_before:][-600:])

# ---- 2. an engine killed while it loads the model ------------------------------------------------
second = status_and_pid()[1]
killed_loading = {}


def kill_young(pid, status):
    killed_loading["status"] = status
    killed_loading["pid"] = pid
    os.kill(pid, signal.SIGKILL)


log_before = len(log_text())
os.kill(second, signal.SIGKILL)
seen = noticed(second)
caller, outcome = call_in_background()
seen += watch_until_ready(second, kill_young)
caller.join(60)
print("the young engine was killed in state %r" % killed_loading.get("status"))
c.check("an engine killed young was caught before it was ready",
        killed_loading.get("status") in ("restarting", "loading"), repr(killed_loading))
c.check("a crash while loading a model that loaded before is a restart: never 'failed'",
        "failed" not in seen and "restarting" in seen, repr(sorted(set(seen))))
c.check("a call made meanwhile waits for the engine and succeeds",
        outcome.get("outcome", ("none",))[0] == "ok", repr(outcome.get("outcome")))
c.check("the log counts the crashes in a row",
        "(crash 2 in a row)" in log_text()[log_before:] and
        "(crash 3 in a row)" in log_text()[log_before:], log_text()[log_before:][-800:])

# ---- 3. the backoff starts over once an engine has served for the stable period ----------------
time.sleep(STABLE_PERIOD_S + 1)
third = status_and_pid()[1]
log_before = len(log_text())
os.kill(third, signal.SIGKILL)
seen = watch_until_ready(third)
crash_line = re.search(r"The engine restarts in (\d+) ms \(crash (\d+) in a row\)",
                       log_text()[log_before:])
c.check("after a stable period the next crash is crash 1 again and restarts at once",
        crash_line is not None and crash_line.group(1) == "0" and crash_line.group(2) == "1",
        crash_line.group(0) if crash_line else log_text()[log_before:][-600:])
c.check("the engine serves again", seen and seen[-1] == "ready", repr(seen[-3:]))
monitor.close()
c.done()
