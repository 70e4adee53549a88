#!/usr/bin/env python3
"""bench_abuse.py — what one role's worst requests cost everyone else, through SQL.

On a throwaway cluster with the default limits, 8 sessions of role "victim" chat (cai_chat,
--reply-tokens tokens each, greedy) for --seconds, first alone, then while one session of role
"abuser" loops over the worst requests a cai_user can make:

    history60k   cai_chat on a conversation of 60,000 stored turns (the abuser inserted them)
    messages100k cai_chat_completion with 100,000 messages
    text5mb      cai_chat_completion with one 5 MB message
    complete5mb  cai_complete with a 5 MB prompt
    at_limit     cai_chat_completion just inside the limits: pg_cai.max_request_messages
                 messages of about pg_cai.max_request_bytes in all, truncated by the engine

Prints the victims' reply latency (p50, p99, count, failures) in each phase, engine restarts
(pg_stat_cai.engine_starts), and what the abuser got per kind (answers, errors by SQLSTATE, its
own p50).  Run it against the code before and after a change to compare:

    sudo python3 tests/bench/bench_abuse.py --seconds 60

Needs pg_cai installed (make install), libpq and the scenario helpers (pgtest, pqlib).  Not a test.
"""
import argparse
import collections
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "scenario"))
from pgtest import Cluster, wait_for  # noqa: E402
from pqlib import Conn, PqError  # noqa: E402

ABUSES = {
    "history60k": "SELECT length(cai_chat(%(conv)s, 'And what came next?', '{\"max_tokens\": 8}'))",
    "messages100k": "SELECT cai_chat_completion((SELECT jsonb_agg(jsonb_build_object('role', 'user', "
                    "'content', 'message ' || g)) FROM generate_series(1, 100000) g), "
                    "'{\"max_tokens\": 8}') IS NOT NULL",
    "text5mb": "SELECT cai_chat_completion(jsonb_build_array(jsonb_build_object('role', 'user', "
               "'content', repeat('lorem ipsum ', 450000))), '{\"max_tokens\": 8}') IS NOT NULL",
    "complete5mb": "SELECT length(cai_complete(repeat('lorem ipsum ', 450000), '{\"max_tokens\": 8}'))",
    # max_request_messages (1000) messages of 1000 bytes, with the payload's per-turn framing
    "at_limit": "SELECT cai_chat_completion((SELECT jsonb_agg(jsonb_build_object('role', "
                "CASE WHEN g %% 2 = 1 THEN 'user' ELSE 'assistant' END, 'content', "
                "repeat('word ' || g || ' ', 1000 / (6 + length(g::text))))) "
                "FROM generate_series(1, 999) g), '{\"max_tokens\": 8}') IS NOT NULL",
}


def quote(text):
    return "'" + text.replace("'", "''") + "'"


def pct(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def connect(cluster, role):
    env = cluster.env()
    env["PGUSER"] = role
    return Conn("postgres", app="bench_abuse_" + role, env=env)


def victim(cluster, index, args, stop, out):
    conn = connect(cluster, "victim")
    conv = None
    turn = 0
    opts = json.dumps({"max_tokens": args.reply_tokens, "ignore_eos": True})
    while not stop.is_set():
        if turn % 10 == 0:
            conv = conn.value("SELECT cai_new_conversation()")
        start = time.monotonic()
        try:
            conn.exec("SELECT cai_chat(%s, 'Tell me fact %d about bees.', %s)" % (conv, turn, quote(opts)))
            out.append(("ok", time.monotonic() - start))
        except PqError as e:
            out.append((e.sqlstate or "?", time.monotonic() - start))
        turn += 1
    conn.close()


def abuser(cluster, conv, stop, out):
    conn = connect(cluster, "abuser")
    kinds = list(ABUSES)
    i = 0
    while not stop.is_set():
        kind = kinds[i % len(kinds)]
        i += 1
        start = time.monotonic()
        try:
            conn.exec(ABUSES[kind] % {"conv": conv})
            out.append((kind, "ok", time.monotonic() - start))
        except PqError as e:
            out.append((kind, e.sqlstate or "?", time.monotonic() - start))
    conn.close()


def phase(cluster, args, conv, with_abuser):
    stop = threading.Event()
    results = [[] for _ in range(args.sessions)]
    abuse = []
    threads = [threading.Thread(target=victim, args=(cluster, i, args, stop, results[i]))
               for i in range(args.sessions)]
    if with_abuser:
        threads.append(threading.Thread(target=abuser, args=(cluster, conv, stop, abuse)))
    for t in threads:
        t.start()
    time.sleep(args.seconds)
    stop.set()
    for t in threads:
        t.join()
    return [r for rs in results for r in rs], abuse


def report(name, calls):
    ok = [t for s, t in calls if s == "ok"]
    failed = collections.Counter(s for s, _ in calls if s != "ok")
    print("%-16s %8.2f %8.2f %7d  %s" % (name, pct(ok, 0.5), pct(ok, 0.99), len(ok),
                                          dict(failed) if failed else "-"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--reply-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    cluster = Cluster({"shared_preload_libraries": "'pg_cai'", "pg_cai.model": quote(args.model),
                       "pg_cai.threads": str(args.threads)})
    try:
        if not cluster.start():
            raise SystemExit("the cluster did not start: see %s" % cluster.log)
        cluster.psql("CREATE EXTENSION pg_cai")
        cluster.psql("CREATE ROLE abuser LOGIN IN ROLE cai_user; CREATE ROLE victim LOGIN IN ROLE cai_user")
        if not wait_for(lambda: cluster.psql("SELECT status FROM pg_stat_cai").out == "ready", 300, 0.5):
            raise SystemExit("the engine is not ready: see %s" % cluster.log)
        conn = connect(cluster, "abuser")
        conv = conn.value("SELECT cai_new_conversation()")
        conn.exec("INSERT INTO cai.messages (conversation_id, role, content) "
                  "SELECT %s, CASE WHEN g %% 2 = 1 THEN 'user' ELSE 'assistant' END, "
                  "'turn number ' || g FROM generate_series(1, 60000) g" % conv)
        conn.close()
        starts0 = cluster.psql("SELECT engine_starts FROM pg_stat_cai").out
        alone, _ = phase(cluster, args, conv, False)
        starts1 = cluster.psql("SELECT engine_starts FROM pg_stat_cai").out
        abused, abuse = phase(cluster, args, conv, True)
        starts2 = cluster.psql("SELECT engine_starts FROM pg_stat_cai").out
    finally:
        cluster.stop()
        cluster.remove()

    print("%d victim sessions, %d-token replies, %.0f s per phase; latency in seconds"
          % (args.sessions, args.reply_tokens, args.seconds))
    print("%-16s %8s %8s %7s  %s" % ("phase", "p50", "p99", "replies", "failed (SQLSTATE: n)"))
    report("alone", alone)
    report("with abuser", abused)
    print("engine restarts: alone %d, with abuser %d"
          % (int(starts1) - int(starts0), int(starts2) - int(starts1)))
    print()
    print("%-16s %7s %8s  %s" % ("abuser's kind", "calls", "p50 s", "outcome (n)"))
    by_kind = collections.defaultdict(list)
    for kind, state, t in abuse:
        by_kind[kind].append((state, t))
    for kind in ABUSES:
        calls = by_kind.get(kind, [])
        print("%-16s %7d %8.2f  %s" % (kind, len(calls), pct([t for _, t in calls], 0.5),
                                         dict(collections.Counter(s for s, _ in calls))))


if __name__ == "__main__":
    main()
