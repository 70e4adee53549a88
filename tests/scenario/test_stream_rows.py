"""cai_chat_stream's rows reach a client as they are made, without a cursor: in libpq's single-row
mode (how drivers stream a plain query), through the simple and the extended protocol, each row
arrives about when the server produced it, so the arrivals spread over the generation instead of
coming in one burst at the end.  The server stamps each row with clock_timestamp(); the check is
a ratio of spreads (arrival spread / production spread), not a time."""
from pgtest import Checks, DB, ensure_database
from pqlib import Conn

MIN_PIECES = 24
MIN_RATIO = 0.8     # a burst at the end gives ~0: every row arrives within a few ms
OPTIONS = '{"max_tokens": 40, "ignore_eos": true}'
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
    """(pieces, arrival spread, production spread) of [(arrival time, (piece, server time))]."""
    made = [float(row[1]) for _, row in arrivals]
    got = [t for t, _ in arrivals]
    return len(arrivals), got[-1] - got[0], made[-1] - made[0]


for protocol in ("simple", "extended"):
    conv = conn.value("SELECT cai_new_conversation()")
    if protocol == "simple":
        arrivals = conn.single_rows(QUERY % (conv, OPTIONS))
    else:
        arrivals = conn.single_rows(QUERY_PARAMS, [conv, "Count from one to a hundred in words.", OPTIONS])
    n, got, made = spreads(arrivals) if arrivals else (0, 0.0, 0.0)
    ratio = got / made if made > 0 else 0.0
    print("%s protocol: %d rows produced over %.3f s, received over %.3f s (ratio %.2f)"
          % (protocol, n, made, got, ratio))
    c.check("%s protocol: the reply comes in at least %d rows" % (protocol, MIN_PIECES),
            n >= MIN_PIECES, "%d rows" % n)
    c.check("%s protocol: rows arrive as they are made (spread ratio >= %.1f)" % (protocol, MIN_RATIO),
            ratio >= MIN_RATIO, "received over %.3f s of %.3f s" % (got, made))
    stored = conn.value("SELECT count(*) FROM cai.messages WHERE conversation_id = %s" % conv)
    c.check("%s protocol: both turns are stored" % protocol, stored == "2", stored)

conn.close()
c.done()
