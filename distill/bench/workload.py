"""The latency benchmark's inputs: real (query, candidates) calls, as a reranker receives them.

- The paper's protocol (Appendix A): one query's candidates at a total candidate-token count of
  500, 1000, 2000, ... tokens. The query is the one whose candidates hold the most tokens (or a given
  one); each workload takes its candidates in first-stage order until the count is reached, the last
  passage cut at the token where the count is met (decoded to text, so re-tokenising it may shift the
  count by a token or two: the recorded count is the re-tokenised one).
- "rerank a query's candidates": each of the first queries of the input with its whole candidate list
  (a DL19 query's 100 BM25 candidates), one call per query.

Tokens are counted with the student's tokenizer, passages only (no query, no special tokens).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from distill.core.schema import Candidates, InputError, RerankingData

log = logging.getLogger(__name__)

TOKEN_COUNTS = (500, 1000, 2000, 3000, 5000, 10000)
"""The paper's total candidate-token counts."""


@dataclass(frozen=True)
class Call:
    """One reranking call: a query and its candidate passages."""

    qid: str
    query: str
    passages: list[str]
    passage_tokens: int
    """Passage tokens under the student's tokenizer."""


@dataclass(frozen=True)
class Workload:
    """Calls timed together: their latencies are pooled into one p50/p95."""

    name: str
    """``"500 tokens"`` ... or ``"<n> candidates"``."""
    calls: list[Call]

    @property
    def pairs_per_call(self) -> float:
        return sum(len(c.passages) for c in self.calls) / len(self.calls)

    @property
    def passage_tokens_per_call(self) -> float:
        return sum(c.passage_tokens for c in self.calls) / len(self.calls)


def _passage_ids(tokenizer: Any, cands: Candidates) -> list[list[int]]:
    return tokenizer([p.text for p in cands.passages], add_special_tokens=False, verbose=False)["input_ids"]


def token_count_workloads(
    data: RerankingData, tokenizer: Any, counts: Sequence[int] = TOKEN_COUNTS, qid: str | None = None
) -> list[Workload]:
    """One workload per count: the candidates of one query cut at ``count`` passage tokens.

    Args:
        data: candidate lists with passage texts.
        tokenizer: the student's tokenizer, which counts the tokens.
        counts: total passage-token counts, each ``>= 1``.
        qid: the query to take (default: the one whose candidates hold the most tokens).

    Raises:
        InputError: ``qid`` is not in ``data``, or its candidates hold fewer tokens than the largest count.
    """
    if not counts or min(counts) < 1:
        raise ValueError(f"token counts must be positive, got {list(counts)}")
    ids_of = {c.query.qid: _passage_ids(tokenizer, c) for c in data.candidates}
    by_qid = {c.query.qid: c for c in data.candidates}
    if qid is None:
        qid = max(ids_of, key=lambda q: sum(map(len, ids_of[q])))
    elif qid not in by_qid:
        raise InputError(f"{data.source}: no query {qid!r}")
    cands, ids = by_qid[qid], ids_of[qid]
    available = sum(map(len, ids))
    if available < max(counts):
        raise InputError(
            f"{data.source}: query {qid}'s candidates hold {available} tokens, fewer than {max(counts)}; "
            "give an input with longer candidate lists or smaller --token-counts"
        )
    workloads = []
    for count in counts:
        passages, left = [], count
        for passage, passage_ids in zip(cands.passages, ids, strict=True):
            if left <= 0:
                break
            passages.append(passage.text if len(passage_ids) <= left else tokenizer.decode(passage_ids[:left]))
            left -= min(left, len(passage_ids))
        tokens = sum(map(len, tokenizer(passages, add_special_tokens=False, verbose=False)["input_ids"]))
        workloads.append(Workload(f"{count} tokens", [Call(qid, cands.query.text, passages, tokens)]))
    return workloads


def rerank_workload(data: RerankingData, tokenizer: Any, queries: int) -> Workload:
    """The first ``queries`` queries, each with all its candidates: one call per query."""
    if queries < 1:
        raise ValueError(f"queries must be at least 1, got {queries}")
    calls = [
        Call(c.query.qid, c.query.text, [p.text for p in c.passages], sum(map(len, _passage_ids(tokenizer, c))))
        for c in data.candidates[:queries]
    ]
    if len(calls) < queries:
        log.warning("rerank_queries %d: %s holds %d queries; timing those", queries, data.source, len(calls))
    sizes = sorted({len(c.passages) for c in calls})
    size = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    return Workload(f"{size} candidates", calls)
