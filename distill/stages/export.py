"""The export stage: a student to ONNX and TorchScript files, each checked for parity with PyTorch, with the quality
gate of each lower precision and a model card; optionally uploaded to the Hugging Face Hub."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from distill.core.schema import ExistingOutputError, InputError
from distill.export.exporter import LICENSE, ExportReport
from distill.export.parity_set import PARITY_DEPTH, PARITY_QUERIES
from distill.export.quantize import Calibration, Int8Mode


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
    at run time, far more finely; needs OpenVINO, the ``openvino`` extra). See :mod:`distill.export.quantize`."""
    calibration: Calibration = field(default_factory=Calibration)
    """The pairs static int8 is calibrated on (default: DL21 and DL22 BM25 candidates, 4 per query)."""
    parity_input: str | None = None
    """Candidates of the score bounds (default: the shipped DL19 BM25 top-100; no qrels needed)."""
    parity_queries: int = PARITY_QUERIES
    """Queries of ``parity_input`` (or of the shipped DL19 list) for the score bounds."""
    parity_depth: int = PARITY_DEPTH
    """Candidates per query for the score bounds."""
    validation_input: str | None = None
    """Held-out candidates of the quality gate and the int8 nDCG@10 bound, every candidate of every judged query
    (default: the student card's validation queries in its teacher data's inputs; a student without a card: the
    shipped TREC DL21 queries). Never the test set."""
    validation_qrels: str | list[str] | None = None
    """Qrels of the validation candidates: a file, an ``irds:`` id or a list of these (default: the student card's,
    its training's ``data.qrels``, else the ``qrels.txt`` beside each candidates file, else those the input
    carries)."""
    license: str = LICENSE
    """The model card's licence (a Hub licence identifier)."""
    push_to_hub: str | None = None
    """Upload the finished export folder to this Hugging Face Hub model repository (``user/name``), created if
    missing; needs network access and a token (``HF_TOKEN`` or ``hf auth login``)."""
    private: bool = False
    """With ``push_to_hub``: create the repository private."""

    def __post_init__(self) -> None:
        for name in ("parity_queries", "parity_depth"):
            if getattr(self, name) < 1:
                raise InputError(f"export: {name} must be positive, got {getattr(self, name)}")
        if not self.formats:
            raise InputError("export: formats is empty: name onnx, torchscript or both (an export with no graph)")
        if self.push_to_hub is not None:
            from distill.export.hub import check_repo_id

            check_repo_id(self.push_to_hub)  # before the export, which can take long
        elif self.private:
            raise InputError("export: private: it applies to the repository push_to_hub creates; give push_to_hub")


def export(cfg: ExportConfig) -> ExportReport:
    """Export the student of ``cfg.checkpoint``; nothing is written if a format breaks its parity bound."""
    from distill.core.files import check_model_folder
    from distill.core.output_files import hold_output
    from distill.core.path_checks import output_folder
    from distill.core.run_folder import RunLayout, student_folder
    from distill.data.loaders.qrels import qrels_files

    if cfg.checkpoint is None:
        raise InputError("export: checkpoint is required (a training run or an HF folder)")
    int8 = cfg.int8_mode if cfg.int8 else None
    model = student_folder(cfg.checkpoint, exported=False)
    check_model_folder(model)  # before any work: a malformed JSON file or truncated weights, named
    inputs = [("checkpoint", model), ("parity_input", cfg.parity_input), ("validation_input", cfg.validation_input)]
    inputs += [("validation_qrels", path) for path in qrels_files(cfg.validation_qrels)]
    inputs += [("calibration.inputs", path) for path in cfg.calibration.inputs]
    output = output_folder(cfg.output or RunLayout.of(model).export, "export", "output", inputs, replaced=True)
    lock = hold_output(output)
    if lock is None:
        raise ExistingOutputError(
            f"{output}: another distill export is writing it now: wait for it to end, or choose another --output"
        )
    try:
        return _export_held(cfg, model, output, int8)
    finally:
        lock.release()


def _export_held(cfg: ExportConfig, model: Path, output: Path, int8: Int8Mode | None) -> ExportReport:
    """The export once this process holds ``output``."""
    from distill.data.loaders import RunWithoutTexts, load_candidates
    from distill.export.exporter import export_student
    from distill.export.parity_set import ParitySet, dl19_parity_set
    from distill.export.quality_gate import validation_set

    try:
        if cfg.parity_input:
            parity = ParitySet.from_data(load_candidates(cfg.parity_input), cfg.parity_queries, cfg.parity_depth, 0)
        else:
            parity = dl19_parity_set(cfg.parity_queries, cfg.parity_depth)
        parity = parity.with_ranking(validation_set(model, cfg.validation_input, cfg.validation_qrels))
        report = export_student(
            model, output, tuple(cfg.formats), cfg.fp16, int8, parity, cfg.calibration, cfg.push_to_hub, cfg.license
        )
    except RunWithoutTexts as e:  # export has no --queries or --corpus: the loader's hint would not work
        raise InputError(
            f"{e.path}: a TREC run has no texts; export takes candidates with theirs (rank_llm JSON, a BEIR folder, an "
            "irds: id)"
        ) from None
    if cfg.push_to_hub is not None:
        from distill.export.hub import push_to_hub

        report.hub_url = push_to_hub(report.out_dir, cfg.push_to_hub, cfg.private)
    return report
