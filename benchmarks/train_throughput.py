"""Training throughput of the student stage as ``distill train`` runs it, against a plain loop that pads every pair
to a fixed length, on the same pairs:

    python -m benchmarks.train_throughput [--steps 20 ...] [-- DISTILL TRAIN ARGUMENTS]

Everything after ``--`` is ``distill train``'s command line (default ``--config configs/train/bert-large-gpu.yaml``),
built by its own CLI (:func:`distill.stages.train.build_cli`) and set only to run ``--warmup_steps + --steps``
optimiser steps without validation, loggers or a progress bar, in a temporary run folder. (b) is that stage's fit,
timed by :class:`StepTimer`; (a) trains the same examples in the same order in fixed batches padded to
``data.max_length``, tokenised in the loop, with the stage's optimiser settings, clipping and precision
(:class:`PlainLoop`); with ``--checkpoint_every_steps K``, (c) repeats (b) saving ``last.ckpt`` every K steps. Each
phase is timed from the end of its warm-up to the end of its last step, the device synchronised at both ends; its
samples/s, tokens/s, peak memory, MFU (``6 * n_params * real_tokens / seconds`` over a large square matmul in the
compute dtype) and, on a GPU, host syncs are reported, and (a) and (b) must train on the same pairs and tokens (exit
status 1 if not). ``benchmarks/README.md`` defines each figure.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from pytorch_lightning import Callback, LightningModule, Trainer

from benchmarks import CHECKOUT, RESULTS, phases
from benchmarks.phases import (
    Ceiling,
    Column,
    Phase,
    TimedOptions,
    Window,
    at_least,
    display_path,
    free_memory,
    header,
    met,
    set_threads,
    slug,
    table,
    write_result,
)
from distill.bench.measure import environment
from distill.bench.profile import StageProfile
from distill.core.devices import MATMUL_SIZE
from distill.core.schema import InputError
from distill.data.label_table import SOURCE, SOURCE_ROW, load_label_table
from distill.data.teacher_data import TeacherDataset
from distill.model.resolver import ARCHITECTURES, resolve_model
from distill.stages.train import DistillCLI, build_cli
from students.checkpointing import EVERY_MINUTES, LastCheckpoint
from students.data import StudentDataModule
from students.model import build_student
from students.optim import adamw

GPU_CONFIG = CHECKOUT / "configs" / "train" / "bert-large-gpu.yaml"
# The training targets, stated for BERT-large on an H100 at the GPU config's token budget.
TARGET_MFU = 0.40
TARGET_SPEEDUP = 1.5
CHECKPOINT_COST_TARGET = 0.02
"""Periodic checkpointing at the default interval costs less than this share of training time."""
SYNC_WARNING = "called a synchronizing CUDA operation"
"""The start of the warning that CUDA's sync debug mode gives for each host synchronisation. Setting the mode also
warns, once a process, that it "does not yet detect all synchronizing operations": that notice is no sync."""


@dataclass(kw_only=True)
class TrainThroughput(TimedOptions):
    """Training throughput of the student stage, as ``distill train`` runs it, against a plain loop:
    ``python -m benchmarks.train_throughput [OPTIONS] [-- DISTILL TRAIN ARGUMENTS]``."""

    steps: int = 20
    """Timed optimiser steps per phase."""
    warmup_steps: int = 3
    """Untimed optimiser steps before them, per phase."""
    checkpoint_every_steps: int | None = None
    """Also time (c): (b) with ``last.ckpt`` saved every this many optimiser steps, and report what a save costs
    and its share of training time at the default interval."""
    train_args: list[str] = field(default_factory=lambda: ["--config", display_path(GPU_CONFIG)])
    """``distill train``'s arguments (on the command line: everything after ``--``)."""

    REST: ClassVar[str | None] = "train_args"

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "steps", "warmup_steps", "checkpoint_every_steps")


