"""``distill serve`` against clients that misbehave: a request whose head or body stalls (408, and the drain's deadline
on SIGTERM), a client that leaves while its request is scored (cancelled before its next batch), text that is no
text (422) and a body that is not JSON (415). The server is the tiny random BERT on the torch backend: these tests
need a server, not a good model."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from distill.serving.batcher import DynamicBatcher
from distill.serving.encoding import encode_pairs
from distill.serving.http_api import ServedModel, create_app
from distill.serving.options import HttpOptions
from distill.serving.reranker import Reranker
from distill.serving.server import CUT_GRACE, ServeConfig
from tests.distill.serving.test_http_api import Gated, metric, running, serve_process, wait_for


@pytest.fixture(scope="module")
def tiny(tiny_bert: Path) -> Reranker:
    return Reranker.load(tiny_bert, backend="torch", interpolation=False)


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def post_head(host: str, path: str, length: int, content_type: str = "application/json") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def read_answer(sock: socket.socket) -> tuple[int, dict | list, bytes]:
    """One HTTP answer from ``sock``: its status, its JSON body, and its head."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before an answer: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed mid-answer"
        rest += chunk
    assert len(rest) == length, "more than one answer"
    return int(head.split(b" ", 2)[1]), json.loads(rest), head


def closed(sock: socket.socket, seconds: float = 10) -> bool:
    """Whether the peer closes ``sock`` (and sends nothing more) within ``seconds``."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def sample(url: str, name: str, **labels: str) -> float:
    """A metric's value, 0 while it has no sample."""
    try:
        return metric(url, name, **labels)
    except AssertionError:
        return 0.0


def timeouts(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "request read timeout" in r.getMessage()]


def test_the_timeouts_are_options_of_distill_serve() -> None:
    config = ServeConfig(model="m", request_read_timeout=2.5, graceful_timeout=7)
    assert (config.options.request_read_timeout, config.options.graceful_timeout) == (2.5, 7)
    defaults = HttpOptions()
    assert defaults.graceful_timeout > defaults.request_read_timeout > 0
    from distill.core.schema import InputError

    with pytest.raises(InputError, match="serve: request_read_timeout must be positive, got 0"):
        ServeConfig(model="m", request_read_timeout=0)
    with pytest.raises(InputError, match="serve: graceful_timeout must be >= 0, got -1"):
        ServeConfig(model="m", graceful_timeout=-1)
    assert ServeConfig(model="m", keep_alive_timeout=90).options.keep_alive_timeout == 90
    with pytest.raises(InputError, match="serve: keep_alive_timeout must be positive, got 0"):
        ServeConfig(model="m", keep_alive_timeout=0)


def test_a_stalled_body_gets_a_408_and_one_log_line(tiny_bert: Path, tiny: Reranker, caplog) -> None:
    caplog.set_level(logging.WARNING)
    body = json.dumps({"query": "q", "texts": ["a", "b"]}).encode()
    with running(create_app(ServedModel(tiny_bert, tiny), HttpOptions(request_read_timeout=1.0))) as url:
        host, port = address(url)
        with socket.create_connection((host, port), timeout=10) as sock:
            start = time.monotonic()
            sock.sendall(post_head(host, "/rerank", len(body)) + body[:10])
            status, error, head = read_answer(sock)
            waited = time.monotonic() - start
            assert closed(sock)
        # a body that comes in parts within the timeout is read
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(post_head(host, "/rerank", len(body)) + body[:10])
            time.sleep(0.2)
            sock.sendall(body[10:])
            assert read_answer(sock)[0] == 200
    assert status == 408 and b"connection: close" in head.lower()
    assert error == {
        "error": f"body: not complete within 1 s (10 of {len(body)} bytes came)",
        "error_type": "validation",
    }
    assert 1 <= waited < 5
    (line,) = timeouts(caplog)
    assert "POST /rerank" in line and "not complete within 1 s" in line and "\n" not in line


