"""What every loader shares: the bad-input policy, text repair, and JSON read a record at a time."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from distill.core.schema import Candidates, InputError, Passage, Query, text_fault

OnBadInput = Literal["error", "skip"]


class BadInput:
    """Applies the ``on_bad_input`` policy: raise :class:`InputError`, or count a skip.

    ``where`` names the place (``file:line`` or ``file: entry [i]``), ``reason`` the
    problem in a few words, and ``kind`` the same without the record's own values (its ids, its text), where the
    reason has them: skips are counted by kind, so that a thousand duplicates count as one reason.
    """

    SKIP_HINT = "--on_bad_input skip (on_bad_input: skip in YAML) skips and counts such records"

    def __init__(self, policy: OnBadInput) -> None:
        if policy not in ("error", "skip"):
            raise ValueError(f"on_bad_input must be 'error' or 'skip', not {policy!r}")
        self.policy = policy
        self.skipped: Counter[str] = Counter()

    def __call__(self, where: str, reason: str, kind: str | None = None) -> None:
        if self.policy == "error":
            raise InputError(f"{where}: {reason} ({self.SKIP_HINT})")
        self.skipped[kind or reason] += 1


def skip_summary(skipped: Mapping[str, int], shown: int = 8) -> str:
    """``"N x reason; ..."`` of skipped records counted by kind, the most frequent first; past ``shown`` kinds, how
    many more."""
    ranked = sorted(skipped.items(), key=lambda item: -item[1])
    parts = [f"{n} x {reason}" for reason, n in ranked[:shown]]
    if len(ranked) > shown:
        rest = sum(n for _, n in ranked[shown:])
        parts.append(f"{rest} more, of {len(ranked) - shown} other kind(s)")
    return "; ".join(parts)


@dataclass(frozen=True)
class TextRecord:
    """One line of a queries or corpus file. ``key`` (the query's or passage's id) is None where the line is bad
    wherever it is, ``text`` None where it is bad only where its key is needed; ``reason`` says why."""

    line: int
    key: str | None
    text: str | None
    reason: str = ""
    kind: str | None = None
    """The reason without the record's own values, where it has them (:class:`BadInput`)."""


def repair_mojibake(text: str) -> str:
    """Undo UTF-8 read as Latin-1 (MS MARCO's ``â\\x80\\x99``); keep ``text`` where that fails."""
    try:
        return text.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return text


def clean_text(text: str, repair: bool) -> str:
    return (repair_mojibake(text) if repair else text).strip()


def decoded(raw: bytes, path: Path, lineno: int) -> str:
    """Line ``lineno`` of ``path`` as text, without its line end (nor, on line 1, a UTF-8 byte order mark, which
    some Windows editors write first).

    Raises:
        InputError: it is not UTF-8.
    """
    try:
        return raw.decode("utf-8-sig" if lineno == 1 else "utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start})") from None


MALFORMED = "malformed JSON"
"""The kind of a skipped line that is no JSON (:class:`BadInput`)."""


@dataclass(frozen=True)
class Malformed:
    """A line of a JSON-lines file that is no JSON: the column and the decoder's message."""

    column: int
    message: str

    @property
    def reason(self) -> str:
        return f"{MALFORMED} at column {self.column}: {self.message}"


