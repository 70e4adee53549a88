#!/usr/bin/env python3
"""bench_cache.py — the inter-turn KV cache (prefix cache) measured through SQL.

Plays C conversations of T turns each (default 8 x 12) through cai_chat_stream, turn by turn
across the conversations (turn 1 of every conversation, then turn 2 of every one, ...), as many
users chatting at once would.  Each conversation has a long first user message, shorter
follow-ups and replies of exactly --reply-tokens tokens (greedy, ignore_eos), so its history
grows past 2000 tokens by the last turn.

Two throwaway clusters with identical settings but the prefix cache's budget run side by side,
request by request, so that both see the same machine load:

  phase 1   A: pg_cai.host_cache_size = --cache-mb (holds everything: "on")
            B: pg_cai.host_cache_size = 0           (no prefix cache: "off")
  phase 2   B restarts with half of the working set A cached in phase 1 ("half"); A, its cache
            emptied, plays new conversations again ("on", a second time, for a same-load
            comparison).

"Off" is a cluster without a prefix cache rather than cai_cache_reset() before every turn: the
same engine then does no lookups or inserts at all, which is what "cache off" means to a user.
Every phase compares the reply ids of the two runs, turn by turn: greedy replies must be the same
with the cache on, off or squeezed.

Time to first token is measured twice per turn:
  engine   cai.messages.ttft_ms: from the engine worker receiving the request to the first
           generated token (queue wait plus computing the uncached part of the prompt);
  sql      from the start of the SQL statement to the moment the first piece of the reply is
           produced in the caller's backend (clock_timestamp() evaluated per row of
           cai_chat_stream, minus statement_timestamp()): reading the history, the request's
           trip to the worker, prefill, and the first token's trip back.

Reports, per run: the cache hit rate over follow-up turns' prompt tokens (and the ceiling: the
share of those tokens that the previous turn had computed, to the token), median and mean TTFT
over turns 6..T, the off/on ratio, evictions.  Needs the Python standard library, psql, and
pg_cai installed (make install); run as root or as the owner of the PostgreSQL installation:

    python3 tests/bench/bench_cache.py [--conversations 8] [--turns 12] [--threads 2]

Figures go to stdout and, as JSON, to tests/bench/out/cache-TIME.json (or --out).  Not a test:
it passes or fails nothing.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "scenario"))
from pgtest import Cluster  # noqa: E402

SYSTEM_PROMPT = (
    "You are Ada, a patient and knowledgeable assistant who helps people plan projects. You "
    "answer in plain language, you remember everything the user told you earlier in the "
    "conversation, you refer back to their notes when it helps, and you keep each answer short: "
    "a few sentences with one concrete suggestion. When something is unclear you ask one "
    "question. You never invent facts about the user."
)

TOPICS = [
    ("a vegetable garden", ["tomatoes", "beans", "compost", "the raised beds", "the watering can",
                            "the fence", "the seedlings", "the soil"]),
    ("a trip to Japan", ["the rail pass", "Kyoto", "the hotel", "the museums", "the ferry",
                         "the budget", "the temples", "the luggage"]),
    ("a small bakery", ["the oven", "sourdough", "the flour supplier", "the opening hours",
                        "the pastries", "the rent", "the display case", "the staff"]),
    ("a home office", ["the desk", "the lamp", "the chair", "the bookshelf", "the cables",
                       "the window", "the monitor", "the paint"]),
    ("a school science fair", ["the volcano model", "the poster", "the judges", "the magnets",
                               "the timeline", "the experiment", "the batteries", "the report"]),
    ("a family reunion", ["the cousins", "the picnic", "the venue", "the photographs",
                          "the menu", "the invitations", "the games", "the weather"]),
    ("a marathon training plan", ["the long runs", "the shoes", "the intervals", "the diet",
                                  "the rest days", "the race", "the stretching", "the watch"]),
    ("a community library", ["the shelves", "the volunteers", "the donations", "the catalogue",
                             "the reading hour", "the fundraiser", "the signage", "the chairs"]),
]

SENTENCES = [
    "I have been thinking about {x} for a few weeks now, and I keep changing my mind.",
    "My neighbour told me that {x} matters more than {y}, but I am not sure that is right.",
    "Last year I tried something similar and {x} turned out to be the hardest part.",
    "The budget is tight, so anything involving {x} has to be cheap or borrowed.",
    "I would like {x} to be ready before the end of next month if at all possible.",
    "There is a small problem with {x}: it takes much longer than I expected.",
    "My sister offered to help with {y}, which frees me to concentrate on {x}.",
    "I wrote down three options for {x} and none of them feels obviously better.",
    "Someone online suggested replacing {x} with {y}, which sounds risky to me.",
    "On weekends I have about four hours to spend on {x} and {y} together.",
    "The weather has been unpredictable, which makes planning {x} harder than usual.",
    "I keep a notebook where I track {x}, and the numbers have not improved lately.",
    "A friend who did this before warned me not to underestimate {y}.",
    "I am worried that {x} will clash with {y} if I schedule them in the same week.",
    "The shop near my house sells everything needed for {x}, but the prices went up.",
    "I would rather do {x} properly once than fix it three times later.",
    "In my notes I marked {y} as optional, though I am starting to doubt that.",
    "Honestly, {x} is the part I enjoy most, so I tend to neglect {y}.",
]

QUESTIONS = [
    "What should I do about {x} first?",
    "Given what I said before, is {x} still a good idea?",
    "How would you order {x} and {y}?",
    "Can you remind me what I said about {y}, and whether it changes your advice?",
    "What is one thing I could do this week for {x}?",
    "Do you think {y} can wait until next month?",
]


def sentence(rng, things, templates):
    x, y = rng.sample(things, 2)
    return rng.choice(templates).format(x=x, y=y)


def words(text):
    return len(text.split())


def conversation_messages(index, turns, first_words, user_words):
    """The user turns of conversation `index`: a long first message, then shorter ones."""
    rng = random.Random(1000 + index)
    topic, things = TOPICS[index % len(TOPICS)]
    first = ["I am working on %s and would like your help over the next while. Here are my "
             "notes so far." % topic]
    while words(" ".join(first)) < first_words:
        first.append(sentence(rng, things, SENTENCES))
    first.append(sentence(rng, things, QUESTIONS))
    messages = [" ".join(first)]
    for _ in range(1, turns):
        target = rng.randint(user_words // 2, user_words * 3 // 2)
        parts = []
        while words(" ".join(parts)) < target:
            parts.append(sentence(rng, things, SENTENCES))
        parts.append(sentence(rng, things, QUESTIONS))
        messages.append(" ".join(parts))
    return messages


class Server:
    """One throwaway cluster with pg_cai and a database to chat in."""

    def __init__(self, name, args, cache_mb):
        self.name = name
        self.args = args
        self.cluster = Cluster(self.settings(cache_mb))

    def settings(self, cache_mb):
        return {
            "shared_preload_libraries": "'pg_cai'",
            "pg_cai.model": "'%s'" % self.args.model,
            "pg_cai.threads": str(self.args.threads),
            "pg_cai.max_batch": "2",
            "pg_cai.context_length": "4096",
            "pg_cai.host_cache_size": "'%dMB'" % cache_mb,
            "pg_cai.max_queue": "16",
            "min_dynamic_shared_memory": "'32MB'",
        }

    def start(self):
        """Starts the server and waits for the worker's verdict on the model."""
        log = self.cluster.log
        offset = os.path.getsize(log) if os.path.exists(log) else 0
        if not self.cluster.start():
            raise RuntimeError("%s: the server did not start; see %s" % (self.name, log))
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            with open(log, errors="replace") as f:
                f.seek(offset)
                text = f.read()
            if "pg_cai engine worker ready" in text:
                return
            if "pg_cai engine worker has no model" in text:
                break
            time.sleep(0.2)
        raise RuntimeError("%s: the engine worker did not load the model; see %s" % (self.name, log))

    def restart(self, cache_mb):
        self.cluster.stop()
        self.cluster.configure(self.settings(cache_mb))
        self.start()

    def sql(self, script, variables=None):
        """Runs a psql script; returns its rows as lists of fields."""
        env = dict(os.environ)
        env.update(self.cluster.env())
        cmd = ["psql", "-X", "-A", "-t", "-q", "-F", "|", "-v", "ON_ERROR_STOP=1", "-d", "postgres"]
        for k, v in (variables or {}).items():
            cmd += ["-v", "%s=%s" % (k, v)]
        p = subprocess.run(cmd + ["-f", "-"], input=script, capture_output=True, text=True,
                           env=env, timeout=900)
        if p.returncode != 0:
            raise RuntimeError("%s: psql failed: %s" % (self.name, p.stderr.strip()[-2000:]))
        return [line.split("|") for line in p.stdout.splitlines() if line]

    def stats(self):
        cols = ["cache_lookups", "cache_lookup_tokens", "cache_hit_tokens", "cache_blocks",
                "cache_bytes", "cache_budget_bytes", "cache_evictions"]
        row = self.sql("SELECT %s FROM pg_stat_cai;" % ", ".join(cols))[0]
        return {c: int(v) for c, v in zip(cols, row)}

    def new_conversations(self, n):
        return [int(self.sql("SELECT cai_new_conversation(:'sys');", {"sys": SYSTEM_PROMPT})[0][0])
                for _ in range(n)]

    def turn(self, conversation, message, reply_tokens):
        """One turn through cai_chat_stream; returns its usage and timings."""
        options = json.dumps({"max_tokens": reply_tokens, "ignore_eos": True})
        start = time.monotonic()
        rows = self.sql(
            "SELECT extract(epoch FROM min(t) - statement_timestamp()) * 1000, count(*)\n"
            "FROM (SELECT cai_chat_stream(:conv, :'msg', :'opts') AS piece, clock_timestamp() AS t) s;\n"
            "SELECT prompt_tokens, cached_tokens, completion_tokens, ttft_ms, md5(tokens::text)\n"
            "FROM cai.messages WHERE conversation_id = :conv AND role = 'assistant'\n"
            "ORDER BY id DESC LIMIT 1;\n",
            {"conv": conversation, "msg": message, "opts": options})
        wall_ms = (time.monotonic() - start) * 1000.0
        sql_ttft, _pieces = rows[0]
        prompt, cached, completion, ttft, ids_md5 = rows[1]
        return {"prompt_tokens": int(prompt), "cached_tokens": int(cached),
                "completion_tokens": int(completion), "engine_ttft_ms": float(ttft),
                "sql_ttft_ms": float(sql_ttft), "wall_ms": wall_ms, "reply_ids_md5": ids_md5}


