"""Ranking quality beside speed: each benchmarked method reranks every judged query of the bench input (all of its
candidates, as in the timed calls), and its nDCG@10 is compared with the student's PyTorch fp32, as
sentence-transformers' efficiency page sets each backend's speed beside its score."""

from __future__ import annotations

from dataclasses import dataclass

from distill.bench.methods import Method
from distill.core.schema import Candidates, Qrels, RerankingData
from distill.eval.metrics import evaluate
from distill.eval.trec_runs import run_from_columns

REFERENCE = "student torch-fp32"
"""The method every nDCG@10 change is taken against."""


@dataclass(frozen=True)
class QualitySet:
    """The judged queries of the bench input, with their candidate lists and qrels."""

    candidates: list[Candidates]
    qrels: Qrels

    @classmethod
    def of(cls, data: RerankingData) -> QualitySet | None:
        """The queries of ``data`` that its qrels judge; None if there are none."""
        judged = [c for c in data.candidates if c.query.qid in data.qrels]
        return cls(judged, data.qrels) if judged else None

    def ndcg10(self, method: Method) -> float:
        """nDCG@10 (x100, trec_eval convention) of ``method``'s ranking of every judged query's candidates."""
        qids, docids, scores = [], [], []
        for cands in self.candidates:
            qids += [cands.query.qid] * len(cands.passages)
            docids += [p.docid for p in cands.passages]
            scores += list(method.score(cands.query.text, [p.text for p in cands.passages]))
        return evaluate(run_from_columns(qids, docids, scores), self.qrels, ["nDCG@10"])["nDCG@10"]
