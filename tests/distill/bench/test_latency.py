"""The latency benchmark: its workloads on real DL19 candidates, every method on identical inputs, its outputs."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from distill.bench import report
from distill.bench.latency import BenchConfig, _students, run_bench
from distill.bench.methods import PEERS, EncoderFlops, baseline_method, student_method, teacher_method
from distill.bench.peers import OPTIMUM, ST_BACKENDS
from distill.bench.workload import rerank_workload, token_count_workloads
from distill.cli import main
from distill.core.schema import InputError
from distill.data.loaders import load_candidates
from distill.serving.auto import choose_backend
from distill.serving.hardware import CPUINFO, CpuFeatures
from distill.serving.reranker import Reranker
from teachers.teacher import CausalLMTeacher
from tests.conftest import DL19
from tests.distill.bench.test_peers import importable


@pytest.fixture(scope="module")
def dl19():
    return load_candidates(DL19)


@pytest.fixture(scope="module")
def tokenizer(tiny_bert: Path):
    return AutoTokenizer.from_pretrained(tiny_bert)


def test_token_count_workloads_cut_one_querys_candidates(dl19, tokenizer) -> None:
    workloads = token_count_workloads(dl19, tokenizer, [500, 2000, 10000])
    totals = {
        c.query.qid: sum(map(len, tokenizer([p.text for p in c.passages], add_special_tokens=False)["input_ids"]))
        for c in dl19.candidates
    }
    longest = max(totals, key=totals.get)
    by_qid = {c.query.qid: c for c in dl19.candidates}
    for count, workload in zip([500, 2000, 10000], workloads, strict=True):
        (call,) = workload.calls
        assert workload.name == f"{count} tokens" and call.qid == longest
        assert abs(call.passage_tokens - count) <= 3
        texts = [p.text for p in by_qid[longest].passages]
        assert call.passages[:-1] == texts[: len(call.passages) - 1]  # first-stage order, the last one cut
        assert (
            texts[len(call.passages) - 1]
            .lower()
            .replace(" ", "")
            .startswith(call.passages[-1].lower().replace(" ", "")[:20])
        )
    assert len(workloads[2].calls[0].passages) > len(workloads[0].calls[0].passages)


def test_token_count_workloads_bad_input(dl19, tokenizer) -> None:
    qid = dl19.candidates[0].query.qid
    with pytest.raises(InputError, match=rf"query {qid}'s candidates hold \d+ tokens, fewer than 100000"):
        token_count_workloads(dl19, tokenizer, [100000], qid=qid)
    with pytest.raises(InputError, match="no query 'nope'"):
        token_count_workloads(dl19, tokenizer, [500], qid="nope")


def test_rerank_workload_takes_whole_candidate_lists(dl19, tokenizer) -> None:
    workload = rerank_workload(dl19, tokenizer, 2)
    assert workload.name == "100 candidates"
    assert [c.qid for c in workload.calls] == [c.query.qid for c in dl19.candidates[:2]]
    assert all(len(c.passages) == 100 for c in workload.calls)


def test_methods_score_identical_inputs_identically(exported: Path, tiny_llama: Path, dl19, tokenizer) -> None:
    """The bench times what the stages compute: the Reranker's scores, the same numbers in sentence-transformers,
    and the teacher stage's CIS."""
    pytest.importorskip("sentence_transformers")
    call = token_count_workloads(dl19, tokenizer, [300])[0].calls[0]
    reference = np.array(Reranker.load(exported, backend="torch").score(call.query, call.passages))
    for method in (
        student_method(exported, "torch-fp32", "cpu", None, 4096),
        student_method(exported, "onnx-fp32", "cpu", None, 4096),
        baseline_method(exported, "cpu", None),
    ):
        np.testing.assert_allclose(method.score(call.query, call.passages), reference, atol=1e-4, err_msg=method.name)
        model = Reranker.load(exported, backend="torch").scorer.model
        assert method.n_params == sum(p.numel() for p in model.parameters())
        assert method.tokens_fed(call) > call.passage_tokens  # query and special tokens added
    teacher = CausalLMTeacher.load(str(tiny_llama))
    cis = teacher_method(teacher).score(call.query, call.passages)
    ids = teacher.encode_passages(call.passages)
    cond = teacher.pair_terms([call.query] * len(ids), ids, ["logp_cond"])["logp_cond"]
    np.testing.assert_allclose(cis, cond - teacher.passage_logprobs(ids), rtol=1e-6)


