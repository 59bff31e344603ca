"""The GPU suite: the three stages' benchmarks in one command, and one summary of every figure against its target.

    python -m benchmarks.gpu_suite              # on a GPU: the full shapes, under 8 minutes on an H100
    python -m benchmarks.gpu_suite --tiny       # tiny configs, in seconds (the default where there is no GPU)

It runs, in one process and in this order:

1. the teacher: :mod:`benchmarks.teacher_throughput` with ``--random_config llama3-8b`` (tiny: ``tiny``,
   1 query's first 24 candidates), the stage against the naive and the plain batched loop, its own JSON;
2. training: :mod:`benchmarks.train_throughput` on ``distill train --config configs/train/bert-large-gpu.yaml``
   as it stands (the GPU config's data, budget, padding multiple, compile, unpadding, loader workers, clipping and
   learning rate), with random weights (``--model.random_init true``: offline, the shapes are what is timed) and
   pairs cut at 256 tokens (``--data.max_length 256``, the length the plain loop pads every pair to; a handful of
   DL pairs are longer); tiny: ``tiny-bert`` at a small budget, eager, on the same config; its own JSON;
3. reranking: ``distill bench --random_weights true`` with the student's torch fp16 (on a CPU: fp32) with its
   defaults (on a GPU: unpadded, replayed from CUDA graphs), the same without the graphs (``+cuda_graphs=false``),
   padded (``+unpad=false``; on a CPU, where padded is the default, unpadded: ``+unpad``) and with tokenisation
   overlapped (``+overlap=50``), and on a GPU torch fp32 without and with TF32 (``+tf32``), against
   sentence-transformers' ``CrossEncoder.predict`` (no teacher; ``--rerank_backends`` replaces the list, e.g. to add
   ``torch-fp16+compile``), its own ``bench.json`` (with every method's scores), ``bench.csv`` and ``bench.png``.
   The tokenizer runs in parallel (``TOKENIZERS_PARALLELISM=true`` for this stage, whatever the environment says),
   as in a user's process, and each method's scores are held to the padded path's within the export's parity
   bound for the dtype;
4. serving: :mod:`benchmarks.load` against ``distill serve`` with its default flags on a student of random weights
   (bert-large, served in fp16 on a GPU; tiny: ``tiny-bert`` in fp32 on the CPU): batched, one request at a time
   (``--batching false``) and sentence-transformers' ``CrossEncoder.predict`` behind the same app, at 10 and 100
   documents a request and concurrency 1, 8 and 32 (tiny: 10 documents, concurrency 1 and 4), its own
   ``serve.json``, ``serve.md`` and ``serve.png``;

then writes ``summary.json``: every figure with its target and whether it is met (targets are for the full shapes
on an H100: a tiny run leaves ``met`` null). With ``--profile``, each stage then runs again, short, under
``torch.profiler`` (its timed phase only: the teacher's batches, training's timed steps, the reranker's timed
calls), into ``<out>/profile/``: a key-averages table and the time by kernel category per stage
(:mod:`distill.bench.profile`), summarised in ``summary.json``'s ``profiles``. A stage that fails is reported (its
error, in the summary and on stderr) and the others still run; the exit status is 1 if any stage failed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import RESULTS, phases, teacher_throughput, train_throughput
from benchmarks.phases import Column, display_path, free_memory, table
from distill.bench import report
from distill.bench.methods import BASELINE
from distill.core.devices import device_type, resolve_device
from distill.core.schema import InputError
from distill.export.parity import SCORE_BOUNDS
from distill.serving.backends import NAMED_BACKENDS

RERANK_TARGET_S = 0.025
"""Target: bert-large fp16 reranks 100 candidates in at most this many seconds, tokenisation included."""
SUITE_TARGET_S = 480.0
"""Target: the whole suite in under 8 minutes on an H100."""
RERANK_WORKLOAD = "100 candidates"
RERANK_OVERLAP = 50
"""Pairs per span tokenised ahead in the suite's overlapped run: a query's 100 candidates in two spans, the second
encoded while the first runs (a guess to measure: more spans hide more tokenisation but cut the batch)."""
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"
"""The variable by which Hugging Face's Rust tokenizers encode a batch in parallel or on one thread."""
SERVE_BATCHED_TARGETS = {(10, 8): 2.0, (100, 32): 1.2}
"""Targets on a GPU: the batched server's throughput over one request at a time's, at (documents a request,
concurrency)."""
SERVE_P99_TARGET = 1.5
"""Target on a GPU: each batched cell's p99 latency at most this many times its p50."""
SERVE_STUDENT = "bert-large-uncased"
"""The serving stage's student architecture (random weights), on a GPU."""
TRAIN_MAX_LENGTH = 256
"""Tokens per pair in the training benchmark: the plain loop pads every pair to it, as the H100 reference loop
did; the stage cuts the few longer pairs there too, so that both phases train on the same tokens."""


