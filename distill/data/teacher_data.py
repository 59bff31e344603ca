"""The teacher stage's output type: a folder of ⟨Q, K, score⟩ triplets with its metadata and TREC runs.

A teacher dataset folder holds

- the triplets as a Hugging Face ``datasets`` folder (``datasets.load_from_disk`` reads it), one row per
  (query, candidate) pair: ``qid``, ``docid``, ``query``, ``passage``, ``first_stage_rank``, ``first_stage_score``,
  the token counts, every score column and every raw log-probability term (nats);
- ``teacher.json``: the :class:`TeacherMetadata` (primary score, scores, inputs, the teacher's fingerprint);
- ``runs/<score>.trec``: a TREC run per score, and ``runs/first_stage.trec`` (the input order).

``distill migrate`` moves the metadata of folders written before ``teacher.json`` existed (it was JSON inside
``dataset_info.json``'s description) into ``teacher.json``; the rows are not touched.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

from distill.core.files import read_json_object
from distill.core.output_files import write_whole
from distill.core.schema import InputError, MissingFileError
from distill.eval.trec_runs import write_trec_runs

METADATA_FILE = "teacher.json"
DATASET_INFO = "dataset_info.json"
FIRST_STAGE = "first_stage"
"""The run name of the input ranking (column ``first_stage_score``)."""


OPTIONAL = ("reused", "queries", "corpus", "command", "run", "qrels")
"""The :class:`TeacherMetadata` keys a ``teacher.json`` may lack (they are written only when set)."""


@dataclass
class TeacherMetadata:
    """What a teacher dataset holds and how it was made."""

    score: str
    """The primary label: the first score asked for."""
    scores: list[str]
    """Every score column."""
    input: list[str]
    """The candidate inputs, as given."""
    fingerprint: dict[str, Any]
    """Everything the scores depend on (teacher identity, dtype, start token, prompt, input digest, ...)."""
    reused: dict[str, Any] | None = None
    """With ``distill teach --reuse``: the datasets reused and the pairs taken from them (``pairs_reused``) or
    scored (``pairs_new``); None (and absent from the file) otherwise."""
    queries: str | None = None
    """For a TREC run input, the queries file it was read with, as given; None (and absent) otherwise."""
    corpus: str | None = None
    """For a TREC run input, the corpus it was read with, as given; None (and absent) otherwise."""
    command: str | None = None
    """The command line that made it (``distill teach ...``), where it was recorded; None (and absent) otherwise."""
    run: str | None = None
    """For a BEIR folder input, the TREC run its candidates were read from, as given; None (and absent) otherwise
    (the folder's judged pairs)."""
    qrels: str | None = None
    """The relevance judgements given with the candidates, as given; None (and absent) otherwise."""

    @classmethod
    def read(cls, folder: Path) -> TeacherMetadata:
        path = folder / METADATA_FILE
        if not path.is_file():
            hint = " (written before teacher.json existed: run `distill migrate` on it)" if _legacy(folder) else ""
            raise MissingFileError(f"{folder}: no {METADATA_FILE}; not a teacher dataset{hint}")
        from distill.core.files import read_json_object

        return cls.from_values(read_json_object(path), str(path))

    @classmethod
    def from_values(cls, values: dict[str, Any], where: str) -> TeacherMetadata:
        """The metadata of ``values`` (``teacher.json``'s keys, read at ``where``), checked.

        Raises:
            InputError: ``<where>: ...``: a key missing, or one of another type.
        """
        known = {f.name for f in fields(cls)}
        if missing := sorted(known - set(values) - set(OPTIONAL)):
            raise InputError(f"{where}: missing key(s) {missing}")
        values = dict(values)
        if isinstance(values["input"], str):  # written so by older versions: one input
            values["input"] = [values["input"]]
        for key in ("input", "scores"):
            if not (isinstance(values[key], list) and all(isinstance(v, str) for v in values[key])):
                raise InputError(f"{where}: {key}: expected a list of strings, got {values[key]!r}")
        if not isinstance(values["score"], str) or values["score"] not in values["scores"]:
            raise InputError(f"{where}: score: expected one of scores {values['scores']}, got {values['score']!r}")
        if not isinstance(values["fingerprint"], dict):
            raise InputError(f"{where}: fingerprint: expected a mapping, got {values['fingerprint']!r}")
        return cls(**{k: v for k, v in values.items() if k in known})

    def write(self, folder: Path) -> None:
        values = {k: v for k, v in asdict(self).items() if k not in OPTIONAL or v is not None}
        write_whole(folder / METADATA_FILE, json.dumps(values, indent=2, sort_keys=True) + "\n")


class TeacherDataset:
    """A teacher dataset folder, opened. Rows are read on demand.

    Args:
        path: the folder.
        metadata: its ``teacher.json``.
    """

    def __init__(self, path: Path, metadata: TeacherMetadata) -> None:
        self.path = path
        self.metadata = metadata

    @classmethod
    def open(cls, path: str | Path) -> TeacherDataset:
        """Open the folder at ``path``.

        Raises:
            MissingFileError: no teacher dataset there, or a file of its rows is missing.
            InputError: a file of its rows is empty or does not start as an Arrow stream.
        """
        path = Path(path)
        if not (path / DATASET_INFO).is_file():
            raise MissingFileError(f"{path}: no teacher dataset here (run `distill teach` first)")
        metadata = TeacherMetadata.read(path)
        _check_row_files(path)
        return cls(path, metadata)

    @staticmethod
    def is_complete(path: str | Path) -> bool:
        """Whether ``path`` holds a finished teacher dataset."""
        return (Path(path) / DATASET_INFO).is_file() and (Path(path) / METADATA_FILE).is_file()

    @staticmethod
    def is_teacher_output(path: str | Path) -> bool:
        """Whether the folder ``path`` holds a teacher dataset, finished or cut short while it was written (the
        files ``datasets``' ``save_to_disk`` writes first): what ``distill teach --overwrite`` may replace."""
        path = Path(path)
        return any(path.glob("data-*.arrow")) or any((path / n).exists() for n in (DATASET_INFO, METADATA_FILE))

    @property
    def runs_dir(self) -> Path:
        return self.path / "runs"

    def table(self) -> Any:
        """The rows as a ``pyarrow.Table``."""
        import datasets

        return datasets.load_from_disk(str(self.path)).data.table

    def to_pandas(self, columns: list[str] | None = None, arrow_strings: bool = False) -> Any:
        """The rows as a DataFrame (all columns, or ``columns``), checked for the columns asked for; with
        ``arrow_strings``, string columns stay Arrow-backed (``pd.ArrowDtype``: no Python object per value).

        Raises:
            InputError: a column asked for is missing.
        """
        import pandas as pd
        import pyarrow as pa

        table = self.table()
        if columns is not None:
            if missing := [c for c in columns if c not in table.column_names]:
                raise InputError(f"{self.path}: missing column(s) {missing}; it has {table.column_names}")
            table = table.select(columns)
        if not arrow_strings:
            return table.to_pandas()
        strings = (pa.types.is_string, pa.types.is_large_string)
        return table.to_pandas(types_mapper=lambda t: pd.ArrowDtype(t) if any(f(t) for f in strings) else None)

    @staticmethod
    def write(table: Any, metadata: TeacherMetadata, path: Path) -> None:
        """Write ``table`` (a ``pyarrow.Table`` of rows, in any order), ``teacher.json`` and the runs into the new
        folder ``path``."""
        import pyarrow.compute as pc

        codes = pc.index_in(table.column("qid"), value_set=pc.unique(table.column("qid")))
        together = table.take(pc.sort_indices(codes))  # stable: each query's rows together, in order
        scratch = path.with_name(f".{path.name}.arrow")
        TeacherDataset.write_batches(table.to_batches(), metadata, path, scratch, together.to_batches())

    @staticmethod
    def write_batches(
        batches: Iterable[Any], metadata: TeacherMetadata, path: Path, scratch: Path, by_query: Iterable[Any] = ()
    ) -> None:
        """Write the rows of ``batches`` (``pyarrow.RecordBatch``es of one schema), ``teacher.json`` and the runs into
        the new folder ``path``, a batch at a time: the rows go through the Arrow file ``scratch`` (deleted when
        done) into the ``datasets`` folder, and the runs are written from ``by_query`` (the same rows, each query's
        together) or, without it, from ``scratch`` (whose rows must hold each query's together)."""
        import datasets
        import pyarrow as pa

        batches = iter(batches)
        first = next(batches)
        try:
            with pa.OSFile(str(scratch), "wb") as sink, pa.ipc.new_stream(sink, first.schema) as writer:
                writer.write_batch(first)
                for batch in batches:
                    writer.write_batch(batch)
            datasets.Dataset.from_file(str(scratch)).save_to_disk(str(path))
            metadata.write(path)
            names = (FIRST_STAGE, *metadata.scores)
            columns = ["qid", "docid", *("first_stage_score" if n == FIRST_STAGE else n for n in names)]
            with pa.memory_map(str(scratch)) as source:
                queries = _queries(by_query or pa.ipc.open_stream(source), columns)
                write_trec_runs({n: path / "runs" / f"{n}.trec" for n in names}, queries)
        finally:
            scratch.unlink(missing_ok=True)


def _check_row_files(path: Path) -> None:
    """Check that each file of rows that ``state.json`` lists in the dataset folder ``path`` is there and opens as
    an Arrow stream (its schema is read, not its rows).

    Raises:
        MissingFileError: ``state.json`` or a file of rows is missing.
        InputError: ``state.json`` is malformed, or a file of rows is empty or is no Arrow stream.
    """
    import pyarrow as pa

    state = path / "state.json"
    if not state.is_file():
        raise MissingFileError(f"{state}: missing: {path} is incomplete; run `distill teach` again with --overwrite")
    files = read_json_object(state).get("_data_files")
    if files == []:  # datasets' save_to_disk of no rows
        raise InputError(f"{path}: holds no rows ({state} lists no file of rows): a teacher dataset of no pair")
    if not isinstance(files, list) or not all(isinstance(f, dict) and "filename" in f for f in files):
        raise InputError(f"{state}: _data_files: expected a list of {{filename}} objects, got {files!r}")
    for entry in files:
        rows = path / str(entry["filename"])
        if not rows.is_file():
            raise MissingFileError(f"{rows}: missing: {path} is incomplete; run `distill teach` again with --overwrite")
        try:
            with pa.memory_map(str(rows)) as source:
                pa.ipc.open_stream(source)
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(
                f"{rows}: not an Arrow stream ({str(e).splitlines()[0]}): {path} is damaged; run `distill teach` "
                "again with --overwrite"
            ) from None


def _queries(reader: Any, columns: list[str]) -> Iterator[tuple[str, list[str], list[list[float]]]]:
    """``(qid, docids, [values of each of columns[2:]])`` a query at a time, from the record batches of ``reader``,
    whose rows hold each query's pairs together.

    Raises:
        RuntimeError: a query's rows are not together (a bug of the writer).
    """
    done: set[str] = set()
    qid, docids, values = None, [], [[] for _ in columns[2:]]
    for batch in reader:
        batch_columns = [batch.column(name).to_pylist() for name in columns]
        for row in zip(*batch_columns, strict=True):
            if row[0] != qid:
                if qid is not None:
                    yield qid, docids, values
                if row[0] in done:
                    raise RuntimeError(f"query {row[0]}'s rows are not together")
                done.add(row[0])
                qid, docids, values = row[0], [], [[] for _ in columns[2:]]
            docids.append(row[1])
            for column, value in zip(values, row[2:], strict=True):
                column.append(value)
    if qid is not None:
        yield qid, docids, values


def _legacy(folder: Path) -> dict[str, Any] | None:
    """The metadata of a folder written before ``teacher.json``: JSON in ``dataset_info.json``'s description."""
    info = folder / DATASET_INFO
    if not info.is_file():
        return None
    description = read_json_object(info).get("description") or ""
    try:
        values = json.loads(description)
    except json.JSONDecodeError:
        return None
    return values if isinstance(values, dict) and "fingerprint" in values else None


def dataset_digest(folder: str | Path) -> str:
    """A digest of a teacher dataset folder's contents: its ``teacher.json``, its Arrow ``state.json`` (whose
    ``_fingerprint`` changes with every write) and its data files' names and sizes. A file that is not there (the
    folder being replaced) counts as missing."""
    folder = Path(folder)
    digest = hashlib.sha256()
    for name in (METADATA_FILE, "state.json"):
        try:
            digest.update((folder / name).read_bytes())
        except OSError:
            digest.update(b"-")
    for path in sorted(folder.glob("*.arrow")):
        try:
            digest.update(f"{path.name}:{path.stat().st_size};".encode())
        except OSError:
            digest.update(f"{path.name}:-;".encode())
    return digest.hexdigest()[:16]


def migration(folder: str | Path) -> Callable[[], None] | None:
    """What bringing a folder's metadata to the current format writes, checked but not yet written: None if it is
    current; else a call that writes it. A legacy folder's metadata moves into ``teacher.json`` (and the
    description is cleared); a ``teacher.json`` whose ``input`` is one string (older versions) gets it as a
    one-element list.

    The rows (the ``.arrow`` files) are not touched, so every score stays bit-identical.

    Raises:
        MissingFileError: ``folder`` is not a teacher dataset of either format.
        InputError: a legacy description or a ``teacher.json`` that lacks a field ``teacher.json`` needs, or holds
            one of another type.
    """
    folder = Path(folder)
    if (folder / METADATA_FILE).is_file():
        metadata = TeacherMetadata.read(folder)  # checked as loading checks it; a string input read as a list
        if not isinstance(read_json_object(folder / METADATA_FILE).get("input"), str):
            return None
        return partial(metadata.write, folder)
    values = _legacy(folder)
    if values is None:
        raise MissingFileError(f"{folder}: not a teacher dataset (no {METADATA_FILE}, no metadata in {DATASET_INFO})")
    where = f"{folder / DATASET_INFO}: description"
    legacy = {key: values[key] for key in ("score", "scores", "input", "fingerprint") if key in values}
    metadata = TeacherMetadata.from_values(legacy, where)

    def write() -> None:
        metadata.write(folder)
        info = json.loads((folder / DATASET_INFO).read_text())
        info["description"] = ""
        write_whole(folder / DATASET_INFO, json.dumps(info, indent=2) + "\n")

    return write
