"""Checkpoints that survive preemption: atomic writes, a periodic ``last.ckpt``, exact resumption, and
a clean stop on SIGTERM or SIGUSR1.

A run's ``checkpoints/`` folder holds two checkpoints, each a file (a folder under DeepSpeed):

- ``best.ckpt``: the best by the validation metric (:class:`AtomicModelCheckpoint`);
- ``last.ckpt``: the newest state of the run (:class:`LastCheckpoint`), written every
  ``every_minutes`` of training and every ``every_n_steps`` optimiser steps, when training ends, and
  on a preemption signal. It is replaced, never accumulated.

Both are written by :func:`atomic_save`, so a kill at any moment leaves the previous checkpoint whole.

Resuming from ``last.ckpt`` (``--ckpt_path last``) continues at the next batch as if the run had never
stopped: Lightning restores the weights, the optimiser, the LR schedule, the gradient scaler and the loop
progress (the loggers' step with it); :class:`LastCheckpoint` adds every rank's RNG states
(:mod:`students.rng`) and the sampler's position in the epoch (:meth:`students.sampling.ShardedBatches.resume`),
and :class:`students.csv_logger.ResumableCSVLogger` keeps the metrics logged before the checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from lightning_fabric.plugins.environments import SLURMEnvironment
from pytorch_lightning import LightningModule, Trainer
from pytorch_lightning.callbacks import Checkpoint, ModelCheckpoint
from pytorch_lightning.trainer.states import TrainerFn

from students.rng import gather_rng_states, set_rng_state
from students.sampling import ShardedBatches

log = logging.getLogger(__name__)

LAST = "last.ckpt"
EVERY_MINUTES = 10.0
"""Default minutes of training between two saves of ``last.ckpt``."""
EXIT_PREEMPTED = 75
"""Exit status of a run stopped by SIGTERM or SIGUSR1 after writing ``last.ckpt`` (``EX_TEMPFAIL``: try again)."""
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
CTRL_C_NOTICE = (
    "Ctrl-C: saving last.ckpt at the end of this optimiser step (or validation), then stopping (Ctrl-C again: "
    "stop now, unsaved)"
)
RESUME_KEY = "exact_resume"
"""The checkpoint entry of :class:`LastCheckpoint`: sampler position, world size and every rank's RNG states."""


class Preempted(Exception):
    """Raised on every rank once the checkpoint that a preemption signal asked for is written."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


# ----------------------------------------------------------------------------- atomic writes


def _sibling(path: Path, kind: str) -> Path:
    return path.with_name(f".{path.name}.{kind}")


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_save(trainer: Trainer, path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to save a checkpoint to, then publish it at ``path``: so
    that a kill at any moment leaves either the old checkpoint or the new one there, never a part.

    The saved file, or folder (DeepSpeed: a shard per rank), is flushed to disk (fsync) on every rank, then
    renamed over ``path`` (``os.replace``) by rank 0. A folder cannot be renamed over another: the old one
    is renamed aside to ``.<name>.old`` first (which :func:`find_last` falls back on) and deleted last.
    Enter it on every rank; nothing is published if the body raises.
    """
    tmp, old = _sibling(path, "tmp"), _sibling(path, "old")
    if trainer.is_global_zero:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove(tmp)  # what a killed save left
    trainer.strategy.barrier("atomic_save:clean")
    yield tmp
    if tmp.exists():  # on every rank that can see it (DeepSpeed's shards are written by their own ranks)
        for item in [tmp, *sorted(tmp.rglob("*"))]:
            _fsync(item)
    trainer.strategy.barrier("atomic_save:fsync")
    if trainer.is_global_zero:
        if tmp.is_dir() and path.exists():
            _remove(old)
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync(path.parent)
        _remove(old)
    trainer.strategy.barrier("atomic_save:publish")


def find_last(folder: Path) -> Path | None:
    """The checkpoint ``--ckpt_path last`` resumes from: ``folder/last.ckpt``, or ``.last.ckpt.old`` where a
    kill came between the two renames that publish a folder; None if there is neither."""
    for path in (folder / LAST, _sibling(folder / LAST, "old")):
        if path.exists():
            return path
    return None


class AtomicModelCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint``, each save written by :func:`atomic_save`; resumed in a run folder that was
    copied or moved, its paths are this folder's."""

    def _save_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        with atomic_save(trainer, Path(filepath)) as tmp:
            super()._save_checkpoint(trainer, str(tmp))
        self._last_checkpoint_saved = filepath

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Lightning's, with the checkpoint's paths moved from the folder it was saved in to :attr:`dirpath`: a
        run folder copied or moved keeps its checkpoints where they were in it, and Lightning kept the old
        folder's absolute ``best_model_path`` (another run's weights exported into this run's ``hf/``, or a
        missing file at the end) and dropped the best score (a worse validation became the best). Resumed from
        another run's checkpoint into a new run folder, where its best is not, the run has no best until it
        validates."""
        saved = state_dict.get("dirpath")
        if saved and self.dirpath and saved != self.dirpath:
            state_dict = {
                **state_dict,
                "dirpath": self.dirpath,
                **{key: _moved(state_dict.get(key), saved, self.dirpath) for key in MOVED_PATHS},
                "best_k_models": {
                    _moved(path, saved, self.dirpath): score
                    for path, score in (state_dict.get("best_k_models") or {}).items()
                },
            }
            best = state_dict.get("best_model_path")
            if best and not Path(best).is_file():  # another run's checkpoint, resumed in a new run: its best is
                state_dict = {**state_dict, **self._no_best()}  # not here; this run's first validation is its best
        super().load_state_dict(state_dict)

    def _no_best(self) -> dict[str, Any]:
        """The state of a fresh checkpoint callback (this one, not yet loaded): no best checkpoint, no score."""
        return {"best_model_path": "", "best_model_score": None, "best_k_models": {}, "kth_best_model_path": "",
                "kth_value": self.kth_value}  # fmt: skip


MOVED_PATHS = ("best_model_path", "kth_best_model_path", "last_model_path")
"""The paths in a ``ModelCheckpoint``'s state that name its checkpoint files."""


def _moved(path: str | None, old: str, new: str) -> str | None:
    """``path`` in folder ``new`` where it was in folder ``old``; any other path (or none) as it is."""
    if not path or Path(path).parent != Path(old):
        return path
    return str(Path(new) / Path(path).name)


# ----------------------------------------------------------------------------- the callback