@dataclass(kw_only=True)
class TrainingPhase(Phase):
    """The figures of one phase's timed steps."""

    steps: int
    """Optimiser steps timed."""
    samples: int
    """(query, passage) pairs trained on in the timed steps."""
    real_tokens: int
    """Tokens fed, padding excluded (``attention_mask`` ones)."""
    last_loss: float
    """Training loss of the last timed step (a sanity check: finite)."""
    mfu: float = 0.0
    """``6 * n_params * real_tokens / seconds / matmul_flops_per_s``."""
    mfu_non_embedding: float = 0.0
    """The same with the non-embedding parameters only (embedding lookups do no matmul)."""
    host_syncs: int | None = None
    """Host synchronisations in the timed window, as CUDA's sync debug mode reports them (None on a CPU)."""
    host_sync_sites: list[str] = field(default_factory=list)
    """``file:line`` of the Python call behind each of ``host_syncs``."""
    batch_shapes: list[tuple[int, int]] = field(default_factory=list)
    """The distinct ``(pairs, padded length)`` shapes of the timed steps' batches."""

    RATES: ClassVar[tuple[str, ...]] = ("samples", "real_tokens", "padded_tokens")

    def finish(self, n_params: int, n_non_embedding: int, ceiling: float) -> None:
        """Fill in the FLOP figures from the model size (all and non-embedding parameters) and the matmul rate."""
        self.mfu = self.flop_fraction(6 * n_params * self.real_tokens, ceiling)
        self.mfu_non_embedding = self.mfu * n_non_embedding / n_params

    def to_json(self) -> dict[str, Any]:
        return {
            **super().to_json(),
            "seconds_per_step": self.seconds / self.steps,
            "padding_fraction": 1 - self.real_tokens / self.padded_tokens,
        }


class HostSyncs:
    """Counts the host synchronisations between :meth:`start` and :meth:`stop` on a CUDA device, with
    ``torch.cuda.set_sync_debug_mode("warn")``, and records where each came from; on a CPU, counts nothing
    (:attr:`count` stays None)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.count: int | None = None
        self.sites: list[str] = []
        """``file:line`` of the Python call that synchronised, one per sync."""
        self._stack: contextlib.ExitStack | None = None
        self._records: list[warnings.WarningMessage] = []

    def start(self) -> None:
        if self.device.type != "cuda":
            return
        self._stack = contextlib.ExitStack()
        self._records = self._stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")

    def stop(self) -> None:
        if self._stack is None:
            return
        torch.cuda.set_sync_debug_mode("default")
        self._stack.close()
        self._stack = None
        syncs = [w for w in self._records if str(w.message).startswith(SYNC_WARNING)]
        self.count = len(syncs)
        self.sites = [f"{display_path(w.filename)}:{w.lineno}" for w in syncs]


# ----------------------------------------------------------------------------- (b) and (c): the stage


class StepTimer(Callback):
    """Times the ``steps`` optimiser steps after the first ``warmup`` of a ``Trainer`` run, from the end of the last
    warm-up step to the end of the last timed one (with ``profile``, recorded by ``torch.profiler``), and records
    every step's batch without synchronising the device: its ``index`` (positions in the training split) and its
    padded shape."""

    def __init__(self, warmup: int, steps: int, profile: str | None = None) -> None:
        self.warmup, self.steps, self.profile_path = warmup, steps, profile
        self.profile: StageProfile | None = None
        self.window: Window | None = None
        self.syncs: HostSyncs | None = None
        self.indices: list[torch.Tensor] = []
        self.shapes: list[tuple[int, int]] = []
        self.last_loss: torch.Tensor | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        device = trainer.strategy.root_device
        self.window, self.syncs = Window(device), HostSyncs(device)
        self.profile = None if self.profile_path is None else StageProfile(Path(self.profile_path), device)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self.indices.append(batch["index"])
        self.shapes.append(tuple(batch["input_ids"].shape))

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if len(self.indices) == self.warmup:
            if self.profile is not None:
                self.profile.start()
            self.window.start()
            self.syncs.start()
        elif len(self.indices) == self.warmup + self.steps:
            self.syncs.stop()
            self.window.stop()
            if self.profile is not None:
                self.profile.stop()
            self.last_loss = outputs["loss"] if isinstance(outputs, dict) else outputs

    def phase(self, name: str, lengths: np.ndarray) -> tuple[TrainingPhase, list[list[int]]]:
        """The timed steps' figures (each pair's real tokens from ``lengths``, ``[n]``), and the positions of every
        step's batch, warm-up steps included."""
        if self.window is None or math.isnan(self.window.seconds):
            raise RuntimeError(f"the stage stopped after {len(self.indices)} of {self.warmup + self.steps} steps")
        rows = [t.tolist() for t in self.indices]
        timed = slice(self.warmup, None)
        phase = TrainingPhase(
            name=name,
            steps=self.steps,
            samples=sum(len(r) for r in rows[timed]),
            real_tokens=int(sum(lengths[r].sum() for r in rows[timed])),
            padded_tokens=sum(b * n for b, n in self.shapes[timed]),
            last_loss=float(self.last_loss) if self.last_loss is not None else math.nan,
            host_syncs=self.syncs.count,
            host_sync_sites=self.syncs.sites,
            batch_shapes=sorted(set(self.shapes[timed])),
            **self.window.figures(),
        )
        return phase, rows


