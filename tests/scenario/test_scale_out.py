"""Scale-out on PL/Proxy: a router and 3 pg_cai data nodes (scripts/scale-out.sh).

48 conversations x 4 turns through the router: each conversation's rows live on exactly one node
(the one its id names), the nodes' shares are even, every node's follow-up hit rate matches what
a single node gives on the same conversations (the cache affinity holds), a second role sees
nothing of the first's through the router, and with one node stopped mid-run only that node's
conversations fail, at once, with an error naming it; once it is back every conversation
continues and no committed turn is lost.  Greedy, so both runs compute the same prompts.

Then the router's one way to run a call on the nodes as somebody else, a user mapping on its
PL/Proxy server that names another role: a cai_user cannot create one (CREATE USER MAPPING FOR
CURRENT_USER SERVER cai OPTIONS (user 'alice') or (user 'postgres')), nor drop or alter one, and
a mapping planted anyway (by a superuser with the event triggers off, like one left from before
0.2) makes the affected role's routed calls fail with 42501 before PL/Proxy connects.  Once on
the cluster above, whose nodes trust the router, and once on a second one whose nodes ask for
SCRAM passwords that the router finds in its password file (the README's .pgpass setup).

A node that refuses a caller's login (a role missing there, or without a password line on the
router) is SQLSTATE 28000 saying so, with the node's message, not 08006 "unreachable".
"""
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from pgtest import Checks, Cluster
from pqlib import Conn, PqError

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.realpath(os.environ.get("CAI_MODEL", os.path.join(ROOT, "models",
                                                                 "SmolLM2-135M-Instruct.Q4_1.gguf")))
NODES = 3
CONVERSATIONS = 48
TURNS = 4
CLIENTS = 12
OPTIONS = '{"max_tokens": 20, "temperature": 0}'
# every engine, the nodes' and the single node's, with room for all 48 conversations' KV: the
# comparison is about where turns go, not about cache capacity
ENGINE_SETTINGS = {"pg_cai.threads": "1", "pg_cai.host_cache_size": "256MB",
                   "pg_cai.context_length": "1024", "pg_cai.max_batch": "16",
                   "pg_cai.weight_rounding": "nearest", "pg_cai.activation_precision": "int8"}
TOPICS = ["the sea", "volcanoes", "bees", "the moon", "chess", "bread", "rivers", "owls"]
MESSAGES = ["Tell me one fact about %s.", "Tell me another one.", "Why is that?",
            "Summarize what you said in five words."]

c = Checks()


def free_port_base(count):
    """A port p such that p .. p+count-1 are free on 127.0.0.1."""
    for _ in range(200):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
        s.close()
        if base + count >= 65535:
            continue
        ok = True
        for p in range(base, base + count):
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", p))
            except OSError:
                ok = False
            finally:
                t.close()
        if ok:
            return base
    raise RuntimeError("no free ports")


def quote(s):
    return "'" + s.replace("'", "''") + "'"


def run_workload(connect, ids, turns, results=None):
    """Runs turns (a list of turn numbers) of every conversation, CLIENTS at a time; returns
    {(conversation index, turn): (ok, reply or error, sqlstate, seconds)} (filled in results
    as calls finish, when given)."""
    results = {} if results is None else results
    work = queue.Queue()
    for k in range(len(ids)):
        work.put(k)

    def client():
        conn = connect()
        try:
            while True:
                try:
                    k = work.get_nowait()
                except queue.Empty:
                    return
                for t in turns:
                    msg = MESSAGES[t] % TOPICS[k % len(TOPICS)] if t == 0 else MESSAGES[t]
                    start = time.monotonic()
                    try:
                        reply = conn.value("SELECT cai_chat(%s, %s, '%s')" % (ids[k], quote(msg), OPTIONS))
                        results[(k, t)] = (True, reply, None, time.monotonic() - start)
                    except PqError as e:
                        results[(k, t)] = (False, str(e), e.sqlstate, time.monotonic() - start)
                        if "connection" in str(e).lower() and conn_broken(conn):
                            conn.close()
                            conn = connect()
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(900)
    return results


