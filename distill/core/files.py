"""Reading the files a model folder or a run is made of, each parse or format error one line naming the file.

A model folder's JSON files (``config.json``, the tokenizer's, ``card.json``), its ``model.safetensors`` and a
training checkpoint are checked here before a library reads them: a truncated or malformed copy then gives
``<file>: <what is wrong>`` instead of a ``JSONDecodeError``, a ``SafetensorError`` or a zip error without the file.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path
from typing import Any

from distill.core.run_folder import EXPORT_CARD
from distill.core.schema import InputError, MissingFileError

MODEL_JSON_FILES = (
    "config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "special_tokens_map.json",
    EXPORT_CARD,
    "model.safetensors.index.json",
)
"""The JSON files of a model (or export) folder, each checked where it is present."""

TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
)
"""The files that hold a tokenizer's vocabulary: ``tokenizer.json`` (fast tokenizers, and what an export writes) or
a slow tokenizer's own file. Without any, ``transformers`` builds a tokenizer with no vocabulary (every word
``[UNK]``) instead of failing."""


def read_json_file(path: str | Path) -> Any:
    """The JSON value in ``path``.

    Raises:
        MissingFileError: no file there. InputError: ``<path>:<line>:<column>: malformed JSON: ...`` (a truncated
            or hand-edited file), or not UTF-8 text.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, not a JSON file") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}:{e.colno}: malformed JSON ({e.msg}): truncated or corrupt?") from None


def read_json_object(path: str | Path) -> dict[str, Any]:
    """:func:`read_json_file`, which must be a JSON object (``{...}``)."""
    value = read_json_file(path)
    if not isinstance(value, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def check_safetensors(path: str | Path) -> None:
    """Check that ``path`` is a whole safetensors file: its header parses and its tensors' data fill the file.

    Reads the header only (8 bytes of length, then JSON), not the weights.

    Raises:
        InputError: ``<path>: not a valid safetensors file (...): truncated or corrupt?``.
    """
    path = Path(path)
    size = path.stat().st_size

    def bad(detail: str) -> InputError:
        return InputError(f"{path}: not a valid safetensors file ({detail}): truncated or corrupt? copy it again")

    if size < 8:
        raise bad(f"{size} bytes")
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > size - 8:
            raise bad(f"its header claims {length} bytes, the file has {size - 8} after the length")
        header_bytes = f.read(length)
    try:
        header = json.loads(header_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise bad("its header is not JSON") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    ends = [
        entry["data_offsets"][1]
        for key, entry in header.items()
        if key != "__metadata__" and isinstance(entry, dict) and len(entry.get("data_offsets", ())) == 2
    ]
    expected = 8 + length + max(ends, default=0)
    if size != expected:
        raise bad(f"{size} bytes where its header describes {expected}")


def check_model_folder(folder: str | Path) -> None:
    """Check the files of a model (or export) folder a loader reads: every JSON file of :data:`MODEL_JSON_FILES`
    present parses, a tokenizer vocabulary is there (:data:`TOKENIZER_FILES`; ``tokenizer.json`` in an export
    folder, which has ``card.json``), and ``model.safetensors``, where present, is whole.

    Raises:
        MissingFileError: no tokenizer vocabulary; InputError: a file does not parse (each names the file).
    """
    folder = Path(folder)
    for name in MODEL_JSON_FILES:
        if (folder / name).is_file():
            read_json_file(folder / name)
    wanted = ("tokenizer.json",) if (folder / EXPORT_CARD).is_file() else TOKENIZER_FILES
    if not any((folder / name).is_file() for name in wanted):  # transformers falls back to a 5-token vocabulary
        raise MissingFileError(
            f"{folder}: missing {' or '.join(wanted[:2])}: the tokenizer's vocabulary (without it every word "
            "would be [UNK]); copy the folder again, or export the student again"
        )
    if (folder / "model.safetensors").is_file():
        check_safetensors(folder / "model.safetensors")


def check_checkpoint(path: str | Path) -> None:
    """Check that a training checkpoint (``torch.save``'s zip archive) is whole: its central directory, at the
    end of the file, is there (a truncated copy loses it). A DeepSpeed checkpoint (a folder) is not checked.

    Raises:
        MissingFileError: no file there. InputError: ``<path>: not a readable checkpoint (...)``.
    """
    path = Path(path)
    if path.is_dir():
        return
    if not path.is_file():
        raise MissingFileError(f"{path}: no such checkpoint")
    try:
        with zipfile.ZipFile(path) as archive:
            if not archive.namelist():
                raise zipfile.BadZipFile("empty archive")
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise InputError(f"{path}: not a readable checkpoint ({e}): truncated or corrupt?") from None
