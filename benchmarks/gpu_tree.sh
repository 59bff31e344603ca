#!/usr/bin/env bash
# The `device` tool sends the working tree to a lent GPU machine, at most 64 MiB of it, and the committed data is
# more. `out` moves what benchmarks/gpu_run.sh does not read (every teacher dataset but DL21's and DL22's BM25
# SmolLM2 labels, which the training stage reads; DL22's lists, DL21's top-100 lists, HotpotQA, the held-out runs)
# into a folder outside the checkout; `back` moves it back (`git checkout -- data benchmarks/results` also would).
#   bash benchmarks/gpu_tree.sh out && <the device call> && bash benchmarks/gpu_tree.sh back
set -euo pipefail
cd "$(dirname "$0")/.."
stash=${GPU_TREE_STASH:-/tmp/cis-distill-gpu-stash}
keep='^data/teacher/(dl21-bm25-smollm2|dl22-bm25-smollm2)$'
case "${1:-}" in
out)
  [ ! -e "$stash" ] || { echo "gpu_tree: $stash exists: move it back first" >&2; exit 2; }
  mkdir -p "$stash"
  for path in data/teacher/* data/trec-dl22 data/hotpotqa data/trec-dl21/*top100.json \
      benchmarks/results/quality/heldout; do
    [[ $path =~ $keep ]] && continue
    mkdir -p "$stash/$(dirname "$path")" && mv "$path" "$stash/$path"
  done
  echo "gpu_tree: $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes of tracked files left"
  ;;
back)
  cp -a "$stash/." . && rm -rf "$stash"
  git status --short -- data benchmarks/results
  ;;
*) echo "usage: bash benchmarks/gpu_tree.sh out|back" >&2; exit 2 ;;
esac
