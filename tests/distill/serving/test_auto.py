"""backend="auto": the CPU's features, the choice of backend from them, the folder, the runtimes and the export's
quality gate; and the one-line errors for an unreadable exported graph."""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from distill.core.schema import InputError, MissingFileError
from distill.serving.auto import PREFERENCES, choose_backend, quality_gate
from distill.serving.backends import NAMED_BACKENDS, backend_name
from distill.serving.hardware import CpuFeatures
from distill.serving.reranker import Reranker
from tests.conftest import DL19

# The flags lines of three real CPUs (abridged to the flags that matter and a few others)
SAPPHIRE_RAPIDS = "fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8 avx_vnni"
ICE_LAKE = "fpu sse2 avx2 avx512f avx512_vnni avx512_bf16"
ZEN2 = "fpu sse2 avx2 fma sha_ni"
ZEN4 = "fpu sse2 avx2 avx512f avx512_vnni avx512_bf16"
ALL_RUNTIMES = ("torch", "onnxruntime", "openvino")
HAS_OPENVINO = importlib.util.find_spec("openvino") is not None


def cpuinfo(flags: str, vendor: str = "GenuineIntel") -> str:
    """A two-processor /proc/cpuinfo with these flags."""
    block = "processor\t: {n}\nvendor_id\t: {vendor}\nmodel name\t: Some CPU\nflags\t\t: {flags}\n\n"
    return block.format(n=0, flags=flags, vendor=vendor) + block.format(n=1, flags=flags, vendor=vendor)


def folder_with(tmp_path: Path, files: tuple[str, ...], gate: dict | None = None) -> Path:
    """A student folder holding empty ``files``, with ``gate`` as its card's quality gate."""
    folder = tmp_path / "student"
    folder.mkdir(parents=True)
    for name in ("config.json", *files):
        (folder / name).write_text("{}")
    if gate is not None:
        card = {"student": None, "quality_gate": {"bound": 0.5, "backends": gate}}
        (folder / "card.json").write_text(json.dumps(card))
    return folder


EXPORT = ("model.safetensors", "model.onnx", "model.int8.onnx")
PASSED = {"passed": True, "delta": -0.2, "spearman": 0.998}
FAILED = {"passed": False, "delta": -0.9, "spearman": 0.97}


def test_cpu_features_from_cpuinfo(tmp_path: Path) -> None:
    amx = CpuFeatures.parse(cpuinfo(SAPPHIRE_RAPIDS))
    assert amx.tier == "amx" and amx.vnni and "sse2" not in amx.flags
    assert CpuFeatures.parse(cpuinfo(ICE_LAKE)).tier == "vnni"  # Intel's AVX-512 BF16 without AMX: bf16 is slower
    zen4 = CpuFeatures.parse(cpuinfo(ZEN4, "AuthenticAMD"))
    assert zen4.tier == "vnni_bf16" and zen4.vendor == "AuthenticAMD" and zen4.describe().startswith("AuthenticAMD ")
    assert CpuFeatures.parse(cpuinfo(ZEN4.replace(" avx512_bf16", ""), "AuthenticAMD")).tier == "vnni"
    assert CpuFeatures.parse("avx2 avx_vnni").tier == "vnni"  # AVX-VNNI without AVX-512 (a bare flag list)
    assert CpuFeatures.parse(cpuinfo(ZEN2)).tier == "fp32"
    assert CpuFeatures.parse("avx2 amx_tile").tier == "fp32"  # tiles without the bf16/int8 matmuls: not AMX
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes asimddp\n"
    assert CpuFeatures.parse(arm).flags == frozenset() and CpuFeatures.parse(arm).tier == "fp32"
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo(ICE_LAKE))
    assert CpuFeatures.read(path).flags == {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}
    assert CpuFeatures.read(tmp_path / "absent").tier == "fp32"


