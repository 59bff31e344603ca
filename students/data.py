"""The student stage's data: teacher triplet datasets, split by query, tokenised once into a memory-mapped cache
(:mod:`students.token_store`), batched from the mapped arrays."""

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

from distill.core.batching import round_up
from distill.core.devices import TRAIN_PAD_MULTIPLE, DeviceType, device_type
from distill.core.schema import InputError, Qrels
from distill.data.label_table import (
    ID_COLUMNS,
    QUERY,
    SOURCE,
    SOURCE_ROW,
    LabelTable,
    first_stage_folders,
    load_label_table,
)
from distill.data.loaders import read_qrels
from distill.data.teacher_data import TeacherDataset, dataset_digest
from distill.model.resolver import PAPER_STUDENT
from distill.model.unpadding import lengths_packing
from students.sampling import (
    LengthGroupedBatches,
    QueryGroupedBatches,
    ResumableLoader,
    TokenBudgetBatches,
)
from students.scaling import ScalingKind, TargetScaling
from students.token_store import TokenStore, open_store

log = logging.getLogger(__name__)


@dataclass
class Split:
    """One split's pairs: rows of the token store and numpy columns, no Python object per pair. ``targets`` are
    scaled; ``labels`` are the raw teacher labels; ``members`` the raw scores of each term of a label that sums
    two or more (name -> ``[n]``)."""

    store: TokenStore
    rows: np.ndarray
    """``[n]`` int64: each pair's row in the store (and in ``ids``)."""
    ids: Any
    """Every pair's ``qid`` and ``docid`` (the label table's Arrow-backed columns, shared by the splits)."""
    query: np.ndarray
    """``[n]`` int64: each pair's query as a number (the samplers' groups)."""
    labels: np.ndarray
    targets: np.ndarray
    first_stage: np.ndarray
    members: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def qid(self) -> list[str]:
        """The query id of each pair (made on each call: for validation and reports, not per batch)."""
        return self.ids.qid.iloc[self.rows].tolist()

    @property
    def docid(self) -> list[str]:
        """The passage id of each pair (made on each call, likewise)."""
        return self.ids.docid.iloc[self.rows].tolist()

    @property
    def lengths(self) -> np.ndarray:
        """``[n]`` int32: each pair's tokens."""
        return np.asarray(self.store.lengths[self.rows])


@dataclass(frozen=True)
class FirstStageList:
    """One first stage's candidate lists of the validation queries, with its own scores: α is chosen for that first
    stage on them (a pair in several first stages' lists is one pair of the validation split, scored once)."""

    positions: np.ndarray
    """``[m]`` int64: each pair's position in the validation split."""
    scores: np.ndarray
    """``[m]`` float64: the first stage's score of each pair."""
    chosen_on: list[str]
    """The candidate files (the teacher datasets' inputs) the lists come from."""
    queries: int
    """The validation queries of the lists that the qrels judge."""


class _Positions(Dataset):
    """Positions in a split, fetched a batch at a time: the collator gathers the batch from the store."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> int:
        return i

    def __getitems__(self, indices: list[int]) -> list[int]:
        return list(indices)


@dataclass(frozen=True)
class Padding:
    """How the collator pads, from the student's tokenizer."""

    pad_id: int
    side: Literal["right", "left"]
    token_types: bool
    """Whether the model takes ``token_type_ids``."""
    multiple: int = 1
    """Pad every batch to a multiple of this many tokens."""

    @classmethod
    def of(cls, tokenizer: Any, multiple: int = 1) -> Padding:
        return cls(
            tokenizer.pad_token_id, tokenizer.padding_side, "token_type_ids" in tokenizer.model_input_names, multiple
        )


