"""Reply jobs survive crashes: with jobs queued and running, the engine worker or a job runner is
killed; after the restart every job is answered exactly once.  SIGKILL makes PostgreSQL restart
every process (crash recovery); a job caught running is found orphaned and run again.  SIGTERM of a
runner ends only that runner; the launcher starts a new one, which takes over its job.
"""
import os
import signal
import time

from pgtest import Checks, DB, ensure_database, psql, value, wait_for, worker_pid, worker_ready

JOBS = 6
c = Checks()
ensure_database()


def q(sql, default=None):
    r = psql(sql)
    return r.out if r.rc == 0 else default


def queue_jobs():
    """Queues one slow job in each of JOBS new conversations (one transaction); returns their ids."""
    convs = value("SELECT string_agg(cai_new_conversation('You are a helpful assistant.')::text, ',') "
                  "FROM generate_series(1, %d)" % JOBS)
    value("INSERT INTO cai.messages (conversation_id, role, content) "
          "SELECT c, 'user', 'Count from 1 to 100.' FROM unnest('{%s}'::bigint[]) c" % convs)
    return convs


def running_runner():
    """The pid of a job runner that is answering a job, or None."""
    out = q("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_cai job runner' "
            "AND query LIKE 'answering pg_cai reply job%' AND state = 'active' LIMIT 1")
    return int(out) if out else None


def all_answered(convs, timeout):
    return wait_for(lambda: q("SELECT count(*) FILTER (WHERE status = 'done') FROM cai.jobs "
                              "WHERE conversation_id IN (%s)" % convs) == str(JOBS), timeout, 0.5)


def check_answered_once(label, convs):
    states = q("SELECT string_agg(status || '/' || attempts, ' ' ORDER BY id) FROM cai.jobs "
               "WHERE conversation_id IN (%s)" % convs)
    print("%s: jobs (status/attempts) %s" % (label, states))
    c.check("%s: every job is answered after the restart" % label, all_answered(convs, 180) is not None, states)
    shapes = q("SELECT string_agg(DISTINCT roles, ' | ') FROM (SELECT string_agg(role, ',' ORDER BY id) AS roles "
               "FROM cai.messages WHERE conversation_id IN (%s) GROUP BY conversation_id) r" % convs)
    c.check("%s: each user turn has exactly one reply" % label, shapes == "user,assistant", shapes)
    return q("SELECT max(attempts) FROM cai.jobs WHERE conversation_id IN (%s)" % convs)


value("DROP TRIGGER IF EXISTS scenario_reply_later ON cai.messages")
value("CREATE TRIGGER scenario_reply_later AFTER INSERT ON cai.messages FOR EACH ROW "
      "EXECUTE FUNCTION cai_enqueue_reply_trigger('{\"max_tokens\": 100, \"ignore_eos\": true}')")
try:
    c.check("job runners serve the scenario database",
            wait_for(lambda: running_runner() is not None or q("SELECT count(*) FROM pg_stat_activity "
                     "WHERE backend_type = 'pg_cai job runner' AND datname = '%s'" % DB, "0") != "0", 30)
            is not None, "")

    # ---- SIGKILL the engine worker while jobs run --------------------------------------------
    convs = queue_jobs()
    running = wait_for(lambda: q("SELECT count(*) FROM cai.jobs WHERE status = 'running' "
                                 "AND conversation_id IN (%s)" % convs) not in (None, "0"), 30, 0.05)
    c.check("engine SIGKILL: jobs are running", running is not None, "")
    time.sleep(0.5)
    old = worker_pid()
    os.kill(old, signal.SIGKILL)
    back = wait_for(lambda: worker_ready() and worker_pid() != old, 120, 0.5)
    c.check("engine SIGKILL: the server recovers and the worker comes back", back is not None, "")
    attempts = check_answered_once("engine SIGKILL", convs)
    c.check("engine SIGKILL: the jobs caught running were run again", attempts is not None and int(attempts) >= 2,
            attempts)

    # ---- SIGKILL a job runner while it answers -----------------------------------------------
    convs = queue_jobs()
    victim = wait_for(running_runner, 30, 0.05)
    c.check("runner SIGKILL: a runner is answering a job", victim is not None, "")
    if victim:
        time.sleep(0.3)
        old = worker_pid()
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: worker_ready() and worker_pid() != old, 120, 0.5)
    attempts = check_answered_once("runner SIGKILL", convs)
    c.check("runner SIGKILL: the jobs caught running were run again", attempts is not None and int(attempts) >= 2,
            attempts)

    # ---- SIGTERM a job runner: only it stops; its job is taken over --------------------------
    convs = queue_jobs()
    victim = wait_for(running_runner, 30, 0.05)
    c.check("runner SIGTERM: a runner is answering a job", victim is not None, "")
    engine = worker_pid()
    if victim:
        time.sleep(0.3)
        os.kill(victim, signal.SIGTERM)
    attempts = check_answered_once("runner SIGTERM", convs)
    c.check("runner SIGTERM: the engine worker kept running", worker_pid() == engine, "")
    c.check("runner SIGTERM: the orphaned job was run again", attempts is not None and int(attempts) >= 2,
            attempts)
    restarted = wait_for(lambda: q("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_cai job runner' "
                                   "AND datname = '%s' AND pid <> %d" % (DB, victim or 0))
                         == q("SHOW pg_cai.job_workers"), 30)
    c.check("runner SIGTERM: the launcher started a new runner", restarted is not None,
            q("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_cai job runner'"))
finally:
    psql("DROP TRIGGER IF EXISTS scenario_reply_later ON cai.messages")
c.done()
