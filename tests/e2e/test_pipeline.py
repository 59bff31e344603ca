"""``distill run``: the whole pipeline on tiny models and real DL19 candidates, its skipping and its summary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
import yaml

from distill.cli import main
from distill.core.interpolation import interpolate
from distill.core.student_card import StudentCard
from distill.data.loaders import load_candidates
from distill.eval.trec_runs import read_trec_run
from distill.pipeline import load_pipeline
from distill.serving.reranker import Reranker
from tests.conftest import DL19_QRELS, REPO


def write_pipeline(
    tmp_path: Path, sample_file: Path, tiny_llama: Path, tiny_bert: Path, val_queries: int = 1, **bench
) -> Path:
    qrels = tmp_path / "train-qrels.txt"  # the train file's own copy, which a test may edit
    if not qrels.exists():
        shutil.copyfile(DL19_QRELS, qrels)
    train = {
        "model": {"backbone": str(tiny_bert), "lr": 1e-3},
        "data": {"label": "cis", "qrels": str(qrels), "val_queries": val_queries, "batch_size": 8, "max_length": 128},
        "trainer": {"max_epochs": 1, "accelerator": "cpu", "devices": 1, "enable_progress_bar": False},
        "wandb_mode": "disabled",
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(train))
    own = tmp_path / "input.json"  # the pipeline's own copy, which a test may edit
    if not own.exists():
        shutil.copyfile(sample_file, own)
    sample_file = own
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
        "train": {"config": [str(tmp_path / "train.yaml")], "model": {"warmup_ratio": 0.0}},
        "export": {"formats": ["onnx", "torchscript"], "int8": False, "parity_queries": 1, "parity_depth": 8},
        "bench": {
            "input": str(sample_file),
            "token_counts": [200],
            "rerank_queries": 1,
            "repeats": 2,
            "matmul_size": 256,
            "backends": ["onnx-fp32"],  # one student backend: what the pipeline does with a bench, not each backend
            "quality": False,
            **bench,
        },
        "rerank": {"backend": "onnx"},
        "fuse": True,
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
    fused = "student (onnx) fused with the first stage"
    assert list(summary["nDCG@10"]) == ["teacher/first_stage", "teacher/cis", "teacher/upr", "student (onnx)", fused]
    evaluation = json.loads((folder / "eval/eval.json").read_text())
    student = str(folder / "eval/student.trec")
    assert set(evaluation["per_query"][student]["nDCG@10"]) == set(held_out)
    assert set(read_trec_run(folder / "eval/student.trec")) == set(held_out)
    # fuse: the student's scores fused with the first stage's by the α its card chose on the validation queries
    (alpha,) = StudentCard.find(folder / "student/export").alphas().values()
    (query,) = [c for c in load_candidates(sample_file).candidates if c.query.qid == held_out[0]]
    alone = Reranker.load(folder / "student/export", backend="onnx", interpolation=False)  # the run file's rounding
    scores = alone.score(query.query.text, [p.text for p in query.passages])  # would swamp the tiny model's spread
    expected = interpolate(scores, np.asarray(query.scores), held_out * len(scores), alpha)
    together = read_trec_run(folder / "eval/student-fused.trec")[held_out[0]]
    np.testing.assert_allclose([together[p.docid] for p in query.passages], expected, atol=1e-4, rtol=0)
    assert f"interpolated with the first stage (alpha {alpha:g})" in printed
    assert set(summary["latency_p50_s"]) == {"200 tokens", "12 candidates"}
    assert "teacher cis" in summary["latency_p50_s"]["200 tokens"]
    benched = json.loads((folder / "student/bench/bench.json").read_text())
    assert benched["config"]["teacher"] == str(tiny_llama)  # timed against the teacher it learnt from
    assert "nDCG@10 on 1 evaluation query ==" in printed and "faster than the teacher" in printed
    first = stamps(folder)
    assert set(first) == {"teach", "train", "export", "bench", "rerank", "eval"}

    # Nothing changed: every stage is skipped.
    assert main(["run", "--config", str(config)]) == 0
    assert capsys.readouterr().out.count("up to date") == 6 and stamps(folder) == first

    # The train stage stopped before it finished (preempted): the rerun resumes its run, nothing is wiped; the
    # stages after it, which read the student it saved, run again.
    kept = folder / "student" / "checkpoints" / "last.ckpt"
    before = kept.stat().st_mtime_ns
    (folder / "stages" / "train.json").unlink()
    assert main(["run", "--config", str(config)]) == 0
    printed = capsys.readouterr().out
    assert "[train] resuming the interrupted run" in printed and printed.count("up to date") == 1
    assert "[export] running" in printed and "[eval] running" in printed
    assert kept.stat().st_mtime_ns == before
    assert json.loads(stamps(folder)["train"])["key"] == json.loads(first["train"])["key"]
    first = stamps(folder)

    # A bench option changed: the bench alone reruns; --force reruns a named stage.
    config = write_pipeline(tmp_path, sample_file, tiny_llama, tiny_bert, repeats=1)
    assert main(["run", "--config", str(config), "--force", "eval"]) == 0
    printed = capsys.readouterr().out
    assert "[bench] running" in printed and "[eval] running" in printed and printed.count("up to date") == 4
    after = stamps(folder)
    assert after["bench"] != first["bench"] and after["teach"] == first["teach"] and after["train"] == first["train"]
    assert all(cell["n"] == 1 for cell in json.loads((folder / "student/bench/bench.json").read_text())["cells"])

    # The teacher's input edited in place: every stage runs again, the teacher's folder replaced (it was "up to date",
    # and then its labels stale in every later stage).
    edited = json.loads(sample_file.read_text())
    edited[0]["hits"][0]["content"] = "an edited passage about fleas"
    Path(config_input(config)).write_text(json.dumps(edited))
    assert main(["run", "--config", str(config)]) == 0
    assert "up to date" not in capsys.readouterr().out
    texts = set(datasets.load_from_disk(str(folder / "teacher")).to_pandas().passage)
    assert "an edited passage about fleas" in texts

    # A file that the train section's YAML file names (its qrels) edited: train and the stages after it rerun.
    qrels = tmp_path / "train-qrels.txt"
    qrels.write_text("".join(line for line in qrels.read_text().splitlines(keepends=True) if int(line.split()[3])))
    assert main(["run", "--config", str(config)]) == 0
    printed = capsys.readouterr().out
    assert "[teach] up to date" in printed and "[train] running" in printed and "[eval] running" in printed

    # A train option that only the data can refuse (more validation queries than there are): the student trained
    # before is kept, and the summary, with the run's one line.
    student = (folder / "student/hf/model.safetensors").read_bytes()
    config = write_pipeline(tmp_path, sample_file, tiny_llama, tiny_bert, val_queries=50, repeats=1)
    assert main(["run", "--config", str(config)]) == 2
    assert "data.val_queries=50: cannot pick that many" in one_line_error(capsys)
    assert (folder / "student/hf/model.safetensors").read_bytes() == student
    assert (folder / "student/export/model.onnx").is_file() and (folder / "summary.json").is_file()

    # A training that fails once begun (it diverges) puts the earlier student back (it was deleted first), and the
    # next run of that config replaces it again rather than resuming it under the new options.
    config = write_pipeline(tmp_path, sample_file, tiny_llama, tiny_bert, repeats=1)
    diverging = yaml.safe_load(config.read_text())
    diverging["train"]["model"]["lr"] = 1e30
    config.write_text(yaml.safe_dump(diverging))
    for _ in range(2):
        assert main(["run", "--config", str(config)]) == 2
        assert "training diverged" in capsys.readouterr().err
        assert (folder / "student/hf/model.safetensors").read_bytes() == student
    assert not [p for p in folder.iterdir() if p.name.startswith(".student")]


def config_input(config: Path) -> str:
    return yaml.safe_load(config.read_text())["teach"]["input"]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        ({"exprot": {}}, "{path}: exprot: unknown option (did you mean 'export'?)"),
        ({"teach": {"max_querys": 1}}, "{path}: teach: max_querys: unknown option (did you mean 'max_queries'?)"),
        ({"train": {"model": {"lrr": 0.1}}}, "{path}: train: "),
        ({"export": {"int9": True}}, "{path}: export: int9: unknown option (did you mean 'int8'?)"),
        ({"bench": {"repeets": 2}}, "{path}: bench: repeets: unknown option (did you mean 'repeats'?)"),
        ({"rerank": {"backnd": "onnx"}}, "{path}: rerank: backnd: unknown option (did you mean 'backend'?)"),
        ({"eval": {"qrel": "x"}}, "{path}: eval: qrel: unknown option (did you mean 'qrels'?)"),
        ({"eval": {"test": "z"}}, "{path}: eval: test: expected 't' | 'randomization', got 'z'"),
        ({"bench": {"repeats": "many"}}, "{path}: bench: repeats: expected int, got 'many'"),
        ({"name": None}, "{path}: name: missing"),
        ({"name": "../../escape"}, "{path}: name: '../../escape' must be one folder name"),
        ({"name": ".."}, "{path}: name: '..' must be one folder name"),
        ({"teach": {"input": None}}, "{path}: teach: input is required"),  # a stage's own check, named too
        ({"teach": "nope.yaml"}, "nope.yaml: config file not found"),
        ({"train": {"config": 5}}, "{path}: train: config: expected a YAML file's path or a list of them, got 5"),
        # found only once training began, after the teacher had run and the earlier student had been removed
        ({"train": {"data": {"batch_size": -8}}}, "{path}: train: data.batch_size: must be positive, got -8"),
        ({"train": {"wandb_mode": "disabld"}}, "{path}: train: wandb_mode: 'disabld' is not one of offline, online,"),
        ({"train": {"run_name": "mine"}}, "{path}: train: run_name: the pipeline trains into "),  # ignored silently
        ({"train": {"config": ["a.yaml", 5]}}, "{path}: train: config: expected a YAML file's path or a list of"),
        # found only once the stages before theirs had run (a fresh pipeline: teach, train, export, bench)
        ({"bench": {"backends": ["onnx-fp33"]}}, "{path}: bench: --backends: unknown ['onnx-fp33']; choose from"),
        ({"eval": {"metrics": ["nDCG@1O"]}}, "{path}: eval: metrics: unknown"),
        ({"export": {"parity_input": "nowhere.json"}}, "export: parity_input: nowhere.json: "),
        # configs/paper.yaml on a CPU machine: teach, train, export and bench ran first
        pytest.param(
            {"rerank": {"device": "cuda"}},
            "{path}: rerank: device cuda: torch sees 0 GPU(s) here",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU"),
        ),
        # a GPU train config on a CPU machine: found once the teacher had run
        pytest.param(
            {"train": {"trainer": {"accelerator": "gpu"}}},
            "{path}: train: trainer.accelerator: gpu, but torch ",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU"),
        ),
    ],
)
def test_pipeline_config_errors_are_one_line_naming_the_file_and_key(
    tmp_path: Path, sample_file: Path, capsys, sections: dict, expected: str
) -> None:
    train = tmp_path / "train.yaml"
    train.write_text(yaml.safe_dump({"model": {"backbone": "all-minilm-l6-v2"}, "data": {"label": "cis"}}))
    config = {
        "name": "x",
        "root": str(tmp_path / "runs"),
        "teach": {"input": str(sample_file), "qrels": str(DL19_QRELS)},
        "train": {"config": [str(train)]},
    }
    for key, value in sections.items():
        if value is None:
            config.pop(key)
        elif isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", "--config", str(path)]) == 2
    assert expected.format(path=path) in one_line_error(capsys)
    assert not (tmp_path / "runs").exists()  # nothing ran


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        # found only once the teacher had run, when the train stage loaded it
        ({"train": {"model": {"backbone": "all-minilm-l6-v3"}}}, "train: model.backbone: cannot find model"),
        # found only once the teacher, the training and the export had run
        ({"bench": {"teacher": "smollm2-135"}}, "bench: teacher: cannot find model 'smollm2-135'"),
    ],
)
def test_a_later_stages_model_that_cannot_be_had_is_refused_before_the_first_stage(
    tmp_path: Path, sample_file: Path, capsys, sections: dict, expected: str
) -> None:
    from distill.pipeline import check_inputs

    train = {"model": {"backbone": "all-minilm-l6-v2"}, "data": {"label": "cis"}}
    teach = {"input": str(sample_file), "qrels": str(DL19_QRELS)}
    config = {"name": "x", "root": str(tmp_path / "runs"), "teach": teach, "train": train, **sections}
    config["train"] = {**train, "model": {**train["model"], **sections.get("train", {}).get("model", {})}}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"distill run: error: {expected}") and "HF_HUB_OFFLINE is set" in err, err
    assert "Traceback" not in err and not (tmp_path / "runs").exists()  # nothing ran
    # random weights in an embedded architecture's shapes, and a bench of the students alone, load no model
    config["train"]["model"].update(backbone="bert-large-uncased", random_init=True)
    for bench in ({"teacher": "none"}, {"random_weights": True}, {"random_weights": True, "teacher": "tiny-llama"}):
        config["bench"] = bench
        path.write_text(yaml.safe_dump(config))
        check_inputs(load_pipeline(path))


def test_a_pipeline_without_optional_sections_takes_their_defaults(tmp_path: Path, sample_file: Path) -> None:
    path = tmp_path / "pipeline.yaml"
    train = {"model": {"backbone": "all-minilm-l6-v2"}}
    teach = {"input": str(sample_file), "qrels": str(DL19_QRELS)}
    path.write_text(yaml.safe_dump({"name": "x", "root": str(tmp_path), "teach": teach, "train": train}))
    pipeline = load_pipeline(path)
    assert pipeline.export.int8 is False and pipeline.export.parity_queries == 3  # ExportConfig's defaults
    assert pipeline.rerank.backend == "auto" and pipeline.rerank.input == [str(sample_file)]
    assert pipeline.eval.qrels == str(DL19_QRELS) and pipeline.eval.held_out == str(tmp_path / "x" / "student")
    assert pipeline.bench.output == str(tmp_path / "x" / "student" / "bench")
    assert pipeline.export.parity_input == str(sample_file)  # the candidates it reranks, with their texts
    # the student is validated on the teacher's judged queries (without: on spearman, and export found no judged
    # validation query, after teach and train had run)
    assert pipeline.train_joined["data"] == {
        "teacher_data": [str(tmp_path / "x" / "teacher")],
        "qrels": str(DL19_QRELS),
    }
    path.write_text(
        yaml.safe_dump({"name": "x", "root": str(tmp_path), "teach": teach, "train": {"data": {"qrels": "a"}}})
    )
    assert "qrels" not in load_pipeline(path).train_joined["data"]  # the train config's own


def test_a_trec_run_teach_input_is_reranked_with_its_queries_and_corpus(tmp_path: Path) -> None:
    """Teach's TREC run reaches rerank with the queries and corpus it needs (rerank failed on it after teach and
    train had run); export's parity set, which takes candidates with their texts, is then the default one."""
    files = {name: tmp_path / name for name in ("bm25.trec", "queries.tsv", "corpus.tsv", "qrels.txt")}
    for file in files.values():
        file.write_text("")
    teach = {"input": [str(files["bm25.trec"])], "queries": str(files["queries.tsv"])}
    teach |= {"corpus": str(files["corpus.tsv"]), "qrels": str(files["qrels.txt"])}
    path = tmp_path / "pipeline.yaml"
    sections = {"teach": teach, "train": {"model": {"backbone": "all-minilm-l6-v2"}}}
    path.write_text(yaml.safe_dump({"name": "x", "root": str(tmp_path), **sections}))
    pipeline = load_pipeline(path)
    assert pipeline.rerank.input == teach["input"] and pipeline.export.parity_input is None
    assert (pipeline.rerank.queries, pipeline.rerank.corpus) == (teach["queries"], teach["corpus"])
    own = {"input": str(files["bm25.trec"]), "queries": str(files["queries.tsv"]), "corpus": str(files["corpus.tsv"])}
    path.write_text(yaml.safe_dump({"name": "x", "root": str(tmp_path), **sections, "rerank": own}))
    assert load_pipeline(path).rerank.queries == own["queries"]  # a rerank section's own, as given


