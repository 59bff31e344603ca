import random

import pytest

from distill.core.batching import token_budget_batches


@pytest.mark.parametrize("budget", [1, 7, 64, 1000])
def test_every_index_once_and_budget_kept(budget: int) -> None:
    rng = random.Random(budget)
    lengths = [rng.randint(1, 50) for _ in range(200)]
    batches = token_budget_batches(lengths, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        padded = len(batch) * max(lengths[i] for i in batch)
        assert padded <= budget or len(batch) == 1


def test_batches_group_similar_lengths() -> None:
    lengths = [5, 100, 6, 99, 5, 101]
    batches = token_budget_batches(lengths, 303)
    assert [sorted(b) for b in batches] == [[1, 3, 5], [0, 2, 4]]


def test_rejects_non_positive_budget() -> None:
    with pytest.raises(ValueError, match="positive"):
        token_budget_batches([3], 0)