@pytest.mark.parametrize(
    ("flags", "gate", "expected"),
    [
        (SAPPHIRE_RAPIDS, {"openvino-bf16": PASSED, "openvino-int8": PASSED}, "openvino-bf16"),
        (SAPPHIRE_RAPIDS, {"openvino-bf16": FAILED, "openvino-int8": PASSED}, "openvino-int8"),
        (ICE_LAKE, {"openvino-bf16": PASSED, "openvino-int8": PASSED}, "openvino-int8"),
        (ICE_LAKE, {"openvino-int8": FAILED, "onnx-int8": PASSED}, "onnx-int8"),
        (ICE_LAKE, {"openvino-int8": FAILED, "openvino-bf16": PASSED}, "openvino-fp32"),
        (cpuinfo(ZEN4, "AuthenticAMD"), {"openvino-int8": PASSED, "openvino-bf16": PASSED}, "openvino-int8"),
        (cpuinfo(ZEN4, "AuthenticAMD"), {"openvino-int8": FAILED, "openvino-bf16": PASSED}, "openvino-bf16"),
        (cpuinfo(ZEN4, "AuthenticAMD"), {"openvino-int8": FAILED, "openvino-bf16": FAILED}, "onnx-fp32"),
        (ZEN2, {"openvino-int8": PASSED, "onnx-int8": PASSED}, "openvino-fp32"),
    ],
)
def test_the_fastest_backend_the_gate_passed(tmp_path: Path, flags: str, gate: dict, expected: str) -> None:
    folder = folder_with(tmp_path, EXPORT, gate)
    choice = choose_backend(folder, "cpu", CpuFeatures.parse(flags), ALL_RUNTIMES)
    assert choice.backend == expected
    assert choice.load_args == NAMED_BACKENDS[expected]
    # every faster backend of the list is named in the reason, with why it was passed over
    tier = CpuFeatures.parse(flags).tier
    faster = PREFERENCES[tier][: PREFERENCES[tier].index(expected)]
    assert all(f"{name}: " in choice.reason for name in faster)
    assert choice.reason.startswith(f"{tier} CPU")


def test_the_gate_refuses_a_failed_or_unchecked_precision(tmp_path: Path) -> None:
    amx = CpuFeatures.parse(SAPPHIRE_RAPIDS)
    unchecked = {"passed": False, "not_checked": "this CPU has no bf16"}
    folder = folder_with(tmp_path, EXPORT, {"openvino-bf16": unchecked, "openvino-int8": FAILED})
    choice = choose_backend(folder, "cpu", amx, ALL_RUNTIMES)
    assert choice.backend == "openvino-fp32"
    assert "openvino-bf16: not checked by the quality gate (this CPU has no bf16)" in choice.reason
    assert "openvino-int8: failed the quality gate (delta -0.90, spearman 0.97)" in choice.reason
    assert "onnx-int8: not in the quality gate" in choice.reason
    # fp32 is held to PyTorch's scores by the parity check: only a measured failure refuses it
    no_openvino_at_export = {"passed": False, "not_checked": "OpenVINO is not installed"}
    folder = folder_with(tmp_path / "fp32", EXPORT, {"openvino-fp32": no_openvino_at_export})
    assert choose_backend(folder, "cpu", amx, ALL_RUNTIMES).backend == "openvino-fp32"
    folder = folder_with(tmp_path / "fp32-failed", EXPORT, {"openvino-fp32": FAILED})
    choice = choose_backend(folder, "cpu", CpuFeatures.parse(ZEN2), ALL_RUNTIMES)
    assert choice.backend == "onnx-fp32" and "openvino-fp32: failed the quality gate" in choice.reason


def test_without_a_gate_only_fp32_is_chosen(tmp_path: Path) -> None:
    folder = folder_with(tmp_path, EXPORT)  # an older export: no quality_gate in its card, or no card
    choice = choose_backend(folder, "cpu", CpuFeatures.parse(SAPPHIRE_RAPIDS), ALL_RUNTIMES)
    assert choice.backend == "openvino-fp32" and "openvino-int8: no quality gate in card.json" in choice.reason
    (folder / "card.json").write_text(json.dumps({"student": None}))
    assert quality_gate(folder) is None
    assert choose_backend(folder, "cpu", CpuFeatures.parse(ICE_LAKE), ALL_RUNTIMES).backend == "openvino-fp32"


def test_a_missing_file_or_runtime_falls_through(tmp_path: Path) -> None:
    gate = {"openvino-int8": PASSED, "onnx-int8": PASSED}
    vnni, avx2 = CpuFeatures.parse(ICE_LAKE), CpuFeatures.parse(ZEN2)
    folder = folder_with(tmp_path, EXPORT, gate)
    no_openvino = choose_backend(folder, "cpu", vnni, ("torch", "onnxruntime"))
    assert no_openvino.backend == "onnx-int8" and "openvino-int8: openvino is not installed" in no_openvino.reason
    assert choose_backend(folder, "cpu", avx2, ("torch", "onnxruntime")).backend == "onnx-fp32"
    (folder / "model.int8.onnx").unlink()
    choice = choose_backend(folder, "cpu", vnni, ALL_RUNTIMES)
    assert choice.backend == "openvino-fp32" and "openvino-int8: no model.int8.onnx" in choice.reason
    (folder / "model.onnx").unlink()  # a plain Hugging Face folder
    assert choose_backend(folder, "cpu", vnni, ALL_RUNTIMES).backend == "torch-fp32"
    assert choose_backend(folder, "cpu", avx2, ALL_RUNTIMES).backend == "torch-fp32"
    with pytest.raises(MissingFileError, match=r"no backend can serve .*torch-fp32: torch is not installed"):
        choose_backend(folder, "cpu", avx2, ("onnxruntime",))


