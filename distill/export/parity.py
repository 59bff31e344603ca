"""The export-time parity check: every exported file must score real pairs as the PyTorch model does.

Pairs are scored at each batch size of :data:`BATCH_SIZES` (consecutive pairs of mixed lengths, so
batches are padded) and at two max lengths: :data:`SHORT_MAX_LENGTH` (most pairs truncated) and the
model's max (a long pair, the first query's top passages joined, passes 512 tokens; a model that takes longer
pairs is checked up to that pair's length). Bounds: max |Δscore| against PyTorch fp32 of
:data:`SCORE_BOUNDS`, which an export must hold. The int8 graph, whose scores move more, is held to the
nDCG@10 difference of :data:`NDCG_BOUND` on the ranking set instead: that is the quality gate's verdict
(:mod:`distill.export.quality_gate`, by default on every candidate of the student's held-out validation queries,
never DL19, the test set), recorded here and in card.json. A graph outside it is kept, marked as failed, and so
never chosen by ``backend="auto"``; an explicit ``dtype="int8"`` still runs it. A copy of a format's file where other
runtimes read it (``onnx/model.onnx``, :data:`~distill.serving.scorers.FORMAT_COPIES`) must be that file, byte for
byte, so the same figures hold for it.
"""

from __future__ import annotations

import filecmp
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from distill.core.schema import UserError
from distill.export.parity_set import NDCG_BOUND, Pair, ParitySet, dl19_parity_set
from distill.export.quality_gate import QualityGate, int8_backend
from distill.serving.encoding import encode_pairs, load_tokenizer, model_max_length, pad_batch
from distill.serving.scorers import (
    FORMAT_COPIES,
    FORMAT_FILES,
    GraphNotRunnable,
    OnnxScorer,
    Scorer,
    TorchScorer,
    load_scorer,
)

BATCH_SIZES = (1, 7, 32)
SHORT_MAX_LENGTH = 32
SCORE_BOUNDS = {"onnx": 1e-4, "torchscript": 1e-4, "onnx-fp16": 2e-2}
"""Max |Δscore| of each format against PyTorch fp32."""


class ParityError(UserError):
    """Exported files break their bounds. The message names each format, its bound and its worst pair."""

    def __init__(self, where: str, failures: list[str], results: list[FormatParity]) -> None:
        super().__init__(f"{where}: parity check failed:\n  " + "\n  ".join(failures))
        self.failures = failures
        self.results = results


@dataclass
class FormatParity:
    """How one exported format compares with PyTorch fp32 on the parity pairs."""

    format: str
    device: str | None = "cpu"
    """Where it was checked; None if nowhere."""
    runtime: str | None = None
    """What ran an ONNX graph: ``onnxruntime`` or ``openvino``; None for TorchScript."""
    bound: float | None = None
    """Max |Δscore| allowed; None for int8 (bounded by nDCG@10 instead)."""
    max_abs_diff: float | None = None
    """Max |Δscore| over all pairs and cases (NaN if a score is NaN)."""
    by_case: dict[str, float] = field(default_factory=dict)
    """``batch=B max_length=L`` -> max |Δscore|."""
    worst: dict[str, Any] | None = None
    """The case and pair of ``max_abs_diff``, with both scores."""
    ndcg10: dict[str, float] | None = None
    """int8: nDCG@10 x100 of ``pytorch`` and of this format on the ranking set (from the quality gate), their
    ``delta``, the ``bound`` and the number of ``queries``."""
    not_checked: str | None = None
    """What could not be checked here, and why."""

    def record(self, case: str, reference: np.ndarray, scores: np.ndarray, pairs: list[Pair]) -> None:
        diff = np.abs(scores.astype(np.float64) - reference)
        i = int(np.argmax(diff))  # the first NaN, if any
        value = float(diff[i])
        self.by_case[case] = value
        if self.max_abs_diff is None or not value <= self.max_abs_diff:
            self.max_abs_diff = value
            pair = pairs[i]
            self.worst = {
                "case": case,
                "qid": pair.qid,
                "docid": pair.docid if pair.docid is not None else "(long pair)",
                "query": pair.query,
                "passage": pair.passage[:80],
                "pytorch": float(reference[i]),
                self.format: float(scores[i]),
            }

    def failure(self) -> str | None:
        """Why this format breaks its score bound (NaN scores break any), naming the worst pair; None when it holds.
        The int8 graph's nDCG@10 bound is the quality gate's verdict, not a failure of the export."""
        bound = math.inf if self.bound is None else self.bound
        if self.max_abs_diff is not None and not self.max_abs_diff <= bound:
            w = self.worst
            return (
                f"{self.format}: max |Δscore| {self.max_abs_diff:.3g} > bound {bound:g}, worst at {w['case']}: "
                f"query {w['qid']} {w['query']!r}, passage {w['docid']} {w['passage']!r}... "
                f"(PyTorch {w['pytorch']:.6g}, {self.format} {w[self.format]:.6g})"
            )
        return None


