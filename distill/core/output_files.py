"""Writing a command's output file whole: a reader of its path sees the old file or the new one, never half of one;
a device, a pipe or a standard stream given as the path (``/dev/null``, a named pipe, ``/dev/stdout``) is written,
not replaced; an output folder replaced by renames, never deleted under its name; what a killed writer left beside
an output cleaned by the next; and an output held by one job at a time."""

from __future__ import annotations

import errno
import fcntl
import glob
import logging
import os
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

log = logging.getLogger(__name__)

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
"""The errors of a write that found its disk (or its quota) full."""


STREAM_PATHS = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
"""The paths of the standard streams -> their file descriptors (``/dev/fd/N`` and ``/proc/self/fd/N`` name ``N``)."""
MAX_LINKS = 40
"""Symbolic links followed at most, as the kernel follows them."""


def stream_descriptor(path: str | Path) -> int | None:
    """The file descriptor of this process that ``path`` names (``/dev/stdout``, ``/dev/fd/3``,
    ``/proc/self/fd/3``, or a symbolic link to one), whatever it points to (a terminal, a pipe, or a file a shell's
    ``>`` or ``>>`` opened); None for any other path."""
    text = os.path.abspath(path)
    for _ in range(MAX_LINKS):
        if text in STREAM_PATHS:
            return STREAM_PATHS[text]
        if match := re.fullmatch(r"/(?:dev|proc/self)/fd/(\d+)", text):
            return int(match.group(1))
        if not os.path.islink(text):
            return None
        text = os.path.abspath(os.path.join(os.path.dirname(text), os.readlink(text)))
    return None


def written_in_place(path: Path) -> bool:
    """Whether ``path`` is written where it is: it names one of this process's file descriptors
    (:func:`stream_descriptor`), or it exists (a symbolic link followed) and is neither a regular file nor a folder
    (a device, a pipe, a socket): a rename over it would replace what it points to."""
    return stream_descriptor(path) is not None or (path.exists() and not path.is_file() and not path.is_dir())


def is_stdout(path: str | Path | None) -> bool:
    """Whether ``path`` is this process's standard output (``/dev/stdout``, or the file or pipe it points to)."""
    if path is None:
        return False
    try:
        mine, theirs = os.fstat(sys.stdout.fileno()), os.stat(path)
    except (OSError, ValueError, AttributeError):  # no such path; stdout closed or not a real file (captured)
        return False
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


@contextmanager
def open_whole(path: Path) -> Iterator[TextIO]:
    """``path`` open for writing text. A regular file (or a new one) is written as a hidden file beside it, renamed
    over it once the block ends, or removed if the block raises; a symbolic link is followed first, as a shell's
    ``>`` follows it, so that the file it points to is replaced, not the link. A device or a pipe
    (:func:`written_in_place`) is opened as it is, and a path that names a file descriptor of this process
    (``/dev/stdout``) is written through that descriptor, so that a file a shell opened for it keeps what is in it and
    is written at the shell's offset (``>>`` appends). An ``OSError`` that names no file (a write that found the disk
    full) is given ``path``'s name."""
    descriptor = stream_descriptor(path)
    if descriptor is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            with os.fdopen(os.dup(descriptor), "w") as f:
                yield f
        except OSError as e:
            if e.filename is None:
                e.filename = str(path)
            raise
        return
    in_place = written_in_place(path)
    final = path.resolve() if path.is_symlink() and not in_place else path
    target = final if in_place else staging_path(final)
    if not in_place:
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_siblings(final)
    try:
        with target.open("w") as f:
            yield f
        if not in_place:
            target.replace(final)
    except OSError as e:
        if e.filename in (None, str(target)):
            e.filename = str(path)
        raise
    finally:
        if not in_place:
            target.unlink(missing_ok=True)


SIBLING = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)(?P<pid>\d+)")
"""What a writer keeps beside an output ``<name>`` while it works: ``.<name>.tmp<pid>``, the new file or folder being
written, and ``.<name>.old<pid>``, the folder it replaces, during :func:`replace_folder`."""


