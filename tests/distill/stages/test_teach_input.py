"""The teacher's input pass: every process reads every pair into the digest and keeps only its share."""

from __future__ import annotations

from pathlib import Path

import pytest

from distill.data.loaders import load_candidates
from distill.stages.teach_input import PairRows, Share, write_pair_rows

DL19 = Path(__file__).resolve().parents[3] / "data" / "trec-dl19"


@pytest.mark.parametrize("world", [2, 3])
def test_the_shares_of_n_processes_are_one_process_s_rows_cut_into_chunks(tmp_path: Path, world: int) -> None:
    data = load_candidates(DL19 / "bm25_top100.json")
    data.candidates = data.candidates[:5]  # 500 pairs

    def share(rank: int, n: int) -> PairRows:
        folder = tmp_path / f"{n}-{rank}"
        write_pair_rows(iter(data.candidates), data.skipped, folder, None, "dl19", Share(rank, n, 64))
        return PairRows(folder)

    whole = share(0, 1)
    assert len(whole) == whole.summary.pairs == 500
    parts = [share(rank, world) for rank in range(world)]
    assert sum(len(p) for p in parts) == 500
    for part in parts:
        assert part.summary.digest == whole.summary.digest and part.summary.pairs == 500
        assert part.queries() == whole.queries() == [c.query.text for c in data.candidates]
    for rank, part in enumerate(parts):
        for j, pairs, rows in Share(rank, world, 64).chunks(500):
            assert j % world == rank
            assert part.rows(rows) == whole.rows(pairs)
