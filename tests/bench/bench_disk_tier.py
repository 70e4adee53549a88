#!/usr/bin/env python3
"""bench_disk_tier.py — a follow-up's time to first token from the host cache, from the prefix
cache's disk tier after the engine was killed, and cold, through SQL.

One throwaway cluster (pg_cai.disk_cache_dir and pg_cai.disk_cache_size at their defaults).  Each
round plays a conversation whose first turn is about --first-words words (about 1,000 tokens with
SmolLM2's tokenizer), waits until the tier has written the turn's blocks, then asks three
follow-ups of similar length, each on the same history (the previous follow-up's rows are
deleted, so every prompt is the history plus one new question):

  ram    the engine as the first turn left it: the history's blocks in memory;
  disk   after SIGKILL of the engine process and its restart: memory is empty, the history's
         blocks are read back from the disk tier when the request is admitted;
  cold   after cai_cache_reset(): nothing cached, the whole prompt computed.

Time to first token is cai.messages.ttft_ms (from the engine worker receiving the request to the
first generated token: the disk reads are inside it), with max_tokens 1.  The tier's files were
just written, so the disk reads come from the page cache: this measures the tier's own cost
(reading, checksumming, verifying, copying into the pool), not the device's latency.  Reports the
median over rounds, the ratios the goals name (cold / disk and disk / RAM, each the median of the
rounds' own ratios), the load average at each round, and the JSON of every round.  Not a test: it
passes or fails nothing.

    python3 tests/bench/bench_disk_tier.py [--rounds 5] [--threads 2] [--first-words 750]
        [--model models/synth/llama32-1b-q4_k_m.gguf]
"""
import argparse
import json
import os
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "scenario"))
from bench_cache import SYSTEM_PROMPT, Server, conversation_messages  # noqa: E402

FOLLOW_UPS = {
    "ram": "Thank you. Which of the points in my notes should I deal with first, and why?",
    "disk": "Thanks. Which of the items in my notes would you postpone, and for how long?",
    "cold": "Thank you. Which of the things in my notes is the riskiest one, and why so?",
}


def q(text):
    return "$q$" + text + "$q$"


def one(server, sql):
    rows = server.sql(sql)
    return rows[0] if rows else None


