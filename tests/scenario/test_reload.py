"""A configuration reload swaps the model without restarting PostgreSQL: after ALTER SYSTEM SET
pg_cai.model and pg_reload_conf(), the worker starts a new engine process with the new model once
the request in flight has finished (it is not cut), and cai_model_info() shows the new model;
sessions and the worker stay.  A reload with a short pg_cai.reload_grace fails a request still
running with a retryable error; a model that cannot be loaded leaves the worker failed with the
reason until the next reload fixes it."""
import os
import subprocess
import threading
import time

from pgtest import Checks, ensure_database, psql, stat, value, wait_for
from pqlib import Conn, PqError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SYNTH = os.path.join(ROOT, "tests", "synth", "write_synth_model")
SYNTH_NAME = "pg_cai reload test"
c = Checks()
ensure_database()


def model_name():
    r = psql("SELECT coalesce(cai_model_info()->>'name', cai_model_info()->>'status')")
    return r.out if r.rc == 0 else None


def reload_conf(*settings):
    """ALTER SYSTEM for each (name, value) (value None: RESET), then pg_reload_conf()."""
    for name, v in settings:
        if v is None:
            value("ALTER SYSTEM RESET %s" % name, db="postgres")
        else:
            value("ALTER SYSTEM SET %s = '%s'" % (name, v), db="postgres")
    value("SELECT pg_reload_conf()", db="postgres")


def in_thread(sql, app):
    """Runs sql on a connection of its own in a thread; holder[0] gets ('ok', value) or
    ('error', sqlstate, message)."""
    holder = [None]

    def run():
        conn = Conn("cai_scenario", app)
        try:
            holder[0] = ("ok", conn.value(sql))
        except PqError as e:
            holder[0] = ("error", e.sqlstate, str(e))
        finally:
            conn.close()
    t = threading.Thread(target=run)
    t.start()
    return t, holder


real_name = model_name()
synth_path = os.path.join(os.environ.get("PG_CAI_TEST_DIR", "/tmp"), "reload_test.gguf")
r = subprocess.run([SYNTH, synth_path, SYNTH_NAME, "5"], capture_output=True, text=True)
os.chmod(synth_path, 0o644)
c.check("a second (synthetic) model is written", r.returncode == 0, r.stderr)

idle = Conn("cai_scenario", "cai_reload_idle")
idle_pid = idle.value("SELECT pg_backend_pid()")
worker_pid = stat("worker_pid")
postmaster_start = value("SELECT pg_postmaster_start_time()")
starts = int(stat("engine_starts"))
long_call = ("SELECT length(cai_complete('Count from one to a thousand in words:', "
             "'{\"max_tokens\": 200, \"ignore_eos\": true}'))")
