"""The unpadded encoder (a lever for reranking near the FLOP floor): the layers see only the real tokens, and
the scores are the padded model's, for the [CLS] head and the segment-cosine head, on either padding side, through
the SDPA path that runs here and through the variable-length kernel's contract that runs on a GPU."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DistilBertConfig, DistilBertModel

import distill.model.segment_cosine  # noqa: F401  (registers the segment-cosine head)
from distill.cli import main
from distill.core.devices import STUDENT_BATCH_TOKENS
from distill.core.schema import InputError
from distill.model import unpadding
from distill.model.segment_cosine import BertForSegmentCosine, BertSegmentCosineConfig
from distill.model.unpadding import ATTENTION, PackedEncoder, Unpadder, packed_inputs, packing
from distill.serving.encoding import Encoded, encode_pairs, pad_batch
from distill.serving.reranker import Reranker
from distill.serving.scorers import TorchOptions

CPU = torch.device("cpu")
TIGHT = {"rtol": 1e-5, "atol": 1e-6}
"""fp32 on the CPU, the same pairs in other matmul shapes: rounding only."""


@pytest.fixture(scope="module")
def segment_cosine(tiny_bert: Path) -> torch.nn.Module:
    config = BertSegmentCosineConfig.from_pretrained(tiny_bert)
    torch.manual_seed(1)
    return BertForSegmentCosine(config).eval()


def batch_of(tokenizer, query: str, passages: list[str], side: str = "right") -> dict[str, np.ndarray]:
    tokenizer.padding_side = side
    features = encode_pairs(tokenizer, [query] * len(passages), passages, 128).features
    return pad_batch(tokenizer, features)


def scores(model: torch.nn.Module, batch: dict[str, np.ndarray]) -> np.ndarray:
    with torch.inference_mode():
        return model(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits[:, 0].numpy()


def test_packing_finds_the_real_tokens_on_either_padding_side() -> None:
    right = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    left = right[:, ::-1]
    for mask, indices in ((right, [0, 1, 2, 4, 8, 9, 10, 11]), (left, [1, 2, 3, 7, 8, 9, 10, 11])):
        packed = packing(mask, torch.device("cpu"))
        assert packed.indices.tolist() == indices and packed.indices.dtype == torch.int64
        assert packed.cu_seqlens.tolist() == [0, 3, 4, 8] and packed.cu_seqlens.dtype == torch.int32
        assert packed.max_length == 4 and packed.shape == (3, 4)
        assert packed.key_mask.shape == (3, 1, 1, 4) and packed.key_mask.sum().item() == 8


@pytest.mark.parametrize("left", [False, True])
def test_the_packing_of_a_batch_comes_from_its_rows_lengths_as_from_its_mask(left: bool) -> None:
    lengths = np.array([3, 1, 4, 0, 7, 2])
    columns = np.arange(7)
    mask = columns >= 7 - lengths[:, None] if left else columns < lengths[:, None]
    ours, theirs = unpadding.lengths_packing(lengths, 7, left), unpadding.host_packing(mask.astype(np.int64))
    assert ours.keys() == theirs.keys() and ours["max_length"] == theirs["max_length"] == 7
    for name in ("indices", "cu_seqlens"):
        assert ours[name].dtype == theirs[name].dtype and torch.equal(ours[name], theirs[name]), name
    empty = unpadding.lengths_packing(np.zeros(0, np.int64), 5)
    assert empty["indices"].numel() == 0 and empty["cu_seqlens"].tolist() == [0] and empty["max_length"] == 0


@pytest.mark.parametrize("side", ["right", "left"])
def test_the_reranker_packs_its_batches_without_padding_them_and_scores_as_the_padded_model(
    spread_bert: Path, call, side: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unpadded reranker hands its scorer packed batches (the pairs back to back, gathered from the flat ids) and
    builds no padded array; its scores are the right-padded model's whatever the tokenizer's padding side (positions
    count from 0 in every pair), in several batches (the CPU budget). The scorer takes a padded batch too, on either
    side, and scores its real tokens the same."""
    query, passages = call
    plain = Reranker.load(spread_bert, backend="torch").score(query, passages)
    unpadded = Reranker.load(spread_bert, backend="torch", unpad=True)
    tokenizer = unpadded.tokenizer
    encoded = encode_pairs(tokenizer, [query] * 30, passages[:30], 512)
    tokenizer.padding_side = side
    try:
        padded = encoded.batch(tokenizer)
        with monkeypatch.context() as patch:
            patch.setattr(Encoded, "batch", lambda *args, **kwargs: pytest.fail("a padded batch was built"))
            got = unpadded.score(query, passages)
    finally:
        tokenizer.padding_side = "right"
    assert unpadded.scorer.takes_packed and not Reranker.load(spread_bert, backend="torch").scorer.takes_packed
    np.testing.assert_allclose(got, plain, **TIGHT)
    assert np.median(np.abs(np.diff(plain))) > 100 * TIGHT["atol"]  # a score in another pair's place would fail
    for batch in (padded, dict(padded)):  # a Padded batch reads its lengths, a plain dict its mask
        np.testing.assert_allclose(unpadded.scorer(batch), plain[:30], **TIGHT)


