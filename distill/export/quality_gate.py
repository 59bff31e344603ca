"""The export's quality gate: how much each lower-precision backend moves the student's ranking, measured once.

Every backend of :data:`GATE_BACKENDS` the export folder can run on this machine (named as in
:data:`~distill.serving.backends.NAMED_BACKENDS`, as ``backend="auto"`` and ``distill bench`` name them) reranks the
ranking set, each query's candidates scored once per backend through :class:`~distill.serving.reranker.Reranker`
(what serving runs), and is compared with PyTorch fp32 (:func:`judge`, by the rule :data:`RULE`):

- its nDCG@10 (x100) and delta, with a 95% interval of the delta from a paired bootstrap over the queries;
- its per-query Spearman with PyTorch fp32's scores, averaged over the queries.

The ranking set holds few queries (the student's 8 to 16 validation queries), on which one near-tie swapped at the
top of one query moves the mean nDCG@10 by a point. So the delta decides only where its interval does: a backend
fails when the interval lies wholly beyond ±:data:`~distill.export.parity_set.NDCG_BOUND` (quality moved) and passes
when it lies within; where the interval straddles the bound (too few queries to tell), the backend passes if it
orders the candidates as PyTorch fp32 does (Spearman at least :attr:`GateRule.spearman_floor`: what moved nDCG@10
was near-ties), and fails if it reorders them. card.json keeps the figures as ``quality_gate`` (see
:meth:`QualityGate.to_dict`), where ``backend="auto"`` picks among the backends whose ``passed`` is true.

The ranking set (:func:`validation_set`) is the student's held-out validation queries (its card's
``val_queries``), with every candidate of their first-stage lists (its teacher datasets' inputs), judged by the
training's qrels; never DL19, the project's test set.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from distill.core.project_files import CANDIDATES, DL19, DL21, shipped
from distill.core.schema import Candidates, InputError, MissingFileError, Qrels, RerankingData
from distill.core.student_card import StudentCard
from distill.data.teacher_data import TeacherDataset
from distill.eval.trec_runs import Run
from distill.export.parity_set import NDCG_BOUND, Pair, ParitySet
from distill.export.recorded_paths import resolve_path, shown_path
from distill.serving.backends import NAMED_BACKENDS
from distill.serving.hardware import CpuFeatures
from distill.serving.scorers import FORMAT_FILES

REFERENCE = "torch-fp32"
GATE_BACKENDS = ("openvino-int8", "onnx-int8", "openvino-bf16", "openvino-fp32", "onnx-fp32", "torchscript")
"""The CPU backends the gate measures (keys of :data:`~distill.serving.backends.NAMED_BACKENDS`): the lower
precisions, and the fp32 ones (held to 1e-4 by the parity check) so that the serving side has one place to look."""
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""The CPU flags (``/proc/cpuinfo``) of bf16 arithmetic, without which OpenVINO computes bf16 graphs in fp32."""
INT8_BACKENDS = {"openvino": "openvino-int8", "onnxruntime": "onnx-int8"}
"""The runtime an int8 graph was made for (:data:`~distill.export.quantize.INT8_RUNTIMES`) -> its gate backend."""
QRELS_FILE = "qrels.txt"
"""The qrels beside a candidates file, as the shipped data keep them (``data/trec-dl21/qrels.txt``)."""
NO_OPENVINO = "OpenVINO is not installed (pip install openvino)"
NO_BF16 = "this CPU has no bf16 (avx512_bf16/amx_bf16)"

log = logging.getLogger(__name__)


def int8_backend(runtime: str) -> str:
    """The gate's name of the int8 graph made for ``runtime`` (``openvino`` or ``onnxruntime``)."""
    return INT8_BACKENDS[runtime]


