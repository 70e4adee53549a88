"""32 clients at once through pgbench, each chatting in a conversation of its own: every call
succeeds and every turn is stored.  Then batch invariance at the SQL level: a seeded, sampled
request (temperature > 0) gets the same reply alone as among 31 concurrent others.
"""
import os
import re
import subprocess
import tempfile
import time

from pgtest import Checks, DB, ensure_database, in_background, psql, value, wait_for

CLIENTS = 32
TURNS = 2

c = Checks()
ensure_database()

# ---- 1. pgbench: 32 clients, a conversation each -------------------------------------------
value("DROP TABLE IF EXISTS scenario_pgbench_conversations; "
      "CREATE TABLE scenario_pgbench_conversations (client_id int PRIMARY KEY, conversation_id bigint); "
      "INSERT INTO scenario_pgbench_conversations "
      "SELECT i, cai_new_conversation('You are a helpful assistant. Answer briefly.') "
      "FROM generate_series(0, %d) i" % (CLIENTS - 1))
script = tempfile.NamedTemporaryFile("w", suffix=".sql", prefix="cai_pgbench_", delete=False)
script.write("SELECT length(cai_chat(conversation_id, 'Hello, I am client ' || :client_id || '. What is ' "
             "|| :client_id || ' plus 2?', '{\"max_tokens\": 8}')) >= 0 "
             "FROM scenario_pgbench_conversations WHERE client_id = :client_id;\n")
script.close()
os.chmod(script.name, 0o644)
steps0 = int(value("SELECT steps FROM pg_stat_cai"))
seqs0 = float(value("SELECT coalesce(avg_batch * steps, 0) FROM pg_stat_cai"))
start = time.monotonic()
pgbench = os.path.join(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip(),
                       "pgbench")
bench = subprocess.run([pgbench, "-n", "-c", str(CLIENTS), "-j", "2", "-t", str(TURNS), "-f", script.name, DB],
                       capture_output=True, text=True, timeout=600)
elapsed = time.monotonic() - start
os.unlink(script.name)
steps = int(value("SELECT steps FROM pg_stat_cai")) - steps0
seqs = float(value("SELECT coalesce(avg_batch * steps, 0) FROM pg_stat_cai")) - seqs0

out = bench.stdout + bench.stderr
processed = re.search(r"number of transactions actually processed: (\d+)/(\d+)", out)
failed = re.search(r"number of failed transactions: (\d+)", out)
latency = re.search(r"latency average = ([\d.]+) ms", out)
print("pgbench -c %d -t %d: %.1f s, latency average %s ms, %d engine steps with %.1f sequences on average"
      % (CLIENTS, TURNS, elapsed, latency.group(1) if latency else "?", steps, seqs / steps if steps else 0))
c.check("pgbench with %d clients runs to the end" % CLIENTS, bench.returncode == 0, out[-800:])
c.check("every transaction is processed",
        processed is not None and processed.group(1) == processed.group(2) == str(CLIENTS * TURNS), out[-800:])
c.check("no transaction failed", failed is not None and failed.group(1) == "0", out[-800:])
rows = value("SELECT count(*) FROM cai.messages m JOIN scenario_pgbench_conversations s "
             "ON s.conversation_id = m.conversation_id")
c.check("every turn is stored (%d clients x %d turns x 2 rows)" % (CLIENTS, TURNS),
        rows == str(CLIENTS * TURNS * 2), rows)
shapes = value("SELECT string_agg(DISTINCT roles, ' | ') FROM (SELECT string_agg(role, ',' ORDER BY m.id) AS roles "
               "FROM cai.messages m JOIN scenario_pgbench_conversations s ON s.conversation_id = m.conversation_id "
               "GROUP BY m.conversation_id) r")
c.check("every conversation reads user, assistant, user, assistant", shapes == "user,assistant,user,assistant",
        shapes)
c.check("the engine batched the clients together", steps > 0 and seqs / steps >= 4,
        "%.2f sequences per step" % (seqs / steps if steps else 0))
value("DROP TABLE scenario_pgbench_conversations")

# ---- 2. batch invariance: alone vs among 31 others ------------------------------------------
SYSTEM = "You are a creative assistant."
MESSAGE = "Invent a name for a small red boat and describe it."
SEEDED = '{"max_tokens": 24, "temperature": 0.9, "seed": 1234, "ignore_eos": true}'


def seeded_reply(options=SEEDED):
    return value("SELECT cai_chat(cai_new_conversation('%s'), '%s', '%s')" % (SYSTEM, MESSAGE, options))


value("SELECT cai_cache_reset()")
alone = seeded_reply()
other_seed = seeded_reply(SEEDED.replace("1234", "4321"))
c.check("a seeded sampled reply depends on the seed", alone != other_seed, "%r == %r" % (alone, other_seed))
again = seeded_reply()      # its prompt is cached now
c.check("the same seed gives the same reply again (served from the prefix cache)", again == alone,
        "%r vs %r" % (again, alone))

value("SELECT cai_cache_reset()")
others = []
for i in range(CLIENTS - 1):
    others.append(in_background(
        "SELECT length(cai_chat(cai_new_conversation('You are assistant number %d.'), "
        "'Tell me about the number %d.', '{\"max_tokens\": %d, \"ignore_eos\": true}')) >= 0"
        % (i, i, 24 + 4 * (i % 8)), app="cai_invariance_%d" % i))
busy = wait_for(lambda: int(value("SELECT running FROM pg_stat_cai")) >= 8, 60, 0.05)
steps0 = int(value("SELECT steps FROM pg_stat_cai"))
seqs0 = float(value("SELECT coalesce(avg_batch * steps, 0) FROM pg_stat_cai"))
batched = seeded_reply()
steps = int(value("SELECT steps FROM pg_stat_cai")) - steps0
seqs = float(value("SELECT coalesce(avg_batch * steps, 0) FROM pg_stat_cai")) - seqs0
for t, _ in others:
    t.join(600)
print("the seeded request ran among %d others: %d steps with %.1f sequences on average"
      % (CLIENTS - 1, steps, seqs / steps if steps else 0))
print("seeded reply: %r" % alone)
c.check("the others were running when the seeded request came", busy is not None, "")
c.check("the seeded request shared its steps with others", steps > 0 and seqs / steps > 2,
        "%.2f sequences per step" % (seqs / steps if steps else 0))
c.check("the others all succeeded", all(h[0] is not None and h[0].rc == 0 for _, h in others),
        repr([h[0] for _, h in others if h[0] is None or h[0].rc != 0][:2]))
c.check("the seeded reply is identical alone and among %d concurrent others" % (CLIENTS - 1),
        batched == alone, "%r vs %r" % (batched, alone))
c.done()
