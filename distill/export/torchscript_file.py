"""The TorchScript file of a student: a trace of the model returning its ``[batch]`` scores."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from distill.export.onnx_graphs import Logits


class Scores(Logits):
    """A sequence-classification model as a function of its input tensors: scores ``[batch]``."""

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        return super().forward(input_ids, attention_mask, token_type_ids).squeeze(-1)


def export_torchscript(model: torch.nn.Module, example: dict[str, torch.Tensor], path: Path) -> None:
    """Trace ``model`` (fp32, eval mode) on ``example`` and save it to ``path``.

    A trace records the operations of one input, so ``example`` must have batch >= 2 and padding (an
    attention mask with zeros). Its TracerWarnings (shape-dependent branches treated as constants) are
    silenced: the parity check at several batch sizes and lengths (:mod:`distill.export.parity`) is what
    proves the file valid for any batch and any length up to the max. So are the deprecation warnings of the
    model's own properties, which the tracer reads, every one, while it looks for exported methods.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=r"`\w+` is deprecated", category=FutureWarning)
        traced = torch.jit.trace(Scores(model).eval(), tuple(example.values()), check_trace=False)
    traced.save(str(path))
