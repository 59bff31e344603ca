"""``python -m benchmarks.int8`` on the tiny export: each int8 variant's ranking against fp32's, and its speed."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from benchmarks import int8


@pytest.mark.slow
def test_each_variant_is_ranked_against_fp32_and_timed(exported: Path, tmp_path: Path) -> None:
    out = tmp_path / "int8.json"
    argv = ["--student", str(exported), "--threads", "1", "--validation_queries", "2", "--time_queries", "1"]
    argv += ["--repeats", "1", "--only", "[ort-dynamic,ort-static-MinMax]", "--out", str(out)]
    assert int8.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["command"] == "python -m benchmarks.int8 " + shlex.join(argv)
    assert result["validation"]["pairs"] == 200  # 2 judged DL21 queries x their 100 candidates
    assert result["timed"]["queries"] == 1
    results = result["results"]
    assert list(results) == ["fp32", "ort-dynamic", "ort-static-MinMax"]
    fp32 = results["fp32"]
    assert fp32["spearman_vs_fp32"] == pytest.approx(1.0) and fp32["max_abs_diff"] == 0.0
    for name in ("ort-dynamic", "ort-static-MinMax"):
        r = results[name]
        assert 0 < r["max_abs_diff"] < 1 and r["spearman_vs_fp32"] > 0.9, (name, r)  # quantised, yet close
        assert r["delta_nDCG@10"] == pytest.approx(r["nDCG@10"] - fp32["nDCG@10"]) and r["p50_ms"] > 0


def test_a_bad_option_is_one_line_before_any_work(capsys) -> None:
    assert int8.main(["--student", "x", "--validation_queries", "0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "python -m benchmarks.int8: error: --validation_queries: must be at least 1, got 0"
    )
