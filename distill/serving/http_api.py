"""The HTTP API of ``distill serve``: Cohere's and text-embeddings-inference's rerank routes over one reranker.

FastAPI on Starlette: the request bodies are pydantic v2 models (:mod:`distill.serving.http_schemas`), so one
declaration validates each request and gives the OpenAPI schema (``/openapi.json``, ``/docs``), and Starlette's ASGI
lets a plain middleware see every request (to drain on shutdown, cap the body, count metrics) before FastAPI reads
it. ``distill serve`` runs the app on uvicorn (:mod:`distill.serving.server`).

Routes:

- ``POST /v1/rerank`` (and ``/v2/rerank``, where Cohere's ``ClientV2`` posts): Cohere's request (``query``,
  ``documents`` as strings or ``{"text": ...}`` objects, as Jina's, ``top_n``, ``return_documents``,
  ``max_tokens_per_doc``) and response (``results: [{index, relevance_score, document?}]``, ``id``, ``meta``, and
  Jina's ``usage``). ``relevance_score`` is normalised: the export's calibrated probability of relevance
  (:mod:`distill.serving.calibration`; the plain sigmoid for a fused score or a folder without a calibration), in
  (0, 1) as Cohere's are (``raw_scores: true``, as Infinity takes it, gives the raw score). Documents too long for
  the model are cut, as Cohere does, unless ``truncate: false``.
- ``POST /rerank``: TEI's request (``query``, ``texts``, ``truncate``, ``raw_scores``, ``return_text``) and response
  (``[{index, score, text?}]``, best first). ``score`` is the normalised score, as Cohere's route gives it, unless
  ``raw_scores``, as in TEI; a text too long for the model is a 413 unless ``truncate: true`` (TEI's default).
- ``GET /health``, ``GET /metrics`` (Prometheus), ``GET /info`` (the model, its head, the backend and why ``auto``
  chose it, the export's quality gate, the limits).

A raw score is the student's output for the pair, the value :meth:`Reranker.score
<distill.serving.reranker.Reranker.score>` gives; a request that sends ``first_stage_scores`` (an extension of both
APIs) gets the fused score ``α · z(student) + (1 − α) · z(first stage)`` instead, with the α of the first stage it
names in ``first_stage`` (:class:`~distill.serving.fusion.Fusion`), and is ranked by it. Requests are tokenised on
a thread (off the event loop) and scored by a :class:`~distill.serving.batcher.DynamicBatcher`, which batches
concurrent requests' pairs together.

Every refused request gets a 4xx and a one-line ``{"error": "..."}`` naming the field or the limit: 400 for a body
that is not JSON, 408 for a body not complete within the read timeout (the connection is then closed), 415 for a
rerank body whose content type is not JSON, 422 for a field that is wrong (an empty query, a document that is not a
string, a negative ``top_n``, text with a lone UTF-16 surrogate or a NUL, first-stage scores that are not one
finite number per document or name an unknown first stage), 413 for a request over a limit (the body's bytes, the
documents, a document's tokens without truncation). A backend failure is a 500 for the requests it hit;
the server goes on. A request whose client disconnects before its answer is cancelled, and the batcher skips its
batches still to run. Once draining (SIGTERM), every new request gets a 503 while those in flight finish, until the
drain's deadline cuts those still open (:meth:`ServingState.cut`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect

from distill.core.files import read_json_object
from distill.core.interpolation import interpolate
from distill.core.schema import InputError
from distill.serving.auto import quality_gate
from distill.serving.batcher import DynamicBatcher, PredictLoop, WholeRequests
from distill.serving.calibration import ScoreCalibration, normalised, read_calibration
from distill.serving.encoding import Encoded, encode_pairs, token_count
from distill.serving.fusion import Fusion
from distill.serving.http_gate import (
    CLIENT_GONE,
    Gate,
    Metrics,
    ServingState,
    api_key,
    client_address,
    error_response,
)
from distill.serving.http_schemas import (
    ApiVersion,
    BilledUnits,
    CohereDocument,
    CohereMeta,
    CohereRequest,
    CohereResponse,
    CohereResult,
    ErrorBody,
    TeiRequest,
    TeiResult,
    Tokens,
    Usage,
)
from distill.serving.options import HttpOptions
from distill.serving.reranker import Reranker

log = logging.getLogger(__name__)


def score_meanings(calibrated: bool) -> dict[str, str]:
    """What each rerank route's scores are, for a model with a score calibration or without (``/info`` shows it;
    ``/v2/rerank`` is ``/v1/rerank``'s)."""
    normalised = (
        "the calibrated probability of relevance, in (0, 1) (of a request fused with first-stage scores: the "
        "sigmoid of the fused score)"
        if calibrated
        else "the sigmoid of the raw score, in (0, 1) (this model's export fitted no score calibration)"
    )
    return {
        "/v1/rerank": f"relevance_score = {normalised}; the raw score with raw_scores: true",
        "/rerank": f"score = {normalised}; the raw score with raw_scores: true (as TEI)",
    }


