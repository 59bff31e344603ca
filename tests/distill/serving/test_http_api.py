"""``distill serve``: Cohere's and TEI's rerank APIs on loopback, with the official Cohere SDK and plain HTTP; the
dynamic batcher; errors and limits; draining on SIGTERM."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import httpx
import numpy as np
import pytest

from distill.cli import main
from distill.serving.batcher import BatchStats, DynamicBatcher
from distill.serving.encoding import encode_pairs, load_tokenizer
from distill.serving.http_api import HttpOptions, ServedModel, _keep_last_tokens, create_app
from distill.serving.reranker import Reranker
from distill.serving.server import bind, drain_server, uvicorn_config
from tests.conftest import REPO

TOLERANCE = 1e-5
"""fp32 scores of the same pairs in other batches: equal within rounding."""


@contextmanager
def serve_process(command: list[str]) -> Iterator[tuple[subprocess.Popen, str]]:
    """``distill serve`` started by ``command`` in a process of its own, and its URL once it listens (its stderr
    read up to the 'listening on' line); killed on leaving."""
    process = subprocess.Popen(
        command, cwd=REPO, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        url = None
        for line in process.stderr:
            if match := re.search(r"listening on (http://\S+)", line):
                url = match.group(1)
                break
        assert url, "the server did not start"
        yield process, url
    finally:
        process.kill()
        process.wait()


@contextmanager
def running(app) -> Iterator[str]:
    """``app`` served on a free loopback port as ``distill serve`` serves it (uvicorn, its config and drain), in a
    thread: its base URL."""
    sock = bind("127.0.0.1", 0)
    server = drain_server(uvicorn_config(app), app.state.serving)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def reference(exported: Path) -> Reranker:
    """The export on onnxruntime fp32, as ``Reranker.score`` scores it: what the server must answer."""
    return Reranker.load(exported, backend="onnx", interpolation=False)


@pytest.fixture(scope="module")
def server(exported: Path) -> Iterator[str]:
    """The export served on onnxruntime fp32 (its own copy of the backend), at most 120 documents a request."""
    reranker = Reranker.load(exported, backend="onnx", interpolation=False)
    with running(
        create_app(ServedModel(exported, reranker), HttpOptions(max_documents=120, max_body_bytes=2**20))
    ) as url:
        yield url


def metric(url: str, name: str, **labels: str) -> float:
    """A sample's value in ``GET /metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"no sample {name}{labels} in /metrics")


