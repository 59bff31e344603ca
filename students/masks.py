"""The encoder's attention mask, built without asking the device anything.

Given a ``[B, T]`` padding mask, transformers first checks whether it masks anything (``mask.all()``), so that an
unpadded batch can skip the mask: a host synchronisation in every forward pass. Training batches are padded (to a
multiple of 64 on a GPU), so the answer is nearly always no. A hook on the encoder builds the ``[B, 1, T, T]`` mask
itself, with transformers' own function and the skip off; the encoder takes a 4D mask as it is. The model's own
forward still receives the 2D mask (the segment-cosine head pools with it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from distill.model.segment_cosine import MODEL_TYPE as SEGMENT_COSINE

MODEL_TYPES = ("bert", SEGMENT_COSINE)
"""Encoders whose forward builds its mask with ``create_bidirectional_mask`` and takes a prepared 4D mask."""


def build_masks_ahead(model: nn.Module) -> bool:
    """Hook ``model``'s encoder (its ``base_model``) to build its 4D attention mask without a host sync.

    Returns:
        Whether the model is of a type in :data:`MODEL_TYPES` and was hooked (others are left as they are).
    """
    encoder = getattr(model, "base_model", None)
    config = getattr(model, "config", None)
    if encoder is None or config is None or config.model_type not in MODEL_TYPES or config.is_decoder:
        return False
    encoder.register_forward_pre_hook(_four_dimensional_mask, with_kwargs=True)
    return True


def _four_dimensional_mask(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    from transformers.masking_utils import create_bidirectional_mask

    mask = kwargs.get("attention_mask")
    if mask is None or mask.ndim != 2:
        return args, kwargs
    # Only the batch, the length, the dtype and the device of the embeddings are read.
    embeddings = torch.empty((*mask.shape, 0), dtype=module.dtype, device=mask.device)
    kwargs["attention_mask"] = create_bidirectional_mask(
        module.config, embeddings, mask, allow_is_bidirectional_skip=False
    )
    return args, kwargs
