"""``python -m benchmarks.onnx_cpu`` on the tiny student: every graph variant built, then timed at the defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import onnx_cpu


@pytest.mark.slow
def test_every_graph_is_built_and_each_variant_timed(student: Path, tmp_path: Path) -> None:
    out, graphs = tmp_path / "onnx-cpu.json", tmp_path / "graphs"
    argv = ["--student", str(student), "--threads", "1", "--queries", "1", "--repeats", "1", "--stages", "[variants]"]
    argv += ["--quality", "false", "--matmul_size", "64", "--graphs", str(graphs), "--out", str(out)]
    assert onnx_cpu.main(argv) == 0
    result = json.loads(out.read_text())
    built = json.loads((graphs / "graphs.json").read_text())
    assert all((graphs / file).is_file() for file in built.values())
    assert {"fp32-dynamo", "fp32-fused-tail", "int8-dynamic", "int8-static", "int8-weights"} <= set(built)
    rows = {row["graph"]: row for row in result["variants"]}
    assert set(rows) == set(built) - {*onnx_cpu.OPENVINO_ONLY, "fp32-fused-no-attention"}  # the defaults' variants
    assert all(0 < row["p50_s"] <= row["p95_s"] and len(row["seconds"]) == 1 for row in rows.values())
    assert "Attention" in rows["fp32-fused-tail"]["ops"] and "Attention" not in rows["fp32-dynamo"]["ops"]
    assert "DynamicQuantizeLinear" in rows["int8-dynamic"]["ops"] and "QuantizeLinear" in rows["int8-static"]["ops"]
    assert result["workload"]["candidates"] == [100] and result["matmul_fp32_flops_per_s"] > 0
    assert result["build_s"] > 0 and "sessions" not in result  # only the stages asked for


def test_an_unknown_stage_is_one_line_before_any_work(capsys) -> None:
    assert onnx_cpu.main(["--student", "x", "--stages", "[variants,warp]"]) == 2
    assert "--stages: unknown stage(s) ['warp']" in capsys.readouterr().err
