"""bench_typed_replies.py — typed replies through cai_chat on the schema test set: how many
replies are valid, how many max_tokens cuts, how many are stored although they are not the JSON
their schema asks for, and how many tokens a reply takes.

Every schema of tests/json_schema/cases.json with its prompt, greedy and sampled with two seeds
(like tests/scenario/test_json_schema.py), each in a new conversation through cai_chat with the
schema as response_format, four sessions at a time.  Each reply is one of:

  valid               returned and stored; parses and validates against its schema
  cut                 refused with SQLSTATE 54000 (max_tokens cut the value), nothing stored
  cut_but_stored      refused, yet the conversation holds rows (must be 0)
  stored_unparsable   returned and stored, but not JSON (a cut value stored as the reply)
  stored_invalid      returned and stored, JSON but not valid under the schema
  error               any other error

Tokens: completion_tokens of the stored reply; a refused one counts max_tokens (what it cost).

Runs against the server of PGHOST/PGPORT/PGUSER (a cluster serving the model to measure, e.g.
from scripts/lib-cluster.sh), in the database cai_scenario (created with pg_cai if missing):

  python3 tests/bench/bench_typed_replies.py [--max-tokens 160] [--options '{"json_whitespace": "free"}']

Prints one line per class and a JSON summary on the last line.
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "scenario"))
from pgtest import ensure_database                  # noqa: E402
from pqlib import Conn, PqError                     # noqa: E402
from schema_cases import CASES, MODES, quote, validate  # noqa: E402

CLASSES = ["valid", "cut", "cut_but_stored", "stored_unparsable", "stored_invalid", "error"]


def one_reply(conn, case, opts, max_tokens, extra):
    options = dict(opts, max_tokens=max_tokens, response_format={
        "type": "json_schema", "json_schema": {"name": case["name"], "schema": case["schema"]}})
    options.update(extra)
    conv = conn.value("SELECT cai_new_conversation('You answer with JSON only.')")
    try:
        conn.value("SELECT cai_chat(%s, %s, %s)" % (conv, quote(case["prompt"]),
                                                   quote(json.dumps(options))))
    except PqError as e:
        stored = conn.value("SELECT count(*) FROM cai.messages WHERE conversation_id = %s" % conv)
        if e.sqlstate == "54000":
            return ("cut" if stored == "0" else "cut_but_stored"), max_tokens, None
        return "error", 0, str(e)
    rows = conn.exec("SELECT content, completion_tokens FROM cai.messages "
                     "WHERE conversation_id = %s AND role = 'assistant'" % conv)
    content, tokens = rows[0][0], int(rows[0][1])
    try:
        why = validate(case["schema"], json.loads(content))
    except ValueError:
        return "stored_unparsable", tokens, content
    return ("stored_invalid" if why else "valid"), tokens, content


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--options", default="{}", help="more options for every call (JSON)")
    ap.add_argument("--show", type=int, default=3, help="replies to print per class")
    args = ap.parse_args()
    extra = json.loads(args.options)
    jobs = [(case, mode, opts) for case in CASES for mode, opts in MODES]
    results = []
    lock = threading.Lock()
    ensure_database()

    def worker(index):
        conn = Conn("cai_scenario", "cai_bench_typed_%d" % index)
        try:
            for n, (case, mode, opts) in enumerate(jobs):
                if n % args.sessions == index:
                    outcome = one_reply(conn, case, opts, args.max_tokens, extra)
                    with lock:
                        results.append((case["name"], mode) + outcome)
        finally:
            conn.close()

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start

    model = Conn("cai_scenario", "cai_bench_typed").value("SELECT cai_model_info()->>'name'")
    counts = {k: sum(1 for r in results if r[2] == k) for k in CLASSES}
    valid_tokens = [r[3] for r in results if r[2] == "valid"]
    all_tokens = [r[3] for r in results if r[2] != "error"]
    print("%s: %d schemas x %d modes = %d replies in %.0f s, max_tokens %d, options %s" % (
        model, len(CASES), len(MODES), len(results), elapsed, args.max_tokens, json.dumps(extra)))
    for k in CLASSES:
        print("  %-18s %d" % (k, counts[k]))
        for name, mode, _, tokens, content in [r for r in results if r[2] == k][:args.show]:
            print("      %s (%s), %d tokens: %r" % (name, mode, tokens, (content or "")[:120]))
    summary = {
        "model": model, "replies": len(results), "max_tokens": args.max_tokens, "options": extra,
        "counts": counts,
        "tokens_per_valid_reply_mean": round(statistics.mean(valid_tokens), 1) if valid_tokens else None,
        "tokens_per_valid_reply_median": statistics.median(valid_tokens) if valid_tokens else None,
        "tokens_all_replies": sum(all_tokens),
        "seconds": round(elapsed, 1),
    }
    print("tokens per valid reply: mean %s, median %s; all replies %d tokens" % (
        summary["tokens_per_valid_reply_mean"], summary["tokens_per_valid_reply_median"],
        summary["tokens_all_replies"]))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
