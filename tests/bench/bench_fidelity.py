#!/usr/bin/env python3
"""bench_fidelity.py — how close pg_cai's int8 path and llama.cpp's quantized paths come to one
float reference, on the same tokens, in one run.

The reference is pg_cai's float path: the GGUF's weights dequantized to fp32, no activation or
KV quantization (what `cai eval` compares its int8 path with).  `cai eval --logits-out` writes
the scored tokens and both of its paths' logits; llama.cpp (llama-cpp-python) then scores the
same windows of the same tokens, from position 0 of each window, on:

  1. the same GGUF file (Q4_1 for the default model): the source weights exactly, activations
     quantized to 8 bits in blocks of 32 for its dot products (ggml's q8_1), F16 KV cache;
  2. a Q8_0 requantization of it (the baseline bench_engine.py times): 8-bit weights in blocks
     of 32 as well;
  3. an F32 requantization of it (the source weights dequantized, float matrix products, F16 KV
     cache): the check that both engines compute the same model, which should agree with the
     reference on nearly every position.

For each it prints, over every position that predicts a next token, the top-1 agreement with the
reference's argmax, the mean KL(reference || path) of the next-token distributions and the
perplexity, and whether each of pg_cai's int8 variants meets the fidelity goal: top-1 agreement
and mean KL at least as good as llama.cpp's best quantized path on the same file (the better of
rows 1 and 2 on each figure), perplexity within 1% of the reference.  Everything is also written
as JSON (--out).  A measurement, not a test: not run by CI.

    make cai && /opt/benchenv/bin/python tests/bench/bench_fidelity.py

pg_cai's int8 path is scored as loaded by default; --variant FLAGS (repeatable) scores it with
`cai eval` numerics flags instead, each variant its own row in the same run, for example

    ... bench_fidelity.py --variant= --variant=--gptq-rounding \
        --variant=--two-digit-activations \
        --variant="--two-digit-activations --gptq-rounding"

(with "=": argparse would take a separate value that starts with "--" for an option).

The logits are kept in a temporary directory while it runs: 4 * n_vocab bytes per token and
path (1.5 GB per path for the whole GPL-3 text with SmolLM2's 49152-token vocabulary; 7.9 GB
per path with Gemma 3's 262144 tokens, where --max-tokens keeps it smaller).  Another model:

    /opt/benchenv/bin/python tests/bench/bench_fidelity.py --model models/gemma-3-270m-q4_k_m.gguf

Both engines score exactly the token ids `cai eval` wrote (BOS at the start of the text only, as
`cai eval` tokenizes it), so a model's BOS conventions need nothing here.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

from bench_engine import (REPO, add_common_arguments, check_and_start, cpu_name,
                          requantized_path)

import llama_cpp
import numpy as np

DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"
ROWS_PER_CHUNK = 128


def log_softmax(rows):
    """Row-wise log-softmax in float64."""
    rows = rows.astype(np.float64)
    rows -= rows.max(axis=1, keepdims=True)
    return rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))


class Figures:
    """Agreement with the reference, KL(reference || path) and the path's perplexity."""

    def __init__(self):
        self.positions = 0
        self.agree = 0
        self.kl = 0.0
        self.nll = 0.0

    def add(self, ref_logits, logits, next_tokens):
        for a in range(0, len(next_tokens), ROWS_PER_CHUNK):
            b = min(a + ROWS_PER_CHUNK, len(next_tokens))
            ref = log_softmax(ref_logits[a:b])
            path = log_softmax(logits[a:b])
            # argmax with the lowest id on ties, as cai eval takes it
            self.agree += int((ref_logits[a:b].argmax(axis=1) == logits[a:b].argmax(axis=1)).sum())
            self.kl += float((np.exp(ref) * (ref - path)).sum())
            self.nll -= float(path[np.arange(b - a), next_tokens[a:b]].sum())
            self.positions += b - a

    def result(self):
        return {"positions": self.positions,
                "top1_agreement": self.agree / self.positions,
                "mean_kl": self.kl / self.positions,
                "perplexity": float(np.exp(self.nll / self.positions))}


