"""Loaders: each reads one input format into the internal schema (:mod:`distill.core.schema`).

:func:`open_candidates` picks the loader from the input itself, and reads the candidates a query at a time;
:func:`load_candidates` holds them all:

- a directory with ``corpus.jsonl`` and ``queries.jsonl``: BEIR (:mod:`.beir`);
- a JSON list (or JSON-lines file) of ``{query, hits}``: rank_llm (:mod:`.rank_llm`);
- a JSON list (or JSON-lines file) of multi-hop QA questions (HotpotQA, 2Wiki, MuSiQue; distractor
  setting) (:mod:`.multihop`);
- any other file: a TREC run, which needs ``queries`` and ``corpus`` (:mod:`.trec`);
- a string ``irds:<dataset id>``: an ir_datasets dataset's top ``depth`` scoreddocs (:mod:`.irds`).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from distill.core.schema import (
    Candidates,
    InputError,
    Passage,
    Qrels,
    Query,
    RerankingData,
    join_qrels,
    same_query,
    warn_of_differing_texts,
)
from distill.data.loaders._common import BadInput, OnBadInput, json_entries, skip_summary
from distill.data.loaders.beir import is_beir_dir, load_beir
from distill.data.loaders.irds import DEFAULT_DEPTH, irds_qrels, is_irds, stream_irds
from distill.data.loaders.multihop import is_multihop, stream_multihop
from distill.data.loaders.qrels import load_qrels, read_qrels
from distill.data.loaders.rank_llm import is_rank_llm, stream_rank_llm
from distill.data.loaders.trec import stream_trec_run

__all__ = [
    "CandidateStream",
    "RunWithoutTexts",
    "join_streams",
    "load_candidates",
    "load_qrels",
    "open_candidates",
    "read_qrels",
    "skip_summary",
]


class RunWithoutTexts(InputError):
    """The TREC run at ``path`` given without the queries and corpus its texts are in; a command that takes neither
    catches it to say what it takes instead."""

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(f"{path}: a TREC run file needs --queries and --corpus")


@dataclass
class CandidateStream:
    """One input, opened: its candidate lists, a query at a time as they are read, and its qrels."""

    source: str
    candidates: Iterator[Candidates]
    qrels: Qrels
    skipped: Counter[str] = field(default_factory=Counter)
    """Reasons for records skipped under ``on_bad_input="skip"``, counted as the candidates are read."""


COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip")
"""Suffixes of compressed files, which no loader reads."""


def sources_read(inputs: list[str]) -> set[str]:
    """The text sources that ``inputs`` read: ``queries`` and ``corpus`` where one is a TREC run file, ``run`` where
    one is a BEIR folder."""
    paths = [Path(i) for i in inputs if not is_irds(i)]
    read = set()
    if any(p.is_file() and p.suffix not in (".json", ".jsonl") for p in paths):
        read |= {"queries", "corpus"}
    if any(p.is_dir() and is_beir_dir(p) for p in paths):
        read.add("run")
    return read


def check_text_sources(inputs: list[str], where: str, **sources: str | None) -> None:
    """Each of ``sources`` given (``queries``, ``corpus``: read with a TREC run input; ``run``: with a BEIR folder)
    is read by one of ``inputs`` at least (:func:`sources_read`): where none reads it, it would be ignored without a
    word.

    Raises:
        InputError: ``<where>: <option>: <path>: it gives ...``.
    """
    read = sources_read(inputs)
    for key, given in sources.items():
        if given is not None and key not in read:
            reader = "a BEIR folder's candidates" if key == "run" else "a TREC run's texts"
            raise InputError(
                f"{where}: {key}: {given}: it gives {reader}, and no input is one ({', '.join(inputs)}): leave it out"
            )


def load_candidates(path: str | Path, **options: Any) -> RerankingData:
    """Read candidate lists (and qrels, where there are any) from ``path``, whole: :func:`open_candidates`'s
    stream (``options`` are its keyword arguments), held.

    Raises:
        InputError: as :func:`open_candidates`, or no candidates are left.
    """
    stream = open_candidates(path, **options)
    candidates = list(stream.candidates)
    if not candidates:
        raise InputError(f"{path}: no candidates left to score")
    return RerankingData(stream.source, candidates, stream.qrels, stream.skipped)


def open_candidates(
    path: str | Path,
    *,
    queries: str | Path | None = None,
    corpus: str | Path | None = None,
    run: str | Path | None = None,
    qrels: str | Path | list[str | Path] | None = None,
    on_bad_input: OnBadInput = "error",
    repair_mojibake: bool = True,
    depth: int = DEFAULT_DEPTH,
) -> CandidateStream:
    """Open the candidate lists (and qrels, where there are any) of ``path``, to be read a query at a time.

    Args:
        path: a rank_llm or multi-hop JSON file, a TREC run file, a BEIR folder, or ``irds:<ir_datasets id>``.
        queries: for a TREC run, the queries (TSV ``qid<TAB>text`` or JSONL).
        corpus: for a TREC run, the passages (TSV ``docid<TAB>text`` or JSONL).
        run: for a BEIR folder, a TREC run over its corpus; without one, the judged pairs are the candidates.
        qrels: a TREC qrels file, an ``irds:`` id or a list of these (:func:`~.qrels.read_qrels`); overrides qrels
            the source carries itself.
        on_bad_input: ``"error"`` raises :class:`InputError` at the first bad record;
            ``"skip"`` drops it and counts the reason in ``skipped``.
        repair_mojibake: undo UTF-8-read-as-Latin-1 damage (MS MARCO) in all texts.
        depth: for an ``irds:`` input, the candidates per query (its top scoreddocs).

    Raises:
        InputError: the input is missing or of no known layout (on opening); a bad record under ``"error"`` (as
            the candidates are read).

    Every input is read a query at a time (a corpus through its index, :mod:`.corpus_index`); a source's qrels
    that come with its candidates (multi-hop QA) fill ``qrels`` as they are read.
    """
    bad = BadInput(on_bad_input)
    override = read_qrels(qrels) if qrels else None
    if is_irds(path):
        candidates = stream_irds(str(path), depth, bad, repair_mojibake)
        return CandidateStream(str(path), candidates, override or irds_qrels(str(path)), bad.skipped)
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    source_qrels: Qrels = {}
    if path.suffix in COMPRESSED:
        raise InputError(f"{path}: a compressed file: decompress it first (inputs are read as plain UTF-8 text)")
    if path.is_dir():
        if not is_beir_dir(path):
            raise InputError(f"{path}: a directory input must be a BEIR folder with corpus.jsonl and queries.jsonl")
        candidates, source_qrels = load_beir(path, Path(run) if run else None, bad, repair_mojibake)
    elif path.suffix in (".json", ".jsonl"):
        first = [entry for _, entry in islice(json_entries(path, BadInput(bad.policy)), 1)]  # skips not counted twice
        if not first:
            raise InputError(f"{path}: no entries (an empty list): nothing to read")
        if is_rank_llm(first):
            candidates = stream_rank_llm(path, bad, repair_mojibake)
        elif is_multihop(first):
            candidates = stream_multihop(path, bad, repair_mojibake, source_qrels)
        else:
            raise InputError(
                f"{path}: unknown JSON layout: expected a list of rank_llm {{query, hits}} entries "
                "or of multi-hop QA questions (HotpotQA/2Wiki 'context', MuSiQue 'paragraphs')"
            )
    else:
        if queries is None or corpus is None:
            raise RunWithoutTexts(path)
        candidates = stream_trec_run(path, Path(queries), Path(corpus), bad, repair_mojibake)
    return CandidateStream(str(path), candidates, override or source_qrels, bad.skipped)


def join_streams(streams: list[CandidateStream], scratch: Path) -> CandidateStream:
    """Several inputs' candidates as one stream: each query's lists joined in input order, each docid once
    (:meth:`~distill.core.schema.Candidates.join`), queries in order of first appearance. Every stream is read once
    into a JSON-lines file under ``scratch`` (made, and deleted when the stream ends), a query a line; then each
    query's lines are read back. What is held is where each query's lines are, not its candidates. The qrels are
    joined (the first input wins on a conflict); ``skipped`` is filled once every input is read."""
    skipped: Counter[str] = Counter()
    source = " + ".join(stream.source for stream in streams)
    qrels = join_qrels([stream.qrels for stream in streams])
    return CandidateStream(source, _joined(streams, scratch, skipped), qrels, skipped)


def _joined(streams: list[CandidateStream], scratch: Path, skipped: Counter[str]) -> Iterator[Candidates]:
    scratch.mkdir(parents=True, exist_ok=True)
    places: dict[str, list[tuple[int, int]]] = {}
    first: dict[str, tuple[Query, str]] = {}
    try:
        for part, stream in enumerate(streams):
            with (scratch / f"{part}.jsonl").open("wb") as f:
                for c in stream.candidates:
                    same_query(first.setdefault(c.query.qid, (c.query, stream.source)), (c.query, stream.source))
                    places.setdefault(c.query.qid, []).append((part, f.tell()))
                    record = [c.query.qid, c.query.text, [[p.docid, p.text] for p in c.passages], c.scores]
                    f.write(json.dumps(record).encode() + b"\n")
            skipped.update(stream.skipped)
        files = [(scratch / f"{part}.jsonl").open("rb") for part in range(len(streams))]
        try:
            differing: list[str] = []
            for where in places.values():
                lists = []
                for part, offset in where:
                    files[part].seek(offset)
                    qid, text, passages, scores = json.loads(files[part].readline())
                    lists.append(Candidates(Query(qid, text), [Passage(d, t) for d, t in passages], scores))
                yield Candidates.join(lists, differing)
            warn_of_differing_texts(differing, [stream.source for stream in streams])
        finally:
            for f in files:
                f.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
