"""The one internal schema for reranking data: queries, passages, candidates and qrels.

Every loader in :mod:`distill.data.loaders` returns a :class:`RerankingData`; every stage reads it.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

EXIT_INTERRUPTED = 128 + 2
"""The exit status of a command stopped by Ctrl-C (SIGINT), as a shell gives it."""


class UserError(Exception):
    """A failure the user can act on: the CLI prints its message on one line (or a short list), no traceback.

    Anything else that escapes a command is a bug and keeps its traceback.
    """

    exit_status = 2
    """The command's exit status."""


class InputError(UserError, ValueError):
    """Bad input: data, options or files. The message names the file and the line, entry, key or field at fault."""


class MissingFileError(InputError, FileNotFoundError):
    """A file or folder the command needs is not there; the message names it."""


class ExistingOutputError(InputError, FileExistsError):
    """An output path holds something the command must not overwrite; the message names it."""


class PeerProcessFailed(UserError):
    """Another process of the same multi-process job failed at a step this one waits on; that process's own error
    (in its log) says why, this one's message where."""

    exit_status = 1


def text_fault(text: str) -> str | None:
    """What keeps a tokenizer (and a JSON answer) from taking ``text``, in a few words: a NUL character or a lone
    UTF-16 surrogate (``"\\ud800"``, which JSON's escapes can spell but UTF-8 cannot); None for text it takes."""
    if "\x00" in text:
        return f"has a NUL character (\\u0000) at character {text.index(chr(0))}; remove it"
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = f"{ord(text[e.start]):04x}"
        return f"has a lone UTF-16 surrogate (\\u{code}) at character {e.start}, which is not valid Unicode"
    return None


@dataclass(frozen=True)
class Query:
    qid: str
    text: str


@dataclass(frozen=True)
class Passage:
    docid: str
    text: str


@dataclass
class Candidates:
    """One query's candidate passages in first-stage rank order.

    ``scores[i]`` is the first-stage score of ``passages[i]`` (higher is better).
    """

    query: Query
    passages: list[Passage]
    scores: list[float]

    @classmethod
    def join(cls, lists: list[Candidates], differing: list[str] | None = None) -> Candidates:
        """One query's candidate ``lists`` (from several inputs) as one: in list order, each docid once (the
        first, with its text), with the first list's query. A docid that a later list gives another passage text
        (real lists differ in whitespace) is appended to ``differing``, where given, for the caller to report."""
        joined = cls(lists[0].query, [], [])
        seen: dict[str, str] = {}
        for cands in lists:
            for passage, score in zip(cands.passages, cands.scores, strict=True):
                if passage.docid not in seen:
                    seen[passage.docid] = passage.text
                    joined.passages.append(passage)
                    joined.scores.append(score)
                elif differing is not None and seen[passage.docid] != passage.text:
                    differing.append(passage.docid)
        return joined


def warn_of_differing_texts(differing: list[str], sources: list[str]) -> None:
    """One warning for the docids that joined ``sources`` give different passage texts (:meth:`Candidates.join`),
    where there are any: the first input's text is the one scored."""
    if differing:
        shown = ", ".join(differing[:3]) + (", ..." if len(differing) > 3 else "")
        log.warning(
            "%d candidate(s) have another passage text in a later input than in the first (%s; of %s): the first "
            "input's text is kept",
            len(differing),
            shown,
            " + ".join(sources),
        )


def same_query(first: tuple[Query, str], other: tuple[Query, str]) -> None:
    """Check that two inputs (each a query and the source it came from) agree on the text of a qid they share.

    Raises:
        InputError: they do not; candidates scored against another input's query text would be wrong.
    """
    (query, source), (again, other_source) = first, other
    if again.text != query.text:
        raise InputError(
            f"qid {query.qid}: {source} and {other_source} give it different query texts "
            f"({query.text!r} and {again.text!r})"
        )


Qrels = dict[str, dict[str, int]]
"""qid -> docid -> graded relevance (0 = judged irrelevant)."""


def join_qrels(parts: list[Qrels]) -> Qrels:
    """Several sources' qrels as one; where two judge the same pair, the earlier part wins."""
    qrels: Qrels = {}
    for part in parts:
        for qid, judged in part.items():
            qrels[qid] = {**judged, **qrels.get(qid, {})}
    return qrels


@dataclass
class RerankingData:
    """Candidate lists for a set of queries, with qrels where the source has them."""

    source: str
    candidates: list[Candidates]
    qrels: Qrels = field(default_factory=dict)
    skipped: Counter[str] = field(default_factory=Counter)
    """Reasons for records skipped under ``on_bad_input="skip"``, counted."""

    @property
    def num_pairs(self) -> int:
        return sum(len(c.passages) for c in self.candidates)

    @classmethod
    def union(cls, parts: list[RerankingData]) -> RerankingData:
        """All parts' candidates: each query's lists joined in part order, each (qid, docid) once (the first).

        First-stage scores keep their part's scale; qrels are joined (the first part wins on a conflict).

        Raises:
            InputError: two parts give a qid different query texts (:func:`same_query`).
        """
        if len(parts) == 1:
            return parts[0]
        by_qid: dict[str, list[Candidates]] = {}
        sources: dict[str, str] = {}
        skipped: Counter[str] = Counter()
        for part in parts:
            for cands in part.candidates:
                lists = by_qid.setdefault(cands.query.qid, [])
                if lists:
                    same_query((lists[0].query, sources[cands.query.qid]), (cands.query, part.source))
                else:
                    sources[cands.query.qid] = part.source
                lists.append(cands)
            skipped.update(part.skipped)
        differing: list[str] = []
        joined = [Candidates.join(lists, differing) for lists in by_qid.values()]
        warn_of_differing_texts(differing, [p.source for p in parts])
        return cls(" + ".join(p.source for p in parts), joined, join_qrels([p.qrels for p in parts]), skipped)

    def first_stage_run(self) -> dict[str, dict[str, float]]:
        """The input ranking as a run: qid -> docid -> ``n, n - 1, ..., 1`` down each query's ``n`` candidates, in
        their order. Equal first-stage scores so keep the input's order (a TREC run's ranks, a list's positions),
        which trec_eval's rule for ties (by docid) would not."""
        return {
            c.query.qid: {p.docid: float(len(c.passages) - i) for i, p in enumerate(c.passages)}
            for c in self.candidates
        }
