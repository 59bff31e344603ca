"""Distillation losses: small modules with one input contract, checked by their base class.

``loss(scores, targets, groups) -> scalar``, where

- ``scores``: ``[B]`` student scores (float);
- ``targets``: ``[B]`` teacher scores after target scaling (float), finite;
- ``groups``: ``[B]`` long, the query of each pair as a batch-local index ``0..G-1``, each index present;
- ``sizes`` (optional): ``(G, K)``, the number of queries and the most candidates of one, as the host knows them
  from the batch it built: with them, no loss reads anything back from the device (no host synchronisation).

The base class checks what it can without reading values back from the device: the shapes, the groups' dtype, the
devices, a non-empty batch. The values are the data's contract: :class:`~students.data.StudentDataModule` refuses
non-finite labels and builds the groups and sizes from the batch it made.

Pairs of one query are compared only with each other; a query's candidates may sit anywhere in the batch.
The within-query losses (:attr:`DistillationLoss.within_query`) need batches that hold several candidates of
each query (``data.group_size``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

Sizes = tuple[int, int]
"""``(G, K)``: the queries of a batch and the most candidates of one."""


def _grouped(
    values: torch.Tensor, groups: torch.Tensor, fill: float, sizes: Sizes | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scatter ``[B]`` values into ``[G, K]`` rows, one per group (K = the largest group), padded with ``fill``;
    ``sizes`` ``(G, K)`` where the host knows them (else read from ``groups``: a device sync).

    Returns the ``[G, K]`` values and the ``[G, K]`` bool mask of real entries.
    """
    n_groups = int(groups.max()) + 1 if sizes is None else sizes[0]
    counts = torch.bincount(groups, minlength=n_groups)
    order = torch.argsort(groups, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(groups), device=groups.device) - starts[groups[order]]
    out = values.new_full((n_groups, int(counts.max()) if sizes is None else sizes[1]), fill)
    mask = torch.zeros_like(out, dtype=torch.bool)
    out[groups[order], slot] = values[order]
    mask[groups[order], slot] = True
    return out, mask


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` where ``mask`` is true (0, with zero gradients, where it is nowhere), computed without
    reading the mask back to the host."""
    return torch.where(mask, values, torch.zeros_like(values)).sum() / mask.sum().clamp(min=1)


def _ordered_pairs(targets: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``[B, B]`` bool: ``[i, j]`` where i and j belong to one query and the teacher prefers i."""
    return (groups[:, None] == groups[None, :]) & (targets[:, None] > targets[None, :])


class DistillationLoss(nn.Module):
    """The base of every loss: checks the inputs' shapes, dtype and devices (see the module's contract), then
    :meth:`compute` on fp32 scores and targets."""

    within_query = False
    """Whether the loss compares candidates of one query (and needs batches grouped by query)."""

    def forward(
        self, scores: torch.Tensor, targets: torch.Tensor, groups: torch.Tensor, sizes: Sizes | None = None
    ) -> torch.Tensor:
        if scores.ndim != 1 or targets.shape != scores.shape or groups.shape != scores.shape:
            raise ValueError(
                f"{type(self).__name__}: scores, targets and groups must all be [B]; "
                f"got {tuple(scores.shape)}, {tuple(targets.shape)}, {tuple(groups.shape)}"
            )
        if groups.dtype != torch.long:
            raise ValueError(
                f"{type(self).__name__}: groups must be long (batch-local query indices), got {groups.dtype}"
            )
        if not scores.device == targets.device == groups.device:
            raise ValueError(f"{type(self).__name__}: inputs on {scores.device}, {targets.device}, {groups.device}")
        if scores.numel() == 0:
            raise ValueError(f"{type(self).__name__}: an empty batch")
        return self.compute(scores.float(), targets.float(), groups, sizes)

    def compute(
        self, scores: torch.Tensor, targets: torch.Tensor, groups: torch.Tensor, sizes: Sizes | None
    ) -> torch.Tensor:
        raise NotImplementedError


class PointwiseMSE(DistillationLoss):
    """Mean squared error between student scores and teacher targets (the paper's loss)."""

    def compute(
        self, scores: torch.Tensor, targets: torch.Tensor, groups: torch.Tensor, sizes: Sizes | None
    ) -> torch.Tensor:
        return nn.functional.mse_loss(scores, targets)


class MarginMSE(DistillationLoss):
    """MSE between student and teacher margins over every ordered (pos, neg) pair within a query.

    For pairs i, j of one query with ``targets[i] > targets[j]``: mean of
    ``((scores[i] - scores[j]) - (targets[i] - targets[j]))^2``. Queries with one candidate add nothing.
    """

    within_query = True

    def compute(
        self, scores: torch.Tensor, targets: torch.Tensor, groups: torch.Tensor, sizes: Sizes | None
    ) -> torch.Tensor:
        ordered = _ordered_pairs(targets, groups)
        student = scores[:, None] - scores[None, :]
        teacher = targets[:, None] - targets[None, :]
        return _masked_mean((student - teacher) ** 2, ordered)


class RankNet(DistillationLoss):
    """Pairwise logistic loss (RankNet): for pairs i, j of one query the teacher orders i above j, mean of
    ``log(1 + exp(-(scores[i] - scores[j])))``. Only the teacher's order counts, not its margins."""

    within_query = True

    def compute(
        self, scores: torch.Tensor, targets: torch.Tensor, groups: torch.Tensor, sizes: Sizes | None
    ) -> torch.Tensor:
        ordered = _ordered_pairs(targets, groups)
        return _masked_mean(nn.functional.softplus(-(scores[:, None] - scores[None, :])), ordered)


class TemperatureLoss(DistillationLoss):
    """A within-query loss with a positive ``temperature`` (in the units of the scores)."""

    within_query = True

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        if not 0 < temperature < math.inf:  # NaN too
            raise ValueError(f"temperature must be positive and finite, got {temperature}")
        self.temperature = temperature


class ListwiseKL(TemperatureLoss):
    """KL(softmax(targets / temperature) || softmax(scores)) over each query's candidates, averaged over the queries
    present (a group index with no pair adds nothing).

    Args:
        temperature: divides the teacher scores; higher makes the teacher distribution flatter.
    """

    def compute(
        self, scores: torch.Tensor, targets: torch.Tensor, groups: torch.Tensor, sizes: Sizes | None
    ) -> torch.Tensor:
        student, mask = _grouped(scores, groups, float("-inf"), sizes)
        teacher, _ = _grouped(targets / self.temperature, groups, float("-inf"), sizes)
        log_q = torch.log_softmax(student, dim=-1)
        log_p = torch.log_softmax(teacher, dim=-1)
        kl = torch.where(mask, log_p.exp() * (log_p - log_q), torch.zeros_like(log_p)).sum(-1)
        return _masked_mean(kl, mask.any(-1))


class ADRMSE(TemperatureLoss):
    """Approximate discounted rank MSE (Rank-DistiLLM, Schlatt et al., 2025): within each query, the squared gap
    between the teacher's rank ``r`` of a candidate and the student's differentiable rank
    ``r̂ = 1 + Σ_j σ((s_j − s_i) / temperature)``, discounted by ``log2(r + 1)``, so that the top of the teacher's
    ranking weighs most; averaged over the candidates.

    Args:
        temperature: sharpness of the approximate rank (scores' units); lower is closer to the hard rank.
    """

    def compute(
        self, scores: torch.Tensor, targets: torch.Tensor, groups: torch.Tensor, sizes: Sizes | None
    ) -> torch.Tensor:
        student, mask = _grouped(scores, groups, 0.0, sizes)
        teacher, _ = _grouped(targets, groups, float("-inf"), sizes)
        pair_mask = mask[:, :, None] & mask[:, None, :]
        above = torch.sigmoid((student[:, None, :] - student[:, :, None]) / self.temperature)  # [G, i, j]: j above i
        eye = torch.eye(student.shape[1], dtype=torch.bool, device=student.device)
        approx_rank = 1 + torch.where(pair_mask & ~eye, above, torch.zeros_like(above)).sum(-1)
        # The teacher's rank: 1 + the candidates it scores higher (ties share the better rank).
        teacher_rank = 1 + ((teacher[:, None, :] > teacher[:, :, None]) & pair_mask).sum(-1).float()
        weight = 1 / torch.log2(teacher_rank + 1)
        return _masked_mean(weight * (approx_rank - teacher_rank) ** 2, mask)


LOSSES: dict[str, type[DistillationLoss]] = {
    "mse": PointwiseMSE,
    "margin_mse": MarginMSE,
    "ranknet": RankNet,
    "listwise_kl": ListwiseKL,
    "adr_mse": ADRMSE,
}
"""Loss names for configs. ``mse`` is pointwise; the others compare candidates within a query."""


def build_loss(name: str, temperature: float = 1.0) -> DistillationLoss:
    """The loss called ``name`` (a key of :data:`LOSSES`), with ``temperature`` where it takes one."""
    if name not in LOSSES:
        raise ValueError(f"loss must be one of {sorted(LOSSES)}, not {name!r}")
    loss = LOSSES[name]
    return loss(temperature) if issubclass(loss, TemperatureLoss) else loss()
