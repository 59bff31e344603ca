"""CUDA graphs of the unpadded encoder: the bucketing that gives a packed batch its static shape, the dummy
and empty pairs that fill it and whose scores are dropped, run here on the CPU against the unbucketed and the padded
scores; the device defaults (unpad and graphs on CUDA, neither on a CPU); and, where there is a GPU, the capture and
the replay."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from distill.cli import main
from distill.core.devices import RERANKER_LEVERS, STUDENT_BATCH_TOKENS
from distill.core.schema import InputError
from distill.export.parity import SCORE_BOUNDS
from distill.model.segment_cosine import BertForSegmentCosine, BertSegmentCosineConfig
from distill.model.unpadding import PackedEncoder, packed_inputs
from distill.serving import cuda_graphs
from distill.serving.cuda_graphs import CudaGraphs, Shape, pad_to, static_shape, token_bucket, warm_shapes
from distill.serving.encoding import Packed, encode_pairs
from distill.serving.reranker import Reranker
from distill.serving.scorers import TorchOptions, changed_levers

TIGHT = {"rtol": 1e-5, "atol": 1e-6}
"""fp32 on the CPU, the same pairs in other matmul shapes: rounding only."""


def test_token_buckets_are_few_and_cost_at_most_a_fifth_more_tokens() -> None:
    sizes = np.array([token_bucket(n) for n in range(1, 32769)])
    assert (np.diff(sizes) >= 0).all() and (sizes % cuda_graphs.TOKEN_MULTIPLE == 0).all()
    assert len(set(sizes.tolist())) == 25 and sizes[0] == cuda_graphs.MIN_TOKENS and sizes[-1] == 32768
    tokens = np.arange(1, 32769)
    assert (sizes >= tokens).all()
    over = sizes[511:] / tokens[511:]  # from the smallest bucket on
    assert over.max() <= 2**0.25 + cuda_graphs.TOKEN_MULTIPLE / 512
    assert token_bucket(40000) == 46400  # no ceiling: a larger budget gets larger buckets (32768 · 2 ** 0.5)


def test_a_batch_is_padded_to_its_static_shape_with_dummy_then_empty_pairs() -> None:
    lengths = np.array([100, 37, 5, 90, 12], np.int64)
    rng = np.random.default_rng(0)
    packed = Packed(rng.integers(1000, 2000, lengths.sum()), rng.integers(0, 2, lengths.sum()), lengths)
    shape = static_shape(lengths, 512)
    assert shape == Shape(tokens=512, pairs=8, width=128)  # 244 tokens; 268 more in 3 dummies of at most 128
    padded = pad_to(packed, shape, pad_id=0)
    assert padded.lengths.tolist() == [*lengths, 128, 128, 12]
    assert pad_to(packed, Shape(512, 16, 128), 0).lengths.tolist() == [*lengths, 128, 128, 12, *[0] * 8]
    assert len(padded.input_ids) == len(padded.token_type_ids) == padded.lengths.sum() == 512
    np.testing.assert_array_equal(padded.input_ids[:244], packed.input_ids)
    np.testing.assert_array_equal(padded.token_type_ids[:244], packed.token_type_ids)
    assert (padded.input_ids[244:] == 0).all() and (padded.token_type_ids[244:] == 0).all()
    # Widths are multiples of 64 up to the model's longest sequence; pair slots powers of two.
    assert static_shape(np.array([500, 3]), 500) == Shape(512, 8, 500)
    assert static_shape(np.full(100, 80), 512) == Shape(8192, 128, 128)
    assert static_shape(np.full(129, 64), 512).pairs == 256
    exact = static_shape(np.full(8, 64), 512)
    assert exact == Shape(512, 8, 64) and pad_to(Packed(*np.zeros((2, 512), np.int64), np.full(8, 64)), exact, 0)
    for bad in (np.array([513]), np.zeros(0, np.int64)):
        with pytest.raises(ValueError, match="a static shape holds"):
            static_shape(bad, 512)
    with pytest.raises(ValueError, match="do not fit"):
        pad_to(packed, Shape(128, 8, 128), 0)


def test_with_the_width_fixed_every_batch_of_the_budget_takes_a_shape_warmed_ahead() -> None:
    """Where the variable-length kernel runs, the width is the model's longest sequence and the shapes of a budget's
    batches are few: each token bucket with 4 pair slot counts, which hold every batch whose pairs average at least
    8 tokens. Random batches of the GPU's default budget, of 1 pair to 4,096."""
    budget, longest = STUDENT_BATCH_TOKENS["cuda"], 512
    warmed = warm_shapes(budget, longest)
    assert len(warmed) == len(set(warmed)) == 25 * cuda_graphs.WARM_SLOTS and {s.width for s in warmed} == {longest}
    assert sorted({s.tokens for s in warmed}) == sorted({token_bucket(n) for n in range(1, budget + 1)})
    assert static_shape(np.array([100, 37, 5]), longest, fixed_width=True) == Shape(512, 8, 512)
    rng = np.random.default_rng(0)
    floor = cuda_graphs.PAIR_TOKENS // 2 ** (cuda_graphs.WARM_SLOTS - 1)
    for _ in range(3000):
        pairs = int(rng.integers(1, budget // floor + 1))
        total = int(rng.integers(pairs * floor, min(budget, pairs * longest) + 1))
        lengths = np.full(pairs, total // pairs)
        lengths[: total % pairs] += 1
        assert static_shape(lengths, longest, fixed_width=True) in warmed, (pairs, total)
    shorter = static_shape(np.full(600, 5), longest, fixed_width=True)  # 5 tokens a pair: captured on first use
    assert shorter not in warmed and shorter.pairs == 1024


@pytest.mark.parametrize("fixed_width", [False, True])
@pytest.mark.parametrize("head", ["cls", "segment-cosine"])
def test_a_bucketed_batch_scores_as_the_unbucketed_one_and_its_dummies_are_dropped(
    spread_bert: Path, tiny_bert: Path, call, head: str, fixed_width: bool
) -> None:
    """The packed encoder on a batch padded to its static shape gives, for the real pairs, the unbucketed batch's
    scores and the padded model's; the dummy and empty pairs are extra scores, after them. Batches of several sizes
    (several shapes), with the width bucketed or fixed at the longest sequence, on the CPU, eager: what a CUDA graph
    replays."""
    query, passages = call
    tokenizer = AutoTokenizer.from_pretrained(spread_bert)
    if head == "cls":
        model = AutoModelForSequenceClassification.from_pretrained(spread_bert).eval()
    else:
        torch.manual_seed(1)
        model = BertForSegmentCosine(BertSegmentCosineConfig.from_pretrained(tiny_bert)).eval()
    packed_model = PackedEncoder(copy.deepcopy(model))
    shapes = set()
    for count in (3, 17, 60):
        encoded = encode_pairs(tokenizer, [query] * count, passages[:count], 256)
        with torch.inference_mode():
            padded = model(**{k: torch.from_numpy(v) for k, v in encoded.batch(tokenizer).items()}).logits[:, 0]
            packed = encoded.pack()
            unbucketed = packed_model(*packed_inputs(packed.input_ids, packed.token_type_ids, packed.lengths))
            shape = static_shape(packed.lengths, model.config.max_position_embeddings, fixed_width)
            filled = pad_to(packed, shape, tokenizer.pad_token_id)
            bucketed = packed_model(
                *packed_inputs(filled.input_ids, filled.token_type_ids, filled.lengths, shape.width)
            )
        shapes.add(shape)
        assert bucketed.shape == (shape.pairs,) and shape.pairs > count and shape.tokens > packed.lengths.sum()
        np.testing.assert_allclose(bucketed[:count].numpy(), unbucketed.numpy(), **TIGHT)
        np.testing.assert_allclose(bucketed[:count].numpy(), padded.numpy(), **TIGHT)
        if count > 3:
            assert np.median(np.abs(np.diff(padded.numpy()))) > 100 * TIGHT["atol"]
    assert len(shapes) == 3


def test_unpad_and_cuda_graphs_are_the_defaults_on_cuda_only() -> None:
    """One place holds the defaults (RERANKER_LEVERS); a lever given overrides it; a model that cannot run unpadded
    keeps the padded path by default, and the graphs, which replay the unpadded encoder, follow unpad."""
    assert RERANKER_LEVERS == {
        "cpu": {"unpad": False, "cuda_graphs": False},
        "cuda": {"unpad": True, "cuda_graphs": True},
    }
    both = TorchOptions(unpad=True, cuda_graphs=True)
    assert TorchOptions().on("cuda:1") == both and TorchOptions(compile=True).on("cuda").cuda_graphs
    assert TorchOptions().on("cpu") == TorchOptions(unpad=False, cuda_graphs=False)
    assert TorchOptions().on("cuda", unpaddable=False) == TorchOptions(unpad=False, cuda_graphs=False)
    assert TorchOptions(unpad=False).on("cuda") == TorchOptions(unpad=False, cuda_graphs=False)
    assert TorchOptions(cuda_graphs=False).on("cuda") == TorchOptions(unpad=True, cuda_graphs=False)
    assert TorchOptions(unpad=True).on("cpu") == TorchOptions(unpad=True, cuda_graphs=False)
    # A lever is changed where it is given away from the device's default: only then does auto keep to torch.
    assert changed_levers(TorchOptions(unpad=True), "cuda") == [] and changed_levers(TorchOptions(), "cpu") == []
    assert changed_levers(TorchOptions(unpad=True), "cpu") == ["unpad"]
    assert changed_levers(TorchOptions(unpad=False, cuda_graphs=False), "cuda") == ["unpad", "cuda_graphs"]


def test_cuda_graphs_are_refused_off_cuda_and_without_unpad(
    spread_bert: Path, sample_file: Path, tmp_path: Path, capsys
) -> None:
    cpu = Reranker.load(spread_bert, backend="torch", device="cpu")
    assert (cpu.settings["unpad"], cpu.settings["cuda_graphs"]) == (False, False) and cpu.scorer.graphs is None
    with pytest.raises(InputError, match="CUDA graphs run on a CUDA device, not 'cpu'"):
        Reranker.load(spread_bert, backend="torch", device="cpu", unpad=True, cuda_graphs=True)
    with pytest.raises(ValueError, match="CUDA graphs run on a CUDA device"):
        CudaGraphs(cpu.scorer.packed, torch.device("cpu"), 512, 0)
    args = ["rerank", "--model", str(spread_bert), "--backend", "torch", "--device", "cpu", "--input", str(sample_file)]
    assert main([*args, "--output", str(tmp_path / "graphs.trec"), "--cuda_graphs"]) == 2
    assert "CUDA graphs run on a CUDA device" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs are captured on a GPU")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cuda_graphs_replay_the_eager_unpadded_scores(spread_bert: Path, call, dtype: str) -> None:
    """On CUDA the defaults are unpad and graphs: each new static shape is captured once, replays give the eager
    unpadded encoder's scores (fp32: to rounding; fp16: within its parity bound), and the padded path's within the
    dtype's parity bound."""
    query, passages = call
    budget = {"max_batch_tokens": 32768, "max_length": 256}  # a query's 100 candidates in one batch: one shape
    graphs = Reranker.load(spread_bert, backend="torch", device="cuda", dtype=dtype, **budget)
    eager = Reranker.load(spread_bert, backend="torch", device="cuda", dtype=dtype, cuda_graphs=False, **budget)
    padded = Reranker.load(spread_bert, backend="torch", device="cuda", dtype=dtype, unpad=False, **budget)
    assert graphs.settings["unpad"] and graphs.settings["cuda_graphs"] and not eager.settings["cuda_graphs"]
    first = np.asarray(graphs.score(query, passages))
    few = np.asarray(graphs.score(query, passages[:7]))
    assert len(graphs.scorer.graphs.graphs) == 2
    np.testing.assert_array_equal(graphs.score(query, passages), first)  # the same graph, replayed
    assert len(graphs.scorer.graphs.graphs) == 2
    bound = SCORE_BOUNDS["onnx"] if dtype == "float32" else SCORE_BOUNDS["onnx-fp16"]
    scale = max(1.0, float(np.abs(first).max()))  # spread_bert's scores reach about 10: fp16 rounds at 1e-2 there
    np.testing.assert_allclose(first, eager.score(query, passages), rtol=0, atol=bound * scale)
    np.testing.assert_allclose(few, eager.score(query, passages[:7]), rtol=0, atol=bound * scale)
    np.testing.assert_allclose(first, padded.score(query, passages), rtol=0, atol=bound * scale)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs are captured on a GPU")
def test_after_the_warm_up_no_request_waits_on_a_capture(spread_bert: Path, call) -> None:
    """In fp16 (the variable-length kernel) the server's warm-up captures every shape of its budget, so that
    requests of any size after it only replay."""
    query, passages = call
    reranker = Reranker.load(spread_bert, backend="torch", device="cuda", dtype="float16", max_batch_tokens=8192)
    graphs = reranker.scorer.graphs
    assert graphs.fixed_width and not graphs.graphs
    warmed = warm_shapes(8192, graphs.longest)
    reranker.warm_up()  # its batches of each width capture some of these shapes first, so its count is not theirs
    assert set(warmed) <= set(graphs.graphs)
    captured = len(graphs.graphs)
    for count in (1, 3, 10, 17, 64, 100):
        reranker.score(query, passages[:count])
    assert len(graphs.graphs) == captured


@pytest.mark.skipif(not torch.cuda.is_available(), reason="batches are launched ahead on a GPU")
@pytest.mark.parametrize("graphs", [True, False])
def test_batches_launched_ahead_on_cuda_keep_their_own_scores(spread_bert: Path, call, graphs: bool) -> None:
    """Three batches launched before any is waited for, the first two of one static shape (the same pairs in two
    orders: with graphs, one graph's buffers, replayed twice in a row): each gets the scores it gets alone, and the
    device's seconds."""
    query, passages = call
    reranker = Reranker.load(spread_bert, backend="torch", device="cuda", dtype="float16", cuda_graphs=graphs)
    encoded = encode_pairs(reranker.tokenizer, [query] * 30, passages[:30], 256)
    batches = [encoded.pack(rows) for rows in (np.arange(10), np.arange(10)[::-1], np.arange(10, 30))]
    if graphs:
        longest, fixed = reranker.scorer.graphs.longest, reranker.scorer.graphs.fixed_width
        shapes = [static_shape(batch.lengths, longest, fixed) for batch in batches]
        assert shapes[0] == shapes[1] != shapes[2]
    alone = [reranker.scorer(batch) for batch in batches]
    launched = [reranker.scorer.launch(batch) for batch in batches]
    results = [each.result() for each in launched]
    assert all(each.ready() for each in launched)
    for (scores, seconds), expected in zip(results, alone, strict=True):
        np.testing.assert_array_equal(scores, expected)
        assert scores.dtype == np.float32 and 0 < seconds < 10
