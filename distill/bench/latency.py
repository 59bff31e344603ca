"""``distill bench``: the latency of a distilled student on each backend against its teacher and the
sentence-transformers baseline, on identical real inputs (see :mod:`distill.bench.workload`).

Writes ``bench.json`` (every timed call, the environment, the command), ``bench.csv`` (one row per method and
workload) and ``bench.png`` (the bar chart) to the output folder.
"""

from __future__ import annotations

import gc
import json
import logging
import re
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from distill.bench import report
from distill.bench.measure import dtype_name, environment, int8_matmul_ops_per_s, matmul_flops_per_s
from distill.bench.methods import (
    AUTO,
    BASELINE,
    BF16,
    DEFAULT_BACKENDS,
    FLOAT,
    INT8,
    PEERS,
    STUDENT_BACKENDS,
    Method,
    baseline_method,
    student_method,
    teacher_method,
    variant,
)
from distill.bench.ndcg import REFERENCE, QualitySet
from distill.bench.timing import time_method
from distill.bench.workload import TOKEN_COUNTS, Workload, rerank_workload, token_count_workloads
from distill.core.devices import MATMUL_SIZE, compute_dtype, resolve_device
from distill.core.files import check_model_folder, read_json_object
from distill.core.output_files import write_whole
from distill.core.path_checks import output_folder
from distill.core.project_files import CANDIDATES, DL19, qrels_beside, shipped
from distill.core.run_folder import CHECKPOINT_ROOT, RunLayout, student_folder
from distill.core.schema import InputError, MissingFileError, RerankingData
from distill.data.loaders import RunWithoutTexts, load_candidates
from distill.model.resolver import DEFAULT_TEACHER, PAPER_STUDENT
from distill.serving.encoding import load_tokenizer, model_max_length
from distill.serving.hardware import CPUINFO, CpuFeatures
from distill.serving.options import RuntimeOptions

log = logging.getLogger(__name__)

DEFAULT_INPUT = str(DL19 / CANDIDATES)
RANDOM_TEACHER = "meta-llama/Meta-Llama-3-8B"
PEER_REFERENCE = f"{BASELINE} (peer)"
"""sentence-transformers' PyTorch ``CrossEncoder`` on ``--peer_student``, where it is not the student: the reference
of the peers' speed and nDCG@10 changes."""


