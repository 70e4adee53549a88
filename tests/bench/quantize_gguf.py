#!/usr/bin/env python3
"""Quantizes a GGUF model with llama.cpp's own quantizer, and checks that llama.cpp runs one.

    quantize_gguf.py quantize SRC DST TYPE     TYPE: q4_k_m, q4_0 or q8_0
    quantize_gguf.py check MODEL [PROMPT]      loads MODEL in llama.cpp, prints 8 greedy
                                               tokens and the prompt's last logits' statistics

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
    """Greedy completion and logit statistics through llama.cpp's C API (no numpy needed)."""
    llama_cpp = import_llama_cpp()
    quiet = llama_cpp.llama_log_callback(lambda level, text, data: None)
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    start = time.monotonic()
    model = llama_cpp.llama_model_load_from_file(path.encode(),
                                                 llama_cpp.llama_model_default_params())
    if not model:
        sys.exit("quantize_gguf.py: llama.cpp could not load %s" % path)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = 256
    cparams.n_batch = 256
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        sys.exit("quantize_gguf.py: llama.cpp could not make a context for %s" % path)
    loaded = time.monotonic() - start
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    tokens = (llama_cpp.llama_token * 256)()
    text = prompt.encode()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), tokens, 256, True, False)
    if n <= 0:
        sys.exit("quantize_gguf.py: llama.cpp could not tokenize %r" % prompt)
    batch = llama_cpp.llama_batch_get_one(tokens, n)
    pieces = []
    first = None
    for _ in range(8):
        if llama_cpp.llama_decode(ctx, batch) != 0:
            sys.exit("quantize_gguf.py: llama_decode failed on %s" % path)
        row = llama_cpp.llama_get_logits_ith(ctx, -1)
        logits = [float(row[i]) for i in range(n_vocab)]
        if first is None:
            first = logits
        best = max(range(n_vocab), key=logits.__getitem__)
        buf = ctypes.create_string_buffer(128)
        m = llama_cpp.llama_token_to_piece(vocab, best, buf, 128, 0, False)
        pieces.append(buf.raw[:max(m, 0)].decode("utf-8", "replace"))
        tokens[0] = best
        batch = llama_cpp.llama_batch_get_one(tokens, 1)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    finite = all(math.isfinite(x) for x in first)
    mean = sum(first) / n_vocab
    std = math.sqrt(sum((x - mean) ** 2 for x in first) / n_vocab)
    print("%s: llama.cpp loaded it in %.1f s; n_vocab %d; prompt %r = %d tokens; greedy %r; "
          "first logits finite=%s min %.3f max %.3f std %.3f"
          % (path, loaded, n_vocab, prompt, n, "".join(pieces), finite, min(first),
             max(first), std))
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