def staging_path(final: Path) -> Path:
    """Where this process writes ``final``'s new file or folder before it takes the name: ``.<name>.tmp<pid>``."""
    return final.with_name(f".{final.name}.tmp{os.getpid()}")


def replace_folder(staging: Path, final: Path) -> None:
    """Give the finished folder ``staging`` the name ``final`` by renames, never deleting under that name: an
    existing ``final`` is renamed aside (:func:`set_aside`), ``staging`` renamed in, and the old one removed
    last. A reader sees the old folder or the new one, whole; a writer killed between the renames leaves no folder
    under the name, and the next writer's :func:`remove_stale_siblings` puts the old one back."""
    if not final.exists():
        staging.rename(final)
        return
    old = set_aside(final)
    staging.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def set_aside(final: Path) -> Path:
    """Rename the folder ``final`` aside, to ``.<name>.old<pid>`` beside it, until what replaces it is whole; that
    path. :func:`put_back` undoes it; a writer killed meanwhile leaves it for :func:`remove_stale_siblings`."""
    old = final.with_name(f".{final.name}.old{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    final.rename(old)
    return old


def folder_identity(folder: Path) -> tuple[int, int] | None:
    """The folder's device and inode: a replacement (:func:`replace_folder`) gives the name another, a folder put
    back (:func:`put_back`) its own again; None where nothing is there."""
    try:
        stat = folder.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


def put_back(old: Path, final: Path) -> None:
    """Undo :func:`set_aside`: remove what is under the name ``final`` now, and rename ``old`` back to it."""
    if final.is_dir() and not final.is_symlink():
        shutil.rmtree(final)
    else:
        final.unlink(missing_ok=True)
    old.rename(final)


def remove_stale_siblings(final: Path) -> list[Path]:
    """Clean what writers of ``final`` that were killed (``SIGKILL``, a power cut: no clean-up ran) left beside it
    (:data:`SIBLING`), where their process is gone: a folder they were replacing comes back under the name if
    nothing is there (killed between :func:`replace_folder`'s renames), and the rest is removed.

    Returns:
        The files and folders removed.
    """
    found = []
    for path in final.parent.glob(f".{glob.escape(final.name)}.*") if final.parent.is_dir() else ():
        match = SIBLING.fullmatch(path.name)
        if match is not None and match["name"] == final.name and not _alive(int(match["pid"])):
            found.append((match["kind"], path))
    removed = []
    for kind, path in sorted(found, key=lambda found: found[0] != "old"):  # a folder to restore first
        if kind == "old" and not final.exists() and not final.is_symlink():
            path.rename(final)
            log.warning("restored %s, which a writer killed while replacing it had renamed aside", final)
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    if removed:
        log.info("removed what interrupted writers of %s left: %s", final, ", ".join(map(str, removed)))
    return removed


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (this one included)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through :func:`open_whole`."""
    with open_whole(path) as f:
        f.write(text)


class OutputHold:
    """A job's hold on an output (:func:`hold_output`): the lock file ``path``, locked on the open file ``fd``."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Remove the lock file, then let go of the lock (a process that opened the file just before finds it gone
        and takes a new one: :func:`hold_output`)."""
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def hold_output(output: Path) -> OutputHold | None:
    """This process's hold on ``output``, or None where another process holds it: an exclusive lock (``flock``) on
    the file ``.<name>.lock`` beside ``output``, removed on :meth:`OutputHold.release`. The lock is the kernel's: a
    killed job lets go of it as it dies (its file may stay, and is taken over). Two jobs that would write the same
    output (the same ``--run_name``, the same ``--output``) so meet; the job's other processes take none."""
    output.parent.mkdir(parents=True, exist_ok=True)
    path = output.with_name(f".{output.name}.lock")
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            here = os.stat(path)
        except FileNotFoundError:
            here = None
        mine = os.fstat(fd)
        if here is not None and (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
            return OutputHold(path, fd)
        os.close(fd)  # its holder removed the file we opened as it let go: take the one there now
