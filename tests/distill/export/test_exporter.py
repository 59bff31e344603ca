"""Export (ONNX fp32/fp16/int8, TorchScript) with its parity check, and the Reranker on every backend."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from distill.core.schema import InputError
from distill.data.loaders import load_candidates
from distill.export.exporter import export_student
from distill.export.parity import BATCH_SIZES, SCORE_BOUNDS, SHORT_MAX_LENGTH, FormatParity, ParityError, verify_export
from distill.export.parity_set import NDCG_BOUND, ParitySet
from distill.export.quality_gate import measure_quality_gate
from distill.serving.auto import choose_backend
from distill.serving.encoding import encode_pairs, pad_batch
from distill.serving.hardware import CpuFeatures
from distill.serving.reranker import Reranker
from distill.serving.scorers import TorchScorer
from tests.conftest import DL19, DL19_QRELS


def pytorch_scores(folder: Path, queries: list[str], passages: list[str], max_length: int = 512) -> np.ndarray:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    features = encode_pairs(tokenizer, queries, passages, max_length).features
    return TorchScorer(folder)(pad_batch(tokenizer, features))


def test_export_writes_every_format_and_a_card(exported: Path, student: Path) -> None:
    for name in ("model.onnx", "model.fp16.onnx", "model.int8.onnx", "model.torchscript.pt", "tokenizer.json"):
        assert (exported / name).is_file(), name
    assert not list(exported.parent.glob(".student.tmp*"))  # the staging folder is gone
    card = json.loads((exported / "card.json").read_text())
    assert card["formats"] == {
        "onnx": "model.onnx",
        "onnx-fp16": "model.fp16.onnx",
        "onnx-int8": "model.int8.onnx",
        "torchscript": "model.torchscript.pt",
    }
    # the layout text-embeddings-inference and sentence-transformers' ONNX backend read: one label, onnx/model.onnx
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and len(config["id2label"]) == 1
    assert os.path.samefile(exported / "onnx" / "model.onnx", exported / "model.onnx")
    assert card["inputs"] == ["input_ids", "attention_mask", "token_type_ids"] and card["max_length"] == 512
    assert card["onnx_opset"] >= 17 and card["student"]["label"] == "qrels grade"
    assert (exported / card["source"]).resolve() == student.resolve() and card["versions"]["onnxruntime"]
    parity = {p["format"]: p for p in card["parity"]}
    cases = {f"batch={b} max_length={m}" for b in BATCH_SIZES for m in (SHORT_MAX_LENGTH, 512)}
    for fmt in ("onnx", "torchscript", "onnx-int8"):
        assert set(parity[fmt]["by_case"]) == cases, fmt  # any batch size, short and full lengths
    for fmt in ("onnx", "torchscript"):
        assert parity[fmt]["max_abs_diff"] <= SCORE_BOUNDS[fmt] == 1e-4
    fp16 = parity["onnx-fp16"]
    assert fp16["device"] == "cpu" and fp16["max_abs_diff"] <= 2e-2 and not fp16.get("not_checked"), fp16
    ndcg = parity["onnx-int8"]["ndcg10"]
    assert ndcg["pytorch"] > 0 and abs(ndcg["delta"]) <= NDCG_BOUND == 0.5


def test_the_onnx_graphs_are_fused_and_the_card_says_how(exported: Path) -> None:
    """The fp32 graph holds onnxruntime's fused transformer ops (and passed the 1e-4 parity bound above); the int8
    graph is quantised from it, statically, with activation scales calibrated on DL21 and DL22 pairs."""
    import onnx

    card = json.loads((exported / "card.json").read_text())["optimizations"]
    n = 2  # layers of the tiny BERT of conftest
    fused = {"EmbedLayerNormalization": 1, "Attention": n, "SkipLayerNormalization": 2 * n, "BiasGelu": n}
    assert card["onnx"]["fused_ops"] == fused and "TorchScript" in card["onnx"]["exporter"]
    # the last layer's output projection, feed-forward block and 2 LayerNorms: MatMul, SkipLN, MatMul, BiasGelu, ...
    assert card["onnx"]["first_token_tail_ops"] == 6
    ops = [node.op_type for node in onnx.load(str(exported / "model.onnx")).graph.node]
    assert {op: ops.count(op) for op in fused} == fused and "Softmax" not in ops and "Erf" not in ops
    int8 = card["onnx-int8"]
    assert int8["mode"] == "static" and int8["from"] == "model.onnx" and int8["format"] == "QDQ"
    calibration = int8["calibration"]
    assert [Path(p).parent.name for p in calibration["inputs"]] == ["trec-dl21", "trec-dl22"]
    assert calibration["pairs"] == 4 * (53 + 76) and calibration["method"] == "MinMax"
    int8_ops = {node.op_type for node in onnx.load(str(exported / "model.int8.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= int8_ops


def test_export_folder_loads_as_hf_and_cross_encoder(exported: Path, parity: ParitySet) -> None:
    st = pytest.importorskip("sentence_transformers")
    from transformers import AutoModelForSequenceClassification

    assert AutoModelForSequenceClassification.from_pretrained(exported).config.num_labels == 1
    pairs = [(p.query, p.passage) for p in parity.pairs[:8]]
    theirs = st.CrossEncoder(str(exported), device="cpu").predict(pairs)
    ours = pytorch_scores(exported, [q for q, _ in pairs], [p for _, p in pairs])
    np.testing.assert_allclose(theirs, ours, rtol=1e-5, atol=1e-5)


def edit_initializer(path: Path, suffix: str, change) -> None:
    """Plant a broken graph: ``change`` the values of the initializer of ``path`` whose name ends with ``suffix``."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path))
    (tensor,) = [t for t in graph.graph.initializer if t.name.endswith(suffix)]
    tensor.CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(tensor)), tensor.name))
    onnx.save(graph, str(path))