def wait_for(condition: Callable[[], bool], seconds: float = 10) -> None:
    """Poll ``condition`` until it holds; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_cohere_sdk_reranks_with_the_rerankers_scores(server: str, reference: Reranker, call) -> None:
    import cohere

    query, passages = call
    raw = reference.score(query, passages)
    probability = reference.probabilities(query, passages)
    assert reference.calibration is not None  # the export fitted one on its quality gate's judged pairs
    best = sorted(range(len(raw)), key=lambda i: (-raw[i], i))[:5]
    tokens = int(encode_pairs(reference.tokenizer, [query] * len(passages), passages, reference.max_length).ids.size)

    v1 = cohere.Client(api_key="unused", base_url=server).rerank(
        query=query, documents=passages, top_n=5, return_documents=True
    )
    assert [r.index for r in v1.results] == best
    for result in v1.results:
        assert result.relevance_score == pytest.approx(probability[result.index], abs=TOLERANCE)
        assert result.document.text == passages[result.index]
    assert v1.meta.tokens.input_tokens == tokens
    assert v1.id

    v2 = cohere.ClientV2(api_key="unused", base_url=server).rerank(model="any", query=query, documents=passages)
    assert [r.index for r in v2.results] == sorted(range(len(raw)), key=lambda i: (-raw[i], i))
    assert [r.relevance_score for r in v2.results] == [
        pytest.approx(probability[r.index], abs=TOLERANCE) for r in v2.results
    ]
    assert v2.meta.api_version.version == "2"


def test_jina_documents_and_raw_scores(server: str, reference: Reranker, call) -> None:
    query, passages = call
    documents = passages[:20]
    raw = reference.score(query, documents)
    body = {"model": "jina-reranker", "query": query, "documents": [{"text": d} for d in documents], "raw_scores": True}
    answer = httpx.post(f"{server}/v1/rerank", json=body).json()
    results = answer["results"]
    assert [r["index"] for r in results] == sorted(range(20), key=lambda i: (-raw[i], i))
    assert [r["relevance_score"] for r in results] == [pytest.approx(raw[r["index"]], abs=TOLERANCE) for r in results]
    assert all("document" not in r for r in results)  # Cohere's default: return_documents false
    assert answer["usage"]["total_tokens"] == answer["meta"]["tokens"]["input_tokens"] > 0


def test_object_documents_come_back_whole_and_rank_fields_choose_what_is_scored(
    server: str, reference: Reranker, call
) -> None:
    """As Cohere v1: ``return_documents`` returns each object as sent (it returned its text alone), and
    ``rank_fields`` scores the named keys as 'key: value' lines (it was ignored)."""
    query, passages = call
    objects = [{"text": p, "title": f"T{i}", "id": f"d{i}"} for i, p in enumerate(passages[:6])]
    body = {"query": query, "documents": objects, "return_documents": True}
    answer = httpx.post(f"{server}/v1/rerank", json=body).json()
    assert sorted((r["index"], r["document"]["id"]) for r in answer["results"]) == [(i, f"d{i}") for i in range(6)]
    assert all(r["document"] == objects[r["index"]] for r in answer["results"])
    fields = ["title", "text"]
    ranked = httpx.post(f"{server}/v1/rerank", json={**body, "rank_fields": fields, "raw_scores": True}).json()
    texts = [f"title: T{i}\ntext: {p}" for i, p in enumerate(passages[:6])]
    raw = reference.score(query, texts)
    for result in ranked["results"]:
        assert result["relevance_score"] == pytest.approx(raw[result["index"]], abs=TOLERANCE)
        assert result["document"] == objects[result["index"]]
    missing = httpx.post(f"{server}/v1/rerank", json={**body, "rank_fields": ["body"]})
    assert missing.status_code == 422 and "documents[0] has no rank field 'body'" in missing.json()["error"]


def test_tei_rerank_is_sorted_and_calibrated_unless_raw(server: str, reference: Reranker, call) -> None:
    query, passages = call
    texts = passages[30:45]
    raw = reference.score(query, texts)
    probability = reference.probabilities(query, texts)
    order = sorted(range(len(texts)), key=lambda i: (-raw[i], i))
    normalised = httpx.post(f"{server}/rerank", json={"query": query, "texts": texts, "truncate": True}).json()
    assert [r["index"] for r in normalised] == order
    assert [r["score"] for r in normalised] == [pytest.approx(probability[i], abs=TOLERANCE) for i in order]
    assert all(set(r) == {"index", "score"} for r in normalised)
    body = {"query": query, "texts": texts, "truncate": True, "raw_scores": True, "return_text": True}
    scored = httpx.post(f"{server}/rerank", json=body).json()
    assert [r["score"] for r in scored] == [pytest.approx(raw[i], abs=TOLERANCE) for i in order]
    assert [r["text"] for r in scored] == [texts[i] for i in order]


def test_documents_too_long_are_cut_or_refused_as_asked(server: str, reference: Reranker, call) -> None:
    query = call[0]
    long_text = " ".join(call[1][:12])  # over 512 tokens
    texts = ["a short passage about rhinos", long_text]
    refused = httpx.post(f"{server}/rerank", json={"query": query, "texts": texts})
    assert refused.status_code == 413
    assert re.fullmatch(
        r"texts: 1 of 2 are longer than \d+ tokens \(the model's 512-token pairs .*", refused.json()["error"]
    )
    cut = httpx.post(f"{server}/rerank", json={"query": query, "texts": texts, "truncate": True, "raw_scores": True})
    raw = reference.score(query, texts)  # Reranker truncates the passage to the model's pair length too
    assert {r["index"]: r["score"] for r in cut.json()} == {
        i: pytest.approx(s, abs=TOLERANCE) for i, s in enumerate(raw)
    }

    # max_tokens_per_doc cuts each document to that many tokens: the reranker's scores with that pair length
    query_tokens = len(reference.tokenizer(query, add_special_tokens=False)["input_ids"])
    capped = Reranker(
        reference.scorer,
        reference.tokenizer,
        query_tokens + reference.tokenizer.num_special_tokens_to_add(pair=True) + 16,
        reference.max_batch_tokens,
    )
    body = {"query": query, "documents": texts, "max_tokens_per_doc": 16, "raw_scores": True}
    results = httpx.post(f"{server}/v2/rerank", json=body).json()["results"]
    expected = capped.score(query, texts)
    assert {r["index"]: r["relevance_score"] for r in results} == {
        i: pytest.approx(s, abs=TOLERANCE) for i, s in enumerate(expected)
    }
    refused = httpx.post(f"{server}/v1/rerank", json={**body, "truncate": False})
    assert refused.status_code == 413 and "longer than 16 tokens (max_tokens_per_doc 16)" in refused.json()["error"]


BAD_REQUESTS = {
    "bad JSON": ("/v1/rerank", b'{"query": "q", "documents": [', 400, "body: not valid JSON"),
    "not an object": ("/rerank", b'["q"]', 422, "body: "),
    "empty query": ("/v1/rerank", {"query": "", "documents": ["a"]}, 422, "query: must not be empty"),
    "blank query": ("/rerank", {"query": "  ", "texts": ["a"]}, 422, "query: must not be empty"),
    "no query": ("/v1/rerank", {"documents": ["a"]}, 422, "query: Field required"),
    "query not a string": ("/v1/rerank", {"query": 3, "documents": ["a"]}, 422, "query: "),
    "document not a string": ("/v1/rerank", {"query": "q", "documents": ["a", 5]}, 422, "documents[1]: a document is"),
    "document without text": ("/v1/rerank", {"query": "q", "documents": [{"title": "a"}]}, 422, "documents[0]: "),
    "text not a string": ("/rerank", {"query": "q", "texts": [None]}, 422, "texts[0]: a document is"),
    "documents not a list": ("/v1/rerank", {"query": "q", "documents": "a"}, 422, "documents: "),
    "negative top_n": ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": -1}, 422, "top_n: "),
    "top_n as text": ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": "1"}, 422, "top_n: "),
    "top_n as a boolean": ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": True}, 422, "top_n: "),
    "return_documents as text": (
        "/v1/rerank",
        {"query": "q", "documents": ["a"], "return_documents": "yes"},
        422,
        "return_documents: ",
    ),
    "a first-stage score as text": (
        "/v1/rerank",
        {"query": "q", "documents": ["a", "b"], "first_stage_scores": [1, "2"]},
        422,
        "first_stage_scores[1]: ",
    ),
    "too many documents": ("/v1/rerank", {"query": "q", "documents": ["a"] * 121}, 413, "limit of 120"),
    "oversized body": ("/rerank", {"query": "q", "texts": ["a" * 2**20]}, 413, "body: "),
    "unknown route": ("/v1/embed", {"query": "q"}, 404, "Not Found"),
    "lone surrogate in a document": (
        "/v2/rerank",
        b'{"query": "q", "documents": ["a", {"text": "b\\udc00"}]}',
        422,
        "documents[1]: has a lone UTF-16 surrogate (\\udc00) at character 1",
    ),
    "lone surrogate in a field that is not scored": (
        "/v1/rerank",
        b'{"query": "q", "documents": [{"text": "ok", "m": "\\udc00"}], "return_documents": true}',
        422,
        "documents[0]: ['m']: has a lone UTF-16 surrogate (\\udc00) at character 0",
    ),
    "lone surrogate deep in an object": (
        "/v2/rerank",
        b'{"query": "q", "documents": [{"text": "ok", "m": {"deep": ["a", "\\ud800"]}}], "rank_fields": ["text"]}',
        422,
        "documents[0]: ['m']['deep'][1]: has a lone UTF-16 surrogate (\\ud800)",
    ),
    "lone surrogate in a key": (
        "/v1/rerank",
        b'{"query": "q", "documents": [{"text": "ok", "m\\ud800": 1}]}',
        422,
        "documents[0]: key 'm\\ud800': has a lone UTF-16 surrogate (\\ud800) at character 1",
    ),
    "NUL in a text": (
        "/rerank",
        b'{"query": "q", "texts": ["a\\u0000b"]}',
        422,
        "texts[0]: has a NUL character (\\u0000) at character 1",
    ),
    "NUL in the query": ("/rerank", {"query": "q\x00", "texts": ["a"]}, 422, "query: has a NUL character"),
    "a body that is not UTF-8": (
        "/v1/rerank",
        b'{"query": "caf\xe9", "documents": ["a"]}',
        400,
        "body: not UTF-8 text (invalid continuation byte at byte 14); a JSON body is UTF-8",
    ),
    "an empty body": ("/rerank", b"", 400, "body: empty; send a JSON object"),
    "JSON nested past the parser's depth": (
        "/rerank",
        b"[" * 100_000 + b"]" * 100_000,
        400,
        "body: not JSON this server can read (maximum recursion depth exceeded",
    ),
    "a number of 5,000 digits": (
        "/v1/rerank",
        b'{"query": "q", "documents": ["a"], "top_n": ' + b"9" * 5000 + b"}",
        400,
        "body: not JSON this server can read (Exceeds the limit (4300 digits) for integer string conversion",
    ),
    "a misspelt extension field": (
        "/v1/rerank",
        {"query": "q", "documents": ["a", "b"], "first_stage_score": [1, 2]},
        422,
        "body: unknown field 'first_stage_score': the extension's fields are first_stage_scores and first_stage",
    ),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_get_a_one_line_error_naming_the_field(server: str, case: str) -> None:
    path, body, status, expected = BAD_REQUESTS[case]
    if isinstance(body, bytes):
        body = ("application/json", body)
    if isinstance(body, tuple):  # the content type (None: none) and the bytes
        sent = {"content": body[1], "headers": {"content-type": body[0]} if body[0] else {}}
    else:
        sent = {"json": body}
    answer = httpx.post(f"{server}{path}", **sent)
    assert answer.status_code == status, answer.text
    error = answer.json()
    assert list(error) == ["error", "error_type"] and "\n" not in error["error"]
    assert expected in error["error"] and error["error_type"] == "validation"
    if case == "oversized body":  # refused by its length, unread: a client that reused the connection met an EOF
        assert answer.headers["connection"] == "close"


def test_utf8_is_checked_across_the_chunks_of_a_streamed_body(server: str) -> None:
    """A character split between two chunks is whole; a bad byte in a later chunk is named by its offset in the body."""
    text = '{"query": "caf\u00e9", "texts": ["na\u00efve"]}'.encode()
    cut = text.index(b"\xc3") + 1  # between the two bytes of the first é

    def chunks(body: bytes, at: int) -> Callable[[], Iterator[bytes]]:
        return lambda: iter([body[:at], body[at:]])

    whole = httpx.post(f"{server}/rerank", content=chunks(text, cut)(), headers={"content-type": "application/json"})
    assert whole.status_code == 200, whole.text
    bad = text.replace(b"na\xc3\xafve", b"na\xefve")  # ï as Latin-1 in the second chunk
    answer = httpx.post(f"{server}/rerank", content=chunks(bad, cut)(), headers={"content-type": "application/json"})
    assert answer.status_code == 400
    offset = bad.index(b"\xef")
    assert (
        answer.json()["error"]
        == f"body: not UTF-8 text (invalid continuation byte at byte {offset}); a JSON body is UTF-8"
    )


def test_an_oversized_body_without_a_length_is_refused_as_it_streams(server: str) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"query": "q", "texts": ["'
        for _ in range(20):
            yield b"a" * 2**16
        yield b'"]}'

    answer = httpx.post(f"{server}/rerank", content=chunks(), headers={"content-type": "application/json"})
    assert answer.status_code == 413
    assert answer.json() == {"error": f"body: over this server's limit of {2**20} bytes", "error_type": "validation"}
    assert httpx.post(f"{server}/rerank", json={"query": "q", "texts": ["a"]}).status_code == 200


class Poisoned:
    """A scorer that fails on any batch holding the token ``poison``."""

    def __init__(self, scorer, token: int) -> None:
        self.scorer, self.token, self.input_names = scorer, token, scorer.input_names

    def __call__(self, batch):
        if (batch["input_ids"] == self.token).any():
            raise RuntimeError("poisoned batch")
        return self.scorer(batch)


def test_a_backend_failure_is_a_500_for_that_request_and_the_server_goes_on(exported: Path, reference, call) -> None:
    reranker = Reranker.load(exported, backend="onnx", interpolation=False, max_batch_tokens=2**16)
    reranker.scorer = gate = Gated(Poisoned(reranker.scorer, reranker.tokenizer.convert_tokens_to_ids("poison")))
    query, passages = call
    with running(create_app(ServedModel(exported, reranker), HttpOptions(max_wait_ms=0))) as url:
        bad = {"query": query, "texts": ["a poison pill", *passages[:3]], "raw_scores": True}
        good = {"query": query, "texts": passages[:10], "raw_scores": True}
        with ThreadPoolExecutor(3) as pool:
            post = partial(httpx.post, f"{url}/rerank", timeout=60)
            first = pool.submit(post, json=good)  # its batch holds the gate while the other two queue
            assert gate.busy.wait(30)
            failed, fine = pool.submit(post, json=bad), pool.submit(post, json=good)
            wait_for(lambda: metric(url, "distill_queued_pairs") == 14)
            gate.release.set()  # the next round: one batch of both, which fails, then each request alone
            first, failed, fine = first.result(), failed.result(), fine.result()
        assert len(gate.sizes) == 4 and gate.sizes[1] == 14  # the shared batch, then each request's
        assert failed.status_code == 500
        assert failed.json() == {
            "error": "the backend failed on this request: RuntimeError: poisoned batch",
            "error_type": "backend",
        }
        raw = reference.score(query, passages[:10])
        for answer in (first, fine, httpx.post(f"{url}/rerank", json=good)):
            assert answer.status_code == 200
            assert {r["index"]: r["score"] for r in answer.json()} == {
                i: pytest.approx(s, abs=TOLERANCE) for i, s in enumerate(raw)
            }


def test_concurrent_requests_share_batches_and_keep_their_order(exported: Path, reference: Reranker, call) -> None:
    reranker = Reranker.load(exported, backend="onnx", interpolation=False, max_batch_tokens=2**16)
    reranker.scorer = gate = Gated(reranker.scorer)
    query, passages = call
    requests = [(f"{query} {i}", passages[7 * i : 7 * i + 10][:: 1 if i % 2 else -1]) for i in range(6)]
    with running(create_app(ServedModel(exported, reranker), HttpOptions(max_wait_ms=0))) as url:

        def post(request: tuple[str, list[str]]) -> list[float]:
            body = {"query": request[0], "documents": request[1], "raw_scores": True}
            results = httpx.post(f"{url}/v1/rerank", json=body, timeout=60).json()["results"]
            return [s for _, s in sorted((r["index"], r["relevance_score"]) for r in results)]

        with ThreadPoolExecutor(len(requests)) as pool:
            first = pool.submit(post, requests[0])  # its batch holds the gate while the others queue
            assert gate.busy.wait(30)
            rest = [pool.submit(post, request) for request in requests[1:]]
            wait_for(lambda: metric(url, "distill_queued_pairs") == 50)
            gate.release.set()
            answers = [future.result() for future in (first, *rest)]
        assert gate.sizes == [10, 50]
        for (q, documents), scores in zip(requests, answers, strict=True):
            assert scores == pytest.approx(reference.score(q, documents), abs=TOLERANCE)
        batches = metric(url, "distill_batch_requests_count")
        alone = metric(url, "distill_batch_requests_bucket", le="1.0")
        assert batches < len(requests) and alone < batches  # some batch held several requests' pairs
        assert metric(url, "distill_batch_pairs_sum") == 60
        assert metric(url, "distill_requests_total", route="/v1/rerank", code="200") == len(requests)
        assert metric(url, "distill_documents_total", route="/v1/rerank") == 60
        assert metric(url, "distill_queue_wait_seconds_count") == len(requests)


class Gated:
    """A scorer whose first batch waits for :attr:`release`, so that requests queue behind it; it records each
    batch's size."""

    def __init__(self, scorer) -> None:
        self.scorer, self.input_names = scorer, scorer.input_names
        self.takes_packed = getattr(scorer, "takes_packed", False)
        self.release, self.busy = threading.Event(), threading.Event()
        self.sizes: list[int] = []
        self.lengths: list[list[int]] = []
        self.kinds: set[str] = set()

    def __call__(self, batch):
        self.busy.set()
        self.release.wait(30)
        self.sizes.append(len(batch.lengths))
        self.lengths.append([int(n) for n in batch.lengths])
        self.kinds.add(type(batch).__name__)
        return self.scorer(batch)


