"""OpenVINO's throughput mode: several inference streams, each running a batch of its own; ``distill serve``'s batcher
runs batches on them at once, each as soon as a stream is free, and the scores stay those of one stream."""

from __future__ import annotations

import importlib.util
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from distill.core.config import parse_config
from distill.core.schema import InputError
from distill.serving.batcher import DynamicBatcher
from distill.serving.encoding import encode_pairs
from distill.serving.options import ServingOptions
from distill.serving.reranker import Reranker
from distill.serving.scorers import OpenVinoScorer, load_scorer
from distill.serving.server import ServeConfig

pytestmark = pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="OpenVINO is an optional extra")


def openvino(exported: Path, streams: int) -> Reranker:
    return Reranker.load(exported, backend="openvino", dtype="float32", interpolation=False, streams=streams)


class TwoAtOnce:
    """OpenVINO's scorer of two streams, whose first two calls each wait for the other: they pass only if they run at
    once."""

    def __init__(self, scorer: OpenVinoScorer) -> None:
        self.scorer, self.streams = scorer, scorer.streams
        self.meet = threading.Barrier(2, timeout=10)
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, batch) -> np.ndarray:
        with self.lock:
            self.calls += 1
            first_two = self.calls <= 2
        if first_two:
            self.meet.wait()  # raises BrokenBarrierError if the other batch does not run meanwhile
        return self.scorer(batch)


def test_a_round_runs_its_batches_on_the_streams_at_once(exported: Path, call) -> None:
    one, two = openvino(exported, 1), openvino(exported, 2)
    query, passages = call
    encoded = encode_pairs(two.tokenizer, [query] * 40, passages[:40], 512)
    scorer = TwoAtOnce(two.scorer)
    batcher = DynamicBatcher(scorer, two.tokenizer, 2048, max_wait=0.0)  # 40 pairs: several batches a round
    try:
        scores = batcher.submit(encoded).result(30).scores
    finally:
        batcher.close()
    assert scorer.calls > 2
    np.testing.assert_allclose(scores, one.score(query, passages[:40]), atol=1e-5, rtol=0)  # each pair in its place


class HeldUntilTheNextRound:
    """OpenVINO's scorer of two streams, whose first batch is held until a batch with ``marker`` among its ids (a
    request that came after that batch's round was taken) has run: it passes only if a free stream takes the next
    round's batch while the other still runs this round's."""

    def __init__(self, scorer: OpenVinoScorer, marker: int) -> None:
        self.scorer, self.streams = scorer, scorer.streams
        self.marker = marker
        self.started = threading.Event()
        self.next_round_ran = threading.Event()
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, batch) -> np.ndarray:
        with self.lock:
            first, self.calls = self.calls == 0, self.calls + 1
        self.started.set()
        if (batch["input_ids"] == self.marker).any():
            self.next_round_ran.set()
        if first and not self.next_round_ran.wait(10):
            raise TimeoutError("the next round waited for this round's last batch")
        return self.scorer(batch)


def test_a_free_stream_takes_the_next_round_without_waiting_for_the_round(exported: Path, call) -> None:
    one, two = openvino(exported, 1), openvino(exported, 2)
    query, passages = call
    first = encode_pairs(two.tokenizer, [query] * 40, passages[:40], 512)
    later = encode_pairs(two.tokenizer, ["zebra"], passages[40:41], 512)
    marker = two.tokenizer.convert_tokens_to_ids("zebra")
    assert marker not in first.ids and marker in later.ids
    scorer = HeldUntilTheNextRound(two.scorer, marker)
    batcher = DynamicBatcher(scorer, two.tokenizer, 2048, max_wait=0.0)  # 40 pairs: several batches a round
    try:
        held = batcher.submit(first)
        assert scorer.started.wait(10)  # the first round is taken: the later request makes the next
        later_scores = batcher.submit(later).result(10).scores
        scores = held.result(10).scores
    finally:
        batcher.close()
    assert scorer.calls > 2
    np.testing.assert_allclose(later_scores, one.score("zebra", passages[40:41]), atol=1e-5, rtol=0)
    np.testing.assert_allclose(scores, one.score(query, passages[:40]), atol=1e-5, rtol=0)


def test_streams_score_as_one_stream_from_concurrent_calls(exported: Path, call) -> None:
    query, passages = call
    one, two = openvino(exported, 1), openvino(exported, 2)
    assert isinstance(two.scorer, OpenVinoScorer) and two.scorer.streams == 2 and two.settings["streams"] == 2
    assert one.settings["streams"] == 1
    spans = [passages[i : i + 20] for i in range(0, 100, 20)]
    expected = [one.score(query, span) for span in spans]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda span: two.score(query, span), spans))
    for scores, reference in zip(got, expected, strict=True):
        np.testing.assert_allclose(scores, reference, atol=1e-5, rtol=0)


def test_streams_belong_to_the_openvino_backend(exported: Path) -> None:
    with pytest.raises(InputError, match="streams 2: the openvino backend's option, not the onnx backend's"):
        ServingOptions(backend="onnx", streams=2)
    with pytest.raises(InputError, match="streams must be at least 1, got 0"):
        ServingOptions(streams=0)
    with pytest.raises(InputError, match="streams 2: an option of the openvino backend, not of onnx"):
        load_scorer(exported, "onnx", streams=2)
    config = parse_config(ServeConfig, ["--model", str(exported), "--backend", "openvino", "--streams", "2"], "serve")
    assert config.serving().streams == 2