def iter_jsonl(path: Path, keep_malformed: bool = False) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, record)`` for each non-blank line of a JSON-lines file; with ``keep_malformed``, a line
    that is no JSON as a :class:`Malformed` record (the lines are independent: the others still read).

    Raises:
        InputError: a line is not UTF-8, or (without ``keep_malformed``) not JSON, naming the line.
    """
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            line = decoded(raw, path, lineno)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                if not keep_malformed:
                    raise InputError(f"{path}:{lineno}:{e.colno}: {MALFORMED}: {e.msg}") from None
                record = Malformed(e.colno, e.msg)
            yield lineno, record


LIST_READ_CHARS = 1 << 20
"""Characters read at a time from a JSON list (more where one element is longer)."""
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_CUT = 64
"""A decoding error this close to the end of what was read may be the end of the window, not of the element."""


class _JsonWindow:
    """The part of a JSON file not yet decoded, read as needed; positions in it map to the file's lines and
    columns."""

    def __init__(self, f: Any, path: Path) -> None:
        self.f, self.path = f, path
        self.buf, self.pos, self.eof = "", 0, False
        self.line0, self.col0 = 1, 1
        """Line and column of ``buf[0]`` in the file."""

    def read(self, chars: int = LIST_READ_CHARS) -> bool:
        """Drop what is decoded, then read up to ``chars`` more characters; False at the end of the file."""
        done = self.buf[: self.pos]
        if newlines := done.count("\n"):
            self.line0, self.col0 = self.line0 + newlines, len(done) - done.rfind("\n")
        else:
            self.col0 += len(done)
        chunk = self.f.read(chars)
        self.buf, self.pos, self.eof = self.buf[self.pos :] + chunk, 0, not chunk
        return bool(chunk)

    def where(self, i: int) -> str:
        before = self.buf[:i]
        newlines = before.count("\n")
        column = i - before.rfind("\n") if newlines else self.col0 + i
        return f"{self.path}:{self.line0 + newlines}:{column}"

    def error(self, i: int, msg: str) -> InputError:
        return InputError(f"{self.where(i)}: malformed JSON: {msg}")

    def next_char(self) -> str:
        """The next character that is not whitespace ('' at the end of the file), left unconsumed."""
        while True:
            self.pos = _WHITESPACE.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self.read():
                return self.buf[self.pos : self.pos + 1]

    def value(self, decoder: json.JSONDecoder) -> Any:
        """The next JSON value, decoded; the window grows while the value runs past it."""
        chars = LIST_READ_CHARS
        self.next_char()
        while True:
            try:
                value, end = decoder.raw_decode(self.buf, self.pos)
                if end < len(self.buf) or self.eof or isinstance(value, (dict, list)):
                    self.pos = end
                    return value
            except json.JSONDecodeError as e:
                cut = e.msg.startswith("Unterminated string") or e.pos >= len(self.buf) - _CUT
                if self.eof or not cut:
                    raise self.error(e.pos, e.msg) from None
            self.read(chars)
            chars *= 2


def iter_json_list(path: Path) -> Iterator[Any]:
    """The elements of the JSON list in ``path``, one at a time, each decoded by the standard library's decoder from
    a window of the file (grown while an element runs past it): the file is never held whole.

    Raises:
        InputError: the file is not a JSON list, or is malformed there (naming its line and column), or not UTF-8.
    """
    decoder = json.JSONDecoder()
    try:
        with path.open(encoding="utf-8-sig") as f:  # a byte order mark first is not JSON's: left out
            window = _JsonWindow(f, path)
            first = window.next_char()
            if first == "{":  # well-formed, perhaps: only not a list
                raise InputError(f"{window.where(window.pos)}: expected a JSON list, got a JSON object")
            if first != "[":
                raise window.error(window.pos, "expected a JSON list")
            window.pos += 1
            if window.next_char() == "]":
                window.pos += 1
            else:
                while True:
                    yield window.value(decoder)
                    c = window.next_char()
                    window.pos += 1
                    if c == "]":
                        break
                    if c != ",":
                        raise window.error(window.pos - 1, "Expecting ',' delimiter")
            if window.next_char():
                raise window.error(window.pos, "Extra data")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def json_entries(path: Path, bad: BadInput | None = None) -> Iterator[tuple[str, Any]]:
    """``(where, entry)`` for each entry of a JSON list (``file: entry [i]``) or JSON-lines file (``file:line``),
    read an entry at a time. A JSON-lines line that is no JSON goes to ``bad`` (skipped and counted, under its
    ``skip``); without ``bad``, or anywhere in a JSON list (whose entries cannot be told apart past it), it raises.

    Raises:
        InputError: the file is malformed, as above.
    """
    if path.suffix != ".jsonl":
        return ((f"{path}: entry [{i}]", entry) for i, entry in enumerate(iter_json_list(path)))
    return _jsonl_entries(path, bad)


def _jsonl_entries(path: Path, bad: BadInput | None) -> Iterator[tuple[str, Any]]:
    for lineno, entry in iter_jsonl(path, keep_malformed=bad is not None):
        if isinstance(entry, Malformed):
            bad(f"{path}:{lineno}:{entry.column}", f"{MALFORMED}: {entry.message}", MALFORMED)
            continue
        yield f"{path}:{lineno}", entry


_ANY_SPACE = re.compile(r"\s")
ID_RULE = "an id must be non-empty, without whitespace (a TREC run field)"


def id_fault(id_name: str, id_value: str) -> str | None:
    """What is wrong with a ``qid`` or ``docid``, naming it; None where nothing is: an id must be non-empty and
    without whitespace (a TREC run's fields are whitespace-separated)."""
    if not id_value or _ANY_SPACE.search(id_value):
        return f"{id_name} {id_value!r}: {ID_RULE}"
    return None


def _pair_part_fault(id_name: str, id_value: str, text_name: str, text: str) -> tuple[str, str] | None:
    """What is wrong with one side of a pair (``docid`` and its ``passage``, or ``qid`` and its ``query``): the
    reason in a few words naming it, and its kind (:class:`BadInput`); None where nothing is. An id must be
    non-empty and without whitespace (a TREC run's fields are whitespace-separated); a text non-empty, and one a
    tokenizer takes (:func:`text_fault`)."""
    if (fault := id_fault(id_name, id_value)) is not None:
        return fault, f"{id_name}: {ID_RULE}"
    if not text:
        return f"empty {text_name} text for {id_name} {id_value}", f"empty {text_name} text"
    if (fault := text_fault(text)) is not None:
        return f"{text_name} of {id_name} {id_value}: {fault}", f"{text_name} text a tokenizer cannot take"
    return None


class CandidatesBuilder:
    """Collects validated candidate lists in input order.

    Drops (or rejects, by policy) empty queries and passages, text no tokenizer takes (:func:`text_fault`), ids that
    a TREC run's whitespace-separated fields cannot hold (empty, or with whitespace) and duplicate (qid, docid)
    pairs; keeps the first occurrence of a duplicate.
    """

    def __init__(self, bad: BadInput) -> None:
        self.bad = bad
        self._by_qid: dict[str, Candidates] = {}
        self._seen: set[tuple[str, str]] = set()

    def add(self, where: str, qid: str, query: str, docid: str, passage: str, score: float) -> None:
        if (fault := _pair_part_fault("docid", docid, "passage", passage)) is not None:
            self.bad(where, *fault)
            return
        cands = self._by_qid.get(qid)
        if cands is None:  # the query's id and text are checked once, with its first pair
            if (fault := _pair_part_fault("qid", qid, "query", query)) is not None:
                self.bad(where, *fault)
                return
        elif cands.query.text != query:
            self.bad(where, f"qid {qid} has two different query texts", "a qid with two different query texts")
            return
        if (qid, docid) in self._seen:
            self.bad(where, f"duplicate (qid, docid) = ({qid}, {docid})", "duplicate (qid, docid)")
            return
        self._seen.add((qid, docid))
        if cands is None:
            cands = self._by_qid[qid] = Candidates(Query(qid, query), [], [])
        cands.passages.append(Passage(docid, passage))
        cands.scores.append(score)

    def build(self) -> list[Candidates]:
        return list(self._by_qid.values())


def require(record: dict[str, Any], key: str, where: str, bad: BadInput) -> Any | None:
    """``record[key]``, or ``None`` after reporting the missing field to ``bad``."""
    if not isinstance(record, dict):
        bad(where, f"expected a JSON object, got {type(record).__name__}")
        return None
    if key not in record or record[key] is None:
        bad(where, f"missing field {key!r}")
        return None
    return record[key]


def require_text(record: dict[str, Any], key: str, where: str, bad: BadInput) -> str | None:
    """``record[key]`` where it is a string, or ``None`` after reporting it missing or not text (a number or an
    object is no passage or query to score)."""
    value = require(record, key, where, bad)
    if value is None or isinstance(value, str):
        return value
    bad(where, f"field {key!r}: expected text, got {type(value).__name__}")
    return None