def conn_broken(conn):
    try:
        conn.value("SELECT 1")
        return False
    except PqError:
        return True


def sqlstate_of(conn, sql):
    """None when sql runs, else the error's SQLSTATE."""
    try:
        conn.exec(sql)
        return None
    except PqError as e:
        return e.sqlstate


def try_impersonation(label, router, victim, attacker, victim_id):
    """attacker (a cai_user) tries to run calls on the nodes as victim, or as postgres, through a
    user mapping on the router's server cai; victim_id is one of victim's conversations.
    router(user) connects to the router."""
    admin = router("postgres")
    att = router(attacker)

    def reach():
        """what the attacker reaches of the victim's conversation: (history rows, chat ok)"""
        try:
            rows = int(att.value("SELECT count(*) FROM cai_history(%s)" % victim_id))
        except PqError:
            rows = 0
        chat = sqlstate_of(att, "SELECT cai_chat(%s, 'Tell me her secrets.', '{\"max_tokens\": 1}')"
                           % victim_id) is None
        return rows, chat

    for target in (victim, "postgres"):
        state = sqlstate_of(att, "CREATE USER MAPPING FOR CURRENT_USER SERVER cai OPTIONS (user %s)"
                            % quote(target))
        got = reach()
        admin.exec("DROP USER MAPPING IF EXISTS FOR %s SERVER cai" % attacker)
        c.check("%s: %s cannot map itself to %s on the router (42501) and reaches nothing of %s's"
                % (label, attacker, target, victim), state == "42501" and got == (0, False), (state, got))
    states = [sqlstate_of(att, sql) for sql in (
        "ALTER USER MAPPING FOR PUBLIC SERVER cai OPTIONS (ADD user %s)" % quote(victim),
        "DROP USER MAPPING FOR PUBLIC SERVER cai",
        "ALTER SERVER cai OPTIONS (SET p0 'host=127.0.0.1 user=postgres')")]
    c.check("%s: %s can neither alter nor drop the PUBLIC mapping, nor alter the server (42501)"
            % (label, attacker), states == ["42501"] * 3, states)

    # a DBA's mistake is refused too
    state = sqlstate_of(admin, "CREATE USER MAPPING FOR %s SERVER cai OPTIONS (user %s)"
                        % (attacker, quote(victim)))
    admin.exec("DROP USER MAPPING IF EXISTS FOR %s SERVER cai" % attacker)
    c.check("%s: a superuser's mapping for %s naming %s is refused (42501)" % (label, attacker, victim),
            state == "42501", state)

    # planted past the event triggers: the attacker's routed calls refuse to run
    admin.exec("SET session_replication_role = replica")
    admin.exec("CREATE USER MAPPING FOR %s SERVER cai OPTIONS (user %s)" % (attacker, quote(victim)))
    admin.exec("RESET session_replication_role")
    # a new session: PL/Proxy keeps a session's user mapping until the one it uses changes
    att.close()
    att = router(attacker)
    calls = ["SELECT count(*) FROM cai_history(%s)" % victim_id,
             "SELECT cai_chat(%s, 'hello', '{\"max_tokens\": 1}')" % victim_id,
             "SELECT count(*) FROM cai_conversations()",
             "SELECT cai_new_conversation()",
             "SELECT cai_complete('hello', '{\"max_tokens\": 1}')",
             "SELECT count(*) FROM cai_cluster_stats()",
             # the PL/Proxy functions themselves, which cai_user may call directly
             "SELECT count(*) FROM cai_router.cai_history(%s)" % victim_id,
             "SELECT count(*) FROM cai_router.cai_conversations()"]
    states = [sqlstate_of(att, sql) for sql in calls]
    c.check("%s: with a planted mapping for %s naming %s, its routed calls fail with 42501"
            % (label, attacker, victim), states == ["42501"] * len(calls), list(zip(states, calls)))
    state = sqlstate_of(att, "DROP USER MAPPING FOR CURRENT_USER SERVER cai")
    c.check("%s: %s cannot drop that mapping either (42501)" % (label, attacker), state == "42501", state)
    admin.exec("DROP USER MAPPING IF EXISTS FOR %s SERVER cai" % attacker)
    admin.exec("SET session_replication_role = replica")
    admin.exec("ALTER USER MAPPING FOR PUBLIC SERVER cai OPTIONS (ADD user %s)" % quote(victim))
    admin.exec("RESET session_replication_role")
    att.close()
    att = router(attacker)
    state = sqlstate_of(att, "SELECT count(*) FROM cai_conversations()")
    admin.exec("ALTER USER MAPPING FOR PUBLIC SERVER cai OPTIONS (DROP user)")
    c.check("%s: with the PUBLIC mapping naming %s, %s's routed calls fail with 42501"
            % (label, victim, attacker), state == "42501", state)

    # what stays allowed: a superuser's mapping that names its own role; the victim's calls work
    state = sqlstate_of(admin, "CREATE USER MAPPING FOR %s SERVER cai OPTIONS (user %s)"
                        % (victim, quote(victim)))
    own = router(victim)
    try:
        rows = int(own.value("SELECT count(*) FROM cai_history(%s)" % victim_id))
    except PqError as e:
        rows = str(e)
    own.close()
    admin.exec("DROP USER MAPPING IF EXISTS FOR %s SERVER cai" % victim)
    c.check("%s: a mapping for %s naming itself is accepted, and %s reads its conversation (%s rows)"
            % (label, victim, victim, rows), state is None and isinstance(rows, int) and rows > 0,
            (state, rows))
    att.close()
    admin.close()


