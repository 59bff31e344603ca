"""BEIR folders: ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl`` (``_id``, ``text``)
and ``qrels/<split>.tsv`` (a header ``query-id<TAB>corpus-id<TAB>score``, then one row per judgement).

With a TREC run over the corpus, the run gives the candidates; without one, each query's candidates
are its judged passages in the split's qrels, in file order, all with first-stage score 0.0.
The split's qrels are returned either way, where the folder has them (a run over a folder without qrels reranks
its corpus for its queries). Candidates are streamed as :mod:`.trec` streams them: ``corpus.jsonl``
is indexed once (:mod:`.corpus_index`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from distill.core.schema import Candidates, InputError, Qrels
from distill.data.loaders._common import BadInput
from distill.data.loaders.qrels import judge
from distill.data.loaders.trec import RunLine, iter_lines, run_candidates, stream_trec_run


def is_beir_dir(path: Path) -> bool:
    return path.is_dir() and (path / "corpus.jsonl").is_file() and (path / "queries.jsonl").is_file()


def load_beir(
    path: Path, run: Path | None, bad: BadInput, repair: bool, split: str = "test"
) -> tuple[Iterator[Candidates], Qrels]:
    """Candidates (a query at a time) and qrels of one split of the BEIR folder ``path`` (candidates from ``run``,
    if given)."""
    qrels_path = path / "qrels" / f"{split}.tsv"
    queries_path, corpus_path = path / "queries.jsonl", path / "corpus.jsonl"
    if run is not None:  # the qrels are optional: a folder of a corpus and queries, reranked on a run over it
        qrels = read_beir_qrels(qrels_path)[0] if qrels_path.is_file() else {}
        return stream_trec_run(run, queries_path, corpus_path, bad, repair), qrels
    if not qrels_path.is_file():
        raise InputError(
            f"{qrels_path}: qrels file for split {split!r} not found (without a run, the judged pairs are the "
            "candidates)"
        )
    qrels, judged = read_beir_qrels(qrels_path)
    return run_candidates(list(judged), judged.items(), qrels_path, queries_path, corpus_path, bad, repair), qrels


def read_beir_qrels(path: Path) -> tuple[Qrels, dict[str, list[RunLine]]]:
    """The qrels of a BEIR ``qrels/<split>.tsv``, and its judged pairs in file order, as a run scored 0.0.

    The header line is optional. Like :func:`distill.data.loaders.qrels.load_qrels`, a malformed row is
    always an error: qrels are the ground truth and are not skipped over; a pair judged twice is judged once, and
    with different grades, an error.
    """
    qrels: Qrels = {}
    judged: dict[str, list[RunLine]] = {}
    for n, (lineno, line) in enumerate(iter_lines(path)):
        parts = line.split("\t")
        if len(parts) != 3:
            parts = line.split()
        if len(parts) != 3:
            raise InputError(f"{path}:{lineno}: expected 'query-id<TAB>corpus-id<TAB>score', got {line.strip()!r}")
        qid, docid, grade = (p.strip() for p in parts)
        try:
            grade_value = int(grade)
        except ValueError:
            if n == 0:  # the header
                continue
            raise InputError(f"{path}:{lineno}: relevance score {grade!r} is not an integer") from None
        if judge(qrels, qid, docid, grade_value, f"{path}:{lineno}"):
            lines = judged.setdefault(qid, [])
            lines.append(RunLine(qid, docid, len(lines) + 1, 0.0, lineno))
    return qrels, judged
