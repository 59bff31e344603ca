"""Fidelity: how faithfully a ranking copies its teacher's, query by query.

Pooled correlations across queries hide what reranking needs (the order within each query), so every figure
here is computed per query, over the candidates both rankings score, then averaged over queries:

- ``kendall_tau`` and ``spearman``: rank correlations of the two score lists (-1 to 1);
- ``nDCG@10_teacher``: nDCG@10 (x100) of the ranking judged against the teacher's own: the teacher's top 10
  get grades 10, 9, ..., 1 (rank 1 gets 10), every other candidate 0. 100 means the same top 10 in the same order.
"""

from __future__ import annotations

import numpy as np

from distill.core.schema import Qrels
from distill.eval.trec_runs import Run

FIDELITY_METRICS = ("kendall_tau", "spearman", "nDCG@10_teacher")
TEACHER_DEPTH = 10
"""The teacher's top candidates that carry a grade in ``nDCG@10_teacher``."""

PerQuery = dict[str, dict[str, float]]
"""metric -> qid -> value."""


def teacher_qrels(teacher: Run, depth: int = TEACHER_DEPTH) -> Qrels:
    """The teacher's ranking as graded judgements: its top ``depth`` get ``depth, depth - 1, ..., 1`` (ties by
    docid, as TREC runs are ranked); the rest 0."""
    qrels: Qrels = {}
    for qid, scores in teacher.items():
        ranked = sorted(scores, key=lambda docid: (-scores[docid], docid))
        qrels[qid] = {docid: max(depth - rank, 0) for rank, docid in enumerate(ranked)}
    return qrels


def fidelity_per_query(run: Run, teacher: Run) -> PerQuery:
    """Each metric of :data:`FIDELITY_METRICS` for each query both runs rank (two shared candidates at least),
    on the candidates both score. A query whose scores are all equal in either run has no correlation (left out
    of ``kendall_tau`` and ``spearman``)."""
    from scipy.stats import kendalltau, spearmanr

    from distill.eval.metrics import evaluate_per_query

    values: PerQuery = {name: {} for name in FIDELITY_METRICS}
    shared_run: Run = {}
    shared_teacher: Run = {}
    for qid in sorted(run.keys() & teacher.keys()):
        docids = sorted(run[qid].keys() & teacher[qid].keys())
        if len(docids) < 2:
            continue
        ours = np.array([run[qid][d] for d in docids])
        theirs = np.array([teacher[qid][d] for d in docids])
        shared_run[qid] = dict(zip(docids, ours.tolist(), strict=True))
        shared_teacher[qid] = dict(zip(docids, theirs.tolist(), strict=True))
        if np.ptp(ours) > 0 and np.ptp(theirs) > 0:
            values["kendall_tau"][qid] = float(kendalltau(ours, theirs).statistic)
            values["spearman"][qid] = float(spearmanr(ours, theirs).statistic)
    if shared_run:
        ndcg = evaluate_per_query(shared_run, teacher_qrels(shared_teacher), ["nDCG@10"])["nDCG@10"]
        values["nDCG@10_teacher"] = ndcg
    return values


def mean_fidelity(per_query: PerQuery) -> dict[str, float]:
    """metric -> mean over its queries (NaN where it has none)."""
    return {name: float(np.mean(list(v.values()))) if v else float("nan") for name, v in per_query.items()}
