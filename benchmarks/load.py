"""The serving load benchmark: ``distill serve`` under a bounded, closed-loop HTTP load on loopback.

``python -m benchmarks.load run --model checkpoints/quickstart/student/export`` starts the servers side by side,
each in a process of its own (``--port 0``), drives each in turn from this process with closed-loop clients, each
on a keep-alive connection of its own (:mod:`benchmarks.keepalive`), cell by cell (so that a spell of other load on
the machine falls on every server's cell alike), stops them with SIGTERM, and writes ``serve.json``, ``serve.md``
and ``serve.png`` into ``--out``:

- the servers: ``batched`` (``distill serve``, dynamic batching on), ``one-at-a-time`` (the same with ``--batching
  false``: a request's pairs are batched alone, requests in arrival order), ``streams-N`` where named (batched, a
  round's batches on N OpenVINO streams at once: ``--streams N``) and ``st-crossencoder`` (the peer:
  sentence-transformers' ``CrossEncoder.predict``, one request at a time, behind the same app:
  :class:`~benchmarks.crossencoder_peer.CrossEncoderLoop`, served by ``python -m benchmarks.load serve-peer``);
- the cells: each server at each request size (a DL19 query with its first 10 or 100 BM25 candidates, the queries
  in turn) and concurrency (1, 8, 32 clients, closed loop: each sends its next request when its last is answered),
  a fixed number of requests each. Each client's first request (sent with the others at once) is its warm-up: the
  latency percentiles are over the rest, throughput over the whole cell (first send to last answer);
- every answer is checked: status 200, one score per document, each equal to ``Reranker.score``'s on the same
  backend and pairs (fp32 within 1e-5, a 16-bit float within the export's fp16 bound, 2e-2; the peer against
  PyTorch in its dtype, fp32 within the export's bound between fp32 runtimes, 1e-4: :func:`tolerance_of`; each
  times the score's magnitude where that is over 1: :func:`check`);
- the robustness cell: 10,000 requests to the batched server, 1% of them malformed (bad JSON, an empty query, a
  document that is not a string, ...) at random places, the others of 1 to 10 documents over the three rerank routes:
  every malformed one must get its 4xx, every other one its right scores, and the server must stay up;
- the serving targets (:func:`targets`), each with its figure and whether it holds.

The server and this load generator share the machine's cores (``taskset`` is not used: pinning either to one of
two cores would take it from the other); each cell records both processes' CPU seconds, and the run records the
load average before and after. Needs the dev extra (``httpx``, ``sentence-transformers``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import CHECKOUT, RESULTS
from benchmarks.keepalive import HttpError, KeepAlive

SERVERS = ("batched", "one-at-a-time", "st-crossencoder")
"""The servers a run compares (:func:`server_command`)."""
PEER = "st-crossencoder"
ROUTE = "/v1/rerank"
"""The route the cells post to (Cohere's, ``raw_scores: true``)."""
FP32_TOLERANCE = 1e-5
"""|Δscore| allowed against ``Reranker.score`` for an fp32 backend (the same pairs in other batches)."""
MALFORMED: dict[str, tuple[str, Any, int]] = {
    "bad JSON": ("/v1/rerank", b'{"query": "q", "documents": ["a",', 400),
    "empty query": ("/v1/rerank", {"query": "", "documents": ["a"]}, 422),
    "no query": ("/rerank", {"texts": ["a"]}, 422),
    "document not a string": ("/v1/rerank", {"query": "q", "documents": ["a", 5]}, 422),
    "text not a string": ("/rerank", {"query": "q", "texts": [None]}, 422),
    "documents not a list": ("/v2/rerank", {"query": "q", "documents": "a"}, 422),
    "negative top_n": ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": -1}, 422),
    "too many documents": ("/v1/rerank", {"query": "q", "documents": ["a"] * 1001}, 413),
}
"""The robustness cell's malformed requests: route, body (bytes: sent as is) and the status it must get (the
server's default limit is 1,000 documents)."""


# --- requests and their answers -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request of a cell, serialised before the clock starts."""

    route: str
    body: bytes
    expect: int
    """The status it must get."""
    key: tuple[int, int] | None = None
    """(query index, documents): the reference scores it must get; None for a malformed request."""
    kind: str = "valid"


@dataclass
class Answer:
    request: Request
    sent: float
    """Seconds from the cell's start."""
    latency: float
    status: int
    body: bytes
    client: int
    """Which client sent it, and its ``round``: the client's how-manyth request (0: its warm-up)."""
    round: int


def valid_request(route: str, query_index: int, query: str, documents: list[str]) -> Request:
    """A request for the raw scores of ``documents``, on Cohere's or TEI's route."""
    field_name = "texts" if route == "/rerank" else "documents"
    body = {"query": query, field_name: documents, "raw_scores": True}
    if route == "/rerank":
        body["truncate"] = True
    return Request(route, json.dumps(body).encode(), 200, (query_index, len(documents)))


def malformed_request(kind: str) -> Request:
    route, body, status = MALFORMED[kind]
    return Request(route, body if isinstance(body, bytes) else json.dumps(body).encode(), status, None, kind)


def cell_requests(calls: Sequence[tuple[str, list[str]]], documents: int, count: int) -> list[Request]:
    """``count`` requests of the first ``documents`` candidates of each query in turn, on :data:`ROUTE`."""
    requests = []
    for i in range(count):
        query, passages = calls[i % len(calls)]
        requests.append(valid_request(ROUTE, i % len(calls), query, passages[:documents]))
    return requests


def robustness_requests(
    calls: Sequence[tuple[str, list[str]]], count: int, malformed: float, seed: int = 0
) -> list[Request]:
    """``count`` requests, a ``malformed`` fraction of them malformed (each kind of :data:`MALFORMED` in turn) at
    random places; the others a query in turn with its first 1 to 10 candidates, on the three rerank routes."""
    rng = random.Random(seed)
    bad = set(rng.sample(range(count), round(count * malformed)))
    kinds = list(MALFORMED)
    routes = ("/v1/rerank", "/v2/rerank", "/rerank")
    requests = []
    for i in range(count):
        if i in bad:
            requests.append(malformed_request(kinds[sum(r.key is None for r in requests) % len(kinds)]))
            continue
        query, passages = calls[i % len(calls)]
        requests.append(valid_request(routes[i % 3], i % len(calls), query, passages[: rng.randint(1, 10)]))
    return requests


def answer_scores(answer: Answer) -> dict[int, float]:
    """Document index -> raw score, from a Cohere or TEI answer."""
    data = json.loads(answer.body)
    results = data if isinstance(data, list) else data["results"]
    return {r["index"]: r["score" if isinstance(data, list) else "relevance_score"] for r in results}


def answer_tokens(answer: Answer) -> int | None:
    """The tokens a Cohere answer counts for its request (its pairs' query, document and special tokens); None for
    another answer."""
    if answer.status != 200:
        return None
    data = json.loads(answer.body)
    return data["meta"]["tokens"]["input_tokens"] if isinstance(data, dict) and "meta" in data else None


def check(answer: Answer, references: dict[tuple[int, int], np.ndarray], tolerance: float) -> tuple[str, float]:
    """``("ok" | what is wrong, max |Δscore|)`` of one answer against its request's expected status and scores: each
    score within ``tolerance`` of its reference, times the reference's magnitude where that is over 1 (floats round
    relative to their size: bf16 keeps 8 significant bits, so a score of 17 rounds at about 0.06)."""
    request = answer.request
    if answer.status != request.expect:
        return f"status {answer.status}, not {request.expect}: {answer.body[:300].decode(errors='replace')}", 0.0
    if request.key is None:
        error = json.loads(answer.body)
        return ("ok" if list(error) == ["error", "error_type"] and error["error"] else "no one-line error"), 0.0
    expected = references[request.key]
    try:
        scores = answer_scores(answer)
    except (ValueError, KeyError, TypeError) as e:
        return f"unreadable answer ({type(e).__name__})", 0.0
    if sorted(scores) != list(range(len(expected))):
        return f"{len(scores)} scores for {len(expected)} documents", 0.0
    deltas = np.abs(np.array([scores[i] for i in range(len(expected))]) - expected)
    allowed = tolerance * np.maximum(1.0, np.abs(expected))
    worst = int(np.argmax(deltas / allowed))
    if deltas[worst] > allowed[worst]:
        return f"|Δscore| {deltas[worst]:.3g} over {allowed[worst]:.3g}", float(deltas.max())
    return "ok", float(deltas.max())


# --- the load generator -------------------------------------------------------------------------------------------


TERMINATED = threading.Event()
"""Set by SIGTERM: the handler's ``SystemExit`` can be lost where it is raised inside a finaliser (Python then prints
"Exception ignored" and goes on), so the clients' loop checks this before each request."""


async def drive(url: str, requests: Sequence[Request], concurrency: int, timeout: float) -> tuple[list[Answer], float]:
    """Send ``requests`` from ``concurrency`` closed-loop clients, each on a keep-alive connection of its own (each
    sends the next unsent request once its last is answered); every answer, and the wall time from the first send to
    the last answer (s)."""
    pending = iter(requests)
    answers: list[Answer] = []
    start = time.perf_counter()

    async def run(index: int) -> None:
        connection = KeepAlive(url, timeout)
        try:
            for turn, request in enumerate(pending):
                if TERMINATED.is_set():  # the signal's own exit was swallowed (raised inside a __del__, say)
                    raise SystemExit(128 + signal.SIGTERM)
                sent = time.perf_counter()
                try:
                    status, _, body = await connection.post(request.route, request.body)
                except HttpError as e:  # a lost request: counted, never raised
                    status, body = 0, str(e).encode()
                done = time.perf_counter()
                answers.append(Answer(request, sent - start, done - sent, status, body, index, turn))
        finally:
            connection.close()

    await asyncio.gather(*(run(i) for i in range(concurrency)))
    return answers, time.perf_counter() - start


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


def summarise(
    answers: list[Answer],
    wall: float,
    references: dict[tuple[int, int], np.ndarray],
    tolerance: float,
) -> dict[str, Any]:
    """A cell's figures: counts (answered, wrong), throughput over the whole cell, latency percentiles over the
    requests after each client's first (seconds), the requests' own spread (the tokens each answer counts: at
    concurrency 1 its latency follows them), and every request's latency in the order they were sent (ms)."""
    verdicts = [check(a, references, tolerance) for a in answers]
    wrong = [(a, v) for a, v in zip(answers, verdicts, strict=True) if v[0] != "ok"]
    steady = [a.latency for a in answers if a.round > 0] or [a.latency for a in answers]
    pairs = sum(a.request.key[1] for a in answers if a.request.key is not None)
    tokens = [n for a in answers if (n := answer_tokens(a)) is not None]
    p50 = percentile(steady, 50)
    return {
        "requests": len(answers),
        "answered": sum(a.status != 0 for a in answers),
        "wrong": len(wrong),
        "wrong_examples": [f"{a.request.kind} {a.request.route}: {v[0]}" for a, v in wrong[:5]],
        "max_abs_score_diff": max((v[1] for v in verdicts), default=0.0),
        "wall_s": wall,
        "queries_per_s": len(answers) / wall,
        "pairs_per_s": pairs / wall,
        "latency_requests": len(steady),
        "p50_s": p50,
        "p95_s": percentile(steady, 95),
        "p99_s": percentile(steady, 99),
        "max_s": max(steady),
        "p99_over_p50": percentile(steady, 99) / p50,
        "max_over_p50": max(steady) / p50,
        "request_tokens_p50": percentile(tokens, 50),
        "request_tokens_p99": percentile(tokens, 99),
        "latencies_ms": [round(a.latency * 1e3, 2) for a in sorted(answers, key=lambda a: a.sent)],
    }


# --- the servers --------------------------------------------------------------------------------------------------


@dataclass
class Server:
    """A server process started by :func:`start`; its stderr is collected on a thread."""

    name: str
    command: list[str]
    process: subprocess.Popen
    url: str
    log: list[str] = field(default_factory=list)

    def cpu_seconds(self) -> float:
        """The process's user + system CPU time so far (``/proc/<pid>/stat``), s."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (the server drains and exits); its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def server_command(name: str, model: str, backend: str, extra: Sequence[str] = ()) -> list[str]:
    """The command of server ``name`` (:data:`SERVERS`, or ``streams-N``: batched on N OpenVINO streams) on a free
    loopback port."""
    if name == PEER:
        return [sys.executable, "-m", "benchmarks.load", "serve-peer", "--model", model, "--port", "0", *extra]
    command = [sys.executable, "-m", "distill", "serve", "--model", model, "--backend", backend, "--port", "0"]
    if name == "one-at-a-time":
        command += ["--batching", "false"]
    elif streams := re.fullmatch(r"streams-(\d+)", name):
        command += ["--streams", streams.group(1)]
    elif name != "batched":
        raise ValueError(f"unknown server {name!r}: one of {SERVERS} or streams-N")
    return command + list(extra)


def peer_args(serve_args: Sequence[str]) -> tuple[str, ...]:
    """The peer's options from the student servers' ``serve_args``: the same ``--device`` (default ``auto``)."""
    args = list(serve_args)
    return tuple(args[args.index("--device") : args.index("--device") + 2]) if "--device" in args else ()


def start(name: str, command: list[str], timeout: float = 300) -> Server:
    """Start ``command`` and wait for its ``listening on http://...`` line.

    Raises:
        RuntimeError: it exited, or did not listen within ``timeout`` seconds; with its last lines.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, cwd=CHECKOUT, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stderr is not None
    log: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in process.stderr:
            log.append(line.rstrip("\n"))
            if not found and (match := re.search(r"listening on (http://\S+)", line)):
                found.append(match.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=read, name=f"{name}-stderr", daemon=True).start()
    if not ready.wait(timeout) or not found:
        process.kill()
        process.wait()
        raise RuntimeError(f"{name} did not start: {shlex.join(command)}\n" + "\n".join(log[-20:]))
    return Server(name, command, process, found[0], log)


def start_all(commands: dict[str, list[str]]) -> dict[str, Server]:
    """Every server of ``commands`` (name -> command) started at once, each as :func:`start`; their loading and
    warm-up overlap. Raises the first server's failure after stopping the others."""
    with ThreadPoolExecutor(len(commands)) as pool:
        pending = {name: pool.submit(start, name, command) for name, command in commands.items()}
    failures = [f.exception() for f in pending.values() if f.exception() is not None]
    if failures:
        for future in pending.values():
            if future.exception() is None:
                future.result().stop()
        raise failures[0]
    return {name: future.result() for name, future in pending.items()}


def server_metrics(url: str) -> dict[str, float]:
    """The server's Prometheus samples (name with labels -> value) that a cell's batching figures come from."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    wanted = re.compile(
        r"distill_((batch_(pairs|requests|padded_tokens|seconds)|queue_wait_seconds|tokenize_seconds)_(sum|count)"
        r"|tokens_total)$"
    )
    samples = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        for sample in family.samples:
            if wanted.match(sample.name):
                samples[sample.name] = sample.value
    return samples


def batching_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """A cell's batches from the metrics' difference: how many, their mean requests, pairs, padded tokens and the
    pairs' own tokens, the backend's mean seconds per batch and share of the wall time, the mean queue wait and
    tokenising time (s)."""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    batches = delta.get("distill_batch_pairs_count", 0.0)
    requests = delta.get("distill_queue_wait_seconds_count", 0.0)

    def mean(name: str, count: float) -> float:
        return delta.get(name, 0.0) / count if count else float("nan")

    return {
        "batches": batches,
        "requests_per_batch": mean("distill_batch_requests_sum", batches),
        "pairs_per_batch": mean("distill_batch_pairs_sum", batches),
        "padded_tokens_per_batch": mean("distill_batch_padded_tokens_sum", batches),
        "tokens_per_batch": mean("distill_tokens_total", batches),
        "backend_s_per_batch": mean("distill_batch_seconds_sum", batches),
        "backend_s": delta.get("distill_batch_seconds_sum", 0.0),
        "queue_wait_s": mean("distill_queue_wait_seconds_sum", requests),
        "tokenize_s": mean("distill_tokenize_seconds_sum", requests),
    }


def run_cell(
    server: Server,
    requests: list[Request],
    concurrency: int,
    references: dict[tuple[int, int], np.ndarray],
    tolerance: float,
    timeout: float,
) -> dict[str, Any]:
    """One cell against a running server: its figures, the batches it made and both processes' CPU seconds."""
    before, server_cpu, own_cpu = server_metrics(server.url), server.cpu_seconds(), time.process_time()
    answers, wall = asyncio.run(drive(server.url, requests, concurrency, timeout))
    own_cpu, server_cpu = time.process_time() - own_cpu, server.cpu_seconds() - server_cpu
    figures = summarise(answers, wall, references, tolerance)
    figures["batching"] = batching_figures(before, server_metrics(server.url))
    figures["batching"]["backend_share_of_wall"] = figures["batching"]["backend_s"] / wall
    figures["cpu_s"] = {"server": server_cpu, "load_generator": own_cpu}
    return figures


def serve_peer(model: str, host: str, port: int, device: str = "auto") -> None:
    """``CrossEncoder.predict`` (:class:`~benchmarks.crossencoder_peer.CrossEncoderLoop`) on ``device``
    (``auto``: the GPU where there is one, as ``distill serve``) behind ``distill serve``'s app, on uvicorn as
    ``distill serve`` runs it (draining on SIGTERM)."""
    import uvicorn

    from benchmarks.crossencoder_peer import CrossEncoderLoop
    from distill.core.devices import resolve_device
    from distill.serving.http_api import ServedModel, create_app
    from distill.serving.server import bind, drain_server

    sock = bind(host, port)
    try:
        app = create_app(ServedModel(model, CrossEncoderLoop.load(model, str(resolve_device(device)))))
        print(f"benchmarks.load serve-peer: listening on http://{host}:{sock.getsockname()[1]}", file=sys.stderr)
        config = uvicorn.Config(app, lifespan="on", access_log=False, log_level="warning")
        drain_server(config, app.state.serving).run(sockets=[sock])
    finally:
        sock.close()


# --- references ----------------------------------------------------------------------------------------------------


def reference_backend(info: dict[str, Any]) -> str:
    """The named backend whose ``Reranker.score`` a server's answers are checked against, from its ``/info``: the
    server's own; the peer's, PyTorch in the peer's dtype
    (:class:`~benchmarks.crossencoder_peer.CrossEncoderLoop`: fp32 on a CPU, fp16 on a GPU)."""
    from distill.serving.backends import backend_name

    if info["backend"] != PEER:
        return info["backend"]
    return backend_name("torch", info["settings"]["dtype"])


def tolerance_of(info: dict[str, Any]) -> float:
    """The |Δscore| a server's answers may have against :func:`reference_backend`'s ``Reranker.score``, from its
    ``/info``: 1e-5 for fp32, the export's fp16 bound for a 16-bit float (bf16, fp16), the ONNX graphs' bound for
    int8; the peer's, in fp32 (sentence-transformers' batches, against ``Reranker.score`` on PyTorch fp32), the
    export's bound between fp32 runtimes, 1e-4, as its batches pad otherwise. :func:`check` scales each by the
    score's magnitude where that is over 1."""
    from distill.export.parity import SCORE_BOUNDS
    from distill.serving.backends import FP32_BACKENDS

    backend = reference_backend(info)
    if backend.endswith(("fp16", "bf16")):
        return SCORE_BOUNDS["onnx-fp16"]
    if backend in FP32_BACKENDS and info["backend"] != PEER:
        return FP32_TOLERANCE
    return SCORE_BOUNDS["onnx"]


def reference_scores(
    model: str, backend: str, calls: Sequence[tuple[str, list[str]]], keys: set[tuple[int, int]]
) -> dict[tuple[int, int], np.ndarray]:
    """``Reranker.score`` of each (query index, documents) on ``backend`` (a named backend:
    :func:`reference_backend`), loaded in this process and dropped after."""
    from distill.serving.backends import NAMED_BACKENDS
    from distill.serving.reranker import Reranker

    kind, dtype = NAMED_BACKENDS[backend]
    reranker = Reranker.load(model, backend=kind, dtype=dtype, interpolation=False)
    scores = {}
    for query_index, documents in sorted(keys):
        query, passages = calls[query_index]
        scores[query_index, documents] = np.asarray(reranker.score(query, passages[:documents]), dtype=np.float64)
    del reranker
    gc.collect()
    return scores


# --- the run -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What a run measures."""

    model: str
    backend: str = "auto"
    servers: tuple[str, ...] = SERVERS
    documents: tuple[int, ...] = (10, 100)
    requests: tuple[int, ...] = (512, 96)
    """Requests per cell, one per entry of :attr:`documents`."""
    concurrency: tuple[int, ...] = (1, 8, 32)
    peer_concurrency: tuple[int, ...] = (1, 8)
    """The peer's concurrencies (it scores one request at a time, so more clients only queue)."""
    peer_requests: tuple[int, ...] = (128, 40)
    robustness: int = 10_000
    """Requests of the robustness cell (0: none)."""
    malformed: float = 0.01
    warmup: int = 8
    """Untimed requests of each size before a server's cells."""
    serve_args: tuple[str, ...] = ()
    """More options of ``distill serve`` (both student servers)."""
    timeout: float = 600.0
    """Seconds a request may take before it counts as lost."""

    def cells_of(self, server: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``server``'s requests per cell (one per entry of :attr:`documents`) and concurrencies: the peer's own."""
        if server == PEER:
            return self.peer_requests, self.peer_concurrency
        return self.requests, self.concurrency


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def dl19_calls(path: str | Path | None = None, limit: int | None = None) -> list[tuple[str, list[str]]]:
    """The queries with their candidates of a rank_llm file (default DL19's 43 with their 100 BM25 candidates,
    ``data/trec-dl19/bm25_top100.json``), in the file's order; the first ``limit``."""
    from distill.core.project_files import CANDIDATES, DL19, shipped
    from distill.data.loaders import load_candidates

    data = load_candidates(path or shipped(DL19 / CANDIDATES, "--input"))
    return [(c.query.text, [p.text for p in c.passages]) for c in data.candidates][:limit]


def measure(plan: Plan, calls: Sequence[tuple[str, list[str]]], log: Any = None) -> dict[str, Any]:
    """Every server's cells, then the robustness cell on the batched server; figures as :func:`summarise`'s; each
    cell's line to ``log`` (default: printed as it is measured).

    The servers start together and run side by side (an idle one takes no CPU), and each cell is measured on every
    server in turn, so that a spell of other load on the machine falls on the servers' cells alike rather than on
    one server's.
    """
    import httpx

    log = log or partial(print, flush=True)
    result: dict[str, Any] = {"load_average_before": load_average()}
    servers: dict[str, Server] = {}
    entries: dict[str, dict[str, Any]] = {}
    references: dict[str, dict[tuple[int, int], np.ndarray]] = {}
    try:
        extra = {name: peer_args(plan.serve_args) if name == PEER else plan.serve_args for name in plan.servers}
        servers.update(start_all({n: server_command(n, plan.model, plan.backend, extra[n]) for n in plan.servers}))
        for name, server in servers.items():
            info = httpx.get(f"{server.url}/info", timeout=30).json()
            counts, _ = plan.cells_of(name)
            keys = {
                (i % len(calls), d)
                for d, n in zip(plan.documents, counts, strict=True)
                for i in range(max(n, plan.warmup))
            }
            if name == "batched" and plan.robustness > 0:
                keys |= {(i % len(calls), d) for i in range(len(calls)) for d in range(1, 11)}
            log(f"{name}: {info['backend']} at {server.url}; reference scores of {len(keys)} requests")
            references[name] = reference_scores(plan.model, reference_backend(info), calls, keys)
            for documents in plan.documents:
                asyncio.run(drive(server.url, cell_requests(calls, documents, plan.warmup), 4, plan.timeout))
            command = shlex.join(server.command)
            entries[name] = {"command": command, "info": info, "tolerance": tolerance_of(info), "cells": []}
        for index, documents in enumerate(plan.documents):
            for concurrency in sorted({*plan.concurrency, *plan.peer_concurrency}):
                for name, server in servers.items():
                    counts, concurrencies = plan.cells_of(name)
                    if concurrency not in concurrencies:
                        continue
                    requests = cell_requests(calls, documents, counts[index])
                    entry = entries[name]
                    cell = run_cell(server, requests, concurrency, references[name], entry["tolerance"], plan.timeout)
                    entry["cells"].append({"documents": documents, "concurrency": concurrency, **cell})
                    log(
                        f"{name} {documents} docs c={concurrency}: {cell['queries_per_s']:.2f} q/s, "
                        f"{cell['pairs_per_s']:.0f} pairs/s, p50 {cell['p50_s'] * 1e3:.0f} ms, "
                        f"p99 {cell['p99_s'] * 1e3:.0f} ms, wrong {cell['wrong']}"
                    )
        if "batched" in servers and plan.robustness > 0:
            server, requests = servers["batched"], robustness_requests(calls, plan.robustness, plan.malformed)
            cell = run_cell(server, requests, 8, references["batched"], entries["batched"]["tolerance"], plan.timeout)
            del cell["latencies_ms"]
            cell["kinds"] = {k: sum(r.kind == k for r in requests) for k in sorted({r.kind for r in requests})}
            cell["malformed"] = sum(r.key is None for r in requests)
            cell["concurrency"] = 8
            cell["alive_after"] = server.process.poll() is None
            cell["health_after"] = httpx.get(f"{server.url}/health", timeout=30).status_code
            entries["batched"]["robustness"] = cell
            log(f"robustness: {cell['requests']} requests, {cell['wrong']} wrong, alive {cell['alive_after']}")
    finally:
        for name, server in servers.items():
            status = server.stop()
            if name in entries:
                entries[name]["exit_status"] = status
    result["servers"] = entries
    result["load_average_after"] = load_average()
    return result


def cell(result: dict[str, Any], server: str, documents: int, concurrency: int) -> dict[str, Any] | None:
    """The cell of ``server`` at that size and concurrency, if measured."""
    cells = result["servers"].get(server, {}).get("cells", [])
    return next((c for c in cells if c["documents"] == documents and c["concurrency"] == concurrency), None)


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The serving targets against a run: each with its figure, the bound, and whether it holds (None: a cell it
    needs was not measured, or the figure is only reported)."""
    rows: list[dict[str, Any]] = []

    def row(target: str, value: float | None, bound: str, holds: bool | None) -> None:
        rows.append({"target": target, "value": value, "bound": bound, "holds": holds})

    def ratio(target: str, a: tuple[str, int, int], b: tuple[str, int, int], bound: float) -> None:
        x, y = cell(result, *a), cell(result, *b)
        value = x["queries_per_s"] / y["queries_per_s"] if x and y else None
        row(target, value, f">= {bound:g}", None if value is None else value >= bound)

    batched = result["servers"].get("batched", {})
    ratio("10 docs, concurrency 8: batched / one at a time", ("batched", 10, 8), ("one-at-a-time", 10, 8), 1.5)
    ratio("10 docs: batched at concurrency 8 / concurrency 1", ("batched", 10, 8), ("batched", 10, 1), 1.5)
    for name in sorted(n for n in result["servers"] if n.startswith("streams-")):
        ratio(f"10 docs, concurrency 8: {name} / one at a time", (name, 10, 8), ("one-at-a-time", 10, 8), 1.3)
    if alone := cell(result, "one-at-a-time", 10, 8):
        figures = alone["batching"]
        row(
            "10 docs, concurrency 8: one at a time's padded tokens / the pairs' own (batching's gain, were its "
            "batches unpadded at the same cost a token)",
            figures["padded_tokens_per_batch"] / figures["tokens_per_batch"],
            "reported",
            None,
        )
    for c in (8, 32):
        ratio(
            f"100 docs, concurrency {c}: batched / one at a time", ("batched", 100, c), ("one-at-a-time", 100, c), 0.95
        )
    for d in (10, 100):
        ratio(f"{d} docs, concurrency 8: batched / CrossEncoder.predict", ("batched", d, 8), (PEER, d, 8), 3.0)
    for c in batched.get("cells", []):
        value = c["p99_over_p50"]
        row(
            f"{c['documents']} docs, concurrency {c['concurrency']}: p99 / p50 (batched)", value, "<= 1.5", value <= 1.5
        )
    worst = max((c["max_over_p50"] for c in batched.get("cells", [])), default=None)
    row("fairness: the slowest request / p50, worst cell (batched)", worst, "reported", None)
    if robust := batched.get("robustness"):
        bad = robust["requests"] - robust["answered"] + robust["wrong"]
        up = robust["alive_after"] and robust["health_after"] == 200
        target = f"robustness, {robust['malformed']} of {robust['requests']:,} malformed: lost or wrong, server up"
        row(target, bad, "0, up", bad == 0 and up)
    cells = [c for s in result["servers"].values() for c in s.get("cells", [])]
    wrong = sum(c["wrong"] + c["requests"] - c["answered"] for c in cells)
    row("every cell: lost or wrong answers", wrong, "0", wrong == 0)
    return rows


def plot(result: dict[str, Any], path: Path) -> None:
    """Throughput (queries/s) and p50/p99 latency against concurrency, a column per request size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({c["documents"] for s in result["servers"].values() for c in s["cells"]})
    fig, axes = plt.subplots(2, len(sizes), figsize=(5.5 * len(sizes), 8), squeeze=False)
    for column, documents in enumerate(sizes):
        top, bottom = axes[0][column], axes[1][column]
        for name, server in result["servers"].items():
            cells = sorted((c for c in server["cells"] if c["documents"] == documents), key=lambda c: c["concurrency"])
            if not cells:
                continue
            label = f"{name} ({server['info']['backend']})"
            x = [c["concurrency"] for c in cells]
            line = top.plot(x, [c["queries_per_s"] for c in cells], "o-", label=label)[0]
            bottom.plot(x, [c["p50_s"] * 1e3 for c in cells], "o-", color=line.get_color(), label=f"{name} p50")
            bottom.plot(x, [c["p99_s"] * 1e3 for c in cells], "s--", color=line.get_color(), label=f"{name} p99")
        top.set(xscale="log", title=f"{documents} documents a request", ylabel="queries/s", xlabel="concurrency")
        bottom.set(xscale="log", yscale="log", ylabel="latency (ms)", xlabel="concurrency")
        for axis in (top, bottom):
            axis.set_xticks(sorted({c["concurrency"] for s in result["servers"].values() for c in s["cells"]}))
            axis.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize=8)
    env = result["environment"]
    fig.suptitle(f"distill serve on {env['device_name']} ({env['cores']} cores, shared with the load generator)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(plan: Plan, out: Path, command: str, calls: Sequence[tuple[str, list[str]]]) -> dict[str, Any]:
    """Measure ``plan`` with requests from ``calls`` (queries and their candidates, :func:`dl19_calls`) and write
    ``serve.json``, ``serve.md`` and ``serve.png`` into ``out``."""
    import torch

    from benchmarks.results_pages import serve_tables
    from distill.bench.measure import environment
    from distill.serving.server import tokenizer_parallelism

    measured = measure(plan, calls)
    info = measured["servers"].get("batched", next(iter(measured["servers"].values())))["info"]
    backend = info["backend"]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(backend.rsplit("-", 1)[-1], torch.float32)
    env = environment(torch.device(info["settings"].get("device", "cpu")), dtype)
    env["cores"] = os.cpu_count()
    env["affinity"] = sorted(os.sched_getaffinity(0))
    # the servers' tokenizer threads: distill serve's choice for its device unless the environment it inherits sets it
    env["tokenizers_parallelism"] = os.environ.get(
        "TOKENIZERS_PARALLELISM", tokenizer_parallelism([str(info["settings"].get("device", "cpu"))])
    )
    result = {
        "what": "distill serve under a closed-loop HTTP load on loopback: throughput and latency per request size "
        "and concurrency, batched, one request at a time and the CrossEncoder.predict peer, and a robustness cell",
        "command": command,
        "model": plan.model,
        "requests": "DL19 queries (data/trec-dl19/bm25_top100.json) in turn, each with its first N BM25 candidates, "
        f"POST {ROUTE} with raw_scores; the first request of each client is a warm-up, outside the percentiles",
        "pinning": "none: the server and the load generator share every core (their CPU seconds are per cell)",
        "plan": asdict(plan),
        "environment": env,
        **measured,
    }
    result["targets"] = targets(result)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "serve.md").write_text(serve_tables(result) + "\n")
    plot(result, out / "serve.png")
    return result


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("run", help="measure every server and cell; write serve.json, serve.md and serve.png")
    bench.add_argument("--model", required=True, help="an export folder (make demo writes the quickstart's)")
    bench.add_argument("--backend", default="auto", help="distill serve's --backend")
    bench.add_argument("--out", type=Path, default=RESULTS / "serve-cpu")
    bench.add_argument(
        "--servers",
        default=",".join(SERVERS),
        help=f"some of {','.join(SERVERS)}, and streams-N (batched on N OpenVINO streams)",
    )
    bench.add_argument("--documents", type=_ints, default=Plan.documents, help="documents a request (10,100)")
    bench.add_argument("--requests", type=_ints, default=Plan.requests, help="requests a cell, one per size")
    bench.add_argument("--concurrency", type=_ints, default=Plan.concurrency)
    bench.add_argument("--peer-concurrency", type=_ints, default=Plan.peer_concurrency)
    bench.add_argument("--peer-requests", type=_ints, default=Plan.peer_requests)
    bench.add_argument("--robustness", type=int, default=Plan.robustness, help="requests of the robustness cell")
    bench.add_argument("--malformed", type=float, default=Plan.malformed)
    bench.add_argument("--warmup", type=int, default=Plan.warmup)
    bench.add_argument("--input", type=Path, default=None, help="queries and candidates (default: DL19's BM25 top 100)")
    bench.add_argument("--queries", type=int, default=None, help="use the first N queries (default: all)")
    bench.add_argument("--serve-args", default="", help="more options of distill serve, as one string")
    peer = sub.add_parser("serve-peer", help="serve CrossEncoder.predict behind distill serve's app (the peer)")
    peer.add_argument("--model", required=True)
    peer.add_argument("--host", default="127.0.0.1")
    peer.add_argument("--port", type=int, default=8080)
    peer.add_argument("--device", default="auto", help="the peer's device (auto: the GPU where there is one)")
    args = parser.parse_args(argv)
    if args.command == "serve-peer":
        from distill.core.schema import UserError

        try:
            serve_peer(args.model, args.host, args.port, args.device)
        except UserError as e:  # a bad --device or --model: one line, as distill serve says it
            print(f"python -m benchmarks.load serve-peer: error: {e}", file=sys.stderr)
            return 2
        return 0
    plan = Plan(
        args.model,
        args.backend,
        tuple(args.servers.split(",")),
        args.documents,
        args.requests,
        args.concurrency,
        args.peer_concurrency,
        args.peer_requests,
        args.robustness,
        args.malformed,
        args.warmup,
        tuple(shlex.split(args.serve_args)),
    )
    given = argv if argv is not None else sys.argv[1:]

    def stop(*_: Any) -> None:
        TERMINATED.set()
        sys.exit(128 + signal.SIGTERM)  # as Ctrl-C: unwinding stops the servers

    signal.signal(signal.SIGTERM, stop)
    try:
        calls = dl19_calls(args.input, args.queries)
        result = run(plan, args.out, "python -m benchmarks.load " + shlex.join(given), calls)
    except BaseException:
        if TERMINATED.is_set():  # the exit may surface as another exception, say inside a C extension's import
            raise SystemExit(128 + signal.SIGTERM) from None
        raise
    from benchmarks.results_pages import serve_tables

    print(serve_tables(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
