#!/usr/bin/env python3
"""bench_engine.py — pg_cai's engine against llama.cpp, side by side in one run.

On the same GGUF file and the same CPU thread count it measures:

  1. pg_cai's engine, through `cai bench --json` (int8 weights requantized at load);
  2. llama.cpp (through llama-cpp-python's low-level API) on that same GGUF file;
  3. llama.cpp on a Q8_0 requantization of it (made once with llama_model_quantize and cached),
     llama.cpp's own int8 format and the closest like-for-like baseline for an int8 engine;

each for: prefill of one --prompt-tokens prompt (batch 1; llama.cpp with n_batch = n_ubatch =
512, so a longer prompt is cut into 512-token calls, like the engine's 512-token step budget),
prefill of one prompt of each --long-prompts length (the same way, in the same rounds: the table
of rates by length gives each engine's rate at N tokens over its rate at --prompt-tokens, taken
round by round, so that a slow minute weighs on both sides of a ratio alike), and
aggregate greedy decode tokens/s at every --batches size (B sequences decoding together, each
after a prompt of --decode-prompt-tokens tokens, default 16, so a long one measures decode at a
long context; only steps in which all B sequences decode are timed; llama.cpp gets one KV
stream per sequence, kv_unified off, so its attention does not span other sequences' cells).
The engines run in --repeat rounds, one run each per round (after its own warm-up), the order
rotated every round so that no engine always runs last, under the heaviest load; every figure is
the median over the rounds, with the best round alongside (on a shared machine contention only
slows runs down), all from the same rounds.  It prints tables, the ratios
pg_cai / llama.cpp and pg_cai batch-max / batch-1, the project's goals, and writes everything as
JSON (--out).

This is a benchmark, not a test: it is not part of `make unit` or CI, and its numbers depend on
the machine and its load.  Run it on an otherwise idle machine:

    make cai && /opt/benchenv/bin/python tests/bench/bench_engine.py --threads 2

llama.cpp's OpenMP threads spin while they wait, which collapses its figures when other processes
compete for the cores.  Do not set OMP_WAIT_POLICY=PASSIVE to compensate: it slows llama.cpp's
batch-1 decode several times over even on an idle machine and so overstates pg_cai's lead.  The
report and the JSON state the wait policy the run had, and the load average before and after.

It needs a Python with llama-cpp-python and numpy (pip install llama-cpp-python numpy).
"""

import argparse
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

try:
    import numpy as np
    import llama_cpp
except ImportError as exc:  # pragma: no cover - environment problem, not a result
    sys.exit(f"bench_engine.py needs llama-cpp-python and numpy ({exc}); "
             "try: python -m pip install llama-cpp-python numpy")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_MODEL = os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

# The same prose `cai bench` cuts its prompts from (src/cli/cmd_bench.c), so that both engines
# see the same kind of tokens.
BENCH_TEXT = (
    "The history of databases is a history of moving computation closer to data. Early systems "
    "stored records on tape and processed them in batches; relational engines brought declarative "
    "queries, transactions and indexes; later, extensions let users add their own types, "
    "functions and access methods. Running a language model inside the database continues that "
    "line: the conversation lives in tables, access control applies to it like to any other row, "
    "and a reply is computed where the history already is. Doing this well asks for the same care "
    "as any other part of a server: bounded memory, predictable latency under load, clean "
    "cancellation, and errors that explain themselves. ")

LLAMA_N_BATCH = 512


# ------------------------------------------------------------------------------------------------
# pg_cai


def run_cai_bench(args, options):
    """Runs `cai bench --json` with the common and the given options; returns its parsed JSON."""
    cmd = [args.cai, "bench", "-m", args.model, "--threads", str(args.threads)] + options + [
        "--json"] + args.cai_flags.split()
    print("pg_cai:    " + " ".join(cmd), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"cai bench failed ({done.returncode}):\n{done.stderr}")
    result = json.loads(done.stdout)
    result["command"] = " ".join(cmd)
    return result


