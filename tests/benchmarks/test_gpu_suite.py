"""``python -m benchmarks.gpu_suite`` on tiny configs, so that the GPU suite's code keeps running where there is
no GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_suite as suite
from benchmarks import teacher_throughput, train_throughput
from benchmarks.gpu_suite import GpuSuite
from distill.core.config import parse_config
from distill.stages.train import check_train_args
from tests.conftest import REPO


@pytest.mark.slow
def test_the_tiny_suite_runs_each_benchmark_and_summarises_every_figure(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "benchmarks.gpu_suite", "--tiny", "--device", "cpu", "--out", str(tmp_path)]
    command.append("--profile")
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tiny"] and list(summary["stages"]) == ["teacher", "train", "rerank", "serve"]
    assert [s["error"] for s in summary["stages"].values()] == [None, None, None, None]
    # Then each stage but serving again, short, under torch.profiler: a table and the time by category per stage.
    profiles = summary["profiles"]
    assert list(profiles) == ["teacher", "train", "rerank"] and all(p["error"] is None for p in profiles.values())
    for stage in ("teacher", "train"):
        table = (tmp_path / "profile" / f"profile-{stage}.txt").read_text()
        assert "aten::" in table and "Self CPU" in table
        (only,) = profiles[stage]["profiles"].values()
        assert only["by_category_s"]["gemm"] > 0 and only["span_s"] > 0
    reranks = sorted(Path(path).name for path in profiles["rerank"]["profiles"])
    assert reranks == ["student_torch-fp32-100_candidates.json", "student_torch-fp32_unpad-100_candidates.json"]

    # Each benchmark's own result, in its own format.
    teacher = json.loads((tmp_path / "teacher.json").read_text())
    train = json.loads((tmp_path / "student-train.json").read_text())
    bench = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert teacher["benchmark"] == "teacher" and teacher["model"]["name"] == "random-tiny"
    assert train["benchmark"] == "student_train" and train["model"]["name"] == "tiny-bert"
    assert train["workload"]["max_batch_tokens"] == 2048 and train["workload"]["plain_batch_size"] == 16
    assert {(c["method"], c["workload"]) for c in bench["cells"]} >= {
        ("student torch-fp32", "100 candidates"),
        ("st-crossencoder", "100 candidates"),
    }
    assert (tmp_path / "bench" / "bench.csv").read_text().startswith("method,")

    figures = {(f["stage"], f["figure"]): f for f in summary["figures"]}
    assert figures["teacher", "flop_ceiling_fraction"]["value"] == teacher["teacher"]["flop_ceiling_fraction"]
    assert figures["teacher", "flop_ceiling_fraction"]["target"] == 0.75
    assert figures["train", "mfu"]["value"] == train["stage"]["mfu"] and figures["train", "mfu"]["target"] == 0.4
    assert figures["train", "speedup_over_plain_loop"]["value"] == train["speedup_samples_per_s"]
    fp32 = next(c for c in bench["cells"] if (c["method"], c["workload"]) == ("student torch-fp32", "100 candidates"))
    assert figures["rerank", "torch-fp32_100_candidates_p50_s"]["value"] == fp32["p50_s"]
    # Tokenisation overlapped with compute, timed beside it, its settings recorded.
    overlapped = figures["rerank", "torch-fp32+overlap=50_100_candidates_p50_s"]
    assert overlapped["value"] > 0 and overlapped["target"] == 0.025
    assert bench["settings"]["student torch-fp32+overlap=50"]["overlap"] == 50
    # The unpadded encoder too (on a CPU a lever; the default on a GPU), against the same target.
    assert figures["rerank", "torch-fp32+unpad_100_candidates_p50_s"]["target"] == 0.025
    assert bench["settings"]["student torch-fp32+unpad"]["unpad"] is True
    assert bench["settings"]["student torch-fp32"]["unpad"] is False
    # Every method's scores, held to the padded path's within the export's fp32 parity bound.
    students = {f"student {m}" for m in ("torch-fp32", "torch-fp32+unpad", "torch-fp32+overlap=50")}
    assert set(bench["scores"]) == {*students, "st-crossencoder"} == {c["method"] for c in bench["cells"]}
    assert [len(call) for call in bench["scores"]["student torch-fp32"]["100 candidates"]] == [100]
    for method in ("torch-fp32+unpad", "torch-fp32+overlap=50"):
        parity = figures["rerank", f"{method}_max_abs_diff_from_padded"]
        assert parity["target"] == 1e-4 and 0 <= parity["value"] <= 1e-4 and parity["met"] is True
    # Serving: distill serve batched and one at a time, and CrossEncoder.predict, on the random tiny student.
    serve = json.loads((tmp_path / "serve" / "serve.json").read_text())
    assert set(serve["servers"]) == {"batched", "one-at-a-time", "st-crossencoder"}
    assert serve["servers"]["batched"]["info"]["backend"] == "torch-fp32"
    assert [(c["documents"], c["concurrency"]) for c in serve["servers"]["batched"]["cells"]] == [(10, 1), (10, 4)]
    assert figures["serve", "lost or wrong answers, every cell"]["value"] == 0
    assert figures["serve", "lost or wrong answers, every cell"]["met"] is True
    assert figures["serve", "10 docs, concurrency 8: batched / one at a time"]["target"] == 2.0  # not measured tiny
    assert figures["serve", "10 docs, concurrency 8: batched / one at a time"]["value"] is None
    p99 = figures["serve", "10 docs, concurrency 4: p99 / p50 (batched)"]
    assert p99["value"] == serve["servers"]["batched"]["cells"][1]["p99_over_p50"] and p99["target"] == 1.5
    peer = figures["serve", "10 docs, concurrency 1: batched / CrossEncoder.predict"]  # the peer's one concurrency
    assert peer["value"] > 0 and ("serve", "10 docs, concurrency 4: batched / CrossEncoder.predict") not in figures
    # The suite ran with TOKENIZERS_PARALLELISM=false; its rerank stage tokenised in parallel all the same.
    assert bench["environment"]["tokenizers_parallelism"] == "true"
    assert figures["suite", "seconds"]["target"] == 480
    # The targets are the full shapes' on an H100: a tiny run checks correctness only (agreements, score parity).
    correctness = [f for f in summary["figures"] if f["kind"] == "equal" or f["figure"].endswith("_from_padded")]
    assert all(f["met"] is None for f in summary["figures"] if f not in correctness)
    assert all(f["met"] for f in correctness if f["stage"] == "rerank") and len(correctness) >= 5
    assert figures["teacher", "scores_agree"]["met"] and figures["train", "same_work"]["met"]
    # The teacher against the plain batched loop, in the same run.
    assert teacher["plain"]["pairs"] == 8 and teacher["workload"]["plain_batch_size"] == 4
    over_plain = figures["teacher", "speedup_over_plain_batched_loop"]
    assert over_plain["value"] == teacher["speedup_over_plain_pairs_per_s"] > 0 and over_plain["target"] == 1.2
    assert figures["teacher", "plain_scores_agree"]["met"]
    # The fp8 lever is gone: no stage, no file, no lever in the teacher's options.
    assert not (tmp_path / "teacher-fp8.json").exists() and "fp8" not in teacher["scorer_options"]


def test_the_gpu_run_trains_the_gpu_config_through_distill_train_and_its_arguments_parse() -> None:
    full = GpuSuite(tiny=False, device="cuda")
    argv = suite.train_argv(full, Path("out"))
    ours, train = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    # The GPU config as distill train reads it; only random weights (offline) and the length the plain loop pads to.
    config = ["--config", "configs/train/bert-large-gpu.yaml"]
    assert train == [*config, "--model.random_init", "true", "--data.max_length", "256"]
    check_train_args(train, "the suite's training stage")
    options = parse_config(train_throughput.TrainThroughput, ours, "train")
    assert (options.warmup_steps, options.steps, options.out) == (10, 30, str(Path("out/student-train.json")))
    assert suite.train_argv(GpuSuite(device="cuda:1"), Path("out"))[-2:] == ["--trainer.devices", "[1]"]
    argv = suite.teacher_argv(full, Path("out"))
    parsed = parse_config(teacher_throughput.TeacherThroughput, argv, "teacher")
    assert parsed.random_config == "llama3-8b" and parsed.plain_pairs is None  # the plain loop on every pair
    assert parsed.out == str(Path("out/teacher.json")) and "teacher-fp8" not in suite.STAGES
    argv = suite.rerank_argv(full, Path("out"))
    backends = "torch-fp16,torch-fp16+cuda_graphs=false,torch-fp16+unpad=false,torch-fp16+overlap=50,"
    backends += "torch-fp32,torch-fp32+tf32,st-crossencoder"
    assert argv[argv.index("--backends") + 1] == backends and argv[argv.index("--scores") + 1] == "true"
    assert suite.padded_method(full) == "torch-fp16+unpad=false"
    assert suite.profile_argv("rerank", full, Path("p"))[-3] == "torch-fp16,torch-fp16+unpad=false"
    chosen = GpuSuite(device="cuda", rerank_backends="torch-fp16+compile,st-crossencoder")
    assert "torch-fp16+compile,st-crossencoder" in suite.rerank_argv(chosen, Path("out"))


def test_the_rerank_targets_are_the_fp16_students_and_its_levers() -> None:
    """On the full shapes: 25 ms and ahead of CrossEncoder.predict for torch-fp16 with and without its levers; the
    fp32 methods are reported without a target."""
    p50 = {"student torch-fp16": 0.020, "student torch-fp16+overlap=50": 0.030, "student torch-fp32+tf32": 0.040}
    cells = [{"method": m, "workload": "100 candidates", "p50_s": s} for m, s in p50.items()]
    cells.append({"method": "st-crossencoder", "workload": "100 candidates", "p50_s": 0.035})
    settings = {"student torch-fp16+overlap=50": {"overlap": 50, "attention": "sdpa", "max_batch_tokens": 32768}}
    result = {"cells": cells, "settings": settings}
    figures = {f["figure"]: f for f in suite.rerank_figures(result, "torch-fp16", False)}
    assert figures["torch-fp16_100_candidates_p50_s"]["met"] is True
    assert figures["speedup_over_st_crossencoder"]["value"] == pytest.approx(1.75)
    overlapped = figures["torch-fp16+overlap=50_100_candidates_p50_s"]
    assert overlapped["met"] is False and overlapped["target"] == 0.025
    assert "overlap 50, attention sdpa, max_batch_tokens 32768" in overlapped["note"]
    assert figures["torch-fp16+overlap=50_speedup_over_st_crossencoder"]["met"] is True
    tf32 = figures["torch-fp32+tf32_100_candidates_p50_s"]
    assert tf32["value"] == 0.040 and tf32["target"] is None and tf32["met"] is None
    tiny = suite.rerank_figures(result, "torch-fp16", True)
    assert all(f["met"] is None for f in tiny)


def test_each_method_is_held_to_the_padded_paths_scores_within_the_parity_bound() -> None:
    """On a GPU the defaults (unpadded, graphs) and the other levers of torch-fp16 against torch-fp16+unpad=false,
    within fp16's parity bound over every call; other backends' methods and the baseline are not compared."""
    padded = [[0.5, -1.0], [2.0]]
    scores = {
        "student torch-fp16+unpad=false": {"100 candidates": padded},
        "student torch-fp16": {"100 candidates": [[0.51, -1.0], [2.0]]},
        "student torch-fp16+cuda_graphs=false": {"100 candidates": [[0.5, -1.0], [1.95]]},
        "student torch-fp32": {"100 candidates": [[9.0, 9.0], [9.0]]},
        "st-crossencoder": {"100 candidates": [[9.0, 9.0], [9.0]]},
    }
    figures = {f["figure"]: f for f in suite.score_figures({"scores": scores}, "torch-fp16", "torch-fp16+unpad=false")}
    no_graphs = "torch-fp16+cuda_graphs=false_max_abs_diff_from_padded"
    assert set(figures) == {"torch-fp16_max_abs_diff_from_padded", no_graphs}
    close, far = figures["torch-fp16_max_abs_diff_from_padded"], figures[no_graphs]
    assert close["value"] == pytest.approx(0.01) and close["target"] == 2e-2 and close["met"] is True
    assert far["value"] == pytest.approx(0.05) and far["met"] is False and "over 2 calls" in far["note"]
    assert suite.score_figures({"scores": {}}, "torch-fp16", "torch-fp16+unpad=false") == []  # no reference ran


def test_the_rerank_stage_tokenises_in_parallel_and_leaves_the_environment_as_it_found_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for before in ("false", None):
        if before is None:
            monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
        else:
            monkeypatch.setenv("TOKENIZERS_PARALLELISM", before)
        with pytest.raises(KeyError), suite.parallel_tokenizer():
            assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
            raise KeyError("a failed stage")
        assert os.environ.get("TOKENIZERS_PARALLELISM") == before


@pytest.mark.parametrize(
    ("bench", "options"),
    [(teacher_throughput, teacher_throughput.TeacherThroughput), (train_throughput, train_throughput.TrainThroughput)],
)
def test_a_result_or_profile_path_that_cannot_be_written_is_one_line_before_any_work(
    bench, options: type, tmp_path: Path, capsys
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for flag in ("--profile", "--out"):
        assert bench.main([flag, str(blocker / "result.json")]) == 2
        (error,) = capsys.readouterr().err.strip().splitlines()
        path = blocker / "result.json"
        assert error == f"python -m {bench.__name__}: error: {flag}: {path}: {blocker} is not a folder"
    assert Path(parse_config(options, ["--profile", str(tmp_path / "new" / "p.txt")], "b").profile).parent.is_dir()
