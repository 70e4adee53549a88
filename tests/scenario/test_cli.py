"""The `cai` command line on the real model: a greedy chat reply is the same for every thread
count (issue 2's first "must show"), and `cai eval --logits-out` writes exactly the logits its
own figures were computed from (the files tests/bench/bench_fidelity.py compares llama.cpp
against), or fails clearly; `cai bench --follow-up` times each prompt as a cached conversation's
next turn, and that turn really reuses the whole prompt; `cai embed` gives one unit vector per
text, the model's width, the same for a text alone or in a batch, from -p or a file, as numbers
or JSON, and refuses what it cannot embed.  Needs no server; uses the repository's ./cai and
$PG_CAI_TEST_MODEL."""
import array
import json
import math
import os
import shutil
import subprocess
import tempfile

from pgtest import Checks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAI = os.path.join(ROOT, "cai")
MODEL = os.environ.get("PG_CAI_TEST_MODEL",
                       os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
TEXT = "/usr/share/common-licenses/GPL-3"
EVAL_TOKENS = 48
EVAL_CTX = 16


# The commands that load a model share one weights cache: the defaults round this small model's
# weights by GPTQ, seconds of every load, so it is done once (the cache's own checks are in
# test_weights_cache.py).
WEIGHTS_CACHE = tempfile.mkdtemp(prefix="cai_cli_weights_")
CACHED_COMMANDS = {"run", "eval", "bench", "embed"}


def cai(*args, timeout=300):
    args = list(args)
    if args and args[0] in CACHED_COMMANDS:
        args[1:1] = ["--weights-cache", WEIGHTS_CACHE]
    return subprocess.run([CAI] + args, capture_output=True, text=True, timeout=timeout)


def read_array(path, typecode):
    a = array.array(typecode)
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a


def figures(tokens, int8, flt, n_vocab, ctx):
    """Top-1 agreement and mean KL(float || int8) over the windows, as cmd_eval.c defines them."""
    agree, kl, positions = 0, 0.0, 0
    for start in range(0, len(tokens), ctx):
        n = min(ctx, len(tokens) - start)
        for i in range(start, start + n - 1):
            q = int8[i * n_vocab:(i + 1) * n_vocab]
            f = flt[i * n_vocab:(i + 1) * n_vocab]
            q_max, f_max = max(q), max(f)
            q_lse = q_max + math.log(sum(math.exp(v - q_max) for v in q))
            f_lse = f_max + math.log(sum(math.exp(v - f_max) for v in f))
            agree += q.index(q_max) == f.index(f_max)
            kl += sum(math.exp(fv - f_lse) * ((fv - f_lse) - (qv - q_lse)) for fv, qv in zip(f, q))
            positions += 1
    return agree / positions, kl / positions, positions


c = Checks()

# The int8 weights: there SmolLM2's greedy reply names Paris.  (On the file's own Q4_1 weights
# it is "L'Étoile, la Marseillaise, ...", as llama.cpp's on the same file.)
prompt = ["run", "-m", MODEL, "--weights", "int8", "--chat", "-p", "What is the capital of France?",
          "--temp", "0", "--max-tokens", "32"]
replies = [cai(*prompt, "-T", str(t)) for t in (1, 2, 3)]
c.check("cai run exits 0", all(r.returncode == 0 for r in replies), repr(replies[0].stderr[-300:]))
c.check("the greedy reply mentions Paris", "Paris" in replies[0].stdout, repr(replies[0].stdout))
c.check("the greedy reply is the same with 1, 2 and 3 threads",
        len({r.stdout for r in replies}) == 1, repr([r.stdout for r in replies]))

# Stop strings against replies that start with partial UTF-8 (an emoji is three tokens here):
# this command used to crash the engine (a stop check on a reply with no text yet).
emoji = ["run", "-m", MODEL, "--chat", "-p", "Say hi with emoji", "--temp", "0", "--max-tokens", "12"]
r = cai(*emoji, "--stop", "zzz")
c.check("a stop string before the reply has any text: cai run exits 0", r.returncode == 0,
        "exit %d: %r" % (r.returncode, r.stderr[-300:]))
plain = cai(*emoji)
c.check("a stop string that never matches leaves the reply unchanged",
        r.returncode == 0 and r.stdout == plain.stdout and len(plain.stdout.strip()) > 0,
        repr((r.stdout, plain.stdout)))
first_char = plain.stdout[:1]
r = cai(*emoji, "--stop", first_char)
c.check("a multi-byte stop string at the reply's first character leaves it empty",
        r.returncode == 0 and r.stdout.strip() == "" and ord(first_char or "a") > 0xFFFF,
        repr((first_char, r.stdout)))
r = cai(*prompt, "--stop", "ital of Fr")
c.check("a stop string split across tokens cuts the reply before it",
        r.returncode == 0 and r.stdout.strip() == "The cap", repr(r.stdout))

# The request limits (src/common/cai.h) are the SQL options' too: usage errors (exit 2) that
# name the flag and the range, before the model loads; each edge itself runs.
for flags, message in ((["--temp", "2.5"], "--temp must be between 0 and 2, got 2.5"),
                       (["--top-p", "0"], "--top-p must be greater than 0 and at most 1, got 0"),
                       (["--top-k", "1000001"], "--top-k must be between 0 and 1000000"),
                       (["--max-tokens", "1048577"], "--max-tokens must be between 1 and 1048576"),
                       (["--stop", "x" * 257], "--stop takes strings of at most 256 bytes")):
    r = cai("run", "-m", MODEL, "-p", "Hi", *flags)
    c.check("cai run %s is refused: %s" % (flags[0], message),
            r.returncode == 2 and message in r.stderr, repr(r.stderr[-300:]))
r = cai("run", "-m", MODEL, "-p", "Hi", "--max-tokens", "2", "--temp", "2", "--top-p", "1",
        "--top-k", "1000000", "--stop", "x" * 256)
c.check("cai run at each limit's edge runs", r.returncode == 0, repr(r.stderr[-300:]))
r = cai("run", "-m", MODEL, "-p", "Hi", "--max-tokens", "2", "--compensated-rounding")
c.check("cai run takes --compensated-rounding, the old name of --gptq-rounding", r.returncode == 0,
        repr(r.stderr[-300:]))
for flag, value, choices in (("--weight-rounding", "compensated", "(auto, nearest or gptq)"),
                             ("--activations", "int4", "(auto, int8, two_digit or int8_256)")):
    r = cai("run", "-m", MODEL, "-p", "Hi", flag, value)
    c.check("cai run %s %s is refused, naming the choices" % (flag, value),
            r.returncode == 1 and choices in r.stderr, repr(r.stderr[-300:]))

# Penalties and filters: the same limits as the SQL options, named in each usage error; a
# logit_bias id outside the vocabulary is the engine's error (it knows the model).
for flags, message in ((["--presence-penalty", "2.5"], "--presence-penalty must be between -2 and 2, got 2.5"),
                       (["--frequency-penalty", "-3"], "--frequency-penalty must be between -2 and 2, got -3"),
                       (["--repetition-penalty", "0"], "--repetition-penalty must be greater than 0 and at most 10, got 0"),
                       (["--min-p", "1.5"], "--min-p must be between 0 and 1, got 1.5"),
                       (["--min-p", "x"], "--min-p expects a number"),
                       (["--logit-bias", "abc=1"], "--logit-bias expects ID=BIAS"),
                       (["--logit-bias", "5=101"], "--logit-bias BIAS must be a number between -100 and 100"),
                       (["--logit-bias", "5"], "--logit-bias expects ID=BIAS")):
    r = cai("run", "-m", MODEL, "-p", "Hi", *flags)
    c.check("cai run %s is refused: %s" % (" ".join(flags), message),
            r.returncode == 2 and message in r.stderr, repr(r.stderr[-300:]))
r = cai("run", "-m", MODEL, "-p", "Hi", "--logit-bias", "99999999=1")
c.check("cai run --logit-bias with an id outside the vocabulary fails naming logit_bias",
        r.returncode == 1 and "logit_bias token 99999999 is outside the vocabulary" in r.stderr,
        repr(r.stderr[-300:]))
france = ["run", "-m", MODEL, "-p", "The capital of France is", "--max-tokens", "6"]
plain = cai(*france)
banned = cai(*france, "--logit-bias", "7042=-100")
c.check("cai run --logit-bias -100 bans the greedy reply's first token (' Paris', id 7042)",
        plain.returncode == 0 and banned.returncode == 0 and plain.stdout.startswith(" Paris")
        and "Paris" not in banned.stdout, repr((plain.stdout, banned.stdout, banned.stderr[-200:])))
loop = ["run", "-m", MODEL, "-p", "1 1 1 1 1 1 1 1", "--max-tokens", "8"]
looping, penalized = cai(*loop), cai(*loop, "--repetition-penalty", "3")
c.check("cai run --repetition-penalty 3 breaks greedy's loop of 1s",
        looping.stdout.strip().startswith("1 1 1") and "1 1" not in penalized.stdout,
        repr((looping.stdout, penalized.stdout)))
r = cai("run", "-m", MODEL, "-p", "The capital of France is", "--max-tokens", "8", "--temp", "2",
        "--seed", "3", "--min-p", "1")
c.check("cai run --min-p 1 at temperature 2 is the greedy reply",
        r.returncode == 0 and r.stdout == cai(*france[:-1], "8").stdout, repr(r.stdout))
r = cai("chat", "-m", MODEL, "--presence-penalty", "3")
c.check("cai chat --presence-penalty 3 is refused", r.returncode == 2 and
        "--presence-penalty must be between -2 and 2" in r.stderr, repr(r.stderr[-300:]))

# --logprobs: a JSON line per generated token on stderr, its logprob the best of its own
# top_logprobs under greedy decoding, the alternatives best first; the bytes make the reply.
r = cai(*france[:-1], "3", "--logprobs", "--top-logprobs", "3")
lines = [json.loads(l) for l in r.stderr.splitlines() if l.startswith("{")] if r.returncode == 0 else []
c.check("cai run --logprobs writes one line per generated token",
        len(lines) == 3 and r.stdout.startswith(" Paris"), repr((r.stdout, r.stderr[-300:])))
c.check("each line's token is its top_logprobs' first, the rest in falling order, all <= 0",
        all(len(l["top_logprobs"]) == 3 and l["top_logprobs"][0]["id"] == l["id"]
            and l["top_logprobs"][0]["logprob"] == l["logprob"]
            and all(a["logprob"] >= b["logprob"] for a, b in zip(l["top_logprobs"], l["top_logprobs"][1:]))
            and l["logprob"] <= 0 for l in lines) and lines[:1] != [] and lines[0]["id"] == 7042,
        repr(lines[:1]))
c.check("the tokens' bytes concatenate to the reply",
        bytes(b for l in lines for b in l["bytes"]).decode() == r.stdout, repr(r.stdout))
for flags, message in ((["--top-logprobs", "2"], "--top-logprobs needs --logprobs"),
                       (["--logprobs", "--top-logprobs", "21"], "--top-logprobs must be between 0 and 20, got 21")):
    r = cai("run", "-m", MODEL, "-p", "Hi", *flags)
    c.check("cai run %s is refused: %s" % (" ".join(flags), message),
            r.returncode == 2 and message in r.stderr, repr(r.stderr[-300:]))

# --tools: the reply is one JSON line, a call of a declared function whose arguments follow its
# schema when the choice forces one; bad declarations and choices are usage errors naming them.
with tempfile.TemporaryDirectory() as d:
    tools = os.path.join(d, "tools.json")
    with open(tools, "w") as f:
        json.dump([{"type": "function", "function": {
            "name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}], f)
    bad = os.path.join(d, "bad.json")
    with open(bad, "w") as f:
        json.dump([{"type": "function", "function": {
            "name": "x", "parameters": {"type": "object", "patternProperties": {}}}}], f)
    weather = ["run", "-m", MODEL, "--chat", "-p", "What's the weather in Paris?", "-n", "64",
               "--tools", tools]
    for choice in ("required", "get_weather"):
        r = cai(*weather, "--tool-choice", choice)
        reply = json.loads(r.stdout) if r.returncode == 0 else {}
        call = reply.get("tool_call", {})
        c.check("cai run --tools --tool-choice %s prints a get_weather call with a string city"
                % choice, reply.get("finish_reason") == "tool_calls" and call.get("name") == "get_weather"
                and isinstance(call.get("arguments", {}).get("city"), str)
                and set(call["arguments"]) <= {"city", "unit"}, repr((r.stdout, r.stderr[-300:])))
    r = cai(*weather, "--tool-choice", "none", "-n", "8")
    reply = json.loads(r.stdout) if r.returncode == 0 else {}
    c.check("cai run --tools --tool-choice none prints content, no call",
            "content" in reply and "tool_call" not in reply, repr(r.stdout))
    for flags, message in ((["--chat", "--tools", tools, "--tool-choice", "nope"],
                            '--tool-choice must be none, auto, required or a function of --tools, got "nope"'),
                           (["--chat", "--tools", bad], 'unsupported JSON Schema keyword "patternProperties"'),
                           (["--tools", tools], "--tools needs --chat"),
                           (["--chat", "--tool-choice", "auto"], "--tool-choice needs --tools"),
                           (["--chat", "--tools", tools, "--json-object"], "give --tools or a JSON reply option, not both")):
        r = cai("run", "-m", MODEL, "-p", "Hi", *flags)
        c.check("cai run %s is refused: %s" % (" ".join(os.path.basename(f) for f in flags), message),
                r.returncode == 2 and message in r.stderr, repr(r.stderr[-300:]))

# --samples N: N samples of one prompt, sample i seeded with --seed + i, each printed under its
# label and equal to `cai run` with that seed; bad values name the option and its range.
story = ["run", "-m", MODEL, "-p", "Once upon a time", "--temp", "1", "--max-tokens", "8"]
r = cai(*story, "--seed", "5", "--samples", "3")
alone = [cai(*story, "--seed", str(5 + i)) for i in range(3)]
expected = "".join("[sample %d]\n%s" % (i, a.stdout) for i, a in enumerate(alone))
c.check("cai run --samples 3 prints each sample under its label, each the run with seed + i",
        r.returncode == 0 and r.stdout == expected and len({a.stdout for a in alone}) > 1,
        repr((r.stdout, expected, r.stderr[-300:])))
for cmd in ("run", "bench"):
    for value, message in (("0", "--samples must be between 1 and 16, got 0"),
                           ("17", "--samples must be between 1 and 16, got 17"),
                           ("x", "--samples expects an integer, got \"x\"")):
        r = cai(cmd, "-m", MODEL, "-p", "Hi" if cmd == "run" else "16", "--samples", value)
        c.check("cai %s --samples %s is refused: %s" % (cmd, value, message),
                r.returncode == 2 and message in r.stderr, repr(r.stderr[-300:]))
r = cai("run", "-m", MODEL, "-p", "Hi", "--samples", "2", "--logprobs")
c.check("cai run --samples 2 --logprobs is refused", r.returncode == 2 and
        "--samples above 1 takes neither --tools nor --logprobs" in r.stderr, repr(r.stderr[-300:]))
r = cai("bench", "-m", MODEL, "-T", "2", "-p", "40", "-g", "6", "--batches", "1", "--repeat", "1",
        "--samples", "4", "--json")
report = json.loads(r.stdout) if r.returncode == 0 else {}
samples = report.get("samples", {})
c.check("cai bench --samples 4 reports the samples' rates and KV blocks: the prompt's shared",
        samples.get("n") == 4 and samples.get("tokens_per_second", 0) > 0
        and samples.get("one_sample_tokens_per_second", 0) > 0
        and 0 < samples.get("kv_blocks_peak", 0) <= 3 + 4 * 1 + 4
        and samples.get("one_sample_kv_blocks_peak", 0) == 3,
        repr((samples, r.stderr[-300:])))

with tempfile.TemporaryDirectory() as out:
    r = cai("eval", "-m", MODEL, "-n", str(EVAL_TOKENS), "-c", str(EVAL_CTX), "--json",
            "--logits-out", out, TEXT)
    c.check("cai eval --logits-out exits 0", r.returncode == 0, repr(r.stderr[-300:]))
    report = json.loads(r.stdout) if r.returncode == 0 else {}
    tokens = read_array(os.path.join(out, "tokens.i32"), "i")
    int8 = read_array(os.path.join(out, "int8.f32"), "f")
    flt = read_array(os.path.join(out, "float.f32"), "f")
    n_vocab = len(int8) // max(len(tokens), 1)
    c.check("one token per scored position, one row of logits per token in each file",
            len(tokens) == EVAL_TOKENS and len(int8) == len(flt) == EVAL_TOKENS * n_vocab
            and n_vocab > 1000, "%d tokens, %d and %d logits" % (len(tokens), len(int8), len(flt)))
    agree, kl, positions = figures(tokens, int8, flt, n_vocab, EVAL_CTX)
    c.check("the files give the report's positions, agreement and KL",
            positions == report.get("positions")
            and abs(agree - report.get("top1_agreement", -1)) < 1e-6
            and abs(kl - report.get("mean_kl_float_int8", -1)) < 1e-6 + 1e-4 * kl,
            "files: %d positions, %.6f, %.8f; report: %r" % (positions, agree, kl, report))
    c.check("the two paths' logits differ (they are not one path written twice)",
            int8 != flt, "identical logits")

r = cai("eval", "-m", MODEL, "-n", "8", "--logits-out", "/nonexistent/pg_cai_logits", TEXT)
c.check("--logits-out into a missing directory fails clearly",
        r.returncode != 0 and 'could not create "/nonexistent/pg_cai_logits/tokens.i32"' in r.stderr,
        repr(r))

r = cai("bench", "-m", MODEL, "-p", "40", "--long-prompts", "72", "--follow-up", "9", "-r", "1",
        "-b", "1", "-g", "2", "--json")
c.check("cai bench --follow-up exits 0", r.returncode == 0, repr(r.stderr[-300:]))
if r.returncode == 0:
    follow_up = json.loads(r.stdout)["follow_up"]
    c.check("one follow-up figure per prompt length, each after its whole prompt cached",
            [(f["cached_tokens"], f["new_tokens"]) for f in follow_up] == [(40, 9), (72, 9)],
            repr(follow_up))
    c.check("each follow-up and its cold run took time, and the ratio is theirs",
            all(f["seconds"] > 0 and f["cold_seconds"] > 0 and
                abs(f["cold_over_follow_up"] - f["cold_seconds"] / f["seconds"]) < 1e-3 *
                f["cold_over_follow_up"] + 1e-3 for f in follow_up), repr(follow_up))
r = cai("bench", "-m", MODEL, "-p", "40", "-r", "1", "-b", "1", "-g", "2", "--json")
c.check("without --follow-up the report's follow_up list is empty",
        r.returncode == 0 and json.loads(r.stdout)["follow_up"] == [], repr(r.stderr[-300:]))

# cai embed: SmolLM2 names no pooling, so its vectors are mean-pooled, 576 wide
texts = ["a cat sat on the mat", "PostgreSQL stores rows", "a cat sat on the mat, again"]
r = cai("embed", "-m", MODEL, "-T", "2", "-v", *sum([["-p", t] for t in texts], []))
c.check("cai embed exits 0", r.returncode == 0, repr(r.stderr[-300:]))
if r.returncode == 0:
    vectors = [[float(x) for x in line.split()] for line in r.stdout.splitlines()]
    c.check("one vector per text, 576 wide", [len(v) for v in vectors] == [576] * 3,
            repr([len(v) for v in vectors]))
    c.check("each vector has norm 1",
            all(abs(sum(x * x for x in v) - 1.0) < 1e-4 for v in vectors), "")
    c.check("-v names the pooling", "3 texts" in r.stderr and "mean pooling" in r.stderr,
            repr(r.stderr[-300:]))
    alone = cai("embed", "-m", MODEL, "-T", "1", "-p", texts[1])
    c.check("a text embedded alone gives the same numbers as in the batch",
            alone.returncode == 0 and alone.stdout.splitlines() == r.stdout.splitlines()[1:2],
            repr(alone.stderr[-300:]))
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write("\n".join(texts) + "\n\n")
        f.flush()
        j = cai("embed", "-m", MODEL, "--json", f.name)
    c.check("a file of lines (empty ones skipped) with --json gives the same vectors",
            j.returncode == 0 and json.loads(j.stdout) == vectors, repr(j.stderr[-300:]))
r = cai("embed", "-m", MODEL, "--batch", "4", "--step-tokens", "16", "-p", "word " * 40)
c.check("a text longer than a step is refused clearly",
        r.returncode == 1 and "could not embed text 1: a text of 41 tokens is longer than the 16 "
        "tokens an embedding may have" in r.stderr, repr(r.stderr[-300:]))
r = cai("embed", "-m", MODEL)
c.check("cai embed without texts is a usage error", r.returncode == 2, repr(r))
shutil.rmtree(WEIGHTS_CACHE, ignore_errors=True)
c.done()
