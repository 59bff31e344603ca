"""The export stage: a student to ONNX and TorchScript files, each checked for parity with PyTorch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from distill.backend.export import ExportReport
from distill.backend.quantize import Calibration, Int8Mode


@dataclass
class ExportConfig:
    """Options of ``distill export``: ONNX (fp32, fp16, int8) and TorchScript files, checked for parity."""

    checkpoint: str | None = None
    """The student (required): a training run (its ``hf/`` is exported) or an HF folder."""
    output: str | None = None
    """The export folder (default: the run's ``export/``); a previous export there is replaced."""
    formats: list[Literal["onnx", "torchscript"]] = field(default_factory=lambda: ["onnx", "torchscript"])
    fp16: bool = False
    """Also ``model.fp16.onnx`` (fp16 weights, for GPUs)."""
    int8: bool = False
    """Also ``model.int8.onnx`` (int8, for CPUs), checked against the nDCG@10 bound."""
    int8_mode: Int8Mode = "static"
    """``static`` (activation scales calibrated on ``calibration``), ``dynamic`` (one scale per tensor computed at
    run time; both for onnxruntime) or ``weights`` (int8 weights only; OpenVINO quantises each token's activations
    at run time, far more finely; needs ``cis-distill[openvino]``). See :mod:`distill.backend.quantize`."""
    calibration: Calibration = field(default_factory=Calibration)
    """The pairs static int8 is calibrated on (default: DL21 and DL22 BM25 candidates, 4 per query)."""
    parity_input: str | None = None
    """Candidates to check on (default: the shipped DL19 BM25 top-100)."""
    qrels: str | None = None
    """Qrels of ``parity_input``, for the int8 nDCG@10 bound."""
    parity_queries: int = 3
    """Queries of the parity input for the score bounds (int8 is checked on all judged ones)."""
    parity_depth: int = 32
    """Candidates per query for the score bounds."""
    ranking_queries: int | None = None
    """Judged queries of the int8 nDCG@10 bound (default: all of the parity input's)."""


def export(cfg: ExportConfig) -> ExportReport:
    """Export the student of ``cfg.checkpoint``; nothing is written if a format breaks its parity bound."""
    from distill.backend.export import export_student
    from distill.backend.parity import ParitySet
    from distill.core.layout import RunLayout, student_folder
    from distill.core.loaders import load_candidates
    from distill.core.schema import InputError

    if cfg.checkpoint is None:
        raise InputError("export: checkpoint is required (a training run or an HF folder)")
    model = student_folder(cfg.checkpoint, exported=False)
    output = cfg.output or RunLayout.of(model).export
    parity = None
    if cfg.parity_input:
        data = load_candidates(cfg.parity_input, qrels=cfg.qrels)
        parity = ParitySet.from_data(data, cfg.parity_queries, cfg.parity_depth, cfg.ranking_queries)
    int8 = cfg.int8_mode if cfg.int8 else None
    return export_student(model, output, tuple(cfg.formats), cfg.fp16, int8, parity, cfg.calibration)
