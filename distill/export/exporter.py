"""``export_student``: a student's HF folder to an export folder of ONNX and TorchScript files, checked for parity.

The export folder holds the HF folder's files (it loads with ``AutoModelForSequenceClassification`` and
sentence-transformers' ``CrossEncoder``; a head ``transformers`` does not know also gets its modeling code as
remote code, :mod:`distill.export.remote_code`), the tokenizer (``tokenizer.json`` included, for runtimes
without transformers), the exported files of :data:`~distill.serving.scorers.FORMAT_FILES` (``model.onnx`` also as
``onnx/model.onnx``, where sentence-transformers' and text-embeddings-inference's ONNX backends read it:
:data:`~distill.serving.scorers.FORMAT_COPIES`), ``card.json`` (with
the quality gate of every lower precision, :mod:`distill.export.quality_gate`) and ``README.md``, its model card
in the Hugging Face Hub's format (:mod:`distill.export.model_card`). It is written to a staging folder and moved
into place only when every file passes the parity check, so a failed export leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from distill.core.counts import counted
from distill.core.files import check_model_folder
from distill.core.output_files import remove_stale_siblings, replace_folder, staging_path
from distill.core.run_folder import EXPORT_CARD
from distill.core.schema import ExistingOutputError, InputError, Qrels
from distill.core.student_card import StudentCard
from distill.data.teacher_data import TeacherDataset
from distill.export.model_card import render_model_card
from distill.export.parity import FormatParity, ParityError, verify_export
from distill.export.parity_set import ParitySet, dl19_parity_set
from distill.export.quality_gate import QualityGate, measure_quality_gate, validation_set
from distill.export.quantize import INT8_RUNTIMES, Calibration, Int8Mode
from distill.export.recorded_paths import resolve_path
from distill.export.remote_code import write_remote_code
from distill.serving.calibration import ScoreCalibration, fit_platt
from distill.serving.encoding import encode_pairs, input_names, load_tokenizer, model_max_length, pad_batch
from distill.serving.scorers import FORMAT_COPIES, FORMAT_FILES, WEIGHT_FILES, require_file

log = logging.getLogger(__name__)

MODEL_CARD = "README.md"
EXPORTABLE = ("onnx", "torchscript")
LICENSE = "apache-2.0"
"""The model card's license unless the export is told otherwise (a Hugging Face Hub license id)."""
EXAMPLE_PAIRS = (
    ("how long is the life cycle of a flea", "The life cycle of a flea can last a year."),
    ("rhino", "Rhinos are large herbivores with one or two horns."),
)
"""Two pairs of different lengths: the export's example batch (batch 2, padded), so no size is specialised."""