@dataclass(frozen=True)
class BenchConfig(RuntimeOptions):
    """Options of ``distill bench`` (YAML keys and ``--flags`` alike): where the student's batches run and how large
    they are are :class:`~distill.serving.options.RuntimeOptions`' fields (``device``, ``threads``, also torch's here,
    ``max_length``, ``max_batch_tokens``), declared there once."""

    student: str | None = None
    """A training run (``checkpoints/<run>``: its ``export/``, else its ``hf/``), an export folder or an HF
    folder. With ``random_weights``: an architecture name (default ``bert-large-uncased``)."""
    teacher: str | None = None
    """A teacher model name (see ``distill.model.resolver``; default ``smollm2-135m``), or ``none`` to time the students
    only. With ``random_weights``: an architecture name (default ``meta-llama/Meta-Llama-3-8B``)."""
    random_weights: bool = False
    """Build the student and the teacher from their configs with random weights (full-size timing offline)."""
    input: str = DEFAULT_INPUT
    """The candidates the calls are made of, with their texts: a rank_llm or multi-hop QA JSON file, a BEIR folder
    or an ``irds:`` id (a TREC run has no texts, and bench takes no queries or corpus)."""
    qrels: str | None = None
    """Qrels of ``input`` for the quality pass (default: the ``qrels.txt`` beside it, as the shipped data keep them,
    else those the input carries: a BEIR folder's, an ``irds:`` id's; DL19's for the default input)."""
    quality: bool = True
    """Also rerank every judged query of ``input`` with each student method and the baseline (untimed) and report
    its nDCG@10 and the change from the student's PyTorch fp32."""
    qid: str | None = None
    """The query of the token-count workloads (default: the one whose candidates hold the most tokens)."""
    token_counts: list[int] = field(default_factory=lambda: list(TOKEN_COUNTS))
    """Total passage-token counts of the paper's protocol; empty to skip it."""
    rerank_queries: int = 3
    """Queries of the "rerank a query's candidates" workload (each with all its candidates); 0 to skip it."""
    backends: list[str] | None = None
    """Student backends (of ``torch-fp32, torch-fp16, torch-bf16, torchscript, onnx-fp32, onnx-fp16, onnx-int8,
    openvino-fp32, openvino-bf16, openvino-int8``, and ``auto``: the one ``Reranker.load`` chooses for this machine,
    timed as ``student auto (<its choice>)``), ``st-crossencoder`` (sentence-transformers' PyTorch ``predict``) and
    its optimised backends ``st-onnx, st-onnx-int8, st-openvino`` (on ``peer_student``). Default: those of the
    device whose files exist, OpenVINO's where it is installed, the peers where their optimum package imports.
    A student backend takes the reranker's levers as suffixes named by their options' fields, each timed as its
    own method: ``+overlap=N`` (tokenise N pairs ahead on a background thread, any backend), and the torch backends'
    ``+tf32`` (torch-fp32 on a GPU), ``+compile``, ``+cudnn_attention``, ``+unpad`` and ``+cuda_graphs``, each true
    alone or ``=true``/``=false`` (unpad and CUDA graphs are on by default on a GPU), e.g.
    ``torch-fp16,torch-fp16+unpad=false,torch-fp32,torch-fp32+tf32``; each method's settings are recorded in
    ``bench.json``."""
    peer_student: str | None = None
    """The [CLS]-head student (an HF or export folder) that sentence-transformers' ``st-onnx``, ``st-onnx-int8`` and
    ``st-openvino`` run on: their optimum export takes the architectures ``transformers`` knows, not the
    segment-cosine head. Default: the student, if its head is [CLS]. Where it is another student, its PyTorch
    ``CrossEncoder`` is timed too (``st-crossencoder (peer)``), the reference of the peers' nDCG@10 changes."""
    warmup: int = 1
    repeats: int = 10
    max_seconds: float = 20.0
    """Stop repeating a (method, workload) once its timed calls pass this many seconds (one round at least)."""
    teacher_max_batch_tokens: int | None = None
    """Padded tokens per teacher batch (default the teacher's, :class:`~teachers.causal_lm.ScorerOptions`')."""
    matmul_size: int | None = None
    """Side of the square matmul whose rate FLOP floors use (default 8192 on a GPU, 2048 on a CPU)."""
    output: str | None = None
    """The result folder (default: ``<run>/bench``; for a model folder outside a run, ``<folder>-bench`` beside it;
    with random weights, ``checkpoints/bench-random-<device>``)."""
    compare: bool = False
    """Also print the speed-up of each method over the teacher, the baseline and PyTorch fp32."""
    seed: int = 0
    """Seed of the random weights."""
    results: str | None = None
    """Print the tables of a saved ``bench.json`` instead of timing anything."""
    scores: bool = False
    """Also record each student and baseline method's scores of every call, after its timed rounds (one more untimed
    call each): ``bench.json``'s ``scores``, method -> workload -> one list per call, to compare methods' scores
    (each as it gives them: a student's raw score; ``CrossEncoder.predict``'s for the baseline, the raw score too for
    a student this project saved, whose config names an identity activation; the sigmoid of it for another
    one-output model)."""
    profile: bool = False
    """Also record each (method, workload)'s timed calls with ``torch.profiler``: ``profile/<method>-<workload>.txt``
    and ``.json`` in the result folder, the time by kernel category (:mod:`distill.bench.profile`). The profiler
    slows the calls it records: a profiled run's timings are no measurements."""

    def __post_init__(self) -> None:
        RuntimeOptions.__post_init__(self)
        for name, least in (("warmup", 0), ("repeats", 1), ("rerank_queries", 0)):
            if getattr(self, name) < least:
                raise InputError(f"bench: {name} must be at least {least}, got {getattr(self, name)}")
        if self.max_seconds <= 0:
            raise InputError(f"bench: max_seconds must be positive, got {self.max_seconds}")
        if any(count < 1 for count in self.token_counts):
            raise InputError(f"bench: token_counts must be positive, got {self.token_counts}")
        if twice := sorted({count for count in self.token_counts if self.token_counts.count(count) > 1}):
            raise InputError(f"bench: token_counts: {twice} given twice; each workload is timed once under its count")
        if self.matmul_size is not None and self.matmul_size < 1:
            raise InputError(f"bench: matmul_size must be positive, got {self.matmul_size}")
        if self.backends == [] and self.teacher == "none":
            raise InputError("bench: nothing to time: backends is empty and teacher is none")
        if self.backends:
            check_backend_names(self.backends)

    @property
    def teacher_model(self) -> str | None:
        """The teacher the bench times: ``teacher``, else :data:`RANDOM_TEACHER`'s shapes with ``random_weights``,
        else :data:`~distill.model.resolver.DEFAULT_TEACHER`; None for ``none``."""
        if self.teacher == "none":
            return None
        return self.teacher or (RANDOM_TEACHER if self.random_weights else DEFAULT_TEACHER)


