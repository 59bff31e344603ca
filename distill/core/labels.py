"""What a student learns: a teacher score, or a hybrid label that fuses it with the first stage.

A label is named by a string:

- ``cis``, ``upr``, ``cis_q``, ... : a score column of the teacher dataset, as it is;
- ``cis_q+0.5*first_stage``: a hybrid label, per query ``z(cis_q) + 0.5 · z(first_stage_score)``, where ``z``
  standardises over the query's candidates (mean 0, standard deviation 1; a constant column gives 0). The
  paper's §7 names hybrid causal + similarity scoring as future work.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from distill.core.schema import InputError

FIRST_STAGE_COLUMN = "first_stage_score"
_HYBRID = re.compile(r"^\s*(?P<score>\w+)\s*\+\s*(?P<weight>[0-9.eE+-]+)\s*\*\s*first_stage\s*$")


def per_query_z(values: np.ndarray, qids: Sequence[str]) -> np.ndarray:
    """``values`` standardised within each query: ``[n]`` float64, mean 0 and std 1 per query (0 if constant)."""
    values = np.asarray(values, dtype=np.float64)
    _, index = np.unique(np.asarray(qids), return_inverse=True)
    counts = np.bincount(index)
    mean = np.bincount(index, weights=values) / counts
    centred = values - mean[index]
    std = np.sqrt(np.bincount(index, weights=centred**2) / counts)
    return np.divide(centred, std[index], out=np.zeros_like(centred), where=std[index] > 0)


@dataclass(frozen=True)
class Label:
    """A label: a teacher ``score`` column, plus ``first_stage_weight`` × the first stage for a hybrid one."""

    score: str
    first_stage_weight: float | None = None
    """None: the score as it is; a number w: per query z(score) + w · z(first stage)."""

    @classmethod
    def parse(cls, name: str) -> Label:
        """``cis`` or ``cis_q+0.5*first_stage``.

        Raises:
            InputError: neither form.
        """
        if re.fullmatch(r"\w+", name.strip()):
            return cls(name.strip())
        match = _HYBRID.match(name)
        if not match:
            raise InputError(f"label {name!r}: expected a score column (cis) or a hybrid (cis_q+0.5*first_stage)")
        try:
            weight = float(match.group("weight"))
        except ValueError:
            raise InputError(f"label {name!r}: {match.group('weight')!r} is not a number") from None
        return cls(match.group("score"), weight)

    @property
    def columns(self) -> tuple[str, ...]:
        """The dataset columns the label is made of."""
        return (self.score,) if self.first_stage_weight is None else (self.score, FIRST_STAGE_COLUMN)

    def values(self, score: np.ndarray, first_stage: np.ndarray, qids: Sequence[str]) -> np.ndarray:
        """The label of each pair, ``[n]`` float64: the score, or the hybrid of the score and the first stage."""
        if self.first_stage_weight is None:
            return np.asarray(score, dtype=np.float64)
        return per_query_z(score, qids) + self.first_stage_weight * per_query_z(first_stage, qids)

    def __str__(self) -> str:
        return (
            self.score if self.first_stage_weight is None else f"{self.score}+{self.first_stage_weight:g}*first_stage"
        )