def play(pairs, conversations, messages, args, label):
    """Plays every turn, turn-major, alternating between the servers of each (server, run) pair;
    the order of the servers rotates from turn to turn so that none always plays last."""
    results = {run: [] for _, run in pairs}
    ids = {run: server.new_conversations(conversations) for server, run in pairs}
    for t in range(args.turns):
        for c in range(conversations):
            k = (t * conversations + c) % len(pairs)
            for server, run in pairs[k:] + pairs[:k]:
                r = server.turn(ids[run][c], messages[c][t], args.reply_tokens)
                r.update({"conversation": c, "turn": t + 1})
                results[run].append(r)
        print("  %s: turn %d/%d done" % (label, t + 1, args.turns), file=sys.stderr, flush=True)
    return results


def summarize(turns, args):
    """Hit rate, its ceiling and TTFT figures of one run."""
    by_conv = {}
    for r in turns:
        by_conv.setdefault(r["conversation"], {})[r["turn"]] = r
    prompt = cached = reusable = 0
    for conv in by_conv.values():
        for t, r in conv.items():
            if t == 1:
                continue
            prev = conv[t - 1]
            prompt += r["prompt_tokens"]
            cached += r["cached_tokens"]
            # what the previous turn computed (its prompt and reply, less the last sampled token,
            # which never ran): all a follow-up can reuse, to the token
            reusable += prev["prompt_tokens"] + prev["completion_tokens"] - 1
    late = [r for r in turns if r["turn"] >= args.late_from]
    eng = [r["engine_ttft_ms"] for r in late]
    sql = [r["sql_ttft_ms"] for r in late]
    last = [r["prompt_tokens"] for r in turns if r["turn"] == args.turns]
    return {
        "followup_prompt_tokens": prompt,
        "followup_cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "hit_rate_ceiling": reusable / prompt if prompt else 0.0,
        "reusable_served": cached / reusable if reusable else 0.0,
        "late_turns": len(late),
        "engine_ttft_ms_median": statistics.median(eng),
        "engine_ttft_ms_mean": statistics.mean(eng),
        "sql_ttft_ms_median": statistics.median(sql),
        "sql_ttft_ms_mean": statistics.mean(sql),
        "late_prompt_tokens_mean": statistics.mean(r["prompt_tokens"] for r in late),
        "late_cached_tokens_mean": statistics.mean(r["cached_tokens"] for r in late),
        "late_uncached_tokens_mean": statistics.mean(r["prompt_tokens"] - r["cached_tokens"]
                                                     for r in late),
        "last_turn_prompt_tokens": [min(last), max(last)],
        "turn_wall_ms_mean": statistics.mean(r["wall_ms"] for r in turns),
    }


