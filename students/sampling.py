"""Batch samplers for training: length-grouped (pointwise) and query-grouped (pair/listwise losses), and
the loader that draws them.

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

import torch
from torch.utils.data import DataLoader, Sampler


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
        batches = self._batches(random.Random(self.seed * 1_000_003 + self.epoch))
        usable = len(batches) // self.world_size * self.world_size
        if usable == 0:
            raise ValueError(f"{len(batches)} batches cannot be shared by {self.world_size} ranks: use a smaller batch")
        return batches[:usable][self.rank :: self.world_size]

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
        self.by_query: dict[object, list[int]] = {}
        for i, group in enumerate(groups):
            self.by_query.setdefault(group, []).append(i)
        self.group_size, self.queries_per_batch = group_size, queries_per_batch

    def _batches(self, rng: random.Random) -> list[list[int]]:
        chunks = []
        for members in self.by_query.values():
            members = members[:]
            rng.shuffle(members)
            chunks += [
                members[i : i + self.group_size]
                for i in range(0, len(members), self.group_size)
                if len(members[i : i + self.group_size]) >= 2
            ]
        rng.shuffle(chunks)
        q = self.queries_per_batch
        return [[i for chunk in chunks[s : s + q] for i in chunk] for s in range(0, len(chunks), q)]


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
