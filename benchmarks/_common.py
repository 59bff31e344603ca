"""Helpers shared by the benchmark scripts: the command line recorded with every result, paths and names.
Measuring (synchronisation, peak memory, the matmul rate, the environment) is :mod:`distill.bench.measure`.

The scripts run as ``python benchmarks/<name>.py``, which puts this folder on ``sys.path``; they import
this module as ``_common``.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from distill.core.package_paths import PROJECT as ROOT

RESULTS = ROOT / "benchmarks" / "results"


# ----------------------------------------------------------------------------- reporting


def invocation(script: str, argv: Sequence[str] | None) -> dict[str, Any]:
    """The ``command`` (a shell line) and ``argv`` of this run; ``argv`` given means called as ``main(argv)``."""
    return {
        "command": "python " + shlex.join(sys.argv if argv is None else [script, *argv]),
        "argv": list(sys.argv if argv is None else argv),
    }


def slug(name: str) -> str:
    """A file-name-safe form of a model name or path: ``models/SmolLM2.gguf`` -> ``smollm2``."""
    stem = Path(name).name.removesuffix(".gguf") or name
    return re.sub(r"[^a-z0-9.]+", "-", stem.lower()).strip("-")


def writable_file(text: str) -> Path:
    """An argparse ``type`` for a result file: its folder is made now and must be writable, so that a bad path is
    one line before any work, not a traceback after it."""
    path = Path(text)
    if path.parent.exists() and not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {path.parent} is not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{text}: cannot make its folder ({e.strerror})") from None
    if path.is_dir() or not os.access(path.parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text}: not a writable file path")
    return path


def display_path(path: str | Path) -> str:
    """``path`` relative to the repository root where it lies inside it, else absolute."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def yes(flag: bool) -> str:
    return "met" if flag else "not met"