def test_batcher_takes_requests_in_order_filling_the_budget(reference: Reranker, call) -> None:
    query, passages = call
    same = [passages[0]] * 5  # one length: the budget holds 8 of them
    encoded = [
        encode_pairs(reference.tokenizer, [query] * n, docs, 512) for n, docs in ((1, same[:1]), (5, same), (5, same))
    ]
    width = int(encoded[1].pair_lengths[0])
    scorer, stats = Gated(reference.scorer), []
    batcher = DynamicBatcher(scorer, reference.tokenizer, 8 * width, max_wait=0.0, on_batch=stats.append)
    first = batcher.submit(encoded[0])
    assert scorer.busy.wait(30)
    later = [batcher.submit(e) for e in encoded[1:]]  # queued while the backend is busy
    assert batcher.queued_pairs == 10
    scorer.release.set()
    results = [future.result(30) for future in (first, *later)]
    batcher.close()
    assert scorer.sizes == [1, 8, 2]  # the second request whole and the third's first 3, then the third's last 2
    assert [(s.pairs, s.requests) for s in stats] == [(1, 1), (8, 2), (2, 1)]
    assert all(isinstance(s, BatchStats) and s.padded_tokens == s.pairs * width for s in stats[1:])
    expected = reference.score(query, same)
    for result in results[1:]:
        assert result.scores.tolist() == pytest.approx(expected, abs=TOLERANCE)
    assert results[1].queue_wait >= results[2].queue_wait > 0  # both waited for the first batch; the second longer


