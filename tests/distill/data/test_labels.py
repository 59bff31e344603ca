"""Labels over several teachers of the same pairs: the expression grammar, the join on (qid, docid), the error for
teachers of different pairs, and the agreement of runs with the label and with each of its terms."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from distill.cli import main
from distill.core.schema import InputError
from distill.data.label_table import load_label_table
from distill.data.labels import FIRST_STAGE, JUDGMENT, LabelExpression, Term, per_query_z
from distill.data.teacher_data import TeacherDataset, TeacherMetadata
from tests.conftest import DL19_QRELS

TEACHERS = ("gemma", "smollm2")


def write_teacher(table, path: Path, identity: str) -> Path:
    """``table`` (a DataFrame of teacher rows) as a teacher dataset folder scored by ``identity``."""
    scores = ["cis", "upr"]
    metadata = TeacherMetadata("cis", scores, ["in.json"], {"teacher": identity})
    TeacherDataset.write(pa.Table.from_pandas(table, preserve_index=False), metadata, path)
    return path


@pytest.fixture(scope="module")
def teachers(teacher_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Two teachers of the fixture's 36 pairs: ``gemma`` (one folder, its rows shuffled, other scores) and
    ``smollm2`` (the fixture's rows, split by query over two folders)."""
    root = tmp_path_factory.mktemp("teachers")
    table = TeacherDataset.open(teacher_dataset).to_pandas()
    rng = np.random.default_rng(0)
    other = table.sample(frac=1.0, random_state=0).reset_index(drop=True)
    other["cis"] = rng.normal(size=len(other))
    other["upr"] = rng.normal(size=len(other))
    first_query = table.qid == table.qid.iloc[0]
    return {
        "gemma": [str(write_teacher(other, root / "gemma", "package:gemma"))],
        "smollm2": [
            str(write_teacher(table[first_query], root / "smollm2-a", "package:smollm2")),
            str(write_teacher(table[~first_query], root / "smollm2-b", "package:smollm2")),
        ],
    }


def by_pair(folders: list[str], column: str) -> dict[tuple[str, str], float]:
    values = {}
    for folder in folders:
        table = TeacherDataset.open(folder).to_pandas()
        values.update(zip(zip(table.qid, table.docid, strict=True), table[column], strict=True))
    return values


@pytest.mark.parametrize(
    ("text", "teachers", "terms", "standardised"),
    [
        ("cis", (), [Term(1.0, "cis")], False),
        ("gemma.cis", TEACHERS, [Term(1.0, "cis", "gemma")], False),
        ("cis", ("gemma",), [Term(1.0, "cis", "gemma")], False),  # a sole named teacher needs no name
        ("cis_q+0.5*first_stage", (), [Term(1.0, "cis_q"), Term(0.5, FIRST_STAGE)], True),
        ("z(cis_q) + 0.5*z(first_stage)", (), [Term(1.0, "cis_q"), Term(0.5, FIRST_STAGE)], True),
        ("z(cis) + 0.123456789*z(upr)", (), [Term(1.0, "cis"), Term(0.123456789, "upr")], True),
        (
            "z(gemma.cis) + z(smollm2.cis_q) + 0.25*z(first_stage)",
            TEACHERS,
            [Term(1.0, "cis", "gemma"), Term(1.0, "cis_q", "smollm2"), Term(0.25, FIRST_STAGE)],
            True,
        ),
        (
            "z(gemma.cis) + 2*z(judgment)",
            TEACHERS,
            [Term(1.0, "cis", "gemma"), Term(2.0, JUDGMENT)],
            True,
        ),
        (
            "-z(gemma.upr) - 2e-1 * z(smollm2.cis)",
            TEACHERS,
            [Term(-1.0, "upr", "gemma"), Term(-0.2, "cis", "smollm2")],
            True,
        ),
    ],
)
def test_label_expressions_parse(text: str, teachers: tuple[str, ...], terms: list[Term], standardised: bool) -> None:
    expression = LabelExpression.parse(text, teachers)
    assert expression == LabelExpression(tuple(terms), standardised)
    assert LabelExpression.parse(str(expression), teachers) == expression  # it prints as it parses


