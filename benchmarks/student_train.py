"""Training throughput of the student stage against a plain loop that pads every pair to a fixed length,
on the real DL19 teacher triplets.

Both phases train the same cross-encoder (:func:`students.model.build_student`, in train mode: dropout
on) from the same initial weights, with AdamW (fused on a GPU), pointwise MSE against the teacher score
(``--label``), optionally gradient clipping, and on a GPU bf16 autocast, and they are timed on the same
training pairs in the same order:

(a) plain: each batch of ``--batch-size`` pairs (with ``--max-batch-tokens``, of ``--max-batch-tokens //
    --max-length`` pairs: the same token budget) is tokenised in the loop with
    ``tokenizer(queries, passages, padding="max_length", max_length=--max-length, truncation="only_second")``,
    copied to the device, then forward, loss, backward, (clip,) ``optimizer.step()``, ``zero_grad()``.
(b) stage: :class:`students.data.StudentDataModule` (pairs tokenised once in ``setup``, batches from
    :class:`students.sampling.LengthGroupedBatches`, or with ``--max-batch-tokens`` from
    :class:`students.sampling.TokenBudgetBatches`, padded to their longest pair rounded up to
    ``--pad-to-multiple-of`` by the ``Collator``) and :class:`students.module.CrossEncoderModule` (its
    ``training_step`` and ``configure_optimizers``; with ``--compile``, its compiled blocks), driven by a
    Lightning ``Trainer`` with ``max_steps``, as ``distill train`` drives them.

Stage (b) runs first; its batches decide the examples. (a) then gets the same examples, in the same
order, cut into fixed batches. Each phase is timed from the end of its last ``--warmup-steps`` step to
the end of its last timed step, with the device synchronised at both ends (compiling happens in the
warm-up steps, and at most once more on a new shape). The window holds everything a training step
costs: data (tokenising in (a), collating in (b)), the host-to-device copy, forward, backward and the
optimiser step, and in (b) Lightning's loop. On a GPU, the host synchronisations in each window are
counted, each with the ``file:line`` it came from (``torch.cuda.set_sync_debug_mode``'s warnings, not its
once-a-process notice that it "does not yet detect all synchronizing operations"): the stage's steps
should have none.

With ``--checkpoint-every-steps K``, (c) repeats (b), from the same weights on the same batches, with
:class:`students.checkpointing.LastCheckpoint` writing ``last.ckpt`` (to a temporary name, fsynced,
renamed; into a temporary folder under ``checkpoints/``, where runs write theirs) every K optimiser
steps. Reported: the wall time of each save in the window, and the checkpoint's share of training time at
the default interval, ``seconds a save / (EVERY_MINUTES * 60)``, from those times and from the difference
of (c) and (b) per save.

Reported per phase: samples/s, real tokens/s (``attention_mask`` ones, padding excluded), padded
tokens/s (all tokens fed), peak memory and MFU, ``6 * n_params * real_tokens / seconds`` over the
rate of a large square matmul in the compute dtype measured in the same run. ``n_params`` counts
every parameter, embeddings included; ``mfu_non_embedding`` counts only the parameters outside the
embedding tables, which do no matmul (about half of MiniLM-L6's, a tenth of BERT-large's).

Run ``python benchmarks/student_train.py --help``; results go to ``benchmarks/results/`` as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import logging
import math
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import (
    RESULTS,
    ROOT,
    display_path,
    invocation,
    slug,
    writable_file,
    yes,
)
from pytorch_lightning import Callback, LightningModule, Trainer

from distill.bench.measure import MemoryProbe, dtype_name, environment, matmul_flops_per_s, synchronize
from distill.bench.profile import StageProfile
from distill.core.devices import MATMUL_SIZE, TRAIN_PAD_MULTIPLE, resolve_device
from distill.core.models import ARCHITECTURES, resolve_model
from distill.core.teacher_data import TeacherDataset
from students.checkpointing import EVERY_MINUTES, LastCheckpoint
from students.data import StudentDataModule
from students.model import build_student
from students.module import CrossEncoderModule

DEFAULT_TEACHER_DATA = ROOT / "data" / "teacher" / "dl19-bm25-smollm2"
HELD_OUT_QUERIES = 1
"""``StudentDataModule`` always holds out some queries for validation; the fewest it allows, so that
almost every pair is a training pair. Validation itself is switched off."""
LR = 3e-5
"""AdamW learning rate of both phases (the ``CrossEncoderModule`` default)."""
WEIGHT_DECAY = 0.01
"""AdamW weight decay of both phases (the ``CrossEncoderModule`` default)."""
PRECISIONS = ("bf16-mixed", "32")
# Issue 19's targets, stated for BERT-large on an H100 at the GPU config's token budget.
TARGET_MFU = 0.40
TARGET_SPEEDUP = 1.5
CHECKPOINT_COST_TARGET = 0.02
"""Issue #13: periodic checkpointing at the default interval costs less than this share of training time."""