@dataclass(frozen=True)
class GateRule:
    """The gate's constants, in one place (card.json records them beside the figures: :meth:`to_dict`)."""

    bound: float = NDCG_BOUND
    """Max |ΔnDCG@10| (points, x100) of a backend against PyTorch fp32: the quality the gate protects. A backend
    fails when the whole interval of its mean ΔnDCG@10 lies beyond ±bound, and passes when it lies within."""
    spearman_floor: float = 0.999
    """The mean per-query Spearman with PyTorch fp32's scores at or above which a backend orders the candidates as
    PyTorch fp32 does, so that an interval straddling the bound is near-ties moved, not a ranking changed.

    Over a query's 100 candidates, 1 - Spearman = 6 Σd² / (n(n² - 1)): 0.999 allows rank shifts d of 1.3 places
    (root mean square), where reversing a query's top 10 alone costs 0.002: a backend that moves only near-ties stays
    above it, one that reorders candidates falls below (the model cards' precision tables show both)."""
    confidence: float = 0.95
    """The interval's coverage: the 2.5th to the 97.5th percentile of the resampled mean deltas."""
    resamples: int = 10_000
    """Bootstrap resamples of the queries: the interval's ends move by under 0.2 percentile points from one seed to
    another (sqrt(0.025 x 0.975 / 10,000) = 0.0016), in milliseconds for 16 queries."""
    seed: int = 0
    """The resampling's seed: the same runs give the same interval and verdict on every export."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "bound": self.bound,
            "spearman_floor": self.spearman_floor,
            "confidence": self.confidence,
            "resamples": self.resamples,
            "seed": self.seed,
        }


RULE = GateRule()
"""The rule every export's gate applies."""

VERDICTS = {
    "within": "passed: the interval of ΔnDCG@10 lies within ±bound (quality held)",
    "beyond": "failed: the interval of ΔnDCG@10 lies wholly beyond ±bound (quality moved)",
    "same_order": "passed: the interval straddles the bound (too few queries to tell) and Spearman >= the floor "
    "(the backend orders candidates as the reference does: only near-ties moved)",
    "reordered": "failed: the interval straddles the bound and Spearman < the floor (the backend reorders them)",
    "unordered": "failed: no query's ordering could be compared (one candidate each, or every candidate of a query "
    "scored alike): Spearman is undefined",
}
"""What decided a backend's verdict (``verdict`` in card.json) -> what it means."""
PASSING = frozenset({"within", "same_order"})


@dataclass
class BackendQuality:
    """One backend's ranking on the ranking set against PyTorch fp32's (see :func:`judge`)."""

    ndcg10: float | None = None
    """nDCG@10 x100."""
    delta: float | None = None
    """``ndcg10`` minus PyTorch fp32's, in points: the mean over queries of the per-query deltas."""
    spearman: float | None = None
    """Spearman of its scores with PyTorch fp32's, per query, averaged over queries."""
    passed: bool = False
    """Whether the gate passed it (the verdict is in :data:`PASSING`): what ``backend="auto"`` reads."""
    not_checked: str | None = None
    """Why it could not be measured here (then ``passed`` is False)."""
    interval: tuple[float, float] | None = None
    """The paired bootstrap's interval of ``delta`` over the queries (:attr:`GateRule.confidence`)."""
    verdict: str | None = None
    """What decided ``passed``: a key of :data:`VERDICTS`."""

    def to_dict(self) -> dict[str, Any]:
        if self.not_checked is not None:
            return {"passed": False, "not_checked": self.not_checked}
        return {
            "ndcg10": round(self.ndcg10, 4),
            "delta": round(self.delta, 4),
            "interval": [round(end, 4) for end in self.interval],
            "spearman": round(self.spearman, 5) if math.isfinite(self.spearman) else None,  # strict JSON
            "verdict": self.verdict,
            "passed": self.passed,
        }


