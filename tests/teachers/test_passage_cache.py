"""The p(K) cache's packed index: every key found with its last value, in 24 bytes an entry."""

from __future__ import annotations

import numpy as np
import pytest

from teachers.passage_cache import PackedLogProbs, PassageLogProbCache, passage_key


class SmallBlocks(PackedLogProbs):
    BLOCK = 7  # many blocks and merges from a few entries


def test_the_packed_index_answers_as_a_dict_across_blocks_merges_and_repeated_keys() -> None:
    rng = np.random.default_rng(0)
    keys = [passage_key(rng.integers(0, 50_000, 20).tolist()) for _ in range(300)]
    keys += [keys[0][:16] + "0" * 16, keys[0][:16] + "f" * 16]  # two keys sharing their high 64 bits with another
    packed, expected = SmallBlocks(), {}
    for start in range(0, len(keys), 11):
        batch = [(k, float(v)) for k, v in zip(keys[start : start + 11], rng.normal(-60, 20, 11), strict=False)]
        packed.update(batch)
        expected.update(batch)
        probe = keys[rng.integers(0, start + 1)]
        assert (probe in packed) == (probe in expected)  # lookups between updates merge what waits
    again = [(k, -1.0 * i) for i, k in enumerate(keys[::5])]  # a key added again takes its last value
    packed.update(again)
    expected.update(again)
    assert len(packed) == len(expected) == len(set(keys))
    assert all(packed[k] == v for k, v in expected.items())
    assert packed.hi.nbytes + packed.lo.nbytes + packed.values.nbytes == 24 * len(expected)
    assert bool(np.all(packed.hi[1:] >= packed.hi[:-1]))
    missing = "0" * 32
    assert missing not in packed and keys[0][:16] + "1" * 16 not in packed  # a shared high half, another low one
    with pytest.raises(KeyError):
        packed[missing]


def test_a_cache_reopened_finds_what_was_added(tmp_path) -> None:
    setting = {"teacher": "t", "dtype": "float32", "start_token_id": 1}
    cache = PassageLogProbCache(tmp_path, setting)
    keys = [passage_key([i, i + 1]) for i in range(1000)]
    cache.add(keys[:600], [float(-i) for i in range(600)])
    cache.add(keys[400:], [float(-i - 0.5) for i in range(400, 1000)])
    again = PassageLogProbCache(tmp_path, setting)
    assert len(again) == 1000
    # segments are read in name order, so a key in two segments may take either value; each is one of them
    assert all(again[k] in (float(-i), float(-i - 0.5)) for i, k in enumerate(keys))
    assert again[keys[0]] == 0.0 and again[keys[999]] == -999.5
