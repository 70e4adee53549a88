"""No request can stall the others.

- Requests over pg_cai.max_request_messages or pg_cai.max_request_bytes are refused in the caller's
  backend with SQLSTATE 54000 and a hint, before anything reaches the engine; only a superuser
  changes those limits.
- A role's conversation of 60,000 stored turns is answered from its newest turns, while another
  role chats: both replies come, and the engine is never restarted.  The engine is given a short
  pg_cai.engine_hang_timeout, which a request that made the engine tokenize and truncate all
  60,000 turns in one piece would overrun (the engine would be killed: engine_starts would grow).
- A conversation's window of newest turns moves in steps, so consecutive turns share their
  prompt's prefix in the cache.
- Cancelling such a request frees the engine: another role's reply completes, no restart.
- pg_cai.max_requests_per_role: with a share of one, a role's second request waits behind its
  first (both are answered), another role's request runs beside them and ends first, and a role
  whose waiting requests fill the queue's share gets SQLSTATE 53400.
"""
import os
import threading

from pgtest import Checks, Cluster, in_background, psql, wait_for

c = Checks()
model = os.environ.get("PG_CAI_TEST_MODEL")
cluster = Cluster({"shared_preload_libraries": "'pg_cai'", "pg_cai.model": "'%s'" % model,
                   "pg_cai.threads": "2", "pg_cai.max_batch": "2", "pg_cai.max_queue": "2",
                   "pg_cai.context_length": "1024", "pg_cai.engine_hang_timeout": "'8s'"})
threads = []


def as_role(role):
    env = cluster.env()
    env["PGUSER"] = role
    return env


def stat(column):
    return cluster.psql("SELECT %s FROM pg_stat_cai" % column).out


def run(sql, role="victim", verbose=True):
    return psql(("\\set VERBOSITY verbose\n" if verbose else "") + sql, db="postgres", env=as_role(role))


