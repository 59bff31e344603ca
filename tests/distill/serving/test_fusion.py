"""Fusion with the first stage, per first stage: α chosen on each first stage's own validation lists and written in
the student's card and model card; ``Reranker.load(first_stage=...)``, ``distill rerank --first_stage`` and
``distill serve``'s ``first_stage_scores`` / ``first_stage`` request fields use that first stage's α."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from distill.cli import main
from distill.core.interpolation import choose_alpha, interpolate
from distill.core.schema import InputError
from distill.core.student_card import StudentCard
from distill.serving.fusion import Fusion
from distill.serving.http_api import ServedModel, create_app
from distill.serving.reranker import Reranker
from tests.conftest import DL19_QRELS
from tests.distill.serving.test_http_api import running

ALPHAS = {
    "bm25": {"alpha": 0.8, "chosen_on": "data/trec-dl21/bm25_top100.json", "queries": 53},
    "splade": {"alpha": 0.3, "chosen_on": "data/trec-dl21/splade_top100.json", "queries": 53},
    "tasb": {"alpha": 0.3, "taken_from": "splade"},
}
QUERY = "what is a rhino"
PASSAGES = ["Rhinos are large herbivores.", "A flea is small.", "Horns grow.", "The market fell today."]
FIRST_STAGE = [3.0, 1.0, 2.0, 0.5]
PER_STAGE = {"bm25": "z(cis) + 0.25*z(first_stage)", "splade": "z(cis) + z(first_stage)"}
"""A label per first stage: SPLADE's lists weigh their first stage as much as the teacher, BM25's a quarter."""


def with_card(folder: Path, tmp_path: Path, **card) -> Path:
    """A copy of the model ``folder`` whose student card has ``card``'s values."""
    copy = tmp_path / "student"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    values = StudentCard("bert", "cis", "mse", [], {"kind": "none"}, 512, ["q1"]).to_dict()
    config["cis_distill"] = {**values, **card}
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def stage_copy(teacher_dataset: Path, folder: Path, input_file: str, rows: int, reverse: bool) -> Path:
    """A copy of ``teacher_dataset`` as if made from ``input_file``: each query's first ``rows`` candidates, with
    first-stage scores reversed where ``reverse``."""
    import datasets
    import pyarrow as pa

    from distill.data.teacher_data import TeacherDataset, TeacherMetadata

    table = datasets.load_from_disk(str(teacher_dataset)).data.table
    keep = pa.array(np.asarray(table.column("first_stage_rank").to_pylist()) <= rows)
    table = table.filter(keep)
    if reverse:
        scores = -np.asarray(table.column("first_stage_score").to_pylist())
        index = table.column_names.index("first_stage_score")
        table = table.set_column(index, "first_stage_score", pa.array(scores))
    metadata = TeacherMetadata.read(teacher_dataset)
    metadata.input = [input_file]
    TeacherDataset.write(table, metadata, folder)
    return folder


