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

The packing is computed on the host, so nothing waits on the device: in the training collator from the rows'
lengths (:func:`lengths_packing`, numpy, without reading the padded attention mask) or a batch's attention mask
(:func:`host_packing`).

Serving needs no padded tensor at all: :class:`PackedEncoder` takes the pairs back to back (:func:`packed_inputs`:
ids, type ids and places ``[3, N]``, ``cu_seqlens``), runs the embeddings, the layers and the head on them, and
returns one score per pair. Its inputs are fixed-size tensors, so that a CUDA graph can replay it
(:mod:`distill.serving.cuda_graphs`).
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
from distill.model.segment_cosine import MODEL_TYPE as SEGMENT_COSINE
from distill.model.segment_cosine import BertForSegmentCosine

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


def unpaddable(model: torch.nn.Module) -> bool:
    """Whether ``model``'s encoder can run unpadded (a BERT encoder, :data:`MODEL_TYPES`, whose every layer attends
    across its pair: not a segment-cosine head with ``segment_layers``)."""
    config = model.config
    return getattr(config, "model_type", None) in MODEL_TYPES and not getattr(config, "segment_layers", 0)


def kernel_name(model: torch.nn.Module) -> str:
    """The kernel an unpadded ``model``'s attention runs on in inference: ``varlen_attn`` or ``sdpa (re-padded)``
    (where gradients flow, always the latter)."""
    probe = next(model.parameters())
    return "varlen_attn" if varlen_kernel(probe) is not None else "sdpa (re-padded)"


def take_over_attention(model: torch.nn.Module) -> None:
    """Make ``model``'s attention :data:`ATTENTION` (in place), which keeps each token within its pair of a packed row.

    Raises:
        InputError: the model is not a BERT encoder (:data:`MODEL_TYPES`).
    """
    if not unpaddable(model):
        model_type = getattr(model.config, "model_type", None)
        if getattr(model.config, "segment_layers", 0):
            raise InputError("unpad: a segment-cosine head with segment_layers (segments attending apart) runs padded")
        raise InputError(f"unpad: runs BERT encoders ({', '.join(MODEL_TYPES)}), not {model_type!r}")
    model.base_model.set_attn_implementation(ATTENTION)


class Unpadder:
    """Runs ``model``'s encoder on its batches' real tokens (the model is changed in place: its attention becomes
    :data:`ATTENTION`, and every forward must run inside :meth:`batch`).

    Raises:
        InputError: the model is not a BERT encoder (:data:`MODEL_TYPES`).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        take_over_attention(model)
        self.model = model
        self.current: Packing | None = None
        encoder = model.base_model.encoder
        encoder.register_forward_pre_hook(self._pack, with_kwargs=True)
        encoder.register_forward_hook(self._unpack)

    def kernel_name(self) -> str:
        """:func:`kernel_name` of the model."""
        return kernel_name(self.model)

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


def packed_inputs(
    input_ids: np.ndarray, token_type_ids: np.ndarray, lengths: np.ndarray, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """:class:`PackedEncoder`'s inputs of pairs back to back (host tensors, computed with numpy): ``tokens`` ``[3, N]``
    int64 (each token's id, type id and place ``pair · width + position``), ``cu_seqlens`` ``[pairs + 1]`` int32, and
    ``width``, at least the longest pair's length (default: that length)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    width = int(lengths.max(initial=1)) if width is None else width
    fields = lengths_packing(lengths, width)
    tokens = np.stack([np.asarray(input_ids), np.asarray(token_type_ids), fields["indices"].numpy()])
    return torch.from_numpy(tokens.astype(np.int64, copy=False)), fields["cu_seqlens"], width


class PackedEncoder(torch.nn.Module):
    """A BERT cross-encoder (:data:`MODEL_TYPES`, one label) that scores packed pairs: its embeddings, layers and head
    run on the pairs' tokens back to back, with no padded tensor in or out. The model is changed in place (its
    attention becomes :data:`ATTENTION`); inference only (no dropout is applied).

    Its inputs are two tensors and an int (:func:`packed_inputs`), so that the same call can be captured in a CUDA
    graph over static buffers (:mod:`distill.serving.cuda_graphs`): ``tokens`` ``[3, N]`` int64 (each token's id, type
    id and place ``pair · width + position``), ``cu_seqlens`` ``[S + 1]`` int32 (pair ``i``'s tokens are
    ``cu_seqlens[i] : cu_seqlens[i + 1]``; an empty pair's score is meaningless) and ``width``, at least the
    longest pair's length: the variable-length kernel's longest sequence, and the rows of the re-padded attention
    elsewhere (:func:`unpadded_attention`).

    The heads read what the padded model's read: the [CLS] head (``BertForSequenceClassification``: pooler, then
    classifier) each pair's first token; the segment-cosine head the means of each pair's type-0 and type-1 tokens,
    summed in fp32.

    Raises:
        InputError: the model is not a BERT encoder.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        take_over_attention(model)
        self.model = model

    def forward(self, tokens: torch.Tensor, cu_seqlens: torch.Tensor, width: int) -> torch.Tensor:
        """``[S]`` float32 scores of the ``S`` pairs that ``cu_seqlens`` delimits in ``tokens``."""
        ids, types, places = tokens
        pairs = cu_seqlens.shape[0] - 1
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        columns = torch.arange(width, device=tokens.device)
        packed = Packing(
            indices=places,
            cu_seqlens=cu_seqlens,
            key_mask=(columns < lengths[:, None])[:, None, None, :],
            max_length=width,
            shape=(pairs, width),
        )
        base = self.model.base_model
        hidden = base.embeddings(input_ids=ids[None], token_type_ids=types[None], position_ids=(places % width)[None])
        hidden = base.encoder(hidden, attention_mask=None, **{PACKING: packed}).last_hidden_state[0]  # [N, H]
        if isinstance(self.model, BertForSegmentCosine):
            return self._segment_cosine(hidden, types, places // width, pairs)
        first = cu_seqlens[:-1].long().clamp(max=hidden.shape[0] - 1)  # an empty pair at the end reads a neighbour
        pooled = base.pooler(hidden.index_select(0, first)[:, None])
        return self.model.classifier(pooled)[:, 0].float()

    def _segment_cosine(
        self, hidden: torch.Tensor, types: torch.Tensor, pair: torch.Tensor, pairs: int
    ) -> torch.Tensor:
        """``scale · cos(mean of type-0 tokens, mean of type-1 tokens) + bias`` per pair (:mod:`~distill.core.
        segment_cosine`), from the packed states ``[N, H]`` and each token's type and pair ``[N]``."""
        segment = pair * 2 + types
        sums = hidden.new_zeros(2 * pairs, hidden.shape[1], dtype=torch.float32).index_add_(0, segment, hidden.float())
        counts = sums.new_zeros(2 * pairs).index_add_(0, segment, sums.new_ones(segment.shape[0]))
        means = (sums / counts.clamp(min=1.0)[:, None]).view(pairs, 2, -1)
        cosine = F.cosine_similarity(means[:, 0], means[:, 1], dim=-1)
        return (self.model.scale.float() * cosine + self.model.bias.float()).float()
