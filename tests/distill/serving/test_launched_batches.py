"""A scorer that launches batches on a device the host does not wait for (the torch scorer on CUDA): the batcher
keeps one batch ahead, launching the next before it waits for the one on the device, and hands every batch's scores
out even when no request follows. Here the device is a thread that runs a real scorer's batches in launch order, as
a CUDA stream runs its kernels; tests/distill/serving/test_cuda_graphs.py launches on a GPU."""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from distill.serving.batcher import BatchStats, DynamicBatcher
from distill.serving.encoding import Packed, encode_pairs
from distill.serving.reranker import Reranker
from distill.serving.scorers import Launched

TOLERANCE = 1e-5


class OnAStream:
    """A real scorer's batches run in launch order on a thread of their own (the stream); ``launch`` returns at once.
    The stream runs only as many batches as :meth:`let` has allowed; a batch holding the token ``poison`` fails
    there; with ``per_token`` a batch takes that many seconds a token (the pairs' own), which it reports as its
    device time."""

    def __init__(self, scorer, poison: int | None = None, per_token: float | None = None) -> None:
        self.scorer, self.input_names, self.poison, self.per_token = scorer, scorer.input_names, poison, per_token
        self.stream = ThreadPoolExecutor(1, "stream")
        self.allowed = threading.Condition()
        self.runs = 0
        self.launches = 0
        self.launched_at: list[float] = []
        self.ended_at: dict[int, float] = {}

    def let(self, batches: int = 1_000_000) -> None:
        """Let the stream run ``batches`` more (by default, all)."""
        with self.allowed:
            self.runs += batches
            self.allowed.notify_all()

    def __call__(self, batch):
        return self.launch(batch).result()[0]

    def launch(self, batch) -> Launched:
        index = self.launches
        self.launches += 1
        self.launched_at.append(time.monotonic())

        def run() -> tuple[np.ndarray, float]:
            with self.allowed:
                self.allowed.wait_for(lambda: index < self.runs, 30)
            if self.poison is not None and (batch["input_ids"] == self.poison).any():
                raise RuntimeError("poisoned batch")
            start = time.perf_counter()
            scores = self.scorer(batch)
            if self.per_token is None:
                return scores, time.perf_counter() - start
            seconds = self.per_token * int(batch.lengths.sum())
            time.sleep(seconds)
            self.ended_at[index] = time.monotonic()
            return scores, seconds

        future = self.stream.submit(run)
        return Launched(future.result, future.done)


@pytest.fixture(scope="module")
def reference(exported: Path) -> Reranker:
    return Reranker.load(exported, backend="onnx", interpolation=False)


def _wait_until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_the_batcher_launches_the_next_batch_before_it_waits_for_the_one_on_the_device(
    reference: Reranker, call
) -> None:
    """While a batch is on the device, the next is launched, and only one: the batcher then waits for the first.
    Once the first is done, the requests queued meanwhile are taken while the second is still on the device, without
    waiting for company (one is always arriving here, and the window is a minute); the last batch's scores come out
    with no request after it."""
    query, passages = call
    encoded = [encode_pairs(reference.tokenizer, [query] * 4, passages[i : i + 4], 512) for i in (0, 4, 8)]
    budget = int(encoded[0].pair_lengths.max()) * 2  # two pairs a batch
    arriving, stats = [0], []
    scorer = OnAStream(reference.scorer)
    batcher = DynamicBatcher(
        scorer, reference.tokenizer, budget, 60.0, on_batch=stats.append, arriving=lambda: arriving[0]
    )
    try:
        first = batcher.submit(encoded[0])  # nothing arriving: launched at once, two batches
        assert _wait_until(lambda: scorer.launches == 2)
        arriving[0] = 1
        later = [batcher.submit(e) for e in encoded[1:]]
        time.sleep(0.3)
        assert scorer.launches == 2  # one batch ahead, no more: the batcher waits for the first
        scorer.let(1)  # the first batch ends; the second stays on the device
        assert _wait_until(lambda: scorer.launches == 3)  # not a minute's wait for company
        time.sleep(0.3)
        assert scorer.launches == 3
        scorer.let()
        results = [future.result(10) for future in (first, *later)]
    finally:
        batcher.close(10)
    assert scorer.launches == len(stats) and sum(s.pairs for s in stats) == 12
    assert all(isinstance(s, BatchStats) and s.seconds > 0 for s in stats)
    for i, result in zip((0, 4, 8), results, strict=True):
        assert result.scores.tolist() == pytest.approx(reference.score(query, passages[i : i + 4]), abs=TOLERANCE)


