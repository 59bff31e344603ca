"""Which int8 graph of a student to ship: how each quantisation moves its ranking, and how fast each runs.

Every variant is quantised from the student's fused fp32 graph (``model.onnx``) and compared with it:

- ``ort-dynamic-per-tensor``, ``ort-dynamic`` (per output channel; ``int8_mode: dynamic``) on onnxruntime;
- ``ort-static-<method>`` (``int8_mode: static``, activations calibrated on DL21 + DL22 pairs by MinMax, Entropy or
  Percentile) on onnxruntime;
- ``ov-weights-g<N>`` (``int8_mode: weights``) on OpenVINO, its activations quantised at run time per ``N`` channels
  of each token, the other ops in :data:`~distill.serving.scorers.OPENVINO_INT8_PRECISION` (``N`` = 0: no int8
  matmuls, the weights only int8);
- ``ov-bf16``: no int8 at all, ``model.onnx`` on OpenVINO in bf16, for reference.

Quality is measured on the validation set of the quantisation choice, never on DL19 (the test set, on which
``distill export`` checks the chosen graph against its nDCG@10 bound): the 53 judged DL21 queries × their BM25
top-100 (5,300 pairs). For each variant: the mean over queries of the Spearman correlation of its scores with fp32's
(how faithfully it keeps the ranking), nDCG@10 and its change from fp32's, and the mean and max |Δscore|. Speed: the
p50 of reranking a DL19 query's 100 BM25 candidates (the first ``--time_queries`` queries, ``--repeats`` rounds after
a warm-up round, ``--threads`` threads, the batching of ``Reranker``).

    python -m benchmarks.int8 --student checkpoints/q-seg-cis_q-ranknet --threads 2
    # -> benchmarks/results/int8-<run>.json
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import RESULTS, phases
from benchmarks.phases import (
    BenchOptions,
    at_least,
    display_path,
    set_threads,
    slug,
    time_calls,
    write_result,
)
from distill.bench.measure import environment
from distill.core.batching import token_budget_batches
from distill.core.devices import STUDENT_BATCH_TOKENS
from distill.core.project_files import CANDIDATES, DL19, DL21, QRELS
from distill.core.run_folder import student_folder
from distill.core.schema import InputError
from distill.data.loaders import load_candidates
from distill.eval.fidelity import fidelity_per_query, mean_fidelity
from distill.eval.metrics import evaluate
from distill.eval.trec_runs import run_from_columns
from distill.export.quantize import CALIBRATION_METHODS, QUANTISED_OPS, Calibration, quantize_int8
from distill.serving.encoding import encode_pairs, load_tokenizer, model_max_length, pad_batch
from distill.serving.scorers import OnnxScorer, OpenVinoScorer, Scorer, SessionSettings

VALIDATION = (DL21 / CANDIDATES, DL21 / QRELS)
TIMED = DL19 / CANDIDATES
GROUP_SIZES = (0, 32, 64, 128, 384)


@dataclass(kw_only=True)
class Int8Choice(BenchOptions):
    """Which int8 graph of a student to ship: how each quantisation moves its ranking, and how fast each runs."""

    student: str
    """A training run, or an export folder with ``model.onnx``."""
    threads: int | None = 2
    validation_queries: int | None = None
    """The first judged DL21 queries whose rankings are compared (default all 53)."""
    time_queries: int = 3
    """DL19 queries timed (each with its 100 candidates)."""
    repeats: int = 3
    only: list[str] | None = None
    """The variants to run (default all)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "validation_queries", "time_queries", "repeats")


