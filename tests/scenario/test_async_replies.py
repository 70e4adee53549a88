"""Asynchronous replies: cai_enqueue_reply_trigger queues a job for an inserted user turn, a job
runner answers it after commit as the conversation's owner and NOTIFYs cai_reply.

A rolled-back insert gets no job and no reply; a failing job is marked failed with its error and
the next job is answered; cai_chat's own turns queue nothing; the synchronous and asynchronous
triggers refuse to work together; the runners answer several conversations at once, and one
conversation's turns in order.  The scenario cluster's pg_cai.job_databases lists this database.
"""
import time

from pgtest import Checks, DB, ensure_database, psql, value, wait_for
from pqlib import Conn

c = Checks()
ensure_database()


def runners():
    return int(value("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_cai job runner' "
                     "AND datname = '%s'" % DB, db="postgres"))


c.check("job runners serve the scenario database", wait_for(lambda: runners() >= 1, 30) is not None,
        "%d runners" % runners())

value("DROP TRIGGER IF EXISTS scenario_reply_later ON cai.messages")
value("CREATE TRIGGER scenario_reply_later AFTER INSERT ON cai.messages FOR EACH ROW "
      "EXECUTE FUNCTION cai_enqueue_reply_trigger('{\"max_tokens\": 8}')")
listener = Conn(DB, "cai_async_listener")
try:
    listener.exec("LISTEN cai_reply")

    # ---- a reply arrives: NOTIFY, then the row is there --------------------------------------
    conv = value("SELECT cai_new_conversation('You are a helpful assistant.')")
    start = time.monotonic()
    value("INSERT INTO cai.messages (conversation_id, role, content) VALUES (%s, 'user', 'What is 2 + 2?')" % conv)
    notes = listener.notifies(60)
    ms = (time.monotonic() - start) * 1000.0
    print("the NOTIFY arrived %.0f ms after the insert committed" % ms)
    c.check("a NOTIFY on cai_reply names the conversation", [(n[0], n[1]) for n in notes] == [("cai_reply", conv)],
            repr(notes))
    roles = value("SELECT string_agg(role, ',' ORDER BY id) FROM cai.messages WHERE conversation_id = %s" % conv)
    c.check("the reply is stored when the NOTIFY arrives", roles == "user,assistant", roles)
    job = value("SELECT status, attempts, error IS NULL, reply_id = (SELECT max(id) FROM cai.messages "
                "WHERE conversation_id = %s), finished_at >= started_at FROM cai.jobs WHERE conversation_id = %s"
                % (conv, conv))
    c.check("the job is done, once, and names its reply", job == "done|1|t|t|t", job)
    usage = value("SELECT m.completion_tokens BETWEEN 1 AND 8, u.tokens IS NOT NULL FROM cai.messages m, "
                  "cai.messages u WHERE m.conversation_id = %s AND m.role = 'assistant' AND u.conversation_id = %s "
                  "AND u.role = 'user'" % (conv, conv))
    c.check("the reply has its usage (max_tokens from the trigger) and the user turn its token ids",
            usage == "t|t", usage)

    # ---- a rolled-back insert: no job, no reply ---------------------------------------------
    conv = value("SELECT cai_new_conversation('You are a helpful assistant.')")
    r = psql("BEGIN; INSERT INTO cai.messages (conversation_id, role, content) VALUES (%s, 'user', 'Hello'); "
             "SELECT count(*) FROM cai.jobs WHERE conversation_id = %s; ROLLBACK;" % (conv, conv))
    c.check("inside the transaction the job is queued", r.rc == 0 and r.out == "1", repr(r))
    notes = listener.notifies(3)
    rows = value("SELECT (SELECT count(*) FROM cai.jobs WHERE conversation_id = %s) + "
                 "(SELECT count(*) FROM cai.messages WHERE conversation_id = %s)" % (conv, conv))
    c.check("a rolled-back insert leaves no job and gets no reply", rows == "0" and notes == [],
            "%s rows, notifications %r" % (rows, notes))

    # ---- a failing job is marked failed; the next one is answered -----------------------------
    bad = value("SELECT cai_new_conversation('You are a helpful assistant.')")
    # stored options are checked as they are written (cai_check_options); a row that got around
    # the check (written in replica mode, or before pg_cai 0.2) still fails only its own job
    value("SET session_replication_role = replica; "
          "UPDATE cai.conversations SET options = '{\"temperature\": \"hot\"}' WHERE id = %s; "
          "RESET session_replication_role" % bad)
    good = value("SELECT cai_new_conversation('You are a helpful assistant.')")
    value("BEGIN; INSERT INTO cai.messages (conversation_id, role, content) VALUES (%s, 'user', 'Hello'); "
          "INSERT INTO cai.messages (conversation_id, role, content) VALUES (%s, 'user', 'Hello'); COMMIT;"
          % (bad, good))
    seen = set()
    deadline = time.monotonic() + 60
    while len(seen) < 2 and time.monotonic() < deadline:
        seen.update(n[1] for n in listener.notifies(deadline - time.monotonic()))
    c.check("both jobs end with a NOTIFY", seen == {bad, good}, repr(seen))
    job = value("SELECT status, error FROM cai.jobs WHERE conversation_id = %s" % bad)
    c.check("the job with a bad option failed, saying why",
            job == 'failed|option "temperature" must be a number', job)
    c.check("its conversation got no reply",
            value("SELECT count(*) FROM cai.messages WHERE conversation_id = %s" % bad) == "1", "")
    c.check("the next job was answered", value("SELECT status FROM cai.jobs WHERE conversation_id = %s" % good) == "done",
            value("SELECT status, error FROM cai.jobs WHERE conversation_id = %s" % good))

    # ---- exactly one reply --------------------------------------------------------------------
    conv = value("SELECT cai_new_conversation('You are a helpful assistant.')")
    r = psql("SELECT length(cai_chat(%s, 'Hello', '{\"max_tokens\": 4}')) > 0" % conv)
    time.sleep(0.5)
    c.check("cai_chat's own turn queues no job",
            r.rc == 0 and value("SELECT count(*) FROM cai.jobs WHERE conversation_id = %s" % conv) == "0"
            and value("SELECT string_agg(role, ',' ORDER BY id) FROM cai.messages WHERE conversation_id = %s"
                      % conv) == "user,assistant", repr(r))
    value("CREATE TRIGGER scenario_reply_now AFTER INSERT ON cai.messages FOR EACH ROW "
          "EXECUTE FUNCTION cai_reply_trigger('{\"max_tokens\": 4}')")
    try:
        r = psql("\\set VERBOSITY verbose\nINSERT INTO cai.messages (conversation_id, role, content) "
                 "VALUES (%s, 'user', 'Again')" % conv)
    finally:
        value("DROP TRIGGER scenario_reply_now ON cai.messages")
    c.check("with both reply triggers attached, an insert fails (42P17) instead of being answered twice",
            r.rc != 0 and "42P17" in r.err and "more than one pg_cai reply trigger" in r.err, repr(r))
    value("INSERT INTO cai.messages (conversation_id, role, content) VALUES "
          "(%s, 'user', 'Imported question'), (%s, 'assistant', 'Imported answer'), (%s, 'user', 'New question')"
          % (conv, conv, conv))
    queued = value("SELECT string_agg(m.content, ',') FROM cai.jobs j JOIN cai.messages m ON m.id = j.message_id "
                   "WHERE j.conversation_id = %s" % conv)
    c.check("importing a history queues a job only for its newest user turn", queued == "New question", queued)
    listener.notifies(30)

    # ---- runners answer conversations at once, and one conversation in order -----------------
    convs = value("SELECT string_agg(cai_new_conversation('You are a helpful assistant.')::text, ',') "
                  "FROM generate_series(1, 6)").split(",")
    value("INSERT INTO cai.messages (conversation_id, role, content) SELECT c, 'user', 'Say hello to ' || c "
          "FROM unnest('{%s}'::bigint[]) c" % ",".join(convs))
    one = value("SELECT cai_new_conversation('You are a helpful assistant.')")
    for i in range(3):
        value("INSERT INTO cai.messages (conversation_id, role, content) VALUES (%s, 'user', 'Question %d')"
              % (one, i + 1))
    all_ids = ",".join(convs + [one])
    done = wait_for(lambda: value("SELECT count(*) FILTER (WHERE status = 'done') FROM cai.jobs "
                                  "WHERE conversation_id IN (%s)" % all_ids) == "9", 120, 0.2)
    c.check("9 jobs in 7 conversations are all answered", done is not None,
            value("SELECT string_agg(status || coalesce(': ' || error, ''), ', ') FROM cai.jobs "
                  "WHERE conversation_id IN (%s)" % all_ids))
    overlap = value("SELECT count(*) FROM cai.jobs a JOIN cai.jobs b ON a.id < b.id "
                    "AND a.started_at < b.finished_at AND b.started_at < a.finished_at "
                    "WHERE a.conversation_id IN (%s) AND b.conversation_id IN (%s)" % (",".join(convs), ",".join(convs)))
    print("pairs of jobs of different conversations that ran at the same time: %s" % overlap)
    c.check("the runners answer different conversations at the same time", int(overlap) > 0, overlap)
    order = value("SELECT bool_and(a.finished_at <= b.started_at) FROM cai.jobs a JOIN cai.jobs b "
                  "ON a.conversation_id = b.conversation_id AND a.id < b.id WHERE a.conversation_id = %s" % one)
    roles = value("SELECT string_agg(role, ',' ORDER BY id) FROM cai.messages WHERE conversation_id = %s" % one)
    c.check("one conversation's jobs run one after the other, in order", order == "t", order)
    c.check("each of its user turns got one reply",
            roles.count("user") == 3 and roles.count("assistant") == 3, roles)

    # ---- the runner answers as the conversation's owner -----------------------------------------
    value("DROP ROLE IF EXISTS scenario_alice; DROP ROLE IF EXISTS scenario_bob; DROP ROLE IF EXISTS scenario_carol; "
          "CREATE ROLE scenario_alice IN ROLE cai_user; CREATE ROLE scenario_bob IN ROLE cai_user; "
          "CREATE ROLE scenario_carol")
    system = ("You are a patient assistant for a small bakery. You answer questions about bread, opening "
              "hours and orders in one short sentence.")
    question = "Do you sell rye bread on Sundays?"
    as_alice = "SET ROLE scenario_alice; "
    alice1 = value(as_alice + "SELECT cai_new_conversation('%s')" % system)
    value(as_alice + "SELECT cai_chat(%s, '%s', '{\"max_tokens\": 4}')" % (alice1, question))
    alice2 = value(as_alice + "SELECT cai_new_conversation('%s')" % system)
    bob = value("SET ROLE scenario_bob; SELECT cai_new_conversation('%s')" % system)
    value(as_alice + "INSERT INTO cai.messages (conversation_id, role, content) VALUES (%s, 'user', '%s')"
          % (alice2, question))
    answered = wait_for(lambda: value("SELECT status FROM cai.jobs WHERE conversation_id = %s" % alice2) == "done", 60)
    value("SET ROLE scenario_bob; INSERT INTO cai.messages (conversation_id, role, content) VALUES (%s, 'user', '%s')"
          % (bob, question))
    answered = answered and wait_for(
        lambda: value("SELECT status FROM cai.jobs WHERE conversation_id = %s" % bob) == "done", 60)
    c.check("the owners' jobs are answered", answered is not None and answered is not False,
            value("SELECT string_agg(status || coalesce(': ' || error, ''), ', ') FROM cai.jobs "
                  "WHERE conversation_id IN (%s, %s)" % (alice2, bob)))
    cached = value("SELECT string_agg((cached_tokens > 0)::text, ',' ORDER BY conversation_id) FROM cai.messages "
                   "WHERE conversation_id IN (%s, %s) AND role = 'assistant'" % (alice2, bob))
    c.check("the reply is generated with the owner's cache salt: alice's job reuses alice's cached prompt, "
            "bob's does not", cached == "true,false", cached)
    visible = value("SET ROLE scenario_bob; SELECT count(*), bool_and(conversation_id = %s) FROM cai.jobs" % bob)
    c.check("a role sees only its own conversations' jobs", visible == "1|t", visible)
    r = psql("SET ROLE scenario_bob; UPDATE cai.jobs SET status = 'done'")
    c.check("a role may not change a job's state", r.rc != 0 and "permission denied" in r.err, repr(r))
    carol = value("INSERT INTO cai.conversations (owner, system_prompt) VALUES ('scenario_carol', 'Hi') RETURNING id")
    value("INSERT INTO cai.messages (conversation_id, role, content) VALUES (%s, 'user', 'Hello')" % carol)
    failed = wait_for(lambda: value("SELECT status FROM cai.jobs WHERE conversation_id = %s" % carol) == "failed", 60)
    error = value("SELECT error FROM cai.jobs WHERE conversation_id = %s" % carol)
    c.check("an owner who may not use pg_cai gets no reply", failed is not None and "may not use pg_cai" in error
            and value("SELECT count(*) FROM cai.messages WHERE conversation_id = %s" % carol) == "1", error)
    value("DELETE FROM cai.conversations WHERE owner IN ('scenario_alice', 'scenario_bob', 'scenario_carol'); "
          "DROP ROLE scenario_alice; DROP ROLE scenario_bob; DROP ROLE scenario_carol")
    listener.notifies(1)

    # ---- nothing is left behind ----------------------------------------------------------------
    settled = wait_for(lambda: value("SELECT count(*) FROM cai.jobs WHERE status IN ('pending', 'running')") == "0",
                       60, 0.2)
    c.check("no job is left pending or running", settled is not None,
            value("SELECT string_agg(id || ': ' || status, ', ') FROM cai.jobs "
                  "WHERE status IN ('pending', 'running')"))

    # ---- pg_stat_cai counts the jobs ----------------------------------------------------------
    counts = value("SELECT s.jobs_pending = j.p AND s.jobs_running = j.r AND s.jobs_done = j.d AND s.jobs_failed = j.f "
                   "AND s.jobs_done >= 10 AND s.jobs_failed >= 1 "
                   "FROM pg_stat_cai s, (SELECT count(*) FILTER (WHERE status = 'pending') p, "
                   "count(*) FILTER (WHERE status = 'running') r, count(*) FILTER (WHERE status = 'done') d, "
                   "count(*) FILTER (WHERE status = 'failed') f FROM cai.jobs) j")
    c.check("pg_stat_cai counts the jobs by state", counts == "t",
            value("SELECT jobs_pending, jobs_running, jobs_done, jobs_failed FROM pg_stat_cai"))
finally:
    listener.close()
    value("DROP TRIGGER IF EXISTS scenario_reply_later ON cai.messages")
c.done()
