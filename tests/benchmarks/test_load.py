"""The serving load benchmark (``python -m benchmarks.load``): its generator counts and checks every answer."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path

import numpy as np
import pytest

from benchmarks.load import (
    MALFORMED,
    PEER,
    Answer,
    Plan,
    Request,
    cell_requests,
    check,
    dl19_calls,
    drive,
    reference_backend,
    reference_scores,
    robustness_requests,
    run,
    summarise,
    targets,
    tolerance_of,
)
from distill.serving.http_api import ServedModel, create_app
from distill.serving.reranker import Reranker
from distill.serving.server import bind
from tests.conftest import REPO
from tests.distill.serving.test_http_api import running


@pytest.fixture(scope="module")
def calls() -> list[tuple[str, list[str]]]:
    """The first 3 DL19 queries with their 100 BM25 candidates."""
    return dl19_calls(limit=3)


def test_the_load_generator_counts_and_checks_every_answer(exported: Path, calls) -> None:
    requests = cell_requests(calls, 10, 12) + robustness_requests(calls, 60, 0.1, seed=1)
    malformed = [r for r in requests if r.key is None]
    assert len(malformed) == 6 and len({r.kind for r in malformed}) == 6
    keys = {r.key for r in requests if r.key is not None}
    references = reference_scores(str(exported), "onnx-fp32", calls, keys)
    reranker = Reranker.load(exported, backend="onnx", interpolation=False)
    with running(create_app(ServedModel(exported, reranker))) as url:
        answers, wall = asyncio.run(drive(url, requests, 4, 60))
        assert len(answers) == len(requests) and wall > 0
        figures = summarise(answers, wall, references, tolerance_of({"backend": "onnx-fp32"}))
        assert figures["requests"] == figures["answered"] == 72 and figures["wrong"] == 0, figures["wrong_examples"]
        assert 0 <= figures["max_abs_score_diff"] <= 1e-5
        assert {a.status for a in answers if a.request.key is None} <= {400, 413, 422}
        assert figures["latency_requests"] == 72 - 4  # each client's first request is its warm-up
        assert figures["p50_s"] <= figures["p95_s"] <= figures["p99_s"] <= figures["max_s"]
        assert figures["pairs_per_s"] == pytest.approx(sum(r.key[1] for r in requests if r.key) / wall)

        # the checks are not vacuous: scores off by more than the tolerance are wrong answers, each named
        shifted = {key: scores + 1e-3 for key, scores in references.items()}
        assert summarise(answers, wall, shifted, 1e-5)["wrong"] == 72 - 6

    # a server that is gone: every request is counted, none answered
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    lost, _ = asyncio.run(drive(f"http://127.0.0.1:{port}", requests[:5], 2, 5))
    figures = summarise(lost, 1.0, references, 1e-5)
    assert figures["requests"] == 5 and figures["answered"] == 0 and figures["wrong"] == 5


def test_a_streams_server_is_distill_serve_batched_on_openvino_streams() -> None:
    from benchmarks.load import server_command

    command = server_command("streams-2", "m", "openvino")
    assert command[-2:] == ["--streams", "2"] and "--batching" not in command
    with pytest.raises(ValueError, match="unknown server 'streams'"):
        server_command("streams", "m", "openvino")


def test_the_peer_runs_on_the_student_servers_device() -> None:
    from benchmarks.load import peer_args, server_command

    assert peer_args(["--dtype", "float16", "--device", "cuda:1", "--batch_wait_ms", "2"]) == ("--device", "cuda:1")
    assert peer_args(["--dtype", "float16"]) == ()  # serve-peer's own default: auto, as distill serve's
    command = server_command(PEER, "m", "torch", peer_args(["--device", "cuda:1"]))
    assert command[2:4] == ["benchmarks.load", "serve-peer"] and command[-2:] == ["--device", "cuda:1"]


def test_a_peer_on_a_device_that_is_no_device_is_one_line(exported: Path, capsys) -> None:
    from benchmarks.load import main

    assert main(["serve-peer", "--model", str(exported), "--port", "0", "--device", "gpu0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m benchmarks.load serve-peer: error: device 'gpu0': ") and "\n" not in err


def test_malformed_requests_are_the_kinds_named() -> None:
    requests = robustness_requests([("q", ["a"] * 10)], 1000, 0.01)
    bad = [r for r in requests if r.key is None]
    assert len(bad) == 10 and {r.kind for r in bad} == set(MALFORMED)
    assert all(r.expect in (400, 413, 422) for r in bad)
    valid = [json.loads(r.body) for r in requests if r.key is not None]
    assert {len(v.get("documents", v.get("texts"))) for v in valid} <= set(range(1, 11))
    assert all(v["raw_scores"] for v in valid)


def test_a_score_may_round_as_its_float_does_but_not_change_places() -> None:
    """bf16 keeps 8 significant bits: a score of 17 may move by 0.03 between batches of other widths, one of 0.5 by
    at most 0.02 (the bound); two documents' scores swapped are wrong."""
    request = Request("/v1/rerank", b"", 200, key=(0, 2))

    def answer(scores: list[float]) -> Answer:
        body = {"results": [{"index": i, "relevance_score": x} for i, x in enumerate(scores)]}
        return Answer(request, 0.0, 0.1, 200, json.dumps(body).encode(), 0, 1)

    references = {(0, 2): np.array([17.0, 0.5])}
    assert check(answer([17.03, 0.51]), references, 2e-2) == ("ok", pytest.approx(0.03))
    assert check(answer([17.0, 0.53]), references, 2e-2)[0] == "|Δscore| 0.03 over 0.02"
    assert check(answer([0.5, 17.0]), references, 2e-2)[0] == "|Δscore| 16.5 over 0.02"