def test_a_round_batches_the_queued_requests_pairs_by_length(reference: Reranker, call) -> None:
    """Requests queued together form a round: their pairs sorted by length across requests (less padding than each
    request's alone), batched by the budget, each batch's pairs grouped by request; the scores are the reranker's."""
    query, passages = call
    words = passages[0].split()
    texts = [[" ".join(words[:60]), " ".join(words[:4])], [" ".join(words[:30]), " ".join(words[:28])]]
    encoded = [encode_pairs(reference.tokenizer, [query] * 2, t, 512) for t in texts]
    (a_long, a_short), (b_long, b_short) = (e.pair_lengths.tolist() for e in encoded)
    scorer, stats = Gated(reference.scorer), []
    batcher = DynamicBatcher(scorer, reference.tokenizer, 2 * a_long, max_wait=0.0, on_batch=stats.append)
    first = batcher.submit(encode_pairs(reference.tokenizer, [query], passages[:1], 512))
    assert scorer.busy.wait(30)
    futures = [batcher.submit(e) for e in encoded]  # queued while the backend is busy: one round
    scorer.release.set()
    results = [future.result(30) for future in (first, *futures)]
    batcher.close()
    assert scorer.lengths[1:] == [[a_long, b_long], [b_short, a_short]]  # by length, not request by request
    assert [(s.pairs, s.requests) for s in stats[1:]] == [(2, 2), (2, 2)]
    for text, result in zip(texts, results[1:], strict=True):
        assert result.scores.tolist() == pytest.approx(reference.score(query, text), abs=TOLERANCE)


