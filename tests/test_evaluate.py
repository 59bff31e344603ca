"""Evaluation: trec_eval's conventions, checked against the published BM25 figure."""

from __future__ import annotations

import pytest

from distill.evaluate import evaluate
from distill.loaders import load_candidates, load_qrels
from distill.runs import read_trec_run, write_trec_run

from .conftest import DL19, DL19_QRELS


def test_bm25_check_figure() -> None:
    """The shipped DL19 BM25 top-100 scores the published Pyserini nDCG@10 of 50.58."""
    data = load_candidates(DL19, qrels=DL19_QRELS)
    assert evaluate(data.first_stage_run(), data.qrels, ["nDCG@10"])["nDCG@10"] == pytest.approx(50.58, abs=0.005)


def test_mean_is_over_the_run_s_judged_queries_and_unjudged_count_as_irrelevant() -> None:
    qrels = {"q1": {"a": 2, "b": 0}, "q2": {"c": 1}}
    perfect = evaluate({"q1": {"a": 2.0, "x": 1.0}}, qrels, ["nDCG@10"])["nDCG@10"]
    assert perfect == pytest.approx(100.0)  # q2, absent from the run, is not averaged in
    demoted = evaluate({"q1": {"x": 3.0, "a": 2.0}}, qrels, ["nDCG@1"])["nDCG@1"]
    assert demoted == 0.0  # the unjudged document ranked first counts as irrelevant
    with pytest.raises(ValueError, match="no query"):
        evaluate({"q9": {"a": 1.0}}, qrels)


def test_run_files_round_trip(tmp_path) -> None:
    run = {"q1": {"a": 1.5, "b": 3.0}, "q2": {"c": -1.0}}
    write_trec_run(tmp_path / "r.trec", run, tag="t")
    lines = (tmp_path / "r.trec").read_text().splitlines()
    assert lines[0] == "q1 Q0 b 1 3.000000 t" and lines[1] == "q1 Q0 a 2 1.500000 t"
    assert read_trec_run(tmp_path / "r.trec") == run
    assert load_qrels(DL19_QRELS)["19335"]["1017759"] == 0
