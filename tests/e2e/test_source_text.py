"""The product's source says what the code is, not what it measured: no issue numbers, no paths into
``benchmarks/results/`` and none outside the repository (``../shared``) in ``distill``, ``teachers`` or ``students``
(``distill bench`` included). Measurements belong in the results pages, which a docstring names instead. The
project's own benchmark tooling (``benchmarks/``, beside its results, outside the package) writes into
``benchmarks/results/``: only its results paths are allowed."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("distill", "teachers", "students")
TOOLING = REPO / "benchmarks"
FORBIDDEN = re.compile(r"\bissues? #?\d+|\(#\d+\)|benchmarks/results|\.\./shared", re.IGNORECASE)
HISTORY = re.compile(r"\bissues? #?\d+|\(#\d+\)|\.\./shared", re.IGNORECASE)


def offending_lines(files: list[Path], pattern: re.Pattern = FORBIDDEN, root: Path = REPO) -> list[str]:
    """``path:line: text`` of each line of ``files`` that ``pattern`` finds, the paths relative to ``root``."""
    found = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_the_pattern_catches_each_kind(tmp_path: Path) -> None:
    lines = [
        "x = 1  # issue 21",
        '"""see (#13)"""',
        "RESULTS = 'benchmarks/results/x'",
        "'../shared/gpu/README.md'",
        "y = 2",
    ]
    path = tmp_path / "module.py"
    path.write_text("\n".join(lines))
    assert offending_lines([path], root=tmp_path) == [f"module.py:{n}: {line}" for n, line in enumerate(lines[:4], 1)]


def test_no_issue_numbers_or_results_paths_in_the_product() -> None:
    files = [p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))]
    assert len(files) > 50 and REPO / "distill" / "bench" / "latency.py" in files
    assert offending_lines(files) == []


def test_no_issue_numbers_in_the_benchmark_tooling_either() -> None:
    files = sorted(p for p in TOOLING.rglob("*.py") if TOOLING / "results" not in p.parents)  # not its records
    assert TOOLING / "phases.py" in files and offending_lines(files, HISTORY) == []