try:
    # ---- swap to the synthetic model while a request runs --------------------------------
    t, holder = in_thread(long_call, "cai_reload_inflight")
    wait_for(lambda: stat("running") == "1", 30, 0.05)
    reload_conf(("pg_cai.model", synth_path))
    swapped = wait_for(lambda: model_name() == SYNTH_NAME, 120, 0.1)
    t.join(120)
    c.check("cai_model_info() shows the new model after the reload", swapped is not None, model_name())
    c.check("the request in flight during the reload finished normally",
            holder[0] is not None and holder[0][0] == "ok" and holder[0][1] != "0", repr(holder[0]))
    r = psql("SELECT cai_complete('Hello', '{\"max_tokens\": 4, \"ignore_eos\": true}') IS NOT NULL, "
             "array_length(cai_tokenize('hello'), 1) > 0")
    c.check("the new model serves", r.rc == 0 and r.out == "t|t", repr(r))
    c.check("the worker stayed, one more engine process started",
            stat("worker_pid") == worker_pid and int(stat("engine_starts")) == starts + 1,
            "%s %s" % (stat("worker_pid"), stat("engine_starts")))
    try:
        same = idle.value("SELECT pg_backend_pid()") == idle_pid
    except PqError:
        same = False
    c.check("sessions stay connected through the swap", same, "")
    c.check("PostgreSQL did not restart", value("SELECT pg_postmaster_start_time()") == postmaster_start, "")

    # ---- back to the real model ------------------------------------------------------------
    reload_conf(("pg_cai.model", None))
    back = wait_for(lambda: model_name() == real_name, 120, 0.1)
    c.check("a reload brings the first model back", back is not None, model_name())

    # ---- a short grace cuts a long request with a retryable error ------------------------
    reload_conf(("pg_cai.reload_grace", "300ms"))
    t, holder = in_thread(long_call.replace("200", "1000"), "cai_reload_cut")
    wait_for(lambda: stat("running") == "1", 30, 0.05)
    starts = int(stat("engine_starts"))
    reload_conf(("pg_cai.host_cache_size", "32MB"))
    t.join(120)
    c.check("a request still running after pg_cai.reload_grace fails with SQLSTATE 55000",
            holder[0] is not None and holder[0][0] == "error" and holder[0][1] == "55000" and
            "restarted before this request finished" in holder[0][2], repr(holder[0]))
    ready = wait_for(lambda: stat("status") == "ready" and int(stat("engine_starts")) == starts + 1, 60, 0.1)
    c.check("the engine restarted with the new cache size",
            ready is not None and stat("cache_budget_bytes") == str(32 * 1024 * 1024),
            stat("status || ' ' || cache_budget_bytes"))

    # ---- the numerics settings reach the engine: it reloads with them, serves, and back -------
    # (activation_precision by its old name 'int8x2', still accepted: reported as 'two_digit')
    for setting, info_key, set_to, on, default, what in (
            ("pg_cai.weight_rounding", "weight_rounding", "gptq", "gptq", "nearest",
             "its weights rounded along the calibration inputs"),
            ("pg_cai.activation_precision", "activation_precision", "int8x2", "two_digit", "int8",
             "two-digit GEMM inputs"),
            ("pg_cai.weights", "weights", "file", "file", "int8",
             "the file's own Q4_1 weights, not converted")):
        reload_conf((setting, set_to))
        reloaded = wait_for(lambda: stat("status") == "ready" and
                            value("SELECT cai_model_info()->>'%s'" % info_key) == on, 120, 0.1)
        r = psql("SELECT cai_complete('Hello', '{\"max_tokens\": 4, \"ignore_eos\": true}') IS NOT NULL")
        c.check("%s = %s: the engine reloads with %s, reported as %s" % (setting, set_to, what, on),
                reloaded is not None and r.rc == 0 and r.out == "t", repr(r))
        reload_conf((setting, None))
        back = wait_for(lambda: stat("status") == "ready" and
                        value("SELECT cai_model_info()->>'%s'" % info_key) == default, 120, 0.1)
        c.check("and back to %s" % default, back is not None, "")

    # ---- int8_256: on the file's own weights the engine takes it (it changes only K-quants) ----
    reload_conf(("pg_cai.weights", "file"), ("pg_cai.activation_precision", "int8_256"))
    taken = wait_for(lambda: stat("status") == "ready" and
                     value("SELECT cai_model_info()->>'weights' || ' ' || "
                           "(cai_model_info()->>'activation_precision')") == "file int8_256", 120, 0.1)
    r = psql("SELECT cai_complete('Hello', '{\"max_tokens\": 4, \"ignore_eos\": true}') IS NOT NULL")
    c.check("pg_cai.activation_precision = int8_256 with the file's weights: the engine reloads, "
            "reports it and serves", taken is not None and r.rc == 0 and r.out == "t", repr(r))
    reload_conf(("pg_cai.weights", None), ("pg_cai.activation_precision", None))
    back = wait_for(lambda: stat("status") == "ready" and
                    value("SELECT cai_model_info()->>'activation_precision'") == "int8", 120, 0.1)
    c.check("and back to int8", back is not None, "")

    # ---- auto, the defaults: on this model (under 500M weights, int8) both are the precise ones --
    reload_conf(("pg_cai.weight_rounding", "auto"), ("pg_cai.activation_precision", "auto"))
    precise = wait_for(lambda: stat("status") == "ready" and
                       value("SELECT cai_model_info()->>'weight_rounding' || ' ' || "
                             "(cai_model_info()->>'activation_precision')") == "gptq two_digit", 120, 0.1)
    r = psql("SELECT cai_complete('Hello', '{\"max_tokens\": 4, \"ignore_eos\": true}') IS NOT NULL")
    c.check("weight_rounding and activation_precision auto: GPTQ rounding and two digits on this "
            "small model, and it serves", precise is not None and r.rc == 0 and r.out == "t", repr(r))
    reload_conf(("pg_cai.weight_rounding", None), ("pg_cai.activation_precision", None))
    back = wait_for(lambda: stat("status") == "ready" and
                    value("SELECT cai_model_info()->>'weight_rounding'") == "nearest", 120, 0.1)
    c.check("and back to the configured nearest and int8", back is not None, "")

    # ---- a model that cannot be loaded, then fixed by the next reload --------------------
    reload_conf(("pg_cai.model", "/nonexistent/model.gguf"))
    failed = wait_for(lambda: stat("status") == "failed", 60, 0.1)
    r = psql("SELECT cai_complete('Hello')")
    c.check("a missing model leaves the worker failed, and calls say why",
            failed is not None and r.rc != 0 and "model is not available" in r.err and
            "/nonexistent/model.gguf" in r.err and "pg_reload_conf" in r.err, repr(r))
    reload_conf(("pg_cai.model", None))
    back = wait_for(lambda: stat("status") == "ready" and model_name() == real_name, 120, 0.1)
    c.check("the next reload with a good model serves again", back is not None, stat("status"))
finally:
    reload_conf(("pg_cai.model", None), ("pg_cai.reload_grace", None), ("pg_cai.host_cache_size", None),
                ("pg_cai.weight_rounding", None), ("pg_cai.activation_precision", None),
                ("pg_cai.weights", None))
    wait_for(lambda: stat("status") == "ready" and model_name() == real_name and
             stat("cache_budget_bytes") == str(64 * 1024 * 1024), 120, 0.2)
    idle.close()
c.check("the test leaves the configured model serving", model_name() == real_name, model_name())
c.done()
