"""The segment-cosine head: it starts as the backbone's own similarity, and it exports and serves like the CLS head."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from distill.core.schema import InputError
from distill.model.segment_cosine import MODEL_TYPE, MPNET_MODEL_TYPE, segment_mean, separator_segments
from distill.serving.encoding import encode_pairs, pad_batch
from students.model import build_student, save_student

QUERY = "what is a cat"
PASSAGES = [
    "A cat is a small domesticated carnivorous mammal.",
    "The stock market fell today as bond yields rose.",
    "Cats purr, hunt mice and sleep most of the day.",
]


def test_segment_mean_averages_the_masked_positions_only() -> None:
    hidden = torch.arange(12.0).reshape(1, 4, 3)
    mask = torch.tensor([[1, 0, 1, 0]])
    torch.testing.assert_close(segment_mean(hidden, mask), (hidden[:, 0] + hidden[:, 2]) / 2)
    torch.testing.assert_close(segment_mean(hidden, torch.zeros(1, 4, dtype=torch.long)), torch.zeros(1, 3))


def test_the_head_starts_as_the_scaled_cosine_of_the_backbones_segment_means(tiny_bert: Path) -> None:
    from transformers import AutoModel

    model, tokenizer = build_student(str(tiny_bert), head="segment_cosine")
    assert model.config.model_type == MODEL_TYPE
    backbone = AutoModel.from_pretrained(tiny_bert, add_pooling_layer=False).eval()
    for name, weight in backbone.state_dict().items():  # the encoder's weights are the backbone's, all of them
        torch.testing.assert_close(model.bert.state_dict()[name], weight)
    model.eval()
    batch = tokenizer([QUERY] * 3, PASSAGES, return_tensors="pt", padding=True)
    with torch.no_grad():
        hidden = backbone(**batch).last_hidden_state
        mask, types = batch["attention_mask"], batch["token_type_ids"]
        expected = 20.0 * torch.nn.functional.cosine_similarity(
            segment_mean(hidden, mask * (1 - types)), segment_mean(hidden, mask * types)
        )
        torch.testing.assert_close(model(**batch).logits[:, 0], expected)


def test_unknown_heads_and_non_bert_backbones_are_one_line_errors(tiny_bert: Path, tiny_llama: Path) -> None:
    with pytest.raises(InputError, match=r"model\.head: 'pooled' is none of"):
        build_student(str(tiny_bert), head="pooled")
    with pytest.raises(InputError, match="segment_cosine needs a BERT or MPNet backbone"):
        build_student(str(tiny_llama), head="segment_cosine")


def test_a_segment_cosine_student_exports_and_serves_with_parity(tiny_bert: Path, parity, tmp_path: Path) -> None:
    """Saved, reloaded through the Auto classes, exported (fused ONNX, TorchScript) within the parity gates, and
    reranked by the ONNX backend as the PyTorch weights rank."""
    from transformers import AutoModelForSequenceClassification

    from distill.export.exporter import export_student
    from distill.serving.reranker import Reranker
    from distill.serving.scorers import TorchScorer

    model, tokenizer = build_student(str(tiny_bert), head="segment_cosine")
    with torch.no_grad():
        model.scale.fill_(7.0)
        model.bias.fill_(-2.0)
    folder = save_student(model, tokenizer, tmp_path / "student", None)
    reloaded = AutoModelForSequenceClassification.from_pretrained(folder)
    assert float(reloaded.scale) == 7.0 and float(reloaded.bias) == -2.0
    report = export_student(folder, tmp_path / "export", formats=("onnx", "torchscript"), fp16=True, parity=parity)
    mask = os.umask(0)
    os.umask(mask)
    for weights in (folder / "model.safetensors", tmp_path / "export" / "model.safetensors"):  # safetensors: 0o600
        assert weights.stat().st_mode & 0o777 == 0o666 & ~mask, weights  # a server of another user reads them
    assert set(report.formats) == {"onnx", "onnx-fp16", "torchscript"}
    features = encode_pairs(tokenizer, [QUERY] * 3, PASSAGES, 512).features
    torch_scores = TorchScorer(folder)(pad_batch(tokenizer, features))
    onnx_scores = Reranker.load(tmp_path / "export", backend="onnx").score(QUERY, PASSAGES)
    np.testing.assert_allclose(onnx_scores, torch_scores, atol=1e-4)
    # fp16: the head's max(norm, eps) made the graph invalid (written, exit 0, and then unloadable)
    fp16 = {r.format: r for r in report.parity}["onnx-fp16"]
    assert fp16.device == "cpu" and not fp16.not_checked and fp16.failure() is None, fp16
    half = Reranker.load(tmp_path / "export", backend="onnx", dtype="float16").score(QUERY, PASSAGES)
    np.testing.assert_allclose(half, torch_scores, atol=0.05)


def test_distill_train_refuses_an_unknown_head_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from distill.cli import main

    assert main(["train", "--model.head", "pooled", "--print_config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "model.head: expected Literal['cls', 'segment_cosine'], got 'pooled'" in err


def mpnet_alone(backbone, ids: list[int]) -> torch.Tensor:
    """``[len(ids), H]`` the MPNet backbone's last hidden states of ``ids`` encoded on their own."""
    return backbone(input_ids=torch.tensor([ids]))[0][0]