@dataclass
class Phase:
    """The figures of one phase's timed steps."""

    name: str
    steps: int
    """Optimiser steps timed."""
    samples: int
    """(query, passage) pairs trained on in the timed steps."""
    real_tokens: int
    """Tokens fed, padding excluded (``attention_mask`` ones)."""
    padded_tokens: int
    """Tokens fed, padding included (``batch x padded length``, summed over the steps)."""
    seconds: float
    """Wall time of the timed steps, device synchronised at both ends."""
    peak_memory_bytes: int
    memory_kind: str
    """What ``peak_memory_bytes`` is (GPU allocator peak or process peak RSS)."""
    last_loss: float
    """Training loss of the last timed step (a sanity check: finite)."""
    mfu: float = 0.0
    """``6 * n_params * real_tokens / seconds / matmul_flops_per_s``."""
    mfu_non_embedding: float = 0.0
    """The same with the non-embedding parameters only (embedding lookups do no matmul)."""
    achieved_flops_per_s: float = 0.0
    """``6 * n_params * real_tokens / seconds`` (FLOP/s)."""
    breakdown_seconds: dict[str, float] = field(default_factory=dict)
    """Host time of parts of the timed window (not synchronised, so they may overlap device work)."""
    host_syncs: int | None = None
    """Host synchronisations in the timed window, as CUDA's sync debug mode reports them (None on a CPU)."""
    host_sync_sites: list[str] = field(default_factory=list)
    """``file:line`` of the Python call behind each of ``host_syncs``."""
    batch_shapes: list[tuple[int, int]] = field(default_factory=list)
    """The distinct ``(pairs, padded length)`` shapes of the timed steps' batches."""

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / self.steps

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds

    @property
    def real_tokens_per_s(self) -> float:
        return self.real_tokens / self.seconds

    @property
    def padded_tokens_per_s(self) -> float:
        return self.padded_tokens / self.seconds

    @property
    def padding_fraction(self) -> float:
        """Share of the fed tokens that are padding."""
        return 1 - self.real_tokens / self.padded_tokens

    def finish(self, n_params: int, n_non_embedding: int, matmul_flops_per_s: float) -> None:
        """Fill in the FLOP figures from the model size (all and non-embedding parameters) and the matmul
        rate (FLOP/s)."""
        self.achieved_flops_per_s = 6 * n_params * self.real_tokens / self.seconds
        self.mfu = self.achieved_flops_per_s / matmul_flops_per_s
        self.mfu_non_embedding = 6 * n_non_embedding * self.real_tokens / self.seconds / matmul_flops_per_s

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "seconds_per_step": self.seconds_per_step,
            "samples_per_s": self.samples_per_s,
            "real_tokens_per_s": self.real_tokens_per_s,
            "padded_tokens_per_s": self.padded_tokens_per_s,
            "padding_fraction": self.padding_fraction,
        }


