"""cai_chat_stream's rows reach a client as they are made, without a cursor: in libpq's single-row
mode (how drivers stream a plain query), through the simple and the extended protocol, each row
arrives about when the server produced it, so the arrivals spread over the generation instead of
coming in one burst at the end.  The server stamps each row with clock_timestamp(); the check is
a ratio of spreads (arrival spread / production spread), not a time.  The same through PgBouncer
(transaction pooling) when it is installed."""
import os
import shutil
import socket
import subprocess
import tempfile

from pgtest import Checks, DB, as_postgres, ensure_database, wait_for
from pqlib import Conn, PqError

MIN_PIECES = 24
MIN_RATIO = 0.8     # a burst at the end gives ~0: every row arrives within a few ms
OPTIONS = '{"max_tokens": 160, "ignore_eos": true}'    # long: a pause of the machine weighs little
# the SRF in the select list runs value-per-call (ProjectSet); the outer query stamps each row
# when the executor pulls it, right before it is sent
QUERY = ("SELECT piece, extract(epoch FROM clock_timestamp())::float8 "
         "FROM (SELECT cai_chat_stream(%s, 'Count from one to a hundred in words.', '%s') AS piece) s")
QUERY_PARAMS = ("SELECT piece, extract(epoch FROM clock_timestamp())::float8 "
                "FROM (SELECT cai_chat_stream($1::bigint, $2, $3::jsonb) AS piece) s")

c = Checks()
ensure_database()
conn = Conn(DB, "cai_stream_rows")


def spreads(arrivals):
    """(pieces, arrival spread, production spread) of [(arrival time, (piece, server time))],
    from the row a tenth of the way in to the last: a first row held up by the machine's load
    would otherwise weigh on the ratio as much as every later row together."""
    made = [float(row[1]) for _, row in arrivals]
    got = [t for t, _ in arrivals]
    first = len(arrivals) // 10
    return len(arrivals), got[-1] - got[first], made[-1] - made[first]


def start_pgbouncer():
    """PgBouncer in transaction pooling in front of the test cluster: (process, dir, env)."""
    tmp = tempfile.mkdtemp(prefix="pg_cai_bouncer.")
    os.chmod(tmp, 0o777)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    conf = os.path.join(tmp, "pgbouncer.ini")
    with open(conf, "w") as f:
        f.write("[databases]\n%s = host=%s port=%s user=%s dbname=%s\n"
                "[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = %d\nunix_socket_dir =\n"
                "auth_type = any\npool_mode = transaction\nlogfile = %s/pgbouncer.log\n"
                % (DB, os.environ.get("PGHOST", "/var/run/postgresql"), os.environ.get("PGPORT", "5432"),
                   os.environ.get("PGUSER", "postgres"), DB, port, tmp))
    proc = subprocess.Popen(as_postgres(["pgbouncer", conf]), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    env = {"PGHOST": "127.0.0.1", "PGPORT": str(port), "PGUSER": os.environ.get("PGUSER", "postgres")}

    def up():
        try:
            Conn(DB, "cai_bouncer_probe", env).close()
            return True
        except PqError:
            return False
    return proc, tmp, env, wait_for(up, 30, 0.1)


def check_streams(conn, via):
    for protocol in ("simple", "extended"):
        conv = conn.value("SELECT cai_new_conversation()")
        if protocol == "simple":
            arrivals = conn.single_rows(QUERY % (conv, OPTIONS))
        else:
            arrivals = conn.single_rows(QUERY_PARAMS, [conv, "Count from one to a hundred in words.", OPTIONS])
        n, got, made = spreads(arrivals) if arrivals else (0, 0.0, 0.0)
        ratio = got / made if made > 0 else 0.0
        name = "%s, %s protocol" % (via, protocol)
        print("%s: %d rows produced over %.3f s, received over %.3f s (ratio %.2f)"
              % (name, n, made, got, ratio))
        c.check("%s: the reply comes in at least %d rows" % (name, MIN_PIECES),
                n >= MIN_PIECES, "%d rows" % n)
        c.check("%s: rows arrive as they are made (spread ratio >= %.1f)" % (name, MIN_RATIO),
                ratio >= MIN_RATIO, "received over %.3f s of %.3f s" % (got, made))
        stored = conn.value("SELECT count(*) FROM cai.messages WHERE conversation_id = %s" % conv)
        c.check("%s: both turns are stored" % name, stored == "2", stored)


check_streams(conn, "direct")
conn.close()

if shutil.which("pgbouncer") is None:
    print("SKIP PgBouncer: not installed")
else:
    bouncer, bouncer_dir, bouncer_env, ready = start_pgbouncer()
    try:
        if c.check("PgBouncer accepts connections", ready is not None):
            conn = Conn(DB, "cai_stream_rows_bouncer", bouncer_env)
            check_streams(conn, "PgBouncer")
            conn.close()
    finally:
        bouncer.terminate()
        bouncer.wait(10)
        shutil.rmtree(bouncer_dir, ignore_errors=True)
c.done()
