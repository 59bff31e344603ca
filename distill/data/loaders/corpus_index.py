"""A corpus file indexed once on disk: docid -> passage text, looked up without holding the corpus in memory.

The corpus (a TSV or JSONL file, as :mod:`.trec` reads it, or an ir_datasets docs iterator) is read once into a
folder of the cache, ``$CIS_DISTILL_CACHE/corpus/<name>-<key>/``, keyed by what its texts depend on (a file's path,
size, modification time and a sample of its bytes, its layout and whether mojibake is repaired):

- ``texts.bin``: every passage's cleaned text (UTF-8), one after another;
- ``ids.bin``: every docid (UTF-8), one after another;
- ``hashes.npy``: the XXH3-64 of every record's docid, sorted (then by line), for the binary search;
- ``table.npy``: a row per record, in the same order: where its docid and text are (byte offset and length of
  each), its line and its state (kept, or bad where its docid is needed);
- ``index.json``: the record count, the reasons of the bad records (each with its kind, as :class:`BadInput` counts
  it), the lines that are bad wherever they are (a TSV
  line without a tab, a JSONL record without an id: replayed into the bad-input policy each time the index is
  opened) and the XXH3-128 checksum of each file (:mod:`distill.core.checksums`).

Reopening checks the files against their checksums (an index changed since it was written is deleted, with one
warning line, and built again) and maps the table; a lookup is a binary search of the table, a comparison of the
docid's bytes and one ``pread`` of its text. The build holds about 40 bytes a record (the table's columns), not the
texts. Several processes (ranks, nodes on a shared cache) build it once: a file lock, and a rename into place.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import xxhash
from filelock import FileLock

from distill.core.checksums import file_checksum
from distill.data.loaders._common import BadInput, TextRecord
from distill.model.resolver import cache_home

log = logging.getLogger(__name__)

VERSION = 4
"""The layout of an index folder; a new layout builds anew."""
FILES = ("texts.bin", "ids.bin", "table.npy", "hashes.npy")
"""The index's data files, each checked against its checksum when opened."""
KEPT, BAD = 0, 1
"""A record's state: its text is kept, or it is bad input where its docid is needed (its reason in ``index.json``)."""
TABLE = np.dtype(
    [
        ("id_start", "<i8"),
        ("id_len", "<i4"),
        ("text_start", "<i8"),
        ("text_len", "<i4"),
        ("line", "<i8"),
        ("state", "<i1"),
    ]
)


def docid_hash(docid: bytes) -> int:
    """The 64-bit hash a docid is sorted and searched by."""
    return xxhash.xxh3_64_intdigest(docid)


def index_folder(name: str, identity: list[object]) -> Path:
    """The cache folder of an index: ``name`` (for people), then a hash of ``identity`` (everything its texts depend
    on, such as a file's resolved path, size, modification time and content sample, its layout and whether mojibake
    is repaired)."""
    key = json.dumps([VERSION, *identity], default=str)
    return cache_home() / "corpus" / f"{name}-{xxhash.xxh3_128_hexdigest(key.encode())}"


SAMPLE_BLOCKS, SAMPLE_BYTES = 17, 4096
"""A corpus file's content sample: this many blocks of this many bytes, evenly spaced from its start to its end."""


def file_index_folder(path: Path, layout: str, repair: bool) -> Path:
    """:func:`index_folder` of corpus file ``path`` (``layout`` ``tsv`` or ``jsonl``): keyed by its resolved path,
    size, modification time and :func:`content_sample`, so that an edit that keeps its size and time (a copy that
    keeps times, ``touch -d``) is seen wherever it changes a sampled block."""
    stat = path.stat()
    identity = [path.resolve(), stat.st_size, stat.st_mtime_ns, content_sample(path, stat.st_size), layout, repair]
    return index_folder(path.name, identity)


