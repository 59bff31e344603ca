"""Timing one method on one workload: warm-up calls, then timed rounds of every call."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from distill.bench.measure import MemoryProbe, synchronize
from distill.bench.methods import Method
from distill.bench.profile import profiled
from distill.bench.workload import Workload


@dataclass
class Cell:
    """The figures of one (method, workload)."""

    method: str
    role: str
    dtype: str
    workload: str
    calls: int
    """Distinct calls of the workload (queries)."""
    pairs_per_call: float
    passage_tokens_per_call: float
    tokens_fed_per_call: float
    """Tokens the model reads per call, padding excluded (students: query + passage + special tokens)."""
    matmul_flops_per_call: dict[str, float]
    """Arithmetic (``float``, ``int8``) -> the FLOPs of a call's matmuls, padding excluded (see ``Method``)."""
    seconds: list[float]
    """Wall time of each timed call, device synchronised at both ends, tokenisation included."""
    peak_memory_bytes: int
    flop_floor_s: float | None
    """The time a call's matmul FLOPs take at the matmul rates measured in the same run (float, and int8 where
    the method has int8 matmuls): the hardware's limit for the call."""

    @property
    def p50_s(self) -> float:
        return float(np.percentile(self.seconds, 50))

    @property
    def p95_s(self) -> float:
        return float(np.percentile(self.seconds, 95))

    @property
    def pairs_per_s(self) -> float:
        return self.pairs_per_call * len(self.seconds) / sum(self.seconds)

    def to_json(self) -> dict:
        return {
            **{k: v for k, v in vars(self).items()},
            "n": len(self.seconds),
            "p50_s": self.p50_s,
            "p95_s": self.p95_s,
            "pairs_per_s": self.pairs_per_s,
            "floor_fraction": None if self.flop_floor_s is None else self.flop_floor_s / self.p50_s,
        }


def time_method(
    method: Method,
    workload: Workload,
    device: torch.device,
    warmup: int,
    repeats: int,
    max_seconds: float,
    rates: dict[str, float] | None,
    profile: Path | None = None,
) -> Cell:
    """Time ``method`` on every call of ``workload``.

    ``warmup`` untimed rounds, then up to ``repeats`` timed rounds (each round calls every call once), stopping
    after the first round that ends past ``max_seconds`` of timed work: slow methods get fewer samples, at
    least one round. ``rates`` (arithmetic -> matmul FLOP/s) give the FLOP floor; None for no floor. With
    ``profile``, ``torch.profiler`` records the timed rounds into that file (:mod:`distill.bench.profile`).
    """
    for _ in range(warmup):
        for call in workload.calls:
            method.score(call.query, call.passages)
    probe = MemoryProbe(device)
    probe.reset()
    seconds: list[float] = []
    with profiled(profile, device):
        for _ in range(repeats):
            for call in workload.calls:
                synchronize(device)
                start = time.perf_counter()
                scores = method.score(call.query, call.passages)
                synchronize(device)
                seconds.append(time.perf_counter() - start)
                if len(scores) != len(call.passages):
                    raise RuntimeError(f"{method.name}: {len(scores)} scores for {len(call.passages)} passages")
            if sum(seconds) > max_seconds:
                break
    tokens_fed = float(np.mean([method.tokens_fed(call) for call in workload.calls]))
    per_call = [method.matmul_flops(call) for call in workload.calls]
    flops = {kind: float(np.mean([f.get(kind, 0.0) for f in per_call])) for kind in per_call[0]}
    floor = None if rates is None else sum(n / rates[kind] for kind, n in flops.items())
    return Cell(
        method.name,
        method.role,
        method.dtype,
        workload.name,
        len(workload.calls),
        workload.pairs_per_call,
        workload.passage_tokens_per_call,
        tokens_fed,
        flops,
        seconds,
        probe.peak(),
        floor,
    )
