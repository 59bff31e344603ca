"""Sentence embeddings: mean-pooled, L2-normalised last hidden states of a transformers encoder, as
sentence-transformers' mean pooling computes them. Dense retrieval indexes them; the similarity teacher scores
(query, passage) pairs by their cosine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from distill.core.batching import token_budget_batches
from distill.model.resolver import ModelSource, load_pretrained, resolve_model

DEFAULT_ENCODER = "all-minilm-l6-v2"
DENSE_BATCH_TOKENS = 16384
"""Padded tokens per forward pass of the encoder unless told otherwise."""
TOKENIZE_CHUNK = 4096
"""Texts tokenized at a time while encoding a corpus, to bound the memory the token ids take."""


def max_length_of(source: ModelSource, model_max_length: int) -> int:
    """The longest input in tokens: a sentence-transformers folder's ``max_seq_length``, else the
    tokenizer's limit, at most 512."""
    config = Path(source.location) / "sentence_bert_config.json"
    if source.kind != "hub" and config.is_file():
        return int(json.loads(config.read_text())["max_seq_length"])
    return min(model_max_length, 512)


class Encoder:
    """Embeds texts as unit vectors of ``dim`` floats: the mean of the last hidden states over the
    text's tokens (truncated to ``max_length``), L2-normalised, as sentence-transformers' mean pooling does."""

    def __init__(
        self, name: str = DEFAULT_ENCODER, device: str = "cpu", max_batch_tokens: int = DENSE_BATCH_TOKENS
    ) -> None:
        """
        Args:
            name: the encoder, as :func:`distill.model.resolver.resolve_model` resolves it.
            device: ``cpu`` or ``cuda[:N]``.
            max_batch_tokens: padded tokens per forward pass.
        """
        import torch  # noqa: F401  (transformers' AutoModel needs it, and says so in a plain ImportError)
        from transformers import AutoModel, AutoTokenizer

        self.source = resolve_model(name)
        self.tokenizer = load_pretrained(self.source, AutoTokenizer)
        self.model = load_pretrained(self.source, AutoModel).to(device).eval()
        self.device = device
        self.max_batch_tokens = max_batch_tokens
        self.max_length = max_length_of(self.source, self.tokenizer.model_max_length)

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def settings(self) -> dict[str, Any]:
        """What the embeddings depend on, for the index key."""
        return {"method": "dense", "encoder": self.source.identity, "max_length": self.max_length, "pooling": "mean"}

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embeddings of ``texts``: float32, shape ``(len(texts), dim)``, each row of L2 norm 1."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), TOKENIZE_CHUNK):
            chunk = texts[start : start + TOKENIZE_CHUNK]
            ids = self.tokenizer(chunk, truncation=True, max_length=self.max_length)["input_ids"]
            for batch in token_budget_batches([len(x) for x in ids], self.max_batch_tokens):
                out[[start + i for i in batch]] = self._embed([ids[i] for i in batch])
        return out

    def _embed(self, ids: list[list[int]]) -> np.ndarray:
        """Embeddings of one batch of token id lists: float32, shape ``(len(ids), dim)``."""
        import torch

        inputs = self.tokenizer.pad({"input_ids": ids}, return_tensors="pt").to(self.device)
        with torch.inference_mode():
            hidden = self.model(**inputs).last_hidden_state  # (batch, tokens, dim)
            mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (batch, tokens, 1)
            mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
            return torch.nn.functional.normalize(mean, dim=-1).float().cpu().numpy()
