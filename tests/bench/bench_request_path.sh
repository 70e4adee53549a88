#!/bin/bash
# tests/bench/bench_request_path.sh — what the PostgreSQL request path costs per call.
#
# Times cai_complete with max_tokens = 1 through SQL (pgbench, one client, prepared statements)
# against the same one-token completion in the engine alone (request_path_engine.c, linked with
# build/libcai.a), plus SELECT 1 for the bare client round trip.  The difference is the price of
# the request path: argument checks, the DSM segment and its queue, two latch wake-ups, the
# worker's intake and the reply.  That price is small next to a forward pass, so the request
# path is also timed alone: cai_tokenize through SQL goes the same way (segment, queue, wake-ups)
# but costs the worker microseconds.  Last, a greedy 128-token completion through SQL gives the
# decode rate a session sees, tokens streamed through every hop.  A benchmark, not a test: it prints figures, asserts nothing.
#
#   tests/bench/bench_request_path.sh [SECONDS]      (default 15 per SQL run)
#
# Needs `make install` and build/libcai.a; runs its own throwaway cluster.  Results also go to
# tests/bench/out/request_path.txt.
set -eu

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SECONDS_PER_RUN=${1:-15}
MODEL=$(realpath -m "${CAI_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}")
PROMPT="The capital of France is"
THREADS=$(nproc)
OUT=$ROOT/tests/bench/out
mkdir -p "$OUT"

. "$ROOT/scripts/lib-cluster.sh"

make -C "$ROOT" --no-print-directory build/libcai.a >/dev/null
DRIVER=$(mktemp /tmp/request_path_engine.XXXX)
trap 'rm -f "$DRIVER"' EXIT
cc -O2 -I"$ROOT/src/common" -o "$DRIVER" "$ROOT/tests/bench/request_path_engine.c" \
	"$ROOT/build/libcai.a" -lxxhash -lpthread -lm -ldl

SQL_SCRIPT=$(mktemp /tmp/bench_sql.XXXX)
ONE_SCRIPT=$(mktemp /tmp/bench_one.XXXX)
TOK_SCRIPT=$(mktemp /tmp/bench_tok.XXXX)
DEC_SCRIPT=$(mktemp /tmp/bench_dec.XXXX)
DECODE_TOKENS=128
echo "SELECT cai_complete('$PROMPT', '{\"max_tokens\": 1}');" >"$SQL_SCRIPT"
echo "SELECT 1;" >"$ONE_SCRIPT"
echo "SELECT cai_tokenize('$PROMPT');" >"$TOK_SCRIPT"
echo "SELECT cai_complete('$PROMPT', '{\"max_tokens\": $DECODE_TOKENS, \"ignore_eos\": true}');" >"$DEC_SCRIPT"
chmod 644 "$SQL_SCRIPT" "$ONE_SCRIPT" "$TOK_SCRIPT" "$DEC_SCRIPT"
trap 'cluster_stop; rm -rf "${CLUSTER_DIR:-/nonexistent}"; rm -f "$DRIVER" "$SQL_SCRIPT" "$ONE_SCRIPT" "$TOK_SCRIPT" "$DEC_SCRIPT"' EXIT

cluster_create "$MODEL" "pg_cai.threads=$THREADS"
cluster_start
cluster_env
psql -X -q -c "CREATE EXTENSION pg_cai"

pgbench_latency() {
	pgbench -n -M prepared -c 1 -j 1 -T "$2" -f "$1" 2>&1 | awk '/latency average/ {print $4}'
}

pgbench_latency "$SQL_SCRIPT" 3 >/dev/null	# warm-up
select1_ms=$(pgbench_latency "$ONE_SCRIPT" "$SECONDS_PER_RUN")
tokenize_ms=$(pgbench_latency "$TOK_SCRIPT" "$SECONDS_PER_RUN")
sql_ms=$(pgbench_latency "$SQL_SCRIPT" "$SECONDS_PER_RUN")
decode_ms=$(pgbench_latency "$DEC_SCRIPT" "$SECONDS_PER_RUN")
cluster_stop

engine_out=$("$DRIVER" "$MODEL" 200 "$THREADS" "$PROMPT")
engine_ms=$(echo "$engine_out" | awk '/engine_mean_ms/ {print $2}')

{
	echo "request path: cai_complete(max_tokens 1) through SQL vs the engine alone"
	echo "host: $(nproc) cores, $THREADS engine threads, model $(basename "$MODEL"), $(date -u +%Y-%m-%dT%H:%MZ)"
	echo "command: tests/bench/bench_request_path.sh $SECONDS_PER_RUN"
	printf 'SELECT 1 round trip (pgbench, 1 client):     %8.3f ms\n' "$select1_ms"
	printf 'cai_tokenize via SQL (pgbench, 1 client):    %8.3f ms   (request path, no forward pass)\n' "$tokenize_ms"
	printf 'cai_complete via SQL (pgbench, 1 client):    %8.3f ms\n' "$sql_ms"
	printf 'same completion, engine only (200 calls):    %8.3f ms\n' "$engine_ms"
	echo "$engine_out" | sed 's/^/  /'
	awk -v s="$sql_ms" -v e="$engine_ms" -v o="$select1_ms" -v t="$tokenize_ms" \
		-v d="$decode_ms" -v n="$DECODE_TOKENS" 'BEGIN {
		printf "SQL minus engine-only completion:            %8.3f ms per call (within run-to-run noise when small)\n", s - e;
		printf "request path alone (tokenize less SELECT 1): %8.3f ms per call\n", t - o;
		printf "greedy %d-token completion via SQL:          %8.3f ms per call, %.1f tokens/s\n", n, d, n * 1000 / d;
	}'
} | tee "$OUT/request_path.txt"
