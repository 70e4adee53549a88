#!/usr/bin/env python3
"""make_arch_goldens.py — llama.cpp's logits for each architecture preset, as committed goldens.

For every preset of tests/synth/synth_presets.c (write_synth_model --presets), writes the tiny
synthetic GGUF with the suite's own writer, has llama.cpp (llama-cpp-python) evaluate the fixed
golden tokens from position 0 with logits for every position, and stores them in
tests/unit/goldens/arch_<preset>.golden.  tests/unit/test_arch_golden.c writes the same GGUF,
runs the engine's float and int8 paths over the same tokens and compares, so CI checks every
architecture against llama.cpp without building it.

llama.cpp runs on the CPU with an F32 KV cache and no flash attention, so that its logits are the
model's in float arithmetic (an F16 cache would add ~1e-3 of its own error).  An architecture
llama.cpp cannot load is reported and skipped.

Golden file, little-endian:
    8 bytes   b"CAIGOLD1"
    u32       n_tokens
    u32       n_vocab
    u64       FNV-1a 64 of the GGUF file's bytes (the test regenerates the file and compares)
    i32       tokens[n_tokens]
    f32       logits[n_tokens][n_vocab]

Run once (and again whenever the synthetic writer or a preset changes):

    make tests/synth/write_synth_model
    /opt/benchenv/bin/python tests/bench/make_arch_goldens.py
"""

import argparse
import os
import struct
import subprocess
import sys
import tempfile

import llama_cpp
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, "tests", "synth", "write_synth_model")
OUT_DIR = os.path.join(REPO, "tests", "unit", "goldens")
GGML_TYPE_F32 = 0


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def tool(*args):
    return subprocess.run([TOOL, *args], check=True, capture_output=True, text=True).stdout


def llama_cpp_logits(path, tokens, threads):
    llm = llama_cpp.Llama(model_path=path, n_ctx=64, n_batch=64, n_ubatch=64, n_threads=threads,
                          logits_all=True, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32,
                          flash_attn=False, verbose=False, seed=0)
    llm.eval(tokens)
    logits = np.array(llm.scores[:len(tokens)], dtype=np.float32)
    n_vocab = llm.n_vocab()
    llm.close()
    return logits, n_vocab


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out-dir", default=OUT_DIR)
    ap.add_argument("presets", nargs="*", help="default: every preset")
    args = ap.parse_args()

    if not os.access(TOOL, os.X_OK):
        sys.exit(f"{TOOL} is missing: run 'make tests/synth/write_synth_model' first")
    presets = args.presets or tool("--presets").split()
    tokens = [int(t) for t in tool("--golden-tokens").split()]
    os.makedirs(args.out_dir, exist_ok=True)
    print(f"llama-cpp-python {llama_cpp.__version__}, {len(tokens)} tokens")
    with tempfile.TemporaryDirectory() as tmp:
        for name in presets:
            path = os.path.join(tmp, f"{name}.gguf")
            tool("--preset", name, path)
            with open(path, "rb") as f:
                digest = fnv1a64(f.read())
            try:
                logits, n_vocab = llama_cpp_logits(path, tokens, args.threads)
            except Exception as e:  # llama.cpp refuses the architecture or the file
                print(f"{name}: llama.cpp cannot evaluate it ({e}); no golden written")
                continue
            assert logits.shape == (len(tokens), n_vocab)
            out = os.path.join(args.out_dir, f"arch_{name}.golden")
            with open(out, "wb") as f:
                f.write(b"CAIGOLD1")
                f.write(struct.pack("<IIQ", len(tokens), n_vocab, digest))
                f.write(np.asarray(tokens, dtype="<i4").tobytes())
                f.write(logits.astype("<f4").tobytes())
            top = logits.argmax(axis=1)
            print(f"{name}: {out} ({os.path.getsize(out)} bytes), max |logit| "
                  f"{np.abs(logits).max():.3f}, {len(set(top.tolist()))} distinct top-1 tokens")


if __name__ == "__main__":
    main()