def test_rounds_keep_the_queue_first_in_first_out(reference: Reranker, call) -> None:
    """A round takes pairs from the head of the queue up to its tokens (at least a batch): a later request's longer
    pairs wait for the next round, however short the earlier request's are."""
    query, passages = call
    words = passages[0].split()
    short, long = [" ".join(words[:3])] * 3, [" ".join(words[:50])] * 3
    encoded = [encode_pairs(reference.tokenizer, [query] * 3, t, 512) for t in (short, long)]
    tokens = int(encoded[0].pair_lengths.sum())
    scorer = Gated(reference.scorer)
    batcher = DynamicBatcher(scorer, reference.tokenizer, 2**16, max_wait=0.0, round_tokens=tokens)
    first = batcher.submit(encode_pairs(reference.tokenizer, [query], passages[:1], 512))
    assert scorer.busy.wait(30)
    futures = [batcher.submit(e) for e in encoded]
    scorer.release.set()
    for future in (first, *futures):
        future.result(30)
    batcher.close()
    # the long request's round is its first batch, whole, though it holds more tokens than the round takes
    assert scorer.lengths[1:] == [encoded[0].pair_lengths.tolist(), encoded[1].pair_lengths.tolist()]


def test_a_request_over_a_round_runs_in_the_rerankers_batches(reference: Reranker, call) -> None:
    """A request too big for one round is taken a round of whole batches at a time: its batches are those of
    ``Reranker.score`` (none part-full but its last), however the round's tokens cut it."""
    from distill.core.batching import token_budget_batches

    query, passages = call
    encoded = encode_pairs(reference.tokenizer, [query] * 40, passages[:40], 512)
    budget = 400  # a round (ROUND_BATCHES budgets) under the request's 3,846 tokens
    expected = [len(b) for b in token_budget_batches(encoded.pair_lengths, budget)]
    scorer = Gated(reference.scorer)
    batcher = DynamicBatcher(scorer, reference.tokenizer, budget, max_wait=0.0)
    scorer.release.set()
    result = batcher.submit(encoded).result(30)
    batcher.close()
    assert batcher.round_tokens < int(encoded.pair_lengths.sum())  # several rounds
    assert scorer.sizes == expected
    assert result.scores.tolist() == pytest.approx(reference.score(query, passages[:40]), abs=TOLERANCE)