TIMING_HEADERS = ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time", "x-compute-tokens")
"""TEI's timing headers on every rerank answer: the request's milliseconds in all, tokenising, queued and scoring,
then its pairs' tokens (query, document and special tokens); a browser may read them where CORS allows."""


class JsonCors(CORSMiddleware):
    """Starlette's CORS middleware, whose refused preflight (400) is a JSON error body as every other error."""

    def preflight_response(self, request_headers: Any) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        refused = error_response(400, f"CORS preflight refused: {bytes(response.body).decode()}")
        refused.headers.update({k: v for k, v in response.headers.items() if k.lower().startswith("access-control")})
        return refused


class RequestError(InputError):
    """A request the server refuses: an HTTP status (4xx) and one line naming the field or the limit."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class BackendFailure(RuntimeError):
    """The backend failed on a batch that held this request's pairs."""


@dataclass(frozen=True)
class Truncation:
    """How a request's documents too long for the model are treated."""

    truncate: bool
    """Cut them (else a 413 names the limit)."""
    max_tokens_per_doc: int | None = None
    """The request's own cap on a document's tokens."""
    keep_end: bool = False
    """Keep a cut document's last tokens (TEI's ``truncation_direction: Left``), not its first."""


@dataclass(frozen=True)
class Scores:
    """A request's raw scores and what it cost."""

    raw: np.ndarray
    """``[documents]`` float32, in the request's order."""
    tokens: int
    """The pairs' tokens (query, document and special tokens)."""
    tokenize_s: float = 0.0
    """Seconds spent tokenising the request."""
    queue_s: float = 0.0
    """Seconds from its arrival in the batcher's queue to its first batch."""
    inference_s: float = 0.0
    """Seconds from its first batch to its last batch's end."""

    def timing_headers(self, total_s: float) -> dict[str, str]:
        """TEI's timing headers (:data:`TIMING_HEADERS`), in milliseconds, with the pairs' tokens."""
        ms = (total_s, self.tokenize_s, self.queue_s, self.inference_s)
        headers = {name: str(round(seconds * 1000)) for name, seconds in zip(TIMING_HEADERS, ms, strict=False)}
        return {**headers, TIMING_HEADERS[-1]: str(self.tokens)}


