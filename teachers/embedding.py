"""A similarity teacher: an embedding model that scores a (query, passage) pair by the cosine of their sentence
embeddings, each text encoded on its own.

The paper's CIS asks a causal LM how much the query changes the passage's likelihood; a sentence-embedding model
trained for retrieval asks how alike the two texts are. A label that sums both (``z(lm.cis_q) + z(st.similarity)``,
see :mod:`distill.data.labels`) is the hybrid of causal and similarity scoring that the paper leaves to future work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from distill.model.embeddings import DENSE_BATCH_TOKENS, Encoder

SIMILARITY = "similarity"
"""The score a similarity teacher writes: the cosine of the query's and the passage's embeddings, in [-1, 1]."""


class SimilarityTeacher:
    """Scores (query, passage) pairs by :data:`SIMILARITY`.

    Args:
        encoder: the embedding model.
    """

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder

    @classmethod
    def load(cls, name: str, device: str = "cpu", max_batch_tokens: int = DENSE_BATCH_TOKENS) -> SimilarityTeacher:
        """The teacher of ``name`` (resolved as :func:`distill.model.resolver.resolve_model` does) on ``device``.

        Raises:
            InputError: ``name`` is a causal LM (:func:`~teachers.teacher.check_encoder`).
        """
        from distill.model.resolver import resolve_model
        from teachers.teacher import check_encoder

        check_encoder(resolve_model(name))
        return cls(Encoder(name, device=device, max_batch_tokens=max_batch_tokens))

    def describe(self) -> dict[str, Any]:
        """What its scores depend on: the weights' identity, the input length and the pooling."""
        settings = self.encoder.settings()
        return {
            "teacher": settings["encoder"],
            "kind": SIMILARITY,
            "max_length": settings["max_length"],
            "pooling": settings["pooling"],
        }

    def similarity(
        self, queries: Sequence[str], passages: Sequence[str], on_batch: Callable[[int], Any] | None = None
    ) -> np.ndarray:
        """``[n]`` float64: the cosine of ``queries[i]``'s and ``passages[i]``'s embeddings. Each distinct text is
        encoded once; ``on_batch(n)`` is called with the pairs done.

        Raises:
            ValueError: ``queries`` and ``passages`` differ in length, or one is a string (not a list of texts).
        """
        if isinstance(queries, str) or isinstance(passages, str):
            raise ValueError("similarity takes a list of queries and a list of passages, not a string")
        if len(queries) != len(passages):
            raise ValueError(f"{len(queries)} queries for {len(passages)} passages: one query a passage")
        distinct_queries = list(dict.fromkeys(queries))
        distinct_passages = list(dict.fromkeys(passages))
        query_vectors = self.encoder.encode(distinct_queries)  # [q, dim], unit rows
        passage_vectors = self.encoder.encode(distinct_passages)  # [p, dim], unit rows
        query_row = {text: i for i, text in enumerate(distinct_queries)}
        passage_row = {text: i for i, text in enumerate(distinct_passages)}
        q = query_vectors[[query_row[text] for text in queries]]
        p = passage_vectors[[passage_row[text] for text in passages]]
        values = np.einsum("nd,nd->n", q.astype(np.float64), p.astype(np.float64))
        if on_batch is not None:
            on_batch(len(values))
        return values
