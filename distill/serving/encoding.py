"""Cross-encoder inputs: (query, passage) pairs to padded id arrays, as the student was trained on them.

Pairs are encoded once without padding (``[CLS] Q [SEP] K [SEP]``, the passage truncated to the max
length, as in training), then padded batch by batch. Every backend (PyTorch, ONNX, TorchScript) reads
the same int64 arrays.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
"""The inputs a cross-encoder can take, in the order of the exported graphs' inputs."""

Batch = dict[str, np.ndarray]
"""Input name -> int64 array ``[batch, sequence]``."""


def input_names(tokenizer: Any) -> tuple[str, ...]:
    """The inputs the tokenizer gives, in :data:`INPUT_NAMES` order (no ``token_type_ids`` for RoBERTa and the like)."""
    return tuple(name for name in INPUT_NAMES if name in tokenizer.model_input_names)


def load_tokenizer(folder: str | Path) -> Any:
    """The tokenizer of a student folder, by the class its ``tokenizer_config.json`` names (that import needs no
    torch, where ``AutoTokenizer`` reads the model config, which imports it), else by ``AutoTokenizer``."""
    import transformers

    folder = Path(folder)
    config = folder / "tokenizer_config.json"
    name = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    tokenizer_class = getattr(transformers, name, None) if name else None
    return (tokenizer_class or transformers.AutoTokenizer).from_pretrained(folder)


def model_max_length(folder: str | Path, tokenizer: Any) -> int:
    """The longest sequence the student in ``folder`` takes, in tokens: the tokenizer's limit, capped by the
    position embeddings of its ``config.json``."""
    config = json.loads((Path(folder) / "config.json").read_text())
    return int(min(tokenizer.model_max_length, config.get("max_position_embeddings", tokenizer.model_max_length)))


@dataclass
class Encoded:
    """Pairs as unpadded token ids."""

    features: list[dict[str, list[int]]]
    """One dict per pair: input name -> ids (``len`` = the pair's length in tokens)."""
    truncated: int
    """How many pairs were longer than the max length and cut."""

    @property
    def lengths(self) -> list[int]:
        return [len(f["input_ids"]) for f in self.features]


def encode_pairs(tokenizer: Any, queries: Sequence[str], passages: Sequence[str], max_length: int) -> Encoded:
    """Token ids of each ``(queries[i], passages[i])`` pair, at most ``max_length`` tokens.

    The passage is truncated (``only_second``, as in training). A query too long to leave room for one
    passage token is truncated together with its passage (``longest_first``) instead of raising.
    """
    if len(queries) != len(passages):
        raise ValueError(f"{len(queries)} queries for {len(passages)} passages")
    names = input_names(tokenizer)
    special = tokenizer.num_special_tokens_to_add(pair=True)
    query_ids = tokenizer(list(queries), add_special_tokens=False, verbose=False)["input_ids"]
    passage_ids = tokenizer(list(passages), add_special_tokens=False, verbose=False)["input_ids"]
    fits = [len(q) + special < max_length for q in query_ids]
    features: list[dict[str, list[int]]] = [{} for _ in queries]
    for strategy, keep in (("only_second", True), ("longest_first", False)):
        rows = [i for i, f in enumerate(fits) if f == keep]
        if not rows:
            continue
        encoded = tokenizer(
            [queries[i] for i in rows], [passages[i] for i in rows], truncation=strategy, max_length=max_length
        )
        for j, i in enumerate(rows):
            features[i] = {name: encoded[name][j] for name in names}
    truncated = sum(len(q) + len(p) + special > max_length for q, p in zip(query_ids, passage_ids, strict=True))
    return Encoded(features, truncated)


def pad_batch(tokenizer: Any, features: Sequence[dict[str, list[int]]]) -> Batch:
    """Pad ``features`` to their longest: int64 arrays ``[len(features), longest]``."""
    padded = tokenizer.pad(list(features), padding="longest", return_tensors="np")
    return {name: np.asarray(padded[name], dtype=np.int64) for name in features[0]}
