"""The teacher stage's chunk files: each chunk's scored pairs as one Parquet file, kept between runs to resume.

Chunk ``j`` is written as ``<j:06d>-xxh3-<32 hex digits>.parquet``, named by the XXH3-128 of its bytes
(:mod:`distill.core.checksums`), atomically (a temporary file, then a rename). A resumed run takes a chunk only
if its bytes match its name and it holds its chunk's pairs: a chunk changed since it was written (a flipped byte,
a zeroed block), or written under another chunk size, is deleted with one warning line naming it and scored again;
every other chunk is kept. A chunk of an earlier version
(``<j:06d>.parquet``, no checksum) is taken if it reads as a table of its chunk's rows, and renamed under its
checksum.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from distill.core.checksums import file_digest

log = logging.getLogger(__name__)

INFIX = "-xxh3-"


def _checked(folder: Path, j: int) -> list[Path]:
    return sorted(folder.glob(f"{j:06d}{INFIX}*.parquet"))


def chunk_file(folder: Path, j: int, rows: int) -> Path | None:
    """The file of chunk ``j`` (``rows`` pairs) in ``folder`` if one is there and whole; else None, a damaged one
    deleted (one warning line naming it)."""
    for path in _checked(folder, j):
        expected = path.name[len(f"{j:06d}{INFIX}") : -len(".parquet")]
        try:
            if file_digest(path) != expected:
                _drop(path, "does not match the checksum in its name (changed since it was written)")
            elif (held := pq.ParquetFile(path).metadata.num_rows) != rows:
                _drop(path, f"holds {held} pairs, not the {rows} of this run's chunk {j} (another chunk size wrote it)")
            else:
                return path
        except FileNotFoundError:
            continue
    legacy = folder / f"{j:06d}.parquet"
    if legacy.is_file():
        try:
            table = pq.read_table(legacy)
            if table.num_rows != rows:
                raise ValueError(f"{table.num_rows} rows, not {rows}")
        except (OSError, ValueError, pa.ArrowException) as e:
            _drop(legacy, f"is unreadable ({e})")
            return None
        path = folder / f"{j:06d}{INFIX}{file_digest(legacy)}.parquet"
        legacy.rename(path)
        return path
    return None


def _drop(path: Path, why: str) -> None:
    log.warning("teacher chunk: %s %s: deleted; its pairs are scored again", path, why)
    path.unlink(missing_ok=True)


def write_chunk(table: pa.Table, folder: Path, j: int) -> Path:
    """Write chunk ``j``'s ``table`` into ``folder`` under its checksum's name (atomically); its path."""
    tmp = folder / f".{j:06d}.parquet.tmp{os.getpid()}"
    pq.write_table(table, tmp)
    path = folder / f"{j:06d}{INFIX}{file_digest(tmp)}.parquet"
    tmp.replace(path)
    return path


def chunk_batches(folder: Path, sizes: list[int]) -> Iterator[pa.RecordBatch]:
    """The record batches of chunks ``0 .. len(sizes) - 1`` of ``folder`` (chunk ``j`` of ``sizes[j]`` pairs), in
    order, each chunk checked as it is read: one chunk in memory at a time.

    Raises:
        RuntimeError: a chunk is missing or damaged (a damaged one is deleted, so that the same command scores it
            again).
    """
    for j, rows in enumerate(sizes):
        path = chunk_file(folder, j, rows)
        if path is None:
            raise RuntimeError(f"{folder}: chunk {j} is missing or was damaged: run the same command again to score it")
        table = pq.read_table(path)
        if table.num_rows != rows:
            raise RuntimeError(f"{path}: {table.num_rows} rows for chunk {j}'s {rows} pairs")
        yield from table.to_batches()
