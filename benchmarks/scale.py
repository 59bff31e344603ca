"""The data layer at scale (issue 26): ``python benchmarks/scale.py [--sizes 10000 100000 1000000]``.

The measuring is :mod:`distill.bench.scale`; results go to ``benchmarks/results/scale-cpu/``.
"""

import sys

from distill.bench.scale import main

if __name__ == "__main__":
    raise SystemExit(main(["run", *sys.argv[1:]]))
