"""A CSV logger whose ``metrics.csv`` survives a resumed run (Lightning's deletes the file when a run starts
in a folder that has one)."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from lightning_fabric.loggers.logger import rank_zero_experiment
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter
from pytorch_lightning.utilities.rank_zero import rank_zero_only


class _KeepingWriter(ExperimentWriter):
    """Lightning's CSV writer, except that it leaves an existing ``metrics.csv`` in place."""

    def _check_log_dir_exists(self) -> None:
        """Lightning's deletes ``metrics.csv`` here; :meth:`ResumableCSVLogger.log_metrics` trims it instead."""


class ResumableCSVLogger(CSVLogger):
    """Lightning's ``CSVLogger``, except that a run resumed in the same folder keeps the rows of
    ``metrics.csv`` before the first step it logs itself (Lightning's deletes the file when it starts). The
    rows from that step on are dropped (the resumed run logs them again), atomically, at its first step: a
    kill before then leaves the file as it was."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trimmed = False

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _KeepingWriter(log_dir=self.log_dir)
        return self._experiment

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if not self._trimmed:
            self._trim(len(self.experiment.metrics) if step is None else step)
            self._trimmed = True
        super().log_metrics(metrics, step)

    def _trim(self, first: int) -> None:
        """Keep the rows of ``metrics.csv`` before step ``first`` (none: delete it), and its columns."""
        path = Path(self.experiment.metrics_file_path)
        if not path.is_file():
            return
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            rows = [row for row in reader if int(row["step"]) < first]
            columns = list(reader.fieldnames or [])
        if not rows:
            path.unlink()
            return
        tmp = path.with_name(f".{path.name}.tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, path)
        self.experiment.metrics_keys = columns  # the writer appends rows in the file's column order
