"""Summed token log-probabilities under a causal LM, batched by a token budget.

The scorer runs the transformer body once per batch and applies the LM head only at the
positions that predict target tokens, a chunk of rows at a time: the full-vocabulary
log-softmax of a whole batch is never held in memory (128k vocabularies included).

Batches are laid out by :mod:`teachers.batch_plan` (padded rows, or packed ones) and run without waiting for
the device: inputs go over in pinned, non-blocking copies, the attention mask is built on the device, and
each sequence's sum stays there until the end of :meth:`CausalLMScorer.logprobs`, which copies all of them
to the host at once. The host thus lays out the next batch while the device runs the previous one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from distill.core.devices import attention_backends
from distill.core.schema import InputError
from teachers.batch_plan import PADDING_SEGMENT, BatchPlan, HostBatch, build_batch, plan_batches
from teachers.terms import LOGIT_CHUNK_ROWS


@dataclass(frozen=True)
class ScoringSequence:
    """Score ``target`` given ``prefix``: sum over target tokens of log p(token | all before it)."""

    prefix: list[int]
    """Context token ids; the first one is the start token, so the first target has a context."""
    target: list[int]
    """Token ids whose log-probabilities are summed."""

    def __len__(self) -> int:
        return len(self.prefix) + len(self.target)


LEVERS = ("bucket", "packing", "compile", "cudnn_attention")
"""The options that change how the scores are computed, not only how many pairs a pass holds."""


@dataclass
class ScorerOptions:
    """The scorer's batch budget and speed levers. None takes the device type's default (:meth:`for_device`,
    :data:`distill.core.devices.TEACHER_LEVERS`): the exact path on a CPU, whose scores are the fingerprint's
    reference (they still move with a batch's shape within rounding: see :mod:`teachers.batch_plan`); on CUDA,
    larger batches, 64-token buckets, packing and compile. ``bucket``, ``packing`` and ``compile`` change the scores
    within rounding, ``cudnn_attention`` too on CUDA."""

    max_batch_tokens: int | None = None
    """Padded tokens per forward pass (rows x width). Default the device's: 8192 on a CPU, 16384 on CUDA."""
    bucket: int | None = None
    """Pad each batch's width up to a multiple of this many tokens, so that batch shapes repeat (1: the longest
    sequence's width). With ``packing``, the rows' width: the longest sequence rounded up to it. Default the
    device's: 1 on a CPU, 64 on CUDA."""
    packing: bool | None = None
    """Pack several sequences in each row, back to back with no padding between them, each from position 0,
    behind a block-diagonal causal mask: fewer padded tokens. Default the device's: off on a CPU, on for CUDA."""
    compile: bool | None = None
    """``torch.compile`` each decoder layer and the LM head's log-softmax (:func:`row_logprobs`, then one fused
    pass over the logits instead of several over fp32 copies). Each compiles for the first batch shape, then once
    more for each dimension that changes (torch's automatic dynamic shapes), so at most three times; the first
    batches wait. Default the device's: off on a CPU, on for CUDA."""
    cudnn_attention: bool = False
    """On CUDA, let attention use cuDNN's SDPA kernels, which build a plan on the host for every new batch shape
    (off: flash, memory-efficient or math kernels). No effect on the CPU."""

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "bucket"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise InputError(f"{name} must be a positive number of tokens, got {getattr(self, name)}")

    def for_device(self, device: Any) -> ScorerOptions:
        """These options with each one not given (None) set to ``device``'s type's default."""
        from distill.core.devices import TEACHER_LEVERS, device_type

        defaults = TEACHER_LEVERS[device_type(device)]
        return ScorerOptions(**{
            f.name: defaults[f.name] if getattr(self, f.name) is None else getattr(self, f.name)
            for f in dataclasses.fields(ScorerOptions)
        })  # fmt: skip

    def changed(self) -> dict[str, Any]:
        """The levers (:data:`LEVERS`) of these options, resolved for a device (:meth:`for_device`), that differ
        from a CPU's exact path, by name."""
        exact = ScorerOptions().for_device("cpu")
        return {name: getattr(self, name) for name in LEVERS if getattr(self, name) != getattr(exact, name)}


def row_logprobs(logits: torch.Tensor, targets: torch.Tensor, softcap: float | None = None) -> torch.Tensor:
    """log p(target) at each row of ``[N, V]`` logits (any float dtype, read as fp32): ``[N]`` fp32 (natural log).

    Eager, it materialises the fp32 logits and several ``[N, V]`` temporaries; compiled (:class:`ScorerOptions`'
    ``compile``) it is one fused pass over the logits.
    """
    logits = logits.float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    picked = logits.gather(1, targets[:, None]).squeeze(1)
    return picked - torch.logsumexp(logits, dim=-1)


def target_logprobs(
    hidden: torch.Tensor,
    head: nn.Module,
    targets: torch.Tensor,
    chunk_rows: int,
    softcap: float | None = None,
    reduce: Callable[[torch.Tensor, torch.Tensor, float | None], torch.Tensor] = row_logprobs,
) -> torch.Tensor:
    """log p(target) at each row, computing the vocabulary logits ``chunk_rows`` rows at a time.

    Args:
        hidden: ``[N, d]`` final hidden states at the positions that predict ``targets``.
        head: the LM head, ``[N, d] -> [N, V]`` logits.
        targets: ``[N]`` token ids.
        chunk_rows: rows per chunk; memory is ``chunk_rows * V`` fp32 values at most.
        softcap: the model's final logit soft-capping (Gemma 2), if any.
        reduce: :func:`row_logprobs`, or a compiled copy of it.

    Returns:
        ``[N]`` fp32 log-probabilities (natural log).
    """
    out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        out[rows] = reduce(head(hidden[rows]), targets[rows], softcap)
    return out


def block_causal_mask(segments: torch.Tensor) -> torch.Tensor:
    """The attention mask of packed rows: ``[R, W]`` segment ids -> ``[R, 1, W, W]`` bool, true where query ``i``
    may see key ``j``: ``j <= i`` and both in the same segment."""
    width = segments.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=segments.device).tril_()
    return (segments[:, :, None] == segments[:, None, :]).logical_and_(causal)[:, None]