def test_a_gpu_gets_fp16_unless_the_gate_failed_it(tmp_path: Path) -> None:
    plain = folder_with(tmp_path, ("model.safetensors",))
    assert choose_backend(plain, "cuda", CpuFeatures.parse(ZEN2), ALL_RUNTIMES).backend == "torch-fp16"
    assert choose_backend(plain, "cuda:1", runtimes=ALL_RUNTIMES).load_args == ("torch", "float16")
    (plain / "card.json").write_text(json.dumps({"quality_gate": {"backends": {"torch-fp16": FAILED}}}))
    assert choose_backend(plain, "cuda", runtimes=ALL_RUNTIMES).backend == "torch-fp32"


def test_a_bad_card_is_named(tmp_path: Path) -> None:
    folder = folder_with(tmp_path, EXPORT)
    (folder / "card.json").write_text("{not json")
    with pytest.raises(InputError, match=rf"{folder / 'card.json'}:1:2: malformed JSON"):
        choose_backend(folder, "cpu", CpuFeatures.parse(ICE_LAKE), ALL_RUNTIMES)
    (folder / "card.json").write_text(json.dumps({"quality_gate": {"backends": ["openvino-int8"]}}))
    with pytest.raises(InputError, match=r"card\.json: quality_gate\.backends must map backend names"):
        choose_backend(folder, "cpu", CpuFeatures.parse(ICE_LAKE), ALL_RUNTIMES)


def test_backend_names() -> None:
    assert backend_name("torch", None) == "torch-fp32" and backend_name("torch", "float16") == "torch-fp16"
    assert backend_name("onnx", "float32") == backend_name("onnx", None) == "onnx-fp32"
    assert backend_name("openvino", "int8") == "openvino-int8" and backend_name("torchscript", None) == "torchscript"
    assert all(backend_name(*pair) == name for name, pair in NAMED_BACKENDS.items())
    assert backend_name("openvino", "float16") == "openvino-fp16"  # no named backend: spelt as the named ones


@pytest.fixture(scope="module")
def candidates() -> tuple[str, list[str]]:
    from distill.data.loaders import load_candidates

    first = load_candidates(DL19).candidates[0]
    return first.query.text, [p.text for p in first.passages[:12]]


def gated_copy(exported: Path, tmp_path: Path, gate: dict) -> Path:
    """A copy of the export folder whose card records ``gate`` as its quality gate."""
    folder = tmp_path / "export"
    shutil.copytree(exported, folder)
    card = json.loads((folder / "card.json").read_text())
    card["quality_gate"] = {"bound": 0.5, "backends": gate}
    (folder / "card.json").write_text(json.dumps(card))
    return folder


