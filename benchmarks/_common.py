"""Helpers shared by the benchmark scripts: device synchronisation, peak memory, the matmul rate that FLOP
fractions are measured against, the environment and command line recorded with every result, paths.

The scripts run as ``python benchmarks/<name>.py``, which puts this folder on ``sys.path``; they import
this module as ``_common``.
"""

from __future__ import annotations

import datetime as dt
import platform
import re
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


# ----------------------------------------------------------------------------- measurement


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class MemoryProbe:
    """Peak memory of a phase: the CUDA allocator's peak (bytes) on a GPU; on a CPU the process's peak
    resident set size (bytes) since it started, which never goes down and so includes earlier phases."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.kind = (
            "torch.cuda.max_memory_allocated (weights included)"
            if device.type == "cuda"
            else "process peak RSS since start (resource.getrusage ru_maxrss; weights, data, earlier phases included)"
        )

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux


def matmul_flops_per_s(device: torch.device, dtype: torch.dtype, size: int, reps: int) -> float:
    """FLOP/s of a ``size``-square matmul in ``dtype`` (``2 * size**3`` FLOP each), averaged over ``reps``."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    c = torch.empty(size, size, device=device, dtype=dtype)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        torch.matmul(a, b, out=c)
    synchronize(device)
    return 2 * size**3 * reps / (time.perf_counter() - start)


# ----------------------------------------------------------------------------- reporting


def invocation(script: str, argv: Sequence[str] | None) -> dict[str, Any]:
    """The ``command`` (a shell line) and ``argv`` of this run; ``argv`` given means called as ``main(argv)``."""
    return {
        "command": "python " + shlex.join(sys.argv if argv is None else [script, *argv]),
        "argv": list(sys.argv if argv is None else argv),
    }


def environment(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """Device, library versions, threads, compute dtype, git commit and UTC time of this run."""
    import transformers

    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch_threads": torch.get_num_threads(),
        "dtype": dtype_name(dtype),
        "git_commit": git_commit(),
        "utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def slug(name: str) -> str:
    """A file-name-safe form of a model name or path: ``models/SmolLM2.gguf`` -> ``smollm2``."""
    stem = Path(name).name.removesuffix(".gguf") or name
    return re.sub(r"[^a-z0-9.]+", "-", stem.lower()).strip("-")


def display_path(path: str | Path) -> str:
    """``path`` relative to the repository root where it lies inside it, else absolute."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None


def yes(flag: bool) -> str:
    return "met" if flag else "not met"
