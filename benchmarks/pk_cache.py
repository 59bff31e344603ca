"""The p(K) cache's memory at MS MARCO's size: ``python -m benchmarks.pk_cache [--sizes 1000000 8800000]``.

For each N, a synthetic cache of N distinct passages' log p(K) (:func:`benchmarks.scale.synthetic_pk_cache`: the
teacher stage's segments of 256 entries, each named by its checksum; kept under ``--work`` for the next run) is
reopened in a fresh process (``python -m benchmarks.scale measure pk_cache``): seconds, the part spent checking
checksums, the peak RSS of the reopening and the RSS with the cache open (each above the process's imports), and one
lookup's time. MS MARCO's passage corpus has 8.8M passages, the most distinct passages a run over it keeps. The
result: ``benchmarks/results/scale-cpu/pk-cache.json`` and ``.md``, with the CPU and its flags.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import RESULTS, phases
from benchmarks.results_pages import pk_cache_table
from benchmarks.scale import _measure_in_process, synthetic_pk_cache

TARGET_BYTES = 512 * 2**20
"""The cache's resident memory at 8.8M passages: at most 0.5 GB."""


@dataclass
class PkCache:
    """The p(K) cache's reopening and memory against its number of entries."""

    sizes: list[int] = field(default_factory=lambda: [1_000_000, 8_800_000])
    """The numbers of distinct passages measured."""
    work: str = "/tmp/cis-distill-scale"
    """Where the synthetic caches go (kept: a rerun reuses them)."""
    out: str = str(RESULTS / "scale-cpu" / "pk-cache.json")
    """The JSON result; the Markdown table beside it (``.md``)."""


def run_sizes(options: PkCache, invocation: dict[str, Any]) -> int:
    rows = []
    for n in options.sizes:
        root = synthetic_pk_cache(n, Path(options.work) / f"pk-{n}")
        row = {"entries": n, **_measure_in_process("pk_cache", root=root)}
        row["met"] = row["resident_above_baseline_bytes"] <= TARGET_BYTES
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "what": "reopening a p(K) cache of N distinct passages: seconds and memory above the process's imports",
        "command": invocation["command"],
        "target_resident_bytes": TARGET_BYTES,
        **phases.this_cpu(),
        "rows": rows,
    }
    phases.write_result(result, options.out, pk_cache_table)
    return 0


def main(argv: list[str] | None = None) -> int:
    return phases.main(PkCache, run_sizes, "benchmarks.pk_cache", argv)


if __name__ == "__main__":
    raise SystemExit(main())
