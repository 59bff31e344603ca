"""The student: a Hugging Face encoder with a one-score sequence-classification head.

Two heads, chosen by ``head``: ``cls`` (the paper's, below) and ``segment_cosine``
(:mod:`distill.model.segment_cosine`: the cosine of the query's and the passage's mean tokens, which a
sentence-embedding backbone makes a good ranker before any training; BERT and MPNet backbones).

``AutoModelForSequenceClassification`` with ``num_labels=1`` is exactly the paper's cross-encoder:
it reads ``[CLS] Q [SEP] K [SEP]``, takes the [CLS] representation (BERT's pooled [CLS]), applies
dropout and a linear layer, and returns one score. Saved with :func:`save_student`, a student is a
plain HF folder that ``AutoModelForSequenceClassification`` and sentence-transformers'
``CrossEncoder`` load as-is (the latter with an identity activation, so both give the same numbers).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformers import AutoModelForSequenceClassification, PreTrainedModel

from distill.core.schema import InputError
from distill.core.student_card import StudentCard
from distill.model.resolver import load_architecture, load_pretrained, resolve_model
from distill.model.segment_cosine import MODEL_TYPE as SEGMENT_COSINE
from distill.model.segment_cosine import MPNET_MODEL_TYPE, BertSegmentCosineConfig, MPNetSegmentCosineConfig

IDENTITY_ACTIVATION = "torch.nn.modules.linear.Identity"
HEADS = ("cls", "segment_cosine")
SEGMENT_COSINE_CONFIGS = {
    "bert": BertSegmentCosineConfig,
    SEGMENT_COSINE: BertSegmentCosineConfig,
    "mpnet": MPNetSegmentCosineConfig,
    MPNET_MODEL_TYPE: MPNetSegmentCosineConfig,
}
"""The segment-cosine head's config for each backbone ``model_type`` it takes (a student's own type included)."""


def build_student(
    backbone: str, random_init: bool = False, dropout: float | None = None, head: str = "cls", segment_layers: int = 0
) -> tuple[PreTrainedModel, Any]:
    """A cross-encoder on ``backbone`` and its tokenizer.

    Args:
        backbone: any name :func:`distill.model.resolver.resolve_model` takes; ``bert-large-uncased`` builds offline.
        random_init: random weights from the backbone's config (for timing where its weights are absent).
        dropout: dropout before the linear head (``cls`` head); default the backbone's.
        head: ``cls`` ([CLS] → linear, the paper's) or ``segment_cosine`` (see the module's docstring).
        segment_layers: with ``segment_cosine``, its first layers that attend within each segment only.

    Raises:
        InputError: an unknown head, ``segment_cosine`` on a backbone that is neither BERT nor MPNet, or
            ``segment_layers`` without it or beyond the backbone's layers.
    """
    if head not in HEADS:
        raise InputError(f"model.head: {head!r} is none of {list(HEADS)}")
    overrides: dict[str, Any] = {"num_labels": 1}
    if dropout is not None:
        overrides["classifier_dropout"] = dropout
    config, tokenizer = load_architecture(backbone, **overrides)
    if head == "segment_cosine":
        head_config = SEGMENT_COSINE_CONFIGS.get(config.model_type)
        if head_config is None:
            raise InputError(
                f"model.head: segment_cosine needs a BERT or MPNet backbone, {backbone!r} is {config.model_type}"
            )
        layers = config.num_hidden_layers
        if not 0 <= segment_layers <= layers:
            raise InputError(f"model.segment_layers: {segment_layers} is not in 0..{layers}, the backbone's layers")
        values = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "segment_layers")}
        config = head_config(**values, segment_layers=segment_layers)
    elif segment_layers:
        raise InputError("model.segment_layers: applies to the segment_cosine head only")
    if random_init:
        model = AutoModelForSequenceClassification.from_config(config)
    else:
        model = load_pretrained(resolve_model(backbone), AutoModelForSequenceClassification, config=config)
    return model, tokenizer


def save_student(model: PreTrainedModel, tokenizer: Any, path: str | Path, card: StudentCard | None) -> Path:
    """Save a plain HF folder (safetensors, tokenizer, config) with ``card`` under ``config.cis_distill``."""
    path = Path(path)
    if card is not None:
        card.write_to(model.config)
    model.config.sentence_transformers = {"activation_fn": IDENTITY_ACTIVATION}
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    _readable_as_umask_allows(path)
    return path


def _readable_as_umask_allows(folder: Path) -> None:
    """Give the files of ``folder`` the mode a plain write gives (``0o666`` less the umask): safetensors writes its
    file ``0o600``, which another user (a server's) cannot read, nor copies of it (the export's)."""
    mask = os.umask(0)
    os.umask(mask)
    for file in folder.iterdir():
        if file.is_file():
            os.chmod(file, 0o666 & ~mask)
