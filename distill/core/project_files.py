"""Where the project's own files are, in one place: the checkout and the shipped data that some options default to.

In a checkout, :data:`PROJECT` is the folder holding ``data/``, ``configs/`` and ``checkpoints/``. An installed wheel
has no ``data/``: there, set ``CIS_DISTILL_DATA`` to a copy of it, or pass the option that the default fills (a
missing default is then one line naming the option and the path, :func:`shipped`).
"""

from __future__ import annotations

import os
from pathlib import Path

from distill.core.schema import MissingFileError

PROJECT = Path(__file__).resolve().parents[2]
"""The checkout's root (in an installed wheel: the site-packages folder, which has no ``data/``)."""
DATA = Path(os.environ.get("CIS_DISTILL_DATA") or PROJECT / "data")
"""The shipped data: TREC DL19, DL21 and DL22 BM25 candidates with qrels, and the committed teacher labels."""

DL19 = DATA / "trec-dl19"
"""TREC DL19 (the project's test set): the default parity pairs of an export and the default ``distill bench``
input."""
DL21 = DATA / "trec-dl21"
"""TREC DL21: the quality gate's ranking set for a student without a card."""
DL22 = DATA / "trec-dl22"
CANDIDATES = "bm25_top100.json"
"""Each TREC folder's BM25 top-100 candidates."""
QRELS = "qrels.txt"
"""Each judged TREC folder's relevance judgements."""
CALIBRATION_INPUTS = (str(DL21 / CANDIDATES), str(DL22 / CANDIDATES))
"""The int8 calibration pairs' default: DL21 and DL22 candidates (never DL19, the test set)."""


def qrels_beside(source: str | Path) -> str | None:
    """The :data:`QRELS` beside the candidates file ``source``, if there is one (as the shipped data keep them)."""
    beside = Path(source).parent / QRELS
    return str(beside) if Path(source).is_file() and beside.is_file() else None


def shipped(path: str | Path, option: str) -> str:
    """``path``, a default in the shipped data, checked: where it is not there (an installed wheel has no ``data/``),
    one line naming the option that replaces it.

    Raises:
        MissingFileError: ``<option>: the default <path> is not here ...``.
    """
    if not Path(path).exists():
        raise MissingFileError(
            f"{option}: the default {path} is not here (an installed wheel has no data/): give {option}, or set "
            "CIS_DISTILL_DATA to a copy of the project's data/"
        )
    return str(path)
