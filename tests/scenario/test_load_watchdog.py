"""A load that makes no progress is failed by the hang watchdog, a slow one that works is not.

The engine process loads the CUDA backend library named by CAI_CUDA_LIBRARY (an absolute path)
while it starts.  Here that library is a small shared object whose constructor stands for a
device that never answers: it sleeps, so the load uses no CPU time and reads nothing.  With
pg_cai.engine_hang_timeout at 2 s the worker kills the loading engine, a call gets a clear error
naming the stall (instead of waiting for ever), the log says why, and the load is retried with
the crash backoff (engine_starts grows).  A second library's constructor computes for twice
the timeout instead: that load makes progress, is not killed, and the engine serves."""
import os
import shutil
import subprocess
import tempfile
import time

from pgtest import Checks, Cluster, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.environ.get("PG_CAI_TEST_MODEL") or os.path.join(
    ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

STALL_SOURCE = r"""
#include <unistd.h>

__attribute__((constructor)) static void
never_answers(void)
{
	for (;;)
		sleep(3600);
}
"""

# 4 s of its own CPU time (twice the timeout), however busy the machine is
SLOW_SOURCE = r"""
#include <time.h>

__attribute__((constructor)) static void
answers_slowly(void)
{
	struct timespec start, now;
	volatile unsigned long spin = 0;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
	do
	{
		for (int i = 0; i < 1000000; i++)
			spin++;
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
	} while (now.tv_sec - start.tv_sec < 4);
}
"""

c = Checks()
work = tempfile.mkdtemp(prefix="pg_cai_load_watchdog.")
os.chmod(work, 0o755)
libs = {}
for name, source in (("stall", STALL_SOURCE), ("slow", SLOW_SOURCE)):
    src = os.path.join(work, name + ".c")
    with open(src, "w") as f:
        f.write(source)
    libs[name] = os.path.join(work, name + ".so")
    r = subprocess.run(["cc", "-O0", "-shared", "-fPIC", "-o", libs[name], src],
                       capture_output=True, text=True)
    c.check("the %s library is compiled" % name, r.returncode == 0, r.stderr)

cluster = Cluster({"shared_preload_libraries": "'pg_cai'", "pg_cai.model": "'%s'" % MODEL,
                   "pg_cai.device": "'auto'", "pg_cai.threads": "1",
                   "pg_cai.weights_cache": "''", "pg_cai.engine_hang_timeout": "'2s'"})


def start_with(library):
    os.environ["CAI_CUDA_LIBRARY"] = library
    try:
        ok = cluster.start()
    finally:
        os.environ.pop("CAI_CUDA_LIBRARY", None)
    if ok:
        cluster.psql("CREATE EXTENSION IF NOT EXISTS pg_cai")
    return ok


def log():
    with open(cluster.log, errors="replace") as f:
        return f.read()


def stat(column):
    return cluster.psql("SELECT %s FROM pg_stat_cai" % column).out


try:
    # ---- a load that stalls: killed, the call errs, the load is retried ----------------------
    c.check("the server starts", start_with(libs["stall"]), cluster.log)
    started = time.monotonic()
    r = cluster.psql("SET statement_timeout = '90s';\n"
                     "SELECT cai_complete('The capital of France is', '{\"max_tokens\": 4}')")
    took = time.monotonic() - started
    print("a call to the stalled load ended after %.1f s: %s" % (took, r.err.splitlines()[:1]),
          flush=True)
    c.check("a call gets an error naming the stalled load, not a statement timeout",
            r.rc != 0 and "made no progress loading the model" in r.err
            and "statement timeout" not in r.err, repr(r))
    c.check("the log says the loading engine was killed for making no progress",
            "made no progress loading the model" in log() and "killing it" in log(), log()[-2000:])
    retried = wait_for(lambda: int(stat("engine_starts") or 0) >= 3, 60, 0.5)
    c.check("the load is retried with the crash backoff (3 engine starts)", retried,
            "engine_starts %s; %s" % (stat("engine_starts"), log()[-1500:]))
    status = stat("status")
    c.check("pg_stat_cai says the model failed or is loading again",
            status in ("failed", "loading"), status)
    cluster.stop()

    # ---- a slow load that works: never killed ------------------------------------------------
    mark = len(log())
    c.check("the server starts again", start_with(libs["slow"]), cluster.log)
    ready = wait_for(lambda: stat("status") == "ready", 180, 0.2)
    c.check("a load that computes for longer than the timeout is not killed and serves",
            ready and "made no progress" not in log()[mark:], log()[mark:][-2000:])
    r = cluster.psql("SELECT length(cai_complete('The capital of France is', "
                     "'{\"max_tokens\": 4, \"temperature\": 0}')) > 0")
    c.check("the slowly loaded engine answers", r.rc == 0 and r.out == "t", repr(r))
finally:
    os.environ.pop("CAI_CUDA_LIBRARY", None)
    cluster.stop()
    if c.failed == 0:
        cluster.remove()
        shutil.rmtree(work, ignore_errors=True)
    else:
        print("kept %s and %s" % (cluster.dir, work))
c.done()