@pytest.mark.parametrize(
    ("head", "side"),
    # left padding puts a pad where the [CLS] head reads, padded or not: only the segment means take it
    [("cls", "right"), ("segment-cosine", "right"), ("segment-cosine", "left")],
)
def test_the_layers_see_only_real_tokens_and_score_as_the_padded_model(
    spread_bert: Path, segment_cosine: torch.nn.Module, call, side: str, head: str
) -> None:
    query, passages = call
    tokenizer = AutoTokenizer.from_pretrained(spread_bert)
    batch = batch_of(tokenizer, query, passages[:30], side)
    model = AutoModelForSequenceClassification.from_pretrained(spread_bert).eval() if head == "cls" else segment_cosine
    padded = scores(model, batch)
    unpadded_model = copy.deepcopy(model)  # its own config, too: unpadding changes the attention it names
    unpadder = Unpadder(unpadded_model)
    rows = []
    layers = unpadded_model.base_model.encoder.layer
    for layer in layers:
        layer.intermediate.dense.register_forward_hook(lambda module, args, out: rows.append(tuple(args[0].shape)))
    with unpadder.batch(packing(batch["attention_mask"], CPU)):
        got = scores(unpadded_model, batch)
    real = int(batch["attention_mask"].sum())
    assert real < 0.9 * batch["input_ids"].size  # the batch carries padding to save
    assert rows == [(1, real, model.config.hidden_size)] * len(layers)
    assert unpadded_model.config._attn_implementation == ATTENTION
    np.testing.assert_allclose(got, padded, **TIGHT)
    assert np.median(np.abs(np.diff(padded))) > 100 * TIGHT["atol"]  # a score in another pair's place would fail


def reference_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None):
    """torch's ``varlen_attn`` contract, computed one sequence at a time: ``[N, heads, d]`` in and out, each
    sequence's tokens attending to its own only, its bounds in ``cu_seq_q`` (equal to ``cu_seq_k`` here), ``max_q``
    at least its longest."""
    assert torch.equal(cu_seq_q, cu_seq_k) and cu_seq_q.dtype == torch.int32 and max_q == max_k
    bounds = cu_seq_q.tolist()
    assert max_q >= max(b - a for a, b in itertools.pairwise(bounds))
    out = torch.empty_like(query)
    for a, b in itertools.pairwise(bounds):
        q, k, v = (t[a:b].transpose(0, 1) for t in (query, key, value))  # [heads, n, d]
        out[a:b] = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale).transpose(0, 1)
    return out


