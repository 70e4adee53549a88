"""16 sessions chat at once: every one gets its replies and every turn is stored."""
import time

from pgtest import Checks, ensure_database, in_background, value

SESSIONS = 16
c = Checks()
ensure_database()
steps_before = int(value("SELECT steps FROM pg_stat_cai"))
seqs_before = float(value("SELECT coalesce(avg_batch * steps, 0) FROM pg_stat_cai"))

script = ("SELECT cai_new_conversation('You are a helpful assistant.') AS id \\gset\n"
          "SELECT cai_chat(:id, 'Hello, I am user %d. Say hi.', '{\"max_tokens\": 12}') IS NOT NULL;\n"
          "SELECT cai_chat(:id, 'What is %d plus %d?', '{\"max_tokens\": 12}') IS NOT NULL;\n"
          "SELECT :id;\n")
threads = []
start = time.monotonic()
for i in range(SESSIONS):
    threads.append(in_background(script % (i, i, i), app="cai_conc_%d" % i))
for t, _ in threads:
    t.join(600)
elapsed = time.monotonic() - start

ids = []
for i, (t, holder) in enumerate(threads):
    r = holder[0]
    lines = r.out.splitlines() if r else []
    ok = r is not None and r.rc == 0 and lines[:2] == ["t", "t"]
    c.check("session %d gets both replies" % i, ok, repr(r))
    if ok:
        ids.append(lines[-1])

print("%d sessions x 2 turns took %.1f s" % (SESSIONS, elapsed))
if ids:
    rows = value("SELECT count(*) FROM cai.messages WHERE conversation_id IN (%s)" % ",".join(ids))
    c.check("every turn is stored (%d sessions x 4 rows)" % SESSIONS, rows == str(4 * SESSIONS), rows)
    shapes = value("SELECT count(DISTINCT roles) FROM (SELECT string_agg(role, ',' ORDER BY id) AS roles "
                   "FROM cai.messages WHERE conversation_id IN (%s) GROUP BY conversation_id) s"
                   % ",".join(ids))
    c.check("every conversation reads user, assistant, user, assistant", shapes == "1", shapes)
# several sessions add turns to ONE conversation through the reply trigger: the conversation lock
# makes them take turns (no deadlock), and each user turn gets its one reply
conv = value("SELECT cai_new_conversation('You are a helpful assistant.')")
value("CREATE TRIGGER scenario_reply AFTER INSERT ON cai.messages FOR EACH ROW "
      "WHEN (NEW.role = 'user') EXECUTE FUNCTION cai_reply_trigger('{\"max_tokens\": 8}')")
try:
    same = [in_background("INSERT INTO cai.messages (conversation_id, role, content) "
                          "VALUES (%s, 'user', 'Message %d: hello!')" % (conv, i), app="cai_same_%d" % i)
            for i in range(4)]
    for t, _ in same:
        t.join(600)
finally:
    value("DROP TRIGGER scenario_reply ON cai.messages")
errors = [h[0] for _, h in same if h[0] is None or h[0].rc != 0]
c.check("concurrent trigger turns in one conversation all succeed", not errors, repr(errors))
roles = value("SELECT string_agg(role, ',' ORDER BY id) FROM cai.messages WHERE conversation_id = %s" % conv)
c.check("each of them got exactly one reply",
        roles.count("user") == 4 and roles.count("assistant") == 4, roles)

steps = int(value("SELECT steps FROM pg_stat_cai")) - steps_before
seqs = float(value("SELECT coalesce(avg_batch * steps, 0) FROM pg_stat_cai")) - seqs_before
if steps > 0:
    print("engine steps: %d, mean sequences per step: %.2f" % (steps, seqs / steps))
    c.check("the engine batched sessions together", seqs / steps > 1.0, "%.2f" % (seqs / steps))
c.done()