def test_each_server_is_checked_against_pytorch_in_its_own_dtype() -> None:
    """The peer runs in fp16 on a GPU: checked against fp32 at fp32's bound, every answer was wrong there."""
    peer_gpu = {"backend": PEER, "settings": {"dtype": "float16", "device": "cuda:0"}}
    peer_cpu = {"backend": PEER, "settings": {"dtype": "float32", "device": "cpu"}}
    assert (reference_backend(peer_gpu), tolerance_of(peer_gpu)) == ("torch-fp16", 2e-2)
    assert (reference_backend(peer_cpu), tolerance_of(peer_cpu)) == ("torch-fp32", 1e-4)
    for backend, bound in (("openvino-bf16", 2e-2), ("onnx-fp32", 1e-5), ("torch-fp16", 2e-2), ("onnx-int8", 1e-4)):
        info = {"backend": backend, "settings": {}}
        assert (reference_backend(info), tolerance_of(info)) == (backend, bound)


def test_the_peer_serves_with_a_tokenizer_of_its_own(exported: Path, calls) -> None:
    """The server tokenises requests (limits, token counts) on its thread while ``CrossEncoder.predict`` tokenises
    another request on the model's: sharing the fast tokenizer's padding state failed requests with a 500."""
    from benchmarks.crossencoder_peer import CrossEncoderLoop

    model = CrossEncoderLoop.load(exported)
    assert model.tokenizer is not model.encoder.tokenizer
    query, passages = calls[0]
    reference = Reranker.load(exported, backend="torch", interpolation=False).score(query, passages[:10])
    assert model.predict(query, passages[:10]).tolist() == pytest.approx(reference, abs=1e-4)
    assert model.settings == {
        "backend": PEER,
        "dtype": "float32",
        "device": "cpu",
        "batch_size": 100,
        "max_length": 512,
    }


def cell(documents: int, concurrency: int, qps: float, p50: float = 1.0, p99: float = 1.2) -> dict:
    return {
        "documents": documents,
        "concurrency": concurrency,
        "queries_per_s": qps,
        "p99_over_p50": p99 / p50,
        "max_over_p50": 1.3,
        "wrong": 0,
        "requests": 10,
        "answered": 10,
        "batching": {"pairs_per_batch": 5.0, "padded_tokens_per_batch": 630.0, "tokens_per_batch": 500.0},
    }


