"""The student on a CPU: which ONNX graph, which onnxruntime session settings and which runtime (onnxruntime or
OpenVINO) rerank a DL19 query's 100 BM25 candidates fastest, and where the time goes.

Every figure is the p50 of end-to-end calls as ``distill bench`` makes them (``Reranker.score``: tokenisation, a
length-sorted batch loop under a token budget), over ``--repeats`` rounds of the first ``--queries`` DL19 queries
after one warm-up round (:func:`benchmarks.phases.time_calls`). Stages (``--stages``, all by default):

- ``variants``: each graph at the default settings: fp32 from the dynamo exporter (the export before this one),
  with onnxscript's fusions, from the TorchScript exporter, fused by onnxruntime's transformer optimiser, and fused
  with the last layer's tail on [CLS] only (``fp32-fused-tail``: what ``distill export`` writes); int8 dynamic from
  the dynamo graph (the former ``model.int8.onnx``) and from the export's graph, int8 static (calibrated on DL21 +
  DL22) from the export's graph (its ``Attention`` stays fp32) and from a graph fused without ``Attention`` (all
  matmuls or only the weight matmuls quantised). Each int8 graph's nDCG@10 against PyTorch fp32 on all 43 judged
  DL19 queries (the export's parity bound) is measured beside its time. The graph of ``int8_mode: weights``
  (``int8-weights``) is made for OpenVINO and timed in the ``openvino`` stage only.
- ``sessions``: one setting at a time away from the defaults, on ``fp32-fused-tail`` and on ``--int8``: intra-op
  threads, graph optimisation level, memory arena, spinning, the batch token budget, and ``--threads`` batches in
  flight on single-threaded runs instead of one batch on all threads.
- ``openvino``: the graphs OpenVINO reads (if installed), in fp32 (the fused one also in bf16: OpenVINO's default
  wherever the CPU has it) and ``int8-weights`` as ``distill``'s ``openvino-int8`` backend runs it, at three batch
  budgets, one stream of ``--threads`` threads. The choice between OpenVINO's int8 settings is in
  ``python -m benchmarks.int8``.
- ``streams``: OpenVINO with ``--threads`` single-threaded streams and a batch in flight on each.
- ``profile``: onnxruntime's profile of the default settings on the fused fp32 graph and on ``--int8``, and
  OpenVINO's per-node counters on ``int8-weights``: the time per op type (OpenVINO's also per kernel), and the
  share of the call outside the graph (tokenisation, padding, Python).

    python -m benchmarks.onnx_cpu --student checkpoints/minilm-dl21-cis --threads 2
    # -> benchmarks/results/onnx-cpu-<run>.json

``--graphs DIR`` keeps the graphs (and reuses them on the next run), so that they can be built apart from the
timed runs.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import RESULTS, phases
from benchmarks.phases import (
    BenchOptions,
    at_least,
    display_path,
    set_threads,
    slug,
    time_calls,
    write_result,
)
from distill.bench.measure import environment, int8_matmul_ops_per_s, matmul_flops_per_s
from distill.core.batching import token_budget_batches
from distill.core.devices import STUDENT_BATCH_TOKENS
from distill.core.project_files import CANDIDATES, DL19
from distill.core.run_folder import student_folder
from distill.core.schema import InputError, Qrels
from distill.data.loaders import load_candidates
from distill.eval.metrics import evaluate
from distill.eval.trec_runs import run_from_columns
from distill.export.cls_tail import run_tail_on_first_token
from distill.export.exporter import EXAMPLE_PAIRS
from distill.export.onnx_graphs import Logits, export_onnx, fuse_transformer
from distill.export.parity_set import Pair, dl19_parity_set
from distill.export.quantize import Calibration, quantize_int8
from distill.serving.encoding import encode_pairs, load_tokenizer, model_max_length, pad_batch
from distill.serving.reranker import Reranker
from distill.serving.scorers import (
    OPENVINO_INT8_GROUP_SIZE,
    OPENVINO_INT8_PRECISION,
    OPENVINO_PRECISIONS,
    OnnxScorer,
    OpenVinoScorer,
    Scorer,
    SessionSettings,
    TorchScorer,
)

STAGES = ("variants", "sessions", "openvino", "streams", "profile")
OPENVINO_ONLY = ("int8-weights",)
"""Graphs made for OpenVINO (onnxruntime folds their int8 weights back to fp32): timed in the openvino stage only."""
BUDGETS = (256, 512, 1024, 2048, 4096, 8192, 16384)


def ranking_ndcg10(pairs: list[Pair], scores: np.ndarray, qrels: Qrels) -> float:
    """nDCG@10 (x100) of the candidate lists ``pairs`` ranked by ``scores`` (``[len(pairs)]``)."""
    run = run_from_columns([p.qid for p in pairs], [p.docid for p in pairs], scores.tolist())
    return evaluate(run, qrels, ["nDCG@10"])["nDCG@10"]


@dataclass(kw_only=True)
class OnnxCpu(BenchOptions):
    """Which ONNX graph, session settings and runtime rerank fastest on a CPU, and where the time goes."""

    student: str
    """A training run or an HF folder."""
    threads: int | None = 2
    """Intra-op threads (torch's too)."""
    queries: int = 3
    """DL19 queries timed (each with its 100 candidates)."""
    repeats: int = 5
    budget: int = STUDENT_BATCH_TOKENS["cpu"]
    """Padded tokens per batch."""
    int8: str = "int8-dynamic"
    """The int8 graph the sessions and the profile use."""
    stages: list[str] = field(default_factory=lambda: list(STAGES))
    """The stages to run, of ``variants``, ``sessions``, ``openvino``, ``streams``, ``profile`` (none: build the
    graphs only, with ``--graphs``)."""
    quality: bool = True
    """The int8 graphs' nDCG@10 on DL19 beside their times."""
    all_variants: bool = False
    """Also time the graph fused without ``Attention``."""
    graphs: str | None = None
    """Build the graphs into this folder, or reuse those a run left there."""
    matmul_size: int = 2048
    """Side of the square fp32 and int8 matmuls whose rates the result records."""

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "queries", "repeats", "budget", "matmul_size")
        if unknown := sorted(set(self.stages) - set(STAGES)):
            raise InputError(f"--stages: unknown stage(s) {unknown}, of {list(STAGES)}")


