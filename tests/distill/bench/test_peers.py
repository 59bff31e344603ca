"""sentence-transformers' optimised CrossEncoder backends as peers in distill bench: which student they run on, the
int8 configuration of the CPU, the one-line refusal without optimum, the exports (run where optimum imports), and
the bench's peer rows and their nDCG@10 reference."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from distill.bench import peers, report
from distill.bench.latency import PEER_REFERENCE, BenchConfig, run_bench
from distill.bench.methods import PEERS, baseline_method
from distill.bench.peers import ST_BACKENDS, peer_folder, st_peer_method, st_quantization_config
from distill.cli import main
from distill.core.schema import InputError
from distill.serving.hardware import CpuFeatures
from tests.conftest import DL19, DL19_QRELS


def importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


HAS_ST_OPENVINO = importable("optimum.intel.openvino")
HAS_ST_ONNX = importable("optimum.onnxruntime")
QUERY = "how long is the life cycle of a flea"
PASSAGES = [
    "The life cycle of a flea can last anywhere from 20 days to an entire year.",
    "Fleas are wingless insects that feed on the blood of mammals and birds.",
    "The stock market closed higher on Friday after a week of losses.",
    "A flea egg hatches into a larva within two days to two weeks.",
]


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_peers_run_on_a_cls_head_student(tiny_bert: Path, tmp_path: Path) -> None:
    assert set(ST_BACKENDS) == set(PEERS)
    assert peer_folder(tiny_bert, None) == tiny_bert
    segment = tmp_path / "segment-cosine"
    segment.mkdir()
    (segment / "config.json").write_text(json.dumps({"model_type": "bert-segment-cosine"}))
    with pytest.raises(InputError, match=rf"{segment}: the bert-segment-cosine head .* give --peer_student"):
        peer_folder(segment, None)
    assert peer_folder(segment, tiny_bert) == tiny_bert
    with pytest.raises(InputError, match=rf"--peer_student {tmp_path / 'none'}: no config\.json"):
        peer_folder(segment, tmp_path / "none")


def test_the_int8_configuration_of_the_cpu() -> None:
    assert st_quantization_config(CpuFeatures.parse("avx2 avx512f avx512_vnni"), "x86_64") == "avx512_vnni"
    assert st_quantization_config(CpuFeatures.parse("avx2 avx512f"), "x86_64") == "avx512"
    assert st_quantization_config(CpuFeatures.parse("avx2"), "x86_64") == "avx2"
    assert st_quantization_config(CpuFeatures.parse(""), "aarch64") == "arm64"


def test_a_peer_without_optimum_is_skipped_or_refused_in_one_line(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setitem(peers.OPTIMUM, "onnx", ("no_such_optimum_module", "pip install 'sentence-transformers[onnx]'"))
    with pytest.raises(ImportError, match=r"^st-onnx needs no_such_optimum_module \(pip install .*\): No module"):
        peers.require_optimum("st-onnx")
    argv = ["bench", "--student", str(tiny_bert), "--teacher", "none", "--token-counts", "50", "--repeats", "1"]
    argv += ["--rerank-queries", "0", "--quality", "false", "--matmul-size", "64", "--device", "cpu"]
    assert main([*argv, "--backends", "st-onnx", "--output", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--backends st-onnx: st-onnx needs no_such_optimum_module" in err
    result = run_bench(BenchConfig(**_config(tiny_bert, tmp_path / "default")))
    assert result["skipped"]["st-onnx"].startswith("st-onnx needs no_such_optimum_module")
    assert "st-onnx" not in report.methods(result) and "student auto (torch-fp32)" in report.methods(result)


def _config(student: Path, out: Path, **extra) -> dict:
    return dict(
        student=str(student), teacher="none", token_counts=[100], rerank_queries=0, repeats=1, max_seconds=5,
        quality=False, matmul_size=64, device="cpu", output=str(out), **extra,
    )  # fmt: skip


def test_the_bench_times_peers_on_another_student_against_its_own_pytorch(
    exported: Path, tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wiring, with a stand-in for the optimum export (sentence-transformers' PyTorch predict): the peers run on
    --peer_student, its PyTorch CrossEncoder is timed beside them, and their nDCG@10 change is taken against it."""
    monkeypatch.setattr(peers, "require_optimum", lambda name: None)
    scratches = []

    def stand_in(name, folder, device, max_length, threads, scratch):
        scratches.append(scratch)
        return baseline_method(folder, device, max_length, name)

    monkeypatch.setattr(peers, "st_peer_method", stand_in)
    queries = json.loads(DL19.read_text())[:2]
    (tmp_path / "dl19-2.json").write_text(json.dumps(queries))
    other = tmp_path / "peer"
    shutil.copytree(tiny_bert, other)
    config = _config(exported, tmp_path / "bench", backends=["torch-fp32", "st-openvino", "st-onnx"])
    config.update(input=str(tmp_path / "dl19-2.json"), qrels=str(DL19_QRELS), quality=True, peer_student=str(other))
    result = run_bench(BenchConfig(**config))
    assert report.methods(result) == ["student torch-fp32", PEER_REFERENCE, "st-openvino", "st-onnx"]
    quality = result["quality"]
    assert quality["references"] == {"st-openvino": PEER_REFERENCE, "st-onnx": PEER_REFERENCE}
    rows = {line.split()[0]: line for line in report.summary_table(result).splitlines()[2:]}
    assert rows["st-onnx"].split()[-1] == "+0.00"  # against the peer's own PyTorch, not the student's
    assert all(s.parent.name.startswith("cis-distill-bench-") for s in scratches)  # the run's temporary folder
    assert not any(s.exists() for s in scratches)