def check_backend_names(names: list[str]) -> None:
    """Each of ``names`` (``--backends``) is a method ``distill bench`` times, named once; its levers (``+unpad``)
    are checked against the device later (:func:`~distill.bench.methods.variant`).

    Raises:
        InputError: an unknown name, or one named twice.
    """
    known = [*STUDENT_BACKENDS, AUTO, BASELINE, *PEERS]
    if unknown := sorted(name for name in set(names) if name.split("+")[0] not in known):
        raise InputError(f"--backends: unknown {unknown}; choose from {known}")
    if twice := sorted({name for name in names if names.count(name) > 1}):
        raise InputError(f"--backends: {twice} named twice; each method is timed once under its name")


@dataclass(frozen=True)
class BenchReport:
    """A benchmark result (the content of ``bench.json``, see :mod:`distill.bench.report`) and how to show it."""

    result: dict[str, Any]
    compare: bool

    def format(self) -> str:
        lines = [report.latency_table(self.result), "", report.summary_table(self.result)]
        lines += [f"skipped {name}: {reason}" for name, reason in self.result["skipped"].items()]
        if self.result.get("complete") is False:
            lines.append("incomplete: the run stopped before every method was timed; these are the figures it took")
        if self.compare:
            lines.append("\n" + report.compare_table(self.result))
        if "output" in self.result:
            lines.append(f"wrote {self.result['output']}/bench.{{json,csv,png}}")
        return "\n".join(lines)


def bench(config: BenchConfig, command: str | None = None) -> BenchReport:
    """Run the benchmark (or read ``config.results``); ``command`` is recorded with a new result."""
    if config.results:
        path = Path(config.results)
        if not path.is_file():
            raise MissingFileError(f"{path}: no such bench.json")
        result = read_json_object(path)
        report.check_result(result, path)
        return BenchReport(result, config.compare)
    return BenchReport(run_bench(config, command), config.compare)


def default_output(config: BenchConfig, folder: Path | None, device: torch.device) -> Path:
    """``output``, else the student's run's ``bench/``, else (random weights) ``checkpoints/bench-random-<device>``."""
    if config.output:
        return Path(config.output)
    if folder is None:
        return Path(CHECKPOINT_ROOT) / f"bench-random-{device.type}"
    return RunLayout.of(folder).bench


def _random_student(config: BenchConfig, out: Path) -> Path:
    from students.model import build_student, save_student

    name = config.student or PAPER_STUDENT
    torch.manual_seed(config.seed)
    model, tokenizer = build_student(name, random_init=True)
    return save_student(model, tokenizer, out, None)


def _teacher(config: BenchConfig, device: torch.device) -> Method:
    from teachers.causal_lm import ScorerOptions
    from teachers.teacher import CausalLMTeacher

    options = ScorerOptions(max_batch_tokens=config.teacher_max_batch_tokens)  # the rest as `distill teach` has them
    if config.random_weights:
        teacher = CausalLMTeacher.random(config.teacher_model, device=device, seed=config.seed, options=options)
    else:
        teacher = CausalLMTeacher.load(config.teacher_model, device=device, options=options)
    return teacher_method(teacher)