@dataclass
class GpuSuite:
    """The GPU suite: the teacher's, training's and reranking's benchmarks, and one summary against the targets."""

    tiny: bool = False
    """Tiny configs (the default where CUDA is not available)."""
    device: str = "auto"
    """``auto`` (cuda where there is one), ``cpu`` or ``cuda[:N]``."""
    only: list[str] = field(default_factory=lambda: ["teacher", "train", "rerank", "serve"])
    """The stages to run, of ``teacher``, ``train``, ``rerank``, ``serve``."""
    out: str | None = None
    """The result folder (default ``benchmarks/results/gpu-suite-<device>[-tiny]``)."""
    profile: bool = False
    """After the timed stages, run each again, short, under ``torch.profiler``: ``<out>/profile/`` (not counted in
    the suite's time)."""
    rerank_backends: str | None = None
    """``distill bench --backends`` of the rerank stage (default: the student's fp16 on a GPU, fp32 on a CPU, the
    same +cuda_graphs=false (on a GPU), +unpad=false (on a CPU: +unpad) and +overlap=50, on a GPU torch-fp32 and
    torch-fp32+tf32,
    and st-crossencoder)."""

    def __post_init__(self) -> None:
        if unknown := sorted(set(self.only) - set(STAGES)):
            raise InputError(f"--only: unknown stage(s) {unknown}, of {list(STAGES)}")


# ----------------------------------------------------------------------------- the stages


def teacher_argv(args: GpuSuite, out: Path) -> list[str]:
    shapes = ["--random_config", "llama3-8b"]
    if args.tiny:
        shapes = ["--random_config", "tiny", "--max_queries", "1", "--max_candidates", "24", "--naive_pairs", "2"]
        shapes += ["--plain_pairs", "8", "--plain_batch_size", "4"]
    small = ["--matmul_size", "128", "--matmul_reps", "2"] if args.tiny else []
    return [*shapes, *small, "--device", args.device, "--progress", "false", "--out", str(out / "teacher.json")]


def train_argv(args: GpuSuite, out: Path) -> list[str]:
    """The training benchmark's arguments: its own, then after ``--`` ``distill train``'s on the GPU config (tiny: a
    tiny model at a small budget, eager, no loader workers), on the suite's device."""
    steps = ["--warmup_steps", "2", "--steps", "2", "--matmul_size", "128", "--matmul_reps", "2"] if args.tiny else []
    steps = steps or ["--warmup_steps", "10", "--steps", "30"]
    train = ["--config", display_path(train_throughput.GPU_CONFIG), "--model.random_init", "true"]
    if args.tiny:
        train += ["--model.backbone", "tiny-bert", "--model.compile", "false", "--data.max_batch_tokens", "2048"]
        train += ["--data.max_length", "128", "--data.num_workers", "0"]
    else:
        train += ["--data.max_length", str(TRAIN_MAX_LENGTH)]
    device = torch.device(args.device)  # resolved already: cpu, cuda or cuda:N
    if device.type == "cpu":
        train += ["--trainer.accelerator", "cpu", "--trainer.precision", "32-true"]
    elif device.index is not None:
        train += ["--trainer.devices", f"[{device.index}]"]
    return [*steps, "--out", str(out / "student-train.json"), "--", *train]


def rerank_argv(args: GpuSuite, out: Path) -> list[str]:
    """``distill bench`` arguments: the student's fp16 (fp32 on a CPU) and its levers against CrossEncoder.predict,
    no teacher."""
    argv = ["bench", "--random_weights", "true", "--teacher", "none", "--quality", "false", "--scores", "true"]
    argv += ["--backends", rerank_backends(args), "--device", args.device]
    if args.tiny:
        argv += ["--student", "tiny-bert", "--token_counts", "[100]", "--rerank_queries", "1"]
        argv += ["--warmup", "1", "--repeats", "1", "--matmul_size", "128"]
    else:
        argv += ["--rerank_queries", "3", "--max_seconds", "3"]
    return [*argv, "--output", str(out / "bench")]