@pytest.mark.parametrize(
    ("text", "teachers", "message"),
    [
        ("z(gema.cis) + z(smollm2.cis)", TEACHERS, "data.label: unknown teacher 'gema' (teachers: gemma, smollm2)"),
        ("z(cis) + z(first_stage)", TEACHERS, "data.label: 'cis' needs a teacher: gemma.cis or smollm2.cis"),
        ("gemma.cis", (), "data.label: 'gemma.cis' names a teacher, but the teacher data is not a mapping"),
        ("z(gemma.cis) + smollm2.upr", TEACHERS, "data.label: write 'smollm2.upr' as z(smollm2.upr) in a sum"),
        ("cis_q+0.5*bm25", (), "data.label: write 'bm25' as z(bm25) in a sum"),
        ("z(gemma.cis) + 0.5 z(first_stage)", TEACHERS, "data.label: expected '*' after the weight 0.5, found 'z'"),
        ("z(gemma.cis", TEACHERS, "data.label: expected ')', found the end"),
        ("z(gemma.cis)) + z(first_stage)", TEACHERS, "data.label: unexpected ')' after a term"),
        ("z(gemma.cis) + z(gemma.cis)", TEACHERS, "data.label: 'gemma.cis' appears more than once"),
        ("__import__('os').system('ls')", TEACHERS, 'data.label: unexpected "\'"'),
        ("z(gemma.cis) * 2", TEACHERS, "data.label: unexpected '*' after a term"),
        ("  ", TEACHERS, "data.label: empty"),
        ("1e400*z(gemma.cis) + z(smollm2.cis)", TEACHERS, "data.label: the weight 1e400 is not a finite number"),
        ("0*z(cis)", (), "data.label: every weight is 0: the label would be the same for every pair"),
        ("0*z(gemma.cis) - 0*z(first_stage)", TEACHERS, "data.label: every weight is 0"),
    ],
)
def test_bad_label_expressions_are_one_line_errors_naming_the_token(
    text: str, teachers: tuple[str, ...], message: str
) -> None:
    with pytest.raises(InputError) as error:
        LabelExpression.parse(text, teachers, "data.label")
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_per_query_z_is_the_textbook_standardisation_and_stays_finite_at_any_magnitude() -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(3.0, 7.0, 50), rng.normal(-1e-3, 1e-4, 30), np.full(5, 2.0)])
    qids = ["a"] * 50 + ["b"] * 30 + ["c"] * 5
    textbook = np.empty_like(values)
    for q in ("a", "b"):
        mine = np.asarray(qids) == q
        centred = values[mine] - values[mine].mean()
        textbook[mine] = centred / np.sqrt((centred**2).mean())
    textbook[-5:] = 0.0  # a constant query standardises to 0
    np.testing.assert_allclose(per_query_z(values, qids), textbook, rtol=1e-12, atol=0)
    huge = per_query_z(np.array([-1e200, 0.0, 1e200, 1e300, -1e300]), ["q", "q", "q", "r", "r"])
    assert np.isfinite(huge).all()
    np.testing.assert_allclose(huge, [-np.sqrt(1.5), 0.0, np.sqrt(1.5), 1.0, -1.0], rtol=1e-12)
    # rounding is no ranking: 0.1 + 0.2 and 0.3 differ by one bit, which standardised to [1.41, -0.71, -0.71]
    assert per_query_z(np.array([0.1 + 0.2, 0.3, 0.3]), ["q"] * 3).tolist() == [0.0, 0.0, 0.0]
    tiny = per_query_z(np.array([1e-300, 2e-300, 3e-300]), ["q"] * 3)  # a real spread at any scale is one
    np.testing.assert_allclose(tiny, [-np.sqrt(1.5), 0.0, np.sqrt(1.5)], rtol=1e-12)
    with pytest.raises(ValueError, match="1 of 5 values are not finite"):  # a NaN zeroed its whole query
        per_query_z(np.array([1.0, np.nan, 3.0, 1.0, 2.0]), ["a"] * 3 + ["b"] * 2)


