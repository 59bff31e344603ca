"""Hub ids as models: ``Reranker.load``, ``distill rerank`` and ``distill serve`` take ``org/name`` (with a
revision), resolved through huggingface_hub into its cache; tested offline on a cache the test lays out as the hub
does (``models--org--name/snapshots/<commit>``, ``refs/<branch or tag>``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from distill.eval.trec_runs import read_trec_run
from tests.conftest import DISTILL, REPO
from tests.distill.serving.test_http_api import serve_process

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture(scope="module")
def hub_cache(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hub cache holding ``acme/reranker``: the export at COMMIT (``main``), and at OTHER (tag ``v0``) the same
    export without its score calibration."""
    cache = tmp_path_factory.mktemp("hub")
    repo = cache / "models--acme--reranker"
    shutil.copytree(exported, repo / "snapshots" / COMMIT)
    old = repo / "snapshots" / OTHER
    shutil.copytree(exported, old)
    card = json.loads((old / "card.json").read_text())
    card["score_calibration"] = None
    (old / "card.json").write_text(json.dumps(card))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "refs" / "v0").write_text(OTHER)
    return cache


def offline(cache: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def test_reranker_load_takes_a_hub_id_and_a_revision(hub_cache: Path, exported: Path, call) -> None:
    query, passages = call
    script = (
        "import json, sys\n"
        "from distill.serving.reranker import Reranker\n"
        "r = Reranker.load(sys.argv[1], backend='onnx', interpolation=False, revision=sys.argv[2] or None)\n"
        "print(json.dumps({'calibrated': r.calibration is not None, 'scores': r.score(sys.argv[3], sys.argv[4:])}))\n"
    )
    answers = {}
    for revision in ("", "v0", COMMIT):
        done = subprocess.run(
            [sys.executable, "-c", script, "acme/reranker", revision, query, *passages[:5]],
            env=offline(hub_cache), capture_output=True, text=True, cwd=REPO,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        answers[revision] = json.loads(done.stdout.splitlines()[-1])
    from distill.serving.reranker import Reranker

    local = Reranker.load(exported, backend="onnx", interpolation=False).score(query, passages[:5])
    assert answers[""]["scores"] == pytest.approx(local, abs=1e-6) and answers[""]["calibrated"]
    assert answers[COMMIT]["calibrated"] and not answers["v0"]["calibrated"]  # the revision picks the snapshot


def test_rerank_and_serve_take_a_hub_id(hub_cache: Path, exported: Path, sample_file: Path, tmp_path, monkeypatch):
    runs = {}
    for name, model in (("hub", "acme/reranker"), ("local", str(exported))):
        output = tmp_path / f"{name}.trec"
        command = [DISTILL, "rerank", "--model", model, "--backend", "onnx", "--input", str(sample_file)]
        done = subprocess.run(
            [*command, "--output", str(output)], env=offline(hub_cache), capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        runs[name] = read_trec_run(output)
    assert runs["hub"].keys() == runs["local"].keys()
    for qid, scores in runs["local"].items():
        assert runs["hub"][qid] == pytest.approx(scores, abs=1e-5)

    for key, value in offline(hub_cache).items():
        monkeypatch.setenv(key, value)
    command = [DISTILL, "serve", "--model", "acme/reranker", "--revision", "v0", "--backend", "onnx", "--port", "0"]
    with serve_process([*command, "--model", f"local={exported}"]) as (_, url):
        info = httpx.get(f"{url}/info").json()
        answer = httpx.post(f"{url}/rerank", json={"query": "q", "texts": ["a", "b"]})
        by_id = httpx.post(f"{url}/rerank", json={"query": "q", "texts": ["a"], "model": "acme/reranker"})
    assert info["model"] == str(hub_cache / "models--acme--reranker" / "snapshots" / OTHER)
    assert answer.status_code == 200 and info["score_calibration"] is None
    assert by_id.status_code == 200  # a bare hub id is named by itself, as a client sends it


def test_a_hub_id_not_in_the_cache_offline_is_one_line(hub_cache: Path, sample_file: Path, tmp_path: Path) -> None:
    for model, revision in (("acme/missing", []), ("acme/reranker", ["--revision", "nope"])):
        command = [DISTILL, "rerank", "--model", model, *revision, "--input", str(sample_file)]
        done = subprocess.run(
            [*command, "--output", str(tmp_path / "x.trec")], env=offline(hub_cache), capture_output=True, text=True
        )
        assert done.returncode != 0 and "Traceback" not in done.stderr
        assert f"cannot find model {model!r}" in done.stderr and f"not in the hub cache ({hub_cache})" in done.stderr
    for model, revision, message in (
        ("acme/reranker", ["--revision", ""], "revision: empty: give a branch, tag or commit"),  # read refs/ itself
        ("a/b/c", [], "a/b/c: no such run or model folder, nor a hub id (org/name)"),
    ):
        command = [DISTILL, "rerank", "--model", model, *revision, "--input", str(sample_file)]
        done = subprocess.run(
            [*command, "--output", str(tmp_path / "x.trec")], env=offline(hub_cache), capture_output=True, text=True
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr


def test_the_python_api_checks_its_input_as_the_http_routes_do(tiny_bert: Path) -> None:
    from distill.core.schema import InputError
    from distill.serving.reranker import Reranker

    reranker = Reranker.load(tiny_bert, backend="torch")
    passages = ["fleas are insects", "cats are mammals", "a flea jumps"]
    expected = reranker.score("flea", passages)
    assert reranker.score("flea", (p for p in passages)) == expected  # a generator is read once, not consumed twice
    assert reranker.rerank("flea", iter(passages)) == reranker.rerank("flea", passages)
    for query in ("", "   "):
        with pytest.raises(InputError, match="query: must not be empty"):
            reranker.score(query, passages)
    for top_k in (1.5, "2", True):
        with pytest.raises(TypeError, match=f"top_k must be an int or None, got {top_k!r}"):
            reranker.rerank("flea", passages, top_k=top_k)
    with pytest.raises(InputError, match="interpolation: true, false or an alpha in \\[0, 1\\], not 'yes' \\(str\\)"):
        Reranker.load(tiny_bert, backend="torch", interpolation="yes")
