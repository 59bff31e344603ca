"""A disk cache of log p(K), shared by queries, runs and processes.

Entries are keyed by a hash of the passage's token ids, in a folder per teacher setting
(weights, dtype, start token). Writers add whole segment files atomically (write, then
rename), so concurrent processes never see a partial file and a killed run loses at most
the segment it was writing.

In memory the entries are a compact index (:class:`PackedLogProbs`): each key's 128 bits as two unsigned 64-bit
integers beside its float64 value, 24 bytes an entry in sorted arrays, a fraction of a dict of strings.

A segment is JSON lines (``[key, log p(K)]`` a line) named by the XXH3-128 of its bytes,
``seg-xxh3-<32 hex digits>.jsonl`` (:mod:`distill.core.checksums`), and checked against its name
when read: a segment changed since it was written (a flipped byte, a zeroed block) is deleted with
one warning line naming it, and its passages are missing from the cache, so they are scored again;
every other segment is kept. A segment of an earlier version (``seg-<uuid>.jsonl``, no checksum)
is read where it is, its lines checked for their form only (a cache may be committed: reading it
leaves its files as they are).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from distill.core.checksums import digest

log = logging.getLogger(__name__)

PREFIX = "seg-xxh3-"
"""The name of a checked segment: ``PREFIX + <digest of its bytes> + ".jsonl"``."""


def passage_key(ids: Sequence[int]) -> str:
    """Content hash of a passage's token ids."""
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:32]


HEX = frozenset("0123456789abcdef")


def _entries(data: bytes) -> list[tuple[str, float]]:
    """The ``(key, log p(K))`` lines of a segment's bytes.

    Raises:
        ValueError: a line is not ``[32 lowercase hex digits, number]``.
    """
    entries = []
    for number, line in enumerate(data.decode().splitlines(), start=1):
        entry = json.loads(line)
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or not isinstance(entry[0], str)
            or len(entry[0]) != 32
            or not HEX.issuperset(entry[0])
            or isinstance(entry[1], bool)
            or not isinstance(entry[1], int | float)
        ):
            raise ValueError(f"line {number} is not [key, log p(K)]")
        entries.append((entry[0], float(entry[1])))
    return entries