# ----------------------------------------------------------------------------- arguments


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--backbone",
        default="all-minilm-l6-v2",
        help="any name resolve_model takes; bert-large-uncased builds offline from its embedded config",
    )
    p.add_argument(
        "--random-init",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="random weights from the backbone's config (default: on for the embedded architectures, "
        f"{', '.join(a for a in ARCHITECTURES if 'bert' in a)}, whose weights are absent offline)",
    )
    p.add_argument(
        "--teacher-data",
        default=str(DEFAULT_TEACHER_DATA),
        help="a folder written by `distill teach` (default: the DL19 BM25 SmolLM2 triplets)",
    )
    p.add_argument("--label", default="cis", help="the teacher score column regressed")
    p.add_argument("--device", default="auto", help="auto (cuda where there is one), cpu or cuda[:N]")
    p.add_argument("--precision", choices=PRECISIONS, help="default: bf16-mixed on cuda, 32 on cpu")
    p.add_argument("--batch-size", type=int, default=32, help="pairs per optimiser step")
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        help="(b) batches by this budget of padded tokens, (a) by max-batch-tokens // max-length pairs (default: "
        "--batch-size pairs each)",
    )
    p.add_argument(
        "--pad-to-multiple-of",
        type=int,
        help=f"(b) pads each batch to a multiple of this (default: the device's, {TRAIN_PAD_MULTIPLE})",
    )
    p.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, default=False, help="(b) compiles the encoder's blocks"
    )
    p.add_argument(
        "--unpad",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="(b) runs the encoder's layers on the real tokens only (distill.core.unpadding)",
    )
    p.add_argument("--num-workers", type=int, default=0, help="(b)'s data loader workers")
    p.add_argument("--steps", type=int, default=20, help="timed optimiser steps per phase")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed optimiser steps before them, per phase (>= 1)")
    p.add_argument(
        "--max-length",
        type=int,
        default=256,
        help="tokens per pair: (a) pads every pair to it; both truncate the passage to it",
    )
    p.add_argument(
        "--gradient-clip-val",
        type=float,
        default=0.0,
        help="gradient norm clip of both phases (default 0: none; the train configs use 1.0)",
    )
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--matmul-size", type=int, help="side of the square matmul (default 8192 on cuda, 2048 on cpu)")
    p.add_argument("--matmul-reps", type=int, default=10, help="timed matmul repetitions (after 3 warm-up ones)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights and of the batch order")
    p.add_argument(
        "--checkpoint-every-steps",
        type=int,
        help="also time (c): (b) with LastCheckpoint writing last.ckpt every this many optimiser steps, and "
        f"report what a save costs and its share of training time at the default interval ({EVERY_MINUTES:g} min)",
    )
    p.add_argument(
        "--profile",
        type=writable_file,
        help="also record (b)'s timed steps with torch.profiler into this file (distill.bench.profile; the profiler "
        "slows them, so use the run's figures only as a profile)",
    )
    p.add_argument(
        "--out",
        type=writable_file,
        help="JSON result (default benchmarks/results/student-train-<device>-<backbone>.json)",
    )
    args = p.parse_args(argv)
    positive = ("batch_size", "steps", "warmup_steps", "max_length", "matmul_size", "matmul_reps", "threads")
    positive += ("max_batch_tokens", "pad_to_multiple_of")
    for name in (*positive, "checkpoint_every_steps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.gradient_clip_val < 0:
        p.error("--gradient-clip-val must not be negative")
    if args.random_init is None:
        args.random_init = args.backbone in ARCHITECTURES
    if args.precision is None:
        args.precision = "bf16-mixed" if resolve_device(args.device).type == "cuda" else "32"
    if args.pad_to_multiple_of is None:
        args.pad_to_multiple_of = TRAIN_PAD_MULTIPLE[resolve_device(args.device).type]
    if args.max_batch_tokens is not None and args.max_batch_tokens < args.max_length:
        p.error("--max-batch-tokens must hold at least one pair of --max-length tokens")
    if args.num_workers < 0:
        p.error("--num-workers must not be negative")
    return args


def plain_batch_size(args: argparse.Namespace) -> int:
    """Pairs per batch of the plain loop: ``--batch-size``, or as many ``--max-length`` pairs as the token budget
    holds."""
    return args.batch_size if args.max_batch_tokens is None else args.max_batch_tokens // args.max_length


SYNC_WARNING = "called a synchronizing CUDA operation"
"""The start of the warning that CUDA's sync debug mode gives for each host synchronisation. Setting the mode also
warns, once a process, that it "does not yet detect all synchronizing operations": that notice is no sync."""


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


# ----------------------------------------------------------------------------- (b) the student stage


class StepTimer(Callback):
    """Times the ``steps`` optimiser steps after the first ``warmup`` of a ``Trainer`` run, from the end of
    the last warm-up step to the end of the last timed one, and records every step's batch without
    synchronising the device: its ``index`` tensor (rows of the training split) and its padded shape."""

    def __init__(self, warmup: int, steps: int, device: torch.device, profile: StageProfile | None = None) -> None:
        self.warmup, self.steps, self.device, self.profile = warmup, steps, device, profile
        self.probe = MemoryProbe(device)
        self.syncs = HostSyncs(device)
        self.indices: list[torch.Tensor] = []
        self.shapes: list[tuple[int, int]] = []
        self.start = self.seconds = math.nan
        self.peak = 0
        self.last_loss: torch.Tensor | None = None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self.indices.append(batch["index"])
        self.shapes.append(tuple(batch["input_ids"].shape))

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if len(self.indices) == self.warmup:
            self.probe.reset()
            if self.profile is not None:
                self.profile.start()
            synchronize(self.device)
            self.start = time.perf_counter()
            self.syncs.start()
        elif len(self.indices) == self.warmup + self.steps:
            self.syncs.stop()
            synchronize(self.device)
            self.seconds = time.perf_counter() - self.start
            if self.profile is not None:
                self.profile.stop()
            self.peak = self.probe.peak()
            self.last_loss = outputs["loss"] if isinstance(outputs, dict) else outputs


def run_stage(
    model: torch.nn.Module,
    dm: StudentDataModule,
    args: argparse.Namespace,
    device: torch.device,
    checkpoint_every: int | None = None,
) -> tuple[Phase, list[list[int]], CheckpointSaves | None]:
    """Train ``model`` for ``warmup + steps`` steps the student stage's way (``CrossEncoderModule`` on ``dm``
    under a Lightning ``Trainer``), timing the last ``steps``; with ``checkpoint_every``, with a
    :class:`LastCheckpoint` that saves ``last.ckpt`` every that many optimiser steps, in a temporary folder
    under ``checkpoints/`` (where runs write theirs).

    Returns the phase, the rows of ``dm.train`` in each step's batch (warm-up steps included) and, with
    ``checkpoint_every``, the saves made in the timed window.
    """
    module = CrossEncoderModule(
        backbone=args.backbone,
        random_init=args.random_init,
        loss="mse",
        lr=LR,
        weight_decay=WEIGHT_DECAY,
        compile=args.compile,
        unpad=args.unpad,
    )
    module.model = model  # built already: configure_model keeps it, so every phase starts from the same weights
    profile = StageProfile(args.profile, device) if args.profile and checkpoint_every is None else None
    timer = StepTimer(args.warmup_steps, args.steps, device, profile)
    (ROOT / "checkpoints").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="student-train-bench-", dir=ROOT / "checkpoints") as root:
        last = None if checkpoint_every is None else LastCheckpoint(Path(root), None, checkpoint_every)
        trainer = Trainer(
            accelerator="gpu" if device.type == "cuda" else "cpu",
            devices=[device.index or 0] if device.type == "cuda" else 1,
            precision="32-true" if args.precision == "32" else args.precision,
            max_steps=args.warmup_steps + args.steps,
            gradient_clip_val=args.gradient_clip_val or None,
            use_distributed_sampler=False,  # as in `distill train`: the batch samplers shard themselves
            limit_val_batches=0,
            num_sanity_val_steps=0,
            logger=False,
            enable_checkpointing=last is not None,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[timer] if last is None else [timer, last],
            default_root_dir=root,
        )
        trainer.fit(module, datamodule=dm)
        saves = None
        if last is not None:
            # StepTimer runs before any Checkpoint callback: a save at the last warm-up step falls in the
            # window, one at the last timed step (and the one when training ends) after it.
            window = range(args.warmup_steps, args.warmup_steps + args.steps)
            seconds = [s for step, s in last.saves if step in window]
            saves = CheckpointSaves(checkpoint_every, seconds, last.path.stat().st_size)
    if math.isnan(timer.seconds):
        raise RuntimeError(f"the stage stopped after {len(timer.indices)} of {args.warmup_steps + args.steps} steps")
    rows = [t.tolist() for t in timer.indices]
    timed = slice(args.warmup_steps, None)
    lengths = np.asarray(dm.train.lengths)
    phase = Phase(
        "(b) stage" if last is None else "(c) +ckpt",
        steps=args.steps,
        samples=sum(len(r) for r in rows[timed]),
        real_tokens=int(sum(lengths[r].sum() for r in rows[timed])),
        padded_tokens=sum(b * n for b, n in timer.shapes[timed]),
        seconds=timer.seconds,
        peak_memory_bytes=timer.peak,
        memory_kind=timer.probe.kind,
        last_loss=float(timer.last_loss) if timer.last_loss is not None else math.nan,
        host_syncs=timer.syncs.count,
        host_sync_sites=timer.syncs.sites,
        batch_shapes=sorted(set(timer.shapes[timed])),
    )
    dm.trainer = None  # the datamodule would keep the trainer, and through it the model and AdamW state, alive
    del trainer, module, timer, last
    return phase, rows, saves


