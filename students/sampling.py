"""Batch samplers for training: length-grouped (pointwise), query-grouped (pair/listwise losses) and cut by a
budget of padded tokens (either kind), and the loader that draws them.

Both samplers shard batches over distributed ranks themselves, and give every rank the same number of
batches (dropping at most ``world_size - 1`` batches an epoch), so an uneven last batch can never leave
one rank waiting for another. Lightning calls ``set_epoch`` before each epoch (through
:attr:`ShardedBatches.sampler`). An epoch's batches depend only on the seed, the epoch and the rank, so
a resumed run skips the ones it had consumed (:meth:`ShardedBatches.resume`) and goes on with exactly the
batches an uninterrupted run would draw.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from distill.core.batching import round_up, token_budget_batches


class ShardedBatches(Sampler[list[int]]):
    """The batches of one rank, an epoch at a time: ``batches_of_epoch[rank::world_size]``."""

    def __init__(self, seed: int, rank: int, world_size: int) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        self.seed, self.rank, self.world_size, self.epoch = seed, rank, world_size, 0
        self._resume_at: tuple[int, int] | None = None

    @property
    def sampler(self) -> ShardedBatches:
        """Itself: Lightning calls ``set_epoch`` on a batch sampler's ``sampler``, never on the batch sampler."""
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, consumed: int) -> None:
        """Make the next pass start after the first ``consumed`` batches of ``epoch``, if it is a pass over
        ``epoch`` (a run resumed mid-epoch); a pass over any other epoch starts at its first batch."""
        self._resume_at = (epoch, consumed)

    def _batches(self, rng: random.Random) -> list[list[int]]:
        raise NotImplementedError

    def _mine(self) -> list[list[int]]:
        """This rank's batches of the current epoch (computed once an epoch: ``len`` and ``iter`` both ask)."""
        cached = getattr(self, "_cached", None)
        if cached is not None and cached[0] == self.epoch:
            return cached[1]
        batches = self._batches(random.Random(self.seed * 1_000_003 + self.epoch))
        usable = len(batches) // self.world_size * self.world_size
        if usable == 0:
            raise ValueError(f"{len(batches)} batches cannot be shared by {self.world_size} ranks: use a smaller batch")
        mine = batches[:usable][self.rank :: self.world_size]
        self._cached = (self.epoch, mine)
        return mine

    def __iter__(self) -> Iterator[list[int]]:
        # A generator: the epoch is read at the first batch, after Lightning's set_epoch.
        batches = self._mine()
        epoch, consumed = self._resume_at or (self.epoch, 0)
        self._resume_at = None
        yield from batches[consumed if epoch == self.epoch else 0 :]

    def __len__(self) -> int:
        return len(self._mine())