def test_matmul_flops_of_a_student(exported: Path, dl19, tokenizer) -> None:
    """Weight matmuls: every layer's per token but the last's query, output and feed-forward, which only [CLS]
    needs, as the pooler and the classifier; attention's QK^T and AV on each pair's own length (the last layer's
    for [CLS] only); int8 backends count their weight matmuls as int8."""
    counts = EncoderFlops.of(exported)
    hidden, inner = 32, 64  # the tiny BERT of conftest: 2 layers
    assert counts == EncoderFlops(2, hidden, inner, hidden * hidden + hidden)
    layer = 4 * hidden * hidden + 2 * hidden * inner
    per_token, per_pair = layer + 2 * hidden * hidden, 2 * hidden * hidden + 2 * hidden * inner + counts.head_weights
    assert counts([3, 5]) == (2 * (per_token * 8 + per_pair * 2), 4 * hidden * (9 + 25 + 8))
    call = token_count_workloads(dl19, tokenizer, [300])[0].calls[0]
    fp32 = student_method(exported, "onnx-fp32", "cpu", None, 4096).matmul_flops(call)
    int8 = student_method(exported, "onnx-int8", "cpu", None, 4096, threads=1).matmul_flops(call)
    assert set(fp32) == {"float"} and int8["int8"] + int8["float"] == pytest.approx(fp32["float"])


def test_matmul_flops_of_a_segment_cosine_student(tmp_path: Path) -> None:
    """The segment-cosine head reads every position of the last layer (no [CLS] tail) and its first
    ``segment_layers`` layers attend within the query's and the passage's segments: counted as the [CLS] head's,
    a segment student's FLOPs were off both ways."""
    hidden, inner = 32, 64
    config = {"num_hidden_layers": 3, "hidden_size": hidden, "intermediate_size": inner, "segment_layers": 2}
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "bert-segment-cosine"}))
    counts = EncoderFlops.of(tmp_path)
    assert counts == EncoderFlops(3, hidden, inner, 0, cls_tail=False, segment_layers=2)
    layer = 4 * hidden * hidden + 2 * hidden * inner
    lengths, queries = [10, 6], [4, 4]
    apart, across = 16 + 36 + 16 + 4, 100 + 36
    assert counts(lengths, queries) == (2 * 3 * layer * 16, 4 * hidden * (2 * apart + 1 * across))
    assert counts(lengths) == (2 * 3 * layer * 16, 4 * hidden * 3 * across)  # no segments known: all across


