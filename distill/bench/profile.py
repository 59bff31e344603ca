"""Where a stage's time goes: ``torch.profiler`` over its timed phase, summed by kernel category.

A profile records a span of work (:class:`StageProfile`: ``start`` and ``stop``, or :func:`profiled` around a
block) and writes two files:

- ``<path>`` (text): the span's wall time, the device's busy share, the time by category, then the operators and
  kernels by self time (``torch.profiler``'s key-averages table, 40 rows);
- ``<path>`` with the suffix ``.json``: the same figures, for tools.

Categories are read from kernel (on CUDA) or operator (on a CPU) names: ``gemm`` (matmuls), ``attention``,
``memory`` (copies, gathers, scatters, casts' copies) and ``other`` (elementwise, norms, reductions). The profiler
slows what it records: figures from a profiled run are no timings, and the benchmarks record them apart.

On CUDA the figures come from the device's timeline (:func:`device_kernels`): its kernels, copies and sets, without
the ranges annotated over them (``record_function`` and the optimizer's step, which the profiler also puts on the
device's timeline, spanning the kernels they launched). The busy share is the union of those intervals over the
span (:func:`busy_seconds`), so kernels that overlap (on several streams) count once; the categories sum each
kernel's own time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("flash", "fmha", "attention", "sdpa", "varlen", "softmax")),
    ("gemm", ("gemm", "cutlass", "nvjet", "xmma", "scaled_mm", "aten::mm", "aten::addmm", "aten::bmm", "matmul")),
    ("memory", ("memcpy", "memset", "copy", "index", "gather", "scatter", "aten::cat", "fill")),
)
"""Category -> substrings of a lower-cased kernel or operator name, tried in this order; ``other`` for the rest."""
TABLE_ROWS = 40


def category(name: str) -> str:
    """The category of a kernel or operator ``name`` (see :data:`CATEGORIES`)."""
    lowered = name.lower()
    for label, needles in CATEGORIES:
        if any(needle in lowered for needle in needles):
            return label
    return "other"


UNSEEN = (
    "torch.profiler recorded no operator in this span: the work ran outside torch (onnxruntime's or OpenVINO's "
    "kernels), which it cannot see; their own profilers can"
)
"""The table of a span with no torch operator in it."""


class StageProfile:
    """A ``torch.profiler`` recording of a span of work on ``device``, written to ``path`` (see the module)."""

    def __init__(self, path: Path, device: torch.device) -> None:
        self.path, self.device = Path(path), device
        self.cuda = device.type == "cuda"
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if self.cuda else [])]
        self.profiler = profile(activities=activities)
        self.started: float | None = None
        self.summary: dict[str, Any] | None = None

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self.profiler.start()
        self.started = time.perf_counter()

    def stop(self) -> dict[str, Any]:
        """End the span, write the files, and return the summary."""
        if self.started is None:
            raise RuntimeError("StageProfile.stop() before start()")
        if self.cuda:
            torch.cuda.synchronize(self.device)
        span = time.perf_counter() - self.started
        self.profiler.stop()
        self.summary = summarise(self.profiler, span, self.cuda)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.with_suffix(".json").write_text(json.dumps(self.summary, indent=2) + "\n")
        sort = "self_device_time_total" if self.cuda else "self_cpu_time_total"
        averages = self.profiler.key_averages()
        table = averages.table(sort_by=sort, row_limit=TABLE_ROWS, max_name_column_width=80) if averages else UNSEEN
        self.path.write_text(format_summary(self.summary) + "\n\n" + table + "\n")
        return self.summary


@contextmanager
def profiled(path: Path | None, device: torch.device) -> Iterator[StageProfile | None]:
    """A :class:`StageProfile` over the block, written to ``path``; nothing where ``path`` is None."""
    if path is None:
        yield None
        return
    recording = StageProfile(path, device)
    recording.start()
    try:
        yield recording
    finally:
        recording.stop()


Kernel = tuple[float, float, str]
"""A device activity: start and end (µs, on the profiler's clock) and name."""


def summarise(profiler: Any, span_s: float, cuda: bool) -> dict[str, Any]:
    """The span's seconds by category: the device's kernels on CUDA (and the device's busy share of the span), the
    operators' self CPU time elsewhere."""
    if cuda:
        return kernel_summary(device_kernels(profiler.events()), span_s)
    by_category: dict[str, float] = {}
    for event in profiler.key_averages():
        seconds = event.self_cpu_time_total / 1e6
        if seconds > 0:
            label = category(event.key)
            by_category[label] = by_category.get(label, 0.0) + seconds
    return _summary(span_s, "operators' self CPU time", by_category)


NOT_WORK = frozenset({"gpu_user_annotation", "cuda_sync", "cuda_profiler_range"})
"""Activity types (``FunctionEvent.activity_type``, as kineto names them) that the profiler puts on the device's
timeline without being work there: annotated ranges (around the kernels they launched), synchronisations (the
device waiting on the host) and profiler ranges."""


def device_kernels(events: Iterable[Any]) -> list[Kernel]:
    """The device activities of a profile's events (``profiler.events()``): kernels, copies and sets, without the
    ranges of :data:`NOT_WORK` (``is_user_annotation``: ``record_function`` ranges and ``Optimizer.step#...``,
    which span the kernels they launched, gaps included: counted with them, a step would read more than 100%
    busy)."""
    return [
        (event.time_range.start, event.time_range.end, event.name)
        for event in events
        if getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA
        and not getattr(event, "is_user_annotation", False)
        and getattr(event, "activity_type", None) not in NOT_WORK
    ]


def kernel_summary(kernels: Sequence[Kernel], span_s: float) -> dict[str, Any]:
    """The summary of the device activities ``kernels`` over a span of ``span_s`` seconds: each category's kernel
    time (every kernel's own duration), and the busy share: the union of the intervals (:func:`busy_seconds`)
    over the span."""
    by_category: dict[str, float] = {}
    for start, end, name in kernels:
        seconds = (end - start) / 1e6
        if seconds > 0:
            label = category(name)
            by_category[label] = by_category.get(label, 0.0) + seconds
    busy = busy_seconds((start, end) for start, end, _ in kernels)
    summary = _summary(span_s, "kernels' device time", by_category)
    return {**summary, "busy_s": busy, "busy_fraction": busy / span_s if span_s > 0 else None}


def busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by at least one of the ``intervals`` (start, end in µs): their union, so that overlapping
    or nested intervals count once."""
    busy, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        busy += end - max(start, reach)
        reach = end
    return busy / 1e6


def _summary(span_s: float, measured: str, by_category: dict[str, float]) -> dict[str, Any]:
    total = sum(by_category.values())
    ranked = dict(sorted(by_category.items(), key=lambda kv: -kv[1]))
    return {
        "span_s": span_s,
        "measured": measured,
        "total_s": total,
        "busy_s": None,
        "busy_fraction": None,
        "by_category_s": ranked,
        "by_category_share": {k: v / total for k, v in ranked.items()} if total else {},
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The summary in a few lines: span, busy share, and each category's seconds and share."""
    busy = summary["busy_fraction"]
    lines = [f"span {summary['span_s']:.3f} s; {summary['measured']} {summary['total_s']:.3f} s"]
    if busy is not None:
        lines[0] += f"; device busy {summary['busy_s']:.3f} s, {busy:.1%} of the span"
    for label, seconds in summary["by_category_s"].items():
        lines.append(f"  {label:<10} {seconds:9.4f} s  {summary['by_category_share'][label]:6.1%}")
    return "\n".join(lines)
