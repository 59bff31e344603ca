"""The selection of ``experiments/first_stages.py``: two settings compared query by query with the quality gate's
paired bootstrap, and α chosen on pooled held-out lists, fused as ``distill rerank`` fuses."""

from __future__ import annotations

import importlib.util
import json
import shutil

import numpy as np
import pytest

from distill.core.interpolation import interpolate
from tests.conftest import REPO


@pytest.fixture(scope="module")
def selection():
    spec = importlib.util.spec_from_file_location("first_stages", REPO / "experiments" / "first_stages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_difference_has_its_bootstrap_interval_over_the_shared_queries(selection) -> None:
    rng = np.random.default_rng(0)
    a = {f"q{i}": float(v) for i, v in enumerate(rng.normal(60, 10, size=53))}
    better = {q: v + 2.0 + float(rng.normal(0, 1)) for q, v in a.items()}
    better["extra"] = 99.0  # a query only one side has is left out
    d = selection.difference(better, a)
    assert d["queries"] == 53 and d["interval"][0] < d["difference"] < d["interval"][1]
    assert d["interval"][0] > 1.0 and d["interval"][1] < 3.0 and d["p"] < 0.001
    same = selection.difference(a, a)
    assert same["difference"] == 0 and same["interval"] == [0, 0] and same["p"] == 1.0


def test_pooled_lists_are_fused_as_rerank_fuses_and_alpha_is_the_best_on_them(selection) -> None:
    student = {"q1": {"a": 3.0, "b": 1.0, "c": 2.0}, "q2": {"x": 0.5, "y": 0.1}}
    first = {"q1": {"a": 10.0, "b": 30.0, "c": 20.0}, "q2": {"x": 1.0, "y": 5.0}, "q3": {"z": 1.0}}
    fused = selection.fuse(student, first, 0.3)
    for q in student:
        docs = list(student[q])
        expected = interpolate(
            np.array([student[q][d] for d in docs]), np.array([first[q][d] for d in docs]), [q] * len(docs), 0.3
        )
        assert [fused[q][d] for d in docs] == pytest.approx(expected.tolist())
    qrels = {"q1": {"a": 1}, "q2": {"x": 1}}  # the student is right, the first stage wrong: all student
    assert selection.choose(student, first, qrels) == 1.0
    assert selection.choose(student, first, {"q1": {"b": 1}, "q2": {"y": 1}}) < 0.5


def test_a_teacher_label_is_the_weighted_sum_of_its_runs_z_scores(selection) -> None:
    from distill.data.labels import per_query_z
    from distill.eval.trec_runs import read_trec_run

    weights = {"minilm/similarity": 1.0, "smollm2/cis_q": 0.5}
    label = selection.label_run("bm25", weights)
    runs = {
        name: read_trec_run(
            REPO / "data" / "teacher" / f"dl21-bm25-{name.split('/')[0]}" / "runs" / f"{name.split('/')[1]}.trec"
        )
        for name in weights
    }
    qid = sorted(label)[0]
    docids = sorted(label[qid])
    assert len(label) == 53 and len(docids) == 100
    expected = sum(
        weight * per_query_z(np.array([runs[name][qid][d] for d in docids]), [qid] * len(docids))
        for name, weight in weights.items()
    )
    np.testing.assert_allclose([label[qid][d] for d in docids], expected, atol=1e-9)


def test_a_variant_with_committed_held_out_runs_selects_without_its_checkpoints(
    selection, tmp_path, monkeypatch
) -> None:
    from distill.data.loaders import load_qrels
    from distill.eval.trec_runs import read_trec_run, write_trec_run

    monkeypatch.setattr(selection, "RECORDS", tmp_path)
    monkeypatch.setattr(selection, "ROOT", tmp_path)  # no checkpoints/ here
    qrels = load_qrels(REPO / selection.VALIDATION_QRELS)
    runs = {
        stage: {q: {f"{stage}-d{k}": float(k) for k in range(3)} for q in sorted(qrels)}
        for stage in selection.VALIDATION
    }
    with pytest.raises(SystemExit, match="checkpoints/fs-hybrid-apart-f0/hf is missing"):
        selection.pooled("hybrid-apart", qrels, [])
    for stage, run in runs.items():
        write_trec_run(selection.heldout_path("hybrid-apart", stage), run, tag="hybrid-apart")
    commands: list[str] = []
    lists = selection.pooled("hybrid-apart", qrels, commands)
    assert lists == {stage: read_trec_run(selection.heldout_path("hybrid-apart", stage)) for stage in runs}
    assert lists["bm25"][sorted(qrels)[0]]["bm25-d2"] == 2.0 and len(lists["splade"]) == 53
    # The commands that made them are still recorded: each fold's training and its two held-out reranks.
    assert [c.split()[1] for c in commands] == ["train", "rerank", "rerank"] * 2
    assert "--data.val_fold 1" in commands[3] and "--held_out checkpoints/fs-hybrid-apart-f1" in commands[5]


def test_each_fold_commits_its_held_out_runs_as_it_trains_and_the_pool_replaces_them(
    selection, tmp_path, monkeypatch
) -> None:
    """``train --fold K`` trains that fold's run alone and commits its held-out scores at once, so that the other
    fold may train in another checkout (no checkpoint there); ``select`` then pools the committed fold runs."""
    from distill.data.loaders import load_qrels
    from distill.eval.trec_runs import read_trec_run, write_trec_run

    monkeypatch.setattr(selection, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(selection, "ROOT", tmp_path)
    qrels = load_qrels(REPO / selection.VALIDATION_QRELS)
    folds = {run_name: sorted(qrels)[k::2] for k, run_name in enumerate(selection.runs("hybrid-apart"))}
    launched: list[list[str]] = []

    def run(command: list[str]) -> None:  # what each launched command leaves behind, without training
        launched.append(command)
        run_name = command[command.index("--run_name") + 1] if "--run_name" in command else None
        if command[1] == "train":
            (tmp_path / "checkpoints" / run_name / "hf").mkdir(parents=True)
            (tmp_path / "checkpoints" / run_name / "hf" / "config.json").write_text("{}")
        else:
            queries = folds[command[command.index("--held_out") + 1].split("/")[1]]
            scores = {q: {f"{command[command.index('--input') + 1]}-d{k}": float(k) for k in range(3)} for q in queries}
            write_trec_run(tmp_path / command[-1], scores, tag="x")

    monkeypatch.setattr(selection, "run", run)
    with pytest.raises(SystemExit, match="bm25 trains in one run, not in folds"):
        selection.train(["bm25"], fold=1)
    selection.train(["hybrid-apart"], fold=1)
    assert [c[1] for c in launched] == ["train", "rerank", "rerank"]
    assert launched[0][-4:] == ["--run_name", "fs-hybrid-apart-f1", *selection.RESUME]  # an interrupted run resumes
    assert not selection.trained("fs-hybrid-apart-f0")
    f1 = {stage: selection.fold_path("hybrid-apart", "fs-hybrid-apart-f1", stage) for stage in selection.VALIDATION}
    assert sorted(read_trec_run(f1["splade"])) == folds["fs-hybrid-apart-f1"]
    with pytest.raises(SystemExit, match="checkpoints/fs-hybrid-apart-f0/hf is missing"):
        selection.pooled("hybrid-apart", qrels, [])

    shutil.rmtree(tmp_path / "checkpoints")  # fold 1's checkpoint is gone: the next checkout trains fold 0
    selection.train(["hybrid-apart"], fold=0)
    trained = [c[c.index("--run_name") + 1] for c in launched if c[1] == "train"]
    assert trained == ["fs-hybrid-apart-f1", "fs-hybrid-apart-f0"]
    lists = selection.pooled("hybrid-apart", qrels, [])
    assert sorted(lists["bm25"]) == sorted(qrels) and len(lists["splade"]) == 53
    assert lists == {stage: read_trec_run(selection.heldout_path("hybrid-apart", stage)) for stage in lists}
    assert not any(path.exists() for path in f1.values())  # the pooled runs replace the folds' own
    selection.train(["hybrid-apart"], fold=0)  # trained and pooled: nothing runs again
    assert len(launched) == 6


def test_each_candidate_label_is_weighed_against_the_reference_label_and_the_first_stage(
    selection, tmp_path, monkeypatch
) -> None:
    from distill.data.loaders import load_qrels
    from distill.eval.metrics import evaluate_per_query

    monkeypatch.setattr(selection, "RECORDS", tmp_path)
    first_only = {"first stage alone": {"smollm2/first_stage": 1.0}}
    monkeypatch.setattr(
        selection, "LABELS", {selection.LABEL_REFERENCE: selection.LABELS[selection.LABEL_REFERENCE]} | first_only
    )
    record = selection.labels()
    assert record == json.loads((tmp_path / "labels-dl21.json").read_text())
    reference, first = record["rows"]
    qrels = load_qrels(REPO / selection.VALIDATION_QRELS)
    for stage, candidates in selection.VALIDATION.items():
        assert reference[stage]["vs_reference"]["difference"] == 0 and reference[stage]["vs_reference"]["queries"] == 53
        # A label of the first stage's score alone ranks as the first stage does: no difference with it, and its
        # difference with the reference is the reference's with the first stage, negated.
        assert first[stage]["vs_first_stage"]["difference"] == 0
        assert first[stage]["vs_reference"]["difference"] == -reference[stage]["vs_first_stage"]["difference"]
        run = evaluate_per_query(selection.first_stage_scores(candidates), qrels, ["nDCG@10"])["nDCG@10"]
        assert first[stage]["ndcg"] == record["first_stage"][stage] == selection.mean(run)
    assert "| first stage alone |" in (tmp_path / "labels-dl21.md").read_text()


def test_the_backbone_is_set_against_each_dl19_first_stage_beside_the_final_student(
    selection, tmp_path, monkeypatch
) -> None:
    """With each first stage's own scores in the backbone's place, every Δ is nil and the backbone's nDCG@10 is the
    first stage's; the student's column is final.json's."""
    import shutil

    from distill.eval.trec_runs import write_trec_run

    for stage, candidates in selection.TEST.items():
        write_trec_run(tmp_path / "runs" / f"{stage}.trec", selection.first_stage_scores(candidates), "first")
    shutil.copy(selection.RECORDS / "final.json", tmp_path / "final.json")
    monkeypatch.setattr(selection, "RECORDS", tmp_path)
    monkeypatch.setattr(selection, "BACKBONE_RUNS", str(tmp_path / "runs" / "{stage}.trec"))
    record = selection.backbone()
    assert record == json.loads((tmp_path / "backbone-dl19.json").read_text())
    final = json.loads((tmp_path / "final.json").read_text())
    assert list(record["rows"]) == ["bm25", "tasb", "splade"]
    for stage, row in record["rows"].items():
        assert row["backbone"] == row["first_stage"] == final["dl19"][stage]["first_stage"]
        assert row["backbone_vs_first_stage"]["difference"] == 0 and row["backbone_vs_first_stage"]["queries"] == 43
        assert row["student"] == final["dl19"][stage]["student"]
    assert "| splade | 73.08 | 73.08 | +0.00 [+0.00, +0.00] |" in (tmp_path / "backbone-dl19.md").read_text()


def test_a_blend_variant_is_its_base_runs_blended_as_the_training_option_blends(
    selection, tiny_mpnet, tmp_path, monkeypatch
) -> None:
    """A variant that differs from a trained one only by ``--model.initial_weight_share`` is that variant's fold
    folders blended with their initial weights, the card keeping the held-out queries; its recorded train command is
    the base's with the option, which writes the same folder."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from distill.core.student_card import StudentCard
    from students.model import build_student, save_student

    blends = [("mpnet-student", share) for share in ("0.25", "0.5", "0.75")]
    blends += [("mpnet-student-dl22s", share) for share in ("0.5", "0.75")]
    for base, share in blends:
        name = f"{base}-wise{share}"
        assert selection.blended_from(name) == (base, float(share))
        command = selection.train_command(name, f"fs-{name}-f1")
        assert command == [*selection.train_command(base, f"fs-{name}-f1")[:-4], selection.SHARE, share,
                           *command[-4:]]  # fmt: skip
        assert selection.blended_from(base) is None

    monkeypatch.setattr(selection, "ROOT", tmp_path)
    initial, tokenizer = build_student(str(tiny_mpnet), head="segment_cosine", segment_layers=2)
    trained, _ = build_student(str(tiny_mpnet), head="segment_cosine", segment_layers=2)
    with torch.no_grad():
        for weight in trained.parameters():
            weight.add_(1.0)
    card = StudentCard(str(tiny_mpnet), "cis", "mse", [], {"kind": "none"}, 64, ["q1", "q2"])
    save_student(trained, tokenizer, tmp_path / "checkpoints" / "fs-x-f0" / "hf", card)

    selection.blend_run("fs-x-f0", "fs-y-f0", 0.25)
    blended = AutoModelForSequenceClassification.from_pretrained(tmp_path / "checkpoints" / "fs-y-f0" / "hf")
    start, end = initial.state_dict(), trained.state_dict()
    for name, weight in blended.state_dict().items():
        if weight.is_floating_point():
            torch.testing.assert_close(weight, 0.75 * end[name] + 0.25 * start[name])
    blended_card = StudentCard.read(tmp_path / "checkpoints" / "fs-y-f0" / "hf")
    assert blended_card.val_queries == ["q1", "q2"] and blended_card.initial_weight_share == 0.25


def test_the_untrained_student_is_weighed_by_its_joint_layers_against_every_layer_apart(
    selection, tiny_mpnet, tmp_path, monkeypatch
) -> None:
    """Each untrained student is saved once and reranks DL21's BM25 lists (their top 10 here) through
    ``distill rerank``; set against its own run (every layer of the 2-layer backbone apart), it differs by nothing,
    and a joint layer is counted as the backbone's layers less those apart."""
    for folder in ("data", "configs"):
        (tmp_path / folder).symlink_to(REPO / folder)
    lists = json.loads((REPO / selection.VALIDATION["bm25"]).read_text())
    (tmp_path / "top10.json").write_text(json.dumps([{**q, "hits": q["hits"][:10]} for q in lists]))
    monkeypatch.setitem(selection.VALIDATION, "bm25", "top10.json")
    monkeypatch.setattr(selection, "ROOT", tmp_path)
    monkeypatch.setattr(selection, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(selection, "JOINT_BACKBONE", str(tiny_mpnet))
    monkeypatch.setattr(selection, "JOINT_LAYERS", (2,))
    every_layer_apart = tmp_path / selection.JOINT_RUNS.format(layers=2) / "dl21-bm25.trec"
    first = selection.joint()
    assert every_layer_apart.is_file() and first["rows"][1]["joint_layers"] == 0
    saved = every_layer_apart.stat().st_mtime_ns

    monkeypatch.setattr(selection, "JOINT_REFERENCE", str(every_layer_apart))
    monkeypatch.setattr(selection, "JOINT_LAYERS", (2, 1))
    record = selection.joint()
    assert record == json.loads((tmp_path / "records" / "joint-dl21.json").read_text())
    reference, apart, one_joint = record["rows"]
    assert every_layer_apart.stat().st_mtime_ns == saved  # reused, not reranked again
    assert apart["nDCG@10"] == reference["nDCG@10"] == first["rows"][1]["nDCG@10"]
    assert apart["vs_every_layer_apart"]["difference"] == 0 and apart["vs_every_layer_apart"]["queries"] == 53
    assert one_joint["joint_layers"] == 1 and one_joint["vs_every_layer_apart"]["queries"] == 53
    assert "--max_length 192" in record["commands"][0]
    page = (tmp_path / "records" / "joint-dl21.md").read_text()
    assert f"| 1 | {one_joint['nDCG@10']:.2f} |" in page


def test_settings_are_compared_over_their_seeds_query_by_query(selection, tmp_path, monkeypatch) -> None:
    """A setting's figure is each query's nDCG@10 averaged over its seeds (``NAME`` and ``NAME-seedN``); its
    difference with the baseline is over those per-query means; a setting without a seed variant is refused."""
    from distill.data.loaders import load_qrels
    from distill.eval.metrics import evaluate_per_query
    from distill.eval.trec_runs import write_trec_run

    monkeypatch.setattr(selection, "RECORDS", tmp_path)
    variants = {name: ([], True) for name in ("good", "good-seed1", "bad", "bad-seed1", "alone")}
    monkeypatch.setattr(selection, "VARIANTS", variants)
    qrels = load_qrels(REPO / selection.VALIDATION_QRELS)
    first = {stage: selection.first_stage_scores(candidates) for stage, candidates in selection.VALIDATION.items()}
    by_grade = {
        stage: {q: {d: qrels[q].get(d, 0) + 1e-3 * k for k, d in enumerate(docs)} for q, docs in run.items()}
        for stage, run in first.items()
    }
    reversed_ = {
        stage: {q: {d: -v for d, v in docs.items()} for q, docs in run.items()} for stage, run in by_grade.items()
    }
    for name, runs in (("good", by_grade), ("good-seed1", reversed_), ("bad", reversed_), ("bad-seed1", reversed_)):
        for stage, run in runs.items():
            write_trec_run(selection.heldout_path(name, stage), run, tag=name)
    with pytest.raises(SystemExit, match="alone has no alone-seed<N> variant"):
        selection.seeds(["alone"], "bad", "x")
    record = selection.seeds(["good"], "bad", "test")
    assert record == json.loads((tmp_path / "seeds-test.json").read_text())
    good, bad = record["rows"]
    assert good["seeds"] == ["good", "good-seed1"] and bad["name"] == "bad"
    for stage in selection.VALIDATION:
        ideal = evaluate_per_query(by_grade[stage], qrels, ["nDCG@10"])["nDCG@10"]
        worst = evaluate_per_query(reversed_[stage], qrels, ["nDCG@10"])["nDCG@10"]
        assert good[stage]["student_per_seed"] == [selection.mean(ideal), selection.mean(worst)]
        half = {q: (ideal[q] + worst[q]) / 2 for q in ideal}
        assert good[stage]["student"] == selection.mean(half)
        assert good[stage]["student_vs"] == selection.difference(half, worst)
        assert good[stage]["student_vs"]["difference"] > 0 and bad[stage]["student_vs"]["difference"] == 0
    assert "| `good` | 2 |" in (tmp_path / "seeds-test.md").read_text()


def test_each_depth_reorders_only_the_first_stages_top_k(selection, tmp_path, monkeypatch) -> None:
    """At depth k the student reorders the first stage's k best candidates and nothing below them: a student that
    ranks by the judged grade scores, alone, the ideal nDCG@10 of those k, which grows with k up to its figure on
    all 100; each depth is set against all 100 query by query."""
    from distill.data.loaders import load_qrels
    from distill.eval.metrics import evaluate_per_query
    from distill.eval.trec_runs import write_trec_run

    monkeypatch.setattr(selection, "RECORDS", tmp_path)
    monkeypatch.setattr(selection, "VARIANTS", {"good": ([], True)})
    qrels = load_qrels(REPO / selection.VALIDATION_QRELS)
    first = {stage: selection.first_stage_scores(candidates) for stage, candidates in selection.VALIDATION.items()}
    by_grade = {
        stage: {q: {d: qrels[q].get(d, 0) + 1e-3 * k for k, d in enumerate(docs)} for q, docs in run.items()}
        for stage, run in first.items()
    }
    for stage, run in by_grade.items():
        write_trec_run(selection.heldout_path("good", stage), run, tag="good")
    record = selection.depth("good", "test")
    assert record == json.loads((tmp_path / "depth-test.json").read_text()) and record["seeds"] == ["good"]
    rows = {(row["first_stage"], row["depth"]): row for row in record["rows"]}
    assert set(rows) == {(stage, k) for stage in selection.VALIDATION for k in selection.DEPTHS}
    for stage, run in by_grade.items():
        best_ten = {q: sorted(first[stage][q], key=lambda d: -first[stage][q][d])[:10] for q in run}
        ideal_ten = evaluate_per_query({q: {d: run[q][d] for d in best_ten[q]} for q in run}, qrels, ["nDCG@10"])
        ideal = evaluate_per_query(run, qrels, ["nDCG@10"])["nDCG@10"]
        assert rows[stage, 10]["student"] == selection.mean(ideal_ten["nDCG@10"]) < selection.mean(ideal)
        assert rows[stage, 10]["student_vs_100"] == selection.difference(ideal_ten["nDCG@10"], ideal)
        figures = [rows[stage, k]["student"] for k in selection.DEPTHS]
        assert figures == sorted(figures) and figures[-1] == selection.mean(ideal)
        assert rows[stage, 100]["fused_vs_100"]["difference"] == 0
    assert "| splade | 20 |" in (tmp_path / "depth-test.md").read_text()
