"""Dynamic batching: the pairs of concurrent requests share the backend's batches, in rounds, in arrival order.

A request's pairs, already tokenised (:class:`~distill.serving.encoding.Encoded`), join one first-in-first-out
queue. One worker thread runs the model in rounds: it takes pairs from the head of the queue (each request's longest
first) until the next pair would take the round past ``round_tokens`` (the pairs' own tokens; by default
:data:`ROUND_BATCHES` batches' budget), or until the oldest waiting request has waited ``max_wait`` seconds, whichever
comes first, waiting only while another request is on its way (``arriving``: the server's requests being tokenised),
so that a request alone is scored at once; it sorts the round's pairs by length, across requests, cuts them into
batches of at most ``max_batch_tokens`` padded tokens (``rows × longest row``,
:func:`~distill.core.batching.token_budget_batches`), pads each batch with numpy and scores the batches one after
another. Requests queued while a round runs make the next. So:

- requests that arrive together, or while the backend is busy, are scored in the same batches, their pairs of
  similar lengths together, so their batches carry less padding than one request's pairs alone (``python -m
  benchmarks.load`` measures the gain);
- a request's pairs may span several batches and rounds (one of 100 documents), and its scores come back in its
  own order, whatever batches they ran in;
- the queue is fair: a round takes a request only after every request that came before it, so none starves; within
  a round, a request is answered once its last batch has run;
- a request alone in the queue is batched as :meth:`Reranker.score <distill.serving.reranker.Reranker.score>`
  batches it (its pairs longest first, :func:`~distill.core.batching.token_budget_batches`), so it gets the same
  scores.

A scorer that launches a batch on a device without waiting for it (``launch``: the torch scorer on CUDA) has the
worker keep the device fed: it launches the next batch as soon as fewer than :data:`LAUNCH_DEPTH` are on the device
(one running, one queued behind it), and another thread waits for each batch, in launch order, and hands its scores
out. So the host tokenises, packs and launches while the device computes, and a round taken while a batch is on the
device takes what is queued at once, without waiting for company: the device's own time gathers it.

A scorer with several inference streams (OpenVINO's, ``streams``) runs that many batches at once, on as many
threads: each batch starts as soon as a stream is free, and the next round is taken once the last batch of this one
has started, so that a stream done early takes the next round's first batch instead of waiting for the others.

With ``share`` off (``distill serve --batching false``) a batch holds one request's pairs: requests are scored one at
a time, in arrival order, each batched as ``Reranker.score`` batches it (the load benchmark's baseline).

A batch whose backend call fails is run again one request at a time: the request that fails alone gets the error,
the others their scores, and the worker goes on. A request whose future is cancelled (the server cancels it when its
client has gone) is dropped from the queue, and its rows leave the batches still to run, so that nobody's work waits
behind scores no one will read.

:class:`PredictLoop` serves a model that tokenises and batches a request itself (:class:`WholeRequests`: the load
benchmark's ``CrossEncoder.predict`` peer) one request at a time, in arrival order, on one thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from distill.core.batching import token_budget_batches
from distill.serving.encoding import Encoded, Packed, Padded
from distill.serving.scorers import Launched, Scorer

log = logging.getLogger(__name__)


ROUND_BATCHES = 8
"""A round takes at most this many batches' budget of tokens (the pairs' own) from the queue: enough for the pairs of
eight requests of 10 documents to sort together by length (fewer padded tokens a pair, more requests a batch), few
enough that a request of 100 documents spans rounds and does not hold back the requests behind it. The docs' serving
results page measures the batches it makes."""


LAUNCH_DEPTH = 2
"""Batches launched on a device and not handed out yet, at most: one that the device runs, and the next, queued
behind it, so that the device goes from one to the next without waiting for the host."""


@dataclass(frozen=True)
class Scored:
    """A request's result."""

    scores: np.ndarray
    """``[pairs]`` float32: the backend's raw scores, in the request's order."""
    queue_wait: float
    """Seconds from the request's arrival in the queue to the start of its first batch."""