def follow_up_hit_rate(rows):
    """rows: (conversation_id, message_id, prompt_tokens, cached_tokens) of assistant turns;
    the rate over every turn but each conversation's first."""
    first = {}
    for cid, mid, _, _ in rows:
        first[cid] = min(first.get(cid, int(mid)), int(mid))
    prompt = sum(int(p) for cid, mid, p, _ in rows if int(mid) != first[cid])
    cached = sum(int(x) for cid, mid, _, x in rows if int(mid) != first[cid])
    return 100.0 * cached / prompt if prompt else 0.0


if shutil.which("pg_config") is None or not os.path.exists(
        os.path.join(subprocess.run(["pg_config", "--sharedir"], capture_output=True, text=True)
                     .stdout.strip(), "extension", "plproxy.control")):
    c.check("PL/Proxy is installed (postgresql-15-plproxy)", False, "plproxy.control not found")
    sys.exit(c.done())

cluster_dir = tempfile.mkdtemp(prefix="pg_cai_scale.")
os.rmdir(cluster_dir)		# scale-out.sh makes it
base = free_port_base(NODES + 1)
env = dict(os.environ, CAI_CLUSTER_DIR=cluster_dir, CAI_CLUSTER_PORT=str(base),
           CAI_NODE_THREADS="1", CAI_MODEL=MODEL,
           CAI_NODE_SETTINGS=" ".join("%s=%s" % kv for kv in ENGINE_SETTINGS.items()))
