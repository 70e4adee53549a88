#!/usr/bin/env python3
"""bench_embed.py — pg_cai's embeddings (`cai embed`) against llama.cpp's (llama-cpp-python's
Llama(embedding=True).embed()) on the same GGUF files: agreement, then throughput.

Agreement: for each model, the cosine of each text's pg_cai vector with llama.cpp's (both
L2-normalized), on pg_cai's float reference path (`cai embed --float`: the source weights in
fp32, no activation or KV quantization) and on its int8 path (what cai_embed serves).  The
goals: cosine >= 0.999 on the float path, >= 0.99 on the int8 path, for every text.  Models:

  qwen3-embed   synthetic Qwen3-Embedding shape: last-token pooling, causal attention
  gemma3-embed  synthetic EmbeddingGemma-like shape: mean pooling, bidirectional attention
  smollm2       models/SmolLM2-135M-Instruct.Q4_1.gguf, which names no pooling: pg_cai pools
                by the mean, and llama.cpp is told pooling_type=mean

The synthetic models come from tests/synth/write_synth_model --preset NAME (written into a
temporary directory).

Throughput (--bench): texts of 64 tokens (windows of this repository's README, detokenized),
pg_cai (`cai embed -v`, batched, the embedding time without the model's load) against llama.cpp
two ways (the embed() calls alone): batched like pg_cai (one decode per batch, n_ctx holding
the whole batch, so its attention spans the batch's cache), and one text per call (n_ctx 128);
the ratio is against the faster of the two.  Same threads, alternating rounds, medians.  The machine may be shared: the rounds alternate
so that load hits both alike.

    make && PYTHONPATH=/tmp/lcpp python3 tests/bench/bench_embed.py [--bench] [--threads 2]

Exits 1 when an agreement goal is missed, 77 when llama-cpp-python is not importable (a skip).
A measurement, not run by CI.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAI = os.path.join(REPO, "cai")
SYNTH = os.path.join(REPO, "tests", "synth", "write_synth_model")
SMOLLM2 = os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "PostgreSQL is a powerful, open source object-relational database system.",
    "Embeddings map texts to vectors so that similar texts lie close together.",
    "SELECT id FROM documents ORDER BY embedding <=> $1 LIMIT 5;",
    "Le chat est sur la table, et il dort depuis ce matin.",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "A",
]

try:
    import llama_cpp
    from llama_cpp import Llama
except ImportError:
    print("bench_embed: llama-cpp-python is not importable (PYTHONPATH=/tmp/lcpp?): skipped")
    sys.exit(77)


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na = sum(x * x for x in a) ** 0.5
    nb = sum(y * y for y in b) ** 0.5
    return dot / (na * nb) if na > 0 and nb > 0 else 0.0


def cai_embed(model, texts, threads, extra=()):
    """pg_cai's vectors (and the -v line) for texts, one per line of a file."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(t.replace("\n", " ") for t in texts) + "\n")
        path = f.name
    try:
        out = subprocess.run([CAI, "embed", "-m", model, "-T", str(threads), "-v", *extra, path],
                             check=True, capture_output=True, text=True)
    finally:
        os.unlink(path)
    vectors = [[float(x) for x in line.split()] for line in out.stdout.splitlines() if line]
    return vectors, out.stderr


def llama_model(path, threads, pooling, n_batch=512, causal=None):
    kw = {}
    if pooling is not None:
        kw["pooling_type"] = pooling
    return Llama(model_path=path, embedding=True, n_threads=threads, n_threads_batch=threads,
                 n_ctx=max(512, n_batch), n_batch=n_batch, n_ubatch=n_batch, verbose=False,
                 **kw)


def agreement(name, path, pooling, threads):
    m = llama_model(path, threads, pooling)
    ref = [m.embed(t, normalize=True) for t in TEXTS]
    del m
    rows = []
    fl, _ = cai_embed(path, TEXTS, threads, ["--float"])
    i8, _ = cai_embed(path, TEXTS, threads)
    cos_f = [cosine(a, b) for a, b in zip(fl, ref)]
    cos_i = [cosine(a, b) for a, b in zip(i8, ref)]
    rows.append((name, len(ref[0]), min(cos_f), statistics.mean(cos_f), min(cos_i),
                 statistics.mean(cos_i)))
    return rows, min(cos_f) >= 0.999 and min(cos_i) >= 0.99