@pytest.fixture(scope="module")
def two_first_stages(teacher_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny teacher data as two first stages' lists of the same queries: ``bm25`` (12 candidates a query) and
    ``splade`` (the first 8, their first-stage scores reversed: another order)."""
    root = tmp_path_factory.mktemp("first-stages")
    bm25 = stage_copy(teacher_dataset, root / "bm25", "lists/bm25.json", 12, False)
    splade = stage_copy(teacher_dataset, root / "splade", "lists/splade.json", 8, True)
    return bm25, splade


def test_the_card_keeps_an_alpha_per_first_stage_and_reads_a_single_one() -> None:
    card = StudentCard("bert", "cis", "mse", [], {"kind": "none"}, 512, ["q1"], interpolation=ALPHAS)
    assert card.alphas() == {"bm25": 0.8, "splade": 0.3, "tasb": 0.3}
    old = StudentCard.from_dict({**card.to_dict(), "interpolation": 0.95}, "config.json")
    assert old.alphas() == {"first_stage": 0.95}
    for bad in ({"bm25": {"alpha": 1.5}}, {"bm25": 0.5}, {"bm25": {"alpha": 0.5, "chosen": "x"}}):
        with pytest.raises(InputError, match=r"config\.json: cis_distill: interpolation: bm25"):
            StudentCard.from_dict({**card.to_dict(), "interpolation": bad}, "config.json")


def test_alpha_is_chosen_on_each_first_stages_lists(two_first_stages, tiny_bert: Path, tmp_path: Path) -> None:
    from students.data import StudentDataModule
    from students.hf_folder import card_interpolation
    from students.module import validation_metrics

    bm25, splade = two_first_stages
    data = StudentDataModule(
        [str(bm25), str(splade)],
        backbone=str(tiny_bert),
        qrels=str(DL19_QRELS),
        val_queries=2,
        first_stages={"bm25": ["lists/bm25.json"], "splade": ["./lists/splade.json"]},
        alpha_from={"tasb": "splade", "dense": 0.5},
        cache_dir=str(tmp_path / "tokens"),
    )
    data.setup()
    val = data.val
    lists = data.first_stage_lists
    assert len(lists["bm25"].positions) == 2 * 12 and len(lists["splade"].positions) == 2 * 8
    assert lists["splade"].chosen_on == ["lists/splade.json"] and lists["splade"].queries == 2
    rows = list(range(len(val)))
    scores = np.random.default_rng(0).normal(size=len(val))
    metrics = validation_metrics(val, rows, scores, data.qrels, lists)

    # splade's α: chosen on its own lists (8 candidates a query, its own scores), read back from its folder
    from distill.data.teacher_data import TeacherDataset

    own = TeacherDataset.open(splade).to_pandas(["qid", "docid", "first_stage_score"])
    own = own[own.qid.isin(set(val.qid))]
    student = dict(zip(zip(val.qid, val.docid, strict=True), scores, strict=True))
    mine = np.array([student[pair] for pair in zip(own.qid, own.docid, strict=True)])
    qids, docids = own.qid.tolist(), own.docid.tolist()
    alpha, by_alpha = choose_alpha(mine, own.first_stage_score.to_numpy(), qids, docids, data.qrels)
    assert metrics["interp_alpha/splade"] == alpha and metrics["interp_nDCG@10/splade"] == by_alpha[alpha]
    assert {"nDCG@10/bm25", "first_stage_nDCG@10/bm25", "interp_alpha/bm25", "first_stage_nDCG@10/splade"} <= set(
        metrics
    )

    table = card_interpolation(metrics, data)
    assert table == {
        "bm25": {"alpha": metrics["interp_alpha/bm25"], "chosen_on": "lists/bm25.json", "queries": 2},
        "splade": {"alpha": alpha, "chosen_on": "lists/splade.json", "queries": 2},
        "tasb": {"alpha": alpha, "taken_from": "splade"},
        "dense": {"alpha": 0.5, "declared": True},
    }
    StudentCard("bert", "cis", "mse", [], {"kind": "none"}, 512, ["q1"], interpolation=table)  # a valid card


def test_a_pair_of_two_first_stages_lists_trains_in_each_and_validates_once(
    two_first_stages, tiny_bert: Path, tmp_path: Path
) -> None:
    """Each first stage's list of a query is its own list: a pair in both trains twice, its label standardised
    within each list with that list's first-stage score; validation scores it once."""
    from distill.data.label_table import load_label_table
    from distill.data.labels import per_query_z
    from students.data import StudentDataModule

    bm25, splade = two_first_stages
    labelled = load_label_table([str(bm25), str(splade)], "z(first_stage)")
    table = labelled.table
    assert len(table) == 12 * table.qid.nunique() + 8 * table.qid.nunique()
    assert table.duplicated(["qid", "docid"]).sum() == 8 * table.qid.nunique()
    assert table["query"].nunique() == 2 * table.qid.nunique()
    for source in (0, 1):  # each list's label: its own first stage, standardised within the list alone
        rows = table[table.source == source]
        expected = per_query_z(rows.first_stage_score.to_numpy(), rows.qid.to_numpy())
        np.testing.assert_allclose(rows.label.to_numpy(), expected)
    shared = table[table.duplicated(["qid", "docid"], keep=False)].groupby(["qid", "docid"]).label
    assert (shared.nunique() == 2).all()  # reversed scores: the two lists rank the shared pairs apart

    data = StudentDataModule(
        [str(bm25), str(splade)],
        backbone=str(tiny_bert),
        qrels=str(DL19_QRELS),
        val_queries=2,
        label="z(first_stage)",
        first_stages={"bm25": ["lists/bm25.json"], "splade": ["lists/splade.json"]},
        cache_dir=str(tmp_path / "tokens"),
    )
    data.setup()
    train_queries = len(set(data.train.qid))
    assert len(data.train) == 20 * train_queries and len(np.unique(data.train.query)) == 2 * train_queries
    assert len(data.val) == 2 * 12 and len(set(zip(data.val.qid, data.val.docid, strict=True))) == len(data.val)
    assert not set(data.train.qid) & set(data.val.qid)


def test_each_first_stages_lists_learn_their_own_label(two_first_stages) -> None:
    from distill.data.label_table import load_label_table
    from distill.data.labels import per_query_z

    bm25, splade = two_first_stages
    stages = {"bm25": ["lists/bm25.json"], "splade": ["./lists/splade.json"]}
    table = load_label_table([str(bm25), str(splade)], PER_STAGE, first_stages=stages).table
    for source, weight in ((0, 0.25), (1, 1.0)):
        rows = table[table.source == source]
        z = {c: per_query_z(rows[c].to_numpy(), rows.qid.to_numpy()) for c in ("cis", "first_stage_score")}
        np.testing.assert_allclose(rows.label.to_numpy(), z["cis"] + weight * z["first_stage_score"])
    same = load_label_table([str(bm25), str(splade)], {"bm25": "cis", "splade": "cis"}, first_stages=stages).table
    np.testing.assert_array_equal(same.label, load_label_table([str(bm25), str(splade)], "cis").table.label)


@pytest.mark.parametrize(
    ("label", "first_stages", "error"),
    [
        (PER_STAGE, None, r"data.label: a label per first stage \(bm25, splade\) needs data.first_stages"),
        (
            {"bm25": "cis"},
            {"bm25": ["lists/bm25.json"], "splade": ["lists/splade.json"]},
            r"data.label: no label for the first stage 'splade'",
        ),
        (
            {**PER_STAGE, "tasb": "cis"},
            {"bm25": ["lists/bm25.json"], "splade": ["lists/splade.json"]},
            r"data.label: 'tasb' is not a first stage of data.first_stages \(bm25, splade\)",
        ),
        (
            {"bm25": "cis", "splade": "z(cis) +"},
            {"bm25": ["lists/bm25.json"], "splade": ["lists/splade.json"]},
            r"data.label.splade: expected a score, teacher.score, first_stage or judgment, found the end",
        ),
        (
            {"bm25": "cis"},
            {"bm25": ["lists/bm25.json"]},
            r"data.label: .*splade was made from lists/splade.json, the candidates of no first stage",
        ),
    ],
    ids=["no first stages", "a first stage unlabelled", "a label for no first stage", "a bad expression", "orphan"],
)
def test_a_label_per_first_stage_that_does_not_match_the_first_stages_is_refused(
    two_first_stages, label: dict[str, str], first_stages: dict[str, list[str]] | None, error: str
) -> None:
    from distill.data.label_table import load_label_table

    with pytest.raises(InputError, match=error):
        load_label_table([str(folder) for folder in two_first_stages], label, first_stages=first_stages)


def test_first_stages_that_match_no_teacher_data_or_rules_that_name_none_are_refused(
    two_first_stages, tiny_bert: Path, tmp_path: Path
) -> None:
    from students.data import StudentDataModule

    bm25, splade = two_first_stages
    common = {"backbone": str(tiny_bert), "qrels": str(DL19_QRELS), "val_queries": 2}
    with pytest.raises(InputError, match=r"data.alpha_from: tasb: 'colbert' is neither a first stage .*\(bm25\)"):
        StudentDataModule([str(bm25)], first_stages={"bm25": ["lists/bm25.json"]}, alpha_from={"tasb": "colbert"})
    with pytest.raises(InputError, match=r"data\.alpha_from: bm25 has validation lists: .* or declared as a number"):
        StudentDataModule([str(bm25)], first_stages={"bm25": ["lists/bm25.json"]}, alpha_from={"bm25": "tasb"})
    data = StudentDataModule(
        [str(bm25), str(splade)],
        first_stages={"bm25": ["lists/bm25.json"], "tasb": ["lists/tasb.json"]},
        cache_dir=str(tmp_path / "tokens"),
        **common,
    )
    for step in (data.prepare_data, data.setup):
        with pytest.raises(InputError, match=r"data.first_stages: tasb: no teacher dataset .* from lists/tasb.json"):
            step()
    assert not (tmp_path / "tokens").exists()  # refused before any tokenising


def test_train_writes_each_first_stages_alpha_in_the_card(two_first_stages, tiny_bert: Path, tmp_path: Path) -> None:
    import yaml

    from distill.export.model_card import render_model_card
    from tests.distill.stages.test_train import write_config

    bm25, splade = two_first_stages
    path = write_config(tmp_path, tiny_bert, bm25, max_epochs=1)
    config = yaml.safe_load(path.read_text())
    config["data"].update(
        teacher_data=[str(bm25), str(splade)],
        val_queries=2,
        first_stages={"bm25": ["lists/bm25.json"], "splade": ["lists/splade.json"]},
        alpha_from={"tasb": "bm25", "bm25": 0.5},
        label=PER_STAGE,
    )
    path.write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(path)]) == 0
    card = StudentCard.read(tmp_path / "runs" / "tiny" / "hf")
    assert card.label == PER_STAGE
    validation = card.extra["validation"]
    assert set(card.interpolation) == {"bm25", "splade", "tasb"}
    entry = card.interpolation["splade"]
    assert entry == {"alpha": validation["interp_alpha/splade"], "chosen_on": "lists/splade.json", "queries": 2}
    assert "interp_alpha/bm25" in validation  # chosen on its lists, and the declared number takes its place
    assert card.interpolation["bm25"] == {"alpha": 0.5, "declared": True}
    assert card.interpolation["tasb"] == {"alpha": 0.5, "taken_from": "bm25"}

    shown = render_model_card({"model_type": "bert", "max_length": 128, "student": card.to_dict()}, "m", "mit")
    assert "## Fusion with the first stage" in shown
    splade_alpha = card.interpolation["splade"]["alpha"]
    assert f"| splade | {splade_alpha:.2f} | the best nDCG@10 on the lists of 2 judged validation queries" in shown
    assert "| bm25 | 0.50 | declared in the training config |" in shown
    assert "| tasb | 0.50 | no validation lists: the α of bm25 |" in shown
    first = validation["first_stage_nDCG@10/splade"]
    assert f"| nDCG@10 of the first stage, on splade's lists | {first:.2f} |" in shown
    assert "bm25's lists: `z(cis) + 0.25*z(first_stage)`; splade's lists: `z(cis) + z(first_stage)`" in shown


