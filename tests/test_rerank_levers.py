"""The reranker's speed levers (issue 19) on the CPU: the GPU token budget, each pinned to the plain path's scores,
in input order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from distill.core.batching import token_budget_batches
from distill.core.devices import STUDENT_BATCH_TOKENS
from distill.core.loaders import load_candidates
from distill.serving.encoding import Batch
from distill.serving.reranker import Reranker

from .conftest import DL19

TIGHT = {"rtol": 1e-5, "atol": 1e-6}
"""fp32 on the CPU, the same pairs in other batches (other padding, other matmul shapes): rounding only."""


@pytest.fixture(scope="module")
def student(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random BERT with its classifier scaled up: its scores spread over about 0.05 rather than 5e-5, so
    that a score in another pair's place fails :data:`TIGHT`."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(tiny_bert)
    with torch.no_grad():
        model.classifier.weight.mul_(1000.0)
    path = tmp_path_factory.mktemp("spread-bert")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(path)
    return path


def assert_distinct(scores) -> None:
    """Neighbouring scores differ by far more than :data:`TIGHT`: a shifted or swapped score would fail it."""
    scores = np.asarray(scores)
    tolerance = TIGHT["atol"] + TIGHT["rtol"] * np.abs(scores).max()
    assert np.median(np.abs(scores - np.roll(scores, 1))) > 10 * tolerance


@pytest.fixture(scope="module")
def call() -> tuple[str, list[str]]:
    """A DL19 query and its 100 BM25 candidates."""
    candidates = load_candidates(DL19).candidates[0]
    return candidates.query.text, [p.text for p in candidates.passages]


class Recorder:
    """Passes each batch to the scorer it wraps, and records the batch's shape."""

    def __init__(self, scorer) -> None:
        self.scorer, self.input_names, self.shapes = scorer, scorer.input_names, []

    def __call__(self, batch: Batch) -> np.ndarray:
        self.shapes.append(batch["input_ids"].shape)
        return self.scorer(batch)


def test_the_gpu_budget_takes_a_querys_100_candidates_in_one_batch(student: Path, call) -> None:
    """On CUDA the default budget holds 100 pairs of 256 tokens; the CPU's splits them into batches within it."""
    query, passages = call
    assert len(passages) == 100 and token_budget_batches([256] * 100, STUDENT_BATCH_TOKENS["cuda"]) == [
        list(range(100))
    ]
    cpu = Reranker.load(student, backend="torch", max_length=256)
    assert cpu.max_batch_tokens == STUDENT_BATCH_TOKENS["cpu"]
    gpu = Reranker.load(student, backend="torch", max_length=256, max_batch_tokens=STUDENT_BATCH_TOKENS["cuda"])
    cpu.scorer, gpu.scorer = Recorder(cpu.scorer), Recorder(gpu.scorer)
    one, many = gpu.score(query, passages), cpu.score(query, passages)
    ((rows, width),) = gpu.scorer.shapes
    assert rows == 100 and width <= 256
    assert len(cpu.scorer.shapes) > 1 and all(rows * width <= 1024 for rows, width in cpu.scorer.shapes)
    assert sum(rows for rows, _ in cpu.scorer.shapes) == 100
    np.testing.assert_allclose(one, many, **TIGHT)
    assert_distinct(one)
