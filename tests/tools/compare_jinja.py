#!/usr/bin/env python3
"""compare_jinja.py — pg_cai's prompt ids for a tool-bearing conversation against llama.cpp's:
the published chat template rendered with jinja2 as llama-cpp-python renders it (a sandboxed
environment, trim_blocks, lstrip_blocks), tokenized whole by llama.cpp with special tokens parsed.

  PYTHONPATH=/tmp/lcpp python3 tests/tools/compare_jinja.py LLAMA_CPP_DIR

LLAMA_CPP_DIR is a llama.cpp source tree (llama-cpp-python's vendor/llama.cpp): its
models/templates/*.jinja are the models' own templates and models/ggml-vocab-*.gguf their
vocabularies.  tests/tools/render_tools (make tests/tools/render_tools) renders pg_cai's side.
Exits 1 when any case differs, printing the first difference.
"""
import json
import os
import subprocess
import sys

import jinja2.sandbox
import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "ggml-vocab-qwen2.gguf"),
    ("Qwen-Qwen3-0.6B.jinja", "ggml-vocab-qwen2.gguf"),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "ggml-vocab-llama-bpe.gguf"),
]


def conversation():
    # render_tools.c's messages; the call's arguments as the object templates expect
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 18}'},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]


def main():
    llama_dir = sys.argv[1]
    tools_path = os.path.join(ROOT, "tests/tools/compare_tools.json")
    tools = json.load(open(tools_path))
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    failed = 0
    for template_name, vocab_name in CASES:
        template_path = os.path.join(llama_dir, "models/templates", template_name)
        vocab_path = os.path.join(llama_dir, "models", vocab_name)
        vocab = llama_cpp.Llama(model_path=vocab_path, vocab_only=True, verbose=False)
        bos = vocab.detokenize([vocab.token_bos()], special=True).decode() if vocab.token_bos() >= 0 else ""

        def raise_exception(msg):
            raise ValueError(msg)
        text = env.from_string(open(template_path).read()).render(
            messages=conversation(), tools=tools, add_generation_prompt=True, bos_token=bos,
            eos_token="", raise_exception=raise_exception)
        want = vocab.tokenize(text.encode(), add_bos=False, special=True)
        got = [int(x) for x in subprocess.run(
            [os.path.join(ROOT, "tests/tools/render_tools"), vocab_path, template_path, tools_path],
            check=True, capture_output=True, text=True).stdout.split()]
        if got == want:
            print(f"{template_name}: equal, {len(got)} tokens")
            continue
        failed += 1
        i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
        show = lambda ids: vocab.detokenize(ids, special=True).decode(errors="replace")
        print(f"{template_name}: DIFFERENT ({len(got)} tokens, llama.cpp {len(want)}), first at {i}")
        print(f"  same so far: ...{show(got[max(0, i - 12):i])!r}")
        print(f"  pg_cai:      {show(got[i:i + 12])!r}")
        print(f"  llama.cpp:   {show(want[i:i + 12])!r}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
