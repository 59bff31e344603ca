"""How the scorer lays sequences out in batches: one sequence per padded row, or several packed in a row.

A batch is ``[rows, width]`` token ids. Each row holds one sequence (padded) or several (packed, the
sequences back to back, each starting again at position 0); what follows the last sequence of a row is
padding. The attention of a row is block-diagonal causal: a token sees the tokens before it in its own
sequence only, so a sequence's scores do not depend on its neighbours in exact arithmetic. In floating point they
move with the batch's shape (its width, its rows) within rounding: about 1e-4 nats in fp32, up to about 1 nat in
bf16, so a bf16 teacher's labels are reproduced exactly only by the run's own batches (the same input, whole).

Widths can be bucketed (rounded up to a multiple of ``bucket`` tokens), so that a run sees a handful of
distinct batch shapes: compiled code and attention plans are then built a handful of times, not per batch.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from distill.core.batching import round_up, token_budget_batches

PADDING_SEGMENT = -1
"""The segment id of a row's padding tail (it attends only to itself, so no attention row is empty)."""


@dataclass(frozen=True)
class BatchPlan:
    """One forward pass: which sequences go in which row, and the padded width of every row."""

    rows: list[list[int]]
    """Indices of the sequences in each row, in the order they are laid out."""
    width: int
    """Tokens per row, padding included."""

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, width)`` of the batch's token ids."""
        return len(self.rows), self.width

    @property
    def padded_tokens(self) -> int:
        """Tokens fed, padding included."""
        return len(self.rows) * self.width

    @property
    def sequences(self) -> list[int]:
        """Every sequence index of the batch, row by row."""
        return [i for row in self.rows for i in row]


def plan_batches(lengths: Sequence[int], max_tokens: int, bucket: int = 1, packing: bool = False) -> list[BatchPlan]:
    """Cut sequences of ``lengths`` tokens into batches of at most ``max_tokens`` padded tokens.

    Padded (the default): one sequence per row, the token-budget batches of
    :func:`~distill.core.batching.token_budget_batches` over the bucketed lengths, each batch as wide as its
    longest sequence rounded up to ``bucket``; with ``bucket`` 1 these are exactly the batches of the plain
    token budget. A sequence longer than the budget gets a batch of its own.

    Packed: every row is ``round_up(longest, bucket)`` wide; rows are filled longest sequence first,
    then with the longest remaining sequence that still fits, until none does; ``max_tokens // width`` rows
    (at least one) make a batch. All batches but the last have the same shape.

    Returns:
        The batches; every index of ``lengths`` is in exactly one row. Deterministic for given arguments.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if not lengths:
        return []
    if not packing:
        bucketed = [round_up(n, bucket) for n in lengths]
        return [
            BatchPlan([[i] for i in batch], max(bucketed[i] for i in batch))
            for batch in token_budget_batches(bucketed, max_tokens)
        ]
    width = round_up(max(lengths), bucket)
    rows = _pack_rows(lengths, width)
    per_batch = max(1, max_tokens // width)
    return [BatchPlan(rows[start : start + per_batch], width) for start in range(0, len(rows), per_batch)]


def _pack_rows(lengths: Sequence[int], width: int) -> list[list[int]]:
    """Rows of at most ``width`` tokens: each opens with the longest sequence left, then takes the longest
    that still fits, until none does (ties: the higher index first)."""
    pool = sorted((n, i) for i, n in enumerate(lengths))  # ascending; the longest is last
    rows = []
    while pool:
        length, i = pool.pop()
        row, space = [i], width - length
        while pool and pool[0][0] <= space:
            length, j = pool.pop(bisect.bisect_right(pool, (space, len(lengths))) - 1)
            row.append(j)
            space -= length
        rows.append(row)
    return rows


@dataclass(frozen=True)
class HostBatch:
    """A batch's arrays on the host, ready to copy to the device.

    ``R`` rows of width ``W``; ``S`` sequences; ``N`` target tokens over all of them.
    """

    input_ids: np.ndarray
    """``[R, W]`` int64 token ids (padding: the pad id)."""
    position_ids: np.ndarray
    """``[R, W]`` int64 position of each token in its own sequence (the padding tail goes on counting)."""
    segments: np.ndarray
    """``[R, W]`` int64 segment of each token: its sequence's slot in its row, :data:`PADDING_SEGMENT` for padding."""
    picks: np.ndarray
    """``[N]`` int64 flat index into the ``R * W`` positions: the position whose hidden state predicts each target."""
    targets: np.ndarray
    """``[N]`` int64 target token ids."""
    owners: np.ndarray
    """``[N]`` int64 the sequence (``0..S-1``, in :attr:`BatchPlan.sequences` order) each target belongs to."""
    columns: np.ndarray
    """``[N]`` int64 the index of each target within its sequence's target."""
    n_sequences: int
    """``S``."""
    longest_target: int
    """Tokens of the batch's longest target."""


def build_batch(plan: BatchPlan, prefixes: Sequence[list[int]], targets: Sequence[list[int]], pad_id: int) -> HostBatch:
    """The host arrays of ``plan``, whose indices point into ``prefixes`` and ``targets`` (one pair per sequence).

    The hidden state at position ``t`` predicts token ``t + 1``: a sequence of prefix length ``p`` and target
    length ``n`` placed at offset ``o`` of row ``r`` picks positions ``o + p - 1 .. o + p + n - 2`` of that row.
    """
    n_rows, width = plan.shape
    input_ids = np.full((n_rows, width), pad_id, dtype=np.int64)
    segments = np.full((n_rows, width), PADDING_SEGMENT, dtype=np.int64)
    position_ids = np.empty((n_rows, width), dtype=np.int64)
    picks, target_ids, owners, columns = [], [], [], []
    owner = 0
    for r, row in enumerate(plan.rows):
        offset = 0
        for slot, i in enumerate(row):
            prefix, target = prefixes[i], targets[i]
            end = offset + len(prefix) + len(target)
            input_ids[r, offset:end] = prefix + target
            segments[r, offset:end] = slot
            position_ids[r, offset:end] = np.arange(end - offset)
            start = r * width + offset + len(prefix) - 1
            picks.append(np.arange(start, start + len(target)))
            target_ids.append(target)
            owners.append(np.full(len(target), owner))
            columns.append(np.arange(len(target)))
            owner += 1
            offset = end
        position_ids[r, offset:] = np.arange(width - offset) + (position_ids[r, offset - 1] + 1 if offset else 0)
    return HostBatch(
        input_ids,
        position_ids,
        segments,
        np.concatenate(picks),
        np.concatenate([np.asarray(t, dtype=np.int64) for t in target_ids]),
        np.concatenate(owners).astype(np.int64),
        np.concatenate(columns).astype(np.int64),
        owner,
        max(len(targets[i]) for i in plan.sequences),
    )
