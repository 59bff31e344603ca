"""The evaluation stage: ir-measures metrics of runs on qrels, with significance tests against the first run."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from distill.core.output_files import write_whole
from distill.core.project_files import qrels_beside
from distill.core.schema import InputError, Qrels
from distill.data.loaders import OnBadInput, skip_summary
from distill.eval.report import EvalReport, evaluate_runs, to_json
from distill.eval.trec_runs import Run


@dataclass
class EvalConfig:
    """Options of ``distill eval``: metrics of runs, each later run compared with the first."""

    run: list[str] = field(default_factory=list)
    """Run files, or folders holding them (a ``distill teach`` output, a ``runs/`` folder); the first is the
    baseline."""
    qrels: str | list[str] | None = None
    """TREC qrels, an ``irds:`` dataset id whose qrels ir_datasets reads, or a list of these (the qrels of two TREC
    years); overrides the judgements of ``input``."""
    input: str | None = None
    """Candidates with judgements (a multi-hop QA file, rank_llm JSON with ``qrels``, ...): their own order is
    evaluated as the first run, and their judgements are the qrels."""
    metrics: list[str] | None = None
    """ir-measures names (default nDCG@1/5/10, RR@10, R@100; multi-hop: R@3/4/6, P@3/4/6)."""
    rel_level: int | None = None
    """Grade from which a document is relevant for RR, R, P, AP, ... without a rel= of their own (default 2 where
    the top grade is >= 2, as in TREC DL, else 1)."""
    multihop: bool = False
    """Multi-hop QA metrics (supporting-paragraph recall and precision at 3, 4, 6); automatic for such an input."""
    test: Literal["t", "randomization"] = "t"
    """Paired significance test against the first run."""
    held_out: str | None = None
    """A student (training run or model folder): evaluate only the queries it was validated on."""
    queries: Literal["each", "common"] = "each"
    """``each``: every run over its own judged queries (trec_eval's convention); ``common``: every run over the
    judged queries that all the runs rank."""
    per_query: bool = False
    """Also print each query's values."""
    json: str | None = None
    """Also write the results (means, per query, significance) to this JSON file."""
    on_bad_input: OnBadInput = "error"
    """``error``: stop at the first bad line of a run or record of ``input`` (a malformed line, a (qid, docid) ranked
    twice), naming it; ``skip``: skip them (a duplicate's first line is kept), count them and say so."""
    teacher: dict[str, list[str]] | str | None = None
    """A teacher dataset (or a run file), or named teachers of the same pairs (name -> dataset folders, as
    ``data.teacher_data`` of ``distill train``): also report each run's agreement with the teacher's label, query
    by query (Kendall τ, Spearman, nDCG@10 judged against the teacher's ranking), and with each score the label
    sums."""
    label: str | None = None
    """The teacher's label to compare with, as ``data.label`` of ``distill train``: a score column, a hybrid
    (``cis_q+0.5*first_stage``) or a sum of per-query z-scores (``z(gemma.cis) + 0.25*z(first_stage)``); default
    the dataset's primary score (that of a sole named teacher too)."""

    def __post_init__(self) -> None:
        """The metrics' names, checked before any file is read (a pipeline checks them before its first stage)."""
        from distill.eval.metrics import parse_metrics

        if self.metrics is None:
            return
        if not any(name.strip() for name in self.metrics):
            raise InputError("eval: metrics: no metric named (leave the option out for the default metrics)")
        try:
            parse_metrics(self.metrics, self.rel_level or 1)
        except ValueError as e:
            raise InputError(f"eval: metrics: {e}") from None


PerRun = dict[str, dict[str, dict[str, float]]]
"""run -> metric -> qid -> value."""


@dataclass(frozen=True)
class Fidelity:
    """Each run's agreement with a teacher label, and with each score the label sums, query by query (see
    :mod:`distill.eval.fidelity`)."""

    teacher: str
    label: str
    per_query: PerRun
    members: dict[str, PerRun] = field(default_factory=dict)
    """Each score of a label that sums two or more (``gemma.cis``, ``first_stage``) -> the runs' agreement with it."""

    @property
    def means(self) -> dict[str, dict[str, float]]:
        return _means(self.per_query)

    def format(self) -> str:
        blocks = [_format(f"the teacher's {self.label} ({self.teacher})", self.per_query)]
        blocks += [_format(f"{name}, a term of {self.label}", per_query) for name, per_query in self.members.items()]
        return "\n\n".join(blocks)

    def to_json(self) -> dict[str, Any]:
        members = {name: {"results": _means(p), "per_query": p} for name, p in self.members.items()}
        return {
            "teacher": self.teacher,
            "label": self.label,
            "results": self.means,
            "per_query": self.per_query,
            "members": members,
        }


def _means(per_query: PerRun) -> dict[str, dict[str, float]]:
    from distill.eval.fidelity import mean_fidelity

    return {run: mean_fidelity(values) for run, values in per_query.items()}


def _format(reference: str, per_query: PerRun) -> str:
    from distill.eval.fidelity import FIDELITY_METRICS

    width = max(len("run"), *map(len, per_query))
    lines = [
        f"agreement with {reference}, mean over queries:",
        f"{'run':<{width}}  queries  " + "  ".join(f"{m:>15}" for m in FIDELITY_METRICS),
    ]
    for run, means in _means(per_query).items():
        queries = len(per_query[run]["nDCG@10_teacher"])
        lines.append(f"{run:<{width}}  {queries:7d}  " + "  ".join(f"{means[m]:15.3f}" for m in FIDELITY_METRICS))
    return "\n".join(lines)


@dataclass(frozen=True)
class EvalResult:
    """The evaluation of ``distill eval``: the metrics report, the agreement with a teacher, how it is shown."""

    report: EvalReport
    per_query: bool = False
    fidelity: Fidelity | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    """Bad lines or records skipped (``on_bad_input: skip``), by reason."""
    output: str | None = None
    """The JSON record's file (``--json``), if any."""

    def format(self) -> str:
        from distill.eval.report import format_per_query, format_table

        parts = [format_table(self.report)]
        if self.skipped:
            parts.insert(0, f"skipped {sum(self.skipped.values())} bad input line(s): {skip_summary(self.skipped)}")
        if self.fidelity is not None:
            parts.append(self.fidelity.format())
        if self.per_query:
            parts.append(format_per_query(self.report))
        return "\n\n".join(parts)


def evaluate(cfg: EvalConfig, command: str | None = None) -> EvalResult:
    """Evaluate the runs of ``cfg``; write ``cfg.json`` (with ``command``) if asked.

    Raises:
        InputError: no runs or qrels, a run with no judged query, an unknown metric, no student at ``held_out``.
    """
    from distill.data.loaders import RunWithoutTexts, load_candidates, read_qrels
    from distill.data.loaders.multihop import is_multihop_file
    from distill.eval.metrics import DEFAULT_METRICS, MULTIHOP_METRICS, default_rel_level, parse_metrics
    from distill.eval.trec_runs import find_run_files, read_trec_run

    if not (cfg.input or (cfg.qrels and cfg.run)):
        raise InputError("eval: give qrels and run, or input (with qrels where it has no judgements of its own)")
    check_paths(cfg)
    skipped: Counter[str] = Counter()
    runs: dict[str, Run] = {}
    if cfg.input:  # its own ranking first: the baseline
        try:
            data = load_candidates(cfg.input, qrels=cfg.qrels, on_bad_input=cfg.on_bad_input)
        except RunWithoutTexts:  # eval has no --queries or --corpus: the loader's hint would not work
            raise InputError(f"{cfg.input}: a TREC run: give it with --run (and --qrels)") from None
        skipped.update(data.skipped)
        if not data.qrels:
            beside = qrels_beside(cfg.input)
            hint = f" (--qrels {beside}, beside it?)" if beside else ""
            raise InputError(f"{cfg.input}: no relevance judgements; give qrels{hint}")
        qrels = data.qrels
        if not Path(cfg.input).is_dir():  # a BEIR folder's candidates are its judged pairs, in qrels order: no ranking
            runs[f"{Path(cfg.input).stem}/first_stage"] = data.first_stage_run()
        elif not cfg.run:
            raise InputError(f"{cfg.input}: a BEIR folder has no ranking of its own: give the runs to evaluate (--run)")
    else:
        qrels = read_qrels(cfg.qrels)
        if not qrels:
            raise InputError(f"{cfg.qrels}: no relevance judgements")
    multihop = cfg.multihop or bool(cfg.input and is_multihop_file(Path(cfg.input)))
    metrics = cfg.metrics or list(MULTIHOP_METRICS if multihop else DEFAULT_METRICS)
    rel_level = default_rel_level(qrels) if cfg.rel_level is None else cfg.rel_level
    top = max((grade for judged in qrels.values() for grade in judged.values()), default=0)
    if not 1 <= rel_level <= max(top, 1):
        raise InputError(f"eval: rel_level: {rel_level} is not a grade from 1 to the qrels' top grade, {top}")
    try:
        parse_metrics(metrics, rel_level)  # an unknown name fails before the runs are read
    except ValueError as e:
        raise InputError(f"eval: metrics: {e}") from None
    for name, path in find_run_files(cfg.run).items() if cfg.run else ():
        name = str(path) if name in runs else name  # named as the input's own ranking (a teacher's first_stage)
        runs[name] = read_trec_run(path, cfg.on_bad_input, skipped)
        if not runs[name].keys() & qrels.keys():
            raise InputError(f"{path}: no query of the run has relevance judgements in {cfg.qrels or cfg.input}")
    if cfg.held_out:
        from distill.core.student_card import held_out_queries

        qrels = {qid: judged for qid, judged in qrels.items() if qid in held_out_queries(cfg.held_out)}
        if not qrels:
            raise InputError(
                f"eval: held_out: none of {cfg.held_out}'s held-out queries is judged in {cfg.qrels or cfg.input}"
            )
        for name, run in runs.items():
            if not run.keys() & qrels.keys():
                raise InputError(f"eval: held_out: run {name} has none of {cfg.held_out}'s judged held-out queries")
    if cfg.queries == "common":
        shared = set.intersection(*(set(run) for run in runs.values())) if runs else set()
        qrels = {qid: judged for qid, judged in qrels.items() if qid in shared}
        if not qrels:
            raise InputError(f"eval: queries: common: the {len(runs)} runs share no judged query")
    report = evaluate_runs(runs, qrels, metrics, rel_level, cfg.test)
    fidelity = teacher_fidelity(runs, qrels, cfg.teacher, cfg.label) if cfg.teacher else None
    if cfg.json:
        record = {"command": command, "qrels": cfg.qrels, "input": cfg.input, **to_json(report)}
        if skipped:
            record["skipped"] = dict(skipped)
        if fidelity is not None:
            record["fidelity"] = fidelity.to_json()
        write_whole(Path(cfg.json), json.dumps(record, indent=2) + "\n")
    return EvalResult(report, cfg.per_query, fidelity, dict(skipped), cfg.json)


def check_paths(cfg: EvalConfig) -> None:
    """Every path of ``cfg`` before any work: the inputs are there, ``json`` can be written and is no input, nor
    inside an input folder.

    Raises:
        InputError: ``eval: <option>: <path>: <what is wrong>``.
    """
    from distill.core.path_checks import input_path, output_file
    from distill.core.run_folder import student_folder
    from distill.data.loaders.irds import is_irds
    from distill.data.loaders.qrels import qrels_files

    inputs = [("run", path) for path in cfg.run]
    for qrels in qrels_files(cfg.qrels):
        input_path(qrels, "eval", "qrels", "file")
        inputs.append(("qrels", qrels))
    if cfg.input and not is_irds(cfg.input):
        input_path(cfg.input, "eval", "input")
        inputs.append(("input", cfg.input))
    teachers = [cfg.teacher] if isinstance(cfg.teacher, str) else [f for fs in (cfg.teacher or {}).values() for f in fs]
    inputs += [("teacher", path) for path in teachers]
    if cfg.held_out:
        inputs.append(("held_out", student_folder(input_path(cfg.held_out, "eval", "held_out"), exported=False)))
    if cfg.json:
        output_file(cfg.json, "eval", "json", inputs)


def teacher_fidelity(
    runs: dict[str, Run], qrels: Qrels, teacher: str | dict[str, list[str]], label: str | None
) -> Fidelity:
    """Each run's per-query agreement with the teacher's ``label``, and with each score it sums (on the evaluated,
    judged queries). ``teacher`` is a dataset folder, a run file, or named teachers (name -> folders).

    Raises:
        InputError: a malformed label, no teacher dataset, named teachers of different pairs, no label for
            several named teachers, or a run that shares no judged query with the teacher.
    """
    from distill.data.label_table import load_label_table, named_teachers
    from distill.data.teacher_data import TeacherDataset
    from distill.eval.fidelity import fidelity_per_query
    from distill.eval.trec_runs import read_trec_run, run_from_columns

    members: dict[str, Run] = {}
    if isinstance(teacher, str) and Path(teacher).is_file():
        reference, label = read_trec_run(Path(teacher)), Path(teacher).stem
    else:
        named = named_teachers(teacher, "eval: teacher") if isinstance(teacher, dict) else None
        if label is None and named is not None and len(named) > 1:
            raise InputError(f"eval: label: required with several teachers ({', '.join(named)}), e.g. z(name.cis)")
        if label is None:
            primary = TeacherDataset.open(next(iter(named.values()))[0] if named else teacher).metadata.score
            label = f"{next(iter(named))}.{primary}" if named else primary
        data = teacher if isinstance(teacher, dict) else [teacher]
        labelled = load_label_table(data, label, "eval: teacher", "eval: label", qrels=qrels, qrels_key="eval: qrels")
        qids, docids = labelled.table.qid.tolist(), labelled.table.docid.tolist()
        reference = run_from_columns(qids, docids, labelled.table.label.tolist())
        members = {name: run_from_columns(qids, docids, v.tolist()) for name, v in labelled.members.items()}
        label = label.strip()

    where = teacher if isinstance(teacher, str) else ", ".join(f"{n}: {', '.join(f)}" for n, f in teacher.items())

    def agreement(reference: Run) -> PerRun:
        per_run = {}
        for name, run in runs.items():
            per_run[name] = fidelity_per_query({q: docs for q, docs in run.items() if q in qrels}, reference)
            if not per_run[name]["nDCG@10_teacher"]:
                raise InputError(
                    f"eval: teacher: run {name} shares no judged query with {where} (two candidates at least)"
                )
        return per_run

    return Fidelity(where, label, agreement(reference), {name: agreement(run) for name, run in members.items()})
