"""What a teacher dataset's scores depend on (its fingerprint), and whether an output, or partial results, were made
by this configuration: up to date, resumable, refused, or replaced with ``--overwrite``."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from distill.core.schema import ExistingOutputError, InputError
from distill.data.teacher_data import DATASET_INFO, TeacherDataset
from distill.stages.teach_config import TeachConfig
from distill.stages.teach_input import InputSummary
from teachers.causal_lm import ScorerOptions

log = logging.getLogger(__name__)


def dataset_fingerprint(
    setting: dict[str, Any], summary: InputSummary, cfg: TeachConfig, options: ScorerOptions
) -> dict[str, Any]:
    """What a dataset's scores depend on: the teacher's ``setting`` (:meth:`CausalLMTeacher.describe`, or an
    embedding teacher's :meth:`~teachers.embedding.SimilarityTeacher.describe`), the input rows' digests (their pairs'
    texts, and their first-stage ranks and scores, which the dataset carries) and the stage's options."""
    fingerprint = {
        **setting,
        "input": summary.digest,
        "first_stage": summary.first_stage,
        "scores": cfg.score_columns,
        "chunk_size": cfg.chunk_size,
        "max_batch_tokens": options.max_batch_tokens,
    }
    if not cfg.similarity:  # a causal LM's head, and only the levers away from the exact path (the CPU's defaults):
        # a CPU run keeps its earlier fingerprints
        fingerprint |= {"logit_chunk_rows": cfg.logit_chunk_rows, **options.changed()}
    return fingerprint


def fingerprint_before_load(
    cfg: TeachConfig, device: Any, summary: InputSummary, options: ScorerOptions
) -> dict[str, Any]:
    """The fingerprint without the keys only the loaded teacher knows (:data:`~teachers.teacher.START_TOKEN_KEYS`)."""
    from distill.model.resolver import resolve_model
    from teachers.teacher import resolve_dtype, teacher_setting

    dtype = resolve_dtype(cfg.dtype, device)
    setting = teacher_setting(resolve_model(cfg.teacher).identity, dtype, cfg.max_passage_tokens, cfg.prompt)
    return dataset_fingerprint(setting, summary, cfg, options)


LATER_KEYS = ("first_stage", "logit_chunk_rows", "max_batch_tokens")
"""Fingerprint keys that datasets and partial results made before them lack: absent there, they match (such a dataset
stays up to date, as it was)."""


def changed_keys(theirs: dict[str, Any] | None, known: dict[str, Any]) -> list[str]:
    """The fingerprint keys in which ``theirs`` differs from ``known`` (which may lack the start token's keys)."""
    from teachers.teacher import START_TOKEN_KEYS

    theirs = theirs or {}
    keys = (set(theirs) | set(known)) - ({*START_TOKEN_KEYS} - set(known)) - ({*LATER_KEYS} - set(theirs))
    return sorted(key for key in keys if theirs.get(key) != known.get(key))


def other_output(output: Path, differs: list[str] | None = None) -> ExistingOutputError:
    """``output`` is no dataset of this configuration: ``differs``, the fingerprint keys it was made otherwise in
    (None: it is no complete dataset)."""
    changed = f" (differs in {differs})" if differs else ""
    if differs == ["first_stage"]:
        changed = " (the input's first-stage scores changed)"
    return ExistingOutputError(
        f"{output} exists and was not made by this configuration{changed}: pass --overwrite or another --output"
    )


def other_partial(work: Path, differs: list[str]) -> InputError:
    return InputError(
        f"{work} holds partial results of another configuration (differs in {differs}): "
        "pass --overwrite to discard them, or choose another --output"
    )


def check_earlier_results(output: Path, work: Path, known: dict[str, Any], overwrite: bool) -> None:
    """Before the teacher loads: refuse an output, or partial results, that another configuration made, by ``known``
    (the fingerprint but the start token's keys); once the teacher has loaded, the whole fingerprint decides.

    Raises:
        ExistingOutputError: ``output`` is a folder of something else than a teacher dataset, even with ``overwrite``.
        ExistingOutputError, InputError: without ``overwrite``, as :func:`is_up_to_date` and :func:`prepare_work_dir`.
    """
    if output.is_dir() and any(output.iterdir()) and not TeacherDataset.is_teacher_output(output):
        raise ExistingOutputError(  # --overwrite replaces a teacher dataset, never a folder of something else
            f"{output} exists and is not a teacher dataset (no {DATASET_INFO}): choose another --output"
        )
    if overwrite:
        return
    if output.exists():
        if not TeacherDataset.is_complete(output):
            raise other_output(output)
        if differs := changed_keys(TeacherDataset.open(output).metadata.fingerprint, known):
            raise other_output(output, differs)
        return  # up to date, unless the start token differs
    stamp = work / "fingerprint.json"
    if work.exists():
        differs = changed_keys(json.loads(stamp.read_text()) if stamp.is_file() else None, known)
        if differs:
            raise other_partial(work, differs)


def is_up_to_date(output: Path, fingerprint: dict[str, Any], overwrite: bool) -> bool:
    """Whether ``output`` is a complete dataset of ``fingerprint``; False where there is none, or, with
    ``overwrite``, where it is another configuration's (which the stage then replaces).

    Raises:
        ExistingOutputError: ``output`` is another configuration's, or incomplete, and ``overwrite`` is not given.
    """
    if not output.exists():
        return False
    differs = None
    if TeacherDataset.is_complete(output):
        differs = changed_keys(TeacherDataset.open(output).metadata.fingerprint, fingerprint)
        if not differs:
            return True
    if not overwrite:
        raise other_output(output, differs)
    return False


def record_up_to_date(output: Path, primary: str, qrels: str | None) -> None:
    """Record in the up-to-date dataset ``output`` what a rerun changes of its metadata alone: ``primary``, its
    primary label (the columns are the same, ``cis`` always among them: only the label downstream commands default
    to differs), and ``qrels``, where given (the judgements the export's quality gate reads)."""
    metadata = TeacherDataset.open(output).metadata
    changed = metadata
    if metadata.score != primary:
        log.info("%s: primary score now %s (was %s); the scores are unchanged", output, primary, metadata.score)
        changed = replace(changed, score=primary)
    if qrels is not None and metadata.qrels != qrels:
        log.info("%s: qrels now %s (was %s); the scores are unchanged", output, qrels, metadata.qrels)
        changed = replace(changed, qrels=qrels)
    if changed != metadata:
        changed.write(output)


def prepare_work_dir(work: Path, fingerprint: dict[str, Any], overwrite: bool) -> None:
    """Create (or check, to resume) the folder of partial results."""
    stamp = work / "fingerprint.json"
    if work.exists():
        previous = json.loads(stamp.read_text()) if stamp.is_file() else None
        if previous is not None and not changed_keys(previous, fingerprint):
            log.info("resuming from %s", work)
            return
        if not overwrite:
            raise other_partial(work, changed_keys(previous, fingerprint))
        shutil.rmtree(work)
    (work / "chunks").mkdir(parents=True)
    stamp.write_text(json.dumps(fingerprint, indent=2, sort_keys=True))
