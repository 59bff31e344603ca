"""Unpadded encoders: a BERT encoder's layers run on a batch's real tokens only.

A cross-encoder batch ``[B, T]`` holds ``N = sum(lengths)`` real tokens, and ``B · T - N`` pads that every linear
layer computes anyway (a DL19 query's 100 BM25 candidates in one batch are all padded to the longest of them).
:class:`Unpadder` hooks a model's encoder so that:

- before the first layer, the embeddings' output ``[B, T, H]`` is gathered into one packed row ``[1, N, H]`` (the
  pairs back to back; position and token-type embeddings were already added per padded row, so they are right);
- every layer's linear layers then run on ``N`` tokens; attention keeps each token within its own pair, through
  :func:`unpadded_attention`, registered with transformers' attention interface as :data:`ATTENTION`;
- after the last layer, the packed output is scattered back to ``[B, T, H]`` (zeros at the pads), so the head
  (the pooler on ``[CLS]``, or the segment means) reads the layout it always did.

Attention over the packed row runs, for inference on CUDA in fp16 or bf16 where torch has it, as
``torch.nn.attention.varlen.varlen_attn`` (flash attention over the pairs' cumulative lengths); elsewhere (and
wherever gradients flow) the packed queries, keys and values are scattered back to ``[B, heads, T, d]`` for SDPA
under the padding mask and gathered again, which computes the padded model's attention exactly. Either way the
scores are the padded model's within rounding (other matmul shapes). No dropout is applied to the attention
probabilities (the hidden states' dropout stays): training unpadded is a lever that changes the regularisation.

The packing is computed on the host, so nothing waits on the device: in the reranker from the rows' lengths
(:func:`lengths_packing`, numpy, without reading the padded attention mask), in the training collator from the
batch's attention mask (:func:`host_packing`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from distill.core.batching import segments
from distill.core.schema import InputError
from distill.core.segment_cosine import MODEL_TYPE as SEGMENT_COSINE

ATTENTION = "cis_unpadded"
"""The attention implementation's name in transformers' :class:`AttentionInterface` while a model is unpadded."""
PACKING = "cis_packing"
"""The keyword under which a layer's attention receives the batch's :class:`Packing`."""
MODEL_TYPES = ("bert", SEGMENT_COSINE)
"""The architectures whose encoder passes its keywords down to the attention interface, as unpadding needs."""
VARLEN_DTYPES = (torch.float16, torch.bfloat16)
"""The dtypes of the flash variable-length kernel."""


@dataclass(frozen=True)
class Packing:
    """Where a padded batch's real tokens are, on the model's device."""

    indices: torch.Tensor
    """``[N]`` int64: the flat position (``row · T + column``) of each real token, row by row."""
    cu_seqlens: torch.Tensor
    """``[B + 1]`` int32: the offset of each row's first token in the packed row, then ``N``."""
    key_mask: torch.Tensor
    """``[B, 1, 1, T]`` bool: True at real tokens (the padded attention's mask)."""
    max_length: int
    """The longest row, in tokens."""
    shape: tuple[int, int]
    """``(B, T)``: the padded batch."""


def host_packing(attention_mask: np.ndarray | torch.Tensor) -> dict[str, Any]:
    """Where the real tokens of a host attention mask ``[B, T]`` (1 at real tokens, on either padding side) are:
    ``indices`` ``[N]`` int64 and ``cu_seqlens`` ``[B + 1]`` int32 tensors, and ``max_length``, an int (the
    fields of :class:`Packing` that need the mask's values; the training collator adds them to each batch)."""
    mask = np.asarray(attention_mask).astype(bool)
    lengths = mask.sum(1)
    return {
        "indices": torch.from_numpy(np.flatnonzero(mask).astype(np.int64)),
        "cu_seqlens": torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)),
        "max_length": int(lengths.max(initial=0)),
    }


def lengths_packing(lengths: np.ndarray, width: int, left: bool = False) -> dict[str, Any]:
    """:func:`host_packing`'s fields for a batch ``[B, width]`` whose row ``i`` holds ``lengths[i]`` real tokens,
    padded on the right (or the ``left``), computed from the lengths with numpy: the mask is never read."""
    lengths = np.asarray(lengths, dtype=np.int64)
    first = np.arange(len(lengths), dtype=np.int64) * width + (width - lengths if left else 0)
    return {
        "indices": torch.from_numpy(segments(first, lengths)),
        "cu_seqlens": torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)),
        "max_length": int(lengths.max(initial=0)),
    }


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without a wait (a pinned, non-blocking copy on CUDA)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def device_packing(fields: dict[str, Any], attention_mask: torch.Tensor) -> Packing:
    """The :class:`Packing` of a batch from its :func:`host_packing` fields and its attention mask ``[B, T]``, all
    on the model's device (nothing is read back)."""
    return Packing(
        indices=fields["indices"],
        cu_seqlens=fields["cu_seqlens"],
        key_mask=attention_mask.bool()[:, None, None, :],
        max_length=fields["max_length"],
        shape=(attention_mask.shape[0], attention_mask.shape[1]),
    )


