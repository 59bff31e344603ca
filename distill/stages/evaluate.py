"""The evaluation stage: ir-measures metrics of runs on qrels, with significance tests against the first run."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from distill.core.eval_report import EvalReport, evaluate_runs, to_json
from distill.core.schema import InputError


@dataclass
class EvalConfig:
    """Options of ``distill eval``: metrics of runs, each later run compared with the first."""

    run: list[str] = field(default_factory=list)
    """Run files, or folders holding them (a ``distill teach`` output, a ``runs/`` folder); the first is the
    baseline."""
    qrels: str | None = None
    """TREC qrels (overrides the judgements of ``input``)."""
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
    per_query: bool = False
    """Also print each query's values."""
    json: str | None = None
    """Also write the results (means, per query, significance) to this JSON file."""


@dataclass(frozen=True)
class EvalResult:
    """The evaluation of ``distill eval``: the metrics report and how it is shown."""

    report: EvalReport
    per_query: bool = False

    def format(self) -> str:
        from distill.core.eval_report import format_per_query, format_table

        text = format_table(self.report)
        return text + "\n\n" + format_per_query(self.report) if self.per_query else text


def evaluate(cfg: EvalConfig, command: str | None = None) -> EvalResult:
    """Evaluate the runs of ``cfg``; write ``cfg.json`` (with ``command``) if asked.

    Raises:
        InputError: no runs or qrels, a run with no judged query, an unknown metric, no student at ``held_out``.
    """
    from distill.core.loaders import load_candidates, load_qrels
    from distill.core.loaders.multihop import is_multihop_file
    from distill.core.metrics import DEFAULT_METRICS, MULTIHOP_METRICS, default_rel_level, parse_metrics
    from distill.core.runs import Run, find_run_files, read_trec_run

    if not (cfg.input or (cfg.qrels and cfg.run)):
        raise InputError("eval: give qrels and run, or input (with qrels where it has no judgements of its own)")
    runs: dict[str, Run] = {}
    if cfg.input:  # its own ranking first: the baseline
        data = load_candidates(cfg.input, qrels=cfg.qrels)
        if not data.qrels:
            raise InputError(f"{cfg.input}: no relevance judgements; give qrels")
        qrels = data.qrels
        runs[f"{Path(cfg.input).stem}/first_stage"] = data.first_stage_run()
    else:
        qrels = load_qrels(Path(cfg.qrels))
    multihop = cfg.multihop or bool(cfg.input and is_multihop_file(Path(cfg.input)))
    metrics = cfg.metrics or list(MULTIHOP_METRICS if multihop else DEFAULT_METRICS)
    rel_level = default_rel_level(qrels) if cfg.rel_level is None else cfg.rel_level
    try:
        parse_metrics(metrics, rel_level)  # an unknown name fails before the runs are read
    except ValueError as e:
        raise InputError(f"eval: metrics: {e}") from None
    for name, path in find_run_files(cfg.run).items() if cfg.run else ():
        runs[name] = read_trec_run(path)
        if not runs[name].keys() & qrels.keys():
            raise InputError(f"{path}: no query of the run has relevance judgements in {cfg.qrels or cfg.input}")
    if cfg.held_out:
        qrels = {qid: judged for qid, judged in qrels.items() if qid in held_out_queries(cfg.held_out)}
    report = evaluate_runs(runs, qrels, metrics, rel_level, cfg.test)
    if cfg.json:
        record = {"command": command, "qrels": cfg.qrels, "input": cfg.input, **to_json(report)}
        Path(cfg.json).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.json).write_text(json.dumps(record, indent=2) + "\n")
    return EvalResult(report, cfg.per_query)


def held_out_queries(student: str | Path) -> set[str]:
    """The query ids a student was validated on, from its card; ``student`` is a training run or model folder."""
    from distill.core.layout import student_folder
    from distill.core.student_card import StudentCard

    return set(StudentCard.read(student_folder(student, exported=False)).val_queries)
