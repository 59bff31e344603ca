"""The pairs an export is checked on: score pairs for the parity bounds and a ranking set (judged queries' candidate
lists) for nDCG@10, read by the parity check (:mod:`distill.export.parity`) and the quality gate
(:mod:`distill.export.quality_gate`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from distill.core.project_files import CANDIDATES, DL19, QRELS, shipped
from distill.core.schema import InputError, Qrels, RerankingData
from distill.export.recorded_paths import shown_path

PARITY_QUERIES = 3
"""The queries whose candidates the score bounds check unless told otherwise."""
PARITY_DEPTH = 32
"""Candidates per query of the score bounds unless told otherwise."""
NDCG_BOUND = 0.5
"""Max |ΔnDCG@10| (points, x100) of the int8 graph against PyTorch fp32."""


@dataclass(frozen=True)
class Pair:
    qid: str
    docid: str | None
    """None for the long pair, which is no candidate (and is left out of rankings)."""
    query: str
    passage: str


@dataclass(frozen=True)
class ParitySet:
    """Real (query, passage) pairs to compare the formats on, with qrels for the int8 ranking check."""

    pairs: list[Pair]
    """Pairs for the score bounds."""
    ranking: list[Pair] = field(default_factory=list)
    """The ranking set of the quality gate and the int8 nDCG@10 bound: candidate lists of judged queries, each
    query's pairs consecutive."""
    qrels: Qrels = field(default_factory=dict)
    ranking_source: str = ""
    """One line: which queries and candidates ``ranking`` holds."""

    @classmethod
    def from_data(
        cls,
        data: RerankingData,
        queries: int = PARITY_QUERIES,
        depth: int = PARITY_DEPTH,
        ranking_queries: int | None = None,
        ranking_depth: int | None = None,
    ) -> ParitySet:
        """Score pairs: the first ``depth`` candidates of the first ``queries`` queries, and a long pair (the
        first query with those candidates' passages joined) that reaches the max length. Evaluation set: the
        first ``ranking_depth`` candidates of the first ``ranking_queries`` judged queries (default all)."""
        lists = data.candidates[:queries]
        if not lists:
            raise InputError(f"{data.source}: no candidates for the parity check")
        pairs = [Pair(c.query.qid, p.docid, c.query.text, p.text) for c in lists for p in c.passages[:depth]]
        first = lists[0]
        long_passage = " ".join(p.text for p in first.passages[:depth])
        judged = [c for c in data.candidates if c.query.qid in data.qrels][:ranking_queries]
        ranking = [Pair(c.query.qid, p.docid, c.query.text, p.text) for c in judged for p in c.passages[:ranking_depth]]
        depth = "all" if ranking_depth is None else f"the first {ranking_depth}"
        source = f"{len(judged)} judged queries of {shown_path(data.source)}, {depth} of their candidates"
        return cls([*pairs, Pair(first.query.qid, None, first.query.text, long_passage)], ranking, data.qrels, source)

    def with_ranking(self, other: ParitySet) -> ParitySet:
        """These score pairs with ``other``'s ranking set (its ``ranking``, ``qrels`` and ``ranking_source``)."""
        return replace(self, ranking=other.ranking, qrels=other.qrels, ranking_source=other.ranking_source)


def dl19_parity_set(queries: int = PARITY_QUERIES, depth: int = PARITY_DEPTH) -> ParitySet:
    """The first ``queries`` DL19 queries, ``depth`` BM25 candidates each (the export's default score pairs), and a
    ranking set of all 43 judged DL19 queries (:mod:`benchmarks.onnx_cpu` measures on it; the export replaces it
    with the student's validation queries, :func:`~distill.export.quality_gate.validation_set`)."""
    from distill.data.loaders import load_candidates

    data = load_candidates(shipped(DL19 / CANDIDATES, "parity_input"), qrels=DL19 / QRELS)
    return ParitySet.from_data(data, queries, depth)
