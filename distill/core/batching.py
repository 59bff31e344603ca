"""Token-budget batching over length-sorted sequences, and gathering flat segments."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def token_budget_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group sequence indices into batches whose padded size stays within a token budget.

    Sequences are taken longest first, so each batch holds sequences of similar length and
    padding is small. A batch's padded size is ``len(batch) * max(lengths in batch)``; it is
    at most ``max_tokens``, except for a single sequence longer than the budget, which gets a
    batch of its own. The result is deterministic for given ``lengths`` (ties keep input order).

    Args:
        lengths: token count of each sequence.
        max_tokens: the budget of padded tokens per batch.

    Returns:
        Batches of indices into ``lengths``; every index appears exactly once.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Longest first: the batch's first sequence sets its padded length.
        if current and lengths[current[0]] * (len(current) + 1) > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def segments(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices ``starts[0] .. starts[0] + lengths[0] - 1``, then those of the next segment, ...: ``[sum(lengths)]``
    int64 (numpy, no Python loop)."""
    starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    return np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) - np.repeat(ends - lengths - starts, lengths)
