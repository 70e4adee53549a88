#!/usr/bin/env python3
"""gemma_tokenizer_goldens.py — writes tests/unit/data/gemma3_tokenizer_goldens.txt: a corpus of
text lines and, for each, the token ids llama.cpp gives it under Gemma 3's SentencePiece
vocabulary (262144 tokens), which test_tokenizer_gemma3.c compares with pg_cai's tokenizer.

Run once (the output is committed); it needs the Gemma file (scripts/fetch-model.sh
gemma3-270m) and llama-cpp-python:

    /opt/benchenv/bin/python tests/bench/gemma_tokenizer_goldens.py \\
        [--model models/gemma-3-270m-q4_k_m.gguf] [--out tests/unit/data/gemma3_tokenizer_goldens.txt]

The corpus is deterministic: every line of the GPL-3 text (when present) and lines generated
from a fixed seed that mix Unicode scripts, code, whitespace runs, digit runs, emoji, byte
fallbacks and text that looks like special tokens.  Each line is tokenized on its own, without
BOS and with special tokens NOT parsed (the way pg_cai encodes message content).

File format, one record per line (UTF-8):
    HASH<TAB>COUNT<TAB>TEXT[<TAB>IDS]
HASH is the 64-bit FNV-1a of the ids as little-endian int32 (16 hex digits), COUNT the number
of ids, TEXT the line with \\\\, \\n, \\r, \\t and other bytes below 0x20 (and 0x7f) escaped as
\\xNN, and IDS (space-separated) present for the first FULL_IDS records only, so that a
mismatch there shows the ids themselves.  Lines starting with # are comments.
"""

import argparse
import os
import random
import sys

import llama_cpp

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GPL = "/usr/share/common-licenses/GPL-3"
N_GENERATED = 4500
FULL_IDS = 40
SEED = 20250

SCRIPTS = [
    "Hello world, this is a test.", "Ünïcödé façade naïve café", "Привет, как дела? Съешь же ещё",
    "Γειά σου κόσμε", "日本語のテキストです。東京都", "中文文本，你好世界！", "한국어 텍스트입니다",
    "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "ሰላም ለዓለም", "Ꭳ Ꮃ Ꮎ Cherokee",
    "ᚠᛇᚻ runes", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝐀𝐁𝐂", "Ǆ ǅ ǆ ﬁ ﬂ ligatures", "e\u0301 combining a\u0308 o\u0302",
    "zero\u200bwidth\u200djoiner\ufeffbom", "tab\there", "vertical\x0bfeed\x0cform",
]
CODE = [
    "def f(x):\n    return x ** 2  # square", "int main(void) { return 0; }",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}", "SELECT * FROM t WHERE id = 42;",
    "const re = /^[a-z]+$/gi;", "{\"key\": [1, 2.5, -3e10, null, true]}", "<div class=\"x\">&amp;</div>",
    "#include <stdio.h>", "x = y != z && a <= b || !c", "fn main() -> Result<(), Box<dyn Error>> {}",
    "    indented    with    spaces", "$HOME/.config/app.toml", "https://example.com/path?q=1&r=2#frag",
]
EMOJI = ["😀", "🚀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🤖", "✨", "🧪", "⚙️", "☕", "🏳️‍🌈"]
SPECIAL_LIKE = [
    "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>",
    "<start_of_turn>user\nhi<end_of_turn>", "<start_of_image>", "<0x41>", "<0xFF>", "[INST]",
    "<|im_start|>", "</s>", "<s>", "<unused0>", "<unused99>", "<b>bold</b>", "< bos >", "<<bos>>",
]
WS = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "    ", "\u00a0", "\u3000", " \n ", "\t\t"]


def digits(rng):
    return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 24)))


def generated_line(rng):
    parts = []
    for _ in range(rng.randint(1, 7)):
        kind = rng.randrange(7)
        if kind == 0:
            s = rng.choice(SCRIPTS)
            a = rng.randrange(len(s))
            parts.append(s[a:a + rng.randint(1, 30)])
        elif kind == 1:
            parts.append(rng.choice(CODE))
        elif kind == 2:
            parts.append("".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4))))
        elif kind == 3:
            parts.append(rng.choice(SPECIAL_LIKE))
        elif kind == 4:
            parts.append(rng.choice(WS) * rng.randint(1, 5))
        elif kind == 5:
            parts.append(digits(rng) + rng.choice(["", ".", ",", " ", "e", "-"]) + digits(rng))
        else:
            # characters from anywhere in the planes most text uses (no surrogates)
            cps = [rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff),
                               rng.randint(0x3000, 0xd7ff), rng.randint(0xe000, 0xfffd),
                               rng.randint(0x10000, 0x1faff)]) for _ in range(rng.randint(1, 12))]
            parts.append("".join(chr(c) for c in cps))
    return "".join(parts)


def corpus():
    lines = []
    if os.path.exists(GPL):
        with open(GPL, encoding="utf-8") as f:
            lines += [ln.rstrip("\n") for ln in f]
    lines += SCRIPTS + CODE + EMOJI + SPECIAL_LIKE + WS
    rng = random.Random(SEED)
    lines += [generated_line(rng) for _ in range(N_GENERATED)]
    return [ln for ln in lines if ln != ""]


def escape(text):
    """The line's UTF-8 with backslash, CR, LF, TAB and other control bytes escaped."""
    named = {0x5c: b"\\\\", 0x0a: b"\\n", 0x0d: b"\\r", 0x09: b"\\t"}
    buf = bytearray()
    for b in text.encode("utf-8"):
        if b in named:
            buf += named[b]
        elif b < 0x20 or b == 0x7f:
            buf += b"\\x%02x" % b
        else:
            buf.append(b)
    return buf.decode("utf-8")


def fnv1a64(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for b in (i & 0xffffffff).to_bytes(4, "little"):
            h ^= b
            h = (h * 0x100000001b3) & 0xffffffffffffffff
    return h


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(REPO, "models", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "unit", "data",
                                                  "gemma3_tokenizer_goldens.txt"))
    args = ap.parse_args()
    llm = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    lines = corpus()
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        f.write(f"# Gemma 3 tokenizer goldens: {len(lines)} lines, llama.cpp through "
                f"llama-cpp-python {llama_cpp.__version__}, no BOS, special tokens not parsed\n")
        f.write("# generated by tests/bench/gemma_tokenizer_goldens.py; format in its docstring\n")
        for n, text in enumerate(lines):
            ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
            rec = f"{fnv1a64(ids):016x}\t{len(ids)}\t{escape(text)}"
            if n < FULL_IDS:
                rec += "\t" + " ".join(str(i) for i in ids)
            f.write(rec + "\n")
    print(f"{args.out}: {len(lines)} lines", file=sys.stderr)


if __name__ == "__main__":
    main()
