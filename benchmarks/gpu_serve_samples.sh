#!/usr/bin/env bash
# Where the batched server's threads spend a GPU cell, beside the GPU suite's serving stage: `python -m
# benchmarks.load` at 10 documents a request, concurrency 8 and 32, batched and one at a time (512 requests a cell),
# on the stage's student (bert-large, random weights, fp16), with :mod:`benchmarks.thread_samples` sampling every
# thread of the servers and of the load generator every 2 ms, one run per concurrency C: its serve.json, serve.md and
# serve.png go into OUT/load-cC, its samples into OUT/samples-cC, their summary into OUT/threads-cC.txt and the batcher
# thread's, from its frames in batcher.py, into OUT/batcher-cC.txt.
#   bash benchmarks/gpu_serve_samples.sh STUDENT OUT
set -uo pipefail
student=$1 out=$2
mkdir -p "$out"
for c in 8 32; do
  CIS_THREAD_SAMPLES=$out/samples-c$c CIS_THREAD_SAMPLE_MS=2 PYTHONPATH=$PWD/benchmarks/thread_sampling:${PYTHONPATH:-} \
    python3 -m benchmarks.load run --model "$student" --backend torch --serve-args "--device cuda --dtype float16" \
    --servers batched,one-at-a-time --documents 10 --requests 512 --concurrency $c --robustness 0 \
    --out "$out/load-c$c" > "$out/load-c$c.log" 2>&1
  echo "c=$c: exit $?"; grep -E 'docs c=' "$out/load-c$c.log"
  python3 -m benchmarks.thread_samples "$out/samples-c$c" --top 12 > "$out/threads-c$c.txt"
  python3 -m benchmarks.thread_samples "$out/samples-c$c" --top 12 --within batcher.py --thread rerank-batcher \
    > "$out/batcher-c$c.txt"
  cat "$out/batcher-c$c.txt"
done
