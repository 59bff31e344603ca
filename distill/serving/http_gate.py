"""The gate in front of ``distill serve``'s routes, and the state and metrics it shares with them.

:class:`Gate` is plain ASGI middleware: it sees every request before FastAPI reads it, so that it can refuse one
without reading its body (503 while draining, 401 without the API key, 415 for a rerank body that is not JSON, 413
over the size limit, 429 past the queue's bound), hold the body it admits to the size limit and the read timeout
(413, 408), cancel a route whose client has left, and count each request's status and latency in :class:`Metrics`.
:class:`ServingState` is what the server's shutdown reads and sets (:mod:`distill.serving.server`).
"""

from __future__ import annotations

import asyncio
import codecs
import hmac
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from distill.serving.batcher import BatchStats
from distill.serving.options import API_KEY_ENV, HttpOptions

log = logging.getLogger(__name__)

ROUTES = ("/v1/rerank", "/v2/rerank", "/rerank", "/health", "/metrics", "/info")
"""The routes the metrics name; any other path counts as ``other``."""


@dataclass
class ServingState:
    """What the server's shutdown reads and sets (:mod:`distill.serving.server`)."""

    options: HttpOptions = field(default_factory=HttpOptions)
    """The app's options (the server reads its timeouts here)."""
    draining: bool = False
    """Set on SIGTERM: new requests get 503."""
    in_flight: int = 0
    """Requests being answered."""
    reranking: int = 0
    """Rerank requests admitted and not yet answered (bounded by ``max_queued_requests``)."""
    cutting: bool = False
    """Set by :meth:`cut`: the drain's deadline has passed."""
    cut_because: str = "its drain deadline passed"
    """Why the requests were cut, as the 503 that answers them says it (set by :meth:`cut`)."""
    open: set[asyncio.Task] = field(default_factory=set)
    """The tasks that run the routes of the requests in flight."""

    def cut(self, because: str = "its drain deadline passed") -> int:
        """Cut every request in flight (the drain's deadline has passed, or a second signal brought it forward,
        ``because``): each route's task is cancelled, and a request not yet answered gets a 503 that says why; how
        many were cut. Called on the event loop."""
        self.cutting, self.cut_because = True, because
        for task in self.open:
            task.cancel()
        return len(self.open)


class Metrics:
    """The Prometheus metrics of one app, in a registry of its own (``GET /metrics``)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        powers = tuple(float(2**i) for i in range(11))
        self.requests = Counter(
            "distill_requests", "HTTP requests, by route and status code", ["route", "code"], registry=r
        )
        self.latency = Histogram(
            "distill_request_seconds",
            "Time to answer a request, by route",
            ["route"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.documents = Counter("distill_documents", "Documents scored, by route", ["route"], registry=r)
        self.tokens = Counter(
            "distill_tokens", "Tokens scored: each pair's query, document and special tokens", registry=r
        )
        self.truncated = Counter("distill_truncated_documents", "Documents cut to the token limit", registry=r)
        self.tokenize = Histogram("distill_tokenize_seconds", "Time to tokenise a request", registry=r)
        self.queue_wait = Histogram(
            "distill_queue_wait_seconds", "Time from a request's arrival in the queue to its first batch", registry=r
        )
        self.batch_pairs = Histogram("distill_batch_pairs", "Pairs per batch", registry=r, buckets=powers)
        self.batch_requests = Histogram(
            "distill_batch_requests",
            "Requests whose pairs a batch held",
            registry=r,
            buckets=(1, 2, 3, 4, 6, 8, 16, 32),
        )
        self.batch_tokens = Histogram(
            "distill_batch_padded_tokens",
            "Padded tokens per batch (pairs x longest pair)",
            registry=r,
            buckets=tuple(float(2**i) for i in range(4, 18)),
        )
        self.batch_seconds = Histogram("distill_batch_seconds", "The backend's time per batch", registry=r)
        self.in_flight = Gauge("distill_in_flight_requests", "Requests being answered", registry=r)
        self.queued = Gauge("distill_queued_pairs", "Pairs waiting for a batch", registry=r)

    def observe_batch(self, stats: BatchStats) -> None:
        self.batch_pairs.observe(stats.pairs)
        self.batch_requests.observe(stats.requests)
        self.batch_tokens.observe(stats.padded_tokens)
        self.batch_seconds.observe(stats.seconds)
        self.tokens.inc(stats.tokens)


def error_type(status: int) -> str:
    """TEI's ``error_type`` of an error status: ``overloaded`` (429), ``unhealthy`` (503), ``backend`` (other 5xx) or
    ``validation`` (other 4xx, as TEI names a request it refuses)."""
    return {429: "overloaded", 503: "unhealthy"}.get(status, "backend" if status >= 500 else "validation")


def error_response(status: int, message: str) -> JSONResponse:
    body = {"error": " ".join(message.split()), "error_type": error_type(status)}
    return JSONResponse(body, status_code=status)


JSON_ROUTES = ("/v1/rerank", "/v2/rerank", "/rerank")
"""The routes whose POST bodies are JSON: another media type is a 415."""
OPEN_ROUTES = ("/health",)
"""The routes that need no API key: an orchestrator's probes carry none."""
CLIENT_GONE = 499
"""The status (nginx's "client closed request") a request whose client left before its answer is counted under."""
RETRY_AFTER_S = 1
"""``Retry-After`` of a 429: a batch round lasts well under a second, so a second later the queue has moved."""