class RerankService:
    """Tokenises requests, one at a time, on a thread of its own (off the event loop) and scores them through a
    :class:`DynamicBatcher` (a :class:`~distill.serving.reranker.Reranker`), or a :class:`PredictLoop` (a model that
    scores whole requests)."""

    def __init__(self, reranker: Reranker | WholeRequests, options: HttpOptions, metrics: Metrics) -> None:
        self.reranker = reranker
        self.options = options
        self.metrics = metrics
        self.special = reranker.tokenizer.num_special_tokens_to_add(pair=True)
        # one thread: a fast tokenizer encodes a request's documents in parallel itself, and its Python path (a query
        # too long for the pair) sets the tokenizer's truncation, which concurrent calls must not share
        self.tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rerank-tokenize")
        self.arriving = 0
        """Requests being tokenised: a round of the batcher waits for company only while some are (a request alone
        would wait ``max_wait_ms`` for nothing), which also keeps their tokenising out of the backend's batches."""
        self.batcher: DynamicBatcher | PredictLoop
        if isinstance(reranker, Reranker):
            self.batcher = DynamicBatcher(
                reranker.scorer,
                reranker.tokenizer,
                reranker.max_batch_tokens,
                options.max_wait_ms / 1000,
                metrics.observe_batch,
                share=options.batching,
                arriving=lambda: self.arriving,
                gather_while_busy=options.gather_while_busy,
            )
        else:
            self.batcher = PredictLoop(reranker, metrics.observe_batch)

    def close(self) -> None:
        """Score what is queued, then stop the threads."""
        self.batcher.close()
        self.tokenizing.shutdown()

    async def score(self, query: str, documents: Sequence[str], cut: Truncation, field: str) -> Scores:
        """The raw scores of ``documents`` for ``query``, each document cut as ``cut`` says.

        Raises:
            RequestError: over :attr:`options`' limits (413), ``field`` named.
            BackendFailure: the backend failed on a batch with these pairs.
        """
        if len(documents) > self.options.max_documents:
            raise RequestError(
                413, f"{field}: {len(documents)} documents, over this server's limit of {self.options.max_documents}"
            )
        if not documents:
            return Scores(np.empty(0, np.float32), 0)
        start = time.perf_counter()
        self.arriving += 1
        try:
            encoded = await asyncio.get_running_loop().run_in_executor(
                self.tokenizing, self._encode, query, documents, cut, field
            )
        finally:
            self.arriving -= 1
            if isinstance(self.batcher, DynamicBatcher):
                self.batcher.wake()
        tokenized = time.perf_counter()
        self.metrics.tokenize.observe(tokenized - start)
        self.metrics.truncated.inc(encoded.truncated)
        try:
            if isinstance(self.batcher, PredictLoop):
                future = self.batcher.submit(query, documents, encoded)
            else:
                future = self.batcher.submit(encoded)
            scored = await asyncio.wrap_future(future)
        except Exception as e:
            raise BackendFailure(f"the backend failed on this request: {type(e).__name__}: {e}") from e
        self.metrics.queue_wait.observe(scored.queue_wait)
        waited = time.perf_counter() - tokenized
        return Scores(
            scored.scores,
            int(encoded.pair_lengths.sum()),
            tokenized - start,
            scored.queue_wait,
            max(waited - scored.queue_wait, 0.0),
        )

    def _encode(self, query: str, documents: Sequence[str], cut: Truncation, field: str) -> Encoded:
        """The pairs' ids, each document cut to the tokens the model's pair length leaves after the query, and to
        ``cut.max_tokens_per_doc`` and the server's limit (its first tokens kept; its last where ``cut.keep_end``);
        without ``cut.truncate``, a document (or query) that would be cut is a :class:`RequestError` (413) naming the
        limit."""
        truncate, max_tokens_per_doc = cut.truncate, cut.max_tokens_per_doc
        tokenizer, model_limit = self.reranker.tokenizer, self.reranker.max_length
        query_tokens = token_count(tokenizer, query)
        room = model_limit - self.special - query_tokens
        if room < 1 and not truncate:
            raise RequestError(
                413,
                f"query: {query_tokens} tokens leave no room for a document in the model's {model_limit}-token "
                "pairs; send truncate: true to cut it",
            )
        caps = [n for n in (max_tokens_per_doc, self.options.max_tokens_per_doc) if n is not None]
        cap = min(caps, default=None)
        capped = cap is not None and 1 <= cap < room  # the cap, not the model's pair length, limits a document
        allowed = cap if capped else room
        pair_limit = query_tokens + self.special + cap if capped else model_limit
        if cut.keep_end and truncate and allowed >= 1:
            documents = [_keep_last_tokens(tokenizer, d, allowed) for d in documents]
        encoded = encode_pairs(tokenizer, [query] * len(documents), documents, pair_limit)
        if encoded.truncated and not truncate:
            why = f"max_tokens_per_doc {cap}" if capped else f"the model's {model_limit}-token pairs less the query"
            raise RequestError(
                413,
                f"{field}: {encoded.truncated} of {len(documents)} are longer than {allowed} tokens ({why}); "
                "send truncate: true to cut them",
            )
        return encoded