def test_the_variable_length_kernel_path_keeps_the_scores(
    spread_bert: Path, call, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU in fp16/bf16 attention goes to torch's ``varlen_attn``; here a per-sequence reference of its
    contract stands in, to pin the arguments and the layout the model hands it."""
    query, passages = call
    tokenizer = AutoTokenizer.from_pretrained(spread_bert)
    batch = batch_of(tokenizer, query, passages[:20])
    model = AutoModelForSequenceClassification.from_pretrained(spread_bert).eval()
    padded = scores(model, batch)
    calls = []

    def kernel(query: torch.Tensor):
        calls.append(query.shape)
        return reference_varlen_attn

    monkeypatch.setattr(unpadding, "varlen_kernel", kernel)
    unpadder = Unpadder(model)
    with unpadder.batch(packing(batch["attention_mask"], CPU)):
        got = scores(model, batch)
    assert calls == [(1, model.config.num_attention_heads, int(batch["attention_mask"].sum()), 8)] * 2
    assert unpadder.kernel_name() == "varlen_attn"
    np.testing.assert_allclose(got, padded, **TIGHT)


@pytest.mark.parametrize("head", ["cls", "segment-cosine"])
def test_the_packed_encoder_reads_the_pairs_back_to_back_and_scores_as_the_padded_model(
    spread_bert: Path, segment_cosine: torch.nn.Module, call, head: str
) -> None:
    """The embeddings and every layer see the pairs' real tokens only, one packed row of them, and the heads read
    each pair's [CLS] or segment means from it: the right-padded model's scores, with no padded tensor in or out."""
    query, passages = call
    tokenizer = AutoTokenizer.from_pretrained(spread_bert)
    encoded = encode_pairs(tokenizer, [query] * 30, passages[:30], 128)
    model = AutoModelForSequenceClassification.from_pretrained(spread_bert).eval() if head == "cls" else segment_cosine
    padded = scores(model, encoded.batch(tokenizer))
    packed_model = PackedEncoder(copy.deepcopy(model))
    rows = []
    inner = packed_model.model.base_model
    inner.embeddings.register_forward_hook(lambda module, args, out: rows.append(tuple(out.shape)))
    for layer in inner.encoder.layer:
        layer.intermediate.dense.register_forward_hook(lambda module, args, out: rows.append(tuple(args[0].shape)))
    packed = encoded.pack()
    with torch.inference_mode():
        got = packed_model(*packed_inputs(packed.input_ids, packed.token_type_ids, packed.lengths)).numpy()
    real = int(packed.lengths.sum())
    assert real < 0.9 * 30 * packed.lengths.max()  # a padded batch would carry padding
    assert rows == [(1, real, model.config.hidden_size)] * (1 + len(inner.encoder.layer))
    assert got.dtype == np.float32 and got.shape == (30,)
    np.testing.assert_allclose(got, padded, **TIGHT)
    assert np.median(np.abs(np.diff(padded))) > 100 * TIGHT["atol"]


def test_the_packed_encoder_hands_the_variable_length_kernel_its_width_as_the_longest_pair(
    spread_bert: Path, call, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU the packed encoder's attention is torch's ``varlen_attn``, its longest sequence the width it is
    given (a CUDA graph's static width, longer than the batch's pairs): the reference of its contract keeps the
    scores."""
    query, passages = call
    tokenizer = AutoTokenizer.from_pretrained(spread_bert)
    encoded = encode_pairs(tokenizer, [query] * 20, passages[:20], 128)
    model = AutoModelForSequenceClassification.from_pretrained(spread_bert).eval()
    padded = scores(model, encoded.batch(tokenizer))
    widths = []

    def kernel(query: torch.Tensor):
        def recorded(*args, **kwargs):
            widths.append(args[5])
            return reference_varlen_attn(*args, **kwargs)

        return recorded

    monkeypatch.setattr(unpadding, "varlen_kernel", kernel)
    packed = encoded.pack()
    with torch.inference_mode():
        got = PackedEncoder(model)(*packed_inputs(packed.input_ids, packed.token_type_ids, packed.lengths, 256))
    assert widths == [256] * model.config.num_hidden_layers and packed.lengths.max() <= 128
    np.testing.assert_allclose(got.numpy(), padded, **TIGHT)


def test_varlen_is_chosen_only_on_cuda_in_half_precision() -> None:
    assert unpadding.varlen_kernel(torch.zeros(1, dtype=torch.float16)) is None  # a CPU tensor
    assert unpadding.varlen_kernel(torch.zeros(1)) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU suite runs it)")
