"""The TorchScript file of a student: its scores, and a trace that warns the user of nothing they did."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification

from distill.export.torchscript_file import export_torchscript


def test_the_trace_scores_like_the_model_and_passes_on_no_warning(tiny_bert: Path, tmp_path: Path) -> None:
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert).eval()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1000, 2000, (3, 12), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 7:] = 0  # padding, as export's example has
    example = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": torch.zeros_like(input_ids)}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_torchscript(model, example, tmp_path / "model.pt")
    hidden = (DeprecationWarning, PendingDeprecationWarning)  # what Python shows no user outside __main__
    assert [str(w.message) for w in caught if not issubclass(w.category, hidden)] == []

    traced = torch.jit.load(str(tmp_path / "model.pt"))
    other = {
        "input_ids": input_ids[:2, :9],
        "attention_mask": attention_mask[:2, :9],
        "token_type_ids": example["token_type_ids"][:2, :9],
    }
    with torch.no_grad():
        expected = model(**other).logits.squeeze(-1)
        got = traced(*other.values())
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
