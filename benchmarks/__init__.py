"""The project's own measurement tooling, run from a checkout as ``python -m benchmarks.<name>`` (see
``benchmarks/README.md``): the throughput of the teacher and of training, the GPU suite, the CPU design studies
(``onnx_cpu``, ``int8``), the data layer at scale, the serving load generator, and the results pages and README
block made from the committed results in ``benchmarks/results/``.

It is not part of the installed package: it may import ``distill``, ``teachers`` and ``students``, and nothing in
them imports it. ``distill bench`` (the latency benchmark users run) is the package's own (:mod:`distill.bench`).
"""

from __future__ import annotations

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
"""The checkout's root: the folder holding ``benchmarks/``, ``configs/``, ``data/`` and ``checkpoints/``."""
RESULTS = Path(__file__).resolve().parent / "results"
"""The committed results, beside this code."""
