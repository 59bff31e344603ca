"""The parts of :mod:`students.checkpointing` that need no training run: atomic writes, finding the last
checkpoint, metrics that survive a resumption; and, in-process, the timed saves."""

from __future__ import annotations

import csv
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from distill.cli import main
from students.checkpointing import RESUME_KEY, AtomicModelCheckpoint, atomic_save, find_last
from students.csv_logger import ResumableCSVLogger
from tests.distill.stages.test_train import write_config

RANK_0 = SimpleNamespace(is_global_zero=True, strategy=SimpleNamespace(barrier=lambda name: None))


def test_atomic_save_publishes_a_file_only_when_it_is_whole(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    with atomic_save(RANK_0, path) as tmp:
        tmp.write_text("step 1")
    with pytest.raises(RuntimeError), atomic_save(RANK_0, path) as tmp:
        tmp.write_text("step 2, half written")
        raise RuntimeError("killed while writing")
    assert path.read_text() == "step 1" and find_last(tmp_path) == path
    with atomic_save(RANK_0, path) as tmp:
        tmp.write_text("step 3")
    assert path.read_text() == "step 3"
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # the half-written one is gone


def test_atomic_save_swaps_folders_and_find_last_falls_back_on_the_old_one(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    assert find_last(tmp_path) is None
    for step in (1, 2):
        with atomic_save(RANK_0, path) as tmp:  # a DeepSpeed checkpoint: a folder of shards
            tmp.mkdir()
            (tmp / "shard").write_text(f"step {step}")
    assert (path / "shard").read_text() == "step 2" and [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    old = tmp_path / ".last.ckpt.old"
    path.rename(old)  # killed between renaming the old folder aside and the new one in
    assert find_last(tmp_path) == old
    with atomic_save(RANK_0, path) as tmp:
        tmp.mkdir()
        (tmp / "shard").write_text("step 3")
    assert (path / "shard").read_text() == "step 3" and [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_csv_logger_keeps_the_rows_before_the_step_a_run_resumes_at(tmp_path: Path) -> None:
    def rows() -> list[tuple[str, str]]:
        with (tmp_path / "logs" / "metrics.csv").open() as f:
            return [(r["step"], r["train/loss"]) for r in csv.DictReader(f)]

    killed = ResumableCSVLogger(tmp_path, name="logs", version="")
    for step in range(5):
        killed.log_metrics({"train/loss": step / 10}, step)
    killed.save()  # then killed; its checkpoint was taken after step 2
    resumed = ResumableCSVLogger(tmp_path, name="logs", version="")
    resumed.experiment  # noqa: B018 (Lightning creates the writer when the run starts)
    assert len(rows()) == 5  # a kill before the resumed run's first step loses nothing
    for step in (3, 4, 5):
        resumed.log_metrics({"train/loss": step}, step)
    resumed.save()
    assert rows() == [("0", "0.0"), ("1", "0.1"), ("2", "0.2"), ("3", "3"), ("4", "4"), ("5", "5")]
    fresh = ResumableCSVLogger(tmp_path, name="logs", version="")  # a new run in the same folder
    fresh.log_metrics({"train/loss": 7}, 0)
    fresh.save()
    assert rows() == [("0", "7")]


def test_timed_saves_and_the_signal_handlers_restored_after_fit(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, caplog
) -> None:
    before = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)]
    path = write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=1)
    args = ["train", "--config", str(path), "--checkpointing.every_minutes", "1e-9"]  # at every step
    assert main(args) == 0
    saved = [r.getMessage() for r in caplog.records if r.getMessage().startswith("saved")]
    assert [s.split("(")[1].split(")")[0] for s in saved] == ["epoch 0, step 1", "epoch 0, step 2", "epoch 0, step 3"]
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)] == before


