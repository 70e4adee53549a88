#!/usr/bin/env bash
# scripts/gpu-check.sh [OUT] — the GPU kit: everything a lent GPU machine must prove, in one call.
#
#   1. build    the engine, the CLI, the CUDA backend (sm_90 on a Hopper device), tests/gpu,
#               bench_gpu and the end-to-end comparison, with what .gpukit/ carries (make gpu-kit)
#   2. model    writes the SmolLM2-135M-shaped synthetic model (seeded Q4_1 weights), and
#               model-gemma3 a six-layer one of Gemma 3 270M's layer shape; the 1B- and 8B-shaped
#               models are bench_gpu's own, made on the device
#   3. gpu      tests/gpu/run_gpu: every kernel and backend operation against the CPU
#   4. e2e      greedy tokens of the whole engine, GPU against CPU, over 300 steps: one sequence
#               alone and a ragged batch of 16 (tests/gpu/e2e_greedy.c); they must be equal.
#               On a GPU twice: decode steps replayed as CUDA graphs, then without (e2e-plain);
#               then with two-digit activations and keys (e2e-two-digit), with the file's own
#               block weights (e2e-file: the first 64 steps must agree), and on the Gemma-3-shaped
#               model (e2e-gemma3: GeGLU, sandwich norms, the embedding scale, q/k norms, windows)
#   5. bench    tests/bench/bench_gpu: decode batch 1/16/64/256, prefill and the int8 GEMM of the
#               three shapes, each beside its roofline from the copy bandwidth and int8 rate it
#               measures first
#   6. profile  ncu's time per kernel of the 8B shape's decode (informative: skipped, never
#               failed, where ncu cannot run)
# and writes OUT/gpu-check.md and OUT/gpu-check.json (the report), OUT/e2e.json,
# OUT/bench_gpu.json and OUT/steps.log (every step's output).
#
# Without a GPU (this machine, CI) the same command runs what it can — the build (the CUDA
# backend too where nvcc is), the model, the CPU half of the comparison — and the report says
# what was skipped and why.  Exit status: 0 when no step failed.  The last line is
# "N passed, N failed, N skipped" over the steps.  The whole run is bounded (about 8 minutes).
#
# On a lent device (README "GPU"):  run(command="bash scripts/gpu-check.sh $OUT", carry=[".gpukit"])
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${1:-build/gpu-check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$ROOT/build/gpu-check-work
mkdir -p "$WORK"
LOG=$OUT/steps.log
: >"$LOG"
STEPS=$WORK/steps.tsv
: >"$STEPS"
KIT=$ROOT/.gpukit
JOBS=$(nproc 2>/dev/null || echo 2)
START=$(date +%s)

say() { printf '%s\n' "$*"; printf '%s\n' "$*" >>"$LOG"; }

# record NAME STATUS SECONDS DETAIL
record() {
	printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$STEPS"
	say "gpu-check: $1: $2 (${3}s)${4:+ — $4}"
}

# run_step NAME TIMEOUT CMD... : runs CMD with its output in the log; sets STEP_RC and STEP_S
run_step() {
	local name=$1 limit=$2 t0
	shift 2
	t0=$(date +%s)
	say "== $name: $*"
	timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
	STEP_RC=$?
	STEP_S=$(($(date +%s) - t0))
	if [ $STEP_RC -eq 124 ] || [ $STEP_RC -eq 137 ]; then
		say "(timed out after ${limit}s)"
	fi
}

# ---- the device ------------------------------------------------------------------------------
gpu_name=""
if command -v nvidia-smi >/dev/null 2>&1; then
	gpu_name=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
fi
if [ -n "$gpu_name" ]; then
	mode=gpu
	why_dry=""
	say "gpu-check: device: $gpu_name"
else
	mode=dry
	if command -v nvidia-smi >/dev/null 2>&1; then
		why_dry="nvidia-smi found no GPU"
	else
		why_dry="no NVIDIA driver on this machine (nvidia-smi absent)"
	fi
	say "gpu-check: dry mode: $why_dry"
fi
NVCC=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)

