"""The retrieve stage: a corpus and queries in, each query's top-k passages out, as the candidates
``distill teach`` and ``distill rerank`` read (a TREC run, or a self-contained rank_llm JSON)."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

from distill.core.output_files import write_whole, written_in_place
from distill.core.schema import InputError
from distill.data.loaders._common import BadInput, id_fault
from distill.data.loaders.beir import is_beir_dir
from distill.data.loaders.trec import check_file, read_corpus, read_queries
from distill.eval.trec_runs import Run, write_trec_run
from distill.model.embeddings import DEFAULT_ENCODER, DENSE_BATCH_TOKENS, Encoder
from distill.model.resolver import cache_home
from distill.retrieval import bm25
from distill.retrieval.dense import DenseIndex
from distill.retrieval.index_cache import check_index_folder, index_key, load_or_build

Method = Literal["bm25", "dense"]
OutputFormat = Literal["trec", "rank_llm"]
METHODS: tuple[Method, ...] = ("bm25", "dense")
OUTPUT_FORMATS: tuple[OutputFormat, ...] = ("trec", "rank_llm")
DEFAULT_K = 100
"""Passages retrieved per query."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetrievalResult:
    run: Run
    """qid -> docid -> score, for the queries with at least one hit (BM25 score, or cosine similarity)."""
    num_queries: int
    num_docs: int
    index_dir: Path
    reused_index: bool
    """Whether the index was loaded from ``index_dir`` rather than built."""


def input_files(corpus: Path, queries: Path | None) -> tuple[Path, Path]:
    """The corpus and queries files: a BEIR folder's ``corpus.jsonl`` and (unless ``queries`` is given)
    ``queries.jsonl``, or the files as given."""
    if corpus.is_dir():
        if not is_beir_dir(corpus):
            raise InputError(f"{corpus}: a corpus folder must be a BEIR folder with corpus.jsonl and queries.jsonl")
        return corpus / "corpus.jsonl", queries or corpus / "queries.jsonl"
    if queries is None:
        raise InputError(f"{corpus}: a corpus file needs --queries (a BEIR folder brings its own)")
    return corpus, queries


def default_index_dir(output: Path, corpus: Path, method: Method) -> Path:
    """``<output folder>/<output stem>.<method>-index``; for an output written in place (``/dev/stdout``, a pipe:
    :func:`~distill.core.output_files.written_in_place`), whose folder is no place for it,
    ``$CIS_DISTILL_CACHE/indexes/<corpus stem>-<its path's digest>.<method>-index``."""
    if not written_in_place(output):
        return output.parent / f"{output.stem}.{method}-index"
    digest = hashlib.sha1(str(corpus.resolve()).encode()).hexdigest()[:12]
    return cache_home() / "indexes" / f"{corpus.stem}-{digest}.{method}-index"