class LastCheckpoint(Checkpoint):
    """Keeps ``<dirpath>/last.ckpt`` the newest state of the run, and stops the run cleanly on preemption.

    ``last.ckpt`` is written by :func:`atomic_save`:

    - at the end of an optimiser step, once ``every_minutes`` minutes have passed since the last save
      (or since training started) and every ``every_n_steps`` optimiser steps (None: not by that measure);
      a save due at a step that Lightning validates after waits for the validation's end, so that a
      resumed run never skips one. A validation saves nothing else: a checkpoint of BERT-large and its
      AdamW state takes as long to write as the training between a GPU run's validations;
    - when training ends;
    - on SIGTERM or SIGUSR1 to any rank, received once training has started: at the end of the current
      optimiser step (or validation), then every rank raises :class:`Preempted` before the next batch. A first
      Ctrl-C (SIGINT) does the same (a second stops at once, unsaved), unless the process was started with it
      ignored.
      Under SLURM, rank 0 first requeues the job on SIGUSR1 (``scontrol requeue``), as Lightning's
      ``SLURMEnvironment`` does. The ranks agree on the signals and on the clock by one small all-reduce an
      optimiser step.

    The checkpoint also holds every rank's RNG states and the sampler's position (epoch, batches consumed),
    which a resumed run restores when training starts. An exact resumption needs the same number of ranks.

    Args:
        dirpath: the run's checkpoint folder.
        every_minutes: minutes of training between saves (None: no time trigger).
        every_n_steps: optimiser steps between saves (None: no step trigger).
    """

    def __init__(
        self, dirpath: str | Path, every_minutes: float | None = EVERY_MINUTES, every_n_steps: int | None = None
    ) -> None:
        if every_minutes is not None and every_minutes <= 0:
            raise ValueError(f"every_minutes must be positive or None, not {every_minutes}")
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps must be at least 1 or None, not {every_n_steps}")
        self.path = Path(dirpath) / LAST
        self.every_minutes, self.every_n_steps = every_minutes, every_n_steps
        self.saves: list[tuple[int, float]] = []
        """(optimiser step, wall seconds) of each save; the seconds include waiting for the slowest rank."""
        self._signals: set[int] = set()
        self._sigint_before: Any = None  # SIGINT's handler before training, restored at teardown
        self._told_ctrl_c = False
        self._stop: int | None = None  # the agreed signal, raised as Preempted before the next batch
        self._after_validation = False  # a save came due at a step that a validation follows
        self._flush = False  # flush the loggers before the next batch: a checkpoint was saved before its step's rows
        self._position: tuple[int, int] | None = None  # (epoch, batches of it consumed)
        self._resumed: dict[str, Any] | None = None
        self._step_seen = self._saved_step = -1
        self._last_save = 0.0

    # -- state

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[RESUME_KEY] = {
            "position": self._position,
            "world_size": trainer.world_size,
            "rng": gather_rng_states(trainer),
        }

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._resumed = checkpoint.get(RESUME_KEY)

    # -- hooks

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # After Lightning's own handlers (registered just before training), which its teardown restores.
        if threading.current_thread() is threading.main_thread():
            for signum in PREEMPTION_SIGNALS:
                signal.signal(signum, self._on_signal)
            if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # a job started with Ctrl-C ignored keeps it so
                self._sigint_before = signal.signal(signal.SIGINT, self._on_ctrl_c)
        if trainer.received_sigterm:  # by Lightning's handler, before ours
            self._signals.add(signal.SIGTERM)
        if trainer.is_global_zero:  # what saves killed in the middle left, a checkpoint's size each
            for tmp in self.path.parent.glob(".*.tmp"):
                _remove(tmp)
        self._step_seen = self._saved_step = trainer.global_step
        self._last_save = time.monotonic()
        if self._resumed is not None:
            self._restore(trainer, self._resumed)
            self._resumed = None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        # The checkpointed step's metrics are logged by now: Lightning logs them after on_train_batch_end.
        if self._flush:
            _flush(trainer)
            self._flush = False
        if self._stop is not None:
            _stop(trainer, self._stop)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._position = (trainer.current_epoch, batch_idx + 1)
        self._tell_ctrl_c(trainer)  # at once, not at the step's end: a step can take many batches
        if trainer.global_step == self._step_seen:  # gradients still accumulating: no step boundary
            return
        self._step_seen = trainer.global_step
        signum, clock = self._poll(trainer)
        steps = self.every_n_steps is not None and trainer.global_step % self.every_n_steps == 0
        # The last step of max_steps is saved here, mid-epoch: saved when the fit ends, the epoch would count as
        # done, and a resume would skip the rest of it.
        last = 0 < trainer.max_steps <= trainer.global_step
        if not (signum or clock or steps or last):
            return
        if _validation_follows(trainer):
            self._after_validation = True
        else:
            self._save(trainer)
            self._flush, self._stop = True, signum

    def on_validation_batch_end(self, trainer: Trainer, *args: Any, **kwargs: Any) -> None:
        self._tell_ctrl_c(trainer)  # a validation can outlast many steps: the notice comes within a batch

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        signum, clock = self._poll(trainer)
        if self._after_validation or signum is not None or clock:
            self._save(trainer)
            self._after_validation = False
        _flush(trainer)
        if signum is not None:
            _stop(trainer, signum)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.global_step != self._saved_step:
            self._save(trainer)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._sigint_before is not None:  # Ctrl-C interrupts what follows the training (the export) again
            signal.signal(signal.SIGINT, self._sigint_before)
            self._sigint_before = None

    # -- internals

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals.add(signum)

    def _tell_ctrl_c(self, trainer: Trainer) -> None:
        """Say (once, on rank 0) what a Ctrl-C received does: here, since a signal handler must not write."""
        if signal.SIGINT in self._signals and not self._told_ctrl_c:
            self._told_ctrl_c = True
            if trainer.is_global_zero:
                log.warning(CTRL_C_NOTICE)

    def _on_ctrl_c(self, signum: int, frame: Any) -> None:
        """The first Ctrl-C asks for a save and a stop, as a preemption signal does; the second stops at once."""
        if signal.SIGINT in self._signals:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self._signals.add(signal.SIGINT)

    def _poll(self, trainer: Trainer) -> tuple[int | None, bool]:
        """The stop signal any rank received (SIGUSR1, which asks for a requeue, before SIGTERM, before Ctrl-C's
        SIGINT), and whether a timed save is due by any rank's clock."""
        self._tell_ctrl_c(trainer)
        minutes = (time.monotonic() - self._last_save) / 60
        votes = [float(s in self._signals) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)]
        votes.append(float(self.every_minutes is not None and minutes >= self.every_minutes))
        if trainer.world_size > 1:
            votes = trainer.strategy.reduce(torch.tensor(votes, device=trainer.strategy.root_device), reduce_op="sum")
            votes = votes.tolist()
        term, usr1, ctrl_c, clock = (v > 0 for v in votes)
        return (signal.SIGUSR1 if usr1 else signal.SIGTERM if term else signal.SIGINT if ctrl_c else None), clock

    def _save(self, trainer: Trainer) -> None:
        start = time.perf_counter()
        with atomic_save(trainer, self.path) as tmp:
            trainer.save_checkpoint(tmp, weights_only=False)  # the optimiser's state too: a resume needs it
        seconds = time.perf_counter() - start
        self.saves.append((trainer.global_step, seconds))
        self._saved_step, self._last_save = trainer.global_step, time.monotonic()
        if trainer.is_global_zero:
            log.info(
                "saved %s (epoch %d, step %d) in %.2f s", self.path, trainer.current_epoch, trainer.global_step, seconds
            )

    def _restore(self, trainer: Trainer, state: dict[str, Any]) -> None:
        rngs, saved_world = state["rng"], state["world_size"]
        if saved_world != trainer.world_size and trainer.is_global_zero:
            log.warning(
                "resuming on %d ranks a run saved on %d: the batches and random numbers will differ from an "
                "uninterrupted run's",
                trainer.world_size,
                saved_world,
            )
        set_rng_state(rngs[trainer.global_rank % len(rngs)])
        self._position = state["position"]
        if self._position is not None:
            sampler = trainer.train_dataloader.batch_sampler
            if not isinstance(sampler, ShardedBatches):
                raise TypeError(f"cannot resume mid-epoch: the training batch sampler is a {type(sampler).__name__}")
            sampler.resume(*self._position)
        if trainer.is_global_zero:
            epoch, consumed = self._position or (trainer.current_epoch, 0)
            log.info("resumed at epoch %d, batch %d, step %d", epoch, consumed, trainer.global_step)


def _validation_follows(trainer: Trainer) -> bool:
    """Whether Lightning validates right after the current training batch (its own test, private in 2.x)."""
    return trainer.fit_loop.epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher)


def _flush(trainer: Trainer) -> None:
    """Write what the loggers hold to disk, so that the metrics up to the last checkpoint survive a kill."""
    for logger in trainer.loggers:
        logger.save()


def _stop(trainer: Trainer, signum: int) -> None:
    """Raise :class:`Preempted`; on SIGUSR1 under SLURM, rank 0 first requeues the job."""
    if signum == signal.SIGUSR1 and trainer.is_global_zero and SLURMEnvironment.detect():
        _requeue_slurm_job()
    raise Preempted(signum)


def _requeue_slurm_job() -> None:
    """``scontrol requeue`` this SLURM job (an array job's task included), as Lightning's SLURMEnvironment does."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ["SLURM_JOB_ID"]
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    except OSError as e:  # no scontrol here: the checkpoint is saved all the same, and the job ends as preempted
        log.warning("scontrol requeue %s failed: %s", job, e)
        return
    if done.returncode == 0:
        log.info("requeued SLURM job %s", job)
    else:
        log.warning("scontrol requeue %s failed (%d): %s", job, done.returncode, done.stderr.strip())
