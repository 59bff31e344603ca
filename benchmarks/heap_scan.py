"""How long the garbage collector's full collection holds the interpreter in a server process that has loaded a model,
before and after :func:`distill.serving.server.freeze_loaded_heap`: every request in flight waits for it.

It loads the student as ``distill serve`` would (its backend, warmed up), counts the objects the collector tracks, and
times ``--repeats`` full collections, then freezes the loaded heap and times as many again. One JSON object on
stdout (and in ``--out``), with the CPU's name and flags.

    python -m benchmarks.heap_scan --model checkpoints/fs-mpnet-student-dl22s-judged-final --backend torch \
        --out benchmarks/results/heap-scan/heap-scan.json
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

from distill.bench.measure import cpu_name, git_commit
from distill.serving.hardware import CpuFeatures
from distill.serving.options import ServingOptions
from distill.serving.reranker import Reranker
from distill.serving.server import freeze_loaded_heap


def full_collections_ms(repeats: int) -> list[float]:
    """``repeats`` full collections' wall times, in milliseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        gc.collect()
        times.append(round((time.perf_counter() - start) * 1e3, 3))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.heap_scan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the student: an export folder or a run's hf/ folder")
    parser.add_argument("--backend", default="auto", help="the backend, as distill serve's --backend")
    parser.add_argument("--repeats", type=int, default=5, help="full collections timed before and after freezing")
    parser.add_argument("--out", type=Path, help="also write the JSON object here")
    args = parser.parse_args(argv)
    reranker = Reranker.load(args.model, ServingOptions(backend=args.backend))
    reranker.warm_up()
    tracked = len(gc.get_objects())
    before = full_collections_ms(args.repeats)
    frozen = freeze_loaded_heap()
    result = {
        "command": "python -m benchmarks.heap_scan " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": git_commit(),
        "cpu": cpu_name(),
        "cpu_flags": sorted(CpuFeatures.read().flags),
        "python": sys.version.split()[0],
        "model": args.model,
        "backend": reranker.backend,
        "tracked_objects": tracked,
        "full_collection_ms": before,
        "frozen_objects": frozen,
        "tracked_objects_after_freeze": len(gc.get_objects()),
        "full_collection_ms_after_freeze": full_collections_ms(args.repeats),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
