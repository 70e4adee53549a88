#!/usr/bin/env bash
# make_real_shapes.sh [SHAPE...] — benchmark models of real sizes: synthetic weights in the shapes
# of real models (tests/synth/synth_presets.c: llama32-1b, llama32-3b, llama3-8b, qwen3-4b),
# written in F16 by the synthetic GGUF writer, then quantized by llama.cpp's own quantizer into
#   $SHAPES_DIR/<shape>-f16.gguf, <shape>-q4_k_m.gguf, <shape>-q4_0.gguf, <shape>-q8_0.gguf
# Files that exist are kept (delete one to make it again).  Default shapes: llama32-1b llama32-3b.
#
# Needs:
#   BENCH_PYTHON     a python with llama-cpp-python (default /opt/benchenv/bin/python)
#   SHAPES_TOKENIZER the GGUF whose tokenizer is padded to the real vocabulary size (default
#                    models/SmolLM2-135M-Instruct.Q4_1.gguf, which `make model` fetches);
#                    "builtin" pads the synthetic writer's 324-token tokenizer instead
#   SHAPES_DIR       where the files go (default models/synth, git-ignored)
#   SHAPES_QUANTS    which quantizations (default "q4_k_m q4_0 q8_0")
#   SHAPES_KEEP_F16  0 deletes the F16 file once quantized (default 1: keep it)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${BENCH_PYTHON:-/opt/benchenv/bin/python}
TOKENIZER=${SHAPES_TOKENIZER:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
DIR=${SHAPES_DIR:-$ROOT/models/synth}
QUANTS=${SHAPES_QUANTS:-q4_k_m q4_0 q8_0}
KEEP_F16=${SHAPES_KEEP_F16:-1}
WRITER=$ROOT/tests/synth/write_synth_model
QUANTIZE=$ROOT/tests/bench/quantize_gguf.py

die() { echo "make_real_shapes.sh: $*" >&2; exit 1; }

if [ $# -eq 0 ]; then
	set -- llama32-1b llama32-3b
fi
if ! [ -x "$PY" ] || ! "$PY" -c 'import llama_cpp' 2>/dev/null; then
	die "needs llama-cpp-python (llama.cpp's quantizer) in $PY; install it into the bench venv" \
		"(python3 -m venv /opt/benchenv && /opt/benchenv/bin/pip install llama-cpp-python)" \
		"or point BENCH_PYTHON at a python that has it"
fi
TOKENIZER_ARG=("$TOKENIZER")
if [ "$TOKENIZER" = builtin ]; then
	TOKENIZER_ARG=()
elif ! [ -f "$TOKENIZER" ]; then
	die "no tokenizer model $TOKENIZER: run \`make model\`, set SHAPES_TOKENIZER to a byte-level" \
		"BPE GGUF (SmolLM2's), or SHAPES_TOKENIZER=builtin for the synthetic 324-token tokenizer"
fi
make -s -C "$ROOT" tests/synth/write_synth_model || die "could not build $WRITER"
mkdir -p "$DIR"

for shape in "$@"; do
	"$WRITER" --shapes | grep -qx -- "$shape" ||
		die "unknown shape '$shape' (one of: $("$WRITER" --shapes | tr '\n' ' '))"
	f16=$DIR/$shape-f16.gguf
	missing=
	for q in $QUANTS; do
		[ -f "$DIR/$shape-$q.gguf" ] || missing="$missing $q"
	done
	if [ -z "$missing" ]; then
		echo "$shape: all of $QUANTS exist in $DIR"
		continue
	fi
	if ! [ -f "$f16" ]; then
		start=$SECONDS
		"$WRITER" --shape "$shape" "$f16.part" "${TOKENIZER_ARG[@]}" || { rm -f "$f16.part"; die "writing $f16 failed"; }
		mv "$f16.part" "$f16"
		echo "$f16: f16, $(du -BM --apparent-size "$f16" | cut -f1), $((SECONDS - start)) s"
	fi
	for q in $missing; do
		"$PY" "$QUANTIZE" quantize "$f16" "$DIR/$shape-$q.gguf" "$q"
	done
	if [ "$KEEP_F16" = 0 ]; then
		rm -f "$f16"
	fi
done
