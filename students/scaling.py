"""Target scaling: how teacher scores are standardised before the student regresses them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

ScalingKind = Literal["none", "global", "per_query"]


@dataclass(frozen=True)
class TargetScaling:
    """``none``: targets as given; ``global``: (t − mean) / std with the training set's mean and std;
    ``per_query``: each query's targets standardised by their own mean and std (ranks are unchanged).
    """

    kind: ScalingKind = "none"
    mean: float = 0.0
    std: float = 1.0

    @classmethod
    def fit(cls, kind: ScalingKind, targets: np.ndarray) -> TargetScaling:
        """The scaling of ``kind`` fitted on the training targets."""
        if kind not in ("none", "global", "per_query"):
            raise ValueError(f"target_scaling must be none, global or per_query, not {kind!r}")
        if kind != "global":
            return cls(kind)
        std = float(np.std(targets))
        return cls(kind, float(np.mean(targets)), std if std > 0 else 1.0)

    def __call__(self, targets: np.ndarray, qids: Sequence[str]) -> np.ndarray:
        """Scaled ``[n]`` targets; ``qids[i]`` is the query of ``targets[i]``."""
        targets = np.asarray(targets, dtype=np.float64)
        if self.kind == "none":
            return targets
        if self.kind == "global":
            return (targets - self.mean) / self.std
        out = np.empty_like(targets)
        _, index = np.unique(np.asarray(qids), return_inverse=True)
        for group in range(index.max() + 1):
            rows = index == group
            std = targets[rows].std()
            out[rows] = (targets[rows] - targets[rows].mean()) / (std if std > 0 else 1.0)
        return out

    def to_dict(self) -> dict:
        return asdict(self)
