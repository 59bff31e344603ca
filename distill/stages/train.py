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
import os
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


WANDB_MODES = ("offline", "online", "disabled")
"""``--wandb_mode``'s choices."""
WANDB_ALIASES = {"dryrun": "offline", "run": "online"}
"""The other names wandb takes in ``WANDB_MODE``, and what they mean."""


def check_wandb_mode(mode: str | None) -> str:
    """The W&B mode of a run: ``mode`` (``--wandb_mode``), else ``WANDB_MODE`` where it is set, else ``offline``; an
    online run has an API key (``WANDB_API_KEY``, or the ``netrc`` entry ``wandb login`` writes for the host of
    ``WANDB_BASE_URL``, default ``api.wandb.ai``), checked before any data loads.

    Raises:
        InputError: ``WANDB_MODE`` names no mode, or an online run has no API key.
    """
    if mode is None:
        given = os.environ.get("WANDB_MODE", "").strip()
        mode = WANDB_ALIASES.get(given, given) or "offline"
        if mode not in WANDB_MODES:
            raise InputError(f"WANDB_MODE={given!r}: expected one of {', '.join(WANDB_MODES)} (or --wandb_mode)")
    if mode == "online" and not os.environ.get("WANDB_API_KEY", "").strip() and not _netrc_has_wandb_key():
        raise InputError(
            "wandb_mode online: no W&B API key here: run `wandb login` or set WANDB_API_KEY, or log offline "
            "(--wandb_mode offline, then `wandb sync`)"
        )
    return mode


