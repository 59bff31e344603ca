"""Token-budget batching over length-sorted sequences, and gathering flat segments."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def round_up(length: Any, multiple: int) -> Any:
    """``length`` (an int, or an integer array element-wise) rounded up to a multiple of ``multiple`` (1: itself):
    the padded width of a batch whose longest sequence has ``length`` tokens, or a bucketed width."""
    if multiple < 1:
        raise ValueError(f"the padding multiple must be positive, got {multiple}")
    return -(-length // multiple) * multiple


def token_budget_batches(
    lengths: Sequence[int] | np.ndarray, max_tokens: int, sizes: Sequence[int] | np.ndarray | None = None
) -> list[list[int]]:
    """Group units into batches whose padded size stays within a token budget.

    Units are taken longest first (stably: ties keep input order), so each batch holds units of similar length and
    padding is small. A batch's padded size is ``rows x the length of its first (longest) unit``, where each unit
    takes ``sizes[i]`` rows (default 1: a unit is one sequence; a query's chunk of candidates takes one row per
    candidate); a batch closes when one more unit would take it past ``max_tokens``. A unit over the budget gets a
    batch of its own. The result is deterministic for given inputs.

    Args:
        lengths: ``[units]`` the (padded) token count of each unit's longest sequence.
        max_tokens: the budget of padded tokens per batch.
        sizes: ``[units]`` rows of each unit (None: 1 each).

    Returns:
        Batches of indices into ``lengths``; every index appears exactly once.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    widths = lengths[order].tolist()
    batches: list[list[int]] = []
    if sizes is None:  # a batch is the next max_tokens // width units: one step per batch, not per unit
        start = 0
        while start < len(order):
            count = max(1, max_tokens // widths[start]) if widths[start] else len(order)
            batches.append(order[start : start + count].tolist())
            start += count
        return batches
    rows = np.asarray(sizes, dtype=np.int64)[order].tolist()
    current: list[int] = []
    taken = width = 0
    for unit, unit_width, unit_rows in zip(order.tolist(), widths, rows, strict=True):
        if current and (taken + unit_rows) * width > max_tokens:
            batches.append(current)
            current, taken = [], 0
        if not current:
            width = unit_width
        current.append(unit)
        taken += unit_rows
    if current:
        batches.append(current)
    return batches


def segments(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices ``starts[0] .. starts[0] + lengths[0] - 1``, then those of the next segment, ...: ``[sum(lengths)]``
    int64 (numpy, no Python loop)."""
    starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    return np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) - np.repeat(ends - lengths - starts, lengths)
