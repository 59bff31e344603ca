"""How int8 quantisation of the fused graph (``model.onnx``) moves a student's scores and ranking, on every judged
DL19 query's 100 BM25 candidates: dynamic with one weight scale per tensor or per output channel, and static (per
channel, activations calibrated on DL21 + DL22 pairs) with each calibration method. ``distill export --int8``
writes one of them (``int8_mode``: static MinMax or dynamic per channel).

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
from distill.backend.quantize import CALIBRATION_METHODS, QUANTISED_OPS, Calibration, quantize_int8
from distill.bench.measure import environment
from distill.core.layout import student_folder
from distill.serving.encoding import encode_pairs, load_tokenizer, model_max_length, pad_batch
from distill.serving.scorers import OnnxScorer, Scorer, TorchScorer

BATCH_SIZE = 32


def scores_of(scorer: Scorer, tokenizer: Any, queries: list[str], passages: list[str], max_length: int) -> np.ndarray:
    """``[n]`` scores of the pairs, in batches of :data:`BATCH_SIZE`."""
    features = encode_pairs(tokenizer, queries, passages, max_length).features
    out = np.empty(len(features))
    for start in range(0, len(features), BATCH_SIZE):
        out[start : start + BATCH_SIZE] = scorer(pad_batch(tokenizer, features[start : start + BATCH_SIZE]))
    return out


def write_variant(name: str, source: Path, target: Path) -> None:
    """``dynamic_per_tensor``, ``dynamic_per_channel`` (the export's dynamic mode) or ``static_<method>``."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if name == "dynamic_per_tensor":
        extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
        ops = list(QUANTISED_OPS)
        quantize_dynamic(str(source), str(target), op_types_to_quantize=ops, weight_type=QuantType.QInt8,
                         per_channel=False, extra_options=extra)  # fmt: skip
    elif name == "dynamic_per_channel":
        quantize_int8(source, target, "dynamic")
    else:
        quantize_int8(source, target, "static", Calibration(method=name.removeprefix("static_")))


VARIANTS = ("dynamic_per_tensor", "dynamic_per_channel", *(f"static_{m}" for m in CALIBRATION_METHODS))


def main(argv: Sequence[str] | None = None) -> int:
    import torch

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
        for name in VARIANTS:
            path = Path(tmp) / f"{name}.onnx"
            write_variant(name, folder / "model.onnx", path)
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
        print(f"{name:<22} nDCG@10 {r['nDCG@10']:6.2f}{extra}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
