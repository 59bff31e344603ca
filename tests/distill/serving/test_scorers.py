"""The reranker's speed levers on the CPU: the GPU token budget, tokenisation overlapped with the previous
span's batches, TF32 for fp32, SDPA attention and torch.compile; each pinned to the plain path's scores, in input
order. And ``distill bench``'s methods with levers (``torch-fp16+overlap=50``), which the GPU suite times."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from distill.bench.methods import Variant, student_method, variant
from distill.cli import main
from distill.core.batching import token_budget_batches
from distill.core.devices import STUDENT_BATCH_TOKENS
from distill.core.schema import InputError
from distill.serving import reranker as reranker_module
from distill.serving.encoding import Batch
from distill.serving.reranker import Reranker
from distill.serving.scorers import TorchOptions, fp32_matmul_precision, load_scorer

TIGHT = {"rtol": 1e-5, "atol": 1e-6}
"""fp32 on the CPU, the same pairs in other batches (other padding, other matmul shapes): rounding only."""


@pytest.fixture(scope="module")
def student(spread_bert: Path) -> Path:
    return spread_bert


def assert_distinct(scores) -> None:
    """Neighbouring scores differ by far more than :data:`TIGHT`: a shifted or swapped score would fail it."""
    scores = np.asarray(scores)
    tolerance = TIGHT["atol"] + TIGHT["rtol"] * np.abs(scores).max()
    assert np.median(np.abs(scores - np.roll(scores, 1))) > 10 * tolerance


class Recorder:
    """Passes each batch to the scorer it wraps, and records the batch's shape."""

    def __init__(self, scorer) -> None:
        self.scorer, self.input_names, self.shapes = scorer, scorer.input_names, []

    def __call__(self, batch: Batch) -> np.ndarray:
        self.shapes.append(batch["input_ids"].shape)
        return self.scorer(batch)


def test_the_gpu_budget_takes_a_querys_100_candidates_in_one_batch(student: Path, call) -> None:
    """On CUDA the default budget holds 100 pairs of 256 tokens; the CPU's splits them into batches within it."""
    query, passages = call
    assert len(passages) == 100 and token_budget_batches([256] * 100, STUDENT_BATCH_TOKENS["cuda"]) == [
        list(range(100))
    ]
    cpu = Reranker.load(student, backend="torch", max_length=256)
    assert cpu.max_batch_tokens == STUDENT_BATCH_TOKENS["cpu"]
    gpu = Reranker.load(student, backend="torch", max_length=256, max_batch_tokens=STUDENT_BATCH_TOKENS["cuda"])
    cpu.scorer, gpu.scorer = Recorder(cpu.scorer), Recorder(gpu.scorer)
    one, many = gpu.score(query, passages), cpu.score(query, passages)
    ((rows, width),) = gpu.scorer.shapes
    assert rows == 100 and width <= 256
    assert len(cpu.scorer.shapes) > 1 and all(rows * width <= 1024 for rows, width in cpu.scorer.shapes)
    assert sum(rows for rows, _ in cpu.scorer.shapes) == 100
    np.testing.assert_allclose(one, many, **TIGHT)
    assert_distinct(one)


# ----------------------------------------------------------------------------- tokenisation overlapped


@pytest.mark.parametrize("overlap", [7, 32, 100, 250])
def test_overlapped_tokenisation_gives_the_sequential_scores_in_input_order(student: Path, call, overlap: int) -> None:
    query, passages = call
    passages = [*passages, "horn " * 600]  # one pair cut to max_length
    sequential = Reranker.load(student, backend="torch")
    want = np.asarray(sequential.score(query, passages))
    overlapped = Reranker.load(student, backend="torch", overlap=overlap)
    overlapped.scorer = Recorder(overlapped.scorer)
    np.testing.assert_allclose(overlapped.score(query, passages), want, **TIGHT)
    assert overlapped.truncated == sequential.truncated == 1
    assert all(rows * width <= 1024 for rows, width in overlapped.scorer.shapes)
    assert overlapped.settings["overlap"] == overlap
    shuffled = np.random.default_rng(overlap).permutation(len(passages))
    np.testing.assert_allclose(overlapped.score(query, [passages[i] for i in shuffled]), want[shuffled], **TIGHT)
    assert_distinct(want)


