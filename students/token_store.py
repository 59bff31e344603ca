"""The student's pairs, tokenised once into memory-mapped files and cached on disk.

A store is one folder per cache key, ``<cache_dir>/<key>/``, in the layout of Megatron-LM's indexed datasets
(one flat token file and its index), so that a batch is gathered from mapped pages with no Python object per
pair:

- ``tokens.bin``: every pair's token ids (``[CLS] query [SEP] passage [SEP]``, truncated as
  ``truncation="only_second"`` does), back to back, in the smallest unsigned type that holds the vocabulary
  (``uint16`` for BERT's 30,522 ids);
- ``offsets.npy`` ``[n + 1]`` int64, ``lengths.npy`` ``[n]`` int32: where each pair's tokens are;
- ``query_lengths.npy`` ``[n]`` int32: the tokens of the first segment (``[CLS] query [SEP]``): token type 0
  before, 1 from there on (all 0 for a tokenizer without token types);
- ``manifest.json``, written last: the key and what it was made of, the counts, and each file's size and checksum
  (XXH3-128, :mod:`distill.core.checksums`).

The key is a digest of everything that changes the tokens (:func:`store_key`): each source folder's contents
(its ``teacher.json``, its Arrow state and file sizes), which of its rows are read and in what order (this is
where the label's choice of teacher and the union's de-duplication show), the tokenizer (its whole
``tokenizer.json``) and ``max_length``. The label and the split do not change the tokens: a store serves any of
them.

A store is built in a hidden sibling folder and renamed into place, so a killed build never leaves a folder
under the key: it leaves a ``.<key>.partial-*`` folder, removed by the next build. A store whose manifest is
missing, names another key, or disagrees with its files' sizes or checksums is rebuilt (one warning line naming
the file), never read. Opening a store hashes each of its files once, in blocks (a process that built or checked
the same files, still unchanged, does not hash them again). Builders of one key take a file lock, so ranks (or
jobs) that share a cache build it once: under Lightning, ``prepare_data`` builds it on each node's first rank
while the others wait, and every rank then maps the same files.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distill.core.batching import segments
from distill.core.checksums import file_checksum
from distill.core.schema import InputError
from distill.data.teacher_data import TeacherDataset, dataset_digest

log = logging.getLogger(__name__)

FORMAT = 1
"""The store layout's version: part of every key."""
MANIFEST = "manifest.json"
CHUNK_PAIRS = 4096
"""Pairs tokenised per call: the tokenizer spreads a call over its threads (Rust, one per core)."""
_FILES = ("tokens.bin", "offsets.npy", "lengths.npy", "query_lengths.npy")
_checked: dict[Path, tuple[Any, ...]] = {}
"""Stores whose files this process built or checked: folder -> the files' identity then (:func:`_identity`)."""


NO_LIMIT = 10**9
"""A tokenizer's ``model_max_length`` at or past this is transformers' "no limit known" (``VERY_LARGE_INTEGER``)."""


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A digest of a fast tokenizer's whole definition (vocabulary, normalisation, templates), without the
    truncation and padding settings a call leaves on it."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec.pop("truncation", None)
    spec.pop("padding", None)
    described = {"spec": spec, "truncation_side": tokenizer.truncation_side}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def store_key(
    sources: list[str], source: np.ndarray, source_row: np.ndarray, tokenizer: Any, max_length: int
) -> tuple[str, dict[str, Any]]:
    """The cache key of the tokens of rows ``source_row`` of folders ``sources[source]``, and what it digests."""
    rows = hashlib.sha256(np.ascontiguousarray(source, dtype=np.int32).tobytes())
    rows.update(np.ascontiguousarray(source_row, dtype=np.int64).tobytes())
    parts = {
        "format": FORMAT,
        "sources": [dataset_digest(folder) for folder in sources],
        "rows": rows.hexdigest()[:16],
        "pairs": len(source),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "max_length": max_length,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20], parts