def packing(attention_mask: np.ndarray, device: torch.device) -> Packing:
    """The :class:`Packing` of a padded batch from its host attention mask ``[B, T]``; the tensors go to
    ``device`` without a wait (pinned, non-blocking copies on CUDA)."""

    mask = to_device(torch.from_numpy(np.ascontiguousarray(attention_mask)), device)
    return device_packing(fields_on(host_packing(attention_mask), device), mask)


def fields_on(fields: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """:func:`host_packing`'s (or :func:`lengths_packing`'s) fields with their tensors on ``device``
    (:func:`to_device`)."""
    return {k: to_device(v, device) if isinstance(v, torch.Tensor) else v for k, v in fields.items()}


def varlen_kernel(query: torch.Tensor) -> Any | None:
    """torch's flash variable-length attention, where it runs on ``query``'s device and dtype; else None (on a CPU,
    in fp32, or on a torch without it)."""
    if query.device.type != "cuda" or query.dtype not in VARLEN_DTYPES:
        return None
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch before 2.9
        return None
    return varlen_attn


def unpadded_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention within each pair of a packed row: ``query``, ``key``, ``value`` ``[1, heads, N, d]`` -> ``[1, N,
    heads, d]`` (the attention interface's contract), the pairs delimited by ``kwargs[PACKING]``."""
    packed: Packing | None = kwargs.get(PACKING)
    if packed is None:
        raise RuntimeError(f"attention {ATTENTION!r} runs only inside an Unpadder's batch")
    flat = [t[0].transpose(0, 1) for t in (query, key, value)]  # [N, heads, d]
    kernel = None if query.requires_grad else varlen_kernel(query)  # SDPA has a backward on every torch
    if kernel is not None:
        cu, longest = packed.cu_seqlens, packed.max_length
        # torch 2.9's varlen_attn has no scale argument: pass it only where it is not the default 1/sqrt(d)
        scale = {} if scaling is None or math.isclose(scaling, query.shape[-1] ** -0.5) else {"scale": scaling}
        return kernel(*flat, cu, cu, longest, longest, **scale).unsqueeze(0), None
    rows, width = packed.shape
    heads, size = flat[0].shape[1:]

    def padded(t: torch.Tensor) -> torch.Tensor:  # [N, heads, d] -> [B, heads, T, d]
        grid = t.new_zeros(rows * width, heads, size).index_copy_(0, packed.indices, t)
        return grid.view(rows, width, heads, size).transpose(1, 2)

    out = F.scaled_dot_product_attention(*map(padded, flat), attn_mask=packed.key_mask, scale=scaling)
    out = out.transpose(1, 2).reshape(rows * width, heads, size).index_select(0, packed.indices)
    return out.unsqueeze(0), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The mask an unpadded model builds: none (:class:`Packing` delimits the pairs)."""
    return None


AttentionInterface.register(ATTENTION, unpadded_attention)
AttentionMaskInterface.register(ATTENTION, _no_mask)


class Unpadder:
    """Runs ``model``'s encoder on its batches' real tokens (the model is changed in place: its attention becomes
    :data:`ATTENTION`, and every forward must run inside :meth:`batch`).

    Raises:
        InputError: the model is not a BERT encoder (:data:`MODEL_TYPES`).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        model_type = getattr(model.config, "model_type", None)
        if model_type not in MODEL_TYPES:
            raise InputError(f"unpad: runs BERT encoders ({', '.join(MODEL_TYPES)}), not {model_type!r}")
        self.model = model
        self.current: Packing | None = None
        model.base_model.set_attn_implementation(ATTENTION)
        encoder = model.base_model.encoder
        encoder.register_forward_pre_hook(self._pack, with_kwargs=True)
        encoder.register_forward_hook(self._unpack)

    def kernel_name(self) -> str:
        """The kernel the model's attention runs on in inference: ``varlen_attn`` or ``sdpa (re-padded)`` (where
        gradients flow, always the latter)."""
        probe = next(self.model.parameters())
        return "varlen_attn" if varlen_kernel(probe) is not None else "sdpa (re-padded)"

    @contextmanager
    def batch(self, packed: Packing) -> Iterator[Packing]:
        """A context for the forward (and backward) of the padded batch that ``packed`` describes."""
        self.current = packed
        try:
            yield packed
        finally:
            self.current = None

    def _pack(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """``[B, T, H]`` hidden states -> ``[1, N, H]``, and the packing for every layer's attention."""
        packed = self.current
        if packed is None:
            raise RuntimeError("an unpadded model runs inside Unpadder.batch(attention_mask)")
        hidden = args[0]
        flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, packed.indices).unsqueeze(0)
        return (flat, *args[1:]), {**kwargs, "attention_mask": None, PACKING: packed}

    def _unpack(self, module: torch.nn.Module, args: tuple, output: Any) -> Any:
        """The encoder's ``[1, N, H]`` output -> ``[B, T, H]``, zeros at the pads."""
        packed = self.current
        hidden = output.last_hidden_state[0]
        rows, width = packed.shape
        grid = hidden.new_zeros(rows * width, hidden.shape[-1]).index_copy_(0, packed.indices, hidden)
        output.last_hidden_state = grid.view(rows, width, -1)
        return output
