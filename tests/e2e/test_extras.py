"""The base install serves without torch; a command that needs an extra says which, in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from distill.cli import EXTRAS, missing_extra
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


def test_a_module_no_extra_installs_is_a_bug_with_its_traceback() -> None:
    error = ModuleNotFoundError("No module named 'nonesuch'", name="nonesuch")
    assert missing_extra(error, "distill x") is error
    assert {EXTRAS[m] for m in ("torch", "faiss", "openvino", "scipy")} == {"train", "retrieval", "openvino", "eval"}


@pytest.mark.slow
def test_rerank_and_serve_an_onnx_export_where_torch_cannot_be_imported(exported, sample_file, tmp_path) -> None:
    output = tmp_path / "run.trec"
    done = without(
        "torch", "rerank", "--model", str(exported), "--backend", "onnx", "--input", str(sample_file),
        "--output", str(output),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(output.read_text().splitlines()) == 36
