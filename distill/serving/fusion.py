"""Which α fuses a student's scores with a first stage's (:func:`distill.core.interpolation.interpolate`), from the
serving options (``interpolation``, ``first_stage``) and the student's card, which holds an α for each first stage it
was validated on. :meth:`Reranker.load <distill.serving.reranker.Reranker.load>` fuses every call with one α;
``distill serve`` fuses each request that sends first-stage scores with the α of the first stage it names."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence, Set, Sized
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path

import numpy as np

from distill.core.schema import InputError
from distill.core.student_card import StudentCard


def first_stage_array(scores: Sequence[float], passages: int) -> np.ndarray:
    """``[passages]`` float64 first-stage scores, one per passage: a list, a tuple, a numpy array, a pandas Series
    (in its order), or any sized collection that keeps an order.

    Raises:
        InputError: one line: not one per passage, or one that is not a finite number (a string, a bool, None, NaN).
    """
    unordered = isinstance(scores, str | bytes | Mapping | Set)
    if unordered or not (isinstance(scores, Sized) and isinstance(scores, Iterable)):
        raise InputError(f"first_stage_scores: a sequence of numbers, one per passage, not {type(scores).__name__}")
    scores = list(scores)
    if len(scores) != passages:
        raise InputError(f"first_stage_scores: {len(scores)} scores for {passages} passages: give one per passage")
    for i, value in enumerate(scores):
        if isinstance(value, bool | np.bool_) or not isinstance(value, Real) or not math.isfinite(value):
            raise InputError(f"first_stage_scores[{i}]: {value!r} is not a finite number")
    return np.asarray(scores, dtype=np.float64)


@dataclass(frozen=True)
class Fusion:
    """The α of each first stage, and the options that choose among them."""

    where: str
    """The student's folder, for messages."""
    alphas: dict[str, float] = field(default_factory=dict)
    """The card's α of each first stage (empty: none chosen)."""
    interpolation: bool | float | None = None
    """The ``interpolation`` option (:class:`~distill.serving.options.ServingOptions`)."""
    first_stage: str | None = None
    """The ``first_stage`` option: the first stage fused with when none is named."""
    by_default: bool = False
    """Whether the card says to fuse by default (its ``interpolate``)."""

    @classmethod
    def of(cls, folder: str | Path, interpolation: bool | float | None, first_stage: str | None) -> Fusion:
        """The fusion of the student in ``folder`` under those options; a ``first_stage`` the card has no α for is
        refused here.

        Raises:
            InputError: one line naming the card's first stages (or saying it has no α), or an ``interpolation``
                number outside [0, 1].
        """
        number = isinstance(interpolation, int | float) and not isinstance(interpolation, bool)
        if number and not 0 <= interpolation <= 1:
            raise InputError(f"interpolation: an alpha is in [0, 1] (true, false or a number), not {interpolation}")
        card = StudentCard.find(folder)
        fusion = cls(
            str(folder),
            card.alphas() if card is not None else {},
            interpolation,
            first_stage,
            card is not None and card.interpolate,
        )
        if (interpolation is True and not fusion.alphas) or (first_stage is not None and interpolation is not False):
            fusion.alpha(first_stage)
        return fusion

    @property
    def enabled(self) -> bool:
        """Whether first-stage scores may be fused at all (not ``interpolation: false``)."""
        return self.interpolation is not False

    @property
    def fixed(self) -> float | None:
        """The α that ``interpolation`` gives as a number, whatever the first stage."""
        value = self.interpolation
        return None if value is None or isinstance(value, bool) else float(value)

    def known(self) -> str:
        """The card's first stages, for messages."""
        return ", ".join(self.alphas) or "none"

    def alpha(self, first_stage: str | None = None) -> float:
        """The α to fuse the scores of ``first_stage`` with (default: the ``first_stage`` option's, else the card's
        only first stage).

        Raises:
            InputError: one line: fusion is off, the card has no α, the first stage is not one of the card's (naming
                them), or none is named and the card has several.
        """
        if not self.enabled:
            raise InputError(f"{self.where}: fusion with a first stage is off (interpolation: false)")
        if self.fixed is not None:
            return self.fixed
        if not self.alphas:
            raise InputError(
                f"{self.where}: its card has no interpolation alpha (trained without qrels?): give interpolation a "
                "number"
            )
        name = first_stage if first_stage is not None else self.first_stage
        if name is None:
            if len(self.alphas) > 1:
                raise InputError(
                    f"{self.where}: its card has an alpha for each of the first stages {self.known()}: name one "
                    "(first_stage)"
                )
            return next(iter(self.alphas.values()))
        if name not in self.alphas:
            raise InputError(f"first stage {name!r} is not one of the student's: {self.known()}")
        return self.alphas[name]

    def applied(self) -> tuple[str | None, float] | None:
        """The first stage and the α every call of a reranker fuses with (None: the student's scores alone): a
        number given, the card's α when ``interpolation`` is true, ``first_stage`` is named or the card says to
        fuse by default."""
        if not self.enabled:
            return None
        if self.fixed is not None:
            return None, self.fixed
        if self.interpolation is True or self.first_stage is not None or self.by_default:
            alpha = self.alpha()
            name = self.first_stage if self.first_stage is not None else next(iter(self.alphas))
            return name, alpha
        return None
