"""Summed token log-probabilities under a causal LM, batched by a token budget.

The scorer runs the transformer body once per batch and applies the LM head only at the
positions that predict target tokens, a chunk of rows at a time: the full-vocabulary
log-softmax of a whole batch is never held in memory (128k vocabularies included).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from distill.core.batching import token_budget_batches


@dataclass(frozen=True)
class ScoringSequence:
    """Score ``target`` given ``prefix``: sum over target tokens of log p(token | all before it)."""

    prefix: list[int]
    """Context token ids; the first one is the start token, so the first target has a context."""
    target: list[int]
    """Token ids whose log-probabilities are summed."""

    def __len__(self) -> int:
        return len(self.prefix) + len(self.target)


def target_logprobs(
    hidden: torch.Tensor,
    head: nn.Module,
    targets: torch.Tensor,
    chunk_rows: int,
    softcap: float | None = None,
) -> torch.Tensor:
    """log p(target) at each row, computing the vocabulary logits ``chunk_rows`` rows at a time.

    Args:
        hidden: ``[N, d]`` final hidden states at the positions that predict ``targets``.
        head: the LM head, ``[N, d] -> [N, V]`` logits.
        targets: ``[N]`` token ids.
        chunk_rows: rows per chunk; memory is ``chunk_rows * V`` fp32 values at most.
        softcap: the model's final logit soft-capping (Gemma 2), if any.

    Returns:
        ``[N]`` fp32 log-probabilities (natural log).
    """
    out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        logits = head(hidden[rows]).float()
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        picked = logits.gather(1, targets[rows, None]).squeeze(1)
        out[rows] = picked - torch.logsumexp(logits, dim=-1)
    return out


class CausalLMScorer:
    """Scores :class:`ScoringSequence` s with a Hugging Face causal LM.

    Args:
        model: a ``*ForCausalLM`` model (its ``base_model`` gives hidden states, its output
            embeddings the LM head), already on its device(s) and in eval mode.
        max_batch_tokens: padded tokens per forward pass (batch size x longest sequence).
        logit_chunk_rows: target positions per LM-head chunk.
        pad_token_id: any valid id; padded positions are masked out.
    """

    def __init__(
        self,
        model: nn.Module,
        max_batch_tokens: int = 8192,
        logit_chunk_rows: int = 1024,
        pad_token_id: int = 0,
    ) -> None:
        self.model = model
        self.body = model.base_model
        self.head = model.get_output_embeddings()
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.max_batch_tokens = max_batch_tokens
        self.logit_chunk_rows = logit_chunk_rows
        self.pad_token_id = pad_token_id

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def logprobs(
        self, sequences: Sequence[ScoringSequence], on_batch: Callable[[int], None] | None = None
    ) -> np.ndarray:
        """Summed target log-probabilities, ``[len(sequences)]`` float64 in input order.

        ``on_batch(n)`` is called after each forward pass with the number of sequences it scored.
        """
        for i, seq in enumerate(sequences):
            if not seq.prefix or not seq.target:
                raise ValueError(f"sequence {i}: prefix and target must both be non-empty")
        result = np.empty(len(sequences), dtype=np.float64)
        for batch in token_budget_batches([len(s) for s in sequences], self.max_batch_tokens):
            result[batch] = self._score_batch([sequences[i] for i in batch])
            if on_batch is not None:
                on_batch(len(batch))
        return result

    def _score_batch(self, batch: list[ScoringSequence]) -> np.ndarray:
        width = max(len(s) for s in batch)
        input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        rows, positions, targets = [], [], []
        for b, seq in enumerate(batch):
            ids = seq.prefix + seq.target
            input_ids[b, : len(ids)] = torch.tensor(ids)
            attention_mask[b, : len(ids)] = 1
            start = len(seq.prefix)
            # The hidden state at position t predicts token t + 1.
            positions.extend(range(start - 1, len(ids) - 1))
            rows.extend([b] * len(seq.target))
            targets.extend(seq.target)
        device = self.device
        hidden = self.body(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), use_cache=False
        ).last_hidden_state
        picked = hidden[torch.tensor(rows, device=hidden.device), torch.tensor(positions, device=hidden.device)]
        head_device = self.head.weight.device
        token_logprobs = target_logprobs(
            picked.to(head_device),
            self.head,
            torch.tensor(targets, device=head_device),
            self.logit_chunk_rows,
            self.softcap,
        )
        sums = torch.zeros(len(batch), dtype=torch.float64)
        sums.index_add_(0, torch.tensor(rows), token_logprobs.double().cpu())
        return sums.numpy()