script = os.path.join(ROOT, "scripts", "scale-out.sh")
single = None
try:
    r = subprocess.run([script, "start", str(NODES)], env=env, capture_output=True, text=True,
                       timeout=600)
    c.check("router and %d nodes start" % NODES, r.returncode == 0, r.stderr[-2000:])
    if r.returncode != 0:
        sys.exit(c.done())
    ports = [base] + [base + i for i in range(1, NODES + 1)]
    names = ["node%d" % i for i in range(1, NODES + 1)]
    for p in ports:
        admin = Conn("cai", env={"PGHOST": "127.0.0.1", "PGPORT": str(p), "PGUSER": "postgres"})
        admin.exec("CREATE ROLE alice LOGIN IN ROLE cai_user; CREATE ROLE bob LOGIN IN ROLE cai_user")
        admin.close()

    def router(user):
        return Conn("cai", app="cai_scale_%s" % user,
                    env={"PGHOST": "127.0.0.1", "PGPORT": str(base), "PGUSER": user})

    def node(i):
        return Conn("cai", env={"PGHOST": "127.0.0.1", "PGPORT": str(base + 1 + i), "PGUSER": "postgres"})

    # ---- conversations, placed round-robin; each id names its node
    alice = router("alice")
    ids = [alice.value("SELECT cai_new_conversation(%s)" % quote("You are assistant %d. Answer in one sentence." % k))
           for k in range(CONVERSATIONS)]
    alice.close()
    share = [sum(1 for i in ids if int(i) >> 48 == n) for n in range(NODES)]
    even = CONVERSATIONS / NODES
    c.check("the nodes' shares of new conversations are within 50%% of even (%s)" % share,
            all(0.5 * even <= s <= 1.5 * even for s in share), share)

    start = time.monotonic()
    results = run_workload(lambda: router("alice"), ids, list(range(TURNS)))
    elapsed = time.monotonic() - start
    failed = [(k, v) for k, v in results.items() if not v[0]]
    c.check("%d conversations x %d turns through the router" % (CONVERSATIONS, TURNS),
            len(results) == CONVERSATIONS * TURNS and not failed, failed[:3])
    print("%d turns through the router in %.1f s" % (len(results), elapsed))

    # ---- each conversation's rows on exactly one node, the one its id names
    held = {}
    per_node_rows = []
    for n in range(NODES):
        conn = node(n)
        rows = conn.exec("SELECT conversation_id, count(*) FROM cai.messages GROUP BY 1")
        for cid, cnt in rows:
            held.setdefault(cid, []).append((n, int(cnt)))
        per_node_rows.append(conn.exec(
            "SELECT conversation_id, id, prompt_tokens, cached_tokens FROM cai.messages "
            "WHERE role = 'assistant' ORDER BY id"))
        conn.close()
    misplaced = [i for i in ids if held.get(i) != [(int(i) >> 48, 2 * TURNS)]]
    c.check("each conversation's %d rows are on exactly one node, the one its id names" % (2 * TURNS),
            not misplaced, [(i, held.get(i)) for i in misplaced[:3]])

    # ---- a second role sees nothing of the first's
    bob = router("bob")
    seen = bob.value("SELECT count(*) FROM cai_conversations()")
    history = sum(int(bob.value("SELECT count(*) FROM cai_history(%s)" % i)) for i in ids[:NODES])
    try:
        bob.value("SELECT cai_chat(%s, 'Tell me her secrets.')" % ids[0])
        refused = False
    except PqError as e:
        refused = "does not exist" in str(e)
    c.check("bob sees none of alice's conversations through the router",
            seen == "0" and history == 0 and refused, (seen, history, refused))
    try:
        bob.value("SELECT cai_chat(%d, 'hello')" % (7 << 48 | 1))
        nowhere = None
    except PqError as e:
        nowhere = e.sqlstate
    c.check("an id naming no node is refused at the router like any unknown conversation (42704)",
            nowhere == "42704", nowhere)
    bob.close()
    alice = router("alice")
    mine = alice.value("SELECT count(*) FROM cai_conversations()")
    c.check("alice sees her %d conversations on all nodes" % CONVERSATIONS, mine == str(CONVERSATIONS), mine)
    stats = alice.exec("SELECT node FROM cai_cluster_stats() ORDER BY node")
    c.check("cai_cluster_stats() has a row per node, named", [s[0] for s in stats] == names, stats)
    alice.close()

    # ---- the same conversations on a single node: the follow-up hit rates must match
    single = Cluster(dict(ENGINE_SETTINGS, shared_preload_libraries="'pg_cai'",
                          **{"pg_cai.model": "'%s'" % MODEL}))
    single.start()
    single.wait_log("pg_cai engine worker ready", 120)
    single.psql("CREATE DATABASE cai")
    solo = Conn("cai", env=single.env())
    solo.exec("CREATE EXTENSION pg_cai")
    solo_ids = [solo.value("SELECT cai_new_conversation(%s)" % quote("You are assistant %d. Answer in one sentence." % k))
                for k in range(CONVERSATIONS)]
    solo_results = run_workload(lambda: Conn("cai", env=single.env()), solo_ids, list(range(TURNS)))
    solo_rows = solo.exec("SELECT conversation_id, id, prompt_tokens, cached_tokens FROM cai.messages "
                          "WHERE role = 'assistant' ORDER BY id")
    solo.close()
    same_replies = all(solo_results.get(key, (False,))[1] == v[1] for key, v in results.items())
    c.check("the single node gives the same greedy replies", same_replies)
    index_of = {cid: k for k, cid in enumerate(ids)}
    # turn by turn, where the cluster's and the single node's cache hits differ
    def by_turn(rows, key):
        out, seen = {}, {}
        for cid, mid, p, x in rows:
            t = seen.get(cid, 0)
            seen[cid] = t + 1
            out[(key(cid), t)] = (int(p), int(x))
        return out
    cluster_turns = {}
    for n in range(NODES):
        cluster_turns.update(by_turn(per_node_rows[n], lambda cid: index_of[cid]))
    solo_turns = by_turn(solo_rows, lambda cid: solo_ids.index(cid))
    differ = sorted(k for k in cluster_turns if cluster_turns[k] != solo_turns.get(k))
    print("turns whose (prompt, cached) tokens differ between the cluster and the single node: %d; %s"
          % (len(differ), [(k, cluster_turns[k], solo_turns.get(k)) for k in differ[:6]]))
    for n in range(NODES):
        mine_k = {index_of[cid] for cid, _, _, _ in per_node_rows[n]}
        solo_subset = [r for r in solo_rows if solo_ids.index(r[0]) in mine_k]
        node_rate = follow_up_hit_rate(per_node_rows[n])
        solo_rate = follow_up_hit_rate(solo_subset)
        print("%s: follow-up hit rate %.1f%%, single node on the same conversations %.1f%%"
              % (names[n], node_rate, solo_rate))
        c.check("%s's follow-up hit rate is within 2 points of a single node's" % names[n],
                abs(node_rate - solo_rate) <= 2.0 and node_rate > 50.0, (node_rate, solo_rate))
    single.stop()

    # ---- a node stopped mid-run: only its conversations fail, quickly, naming it
    victim = 1
    victim_data = os.path.join(cluster_dir, names[victim])
    bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    fifth = {}
    phase = {}

    def stop_soon():
        # mid-run: once a quarter of the calls are done
        wait_until = time.monotonic() + 60
        while len(phase) < CONVERSATIONS // 4 and time.monotonic() < wait_until:
            time.sleep(0.01)
        subprocess.run(as_pg + [os.path.join(bindir, "pg_ctl"), "-D", victim_data, "-m", "fast", "-w", "stop"],
                       capture_output=True)
        fifth["stopped_at"] = time.monotonic()
        fifth["done_before"] = len(phase)

    MESSAGES.append("One more thing, please.")
    stopper = threading.Thread(target=stop_soon)
    stopper.start()
    run_workload(lambda: router("alice"), ids, [TURNS], phase)
    stopper.join()
    print("%s stopped after %d of %d calls" % (names[victim], fifth.get("done_before", -1), CONVERSATIONS))
    victims = {k for k, cid in enumerate(ids) if int(cid) >> 48 == victim}
    bad = [(k, v) for k, v in phase.items() if not v[0] and k[0] not in victims]
    c.check("with %s stopped, every other node's conversations keep working" % names[victim], not bad, bad[:3])
    victim_fail = [v for k, v in phase.items() if not v[0]]
    named = all(('"%s"' % names[victim]) in v[1] and v[2] == "08006" for v in victim_fail)
    c.check("%s's conversations fail with an error naming it (SQLSTATE 08006)" % names[victim],
            victim_fail and named, victim_fail[:2])
    late = [v for v in victim_fail if v[3] > 5.0]
    c.check("the failures come at once (all within 5 s; slowest %.2f s)"
            % max([v[3] for v in victim_fail] or [0]), not late, late[:2])
    if victim_fail:
        print("example: %s" % victim_fail[0][1].splitlines()[0])

    # ---- back: every conversation continues, nothing committed is lost
    subprocess.run(as_pg + [os.path.join(bindir, "pg_ctl"), "-D", victim_data, "-l",
                            os.path.join(victim_data, "server.log"), "-w", "start"], capture_output=True)
    retry = [k for k, v in phase.items() if not v[0]]
    redo = run_workload(lambda: router("alice"), [ids[k[0]] for k in retry], [TURNS])
    c.check("after the restart, %s's conversations continue" % names[victim],
            redo and all(v[0] for v in redo.values()), [v for v in redo.values() if not v[0]][:2])
    alice = router("alice")
    lost = []
    for k, cid in enumerate(ids):
        stored = int(alice.value("SELECT count(*) FROM cai_history(%s) WHERE role = 'assistant'" % cid))
        if stored != TURNS + 1:
            lost.append((cid, stored))
    alice.close()
    c.check("0 committed turns lost: every conversation has its %d replies" % (TURNS + 1), not lost, lost[:3])

    # ---- bob tries to become alice, or postgres, on the nodes (they trust the router)
    try_impersonation("trust", router, "alice", "bob", ids[0])

    # ---- a role the router has and the nodes do not: the node refuses its login, and says so
    admin = router("postgres")
    admin.exec("CREATE ROLE cai_router_only LOGIN IN ROLE cai_user")
    admin.close()
    lonely = router("cai_router_only")
    try:
        lonely.value("SELECT cai_new_conversation()")
        refused = (None, "it ran")
    except PqError as e:
        refused = (e.sqlstate, str(e))
    lonely.close()
    c.check("a role missing on the nodes: SQLSTATE 28000, the node refused the login, its message "
            "as the detail (not 08006 unreachable)",
            refused[0] == "28000" and 'refused the login of role "cai_router_only"' in refused[1]
            and 'role "cai_router_only" does not exist' in refused[1], refused)