@dataclass
class CheckpointSaves:
    """The saves of ``last.ckpt`` in phase (c)'s timed window."""

    every_n_steps: int
    seconds: list[float]
    """Wall time of each save: write to a temporary name, fsync, rename."""
    checkpoint_bytes: int
    """Size of ``last.ckpt``: weights, AdamW state, LR schedule, loop progress, RNG states."""

    def cost(self, stage: Phase, with_checkpoints: Phase) -> dict[str, Any]:
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


# ----------------------------------------------------------------------------- (a) plain loop


def run_plain(
    model: torch.nn.Module,
    tokenizer: Any,
    pairs: list[tuple[str, str]],
    targets: np.ndarray,
    warmup_rows: list[int],
    timed_rows: list[int],
    args: argparse.Namespace,
    device: torch.device,
) -> Phase:
    """Train ``model`` on ``pairs`` (query, passage) against ``targets``, the plain way: fixed batches of
    :func:`plain_batch_size` pairs cut from ``warmup_rows`` (untimed), then from ``timed_rows`` (timed), each
    tokenised in the loop and padded to ``--max-length``."""
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, fused=device.type == "cuda")
    amp = args.precision == "bf16-mixed"
    size = plain_batch_size(args)
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
            max_length=args.max_length,
            return_tensors="pt",
        )
        tokenize_seconds += time.perf_counter() - start
        masks.append(encoded["attention_mask"])
        inputs = {k: v.to(device) for k, v in encoded.items()}
        target = torch.tensor(targets[rows], dtype=torch.float32).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            scores = model(**inputs).logits.squeeze(-1)
            loss = torch.nn.functional.mse_loss(scores.float(), target)
        loss.backward()
        if args.gradient_clip_val:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.gradient_clip_val)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    for i in range(0, len(warmup_rows), size):
        step(warmup_rows[i : i + size])
    masks.clear()
    tokenize_seconds = 0.0
    probe = MemoryProbe(device)
    probe.reset()
    syncs = HostSyncs(device)
    synchronize(device)
    start = time.perf_counter()
    syncs.start()
    for i in range(0, len(timed_rows), size):
        loss = step(timed_rows[i : i + size])
    syncs.stop()
    synchronize(device)
    seconds = time.perf_counter() - start
    phase = Phase(
        "(a) plain",
        steps=len(masks),
        samples=len(timed_rows),
        real_tokens=int(sum(int(m.sum()) for m in masks)),
        padded_tokens=sum(m.numel() for m in masks),
        seconds=seconds,
        peak_memory_bytes=probe.peak(),
        memory_kind=probe.kind,
        last_loss=float(loss),
        breakdown_seconds={"tokenize": tokenize_seconds},
        host_syncs=syncs.count,
        host_sync_sites=syncs.sites,
        batch_shapes=sorted({tuple(m.shape) for m in masks}),
    )
    return phase


