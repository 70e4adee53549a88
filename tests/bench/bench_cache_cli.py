#!/usr/bin/env python3
"""bench_cache_cli.py — the inter-turn cache's hit rate without PostgreSQL, through `cai chat`.

Plays bench_cache.py's conversations (the same generator: a long first user message, shorter
follow-ups) through `cai chat` processes, one per conversation, greedy, and sums the usage line
`cai chat` prints after each reply: the hit rate is cached / prompt tokens over follow-up turns
(2..T), the same figure bench_cache.py reports.  Token counts are deterministic, so unlike
timings they can be compared between builds on a loaded machine:

    python3 tests/bench/bench_cache_cli.py --cai ./cai                  # default workload
    python3 tests/bench/bench_cache_cli.py --first-words 900 --user-words 14

The table also gives the median over follow-up turns of each turn's cached / prompt tokens
("median turn"), the figure that shows what truncation does to the cache in a conversation longer
than --ctx (a turn that moves the cut reuses little; the others should reuse nearly all).

`--compare OTHER_CAI` plays the same conversations on a second build and `--off` on the same
build with the cache off; each says whether its replies equal the first run's.  Differences from bench_cache.py: `cai chat` cannot ignore the end of
turn token, so a reply may stop before --reply-tokens (equally on every build), and each
conversation has its own engine (its own cache), so nothing is ever evicted.  Prints a table and
the JSON of the figures.  Not a test: it passes or fails nothing.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "scenario"))
from bench_cache import conversation_messages  # noqa: E402

USAGE = re.compile(r"\[prompt (\d+) tokens \((\d+) cached\), completion (\d+)")


def play(cai, model, messages, args):
    """One conversation through one `cai chat`: its replies and per-turn usage."""
    cmd = [cai, "chat", "-m", model, "-n", str(args.reply_tokens), "-T", str(args.threads),
           "--cache-mb", str(args.cache_mb), "-c", str(args.ctx)]
    stdin = "".join(m.replace("\n", " ") + "\n" for m in messages)
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=True)
    turns = [tuple(int(x) for x in m.groups()) for m in USAGE.finditer(p.stderr)]
    if len(turns) != len(messages):
        raise SystemExit("%s: %d usage lines for %d turns\n%s" % (cai, len(turns), len(messages),
                                                                  p.stderr[-2000:]))
    return p.stdout, turns


def figures(cai, model, all_messages, args):
    prompt = cached = 0
    per_turn = []
    replies = []
    for messages in all_messages:
        out, turns = play(cai, model, messages, args)
        replies.append(out)
        for t, (p, c, n) in enumerate(turns):
            per_turn.append({"turn": t + 1, "prompt": p, "cached": c, "completion": n})
            if t > 0:
                prompt += p
                cached += c
    rates = [t["cached"] / t["prompt"] for t in per_turn if t["turn"] > 1 and t["prompt"] > 0]
    return {"cai": cai, "follow_up_prompt_tokens": prompt, "follow_up_cached_tokens": cached,
            "hit_rate": cached / prompt if prompt else 0.0,
            "median_turn_hit_rate": statistics.median(rates) if rates else 0.0,
            "turns": per_turn}, replies


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cai", default=os.path.join(ROOT, "cai"))
    ap.add_argument("--compare", default=None, help="a second cai build to play the same turns")
    ap.add_argument("--off", action="store_true",
                    help="also play --cai with the cache off and check the replies are the same")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--conversations", type=int, default=2)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--reply-tokens", type=int, default=64)
    ap.add_argument("--first-words", type=int, default=380)
    ap.add_argument("--user-words", type=int, default=36)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-mb", type=int, default=1024)
    ap.add_argument("--ctx", type=int, default=4096)
    args = ap.parse_args()

    all_messages = [conversation_messages(c, args.turns, args.first_words, args.user_words)
                    for c in range(args.conversations)]
    runs = []
    base, base_replies = figures(args.cai, args.model, all_messages, args)
    runs.append(base)
    if args.compare:
        other, other_replies = figures(args.compare, args.model, all_messages, args)
        other["same_replies"] = other_replies == base_replies
        runs.append(other)
    if args.off:
        on_mb = args.cache_mb
        args.cache_mb = 0
        off, off_replies = figures(args.cai, args.model, all_messages, args)
        args.cache_mb = on_mb
        off["cai"] += " (cache off)"
        off["same_replies"] = off_replies == base_replies
        runs.append(off)
    print("%-40s %12s %12s %9s %11s %s" % ("build", "prompt", "cached", "hit rate",
                                           "median turn", "same replies"))
    for r in runs:
        print("%-40s %12d %12d %8.1f%% %10.1f%% %s" % (
            r["cai"], r["follow_up_prompt_tokens"], r["follow_up_cached_tokens"],
            100.0 * r["hit_rate"], 100.0 * r["median_turn_hit_rate"], r.get("same_replies", "")))
    json.dump({"args": vars(args), "runs": runs}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
