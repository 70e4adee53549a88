#!/bin/bash
# tests/fuzz/run.sh — builds the libFuzzer targets and runs each, one after the other, over its
# committed corpus.  Called by `make fuzz` / `make fuzz-smoke` (tests/fuzz/fuzz.mk).
#
#   tests/fuzz/run.sh run|smoke SECONDS TARGET...
#
# Prints "PASS <target>" for a target that ran SECONDS without a crash and "FAIL <target> (...)"
# for one that crashed (the artifact is named), then "N passed, N failed"; exits non-zero when
# any failed, or when clang or its fuzzer runtime is missing (that is a failure, never a skip).
# New inputs go to tests/fuzz/out/corpus/<target>/ and crash artifacts to
# tests/fuzz/out/artifacts/<target>/ (both ignored): the committed corpus is only read.
set -u

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mode=${1:?usage: run.sh run|smoke SECONDS TARGET...}
seconds=${2:?usage: run.sh run|smoke SECONDS TARGET...}
shift 2
FUZZ_CC=${FUZZ_CC:-clang}
OUT=$ROOT/tests/fuzz/out
passed=0
failed=0

case $mode in run | smoke) ;; *)
	echo "run.sh: unknown mode '$mode' (run or smoke)" >&2
	exit 2
	;;
esac
if [ $# -eq 0 ]; then
	echo "run.sh: no fuzz targets given" >&2
	exit 2
fi

fail_all() {
	for t in "$@"; do echo "FAIL $t ($why)"; done
	echo "0 passed, $# failed"
	exit 1
}

# clang and libFuzzer's runtime (libclang-rt-*-dev on Debian) must both be there
if ! command -v "$FUZZ_CC" >/dev/null 2>&1; then
	why="$FUZZ_CC not found: install clang"
	echo "run.sh: $why" >&2
	fail_all "$@"
fi
probe=$(mktemp -d)
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }\n' >"$probe/p.c"
if ! "$FUZZ_CC" -fsanitize=fuzzer,address,undefined -o "$probe/p" "$probe/p.c" >"$probe/log" 2>&1; then
	why="$FUZZ_CC cannot link -fsanitize=fuzzer,address,undefined: install libclang-rt-14-dev"
	cat "$probe/log" >&2
	rm -rf "$probe"
	echo "run.sh: $why" >&2
	fail_all "$@"
fi
rm -rf "$probe"

if ! make -C "$ROOT" --no-print-directory -j2 fuzz-build FUZZ_TARGETS="$*" >&2; then
	why="build failed"
	fail_all "$@"
fi

for t in "$@"; do
	bin=$ROOT/build/fuzz/$t
	corpus=$ROOT/tests/fuzz/corpus/$t
	max_len_var=FUZZ_MAX_LEN_$t
	max_len=${!max_len_var:-${FUZZ_MAX_LEN:-4096}}
	dict=$ROOT/tests/fuzz/$t.dict
	log=$OUT/logs/$t.log
	mkdir -p "$OUT/corpus/$t" "$OUT/artifacts/$t" "$OUT/logs"
	args=(-max_total_time="$seconds" -rss_limit_mb=2048 -max_len="$max_len" -timeout=30
		-print_final_stats=1 -artifact_prefix="$OUT/artifacts/$t/")
	[ -f "$dict" ] && args+=(-dict="$dict")
	[ -d "$corpus" ] || corpus=
	echo "== $t: $mode ${seconds}s, max_len $max_len (log $log)" >&2
	# the first directory receives new inputs; the committed corpus after it is only read
	ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$bin" "${args[@]}" "$OUT/corpus/$t" $corpus >"$log" 2>&1
	rc=$?
	grep -E '^#[0-9]+[[:space:]]+DONE|^stat::number_of_executed_units|^stat::average_exec_per_sec' "$log" >&2
	if [ $rc -eq 0 ]; then
		echo "PASS $t"
		passed=$((passed + 1))
	else
		artifact=$(grep -oE "Test unit written to [^ ]+" "$log" | tail -n 1 | sed 's/Test unit written to //')
		grep -E 'ERROR: |invariant failed|runtime error|SUMMARY' "$log" | head -n 5 >&2
		echo "FAIL $t (exit $rc${artifact:+, input $artifact})"
		failed=$((failed + 1))
	fi
done

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