def break_classifier_bias(path: Path) -> None:
    """Every score of ``path`` moves by +1."""
    edit_initializer(path, "classifier.bias", lambda bias: bias + 1.0)


def test_a_broken_graph_fails_the_parity_check(exported: Path, parity: ParitySet, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(exported, broken)
    break_classifier_bias(broken / "model.onnx")
    with pytest.raises(ParityError) as caught:
        verify_export(broken, parity)
    message = str(caught.value)
    assert re.search(r"onnx: max \|Δscore\| 1 > bound 0.0001, worst at batch=\d+ max_length=\d+: query \d+ '", message)
    assert re.search(r"passage \d+ .*\(PyTorch -?[\d.]+, onnx -?[\d.]+\)", message)
    assert "torchscript" not in message and "onnx-int8" not in message  # the others still hold
    assert {r.format for r in caught.value.results} == {"onnx", "onnx-fp16", "onnx-int8", "torchscript"}


def test_onnx_model_onnx_must_be_the_checked_graph(exported: Path, parity: ParitySet, tmp_path: Path) -> None:
    """``onnx/model.onnx`` (where other runtimes read the graph) is held to ``model.onnx``, byte for byte: a copy
    passes, another graph there fails the check, naming it."""
    copied = tmp_path / "copied"
    shutil.copytree(exported, copied)  # a copy, no longer a hard link
    assert not os.path.samefile(copied / "onnx" / "model.onnx", copied / "model.onnx")
    verify_export(copied, parity)
    break_classifier_bias(copied / "onnx" / "model.onnx")
    with pytest.raises(ParityError, match=r"onnx/model\.onnx: not the same bytes as model\.onnx"):
        verify_export(copied, parity)


def test_a_failed_export_writes_nothing(
    student: Path, parity: ParitySet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distill.export import onnx_graphs

    real = onnx_graphs.export_onnx

    def planted(model, example, path):
        real(model, example, path)
        break_classifier_bias(path)

    monkeypatch.setattr(onnx_graphs, "export_onnx", planted)
    with pytest.raises(ParityError, match=r"out \(nothing written\): parity check failed:\n  onnx: max \|Δscore"):
        export_student(student, tmp_path / "out", formats=("onnx",), parity=parity)
    assert list(tmp_path.iterdir()) == []


def test_int8_ranking_bound_is_enforced(exported: Path, parity: ParitySet, tmp_path: Path) -> None:
    """An int8 graph that reverses the ranking (its classifier negated) fails the quality gate: the parity check
    records its nDCG@10 beside the bound without failing the export, and ``backend="auto"`` never chooses it;
    without a gate the bound is recorded as not checked."""
    planted = tmp_path / "planted"
    shutil.copytree(exported, planted)
    shutil.copy(planted / "model.onnx", planted / "model.int8.onnx")
    edit_initializer(planted / "model.int8.onnx", "classifier.weight", lambda weight: -weight)
    gate = measure_quality_gate(planted, parity, "onnxruntime")
    assert not gate.backends["onnx-int8"].passed and gate.backends["onnx-int8"].delta < -NDCG_BOUND
    checked = {r.format: r for r in verify_export(planted, parity, gate=gate)}["onnx-int8"]
    assert checked.failure() is None and checked.ndcg10["delta"] == gate.backends["onnx-int8"].delta < -NDCG_BOUND
    (planted / "card.json").write_text(json.dumps({"quality_gate": gate.to_dict()}))
    vnni = CpuFeatures(frozenset({"avx2", "avx512f", "avx512_vnni"}))
    assert choose_backend(planted, features=vnni, runtimes={"onnxruntime", "torch"}).backend == "torch-fp32"
    int8 = {r.format: r for r in verify_export(planted, parity)}["onnx-int8"]  # no gate: the bound is not checked
    assert int8.ndcg10 is None and int8.not_checked == "nDCG@10 not checked: no judged validation queries to rank"


def test_nan_scores_break_any_bound(parity: ParitySet) -> None:
    result = FormatParity("onnx-int8")  # no score bound of its own
    reference = np.zeros(len(parity.pairs))
    scores = reference.copy()
    scores[3] = np.nan
    result.record("batch=7 max_length=32", reference, scores, parity.pairs)
    worst = f"worst at batch=7 max_length=32: query {parity.pairs[3].qid}"
    assert result.failure().startswith(f"onnx-int8: max |Δscore| nan > bound inf, {worst}")


def test_fp16_the_cpu_cannot_run_is_recorded_as_not_checked(
    exported: Path, parity: ParitySet, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxruntime
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

    from distill.export import parity as parity_module

    real = parity_module.OnnxScorer

    def cpu_without_fp16(path: Path, device: str = "cpu"):
        if path.name == "model.fp16.onnx":
            with pytest.MonkeyPatch.context() as patch:  # onnxruntime's error, as OnnxScorer meets it
                patch.setattr(onnxruntime, "InferenceSession", not_implemented)
                return real(path, device)
        return real(path, device)

    def not_implemented(*args, **kwargs):
        raise ort_errors.NotImplemented("Could not find an implementation for LayerNormalization(17)")

    monkeypatch.setattr(parity_module, "OnnxScorer", cpu_without_fp16)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    fp16 = {r.format: r for r in verify_export(exported, parity)}["onnx-fp16"]
    assert fp16.device is None and fp16.max_abs_diff is None and fp16.failure() is None
    assert fp16.not_checked == (
        "not checked: onnxruntime cannot run it on the CPU (Could not find an implementation for "
        "LayerNormalization(17)), and there is no CUDA provider"
    )


def test_a_graph_onnxruntime_cannot_run_is_one_line(exported: Path, tmp_path: Path) -> None:
    """An invalid fp16 graph (as an earlier export wrote for a segment-cosine student) was a traceback at load."""
    import onnx
    from onnx import TensorProto, helper

    folder = tmp_path / "export"
    shutil.copytree(exported, folder)
    eps = helper.make_tensor("eps", TensorProto.FLOAT, [1], [1e-8])
    graph = helper.make_graph(
        [helper.make_node("Max", ["x", "eps"], ["logits"])],
        "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT16, [1])],
        [eps],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx")
    with pytest.raises(
        InputError, match=re.escape(f"{folder / 'model.onnx'}: onnxruntime cannot run this graph on cpu")
    ):
        Reranker.load(folder, backend="onnx")


def test_bad_export_arguments(student: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown export format"):
        export_student(student, tmp_path / "x", formats=("tflite",))
    with pytest.raises(ValueError, match="add 'onnx'"):
        export_student(student, tmp_path / "x", formats=("torchscript",), int8="static")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"not an export folder \(no card.json\): choose another --output$"):
        export_student(student, tmp_path / "taken")
    with pytest.raises(FileNotFoundError, match=r"nowhere: missing config\.json"):
        export_student(tmp_path / "nowhere", tmp_path / "y")


def test_export_refuses_a_trec_run_without_a_hint_it_cannot_take(student: Path, tmp_path: Path, capsys) -> None:
    """Export said a TREC run needs --queries and --corpus, which export does not take."""
    from distill.cli import main

    run = tmp_path / "bm25.trec"
    run.write_text("q1 Q0 d1 1 5.0 bm25\n")
    for option in ("--parity_input", "--validation_input"):
        assert main(["export", "--checkpoint", str(student), option, str(run), "--output", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert f"{run}: a TREC run has no texts; export takes candidates with theirs" in err and "--corpus" not in err
    assert not (tmp_path / "x").exists()


FRESH_PROCESS = """
import json, sys
import numpy as np, onnxruntime
from tokenizers import Tokenizer

folder, pairs = sys.argv[1], json.loads(sys.argv[2])
tokenizer = Tokenizer.from_file(folder + "/tokenizer.json")
tokenizer.enable_truncation(max_length=512, strategy="only_second")
tokenizer.enable_padding(pad_id=tokenizer.token_to_id("[PAD]"), pad_token="[PAD]")
encodings = tokenizer.encode_batch([tuple(p) for p in pairs])
arrays = {
    "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
    "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
    "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
}
session = onnxruntime.InferenceSession(folder + "/model.onnx", providers=["CPUExecutionProvider"])
(logits,) = session.run(["logits"], {i.name: arrays[i.name] for i in session.get_inputs()})
assert "torch" not in sys.modules and "distill" not in sys.modules and "transformers" not in sys.modules
print(json.dumps(logits[:, 0].tolist()))
"""


def test_onnx_runs_in_a_fresh_process_without_torch(exported: Path, parity: ParitySet) -> None:
    pairs = [(p.query, p.passage) for p in [*parity.pairs[:40:5], parity.pairs[-1]]]  # the long one cut to 512
    done = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(exported), json.dumps(pairs)],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    theirs = np.array(json.loads(done.stdout.splitlines()[-1]))
    ours = pytorch_scores(exported, [q for q, _ in pairs], [p for _, p in pairs])
    assert np.abs(theirs - ours).max() <= 1e-4


@pytest.fixture(scope="module")
def candidates() -> tuple[str, list[str]]:
    """A real DL19 query and its first 20 BM25 passages."""
    first = load_candidates(DL19).candidates[0]
    return first.query.text, [p.text for p in first.passages[:20]]


@pytest.mark.parametrize(
    ("backend", "dtype", "tolerance"), [("onnx", None, 1e-4), ("torchscript", None, 1e-4), ("openvino", None, 1e-4)]
)
def test_reranker_backends_agree(
    exported: Path, candidates: tuple[str, list[str]], backend: str, dtype: str | None, tolerance: float
) -> None:
    if backend == "openvino":
        pytest.importorskip("openvino")
    query, passages = candidates
    reference = Reranker.load(exported, backend="torch").score(query, passages)
    reranker = Reranker.load(exported, backend=backend, dtype=dtype, max_batch_tokens=600)  # several batches
    scores = reranker.score(query, passages)
    np.testing.assert_allclose(scores, reference, atol=tolerance, rtol=0)
    ranked = reranker.rerank(query, passages, top_k=5)
    assert [i for i, _ in ranked] == sorted(range(len(passages)), key=lambda i: -scores[i])[:5]
    assert [s for _, s in ranked] == [scores[i] for i, _ in ranked]


def test_reranker_restores_the_input_order(exported: Path, candidates: tuple[str, list[str]]) -> None:
    query, passages = candidates
    reranker = Reranker.load(exported, backend="onnx", max_batch_tokens=300)
    one_by_one = [reranker.score(query, [p])[0] for p in passages]
    np.testing.assert_allclose(reranker.score(query, passages), one_by_one, atol=1e-5, rtol=0)
    assert len(reranker.rerank(query, passages)) == len(passages)


def test_reranker_quantised_and_half_files(exported: Path, candidates: tuple[str, list[str]]) -> None:
    query, passages = candidates
    reference = Reranker.load(exported, backend="torch").score(query, passages)
    int8 = Reranker.load(exported, backend="onnx", dtype="int8", threads=1).score(query, passages)
    assert np.corrcoef(int8, reference)[0, 1] > 0.99
    if importlib.util.find_spec("openvino"):  # the same static int8 graph on OpenVINO
        openvino = Reranker.load(exported, backend="openvino", dtype="int8", threads=1).score(query, passages)
        assert np.corrcoef(openvino, reference)[0, 1] > 0.99
    fp16 = Reranker.load(exported, backend="onnx", dtype="float16").score(query, passages)
    np.testing.assert_allclose(fp16, reference, atol=2e-2, rtol=0)


def test_session_settings_reach_onnxruntime() -> None:
    import onnxruntime as ort

    from distill.serving.scorers import SessionSettings

    options = SessionSettings(threads=1, graph_optimization="basic", memory_arena=False, spinning=False).options()
    assert options.intra_op_num_threads == 1 and not options.enable_cpu_mem_arena
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert SessionSettings().options().intra_op_num_threads == 0  # onnxruntime's default: one per physical core


def test_reranker_load_takes_a_training_run_as_serve_and_rerank_do(student: Path, exported: Path, tmp_path: Path):
    """A run folder: its export for every backend (torch took its HF folder, without the export's calibration: the
    normalised scores changed with the backend); a folder of neither is one line."""
    import shutil

    from distill.core.schema import MissingFileError

    run = tmp_path / "run"
    shutil.copytree(student, run / "hf")
    shutil.copytree(exported, run / "export")
    query, passages = "a query", ["a passage", "another passage about something else"]
    from_run = Reranker.load(run, backend="onnx").score(query, passages)
    assert from_run == Reranker.load(exported, backend="onnx").score(query, passages)
    torch_run = Reranker.load(run, backend="torch")
    assert torch_run.score(query, passages) == Reranker.load(exported, backend="torch").score(query, passages)
    assert torch_run.calibration is not None
    np.testing.assert_allclose(
        torch_run.probabilities(query, passages), Reranker.load(run, backend="onnx").probabilities(query, passages),
        atol=1e-6,
    )  # fmt: skip
    shutil.rmtree(run / "export")  # a run not exported yet: its HF folder, for torch
    assert Reranker.load(run, backend="torch").score(query, passages) == torch_run.score(query, passages)
    with pytest.raises(
        MissingFileError, match=rf"^{tmp_path / 'nowhere'}: no such run or model folder, nor a hub id \(org/name\)$"
    ):
        Reranker.load(tmp_path / "nowhere")
    with pytest.raises(InputError, match=r"^model: the name is empty"):  # Path("") named the working folder
        Reranker.load("")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingFileError, match="no student here"):
        Reranker.load(tmp_path / "empty")


def test_reranker_bad_input(exported: Path, tmp_path: Path) -> None:
    reranker = Reranker.load(exported, backend="onnx", max_length=64)
    assert reranker.score("a query", []) == [] and reranker.rerank("a query", []) == []
    as_array = np.array(["a passage", "another passage"])  # numpy's strings are str: scored as the list is
    assert reranker.score("a query", as_array) == reranker.score("a query", as_array.tolist())
    assert reranker.score("a query", np.array([], dtype=str)) == []
    scores = reranker.score("a query", ["", "a passage", "word " * 300])  # an empty passage is scored
    assert len(scores) == 3 and all(math.isfinite(s) for s in scores)
    assert reranker.truncated == 1
    assert len(reranker.score("word " * 100, ["a passage"])) == 1  # a query over the max length too
    assert reranker.truncated == 2
    with pytest.raises(TypeError, match="sequence of passage strings"):
        reranker.score("a query", "a passage")
    with pytest.raises(InputError, match=r"^passages\[1\]: has a lone UTF-16 surrogate \(\\ud800\) at character 1,"):
        reranker.score("a query", ["fine", "a\ud800"])  # the tokenizer's own TypeError otherwise
    with pytest.raises(InputError, match=r"^query: has a NUL character \(\\u0000\) at character 1;"):
        reranker.score("a\x00", ["fine"])
    with pytest.raises(ValueError, match="top_k"):
        reranker.rerank("a query", ["a"], top_k=-1)
    with pytest.raises(ValueError, match="over the model's 512"):
        Reranker.load(exported, max_length=1000)
    with pytest.raises(ValueError, match="dtype is one of"):
        Reranker.load(exported, backend="onnx", dtype="bfloat16")
    with pytest.raises(ValueError, match="torch backend only"):
        Reranker.load(exported, backend="torchscript", dtype="float16")

    partial = tmp_path / "partial"
    shutil.copytree(exported, partial, ignore=shutil.ignore_patterns("model.onnx", "model.safetensors"))
    with pytest.raises(FileNotFoundError, match=rf"{partial}: missing model\.onnx"):
        Reranker.load(partial, backend="onnx")
    with pytest.raises(FileNotFoundError, match=rf"{partial}: missing model\.safetensors"):
        Reranker.load(partial, backend="torch")
    np.testing.assert_allclose(  # what is there still loads, and scores as the whole folder does
        Reranker.load(partial, backend="torchscript").score("q", ["p", "a flea"]),
        Reranker.load(exported, backend="torch").score("q", ["p", "a flea"]),
        atol=1e-4,
    )
    (partial / "tokenizer_config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing tokenizer_config\.json"):
        Reranker.load(partial, backend="torchscript")


def test_reranker_is_lazy_in_a_light_package() -> None:
    code = (
        "import sys, distill\n"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules\n"
        "assert distill.Reranker.__name__ == 'Reranker'\n"
        "assert 'torch' not in sys.modules and 'onnxruntime' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[3])


def test_cli_export_rerank_and_eval(student: Path, tmp_path: Path, sample_file: Path, capsys, caplog) -> None:
    """distill export (a run folder holding hf/), saying what it is doing as it goes, then distill rerank with the
    ONNX file, then distill eval."""
    import shutil

    from distill.cli import main
    from distill.eval.trec_runs import read_trec_run

    run = tmp_path / "run"
    shutil.copytree(student, run / "hf")
    validation = ["--validation_input", str(sample_file), "--validation_qrels", str(DL19_QRELS)]  # its card has none
    assert main(["export", "--checkpoint", str(run), "--formats", "onnx", "--parity-queries", "1", *validation]) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "distill.export.exporter"]
    assert [m.split(":")[0] for m in said] == ["ONNX", "quality gate", "parity"], said
    assert said[1] == "quality gate: 36 pairs of 3 queries, on each runtime", said
    assert (run / "export" / "model.onnx").is_file() and not (run / "export" / "model.torchscript.pt").exists()
    out = tmp_path / "reranked.trec"
    args = ["rerank", "--model", str(run / "export"), "--backend", "onnx", "--input", str(sample_file)]
    assert main([*args, "--output", str(out)]) == 0
    reranked = read_trec_run(out)
    assert len(reranked) == 3 and all(len(docs) == 12 for docs in reranked.values())
    spaced = shutil.copytree(run / "export", tmp_path / "my student")  # its name is the run's tag, one TREC field
    assert main([*args[:2], str(spaced), *args[3:], "--output", str(tmp_path / "spaced.trec")]) == 0
    assert read_trec_run(tmp_path / "spaced.trec") == reranked
    assert (tmp_path / "spaced.trec").read_text().split("\n")[0].split()[5] == "my_student-onnx-fp32"
    assert main(["eval", "--qrels", str(DL19_QRELS), "--run", str(out)]) == 0
    assert "nDCG@10" in capsys.readouterr().out
    assert main(["export", "--checkpoint", str(run), "--formats", "onnx,tflite"]) == 2
    assert "--formats: expected list[Literal['onnx', 'torchscript']]" in capsys.readouterr().err


def test_the_last_layer_tail_runs_on_the_first_token(exported: Path, tmp_path: Path) -> None:
    """After the last attention, only [CLS] is computed: the attention output and the residual stream are cut to
    their first token; a graph with no [CLS] read is left alone."""
    import onnx
    from onnx import TensorProto, helper

    from distill.export.cls_tail import run_tail_on_first_token

    graph = onnx.load(str(exported / "model.onnx")).graph
    cuts = [n for n in graph.node if n.op_type == "Gather" and n.output[0].endswith("/first_token")]
    assert len(cuts) == 2 and {n.input[1] for n in cuts} == {"first_token_index"}
    no_read = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
        )
    )
    onnx.save(no_read, str(tmp_path / "plain.onnx"))
    before = (tmp_path / "plain.onnx").read_bytes()
    assert run_tail_on_first_token(tmp_path / "plain.onnx") == 0 and (tmp_path / "plain.onnx").read_bytes() == before


def test_a_bad_static_calibration_fails_the_int8_bound(
    student: Path, parity: ParitySet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Static int8 scales calibrated to ranges 50x too narrow clip the activations of real pairs; the quality gate
    catches it: the export keeps the graph, and its card marks it failed (so ``backend="auto"`` never picks it)."""
    from onnxruntime.quantization.calibrate import MinMaxCalibrater, TensorData, TensorsData

    real = MinMaxCalibrater.compute_data

    def narrowed(self) -> TensorsData:
        ranges = real(self)
        planted = {k: TensorData(lowest=v.lowest / 50, highest=v.highest / 50) for k, v in ranges.data.items()}
        return TensorsData(ranges.calibration_method, planted)

    monkeypatch.setattr(MinMaxCalibrater, "compute_data", narrowed)
    report = export_student(student, tmp_path / "out", formats=("onnx",), int8="static", parity=parity)
    int8 = json.loads((tmp_path / "out" / "card.json").read_text())["quality_gate"]["backends"]["onnx-int8"]
    assert not int8["passed"] and int8["delta"] < -NDCG_BOUND
    assert "onnx-int8" in report.format() and "never chosen by backend='auto'" in report.format()


@pytest.mark.parametrize("method", ["Entropy", "Percentile"])
def test_histogram_calibrations_quantise_on_batches_of_one_shape(exported: Path, tmp_path: Path, method: str) -> None:
    """The histogram calibrations stack every batch's activations, so their batches share one shape (pairs of
    different lengths padded to the longest); the graph they give scores real pairs close to fp32."""
    from distill.export.quantize import Calibration, quantize_int8
    from distill.serving.scorers import OnnxScorer

    folder = tmp_path / "student"
    shutil.copytree(exported, folder)
    calibration = Calibration(per_query=2, method=method, max_batch_tokens=512)
    batches = calibration.batches(folder)
    assert len({b["input_ids"].shape for b in batches}) == 1 and len(batches) > 1
    assert sum(int(b["attention_mask"].sum()) for b in batches) < sum(b["attention_mask"].size for b in batches)
    record = quantize_int8(folder / "model.onnx", folder / "model.int8.onnx", "static", calibration)
    assert record["calibration"]["method"] == method and record["calibration"]["batches"] == len(batches)
    example = batches[0]
    reference, int8 = OnnxScorer(folder / "model.onnx")(example), OnnxScorer(folder / "model.int8.onnx")(example)
    assert not np.array_equal(int8, reference)
    assert np.abs(int8 - reference).max() < 0.1 * np.abs(reference).max() + 0.05


def test_int8_weights_graph_is_checked_and_run_on_openvino(student: Path, parity: ParitySet, tmp_path: Path) -> None:
    """``int8="weights"`` stores every matmul weight as int8 (one scale per output channel) behind a
    DequantizeLinear; the parity check runs it on OpenVINO, which quantises each token's activations at run time."""
    pytest.importorskip("openvino")
    import onnx
    from onnx import numpy_helper

    out = tmp_path / "export"
    report = export_student(student, out, formats=("onnx",), int8="weights", parity=parity)
    int8 = next(p for p in report.parity if p.format == "onnx-int8")
    assert int8.runtime == "openvino" and abs(int8.ndcg10["delta"]) <= NDCG_BOUND
    card = json.loads((out / "card.json").read_text())
    assert card["optimizations"]["onnx-int8"]["mode"] == "weights"
    assert card["optimizations"]["onnx-int8"]["runtime"] == "openvino"
    graph = onnx.load(str(out / "model.int8.onnx")).graph
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    dequantise = [n for n in graph.node if n.op_type == "DequantizeLinear"]
    assert len(dequantise) == 2 * 4  # per layer of the tiny BERT: QKV, attention output, two feed-forward
    for node in dequantise:
        assert weights[node.input[0]].dtype == np.int8 and weights[node.input[1]].ndim == 1
    fp32 = {t.name for t in onnx.load(str(out / "model.onnx")).graph.initializer}
    matmul_weights = {n.input[1] for n in graph.node if n.op_type in ("MatMul", "Attention")}
    assert matmul_weights <= {n.output[0] for n in dequantise} and not matmul_weights & fp32


def test_a_dynamic_int8_graph_is_refused_on_openvino_in_one_line_and_left_out_of_a_default_bench(
    student: Path, parity: ParitySet, tmp_path: Path, capsys
) -> None:
    """``int8="dynamic"`` makes onnxruntime's graph (QAttention), which OpenVINO cannot convert: loading it there is
    one line naming the way out (it was OpenVINO's traceback), and a bench of the default backends skips it."""
    pytest.importorskip("openvino")
    from distill.cli import main

    out = tmp_path / "export"
    export_student(student, out, formats=("onnx",), int8="dynamic", parity=parity)
    with pytest.raises(InputError, match=r"model\.int8\.onnx: an int8 graph of int8_mode dynamic is onnxruntime's"):
        Reranker.load(out, backend="openvino", dtype="int8")
    assert len(Reranker.load(out, backend="onnx", dtype="int8").score("a query", ["a passage"])) == 1
    bench = ["bench", "--student", str(out), "--teacher", "none", "--token-counts", "[]", "--rerank-queries", "1"]
    assert main([*bench, "--repeats", "1", "--quality", "false", "--output", str(tmp_path / "bench")]) == 0
    record = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert record["complete"] and "int8_mode dynamic" in record["skipped"]["openvino-int8"]


def test_int8_weights_needs_openvino(student: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    with pytest.raises(InputError, match=r"'weights' makes a graph for OpenVINO: pip install"):
        export_student(student, tmp_path / "out", formats=("onnx",), int8="weights")
    assert not (tmp_path / "out").exists()


def test_openvino_precision_is_explicit(exported: Path, candidates: tuple[str, list[str]]) -> None:
    """OpenVINO computes in bf16 by default wherever the CPU has it; ``float32`` asks for fp32 (the 1e-4 agreement
    above) and ``bfloat16`` for bf16, which moves the scores a little but keeps the ranking."""
    openvino = pytest.importorskip("openvino")

    query, passages = candidates
    reference = np.asarray(Reranker.load(exported, backend="torch").score(query, passages))
    bf16 = np.asarray(Reranker.load(exported, backend="openvino", dtype="bfloat16").score(query, passages))
    assert np.corrcoef(bf16, reference)[0, 1] > 0.99
    if "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):  # AVX512-BF16 or AMX
        assert np.abs(bf16 - reference).max() > 1e-4
    with pytest.raises(InputError, match="dtype is one of"):
        Reranker.load(exported, backend="onnx", dtype="bfloat16")


def test_openvino_perf_count_times_each_node_and_keeps_the_scores(
    exported: Path, candidates: tuple[str, list[str]]
) -> None:
    """``perf_count`` (the profile of :mod:`benchmarks.onnx_cpu`) keeps OpenVINO's time of each node of the last
    batch and changes no score."""
    openvino = pytest.importorskip("openvino")
    from distill.serving.scorers import OpenVinoScorer

    query, passages = candidates
    plain = Reranker.load(exported, backend="openvino", dtype="float32")
    scorer = OpenVinoScorer(exported / "model.onnx", precision="float32", perf_count=True)
    profiled = Reranker(scorer, plain.tokenizer, plain.max_length, plain.max_batch_tokens)
    np.testing.assert_array_equal(profiled.score(query, passages), plain.score(query, passages))
    executed = [n for n in scorer.request.profiling_info if n.status == openvino.ProfilingInfo.Status.EXECUTED]
    assert {"FullyConnected", "MatMul"} & {n.node_type for n in executed}
    assert sum(n.real_time.total_seconds() for n in executed) > 0


def test_the_parity_options_size_the_default_dl19_pairs_too() -> None:
    """``--parity_queries`` and ``--parity_depth`` were used only with ``--parity_input``: 0 ran on 3 queries."""
    from distill.export.parity_set import dl19_parity_set
    from distill.stages.export import ExportConfig

    pairs = dl19_parity_set(2, 5).pairs
    assert len({p.qid for p in pairs}) == 2 and len(pairs) == 2 * 5 + 1  # and the long pair
    for option in ("parity_queries", "parity_depth"):
        with pytest.raises(InputError, match=f"export: {option} must be positive, got 0"):
            ExportConfig(**{option: 0})
