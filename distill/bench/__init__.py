"""``distill bench``: the latency of a student's backends against its teacher and the sentence-transformers
baseline (:mod:`distill.bench.latency`). The project's own measurement tooling is not here but in the checkout's
``benchmarks/`` package."""
