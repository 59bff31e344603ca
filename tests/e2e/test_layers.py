"""The layers point one way, checked by importing each module in a fresh interpreter and reading sys.modules.

- the ground floor (``distill.core``, ``distill.data``, ``distill.model``, ``distill.eval``) imports nothing above it;
- ``teachers`` and ``students`` import only the ground floor (and not each other);
- serving imports no lightning, datasets, teachers, students or export code;
- the CLI imports a stage only when its subcommand runs: ``distill eval`` and ``distill rerank --backend onnx``
  never import torch;
- ``benchmarks`` (the checkout's measurement tooling, not in the wheel) is above everything: it may import
  ``distill``, ``teachers`` and ``students``, and no module of theirs imports it.
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DL19_QRELS, REPO

ABOVE_GROUND = (
    "teachers",
    "students",
    "distill.serving",
    "distill.export",
    "distill.stages",
    "distill.bench",
    "benchmarks",
    "distill.retrieval",
    "distill.cli",
    "distill.pipeline",
)
GROUND = ("distill.core", "distill.data", "distill.model", "distill.eval")
"""The ground floor: shared code, the data, the model resolver and model code, and evaluation (checked together,
as ``distill.core``'s rule)."""
RULES = {
    "distill.core": ABOVE_GROUND,
    "teachers": ("students", *ABOVE_GROUND[2:]),
    "students": ("teachers", *ABOVE_GROUND[2:]),
    "distill.serving": (
        "pytorch_lightning",
        "lightning",
        "datasets",
        "teachers",
        "students",
        "distill.export",
        "distill.stages",
        "distill.bench",
        "benchmarks",
        "distill.cli",
        "distill.pipeline",
    ),
}
"""Package -> what none of its modules may import (a module name or a package prefix)."""

PROBE = """
import importlib, json, sys
runpy_main = sys.argv[1] == "--main"
if runpy_main:
    from distill.cli import main
    code = main(sys.argv[2:])
    assert code == 0, code
else:
    for name in sys.argv[1:]:
        importlib.import_module(name)
print("MODULES" + json.dumps(sorted(sys.modules)))
"""


def loaded(*args: str) -> set[str]:
    """The modules a fresh interpreter holds after importing some modules (or running ``--main ARGS``)."""
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=REPO, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return set(json.loads(out.stdout.rsplit("MODULES", 1)[1]))


def offending(modules: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in forbidden))


def modules_of(package: str) -> list[str]:
    path = REPO.joinpath(*package.split("."))
    return [package] + [f"{package}.{m.name}" for m in pkgutil.walk_packages([str(path)]) if not m.name.startswith("_")]


@pytest.mark.slow
@pytest.mark.parametrize("package", list(RULES))
def test_each_module_imports_only_what_its_layer_may(package: str) -> None:
    """All of the package's modules in one interpreter; where that loads a forbidden module, each in its own, to name
    the culprit."""
    modules = [m for p in (GROUND if package == "distill.core" else (package,)) for m in modules_of(p)]
    bad = offending(loaded(*modules), RULES[package])
    if not bad:
        return
    for module in modules:
        own = offending(loaded(module), RULES[package])
        assert not own, f"{module} imports {own}"
    pytest.fail(f"{package}'s modules together import {bad}")


@pytest.mark.slow
def test_the_cli_imports_no_stage_and_eval_never_loads_torch(tmp_path: Path) -> None:
    assert not offending(loaded("distill.cli"), ("torch", *ABOVE_GROUND[:-2]))
    runs = REPO / "data" / "teacher" / "dl19-bm25-smollm2"
    modules = loaded("--main", "eval", "--qrels", str(DL19_QRELS), "--run", str(runs), "--metrics", "nDCG@10")
    assert not offending(modules, ("torch", "pytorch_lightning", "teachers", "students"))


@pytest.mark.slow
def test_rerank_on_onnx_never_loads_torch(tmp_path: Path, exported: Path, sample_file: Path) -> None:
    output = tmp_path / "run.trec"
    modules = loaded(
        "--main",
        "rerank",
        "--model",
        str(exported),
        "--backend",
        "onnx",
        "--input",
        str(sample_file),
        "--output",
        str(output),
    )
    assert output.is_file()
    assert not offending(modules, ("torch", "pytorch_lightning", "datasets", "teachers", "students", "distill.export"))


SERVE_PROBE = """
import json, sys
from fastapi.testclient import TestClient
from distill.serving.http_api import ServedModel, create_app
from distill.serving.reranker import Reranker
app = create_app(ServedModel(sys.argv[1], Reranker.load(sys.argv[1], backend="onnx", interpolation=False)))
with TestClient(app) as client:
    assert client.post("/rerank", json={"query": "q", "texts": ["a", "b"]}).status_code == 200
print("MODULES" + json.dumps(sorted(sys.modules)))
"""


@pytest.mark.slow
def test_serving_on_onnx_never_loads_torch(exported: Path) -> None:
    """``distill serve --backend onnx``'s app, answering a request, in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", SERVE_PROBE, str(exported)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    modules = set(json.loads(out.stdout.rsplit("MODULES", 1)[1]))
    assert not offending(modules, ("torch", "pytorch_lightning", "datasets", "teachers", "students", "distill.export"))


PACKAGES = ("distill", "teachers", "students")
"""The installed package (the wheel's three top-level packages)."""
TOOLING = "benchmarks"
"""The checkout's tooling, above the package."""


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its source (top level, in functions, under
    ``TYPE_CHECKING``), read with ``ast`` without importing anything. ``from pkg import name`` counts as importing
    ``pkg.name`` when that is a module, else ``pkg``; a package is its ``__init__``."""
    sources = {}
    for package in (*PACKAGES, TOOLING):
        for source in (REPO / package).rglob("*.py"):
            if REPO / TOOLING / "results" in source.parents:  # scripts kept with a result, not modules
                continue
            parts = source.relative_to(REPO).with_suffix("").parts
            sources[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = source
    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in sources else node.module
                    for a in node.names
                }
        graph[module] = {t for t in targets if t in sources and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm): each is an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycles_finds_a_planted_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_a_module_that_imports_it_back() -> None:
    """No import circle among the project's modules, lazy imports and ``TYPE_CHECKING`` imports included."""
    graph = import_graph()
    assert {"distill.export.parity", "distill.export.quality_gate", "students.module"} <= graph.keys()
    assert cycles(graph) == []


def test_nothing_in_the_package_imports_the_benchmarks() -> None:
    """``benchmarks`` may import the package; no module of ``distill``, ``teachers`` or ``students`` imports it, at
    the top, in a function or under ``TYPE_CHECKING`` (the wheel does not carry it)."""
    graph = import_graph()
    tooling = {m for m in graph if m == TOOLING or m.startswith(TOOLING + ".")}
    assert {"benchmarks.phases", "benchmarks.results_pages"} <= tooling
    assert any(t.startswith("distill.") for m in tooling for t in graph[m])  # the tooling does import the package
    bad = {m: sorted(t for t in graph[m] if t in tooling) for m in graph.keys() - tooling}
    assert {m: targets for m, targets in bad.items() if targets} == {}
