#!/bin/bash
# scripts/lib-cluster.sh — throwaway PostgreSQL clusters with pg_cai, for tests and benchmarks.
# Source it, then:
#   cluster_create MODEL [SETTING=VALUE ...]   initdb in a new /tmp/pg_cai_test.XXXX, append
#                                              pg_cai.conf and the settings; sets CLUSTER_DIR,
#                                              CLUSTER_DATA, CLUSTER_LOG, CLUSTER_PORT
#   cluster_start                              start and wait for the engine worker's verdict
#   cluster_stop                               fast shutdown
#   cluster_env                                export PGHOST/PGPORT/PGUSER/PGDATABASE for it
# The server runs as the postgres OS user when this runs as root.

CLUSTER_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLUSTER_BINDIR=$(pg_config --bindir)

if [ "$(id -u)" = 0 ]; then
	as_pg() { runuser -u postgres -- "$@"; }
else
	as_pg() { "$@"; }
fi

cluster_create() {
	local model=$1
	shift
	CLUSTER_DIR=$(mktemp -d /tmp/pg_cai_test.XXXX) || return 1
	chmod 755 "$CLUSTER_DIR"
	[ "$(id -u)" = 0 ] && chown postgres:postgres "$CLUSTER_DIR"
	CLUSTER_DATA=$CLUSTER_DIR/data
	CLUSTER_LOG=$CLUSTER_DIR/server.log
	CLUSTER_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	if ! as_pg "$CLUSTER_BINDIR/initdb" -D "$CLUSTER_DATA" -A trust -U postgres --no-sync \
		>"$CLUSTER_DIR/initdb.log" 2>&1; then
		echo "initdb failed: see $CLUSTER_DIR/initdb.log" >&2
		return 1
	fi
	{
		cat "$CLUSTER_ROOT/pg_cai.conf"
		# one int8 digit, nearest rounding: the expected replies were written with these numerics,
		# the quicker ones on two cores (the defaults, auto, are checked by test_reload.py)
		echo "pg_cai.weight_rounding = nearest"
		echo "pg_cai.activation_precision = int8"
		echo "port = $CLUSTER_PORT"
		echo "listen_addresses = ''"
		echo "unix_socket_directories = '$CLUSTER_DIR'"
		echo "pg_cai.model = '$model'"
		for setting in "$@"; do
			echo "${setting%%=*} = ${setting#*=}"
		done
	} | as_pg tee -a "$CLUSTER_DATA/postgresql.conf" >/dev/null
}

cluster_start() {
	if ! as_pg "$CLUSTER_BINDIR/pg_ctl" -D "$CLUSTER_DATA" -l "$CLUSTER_LOG" -w -t 120 start >/dev/null; then
		echo "the server did not start: see $CLUSTER_LOG" >&2
		return 1
	fi
	# the model loads in the background; wait until the worker says how it went
	for _ in $(seq 1 600); do
		grep -qE 'pg_cai engine worker (ready|has no model)' "$CLUSTER_LOG" && break
		sleep 0.2
	done
	grep -E 'pg_cai engine worker (ready|has no model)' "$CLUSTER_LOG" | tail -n 1 >&2
}

cluster_stop() {
	if [ -n "${CLUSTER_DATA:-}" ] && [ -f "$CLUSTER_DATA/postmaster.pid" ]; then
		as_pg "$CLUSTER_BINDIR/pg_ctl" -D "$CLUSTER_DATA" -m fast -w stop >/dev/null 2>&1
	fi
}

cluster_env() {
	export PGHOST=$CLUSTER_DIR PGPORT=$CLUSTER_PORT PGUSER=postgres PGDATABASE=postgres
}