def verify_export(
    folder: str | Path,
    parity: ParitySet | None = None,
    int8_runtime: str = "onnxruntime",
    gate: QualityGate | None = None,
) -> list[FormatParity]:
    """Compare each exported file in ``folder`` (see :data:`FORMAT_FILES`) with the folder's own PyTorch model.

    Everything runs on the CPU, on onnxruntime, but the int8 graph runs on ``int8_runtime`` (``openvino`` for the
    graph of ``int8_mode: weights``), and the fp16 graph, where onnxruntime cannot run it on the CPU, runs on CUDA
    where there is one, and is otherwise recorded as not checked. The int8 graph's nDCG@10 bound reads its entry
    in ``gate`` (:func:`~distill.export.quality_gate.measure_quality_gate` on ``parity``'s ranking set; without
    one, the bound is recorded as not checked).

    Raises:
        ParityError: a format breaks its bound; the message names each one, the bound and its worst pair.
    """

    folder = Path(folder)
    parity = parity or dl19_parity_set()
    tokenizer = load_tokenizer(folder)
    reference = TorchScorer(folder)
    results: dict[str, FormatParity] = {}
    scorers: dict[str, Scorer] = {}
    for fmt, file in FORMAT_FILES.items():
        if (folder / file).is_file():
            runtime = None if fmt == "torchscript" else int8_runtime if fmt == "onnx-int8" else "onnxruntime"
            results[fmt] = FormatParity(fmt, bound=SCORE_BOUNDS.get(fmt), runtime=runtime)
            scorer = _open(folder, results[fmt])
            if scorer is not None:
                scorers[fmt] = scorer
    max_length = model_max_length(folder, tokenizer)
    for length in (SHORT_MAX_LENGTH, max_length):
        for size in BATCH_SIZES:
            scores = _score(tokenizer, {"pytorch": reference, **scorers}, parity.pairs, length, size)
            for fmt in scorers:
                results[fmt].record(f"batch={size} max_length={length}", scores["pytorch"], scores[fmt], parity.pairs)
    if "onnx-int8" in scorers:
        _record_ranking(results["onnx-int8"], gate)
    failures = [reason for r in results.values() if (reason := r.failure())] + _copy_failures(folder)
    if failures:
        raise ParityError(str(folder), failures, list(results.values()))
    return list(results.values())


def _copy_failures(folder: Path) -> list[str]:
    """Each copy of :data:`FORMAT_COPIES` in ``folder`` that is not its format's file, byte for byte."""
    failures = []
    for copy, fmt in FORMAT_COPIES.items():
        source = folder / FORMAT_FILES[fmt]
        if (folder / copy).exists() and not (source.is_file() and filecmp.cmp(source, folder / copy, shallow=False)):
            failures.append(f"{copy}: not the same bytes as {FORMAT_FILES[fmt]}, the file checked above")
    return failures


def _open(folder: Path, result: FormatParity) -> Scorer | None:
    """The format's scorer on the CPU; the fp16 graph on CUDA if the CPU cannot run it (None if nothing can)."""
    if result.format != "onnx-fp16":
        return load_scorer(folder, result.format, runtime=result.runtime or "onnxruntime")
    import onnxruntime as ort

    path = folder / FORMAT_FILES["onnx-fp16"]
    try:
        return OnnxScorer(path)
    except GraphNotRunnable as e:
        reason = f"onnxruntime cannot run it on the CPU ({e.reason})"
    if "CUDAExecutionProvider" in ort.get_available_providers():
        result.device, result.not_checked = "cuda", f"not checked on CPU: {reason}; checked on CUDA"
        return OnnxScorer(path, "cuda")
    result.device, result.not_checked = None, f"not checked: {reason}, and there is no CUDA provider"
    return None


def _score(
    tokenizer: Any, scorers: dict[str, Scorer], pairs: list[Pair], max_length: int, batch_size: int
) -> dict[str, np.ndarray]:
    """Each scorer's ``[len(pairs)]`` scores, in consecutive batches of ``batch_size`` (padded, mixed lengths)."""
    features = encode_pairs(tokenizer, [p.query for p in pairs], [p.passage for p in pairs], max_length).features
    scores = {name: np.empty(len(features)) for name in scorers}
    for start in range(0, len(features), batch_size):
        batch = pad_batch(tokenizer, features[start : start + batch_size])
        for name, scorer in scorers.items():
            scores[name][start : start + batch_size] = scorer(batch)
    return scores


def _record_ranking(result: FormatParity, gate: QualityGate | None) -> None:
    """The int8 graph's nDCG@10 and PyTorch's on the ranking set, from the quality gate's entry for its runtime."""
    quality = gate.backends.get(int8_backend(result.runtime or "onnxruntime")) if gate else None
    if gate is None or quality is None or quality.ndcg10 is None:
        reason = quality.not_checked if quality else "no judged validation queries to rank"
        result.not_checked = f"nDCG@10 not checked: {reason}"
        return
    result.ndcg10 = {
        "pytorch": gate.reference_ndcg10,
        result.format: quality.ndcg10,
        "delta": quality.delta,
        "bound": NDCG_BOUND,
        "queries": gate.queries,
        "passed": quality.passed,
    }
