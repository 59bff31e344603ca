"""The export's quality gate: every lower precision's ranking against PyTorch fp32 on the student's held-out
validation pairs (never DL19), recorded in card.json for the serving side."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from distill.core.schema import InputError, MissingFileError
from distill.data.loaders import load_candidates, load_qrels
from distill.export import quality_gate
from distill.export.parity_set import NDCG_BOUND, Pair, ParitySet
from distill.export.quality_gate import (
    GATE_BACKENDS,
    NO_BF16,
    NO_OPENVINO,
    PASSING,
    RULE,
    VERDICTS,
    BackendQuality,
    GateRule,
    QualityGate,
    delta_interval,
    gate_candidates,
    judge,
    measure_quality_gate,
    validation_set,
)
from tests.conftest import DL19, REPO

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


def test_a_teacher_input_read_with_queries_and_a_corpus_is_read_with_them_again(student: Path, tmp_path: Path) -> None:
    """A TREC run needs its queries and corpus: teacher.json keeps the ones the teacher read it with, and the gate
    reads the run with them (as `distill export` does after teach, train on a TREC run of one's own)."""
    first, second = dl21_judged()[:2]
    lists = [c for c in load_candidates(DL21 / "bm25_top100.json").candidates if c.query.qid in (first, second)]
    own = tmp_path / "own"
    own.mkdir()
    run = own / "bm25.trec"
    run.write_text("".join(f"{c.query.qid} Q0 {p.docid} {r} {s} bm25\n" for c in lists
                           for r, (p, s) in enumerate(zip(c.passages, c.scores, strict=True), 1)))  # fmt: skip
    (own / "queries.tsv").write_text("".join(f"{c.query.qid}\t{c.query.text}\n" for c in lists))
    (own / "corpus.tsv").write_text("".join(f"{p.docid}\t{p.text}\n" for c in lists for p in c.passages))
    shutil.copy(DL21 / "qrels.txt", own / "qrels.txt")
    teacher = Path(shutil.copytree(REPO / DL21_TEACHER, tmp_path / "teacher"))
    metadata = json.loads((teacher / "teacher.json").read_text())
    (teacher / "teacher.json").write_text(json.dumps({**metadata, "input": [str(run)]}))
    folder = with_card(student, tmp_path, teacher_data=[str(teacher)], val_queries=[first, second])
    with pytest.raises(InputError, match="a TREC run file needs --queries and --corpus"):
        validation_set(folder)  # a teacher.json without them (as written before they were kept)
    with_texts = {
        **metadata,
        "input": [str(run)],
        "queries": str(own / "queries.tsv"),
        "corpus": str(own / "corpus.tsv"),
    }
    (teacher / "teacher.json").write_text(json.dumps(with_texts))
    ranking = validation_set(folder)
    assert [(p.qid, p.docid, p.passage) for p in ranking.ranking] == [
        (c.query.qid, p.docid, p.text) for c in lists for p in c.passages
    ]


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
    dl21 = "data/trec-dl21/bm25_top100.json"  # qrels of another year: given, and judging none of its queries
    with pytest.raises(InputError, match=r"^validation_qrels data/trec-dl19/qrels.txt judge none of the 53 queries"):
        validation_set(folder, dl21, "data/trec-dl19/qrels.txt")


def test_a_gate_on_the_test_year_is_named_in_a_warning(student: Path, tmp_path: Path, caplog) -> None:
    folder = with_card(student, tmp_path, teacher_data=[DL21_TEACHER])
    with caplog.at_level("WARNING", logger="distill.export.quality_gate"):
        validation_set(folder, "data/trec-dl19/bm25_top100.json", "data/trec-dl19/qrels.txt")
    assert any("TREC DL19, this project's test year" in message for message in caplog.messages)


def test_a_gate_of_queries_with_one_candidate_each_passes_no_backend() -> None:
    """One pair a query: the interval is [0, 0] and no ordering is compared (Spearman NaN): every backend passed,
    and card.json held a bare NaN that strict JSON readers refuse."""
    reference = {f"q{i}": {"d0": float(i)} for i in range(5)}
    flipped = {qid: {"d0": -docs["d0"]} for qid, docs in reference.items()}
    quality = judge(reference, flipped, {q: {"d0": 1} for q in reference})
    assert quality.verdict == "unordered" and not quality.passed
    record = json.dumps(quality.to_dict(), allow_nan=False)  # strict JSON
    assert json.loads(record)["spearman"] is None


def test_the_gate_is_recorded_in_card_json_as_the_serving_side_reads_it(exported: Path, parity: ParitySet) -> None:
    """Every backend the export can run here: the int8 graph for its own runtime (static int8: onnxruntime), the
    fp32 ones (within the bound, as the parity check holds them to 1e-4), bf16 where the CPU has it."""
    gate = json.loads((exported / "card.json").read_text())["quality_gate"]
    assert set(gate) == {"pairs", "reference", "backends", *RULE.to_dict()} and gate["bound"] == NDCG_BOUND
    assert {key: gate[key] for key in RULE.to_dict()} == RULE.to_dict()
    queries = {p.qid for p in parity.ranking}
    assert gate["pairs"].startswith(f"{len(queries)} judged queries of ")
    assert gate["reference"]["backend"] == "torch-fp32"
    names = {"onnx-int8", "onnx-fp32", "torchscript"}
    if importlib.util.find_spec("openvino"):
        names |= {"openvino-fp32", "openvino-bf16"}
    assert set(gate["backends"]) == names and names <= set(GATE_BACKENDS)
    for name in ("onnx-fp32", "torchscript", "onnx-int8"):
        record = gate["backends"][name]
        assert set(record) == {"ndcg10", "delta", "interval", "spearman", "verdict", "passed"}
        assert record["passed"] is True and record["verdict"] in PASSING
        assert record["ndcg10"] == pytest.approx(gate["reference"]["ndcg10"] + record["delta"], abs=1e-3)
        low, high = record["interval"]
        assert low <= record["delta"] <= high
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
    from tests.distill.export.test_exporter import edit_initializer

    folder = tmp_path / "export"
    shutil.copytree(exported, folder, ignore=shutil.ignore_patterns("model.torchscript.pt", "model.int8.onnx"))
    edit_initializer(folder / "model.onnx", "classifier.weight", lambda weight: -weight)
    gate = measure_quality_gate(folder, parity)
    failed = gate.backends["onnx-fp32"]
    assert not failed.passed and failed.delta < -NDCG_BOUND and failed.spearman < 0
    assert failed.verdict == "beyond" and failed.interval[1] < -NDCG_BOUND  # both queries' nDCG@10 fell
    assert failed.to_dict() == {
        "ndcg10": round(failed.ndcg10, 4),
        "delta": round(failed.delta, 4),
        "interval": [round(failed.interval[0], 4), round(failed.interval[1], 4)],
        "spearman": round(failed.spearman, 5),
        "verdict": "beyond",
        "passed": False,
    }
    assert "onnx-fp32" in gate.format() and "no (beyond)" in gate.format()
    assert measure_quality_gate(folder, ParitySet([Pair("1", "d", "q", "p")])) is None  # nothing judged to rank


# The verdict itself, on constructed runs: 8 queries (as the demo student's validation set) of 100 candidates,
# the reference's scores 100, 99, ..., 1 (d00 first), judged so that the reference ranks well.
QUERIES, CANDIDATES = 8, 100
GRADES = {"d00": 2, "d01": 1, "d02": 2, "d05": 1, "d12": 2}
"""Each query's judged candidates (every other candidate judged 0)."""


def reference_run(queries: int = QUERIES) -> dict[str, dict[str, float]]:
    return {f"q{q}": {f"d{i:02d}": float(CANDIDATES - i) for i in range(CANDIDATES)} for q in range(queries)}


def judged(queries: int = QUERIES, grades: dict[str, int] = GRADES) -> dict[str, dict[str, int]]:
    return {f"q{q}": {f"d{i:02d}": grades.get(f"d{i:02d}", 0) for i in range(CANDIDATES)} for q in range(queries)}


def perturbed(run: dict[str, dict[str, float]], scale: float, seed: int = 0) -> dict[str, dict[str, float]]:
    """``run`` with Gaussian noise of standard deviation ``scale`` on every score."""
    rng = np.random.default_rng(seed)
    return {qid: {d: s + float(rng.normal(scale=scale)) for d, s in docs.items()} for qid, docs in run.items()}


def top10_reversed(run: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """``run`` with each query's top 10 in reverse order (ranks 1-10 swapped end for end)."""
    out = {}
    for qid, docs in run.items():
        top = sorted(docs, key=lambda d: -docs[d])[:10]
        out[qid] = {**docs, **{d: docs[e] for d, e in zip(top, reversed(top), strict=True)}}
    return out


def test_one_near_tie_swapped_at_the_top_of_one_query_passes() -> None:
    """OpenVINO bf16 on the demo student: -1.08 nDCG@10 on 8 queries at a Spearman of 0.99977, one near-tie
    swapped. Here the reference's first two candidates of one query are 1e-4 apart and the backend swaps them
    (and rounds every score a little): the mean nDCG@10 moves by about -1 point, beyond the bound, but the interval
    says 8 queries cannot tell that from nothing, and the backend orders the candidates as the reference does."""
    reference = reference_run()
    reference["q0"]["d01"] = reference["q0"]["d00"] - 1e-4
    backend = perturbed(reference, 1e-5)
    backend["q0"]["d00"], backend["q0"]["d01"] = reference["q0"]["d01"], reference["q0"]["d00"]
    quality = judge(reference, backend, judged())
    assert -1.2 < quality.delta < -0.8 and abs(quality.delta) > NDCG_BOUND  # the old gate (|Δ| <= 0.5) rejected it
    low, high = quality.interval
    assert low < -NDCG_BOUND and high == pytest.approx(0.0, abs=1e-9)  # 7 of the 8 queries did not move
    assert quality.spearman > 0.99999 and quality.verdict == "same_order" and quality.passed
    assert quality.to_dict()["passed"] is True and quality.to_dict()["verdict"] == "same_order"


def test_a_backend_that_reorders_candidates_is_rejected() -> None:
    """Noise that drops each query's Spearman to about 0.8 moves nDCG@10 beyond the bound on every query."""
    reference = reference_run()
    backend = perturbed(reference, 22.0)
    quality = judge(reference, backend, judged())
    assert 0.7 < quality.spearman < 0.85
    assert quality.interval[1] < -NDCG_BOUND and quality.verdict == "beyond" and not quality.passed


def test_reversing_every_querys_top_10_is_rejected_even_where_the_qrels_barely_see_it() -> None:
    """Ranks 1-10 swapped end for end on every query: beyond the bound where the qrels judge every query's top; and
    where only one query has a relevant candidate (the interval straddles the bound), by its rank agreement:
    reversing a top 10 of 100 leaves a Spearman of 0.998, below the floor."""
    reference = reference_run()
    backend = top10_reversed(reference)
    everywhere = judge(reference, backend, judged())
    assert everywhere.verdict == "beyond" and not everywhere.passed
    sparse = {**judged(), **{qid: dict.fromkeys(grades, 0) for qid, grades in judged().items() if qid != "q0"}}
    barely = judge(reference, backend, sparse)
    assert barely.interval[0] < -NDCG_BOUND <= barely.interval[1] and barely.delta < -NDCG_BOUND
    assert barely.spearman == pytest.approx(1 - 6 * 330 / (CANDIDATES * (CANDIDATES**2 - 1)))  # Σd² = 330
    assert barely.spearman < RULE.spearman_floor and barely.verdict == "reordered" and not barely.passed


def test_an_interval_within_the_bound_passes_and_identical_scores_are_within() -> None:
    """Enough queries make the interval tight: near-ties swapped at the top of 2 of 200 queries leave it within
    the bound, whatever the floor; identical scores give the interval [0, 0]."""
    reference = reference_run(200)
    qrels = judged(200)
    same = judge(reference, reference, qrels)
    assert same.interval == (0.0, 0.0) and same.delta == 0.0 and same.verdict == "within" and same.passed
    backend = {qid: dict(docs) for qid, docs in reference.items()}
    for qid in ("q0", "q1"):
        backend[qid]["d00"], backend[qid]["d01"] = reference[qid]["d01"], reference[qid]["d00"]
    strict = GateRule(spearman_floor=1.0)  # no Spearman below 1 would pass the straddling case
    quality = judge(reference, backend, qrels, strict)
    assert -NDCG_BOUND <= quality.interval[0] < quality.delta < 0 and quality.verdict == "within" and quality.passed


def test_the_interval_is_a_seeded_paired_bootstrap() -> None:
    """One query of 8 moved by -8 points: the mean's resamples are -k points for k ~ Binomial(8, 1/8) draws of it,
    so the 95% interval is [-3, 0] (P(k >= 3) = 6.7%, P(k >= 4) = 1.1%); the same seed gives the same interval."""
    deltas = np.array([-8.0] + [0.0] * 7)
    assert delta_interval(deltas) == (-3.0, 0.0) == delta_interval(deltas)
    assert delta_interval(np.array([-1.0] * 8)) == (-1.0, -1.0)
    low, high = delta_interval(np.random.default_rng(1).normal(size=10_000), GateRule(resamples=2_000))
    assert low < 0 < high and high - low == pytest.approx(2 * 1.96 / 100, rel=0.1)  # the mean's 95% interval


def test_the_gates_table_says_what_decided() -> None:
    reference = reference_run()
    gate = QualityGate("8 constructed queries", QUERIES, 50.0)
    gate.backends["openvino-bf16"] = judge(reference, reference, judged())
    gate.backends["openvino-int8"] = judge(reference, top10_reversed(reference), judged())
    gate.backends["onnx-int8"] = BackendQuality(not_checked="no int8 graph")
    table = gate.format()
    assert "fails when the 95% interval of its ΔnDCG@10 (paired bootstrap over the queries) lies beyond ±0.5" in table
    assert "or straddles it at a Spearman below 0.999" in table
    assert "[+0.00, +0.00]" in table and "yes (within)" in table and "no (beyond)" in table
    assert "no (not checked: no int8 graph)" in table
    assert set(VERDICTS) == {"within", "beyond", "same_order", "reordered", "unordered"}
    assert {"within", "same_order"} == PASSING
