"""The counts of the commands' summaries, singular for one."""

from __future__ import annotations

from pathlib import Path

from distill.core.counts import counted
from distill.stages.rerank import RerankReport


def test_one_is_singular_and_every_other_count_plural() -> None:
    assert [counted(n, "query", "queries") for n in (0, 1, 2)] == ["0 queries", "1 query", "2 queries"]
    assert [counted(n, "pair") for n in (0, 1, 2)] == ["0 pairs", "1 pair", "2 pairs"]


def test_a_summary_of_one_query_says_one_query() -> None:
    line = RerankReport(Path("out.trec"), queries=1, pairs=1, truncated=0).format()
    assert line == "wrote out.trec: 1 query, 1 pair, 0 truncated"