class TimedCLI(DistillCLI):
    """``distill train``'s CLI whose trainer calls ``timer`` before its other callbacks and, unless ``keep_last``,
    saves no ``last.ckpt``."""

    def __init__(self, *args: Any, timer: StepTimer, keep_last: bool, **kwargs: Any) -> None:
        self.timer, self.keep_last = timer, keep_last
        super().__init__(*args, **kwargs)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        given = self._get(self.config_init, "trainer", default={}).get("callbacks") or []
        given = given if isinstance(given, list) else [given]
        trainer = super().instantiate_trainer(callbacks=[self.timer, *given], **kwargs)
        if not self.keep_last:
            trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, LastCheckpoint)]
        return trainer


def stage(options: TrainThroughput, root: Path, timer: StepTimer, checkpoint_every: int | None = None) -> TimedCLI:
    """``distill train`` on ``options.train_args``, built to run the warm-up and timed steps with ``timer``: no
    validation, logger or progress bar, its run folder in ``root``; ``last.ckpt`` saved every ``checkpoint_every``
    optimiser steps (None: never)."""
    steps = options.warmup_steps + options.steps
    control = ["--trainer.max_steps", str(steps), "--trainer.max_epochs", "-1", "--trainer.limit_val_batches", "0"]
    control += ["--trainer.num_sanity_val_steps", "0", "--trainer.logger", "false", "--wandb_mode", "disabled"]
    control += ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    control += ["--checkpoint_root", str(root), "--checkpointing.every_minutes", "null"]
    control += ["--checkpointing.every_n_steps", str(checkpoint_every) if checkpoint_every else "null"]
    argv = [*options.train_args, *control]
    keep = checkpoint_every is not None
    return build_cli(argv, "distill train", TimedCLI, timer=timer, keep_last=keep, save_config_callback=None)


@dataclass
class CheckpointSaves:
    """The saves of ``last.ckpt`` in phase (c)'s timed window."""

    every_n_steps: int
    seconds: list[float]
    """Wall time of each save: write to a temporary name, fsync, rename."""
    checkpoint_bytes: int
    """Size of ``last.ckpt``: weights, AdamW state, LR schedule, loop progress, RNG states."""

    def cost(self, stage: TrainingPhase, with_checkpoints: TrainingPhase) -> dict[str, Any]:
        """What saving costs, measured two ways, and its share of training time at the default interval:
        ``mean seconds a save / (EVERY_MINUTES * 60)``. The saves' own wall time is the direct figure; the
        difference of (c) and (b) over the same steps, per save, also counts any slowdown a save leaves
        behind, and the noise of two timed runs."""
        interval_s = EVERY_MINUTES * 60
        mean = sum(self.seconds) / len(self.seconds)
        per_save_ab = (with_checkpoints.seconds - stage.seconds) / len(self.seconds)
        return {
            "every_n_steps": self.every_n_steps,
            "saves_in_window": len(self.seconds),
            "save_seconds": self.seconds,
            "mean_save_seconds": mean,
            "checkpoint_bytes": self.checkpoint_bytes,
            "stage_seconds": stage.seconds,
            "with_checkpoints_seconds": with_checkpoints.seconds,
            "overhead_in_window": with_checkpoints.seconds / stage.seconds - 1,
            "seconds_per_save_from_difference": per_save_ab,
            "default_every_minutes": EVERY_MINUTES,
            "overhead_at_default_interval": mean / interval_s,
            "overhead_at_default_interval_from_difference": per_save_ab / interval_s,
            "target": CHECKPOINT_COST_TARGET,
            "met": max(mean, per_save_ab) / interval_s < CHECKPOINT_COST_TARGET,
        }