# ----------------------------------------------------------------------------- graphs


def _example(folder: Path) -> dict[str, Any]:
    import torch

    tokenizer = load_tokenizer(folder)
    queries, passages = zip(*EXAMPLE_PAIRS, strict=True)
    encoded = encode_pairs(tokenizer, queries, passages, model_max_length(folder, tokenizer))
    return {k: torch.from_numpy(v) for k, v in pad_batch(tokenizer, encoded.features).items()}


def build_graphs(hf: Path, out: Path) -> dict[str, Path]:
    """Every graph variant of the student in ``hf`` (an HF folder), written into ``out`` (a copy of ``hf``)."""
    import onnx
    import onnx_ir
    import torch
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model
    from onnxscript.rewriter.ort_fusions import optimize_for_ort
    from transformers import AutoConfig, AutoModelForSequenceClassification

    import distill.model.segment_cosine  # noqa: F401  (registers the segment-cosine head)

    config = AutoConfig.from_pretrained(hf)
    example = _example(hf)
    paths = {name: out / f"{name}.onnx" for name in ("fp32-dynamo", "fp32-dynamo-onnxscript", "fp32-torchscript")}
    model = AutoModelForSequenceClassification.from_pretrained(hf, dtype=torch.float32).eval()
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    torch.onnx.export(  # the export of distill before fusions: dynamo=True, opset 18, SDPA attention
        Logits(model).eval(),
        tuple(example.values()),
        str(paths["fp32-dynamo"]),
        input_names=list(example),
        output_names=["logits"],
        dynamic_shapes=tuple({0: batch, 1: sequence} for _ in example),
        opset_version=18,
        dynamo=True,
        external_data=False,
    )
    fused, _ = optimize_for_ort(onnx_ir.load(str(paths["fp32-dynamo"])))
    onnx_ir.save(fused, str(paths["fp32-dynamo-onnxscript"]))
    eager = AutoModelForSequenceClassification.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager")
    export_onnx(eager.eval(), example, paths["fp32-torchscript"])
    for name in ("fp32-fused", "fp32-fused-tail"):  # the latter is what distill export writes
        paths[name] = out / f"{name}.onnx"
        paths[name].write_bytes(paths["fp32-torchscript"].read_bytes())
        fuse_transformer(paths[name], config)
    run_tail_on_first_token(paths["fp32-fused-tail"])
    options = FusionOptions("bert")
    options.enable_attention = False
    no_attention = out / "fp32-fused-no-attention.onnx"
    optimize_model(
        str(paths["fp32-torchscript"]),
        model_type="bert",
        num_heads=config.num_attention_heads,
        hidden_size=config.hidden_size,
        opt_level=0,
        optimization_options=options,
    ).save_model_to_file(str(no_attention))
    run_tail_on_first_token(no_attention)
    paths["fp32-fused-no-attention"] = no_attention

    paths["int8-dynamic-dynamo"] = out / "int8-dynamic-dynamo.onnx"  # the former model.int8.onnx
    quantize_dynamic(str(paths["fp32-dynamo"]), str(paths["int8-dynamic-dynamo"]), weight_type=QuantType.QInt8,
                     per_channel=True)  # fmt: skip
    paths["int8-dynamic"] = out / "int8-dynamic.onnx"
    quantize_int8(paths["fp32-fused-tail"], paths["int8-dynamic"], "dynamic")
    paths["int8-static"] = out / "int8-static.onnx"
    quantize_int8(paths["fp32-fused-tail"], paths["int8-static"], "static")
    paths["int8-weights"] = out / "int8-weights.onnx"  # for OpenVINO (int8_mode: weights)
    quantize_int8(paths["fp32-fused-tail"], paths["int8-weights"], "weights")
    batches = Calibration().batches(hf)
    for name, const_b_only in (("int8-static-no-attention", False), ("int8-static-no-attention-weights", True)):
        paths[name] = out / f"{name}.onnx"
        shaped = SymbolicShapeInference.infer_shapes(onnx.load(str(no_attention)), auto_merge=True)
        quantize_static(  # as distill.export.quantize does, with the attention matmuls unfused
            shaped,
            str(paths[name]),
            _Feeds(batches, [i.name for i in shaped.graph.input]),
            op_types_to_quantize=["MatMul"],
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": const_b_only},
        )
    return paths


