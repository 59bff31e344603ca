"""How many tokens a sequence of an encoder can have: its position embeddings, less those that its position ids skip."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PADDING_OFFSET_TYPES = (
    "camembert",
    "data2vec-text",
    "ibert",
    "longformer",
    "luke",
    "mpnet",
    "roberta",
    "roberta-prelayernorm",
    "xlm-roberta",
    "xlm-roberta-xl",
    "xmod",
)
"""Model types (``config.json``'s ``model_type``) whose position ids start past the padding id, at
``pad_token_id + 1`` (RoBERTa's family, MPNet): their first ``pad_token_id + 1`` position embeddings hold no token."""


def usable_positions(config: Mapping[str, Any]) -> int | None:
    """The most tokens a sequence of the model of ``config`` (its ``config.json``'s values) can have: its
    ``max_position_embeddings``, less the positions its ids skip (:data:`PADDING_OFFSET_TYPES`: 514 embeddings hold
    512 tokens); None where the config names no such limit."""
    positions = config.get("max_position_embeddings")
    if not isinstance(positions, int):
        return None
    if config.get("model_type") in PADDING_OFFSET_TYPES:
        positions -= int(config.get("pad_token_id") or 0) + 1
    return positions
