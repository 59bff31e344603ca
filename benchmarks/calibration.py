"""The spread and fit of an export's normalised scores on a candidates file: calibrated against the plain sigmoid.

    python benchmarks/calibration.py --model checkpoints/fs-NAME/export \\
        --input data/trec-dl19/bm25_top100.json --qrels data/trec-dl19/qrels.txt \\
        --output benchmarks/results/calibration-dl19-bm25.json

Every candidate of every judged query is scored once (ONNX fp32); for both normalisations it reports the 5th and
95th percentiles, the number of distinct float32 values, the Brier score and the expected calibration error against
the judgments (an unjudged candidate not relevant), and whether the ranking equals the raw scores'. Nothing is chosen
here: the calibration was fitted at export on the student's validation queries.

``bounds`` says how far any calibrated map of these raw scores can spread: a monotone map sends the top 5% of raw
scores to the probabilities above its 95th percentile, and a calibrated one gives them, on average, the share of them
that is relevant. That share (and the bottom 5%'s) is the spread the student's ranking earns.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import numpy as np

from distill.data.loaders import load_candidates, load_qrels
from distill.eval.metrics import default_rel_level
from distill.serving.calibration import assess, sigmoid
from distill.serving.hardware import CpuFeatures
from distill.serving.reranker import Reranker


def spread(values: np.ndarray, relevant: np.ndarray, raw: np.ndarray, queries: list[slice]) -> dict[str, object]:
    quality = assess(values, relevant)
    same = all(
        np.array_equal(np.argsort(-raw[q], kind="stable"), np.argsort(-values[q].astype(np.float32), kind="stable"))
        for q in queries
    )
    return {
        "p05": quality.p05,
        "p95": quality.p95,
        "distinct_float32": int(np.unique(values.astype(np.float32)).size),
        "brier": quality.brier,
        "ece": quality.ece,
        "ranking_as_raw": same,
    }


def bounds(raw: np.ndarray, relevant: np.ndarray) -> dict[str, float]:
    """The share relevant among the pairs of the top 5% and of the bottom 5% of raw scores."""
    top, bottom = raw >= np.quantile(raw, 0.95), raw <= np.quantile(raw, 0.05)
    return {
        "top_5pct_relevant": round(float(relevant[top].mean()), 4),
        "bottom_5pct_relevant": round(float(relevant[bottom].mean()), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="an export folder with card.json's score_calibration")
    parser.add_argument("--input", required=True, help="a candidates file (rank_llm JSON)")
    parser.add_argument("--qrels", required=True)
    parser.add_argument("--output", required=True, help="the JSON record to write")
    args = parser.parse_args()
    reranker = Reranker.load(args.model, backend="onnx", interpolation=False)
    if reranker.calibration is None:
        raise SystemExit(f"{args.model}: card.json has no score_calibration: export it again")
    qrels = load_qrels(Path(args.qrels))
    level = default_rel_level(qrels)
    raw, relevant, queries = [], [], []
    for candidates in load_candidates(args.input).candidates:
        if candidates.query.qid not in qrels:
            continue
        start = len(raw)
        raw += reranker.score(candidates.query.text, [p.text for p in candidates.passages])
        judged = qrels[candidates.query.qid]
        relevant += [judged.get(p.docid, 0) >= level for p in candidates.passages]
        queries.append(slice(start, len(raw)))
    scores = np.array(raw, dtype=np.float32)
    judgments = np.array(relevant)
    record = {
        "command": f"python benchmarks/calibration.py --model {args.model} --input {args.input} --qrels {args.qrels} "
        f"--output {args.output}",
        "machine": f"{platform.processor() or platform.machine()}, {CpuFeatures.read().describe()}",
        "pairs": len(scores),
        "queries": len(queries),
        "relevant": int(judgments.sum()),
        "calibration": reranker.calibration.to_dict(),
        "bounds": bounds(scores, judgments),
        "calibrated": spread(reranker.calibration.probability(scores), judgments, scores, queries),
        "sigmoid": spread(sigmoid(scores), judgments, scores, queries),
    }
    Path(args.output).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: record[k] for k in ("pairs", "calibrated", "sigmoid")}, indent=2))


if __name__ == "__main__":
    main()
