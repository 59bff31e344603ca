"""``distill train``: the student stage, driven by LightningCLI and composable YAML.

    distill train --config configs/train/minilm-dl19.yaml [--trainer.devices 4 --trainer.strategy ddp]

Every run writes to ``<checkpoint_root>/<run_name>/`` (see :class:`~distill.core.run_folder.RunLayout`):
``checkpoints/`` (``best.ckpt`` by validation nDCG@10, ``last.ckpt``, the newest state: see
:mod:`students.checkpointing`), ``hf/`` (the best student as a plain Hugging Face folder), ``logs/`` (CSV and
the resolved config) and ``wandb/`` (offline by default). ``--ckpt_path last`` resumes a run at the batch after
its newest checkpoint; a run stopped by SIGTERM or SIGUSR1 saves one first and exits with
:data:`students.checkpointing.EXIT_PREEMPTED` (75), by a first Ctrl-C the same, with
:data:`distill.core.schema.EXIT_INTERRUPTED` (130).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jsonargparse.typing import PositiveFloat, PositiveInt
from pytorch_lightning import Trainer
from pytorch_lightning.cli import LightningCLI, SaveConfigCallback
from pytorch_lightning.loggers import WandbLogger

from distill.core.checksums import stat_digest
from distill.core.config import argument_error, help_formatter, read_yaml_file
from distill.core.devices import job_leader
from distill.core.output_files import hold_output, put_back, remove_stale_siblings, set_aside
from distill.core.run_folder import CHECKPOINT_ROOT, RunLayout
from distill.core.schema import EXIT_INTERRUPTED, ExistingOutputError, InputError
from distill.stages.train_checks import (
    WANDB_MODES,
    check_accelerator_here,
    check_intervals,
    check_launched_processes,
    check_loss_groups,
    check_node_launch,
    check_resumed_config,
    check_train_paths,
    check_trainer_names,
    check_wandb_mode,
    warn_small_groups,
)
from students.checkpointing import (
    EVERY_MINUTES,
    EXIT_PREEMPTED,
    AtomicModelCheckpoint,
    LastCheckpoint,
    Preempted,
    find_last,
)
from students.csv_logger import ResumableCSVLogger
from students.data import StudentDataModule
from students.hf_folder import ExportBestToHF
from students.module import CrossEncoderModule
from students.progress import LogProgress
from students.same_job import SameJobOnEveryRank

log = logging.getLogger(__name__)
BEST = "best"
"""The file name (without ``.ckpt``) of the run's best checkpoint, by the validation metric."""
# LastCheckpoint resumes the batch sampler itself, which Lightning cannot see.
warnings.filterwarnings("ignore", "You're resuming from a checkpoint that ended before the epoch ended")
warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated")  # Lightning's, about torch's


