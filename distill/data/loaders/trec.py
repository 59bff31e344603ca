"""TREC runs (``qid Q0 docid rank score tag``) with their queries and corpus, each a TSV or JSONL file.

Queries: TSV ``qid<TAB>text``, or JSONL ``{"_id"|"qid"|"id", "text"|"query"}``.
Corpus: TSV ``docid<TAB>text`` or ``docid<TAB>title<TAB>text``, or JSONL
``{"_id"|"docid"|"id", "text"|"contents", "title" (optional)}``; a non-empty title is joined
as ``f"{title} {text}"``. A file whose name ends in ``.jsonl`` or ``.json`` is JSONL, any other TSV.

The corpus is streamed and only the passages the run needs are kept, so a large corpus is fine.
:mod:`.beir` shares the readers here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distill.core.schema import Candidates, InputError
from distill.data.loaders._common import BadInput, CandidatesBuilder, clean_text, iter_jsonl

QUERY_ID_KEYS = ("_id", "qid", "id")
QUERY_TEXT_KEYS = ("text", "query")
DOC_ID_KEYS = ("_id", "docid", "id")
DOC_TEXT_KEYS = ("text", "contents")


@dataclass(frozen=True)
class RunLine:
    """One (qid, docid) line of a run, or of any ranked list; ``lineno`` is its 1-based line number."""

    qid: str
    docid: str
    rank: int
    score: float
    lineno: int


Run = dict[str, list[RunLine]]
"""qid -> its lines in rank order; qids in order of first appearance."""


def load_trec_run(
    run_path: Path, queries_path: Path, corpus_path: Path, bad: BadInput, repair: bool
) -> list[Candidates]:
    """Candidates from a TREC run, with texts from ``queries_path`` and ``corpus_path``.

    Each query's candidates are ordered by score, descending (ties: rank, ascending); queries
    come in the order of their first line in the run.
    """
    for path, what in ((run_path, "run"), (queries_path, "queries"), (corpus_path, "corpus")):
        check_file(path, what)
    return candidates_from_run(read_run(run_path, bad), run_path, queries_path, corpus_path, bad, repair)


def check_file(path: Path, what: str) -> None:
    if not path.is_file():
        raise InputError(f"{path}: {what} file not found")


def is_jsonl(path: Path) -> bool:
    return path.suffix.lower() in (".jsonl", ".json")


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` for each non-blank line, without its line end."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise InputError(f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            if line.strip():
                yield lineno, line


def iter_records(path: Path) -> Iterator[tuple[int, Any]]:
    """:func:`iter_jsonl`, with a decoding error named as :class:`InputError`."""
    try:
        yield from iter_jsonl(path)
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason})") from None


def first_field(record: Any, keys: tuple[str, ...], where: str, bad: BadInput) -> Any | None:
    """The value of the first of ``keys`` that ``record`` has, or ``None`` after reporting it to ``bad``."""
    if not isinstance(record, dict):
        bad(where, f"expected a JSON object, got {type(record).__name__}")
        return None
    for key in keys:
        if record.get(key) is not None:
            return record[key]
    bad(where, f"missing field {keys[0]!r} (or {', '.join(repr(k) for k in keys[1:])})")
    return None


def passage_text(title: str, text: str, repair: bool) -> str:
    """``text``, after its title where there is a non-empty one."""
    title, text = clean_text(title, repair), clean_text(text, repair)
    return f"{title} {text}".strip() if title else text


def read_run(path: Path, bad: BadInput) -> Run:
    """Parse a TREC run: lines ``qid Q0 docid rank score tag``, sorted by score (ties: rank) per qid."""
    run: Run = {}
    for lineno, line in iter_lines(path):
        where = f"{path}:{lineno}"
        parts = line.split()
        if len(parts) != 6:
            bad(where, f"expected 6 fields 'qid Q0 docid rank score tag', got {len(parts)}")
            continue
        qid, _, docid, rank, score, _ = parts
        try:
            score_value = float(score)
        except ValueError:
            bad(where, f"score {score!r} is not a number")
            continue
        if not math.isfinite(score_value):
            bad(where, f"score {score!r} is not a finite number")
            continue
        try:
            rank_value = int(rank)
        except ValueError:
            bad(where, f"rank {rank!r} is not an integer")
            continue
        run.setdefault(qid, []).append(RunLine(qid, docid, rank_value, score_value, lineno))
    for lines in run.values():
        lines.sort(key=lambda r: (-r.score, r.rank))
    return run


def read_queries(path: Path, bad: BadInput, repair: bool, needed: set[str] | None = None) -> dict[str, str]:
    """qid -> query text, for the qids in ``needed`` (all, if ``None``)."""
    queries: dict[str, str] = {}
    if is_jsonl(path):
        records = _json_records(path, QUERY_ID_KEYS, QUERY_TEXT_KEYS, bad, needed)
    else:
        records = _tsv_records(path, "qid<TAB>text", bad, needed)
    for where, qid, _, text in records:
        _keep_first(queries, where, "qid", qid, clean_text(text, repair), bad)
    return queries


def read_corpus(path: Path, bad: BadInput, repair: bool, needed: set[str] | None) -> dict[str, str]:
    """docid -> passage text, for the docids in ``needed`` only (reading stops once all are found); all, if ``None``."""
    corpus: dict[str, str] = {}
    if needed is not None and not needed:
        return corpus
    if is_jsonl(path):
        records = _json_records(path, DOC_ID_KEYS, DOC_TEXT_KEYS, bad, needed)
    else:
        records = _tsv_records(path, "docid<TAB>text' or 'docid<TAB>title<TAB>text", bad, needed, titled=True)
    for where, docid, title, text in records:
        _keep_first(corpus, where, "docid", docid, passage_text(title, text, repair), bad)
        if needed is not None and len(corpus) == len(needed):
            break
    return corpus


def candidates_from_run(
    run: Run, source: Path, queries_path: Path, corpus_path: Path, bad: BadInput, repair: bool
) -> list[Candidates]:
    """Candidates for the (qid, docid) lines of ``run`` (read from ``source``), with their texts."""
    queries = read_queries(queries_path, bad, repair, needed=set(run))
    corpus = read_corpus(corpus_path, bad, repair, needed={r.docid for lines in run.values() for r in lines})
    builder = CandidatesBuilder(bad)
    for qid, lines in run.items():
        for r in lines:
            where = f"{source}:{r.lineno}"
            if qid not in queries:
                bad(where, f"qid {qid} not found in {queries_path}")
            elif r.docid not in corpus:
                bad(where, f"docid {r.docid} not found in {corpus_path}")
            else:
                builder.add(where, qid, queries[qid], r.docid, corpus[r.docid], r.score)
    return builder.build()


def _tsv_records(
    path: Path, layout: str, bad: BadInput, needed: set[str] | None, titled: bool = False
) -> Iterator[tuple[str, str, str, str]]:
    """Yield ``(where, id, title, text)`` for the needed lines of ``id<TAB>[title<TAB>]text`` TSV.

    A line without a tab is bad input wherever it is; one with too many fields only where it is needed.
    """
    for lineno, line in iter_lines(path):
        where = f"{path}:{lineno}"
        parts = line.split("\t") if titled else line.split("\t", 1)
        key = parts[0].strip()
        if len(parts) > 1 and needed is not None and key not in needed:
            continue
        if len(parts) == 2:
            yield where, key, "", parts[1]
        elif titled and len(parts) == 3:
            yield where, key, parts[1], parts[2]
        else:
            bad(where, f"expected '{layout}', got {len(parts)} tab-separated fields")


def _json_records(
    path: Path, id_keys: tuple[str, ...], text_keys: tuple[str, ...], bad: BadInput, needed: set[str] | None
) -> Iterator[tuple[str, str, str, str]]:
    """Yield ``(where, id, title, text)`` for the needed records of a JSON-lines file."""
    for lineno, record in iter_records(path):
        where = f"{path}:{lineno}"
        key = first_field(record, id_keys, where, bad)
        if key is None or (needed is not None and str(key) not in needed):
            continue
        text = first_field(record, text_keys, where, bad)
        if text is not None:
            yield where, str(key), str(record.get("title") or ""), str(text)


def _keep_first(texts: dict[str, str], where: str, kind: str, key: str, text: str, bad: BadInput) -> None:
    """Store ``texts[key] = text``; a repeated key keeps its first text, and a different one is bad input."""
    if key not in texts:
        texts[key] = text
    elif texts[key] != text:
        bad(where, f"{kind} {key} appears twice with different texts")