def test_a_batch_that_fails_on_the_device_fails_only_its_failing_request(reference: Reranker, call) -> None:
    query, passages = call
    poison = reference.tokenizer.convert_tokens_to_ids("poison")
    scorer = OnAStream(reference.scorer, poison)
    batcher = DynamicBatcher(scorer, reference.tokenizer, 2**16, max_wait=0.0)
    texts = [passages[:3], ["poison", *passages[3:5]], passages[5:8]]
    encoded = [encode_pairs(reference.tokenizer, [query] * len(t), t, 512) for t in texts]
    try:
        first = batcher.submit(encoded[0])
        assert _wait_until(lambda: scorer.launches == 1)
        bad, good = batcher.submit(encoded[1]), batcher.submit(encoded[2])  # one batch, launched behind the first
        assert _wait_until(lambda: scorer.launches == 2)
        scorer.let()
        with pytest.raises(RuntimeError, match="poisoned batch"):
            bad.result(10)
        for future, text in ((first, texts[0]), (good, texts[2])):
            assert future.result(10).scores.tolist() == pytest.approx(reference.score(query, text), abs=TOLERANCE)
    finally:
        batcher.close(10)


def test_the_torch_scorer_on_a_processor_launches_a_batch_already_scored(tiny_bert: Path, call) -> None:
    query, passages = call
    for unpad in (False, True):
        reranker = Reranker.load(tiny_bert, backend="torch", unpad=unpad, interpolation=False)
        encoded = encode_pairs(reranker.tokenizer, [query] * 5, passages[:5], 512)
        batch = encoded.pack() if unpad else encoded.batch(reranker.tokenizer)
        assert isinstance(batch, Packed) == unpad
        launched = reranker.scorer.launch(batch)
        assert launched.ready()
        scores, seconds = launched.result()
        assert scores.dtype == np.float32 and seconds > 0
        np.testing.assert_array_equal(scores, reranker.scorer(batch))
        assert scores.tolist() == pytest.approx(reranker.score(query, passages[:5]), abs=TOLERANCE)


def test_a_batch_that_cannot_be_built_fails_its_request_and_the_batcher_goes_on(reference: Reranker, call) -> None:
    """Pair lengths past the end of the request's ids: building its batch fails, on either path (launched or
    called), and that request gets the error; the batcher scores the next request."""
    query, passages = call
    good = encode_pairs(reference.tokenizer, [query] * 3, passages[:3], 512)
    broken = dataclasses.replace(good, pair_lengths=good.pair_lengths + 10_000)
    launching = OnAStream(reference.scorer)
    launching.let()
    for scorer in (launching, reference.scorer):
        batcher = DynamicBatcher(scorer, reference.tokenizer, 2**16, max_wait=0.0)
        try:
            with pytest.raises(IndexError):
                batcher.submit(broken).result(10)
            scores = batcher.submit(good).result(10).scores
        finally:
            batcher.close(10)
        assert scores.tolist() == pytest.approx(reference.score(query, passages[:3]), abs=TOLERANCE)


@pytest.mark.parametrize("gather", [True, False])
def test_gathering_while_busy_waits_for_requests_on_their_way_until_the_device_is_nearly_free(
    reference: Reranker, call, gather: bool
) -> None:
    """``gather_while_busy``: a request queued while a long batch is on the device waits for the one being
    tokenised, and the two share the next batch, launched before the device is free; without it, the first is
    launched at once, alone."""
    from distill.serving.server import ServeConfig

    assert ServeConfig(model="m", gather_while_busy=gather).options.gather_while_busy is gather  # distill serve's flag
    query, passages = call
    tokenizer = reference.tokenizer
    arriving, stats = [0], []
    scorer = OnAStream(reference.scorer, per_token=3e-4)
    scorer.let()
    batcher = DynamicBatcher(
        scorer, tokenizer, 2**16, 0.0, on_batch=stats.append, arriving=lambda: arriving[0], gather_while_busy=gather
    )
    try:
        batcher.submit(encode_pairs(tokenizer, [query] * 2, passages[:2], 512)).result(10)  # the device's time a token
        long = batcher.submit(encode_pairs(tokenizer, [query] * 40, passages[:40], 512))  # about 1.5 s on the device
        assert _wait_until(lambda: scorer.launches == 2)
        arriving[0] = 1
        first = batcher.submit(encode_pairs(tokenizer, [query] * 2, passages[40:42], 512))
        time.sleep(0.3)
        assert scorer.launches == (2 if gather else 3)
        second = batcher.submit(encode_pairs(tokenizer, [query] * 2, passages[42:44], 512))
        arriving[0] = 0
        batcher.wake()
        results = [future.result(10) for future in (long, first, second)]
    finally:
        batcher.close(10)
    assert [s.requests for s in stats] == ([1, 1, 2] if gather else [1, 1, 1, 1]) and stats[1].pairs == 40
    assert scorer.launched_at[2] < scorer.ended_at[1]  # the next batch was launched while the long one ran
    for result, (start, stop) in zip(results, ((0, 40), (40, 42), (42, 44)), strict=True):
        expected = reference.score(query, passages[start:stop])
        assert result.scores.tolist() == pytest.approx(expected, abs=TOLERANCE)