@dataclass
class ExportReport:
    """What :func:`export_student` wrote and how each format compared with PyTorch."""

    out_dir: Path
    formats: dict[str, str]
    """Format -> file name in ``out_dir``."""
    optimizations: dict[str, dict[str, Any]]
    """ONNX format -> what was done to its graph: for ``onnx``, the exporter, the fused op counts and how many ops
    run on the first token only (:mod:`distill.export.cls_tail`); for ``onnx-int8`` and ``onnx-fp16``, the graph
    they come from and, for int8, the quantisation (mode, types, calibration)."""
    parity: list[FormatParity]
    quality_gate: QualityGate | None = None
    """Each lower precision's ranking against PyTorch fp32 on the validation pairs; None without judged pairs."""
    remote_code: str | None = None
    """The modeling file written for ``trust_remote_code`` loaders (None: ``transformers`` knows the head)."""
    hub_url: str | None = None
    """Where ``--push_to_hub`` uploaded the folder."""
    score_calibration: ScoreCalibration | None = None
    """Platt scaling of the raw scores, fitted on the quality gate's judged pairs; None without them."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "formats": self.formats,
            "optimizations": self.optimizations,
            "parity": [asdict(p) for p in self.parity],
            "quality_gate": self.quality_gate.to_dict() if self.quality_gate else None,
            "score_calibration": self.score_calibration.to_dict() if self.score_calibration else None,
            "remote_code": self.remote_code,
        }

    def format(self) -> str:
        """A table of the files and their parity figures."""
        header = f"{'format':<12} {'file':<22} {'device':<6} {'runtime':<11} {'max |Δscore|':>12} {'bound':>7}"
        lines = [f"{header}  nDCG@10 (PyTorch -> format)"]
        for p in self.parity:
            ndcg = f"{p.ndcg10['pytorch']:.2f} -> {p.ndcg10[p.format]:.2f}" if p.ndcg10 else ""
            if p.ndcg10 and not p.ndcg10["passed"]:
                ndcg += " failed the quality gate: kept, never chosen by backend='auto'"
            diff = "-" if p.max_abs_diff is None else f"{p.max_abs_diff:.3g}"
            bound = "-" if p.bound is None else f"{p.bound:g}"
            file = self.formats[p.format]
            lines.append(
                f"{p.format:<12} {file:<22} {p.device or '-':<6} {p.runtime or '-':<11} {diff:>12} {bound:>7}  "
                f"{ndcg}{p.not_checked or ''}"
            )
        if self.quality_gate is not None:
            lines.append(self.quality_gate.format())
        if (calibration := self.score_calibration) is not None and calibration.quality is not None:
            q = calibration.quality
            lines.append(
                f"score calibration (Platt, on {q.pairs} pairs of the gate, {q.relevant} relevant): "
                f"p = sigmoid({calibration.scale:.4g} * raw + {calibration.bias:.4g}); Brier {q.brier:.4f}, "
                f"ECE {q.ece:.4f}, 5th-95th percentile {q.p05:.3f}-{q.p95:.3f}"
            )
        lines.append(f"wrote {self.out_dir} (card.json has the parity figures, {MODEL_CARD} the model card)")
        if self.hub_url:
            lines.append(f"uploaded to {self.hub_url}")
        return "\n".join(lines)


def export_student(
    hf_dir: str | Path,
    out_dir: str | Path,
    formats: tuple[str, ...] = EXPORTABLE,
    fp16: bool = False,
    int8: Int8Mode | None = None,
    parity: ParitySet | None = None,
    calibration: Calibration | None = None,
    hub_id: str | None = None,
    license: str = LICENSE,
) -> ExportReport:
    """Export the student in ``hf_dir`` to ``out_dir`` and check every file against PyTorch.

    Args:
        hf_dir: a student's Hugging Face folder (``AutoModelForSequenceClassification``, one label).
        out_dir: the export folder; an existing one is replaced only if it is an export folder (has ``card.json``).
        formats: ``onnx`` (``model.onnx``: dynamic batch and sequence axes, fused by onnxruntime's transformer
            optimiser for the BERT family, see :mod:`distill.export.onnx_graphs`) and/or ``torchscript``
            (``model.torchscript.pt``, a trace returning ``[batch]`` scores).
        fp16: also write ``model.fp16.onnx`` (fp16 weights, for GPUs); needs ``onnx``.
        int8: also write ``model.int8.onnx`` (int8, for CPUs), quantised ``static``, ``dynamic`` (for
            onnxruntime) or ``weights`` (for OpenVINO; see :mod:`distill.export.quantize`); needs ``onnx``.
        parity: the score pairs of the parity check and the ranking set of the quality gate (and the int8
            nDCG@10 bound); default: the score pairs of :func:`~distill.export.parity_set.dl19_parity_set` and the
            student's validation pairs, :func:`~distill.export.quality_gate.validation_set`.
        calibration: the pairs static int8 is calibrated on; default
            :class:`~distill.export.quantize.Calibration` (DL21 and DL22 candidates).
        hub_id: the Hugging Face Hub id the model card's usage snippets load (default: a placeholder path).
        license: the model card's licence (a Hub licence identifier).

    Raises:
        ParityError: an exported file breaks its bound; nothing is written to ``out_dir``.
    """
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    if unknown := sorted(set(formats) - set(EXPORTABLE)):
        raise InputError(f"unknown export format(s) {unknown}: expected some of {list(EXPORTABLE)}")
    if int8 is not None and int8 not in INT8_RUNTIMES:
        raise InputError(f"int8 must be one of {list(INT8_RUNTIMES)} or None, not {int8!r}")
    int8_runtime = INT8_RUNTIMES[int8] if int8 else "onnxruntime"
    if int8_runtime == "openvino" and importlib.util.find_spec("openvino") is None:
        raise InputError(f"int8 mode {int8!r} makes a graph for OpenVINO: pip install openvino")
    if (fp16 or int8) and "onnx" not in formats:
        raise InputError("fp16 and int8 are variants of the ONNX graph: add 'onnx' to the formats")
    require_file(hf_dir, "config.json")
    require_file(hf_dir, *WEIGHT_FILES)
    check_model_folder(hf_dir)  # a malformed JSON file or truncated weights: one line naming the file
    _check_one_output(hf_dir)
    remove_stale_siblings(out_dir)  # an export killed while replacing this one gets the old one back first
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / EXPORT_CARD).is_file():
        raise ExistingOutputError(
            f"{out_dir} exists and is not an export folder (no {EXPORT_CARD}): choose another --output"
        )
    parity = parity or dl19_parity_set().with_ranking(validation_set(hf_dir))
    staging = staging_path(out_dir)
    if staging.exists():
        shutil.rmtree(staging)
    with _terminate_as_exit():  # SIGTERM too goes through the clean-up below
        try:
            shutil.copytree(hf_dir, staging, ignore=shutil.ignore_patterns(*FORMAT_FILES.values(), EXPORT_CARD))
            remote_code = write_remote_code(staging)
            written, optimizations = _write_formats(staging, formats, fp16, int8, calibration)
            if parity.ranking:
                queries = counted(len({pair.qid for pair in parity.ranking}), "query", "queries")
                log.info("quality gate: %s of %s, on each runtime", counted(len(parity.ranking), "pair"), queries)
            gate = measure_quality_gate(staging, parity, int8_runtime)
            log.info("parity: %s, each file against PyTorch", counted(len(parity.pairs), "pair"))
            results = verify_export(staging, parity, int8_runtime, gate)
            report = ExportReport(out_dir, written, optimizations, results, gate, remote_code)
            report.score_calibration = fit_score_calibration(gate, parity.qrels)
            card = _card(hf_dir, out_dir, staging, report)
            (staging / EXPORT_CARD).write_text(json.dumps(card, indent=2) + "\n")
            (staging / MODEL_CARD).write_text(render_model_card(card, hub_id or f"path/to/{out_dir.name}", license))
        except BaseException as e:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(e, ParityError):
                raise ParityError(f"export of {hf_dir} to {out_dir} (nothing written)", e.failures, e.results) from None
            raise
        replace_folder(staging, out_dir)
    return report


def fit_score_calibration(gate: QualityGate | None, qrels: Qrels) -> ScoreCalibration | None:
    """Platt scaling of PyTorch fp32's raw scores of the gate's pairs against their judgments: a pair is relevant
    at the qrels' binary level (:func:`~distill.eval.metrics.default_rel_level`), and an unjudged candidate counts
    as not relevant, as nDCG@10 counts it. None without the gate's pairs, or where they hold one class only."""
    from distill.eval.metrics import default_rel_level

    if gate is None or not gate.reference:
        return None
    level = default_rel_level(qrels)
    raw, relevant = [], []
    for qid, scores in gate.reference.items():
        judged = qrels.get(qid, {})
        for docid, score in scores.items():
            raw.append(score)
            relevant.append(judged.get(docid, 0) >= level)
    try:
        return fit_platt(np.array(raw), np.array(relevant), gate.pairs)
    except InputError as error:
        log.warning("%s; the export has no calibration (its normalised scores are the raw scores' sigmoid)", error)
        return None


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """Within the context, ``SIGTERM`` raises ``SystemExit(143)`` (where it would kill the process at once, without
    any clean-up), so that ``finally`` and ``except`` blocks run; the handler before is restored on exit. Only in
    the main thread, and only where ``SIGTERM`` has its default handler (a training run's own stays)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _check_one_output(folder: Path) -> None:
    """The model in ``folder`` scores a pair with one number, as a student does.

    Raises:
        InputError: naming the folder and its number of outputs.
    """
    from transformers import AutoConfig

    import distill.model.segment_cosine  # noqa: F401  (registers the segment-cosine head)

    labels = AutoConfig.from_pretrained(folder).num_labels
    if labels != 1:
        raise InputError(f"{folder}: a student has one output (num_labels=1), this model has {labels}")


def _write_formats(
    folder: Path, formats: tuple[str, ...], fp16: bool, int8: Int8Mode | None, calibration: Calibration | None
) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """Write the tokenizer and the exported files into ``folder`` (a copy of the HF folder).

    Returns:
        Format -> file, and format -> what was done to its graph (the card's ``optimizations``).
    """
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    import distill.model.segment_cosine  # noqa: F401  (registers the segment-cosine head)

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.save_pretrained(folder)  # writes tokenizer.json, for runtimes without transformers
    require_file(folder, "tokenizer.json")
    config = AutoConfig.from_pretrained(folder)
    queries, passages = zip(*EXAMPLE_PAIRS, strict=True)
    encoded = encode_pairs(tokenizer, queries, passages, model_max_length(folder, tokenizer))
    example = {name: torch.from_numpy(array) for name, array in pad_batch(tokenizer, encoded.features).items()}
    written: dict[str, str] = {}
    optimizations: dict[str, dict[str, Any]] = {}
    if "onnx" in formats:
        from distill.export.cls_tail import run_tail_on_first_token
        from distill.export.onnx_graphs import OPSET, convert_fp16, export_onnx, fuse_transformer

        path = folder / FORMAT_FILES["onnx"]
        eager = AutoModelForSequenceClassification.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager"
        )
        log.info("ONNX: exporting %s and fusing its graph", FORMAT_FILES["onnx"])
        export_onnx(eager.eval(), example, path)
        del eager
        fused = fuse_transformer(path, config)
        tail = run_tail_on_first_token(path)
        written["onnx"] = FORMAT_FILES["onnx"]
        for copy in (c for c, fmt in FORMAT_COPIES.items() if fmt == "onnx"):
            link_or_copy(path, folder / copy)
        optimizations["onnx"] = {
            "exporter": f"torch.onnx (TorchScript-based), opset {OPSET}",
            "fused_ops": fused,
            "first_token_tail_ops": tail,
        }
        if fp16:
            log.info("fp16: converting into %s", FORMAT_FILES["onnx-fp16"])
            convert_fp16(path, folder / FORMAT_FILES["onnx-fp16"])
            written["onnx-fp16"] = FORMAT_FILES["onnx-fp16"]
            optimizations["onnx-fp16"] = {"from": FORMAT_FILES["onnx"]}
        if int8:
            from distill.export.quantize import quantize_int8

            log.info("int8 (%s): quantising into %s", int8, FORMAT_FILES["onnx-int8"])
            quantised = quantize_int8(path, folder / FORMAT_FILES["onnx-int8"], int8, calibration)
            written["onnx-int8"] = FORMAT_FILES["onnx-int8"]
            optimizations["onnx-int8"] = {"from": FORMAT_FILES["onnx"], **quantised}
    if "torchscript" in formats:
        from distill.export.torchscript_file import export_torchscript

        log.info("TorchScript: tracing %s", FORMAT_FILES["torchscript"])
        model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
        export_torchscript(model, example, folder / FORMAT_FILES["torchscript"])
        written["torchscript"] = FORMAT_FILES["torchscript"]
    return written, optimizations


def link_or_copy(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source`` (the same file, no extra disk), or a copy where the file system cannot
    link; its folder is made."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _card(hf_dir: Path, out_dir: Path, folder: Path, report: ExportReport) -> dict[str, Any]:
    """``card.json``: the student's card (``config.cis_distill``), the metadata of its teacher datasets (None for
    one not found at export time, from the working folder or the project's), the files written, their parity
    figures and the quality gate. Paths are relative to the export folder (the student's source) or as the training
    command gave them (its teacher data), with the checksum of the source's weights, by which a run's ``export/``
    older than its ``hf/`` is told (:meth:`~distill.core.run_folder.RunLayout.student`)."""
    from transformers import AutoConfig

    from distill.core.checksums import weights_checksum
    from distill.export.onnx_graphs import OPSET

    config = AutoConfig.from_pretrained(folder)
    tokenizer = load_tokenizer(folder)
    card = StudentCard.find(folder)
    found = {path: resolve_path(path) for path in (card.teacher_data if card else [])}
    teacher_data = {
        path: asdict(TeacherDataset.open(at).metadata) if at and TeacherDataset.is_complete(at) else None
        for path, at in found.items()
    }
    return {
        "source": os.path.relpath(hf_dir.resolve(), out_dir.resolve()),
        "source_weights": weights_checksum(hf_dir),
        "model_type": config.model_type,
        "segment_layers": getattr(config, "segment_layers", 0),
        "num_hidden_layers": config.num_hidden_layers,
        "inputs": list(input_names(tokenizer)),
        "max_length": model_max_length(folder, tokenizer),
        "onnx_opset": OPSET if "onnx" in report.formats else None,
        "student": card.to_dict() if card else None,
        "teacher_data": teacher_data,
        **report.to_dict(),
        "versions": {p: version(p) for p in ("torch", "transformers", "onnx", "onnxruntime", "onnxscript")},
    }