class Collator:
    """Gathers a batch of split positions from the store's mapped tokens and pads it to its longest pair, rounded
    up to a multiple of ``padding.multiple`` tokens, as the tokenizer's ``pad`` would: ``input_ids``,
    ``attention_mask`` and (for models that take them) ``token_type_ids``, ``[B, T]`` int64. Adds ``target`` [B]
    float, ``group`` [B] long (batch-local query index), ``index`` [B] long (position in the split),
    ``group_sizes``, the host's ``(queries, most candidates of one)`` (see :mod:`students.losses`), and
    ``packing``, where the real tokens are (:func:`distill.model.unpadding.lengths_packing`: for ``model.unpad``)."""

    def __init__(self, split: Split, padding: Padding) -> None:
        self.split, self.padding = split, padding

    def __call__(self, index: list[int]) -> dict[str, Any]:
        positions = np.asarray(index, dtype=np.int64)
        tokens, lengths, query_lengths = self.split.store.pairs(self.split.rows[positions])
        width = round_up(int(lengths.max()), self.padding.multiple)
        columns = np.arange(width)
        start = np.zeros_like(lengths) if self.padding.side == "right" else width - lengths
        mask = (columns >= start[:, None]) & (columns < (start + lengths)[:, None])
        input_ids = np.full((len(positions), width), self.padding.pad_id, dtype=np.int64)
        input_ids[mask] = tokens
        batch = {"input_ids": torch.from_numpy(input_ids)}
        if self.padding.token_types:
            batch["token_type_ids"] = torch.from_numpy(
                (mask & (columns >= (start + query_lengths)[:, None])).astype(np.int64)
            )
        batch["attention_mask"] = torch.from_numpy(mask.astype(np.int64))
        groups = self.split.query[positions].tolist()
        local: dict[int, int] = {}  # batch-local query index, in order of first appearance
        for g in groups:
            local.setdefault(g, len(local))
        batch["target"] = torch.tensor(self.split.targets[positions], dtype=torch.float32)
        batch["group"] = torch.tensor([local[g] for g in groups])
        batch["index"] = torch.from_numpy(positions)
        batch["group_sizes"] = (len(local), max(Counter(groups).values()))
        batch["packing"] = lengths_packing(lengths, width, left=self.padding.side == "left")
        return batch


def split_queries(qids: list[str], size: int | float, seed: int, option: str = "data.val_queries") -> set[str]:
    """A seeded random ``size`` share (float < 1) or count (int) of the distinct ``qids``: the held-out queries, or
    the training queries kept (``option``, the option ``size`` comes from, names it in the error)."""
    distinct = sorted(set(qids))
    count = round(len(distinct) * size) if isinstance(size, float) else int(size)
    if not 0 < count <= len(distinct):
        raise InputError(f"{option}={size}: cannot pick that many of {len(distinct)} queries")
    return set(np.random.default_rng(seed).permutation(distinct)[:count].tolist())


def fold_queries(qids: list[str], folds: int, fold: int, seed: int) -> set[str]:
    """Fold ``fold`` of ``folds`` seeded folds of the distinct ``qids``, of sizes that differ by at most one."""
    distinct = sorted(set(qids))
    if len(distinct) < folds:
        raise InputError(f"val_folds={folds}: cannot cut {len(distinct)} queries into that many folds")
    order = np.random.default_rng(seed).permutation(distinct)
    return set(np.array_split(order, folds)[fold].tolist())


def check_first_stages(first_stages: dict[str, list[str]] | None, alpha_from: dict[str, str | float] | None) -> None:
    """``data.first_stages`` and ``data.alpha_from``, checked before anything is read.

    Raises:
        InputError: ``data.<option>: ...``: a first stage without candidate files, a rule for a first stage that has
            validation lists, or a rule that names no first stage of ``first_stages`` (nor is a number in [0, 1]).
    """
    from distill.core.student_card import DEFAULT_FIRST_STAGE

    for name, files in (first_stages or {}).items():
        if not files or isinstance(files, str):
            raise InputError(f"data.first_stages: {name}: expected a list of candidate files, got {files!r}")
    known = list(first_stages or [DEFAULT_FIRST_STAGE])
    for name, rule in (alpha_from or {}).items():
        number = isinstance(rule, (int, float)) and not isinstance(rule, bool)
        if name in known and not number:
            raise InputError(
                f"data.alpha_from: {name} has validation lists: its alpha is chosen on them, or declared as a number"
            )
        if not (rule in known if isinstance(rule, str) else number and 0 <= rule <= 1):
            raise InputError(
                f"data.alpha_from: {name}: {rule!r} is neither a first stage with validation lists "
                f"({', '.join(known)}) nor an alpha in [0, 1]"
            )


