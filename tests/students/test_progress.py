"""The training progress lines of a run written to a log file."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from students import progress
from students.progress import LogProgress


def test_a_run_resumed_mid_epoch_counts_the_time_left_from_its_own_batches(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Resumed at batch 3 of 354, the line said "epoch left 62434.5 min": the machine's uptime over 4 batches."""
    clock = iter([1000.0, 1010.0, 1020.0])  # the run starts; batch 3 ends 10 s later; batch 4 another 10 s
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    trainer = SimpleNamespace(
        is_global_zero=True, num_training_batches=354, callback_metrics={}, current_epoch=0, global_step=4
    )
    bar = LogProgress(every_seconds=15)
    bar.on_train_start(trainer, None)  # Lightning starts no epoch on a mid-epoch resume
    bar.on_train_batch_end(trainer, None, None, None, 3)
    bar.on_train_batch_end(trainer, None, None, None, 4)
    line = capsys.readouterr().err
    # 2 batches in 20 s: 349 left take 3490 s
    assert line == "train: epoch 0, batch 5/354, step 4, epoch left 58.2 min\n"
