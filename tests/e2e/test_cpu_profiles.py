"""The decisions that depend on the CPU's class, taken for every class on whatever CPU runs the suite:
``CIS_DISTILL_CPU_PROFILE`` names an AVX2-only, an AVX-512 VNNI/BF16 (Intel and AMD) or an AMX CPU, and the export's
quality gate, its model card, ``backend="auto"`` and the benchmark's peer configuration follow it."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from distill.bench.peers import st_quantization_config
from distill.core.schema import InputError
from distill.export.model_card import render_model_card
from distill.export.quality_gate import NO_BF16, gate_candidates, measure_quality_gate
from distill.serving.auto import choose_backend
from distill.serving.hardware import PROFILE_ENV, PROFILES, CpuFeatures
from tests.distill.export.test_model_card import assert_gate_rows

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
TIERS = {"avx2": "fp32", "avx512-vnni": "vnni", "avx512-vnni-bf16": "vnni_bf16", "amx": "amx"}


@pytest.fixture(params=sorted(PROFILES))
def cpu_profile(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> CpuFeatures:
    """Each CPU class in turn, named by ``CIS_DISTILL_CPU_PROFILE``."""
    monkeypatch.setenv(PROFILE_ENV, request.param)
    return PROFILES[request.param]


def test_the_profile_replaces_this_machines_features(cpu_profile: CpuFeatures) -> None:
    features = CpuFeatures.read()
    assert features == cpu_profile and features.tier == TIERS[features.profile]
    assert features.describe().startswith(f"profile {features.profile}: ")
    assert CpuFeatures.read("/proc/cpuinfo").profile == ""  # a file named: that file, whatever the profile


def test_without_a_profile_the_features_are_this_machines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    assert CpuFeatures.read().profile == "" and CpuFeatures.read() == CpuFeatures.read("/proc/cpuinfo")
    monkeypatch.setenv(PROFILE_ENV, "avx1024")
    with pytest.raises(InputError, match=rf"^{PROFILE_ENV}='avx1024' names no CPU profile: use one of avx2, "):
        CpuFeatures.read()


def test_a_bad_profile_is_one_line_from_the_cli(
    exported: Path, sample_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from distill.cli import main

    monkeypatch.setenv(PROFILE_ENV, "avx1024")
    out = tmp_path / "out.trec"
    assert main(["rerank", "--model", str(exported), "--input", str(sample_file), "--output", str(out)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "names no CPU profile" in err[0] and not out.exists()


@pytest.mark.skipif(not HAS_OPENVINO, reason="OpenVINO is an optional extra")
def test_the_gate_checks_bf16_only_where_the_cpu_has_it(exported: Path, cpu_profile: CpuFeatures) -> None:
    reasons = gate_candidates(exported, "onnxruntime")
    assert reasons["openvino-bf16"] == (None if "avx512_bf16" in cpu_profile.flags else NO_BF16)
    assert all(reason is None for name, reason in reasons.items() if name != "openvino-bf16")


@pytest.fixture(scope="module")
def gates(exported: Path, parity) -> dict[str, dict]:
    """The export's quality gate as each CPU class measures it (``card.json``'s ``quality_gate``)."""
    measured = {}
    with pytest.MonkeyPatch.context() as patch:
        for name in PROFILES:
            patch.setenv(PROFILE_ENV, name)
            measured[name] = measure_quality_gate(exported, parity).to_dict()
    return measured


def test_the_card_shows_what_each_cpu_class_checked(exported: Path, gates: dict[str, dict]) -> None:
    """An AVX2 CPU records bf16 as not checked, and the card says so in its row instead of figures."""
    card = json.loads((exported / "card.json").read_text())
    for name, gate in gates.items():
        rendered = render_model_card({**card, "quality_gate": gate}, "path/to/student", "apache-2.0")
        assert_gate_rows(rendered, gate)
        if HAS_OPENVINO:
            bf16 = gate["backends"]["openvino-bf16"]
            assert ("not_checked" in bf16) == ("avx512_bf16" not in PROFILES[name].flags), name
            assert ("| openvino-bf16 | - | - | - | - | not checked: " in rendered) == ("not_checked" in bf16)


def gated_export(exported: Path, tmp_path: Path, gate: dict) -> Path:
    folder = tmp_path / "export"
    shutil.copytree(exported, folder)
    card = json.loads((folder / "card.json").read_text())
    (folder / "card.json").write_text(json.dumps({**card, "quality_gate": gate}))
    return folder


def test_auto_chooses_from_the_gate_each_cpu_class_measured(
    exported: Path, gates: dict[str, dict], tmp_path: Path, cpu_profile: CpuFeatures
) -> None:
    """The export measured on a machine of the class it is served on: auto takes that class's first preference
    whose file is in the folder and whose gate record passed (fp32 needs none)."""
    folder = gated_export(exported, tmp_path, gates[cpu_profile.profile])
    backends = gates[cpu_profile.profile]["backends"]
    choice = choose_backend(folder, "cpu")
    assert choice.reason.startswith(f"{cpu_profile.tier} CPU (profile {cpu_profile.profile}: ")
    assert backends["onnx-int8"]["passed"]  # static int8 of the tiny student is within the gate on every class
    bf16 = HAS_OPENVINO and backends["openvino-bf16"]["passed"]
    expected = {  # the int8 graph is onnxruntime's (static), so openvino-int8 has no file
        "amx": "openvino-bf16" if bf16 else "onnx-int8",
        "vnni_bf16": "openvino-bf16" if bf16 else "onnx-int8",
        "vnni": "onnx-int8",
        "fp32": "openvino-fp32" if HAS_OPENVINO else "onnx-fp32",
    }[cpu_profile.tier]
    assert choice.backend == expected


def test_an_avx2_gate_served_on_a_bf16_cpu_passes_bf16_over(
    exported: Path, gates: dict[str, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export made on an AVX2 machine and served on an AMX one: bf16 was not checked, so auto passes it over
    and says why."""
    pytest.importorskip("openvino")
    folder = gated_export(exported, tmp_path, gates["avx2"])
    monkeypatch.setenv(PROFILE_ENV, "amx")
    choice = choose_backend(folder, "cpu")
    assert choice.backend != "openvino-bf16"
    assert f"openvino-bf16: not checked by the quality gate ({NO_BF16})" in choice.reason


def test_the_peers_int8_configuration_follows_the_cpu_class(cpu_profile: CpuFeatures) -> None:
    expected = {"fp32": "avx2", "vnni": "avx512_vnni", "vnni_bf16": "avx512_vnni", "amx": "avx512_vnni"}
    assert st_quantization_config(CpuFeatures.read(), "x86_64") == expected[cpu_profile.tier]
