"""The latency benchmark's outputs: printed tables, speed-ups, CSV rows and the bar chart (the paper's Figure 3).

Every function reads the result dictionary :func:`distill.bench.latency.run_bench` writes to ``bench.json``, so a
saved result prints and plots the same as a fresh one.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

CSV_FIELDS = (
    "method",
    "role",
    "dtype",
    "workload",
    "calls",
    "n",
    "pairs_per_call",
    "passage_tokens_per_call",
    "tokens_fed_per_call",
    "p50_s",
    "p95_s",
    "pairs_per_s",
    "peak_memory_bytes",
    "flop_floor_s",
    "floor_fraction",
)


CELL_KEYS = (
    "method",
    "role",
    "dtype",
    "workload",
    "p50_s",
    "p95_s",
    "pairs_per_s",
    "peak_memory_bytes",
    "flop_floor_s",
)
"""What every cell of a ``bench.json`` holds, and the tables and chart read."""


def check_result(result: dict[str, Any], where: Path) -> None:
    """``result``, read from ``where``, is a ``bench.json`` with the workloads and cells the tables and chart read.

    Raises:
        InputError: one line naming the file and what is missing.
    """
    from distill.core.schema import InputError

    if missing := [key for key in ("workloads", "cells", "skipped") if key not in result]:
        raise InputError(f"{where}: not a bench.json (no {', '.join(map(repr, missing))})")
    cells, names = result["cells"], result["workloads"]
    if not isinstance(names, list) or not all(isinstance(w, dict) and "name" in w for w in names):
        raise InputError(f"{where}: workloads: expected a list of objects with a name")
    if not isinstance(cells, list) or not cells:
        raise InputError(f"{where}: cells: no method was timed (an empty or broken run)")
    for i, c in enumerate(cells):
        if not isinstance(c, dict) or (missing := [key for key in CELL_KEYS if key not in c]):
            keys = missing if isinstance(c, dict) else list(CELL_KEYS)
            raise InputError(f"{where}: cells[{i}]: missing {', '.join(map(repr, keys))}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}" if seconds < 10 else f"{seconds * 1e3:.0f}"


def workloads(result: dict[str, Any]) -> list[str]:
    return [w["name"] for w in result["workloads"]]


def methods(result: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(c["method"] for c in result["cells"]))


def cell(result: dict[str, Any], method: str, workload: str) -> dict[str, Any] | None:
    return next((c for c in result["cells"] if c["method"] == method and c["workload"] == workload), None)


def latency_table(result: dict[str, Any]) -> str:
    """p50 / p95 latency (ms) of every method on every workload, and pairs/s on the last workload."""
    names = workloads(result)
    width = max(len(m) for m in methods(result))
    lines = [f"{'method':<{width}}  " + "  ".join(f"{n:>17}" for n in names) + "  peak MiB (last)"]
    lines.append(f"{'':<{width}}  " + "  ".join(f"{'p50 / p95 ms':>17}" for _ in names))
    for method in methods(result):
        row = []
        for name in names:
            c = cell(result, method, name)
            row.append(f"{_ms(c['p50_s']) + ' / ' + _ms(c['p95_s']):>17}" if c else f"{'-':>17}")
        last = cell(result, method, names[-1])
        memory = f"{last['peak_memory_bytes'] / 2**20:>15.0f}" if last else f"{'-':>15}"
        lines.append(f"{method:<{width}}  " + "  ".join(row) + "  " + memory)
    return "\n".join(lines)


def summary_workload(result: dict[str, Any]) -> str:
    """The workload the summary is about: reranking whole candidate lists if it ran, else the last."""
    names = workloads(result)
    return next((n for n in names if n.endswith("candidates")), names[-1])


def summary_table(result: dict[str, Any]) -> str:
    """Speed and quality side by side on one workload (see :func:`summary_workload`): each method's p50, its
    speed-up over the student's PyTorch fp32 and over sentence-transformers, the fraction of its FLOP floor it
    reaches, and its nDCG@10 and change from PyTorch fp32 on the judged queries of the input (for the
    sentence-transformers peers on another student, ``--peer_student``: from that student's PyTorch
    ``CrossEncoder``)."""
    name = summary_workload(result)
    quality = result.get("quality") or {"ndcg10": {}}
    ndcg = quality["ndcg10"]
    references = {"torch fp32": "student torch-fp32", "st": "st-crossencoder"}
    rates = result["matmul"]
    rate_text = f"{rates['dtype']} {rates['flops_per_s'] / 1e9:.0f} GFLOP/s"
    if rates.get("int8_ops_per_s"):
        rate_text += f", int8 {rates['int8_ops_per_s'] / 1e9:.0f} GOP/s"
    if rates.get("bf16_flops_per_s"):  # absent from results saved before bf16 backends had their own rate
        rate_text += f", bf16 {rates['bf16_flops_per_s'] / 1e9:.0f} GFLOP/s"
    header = f"{name}, p50 per call; FLOP floor at the matmul rates of this run ({rate_text})"
    if ndcg:
        header += f"; nDCG@10 on {quality['queries']} judged queries"
    rows = [c for c in result["cells"] if c["workload"] == name]
    width = max(len(c["method"]) for c in rows)
    lines = [header + ":", f"  {'method':<{width}}  {'ms':>8}  {'vs torch fp32':>13}  {'vs st':>7}  "
             f"{'of FLOP floor':>13}  {'nDCG@10':>7}  {'Δ vs fp32':>9}"]  # fmt: skip
    for c in rows:
        ratios = []
        for reference in references.values():
            ref = cell(result, reference, name)
            ratios.append(f"{ref['p50_s'] / c['p50_s']:.2f}x" if ref else "-")
        fraction = c.get("floor_fraction")  # absent from results saved before it was reported
        floor = "-" if fraction is None else f"{100 * fraction:.0f}%"
        value = ndcg.get(c["method"])
        reference = ndcg.get(quality.get("references", {}).get(c["method"], quality.get("reference", "")))
        delta = f"{value - reference:+.2f}" if value is not None and reference is not None else "-"
        value_text = "-" if value is None else f"{value:.2f}"
        lines.append(
            f"  {c['method']:<{width}}  {_ms(c['p50_s']):>8}  {ratios[0]:>13}  {ratios[1]:>7}  {floor:>13}  "
            f"{value_text:>7}  {delta:>9}"
        )
    return "\n".join(lines)


def speedups(result: dict[str, Any], reference: str) -> dict[str, dict[str, float]]:
    """method -> workload -> p50 of ``reference`` / p50 of the method, where both ran."""
    table: dict[str, dict[str, float]] = {}
    for method in methods(result):
        if method == reference:
            continue
        for name in workloads(result):
            ours, theirs = cell(result, method, name), cell(result, reference, name)
            if ours and theirs:
                table.setdefault(method, {})[name] = theirs["p50_s"] / ours["p50_s"]
    return table


def compare_table(result: dict[str, Any]) -> str:
    """Speed-up (p50 ratio) of each method over the teacher, the sentence-transformers baseline and the student's
    PyTorch fp32, one block per reference that ran."""
    blocks = []
    names = workloads(result)
    for reference in ("teacher cis", "st-crossencoder", "student torch-fp32"):
        if reference not in methods(result):
            continue
        table = speedups(result, reference)
        if not table:
            continue
        width = max(len(m) for m in table)
        lines = [f"speed-up over {reference} (its p50 / the method's p50):"]
        lines.append(f"  {'method':<{width}}  " + "  ".join(f"{n:>13}" for n in names))
        for method, row in table.items():
            values = "  ".join(f"{row[n]:>12.2f}x" if n in row else f"{'-':>13}" for n in names)
            lines.append(f"  {method:<{width}}  {values}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) if blocks else "no reference method ran: nothing to compare"


def write_csv(result: dict[str, Any], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(result["cells"])


def plot(result: dict[str, Any], path: Path) -> None:
    """A bar chart of p50 latency (log scale) per workload, one bar per method, each bar's value written on it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names, all_methods = workloads(result), methods(result)
    bar = 0.8 / len(all_methods)
    fig, ax = plt.subplots(figsize=(max(8.0, 1.6 * len(names)), 5.0))
    for k, method in enumerate(all_methods):
        xs, ys = [], []
        for i, name in enumerate(names):
            c = cell(result, method, name)
            if c:
                xs.append(i - 0.4 + bar * (k + 0.5))
                ys.append(c["p50_s"])
        bars = ax.bar(xs, ys, width=bar, label=method)
        for rect, y in zip(bars, ys, strict=True):
            label = f"{y:.2f}s" if y >= 1 else f"{y * 1e3:.0f}ms" if y >= 0.01 else f"{y * 1e3:.1f}ms"
            ax.annotate(
                label, (rect.get_x() + rect.get_width() / 2, y), ha="center", va="bottom", fontsize=6, rotation=90
            )
    env = result["environment"]
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("p50 latency per call (s, log scale)")
    ax.set_title(f"Reranking latency: {env['device_name']} ({env['device']}), {result['student']['name']}")
    ax.legend(fontsize=7, ncols=2)
    ax.margins(y=0.15)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
