"""The segment-cosine head: it starts as the backbone's own similarity, and it exports and serves like the CLS head."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from distill.core.schema import InputError
from distill.model.segment_cosine import MODEL_TYPE, segment_mean
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
    with pytest.raises(InputError, match="segment_cosine needs a BERT backbone"):
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
    report = export_student(folder, tmp_path / "export", formats=("onnx", "torchscript"), parity=parity)
    assert set(report.formats) == {"onnx", "torchscript"}
    features = encode_pairs(tokenizer, [QUERY] * 3, PASSAGES, 512).features
    torch_scores = TorchScorer(folder)(pad_batch(tokenizer, features))
    onnx_scores = Reranker.load(tmp_path / "export", backend="onnx").score(QUERY, PASSAGES)
    np.testing.assert_allclose(onnx_scores, torch_scores, atol=1e-4)


def test_distill_train_refuses_an_unknown_head_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from distill.cli import main

    assert main(["train", "--model.head", "pooled", "--print_config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "model.head: expected Literal['cls', 'segment_cosine'], got 'pooled'" in err
