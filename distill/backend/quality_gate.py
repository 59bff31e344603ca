"""The export's quality gate: how much each lower-precision backend moves the student's ranking, measured once.

Every backend of :data:`GATE_BACKENDS` the export folder can run on this machine (named as in
:data:`~distill.serving.backends.NAMED_BACKENDS`, as ``backend="auto"`` and ``distill bench`` name them) reranks the
ranking set, each query's candidates scored once per backend through :class:`~distill.serving.reranker.Reranker`
(what serving runs), and is compared with PyTorch fp32: its nDCG@10 (x100) and delta, and its per-query Spearman
with PyTorch fp32's scores. A backend within :data:`~distill.backend.parity.NDCG_BOUND` passed; card.json keeps the
figures as ``quality_gate`` (see :meth:`QualityGate.to_dict`), where ``backend="auto"`` picks among those that passed.

The ranking set (:func:`validation_set`) is the student's held-out validation queries (its card's
``val_queries``), with every candidate of their first-stage lists (its teacher datasets' inputs), judged by the
training's qrels; never DL19, the project's test set.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distill.backend.parity import NDCG_BOUND, Pair, ParitySet
from distill.backend.paths import REPO, resolve_path, shown_path
from distill.core.schema import Candidates, InputError, MissingFileError, RerankingData
from distill.core.student_card import StudentCard
from distill.core.teacher_data import TeacherDataset
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
"""The runtime an int8 graph was made for (:data:`~distill.backend.quantize.INT8_RUNTIMES`) -> its gate backend."""
DL21 = REPO / "data" / "trec-dl21"
"""The shipped TREC DL21 BM25 candidates and qrels: the ranking set of a student without a card."""
QRELS_FILE = "qrels.txt"
"""The qrels beside a candidates file, as the shipped data keep them (``data/trec-dl21/qrels.txt``)."""
NO_OPENVINO = "OpenVINO is not installed (pip install 'cis-distill[openvino]')"
NO_BF16 = "this CPU has no bf16 (avx512_bf16/amx_bf16)"


def int8_backend(runtime: str) -> str:
    """The gate's name of the int8 graph made for ``runtime`` (``openvino`` or ``onnxruntime``)."""
    return INT8_BACKENDS[runtime]


@dataclass
class BackendQuality:
    """One backend's ranking on the ranking set against PyTorch fp32's."""

    ndcg10: float | None = None
    """nDCG@10 x100."""
    delta: float | None = None
    """``ndcg10`` minus PyTorch fp32's, in points."""
    spearman: float | None = None
    """Spearman of its scores with PyTorch fp32's, per query, averaged over queries."""
    passed: bool = False
    """``|delta| <=`` the bound."""
    not_checked: str | None = None
    """Why it could not be measured here (then ``passed`` is False)."""

    def to_dict(self) -> dict[str, Any]:
        if self.not_checked is not None:
            return {"passed": False, "not_checked": self.not_checked}
        return {
            "ndcg10": round(self.ndcg10, 4),
            "delta": round(self.delta, 4),
            "spearman": round(self.spearman, 5),
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
    bound: float = NDCG_BOUND
    """Max |ΔnDCG@10| in points."""

    def to_dict(self) -> dict[str, Any]:
        """``{"pairs", "bound", "reference": {"backend", "ndcg10"}, "backends": {name: {"ndcg10", "delta",
        "spearman", "passed"} or {"passed": false, "not_checked"}}}``."""
        return {
            "pairs": self.pairs,
            "bound": self.bound,
            "reference": {"backend": REFERENCE, "ndcg10": round(self.reference_ndcg10, 4)},
            "backends": {name: quality.to_dict() for name, quality in self.backends.items()},
        }

    def format(self) -> str:
        """A table of the backends' figures."""
        lines = [
            f"quality gate ({self.pairs}): bound |ΔnDCG@10| <= {self.bound:g} points, "
            f"{REFERENCE} nDCG@10 {self.reference_ndcg10:.2f}",
            f"  {'backend':<14} {'nDCG@10':>8} {'Δ':>7} {'Spearman':>9}  passed",
        ]
        for name, q in self.backends.items():
            if q.not_checked is not None:
                lines.append(f"  {name:<14} {'-':>8} {'-':>7} {'-':>9}  no (not checked: {q.not_checked})")
            else:
                passed = "yes" if q.passed else "no"
                lines.append(f"  {name:<14} {q.ndcg10:>8.2f} {q.delta:>+7.2f} {q.spearman:>9.4f}  {passed}")
        return "\n".join(lines)


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
    from distill.core.fidelity import fidelity_per_query, mean_fidelity
    from distill.core.metrics import evaluate

    lists = list(_by_query(ranking.ranking))
    reference = _run(folder, REFERENCE, lists)
    reference_ndcg = evaluate(reference, ranking.qrels, ["nDCG@10"])["nDCG@10"]
    gate = QualityGate(ranking.ranking_source, len(lists), reference_ndcg)
    for name, reason in gate_candidates(folder, int8_runtime).items():
        if reason is not None:
            gate.backends[name] = BackendQuality(not_checked=reason)
            continue
        run = _run(folder, name, lists)
        ndcg = evaluate(run, ranking.qrels, ["nDCG@10"])["nDCG@10"]
        spearman = mean_fidelity(fidelity_per_query(run, reference))["spearman"]
        delta = ndcg - reference_ndcg
        gate.backends[name] = BackendQuality(ndcg, delta, spearman, abs(delta) <= NDCG_BOUND)
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


def validation_set(folder: Path, input: str | None = None, qrels: str | None = None) -> ParitySet:
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
        data = _load(input, qrels)
        judged = [c for c in data.candidates if c.query.qid in data.qrels]
        where = f"judged queries of {shown_path(input)}"
    elif card is None:
        data = _load(str(DL21 / "bm25_top100.json"), None)
        judged = [c for c in data.candidates if c.query.qid in data.qrels]
        where = "judged TREC DL21 queries (data/trec-dl21, the student has no card)"
    else:
        inputs = _teacher_inputs(folder, card)
        wanted = set(card.val_queries)
        parts = [_load(path, qrels or card.qrels) for path in inputs]
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


def _teacher_inputs(folder: Path, card: StudentCard) -> list[str]:
    """The candidate inputs of the card's teacher datasets, in order, each once."""
    inputs: list[str] = []
    for path in card.teacher_data:
        found = resolve_path(path)
        if found is None or not TeacherDataset.is_complete(found):
            raise MissingFileError(
                f"{folder}: the student's teacher data {path} is not here: give export's validation_input "
                "(its held-out candidates) and validation_qrels"
            )
        inputs += [i for i in TeacherDataset.open(found).metadata.input if i not in inputs]
    return inputs


def _load(input: str, qrels: str | None) -> RerankingData:
    from distill.core.loaders import load_candidates
    from distill.core.loaders.irds import is_irds

    if is_irds(input):
        return load_candidates(input, qrels=qrels)
    path = resolve_path(input)
    if path is None:
        raise MissingFileError(f"{input}: no such candidates file or folder")
    beside = path.parent / QRELS_FILE if path.is_file() else None
    given = resolve_path(qrels) if qrels else None
    if qrels and given is None:
        raise MissingFileError(f"{qrels}: no such qrels file")
    return load_candidates(path, qrels=given or (beside if beside and beside.is_file() else None))
