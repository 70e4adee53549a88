#!/bin/bash
# scripts/scale-out.sh — a router and N pg_cai data nodes on the loopback interface, for trying
# and testing scale-out on one machine (README "Scaling out").
#
#   scripts/scale-out.sh start [NODES]     (default 3; `make cluster NODES=3`)
#   scripts/scale-out.sh stop              (`make cluster-stop`)
#   scripts/scale-out.sh status
#   scripts/scale-out.sh add-role NAME [PASSWORD]
#
# Layout: $CAI_CLUSTER_DIR (default /tmp/pg_cai_cluster) holds router/ and node1/ .. nodeN/, each
# a PostgreSQL data directory with its server.log; the router listens on 127.0.0.1 port
# $CAI_CLUSTER_PORT (default 55440) and node i on that port + i, each with its Unix socket in
# its own folder.  Every node is a PostgreSQL server with pg_cai preloaded and its own engine
# ($CAI_MODEL, default models/SmolLM2-135M-Instruct.Q4_1.gguf; pg_cai.threads from
# $CAI_NODE_THREADS, default 1; more settings, space-separated name=value, from
# $CAI_NODE_SETTINGS) and database "cai" with CREATE EXTENSION pg_cai and
# cai_set_partition(i - 1); the router has database "cai" with CREATE EXTENSION pg_cai_router and
# every node registered.  Roles are per server: `add-role NAME [PASSWORD]` creates a login role
# in cai_user on the router and on every node (and, with SCRAM, its password on the nodes and its
# line in the router's password file).
#
# Authentication ($CAI_CLUSTER_AUTH): "trust" (the default) trusts every connection from
# 127.0.0.1, for a machine of your own only; "scram" makes the nodes ask the router's connections
# for SCRAM passwords, which the router's libpq finds in $CAI_CLUSTER_DIR/router.pgpass (its
# PGPASSFILE, standing in for ~/.pgpass of its OS user), the README's .pgpass setup.  Clients
# still reach the router, and the script the servers' Unix sockets, without a password.
#
# PL/Proxy (Debian postgresql-<major>-plproxy) is installed with apt-get when it is missing and
# this runs as root; otherwise start says what to install.  A start that fails midway stops the
# servers it started and removes $CAI_CLUSTER_DIR, after showing the end of the last log.
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
AUTH=${CAI_CLUSTER_AUTH:-trust}
BINDIR=$(pg_config --bindir)
PASSFILE=$DIR/router.pgpass

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
	LAST_LOG=$DIR/$name.initdb.log
	as_pg "$BINDIR/initdb" -D "$data" -A trust -U postgres --no-sync >"$LAST_LOG" 2>&1
	LAST_LOG=$data/server.log
	if [ "$AUTH" = scram ] && [ "$name" != router ]; then
		# the script's own connections come through the socket; the router's through TCP
		printf 'local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n' |
			as_pg tee "$data/pg_hba.conf" >/dev/null
	fi
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
	if [ "$AUTH" = scram ] && [ "$name" = router ]; then
		as_pg env PGPASSFILE="$PASSFILE" "$BINDIR/pg_ctl" -D "$data" -l "$data/server.log" -w -t 120 start >/dev/null
	else
		as_pg "$BINDIR/pg_ctl" -D "$data" -l "$data/server.log" -w -t 120 start >/dev/null
	fi
	as_pg "$BINDIR/psql" -X -q -h "$data" -p "$port" -U postgres -d postgres -c "CREATE DATABASE cai"
}

sql() {		# sql NAME PORT SQL
	as_pg "$BINDIR/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$DIR/$1" -p "$2" -U postgres -d cai -c "$3"
}

