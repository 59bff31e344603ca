"""The student stage's data: teacher triplet datasets, split by query, tokenised, batched."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pytorch_lightning import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from distill.core.devices import TRAIN_PAD_MULTIPLE, DeviceType, device_type
from distill.core.label_table import TeacherData, load_label_table
from distill.core.loaders import load_qrels
from distill.core.schema import InputError, Qrels
from distill.core.unpadding import host_packing
from students.sampling import LengthGroupedBatches, QueryGroupedBatches, ResumableLoader, TokenBudgetBatches
from students.scaling import ScalingKind, TargetScaling

log = logging.getLogger(__name__)


@dataclass
class Split:
    """One split's pairs, tokenised. ``targets`` are scaled; ``labels`` are the raw teacher labels; ``members``
    the raw scores of each term of a label that sums two or more (name -> ``[n]``)."""

    qid: list[str]
    docid: list[str]
    labels: np.ndarray
    targets: np.ndarray
    first_stage: np.ndarray
    features: list[dict[str, list[int]]]
    members: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.qid)

    @property
    def lengths(self) -> list[int]:
        return [len(f["input_ids"]) for f in self.features]


class _Examples(Dataset):
    def __init__(self, split: Split) -> None:
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {**self.split.features[i], "index": i}


class Collator:
    """Pads a batch to its longest sequence, rounded up to a multiple of ``pad_to_multiple_of`` tokens; adds
    ``target`` [B] float, ``group`` [B] long (batch-local query index), ``index`` [B] long (row in the split),
    ``group_sizes``, the host's ``(queries, most candidates of one)`` (see :mod:`students.losses`), and
    ``packing``, where the real tokens are (:func:`distill.core.unpadding.host_packing`: for ``model.unpad``)."""

    def __init__(self, tokenizer: Any, split: Split, pad_to_multiple_of: int = 1) -> None:
        self.tokenizer, self.split, self.multiple = tokenizer, split, pad_to_multiple_of

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        index = [e.pop("index") for e in examples]
        multiple = self.multiple if self.multiple > 1 else None
        batch = dict(self.tokenizer.pad(examples, pad_to_multiple_of=multiple, return_tensors="pt"))
        qids = [self.split.qid[i] for i in index]
        local = {q: g for g, q in enumerate(dict.fromkeys(qids))}
        batch["target"] = torch.tensor(self.split.targets[index], dtype=torch.float32)
        batch["group"] = torch.tensor([local[q] for q in qids])
        batch["index"] = torch.tensor(index)
        batch["group_sizes"] = (len(local), max(Counter(qids).values()))
        batch["packing"] = host_packing(batch["attention_mask"])
        return batch


def load_teacher_table(teacher_data: TeacherData, label: str) -> Any:
    """The teacher data's pairs as a DataFrame with the label of each pair in a ``label`` column (see
    :func:`distill.core.label_table.load_label_table`).

    Raises:
        InputError: a folder is no teacher dataset, lacks a column, the label has NaN/inf values, or named
            teachers do not hold the same pairs.
    """
    return load_label_table(teacher_data, label).table


def split_queries(qids: list[str], val_queries: int | float, seed: int) -> set[str]:
    """The held-out queries: a seeded random ``val_queries`` share (float < 1) or count (int) of ``qids``."""
    distinct = sorted(set(qids))
    count = round(len(distinct) * val_queries) if isinstance(val_queries, float) else int(val_queries)
    if not 0 < count <= len(distinct):
        raise InputError(f"val_queries={val_queries}: cannot hold out that many of {len(distinct)} queries")
    return set(np.random.default_rng(seed).permutation(distinct)[:count].tolist())


class StudentDataModule(LightningDataModule):
    """Teacher triplets for the student: split by query (never by pair), tokenised, batched.

    Args:
        teacher_data: folders written by ``distill teach``: a list (one teacher; their union, each (qid, docid)
            once) or a mapping name -> folders (several teachers of the same pairs, joined on (qid, docid):
            ``{gemma: [dl21-gemma3, dl22-gemma3], smollm2: [dl21-smollm2, dl22-smollm2]}``).
        label: what to learn: a teacher score column (``cis``, ``upr``, ``cis_q``, ...; ``gemma.cis`` for a named
            teacher), a hybrid label (``cis_q+0.5*first_stage``) or a sum of per-query z-scores
            (``z(gemma.cis) + z(smollm2.cis_q) + 0.25*z(first_stage)``); see :mod:`distill.core.labels`.
        backbone: the student's backbone, for its tokenizer (linked from the model's).
        qrels: TREC qrels of the validation queries, for nDCG; without them only correlations are reported.
        val_queries: held-out queries, a share (0.2) or a count (8).
        val_pool: where the held-out queries are drawn from: ``any`` query, or only the ``judged`` ones (those in
            ``qrels``), so that unjudged training queries (DL22, say) never take a validation slot.
        train_depth: train on each query's first N candidates by first-stage rank only (None: all); validation
            always keeps every candidate.
        target_scaling: ``none``, ``global`` or ``per_query`` standardisation of the teacher scores.
        batch_size: pairs per training batch (pointwise), or ``group_size`` x queries per batch; unused with
            ``max_batch_tokens``.
        max_batch_tokens: cut training batches by this budget of padded tokens (pairs x padded length) instead of
            by ``batch_size``: lengths are sorted within a window of the shuffled order (``bucket_window``), so a
            batch holds pairs of similar length, and with ``group_size`` a batch holds whole query groups
            (:class:`students.sampling.TokenBudgetBatches`). A GPU wants it large: see
            ``configs/train/bert-large-gpu.yaml``.
        pad_to_multiple_of: pad every batch to a multiple of this many tokens (None: the device's,
            :data:`distill.core.devices.TRAIN_PAD_MULTIPLE`: 64 on a GPU, to the longest pair on a CPU).
        bucket_window: with ``max_batch_tokens``, the pairs (or query groups) sorted by length together (None: the
            whole epoch, which keeps the number of batches of single pairs the same every epoch; query groups, whose
            longest pair changes with the shuffle, may give a few more or fewer: Lightning takes every epoch's
            length from the first, so an epoch with more leaves its last few batches out).
        group_size: candidates per query in a batch, for the within-query losses (None: pointwise batches).
        max_length: tokens per pair; longer pairs lose the end of the passage (counted).
        eval_batch_size: pairs per validation batch.
        num_workers: data loader worker processes (batches are pinned in memory on a GPU).
    """

    def __init__(
        self,
        teacher_data: list[str] | dict[str, list[str]],
        label: str = "cis",
        backbone: str = "bert-large-uncased",
        qrels: str | None = None,
        val_queries: int | float = 0.2,
        val_pool: Literal["any", "judged"] = "any",
        train_depth: int | None = None,
        target_scaling: ScalingKind = "none",
        batch_size: int = 32,
        max_batch_tokens: int | None = None,
        pad_to_multiple_of: int | None = None,
        bucket_window: int | None = None,
        group_size: int | None = None,
        max_length: int = 512,
        eval_batch_size: int = 128,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        sizes = {"max_batch_tokens": max_batch_tokens, "pad_to_multiple_of": pad_to_multiple_of}
        for key, value in {**sizes, "bucket_window": bucket_window}.items():
            if value is not None and value < 1:
                raise InputError(f"data.{key}: must be positive, got {value}")
        self.save_hyperparameters()
        self.train: Split | None = None
        self.val: Split | None = None
        self.qrels: Qrels = {}
        self.scaling: TargetScaling | None = None
        self.tokenizer: Any = None
        self.truncated = 0
        self.teachers: dict[str, list[str]] = {}
        """The named teachers the label uses (name -> folders), once set up; empty for one unnamed teacher."""
        self.members: dict[str, str] = {}
        """Each term of a label that sums two or more: name -> its column."""

    def setup(self, stage: str | None = None) -> None:
        if self.train is not None:
            return
        from distill.core.models import load_architecture

        h = self.hparams
        labelled = load_label_table(h.teacher_data, h.label)
        table, self.teachers, self.members = labelled.table, labelled.teachers, labelled.expression.members
        if table.empty:
            raise InputError(f"{h.teacher_data}: no pairs")
        qrels = load_qrels(Path(h.qrels)) if h.qrels else {}
        pool = table.qid.tolist()
        if h.val_pool == "judged":
            if not qrels:
                raise InputError("data.val_pool: judged needs data.qrels")
            pool = [q for q in pool if q in qrels]
        held_out = split_queries(pool, h.val_queries, h.seed)
        is_val = table.qid.isin(held_out).to_numpy()
        if is_val.all():
            raise InputError(f"val_queries={h.val_queries} holds out every query: nothing is left to train on")
        if h.train_depth is not None:
            is_train = ~is_val & (table.first_stage_rank <= h.train_depth).to_numpy()
        else:
            is_train = ~is_val
        self.scaling = TargetScaling.fit(h.target_scaling, table["label"].to_numpy()[is_train])
        _, self.tokenizer = load_architecture(h.backbone)
        self.train = self._split(table[is_train])
        self.val = self._split(table[is_val])
        self.qrels = {q: j for q, j in qrels.items() if q in held_out}
        log.warning(
            "student data: %d train pairs (%d queries), %d validation pairs (%d queries); "
            "%d of %d pairs truncated to max_length=%d",
            len(self.train),
            len(set(self.train.qid)),
            len(self.val),
            len(held_out),
            self.truncated,
            len(table),
            h.max_length,
        )

    def _split(self, table: Any) -> Split:
        h = self.hparams
        queries, passages = table["query"].tolist(), table["passage"].tolist()
        encoded = self.tokenizer(queries, passages, truncation="only_second", max_length=h.max_length)
        features = [
            {k: encoded[k][i] for k in ("input_ids", "attention_mask", "token_type_ids") if k in encoded}
            for i in range(len(queries))
        ]
        self.truncated += self._count_truncated(queries, passages)
        labels = table["label"].to_numpy(dtype=np.float64)
        qids = table.qid.tolist()
        return Split(
            qids,
            table.docid.tolist(),
            labels,
            self.scaling(labels, qids),
            table.first_stage_score.to_numpy(dtype=np.float64),
            features,
            {name: table[column].to_numpy(dtype=np.float64) for name, column in self.members.items()},
        )

    def _count_truncated(self, queries: list[str], passages: list[str]) -> int:
        q = self.tokenizer(queries, add_special_tokens=False)["input_ids"]
        p = self.tokenizer(passages, add_special_tokens=False)["input_ids"]
        special = self.tokenizer.num_special_tokens_to_add(pair=True)
        return sum(len(a) + len(b) + special > self.hparams.max_length for a, b in zip(q, p, strict=True))

    @property
    def folders(self) -> list[str]:
        """The teacher datasets read: every folder of the teachers the label uses."""
        if self.teachers:
            return [folder for folders in self.teachers.values() for folder in folders]
        return list(self.hparams.teacher_data)

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _device_type(self) -> DeviceType:
        trainer = self.trainer
        return device_type(trainer.strategy.root_device) if trainer is not None else "cpu"

    @property
    def pad_multiple(self) -> int:
        """What batches are padded to a multiple of: ``pad_to_multiple_of``, else the device's default."""
        given = self.hparams.pad_to_multiple_of
        return given if given is not None else TRAIN_PAD_MULTIPLE[self._device_type()]

    def _loader(self, split: Split, sampler: Any, **kwargs: Any) -> DataLoader:
        workers = self.hparams.num_workers
        return ResumableLoader(
            _Examples(split),
            batch_sampler=sampler,
            collate_fn=Collator(self.tokenizer, split, self.pad_multiple),
            num_workers=workers,
            pin_memory=self._device_type() == "cuda",
            **kwargs,
        )

    def train_dataloader(self) -> DataLoader:
        h = self.hparams
        rank, world = self._rank()
        if h.max_batch_tokens is not None:
            groups = None if h.group_size is None else self.train.qid
            sampler = TokenBudgetBatches(
                self.train.lengths,
                h.max_batch_tokens,
                self.pad_multiple,
                groups,
                h.group_size,
                h.bucket_window,
                h.seed,
                rank,
                world,
            )
        elif h.group_size is None:
            sampler = LengthGroupedBatches(self.train.lengths, h.batch_size, h.seed, rank, world)
        else:
            per_batch = max(1, h.batch_size // h.group_size)
            sampler = QueryGroupedBatches(self.train.qid, h.group_size, per_batch, h.seed, rank, world)
        return self._loader(self.train, sampler, persistent_workers=h.num_workers > 0)

    def val_dataloader(self) -> DataLoader:
        """Every rank sees the whole (small) validation split, longest first, so metrics need no gathering."""
        order = sorted(range(len(self.val)), key=lambda i: -self.val.lengths[i])
        size = self.hparams.eval_batch_size
        return self._loader(self.val, [order[i : i + size] for i in range(0, len(order), size)])
