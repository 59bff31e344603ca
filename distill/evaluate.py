"""Ranking metrics with ir-measures (trec_eval convention: unjudged documents count as irrelevant)."""

from __future__ import annotations

from collections.abc import Sequence

import ir_measures

from distill.runs import Run
from distill.schema import Qrels

DEFAULT_METRICS = ("nDCG@1", "nDCG@5", "nDCG@10")


def evaluate(run: Run, qrels: Qrels, metrics: Sequence[str] = DEFAULT_METRICS) -> dict[str, float]:
    """Mean of each metric (ir-measures names such as ``nDCG@10``) x 100, over the queries that are both
    in the run and judged (trec_eval's convention without ``-c``)."""
    parsed = [ir_measures.parse_measure(m) for m in metrics]
    judged = {qid: docs for qid, docs in run.items() if qid in qrels}
    if not judged:
        raise ValueError("no query of the run has relevance judgements")
    results = ir_measures.calc_aggregate(parsed, {qid: qrels[qid] for qid in judged}, judged)
    return {m: 100.0 * results[p] for m, p in zip(metrics, parsed, strict=True)}