def rerank_backend(args: GpuSuite) -> str:
    """The student's backend the rerank target is for: fp16 on a GPU, fp32 on a CPU."""
    return "torch-fp16" if device_type(args.device) == "cuda" else "torch-fp32"


def other_path(args: GpuSuite) -> str:
    """The lever that gives the target backend the path its defaults do not take: ``+unpad=false`` on a GPU (the
    default is unpadded there), ``+unpad`` on a CPU."""
    return "+unpad=false" if device_type(args.device) == "cuda" else "+unpad"


def padded_method(args: GpuSuite) -> str:
    """The target backend's padded path, which every method's scores are held to: ``+unpad=false`` on a GPU, the default
    on a CPU."""
    backend = rerank_backend(args)
    return backend + other_path(args) if device_type(args.device) == "cuda" else backend


def rerank_backends(args: GpuSuite) -> str:
    """The rerank stage's methods: ``--rerank_backends``, else the target's backend with its defaults, on a GPU the
    same without CUDA graphs, its other path (padded on a GPU, unpadded on a CPU), tokenisation overlapped, on a GPU
    fp32 without and with TF32, and CrossEncoder.predict."""
    if args.rerank_backends:
        return args.rerank_backends
    backend = rerank_backend(args)
    gpu = device_type(args.device) == "cuda"
    levers = ["+cuda_graphs=false", other_path(args)] if gpu else [other_path(args)]
    fp32 = ["torch-fp32", "torch-fp32+tf32"] if gpu else []
    return ",".join([backend, *(backend + lever for lever in [*levers, f"+overlap={RERANK_OVERLAP}"]), *fp32, BASELINE])


def run_teacher(args: GpuSuite, out: Path, extra: Sequence[str] = ()) -> tuple[list[str], int]:
    argv = [*teacher_argv(args, out), *extra]
    return ["python", "-m", "benchmarks.teacher_throughput", *argv], teacher_throughput.main(argv)


def run_train(args: GpuSuite, out: Path, extra: Sequence[str] = ()) -> tuple[list[str], int]:
    argv = train_argv(args, out)
    argv[argv.index("--") : argv.index("--")] = extra  # the benchmark's own options, before distill train's
    return ["python", "-m", "benchmarks.train_throughput", *argv], train_throughput.main(argv)


def overridden(argv: list[str], extra: Sequence[str]) -> list[str]:
    """``argv`` (a command, then ``--flag value`` pairs) without the flags that ``extra`` sets again: ``distill``
    refuses a list flag given twice."""
    again = {flag for flag in extra if flag.startswith("--")}
    pairs = zip(argv[1::2], argv[2::2], strict=True)
    return [argv[0], *(item for flag, value in pairs if flag not in again for item in (flag, value))]


def run_rerank(args: GpuSuite, out: Path, extra: Sequence[str] = ()) -> tuple[list[str], int]:
    from distill.cli import main as distill

    argv = [*overridden(rerank_argv(args, out), extra), *extra]
    with parallel_tokenizer():
        return ["distill", *argv], distill(argv)


def serve_student(args: GpuSuite, out: Path) -> Path:
    """The serving stage's student: random weights of :data:`SERVE_STUDENT` (tiny: ``tiny-bert``), seed 0, saved as
    a Hugging Face folder under ``out`` (made once)."""
    from students.model import build_student, save_student

    folder = out / "serve-student"
    if not (folder / "config.json").is_file():
        torch.manual_seed(0)
        model, tokenizer = build_student("tiny-bert" if args.tiny else SERVE_STUDENT, random_init=True)
        save_student(model, tokenizer, folder, None)
    return folder


def serve_argv(args: GpuSuite, out: Path, student: Path) -> list[str]:
    """:mod:`benchmarks.load`'s arguments: ``distill serve`` with its default flags on the torch backend (fp16 on a
    GPU), on the suite's device, against one request at a time and ``CrossEncoder.predict``."""
    gpu = device_type(args.device) == "cuda"
    serve = ["--device", args.device] + (["--dtype", "float16"] if gpu else [])
    argv = ["run", "--model", str(student), "--backend", "torch", "--serve-args", " ".join(serve)]
    argv += ["--robustness", "0", "--out", str(out / "serve")]
    if args.tiny:
        argv += ["--documents", "10", "--requests", "8", "--concurrency", "1,4", "--peer-concurrency", "1"]
        argv += ["--peer-requests", "4", "--warmup", "1", "--queries", "2"]
    else:
        argv += ["--requests", "512,96", "--peer-requests", "64,16", "--peer-concurrency", "1,8"]
    return argv


