#!/bin/bash
# tests/bench/bench_pgbench.sh — SQL-level throughput and latency of cai_chat under pgbench.
#
# Starts a throwaway cluster of its own (scripts/lib-cluster.sh; max_batch 32), then for each
# client count runs pgbench for a fixed time with a script that asks one question in a new
# conversation (`cai_chat(cai_new_conversation(...), ..., max_tokens N, ignore_eos)`, so every reply
# is exactly N tokens), and reports:
#   completion tokens/s   tokens the engine generated during the run / the run's wall time
#   p50 / p99 latency     of whole transactions (one cai_chat call), from pgbench's per-transaction log
#   avg batch             sequences per engine step during the run (pg_stat_cai)
#   busy                  share of the run's wall time the engine spent in steps
#   prompt / cached       mean prompt tokens per request, and how many of them the prefix cache
#                         served (the shared system prompt's whole 16-token blocks)
#   speed-up              completion tokens/s relative to the first client count
# then, for each client count, the same work given to the engine alone (closed_loop_engine.c,
# linked with build/libcai.a: the same chats through the model's template, the same cache, batch
# and step budget, each client submitting its next request the moment the last one finishes):
#   engine/s              its completion tokens/s, and SQL/engine the share of it the SQL path
#                         delivered (the server's engine is idle meanwhile)
#
#   tests/bench/bench_pgbench.sh [-c 1,4,16,32] [-T seconds] [-n max_tokens] [-m model]
#
# Run as root (the server runs as the postgres OS user) or as the user owning PostgreSQL, after
# `make install`.  Not part of the test suite: figures depend on the machine and its load.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CLIENTS=1,4,16,32
DURATION=40
MAX_TOKENS=32
MODEL=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf
while getopts "c:T:n:m:" opt; do
	case $opt in
		c) CLIENTS=$OPTARG ;;
		T) DURATION=$OPTARG ;;
		n) MAX_TOKENS=$OPTARG ;;
		m) MODEL=$OPTARG ;;
		*) sed -n '2,16p' "$0"; exit 2 ;;
	esac
done
MODEL=$(realpath "$MODEL")

# shellcheck source=../../scripts/lib-cluster.sh
. "$ROOT/scripts/lib-cluster.sh"

max_clients=$(tr ',' '\n' <<<"$CLIENTS" | sort -n | tail -n 1)
cluster_create "$MODEL" pg_cai.max_batch=32 pg_cai.max_queue=256 "max_connections=$((max_clients + 10))" \
	"pg_cai.job_databases=''"
trap 'cluster_stop; rm -rf "$CLUSTER_DIR"' EXIT
cluster_start
cluster_env
psql -qX -c "CREATE EXTENSION pg_cai"

WORK=$(mktemp -d /tmp/cai_bench_pgbench.XXXX)
chmod 777 "$WORK"
make -C "$ROOT" --no-print-directory build/libcai.a >/dev/null
cc -O2 -I"$ROOT/src/common" -o "$WORK/closed_loop_engine" "$ROOT/tests/bench/closed_loop_engine.c" \
	"$ROOT/build/libcai.a" -lxxhash -lpthread -lm -ldl
cat >"$WORK/chat.sql" <<EOF
\set n random(1, 1000000)
SELECT cai_chat(cai_new_conversation('You are a helpful assistant.'),
                'Tell me something about the number ' || :client_id || '-' || :n || '.',
                '{"max_tokens": $MAX_TOKENS, "ignore_eos": true}');
EOF

stat() { psql -qXAt -c "SELECT $1 FROM pg_stat_cai"; }
THREADS=$(stat "substring(device from ', ([0-9]+) thread')")

# warm-up: the engine's buffers, the system prompt in the prefix cache
"$CLUSTER_BINDIR/pgbench" -n -c 2 -j 1 -t 2 -f "$WORK/chat.sql" >/dev/null

