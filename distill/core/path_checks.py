"""Path arguments, checked before any work: an input that is there and readable, an output that can be written and
is no input (nor inside an input folder: a model, a data set, a cache), a folder where a folder is wanted and a file
where a file is.

Each check raises :class:`~distill.core.schema.InputError` (or :class:`~distill.core.schema.MissingFileError`) of
one line, ``<command>: <option>: <path>: <what is wrong>``, and creates nothing.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from distill.core.output_files import written_in_place
from distill.core.schema import InputError, MissingFileError


def _named(command: str, key: str, path: Path) -> str:
    return f"{command}: {key}: {path}"


def input_path(path: str | Path, command: str, key: str, kind: str = "any") -> Path:
    """``path``, an input: there, readable, and a file (``kind="file"``), a folder (``"folder"``) or either.

    Raises:
        MissingFileError: nothing is there. InputError: the wrong kind, or unreadable.
    """
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"{_named(command, key, path)}: no such {'file or folder' if kind == 'any' else kind}")
    if kind == "file" and path.is_dir():
        raise InputError(f"{_named(command, key, path)}: is a folder, not a file")
    if kind == "folder" and not path.is_dir():
        raise InputError(f"{_named(command, key, path)}: is a file, not a folder")
    if not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
        raise InputError(f"{_named(command, key, path)}: not readable (permission denied)")
    return path


def same_path(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` name one file or folder (through links and ``..``)."""
    a, b = Path(a).resolve(), Path(b).resolve()
    return a == b or (a.exists() and b.exists() and os.path.samefile(a, b))


def _writable_parent(path: Path, command: str, key: str) -> None:
    """The nearest existing folder above ``path`` (or itself) is a folder and takes a new file."""
    existing = next((p for p in path.parents if p.exists() or p.is_symlink()), Path("."))
    if not existing.is_dir():
        what = "a broken link" if existing.is_symlink() and not existing.exists() else "a file"
        raise InputError(f"{_named(command, key, path)}: {existing} is {what}, not a folder")
    _takes_a_file(existing, command, key, path)


def _takes_a_file(folder: Path, command: str, key: str, path: Path) -> None:
    """A file can be made in ``folder`` (tried: permissions, a read-only or immutable file system, which a root
    user's ``os.access`` does not see)."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".distill-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise InputError(f"{_named(command, key, path)}: cannot write in {folder}: {e.strerror}") from None


def is_inside(path: str | Path, folder: str | Path) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (through links and ``..``): where it leads, or, for a link,
    where the link itself is (a hub snapshot's files are links into its ``blobs/``: writing to one changes the
    snapshot)."""
    path, folder = Path(path), Path(folder).resolve()
    places = [path.resolve()]
    if path.is_symlink():
        places.append(path.absolute().parent.resolve() / path.name)
    return any(place.is_relative_to(folder) for place in places) or same_path(path, folder)


def _not_an_input(
    path: Path, command: str, key: str, inputs: Iterable[tuple[str, str | Path | None]], replaced: bool = False
) -> None:
    """``path``, an output, is none of ``inputs``, not inside an input folder and, where the command replaces the
    whole folder (``replaced``), holds none of them."""
    for input_key, given in inputs:
        if given is None:
            continue
        given = Path(given)
        if same_path(path, given):
            raise InputError(
                f"{_named(command, key, path)}: is also an input ({input_key}), which would be overwritten: "
                "choose another output"
            )
        if not given.is_file() and is_inside(path, given):  # a folder, or one to be made (a cache)
            raise InputError(
                f"{_named(command, key, path)}: is inside an input folder ({input_key}: {given}), which it would "
                "change: choose an output outside it"
            )
        if replaced and is_inside(given, path):
            raise InputError(
                f"{_named(command, key, path)}: holds an input ({input_key}: {given}), which would be overwritten: "
                "choose another output"
            )


def output_file(path: str | Path, command: str, key: str, inputs: Iterable[tuple[str, str | Path | None]] = ()) -> Path:
    """``path``, a file to write: not a folder, its folder can be made and written in (unless it is a device or a
    pipe, written in place: :func:`distill.core.output_files.written_in_place`), none of ``inputs`` (``(option,
    path)`` pairs: every path the command reads, which it would overwrite) and inside none of them.

    Raises:
        InputError: naming the option, the path and what is wrong.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{_named(command, key, path)}: is a folder; give a file name")
    _not_an_input(path, command, key, inputs)
    if not written_in_place(path):  # a link is followed: the file is written beside what it points to
        _writable_parent(path.resolve() if path.is_symlink() else path, command, key)
    if path.exists() and not os.access(path, os.W_OK):
        raise InputError(f"{_named(command, key, path)}: not writable (permission denied)")
    return path


def output_folder(
    path: str | Path,
    command: str,
    key: str,
    inputs: Iterable[tuple[str, str | Path | None]] = (),
    replaced: bool = False,
) -> Path:
    """``path``, a folder to write into: not a file, can be made (or is there) and written in, not one of
    ``inputs`` nor inside one, nor, where the command replaces the whole folder (``replaced``), a folder holding one.

    Raises:
        InputError: naming the option, the path and what is wrong.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{_named(command, key, path)}: is a file, not a folder")
    _not_an_input(path, command, key, inputs, replaced)
    if path.is_dir():
        _takes_a_file(path, command, key, path)
    else:
        _writable_parent(path, command, key)
    return path
