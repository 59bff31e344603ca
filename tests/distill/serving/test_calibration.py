"""Calibrated scores: Platt scaling fitted at export on the quality gate's judged pairs, kept in card.json, and
applied to every normalised score (``Reranker.probabilities``, both HTTP routes) without changing the ranking."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from distill.core.schema import InputError
from distill.serving.calibration import ScoreCalibration, assess, fit_platt, normalised, read_calibration, sigmoid
from distill.serving.http_api import ServedModel, create_app
from distill.serving.options import HttpOptions
from distill.serving.reranker import Reranker
from tests.distill.serving.test_http_api import running


def test_platt_scaling_recovers_the_map_that_drew_the_judgments() -> None:
    rng = np.random.default_rng(0)
    raw = rng.normal(15.0, 2.0, size=200_000)  # a student's scale: every plain sigmoid is about 1.0
    relevant = rng.random(raw.size) < sigmoid(1.5 * raw - 24.0)
    fitted = fit_platt(raw, relevant, "synthetic")
    assert fitted.scale == pytest.approx(1.5, rel=0.03) and fitted.bias == pytest.approx(-24.0, rel=0.03)
    assert np.quantile(sigmoid(raw), 0.05) > 0.9999  # what the uncalibrated normalised scores were
    probability = fitted.probability(raw)
    assert np.array_equal(np.argsort(probability, kind="stable"), np.argsort(raw, kind="stable"))
    q = fitted.quality
    assert q is not None and q.pairs == raw.size and q.relevant == int(relevant.sum())
    assert q.ece < 0.01 and q.p05 < 0.05 and q.p95 > 0.9
    assert q.brier == pytest.approx(float(np.mean((probability - relevant) ** 2)), abs=1e-6)


def test_assess_measures_a_miscalibration() -> None:
    relevant = np.array([1, 0] * 500)
    assert assess(np.full(1000, 0.5), relevant).ece == pytest.approx(0.0)
    assert assess(np.full(1000, 0.9), relevant).ece == pytest.approx(0.4)
    assert assess(np.full(1000, 0.9), relevant).brier == pytest.approx(0.5 * 0.01 + 0.5 * 0.81)


def test_judgments_of_one_class_or_a_reversed_student_fit_nothing() -> None:
    with pytest.raises(InputError, match="0 relevant and 3 non-relevant"):
        fit_platt(np.array([1.0, 2.0, 3.0]), np.array([False] * 3), "x")
    where = "6 judged queries of val.json; 120 pairs, every candidate"  # read as one sentence with the reason before
    message = f"^score calibration: higher scores are less often relevant on the pairs \\({where}\\): the student ranks"
    with pytest.raises(InputError, match=message):
        fit_platt(np.arange(100.0), np.arange(100) < 50, where)


def test_a_card_with_a_bad_calibration_is_one_line_naming_it() -> None:
    good = ScoreCalibration(2.0, -3.0, fitted_on="pairs")
    assert ScoreCalibration.from_dict(good.to_dict(), "card.json") == good
    for bad in (
        {"scale": -1.0, "bias": 0.0},
        {"scale": "a", "bias": 0.0},
        {"bias": 1.0},
        {"scale": 1, "bias": 0, "method": "isotonic"},
    ):
        with pytest.raises(InputError, match=r"^card\.json: score_calibration: "):
            ScoreCalibration.from_dict(bad, "card.json")


def test_fused_scores_and_uncalibrated_students_take_the_plain_sigmoid() -> None:
    raw = np.array([-2.0, 0.0, 3.0])
    calibration = ScoreCalibration(0.5, 1.0)
    np.testing.assert_allclose(normalised(raw, calibration, fused=False), sigmoid(0.5 * raw + 1.0))
    np.testing.assert_allclose(normalised(raw, calibration, fused=True), sigmoid(raw))
    np.testing.assert_allclose(normalised(raw, None, fused=False), sigmoid(raw))


def test_the_export_fits_it_on_the_gates_judged_pairs(exported: Path, parity) -> None:
    from distill.eval.metrics import default_rel_level
    from distill.export.quality_gate import _by_query

    card = json.loads((exported / "card.json").read_text())
    calibration = read_calibration(exported)
    assert calibration is not None and card["score_calibration"] == calibration.to_dict()
    assert calibration.fitted_on == card["quality_gate"]["pairs"]
    reranker = Reranker.load(exported, backend="torch", interpolation=False)
    level = default_rel_level(parity.qrels)
    raw, relevant = [], []
    for pairs in _by_query(parity.ranking):  # refit on PyTorch fp32's scores of the same pairs: the same map
        raw += reranker.score(pairs[0].query, [p.passage for p in pairs])
        relevant += [parity.qrels.get(p.qid, {}).get(p.docid, 0) >= level for p in pairs]
    refit = fit_platt(np.array(raw), np.array(relevant))
    assert refit.scale == pytest.approx(calibration.scale, rel=1e-4)
    assert refit.bias == pytest.approx(calibration.bias, rel=1e-4, abs=1e-6)
    assert calibration.quality is not None and calibration.quality.pairs == len(raw)
    assert "score calibration" in (exported / "README.md").read_text()


def test_probabilities_and_both_routes_use_it_and_keep_the_ranking(exported: Path, call, tmp_path: Path) -> None:
    query, passages = call
    folder = tmp_path / "export"
    shutil.copytree(exported, folder)
    card = json.loads((folder / "card.json").read_text())
    card["score_calibration"] = ScoreCalibration(3.0, -3.0).to_dict()  # a visible map, unsaturated on these scores
    (folder / "card.json").write_text(json.dumps(card))
    reranker = Reranker.load(folder, backend="onnx", interpolation=False)
    raw = np.array(reranker.score(query, passages))
    probability = np.array(reranker.probabilities(query, passages))
    np.testing.assert_allclose(probability, sigmoid(3.0 * raw - 3.0), rtol=1e-9)
    assert np.array_equal(np.argsort(-probability, kind="stable"), np.argsort(-raw, kind="stable"))
    with running(create_app(ServedModel(folder, reranker), HttpOptions())) as url:
        cohere = httpx.post(f"{url}/v1/rerank", json={"query": query, "documents": passages}).json()["results"]
        tei = httpx.post(f"{url}/rerank", json={"query": query, "texts": passages, "truncate": True}).json()
        raw_tei = httpx.post(
            f"{url}/rerank", json={"query": query, "texts": passages, "truncate": True, "raw_scores": True}
        ).json()
        info = httpx.get(f"{url}/info").json()
    for results, key in ((cohere, "relevance_score"), (tei, "score")):
        assert [r["index"] for r in results] == np.lexsort((np.arange(len(raw)), -raw)).tolist()
        assert [r[key] for r in results] == pytest.approx([probability[r["index"]] for r in results], abs=1e-5)
    assert [r["score"] for r in raw_tei] == pytest.approx([raw[r["index"]] for r in raw_tei], abs=1e-5)
    assert info["score_calibration"]["scale"] == 3.0


def test_the_calibration_benchmark_reports_both_normalisations_and_the_bounds(
    exported: Path, dl19_sample: list[dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``benchmarks/calibration.py`` on the tiny export: its figures are those of the export's own calibration of
    ONNX's raw scores, recomputed here, and the bounds are the share relevant at the raw scores' two ends."""
    import sys

    from benchmarks import calibration as bench
    from distill.data.loaders import load_candidates, load_qrels
    from tests.conftest import DL19_QRELS

    candidates, out = tmp_path / "in.json", tmp_path / "calibration.json"
    candidates.write_text(json.dumps(dl19_sample))
    argv = ["calibration", "--model", str(exported), "--input", str(candidates), "--qrels", str(DL19_QRELS)]
    monkeypatch.setattr(sys, "argv", [*argv, "--output", str(out)])
    bench.main()
    record = json.loads(out.read_text())

    reranker = Reranker.load(exported, backend="onnx", interpolation=False)
    qrels = load_qrels(DL19_QRELS)
    raw, relevant = [], []
    for query in load_candidates(candidates).candidates:
        raw += reranker.score(query.query.text, [p.text for p in query.passages])
        relevant += [qrels[query.query.qid].get(p.docid, 0) >= 2 for p in query.passages]
    raw, relevant = np.array(raw, dtype=np.float32), np.array(relevant)
    expected = assess(reranker.calibration.probability(raw), relevant)
    assert (record["pairs"], record["queries"], record["relevant"]) == (36, 3, int(relevant.sum()))
    assert record["calibrated"]["p95"] == pytest.approx(expected.p95, abs=1e-6)
    assert record["calibrated"]["brier"] == pytest.approx(expected.brier, abs=1e-6)
    assert record["calibrated"]["ranking_as_raw"] is True
    top = raw >= np.quantile(raw, 0.95)
    assert record["bounds"]["top_5pct_relevant"] == pytest.approx(relevant[top].mean(), abs=1e-4)
    assert record["calibration"] == reranker.calibration.to_dict()
