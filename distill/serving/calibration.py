"""Calibrated scores: a student's raw score mapped to a probability of relevance.

A student's raw scores sit on whatever scale its training left them (a listwise loss fixes only their differences
within a query), so their plain sigmoid can be 0.99998 for every passage. The export fits Platt scaling,
``p = sigmoid(scale · raw + bias)``, on the judged pairs of the student's validation queries: a monotone map (``scale``
> 0), so the ranking is the raw scores'. ``card.json`` keeps it as ``score_calibration`` with its quality on those
pairs (:class:`CalibrationQuality`); serving reads it for every normalised score.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distill.core.run_folder import EXPORT_CARD
from distill.core.schema import InputError

ITERATIONS = 100
"""Newton steps at most: the two-parameter log-likelihood is concave, so a few dozen reach its optimum."""
BINS = 10
"""Equal-width probability bins of the expected calibration error."""


def sigmoid(values: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-values))`` in float64, as ``(1 + tanh(values / 2)) / 2``: no overflow for any value."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(values, dtype=np.float64)))


@dataclass(frozen=True)
class CalibrationQuality:
    """How well the probabilities fit the judgments they were fitted on."""

    pairs: int
    """Judged pairs fitted on."""
    relevant: int
    """Of them, judged relevant."""
    brier: float
    """Mean squared error of the probabilities against the 0/1 judgments."""
    ece: float
    """Expected calibration error over :data:`BINS` equal-width bins: the pairs' weighted mean |mean p − share
    relevant|."""
    p05: float
    """The probabilities' 5th percentile."""
    p95: float
    """Their 95th percentile."""


@dataclass(frozen=True)
class ScoreCalibration:
    """Platt scaling: ``probability(raw) = sigmoid(scale · raw + bias)``, ``scale`` > 0."""

    scale: float
    bias: float
    method: str = "platt"
    fitted_on: str = ""
    """What it was fitted on (the judged validation pairs' source)."""
    quality: CalibrationQuality | None = None

    def probability(self, raw: np.ndarray) -> np.ndarray:
        """``[n]`` float64 probabilities of relevance of ``[n]`` raw scores."""
        return sigmoid(self.scale * np.asarray(raw, dtype=np.float64) + self.bias)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str) -> ScoreCalibration:
        """Read a card's ``score_calibration``.

        Raises:
            InputError: ``<where>: score_calibration: ...``: a missing or non-finite ``scale``/``bias``, a scale
                that is not positive, or an unknown method.
        """
        try:
            scale, bias = float(values["scale"]), float(values["bias"])
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{where}: score_calibration: needs numbers scale and bias, got {values!r}") from None
        if not (np.isfinite(scale) and np.isfinite(bias) and scale > 0):
            raise InputError(f"{where}: score_calibration: scale must be positive and bias finite, got {values!r}")
        if values.get("method", "platt") != "platt":
            raise InputError(f"{where}: score_calibration: unknown method {values.get('method')!r} (platt)")
        quality = values.get("quality")
        return cls(
            scale, bias, "platt", str(values.get("fitted_on", "")), CalibrationQuality(**quality) if quality else None
        )


def fit_platt(raw: np.ndarray, relevant: np.ndarray, fitted_on: str = "") -> ScoreCalibration:
    """Fit Platt scaling by Newton's method on raw scores ``[n]`` and their 0/1 judgments ``[n]``.

    The targets are Platt's smoothed ones, ``(positives + 1) / (positives + 2)`` and ``1 / (negatives + 2)``,
    which keep the fit finite where the scores separate the classes.

    Raises:
        InputError: fewer than two pairs, or judgments of one class only (nothing to calibrate against).
    """
    x = np.asarray(raw, dtype=np.float64)
    y = np.asarray(relevant, dtype=bool)
    positives, negatives = int(y.sum()), int((~y).sum())
    if positives == 0 or negatives == 0:
        raise InputError(f"score calibration: the pairs ({fitted_on or 'all given'}) hold {positives} relevant and "
                         f"{negatives} non-relevant judged pairs: both are needed")  # fmt: skip
    target = np.where(y, (positives + 1) / (positives + 2), 1 / (negatives + 2))
    mean, spread = x.mean(), x.std() or 1.0
    z = (x - mean) / spread  # Newton on standardised scores, mapped back below
    a, b = 1.0, float(np.log((positives + 1) / (negatives + 1)))
    for _ in range(ITERATIONS):
        p = sigmoid(a * z + b)
        w = np.maximum(p * (1 - p), 1e-12)
        gradient = np.array([np.dot(p - target, z), np.sum(p - target)])
        hessian = np.array([[np.dot(w, z * z), np.dot(w, z)], [np.dot(w, z), np.sum(w)]]) + 1e-9 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        a, b = a - step[0], b - step[1]
        if np.abs(step).max() < 1e-10:
            break
    scale, bias = a / spread, b - a * mean / spread
    if not scale > 0:
        raise InputError(f"score calibration: higher scores are less often relevant on the pairs "
                         f"({fitted_on or 'all given'}): the student ranks against its judgments")  # fmt: skip
    fitted = ScoreCalibration(float(scale), float(bias), fitted_on=fitted_on)
    return ScoreCalibration(fitted.scale, fitted.bias, fitted_on=fitted_on, quality=assess(fitted.probability(x), y))


def assess(probabilities: np.ndarray, relevant: np.ndarray) -> CalibrationQuality:
    """The Brier score, expected calibration error and spread of ``[n]`` probabilities against ``[n]`` 0/1
    judgments."""
    p = np.asarray(probabilities, dtype=np.float64)
    y = np.asarray(relevant, dtype=np.float64)
    bins = np.minimum((p * BINS).astype(np.int64), BINS - 1)
    counts = np.bincount(bins, minlength=BINS)
    gaps = np.abs(np.bincount(bins, weights=p, minlength=BINS) - np.bincount(bins, weights=y, minlength=BINS))
    p05, p95 = np.quantile(p, [0.05, 0.95])
    return CalibrationQuality(
        pairs=len(p),
        relevant=int(y.sum()),
        brier=round(float(np.mean((p - y) ** 2)), 6),
        ece=round(float(gaps.sum() / max(counts.sum(), 1)), 6),
        p05=round(float(p05), 6),
        p95=round(float(p95), 6),
    )


def read_calibration(folder: Path) -> ScoreCalibration | None:
    """The score calibration of the export ``folder`` (its ``card.json``'s ``score_calibration``); None for a
    folder without one (an HF training folder, an export made before calibration).

    Raises:
        InputError: a malformed ``score_calibration`` (the message names the file).
    """
    card = folder / EXPORT_CARD
    if not card.is_file():
        return None
    try:
        values = json.loads(card.read_text()).get("score_calibration")
    except (json.JSONDecodeError, AttributeError):
        return None  # check_model_folder reports a malformed card
    return ScoreCalibration.from_dict(values, str(card)) if values else None


def normalised(raw: np.ndarray, calibration: ScoreCalibration | None, fused: bool) -> np.ndarray:
    """The scores shown as normalised: the calibrated probability of the student's raw scores, or the plain sigmoid
    of fused scores (a sum of per-query z-scores, which the calibration was not fitted on) and of a student without
    a calibration."""
    if calibration is None or fused:
        return sigmoid(raw)
    return calibration.probability(raw)