def test_overlap_keeps_the_batches_and_the_scores_where_the_spans_are_whole_batches(student: Path, call) -> None:
    """Pairs of one length (every passage cut at 24 tokens) go 8 to a batch in input order, spans of 16 hold whole
    batches: the overlapped path runs the sequential path's batches, and its scores are the same numbers."""
    query, passages = call
    sequential = Reranker.load(student, backend="torch", max_length=24, max_batch_tokens=8 * 24)
    overlapped = Reranker.load(student, backend="torch", max_length=24, max_batch_tokens=8 * 24, overlap=16)
    sequential.scorer, overlapped.scorer = Recorder(sequential.scorer), Recorder(overlapped.scorer)
    want = sequential.score(query, passages)
    assert overlapped.score(query, passages) == want
    assert overlapped.scorer.shapes == sequential.scorer.shapes and set(sequential.scorer.shapes) >= {(8, 24)}
    assert_distinct(want)


def test_the_next_span_is_tokenised_on_another_thread_while_the_current_one_scores(
    student: Path, call, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first batch waits until the second span's encoding has begun: a sequential path would encode it only
    after every batch of the first span, and the wait would time out."""
    query, passages = call
    encoders, second_span = [], threading.Event()
    encode = reranker_module.encode_pairs

    def recorded_encode(*args, **kwargs):
        encoders.append(threading.get_ident())
        if len(encoders) == 2:
            second_span.set()
        return encode(*args, **kwargs)

    monkeypatch.setattr(reranker_module, "encode_pairs", recorded_encode)
    reranker = Reranker.load(student, backend="torch", overlap=25)
    scorer, waits = reranker.scorer, []

    def waiting_scorer(batch: Batch) -> np.ndarray:
        if not waits:
            waits.append(second_span.wait(timeout=30))
        return scorer(batch)

    waiting_scorer.input_names = scorer.input_names
    reranker.scorer = waiting_scorer
    got = reranker.score(query, passages)
    assert waits == [True] and len(encoders) == 4
    assert len(set(encoders)) == 1 and threading.get_ident() not in encoders  # one worker, not this thread
    np.testing.assert_allclose(got, Reranker.load(student, backend="torch").score(query, passages), **TIGHT)


def test_a_failure_while_tokenising_ahead_reaches_the_caller(student: Path, call, monkeypatch) -> None:
    query, passages = call
    encode, calls = reranker_module.encode_pairs, []

    def failing_encode(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("tokenizer failed on span 3")
        return encode(*args, **kwargs)

    monkeypatch.setattr(reranker_module, "encode_pairs", failing_encode)
    with pytest.raises(RuntimeError, match="span 3"):
        Reranker.load(student, backend="torch", overlap=30).score(query, passages)
    with pytest.raises(InputError, match="overlap"):
        Reranker.load(student, backend="torch", overlap=-1)


# ----------------------------------------------------------------------------- the torch backend's levers


def cuda_tf32() -> bool:
    """Whether CUDA's fp32 matmuls run in TF32 now."""
    matmul = torch.backends.cuda.matmul
    return matmul.fp32_precision == "tf32" if hasattr(matmul, "fp32_precision") else matmul.allow_tf32


def test_tf32_is_on_during_each_forward_only_and_recorded(student: Path, call) -> None:
    query, passages = call
    before = cuda_tf32()
    assert not before
    tf32 = Reranker.load(student, backend="torch", tf32=True)
    seen = []
    tf32.scorer.model.register_forward_pre_hook(lambda module, args: seen.append(cuda_tf32()))
    got = tf32.score(query, passages[:20])
    assert seen and all(seen) and cuda_tf32() == before
    plain = Reranker.load(student, backend="torch")
    assert tf32.settings["tf32"] is True and plain.settings["tf32"] is False
    assert got == plain.score(query, passages[:20])  # the CPU's matmuls ignore it
    with pytest.raises(InputError, match="tf32 applies to float32"):
        Reranker.load(student, backend="torch", dtype="bfloat16", tf32=True)
    with pytest.raises(ZeroDivisionError), fp32_matmul_precision(True):
        assert cuda_tf32()
        _ = 1 / 0
    assert cuda_tf32() == before


def test_the_torch_backend_loads_sdpa_attention_where_the_model_has_it(
    student: Path, call, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import BertForSequenceClassification

    query, passages = call
    sdpa = Reranker.load(student, backend="torch")
    assert sdpa.settings["attention"] == "sdpa" == sdpa.scorer.model.config._attn_implementation
    assert sdpa.settings["cudnn_attention"] is False
    monkeypatch.setattr(BertForSequenceClassification, "_supports_sdpa", False)
    eager = Reranker.load(student, backend="torch")
    assert eager.settings["attention"] == "eager"
    np.testing.assert_allclose(eager.score(query, passages), sdpa.score(query, passages), **TIGHT)


def test_compile_compiles_the_model_in_place_and_keeps_its_scores(
    student: Path, call, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wiring and equality: the eager backend stands in for inductor, whose CPU compile takes a minute."""
    from torch._dynamo.utils import counters

    query, passages = call
    compiled, original = [], torch.nn.Module.compile

    def eager_compile(self, *args, **kwargs):
        compiled.append(self)
        return original(self, *args, **{**kwargs, "backend": "eager"})

    monkeypatch.setattr(torch.nn.Module, "compile", eager_compile)
    reranker = Reranker.load(student, backend="torch", max_batch_tokens=2048, compile=True)
    assert compiled == [reranker.scorer.model] and reranker.settings["compile"] is True
    torch._dynamo.reset()
    counters.clear()
    try:
        got = reranker.score(query, passages[:40])
        graphs = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert graphs >= 1  # the forward ran through dynamo
    plain = Reranker.load(student, backend="torch", max_batch_tokens=2048)
    np.testing.assert_allclose(got, plain.score(query, passages[:40]), **TIGHT)


def test_the_torch_levers_are_refused_on_the_other_backends(student: Path) -> None:
    with pytest.raises(InputError, match="compile: options of the torch backend, not of onnx"):
        load_scorer(student, "onnx", options=TorchOptions(compile=True))
    with pytest.raises(InputError, match="tf32, cudnn_attention"):
        load_scorer(student, "torchscript", options=TorchOptions(tf32=True, cudnn_attention=True))


# ----------------------------------------------------------------------------- distill bench


def test_bench_method_names_carry_the_levers_by_their_options_field_names() -> None:
    options = TorchOptions(compile=True)
    assert variant("torch-fp16+overlap=50+compile", "cuda") == Variant("torch-fp16", 50, options, "+overlap=50+compile")
    assert variant("torch-fp32+tf32", "cuda:1").options == TorchOptions(tf32=True)
    assert variant("torch-bf16+cudnn_attention", "cuda").options == TorchOptions(cudnn_attention=True)
    assert variant("torch-fp16+unpad=false", "cuda").options == TorchOptions(unpad=False)
    assert variant("torch-fp16+cuda_graphs=False", "cuda").options == TorchOptions(cuda_graphs=False)
    assert variant("torch-fp32+unpad+cuda_graphs=true", "cuda").options == TorchOptions(unpad=True, cuda_graphs=True)
    assert variant("onnx-int8+overlap=8") == Variant("onnx-int8", 8, None, "+overlap=8")
    assert variant("auto+overlap=4").overlap == 4 and variant("torch-fp32") == Variant("torch-fp32")
    # every lever of the torch backends is a TorchOptions field, under its own name
    for name in (f.name for f in dataclasses.fields(TorchOptions)):
        assert variant(f"torch-fp32+{name}=false", "cuda").options == TorchOptions(**{name: False})
    for name, device, message in (
        ("torch-fp32+tf32", "cpu", "give it torch-fp32 on a GPU"),
        ("torch-fp16+tf32", "cuda", "give it torch-fp32 on a GPU"),
        ("onnx-fp32+compile", "cpu", "levers of the torch backends"),
        ("auto+compile", "cuda", "levers of the torch backends"),
        ("onnx-fp16+unpad=false", "cuda", "levers of the torch backends"),
        ("torch-fp32+overlap=0", "cpu", "overlap takes a number of pairs"),
        ("torch-fp32+overlap", "cpu", "overlap takes a number of pairs"),
        ("torch-fp32+unpad=maybe", "cpu", "unpad is true or false, got 'maybe'"),
        ("torch-fp32+padded", "cpu", "unknown lever 'padded'"),
        ("torch-fp32+overlap50", "cpu", "unknown lever 'overlap50'"),
        ("st-crossencoder+overlap=8", "cpu", "go after a student backend"),
    ):
        with pytest.raises(InputError, match=message):
            variant(name, device)


def test_a_bench_method_with_a_lever_scores_as_the_plain_one_and_records_it(student: Path, call) -> None:
    query, passages = call
    plain = student_method(student, "torch-fp32", "cpu", None, None)
    overlapped = student_method(student, "torch-fp32+overlap=16", "cpu", None, None)
    assert overlapped.name == "student torch-fp32+overlap=16" and overlapped.settings["overlap"] == 16
    assert plain.settings["overlap"] == 0 and plain.settings["attention"] == "sdpa"
    np.testing.assert_allclose(overlapped.score(query, passages), plain.score(query, passages), **TIGHT)


def test_distill_bench_times_each_lever_as_its_own_method(tiny_bert: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench"
    argv = ["bench", "--random_weights", "true", "--student", str(tiny_bert), "--teacher", "none", "--quality", "false"]
    argv += ["--token_counts", "[]", "--rerank_queries", "1", "--repeats", "1", "--matmul_size", "64"]
    argv += ["--device", "cpu", "--output", str(out), "--backends", "torch-fp32,torch-fp32+overlap=30"]
    assert main(argv) == 0
    result = json.loads((out / "bench.json").read_text())
    methods = ["student torch-fp32", "student torch-fp32+overlap=30"]
    assert [(c["method"], c["workload"]) for c in result["cells"]] == [(m, "100 candidates") for m in methods]
    assert [result["settings"][m]["overlap"] for m in methods] == [0, 30]
    assert main([*argv[:-1], "torch-fp32+tf32"]) == 2
    assert "tf32 computes CUDA's fp32 matmuls in TF32" in capsys.readouterr().err


# ----------------------------------------------------------------------------- distill rerank


def test_distill_rerank_takes_the_levers_and_writes_the_plain_run(
    student: Path, sample_file: Path, tmp_path: Path, capsys
) -> None:
    from distill.eval.trec_runs import read_trec_run

    args = ["rerank", "--model", str(student), "--backend", "torch", "--input", str(sample_file)]
    assert main([*args, "--output", str(tmp_path / "plain.trec")]) == 0
    assert main([*args, "--output", str(tmp_path / "levers.trec"), "--overlap", "5", "--tf32"]) == 0
    plain, levers = read_trec_run(tmp_path / "plain.trec"), read_trec_run(tmp_path / "levers.trec")
    assert plain.keys() == levers.keys() and all(len(docs) == 12 for docs in plain.values())
    for qid, docs in plain.items():
        assert docs.keys() == levers[qid].keys()
        np.testing.assert_allclose([levers[qid][d] for d in docs], list(docs.values()), rtol=1e-4, atol=1e-5)
    capsys.readouterr()
    onnx = ["rerank", "--model", str(student), "--backend", "onnx", "--input", str(sample_file), "--compile"]
    assert main([*onnx, "--output", str(tmp_path / "onnx.trec")]) == 2
    error = capsys.readouterr().err.strip()
    assert "compile: options of the torch backend, not of onnx" in error and len(error.splitlines()) == 1
    assert main([*args, "--output", str(tmp_path / "bad.trec"), "--overlap", "-1"]) == 2
    assert "overlap is a number of pairs" in capsys.readouterr().err


def test_distill_rerank_takes_a_beir_folder_with_its_run(student: Path, tmp_path: Path) -> None:
    """As teach does: a BEIR folder's candidates from ``--run`` (without one, its judged pairs)."""
    import json

    from distill.eval.trec_runs import read_trec_run

    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    passages = {"d1": "the flea lives for months", "d2": "fleas lay eggs", "d3": "a cat sleeps"}
    corpus = "".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n" for d, t in passages.items())
    (beir / "corpus.jsonl").write_text(corpus)
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "flea life cycle"}) + "\n")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    (tmp_path / "bm25.trec").write_text("".join(f"q1 Q0 {d} {i} {9 - i}.0 bm25\n" for i, d in enumerate(passages, 1)))
    args = ["rerank", "--model", str(student), "--backend", "torch", "--input", str(beir)]
    assert main([*args, "--run", str(tmp_path / "bm25.trec"), "--output", str(tmp_path / "run.trec")]) == 0
    assert read_trec_run(tmp_path / "run.trec")["q1"].keys() == passages.keys()
    assert main([*args, "--output", str(tmp_path / "judged.trec")]) == 0
    assert read_trec_run(tmp_path / "judged.trec")["q1"].keys() == {"d1"}
