"""The retrieve stage: first-stage retrieval (BM25 or dense) of a corpus, for ``distill teach`` and ``rerank``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from distill.core.counts import counted
from distill.core.schema import InputError
from distill.model.embeddings import DEFAULT_ENCODER, DENSE_BATCH_TOKENS
from distill.retrieval.bm25 import K1, B
from distill.retrieval.retrieve import DEFAULT_K, Method, OutputFormat, RetrievalResult


@dataclass
class RetrieveConfig:
    """Options of ``distill retrieve``: each query's top-k passages of a corpus."""

    corpus: str | None = None
    """Passages (required): TSV ``docid<TAB>text`` or JSONL, or a BEIR folder."""
    queries: str | None = None
    """Queries (TSV ``qid<TAB>text`` or JSONL); default: the BEIR folder's."""
    output: str | None = None
    """The candidates file to write (required)."""
    method: Method = "bm25"
    """``bm25`` (bm25s: Lucene's BM25 formula, English stop words, Snowball stemming) or ``dense``."""
    k1: float = K1
    """BM25: term-frequency saturation (Pyserini's default; Lucene's own is 1.2)."""
    b: float = B
    """BM25: length normalisation, 0 to 1 (Pyserini's default; Lucene's own is 0.75)."""
    encoder: str = DEFAULT_ENCODER
    """Dense: the encoder (alias, folder or hub id)."""
    k: int = DEFAULT_K
    """Passages per query."""
    index: str | None = None
    """The index folder, reused while corpus and settings match (default: beside the output; for an output that is a
    device or a pipe, such as /dev/stdout, in the cache: $CIS_DISTILL_CACHE/indexes)."""
    format: OutputFormat = "trec"
    """``trec`` (a TREC run) or ``rank_llm`` (self-contained JSON with the texts)."""
    device: str = "cpu"
    """Dense: ``cpu``, ``cuda[:N]`` or ``auto`` (a GPU where torch sees one)."""
    max_batch_tokens: int = DENSE_BATCH_TOKENS
    """Dense: padded tokens per batch."""

    def __post_init__(self) -> None:
        if self.corpus is None or self.output is None:
            raise InputError("retrieve: corpus and output are required")
        if self.k1 < 0:
            raise InputError(f"retrieve: k1 must be at least 0, got {self.k1}")
        if not 0 <= self.b <= 1:
            raise InputError(f"retrieve: b must be between 0 and 1, got {self.b}")
        if self.max_batch_tokens < 1:
            raise InputError(f"retrieve: max_batch_tokens must be positive, got {self.max_batch_tokens}")


@dataclass(frozen=True)
class RetrieveReport:
    result: RetrievalResult
    method: str
    output: str

    def format(self) -> str:
        r = self.result
        pairs = sum(map(len, r.run.values()))
        return (
            f"{'reused' if r.reused_index else 'built'} the {self.method} index {r.index_dir} "
            f"({counted(r.num_docs, 'passage')})\n"
            f"wrote {self.output}: {counted(len(r.run), 'query', 'queries')}, {counted(pairs, 'pair')}, "
            f"{counted(r.num_queries - len(r.run), 'query', 'queries')} without a hit"
        )


def retrieve(cfg: RetrieveConfig) -> RetrieveReport:
    from distill.core.path_checks import input_path, output_file, output_folder
    from distill.retrieval.retrieve import retrieve as run_retrieval

    # Before any index is built or encoder loaded: the output and the index (a cache, read and written) are no input
    # nor inside one, and the output is not inside the index.
    inputs = [("corpus", input_path(cfg.corpus, "retrieve", "corpus"))]
    if cfg.queries:
        inputs.append(("queries", input_path(cfg.queries, "retrieve", "queries", "file")))
    if cfg.method == "dense" and Path(cfg.encoder).exists():
        inputs.append(("encoder", cfg.encoder))
    if cfg.index:
        output_folder(cfg.index, "retrieve", "index", inputs)
    output_file(cfg.output, "retrieve", "output", [*inputs, ("index", cfg.index)])
    device = cfg.device
    if cfg.method == "dense":  # this machine has it, before the encoder loads
        from distill.serving.hardware import serving_device

        try:
            device = serving_device(cfg.device)
        except InputError as e:
            raise InputError(f"retrieve: {e}") from None
    result = run_retrieval(
        cfg.corpus,
        cfg.queries,
        cfg.output,
        cfg.method,
        k=cfg.k,
        index_dir=cfg.index,
        encoder=cfg.encoder,
        device=device,
        max_batch_tokens=cfg.max_batch_tokens,
        output_format=cfg.format,
        k1=cfg.k1,
        b=cfg.b,
    )
    return RetrieveReport(result, cfg.method, cfg.output)
