"""Ranking metrics with ir-measures (trec_eval convention: unjudged documents count as irrelevant).

Values are ×100, but counts (``NumRet``, ``NumRel``, ``NumQ``). Means are over the queries that are both in the run
and judged (trec_eval without ``-c``); counts are summed over them, as trec_eval's ``all`` row sums them. Every
metric ranks a run as trec_eval does, whichever ir-measures provider computes it: by score in single precision
(trec_eval's C ``float``), descending, and equal scores by docid, descending (byte order).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import ir_measures
import numpy as np

from distill.core.schema import Qrels
from distill.eval.trec_runs import Run

DEFAULT_METRICS = ("nDCG@1", "nDCG@5", "nDCG@10", "RR@10", "R@100")
"""Passage ranking (TREC DL): the binary ones (RR, R) take the relevance level of :func:`parse_metrics`."""
MULTIHOP_METRICS = ("R@3", "R@4", "R@6", "P@3", "P@4", "P@6")
"""Multi-hop QA: recall and precision of the supporting paragraphs in the top k (R@k: |supporting ∩ top k| /
|supporting|; P@k: |supporting ∩ top k| / k, also where fewer than k paragraphs are ranked)."""

PerQuery = dict[str, dict[str, float]]
"""metric -> qid -> value × 100 (a count as it is)."""
COUNTS = ("NumRet", "NumRel", "NumQ")
"""Measures that count (retrieved, relevant documents or queries), reported as they are, not ×100, and summed over
the queries, not averaged."""


def default_rel_level(qrels: Qrels) -> int:
    """The grade from which a document counts as relevant for binary metrics: 2 for graded qrels whose top
    grade is at least 2 (TREC DL: "highly relevant" and "perfectly relevant"), else 1."""
    top = max((grade for judged in qrels.values() for grade in judged.values()), default=1)
    return 2 if top >= 2 else 1


def parse_metrics(names: Sequence[str], rel_level: int = 1) -> dict[str, ir_measures.Measure]:
    """ir-measures names -> measures, keyed by their canonical names.

    A measure whose relevance level defaults to a grade (``RR``, ``R``, ``P``, ``AP``, ...) and that does not name
    one gets ``rel=rel_level``, where an installed provider computes it at that level; its key then says so
    (``RR@10`` with ``rel_level=2`` is ``RR(rel=2)@10``). Graded measures (nDCG), and those for which no level means
    every document (``NumRet``), are left as they are. An unknown name, a parameter the measure does not take, a
    cutoff that is not a whole number of at least 1, or a measure no installed ir-measures provider computes raises
    :class:`ValueError` naming it, before any run is read.
    """
    measures: dict[str, ir_measures.Measure] = {}
    for name in names:
        try:
            measure = ir_measures.parse_measure(name)
        except (NameError, ValueError, SyntaxError) as e:
            raise ValueError(
                f"unknown metric {name!r} ({e}); expected ir-measures names such as nDCG@10, RR(rel=2)@10, R@100, P@5"
            ) from None
        unsupported = sorted(set(measure.params) - set(measure.SUPPORTED_PARAMS))
        if unsupported:
            raise ValueError(
                f"metric {name!r}: {measure.NAME} takes no {', '.join(unsupported)} "
                f"(it takes {', '.join(measure.SUPPORTED_PARAMS)})"
            )
        cutoff = measure.params.get("cutoff")
        if cutoff is not None and (not isinstance(cutoff, int) or isinstance(cutoff, bool) or cutoff < 1):
            raise ValueError(f"metric {name!r}: the cutoff after @ must be a whole number of at least 1")
        rel = measure.SUPPORTED_PARAMS.get("rel")
        if rel is not None and isinstance(rel.default, int) and "rel" not in measure.params:
            leveled = measure(rel=rel_level)
            if _computed(leveled, name) or not _computed(measure, name):  # NumRel is computed at its own level only
                measure = leveled
        if not _computed(measure, name):
            raise ValueError(
                f"metric {name!r}: no installed ir-measures provider computes {measure}; expected names such as "
                "nDCG@10, RR(rel=2)@10, R@100, P@5"
            )
        measures[str(measure)] = measure
    return measures


def _computed(measure: ir_measures.Measure, name: str) -> bool:
    """Whether an installed ir-measures provider computes ``measure`` (given as ``name``).

    Raises:
        ValueError: a parameter it needs is missing or invalid (``SDCG`` without ``max_rel``), naming the metric.
    """
    try:
        return bool(ir_measures.DefaultPipeline.supports(measure))
    except AssertionError as e:  # ir-measures checks a measure's parameters with assert
        problem = re.sub(r"invalid param (\w+)=<object object at \w+>", r"it needs \1", str(e))  # no value given
        raise ValueError(f"metric {name!r}: {problem}") from None


def evaluate_per_query(
    run: Run, qrels: Qrels, metrics: Sequence[str] = DEFAULT_METRICS, rel_level: int = 1
) -> PerQuery:
    """Each metric's value × 100 for each query that is both in the run and judged.

    Args:
        run: qid -> docid -> score.
        qrels: qid -> docid -> grade.
        metrics: ir-measures names, see :func:`parse_metrics` (keys of the result are its canonical names).
        rel_level: relevance level of the binary measures that do not name one.

    Raises :class:`ValueError` where no query of the run is judged, or a score is not a finite number (a NaN has no
    rank).
    """
    measures = parse_metrics(metrics, rel_level)
    judged = [qid for qid in run if qid in qrels]
    if not judged:
        raise ValueError("no query of the run has relevance judgements")
    for qid in judged:
        bad = next((docid for docid, score in run[qid].items() if not math.isfinite(score)), None)
        if bad is not None:
            raise ValueError(f"query {qid}: the score of {bad} is {run[qid][bad]}, not a finite number")
    # Each provider gets the trec_eval ranking as distinct scores, and query ids it can take (gdeval, behind ERR,
    # reads numbers only): the run's own tie rule and ids would differ between providers.
    ranked = {str(i): trec_eval_order(run[qid]) for i, qid in enumerate(judged)}
    names = {measure: name for name, measure in measures.items()}
    values: PerQuery = {name: {} for name in measures}
    for m in ir_measures.iter_calc(list(measures.values()), {str(i): qrels[q] for i, q in enumerate(judged)}, ranked):
        name = names[m.measure]
        values[name][judged[int(m.query_id)]] = m.value if m.measure.NAME in COUNTS else 100.0 * m.value
    return values


def trec_eval_order(docs: dict[str, float]) -> dict[str, float]:
    """A query's docid -> score as scores ``n, n - 1, ..., 1`` in trec_eval's order: by score, descending, equal
    scores by docid, descending. trec_eval holds a score as a C ``float``: scores equal in single precision tie."""
    single = {docid: float(np.float32(score)) for docid, score in docs.items()}
    order = sorted(single, key=lambda docid: (single[docid], docid.encode()), reverse=True)
    return {docid: float(len(order) - rank) for rank, docid in enumerate(order)}


def means(per_query: PerQuery) -> dict[str, float]:
    """metric -> mean over its queries (a count of :data:`COUNTS`: the sum)."""
    return {
        name: sum(values.values()) / (1 if ir_measures.parse_measure(name).NAME in COUNTS else len(values))
        for name, values in per_query.items()
    }


def evaluate(run: Run, qrels: Qrels, metrics: Sequence[str] = DEFAULT_METRICS, rel_level: int = 1) -> dict[str, float]:
    """Mean of each metric × 100 over the queries that are both in the run and judged.

    Arguments and errors as for :func:`evaluate_per_query`.
    """
    return means(evaluate_per_query(run, qrels, metrics, rel_level))