def run_serve(args: GpuSuite, out: Path, extra: Sequence[str] = ()) -> tuple[list[str], int]:
    from benchmarks import load

    argv = [*serve_argv(args, out, serve_student(args, out)), *extra]
    return ["python", "-m", "benchmarks.load", *argv], load.main(argv)


@contextmanager
def parallel_tokenizer() -> Iterator[None]:
    """A context in which fast tokenizers encode in parallel, as in a user's process: ``TOKENIZERS_PARALLELISM=true``
    (the GPU recipe's environment sets it false for the training stage's forked loader workers); its previous value
    after. The Rust tokenizer reads the variable at each call, and only a process forked after parallel use is
    turned to one thread, so the stages after it are as before."""
    before = os.environ.get(TOKENIZERS_PARALLELISM)
    os.environ[TOKENIZERS_PARALLELISM] = "true"
    try:
        yield
    finally:
        if before is None:
            del os.environ[TOKENIZERS_PARALLELISM]
        else:
            os.environ[TOKENIZERS_PARALLELISM] = before


STAGES: dict[str, Callable[[GpuSuite, Path, Sequence[str]], tuple[list[str], int]]] = {
    "teacher": run_teacher,
    "train": run_train,
    "rerank": run_rerank,
    "serve": run_serve,
}


# ----------------------------------------------------------------------------- the profiles

PROFILE_ARGV: dict[str, list[str]] = {
    "teacher": ["--max_queries", "1", "--naive_pairs", "1", "--plain_pairs", "0", "--matmul_reps", "1"],
    "train": ["--warmup_steps", "3", "--steps", "5", "--matmul_reps", "1"],
    "rerank": ["--token_counts", "[]", "--rerank_queries", "1", "--warmup", "1", "--repeats", "3"],
}
"""Each stage's arguments for its profile run, after its own (the later flag wins): a few batches or steps of the
same shapes and levers, the baselines cut to the least each benchmark takes."""


def profile_argv(name: str, args: GpuSuite, folder: Path) -> list[str]:
    """The arguments that make stage ``name``'s benchmark a short run recording its stage with ``torch.profiler``
    into ``folder`` (the teacher's and training's: ``profile-<stage>.txt``; the rerank's: ``bench/profile/``, one
    file per method, for the target's backend with its defaults and its other path: padded on a GPU, unpadded on a
    CPU)."""
    if name == "rerank":
        backend = rerank_backend(args)
        return [*PROFILE_ARGV[name], "--backends", f"{backend},{backend}{other_path(args)}", "--profile", "true"]
    return [*PROFILE_ARGV[name], "--profile", str(folder / f"profile-{name}.txt")]


def run_profile(name: str, args: GpuSuite, out: Path) -> dict[str, Any]:
    """Stage ``name`` run again, short, under ``torch.profiler`` (after the timed suite: the profiler slows what it
    records); its files go to ``<out>/profile/``. Returns each profile's summary (:mod:`distill.bench.profile`), or
    the error that stopped it."""
    folder = out / "profile"
    done = run_stage(f"profile of {name}", lambda: STAGES[name](args, folder, profile_argv(name, args, folder)))
    pattern = "bench/profile/*.json" if name == "rerank" else f"profile-{name}.json"
    summaries = {display_path(path): json.loads(path.read_text()) for path in sorted(folder.glob(pattern))}
    return {**done, "profiles": summaries}


def run_stage(title: str, stage: Callable[[], tuple[list[str], int]]) -> dict[str, Any]:
    """Run ``stage`` (a benchmark's ``main``: its command and exit status), timed; a failure is recorded (its error,
    and its traceback on stderr), not raised, so that one stage's failure loses no other's figures. Returns the
    command, the seconds and the error (None where it exited 0)."""
    began = time.perf_counter()
    print(f"\n===== gpu suite: {title} =====", flush=True)
    try:
        command, code = stage()
        error = None if code == 0 else f"exit status {code}"
    except Exception as e:
        traceback.print_exc()
        command, error = None, f"{type(e).__name__}: {' '.join(str(e).split())}"
    free_memory()
    return {"command": command, "seconds": time.perf_counter() - began, "error": error}