def bench_ours(args, repeat):
    """`cai bench` at --prompt-tokens and --batches (repeat timed runs), with each
    --long-prompts length prefilled between two --prompt-tokens runs (cai bench's file comment)."""
    options = ["--batches", ",".join(str(b) for b in args.batches),
               "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens),
               "--decode-prompt-tokens", str(args.decode_prompt_tokens), "--repeat", str(repeat)]
    if args.long_prompts:
        options += ["--long-prompts", ",".join(str(n) for n in args.long_prompts)]
    result = run_cai_bench(args, options)
    result["long_prefill"] = {str(f["prompt_tokens"]): f for f in result.get("long_prefill", [])}
    return result


# ------------------------------------------------------------------------------------------------
# llama.cpp through the low-level API


def figure(n_tokens, times):
    """A prefill figure from the timed runs' seconds, in `cai bench`'s shape."""
    return {"prompt_tokens": n_tokens, "seconds": statistics.median(times),
            "tokens_per_second": n_tokens / statistics.median(times),
            "best_tokens_per_second": n_tokens / min(times),
            "runs_tokens_per_second": [n_tokens / t for t in times]}


@llama_cpp.llama_log_callback
def _quiet_log(level, text, user_data):
    """Swallows llama.cpp's load-time chatter (errors still surface as failed calls)."""


