"""Measuring: device synchronisation, peak memory, the matmul rate FLOP floors are taken against, and the
environment recorded with every result. Shared by ``distill bench`` and the other benchmarks
(:mod:`benchmarks.phases`)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from distill.core.project_files import PROJECT


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def vm_hwm_bytes() -> int | None:
    """The process's peak resident set size (``VmHWM`` of ``/proc/self/status``), bytes; None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_vm_hwm() -> bool:
    """Reset the process's peak RSS to its current RSS (Linux ``clear_refs`` 5); False where that is refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class MemoryProbe:
    """Peak memory of a phase, in bytes.

    On a GPU, the CUDA allocator's peak since :meth:`reset` (weights included). On Linux CPUs, the process's
    peak resident set size since :meth:`reset` (``VmHWM`` after ``clear_refs``; weights and data included).
    Elsewhere, the process's peak RSS since it started (``ru_maxrss``), which never goes down.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.kind = "process peak RSS since start (ru_maxrss; earlier phases included)"
        if device.type == "cuda":
            self.kind = "torch.cuda.max_memory_allocated (weights included)"
        elif reset_vm_hwm() and vm_hwm_bytes() is not None:
            self.kind = "process peak RSS of the phase (VmHWM after clear_refs; weights and data included)"

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.kind.startswith("process peak RSS of the phase"):
            reset_vm_hwm()

    def peak(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        hwm = vm_hwm_bytes()
        if hwm is not None:
            return hwm
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux


def _square_matmul_rate(call: Callable[[], object], device: torch.device, size: int, reps: int) -> float:
    """FLOP/s of ``call``, a ``size``-square matmul (``2 * size**3`` FLOP), after 3 untimed calls, over ``reps``."""
    for _ in range(3):
        call()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        call()
    synchronize(device)
    return 2 * size**3 * reps / (time.perf_counter() - start)


def matmul_flops_per_s(device: torch.device, dtype: torch.dtype, size: int, reps: int) -> float:
    """FLOP/s of a ``size``-square matmul in ``dtype`` (``2 * size**3`` FLOP each), averaged over ``reps``."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    c = torch.empty(size, size, device=device, dtype=dtype)
    return _square_matmul_rate(lambda: torch.matmul(a, b, out=c), device, size, reps)


def int8_matmul_ops_per_s(size: int, reps: int, threads: int = 0) -> float:
    """Integer ops/s (``2 * size**3`` a call: a multiply and an add per product) of a ``size``-square uint8 x int8
    matmul with int32 results on onnxruntime's CPU kernels (``MatMulInteger``, the kernel of the int8 graphs),
    averaged over ``reps`` calls; ``threads`` intra-op threads (0: one per physical core)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.integers(-128, 128, (size, size), dtype=np.int8), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["c"])],
        "int8_matmul",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [size, size])],
        [helper.make_tensor_value_info("c", TensorProto.INT32, [size, size])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {"a": rng.integers(0, 256, (size, size), dtype=np.uint8)}
    for _ in range(3):
        session.run(None, feed)
    start = time.perf_counter()
    for _ in range(reps):
        session.run(None, feed)
    return 2 * size**3 * reps / (time.perf_counter() - start)


def environment(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """Device, the CPU's features that ``backend="auto"`` reads (and this CPU's, which a profile may differ from),
    library versions, threads (torch's, and ``TOKENIZERS_PARALLELISM``: unset or true, fast tokenizers encode in
    parallel), compute dtype, git commit and UTC time of this run."""
    import transformers

    from distill.serving.hardware import CPUINFO, CpuFeatures

    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "cpu_features": CpuFeatures.read().describe(),
        # what the CPU is, where CIS_DISTILL_CPU_PROFILE made the decisions for another: the timings are this one's
        "cpu_features_measured": CpuFeatures.read(CPUINFO).describe(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch_threads": torch.get_num_threads(),
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM"),
        "dtype": dtype_name(dtype),
        "git_commit": git_commit(),
        "utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


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
            ["git", "-C", str(PROJECT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None