def _fusion_alpha(fusion: Fusion, body: Any, documents: int, field: str) -> float | None:
    """The α that fuses the request's ``first_stage_scores`` (None: it sends none), checked before any scoring.

    Raises:
        RequestError: 422 naming the field: not one score per document, a first stage without scores or unknown to
            the student's card, or a server that does not fuse.
    """
    if body.first_stage_scores is None:
        if body.first_stage is not None:
            raise RequestError(422, "first_stage: names the first stage of first_stage_scores, which are not sent")
        return None
    if len(body.first_stage_scores) != documents:
        raise RequestError(
            422,
            f"first_stage_scores: {len(body.first_stage_scores)} scores for {documents} {field}; send one per document",
        )
    if not fusion.enabled:
        raise RequestError(
            422, "first_stage_scores: this server does not fuse with a first stage (interpolation: false)"
        )
    if fusion.fixed is not None:
        return fusion.fixed
    if not fusion.alphas:
        raise RequestError(
            422, "first_stage_scores: the student's card has no interpolation alpha (start the server with one)"
        )
    name = body.first_stage if body.first_stage is not None else fusion.first_stage
    if name is None and len(fusion.alphas) > 1:
        raise RequestError(
            422, f"first_stage: not sent; this student has an alpha for each of {fusion.known()}: name one"
        )
    if name is not None and name not in fusion.alphas:
        raise RequestError(422, f"first_stage: {name!r} is not one of this student's first stages: {fusion.known()}")
    return fusion.alpha(name)


def _fused(raw: np.ndarray, body: Any, alpha: float | None) -> np.ndarray:
    """The request's scores: the student's ``raw`` scores, fused with its first-stage scores by ``alpha``."""
    if alpha is None:
        return raw
    first_stage = np.asarray(body.first_stage_scores, dtype=np.float64)
    return interpolate(raw.astype(np.float64), first_stage, [body.query] * len(raw), alpha)


def _ranked(raw: np.ndarray, top_n: int | None) -> list[int]:
    """The documents' indices, best first (ties in request order), the first ``top_n``."""
    return np.lexsort((np.arange(len(raw)), -raw))[:top_n].tolist()


def _returned(body: CohereRequest, i: int) -> CohereDocument:
    """Document ``i`` as ``return_documents`` returns it: the object the request sent, whole, or its string."""
    sent = body.objects[i] if i < len(body.objects) else None
    return CohereDocument(**sent) if sent is not None else CohereDocument(text=body.documents[i])


def _keep_last_tokens(tokenizer: Any, text: str, tokens: int) -> str:
    """``text`` from where its last ``tokens`` tokens start (all of it if it has no more): a text cut on its left,
    which the pair's own truncation then leaves whole. A cut inside a word can tokenise into more pieces than it
    held in the whole text (``€uro`` alone is not ``€uro`` after ``a``), so the cut moves right a token at a time
    until the text that is left holds at most ``tokens``."""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    start = len(offsets) - tokens
    if start <= 0:
        return text
    while True:
        cut = text[offsets[start][0] :]
        if start == len(offsets) - 1 or len(tokenizer(cut, add_special_tokens=False)["input_ids"]) <= tokens:
            return cut
        start += 1


def _validation_message(error: RequestValidationError) -> tuple[int, str]:
    """The status and one line for pydantic's errors: the first error's field (``documents[2]``) and message."""
    errors = error.errors()
    first = errors[0]
    if first["type"] == "json_invalid":
        return 400, f"body: not valid JSON ({first.get('ctx', {}).get('error', 'JSON decode error')})"
    loc = [part for part in first["loc"] if part != "body"]
    if not loc and first["type"] == "missing":
        return 400, "body: empty; send a JSON object"
    field = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".") or "body"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return 422, f"{field}: {first['msg']}{more}"


def model_info(folder: Path, reranker: Reranker | WholeRequests, options: HttpOptions) -> dict[str, Any]:
    """``GET /info``: the model, its head, the backend (and why ``auto`` chose it), the export's quality gate (its
    record for this backend, and every backend's), the batching and the limits."""
    config = read_json_object(folder / "config.json")
    gate = quality_gate(folder)
    return {
        "model": str(folder),
        "head": (config.get("architectures") or [config.get("model_type")])[0],
        "model_type": config.get("model_type"),
        "backend": reranker.backend,
        "backend_reason": reranker.backend_reason or "named by --backend",
        "quality_gate": None if gate is None else {"backend": gate.get(reranker.backend), "backends": gate},
        "settings": reranker.settings,
        "options": {**asdict(options), "api_key": "set" if api_key(options) else None},
    }


@dataclass(frozen=True)
class ServedModel:
    """One student behind the app, and the name a request's ``model`` field picks it by."""

    folder: str | Path
    """Its folder (an export, or a Hugging Face folder for the torch backend)."""
    reranker: Reranker | WholeRequests
    """What scores its pairs (loaded from :attr:`folder`)."""
    fusion: Fusion | None = None
    """How requests that send first-stage scores are fused (None: as the card in :attr:`folder` says)."""
    name: str | None = None
    """The name requests pick it by (None: the folder's name)."""