def windows(n_tokens, ctx):
    """(start, length) of cai eval's windows: consecutive, ctx tokens each, the last shorter."""
    return [(s, min(ctx, n_tokens - s)) for s in range(0, n_tokens, ctx) if n_tokens - s >= 2]


def score_ours(tokens, ctx, logits, n_vocab):
    """Figures of one of pg_cai's paths (logits: the memmapped file) against the float path."""
    ref = np.memmap(logits["float"], dtype=np.float32, mode="r").reshape(-1, n_vocab)
    path = np.memmap(logits["path"], dtype=np.float32, mode="r").reshape(-1, n_vocab)
    fig = Figures()
    for s, n in windows(len(tokens), ctx):
        fig.add(ref[s:s + n - 1], path[s:s + n - 1], tokens[s + 1:s + n])
    return fig.result()


def score_llama(model, tokens, ctx, float_path, n_vocab, threads, label):
    """Figures of llama.cpp on `model` against pg_cai's float path, window by window."""
    print(f"{label}: scoring {len(tokens)} tokens", file=sys.stderr, flush=True)
    llm = llama_cpp.Llama(model_path=model, n_ctx=ctx, n_batch=ctx, n_ubatch=ctx,
                          n_threads=threads, n_threads_batch=threads, logits_all=True,
                          verbose=False)
    if llm.n_vocab() != n_vocab:
        sys.exit(f"{model}: llama.cpp has {llm.n_vocab()} tokens, pg_cai {n_vocab}")
    ref = np.memmap(float_path, dtype=np.float32, mode="r").reshape(-1, n_vocab)
    fig = Figures()
    start = time.monotonic()
    for s, n in windows(len(tokens), ctx):
        llm.reset()
        llm.eval(tokens[s:s + n].tolist())
        fig.add(ref[s:s + n - 1], np.asarray(llm.scores[:n - 1], dtype=np.float32),
                tokens[s + 1:s + n])
    result = fig.result()
    result["seconds"] = time.monotonic() - start
    llm.close()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(ap)
    ap.add_argument("--text", default=DEFAULT_TEXT, help="text to score (default: %(default)s)")
    ap.add_argument("--ctx", type=int, default=512, help="window length in tokens (default 512)")
    ap.add_argument("--max-tokens", type=int, default=0,
                    help="score only the first N tokens of the text; 0 = all")
    ap.add_argument("--out", help="write the JSON here (default: tests/bench/out/fidelity-TIME.json)")
    ap.add_argument("--variant", action="append", metavar="FLAGS",
                    help="cai eval numerics flags of one int8 row (repeatable; default: one row "
                         "with none)")
    args = ap.parse_args()
    variants = args.variant or [""]
    check_and_start(args)
    llama_models = [("llama.cpp, same GGUF", args.model),
                    ("llama.cpp, Q8_0",
                     requantized_path(args, llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "Q8_0")),
                    ("llama.cpp, F32 (check)",
                     requantized_path(args, llama_cpp.LLAMA_FTYPE_ALL_F32, "F32"))]
    started = datetime.datetime.now().astimezone()

    with tempfile.TemporaryDirectory(prefix="pg_cai_fidelity.") as tmp:
        ours, commands, reports = [], [], []
        float_path = os.path.join(tmp, "float.f32")
        for i, flags in enumerate(variants):
            out_dir = os.path.join(tmp, f"variant{i}")
            os.mkdir(out_dir)
            cmd = [args.cai, "eval", "-m", args.model, "-c", str(args.ctx), "-n",
                   str(args.max_tokens), "-T", str(args.threads), "--json", "--logits-out",
                   out_dir] + flags.split() + [args.text]
            print("pg_cai: " + " ".join(cmd), file=sys.stderr, flush=True)
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"cai eval failed ({p.returncode}): {p.stderr.strip()}")
            report = json.loads(p.stdout)
            if i == 0:
                tokens = np.fromfile(os.path.join(out_dir, "tokens.i32"), dtype=np.int32)
                os.rename(os.path.join(out_dir, "float.f32"), float_path)
                n_vocab = os.path.getsize(float_path) // (4 * len(tokens))
            else:
                # the float path does not depend on the int8 path's numerics: one copy is kept
                os.remove(os.path.join(out_dir, "float.f32"))
            # the numerics cai eval decided (auto resolved), then the flags that asked for them
            label = "pg_cai, %s %s %s" % (report.get("weights", "int8"),
                                          report.get("weight_rounding", ""),
                                          report.get("activation_precision", ""))
            label += f" ({flags.strip()})" if flags.strip() else " (defaults)"
            fig = score_ours(tokens, args.ctx, {"float": float_path,
                                                "path": os.path.join(out_dir, "int8.f32")}, n_vocab)
            os.remove(os.path.join(out_dir, "int8.f32"))
            # the engine's own report and this script's arithmetic must tell the same story
            if (fig["positions"] != report["positions"]
                    or abs(fig["top1_agreement"] - report["top1_agreement"]) > 1e-6):  # printed to 6 places
                sys.exit(f"figures from the logits files disagree with cai eval's report: "
                         f"{fig} vs {report}")
            ours.append((label, fig))
            commands.append(" ".join(cmd))
            reports.append(report)
        rows = ours + [("pg_cai, float (reference)",
                        score_ours(tokens, args.ctx, {"float": float_path, "path": float_path},
                                   n_vocab))]
        for label, path in llama_models:
            rows.append((label, score_llama(path, tokens, args.ctx, float_path, n_vocab,
                                            args.threads, label)))

    ref_ppl = rows[len(ours)][1]["perplexity"]
    width = max(28, max(len(label) for label, _ in rows))
    print(f"\n{len(tokens)} tokens of {args.text}, windows of {args.ctx}, "
          f"{rows[0][1]['positions']} positions; reference: pg_cai's float path\n")
    print(f"{'path':{width}} {'top-1 agree':>12} {'mean KL':>10} {'perplexity':>11} {'vs ref':>8}")
    for label, r in rows:
        print(f"{label:{width}} {100 * r['top1_agreement']:11.2f}% {r['mean_kl']:10.5f} "
              f"{r['perplexity']:11.3f} {100 * (r['perplexity'] / ref_ppl - 1):+7.2f}%")
    # llama.cpp's best quantized path on the same file: rows "same GGUF" and "Q8_0"
    peers = [r for label, r in rows[len(ours) + 1:len(ours) + 3]]
    best_agree = max(r["top1_agreement"] for r in peers)
    best_kl = min(r["mean_kl"] for r in peers)
    goal = {}
    print(f"\nfidelity goal: top-1 >= {100 * best_agree:.2f}% and mean KL <= {best_kl:.5f} "
          f"(llama.cpp's best quantized path on this file), perplexity within 1%")
    for label, r in ours:
        met = {"top1": r["top1_agreement"] >= best_agree, "kl": r["mean_kl"] <= best_kl,
               "perplexity": abs(r["perplexity"] / ref_ppl - 1) <= 0.01}
        goal[label] = met
        print(f"  {label:{width}} " + ", ".join(f"{k} {'met' if v else 'missed'}"
                                                for k, v in met.items()))

    result = {
        "started": started.isoformat(timespec="seconds"),
        "command": " ".join([sys.executable] + sys.argv),
        "config": {"model": args.model, "text": args.text, "ctx": args.ctx,
                   "tokens": int(len(tokens)), "n_vocab": int(n_vocab), "threads": args.threads,
                   "cai_eval_commands": commands,
                   "llama_cpp_version": getattr(llama_cpp, "__version__", "?"),
                   "llama_models": dict((label, path) for label, path in llama_models),
                   "cpu": cpu_name()},
        "cai_eval_reports": reports,
        "paths": dict(rows),
        "goal": goal,
    }
    out = args.out or os.path.join(REPO, "tests", "bench", "out",
                                   f"fidelity-{started.strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
