"""How int8 dynamic quantisation moves a student's scores and ranking: one scale per tensor against one per output
channel (what ``distill export --int8`` writes), on every judged DL19 query's 100 BM25 candidates.

For each variant: nDCG@10 against PyTorch fp32's, and the mean and max |Δscore| over the 4,300 pairs.

    python benchmarks/int8.py --student checkpoints/minilm-dl19-all-cis
    # -> benchmarks/results/int8-<run>.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _common import RESULTS, invocation, slug

from distill.backend.parity import dl19_parity_set, ranking_ndcg10
from distill.bench.measure import environment
from distill.core.layout import student_folder
from distill.serving.encoding import encode_pairs, load_tokenizer, model_max_length, pad_batch
from distill.serving.scorers import OnnxScorer, Scorer, TorchScorer

VARIANTS = {"per_tensor": {"per_channel": False}, "per_channel": {"per_channel": True}}
BATCH_SIZE = 32


def scores_of(scorer: Scorer, tokenizer: Any, queries: list[str], passages: list[str], max_length: int) -> np.ndarray:
    """``[n]`` scores of the pairs, in batches of :data:`BATCH_SIZE`."""
    features = encode_pairs(tokenizer, queries, passages, max_length).features
    out = np.empty(len(features))
    for start in range(0, len(features), BATCH_SIZE):
        out[start : start + BATCH_SIZE] = scorer(pad_batch(tokenizer, features[start : start + BATCH_SIZE]))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--student", required=True, help="a training run, or an export or HF folder with model.onnx")
    p.add_argument("--out", type=Path, help="JSON result (default benchmarks/results/int8-<run>.json)")
    args = p.parse_args(argv)
    folder = student_folder(args.student)
    if not (folder / "model.onnx").is_file():
        p.error(f"{folder}: no model.onnx; run distill export first")
    tokenizer = load_tokenizer(folder)
    max_length = model_max_length(folder, tokenizer)
    pairs = dl19_parity_set().ranking
    qrels = dl19_parity_set().qrels
    queries, passages = [x.query for x in pairs], [x.passage for x in pairs]
    reference = scores_of(TorchScorer(folder), tokenizer, queries, passages, max_length)

    def ndcg(values: np.ndarray) -> float:
        return ranking_ndcg10(pairs, values, qrels)

    results = {"pytorch_fp32": {"nDCG@10": ndcg(reference)}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, options in VARIANTS.items():
            path = Path(tmp) / f"{name}.onnx"
            quantize_dynamic(str(folder / "model.onnx"), str(path), weight_type=QuantType.QInt8, **options)
            values = scores_of(OnnxScorer(path), tokenizer, queries, passages, max_length)
            diff = np.abs(values - reference)
            value = ndcg(values)
            results[name] = {
                "nDCG@10": value,
                "delta_nDCG@10": value - results["pytorch_fp32"]["nDCG@10"],
                "mean_abs_diff": float(diff.mean()),
                "max_abs_diff": float(diff.max()),
            }
    record = {
        **invocation("benchmarks/int8.py", argv),
        "environment": environment(torch.device("cpu"), torch.float32),
        "student": str(folder),
        "pairs": len(pairs),
        "queries": len({x.qid for x in pairs}),
        "results": results,
    }
    run_name = folder.parent.name if folder.name in ("export", "hf") else folder.name
    out = args.out or RESULTS / f"int8-{slug(run_name)}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    for name, r in results.items():
        extra = (
            ""
            if name == "pytorch_fp32"
            else (f"  Δ {r['delta_nDCG@10']:+.2f}  mean |Δscore| {r['mean_abs_diff']:.4f}  max {r['max_abs_diff']:.3f}")
        )
        print(f"{name:<13} nDCG@10 {r['nDCG@10']:6.2f}{extra}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