@dataclass
class QualityGate:
    """The gate's figures: card.json's ``quality_gate``."""

    pairs: str
    """One line: which queries and candidates were ranked."""
    queries: int
    reference_ndcg10: float
    """PyTorch fp32's nDCG@10 x100."""
    backends: dict[str, BackendQuality] = field(default_factory=dict)
    rule: GateRule = RULE
    reference: Run = field(default_factory=dict, repr=False)
    """PyTorch fp32's raw scores of the ranked pairs, qid -> docid -> score (not in card.json: the score
    calibration is fitted on them, :func:`distill.export.exporter.fit_score_calibration`)."""

    @property
    def bound(self) -> float:
        """Max |ΔnDCG@10| in points."""
        return self.rule.bound

    def to_dict(self) -> dict[str, Any]:
        """``{"pairs", "bound", "spearman_floor", "confidence", "resamples", "seed", "reference": {"backend",
        "ndcg10"}, "backends": {name: {"ndcg10", "delta", "interval", "spearman", "verdict", "passed"} or
        {"passed": false, "not_checked"}}}``."""
        return {
            "pairs": self.pairs,
            **self.rule.to_dict(),
            "reference": {"backend": REFERENCE, "ndcg10": round(self.reference_ndcg10, 4)},
            "backends": {name: quality.to_dict() for name, quality in self.backends.items()},
        }

    def format(self) -> str:
        """A table of the backends' figures and what decided each."""
        rule = self.rule
        lines = [
            f"quality gate ({self.pairs}): {REFERENCE} nDCG@10 {self.reference_ndcg10:.2f}; a backend fails when the "
            f"{rule.confidence:.0%} interval of its ΔnDCG@10 (paired bootstrap over the queries) lies beyond "
            f"±{rule.bound:g} points, or straddles it at a Spearman below {rule.spearman_floor:g}",
            f"  {'backend':<14} {'nDCG@10':>8} {'Δ':>7} {'interval':>16} {'Spearman':>9}  passed",
        ]
        for name, q in self.backends.items():
            if q.not_checked is not None:
                lines.append(f"  {name:<14} {'-':>8} {'-':>7} {'-':>16} {'-':>9}  no (not checked: {q.not_checked})")
            else:
                low, high = q.interval
                interval = f"[{low:+.2f}, {high:+.2f}]"
                passed = f"{'yes' if q.passed else 'no'} ({q.verdict.replace('_', ' ')})"
                lines.append(
                    f"  {name:<14} {q.ndcg10:>8.2f} {q.delta:>+7.2f} {interval:>16} {q.spearman:>9.4f}  {passed}"
                )
        return "\n".join(lines)


def judge(reference: Run, run: Run, qrels: Qrels, rule: GateRule = RULE) -> BackendQuality:
    """The gate's verdict on a backend's ``run`` against the ``reference`` run (PyTorch fp32's), on the queries
    both rank that ``qrels`` judge (see the module and :data:`VERDICTS`).

    Raises:
        ValueError: no query of the runs is judged.
    """
    from distill.eval.fidelity import fidelity_per_query, mean_fidelity
    from distill.eval.metrics import evaluate_per_query

    ours = evaluate_per_query(run, qrels, ["nDCG@10"])["nDCG@10"]
    theirs = evaluate_per_query(reference, qrels, ["nDCG@10"])["nDCG@10"]
    queries = sorted(ours.keys() & theirs.keys())
    if not queries:
        raise ValueError("no query that both runs rank is judged")
    deltas = np.array([ours[qid] - theirs[qid] for qid in queries])
    ndcg = float(np.mean([ours[qid] for qid in queries]))
    low, high = delta_interval(deltas, rule)
    spearman = mean_fidelity(fidelity_per_query(run, reference))["spearman"]
    if not math.isfinite(spearman):  # no query with two candidates scored apart: no ordering was compared
        verdict = "unordered"
    elif low > rule.bound or high < -rule.bound:
        verdict = "beyond"
    elif -rule.bound <= low and high <= rule.bound:
        verdict = "within"
    elif spearman >= rule.spearman_floor:
        verdict = "same_order"
    else:
        verdict = "reordered"
    return BackendQuality(
        ndcg, float(deltas.mean()), spearman, verdict in PASSING, interval=(low, high), verdict=verdict
    )


