"""ir_datasets datasets, named ``irds:<dataset id>`` (e.g. ``irds:msmarco-passage/trec-dl-2019/judged``).

A query's candidates are its top ``depth`` entries of the dataset's ``scoreddocs`` (its official
first-stage run, e.g. the BM25 top-1000 of TREC DL), by score, descending (ties: file order);
queries come in the order of their first scoreddoc. Query and passage texts are each record's
``default_text()``; passages are looked up in the dataset's ``docs_store()``, or, for a dataset
whose docs have no store, in an index of its ``docs_iter()`` built once in the cache (:mod:`.corpus_index`).
Candidates are read a query at a time (:func:`stream_irds`); the dataset's qrels come along where it has them.

ir_datasets downloads a dataset's files on first use, into ``$IR_DATASETS_HOME`` (default ``~/.ir_datasets``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Any

from distill.core.schema import Candidates, InputError, Qrels
from distill.data.loaders._common import BadInput, CandidatesBuilder, TextRecord, clean_text
from distill.data.loaders.corpus_index import index_folder, open_index

PREFIX = "irds:"
DEFAULT_DEPTH = 100


def is_irds(path: object) -> bool:
    return isinstance(path, str) and path.startswith(PREFIX)


CANDIDATE_PARTS = ("scoreddocs", "queries", "docs")
"""What a dataset needs to give candidates."""
_PART_NAMES = {"scoreddocs": "scoreddocs (a first-stage run to take candidates from)"}


def open_dataset(spec: str, parts: tuple[str, ...] = CANDIDATE_PARTS) -> Any:
    """The ir_datasets dataset named by ``spec`` (``irds:<id>``), checked to have ``parts`` (``queries``, ``docs``,
    ``scoreddocs``, ``qrels``: ir_datasets' ``has_<part>()``)."""
    import ir_datasets

    dataset_id = spec[len(PREFIX) :]
    try:
        dataset = ir_datasets.load(dataset_id)
    except KeyError:
        raise InputError(f"{spec}: unknown ir_datasets id {dataset_id!r}") from None
    for part in parts:
        if not getattr(dataset, f"has_{part}")():
            raise InputError(f"{spec}: ir_datasets dataset {dataset_id!r} has no {_PART_NAMES.get(part, part)}")
    return dataset


def unreadable(spec: str, error: OSError | RuntimeError) -> InputError:
    """Why ir_datasets could not read (or download) the files of ``spec``, in one line."""
    first_line = str(error).splitlines()[0] if str(error) else ""
    return InputError(
        f"{spec}: ir_datasets could not read the dataset's files ({type(error).__name__}: {first_line}); "
        "it downloads them on first use, which needs internet once (or the files under $IR_DATASETS_HOME)"
    )


def scoreddocs_queries(dataset: Any) -> tuple[set[str], bool]:
    """The query ids of the dataset's scoreddocs, and whether each query's entries are together (one pass)."""
    done: set[str] = set()
    current, together = None, True
    for scored in dataset.scoreddocs_iter():
        if scored.query_id != current:
            together = together and scored.query_id not in done
            done.add(scored.query_id)
            current = scored.query_id
    return done, together


def top_scoreddocs(dataset: Any, depth: int, together: bool) -> Iterator[tuple[str, list[tuple[str, float]]]]:
    """Each query's ``depth`` highest-scored ``(docid, score)`` of ``dataset.scoreddocs_iter()``, best first (ties:
    file order), a query at a time in order of first appearance. Where each query's entries are ``together`` (as
    ir_datasets' runs keep them), one query's ``depth`` entries are held at a time; otherwise every query's."""
    heaps: dict[str, list[tuple[float, int, str]]] = {}
    for position, scored in enumerate(dataset.scoreddocs_iter()):
        if together and scored.query_id not in heaps and heaps:
            yield from _best_first(heaps)
            heaps.clear()
        heap = heaps.setdefault(scored.query_id, [])
        entry = (float(scored.score), -position, scored.doc_id)  # on equal scores, the earlier entry ranks higher
        if len(heap) < depth:
            heapq.heappush(heap, entry)
        else:
            heapq.heappushpop(heap, entry)
    yield from _best_first(heaps)


def _best_first(heaps: dict[str, list[tuple[float, int, str]]]) -> Iterator[tuple[str, list[tuple[str, float]]]]:
    for qid, heap in heaps.items():
        yield qid, [(docid, score) for score, _, docid in sorted(heap, reverse=True)]


def docs_lookup(dataset: Any, spec: str, repair: bool) -> Callable[[list[str]], dict[str, str]]:
    """docids -> {docid: text} for those the dataset has: through its docs store, or, where its docs have none,
    through an index of its ``docs_iter()`` built once in the cache (:mod:`.corpus_index`)."""
    try:
        store = dataset.docs_store()
    except (AttributeError, NotImplementedError):
        store = None
    if store is not None:
        return lambda docids: {d: clean_text(doc.default_text(), repair) for d, doc in store.get_many(docids).items()}
    records = (
        TextRecord(i, doc.doc_id, clean_text(doc.default_text(), repair))
        for i, doc in enumerate(dataset.docs_iter(), start=1)
    )
    index = open_index(index_folder("irds", [spec, repair]), spec, records)
    bad = BadInput("error")  # an index of a docs iterator has no bad records
    return lambda docids: {d: t for d, t in zip(docids, index.get_many(docids, bad), strict=True) if t is not None}


def stream_irds(spec: str, depth: int, bad: BadInput, repair: bool) -> Iterator[Candidates]:
    """Candidates of the ir_datasets dataset ``spec`` (each query's top ``depth`` scoreddocs), a query at a time."""
    if depth < 1:
        raise InputError(f"{spec}: depth must be positive, got {depth}")
    dataset = open_dataset(spec)
    try:
        yield from _read(spec, dataset, depth, bad, repair)
    except (OSError, RuntimeError) as e:  # a file missing, or no download source reachable
        raise unreadable(spec, e) from e


def irds_qrels(spec: str) -> Qrels:
    """The qrels of the ir_datasets dataset ``spec`` (none where it has none); the dataset needs nothing else.

    Raises:
        InputError: an unknown id, or files that ir_datasets can neither read nor download.
    """
    dataset = open_dataset(spec, parts=())
    qrels: Qrels = {}
    if dataset.has_qrels():
        try:
            for qrel in dataset.qrels_iter():
                qrels.setdefault(qrel.query_id, {})[qrel.doc_id] = int(qrel.relevance)
        except (OSError, RuntimeError) as e:
            raise unreadable(spec, e) from e
    return qrels


def _read(spec: str, dataset: Any, depth: int, bad: BadInput, repair: bool) -> Iterator[Candidates]:
    """:func:`stream_irds` on the opened ``dataset``, whose files ir_datasets reads (or downloads) here."""
    qids, together = scoreddocs_queries(dataset)
    queries = {q.query_id: clean_text(q.default_text(), repair) for q in dataset.queries_iter() if q.query_id in qids}
    lookup = docs_lookup(dataset, spec, repair)
    for qid, hits in top_scoreddocs(dataset, depth, together):
        passages = lookup([docid for docid, _ in hits])
        builder = CandidatesBuilder(bad)
        for docid, score in hits:
            where = f"{spec}: scoreddoc (qid {qid}, docid {docid})"
            if qid not in queries:
                bad(where, f"qid {qid} not in the dataset's queries", "qid not in the dataset's queries")
            elif docid not in passages:
                bad(where, f"docid {docid} not in the dataset's docs", "docid not in the dataset's docs")
            else:
                builder.add(where, qid, queries[qid], docid, passages[docid], score)
        yield from builder.build()