def test_a_round_waits_for_company_only_while_a_request_is_arriving(reference: Reranker, call) -> None:
    """A round that is not full waits (up to ``max_wait``) while the server has a request on its way, being
    tokenised; with none, a request alone is scored at once, however long the window."""
    query, passages = call
    encoded = [encode_pairs(reference.tokenizer, [query] * 3, passages[i : i + 3], 512) for i in (0, 3)]
    arriving, stats = [0], []
    batcher = DynamicBatcher(
        reference.scorer, reference.tokenizer, 2**16, 60.0, on_batch=stats.append, arriving=lambda: arriving[0]
    )
    try:
        batcher.submit(encoded[0]).result(10)  # nothing arriving: not a 60 s wait
        arriving[0] = 1
        first = batcher.submit(encoded[0])
        time.sleep(0.3)
        assert not first.done()  # waiting for the request on its way
        arriving[0] = 0
        second = batcher.submit(encoded[1])
        first.result(10), second.result(10)
    finally:
        batcher.close(10)
    assert [b.requests for b in stats] == [1, 2]


def test_batching_off_scores_one_request_at_a_time(reference: Reranker, call) -> None:
    """``distill serve --batching false``: each batch holds one request's pairs, in arrival order, without waiting."""
    from distill.serving.server import ServeConfig

    assert ServeConfig(model="m", batching=False).options.batching is False
    query, passages = call
    same = [passages[0]] * 5
    encoded = [encode_pairs(reference.tokenizer, [query] * len(t), t, 512) for t in (same[:1], same, same)]
    width = int(encoded[1].pair_lengths[0])
    scorer, stats = Gated(reference.scorer), []
    batcher = DynamicBatcher(scorer, reference.tokenizer, 8 * width, 10.0, on_batch=stats.append, share=False)
    first = batcher.submit(encoded[0])
    assert scorer.busy.wait(30)
    later = [batcher.submit(e) for e in encoded[1:]]
    scorer.release.set()
    results = [future.result(30) for future in (first, *later)]  # a 10 s window would time out: no wait
    batcher.close()
    assert scorer.sizes == [1, 5, 5] and all(s.requests == 1 for s in stats)
    for result in results[1:]:
        assert result.scores.tolist() == pytest.approx(reference.score(query, same), abs=TOLERANCE)