def graphs_in(hf: Path, folder: Path) -> dict[str, Path]:
    """The graph variants in ``folder``: those a former run listed in its ``graphs.json``, else built there (a copy
    of ``hf`` with every graph of :func:`build_graphs`)."""
    manifest = folder / "graphs.json"
    if manifest.is_file():
        return {name: folder / file for name, file in json.loads(manifest.read_text()).items()}
    shutil.copytree(hf, folder, dirs_exist_ok=True)
    graphs = build_graphs(hf, folder)
    manifest.write_text(json.dumps({name: path.name for name, path in graphs.items()}, indent=2) + "\n")
    return graphs


class _Feeds:
    def __init__(self, batches: Sequence[dict[str, np.ndarray]], names: Sequence[str]) -> None:
        self.feeds = iter([{n: b[n] for n in names} for b in batches])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


def op_counts(path: Path) -> dict[str, int]:
    import onnx

    counts: dict[str, int] = defaultdict(int)
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        counts[node.op_type] += 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


# ----------------------------------------------------------------------------- timing


class RerankCalls:
    """The first queries of DL19 with their 100 BM25 candidates, and the tokenizer of the student."""

    def __init__(self, folder: Path, queries: int) -> None:
        self.tokenizer = load_tokenizer(folder)
        self.max_length = model_max_length(folder, self.tokenizer)
        candidates = load_candidates(DL19 / CANDIDATES).candidates[:queries]
        self.calls = [(c.query.text, [p.text for p in c.passages]) for c in candidates]


def reranker(scorer: Scorer, work: RerankCalls, budget: int) -> Reranker:
    return Reranker(scorer, work.tokenizer, work.max_length, budget)


