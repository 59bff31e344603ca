"""CUDA graphs of the unpadded encoder: a batch is scored by replaying a graph captured once for its shape.

An eager bert-large forward launches its kernels one by one from Python, a fixed cost per call whatever the call's
size, which dominates small batches on a fast GPU (the docs' GPU results pages measure it). A CUDA graph launches them
all at once, but replays fixed shapes and fixed buffers. So a packed batch of ``B`` pairs and ``N`` tokens, the
longest ``L``, is padded up to a :class:`Shape` (:func:`static_shape`, :func:`pad_to`), of which there are few:

- tokens: ``N`` rounded up to the next of a geometric series from :data:`MIN_TOKENS`, :data:`TOKEN_STEPS` steps an
  octave, each a multiple of :data:`TOKEN_MULTIPLE` (at most about 19% more tokens);
- width: where the variable-length kernel runs (fp16 or bf16 on CUDA), the model's longest sequence, always: the
  width is only that kernel's bound on a pair's length there. Elsewhere (the re-padded attention, whose rows are the
  width) ``L`` rounded up to a multiple of :data:`WIDTH_MULTIPLE`, at most the model's longest sequence;
- pairs: ``B`` and the dummy pairs that hold the extra tokens (pad ids, type 0, each at most ``width`` long),
  rounded up to a power of two, at least :func:`fewest_slots` of the token bucket; the slots beyond are empty pairs.

The dummy and empty pairs' scores are dropped. With the width fixed, a token budget's shapes are few enough to
capture them all before the first request (:func:`warm_shapes`, :meth:`CudaGraphs.warm_up`), so that no request waits
on a capture; batching joins requests into batches of many sizes, and each new shape captured on a request's path
cost that request three eager calls and the capture. The bucketing and the padding are numpy and run anywhere (a
CPU scores a padded batch eagerly, as the tests do); :class:`CudaGraphs` captures and replays on CUDA only.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np
import torch

from distill.core.batching import round_up
from distill.model.unpadding import PackedEncoder, packed_inputs
from distill.serving.encoding import Packed

MIN_TOKENS = 512
"""The smallest token bucket."""
TOKEN_STEPS = 4
"""Token buckets per doubling: a batch computes at most ``2 ** (1 / 4)``, about 1.19 times its tokens."""
TOKEN_MULTIPLE = 64
"""Every token bucket is a multiple of this."""
WIDTH_MULTIPLE = 64
"""The longest pair is rounded up to a multiple of this."""
MIN_PAIRS = 8
"""The fewest pair slots (then 16, 32, ...)."""
PAIR_TOKENS = 64
"""A token bucket of ``N`` tokens has at least ``N / PAIR_TOKENS`` pair slots (:func:`fewest_slots`): every batch
whose pairs average at least this many tokens takes its bucket's fewest."""
WARM_SLOTS = 4
"""The pair slots warmed per token bucket (:func:`warm_shapes`): the fewest and 2, 4 and 8 times as many, which hold
batches whose pairs average at least ``PAIR_TOKENS / 8`` tokens. Shorter pairs' shapes are captured on first use."""
WARMUP_CALLS = 3
"""Eager calls on a side stream before a shape's capture (as PyTorch's CUDA graph docs do): lazy initialisation,
cuBLAS workspaces and any ``torch.compile`` happen there, not in the graph."""


@dataclass(frozen=True)
class Shape:
    """The static shape of a packed batch, one CUDA graph each."""

    tokens: int
    """``N``: the packed tokens, real and dummy."""
    pairs: int
    """``S``: the pair slots, real, dummy and empty."""
    width: int
    """At least every pair's length."""


def token_bucket(tokens: int) -> int:
    """The smallest token bucket that holds ``tokens``: ``MIN_TOKENS · 2 ** (k / TOKEN_STEPS)`` rounded up to a
    multiple of :data:`TOKEN_MULTIPLE`, for the least ``k >= 0``."""
    step = 0
    while (size := round_up(math.ceil(MIN_TOKENS * 2 ** (step / TOKEN_STEPS)), TOKEN_MULTIPLE)) < tokens:
        step += 1
    return size


