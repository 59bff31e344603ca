"""How a student is served, in two dataclasses: :class:`ServingOptions`, the options of
:meth:`Reranker.load <distill.serving.reranker.Reranker.load>`, ``distill rerank`` and ``distill serve`` (whose configs
extend it, so each flag is declared, documented and defaulted here once) and the methods ``distill bench`` times; and
:class:`HttpOptions`, the HTTP server's batching window, limits and timeouts, which ``distill serve``'s config
extends too."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal

from distill.core.config import options_of
from distill.core.schema import InputError
from distill.serving.scorers import TorchOptions

Backend = Literal["auto", "torch", "onnx", "torchscript", "openvino"]


@dataclass(frozen=True)
class RuntimeOptions:
    """Where a student's batches run and how large they are: what serving a student and timing it (``distill bench``,
    whose config extends this) share."""

    device: str = "auto"
    """``auto`` (CUDA where torch sees a GPU, else the CPU), ``cpu`` or ``cuda[:N]``."""
    threads: int = 0
    """Intra-op threads of the onnx and openvino backends (0: one per physical core); torch's are process-wide."""
    max_length: int | None = None
    """The longest pair in tokens (default: the model's, up to 512)."""
    max_batch_tokens: int | None = None
    """Padded tokens per batch (default :data:`~distill.core.devices.STUDENT_BATCH_TOKENS`: 1024 on a CPU, 32768 on a
    GPU, which takes a query's 100 candidates in one batch)."""

    def __post_init__(self) -> None:
        if self.max_length is not None and self.max_length < 1:
            raise InputError(f"max_length must be positive (leave it out for the model's), got {self.max_length}")
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise InputError(f"max_batch_tokens must be positive, got {self.max_batch_tokens}")
        if self.threads < 0:
            raise InputError(f"threads must be 0 (the runtime's default) or more, got {self.threads}")


@dataclass(frozen=True)
class ServingOptions(TorchOptions, RuntimeOptions):
    """The backend and its precision, tokenising ahead and the first-stage fusion, on top of where the batches run
    (:class:`RuntimeOptions`: ``device``, ``threads``, ``max_length``, ``max_batch_tokens``) and the torch backend's
    levers (:class:`~distill.serving.scorers.TorchOptions`: ``tf32``, ``compile``, ``cudnn_attention``, ``unpad``,
    ``cuda_graphs``)."""

    backend: Backend = "auto"
    """``auto``: the fastest backend and precision for this CPU (AMX: OpenVINO bf16 or int8; AVX-512 VNNI: int8;
    else fused fp32) or GPU (fp16) among the student's files, the installed runtimes and the precisions its export's
    quality gate passed (:mod:`distill.serving.auto`; the choice and why are logged and reported); or ``torch`` (the
    HF weights), ``onnx`` (onnxruntime), ``torchscript``, ``openvino`` (the ONNX files on OpenVINO, CPU only;
    ``pip install openvino``)."""
    revision: str | None = None
    """For a model named by its hub id (``org/name``): the branch, tag or commit (default ``main``)."""
    dtype: str | None = None
    """With a named backend: torch: float32 (default), float16 or bfloat16; onnx: float32 (``model.onnx``), float16
    (``model.fp16.onnx``) or int8 (``model.int8.onnx``); openvino: those and bfloat16 (``model.onnx`` computed in
    bf16); torchscript: float32. ``auto`` chooses it."""
    interpolation: bool | float | None = None
    """Fuse with the first stage, α · z(student) + (1 − α) · z(first stage): ``null`` as the student's card says
    (or with ``first_stage`` named, that first stage's α), ``true`` the card's α (chosen on validation), ``false``
    never, a number that α. ``distill serve`` fuses only the requests that send first-stage scores."""
    first_stage: str | None = None
    """The first stage whose candidates are reranked (``bm25``, ``splade``, ...): the fusion takes the α the student's
    card holds for it (each first stage's α is chosen on its own validation lists); an unknown name is refused, naming
    the card's. Default: the card's one first stage (a card with several needs one named to fuse); for ``distill
    serve``, the first stage of requests that name none."""
    overlap: int = 0
    """Tokenise in spans of this many pairs, the next span on a background thread while the current one is scored
    (0: all of a query's pairs first); any backend."""
    streams: int = 1
    """The openvino backend: batches that run at once, each on an inference stream of its own (OpenVINO's throughput
    mode: the cores are split between the streams, each batch runs on its share); ``distill serve``'s batcher then
    runs that many batches of a round at once. 1: one stream, every core on each batch (latency mode)."""

    def __post_init__(self) -> None:
        if self.backend == "auto" and self.dtype is not None:
            raise InputError(f"backend 'auto' chooses the dtype itself; dtype={self.dtype!r} needs a named backend")
        if self.overlap < 0:
            raise InputError(f"overlap is a number of pairs (0: off), not {self.overlap}")
        if self.streams < 1:
            raise InputError(f"streams must be at least 1, got {self.streams}")
        if self.streams > 1 and self.backend not in ("auto", "openvino"):
            raise InputError(f"streams {self.streams}: the openvino backend's option, not the {self.backend} backend's")
        RuntimeOptions.__post_init__(self)
        if self.interpolation is not None and not isinstance(self.interpolation, bool | int | float):
            raise InputError(
                f"interpolation: true, false or an alpha in [0, 1], not {self.interpolation!r} "
                f"({type(self.interpolation).__name__})"
            )
        if self.first_stage is not None and self.interpolation is not None and self.interpolation is not True:
            raise InputError(
                f"first_stage {self.first_stage!r} takes its alpha from the student's card: interpolation "
                f"{self.interpolation!r} says otherwise (leave it unset, or unset first_stage)"
            )

    @property
    def levers(self) -> TorchOptions:
        """The torch backend's levers alone."""
        return options_of(TorchOptions, self)

    def serving(self) -> ServingOptions:
        """These options alone, as :class:`ServingOptions` (from a config that extends it with its own fields)."""
        return options_of(ServingOptions, self)