class LlamaBench:
    """One llama.cpp model measured the same way `cai bench` measures the engine."""

    def __init__(self, path, threads, extra_bufts=True):
        self.path = path
        self.threads = threads
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = 0
        # llama.cpp's repacked (and AMX) weight buffers: its fastest CPU kernels where they run
        mparams.use_extra_bufts = extra_bufts
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.base = self.tokenize(BENCH_TEXT)

    def close(self):
        llama_cpp.llama_model_free(self.model)

    def tokenize(self, text):
        raw = text.encode()
        buf = (llama_cpp.llama_token * (len(raw) + 16))()
        n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), False, False)
        if n < 0:
            raise RuntimeError("llama.cpp tokenization failed")
        return list(buf[:n])

    def prompt(self, n, offset=0):
        """n tokens cut from the bench text at a rotating offset (distinct prompts)."""
        out = []
        start = offset % len(self.base)
        while len(out) < n:
            out.extend(self.base[start:start + n - len(out)])
            start = 0
        return out

    def context(self, n_ctx, n_seq):
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = LLAMA_N_BATCH
        cparams.n_ubatch = LLAMA_N_BATCH
        cparams.n_seq_max = n_seq
        cparams.n_threads = self.threads
        cparams.n_threads_batch = self.threads
        cparams.kv_unified = False
        cparams.no_perf = True
        ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context (n_ctx {n_ctx}, "
                               f"n_seq {n_seq})")
        return ctx

    @staticmethod
    def fill(batch, entries):
        """entries: (token, pos, seq, want_logits) tuples."""
        for i, (tok, pos, seq, want) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1 if want else 0
        batch.n_tokens = len(entries)

    def decode(self, ctx, batch):
        rc = llama_cpp.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed ({rc})")

    def prefill_once(self, ctx, batch, tokens):
        """Seconds to prefill `tokens` into an emptied ctx (512-token calls)."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        t0 = time.perf_counter()
        for start in range(0, len(tokens), LLAMA_N_BATCH):
            chunk = tokens[start:start + LLAMA_N_BATCH]
            last = start + len(chunk) == len(tokens)
            self.fill(batch, [(t, start + i, 0, last and i == len(chunk) - 1)
                              for i, t in enumerate(chunk)])
            self.decode(ctx, batch)
        return time.perf_counter() - t0

    def prefill(self, n_tokens, repeat, long_prompts=()):
        """Median seconds to prefill one n_tokens prompt, after a warm-up.  With long_prompts,
        `cai bench --long-prompts`' rounds: each long prompt between two n_tokens runs, and its
        rate over the mean of theirs per round (returned under "long_prefill")."""
        longest = max([n_tokens] + list(long_prompts))
        ctx = self.context(longest + 64, 1)
        batch = llama_cpp.llama_batch_init(LLAMA_N_BATCH, 0, 1)
        tokens = self.prompt(n_tokens)
        long_tokens = {n: self.prompt(n) for n in long_prompts}
        times = []
        long_times = {n: [] for n in long_prompts}
        long_ratios = {n: [] for n in long_prompts}
        try:
            for rep in range(repeat + 1):
                before = self.prefill_once(ctx, batch, tokens)
                if rep > 0:
                    times.append(before)
                for n in long_prompts:
                    t = self.prefill_once(ctx, batch, long_tokens[n])
                    after = self.prefill_once(ctx, batch, tokens)
                    if rep > 0:
                        long_times[n].append(t)
                        long_ratios[n].append((n / t) / (0.5 * (n_tokens / before + n_tokens / after)))
                    before = after
        finally:
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)
        result = figure(n_tokens, times)
        result["long_prefill"] = {str(n): dict(figure(n, long_times[n]),
                                               ratio_to_prompt_tokens=statistics.median(long_ratios[n]))
                                  for n in long_prompts}
        return result

    def decode_batch(self, n_seq, gen_tokens, repeat, prompt_tokens):
        """Aggregate greedy decode tokens/s of n_seq sequences decoding together, each after a
        prompt of prompt_tokens tokens (the context its attention spans)."""
        per_seq_ctx = prompt_tokens + gen_tokens + 16
        ctx = self.context(per_seq_ctx * n_seq, n_seq)
        batch = llama_cpp.llama_batch_init(max(LLAMA_N_BATCH, n_seq), 0, 1)
        prompts = [self.prompt(prompt_tokens, 37 * s) for s in range(n_seq)]
        rates = []
        steps = gen_tokens - 1
        try:
            for rep in range(repeat + 1):
                llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
                # prefill every prompt (untimed), in calls of at most n_batch tokens; each
                # sequence's first token is the argmax of its last prompt position
                entries = [(t, i, s, i == prompt_tokens - 1)
                           for s in range(n_seq) for i, t in enumerate(prompts[s])]
                next_tokens = [0] * n_seq
                for start in range(0, len(entries), LLAMA_N_BATCH):
                    chunk = entries[start:start + LLAMA_N_BATCH]
                    self.fill(batch, chunk)
                    self.decode(ctx, batch)
                    outs = [seq for (_, _, seq, want) in chunk if want]
                    if outs:
                        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx),
                                                       shape=(len(outs), self.n_vocab))
                        for row, seq in enumerate(outs):
                            next_tokens[seq] = int(logits[row].argmax())
                seconds = 0.0
                for step in range(steps):
                    pos = prompt_tokens + step
                    self.fill(batch, [(next_tokens[s], pos, s, True) for s in range(n_seq)])
                    t0 = time.perf_counter()
                    self.decode(ctx, batch)
                    seconds += time.perf_counter() - t0
                    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx),
                                                   shape=(n_seq, self.n_vocab))
                    next_tokens = logits.argmax(axis=1).tolist()
                if rep > 0:
                    rates.append(n_seq * steps / seconds)
        finally:
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)
        tps = statistics.median(rates)
        return {"batch": n_seq, "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens,
                "timed_steps": steps, "ms_per_step": 1000.0 * n_seq / tps,
                "tokens_per_second": tps, "tokens_per_second_per_sequence": tps / n_seq,
                "best_tokens_per_second": max(rates), "runs_tokens_per_second": rates}


def bench_llama(path, args, label, repeat):
    print(f"llama.cpp: {label}: {path}", file=sys.stderr, flush=True)
    bench = LlamaBench(path, args.threads, not args.llama_no_extra_bufts)
    try:
        prefill = bench.prefill(args.prompt_tokens, repeat, args.long_prompts)
        result = {"model": path, "label": label, "long_prefill": prefill.pop("long_prefill"),
                  "prefill": prefill, "decode": []}
        print(f"  prefill {args.prompt_tokens}: "
              f"{result['prefill']['tokens_per_second']:.1f} tokens/s", file=sys.stderr)
        for n, fig in result["long_prefill"].items():
            print(f"  prefill {n}: {fig['tokens_per_second']:.1f} tokens/s, "
                  f"{100 * fig['ratio_to_prompt_tokens']:.1f} % of the {args.prompt_tokens}-token "
                  "rate around it", file=sys.stderr)
        for b in args.batches:
            d = bench.decode_batch(b, args.gen_tokens, repeat, args.decode_prompt_tokens)
            result["decode"].append(d)
            print(f"  decode batch {b}: {d['tokens_per_second']:.1f} tokens/s", file=sys.stderr)
    finally:
        bench.close()
    return result


def requantized_path(args, ftype, label):
    """The cached requantization of --model to llama.cpp's `ftype` (label: its file suffix and
    name), made on first use with llama_model_quantize."""
    st = os.stat(args.model)
    base = os.path.splitext(os.path.basename(args.model))[0]
    out = os.path.join(args.cache_dir, f"{base}-{st.st_size}-{int(st.st_mtime)}.{label}.gguf")
    if os.path.exists(out):
        return out
    os.makedirs(args.cache_dir, exist_ok=True)
    qparams = llama_cpp.llama_model_quantize_default_params()
    qparams.nthread = args.threads
    qparams.ftype = ftype
    qparams.allow_requantize = True
    tmp = out + ".partial"
    print(f"llama.cpp: requantizing to {label} -> {out}", file=sys.stderr, flush=True)
    rc = llama_cpp.llama_model_quantize(args.model.encode(), tmp.encode(), ctypes.byref(qparams))
    if rc != 0:
        sys.exit(f"llama_model_quantize to {label} failed ({rc})")
    os.replace(tmp, out)
    return out


def q8_0_path(args):
    """The cached Q8_0 requantization of --model."""
    return requantized_path(args, llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "Q8_0")


# ------------------------------------------------------------------------------------------------
# rounds


def run_rounds(args, engines):
    """Runs every engine (name -> function of repeat) once per round for args.repeat rounds,
    rotating the order each round, and returns name -> that engine's rounds merged."""
    names = list(engines)
    rounds = {name: [] for name in names}
    for r in range(args.repeat):
        order = names[r % len(names):] + names[:r % len(names)]
        print(f"round {r + 1}/{args.repeat}: {', '.join(order)}", file=sys.stderr, flush=True)
        for name in order:
            rounds[name].append(engines[name](1))
    return {name: merge_rounds(runs) for name, runs in rounds.items()}


