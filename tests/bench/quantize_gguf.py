#!/usr/bin/env python3
"""Quantizes a GGUF model with llama.cpp's own quantizer, and checks that llama.cpp runs one.

    quantize_gguf.py quantize SRC DST TYPE     TYPE: q4_k_m, q4_0 or q8_0
    quantize_gguf.py check MODEL [PROMPT]      loads MODEL, prints a greedy completion and
                                               the last position's logit statistics

Uses llama-cpp-python's ctypes binding (llama_model_quantize with
llama_model_quantize_default_params), so the files are what llama-quantize would write.
DST is written under a temporary name and renamed when complete.
"""
import ctypes
import math
import os
import sys
import time

FTYPES = {
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
}


def import_llama_cpp():
    try:
        import llama_cpp
    except ImportError as e:
        sys.exit("quantize_gguf.py: llama-cpp-python is not importable by %s (%s); "
                 "run this with the bench venv's python (/opt/benchenv/bin/python)"
                 % (sys.executable, e))
    return llama_cpp


def quantize(src, dst, kind):
    llama_cpp = import_llama_cpp()
    if kind not in FTYPES:
        sys.exit("quantize_gguf.py: unknown type %r (one of %s)" % (kind, ", ".join(FTYPES)))
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[kind])
    params.nthread = os.cpu_count() or 1
    tmp = dst + ".part"
    start = time.monotonic()
    rc = llama_cpp.llama_model_quantize(src.encode(), tmp.encode(), ctypes.byref(params))
    if rc != 0:
        if os.path.exists(tmp):
            os.unlink(tmp)
        sys.exit("quantize_gguf.py: llama_model_quantize(%s -> %s, %s) returned %d"
                 % (src, dst, kind, rc))
    os.replace(tmp, dst)
    print("%s: %s, %.2f GB, %.0f s" % (dst, kind, os.path.getsize(dst) / 1e9,
                                        time.monotonic() - start))


def check(path, prompt):
    llama_cpp = import_llama_cpp()
    start = time.monotonic()
    llm = llama_cpp.Llama(model_path=path, n_ctx=256, logits_all=True, verbose=False)
    loaded = time.monotonic() - start
    out = llm(prompt, max_tokens=8, temperature=0.0)
    text = out["choices"][0]["text"]
    llm.reset()
    tokens = llm.tokenize(prompt.encode())
    llm.eval(tokens)
    logits = [float(x) for x in llm.scores[llm.n_tokens - 1]]
    finite = all(math.isfinite(x) for x in logits)
    mean = sum(logits) / len(logits)
    std = math.sqrt(sum((x - mean) ** 2 for x in logits) / len(logits))
    print("%s: llama.cpp loaded in %.1f s, n_vocab %d, prompt %r -> %d tokens, completion %r; "
          "last logits finite=%s min %.3f max %.3f std %.3f"
          % (path, loaded, llm.n_vocab(), prompt, len(tokens), text, finite,
             min(logits), max(logits), std))
    if not finite or not std > 0.0:
        sys.exit("quantize_gguf.py: %s: the logits are not finite or all equal" % path)


def main(argv):
    if len(argv) == 4 and argv[0] == "quantize":
        quantize(argv[1], argv[2], argv[3])
    elif len(argv) in (2, 3) and argv[0] == "check":
        check(argv[1], argv[2] if len(argv) == 3 else "Hello")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