def run_checkpointed(
    options: TrainThroughput, root: Path, model: torch.nn.Module, rows: list[list[int]], lengths: np.ndarray
) -> tuple[TrainingPhase, CheckpointSaves]:
    """(c): the stage again from ``model``'s weights, saving ``last.ckpt`` every ``--checkpoint_every_steps``, on
    the batches of (b) (``rows``, checked); the saves that fall in the timed window."""
    every = options.checkpoint_every_steps
    timer = StepTimer(options.warmup_steps, options.steps)
    cli = stage(options, root / "c", timer, every)
    cli.model.model = model
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    phase, checkpointed_rows = timer.phase("(c) +ckpt", lengths)
    if checkpointed_rows != rows:
        raise RuntimeError("(c) trained on other batches than (b)")
    last = next(c for c in cli.trainer.callbacks if isinstance(c, LastCheckpoint))
    # The timer runs before any Checkpoint callback: a save at the last warm-up step falls in the window, one at
    # the last timed step (and the one when training ends) after it.
    window = range(options.warmup_steps, options.warmup_steps + options.steps)
    saves = CheckpointSaves(every, [s for step, s in last.saves if step in window], last.path.stat().st_size)
    cli.datamodule.trainer = None
    return phase, saves


# ----------------------------------------------------------------------------- (a) plain loop


def pair_texts(dm: StudentDataModule) -> list[tuple[str, str]]:
    """The (query, passage) texts of every pair of ``dm``'s training split, in its order."""
    h = dm.hparams
    labelled = load_label_table(h.teacher_data, h.label, first_stages=h.first_stages, qrels=dm.judgments())
    texts = [TeacherDataset.open(folder).to_pandas(["query", "passage"]).to_numpy() for folder in labelled.sources]
    sources = labelled.table[SOURCE].to_numpy()[dm.train.rows].tolist()
    source_rows = labelled.table[SOURCE_ROW].to_numpy()[dm.train.rows].tolist()
    return [tuple(texts[s][r]) for s, r in zip(sources, source_rows, strict=True)]


@dataclass(frozen=True)
class PlainLoop:
    """How the plain loop trains: the stage's batch budget, sequence length, optimiser and precision."""

    batch_size: int
    """Pairs per batch, each padded to ``max_length``."""
    max_length: int
    lr: float
    """The stage's peak learning rate (constant here)."""
    weight_decay: float
    gradient_clip_val: float | None
    bf16: bool
    """bf16 autocast (the trainer's ``bf16-mixed``), else fp32."""

    @classmethod
    def of(cls, trainer: Trainer, module: LightningModule, dm: StudentDataModule) -> PlainLoop:
        """The plain loop of a fitted stage."""
        h = dm.hparams
        size = h.batch_size if h.max_batch_tokens is None else h.max_batch_tokens // h.max_length
        lr = trainer.optimizers[0].defaults["lr"]
        clip = trainer.gradient_clip_val
        return cls(size, h.max_length, lr, module.hparams.weight_decay, clip, str(trainer.precision) == "bf16-mixed")

    def to_json(self, device: torch.device) -> dict[str, Any]:
        return {
            "name": "AdamW",
            "fused": device.type == "cuda",
            "lr": self.lr,
            "weight_decay": self.weight_decay,
            "gradient_clip_val": self.gradient_clip_val,
        }