def _netrc_has_wandb_key() -> bool:
    """Whether the ``netrc`` file (``NETRC``, else ``~/.netrc``) holds a password for the W&B host."""
    import netrc
    from urllib.parse import urlsplit

    host = urlsplit(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        entry = netrc.netrc(os.environ.get("NETRC") or None).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


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


FIXED_ON_RESUME = (
    "model.backbone",
    "model.random_init",
    "model.head",
    "model.segment_layers",
    "data.teacher_data",
    "data.label",
    "data.first_stages",
    "data.target_scaling",
    "data.max_length",
    "data.qrels",
    "data.val_queries",
    "data.val_pool",
    "data.val_folds",
    "data.val_fold",
    "data.train_depth",
    "data.train_queries",
    "data.seed",
)
"""The options a resumed run keeps: what the student is, what it learns from (the pairs, as long as they are cut)
and what it is validated on (its best checkpoint is the best of one validation). The optimiser's options, the length
of training and the batches may change."""


def check_resumed_config(run_dir: Path, config: dict[str, Any]) -> None:
    """Check that ``config`` (the options, nested) keeps :data:`FIXED_ON_RESUME` as the run at ``run_dir`` saved
    them (``logs/config.yaml``; nothing to check where it has none).

    Raises:
        InputError: an option differs, named with both values.
    """
    saved_file = RunLayout(run_dir).logs / "config.yaml"
    if not saved_file.is_file():
        return
    saved = read_yaml_file(saved_file) or {}
    for key in FIXED_ON_RESUME:
        section, name = key.split(".")
        before, now = (saved.get(section) or {}).get(name), (config.get(section) or {}).get(name)
        if before != now:
            raise InputError(
                f"--ckpt_path last: {key} is {now!r} here and {before!r} in the run it resumes ({saved_file}): a "
                "resumed run keeps what it learns from and is validated on; give another --run_name for a new run"
            )


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


def check_train_paths(config: Any, run_dir: Path, exist: bool = True) -> None:
    """The paths of a ``distill train`` config: each teacher dataset is there (where ``exist``), and the run folder
    is none of the paths training reads (teacher data, qrels, a local backbone, the token cache) nor inside one, and
    its ``hf/``, replaced at each best validation, holds none of them.

    Raises:
        InputError: ``train: <key>: <path>: <what is wrong>``.
    """
    from distill.core.path_checks import output_folder
    from distill.data.loaders.qrels import qrels_files
    from distill.data.teacher_data import TeacherDataset
    from distill.model.resolver import cache_home

    data, given = config.data, config.data.teacher_data
    folders = [f for fs in given.values() for f in fs] if isinstance(given, dict) else list(given or [])
    if exist:
        for folder in folders:
            TeacherDataset.open(folder)
    inputs = [("data.teacher_data", folder) for folder in folders]
    inputs += [("data.qrels", path) for path in qrels_files(data.qrels)]
    inputs += [("data.cache_dir", data.cache_dir or cache_home() / "student-tokens")]
    if Path(config.model.backbone).expanduser().exists():
        inputs.append(("model.backbone", Path(config.model.backbone).expanduser()))
    output_folder(run_dir, "train", "checkpoint_root/run_name", inputs)
    output_folder(RunLayout(run_dir).hf, "train", "checkpoint_root/run_name", inputs, replaced=True)


def check_loss_groups(loss: str, group_size: int | None) -> None:
    """A loss that compares candidates of one query needs batches grouped by query (``data.group_size``): without
    them a batch mixes queries, each with one candidate or so, and such a loss is about 0: it would train for
    nothing.

    Raises:
        InputError: ``model.loss <name> ... data.group_size`` (an unknown loss is left to the model).
    """
    from students.losses import LOSSES

    within = getattr(LOSSES.get(loss), "within_query", False)
    if within and group_size is None:
        raise InputError(
            f"model.loss {loss} compares the candidates of one query, so batches must hold whole query groups: "
            "set data.group_size (candidates per query in a batch, e.g. --data.group_size 8), or use model.loss mse"
        )
    if within and group_size < 2:
        raise InputError(
            f"data.group_size: model.loss {loss} compares the candidates of one query, so a group needs 2 or more, "
            f"got {group_size}"
        )


def check_trainer_names(trainer: Any) -> None:
    """``trainer.strategy`` and ``trainer.accelerator``, given as names, are ones Lightning knows, and the options a
    distill run cannot take are not given (checkpointing off, no batch an optimiser step, no device): the Trainer
    that would refuse them is built only after the data is read (and, in a pipeline, after the teacher has run).

    Raises:
        InputError: ``trainer.<key>: ...``, naming what Lightning or distill train takes.
    """
    from pytorch_lightning.accelerators import AcceleratorRegistry
    from pytorch_lightning.strategies import StrategyRegistry

    known = {
        "strategy": ["auto", *StrategyRegistry.available_strategies()],
        "accelerator": ["auto", "gpu", *AcceleratorRegistry.available_accelerators()],
    }
    for key, names in known.items():
        value = trainer.get(key)
        if isinstance(value, str) and value.lower() not in names:
            raise InputError(f"trainer.{key}: {value!r} is not a name Lightning knows; one of: {', '.join(names)}")
    if trainer.get("enable_checkpointing") is False:
        raise InputError(
            "trainer.enable_checkpointing: false, but distill train's student is its best checkpoint (best.ckpt, "
            "exported to hf/) and it resumes from last.ckpt: leave it on"
        )
    limit = trainer.get("limit_val_batches")
    if limit is not None and limit != 0 and not (isinstance(limit, float) and limit == 1.0):  # an int: batches
        raise InputError(
            f"trainer.limit_val_batches: {limit}: distill train validates whole queries (each held-out query's nDCG@10 "
            "over all its candidates, and the card's alpha from them), and a share of the batches cuts queries: "
            "lower data.val_queries instead (0 turns validation off)"
        )
    accumulate = trainer.get("accumulate_grad_batches")
    if isinstance(accumulate, int) and accumulate < 1:
        raise InputError(f"trainer.accumulate_grad_batches: {accumulate}; at least 1 (batches an optimiser step)")
    devices = trainer.get("devices")
    if devices == [] or str(devices) == "0":
        given = "[]" if devices == [] else devices
        raise InputError(f"trainer.devices: {given} names no device; a count (1, 2), a list of ids, or auto")


def check_accelerator_here(trainer: Any) -> None:
    """A GPU accelerator (``gpu``, ``cuda``) has a GPU on this machine, and a DeepSpeed or FSDP strategy has CUDA to
    run on: Lightning refuses either only after the data is read, with a traceback. A check of the machine, not of
    the config (which parses anywhere).

    Raises:
        InputError: ``trainer.accelerator: gpu, but torch ... sees no GPU here``; ``trainer.strategy: ...``.
    """
    accelerator = trainer.get("accelerator")
    gpu = torch.cuda.is_available() or torch.backends.mps.is_available()
    if isinstance(accelerator, str) and accelerator.lower() in ("gpu", "cuda") and not gpu:
        raise InputError(
            f"trainer.accelerator: {accelerator}, but torch {torch.__version__} sees no GPU here: give "
            "--trainer.accelerator cpu (or auto)"
        )
    strategy = trainer.get("strategy")
    on_cpu = accelerator == "cpu" or (accelerator in (None, "auto") and not torch.cuda.is_available())
    if isinstance(strategy, str) and strategy.lower().startswith(("deepspeed", "fsdp")) and on_cpu:
        raise InputError(
            f"trainer.strategy: {strategy} shards the model over CUDA devices, and this run is on the CPU: give "
            "--trainer.strategy ddp (or auto) here"
        )


def check_node_launch(trainer: Any) -> None:
    """A run of ``trainer.num_nodes`` 2 or more is launched as one node of several: under torchrun, SLURM, LSF or MPI
    (a cluster environment Lightning detects), or with ``MASTER_ADDR`` set, as Lightning's own cluster environment
    (and Kubeflow's) takes it (with ``NODE_RANK``, 0 when unset). Launched alone, each process would wait for the other
    nodes without end.

    Raises:
        InputError: ``trainer.num_nodes: N, but ...``, naming the launchers.
    """
    nodes = trainer.get("num_nodes") or 1
    if nodes < 2 or "MASTER_ADDR" in os.environ:
        return
    from pytorch_lightning.plugins.environments import (
        LSFEnvironment,
        MPIEnvironment,
        SLURMEnvironment,
        TorchElasticEnvironment,
    )

    clusters = (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment, MPIEnvironment)
    if any(cluster.detect() for cluster in clusters):
        return
    raise InputError(
        f"trainer.num_nodes: {nodes}, but no launcher says which node this is, and alone it would wait for the "
        f"others without end: launch it on each node with torchrun --nnodes {nodes} or srun, or set MASTER_ADDR, "
        "MASTER_PORT and NODE_RANK (docs/gpu.md, Several nodes)"
    )


def check_launched_processes(trainer: Any) -> None:
    """Under a launcher that says how many processes it started (torchrun's ``WORLD_SIZE`` and
    ``LOCAL_WORLD_SIZE``), ``trainer.num_nodes`` is its node count and ``trainer.devices``, where it is a count, its
    processes a node: Lightning refuses a mismatch only once the data is read, with a traceback.

    Raises:
        InputError: ``trainer.num_nodes: ...`` or ``trainer.devices: ...`` with the launcher's counts.
    """
    world, local = os.environ.get("WORLD_SIZE", ""), os.environ.get("LOCAL_WORLD_SIZE", "")
    if not (world.isdigit() and local.isdigit()) or int(local) == 0 or int(world) % int(local):
        return
    launched = f"the launcher started {world} processes, {local} a node"
    nodes = trainer.get("num_nodes") or 1
    if nodes != int(world) // int(local):
        raise InputError(
            f"trainer.num_nodes: {nodes}, but {launched}: give --trainer.num_nodes {int(world) // int(local)}"
        )
    devices = trainer.get("devices")
    counted = isinstance(devices, int | list | tuple) or (isinstance(devices, str) and devices.isdigit())
    if counted and devices not in (-1, "-1") and _world_size(trainer) != int(world):
        raise InputError(f"trainer.devices: {devices}, but {launched}: give --trainer.devices {local}")


def _world_size(trainer: dict[str, Any]) -> int:
    devices, nodes = trainer.get("devices"), trainer.get("num_nodes") or 1
    if isinstance(devices, int) and devices > 0:
        return devices * nodes
    if isinstance(devices, list | tuple):
        return len(devices) * nodes
    if isinstance(devices, str) and devices.isdigit():
        return int(devices) * nodes
    return nodes  # auto, -1: not known before the trainer; one process is the common case


def check_intervals(trainer: dict[str, Any], datamodule: StudentDataModule) -> None:
    """``trainer.val_check_interval`` fits an epoch: a share in (0, 1], or at most the epoch's training batches of
    one process (after ``limit_train_batches``), unless ``check_val_every_n_epoch`` is null (then it counts batches
    across epochs). Checked after the data are read, before any logger or run folder exists.

    Raises:
        InputError: ``trainer.val_check_interval: ...`` with the epoch's batch count.
    """
    interval = trainer.get("val_check_interval")
    if interval is None or isinstance(interval, bool):
        return
    if isinstance(interval, float):
        if not 0 < interval <= 1:
            raise InputError(
                f"trainer.val_check_interval: {interval} is neither a share of an epoch in (0, 1] nor a whole number "
                "of training batches"
            )
        return
    if trainer.get("check_val_every_n_epoch", 1) is None:
        return
    batches = len(datamodule.train_dataloader().batch_sampler) // _world_size(trainer)
    limit = trainer.get("limit_train_batches")
    if isinstance(limit, int) and not isinstance(limit, bool):
        batches = min(batches, limit)
    elif isinstance(limit, float):
        batches = int(batches * limit)
    if interval > batches:
        raise InputError(
            f"trainer.val_check_interval: {interval} is over the {batches} training batches of an epoch: give at "
            f"most {batches}, a share of the epoch (0.5), or also trainer.check_val_every_n_epoch null to count "
            "batches across epochs"
        )


def warn_small_groups(datamodule: StudentDataModule) -> None:
    """Say once where ``data.group_size`` is more than some training queries have candidates: their groups, and so
    the batches they fall in, are smaller than asked."""
    from collections import Counter

    size = datamodule.hparams.group_size
    if size is None or not job_leader():
        return
    counts = Counter(list(datamodule.train.qid))
    short = [n for n in counts.values() if n < size]
    if short:
        log.warning(
            "data.group_size %d: %d of %d training queries have fewer candidates (the fewest %d): their groups, and "
            "the batches they fall in, are smaller",
            size, len(short), len(counts), min(short),
        )  # fmt: skip


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
