"""The student's LightningModule: distillation loss, optimiser and schedule, validation metrics."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Any, Literal

import numpy as np
import torch
from pytorch_lightning import LightningModule
from pytorch_lightning.utilities.rank_zero import rank_zero_only
from scipy.stats import pearsonr, spearmanr

from distill.core.schema import InputError, UserError
from distill.model.resolver import PAPER_STUDENT
from distill.model.unpadding import Unpadder, device_packing
from students.compilation import compile_blocks
from students.initial_weights import check_initial_weight_share
from students.losses import LOSSES, build_loss
from students.masks import build_masks_ahead
from students.model import build_student
from students.optim import LrScaling, adamw, check_lr_scaling, scaled_lr

log = logging.getLogger(__name__)


def check_optimisation(loss: str, lr: float, temperature: float, weight_decay: float, warmup_ratio: float) -> None:
    """The loss is one of :data:`~students.losses.LOSSES`, and the optimiser's numbers are in range.

    Raises:
        InputError: ``model.<key>: ...``, before any data loads.
    """
    if loss not in LOSSES:
        raise InputError(f"model.loss: expected one of {sorted(LOSSES)}, got {loss!r}")
    for key, value in (("lr", lr), ("temperature", temperature)):
        if not 0 < value < math.inf:
            raise InputError(f"model.{key}: must be positive and finite, got {value}")
    if not weight_decay >= 0:
        raise InputError(f"model.weight_decay: must be 0 or more, got {weight_decay}")
    if not 0 <= warmup_ratio < 1:
        raise InputError(f"model.warmup_ratio: must be in [0, 1), got {warmup_ratio}")


class CrossEncoderModule(LightningModule):
    """Trains a cross-encoder student (:mod:`students.model`) to predict the teacher's scores.

    Args:
        backbone: the encoder (``bert-large-uncased``, the paper's; ``all-minilm-l6-v2`` offline).
        random_init: random weights from the backbone's config (timing runs without weights).
        dropout: dropout before the linear head; default the backbone's.
        head: ``cls`` ([CLS] → linear, the paper's) or ``segment_cosine`` (the cosine of the query's and the
            passage's mean tokens, scaled: a sentence-embedding backbone ranks well from the first step).
        segment_layers: with ``segment_cosine``, the first layers that attend within each segment only, the query
            and the passage each encoded on its own (:mod:`distill.model.segment_cosine`); 0: every layer across.
        loss: a name of :data:`students.losses.LOSSES`: ``mse`` (pointwise, the paper), or within a query
            ``margin_mse``, ``ranknet``, ``listwise_kl``, ``adr_mse``.
        temperature: the temperature of ``listwise_kl`` (teacher) and ``adr_mse`` (approximate rank).
        lr: peak AdamW learning rate; with ``lr_scaling``, the rate at ``lr_reference_tokens`` a step.
        lr_scaling: how the rate follows the effective batch (:func:`students.optim.scaled_lr`): ``none``, or
            ``sqrt`` / ``linear`` in ``padded tokens a step / lr_reference_tokens``, where a step's tokens are
            ``data.max_batch_tokens x trainer.accumulate_grad_batches x devices``.
        lr_reference_tokens: the padded tokens a step that ``lr`` was chosen at (with ``lr_scaling``).
        batch_tokens: the token budget of a training batch (linked from ``data.max_batch_tokens``).
        weight_decay: AdamW weight decay (not on biases and norms).
        warmup_ratio: share of the optimiser steps of linear warm-up, before linear decay to 0.
        compile: ``torch.compile`` the encoder's blocks (:mod:`students.compilation`; validation stays eager).
            Faster on a GPU, slightly different numerics: opt-in.
        unpad: run the encoder's layers on each batch's real tokens only, attention kept within each pair
            (:mod:`distill.model.unpadding`; BERT backbones): no FLOP goes to padding. It applies no dropout to the
            attention probabilities (the hidden states' dropout stays), so it changes the regularisation: opt-in.
        initial_weight_share: the share of the initial (backbone) weights in the saved student, whose weights are
            ``(1 − s) · trained + s · initial`` (WiSE-FT, :mod:`students.initial_weights`); 0: the trained weights.
            The segment-cosine head only, which starts as a ranker. Checkpoints and validation are the trained
            weights'; the blend is applied when the best checkpoint becomes the Hugging Face folder.

    On a GPU, training runs with PyTorch's cuDNN attention backend off (it plans every new batch shape on the
    host), AdamW fused, and no host synchronisation in a step except, every ``trainer.log_every_n_steps`` steps,
    the read of the figures logged (``train/loss`` of that step, ``train/samples_per_s`` over the interval).
    """

    def __init__(
        self,
        backbone: str = PAPER_STUDENT,
        random_init: bool = False,
        dropout: float | None = None,
        head: Literal["cls", "segment_cosine"] = "cls",
        segment_layers: int = 0,
        loss: str = "mse",
        temperature: float = 1.0,
        lr: float = 3e-5,
        lr_scaling: LrScaling = "none",
        lr_reference_tokens: int | None = None,
        batch_tokens: int | None = None,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.1,
        compile: bool = False,
        unpad: bool = False,
        initial_weight_share: float = 0.0,
    ) -> None:
        super().__init__()
        check_optimisation(loss, lr, temperature, weight_decay, warmup_ratio)
        check_lr_scaling(lr_scaling, lr_reference_tokens, batch_tokens)
        check_initial_weight_share(initial_weight_share, head, random_init)
        self.save_hyperparameters()
        self.loss_fn = build_loss(loss, temperature)
        self.model: torch.nn.Module | None = None
        self._val_scores: dict[int, float] = {}
        self._last_validation: dict[str, float] = {}
        self._interval_start: float | None = None
        self._interval_samples = 0
        self._cudnn_sdp: bool | None = None
        self._unpadder: Unpadder | None = None
        self._prepared = False

    def configure_model(self) -> None:
        """Build the backbone here, so that sharded strategies (DeepSpeed stage 3) can initialise it (a model set
        beforehand is kept); then hook its masks and compile it, once."""
        if self.model is None:
            self.model, _ = build_student(
                self.hparams.backbone,
                self.hparams.random_init,
                self.hparams.dropout,
                self.hparams.head,
                self.hparams.segment_layers,
            )
            self.model.train()  # from_pretrained returns eval mode, which would silence dropout
        if not self._prepared:
            build_masks_ahead(self.model)
            if self.hparams.unpad:
                self._unpadder = Unpadder(self.model)
            if self.hparams.compile:
                compile_blocks(self.model)
            self._prepared = True

    def on_fit_start(self) -> None:
        if self.device.type == "cuda":  # cuDNN attention builds a plan on the host for every new shape
            self._cudnn_sdp = torch.backends.cuda.cudnn_sdp_enabled()
            torch.backends.cuda.enable_cudnn_sdp(False)

    def on_fit_end(self) -> None:
        if self._cudnn_sdp is not None:
            torch.backends.cuda.enable_cudnn_sdp(self._cudnn_sdp)
            self._cudnn_sdp = None

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """``[B]`` scores of a padded batch (``input_ids``, ``attention_mask``, ``token_type_ids``; with ``unpad``,
        the collator's ``packing`` too).

        Raises:
            RuntimeError: the backbone is not built yet (:meth:`configure_model`, which a Trainer calls).
        """
        if self.model is None:
            raise RuntimeError("the student's backbone is built by configure_model(), which a Trainer calls: call it")
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
        if self._unpadder is None:
            return self.model(**inputs).logits.squeeze(-1)
        with self._unpadder.batch(device_packing(batch["packing"], batch["attention_mask"])):
            return self.model(**inputs).logits.squeeze(-1)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self._interval_start is None:
            self._interval_start = time.perf_counter()
        scores = self(batch)
        loss = self.loss_fn(scores, batch["target"], batch["group"], batch.get("group_sizes"))
        self._interval_samples += len(batch["target"])  # a shape: known on the host
        if self._logs_this_step():
            self._log_interval(loss, len(batch["target"]))
        return loss

    def _logs_this_step(self) -> bool:
        """Whether Lightning writes the logs after this step (and anything reads them)."""
        trainer = self.trainer
        if not trainer.loggers and trainer.progress_bar_callback is None:
            return False
        return (trainer.global_step + 1) % trainer.log_every_n_steps == 0

    def _log_interval(self, loss: torch.Tensor, size: int) -> None:
        """Log host tensors, so that Lightning never copies a figure to or from the device itself: the step's loss
        (the interval's one wait for the device) and the samples a second since the last logged step."""
        self.log("train/loss", loss.detach().cpu(), prog_bar=True, batch_size=size)
        now = time.perf_counter()
        rate = self._interval_samples * self.trainer.world_size / max(now - self._interval_start, 1e-9)
        self.log("train/samples_per_s", torch.tensor(rate), prog_bar=True, batch_size=size)
        self._interval_start, self._interval_samples = now, 0

    def on_validation_epoch_start(self) -> None:
        self._val_scores = {}

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        # Compiled blocks would compile again for evaluation and for every validation shape: validation is eager.
        eager = torch.compiler.set_stance("force_eager") if self.hparams.compile else contextlib.nullcontext()
        with eager:
            scores = self(batch)
        self._val_scores.update(zip(batch["index"].tolist(), scores.float().cpu().tolist(), strict=True))
        if not self.loss_fn.within_query:  # a within-query loss takes each query whole: at the epoch's end
            loss = self.loss_fn(scores, batch["target"], batch["group"], batch.get("group_sizes"))
            self.log("val/loss", loss, batch_size=len(scores), sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking or len(self._val_scores) < 2:
            return
        rows = sorted(self._val_scores)  # all of the split, unless limit_val_batches cut it short
        scores = np.array([self._val_scores[i] for i in rows])
        if not np.isfinite(scores).all():  # before any checkpoint of this validation is written
            raise UserError(
                f"training diverged: {int((~np.isfinite(scores)).sum())} of {len(scores)} validation scores are not "
                f"finite after step {self.trainer.global_step}; lower --model.lr (or raise --model.warmup_ratio), "
                "and check --data.label"
            )
        data = self.trainer.datamodule
        if self.loss_fn.within_query:
            self.log("val/loss", self._whole_query_loss(data.val, rows, scores), sync_dist=True)
        metrics = validation_metrics(data.val, rows, scores, data.qrels, getattr(data, "first_stage_lists", None))
        for name, value in metrics.items():
            self.log(f"val/{name}", value, prog_bar=name == "nDCG@10", sync_dist=True)
        self._last_validation = metrics

    def _whole_query_loss(self, val: Any, rows: list[int], scores: np.ndarray) -> float:
        """A within-query loss on each validation query's whole list of ``rows``, averaged over the queries: the
        validation batches, cut by length, would split a query's list where they fall (and the loss with it)."""
        queries = val.query[rows]
        targets = val.targets[rows]
        losses = []
        for query in np.unique(queries):
            mine = queries == query
            if mine.sum() > 1:
                one = torch.zeros(int(mine.sum()), dtype=torch.long)
                losses.append(float(self.loss_fn(torch.from_numpy(scores[mine]), torch.from_numpy(targets[mine]), one)))
        return float(np.mean(losses)) if losses else 0.0

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the last validation's figures with the weights: the best checkpoint's α goes into the card."""
        checkpoint["validation"] = dict(self._last_validation)

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm=None
    ) -> None:
        """Clip the global gradient norm directly: Lightning refuses to clip for a fused AdamW, although
        its gradients are already unscaled here (bf16 has no loss scaling; fp16's scaler unscales first)."""
        if gradient_clip_val:
            if gradient_clip_algorithm not in (None, "norm"):
                raise ValueError(f"only gradient_clip_algorithm 'norm' is supported, not {gradient_clip_algorithm!r}")
            torch.nn.utils.clip_grad_norm_(self.parameters(), gradient_clip_val)

    def configure_optimizers(self) -> dict[str, Any]:
        from transformers import get_linear_schedule_with_warmup

        h = self.hparams
        lr = h.lr
        if h.lr_scaling != "none":
            tokens = h.batch_tokens * self.trainer.accumulate_grad_batches * self.trainer.world_size
            lr = scaled_lr(h.lr, h.lr_scaling, tokens, h.lr_reference_tokens)
            if rank_zero_only.rank == 0:
                log.info(
                    "learning rate %.3g: %.3g at %d tokens a step, %s-scaled to %d", lr, h.lr,
                    h.lr_reference_tokens, h.lr_scaling, tokens,
                )  # fmt: skip
        optimizer = adamw(self.named_parameters(), lr, h.weight_decay)
        steps = self.trainer.estimated_stepping_batches
        schedule = get_linear_schedule_with_warmup(optimizer, int(self.hparams.warmup_ratio * steps), steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def validation_metrics(
    val: Any, rows: list[int], scores: np.ndarray, qrels: dict, first_stages: dict[str, Any] | None = None
) -> dict[str, float]:
    """The validation figures of the student's ``scores`` on the pairs ``rows`` of the split ``val``.

    - ``pearson``, ``spearman``: correlations with the teacher's labels, pooled over all pairs;
    - ``fidelity_kendall_tau``, ``fidelity_spearman``, ``fidelity_nDCG@10_teacher``: agreement with the teacher
      query by query (:mod:`distill.eval.fidelity`), what reranking needs; for a label that sums several scores,
      the same against each of them too (``fidelity_spearman/gemma.cis``, ``fidelity_spearman/first_stage``);
    - with qrels: ``nDCG@10`` of the student, the teacher and the first stage, and ``interp_alpha`` with its
      ``interp_nDCG@10``: the best α of ``α · z(student) + (1 − α) · z(first stage)``
      (:mod:`distill.core.interpolation`);
    - with qrels, for each first stage of ``first_stages`` (name -> its
      :class:`~students.data.FirstStageList`) with judged validation queries: the same on its own lists,
      ``nDCG@10/<name>``, ``first_stage_nDCG@10/<name>``, ``interp_alpha/<name>``, ``interp_nDCG@10/<name>``.
    """
    from distill.core.interpolation import choose_alpha
    from distill.eval.fidelity import fidelity_per_query, mean_fidelity
    from distill.eval.metrics import evaluate
    from distill.eval.trec_runs import run_from_columns

    labels, first_stage = val.labels[rows], val.first_stage[rows]
    qids, docids = val.ids.qid.iloc[val.rows[rows]].tolist(), val.ids.docid.iloc[val.rows[rows]].tolist()
    metrics = {
        "pearson": float(pearsonr(scores, labels).statistic),
        "spearman": float(spearmanr(scores, labels).statistic),
    }
    student, teacher = run_from_columns(qids, docids, scores.tolist()), run_from_columns(qids, docids, labels.tolist())
    metrics.update({f"fidelity_{k}": v for k, v in mean_fidelity(fidelity_per_query(student, teacher)).items()})
    for member, values in val.members.items():
        reference = run_from_columns(qids, docids, values[rows].tolist())
        fidelity = mean_fidelity(fidelity_per_query(student, reference))
        metrics.update({f"fidelity_{k}/{member}": v for k, v in fidelity.items()})
    if qrels:
        for name, values in (("", scores), ("teacher_", labels), ("first_stage_", first_stage)):
            metrics[f"{name}nDCG@10"] = evaluate(run_from_columns(qids, docids, values.tolist()), qrels, ["nDCG@10"])[
                "nDCG@10"
            ]
        alpha, by_alpha = choose_alpha(scores, first_stage, qids, docids, qrels)
        metrics["interp_alpha"], metrics["interp_nDCG@10"] = alpha, by_alpha[alpha]
        scored = np.full(len(val), np.nan)
        scored[rows] = scores
        for name, lists in (first_stages or {}).items():
            keep = np.isfinite(scored[lists.positions])  # all of them, unless limit_val_batches cut the split
            positions, first = lists.positions[keep], lists.scores[keep]
            list_qids = val.ids.qid.iloc[val.rows[positions]].tolist()
            if not set(list_qids) & set(qrels):
                continue
            list_docids = val.ids.docid.iloc[val.rows[positions]].tolist()
            student = scored[positions]
            for prefix, values in (("", student), ("first_stage_", first)):
                run = run_from_columns(list_qids, list_docids, values.tolist())
                metrics[f"{prefix}nDCG@10/{name}"] = evaluate(run, qrels, ["nDCG@10"])["nDCG@10"]
            alpha, by_alpha = choose_alpha(student, first, list_qids, list_docids, qrels)
            metrics[f"interp_alpha/{name}"], metrics[f"interp_nDCG@10/{name}"] = alpha, by_alpha[alpha]
    return metrics