def run_plain(
    model: torch.nn.Module,
    tokenizer: Any,
    pairs: list[tuple[str, str]],
    targets: np.ndarray,
    warmup_rows: list[int],
    timed_rows: list[int],
    loop: PlainLoop,
    device: torch.device,
) -> TrainingPhase:
    """Train ``model`` on ``pairs`` (query, passage) against ``targets`` (``[n]``), the plain way: fixed batches of
    ``loop.batch_size`` pairs cut from ``warmup_rows`` (untimed), then from ``timed_rows`` (timed), each tokenised
    in the loop and padded to ``loop.max_length``."""
    model.to(device).train()
    optimizer = adamw(model.named_parameters(), loop.lr, loop.weight_decay)
    masks: list[torch.Tensor] = []
    tokenize_seconds = 0.0

    def step(rows: list[int]) -> torch.Tensor:
        nonlocal tokenize_seconds
        start = time.perf_counter()
        encoded = tokenizer(
            [pairs[i][0] for i in rows],
            [pairs[i][1] for i in rows],
            padding="max_length",
            truncation="only_second",
            max_length=loop.max_length,
            return_tensors="pt",
        )
        tokenize_seconds += time.perf_counter() - start
        masks.append(encoded["attention_mask"])
        inputs = {k: v.to(device) for k, v in encoded.items()}
        target = torch.tensor(targets[rows], dtype=torch.float32).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=loop.bf16):
            scores = model(**inputs).logits.squeeze(-1)
            loss = torch.nn.functional.mse_loss(scores.float(), target)
        loss.backward()
        if loop.gradient_clip_val:
            torch.nn.utils.clip_grad_norm_(model.parameters(), loop.gradient_clip_val)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    size = loop.batch_size
    for i in range(0, len(warmup_rows), size):
        step(warmup_rows[i : i + size])
    masks.clear()
    tokenize_seconds = 0.0
    syncs = HostSyncs(device)
    with Window(device) as window:
        syncs.start()
        for i in range(0, len(timed_rows), size):
            loss = step(timed_rows[i : i + size])
        syncs.stop()
    return TrainingPhase(
        name="(a) plain",
        steps=len(masks),
        samples=len(timed_rows),
        real_tokens=int(sum(int(m.sum()) for m in masks)),
        padded_tokens=sum(m.numel() for m in masks),
        last_loss=float(loss),
        breakdown_seconds={"tokenize": tokenize_seconds},
        host_syncs=syncs.count,
        host_sync_sites=syncs.sites,
        batch_shapes=sorted({tuple(m.shape) for m in masks}),
        **window.figures(),
    )


# ----------------------------------------------------------------------------- the run


def run(options: TrainThroughput, invocation: dict[str, Any]) -> int:
    """Time (b), (c) and (a), write the result and print the report; 1 if (a) and (b) did not do the same work."""
    set_threads(options.threads)
    logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    (CHECKOUT / "checkpoints").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="train-throughput-", dir=CHECKOUT / "checkpoints") as tmp:
        root = Path(tmp)
        timer = StepTimer(options.warmup_steps, options.steps, options.profile)
        cli = stage(options, root / "b", timer)
        trainer, module, dm = cli.trainer, cli.model, cli.datamodule
        device, precision = trainer.strategy.root_device, str(trainer.precision)
        if precision not in ("bf16-mixed", "32-true"):
            raise InputError(f"trainer.precision {precision}: the plain loop runs in bf16-mixed or 32-true")
        dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float32
        h = module.hparams
        torch.manual_seed(int(cli.config.seed_everything))
        model, _ = build_student(h.backbone, h.random_init, h.dropout, h.head)
        model.train()  # from_pretrained returns it in eval mode, and Lightning keeps submodules' modes
        n_params = sum(p.numel() for p in model.parameters())
        n_embedding = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))
        info = model_info(module, model, n_params, n_embedding, int(cli.config.seed_everything))
        plain_model = copy.deepcopy(model)  # (b) trains `model` in place; (a) and (c) start from the same weights
        checkpointed_model = copy.deepcopy(model) if options.checkpoint_every_steps else None
        ceiling = Ceiling(device, dtype, options.matmul_size or MATMUL_SIZE[device.type], options.matmul_reps)

        ceiling.measure()
        module.model = model  # built already: configure_model keeps it, so every phase starts from the same weights
        trainer.fit(module, datamodule=dm)
        lengths = np.asarray(dm.train.lengths)
        staged, rows = timer.phase("(b) stage", lengths)
        loop, pad_multiple = PlainLoop.of(trainer, module, dm), dm.pad_multiple
        dm.trainer = None  # the datamodule would keep the trainer, and through it the model and AdamW state, alive
        del model, module, trainer, cli
        free_memory()
        checkpointed = saves = None
        if checkpointed_model is not None:
            checkpointed, saves = run_checkpointed(options, root, checkpointed_model, rows, lengths)
            del checkpointed_model
            free_memory()
    warm = [i for r in rows[: options.warmup_steps] for i in r]
    timed = [i for r in rows[options.warmup_steps :] for i in r]
    plain = run_plain(plain_model, dm.tokenizer, pair_texts(dm), dm.train.targets, warm, timed, loop, device)
    ceiling.measure()
    measured = [plain, staged] if checkpointed is None else [plain, staged, checkpointed]
    for phase in measured:
        phase.finish(n_params, n_params - n_embedding, ceiling.rate)

    speedup = staged.per_s("samples") / plain.per_s("samples")
    check = {
        "samples": len(timed),
        "real_tokens_plain": plain.real_tokens,
        "real_tokens_stage": staged.real_tokens,
        "last_loss_plain": plain.last_loss,
        "last_loss_stage": staged.last_loss,
        "ok": plain.samples == staged.samples
        and plain.real_tokens == staged.real_tokens
        and math.isfinite(plain.last_loss)
        and math.isfinite(staged.last_loss),
    }
    dh = dm.hparams
    result = {
        "benchmark": "student_train",
        **invocation,
        "environment": {**environment(device, dtype), "precision": precision},
        "model": info,
        "workload": {
            "teacher_data": dh.teacher_data,
            "label": dh.label,
            "train_pairs": len(dm.train),
            "train_queries": len(np.unique(dm.train.query)),
            "held_out_queries": dh.val_queries,
            "truncated_pairs": dm.truncated,
            "mean_tokens": float(lengths.mean()),
            "max_length": dh.max_length,
            "batch_size": dh.batch_size,
            "max_batch_tokens": dh.max_batch_tokens,
            "plain_batch_size": loop.batch_size,
            "pad_to_multiple_of": pad_multiple,
            "compile": info["compile"],
            "unpad": info["unpad"],
            "num_workers": dh.num_workers,
            "steps": options.steps,
            "warmup_steps": options.warmup_steps,
            "precision": precision,
            "optimizer": loop.to_json(device),
            "loss": info["loss"],
        },
        "matmul": ceiling.to_json(),
        "plain": plain.to_json(),
        "stage": staged.to_json(),
        "speedup_samples_per_s": speedup,
        "speedup_real_tokens_per_s": staged.per_s("real_tokens") / plain.per_s("real_tokens"),
        "check": check,
        "stage_with_checkpoints": None if checkpointed is None else checkpointed.to_json(),
        "checkpointing": None if saves is None else saves.cost(staged, checkpointed),
        "targets": {
            "mfu": TARGET_MFU,
            "speedup": TARGET_SPEEDUP,
            "mfu_met": staged.mfu >= TARGET_MFU,
            "speedup_met": speedup >= TARGET_SPEEDUP,
        },
    }
    print(report(result, measured))
    write_result(result, options.out or RESULTS / f"student-train-{device.type}-{slug(info['name'])}.json")
    return 0 if check["ok"] else 1


