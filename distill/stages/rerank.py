"""The rerank stage: a student scores each query's candidates, and the new order is written as a TREC run."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from distill.core.counts import counted
from distill.core.schema import Candidates, InputError, RerankingData
from distill.core.student_card import DEFAULT_FIRST_STAGE
from distill.data.loaders._common import OnBadInput
from distill.eval.trec_runs import Run
from distill.serving.options import ServingOptions

if TYPE_CHECKING:
    from distill.serving.reranker import Reranker


@dataclass(frozen=True)
class RerankConfig(ServingOptions):
    """Options of ``distill rerank``: rerank candidates with a student and write a TREC run. How the student is served
    (backend, device, dtype, batches, levers, first-stage fusion) are :class:`~distill.serving.options.ServingOptions`'
    fields, declared there once."""

    model: str | None = None
    """The student (required): an HF folder (torch backend), an export folder, a training run, or a hub id
    (``org/name``, at ``revision``) in or into the Hugging Face cache."""
    input: list[str] = field(default_factory=list)
    """The candidates (required): TREC runs (with ``queries`` and ``corpus``), rank_llm JSON, ...; several are
    joined."""
    queries: str | None = None
    """For a TREC run input: the queries (TSV or JSONL)."""
    corpus: str | None = None
    """For a TREC run input: the passages (TSV or JSONL)."""
    run: str | None = None
    """For a BEIR folder input: the candidates as a TREC run (default its judged pairs)."""
    output: str | None = None
    """The TREC run to write (required; ``distill run`` sets it)."""
    max_queries: int | None = None
    """Rerank only the first N queries (N >= 1; with ``held_out``, of its queries)."""
    on_bad_input: OnBadInput = "error"
    """``error``: stop at the first bad record of the input, naming it; ``skip``: skip bad records and count them."""
    held_out: str | None = None
    """A student (training run or model folder): rerank only the queries it was validated on."""

    def __post_init__(self) -> None:
        missing = [name for name in ("model", "input", "output") if not getattr(self, name)]
        if missing:
            raise InputError(f"rerank: missing required option(s): {', '.join(missing)}")
        if isinstance(self.input, str):  # Python callers may name one input
            object.__setattr__(self, "input", [self.input])
        if self.max_queries is not None and self.max_queries < 1:
            raise InputError(f"rerank: max_queries must be positive, got {self.max_queries}")
        try:
            super().__post_init__()
        except InputError as e:
            raise InputError(f"rerank: {e}") from None


@dataclass(frozen=True)
class RerankReport:
    output: Path
    queries: int
    pairs: int
    truncated: int
    """Pairs longer than the student's max length, cut."""
    skipped: int = 0
    """Bad input records skipped (``on_bad_input: skip``)."""
    alpha: float | None = None
    """The interpolation with the first stage, if any."""
    backend: str | None = None
    """The named backend that scored (``openvino-int8``, ...), and why where ``auto`` chose it."""
    backend_reason: str = ""
    first_stage: str | None = None
    """The first stage whose alpha (in the student's card) fused the scores; None: a number given, or no fusion."""

    def format(self) -> str:
        stage = f" {self.first_stage}" if self.first_stage not in (None, DEFAULT_FIRST_STAGE) else ""
        fused = "" if self.alpha is None else f", interpolated with the first stage{stage} (alpha {self.alpha:g})"
        line = (
            f"wrote {self.output}: {counted(self.queries, 'query', 'queries')}, {counted(self.pairs, 'pair')}, "
            f"{self.truncated} truncated{fused}"
        )
        if self.skipped:
            line += f", {self.skipped} bad input record(s) skipped"
        if self.backend:
            line += f"\nbackend {self.backend}" + (f" (auto: {self.backend_reason})" if self.backend_reason else "")
        return line


def rerank_run(reranker: Reranker, candidates: list[Candidates]) -> Run:
    """The student's run: qid -> docid -> score for every candidate of every query, fused with the candidates'
    first-stage scores where the reranker fuses."""
    run: Run = {}
    for c in candidates:
        first_stage = c.scores if reranker.alpha is not None else None
        scores = reranker.score(c.query.text, [p.text for p in c.passages], first_stage)
        run[c.query.qid] = {p.docid: float(s) for p, s in zip(c.passages, scores, strict=True)}
    return run


def rerank(cfg: RerankConfig) -> RerankReport:
    """Rerank ``cfg.input`` with the student ``cfg.model`` and write ``cfg.output``."""
    from distill.core.run_folder import student_folder
    from distill.core.student_card import held_out_queries
    from distill.data.loaders import load_candidates
    from distill.eval.trec_runs import write_trec_run
    from distill.serving.reranker import Reranker

    check_paths(cfg)
    data = RerankingData.union(
        [
            load_candidates(p, queries=cfg.queries, corpus=cfg.corpus, run=cfg.run, on_bad_input=cfg.on_bad_input)
            for p in cfg.input
        ]
    )
    candidates = data.candidates
    if cfg.held_out:
        keep = held_out_queries(cfg.held_out)
        candidates = [c for c in candidates if c.query.qid in keep]
        if not candidates:
            raise InputError(
                f"rerank: held_out: {cfg.held_out} held out none of the input's {len(data.candidates)} queries: "
                "nothing to rerank"
            )
    candidates = candidates[: cfg.max_queries]
    folder = student_folder(cfg.model, revision=cfg.revision)
    reranker = Reranker.load(folder, replace(cfg.serving(), revision=None))  # the folder its revision resolved to
    run = rerank_run(reranker, candidates)
    interp = f"-interp{reranker.alpha:g}" if reranker.alpha is not None else ""
    name = re.sub(r"\s+", "_", Path(cfg.model).name)  # a TREC tag is one whitespace-free field
    write_trec_run(cfg.output, run, tag=f"{name}-{reranker.backend}{interp}")
    pairs = sum(map(len, run.values()))
    return RerankReport(
        Path(cfg.output),
        len(run),
        pairs,
        reranker.truncated,
        sum(data.skipped.values()),
        reranker.alpha,
        reranker.backend,
        reranker.backend_reason,
        reranker.first_stage,
    )


def check_paths(cfg: RerankConfig) -> None:
    """Every path of ``cfg`` before any work: the inputs are there, the output can be written and is no input, nor
    inside an input folder or a student's model folder (a training run's other folders, ``eval/`` say, take
    outputs).

    Raises:
        InputError: ``rerank: <option>: <path>: <what is wrong>``.
    """
    from distill.core.path_checks import input_path, output_file
    from distill.core.run_folder import student_folder
    from distill.data.loaders import check_text_sources
    from distill.data.loaders.irds import is_irds

    inputs = [("input", path) for path in cfg.input if not is_irds(path)]
    inputs += [(key, getattr(cfg, key)) for key in ("queries", "corpus", "run") if getattr(cfg, key)]
    for key, path in inputs:
        input_path(path, "rerank", key, "any" if key == "input" else "file")
    check_text_sources(cfg.input, "rerank", queries=cfg.queries, corpus=cfg.corpus, run=cfg.run)
    if Path(cfg.model).exists():  # else a hub id, resolved into its cache, or named as neither
        input_path(cfg.model, "rerank", "model")
    inputs.append(("model", student_folder(cfg.model, revision=cfg.revision)))
    if cfg.held_out:
        input_path(cfg.held_out, "rerank", "held_out")
        inputs.append(("held_out", student_folder(cfg.held_out, exported=False)))
    output_file(cfg.output, "rerank", "output", inputs)
