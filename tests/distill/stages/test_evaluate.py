"""Evaluation: trec_eval's conventions (checked against the published BM25 figure), per-query values by hand,
significance tests, multi-hop recall and precision, and ``distill eval`` end to end."""

from __future__ import annotations

import json
import math
import re
import shutil
import warnings
from pathlib import Path

import ir_measures
import numpy as np
import pytest

from distill.cli import main
from distill.data.loaders import load_candidates, load_qrels
from distill.eval.metrics import (
    DEFAULT_METRICS,
    MULTIHOP_METRICS,
    default_rel_level,
    evaluate,
    evaluate_per_query,
    means,
    parse_metrics,
)
from distill.eval.significance import TESTS, compare, randomization_test
from distill.eval.trec_runs import find_run_files, read_trec_run, write_trec_run
from tests.conftest import DL19, DL19_QRELS, REPO

TEACHER = REPO / "data" / "teacher" / "dl19-bm25-smollm2"
HOTPOT = REPO / "data" / "hotpotqa" / "hotpotqa_train100.json"


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
    assert lines[0] == "q1 Q0 b 1 3.0 t" and lines[1] == "q1 Q0 a 2 1.5 t"
    assert read_trec_run(tmp_path / "r.trec") == run
    assert load_qrels(DL19_QRELS)["19335"]["1017759"] == 0


def test_scores_closer_than_a_millionth_keep_their_order_when_read_back(tmp_path) -> None:
    """Calibrated probabilities near 1 differ past the sixth decimal: rounded, they would tie, and a reader (trec_eval
    breaks ties by docid) would rank the file otherwise than it was written."""
    run = {"q1": {"a": 0.99999971, "b": 0.99999993, "c": 0.9999998}}
    write_trec_run(tmp_path / "r.trec", run, tag="t")
    assert read_trec_run(tmp_path / "r.trec") == run
    qrels = {"q1": {"b": 1}}
    assert evaluate(read_trec_run(tmp_path / "r.trec"), qrels, ["RR@10"])["RR@10"] == pytest.approx(100.0)


def test_per_query_values_by_hand() -> None:
    """trec_eval's nDCG (linear gains, log2(rank + 1) discount), RR and R, query by query."""
    qrels = {"q1": {"a": 2, "b": 1, "c": 0}, "q2": {"d": 1}}
    run = {"q1": {"c": 3.0, "a": 2.0, "b": 1.0}, "q2": {"x": 2.0, "d": 1.0}, "q3": {"a": 1.0}}
    values = evaluate_per_query(run, qrels, ["nDCG@1", "nDCG@10", "RR@10", "R@100"], rel_level=2)
    assert list(values) == ["nDCG@1", "nDCG@10", "RR(rel=2)@10", "R(rel=2)@100"]  # the relevance level is named
    ndcg_q1 = (2 / math.log2(3) + 1 / math.log2(4)) / (2 + 1 / math.log2(3))
    expected = {
        "nDCG@1": {"q1": 0.0, "q2": 0.0},  # q3 is not judged: left out
        "nDCG@10": {"q1": 100 * ndcg_q1, "q2": 100 / math.log2(3)},
        "RR(rel=2)@10": {"q1": 50.0, "q2": 0.0},  # q2 has no document of grade >= 2
        "R(rel=2)@100": {"q1": 100.0, "q2": 0.0},
    }
    for metric, by_query in expected.items():
        assert values[metric] == pytest.approx(by_query), metric
    assert evaluate_per_query(run, qrels, ["RR@10"], rel_level=1)["RR@10"] == pytest.approx({"q1": 50.0, "q2": 50.0})
    assert evaluate(run, qrels, ["nDCG@10"])["nDCG@10"] == pytest.approx(50 * ndcg_q1 + 50 / math.log2(3))