class DistillCLI(LightningCLI):
    """LightningCLI with the project's run layout, loggers and checkpointing."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.add_argument("--run_name", default="student", help="the run's folder under checkpoint_root")
        parser.add_argument("--checkpoint_root", default=CHECKPOINT_ROOT)
        parser.add_argument(
            "--wandb_mode",
            default=None,
            choices=list(WANDB_MODES),
            help="W&B logging: offline (into the run folder's wandb/), online (needs `wandb login` or WANDB_API_KEY) "
            "or disabled; default: WANDB_MODE where it is set, else offline",
        )
        parser.add_argument("--ckpt_path", default=None, help="a checkpoint to resume from, or 'last'")
        parser.add_argument(
            "--overwrite",
            type=bool,
            default=False,
            help="replace the run folder's earlier run (its checkpoints, hf/, export and logs); without it, a run "
            "folder that holds one is refused unless --ckpt_path resumes from it",
        )
        parser.add_argument(
            "--interpolate",
            type=bool,
            default=False,
            help="the student's card says to interpolate with the first stage by default, with the alpha chosen on "
            "the validation queries (rerankers can always be asked to)",
        )
        parser.add_argument(
            "--checkpointing.every_minutes",
            type=PositiveFloat | None,
            default=EVERY_MINUTES,
            help="minutes of training between saves of last.ckpt (null: none by time)",
        )
        parser.add_argument(
            "--checkpointing.every_n_steps",
            type=PositiveInt | None,
            default=None,
            help="optimiser steps between saves of last.ckpt (null: none by steps)",
        )
        parser.link_arguments("model.backbone", "data.backbone")
        parser.link_arguments("data.max_batch_tokens", "model.batch_tokens")  # the lr's effective batch
        # Our batch samplers shard over ranks themselves; precision None means bf16-mixed on GPU, 32 on CPU.
        parser.set_defaults({"trainer.use_distributed_sampler": False, "trainer.precision": None})

    @property
    def run_dir(self) -> Path:
        return Path(self.config.checkpoint_root) / self.config.run_name

    reads_files = True
    """Check that the files the config names are there (not so for a pipeline's stage, whose teacher data an
    earlier stage makes)."""
    resume_from: str | Path | None = None
    """The checkpoint ``--ckpt_path`` names, checked (:func:`resume_checkpoint`)."""
    run_lock: Any = None
    """The job's hold on its run folder (:func:`~distill.core.output_files.hold_output`), on its first process."""
    replaced: Path | None = None
    """Where the earlier run that ``--overwrite`` replaces waits until this run ends (:func:`claim_run_folder`), on
    the job's first process; :meth:`settle` removes it or puts it back."""

    def before_instantiate_classes(self) -> None:
        """The config's contracts and paths, checked before anything is built or loaded (and by
        :func:`check_train_args`)."""
        self.config.wandb_mode = check_wandb_mode(self.config.wandb_mode)
        check_loss_groups(self.config.model.loss, self.config.data.group_size)
        check_trainer_names(self.config.trainer)
        check_launched_processes(self.config.trainer)
        check_train_paths(self.config, self.run_dir, self.reads_files)
        if self.reads_files:  # a run on this machine, not a config parsed
            check_accelerator_here(self.config.trainer)
            check_node_launch(self.config.trainer)
            self.resume_from = resume_checkpoint(self.config.ckpt_path, RunLayout(self.run_dir).checkpoints)
            if self.resume_from is not None and self.config.ckpt_path == "last":
                check_resumed_config(self.run_dir, self.config.as_dict())

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        # Once the model's and the data's options have passed their checks: the run folder is this run's.
        if job_leader():
            self.run_lock = hold_output(self.run_dir)
            if self.run_lock is None:
                raise ExistingOutputError(
                    f"{self.run_dir}: another distill train is writing this run now: wait for it to end, or choose "
                    "another --run_name"
                )
        try:
            return self._trainer_of_run(**kwargs)
        except BaseException:
            self.settle(keep=False)  # train() never gets the trainer, so never settles the run nor releases the hold
            if self.run_lock is not None:
                self.run_lock.release()
            raise

    def settle(self, keep: bool) -> None:
        """End ``--overwrite``'s replacement of an earlier run: remove that run (``keep``: this one finished, or was
        stopped with a checkpoint to resume from), or put it back in place of this run's folder (this run failed)."""
        earlier, self.replaced = self.replaced, None
        if earlier is None:
            return
        if keep:
            shutil.rmtree(earlier, ignore_errors=True)
            return
        put_back(earlier, self.run_dir)
        log.warning("this run did not finish: the earlier run it was to replace is back in %s", self.run_dir)

    def _trainer_of_run(self, **kwargs: Any) -> Trainer:
        """The trainer, its loggers and its checkpoints in the run folder, once this job holds it."""
        # The data is read and checked before any logger (or wandb run) exists: bad data fails fast and cleanly,
        # and before an earlier run is replaced (--overwrite): a run that cannot start removes nothing.
        self.datamodule.setup("fit")
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        check_intervals(config, self.datamodule)
        self.replaced = claim_run_folder(self.run_dir, self.config.ckpt_path, self.config.overwrite)
        warn_small_groups(self.datamodule)
        if config.get("precision") is None:
            config["precision"] = "bf16-mixed" if torch.cuda.is_available() else "32-true"
        config["default_root_dir"] = str(self.run_dir)
        if config.get("logger") in (None, True):
            config["logger"] = [ResumableCSVLogger(self.run_dir, name="logs", version="")]
            if self.config.wandb_mode != "disabled":
                import wandb

                # offline, wandb's banner and end-of-run history point nowhere a user can go: the run folder's
                # metrics.csv and wandb/ are named in the summary instead
                quiet = {"settings": wandb.Settings(silent=True)} if self.config.wandb_mode == "offline" else {}
                self.run_dir.mkdir(parents=True, exist_ok=True)  # wandb looks for its git checkout from there
                wandb_logger = WandbLogger(
                    project="cis-distill",
                    name=self.config.run_name,
                    save_dir=str(self.run_dir),
                    mode=self.config.wandb_mode,
                    **quiet,
                )
                # Lightning passes anonymous=None to wandb.init, which wandb warns is a deprecated setting
                getattr(wandb_logger, "_wandb_init", {}).pop("anonymous", None)
                config["logger"].append(wandb_logger)
        monitor = "val/nDCG@10" if self.config.data.qrels else "val/spearman"
        layout = RunLayout(self.run_dir)
        # best.ckpt right after each validation, before last.ckpt (callbacks run in this order), so that
        # last.ckpt holds the best score so far: Lightning's default, at the epoch's end, comes after it.
        best = AtomicModelCheckpoint(
            layout.checkpoints,
            BEST,
            monitor=monitor,
            mode="max",
            enable_version_counter=False,
            save_on_train_epoch_end=False,
        )
        every = self.config.checkpointing
        last = LastCheckpoint(layout.checkpoints, every.every_minutes, every.every_n_steps)
        callbacks = [self._same_job(), best, last, ExportBestToHF(best, layout.hf, self.config.interpolate)]
        if not config.get("enable_progress_bar", True) or not sys.stderr.isatty():
            callbacks.append(LogProgress())  # a log file gets a line a minute instead of a progress bar
        extra = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        return self._instantiate_trainer(config, [*extra, *callbacks])

    def _same_job(self) -> SameJobOnEveryRank:
        """The check that every process of the job has this one's config and resumes from this one's checkpoint
        (its path and a digest of its files' sizes and times)."""
        settings = {key: value for key, value in self.config.as_dict().items() if key != "config"}  # its keys stay
        resume = self.resume_from
        settings["ckpt_path (resolved)"] = None if resume is None else f"{resume} {stat_digest(resume)}"
        return SameJobOnEveryRank(settings)