def test_targets_are_the_issues_bounds() -> None:
    result = {
        "servers": {
            "batched": {
                "cells": [cell(10, 1, 15.0), cell(10, 8, 30.0), cell(100, 8, 3.0), cell(100, 32, 3.0, p99=2.0)]
            },
            "one-at-a-time": {"cells": [cell(10, 1, 16.0), cell(10, 8, 21.0), cell(100, 8, 3.0), cell(100, 32, 3.3)]},
            PEER: {"cells": [cell(10, 8, 5.0), cell(100, 8, 1.1)]},
            "streams-2": {"cells": [cell(10, 8, 28.0)]},
        }
    }
    found = {t["target"]: (t["value"], t["holds"]) for t in targets(result)}
    assert found["10 docs, concurrency 8: batched / one at a time"] == (pytest.approx(30 / 21), False)
    assert found["10 docs: batched at concurrency 8 / concurrency 1"] == (2.0, True)
    assert found["10 docs, concurrency 8: streams-2 / one at a time"] == (pytest.approx(28 / 21), True)
    assert found["100 docs, concurrency 32: batched / one at a time"] == (pytest.approx(3 / 3.3), False)
    unpadded = next(
        value for target, (value, _) in found.items() if target.startswith("10 docs, concurrency 8: one at")
    )
    assert unpadded == pytest.approx(1.26)  # one at a time's 630 padded tokens a batch over its pairs' own 500
    assert found["10 docs, concurrency 8: batched / CrossEncoder.predict"] == (6.0, True)
    assert found["100 docs, concurrency 8: batched / CrossEncoder.predict"] == (pytest.approx(3 / 1.1), False)
    assert found["100 docs, concurrency 32: p99 / p50 (batched)"] == (2.0, False)
    assert found["every cell: lost or wrong answers"] == (0, True)


@pytest.mark.slow
def test_a_run_starts_each_server_and_writes_its_results(exported: Path, calls, tmp_path: Path) -> None:
    """The whole benchmark, briefly: ``distill serve`` batched and one at a time and the CrossEncoder.predict peer, each
    in its own process, the robustness cell, then serve.json, serve.md and serve.png."""
    plan = Plan(
        str(exported),
        "onnx",
        documents=(10,),
        requests=(12,),
        concurrency=(1, 4),
        peer_concurrency=(2,),
        peer_requests=(6,),
        robustness=100,
        malformed=0.05,
        warmup=2,
    )
    result = run(plan, tmp_path, "python -m benchmarks.load run ...", calls)
    assert {p.name for p in tmp_path.iterdir()} == {"serve.json", "serve.md", "serve.png"}
    assert json.loads((tmp_path / "serve.json").read_text())["targets"] == result["targets"]
    servers = result["servers"]
    assert [(c["documents"], c["concurrency"]) for c in servers["batched"]["cells"]] == [(10, 1), (10, 4)]
    assert [c["concurrency"] for c in servers[PEER]["cells"]] == [2]
    assert servers["batched"]["info"]["backend"] == servers["one-at-a-time"]["info"]["backend"] == "onnx-fp32"
    assert servers["one-at-a-time"]["info"]["options"]["batching"] is False
    assert servers[PEER]["info"]["backend"] == PEER and all(s["exit_status"] == 0 for s in servers.values())
    assert servers[PEER]["info"]["settings"]["device"] == "cpu"  # auto, on a machine with no GPU
    robust = servers["batched"]["robustness"]
    assert robust["requests"] == robust["answered"] == 100 and robust["wrong"] == 0 and robust["malformed"] == 5
    assert robust["alive_after"] and robust["health_after"] == 200
    every = [c for s in servers.values() for c in s["cells"]]
    assert all(c["answered"] == c["requests"] and c["wrong"] == 0 for c in every)
    assert all(np.isfinite(c["p99_s"]) and c["batching"]["batches"] > 0 for c in every)
    assert re.search(r"\| batched \(onnx-fp32\) \| 10 \(\d+ / \d+\) \| 4 \|", (tmp_path / "serve.md").read_text())


def test_a_sigterm_whose_exit_was_swallowed_still_stops_the_clients() -> None:
    """SIGTERM's ``SystemExit`` is lost where it lands in a finaliser ("Exception ignored in ... __del__"): the
    clients then stop at their next request (the benchmark ran on, and a test timed out waiting for it)."""
    import asyncio

    from benchmarks import load

    unanswered = [load.Request("/v1/rerank", b"{}", 200)] * 3  # to a port nothing listens on: never sent
    load.TERMINATED.set()
    try:
        with pytest.raises(SystemExit) as stopped:
            asyncio.run(load.drive("http://127.0.0.1:9", unanswered, 2, 1.0))
    finally:
        load.TERMINATED.clear()
    assert stopped.value.code == 128 + 15