def _students(
    config: BenchConfig, folder: Path, device: torch.device, scratch: Path
) -> tuple[list[tuple[str, Callable[[], Method]]], dict[str, str], dict[str, str]]:
    """The student and baseline methods to time, each as (name, a function that loads it); the reason each default
    one left out is left out (its file is missing, or the peers' student is not [CLS]-head); and the methods whose
    nDCG@10 change is taken against another method than :data:`~distill.bench.ndcg.REFERENCE` (the peers on
    another student: against ``st-crossencoder (peer)``). ``scratch`` holds the peers' exports."""
    from distill.bench.peers import peer_folder, require_optimum, st_peer_method
    from distill.serving.backends import OPENVINO_DTYPES
    from distill.serving.scorers import FORMAT_FILES, int8_graph

    requested = config.backends is not None
    names = config.backends if requested else list(DEFAULT_BACKENDS[device.type])
    for name in names:
        if "+" in name:
            try:
                variant(name, str(device))
            except InputError as e:
                raise InputError(f"--backends {e}") from None
    loaders, skipped, references = [], {}, {}
    peer: Path | None = None
    threads = config.threads or 0
    for name in names:
        kind, dtype = STUDENT_BACKENDS.get(name.split("+")[0], ("torch", None))
        fmt = OPENVINO_DTYPES[dtype] if kind in ("onnx", "openvino") else kind
        runtime = "onnxruntime" if kind == "onnx" else kind
        if fmt in FORMAT_FILES and not (folder / FORMAT_FILES[fmt]).is_file():
            if requested:  # found now, not after the methods before it were timed
                raise MissingFileError(f"--backends {name}: no {FORMAT_FILES[fmt]} in {folder}")
            skipped[name] = f"no {FORMAT_FILES[fmt]} in {folder}"
        elif fmt == "onnx-int8" and not requested and (graph := int8_graph(folder)).get("runtime", runtime) != runtime:
            skipped[name] = (
                f"{folder / FORMAT_FILES[fmt]} (int8_mode {graph.get('mode')}) was made and checked for "
                f"{graph['runtime']}, not {runtime}: name {name} in --backends to time it anyway"
            )
        elif name == BASELINE:
            loaders.append((name, partial(baseline_method, folder, str(device), config.max_length)))
        elif name in PEERS:
            try:
                require_optimum(name)
            except ImportError as e:
                if requested:
                    raise InputError(f"--backends {name}: {e}") from None
                skipped[name] = str(e)
                continue
            try:
                peer = peer or peer_folder(folder, config.peer_student)
            except InputError as e:
                if requested or config.peer_student:
                    raise
                skipped[name] = str(e)
                continue
            if peer.resolve() != folder.resolve():
                if PEER_REFERENCE not in references.values():
                    loaders.append(
                        (PEER_REFERENCE, partial(baseline_method, peer, str(device), config.max_length, PEER_REFERENCE))
                    )
                references[name] = PEER_REFERENCE
            args = (name, peer, str(device), config.max_length, threads, scratch / "peers")
            loaders.append((name, partial(st_peer_method, *args)))
        else:
            args = (folder, name, str(device), config.max_length, config.max_batch_tokens, threads)
            loaders.append((name, partial(student_method, *args)))
    return loaders, skipped, references


def _check_student_files(folder: Path) -> None:
    """The files of the student folder that every method needs: a tokenizer vocabulary (without it the workloads
    would be made of ``[UNK]``) and safetensors weights, which its FLOPs and parameters are counted from.

    Raises:
        MissingFileError: the file missing, named.
    """
    check_model_folder(folder)
    if not any(folder.glob("*.safetensors")):
        raise MissingFileError(
            f"{folder}: missing model.safetensors: bench counts the student's parameters and FLOPs from its weights "
            "(an export folder holds them); copy the folder again, or export the student again"
        )


def _workloads(config: BenchConfig, data: RerankingData, tokenizer: Any) -> list[Workload]:
    workloads = token_count_workloads(data, tokenizer, config.token_counts, config.qid) if config.token_counts else []
    if config.rerank_queries:
        workloads.append(rerank_workload(data, tokenizer, config.rerank_queries))
    if not workloads:
        raise InputError("nothing to time: give --token-counts or --rerank-queries")
    return workloads


