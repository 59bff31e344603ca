"""The teacher stage's input: every (query, candidate) pair, read a query at a time; a process's share into a row
file on disk.

Every process reads the inputs once, as a stream of candidate lists (a query at a time, in every format; several
inputs joined through files on disk), and the pairs of its :class:`Share` written in input order to an
Arrow file of fixed-size record batches, while the digest of every row (the fingerprint's ``input``) is computed. The
stage then reads the rows it needs a batch at a time, with plain reads: no list of the pairs is ever held, and memory
stays flat in the number of pairs (but for the distinct query texts, and the ids of the queries seen, which a stream
needs to refuse a query that comes back).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from distill.core.schema import Candidates, InputError
from distill.data.loaders import OnBadInput, join_streams, open_candidates, skip_summary

_json_string = json.encoder.encode_basestring_ascii
"""A string as ``json.dumps`` writes it (ASCII, escaped, quoted)."""
ROWS_PER_BATCH = 1024
"""Pairs per record batch of the row file: the unit it is read in."""
SCHEMA = pa.schema(
    [
        ("qid", pa.string()),
        ("docid", pa.string()),
        ("query", pa.string()),
        ("passage", pa.string()),
        ("first_stage_rank", pa.int32()),
        ("first_stage_score", pa.float64()),
    ]
)
ROWS_FILE, SUMMARY_FILE, QUERIES_FILE = "pairs.arrow", "pairs.json", "queries.json"


@dataclass
class InputOptions:
    """How the inputs are read (the teach config extends it)."""

    input: list[str] = field(default_factory=list)
    """Candidates (required): rank_llm or multi-hop QA JSON files, TREC run files, BEIR folders or ``irds:`` ids;
    several are joined, each (qid, docid) pair scored once."""
    queries: str | None = None
    """For a TREC run input: the queries (TSV ``qid<TAB>text`` or JSONL)."""
    corpus: str | None = None
    """For a TREC run input: the passages (TSV or JSONL)."""
    run: str | None = None
    """For a BEIR folder input: the candidates as a TREC run (default its judged pairs)."""
    qrels: str | None = None
    """Relevance judgements (TREC qrels) of the candidates: checked, and recorded in ``teacher.json``."""
    on_bad_input: OnBadInput = "error"
    """``error``: stop at the first bad record, naming it; ``skip``: skip bad records and count them."""
    repair_mojibake: bool = True
    """Repair MS MARCO's mojibake (``â\\x80\\x99`` for ``’``) where ``latin-1 -> utf-8`` decodes."""


def candidate_stream(options: InputOptions, scratch: Path) -> tuple[Iterator[Candidates], Counter[str]]:
    """The candidate lists of the inputs, a query at a time (:func:`~distill.data.loaders.open_candidates`), and the
    counter of bad records skipped (filled as the stream is read). Several inputs are joined, each (qid, docid) pair
    once, through files under ``scratch`` (:func:`~distill.data.loaders.join_streams`)."""
    kwargs = {
        "queries": options.queries,
        "corpus": options.corpus,
        "run": options.run,
        "qrels": options.qrels,
        "on_bad_input": options.on_bad_input,
        "repair_mojibake": options.repair_mojibake,
    }
    streams = [open_candidates(path, **kwargs) for path in options.input]
    stream = streams[0] if len(streams) == 1 else join_streams(streams, scratch)
    return stream.candidates, stream.skipped


