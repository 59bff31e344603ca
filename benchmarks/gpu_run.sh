#!/usr/bin/env bash
# The one prepared call on a lent GPU machine (the `device` tool runs it in a copy of the checkout, with $OUT):
# the GPU suite's serving stage first, then the CUDA-graph tests, then the suite's other stages in what is left of
# a deadline (seconds, default 500), each folder packed as one .tar.xz under $OUT; with `levers` or `samples` as the
# second argument, benchmarks/gpu_serve_levers.sh or benchmarks/gpu_serve_samples.sh (and the levers, if 240 s are
# left) in place of the other stages.
# Before the call, here:
# `bash benchmarks/gpu_wheels.sh` (the wheels and stubs, carried as .gpu) and `bash benchmarks/gpu_tree.sh out` (the
# working tree under the tool's 64 MiB); after it, `bash benchmarks/gpu_tree.sh back`.
#   bash benchmarks/gpu_run.sh [deadline_s] [levers|samples]
set -o pipefail
deadline=${1:-500}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl \
  || exit 3
export PYTHONPATH=$PWD/.gpu/stubs:/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; lscpu | grep -E 'Model name|^CPU\(s\)'
  python3 -c 'import torch, transformers, sentence_transformers as s; print(torch.__version__, transformers.__version__, s.__version__)'
} 2>&1 | tee "$OUT/env.txt"
pack() { (cd "$OUT" && tar -cJf "$1.tar.xz" --exclude=serve-student "$1" && rm -rf "$1"); }
levers() {  # the serving levers within $1 seconds, packed
  timeout "$1" bash benchmarks/gpu_serve_levers.sh "$OUT/serve/serve-student" "$OUT/levers" | tee "$OUT/levers.log"
  pack levers
}
timeout $((deadline - SECONDS - 20)) python3 -m benchmarks.gpu_suite --only serve --out "$OUT/serve" 2>&1 \
  | tee "$OUT/serve.log" | grep -v '^\s*$' | tail -40
if [ "${2:-}" = levers ]; then
  levers $((deadline - SECONDS - 60))
elif [ "${2:-}" = samples ]; then
  timeout $((deadline - SECONDS - 60)) bash benchmarks/gpu_serve_samples.sh "$OUT/serve/serve-student" "$OUT/samples" \
    | tee "$OUT/samples.log"
  pack samples
  if [ $((deadline - SECONDS)) -gt 240 ]; then
    levers $((deadline - SECONDS - 100))
  fi
fi
pack serve
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/distill/serving/test_cuda_graphs.py \
  tests/distill/model/test_unpadding.py::test_varlen_is_chosen_on_cuda_in_half_precision 2>&1 | tail -5 \
  | tee "$OUT/cuda-tests.txt"
left=$((deadline - SECONDS - 15))
if [ "$left" -gt 60 ] && [ -z "${2:-}" ]; then
  timeout "$left" python3 -m benchmarks.gpu_suite --only '[teacher,train,rerank]' --out "$OUT/stages" 2>&1 \
    | tee "$OUT/stages.log" | tail -30
  pack stages
fi
echo "gpu_run: $SECONDS s"
