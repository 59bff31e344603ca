"""The checks of a ``distill train`` config before anything is built on it: its options (W&B's mode, the loss's
groups, the Lightning options a distill run cannot take), its paths, the options a resumed run keeps, and the
machine and launcher it runs on. Each refuses in one line, :class:`~distill.core.schema.InputError`, naming the key:
Lightning would refuse most of them only after the data is read, with a traceback, or not at all."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from distill.core.config import read_yaml_file
from distill.core.devices import job_leader
from distill.core.run_folder import RunLayout
from distill.core.schema import InputError
from students.data import StudentDataModule

log = logging.getLogger(__name__)


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


def check_train_paths(config: Any, run_dir: Path, exist: bool = True) -> None:
    """The paths of a ``distill train`` config: each teacher dataset is there (where ``exist``), and the run folder
    is none of the paths training reads (teacher data, qrels, a local backbone, the token cache) nor inside one, and
    its ``hf/``, replaced when a training ends, holds none of them.

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
