"""Pair encoding: the fast path (each distinct query and each passage encoded once by the Rust tokenizer, joined
by its post-processor) gives exactly the tokenizer's own pair encoding, and the numpy padding ``tokenizer.pad``'s."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from distill.core.loaders import load_candidates
from distill.serving.encoding import encode_pairs, pad_batch

from .conftest import DL19


@pytest.fixture(scope="module")
def tokenizer(tiny_bert):
    return AutoTokenizer.from_pretrained(tiny_bert)


def reference(tokenizer, queries: list[str], passages: list[str], max_length: int) -> tuple[list[dict], int]:
    """``tokenizer(query, passage)`` pair by pair: only_second, else longest_first; and the truncated count."""
    features, truncated = [], 0
    special = tokenizer.num_special_tokens_to_add(pair=True)
    for query, passage in zip(queries, passages, strict=True):
        q, p = (len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in (query, passage))
        strategy = "only_second" if q + special < max_length else "longest_first"
        encoded = tokenizer(query, passage, truncation=strategy, max_length=max_length)
        features.append({k: encoded[k] for k in ("input_ids", "attention_mask", "token_type_ids")})
        truncated += q + p + special > max_length
    return features, truncated


@pytest.mark.parametrize("max_length", [512, 64, 8])
def test_fast_pair_encoding_is_the_tokenizers_own(tokenizer, max_length: int) -> None:
    lists = load_candidates(DL19).candidates[:3]
    queries = [c.query.text for c in lists for _ in c.passages[:30]] + ["word " * 300, "rhino"]
    passages = [p.text for c in lists for p in c.passages[:30]] + ["a passage", "horn " * 600]
    encoded = encode_pairs(tokenizer, queries, passages, max_length)
    features, truncated = reference(tokenizer, queries, passages, max_length)
    assert encoded.features == features and encoded.truncated == truncated > 0
    assert max(encoded.lengths) == max_length


def test_slow_tokenizers_take_the_python_path(tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    queries, passages = ["a query", "word " * 100], ["a passage " * 50, "short"]
    fast = encode_pairs(tokenizer, queries, passages, 40)
    monkeypatch.setattr(type(tokenizer), "is_fast", property(lambda self: False))
    assert encode_pairs(tokenizer, queries, passages, 40) == fast


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_is_tokenizer_pad(tokenizer, side: str) -> None:
    tokenizer.padding_side = side
    try:
        features = encode_pairs(tokenizer, ["a query"] * 3, ["one", "two words here", "three " * 9], 512).features
        theirs = tokenizer.pad(features, padding="longest", return_tensors="np")
        ours = pad_batch(tokenizer, features)
    finally:
        tokenizer.padding_side = "right"
    assert list(ours) == ["input_ids", "attention_mask", "token_type_ids"]
    for name, array in ours.items():
        assert array.dtype == np.int64 and np.array_equal(array, theirs[name]), name