def test_a_stalled_head_gets_a_408_and_a_silent_connection_is_closed(tiny_bert: Path, tiny: Reranker, caplog) -> None:
    caplog.set_level(logging.WARNING)
    with running(create_app(ServedModel(tiny_bert, tiny), HttpOptions(request_read_timeout=0.5))) as url:
        host, port = address(url)
        with (
            socket.create_connection((host, port), timeout=10) as partial,
            socket.create_connection((host, port), timeout=10) as silent,
        ):
            partial.sendall(head := b"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Ty")
            status, error, _ = read_answer(partial)
            assert closed(partial) and closed(silent)
        with socket.create_connection((host, port), timeout=10) as kept:  # idle between requests past the timeout
            for _ in range(2):
                kept.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                answered, health, _ = read_answer(kept)
                assert answered == 200 and health["status"] == "ok"
                time.sleep(1.0)  # uvicorn's keep-alive timeout (5 s) applies here, not the head's
    assert status == 408 and error == {"error": "request head: not complete within 0.5 s", "error_type": "validation"}
    (line,) = timeouts(caplog)  # the silent connection is closed without a line
    assert f"sent {len(head)} bytes of a request head" in line


def test_bytes_that_are_no_http_request_get_a_json_400_and_a_closed_connection(tiny_bert: Path, tiny: Reranker) -> None:
    with running(create_app(ServedModel(tiny_bert, tiny), HttpOptions())) as url:
        host, port = address(url)
        for head in (
            b"GARBAGE\r\n\r\n",
            f"POST /rerank HTTP/1.1\r\nHost: {host}\r\nContent-Length: abc\r\n\r\n".encode(),
        ):
            with socket.create_connection((host, port), timeout=10) as client:
                client.sendall(head)
                status, error, answer = read_answer(client)  # uvicorn's own was text/plain
                assert closed(client)
            assert status == 400 and b"content-type: application/json" in answer.lower()
            assert error == {"error": "request head: not a valid HTTP/1.1 request", "error_type": "validation"}
        assert httpx.get(f"{url}/health").status_code == 200  # the server serves on


@pytest.mark.slow
def test_sigterm_cuts_a_stalled_request_at_the_drain_deadline_and_exits_0(tiny_bert: Path) -> None:
    """The slowloris case: a client sends its head and half its body, then stalls; another half a head. On SIGTERM
    the server drains, and at ``--graceful_timeout`` it cuts the stalled request (503) and exits 0, though the read
    timeout is far off."""
    deadline = 2.0
    command = [sys.executable, "-m", "distill", "serve", "--model", str(tiny_bert), "--backend", "torch"]
    command += ["--port", "0", "--graceful_timeout", str(deadline), "--request_read_timeout", "600"]
    with serve_process(command) as (process, url):
        host, port = address(url)
        body = json.dumps({"query": "q", "texts": ["a", "b"]}).encode()
        with (
            socket.create_connection((host, port), timeout=30) as slow,
            socket.create_connection((host, port), timeout=30) as half_head,
        ):
            slow.sendall(post_head(host, "/rerank", len(body)) + body[:10])
            half_head.sendall(b"POST /rerank HTTP/1.1\r\nHost: x\r\n")
            wait_for(lambda: metric(url, "distill_in_flight_requests") == 2)  # it and this GET /metrics
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            wait_for(lambda: httpx.get(f"{url}/health").status_code == 503)
            status, error, _ = read_answer(slow)
            cut = time.monotonic() - signalled
            assert closed(slow) and closed(half_head)
        assert process.wait(30) == 0
        exited = time.monotonic() - signalled
        log = process.stderr.read()
    assert status == 503 and error == {
        "error": "the server is shutting down: its drain deadline passed",
        "error_type": "unhealthy",
    }
    assert deadline <= cut < deadline + 2
    assert exited < deadline + CUT_GRACE + 3, exited
    assert len(re.findall(r"drain deadline: 2 s passed \(--graceful_timeout\); cut 1 request\(s\) in flight", log)) == 1
    assert "Traceback" not in log