@dataclass(frozen=True)
class BatchStats:
    """One batch the backend ran."""

    pairs: int
    requests: int
    """How many requests' pairs it held."""
    padded_tokens: int
    """``pairs × longest pair``: what the token budget counts (the tokens a padded batch computes)."""
    tokens: int
    """The pairs' own tokens."""
    seconds: float
    """The backend's time on the batch: its call's wall time, or, for a batch launched on a device, the device's
    (between CUDA events)."""


@dataclass(eq=False)
class _Job:
    encoded: Encoded
    future: Future[Scored]
    order: np.ndarray
    """``[pairs]`` the rows, longest first (ties in input order): the order they are taken in."""
    enqueued: float
    scores: np.ndarray = field(init=False)
    cursor: int = 0
    """How many rows of :attr:`order` are in a batch already."""
    remaining: int = field(init=False)
    """How many rows are still to be scored."""
    started: float | None = None

    def __post_init__(self) -> None:
        self.scores = np.empty(len(self.order), dtype=np.float32)
        self.remaining = len(self.order)


@dataclass(frozen=True)
class _Part:
    """The rows of one request in a batch."""

    job: _Job
    rows: np.ndarray


@dataclass(frozen=True)
class _InFlight:
    """A batch launched on the device: its requests' rows, their ``[rows]`` lengths, and the launch."""

    parts: list[_Part]
    lengths: np.ndarray
    launched: Launched