def test_named_teachers_are_joined_on_qid_and_docid(teachers: dict[str, list[str]]) -> None:
    label = "z(gemma.cis) + z(smollm2.upr) - 0.25*z(first_stage)"
    joined = load_label_table(teachers, label)
    table = joined.table
    assert len(table) == 36 and joined.teachers == teachers
    gemma, smollm2 = by_pair(teachers["gemma"], "cis"), by_pair(teachers["smollm2"], "upr")
    pairs = list(zip(table.qid, table.docid, strict=True))
    # gemma's rows come in another order: each pair gets its own scores, not those of the same row number
    assert table["gemma.cis"].tolist() == [gemma[p] for p in pairs]
    assert table["smollm2.upr"].tolist() == [smollm2[p] for p in pairs]
    qids = table.qid.tolist()
    expected = (
        per_query_z(np.array([gemma[p] for p in pairs]), qids)
        + per_query_z(np.array([smollm2[p] for p in pairs]), qids)
        - 0.25 * per_query_z(table.first_stage_score.to_numpy(), qids)
    )
    np.testing.assert_allclose(table.label, expected, rtol=1e-12)
    assert list(joined.members) == ["gemma.cis", "smollm2.upr", "first_stage"]
    np.testing.assert_array_equal(joined.members["smollm2.upr"], table["smollm2.upr"])
    # a teacher the label does not use is not read (nor joined)
    alone = load_label_table(teachers, "gemma.upr")
    assert alone.teachers == {"gemma": teachers["gemma"]} and not alone.members
    assert alone.table.label.tolist() == [
        by_pair(teachers["gemma"], "upr")[p] for p in zip(alone.table.qid, alone.table.docid, strict=True)
    ]


def test_single_teacher_labels_are_unchanged(teacher_dataset: Path) -> None:
    """A list of folders, and a sole named teacher, give exactly the labels the score or hybrid defines."""
    rows = TeacherDataset.open(teacher_dataset).to_pandas()
    qids = rows.qid.tolist()
    labelled = load_label_table([str(teacher_dataset)], "cis")
    raw = labelled.table
    np.testing.assert_array_equal(raw.label, rows.cis.to_numpy(dtype=np.float64))
    # ids and scores only: the texts stay in the dataset, found through (source, source_row)
    assert list(raw.columns) == [
        "qid",
        "docid",
        "first_stage_rank",
        "first_stage_score",
        "cis",
        "candidates",
        "source",
        "source_row",
        "query",
        "label",
    ]
    assert labelled.sources == [str(teacher_dataset)]
    assert raw.source.tolist() == [0] * len(rows) and raw.source_row.tolist() == list(range(len(rows)))
    hybrid = load_label_table([str(teacher_dataset)], "upr+0.5*first_stage").table
    expected = per_query_z(rows.upr.to_numpy(), qids) + 0.5 * per_query_z(rows.first_stage_score.to_numpy(), qids)
    np.testing.assert_array_equal(hybrid.label, expected)
    named = load_label_table({"tiny": [str(teacher_dataset)]}, "upr+0.5*first_stage")
    np.testing.assert_array_equal(named.table.label, expected)


def test_teachers_of_different_pairs_are_a_one_line_error(teachers: dict[str, list[str]], tmp_path: Path) -> None:
    table = TeacherDataset.open(teachers["gemma"][0]).to_pandas()
    missing = table.iloc[[3, 7]]
    short = write_teacher(table.drop(index=[3, 7]), tmp_path / "gemma-short", "package:gemma")
    with pytest.raises(InputError) as error:
        load_label_table({"smollm2": teachers["smollm2"], "gemma": [str(short)]}, "z(gemma.cis) + z(smollm2.cis)")
    message = str(error.value)
    assert "\n" not in message and message.startswith(
        f"data.teacher_data: teachers smollm2 ({', '.join(teachers['smollm2'])}) and gemma ({short}) do not hold "
        "the same pairs: 2 pair(s) of smollm2 are not in gemma ("
    )
    for qid, docid in zip(missing.qid, missing.docid, strict=True):
        assert f"({qid}, {docid})" in message
    sources = by_pair(teachers["smollm2"][:1], "cis")
    in_first = sum((q, d) in sources for q, d in zip(missing.qid, missing.docid, strict=True))
    counted = [f"{n} from {f}" for n, f in zip((in_first, 2 - in_first), teachers["smollm2"], strict=True) if n]
    assert ", ".join(counted) in message  # the folders the missing pairs come from, counted


