"""Long passages encoded from a prefix: a passage of many thousand tokens is cut to the pair's length anyway, so
encoding all of it (seconds for a few megabytes of text) is wasted, and holds up the requests behind it.

A passage longer than :data:`CHARS_PER_TOKEN` characters per token of the pair's length is cut at the first space
past that many characters, and only that prefix is encoded. Where the tokenizer splits words at spaces and
normalises text character by character (:func:`splits_at_spaces`), the prefix's tokens are the first tokens of the
whole passage's, so the tokens a pair keeps are the same. A prefix that gives fewer than the pair's room plus
:data:`MARGIN` tokens (text with few tokens per character: runs of spaces, combining marks) is encoded whole instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

CHARS_PER_TOKEN = 16
"""Characters of a passage per token of the pair's length past which it is encoded from a prefix: MS MARCO's
passages run at about 4.5 characters a token, so passages that fit a pair are never cut."""

MARGIN = 8
"""Tokens past the pair's room that a prefix must give for its encoding to stand for the whole passage's."""

WORD_SPLITTING = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}
"""Pre-tokenizers that split at every space; ``Metaspace`` does where its ``split`` is on, ``ByteLevel`` where its
regex is."""

LATER_STEPS = WORD_SPLITTING | {"ByteLevel", "Metaspace", "Punctuation", "Digits", "UnicodeScripts", "Split"}
"""Pre-tokenizers that, after one that splits at spaces in a ``Sequence``, only split its pieces further or map
their characters."""

LOCAL_NORMALIZERS = {
    "BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents", "Strip", "Precompiled", "Prepend"
}  # fmt: skip
"""Normalizers that change text character by character, so that a space stays a word boundary."""


def splits_at_spaces(backend: Any) -> bool:
    """Whether the Rust tokenizer ``backend`` ends a word at every space and normalises text character by character
    (its JSON's ``pre_tokenizer`` and ``normalizer``, nested ``Sequence`` s read through): then a prefix cut at a
    space encodes to the first tokens of the whole text."""
    spec = json.loads(backend.to_str())
    return _splits(spec.get("pre_tokenizer")) and _local(spec.get("normalizer"))


def _splits(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return False
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        first, *later = pre_tokenizer.get("pretokenizers") or [None]
        return _splits(first) and all(step.get("type") in LATER_STEPS for step in later)
    if kind == "ByteLevel":
        return bool(pre_tokenizer.get("use_regex", True))
    if kind == "Metaspace":
        return bool(pre_tokenizer.get("split", True))
    return kind in WORD_SPLITTING


def _local(normalizer: dict | None) -> bool:
    if normalizer is None:
        return True
    if normalizer.get("type") == "Sequence":
        return all(_local(step) for step in normalizer.get("normalizers", []))
    return normalizer.get("type") in LOCAL_NORMALIZERS


def prefixes(passages: Sequence[str], max_length: int) -> tuple[Sequence[str], list[int]]:
    """``passages`` with each one over ``CHARS_PER_TOKEN * max_length`` characters cut before the first space past
    that many; and the indices of those cut (``passages`` itself where none is)."""
    limit = CHARS_PER_TOKEN * max_length
    cut: list[int] = []
    texts: list[str] | None = None
    for i, text in enumerate(passages):
        if len(text) <= limit or (space := text.find(" ", limit)) < 0:
            continue
        if texts is None:
            texts = list(passages)
        texts[i] = text[:space]
        cut.append(i)
    return (passages if texts is None else texts), cut
