"""Several runs evaluated on one set of qrels: means, per-query values and significance against the first run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from distill.core.schema import InputError, Qrels
from distill.eval.metrics import PerQuery, evaluate_per_query, means, parse_metrics
from distill.eval.significance import ALPHA, PERMUTATIONS, SEED, Comparison, Test, compare
from distill.eval.trec_runs import Run

TEST_NAMES = {
    "t": "paired t-test",
    "randomization": f"paired randomisation test, {PERMUTATIONS:,} sign flips, seed {SEED}",
}


@dataclass(frozen=True)
class EvalReport:
    """Runs' metrics (× 100); the first run is the baseline of the significance tests."""

    metrics: list[str]
    """Canonical ir-measures names, e.g. ``RR(rel=2)@10``."""
    binary_metrics: list[str]
    """Those of ``metrics`` that count grades >= ``rel_level`` as relevant (not those naming another level)."""
    graded_metrics: list[str]
    """Those of ``metrics`` that take no relevance level (they use the grades, or count every document)."""
    rel_level: int
    test: Test
    per_query: dict[str, PerQuery]
    """run -> metric -> qid -> value, over the run's judged queries."""
    comparisons: dict[str, dict[str, Comparison]]
    """run (each after the first) -> metric -> difference to the first run, with its p-value."""

    @property
    def baseline(self) -> str:
        return next(iter(self.per_query))

    @property
    def means(self) -> dict[str, dict[str, float]]:
        """run -> metric -> mean over the run's judged queries."""
        return {run: means(values) for run, values in self.per_query.items()}

    def queries(self, run: str) -> int:
        """Number of the run's judged queries."""
        return len(self.per_query[run][self.metrics[0]])


def evaluate_runs(runs: dict[str, Run], qrels: Qrels, metrics: Sequence[str], rel_level: int, test: Test) -> EvalReport:
    """Evaluate each run (name -> run, the first the baseline) and test each later one against the first.

    Raises :class:`InputError` naming a run none of whose queries is judged, and :class:`ValueError` naming an
    unknown metric.
    """
    measures = parse_metrics(metrics, rel_level)
    per_query: dict[str, PerQuery] = {}
    for name, run in runs.items():
        try:
            per_query[name] = evaluate_per_query(run, qrels, metrics, rel_level)
        except ValueError as e:
            raise InputError(f"{name}: {e}") from None
    baseline = per_query[next(iter(runs))]
    comparisons = {
        name: {m: compare(baseline[m], values[m], test) for m in measures}
        for name, values in list(per_query.items())[1:]
    }
    binary = [name for name, measure in measures.items() if measure.params.get("rel") == rel_level]
    graded = [name for name, measure in measures.items() if "rel" not in measure.params]
    return EvalReport(list(measures), binary, graded, rel_level, test, per_query, comparisons)


def format_table(report: EvalReport) -> str:
    """The means table, then (for two or more runs) the differences to the first run with their p-values."""
    width = max(len("run"), *map(len, report.per_query))
    cols = {m: max(8, len(m)) for m in report.metrics}
    lines = []
    if report.binary_metrics:
        graded = " (graded metrics use the grades)" if report.graded_metrics else ""
        lines.append(
            f"relevance level {report.rel_level}: grade >= {report.rel_level} is relevant for "
            f"{', '.join(report.binary_metrics)}{graded}"
        )
    lines.append(f"{'run':<{width}}  queries  " + "  ".join(f"{m:>{c}} " for m, c in cols.items()))
    for run, values in report.means.items():
        marks = {m: "*" if report.comparisons.get(run, {}).get(m, _NONE).significant else " " for m in report.metrics}
        cells = "  ".join(f"{values[m]:{c}.2f}{marks[m]}" for m, c in cols.items())
        lines.append(f"{run:<{width}}  {report.queries(run):7d}  {cells}")
    if report.comparisons:
        lines.append(
            f"* p < {ALPHA} against {report.baseline} ({TEST_NAMES[report.test]}, two-sided, "
            "over the queries both runs have)"
        )
        lines.append("")
        lines.append(f"difference to {report.baseline} (p-value; * p < {ALPHA}):")
        cols = {m: max(17, len(m)) for m in report.metrics}
        lines.append(f"{'run':<{width}}  " + "  ".join(f"{m:>{c}} " for m, c in cols.items()))
        for run, by_metric in report.comparisons.items():
            cells = "  ".join(f"{_difference(by_metric[m]):>{c}}" for m, c in cols.items())
            lines.append(f"{run:<{width}}  {cells}")
    return "\n".join(lines)


def format_per_query(report: EvalReport) -> str:
    """One table per run: a row per judged query (in natural order), a column per metric."""
    cols = {m: max(8, len(m)) for m in report.metrics}
    blocks = []
    for run, values in report.per_query.items():
        qids = sorted(values[report.metrics[0]], key=_natural)
        width = max(len("qid"), *map(len, qids))
        lines = [
            f"per query: {run}",
            f"{'qid':<{width}}  " + "  ".join(f"{m:>{c}}" for m, c in cols.items()),
        ]
        for qid in qids:
            cells = "  ".join(f"{values[m][qid]:{c}.2f}" for m, c in cols.items())
            lines.append(f"{qid:<{width}}  {cells}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def to_json(report: EvalReport) -> dict[str, Any]:
    """The report as JSON-ready data: ``metrics``, ``rel_level``, ``results`` (means), ``queries``,
    ``significance`` (for two or more runs) and ``per_query``; a difference or p-value that is NaN (no shared query)
    becomes ``null``."""
    record: dict[str, Any] = {
        "metrics": report.metrics,
        "rel_level": report.rel_level,
        "results": report.means,
        "queries": {run: report.queries(run) for run in report.per_query},
    }
    if report.comparisons:
        record["significance"] = {
            "baseline": report.baseline,
            "test": report.test,
            "description": TEST_NAMES[report.test] + ", two-sided, over the queries both runs have",
            "alpha": ALPHA,
            "results": {
                run: {
                    m: {
                        "difference": None if math.isnan(c.difference) else c.difference,
                        "p_value": None if math.isnan(c.p_value) else c.p_value,
                        "significant": c.significant,
                        "queries": c.queries,
                    }
                    for m, c in by_metric.items()
                }
                for run, by_metric in report.comparisons.items()
            },
        }
    record["per_query"] = report.per_query
    return record


_NONE = Comparison(0.0, 1.0, 0)
"""Stands in for the baseline's (absent) comparison to itself."""


def _difference(c: Comparison) -> str:
    if c.queries == 0:
        return "n/a: no shared query "
    p = "p=n/a" if math.isnan(c.p_value) else "p<0.001" if c.p_value < 0.001 else f"p={c.p_value:.3f}"
    return f"{c.difference:+.2f} {p}{'*' if c.significant else ' '}"


def _natural(qid: str) -> tuple[int, int | str]:
    """Numeric qids in numeric order, then the others in text order."""
    return (0, int(qid)) if qid.isascii() and qid.isdigit() else (1, qid)  # "1²" is a digit, no number