def test_bench_times_every_method_and_writes_json_csv_png(exported: Path, tiny_llama: Path, tmp_path: Path) -> None:
    queries = json.loads(DL19.read_text())[:2]  # a quality pass over 2 judged queries
    (tmp_path / "dl19-2.json").write_text(json.dumps(queries))
    config = BenchConfig(
        student=str(exported),
        input=str(tmp_path / "dl19-2.json"),
        qrels=str(DL19.parent / "qrels.txt"),
        teacher=str(tiny_llama),
        token_counts=[200, 400],
        rerank_queries=2,
        repeats=2,
        max_seconds=60,
        output=str(tmp_path / "bench"),
        matmul_size=256,
    )
    result = run_bench(config, "distill bench ...")
    openvino = ["openvino-fp32", "openvino-bf16", "openvino-int8"]
    missing = {peer for peer in PEERS if not importable(OPTIMUM[ST_BACKENDS[peer]][0])}  # what this venv lacks
    missing |= set() if importable("openvino") else set(openvino)
    # the fixture's int8 graph is static, made and gated for onnxruntime: OpenVINO's run of it is not timed unasked
    ungated = "openvino-int8"
    assert set(result["skipped"]) == missing | {ungated}, result["skipped"]  # nothing else dropped out quietly
    if ungated not in missing:
        assert result["skipped"][ungated].endswith(
            "model.int8.onnx (int8_mode static) was made and checked for onnxruntime, not openvino: "
            "name openvino-int8 in --backends to time it anyway"
        )
    missing.add(ungated)
    students = ["torch-fp32", "torchscript", "onnx-fp32", "onnx-int8", *openvino]
    expected = [f"student {m}" for m in students if m not in missing]
    expected.append(f"student auto ({choose_backend(exported).backend})")  # beside every backend, named by its choice
    expected += [m for m in ("st-crossencoder", *PEERS) if m not in missing]
    assert report.methods(result) == [*expected, "teacher cis"]
    assert result["environment"]["cpu_features"] == CpuFeatures.read().describe()
    assert report.workloads(result) == ["200 tokens", "400 tokens", "100 candidates"]
    for cell in result["cells"]:
        calls = 2 if cell["workload"] == "100 candidates" else 1
        assert cell["n"] == 2 * calls and cell["calls"] == calls
        assert 0 < cell["p50_s"] <= cell["p95_s"] <= max(cell["seconds"])
        assert cell["pairs_per_s"] == pytest.approx(cell["pairs_per_call"] * cell["n"] / sum(cell["seconds"]))
        assert cell["peak_memory_bytes"] > 0 and cell["flop_floor_s"] > 0
        assert cell["floor_fraction"] == pytest.approx(cell["flop_floor_s"] / cell["p50_s"])
        kinds = {"int8": {"int8", "float"}, "bfloat16": {"bfloat16"}}.get(cell["dtype"], {"float"})
        assert set(cell["matmul_flops_per_call"]) == kinds, cell["method"]
    # a bf16 backend's floor at the faster of the two rates: at the fp32 rate, openvino-bf16 reached "213%" of it
    assert result["matmul"]["bf16_flops_per_s"] >= result["matmul"]["flops_per_s"] > 0
    quality = result["quality"]
    assert quality["queries"] == 2 and set(quality["ndcg10"]) == set(expected)  # every judged query of the input
    reference = quality["ndcg10"]["student torch-fp32"]
    for method in ("student torchscript", "student onnx-fp32", "st-crossencoder"):
        assert quality["ndcg10"][method] == pytest.approx(reference, abs=0.01), method
    auto = next(m for m in expected if m.startswith("student auto"))
    chosen = "student " + auto.removeprefix("student auto (").removesuffix(")")
    assert quality["ndcg10"][auto] == pytest.approx(quality["ndcg10"][chosen], abs=0.01)
    summary = report.summary_table(result)
    assert "100 candidates, p50 per call" in summary and "nDCG@10 on 2 judged queries" in summary
    onnx_row = next(line for line in summary.splitlines() if "student onnx-fp32" in line)
    torch_p50 = report.cell(result, "student torch-fp32", "100 candidates")["p50_s"]
    onnx_p50 = report.cell(result, "student onnx-fp32", "100 candidates")["p50_s"]
    assert f"{torch_p50 / onnx_p50:.2f}x" in onnx_row
    out = tmp_path / "bench"
    saved = json.loads((out / "bench.json").read_text())
    assert saved["command"] == "distill bench ..." and saved["cells"] == json.loads(json.dumps(result["cells"]))
    rows = list(csv.DictReader((out / "bench.csv").open()))
    assert len(rows) == len(result["cells"]) and float(rows[0]["p50_s"]) == pytest.approx(result["cells"][0]["p50_s"])
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    speedups = report.speedups(result, "teacher cis")
    teacher = report.cell(result, "teacher cis", "100 candidates")
    onnx = report.cell(result, "student onnx-fp32", "100 candidates")
    assert speedups["student onnx-fp32"]["100 candidates"] == pytest.approx(teacher["p50_s"] / onnx["p50_s"])


