#!/bin/bash
# scripts/scale-out.sh — a router and N pg_cai data nodes on the loopback interface, for trying
# and testing scale-out on one machine (README "Scaling out").
#
#   scripts/scale-out.sh start [NODES]     (default 3; `make cluster NODES=3`)
#   scripts/scale-out.sh stop              (`make cluster-stop`)
#   scripts/scale-out.sh status
#
# Layout: $CAI_CLUSTER_DIR (default /tmp/pg_cai_cluster) holds router/ and node1/ .. nodeN/, each
# a PostgreSQL data directory with its server.log; the router listens on 127.0.0.1 port
# $CAI_CLUSTER_PORT (default 55440) and node i on that port + i, each with its Unix socket in
# its own folder.  Every node is a PostgreSQL server with pg_cai preloaded and its own engine
# ($CAI_MODEL, default models/SmolLM2-135M-Instruct.Q4_1.gguf; pg_cai.threads from
# $CAI_NODE_THREADS, default 1; more settings, space-separated name=value, from
# $CAI_NODE_SETTINGS) and database "cai" with CREATE EXTENSION pg_cai and
# cai_set_partition(i - 1); the router has database "cai" with CREATE EXTENSION pg_cai_router and
# every node registered.  Roles are cluster-wide per server: create a role on the router and on
# every node (scripts/scale-out.sh does that for none; the scenario test shows how).
#
# Authentication: the servers trust connections from 127.0.0.1 — for a machine of your own only.
# On real hosts the nodes authenticate the router's connections (certificates, or SCRAM with the
# passwords in the router's OS user's ~/.pgpass); see the README.
#
# Run as root (the servers run as the postgres OS user) or as the user that owns PostgreSQL,
# after `make install`.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${CAI_CLUSTER_DIR:-/tmp/pg_cai_cluster}
BASE_PORT=${CAI_CLUSTER_PORT:-55440}
MODEL=$(realpath -m "${CAI_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}")
THREADS=${CAI_NODE_THREADS:-1}
read -r -a NODE_SETTINGS <<<"${CAI_NODE_SETTINGS:-}"
BINDIR=$(pg_config --bindir)

if [ "$(id -u)" = 0 ]; then
	as_pg() { runuser -u postgres -- "$@"; }
else
	as_pg() { "$@"; }
fi

# make_server NAME PORT [SETTING=VALUE...]
make_server() {
	local name=$1 port=$2
	shift 2
	local data=$DIR/$name
	mkdir -p "$data"
	[ "$(id -u)" = 0 ] && chown postgres:postgres "$data"
	chmod 700 "$data"
	as_pg "$BINDIR/initdb" -D "$data" -A trust -U postgres --no-sync >"$DIR/$name.initdb.log" 2>&1
	{
		echo "port = $port"
		echo "listen_addresses = '127.0.0.1'"
		echo "unix_socket_directories = '$data'"
		echo "cluster_name = '$name'"
		echo "max_connections = 100"
		echo "lc_messages = 'C'"
		for setting in "$@"; do
			echo "${setting%%=*} = ${setting#*=}"
		done
	} | as_pg tee -a "$data/postgresql.conf" >/dev/null
	as_pg "$BINDIR/pg_ctl" -D "$data" -l "$data/server.log" -w -t 120 start >/dev/null
	as_pg "$BINDIR/psql" -X -q -h "$data" -p "$port" -U postgres -d postgres -c "CREATE DATABASE cai"
}

sql() {		# sql NAME PORT SQL
	as_pg "$BINDIR/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$DIR/$1" -p "$2" -U postgres -d cai -c "$3"
}

start() {
	local nodes=${1:-3}
	if [ -e "$DIR" ]; then
		echo "scale-out.sh: $DIR exists; run '$0 stop' first" >&2
		exit 1
	fi
	if [ ! -f "$MODEL" ]; then
		echo "scale-out.sh: no model at $MODEL (make model, or set CAI_MODEL)" >&2
		exit 1
	fi
	mkdir -p "$DIR"
	chmod 755 "$DIR"
	[ "$(id -u)" = 0 ] && chown postgres:postgres "$DIR"
	for i in $(seq 1 "$nodes"); do
		make_server "node$i" $((BASE_PORT + i)) "$(cat "$ROOT/pg_cai.conf")" \
			"pg_cai.model='$MODEL'" "pg_cai.threads=$THREADS" ${NODE_SETTINGS[@]+"${NODE_SETTINGS[@]}"}
		sql "node$i" $((BASE_PORT + i)) "CREATE EXTENSION pg_cai; SELECT cai_set_partition($((i - 1)))" >/dev/null
	done
	make_server router "$BASE_PORT"
	sql router "$BASE_PORT" "CREATE EXTENSION pg_cai_router CASCADE" >/dev/null
	for i in $(seq 1 "$nodes"); do
		sql router "$BASE_PORT" "SELECT cai_router_add_node('node$i', \
			'host=127.0.0.1 port=$((BASE_PORT + i)) dbname=cai connect_timeout=2')" >/dev/null
	done
	for i in $(seq 1 "$nodes"); do
		for _ in $(seq 1 300); do
			grep -qE 'pg_cai engine worker (ready|has no model)' "$DIR/node$i/server.log" && break
			sleep 0.2
		done
	done
	status
}

stop() {
	for data in "$DIR"/router "$DIR"/node*; do
		[ -f "$data/postmaster.pid" ] && as_pg "$BINDIR/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1
	done
	rm -rf "$DIR"
}

status() {
	echo "router: psql -h 127.0.0.1 -p $BASE_PORT -U postgres cai    ($DIR/router)"
	sql router "$BASE_PORT" "SELECT format('%s: partition %s, %s', name, partition, connstr) FROM cai_router.nodes ORDER BY partition"
}

case ${1:-} in
start) start "${2:-3}" ;;
stop) stop ;;
status) status ;;
*)
	echo "usage: $0 start [NODES] | stop | status" >&2
	exit 2
	;;
esac
