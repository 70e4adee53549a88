#!/usr/bin/env bash
# scripts/gpu-kit.sh — prepares .gpukit/, what a bare lent GPU machine lacks to build and run
# pg_cai's GPU check (scripts/gpu-check.sh), small enough to travel with the working tree.
#
# That machine has nvcc, cuBLASLt, a C compiler and python3, but no PostgreSQL, no libxxhash and
# no package registry.  The engine needs libxxhash's headers and library: they come from Debian's
# libxxhash-dev package (downloaded and unpacked here, not installed), linked statically there.
# GNU make is carried too, used there only where the machine has none.  PostgreSQL is not needed:
# the check builds the engine, the CLI and the GPU tests, which need no server.
#
# Run here:  make gpu-kit    then on the device:  bash scripts/gpu-check.sh "$OUT"  (carry .gpukit)
set -euo pipefail

cd "$(dirname "$0")/.."
KIT=.gpukit
rm -rf "$KIT"
mkdir -p "$KIT/include" "$KIT/lib" "$KIT/bin"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

from_package=false
if (cd "$tmp" && apt-get download libxxhash-dev >/dev/null 2>&1); then
	dpkg -x "$tmp"/libxxhash-dev_*.deb "$tmp/root"
	src_inc="$tmp/root/usr/include"
	src_lib=$(dirname "$(find "$tmp/root" -name libxxhash.a | head -n 1)")
	from_package=true
	version=$(dpkg-deb -f "$tmp"/libxxhash-dev_*.deb Version)
elif dpkg -s libxxhash-dev >/dev/null 2>&1; then
	# no package lists (apt-get update not run): the installed package's files are the same
	src_inc=/usr/include
	src_lib=$(dirname "$(dpkg -L libxxhash-dev | grep 'libxxhash\.a$' | head -n 1)")
	version=$(dpkg-query -W -f '${Version}' libxxhash-dev)
else
	echo "gpu-kit: libxxhash-dev can be neither downloaded nor found installed" >&2
	echo "gpu-kit: run 'apt-get update' (or install libxxhash-dev) and try again" >&2
	exit 1
fi
cp "$src_inc/xxhash.h" "$src_inc/xxh3.h" "$KIT/include/"
cp "$src_lib/libxxhash.a" "$KIT/lib/"
cp "$(command -v make)" "$KIT/bin/make"

{
	echo "libxxhash-dev $version ($([ "$from_package" = true ] && echo "downloaded package" || echo "installed package")): include/xxhash.h include/xxh3.h lib/libxxhash.a"
	echo "GNU make $(make --version | head -n 1 | awk '{print $3}') from $(command -v make): bin/make"
	(cd "$KIT" && find . -type f ! -name MANIFEST | sort | xargs sha256sum)
} >"$KIT/MANIFEST"
echo "gpu-kit: $KIT ready ($(du -sh "$KIT" | cut -f1)); carry it to the device:"
sed 's/^/  /' "$KIT/MANIFEST"
