#!/usr/bin/env python3
"""bench_truncation.py — what truncation does to the prefix cache, through SQL.

Plays C conversations of T turns (bench_cache.py's generator: a long first user message, shorter
follow-ups) through cai_chat on a throwaway cluster whose pg_cai.context_length is small, so the
history passes the context after a dozen turns and every later turn is truncated.  Replies are
exactly --reply-tokens tokens (greedy, ignore_eos).  Reports each follow-up turn's cached / prompt
tokens (from cai.messages) and their median: with truncation that drops one turn more each time,
every truncated prompt starts differently from the last one and reuses only the system prompt;
with hysteresis most turns reuse all but their new tokens.  Run it twice, with --ctx small and with
a context that holds the whole conversation (--ctx 8192), for the no-truncation rate:

    sudo python3 tests/bench/bench_truncation.py --ctx 1024
    sudo python3 tests/bench/bench_truncation.py --ctx 8192

Needs pg_cai installed (make install; the engine that runs is the installed one), psql, and the
Python standard library.  Token counts are deterministic, timings are not reported.  Not a test.
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "scenario"))
from bench_cache import SYSTEM_PROMPT, conversation_messages  # noqa: E402
from pgtest import Cluster, wait_for  # noqa: E402


def quote(text):
    return "'" + text.replace("'", "''") + "'"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--conversations", type=int, default=1)
    ap.add_argument("--turns", type=int, default=60)
    ap.add_argument("--reply-tokens", type=int, default=32)
    ap.add_argument("--first-words", type=int, default=100)
    ap.add_argument("--user-words", type=int, default=20)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    cluster = Cluster({"shared_preload_libraries": "'pg_cai'", "pg_cai.model": quote(args.model),
                       "pg_cai.threads": str(args.threads),
                       "pg_cai.context_length": str(args.ctx),
                       "pg_cai.host_cache_size": "'1024MB'"})
    try:
        if not cluster.start():
            raise SystemExit("the cluster did not start: see %s" % cluster.log)
        cluster.psql("CREATE EXTENSION pg_cai")
        if not wait_for(lambda: cluster.psql("SELECT status FROM pg_stat_cai").out == "ready",
                        300, 0.5):
            raise SystemExit("the engine is not ready: see %s" % cluster.log)
        options = json.dumps({"max_tokens": args.reply_tokens, "ignore_eos": True})
        conversations = []
        for c in range(args.conversations):
            conv = cluster.psql("SELECT cai_new_conversation(%s)" % quote(SYSTEM_PROMPT)).out
            for t, message in enumerate(conversation_messages(c, args.turns, args.first_words,
                                                              args.user_words)):
                r = cluster.psql("SELECT length(cai_chat(%s, %s, %s))"
                                 % (conv, quote(message), quote(options)))
                if r.rc != 0:
                    raise SystemExit("turn %d failed: %r" % (t + 1, r))
            rows = cluster.psql("SELECT prompt_tokens, cached_tokens FROM cai.messages WHERE "
                                "conversation_id = %s AND role = 'assistant' ORDER BY id"
                                % conv).out.splitlines()
            conversations.append([tuple(int(x) for x in row.split("|")) for row in rows])
    finally:
        cluster.stop()
        cluster.remove()

    rates = []
    print("turn  prompt  cached  hit")
    for turns in conversations:
        for t, (prompt, cached) in enumerate(turns):
            print("%4d %7d %7d %5.1f%%" % (t + 1, prompt, cached, 100.0 * cached / prompt))
            if t > 0:
                rates.append(cached / prompt)
    print("ctx %d: median follow-up hit rate %.1f%% over %d turns (mean %.1f%%)"
          % (args.ctx, 100.0 * statistics.median(rates), len(rates),
             100.0 * statistics.mean(rates)))
    json.dump({"args": vars(args), "turns": conversations,
               "median_follow_up_hit_rate": statistics.median(rates)}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