@pytest.mark.slow
def test_a_second_ctrl_c_stops_a_draining_server_at_once_without_a_traceback(tiny_bert: Path) -> None:
    """A request stalls in flight, so the drain after a first Ctrl-C waits on it; a second Ctrl-C cuts it at once
    (long before ``--graceful_timeout``: a 503) and the server stops, exit status 0, a line saying so, no traceback."""
    command = [sys.executable, "-m", "distill", "serve", "--model", str(tiny_bert), "--backend", "torch"]
    command += ["--port", "0", "--graceful_timeout", "600", "--request_read_timeout", "600"]
    with serve_process(command) as (process, url):
        host, port = address(url)
        body = json.dumps({"query": "q", "texts": ["a", "b"]}).encode()
        with socket.create_connection((host, port), timeout=30) as slow:
            slow.sendall(post_head(host, "/rerank", len(body)) + body[:10])
            wait_for(lambda: metric(url, "distill_in_flight_requests") == 2)  # it and this GET /metrics
            process.send_signal(signal.SIGINT)
            wait_for(lambda: httpx.get(f"{url}/health").status_code == 503)
            process.send_signal(signal.SIGINT)
            signalled = time.monotonic()
            status, error, _ = read_answer(slow)
            assert process.wait(30) == 0
            stopped = time.monotonic() - signalled
        log = process.stderr.read()
    assert stopped < CUT_GRACE + 3, stopped
    assert status == 503 and error["error"] == "the server is shutting down: a second signal cut its drain short"
    assert "a second signal; cut 1 request(s) in flight" in log
    assert "Traceback" not in log and "interrupted" not in log


def test_a_request_whose_client_has_gone_is_cancelled_before_its_next_batch(tiny_bert: Path, call, caplog) -> None:
    """A client sends a big request and leaves while its first batch runs: its other batches are not scored, and
    the next client's small request runs right after that batch."""
    caplog.set_level(logging.INFO)
    reranker = Reranker.load(tiny_bert, backend="torch", interpolation=False, max_batch_tokens=512)
    reranker.scorer = gate = Gated(reranker.scorer)
    query, passages = call
    big = json.dumps({"query": query, "texts": passages[:60], "truncate": True}).encode()
    with running(create_app(ServedModel(tiny_bert, reranker), HttpOptions(max_wait_ms=0))) as url:
        host, port = address(url)
        with socket.create_connection((host, port), timeout=30) as leaving:
            leaving.sendall(post_head(host, "/rerank", len(big)) + big)
            assert gate.busy.wait(30)  # its first batch runs, and holds the gate
        wait_for(lambda: sample(url, "distill_requests_total", route="/rerank", code="499") == 1)
        assert metric(url, "distill_queued_pairs") == 0  # its rows still queued are dropped
        with ThreadPoolExecutor(1) as pool:
            small = pool.submit(httpx.post, f"{url}/rerank", json={"query": query, "texts": passages[:2]}, timeout=30)
            wait_for(lambda: metric(url, "distill_queued_pairs") == 2)
            gate.release.set()
            answer = small.result()
        assert answer.status_code == 200 and len(answer.json()) == 2
    first = gate.sizes[0]
    assert first < 60 and gate.sizes == [first, 2]  # the big request's first batch, then the small one's
    assert any(
        re.fullmatch(r"client gone: POST /rerank from \S+ cancelled after \S+ s", r.getMessage())
        for r in caplog.records
    )


def test_a_client_that_leaves_while_sending_its_body_is_counted_gone_not_a_500(
    tiny_bert: Path, tiny: Reranker, call, caplog
) -> None:
    """Starlette's ClientDisconnect, an empty message, reached the 400 handler through FastAPI: an IndexError's
    traceback, counted as a 500."""
    caplog.set_level(logging.INFO)
    query, passages = call
    body = json.dumps({"query": query, "texts": passages[:20]}).encode()
    with running(create_app(ServedModel(tiny_bert, tiny), HttpOptions())) as url:
        host, port = address(url)
        with socket.create_connection((host, port), timeout=30) as leaving:
            leaving.sendall(post_head(host, "/rerank", len(body)) + body[:100])
        wait_for(lambda: sample(url, "distill_requests_total", route="/rerank", code="499") == 1)
        assert sample(url, "distill_requests_total", route="/rerank", code="500") == 0
        assert httpx.post(f"{url}/rerank", json={"query": query, "texts": passages[:2]}).status_code == 200
    messages = [r.getMessage() for r in caplog.records]
    assert any(re.fullmatch(r"client gone: POST /rerank from \S+ left while sending its body", m) for m in messages)
    assert not any(r.exc_info for r in caplog.records)