def test_a_whole_request_model_is_served_one_request_at_a_time(exported: Path, reference: Reranker) -> None:
    """A model that scores whole requests (the load benchmark's ``CrossEncoder.predict`` peer) behind the same app:
    one ``predict`` call per request, its scores the student's."""
    from benchmarks.crossencoder_peer import CrossEncoderLoop

    calls: list[int] = []

    class Recorded(CrossEncoderLoop):
        def predict(self, query: str, documents) -> np.ndarray:
            calls.append(len(documents))
            return super().predict(query, documents)

    documents = [["fleas jump", "a flea's life cycle lasts a year", "cats"], ["dogs", "e"], ["ff gg"] * 5]
    with running(create_app(ServedModel(exported, Recorded.load(exported)))) as url:
        with ThreadPoolExecutor(3) as pool:
            answers = list(
                pool.map(
                    lambda docs: httpx.post(f"{url}/rerank", json={"query": "q", "texts": docs, "raw_scores": True}),
                    documents,
                )
            )
        info = httpx.get(f"{url}/info").json()
        assert metric(url, "distill_batch_requests_sum") == metric(url, "distill_batch_requests_count") == 3
    for docs, answer in zip(documents, answers, strict=True):
        scores = [score for _, score in sorted((r["index"], r["score"]) for r in answer.json())]
        assert scores == pytest.approx(list(reference.score("q", docs)), abs=1e-4)  # torch against onnxruntime
    assert sorted(calls) == [2, 3, 5] and info["backend"] == CrossEncoderLoop.backend