API_KEY_ENV = "CIS_DISTILL_API_KEY"
"""The environment variable that gives the API key where ``api_key`` is not set."""
ORIGIN = re.compile(r"^https?://[^/?#\s]+$")
"""A browser origin: a scheme and a host (with its port), nothing after."""


@dataclass(frozen=True)
class HttpOptions:
    """The HTTP server's batching window, the limits of a request and its timeouts (``distill serve``'s options of the
    same names; :func:`~distill.serving.http_api.create_app` takes them)."""

    max_wait_ms: float = 5.0
    """How long a round that is not full waits for requests being tokenised (ms; 0: never), from its oldest request's
    arrival; a request alone is scored at once."""
    max_documents: int = 1000
    """The most documents a request may send; more is a 413 naming the limit."""
    max_tokens_per_doc: int | None = None
    """Cut each document to this many tokens (default: what the model's pair length leaves after the query); a
    request without truncation gets a 413 naming the limit instead."""
    max_body_bytes: int = 16 * 2**20
    """The largest request body in bytes; larger is a 413."""
    batching: bool = True
    """Concurrent requests share batches; ``false``: one request at a time, in arrival order (each batched as
    ``Reranker.score`` batches it), the load benchmark's baseline."""
    gather_while_busy: bool = False
    """On a GPU (the torch backend on CUDA), a round taken while a batch is on the device waits for the requests
    being tokenised until the device is about to be free, instead of taking what is queued at once: fewer, larger
    batches. A lever to measure (``benchmarks/gpu_serve_levers.sh``), off by default."""
    request_read_timeout: float = 10.0
    """Seconds a client has to send a request's head (from its connection or its first byte) and then its body (from
    the head): a body not complete in time gets a 408 and the connection is closed, a head not complete in time the
    connection closed (after a 408 if part of it came); each is one line in the log."""
    keep_alive_timeout: float = 75.0
    """Seconds a kept-alive connection may idle between requests before the server closes it. Keep it above the idle
    timeout of a proxy or load balancer in front (nginx's upstream ``keepalive_timeout`` and AWS's ALB: 60 s; Google
    Cloud's load balancer: 600 s): else the proxy can send a request on a connection the server is closing, and
    answer it with a 502."""
    graceful_timeout: float = 40.0
    """Seconds the drain on SIGTERM waits for the requests in flight (new ones get 503) before it cuts those still
    open (a 503 to each not yet answered) and the process exits 0. The default is a request read within
    ``request_read_timeout`` and then scored at ``max_documents`` documents of the model's longest pairs on a
    two-core CPU, with a few seconds to spare (``docs/serving.md`` gives the figures): raise it with the documents or
    on a slower machine, lower it under an orchestrator that kills sooner."""

    max_queued_requests: int = 256
    """The most rerank requests admitted at once (being read, queued or scored); one more gets a 429 with
    ``Retry-After``, so that overload shows as refusals a client can back off from, not as growing latency."""
    api_key: str | None = None
    """The bearer token every route but ``/health`` requires (``Authorization: Bearer <key>``); a missing or wrong
    one gets a 401. Default: ``$CIS_DISTILL_API_KEY`` where it is set, else no authentication. Whitespace around it
    (a key read from a file ends in a newline) is not part of it."""
    cors_allow_origin: list[str] | None = None
    """Origins a browser may call the server from (``["https://app.example.com"]``, or ``["*"]``); CORS preflights
    are answered for them. Default: none (a preflight gets 405)."""

    def __post_init__(self) -> None:
        if self.max_wait_ms < 0:
            raise InputError(f"serve: max_wait_ms must be >= 0, got {self.max_wait_ms}")
        if self.api_key is not None and not self.api_key.strip():
            raise InputError("serve: api_key is empty: give a key, or leave it out for no authentication")
        if self.api_key is None and API_KEY_ENV in os.environ and not os.environ[API_KEY_ENV].strip():
            raise InputError(
                f"serve: ${API_KEY_ENV} is set but empty: give it a key, or unset it for no authentication"
            )
        given = (
            ("api_key", self.api_key) if self.api_key is not None else (f"${API_KEY_ENV}", os.environ.get(API_KEY_ENV))
        )
        if given[1] is not None and re.search(r"\s", given[1].strip()):
            raise InputError(f"serve: {given[0]} holds whitespace, which no bearer token can: give a key without it")
        for origin in self.cors_allow_origin or ():
            if origin != "*" and not ORIGIN.match(origin):
                raise InputError(
                    f"serve: cors_allow_origin {origin!r} is not an origin: a scheme and a host, such as "
                    "https://app.example.com (no path), or *"
                )
        for name in ("max_documents", "max_tokens_per_doc", "max_body_bytes", "request_read_timeout",
                     "keep_alive_timeout", "max_queued_requests"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise InputError(f"serve: {name} must be positive, got {value}")
        if self.graceful_timeout < 0:
            raise InputError(f"serve: graceful_timeout must be >= 0, got {self.graceful_timeout}")
