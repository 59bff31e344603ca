"""``distill run``: teach -> train -> export -> bench -> eval in one command, from one YAML file.

Everything goes under ``<root>/<name>/``::

    teacher/            the teacher's triplets (distill teach)
    student/            the training run (distill train): checkpoints/, hf/, logs/
    student/export/     ONNX / TorchScript files with their parity card (distill export)
    student/bench/      bench.json, bench.csv, bench.png (distill bench)
    eval/               the runs and eval.json (BM25, every teacher score, the student; distill eval)
    summary.json        the final table
    stages/<stage>.json the key each stage last finished with

A stage is skipped when its output is there and its key matches: the key hashes the stage's own options and
the keys of the stages it reads, so changing the teacher's options reruns everything after it, and changing
only the bench's options reruns the bench alone.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from distill.core.config import read_yaml_mapping
from distill.core.schema import InputError, RerankingData

log = logging.getLogger(__name__)

STAGES = ("teach", "train", "export", "bench", "eval")


@dataclass
class ExportOptions:
    formats: list[str] = field(default_factory=lambda: ["onnx", "torchscript"])
    fp16: bool = False
    int8: bool = True
    parity_input: str | None = None
    """Candidates of the parity check (default the eval input)."""
    parity_queries: int = 2
    parity_depth: int = 32
    ranking_queries: int | None = None
    """Judged queries of the int8 nDCG@10 bound (default all of the parity input's)."""


@dataclass
class EvalOptions:
    input: str | list[str] | None = None
    """Candidates to rerank, one input or several joined (default the teacher's inputs)."""
    qrels: str | None = None
    queries: str = "held_out"
    """``held_out`` (the student's validation queries) or ``all`` (every judged query the teacher scored)."""
    backend: str = "onnx"
    """The student backend of the eval run (``torch``, ``onnx``, ``torchscript``)."""
    dtype: str | None = None
    device: str = "cpu"
    metrics: list[str] = field(default_factory=lambda: ["nDCG@1", "nDCG@5", "nDCG@10", "RR@10"])


@dataclass
class PipelineConfig:
    """A ``distill run`` YAML: a name and one section per stage."""

    name: str
    teach: dict[str, Any] | str
    """``distill teach`` options, or a ``distill teach`` YAML file (``output`` is set by the pipeline)."""
    train: dict[str, Any]
    """``configs``: ``distill train`` YAML files, composed in order; ``args``: overrides, ``{"model.lr": 1e-4}``."""
    export: ExportOptions = field(default_factory=ExportOptions)
    bench: dict[str, Any] = field(default_factory=dict)
    """``distill bench`` options (``student`` and ``output`` are set by the pipeline)."""
    eval: EvalOptions = field(default_factory=EvalOptions)
    root: str = "checkpoints"

    @property
    def folder(self) -> Path:
        return Path(self.root) / self.name


def load_pipeline(path: str | Path) -> PipelineConfig:
    """Read a pipeline YAML; unknown sections or options raise :class:`InputError` naming the file and the key."""
    path = Path(path)
    raw = read_yaml_mapping(path)
    known = {f.name for f in PipelineConfig.__dataclass_fields__.values()}
    if unknown := sorted(set(raw) - known):
        raise InputError(f"{path}: unknown section(s) {unknown}; known: {sorted(known)}")
    for key in ("name", "teach", "train"):
        if key not in raw:
            raise InputError(f"{path}: missing {key!r}")
    if isinstance(raw["teach"], str):
        if not Path(raw["teach"]).is_file():
            raise InputError(f"{path}: teach: no such config file {raw['teach']}")
        raw["teach"] = read_yaml_mapping(raw["teach"])
    sections: dict[str, Any] = {}
    for key, cls in (("export", ExportOptions), ("eval", EvalOptions)):
        given = raw.get(key) or {}
        fields = set(cls.__dataclass_fields__)
        if unknown := sorted(set(given) - fields):
            raise InputError(f"{path}: {key}: unknown option(s) {unknown}; known: {sorted(fields)}")
        sections[key] = cls(**given)
    if unknown := sorted(set(raw["train"]) - {"configs", "args"}):
        raise InputError(f"{path}: train: unknown key(s) {unknown}; known: ['args', 'configs']")
    if raw["eval"] and raw["eval"].get("queries", "held_out") not in ("held_out", "all"):
        raise InputError(f"{path}: eval.queries must be 'held_out' or 'all'")
    return PipelineConfig(**{**raw, **sections})


# ----------------------------------------------------------------------------- stage bookkeeping


def _key(options: Any, upstream: list[str]) -> str:
    text = json.dumps({"options": options, "upstream": upstream}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Stage:
    name: str
    key: str
    output: Path
    """The file or folder whose presence says the stage finished."""


class Runner:
    """Runs stages in order, skipping those whose output is there with the same key."""

    def __init__(self, folder: Path, force: set[str]) -> None:
        self.folder = folder
        self.force = force

    def stamp(self, stage: str) -> Path:
        return self.folder / "stages" / f"{stage}.json"

    def up_to_date(self, stage: Stage) -> bool:
        if stage.name in self.force or not stage.output.exists() or not self.stamp(stage.name).is_file():
            return False
        return json.loads(self.stamp(stage.name).read_text()).get("key") == stage.key

    def run(self, stage: Stage, work: Callable[[], None]) -> None:
        if self.up_to_date(stage):
            print(f"[{stage.name}] up to date: {stage.output}")
            return
        print(f"[{stage.name}] running -> {stage.output}")
        self.stamp(stage.name).unlink(missing_ok=True)
        work()
        self.stamp(stage.name).parent.mkdir(parents=True, exist_ok=True)
        finished = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.stamp(stage.name).write_text(json.dumps({"key": stage.key, "finished": finished}) + "\n")


# ----------------------------------------------------------------------------- the stages


def _teach(config: PipelineConfig, runner: Runner) -> Stage:
    from distill.stages.teach import TeachConfig, run_teach

    options = {**config.teach, "output": str(config.folder / "teacher")}
    teach = TeachConfig(**options)
    stage = Stage("teach", _key(asdict(teach), []), Path(teach.output))
    runner.run(stage, lambda: run_teach(teach))
    return stage


def _train(config: PipelineConfig, runner: Runner, teach: Stage) -> Stage:
    from distill.stages.train import run_train

    configs = [str(c) for c in config.train.get("configs", [])]
    args = dict(config.train.get("args") or {})
    options = {"configs": [Path(c).read_text() for c in configs], "args": args}
    run = config.folder / "student"
    stage = Stage("train", _key(options, [teach.key]), run / "hf" / "config.json")

    def work() -> None:
        if run.exists():  # a fresh run: old checkpoints belong to other options
            shutil.rmtree(run)
        argv = [arg for c in configs for arg in ("--config", c)]
        argv += ["--run_name", "student", "--checkpoint_root", str(config.folder)]
        argv += ["--data.teacher_data", json.dumps([str(teach.output)])]
        for key, value in args.items():
            argv += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
        run_train(argv)
        if not stage.output.is_file():
            raise RuntimeError(f"training wrote no student to {run / 'hf'}")

    runner.run(stage, work)
    return stage


def _export(config: PipelineConfig, runner: Runner, train: Stage, eval_input: list[str]) -> Stage:
    from distill.backend.export import export_student
    from distill.backend.parity import ParitySet

    options = asdict(config.export)
    out = config.folder / "student" / "export"
    stage = Stage("export", _key(options, [train.key]), out / "card.json")

    def work() -> None:
        e = config.export
        data = load_eval_data([e.parity_input] if e.parity_input else eval_input, config.eval.qrels)
        parity = ParitySet.from_data(data, e.parity_queries, e.parity_depth, e.ranking_queries)
        report = export_student(train.output.parent, out, tuple(e.formats), e.fp16, e.int8, parity)
        for p in report.parity:
            shown = "" if p.max_abs_diff is None else f" max |Δscore| {p.max_abs_diff:.2g}"
            ndcg = f" nDCG@10 {p.ndcg10['pytorch']:.2f} -> {p.ndcg10[p.format]:.2f}" if p.ndcg10 else ""
            print(f"  {p.format}:{shown}{ndcg}{p.not_checked or ''}")

    runner.run(stage, work)
    return stage


def _bench(config: PipelineConfig, runner: Runner, export: Stage) -> Stage:
    from distill.bench.run import BenchConfig, run_bench

    out = config.folder / "student" / "bench"
    bench = BenchConfig(**{**config.bench, "student": str(export.output.parent), "output": str(out)})
    stage = Stage("bench", _key(asdict(bench), [export.key]), out / "bench.json")
    runner.run(stage, lambda: run_bench(bench, f"distill run (bench stage of {config.name})"))
    return stage


def _eval(config: PipelineConfig, runner: Runner, teach: Stage, export: Stage, eval_input: list[str]) -> Stage:
    options = asdict(config.eval)
    out = config.folder / "eval"
    stage = Stage("eval", _key({**options, "input": eval_input}, [teach.key, export.key]), out / "eval.json")
    runner.run(stage, lambda: evaluate_pipeline(config, teach.output, export.output.parent, eval_input, out))
    return stage


def load_eval_data(inputs: list[str], qrels: str | None) -> RerankingData:
    """The candidates of ``inputs`` joined, with ``qrels`` (a file) or their own judgements."""
    from distill.core.loaders import load_candidates

    return RerankingData.union([load_candidates(path, qrels=qrels) for path in inputs])


def evaluate_pipeline(config: PipelineConfig, teacher: Path, student: Path, eval_input: list[str], out: Path) -> None:
    """Rerank the eval queries with the student; evaluate the first stage, every teacher score and the student."""
    from distill.core.eval_report import evaluate_runs, format_table, to_json
    from distill.core.metrics import default_rel_level
    from distill.core.runs import read_trec_run, write_trec_run
    from distill.serving.reranker import Reranker
    from students.model import held_out_queries

    e = config.eval
    data = load_eval_data(eval_input, e.qrels)
    teacher_runs = {f"teacher {f.stem}": read_trec_run(f) for f in sorted((teacher / "runs").glob("*.trec"))}
    teacher_runs.pop("teacher first_stage", None)
    scored = set().union(*(run.keys() for run in teacher_runs.values()))
    queries = held_out_queries(student) if e.queries == "held_out" else scored
    candidates = [c for c in data.candidates if c.query.qid in queries and c.query.qid in data.qrels]
    if not candidates:
        raise InputError(f"{eval_input}: none of the eval queries ({e.queries}) is judged")
    qrels = {c.query.qid: data.qrels[c.query.qid] for c in candidates}
    reranker = Reranker.load(student, e.backend, e.device, e.dtype)
    student_run = {}
    for c in candidates:
        scores = reranker.score(c.query.text, [p.text for p in c.passages])
        student_run[c.query.qid] = dict(zip((p.docid for p in c.passages), scores, strict=True))
    out.mkdir(parents=True, exist_ok=True)
    write_trec_run(out / "student.trec", student_run, tag=f"student-{e.backend}")
    first_stage = {c.query.qid: dict(zip((p.docid for p in c.passages), c.scores, strict=True)) for c in candidates}
    names = " + ".join(i.removeprefix("irds:") if i.startswith("irds:") else Path(i).stem for i in eval_input)
    runs = {f"first stage ({names})": first_stage, **teacher_runs}
    runs = {name: {q: docs for q, docs in run.items() if q in qrels} for name, run in runs.items()}
    runs[f"student ({e.backend})"] = student_run
    report = evaluate_runs(runs, qrels, e.metrics, default_rel_level(qrels), "t")
    print(format_table(report))
    record = {"input": eval_input, "queries": e.queries, "qids": sorted(qrels), **to_json(report)}
    (out / "eval.json").write_text(json.dumps(record, indent=2) + "\n")


# ----------------------------------------------------------------------------- the summary


def summarize(config: PipelineConfig) -> dict[str, Any]:
    """nDCG@10 of the first stage, every teacher score and the student; the student's latency against the
    teacher's; where every artefact is."""
    folder = config.folder
    evaluation = json.loads((folder / "eval" / "eval.json").read_text())
    bench = json.loads((folder / "student" / "bench" / "bench.json").read_text())
    from distill.bench import report

    latency: dict[str, Any] = {}
    names = report.workloads(bench)
    if "teacher cis" in report.methods(bench):
        for workload in names:
            teacher = report.cell(bench, "teacher cis", workload)
            latency[workload] = {"teacher cis": teacher["p50_s"]}
            for method in report.methods(bench):
                if method != "teacher cis" and (c := report.cell(bench, method, workload)):
                    latency[workload][method] = c["p50_s"]
    return {
        "name": config.name,
        "eval_queries": len(evaluation["qids"]),
        "nDCG@10": {run: values["nDCG@10"] for run, values in evaluation["results"].items()},
        "latency_p50_s": latency,
        "artefacts": {
            "teacher triplets": str(folder / "teacher"),
            "student (Hugging Face)": str(folder / "student" / "hf"),
            "exported student": str(folder / "student" / "export"),
            "latency benchmark": str(folder / "student" / "bench"),
            "evaluation": str(folder / "eval"),
        },
    }


def format_summary(summary: dict[str, Any]) -> str:
    n = summary["eval_queries"]
    lines = [f"== {summary['name']}: nDCG@10 on {n} evaluation {'query' if n == 1 else 'queries'} =="]
    width = max(map(len, summary["nDCG@10"]))
    lines += [f"  {run:<{width}}  {value:6.2f}" for run, value in summary["nDCG@10"].items()]
    for workload, times in summary["latency_p50_s"].items():
        teacher = times["teacher cis"]
        lines.append(f"== latency, {workload} (p50) ==")
        width = max(map(len, times))
        for method, seconds in times.items():
            speedup = "" if method == "teacher cis" else f"  {teacher / seconds:6.1f}x faster than the teacher"
            lines.append(f"  {method:<{width}}  {seconds * 1e3:9.1f} ms{speedup}")
    lines.append("== artefacts ==")
    lines += [f"  {what}: {where}" for what, where in summary["artefacts"].items()]
    return "\n".join(lines)


def run_pipeline(config: PipelineConfig, force: set[str] | None = None) -> dict[str, Any]:
    """Run every stage that is not up to date, then print and write the summary (``summary.json``)."""
    if unknown := sorted((force or set()) - {*STAGES, "all"}):
        raise InputError(f"--force: unknown stage(s) {unknown}; stages: {list(STAGES)}")
    force = set(STAGES) if force and "all" in force else (force or set())
    runner = Runner(config.folder, force)
    given = config.eval.input or config.teach.get("input") or []
    eval_input = [given] if isinstance(given, str) else list(given)
    teach = _teach(config, runner)
    train = _train(config, runner, teach)
    export = _export(config, runner, train, eval_input)
    _bench(config, runner, export)
    _eval(config, runner, teach, export, eval_input)
    summary = summarize(config)
    (config.folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n" + format_summary(summary))
    return summary
