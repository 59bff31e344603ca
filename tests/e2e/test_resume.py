"""``distill train`` survives kill -9 and preemption signals: a run interrupted any number of times and
resumed with ``--ckpt_path last`` ends with exactly the weights of an uninterrupted run (subprocesses, tiny
BERT, a checkpoint every optimiser step)."""

from __future__ import annotations

import csv
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from distill.core.schema import EXIT_INTERRUPTED
from students.checkpointing import CTRL_C_NOTICE, EXIT_PREEMPTED
from tests.conftest import built_once
from tests.distill.stages.test_train import _subprocess_env, write_config

pytestmark = pytest.mark.slow
TIMEOUT_S = 600


def resumable_config(tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, devices: int) -> Path:
    """3 epochs of 24 training pairs in batches of 2: 12 steps an epoch on one rank, 6 on two; a
    checkpoint after every optimiser step."""
    trainer = {"max_epochs": 3, "deterministic": True, "devices": devices}
    if devices > 1:
        trainer["strategy"] = "ddp"
    path = write_config(tmp_path, tiny_bert, teacher_dataset, **trainer)
    config = yaml.safe_load(path.read_text())
    config["data"]["batch_size"] = 2
    config["checkpointing"] = {"every_minutes": None, "every_n_steps": 1}
    path.write_text(yaml.safe_dump(config))
    return path


def command(config: Path, run_name: str) -> list[str]:
    return [sys.executable, "-m", "distill", "train", "--config", str(config), "--run_name", run_name]


def start(args: list[str], log: Path) -> subprocess.Popen:
    """The run in a session of its own (its DDP ranks included), its output appended to ``log``; Ctrl-C's SIGINT
    reaches it as it reaches a command started from a terminal, even where pytest's worker ignores it."""
    with log.open("a") as out:
        return subprocess.Popen(
            args,
            env=_subprocess_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )


def wait_group(proc: subprocess.Popen) -> int:
    """Wait for ``proc`` and for every process of its session (the other DDP ranks) to end."""
    code = proc.wait(TIMEOUT_S)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return code
        time.sleep(0.05)
    raise AssertionError("a rank outlived rank 0 by a minute")


def saved_steps(log: Path, offset: int) -> list[int]:
    """The steps of the checkpoints that the run's log reports after its first ``offset`` bytes."""
    with log.open() as f:
        f.seek(offset)
        return [int(s) for s in re.findall(r"saved \S+last\.ckpt \(epoch \d+, step (\d+)\)", f.read())]


def wait_for_step(proc: subprocess.Popen, step: int, log: Path, offset: int) -> None:
    """Until the run, whose output starts at byte ``offset`` of ``log``, has saved a checkpoint of its own and
    that of optimiser step ``step`` or later; fails if it ends first."""
    deadline = time.monotonic() + TIMEOUT_S
    while not (steps := saved_steps(log, offset)) or steps[-1] < step:
        assert proc.poll() is None, f"the run ended ({proc.returncode}) before step {step}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no checkpoint of step {step}"
        time.sleep(0.02)


def final_checkpoint(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)


def best_score(checkpoint: dict) -> float:
    """The best validation score so far, as the checkpoint's best.ckpt callback holds it."""
    (state,) = [v for k, v in checkpoint["callbacks"].items() if k.startswith("AtomicModelCheckpoint")]
    return float(state["best_model_score"])


