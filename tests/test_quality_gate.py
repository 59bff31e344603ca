"""The export's quality gate: every lower precision's ranking against PyTorch fp32 on the student's held-out
validation pairs (never DL19), recorded in card.json for the serving side."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from distill.backend import quality_gate
from distill.backend.parity import NDCG_BOUND, Pair, ParitySet
from distill.backend.quality_gate import (
    GATE_BACKENDS,
    NO_BF16,
    NO_OPENVINO,
    BackendQuality,
    gate_candidates,
    measure_quality_gate,
    validation_set,
)
from distill.core.loaders import load_candidates, load_qrels
from distill.core.schema import InputError, MissingFileError

from .conftest import DL19, REPO

DL21 = REPO / "data" / "trec-dl21"
DL21_TEACHER = "data/teacher/dl21-bm25-smollm2"


def with_card(student: Path, tmp_path: Path, **changes) -> Path:
    """A copy of the student folder whose card has ``changes``."""
    folder = tmp_path / "student"
    shutil.copytree(student, folder)
    config = json.loads((folder / "config.json").read_text())
    config["cis_distill"].update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def dl21_judged() -> list[str]:
    data = load_candidates(DL21 / "bm25_top100.json", qrels=DL21 / "qrels.txt")
    return [c.query.qid for c in data.candidates if c.query.qid in data.qrels]


def test_the_validation_set_is_the_cards_held_out_queries_with_every_candidate(student: Path, tmp_path: Path) -> None:
    """The card's validation queries, found in its teacher data's input (data/trec-dl21, judged by the qrels.txt
    beside it); a query the qrels do not judge is left out."""
    first, second = dl21_judged()[:2]
    folder = with_card(student, tmp_path, teacher_data=[DL21_TEACHER], val_queries=[first, second, "no-such-query"])
    ranking = validation_set(folder)
    assert ranking.pairs == [] and {p.qid for p in ranking.ranking} == {first, second} == set(ranking.qrels)
    data = load_candidates(DL21 / "bm25_top100.json")
    expected = [(c.query.qid, p.docid) for c in data.candidates if c.query.qid in (first, second) for p in c.passages]
    assert [(p.qid, p.docid) for p in ranking.ranking] == expected and len(expected) == 200
    assert ranking.ranking_source == (
        "2 of the student card's 3 validation queries, judged in data/trec-dl21/bm25_top100.json; "
        "200 pairs, every candidate"
    )


def test_the_cards_qrels_judge_its_validation_queries(student: Path, tmp_path: Path) -> None:
    """The qrels of the training (the card's ``qrels``) come before the qrels.txt beside the input."""
    first, second = dl21_judged()[:2]
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("".join(line for line in (DL21 / "qrels.txt").open() if line.split()[0] == second))
    folder = with_card(student, tmp_path, teacher_data=[DL21_TEACHER], val_queries=[first, second], qrels=str(qrels))
    ranking = validation_set(folder)
    assert set(ranking.qrels) == {second} and ranking.qrels == load_qrels(qrels)


def test_a_student_without_a_card_is_gated_on_dl21_never_dl19(tiny_bert: Path) -> None:
    ranking = validation_set(tiny_bert)
    assert {p.qid for p in ranking.ranking} == set(dl21_judged()) and len(dl21_judged()) == 53
    dl19 = {c.query.qid for c in load_candidates(DL19).candidates}
    assert not dl19 & {p.qid for p in ranking.ranking}
    assert ranking.ranking_source.startswith("53 judged TREC DL21 queries (data/trec-dl21, the student has no card)")


def test_validation_sets_that_cannot_be_built_are_one_line_errors(student: Path, tmp_path: Path) -> None:
    folder = with_card(student, tmp_path, teacher_data=[DL21_TEACHER], val_queries=["no-such-query"])
    with pytest.raises(InputError, match=r"none of the student card's 1 validation queries is judged in its teacher "):
        validation_set(folder)
    missing = with_card(student, tmp_path / "b", teacher_data=["data/teacher/nowhere"])
    with pytest.raises(MissingFileError, match=r"teacher data data/teacher/nowhere is not here: give export's"):
        validation_set(missing)
    with pytest.raises(MissingFileError, match=r"nowhere\.json: no such candidates file"):
        validation_set(folder, str(tmp_path / "nowhere.json"))


def test_the_gate_is_recorded_in_card_json_as_the_serving_side_reads_it(exported: Path, parity: ParitySet) -> None:
    """Every backend the export can run here: the int8 graph for its own runtime (static int8: onnxruntime), the
    fp32 ones (within the bound, as the parity check holds them to 1e-4), bf16 where the CPU has it."""
    gate = json.loads((exported / "card.json").read_text())["quality_gate"]
    assert set(gate) == {"pairs", "bound", "reference", "backends"} and gate["bound"] == NDCG_BOUND
    queries = {p.qid for p in parity.ranking}
    assert gate["pairs"].startswith(f"{len(queries)} judged queries of ")
    assert gate["reference"]["backend"] == "torch-fp32"
    names = {"onnx-int8", "onnx-fp32", "torchscript"}
    if importlib.util.find_spec("openvino"):
        names |= {"openvino-fp32", "openvino-bf16"}
    assert set(gate["backends"]) == names and names <= set(GATE_BACKENDS)
    for name in ("onnx-fp32", "torchscript", "onnx-int8"):
        record = gate["backends"][name]
        assert set(record) == {"ndcg10", "delta", "spearman", "passed"} and record["passed"] is True
        assert record["ndcg10"] == pytest.approx(gate["reference"]["ndcg10"] + record["delta"], abs=1e-3)
    assert gate["backends"]["onnx-fp32"]["spearman"] > 0.999 and abs(gate["backends"]["onnx-fp32"]["delta"]) < 1e-6
    assert gate["backends"]["onnx-int8"]["spearman"] > 0.9


def test_what_this_machine_cannot_run_is_recorded_as_not_checked(
    exported: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("openvino")
    monkeypatch.setattr(quality_gate, "cpu_has_bf16", lambda: False)
    assert gate_candidates(exported, "onnxruntime") == {
        "onnx-int8": None,
        "openvino-bf16": NO_BF16,
        "openvino-fp32": None,
        "onnx-fp32": None,
        "torchscript": None,
    }
    assert gate_candidates(exported, "openvino")["openvino-int8"] is None  # a graph made for OpenVINO
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    reasons = gate_candidates(exported, "onnxruntime")
    assert reasons["openvino-fp32"] == reasons["openvino-bf16"] == NO_OPENVINO and reasons["onnx-fp32"] is None
    assert BackendQuality(not_checked=NO_BF16).to_dict() == {"passed": False, "not_checked": NO_BF16}


def test_a_backend_outside_the_bound_is_recorded_as_failed(exported: Path, parity: ParitySet, tmp_path: Path) -> None:
    """An fp32 graph whose classifier is negated ranks every query in reverse: the gate records passed=false."""
    from .test_export import edit_initializer

    folder = tmp_path / "export"
    shutil.copytree(exported, folder, ignore=shutil.ignore_patterns("model.torchscript.pt", "model.int8.onnx"))
    edit_initializer(folder / "model.onnx", "classifier.weight", lambda weight: -weight)
    gate = measure_quality_gate(folder, parity)
    failed = gate.backends["onnx-fp32"]
    assert not failed.passed and failed.delta < -NDCG_BOUND and failed.spearman < 0
    assert failed.to_dict() == {
        "ndcg10": round(failed.ndcg10, 4),
        "delta": round(failed.delta, 4),
        "spearman": round(failed.spearman, 5),
        "passed": False,
    }
    assert measure_quality_gate(folder, ParitySet([Pair("1", "d", "q", "p")])) is None  # nothing judged to rank