def delta_interval(deltas: np.ndarray, rule: GateRule = RULE) -> tuple[float, float]:
    """The paired bootstrap's interval of the mean of the per-query ``deltas``: the queries resampled with
    replacement :attr:`GateRule.resamples` times (seeded), each resample's mean delta, and the central
    :attr:`GateRule.confidence` of those means."""
    rng = np.random.default_rng(rule.seed)
    n = len(deltas)
    chunk = max(1, 1_000_000 // n)  # resampled indices held at once: a few MB whatever the number of queries
    means = np.concatenate(
        [
            deltas[rng.integers(0, n, size=(min(chunk, rule.resamples - start), n))].mean(axis=1)
            for start in range(0, rule.resamples, chunk)
        ]
    )
    tail = (1 - rule.confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def gate_candidates(folder: Path, int8_runtime: str) -> dict[str, str | None]:
    """The backends of :data:`GATE_BACKENDS` whose files ``folder`` has -> None, or why this machine cannot run one.

    The int8 graph counts for the runtime it was made for only (``int8_runtime``).
    """
    has_onnx, has_int8 = (folder / FORMAT_FILES["onnx"]).is_file(), (folder / FORMAT_FILES["onnx-int8"]).is_file()
    openvino = importlib.util.find_spec("openvino") is not None
    present = {
        "openvino-int8": has_int8 and int8_runtime == "openvino",
        "onnx-int8": has_int8 and int8_runtime == "onnxruntime",
        "openvino-bf16": has_onnx,
        "openvino-fp32": has_onnx,
        "onnx-fp32": has_onnx,
        "torchscript": (folder / FORMAT_FILES["torchscript"]).is_file(),
    }
    reasons: dict[str, str | None] = {}
    for name, there in present.items():
        if not there:
            continue
        if name.startswith("openvino") and not openvino:
            reasons[name] = NO_OPENVINO
        elif name == "openvino-bf16" and not cpu_has_bf16():
            reasons[name] = NO_BF16
        else:
            reasons[name] = None
    return reasons


def cpu_has_bf16() -> bool:
    """Whether this CPU computes in bf16 (AVX512-BF16 or AMX; :class:`~distill.serving.hardware.CpuFeatures`)."""
    return bool(BF16_FLAGS & CpuFeatures.read().flags)


def measure_quality_gate(folder: Path, ranking: ParitySet, int8_runtime: str = "onnxruntime") -> QualityGate | None:
    """Rank ``ranking.ranking`` (judged by ``ranking.qrels``) with PyTorch fp32 and every backend
    :func:`gate_candidates` finds in the export folder ``folder``; None when there is nothing to rank."""
    if not ranking.ranking:
        return None
    from distill.eval.metrics import evaluate

    lists = list(_by_query(ranking.ranking))
    reference = _run(folder, REFERENCE, lists)
    reference_ndcg = evaluate(reference, ranking.qrels, ["nDCG@10"])["nDCG@10"]
    gate = QualityGate(ranking.ranking_source, len(lists), reference_ndcg, reference=reference)
    for name, reason in gate_candidates(folder, int8_runtime).items():
        if reason is not None:
            gate.backends[name] = BackendQuality(not_checked=reason)
            continue
        gate.backends[name] = judge(reference, _run(folder, name, lists), ranking.qrels, gate.rule)
    return gate


def _by_query(pairs: list[Pair]) -> Iterator[list[Pair]]:
    """The consecutive pairs of each query."""
    start = 0
    for i in range(1, len(pairs) + 1):
        if i == len(pairs) or pairs[i].qid != pairs[start].qid:
            yield pairs[start:i]
            start = i


def _run(folder: Path, backend: str, lists: list[list[Pair]]) -> dict[str, dict[str, float]]:
    """The run of the named ``backend`` (:data:`REFERENCE` or one of :data:`GATE_BACKENDS`) over the lists."""
    from distill.serving.reranker import Reranker

    kind, dtype = NAMED_BACKENDS[backend]
    reranker = Reranker.load(folder, backend=kind, dtype=dtype, interpolation=False)
    run: dict[str, dict[str, float]] = {}
    for pairs in lists:
        scores = reranker.score(pairs[0].query, [p.passage for p in pairs])
        run[pairs[0].qid] = {p.docid: score for p, score in zip(pairs, scores, strict=True)}
    return run


def validation_set(folder: Path, input: str | None = None, qrels: str | list[str] | None = None) -> ParitySet:
    """The ranking set of the student in ``folder`` (no score pairs): every candidate of the judged queries of

    - ``input`` (with ``qrels``), where given;
    - else the student card's validation queries (``val_queries``) in its teacher datasets' inputs, judged by
      ``qrels`` or the card's (the training's ``data.qrels``);
    - else (a student without a card) the shipped TREC DL21 queries.

    Where no qrels are named, an input's are the ``qrels.txt`` beside it, else those it carries (BEIR,
    ir_datasets).
    Relative paths are taken from the working folder, then from the project's folder (where the shipped data are).

    Raises:
        InputError: no judged query to rank; MissingFileError: an input named is not there.
    """
    card = StudentCard.find(folder)
    if input is not None:
        if Path(input).resolve().is_relative_to(DL19.resolve()):
            log.warning(
                "validation_input %s: TREC DL19, this project's test year: a gate (and a calibration) fitted on it "
                "makes its DL19 figures no test; give held-out queries of another year",
                shown_path(input),
            )
        data = _load(input, qrels)
        judged = [c for c in data.candidates if c.query.qid in data.qrels]
        where = f"judged queries of {shown_path(input)}"
        if not judged and qrels:
            given = ", ".join(map(shown_path, [qrels] if isinstance(qrels, str) else qrels))
            raise InputError(
                f"validation_qrels {given} judge none of the {len(data.candidates)} queries of validation_input "
                f"{shown_path(input)}"
            )
    elif card is None:
        data = _load(shipped(DL21 / CANDIDATES, "validation_input"), None)
        judged = [c for c in data.candidates if c.query.qid in data.qrels]
        where = "judged TREC DL21 queries (data/trec-dl21, the student has no card)"
    else:
        inputs = _teacher_inputs(folder, card)
        wanted = set(card.val_queries)
        parts = [_load(path, qrels or card.qrels, *texts) for path, texts in inputs.items()]
        data = RerankingData.union(parts) if parts else RerankingData("", [], {})
        judged = [c for c in data.candidates if c.query.qid in wanted and c.query.qid in data.qrels]
        if not judged:
            raise InputError(
                f"{folder}: none of the student card's {len(wanted)} validation queries is judged in its teacher "
                f"data's inputs ({', '.join(map(shown_path, inputs)) or 'none'}): give export's validation_input "
                "(held-out candidates with qrels) and validation_qrels"
            )
        shown = ", ".join(shown_path(path) for path in inputs)
        where = f"of the student card's {len(wanted)} validation queries, judged in {shown}"
    if not judged:
        raise InputError(f"{data.source}: no judged queries to rank (give validation_qrels)")
    pairs = _pairs(judged)
    source = f"{len(judged)} {where}; {len(pairs)} pairs, every candidate"
    return ParitySet([], pairs, {c.query.qid: data.qrels[c.query.qid] for c in judged}, source)


def _pairs(lists: list[Candidates]) -> list[Pair]:
    return [Pair(c.query.qid, p.docid, c.query.text, p.text) for c in lists for p in c.passages]


def _teacher_inputs(folder: Path, card: StudentCard) -> dict[str, tuple[str | None, str | None, str | None]]:
    """The candidate inputs of the card's teacher datasets, in order, each once, with the queries and corpus a TREC
    run was read with and the run a BEIR folder's candidates were read from (None for other inputs)."""
    inputs: dict[str, tuple[str | None, str | None, str | None]] = {}
    for path in card.teacher_data:
        found = resolve_path(path)
        if found is None or not TeacherDataset.is_complete(found):
            raise MissingFileError(
                f"{folder}: the student's teacher data {path} is not here: give export's validation_input "
                "(its held-out candidates) and validation_qrels"
            )
        metadata = TeacherDataset.open(found).metadata
        for given in metadata.input:
            inputs.setdefault(given, (metadata.queries, metadata.corpus, metadata.run))
    return inputs


def _load(
    input: str,
    qrels: str | list[str] | None,
    queries: str | None = None,
    corpus: str | None = None,
    run: str | None = None,
) -> RerankingData:
    from distill.data.loaders import load_candidates
    from distill.data.loaders.irds import is_irds
    from distill.data.loaders.qrels import qrels_sources

    given = None if qrels is None else [_qrels_path(q) for q in qrels_sources(qrels)]
    if is_irds(input):
        return load_candidates(input, qrels=given)
    path = resolve_path(input)
    if path is None:
        raise MissingFileError(f"{input}: no such candidates file or folder")
    beside = path.parent / QRELS_FILE if path.is_file() else None
    given_files = (("queries", queries), ("corpus", corpus), ("run", run))
    texts = {k: resolve_path(v) or v for k, v in given_files if v is not None}
    return load_candidates(path, qrels=given or (beside if beside and beside.is_file() else None), **texts)


def _qrels_path(qrels: str) -> str | Path:
    """A qrels file named relative to the working or the project's folder, found; an ``irds:`` id, as it is."""
    from distill.data.loaders.irds import is_irds

    if is_irds(qrels):
        return qrels
    path = resolve_path(qrels)
    if path is None:
        raise MissingFileError(f"{qrels}: no such qrels file")
    return path
