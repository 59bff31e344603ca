"""BM25 with the ``bm25s`` library: Lucene's BM25 formula over lower-cased words, English stop words removed,
stemmed with PyStemmer's Snowball English stemmer; ``k1`` and ``b`` at Pyserini's (and Anserini's) defaults, as the
BM25 lists of TREC DL that rank_llm ships were retrieved."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

K1 = 0.9
"""Term-frequency saturation: Pyserini's default (Lucene's own is 1.2, bm25s's 1.5)."""
B = 0.4
"""Length normalisation: Pyserini's default (Lucene's and bm25s's 0.75)."""
VARIANT = "lucene"
STOPWORDS = "en"
STEMMER = "english"


def _bm25s() -> Any:
    """The ``bm25s`` module, with its logger (which it sets to DEBUG on import) back at WARNING."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


def settings(k1: float = K1, b: float = B) -> dict[str, Any]:
    """What the index depends on besides the corpus, for its key."""
    return {
        "method": "bm25",
        "k1": k1,
        "b": b,
        "variant": VARIANT,
        "stopwords": STOPWORDS,
        "stemmer": STEMMER,
        "bm25s": _bm25s().__version__,
    }


def _tokenize(texts: list[str]) -> list[list[str]]:
    import Stemmer

    stemmer = Stemmer.Stemmer(STEMMER)
    return _bm25s().tokenize(texts, stopwords=STOPWORDS, stemmer=stemmer, return_ids=False, show_progress=False)


class BM25Index:
    """A BM25 index of ``num_docs`` passages; row ``i`` is the ``i``-th text it was built from."""

    def __init__(self, model: Any) -> None:
        self.model = model

    @classmethod
    def build(cls, texts: list[str], k1: float = K1, b: float = B) -> BM25Index:
        model = _bm25s().BM25(k1=k1, b=b, method=VARIANT)
        model.index(_tokenize(texts), show_progress=False)
        return cls(model)

    @classmethod
    def load(cls, directory: Path) -> BM25Index:
        return cls(_bm25s().BM25.load(str(directory), show_progress=False))

    def save(self, directory: Path) -> None:
        self.model.save(str(directory), show_progress=False)

    @property
    def num_docs(self) -> int:
        return int(self.model.scores["num_docs"])

    def search(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        """Each query's top ``k`` passages as ``(row, BM25 score)``, best first.

        Passages that share no term with the query (score 0) are left out, so a list may be shorter than ``k``.
        """
        k = min(k, self.num_docs)
        if not queries or k == 0:
            return [[] for _ in queries]
        rows, scores = self.model.retrieve(_tokenize(queries), k=k, show_progress=False)
        return [
            [(int(r), float(s)) for r, s in zip(row, score, strict=True) if s > 0]
            for row, score in zip(np.asarray(rows), np.asarray(scores), strict=True)
        ]