def fewest_slots(tokens: int) -> int:
    """The fewest pair slots of a token bucket of ``tokens``: a power of two, at least :data:`MIN_PAIRS` and
    ``tokens / PAIR_TOKENS``."""
    return max(MIN_PAIRS, 1 << (-(-tokens // PAIR_TOKENS) - 1).bit_length())


def static_shape(lengths: np.ndarray, longest: int, fixed_width: bool = False) -> Shape:
    """The :class:`Shape` a batch of pairs of ``lengths`` ``[B]`` tokens is padded to, for a model whose longest
    sequence is ``longest`` tokens; with ``fixed_width`` (the variable-length kernel), every shape's width is
    ``longest``.

    Raises:
        ValueError: a pair is longer than ``longest``, or there is none.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if not len(lengths) or lengths.max() > longest:
        raise ValueError(f"a static shape holds 1 or more pairs of at most {longest} tokens, not {lengths.tolist()}")
    total = int(lengths.sum())
    width = longest if fixed_width else min(round_up(int(lengths.max()), WIDTH_MULTIPLE), longest)
    tokens = token_bucket(total)
    dummies = -(-(tokens - total) // width)
    return Shape(tokens, max(fewest_slots(tokens), 1 << (len(lengths) + dummies - 1).bit_length()), width)


def warm_shapes(max_tokens: int, longest: int) -> list[Shape]:
    """The fixed-width shapes (width ``longest``) that :meth:`CudaGraphs.warm_up` captures for batches of at most
    ``max_tokens`` tokens: each token bucket up to ``max_tokens``'s with :data:`WARM_SLOTS` pair slot counts."""
    buckets = [MIN_TOKENS]
    while buckets[-1] < token_bucket(max_tokens):
        buckets.append(token_bucket(buckets[-1] + 1))
    return [Shape(tokens, fewest_slots(tokens) << k, longest) for tokens in buckets for k in range(WARM_SLOTS)]


def pad_to(packed: Packed, shape: Shape, pad_id: int) -> Packed:
    """``packed`` with :attr:`Shape.tokens` tokens in :attr:`Shape.pairs` pairs: its pairs first, then dummy pairs of
    ``pad_id`` tokens (type 0) of ``shape.width`` tokens each and one of the rest, then empty pairs."""
    extra = shape.tokens - int(packed.lengths.sum())
    dummies = [shape.width] * (extra // shape.width) + ([extra % shape.width] if extra % shape.width else [])
    empty = shape.pairs - len(packed.lengths) - len(dummies)
    if extra < 0 or empty < 0:
        raise ValueError(f"{len(packed.lengths)} pairs of {packed.lengths.sum()} tokens do not fit {shape}")
    return Packed(
        np.concatenate([packed.input_ids, np.full(extra, pad_id, np.int64)]),
        np.concatenate([packed.token_type_ids, np.zeros(extra, np.int64)]),
        np.concatenate([packed.lengths, np.asarray(dummies, np.int64), np.zeros(empty, np.int64)]),
    )


@dataclass
class _Graph:
    """A captured graph and the static buffers it reads and writes."""

    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor
    cu_seqlens: torch.Tensor
    scores: torch.Tensor


class CudaGraphs:
    """Scores :class:`~distill.serving.encoding.Packed` batches by replaying CUDA graphs of ``encoder``, one per
    :class:`Shape`, each captured on the first batch of its shape (after :data:`WARMUP_CALLS` eager calls on a side
    stream).

    The graphs share one memory pool: they run one after another on the stream, and each one's scores are copied
    to the host (queued on the stream) before the next replay. One call at a time queues its copies and replay (a
    lock), as the static buffers are shared by every caller.

    Args:
        encoder: the packed model, on ``device``.
        longest: the model's longest sequence in tokens (its position embeddings).
        pad_id: the dummy pairs' token id.
        fixed_width: every shape's width is ``longest`` (where the encoder's attention is the variable-length
            kernel), and :meth:`warm_up` captures a budget's shapes ahead.
    """

    def __init__(
        self, encoder: PackedEncoder, device: torch.device, longest: int, pad_id: int, fixed_width: bool = False
    ) -> None:
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs run on a CUDA device, not {device}")
        self.encoder = encoder
        self.device = device
        self.longest = longest
        self.pad_id = pad_id
        self.fixed_width = fixed_width
        self.graphs: dict[Shape, _Graph] = {}
        self.pool: tuple[int, int] | None = None
        self.lock = threading.Lock()

    def launch(self, packed: Packed, begin: torch.cuda.Event | None = None) -> torch.Tensor:
        """Queue the replay for ``packed``'s pairs on the current stream, and the copy of their ``[pairs]`` scores
        into pinned host memory, which this returns: it holds them once the stream has run that far (an event
        recorded after this call, or a synchronisation). ``begin`` is recorded on the stream before the batch's
        copies to the device (its padding and bucketing, on the host, done). The next replay of the same graph
        overwrites its buffers only after, as the stream orders it. The capture records the kernels chosen in the
        calling context: call it in the one the eager forward runs in (inference mode, attention kernels, matmul
        precision)."""
        shape = static_shape(packed.lengths, self.longest, self.fixed_width)
        padded = pad_to(packed, shape, self.pad_id)
        tokens, cu_seqlens, _ = packed_inputs(padded.input_ids, padded.token_type_ids, padded.lengths, shape.width)
        with self.lock:
            if begin is not None:
                begin.record()
            graph = self.graphs.get(shape)
            if graph is None:
                graph = self.graphs[shape] = self._capture(tokens, cu_seqlens, shape.width)
            else:
                graph.tokens.copy_(tokens.pin_memory(), non_blocking=True)
                graph.cu_seqlens.copy_(cu_seqlens.pin_memory(), non_blocking=True)
            graph.graph.replay()
            return graph.scores[: len(packed.lengths)].to("cpu", non_blocking=True)

    def warm_up(self, max_tokens: int) -> int:
        """Capture each of :func:`warm_shapes` for batches of at most ``max_tokens`` tokens not captured yet (with the
        width fixed; else none: the widths would multiply the shapes), on dummy pairs; how many. Call it in the
        context the calls run in, as :meth:`__call__`."""
        if not self.fixed_width:
            return 0
        empty = Packed(*np.zeros((3, 0), np.int64))
        captured = 0
        for shape in warm_shapes(max_tokens, self.longest):
            filled = pad_to(empty, shape, self.pad_id)
            tokens, cu_seqlens, _ = packed_inputs(filled.input_ids, filled.token_type_ids, filled.lengths, shape.width)
            with self.lock:
                if shape not in self.graphs:
                    self.graphs[shape] = self._capture(tokens, cu_seqlens, shape.width)
                    captured += 1
        return captured

    def _capture(self, tokens: torch.Tensor, cu_seqlens: torch.Tensor, width: int) -> _Graph:
        """The graph of one forward over static copies of ``tokens`` and ``cu_seqlens`` (which hold this batch)."""
        static_tokens, static_cu = tokens.to(self.device), cu_seqlens.to(self.device)
        side, current = torch.cuda.Stream(self.device), torch.cuda.current_stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self.encoder(static_tokens, static_cu, width)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            scores = self.encoder(static_tokens, static_cu, width)
        self.pool = self.pool or graph.pool()
        return _Graph(graph, static_tokens, static_cu, scores)
