"""Dense retrieval: passage embeddings (:class:`distill.model.embeddings.Encoder`) in a FAISS inner-product index
(so a score is the cosine similarity of query and passage, in [-1, 1])."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from distill.model.embeddings import Encoder

FAISS_FILE = "index.faiss"


class DenseIndex:
    """A FAISS exact inner-product index of passage embeddings by ``encoder``; row ``i`` is the ``i``-th text it
    was built from."""

    def __init__(self, encoder: Encoder, index: Any) -> None:
        self.encoder = encoder
        self.index = index

    @classmethod
    def build(cls, encoder: Encoder, texts: list[str]) -> DenseIndex:
        import faiss

        index = faiss.IndexFlatIP(encoder.dim)
        index.add(encoder.encode(texts))
        return cls(encoder, index)

    @classmethod
    def load(cls, encoder: Encoder, directory: Path) -> DenseIndex:
        import faiss

        return cls(encoder, faiss.read_index(str(directory / FAISS_FILE)))

    def save(self, directory: Path) -> None:
        import faiss

        faiss.write_index(self.index, str(directory / FAISS_FILE))

    def search(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        """Each query's top ``k`` passages as ``(row, cosine similarity)``, best first."""
        k = min(k, self.index.ntotal)
        if not queries or k == 0:
            return [[] for _ in queries]
        scores, rows = self.index.search(self.encoder.encode(queries), k)  # each (num_queries, k)
        return [
            [(int(r), float(s)) for r, s in zip(row, score, strict=True) if r >= 0]
            for row, score in zip(rows, scores, strict=True)
        ]