def first_stage_lists(
    folders: dict[str, list[str]], inputs: dict[str, list[str]], val: Split, held_out: set[str], qrels: Qrels
) -> dict[str, FirstStageList]:
    """Each first stage's validation lists: the pairs of the ``held_out`` queries in its teacher datasets
    (``folders``, :func:`first_stage_folders`), with those datasets' first-stage scores."""
    import pandas as pd

    positions = val.ids.iloc[val.rows].reset_index(drop=True).assign(position=np.arange(len(val)))
    lists = {}
    for name, found in folders.items():
        frames, chosen_on = [], []
        for folder in found:
            frame = TeacherDataset.open(folder).to_pandas(["qid", "docid", "first_stage_score"], arrow_strings=True)
            frame = frame[frame.qid.isin(held_out)]
            if len(frame):
                frames.append(frame)
                chosen_on += [f for f in inputs[folder] if f not in chosen_on]
        if not frames:  # no validation query among its lists: no α is chosen for it
            lists[name] = FirstStageList(np.zeros(0, np.int64), np.zeros(0), [], 0)
            continue
        pairs = pd.concat(frames, ignore_index=True).drop_duplicates(["qid", "docid"])
        pairs = pairs.merge(positions, on=["qid", "docid"], how="inner")
        lists[name] = FirstStageList(
            pairs.position.to_numpy(dtype=np.int64),
            pairs.first_stage_score.to_numpy(dtype=np.float64),
            chosen_on,
            len(set(pairs.qid.unique().tolist()) & set(qrels)),
        )
    return lists


