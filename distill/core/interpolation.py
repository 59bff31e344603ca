"""Interpolating a student with the first stage it reranks, per query:
``α · z(student) + (1 − α) · z(first-stage score)``, with ``z`` the per-query standardisation of
:func:`distill.data.labels.per_query_z`. α = 1 is the student alone, α = 0 the first stage's order.

α is chosen on the validation queries at training time (:func:`choose_alpha`) and written into the student's
card; the Reranker applies it only when asked, or when the card says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from distill.core.schema import Qrels
from distill.data.labels import per_query_z

ALPHAS = tuple(round(0.05 * i, 2) for i in range(21))
"""The grid α is chosen on: 0, 0.05, ..., 1."""


def interpolate(student: np.ndarray, first_stage: np.ndarray, qids: Sequence[str], alpha: float) -> np.ndarray:
    """``[n]`` fused scores of ``[n]`` student and first-stage scores; ``qids[i]`` is the query of pair ``i``."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"interpolation alpha must be in [0, 1], got {alpha}")
    return alpha * per_query_z(student, qids) + (1 - alpha) * per_query_z(first_stage, qids)


def choose_alpha(
    student: np.ndarray, first_stage: np.ndarray, qids: Sequence[str], docids: Sequence[str], qrels: Qrels
) -> tuple[float, dict[float, float]]:
    """The α of :data:`ALPHAS` whose fused ranking has the best nDCG@10 on ``qrels`` (ties: the larger α, more
    of the student), and the nDCG@10 (x100) of every α."""
    from distill.eval.metrics import evaluate
    from distill.eval.trec_runs import run_from_columns

    ndcg = {
        alpha: evaluate(
            run_from_columns(qids, docids, interpolate(student, first_stage, qids, alpha)), qrels, ["nDCG@10"]
        )["nDCG@10"]
        for alpha in ALPHAS
    }
    best = max(ALPHAS, key=lambda alpha: (round(ndcg[alpha], 9), alpha))
    return best, ndcg