echo "pg_cai pgbench benchmark: $(stat "model || ' on ' || device"), max_tokens $MAX_TOKENS, ${DURATION}s per run, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %8s %10s %14s %10s %10s %10s %6s %15s %9s %10s %11s\n' clients txns 'txn/s' 'completion/s' 'p50 ms' 'p99 ms' \
	'avg batch' 'busy' 'prompt/cached' 'speed-up' 'engine/s' 'SQL/engine'
base=""
for c in ${CLIENTS//,/ }; do
	gen0=$(stat generated_tokens)
	steps0=$(stat steps)
	seqs0=$(stat "coalesce(avg_batch * steps, 0)")
	busy0=$(stat busy_seconds)
	last_id=$(psql -qXAt -c "SELECT coalesce(max(id), 0) FROM cai.messages")
	rm -f "$WORK"/log*
	t0=$(date +%s.%N)
	out=$(cd "$WORK" && "$CLUSTER_BINDIR/pgbench" -n -c "$c" -j "$((c < 2 ? c : 2))" -T "$DURATION" -l --log-prefix=log \
		-f "$WORK/chat.sql" 2>&1)
	t1=$(date +%s.%N)
	gen1=$(stat generated_tokens)
	steps1=$(stat steps)
	seqs1=$(stat "coalesce(avg_batch * steps, 0)")
	busy1=$(stat busy_seconds)
	failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' <<<"$out")
	if [ "${failed:-0}" != 0 ] || ! grep -q 'number of transactions actually processed' <<<"$out"; then
		echo "pgbench with $c clients failed:" >&2
		echo "$out" >&2
		exit 1
	fi
	# per-transaction log lines: client_id transaction_no latency_us script_no epoch_s epoch_us
	read -r n p50 p99 < <(cat "$WORK"/log* | awk '{print $3}' | sort -n |
		awk '{v[NR] = $1} END {i50 = int(NR * 0.50 + 0.5); i99 = int(NR * 0.99 + 0.5);
			if (i50 < 1) i50 = 1; if (i99 < 1) i99 = 1;
			printf "%d %.0f %.0f\n", NR, v[i50] / 1000, v[i99] / 1000}')
	tps=$(awk -v n="$n" -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", n / (b - a)}')
	rate=$(awk -v g0="$gen0" -v g1="$gen1" -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", (g1 - g0) / (b - a)}')
	batch=$(awk -v s0="$steps0" -v s1="$steps1" -v q0="$seqs0" -v q1="$seqs1" \
		'BEGIN {printf "%.1f", (s1 > s0) ? (q1 - q0) / (s1 - s0) : 0}')
	prompts=$(psql -qXAt -c "SELECT round(avg(prompt_tokens)) || '/' || round(avg(cached_tokens))
		FROM cai.messages WHERE role = 'assistant' AND id > $last_id")
	busy=$(awk -v b0="$busy0" -v b1="$busy1" -v a="$t0" -v b="$t1" 'BEGIN {printf "%.0f%%", 100 * (b1 - b0) / (b - a)}')
	[ -z "$base" ] && base=$rate
	speedup=$(awk -v r="$rate" -v b="$base" 'BEGIN {printf "%.1fx", r / b}')
	engine_rate=$("$WORK/closed_loop_engine" "$MODEL" "${THREADS:-0}" "$c" "$DURATION" "$MAX_TOKENS" 32 |
		sed -n 's/.* completion\/s \([0-9.]*\) .*/\1/p')
	share=$(awk -v r="$rate" -v e="$engine_rate" 'BEGIN {printf "%.0f%%", (e > 0 ? 100 * r / e : 0)}')
	printf '%-8s %8s %10s %14s %10s %10s %10s %6s %15s %9s %10s %11s\n' "$c" "$n" "$tps" "$rate" "$p50" "$p99" "$batch" \
		"$busy" "$prompts" "$speedup" "$engine_rate" "$share"
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
rm -rf "$WORK"
