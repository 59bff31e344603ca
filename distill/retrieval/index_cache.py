"""A first-stage index on disk, keyed by what it was built from, and saved atomically.

An index folder holds the retriever's files, ``docids.json`` (row ``i`` of the index is passage ``docids[i]``)
and ``manifest.json``: its ``key`` is a hash of the corpus file's content and of every setting that changes the
index, its ``checksums`` those of every other file (:mod:`distill.core.checksums`). A later call with the same
key loads the folder where every file still matches its checksum; any other key, or a changed file, rebuilds it.
A build is written to a temporary sibling folder and renamed into place, so an interrupted build never leaves a
half-written index under the index's name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from distill.core.checksums import file_checksum
from distill.core.output_files import folder_identity, remove_stale_siblings, replace_folder, staging_path
from distill.core.schema import ExistingOutputError

INDEX_FORMAT = 1
"""Bumped whenever the files of an index change layout; an index of another format is rebuilt."""

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
DOCIDS = "docids.json"


class SavableIndex(Protocol):
    def save(self, directory: Path) -> None:
        """Write the index's files into ``directory`` (an existing, empty folder)."""


Index = TypeVar("Index", bound=SavableIndex)


def file_sha256(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """The SHA-256 of the file's bytes, as hex, read ``chunk_bytes`` at a time."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def index_key(corpus: Path, settings: dict[str, Any]) -> str:
    """The key of an index of ``corpus`` built with ``settings`` (JSON-serialisable): a SHA-256, as hex.

    The corpus counts by content (not by path) and by format (its suffix picks TSV or JSONL parsing).
    """
    record = {"format": INDEX_FORMAT, "corpus_sha256": file_sha256(corpus), "corpus_suffix": corpus.suffix.lower()}
    blob = json.dumps({**record, **settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def saved_key(directory: Path) -> str | None:
    """The key in ``directory``'s manifest, or ``None`` where there is no readable manifest."""
    try:
        return json.loads((directory / MANIFEST).read_text())["key"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _whole(directory: Path) -> bool:
    """Whether every file the manifest of the index in ``directory`` lists matches the checksum it records (an
    index saved without checksums is not whole)."""
    try:
        checksums = json.loads((directory / MANIFEST).read_text()).get("checksums")
        return bool(checksums) and all(file_checksum(directory / name) == value for name, value in checksums.items())
    except (OSError, ValueError, AttributeError):
        return False


def load_docids(directory: Path) -> list[str]:
    return json.loads((directory / DOCIDS).read_text())


def check_index_folder(directory: Path) -> None:
    """Check that ``directory`` can take an index: absent, empty, or an index (it has ``manifest.json``), which a new
    one replaces.

    Raises:
        ExistingOutputError: ``directory`` is a file, or a folder of something else (a teacher dataset, a user's
            files), which a new index would delete.
    """
    if directory.is_file():
        raise ExistingOutputError(f"index: {directory} is a file, where an index is a folder: choose another --index")
    try:
        names = {entry.name for entry in directory.iterdir()}  # one listing: another job may swap the folder
    except (FileNotFoundError, NotADirectoryError):  # absent, or between the renames of another job's replacement
        return
    if names and MANIFEST not in names:
        raise ExistingOutputError(
            f"index: {directory} exists and is no index (no {MANIFEST}), which a new index would replace: choose "
            "another --index"
        )


def save_atomically(
    directory: Path, key: str, settings: dict[str, Any], docids: list[str], write: Callable[[Path], None]
) -> None:
    """Replace ``directory`` with a new index: ``write(folder)`` writes the retriever's files into a temporary
    folder, which gets ``docids.json`` and ``manifest.json`` and then takes ``directory``'s name.

    The old index is replaced by renames (:func:`~distill.core.output_files.replace_folder`), never a partial one
    under the name; what a killed build left beside it goes first.
    """
    directory.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_siblings(directory)
    tmp = staging_path(directory)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write(tmp)
        (tmp / DOCIDS).write_text(json.dumps(docids))
        checksums = {str(f.relative_to(tmp)): file_checksum(f) for f in sorted(tmp.rglob("*")) if f.is_file()}
        manifest = {"key": key, "num_docs": len(docids), **settings, "checksums": checksums}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        replace_folder(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_or_build(
    directory: Path,
    key: str,
    settings: dict[str, Any],
    load: Callable[[Path], Index],
    build: Callable[[], tuple[Index, list[str]]],
) -> tuple[Index, list[str], bool]:
    """The index in ``directory`` if its key is ``key``; otherwise ``build()``'s, saved there atomically.

    Returns:
        ``(index, docids, reused)``: ``docids[i]`` is the passage of the index's row ``i``; ``reused`` is
        whether the saved index was loaded rather than built.
    """
    if saved_key(directory) == key:
        if _whole(directory):
            before = folder_identity(directory)
            index, docids = load(directory), load_docids(directory)
            if folder_identity(directory) == before:  # not replaced by another job between the reads
                return index, docids, True
        else:
            log.warning("index: %s does not match its checksums (changed since it was written): rebuilt", directory)
    index, docids = build()
    save_atomically(directory, key, settings, docids, index.save)
    return index, docids, False
