"""A trained student's weights moved back towards where it started: WiSE-FT's weight-space ensemble.

Wortsman et al. ("Robust fine-tuning of zero-shot models", CVPR 2022) interpolate every weight of a fine-tuned
model with the pretrained one it started from, ``(1 − s) · trained + s · initial``; the blend keeps much of what
fine-tuning taught on its own distribution and much of the pretrained model's robustness beyond it. A student
distilled from a sentence-embedding backbone through the segment-cosine head starts as a good ranker
(:mod:`distill.model.segment_cosine`), so the same interpolation applies to it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from distill.core.schema import InputError


def check_initial_weight_share(share: float, head: str, random_init: bool) -> None:
    """Raise :class:`InputError` (naming ``model.initial_weight_share``) unless ``share`` is in [0, 1] and, when
    above 0, the student starts as a ranker: the ``segment_cosine`` head on pretrained weights."""
    key = "model.initial_weight_share"
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
        raise InputError(f"{key}: expected a number in [0, 1], not {share!r}")
    if share and head != "segment_cosine":
        raise InputError(
            f"{key}: needs the segment_cosine head, which starts as a ranker; the {head} head starts at random"
        )
    if share and random_init:
        raise InputError(f"{key}: needs pretrained weights to return to, not model.random_init")


def blend_with_initial(
    trained: Mapping[str, torch.Tensor], initial: Mapping[str, torch.Tensor], share: float
) -> dict[str, torch.Tensor]:
    """``(1 − share) · trained + share · initial`` for every floating-point tensor of ``trained`` (in its dtype);
    other tensors (integer buffers such as position ids) as trained.

    Raises:
        ValueError: ``share`` outside [0, 1], or the two state dicts differ in names or shapes.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"the initial weights' share is in [0, 1], not {share}")
    if set(trained) != set(initial):
        differ = sorted(set(trained) ^ set(initial))
        raise ValueError(f"the trained and initial weights name different tensors: {differ[:5]}")
    blended = {}
    for name, weight in trained.items():
        start = initial[name]
        if weight.shape != start.shape:
            raise ValueError(f"{name}: trained {tuple(weight.shape)} against initial {tuple(start.shape)}")
        if weight.is_floating_point():
            mixed = torch.lerp(weight.float(), start.to(weight.device).float(), share)
            blended[name] = mixed.to(weight.dtype)
        else:
            blended[name] = weight
    return blended
