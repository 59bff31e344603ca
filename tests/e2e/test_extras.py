"""The base install serves without torch; a command that needs an extra says which, in one line."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from distill.cli import EXTRAS, NO_EXTRA, missing_extra
from tests.conftest import REPO

BLOCK = "import sys\nfor name in sys.argv[1].split(','):\n    sys.modules[name] = None\n"


def without(modules: str, *argv: str) -> subprocess.CompletedProcess:
    """``distill argv`` in a fresh interpreter where ``modules`` (comma-separated) cannot be imported."""
    script = BLOCK + "from distill.cli import main\nsys.exit(main(sys.argv[2:]))\n"
    return subprocess.run([sys.executable, "-c", script, modules, *argv], capture_output=True, text=True, cwd=REPO)


def test_a_command_whose_extra_is_missing_names_it_in_one_line() -> None:
    done = without("torch,pytorch_lightning,lightning", "train", "--config", "configs/train/quickstart.yaml")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("distill train: error: distill train needs the train extra (")
    assert "pip install -e '.[train]'" in line


def test_the_openvino_backend_and_dense_retrieval_name_their_extra(exported, tmp_path) -> None:
    """Both ended in a traceback of a plain ImportError (OpenVINO's wrapped one; transformers' "AutoModel requires
    PyTorch"), which the line of a missing extra did not catch."""
    from tests.conftest import DL19

    argv = ["rerank", "--model", str(exported), "--backend", "openvino", "--input", str(DL19)]
    done = without("openvino", *argv, "--output", str(tmp_path / "run.trec"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "needs the openvino extra (openvino is not installed)" in done.stderr
    corpus, queries = tmp_path / "corpus.tsv", tmp_path / "queries.tsv"
    corpus.write_text("d1\tone passage\n")
    queries.write_text("q1\tone query\n")
    argv = ["retrieve", "--corpus", str(corpus), "--queries", str(queries), "--method", "dense"]
    done = without("torch", *argv, "--output", str(tmp_path / "dense.trec"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "needs the train extra (torch is not installed)" in done.stderr


def test_a_module_no_extra_installs_is_a_bug_with_its_traceback() -> None:
    error = ModuleNotFoundError("No module named 'nonesuch'", name="nonesuch")
    assert missing_extra(error, "distill x") is error
    assert {EXTRAS[m] for m in ("torch", "faiss", "openvino", "scipy")} == {"train", "retrieval", "openvino", "eval"}


def test_each_named_extra_installs_its_module() -> None:
    """The extra a missing module's line names lists a distribution that installs that module (checked against the
    installed distributions' files), and a module that no extra installs gets its own install line."""
    metadata = importlib.metadata.metadata("cis-distill")
    requirements = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    listed = {
        extra: {canonicalize_name(r.name) for r in requirements if r.marker and r.marker.evaluate({"extra": extra})}
        for extra in metadata.get_all("Provides-Extra")
    }
    installs = importlib.metadata.packages_distributions()
    for module, extra in EXTRAS.items():
        assert module in installs, f"{module} is not a module any installed distribution provides"
        assert {canonicalize_name(d) for d in installs[module]} & listed[extra], f"[{extra}] does not install {module}"
    for module in NO_EXTRA:
        assert not any(canonicalize_name(module) in names for names in listed.values()), f"an extra installs {module}"
        error = ModuleNotFoundError(f"No module named '{module}'", name=module)
        line = str(missing_extra(error, "distill train"))
        assert line.startswith(f"distill train needs {module}, which is not installed: pip install ")


@pytest.mark.slow
def test_rerank_and_serve_an_onnx_export_where_torch_cannot_be_imported(exported, sample_file, tmp_path) -> None:
    output = tmp_path / "run.trec"
    done = without(
        "torch", "rerank", "--model", str(exported), "--backend", "onnx", "--input", str(sample_file),
        "--output", str(output),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(output.read_text().splitlines()) == 36


@pytest.mark.slow
def test_the_python_api_scores_an_onnx_export_without_torch_quietly(exported) -> None:
    """transformers' import logs "PyTorch was not found. Models won't be available" where torch is missing: wrong
    for a reranker that scores with ONNX, and shown to every user of the light install's Python API."""
    script = (
        BLOCK + "from distill.serving.reranker import Reranker\n"
        "reranker = Reranker.load(sys.argv[2], backend='onnx')\n"
        "print(reranker.probabilities('a query', ['one passage', 'another passage']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, "torch", str(exported)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) == 2 and done.stderr == "", done.stderr
