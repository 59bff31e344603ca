"""fp8 matmuls for the teacher's decoder layers, an opt-in lever (:class:`~teachers.causal_lm.ScorerOptions`' ``fp8``).

Every ``nn.Linear`` of the decoder layers becomes an :class:`Fp8Linear`: its weight stored in e4m3 with one fp32
scale per output row, its input quantised to e4m3 per row (per token) at each call, and the product computed by
``torch._scaled_mm`` (Hopper's fp8 tensor cores on CUDA; a reference kernel on the CPU) with fp32 accumulation and
a bf16 output. The embeddings, the norms, attention itself and the LM head stay in bf16: the log-softmax over the
vocabulary is where the scores are made, and it is not worth rounding.
"""

from __future__ import annotations

import torch
from torch import nn

from distill.core.schema import InputError

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
"""448: e4m3's largest finite value, where each row's largest magnitude is put."""
FP8_ALIGN = 16
"""The fp8 GEMM's requirement on both of a weight's dimensions (CUDA's ``_scaled_mm``)."""


def rowwise_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[M, K]`` (any float dtype) -> ``([M, K]`` e4m3, ``[M, 1]`` fp32 scales), ``x ≈ q * scale`` row by row,
    each row's largest magnitude mapped to :data:`FP8_MAX` (an all-zero row keeps a tiny positive scale)."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-12) / FP8_MAX
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8), scale


class Fp8Linear(nn.Module):
    """``nn.Linear`` in fp8: ``y = (q(x) @ q(W)ᵀ) · s_x · s_W + b``, for bf16 inputs ``[..., in_features]`` ->
    bf16 ``[..., out_features]``.

    The weight ``[out, in]`` is quantised once, per output row (``weight_scale`` ``[1, out]`` fp32); the input per
    row at each call. The bias, if any, is added in bf16 after the product.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight, scale = rowwise_fp8(linear.weight.detach())
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", scale.t().contiguous())
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        q, scale = rowwise_fp8(rows)
        out = torch._scaled_mm(q, self.weight.t(), scale_a=scale, scale_b=self.weight_scale, out_dtype=x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_layers(layers: nn.ModuleList) -> int:
    """Replace every ``nn.Linear`` inside ``layers`` (the decoder layers, whose weights must be bf16) by an
    :class:`Fp8Linear`, in place; returns how many.

    Raises:
        InputError: there is no ``nn.Linear``, a weight is not bf16, or a dimension is not a multiple of
            :data:`FP8_ALIGN`; nothing is replaced then.
    """
    found = [
        (parent, name, child, f"layers.{i}.{path}.{name}".replace("..", "."))
        for i, layer in enumerate(layers)
        for path, parent in layer.named_modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
    ]
    if not found:
        raise InputError("fp8: the decoder layers hold no nn.Linear to run in fp8")
    for _, _, linear, where in found:
        if linear.weight.dtype != torch.bfloat16:
            raise InputError(
                f"fp8: {where} is {str(linear.weight.dtype).removeprefix('torch.')}; fp8 needs dtype "
                "bfloat16 (its matmuls return bf16)"
            )
        if linear.in_features % FP8_ALIGN or linear.out_features % FP8_ALIGN:
            raise InputError(
                f"fp8: {where} is {linear.in_features} x {linear.out_features}, not multiples of {FP8_ALIGN}"
            )
    for parent, name, linear, _ in found:
        setattr(parent, name, Fp8Linear(linear))
    return len(found)