try:
    c.check("a cluster with a short engine_hang_timeout starts", cluster.start(), cluster.log)
    c.check("its worker loads the model",
            cluster.wait_log("pg_cai engine worker ready", 120) is not None, cluster.log)
    cluster.psql("CREATE EXTENSION pg_cai")
    cluster.psql("CREATE ROLE abuser LOGIN IN ROLE cai_user; CREATE ROLE victim LOGIN IN ROLE cai_user")

    # --- the limits, refused in the backend ------------------------------------------------
    sent_before = stat("requests_received")
    r = run("SELECT cai_chat_completion((SELECT jsonb_agg(jsonb_build_object('role', 'user', 'content', 'hi')) "
            "FROM generate_series(1, 100000)))", "abuser")
    c.check("100,000 messages in cai_chat_completion: SQLSTATE 54000 with a hint",
            r.rc != 0 and "54000" in r.err and "pg_cai.max_request_messages" in r.err and "HINT" in r.err,
            repr(r))
    r = run("SELECT cai_chat_completion(jsonb_build_array(jsonb_build_object('role', 'user', "
            "'content', repeat('abcd ', 1000000))))", "abuser")
    c.check("5 MB of text in cai_chat_completion: SQLSTATE 54000 naming pg_cai.max_request_bytes",
            r.rc != 0 and "54000" in r.err and "pg_cai.max_request_bytes" in r.err and "HINT" in r.err,
            repr(r))
    r = run("SELECT cai_complete(repeat('abcd ', 1000000))", "abuser")
    c.check("5 MB of text in cai_complete: SQLSTATE 54000", r.rc != 0 and "54000" in r.err, repr(r))
    conv_big = run("SELECT cai_new_conversation()", "abuser", False).out
    r = run("INSERT INTO cai.messages (conversation_id, role, content) VALUES (%s, 'user', repeat('abcd ', 1000000));"
            "SELECT cai_chat(%s, 'hello')" % (conv_big, conv_big), "abuser")
    c.check("a conversation holding 5 MB of text: SQLSTATE 54000", r.rc != 0 and "54000" in r.err, repr(r))
    c.check("none of the refused requests reached the engine worker",
            stat("requests_received") == sent_before, "%s -> %s" % (sent_before, stat("requests_received")))
    r = run("SET pg_cai.max_request_bytes = '100MB'", "abuser")
    c.check("a role that is not a superuser cannot raise pg_cai.max_request_bytes",
            r.rc != 0 and "42501" in r.err, repr(r))
    r = run("SET pg_cai.max_request_messages = 1000000", "abuser")
    c.check("nor pg_cai.max_request_messages", r.rc != 0 and "42501" in r.err, repr(r))
    r = cluster.psql("SET pg_cai.max_request_messages = 3; SELECT cai_chat_completion('["
                     + ", ".join(['{"role": "user", "content": "hi"}'] * 4) + "]')")
    c.check("a superuser may lower pg_cai.max_request_messages: 4 messages over 3 are refused",
            r.rc != 0 and "more than pg_cai.max_request_messages (3)" in r.err, repr(r))

    # --- 60,000 stored turns while another role chats ---------------------------------------
    starts = stat("engine_starts")
    conv_huge = run("SELECT cai_new_conversation()", "abuser", False).out
    r = run("INSERT INTO cai.messages (conversation_id, role, content) "
            "SELECT %s, CASE WHEN g %% 2 = 1 THEN 'user' ELSE 'assistant' END, 'turn number ' || g "
            "FROM generate_series(1, 60000) g" % conv_huge, "abuser", False)
    c.check("the abuser stores 60,000 turns in its conversation", r.rc == 0, repr(r))
    conv_victim = run("SELECT cai_new_conversation()", "victim", False).out
    abuser = in_background("SELECT length(cai_chat(%s, 'What was turn 59999?', '{\"max_tokens\": 8}')) >= 0"
                           % conv_huge, db="postgres", app="cai_abuser", env=as_role("abuser"))
    threads.append(abuser)
    victim_replies = []
    for i in range(3):
        victim_replies.append(run("SELECT length(cai_chat(%s, 'Say hello %d.', '{\"max_tokens\": 8}')) > 0"
                                  % (conv_victim, i), "victim", False))
    abuser[0].join(300)
    c.check("the other role's replies all complete",
            all(v.rc == 0 and v.out == "t" for v in victim_replies), repr(victim_replies))
    c.check("the abuser's call on 60,000 turns is answered too", abuser[1][0] is not None and
            abuser[1][0].rc == 0 and abuser[1][0].out == "t", repr(abuser[1][0]))
    c.check("the engine was not restarted", stat("engine_starts") == starts,
            "engine_starts %s -> %s" % (starts, stat("engine_starts")))
    n = run("SELECT count(*) FROM cai.messages WHERE conversation_id = %s" % conv_huge, "abuser", False).out
    c.check("the abuser's turns were stored as usual", n == "60002", n)

    # --- the window of a long conversation stays put between turns -------------------------
    # 40 stored turns, 20 messages a request: each call sends the newest 10 to 18 stored turns
    # from a start that moves 9 turns at a time, so the next turn's prompt starts as this one's
    # did and the prefix cache serves it (a window sliding with every turn would start each
    # prompt at another turn)
    r = cluster.psql("""SET pg_cai.max_request_messages = 20;
SELECT cai_new_conversation() AS conv \\gset
INSERT INTO cai.messages (conversation_id, role, content)
SELECT :conv, CASE WHEN g % 2 = 1 THEN 'user' ELSE 'assistant' END, 'Fact number ' || g || ' is about bees.'
FROM generate_series(1, 40) g;
SELECT length(cai_chat(:conv, 'And the next fact?', '{"max_tokens": 4}')) >= 0;
SELECT length(cai_chat(:conv, 'And the one after?', '{"max_tokens": 4}')) >= 0;
SELECT prompt_tokens || ' ' || cached_tokens FROM cai.messages
WHERE conversation_id = :conv AND role = 'assistant' AND prompt_tokens IS NOT NULL ORDER BY id""")
    usage = [tuple(int(x) for x in line.split()) for line in r.out.splitlines()[2:]] if r.rc == 0 else []
    print("prompt and cached tokens of the two turns: %s" % usage)
    c.check("a conversation past pg_cai.max_request_messages: the next turn's prompt is served from the cache",
            len(usage) == 2 and usage[1][1] >= usage[0][0] - 16, "%r %r" % (r, usage))

    # --- cancel of a request on the huge conversation -------------------------------------
    starts = stat("engine_starts")
    abuser = in_background("SELECT cai_chat(%s, 'Count to a thousand.', '{\"max_tokens\": 900, \"ignore_eos\": true}')"
                           % conv_huge, db="postgres", app="cai_abuser_cancel", env=as_role("abuser"))
    threads.append(abuser)
    running = wait_for(lambda: stat("running") == "1", 60)
    cluster.psql("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'cai_abuser_cancel'")
    abuser[0].join(120)
    r = abuser[1][0]
    c.check("the cancelled call ends with SQLSTATE 57014",
            running is not None and r is not None and r.rc != 0 and "canceling statement" in r.err, repr(r))
    v = run("SELECT length(cai_chat(%s, 'Say hello again.', '{\"max_tokens\": 8}')) > 0" % conv_victim,
            "victim", False)
    c.check("after the cancel, the other role's reply completes", v.rc == 0 and v.out == "t", repr(v))
    freed = wait_for(lambda: stat("running") == "0", 30)
    c.check("the cancelled request left the engine, which was not restarted",
            freed is not None and stat("engine_starts") == starts,
            "running %s, engine_starts %s -> %s" % (stat("running"), starts, stat("engine_starts")))

    # --- a role's share of the engine -----------------------------------------------------
    cluster.psql("ALTER SYSTEM SET pg_cai.max_requests_per_role = 1")
    cluster.psql("SELECT pg_reload_conf()")
    wait_for(lambda: cluster.psql("SHOW pg_cai.max_requests_per_role").out == "1", 10)
    long_call = ("SELECT length(cai_complete('Count to a thousand: 1, 2, 3,', "
                 "'{\"max_tokens\": 400, \"ignore_eos\": true}')) > 0")
    hogs = []
    for i in range(2):
        hogs.append(in_background(long_call, db="postgres", app="cai_hog_%d" % i, env=as_role("abuser")))
        threads.append(hogs[-1])
    one = wait_for(lambda: stat("running") == "1", 60)
    # the worker holds the second; a third fills the role's share of the queue (max_queue 2)
    extra = [in_background(long_call, db="postgres", app="cai_hog_x0", env=as_role("abuser"))]
    threads.extend(extra)
    wait_for(lambda: cluster.psql("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'cai_hog_%' "
                                  "AND wait_event IN ('PgCaiReply', 'Extension')").out == "3", 30)
    r = run("SELECT cai_complete('Hello', '{\"max_tokens\": 2}')", "abuser")
    c.check("a role whose waiting requests fill its share of the queue is refused with 53400",
            r.rc != 0 and "53400" in r.err and "queue is full for its role" in r.err and
            "pg_cai.max_requests_per_role" in r.err, repr(r))
    v = run("SELECT length(cai_complete('Hello', '{\"max_tokens\": 4, \"ignore_eos\": true}')) > 0", "victim", False)
    hogs_alive = all(t.is_alive() for t, _ in hogs)
    c.check("with max_requests_per_role = 1, another role's request runs beside the abuser's and ends first",
            one is not None and v.rc == 0 and v.out == "t" and hogs_alive,
            "running seen: %s, victim %r, abuser calls still running: %s" % (one, v, hogs_alive))
    for t, h in hogs + extra:
        t.join(600)
    c.check("the abuser's requests over its share waited and were all answered",
            all(h[0] is not None and h[0].rc == 0 and h[0].out == "t" for _, h in hogs + extra),
            repr([h[0] for _, h in hogs + extra]))
finally:
    cluster.psql("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'cai_%'")
    for t, _ in threads:
        t.join(120)
    cluster.stop()
    if c.failed == 0:
        cluster.remove()
    else:
        print("kept %s" % cluster.dir)
c.done()
