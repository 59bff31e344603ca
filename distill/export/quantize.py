"""int8 graphs of a student for CPUs, quantised from its fused fp32 graph (:mod:`distill.export.onnx_graphs`).

- ``dynamic``: int8 weights with one scale per output channel; activations quantised at run time, one scale per
  tensor from its min and max (``quantize_dynamic``: ``QAttention``, ``DynamicQuantizeMatMul``). Needs no data.
- ``static``: int8 weights (per output channel) and uint8 activations whose scales are fixed by calibration on
  real pairs (``quantize_static``, QDQ format): by default the TREC DL21 and DL22 BM25 candidates, never DL19,
  the parity check's test set.
- ``weights``: int8 weights with one scale per output channel (each weight behind a ``DequantizeLinear``) and fp32
  activations in the file; OpenVINO quantises each token's activations at run time, one scale per
  :data:`~distill.serving.scorers.OPENVINO_INT8_GROUP_SIZE` channels, and runs the matmuls in int8. That is far
  finer than ``dynamic``'s one scale per tensor, so a student's int8 ranking keeps closer to its fp32 self's
  (:mod:`benchmarks.int8` measures both on the DL21 candidates; its results are on the CPU latency results page).
  It is a graph for OpenVINO: onnxruntime folds the weights back to fp32 when it loads it.

Whichever the mode, the parity check bounds the int8 graph's nDCG@10 change on the runtime that runs it
(:mod:`distill.export.parity`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from distill.core.batching import token_budget_batches
from distill.core.project_files import CALIBRATION_INPUTS, shipped
from distill.core.schema import InputError
from distill.export.recorded_paths import shown_path
from distill.serving.encoding import Batch, encode_pairs, load_tokenizer, model_max_length, pad_batch

Int8Mode = Literal["dynamic", "static", "weights"]
INT8_RUNTIMES: dict[str, str] = {"dynamic": "onnxruntime", "static": "onnxruntime", "weights": "openvino"}
"""The runtime each mode's graph is made for, and checked on."""
CALIBRATION_METHODS = ("MinMax", "Entropy", "Percentile")
QUANTISED_OPS = ("MatMul", "Attention")
"""The ops given int8 weights: the encoder's matmuls (the fused ``Attention`` holds Q, K and V). The embeddings
(lookups, no arithmetic to save), the pooler and the classifier (one row per pair) stay fp32."""