# ----------------------------------------------------------------------------- the summary


def figure(stage: str, name: str, value: Any, target: Any, kind: str, tiny: bool, note: str = "") -> dict[str, Any]:
    """One figure against its target: ``kind`` ``min`` (value >= target), ``max`` (value <= target) or ``equal``;
    ``met`` is null where the value is missing or the run is tiny (the targets are the full shapes')."""
    met = None
    if value is not None and not tiny:
        met = {"min": value >= target, "max": value <= target, "equal": value == target}[kind]
    return {"stage": stage, "figure": name, "value": value, "target": target, "kind": kind, "met": met, "note": note}


def teacher_figures(result: dict[str, Any], tiny: bool) -> list[dict[str, Any]]:
    over_plain = result.get("speedup_over_plain_pairs_per_s")
    return [
        figure(
            "teacher",
            "flop_ceiling_fraction",
            result["teacher"]["flop_ceiling_fraction"],
            teacher_throughput.TARGET_FLOP_FRACTION,
            "min",
            tiny,
            "of the matmul ceiling in the run dtype (bf16 on a GPU)",
        ),
        figure("teacher", "pairs_per_s", result["teacher"]["pairs_per_s"], None, "min", True),
        figure(
            "teacher",
            "speedup_over_plain_batched_loop",
            over_plain,
            teacher_throughput.TARGET_OVER_PLAIN,
            "min",
            tiny,
            "pairs/s; the plain loop: padded batches, full-vocabulary log-softmax"
            if over_plain is not None
            else "the plain batched loop did not run (--plain-pairs 0)",
        ),
        figure(
            "teacher",
            "speedup_over_naive_loop",
            result["speedup_pairs_per_s"],
            teacher_throughput.TARGET_SPEEDUP,
            "min",
            tiny,
        ),
        figure("teacher", "scores_agree", result["agreement"]["ok"], True, "equal", False),
        figure(
            "teacher",
            "plain_scores_agree",
            (result.get("plain_agreement") or {}).get("ok"),
            True,
            "equal",
            False,
            "the plain batched loop's log-probabilities against the stage's",
        ),
    ]


def train_figures(result: dict[str, Any], tiny: bool) -> list[dict[str, Any]]:
    stage = result["stage"]
    return [
        figure("train", "mfu", stage["mfu"], train_throughput.TARGET_MFU, "min", tiny),
        figure("train", "samples_per_s", stage["samples_per_s"], None, "min", True),
        figure(
            "train",
            "speedup_over_plain_loop",
            result["speedup_samples_per_s"],
            train_throughput.TARGET_SPEEDUP,
            "min",
            tiny,
            "samples/s, the plain loop at the same token budget (pairs padded to max_length)",
        ),
        figure(
            "train",
            "host_syncs_in_timed_steps",
            stage.get("host_syncs"),
            0,
            "equal",
            False,
            "torch.cuda.set_sync_debug_mode; null on a CPU",
        ),
        figure("train", "same_work", result["check"]["ok"], True, "equal", False),
    ]


def rerank_figures(result: dict[str, Any], backend: str, tiny: bool) -> list[dict[str, Any]]:
    """Each student method's p50 on a query's 100 candidates and its speed-up over CrossEncoder.predict. The targets
    are for ``backend`` (the student's fp16 on a GPU) and its levers; the other precisions' figures have none. The
    target backend's speed-up keeps the plain name ``speedup_over_st_crossencoder``."""
    theirs = report.cell(result, BASELINE, RERANK_WORKLOAD)
    students = [m.removeprefix("student ") for m in report.methods(result) if m.startswith("student ")]
    figures = []
    for method in dict.fromkeys([backend, *students]):
        ours = report.cell(result, f"student {method}", RERANK_WORKLOAD)
        p50 = ours["p50_s"] if ours else None
        over_st = theirs["p50_s"] / ours["p50_s"] if ours and theirs else None
        targeted = method.split("+")[0] == backend
        levers = (result.get("settings") or {}).get(f"student {method}", {})
        note = "tokenisation included" + (f"; {_levers(levers)}" if levers else "")
        name = f"{method}_{RERANK_WORKLOAD.replace(' ', '_')}_p50_s"
        figures.append(
            figure("rerank", name, p50, RERANK_TARGET_S if targeted else None, "max", tiny or not targeted, note)
        )
        speedup = "speedup_over_st_crossencoder" if method == backend else f"{method}_speedup_over_st_crossencoder"
        figures.append(
            figure(
                "rerank",
                speedup,
                over_st,
                1.0 if targeted else None,
                "min",
                tiny or not targeted,
                "CrossEncoder.predict's p50 / ours",
            )
        )
    return figures