@dataclass
class _Served:
    """A served model as the app holds it: its calibration, its ``/info`` and, while the app runs, its service."""

    name: str
    model: ServedModel
    fusion: Fusion
    calibration: ScoreCalibration | None
    info: dict[str, Any]
    service: RerankService | None = None


def _served_models(models: ServedModel | Sequence[ServedModel], options: HttpOptions) -> dict[str, _Served]:
    """The app's models by name, the default first.

    Raises:
        InputError: no model, or two with one name.
    """
    models = [models] if isinstance(models, ServedModel) else list(models)
    if not models:
        raise InputError("serve: no model to serve")
    served: dict[str, _Served] = {}
    for model in models:
        folder = Path(model.folder)
        name = model.name or folder.name
        if name in served:
            raise InputError(f"serve: two models are named {name!r}; name each one: --model NAME=PATH")
        fusion = model.fusion or Fusion.of(folder, None, None)
        calibration = read_calibration(folder)
        info = model_info(folder, model.reranker, options)
        info["fusion"] = {
            "alphas": fusion.alphas,
            "first_stage": fusion.first_stage,
            "interpolation": fusion.interpolation,
        }
        info["score_calibration"] = calibration.to_dict() if calibration else None
        info["scores"] = score_meanings(calibration is not None)
        served[name] = _Served(name, model, fusion, calibration, info)
    return served