def merge_figure(figures):
    """One figure (prefill or one decode batch) over the rounds: the median and the best round's
    tokens/s, each round's rate, and the other fields of the first round."""
    rates = [f["tokens_per_second"] for f in figures]
    merged = dict(figures[0])
    merged["tokens_per_second"] = statistics.median(rates)
    merged["best_tokens_per_second"] = max(rates)
    merged["runs_tokens_per_second"] = rates
    for key in ("seconds", "ms_per_step", "tokens_per_second_per_sequence", "ratio_to_prompt_tokens"):
        merged.pop(key, None)
    return merged


def merge_rounds(runs):
    """An engine's result over the rounds, in the shape of one run's result."""
    merged = dict(runs[0])
    merged["prefill"] = merge_figure([r["prefill"] for r in runs])
    merged["decode"] = [merge_figure([r["decode"][i] for r in runs])
                        for i in range(len(runs[0]["decode"]))]
    merged["long_prefill"] = {n: merge_figure([r["long_prefill"][n] for r in runs])
                              for n in runs[0]["long_prefill"]}
    # each round's rate at n over the --prompt-tokens rate around it, and their median
    for n, fig in merged["long_prefill"].items():
        per_round = [r["long_prefill"][n]["ratio_to_prompt_tokens"] for r in runs]
        fig["runs_over_short_prompt"] = per_round
        fig["over_short_prompt"] = statistics.median(per_round)
    merged["rounds"] = runs
    return merged


# ------------------------------------------------------------------------------------------------
# report


def decode_at(result, batch, key="tokens_per_second"):
    for d in result["decode"]:
        if d["batch"] == batch:
            return d.get(key)
    return None


def ratio(a, b):
    return a / b if a is not None and b else None


