"""What the benchmark modules share: options, timed phases, the matmul ceiling, reports and results.

A benchmark is a module run as ``python -m benchmarks.<name>`` (:func:`main`). Its options are a typed dataclass
derived from :class:`BenchOptions` (or :class:`TimedOptions`), parsed by the project's config system as the
``distill`` subcommands parse theirs (:func:`distill.core.config.parse_config`: ``--flag value``, ``--flag`` alone
for true, ``--config file.yaml``, ``--help``; a bad option is one line naming it, before any work). It times
:class:`Phase` windows (:class:`Window`), takes their FLOP rates against a square matmul measured in the same run
(:class:`Ceiling`), prints a report (:func:`header`, :func:`table`) and writes one JSON result with the command
line and the environment (:func:`write_result`, :func:`distill.bench.measure.environment`) under
``benchmarks/results/`` (:data:`benchmarks.RESULTS`).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch

from benchmarks import CHECKOUT
from distill.bench.measure import MemoryProbe, dtype_name, matmul_flops_per_s, synchronize
from distill.core.schema import InputError, UserError

Options = TypeVar("Options")


# ----------------------------------------------------------------------------- options


@dataclass(kw_only=True)
class BenchOptions:
    """Options every benchmark takes."""

    threads: int | None = None
    """``torch.set_num_threads`` (default: torch's choice)."""
    out: str | None = None
    """The JSON result (default: under ``benchmarks/results/``, named after the run)."""

    REST: ClassVar[str | None] = None
    """The list field that the arguments after ``--`` fill (None: the benchmark takes none)."""

    def __post_init__(self) -> None:
        at_least(self, 1, "threads")
        writable(self, "out")


@dataclass(kw_only=True)
class TimedOptions(BenchOptions):
    """Options of a benchmark whose phases are taken against the rate of a large square matmul."""

    matmul_size: int | None = None
    """Side of the square matmul (default :data:`distill.core.devices.MATMUL_SIZE`: 8192 on cuda, 2048 on cpu)."""
    matmul_reps: int = 10
    """Timed matmul repetitions, after 3 untimed ones."""
    profile: str | None = None
    """Also record the stage's timed phase with ``torch.profiler`` into this file (:mod:`distill.bench.profile`;
    the profiler slows it, so the run's figures are a profile, not a timing)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "matmul_size", "matmul_reps")
        writable(self, "profile")


def at_least(options: object, minimum: int, *names: str) -> None:
    """Each option of ``names`` that is set is at least ``minimum``.

    Raises:
        InputError: ``--<name>: must be at least <minimum>, got <value>``.
    """
    for name in names:
        value = getattr(options, name)
        if value is not None and value < minimum:
            raise InputError(f"--{name}: must be at least {minimum}, got {value}")


def writable(options: object, name: str) -> None:
    """The file that option ``name`` gives (if set) can be written: its folder is made now, so that a bad path is
    one line before any work, not a traceback after it.

    Raises:
        InputError: ``--<name>: <path>: <why not>``.
    """
    text = getattr(options, name)
    if text is None:
        return
    path = Path(text)
    if path.parent.exists() and not path.parent.is_dir():
        raise InputError(f"--{name}: {text}: {path.parent} is not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"--{name}: {text}: cannot make its folder ({e.strerror})") from None
    if path.is_dir() or not os.access(path.parent, os.W_OK):
        raise InputError(f"--{name}: {text}: not a writable file path")


def main(
    options: type[Options],
    run: Callable[[Options, dict[str, Any]], int],
    module: str,
    argv: Sequence[str] | None = None,
) -> int:
    """Run the benchmark ``module`` (``python -m <module> ARGS [-- REST]``): ``run(options, invocation)`` with its
    options parsed from ``argv`` (default: the process's arguments; those after ``--`` fill the field that
    ``options.REST`` names) and :func:`invocation`. Returns ``run``'s exit status, or 2 after a one-line error on
    stderr for a bad option or input."""
    from distill.cli import quiet_third_parties
    from distill.core.config import parse_config

    argv = sys.argv[1:] if argv is None else list(argv)
    prog = f"python -m {module}"
    quiet_third_parties()
    ours = argv[: argv.index("--")] if "--" in argv else argv
    try:
        parsed = parse_config(options, ours, prog)
        if ours != argv:
            rest = getattr(options, "REST", None)
            if rest is None:
                raise InputError(f"unrecognized arguments after --: {shlex.join(argv[len(ours) + 1 :])}")
            parsed = dataclasses.replace(parsed, **{rest: argv[len(ours) + 1 :]})
        return run(parsed, invocation(prog, argv))
    except UserError as e:
        print(f"{prog}: error: {str(e).removeprefix(f'{prog}: ')}", file=sys.stderr)
        return 2


def invocation(prog: str, argv: Sequence[str]) -> dict[str, Any]:
    """The ``command`` (a shell line) and ``argv`` of a run, recorded with its result."""
    return {"command": f"{prog} {shlex.join(argv)}".rstrip(), "argv": list(argv)}


def free_memory() -> None:
    """Collect the garbage and return the CUDA allocator's cached blocks, between phases."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def set_threads(threads: int | None) -> None:
    """``torch.set_num_threads(threads)``, unless None (torch's choice)."""
    if threads is not None:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- timed phases


@dataclass(kw_only=True)
class Phase:
    """The figures of one timed window: what it did (a subclass's counts), its wall time, peak memory and FLOP
    rate. :attr:`RATES` names the counts also reported per second (``<count>_per_s`` in :meth:`to_json`)."""

    name: str
    seconds: float
    """Wall time, device synchronised at both ends."""
    peak_memory_bytes: int
    memory_kind: str
    """What ``peak_memory_bytes`` is (:class:`~distill.bench.measure.MemoryProbe`: GPU allocator or process RSS)."""
    padded_tokens: int
    """Tokens fed, padding included."""
    achieved_flops_per_s: float = 0.0
    """The model's FLOPs over the window (:meth:`flop_fraction`) per second."""
    breakdown_seconds: dict[str, float] = field(default_factory=dict)
    """Seconds of parts of the window."""

    RATES: ClassVar[tuple[str, ...]] = ()

    def per_s(self, count: str) -> float:
        """The count ``count`` (a field) per second of the window."""
        return getattr(self, count) / self.seconds

    def flop_fraction(self, flops: float, ceiling: float) -> float:
        """Record ``flops`` (the window's model FLOPs) per second as :attr:`achieved_flops_per_s`; return that rate
        over ``ceiling`` (FLOP/s)."""
        self.achieved_flops_per_s = flops / self.seconds
        return self.achieved_flops_per_s / ceiling

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), **{f"{count}_per_s": self.per_s(count) for count in self.RATES}}


