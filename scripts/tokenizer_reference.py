#!/usr/bin/env python3
"""
tokenizer_reference.py — reference token ids for tests/unit/test_tokenizer.c and
tests/unit/test_chat_template.c, from an independent implementation: llama.cpp, through
llama-cpp-python (pip install llama-cpp-python jinja2).

Usage: scripts/tokenizer_reference.py [models/SmolLM2-135M-Instruct.Q4_1.gguf] > /tmp/ref.c

It prints C arrays for:
  - the test strings under SmolLM2's own tokenizer (byte-level BPE, pre "smollm"), and under
    the same vocabulary and merges with pre-tokenizer "llama-bpe" and "qwen2" (vocab-only
    GGUFs written to a temporary directory; the C test builds the same ones in memory);
  - the test strings under a small SentencePiece vocabulary defined below (the C test builds
    the same vocabulary), with and without the space prefix, special tokens off and on;
  - a ChatML conversation rendered by the model's own Jinja template (jinja2) and tokenized
    whole with special tokens parsed.
The C tests must reproduce every array exactly; regenerate and paste when the cases change.
"""
import os
import struct
import sys
import tempfile

import jinja2
import llama_cpp

# Strings the byte-level BPE tests encode (keep in sync with bpe_cases[] in test_tokenizer.c).
BPE_CASES = [
    "Hello world",
    "I'm sure they'll say we've done it, isn't it? SHE'D",
    "12345 and 3.14159",
    "def add(a, b):\n    return a + b  # sum\n",
    "  multiple   spaces\tand\ttabs  ",
    "line one\n\nline two\r\nthree\n",
    "h\u00e9llo w\u00f6rld \u65e5\u672c\u8a9e \U0001F642",
    "<|im_end|>",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0661\u0662\u0663 \u00b2",
    "x = {'a': [1, 22, 333, 4444]};",
    "http://example.com/a_b?q=1&r=%20",
    "!!!???... --- ***",
    "trailing spaces   ",
    " leading space",
]

# The small SentencePiece vocabulary (keep in sync with spm_pieces[] in test_tokenizer.c):
# <unk>, <s>, </s>, <0x00>..<0xFF>, then these pieces with their scores.
SPM_PIECES = [
    ("\u2581", -1), ("e", -2), ("l", -3), ("o", -4), ("h", -5), ("w", -6), ("r", -7), ("d", -8),
    ("H", -9), ("t", -10), ("a", -11), ("n", -12), ("!", -13), ("\u00e9", -14), ("\u65e5", -15),
    ("\u672c", -16), ("ll", -20), ("he", -21), ("\u2581t", -22), ("\u2581the", -23), ("llo", -24),
    ("ello", -25), ("\u2581H", -26), ("\u2581He", -27), ("\u2581Hello", -28), ("\u2581w", -29),
    ("or", -30), ("\u2581wor", -31), ("ld", -32), ("\u2581world", -33), ("an", -34),
    ("\u2581an", -35), ("\u2581and", -36), ("\u2581\u65e5\u672c", -37), ("\u2581\u2581", -38),
    ("\u2581\u00e9", -39), ("th", -40),
]

SPM_CASES = [
    "Hello world",
    "Hello  world!",
    "the and",
    "\u65e5\u672c\u8a9e",
    "h\u00e9llo\tw\u00f6rld\n",
    "<s>Hello</s> world",
    "   Hello",
    "<0x41>",
]

CHAT = [
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi there. How can I help?"},
    {"role": "user", "content": "What's 2+2?"},
]


def read_gguf_kv(path):
    """The metadata of a GGUF file as a dict (arrays as lists)."""
    fmts = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}
    with open(path, 'rb') as f:
        data = f.read(64 << 20)
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from('<' + fmt, data, pos)[0]
        pos += struct.calcsize('<' + fmt)
        return v

    def string():
        nonlocal pos
        n = take('Q')
        s = data[pos:pos + n].decode('utf-8', 'surrogateescape')
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et = take('I')
            return (et, [value(et) for _ in range(take('Q'))])
        return take(fmts[t])

    assert data[:4] == b'GGUF'
    pos = 8
    take('Q')
    n_kv = take('Q')
    kv = {}
    for _ in range(n_kv):
        k = string()
        kv[k] = value(take('I'))
    return kv