def _warn_if_truncated(method: str, workload: Workload, tokens_fed: float) -> None:
    """One warning line where ``method`` reads fewer tokens a call than the calls of ``workload`` hold passage tokens
    (its ``max_length`` cut them): the workload's name then says more than was timed (``bench.json``'s
    ``tokens_fed_per_call`` says what was)."""
    held = workload.passage_tokens_per_call
    if tokens_fed < held:
        log.warning(
            "%s reads %.0f tokens a call of the %.0f passage tokens of %s: its max_length cuts the passages",
            method,
            tokens_fed,
            held,
            workload.name,
        )


FLOOR_SLACK = 4.0
"""How far under its FLOP floor a method may seem to run before the floor is called implausible. The floor is the
method's FLOPs at the rate of torch's matmul; a runtime with faster kernels of its own beats it (OpenVINO's bf16
has its own), but not by this much."""


def _warn_if_below_the_floor(method: str, workload: Workload, floor: float | None, p50: float, size: int) -> None:
    """One warning line where ``method`` ran well under its FLOP floor: the matmul rate was measured too low (a busy
    machine, or a ``matmul_size`` too small to reach the machine's rate), and every floor fraction overstates."""
    if floor is not None and floor > FLOOR_SLACK * p50:
        log.warning(
            "%s ran %s at %.0f%% of its FLOP floor: the matmul rate (size %d) was measured too low for this machine "
            "(busy, or --matmul_size too small), so the floor fractions overstate",
            method,
            workload.name,
            100 * floor / p50,
            size,
        )


def _write_json(result: dict[str, Any], out: Path) -> None:
    """``bench.json``, written whole (:func:`distill.core.output_files.write_whole`); ``complete`` is false until
    every method has been timed."""
    write_whole(out / "bench.json", json.dumps(result, indent=2) + "\n")


