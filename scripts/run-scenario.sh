#!/bin/bash
# scripts/run-scenario.sh — a part of the suite on one throwaway cluster, for working on it:
#   scripts/run-scenario.sh [--regress] [TEST ...]
# --regress runs pg_regress (`make installcheck`); each TEST is a scenario, named as
# tests/scenario/TEST or TEST.py.  The cluster and the environment are run-tests.sh's; the model is
# $CAI_MODEL or the default.  Needs `make install` first.  Ends with "N passed, N failed".
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODEL=$(realpath -m "${CAI_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}")
# shellcheck source=lib-cluster.sh
. "$ROOT/scripts/lib-cluster.sh"

regress=0
if [ "${1:-}" = --regress ]; then
	regress=1
	shift
fi
trap cluster_stop EXIT
cluster_create "$MODEL" && cluster_start || exit 1
cluster_env
export PG_CAI_TEST_DIR=$CLUSTER_DIR PG_CAI_TEST_DATA=$CLUSTER_DATA PG_CAI_TEST_LOG=$CLUSTER_LOG
export PG_CAI_TEST_MODEL=$MODEL

passed=0
failed=0
if [ $regress = 1 ]; then
	out=$(make -C "$ROOT" --no-print-directory installcheck 2>&1)
	printf '%s\n' "$out"
	passed=$((passed + $(printf '%s\n' "$out" | grep -cE '^(test| )? *[a-z0-9_]+ +\.\.\. ok')))
	failed=$((failed + $(printf '%s\n' "$out" | grep -cE '^(test| )? *[a-z0-9_]+ +\.\.\. FAILED')))
fi
for name in "$@"; do
	scenario=$ROOT/tests/scenario/${name%.py}.py
	echo "== scenario $(basename "$scenario")"
	out=$(python3 "$scenario" 2>&1)
	rc=$?
	printf '%s\n' "$out"
	s_failed=$(printf '%s\n' "$out" | grep -c '^FAIL ')
	[ $rc -ne 0 ] && [ "$s_failed" = 0 ] && s_failed=1
	passed=$((passed + $(printf '%s\n' "$out" | grep -c '^PASS ')))
	failed=$((failed + s_failed))
done
cluster_stop
trap - EXIT
if [ $failed -eq 0 ]; then
	rm -rf "$CLUSTER_DIR"
else
	echo "kept $CLUSTER_DIR (server log: $CLUSTER_LOG)"
fi
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