def model_info(
    module: LightningModule, model: torch.nn.Module, n_params: int, n_embedding: int, seed: int
) -> dict[str, Any]:
    """What was trained: the backbone, where its weights come from, its size, shapes and the stage's levers."""
    h, config = module.hparams, model.config
    known = ARCHITECTURES.get(h.backbone)
    return {
        "name": h.backbone,
        "weights": f"random init (seed {seed})" if h.random_init else resolve_model(h.backbone).identity,
        "tokenizer": known.tokenizer if known is not None else h.backbone,
        "architecture": type(model).__name__,
        "n_params": n_params,
        "n_params_counts": "all parameters: embeddings, pooler and score head included",
        "n_embedding_params": n_embedding,
        "n_embedding_params_counts": "nn.Embedding tables: word, position and token type embeddings",
        "n_non_embedding_params": n_params - n_embedding,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "attn_implementation": getattr(config, "_attn_implementation", None),
        "head": h.head,
        "loss": h.loss,
        "compile": h.compile,
        "unpad": h.unpad,
    }


COLUMNS = (
    Column("phase", -10, lambda p: p.name),
    Column("steps", 5, lambda p: f"{p.steps}"),
    Column("samples", 7, lambda p: f"{p.samples}"),
    Column("real tok", 9, lambda p: f"{p.real_tokens}"),
    Column("padded tok", 10, lambda p: f"{p.padded_tokens}"),
    Column("time s", 8, lambda p: f"{p.seconds:.3f}"),
    Column("s/step", 7, lambda p: f"{p.seconds / p.steps:.3f}"),
    Column("samples/s", 9, lambda p: f"{p.per_s('samples'):.2f}"),
    Column("real tok/s", 10, lambda p: f"{p.per_s('real_tokens'):.0f}"),
    Column("padded tok/s", 12, lambda p: f"{p.per_s('padded_tokens'):.0f}"),
    Column("peak MiB", 9, lambda p: f"{p.peak_memory_bytes / 2**20:.0f}"),
    Column("TFLOP/s", 8, lambda p: f"{p.achieved_flops_per_s / 1e12:.3f}"),
    Column("MFU", 6, lambda p: f"{p.mfu:.1%}"),
    Column("MFU ne", 6, lambda p: f"{p.mfu_non_embedding:.1%}"),
)


