"""Progress as log lines, for training written to a file (where a progress bar shows nothing until it ends)."""

from __future__ import annotations

import sys
import time
from typing import Any

from pytorch_lightning import Callback, LightningModule, Trainer


class LogProgress(Callback):
    """Every ``every_seconds`` of training (and at the end of each epoch), one line on stderr from the global-zero
    rank: epoch, batch of the epoch, global step, the training loss, samples/s and the epoch's time left.

    Args:
        every_seconds: wall-clock seconds between lines.
    """

    def __init__(self, every_seconds: float = 60.0) -> None:
        self.every_seconds = every_seconds
        self._last = 0.0
        self._epoch_start = 0.0
        self._done = 0
        """Batches of this epoch done: fewer than the epoch's where ``trainer.max_steps`` ends it early."""
        self._first: int | None = None
        """The epoch's first batch this process trained (past 0 on a resumed run): the time left counts from it."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # a run resumed mid-epoch starts here, at a batch past 0, with no epoch start of its own
        self.on_train_epoch_start(trainer, pl_module)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epoch_start = self._last = time.monotonic()
        self._done = 0
        self._first = None

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._first is None:
            self._first = batch_idx
        self._done = batch_idx + 1
        now = time.monotonic()
        if now - self._last >= self.every_seconds:
            self._last = now
            self._print(trainer, batch_idx + 1, now)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._print(trainer, self._done, time.monotonic())

    def _print(self, trainer: Trainer, done: int, now: float) -> None:
        if not trainer.is_global_zero:
            return
        total = trainer.num_training_batches
        metrics = trainer.callback_metrics
        parts = [f"epoch {trainer.current_epoch}", f"batch {done}/{total}", f"step {trainer.global_step}"]
        for key, label in (("train/loss", "loss"), ("train/samples_per_s", "samples/s")):
            if key in metrics:
                parts.append(f"{label} {float(metrics[key]):.4g}")
        elapsed, trained = now - self._epoch_start, done - (self._first or 0)
        if trained > 0 and done < total:
            parts.append(f"epoch left {elapsed / trained * (total - done) / 60:.1f} min")
        print("train: " + ", ".join(parts), file=sys.stderr, flush=True)