def test_bench_random_weights_and_saved_results_on_the_cli(
    tiny_bert: Path, tiny_llama: Path, tmp_path: Path, capsys
) -> None:
    """``--random-weights`` builds both models from their configs (here the tiny ones' folders); ``--results``
    prints a saved run's tables, ``--compare`` its speed-ups."""
    out = tmp_path / "random"
    argv = ["bench", "--random-weights", "--student", str(tiny_bert), "--teacher", str(tiny_llama)]
    argv += ["--token-counts", "100", "--rerank-queries", "0", "--repeats", "2", "--backends", "torch-fp32"]
    argv += ["--output", str(out), "--matmul-size", "128", "--device", "cpu", "--quality", "false"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "student torch-fp32" in printed and "teacher cis" in printed and "100 tokens" in printed
    result = json.loads((out / "bench.json").read_text())
    assert result["student"]["name"] == f"random {tiny_bert}" and len(result["cells"]) == 2
    assert main(["bench", "--results", str(out / "bench.json"), "--compare"]) == 0
    printed = capsys.readouterr().out
    ratio = report.speedups(result, "teacher cis")["student torch-fp32"]["100 tokens"]
    assert "speed-up over teacher cis" in printed and f"{ratio:.2f}x" in printed


def test_bench_bad_arguments(exported: Path, capsys) -> None:
    assert main(["bench", "--student", str(exported), "--backends", "torch-fp8"]) == 2
    assert "unknown ['torch-fp8']" in capsys.readouterr().err
    assert main(["bench"]) == 2
    assert "--student is required" in capsys.readouterr().err
    assert main(["bench", "--student", "/nonexistent/run"]) == 2
    assert "no such run or model folder" in capsys.readouterr().err
    for option, value, expected in (("repeats", "0", "at least 1"), ("warmup", "-1", "at least 0")):
        assert main(["bench", "--student", str(exported), f"--{option}", value]) == 2  # an IndexError once timing
        assert f"error: {option} must be {expected}, got {value}" in capsys.readouterr().err
    assert main(["bench", "--student", str(exported), "--token-counts", "100,0"]) == 2  # a ValueError's traceback
    assert "error: token_counts must be positive, got [100, 0]" in capsys.readouterr().err
    assert main(["bench", "--student", str(exported), "--token-counts", "500,500,1000"]) == 2  # tables showed one
    assert "error: token_counts: [500] given twice; each workload is timed once" in capsys.readouterr().err
    assert main(["bench", "--student", str(exported), "--backends", "onnx-fp32,torch-fp32,onnx-fp32"]) == 2
    assert "--backends: ['onnx-fp32'] named twice; each method is timed once" in capsys.readouterr().err
    for value in ("-3", "0"):  # a RuntimeError's traceback (negative dimension); 0 went on
        assert main(["bench", "--student", str(exported), "--matmul_size", value]) == 2
        assert f"error: matmul_size must be positive, got {value}" in capsys.readouterr().err
    assert main(["bench", "--student", str(exported), "--backends", "[]", "--teacher", "none"]) == 2  # crashed plotting
    assert "error: nothing to time: backends is empty and teacher is none" in capsys.readouterr().err
    assert main(["bench", "--student", str(exported), "--qrels", "/nonexistent/qrels.txt"]) == 2  # FileNotFoundError
    assert "/nonexistent/qrels.txt: no such qrels file" in capsys.readouterr().err
    # every student method skipped as over the model's 512: the baseline alone was timed, exit 0
    assert main(["bench", "--student", str(exported), "--max_length", "100000"]) == 2
    assert f"error: max_length: 100000 is over the model's 512 ({exported})" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("missing", "expected"),
    [
        ("tokenizer.json", "missing tokenizer.json: the tokenizer's vocabulary"),  # timed [UNK]s, exit 0
        ("model.safetensors", "missing model.safetensors: bench counts the student's parameters and FLOPs"),
    ],
)
def test_a_student_folder_without_a_file_bench_needs_is_one_line(
    exported: Path, tmp_path: Path, capsys, missing: str, expected: str
) -> None:
    folder = tmp_path / "student"
    shutil.copytree(exported, folder)
    (folder / missing).unlink()
    argv = ["bench", "--student", str(folder), "--teacher", "none", "--output", str(tmp_path / "out")]
    assert main([*argv, "--backends", "onnx-fp32"]) == 2  # the ONNX backend ran without the weights: a traceback
    err = capsys.readouterr().err
    assert err == f"distill bench: error: {folder}: {expected}" + err.split(expected, 1)[1] and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_the_quality_pass_takes_the_qrels_beside_the_input_and_says_when_none_judge_it(
    exported: Path, tmp_path: Path, capsys
) -> None:
    """Another input than DL19's kept DL19's qrels: its nDCG@10 column was empty, with nothing said."""
    judged, unjudged = tmp_path / "judged", tmp_path / "unjudged"
    for folder in (judged, unjudged):
        folder.mkdir()
        (folder / "candidates.json").write_text(json.dumps(json.loads(DL19.read_text())[:2]))
    shutil.copy(DL19.parent / "qrels.txt", judged / "qrels.txt")
    argv = ["bench", "--student", str(exported), "--teacher", "none", "--backends", "onnx-fp32", "--repeats", "1"]
    argv += ["--token-counts", "[]", "--rerank_queries", "1"]
    for folder in (judged, unjudged):
        assert main([*argv, "--input", str(folder / "candidates.json"), "--output", str(folder / "bench")]) == 0
    quality = json.loads((judged / "bench" / "bench.json").read_text())["quality"]
    assert quality["qrels"] == str(judged / "qrels.txt") and quality["queries"] == 2
    assert 0 < quality["ndcg10"]["student onnx-fp32"] <= 100
    result = json.loads((unjudged / "bench" / "bench.json").read_text())
    assert result["quality"] is None
    reason = f"no query of {unjudged / 'candidates.json'} is judged (no qrels): give --qrels, or --quality false"
    assert result["skipped"]["nDCG@10"] == reason and f"skipped nDCG@10: {reason}" in capsys.readouterr().out


