"""Without a usable model the worker stays up, says why in the log, and every call fails with
that reason and a hint; without shared_preload_libraries calls say how to load pg_cai."""
from pgtest import Checks, Cluster, wait_for

c = Checks()
missing = "/nonexistent/pg_cai/missing-model.gguf"
cluster = Cluster({"shared_preload_libraries": "'pg_cai'", "pg_cai.model": "'%s'" % missing})
try:
    c.check("a cluster with a missing model starts", cluster.start(), cluster.log)
    c.check("the worker logs why it has no model",
            cluster.wait_log('pg_cai engine worker has no model: could not load model "%s"' % missing)
            is not None, cluster.log)
    cluster.psql("CREATE EXTENSION pg_cai")

    r = cluster.psql("SELECT cai_complete('Hello')")
    c.check("a call fails with the reason",
            r.rc != 0 and ('pg_cai model is not available: could not load model "%s"' % missing) in r.err,
            repr(r))
    c.check("the error carries a hint", "HINT:" in r.err and "pg_cai.model" in r.err, repr(r))
    r = cluster.psql("SELECT cai_chat(cai_new_conversation(), 'Hello')")
    c.check("cai_chat fails the same way", r.rc != 0 and "pg_cai model is not available" in r.err, repr(r))
    r = cluster.psql("SELECT count(*) FROM cai.messages")
    c.check("the failed cai_chat stored nothing", r.rc == 0 and r.out == "0", repr(r))
    r = cluster.psql("SELECT cai_model_info()->>'status', cai_model_info()->>'reason' LIKE 'could not load model%'")
    c.check("cai_model_info reports the failure", r.rc == 0 and r.out == "failed|t", repr(r))
    r = cluster.psql("SELECT status, worker_pid IS NOT NULL FROM pg_stat_cai")
    c.check("the worker stays up without a model", r.rc == 0 and r.out == "failed|t", repr(r))

    cluster.stop()
    cluster.configure({"shared_preload_libraries": "'pg_cai'", "pg_cai.model": "''",
                       "pg_cai.job_databases": "'postgres'", "pg_cai.job_workers": "1"})
    cluster.start()
    wait_for(lambda: cluster.psql("SELECT status FROM pg_stat_cai").out == "failed", 30)
    r = cluster.psql("SELECT cai_tokenize('Hello')")
    c.check("with pg_cai.model empty, calls say no model is configured",
            r.rc != 0 and "pg_cai model is not available: no model is configured" in r.err
            and "Set pg_cai.model" in r.err, repr(r))

    # A reply job waits for a model, retried every second: the runner logs that once, and the
    # retries after it at DEBUG1 only (debug1 is on so that they can be counted).
    cluster.psql("ALTER SYSTEM SET log_min_messages = debug1")
    cluster.psql("SELECT pg_reload_conf()")
    r = cluster.psql("CREATE TRIGGER reply_later AFTER INSERT ON cai.messages FOR EACH ROW "
                     "EXECUTE FUNCTION cai_enqueue_reply_trigger(); "
                     "INSERT INTO cai.messages (conversation_id, role, content) "
                     "SELECT cai_new_conversation(), 'user', 'Hello' RETURNING conversation_id")
    c.check("a reply job is queued without a model", r.rc == 0 and r.out.isdigit(), repr(r))

    def retry_lines():
        with open(cluster.log, errors="replace") as f:
            lines = [l for l in f if "will be retried: pg_cai model is not available" in l]
        return ([l for l in lines if " LOG:  " in l], [l for l in lines if " DEBUG:  " in l])
    wait_for(lambda: len(retry_lines()[1]) >= 4, 60, 0.5)
    logged, quiet = retry_lines()
    c.check("a job waiting for a model is retried (seen at DEBUG1)", len(quiet) >= 4,
            "%d DEBUG lines" % len(quiet))
    c.check("the retries are logged once, not once a second",
            len(logged) == 1, "%d LOG lines: %r" % (len(logged), logged[:3]))
    r = cluster.psql("SELECT status FROM cai.jobs")
    c.check("the job waits (pending, or claimed for its next try)",
            r.rc == 0 and r.out in ("pending", "running"), repr(r))
    cluster.psql("ALTER SYSTEM RESET log_min_messages")

    cluster.stop()
    cluster.configure({})
    cluster.start()
    r = cluster.psql("SELECT cai_complete('Hello')")
    c.check("without shared_preload_libraries, calls say how to load pg_cai",
            r.rc != 0 and "pg_cai must be loaded via shared_preload_libraries" in r.err, repr(r))
finally:
    cluster.stop()
    if c.failed == 0:
        cluster.remove()
    else:
        print("kept %s" % cluster.dir)
c.done()
