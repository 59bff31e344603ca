"""ONNX graphs of a student: fp32 with onnxruntime's transformer fusions (for CPUs and GPUs), fp16 weights (GPUs).

The graph is written by the TorchScript-based ``torch.onnx`` exporter from the model with eager attention, then
rewritten by onnxruntime's transformer optimiser (``onnxruntime.transformers.optimizer``) for the BERT family:
embeddings + LayerNorm -> ``EmbedLayerNormalization``, each self-attention block -> one ``Attention`` op, residual
+ LayerNorm -> ``SkipLayerNormalization``, bias + GELU -> ``BiasGelu``. The optimiser's attention and embedding
patterns match the TorchScript exporter's graphs only: on the ``dynamo=True`` exporter's graph (torch >= 2.9's
default) it fuses LayerNorm and GELU but no attention, and onnxscript's fusions for that graph give an
``Attention`` that onnxruntime's int8 quantiser leaves in fp32 (``variants`` of :mod:`benchmarks.onnx_cpu` measures
the three). The int8 graphs are quantised from the fused graph (:mod:`distill.export.quantize`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

OPSET = 17
FUSED_MODEL_TYPES = ("bert", "bert-segment-cosine")
"""Hugging Face ``model_type``s whose graphs onnxruntime's ``bert`` fusions are applied to; others stay plain."""


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
    """Write ``model`` (fp32, eval mode, eager attention) as one ONNX file with dynamic batch and sequence axes.

    Args:
        model: an ``AutoModelForSequenceClassification`` with one label, loaded with ``attn_implementation="eager"``
            (the attention pattern the fusions of :func:`fuse_transformer` match).
        example: the graph's inputs (``input_ids``, ``attention_mask`` and maybe ``token_type_ids``, in that
            order), int64 ``[batch, sequence]`` with batch >= 2 and some padding, so that no size is specialised.
        path: the ``.onnx`` file; inputs named as ``example``'s keys, output ``logits`` ``[batch, 1]``.
    """
    with warnings.catch_warnings():
        # The TorchScript-based exporter is deprecated in favour of dynamo=True, whose graphs the transformer
        # fusions do not match (see the module docstring). What its tracer warns about (shape-dependent branches
        # taken as constants, index ops that would misread negative indices) the parity check at several batch
        # sizes and lengths covers.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message="Exporting aten::index operator", category=UserWarning)
        torch.onnx.export(
            Logits(model).eval(),
            tuple(example.values()),
            str(path),
            input_names=list(example),
            output_names=["logits"],
            dynamic_axes={**{name: {0: "batch", 1: "sequence"} for name in example}, "logits": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )


def fuse_transformer(path: Path, config: Any) -> dict[str, int]:
    """Rewrite the graph at ``path`` with onnxruntime's transformer fusions, in place; the fused op counts.

    Args:
        path: a graph written by :func:`export_onnx`.
        config: the model's Hugging Face config (``model_type``, ``num_attention_heads``, ``hidden_size``).

    Returns:
        Fused op type -> how many the graph now holds (for MiniLM-L6: ``EmbedLayerNormalization`` 1,
        ``Attention`` 6, ``SkipLayerNormalization`` 12, ``BiasGelu`` 6); empty for a ``model_type`` not in
        :data:`FUSED_MODEL_TYPES`, whose graph is left as it is.
    """
    if config.model_type not in FUSED_MODEL_TYPES:
        return {}
    from onnxruntime.transformers.optimizer import optimize_model

    optimised = optimize_model(
        str(path),
        model_type="bert",
        num_heads=config.num_attention_heads,
        hidden_size=config.hidden_size,
        opt_level=0,  # the Python fusions only: the saved graph stays free of hardware-specific rewrites
    )
    optimised.save_model_to_file(str(path))
    return {op: n for op, n in optimised.get_fused_operator_statistics().items() if n}


def convert_fp16(source: Path, target: Path) -> None:
    """``source`` with fp16 weights and activations; the inputs and the fp32 ``logits`` output are unchanged.

    ``Max`` and ``Min`` (a clamp's, as the segment-cosine head's ``max(norm, eps)``) run in fp16 too: kept in fp32,
    as the converter's default list keeps them, a constant input was cast back to fp32 after the node that reads it,
    and the graph was invalid. The graph is checked whole before it is written.
    """
    import onnx
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    kept = [op for op in DEFAULT_OP_BLOCK_LIST if op not in ("Max", "Min")]
    graph = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True, op_block_list=kept)
    onnx.checker.check_model(graph, full_check=True)
    onnx.save(graph, str(target))