def table(args, rows, key, title):
    head = f"{title:28} {'prefill ' + str(args.prompt_tokens):>12}" + "".join(
        f"{'decode b' + str(b):>12}" for b in args.batches)
    lines = [head]
    for name, r in rows:
        lines.append(f"{name:28} {r['prefill'][key]:12.1f}" + "".join(
            f"{decode_at(r, b, key):12.1f}" for b in args.batches))
    return lines


def ratios_and_goals(args, ours, llama_same, llama_q8, key):
    b1 = min(args.batches)
    bmax = max(args.batches)
    ours_prefill = ours["prefill"][key]
    ratios = {
        "prefill_vs_llama_same": ratio(ours_prefill, llama_same["prefill"][key]),
        "prefill_vs_llama_q8_0": ratio(ours_prefill, llama_q8["prefill"][key]),
    }
    for b in args.batches:
        ratios[f"decode_b{b}_vs_llama_same"] = ratio(decode_at(ours, b, key),
                                                     decode_at(llama_same, b, key))
        ratios[f"decode_b{b}_vs_llama_q8_0"] = ratio(decode_at(ours, b, key),
                                                     decode_at(llama_q8, b, key))
    ratios[f"ours_b{bmax}_over_b{b1}"] = ratio(decode_at(ours, bmax, key),
                                               decode_at(ours, b1, key))
    ratios[f"llama_q8_0_b{bmax}_over_b{b1}"] = ratio(decode_at(llama_q8, bmax, key),
                                                     decode_at(llama_q8, b1, key))
    goals = {}
    for name, value, target in [
            (f"decode_b{b1}_ge_1.2x_llama_q8_0", ratios.get(f"decode_b{b1}_vs_llama_q8_0"), 1.2),
            (f"prefill_{args.prompt_tokens}_ge_1.2x_llama_q8_0", ratios["prefill_vs_llama_q8_0"],
             1.2),
            (f"ours_b{bmax}_ge_8x_ours_b{b1}", ratios[f"ours_b{bmax}_over_b{b1}"], 8.0)]:
        goals[name] = {"value": value, "target": target,
                       "met": value is not None and value >= target}
    return ratios, goals


def streaming(args, ours):
    """Batch-1 decode's weight streaming against --read-bandwidth: the engine's weight bytes
    (cai bench's weight_bytes: every matrix once, the embedding table whole, which a model with
    tied embeddings streams as its output head each token) times the median tokens/s."""
    b1 = [d for d in ours["decode"] if d["batch"] == 1]
    if not args.read_bandwidth or not ours.get("weight_bytes") or not b1:
        return None
    gb = ours["weight_bytes"] / 1e9
    tps = b1[0]["tokens_per_second"]
    return {"gb_per_token": gb, "tokens_per_second": tps, "gb_per_second": gb * tps,
            "fraction": gb * tps / args.read_bandwidth}


