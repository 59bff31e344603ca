"""Token-budget batching over length-sorted sequences."""

from __future__ import annotations

from collections.abc import Sequence


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
