"""At the end of fit, the best checkpoint becomes a plain Hugging Face folder (DeepSpeed ones included)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning import Callback, LightningModule, Trainer
from pytorch_lightning.callbacks import ModelCheckpoint

from distill.core.output_files import remove_stale_siblings, replace_folder, staging_path
from distill.core.student_card import DEFAULT_FIRST_STAGE, StudentCard
from distill.data.label_table import teacher_identities
from students.initial_weights import blend_with_initial
from students.model import build_student, save_student

log = logging.getLogger(__name__)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint as a dict (``state_dict`` and the rest), from a file or a DeepSpeed checkpoint folder (ZeRO
    shards are gathered into fp32 weights)."""
    path = Path(path)
    if path.is_dir():
        from pytorch_lightning.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

        with tempfile.TemporaryDirectory() as tmp:
            return convert_zero_checkpoint_to_fp32_state_dict(path, Path(tmp) / "fp32.pt")
    return torch.load(path, map_location="cpu", weights_only=False)


class ExportBestToHF(Callback):
    """Writes the best checkpoint of ``checkpoints`` as an HF folder at ``dirpath`` when fit ends.

    The folder loads with ``AutoModelForSequenceClassification`` and ``CrossEncoder``; its
    ``config.cis_distill`` is its :class:`~distill.core.student_card.StudentCard`: the teacher data (and the
    named teachers, each with the teacher identity of its datasets), label, target scaling, the held-out
    (validation) query ids and the validation metric, and the α of each first stage (:func:`card_interpolation`).
    """

    def __init__(self, checkpoints: ModelCheckpoint, dirpath: str | Path, interpolate: bool = False) -> None:
        self.checkpoints = checkpoints
        self.dirpath = Path(dirpath)
        self.interpolate = interpolate

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        checkpoints = self.checkpoints
        best = checkpoints.best_model_path
        trainer.strategy.barrier()
        if not trainer.is_global_zero or not best:
            return
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_config(pl_module.model.config)
        prefix = "model."
        checkpoint = read_checkpoint(best)
        model.load_state_dict(
            {k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
        )
        share = pl_module.hparams.get("initial_weight_share", 0.0)
        if share:
            model.load_state_dict(blend_with_initial(model.state_dict(), initial_state(pl_module.hparams), share))
        validation = checkpoint.get("validation") or {}
        data = trainer.datamodule
        card = StudentCard(
            backbone=pl_module.hparams.backbone,
            label=data.hparams.label,
            loss=pl_module.hparams.loss,
            teacher_data=data.folders,
            target_scaling=data.scaling.to_dict(),
            max_length=data.hparams.max_length,
            val_queries=sorted(set(data.val.qid)),
            qrels=data.hparams.qrels,
            monitor=checkpoints.monitor,
            best_score=float(checkpoints.best_model_score) if checkpoints.best_model_score is not None else None,
            checkpoint=os.path.relpath(best, self.dirpath.parent),
            interpolation=card_interpolation(validation, data),
            interpolate=self.interpolate,
            teachers=teacher_identities(data.teachers),
            initial_weight_share=share,
            extra={"validation": validation},
        )
        remove_stale_siblings(self.dirpath)
        staging = staging_path(self.dirpath)
        shutil.rmtree(staging, ignore_errors=True)
        save_student(model, data.tokenizer, staging, card)
        replace_folder(staging, self.dirpath)  # a reader (a server of hf/) sees the old student or the new, whole
        log.info("exported %s to %s", best, self.dirpath)


def initial_state(hparams: Any) -> dict[str, torch.Tensor]:
    """The weights the student of a :class:`~students.module.CrossEncoderModule`'s ``hparams`` started from."""
    model, _ = build_student(
        hparams.backbone, hparams.random_init, hparams.dropout, hparams.head, hparams.segment_layers
    )
    return model.state_dict()


def card_interpolation(validation: dict[str, float], data: Any) -> dict[str, dict[str, Any]] | None:
    """The card's ``interpolation``: each first stage's α from the best checkpoint's ``validation`` figures, with the
    candidate files and the number of judged queries it was chosen on (the data module's ``first_stages``, or
    :data:`~distill.core.student_card.DEFAULT_FIRST_STAGE` for the validation split as a whole), then the α of each
    first stage of ``data.alpha_from``, by its rule: a number declares it (in place of one chosen on the first stage's
    lists), a name takes that first stage's. A first stage whose lists held no judged validation query gets no α,
    nor does a rule that names it; None: no α at all (no qrels)."""
    lists = data.first_stage_lists
    if lists:
        chosen = {
            name: {"alpha": validation[f"interp_alpha/{name}"], "chosen_on": ", ".join(lists[name].chosen_on),
                   "queries": lists[name].queries}
            for name in lists
            if f"interp_alpha/{name}" in validation
        }  # fmt: skip
    elif "interp_alpha" in validation:
        chosen = {
            DEFAULT_FIRST_STAGE: {
                "alpha": validation["interp_alpha"],
                "chosen_on": ", ".join(data.val_inputs),
                "queries": len(data.qrels),
            }
        }
    else:
        chosen = {}
    rules = data.hparams.get("alpha_from") or {}
    for name, rule in rules.items():  # numbers first, so that a rule takes a declared α
        if not isinstance(rule, str):
            chosen[name] = {"alpha": float(rule), "declared": True}
    for name, rule in rules.items():
        if isinstance(rule, str):
            if rule in chosen:
                chosen[name] = {"alpha": chosen[rule]["alpha"], "taken_from": rule}
            else:
                log.warning("data.alpha_from: %s takes the alpha of %s, which has none (no judged queries)", name, rule)
    return {name: {**entry, "alpha": float(entry["alpha"])} for name, entry in chosen.items()} or None
