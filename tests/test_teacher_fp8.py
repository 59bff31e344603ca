"""The teacher's opt-in fp8 lever (issue 19) on the CPU, where torch's reference ``_scaled_mm`` runs the same call
as Hopper's fp8 tensor cores: the scaling, the layers it replaces, the scores it keeps, and its one-line errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from torch import nn

from distill.core.schema import InputError
from teachers import CausalLMTeacher
from teachers.causal_lm import ScorerOptions
from teachers.fp8 import FP8_MAX, Fp8Linear, quantize_layers, rowwise_fp8

from .test_teacher_levers import random_sequences


def test_rowwise_scales_put_each_rows_largest_magnitude_at_the_fp8_maximum() -> None:
    x = torch.tensor([[1.0, -3.0, 0.5], [0.0, 0.0, 0.0], [2.0, 8.0, -8.0]], dtype=torch.bfloat16)
    q, scale = rowwise_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (3, 1) and scale.dtype == torch.float32
    assert q.float().abs().amax(1).tolist() == [FP8_MAX, 0.0, FP8_MAX]
    torch.testing.assert_close(q.float() * scale, x.float(), rtol=2**-4, atol=0.0)


def test_an_fp8_linear_is_exact_where_the_values_are_fp8_values() -> None:
    """Inputs and weights of small powers of two quantise exactly, so the product is the fp32 one to bf16 rounding:
    a scale applied to the wrong side (rows against columns) or not at all would be far off."""
    generator = torch.Generator().manual_seed(0)
    levels = torch.tensor([0.0, 0.25, 0.5, 1.0, 2.0, -0.25, -1.0, -2.0])

    def pick(*shape: int) -> torch.Tensor:
        values = levels[torch.randint(len(levels), shape, generator=generator)]
        values[:, 0] = 2.0  # every row's largest magnitude is 2, times its own power of two below
        return values * 2.0 ** torch.randint(-3, 4, (shape[0], 1), generator=generator)

    linear = nn.Linear(32, 48, bias=True).to(torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(pick(48, 32))
        linear.bias.copy_(torch.linspace(-1, 1, 48))
    x = pick(10, 32).to(torch.bfloat16).reshape(2, 5, 32)
    got = Fp8Linear(linear)(x)
    assert got.shape == (2, 5, 48) and got.dtype == torch.bfloat16
    expected = linear(x)
    torch.testing.assert_close(got, expected, rtol=2**-7, atol=2**-8 * float(expected.abs().max()))


def test_fp8_replaces_every_decoder_linear_and_keeps_the_per_query_ranking(tiny_llama: Path) -> None:
    plain = CausalLMTeacher.load(str(tiny_llama), dtype="bfloat16", max_batch_tokens=256).scorer
    fp8 = CausalLMTeacher.load(
        str(tiny_llama), dtype="bfloat16", max_batch_tokens=256, options=ScorerOptions(fp8=True)
    ).scorer
    layers = fp8.model.base_model.layers
    replaced = [m for m in layers.modules() if isinstance(m, Fp8Linear)]
    assert len(replaced) == 7 * len(layers) and not any(type(m) is nn.Linear for m in layers.modules())
    assert type(fp8.head) is nn.Linear and fp8.head.weight.dtype == torch.bfloat16
    sequences = random_sequences(fp8.model.config.vocab_size, 40, seed=5)
    got, reference = fp8.logprobs(sequences), plain.logprobs(sequences)
    assert not np.array_equal(got, reference)  # it did run in fp8
    np.testing.assert_allclose(got, reference, rtol=0.02)
    assert spearmanr(got, reference).statistic > 0.99


def test_fp8_needs_bf16_and_aligned_layers_and_says_which(tiny_llama: Path) -> None:
    with pytest.raises(InputError, match=r"^fp8: layers\.0\.self_attn\.q_proj is float32; fp8 needs dtype bfloat16"):
        CausalLMTeacher.load(str(tiny_llama), options=ScorerOptions(fp8=True))
    layers = nn.ModuleList([nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 24))]).to(torch.bfloat16)
    with pytest.raises(InputError, match=r"^fp8: layers\.0\.1 is 32 x 24, not multiples of 16$"):
        quantize_layers(layers)
    assert all(type(m) is nn.Linear for m in layers[0])  # nothing replaced
    with pytest.raises(InputError, match=r"^fp8: the decoder layers hold no nn\.Linear"):
        quantize_layers(nn.ModuleList([nn.LayerNorm(16)]))
    assert ScorerOptions(fp8=True).changed() == {"fp8": True}


def test_the_benchmark_ranks_fp8_against_the_plain_loops_bf16_on_the_fp8_ceiling(
    tiny_llama: Path, sample_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib
    import json

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    bench = importlib.import_module("teacher")
    out = tmp_path / "teacher.json"
    argv = ["--teacher", str(tiny_llama), "--input", str(sample_file), "--max-queries", "2", "--naive-pairs", "2"]
    argv += ["--plain-batch-size", "5", "--matmul-size", "64", "--matmul-reps", "1", "--device", "cpu"]
    argv += ["--dtype", "bfloat16", "--fp8", "--no-progress", "--out", str(out)]
    status = bench.main(argv)
    result = json.loads(out.read_text())
    ranking, matmul, stage = result["fp8_ranking"], result["matmul"], result["teacher"]
    assert (ranking["queries"], ranking["pairs"], ranking["target"]) == (2, 24, 0.999)
    assert -1 <= ranking["min_spearman"] <= ranking["mean_spearman"] <= 1
    assert status == (0 if ranking["met"] else 1)
    assert result["scorer_options"]["fp8"] and matmul["teacher_ceiling"] == "fp8"
    assert stage["flop_ceiling_fraction"] == pytest.approx(stage["achieved_flops_per_s"] / matmul["fp8_flops_per_s"])
    plain = result["plain"]
    assert plain["flop_ceiling_fraction"] == pytest.approx(plain["achieved_flops_per_s"] / matmul["flops_per_s"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--fp8", "--plain-pairs", "0"])
    with pytest.raises(SystemExit, match="--fp8 needs a bf16 model: add --dtype bfloat16 \\(not float32\\)"):
        bench.main([*argv[: argv.index("--dtype")], "--fp8", "--out", str(tmp_path / "fp32.json")])
    assert not (tmp_path / "fp32.json").exists()