@dataclass(frozen=True)
class Calibration:
    """The pairs static int8 scales are calibrated on, and how."""

    inputs: tuple[str, ...] = CALIBRATION_INPUTS
    """Candidate files (any ``distill teach`` input); none of the parity check's queries."""
    per_query: int = 4
    """Candidates per query, evenly spaced down its list (ranks 1, 26, 51, 76 of 100)."""
    method: str = "MinMax"
    """onnxruntime's calibration method: ``MinMax``, ``Entropy`` or ``Percentile`` (99.999th)."""
    max_batch_tokens: int = 4096
    """Padded tokens per calibration batch."""

    def __post_init__(self) -> None:
        for key in ("per_query", "max_batch_tokens"):
            if getattr(self, key) < 1:
                raise InputError(f"calibration.{key}: must be at least 1, got {getattr(self, key)}")
        if self.method not in CALIBRATION_METHODS:
            raise InputError(f"calibration.method: one of {list(CALIBRATION_METHODS)}, not {self.method!r}")

    def pairs(self) -> list[tuple[str, str]]:
        """``(query, passage)`` pairs, query by query in input order."""
        from distill.data.loaders import load_candidates

        pairs = []
        for source in self.inputs:
            if source in CALIBRATION_INPUTS:
                shipped(source, "calibration.inputs")
            for cands in load_candidates(source).candidates:
                step = max(1, len(cands.passages) // self.per_query)
                pairs += [(cands.query.text, p.text) for p in cands.passages[::step][: self.per_query]]
        if not pairs:
            raise InputError(f"calibration: no candidates in {list(self.inputs)}")
        return pairs

    def batches(self, folder: Path) -> list[Batch]:
        """The pairs encoded with the student in ``folder``'s tokenizer, padded into batches.

        ``MinMax`` takes length-sorted batches under the token budget. The histogram methods (``Entropy``,
        ``Percentile``) stack every batch's activations into one array, so their batches all have one shape
        ``[rows, longest pair]``, with ``rows`` filling the token budget; the pairs of a last, partial batch are
        left out.
        """
        tokenizer = load_tokenizer(folder)
        queries, passages = zip(*self.pairs(), strict=True)
        encoded = encode_pairs(tokenizer, queries, passages, model_max_length(folder, tokenizer))
        if self.method == "MinMax":
            rows = token_budget_batches(encoded.lengths, self.max_batch_tokens)
            return [pad_batch(tokenizer, [encoded.features[i] for i in batch]) for batch in rows]
        longest = max(encoded.lengths)
        per_batch = max(1, self.max_batch_tokens // longest)
        batches = []
        for start in range(0, len(encoded.features) - per_batch + 1, per_batch):
            batches.append(pad_batch(tokenizer, encoded.features[start : start + per_batch], longest))
        if not batches:
            raise InputError(f"calibration: {len(encoded.features)} pairs fill no batch of {per_batch}")
        return batches

    def describe(self, batches: Sequence[Batch]) -> dict[str, Any]:
        """What the card records: the inputs (relative to the repository where they are in it), the method, the
        pairs and batches used."""
        shown = [Path(p).resolve() for p in self.inputs]
        return {
            "inputs": [shown_path(str(p)) for p in shown],
            "per_query": self.per_query,
            "method": self.method,
            "pairs": sum(len(b["input_ids"]) for b in batches),
            "batches": len(batches),
        }


class _Reader:
    """onnxruntime's ``CalibrationDataReader``: the batches as feeds of the graph's inputs, then None."""

    def __init__(self, batches: Sequence[Batch], input_names: Sequence[str]) -> None:
        self._feeds: Iterator[dict[str, Any]] = iter([{n: b[n] for n in input_names} for b in batches])

    def get_next(self) -> dict[str, Any] | None:
        return next(self._feeds, None)

    def __iter__(self):  # onnxruntime >= 1.17 iterates the reader
        return iter(self.get_next, None)


def quantize_int8(source: Path, target: Path, mode: Int8Mode, calibration: Calibration | None = None) -> dict[str, Any]:
    """Write ``source`` (a fused fp32 graph in a student folder) as an int8 graph to ``target``; what was done.

    Args:
        mode: ``dynamic``, ``static`` or ``weights`` (see the module docstring).
        calibration: the static mode's pairs and method (default :class:`Calibration`); unused by the others.

    Returns:
        The card's record: mode, format, weight and activation types, and for ``static`` the calibration.
    """
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static

    # onnx's shape inference stops at onnxruntime's fused ops; their outputs are fp32.
    extra: dict[str, Any] = {"DefaultTensorType": onnx.TensorProto.FLOAT}
    if mode == "dynamic":
        quantize_dynamic(
            str(source),
            str(target),
            op_types_to_quantize=list(QUANTISED_OPS),
            weight_type=QuantType.QInt8,
            per_channel=True,
            extra_options=extra,
        )
        return {
            "mode": mode,
            "weights": "int8, one scale per output channel",
            "activations": "uint8 at run time, one scale per tensor",
            "runtime": INT8_RUNTIMES[mode],
        }
    if mode == "weights":
        from distill.serving.scorers import OPENVINO_INT8_GROUP_SIZE

        quantised = quantize_weights(source, target)
        return {
            "mode": mode,
            "format": "QDQ, weights only",
            "weights": f"int8, one scale per output channel ({quantised} matrices)",
            "activations": f"int8 at run time, one scale per {OPENVINO_INT8_GROUP_SIZE} channels of a token",
            "runtime": INT8_RUNTIMES[mode],
        }
    if mode != "static":
        raise InputError(f"int8 mode must be one of {list(INT8_RUNTIMES)}, not {mode!r}")
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    calibration = calibration or Calibration()
    batches = calibration.batches(source.parent)
    if calibration.method == "Percentile":
        extra["CalibPercentile"] = 99.999
    # The quantiser quantises an activation only where it knows its type: onnxruntime's symbolic shape inference
    # knows the fused ops, onnx's does not.
    model = SymbolicShapeInference.infer_shapes(onnx.load(str(source)), auto_merge=True)
    inputs = [i.name for i in model.graph.input]
    quantize_static(
        model,
        str(target),
        _Reader(batches, inputs),
        op_types_to_quantize=list(QUANTISED_OPS),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=getattr(CalibrationMethod, calibration.method),
        extra_options=extra,
    )
    return {
        "mode": mode,
        "format": "QDQ",
        "weights": "int8, one scale per output channel",
        "activations": "uint8, calibrated scales",
        "calibration": calibration.describe(batches),
        "runtime": INT8_RUNTIMES[mode],
    }


def quantize_weights(source: Path, target: Path) -> int:
    """Write ``source`` to ``target`` with every matmul weight (the 2-D constant second input of a ``MatMul`` or a
    fused ``Attention``) stored as int8, one symmetric scale per output channel, behind a ``DequantizeLinear``; the
    number of weight matrices quantised. Embeddings and every other constant stay fp32."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    constants = {t.name: t for t in graph.initializer}
    dequantised: dict[str, str] = {}
    nodes = []
    for node in graph.node:
        weight = node.input[1] if node.op_type in QUANTISED_OPS and len(node.input) > 1 else None
        if weight in constants and len(constants[weight].dims) == 2:
            if weight not in dequantised:
                values = numpy_helper.to_array(constants[weight]).astype(np.float32)
                scale = (np.abs(values).max(axis=0) / 127).clip(min=np.finfo(np.float32).tiny)
                q = np.clip(np.round(values / scale), -127, 127).astype(np.int8)
                names = (f"{weight}/int8", f"{weight}/scale", f"{weight}/zero_point", f"{weight}/dequantised")
                graph.initializer.extend(
                    [
                        numpy_helper.from_array(q, names[0]),
                        numpy_helper.from_array(scale.astype(np.float32), names[1]),
                        numpy_helper.from_array(np.zeros(scale.shape, np.int8), names[2]),
                    ]
                )
                nodes.append(helper.make_node("DequantizeLinear", list(names[:3]), [names[3]], names[3], axis=1))
                dequantised[weight] = names[3]
            node.input[1] = dequantised[weight]
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in graph.initializer if t.name not in dequantised]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    onnx.save(model, str(target))
    return len(dequantised)
