"""A hung engine process (SIGSTOP) is noticed: with pg_cai.engine_hang_timeout at 3 s, pg_stat_cai
says 'unresponsive' while the engine is silent and before it is killed, the generation in flight
fails with SQLSTATE 58000 saying the engine stopped responding, a call made while it is
unresponsive waits for the new engine and succeeds, the engine is killed (SIGKILL) and replaced,
a later call succeeds, an idle session keeps its backend, and the server log says what happened.
The times it took are printed, not checked: stop -> error, error -> ready again."""
import os
import signal
import threading
import time

from pgtest import Checks, ensure_database, log_text, psql, stat, value, wait_for
from pqlib import Conn, PqError

HANG_TIMEOUT = "3s"
c = Checks()
ensure_database()


def alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def set_hang_timeout(setting):
    value("ALTER SYSTEM %s" % setting, db="postgres")
    value("SELECT pg_reload_conf()", db="postgres")
    # the worker reads the file on its own time after the signal; give it a moment
    time.sleep(1.0)


wait_for(lambda: stat("status") == "ready", 60, 0.1)
set_hang_timeout("SET pg_cai.engine_hang_timeout = '%s'" % HANG_TIMEOUT)
engine_pid = int(stat("engine_pid"))
stopped = False
try:
    c.check("the setting is in force", value("SHOW pg_cai.engine_hang_timeout") == HANG_TIMEOUT,
            value("SHOW pg_cai.engine_hang_timeout"))
    idle = Conn("cai_scenario", "cai_hang_idle")
    idle_pid = idle.value("SELECT pg_backend_pid()")
    log_before = len(log_text())

    # a long generation in flight
    result = {}
    done_at = {}

    def generate():
        conn = Conn("cai_scenario", "cai_hang_victim")
        try:
            conn.exec("SET statement_timeout = '60s'")    # bounds the test if nothing else does
            conn.exec("SELECT cai_chat(cai_new_conversation(), 'Count from one to a thousand "
                      "in words.', '{\"max_tokens\": 2000, \"ignore_eos\": true}')")
            result["outcome"] = ("ok", None, "")
        except PqError as e:
            result["outcome"] = ("error", e.sqlstate, str(e))
        finally:
            done_at["t"] = time.monotonic()
            conn.close()

    victim = threading.Thread(target=generate)
    victim.start()
    running = wait_for(lambda: stat("running") == "1", 60, 0.05)
    c.check("the generation runs", running is not None, stat("running"))
    time.sleep(0.3)

    monitor = Conn("cai_scenario", "cai_hang_monitor")
    stopped_at = time.monotonic()
    os.kill(engine_pid, signal.SIGSTOP)
    stopped = True

    # watch pg_stat_cai until the engine is replaced; while unresponsive, start a call
    seen = []                   # (seconds after the stop, status, engine_pid)
    late = {}

    def tokenize_later():
        conn = Conn("cai_scenario", "cai_hang_late")
        try:
            conn.exec("SET statement_timeout = '60s'")
            late["outcome"] = ("ok", conn.value("SELECT array_length(cai_tokenize('hello world'), 1)"))
        except PqError as e:
            late["outcome"] = ("error", str(e))
        finally:
            conn.close()

    late_thread = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, pid = monitor.exec("SELECT status, engine_pid FROM pg_stat_cai")[0]
        seen.append((time.monotonic() - stopped_at, status, pid))
        if status == "unresponsive" and late_thread is None:
            late_thread = threading.Thread(target=tokenize_later)
            late_thread.start()
        if pid is not None and int(pid) != engine_pid and status == "ready":
            break
        time.sleep(0.05)
    ready_at = time.monotonic()
    victim.join(90)
    if late_thread is not None:
        late_thread.join(90)

    unresponsive = [s for s in seen if s[1] == "unresponsive"]
    c.check("pg_stat_cai says 'unresponsive' while the stopped engine is still there",
            unresponsive and all(s[2] is not None and int(s[2]) == engine_pid for s in unresponsive),
            repr(seen[:3] + seen[-3:]))
    killed = wait_for(lambda: not alive(engine_pid), 10, 0.05) is not None
    c.check("the stopped engine is killed", killed, "")
    stopped = not killed
    outcome = result.get("outcome")
    c.check("the generation in flight fails with SQLSTATE 58000",
            outcome is not None and outcome[0] == "error" and outcome[1] == "58000", repr(outcome))
    c.check("its error says the engine stopped responding, names the timeout and the kill",
            outcome is not None and "engine process stopped responding" in outcome[2] and
            "pg_cai.engine_hang_timeout" in outcome[2] and "signal 9" in outcome[2],
            repr(outcome))
    c.check("a call made while the engine was unresponsive waits for the new engine and succeeds",
            late.get("outcome", ("none",))[0] == "ok", repr(late.get("outcome")))
    c.check("a new engine serves", stat("status") == "ready" and int(stat("engine_pid")) != engine_pid,
            stat("status"))
    r = psql("SELECT length(cai_chat(cai_new_conversation(), 'Hi', '{\"max_tokens\": 3}')) >= 0",
             env={"PGOPTIONS": "-c statement_timeout=60s"})
    c.check("a later call succeeds", r.rc == 0 and r.out == "t", repr(r))
    c.check("the last exit says SIGKILL",
            stat("engine_last_exit").startswith("terminated by signal 9"), stat("engine_last_exit"))
    try:
        same = idle.value("SELECT pg_backend_pid()") == idle_pid
    except PqError as e:
        same = False
    idle.close()
    monitor.close()
    c.check("the idle session keeps its backend", same, "")
    new_log = log_text()[log_before:]
    c.check("the server log says the engine was unresponsive, then killed for it",
            ("pg_cai engine process %d is unresponsive" % engine_pid) in new_log and
            ("pg_cai engine process %d stopped responding" % engine_pid) in new_log and
            ("pg_cai engine process %d terminated by signal 9: Killed after it stopped responding"
             % engine_pid) in new_log, new_log[-800:])
    c.check("no session was dropped (no crash recovery in the log)",
            "terminating any other active server processes" not in new_log, "")

    first_unresponsive = unresponsive[0][0] if unresponsive else float("nan")
    error_s = done_at.get("t", float("nan")) - stopped_at
    print("timings (hang timeout %s): stop -> 'unresponsive' seen %.0f ms, stop -> error %.0f ms, "
          "error -> new engine ready %.0f ms" % (HANG_TIMEOUT, first_unresponsive * 1000,
                                                 error_s * 1000,
                                                 (ready_at - done_at.get("t", float("nan"))) * 1000))
finally:
    if stopped:
        try:
            os.kill(engine_pid, signal.SIGCONT)
        except OSError:
            pass
    set_hang_timeout("RESET pg_cai.engine_hang_timeout")
    wait_for(lambda: stat("status") == "ready", 60, 0.1)
c.done()
