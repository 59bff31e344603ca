"""``python -m benchmarks.pk_cache`` at a tiny size: the synthetic cache, its reopening in a fresh process, the
figures it records and the table it writes."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import pk_cache


def test_a_small_cache_is_reopened_in_a_fresh_process_and_its_memory_recorded(tmp_path: Path) -> None:
    out = tmp_path / "pk-cache.json"
    argv = ["--sizes", "[3000]", "--work", str(tmp_path / "work"), "--out", str(out)]
    assert pk_cache.main(argv) == 0
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["entries"] == 3000 and row["segments"] == 12  # 256 entries a segment
    assert row["lookups_found"] == 1.0 and row["lookup_seconds"] > 0
    assert 0 < row["resident_above_baseline_bytes"] <= row["peak_above_baseline_bytes"] + 2**20
    assert row["met"] is True and result["target_resident_bytes"] == 512 * 2**20
    assert "python -m benchmarks.pk_cache" in result["command"] and result["cpu_features"]
    table = out.with_suffix(".md").read_text()
    assert "| 3,000 |" in table and "met" in table