def report(args, ours, llama_same, llama_q8):
    """The printed report (median and best-run tables, ratios, goals) and its JSON parts."""
    numerics = ours.get("weights", "int8") + " weights"
    if ours.get("activation_precision", "int8") != "int8":
        numerics += ", " + ours["activation_precision"]
    if ours.get("weight_rounding") == "gptq":
        numerics += ", gptq"
    rows = [(f"pg_cai ({numerics})", ours), ("llama.cpp, same GGUF", llama_same),
            ("llama.cpp, Q8_0", llama_q8)]
    lines = [f"tokens/s, {args.threads} threads, {os.path.basename(args.model)}, "
             f"median of {args.repeat} alternating rounds, decode after "
             f"{args.decode_prompt_tokens}-token prompts, OMP_WAIT_POLICY={omp_wait_policy()}"]
    lines += table(args, rows, "tokens_per_second", "median")
    lines.append("")
    lines += table(args, rows, "best_tokens_per_second", "best run")
    out = {}
    for key, label in [("tokens_per_second", "median"), ("best_tokens_per_second", "best run")]:
        ratios, goals = ratios_and_goals(args, ours, llama_same, llama_q8, key)
        out[label] = {"ratios": ratios, "goals": goals}
    lines.append("")
    lines.append(f"{'ratios':36} {'median':>9} {'best run':>9}")
    for k in out["median"]["ratios"]:
        cells = [out[label]["ratios"][k] for label in ("median", "best run")]
        lines.append(f"  {k:34} " + " ".join(
            f"{v:8.2f}x" if v is not None else f"{'n/a':>9}" for v in cells))
    bw = streaming(args, ours)
    if bw:
        out["median"]["ratios"]["decode_b1_read_bandwidth_fraction"] = bw["fraction"]
        lines.append(f"  {'decode b1 / read bandwidth':34} {100 * bw['fraction']:8.1f}%  "
                     f"({bw['gb_per_token']:.3f} GB a token x {bw['tokens_per_second']:.1f}/s "
                     f"= {bw['gb_per_second']:.1f} of {args.read_bandwidth:.1f} GB/s)")
    lines.append(f"{'goals':36} {'median':>9} {'best run':>9}")
    for k in out["median"]["goals"]:
        cells = [out[label]["goals"][k] for label in ("median", "best run")]
        lines.append(f"  {k:34} " + " ".join(
            (f"{g['value']:8.2f}x" if g["value"] is not None else f"{'n/a':>9}")
            for g in cells) + "   " + " / ".join(
            "met" if g["met"] else "NOT met" for g in cells))
    if args.long_prompts:
        lines += long_prompt_table(args, rows)
    return "\n".join(lines), out


def long_prompt_table(args, rows):
    """Prefill rates by prompt length (medians over the rounds), each over the engine's rate at
    --prompt-tokens (the median of the per-round ratios), and pg_cai over each llama.cpp."""
    lengths = [str(n) for n in args.long_prompts]
    lines = ["", f"prefill tokens/s by prompt length (median; in brackets, the median over the "
             f"rounds of the rate over the mean of the {args.prompt_tokens}-token runs just "
             "before and after it)",
             f"{'':28} {'prefill ' + str(args.prompt_tokens):>12}" + "".join(
                 f"{'prefill ' + n:>20}" for n in lengths)]
    for name, r in rows:
        lines.append(f"{name:28} {r['prefill']['tokens_per_second']:12.1f}" + "".join(
            f"{r['long_prefill'][n]['tokens_per_second']:11.1f} ({100 * r['long_prefill'][n]['over_short_prompt']:4.1f} %)"
            for n in lengths))
    ours = rows[0][1]
    for name, r in rows[1:]:
        lines.append(f"{'pg_cai / ' + name:28} {ratio(ours['prefill']['tokens_per_second'], r['prefill']['tokens_per_second']):11.2f}x" + "".join(
            f"{ratio(ours['long_prefill'][n]['tokens_per_second'], r['long_prefill'][n]['tokens_per_second']):19.2f}x"
            for n in lengths))
    return lines


def add_common_arguments(ap):
    """--model, --threads, --cai and --cache-dir, which the llama.cpp benchmarks share."""
    ap.add_argument("--model", default=DEFAULT_MODEL, help="GGUF file (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for both engines")
    ap.add_argument("--cai", default=os.path.join(REPO, "cai"), help="the cai binary")
    ap.add_argument("--cache-dir", default=os.path.join(
        os.environ.get("XDG_CACHE_HOME", "/tmp"), "pg_cai_bench"),
        help="where llama.cpp's requantizations of --model are kept (default: %(default)s)")