# ----------------------------------------------------------------------------- reporting


def print_report(result: dict[str, Any], phases: list[Phase]) -> None:
    env, model, work, mm = result["environment"], result["model"], result["workload"], result["matmul"]
    print(f"command   : {result['command']}")
    print(f"device    : {env['device']} ({env['device_name']}), torch {env['torch']}, {env['torch_threads']} threads")
    print(
        f"model     : {model['name']} ({model['weights']}), {model['architecture']}, "
        f"{model['n_params'] / 1e6:.1f}M params, precision {work['precision']}"
    )
    print(
        f"            (n_params counts all parameters, embeddings included; MFU ne counts the "
        f"{model['n_non_embedding_params'] / 1e6:.1f}M non-embedding ones)"
    )
    print(
        f"workload  : {work['teacher_data']} ({work['label']}): {work['train_pairs']} training pairs of "
        f"{work['train_queries']} queries, {work['truncated_pairs']} truncated to {work['max_length']} tokens; "
        f"{batch_text(work)}, {work['warmup_steps']} warm-up + {work['steps']} timed steps"
    )
    print(
        f"matmul    : {mm['size']}^3 {env['dtype']}: {mm['flops_per_s'] / 1e12:.3f} TFLOP/s "
        f"(the larger of {mm['before_flops_per_s'] / 1e12:.3f} before and {mm['after_flops_per_s'] / 1e12:.3f} after)"
    )
    header = f"{'phase':<10} {'steps':>5} {'samples':>7} {'real tok':>9} {'padded tok':>10} {'time s':>8} "
    print(
        "\n" + header + f"{'s/step':>7} {'samples/s':>9} {'real tok/s':>10} {'padded tok/s':>12} "
        f"{'peak MiB':>9} {'TFLOP/s':>8} {'MFU':>6} {'MFU ne':>6}"
    )
    for ph in phases:
        print(
            f"{ph.name:<10} {ph.steps:>5} {ph.samples:>7} {ph.real_tokens:>9} {ph.padded_tokens:>10} "
            f"{ph.seconds:>8.3f} {ph.seconds_per_step:>7.3f} {ph.samples_per_s:>9.2f} {ph.real_tokens_per_s:>10.0f} "
            f"{ph.padded_tokens_per_s:>12.0f} {ph.peak_memory_bytes / 2**20:>9.0f} "
            f"{ph.achieved_flops_per_s / 1e12:>8.3f} {ph.mfu:>6.1%} {ph.mfu_non_embedding:>6.1%}"
        )
    print(f"peak memory: {phases[0].memory_kind}")
    print("padding: " + ", ".join(f"{ph.name} {ph.padding_fraction:.1%} of the tokens fed" for ph in phases))
    print(f"(a) tokenising in the loop: {phases[0].breakdown_seconds['tokenize']:.3f} s of {phases[0].seconds:.3f} s")
    print("batch shapes: " + "; ".join(f"{ph.name} {len(ph.batch_shapes)}: {ph.batch_shapes}" for ph in phases))
    if phases[0].host_syncs is not None:
        print("host syncs in the timed window: " + ", ".join(f"{ph.name} {ph.host_syncs}" for ph in phases))
        for ph in phases:
            for site, n in Counter(ph.host_sync_sites).most_common():
                print(f"  {ph.name} {n} x {site}")
    print(f"\nspeed-up (b)/(a): {result['speedup_samples_per_s']:.2f}x samples/s")
    if cost := result["checkpointing"]:
        print(
            f"checkpoints (c): last.ckpt ({cost['checkpoint_bytes'] / 2**20:.0f} MiB) every {cost['every_n_steps']} "
            f"steps, {cost['saves_in_window']} saves in the window, {cost['mean_save_seconds']:.2f} s a save (fsync "
            f"included); (c) took {cost['overhead_in_window']:+.1%} of (b)'s time, "
            f"{cost['seconds_per_save_from_difference']:.2f} s a save"
        )
        print(
            f"at the default interval ({cost['default_every_minutes']:g} min): "
            f"{cost['overhead_at_default_interval']:.2%} of training time "
            f"({cost['overhead_at_default_interval_from_difference']:.2%} from the (c)-(b) difference); "
            f"target < {cost['target']:.0%}: {yes(cost['met'])}"
        )
    check = result["check"]
    print(
        f"same work: {check['samples']} pairs and {check['real_tokens_plain']} / {check['real_tokens_stage']} "
        f"real tokens in (a) / (b), losses {check['last_loss_plain']:.4g} / {check['last_loss_stage']:.4g}: "
        f"{'ok' if check['ok'] else 'MISMATCH'}"
    )
    targets = result["targets"]
    print(
        f"issue targets (BERT-large config on an H100): MFU >= {targets['mfu']:.0%}: {yes(targets['mfu_met'])}; "
        f"speed-up >= {targets['speedup']:g}x: {yes(targets['speedup_met'])}"
    )