def retrieve(
    corpus: str | Path,
    queries: str | Path | None,
    output: str | Path,
    method: Method = "bm25",
    *,
    k: int = DEFAULT_K,
    index_dir: str | Path | None = None,
    encoder: str = DEFAULT_ENCODER,
    device: str = "cpu",
    max_batch_tokens: int = DENSE_BATCH_TOKENS,
    output_format: OutputFormat = "trec",
    repair_mojibake: bool = True,
    k1: float = bm25.K1,
    b: float = bm25.B,
) -> RetrievalResult:
    """Retrieve each query's top ``k`` passages of ``corpus`` and write them to ``output``.

    Args:
        corpus: TSV ``docid<TAB>[title<TAB>]text`` or JSONL (see :mod:`distill.data.loaders.trec`), or a BEIR folder.
        queries: TSV ``qid<TAB>text`` or JSONL; ``None`` for a BEIR folder's own ``queries.jsonl``.
        output: the TREC run (``output_format="trec"``) or rank_llm JSON (``"rank_llm"``) to write.
        method: ``bm25`` (:mod:`.bm25`) or ``dense`` (:mod:`.dense`).
        k: passages per query.
        index_dir: where the index is saved and looked for (default :func:`default_index_dir`).
        encoder: for ``dense``: the encoder model, as :func:`distill.model.resolver.resolve_model` resolves it.
        device: for ``dense``: ``cpu`` or ``cuda[:N]``.
        max_batch_tokens: for ``dense``: padded tokens per forward pass.
        output_format: ``trec`` or ``rank_llm``.
        repair_mojibake: undo UTF-8-read-as-Latin-1 damage in all texts, as the loaders do.
        k1: for ``bm25``: its term-frequency saturation.
        b: for ``bm25``: its length normalisation (0 to 1).
    """
    if method not in METHODS:
        raise InputError(f"--method: unknown method {method!r}; choose from {', '.join(METHODS)}")
    if output_format not in OUTPUT_FORMATS:
        raise InputError(f"--format: unknown format {output_format!r}; choose from {', '.join(OUTPUT_FORMATS)}")
    if k < 1:
        raise InputError(f"--k: must be positive, got {k}")
    output = Path(output)
    corpus_path, queries_path = input_files(Path(corpus), Path(queries) if queries else None)
    check_file(corpus_path, "corpus")
    check_file(queries_path, "queries")
    bad = BadInput("error")
    query_texts = require_texts(queries_path, "query", read_queries(queries_path, bad, repair_mojibake))
    index_dir = Path(index_dir) if index_dir else default_index_dir(output, corpus_path, method)
    check_index_folder(index_dir)  # before an encoder loads: a folder that is no index is never replaced

    if method == "bm25":
        settings = bm25.settings(k1, b)
        build, load = partial(bm25.BM25Index.build, k1=k1, b=b), bm25.BM25Index.load
    else:
        model = Encoder(encoder, device, max_batch_tokens)
        settings = model.settings()
        build, load = partial(DenseIndex.build, model), partial(DenseIndex.load, model)
    settings = {**settings, "repair_mojibake": repair_mojibake}

    def build_index() -> tuple[bm25.BM25Index | DenseIndex, list[str]]:
        texts = require_texts(corpus_path, "passage", read_corpus(corpus_path, bad, repair_mojibake, needed=None))
        return build(list(texts.values())), list(texts)

    index, docids, reused = load_or_build(index_dir, index_key(corpus_path, settings), settings, load, build_index)
    hits = index.search(list(query_texts.values()), k)
    log.info("%s index %s: %s", method, index_dir, "reused" if reused else "built")
    run = {q: {docids[row]: score for row, score in found} for q, found in zip(query_texts, hits, strict=True) if found}
    if output_format == "trec":
        write_trec_run(output, run, tag=f"distill-{method}")
    else:
        needed = {docid for scores in run.values() for docid in scores}
        write_rank_llm(output, run, query_texts, read_corpus(corpus_path, bad, repair_mojibake, needed))
    return RetrievalResult(run, len(query_texts), len(docids), index_dir, reused)


def require_texts(path: Path, kind: str, texts: dict[str, str]) -> dict[str, str]:
    """``texts`` (id -> text), checked to be there and under ids a run can hold, as ``distill teach``'s loaders
    require (an empty text is a bad record of its file's line, :func:`~distill.data.loaders.trec.text_records`)."""
    if not texts:
        raise InputError(f"{path}: no {kind} texts")
    id_name = "qid" if kind == "query" else "docid"
    if fault := next(filter(None, (id_fault(id_name, key) for key in texts)), None):
        raise InputError(f"{path}: {fault}")
    return texts


def write_rank_llm(path: Path, run: Run, queries: dict[str, str], passages: dict[str, str]) -> None:
    """Write ``run`` as rank_llm candidates (``[{query, hits: [{qid, docid, content, rank, score}]}]``), whole
    (:func:`distill.core.output_files.write_whole`).

    Hits are ranked by score (ties by docid), as :func:`distill.eval.trec_runs.write_trec_run` ranks them.
    """
    entries = []
    for qid, scores in run.items():
        ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
        hits = [
            {"qid": qid, "docid": docid, "content": passages[docid], "rank": rank, "score": score}
            for rank, (docid, score) in enumerate(ranked, start=1)
        ]
        entries.append({"query": queries[qid], "hits": hits})
    write_whole(path, json.dumps(entries, ensure_ascii=False))