def write_vocab_gguf(path, kv):
    """Writes a tensor-less GGUF holding kv (ints as u32, lists as (elem_type, list))."""
    def s(x):
        b = x.encode('utf-8', 'surrogateescape')
        return struct.pack('<Q', len(b)) + b

    def v(x):
        if isinstance(x, bool):
            return struct.pack('<I?', 7, x)
        if isinstance(x, int):
            return struct.pack('<II', 4, x)
        if isinstance(x, float):
            return struct.pack('<If', 6, x)
        if isinstance(x, str):
            return struct.pack('<I', 8) + s(x)
        et, items = x
        out = struct.pack('<IIQ', 9, et, len(items))
        if et == 8:
            return out + b''.join(s(i) for i in items)
        return out + struct.pack('<%d%s' % (len(items), {5: 'i', 6: 'f'}[et]), *items)

    with open(path, 'wb') as f:
        f.write(b'GGUF' + struct.pack('<IQQ', 3, 0, len(kv)))
        for k, x in kv.items():
            f.write(s(k) + v(x))


LLAMA_HPARAMS = {
    'general.architecture': 'llama', 'llama.context_length': 256, 'llama.embedding_length': 64,
    'llama.block_count': 1, 'llama.feed_forward_length': 128, 'llama.attention.head_count': 4,
    'llama.attention.layer_norm_rms_epsilon': 1e-5,
}


def c_ids(name, rows):
    out = ["static const int32_t %s[][%d] = {" % (name, max(len(r) for r in rows) + 1)]
    for r in rows:
        out.append("\t{%d%s}," % (len(r), "".join(", %d" % i for i in r)))
    out.append("};")
    return "\n".join(out)


def tokenize_all(path, cases, special):
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    return [llm.tokenize(c.encode('utf-8'), add_bos=False, special=special) for c in cases]


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else 'models/SmolLM2-135M-Instruct.Q4_1.gguf'
    kv = read_gguf_kv(model)
    tmp = tempfile.mkdtemp(prefix='cai_tokref_')

    print("/* generated by scripts/tokenizer_reference.py with llama-cpp-python %s */"
          % llama_cpp.__version__)
    print(c_ids("bpe_smollm_ids", tokenize_all(model, BPE_CASES, False)))
    for pre, name in (("llama-bpe", "bpe_llama3_ids"), ("qwen2", "bpe_qwen2_ids")):
        variant = dict(LLAMA_HPARAMS)
        variant.update({
            'tokenizer.ggml.model': 'gpt2', 'tokenizer.ggml.pre': pre,
            'tokenizer.ggml.tokens': kv['tokenizer.ggml.tokens'],
            'tokenizer.ggml.token_type': kv['tokenizer.ggml.token_type'],
            'tokenizer.ggml.merges': kv['tokenizer.ggml.merges'],
            'tokenizer.ggml.bos_token_id': 1, 'tokenizer.ggml.eos_token_id': 2,
        })
        path = os.path.join(tmp, pre + '.gguf')
        write_vocab_gguf(path, variant)
        print(c_ids(name, tokenize_all(path, BPE_CASES, False)))

    tokens = ['<unk>', '<s>', '</s>'] + ['<0x%02X>' % b for b in range(256)] + [p for p, _ in SPM_PIECES]
    scores = [0.0] * 259 + [float(sc) for _, sc in SPM_PIECES]
    types = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES)
    for prefix in (True, False):
        spm = dict(LLAMA_HPARAMS)
        spm.update({
            'tokenizer.ggml.model': 'llama', 'tokenizer.ggml.tokens': (8, tokens),
            'tokenizer.ggml.scores': (6, scores), 'tokenizer.ggml.token_type': (5, types),
            'tokenizer.ggml.bos_token_id': 1, 'tokenizer.ggml.eos_token_id': 2,
            'tokenizer.ggml.unknown_token_id': 0, 'tokenizer.ggml.add_bos_token': True,
            'tokenizer.ggml.add_space_prefix': prefix,
        })
        path = os.path.join(tmp, 'spm%d.gguf' % prefix)
        write_vocab_gguf(path, spm)
        for special in (False, True):
            print(c_ids("spm_ids_prefix%d_special%d" % (prefix, special),
                        tokenize_all(path, SPM_CASES, special)))

    template = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(
        kv['tokenizer.chat_template'])
    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    text = template.render(messages=CHAT, add_generation_prompt=True)
    print("/* %r */" % text)
    print(c_ids("chatml_conversation_ids", [llm.tokenize(text.encode(), add_bos=False, special=True)]))


if __name__ == '__main__':
    main()