def report(result: dict[str, Any], measured: Sequence[TrainingPhase]) -> str:
    """The run's figures for a reader: model, workload, each phase, the speed-up, checkpoints, checks, targets."""
    model, work = result["model"], result["workload"]
    plain = measured[0]
    batches = (
        f"batch {work['batch_size']}"
        if work["max_batch_tokens"] is None
        else f"(b) {work['max_batch_tokens']} padded tokens a batch (multiples of {work['pad_to_multiple_of']}), "
        f"(a) {work['plain_batch_size']} pairs x {work['max_length']}"
    )
    lines = header(
        result,
        [
            f"{model['name']} ({model['weights']}), {model['architecture']}, {model['n_params'] / 1e6:.1f}M params, "
            f"precision {work['precision']}, compile {model['compile']}, unpad {model['unpad']}",
            f"(n_params counts all parameters, embeddings included; MFU ne counts the "
            f"{model['n_non_embedding_params'] / 1e6:.1f}M non-embedding ones)",
        ],
        f"{work['teacher_data']} ({work['label']}): {work['train_pairs']} training pairs of {work['train_queries']} "
        f"queries, {work['truncated_pairs']} truncated to {work['max_length']} tokens; {batches}, "
        f"{work['warmup_steps']} warm-up + {work['steps']} timed steps",
    )
    lines += [
        "",
        table(measured, COLUMNS),
        f"peak memory: {plain.memory_kind}",
        "padding: "
        + ", ".join(f"{p.name} {1 - p.real_tokens / p.padded_tokens:.1%} of the tokens fed" for p in measured),
        f"(a) tokenising in the loop: {plain.breakdown_seconds['tokenize']:.3f} s of {plain.seconds:.3f} s",
        "batch shapes: " + "; ".join(f"{p.name} {len(p.batch_shapes)}: {p.batch_shapes}" for p in measured),
    ]
    if plain.host_syncs is not None:
        lines.append("host syncs in the timed window: " + ", ".join(f"{p.name} {p.host_syncs}" for p in measured))
        lines += [f"  {p.name} {n} x {site}" for p in measured for site, n in Counter(p.host_sync_sites).most_common()]
    lines += ["", f"speed-up (b)/(a): {result['speedup_samples_per_s']:.2f}x samples/s"]
    if cost := result["checkpointing"]:
        lines += [
            f"checkpoints (c): last.ckpt ({cost['checkpoint_bytes'] / 2**20:.0f} MiB) every {cost['every_n_steps']} "
            f"steps, {cost['saves_in_window']} saves in the window, {cost['mean_save_seconds']:.2f} s a save (fsync "
            f"included); (c) took {cost['overhead_in_window']:+.1%} of (b)'s time, "
            f"{cost['seconds_per_save_from_difference']:.2f} s a save",
            f"at the default interval ({cost['default_every_minutes']:g} min): "
            f"{cost['overhead_at_default_interval']:.2%} of training time "
            f"({cost['overhead_at_default_interval_from_difference']:.2%} from the (c)-(b) difference); "
            f"target < {cost['target']:.0%}: {met(cost['met'])}",
        ]
    check, targets = result["check"], result["targets"]
    lines += [
        f"same work: {check['samples']} pairs and {check['real_tokens_plain']} / {check['real_tokens_stage']} "
        f"real tokens in (a) / (b), losses {check['last_loss_plain']:.4g} / {check['last_loss_stage']:.4g}: "
        f"{'ok' if check['ok'] else 'MISMATCH'}",
        f"issue targets (BERT-large config on an H100): MFU >= {targets['mfu']:.0%}: {met(targets['mfu_met'])}; "
        f"speed-up >= {targets['speedup']:g}x: {met(targets['speedup_met'])}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.train_throughput ARGS [-- DISTILL TRAIN ARGS]``; its exit status."""
    return phases.main(TrainThroughput, run, "benchmarks.train_throughput", argv)


if __name__ == "__main__":
    sys.exit(main())
