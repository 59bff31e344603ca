"""The teacher stage's input pass per rank, in every format: ``python -m benchmarks.teacher_input``.

For each N in ``--sizes``, the pairs of :func:`benchmarks.scale.synthetic_teacher_data` (the real DL21 and DL22 teacher
rows repeated) are written once under ``--work`` in each of ``--formats``:

- ``jsonl``: rank_llm JSON lines, one query a line;
- ``json``: the same entries as one rank_llm JSON list;
- ``trec``: a TREC run with its queries (TSV) and corpus (TSV, every distinct passage once);
- ``beir``: a BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/test.tsv``) with the same run.

Then, for each number of ranks R in ``--ranks``, each rank's input pass (:func:`distill.stages.teach_input.
write_pair_rows` of :func:`~distill.stages.teach_input.candidate_stream`, keeping its :class:`~distill.stages.
teach_input.Share`) runs in a fresh process, one rank after another (so that each rank's seconds are its own on one
core): its seconds and peak RSS (the whole process, imports included, and above them). A corpus's index is built
before the first pass and timed on its own (:mod:`distill.data.loaders.corpus_index`).

``--corpus C --corpus_run M`` adds a TREC run of M pairs (100 a query) over a synthetic corpus of C distinct
passages (MS MARCO's passage corpus has 8.8M): the index built once (seconds, peak RSS), reopened (seconds), then
the input pass with each number of ranks.

The result: ``benchmarks/results/scale-cpu/teacher-input.json`` and ``.md``, with the CPU and its flags.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import RESULTS, phases
from benchmarks.results_pages import teacher_input_table
from benchmarks.scale import (
    _measure_in_process,
    _rss_bytes,
    measure_pass,
    rank_llm_lines,
    synthetic_teacher_data,
)
from distill.bench.measure import reset_vm_hwm, vm_hwm_bytes

FORMATS = ("jsonl", "json", "trec", "beir")
TARGET_RSS_BYTES = 2**30
"""Peak RSS of one rank's input pass at 10M pairs: at most 1 GB."""
TARGET_RATIO = 0.6
"""Peak RSS a rank with 2 ranks, against 1: at most 0.6x."""
HITS = 100
"""Candidates a query of the synthetic corpus's run."""