# ---- 1. build --------------------------------------------------------------------------------
make_args=()
if [ -d "$KIT" ]; then
	make_args+=("EXTRA_CFLAGS=-I$KIT/include" "EXTRA_LDFLAGS=-L$KIT/lib")
	say "gpu-check: using $KIT: $(head -n 1 "$KIT/MANIFEST" 2>/dev/null)"
fi
MAKE=$(command -v make || true)
if [ -z "$MAKE" ] && [ -x "$KIT/bin/make" ]; then
	MAKE=$KIT/bin/make
fi
targets=(cai tests/gpu/e2e_greedy)
built_cuda=false
if [ -n "$NVCC" ]; then
	targets+=(cuda)
	make_args+=("NVCC=$NVCC")
	# a Hopper device needs only its own machine code (a third of the compile time), and a build
	# there must not stop at a warning of a host compiler newer than CI's
	[ "$mode" = gpu ] && make_args+=("CUDA_GENCODE=-gencode arch=compute_90,code=sm_90" \
		"CUDA_WERROR=" "BACKEND_WERROR=")
fi
if [ -z "$MAKE" ]; then
	record build failed 0 "no make on this machine and none in .gpukit (run make gpu-kit and carry .gpukit)"
elif ! { [ -f "$KIT/include/xxhash.h" ] || [ -f /usr/include/xxhash.h ]; }; then
	record build failed 0 "xxhash.h is missing: run make gpu-kit here and carry .gpukit"
else
	run_step build 300 "$MAKE" -s -j"$JOBS" "${make_args[@]}" "${targets[@]}"
	if [ $STEP_RC -eq 0 ]; then
		if [ -n "$NVCC" ]; then
			built_cuda=true
			record build passed "$STEP_S" "engine, CLI, e2e_greedy, CUDA backend + tests/gpu + bench_gpu ($($NVCC --version | tail -n 1))"
		else
			record build passed "$STEP_S" "engine, CLI, e2e_greedy; the CUDA backend was not built: nvcc not found"
		fi
	else
		record build failed "$STEP_S" "make exited $STEP_RC (see steps.log)"
	fi
fi
have() { [ -x "$ROOT/$1" ]; }

# ---- 2. the synthetic models ----------------------------------------------------------------
MODEL=$WORK/smollm2-135m-shape.gguf
GEMMA_MODEL=$WORK/gemma3-270m-shape.gguf
# model_step NAME PATH [SHAPE]: writes a synthetic model with e2e_greedy and records NAME
model_step() {
	if have tests/gpu/e2e_greedy; then
		run_step "$1" 120 "$ROOT/tests/gpu/e2e_greedy" --write-model "$2" ${3:+"$3"}
		if [ $STEP_RC -eq 0 ]; then
			record "$1" passed "$STEP_S" "$(basename "$2"), $(du -m "$2" | cut -f1) MB"
		else
			record "$1" failed "$STEP_S" "e2e_greedy --write-model exited $STEP_RC"
		fi
	else
		record "$1" skipped 0 "not built"
	fi
}
model_step model "$MODEL"
model_step model-gemma3 "$GEMMA_MODEL" gemma3

# ---- 3. tests/gpu ------------------------------------------------------------------------------
if [ "$mode" = dry ] && have tests/gpu/run_gpu; then
	# without a device run_gpu runs only its gpu_host_ tests (the library's host code)
	run_step gpu 60 "$ROOT/tests/gpu/run_gpu"
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$LOG" | tail -n 1)
	if [ $STEP_RC -eq 0 ] && [ -n "$line" ]; then
		record gpu skipped "$STEP_S" "$why_dry; host tests only: $line"
	else
		record gpu failed "$STEP_S" "run_gpu exited $STEP_RC: ${line:-no result line}"
	fi
elif [ "$mode" = dry ]; then
	record gpu skipped 0 "$why_dry"
elif ! have tests/gpu/run_gpu; then
	record gpu failed 0 "tests/gpu/run_gpu was not built"
else
	CAI_TEST_MODEL=$MODEL run_step gpu 240 "$ROOT/tests/gpu/run_gpu"
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$LOG" | tail -n 1)
	if [ $STEP_RC -eq 0 ] && [ -n "$line" ]; then
		record gpu passed "$STEP_S" "$line"
	else
		record gpu failed "$STEP_S" "run_gpu exited $STEP_RC: ${line:-no result line}"
	fi