def test_reranker_and_rerank_fuse_with_the_named_first_stages_alpha(
    spread_bert: Path, tmp_path: Path, sample_file: Path
) -> None:
    folder = with_card(spread_bert, tmp_path, interpolation=ALPHAS)
    alone = np.array(Reranker.load(folder, backend="torch").score(QUERY, PASSAGES))  # the card does not fuse
    for name, alpha in (("bm25", 0.8), ("splade", 0.3), ("tasb", 0.3)):
        reranker = Reranker.load(folder, backend="torch", first_stage=name)
        assert (reranker.first_stage, reranker.alpha) == (name, alpha)
        expected = interpolate(alone, np.array(FIRST_STAGE), [QUERY] * 4, alpha)
        np.testing.assert_allclose(reranker.score(QUERY, PASSAGES, FIRST_STAGE), expected, rtol=1e-6)
    with pytest.raises(InputError, match=r"^first stage 'colbert' is not one of the student's: bm25, splade, tasb$"):
        Reranker.load(folder, backend="torch", first_stage="colbert")
    with pytest.raises(InputError, match="an alpha for each of the first stages bm25, splade, tasb: name one"):
        Reranker.load(folder, backend="torch", interpolation=True)
    with pytest.raises(InputError, match="first_stage 'bm25' takes its alpha from the student's card"):
        Reranker.load(folder, backend="torch", first_stage="bm25", interpolation=0.5)
    for alpha in (1.5, -0.5):
        with pytest.raises(InputError, match=rf"^interpolation: an alpha is in \[0, 1\] .*, not {alpha}$"):
            Reranker.load(folder, backend="torch", interpolation=alpha)

    # first-stage scores are checked, never ignored or zeroed: a reranker that does not fuse refuses them
    with pytest.raises(InputError, match=r"^first_stage_scores: this reranker does not fuse with a first stage"):
        Reranker.load(folder, backend="torch").score(QUERY, PASSAGES, FIRST_STAGE)
    fusing = Reranker.load(folder, backend="torch", first_stage="bm25")
    for scores, message in (
        (FIRST_STAGE[:3], r"first_stage_scores: 3 scores for 4 passages: give one per passage"),
        ([1.0, float("nan"), 2.0, 3.0], r"first_stage_scores\[1\]: nan is not a finite number"),
        ([1.0, 2.0, float("inf"), 3.0], r"first_stage_scores\[2\]: inf is not a finite number"),
        ([1.0, 2.0, 3.0, None], r"first_stage_scores\[3\]: None is not a finite number"),
        ([1.0, "2", 3.0, 4.0], r"first_stage_scores\[1\]: '2' is not a finite number"),
        ([True, 2.0, 3.0, 4.0], r"first_stage_scores\[0\]: True is not a finite number"),
        ("1234", r"first_stage_scores: a sequence of numbers, one per passage, not str"),
        (dict.fromkeys(FIRST_STAGE), r"first_stage_scores: a sequence of numbers, one per passage, not dict"),
    ):
        with pytest.raises(InputError, match=f"^{message}$"):
            fusing.score(QUERY, PASSAGES, scores)
    as_numpy = fusing.score(QUERY, PASSAGES, np.array(FIRST_STAGE, dtype=np.float32))
    np.testing.assert_allclose(as_numpy, fusing.score(QUERY, PASSAGES, FIRST_STAGE), rtol=1e-6)
    import pandas as pd  # a Series was refused while passages took one

    as_series = pd.Series(FIRST_STAGE, index=[7, 5, 3, 1])  # in its order, whatever its index
    assert fusing.score(QUERY, pd.Series(PASSAGES), as_series) == fusing.score(QUERY, PASSAGES, FIRST_STAGE)

    # distill rerank --first_stage: the run is the fused ranking of the sample's BM25 lists with splade's α
    from distill.data.loaders import load_candidates
    from distill.eval.trec_runs import read_trec_run

    output = tmp_path / "fused.trec"
    args = ["rerank", "--model", str(folder), "--backend", "torch", "--input", str(sample_file)]
    assert main([*args, "--first_stage", "splade", "--output", str(output)]) == 0
    run = read_trec_run(output)
    plain = Reranker.load(folder, backend="torch")
    for c in load_candidates(sample_file).candidates:
        student = np.array(plain.score(c.query.text, [p.text for p in c.passages]))
        fused = interpolate(student, np.array(c.scores), [c.query.qid] * len(student), 0.3)
        got = np.array([run[c.query.qid][p.docid] for p in c.passages])
        np.testing.assert_allclose(got, fused, rtol=1e-5, atol=1e-6)
    assert main([*args, "--first_stage", "colbert", "--output", str(tmp_path / "x.trec")]) == 2


