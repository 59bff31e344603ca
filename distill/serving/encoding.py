"""Cross-encoder inputs: (query, passage) pairs to padded id arrays, as the student was trained on them.

Pairs are encoded once without padding (``[CLS] Q [SEP] K [SEP]``, the passage truncated to the max
length, as in training), then padded batch by batch. Every backend (PyTorch, ONNX, TorchScript) reads
the same int64 arrays.

A reranking call pairs one query with many passages, so a fast tokenizer's Rust backend encodes each distinct
query once and each passage once, and the tokenizer's own post-processor joins them: the ids are those of
``tokenizer(query, passage, truncation="only_second")``, without encoding every passage twice or Python padding.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distill.core.files import read_json_object

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
    name = read_json_object(config).get("tokenizer_class") if config.is_file() else None
    tokenizer_class = getattr(transformers, name, None) if name else None
    return (tokenizer_class or transformers.AutoTokenizer).from_pretrained(folder)


def model_max_length(folder: str | Path, tokenizer: Any) -> int:
    """The longest sequence the student in ``folder`` takes, in tokens: the tokenizer's limit, capped by the
    position embeddings of its ``config.json``."""
    config = read_json_object(Path(folder) / "config.json")
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
    backend = _plain_backend(tokenizer)
    if backend is None:  # a slow tokenizer: the same ids, from its Python code
        query_ids = tokenizer(list(queries), add_special_tokens=False, verbose=False)["input_ids"]
        passage_ids = tokenizer(list(passages), add_special_tokens=False, verbose=False)["input_ids"]
        lengths = [(len(q), len(p)) for q, p in zip(query_ids, passage_ids, strict=True)]
        fits = [len(q) + special < max_length for q in query_ids]
        features: list[dict[str, list[int]] | None] = [None] * len(queries)
        _encode_with_python(tokenizer, queries, passages, max_length, [i for i, f in enumerate(fits) if f], features)
    else:
        distinct = list(dict.fromkeys(queries))
        by_query = dict(zip(distinct, backend.encode_batch(distinct, add_special_tokens=False), strict=True))
        encoded = backend.encode_batch(list(passages), add_special_tokens=False)
        lengths = [(len(by_query[q]), len(p)) for q, p in zip(queries, encoded, strict=True)]
        features = [None] * len(queries)
        for i, (query, passage) in enumerate(zip(queries, encoded, strict=True)):
            room = max_length - special - len(by_query[query])
            if room < 1:
                continue
            if len(passage) > room:
                passage.truncate(room, direction=tokenizer.truncation_side)
            pair = backend.post_process(by_query[query], passage, add_special_tokens=True)
            row = {"input_ids": pair.ids, "attention_mask": pair.attention_mask, "token_type_ids": pair.type_ids}
            features[i] = {name: row[name] for name in names}
    long_queries = [i for i, f in enumerate(features) if f is None]
    _encode_with_python(tokenizer, queries, passages, max_length, long_queries, features, "longest_first")
    truncated = sum(q + p + special > max_length for q, p in lengths)
    return Encoded(features, truncated)  # type: ignore[arg-type]  (every row is set)


_PLAIN_BACKENDS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _plain_backend(tokenizer: Any) -> Any | None:
    """A copy of a fast tokenizer's Rust tokenizer without truncation or padding (cached per tokenizer); None for a
    slow tokenizer."""
    if not getattr(tokenizer, "is_fast", False):
        return None
    if tokenizer not in _PLAIN_BACKENDS:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        backend.no_truncation()
        backend.no_padding()
        _PLAIN_BACKENDS[tokenizer] = backend
    return _PLAIN_BACKENDS[tokenizer]


def _encode_with_python(
    tokenizer: Any,
    queries: Sequence[str],
    passages: Sequence[str],
    max_length: int,
    rows: list[int],
    features: list[dict[str, list[int]] | None],
    truncation: str = "only_second",
) -> None:
    """Set ``features[i]`` for each of ``rows`` with the tokenizer's own pair encoding, truncated by ``truncation``."""
    if not rows:
        return
    encoded = tokenizer(
        [queries[i] for i in rows], [passages[i] for i in rows], truncation=truncation, max_length=max_length
    )
    for j, i in enumerate(rows):
        features[i] = {name: encoded[name][j] for name in input_names(tokenizer)}


def pad_batch(tokenizer: Any, features: Sequence[dict[str, list[int]]], length: int | None = None) -> Batch:
    """Pad ``features`` to their longest (or to ``length``, if longer), on the tokenizer's padding side: int64
    arrays ``[len(features), longest]`` (``tokenizer.pad``'s values: the pad token, attention mask 0, the pad
    token type)."""
    longest = max(length or 0, *(len(f["input_ids"]) for f in features))
    fill = {"input_ids": tokenizer.pad_token_id, "attention_mask": 0, "token_type_ids": tokenizer.pad_token_type_id}
    left = tokenizer.padding_side == "left"
    batch = {}
    for name in features[0]:
        array = np.full((len(features), longest), fill[name], dtype=np.int64)
        for row, feature in enumerate(features):
            values = feature[name]
            if left:
                array[row, longest - len(values) :] = values
            else:
                array[row, : len(values)] = values
        batch[name] = array
    return batch