def inputs(fmt: str, lines: Path, folder: Path) -> dict[str, str]:
    """The input options of ``fmt`` for the pairs of rank_llm JSON lines ``lines``, its files written under
    ``folder`` (kept if there)."""
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        return {"input": str(lines)}
    if fmt == "json":
        path = folder / "pairs.json"
        if not path.is_file():
            with lines.open() as src, _writing(path) as out:
                out.write("[")
                for i, line in enumerate(src):
                    out.write((",\n" if i else "") + line.rstrip("\n"))
                out.write("]\n")
        return {"input": str(path)}
    run, queries = folder / "run.trec", folder / ("queries.jsonl" if fmt == "beir" else "queries.tsv")
    corpus = folder / ("corpus.jsonl" if fmt == "beir" else "corpus.tsv")
    if not run.is_file():
        seen: set[str] = set()
        with lines.open() as src, _writing(corpus) as c, _writing(queries) as q, _writing(run.with_suffix(".tmp")) as r:
            for line in src:
                entry = json.loads(line)
                qid = entry["hits"][0]["qid"]
                q.write(_record(fmt, qid, entry["query"]))
                for hit in entry["hits"]:
                    r.write(f"{qid} Q0 {hit['docid']} {hit['rank']} {hit['score']} synthetic\n")
                    if hit["docid"] not in seen:
                        seen.add(hit["docid"])
                        c.write(_record(fmt, hit["docid"], hit["content"]))
        run.with_suffix(".tmp").rename(run)
    if fmt == "beir":
        (folder / "qrels").mkdir(exist_ok=True)
        (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")
        return {"input": str(folder), "run": str(run)}
    return {"input": str(run), "queries": str(queries), "corpus": str(corpus)}


def _record(fmt: str, key: str, text: str) -> str:
    """A queries or corpus line: JSONL for BEIR, TSV for a TREC run."""
    return json.dumps({"_id": key, "text": text}) + "\n" if fmt == "beir" else f"{key}\t{text}\n"


class _writing:
    """A text file written through a temporary name, renamed into place when closed without an error."""

    def __init__(self, path: Path) -> None:
        self.path, self.tmp = path, path.with_name(path.name + ".partial")

    def __enter__(self) -> Any:
        self.f = self.tmp.open("w")
        return self.f

    def __exit__(self, kind: object, *exc: object) -> None:
        self.f.close()
        if kind is None:
            self.tmp.rename(self.path)


def synthetic_corpus(passages: int, pairs: int, folder: Path, lines: Path) -> dict[str, str]:
    """A TREC run of ``pairs`` pairs (:data:`HITS` a query, docids drawn at random) over a corpus of ``passages``
    distinct passages (the texts of rank_llm JSON lines ``lines``, each numbered), with its queries; kept if there."""
    run, queries, corpus = folder / "run.trec", folder / "queries.tsv", folder / "corpus.tsv"
    if not run.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        texts, query_texts = [], []
        with lines.open() as src:
            for line in src:
                entry = json.loads(line)
                query_texts.append(entry["query"])
                texts += [hit["content"] for hit in entry["hits"]]
                if len(texts) >= 20_000:
                    break
        with _writing(corpus) as c:
            for i in range(passages):
                c.write(f"p{i}\t{texts[i % len(texts)]} ({i})\n")
        rng = np.random.default_rng(0)
        with _writing(queries) as q, _writing(run.with_suffix(".tmp")) as r:
            for k in range(pairs // HITS):
                q.write(f"q{k}\t{query_texts[k % len(query_texts)]}\n")
                docids = rng.choice(passages, HITS, replace=False)
                r.writelines(f"q{k} Q0 p{d} {i + 1} {HITS - i} synthetic\n" for i, d in enumerate(docids))
        run.with_suffix(".tmp").rename(run)
    return {"input": str(run), "queries": str(queries), "corpus": str(corpus)}


def measure_index(corpus: str) -> dict[str, Any]:
    """Build (or reopen) the index of TSV or JSONL ``corpus``: seconds and peak RSS, and whether it was built."""
    from distill.data.loaders._common import BadInput
    from distill.data.loaders.corpus_index import file_index_folder
    from distill.data.loaders.trec import is_jsonl, open_corpus

    path = Path(corpus)
    built = not (file_index_folder(path, "jsonl" if is_jsonl(path) else "tsv", True) / "index.json").is_file()
    baseline = _rss_bytes()
    reset_vm_hwm()
    start = time.perf_counter()
    with open_corpus(path, BadInput("error"), True) as index:
        seconds = time.perf_counter() - start
        records = index.records
        index_bytes = sum(p.stat().st_size for p in index.folder.iterdir())
    peak = vm_hwm_bytes() or 0
    return {
        "built": built,
        "seconds": seconds,
        "records": records,
        "corpus_bytes": path.stat().st_size,
        "index_bytes": index_bytes,
        "peak_rss_bytes": peak,
        "peak_above_baseline_bytes": peak - baseline,
    }


def _child(what: str, **options: Any) -> dict[str, Any]:
    return _measure_in_process(what, module="benchmarks.teacher_input", **options)


def passes(fmt: str, pairs: int, options: dict[str, str], ranks: list[int], work: Path) -> list[dict[str, Any]]:
    """Every rank's input pass for each number of ``ranks``: one row a number of ranks."""
    rows = []
    for n in ranks:
        per_rank = [_child("pass", options=options, rank=r, ranks=n, rows=work / f"rows-{fmt}-{r}") for r in range(n)]
        row = {
            "format": fmt,
            "pairs": pairs,
            "ranks": n,
            "peak_rss_bytes": max(p["peak_rss_bytes"] for p in per_rank),
            "peak_above_baseline_bytes": max(p["peak_above_baseline_bytes"] for p in per_rank),
            "seconds": max(p["seconds"] for p in per_rank),
            "per_rank": per_rank,
        }
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "per_rank"}), flush=True)
    one = next((r for r in rows if r["ranks"] == 1), None)
    for row in rows:
        row["vs_one_rank"] = row["peak_rss_bytes"] / one["peak_rss_bytes"] if one else None
    return rows