def wait_for(predicate, timeout, interval=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(interval)
    return None


def follow_up(server, conv, text):
    """Asks text in conv with max_tokens 1; returns the reply's usage, then deletes the turn."""
    last = int(one(server, "SELECT coalesce(max(id), 0) FROM cai.messages "
                           "WHERE conversation_id = %d" % conv)[0])
    t0 = time.monotonic()
    server.sql("SELECT cai_chat(%d, %s, '{\"max_tokens\": 1}')" % (conv, q(text)))
    wall_ms = (time.monotonic() - t0) * 1000.0
    prompt, cached, ttft = one(server, "SELECT prompt_tokens, cached_tokens, ttft_ms FROM "
                                       "cai.messages WHERE conversation_id = %d AND role = "
                                       "'assistant' ORDER BY id DESC LIMIT 1" % conv)
    server.sql("DELETE FROM cai.messages WHERE conversation_id = %d AND id > %d" % (conv, last))
    return {"prompt_tokens": int(prompt), "cached_tokens": int(cached),
            "ttft_ms": float(ttft), "statement_ms": wall_ms}


def stat(server, column):
    """column of pg_stat_cai, or None while the view has no row (an engine restarting)."""
    row = one(server, "SELECT %s FROM pg_stat_cai" % column)
    return row[0] if row else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models",
                                                    "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--first-words", type=int, default=750)
    ap.add_argument("--reply-tokens", type=int, default=32)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.model = os.path.abspath(args.model)

    server = Server("disk", args, 256)
    rounds = []
    try:
        server.start()
        server.sql("CREATE EXTENSION IF NOT EXISTS pg_cai")
        for r in range(args.rounds):
            first = conversation_messages(r, 1, args.first_words, 20)[0]
            conv = int(one(server, "SELECT cai_new_conversation(%s)" % q(SYSTEM_PROMPT))[0])
            server.sql("SELECT cai_chat(%d, %s, '{\"max_tokens\": %d, \"ignore_eos\": true}')"
                       % (conv, q(first), args.reply_tokens))
            history = int(one(server, "SELECT prompt_tokens + completion_tokens FROM "
                                      "cai.messages WHERE conversation_id = %d AND role = "
                                      "'assistant'" % conv)[0])
            # the turn's full blocks reach the disk off the request's path
            wait_for(lambda: int(stat(server, "disk_files")) >= (history - 1) // 16, 30)
            got = {"history_tokens": history, "load_average": os.getloadavg()[0]}
            got["ram"] = follow_up(server, conv, FOLLOW_UPS["ram"])

            engine_pid = int(stat(server, "engine_pid"))
            os.kill(engine_pid, signal.SIGKILL)
            wait_for(lambda: stat(server, "status") == "ready" and
                     stat(server, "engine_pid") not in (None, "", str(engine_pid)), 180)
            read_before = int(stat(server, "disk_bytes_read"))
            got["disk"] = follow_up(server, conv, FOLLOW_UPS["disk"])
            wait_for(lambda: int(stat(server, "disk_bytes_read")) > read_before, 10)
            got["disk"]["bytes_read"] = int(stat(server, "disk_bytes_read")) - read_before

            server.sql("SELECT cai_cache_reset()")
            got["cold"] = follow_up(server, conv, FOLLOW_UPS["cold"])
            rounds.append(got)
            print("round %d: load %.2f, history %d tokens; ttft ram %.1f ms (%d cached), disk "
                  "%.1f ms (%d cached, %.1f MB read), cold %.1f ms (%d cached)"
                  % (r + 1, got["load_average"], history, got["ram"]["ttft_ms"], got["ram"]["cached_tokens"],
                     got["disk"]["ttft_ms"], got["disk"]["cached_tokens"],
                     got["disk"]["bytes_read"] / 1e6, got["cold"]["ttft_ms"],
                     got["cold"]["cached_tokens"]), flush=True)
            server.sql("SELECT cai_cache_reset()")
    finally:
        server.cluster.stop()
        server.cluster.remove()

    def med(kind, field):
        return statistics.median(g[kind][field] for g in rounds)

    print()
    print("| follow-up served | prompt tokens | cached tokens | TTFT (median of %d) | vs cold |"
          % len(rounds))
    print("|---|---|---|---|---|")
    cold = med("cold", "ttft_ms")
    for kind, label in (("ram", "host cache (RAM)"),
                        ("disk", "disk tier, after kill -9 of the engine"),
                        ("cold", "cold (cache emptied)")):
        print("| %s | %d | %d | %.1f ms | %.2fx |"
              % (label, med(kind, "prompt_tokens"), med(kind, "cached_tokens"),
                 med(kind, "ttft_ms"), cold / med(kind, "ttft_ms")))
    disk_vs_ram = statistics.median(g["disk"]["ttft_ms"] / g["ram"]["ttft_ms"] for g in rounds)
    cold_vs_disk = statistics.median(g["cold"]["ttft_ms"] / g["disk"]["ttft_ms"] for g in rounds)
    loads = [g["load_average"] for g in rounds]
    print()
    print("%s, %d threads: disk / RAM %.2fx (goal <= 2x), cold / disk %.1fx (goal >= 10x at 1B), "
          "medians of the rounds' ratios; load average %.1f-%.1f"
          % (os.path.basename(args.model), args.threads, disk_vs_ram, cold_vs_disk, min(loads),
             max(loads)))
    result = {"model": os.path.basename(args.model), "threads": args.threads,
              "disk_vs_ram": disk_vs_ram, "cold_vs_disk": cold_vs_disk, "rounds": rounds}
    out = args.out or os.path.join(HERE, "out", "disk-tier-%d.json" % int(time.time()))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print("\n" + json.dumps(result))


if __name__ == "__main__":
    main()