def sequence_sums(
    values: torch.Tensor, owners: torch.Tensor, columns: torch.Tensor, shape: tuple[int, int]
) -> torch.Tensor:
    """Each sequence's sum of its ``values``, added left to right in float64.

    Args:
        values: ``[N]`` per-token values.
        owners: ``[N]`` the sequence of each value, ``0..S-1``.
        columns: ``[N]`` the place of each value within its sequence (distinct within a sequence).
        shape: ``(S, T)``: sequences, and at least the longest sequence's count of values.

    Returns:
        ``[S]`` float64. The sums are the last column of a running sum over an ``[S, T]`` zero-padded grid: no
        atomics, so deterministic on every device, and on the CPU bit for bit the sequential ``0 + v0 + v1 + ...``.
    """
    grid = torch.zeros(shape, dtype=torch.float64, device=values.device)
    grid[owners, columns] = values.double()
    return grid.cumsum(1)[:, -1]


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on ``device``; to a GPU through pinned memory, without waiting for the copy."""
    tensor = torch.from_numpy(array)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def _sliding_window(config: Any) -> int | None:
    """The model's attention window in tokens, if it has one in use."""
    window = getattr(config, "sliding_window", None)
    return window if window and getattr(config, "use_sliding_window", True) else None


def _decoder_layers(body: nn.Module, lever: str) -> nn.ModuleList:
    layers = getattr(body, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise InputError(f"{lever}: {type(body).__name__} has no list of decoder layers (.layers)")
    return layers


class CausalLMScorer:
    """Scores :class:`ScoringSequence` s with a Hugging Face causal LM.

    Args:
        model: a ``*ForCausalLM`` model (its ``base_model`` gives hidden states, its output
            embeddings the LM head), already on its device(s) and in eval mode. ``options.compile``
            changes its decoder layers in place.
        logit_chunk_rows: target positions per LM-head chunk.
        pad_token_id: any valid id; padded positions are masked out.
        options: the batch budget and speed levers; each not given takes the model's device type's default.
    """

    def __init__(
        self,
        model: nn.Module,
        logit_chunk_rows: int = LOGIT_CHUNK_ROWS,
        pad_token_id: int = 0,
        options: ScorerOptions | None = None,
    ) -> None:
        self.model = model
        self.body = model.base_model
        self.head = model.get_output_embeddings()
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.sliding_window = _sliding_window(model.config)
        self.logit_chunk_rows = logit_chunk_rows
        self.pad_token_id = pad_token_id
        self.options = (options or ScorerOptions()).for_device(next(model.parameters()).device)
        self.reduce = row_logprobs
        if self.options.compile:
            for layer in _decoder_layers(self.body, "compile"):
                layer.compile()
            self.reduce = torch.compile(row_logprobs)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def context_tokens(self) -> int | None:
        """The longest sequence the model was trained on (``max_position_embeddings``); None where unknown."""
        return getattr(self.model.config, "max_position_embeddings", None)

    def plan(self, sequences: Sequence[ScoringSequence]) -> list[BatchPlan]:
        """The batches :meth:`logprobs` runs ``sequences`` in."""
        lengths = [len(s) for s in sequences]
        return plan_batches(lengths, self.max_batch_tokens, self.options.bucket, self.options.packing)

    @property
    def max_batch_tokens(self) -> int:
        """Padded tokens per forward pass."""
        return self.options.max_batch_tokens

    @torch.inference_mode()
    def logprobs(
        self, sequences: Sequence[ScoringSequence], on_batch: Callable[[int], None] | None = None
    ) -> np.ndarray:
        """Summed target log-probabilities, ``[len(sequences)]`` float64 in input order.

        ``on_batch(n)`` is called after each forward pass is queued, with the number of sequences it scores.

        Raises:
            ValueError: a sequence with an empty prefix or target, or longer than the model's context (its
                ``max_position_embeddings``): positions it was never trained on, scored without a word.
        """
        context = self.context_tokens
        for i, seq in enumerate(sequences):
            if not seq.prefix or not seq.target:
                raise ValueError(f"sequence {i}: prefix and target must both be non-empty")
            if context and len(seq) > context:
                raise ValueError(
                    f"sequence {i}: {len(seq)} tokens, past the teacher's context of {context} tokens (its prefix "
                    f"{len(seq.prefix)}, a query's prompt or a passage): shorten the query"
                )
        explicit_mask = self._explicit_mask(max((len(s) for s in sequences), default=0))
        head_device = self.head.weight.device
        result = torch.empty(len(sequences), dtype=torch.float64, device=head_device)
        with attention_backends(self.device, self.options.cudnn_attention):
            for plan, batch in self._batches(sequences):
                sums = self._score_batch(batch, explicit_mask)
                result[_to_device(np.asarray(plan.sequences), head_device)] = sums
                if on_batch is not None:
                    on_batch(len(plan.sequences))
        return result.cpu().numpy()

    def _batches(self, sequences: Sequence[ScoringSequence]) -> Iterator[tuple[BatchPlan, HostBatch]]:
        prefixes, targets = [s.prefix for s in sequences], [s.target for s in sequences]
        for plan in self.plan(sequences):
            yield plan, build_batch(plan, prefixes, targets, self.pad_token_id)

    def _explicit_mask(self, longest: int) -> bool:
        """Whether sequences of up to ``longest`` tokens get the scorer's own block-causal mask, which asks the
        device nothing. Not where a sequence outgrows the model's sliding window: the model then masks padded
        rows itself (it reads the mask on the host), and packed ones cannot be scored."""
        if self.sliding_window is None or longest <= self.sliding_window:
            return True
        if self.options.packing:
            raise InputError(
                f"packing: a sequence of {longest} tokens outgrows the model's sliding window of "
                f"{self.sliding_window} tokens; score without packing"
            )
        return False

    def _score_batch(self, batch: HostBatch, explicit_mask: bool) -> torch.Tensor:
        """``[S]`` float64 sums of the batch's sequences, on the LM head's device."""
        device = self.device
        segments = _to_device(batch.segments, device)
        mask = block_causal_mask(segments) if explicit_mask else (segments != PADDING_SEGMENT).long()
        hidden = self.body(
            input_ids=_to_device(batch.input_ids, device),
            attention_mask=mask,
            position_ids=_to_device(batch.position_ids, device),
            use_cache=False,
        ).last_hidden_state
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, _to_device(batch.picks, hidden.device))
        head_device = self.head.weight.device
        token_logprobs = target_logprobs(
            picked.to(head_device),
            self.head,
            _to_device(batch.targets, head_device),
            self.logit_chunk_rows,
            self.softcap,
            self.reduce,
        )
        owners, columns = _to_device(batch.owners, head_device), _to_device(batch.columns, head_device)
        return sequence_sums(token_logprobs, owners, columns, (batch.n_sequences, batch.longest_target))