PARITY_BOUNDS = {"float32": SCORE_BOUNDS["onnx"], "float16": SCORE_BOUNDS["onnx-fp16"]}
"""A student dtype -> the max |Δscore| its methods may differ from its padded path by: the export's parity bound of
a file in that dtype (:data:`distill.export.parity.SCORE_BOUNDS`). bf16 has none."""


def score_figures(result: dict[str, Any], backend: str, reference: str) -> list[dict[str, Any]]:
    """The max |Δscore| of each student method of ``backend`` (its levers) from ``reference``'s scores (its padded
    path) over every call of the bench (``bench.json``'s ``scores``), against the dtype's :data:`PARITY_BOUNDS`; none
    where the reference did not run."""
    scores = result.get("scores") or {}
    want = scores.get(f"student {reference}")
    if want is None:
        return []
    bound = PARITY_BOUNDS.get(NAMED_BACKENDS[backend][1])
    figures = []
    for method, ours in scores.items():
        name = method.removeprefix("student ")
        if name in (method, reference) or name.split("+")[0] != backend:
            continue
        diff = max(float(np.abs(np.subtract(a, b)).max()) for w in want for a, b in zip(ours[w], want[w], strict=True))
        note = f"max |score - {reference}'s| over {sum(map(len, want.values()))} calls; the export's parity bound"
        figures.append(figure("rerank", f"{name}_max_abs_diff_from_padded", diff, bound, "max", False, note))
    return figures


def serve_figures(result: dict[str, Any], tiny: bool) -> list[dict[str, Any]]:
    """The serving stage's figures: batched over one at a time, and over ``CrossEncoder.predict``, per request size
    and concurrency; each batched cell's p99 / p50; lost or wrong answers."""
    from benchmarks import load

    figures = []
    for (documents, concurrency), target in SERVE_BATCHED_TARGETS.items():
        batched = load.cell(result, "batched", documents, concurrency)
        alone = load.cell(result, "one-at-a-time", documents, concurrency)
        value = batched["queries_per_s"] / alone["queries_per_s"] if batched and alone else None
        name = f"{documents} docs, concurrency {concurrency}: batched / one at a time"
        figures.append(figure("serve", name, value, target, "min", tiny or value is None))
    batched_cells = result["servers"].get("batched", {}).get("cells", [])
    for cell in batched_cells:
        peer = load.cell(result, load.PEER, cell["documents"], cell["concurrency"])
        if peer:
            name = f"{cell['documents']} docs, concurrency {cell['concurrency']}: batched / CrossEncoder.predict"
            figures.append(figure("serve", name, cell["queries_per_s"] / peer["queries_per_s"], None, "min", True))
    for cell in batched_cells:
        name = f"{cell['documents']} docs, concurrency {cell['concurrency']}: p99 / p50 (batched)"
        figures.append(figure("serve", name, cell["p99_over_p50"], SERVE_P99_TARGET, "max", tiny))
    cells = [c for s in result["servers"].values() for c in s.get("cells", [])]
    wrong = sum(c["wrong"] + c["requests"] - c["answered"] for c in cells)
    figures.append(figure("serve", "lost or wrong answers, every cell", wrong, 0, "equal", False))
    return figures


def _levers(settings: dict[str, Any]) -> str:
    """A student method's settings that differ from the plain path's, in a few words."""
    levers = ("overlap", "tf32", "compile", "cudnn_attention", "cuda_graphs")
    shown = {k: v for k, v in settings.items() if k in levers and v}
    shown["attention"] = settings.get("attention")
    shown["max_batch_tokens"] = settings.get("max_batch_tokens")
    return ", ".join(f"{k} {v}" for k, v in shown.items() if v is not None)