def parallel_score(ranker: Reranker, pool: ThreadPoolExecutor) -> Callable[[str, list[str]], list[float]]:
    """``Reranker.score`` with its batches run by ``pool``'s threads, several at a time."""

    def score(query: str, passages: list[str]) -> list[float]:
        encoded = encode_pairs(ranker.tokenizer, [query] * len(passages), passages, ranker.max_length)
        rows = token_budget_batches(encoded.lengths, ranker.max_batch_tokens)
        batches = [pad_batch(ranker.tokenizer, [encoded.features[i] for i in batch]) for batch in rows]
        scores = np.empty(len(passages), dtype=np.float32)
        for batch, values in zip(rows, pool.map(ranker.scorer, batches), strict=True):
            scores[batch] = values
        return scores.tolist()

    return score


def time_rounds(score: Callable[[str, list[str]], Sequence[float]], work: RerankCalls, repeats: int) -> dict[str, Any]:
    """``score`` on every call of ``work``: one warm-up round, then ``repeats`` timed rounds (p50, p95, seconds)."""
    return time_calls([partial(score, query, passages) for query, passages in work.calls], repeats)


class Quality:
    """nDCG@10 of rankings on all judged DL19 queries (each query's 100 candidates), against PyTorch fp32's."""

    def __init__(self, hf: Path, work: RerankCalls) -> None:
        parity = dl19_parity_set()
        self.pairs, self.qrels = parity.ranking, parity.qrels
        self.queries: dict[str, list[int]] = defaultdict(list)
        for i, pair in enumerate(self.pairs):
            self.queries[pair.qid].append(i)
        self.work = work
        self.reference = self.ndcg(TorchScorer(hf))

    def ndcg(self, scorer: Scorer) -> float:
        ranker = reranker(scorer, self.work, STUDENT_BATCH_TOKENS["cpu"])
        scores = np.empty(len(self.pairs))
        for rows in self.queries.values():
            scores[rows] = ranker.score(self.pairs[rows[0]].query, [self.pairs[i].passage for i in rows])
        return ranking_ndcg10(self.pairs, scores, self.qrels)

    def delta(self, scorer: Scorer) -> dict[str, float]:
        value = self.ndcg(scorer)
        return {"ndcg10": value, "delta": value - self.reference, "pytorch_ndcg10": self.reference}


# ----------------------------------------------------------------------------- stages


def stage_variants(graphs: dict[str, Path], work: RerankCalls, args: OnnxCpu, quality: Quality | None):
    rows = []
    settings = SessionSettings(threads=args.threads)
    for name, path in graphs.items():
        if name in OPENVINO_ONLY or (name == "fp32-fused-no-attention" and not args.all_variants):
            continue
        scorer = OnnxScorer(path, settings=settings)
        row = {"graph": name, **time_rounds(reranker(scorer, work, args.budget).score, work, args.repeats)}
        row["ops"] = op_counts(path)
        if quality is not None and name.startswith("int8"):
            row["ndcg10"] = quality.delta(scorer)
        rows.append(row)
        print(_line(name, row), flush=True)
    return rows


def stage_sessions(graphs: dict[str, Path], work: RerankCalls, args: OnnxCpu):
    rows = []
    base = SessionSettings(threads=args.threads)
    changes: list[tuple[str, SessionSettings, int, int]] = [("defaults", base, args.budget, 1)]
    changes += [(f"threads={n}", replace(base, threads=n), args.budget, 1) for n in (1, 2, 4) if n != args.threads]
    changes += [(f"graph_optimization={g}", replace(base, graph_optimization=g), args.budget, 1)
                for g in ("disable", "basic", "extended")]  # fmt: skip
    changes += [("memory_arena=off", replace(base, memory_arena=False), args.budget, 1)]
    changes += [("spinning=off", replace(base, spinning=False), args.budget, 1)]
    changes += [(f"max_batch_tokens={b}", base, b, 1) for b in BUDGETS if b != args.budget]
    changes += [(f"{args.threads} batches in flight x 1 thread, max_batch_tokens={b}", replace(base, threads=1), b,
                 args.threads) for b in (512, 1024, 2048)]  # fmt: skip
    for graph in ("fp32-fused-tail", args.int8):
        for label, settings, budget, workers in changes:
            ranker = reranker(OnnxScorer(graphs[graph], settings=settings), work, budget)
            if workers == 1:
                row = time_rounds(ranker.score, work, args.repeats)
            else:
                with ThreadPoolExecutor(workers) as pool:
                    row = time_rounds(parallel_score(ranker, pool), work, args.repeats)
            row = {"graph": graph, "change": label, "settings": asdict(settings), "max_batch_tokens": budget, **row}
            rows.append(row)
            print(_line(f"{graph} {label}", row), flush=True)
    return rows