def test_an_mpnet_pair_is_cut_at_its_second_separator(tiny_mpnet: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_mpnet)
    assert "token_type_ids" not in tokenizer.model_input_names
    batch = tokenizer(["what is a cat", QUERY], PASSAGES[:2], return_tensors="pt", padding=True)
    segments = separator_segments(batch["input_ids"], batch["attention_mask"], tokenizer.eos_token_id)
    for row, ids in enumerate(batch["input_ids"].tolist()):
        second = [i for i, token in enumerate(ids) if token == tokenizer.eos_token_id][1]  # <s> Q </s> | </s> K </s>
        length = int(batch["attention_mask"][row].sum())
        assert segments[row].tolist() == [0] * second + [1] * (length - second) + [0] * (len(ids) - length)


def test_mpnet_layers_apart_are_its_bi_encoder(tiny_mpnet: Path) -> None:
    """With every layer apart, the query segment's states are the backbone's of ``<s> Q </s>`` alone and the
    passage's those of ``<s> K </s>`` alone (its leading ``</s>`` read as ``<s>``), and the score is the scaled
    cosine of their means."""
    from transformers import AutoModel

    model, tokenizer = build_student(str(tiny_mpnet), head="segment_cosine", segment_layers=2)
    assert model.config.model_type == MPNET_MODEL_TYPE
    model.eval()
    backbone = AutoModel.from_pretrained(tiny_mpnet, add_pooling_layer=False).eval()
    batch = tokenizer([QUERY] * 3, PASSAGES, return_tensors="pt", padding=True)
    segments = separator_segments(batch["input_ids"], batch["attention_mask"], tokenizer.eos_token_id)
    with torch.inference_mode():
        hidden = model._segments_apart(batch["input_ids"], batch["attention_mask"], segments)
        logits = model(**batch).logits[:, 0]
        for row, passage in enumerate(PASSAGES):
            ids = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()
            cut = int((segments[row] == 0).sum() - (batch["attention_mask"][row] == 0).sum())
            assert ids[:cut] == tokenizer(QUERY)["input_ids"]
            assert ids[cut:] == [tokenizer.eos_token_id, *tokenizer(passage)["input_ids"][1:]]
            query, alone = mpnet_alone(backbone, ids[:cut]), mpnet_alone(backbone, tokenizer(passage)["input_ids"])
            torch.testing.assert_close(hidden[row, :cut], query, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(hidden[row, cut : len(ids)], alone, atol=1e-5, rtol=1e-4)
            cosine = torch.nn.functional.cosine_similarity(query.mean(0), alone.mean(0), dim=0)
            torch.testing.assert_close(logits[row], 20.0 * cosine, atol=1e-4, rtol=1e-4)


def test_an_mpnet_segment_cosine_student_exports_and_serves_with_parity(
    tiny_mpnet: Path, parity, tmp_path: Path
) -> None:
    """An MPNet student (layers apart and across) is saved, reloaded by the Auto classes and as remote code,
    exported to ONNX within the parity gate, and reranked by the ONNX backend as its PyTorch weights rank."""
    from transformers import AutoModelForSequenceClassification

    from distill.export.exporter import export_student
    from distill.serving.reranker import Reranker
    from distill.serving.scorers import TorchScorer

    model, tokenizer = build_student(str(tiny_mpnet), head="segment_cosine", segment_layers=1)
    with torch.no_grad():
        model.bias.fill_(-2.0)
    folder = save_student(model, tokenizer, tmp_path / "student", None)
    assert float(AutoModelForSequenceClassification.from_pretrained(folder).bias.detach()) == -2.0
    report = export_student(folder, tmp_path / "export", formats=("onnx",), parity=parity)
    assert set(report.formats) == {"onnx"}
    remote = AutoModelForSequenceClassification.from_pretrained(tmp_path / "export", trust_remote_code=True)
    assert type(remote).__name__ == "MPNetForSegmentCosine"
    features = encode_pairs(tokenizer, [QUERY] * 3, PASSAGES, 512).features
    torch_scores = TorchScorer(folder)(pad_batch(tokenizer, features))
    onnx_scores = Reranker.load(tmp_path / "export", backend="onnx").score(QUERY, PASSAGES)
    np.testing.assert_allclose(onnx_scores, torch_scores, atol=1e-4)