class LengthGroupedBatches(ShardedBatches):
    """Random batches of similar-length sequences: shuffle, sort within mega-batches of
    ``batch_size * mega_batches`` by length, cut into batches, shuffle the batches.

    Args:
        lengths: token count of each example.
        batch_size: examples per batch.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        mega_batches: int = 50,
    ) -> None:
        super().__init__(seed, rank, world_size)
        self.lengths, self.batch_size, self.mega = list(lengths), batch_size, batch_size * mega_batches

    def _batches(self, rng: random.Random) -> list[list[int]]:
        order = list(range(len(self.lengths)))
        rng.shuffle(order)
        batches = []
        for start in range(0, len(order), self.mega):
            mega = sorted(order[start : start + self.mega], key=lambda i: -self.lengths[i])
            batches += [mega[i : i + self.batch_size] for i in range(0, len(mega), self.batch_size)]
        rng.shuffle(batches)
        return batches


class QueryGroupedBatches(ShardedBatches):
    """Batches of ``queries_per_batch`` groups, each ``group_size`` candidates of one query.

    Each epoch, every query's candidates are shuffled and cut into groups; a query's last group
    is kept if it has at least two candidates (losses within a query need two).

    Args:
        groups: ``groups[i]`` is the query of example ``i`` (any hashable id).
    """

    def __init__(
        self,
        groups: Sequence[object],
        group_size: int,
        queries_per_batch: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        super().__init__(seed, rank, world_size)
        if group_size < 2:
            raise ValueError(f"group_size must be at least 2, got {group_size}")
        self.by_query = by_query(groups)
        self.group_size, self.queries_per_batch = group_size, queries_per_batch

    def _batches(self, rng: random.Random) -> list[list[int]]:
        chunks = query_chunks(self.by_query, self.group_size, rng)
        q = self.queries_per_batch
        return [[i for chunk in chunks[s : s + q] for i in chunk] for s in range(0, len(chunks), q)]


def by_query(groups: Sequence[object]) -> dict[object, list[int]]:
    """Query -> the indices of its examples, in order; ``groups[i]`` is the query of example ``i``."""
    members: dict[object, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    return members


def query_chunks(members: dict[object, list[int]], group_size: int, rng: random.Random) -> list[list[int]]:
    """Each query's examples shuffled and cut into chunks of ``group_size`` (a last chunk kept if it has at least
    two: losses within a query need two), all the chunks shuffled."""
    chunks = []
    for indices in members.values():
        indices = indices[:]
        rng.shuffle(indices)
        chunks += [indices[i : i + group_size] for i in range(0, len(indices), group_size)]
    chunks = [chunk for chunk in chunks if len(chunk) >= 2]
    rng.shuffle(chunks)
    return chunks


class TokenBudgetBatches(ShardedBatches):
    """Batches of at most ``max_tokens`` padded tokens, each padded to a multiple of ``pad_to_multiple_of``.

    Each epoch: the units (single examples; with ``groups``, chunks of ``group_size`` candidates of one query, as
    :class:`QueryGroupedBatches` cuts them) are shuffled; within each ``window`` of units, they are sorted by padded
    length, longest first (stably, so that units of one padded length stay in random order), and packed in that
    order, a batch closing when one more unit would take it past the budget; then all the batches are shuffled. A
    batch's padded size is ``examples x padded length of its first (longest) unit``, so its shape is one of few:
    ``(max_tokens // L, L)`` for each padded length ``L``, except the last batch of each window. A unit longer than
    the budget gets a batch of its own. A query's chunk is never split.

    With the whole epoch as the window (``window=None``), single examples give the same number of batches every
    epoch (the sorted padded lengths are the same; only the examples of each length differ), which the LR schedule
    and Lightning's epoch length count on; query chunks, whose longest member changes with the shuffle, may give a
    few more or fewer.

    Args:
        lengths: token count of each example.
        max_tokens: padded tokens per batch (``examples x padded length``).
        pad_to_multiple_of: the collator's padding multiple (1: to the longest pair).
        groups: the query of each example, for batches of whole query chunks (None: single examples).
        group_size: candidates per query chunk (with ``groups``; at least 2).
        window: units sorted together (None: the whole epoch).
    """

    def __init__(
        self,
        lengths: Sequence[int],
        max_tokens: int,
        pad_to_multiple_of: int = 1,
        groups: Sequence[object] | None = None,
        group_size: int | None = None,
        window: int | None = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        super().__init__(seed, rank, world_size)
        if max_tokens < 1 or pad_to_multiple_of < 1 or (window is not None and window < 1):
            raise ValueError(
                f"max_tokens, pad_to_multiple_of and window must be positive, got {max_tokens}, "
                f"{pad_to_multiple_of}, {window}"
            )
        if (groups is None) != (group_size is None):
            raise ValueError("groups and group_size go together")
        if group_size is not None and group_size < 2:
            raise ValueError(f"group_size must be at least 2, got {group_size}")
        lengths = np.asarray(lengths, dtype=np.int64)
        self.padded = round_up(lengths, pad_to_multiple_of)
        self.max_tokens, self.window, self.group_size = max_tokens, window, group_size
        self.by_query = None if groups is None else by_query(groups)

    def _batches(self, rng: random.Random) -> list[list[int]]:
        if self.by_query is None:
            order = list(range(len(self.padded)))
            rng.shuffle(order)  # the permutation a shuffle of one-example units draws
            window = self.window or max(len(order), 1)
            batches = []
            for start in range(0, len(order), window):
                batches += self._pack_examples(np.asarray(order[start : start + window], dtype=np.int64))
        else:
            units = query_chunks(self.by_query, self.group_size, rng)
            window = self.window or max(len(units), 1)
            batches = []
            for start in range(0, len(units), window):
                batches += self._pack(units[start : start + window])
        rng.shuffle(batches)
        return batches

    def _pack_examples(self, examples: np.ndarray) -> list[list[int]]:
        """Single examples packed by :func:`~distill.core.batching.token_budget_batches` on their padded lengths."""
        return [examples[batch].tolist() for batch in token_budget_batches(self.padded[examples], self.max_tokens)]

    def _pack(self, units: list[list[int]]) -> list[list[int]]:
        """Query chunks packed by :func:`~distill.core.batching.token_budget_batches`, each chunk as long as its
        longest member and taking a row per member."""
        widths = [int(self.padded[unit].max()) for unit in units]
        batches = token_budget_batches(widths, self.max_tokens, sizes=[len(unit) for unit in units])
        return [[i for u in batch for i in units[u]] for batch in batches]


class ResumableLoader(DataLoader):
    """A ``DataLoader`` whose batches and random numbers a resumed run replays exactly.

    It starts its iterator, workers included, at the first batch rather than when Lightning calls
    ``iter``, so that the sampler is read after Lightning's ``set_epoch`` and a resumed run's
    :meth:`ShardedBatches.resume`. And the seed that each iterator draws (it seeds the workers, whose
    collating draws no random numbers) comes from a generator of the loader's own, not from the global
    torch RNG: a resumed run restores that RNG just before its first batch, which an extra draw would shift.
    """

    def __init__(self, dataset: Any, **kwargs: Any) -> None:
        kwargs.setdefault("generator", torch.Generator())
        super().__init__(dataset, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        yield from super().__iter__()
