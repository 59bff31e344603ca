"""The segment-cosine head with ``segment_layers``: its first layers encode the query and the passage each on its
own, so that with every layer apart it is the backbone's bi-encoder similarity in one pass over the joint input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from distill.core.schema import InputError
from distill.model.segment_cosine import BertForSegmentCosine, BertSegmentCosineConfig, segment_positions
from distill.model.unpadding import PackedEncoder, unpaddable

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


def test_layers_apart_encode_each_text_as_the_bi_encoder_does(tiny_bert: Path) -> None:
    """The query segment is the bi-encoder's ``[CLS] Q [SEP]`` to the last layer. After the first layer, the passage's
    tokens are the bi-encoder's of ``[CLS] K [SEP]``: they see the [CLS] and themselves, at positions 1, 2, ..."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    model = head(tiny_bert, segment_layers=2)
    joint = tokenizer([QUERY] * 2, PASSAGES, padding=True, return_tensors="pt")
    n_query = int((joint["token_type_ids"][0] == 0).sum() - (joint["attention_mask"][0] == 0).sum())
    with torch.inference_mode():
        hidden = model._segments_apart(joint["input_ids"], joint["attention_mask"], joint["token_type_ids"])
        query_alone = model.bert(**tokenizer([QUERY], return_tensors="pt"))[0][0]
    torch.testing.assert_close(hidden[0, :n_query], query_alone, atol=1e-5, rtol=1e-4)
    model.bert.encoder.layer = model.bert.encoder.layer[:1]
    model.config.segment_layers = 1
    alone = tokenizer([PASSAGES[0]], return_tensors="pt")  # [CLS] K [SEP]
    n_passage = alone["input_ids"].shape[1] - 1
    assert joint["input_ids"][0, n_query : n_query + n_passage].tolist() == alone["input_ids"][0, 1:].tolist()
    with torch.inference_mode():
        first = model._segments_apart(joint["input_ids"], joint["attention_mask"], joint["token_type_ids"])
        passage_alone = model.bert(**alone)[0][0, 1:]
    torch.testing.assert_close(first[0, n_query : n_query + n_passage], passage_alone, atol=1e-5, rtol=1e-4)


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


def test_the_student_takes_segment_layers_with_the_segment_cosine_head_only(tiny_bert: Path) -> None:
    from students.model import build_student

    model, _ = build_student(str(tiny_bert), head="segment_cosine", segment_layers=2)
    assert model.config.segment_layers == 2
    with pytest.raises(InputError, match=r"model.segment_layers: 3 is not in 0..2"):
        build_student(str(tiny_bert), head="segment_cosine", segment_layers=3)
    with pytest.raises(InputError, match="segment_cosine head only"):
        build_student(str(tiny_bert), head="cls", segment_layers=1)


@pytest.mark.slow
def test_untrained_with_every_layer_apart_all_minilm_ranks_as_its_bi_encoder() -> None:
    """On a real DL21 query's 100 BM25 candidates, the untrained head over all-MiniLM-L6-v2 with its six layers
    apart ranks as the committed similarity teacher (the same weights as a bi-encoder) does."""
    import json

    import datasets
    from scipy.stats import spearmanr

    from distill.model.resolver import resolve_model
    from tests.conftest import REPO

    path = resolve_model("all-minilm-l6-v2").location
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = BertSegmentCosineConfig.from_pretrained(path, segment_layers=6)
    model = BertForSegmentCosine.from_pretrained(path, config=config).eval()
    entry = json.loads((REPO / "data" / "trec-dl21" / "bm25_top100.json").read_text())[0]
    teacher = datasets.load_from_disk(str(REPO / "data" / "teacher" / "dl21-bm25-minilm")).to_pandas()
    similarity = teacher.set_index(["qid", "docid"]).similarity
    passages = [hit["content"] for hit in entry["hits"]]
    batch = tokenizer([entry["query"]] * len(passages), passages, truncation=True, max_length=256, padding=True)
    with torch.inference_mode():
        scores = model(**{k: torch.tensor(v) for k, v in batch.items()}).logits[:, 0].numpy()
    theirs = [similarity[(str(hit["qid"]), str(hit["docid"]))] for hit in entry["hits"]]
    assert spearmanr(scores, theirs).statistic > 0.98