def check_and_start(args):
    """Checks --cai and --model and starts llama.cpp quietly."""
    args.model = os.path.abspath(args.model)
    if not os.path.exists(args.cai):
        sys.exit(f"{args.cai} not found: run `make cai` first")
    if not os.path.exists(args.model):
        sys.exit(f"{args.model} not found (make model)")
    llama_cpp.llama_backend_init()
    llama_cpp.llama_log_set(_quiet_log, ctypes.c_void_p())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(ap)
    ap.add_argument("--batches", default="1,8,32", help="decode batch sizes (default 1,8,32)")
    ap.add_argument("--prompt-tokens", type=int, default=512, help="prefill prompt length")
    ap.add_argument("--long-prompts", default="",
                    help="more prefill prompt lengths, e.g. 2048,4096,8191 (a model's context "
                    "holds its prompt and at least one generated token)")
    ap.add_argument("--gen-tokens", type=int, default=64, help="tokens per sequence in decode runs")
    ap.add_argument("--decode-prompt-tokens", type=int, default=16,
                    help="prompt of each decode sequence: the context decode attends over (default 16)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds; each engine runs once per round, order rotated (median)")
    ap.add_argument("--out", help="write the JSON here (default: tests/bench/out/engine-TIME.json)")
    ap.add_argument("--llama-no-extra-bufts", action="store_true",
                    help="llama.cpp without its repacked and AMX weight buffers (use_extra_bufts "
                    "off: where they crash, as llama-cpp-python 0.3.36's AMX buffers do in "
                    "llama_decode on a Sapphire Rapids VM)")
    ap.add_argument("--read-bandwidth", type=float, metavar="GB/S",
                    help="the memory's read bandwidth at --threads (tests/bench/bench_peak.c): "
                    "also report batch-1 decode's weight bytes per token x tokens/s over it")
    ap.add_argument("--cai-flags", default="", metavar="FLAGS",
                    help="cai bench numerics flags, e.g. --cai-flags=--two-digit-activations")
    args = ap.parse_args()
    args.batches = sorted({int(b) for b in args.batches.split(",")})
    args.long_prompts = sorted({int(n) for n in args.long_prompts.split(",") if n})
    check_and_start(args)
    q8 = q8_0_path(args)

    started = datetime.datetime.now().astimezone()
    load_before = os.getloadavg()
    merged = run_rounds(args, {
        "pg_cai": lambda repeat: bench_ours(args, repeat),
        "llama.cpp same GGUF": lambda repeat: bench_llama(args.model, args, "same GGUF", repeat),
        "llama.cpp Q8_0": lambda repeat: bench_llama(q8, args, "Q8_0", repeat)})
    ours = merged["pg_cai"]
    llama_same = merged["llama.cpp same GGUF"]
    llama_q8 = merged["llama.cpp Q8_0"]
    load_after = os.getloadavg()
    text, summary = report(args, ours, llama_same, llama_q8)
    print(text)
    print(f"\nload average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f} on "
          f"{os.cpu_count()} CPUs" + ("  -- the machine was busy: figures are unreliable"
                                      if max(load_before[0], load_after[0]) > 0.5 else ""))

    result = {
        "started": started.isoformat(timespec="seconds"),
        "command": " ".join([sys.executable] + sys.argv),
        "config": {"model": args.model, "threads": args.threads, "batches": args.batches,
                   "cai_flags": args.cai_flags, "read_bandwidth_gb_s": args.read_bandwidth,
                   "llama_extra_bufts": not args.llama_no_extra_bufts,
                   "prompt_tokens": args.prompt_tokens, "long_prompts": args.long_prompts,
                   "gen_tokens": args.gen_tokens,
                   "decode_prompt_tokens": args.decode_prompt_tokens, "repeat": args.repeat,
                   "llama_n_batch": LLAMA_N_BATCH,
                   "llama_cpp_version": getattr(llama_cpp, "__version__", "?"),
                   "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode().strip(),
                   "omp_wait_policy": omp_wait_policy(), "rounds": args.repeat,
                   "order": "rotated each round",
                   "cpu": cpu_name(), "cpus": os.cpu_count(),
                   "load_average_before": load_before, "load_average_after": load_after},
        "pg_cai": ours,
        "llama_cpp_same_gguf": llama_same,
        "llama_cpp_q8_0": llama_q8,
        "ratios": summary["median"]["ratios"],
        "goals": summary["median"]["goals"],
        "best_run": summary["best run"],
    }
    out = args.out or os.path.join(REPO, "tests", "bench", "out",
                                   f"engine-{started.strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nJSON: {out}")


def omp_wait_policy():
    return os.environ.get("OMP_WAIT_POLICY", "unset (OpenMP default)")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


if __name__ == "__main__":
    main()
