"""TREC run files: ``qid Q0 docid rank score tag`` per line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from pathlib import Path

from distill.core.output_files import open_whole
from distill.core.schema import InputError

Run = dict[str, dict[str, float]]
"""qid -> docid -> score (higher is better)."""


def run_from_columns(qids: Sequence[str], docids: Sequence[str], scores: Sequence[float]) -> Run:
    """A run from parallel columns: row ``i`` gives ``scores[i]`` to ``docids[i]`` for ``qids[i]``."""
    run: Run = {}
    for qid, docid, score in zip(qids, docids, scores, strict=True):
        run.setdefault(qid, {})[docid] = float(score)
    return run


def write_trec_run(path: str | Path, run: Run, tag: str) -> None:
    """Write ``run`` ranked by score (ties by docid), whole (:func:`distill.core.output_files.open_whole`); each
    score as the shortest decimal that reads back as the same float, so a reader ranks the file as written."""
    queries = ((qid, list(scores), [list(scores.values())]) for qid, scores in run.items())
    write_trec_runs({tag: Path(path)}, queries)


def write_trec_runs(paths: dict[str, Path], queries: Iterable[tuple[str, list[str], list[list[float]]]]) -> None:
    """Write one run per tag of ``paths`` (tag -> file), a query at a time: ``queries`` gives each query's id, its
    docids and, for each tag in order, their scores. Each query is ranked by score (ties by docid), each score
    written exactly (the shortest decimal that reads back as the same float); each file is written whole
    (:func:`distill.core.output_files.open_whole`). Ids and tags are single whitespace-free fields (the loaders
    refuse other ids).

    Raises:
        ValueError: a tag that is empty or holds whitespace.
    """
    for tag in paths:
        if not tag or any(c.isspace() for c in tag):
            raise ValueError(f"TREC run tag {tag!r}: expected one non-empty field without whitespace")
    with ExitStack() as stack:
        files = {tag: stack.enter_context(open_whole(path)) for tag, path in paths.items()}
        for qid, docids, columns in queries:
            for (tag, f), scores in zip(files.items(), columns, strict=True):
                ranked = sorted(zip(docids, map(float, scores), strict=True), key=lambda kv: (-kv[1], kv[0]))
                f.writelines(
                    f"{qid} Q0 {docid} {rank} {score!r} {tag}\n" for rank, (docid, score) in enumerate(ranked, 1)
                )


def read_trec_run(path: str | Path, on_bad_input: str = "error", skipped: Counter[str] | None = None) -> Run:
    """Read a TREC run; a malformed line, or a (qid, docid) ranked twice, raises :class:`InputError` naming the file
    and the line (as the teacher stage's inputs do).

    With ``on_bad_input="skip"`` such lines are skipped instead (a duplicate's first line, in file order, is kept),
    each counted by reason in ``skipped`` where given.
    """
    from distill.data.loaders._common import BadInput
    from distill.data.loaders.trec import read_run

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: run file not found")
    bad = BadInput(on_bad_input)  # type: ignore[arg-type]  (BadInput checks the policy)
    run: Run = {}
    for qid, lines in read_run(path, bad).items():
        scores = run[qid] = {}
        for line in sorted(lines, key=lambda line: line.lineno):
            if line.docid in scores:
                bad(
                    f"{path}:{line.lineno}", f"duplicate (qid, docid) = ({qid}, {line.docid})", "duplicate (qid, docid)"
                )
                continue
            scores[line.docid] = line.score
        run[qid] = {docid: scores[docid] for docid in (line.docid for line in lines) if docid in scores}
    if skipped is not None:
        skipped.update(bad.skipped)
    return run


def find_run_files(given: list[str | Path]) -> dict[str, Path]:
    """Run files by display name, in the order given, each file once.

    Each of ``given`` is a run file, a folder of ``*.trec`` files, or a folder with a ``runs/`` folder of them (a
    ``distill teach`` output). A folder's files come in name order, but ``first_stage.trec`` (the input ranking of
    ``distill teach``) first. A file in a ``runs/`` folder is named ``<folder above runs>/<file stem>``, any other
    by its path. Raises :class:`InputError` for a path that does not exist or when no run file is found.
    """
    files: list[Path] = []
    for path in map(Path, given):
        if path.is_dir():
            runs_dir = path / "runs" if (path / "runs").is_dir() else path
            files.extend(sorted(runs_dir.glob("*.trec"), key=lambda f: (f.name != "first_stage.trec", f.name)))
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"{path}: no such run file or folder")
    if not files:
        raise InputError(f"no .trec run files in {', '.join(map(str, given))}")
    named: dict[str, Path] = {}
    for f in files:
        if f.resolve() in {p.resolve() for p in named.values()}:
            continue
        name = f"{f.absolute().parent.parent.name}/{f.stem}" if f.parent.name == "runs" else str(f)
        named[str(f) if name in named else name] = f
    return named
