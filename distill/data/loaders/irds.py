"""ir_datasets datasets, named ``irds:<dataset id>`` (e.g. ``irds:msmarco-passage/trec-dl-2019/judged``).

A query's candidates are its top ``depth`` entries of the dataset's ``scoreddocs`` (its official
first-stage run, e.g. the BM25 top-1000 of TREC DL), by score, descending (ties: file order);
queries come in the order of their first scoreddoc. Query and passage texts are each record's
``default_text()``; passages are looked up in the dataset's ``docs_store()``, or, for a dataset
whose docs have no store, found by reading ``docs_iter()`` once (keeping only the needed ones).
The dataset's qrels come along where it has them.

ir_datasets downloads a dataset's files on first use, into ``$IR_DATASETS_HOME`` (default ``~/.ir_datasets``).
"""

from __future__ import annotations

import heapq
from typing import Any

from distill.core.schema import Candidates, InputError, Qrels
from distill.data.loaders._common import BadInput, CandidatesBuilder, clean_text

PREFIX = "irds:"
DEFAULT_DEPTH = 100


def is_irds(path: object) -> bool:
    return isinstance(path, str) and path.startswith(PREFIX)


def open_dataset(spec: str) -> Any:
    """The ir_datasets dataset named by ``spec`` (``irds:<id>``), checked to have queries, docs and scoreddocs."""
    import ir_datasets

    dataset_id = spec[len(PREFIX) :]
    try:
        dataset = ir_datasets.load(dataset_id)
    except KeyError:
        raise InputError(f"{spec}: unknown ir_datasets id {dataset_id!r}") from None
    for part, present in (
        ("scoreddocs (a first-stage run to take candidates from)", dataset.has_scoreddocs()),
        ("queries", dataset.has_queries()),
        ("docs", dataset.has_docs()),
    ):
        if not present:
            raise InputError(f"{spec}: ir_datasets dataset {dataset_id!r} has no {part}")
    return dataset


def top_scoreddocs(dataset: Any, depth: int) -> dict[str, list[tuple[str, float]]]:
    """qid -> its ``depth`` highest-scored ``(docid, score)`` of ``dataset.scoreddocs_iter()``, best first
    (ties: file order); qids in order of first appearance. Holds at most ``depth`` entries per query."""
    heaps: dict[str, list[tuple[float, int, str]]] = {}
    for position, scored in enumerate(dataset.scoreddocs_iter()):
        heap = heaps.setdefault(scored.query_id, [])
        entry = (float(scored.score), -position, scored.doc_id)  # on equal scores, the earlier entry ranks higher
        if len(heap) < depth:
            heapq.heappush(heap, entry)
        else:
            heapq.heappushpop(heap, entry)
    return {qid: [(docid, score) for score, _, docid in sorted(heap, reverse=True)] for qid, heap in heaps.items()}


def passage_texts(dataset: Any, needed: set[str]) -> dict[str, str]:
    """docid -> text for the docids in ``needed`` that the dataset has: from its docs store, or, where its
    docs have none, from one pass over ``docs_iter()`` that stops once all are found."""
    try:
        store = dataset.docs_store()
    except (AttributeError, NotImplementedError):
        store = None
    if store is not None:
        return {docid: doc.default_text() for docid, doc in store.get_many(needed).items()}
    texts: dict[str, str] = {}
    for doc in dataset.docs_iter():
        if doc.doc_id in needed:
            texts[doc.doc_id] = doc.default_text()
            if len(texts) == len(needed):
                break
    return texts


def load_irds(spec: str, depth: int, bad: BadInput, repair: bool) -> tuple[list[Candidates], Qrels]:
    """Candidates (each query's top ``depth`` scoreddocs) and qrels of the ir_datasets dataset ``spec``."""
    if depth < 1:
        raise InputError(f"{spec}: depth must be positive, got {depth}")
    dataset = open_dataset(spec)
    try:
        return _read(spec, dataset, depth, bad, repair)
    except (OSError, RuntimeError) as e:  # a file missing, or no download source reachable
        first_line = str(e).splitlines()[0] if str(e) else ""
        raise InputError(
            f"{spec}: ir_datasets could not read the dataset's files ({type(e).__name__}: {first_line}); "
            "it downloads them on first use, which needs internet once (or the files under $IR_DATASETS_HOME)"
        ) from e


def _read(spec: str, dataset: Any, depth: int, bad: BadInput, repair: bool) -> tuple[list[Candidates], Qrels]:
    """:func:`load_irds` on the opened ``dataset``, whose files ir_datasets reads (or downloads) here."""
    top = top_scoreddocs(dataset, depth)
    queries = {q.query_id: clean_text(q.default_text(), repair) for q in dataset.queries_iter() if q.query_id in top}
    needed = {docid for hits in top.values() for docid, _ in hits}
    passages = {docid: clean_text(text, repair) for docid, text in passage_texts(dataset, needed).items()}
    builder = CandidatesBuilder(bad)
    for qid, hits in top.items():
        for docid, score in hits:
            where = f"{spec}: scoreddoc (qid {qid}, docid {docid})"
            if qid not in queries:
                bad(where, f"qid {qid} not in the dataset's queries")
            elif docid not in passages:
                bad(where, f"docid {docid} not in the dataset's docs")
            else:
                builder.add(where, qid, queries[qid], docid, passages[docid], score)
    qrels: Qrels = {}
    if dataset.has_qrels():
        for qrel in dataset.qrels_iter():
            qrels.setdefault(qrel.query_id, {})[qrel.doc_id] = int(qrel.relevance)
    return builder.build(), qrels