def content_sample(path: Path, size: int) -> str:
    """The XXH3-128 of :data:`SAMPLE_BLOCKS` blocks of ``path`` (``size`` bytes), its first and its last among them:
    microseconds for any size, where a checksum of the whole file would take seconds a gigabyte."""
    digest = xxhash.xxh3_128()
    last = max(size - SAMPLE_BYTES, 0)
    with path.open("rb") as file:
        for i in range(SAMPLE_BLOCKS):
            digest.update(os.pread(file.fileno(), SAMPLE_BYTES, last * i // (SAMPLE_BLOCKS - 1)))
    return digest.hexdigest()


class CorpusIndex:
    """An index folder of :func:`build_index`, opened: :meth:`get` a docid's text."""

    def __init__(self, folder: Path, source: Path | str) -> None:
        self.folder, self.source = folder, source
        meta = json.loads((folder / "index.json").read_text())
        self.records: int = meta["records"]
        self.always_bad: list[tuple[int, str, str | None]] = [tuple(x) for x in meta["always_bad"]]
        self.reasons: dict[int, tuple[str, str | None]] = {int(k): tuple(v) for k, v in meta["reasons"].items()}
        self.table = np.load(folder / "table.npy", mmap_mode="r")
        self._hashes = np.load(folder / "hashes.npy", mmap_mode="r")
        self._ids = os.open(folder / "ids.bin", os.O_RDONLY)
        self._texts = os.open(folder / "texts.bin", os.O_RDONLY)
        self._reported: set[str] = set()
        """Docids whose bad records were reported (once each)."""

    def close(self) -> None:
        os.close(self._ids)
        os.close(self._texts)

    def __enter__(self) -> CorpusIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def replay_bad(self, bad: BadInput) -> None:
        """Report the lines that are bad wherever they are to ``bad`` (raising at the first under ``error``)."""
        for line, reason, kind in self.always_bad:
            bad(f"{self.source}:{line}", reason, kind)

    def rows(self, docid: str) -> list[np.void]:
        """The table rows of ``docid``, in line order."""
        key = docid.encode()
        h = docid_hash(key)
        i = int(np.searchsorted(self._hashes, h))
        found = []
        while i < len(self._hashes) and self._hashes[i] == h:
            row = self.table[i]
            if os.pread(self._ids, int(row["id_len"]), int(row["id_start"])) == key:
                found.append(row)
            i += 1
        return found

    def text(self, row: np.void) -> str:
        return os.pread(self._texts, int(row["text_len"]), int(row["text_start"])).decode()

    def get(self, docid: str, bad: BadInput) -> str | None:
        """``docid``'s text: its first good record's, or None where the corpus has none. Its bad records, and later
        ones with another text, are reported to ``bad`` (each naming its line) the first time it is asked for."""
        text, problems = None, []
        for row in self.rows(docid):
            where = f"{self.source}:{int(row['line'])}"
            if row["state"] == BAD:
                problems.append((where, *self.reasons[int(row["line"])]))
            elif text is None:
                text = self.text(row)
            elif self.text(row) != text:
                problems.append((where, f"docid {docid} appears twice with different texts", "a docid with two texts"))
        if problems and docid not in self._reported:
            self._reported.add(docid)
            for where, reason, kind in problems:
                bad(where, reason, kind)
        return text

    def get_many(self, docids: list[str], bad: BadInput) -> list[str | None]:
        """:meth:`get` of each of ``docids``: one binary search for all, and where a docid has one good record (the
        rule), two reads (its docid, to compare, and its text)."""
        if not docids or not len(self._hashes):
            return [None] * len(docids)
        keys = [docid.encode() for docid in docids]
        hashes = np.fromiter(map(docid_hash, keys), np.uint64, len(keys))
        last = len(self._hashes) - 1
        at = np.minimum(np.searchsorted(self._hashes, hashes), last)
        rows = self.table[at]
        found = self._hashes[at] == hashes
        alone = found & (rows["state"] == KEPT) & ((at == last) | (self._hashes[np.minimum(at + 1, last)] != hashes))
        id_start, id_len = rows["id_start"].tolist(), rows["id_len"].tolist()
        text_start, text_len = rows["text_start"].tolist(), rows["text_len"].tolist()
        out: list[str | None] = []
        for i, (docid, key) in enumerate(zip(docids, keys, strict=True)):
            if alone[i] and os.pread(self._ids, id_len[i], id_start[i]) == key:
                out.append(os.pread(self._texts, text_len[i], text_start[i]).decode())
            else:
                out.append(self.get(docid, bad) if found[i] else None)
        return out


def open_index(folder: Path, source: Path | str, records: Iterator[TextRecord]) -> CorpusIndex:
    """The index in ``folder`` of the corpus ``source`` (named in messages), built from ``records`` (the corpus in
    order, read only where the cache has no whole index); every process waits for one build.

    Raises:
        InputError: the corpus is malformed beyond the bad-input policy (such as a JSONL line that is not JSON).
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if (folder / "index.json").is_file() and not _whole(folder):
            log.warning("corpus index: %s does not match its checksums (changed since it was written): rebuilt", folder)
            shutil.rmtree(folder)
        if not (folder / "index.json").is_file():
            build_index(records, folder)
    return CorpusIndex(folder, source)


def _whole(folder: Path) -> bool:
    """Whether ``index.json`` reads, and every data file of the index in ``folder`` matches the checksum it
    records."""
    try:
        manifest = json.loads((folder / "index.json").read_text())
        checksums = manifest.get("checksums", {}) if isinstance(manifest, dict) else {}
        return all(file_checksum(folder / name) == checksums.get(name) for name in FILES)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False


def build_index(records: Iterator[TextRecord], folder: Path) -> None:
    """Write the index of ``records`` (a corpus in line order) into ``folder``, through a temporary folder renamed
    into place; nothing is left behind on an error."""
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        _build(records, tmp)
        tmp.rename(folder)
    finally:
        if tmp.exists():
            for child in tmp.iterdir():
                child.unlink()
            tmp.rmdir()


def _build(records: Iterator[TextRecord], tmp: Path) -> None:
    hashes, lines = array("Q"), array("q")
    id_lens, text_lens, states = array("i"), array("i"), array("b")
    always_bad: list[tuple[int, str, str | None]] = []
    reasons: dict[int, tuple[str, str | None]] = {}
    with open(tmp / "ids.bin", "wb") as ids, open(tmp / "texts.bin", "wb") as texts:
        for record in records:
            if record.key is None:
                always_bad.append((record.line, record.reason, record.kind))
                continue
            key = record.key.encode()
            ids.write(key)
            hashes.append(docid_hash(key))
            lines.append(record.line)
            id_lens.append(len(key))
            if record.text is None:
                reasons[record.line] = (record.reason, record.kind)
                states.append(BAD)
                text_lens.append(0)
            else:
                encoded = record.text.encode()
                texts.write(encoded)
                states.append(KEPT)
                text_lens.append(len(encoded))
    table = np.empty(len(hashes), dtype=TABLE)
    table["line"] = np.frombuffer(lines, dtype=np.int64)
    for name, values in (("id", id_lens), ("text", text_lens)):
        lengths = np.frombuffer(values, dtype=np.int32)
        table[f"{name}_len"] = lengths
        table[f"{name}_start"] = np.cumsum(lengths, dtype=np.int64) - lengths
    table["state"] = np.frombuffer(states, dtype=np.int8)
    del lines, id_lens, text_lens, states
    docid_hashes = np.frombuffer(hashes, dtype=np.uint64)
    order = np.lexsort((table["line"], docid_hashes))
    np.save(tmp / "hashes.npy", docid_hashes[order])
    np.save(tmp / "table.npy", table[order])
    checksums = {name: file_checksum(tmp / name) for name in FILES}
    meta = {
        "version": VERSION,
        "records": len(table),
        "always_bad": always_bad,
        "reasons": reasons,
        "checksums": checksums,
    }
    (tmp / "index.json").write_text(json.dumps(meta))