class DynamicBatcher:
    """One worker thread that scores the queued requests' pairs in rounds of shared, token-budget batches.

    Args:
        scorer: the backend: a padded batch -> ``[rows]`` float32 scores (a :class:`Reranker`'s ``scorer``).
        tokenizer: the tokenizer the pairs were encoded with (its padding side and pad ids).
        max_batch_tokens: the budget of padded tokens per batch; a pair longer than it runs alone.
        max_wait: seconds a batch that is not full waits, from the arrival of its oldest request, for others.
        on_batch: called on the worker thread with each batch that ran (metrics).
        share: whether a round takes several requests' pairs (off: one request's, without waiting).
        round_tokens: the most tokens (the pairs' own) a round takes from the queue; default :data:`ROUND_BATCHES`
            times ``max_batch_tokens``. A pair over it runs in a round of its own.
        arriving: how many requests are on their way to :meth:`submit` (the server's, being tokenised); a round that
            is not full waits for company only while it is positive (and at most ``max_wait``). None: a round always
            waits ``max_wait``. Whoever counts them calls :meth:`wake` when the count falls.
        gather_while_busy: with a scorer that launches, a round taken while a batch is on the device waits for the
            requests on their way (``arriving``) until the device is about to be free (the device's recent seconds a
            token times the tokens launched, less the host's recent time to launch), instead of taking what is
            queued at once: fewer, larger batches, the device still fed.
    """

    def __init__(
        self,
        scorer: Scorer,
        tokenizer: Any,
        max_batch_tokens: int,
        max_wait: float,
        on_batch: Callable[[BatchStats], None] | None = None,
        share: bool = True,
        round_tokens: int | None = None,
        arriving: Callable[[], int] | None = None,
        gather_while_busy: bool = False,
    ) -> None:
        if max_batch_tokens < 1 or max_wait < 0:
            raise ValueError(f"max_batch_tokens must be positive and max_wait >= 0, got {max_batch_tokens}, {max_wait}")
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait
        self.on_batch = on_batch
        self.share = share
        self.round_tokens = round_tokens or ROUND_BATCHES * max_batch_tokens
        self.arriving = arriving
        self.gather_while_busy = gather_while_busy
        self._queue: deque[_Job] = deque()
        self._changed = threading.Condition()
        self._closed = False
        self._handing = threading.Lock()
        """Held while a batch's scores go to their requests (batches of a round may end at once on streams)."""
        streams = getattr(scorer, "streams", 1)
        self._launch: Callable[[Padded | Packed], Launched] | None = getattr(scorer, "launch", None)
        """The scorer's ``launch``: it starts a batch on a device the host need not wait for."""
        self._finishing = ThreadPoolExecutor(1, "rerank-finish") if self._launch is not None and streams == 1 else None
        """The thread that waits for each launched batch, in launch order, and hands its scores out."""
        self._flights = 0
        """Batches launched and not handed out yet (at most :data:`LAUNCH_DEPTH`)."""
        self._device_free_at = 0.0
        """When the device should be done with the batches launched so far (``time.monotonic()``), estimated from
        :attr:`_seconds_per_token`."""
        self._seconds_per_token: float | None = None
        """The device's recent seconds a token (the pairs' own), a moving average over the launched batches."""
        self._launch_seconds: float | None = None
        """The host's recent seconds to build and launch a batch, a moving average."""
        self._streams = ThreadPoolExecutor(streams, "rerank-stream") if streams > 1 else None
        self._free_streams = threading.Semaphore(streams)
        """Streams not running a batch: a batch takes one before it is handed to :attr:`_streams`."""
        self._worker = threading.Thread(target=self._run, name="rerank-batcher", daemon=True)
        self._worker.start()

    @property
    def queued_pairs(self) -> int:
        """Pairs waiting for a batch."""
        with self._changed:
            return sum(len(job.order) - job.cursor for job in self._queue if not job.future.done())

    def submit(self, encoded: Encoded) -> Future[Scored]:
        """Queue a request's pairs; the future gives their scores, or the backend's exception. Cancelling it drops
        the request's rows still to be scored."""
        future: Future[Scored] = Future()
        lengths = encoded.pair_lengths
        order = np.lexsort((np.arange(len(lengths)), -lengths))  # longest first, ties in input order
        job = _Job(encoded, future, order, time.monotonic())
        if not len(order):
            future.set_result(Scored(job.scores, 0.0))
            return future
        with self._changed:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._queue.append(job)
            self._changed.notify()
        return future

    def wake(self) -> None:
        """Have a round that waits for company look again (``arriving`` has fallen)."""
        with self._changed:
            self._changed.notify()

    def close(self, timeout: float | None = None) -> None:
        """Score what is queued, then stop the worker (waiting at most ``timeout`` seconds for it)."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._worker.join(timeout)
        for pool in (self._streams, self._finishing):
            if pool is not None:
                pool.shutdown()

    def _run(self) -> None:
        while (batches := self._next_round()) is not None:
            for parts in batches:
                if self._streams is not None:
                    self._free_streams.acquire()
                    self._streams.submit(self._on_stream, parts)
                elif self._finishing is None:
                    self._score(parts)
                else:
                    self._launch_batch(parts)

    def _launch_batch(self, parts: list[_Part]) -> None:
        """Launch a batch once fewer than :data:`LAUNCH_DEPTH` are on the device, and have :attr:`_finishing` hand
        its scores out when the device is done (at once where it is done already: a processor's)."""
        with self._changed:
            while self._flights >= LAUNCH_DEPTH:
                self._changed.wait()
            self._flights += 1
        started = time.monotonic()
        flight = self._start(parts)
        now = time.monotonic()
        with self._changed:
            self._launch_seconds = _average(self._launch_seconds, now - started)
            if flight is not None and self._seconds_per_token is not None:
                tokens = int(flight.lengths.sum())
                self._device_free_at = max(now, self._device_free_at) + tokens * self._seconds_per_token
        if flight is None:
            self._landed()
        elif flight.launched.ready():
            self._finish(flight)
        else:
            self._finishing.submit(self._finish, flight)

    def _landed(self) -> None:
        """A launched batch's scores are handed out: one batch fewer on the device (none: it is free now, whatever
        the estimate said)."""
        with self._changed:
            self._flights -= 1
            if not self._flights:
                self._device_free_at = time.monotonic()
            self._changed.notify()

    def _on_stream(self, parts: list[_Part]) -> None:
        """:meth:`_score` on a stream's thread, which it frees when done."""
        try:
            self._score(parts)
        except Exception as error:  # the batcher's own fault (the backend's are the requests' errors in _score)
            for part in parts:
                self._fail(part.job, error)
        finally:
            self._free_streams.release()

    def _next_round(self) -> list[list[_Part]] | None:
        """The next round's batches, once its pairs fill :attr:`round_tokens` or the oldest request has waited
        ``max_wait`` (while a launched batch is on the device, and there is room for another, what is queued, at
        once); None once the batcher is closed and its queue empty."""
        with self._changed:
            while not (queued := self._drop_cancelled()) or self._flights >= LAUNCH_DEPTH:
                if self._closed and not queued:
                    return None
                self._changed.wait()
            busy = self._flights > 0
            if busy and self.gather_while_busy and self._seconds_per_token is not None:
                self._gather_while_busy()
            deadline = self._queue[0].enqueued + self.max_wait
            while (
                not busy
                and not self._closed
                and (self.arriving is None or self.arriving() > 0)
                and not self._take()[1]
                and (left := deadline - time.monotonic()) > 0
            ):
                self._changed.wait(left)
            taken, _ = self._take()
            now = time.monotonic()
            for part in taken:
                part.job.cursor += len(part.rows)
                if part.job.started is None:
                    part.job.started = now
            while self._queue and self._queue[0].cursor == len(self._queue[0].order):
                self._queue.popleft()
        return self._batches(taken) if taken else []

    def _gather_while_busy(self) -> None:
        """Wait, while a batch is on the device, for the requests on their way, until the round is full or the device
        is about to be free (:attr:`_device_free_at` less twice the host's time to launch). Called with
        :attr:`_changed` held."""
        while (
            self._flights > 0
            and not self._closed
            and (self.arriving is None or self.arriving() > 0)
            and not self._take()[1]
            and (left := self._device_free_at - 2 * (self._launch_seconds or 0.0) - time.monotonic()) > 0
        ):
            self._changed.wait(left)

    def _drop_cancelled(self) -> bool:
        """Drop the queued requests that are done before their last row is taken (cancelled: their client has gone);
        whether any request is left. Called with :attr:`_changed` held."""
        if any(job.future.done() for job in self._queue):
            self._queue = deque(job for job in self._queue if not job.future.done())
        return bool(self._queue)

    def _take(self) -> tuple[list[_Part], bool]:
        """The rows the next round takes from the head of the queue (each request's longest first), and whether they
        fill it: the next row would take its tokens past :attr:`round_tokens` (without :attr:`share`: the head
        request's rows, all of them). A request that fills a round alone gives it whole batches (those of
        ``Reranker.score``), so that no batch of it runs part-full but its last."""
        parts: list[_Part] = []
        tokens = 0
        for job in self._queue:
            if job.future.done():  # cancelled since the queue was last looked at
                continue
            lengths = job.encoded.pair_lengths
            start = stop = job.cursor
            if not self.share:
                return [_Part(job, job.order[start:])], True
            full = False
            while stop < len(job.order):
                length = int(lengths[job.order[stop]])
                if tokens and tokens + length > self.round_tokens:
                    full = True
                    break
                tokens, stop = tokens + length, stop + 1
            if full and not parts:  # a request over the round alone: whole batches of it, as Reranker.score's
                stop = start + self._whole_batches(lengths[job.order[start:]], stop - start)
            if stop > start:
                parts.append(_Part(job, job.order[start:stop]))
            if full:
                return parts, True
        return parts, False

    def _whole_batches(self, lengths: np.ndarray, rows: int) -> int:
        """How many of ``lengths`` (a request's remaining pairs, longest first) its token-budget batches hold, in
        whole batches, within its first ``rows`` (at least its first batch)."""
        taken = 0
        while taken < len(lengths):
            size = max(1, self.max_batch_tokens // int(lengths[taken]))
            if taken and taken + size > rows:
                break
            taken += size
        return min(taken, len(lengths))

    def _batches(self, taken: list[_Part]) -> list[list[_Part]]:
        """A round's rows as token-budget batches, longest first (ties in arrival order): each batch's rows grouped
        by request."""
        lengths = np.concatenate([part.job.encoded.pair_lengths[part.rows] for part in taken])
        owner = np.repeat(np.arange(len(taken)), [len(part.rows) for part in taken])
        row = np.concatenate([part.rows for part in taken])
        batches = []
        for batch in token_budget_batches(lengths, self.max_batch_tokens):
            batch = np.asarray(batch)
            parts = []
            for index in dict.fromkeys(owner[batch].tolist()):  # the requests, in their order in the batch
                parts.append(_Part(taken[index].job, row[batch[owner[batch] == index]]))
            batches.append(parts)
        return batches

    def _score(self, parts: list[_Part]) -> None:
        """Score a batch and hand each request its scores; where the backend fails on a batch of several requests,
        each request's rows again on their own, so that only the failing request gets the error."""
        parts = [part for part in parts if not part.job.future.done()]  # failed in an earlier batch, or cancelled
        if not parts:
            return
        try:
            batch, lengths = self._batch_of(parts)
            start = time.perf_counter()
            scores = self._checked(self.scorer(batch), lengths)
            seconds = time.perf_counter() - start
        except Exception as error:
            self._recover(parts, error)
            return
        self._hand_out(parts, scores, self._stats(parts, lengths, seconds))

    def _start(self, parts: list[_Part]) -> _InFlight | None:
        """Launch a batch on the device (the scorer's ``launch``); None where no request is left in it, or the launch
        failed (its requests are then scored again alone, as :meth:`_score` does)."""
        parts = [part for part in parts if not part.job.future.done()]
        if not parts:
            return None
        try:
            batch, lengths = self._batch_of(parts)
            return _InFlight(parts, lengths, self._launch(batch))
        except Exception as error:
            self._recover(parts, error)
            return None

    def _finish(self, flight: _InFlight) -> None:
        """Wait for a launched batch's scores and hand each request its own (the device's error: as :meth:`_score`)."""
        try:
            try:
                scores, seconds = flight.launched.result()
                scores = self._checked(scores, flight.lengths)
            except Exception as error:
                self._recover(flight.parts, error)
                return
            self._hand_out(flight.parts, scores, self._stats(flight.parts, flight.lengths, seconds))
            with self._changed:
                self._seconds_per_token = _average(self._seconds_per_token, seconds / int(flight.lengths.sum()))
        except Exception as error:  # the batcher's own fault: the requests must not wait for ever
            for part in flight.parts:
                self._fail(part.job, error)
        finally:
            self._landed()

    def _recover(self, parts: list[_Part], error: Exception) -> None:
        """After the backend failed on a batch: each request's rows again on their own, or, a request alone, its
        error."""
        if len(parts) > 1:
            log.warning("a batch of %d requests failed (%s): scoring each alone", len(parts), error)
            for part in parts:
                self._score([part])
            return
        self._fail(parts[0].job, error)

    def _hand_out(self, parts: list[_Part], scores: np.ndarray, stats: BatchStats) -> None:
        """Give each request of a batch its scores, and answer those whose last batch this was."""
        if self.on_batch is not None:
            self.on_batch(stats)
        bounds = np.cumsum([len(part.rows) for part in parts])[:-1]
        with self._handing:
            for part, part_scores in zip(parts, np.split(scores, bounds), strict=True):
                job = part.job
                if job.future.done():  # failed on an earlier batch
                    continue
                job.scores[part.rows] = part_scores
                job.remaining -= len(part.rows)
                if job.remaining == 0:
                    with suppress(InvalidStateError):  # cancelled while its last batch ran
                        job.future.set_result(Scored(job.scores, job.started - job.enqueued))

    def _batch_of(self, parts: list[_Part]) -> tuple[Padded | Packed, np.ndarray]:
        """The parts' rows back to back as the backend takes them: padded to one width, or packed for a scorer that
        ``takes_packed`` (as :meth:`Reranker.score <distill.serving.reranker.Reranker.score>` gives them); and their
        ``[rows]`` lengths."""
        lengths = np.concatenate([part.job.encoded.pair_lengths[part.rows] for part in parts])
        if getattr(self.scorer, "takes_packed", False):
            packs = [part.job.encoded.pack(part.rows) for part in parts]
            ids = np.concatenate([p.input_ids for p in packs])
            return Packed(ids, np.concatenate([p.token_type_ids for p in packs]), lengths), lengths
        width = int(lengths.max())
        padded = [part.job.encoded.batch(self.tokenizer, part.rows, width) for part in parts]
        batch = Padded(lengths, padded[0].left)
        for name in padded[0]:
            batch[name] = np.concatenate([p[name] for p in padded])
        return batch, lengths

    @staticmethod
    def _checked(scores: Any, lengths: np.ndarray) -> np.ndarray:
        """The backend's scores as ``[rows]`` float32, or an error where there is not one a row."""
        scores = np.asarray(scores, dtype=np.float32)
        if scores.shape != (len(lengths),):
            raise RuntimeError(f"the backend returned scores of shape {scores.shape} for {len(lengths)} pairs")
        return scores

    @staticmethod
    def _stats(parts: list[_Part], lengths: np.ndarray, seconds: float) -> BatchStats:
        return BatchStats(len(lengths), len(parts), len(lengths) * int(lengths.max()), int(lengths.sum()), seconds)

    def _fail(self, job: _Job, error: Exception) -> None:
        """Give ``job`` the backend's error and drop its rows still queued."""
        log.error("the backend failed on a request of %d pairs", len(job.order), exc_info=error)
        with self._changed:
            if job in self._queue:
                self._queue.remove(job)
        with suppress(InvalidStateError):  # cancelled meanwhile
            job.future.set_exception(error)


def _average(mean: float | None, value: float, weight: float = 0.2) -> float:
    """A moving average: ``value`` weighs ``weight`` against the mean so far (None: the first value)."""
    return value if mean is None else (1 - weight) * mean + weight * value


class WholeRequests(Protocol):
    """A model that scores a request's documents itself, tokenising and batching them its own way: the load
    benchmark's peer, sentence-transformers' ``CrossEncoder.predict`` (``benchmarks/crossencoder_peer.py``).
    It stands in for a :class:`~distill.serving.reranker.Reranker` in :func:`~distill.serving.http_api.create_app`,
    which tokenises each request with :attr:`tokenizer` all the same (its limits and token counts)."""

    tokenizer: Any
    max_length: int
    backend: str
    backend_reason: str

    @property
    def settings(self) -> dict[str, object]: ...

    def predict(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """``[documents]`` float32 raw scores, in the documents' order."""
        ...


class PredictLoop:
    """One worker thread that calls a :class:`WholeRequests` model on one request at a time, in arrival order: the
    serving loop of a model without dynamic batching.

    Args:
        model: what scores a request.
        on_batch: called on the worker thread with each request's call (metrics; ``padded_tokens`` counts the
            request's pairs at its longest pair's length).
    """

    def __init__(self, model: WholeRequests, on_batch: Callable[[BatchStats], None] | None = None) -> None:
        self.model = model
        self.on_batch = on_batch
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rerank-predict")
        self._queued = 0
        self._lock = threading.Lock()

    @property
    def queued_pairs(self) -> int:
        """Pairs waiting for, or in, the model's call."""
        with self._lock:
            return self._queued

    def submit(self, query: str, documents: Sequence[str], encoded: Encoded) -> Future[Scored]:
        """Queue a request (``encoded``: its pairs as the server tokenised them, for the metrics); the future gives
        its scores, or the model's exception. Cancelled before its turn, it is never scored."""
        with self._lock:
            self._queued += len(documents)
        future = self._pool.submit(self._predict, query, documents, encoded, time.monotonic())
        future.add_done_callback(lambda _: self._unqueue(len(documents)))  # scored, failed or cancelled
        return future

    def _unqueue(self, pairs: int) -> None:
        with self._lock:
            self._queued -= pairs

    def close(self) -> None:
        """Score what is queued, then stop the worker."""
        self._pool.shutdown(wait=True)

    def _predict(self, query: str, documents: Sequence[str], encoded: Encoded, enqueued: float) -> Scored:
        started = time.monotonic()
        scores = np.asarray(self.model.predict(query, documents), dtype=np.float32)
        seconds = time.monotonic() - started
        if scores.shape != (len(documents),):
            raise RuntimeError(f"the model returned scores of shape {scores.shape} for {len(documents)} pairs")
        if self.on_batch is not None:
            lengths = encoded.pair_lengths
            self.on_batch(BatchStats(len(lengths), 1, len(lengths) * int(lengths.max()), int(lengths.sum()), seconds))
        return Scored(scores, started - enqueued)
