"""What every loader shares: the bad-input policy, text repair and JSON reading."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from distill.core.schema import Candidates, InputError, Passage, Query

OnBadInput = Literal["error", "skip"]


class BadInput:
    """Applies the ``on_bad_input`` policy: raise :class:`InputError`, or count a skip.

    ``where`` names the place (``file:line`` or ``file: entry [i]``), ``reason`` the
    problem in a few words; skips are counted by reason.
    """

    SKIP_HINT = "--on_bad_input skip (on_bad_input: skip in YAML) skips and counts such records"

    def __init__(self, policy: OnBadInput) -> None:
        if policy not in ("error", "skip"):
            raise ValueError(f"on_bad_input must be 'error' or 'skip', not {policy!r}")
        self.policy = policy
        self.skipped: Counter[str] = Counter()

    def __call__(self, where: str, reason: str) -> None:
        if self.policy == "error":
            raise InputError(f"{where}: {reason} ({self.SKIP_HINT})")
        self.skipped[reason] += 1


def repair_mojibake(text: str) -> str:
    """Undo UTF-8 read as Latin-1 (MS MARCO's ``â\\x80\\x99``); keep ``text`` where that fails."""
    try:
        return text.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return text


def clean_text(text: str, repair: bool) -> str:
    return (repair_mojibake(text) if repair else text).strip()


def read_json(path: Path) -> Any:
    """Parse a JSON file; a syntax error names the file, line and column."""
    try:
        with path.open(encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}:{e.colno}: malformed JSON: {e.msg}") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def iter_jsonl(path: Path):
    """Yield ``(line_number, record)`` for each non-blank line of a JSON-lines file."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{lineno}:{e.colno}: malformed JSON: {e.msg}") from None


class CandidatesBuilder:
    """Collects validated candidate lists in input order.

    Drops (or rejects, by policy) empty queries, empty passages and duplicate
    (qid, docid) pairs; keeps the first occurrence of a duplicate.
    """

    def __init__(self, bad: BadInput) -> None:
        self.bad = bad
        self._by_qid: dict[str, Candidates] = {}
        self._seen: set[tuple[str, str]] = set()

    def add(self, where: str, qid: str, query: str, docid: str, passage: str, score: float) -> None:
        if not query:
            self.bad(where, f"empty query text for qid {qid}")
            return
        if not passage:
            self.bad(where, f"empty passage text for docid {docid}")
            return
        if (qid, docid) in self._seen:
            self.bad(where, f"duplicate (qid, docid) = ({qid}, {docid})")
            return
        self._seen.add((qid, docid))
        cands = self._by_qid.get(qid)
        if cands is None:
            cands = self._by_qid[qid] = Candidates(Query(qid, query), [], [])
        elif cands.query.text != query:
            self.bad(where, f"qid {qid} has two different query texts")
            return
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