fi

# ---- 4. GPU against CPU, end to end -------------------------------------------------------------
# e2e: the CUDA backend as the engine runs it, decode steps replayed as CUDA graphs; on a GPU also
# e2e-plain: every step's operations launched one by one (CAI_CUDA_GRAPHS=0), which tells a graph
# fault from a kernel one.
# e2e_step NAME JSON MODEL [VAR=VALUE ...] [-- E2E_GREEDY_FLAGS ...]: runs the comparison on
# MODEL and records NAME
e2e_step() {
	local name=$1 json=$2 model=$3 devices=cpu,cuda summary kind detail
	local -a vars=() flags=()
	shift 3
	while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
	[ "${1:-}" = -- ] && shift
	flags=("$@")
	"$built_cuda" || devices=cpu
	run_step "$name" 240 env CAI_CUDA_LIBRARY="$ROOT/build/libcai_cuda.so" "${vars[@]}" \
		"$ROOT/tests/gpu/e2e_greedy" "$model" "$json" --steps 300 --devices "$devices" "${flags[@]}"
	summary=$(python3 - "$json" <<'PY' 2>/dev/null
import json, sys
r = json.load(open(sys.argv[1]))
runs = {x["device"]: x for x in r["runs"]}
cpu = runs.get("cpu", {})
gpu = runs.get("cuda")
n = sum(len(t) for t in cpu.get("tokens", []))
if gpu is None:
    print("cpu-only\t%d tokens on the CPU in %.1f s; the GPU half was not run: no CUDA backend built" % (n, cpu.get("seconds", 0)))
elif gpu["status"] == "skipped":
    print("cpu-only\t%d tokens on the CPU in %.1f s; the GPU half was skipped: %s" % (n, cpu.get("seconds", 0), gpu["error"]))
elif r["equal"]:
    print("equal\t%d sequences, %d tokens equal (CPU %.1f s, GPU %.1f s on %s)" % (r["sequences"], n, cpu["seconds"], gpu["seconds"], gpu["backend"]))
elif r["compared"]:
    d = r["first_difference"]
    print("differ\tfirst difference: request %d at step %d" % (d["request"], d["step"]))
else:
    print("error\t" + "; ".join("%s: %s" % (x["device"], x["error"]) for x in r["runs"] if x["error"]))
PY
)
	kind=${summary%%$'\t'*}
	detail=${summary#*$'\t'}
	if [ $STEP_RC -ne 0 ] || [ -z "$summary" ]; then
		record "$name" failed "$STEP_S" "e2e_greedy exited $STEP_RC${detail:+: $detail}"
	elif [ "$kind" = equal ]; then
		record "$name" passed "$STEP_S" "$detail"
	elif [ "$kind" = cpu-only ] && [ "$mode" = dry ]; then
		record "$name" passed "$STEP_S" "CPU half only: $detail"
	else
		record "$name" failed "$STEP_S" "$detail"
	fi
}
if have tests/gpu/e2e_greedy && [ -f "$MODEL" ]; then
	e2e_step e2e "$OUT/e2e.json" "$MODEL"
	if [ "$mode" = gpu ]; then
		e2e_step e2e-plain "$WORK/e2e-plain.json" "$MODEL" CAI_CUDA_GRAPHS=0
	fi
	# two-digit activations (pg_cai.activation_precision = two_digit): the second digits' quantization,
	# the embedding's second digits, every GEMM run on both digits, and two-digit keys
	e2e_step e2e-two-digit "$WORK/e2e-two-digit.json" "$MODEL" -- --two-digit-activations
	# the file's own block weights (pg_cai.weights = file: the synthetic model's Q4_1 and its
	# embedding through the block GEMV, the tensor-core prefill and embed_blocks); not bit-identical
	# across backends, so every request must agree for its first 64 of 100 steps (the CPU half of
	# the file path is the slower one)
	e2e_step e2e-file "$WORK/e2e-file.json" "$MODEL" -- --weights file --agree-steps 64 --steps 100
else
	record e2e skipped 0 "e2e_greedy or the model is missing"
fi
# the operations only Gemma 3 needs (GeGLU, sublayer output norms, the embedding scale), with its
# q/k norms, head size 256 and sliding windows: a few seconds on either side
if have tests/gpu/e2e_greedy && [ -f "$GEMMA_MODEL" ]; then
	e2e_step e2e-gemma3 "$WORK/e2e-gemma3.json" "$GEMMA_MODEL"
else
	record e2e-gemma3 skipped 0 "e2e_greedy or the Gemma-3-shaped model is missing"
fi

# ---- 5. bench_gpu ------------------------------------------------------------------------------
if [ "$mode" = dry ]; then
	record bench skipped 0 "$why_dry"
elif ! have tests/bench/bench_gpu; then
	record bench failed 0 "tests/bench/bench_gpu was not built"
else
	left=$((480 - ($(date +%s) - START)))
	[ $left -lt 60 ] && left=60
	run_step bench "$left" "$ROOT/tests/bench/bench_gpu" --json "$OUT/bench_gpu.json"
	if [ $STEP_RC -eq 0 ] && [ -f "$OUT/bench_gpu.json" ]; then
		record bench passed "$STEP_S" "figures in bench_gpu.json and the report"
	else
		record bench failed "$STEP_S" "bench_gpu exited $STEP_RC"
	fi
fi

# ---- 6. where a decode step's time goes -----------------------------------------------------------
# ncu's time per kernel over the first launches of the 8B shape's quick run: model creation and
# the ceilings first, then the decode batch-1 warm-up and graph replays (clocks locked by ncu, so
# slower than the bench).  Informative: a profile that cannot run is skipped, not a failure.
NCU=$(command -v ncu || { [ -x /usr/local/cuda/bin/ncu ] && echo /usr/local/cuda/bin/ncu; } || true)
if [ "$mode" = dry ]; then
	record profile skipped 0 "$why_dry"
elif [ -z "$NCU" ]; then
	record profile skipped 0 "ncu not found"
elif ! have tests/bench/bench_gpu; then
	record profile skipped 0 "tests/bench/bench_gpu was not built"
else
	left=$((540 - ($(date +%s) - START)))
	[ $left -gt 150 ] && left=150
	if [ $left -lt 30 ]; then
		record profile skipped 0 "no time left in the kit's bound"
	else
		run_step profile "$left" "$NCU" --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size \
			--print-summary per-kernel --launch-count 2500 "$ROOT/tests/bench/bench_gpu" --quick --model 8b
		if [ $STEP_RC -eq 0 ]; then
			record profile passed "$STEP_S" "ncu per-kernel times of bench_gpu --quick --model 8b in the report"
		else
			record profile skipped "$STEP_S" "ncu exited $STEP_RC (see steps.log)"
		fi
	fi
fi

# ---- the report --------------------------------------------------------------------------------
python3 - "$OUT" "$STEPS" "$mode" "$why_dry" "$gpu_name" "$(($(date +%s) - START))" <<'PY'
import json, os, re, sys, datetime
out, steps_path, mode, why_dry, gpu_name, total = sys.argv[1:]


def profile_table(log_path):
    """ncu's per-kernel summary in steps.log, as the kernels with the most total time."""
    text = open(log_path, errors="replace").read()
    start = text.find("== profile:")
    if start < 0:
        return []
    rows = []
    head = re.compile(r"^  (\S.*?)\((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Device \d+, CC [\d.]+, Invocations (\d+)", re.M)
    for m in head.finditer(text, start):
        d = re.search(r"gpu__time_duration\.sum\s+(\S+)\s+\S+\s+\S+\s+(\S+)", text[m.end():m.end() + 2000])
        if not d:
            continue
        avg = float(d.group(2).replace(",", ""))
        avg *= {"ms": 1000.0, "us": 1.0, "ns": 0.001}.get(d.group(1), 1.0)
        calls = int(m.group(8))
        name = re.sub(r"\(.*", "", m.group(1)).replace("void ", "").strip()
        rows.append((calls * avg, calls, avg, name[:70], "%s,%s,%s" % m.group(2, 3, 4)))
    if not rows:
        return []
    rows.sort(reverse=True)
    md = ["", "Where the time goes (ncu, clocks locked; bench_gpu --quick --model 8b, first 2500 launches:",
          "model creation and ceilings, then decode batch 1 warm-up and graph replays):", "",
          "| kernel | grid | calls | mean µs | total µs |", "|---|---|---|---|---|"]
    md += ["| %s | %s | %d | %.2f | %.0f |" % (r[3].replace("|", "/"), r[4], r[1], r[2], r[0]) for r in rows[:20]]
    return md

steps = []
for line in open(steps_path):
    name, status, secs, detail = line.rstrip("\n").split("\t", 3)
    steps.append({"step": name, "status": status, "seconds": int(secs), "detail": detail})
bench = None
if os.path.exists(os.path.join(out, "bench_gpu.json")):
    bench = json.load(open(os.path.join(out, "bench_gpu.json")))
goals = []
if bench:
    def row(model, workload):
        for r in bench["rows"]:
            if r["model"] == model and r["workload"] == workload and r["ok"]:
                return r
    for model, workload, goal, what in [("llama-8b", "decode b=1", 0.70, "decode batch 1 on the 8B shape, of the bandwidth roofline"),
                                        ("llama-8b", "gemm TOPS", 0.60, "int8 GEMM at M=2048 (8B gate/up), of the measured int8 rate")]:
        r = row(model, workload)
        goals.append({"goal": what, "target": goal, "ratio": r["ratio"] if r else None,
                      "met": bool(r and r["ratio"] >= goal)})
report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "mode": mode, "why_dry": why_dry or None, "device": gpu_name or None,
          "seconds": int(total), "steps": steps, "goals": goals, "bench": bench}
