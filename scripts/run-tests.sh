#!/bin/bash
# scripts/run-tests.sh — pg_cai's whole test suite: the engine's unit tests, a smoke run of each
# fuzz target, the include-graph check, pg_regress on a throwaway cluster, then the
# scenario tests (cancel, timeout, worker restart, rollback, concurrency, no model).  Ends with one
# line "N passed, N failed" over all of them and exits non-zero when anything failed.
#
# Run as root (the server runs as the postgres OS user) or as the user that owns PostgreSQL,
# after `make install`.  The model is $CAI_MODEL, or models/SmolLM2-135M-Instruct.Q4_1.gguf.
# A failed run keeps its cluster directory (/tmp/pg_cai_test.*) for inspection.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODEL=${CAI_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
MODEL=$(realpath -m "$MODEL")
passed=0
failed=0
skipped=0

# shellcheck source=lib-cluster.sh
. "$ROOT/scripts/lib-cluster.sh"

say() { printf '%s\n' "$*" >&2; }

# stops the current cluster; keeps its directory for inspection once anything has failed
finish_cluster() {
	cluster_stop
	trap - EXIT
	if [ $failed -eq 0 ]; then
		rm -rf "$CLUSTER_DIR"
	else
		say "kept $CLUSTER_DIR for inspection (server log: $CLUSTER_LOG)"
	fi
}

