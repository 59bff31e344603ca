"""An exported segment-cosine student loads without cis-distill: its modeling code travels as Hugging Face remote
code, and transformers, sentence-transformers and rerankers score it as cis-distill's Reranker does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from distill.model.segment_cosine import MODEL_TYPE

REPO = Path(__file__).resolve().parents[3]
QUERY = "what is a rhino"
PASSAGES = [
    "Rhinos are large herbivores with one or two horns.",
    "The stock market fell today as bond yields rose.",
    "The black rhinoceros lives in eastern and southern Africa; its horn is made of keratin.",
]

WITHOUT_CIS_DISTILL = """
import importlib.util, json, sys

# cis-distill is installed in this Python as an editable package: take its finder and its folder away
sys.meta_path[:] = [f for f in sys.meta_path if "cis_distill" not in getattr(f, "__module__", "")]
sys.path_hooks[:] = [h for h in sys.path_hooks if "cis_distill" not in getattr(h, "__module__", "")]
sys.path[:] = [p for p in sys.path if p not in ("", sys.argv[1])]
sys.path_importer_cache.clear()
for package in ("distill", "students", "teachers"):
    assert importlib.util.find_spec(package) is None, package
try:
    import distill
except ModuleNotFoundError:
    pass
else:
    raise AssertionError("cis-distill is importable")

loader, folder, query, passages = sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
if loader == "transformers":
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)  # it reads config.json too
    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()
    batch = tokenizer([query] * len(passages), passages, padding=True, truncation="only_second", return_tensors="pt")
    with torch.inference_mode():
        scores = model(**batch).logits[:, 0].tolist()
    kind = type(model).__module__
elif loader == "sentence-transformers":
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(folder, trust_remote_code=True, device="cpu")
    scores = model.predict([(query, p) for p in passages]).tolist()
    kind = type(model.model).__module__
else:
    from rerankers import Reranker

    trust = {"trust_remote_code": True}
    ranker = Reranker(folder, model_type="cross-encoder", model_kwargs=trust, tokenizer_kwargs=trust, device="cpu",
                      dtype="float32", verbose=0)
    ranked = ranker.rank(query, passages, doc_ids=list(range(len(passages))))
    scores = [score for _, score in sorted((r.document.doc_id, r.score) for r in ranked.results)]
    kind = type(ranker.model).__module__
assert not any(m == "distill" or m.startswith("distill.") for m in sys.modules)
print(json.dumps({"scores": scores, "module": kind}))
"""


@pytest.fixture(scope="module")
def segment_export(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path, parity) -> Path:
    """A tiny segment-cosine student (its scale and bias moved off their initial values), exported to TorchScript."""
    from distill.export.exporter import export_student
    from students.model import build_student, save_student

    model, tokenizer = build_student(str(tiny_bert), head="segment_cosine")
    with torch.no_grad():
        model.scale.fill_(7.0)
        model.bias.fill_(-2.0)
    root = tmp_path_factory.mktemp("segment-cosine")
    folder = save_student(model, tokenizer, root / "student", None)
    export_student(folder, root / "export", formats=("torchscript",), parity=parity)
    return root / "export"


def test_the_export_carries_the_heads_own_module_as_remote_code(segment_export: Path) -> None:
    """The modeling file is the project's module itself (one source, no copy to drift) and imports only torch and
    transformers; config.json maps the Auto classes to it."""
    import ast

    from distill.model import segment_cosine

    code = (segment_export / "modeling_segment_cosine.py").read_text()
    assert code == Path(segment_cosine.__file__).read_text()
    imported = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert imported == {"__future__", "typing", "torch", "transformers"}
    config = json.loads((segment_export / "config.json").read_text())
    assert config["model_type"] == MODEL_TYPE
    assert config["auto_map"] == {
        "AutoConfig": "modeling_segment_cosine.BertSegmentCosineConfig",
        "AutoModelForSequenceClassification": "modeling_segment_cosine.BertForSegmentCosine",
    }
    assert json.loads((segment_export / "card.json").read_text())["remote_code"] == "modeling_segment_cosine.py"


def test_the_cls_head_gets_no_remote_code(exported: Path) -> None:
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == "bert" and "auto_map" not in config
    assert not list(exported.glob("modeling_*.py"))
    assert json.loads((exported / "card.json").read_text())["remote_code"] is None


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["transformers", "sentence-transformers", "rerankers"])
def test_a_python_without_cis_distill_scores_as_the_reranker(segment_export: Path, tmp_path: Path, loader: str) -> None:
    """In a subprocess where cis-distill cannot be imported, each ecosystem loader gives Reranker's fp32 scores."""
    if loader == "rerankers":
        pytest.importorskip("rerankers")
    from distill.serving.reranker import Reranker

    reference = Reranker.load(segment_export, backend="torch", dtype="float32").score(QUERY, PASSAGES)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    env.pop("PYTHONPATH", None)
    args = [str(REPO), loader, str(segment_export), QUERY, json.dumps(PASSAGES)]
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_CIS_DISTILL, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "custom code" not in done.stdout + done.stderr  # trust_remote_code reached every loader: no prompt
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["module"].startswith("transformers_modules.")  # the folder's own modeling file
    assert np.abs(np.array(result["scores"]) - np.array(reference)).max() <= 1e-5
    assert np.std(reference) > 1e-3  # distinct scores: a constant output would pass the comparison
