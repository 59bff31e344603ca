"""``benchmarks.heap_scan`` in its own process (it freezes that process's heap): the objects a loaded model leaves
are counted, and after the freeze a full collection no longer tracks them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_heap_scan_reports_the_loaded_heap_and_what_the_freeze_leaves(tiny_bert: Path, tmp_path: Path) -> None:
    out = tmp_path / "scan.json"
    command = [sys.executable, "-m", "benchmarks.heap_scan", "--model", str(tiny_bert), "--backend", "torch"]
    run = subprocess.run([*command, "--repeats", "2", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result == json.loads(run.stdout)
    assert result["backend"] == "torch-fp32"
    assert result["tracked_objects"] > 10_000
    assert result["frozen_objects"] >= 0.9 * result["tracked_objects"]
    assert result["tracked_objects_after_freeze"] < 0.01 * result["tracked_objects"]
    assert len(result["full_collection_ms"]) == len(result["full_collection_ms_after_freeze"]) == 2