@pytest.mark.skipif(not HAS_ST_OPENVINO, reason="sentence-transformers[openvino] (optimum-intel) is not installed")
def test_st_openvino_exports_to_scratch_and_scores_as_pytorch(tiny_bert: Path, tmp_path: Path) -> None:
    before = snapshot(tiny_bert)
    method = st_peer_method("st-openvino", tiny_bert, "cpu", None, 1, tmp_path / "scratch")
    reference = baseline_method(tiny_bert, "cpu", None).score(QUERY, PASSAGES)  # ST's PyTorch predict
    scores = method.score(QUERY, PASSAGES)
    tolerance = 2e-2 if method.dtype == "bfloat16" else 1e-4  # OpenVINO's default precision: bf16 where the CPU has it
    np.testing.assert_allclose(scores, reference, atol=tolerance, rtol=0)
    assert method.dtype in ("float32", "bfloat16", "float16")  # what OpenVINO compiled it in
    assert snapshot(tiny_bert) == before  # the student's folder is untouched
    assert (tmp_path / "scratch" / "st-openvino" / "config.json").is_file()


@pytest.mark.skipif(not HAS_ST_ONNX, reason="sentence-transformers[onnx] (optimum-onnx) is not installed")
def test_st_onnx_and_its_int8_export(tiny_bert: Path, tmp_path: Path) -> None:
    before = snapshot(tiny_bert)
    reference = baseline_method(tiny_bert, "cpu", None).score(QUERY, PASSAGES)  # ST's PyTorch predict
    fp32 = st_peer_method("st-onnx", tiny_bert, "cpu", None, 1, tmp_path / "scratch")
    np.testing.assert_allclose(fp32.score(QUERY, PASSAGES), reference, atol=1e-4, rtol=0)
    int8 = st_peer_method("st-onnx-int8", tiny_bert, "cpu", None, 1, tmp_path / "scratch")
    assert int8.dtype == "int8" and np.corrcoef(int8.score(QUERY, PASSAGES), reference)[0, 1] > 0.9
    assert list((tmp_path / "scratch" / "st-onnx-int8" / "onnx").glob("model_int8_*.onnx"))
    assert snapshot(tiny_bert) == before
