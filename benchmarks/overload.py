"""The overload benchmark: ``distill serve`` offered several times what it can answer, open loop, on loopback.

``python -m benchmarks.overload --model EXPORT`` starts ``distill serve`` (batched, ``--max_queued_requests``), then:

1. **unloaded**: one client, closed loop: each request of a DL19 query and its first ``--documents`` BM25
   candidates is sent when the last is answered; the latency percentiles with no request waiting for another;
2. **capacity**: ``--max_queued_requests`` clients, closed loop (the most the server admits at once, none refused):
   the throughput it sustains, requests/s;
3. **overload**: ``--requests`` requests sent open loop at ``--factor`` times that capacity, evenly spaced, each on
   its own, whatever the answers: every one must get a 200 with the right scores or a 429 with ``Retry-After``;
   none may time out (``--timeout``) or fail to connect; the accepted ones' p99 is compared with the unloaded p99.

The server and the load generator share the machine's cores. Writes ``overload.json`` and ``overload.md`` into
``--out``; needs the dev extra (``httpx``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import RESULTS
from benchmarks.keepalive import HttpError, KeepAlive
from benchmarks.load import (
    Answer,
    Request,
    cell_requests,
    check,
    dl19_calls,
    drive,
    load_average,
    percentile,
    reference_backend,
    reference_scores,
    run_cell,
    server_command,
    start,
    tolerance_of,
)


@dataclass(frozen=True)
class OverloadPlan:
    """What an overload run measures."""

    model: str
    backend: str = "auto"
    documents: int = 10
    """Candidates a request."""
    max_queued_requests: int = 2
    """The server's bound (``distill serve --max_queued_requests``), and the capacity step's clients."""
    requests: int = 10_000
    """Requests of the overload step."""
    factor: float = 4.0
    """The overload step's rate, in multiples of the measured capacity."""
    unloaded_requests: int = 200
    capacity_requests: int = 400
    timeout: float = 60.0
    """Seconds a request may take before it counts as timed out."""
    serve_args: tuple[str, ...] = ()
    """More options of ``distill serve``."""


@dataclass(frozen=True)
class Offered:
    """An answer of the overload step, with its ``Retry-After`` header (None: absent)."""

    answer: Answer
    retry_after: str | None


async def offer(url: str, requests: list[Request], rate: float, timeout: float) -> tuple[list[Offered], float]:
    """Send ``requests`` open loop, the i-th at ``i / rate`` seconds from the start, each on a keep-alive connection
    that no request is using (a new one where all are: no limit on connections); every answer (status 0: timed out or
    not connected) and the wall time (s)."""
    idle: list[KeepAlive] = []
    answers: list[Offered] = []
    start = time.perf_counter()

    async def send(index: int, request: Request) -> None:
        connection = idle.pop() if idle else KeepAlive(url, timeout)
        sent = time.perf_counter()
        try:
            status, headers, body = await connection.post(request.route, request.body)
            retry_after = headers.get("retry-after")
        except HttpError as e:
            status, body, retry_after = 0, str(e).encode(), None
        answer = Answer(request, sent - start, time.perf_counter() - sent, status, body, index, 1)
        answers.append(Offered(answer, retry_after))
        idle.append(connection)

    tasks = []
    for index, request in enumerate(requests):
        delay = start + index / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(index, request)))
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    for connection in idle:
        connection.close()
    return answers, wall


def overload_figures(
    offered: list[Offered], wall: float, references: dict[tuple[int, int], Any], tolerance: float
) -> dict[str, Any]:
    """The overload step's figures: status counts, wrong answers among the 200s, 429s without ``Retry-After``, and
    the accepted requests' latency percentiles (s)."""
    answers = [o.answer for o in offered]
    statuses: dict[str, int] = {}
    for answer in answers:
        statuses[str(answer.status)] = statuses.get(str(answer.status), 0) + 1
    accepted = [a for a in answers if a.status == 200]
    wrong = [v for a in accepted if (v := check(a, references, tolerance)[0]) != "ok"]
    latencies = [a.latency for a in accepted]
    return {
        "requests": len(answers),
        "wall_s": wall,
        "offered_per_s": len(answers) / wall,
        "statuses": dict(sorted(statuses.items())),
        "accepted": len(accepted),
        "accepted_per_s": len(accepted) / wall,
        "refused_without_retry_after": sum(o.answer.status == 429 and not o.retry_after for o in offered),
        "wrong": len(wrong),
        "wrong_examples": wrong[:5],
        "lost": sum(a.status == 0 for a in answers),
        "lost_examples": [a.body.decode(errors="replace") for a in answers if a.status == 0][:5],
        "accepted_p50_s": percentile(latencies, 50),
        "accepted_p99_s": percentile(latencies, 99),
        "accepted_max_s": max(latencies, default=float("nan")),
        "refused_p99_s": percentile([a.latency for a in answers if a.status == 429], 99),
    }