def ort_variant(name: str, source: Path, target: Path) -> None:
    """Write the onnxruntime variant ``name`` of ``source`` to ``target``."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if name == "ort-dynamic-per-tensor":
        extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
        quantize_dynamic(str(source), str(target), op_types_to_quantize=list(QUANTISED_OPS),
                         weight_type=QuantType.QInt8, per_channel=False, extra_options=extra)  # fmt: skip
    elif name == "ort-dynamic":
        quantize_int8(source, target, "dynamic")
    else:
        quantize_int8(source, target, "static", Calibration(method=name.removeprefix("ort-static-")))


def variants(folder: Path, tmp: Path, threads: int, openvino: bool) -> dict[str, Callable[[], Scorer]]:
    """Variant name -> a function that builds its graph (in ``tmp``) and loads it."""
    out: dict[str, Callable[[], Scorer]] = {}
    settings = SessionSettings(threads=threads)
    source = folder / "model.onnx"
    for name in ("ort-dynamic-per-tensor", "ort-dynamic", *(f"ort-static-{m}" for m in CALIBRATION_METHODS)):

        def ort(name: str = name) -> Scorer:
            ort_variant(name, source, tmp / f"{name}.onnx")
            return OnnxScorer(tmp / f"{name}.onnx", settings=settings)

        out[name] = ort
    if not openvino:
        return out
    from distill.serving.scorers import OPENVINO_INT8_PRECISION

    weights = tmp / "weights.onnx"
    for size in GROUP_SIZES:

        def ov(size: int = size) -> Scorer:
            if not weights.is_file():
                quantize_int8(source, weights, "weights")
            return OpenVinoScorer(weights, threads, OPENVINO_INT8_PRECISION, size)

        out[f"ov-weights-g{size}"] = ov
    out["ov-bf16"] = lambda: OpenVinoScorer(source, threads, "bfloat16")
    return out


class Pairs:
    """Candidate lists encoded with the student's tokenizer, in batches as ``Reranker`` makes them."""

    def __init__(self, folder: Path, source: Path, qrels: Path | None = None, queries: int | None = None) -> None:
        data = load_candidates(source, qrels=qrels)
        lists = [c for c in data.candidates if qrels is None or c.query.qid in data.qrels][:queries]
        self.qrels = data.qrels
        self.qids = [c.query.qid for c in lists for _ in c.passages]
        self.docids = [p.docid for c in lists for p in c.passages]
        tokenizer = load_tokenizer(folder)
        max_length = model_max_length(folder, tokenizer)
        self.calls: list[list[tuple[np.ndarray, dict[str, np.ndarray]]]] = []
        offset = 0
        for c in lists:
            encoded = encode_pairs(
                tokenizer, [c.query.text] * len(c.passages), [p.text for p in c.passages], max_length
            )
            batches = token_budget_batches(encoded.lengths, STUDENT_BATCH_TOKENS["cpu"])
            self.calls.append(
                [
                    (offset + np.asarray(rows), pad_batch(tokenizer, [encoded.features[i] for i in rows]))
                    for rows in batches
                ]
            )
            offset += len(c.passages)

    def scores(self, scorer: Scorer) -> np.ndarray:
        out = np.empty(len(self.qids))
        for call in self.calls:
            for rows, batch in call:
                out[rows] = scorer(batch)
        return out

    def p50_ms(self, scorer: Scorer, repeats: int) -> float:
        """The median over ``repeats`` rounds of the wall time of one list's batches, after a warm-up round."""
        calls = [partial(_score_batches, scorer, call) for call in self.calls]
        return 1000 * time_calls(calls, repeats)["p50_s"]

    def quality(self, values: np.ndarray, reference: np.ndarray) -> dict[str, float]:
        run = run_from_columns(self.qids, self.docids, values.tolist())
        fidelity = mean_fidelity(fidelity_per_query(run, run_from_columns(self.qids, self.docids, reference.tolist())))
        diff = np.abs(values - reference)
        return {
            "spearman_vs_fp32": fidelity["spearman"],
            "kendall_tau_vs_fp32": fidelity["kendall_tau"],
            "nDCG@10": evaluate(run, self.qrels, ["nDCG@10"])["nDCG@10"],
            "mean_abs_diff": float(diff.mean()),
            "max_abs_diff": float(diff.max()),
        }


def _score_batches(scorer: Scorer, call: list[tuple[np.ndarray, dict[str, np.ndarray]]]) -> None:
    for _, batch in call:
        scorer(batch)


def run(args: Int8Choice, invocation: dict[str, Any]) -> int:
    """Every variant's ranking against fp32's on the validation queries, and its p50; the result written."""
    import torch

    folder = student_folder(args.student)
    if not (folder / "model.onnx").is_file():
        raise InputError(f"{folder}: no model.onnx; run distill export first")
    set_threads(args.threads)
    validation = Pairs(folder, *VALIDATION, queries=args.validation_queries)
    timed = Pairs(folder, TIMED, queries=args.time_queries)
    fp32 = OnnxScorer(folder / "model.onnx", settings=SessionSettings(threads=args.threads))
    reference = validation.scores(fp32)
    results = {"fp32": {**validation.quality(reference, reference), "p50_ms": timed.p50_ms(fp32, args.repeats)}}
    print(f"{'variant':<24} {'Spearman':>9} {'nDCG@10':>8} {'Δ':>6} {'mean|Δs|':>9} {'p50 ms':>8}", flush=True)

    def show(name: str, r: dict[str, float]) -> None:
        delta = r["nDCG@10"] - results["fp32"]["nDCG@10"]
        print(
            f"{name:<24} {r['spearman_vs_fp32']:>9.4f} {r['nDCG@10']:>8.2f} {delta:>+6.2f} "
            f"{r['mean_abs_diff']:>9.4f} {r['p50_ms']:>8.1f}",
            flush=True,
        )

    show("fp32", results["fp32"])
    with tempfile.TemporaryDirectory() as tmp:
        for name, load in variants(folder, Path(tmp), args.threads, bool(importlib.util.find_spec("openvino"))).items():
            if args.only and name not in args.only:
                continue
            scorer = load()
            results[name] = {**validation.quality(validation.scores(scorer), reference)}
            results[name]["delta_nDCG@10"] = results[name]["nDCG@10"] - results["fp32"]["nDCG@10"]
            results[name]["p50_ms"] = timed.p50_ms(scorer, args.repeats)
            show(name, results[name])
            del scorer
    record: dict[str, Any] = {
        **invocation,
        "environment": environment(torch.device("cpu"), torch.float32),
        "student": str(folder),
        "validation": {"input": display_path(VALIDATION[0]), "pairs": len(validation.qids)},
        "timed": {"input": display_path(TIMED), "queries": args.time_queries},
        "threads": args.threads,
        "results": results,
    }
    run_name = folder.parent.name if folder.name in ("export", "hf") else folder.name
    write_result(record, args.out or RESULTS / f"int8-{slug(run_name)}.json")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.int8 ARGS``; its exit status."""
    return phases.main(Int8Choice, run, "benchmarks.int8", argv)


if __name__ == "__main__":
    sys.exit(main())
