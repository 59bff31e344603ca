"""``distill serve``: a student's export behind Cohere's and text-embeddings-inference's rerank APIs.

The app is FastAPI's (:mod:`distill.serving.http_api`, which says why FastAPI) on uvicorn, one process: the model runs
on one worker thread fed by the dynamic batcher, so more processes would only split the CPU's cores between copies of
the model. On SIGTERM (or Ctrl-C) the server drains: new requests get 503, those in flight finish, then it exits
(exit status 0); a second signal stops it at once.

The server tokenises on one thread, while the backend runs a batch on every core: it sets
``TOKENIZERS_PARALLELISM=false`` (unless it is set already), so that the Rust tokenizer's own threads do not take
cores from the backend's. In the load benchmark (``benchmarks/results/serve-cpu-tokenizers-parallel-{true,false}``:
10 documents a request, 8 clients, a 2-core AVX-512 EPYC) the batched server answered 23.9 queries/s with them, at
38 µs of backend time a padded token, and 25.7 without, at 35 µs.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

from distill.core.schema import InputError
from distill.serving.http_api import ServerOptions, ServingState
from distill.serving.options import ServingOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeConfig(ServingOptions):
    """Options of ``distill serve``: serve a student over HTTP (Cohere's ``/v1/rerank``, TEI's ``/rerank``). How the
    student is served (backend, device, dtype, the batch budget that concurrent requests' pairs fill together, the
    levers) are :class:`~distill.serving.options.ServingOptions`' fields, declared there once; ``auto`` is named with
    its reason by ``GET /info``. Requests carry no first-stage scores, so ``interpolation`` must stay unset."""

    model: str | None = None
    """The student (required): an export folder (``distill export``), a training run (its export), or a Hugging Face
    folder (torch backend)."""
    host: str = "127.0.0.1"
    """The address to listen on (``0.0.0.0``: every interface)."""
    port: int = 8080
    """The TCP port (0: any free port; the line the server prints names it)."""
    max_wait_ms: float = ServerOptions.max_wait_ms
    """How long a round that is not full waits for requests being tokenised (ms; 0: never); a request alone is
    scored at once."""
    max_documents: int = ServerOptions.max_documents
    """The most documents a request may send; more is a 413 naming the limit."""
    max_tokens_per_doc: int | None = ServerOptions.max_tokens_per_doc
    """Cut each document to this many tokens (default: what the model's pair length leaves after the query); a
    request without truncation gets a 413 naming the limit instead."""
    max_body_bytes: int = ServerOptions.max_body_bytes
    """The largest request body in bytes; larger is a 413."""
    batching: bool = ServerOptions.batching
    """Concurrent requests share batches; ``false``: one request at a time, in arrival order (each batched as
    ``Reranker.score`` batches it), the load benchmark's baseline."""

    def __post_init__(self) -> None:
        if not self.model:
            raise InputError("serve: missing required option(s): model")
        if not 0 <= self.port < 65536:
            raise InputError(f"serve: port must be in 0..65535, got {self.port}")
        if self.interpolation:
            raise InputError("serve: interpolation needs first-stage scores, which requests do not carry")
        try:
            super().__post_init__()
        except InputError as e:
            raise InputError(f"serve: {e}") from None
        self.options  # noqa: B018  (checks the batching window and the limits)

    @property
    def options(self) -> ServerOptions:
        return ServerOptions(
            self.max_wait_ms, self.max_documents, self.max_tokens_per_doc, self.max_body_bytes, self.batching
        )


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free one) and listening, for uvicorn to serve on.

    Raises:
        InputError: the address cannot be bound (in use, not this machine's, ...).
    """
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        # the protocol too (IPPROTO_TCP, not 0): asyncio sets TCP_NODELAY only on sockets that name it, and without it
        # each answer on a kept-alive connection waited ~40 ms (Nagle's algorithm against the client's delayed ACK)
        sock = socket.socket(family, kind, protocol)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # connections queue from here on, before uvicorn starts: "listening on" is true when printed
    except OSError as e:
        raise InputError(f"serve: cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def drain_server(config: Any, state: ServingState) -> Any:
    """A uvicorn server that drains on SIGTERM or SIGINT (``state.draining``: the app answers new requests with
    503) and stops once no request is in flight; a second signal stops it at once."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if state.draining:
                super().handle_exit(sig, frame)
                self.force_exit = True
                return
            state.draining = True
            log.warning("draining: new requests get 503; %d in flight", state.in_flight)

        async def on_tick(self, counter: int) -> bool:
            if state.draining and state.in_flight == 0:
                self.should_exit = True
            return await super().on_tick(counter)

    return DrainingServer(config)


def serve(config: ServeConfig) -> None:
    """Load the student, then serve it until SIGTERM or Ctrl-C (see the module's docstring)."""
    import uvicorn

    from distill.core.run_folder import student_folder
    from distill.serving.http_api import create_app
    from distill.serving.reranker import Reranker

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # read by the tokenizer on each call (see above)
    options = config.options
    folder = student_folder(config.model, exported=config.backend != "torch")
    sock = bind(config.host, config.port)
    try:
        reranker = Reranker.load(folder, config.serving(), interpolation=False)
        app = create_app(folder, reranker, options)
        host, port = sock.getsockname()[:2]
        auto = f" (auto: {reranker.backend_reason})" if reranker.backend_reason else ""
        print(f"distill serve: {folder} on {reranker.backend}{auto}", file=sys.stderr)
        address = f"[{host}]" if ":" in host else host
        print(f"distill serve: listening on http://{address}:{port}", file=sys.stderr, flush=True)
        uvicorn_config = uvicorn.Config(app, lifespan="on", access_log=False, log_level="warning")
        drain_server(uvicorn_config, app.state.serving).run(sockets=[sock])
    finally:
        sock.close()