finally:
    subprocess.run([script, "stop"], env=env, capture_output=True)
    if single:
        single.stop()
        single.remove()

# ---- the same on nodes that ask for SCRAM passwords, which the router finds in its password file
pg_dir = tempfile.mkdtemp(prefix="pg_cai_scale.")
os.rmdir(pg_dir)
pg_base = free_port_base(3)
pg_env = dict(env, CAI_CLUSTER_DIR=pg_dir, CAI_CLUSTER_PORT=str(pg_base), CAI_CLUSTER_AUTH="scram")
try:
    r = subprocess.run([script, "start", "2"], env=pg_env, capture_output=True, text=True, timeout=600)
    c.check("router and 2 nodes start with SCRAM between them", r.returncode == 0, r.stderr[-2000:])
    if r.returncode != 0:
        sys.exit(c.done())
    for role, password in (("ra", "ra's secret"), ("rb", "rb:pw\\2")):
        r = subprocess.run([script, "add-role", role, password], env=pg_env, capture_output=True,
                           text=True, timeout=60)
        c.check("scale-out.sh add-role %s" % role, r.returncode == 0, r.stderr[-500:])
    admin = Conn("cai", env={"PGHOST": "127.0.0.1", "PGPORT": str(pg_base), "PGUSER": "postgres"})
    admin.exec("CREATE ROLE rc LOGIN IN ROLE cai_user")
    admin.close()

    def pg_router(user):
        return Conn("cai", app="cai_scale_%s" % user,
                    env={"PGHOST": "127.0.0.1", "PGPORT": str(pg_base), "PGUSER": user})

    # rc exists on the router only; without a password line it cannot reach the nodes
    rc_conn = pg_router("rc")
    try:
        rc_conn.value("SELECT cai_new_conversation()")
        why, state = "it connected", None
    except PqError as e:
        why, state = str(e), e.sqlstate
    rc_conn.close()
    c.check("the nodes ask the router for passwords (a role without a line is refused)",
            "password" in why, why[:300])
    c.check("a role without a password line: SQLSTATE 28000, the node refused its login, the "
            "node's message as the detail",
            state == "28000" and 'refused the login of role "rc"' in why
            and "no password supplied" in why, (state, why[:400]))
    ra = pg_router("ra")
    victim_id = ra.value("SELECT cai_new_conversation('You are terse.')")
    ra.value("SELECT cai_chat(%s, 'My secret is 42.', '{\"max_tokens\": 4}')" % victim_id)
    ra.close()
    try_impersonation(".pgpass", pg_router, "ra", "rb", victim_id)
finally:
    subprocess.run([script, "stop"], env=pg_env, capture_output=True)
sys.exit(c.done())