def test_every_metric_breaks_ties_by_trec_eval_s_rule_and_takes_any_query_id() -> None:
    """RR@10 (ir-measures' msmarco provider) ranked tied documents by docid ascending, the others (pytrec_eval) by
    docid descending: one table said P@1 100 and RR@10 50. ERR (gdeval) took numeric query ids only."""
    qrels = {"q-a": {"a": 0, "b": 2}, "q-b": {"c": 1}}
    run = {"q-a": {"a": 1.0, "b": 1.0, "x": 0.5}, "q-b": {"c": 2.0, "x": 1.0}}  # b before a, as trec_eval ranks
    values = evaluate_per_query(run, qrels, ["nDCG@1", "P@1", "RR@10", "RR", "R@1"], rel_level=2)
    assert {metric: by_query["q-a"] for metric, by_query in values.items()} == dict.fromkeys(values, 100.0)
    if shutil.which("perl"):  # gdeval's language
        err = evaluate_per_query(run, qrels, ["ERR@10"])["ERR@10"]
        assert err == pytest.approx({"q-a": 100 * 3 / 16, "q-b": 100 / 16})  # grade g first: (2^g - 1) / 2^4
    counted = evaluate_per_query(run, qrels, ["NumRet", "NumRel", "NumRet(rel=1)"])
    assert counted == {
        "NumRet": {"q-a": 3, "q-b": 2},
        "NumRel": {"q-a": 1, "q-b": 1},
        "NumRet(rel=1)": {"q-a": 1, "q-b": 1},
    }


def test_means_of_per_query_values_match_ir_measures_aggregates() -> None:
    data = load_candidates(DL19, qrels=DL19_QRELS)
    assert default_rel_level(data.qrels) == 2 and default_rel_level({"q": {"a": 1, "b": 0}}) == 1
    measures = parse_metrics(DEFAULT_METRICS, rel_level=2)
    assert list(measures) == ["nDCG@1", "nDCG@5", "nDCG@10", "RR(rel=2)@10", "R(rel=2)@100"]
    aggregate = ir_measures.calc_aggregate(measures.values(), data.qrels, data.first_stage_run())
    per_query = evaluate_per_query(data.first_stage_run(), data.qrels, DEFAULT_METRICS, rel_level=2)
    assert {m: len(v) for m, v in per_query.items()} == {m: 43 for m in measures}
    assert means(per_query) == pytest.approx({name: 100 * aggregate[m] for name, m in measures.items()})