def batch_text(work: dict[str, Any]) -> str:
    """How the phases batch: pairs, or a token budget."""
    if work.get("max_batch_tokens") is None:
        return f"batch {work['batch_size']}"
    return (
        f"(b) {work['max_batch_tokens']} padded tokens a batch (multiples of {work['pad_to_multiple_of']}), "
        f"(a) {work['plain_batch_size']} pairs x {work['max_length']}"
    )


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def embedding_params(model: torch.nn.Module) -> int:
    """Parameters of the model's ``nn.Embedding`` tables (word, position, token type)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))


def model_info(args: argparse.Namespace, model: torch.nn.Module, n_params: int) -> dict[str, Any]:
    """What was trained: the backbone, where its weights come from, its size and shapes."""
    config = model.config
    known = ARCHITECTURES.get(args.backbone)
    embedding = embedding_params(model)
    return {
        "name": args.backbone,
        "weights": f"random init (seed {args.seed})" if args.random_init else resolve_model(args.backbone).identity,
        "tokenizer": known.tokenizer if known is not None else args.backbone,
        "architecture": type(model).__name__,
        "n_params": n_params,
        "n_params_counts": "all parameters: embeddings, pooler and score head included",
        "n_embedding_params": embedding,
        "n_embedding_params_counts": "nn.Embedding tables: word, position and token type embeddings",
        "n_non_embedding_params": n_params - embedding,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "attn_implementation": getattr(config, "_attn_implementation", None),
    }


# ----------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.precision == "bf16-mixed" else torch.float32
    size = args.matmul_size or MATMUL_SIZE[device.type]
    logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")

    dm = StudentDataModule(
        [args.teacher_data],
        label=args.label,
        backbone=args.backbone,
        val_queries=HELD_OUT_QUERIES,
        batch_size=args.batch_size,
        max_batch_tokens=args.max_batch_tokens,
        pad_to_multiple_of=args.pad_to_multiple_of,
        max_length=args.max_length,
        seed=args.seed,
        num_workers=args.num_workers,
    )
    dm.setup("fit")
    columns = ["qid", "docid", "query", "passage"]
    table = TeacherDataset.open(args.teacher_data).to_pandas(columns).set_index(["qid", "docid"])
    keys = list(zip(dm.train.qid, dm.train.docid, strict=True))
    pairs = list(zip(table.loc[keys, "query"], table.loc[keys, "passage"], strict=True))

    torch.manual_seed(args.seed)
    model, _ = build_student(args.backbone, args.random_init)
    model.train()  # from_pretrained returns it in eval mode, and Lightning keeps submodules' modes
    n_params = sum(p.numel() for p in model.parameters())
    plain_model = copy.deepcopy(model)  # (b) trains `model` in place; (a) and (c) start from the same weights
    checkpointed_model = copy.deepcopy(model) if args.checkpoint_every_steps else None
    info = model_info(args, model, n_params)

    before = matmul_flops_per_s(device, dtype, size, args.matmul_reps)
    stage, rows, _ = run_stage(model, dm, args, device)
    del model
    free_memory(device)
    checkpointed = saves = None
    if checkpointed_model is not None:
        checkpointed, checkpointed_rows, saves = run_stage(
            checkpointed_model, dm, args, device, args.checkpoint_every_steps
        )
        if checkpointed_rows != rows:
            raise RuntimeError("(c) trained on other batches than (b)")
        del checkpointed_model
        free_memory(device)
    warm = [i for r in rows[: args.warmup_steps] for i in r]
    timed = [i for r in rows[args.warmup_steps :] for i in r]
    plain = run_plain(plain_model, dm.tokenizer, pairs, dm.train.targets, warm, timed, args, device)
    after = matmul_flops_per_s(device, dtype, size, args.matmul_reps)
    rate = max(before, after)  # the higher ceiling: the conservative MFU
    phases = [plain, stage] if checkpointed is None else [plain, stage, checkpointed]
    for phase in phases:
        phase.finish(n_params, n_params - embedding_params(plain_model), rate)

    speedup = stage.samples_per_s / plain.samples_per_s
    lengths = np.asarray(dm.train.lengths)
    check = {
        "samples": len(timed),
        "real_tokens_plain": plain.real_tokens,
        "real_tokens_stage": stage.real_tokens,
        "last_loss_plain": plain.last_loss,
        "last_loss_stage": stage.last_loss,
        "ok": plain.samples == stage.samples
        and plain.real_tokens == stage.real_tokens
        and math.isfinite(plain.last_loss)
        and math.isfinite(stage.last_loss),
    }
    result = {
        "benchmark": "student_train",
        **invocation("benchmarks/student_train.py", argv),
        "environment": {**environment(device, dtype), "precision": args.precision},
        "model": info,
        "workload": {
            "teacher_data": display_path(args.teacher_data),
            "label": args.label,
            "train_pairs": len(dm.train),
            "train_queries": len(set(dm.train.qid)),
            "held_out_queries": HELD_OUT_QUERIES,
            "truncated_pairs": dm.truncated,
            "mean_tokens": float(lengths.mean()),
            "max_length": args.max_length,
            "batch_size": args.batch_size,
            "max_batch_tokens": args.max_batch_tokens,
            "plain_batch_size": plain_batch_size(args),
            "pad_to_multiple_of": args.pad_to_multiple_of,
            "compile": args.compile,
            "num_workers": args.num_workers,
            "steps": args.steps,
            "warmup_steps": args.warmup_steps,
            "precision": args.precision,
            "optimizer": {
                "name": "AdamW",
                "fused": device.type == "cuda",
                "lr": LR,
                "weight_decay": WEIGHT_DECAY,
                "gradient_clip_val": args.gradient_clip_val,
            },
            "loss": "mse",
        },
        "matmul": {
            "size": size,
            "reps": args.matmul_reps,
            "dtype": dtype_name(dtype),
            "flops_per_s": rate,
            "before_flops_per_s": before,
            "after_flops_per_s": after,
        },
        "plain": plain.to_json(),
        "stage": stage.to_json(),
        "speedup_samples_per_s": speedup,
        "speedup_real_tokens_per_s": stage.real_tokens_per_s / plain.real_tokens_per_s,
        "check": check,
        "stage_with_checkpoints": None if checkpointed is None else checkpointed.to_json(),
        "checkpointing": None if saves is None else saves.cost(stage, checkpointed),
        "targets": {
            "mfu": TARGET_MFU,
            "speedup": TARGET_SPEEDUP,
            "mfu_met": stage.mfu >= TARGET_MFU,
            "speedup_met": speedup >= TARGET_SPEEDUP,
        },
    }
    print_report(result, phases)
    out = args.out or RESULTS / f"student-train-{device.type}-{slug(args.backbone)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {display_path(out)}")
    return 0 if check["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