def profile_path(out: Path, method: str, workload: str) -> Path:
    """The profile file of a (method, workload): ``<out>/profile/<method>-<workload>.txt``, in safe characters."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{method}-{workload}").strip("_")
    return out / "profile" / f"{name}.txt"


def run_bench(config: BenchConfig, command: str | None = None) -> dict[str, Any]:
    """Time every method on every workload; write and return the result (see :mod:`distill.bench.report`).

    ``bench.json`` is rewritten after each method, so a run that fails part-way keeps what it measured.

    ``command`` is the command line recorded with the result.
    """

    device = resolve_device(config.device)
    if config.threads:
        torch.set_num_threads(config.threads)
    if not config.random_weights and not config.student:
        raise InputError("--student is required (a run, export or HF folder), unless --random-weights is given")
    with tempfile.TemporaryDirectory(prefix="cis-distill-bench-") as scratch:
        given = None if config.random_weights else student_folder(config.student)
        out = default_output(config, given, device)
        source = shipped(config.input, "input") if config.input == DEFAULT_INPUT else config.input
        qrels = config.qrels or qrels_beside(source)
        # Before any work or model: a file there, a folder that takes no file, an input or inside one.
        inputs = [("student", given), ("input", source), ("qrels", qrels), ("peer_student", config.peer_student)]
        output_folder(out, "bench", "output", inputs)
        if given is not None:
            _check_student_files(given)
        folder = given or _random_student(config, Path(scratch))
        try:
            data = load_candidates(source, qrels=qrels)
        except RunWithoutTexts:  # bench has no --queries or --corpus: the loader's hint would not work
            raise InputError(f"{source}: a TREC run has no texts; give bench candidates with theirs") from None
        tokenizer = load_tokenizer(folder)
        limit = model_max_length(folder, tokenizer)
        if config.max_length is not None and config.max_length > limit:  # every student method would be skipped
            raise InputError(f"max_length: {config.max_length} is over the model's {limit} ({folder})")
        workloads = _workloads(config, data, tokenizer)
        loaders, skipped, references = _students(config, folder, device, Path(scratch))
        quality = QualitySet.of(data) if config.quality else None
        if config.quality and quality is None:
            skipped["nDCG@10"] = (
                f"no query of {source} is judged ({qrels or 'no qrels'}): give --qrels, or --quality false"
            )
        if config.teacher_model is not None:
            loaders.append(("teacher", partial(_teacher, config, device)))
        rate_dtype = compute_dtype(device)
        size = config.matmul_size or MATMUL_SIZE[device.type]
        rates = {FLOAT: matmul_flops_per_s(device, rate_dtype, size, 10)}
        if device.type == "cpu":
            rates[INT8] = int8_matmul_ops_per_s(size, 10, config.threads or 0)
            rates[BF16] = rates[FLOAT]
            if {"avx512_bf16", "amx_bf16"} & CpuFeatures.read(CPUINFO).flags:  # this machine's, whatever the profile
                rates[BF16] = max(rates[FLOAT], matmul_flops_per_s(device, torch.bfloat16, size, 10))
        result = {
            "command": command,
            "config": asdict(config),
            "environment": environment(device, rate_dtype),
            "matmul": {
                "dtype": dtype_name(rate_dtype),
                "flops_per_s": rates[FLOAT],
                "int8_ops_per_s": rates.get(INT8),
                "bf16_flops_per_s": rates.get(BF16),
            },
            "student": {
                "name": f"random {config.student or PAPER_STUDENT}" if config.random_weights else str(config.student),
                "folder": None if config.random_weights else str(folder),
            },
            "skipped": skipped,
            "workloads": [
                {
                    "name": w.name,
                    "calls": [
                        {"qid": c.qid, "pairs": len(c.passages), "passage_tokens": c.passage_tokens} for c in w.calls
                    ],
                }
                for w in workloads
            ],
            "cells": [],
            "settings": {},
            "scores": {},
            "quality": None
            if quality is None
            else {
                "qrels": str(qrels),
                "queries": len(quality.candidates),
                "reference": REFERENCE,
                "references": references,
                "ndcg10": {},
            },
            "complete": False,
        }
        out.mkdir(parents=True, exist_ok=True)
        for stale in ("bench.csv", "bench.png"):  # an earlier run's, which this run's bench.json no longer matches
            (out / stale).unlink(missing_ok=True)
        # one method in memory at a time; a CPU cell's peak RSS is the process's, which keeps what earlier methods
        # left to its allocators (--backends NAME alone measures a method's own)
        for name, load in loaders:
            try:
                method = load()
            except (ImportError, ValueError) as e:  # no sentence-transformers or optimum, no CUDA provider, ...
                if isinstance(e, ImportError) and config.backends is not None:
                    raise InputError(f"--backends {name}: {str(e).splitlines()[0]}") from e
                if config.backends is not None or name == "teacher":
                    raise
                skipped[name] = str(e).splitlines()[0]
                continue
            result["settings"][method.name] = method.settings
            for workload in workloads:
                log.info("timing %s on %s", method.name, workload.name)
                profile = profile_path(out, method.name, workload.name) if config.profile else None
                cell = time_method(
                    method, workload, device, config.warmup, config.repeats, config.max_seconds, rates, profile
                )
                result["cells"].append(cell.to_json())
                _warn_if_truncated(method.name, workload, cell.tokens_fed_per_call)
                _warn_if_below_the_floor(method.name, workload, cell.flop_floor_s, cell.p50_s, size)
            if config.scores and method.role != "teacher":
                result["scores"][method.name] = {
                    w.name: [[float(x) for x in method.score(c.query, c.passages)] for c in w.calls] for w in workloads
                }
            if quality is not None and method.role != "teacher":
                log.info("nDCG@10 of %s on %d judged queries", method.name, len(quality.candidates))
                result["quality"]["ndcg10"][method.name] = quality.ndcg10(method)
            _write_json(result, out)  # a later method that fails loses none of the figures already taken
            del method
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    asked = [
        name for name in [*(name for name, _ in loaders), *skipped] if name.split("+")[0] in (*STUDENT_BACKENDS, AUTO)
    ]
    if asked and not any(cell["role"] == "student" for cell in result["cells"]):  # the baseline alone, exit 0
        reasons = "; ".join(f"{name}: {why}" for name, why in skipped.items() if name in asked) or "none loaded"
        raise InputError(f"no method of the student could be timed ({reasons})")
    result["complete"] = True
    _write_json(result, out)
    report.write_csv(result, out / "bench.csv")
    report.plot(result, out / "bench.png")
    result["output"] = str(out)
    return result