def test_a_kept_alive_connection_is_answered_at_once(server: str) -> None:
    """The listening socket names TCP, so asyncio sets TCP_NODELAY on each connection: without it every answer after
    the first on a kept-alive connection waited ~40 ms (Nagle's algorithm against the client's delayed ACK)."""
    sock = bind("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP
    sock.close()
    times = []
    with httpx.Client(base_url=server) as client:
        client.get("/health")
        for _ in range(9):
            start = time.perf_counter()
            assert client.get("/health").status_code == 200
            times.append(time.perf_counter() - start)
    assert sorted(times)[4] < 0.03, times


def test_batcher_packs_the_batches_of_the_unpadded_encoder(exported: Path, call) -> None:
    reranker = Reranker.load(exported, backend="torch", unpad=True, interpolation=False)
    assert reranker.scorer.takes_packed
    query, passages = call
    texts = [passages[:1], passages[1:6], passages[6:9]]
    encoded = [encode_pairs(reranker.tokenizer, [query] * len(t), t, 512) for t in texts]
    scorer = Gated(reranker.scorer)
    batcher = DynamicBatcher(scorer, reranker.tokenizer, 2**16, max_wait=0.0)
    futures = [batcher.submit(encoded[0])]
    assert scorer.busy.wait(30)
    futures += [batcher.submit(e) for e in encoded[1:]]
    scorer.release.set()
    results = [future.result(30) for future in futures]
    batcher.close()
    assert scorer.sizes == [1, 8] and scorer.kinds == {"Packed"}
    for text, result in zip(texts, results, strict=True):
        assert result.scores.tolist() == pytest.approx(reranker.score(query, text), abs=TOLERANCE)


def test_batcher_fails_only_the_failing_request(reference: Reranker, call) -> None:
    query, passages = call
    poison = reference.tokenizer.convert_tokens_to_ids("poison")
    scorer = Gated(Poisoned(reference.scorer, poison))
    batcher = DynamicBatcher(scorer, reference.tokenizer, 2**16, max_wait=0.0)
    texts = [passages[:4], ["poison", *passages[4:6]], passages[6:9]]
    encoded = [encode_pairs(reference.tokenizer, [query] * len(t), t, 512) for t in texts]
    first = batcher.submit(encoded[0])
    assert scorer.busy.wait(30)
    bad, good = batcher.submit(encoded[1]), batcher.submit(encoded[2])
    scorer.release.set()
    assert first.result(30).scores.tolist() == pytest.approx(reference.score(query, texts[0]), abs=TOLERANCE)
    with pytest.raises(RuntimeError, match="poisoned batch"):
        bad.result(30)
    assert good.result(30).scores.tolist() == pytest.approx(reference.score(query, texts[2]), abs=TOLERANCE)
    assert batcher.submit(encoded[2]).result(30).scores.tolist() == pytest.approx(reference.score(query, texts[2]))
    batcher.close()


def test_health_info_metrics_and_openapi(exported: Path, server: str) -> None:
    assert httpx.get(f"{server}/health").json()["status"] == "ok"
    info = httpx.get(f"{server}/info").json()
    config = json.loads((exported / "config.json").read_text())
    card = json.loads((exported / "card.json").read_text())
    assert info["head"] == config["architectures"][0]
    assert info["backend"] == "onnx-fp32" and info["backend_reason"] == "named by --backend"
    assert info["quality_gate"]["backends"] == card["quality_gate"]["backends"]
    assert info["options"]["max_documents"] == 120 and info["settings"]["max_length"] == 512
    assert set(info["scores"]) == {"/v1/rerank", "/rerank"} and card["score_calibration"]
    assert info["scores"]["/rerank"].startswith("score = the calibrated probability of relevance")
    httpx.post(f"{server}/rerank", json={"query": "q", "texts": ["a", "b"]})
    assert metric(server, "distill_documents_total", route="/rerank") >= 2
    assert metric(server, "distill_tokens_total") > 0
    assert metric(server, "distill_request_seconds_count", route="/rerank") >= 1
    assert metric(server, "distill_in_flight_requests") == 1  # the /metrics request itself
    paths = httpx.get(f"{server}/openapi.json").json()["paths"]
    assert {"/v1/rerank", "/v2/rerank", "/rerank", "/health", "/info", "/metrics"} <= set(paths)


def test_info_names_the_backend_auto_chose_and_why(exported: Path) -> None:
    reranker = Reranker.load(exported, interpolation=False)
    with running(create_app(ServedModel(exported, reranker))) as url:
        info = httpx.get(f"{url}/info").json()
    card = json.loads((exported / "card.json").read_text())
    assert info["backend"] == reranker.backend and info["backend_reason"] == reranker.backend_reason != ""
    assert info["quality_gate"]["backend"] == card["quality_gate"]["backends"].get(reranker.backend)


def test_the_cli_refuses_a_missing_model_a_bad_limit_and_a_busy_port(exported: Path, capsys) -> None:
    assert main(["serve"]) == 2
    assert "error: missing required option(s): model" in capsys.readouterr().err
    assert main(["serve", "--model", str(exported), "--max_documents", "0"]) == 2
    assert "error: max_documents must be positive, got 0" in capsys.readouterr().err
    busy = bind("127.0.0.1", 0)
    busy.listen()
    try:
        assert main(["serve", "--model", str(exported), "--port", str(busy.getsockname()[1])]) == 2
    finally:
        busy.close()
    assert re.search(r"error: cannot listen on 127\.0\.0\.1:\d+: ", capsys.readouterr().err)


@pytest.mark.slow
def test_sigterm_finishes_requests_in_flight_and_refuses_new_ones(exported: Path, reference: Reranker, call) -> None:
    command = [sys.executable, "-m", "distill", "serve", "--model", str(exported), "--backend", "onnx", "--port", "0"]
    with serve_process(command) as (process, url):
        query, passages = call
        body = json.dumps({"query": query, "texts": passages[:10], "raw_scores": True}).encode()
        host, port = url.removeprefix("http://").rsplit(":", 1)
        # in flight when SIGTERM comes: its headers and half its body are sent, the rest after
        with socket.create_connection((host, int(port)), timeout=60) as slow:
            head = f"POST /rerank HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            slow.sendall(f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body[:20])
            wait_for(lambda: metric(url, "distill_in_flight_requests") == 2)  # it and this GET /metrics
            process.send_signal(signal.SIGTERM)
            wait_for(lambda: httpx.post(f"{url}/rerank", content=body).status_code == 503)
            refused = httpx.post(f"{url}/rerank", content=body)
            assert refused.json() == {"error": "the server is shutting down", "error_type": "unhealthy"}
            assert httpx.get(f"{url}/health").status_code == 503
            slow.sendall(body[20:])
            answer = b""
            while chunk := slow.recv(65536):
                answer += chunk
        status, _, payload = answer.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 200 ")
        raw = reference.score(query, passages[:10])
        assert {r["index"]: r["score"] for r in json.loads(payload)} == {
            i: pytest.approx(s, abs=TOLERANCE) for i, s in enumerate(raw)
        }
        assert process.wait(30) == 0


def test_sigterm_while_the_model_loads_is_one_line_and_the_signals_status(exported: Path) -> None:
    """A SIGTERM before the server listens (a deploy rolled back while the model loads): it ended the process
    without a word. In a fresh process, whose model load sends it."""
    script = f"""
import os, signal, sys, time
from distill.cli import main
from distill.serving.reranker import Reranker

def load(cls, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)

Reranker.load = classmethod(load)
sys.exit(main(["serve", "--model", {str(exported)!r}, "--port", "0"]))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGTERM, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == "distill serve: stopped by SIGTERM" and "Traceback" not in done.stderr


def test_a_text_cut_on_its_left_keeps_at_most_the_tokens_asked_and_its_end(tiny_bert: Path) -> None:
    """A cut inside a word tokenises into more pieces than the word held in the whole text: the pair's own
    truncation then cut the text's last tokens, the very ones ``truncation_direction: Left`` keeps."""
    tokenizer = load_tokenizer(tiny_bert)
    words = ["unbelievableness", "antidisestablishmentarianism", "flea", "xylophonist", "€uro", "naïve", "ca'nt"]
    rng = random.Random(0)
    for _ in range(200):
        text = " ".join(rng.choice(words) for _ in range(60)) + " zebra"
        tokens = rng.randint(3, 40)
        cut = _keep_last_tokens(tokenizer, text, tokens)
        ids = tokenizer(cut, add_special_tokens=False)["input_ids"]
        assert text.endswith(cut) and len(ids) <= tokens and cut.endswith("zebra")
        longer = text[: len(text) - len(cut)].rstrip()  # one word more than the cut kept is over the count
        assert (
            len(tokenizer(text[len(longer) - len(longer.split()[-1]) :], add_special_tokens=False)["input_ids"])
            > tokens
        )
