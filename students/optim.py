"""The student's optimiser, and a learning rate that follows the effective batch.

A learning rate is tuned at one batch size; a run with a larger batch (a GPU's token budget, gradient accumulation,
more devices) takes fewer, less noisy steps and wants a larger rate. :func:`scaled_lr` says how, from the tokens an
optimiser step sees: ``lr x (tokens / reference_tokens) ** p``, with ``p = 1/2`` (``sqrt``, the usual rule for
Adam) or ``1`` (``linear``). The schedule's warm-up is a share of the optimiser steps, so it follows the effective
batch as well.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import torch

from distill.core.schema import InputError

LrScaling = Literal["none", "sqrt", "linear"]
EXPONENTS: dict[str, float] = {"none": 0.0, "sqrt": 0.5, "linear": 1.0}


def check_lr_scaling(scaling: LrScaling, reference_tokens: int | None, batch_tokens: int | None) -> None:
    """Check that a scaled learning rate can be computed.

    Raises:
        InputError: ``scaling`` is unknown, or is not ``none`` and either the reference batch or the token budget
            (``data.max_batch_tokens``: the effective batch is counted in tokens) is missing or not positive.
    """
    if scaling not in EXPONENTS:
        raise InputError(f"model.lr_scaling: {scaling!r} is none of {sorted(EXPONENTS)}")
    if scaling == "none":
        return
    if reference_tokens is None or reference_tokens < 1:
        raise InputError(f"model.lr_reference_tokens: lr_scaling {scaling} needs a positive reference batch in tokens")
    if batch_tokens is None:
        raise InputError(f"model.lr_scaling: {scaling} counts the batch in tokens and needs data.max_batch_tokens")


def scaled_lr(lr: float, scaling: LrScaling, tokens_per_step: int, reference_tokens: int | None) -> float:
    """The learning rate for optimiser steps of ``tokens_per_step`` padded tokens (token budget x accumulated
    batches x devices), where ``lr`` is the rate at ``reference_tokens`` a step:
    ``lr x (tokens_per_step / reference_tokens) ** p``, ``p`` 0 (``none``), 1/2 (``sqrt``) or 1 (``linear``)."""
    if scaling == "none":
        return lr
    return lr * (tokens_per_step / reference_tokens) ** EXPONENTS[scaling]


def adamw(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]], lr: float, weight_decay: float
) -> torch.optim.AdamW:
    """AdamW with ``weight_decay`` on the weight matrices only (not on biases and norms): fused into one kernel
    when the parameters are on a GPU, multi-tensor (``foreach``) on a CPU."""
    decay, no_decay = [], []
    for name, param in named_parameters:
        if param.requires_grad:
            (no_decay if param.ndim < 2 or "norm" in name.lower() else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    on_gpu = any(p.is_cuda for p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=lr, fused=on_gpu or None, foreach=None if on_gpu else True)
