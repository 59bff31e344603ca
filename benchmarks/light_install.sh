#!/usr/bin/env bash
# The base install: build the wheel, install it without extras in a fresh venv, and rerank and serve an ONNX export
# with it. Reports the install's seconds and size (what it adds to site-packages) and checks that torch is not
# installed. With COLD=1, pip downloads every package again (--no-cache-dir), as a new user's first install does.
#   bash benchmarks/light_install.sh EXPORT_FOLDER [OUTPUT]   (default output: benchmarks/results/light-install.txt)
#   COLD=1 bash benchmarks/light_install.sh EXPORT_FOLDER benchmarks/results/light-install-cold.txt
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
EXPORT=$(cd "$1" && pwd)
OUT=${2:-$ROOT/benchmarks/results/light-install.txt}
PY=${PY:-$ROOT/.venv/bin/python}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/light-install.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
mkdir "$TMP/src"
cp -r "$ROOT"/pyproject.toml "$ROOT"/README.md "$ROOT"/LICENSE "$ROOT"/distill "$ROOT"/teachers "$ROOT"/students "$TMP/src/"
"$PY" -m build --wheel --outdir "$TMP/dist" "$TMP/src" >/dev/null 2>&1
WHEEL=$(echo "$TMP"/dist/*.whl)
python3 -m venv "$TMP/venv"
SITE=$("$TMP/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
BEFORE=$(du -sm "$SITE" | cut -f1)  # the fresh venv's own pip (and setuptools)
START=$(date +%s.%N)
CACHE=()
[ "${COLD:-0}" = 1 ] && CACHE=(--no-cache-dir)
"$TMP/venv/bin/python" -m pip install --disable-pip-version-check -q "${CACHE[@]}" "$WHEEL" 2>&1 | grep -v "is ignored" || true
SECONDS_TAKEN=$(echo "$(date +%s.%N) - $START" | bc)
SIZE=$(du -sm "$SITE" | cut -f1)
TORCH=$("$TMP/venv/bin/python" -c 'import importlib.util; print(importlib.util.find_spec("torch") is not None)')
PACKAGES=$("$TMP/venv/bin/python" -m pip list --format freeze 2>/dev/null | wc -l)
"$PY" - "$ROOT/data/trec-dl19/bm25_top100.json" "$TMP/one-query.json" <<'PYTHON'
import json, sys
json.dump(json.load(open(sys.argv[1]))[:1], open(sys.argv[2], "w"))
PYTHON
(cd "$TMP" && HF_HUB_OFFLINE=1 "$TMP/venv/bin/distill" rerank --model "$EXPORT" --backend onnx \
    --input "$TMP/one-query.json" --output "$TMP/run.trec" >/dev/null 2>&1)
PAIRS=$(wc -l <"$TMP/run.trec")
HF_HUB_OFFLINE=1 "$TMP/venv/bin/distill" serve --model "$EXPORT" --backend onnx --port 0 2>"$TMP/serve.log" &
SERVER=$!
for _ in $(seq 120); do grep -q "listening on" "$TMP/serve.log" && break; sleep 0.5; done
URL=$(grep -o "http://[^ ]*" "$TMP/serve.log" | head -1)
SERVED=$(curl -s "$URL/rerank" -H 'content-type: application/json' -d '{"query": "what is a rhino", "texts": ["Rhinos are large.", "A flea."]}')
kill "$SERVER"; wait "$SERVER" || true
CPU=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | xargs)
FLAGS=$(grep -m1 "^flags" /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_vnni|avx512_bf16|amx_bf16|amx_tile)$' | xargs)
{
    echo "# bash benchmarks/light_install.sh $1, $(date -u +%F), $CPU, $(nproc) cores ($FLAGS)"
    if [ "${COLD:-0}" = 1 ]; then
        echo "# the wheel's base dependencies only, every package downloaded again (pip --no-cache-dir)"
    else
        echo "# the wheel's base dependencies only, pip's cache as this machine had it"
    fi
    echo "install_seconds $SECONDS_TAKEN"
    echo "installed_mb $((SIZE - BEFORE))  (site-packages $SIZE MB, of which the fresh venv's own $BEFORE MB)"
    echo "packages $PACKAGES"
    echo "torch_installed $TORCH"
    echo "rerank_pairs_onnx $PAIRS"
    echo "serve_rerank_answer $SERVED"
    echo "# the largest folders of site-packages (MB)"
    du -sm "$SITE"/* | sort -rn | head -12 | sed "s|$SITE/||"
} | tee "$OUT"
