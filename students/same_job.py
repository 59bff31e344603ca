"""A callback that stops a multi-process training run whose processes were not launched alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytorch_lightning import Callback, LightningModule, Trainer

from distill.core.rank_agreement import check_ranks_agree


class SameJobOnEveryRank(Callback):
    """At setup, once the processes have met and before a checkpoint is restored or a batch trained, every rank's
    ``settings`` (the run's resolved config and the checkpoint it resumes from) are compared with rank 0's: nodes
    launched with another option (a learning rate trained on silently, a batch size that hung the run at its first
    uneven step) or another checkpoint (a node-local run folder: one rank resumed, one started afresh, and the two
    never met again) stop alike, with one line naming the key.

    Args:
        settings: this rank's settings (nested mappings are compared key by key).
    """

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.settings = settings

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        check_ranks_agree(self.settings, "distill train")