def overload_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The overload targets: only 200s and 429s, none lost, the 200s right, p99 of the accepted within 2x the
    unloaded p99."""
    over, unloaded = result["overload"], result["unloaded"]
    others = sum(n for status, n in over["statuses"].items() if status not in ("200", "429"))
    ratio = over["accepted_p99_s"] / unloaded["p99_s"]
    return [
        {"target": "statuses other than 200 and 429", "value": others, "bound": "0", "holds": others == 0},
        {"target": "lost (timed out, not connected)", "value": over["lost"], "bound": "0", "holds": over["lost"] == 0},
        {"target": "wrong scores among the 200s", "value": over["wrong"], "bound": "0", "holds": over["wrong"] == 0},
        {
            "target": "429s without Retry-After",
            "value": over["refused_without_retry_after"],
            "bound": "0",
            "holds": over["refused_without_retry_after"] == 0,
        },
        {"target": "accepted p99 / unloaded p99", "value": ratio, "bound": "<= 2", "holds": ratio <= 2},
    ]


def measure(plan: OverloadPlan, calls: list[tuple[str, list[str]]], log: Any = print) -> dict[str, Any]:
    """The three steps against one ``distill serve`` (see the module's docstring)."""
    import httpx

    extra = ("--max_queued_requests", str(plan.max_queued_requests), *plan.serve_args)
    server = start("batched", server_command("batched", plan.model, plan.backend, extra))
    result: dict[str, Any] = {"load_average_before": load_average(), "command_served": shlex.join(server.command)}
    try:
        info = httpx.get(f"{server.url}/info", timeout=30).json()
        tolerance = tolerance_of(info)
        keys = {(i, plan.documents) for i in range(len(calls))}
        references = reference_scores(plan.model, reference_backend(info), calls, keys)
        log(f"serving {plan.model} on {info['backend']} at {server.url}")
        asyncio.run(drive(server.url, cell_requests(calls, plan.documents, 16), 1, plan.timeout))  # warm-up
        unloaded = run_cell(
            server, cell_requests(calls, plan.documents, plan.unloaded_requests), 1, references, tolerance, plan.timeout
        )
        log(f"unloaded: p50 {unloaded['p50_s'] * 1e3:.1f} ms, p99 {unloaded['p99_s'] * 1e3:.1f} ms")
        capacity = run_cell(
            server,
            cell_requests(calls, plan.documents, plan.capacity_requests),
            plan.max_queued_requests,
            references,
            tolerance,
            plan.timeout,
        )
        rate = plan.factor * capacity["queries_per_s"]
        log(f"capacity: {capacity['queries_per_s']:.1f} requests/s; offering {rate:.1f}/s")
        answers, wall = asyncio.run(offer(server.url, cell_requests(calls, plan.documents, plan.requests), rate,
                                          plan.timeout))  # fmt: skip
        over = overload_figures(answers, wall, references, tolerance)
        over["rate_asked_per_s"] = rate
        log(f"overload: {over['statuses']}, accepted p99 {over['accepted_p99_s'] * 1e3:.1f} ms")
        for figures in (unloaded, capacity):
            del figures["latencies_ms"]
        result |= {
            "backend": info["backend"],
            "unloaded": unloaded,
            "capacity": capacity,
            "overload": over,
            "health_after": httpx.get(f"{server.url}/health", timeout=30).status_code,
        }
    finally:
        result["exit_status"] = server.stop()
    result["load_average_after"] = load_average()
    return result


def markdown(result: dict[str, Any]) -> str:
    """The run as a results page: its command, machine, steps and targets."""
    from benchmarks.results_pages import environment

    env, over = result["environment"], result["overload"]
    unloaded, capacity = result["unloaded"], result["capacity"]
    lines = [
        f"```\n{result['command']}\n```",
        "",
        f"Model: `{result['plan']['model']}` on {result['backend']}. Machine: {environment(env)}, {env['cores']} "
        f"cores shared with the load generator. Load average before / after: {result['load_average_before']} / "
        f"{result['load_average_after']}.",
        "",
        "| step | requests | throughput | p50 | p99 | statuses |",
        "|---|---|---|---|---|---|",
        f"| unloaded (1 client, closed loop) | {unloaded['requests']} | {unloaded['queries_per_s']:.1f}/s | "
        f"{unloaded['p50_s'] * 1e3:.1f} ms | {unloaded['p99_s'] * 1e3:.1f} ms | all 200 ({unloaded['wrong']} wrong) |",
        f"| capacity ({result['plan']['max_queued_requests']} clients, closed loop) | {capacity['requests']} | "
        f"{capacity['queries_per_s']:.1f}/s | {capacity['p50_s'] * 1e3:.1f} ms | {capacity['p99_s'] * 1e3:.1f} ms | "
        f"all 200 ({capacity['wrong']} wrong) |",
        f"| overload (open loop, {over['rate_asked_per_s']:.1f}/s asked, {over['offered_per_s']:.1f}/s sent) | "
        f"{over['requests']:,} | {over['accepted_per_s']:.1f}/s accepted | {over['accepted_p50_s'] * 1e3:.1f} ms | "
        f"{over['accepted_p99_s'] * 1e3:.1f} ms | "
        + ", ".join(f"{status}: {n:,}" for status, n in over["statuses"].items())
        + " |",
        "",
        f"The server answered `/health` with {result['health_after']} after, and exited with status "
        f"{result['exit_status']} on SIGTERM.",
        "",
        "| target | measured | bound |  |",
        "|---|---|---|---|",
    ]
    for row in result["targets"]:
        value = row["value"]
        shown = f"{value:.2f}" if isinstance(value, float) else f"{value:,}"
        lines.append(f"| {row['target']} | {shown} | {row['bound']} | {'holds' if row['holds'] else '**fails**'} |")
    return "\n".join(lines)


def run(plan: OverloadPlan, out: Path, command: str, calls: list[tuple[str, list[str]]]) -> dict[str, Any]:
    """Measure ``plan`` and write ``overload.json`` and ``overload.md`` into ``out``."""
    import os

    import torch

    from distill.bench.measure import environment

    measured = measure(plan, calls)
    env = environment(torch.device("cpu"), torch.float32)
    env["cores"] = os.cpu_count()
    result = {
        "what": "distill serve offered several times its capacity, open loop: only 200s and 429s, none lost, the "
        "accepted ones' p99 against the unloaded p99",
        "command": command,
        "plan": asdict(plan),
        "environment": env,
        **measured,
    }
    result["targets"] = overload_targets(result)
    out.mkdir(parents=True, exist_ok=True)
    (out / "overload.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "overload.md").write_text(markdown(result) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overload", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="an export folder (make demo writes the quickstart's)")
    parser.add_argument("--backend", default=OverloadPlan.backend, help="distill serve's --backend")
    parser.add_argument("--out", type=Path, default=RESULTS / "serve-cpu")
    parser.add_argument("--documents", type=int, default=OverloadPlan.documents)
    parser.add_argument("--max-queued-requests", type=int, default=OverloadPlan.max_queued_requests)
    parser.add_argument("--requests", type=int, default=OverloadPlan.requests)
    parser.add_argument("--factor", type=float, default=OverloadPlan.factor)
    parser.add_argument("--unloaded-requests", type=int, default=OverloadPlan.unloaded_requests)
    parser.add_argument("--capacity-requests", type=int, default=OverloadPlan.capacity_requests)
    parser.add_argument(
        "--input", type=Path, default=None, help="queries and candidates (default: DL19's BM25 top 100)"
    )
    parser.add_argument("--queries", type=int, default=None, help="use the first N queries (default: all)")
    parser.add_argument("--serve-args", default="", help="more options of distill serve, as one string")
    args = parser.parse_args(argv)
    plan = OverloadPlan(
        args.model,
        args.backend,
        args.documents,
        args.max_queued_requests,
        args.requests,
        args.factor,
        args.unloaded_requests,
        args.capacity_requests,
        serve_args=tuple(shlex.split(args.serve_args)),
    )
    given = argv if argv is not None else sys.argv[1:]
    result = run(
        plan, args.out, "python -m benchmarks.overload " + shlex.join(given), dl19_calls(args.input, args.queries)
    )
    print(markdown(result))
    return 0 if all(row["holds"] for row in result["targets"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
