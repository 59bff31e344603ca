"""First-stage retrieval (``distill retrieve``): BM25 (:mod:`.bm25`) or dense (:mod:`.dense`) over a corpus,
with the index saved and reused (:mod:`.index_cache`), writing candidates for ``distill teach`` (:mod:`.retrieve`)."""

from distill.retrieval.retrieve import RetrievalResult, retrieve

__all__ = ["RetrievalResult", "retrieve"]
