"""TREC runs (``qid Q0 docid rank score tag``) with their queries and corpus, each a TSV or JSONL file.

Queries: TSV ``qid<TAB>text``, or JSONL ``{"_id"|"qid"|"id", "text"|"query"}``.
Corpus: TSV ``docid<TAB>text`` or ``docid<TAB>title<TAB>text``, or JSONL
``{"_id"|"docid"|"id", "text"|"contents", "title" (optional)}``; a non-empty title is joined
as ``f"{title} {text}"``. A file whose name ends in ``.jsonl`` or ``.json`` is JSONL, any other TSV.

Candidates are streamed a query at a time: the run is read twice (once for where each query's lines are, then a
query at a time), and passages are looked up in the corpus's index (:mod:`.corpus_index`, built once and kept in
the cache), so neither the run nor the corpus is ever held in memory; the queries the run names are.
:mod:`.beir` shares the readers here.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distill.core.schema import Candidates, InputError
from distill.data.loaders._common import (
    MALFORMED,
    BadInput,
    CandidatesBuilder,
    Malformed,
    TextRecord,
    clean_text,
    decoded,
    iter_jsonl,
)
from distill.data.loaders.corpus_index import CorpusIndex, file_index_folder, open_index


@dataclass(frozen=True)
class TextFields:
    """How a queries or corpus file names its fields: ``kind`` (``qid`` or ``docid``, for messages), the JSONL keys
    of its ids and texts (the first one a record has), and whether its records may carry a title."""

    kind: str
    id_keys: tuple[str, ...]
    text_keys: tuple[str, ...]
    titled: bool

    @property
    def layout(self) -> str:
        """Its TSV lines, as a message names them."""
        return f"{self.kind}<TAB>text' or '{self.kind}<TAB>title<TAB>text" if self.titled else f"{self.kind}<TAB>text"


RUN_LAYOUT = "expected 6 fields 'qid Q0 docid rank score tag'"
"""A run line's layout, as bad input names it."""
QUERY_FIELDS = TextFields("qid", ("_id", "qid", "id"), ("text", "query"), titled=False)
DOC_FIELDS = TextFields("docid", ("_id", "docid", "id"), ("text", "contents"), titled=True)


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


def stream_trec_run(
    run_path: Path, queries_path: Path, corpus_path: Path, bad: BadInput, repair: bool
) -> Iterator[Candidates]:
    """Candidates from a TREC run, with texts from ``queries_path`` and ``corpus_path``, a query at a time.

    Each query's candidates are ordered by score, descending (ties: rank, ascending); queries
    come in the order of their first line in the run.
    """
    for path, what in ((run_path, "run"), (queries_path, "queries"), (corpus_path, "corpus")):
        check_file(path, what)
    run = RunFile(run_path)
    return run_candidates(run.qids, run.queries(bad), run_path, queries_path, corpus_path, bad, repair)


def check_file(path: Path, what: str) -> None:
    """``path`` is a regular file: a pipe or a device (``<(...)``, ``/dev/stdin``) is read more than once (an index,
    then the texts a run needs), which only a file allows.

    Raises:
        InputError: ``<path>: <what> file not found``, or ``... is a pipe or a device, not a file ...``.
    """
    if path.exists() and not path.is_file() and not path.is_dir():
        raise InputError(
            f"{path}: {what}: a pipe or a device, not a file (it is read more than once): save it to a file"
        )
    if not path.is_file():
        raise InputError(f"{path}: {what} file not found")