@dataclass(frozen=True)
class Share:
    """The pairs one process keeps: pair chunk ``j`` (pairs ``[j * chunk_size, (j + 1) * chunk_size)`` in input
    order) is process ``j mod world``'s, so that one process and N processes cut the same chunks."""

    rank: int
    world: int
    chunk_size: int

    def owns(self, pair: int) -> bool:
        """Whether pair ``pair`` (its place in input order) is this process's."""
        return (pair // self.chunk_size) % self.world == self.rank

    def chunks(self, pairs: int) -> Iterator[tuple[int, range, range]]:
        """``(j, pairs of chunk j, its rows in this process's row file)`` for each chunk of this process, of
        ``pairs`` in all."""
        for j, start in enumerate(range(0, pairs, self.chunk_size)):
            if j % self.world == self.rank:
                size, row = min(self.chunk_size, pairs - start), (j // self.world) * self.chunk_size
                yield j, range(start, start + size), range(row, row + size)


WHOLE = Share(0, 1, 1)
"""Every pair: the share of the one process."""


@dataclass(frozen=True)
class InputSummary:
    """What the inputs hold, and what of them one process's row file holds."""

    pairs: int
    """Pairs of every process."""
    queries: int
    digest: str
    """A digest of every row's (qid, docid, query, passage): the teacher fingerprint's ``input``."""
    skipped: dict[str, int]
    rows: int
    """Pairs in this process's row file (its :class:`Share`)."""
    first_stage: str = ""
    """A digest of every row's first-stage rank and score: the teacher fingerprint's ``first_stage``."""


def write_pair_rows(
    candidates: Iterable[Candidates],
    skipped: Counter[str],
    folder: Path,
    max_queries: int | None,
    source: str,
    share: Share = WHOLE,
) -> InputSummary:
    """Read every pair of ``candidates`` (the first ``max_queries`` queries; read from ``source``), a query at a
    time, into the digest, and write this process's ``share`` of them into ``folder`` (made anew), with every
    distinct query text; their :class:`InputSummary` is written beside them and returned.

    Raises:
        InputError: no pair to score.
    """
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    try:
        return _write_pair_rows(candidates, skipped, folder, max_queries, source, share)
    except BaseException:  # bad input, or interrupted: no partial rows are left behind
        shutil.rmtree(folder, ignore_errors=True)
        raise


def first_stage_ranks(scores: list[float]) -> list[int]:
    """Each candidate's rank, from 1, by its first-stage score, highest first (ties in the list's order): the ranking
    the first-stage run file holds, also where the list is not in score order."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    ranks = np.empty(len(order), dtype=np.int64)
    ranks[order] = np.arange(1, len(order) + 1)
    return ranks.tolist()


def _write_pair_rows(
    candidates: Iterable[Candidates],
    skipped: Counter[str],
    folder: Path,
    max_queries: int | None,
    source: str,
    share: Share,
) -> InputSummary:
    digest, first_stage = hashlib.sha256(), hashlib.sha256()
    pairs = queries = rows = 0
    texts: dict[str, None] = {}
    columns: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    with pa.OSFile(str(folder / ROWS_FILE), "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as writer:

        def flush(final: bool) -> None:
            while len(columns["qid"]) >= ROWS_PER_BATCH or (final and columns["qid"]):
                batch = {name: values[:ROWS_PER_BATCH] for name, values in columns.items()}
                writer.write_batch(pa.record_batch(batch, schema=SCHEMA))
                for values in columns.values():
                    del values[:ROWS_PER_BATCH]

        for cands in candidates:
            if max_queries is not None and queries >= max_queries:
                break
            queries += 1
            query = cands.query
            texts[query.text] = None
            qid, text = _json_string(query.qid), _json_string(query.text)
            ranks = first_stage_ranks(cands.scores)
            for rank, passage, score in zip(ranks, cands.passages, cands.scores, strict=True):
                # json.dumps([qid, docid, query, passage]), each query's strings encoded once
                row_json = f"[{qid}, {_json_string(passage.docid)}, {text}, {_json_string(passage.text)}]"
                digest.update(row_json.encode())
                first_stage.update(f"{rank} {float(score)!r}\n".encode())
                if share.owns(pairs):
                    row = (query.qid, passage.docid, query.text, passage.text, rank, score)
                    for name, value in zip(SCHEMA.names, row, strict=True):
                        columns[name].append(value)
                    rows += 1
                pairs += 1
            flush(final=False)
        flush(final=True)
    if pairs == 0:
        counted = f" ({sum(skipped.values())} bad record(s) skipped: {skip_summary(skipped)})" if skipped else ""
        raise InputError(f"{source}: no candidates left to score{counted}")
    (folder / QUERIES_FILE).write_text(json.dumps(list(texts)))
    summary = InputSummary(pairs, queries, digest.hexdigest()[:16], dict(skipped), rows, first_stage.hexdigest()[:16])
    (folder / SUMMARY_FILE).write_text(json.dumps(summary.__dict__))
    return summary


class PairRows:
    """The row file of :func:`write_pair_rows`, read a record batch at a time (the last one kept); row ``i`` is the
    ``i``-th pair of the process's share."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        values = json.loads((folder / SUMMARY_FILE).read_text())
        self.summary = InputSummary(**values)
        self._file = pa.OSFile(str(folder / ROWS_FILE))
        self._reader = pa.ipc.open_file(self._file)
        self._cached: tuple[int, pa.RecordBatch] | None = None

    def __len__(self) -> int:
        return self.summary.rows

    def queries(self) -> list[str]:
        """Every distinct query text of the inputs (not only of this share), in input order."""
        return json.loads((self.folder / QUERIES_FILE).read_text())

    def close(self) -> None:
        self._file.close()

    def _batch(self, index: int) -> pa.RecordBatch:
        if self._cached is None or self._cached[0] != index:
            self._cached = (index, self._reader.get_batch(index))
        return self._cached[1]

    def rows(self, indices: Iterable[int], columns: Iterable[str] = SCHEMA.names) -> dict[str, list[Any]]:
        """The values of ``columns`` at pair ``indices`` (in that order), as Python lists."""
        indices = np.asarray(list(indices), dtype=np.int64)
        out: dict[str, list[Any]] = {name: [] for name in columns}
        if not len(indices):
            return out
        batches = indices // ROWS_PER_BATCH
        starts = np.flatnonzero(np.diff(batches, prepend=-1))
        for start, end in zip(starts, [*starts[1:], len(indices)], strict=True):
            batch = self._batch(int(batches[start]))
            taken = batch.take(pa.array(indices[start:end] % ROWS_PER_BATCH))
            for name in out:
                out[name] += taken.column(name).to_pylist()
        return out