def test_the_paper_pipeline_learns_its_own_teachers_labels_judged_by_its_inputs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """configs/paper.yaml (Llama-3-8B on DL19 and DL20 from ir_datasets): read and checked without a download, its
    later stages' models in the hub cache; its student learns the pipeline's teacher output, not bert-large.yaml's
    committed labels, and the inputs' qrels judge its validation and evaluation."""
    import huggingface_hub

    from distill.data.loaders.irds import is_irds
    from distill.pipeline import check_inputs

    for repo in ("models--bert-large-uncased", "models--meta-llama--Meta-Llama-3-8B"):  # the later stages' models
        (tmp_path / repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
        (tmp_path / repo / "snapshots" / ("0" * 40) / "config.json").write_text("{}")
        (tmp_path / repo / "refs").mkdir()
        (tmp_path / repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(REPO)
    pipeline = load_pipeline("configs/paper.yaml")
    inputs = pipeline.teach.input
    assert len(inputs) == 2 and all(is_irds(i) for i in inputs)
    assert pipeline.teach.qrels is None and pipeline.eval.qrels == inputs == pipeline.train["data"]["qrels"]
    assert pipeline.train["data"]["teacher_data"] == [str(pipeline.teach.output)]
    check_inputs(pipeline)


def test_a_method_slower_than_the_teacher_is_said_to_be_slower() -> None:
    """The summary said "0.7x faster than the teacher" of a student slower than it."""
    from distill.pipeline import _against

    assert _against(2.5).strip() == "2.5x faster than" and _against(0.5).strip() == "2.0x slower than"


def test_run_takes_one_pipeline_file(tmp_path: Path, capsys) -> None:
    """``--config a.yaml --config b.yaml`` ran b.yaml alone: a.yaml's ``fuse: true`` was dropped without a word."""
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    for path in (first, second):
        path.write_text("name: x\n")
    assert main(["run", "--config", str(first), "--config", str(second)]) == 2
    assert one_line_error(capsys) == (
        "distill run: error: --config given twice: it names one file here, not YAML files to compose\n"
    )
