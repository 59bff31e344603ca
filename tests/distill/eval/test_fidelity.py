"""Hybrid labels, interpolation with the first stage, and per-query fidelity to the teacher."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import kendalltau, spearmanr

from distill.cli import main
from distill.core.interpolation import ALPHAS, choose_alpha, interpolate
from distill.core.schema import InputError
from distill.core.student_card import StudentCard
from distill.data.labels import FIRST_STAGE_COLUMN, LabelExpression, per_query_z
from distill.eval.fidelity import fidelity_per_query, mean_fidelity, teacher_qrels
from tests.conftest import DL19_QRELS


def test_labels_name_a_score_or_a_hybrid_of_per_query_z_scores() -> None:
    plain = LabelExpression.parse(" upr ")
    assert not plain.standardised and [t.column for t in plain.terms] == ["upr"] and str(plain) == "upr"
    hybrid = LabelExpression.parse("cis_q + 0.5*first_stage")
    assert hybrid == LabelExpression.parse("z(cis_q) + 0.5*z(first_stage)") and hybrid.standardised
    assert [t.column for t in hybrid.terms] == ["cis_q", FIRST_STAGE_COLUMN]
    for bad in ("cis_q+x*first_stage", "cis-q", "cis_q+0.5*bm25"):
        with pytest.raises(InputError, match="label"):
            LabelExpression.parse(bad)
    qids = ["a", "a", "a", "b", "b"]
    score, first = np.array([1.0, 2.0, 3.0, 10.0, 10.0]), np.array([3.0, 2.0, 1.0, 5.0, 7.0])
    z = per_query_z(score, qids)
    np.testing.assert_allclose(z[:3], [-1.2247449, 0.0, 1.2247449], rtol=1e-6)
    assert z[3:].tolist() == [0.0, 0.0]  # a constant query gives 0, not NaN
    np.testing.assert_allclose(
        hybrid.values({"cis_q": score, FIRST_STAGE_COLUMN: first}, qids), z + 0.5 * per_query_z(first, qids)
    )
    np.testing.assert_array_equal(LabelExpression.parse("cis").values({"cis": score}, qids), score)
    # Standardising per query removes one constant per query: cis_q = upr - c(q) gives the same hybrid as upr.
    shifted = score - np.array([7.0, 7.0, 7.0, -3.0, -3.0])
    np.testing.assert_allclose(
        hybrid.values({"cis_q": shifted, FIRST_STAGE_COLUMN: first}, qids),
        hybrid.values({"cis_q": score, FIRST_STAGE_COLUMN: first}, qids),
    )


def test_interpolation_and_the_alpha_chosen_on_qrels() -> None:
    qids, docids = ["q"] * 4, ["d1", "d2", "d3", "d4"]
    student, first = np.array([4.0, 3.0, 2.0, 1.0]), np.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(interpolate(student, first, qids, 1.0), per_query_z(student, qids))
    np.testing.assert_allclose(interpolate(student, first, qids, 0.0), per_query_z(first, qids))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        interpolate(student, first, qids, 1.5)
    # d4 is the relevant one: only the first stage puts it on top, so the chosen alpha leans on it.
    alpha, by_alpha = choose_alpha(student, first, qids, docids, {"q": {"d4": 1}})
    assert set(by_alpha) == set(ALPHAS) and by_alpha[alpha] == max(by_alpha.values()) == 100.0
    assert alpha < 1 and all(by_alpha[a] < 100 for a in ALPHAS if a > alpha)  # the largest of the best
    alpha, _ = choose_alpha(student, first, qids, docids, {"q": {"d1": 1}})
    assert alpha == 1.0  # ties go to the student


def test_fidelity_is_per_query_rank_agreement() -> None:
    teacher = {"a": {f"d{i}": float(i) for i in range(12)}, "b": {"x": 1.0, "y": 2.0, "z": 3.0}}
    same = {q: {d: 2 * s + 1 for d, s in docs.items()} for q, docs in teacher.items()}
    reverse = {q: {d: -s for d, s in docs.items()} for q, docs in teacher.items()}
    assert mean_fidelity(fidelity_per_query(same, teacher)) == pytest.approx(
        {"kendall_tau": 1.0, "spearman": 1.0, "nDCG@10_teacher": 100.0}
    )
    backwards = mean_fidelity(fidelity_per_query(reverse, teacher))
    assert backwards["kendall_tau"] == pytest.approx(-1) and backwards["spearman"] == pytest.approx(-1)
    assert fidelity_per_query(reverse, teacher)["nDCG@10_teacher"]["a"] < 50  # the teacher's top 10 come last
    rng = np.random.default_rng(0)
    noisy = {"a": {d: s + rng.normal(0, 3) for d, s in teacher["a"].items()}}
    values = fidelity_per_query(noisy, teacher)
    ours, theirs = list(noisy["a"].values()), list(teacher["a"].values())
    assert values["kendall_tau"]["a"] == pytest.approx(kendalltau(ours, theirs).statistic)
    assert values["spearman"]["a"] == pytest.approx(spearmanr(ours, theirs).statistic)
    assert set(values["spearman"]) == {"a"}  # only the queries both rank
    assert teacher_qrels({"q": {"u": 0.5, "v": 0.9, "w": 0.1}}, depth=2) == {"q": {"v": 2, "u": 1, "w": 0}}


def test_eval_reports_agreement_with_a_teacher_label(teacher_dataset: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "eval.json"
    args = ["eval", "--qrels", str(DL19_QRELS), "--run", str(teacher_dataset), "--teacher", str(teacher_dataset)]
    assert main([*args, "--label", "upr+0.5*first_stage", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "agreement with the teacher's upr+0.5*first_stage" in printed
    fidelity = json.loads(out.read_text())["fidelity"]
    assert fidelity["label"] == "upr+0.5*first_stage" and set(fidelity["results"]) == {
        "triplets/first_stage",
        "triplets/cis",
        "triplets/upr",
    }
    assert set(fidelity["per_query"]["triplets/cis"]["spearman"]) == {"264014", "104861", "130510"}
    assert main([*args, "--label", "upr", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["fidelity"]["results"]["triplets/upr"] == pytest.approx(
        {"kendall_tau": 1.0, "spearman": 1.0, "nDCG@10_teacher": 100.0}
    )
    other = tmp_path / "other.trec"  # judged queries the teacher never scored: its agreement was NaN, exit 0
    other.write_text("".join(f"19335 Q0 {d} {r} {10 - r} x\n" for r, d in enumerate(["1017759", "1082489"], 1)))
    capsys.readouterr()
    assert main(["eval", "--qrels", str(DL19_QRELS), "--run", str(other), "--teacher", str(teacher_dataset)]) == 2
    assert capsys.readouterr().err == (
        f"distill eval: error: teacher: run {other} shares no judged query with {teacher_dataset} (two "
        "candidates at least)\n"
    )


def test_reranker_interpolates_as_asked_or_as_its_card_says(exported: Path, tmp_path: Path) -> None:
    import shutil

    from distill.serving.reranker import Reranker

    query, passages = "what is a rhino", ["Rhinos are large herbivores.", "A flea is small.", "Horns grow."]
    first = [3.0, 1.0, 2.0]
    plain = Reranker.load(exported, backend="onnx").score(query, passages)
    fused = Reranker.load(exported, backend="onnx", interpolation=0.3).score(query, passages, first)
    expected = interpolate(np.array(plain), np.array(first), [query] * 3, 0.3)
    np.testing.assert_allclose(fused, expected, rtol=1e-6)
    with pytest.raises(InputError, match="first-stage score"):
        Reranker.load(exported, backend="onnx", interpolation=0.3).score(query, passages)
    with pytest.raises(InputError, match="no interpolation alpha"):
        Reranker.load(exported, backend="onnx", interpolation=True)
    # A card with an alpha applies it only when it says so.
    folder = tmp_path / "student"
    shutil.copytree(exported, folder)
    config = json.loads((folder / "config.json").read_text())
    for interpolate_by_default, applied in ((False, None), (True, 0.6)):
        config["cis_distill"].update(interpolation=0.6, interpolate=interpolate_by_default)
        (folder / "config.json").write_text(json.dumps(config))
        assert Reranker.load(folder, backend="onnx").alpha == applied
        assert StudentCard.read(folder).alphas() == {"first_stage": 0.6}  # a card's single α, as written before
    assert Reranker.load(folder, backend="onnx", interpolation=False).alpha is None
