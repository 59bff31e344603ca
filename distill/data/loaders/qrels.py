"""TREC qrels: ``qid iteration docid grade`` per line."""

from __future__ import annotations

from pathlib import Path

from distill.core.schema import InputError, MissingFileError, Qrels, join_qrels
from distill.data.loaders._common import decoded
from distill.data.loaders.irds import irds_qrels, is_irds


def load_qrels(path: Path) -> Qrels:
    """The judgements of one TREC qrels file; a pair judged twice with the same grade is judged once.

    Raises:
        MissingFileError: no file at ``path``.
        InputError: a line that is not UTF-8 or not ``qid iteration docid grade`` with an integer grade, or a pair
            judged twice with different grades (naming the file and line).
    """
    if not path.is_file():
        raise MissingFileError(f"{path}: no such qrels file" + (" (a folder)" if path.is_dir() else ""))
    qrels: Qrels = {}
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            line = decoded(raw, path, lineno)
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 4:
                raise InputError(f"{path}:{lineno}: expected 'qid iteration docid grade', got {line.strip()!r}")
            qid, _, docid, grade = parts
            try:
                value = int(grade)
            except ValueError:
                raise InputError(f"{path}:{lineno}: relevance grade {grade!r} is not an integer") from None
            judge(qrels, qid, docid, value, f"{path}:{lineno}")
    return qrels


def judge(qrels: Qrels, qid: str, docid: str, grade: int, where: str) -> bool:
    """Add the judgement of line ``where`` (``file:line``) to ``qrels``: False where the pair was judged so before.

    Raises:
        InputError: the pair was judged another grade before.
    """
    judged = qrels.setdefault(qid, {})
    if docid not in judged:
        judged[docid] = grade
        return True
    if judged[docid] != grade:
        raise InputError(f"{where}: ({qid}, {docid}) is judged {grade} here and {judged[docid]} on an earlier line")
    return False


def read_qrels(source: str | Path | list[str | Path]) -> Qrels:
    """The judgements of ``source``: a TREC qrels file, an ir_datasets id (``irds:<id>``, whose qrels ir_datasets
    reads), or a list of these joined (the first to judge a pair wins), such as the qrels of two TREC years.

    Raises:
        InputError: a malformed line (naming the file and line), an unknown ir_datasets id, or an ir_datasets
            dataset without qrels.
    """
    parts = []
    for one in qrels_sources(source):
        if not is_irds(one):
            parts.append(load_qrels(Path(one)))
        elif not (judged := irds_qrels(str(one))):
            raise InputError(f"{one}: the ir_datasets dataset has no qrels")
        else:
            parts.append(judged)
    return join_qrels(parts)


def qrels_sources(source: str | Path | list[str | Path] | None) -> list[str | Path]:
    """The files and ``irds:`` ids of a :func:`read_qrels` source, as a list (none for None)."""
    return [] if source is None else list(source) if isinstance(source, list) else [source]


def qrels_files(source: str | Path | list[str | Path] | None) -> list[str | Path]:
    """The files that a :func:`read_qrels` source names (its ``irds:`` ids left out), to check before any work."""
    return [one for one in qrels_sources(source) if not is_irds(one)]
