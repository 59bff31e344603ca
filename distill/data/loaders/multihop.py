"""Multi-hop QA questions, distractor setting: HotpotQA, 2WikiMultihopQA and MuSiQue.

Each question's context paragraphs are its candidates, in the given order (the paragraph at 0-based
position ``k`` has first-stage score ``-k``); its supporting paragraphs are relevant (qrels grade 1),
the others not (grade 0). A question without supporting-paragraph labels (a hidden test set) gets
candidates but no qrels.

Layouts (one JSON list of questions, or JSON lines of one question each), read a question at a time
(:func:`stream_multihop`):

- HotpotQA, 2WikiMultihopQA: ``{"_id" (or "id"), "question", "context": [[title, [sentence, ...]], ...],
  "supporting_facts": [[title, sentence_index], ...]}``, or the Hugging Face ``datasets`` variant with
  ``"context": {"title": [...], "sentences": [[...], ...]}`` and
  ``"supporting_facts": {"title": [...], "sent_id": [...]}``. A paragraph is relevant when its title is
  a supporting fact's title. docid: ``f"{qid}-{k}"``, ``k`` the 0-based paragraph position.
- MuSiQue: ``{"id", "question", "paragraphs": [{"idx", "title", "paragraph_text", "is_supporting"}]}``;
  docid: ``f"{qid}-{idx}"``.

Passage text: ``title + ". " + body``, stripped (just ``body`` for an empty title; an empty body makes an
empty passage, which is bad input). For MuSiQue, ``body`` is ``paragraph_text``. For HotpotQA it is
``"".join(sentences)``: HotpotQA's sentences keep the whitespace that preceded them in the article
(``[" In it, ...", ...]``), so concatenating them restores the paragraph. 2WikiMultihopQA's sentences
have no leading whitespace; for a question where no sentence after a paragraph's first starts with
whitespace, the sentences are joined with ``" "`` instead.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from distill.core.schema import Candidates, Qrels
from distill.data.loaders._common import (
    BadInput,
    CandidatesBuilder,
    clean_text,
    json_entries,
    require,
    require_text,
)

log = logging.getLogger(__name__)


class _Skip(Exception):
    """The question was reported bad (under the "skip" policy) and is left out."""


@dataclass(frozen=True)
class _Paragraph:
    where: str
    docid: str
    title: str
    body: str
    relevant: bool | None  # None: the question has no supporting-paragraph labels


def is_multihop(data: object) -> bool:
    if not (isinstance(data, list) and data and isinstance(data[0], dict)):
        return False
    return "question" in data[0] and ("context" in data[0] or "paragraphs" in data[0])


def is_multihop_file(path: Path) -> bool:
    """Whether ``path`` is a multi-hop QA file (``.json`` list or ``.jsonl`` lines; judged by its first question)."""
    if path.suffix not in (".json", ".jsonl"):
        return False
    first = next(json_entries(path), None)
    return first is not None and is_multihop([first[1]])


def stream_multihop(path: Path, bad: BadInput, repair: bool, qrels: Qrels) -> Iterator[Candidates]:
    """The candidates of a file of multi-hop questions, a question at a time, each question's qrels added to
    ``qrels`` as it is read (and the ids of the questions seen held, to refuse one that comes back)."""
    seen: dict[str, str] = {}
    for where, entry in json_entries(path, bad):
        question = require_text(entry, "question", where, bad)
        if question is None:
            continue
        try:
            qid = str(_field(entry, ("_id", "id"), where, bad))
            if "paragraphs" in entry:
                paragraphs = _musique_paragraphs(entry["paragraphs"], qid, where, bad)
            else:
                paragraphs = _hotpot_paragraphs(_field(entry, ("context",), where, bad), entry, qid, where, bad)
            query = clean_text(question, repair)
            if not query:
                _skip(bad, where, f"empty question text for id {qid}", "empty question text")
            if qid in seen:
                _skip(bad, where, f"qid {qid} already had its candidates at {seen[qid]}", "a qid in two entries")
        except _Skip:
            continue
        seen[qid] = where
        if not paragraphs:
            log.warning("%s: no paragraphs for question %s: nothing to score for it", where, qid)
        builder = CandidatesBuilder(bad)
        for k, p in enumerate(paragraphs):
            builder.add(p.where, qid, query, p.docid, _passage_text(p.title, p.body, repair), float(-k))
            if p.relevant is not None:
                qrels.setdefault(qid, {})[p.docid] = int(p.relevant)
        yield from builder.build()


def _passage_text(title: str, body: str, repair: bool) -> str:
    """``title + ". " + body``; just ``body`` for an empty title, and empty for an empty body."""
    title, body = clean_text(title, repair), clean_text(body, repair)
    return f"{title}. {body}" if title and body else body


def _skip(bad: BadInput, where: str, reason: str, kind: str | None = None) -> NoReturn:
    """Report ``reason`` (of ``kind``: :class:`BadInput`) to ``bad`` (which raises under "error") and leave the
    question out."""
    bad(where, reason, kind)
    raise _Skip


def _field(entry: dict[str, Any], keys: tuple[str, ...], where: str, bad: BadInput) -> Any:
    for key in keys:
        if entry.get(key) is not None:
            return entry[key]
    alternatives = f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""
    _skip(bad, where, f"missing field {keys[0]!r}{alternatives}")


def _musique_paragraphs(paragraphs: Any, qid: str, where: str, bad: BadInput) -> list[_Paragraph]:
    if not isinstance(paragraphs, list):
        _skip(bad, f"{where} paragraphs", f"expected a list, got {type(paragraphs).__name__}")
    labelled = any(isinstance(p, dict) and "is_supporting" in p for p in paragraphs)
    result = []
    for k, p in enumerate(paragraphs):
        p_where = f"{where} paragraph [{k}]"
        idx = require(p, "idx", p_where, bad)
        text = require_text(p, "paragraph_text", p_where, bad) if idx is not None else None
        if text is None:
            continue
        relevant = bool(p.get("is_supporting")) if labelled else None
        result.append(_Paragraph(p_where, f"{qid}-{idx}", str(p.get("title") or ""), text, relevant))
    return result


def _hotpot_paragraphs(context: Any, entry: dict[str, Any], qid: str, where: str, bad: BadInput) -> list[_Paragraph]:
    if isinstance(context, dict):  # Hugging Face datasets: {"title": [...], "sentences": [[...], ...]}
        titles, sentences = context.get("title"), context.get("sentences")
        if not (isinstance(titles, list) and isinstance(sentences, list) and len(titles) == len(sentences)):
            _skip(bad, f"{where} context", "expected {'title': [...], 'sentences': [[...], ...]} of equal lengths")
        context = [list(pair) for pair in zip(titles, sentences, strict=True)]
    elif not isinstance(context, list):
        _skip(bad, f"{where} context", f"expected a list of [title, [sentences]], got {type(context).__name__}")
    pairs: list[tuple[int, str, list[str]]] = []
    for k, item in enumerate(context):
        if not (
            isinstance(item, list | tuple)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], list)
            and all(isinstance(s, str) for s in item[1])
        ):
            bad(f"{where} context [{k}]", "expected [title, [sentence, ...]]")
            continue
        pairs.append((k, item[0], item[1]))
    support = _supporting_titles(entry.get("supporting_facts"), where, bad)
    if support is not None:
        missing = support - {title for _, title, _ in pairs}
        if missing:
            _skip(
                bad,
                f"{where} supporting_facts",
                f"supporting title {sorted(missing)[0]!r} is not in the context",
                "a supporting title not in the context",
            )
    # HotpotQA's sentences carry their leading whitespace; 2WikiMultihopQA's do not.
    sep = "" if any(s[:1].isspace() for _, _, sents in pairs for s in sents[1:]) else " "
    return [
        _Paragraph(
            f"{where} context [{k}]",
            f"{qid}-{k}",
            title,
            sep.join(sents),
            None if support is None else title in support,
        )
        for k, title, sents in pairs
    ]


def _supporting_titles(facts: Any, where: str, bad: BadInput) -> set[str] | None:
    """The titles of the supporting facts; ``None`` where there are none (unlabelled)."""
    if facts is None:
        return None
    if isinstance(facts, dict):  # Hugging Face datasets: {"title": [...], "sent_id": [...]}
        titles = facts.get("title")
        if isinstance(titles, list) and all(isinstance(t, str) for t in titles):
            return set(titles)
    elif isinstance(facts, list) and all(
        isinstance(f, list | tuple) and len(f) == 2 and isinstance(f[0], str) for f in facts
    ):
        return {f[0] for f in facts}
    _skip(bad, f"{where} supporting_facts", "expected [[title, sentence_index], ...]")
