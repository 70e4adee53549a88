"""Admission control: with one running and one waiting request allowed, a third request is
refused at once with SQLSTATE 53400 and a hint, and the server keeps serving; with
pg_cai.max_queue_wait, a request whose estimated wait is too long is refused at once too."""
import os
import time

from pgtest import Checks, Cluster, in_background, wait_for

c = Checks()
model = os.environ.get("PG_CAI_TEST_MODEL")
cluster = Cluster({"shared_preload_libraries": "'pg_cai'", "pg_cai.model": "'%s'" % model,
                   "pg_cai.threads": "2", "pg_cai.max_batch": "1", "pg_cai.max_queue": "1",
                   "pg_cai.context_length": "1024"})
long_call = "SELECT cai_complete('Count to a thousand: 1, 2, 3,', '{\"max_tokens\": 900, \"ignore_eos\": true}')"
threads = []
try:
    c.check("a cluster with max_batch 1 and max_queue 1 starts", cluster.start(), cluster.log)
    c.check("its worker loads the model", cluster.wait_log("pg_cai engine worker ready", 120) is not None,
            cluster.log)
    cluster.psql("CREATE EXTENSION pg_cai")

    env = cluster.env()
    for i in range(2):
        threads.append(in_background(long_call, db="postgres", app="cai_queue_%d" % i, env=env))
    busy = wait_for(lambda: cluster.psql("SELECT running = 1 AND waiting = 1 FROM pg_stat_cai").out == "t", 30)
    c.check("one request runs and one waits", busy is not None,
            cluster.psql("SELECT running, waiting FROM pg_stat_cai").out)

    r = cluster.psql("\\set VERBOSITY verbose\nSELECT cai_complete('Hello', '{\"max_tokens\": 2}')")
    print("the refused call returned after %.0f ms" % r.ms)
    c.check("a third request is refused with SQLSTATE 53400",
            r.rc != 0 and "53400" in r.err and "queue is full" in r.err, repr(r))
    c.check("the refusal says what to do", "pg_cai.max_queue" in r.err, repr(r))
    c.check("the refusal is immediate", r.ms < 2000, "%.0f ms" % r.ms)
    # the worker publishes its counters every 100 ms while busy
    counted = wait_for(lambda: cluster.psql("SELECT requests_rejected FROM pg_stat_cai").out == "1", 5)
    c.check("pg_stat_cai counts the rejection", counted is not None,
            cluster.psql("SELECT requests_rejected FROM pg_stat_cai").out)

    cluster.psql("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'cai_queue_%'")
    for t, _ in threads:
        t.join(60)
    r = cluster.psql("SELECT length(cai_complete('Hello', '{\"max_tokens\": 2, \"ignore_eos\": true}')) > 0")
    c.check("once the queue drains, calls are served", r.rc == 0 and r.out == "t", repr(r))

    # early rejection: with pg_cai.max_queue_wait below one request's service time, a request
    # that would have to wait behind a running one is refused at once (a reload applies it)
    cluster.psql("ALTER SYSTEM SET pg_cai.max_queue_wait = '1ms'")
    cluster.psql("SELECT pg_reload_conf()")
    time.sleep(1)
    threads.append(in_background(long_call, db="postgres", app="cai_queue_wait", env=env))
    running = wait_for(lambda: cluster.psql("SELECT running FROM pg_stat_cai").out == "1", 30)
    r = cluster.psql("\\set VERBOSITY verbose\nSELECT cai_complete('Hello', '{\"max_tokens\": 2}')")
    c.check("with pg_cai.max_queue_wait, a request that would wait too long is refused at once",
            running is not None and r.rc != 0 and "53400" in r.err and r.ms < 2000, repr(r))
    cluster.psql("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'cai_queue_wait'")
finally:
    cluster.stop()
    for t, _ in threads:
        t.join(60)
    if c.failed == 0:
        cluster.remove()
    else:
        print("kept %s" % cluster.dir)
c.done()