def test_bench_refuses_a_trec_run_without_a_hint_it_cannot_take(exported: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "bm25.trec"
    run.write_text("q1 Q0 d1 1 5.0 bm25\n")
    assert main(["bench", "--student", str(exported), "--input", str(run), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{run}: a TREC run has no texts; give bench candidates with theirs" in err and "--corpus" not in err


def test_bench_results_that_are_no_bench_json(tmp_path: Path, capsys) -> None:
    for name, text, expected in (
        ("cut.json", '{"workloads": [', "cut.json:1:16: malformed JSON"),
        ("list.json", "[1]", "list.json: expected a JSON object, got list"),
        ("empty.json", "{}", "empty.json: not a bench.json (no 'workloads', 'cells', 'skipped')"),
        ("none.json", '{"workloads": [], "cells": [], "skipped": {}}', "none.json: cells: no method was timed"),
        (  # a KeyError's traceback
            "keys.json",
            '{"workloads": [{"name": "w"}], "cells": [{"method": "m"}], "skipped": {}}',
            "keys.json: cells[0]: missing 'role', 'dtype', 'workload'",
        ),
    ):
        (tmp_path / name).write_text(text)
        assert main(["bench", "--results", str(tmp_path / name)]) == 2
        assert expected in capsys.readouterr().err, name


def test_a_failing_method_keeps_the_figures_already_taken(exported: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "partial"
    argv = ["bench", "--student", str(exported), "--teacher", str(tmp_path / "no-such-teacher"), "--device", "cpu"]
    argv += ["--token-counts", "100", "--rerank-queries", "0", "--repeats", "1", "--backends", "torch-fp32,onnx-fp32"]
    assert main([*argv, "--output", str(out), "--matmul-size", "128"]) == 2
    assert "no-such-teacher" in capsys.readouterr().err
    saved = json.loads((out / "bench.json").read_text())
    assert not saved["complete"] and report.methods(saved) == ["student torch-fp32", "student onnx-fp32"]
    assert not (out / "bench.png").exists()
    assert main(["bench", "--results", str(out / "bench.json")]) == 0  # its tables, said to be incomplete
    assert "incomplete: the run stopped before every method was timed" in capsys.readouterr().out


def test_a_missing_graph_asked_for_is_named_before_any_timing_and_a_new_run_leaves_no_stale_table(
    exported: Path, tmp_path: Path, capsys
) -> None:
    """A run asked for onnx-fp32 of a folder without model.onnx timed torch first, then failed; its partial
    bench.json sat beside the earlier run's bench.csv and bench.png."""
    student = Path(shutil.copytree(exported, tmp_path / "student"))
    out = tmp_path / "out"
    argv = ["bench", "--student", str(student), "--teacher", "none", "--device", "cpu", "--token-counts", "[100]"]
    argv += ["--rerank-queries", "0", "--repeats", "1", "--quality", "false", "--output", str(out)]
    assert main([*argv, "--backends", "torch-fp32"]) == 0
    assert {"bench.json", "bench.csv", "bench.png"} <= {f.name for f in out.iterdir()}
    before = (out / "bench.json").read_bytes()
    (student / "model.onnx").unlink()
    capsys.readouterr()
    assert main([*argv, "--backends", "torch-fp32,onnx-fp32"]) == 2
    assert f"error: --backends onnx-fp32: no model.onnx in {student}" in capsys.readouterr().err
    assert (out / "bench.json").read_bytes() == before  # nothing was timed, nothing replaced
    out.joinpath("bench.json").write_text('{"partial": true}')  # as a run that failed part-way leaves it
    assert main([*argv, "--backends", "torch-fp32", "--teacher", str(tmp_path / "no-such-teacher")]) == 2
    assert not (out / "bench.csv").exists() and not (out / "bench.png").exists()  # no table of another run


def test_a_student_no_method_could_time_is_an_error_not_a_crash_in_the_plot(
    exported: Path, tmp_path: Path, capsys
) -> None:
    student = Path(shutil.copytree(exported, tmp_path / "student"))
    for name in ("model.onnx", "onnx", "model.int8.onnx", "model.fp16.onnx", "model.pt", "model.openvino.xml"):
        path = student / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    (student / "config.json").write_text(json.dumps({"model_type": "nonsense"}))  # no loader takes it
    argv = ["bench", "--student", str(student), "--teacher", "none", "--device", "cpu", "--token-counts", "[100]"]
    argv += ["--rerank-queries", "0", "--repeats", "1", "--quality", "false", "--output", str(tmp_path / "out")]
    assert main(argv) == 2  # a ZeroDivisionError in the plot, after bench.json and bench.csv
    err = capsys.readouterr().err
    assert "error: no method of the student could be timed (" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "bench.png").exists()


def test_a_matmul_rate_too_low_for_the_timings_is_a_warning(
    exported: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rate measured on a busy machine (0.03 GFLOP/s) printed floor fractions of 44775% without a word."""
    from distill.bench import latency

    monkeypatch.setattr(latency, "matmul_flops_per_s", lambda *args: 1e6)  # as a loaded machine measured it
    argv = ["bench", "--student", str(exported), "--teacher", "none", "--backends", "torch-fp32", "--repeats", "1"]
    argv += ["--token-counts", "[100]", "--rerank_queries", "0", "--quality", "false", "--output", str(tmp_path / "b")]
    with caplog.at_level("WARNING", "distill.bench.latency"):
        assert main(argv) == 0
    [record] = [r for r in caplog.records if "FLOP floor" in r.getMessage()]
    assert record.getMessage().startswith("student torch-fp32 ran 100 tokens at ")
    assert "the matmul rate (size 2048) was measured too low for this machine" in record.getMessage()


def test_a_profile_of_a_runtime_torch_cannot_see_says_so_and_a_cpu_profile_keeps_the_cpus_features(
    exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime's calls left an empty table ("self CPU time 0.000 s"), and CIS_DISTILL_CPU_PROFILE replaced the
    only record of the CPU the timings ran on."""
    from distill.bench.profile import UNSEEN

    monkeypatch.setenv("CIS_DISTILL_CPU_PROFILE", "avx2")
    out = tmp_path / "bench"
    argv = ["bench", "--student", str(exported), "--teacher", "none", "--backends", "onnx-fp32,torch-fp32"]
    argv += ["--token-counts", "[100]", "--rerank_queries", "0", "--repeats", "1", "--quality", "false"]
    assert main([*argv, "--profile", "true", "--output", str(out)]) == 0
    assert UNSEEN in (out / "profile" / "student_onnx-fp32-100_tokens.txt").read_text()
    assert UNSEEN not in (out / "profile" / "student_torch-fp32-100_tokens.txt").read_text()
    environment = json.loads((out / "bench.json").read_text())["environment"]
    assert environment["cpu_features"].startswith("profile avx2: ")
    assert environment["cpu_features_measured"] == CpuFeatures.read(CPUINFO).describe()


def test_a_workload_cut_by_max_length_is_named_in_a_warning(
    exported: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ "10000 tokens" fed 2944 at --max_length 32, tabled as 10000 with nothing said."""
    argv = ["bench", "--student", str(exported), "--teacher", "none", "--backends", "onnx-fp32", "--repeats", "1"]
    argv += ["--token-counts", "[300]", "--rerank_queries", "0", "--quality", "false", "--output", str(tmp_path / "b")]
    with caplog.at_level("WARNING", "distill.bench.latency"):
        assert main(argv) == 0
        assert not caplog.records  # a max_length of 512 reads every token of 300
        assert main([*argv, "--max_length", "32"]) == 0
    [record] = caplog.records
    fed = json.loads((tmp_path / "b" / "bench.json").read_text())["cells"][0]["tokens_fed_per_call"]
    assert record.getMessage().startswith(f"student onnx-fp32 reads {fed:.0f} tokens a call of the 30")
    assert "passage tokens of 300 tokens: its max_length cuts the passages" in record.getMessage()


def test_more_rerank_queries_than_the_input_holds_is_a_warning(dl19, tokenizer, caplog) -> None:
    """--rerank_queries 1000 timed DL19's 43 queries, its figures labelled as asked, with nothing said."""
    with caplog.at_level("WARNING", "distill.bench.workload"):
        assert len(rerank_workload(dl19, tokenizer, 43).calls) == 43 and not caplog.records
        assert len(rerank_workload(dl19, tokenizer, 1000).calls) == 43
    [record] = caplog.records
    assert record.getMessage() == f"rerank_queries 1000: {dl19.source} holds 43 queries; timing those"


@pytest.mark.parametrize("mode,made_for", [("weights", "openvino"), ("static", "onnxruntime")])
def test_an_int8_graph_is_timed_unasked_only_on_the_runtime_its_export_checked(
    tmp_path: Path, mode: str, made_for: str
) -> None:
    """The export's quality gate checks the int8 graph on the runtime its mode makes it for; the other runtime's
    scores are unchecked (up to 0.40 from torch's for a ``weights`` graph on onnxruntime), so the default methods
    leave that pairing out, with the reason, and ``--backends`` still times it when named."""
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "model.int8.onnx").write_bytes(b"")
    (folder / "card.json").write_text(json.dumps({"optimizations": {"onnx-int8": {"mode": mode, "runtime": made_for}}}))
    other = {"openvino": ("onnx-int8", "onnxruntime"), "onnxruntime": ("openvino-int8", "openvino")}[made_for]
    checked = {"openvino": "openvino-int8", "onnxruntime": "onnx-int8"}[made_for]
    loaders, skipped, _ = _students(BenchConfig(student=str(folder)), folder, torch.device("cpu"), tmp_path)
    timed = [name for name, _ in loaders]
    assert checked in timed and other[0] not in timed
    assert skipped[other[0]] == (
        f"{folder / 'model.int8.onnx'} (int8_mode {mode}) was made and checked for {made_for}, not {other[1]}: "
        f"name {other[0]} in --backends to time it anyway"
    )
    loaders, skipped, _ = _students(
        BenchConfig(student=str(folder), backends=[other[0]]), folder, torch.device("cpu"), tmp_path
    )
    assert [name for name, _ in loaders] == [other[0]] and skipped == {}