def bench_texts(path, n_texts, n_tokens=64):
    """n_texts texts of about n_tokens tokens each: windows of the README, detokenized."""
    m = Llama(model_path=path, vocab_only=True, verbose=False)
    corpus = open(os.path.join(REPO, "README.md"), encoding="utf-8").read().replace("\n", " ")
    ids = m.tokenize(corpus.encode(), add_bos=False)
    texts = []
    i = 0
    while len(texts) < n_texts:
        window = ids[i % (len(ids) - n_tokens):][:n_tokens]
        texts.append(m.detokenize(window).decode("utf-8", "replace").replace("\n", " ").strip())
        i += n_tokens + 7
    return texts


def bench(name, path, pooling, threads, n_texts, batch, rounds, llama_batched=True):
    """Texts per second: llama.cpp batched (the same batch as pg_cai: one decode over all its
    texts, n_ctx holding them all), llama.cpp one text per call (n_ctx 128: attention over a
    short cache), and pg_cai batched; alternating, medians."""
    texts = bench_texts(path, n_texts)
    batched = llama_model(path, threads, pooling, n_batch=batch * 80) if llama_batched else None
    single = llama_model(path, threads, pooling, n_batch=128)
    n_tok = sum(len(single.tokenize(t.encode())) for t in texts)
    t_batched, t_single, t_cai = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i in (range(0, len(texts), batch) if batched else ()):
            batched.embed(texts[i:i + batch], normalize=True)
        t_batched.append(time.perf_counter() - t0 if batched else float("inf"))
        t0 = time.perf_counter()
        for t in texts:
            single.embed(t, normalize=True)
        t_single.append(time.perf_counter() - t0)
        _, err = cai_embed(path, texts, threads, ["-b", str(batch), "--step-tokens",
                                                  str(batch * 80)])
        t_cai.append(float(err.split(" in ")[1].split(" s")[0]))
    del batched, single
    lb, ls, ca = (statistics.median(t) for t in (t_batched, t_single, t_cai))
    best = min(lb, ls)
    return (name, n_texts, n_tok / n_texts, batch, n_texts / lb, n_texts / ls, n_texts / ca,
            best / ca)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bench", action="store_true", help="also compare throughput")
    ap.add_argument("--texts", type=int, default=128, help="texts per throughput round")
    ap.add_argument("--batch", type=int, default=32, help="texts per batch")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", default="qwen3-embed,gemma3-embed,smollm2")
    ap.add_argument("--no-llama-batched", action="store_true",
                    help="skip llama.cpp's batched runs (slow on real models: attention over "
                    "the whole batch's cache)")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="bench_embed_")
    models = []
    for name in args.models.split(","):
        if name == "smollm2":
            models.append((name, SMOLLM2, llama_cpp.LLAMA_POOLING_TYPE_MEAN))
            continue
        path = os.path.join(tmp, name + ".gguf")
        subprocess.run([SYNTH, "--preset", name, path], check=True, capture_output=True)
        models.append((name, path, None))

    ok = True
    print("| model | dim | float path: min cosine | mean | int8 path: min cosine | mean |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, path, pooling in models:
        rows, good = agreement(name, path, pooling, args.threads)
        ok &= good
        for r in rows:
            print("| %s | %d | %.6f | %.6f | %.6f | %.6f |" % r)
    print("agreement goals (float >= 0.999, int8 >= 0.99):", "met" if ok else "MISSED")

    if args.bench:
        print()
        print("| model | texts | tokens/text | batch | llama.cpp batched texts/s | "
              "llama.cpp per text texts/s | pg_cai texts/s | pg_cai / best llama.cpp |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, path, pooling in models:
            r = bench(name, path, pooling, args.threads, args.texts, args.batch, args.rounds,
                      not args.no_llama_batched)
            print("| %s | %d | %.1f | %d | %.1f | %.1f | %.1f | %.2fx |" % r, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