@pytest.mark.slow
def test_sigterm_stops_the_servers_it_started(exported: Path, tmp_path: Path) -> None:
    """A benchmark stopped by SIGTERM stops its servers, as Ctrl-C does, rather than leaving them running."""
    import signal
    import subprocess
    import sys

    import httpx

    command = [sys.executable, "-m", "benchmarks.load", "run", "--model", str(exported), "--backend", "onnx"]
    command += ["--servers", "batched", "--documents", "10", "--requests", "100000", "--concurrency", "1"]
    command += ["--robustness", "0", "--queries", "2", "--out", str(tmp_path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        url = next((m.group(1) for line in process.stdout if (m := re.search(r" at (http://\S+);", line))), None)
        assert url, "no server started"
        assert httpx.get(f"{url}/health").status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 128 + signal.SIGTERM
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health")
    finally:
        process.kill()
        process.wait()


def test_overload_targets_name_every_way_to_fail() -> None:
    from benchmarks.overload import overload_targets

    over = {"statuses": {"200": 90, "429": 10}, "lost": 0, "wrong": 0, "refused_without_retry_after": 0}
    result = {"overload": {**over, "accepted_p99_s": 0.15}, "unloaded": {"p99_s": 0.1}}
    assert all(row["holds"] for row in overload_targets(result))
    bad = {**over, "statuses": {"200": 90, "429": 9, "503": 1}, "lost": 2, "wrong": 1, "refused_without_retry_after": 3}
    result = {"overload": {**bad, "accepted_p99_s": 0.25}, "unloaded": {"p99_s": 0.1}}
    assert [(row["value"], row["holds"]) for row in overload_targets(result)] == [
        (1, False),
        (2, False),
        (1, False),
        (3, False),
        (pytest.approx(2.5), False),
    ]


@pytest.mark.slow
def test_an_overload_run_gets_only_200s_and_429s(exported: Path, calls, tmp_path: Path) -> None:
    """The overload benchmark, briefly: ``distill serve`` with a bound of 2 queued requests, offered 4 times what it
    answers, refuses the rest with 429 and answers the others right; overload.json and overload.md are written."""
    from benchmarks.overload import OverloadPlan, run

    plan = OverloadPlan(str(exported), "onnx", requests=120, unloaded_requests=10, capacity_requests=20)
    result = run(plan, tmp_path, "python -m benchmarks.overload ...", calls)
    assert {p.name for p in tmp_path.iterdir()} == {"overload.json", "overload.md"}
    over = result["overload"]
    assert over["requests"] == 120 and set(over["statuses"]) == {"200", "429"}, over["statuses"]
    assert over["lost"] == over["wrong"] == over["refused_without_retry_after"] == 0
    assert over["accepted"] >= 2 and result["health_after"] == 200 and result["exit_status"] == 0
    assert "| overload (open loop" in (tmp_path / "overload.md").read_text()


def test_servers_start_together_and_one_that_fails_stops_the_others(tmp_path: Path) -> None:
    import os
    import sys

    from benchmarks.load import start_all

    def server(name: str, delay: float) -> list[str]:
        """A process that writes its pid and start time, then says it listens ``delay`` seconds later."""
        code = f"import os, sys, time; open({str(tmp_path / name)!r}, 'w').write(f'{{os.getpid()}} {{time.time()}}'); "
        code += f"time.sleep({delay}); print('listening on http://127.0.0.1:1', file=sys.stderr, flush=True); "
        return [sys.executable, "-c", code + "time.sleep(60)"]

    up = start_all({"a": server("a", 2), "b": server("b", 2)})
    try:
        assert sorted(up) == ["a", "b"] and all(s.url == "http://127.0.0.1:1" for s in up.values())
        began = [float((tmp_path / name).read_text().split()[1]) for name in "ab"]
        assert abs(began[0] - began[1]) < 2  # each started before the other listened
    finally:
        assert all(s.stop() == -signal.SIGTERM for s in up.values())
    with pytest.raises(RuntimeError, match="broken did not start"):
        start_all({"good": server("good", 0), "broken": [sys.executable, "-c", "raise SystemExit(3)"]})
    with pytest.raises(ProcessLookupError):  # stopped and reaped
        os.kill(int((tmp_path / "good").read_text().split()[0]), 0)
