"""The teacher's speed levers on the CPU: batch layouts, packed and bucketed batches, compiled
layers, no host sync per batch, and the exact default path; and the benchmark's plain batched loop."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import teacher_throughput
from distill.core.batching import token_budget_batches
from distill.core.config import options_of, parse_config
from distill.core.schema import InputError
from teachers import CausalLMTeacher
from teachers.batch_plan import PADDING_SEGMENT, build_batch, plan_batches
from teachers.causal_lm import (
    CausalLMScorer,
    ScorerOptions,
    ScoringSequence,
    block_causal_mask,
    row_logprobs,
    sequence_sums,
    target_logprobs,
)
from tests.teachers.test_teacher import naive_logprob

TIGHT = {"rtol": 1e-6, "atol": 1e-5}
"""fp32 on the CPU: packed or bucketed scores against padded ones (measured: about 1e-7 relative)."""


def random_sequences(vocab: int, n: int, seed: int, longest: int = 60) -> list[ScoringSequence]:
    rng = np.random.default_rng(seed)
    return [
        ScoringSequence([1, *rng.integers(3, vocab, int(p)).tolist()], rng.integers(3, vocab, int(t)).tolist())
        for p, t in zip(rng.integers(0, 12, n), rng.integers(1, longest, n), strict=True)
    ]


def legacy_logprobs(scorer: CausalLMScorer, sequences: list[ScoringSequence]) -> np.ndarray:
    """The scorer as it was before the levers: the model's own masking from a 2-D padding mask, each batch's
    sums added on the host. The committed CPU labels were computed this way."""
    result = np.empty(len(sequences))
    for batch in token_budget_batches([len(s) for s in sequences], scorer.max_batch_tokens):
        width = max(len(sequences[i]) for i in batch)
        input_ids = torch.full((len(batch), width), scorer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        rows, positions, targets = [], [], []
        for b, i in enumerate(batch):
            seq = sequences[i]
            ids = seq.prefix + seq.target
            input_ids[b, : len(ids)] = torch.tensor(ids)
            attention_mask[b, : len(ids)] = 1
            positions.extend(range(len(seq.prefix) - 1, len(ids) - 1))
            rows.extend([b] * len(seq.target))
            targets.extend(seq.target)
        with torch.inference_mode():
            hidden = scorer.body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
            picked = hidden[torch.tensor(rows), torch.tensor(positions)]
            logprobs = target_logprobs(picked, scorer.head, torch.tensor(targets), scorer.logit_chunk_rows)
        sums = torch.zeros(len(batch), dtype=torch.float64)
        sums.index_add_(0, torch.tensor(rows), logprobs.double())
        result[batch] = sums.numpy()
    return result


@pytest.fixture(scope="module")
def model(tiny_llama: Path) -> torch.nn.Module:
    return CausalLMTeacher.load(str(tiny_llama)).scorer.model


def scorer(model: torch.nn.Module, budget: int = 256, **options) -> CausalLMScorer:
    return CausalLMScorer(model, 7, 1, ScorerOptions(max_batch_tokens=budget, **options))


# ----------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("budget", [1, 64, 500])
def test_padded_plan_is_the_token_budget_batches_and_bucketed_widths_repeat(budget: int) -> None:
    lengths = np.random.default_rng(budget).integers(1, 200, 300).tolist()
    plain = plan_batches(lengths, budget)
    assert [p.sequences for p in plain] == token_budget_batches(lengths, budget)
    assert [p.width for p in plain] == [max(lengths[i] for i in p.sequences) for p in plain]
    bucketed = plan_batches(lengths, budget, bucket=64)
    assert sorted(i for p in bucketed for i in p.sequences) == list(range(300))
    for plan in bucketed:
        assert plan.width % 64 == 0 and plan.width - 64 < max(lengths[i] for i in plan.sequences) <= plan.width
        assert all(len(row) == 1 for row in plan.rows)
        assert plan.padded_tokens <= budget or len(plan.rows) == 1
    assert {p.width for p in bucketed} <= {64, 128, 192, 256}
    assert len({p.shape for p in bucketed}) < len({p.shape for p in plain})


@pytest.mark.parametrize("bucket", [1, 64])
def test_packed_rows_hold_every_sequence_once_in_a_few_shapes(bucket: int) -> None:
    lengths = np.random.default_rng(3).integers(1, 150, 400).tolist()
    plans = plan_batches(lengths, 1024, bucket=bucket, packing=True)
    assert sorted(i for p in plans for i in p.sequences) == list(range(400))
    width = -(-max(lengths) // bucket) * bucket
    assert {p.width for p in plans} == {width}
    assert {p.shape for p in plans[:-1]} == {(1024 // width, width)}
    assert all(sum(lengths[i] for i in row) <= width for p in plans for row in p.rows)
    padded = sum(p.padded_tokens for p in plan_batches(lengths, 1024))
    packed = sum(p.padded_tokens for p in plans)
    assert packed < padded and packed < 1.05 * sum(lengths) + width
    assert plans == plan_batches(lengths, 1024, bucket=bucket, packing=True)  # deterministic


def test_packed_batch_resets_positions_and_picks_the_token_before_each_target() -> None:
    prefixes, targets = [[1, 5], [1], [1, 7, 8]], [[10, 11, 12], [20, 21], [30]]
    plan = plan_batches([5, 3, 4], 16, bucket=8, packing=True)[0]
    assert plan.rows == [[0, 1], [2]] and plan.width == 8
    batch = build_batch(plan, prefixes, targets, pad_id=0)
    np.testing.assert_array_equal(batch.input_ids, [[1, 5, 10, 11, 12, 1, 20, 21], [1, 7, 8, 30, 0, 0, 0, 0]])
    np.testing.assert_array_equal(batch.position_ids, [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 7]])
    P = PADDING_SEGMENT
    np.testing.assert_array_equal(batch.segments, [[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, P, P, P, P]])
    np.testing.assert_array_equal(batch.input_ids.reshape(-1)[batch.picks + 1], batch.targets)
    np.testing.assert_array_equal(batch.targets, [10, 11, 12, 20, 21, 30])
    np.testing.assert_array_equal(batch.owners, [0, 0, 0, 1, 1, 2])
    np.testing.assert_array_equal(batch.columns, [0, 1, 2, 0, 1, 0])
    assert (batch.n_sequences, batch.longest_target) == (3, 3)
    mask = block_causal_mask(torch.from_numpy(batch.segments))[0, 0]
    assert mask[6].tolist() == [False] * 5 + [True, True, False]  # row 0, token 6 sees its own sequence only
    assert mask[3].tolist() == [True] * 4 + [False] * 4


def test_sequence_sums_are_the_sequential_sums_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 300, 40)
    values = torch.from_numpy(-rng.exponential(3.0, int(counts.sum())).astype(np.float32) * 10.0 ** rng.integers(-6, 2))
    owners = torch.from_numpy(np.repeat(np.arange(40), counts))
    columns = torch.from_numpy(np.concatenate([np.arange(c) for c in counts]))
    sums = sequence_sums(values, owners, columns, (40, int(counts.max()) + 3)).numpy()
    start = 0
    for k, c in enumerate(counts):
        want = 0.0
        for v in values[start : start + c].double().tolist():
            want += v
        assert sums[k] == want
        start += c


# ----------------------------------------------------------------------------- scores


def test_default_scores_are_bit_identical_to_the_legacy_scorer(model: torch.nn.Module) -> None:
    vocab = model.config.vocab_size
    sequences = random_sequences(vocab, 40, seed=0)
    for budget in (64, 400):
        fresh = scorer(model, budget)
        np.testing.assert_array_equal(fresh.logprobs(sequences), legacy_logprobs(fresh, sequences))


@pytest.mark.parametrize("options", [{"packing": True}, {"bucket": 64}, {"packing": True, "bucket": 16}])
def test_packed_and_bucketed_scores_agree_with_padded_ones(model: torch.nn.Module, options: dict) -> None:
    sequences = random_sequences(model.config.vocab_size, 40, seed=1)
    padded = scorer(model).logprobs(sequences)
    lever = scorer(model, **options)
    assert len(lever.plan(sequences)) > 1
    np.testing.assert_allclose(lever.logprobs(sequences), padded, **TIGHT)
    few = sequences[:3]
    want = [naive_logprob(model, s.prefix, s.target) for s in few]
    np.testing.assert_allclose(lever.logprobs(few), want, rtol=1e-5, atol=1e-4)


def test_no_host_sync_per_batch(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch stays on the device: one copy to the host at the end, whatever the number of batches."""
    calls: dict[str, int] = {}
    for name in ("cpu", "item", "tolist", "numpy", "__bool__", "__int__", "__float__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    sequences = random_sequences(model.config.vocab_size, 30, seed=2)
    for options in ({}, {"packing": True, "bucket": 16}):
        lever = scorer(model, 128, **options)
        assert len(lever.plan(sequences)) >= 5
        calls.clear()
        lever.logprobs(sequences)
        assert calls == {"cpu": 1, "numpy": 1}, options


def test_compiled_layers_give_the_same_scores_and_compile_a_few_times(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wiring and equality only: the eager backend stands in for inductor, whose CPU compile takes a minute."""
    from torch._dynamo.utils import counters

    compiled = []
    original, original_function = torch.nn.Module.compile, torch.compile

    def eager_compile(self, *args, **kwargs):
        compiled.append(self)
        return original(self, *args, **{**kwargs, "backend": "eager"})

    def eager_compile_function(function, *args, **kwargs):
        if function is row_logprobs:  # (Module.compile comes here too, with the module's own call)
            compiled.append(function)
        return original_function(function, *args, **{**kwargs, "backend": "eager"})

    monkeypatch.setattr(torch.nn.Module, "compile", eager_compile)
    monkeypatch.setattr(torch, "compile", eager_compile_function)
    teacher = CausalLMTeacher.load(str(tiny_llama), options=ScorerOptions(max_batch_tokens=128, compile=True))
    model = teacher.scorer.model
    assert compiled == [*model.base_model.layers, row_logprobs]
    sequences = random_sequences(model.config.vocab_size, 30, seed=3)
    assert len({p.shape for p in teacher.scorer.plan(sequences)}) >= 4
    torch._dynamo.reset()
    counters.clear()
    try:
        got = teacher.scorer.logprobs(sequences)
        graphs = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert 2 <= graphs <= 6  # the layers' and the head's, each at most three times
    plain = CausalLMTeacher.load(str(tiny_llama), options=ScorerOptions(max_batch_tokens=128)).scorer
    np.testing.assert_allclose(got, plain.logprobs(sequences), **TIGHT)


def test_the_compiled_head_log_softmax_equals_the_eager_one() -> None:
    """The real inductor kernel: one fused pass over bf16 logits gives the eager fp32 result, softcap included."""
    generator = torch.Generator().manual_seed(0)
    compiled = torch.compile(row_logprobs)
    for rows in (7, 32):  # a second shape: the dynamic recompile
        logits = (torch.randn(rows, 5000, generator=generator) * 6).to(torch.bfloat16)
        targets = torch.randint(0, 5000, (rows,), generator=generator)
        for softcap in (None, 30.0):
            eager = row_logprobs(logits, targets, softcap)
            assert eager.dtype == torch.float32
            torch.testing.assert_close(compiled(logits, targets, softcap), eager, rtol=1e-5, atol=1e-4)


def test_a_sliding_window_model_falls_back_to_its_own_masking_and_refuses_packing() -> None:
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=12,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = MistralForCausalLM._from_config(config, attn_implementation="sdpa").eval()
    sequences = random_sequences(300, 6, seed=4, longest=30)
    want = [naive_logprob(model, s.prefix, s.target) for s in sequences]
    np.testing.assert_allclose(scorer(model, 128).logprobs(sequences), want, rtol=1e-5, atol=1e-4)
    short = [ScoringSequence(s.prefix[:4], s.target[:6]) for s in sequences]
    want = [naive_logprob(model, s.prefix, s.target) for s in short]
    np.testing.assert_allclose(scorer(model, 128, packing=True).logprobs(short), want, rtol=1e-5, atol=1e-4)
    with pytest.raises(InputError, match="sliding window of 12 tokens"):
        scorer(model, 128, packing=True).logprobs(sequences)


def test_options_reject_a_bad_bucket_and_name_what_changed() -> None:
    with pytest.raises(InputError, match="bucket"):
        ScorerOptions(bucket=0)
    with pytest.raises(InputError, match="max_batch_tokens"):
        ScorerOptions(max_batch_tokens=-1)
    assert ScorerOptions().for_device("cpu").changed() == {}
    given = ScorerOptions(bucket=64, packing=True, max_batch_tokens=99).for_device("cpu")
    assert given.changed() == {"bucket": 64, "packing": True}


# ----------------------------------------------------------------------------- the stage


def test_teach_stage_packs_and_records_the_levers(tiny_llama: Path, sample_file: Path, tmp_path: Path) -> None:
    from distill.data.teacher_data import TeacherDataset
    from distill.stages.teach import TeachConfig, teach

    def run(name: str, **levers) -> TeacherDataset:
        cfg = TeachConfig(
            input=[str(sample_file)],
            output=str(tmp_path / name),
            teacher=str(tiny_llama),
            scores=["cis", "upr"],
            cache_dir=str(tmp_path / f"cache-{name}"),
            max_batch_tokens=512,
            progress=False,
            **levers,
        )
        return TeacherDataset.open(teach(cfg).output)

    padded, packed = run("padded"), run("packed", packing=True, bucket=64)
    assert not {"bucket", "packing", "compile", "cudnn_attention"} & set(padded.metadata.fingerprint)
    assert {k: packed.metadata.fingerprint[k] for k in ("bucket", "packing")} == {"bucket": 64, "packing": True}
    a, b = padded.to_pandas(), packed.to_pandas()
    for column in ("logp_cond", "logp_uncond", "logp_upr", "cis"):
        np.testing.assert_allclose(b[column], a[column], **TIGHT)


# ----------------------------------------------------------------------------- the benchmark


def test_benchmark_takes_the_levers_and_keeps_its_command_line() -> None:
    def parse(*argv: str) -> teacher_throughput.TeacherThroughput:
        return parse_config(teacher_throughput.TeacherThroughput, argv, "teacher")

    def levers(options: object, device: torch.device) -> ScorerOptions:
        return options_of(ScorerOptions, options).for_device(device)

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    old = parse("--random-config", "llama3-8b", "--device", "cuda", "--out", "x.json", "--progress", "false")
    assert levers(old, cpu) == EXACT
    assert levers(old, cuda) == CUDA_DEFAULTS
    new = parse("--random_config", "tiny", "--packing", "--bucket", "64", "--compile", "false")
    assert levers(new, cpu) == replace(EXACT, bucket=64, packing=True)
    assert levers(new, cuda) == replace(CUDA_DEFAULTS, compile=False)
    assert levers(parse("--cudnn-attention", "true"), cpu).cudnn_attention
    assert levers(parse("--max_batch_tokens", "512"), cuda).max_batch_tokens == 512
    with pytest.raises(InputError, match="packing"):
        parse("--packing", "maybe")
    with pytest.raises(InputError, match="max_batch_tokens"):
        parse("--max_batch_tokens", "0")


EXACT = ScorerOptions(max_batch_tokens=8192, bucket=1, packing=False, compile=False, cudnn_attention=False)
"""A CPU's defaults: the exact path."""
CUDA_DEFAULTS = ScorerOptions(max_batch_tokens=16384, bucket=64, packing=True, compile=True, cudnn_attention=False)


def test_the_teacher_levers_are_on_by_default_on_cuda_and_off_on_a_cpu() -> None:
    from distill.stages.teach import TeachConfig

    def levers(config: TeachConfig, device: str) -> ScorerOptions:
        return options_of(ScorerOptions, config).for_device(device)

    config = TeachConfig(input=["x.json"], output="out")
    assert levers(config, "cpu") == EXACT and not EXACT.changed()
    assert levers(config, "cuda:1") == CUDA_DEFAULTS
    assert CUDA_DEFAULTS.changed() == {"bucket": 64, "packing": True, "compile": True}  # the budget is no lever
    off = TeachConfig(input=["x.json"], output="out", packing=False, compile=False, bucket=1, max_batch_tokens=8192)
    assert levers(off, "cuda") == EXACT  # what is given is kept, on either device
    on = TeachConfig(input=["x.json"], output="out", packing=True, bucket=64)
    assert levers(on, "cpu") == replace(EXACT, bucket=64, packing=True)
    with pytest.raises(InputError, match="bucket"):
        TeachConfig(input=["x.json"], output="out", bucket=0)


def test_the_removed_fp8_lever_is_an_unknown_option_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """fp8 lost on speed and ranking and was removed; a command line or config that still names it gets
    the usual one-line error, and the benchmark no longer takes ``--fp8``."""
    from distill.cli import main

    assert "fp8" not in {f.name for f in dataclasses.fields(ScorerOptions)}
    assert main(["teach", "--fp8", "true", "--input", "x.json", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == "distill teach: error: unrecognized arguments: --fp8 true\n"
    config = tmp_path / "teach.yaml"
    config.write_text(f"input: [x.json]\noutput: {tmp_path / 'out'}\nfp8: true\n")
    assert main(["teach", "--config", str(config)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"distill teach: error: {config}: fp8: unknown option")
    assert teacher_throughput.main(["--fp8"]) == 2
    assert "unrecognized arguments: --fp8" in capsys.readouterr().err


def test_the_plain_batched_loop_scores_each_sequence_as_the_textbook_does(model) -> None:
    """Right-padded batches, the logits of every position, a full-vocabulary log-softmax: each sequence's sum is
    its own unpadded one's, whatever else shares its batch."""
    sequences = random_sequences(model.config.vocab_size, 9, seed=5)
    assert len({len(s) for s in sequences}) > 3  # padded rows in the batch
    got = teacher_throughput.plain_batch_logprobs(model, sequences, pad_id=1, device=torch.device("cpu"))
    want = [naive_logprob(model, s.prefix, s.target) for s in sequences]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_the_plain_loop_scores_each_pairs_two_terms_once_per_distinct_passage(model) -> None:
    vocab = model.config.vocab_size
    cond, uncond = random_sequences(vocab, 5, seed=6), random_sequences(vocab, 3, seed=7)
    work = teacher_throughput.TeacherSequences(["q"] * 5, [[]] * 5, [[]] * 3, [2, 0, 2, 1, 0], cond, uncond, 1)
    sequences, uncond_of = teacher_throughput.plain_sequences(work, 4)
    assert sequences == [*cond[:4], uncond[2], uncond[0], uncond[1]] and uncond_of == [4, 5, 4, 6]
    cpu = torch.device("cpu")
    phase, got_cond, got_uncond = teacher_throughput.run_plain(model, work, 4, 2, 1, cpu, False, show=False)
    assert (phase.pairs, phase.sequences, phase.tokens) == (4, 7, sum(map(len, sequences)))
    by_length = sorted(map(len, sequences), reverse=True)
    assert phase.padded_tokens == sum(2 * by_length[k] for k in range(0, 6, 2)) + by_length[6]
    np.testing.assert_allclose(got_cond, [naive_logprob(model, s.prefix, s.target) for s in cond[:4]], rtol=1e-5)
    want = [naive_logprob(model, uncond[d].prefix, uncond[d].target) for d in (2, 0, 2, 1)]
    np.testing.assert_allclose(got_uncond, want, rtol=1e-5)


def test_the_benchmark_times_the_plain_loop_and_reports_the_stage_over_it(
    tiny_llama: Path, sample_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "teacher.json"
    argv = ["--teacher", str(tiny_llama), "--input", str(sample_file), "--max-queries", "2", "--naive-pairs", "2"]
    argv += ["--plain-batch-size", "5", "--matmul-size", "64", "--matmul-reps", "1", "--device", "cpu"]
    assert teacher_throughput.main([*argv, "--progress", "false", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    plain, stage = result["plain"], result["teacher"]
    assert result["workload"]["plain_pairs"] == plain["pairs"] == stage["pairs"] == 24  # every pair by default
    assert plain["sequences"] == stage["sequences"] and plain["tokens"] == stage["tokens"]  # the same work
    assert result["speedup_over_plain_pairs_per_s"] == pytest.approx(stage["pairs_per_s"] / plain["pairs_per_s"])
    assert result["plain_agreement"]["ok"] and result["plain_agreement"]["pairs"] == 24
    assert result["targets"]["over_plain"] == 1.2
    assert teacher_throughput.main([*argv, "--plain-pairs", "0", "--progress", "false", "--out", str(out)]) == 0
    skipped = json.loads(out.read_text())
    assert skipped["plain"] is None and skipped["speedup_over_plain_pairs_per_s"] is None
