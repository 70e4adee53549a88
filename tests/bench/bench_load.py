#!/usr/bin/env python3
"""bench_load.py — what starting a model costs: load time and peak memory, pg_cai against llama.cpp.

For each engine, in rounds whose order alternates, one process loads --model and generates
--tokens tokens after a one-word prompt, and the report gives the medians of:

  seconds   from process start to the last token: for `cai run` when it reports the reply done
            (loading the file, preparing the weights, the tokens); for llama.cpp
            (llama-cpp-python) from just before Llama() to the last token, so Python's own
            start-up is not counted against it
  exit      for `cai run`, from process start to its exit: a first start writes the weights
            cache while it answers and exits once the file is written and synced
  peak RSS  the process's maximum resident set (getrusage ru_maxrss of the child): file pages
            mapped and touched count, as they do for both engines

pg_cai runs twice per round when --weights-cache is on (the default): once into an empty cache
directory (the conversion, as a first start) and once from it (the weights mapped, as every later
engine start and every restart after a crash).  The model file is read once before the first
round, so every run finds it in the page cache.

  PYTHONPATH=/tmp/lcpp python3 tests/bench/bench_load.py --model models/synth/llama32-1b-q4_k_m.gguf

Needs llama-cpp-python (the benchmark venv).  Timing only: nothing here is a test.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

LLAMA_CHILD = r"""
import json, resource, sys, time
start = time.monotonic()
import llama_cpp
path, threads, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = llama_cpp.Llama(model_path=path, n_threads=threads, n_ctx=512, n_batch=512, verbose=False)
llm("Hello", max_tokens=tokens, temperature=0.0)
took = time.monotonic() - start
print(json.dumps({"seconds": took}))
"""


def measured(cmd, done_marker=None):
    """Runs cmd under a fresh wrapper process that reports its one child's wall time and peak RSS
    (RUSAGE_CHILDREN's ru_maxrss is the largest child waited for so far, so each run needs its own
    parent to read its own figure), and when done_marker is given the time of the first stderr
    line holding it."""
    wrapper = (
        "import json, resource, subprocess, sys, threading, time\n"
        "s = time.monotonic()\n"
        "marker = sys.argv[1]\n"
        "p = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)\n"
        "out = []\n"
        "t = threading.Thread(target=lambda: out.append(p.stdout.read()))\n"
        "t.start()\n"
        "err, done = [], None\n"
        "for line in p.stderr:\n"
        "    err.append(line)\n"
        "    if done is None and marker and marker in line:\n"
        "        done = time.monotonic() - s\n"
        "p.wait()\n"
        "t.join()\n"
        "w = time.monotonic() - s\n"
        "r = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024\n"
        "print(json.dumps({'rc': p.returncode, 'wall': w, 'done': done, 'rss': r, "
        "'out': ''.join(out)[-4000:], 'err': ''.join(err)[-4000:]}))\n")
    proc = subprocess.run([sys.executable, "-c", wrapper, done_marker or ""] + cmd,
                          stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    result = json.loads(proc.stdout)
    if result["rc"] != 0:
        sys.exit(f"bench_load.py: {' '.join(cmd)} failed ({result['rc']}):\n{result['err']}")
    return result


def cai_run(args, cache_dir):
    cmd = [args.cai, "run", "-m", args.model, "-p", "Hello", "-n", str(args.tokens), "--temp", "0",
           "-T", str(args.threads), "-v"]
    if cache_dir:
        cmd += ["--weights-cache", cache_dir]
    # -v: cai run's closing report ("... completion N tokens (length), first token ...") follows
    # the reply's last token
    r = measured(cmd, done_marker="first token")
    if r["done"] is None:
        sys.exit(f"bench_load.py: cai run printed no report:\n{r['err']}")
    return {"seconds": r["done"], "exit": r["wall"], "rss": r["rss"], "log": r["err"]}


def llama_run(args):
    r = measured([sys.executable, "-c", LLAMA_CHILD, args.model, str(args.threads), str(args.tokens)])
    inner = json.loads(r["out"].strip().splitlines()[-1])
    return {"seconds": inner["seconds"], "rss": r["rss"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4, help="tokens generated after loading")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cai", default=os.path.join(REPO, "cai"))
    ap.add_argument("--no-weights-cache", action="store_true",
                    help="run pg_cai only without a weights cache")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        sys.exit(f"bench_load.py needs llama-cpp-python ({e})")

    with open(args.model, "rb") as f:         # into the page cache for every run alike
        while f.read(1 << 24):
            pass
    runs = {"pg_cai, first start": [], "llama.cpp": []}
    if not args.no_weights_cache:
        runs["pg_cai, from its weights cache"] = []
    log_line = ""
    for rnd in range(args.rounds):
        order = ["cai", "llama"] if rnd % 2 == 0 else ["llama", "cai"]
        for who in order:
            if who == "llama":
                runs["llama.cpp"].append(llama_run(args))
                continue
            cache = None if args.no_weights_cache else tempfile.mkdtemp(prefix="cai_wcache_")
            try:
                runs["pg_cai, first start"].append(cai_run(args, cache))
                if cache:
                    again = cai_run(args, cache)
                    runs["pg_cai, from its weights cache"].append(again)
                    log_line = next((l for l in again["log"].splitlines() if "weights" in l), log_line)
            finally:
                if cache:
                    shutil.rmtree(cache, ignore_errors=True)
        print(f"round {rnd + 1}/{args.rounds}: " + ", ".join(
            f"{k} {v[-1]['seconds']:.2f} s {v[-1]['rss'] / 1e9:.2f} GB" for k, v in runs.items()),
            file=sys.stderr)

    med = {k: {"seconds": statistics.median(r["seconds"] for r in v),
               "rss_bytes": statistics.median(r["rss"] for r in v)} for k, v in runs.items()}
    for k, v in runs.items():
        if all("exit" in r for r in v):
            med[k]["exit"] = statistics.median(r["exit"] for r in v)
    base = med["llama.cpp"]
    print(f"\n{os.path.basename(args.model)}, {args.threads} threads, load + {args.tokens} tokens, "
          f"medians of {args.rounds} alternating rounds\n")
    print("| engine | seconds to the reply | peak RSS | ÷ llama.cpp (time, RSS) | process exit |")
    print("|---|---|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v['seconds']:.2f} | {v['rss_bytes'] / 1e9:.2f} GB | "
              f"{v['seconds'] / base['seconds']:.2f}×, {v['rss_bytes'] / base['rss_bytes']:.2f}× | "
              + (f"{v['exit']:.2f} s |" if "exit" in v else "|"))
    if log_line:
        print(f"\npg_cai's log on a start from the cache: {log_line.strip()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "threads": args.threads, "tokens": args.tokens,
                       "rounds": args.rounds, "medians": med,
                       "runs": {k: [{"seconds": r["seconds"], "exit": r.get("exit"), "rss": r["rss"]}
                                    for r in v]
                                for k, v in runs.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
