#!/usr/bin/env bash
# Serving levers on a lent GPU, beside the GPU suite's serving stage: `python -m benchmarks.load` at 10 documents a
# request, concurrency 8 and 32, batched and one at a time (512 requests a cell), on the stage's student (bert-large,
# random weights, fp16), once per lever: the defaults; `--gather_while_busy true` (a round taken while a batch is on
# the device waits for the requests being tokenised until the device is about to be free); `--max_wait_ms 0` (a
# round never waits for requests on their way); the interpreter's thread switch interval at 0.5 ms in the servers
# (how soon the batcher thread gets the GIL back from the event loop and the tokenising threads; CPython's default is
# 5 ms).
# Each lever's serve.json, serve.md and serve.png go into OUT/<lever>, its log into OUT/<lever>.log.
#   bash benchmarks/gpu_serve_levers.sh STUDENT OUT
set -uo pipefail
student=$1 out=$2
site=$(mktemp -d)
mkdir -p "$out"
printf 'import os, sys\nif os.environ.get("CIS_SWITCH_INTERVAL"):\n    sys.setswitchinterval(float(os.environ["CIS_SWITCH_INTERVAL"]))\n' \
  > "$site/sitecustomize.py"
levers() {
  local name=$1 interval=$2 extra=$3
  CIS_SWITCH_INTERVAL=$interval PYTHONPATH=$site:${PYTHONPATH:-} python3 -m benchmarks.load run --model "$student" \
    --backend torch --serve-args "--device cuda --dtype float16 $extra" --servers batched,one-at-a-time \
    --documents 10 --requests 512 --concurrency 8,32 --robustness 0 --out "$out/$name" > "$out/$name.log" 2>&1
  echo "$name: exit $?"; grep -E 'docs c=' "$out/$name.log"
}
levers defaults "" ""
levers gather-while-busy "" "--gather_while_busy true"
levers max-wait-0 "" "--max_wait_ms 0"
levers switch-0.5ms 0.0005 ""