def test_the_batcher_drops_a_cancelled_request(tiny: Reranker, call) -> None:
    """A request cancelled while queued, or between its batches, is scored no further; the others are."""
    query, passages = call
    encode = lambda texts: encode_pairs(tiny.tokenizer, [query] * len(texts), texts, 512)  # noqa: E731
    scorer, stats = Gated(tiny.scorer), []
    batcher = DynamicBatcher(scorer, tiny.tokenizer, 512, max_wait=0.0, on_batch=stats.append, round_tokens=512)
    try:
        first = batcher.submit(encode(passages[:40]))  # several rounds of batches
        assert scorer.busy.wait(30)
        queued = batcher.submit(encode(passages[40:45]))
        kept = batcher.submit(encode(passages[45:47]))
        assert first.cancel() and queued.cancel()
        assert batcher.queued_pairs == 2
        scorer.release.set()
        assert kept.result(30).scores.shape == (2,)
    finally:
        batcher.close(30)
    assert len(scorer.sizes) == 2 and scorer.sizes[1] == 2
    assert sum(s.pairs for s in stats) == scorer.sizes[0] + 2


def test_invalid_text_gets_a_422_and_the_connection_serves_on(tiny_bert: Path, tiny: Reranker, caplog) -> None:
    bad = {
        b'{"query": "flea \\ud800", "documents": ["a"]}': "query: has a lone UTF-16 surrogate (\\ud800) at character 5",
        b'{"query": "q", "documents": ["a", "b\\u0000"]}': "documents[1]: has a NUL character (\\u0000) at character 1",
        b'{"query": "q", "documents": [{"text": "\\udfff"}], "return_documents": true}': (
            "documents[0]: has a lone UTF-16 surrogate (\\udfff) at character 0"
        ),
    }
    good = json.dumps({"query": "q", "documents": ["a", "b"]}).encode()
    with running(create_app(ServedModel(tiny_bert, tiny))) as url:
        host, port = address(url)
        with socket.create_connection((host, port), timeout=30) as sock:  # one kept-alive connection throughout
            for body, expected in bad.items():
                sock.sendall(post_head(host, "/v1/rerank", len(body)) + body)
                status, error, _ = read_answer(sock)
                assert status == 422 and error["error"].startswith(expected), error
            sock.sendall(post_head(host, "/v1/rerank", len(good)) + good)
            status, answer, _ = read_answer(sock)
    assert status == 200 and len(answer["results"]) == 2
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("text/plain", 415),
        (None, 415),
        ("application/x-www-form-urlencoded", 415),
        ("application/json; charset=utf-8", 200),
        ("application/vnd.api+json", 200),
    ],
)
def test_a_body_that_is_not_json_gets_a_415(tiny_bert: Path, tiny: Reranker, content_type, status) -> None:
    body = json.dumps({"query": "q", "texts": ["a"]}).encode()
    with running(create_app(ServedModel(tiny_bert, tiny))) as url, httpx.Client(base_url=url) as client:
        headers = {"content-type": content_type} if content_type else {}
        answer = client.post("/rerank", content=body, headers=headers)
        assert answer.status_code == status, answer.text
        if status == 415:
            media = content_type.split(";")[0] if content_type else None
            expected = f"content-type: {media} is not JSON" if media else "content-type: missing"
            assert answer.json() == {"error": f"{expected}; send application/json", "error_type": "validation"}
        assert client.post("/rerank", json={"query": "q", "texts": ["a"]}).status_code == 200  # the same connection