# PL/Proxy must be installed where the servers look for extensions; apt-get installs it when
# this runs as root (as scripts/setup.sh installs its packages)
need_plproxy() {
	local control major package
	control=$(pg_config --sharedir)/extension/plproxy.control
	[ -f "$control" ] && return 0
	major=$(pg_config --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
	package=postgresql-$major-plproxy
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "scale-out.sh: installing PL/Proxy ($package)" >&2
		apt-get update -qq || true
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null || true
		[ -f "$control" ] && return 0
	fi
	echo "scale-out.sh: PL/Proxy is not installed ($control is missing): install $package (apt-get install $package) and run again" >&2
	exit 1
}

# a start that failed midway: stop what it started and remove the folder, so that the next start
# begins clean; the end of the last log it wrote says why
start_failed() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	echo "scale-out.sh: start failed; stopping the servers it started and removing $DIR" >&2
	if [ -n "${LAST_LOG:-}" ] && [ -f "$LAST_LOG" ]; then
		echo "-- end of $LAST_LOG:" >&2
		tail -n 15 "$LAST_LOG" >&2
	fi
	stop
	exit $((rc == 0 ? 1 : rc))
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
	case $AUTH in
	trust | scram) ;;
	*)
		echo "scale-out.sh: CAI_CLUSTER_AUTH must be trust or scram, not $AUTH" >&2
		exit 2
		;;
	esac
	need_plproxy
	trap start_failed EXIT
	trap 'exit 130' INT TERM
	mkdir -p "$DIR"
	chmod 755 "$DIR"
	[ "$(id -u)" = 0 ] && chown postgres:postgres "$DIR"
	if [ "$AUTH" = scram ]; then
		as_pg touch "$PASSFILE"
		as_pg chmod 600 "$PASSFILE"
	fi
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
	trap - EXIT INT TERM
	status
}

stop() {
	for data in "$DIR"/router "$DIR"/node*; do
		if [ -f "$data/postmaster.pid" ]; then
			as_pg "$BINDIR/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
		fi
	done
	rm -rf "$DIR"
}

# add-role NAME [PASSWORD]: a login role in cai_user on the router and on every node
add_role() {
	local name=$1 password=${2:-} data port line
	if [ ! -d "$DIR/router" ]; then
		echo "scale-out.sh: no cluster in $DIR" >&2
		exit 1
	fi
	for data in "$DIR"/router "$DIR"/node*/; do
		data=${data%/}
		port=$(sed -nE 's/^port = ([0-9]+)$/\1/p' "$data/postgresql.conf" | tail -n 1)
		if [ -n "$password" ] && [ "$(basename "$data")" != router ]; then
			# psql variables quote the name and the password; -c would not interpolate them
			echo "CREATE ROLE :\"name\" LOGIN IN ROLE cai_user PASSWORD :'password'"
		else
			echo "CREATE ROLE :\"name\" LOGIN IN ROLE cai_user"
		fi | as_pg "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -v name="$name" -v password="$password" \
			-h "$data" -p "$port" -U postgres -d cai
	done
	# a cluster started with SCRAM has the router's password file
	if [ -f "$PASSFILE" ]; then
		if [ -z "$password" ]; then
			echo "scale-out.sh: with SCRAM, $name needs a password to reach the nodes" >&2
			exit 1
		fi
		# host:port:database:user:password, with ':' and '\' escaped
		line=$(printf '127.0.0.1:*:cai:%s:%s' "$(printf '%s' "$name" | sed 's/[\\:]/\\&/g')" \
			"$(printf '%s' "$password" | sed 's/[\\:]/\\&/g')")
		printf '%s\n' "$line" | as_pg tee -a "$PASSFILE" >/dev/null
	fi
}

status() {
	echo "router: psql -h 127.0.0.1 -p $BASE_PORT -U postgres cai    ($DIR/router)"
	sql router "$BASE_PORT" "SELECT format('%s: partition %s, %s', name, partition, connstr) FROM cai_router.nodes ORDER BY partition"
}

case ${1:-} in
start) start "${2:-3}" ;;
stop) stop ;;
status) status ;;
add-role)
	if [ -z "${2:-}" ]; then
		echo "usage: $0 add-role NAME [PASSWORD]" >&2
		exit 2
	fi
	add_role "$2" "${3:-}"
	;;
*)
	echo "usage: $0 start [NODES] | stop | status | add-role NAME [PASSWORD]" >&2
	exit 2
	;;
esac
