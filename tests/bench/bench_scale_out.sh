#!/bin/bash
# tests/bench/bench_scale_out.sh — what the PL/Proxy router costs per call, and aggregate decode
# throughput of N data nodes against one node given the same total engine threads.
#
#   tests/bench/bench_scale_out.sh [SECONDS]        (default 20 per pgbench run)
#
# Router latency: pgbench, one client, prepared, the same call on the router and on a node
# directly — cai_tokenize (a call to any node) and cai_history of a 2-turn conversation (a call
# routed by conversation id); the difference is the router's price per call.
# Throughput: CLIENTS (24) pgbench clients running 32-token greedy completions (ignore_eos), on
# a cluster of N nodes with one engine thread each through the router, and on one node with N
# threads directly; for N = 3 (as many threads as nodes) and N = 2 (the cores of this machine, so
# no configuration oversubscribes them).  A benchmark, not a test: it prints, asserts nothing.
# Needs `make install`, postgresql-15-plproxy and the model; uses scripts/scale-out.sh (its own
# folder and ports).  Results also go to tests/bench/out/scale_out.txt.
set -eu

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SECONDS_PER_RUN=${1:-20}
CLIENTS=24
TOKENS=32
OUT=$ROOT/tests/bench/out
mkdir -p "$OUT"
export CAI_CLUSTER_DIR=/tmp/pg_cai_bench_scale
export CAI_CLUSTER_PORT=${CAI_CLUSTER_PORT:-55540}
SCRIPT=$ROOT/scripts/scale-out.sh
trap '"$SCRIPT" stop >/dev/null 2>&1 || true; rm -f "$TMPF"*' EXIT
TMPF=$(mktemp /tmp/bench_scale.XXXX)

pgb() {		# pgb PORT CLIENTS SCRIPT -> "tps latency_ms"
	pgbench -h 127.0.0.1 -p "$1" -U postgres -n -M prepared -c "$2" -j "$2" -T "$SECONDS_PER_RUN" \
		-f "$3" cai 2>&1 | awk '/latency average/ {lat = $4} /^tps/ {tps = $3} END {print tps, lat}'
}
q() { psql -X -A -t -q -h 127.0.0.1 -p "$1" -U postgres cai -c "$2"; }

echo "SELECT cai_tokenize('The capital of France is');" >"$TMPF.tok"
echo "SELECT cai_complete('Write a story about a dragon.', '{\"max_tokens\": $TOKENS, \"ignore_eos\": true}');" >"$TMPF.gen"
chmod 644 "$TMPF".*

{
	echo "scale-out: PL/Proxy router and pg_cai data nodes on 127.0.0.1"
	echo "host: $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ); command: tests/bench/bench_scale_out.sh $SECONDS_PER_RUN"

	# ---- router latency (router + 1 node, 1 thread)
	"$SCRIPT" stop >/dev/null 2>&1 || true
	CAI_NODE_THREADS=1 "$SCRIPT" start 1 >/dev/null 2>&1
	node=$((CAI_CLUSTER_PORT + 1))
	conv=$(q "$CAI_CLUSTER_PORT" "SELECT cai_new_conversation()")
	q "$CAI_CLUSTER_PORT" "SELECT cai_chat($conv, 'Hello', '{\"max_tokens\": 8}')" >/dev/null
	echo "SELECT count(*) FROM cai_history($conv);" >"$TMPF.hist"
	pgb "$CAI_CLUSTER_PORT" 1 "$TMPF.tok" >/dev/null	# warm-up
	read -r _ tok_router <<<"$(pgb "$CAI_CLUSTER_PORT" 1 "$TMPF.tok")"
	read -r _ tok_node <<<"$(pgb "$node" 1 "$TMPF.tok")"
	read -r _ hist_router <<<"$(pgb "$CAI_CLUSTER_PORT" 1 "$TMPF.hist")"
	read -r _ hist_node <<<"$(pgb "$node" 1 "$TMPF.hist")"
	printf 'cai_tokenize, router / node directly:     %7.3f / %7.3f ms  -> router adds %.3f ms\n' \
		"$tok_router" "$tok_node" "$(echo "$tok_router - $tok_node" | bc -l)"
	printf 'cai_history (routed by id), router / node: %7.3f / %7.3f ms  -> router adds %.3f ms\n' \
		"$hist_router" "$hist_node" "$(echo "$hist_router - $hist_node" | bc -l)"
	"$SCRIPT" stop >/dev/null 2>&1

	# ---- throughput: N nodes x 1 thread through the router vs 1 node x N threads
	for n in 3 2; do
		CAI_NODE_THREADS=1 "$SCRIPT" start "$n" >/dev/null 2>&1
		pgb "$CAI_CLUSTER_PORT" "$CLIENTS" "$TMPF.gen" >/dev/null
		read -r tps_cluster _ <<<"$(pgb "$CAI_CLUSTER_PORT" "$CLIENTS" "$TMPF.gen")"
		"$SCRIPT" stop >/dev/null 2>&1
		CAI_NODE_THREADS=$n "$SCRIPT" start 1 >/dev/null 2>&1
		pgb "$((CAI_CLUSTER_PORT + 1))" "$CLIENTS" "$TMPF.gen" >/dev/null
		read -r tps_single _ <<<"$(pgb "$((CAI_CLUSTER_PORT + 1))" "$CLIENTS" "$TMPF.gen")"
		"$SCRIPT" stop >/dev/null 2>&1
		awk -v n="$n" -v c="$tps_cluster" -v s="$tps_single" -v t="$TOKENS" -v k="$CLIENTS" 'BEGIN {
			printf "%d clients, %d-token completions: %d nodes x 1 thread via the router %.0f tokens/s; 1 node x %d threads %.0f tokens/s; ratio %.2f\n",
				k, t, n, c * t, n, s * t, c / s }'
	done
} | tee "$OUT/scale_out.txt"