class OpenVinoStreams:
    """An ONNX graph on OpenVINO with ``streams`` single-threaded inference streams and one infer request per
    calling thread, for batches run several at a time (:func:`parallel_score`)."""

    def __init__(self, path: Path, streams: int, precision: str = "float32", int8_group_size: int = 0) -> None:
        import openvino

        core = openvino.Core()
        config = {
            "PERFORMANCE_HINT": "THROUGHPUT",
            "NUM_STREAMS": streams,
            "INFERENCE_NUM_THREADS": streams,
            "INFERENCE_PRECISION_HINT": OPENVINO_PRECISIONS[precision],
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": int8_group_size,
        }
        self.compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        self.input_names = tuple(i.get_any_name() for i in self.compiled.inputs)
        self.local = threading.local()

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        if not hasattr(self.local, "request"):
            self.local.request = self.compiled.create_infer_request()
        outputs = self.local.request.infer({name: batch[name] for name in self.input_names})
        return np.asarray(outputs[self.compiled.output("logits")])[:, 0].astype(np.float32)


SKIPPED = {"skipped": "openvino is not installed"}


def _openvino_installed() -> bool:
    """Whether OpenVINO (the optional extra) is installed; if not, says that its stage is skipped."""
    if importlib.util.find_spec("openvino") is None:
        print("openvino: not installed (pip install openvino), skipped")
        return False
    return True


def stage_openvino(graphs: dict[str, Path], work: RerankCalls, args: OnnxCpu, quality: Quality | None):
    """Each graph OpenVINO reads, one stream of ``--threads`` threads at three batch budgets, every op it does not
    run in int8 in fp32 (the fused fp32 graph and ``int8-weights`` also in bf16). The choice between OpenVINO's
    int8 settings is made in ``python -m benchmarks.int8``."""
    if not _openvino_installed():
        return SKIPPED
    import openvino

    rows = []
    cells = [(graph, "float32", 0) for graph in ("fp32-torchscript", "fp32-fused-tail", "int8-static",
             "int8-static-no-attention", "int8-static-no-attention-weights", "int8-dynamic-dynamo")]  # fmt: skip
    cells.insert(2, ("fp32-fused-tail", "bfloat16", 0))
    # distill's openvino-int8 backend, the ops it does not run in int8 in bf16 and in fp32
    cells[:0] = [("int8-weights", precision, OPENVINO_INT8_GROUP_SIZE) for precision in OPENVINO_PRECISIONS]
    for graph, precision, group_size in cells:
        for budget in (args.budget, 2 * args.budget, 4 * args.budget):
            try:
                scorer = OpenVinoScorer(graphs[graph], args.threads, precision, group_size)
            except RuntimeError as e:  # an op OpenVINO cannot convert
                rows.append({"graph": graph, "error": str(e).strip().splitlines()[-1]})
                print(f"openvino {graph}: {rows[-1]['error']}")
                break
            row = {"graph": graph, "precision": precision, "int8_group_size": group_size, "streams": 1,
                   "max_batch_tokens": budget}  # fmt: skip
            row.update(time_rounds(reranker(scorer, work, budget).score, work, args.repeats))
            if quality is not None and (graph.startswith("int8") or precision != "float32") and budget == args.budget:
                row["ndcg10"] = quality.delta(scorer)
            rows.append(row)
            print(_line(f"openvino {graph} {precision} g{group_size} max_batch_tokens={budget}", row), flush=True)
    return {"version": openvino.__version__, "rows": rows}