class StudentDataModule(LightningDataModule):
    """Teacher triplets for the student: split by query (never by pair), tokenised, batched.

    Args:
        teacher_data: folders written by ``distill teach``: a list (one teacher; their union, each (qid, docid)
            once) or a mapping name -> folders (several teachers of the same pairs, joined on (qid, docid):
            ``{gemma: [dl21-gemma3, dl22-gemma3], smollm2: [dl21-smollm2, dl22-smollm2]}``).
        label: what to learn: a teacher score column (``cis``, ``upr``, ``cis_q``, ...; ``gemma.cis`` for a named
            teacher), a hybrid label (``cis_q+0.5*first_stage``) or a sum of per-query z-scores
            (``z(gemma.cis) + z(smollm2.cis_q) + 0.25*z(first_stage)``); see :mod:`distill.data.labels`. Or a label
            per first stage of ``first_stages``, each list learning its own first stage's
            (``{bm25: "z(cis_q) + 0.25*z(first_stage)", splade: "z(cis_q) + z(first_stage)"}``). A sum may weigh the
            judgments of ``qrels`` too (``z(cis_q) + z(judgment)``): the queries they judge that are not held out
            learn from them.
        backbone: the student's backbone, for its tokenizer (linked from the model's).
        qrels: TREC qrels of the validation queries, for nDCG, and of the training queries for a label's
            ``z(judgment)``: a file, an ``irds:`` dataset id or a list of these
            (:func:`~distill.data.loaders.qrels.read_qrels`); without them only correlations are reported.
        val_queries: held-out queries, a share (0.2) or a count (8).
        val_pool: where the held-out queries are drawn from: ``any`` query, or only the ``judged`` ones (those in
            ``qrels``), so that unjudged training queries (DL22, say) never take a validation slot.
        val_folds: instead of ``val_queries``, cut the pool into this many seeded folds of (nearly) equal size and
            hold out fold ``val_fold``: runs of every fold validate each pool query once, by a student that did not
            train on it (cross-fitting: all of a small judged year behind a choice, none of it unseen in training).
        val_fold: the held-out fold, 0 to ``val_folds - 1``.
        train_depth: train on each query's first N candidates by first-stage rank only (None: all); validation
            always keeps every candidate.
        train_queries: train on a seeded share (0.5) or count (40) of the queries not held out (None: all), the
            held-out queries unchanged: a learning curve in the number of training queries.
        first_stages: the first stages whose candidates the teacher data holds, each validated on its own lists:
            name -> its candidate files, as the teacher datasets' ``teacher.json`` ``input`` names them
            (``{bm25: [data/trec-dl21/bm25_top100.json], splade: [data/trec-dl21/splade_top100.json]}``). With qrels,
            α of the interpolation with the first stage is chosen for each on its validation queries' lists (their
            every candidate and its score there) and written in the student's card. None: one first stage,
            :data:`~distill.core.student_card.DEFAULT_FIRST_STAGE`, validated on the validation split as read.
        alpha_from: first stages without validation lists, each with the rule that gives its α: the name of a first
            stage of ``first_stages`` whose α it takes, or a number (``{tasb: splade}``); recorded as such in the
            card. A number also declares the α of a first stage with validation lists, in place of the one chosen on
            them (a refit that takes the α its folds chose: ``{bm25: 0.8, splade: 0.55, tasb: 0.55}``).
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
        num_workers: worker processes of each data loader, kept for the whole fit (batches are pinned in memory on a
            GPU).
        cache_dir: where the tokenised pairs are cached (:mod:`students.token_store`; default
            ``$CIS_DISTILL_CACHE/student-tokens``): built once, then memory-mapped by every run and rank that
            tokenises the same pairs the same way.
    """

    def __init__(
        self,
        teacher_data: list[str] | dict[str, list[str]],
        label: str | dict[str, str] = "cis",
        backbone: str = PAPER_STUDENT,
        qrels: str | list[str] | None = None,
        val_queries: int | float = 0.2,
        val_pool: Literal["any", "judged"] = "any",
        val_folds: int | None = None,
        val_fold: int = 0,
        train_depth: int | None = None,
        train_queries: int | float | None = None,
        first_stages: dict[str, list[str]] | None = None,
        alpha_from: dict[str, str | float] | None = None,
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
        cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        sizes = {"max_batch_tokens": max_batch_tokens, "pad_to_multiple_of": pad_to_multiple_of}
        sizes |= {"batch_size": batch_size, "eval_batch_size": eval_batch_size, "max_length": max_length}
        bounded = {"bucket_window": bucket_window, "group_size": group_size, "train_depth": train_depth}
        for key, value in {**sizes, **bounded}.items():
            if value is not None and value < 1:
                raise InputError(f"data.{key}: must be positive, got {value}")
        if train_queries is not None and train_queries <= 0:
            raise InputError(f"data.train_queries: must be positive, got {train_queries}")
        check_first_stages(first_stages, alpha_from)
        if val_folds is not None and not (val_folds >= 2 and 0 <= val_fold < val_folds):
            raise InputError(f"data.val_fold: {val_fold} of val_folds={val_folds}: need 2+ folds, 0 <= fold < folds")
        if val_folds is None and val_fold != 0:
            raise InputError(f"data.val_fold: {val_fold} without data.val_folds (the number of folds) picks no fold")
        self.save_hyperparameters()
        self.train: Split | None = None
        self.val: Split | None = None
        self.qrels: Qrels = {}
        self._judgments: Qrels | None = None
        self.scaling: TargetScaling | None = None
        self.tokenizer: Any = None
        self.positions: int | None = None
        """The backbone's positions that hold a token, read with its tokenizer (None: not known)."""
        self.truncated = 0
        self.teachers: dict[str, list[str]] = {}
        """The named teachers the label uses (name -> folders), once set up; empty for one unnamed teacher."""
        self.members: dict[str, str] = {}
        """Each term of a label that sums two or more: name -> its column."""
        self.first_stage_lists: dict[str, FirstStageList] = {}
        """Each first stage of ``first_stages``: its validation lists, once set up (empty without ``first_stages``)."""
        self.val_inputs: list[str] = []
        """The candidate files of the teacher datasets that hold validation queries, once set up."""

    def prepare_data(self) -> None:
        """Tokenise the pairs into the cache (:mod:`students.token_store`), once: Lightning calls this on each
        node's first rank, before every rank's :meth:`setup` maps the same files."""
        read = self._digests()
        labelled = self._labelled()
        self._first_stage_folders(labelled)  # checked before the tokenising
        self._store(labelled)
        self._check_unchanged(read)

    def _digests(self) -> dict[str, str]:
        """Each teacher dataset folder's :func:`~distill.data.teacher_data.dataset_digest`, taken before its rows are
        read: the labels, the texts the tokens are made of and the first-stage lists are read at different moments."""
        given = self.hparams.teacher_data
        folders = [folder for group in given.values() for folder in group] if isinstance(given, dict) else list(given)
        return {str(folder): dataset_digest(folder) for folder in folders}

    def _check_unchanged(self, read: dict[str, str]) -> None:
        """Each folder of ``read`` (:meth:`_digests`) holds what it held before it was read.

        Raises:
            InputError: one was rewritten meanwhile (a ``distill teach --overwrite`` of it), naming it: the labels of
                one version would go with the texts of another.
        """
        for folder, digest in read.items():
            if dataset_digest(folder) != digest:
                raise InputError(
                    f"data.teacher_data: {folder} was rewritten while the training read it (a distill teach "
                    "--overwrite?): train again once it is written"
                )

    def _first_stage_folders(self, labelled: LabelTable) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """Each teacher dataset's candidate files, and each first stage's datasets (none without ``first_stages``)."""
        inputs = {folder: TeacherDataset.open(folder).metadata.input for folder in labelled.sources}
        first_stages = self.hparams.first_stages
        return inputs, first_stage_folders(first_stages, inputs) if first_stages else {}

    def _labelled(self) -> LabelTable:
        h = self.hparams
        labelled = load_label_table(h.teacher_data, h.label, first_stages=h.first_stages, qrels=self.judgments())
        if labelled.table.empty:
            raise InputError(f"{h.teacher_data}: no pairs")
        return labelled

    def judgments(self) -> Qrels:
        """The judgments of ``data.qrels`` (none without it), read once."""
        if self._judgments is None:
            self._judgments = read_qrels(self.hparams.qrels) if self.hparams.qrels else {}
        return self._judgments

    def _store(self, labelled: LabelTable) -> TokenStore:
        from distill.model.positions import usable_positions
        from distill.model.resolver import cache_home, load_architecture

        h = self.hparams
        if self.tokenizer is None:
            config, self.tokenizer = load_architecture(h.backbone)
            self.positions = usable_positions(config.to_dict())
        cache = Path(h.cache_dir) if h.cache_dir else cache_home() / "student-tokens"
        table = labelled.table
        return open_store(
            cache,
            labelled.sources,
            table[SOURCE].to_numpy(),
            table[SOURCE_ROW].to_numpy(),
            self.tokenizer,
            h.max_length,
            self.positions,
        )

    def setup(self, stage: str | None = None) -> None:
        if self.train is not None:
            return
        h = self.hparams
        read = self._digests()
        labelled = self._labelled()
        table, self.teachers, self.members = labelled.table, labelled.teachers, labelled.labels.members
        inputs, stage_folders = self._first_stage_folders(labelled)
        store = self._store(labelled)
        qrels = self.judgments()
        pool = table.qid.unique().tolist()
        if qrels and not any(q in qrels for q in pool):  # validation ranks by qrels no held-out query has
            raise InputError(
                f"data.qrels: {h.qrels} judge none of the teacher data's {len(pool)} queries: give the qrels of its "
                "queries (or none, to validate by the teacher's ranking alone)"
            )
        if h.val_pool == "judged":
            if not qrels:
                given = f"data.qrels {h.qrels} judge nothing (no line)" if h.qrels else "no data.qrels are given"
                raise InputError(f"data.val_pool: judged draws the held-out queries from judged ones, and {given}")
            pool = [q for q in pool if q in qrels]
        if h.val_folds is not None:
            held_out = fold_queries(pool, h.val_folds, h.val_fold, h.seed)
        else:
            held_out = split_queries(pool, h.val_queries, h.seed)
        in_val = table.qid.isin(held_out).to_numpy()
        if in_val.all():
            raise InputError(f"val_queries={h.val_queries} holds out every query: nothing is left to train on")
        is_val = in_val & ~table.duplicated(list(ID_COLUMNS)).to_numpy()  # a pair of several lists, scored once
        if h.train_depth is not None:
            is_train = ~in_val & (table.first_stage_rank <= h.train_depth).to_numpy()
        else:
            is_train = ~in_val
        if h.train_queries is not None:
            rest = table.qid[~in_val].unique().tolist()
            kept = split_queries(rest, h.train_queries, h.seed + 1, "data.train_queries")
            is_train &= table.qid.isin(kept).to_numpy()
        labels = table["label"].to_numpy(dtype=np.float64)
        self.scaling = TargetScaling.fit(h.target_scaling, labels[is_train])
        queries = table[QUERY].to_numpy()
        members = {name: table[column].to_numpy(dtype=np.float64) for name, column in self.members.items()}
        first_stage = table.first_stage_score.to_numpy(dtype=np.float64)
        ids = table[["qid", "docid"]]

        def split(keep: np.ndarray) -> Split:
            rows = np.flatnonzero(keep)
            return Split(
                store,
                rows,
                ids,
                queries[rows],
                labels[rows],
                self.scaling(labels[rows], queries[rows]),
                first_stage[rows],
                {name: values[rows] for name, values in members.items()},
            )

        self.train, self.val = split(is_train), split(is_val)
        if len(self.val) == 1:  # a correlation or a ranking needs two: no checkpoint could be chosen
            raise InputError(
                "data: the validation split holds 1 pair: the best checkpoint is chosen on its ranking of several; "
                "hold out more queries (data.val_queries) or queries with more candidates"
            )
        self.truncated = store.truncated
        self.qrels = {q: j for q, j in qrels.items() if q in held_out}
        held = table[SOURCE].to_numpy()[is_val]
        self.val_inputs = list(dict.fromkeys(i for n in np.unique(held) for i in inputs[labelled.sources[n]]))
        self.first_stage_lists = first_stage_lists(stage_folders, inputs, self.val, held_out, self.qrels)
        self._check_unchanged(read)
        log.info(
            "student data: %d train pairs (%d queries), %d validation pairs (%d queries); "
            "%d of %d pairs truncated to max_length=%d",
            len(self.train),
            len(np.unique(self.train.query)),
            len(self.val),
            len(held_out),
            self.truncated,
            len(table),
            h.max_length,
        )

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

    def _loader(self, split: Split, sampler: Any) -> DataLoader:
        """The loader of ``split``'s batches that ``sampler`` draws. Its worker processes, if any, persist for the
        whole fit: neither an epoch's start nor a validation forks new ones or waits for old ones to exit (Lightning
        shuts them down when the fit ends)."""
        workers = self.hparams.num_workers
        return ResumableLoader(
            _Positions(len(split)),
            batch_sampler=sampler,
            collate_fn=Collator(split, Padding.of(self.tokenizer, self.pad_multiple)),
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=self._device_type() == "cuda",
        )

    def train_dataloader(self) -> DataLoader:
        h = self.hparams
        rank, world = self._rank()
        if h.max_batch_tokens is not None:
            groups = None if h.group_size is None else self.train.query.tolist()
            sampler = TokenBudgetBatches(
                self.train.lengths.tolist(),
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
            sampler = LengthGroupedBatches(self.train.lengths.tolist(), h.batch_size, h.seed, rank, world)
        else:
            per_batch = max(1, h.batch_size // h.group_size)
            sampler = QueryGroupedBatches(self.train.query.tolist(), h.group_size, per_batch, h.seed, rank, world)
        return self._loader(self.train, sampler)

    def val_dataloader(self) -> DataLoader:
        """Every rank sees the whole (small) validation split, longest first, so metrics need no gathering."""
        order = np.argsort(-self.val.lengths, kind="stable").tolist()
        size = self.hparams.eval_batch_size
        return self._loader(self.val, [order[i : i + size] for i in range(0, len(order), size)])