def test_a_compressed_body_gets_a_415_naming_its_encoding(tiny_bert: Path, tiny: Reranker) -> None:
    """Read as plain text, a gzip body was a 400 about its bytes, and a ``br`` body that was text was scored."""
    import gzip

    body = json.dumps({"query": "q", "texts": ["a"]}).encode()
    with running(create_app(ServedModel(tiny_bert, tiny))) as url, httpx.Client(base_url=url) as client:
        json_type = {"content-type": "application/json"}
        for encoding, sent in (("gzip", gzip.compress(body)), ("br", body), ("GZIP, identity", gzip.compress(body))):
            answer = client.post("/rerank", content=sent, headers={**json_type, "content-encoding": encoding})
            assert answer.status_code == 415, answer.text
            expected = f"content-encoding: {encoding.lower()} is not supported; send the body uncompressed"
            assert answer.json() == {"error": expected, "error_type": "validation"}
        with httpx.Client(base_url=url) as client:  # a refusal before the body closes its connection: a new one
            assert client.post(
                "/rerank", content=body, headers={**json_type, "content-encoding": "identity"}
            ).is_success


def test_a_body_framed_by_both_length_and_chunks_gets_a_400_and_a_closed_connection(
    tiny_bert: Path, tiny: Reranker
) -> None:
    """RFC 9112 6.3: a proxy that frames the body by one header and this server by the other would disagree on where
    the next request starts (request smuggling)."""
    with running(create_app(ServedModel(tiny_bert, tiny))) as url:
        host, port = address(url)
        body = b'{"query": "q", "texts": ["a"]}'
        chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(
                post_head(host, "/rerank", len(body)).replace(b"\r\n\r\n", b"\r\nTransfer-Encoding: chunked\r\n\r\n")
            )
            sock.sendall(chunked)
            status, error, head = read_answer(sock)
            assert (status, error["error"]) == (
                400,
                "content-length and transfer-encoding: both sent; a body is framed by one of them",
            )
            assert b"connection: close" in head.lower() and closed(sock)


