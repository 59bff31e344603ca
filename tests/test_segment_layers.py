"""The segment-cosine head with ``segment_layers``: its first layers encode the query and the passage each on its
own, so that with every layer apart it is the backbone's bi-encoder similarity in one pass over the joint input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from distill.core.schema import InputError
from distill.core.segment_cosine import BertForSegmentCosine, BertSegmentCosineConfig, segment_positions
from distill.core.unpadding import PackedEncoder, unpaddable

QUERY = "what is the boiling point of water"
PASSAGES = ["Water boils at 100 degrees Celsius at sea level.", "The Eiffel Tower is in Paris, France."]


def head(tiny_bert: Path, segment_layers: int) -> BertForSegmentCosine:
    config = BertSegmentCosineConfig.from_pretrained(tiny_bert, segment_layers=segment_layers)
    return BertForSegmentCosine.from_pretrained(tiny_bert, config=config).eval()


def test_positions_start_again_for_the_passage() -> None:
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]])
    types = torch.tensor([[0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1]])
    positions = segment_positions(mask, types)
    assert positions[0, :6].tolist() == [0, 1, 2, 1, 2, 3]
    assert positions[1].tolist() == [0, 1, 2, 3, 1, 2, 3]


def test_every_layer_apart_is_the_bi_encoder_of_each_text_without_its_cls(tiny_bert: Path) -> None:
    """The passage's mean equals the bi-encoder's mean of ``[CLS] K [SEP]`` over K and [SEP], with the [CLS]
    attended to away: each segment sees itself alone, the passage's positions as after a [CLS]."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    model = head(tiny_bert, segment_layers=2)
    joint = tokenizer([QUERY] * 2, PASSAGES, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = model._segments_apart(joint["input_ids"], joint["attention_mask"], joint["token_type_ids"])
        query_alone = model.bert(**tokenizer([QUERY], return_tensors="pt"))[0][0]
    n_query = int((joint["token_type_ids"][0] == 0).sum() - (joint["attention_mask"][0] == 0).sum())
    torch.testing.assert_close(hidden[0, :n_query], query_alone, atol=1e-5, rtol=1e-4)  # [CLS] Q [SEP] as it is
    alone = tokenizer([PASSAGES[0]], return_tensors="pt")  # [CLS] K [SEP]
    alone["attention_mask"][0, 0] = 0  # with its [CLS] attended to by nothing
    with torch.inference_mode():
        passage_alone = model.bert(**alone)[0][0, 1:]
    n_passage = passage_alone.shape[0]
    assert joint["input_ids"][0, n_query : n_query + n_passage].tolist() == alone["input_ids"][0, 1:].tolist()
    torch.testing.assert_close(hidden[0, n_query : n_query + n_passage], passage_alone, atol=1e-5, rtol=1e-4)


def test_the_query_segment_ignores_the_passage_until_the_layers_across(tiny_bert: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    batch = tokenizer([QUERY] * 2, PASSAGES, padding=True, truncation=True, return_tensors="pt")
    n_query = int((batch["token_type_ids"][0] == 0).sum() - (batch["attention_mask"][0] == 0).sum())
    for layers, query_sees_passage in ((2, False), (1, True), (0, True)):
        model = head(tiny_bert, segment_layers=layers)
        with torch.inference_mode():
            hidden = (
                model._segments_apart(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
                if layers
                else model.bert(**batch)[0]
            )
        differs = not torch.allclose(hidden[0, :n_query], hidden[1, :n_query], atol=1e-6)
        assert differs == query_sees_passage, layers


def test_a_head_with_segments_apart_scores_in_one_pass_and_runs_padded(tiny_bert: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    model = head(tiny_bert, segment_layers=1)
    batch = tokenizer([QUERY] * 2, PASSAGES, padding=True, return_tensors="pt")
    with torch.inference_mode():
        scores = model(**batch).logits[:, 0]
        one = model(**tokenizer([QUERY], PASSAGES[:1], return_tensors="pt")).logits[0, 0]
    torch.testing.assert_close(scores[0], one, atol=1e-5, rtol=1e-4)  # padding changes nothing
    assert not unpaddable(model) and unpaddable(head(tiny_bert, segment_layers=0))
    with pytest.raises(InputError, match="segment_layers"):
        PackedEncoder(model)


def test_the_saved_setting_loads_back(tiny_bert: Path, tmp_path: Path) -> None:
    head(tiny_bert, segment_layers=2).save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).segment_layers == 2
