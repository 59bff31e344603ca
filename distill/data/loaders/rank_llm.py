"""rank_llm's candidate format: ``[{"query": str, "hits": [{"qid", "docid", "content", "rank", "score"}]}]``, as one
JSON list, or as JSON lines of one ``{query, hits}`` entry each (which :func:`stream_rank_llm` reads a query at a time).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from distill.core.schema import Candidates, InputError
from distill.data.loaders._common import BadInput, CandidatesBuilder, clean_text, iter_jsonl, read_json, require


def is_rank_llm(data: object) -> bool:
    return isinstance(data, list) and bool(data) and isinstance(data[0], dict) and "hits" in data[0]


def load_rank_llm(path: Path, data: list | None, bad: BadInput, repair: bool) -> list[Candidates]:
    """Candidates from a rank_llm JSON file (``data`` is its parsed content, if already read)."""
    entries = read_json(path) if data is None else data
    if not isinstance(entries, list):
        raise InputError(f"{path}: expected a JSON list of {{query, hits}} entries")
    builder = CandidatesBuilder(bad)
    for i, entry in enumerate(entries):
        _add_entry(builder, entry, f"{path}: entry [{i}]", bad, repair)
    return builder.build()


def is_rank_llm_jsonl(path: Path) -> bool:
    """Whether ``path`` is a JSON-lines file whose first record is a rank_llm ``{query, hits}`` entry."""
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    first = next(iter_jsonl(path), None)
    return first is not None and is_rank_llm([first[1]])


def stream_rank_llm(path: Path, bad: BadInput, repair: bool) -> Iterator[Candidates]:
    """The candidates of a rank_llm JSON-lines file, a query at a time, as :func:`load_rank_llm` reads them, holding
    one line's query in memory (and the ids of the queries seen, to refuse one that comes back on a later line:
    its candidates could not be joined without holding them all)."""
    seen: dict[str, int] = {}
    for lineno, entry in iter_jsonl(path):
        builder = CandidatesBuilder(bad)
        _add_entry(builder, entry, f"{path}:{lineno}", bad, repair)
        for candidates in builder.build():
            qid = candidates.query.qid
            if qid in seen:
                bad(f"{path}:{lineno}", f"qid {qid} already had its candidates on line {seen[qid]}")
                continue
            seen[qid] = lineno
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