def test_a_target_in_absolute_form_is_served_as_its_path(tiny_bert: Path, tiny: Reranker) -> None:
    """RFC 9112 3.2.2: a server takes ``POST http://host/rerank`` (a forward proxy's form) as ``/rerank``; uvicorn
    handed the whole URL on as the path, which no route matched (404)."""
    with running(create_app(ServedModel(tiny_bert, tiny))) as url:
        host, port = address(url)
        body = b'{"query": "q", "texts": ["a", "b"]}'
        with socket.create_connection((host, port), timeout=10) as sock:
            for target in (f"{url}/rerank", f"HTTPS://{host}:{port}/rerank?x=1", "http://other.example/rerank"):
                sock.sendall(post_head(host, target, len(body)) + body)
                status, answer, _ = read_answer(sock)
                assert status == 200 and sorted(r["index"] for r in answer) == [0, 1], (target, answer)
            sock.sendall(f"GET http://{host}:{port}/health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            assert read_answer(sock)[0] == 200
            sock.sendall(f"GET http://{host}:{port} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())  # the root, /
            assert read_answer(sock)[0] == 404
        assert metric(url, "distill_requests_total", route="/rerank", code="200") == 3


def test_health_answers_head_requests(tiny_bert: Path, tiny: Reranker) -> None:
    with running(create_app(ServedModel(tiny_bert, tiny))) as url:
        answer = httpx.head(f"{url}/health")
        assert answer.status_code == 200 and answer.content == b""


def test_an_idle_kept_alive_connection_is_closed_after_the_keep_alive_timeout(tiny_bert: Path, tiny: Reranker) -> None:
    """Not after uvicorn's fixed 5 s: a proxy that keeps idle connections longer (nginx, cloud load balancers: 60 s
    and more) would reuse one the server is closing and answer 502."""
    assert HttpOptions().keep_alive_timeout > 60
    body = b'{"query": "q", "texts": ["a"]}'
    for timeout, still_open_after in ((0.5, None), (6.0, 5.5)):
        with running(create_app(ServedModel(tiny_bert, tiny), HttpOptions(keep_alive_timeout=timeout))) as url:
            host, port = address(url)
            with socket.create_connection((host, port), timeout=10) as sock:
                sock.sendall(post_head(host, "/rerank", len(body)) + body)
                assert read_answer(sock)[0] == 200
                if still_open_after is None:
                    assert closed(sock, 3)
                else:  # past uvicorn's 5 s, the connection still serves
                    time.sleep(still_open_after)
                    sock.sendall(post_head(host, "/rerank", len(body)) + body)
                    assert read_answer(sock)[0] == 200


def test_the_drain_deadline_cuts_a_stalled_request_with_a_503(tiny_bert: Path, tiny: Reranker) -> None:
    """``ServingState.cut``, as the drain calls it at its deadline: a request stalled in its body is cancelled and
    answered 503, and its connection closed."""
    body = json.dumps({"query": "q", "texts": ["a", "b"]}).encode()
    app = create_app(ServedModel(tiny_bert, tiny), HttpOptions(request_read_timeout=600))
    state = app.state.serving

    async def cut() -> int:
        return state.cut()

    with running(app) as url:
        host, port = address(url)
        with socket.create_connection((host, port), timeout=30) as slow:
            slow.sendall(post_head(host, "/rerank", len(body)) + body[:10])
            wait_for(lambda: len(state.open) == 1)
            loop = next(iter(state.open)).get_loop()
            assert asyncio.run_coroutine_threadsafe(cut(), loop).result(10) == 1
            status, error, _ = read_answer(slow)
            assert closed(slow)
        wait_for(lambda: not state.open and state.in_flight == 0)
    assert (status, error) == (
        503,
        {"error": "the server is shutting down: its drain deadline passed", "error_type": "unhealthy"},
    )


async def _cut_at(turns: int) -> list[dict] | None:
    """A rerank request whose client sent the first 10 bytes of its body (already in the server's buffer, as they
    are once it has read them) and then stalls, cut by the drain's deadline after ``turns`` turns of the event loop;
    the ASGI messages the client got, or None where the request was not yet open at the cut. Fails if the request
    has not ended 2 s after the cut."""
    from distill.serving.http_gate import Gate, Metrics, ServingState

    async def body_reader(scope: dict, receive: Any, send: Any) -> None:  # a route that reads the whole body first
        while (await receive()).get("more_body", False):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"scored"})

    stalled = asyncio.Event()
    chunks = iter([{"type": "http.request", "body": b'{"query": ', "more_body": True}])

    async def client() -> dict:
        if (chunk := next(chunks, None)) is not None:
            return chunk
        await stalled.wait()  # never set: the rest of the body never comes
        raise AssertionError("unreachable")

    sent: list[dict] = []

    async def sink(message: dict) -> None:
        sent.append(message)

    state = ServingState(HttpOptions(request_read_timeout=600))
    gate = Gate(body_reader, state, Metrics())
    headers = [(b"content-type", b"application/json"), (b"content-length", b"40")]
    scope = {"type": "http", "method": "POST", "path": "/rerank", "headers": headers, "client": ("127.0.0.1", 9)}
    request = asyncio.ensure_future(gate(scope, client, sink))
    for _ in range(turns):
        await asyncio.sleep(0)
    if state.cut() == 0:
        request.cancel()
        return None
    done, _ = await asyncio.wait({request}, timeout=2)
    assert done, f"cut after {turns} turns: the request still waits for its body"
    return sent


def test_the_drain_deadline_cuts_a_request_whatever_it_is_waiting_on() -> None:
    """The cut reaches the request at every point of its reading of the body, including the turn where the chunk it
    waits for comes with the cancellation (where ``asyncio.wait_for`` on Python 3.11 returns the chunk and drops the
    cancellation): each time a 503, and the request ends."""
    cut = 0
    for turns in range(12):
        sent = asyncio.run(_cut_at(turns))
        if sent is None:
            continue
        cut += 1
        assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [503], (turns, sent)
    assert cut >= 8