# ---- 1. engine unit tests ------------------------------------------------------------------
say "== unit tests"
unit_out=$(make -C "$ROOT" --no-print-directory unit 2>&1)
printf '%s\n' "$unit_out" | tail -n 15 >&2
unit_line=$(printf '%s\n' "$unit_out" | grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' | tail -n 1)
if [ -n "$unit_line" ]; then
	unit_passed=$(echo "$unit_line" | awk '{print $1}')
	unit_failed=$(echo "$unit_line" | awk '{print $3}')
	skipped=$((skipped + $(echo "$unit_line" | awk '{print $5}')))
	passed=$((passed + unit_passed))
	failed=$((failed + unit_failed))
else
	say "unit tests did not report a result"
	failed=$((failed + 1))
fi

# ---- 1a. fuzz smoke: each libFuzzer target (tests/fuzz) runs FUZZ_SMOKE_SECONDS under
# ASan+UBSan over its corpus; one pass per target that survives, one failure per target that
# crashes.  Without clang or its fuzzer runtime every target fails (run.sh names the package).
say "== fuzz smoke"
fuzz_out=$(make -C "$ROOT" --no-print-directory fuzz-smoke 2>&1)
fuzz_rc=$?
printf '%s\n' "$fuzz_out" | grep -E '^(PASS|FAIL) |^== |^run.sh: |ERROR: |invariant failed|runtime error' >&2
fuzz_passed=$(printf '%s\n' "$fuzz_out" | grep -c '^PASS fuzz_')
fuzz_failed=$(printf '%s\n' "$fuzz_out" | grep -c '^FAIL fuzz_')
if [ $fuzz_rc -ne 0 ] && [ "$fuzz_failed" = 0 ]; then
	say "fuzz smoke did not run (exit $fuzz_rc)"
	fuzz_failed=1
fi
passed=$((passed + fuzz_passed))
failed=$((failed + fuzz_failed))

# ---- 1b. GPU tests: every CUDA kernel against the CPU (built where nvcc is; each test skips,
# saying so, where no CUDA device is present) --------------------------------------------------
if [ -x "$ROOT/tests/gpu/run_gpu" ]; then
	say "== GPU tests"
	gpu_out=$("$ROOT/tests/gpu/run_gpu" 2>&1)
	printf '%s\n' "$gpu_out" | tail -n 5 >&2
	gpu_line=$(printf '%s\n' "$gpu_out" | grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' | tail -n 1)
	if [ -n "$gpu_line" ]; then
		passed=$((passed + $(echo "$gpu_line" | awk '{print $1}')))
		failed=$((failed + $(echo "$gpu_line" | awk '{print $3}')))
		skipped=$((skipped + $(echo "$gpu_line" | awk '{print $5}')))
	else
		say "GPU tests did not report a result"
		failed=$((failed + 1))
	fi
fi

# ---- 1c. the GPU kit (scripts/gpu-check.sh): in dry mode here, it builds what it can, writes
# the SmolLM2-shaped model and runs the CPU half of the GPU-against-CPU comparison; one count
# per step ----------------------------------------------------------------------------------------
say "== GPU kit"
kit_out=$("$ROOT/scripts/gpu-check.sh" "$ROOT/build/gpu-check" 2>&1)
printf '%s\n' "$kit_out" | grep -E '^gpu-check: ' >&2
kit_line=$(printf '%s\n' "$kit_out" | grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' | tail -n 1)
if [ -n "$kit_line" ]; then
	passed=$((passed + $(echo "$kit_line" | awk '{print $1}')))
	failed=$((failed + $(echo "$kit_line" | awk '{print $3}')))
	skipped=$((skipped + $(echo "$kit_line" | awk '{print $5}')))
else
	say "the GPU kit did not report a result"
	failed=$((failed + 1))
fi

# ---- 1d. the include graph (scripts/check-include-graph.py): src/pg's modules without a circle,
# src/'s folders in their order without an arrow back up or a circle; one count ----------------
say "== include graph (src/pg modules, src/ folders)"
if python3 "$ROOT/scripts/check-include-graph.py" --quiet >&2; then
	passed=$((passed + 1))
else
	failed=$((failed + 1))
fi

# ---- 2. a throwaway cluster ----------------------------------------------------------------
if [ ! -f "$(pg_config --pkglibdir)/pg_cai.so" ] ||
	[ ! -f "$(pg_config --sharedir)/extension/pg_cai.control" ]; then
	say "pg_cai is not installed: run 'make install' (as root) first"
	echo "$passed passed, $((failed + 1)) failed"
	exit 1
fi
if ! as_pg test -r "$MODEL"; then
	say "model $MODEL is missing or not readable by the server's OS user"
	echo "$passed passed, $((failed + 1)) failed"
	exit 1
fi

trap cluster_stop EXIT
if ! cluster_create "$MODEL" || ! cluster_start; then
	echo "$passed passed, $((failed + 1)) failed"
	exit 1
fi
say "== cluster in $CLUSTER_DIR (port $CLUSTER_PORT, model $MODEL)"
cluster_env
export PG_CAI_TEST_DIR=$CLUSTER_DIR PG_CAI_TEST_DATA=$CLUSTER_DATA PG_CAI_TEST_LOG=$CLUSTER_LOG
export PG_CAI_TEST_MODEL=$MODEL

# ---- 3. pg_regress ---------------------------------------------------------------------------
say "== pg_regress"
regress_out=$(make -C "$ROOT" --no-print-directory installcheck 2>&1)
printf '%s\n' "$regress_out" >&2
regress_passed=$(printf '%s\n' "$regress_out" | grep -cE '^(test| )? *[a-z0-9_]+ +\.\.\. ok')
regress_failed=$(printf '%s\n' "$regress_out" | grep -cE '^(test| )? *[a-z0-9_]+ +\.\.\. FAILED')
if [ "$regress_passed" = 0 ] && [ "$regress_failed" = 0 ]; then
	say "pg_regress did not run"
	regress_failed=1
fi
passed=$((passed + regress_passed))
failed=$((failed + regress_failed))

# ---- 4. scenario tests -----------------------------------------------------------------------
for scenario in "$ROOT"/tests/scenario/test_*.py; do
	say "== scenario $(basename "$scenario")"
	out=$(python3 "$scenario" 2>&1)
	rc=$?
	printf '%s\n' "$out" >&2
	s_passed=$(printf '%s\n' "$out" | grep -c '^PASS ')
	s_failed=$(printf '%s\n' "$out" | grep -c '^FAIL ')
	if [ $rc -ne 0 ] && [ "$s_failed" = 0 ]; then
		s_failed=1
	fi
	passed=$((passed + s_passed))
	failed=$((failed + s_failed))
	# a scenario whose prerequisite is missing says "SKIP name: why" (test_pgbouncer.py)
	skipped=$((skipped + $(printf '%s\n' "$out" | grep -c '^SKIP ')))
done

finish_cluster

# ---- 5. Gemma 3 through the worker: pg_regress's cai_gemma on a cluster serving the Gemma file
# (fetched by `scripts/fetch-model.sh gemma3-270m`, as CI does), context 4096 --------------------
GEMMA=${CAI_GEMMA_MODEL:-$ROOT/models/gemma-3-270m-q4_k_m.gguf}
if [ -f "$GEMMA" ]; then
	say "== pg_regress on Gemma 3 ($GEMMA)"
	trap cluster_stop EXIT
	if cluster_create "$(realpath "$GEMMA")" pg_cai.context_length=4096 && cluster_start; then
		cluster_env
		gemma_out=$(make -C "$ROOT" --no-print-directory installcheck-gemma 2>&1)
		printf '%s\n' "$gemma_out" >&2
		if printf '%s\n' "$gemma_out" | grep -qE '^(test| )? *cai_gemma +\.\.\. ok'; then
			passed=$((passed + 1))
		else
			failed=$((failed + 1))
		fi
	else
		failed=$((failed + 1))
	fi
	finish_cluster
else
	say "== pg_regress on Gemma 3: skipped ($GEMMA absent; scripts/fetch-model.sh gemma3-270m)"
	skipped=$((skipped + 1))
fi

echo "$passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