def figures_of(stage: str, out: Path, args: GpuSuite) -> list[dict[str, Any]]:
    """The figures of a stage that ran, from the JSON it wrote."""
    if stage == "teacher":
        return teacher_figures(json.loads((out / "teacher.json").read_text()), args.tiny)
    if stage == "train":
        return train_figures(json.loads((out / "student-train.json").read_text()), args.tiny)
    if stage == "serve":
        return serve_figures(json.loads((out / "serve" / "serve.json").read_text()), args.tiny)
    result = json.loads((out / "bench" / "bench.json").read_text())
    backend = rerank_backend(args)
    return [*rerank_figures(result, backend, args.tiny), *score_figures(result, backend, padded_method(args))]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.gpu_suite ARGS``; its exit status."""
    return phases.main(GpuSuite, run, "benchmarks.gpu_suite", argv)


def run(args: GpuSuite, invocation: dict[str, Any]) -> int:
    """Run the stages (then their profiles), write ``summary.json`` and print it; 1 if any stage failed."""
    device = resolve_device(args.device)
    args = dataclasses.replace(args, device=str(device), tiny=args.tiny or device.type != "cuda")
    out = Path(args.out) if args.out else RESULTS / f"gpu-suite-{device.type}{'-tiny' if args.tiny else ''}"
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    stages: dict[str, Any] = {}
    figures: list[dict[str, Any]] = []

    def measured(name: str) -> tuple[list[str], int]:
        """Stage ``name``, then its figures from the files it wrote (also where it exited 1 on a failed check)."""
        command, code = STAGES[name](args, out, ())
        figures.extend(figures_of(name, out, args))
        return command, code

    for name in args.only:
        stages[name] = run_stage(name, partial(measured, name))
    seconds = time.perf_counter() - start
    if set(args.only) == set(STAGES):
        figures.append(figure("suite", "seconds", seconds, SUITE_TARGET_S, "max", args.tiny, "every stage"))
    profiled = [name for name in args.only if name in PROFILE_ARGV]  # serving's time is the server's: no profile
    profiles = {name: run_profile(name, args, out) for name in profiled} if args.profile else {}
    summary = {
        "benchmark": "gpu_suite",
        **invocation,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "tiny": args.tiny,
        "targets_for": "the full shapes on an H100 (Llama-3-8B teacher, bert-large student); null met when tiny",
        "seconds": seconds,
        "stages": stages,
        "figures": figures,
        "profiles": profiles,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(summary_report(summary))
    print(f"\nwrote {display_path(out)}/summary.json")
    failed = [*stages.values(), *profiles.values()]
    return 1 if any(s["error"] for s in failed) else 0


MARKS = {True: "met", False: "NOT MET", None: "-"}
FIGURE_COLUMNS = (
    Column("stage", -8, lambda f: f["stage"]),
    Column("figure", -40, lambda f: f["figure"]),
    Column("value", 12, lambda f: f"{f['value']:.4g}" if isinstance(f["value"], float) else str(f["value"])),
    Column("target", -12, lambda f: "" if f["target"] is None else f"{SIGNS[f['kind']]} {f['target']}"),
    Column("", -8, lambda f: MARKS[f["met"]]),
    Column("note", -1, lambda f: f["note"]),
)
SIGNS = {"min": ">=", "max": "<=", "equal": "=="}


def summary_report(summary: dict[str, Any]) -> str:
    """The summary for a reader: each stage's time and status, every figure against its target, the profiles."""
    lines = [
        f"\n===== gpu suite on {summary['device_name']}{' (tiny)' if summary['tiny'] else ''}: "
        f"{summary['seconds']:.0f} s =====",
        *(
            f"{name:<8} {stage['seconds']:>7.1f} s  {'ok' if stage['error'] is None else 'FAILED: ' + stage['error']}"
            for name, stage in summary["stages"].items()
        ),
        table(summary["figures"], FIGURE_COLUMNS),
    ]
    for name, done in summary["profiles"].items():
        if done["error"] is not None:
            lines.append(f"profile of {name}: FAILED: {done['error']}")
        for path, profile in done["profiles"].items():
            shares = ", ".join(f"{k} {v:.0%}" for k, v in profile["by_category_share"].items())
            busy = "" if profile["busy_fraction"] is None else f"device busy {profile['busy_fraction']:.0%}; "
            lines.append(f"profile {path}: {busy}{shares}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
