#!/usr/bin/env bash
# One command on a fresh Debian/Ubuntu machine: installs the packages pg_cai needs, builds and
# installs the extension, fetches the default model, starts a throwaway PostgreSQL 15 cluster
# with the engine worker and runs a first chat.
#
#   scripts/setup.sh            (or: make setup)
#   scripts/setup.sh stop       stops the cluster it started
#
# The cluster lives in .cluster/ (owned by the postgres OS user), listens on port $PGPORT
# (default 5432) and on the socket directory /var/run/postgresql, and gets a superuser role
# and a database named after you, so that plain `psql` reaches it.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
PGVER=15
PGBIN=/usr/lib/postgresql/$PGVER/bin
PGDATA_DIR=$ROOT/.cluster/data
PORT=${PGPORT:-5432}
SOCKDIR=/var/run/postgresql
ME=$(id -un)

as_postgres() {
	if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi
}
as_root() {
	if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if [ "${1:-}" = stop ]; then
	as_postgres "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -m fast stop
	exit 0
fi

echo "== packages"
if ! dpkg -s postgresql-$PGVER postgresql-server-dev-$PGVER libxxhash-dev build-essential \
	python3 python3-pip >/dev/null 2>&1; then
	as_root apt-get update -qq
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		postgresql-$PGVER postgresql-server-dev-$PGVER postgresql-contrib libxxhash-dev \
		build-essential python3 python3-pip >/dev/null
fi

echo "== build and install"
make -s -j"$(nproc)"
as_root make -s install

echo "== model"
scripts/fetch-model.sh
MODEL=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf
# the server runs as postgres and must be able to read the model
chmod o+x "$ROOT" "$ROOT/models" 2>/dev/null || true

echo "== cluster in .cluster/ (port $PORT)"
as_root mkdir -p "$ROOT/.cluster"
as_root chown postgres: "$ROOT/.cluster"
if [ ! -f "$PGDATA_DIR/PG_VERSION" ]; then
	as_postgres "$PGBIN/initdb" -D "$PGDATA_DIR" -A trust -U postgres >/dev/null
	{
		cat pg_cai.conf
		echo "pg_cai.model = '$MODEL'"
		# asynchronous replies (cai_enqueue_reply_trigger) in the database made for you below
		echo "pg_cai.job_databases = '\"$ME\"'"
		echo "port = $PORT"
		echo "unix_socket_directories = '$SOCKDIR'"
		echo "listen_addresses = ''"
	} | as_postgres tee -a "$PGDATA_DIR/postgresql.conf" >/dev/null
fi
if ! as_postgres "$PGBIN/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1; then
	as_postgres "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -l "$ROOT/.cluster/server.log" -w start >/dev/null
fi
export PGHOST=$SOCKDIR PGPORT=$PORT
psql -U postgres -d postgres -qAt -c "SELECT 1 FROM pg_roles WHERE rolname = '$ME'" | grep -q 1 ||
	psql -U postgres -d postgres -q -c "CREATE ROLE \"$ME\" SUPERUSER LOGIN"
psql -U postgres -d postgres -qAt -c "SELECT 1 FROM pg_database WHERE datname = '$ME'" | grep -q 1 ||
	psql -U postgres -d postgres -q -c "CREATE DATABASE \"$ME\" OWNER \"$ME\""
psql -q -c "CREATE EXTENSION IF NOT EXISTS pg_cai"

echo "== first chat"
psql -c "SELECT cai_chat(cai_new_conversation('You are a helpful assistant.'), 'What is the capital of France?')"
echo "Ready: psql (PGPORT=$PORT) reaches the cluster; 'scripts/setup.sh stop' stops it."