json.dump(report, open(os.path.join(out, "gpu-check.json"), "w"), indent=1)
md = ["# pg_cai GPU check", "",
      "- date: %s" % report["date"],
      "- device: %s" % (gpu_name or "none (%s): dry mode" % why_dry),
      "- total: %s s" % total, "",
      "| step | status | s | detail |", "|---|---|---|---|"]
md += ["| %s | %s | %d | %s |" % (s["step"], s["status"], s["seconds"], s["detail"].replace("|", "/")) for s in steps]
if bench:
    md += ["", "Ceilings measured on the device: copy %.0f GB/s, int8 GEMM %.0f TOPS (8192^3)." %
           (bench["copy_bandwidth_bytes_per_s"] / 1e9, bench["int8_gemm_ops_per_s"] / 1e12),
           "Decode at %d cached positions per sequence; prefill of %d tokens." % (bench["decode_context"], bench["prefill_tokens"]),
           "", "| model | workload | measured | roofline | ratio |", "|---|---|---|---|---|"]
    for r in bench["rows"]:
        unit = "tok/s" if r["unit"] == "tokens/s" else "TOPS"
        md.append("| %s | %s | %s | %s | %s |" % (r["model"], r["workload"],
                  "%.0f %s" % (r["measured"], unit) if r["ok"] else "failed",
                  "%.0f %s" % (r["roofline"], unit) if r["ok"] else "", "%.0f%%" % (100 * r["ratio"]) if r["ok"] else ""))
    md += ["", "| goal | target | measured | met |", "|---|---|---|---|"]
    md += ["| %s | %.0f%% | %s | %s |" % (g["goal"], 100 * g["target"], "%.0f%%" % (100 * g["ratio"]) if g["ratio"] is not None else "—",
                                         "yes" if g["met"] else "no") for g in goals]
md += profile_table(os.path.join(out, "steps.log"))
open(os.path.join(out, "gpu-check.md"), "w").write("\n".join(md) + "\n")
PY

n_pass=$(awk -F'\t' '$2=="passed"' "$STEPS" | wc -l)
n_fail=$(awk -F'\t' '$2=="failed"' "$STEPS" | wc -l)
n_skip=$(awk -F'\t' '$2=="skipped"' "$STEPS" | wc -l)
cat "$OUT/gpu-check.md"
echo "gpu-check: report in $OUT (gpu-check.md, gpu-check.json, e2e.json, bench_gpu.json, steps.log)"
echo "$n_pass passed, $n_fail failed, $n_skip skipped"
[ "$n_fail" -eq 0 ]
