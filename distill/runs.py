"""TREC run files: ``qid Q0 docid rank score tag`` per line."""

from __future__ import annotations

import os
from pathlib import Path

from distill.schema import InputError

Run = dict[str, dict[str, float]]
"""qid -> docid -> score (higher is better)."""


def write_trec_run(path: str | Path, run: Run, tag: str) -> None:
    """Write ``run`` ranked by score (ties by docid), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with tmp.open("w") as f:
        for qid, scores in run.items():
            ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
            for rank, (docid, score) in enumerate(ranked, start=1):
                f.write(f"{qid} Q0 {docid} {rank} {score:.6f} {tag}\n")
    tmp.replace(path)


def read_trec_run(path: str | Path) -> Run:
    """Read a TREC run; a malformed line raises :class:`InputError` naming file and line."""
    from distill.loaders._common import BadInput
    from distill.loaders.trec import read_run

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: run file not found")
    return {qid: {line.docid: line.score for line in lines} for qid, lines in read_run(path, BadInput("error")).items()}