@dataclass(frozen=True)
class TrainReport:
    """Where the run is, where its best student is, and its last validation's metrics."""

    run_dir: Path
    metrics: dict[str, float]
    """``val/...`` -> value, of the last validation (held-out queries)."""
    validated: bool = True
    """A validation ran (in this run or before it resumed): ``hf/`` holds the best student."""

    def format(self) -> str:
        layout = RunLayout(self.run_dir)
        if self.validated:
            lines = [f"run folder: {self.run_dir}  (best student as a Hugging Face folder: {layout.hf})"]
        else:
            lines = [f"run folder: {self.run_dir}  ({layout.no_student().removeprefix(f'{self.run_dir}: ')})"]
        if self.metrics and self.validated:  # a fast_dev_run validates one batch, and saves no student from it
            lines.append("last validation, held-out queries:")
            lines += [f"  {key:<28} {self.metrics[key]:10.4f}" for key in sorted(self.metrics)]
        return "\n".join(lines)


def train(argv: list[str], resume_hint: str = "resume with --ckpt_path last") -> TrainReport | None:
    """Run ``distill train`` with these arguments; the report on the global-zero rank (None on the others).
    ``resume_hint`` ends the line a stop by a signal prints (``distill run`` resumes by itself).

    Raises:
        InputError: the arguments or config files are wrong (one line naming the key), or the data is bad.
        SystemExit: :data:`~students.checkpointing.EXIT_PREEMPTED`, stopped by SIGTERM or SIGUSR1 once
            ``last.ckpt`` was saved; :data:`~distill.core.schema.EXIT_INTERRUPTED`, stopped so by Ctrl-C.
    """
    cli = build_cli(argv, save_config_callback=SaveConfigInRun, save_config_kwargs={"overwrite": True})
    checkpoints = RunLayout(cli.run_dir).checkpoints
    try:
        try:
            cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.resume_from)
        except Preempted as stop:
            if cli.trainer.is_global_zero:
                log.warning("%s, %s saved: %s", stop, find_last(checkpoints), resume_hint)
            raise SystemExit(EXIT_INTERRUPTED if stop.signum == signal.SIGINT else EXIT_PREEMPTED) from None
        except SystemExit as e:
            if e.code == 1 and cli.trainer.interrupted:  # Lightning's exit on Ctrl-C before training's handler is in
                raise KeyboardInterrupt from None
            raise
    except BaseException as e:
        # a run stopped by a signal goes on from its checkpoint, if it saved one; a failed run gives the earlier back
        stopped = isinstance(e, KeyboardInterrupt) or (
            isinstance(e, SystemExit) and e.code in (EXIT_INTERRUPTED, EXIT_PREEMPTED)
        )
        cli.settle(keep=stopped and any(checkpoints.glob("*.ckpt")))
        raise
    else:
        cli.settle(keep=True)
    finally:
        if cli.run_lock is not None:
            cli.run_lock.release()
    if not cli.trainer.is_global_zero:
        return None
    finish_wandb(cli.trainer)
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("val/")}
    best = next((c for c in cli.trainer.checkpoint_callbacks if isinstance(c, AtomicModelCheckpoint)), None)
    return TrainReport(cli.run_dir, metrics, best is not None and bool(best.best_model_path))


