"""``distill run``: teach -> train -> export -> bench -> rerank -> eval in one command, from one YAML file.

A pipeline YAML has a ``name`` and one section per stage. Each section is the same config as its subcommand's
(``teach:`` is a :class:`~distill.stages.teach.TeachConfig`, ``export:`` an
:class:`~distill.stages.export.ExportConfig`, ...), written inline or as the path of that subcommand's YAML file;
``train:`` is a ``distill train`` config (``config:`` lists train YAML files to compose, the other keys override
them). A missing section takes its defaults. The pipeline sets the paths that join the stages, over any value
given for them: the teacher's output, the student to export, time and rerank, and its run to evaluate. By
default the student learns from the pipeline's teacher (unless the train config names ``data.teacher_data``) and
is validated on the queries the teacher's qrels judge (unless it names ``data.qrels``),
is timed against it (unless ``bench.teacher`` names another) and is evaluated beside the teacher's runs (unless
``eval.run`` names others), every run on the queries they all rank.

Everything goes under ``<root>/<name>/``::

    teacher/            the teacher's triplets (distill teach)
    student/            the training run (distill train): checkpoints/, hf/, logs/, export/, bench/; an
                        interrupted run with unchanged options resumes from its last checkpoint, and a run of
                        other options replaces it once its data is read and checked
    eval/               student.trec (distill rerank), student-fused.trec (with ``fuse``) and eval.json
                        (distill eval)
    summary.json        the final table
    stages/<stage>.json the key each stage last finished with (train.started: the key training last began with)

A stage is skipped when its output is there and its key matches: the key hashes the stage's own options, the size and
modification time of every input file or folder they name outside the pipeline's folder (those the train section's
YAML files name too; an edited input reruns the stage), the teacher's identity (new weights in a teacher folder rerun
teach), and the key and output files of each stage it reads (a stage whose output changed reruns those after it). So
changing the teacher's options, or its inputs, reruns everything after it, and changing only the bench's options
reruns the bench alone. The teacher folder is the pipeline's: a teach that runs again replaces a dataset of other
options or inputs there.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from distill.cli import COMMANDS
from distill.core.checksums import stat_digest
from distill.core.config import check_keys, load_section, read_yaml_mapping
from distill.core.output_files import folder_identity
from distill.core.run_folder import CHECKPOINT_ROOT, EXPORT_CARD, RunLayout
from distill.core.schema import InputError, MissingFileError

STAGES = ("teach", "train", "export", "bench", "rerank", "eval")
SECTIONS = {name: (COMMANDS[name].module, COMMANDS[name].config) for name in STAGES if COMMANDS[name].config}
"""The sections that are a subcommand's config dataclass, from the command line's table (``train`` is
LightningCLI's): stage -> (module, config class)."""


@dataclass
class RunConfig:
    """Options of ``distill run``: the whole pipeline from one YAML file."""

    config: str | None = None
    """The pipeline YAML (required), such as configs/quickstart.yaml."""
    force: list[str] = field(default_factory=list)
    """Stages to rerun even when up to date (teach, train, export, bench, rerank, eval, or all)."""

    def __post_init__(self) -> None:
        if self.config is None:
            raise InputError("run: --config (the pipeline YAML) is required")
        if unknown := sorted(set(self.force) - {*STAGES, "all"}):
            raise InputError(f"run: force: unknown stage(s) {unknown}; stages: {list(STAGES)}")


@dataclass
class PipelineFile:
    """The top level of a pipeline YAML."""

    name: str = ""
    """The pipeline's folder under ``root`` (required)."""
    root: str = CHECKPOINT_ROOT
    eval_queries: Literal["held_out", "all"] = "held_out"
    """Rerank and evaluate the student's held-out (validation) queries, or every query of the rerank input."""
    fuse: bool = False
    """Also rerank with the student's scores fused with the first stage's, by the α its card chose on the
    validation queries (``eval/student-fused.trec``), and evaluate it beside the student alone."""
    teach: dict[str, Any] | str | None = None
    train: dict[str, Any] | str | None = None
    export: dict[str, Any] | str | None = None
    bench: dict[str, Any] | str | None = None
    rerank: dict[str, Any] | str | None = None
    eval: dict[str, Any] | str | None = None


@dataclass
class Pipeline:
    """A pipeline YAML, read and checked: one config per stage, the joining paths filled in."""

    name: str
    folder: Path
    eval_queries: str
    teach: Any
    train: dict[str, Any]
    """``config``: train YAML files, composed in order; the other keys override them (a train YAML's keys)."""
    train_joined: dict[str, Any]
    """The train options the pipeline sets: the run's folder and the teacher data."""
    trainer: dict[str, Any]
    """The train stage's ``trainer`` section, parsed (its files and keys composed)."""
    export: Any
    bench: Any
    rerank: Any
    eval: Any
    rerank_fused: Any = None
    """``rerank`` fused with the first stage (``fuse``), or None."""
    backbone: str | None = None
    """The model the train stage loads (``model.backbone``), its weights or, with ``model.random_init``, its config;
    None where that is an embedded architecture's."""

    @property
    def run(self) -> RunLayout:
        """The student's training run."""
        return RunLayout(self.folder / "student")


def _weights_needed(name: str, random: bool) -> str | None:
    """``name``, unless random weights are built from its embedded shapes (a name of
    :data:`~distill.model.resolver.ARCHITECTURES`), which need no file."""
    from distill.model.resolver import ARCHITECTURES

    return None if random and name in ARCHITECTURES else name


def _section(raw: dict[str, Any], name: str, path: Path) -> tuple[dict[str, Any], str]:
    """A section's mapping and where it came from: inline, or the YAML file it names."""
    value = raw.get(name)
    if isinstance(value, str):
        return read_yaml_mapping(value), value
    if value is not None and not isinstance(value, dict):
        raise InputError(f"{path}: {name}: expected a mapping of options or the path of a YAML file, got {value!r}")
    return dict(value or {}), f"{path}: {name}"


def load_pipeline(path: str | Path) -> Pipeline:
    """Read and check a pipeline YAML, every section before any stage runs.

    Raises:
        InputError: one line naming the file (or section file) and the key: an unknown section or option, a wrong
            type, a missing ``name``, a train config LightningCLI rejects.
    """
    import importlib

    from distill.stages.train import check_train_args

    path = Path(path)
    raw = read_yaml_mapping(path)
    check_keys(PipelineFile, raw, str(path))
    top = load_section(PipelineFile, {k: v for k, v in raw.items() if k not in STAGES}, str(path))
    if not top.name:
        raise InputError(f"{path}: name: missing (the pipeline's folder under root)")
    if Path(top.name).name != top.name or top.name in (".", ".."):
        raise InputError(f"{path}: name: {top.name!r} must be one folder name (the pipeline's folder under root)")
    folder = Path(top.root) / top.name
    run = RunLayout(folder / "student")
    sections, where = {}, {}
    for name in (*SECTIONS, "train"):
        sections[name], where[name] = _section(raw, name, path)

    def build(name: str, joined: dict[str, Any], fallback: dict[str, Any] | None = None) -> Any:
        """The section's config: ``fallback`` values where the section has none, ``joined`` values always."""
        module, cls = SECTIONS[name]
        config = getattr(importlib.import_module(module), cls)
        check_keys(config, sections[name], where[name])
        given = {k: v for k, v in (fallback or {}).items() if sections[name].get(k) is None}
        return load_section(config, {**sections[name], **given, **joined}, where[name])

    teach = build("teach", {"output": str(folder / "teacher")})
    train = sections["train"]
    for key in ("run_name", "checkpoint_root"):  # a train file's own are the pipeline's: it composes standalone files
        if key in train:
            raise InputError(
                f"{where['train']}: {key}: the pipeline trains into {run.root} (its root and name): leave {key} out"
            )
    files = train.get("config") or []
    paths = [files] if isinstance(files, str) else files
    if not isinstance(paths, list) or not all(isinstance(f, str) for f in paths):
        raise InputError(f"{where['train']}: config: expected a YAML file's path or a list of them, got {files!r}")
    train_joined: dict[str, Any] = {"run_name": run.root.name, "checkpoint_root": str(run.root.parent)}
    data: dict[str, Any] = {}
    if not _train_sets(train, "teacher_data"):  # by default the student learns from the pipeline's teacher
        data["teacher_data"] = [teach.output]
    if teach.qrels and not _train_sets(train, "qrels"):  # and is validated on the queries its qrels judge
        data["qrels"] = teach.qrels
    if data:
        train_joined["data"] = data
    with train_arguments(train, train_joined) as argv:
        parsed = check_train_args(argv, where["train"])
    rerank_input = sections["rerank"].get("input") or teach.input
    rerank_input = [rerank_input] if isinstance(rerank_input, str) else rerank_input
    # Teach's inputs, reranked, come with the files their texts or candidates are in (a TREC run's queries and
    # corpus, a BEIR folder's run); such inputs are no parity input, which takes candidates with their texts.
    sources = {} if "input" in sections["rerank"] else {k: getattr(teach, k) for k in ("queries", "corpus", "run")}
    sources = {k: v for k, v in sources.items() if v and not sections["rerank"].get(k)}
    whole = not any(sections["rerank"].get(k) or sources.get(k) for k in ("queries", "corpus", "run"))
    qrels = sections["eval"].get("qrels") or teach.qrels or _irds_inputs(teach.input)
    if qrels is None:
        raise InputError(f"{where['eval']}: qrels: missing (set eval.qrels or teach.qrels)")
    # The student's scores are checked for parity on the candidates it will rerank (its quality gate ranks its own
    # validation queries).
    export = build("export", {"checkpoint": str(run.root)}, {"parity_input": rerank_input[0]} if whole else {})
    held_out = str(run.root) if top.eval_queries == "held_out" else None
    student_run = str(folder / "eval" / "student.trec")
    joined = {"model": str(run.root), "output": student_run, "held_out": held_out, "input": rerank_input, **sources}
    rerank = build("rerank", joined)
    students = [student_run]
    rerank_fused = None
    if top.fuse:
        students.append(str(folder / "eval" / "student-fused.trec"))
        rerank_fused = build("rerank", {**joined, "output": students[-1], "interpolation": True})
    runs = sections["eval"].get("run") or [str(folder / "teacher")]
    runs = [runs] if isinstance(runs, str) else list(runs)
    joined = {"run": [*runs, *students], "held_out": held_out, "qrels": qrels, "queries": "common"}
    evaluate = build("eval", {**joined, "json": str(folder / "eval" / "eval.json")})
    from teachers.embedding import SIMILARITY

    # the student is timed against the teacher it learnt from, unless the bench names another (an embedding
    # teacher has no CIS to time: the bench's own default then)
    teacher = {} if SIMILARITY in teach.scores else {"teacher": teach.teacher}
    bench = build("bench", {"student": str(run.root), "output": str(run.bench)}, teacher)
    return Pipeline(
        top.name,
        folder,
        top.eval_queries,
        teach,
        train,
        train_joined,
        parsed["trainer"],
        export,
        bench,
        rerank,
        evaluate,
        rerank_fused,
        _weights_needed(parsed["model"]["backbone"], parsed["model"]["random_init"]),
    )


def _irds_inputs(inputs: list[str]) -> list[str] | None:
    """The teacher's inputs when every one is an ir_datasets id (their qrels judge the pipeline); else None."""
    from distill.data.loaders.irds import is_irds

    return list(inputs) if inputs and all(is_irds(i) for i in inputs) else None


def _train_sets(train: dict[str, Any], key: str) -> bool:
    """Whether a train section (its files, then its own keys) sets ``data.<key>``."""
    sections = [read_yaml_mapping(file).get("data") or {} for file in _train_files(train)]
    sections.append(train.get("data") or {})
    return any(key in section for section in sections)


def _train_files(train: dict[str, Any]) -> list[str]:
    files = train.get("config") or []
    return [files] if isinstance(files, str) else [str(f) for f in files]


@contextmanager
def train_arguments(train: dict[str, Any], joined: dict[str, Any]) -> Iterator[list[str]]:
    """``distill train`` arguments for a train section: its ``config`` files, then its other keys, then the
    pipeline's ``joined`` options (each written to a temporary YAML file that lives as long as the context)."""
    argv = [arg for file in _train_files(train) for arg in ("--config", file)]
    inline = {k: v for k, v in train.items() if k != "config"}
    with tempfile.TemporaryDirectory(prefix="cis-distill-train-") as tmp:
        for name, values in (("inline", inline), ("joined", joined)):
            if values:
                path = Path(tmp) / f"{name}.yaml"
                path.write_text(yaml.safe_dump(values))
                argv += ["--config", str(path)]
        yield argv


# ----------------------------------------------------------------------------- stage bookkeeping


def _key(options: Any, upstream: list[Stage], folder: Path, *extra: str) -> str:
    """A stage's key: a hash of its ``options``, the input files they name (:func:`_input_files`, outside the
    pipeline's ``folder``), the ``upstream`` stages' marks (:attr:`Stage.mark`) and ``extra`` identities."""
    inputs = _input_files(options, folder.resolve())
    marks = [stage.mark for stage in upstream]
    text = json.dumps(
        {"options": options, "inputs": inputs, "upstream": marks, "extra": extra}, sort_keys=True, default=str
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _input_files(options: Any, folder: Path) -> list[tuple[str, str]]:
    """``(absolute path, its stat digest)`` (:func:`~distill.core.checksums.stat_digest`: the size and modification
    time of a file, or of every file under a folder) of each existing file or folder that a string among ``options``
    (nested in dicts and lists) names, but those inside ``folder`` (the pipeline's, which its stages make), a folder
    that holds it (the working directory, ``.``), and a cache folder (a key ending ``cache_dir``: the stages write
    there)."""
    found = []
    stack: list[tuple[str, Any]] = [("", options)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((str(k), v) for k, v in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((key, v) for v in value)
        elif isinstance(value, str) and value and "\n" not in value:
            path = Path(value)
            try:
                if not (path.is_file() or (path.is_dir() and not key.endswith("cache_dir"))):
                    continue
                path = path.resolve()
            except (OSError, ValueError):  # not a path (too long, a NUL character)
                continue
            if path != folder and folder not in path.parents and path not in folder.parents:
                found.append((str(path), stat_digest(path)))
    return sorted(set(found))


@dataclass
class Stage:
    name: str
    key: str
    output: Path
    """The file or folder whose presence says the stage finished."""
    made: Path | None = None
    """What the stages after it read (default ``output``): a model folder, where ``output`` is a file in it."""

    @property
    def mark(self) -> str:
        """What the stages after it key on, once it is done: its key and a digest of the files it made
        (:func:`~distill.core.checksums.stat_digest`), so that a stage that ran again and changed them (a resumed
        training that saved a new best student) reruns those after it, and one that left them as they were does
        not."""
        return f"{self.key}:{stat_digest(self.made or self.output)}"


class Runner:
    """Runs stages in order, skipping those whose output is there with the same key."""

    def __init__(self, folder: Path, force: set[str]) -> None:
        self.folder = folder
        self.force = set(STAGES) if "all" in force else force

    def stamp(self, stage: str) -> Path:
        return self.folder / "stages" / f"{stage}.json"

    def up_to_date(self, stage: Stage) -> bool:
        if stage.name in self.force or not stage.output.exists() or not self.stamp(stage.name).is_file():
            return False
        return json.loads(self.stamp(stage.name).read_text()).get("key") == stage.key

    def run(self, stage: Stage, work: Callable[[], Any]) -> None:
        if self.up_to_date(stage):
            print(f"[{stage.name}] up to date: {stage.output}")
            return
        print(f"[{stage.name}] running -> {stage.output}")
        self.stamp(stage.name).unlink(missing_ok=True)
        report = work()
        if report is not None:
            print(report.format())
        self.stamp(stage.name).parent.mkdir(parents=True, exist_ok=True)
        finished = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.stamp(stage.name).write_text(json.dumps({"key": stage.key, "finished": finished}) + "\n")


# ----------------------------------------------------------------------------- the stages


def _train(pipeline: Pipeline, runner: Runner, teach: Stage) -> Stage:
    from distill.stages.train import train

    inline = {key: value for key, value in pipeline.train.items() if key != "config"}
    # the files' options, whose named inputs (qrels, teacher folders, a local backbone) are keyed as the sections' are
    options = {"configs": [read_yaml_mapping(f) for f in _train_files(pipeline.train)], "inline": inline}
    run = pipeline.run
    stage = Stage("train", _key(options, [teach], pipeline.folder), run.hf / "config.json", run.hf)

    def work() -> Any:
        # A run started with these very options (then preempted or killed) resumes from its last checkpoint; any
        # other run belongs to other options, and distill train replaces it once its data is read and checked, and
        # puts it back if the new run fails (a run that fails removes nothing).
        started = runner.stamp("train").with_suffix(".started")
        resume = "train" not in runner.force and started.is_file() and started.read_text().strip() == stage.key
        started.parent.mkdir(parents=True, exist_ok=True)
        started.write_text(stage.key + "\n")
        if resume:
            print(f"[train] resuming the interrupted run in {run.root} (--ckpt_path last)")
        earlier = None if resume else folder_identity(run.root)
        with train_arguments(pipeline.train, pipeline.train_joined) as argv:
            resumed = ("--ckpt_path", "last") if resume else ("--overwrite", "true")
            try:
                report = train([*argv, *resumed], resume_hint="run the pipeline again: its train stage resumes")
            except BaseException:
                if earlier is not None and folder_identity(run.root) == earlier:  # the earlier run was put back:
                    started.unlink(missing_ok=True)  # the next pipeline replaces it again, rather than resume it
                raise
        if not stage.output.is_file():
            raise MissingFileError(run.no_student())
        return report

    runner.run(stage, work)
    return stage


def run_pipeline(pipeline: Pipeline, force: set[str] | None = None) -> PipelineReport:
    """Run every stage that is not up to date, then write ``summary.json`` and return the summary."""
    from distill.bench.latency import bench
    from distill.model.resolver import resolve_model
    from distill.stages.evaluate import evaluate
    from distill.stages.export import export
    from distill.stages.rerank import rerank
    from distill.stages.teach import teach

    runner = Runner(pipeline.folder, force or set())
    run, folder = pipeline.run, pipeline.folder
    teacher = resolve_model(pipeline.teach.teacher).identity
    taught = Stage("teach", _key(asdict(pipeline.teach), [], folder, teacher), Path(pipeline.teach.output))
    command = f"distill run (teach stage of {pipeline.name})"
    runner.run(taught, lambda: teach(replace(pipeline.teach, overwrite=True), command))  # its folder is the pipeline's
    trained = _train(pipeline, runner, taught)
    exported = Stage("export", _key(asdict(pipeline.export), [trained], folder), run.export / EXPORT_CARD, run.export)
    runner.run(exported, lambda: export(pipeline.export))
    benched = Stage("bench", _key(asdict(pipeline.bench), [exported], folder), run.bench / "bench.json")
    runner.run(benched, lambda: bench(pipeline.bench, f"distill run (bench stage of {pipeline.name})"))
    reranks = [c for c in (pipeline.rerank, pipeline.rerank_fused) if c is not None]
    reranked = Stage("rerank", _key([asdict(c) for c in reranks], [exported], folder), Path(reranks[-1].output))
    runner.run(reranked, lambda: Reports([rerank(c) for c in reranks]))
    evaluated = Stage("eval", _key(asdict(pipeline.eval), [taught, reranked], folder), Path(pipeline.eval.json))
    runner.run(evaluated, lambda: evaluate(pipeline.eval, f"distill run (eval stage of {pipeline.name})"))
    report = PipelineReport(summarize(pipeline))
    (pipeline.folder / "summary.json").write_text(json.dumps(report.summary, indent=2) + "\n")
    return report


def check_inputs(pipeline: Pipeline) -> None:
    """The inputs of the later stages that no earlier stage makes are there, before the first stage loads a model:
    the rerank candidates (and their queries and corpus), the export's parity input, the eval qrels, runs and
    teachers, and the models of the stages after the teacher (:func:`check_later_models`).

    Raises:
        MissingFileError, InputError: ``<stage>: <option>: <path>: <what is wrong>``.
    """
    from distill.core.path_checks import input_path, same_path
    from distill.data.loaders.irds import is_irds
    from distill.data.loaders.qrels import qrels_files

    rerank, evaluate = pipeline.rerank, pipeline.eval
    teachers = evaluate.teacher if isinstance(evaluate.teacher, dict) else {"": [evaluate.teacher]}
    checks = [("rerank", "input", path, "any") for path in rerank.input]
    checks.append(("export", "parity_input", pipeline.export.parity_input, "any"))
    checks += [("rerank", key, getattr(rerank, key), "file") for key in ("queries", "corpus")]
    checks += [("eval", "qrels", path, "file") for path in qrels_files(evaluate.qrels)]
    checks += [("eval", "run", path, "any") for path in evaluate.run]
    checks += [("eval", "teacher", path, "any") for paths in teachers.values() for path in paths]
    made = [pipeline.teach.output, rerank.output, *([pipeline.rerank_fused.output] if pipeline.rerank_fused else [])]
    for stage, key, path, kind in checks:
        if path is not None and not is_irds(str(path)) and not any(same_path(path, output) for output in made):
            input_path(path, stage, key, kind)
    check_later_models(pipeline)


def check_later_models(pipeline: Pipeline) -> None:
    """The models that the stages after the teacher load can be had (:func:`~distill.model.resolver.check_model`):
    the student's backbone and the bench's teacher, but where random weights are built from an embedded
    architecture's shapes, or the bench times no teacher.

    Raises:
        ModelNotFoundError: ``<stage>: <option>: cannot find model ...``, with what was tried.
    """
    from distill.model.resolver import ModelNotFoundError, check_model

    bench = pipeline.bench
    models = [("train", "model.backbone", pipeline.backbone)]
    if bench.teacher_model is not None:
        models.append(("bench", "teacher", _weights_needed(bench.teacher_model, bench.random_weights)))
    for stage, key, name in models:
        if name is None:
            continue
        try:
            check_model(name)
        except ModelNotFoundError as e:
            raise ModelNotFoundError(f"{stage}: {key}: {e}") from None


def run(cfg: RunConfig) -> PipelineReport:
    """``distill run``: read the pipeline, check the inputs its stages do not make, then run it."""
    pipeline = load_pipeline(cfg.config)
    check_inputs(pipeline)
    check_devices(pipeline, cfg.config)
    return run_pipeline(pipeline, set(cfg.force))


def check_devices(pipeline: Pipeline, path: str) -> None:
    """The train, rerank and bench devices are on this machine (a check of the machine, not of the config, which
    parses anywhere), before the teacher runs: a GPU that is not there was found only once the stages before the one
    that needs it had run.

    Raises:
        InputError: ``<path>: <stage>: ...`` (``train: trainer.accelerator: gpu, but torch ... sees no GPU here``,
            ``rerank: device cuda: torch sees 0 GPU(s) here ...``).
    """
    from distill.serving.hardware import serving_device
    from distill.stages.train import check_train_machine

    check_train_machine(pipeline.trainer, f"{path}: train")
    for name, config in (("rerank", pipeline.rerank), ("bench", pipeline.bench)):
        try:
            serving_device(config.device)
        except InputError as e:
            raise InputError(f"{path}: {name}: {e}") from None


# ----------------------------------------------------------------------------- the summary


def summarize(pipeline: Pipeline) -> dict[str, Any]:
    """nDCG@10 of the first stage, every teacher score and the student; the student's latency against the
    teacher's; where every artefact is."""
    from distill.bench import report

    evaluation = json.loads(Path(pipeline.eval.json).read_text())
    bench = json.loads((pipeline.run.bench / "bench.json").read_text())
    latency: dict[str, Any] = {}
    if "teacher cis" in report.methods(bench):
        for workload in report.workloads(bench):
            teacher = report.cell(bench, "teacher cis", workload)
            latency[workload] = {"teacher cis": teacher["p50_s"]}
            for method in report.methods(bench):
                if method != "teacher cis" and (c := report.cell(bench, method, workload)):
                    latency[workload][method] = c["p50_s"]
    names = {pipeline.rerank.output: f"student ({pipeline.rerank.backend})"}
    if pipeline.rerank_fused is not None:
        names[pipeline.rerank_fused.output] = f"student ({pipeline.rerank.backend}) fused with the first stage"
    queries = max(evaluation["queries"].values())
    return {
        "name": pipeline.name,
        "eval_queries": queries,
        "nDCG@10": {names.get(run, run): values["nDCG@10"] for run, values in evaluation["results"].items()},
        "latency_p50_s": latency,
        "artefacts": {
            "teacher triplets": pipeline.teach.output,
            "student (Hugging Face)": str(pipeline.run.hf),
            "exported student": str(pipeline.run.export),
            "latency benchmark": str(pipeline.run.bench),
            "evaluation": str(Path(pipeline.eval.json).parent),
        },
    }


@dataclass(frozen=True)
class Reports:
    """Several reports of one stage, printed in turn."""

    reports: list[Any]

    def format(self) -> str:
        return "\n".join(report.format() for report in self.reports)


@dataclass(frozen=True)
class PipelineReport:
    summary: dict[str, Any]
    """See :func:`summarize`; also written to ``summary.json``."""

    def format(self) -> str:
        s = self.summary
        n = s["eval_queries"]
        lines = ["", f"== {s['name']}: nDCG@10 on {n} evaluation {'query' if n == 1 else 'queries'} =="]
        width = max(map(len, s["nDCG@10"]))
        lines += [f"  {run:<{width}}  {value:6.2f}" for run, value in s["nDCG@10"].items()]
        for workload, times in s["latency_p50_s"].items():
            teacher = times["teacher cis"]
            lines.append(f"== latency, {workload} (p50) ==")
            width = max(map(len, times))
            for method, seconds in times.items():
                speedup = "" if method == "teacher cis" else f"  {_against(teacher / seconds)} the teacher"
                lines.append(f"  {method:<{width}}  {seconds * 1e3:9.1f} ms{speedup}")
        lines.append("== artefacts ==")
        lines += [f"  {what}: {where}" for what, where in s["artefacts"].items()]
        return "\n".join(lines)


def _against(speedup: float) -> str:
    """``2.5x faster than`` or, for a method slower than its reference, ``1.4x slower than``."""
    return f"{speedup:6.1f}x faster than" if speedup >= 1 else f"{1 / speedup:6.1f}x slower than"