def test_a_folder_that_repeats_a_pair_is_one_line(teacher_dataset: Path, tmp_path: Path) -> None:
    """A named teacher's repeated rows ended in pandas' MergeError; one unnamed folder's trained on both."""
    table = TeacherDataset.open(teacher_dataset).to_pandas()
    repeated = write_teacher(pd.concat([table, table.iloc[[4]]]), tmp_path / "repeated", "package:smollm2")
    first = table.iloc[4]
    for teachers, label in (({"a": [str(teacher_dataset)], "b": [str(repeated)]}, "z(a.cis) + z(b.cis)"),
                            ([str(repeated)], "cis")):  # fmt: skip
        with pytest.raises(InputError, match=re.escape(
            f"{repeated}: 1 rows repeat an earlier row's (qid, docid), first row {len(table)} ({first.qid}, "
            f"{first.docid}): a teacher dataset holds each pair once"
        )):  # fmt: skip
            load_label_table(teachers, label)


def test_folders_of_one_name_that_score_a_pair_otherwise_are_named_in_a_warning(
    teacher_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first folder's scores are kept, as before, but no longer silently: folders of another teacher under
    one name flipped the student's labels by their order."""
    table = TeacherDataset.open(teacher_dataset).to_pandas()
    # folders of one input's candidates (a pair of two inputs' lists is a row of each, not a repeat)
    first = write_teacher(table, tmp_path / "first", "package:smollm2")
    same = write_teacher(table, tmp_path / "same", "package:smollm2")
    other = write_teacher(table.assign(cis=-table.cis), tmp_path / "negated", "package:smollm2")
    with caplog.at_level("WARNING", logger="distill.data.label_table"):
        load_label_table([str(first), str(same)], "cis")
    assert not caplog.messages  # the same scores twice (a --reuse): nothing to say
    with caplog.at_level("WARNING", logger="distill.data.label_table"):
        kept = load_label_table([str(first), str(other)], "cis").table
    assert len(caplog.messages) == 1 and caplog.messages[0].startswith(
        f"{(table.cis != 0).sum()} pairs held by several of {first}, {other} have other scores there"
    )
    assert sorted(kept.cis) == sorted(table.cis)  # the first folder's


def test_a_judgment_term_weighs_the_qrels_grades_of_the_judged_queries(teacher_dataset: Path) -> None:
    """``z(judgment)`` is the pair's grade in the qrels (0 where they do not judge it); a query they do not judge at
    all keeps the label of its other terms."""
    rows = TeacherDataset.open(teacher_dataset).to_pandas()
    judged_query, other = rows.qid.unique()[:2]
    docids = rows.docid[rows.qid == judged_query].tolist()
    qrels = {judged_query: {docids[0]: 3, docids[1]: 1, docids[2]: 0, "not-a-candidate": 2}}
    labelled = load_label_table([str(teacher_dataset)], "z(cis) + 2*z(judgment)", qrels=qrels)
    table = labelled.table
    grades = {(judged_query, d): g for d, g in qrels[judged_query].items()}
    expected_grades = [grades.get(pair, 0) for pair in zip(table.qid, table.docid, strict=True)]
    assert table[JUDGMENT].tolist() == expected_grades and sum(expected_grades) == 4
    qids = table.qid.tolist()
    expected = per_query_z(table.cis.to_numpy(), qids) + 2 * per_query_z(np.array(expected_grades, float), qids)
    np.testing.assert_allclose(table.label, expected, rtol=1e-12)
    unjudged = (table.qid == other).to_numpy()
    np.testing.assert_allclose(table.label[unjudged], per_query_z(table.cis.to_numpy(), qids)[unjudged], rtol=1e-12)
    top = table[table.qid == judged_query].sort_values("label").docid.iloc[-1]
    assert top == docids[0]  # the grade moved the judged query's ranking: its grade-3 pair is now first
    assert list(labelled.members) == ["cis", JUDGMENT]


@pytest.mark.parametrize(
    ("qrels", "message"),
    [
        (None, "data.label: z(judgment) needs the relevance judgments of data.qrels"),
        ({"q": {}}, "data.label: z(judgment) needs the relevance judgments of data.qrels"),
        ({"another-query": {"d": 1}}, "data.label: z(judgment): data.qrels judge none of the teacher data's pairs"),
    ],
)
def test_a_judgment_term_without_judgments_of_the_pairs_is_one_line(
    teacher_dataset: Path, qrels: dict | None, message: str
) -> None:
    with pytest.raises(InputError) as error:
        load_label_table([str(teacher_dataset)], "z(cis) + z(judgment)", qrels=qrels)
    assert str(error.value) == message


def test_bad_teacher_names_are_named(teacher_dataset: Path) -> None:
    with pytest.raises(InputError, match=re.escape("data.teacher_data: 'gemma-3' cannot name a teacher")):
        load_label_table({"gemma-3": [str(teacher_dataset)]}, "cis")
    with pytest.raises(InputError, match=re.escape("data.teacher_data: 'judgment' cannot name a teacher")):
        load_label_table({"judgment": [str(teacher_dataset)]}, "cis")
    with pytest.raises(InputError, match=re.escape("data.teacher_data: gemma: no teacher dataset given")):
        load_label_table({"gemma": []}, "cis")


def test_eval_reports_agreement_with_the_label_and_each_term(
    teachers: dict[str, list[str]], teacher_dataset: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "eval.json"
    spec = json.dumps(teachers)
    label = "z(gemma.cis) + z(smollm2.upr)"
    args = ["eval", "--qrels", str(DL19_QRELS), "--run", str(teacher_dataset), "--teacher", spec]
    assert main([*args, "--label", label, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (
        f"agreement with the teacher's {label}" in printed
        and f"agreement with smollm2.upr, a term of {label}" in printed
    )
    fidelity = json.loads(out.read_text())["fidelity"]
    assert fidelity["label"] == label and set(fidelity["members"]) == {"gemma.cis", "smollm2.upr"}
    # the fixture's upr run is smollm2's upr: it agrees with that term exactly, and less with the sum
    upr = fidelity["members"]["smollm2.upr"]["results"]["triplets/upr"]
    assert upr == pytest.approx({"kendall_tau": 1.0, "spearman": 1.0, "nDCG@10_teacher": 100.0})
    assert fidelity["results"]["triplets/upr"]["spearman"] < 0.99
    assert set(fidelity["members"]["gemma.cis"]["per_query"]["triplets/cis"]["spearman"]) == {
        "264014",
        "104861",
        "130510",
    }
    assert main([*args]) == 2  # several teachers and no label
    assert "error: label: required with several teachers (gemma, smollm2)" in capsys.readouterr().err


def test_a_student_of_named_teachers_validates_against_each_term_and_records_its_teachers(
    teachers: dict[str, list[str]], teacher_dataset: Path, tiny_bert: Path, tmp_path: Path
) -> None:
    from transformers import AutoConfig

    from distill.core.student_card import StudentCard
    from tests.distill.stages.test_train import metrics, write_config

    config = write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=1)  # a list of folders, overridden:
    label = "z(gemma.cis) + z(smollm2.upr) + 0.25*z(first_stage)"
    args = ["train", "--config", str(config), "--data.teacher_data", json.dumps(teachers), "--data.label", label]
    assert main(args) == 0
    run = tmp_path / "runs" / "tiny"
    validation = [row for row in metrics(run) if row.get("val/fidelity_spearman")]
    for member in ("gemma.cis", "smollm2.upr", "first_stage"):
        for metric in ("kendall_tau", "spearman", "nDCG@10_teacher"):
            assert all(row[f"val/fidelity_{metric}/{member}"] for row in validation), (member, metric)
    card = StudentCard.read(run / "hf")
    assert card.label == label and card.teacher_data == [*teachers["gemma"], *teachers["smollm2"]]
    assert card.teachers == {
        "gemma": [{"path": teachers["gemma"][0], "teacher": "package:gemma"}],
        "smollm2": [{"path": path, "teacher": "package:smollm2"} for path in teachers["smollm2"]],
    }
    assert AutoConfig.from_pretrained(run / "hf").cis_distill["teachers"] == card.teachers


def test_cards_written_before_named_teachers_still_load(tmp_path: Path) -> None:
    from distill.core.student_card import CONFIG_KEY, StudentCard

    old = {  # the card of a student trained before teachers had names (no "teachers" key)
        "backbone": "all-minilm-l6-v2",
        "label": "cis_q+0.25*first_stage",
        "loss": "listwise_kl",
        "teacher_data": ["data/teacher/dl21-bm25-smollm2"],
        "target_scaling": {"kind": "none", "mean": 0.0, "std": 1.0},
        "max_length": 256,
        "val_queries": ["1", "2"],
        "monitor": "val/nDCG@10",
        "best_score": 48.3,
        "checkpoint": "checkpoints/best.ckpt",
        "interpolation": 0.95,
        "interpolate": False,
        "extra": {},
    }
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", CONFIG_KEY: old}))
    card = StudentCard.read(tmp_path)
    assert card.teachers == {} and card.label == old["label"] and card.teacher_data == old["teacher_data"]
