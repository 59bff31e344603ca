"""``python -m benchmarks.teacher_input`` at a tiny size: the synthetic inputs of every format hold the same
candidates, and each rank's pass runs in a fresh process and keeps its share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import teacher_input
from benchmarks.scale import rank_llm_lines, synthetic_teacher_data
from distill.data.loaders import load_candidates


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CIS_DISTILL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_every_format_holds_the_candidates_of_the_json_lines(tmp_path: Path, cache: Path) -> None:
    lines = rank_llm_lines(synthetic_teacher_data(1500, tmp_path / "teacher"), tmp_path / "rank-llm.jsonl")
    expected = load_candidates(lines).candidates
    for fmt in teacher_input.FORMATS:
        given = teacher_input.inputs(fmt, lines, tmp_path / fmt)
        data = load_candidates(given["input"], **{k: v for k, v in given.items() if k != "input"})
        assert [(c.query, c.passages) for c in data.candidates] == [(c.query, c.passages) for c in expected], fmt


@pytest.mark.slow
def test_each_rank_s_pass_is_measured_in_a_fresh_process(tmp_path: Path, cache: Path) -> None:
    out = tmp_path / "teacher-input.json"
    argv = ["--sizes", "[1500]", "--formats", '["trec"]', "--ranks", "[1,2]", "--corpus", "3000"]
    argv += ["--corpus_run", "500", "--work", str(tmp_path / "work"), "--out", str(out)]
    assert teacher_input.main(argv) == 0
    result = json.loads(out.read_text())
    trec, _, corpus, _ = result["rows"]
    assert [r["ranks"] for r in result["rows"]] == [1, 2, 1, 2]
    assert trec["pairs"] == 1500 and [p["rows"] for p in trec["per_rank"]] == [1500]
    halves = [p["rows"] for p in result["rows"][1]["per_rank"]]
    assert sum(halves) == 1500 and min(halves) >= 1500 // 2 - 256
    assert corpus["pairs"] == 500 and corpus["peak_rss_bytes"] > corpus["peak_above_baseline_bytes"] > 0
    built, reopened = result["indexes"][1], result["indexes"][1]["reopen_seconds"]
    assert built["records"] == 3000 and built["built"] and 0 <= reopened < built["seconds"] + 1
    table = out.with_suffix(".md").read_text()
    assert "| trec | 1,500 | 2 |" in table and "synthetic, 3,000 passages" in table