class SaveConfigInRun(SaveConfigCallback):
    """LightningCLI's saving of the run's config, which goes to the first logger's folder (``logs/``), and with
    ``--trainer.logger false`` to the run folder itself: also to ``logs/config.yaml`` always, where a resume checks
    the options it keeps (:func:`check_resumed_config`). Without it, a resume with another label passed unchecked,
    and the card named that label for weights trained on the first."""

    def save_config(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        logs = RunLayout(Path(trainer.default_root_dir)).logs
        logs.mkdir(parents=True, exist_ok=True)
        self.parser.save(self.config, logs / self.config_filename, skip_none=False, overwrite=True)


def build_cli(argv: list[str], where: str = "", cli: type[DistillCLI] = DistillCLI, **kwargs: Any) -> DistillCLI:
    """``distill train``'s command line ``argv`` parsed, checked and built by ``cli`` (``DistillCLI`` or a subclass;
    ``kwargs`` go to it): its model, datamodule and trainer, as ``distill train`` runs them; not run.

    Raises:
        InputError: the arguments or config files are wrong: one line naming the key (after ``where``, where given).
    """
    from jsonargparse import ArgumentError

    for path in yaml_files(argv):
        read_yaml_file(path)  # jsonargparse names no file in a parse error
    try:
        with _quiet_args_warning():
            return cli(
                CrossEncoderModule,
                StudentDataModule,
                args=argv,
                run=False,
                seed_everything_default=0,
                parser_kwargs={
                    "prog": "distill train",
                    "exit_on_error": False,
                    "allow_abbrev": False,
                    "formatter_class": help_formatter(),
                },
                **kwargs,
            )
    except ArgumentError as e:
        raise argument_error(e, where) from None


def yaml_files(argv: list[str]) -> list[str]:
    """The YAML files ``argv`` names: each ``--config``'s (but options given inline), and any other option's value
    that is a ``.yaml`` or ``.yml`` file (LightningCLI takes a section's options from a file, ``--model m.yaml``)."""
    files = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if not flag.startswith("--"):
            continue
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        inline = any(c in value for c in ":{\n")  # --config also takes the options themselves, as YAML
        yaml_file = Path(value).suffix in (".yaml", ".yml") and Path(value).is_file()
        if (flag == "--config" and not inline) or yaml_file:
            files.append(value)
    return files


def finish_wandb(trainer: Trainer) -> None:
    """End the W&B run of the trainer's :class:`WandbLogger`, if it has one. Lightning leaves it open: wandb would
    finish it (an offline run writes its last records and its service process stops) at the interpreter's exit, after
    the summary, and a later ``WandbLogger`` of the same process (``distill run``) would log into it."""
    if any(isinstance(logger, WandbLogger) for logger in trainer.loggers):
        import wandb

        wandb.finish()


def claim_run_folder(run_dir: Path, ckpt_path: str | None, overwrite: bool) -> Path | None:
    """Take ``run_dir`` for a new run: where it holds an earlier one (a checkpoint or ``hf/``), resume it
    (``ckpt_path``), replace it (``overwrite``: the global-zero rank sets the folder aside until the new run ends,
    :meth:`DistillCLI.settle`) or refuse. What killed writers left beside it is cleaned first
    (:func:`~distill.core.output_files.remove_stale_siblings`: an earlier run set aside comes back if the name is
    free).

    Returns:
        Where the earlier run was set aside (on the global-zero rank, with ``overwrite``); else None.

    Raises:
        ExistingOutputError: an earlier run is there, and neither ``ckpt_path`` nor ``overwrite`` is given.
        InputError: ``ckpt_path`` ``last`` (resume this run) with ``overwrite`` (replace it).
    """
    if ckpt_path == "last" and overwrite:
        raise InputError("--ckpt_path last resumes the run and --overwrite true replaces it: give one of them")
    if job_leader():
        remove_stale_siblings(run_dir)
    layout = RunLayout(run_dir)
    if ckpt_path is not None or not (any(layout.checkpoints.glob("*.ckpt")) or (layout.hf / "config.json").is_file()):
        return None
    if not overwrite:
        raise ExistingOutputError(
            f"{run_dir} holds an earlier training run: resume it with --ckpt_path last, replace it with "
            "--overwrite true, or choose another --run_name"
        )
    if not job_leader():
        return None
    log.warning("--overwrite: the earlier run in %s is set aside, and removed once this run ends", run_dir)
    return set_aside(run_dir)


def resume_checkpoint(given: str | None, checkpoints: Path) -> str | Path | None:
    """The checkpoint ``--ckpt_path`` names, checked whole before the run is built on it: ``last`` is the run's
    newest (:func:`~students.checkpointing.find_last`; None where there is none yet: a fresh start), and where
    that one is unreadable (truncated by a full disk, say), ``best.ckpt``, an earlier state of the same run, with a
    warning that says so.

    Raises:
        InputError: the checkpoint named (or, for ``last``, every one of the run) is missing or unreadable; the
            message names the file.
    """
    from distill.core.files import check_checkpoint

    if given != "last":
        if given is not None:
            check_checkpoint(given)
        return given
    last = find_last(checkpoints)
    if last is None:
        if job_leader():
            log.warning("--ckpt_path last: no checkpoint in %s yet, starting fresh", checkpoints)
        return None
    try:
        check_checkpoint(last)
        return last
    except InputError as e:
        best = checkpoints / f"{BEST}.ckpt"
        try:
            check_checkpoint(best)
        except InputError:
            raise InputError(f"--ckpt_path last: {e}; and no readable {best} to fall back on") from None
        if job_leader():
            log.warning("--ckpt_path last: %s; resuming from %s instead (an earlier state of this run)", e, best)
        return best


@contextlib.contextmanager
def _quiet_args_warning() -> Iterator[None]:
    """LightningCLI warns when it is given arguments while ``sys.argv`` has some: ours are ``distill train``'s."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        yield


class _ParseOnly(DistillCLI):
    """Parses and checks ``distill train`` arguments; builds and seeds nothing, and reads no file but the configs."""

    reads_files = False

    def _set_seed(self) -> None:
        pass

    def instantiate_classes(self) -> None:
        """Build the model and the datamodule alone, whose constructors check their options (sizes, the optimiser's
        numbers) and read no file; not the trainer."""
        self.model_class(**self.config["model"].as_dict())
        self.datamodule_class(**self.config["data"].as_dict())


def check_train_args(argv: list[str], where: str) -> dict[str, Any]:
    """Check ``distill train`` arguments without building anything; their config, parsed (its sections ``model``,
    ``data``, ``trainer``, ... as dicts).

    Raises:
        InputError: ``<where>: <key>: <what is wrong>``.
    """
    try:
        return build_cli(argv, where, _ParseOnly).config.as_dict()
    except InputError as e:
        raise InputError(e.args[0] if e.args[0].startswith(f"{where}: ") else f"{where}: {e}") from None


def check_train_machine(trainer: dict[str, Any], where: str) -> None:
    """The ``trainer`` section of :func:`check_train_args`' config can run on this machine (its accelerator is here).

    Raises:
        InputError: ``<where>: trainer.accelerator: ...``.
    """
    try:
        check_accelerator_here(trainer)
        check_node_launch(trainer)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
