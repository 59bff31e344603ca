"""Distillation losses. Each is a small module with one input contract:

``loss(scores, targets, groups) -> scalar``, where

- ``scores``: ``[B]`` student scores (float);
- ``targets``: ``[B]`` teacher scores after target scaling (float);
- ``groups``: ``[B]`` long, the query of each pair as a batch-local index ``0..G-1``.

Pairs of one query are compared only with each other; a query's candidates may sit anywhere in the batch.
"""

from __future__ import annotations

import torch
from torch import nn


def _grouped(values: torch.Tensor, groups: torch.Tensor, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Scatter ``[B]`` values into ``[G, K]`` rows, one per group (K = the largest group), padded with ``fill``.

    Returns the ``[G, K]`` values and the ``[G, K]`` bool mask of real entries.
    """
    n_groups = int(groups.max()) + 1
    counts = torch.bincount(groups, minlength=n_groups)
    order = torch.argsort(groups, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(groups), device=groups.device) - starts[groups[order]]
    out = values.new_full((n_groups, int(counts.max())), fill)
    mask = torch.zeros_like(out, dtype=torch.bool)
    out[groups[order], slot] = values[order]
    mask[groups[order], slot] = True
    return out, mask


class PointwiseMSE(nn.Module):
    """Mean squared error between student scores and teacher targets (the paper's loss)."""

    def forward(self, scores: torch.Tensor, targets: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(scores.float(), targets.float())


class MarginMSE(nn.Module):
    """MSE between student and teacher margins over every ordered (pos, neg) pair within a query.

    For pairs i, j of one query with ``targets[i] > targets[j]``: mean of
    ``((scores[i] - scores[j]) - (targets[i] - targets[j]))^2``. Queries with one candidate add nothing.
    """

    def forward(self, scores: torch.Tensor, targets: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        same = groups[:, None] == groups[None, :]
        ordered = same & (targets[:, None] > targets[None, :])
        if not ordered.any():
            return scores.sum() * 0.0
        student = scores.float()[:, None] - scores.float()[None, :]
        teacher = targets.float()[:, None] - targets.float()[None, :]
        return ((student - teacher)[ordered] ** 2).mean()


class ListwiseKL(nn.Module):
    """KL(softmax(targets / temperature) || softmax(scores)) over each query's candidates, averaged over queries.

    Args:
        temperature: divides the teacher scores; higher makes the teacher distribution flatter.
    """

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = temperature

    def forward(self, scores: torch.Tensor, targets: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        student, mask = _grouped(scores.float(), groups, float("-inf"))
        teacher, _ = _grouped(targets.float() / self.temperature, groups, float("-inf"))
        log_q = torch.log_softmax(student, dim=-1)
        log_p = torch.log_softmax(teacher, dim=-1)
        kl = torch.where(mask, log_p.exp() * (log_p - log_q), torch.zeros_like(log_p)).sum(-1)
        return kl.mean()


LOSSES = {"mse": PointwiseMSE, "margin_mse": MarginMSE, "listwise_kl": ListwiseKL}
"""Loss names for configs. ``mse`` is pointwise; the others compare candidates within a query."""
