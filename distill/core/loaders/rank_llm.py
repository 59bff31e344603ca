"""rank_llm's candidate format: ``[{"query": str, "hits": [{"qid", "docid", "content", "rank", "score"}]}]``."""

from __future__ import annotations

from pathlib import Path

from distill.core.loaders._common import BadInput, CandidatesBuilder, clean_text, read_json, require
from distill.core.schema import Candidates, InputError


def is_rank_llm(data: object) -> bool:
    return isinstance(data, list) and bool(data) and isinstance(data[0], dict) and "hits" in data[0]


def load_rank_llm(path: Path, data: list | None, bad: BadInput, repair: bool) -> list[Candidates]:
    """Candidates from a rank_llm JSON file (``data`` is its parsed content, if already read)."""
    entries = read_json(path) if data is None else data
    if not isinstance(entries, list):
        raise InputError(f"{path}: expected a JSON list of {{query, hits}} entries")
    builder = CandidatesBuilder(bad)
    for i, entry in enumerate(entries):
        where = f"{path}: entry [{i}]"
        query = require(entry, "query", where, bad)
        hits = require(entry, "hits", where, bad)
        if query is None or hits is None:
            continue
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
    return builder.build()