@dataclass
class TeacherInput:
    """The teacher's input pass per rank, in every format, against the number of pairs and of ranks."""

    sizes: list[int] = field(default_factory=lambda: [1_000_000])
    """The numbers of pairs measured."""
    formats: list[str] = field(default_factory=lambda: list(FORMATS))
    """Input formats: ``jsonl``, ``json``, ``trec``, ``beir``."""
    ranks: list[int] = field(default_factory=lambda: [1, 2, 4])
    """Numbers of ranks."""
    corpus: int = 0
    """Passages of the synthetic corpus (0: none; MS MARCO has 8,800,000)."""
    corpus_run: int = 1_000_000
    """Pairs of the run over the synthetic corpus."""
    work: str = "/tmp/cis-distill-scale"
    """Where the synthetic inputs go (kept: a rerun reuses them)."""
    out: str = str(RESULTS / "scale-cpu" / "teacher-input.json")
    """The JSON result; the Markdown table beside it (``.md``)."""


def run(options: TeacherInput, invocation: dict[str, Any]) -> int:
    work = Path(options.work)
    os.environ.setdefault("CIS_DISTILL_CACHE", str(work / "cache"))  # the corpus indexes
    rows, indexes, texts = [], [], None
    for n in options.sizes:
        lines = rank_llm_lines(synthetic_teacher_data(n, work / f"teacher-{n}"), work / f"rank-llm-{n}.jsonl")
        texts = texts or lines
        for fmt in options.formats:
            given = inputs(fmt, lines, work / f"{fmt}-{n}")
            if "corpus" in given or fmt == "beir":
                corpus = given.get("corpus") or str(Path(given["input"]) / "corpus.jsonl")
                indexes.append({"corpus": f"{fmt}, {n:,} pairs", **_child("index", corpus=corpus)})
            rows += passes(fmt, n, given, options.ranks, work)
    if options.corpus:
        if texts is None:
            raise SystemExit("--corpus takes its texts from the first of --sizes: give one")
        given = synthetic_corpus(options.corpus, options.corpus_run, work / f"corpus-{options.corpus}", texts)
        built = _child("index", corpus=given["corpus"])
        reopened = _child("index", corpus=given["corpus"])
        name = f"synthetic, {options.corpus:,} passages"
        indexes.append({"corpus": name, **built, "reopen_seconds": reopened["seconds"]})
        rows += passes(f"trec over {options.corpus:,} passages", options.corpus_run, given, options.ranks, work)
    result = {
        "what": "the teacher stage's input pass, one rank at a time in a fresh process: seconds and peak RSS",
        "command": invocation["command"],
        "targets": {"peak_rss_bytes": TARGET_RSS_BYTES, "two_ranks_vs_one": TARGET_RATIO},
        **phases.this_cpu(),
        "indexes": indexes,
        "rows": rows,
    }
    phases.write_result(result, options.out, teacher_input_table)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.teacher_input ARGS``, or ``measure WHAT OPTIONS`` (one measurement in this process:
    ``pass`` or ``index`` with its JSON keyword arguments)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] != ["measure"]:
        return phases.main(TeacherInput, run, "benchmarks.teacher_input", argv)
    what, options = argv[1], json.loads(argv[2])
    if what == "pass":
        result = measure_pass(options["options"], options["rank"], options["ranks"], Path(options["rows"]))
    else:
        result = measure_index(options["corpus"])
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
