"""The stage profiles' summary (distill/bench/profile.py): the device's busy share is the union of its kernels'
intervals over the span, never the sum of nested or overlapping ones (the H200 training profile read 197%)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from distill.bench.profile import busy_seconds, device_kernels, format_summary, kernel_summary, profiled, summarise

CUDA, CPU = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU


def event(
    start: float, end: float, name: str, device=CUDA, annotation: bool = False, kind: str | None = "kernel"
) -> SimpleNamespace:
    """A ``profiler.events()`` entry: times in µs, ``kind`` its ``activity_type``."""
    range_ = SimpleNamespace(start=start, end=end)
    kind = "gpu_user_annotation" if annotation else kind if device == CUDA else "cpu_op"
    return SimpleNamespace(
        time_range=range_, name=name, device_type=device, is_user_annotation=annotation, activity_type=kind
    )


def test_busy_time_is_the_union_of_the_intervals() -> None:
    assert busy_seconds([]) == 0.0
    assert busy_seconds([(0, 100), (200, 300)]) == pytest.approx(200e-6)  # apart: the sum
    assert busy_seconds([(0, 100), (50, 150)]) == pytest.approx(150e-6)  # overlapping: counted once
    assert busy_seconds([(0, 1000), (100, 200), (300, 400)]) == pytest.approx(1000e-6)  # nested: the outer one
    assert busy_seconds([(300, 400), (0, 100), (100, 200), (150, 350)]) == pytest.approx(400e-6)  # any order


# One training step's device timeline, as the H200 profile holds it (µs): the optimizer step's annotation spans its
# kernels (gaps included), a compiled region's kernels overlap a copy on another stream.
STEP = [
    event(0, 400, "aten::mm", device=CPU),  # the host's operator: not on the device
    event(10, 110, "nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_NNT"),
    event(120, 220, "triton_poi_fused_gelu_view_10"),
    event(120, 220, "triton_poi_fused_gelu_view_10", device=CPU),  # its launcher, on the host
    event(200, 260, "Memcpy DtoD (Device -> Device)", kind="gpu_memcpy"),  # another stream: overlaps by 20 µs
    event(260, 300, "Stream Sync", kind="cuda_sync"),  # the device waiting on the host: no work
    event(300, 500, "Optimizer.step#AdamW.step", annotation=True),
    event(300, 350, "triton_poi_fused_adamw_0"),
    event(450, 500, "triton_poi_fused_adamw_1"),
]


def test_annotated_ranges_syncs_and_host_events_are_no_kernels() -> None:
    assert device_kernels(STEP) == [
        (10, 110, "nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_NNT"),
        (120, 220, "triton_poi_fused_gelu_view_10"),
        (200, 260, "Memcpy DtoD (Device -> Device)"),
        (300, 350, "triton_poi_fused_adamw_0"),
        (450, 500, "triton_poi_fused_adamw_1"),
    ]


def test_the_busy_share_counts_nested_and_overlapping_kernels_once() -> None:
    """Kernels 360 µs in all, of which 20 µs overlap: busy 340 µs of a 500 µs span (68%). Summing the events (the
    annotation over the optimizer's kernels too, as the profile did) would read 560 µs, 112%."""
    summary = summarise(SimpleNamespace(events=lambda: STEP), 500e-6, cuda=True)
    assert summary["busy_s"] == pytest.approx(340e-6) and summary["busy_fraction"] == pytest.approx(0.68)
    assert summary["total_s"] == pytest.approx(360e-6)  # the categories: each kernel's own time
    assert summary["by_category_s"] == pytest.approx({"other": 200e-6, "gemm": 100e-6, "memory": 60e-6})
    assert sum(summary["by_category_share"].values()) == pytest.approx(1.0)
    assert format_summary(summary).splitlines()[0].endswith("; device busy 0.000 s, 68.0% of the span")


def test_a_device_busy_throughout_reads_at_most_100_percent() -> None:
    """Back-to-back kernels under an annotation that spans them all, with a second stream busy at the same time:
    100%, not the 300% their sum would read."""
    kernels = [(i * 10.0, (i + 1) * 10.0, f"k{i}") for i in range(100)] + [(0.0, 1000.0, "memcpy")]
    summary = kernel_summary(kernels, 1000e-6)
    assert summary["busy_fraction"] == pytest.approx(1.0) and summary["total_s"] == pytest.approx(2000e-6)
    assert kernel_summary([], 1.0)["busy_fraction"] == 0.0 and kernel_summary(kernels, 0.0)["busy_fraction"] is None


def test_a_cpu_profile_has_no_busy_share(tmp_path: Path) -> None:
    """On a CPU the figures are the operators' self time; the files are written."""
    a = torch.randn(64, 64)
    with profiled(tmp_path / "p.txt", torch.device("cpu")) as recording:
        for _ in range(3):
            a = torch.mm(a, a).tanh()
    summary = recording.summary
    assert summary["busy_fraction"] is None and summary["busy_s"] is None and summary["by_category_s"]["gemm"] > 0
    assert json.loads((tmp_path / "p.json").read_text()) == summary
    assert "device busy" not in (tmp_path / "p.txt").read_text().splitlines()[0]


def test_events_without_an_activity_type_are_kernels_unless_annotated() -> None:
    """Older profilers name no activity type: their device events are kernels, except the annotated ranges."""
    events = [event(0, 100, "k", kind=None), event(0, 300, "range", annotation=True), event(0, 50, "host", CPU)]
    for e in events:
        e.activity_type = None
    assert device_kernels(events) == [(0, 100, "k")]