def _halves(keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The high and low 64 bits of each 32-hex-digit key: two ``[n]`` uint64 arrays."""
    words = np.frombuffer(bytes.fromhex("".join(keys)), dtype=">u8").reshape(-1, 2)
    return words[:, 0].astype(np.uint64), words[:, 1].astype(np.uint64)


class PackedLogProbs:
    """``key -> float`` for 32-hex-digit keys in 24 bytes an entry: sorted ``[n]`` uint64 arrays of the keys' high
    and low halves and the ``[n]`` float64 values, found by binary search. Entries added since the last merge wait
    in a dict, then in unsorted blocks of ``BLOCK`` entries; a lookup merges the blocks first: one sort of the
    whole, whose peak is the three columns, the sort's index and one column's sorted copy (40 bytes an entry). A
    key added again takes its last value."""

    BLOCK = 1 << 16
    """Entries that wait in the dict before they become a block of arrays."""

    def __init__(self) -> None:
        self.hi = np.empty(0, np.uint64)
        self.lo = np.empty(0, np.uint64)
        self.values = np.empty(0, np.float64)
        self._recent: dict[str, float] = {}
        self._blocks: dict[str, list[np.ndarray]] = {"hi": [], "lo": [], "values": []}
        """The waiting blocks, column by column."""

    def update(self, entries: Iterable[tuple[str, float]]) -> None:
        self._recent.update(entries)
        if len(self._recent) >= self.BLOCK:
            self._block()

    def _block(self) -> None:
        if self._recent:
            hi, lo = _halves(list(self._recent))
            values = np.fromiter(self._recent.values(), np.float64, len(self._recent))
            for name, column in (("hi", hi), ("lo", lo), ("values", values)):
                self._blocks[name].append(column)
            self._recent = {}

    def _merge(self) -> None:
        """Fold every waiting entry into the sorted arrays, a column at a time."""
        self._block()
        if not self._blocks["hi"]:
            return
        columns = []
        for name, parts in self._blocks.items():
            columns.append(np.concatenate([getattr(self, name), *parts]))
            parts.clear()
            setattr(self, name, None)
        order = np.lexsort((columns[1], columns[0]))  # stable: a key's entries keep the order they came in
        for i in range(3):
            columns[i] = columns[i][order]
        del order
        hi, lo, values = columns
        last = np.ones(len(hi), bool)
        last[:-1] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])  # the last entry of each key
        self.hi, self.lo, self.values = (hi, lo, values) if last.all() else (hi[last], lo[last], values[last])

    def _find(self, key: str) -> int | None:
        if self._blocks["hi"]:
            self._merge()
        (hi,), (lo,) = _halves([key])
        start, end = np.searchsorted(self.hi, hi, "left"), np.searchsorted(self.hi, hi, "right")
        i = start + int(np.searchsorted(self.lo[start:end], lo))  # sorted by the low half within a high half
        return i if i < end and self.lo[i] == lo else None

    def __contains__(self, key: str) -> bool:
        return key in self._recent or self._find(key) is not None

    def __getitem__(self, key: str) -> float:
        if key in self._recent:
            return self._recent[key]
        i = self._find(key)
        if i is None:
            raise KeyError(key)
        return float(self.values[i])

    def __len__(self) -> int:
        self._merge()
        return len(self.hi)


class PassageLogProbCache:
    """``key -> log p(K)`` (float, nats) for one teacher setting, stored under ``root``."""

    def __init__(self, root: str | Path, setting: dict[str, Any]) -> None:
        setting_digest = hashlib.sha256(json.dumps(setting, sort_keys=True).encode()).hexdigest()[:16]
        self.dir = Path(root) / setting_digest
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "setting.json").write_text(json.dumps(setting, indent=2, sort_keys=True))
        self._values = PackedLogProbs()
        self._read: set[str] = set()
        """Segments already read (and checked) by this object, by name."""
        self.verify_seconds = 0.0
        """Seconds spent hashing segments against their names' checksums, over every read so far."""
        self.reload()

    def reload(self) -> None:
        """Read every segment written since the last read, by this process or others (each checked against its
        checksum; a damaged one is deleted, its entries left out)."""
        for segment in sorted(self.dir.glob("seg-*.jsonl")):
            if segment.name not in self._read:
                self._values.update(self._segment(segment))
                self._read.add(segment.name)

    def _segment(self, segment: Path) -> list[tuple[str, float]]:
        """The entries of ``segment`` if it is whole, else none (and the segment deleted, with one warning)."""
        try:
            data = segment.read_bytes()
        except FileNotFoundError:  # deleted by another process since the listing
            return []
        checked = segment.name.startswith(PREFIX)
        started = time.perf_counter()
        whole = not checked or digest(data) == segment.name.removeprefix(PREFIX).removesuffix(".jsonl")
        self.verify_seconds += time.perf_counter() - started
        if not whole:
            return self._drop(segment, "does not match the checksum in its name (changed since it was written)")
        try:
            entries = _entries(data)
        except ValueError as e:  # a JSON or UTF-8 error is a ValueError too
            return self._drop(segment, f"is malformed ({e})")
        return entries

    def _drop(self, segment: Path, why: str) -> list[tuple[str, float]]:
        log.warning("p(K) cache: %s %s: deleted; its passages are scored again", segment, why)
        segment.unlink(missing_ok=True)
        return []

    def _write(self, data: bytes) -> None:
        """Write ``data`` as the segment named by its checksum (atomically: a temporary file, then a rename)."""
        name = f"{PREFIX}{digest(data)}.jsonl"
        tmp = self.dir / f".tmp-{uuid.uuid4().hex}"
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.rename(self.dir / name)
        self._read.add(name)

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def __getitem__(self, key: str) -> float:
        return self._values[key]

    def __len__(self) -> int:
        return len(self._values)

    def add(self, keys: Sequence[str], values: Sequence[float]) -> None:
        """Store entries as one new segment file."""
        if not keys:
            return
        lines = [json.dumps([key, float(value)]) + "\n" for key, value in zip(keys, values, strict=True)]
        self._write("".join(lines).encode())
        self._values.update(zip(keys, map(float, values), strict=True))
