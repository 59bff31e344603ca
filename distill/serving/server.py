"""``distill serve``: a student's export behind Cohere's and text-embeddings-inference's rerank APIs.

The app is FastAPI's (:mod:`distill.serving.http_api`, which says why FastAPI) on uvicorn, one process: the model runs
on one worker thread fed by the dynamic batcher, so more processes would only split the CPU's cores between copies of
the model. On SIGTERM (or Ctrl-C) the server drains: new requests get 503, those in flight finish, then it exits
(exit status 0); at ``--graceful_timeout`` it cuts the requests still open and exits all the same, and a second
signal cuts them at once. A client that stalls holds nothing for long: a request's head and then its body must come
within ``--request_read_timeout`` (:func:`timed_h11`, and the app's gate).

On a CPU the server tokenises on one thread, while the backend runs a batch on every core: it sets
``TOKENIZERS_PARALLELISM=false`` (unless it is set already), so that the Rust tokenizer's own threads do not take
cores from the backend's (the docs' serving results page compares both settings). Where every model it serves scores
on a GPU, the host's cores are free, and the tokenizer keeps its parallel default (:func:`tokenizer_parallelism`).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from distill.core.config import REPEATABLE, options_of
from distill.core.schema import InputError
from distill.model.resolver import HUB_REPO
from distill.serving.http_gate import ServingState
from distill.serving.options import HttpOptions, ServingOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeConfig(ServingOptions, HttpOptions):
    """Options of ``distill serve``: serve a student over HTTP (Cohere's ``/v1/rerank``, TEI's ``/rerank``). How the
    student is served (backend, device, dtype, the batch budget that concurrent requests' pairs fill together, the
    levers) are :class:`~distill.serving.options.ServingOptions`' fields, and the server's batching window, limits
    and timeouts :class:`~distill.serving.options.HttpOptions`', each declared there once; ``auto`` is named with
    its reason by ``GET /info``. A request that sends first-stage scores is fused with the α of the first stage it
    names, else of ``first_stage`` (``interpolation``: ``false`` refuses such requests, a number fuses them all with
    it); one without is scored by the student alone."""

    model: list[str] | None = field(default=None, metadata={REPEATABLE: True})
    """The student (required): an export folder (``distill export``), a training run (its export), a Hugging Face
    folder (torch backend), or a hub id (``org/name``, at ``revision``) in or into the Hugging Face cache. Several
    students: ``--model NAME=PATH`` once each (or a YAML list), which a request's ``model`` picks by ``NAME`` (the
    first by default); a bare ``PATH`` is named by its last part, a bare hub id by itself (as clients send it)."""
    host: str = "127.0.0.1"
    """The address to listen on (``0.0.0.0``: every interface)."""
    port: int = 8080
    """The TCP port (0: any free port; the line the server prints names it)."""

    def __post_init__(self) -> None:
        if isinstance(self.model, str):
            object.__setattr__(self, "model", [self.model])
        if not self.model:
            raise InputError("serve: missing required option(s): model")
        names = [name for name, _ in self.models]
        if len(set(names)) < len(names):
            twice = next(name for name in names if names.count(name) > 1)
            raise InputError(f"serve: model: two models are named {twice!r}; name each one: --model NAME=PATH")
        if not 0 <= self.port < 65536:
            raise InputError(f"serve: port must be in 0..65535, got {self.port}")
        try:
            ServingOptions.__post_init__(self)
        except InputError as e:
            raise InputError(f"serve: {e}") from None
        HttpOptions.__post_init__(self)  # the batching window, the limits and the timeouts

    @property
    def models(self) -> list[tuple[str, str]]:
        """Each model's name and its folder or hub id, in order (the first is the default).

        Raises:
            InputError: ``NAME=PATH`` without the name or the path (and no such path).
        """
        named = []
        for entry in self.model or ():
            name, eq, where = entry.partition("=")
            if eq and "/" not in name and (not name or not where) and not Path(entry).exists():
                raise InputError(f"serve: model: {entry!r}: NAME=PATH needs a name and a path (or give a path alone)")
            if not eq or "/" in name or not name or not where:  # a bare path or hub id (which may hold "=")
                hub = not Path(entry).exists() and HUB_REPO.match(entry)
                name, where = entry if hub else entry.rstrip("/").rsplit("/", 1)[-1], entry
            named.append((name, where))
        return named

    @property
    def options(self) -> HttpOptions:
        return options_of(HttpOptions, self)


def bind(host: str, port: int, listen: bool = True) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free one) and, where ``listen``, listening, for uvicorn to
    serve on (a bound socket that does not listen yet refuses connections).

    Raises:
        InputError: the address cannot be bound (in use, not this machine's, ...).
    """
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        # the protocol too (IPPROTO_TCP, not 0): asyncio sets TCP_NODELAY only on sockets that name it, and without it
        # each answer on a kept-alive connection waits for Nagle's algorithm against the client's delayed ACK
        sock = socket.socket(family, kind, protocol)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        if listen:
            sock.listen(2048)  # connections queue from here on, before uvicorn starts: "listening on" is true
    except OSError as e:
        raise InputError(f"serve: cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


CUT_GRACE = 1.0
"""Seconds the requests cut at the drain's deadline have to end (their 503 sent), and then uvicorn's shutdown to close
the connections, before the server stops regardless (a client that reads no answer cannot hold it)."""


def timed_h11(read_timeout: float) -> type:
    """uvicorn's h11 protocol with a deadline for each request's head: a connection that has sent no complete head
    within ``read_timeout`` seconds of its opening, or of the head's first byte (between kept-alive requests, uvicorn's
    keep-alive timeout applies), is closed, after a 408 if part of a head came (one log line). The body's deadline is
    the app's (:class:`~distill.serving.http_gate.ServingState`'s options)."""
    import asyncio

    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.head_timer = self.loop.call_later(read_timeout, self._timed_out)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self._partial_head():
                self._disarm()
            elif self.head_timer is None:
                self.head_timer = self.loop.call_later(read_timeout, self._timed_out)

        def _partial_head(self) -> int:
            """The bytes of a request's head that h11 holds, incomplete (0: none)."""
            return len(self.conn.trailing_data[0]) if self.conn.their_state is h11.IDLE else 0

        def _disarm(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def _timed_out(self) -> None:
            self.head_timer = None
            answering = self.cycle is not None and not self.cycle.response_complete
            if self.transport.is_closing() or answering:
                return
            if partial := self._partial_head():
                client = f"{self.client[0]}:{self.client[1]}" if self.client else "unknown"
                log.warning(
                    "request read timeout: %s sent %d bytes of a request head, not a complete head, within %g s; "
                    "answered 408 and closed the connection",
                    client,
                    partial,
                    read_timeout,
                )
                self._answer_and_close(b"408 Request Timeout", f"request head: not complete within {read_timeout:g} s")
            else:
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to bytes h11 cannot parse as a request (its text/plain one), as this app's errors
            are: JSON with ``error`` and ``error_type``."""
            self._answer_and_close(b"400 Bad Request", "request head: not a valid HTTP/1.1 request")

        def _answer_and_close(self, status: bytes, message: str) -> None:
            """Write an error answer of ``status`` (``b"400 Bad Request"``) with ``message`` straight to the socket,
            outside h11's state (the request is past reading), and close the connection."""
            body = json.dumps({"error": message, "error_type": "validation"}).encode()
            self.transport.write(
                b"HTTP/1.1 "
                + status
                + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            self.transport.close()

    return TimedH11Protocol


def uvicorn_config(app: Any, **settings: Any) -> Any:
    """uvicorn's config for an app of :func:`~distill.serving.http_api.create_app`: h11 with the head's deadline of
    its options' ``request_read_timeout`` (:func:`timed_h11`), their ``keep_alive_timeout``, no access log, warnings
    only, and :data:`CUT_GRACE` for the connections left after a drain (``settings`` go to ``uvicorn.Config`` too)."""
    import uvicorn

    state: ServingState = app.state.serving
    return uvicorn.Config(
        app,
        **{
            "lifespan": "on",
            "access_log": False,
            "log_level": "warning",
            "http": timed_h11(state.options.request_read_timeout),
            "timeout_keep_alive": state.options.keep_alive_timeout,
            "timeout_graceful_shutdown": CUT_GRACE,
            **settings,
        },
    )


def drain_server(config: Any, state: ServingState) -> Any:
    """A uvicorn server that drains on SIGTERM or SIGINT (``state.draining``: the app answers new requests with
    503) and stops once no request is in flight, or once its options' ``graceful_timeout`` has passed: then it cuts
    the requests still open (:meth:`ServingState.cut`) and stops within :data:`CUT_GRACE`. A second signal brings
    that deadline to now; a third, once they are cut, stops it at once."""
    import time

    import uvicorn

    class DrainingServer(uvicorn.Server):
        deadline = float("inf")
        hurried = False  # a second signal brought the deadline forward

        def handle_exit(self, sig: int, frame: Any) -> None:
            if state.draining:  # the drain's deadline, now (not uvicorn's own exit: it ends in tracebacks)
                self.deadline, self.hurried = min(self.deadline, time.monotonic()), True
                if state.cutting:  # a third: stop at once
                    self.should_exit = self.force_exit = True
                return
            state.draining = True
            self.deadline = time.monotonic() + state.options.graceful_timeout
            log.warning(
                "draining: new requests get 503; %d in flight, cut after %g s (--graceful_timeout)",
                state.in_flight,
                state.options.graceful_timeout,
            )

        async def on_tick(self, counter: int) -> bool:
            if state.draining:
                late = time.monotonic() - self.deadline
                if state.in_flight == 0 or late >= CUT_GRACE:
                    self.should_exit = True
                elif late >= 0 and not state.cutting:
                    if self.hurried:
                        why, cut = "a second signal", state.cut("a second signal cut its drain short")
                    else:
                        why = f"drain deadline: {state.options.graceful_timeout:g} s passed (--graceful_timeout)"
                        cut = state.cut()
                    log.warning("%s; cut %d request(s) in flight", why, cut)
            return await super().on_tick(counter)

    return DrainingServer(config)


def tokenizer_parallelism(devices: list[str]) -> str:
    """``TOKENIZERS_PARALLELISM`` for models scoring on ``devices`` (torch device names; a backend that reports none
    runs on the CPU): ``true`` where every one is a GPU, else ``false``."""
    return "true" if devices and all(device.startswith("cuda") for device in devices) else "false"


def freeze_loaded_heap() -> int:
    """Collect the garbage, then move every object alive to the collector's permanent generation (``gc.freeze``):
    the objects the runtimes, the model and the tokenizer made as they loaded, hundreds of thousands. Python's full
    collection scans every object it tracks while it holds the interpreter, so each stalled every request in flight
    for as long as that scan of the loaded heap took; frozen, a full collection scans only what requests have left
    since. Returns the number of objects frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def serve(config: ServeConfig) -> None:
    """Load the student, then serve it until SIGTERM or Ctrl-C (see the module's docstring)."""
    from distill.core.run_folder import student_folder
    from distill.serving.fusion import Fusion
    from distill.serving.http_api import ServedModel, create_app
    from distill.serving.reranker import Reranker

    local = [Path(where).exists() for _, where in config.models]
    if config.revision is not None and all(local):  # no hub id for it to pick a snapshot of
        student_folder(config.models[0][1], revision=config.revision)
    folders = [
        (name, student_folder(where, revision=None if here else config.revision))
        for (name, where), here in zip(config.models, local, strict=True)
    ]
    fusions = [Fusion.of(folder, config.interpolation, config.first_stage) for _, folder in folders]
    serving = replace(config.serving(), revision=None)  # each folder resolved: a hub id's to its snapshot
    sock = bind(config.host, config.port, listen=False)  # a bad address fails before a model loads
    try:
        models = [
            ServedModel(folder, Reranker.load(folder, serving, interpolation=False, first_stage=None), fusion, name)
            for (name, folder), fusion in zip(folders, fusions, strict=True)
        ]
        devices = [str(model.reranker.settings.get("device", "cpu")) for model in models]
        os.environ.setdefault("TOKENIZERS_PARALLELISM", tokenizer_parallelism(devices))  # read on each call
        for model in models:
            log.info("%s: warmed up on %d batch shapes", model.folder, model.reranker.warm_up())
        app = create_app(models, config.options)
        log.info("%d objects of the loaded heap frozen", freeze_loaded_heap())
        sock.listen(2048)  # only now: no connection waits on a model still loading or a runtime's first calls
        host, port = sock.getsockname()[:2]
        for model in models:
            reranker = model.reranker
            auto = f" (auto: {reranker.backend_reason})" if reranker.backend_reason else ""
            named = f"{model.name}: " if len(models) > 1 else ""
            print(f"distill serve: {named}{model.folder} on {reranker.backend}{auto}", file=sys.stderr)
        address = f"[{host}]" if ":" in host else host
        print(f"distill serve: listening on http://{address}:{port}", file=sys.stderr, flush=True)
        drain_server(uvicorn_config(app), app.state.serving).run(sockets=[sock])
    finally:
        sock.close()