def stage_streams(graphs: dict[str, Path], work: RerankCalls, args: OnnxCpu):
    """OpenVINO with ``--threads`` single-threaded streams and a batch in flight on each (the fused fp32 graph, the
    static int8 one and ``int8-weights`` as the ``openvino-int8`` backend quantises it), at two batch budgets."""
    if not _openvino_installed():
        return SKIPPED
    rows = []
    streamed = [("fp32-fused-tail", 0), ("int8-static", 0), ("int8-weights", OPENVINO_INT8_GROUP_SIZE)]
    for (graph, group_size), budget in itertools.product(streamed, (args.budget // 2, args.budget)):
        streams = OpenVinoStreams(graphs[graph], args.threads, "float32", group_size)
        with ThreadPoolExecutor(args.threads) as pool:
            timed = time_rounds(parallel_score(reranker(streams, work, budget), pool), work, args.repeats)
        rows.append({"graph": graph, "precision": "float32", "int8_group_size": group_size,
                     "streams": args.threads, "max_batch_tokens": budget, **timed})  # fmt: skip
        print(_line(f"openvino {graph} {args.threads} streams x 1 thread max_batch_tokens={budget}", rows[-1]))
    return rows


class ProfiledScorer(OnnxScorer):
    """:class:`OnnxScorer` with onnxruntime's profiler on, writing its trace under ``prefix``."""

    def __init__(self, path: Path, settings: SessionSettings, prefix: Path) -> None:
        import onnxruntime as ort

        options = settings.options()
        options.enable_profiling = True
        options.profile_file_prefix = str(prefix)
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input_names = tuple(i.name for i in self.session.get_inputs())


class OpenVinoCounters:
    """An :class:`OpenVinoScorer` made with ``perf_count``, adding up OpenVINO's time per node of every batch it
    scores while ``counting``, by node type and kernel (``exec_type``), in ms."""

    def __init__(self, scorer: OpenVinoScorer) -> None:
        self.scorer, self.input_names = scorer, scorer.input_names
        self.counting = False
        self.ms: dict[str, float] = defaultdict(float)

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        import openvino

        scores = self.scorer(batch)
        if self.counting:
            for node in self.scorer.request.profiling_info:
                if node.status == openvino.ProfilingInfo.Status.EXECUTED:
                    self.ms[f"{node.node_type} ({node.exec_type})"] += node.real_time.total_seconds() * 1e3
        return scores


def _profile_row(by_op: dict[str, float], walls: Sequence[float], graph_ms: float) -> dict[str, Any]:
    """Per call: the wall time, the time in the graph and outside it, and each op's time and share of the wall."""
    calls, wall_ms = len(walls), 1e3 * sum(walls)
    ordered = sorted(by_op.items(), key=lambda kv: -kv[1])
    return {
        "wall_ms_per_call": wall_ms / calls,
        "graph_ms_per_call": graph_ms / calls,
        "outside_graph_ms_per_call": (wall_ms - graph_ms) / calls,
        "ops_ms_per_call": {op: ms / calls for op, ms in ordered},
        "ops_share_of_wall": {op: ms / wall_ms for op, ms in ordered},
    }


def _print_profile(name: str, row: dict[str, Any]) -> None:
    top = ", ".join(f"{op} {100 * share:.0f}%" for op, share in list(row["ops_share_of_wall"].items())[:6])
    print(f"profile {name}: {row['wall_ms_per_call']:.0f} ms/call, {row['outside_graph_ms_per_call']:.0f} ms outside"
          f" the graph; {top}", flush=True)  # fmt: skip


def _timed_round(ranker: Reranker, work: RerankCalls, start: Callable[[], None] = lambda: None) -> list[float]:
    """A warm-up round of every call (as many graph runs as the timed one), ``start()``, then the wall time of each
    call of one round, in seconds."""
    return time_calls([partial(ranker.score, q, p) for q, p in work.calls], 1, start)["seconds"]


def profile_onnxruntime(path: Path, work: RerankCalls, args: OnnxCpu, prefix: Path) -> dict[str, Any]:
    """onnxruntime's profile of the graph at ``path`` with the default session settings."""
    scorer = ProfiledScorer(path, SessionSettings(threads=args.threads), prefix)
    walls = _timed_round(reranker(scorer, work, args.budget), work)
    events = json.loads(Path(scorer.session.end_profiling()).read_text())
    runs = [e for e in events if e.get("name") == "model_run"]
    timed = runs[len(runs) // 2 :]
    by_op: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event["ts"] >= timed[0]["ts"] and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"] / 1e3
    return _profile_row(by_op, walls, sum(e["dur"] for e in timed) / 1e3)


def profile_openvino(path: Path, work: RerankCalls, args: OnnxCpu) -> dict[str, Any]:
    """OpenVINO's per-node profile of ``distill``'s ``openvino-int8`` backend (the graph of ``int8_mode: weights``),
    by node type and kernel; the graph's time is the sum of its nodes'."""
    scorer = OpenVinoScorer(path, args.threads, OPENVINO_INT8_PRECISION, OPENVINO_INT8_GROUP_SIZE, perf_count=True)
    counters = OpenVinoCounters(scorer)
    walls = _timed_round(reranker(counters, work, args.budget), work, lambda: setattr(counters, "counting", True))
    return _profile_row(counters.ms, walls, sum(counters.ms.values()))


def stage_profile(graphs: dict[str, Path], work: RerankCalls, args: OnnxCpu, tmp: Path):
    """Where one round of calls spends its time, after a warm-up round: onnxruntime's profile of the fused fp32
    graph and of ``--int8``, and OpenVINO's of its int8 backend (if installed). Per call: the wall time, the time
    in the graph and outside it (tokenisation, padding, Python), and the time per op type (also as a share of the
    wall time)."""
    out = {}
    for graph in ("fp32-fused-tail", args.int8):
        out[graph] = profile_onnxruntime(graphs[graph], work, args, tmp / f"profile-{graph}")
        _print_profile(graph, out[graph])
    if not _openvino_installed():
        return out
    out["openvino int8-weights"] = profile_openvino(graphs["int8-weights"], work, args)
    _print_profile("openvino int8-weights", out["openvino int8-weights"])
    return out


def _line(name: str, row: dict[str, Any]) -> str:
    extra = ""
    if "ndcg10" in row:
        extra = f"  nDCG@10 {row['ndcg10']['ndcg10']:.2f} (Δ {row['ndcg10']['delta']:+.2f})"
    return f"{name:<60} p50 {1e3 * row['p50_s']:7.1f} ms  p95 {1e3 * row['p95_s']:7.1f} ms{extra}"


def run(args: OnnxCpu, invocation: dict[str, Any]) -> int:
    """Build (or reuse) the graphs, run each stage asked for, and write the result after each."""
    import torch

    set_threads(args.threads)
    hf = student_folder(args.student, exported=False)
    run_name = hf.parent.name if hf.name in ("export", "hf") else hf.name
    out = args.out or RESULTS / f"onnx-cpu-{slug(run_name)}.json"
    record: dict[str, Any] = {
        **invocation,
        "environment": environment(torch.device("cpu"), torch.float32),
        "student": display_path(hf),
        "threads": args.threads,
        "matmul_fp32_flops_per_s": matmul_flops_per_s(torch.device("cpu"), torch.float32, args.matmul_size, 10),
        "matmul_int8_ops_per_s": int8_matmul_ops_per_s(args.matmul_size, 10, args.threads),
        "defaults": {"settings": asdict(SessionSettings(threads=args.threads)), "max_batch_tokens": args.budget},
    }
    stages = {
        "variants": lambda: stage_variants(graphs, work, args, quality),
        "sessions": lambda: stage_sessions(graphs, work, args),
        "openvino": lambda: stage_openvino(graphs, work, args, quality),
        "streams": lambda: stage_streams(graphs, work, args),
        "profile": lambda: stage_profile(graphs, work, args, Path(tmp)),
    }
    with tempfile.TemporaryDirectory(prefix="onnx-cpu-") as tmp:
        folder = Path(args.graphs) if args.graphs else Path(tmp) / "student"
        started = time.perf_counter()
        graphs = graphs_in(hf, folder)
        record["build_s"] = time.perf_counter() - started
        work = RerankCalls(folder, args.queries)
        record["workload"] = {"queries": [q for q, _ in work.calls], "candidates": [len(c) for _, c in work.calls]}
        quality = Quality(hf, work) if args.quality and {"variants", "openvino"} & set(args.stages) else None
        for stage in args.stages:
            record[stage] = stages[stage]()
            write_result(record, out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.onnx_cpu ARGS``; its exit status."""
    return phases.main(OnnxCpu, run, "benchmarks.onnx_cpu", argv)


if __name__ == "__main__":
    sys.exit(main())