class Window:
    """Times a window on ``device``: :meth:`start` resets the peak memory, synchronises and starts the clock;
    :meth:`lap` gives the seconds of a part of it; :meth:`stop` synchronises and reads the seconds and the peak
    (bytes) since :meth:`start`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.probe = MemoryProbe(device)
        self.began = self.mark = self.seconds = math.nan
        self.peak = 0

    def start(self) -> None:
        self.probe.reset()
        synchronize(self.device)
        self.began = self.mark = time.perf_counter()

    def lap(self) -> float:
        """Seconds since the start or the last lap, device synchronised."""
        synchronize(self.device)
        now = time.perf_counter()
        seconds, self.mark = now - self.mark, now
        return seconds

    def stop(self) -> float:
        """End the window; its seconds."""
        synchronize(self.device)
        self.seconds = time.perf_counter() - self.began
        self.peak = self.probe.peak()
        return self.seconds

    def __enter__(self) -> Window:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def figures(self) -> dict[str, Any]:
        """The :class:`Phase` fields this window gives: ``seconds``, ``peak_memory_bytes``, ``memory_kind``."""
        return {"seconds": self.seconds, "peak_memory_bytes": self.peak, "memory_kind": self.probe.kind}


def time_calls(
    calls: Sequence[Callable[[], object]], repeats: int, before: Callable[[], None] = lambda: None
) -> dict[str, Any]:
    """One untimed round of ``calls``, ``before()``, then ``repeats`` timed rounds: the p50, the p95 and every
    call's wall time, in seconds (host clock: for CPU work)."""
    for call in calls:
        call()
    before()
    seconds = []
    for _ in range(repeats):
        for call in calls:
            start = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - start)
    return {"p50_s": float(np.percentile(seconds, 50)), "p95_s": float(np.percentile(seconds, 95)), "seconds": seconds}


