"""TREC qrels: ``qid iteration docid grade`` per line."""

from __future__ import annotations

from pathlib import Path

from distill.core.schema import InputError, Qrels


def load_qrels(path: Path) -> Qrels:
    qrels: Qrels = {}
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 4:
                raise InputError(f"{path}:{lineno}: expected 'qid iteration docid grade', got {line.strip()!r}")
            qid, _, docid, grade = parts
            try:
                qrels.setdefault(qid, {})[docid] = int(grade)
            except ValueError:
                raise InputError(f"{path}:{lineno}: relevance grade {grade!r} is not an integer") from None
    return qrels
