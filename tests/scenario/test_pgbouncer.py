"""PgBouncer in transaction mode in front of the test cluster (Debian's pgbouncer, started here on
a free local port, auth_type trust).  Through it cai_chat works, and a conversation's second
turn served by another server connection reuses the first turn's cached attention (usage's
cached_tokens > 0): the prefix cache is the engine's, not a session's.  And what a pooler does
not keep, checked so that the README's advice stays true: a session SET made by one client is
seen by the next client of the same server connection (use SET LOCAL or per-call options),
while SET LOCAL and per-call options stay with their own call.  (LISTEN, which a pooled client
cannot rely on either, is left to the README: whether a notification reaches the client that
listened depends on which client its server connection serves when it comes.)

Skipped, and counted as such, when pgbouncer is not installed."""
import os
import shutil
import socket
import subprocess
import sys
import tempfile

from pgtest import DB, Checks, as_postgres, ensure_database, wait_for
from pqlib import Conn, PqError

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
if not os.access(PGBOUNCER, os.X_OK):
    print("SKIP test_pgbouncer: pgbouncer is not installed (apt-get install pgbouncer)")
    sys.exit(0)

c = Checks()
ensure_database()
s = socket.socket()
s.bind(("127.0.0.1", 0))
PORT = s.getsockname()[1]
s.close()
work = tempfile.mkdtemp(prefix="pg_cai_pgbouncer.")
os.chmod(work, 0o755)
if os.geteuid() == 0:
    shutil.chown(work, "postgres", "postgres")
server = "host=%s port=%s user=%s" % (os.environ["PGHOST"], os.environ["PGPORT"],
                                      os.environ.get("PGUSER", "postgres"))
with open(os.path.join(work, "users.txt"), "w") as f:
    f.write('"%s" ""\n' % os.environ.get("PGUSER", "postgres"))
with open(os.path.join(work, "pgbouncer.ini"), "w") as f:
    # two pools of one database: two server connections for the cache check, and one that every
    # client shares, so that what one client leaves behind is seen by the next for certain
    f.write("[databases]\n"
            "%s = %s dbname=%s pool_size=2\n"
            "cai_single = %s dbname=%s pool_size=1\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\nlisten_port = %d\nunix_socket_dir =\n"
            "auth_type = trust\nauth_file = %s/users.txt\n"
            "pool_mode = transaction\nmax_client_conn = 20\n"
            "logfile = %s/pgbouncer.log\npidfile = %s/pgbouncer.pid\n"
            % (DB, server, DB, server, DB, PORT, work, work, work))
bouncer = subprocess.Popen(as_postgres([PGBOUNCER, os.path.join(work, "pgbouncer.ini")]),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
POOLED = {"PGHOST": "127.0.0.1", "PGPORT": str(PORT)}


def pooled(db=DB, app="cai_pgbouncer"):
    return Conn(db, app=app, env=POOLED)


def connects():
    try:
        pooled().close()
        return True
    except PqError:
        return False


try:
    c.check("pgbouncer starts in transaction mode", wait_for(connects, 30, 0.2),
            open(os.path.join(work, "pgbouncer.log")).read()[-2000:]
            if os.path.exists(os.path.join(work, "pgbouncer.log")) else "no log")

    # ---- a conversation through the pooler, its turns on two server connections -------------
    client = pooled()
    conv = client.value("SELECT cai_new_conversation('You are a helpful assistant. Answer in one "
                        "short sentence.', '{\"max_tokens\": 8}')")
    # one client holds server connection X in a transaction: the first turn runs on the other, Y
    holder_x = pooled(app="cai_pgbouncer_x")
    holder_x.exec("BEGIN")
    pid_x = holder_x.value("SELECT pg_backend_pid()")
    pid_1, reply = client.exec("SELECT pg_backend_pid(), cai_chat(%s, 'What is the sea?')" % conv)[0]
    c.check("cai_chat works through pgbouncer", reply is not None and reply != "", repr(reply))
    # a second holder takes Y (the pool's only idle connection); X is let go for the second turn
    holder_y = pooled(app="cai_pgbouncer_y")
    holder_y.exec("BEGIN")
    pid_y = holder_y.value("SELECT pg_backend_pid()")
    holder_x.exec("COMMIT")
    other = pooled(app="cai_pgbouncer_other")
    pid_2, _ = other.exec("SELECT pg_backend_pid(), cai_chat(%s, 'And what is a lake?')" % conv)[0]
    holder_y.exec("COMMIT")
    c.check("the second turn ran on another server connection",
            pid_1 != pid_2 and pid_y == pid_1 and pid_2 == pid_x,
            "first turn %s, second %s (holders %s, %s)" % (pid_1, pid_2, pid_x, pid_y))
    rows = client.exec("SELECT role, cached_tokens FROM cai.messages WHERE conversation_id = %s "
                       "ORDER BY id" % conv)
    c.check("the conversation has both turns", [r[0] for r in rows] ==
            ["user", "assistant", "user", "assistant"], repr(rows))
    cached = int(rows[-1][1] or 0) if rows else 0
    c.check("the second turn reused the first's cached prefix (cached_tokens > 0)", cached > 0,
            repr(rows))
    for conn in (client, holder_x, holder_y, other):
        conn.close()

    # ---- what a pooler does not keep --------------------------------------------------------
    first, second = pooled("cai_single", "cai_pgbouncer_1"), pooled("cai_single", "cai_pgbouncer_2")
    default = second.value("SHOW pg_cai.max_tokens")
    first.exec("SET pg_cai.max_tokens = 3")
    seen = second.value("SHOW pg_cai.max_tokens")
    c.check("a session SET by one client is seen by the next client of its server connection",
            seen == "3" and default != "3", "default %s, seen %s" % (default, seen))
    usage = second.value("SELECT cai_chat_completion('[{\"role\": \"user\", \"content\": \"Count to "
                         "twenty.\"}]', '{\"ignore_eos\": true}') #>> '{usage,completion_tokens}'")
    c.check("... and it sets that client's replies' length", usage == "3", repr(usage))
    first.exec("RESET pg_cai.max_tokens")
    first.exec("BEGIN; SET LOCAL pg_cai.max_tokens = 5; COMMIT")
    seen = second.value("SHOW pg_cai.max_tokens")
    c.check("SET LOCAL stays with its transaction", seen == default,
            "default %s, seen %s" % (default, seen))
    usage = second.value("SELECT cai_chat_completion('[{\"role\": \"user\", \"content\": \"Count to "
                         "twenty.\"}]', '{\"max_tokens\": 4, \"ignore_eos\": true}') "
                         "#>> '{usage,completion_tokens}'")
    c.check("per-call options apply to their call", usage == "4", repr(usage))

    for conn in (first, second):
        conn.close()
finally:
    bouncer.terminate()
    try:
        bouncer.wait(10)
    except subprocess.TimeoutExpired:
        bouncer.kill()
    shutil.rmtree(work, ignore_errors=True)
c.done()
