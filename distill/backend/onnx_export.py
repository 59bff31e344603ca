"""ONNX graphs of a student: fp32 (``torch.onnx.export``), fp16 weights (for GPUs), int8 weights (for CPUs)."""

from __future__ import annotations

from pathlib import Path

import torch

OPSET = 18


class Logits(torch.nn.Module):
    """A sequence-classification model as a function of its input tensors: ``logits`` ``[batch, 1]``."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits


def export_onnx(model: torch.nn.Module, example: dict[str, torch.Tensor], path: Path) -> None:
    """Write ``model`` (fp32, eval mode) as one ONNX file with dynamic batch and sequence axes.

    Args:
        model: an ``AutoModelForSequenceClassification`` with one label.
        example: the graph's inputs (``input_ids``, ``attention_mask`` and maybe ``token_type_ids``, in that
            order), int64 ``[batch, sequence]`` with batch >= 2 and some padding, so that no size is specialised.
        path: the ``.onnx`` file; inputs named as ``example``'s keys, output ``logits`` ``[batch, 1]``.
    """
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    torch.onnx.export(
        Logits(model).eval(),
        tuple(example.values()),
        str(path),
        input_names=list(example),
        output_names=["logits"],
        dynamic_shapes=tuple({0: batch, 1: sequence} for _ in example),
        opset_version=OPSET,
        dynamo=True,
        external_data=False,
        verbose=False,
    )


def convert_fp16(source: Path, target: Path) -> None:
    """``source`` with fp16 weights and activations; the inputs and the fp32 ``logits`` output are unchanged."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(str(source)), keep_io_types=True), str(target))


def quantize_int8(source: Path, target: Path) -> None:
    """``source`` with int8 weights (``quantize_dynamic``: QInt8 weights with one scale per output channel,
    activations quantised at run time), for CPUs.

    Per-channel scales follow the students' weights more closely than one scale per tensor, which is what keeps
    their ranking within the parity check's nDCG@10 bound (``benchmarks/int8.py`` compares the two on DL19).
    onnxruntime's suggested pre-processing (``quant_pre_process``) is skipped: its symbolic shape inference does
    not complete on torch.export graphs.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True)