def is_jsonl(path: Path) -> bool:
    return path.suffix.lower() in (".jsonl", ".json")


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` for each non-blank line, without its line end."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            line = decoded(raw, path, lineno)
            if line.strip():
                yield lineno, line


def passage_text(title: str, text: str, repair: bool) -> str:
    """``text``, after its title where there is a non-empty one."""
    title, text = clean_text(title, repair), clean_text(text, repair)
    return f"{title} {text}".strip() if title else text


def parse_run_line(line: str, lineno: int, path: Path, bad: BadInput) -> RunLine | None:
    """One line ``qid Q0 docid rank score tag`` of run ``path``, or None after reporting it to ``bad``."""
    where = f"{path}:{lineno}"
    parts = line.split()
    if len(parts) != 6:
        bad(where, f"{RUN_LAYOUT}, got {len(parts)}", RUN_LAYOUT)
        return None
    qid, _, docid, rank, score, _ = parts
    try:
        score_value = float(score)
    except ValueError:
        bad(where, f"score {score!r} is not a number", "a score that is not a number")
        return None
    if not math.isfinite(score_value):
        bad(where, f"score {score!r} is not a finite number", "a score that is not a finite number")
        return None
    try:
        rank_value = int(rank)
    except ValueError:
        bad(where, f"rank {rank!r} is not an integer", "a rank that is not an integer")
        return None
    return RunLine(qid, docid, rank_value, score_value, lineno)


class RunFile:
    """A TREC run, read a query at a time. Opening it reads the file once for where each query's lines are: each
    stretch of consecutive lines of one query (one stretch a query in a run written a query at a time), held as
    four numbers, not the lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        codes: dict[str, int] = {}
        self._code, self._count = array("i"), array("i")
        self._offset, self._lineno = array("q"), array("q")
        offset = 0
        with path.open("rb") as f:
            for lineno, raw in enumerate(f, start=1):
                start, offset = offset, offset + len(raw)
                line = decoded(raw, path, lineno)
                if not line.strip():
                    continue
                code = codes.setdefault(line.split(None, 1)[0], len(codes))
                if self._code and self._code[-1] == code:
                    self._count[-1] += 1
                else:
                    for values, value in ((self._code, code), (self._count, 1), (self._offset, start)):
                        values.append(value)
                    self._lineno.append(lineno)
        self.qids = list(codes)
        """The run's query ids, in the order of their first line."""

    def queries(self, bad: BadInput) -> Iterator[tuple[str, list[RunLine]]]:
        """Each query's lines (bad ones reported to ``bad``), sorted by score, descending (ties: rank); queries in
        the order of their first line."""
        codes = np.frombuffer(self._code, dtype=np.int32)
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(len(self.qids) + 1))
        with self.path.open("rb") as f:
            for code, qid in enumerate(self.qids):
                lines: list[RunLine] = []
                for stretch in order[bounds[code] : bounds[code + 1]]:
                    f.seek(self._offset[stretch])
                    lineno, left = self._lineno[stretch], self._count[stretch]
                    while left:
                        line = decoded(f.readline(), self.path, lineno)
                        if line.strip():
                            left -= 1
                            if (parsed := parse_run_line(line, lineno, self.path, bad)) is not None:
                                lines.append(parsed)
                        lineno += 1
                lines.sort(key=lambda r: (-r.score, r.rank))
                yield qid, lines


def read_run(path: Path, bad: BadInput) -> Run:
    """Parse a TREC run, whole: lines ``qid Q0 docid rank score tag``, sorted by score (ties: rank) per qid."""
    return dict(RunFile(path).queries(bad))


def text_records(path: Path, fields: TextFields, repair: bool) -> Iterator[TextRecord]:
    """The records of a queries or corpus file (TSV ``id<TAB>[title<TAB>]text``, or JSONL with the keys of
    ``fields``), texts cleaned; a bad one (an empty text too, named at its own line) says why."""
    for record in _text_records(path, fields, repair):
        if record.text is not None and not record.text.strip():
            what = "query" if fields.kind == "qid" else "passage"
            record = TextRecord(
                record.line, record.key, None, f"empty {what} text for {fields.kind} {record.key}", f"empty {what} text"
            )
        yield record


def _text_records(path: Path, fields: TextFields, repair: bool) -> Iterator[TextRecord]:
    if is_jsonl(path):
        for lineno, record in iter_jsonl(path, keep_malformed=True):
            if isinstance(record, Malformed):
                yield TextRecord(lineno, None, None, record.reason, MALFORMED)
                continue
            key, reason = _first_field(record, fields.id_keys)
            if key is None:
                yield TextRecord(lineno, None, None, reason)
                continue
            text, reason = _first_field(record, fields.text_keys)
            if text is not None and not isinstance(text, str):
                text, reason = None, f"the text is {type(text).__name__}, not a string"
            if text is None:
                yield TextRecord(lineno, str(key), None, reason)
            else:
                title = str(record.get("title") or "") if fields.titled else ""
                yield TextRecord(lineno, str(key), passage_text(title, str(text), repair))
        return
    for lineno, line in iter_lines(path):
        parts = line.split("\t") if fields.titled else line.split("\t", 1)
        reason, kind = f"expected '{fields.layout}', got {len(parts)} tab-separated fields", f"not '{fields.layout}'"
        if len(parts) == 1:
            yield TextRecord(lineno, None, None, reason, kind)
        elif len(parts) == 2:
            yield TextRecord(lineno, parts[0].strip(), clean_text(parts[1], repair))
        elif len(parts) == 3:
            yield TextRecord(lineno, parts[0].strip(), passage_text(parts[1], parts[2], repair))
        else:
            yield TextRecord(lineno, parts[0].strip(), None, reason, kind)


def _first_field(record: Any, keys: tuple[str, ...]) -> tuple[Any | None, str]:
    """The value of the first of ``keys`` that ``record`` has, or None and why."""
    if not isinstance(record, dict):
        return None, f"expected a JSON object, got {type(record).__name__}"
    for key in keys:
        if record.get(key) is not None:
            return record[key], ""
    return None, f"missing field {keys[0]!r} (or {', '.join(repr(k) for k in keys[1:])})"


def read_texts(
    path: Path, fields: TextFields, bad: BadInput, repair: bool, needed: set[str] | None, whole: bool = False
) -> dict[str, str]:
    """id -> text of a queries or corpus file, for the ids in ``needed`` only (reading stops once all are found,
    unless ``whole``); all, if ``None``. A repeated id keeps its first text, and a different one is bad input."""
    texts: dict[str, str] = {}
    if needed is not None and not needed:
        return texts
    for record in text_records(path, fields, repair):
        where = f"{path}:{record.line}"
        if record.key is None:
            bad(where, record.reason, record.kind)
        elif needed is not None and record.key not in needed:
            continue
        elif record.text is None:
            bad(where, record.reason, record.kind)
        elif record.key not in texts:
            texts[record.key] = record.text
            if needed is not None and len(texts) == len(needed) and not whole:
                break
        elif texts[record.key] != record.text:
            bad(
                where,
                f"{fields.kind} {record.key} appears twice with different texts",
                f"a {fields.kind} with two texts",
            )
    return texts


def read_queries(path: Path, bad: BadInput, repair: bool, needed: set[str] | None = None) -> dict[str, str]:
    """qid -> query text, for the qids in ``needed`` (all, if ``None``). The whole file is read (a queries file is
    small), so that a qid repeated with another text is found wherever it is."""
    return read_texts(path, QUERY_FIELDS, bad, repair, needed, whole=True)


def read_corpus(path: Path, bad: BadInput, repair: bool, needed: set[str] | None) -> dict[str, str]:
    """docid -> passage text, for the docids in ``needed`` only (reading stops once all are found); all, if ``None``."""
    return read_texts(path, DOC_FIELDS, bad, repair, needed)


def open_corpus(path: Path, bad: BadInput, repair: bool) -> CorpusIndex:
    """The index of corpus ``path`` (built on first use); its lines that are bad wherever they are reported to
    ``bad``."""
    folder = file_index_folder(path, "jsonl" if is_jsonl(path) else "tsv", repair)
    index = open_index(folder, path, text_records(path, DOC_FIELDS, repair))
    try:
        index.replay_bad(bad)
    except InputError:
        index.close()
        raise
    return index


def run_candidates(
    qids: list[str],
    lines: Iterable[tuple[str, list[RunLine]]],
    source: Path,
    queries_path: Path,
    corpus_path: Path,
    bad: BadInput,
    repair: bool,
) -> Iterator[Candidates]:
    """Candidates for each query's run ``lines`` (of queries ``qids``, read from ``source``), with their texts."""
    queries = read_queries(queries_path, bad, repair, needed=set(qids))
    with open_corpus(corpus_path, bad, repair) as corpus:
        for qid, query_lines in lines:
            builder = CandidatesBuilder(bad)
            found = qid in queries
            texts = corpus.get_many([r.docid for r in query_lines], bad) if found else [None] * len(query_lines)
            for r, text in zip(query_lines, texts, strict=True):
                where = f"{source}:{r.lineno}"
                if not found:
                    bad(where, f"qid {qid} not found in {queries_path}", f"qid not found in {queries_path}")
                elif text is None:
                    bad(where, f"docid {r.docid} not found in {corpus_path}", f"docid not found in {corpus_path}")
                else:
                    builder.add(where, qid, queries[qid], r.docid, text, r.score)
            yield from builder.build()
