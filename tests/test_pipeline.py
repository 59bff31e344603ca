"""``distill run``: the whole pipeline on tiny models and real DL19 candidates, its skipping and its summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from distill.cli import main
from distill.core.runs import read_trec_run
from distill.core.schema import InputError
from distill.pipeline import load_pipeline

from .conftest import DL19_QRELS


def write_pipeline(tmp_path: Path, sample_file: Path, tiny_llama: Path, tiny_bert: Path, **bench) -> Path:
    train = {
        "model": {"backbone": str(tiny_bert), "lr": 1e-3},
        "data": {"label": "cis", "qrels": str(DL19_QRELS), "val_queries": 1, "batch_size": 8, "max_length": 128},
        "trainer": {"max_epochs": 1, "accelerator": "cpu", "devices": 1, "enable_progress_bar": False},
        "wandb_mode": "disabled",
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(train))
    config = {
        "name": "tiny",
        "root": str(tmp_path / "runs"),
        "teach": {
            "input": str(sample_file),
            "qrels": str(DL19_QRELS),
            "teacher": str(tiny_llama),
            "scores": ["cis", "upr"],
            "cache_dir": str(tmp_path / "cache"),
            "progress": False,
        },
        "train": {"configs": [str(tmp_path / "train.yaml")], "args": {"model.warmup_ratio": 0.0}},
        "export": {"formats": ["onnx", "torchscript"], "int8": False, "parity_queries": 1, "parity_depth": 8},
        "bench": {
            "input": str(sample_file),
            "token_counts": [200],
            "rerank_queries": 1,
            "repeats": 2,
            "matmul_size": 256,
            **bench,
        },
        "eval": {"qrels": str(DL19_QRELS), "backend": "onnx"},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def stamps(folder: Path) -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted((folder / "stages").glob("*.json"))}


def test_pipeline_runs_every_stage_then_skips_what_is_up_to_date(
    tmp_path: Path, sample_file: Path, tiny_llama: Path, tiny_bert: Path, capsys
) -> None:
    config = write_pipeline(tmp_path, sample_file, tiny_llama, tiny_bert)
    assert main(["run", "--config", str(config)]) == 0
    printed = capsys.readouterr().out
    folder = tmp_path / "runs" / "tiny"
    for artefact in ("teacher/dataset_info.json", "student/hf/model.safetensors", "student/export/model.onnx"):
        assert (folder / artefact).is_file(), artefact
    assert (folder / "student/bench/bench.png").is_file() and (folder / "eval/student.trec").is_file()
    summary = json.loads((folder / "summary.json").read_text())
    held_out = json.loads((folder / "student/hf/config.json").read_text())["cis_distill"]["val_queries"]
    assert summary["eval_queries"] == len(held_out) == 1
    assert list(summary["nDCG@10"]) == ["first stage (sample)", "teacher cis", "teacher upr", "student (onnx)"]
    evaluation = json.loads((folder / "eval/eval.json").read_text())
    assert evaluation["qids"] == held_out and set(read_trec_run(folder / "eval/student.trec")) == set(held_out)
    assert set(summary["latency_p50_s"]) == {"200 tokens", "12 candidates"}
    assert "teacher cis" in summary["latency_p50_s"]["200 tokens"]
    assert "nDCG@10 on 1 evaluation query ==" in printed and "faster than the teacher" in printed
    first = stamps(folder)
    assert set(first) == {"teach", "train", "export", "bench", "eval"}

    # Nothing changed: every stage is skipped.
    assert main(["run", "--config", str(config)]) == 0
    assert capsys.readouterr().out.count("up to date") == 5 and stamps(folder) == first

    # A bench option changed: the bench alone reruns; --force reruns a named stage.
    config = write_pipeline(tmp_path, sample_file, tiny_llama, tiny_bert, repeats=1)
    assert main(["run", "--config", str(config), "--force", "eval"]) == 0
    printed = capsys.readouterr().out
    assert "[bench] running" in printed and "[eval] running" in printed and printed.count("up to date") == 3
    after = stamps(folder)
    assert after["bench"] != first["bench"] and after["teach"] == first["teach"] and after["train"] == first["train"]
    assert all(cell["n"] == 1 for cell in json.loads((folder / "student/bench/bench.json").read_text())["cells"])


def test_pipeline_config_errors_name_the_file_and_key(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "teach": {}, "train": {}, "exprot": {}}))
    assert main(["run", "--config", str(path)]) == 2
    assert f"{path}: unknown section(s) ['exprot']" in capsys.readouterr().err
    path.write_text(yaml.safe_dump({"name": "x", "teach": {}, "train": {}, "eval": {"backend": "onnx", "qrel": 1}}))
    assert main(["run", "--config", str(path)]) == 2
    assert f"{path}: eval: unknown option(s) ['qrel']" in capsys.readouterr().err
    path.write_text(yaml.safe_dump({"name": "x", "train": {}}))
    assert main(["run", "--config", str(path)]) == 2
    assert "missing 'teach'" in capsys.readouterr().err
    path.write_text(yaml.safe_dump({"name": "x", "teach": "nope.yaml", "train": {}}))
    with pytest.raises(InputError, match=r"no such config file nope\.yaml"):
        load_pipeline(path)