def assert_same_weights(run: Path, reference: Path) -> None:
    ours, theirs = final_checkpoint(run), final_checkpoint(reference)
    assert best_score(ours) == best_score(theirs)
    ours, theirs = ours["state_dict"], theirs["state_dict"]
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), [k for k in ours if not torch.equal(ours[k], theirs[k])]
    from safetensors.torch import load_file

    ours, theirs = load_file(run / "hf" / "model.safetensors"), load_file(reference / "hf" / "model.safetensors")
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def losses(run: Path) -> list[tuple[str, str]]:
    """(step, train/loss) of every training row of the run's metrics.csv."""
    with (run / "logs" / "metrics.csv").open() as f:
        return [(r["step"], r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]


def assert_metrics_logged_once(run: Path, reference: Path, kills: int) -> None:
    """Each step's training row at most once and with the uninterrupted run's loss; a kill may lose the row
    of the step it came just after (logged after that step's checkpoint, flushed before the next step)."""
    ours, theirs = losses(run), losses(reference)
    assert len({step for step, _ in ours}) == len(ours) and set(ours) <= set(theirs)
    assert len(theirs) - len(ours) <= kills


def reference_run(root: Path, tiny_bert: Path, teacher_dataset: Path, devices: int) -> tuple[Path, Path]:
    """An uninterrupted run on ``devices`` ranks, in ``root`` (a new folder), built once a run by the first
    pytest-xdist worker to ask (:func:`tests.conftest.built_once`): its config and its folder. A test writes its own
    runs beside it, each under a run name of its own."""

    def build(out: Path) -> None:
        out.mkdir()
        config = resumable_config(out, tiny_bert, teacher_dataset, devices)
        done = subprocess.run(command(config, "reference"), env=_subprocess_env(), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]

    built_once(root, build)
    return root / "train.yaml", root / "runs" / "reference"


@pytest.fixture(scope="module")
def reference(run_folder: Path, tiny_bert: Path, teacher_dataset: Path) -> tuple[Path, Path]:
    return reference_run(run_folder / "reference", tiny_bert, teacher_dataset, devices=1)


def interrupt_and_resume(config: Path, run: Path, signals: list[signal.Signals], epoch_steps: int, seed: int) -> str:
    """Run, stop the run with each of ``signals`` in turn, resume it each time with ``--ckpt_path last``, and
    let the last resumption finish; returns the log of all the processes.

    Each stop but the last comes at a random moment (in a step, a save, a validation, between epochs) a little
    after the checkpoint of a random step of the first two epochs (of ``epoch_steps`` steps each). The last
    comes at once after the checkpoint of the second epoch's last step, taken after its validation: a run
    resumed from there must know that epoch's best score. SIGKILL kills every process of the run at once, as
    a lost node does; SIGTERM, SIGUSR1 and SIGINT (Ctrl-C) go to rank 0 only.
    """
    rng = random.Random(seed)
    log = run.parent / f"{run.name}.log"
    args = [*command(config, run.name), "--ckpt_path", "last"]
    steps = [*sorted(rng.sample(range(1, 2 * epoch_steps), len(signals) - 1)), 2 * epoch_steps]
    for signum, step in zip(signals, steps, strict=True):
        offset = log.stat().st_size if log.exists() else 0
        proc = start(args, log)
        wait_for_step(proc, step, log, offset)
        time.sleep(rng.uniform(0, 0.2) if step < 2 * epoch_steps else 0)
        assert proc.poll() is None, f"the run ended before {signum.name}: make it longer"
        if signum == signal.SIGKILL:
            os.killpg(proc.pid, signal.SIGKILL)
            wait_group(proc)
        else:
            proc.send_signal(signum)
            expected = EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_PREEMPTED
            assert wait_group(proc) == expected, log.read_text()[-3000:]
            assert not (run / "hf").exists()  # no export of a half-trained run
    final = start(args, log)
    assert wait_group(final) == 0, log.read_text()[-3000:]
    return log.read_text()


def test_kill_9_at_random_moments_then_resume_gives_the_uninterrupted_weights(
    tmp_path: Path, reference: tuple[Path, Path]
) -> None:
    config, reference_dir = reference
    run = config.parent / "runs" / "killed"
    log = interrupt_and_resume(config, run, [signal.SIGKILL] * 2, epoch_steps=12, seed=13)
    assert log.count("--ckpt_path last: no checkpoint in") == 1  # the first start only
    assert log.count("resumed at epoch") == 2
    assert_same_weights(run, reference_dir)
    assert_metrics_logged_once(run, reference_dir, kills=2)


def test_sigterm_and_ctrl_c_save_exit_75_and_130_and_resume_exactly(
    tmp_path: Path, reference: tuple[Path, Path]
) -> None:
    config, reference_dir = reference
    run = config.parent / "runs" / "preempted"
    signals = [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1]
    log = interrupt_and_resume(config, run, signals, epoch_steps=12, seed=7)
    assert "stopped by SIGTERM" in log and "stopped by SIGUSR1" in log and "stopped by SIGINT" in log
    assert log.count(CTRL_C_NOTICE) == 1
    assert_same_weights(run, reference_dir)
    assert losses(run) == losses(reference_dir)  # each step's row once, with the uninterrupted run's loss


def test_a_run_stopped_by_max_steps_mid_epoch_resumes_that_epoch_exactly(
    tmp_path: Path, reference: tuple[Path, Path]
) -> None:
    """``trainer.max_steps`` ends a run in the middle of its second epoch; resumed with ``--ckpt_path last`` and no
    step limit, it goes on at the next batch of that epoch and trains every batch of the three epochs once (it went on
    with the next epoch, the rest of this one never trained on: 29 steps). Its weights are not the uninterrupted
    run's: its learning-rate schedule was laid out for 17 steps."""
    config, _ = reference
    run = config.parent / "runs" / "max-steps"
    log = tmp_path / "train.log"
    stopped = ["--trainer.max_steps", "17", "--checkpointing.every_n_steps", "5"]  # step 17: no periodic save
    assert wait_group(start([*command(config, "max-steps"), *stopped], log)) == 0
    assert saved_steps(log, 0)[-1] == 17
    resumed = [*command(config, "max-steps"), "--ckpt_path", "last", "--trainer.max_steps", "-1"]
    offset = log.stat().st_size
    assert wait_group(start(resumed, log)) == 0, log.read_text()[-3000:]
    assert "resumed at epoch 1, batch 5, step 17" in log.read_text()[offset:]
    final = final_checkpoint(run)
    assert (final["epoch"], final["global_step"]) == (2, 36)
    with (run / "logs" / "metrics.csv").open() as f:
        epochs = {int(r["step"]): int(r["epoch"]) for r in csv.DictReader(f) if r.get("train/loss")}
    assert {epochs[step] for step in range(17, 23)} == {1}  # the steps after the stop: still the second epoch


def test_ddp_kill_9_and_sigterm_to_rank_0_resume_exactly(tmp_path: Path, ddp_reference: tuple[Path, Path]) -> None:
    config, reference_dir = ddp_reference
    run = config.parent / "runs" / "killed"
    log = interrupt_and_resume(config, run, [signal.SIGKILL, signal.SIGTERM], epoch_steps=6, seed=3)
    assert log.count("stopped by SIGTERM") == 1  # rank 0's message; rank 1 stopped with it
    assert_same_weights(run, reference_dir)
    assert_metrics_logged_once(run, reference_dir, kills=1)