def test_saves_fall_on_optimiser_steps_when_gradients_accumulate(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, caplog
) -> None:
    """12 batches of 2, two to an optimiser step: a save after each step, none in the middle of one."""
    path = write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=1, accumulate_grad_batches=2)
    args = ["train", "--config", str(path), "--data.batch_size", "2", "--checkpointing.every_n_steps", "1"]
    assert main(args) == 0
    saved = [r.getMessage() for r in caplog.records if r.getMessage().startswith("saved")]
    assert [s.split("step ")[1].split(")")[0] for s in saved] == ["1", "2", "3", "4", "5", "6"]
    last = torch.load(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 6 and last[RESUME_KEY]["position"] == (0, 12)


def test_a_validation_saves_last_ckpt_only_when_a_save_is_due(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, caplog
) -> None:
    """3 epochs of 3 steps, a save due every 2 steps: the one due at step 6, which a validation follows, waits for the
    validation's end; the validations after steps 3 and 9 save nothing (a checkpoint of BERT-large and its AdamW state
    is 4 GB); training's end saves step 9."""
    path = write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=3)
    assert main(["train", "--config", str(path), "--checkpointing.every_n_steps", "2"]) == 0
    saved = [r.getMessage() for r in caplog.records if r.getMessage().startswith("saved")]
    assert [s.split("step ")[1].split(")")[0] for s in saved] == ["2", "4", "6", "8", "9"]
    last = torch.load(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 9


def test_a_slurm_requeue_names_the_job_and_a_missing_scontrol_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from students.checkpointing import _requeue_slurm_job

    calls = tmp_path / "calls"
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.parent.mkdir()
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", str(scontrol.parent))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    _requeue_slurm_job()
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "17")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    _requeue_slurm_job()
    assert calls.read_text().splitlines() == ["requeue 4242", "requeue 17_3"]
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # srun's node without scontrol: the save still stands
    with caplog.at_level("WARNING", "students.checkpointing"):
        _requeue_slurm_job()
    assert "scontrol requeue 17_3 failed" in caplog.text


def test_a_resume_in_a_copied_or_moved_run_folder_takes_its_own_checkpoints(tmp_path: Path) -> None:
    """Lightning kept the old folder's absolute best_model_path and dropped the best score: the copy exported the
    original's (retrained) best weights into its hf/, with exit 0; a moved folder failed at the end."""
    old, new = tmp_path / "runA" / "checkpoints", tmp_path / "runB" / "checkpoints"
    saved = AtomicModelCheckpoint(dirpath=old, filename="best", monitor="val/nDCG@10", mode="max")
    saved.best_model_path, saved.best_model_score = str(old / "best.ckpt"), torch.tensor(61.5)
    saved.best_k_models = {str(old / "best.ckpt"): torch.tensor(61.5)}
    saved.last_model_path = str(old / "last.ckpt")
    saved.kth_best_model_path, saved.kth_value = str(old / "best.ckpt"), torch.tensor(61.5)
    state = saved.state_dict()
    new.mkdir(parents=True)
    (new / "best.ckpt").write_bytes(b"")  # the copy's
    resumed = AtomicModelCheckpoint(dirpath=new, filename="best", monitor="val/nDCG@10", mode="max")
    resumed.load_state_dict(state)
    assert resumed.best_model_path == str(new / "best.ckpt") and float(resumed.best_model_score) == 61.5
    assert list(resumed.best_k_models) == [str(new / "best.ckpt")] and resumed.last_model_path == str(new / "last.ckpt")
    same = AtomicModelCheckpoint(dirpath=old, filename="best", monitor="val/nDCG@10", mode="max")
    same.load_state_dict(state)  # resumed where it was saved: as Lightning loads it
    assert same.best_model_path == str(old / "best.ckpt") and float(same.best_model_score) == 61.5
    # Another run's checkpoint resumed in a new run folder (--ckpt_path runA/checkpoints/best.ckpt): its best is not
    # there, and ended in a FileNotFoundError where the new run has not validated; the new run's first validation,
    # whatever its score, is its best.
    other = AtomicModelCheckpoint(dirpath=tmp_path / "runC", filename="best", monitor="val/nDCG@10", mode="max")
    other.load_state_dict(state)
    assert (other.best_model_path, other.best_model_score, other.best_k_models) == ("", None, {})
    assert float(other.kth_value) == -float("inf")


def test_a_ctrl_c_during_validation_is_acknowledged_within_a_validation_batch(tmp_path: Path, caplog) -> None:
    """The notice came at the next optimiser step, a minute into a long validation, and a second Ctrl-C meanwhile
    (the user, unanswered) stopped the run unsaved."""
    from students.checkpointing import CTRL_C_NOTICE, LastCheckpoint

    callback = LastCheckpoint(tmp_path)
    callback._on_ctrl_c(signal.SIGINT, None)
    trainer = SimpleNamespace(is_global_zero=True)
    with caplog.at_level("WARNING", logger="students.checkpointing"):
        callback.on_validation_batch_end(trainer, None, None, None, 0)
        callback.on_validation_batch_end(trainer, None, None, None, 1)
    assert caplog.messages == [CTRL_C_NOTICE] and "(or validation)" in CTRL_C_NOTICE