def test_serve_fuses_requests_that_send_first_stage_scores(spread_bert: Path, tmp_path: Path) -> None:
    folder = with_card(spread_bert, tmp_path, interpolation=ALPHAS)
    reranker = Reranker.load(folder, backend="torch", interpolation=False)
    alone = np.array(reranker.score(QUERY, PASSAGES))

    def fused(alpha: float) -> np.ndarray:
        return interpolate(alone, np.array(FIRST_STAGE), [QUERY] * 4, alpha)

    app = create_app(ServedModel(folder, reranker, Fusion.of(folder, None, "bm25")))
    with running(app) as url:
        cohere = {"query": QUERY, "documents": PASSAGES, "raw_scores": True}
        tei = {"query": QUERY, "texts": PASSAGES, "raw_scores": True}
        for extra, expected in (
            ({}, alone),  # no first-stage scores: the student alone
            ({"first_stage_scores": FIRST_STAGE}, fused(0.8)),  # the server's first stage, bm25
            ({"first_stage_scores": FIRST_STAGE, "first_stage": "tasb"}, fused(0.3)),
            ({"first_stage_scores": [1e300 * s for s in FIRST_STAGE]}, fused(0.8)),  # any finite magnitude
        ):
            answer = httpx.post(f"{url}/v1/rerank", json={**cohere, **extra}).json()
            scores = {r["index"]: r["relevance_score"] for r in answer["results"]}
            assert [r["index"] for r in answer["results"]] == np.lexsort((np.arange(4), -expected)).tolist()
            np.testing.assert_allclose([scores[i] for i in range(4)], expected, atol=1e-4)
            answer = httpx.post(f"{url}/rerank", json={**tei, **extra}).json()
            np.testing.assert_allclose(
                [{r["index"]: r["score"] for r in answer}[i] for i in range(4)], expected, atol=1e-4
            )

        from cohere import Client  # Cohere's SDK sends the extension as extra body parameters

        extension = {"first_stage_scores": FIRST_STAGE, "first_stage": "splade"}
        answer = Client(api_key="unused", base_url=url).rerank(
            query=QUERY, documents=PASSAGES, request_options={"additional_body_parameters": extension}
        )
        assert [r.index for r in answer.results] == np.lexsort((np.arange(4), -fused(0.3))).tolist()

        bad = (
            ({"first_stage_scores": FIRST_STAGE[:3]}, "first_stage_scores: 3 scores for 4 {field}; send one per"),
            ({"first_stage_scores": [1, "x", 2, 3]}, "first_stage_scores[1]: Input should be a valid number"),
            ({"first_stage_scores": [1, 2, 3, float("inf")]}, "first_stage_scores[3]: Input should be a finite number"),
            ({"first_stage_scores": [1, float("nan"), 3, 4]}, "first_stage_scores[1]: Input should be a finite number"),
            ({"first_stage_scores": FIRST_STAGE, "first_stage": "colbert"}, "first_stage: 'colbert' is not one of"),
            ({"first_stage": "bm25"}, "first_stage: names the first stage of first_stage_scores, which are not sent"),
        )
        for route, body, field in (("/v1/rerank", cohere, "documents"), ("/rerank", tei, "texts")):
            for extra, message in bad:
                content = json.dumps({**body, **extra})  # NaN and Infinity as Python's json writes them
                response = httpx.post(f"{url}{route}", content=content, headers={"content-type": "application/json"})
                assert response.status_code == 422, (route, extra)
                assert response.json()["error"].startswith(message.format(field=field)), response.json()

    off = create_app(ServedModel(folder, reranker, Fusion.of(folder, False, None)))
    with running(off) as url:
        response = httpx.post(
            f"{url}/rerank", json={"query": QUERY, "texts": PASSAGES, "first_stage_scores": FIRST_STAGE}
        )
        assert response.status_code == 422 and "does not fuse" in response.json()["error"]


def test_val_folds_hold_out_each_judged_query_once(two_first_stages, tiny_bert: Path, tmp_path: Path) -> None:
    from students.data import StudentDataModule, fold_queries

    pool = [f"q{i}" for i in range(53)]
    folds = [fold_queries(pool, 2, k, 0) for k in (0, 1)]
    assert folds[0] | folds[1] == set(pool) and not folds[0] & folds[1] and {len(f) for f in folds} == {26, 27}
    with pytest.raises(InputError, match=r"data.val_fold: 2 of val_folds=2"):
        StudentDataModule(["x"], val_folds=2, val_fold=2)
    bm25, splade = two_first_stages
    held = []
    for fold in (0, 1):
        data = StudentDataModule(
            [str(bm25), str(splade)], backbone=str(tiny_bert), qrels=str(DL19_QRELS), val_pool="judged",
            val_folds=2, val_fold=fold, cache_dir=str(tmp_path / "tokens"),
        )  # fmt: skip
        data.setup()
        held.append(set(data.val.qid))
        assert not held[-1] & set(data.train.qid)
    judged = set(held[0] | held[1])
    assert held[0] and held[1] and not held[0] & held[1] and len(judged) == 3  # the tiny data's 3 judged queries
