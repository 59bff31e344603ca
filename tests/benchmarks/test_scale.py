"""``python -m benchmarks.scale`` at a tiny size: the synthetic data, each measurement in a fresh process, the files
it writes, and the README left alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import scale
from tests.conftest import REPO


@pytest.mark.slow
def test_one_small_size_is_measured_in_fresh_processes(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    out, work = tmp_path / "out", tmp_path / "work"
    argv = ["--sizes", "[3000]", "--work", str(work), "--out", str(out), "--batches", "2", "--seconds", "5"]
    assert scale.main(argv) == 0
    result = json.loads((out / "scale.json").read_text())
    assert result["command"].startswith("python -m benchmarks.scale") and result["growth"] == []
    (row,) = result["rows"]
    assert row["pairs"] == 3000 and row["teacher_data_bytes"] > 0
    cold, cached = row["student_cold"], row["student_cached"]
    assert cold["tokens"] == cached["tokens"] > 0 and cold["cache_bytes"] == cached["cache_bytes"] > 0
    assert cold["train_pairs"] == cached["train_pairs"] == 2200  # 30 queries of 100, 8 held out
    assert cached["verify_seconds"] > 0 and cold["peak_rss_bytes"] >= cold["baseline_rss_bytes"] > 0
    assert row["teacher_input"]["pairs"] == 3000 and row["teacher_input"]["queries"] == 30
    assert row["pk_cache"]["entries"] == 3000 and row["pk_cache"]["segments"] == 12  # 256 entries a segment
    assert [loader["workers"] for loader in row["loader"]] == [0, 2]
    assert all(loader["first_batch_s"] > 0 and loader["epoch_batches"] >= 1 for loader in row["loader"])
    assert "3000" in (out / "scale.md").read_text().replace(",", "")
    assert (out / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (REPO / "README.md").read_text() == readme


def test_a_measurement_runs_alone_in_this_process(tmp_path: Path, capsys) -> None:
    """``measure pk_cache OPTIONS``: the child's side of a measurement, its JSON on the last line."""
    root = scale.synthetic_pk_cache(300, tmp_path / "pk")
    assert scale.main(["measure", "pk_cache", json.dumps({"root": str(root)})]) == 0
    measured = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert measured["entries"] == 300 and measured["segments"] == 2 and measured["cache_bytes"] > 0
