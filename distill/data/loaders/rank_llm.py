"""rank_llm's candidate format: ``[{"query": str, "hits": [{"qid", "docid", "content", "rank", "score"}]}]``, as one
JSON list, or as JSON lines of one ``{query, hits}`` entry each; :func:`stream_rank_llm` reads either a query at a time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from distill.core.schema import Candidates
from distill.data.loaders._common import (
    BadInput,
    CandidatesBuilder,
    clean_text,
    id_fault,
    json_entries,
    require,
    require_text,
)

log = logging.getLogger(__name__)


def is_rank_llm(data: object) -> bool:
    return isinstance(data, list) and bool(data) and isinstance(data[0], dict) and "hits" in data[0]


def stream_rank_llm(path: Path, bad: BadInput, repair: bool) -> Iterator[Candidates]:
    """The candidates of a rank_llm JSON list or JSON-lines file, a query at a time, holding one entry in memory
    (and the ids of the queries seen, to refuse one that comes back in a later entry: its candidates could not be
    joined without holding them all)."""
    seen: dict[str, str] = {}
    for where, entry in json_entries(path, bad):
        builder = CandidatesBuilder(bad)
        _add_entry(builder, entry, where, bad, repair)
        for candidates in builder.build():
            qid = candidates.query.qid
            if qid in seen:
                bad(where, f"qid {qid} already had its candidates at {seen[qid]}", "a qid in two entries")
                continue
            seen[qid] = where
            yield candidates


def _add_entry(builder: CandidatesBuilder, entry: object, where: str, bad: BadInput, repair: bool) -> None:
    """Add the hits of one ``{query, hits}`` entry (at ``where``) to ``builder``."""
    query = require_text(entry, "query", where, bad)
    hits = require(entry, "hits", where, bad)
    if query is None or hits is None:
        return
    if not isinstance(hits, list):
        bad(where, f"hits: expected a list of hits, got {type(hits).__name__}")
        return
    if not hits:  # no hit names the query's qid: it leaves no trace downstream but this line
        log.warning("%s: no hits for query %r: nothing to score for it", where, clean_text(query, repair))
    entry_qid: str | None = None  # an entry holds one query's hits: its first hit's qid
    scored: bool | None = None  # whether its hits carry a score: all or none, or their ranking would be two in one
    for j, hit in enumerate(hits):
        hit_where = f"{where} hit [{j}]"
        fields = [require(hit, k, hit_where, bad) for k in ("qid", "docid")]
        content = require_text(hit, "content", hit_where, bad) if None not in fields else None
        if content is None:
            continue
        score = _first_stage_score(hit, j, hit_where, bad)
        if score is None:
            continue
        has_score = hit.get("score") is not None
        if scored is not None and has_score != scored:
            which = (
                "a score, where this entry's first hits have none",
                "no score, where this entry's first hits have one",
            )
            bad(hit_where, f"{which[not has_score]}: give every hit a score, or none (then its order ranks them)")
            continue
        scored = has_score
        qid, docid = fields
        if id_fault("qid", str(qid)) is None:  # a bad id is the builder's to name
            if entry_qid is not None and str(qid) != entry_qid:
                bad(
                    hit_where,
                    f"qid {qid}, but this entry's hits are of qid {entry_qid}: an entry holds one query",
                    "a hit of another qid than its entry's",
                )
                continue
            entry_qid = str(qid)
        text = clean_text(content, repair)
        builder.add(hit_where, str(qid), clean_text(query, repair), str(docid), text, score)


def _first_stage_score(hit: dict[str, Any], j: int, where: str, bad: BadInput) -> float | None:
    """The first-stage score of hit ``j``: its ``score``; without one, the given order (rank r, else position r,
    scores -r). None after reporting a value that is not a finite number (a string of digits is one)."""
    for key, sign in (("score", 1.0), ("rank", -1.0)):
        value = hit.get(key)
        if value is None:
            continue
        try:
            number = float(value) if isinstance(value, int | float | str) and not isinstance(value, bool) else None
        except ValueError:
            number = None
        if number is None or not math.isfinite(number):
            bad(where, f"{key} {value!r} is not a finite number", f"a {key} that is not a finite number")
            return None
        return sign * number
    return -float(j + 1)