def test_varlen_is_chosen_on_cuda_in_half_precision() -> None:
    """On a GPU, fp16 and bf16 take flash variable-length attention; a silent fallback to SDPA would fail here."""
    varlen_attn = pytest.importorskip("torch.nn.attention.varlen", reason="torch before 2.9").varlen_attn
    for dtype in unpadding.VARLEN_DTYPES:
        assert unpadding.varlen_kernel(torch.zeros(1, dtype=dtype, device="cuda")) is varlen_attn, dtype
    assert unpadding.varlen_kernel(torch.zeros(1, device="cuda")) is None  # fp32


def test_the_reranker_unpads_a_querys_candidates_in_one_gpu_sized_batch(spread_bert: Path, call) -> None:
    query, passages = call
    budget = STUDENT_BATCH_TOKENS["cuda"]  # one batch of 100 pairs padded to the longest: the padding unpad saves
    plain = Reranker.load(spread_bert, backend="torch", max_batch_tokens=budget)
    unpadded = Reranker.load(spread_bert, backend="torch", max_batch_tokens=budget, unpad=True)
    np.testing.assert_allclose(unpadded.score(query, passages), plain.score(query, passages), **TIGHT)
    assert unpadded.settings["unpad"] is True and plain.settings["unpad"] is False
    assert unpadded.settings["attention"] == f"{ATTENTION} (sdpa (re-padded))"


def test_unpad_refuses_an_encoder_whose_attention_it_cannot_take_over() -> None:
    config = DistilBertConfig(vocab_size=50, dim=32, n_layers=1, n_heads=4, hidden_dim=64)
    with pytest.raises(InputError, match=r"unpad: runs BERT encoders .*not 'distilbert'"):
        Unpadder(DistilBertModel(config))


def test_an_unpadded_model_outside_a_batch_context_is_a_bug_not_a_wrong_score(spread_bert: Path) -> None:
    model = AutoModelForSequenceClassification.from_pretrained(spread_bert).eval()
    Unpadder(model)
    ids = torch.tensor([[101, 2054, 102]])
    with pytest.raises(RuntimeError, match=r"inside Unpadder\.batch"):
        model(input_ids=ids, attention_mask=torch.ones_like(ids))


def test_distill_rerank_and_bench_take_unpad(spread_bert: Path, sample_file: Path, tmp_path: Path, capsys) -> None:
    from distill.bench.methods import variant
    from distill.eval.trec_runs import read_trec_run

    args = ["rerank", "--model", str(spread_bert), "--backend", "torch", "--input", str(sample_file)]
    assert main([*args, "--output", str(tmp_path / "plain.trec")]) == 0
    assert main([*args, "--output", str(tmp_path / "unpad.trec"), "--unpad"]) == 0
    plain, unpadded = read_trec_run(tmp_path / "plain.trec"), read_trec_run(tmp_path / "unpad.trec")
    assert plain.keys() == unpadded.keys()
    for qid, docs in plain.items():
        np.testing.assert_allclose([unpadded[qid][d] for d in docs], list(docs.values()), rtol=1e-4, atol=1e-5)
    assert variant("torch-fp16+unpad+overlap=50", "cuda").options == TorchOptions(unpad=True)
    with pytest.raises(InputError, match="levers of the torch backends"):
        variant("onnx-fp32+unpad")


def test_where_gradients_flow_attention_takes_the_sdpa_path_even_where_varlen_runs(
    spread_bert: Path, call, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training goes through SDPA, which has a backward on every torch; inference through the variable-length
    kernel, which the settings then name although the weights require gradients."""
    query, passages = call
    batch = batch_of(AutoTokenizer.from_pretrained(spread_bert), query, passages[:8])

    def no_backward(*args, **kwargs):
        raise AssertionError("the variable-length kernel ran where gradients flow")

    monkeypatch.setattr(unpadding, "varlen_kernel", lambda query: no_backward)
    model = AutoModelForSequenceClassification.from_pretrained(spread_bert)
    unpadder = Unpadder(model)
    assert unpadder.kernel_name() == "varlen_attn" and next(model.parameters()).requires_grad
    inputs = {k: torch.from_numpy(v) for k, v in batch.items()}
    with unpadder.batch(packing(batch["attention_mask"], CPU)):
        model(**inputs).logits.sum().backward()
    assert model.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