def test_unknown_metric_is_named() -> None:
    with pytest.raises(ValueError, match="unknown metric 'nDGC@10'"):
        parse_metrics(["nDCG@10", "nDGC@10"])


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nDCG(rel=0)@10", "metric 'nDCG(rel=0)@10': nDCG takes no rel (it takes cutoff, dcg, gains, judged_only)"),
        ("nDCG@0", "metric 'nDCG@0': the cutoff after @ must be a whole number of at least 1"),  # pytrec_eval aborts
        ("RR@0", "metric 'RR@0': the cutoff after @ must be a whole number of at least 1"),  # scored 0 before
        ("R@1.5", "metric 'R@1.5': the cutoff after @ must be a whole number of at least 1"),
    ],
)
def test_a_measure_is_refused_where_its_parameters_are_not_its_own(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_metrics(["nDCG@10", name])


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("RBP", "metric 'RBP': no installed ir-measures provider computes RBP"),
        ("alpha_nDCG@10", "metric 'alpha_nDCG@10': no installed ir-measures provider computes alpha_nDCG(rel=2)@10"),
        ("SDCG@10", "metric 'SDCG@10': it needs max_rel"),  # an AssertionError traceback before
    ],
)
def test_a_measure_no_provider_computes_is_refused_before_any_run(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_metrics(["nDCG@10", name], rel_level=2)


def test_counts_are_summed_over_the_queries_and_num_rel_keeps_its_own_level(tmp_path, capsys) -> None:
    # NumRel(rel=2), which the relevance level made of NumRel, was computed by no provider (exit 2, naming the run)
    assert list(parse_metrics(["NumRel", "NumRet", "NumQ", "RR@10"], rel_level=2)) == [
        "NumRel",
        "NumRet",
        "NumQ",
        "RR(rel=2)@10",
    ]
    bm25 = str(TEACHER / "runs" / "first_stage.trec")
    out = tmp_path / "counts.json"
    args = ["eval", "--qrels", str(DL19_QRELS), "--run", bm25, "--metrics", "NumRet,NumQ,NumRel,RR(rel=3)@10,R@100"]
    assert main([*args, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    qrels = list(ir_measures.read_trec_qrels(str(DL19_QRELS)))
    counts = [ir_measures.NumRet, ir_measures.NumQ, ir_measures.NumRel]
    expected = ir_measures.calc_aggregate(counts, qrels, list(ir_measures.read_trec_run(bm25)))  # sums, as trec_eval
    means = json.loads(out.read_text())["results"]["dl19-bm25-smollm2/first_stage"]
    assert [means[m] for m in ("NumRet", "NumQ", "NumRel")] == [expected[m] for m in counts]
    assert expected[ir_measures.NumRet] == 4300
    # the level line names the metrics at that level, not one that names its own
    assert "relevance level 2: grade >= 2 is relevant for R(rel=2)@100 (graded metrics use the grades)" in printed


def test_runs_sharing_no_query_have_no_difference_and_write_strict_json(tmp_path, capsys) -> None:
    one, other = tmp_path / "one.trec", tmp_path / "other.trec"
    write_trec_run(one, {"1037798": {"d1": 1.0}}, tag="x")
    write_trec_run(other, {"19335": {"d1": 1.0}}, tag="x")
    out = tmp_path / "eval.json"
    assert main(["eval", "--qrels", str(DL19_QRELS), "--run", str(one), str(other), "--json", str(out)]) == 0
    assert "n/a: no shared query" in capsys.readouterr().out
    record = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert record["significance"]["results"][str(other)]["nDCG@10"]["difference"] is None


def test_skipped_lines_are_counted_by_kind_and_recorded(tmp_path, capsys) -> None:
    bm25 = TEACHER / "runs" / "first_stage.trec"
    twice = tmp_path / "twice.trec"
    twice.write_text(bm25.read_text() + bm25.read_text() + "1037798 Q0 dx 1 not-a-score x\n")
    out = tmp_path / "eval.json"
    args = ["eval", "--qrels", str(DL19_QRELS), "--run", str(twice), "--on_bad_input", "skip", "--json", str(out)]
    assert main(args) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "skipped 4301 bad input line(s): 4300 x duplicate (qid, docid); 1 x a score that is not a number"
    assert json.loads(out.read_text())["skipped"] == {"duplicate (qid, docid)": 4300, "a score that is not a number": 1}


def test_an_input_without_judgements_names_the_qrels_beside_it(capsys) -> None:
    assert main(["eval", "--input", str(DL19)]) == 2  # the shipped lists keep their qrels.txt beside them
    assert f"{DL19}: no relevance judgements; give qrels (--qrels {DL19.parent / 'qrels.txt'}, beside it?)" in (
        capsys.readouterr().err
    )


def test_empty_qrels_and_no_metric_are_named(tmp_path, capsys) -> None:
    bm25 = str(TEACHER / "runs" / "first_stage.trec")
    empty = tmp_path / "qrels.txt"
    empty.write_text("")
    assert main(["eval", "--qrels", str(empty), "--run", bm25]) == 2
    assert f"{empty}: no relevance judgements" in capsys.readouterr().err
    assert main(["eval", "--qrels", str(DL19_QRELS), "--run", bm25, "--metrics", ""]) == 2
    assert "error: metrics: no metric named" in capsys.readouterr().err


def test_significance_identical_reversed_and_by_hand() -> None:
    data = load_candidates(DL19, qrels=DL19_QRELS)
    bm25 = evaluate_per_query(data.first_stage_run(), data.qrels, ["nDCG@10"])["nDCG@10"]
    reverse = {qid: {docid: -s for docid, s in docs.items()} for qid, docs in data.first_stage_run().items()}
    reversed_ = evaluate_per_query(reverse, data.qrels, ["nDCG@10"])["nDCG@10"]
    for test in TESTS:
        same = compare(bm25, dict(bm25), test)
        assert (same.difference, same.p_value, same.queries) == (0.0, 1.0, 43)
        worse = compare(bm25, reversed_, test)
        assert worse.difference < -30 and worse.significant
    assert compare(bm25, reversed_, "t").p_value < 1e-9
    assert compare(bm25, reversed_, "randomization").p_value == pytest.approx(1 / 10_001)  # never beaten
    # Exact two-sided sign-flip p-values: only the all-plus and all-minus assignments reach |sum| = 10 (2 of 16),
    # and for three equal differences 2 of 8.
    assert randomization_test(np.array([1.0, 2, 3, 4]), np.zeros(4)) == pytest.approx(2 / 16, abs=0.01)
    assert randomization_test(np.array([1.0, 1, 1]), np.zeros(3)) == pytest.approx(2 / 8, abs=0.015)
    one_per_chunk = randomization_test(np.array([1.0, 2, 3, 4]), np.zeros(4), chunk_elements=4)
    assert one_per_chunk == pytest.approx(2 / 16, abs=0.01)  # chunking changes the draws, not what they estimate
    assert randomization_test(np.arange(5.0), np.ones(5)) == randomization_test(np.arange(5.0), np.ones(5))  # seeded
    assert math.isnan(compare({"q": 1.0}, {"q": 2.0}).p_value)
    with_nan = {"q1": 51.0, "q2": float("nan"), "q3": 54.0}
    for test in TESTS:  # the randomisation test found NaN data significant at its least p
        undefined = compare({"q1": 50.0, "q2": 60.0, "q3": 55.0}, with_nan, test)
        assert math.isnan(undefined.p_value) and not undefined.significant
    with pytest.raises(ValueError, match="query q: the score of a is nan, not a finite number"):
        evaluate({"q": {"a": float("nan"), "b": 2.0}}, {"q": {"a": 1}}, ["nDCG@10"])  # ranked by dict order
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scipy's "precision loss" warning reached the terminal
        assert compare({"q1": 0.0, "q2": 0.0}, {"q1": 100.0, "q2": 100.0}).p_value == 0.0  # no spread: t is infinite
        assert compare({"q1": 0.0, "q2": 0.0, "q3": 1.0}, {"q1": 100.0, "q2": 100.0, "q3": 101.0 + 1e-13}).p_value > 0


def test_t_test_and_randomisation_test_agree_on_real_runs() -> None:
    data = load_candidates(DL19, qrels=DL19_QRELS)
    metrics = ["nDCG@5", "nDCG@10", "RR@10"]
    bm25 = evaluate_per_query(data.first_stage_run(), data.qrels, metrics, rel_level=2)
    for name in ("upr", "cis"):
        run = evaluate_per_query(read_trec_run(TEACHER / "runs" / f"{name}.trec"), data.qrels, metrics, rel_level=2)
        for m in bm25:
            t, r = compare(bm25[m], run[m], "t"), compare(bm25[m], run[m], "randomization")
            assert t.difference == r.difference == pytest.approx(means(run)[m] - means(bm25)[m])
            assert abs(t.p_value - r.p_value) < 0.02 and t.significant == r.significant == (name == "cis"), (name, m)


def test_cli_eval_with_significance_json_and_per_query(tmp_path, capsys) -> None:
    out = tmp_path / "eval.json"
    bm25 = TEACHER / "runs" / "first_stage.trec"  # the folder's first run already: evaluated once
    args = ["eval", "--qrels", str(DL19_QRELS), "--run", str(TEACHER), str(bm25), "--json", str(out), "--per-query"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "relevance level 2: grade >= 2 is relevant for RR(rel=2)@10, R(rel=2)@100" in printed
    rows = [line.split() for line in printed.splitlines() if line.startswith("dl19-bm25-smollm2/")]
    names = [f"dl19-bm25-smollm2/{n}" for n in ("first_stage", "cis", "cond", "noprompt", "upr")]
    assert [r[0] for r in rows] == names + names[1:]  # the means, then the differences to the first
    # the same figures from ir_measures and scipy directly: the means, a paired t-test's p and its star
    from scipy.stats import ttest_rel

    qrels = list(ir_measures.read_trec_qrels(str(DL19_QRELS)))
    ndcg = [ir_measures.nDCG @ 1, ir_measures.nDCG @ 5, ir_measures.nDCG @ 10]

    def per_query(name: str) -> dict[str, float]:  # nDCG@10 of each query
        run = list(ir_measures.read_trec_run(str(TEACHER / "runs" / f"{name}.trec")))
        return {m.query_id: m.value for m in ir_measures.iter_calc([ndcg[2]], qrels, run)}

    first = ir_measures.calc_aggregate(ndcg, qrels, list(ir_measures.read_trec_run(str(bm25))))
    assert rows[0][:5] == [names[0], "43", *(f"{100 * first[m]:.2f}" for m in ndcg)]
    base = per_query("first_stage")
    for row, name in zip(rows[1:5], names[1:], strict=True):
        scores = per_query(name.split("/")[1])
        p = ttest_rel([scores[q] for q in base], [base[q] for q in base]).pvalue
        star = "*" if p < 0.05 else ""
        mean, difference = np.mean(list(scores.values())), rows[4 + names.index(name)][5:7]
        assert row[4] == f"{100 * mean:.2f}{star}", (name, p)
        p_text = "p<0.001" if p < 0.001 else f"p={p:.3f}"
        assert difference == [f"{100 * (mean - np.mean(list(base.values()))):+.2f}", p_text + star], (name, p)
    assert rows[1][4].endswith("*") and not rows[4][4].endswith("*")  # cis significantly worse, upr's gain not
    assert "difference to dl19-bm25-smollm2/first_stage" in printed and "per query: dl19-bm25-smollm2/upr" in printed
    record = json.loads(out.read_text())
    assert record["metrics"] == ["nDCG@1", "nDCG@5", "nDCG@10", "RR(rel=2)@10", "R(rel=2)@100"]
    assert record["results"]["dl19-bm25-smollm2/first_stage"]["nDCG@10"] == pytest.approx(50.58, abs=0.005)
    assert len(record["per_query"]["dl19-bm25-smollm2/cis"]["nDCG@10"]) == 43
    upr = record["significance"]["results"]["dl19-bm25-smollm2/upr"]["nDCG@10"]
    results = record["results"]
    assert upr["difference"] == pytest.approx(
        results["dl19-bm25-smollm2/upr"]["nDCG@10"] - results["dl19-bm25-smollm2/first_stage"]["nDCG@10"]
    )
    assert 0.05 < upr["p_value"] < 1 and not upr["significant"] and upr["queries"] == 43
    assert record["significance"]["baseline"] == "dl19-bm25-smollm2/first_stage"


def test_cli_eval_errors_name_the_metric_and_the_run(tmp_path, capsys) -> None:
    bm25 = str(TEACHER / "runs" / "first_stage.trec")
    assert main(["eval", "--qrels", str(DL19_QRELS), "--run", bm25, "--metrics", "nDCG@10", "nDGC@10"]) == 2
    assert "unknown metric 'nDGC@10'" in capsys.readouterr().err
    for level in ("-3", "0", "4"):  # DL19's grades run from 0 to 3; RR(rel=-3) was 100 and R(rel=-3) 0, exit 0
        assert main(["eval", "--qrels", str(DL19_QRELS), "--run", bm25, "--rel_level", level]) == 2
        assert f"rel_level: {level} is not a grade from 1 to the qrels' top grade, 3" in capsys.readouterr().err
    other = tmp_path / "other.trec"
    write_trec_run(other, {"19335": {"d1": 1.0}}, tag="x")  # a judged query the first stage's run does not have
    lone = tmp_path / "lone.trec"
    write_trec_run(lone, {"1037798": {"d1": 1.0}}, tag="x")
    assert main(["eval", "--qrels", str(DL19_QRELS), "--run", str(other), str(lone), "--queries", "common"]) == 2
    assert "error: queries: common: the 2 runs share no judged query" in capsys.readouterr().err
    unjudged = tmp_path / "unjudged.trec"
    write_trec_run(unjudged, {"no-such-query": {"d1": 1.0}}, tag="x")
    assert main(["eval", "--qrels", str(DL19_QRELS), "--run", bm25, str(unjudged)]) == 2
    assert f"{unjudged}: no query of the run has relevance judgements in {DL19_QRELS}" in capsys.readouterr().err


def test_cli_eval_keeps_a_run_named_as_the_input_s_ranking_and_refuses_a_beir_folder_s(tmp_path, capsys) -> None:
    """A teacher's runs/first_stage.trec replaced the input's own ranking (named <stem>/first_stage alike) with
    exit 0; a BEIR folder's "ranking" (its judged pairs in qrels order) was reported as a first stage."""
    hits = [{"qid": "q1", "docid": d, "content": f"passage {d}", "score": 1.0} for d in ("d1", "d2", "d3")]
    listed = tmp_path / "rl.json"
    listed.write_text(json.dumps([{"query": "a question", "hits": hits}]))
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 d1 0\nq1 0 d2 0\nq1 0 d3 2\n")
    write_trec_run(tmp_path / "teacher" / "rl" / "runs" / "first_stage.trec", {"q1": {"d3": 2.0, "d1": 1.0}}, "t")
    out = tmp_path / "eval.json"
    args = ["--qrels", str(qrels), "--metrics", "nDCG@1", "--json", str(out)]
    assert main(["eval", "--input", str(listed), "--run", str(tmp_path / "teacher" / "rl"), *args]) == 0
    results = json.loads(out.read_text())["results"]
    # the input's order, though its scores tie (trec_eval's rule would put d3 first); then the teacher's file
    run = tmp_path / "teacher" / "rl" / "runs" / "first_stage.trec"
    assert results == {"rl/first_stage": {"nDCG@1": 0.0}, str(run): {"nDCG@1": 100.0}}
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": h["docid"], "text": h["content"]}) + "\n" for h in hits)
    )
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "a question"}) + "\n")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td3\t2\nq1\td1\t0\n")
    capsys.readouterr()
    assert main(["eval", "--input", str(beir), "--metrics", "nDCG@1"]) == 2
    assert capsys.readouterr().err == (
        f"distill eval: error: {beir}: a BEIR folder has no ranking of its own: give the runs to evaluate (--run)\n"
    )
    assert main(["eval", "--input", str(beir), "--run", str(run), "--metrics", "nDCG@1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["results"] == {"rl/first_stage": {"nDCG@1": 100.0}}  # no baseline row


def _hotpot_question(qid: str, titles: list[str], supporting: list[str]) -> dict:
    context = [[t, [f"{t} is a paragraph.", " It has two sentences."]] for t in titles]
    return {
        "_id": qid,
        "question": f"question {qid}?",
        "context": context,
        "supporting_facts": [[t, 0] for t in supporting],
    }


def test_multihop_recall_and_precision_by_hand(tmp_path, capsys) -> None:
    """Given order: q1's supporting paragraphs at ranks 1 and 5 of 6, q2's at ranks 2 and 3 of only 4."""
    questions = [
        _hotpot_question("q1", ["A", "B", "C", "D", "E", "F"], ["A", "E"]),
        _hotpot_question("q2", ["G", "H", "I", "J"], ["H", "I"]),
    ]
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps(questions))
    expected = {  # recall: |supporting ∩ top k| / 2; precision: |supporting ∩ top k| / k, mean of q1 and q2
        "R@3": (50 + 100) / 2,
        "R@4": (50 + 100) / 2,
        "R@6": (100 + 100) / 2,
        "P@3": (100 / 3 + 200 / 3) / 2,
        "P@4": (25 + 50) / 2,
        "P@6": (200 / 6 + 200 / 6) / 2,  # q2 ranks only 4 paragraphs, still divided by 6
    }
    reverse = tmp_path / "reverse.trec"  # q1 reversed: F E D C B A puts E at 2 and A at 6
    write_trec_run(reverse, {"q1": {f"q1-{k}": float(k) for k in range(6)}}, tag="rev")
    out = tmp_path / "eval.json"
    assert main(["eval", "--input", str(path), "--run", str(reverse), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "hotpot/first_stage" in printed and "R@3" in printed
    record = json.loads(out.read_text())
    assert record["metrics"] == list(MULTIHOP_METRICS) and record["rel_level"] == 1
    assert record["results"]["hotpot/first_stage"] == pytest.approx(expected)
    assert record["results"][str(reverse)] == pytest.approx(
        {"R@3": 50, "R@4": 50, "R@6": 100, "P@3": 100 / 3, "P@4": 25, "P@6": 200 / 6}  # q1 only: q2 is not in the run
    )
    assert record["significance"]["results"][str(reverse)]["R@3"]["queries"] == 1


def test_multihop_first_stage_on_real_hotpotqa(capsys) -> None:
    """The given-order baseline of the shipped HotpotQA sample, against a direct count over the raw JSON."""
    questions = json.loads(HOTPOT.read_text())
    supporting = [{title for title, _ in q["supporting_facts"]} for q in questions]
    expected: dict[str, float] = {}
    for k in (3, 4, 6):
        found = [len(s & {title for title, _ in q["context"][:k]}) for s, q in zip(supporting, questions, strict=True)]
        expected[f"R@{k}"] = 100 * sum(f / len(s) for f, s in zip(found, supporting, strict=True)) / len(questions)
        expected[f"P@{k}"] = 100 * sum(f / k for f in found) / len(questions)
    assert main(["eval", "--input", str(HOTPOT)]) == 0
    row = next(line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("hotpotqa_train100/"))
    assert row[1] == "100"
    assert [float(v) for v in row[2:]] == pytest.approx([expected[m] for m in MULTIHOP_METRICS], abs=0.005)


def test_per_query_rows_come_in_numeric_then_text_order_whatever_the_ids() -> None:
    """A qid such as "1²" (a digit to str.isdigit, no number to int) crashed the per-query table."""
    from distill.eval.report import evaluate_runs, format_per_query

    qids = ["10", "9", "1²", "b"]
    report = evaluate_runs({"r": {q: {"d": 1.0} for q in qids}}, {q: {"d": 1} for q in qids}, ["P@1"], 1, "t")
    rows = [line.split()[0] for line in format_per_query(report).splitlines()[2:]]
    assert rows == ["9", "10", "1²", "b"]


def test_a_run_in_a_relative_runs_folder_is_named_by_the_folder_that_holds_it(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_trec_run(tmp_path / "work" / "runs" / "bm25.trec", {"q1": {"d1": 1.0}}, "t")
    monkeypatch.chdir(tmp_path / "work")
    assert find_run_files(["runs/bm25.trec"]) == {"work/bm25": Path("runs/bm25.trec")}  # not "/bm25"


@pytest.mark.parametrize("rank", ["1", "0"])
def test_a_job_of_several_processes_prints_its_summary_once(rank: str, monkeypatch, capsys) -> None:
    """Each process of ``accelerate launch --num_processes 2 -m distill teach`` printed the summary."""
    monkeypatch.setenv("RANK", rank)
    assert main(["eval", "--qrels", str(DL19_QRELS), "--run", str(TEACHER / "runs" / "first_stage.trec")]) == 0
    assert ("nDCG@10" in capsys.readouterr().out) == (rank == "0")
