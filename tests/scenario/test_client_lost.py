"""A client that vanishes mid-reply (its process killed with SIGKILL, so the kernel closes its
socket and nothing is said to the server) stops its reply: with the default settings
(client_connection_check_interval = 0) the backend notices while it waits for the engine, the
worker drops the request, pg_stat_cai counts it in requests_client_lost, nothing of the turn is
stored, and other sessions chat normally.  Both cai_chat and cai_chat_stream are covered."""
import os
import signal
import subprocess
import time

from pgtest import Checks, DB, ensure_database, log_text, value, wait_for

MAX_TOKENS = 900     # a whole reply fits the test cluster's context (1024)
OPTIONS = '{"max_tokens": %d, "ignore_eos": true}' % MAX_TOKENS

c = Checks()
ensure_database()
c.check("client_connection_check_interval is off (the default)",
        value("SHOW client_connection_check_interval") == "0",
        value("SHOW client_connection_check_interval"))


def counters():
    row = value("SELECT requests_client_lost || ' ' || requests_abandoned || ' ' || generated_tokens "
                "FROM pg_stat_cai")
    return [int(x) for x in row.split()]


def backend_of(app):
    out = value("SELECT pid FROM pg_stat_activity WHERE application_name = '%s'" % app, db="postgres")
    return int(out) if out else None


for function in ("cai_chat", "cai_chat_stream"):
    conv = value("SELECT cai_new_conversation()")
    app = "cai_lost_%s" % function
    lost0, abandoned0, generated0 = counters()
    env = dict(os.environ, PGAPPNAME=app)
    sql = "SELECT %s(%s, 'Count from one to a thousand in words.', '%s')" % (function, conv, OPTIONS)
    client = subprocess.Popen(["psql", "-X", "-q", "-d", DB, "-c", sql], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # generating: the engine has made some of this reply's tokens
    started = wait_for(lambda: counters()[2] - generated0 >= 20, 120, 0.05)
    c.check("%s: the reply is being generated" % function, started is not None)
    pid = backend_of(app)
    client.send_signal(signal.SIGKILL)
    client.wait()
    killed = time.monotonic()

    gone = wait_for(lambda: value("SELECT running + waiting FROM pg_stat_cai") == "0"
                    and counters()[0] > lost0, 120, 0.02)
    dropped_s = time.monotonic() - killed
    backend_gone = wait_for(lambda: backend_of(app) is None, 60, 0.05)
    lost, abandoned, generated = counters()
    print("%s: the request left the engine %.3f s after the client was killed, after %d of %d tokens"
          % (function, dropped_s, generated - generated0, MAX_TOKENS))
    c.check("%s: the engine dropped the request" % function, gone is not None,
            value("SELECT running, waiting FROM pg_stat_cai"))
    c.check("%s: it stopped before the reply was complete" % function,
            generated - generated0 < MAX_TOKENS, "%d tokens" % (generated - generated0))
    c.check("%s: requests_client_lost counts it, within requests_abandoned" % function,
            lost - lost0 == 1 and abandoned - abandoned0 >= 1,
            "lost %d -> %d, abandoned %d -> %d" % (lost0, lost, abandoned0, abandoned))
    c.check("%s: the backend ended" % function, backend_gone is not None, "pid %s" % pid)
    c.check("%s: the backend said why, as PostgreSQL does" % function,
            pid is not None and any("[%d]" % pid in line for line in log_text().splitlines()
                                    if "connection to client lost" in line),
            "no \"connection to client lost\" line for pid %s" % pid)
    stored = value("SELECT count(*) FROM cai.messages WHERE conversation_id = %s" % conv)
    c.check("%s: nothing of the turn is stored" % function, stored == "0", "%s rows" % stored)

conv = value("SELECT cai_new_conversation()")
reply = value("SELECT length(cai_chat(%s, 'Hello!', '{\"max_tokens\": 8}')) > 0" % conv)
c.check("another session chats normally", reply == "t", reply)
c.check("and its turn is stored",
        value("SELECT count(*) FROM cai.messages WHERE conversation_id = %s" % conv) == "2")
c.done()