def api_key(options: HttpOptions) -> str | None:
    """The key the server requires: ``options.api_key``, else ``$CIS_DISTILL_API_KEY``, else None (no auth); without
    the whitespace around it (a key read from a file ends in a newline)."""
    return (options.api_key or os.environ.get(API_KEY_ENV) or "").strip() or None


def _open(scope: dict[str, Any]) -> bool:
    """Whether a request needs no key: a route of :data:`OPEN_ROUTES`, or an ``OPTIONS`` request (a browser's CORS
    preflight carries no credentials; without ``cors_allow_origin`` it gets the app's 405, as with no key)."""
    return scope["path"] in OPEN_ROUTES or scope["method"] == "OPTIONS"


def _authorised(headers: dict[bytes, bytes], key: str) -> bool:
    """Whether the request's ``Authorization`` header is ``Bearer <key>`` (compared in constant time)."""
    given = headers.get(b"authorization", b"").decode("latin-1")
    scheme, _, token = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


def _not_json(headers: dict[bytes, bytes]) -> str | None:
    """Why a body's ``content-type`` is not JSON, in one line naming the header; None for ``application/json`` (or
    a ``+json`` type, as FastAPI reads them)."""
    value = headers.get(b"content-type")
    if value is None:
        return "content-type: missing; send application/json"
    media = value.decode("latin-1").split(";", 1)[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return None
    return f"content-type: {media or 'empty'} is not JSON; send application/json"


def _encoded(headers: dict[bytes, bytes]) -> str | None:
    """Why a body's ``content-encoding`` cannot be read, in one line naming the header; None for none (or
    ``identity``). Read as plain text, a gzip body would be a 400 about its bytes, and a ``br`` body that happened
    to be text would be scored as sent."""
    value = headers.get(b"content-encoding", b"").decode("latin-1").strip().lower()
    if value in ("", "identity"):
        return None
    return f"content-encoding: {value} is not supported; send the body uncompressed"


def _closing(status: int, message: str) -> JSONResponse:
    """:func:`_error`, and the connection closed after it."""
    response = error_response(status, message)
    response.headers["connection"] = "close"
    return response


class _Exchange:
    """One request through :class:`Gate`: the route runs in a task of its own, and reads the body through
    :meth:`receive`, which holds it to the size limit and the read timeout; once the body is read, a watch waits for
    the client to leave, and cancels the route if it leaves before its answer (so that the batcher skips the
    request's batches still to run). The drain's deadline cancels the route too (:meth:`ServingState.cut`)."""

    def __init__(self, gate: Gate, scope: dict, receive: Callable[[], Awaitable[dict]], send: Any) -> None:
        self.gate, self.scope, self._receive, self._send = gate, scope, receive, send
        self.length = dict(scope["headers"]).get(b"content-length", b"").decode("latin-1")
        self.start = time.perf_counter()
        self.deadline = asyncio.get_running_loop().time() + gate.read_timeout
        self.status = 500
        self.started = False
        self.answered = False
        self.received = 0
        self.utf8 = (
            codecs.getincrementaldecoder("utf-8")()
            if scope["method"] == "POST" and scope["path"] in JSON_ROUTES
            else None
        )
        """Checks a JSON body's bytes as they come: JSON is UTF-8 text."""
        self.body_read = False
        self.gone = False
        self.task: asyncio.Task | None = None
        self.watch: asyncio.Task | None = None

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status, self.started = message["status"], True
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.answered = True
        await self._send(message)

    async def receive(self) -> dict:
        """The next message of the request: its body within the size limit (413) and the read timeout (408); once
        the body is read, what comes next (the client's leaving)."""
        if self.body_read:
            return await self._receive()
        left = self.deadline - asyncio.get_running_loop().time()
        try:
            message = await asyncio.wait_for(self._receive(), max(left, 0.0))
            if self.gate.state.cutting:
                # The cut's cancellation came with this message: asyncio.wait_for (before Python 3.12) then returns
                # the message and drops the cancellation, and the route would wait for the rest of a stalled body.
                raise asyncio.CancelledError
        except asyncio.TimeoutError:
            timeout = self.gate.read_timeout
            came = f"{self.received} of {self.length or 'unknown'} bytes came"
            log.warning(
                "request read timeout: %s %s from %s: the body was not complete within %g s (%s); answered 408 and "
                "closed the connection",
                self.scope["method"],
                self.scope["path"],
                client_address(self.scope),
                timeout,
                came,
            )
            raise HTTPException(
                408, f"body: not complete within {timeout:g} s ({came})", headers={"connection": "close"}
            ) from None
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.gate.max_body_bytes:
                raise HTTPException(413, f"body: over this server's limit of {self.gate.max_body_bytes} bytes")
            if self.utf8 is not None:
                self._check_utf8(message.get("body", b""), not message.get("more_body", False))
            if not message.get("more_body", False):
                self.body_read = True
                self.watch = asyncio.ensure_future(self._watch())
        return message

    def _check_utf8(self, chunk: bytes, last: bool) -> None:
        """Feed the body's next ``chunk`` to the UTF-8 check; a byte that is no UTF-8 is a 400 naming its offset."""
        assert self.utf8 is not None
        before = self.received - len(chunk) - len(self.utf8.getstate()[0])  # the offset of the decoder's input
        try:
            self.utf8.decode(chunk, final=last)
        except UnicodeDecodeError as e:
            raise HTTPException(
                400, f"body: not UTF-8 text ({e.reason} at byte {before + e.start}); a JSON body is UTF-8"
            ) from None

    async def _watch(self) -> None:
        """Wait for the client to leave; if it leaves before its answer is sent, cancel the route."""
        message = await self._receive()
        if message["type"] == "http.disconnect" and not self.answered and self.task and not self.task.done():
            self.gone = True
            self.task.cancel()

    async def run(self, app: Any) -> None:
        """Run the route; a route cancelled because the client left ends without an answer (status 499 in the
        metrics), one cut by the drain's deadline gets a 503 if it has no answer yet."""
        state = self.gate.state
        self.task = asyncio.ensure_future(app(self.scope, self.receive, self.send))
        state.open.add(self.task)
        try:
            await self.task
        except asyncio.CancelledError:
            if self.gone:
                self.status = CLIENT_GONE
                log.info(
                    "client gone: %s %s from %s cancelled after %.1f s",
                    self.scope["method"],
                    self.scope["path"],
                    client_address(self.scope),
                    time.perf_counter() - self.start,
                )
            elif state.cutting:
                if not self.started:
                    await _closing(503, f"the server is shutting down: {state.cut_because}")(
                        self.scope, self._receive, self.send
                    )
            else:
                raise
        finally:
            state.open.discard(self.task)
            if self.watch is not None:
                self.watch.cancel()


def client_address(scope: dict) -> str:
    """``host:port`` of the request's client (``unknown`` where the server does not say)."""
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "unknown"


def origin_form(scope: dict) -> dict:
    """``scope`` of a request whose target is in absolute form (``POST http://host:8080/rerank``, as a forward proxy
    sends it), with the target's path alone: RFC 9112 3.2.2 has a server take that form, and uvicorn hands the whole
    URL on as the path, which no route matches."""
    path = scope["path"].split("://", 1)[1].partition("/")[2]
    raw = bytes(scope.get("raw_path") or b"").split(b"://", 1)[-1].partition(b"/")[2]
    return {**scope, "path": "/" + path, "raw_path": b"/" + raw}


class Gate:
    """ASGI middleware in front of the routes: 503 while draining, 400 for a body framed by both its length and a
    transfer encoding, 415 for a rerank body that is not JSON or is compressed, 413 for a
    body over the limit, 408 for a body not complete within the read timeout, a request cancelled once its client has
    gone and cut at the drain's deadline (:class:`_Exchange`), and each request's count, status and latency in the
    metrics."""

    def __init__(self, app: Any, state: ServingState, metrics: Metrics) -> None:
        self.app, self.state, self.metrics = app, state, metrics
        self.max_body_bytes = state.options.max_body_bytes
        self.read_timeout = state.options.request_read_timeout
        self.max_queued = state.options.max_queued_requests
        self.api_key = api_key(state.options)

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"][:8].lower().startswith(("http://", "https://")):
            scope = origin_form(scope)
        route = scope["path"] if scope["path"] in ROUTES else "other"
        exchange = _Exchange(self, scope, receive, send)
        length = exchange.length
        self.state.in_flight += 1
        self.metrics.in_flight.inc()
        headers = dict(scope["headers"])
        reranks = scope["method"] == "POST" and route in JSON_ROUTES
        # a refusal sent before the body is read ends the connection (the body's bytes would come next on it), and
        # says so, so that a client does not send its next request there
        refuse = _closing if length not in ("", "0") or b"transfer-encoding" in headers else error_response
        admitted = False
        try:
            if self.state.draining:
                await _closing(503, "the server is shutting down")(scope, receive, exchange.send)
            elif b"content-length" in headers and b"transfer-encoding" in headers:
                # RFC 9112 6.3: a proxy and this server could frame such a body apart (request smuggling)
                framed = "content-length and transfer-encoding: both sent; a body is framed by one of them"
                await _closing(400, framed)(scope, receive, exchange.send)
            elif self.api_key and not _open(scope) and not _authorised(headers, self.api_key):
                refusal = refuse(401, "authorization: a missing or wrong bearer token (Authorization: Bearer <key>)")
                refusal.headers["www-authenticate"] = "Bearer"
                await refusal(scope, receive, exchange.send)
            elif reranks and (wrong := _not_json(headers) or _encoded(headers)):
                await refuse(415, wrong)(scope, receive, exchange.send)
            elif length.isdigit() and int(length) > self.max_body_bytes:
                limit = f"over this server's limit of {self.max_body_bytes} bytes"
                await refuse(413, f"body: {int(length)} bytes, {limit}")(scope, receive, exchange.send)
            elif reranks and self.state.reranking >= self.max_queued:
                queued = self.state.reranking
                busy = refuse(429, f"busy: {queued} requests queued, this server's limit (max_queued_requests)")
                busy.headers["retry-after"] = str(RETRY_AFTER_S)
                await busy(scope, receive, exchange.send)
            else:
                admitted = reranks
                self.state.reranking += admitted
                await exchange.run(self.app)
        finally:
            self.state.reranking -= admitted
            self.state.in_flight -= 1
            self.metrics.in_flight.dec()
            self.metrics.requests.labels(route, str(exchange.status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - exchange.start)