def paired_ratio(base, run, args, key):
    """Median over turns >= late_from of base/run for the same conversation and turn: robust to
    machine load that drifts during the run (both requests ran back to back)."""
    ratios = [b[key] / r[key] for b, r in zip(base, run)
              if r["turn"] >= args.late_from and r[key] > 0]
    return statistics.median(ratios)


def same_replies(a, b):
    return sum(1 for x, y in zip(a, b) if x["reply_ids_md5"] == y["reply_ids_md5"]), len(a)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--reply-tokens", type=int, default=64)
    ap.add_argument("--first-words", type=int, default=380,
                    help="words of each conversation's first user message")
    ap.add_argument("--user-words", type=int, default=36,
                    help="mean words of later user messages (uniform in [w/2, 3w/2])")
    ap.add_argument("--late-from", type=int, default=6, help="TTFT is reported over turns >= this")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-mb", type=int, default=1024, help="the 'on' cluster's budget")
    ap.add_argument("--skip-half", action="store_true", help="skip phase 2")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.model = os.path.abspath(args.model)

    messages = [conversation_messages(i, args.turns, args.first_words, args.user_words)
                for i in range(args.conversations)]
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    report = {"started": started, "command": " ".join([sys.executable] + sys.argv),
              "config": {k: v for k, v in vars(args).items() if k != "out"}}

    on = Server("on", args, args.cache_mb)
    off = Server("off", args, 0)
    try:
        for s in (on, off):
            s.start()
            s.sql("CREATE EXTENSION pg_cai;")
        report["device"] = on.sql("SELECT cai_model_info()->>'device';")[0][0]

        print("phase 1: cache on (%d MB) vs off, %d conversations x %d turns"
              % (args.cache_mb, args.conversations, args.turns), file=sys.stderr)
        p1 = play([(on, "on"), (off, "off")], args.conversations, messages, args, "phase 1")
        st_on, st_off = on.stats(), off.stats()
        report["phase1"] = {
            "on": summarize(p1["on"], args), "off": summarize(p1["off"], args),
            "stats_on": st_on, "stats_off": st_off,
            "same_replies_on_off": same_replies(p1["on"], p1["off"]),
            "paired_ttft_ratio_off_on": {
                "engine": paired_ratio(p1["off"], p1["on"], args, "engine_ttft_ms"),
                "sql": paired_ratio(p1["off"], p1["on"], args, "sql_ttft_ms")},
        }
        working_set = st_on["cache_bytes"]
        report["working_set_bytes"] = working_set
        report["working_set_complete"] = st_on["cache_evictions"] == 0
        runs = {"phase1": p1}

        if not args.skip_half:
            half_mb = max(1, working_set // 2 // (1024 * 1024))
            report["half_budget_mb"] = half_mb
            print("phase 2: cache on vs half the working set (%d MB)" % half_mb, file=sys.stderr)
            off.name = "half"
            off.restart(half_mb)
            on.sql("SELECT cai_cache_reset();")
            p2 = play([(on, "on"), (off, "half")], args.conversations, messages, args, "phase 2")
            st_on2, st_half = on.stats(), off.stats()
            report["phase2"] = {
                "on": summarize(p2["on"], args), "half": summarize(p2["half"], args),
                "stats_half": st_half,
                "same_replies_on_half": same_replies(p2["on"], p2["half"]),
                "same_replies_phase1_phase2": same_replies(p1["on"], p2["on"]),
                "paired_ttft_ratio_half_on": {
                    "engine": paired_ratio(p2["half"], p2["on"], args, "engine_ttft_ms"),
                    "sql": paired_ratio(p2["half"], p2["on"], args, "sql_ttft_ms")},
            }
            runs["phase2"] = p2
        report["turns"] = runs
    finally:
        for s in (on, off):
            s.cluster.stop()
            s.cluster.remove()

    # ---- the figures ----
    def line(name, s, base=None):
        ratio = ""
        if base is not None:
            ratio = "   off/this: engine %.1fx, sql %.1fx" % (
                base["engine_ttft_ms_median"] / s["engine_ttft_ms_median"],
                base["sql_ttft_ms_median"] / s["sql_ttft_ms_median"])
        print("%-6s hit rate %6.2f%% (ceiling %6.2f%%, %6.2f%% of reusable)  "
              "TTFT t>=%d median engine %8.1f ms, sql %8.1f ms (mean %8.1f / %8.1f)%s"
              % (name, 100 * s["hit_rate"], 100 * s["hit_rate_ceiling"], 100 * s["reusable_served"],
                 args.late_from, s["engine_ttft_ms_median"], s["sql_ttft_ms_median"],
                 s["engine_ttft_ms_mean"], s["sql_ttft_ms_mean"], ratio))

    p = report["phase1"]
    print("device: %s" % report["device"])
    print("last-turn prompts: %d..%d tokens; turns %d..%d: mean prompt %.0f tokens"
          % (p["on"]["last_turn_prompt_tokens"][0], p["on"]["last_turn_prompt_tokens"][1],
             args.late_from, args.turns, p["on"]["late_prompt_tokens_mean"]))
    print("working set (phase 1, no evictions: %s): %.1f MB"
          % (report["working_set_complete"], working_set / 1048576.0))
    print("turns %d..%d with the cache: %.0f prompt tokens computed on average"
          % (args.late_from, args.turns, p["on"]["late_uncached_tokens_mean"]))
    line("on", p["on"], p["off"])
    line("off", p["off"])
    print("paired TTFT ratio off/on (median over turns %d..%d of the same turn's ratio): "
          "engine %.1fx, sql %.1fx" % (args.late_from, args.turns,
                                       p["paired_ttft_ratio_off_on"]["engine"],
                                       p["paired_ttft_ratio_off_on"]["sql"]))
    print("same reply ids on/off: %d/%d" % tuple(p["same_replies_on_off"]))
    if "phase2" in report:
        q = report["phase2"]
        line("on", q["on"], p["off"])
        line("half", q["half"], p["off"])
        print("paired TTFT ratio half/on: engine %.1fx, sql %.1fx"
              % (q["paired_ttft_ratio_half_on"]["engine"], q["paired_ttft_ratio_half_on"]["sql"]))
        print("half budget %d MB: %d evictions; same reply ids on/half: %d/%d, phase 1/2 on: %d/%d"
              % (report["half_budget_mb"], q["stats_half"]["cache_evictions"],
                 q["same_replies_on_half"][0], q["same_replies_on_half"][1],
                 q["same_replies_phase1_phase2"][0], q["same_replies_phase1_phase2"][1]))

    out = args.out or os.path.join(ROOT, "tests", "bench", "out",
                                   "cache-%s.json" % started.replace(":", ""))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print("JSON: %s" % out)


if __name__ == "__main__":
    main()
