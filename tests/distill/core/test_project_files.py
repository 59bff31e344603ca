"""Without the checkout's data/ (an installed wheel), a default that points into it is one line naming the option that
replaces it; nothing is written beside the installed package. ``make wheel-check`` runs the wheel itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from distill.core.project_files import shipped
from distill.core.schema import MissingFileError


def test_shipped_names_the_option_and_the_variable(tmp_path: Path) -> None:
    there = tmp_path / "there.json"
    there.write_text("[]")
    assert shipped(there, "input") == str(there)
    with pytest.raises(MissingFileError) as e:
        shipped(tmp_path / "data" / "bm25_top100.json", "parity_input")
    message = str(e.value)
    assert message.startswith("parity_input: the default ") and "give parity_input" in message
    assert "CIS_DISTILL_DATA" in message and "\n" not in message


def test_export_defaults_without_data_name_their_options(
    tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distill.export import parity_set, quality_gate, quantize
    from distill.stages.export import ExportConfig, export

    monkeypatch.setattr(parity_set, "DL19", tmp_path / "trec-dl19")
    with pytest.raises(MissingFileError, match=r"^parity_input: the default .*trec-dl19"):
        export(ExportConfig(checkpoint=str(tiny_bert), output=str(tmp_path / "export")))
    assert not (tmp_path / "export").exists()
    monkeypatch.setattr(quality_gate, "DL21", tmp_path / "trec-dl21")
    with pytest.raises(MissingFileError, match=r"^validation_input: the default .*trec-dl21"):
        quality_gate.validation_set(tiny_bert)  # a student without a card: the DL21 fallback
    missing = str(tmp_path / "trec-dl22" / "bm25_top100.json")
    monkeypatch.setattr(quantize, "CALIBRATION_INPUTS", (missing,))
    with pytest.raises(MissingFileError, match=r"^calibration.inputs: the default .*trec-dl22"):
        quantize.Calibration(inputs=(missing,)).pairs()


def test_bench_defaults_without_data(tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from distill.bench import latency as run

    config = run.BenchConfig(random_weights=True, teacher="none")
    assert run.default_output(config, None, torch.device("cpu")) == Path("checkpoints/bench-random-cpu")
    missing = str(tmp_path / "trec-dl19" / "bm25_top100.json")
    monkeypatch.setattr(run, "DEFAULT_INPUT", missing)
    with pytest.raises(MissingFileError, match=r"^input: the default .*trec-dl19"):
        config = run.BenchConfig(student=str(tiny_bert), teacher="none", input=missing, output=str(tmp_path / "bench"))
        run.run_bench(config)