def create_app(models: ServedModel | Sequence[ServedModel], options: HttpOptions | None = None) -> FastAPI:
    """The app serving ``models``, the first of them by default; ``app.state.serving`` is its
    :class:`ServingState`. A request names its model in ``model``, as Cohere's do: with one model served the field
    is ignored (clients send names of their own); with several, a name not served gets 404, and a request without
    one gets the first model.

    Each model's tokeniser and batcher threads start with the app (its lifespan) and stop with it, once the queued
    requests are scored.

    Raises:
        InputError: no model, or two with one name.
    """
    options = options or HttpOptions()
    served = _served_models(models, options)
    default = next(iter(served.values()))
    metrics = Metrics()
    state = ServingState(options)
    info = {**default.info, "served_models": list(served)}
    metrics.queued.set_function(lambda: sum(m.service.batcher.queued_pairs for m in served.values() if m.service))

    def pick(name: str | None) -> _Served:
        """The model a request names (see above)."""
        if len(served) == 1 or name is None:
            return default
        if name not in served:
            raise RequestError(404, f"model: {name!r} is not served here; the models are {', '.join(served)}")
        return served[name]

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        for model in served.values():
            model.service = RerankService(model.model.reranker, options, metrics)
        try:
            yield
        finally:
            loop = asyncio.get_running_loop()
            for model in served.values():
                if model.service is not None:
                    await loop.run_in_executor(None, model.service.close)

    names = ", ".join(f"{name} ({model.model.reranker.backend})" for name, model in served.items())
    app = FastAPI(
        title="distill serve", summary=f"Cohere- and TEI-compatible reranking with {names}", lifespan=lifespan
    )
    app.state.serving = state
    app.add_middleware(Gate, state=state, metrics=metrics)
    if options.cors_allow_origin:  # outside the gate: a preflight carries no API key
        app.add_middleware(
            JsonCors,
            allow_origins=list(options.cors_allow_origin),
            allow_methods=["GET", "POST"],
            allow_headers=["*"],  # each preflight's own: clients add theirs (Cohere's SDKs send X-Fern-*)
            expose_headers=["retry-after", *TIMING_HEADERS],
        )
    errors: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorBody} for code in (400, 401, 404, 408, 413, 415, 422, 429, 500, 503)
    }

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return error_response(*_validation_message(error))

    @app.exception_handler(RequestError)
    async def refused(request: Request, error: RequestError) -> JSONResponse:
        return error_response(error.status, str(error))

    @app.exception_handler(HTTPException)
    async def httperror_response(request: Request, error: HTTPException) -> Response:
        if isinstance(error.__cause__, ClientDisconnect):  # left while sending its body: nobody to answer
            log.info("client gone: %s %s from %s left while sending its body", request.method, request.url.path,
                     client_address(request.scope))  # fmt: skip
            return Response(status_code=CLIENT_GONE)
        detail = str(error.detail)
        if error.status_code == 400 and error.__cause__ is not None:  # FastAPI's "error parsing the body", and why
            detail = f"body: not JSON this server can read ({str(error.__cause__).splitlines()[0][:200]})"
        response = error_response(error.status_code, detail)
        response.headers.update(error.headers or {})
        return response

    @app.exception_handler(BackendFailure)
    async def backend_failed(request: Request, error: BackendFailure) -> JSONResponse:
        return error_response(500, str(error))

    @app.exception_handler(Exception)
    async def bug(request: Request, error: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(error).__name__}: {error}")

    async def cohere(body: CohereRequest, request: Request, response: Response) -> CohereResponse:
        arrived = time.perf_counter()
        model = pick(body.model)
        assert model.service is not None
        alpha = _fusion_alpha(model.fusion, body, len(body.documents), "documents")
        cut = Truncation(body.truncate, body.max_tokens_per_doc)
        scores = await model.service.score(body.query, body.documents, cut, "documents")
        response.headers.update(scores.timing_headers(time.perf_counter() - arrived))
        metrics.documents.labels(request.url.path).inc(len(body.documents))
        raw = _fused(scores.raw, body, alpha)
        shown = raw if body.raw_scores else normalised(raw, model.calibration, alpha is not None)
        results = [
            CohereResult(
                index=i,
                relevance_score=float(shown[i]),
                document=_returned(body, i) if body.return_documents else None,
            )
            for i in _ranked(raw, body.top_n)
        ]
        return CohereResponse(
            id=str(uuid.uuid4()),
            results=results,
            meta=CohereMeta(
                api_version=ApiVersion(version="2" if request.url.path == "/v2/rerank" else "1"),
                billed_units=BilledUnits(search_units=1),
                tokens=Tokens(input_tokens=scores.tokens),
            ),
            usage=Usage(prompt_tokens=scores.tokens, total_tokens=scores.tokens),
        )

    for path in ("/v1/rerank", "/v2/rerank"):
        app.add_api_route(
            path,
            cohere,
            methods=["POST"],
            response_model=CohereResponse,
            response_model_exclude_none=True,
            responses=errors,
            summary="Cohere's rerank (also Jina's request)",
        )

    @app.post("/rerank", response_model=list[TeiResult], response_model_exclude_none=True, responses=errors)
    async def tei(body: TeiRequest, request: Request, response: Response) -> list[TeiResult]:
        """text-embeddings-inference's rerank."""
        arrived = time.perf_counter()
        model = pick(body.model)
        assert model.service is not None
        if not body.texts:
            raise RequestError(413, "texts: empty: send at least one text (as TEI)")
        alpha = _fusion_alpha(model.fusion, body, len(body.texts), "texts")
        cut = Truncation(body.truncate, None, keep_end=body.truncation_direction.lower() == "left")
        scores = await model.service.score(body.query, body.texts, cut, "texts")
        response.headers.update(scores.timing_headers(time.perf_counter() - arrived))
        metrics.documents.labels(request.url.path).inc(len(body.texts))
        raw = _fused(scores.raw, body, alpha)
        shown = raw if body.raw_scores else normalised(raw, model.calibration, alpha is not None)
        return [
            TeiResult(index=i, score=float(shown[i]), text=body.texts[i] if body.return_text else None)
            for i in _ranked(raw, None)
        ]

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> dict[str, Any]:
        """200 while serving (503 once draining): the default model's backend and its device (each model's under
        ``models``), and the rerank requests queued; ``HEAD`` (some health checkers' method): the status alone."""
        backends = {
            name: {"backend": m.model.reranker.backend, "device": getattr(m.model.reranker, "device", None)}
            for name, m in served.items()
        }
        return {
            "status": "ok",
            **backends[default.name],
            "models": backends,
            "queued_requests": state.reranking,
            "max_queued_requests": options.max_queued_requests,
        }

    @app.get("/info")
    async def about(model: str | None = None) -> dict[str, Any]:
        """A model's folder, head, backend and why, quality gate, limits, and what the scores are (``?model=NAME``;
        default: the default model), and every model's name."""
        return info if model is None else {**pick(model).info, "served_models": list(served)}

    @app.get("/metrics")
    async def prometheus() -> Response:
        """Prometheus' text format."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