@pytest.mark.skipif(not HAS_OPENVINO, reason="OpenVINO is an optional extra")
def test_reranker_auto_loads_the_choice_and_says_so(
    exported: Path, tmp_path: Path, candidates, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    query, passages = candidates
    folder = gated_copy(exported, tmp_path, {"openvino-int8": PASSED, "openvino-bf16": FAILED})
    monkeypatch.setattr(CpuFeatures, "read", classmethod(lambda cls, path=None: cls.parse(ICE_LAKE)))
    with caplog.at_level(logging.INFO):
        reranker = Reranker.load(folder, threads=1)
    assert reranker.backend == "openvino-int8" and reranker.backend_reason.startswith("vnni CPU")
    lines = [r.getMessage() for r in caplog.records if "backend auto" in r.getMessage()]
    assert len(lines) == 1 and "chose openvino-int8" in lines[0]
    named = Reranker.load(folder, backend="openvino", dtype="int8", threads=1)
    assert named.backend == "openvino-int8" and named.backend_reason == ""
    np.testing.assert_allclose(reranker.score(query, passages), named.score(query, passages), atol=1e-6, rtol=0)

    monkeypatch.setattr(CpuFeatures, "read", classmethod(lambda cls, path=None: cls.parse(SAPPHIRE_RAPIDS)))
    assert Reranker.load(folder).backend == "openvino-int8"  # bf16 failed the gate
    monkeypatch.setattr(CpuFeatures, "read", classmethod(lambda cls, path=None: cls.parse(ZEN2)))
    assert Reranker.load(folder).backend == "openvino-fp32"


def test_reranker_auto_on_a_plain_folder_is_pytorch(student: Path, candidates) -> None:
    query, passages = candidates
    reranker = Reranker.load(student)
    assert reranker.backend == "torch-fp32"
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(student).eval()
    tokenizer = AutoTokenizer.from_pretrained(student)
    tokens = tokenizer([query] * len(passages), passages, padding=True, return_tensors="pt")
    with torch.no_grad():
        reference = model(**tokens).logits[:, 0].numpy()
    np.testing.assert_allclose(reranker.score(query, passages), reference, atol=1e-5, rtol=0)
    with pytest.raises(InputError, match="chooses the dtype itself"):
        Reranker.load(student, dtype="int8")


def test_cli_rerank_defaults_to_auto_and_names_the_backend(
    exported: Path, tmp_path: Path, sample_file: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from distill.cli import main
    from distill.eval.trec_runs import read_trec_run

    monkeypatch.setattr(CpuFeatures, "read", classmethod(lambda cls, path=None: cls.parse(ZEN2)))
    out = tmp_path / "reranked.trec"
    assert main(["rerank", "--model", str(exported), "--input", str(sample_file), "--output", str(out)]) == 0
    expected = "openvino-fp32" if HAS_OPENVINO else "onnx-fp32"
    assert f"backend {expected} (auto: fp32 CPU (avx2)" in capsys.readouterr().out
    assert len(read_trec_run(out)) == 3 and f"-{expected}" in out.read_text().split()[-1]


def test_auto_with_a_torch_lever_chooses_torch_on_a_cpu(
    exported: Path, tmp_path: Path, sample_file: Path, candidates, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """``--unpad`` (or any torch lever) with the default backend: auto passes over the backends that cannot run it,
    where it used to pick ONNX and then refuse the lever."""
    from distill.cli import main

    monkeypatch.setattr(CpuFeatures, "read", classmethod(lambda cls, path=None: cls.parse(ZEN2)))
    choice = choose_backend(exported, torch_levers=["unpad"])
    assert choice.backend == "torch-fp32" and "onnx-fp32: unpad run(s) on torch only" in choice.reason
    query, passages = candidates
    unpadded = Reranker.load(exported, unpad=True)
    assert unpadded.backend == "torch-fp32"
    reference = Reranker.load(exported, backend="torch").score(query, passages)
    np.testing.assert_allclose(unpadded.score(query, passages), reference, atol=1e-5, rtol=0)
    out = tmp_path / "unpadded.trec"
    args = ["rerank", "--model", str(exported), "--input", str(sample_file), "--output", str(out), "--unpad", "true"]
    assert main(args) == 0
    assert "backend torch-fp32 (auto: fp32 CPU (avx2); passed over: " in capsys.readouterr().out


def truncated_copy(exported: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "truncated"
    shutil.copytree(exported, folder)
    graph = folder / "model.onnx"
    graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 2])
    return folder


def test_a_truncated_graph_is_one_line_naming_the_file(
    exported: Path, tmp_path: Path, sample_file: Path, capsys
) -> None:
    from distill.cli import main

    folder = truncated_copy(exported, tmp_path)
    graph = folder / "model.onnx"
    with pytest.raises(InputError, match=rf"{graph}: not a valid ONNX model \(Protobuf parsing failed\.\)"):
        Reranker.load(folder, backend="onnx")
    if HAS_OPENVINO:
        with pytest.raises(InputError, match=rf"{graph}: not a valid ONNX model \(OpenVINO's ONNX reader"):
            Reranker.load(folder, backend="openvino", dtype="bfloat16")
    for broken in (b"", b"not an onnx model"):  # an empty file; one that no frontend of OpenVINO takes
        graph.write_bytes(broken)
        with pytest.raises(InputError, match=rf"{graph}: not a valid ONNX model"):
            Reranker.load(folder, backend="onnx")
        if HAS_OPENVINO:
            with pytest.raises(InputError, match=rf"{graph}: not a valid ONNX model"):
                Reranker.load(folder, backend="openvino")
    args = ["rerank", "--model", str(folder), "--backend", "onnx", "--input", str(sample_file)]
    assert main([*args, "--output", str(tmp_path / "out.trec")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"distill rerank: error: {graph}: not a valid ONNX model")
    assert "Traceback" not in err
