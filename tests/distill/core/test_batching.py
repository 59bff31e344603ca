import random

import numpy as np
import pytest

from distill.core.batching import round_up, token_budget_batches


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


def test_units_of_several_rows_keep_the_budget_and_stay_whole() -> None:
    """A query's chunk of ``sizes[i]`` candidates is one unit: never split, its rows counted against the budget."""
    rng = random.Random(0)
    widths = [rng.choice([32, 64, 96, 128]) for _ in range(50)]
    sizes = [rng.randint(2, 8) for _ in range(50)]
    batches = token_budget_batches(widths, 1024, sizes=sizes)
    assert sorted(u for b in batches for u in b) == list(range(50))
    for batch in batches:
        assert widths[batch[0]] == max(widths[u] for u in batch)  # longest first
        assert sum(sizes[u] for u in batch) * widths[batch[0]] <= 1024 or len(batch) == 1


def test_units_of_one_row_pack_as_single_sequences() -> None:
    lengths = [7, 3, 9, 9, 1, 4, 8, 2]
    assert token_budget_batches(lengths, 20, sizes=[1] * len(lengths)) == token_budget_batches(lengths, 20)
    assert token_budget_batches([9, 9, 3], 20) == [[0, 1], [2]]  # ties keep input order


def test_round_up_pads_ints_and_arrays() -> None:
    assert [round_up(n, 64) for n in (1, 64, 65)] == [64, 64, 128]
    assert round_up(np.array([0, 5, 8]), 4).tolist() == [0, 8, 8]
    assert round_up(37, 1) == 37
    with pytest.raises(ValueError, match="positive"):
        round_up(3, 0)
