"""Checksums of the files a cache reuses between runs: XXH3 (128 bits, :mod:`xxhash`) of a file's bytes.

XXH3 is not a cryptographic hash: it tells a file that was zeroed, truncated or had a byte flipped from the one
written, not a file forged to match. It hashes at memory speed, so checking a cache is bound by reading it. A
checksum is written as ``xxh3_128:<32 hex digits>``; :func:`digest` is the hex digits alone (for file names).
"""

from __future__ import annotations

import os
from pathlib import Path

import xxhash

ALGORITHM = "xxh3_128"
BLOCK_BYTES = 8 << 20
"""Bytes read at a time (at most): one reused buffer, so a file of any size is hashed in a constant resident set."""


def digest(data: bytes | memoryview) -> str:
    """The XXH3-128 of ``data``: 32 hex digits."""
    return xxhash.xxh3_128_hexdigest(data)


def file_digest(path: str | Path) -> str:
    """The XXH3-128 of the file at ``path``, read in :data:`BLOCK_BYTES` blocks: 32 hex digits.

    Raises:
        OSError: the file cannot be read.
    """
    hasher = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        buffer = bytearray(max(1, min(BLOCK_BYTES, os.fstat(f.fileno()).st_size)))  # a small file: a small buffer
        view = memoryview(buffer)
        while read := f.readinto(buffer):
            hasher.update(view[:read])
    return hasher.hexdigest()


def file_checksum(path: str | Path) -> str:
    """``xxh3_128:<digest>`` of the file at ``path`` (:func:`file_digest`)."""
    return f"{ALGORITHM}:{file_digest(path)}"


def stat_digest(path: str | Path) -> str:
    """A digest of the name, size and modification time of the file at ``path``, or of every file under the folder
    at ``path`` (hidden ones left out): what changes when a file is rewritten, without reading it. 32 hex digits."""
    path = Path(path)
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    entries = []
    for f in files:
        name = f.relative_to(path).as_posix() if f != path else f.name
        if not any(part.startswith(".") for part in Path(name).parts):
            stat = f.stat()
            entries.append((name, stat.st_size, stat.st_mtime_ns))
    return digest(repr(sorted(entries)).encode())


def weights_checksum(folder: str | Path) -> str | None:
    """``xxh3_128:<digest>`` of the weights of the model folder at ``folder``: each ``*.safetensors`` file's name and
    bytes, in name order; None where it has none."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    return f"{ALGORITHM}:{digest(repr([(f.name, file_digest(f)) for f in files]).encode())}"