@dataclass
class TokenStore:
    """A built store, memory-mapped: the arrays are opened on first use in each process (a worker process
    reopens them rather than receiving a copy)."""

    path: Path
    manifest: dict[str, Any]
    verify_seconds: float = 0.0
    """Seconds this open spent hashing the files against the manifest's checksums (0 for a store just built, or
    already checked by this process)."""

    def __post_init__(self) -> None:
        self._arrays: dict[str, np.ndarray] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "manifest": self.manifest}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path, self.manifest, self.verify_seconds, self._arrays = state["path"], state["manifest"], 0.0, None

    def _array(self, name: str) -> np.ndarray:
        if self._arrays is None:
            dtype = np.dtype(self.manifest["dtype"])
            tokens = self.path / "tokens.bin"
            arrays = {
                "tokens": np.memmap(tokens, dtype=dtype, mode="r") if self.manifest["tokens"] else np.zeros(0, dtype)
            }
            for array in ("offsets", "lengths", "query_lengths"):
                arrays[array] = np.load(self.path / f"{array}.npy", mmap_mode="r")
            self._arrays = arrays
        return self._arrays[name]

    @property
    def tokens(self) -> np.ndarray:
        """``[total]``: every pair's token ids, back to back (mapped)."""
        return self._array("tokens")

    @property
    def offsets(self) -> np.ndarray:
        """``[n + 1]`` int64: pair ``i``'s tokens are ``tokens[offsets[i]:offsets[i + 1]]`` (mapped)."""
        return self._array("offsets")

    @property
    def lengths(self) -> np.ndarray:
        """``[n]`` int32: each pair's tokens (mapped)."""
        return self._array("lengths")

    @property
    def query_lengths(self) -> np.ndarray:
        """``[n]`` int32: each pair's first-segment tokens (mapped)."""
        return self._array("query_lengths")

    @property
    def truncated(self) -> int:
        """Pairs whose passage lost its end to ``max_length``."""
        return int(self.manifest["truncated"])

    def __len__(self) -> int:
        return int(self.manifest["pairs"])

    def pairs(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The token ids of pairs ``rows`` (``[m]``) back to back (``[sum of lengths]`` int64), their lengths and
        first-segment lengths (``[m]`` int64 each)."""
        lengths = np.asarray(self.lengths[rows], dtype=np.int64)
        positions = segments(self.offsets[rows], lengths)
        return self.tokens[positions].astype(np.int64), lengths, np.asarray(self.query_lengths[rows], dtype=np.int64)


def open_store(
    cache_dir: str | Path,
    sources: list[str],
    source: np.ndarray,
    source_row: np.ndarray,
    tokenizer: Any,
    max_length: int,
    positions: int | None = None,
) -> TokenStore:
    """The store of these pairs' tokens: opened from the cache if a complete one is there, else built (under the
    key's lock, so that concurrent callers build it once).

    Args:
        cache_dir: the cache's folder (one sub-folder per key).
        sources: teacher dataset folders (with ``query`` and ``passage`` columns).
        source: ``[n]`` each pair's folder, an index into ``sources``.
        source_row: ``[n]`` each pair's row in its folder.
        tokenizer: a fast (Rust-backed) Hugging Face tokenizer.
        max_length: tokens per pair; a longer pair loses the end of its passage.
        positions: the backbone's positions that hold a token (:func:`~distill.model.positions.usable_positions`),
            where known.

    Raises:
        InputError: ``cache_dir`` cannot be written in, the tokenizer is not a fast one, or ``max_length`` leaves no
            room for a query's tokens and one passage token, or is over the backbone's (its tokenizer's limit or its
            positions).
    """
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise InputError(f"{tokenizer.name_or_path}: the student data needs a fast (tokenizer.json) tokenizer")
    least = tokenizer.num_special_tokens_to_add(pair=True) + 2
    if max_length < least:
        raise InputError(
            f"data.max_length: {max_length} tokens cannot hold a pair: this tokenizer's special tokens, one query "
            f"token and one passage token take {least}"
        )
    limits = {"its tokenizer's model_max_length": tokenizer.model_max_length, "its position embeddings": positions}
    known = {name: limit for name, limit in limits.items() if limit is not None and limit < NO_LIMIT}
    if known and max_length > min(known.values()):
        name, limit = min(known.items(), key=lambda item: item[1])
        raise InputError(
            f"data.max_length: {max_length} tokens is over the backbone's {limit} ({name}): a longer pair has no "
            f"position to embed its last tokens in: give --data.max_length {limit} or less"
        )
    key, parts = store_key(sources, source, source_row, tokenizer, max_length)
    cache_dir = Path(cache_dir)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"data.cache_dir: {cache_dir}: cannot create it: {e.strerror}") from None
    path = cache_dir / key
    store = _complete(path, key)
    if store is not None:
        return store
    with _locked(cache_dir / f".{key}.lock"):
        store = _complete(path, key, warn=False)  # built by another process while this one waited
        if store is None:
            store = _build(path, key, parts, sources, source, source_row, tokenizer, max_length)
    return store


def _complete(path: Path, key: str, warn: bool = True) -> TokenStore | None:
    """The store at ``path`` if it is complete and its files agree with its manifest (sizes, then checksums); else
    None, and why in one warning line (with ``warn``)."""
    problem = None
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        if path.exists():
            problem = f"{path} has no manifest (an unfinished build?)"
    else:
        try:
            manifest = json.loads(manifest_path.read_text())
            sizes = {name: (path / name).stat().st_size for name in _FILES}
            identity = _identity(path)
        except (OSError, ValueError) as e:
            problem = f"{path} is unreadable ({e})"
        else:
            if manifest.get("key") != key or manifest.get("sizes") != sizes:
                problem = f"{path} does not match its manifest"
            elif _checked.get(path) == identity:
                return TokenStore(path, manifest)
            else:
                started = time.perf_counter()
                problem = _verify(path, manifest.get("checksums"))
                if problem is None:
                    _checked[path] = identity
                    return TokenStore(path, manifest, time.perf_counter() - started)
    _checked.pop(path, None)
    if problem is not None and warn:
        log.warning("student tokens: %s: rebuilding the store", problem)
    return None


def _verify(path: Path, checksums: Any) -> str | None:
    """What is wrong with the files of the store at ``path`` against the manifest's ``checksums`` (file ->
    checksum), or None."""
    if not isinstance(checksums, dict) or set(checksums) != set(_FILES):
        return f"{path / MANIFEST} has no checksums (made by an earlier version)"
    for name in _FILES:
        try:
            actual = file_checksum(path / name)
        except OSError as e:
            return f"{path / name} is unreadable ({e.strerror})"
        if actual != checksums[name]:
            return f"{path / name} does not match its checksum in {MANIFEST} (changed since it was written)"
    return None


def _identity(path: Path) -> tuple[Any, ...]:
    """The store's files as the file system identifies them (inode, size, modification time), and its manifest."""
    stats = [(path / name).stat() for name in (*_FILES, MANIFEST)]
    return tuple((s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class _TextReader:
    """A teacher dataset's query and passage texts, read in row order a record batch at a time from its Arrow
    files (plain reads, not a memory map: the pages read are not kept in this process's resident set)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.batches = self._batches()
        self.start, self.batch = 0, None  # the current batch and its first row

    def _batches(self) -> Iterator[Any]:
        import pyarrow as pa

        state = json.loads((Path(self.folder) / "state.json").read_text())
        for data_file in state["_data_files"]:
            with pa.OSFile(str(Path(self.folder) / data_file["filename"])) as source:
                for batch in pa.ipc.open_stream(source):
                    yield batch.select(["query", "passage"])

    def take(self, rows: np.ndarray) -> tuple[list[str], list[str]]:
        """The texts of ``rows``, ascending and after every row read so far."""
        import pyarrow as pa

        parts = []
        i = 0
        while i < len(rows):
            while self.batch is None or rows[i] >= self.start + self.batch.num_rows:
                if self.batch is not None:
                    self.start += self.batch.num_rows
                self.batch = next(self.batches, None)
                if self.batch is None:
                    raise InputError(f"{self.folder}: has no row {int(rows[i])}")
            if rows[i] < self.start:
                raise RuntimeError(f"{self.folder}: rows are not read in order ({int(rows[i])} after {self.start})")
            end = self.start + self.batch.num_rows
            j = i + int(np.searchsorted(rows[i:], end))
            parts.append(self.batch.take(pa.array(rows[i:j] - self.start)))
            i = j
        return (
            [text for part in parts for text in part.column(0).to_pylist()],
            [text for part in parts for text in part.column(1).to_pylist()],
        )


def _texts(readers: list[_TextReader], source: np.ndarray, source_row: np.ndarray) -> tuple[list[str], list[str]]:
    """The query and passage texts of the given rows (each source's rows ascending)."""
    queries = np.empty(len(source), dtype=object)
    passages = np.empty(len(source), dtype=object)
    for index in np.unique(source):
        where = np.flatnonzero(source == index)
        queries[where], passages[where] = readers[int(index)].take(source_row[where])
    return queries.tolist(), passages.tolist()


def _pair_tokenizer(tokenizer: Any, max_length: int) -> Any:
    """A copy of ``tokenizer``'s Rust tokenizer that encodes pairs as ``tokenizer(q, p, truncation="only_second",
    max_length=max_length)`` does, with no padding (the caller's tokenizer is left as it was)."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.enable_truncation(max_length, stride=0, strategy="only_second", direction=tokenizer.truncation_side)
    return backend


def _build(
    path: Path,
    key: str,
    parts: dict[str, Any],
    sources: list[str],
    source: np.ndarray,
    source_row: np.ndarray,
    tokenizer: Any,
    max_length: int,
) -> TokenStore:
    """Tokenise the pairs into a new store at ``path`` (through a hidden partial folder, renamed at the end)."""
    for stale in path.parent.glob(f".{key}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if path.exists():
        shutil.rmtree(path)
    work = path.parent / f".{key}.partial-{os.getpid()}"
    work.mkdir()
    n = len(source)
    dtype = np.dtype(np.uint16 if len(tokenizer) <= 1 << 16 else np.uint32)
    token_types = "token_type_ids" in tokenizer.model_input_names
    encoder = _pair_tokenizer(tokenizer, max_length)
    readers = [_TextReader(str(TeacherDataset.open(folder).path)) for folder in sources]
    lengths = np.zeros(n, dtype=np.int32)
    query_lengths = np.zeros(n, dtype=np.int32)
    truncated = 0
    started = time.perf_counter()
    log.info("student tokens: tokenising %d pairs into %s", n, path)
    with open(work / "tokens.bin", "wb") as tokens:
        for start in range(0, n, CHUNK_PAIRS):
            end = min(start + CHUNK_PAIRS, n)
            queries, passages = _texts(readers, source[start:end], source_row[start:end])
            try:
                encodings = encoder.encode_batch(list(zip(queries, passages, strict=True)))
            except Exception as e:  # the Rust tokenizer's own, for a query that leaves the passage no room
                if "Truncation error" not in str(e):
                    raise
                sizes = [len(ids) for ids in tokenizer(queries, add_special_tokens=False)["input_ids"]]
                longest = int(np.argmax(sizes))
                shutil.rmtree(work, ignore_errors=True)
                query = queries[longest] if len(queries[longest]) <= 80 else queries[longest][:77] + "..."
                raise InputError(
                    f"data.max_length: {max_length} tokens leave no room for a passage after the query {query!r} "
                    f"({sizes[longest]} tokens) of {sources[int(source[start + longest])]}, row "
                    f"{int(source_row[start + longest])}: raise data.max_length"
                ) from None
            ids = [e.ids for e in encodings]
            lengths[start:end] = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
            flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=int(lengths[start:end].sum()))
            flat.tofile(tokens)
            if token_types:
                query_lengths[start:end] = [_first_segment(e) for e in encodings]
                if start == 0:
                    _check_token_types(encodings, query_lengths[start:end], tokenizer)
            truncated += sum(1 for e in encodings if e.overflowing)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    np.save(work / "offsets.npy", offsets)
    np.save(work / "lengths.npy", lengths)
    np.save(work / "query_lengths.npy", query_lengths)
    manifest = {
        "key": key,
        "parts": parts,
        "sources": [str(folder) for folder in sources],
        "pairs": n,
        "tokens": int(offsets[-1]),
        "dtype": dtype.name,
        "truncated": truncated,
        "seconds": round(time.perf_counter() - started, 3),
        "sizes": {name: (work / name).stat().st_size for name in _FILES},
        "checksums": {name: file_checksum(work / name) for name in _FILES},
    }
    (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    work.rename(path)
    _checked[path] = _identity(path)
    log.info(
        "student tokens: %d pairs, %d tokens (%s) in %.1f s", n, manifest["tokens"], dtype.name, manifest["seconds"]
    )
    return TokenStore(path, manifest)


def _first_segment(encoding: Any) -> int:
    """The tokens before the second segment (type 1) of a pair's encoding."""
    types = encoding.type_ids
    return types.index(1) if 1 in types else len(types)


def _check_token_types(encodings: list[Any], query_lengths: np.ndarray, tokenizer: Any) -> None:
    """The collator rebuilds token types as 0 before a pair's first-segment length and 1 after: check that this
    tokenizer's template gives exactly that.

    Raises:
        InputError: it does not (a template with three segments, say).
    """
    for encoding, first in zip(encodings[:256], query_lengths, strict=False):
        expected = [0] * int(first) + [1] * (len(encoding.type_ids) - int(first))
        if encoding.type_ids != expected:
            raise InputError(
                f"{tokenizer.name_or_path}: its pair template's token types are not one run of 0s then 1s "
                f"({encoding.type_ids[:12]}...): not supported as a student backbone"
            )
