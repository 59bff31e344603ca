"""rank_llm's candidate format: ``[{"query": str, "hits": [{"qid", "docid", "content", "rank", "score"}]}]``, as one
JSON list, or as JSON lines of one ``{query, hits}`` entry each; :func:`stream_rank_llm` reads either a query at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from distill.core.schema import Candidates
from distill.data.loaders._common import BadInput, CandidatesBuilder, clean_text, json_entries, require


def is_rank_llm(data: object) -> bool:
    return isinstance(data, list) and bool(data) and isinstance(data[0], dict) and "hits" in data[0]


def stream_rank_llm(path: Path, bad: BadInput, repair: bool) -> Iterator[Candidates]:
    """The candidates of a rank_llm JSON list or JSON-lines file, a query at a time, holding one entry in memory
    (and the ids of the queries seen, to refuse one that comes back in a later entry: its candidates could not be
    joined without holding them all)."""
    seen: dict[str, str] = {}
    for where, entry in json_entries(path):
        builder = CandidatesBuilder(bad)
        _add_entry(builder, entry, where, bad, repair)
        for candidates in builder.build():
            qid = candidates.query.qid
            if qid in seen:
                bad(where, f"qid {qid} already had its candidates at {seen[qid]}")
                continue
            seen[qid] = where
            yield candidates


def _add_entry(builder: CandidatesBuilder, entry: object, where: str, bad: BadInput, repair: bool) -> None:
    """Add the hits of one ``{query, hits}`` entry (at ``where``) to ``builder``."""
    query = require(entry, "query", where, bad)
    hits = require(entry, "hits", where, bad)
    if query is None or hits is None:
        return
    for j, hit in enumerate(hits):
        hit_where = f"{where} hit [{j}]"
        fields = [require(hit, k, hit_where, bad) for k in ("qid", "docid", "content")]
        if any(f is None for f in fields):
            continue
        qid, docid, content = fields
        score = hit.get("score")
        builder.add(
            hit_where,
            str(qid),
            clean_text(str(query), repair),
            str(docid),
            clean_text(str(content), repair),
            # Without first-stage scores, keep the given order: rank r scores -r.
            float(score) if score is not None else -float(hit.get("rank", j + 1)),
        )