@dataclass
class Ceiling:
    """The rate (FLOP/s) phases are taken against: a ``size``-square matmul in ``dtype`` on ``device``, timed over
    ``reps`` (:func:`~distill.bench.measure.matmul_flops_per_s`) before and after the phases, the higher kept, so
    that a phase's fraction of it is the conservative one."""

    device: torch.device
    dtype: torch.dtype
    size: int
    reps: int
    before: float = math.nan
    after: float = math.nan

    def measure(self) -> None:
        """Time the matmul: the first call before the phases, the second after them."""
        rate = matmul_flops_per_s(self.device, self.dtype, self.size, self.reps)
        if math.isnan(self.before):
            self.before = rate
        else:
            self.after = rate

    @property
    def rate(self) -> float:
        return max(self.before, self.after)

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "reps": self.reps,
            "dtype": dtype_name(self.dtype),
            "flops_per_s": self.rate,
            "before_flops_per_s": self.before,
            "after_flops_per_s": self.after,
        }


# ----------------------------------------------------------------------------- reports


def header(result: dict[str, Any], model: Iterable[str], workload: str) -> list[str]:
    """A report's first lines: the command, the device, the model (``model``'s lines), the workload and the matmul
    ceiling of ``result`` (its ``command``, ``environment`` and ``matmul``)."""
    env, mm = result["environment"], result["matmul"]
    lines = [
        f"command   : {result['command']}",
        f"device    : {env['device']} ({env['device_name']}), torch {env['torch']}, {env['torch_threads']} threads",
    ]
    lines += [("model     : " if k == 0 else " " * 12) + line for k, line in enumerate(model)]
    lines.append(f"workload  : {workload}")
    lines.append(
        f"matmul    : {mm['size']}^3 {mm['dtype']}: {mm['flops_per_s'] / 1e12:.3f} TFLOP/s (the larger of "
        f"{mm['before_flops_per_s'] / 1e12:.3f} before and {mm['after_flops_per_s'] / 1e12:.3f} after)"
    )
    return lines


@dataclass(frozen=True)
class Column:
    """A column of a report's table: its header, its width (negative: left-aligned) and a row's cell."""

    header: str
    width: int
    cell: Callable[[Any], str]


def table(rows: Iterable[Any], columns: Sequence[Column]) -> str:
    """``rows`` as a text table, a header line first; a column widens to its longest cell."""
    cells = [[c.header for c in columns], *([c.cell(row) for c in columns] for row in rows)]
    widths = [max(abs(c.width), *(len(line[k]) for line in cells)) for k, c in enumerate(columns)]
    return "\n".join(
        " ".join(
            f"{cell:<{width}}" if col.width < 0 else f"{cell:>{width}}"
            for cell, col, width in zip(line, columns, widths, strict=True)
        ).rstrip()
        for line in cells
    )


def met(flag: bool) -> str:
    return "met" if flag else "not met"


def write_result(result: dict[str, Any], out: str | Path, table: Callable[[dict[str, Any]], str] | None = None) -> Path:
    """Write ``result`` as JSON to ``out`` (its folder made), and its ``table`` (Markdown) beside it (``.md``) and
    to the terminal, where one is given; say where."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    if table is not None:
        path.with_suffix(".md").write_text(table(result) + "\n")
        print(table(result))
    print(f"\nwrote {display_path(path)}")
    return path


def this_cpu() -> dict[str, Any]:
    """What a CPU result records of its machine and code: the CPU, its flags, its cores and the commit."""
    from distill.bench.measure import cpu_name, git_commit
    from distill.serving.hardware import CpuFeatures

    return {"cpu": cpu_name(), "cpu_features": CpuFeatures.read().describe(), "cores": os.cpu_count(),
            "git_commit": git_commit()}  # fmt: skip


def display_path(path: str | Path) -> str:
    """``path`` relative to the repository root where it lies inside it, else absolute."""
    path = Path(path).resolve()
    return str(path.relative_to(CHECKOUT)) if path.is_relative_to(CHECKOUT) else str(path)


def slug(name: str) -> str:
    """A file-name-safe form of a model name or path: ``models/SmolLM2.gguf`` -> ``smollm2``."""
    stem = Path(name).name.removesuffix(".gguf") or name
    return re.sub(r"[^a-z0-9.]+", "-", stem.lower()).strip("-")
