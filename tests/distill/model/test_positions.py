"""The tokens a sequence of an encoder can have (distill/model/positions.py)."""

from __future__ import annotations

from distill.model.positions import usable_positions


def test_roberta_and_mpnet_positions_start_past_the_padding_id() -> None:
    assert usable_positions({"model_type": "bert", "max_position_embeddings": 512}) == 512
    assert usable_positions({"model_type": "roberta", "max_position_embeddings": 514, "pad_token_id": 1}) == 512
    assert usable_positions({"model_type": "xlm-roberta", "max_position_embeddings": 514, "pad_token_id": 1}) == 512
    assert usable_positions({"model_type": "mpnet", "max_position_embeddings": 514, "pad_token_id": 1}) == 512
    assert usable_positions({"model_type": "roberta", "max_position_embeddings": 66, "pad_token_id": 3}) == 62
    assert usable_positions({"model_type": "llama"}) is None
