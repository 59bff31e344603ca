"""The data layer at MS MARCO scale, on a CPU: synthetic teacher data of N pairs, and what reading it costs:
``python -m benchmarks.scale [--sizes 10000 100000 1000000]``.

For each N, :func:`synthetic_teacher_data` writes a teacher dataset of N pairs made of the real DL21 and DL22
teacher rows (12,900 pairs of 129 queries) repeated, each repetition's queries under new ids, so that the data
has N/100 distinct queries as a real distillation set would. Each measurement then runs in a fresh process
(``python -m benchmarks.scale measure WHAT OPTIONS``), so that its peak resident set is its own:

- ``student_cold``: :class:`students.data.StudentDataModule` ``setup`` with an empty token cache (tokenising);
- ``student_cached``: the same setup again, reopening the cache, with the part of it spent checking the token
  files against their checksums (read and hashed in blocks: ``verify_seconds``);
- ``loader``: the first batch's latency and the training loader's batches a second at the GPU config's
  budget and padding (``configs/train/bert-large-gpu.yaml``'s ``data``), with 0 and 2 workers;
- ``teacher_input``: the teacher stage's input pass over the same pairs as a rank_llm JSON-lines file (one query a
  line), read a query at a time into its row file: seconds and the process's peak RSS;
- ``pk_cache``: reopening a p(K) cache of N entries (every passage distinct, the most a run of N pairs keeps), in
  segments of the teacher stage's default chunk (256 passages): seconds, the part of it spent hashing the
  segments against their checksums, and its memory (:mod:`benchmarks.pk_cache` measures it alone, at MS MARCO's
  8.8M passages).

Peak RSS is the process's ``VmHWM`` (reset after the imports and the tokenizer, so "above baseline" is what the
phase itself adds). Every result records the CPU and its flags.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import CHECKOUT, RESULTS, phases
from benchmarks.results_pages import FIX, readme_is_current, scale_table
from distill.bench.measure import cpu_name, git_commit, reset_vm_hwm, vm_hwm_bytes

BASE = ("data/teacher/dl21-bm25-smollm2", "data/teacher/dl22-bm25-smollm2")
"""The real teacher rows every synthetic dataset repeats."""
COLUMNS = ("qid", "docid", "query", "passage", "first_stage_rank", "first_stage_score", "cis")
BACKBONE = "all-minilm-l6-v2"
GPU_CONFIG = CHECKOUT / "configs" / "train" / "bert-large-gpu.yaml"
"""The config whose batches the loader is timed at: its ``data.max_batch_tokens`` and ``data.pad_to_multiple_of``."""


def gpu_batching() -> tuple[int, int]:
    """:data:`GPU_CONFIG`'s token budget and padding multiple."""
    import yaml

    data = yaml.safe_load(GPU_CONFIG.read_text())["data"]
    return int(data["max_batch_tokens"]), int(data["pad_to_multiple_of"])


WRITE_ROWS = 200_000
"""Rows written to the synthetic dataset at a time (its writer's memory)."""
PK_SEGMENT = 256
"""Entries a synthetic p(K) segment: ``distill teach``'s default ``chunk_size``."""
PK_SETTING = {"teacher": "synthetic", "dtype": "float32", "start_token_id": 0}


def synthetic_teacher_data(n: int, folder: Path) -> Path:
    """Write a teacher dataset of ``n`` pairs at ``folder`` (kept if already there with ``n`` rows): the
    :data:`BASE` rows repeated, repetition ``k``'s query ids suffixed ``-k``."""
    import datasets
    import pyarrow as pa

    from distill.data.teacher_data import TeacherDataset, TeacherMetadata

    if TeacherDataset.is_complete(folder) and TeacherDataset.open(folder).metadata.fingerprint.get("pairs") == n:
        return folder
    base = pa.concat_tables([TeacherDataset.open(CHECKOUT / f).table().select(list(COLUMNS)) for f in BASE])
    base = base.combine_chunks()
    if folder.exists():
        shutil.rmtree(folder)
    # The folder's metadata comes from saving its first rows with `datasets`; the data file is then rewritten as
    # an Arrow stream of all n rows, a block at a time, in batches of 1,000 rows as `save_to_disk` writes them.
    datasets.Dataset(_block(base, 0, min(n, 10))).save_to_disk(str(folder))
    [data_file] = folder.glob("*.arrow")
    schema = datasets.Dataset(_block(base, 0, 1)).data.table.schema
    with pa.OSFile(str(data_file), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for start in range(0, n, WRITE_ROWS):
            writer.write_table(_block(base, start, min(start + WRITE_ROWS, n)).cast(schema), max_chunksize=1000)
    fingerprint = {"teacher": "synthetic", "input": f"{'+'.join(BASE)} x {math.ceil(n / base.num_rows)}", "pairs": n}
    TeacherMetadata("cis", ["cis"], list(BASE), fingerprint).write(folder)
    return folder


def _block(base: Any, start: int, end: int) -> Any:
    """Rows ``start:end`` of the repeated :data:`BASE` table."""
    import pyarrow as pa

    rows = np.arange(start, end)
    table = base.take(pa.array(rows % base.num_rows))
    repeat = rows // base.num_rows
    qids = [f"{q}-{k}" for q, k in zip(table.column("qid").to_pylist(), repeat.tolist(), strict=True)]
    return table.set_column(0, "qid", pa.array(qids, pa.string()))


def synthetic_pk_cache(n: int, root: Path) -> Path:
    """Write a p(K) cache of ``n`` entries under ``root`` (kept if already there with ``n`` entries), as
    :class:`teachers.passage_cache.PassageLogProbCache` writes them: segments of :data:`PK_SEGMENT` entries, each
    named by its checksum."""
    from distill.core.checksums import digest
    from teachers.passage_cache import PREFIX, PassageLogProbCache

    stamp = root / "entries"
    if stamp.is_file() and stamp.read_text() == str(n):
        return root
    shutil.rmtree(root, ignore_errors=True)
    folder = PassageLogProbCache(root, PK_SETTING).dir
    values = np.random.default_rng(0).normal(-60.0, 20.0, n)
    for start in range(0, n, PK_SEGMENT):
        lines = [json.dumps([f"{i:032x}", float(values[i])]) + "\n" for i in range(start, min(start + PK_SEGMENT, n))]
        data = "".join(lines).encode()
        (folder / f"{PREFIX}{digest(data)}.jsonl").write_bytes(data)
    stamp.write_text(str(n))
    return root


def measure_pk_cache(root: Path) -> dict[str, Any]:
    """Reopen the p(K) cache under ``root``: seconds, the part spent hashing its segments, and memory: the peak RSS
    of the reopening and the RSS with the cache open, each above the process's baseline (its imports), and one
    lookup's seconds."""
    from teachers.passage_cache import PassageLogProbCache

    baseline = _rss_bytes()
    reset_vm_hwm()
    start = time.perf_counter()
    cache = PassageLogProbCache(root, PK_SETTING)
    entries = len(cache)  # every waiting entry merged: the index as a run looks it up
    seconds = time.perf_counter() - start
    peak, resident = vm_hwm_bytes() or 0, _rss_bytes()
    probes = [f"{i:032x}" for i in np.random.default_rng(1).integers(0, max(entries, 1), 1000)]
    started = time.perf_counter()
    found = sum(key in cache for key in probes)
    lookup_seconds = (time.perf_counter() - started) / len(probes)
    return {
        "seconds": seconds,
        "verify_seconds": cache.verify_seconds,
        "entries": entries,
        "segments": len(list(cache.dir.glob("seg-*.jsonl"))),
        "cache_bytes": _folder_bytes(cache.dir),
        "baseline_rss_bytes": baseline,
        "peak_above_baseline_bytes": peak - baseline,
        "resident_above_baseline_bytes": resident - baseline,
        "lookup_seconds": lookup_seconds,
        "lookups_found": found / len(probes),
    }


def rank_llm_lines(teacher_data: Path, path: Path) -> Path:
    """The pairs of a (synthetic) teacher dataset as a rank_llm JSON-lines file, one query a line (kept if there)."""
    if path.is_file():
        return path
    from distill.data.teacher_data import TeacherDataset

    table = TeacherDataset.open(teacher_data).table().select(["qid", "docid", "query", "passage", "first_stage_score"])
    partial = path.with_name(path.name + ".partial")
    with partial.open("w") as out:
        entry: dict[str, Any] | None = None
        for batch in table.to_batches(max_chunksize=10_000):
            for qid, docid, query, passage, score in zip(*(c.to_pylist() for c in batch.columns), strict=True):
                if entry is None or entry["hits"][0]["qid"] != qid:
                    if entry is not None:
                        out.write(json.dumps(entry) + "\n")
                    entry = {"query": query, "hits": []}
                hit = {"qid": qid, "docid": docid, "content": passage, "score": score}
                entry["hits"].append({**hit, "rank": len(entry["hits"]) + 1})
        if entry is not None:
            out.write(json.dumps(entry) + "\n")
    partial.rename(path)
    return path


def measure_teacher_input(lines: Path, rows: Path) -> dict[str, Any]:
    """The teacher stage's input pass over a rank_llm JSON-lines file, one process (:func:`measure_pass`), and the
    file's size."""
    return {**measure_pass({"input": str(lines)}, 0, 1, rows), "input_bytes": lines.stat().st_size}


def measure_pass(options: dict[str, str], rank: int, ranks: int, rows: Path) -> dict[str, Any]:
    """One rank's input pass (its share of ``ranks``, in the teach stage's default chunks): seconds, pairs kept, and
    peak RSS."""
    from distill.stages.teach import TeachConfig
    from distill.stages.teach_input import InputOptions, Share, candidate_stream, write_pair_rows

    baseline = _rss_bytes()
    reset_vm_hwm()
    start = time.perf_counter()
    config = InputOptions(input=[options["input"]], **{k: v for k, v in options.items() if k != "input"})
    candidates, skipped = candidate_stream(config, rows.with_name(rows.name + ".join"))
    share = Share(rank, ranks, TeachConfig.chunk_size)  # the teach stage's default chunk: the unit of the shares
    summary = write_pair_rows(candidates, skipped, rows, None, options["input"], share)
    seconds = time.perf_counter() - start
    peak = vm_hwm_bytes() or 0
    shutil.rmtree(rows, ignore_errors=True)
    return {
        "seconds": seconds,
        "pairs": summary.pairs,
        "queries": summary.queries,
        "rows": summary.rows,
        "baseline_rss_bytes": baseline,
        "peak_rss_bytes": peak,
        "peak_above_baseline_bytes": peak - baseline,
    }


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def data_module(folder: Path, cache_dir: Path, workers: int = 0) -> Any:
    from students.data import StudentDataModule

    budget, multiple = gpu_batching()
    return StudentDataModule(
        [str(folder)],
        label="cis",
        backbone=BACKBONE,
        val_queries=8,
        max_batch_tokens=budget,
        pad_to_multiple_of=multiple,
        max_length=512,
        num_workers=workers,
        cache_dir=str(cache_dir),
    )


def measure_setup(folder: Path, cache_dir: Path) -> dict[str, Any]:
    """The data module's ``setup``: seconds, peak RSS above the baseline, and the token cache's size on disk."""
    from distill.model.resolver import load_architecture

    dm = data_module(folder, cache_dir)
    _, dm.tokenizer = load_architecture(BACKBONE)  # the baseline includes the libraries and the tokenizer
    baseline = _rss_bytes()
    reset_vm_hwm()
    start = time.perf_counter()
    dm.setup("fit")
    seconds = time.perf_counter() - start
    peak = vm_hwm_bytes() or 0
    store = dm.train.store
    return {
        "seconds": seconds,
        "baseline_rss_bytes": baseline,
        "peak_rss_bytes": peak,
        "peak_above_baseline_bytes": peak - baseline,
        "cache_bytes": _folder_bytes(store.path),
        "verify_seconds": store.verify_seconds,
        "tokens": store.manifest["tokens"],
        "train_pairs": len(dm.train),
    }


def measure_loader(folder: Path, cache_dir: Path, workers: int, batches: int, seconds: float) -> dict[str, Any]:
    """The training loader from the cached data: the first batch's latency, then batches a second (over
    ``batches`` batches or ``seconds``, whichever ends first), and the padded tokens of those batches."""
    dm = data_module(folder, cache_dir, workers)
    dm.setup("fit")
    loader = dm.train_dataloader()
    start = time.perf_counter()
    iterator = iter(loader)
    first = next(iterator)
    first_latency = time.perf_counter() - start
    count, tokens = 0, 0
    start = time.perf_counter()
    for batch in iterator:
        count += 1
        tokens += batch["input_ids"].numel()
        if count >= batches or time.perf_counter() - start > seconds:
            break
    elapsed = time.perf_counter() - start
    return {
        "workers": workers,
        "first_batch_s": first_latency,
        "first_batch_shape": list(first["input_ids"].shape),
        "batches": count,
        "batches_per_s": count / elapsed,
        "mean_padded_tokens": tokens / max(count, 1),
        "epoch_batches": len(loader),
    }


def _measure_in_process(what: str, module: str = "benchmarks.scale", **options: Any) -> dict[str, Any]:
    """Run one measurement of ``module`` (its ``measure WHAT OPTIONS``) in a fresh interpreter; its JSON result."""
    command = [sys.executable, "-m", module, "measure", what, json.dumps(options, default=str)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=CHECKOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(sizes: list[int], work: Path, batches: int, seconds: float, keep: bool) -> dict[str, Any]:
    """Every measurement for every N in ``sizes``; synthetic data and caches under ``work``."""
    from distill.serving.hardware import CpuFeatures

    rows = []
    for n in sizes:
        folder = synthetic_teacher_data(n, work / f"teacher-{n}")
        cache = work / f"tokens-{n}"
        shutil.rmtree(cache, ignore_errors=True)
        row: dict[str, Any] = {"pairs": n, "teacher_data_bytes": _folder_bytes(folder)}
        row["student_cold"] = _measure_in_process("setup", folder=folder, cache_dir=cache)
        row["student_cached"] = _measure_in_process("setup", folder=folder, cache_dir=cache)
        lines = rank_llm_lines(folder, work / f"rank-llm-{n}.jsonl")
        row["teacher_input"] = _measure_in_process("teacher_input", lines=lines, rows=work / f"rows-{n}")
        row["pk_cache"] = _measure_in_process("pk_cache", root=synthetic_pk_cache(n, work / f"pk-{n}"))
        row["loader"] = [
            _measure_in_process("loader", folder=folder, cache_dir=cache, workers=w, batches=batches, seconds=seconds)
            for w in (0, 2)
        ]
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not keep:
            shutil.rmtree(cache, ignore_errors=True)
    budget, multiple = gpu_batching()
    return {
        "what": "student data setup, cold and cached (and its checksum check), the training loader and the p(K) "
        "cache's reopening, against the number of pairs",
        "backbone": BACKBONE,
        "max_length": 512,
        "budget_tokens": budget,
        "pad_to_multiple_of": multiple,
        "cpu": cpu_name(),
        "cpu_features": CpuFeatures.read().describe(),
        "cores": os.cpu_count(),
        "git_commit": git_commit(),
        "rows": rows,
        "growth": growth(rows),
    }


def growth(rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per-pair costs between each two consecutive sizes: peak RSS of the cold setup (bytes a pair), its seconds a
    pair, the token cache's and the teacher data's bytes a pair, and the teacher input pass's peak RSS growth."""
    ordered = sorted(rows, key=lambda r: r["pairs"])
    steps = []
    for a, b in itertools.pairwise(ordered):
        pairs = b["pairs"] - a["pairs"]
        cold_a, cold_b = a["student_cold"], b["student_cold"]
        steps.append(
            {
                "from_pairs": a["pairs"],
                "to_pairs": b["pairs"],
                "peak_rss_bytes_per_pair": (cold_b["peak_above_baseline_bytes"] - cold_a["peak_above_baseline_bytes"])
                / pairs,
                "cold_seconds_per_pair": (cold_b["seconds"] - cold_a["seconds"]) / pairs,
                "cache_bytes_per_pair": (cold_b["cache_bytes"] - cold_a["cache_bytes"]) / pairs,
                "teacher_data_bytes_per_pair": (b["teacher_data_bytes"] - a["teacher_data_bytes"]) / pairs,
                "teacher_input_peak_rss_growth": b["teacher_input"]["peak_rss_bytes"]
                / a["teacher_input"]["peak_rss_bytes"]
                - 1,
            }
        )
    return steps


def plot(result: dict[str, Any], path: Path) -> None:
    """Log-log plot of setup time and peak memory against N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    n = [r["pairs"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.loglog(n, [r["student_cold"]["seconds"] for r in rows], "o-", label="setup, cold (tokenising)")
    left.loglog(n, [r["student_cached"]["seconds"] for r in rows], "s-", label="setup, cached")
    left.set(xlabel="pairs", ylabel="seconds", title="student data setup")
    right.loglog(n, [r["student_cold"]["peak_above_baseline_bytes"] / 2**20 for r in rows], "o-", label="cold")
    right.loglog(n, [r["student_cached"]["peak_above_baseline_bytes"] / 2**20 for r in rows], "s-", label="cached")
    right.loglog(n, [r["student_cold"]["cache_bytes"] / 2**20 for r in rows], "^--", label="token cache on disk")
    teacher = [r["teacher_input"]["peak_rss_bytes"] / 2**20 for r in rows]
    right.loglog(n, teacher, "d-", label="teacher input pass: peak RSS (whole process)")
    right.set(xlabel="pairs", ylabel="MiB", title="peak RSS (student setup: above baseline); disk")
    for axis in (left, right):
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    fig.suptitle(f"{result['cpu']} ({result['cores']} cores): {result['backbone']}, max_length {result['max_length']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


@dataclass
class Scale:
    """The data layer against the number of pairs: synthetic teacher data, then each measurement in a fresh process."""

    sizes: list[int] = field(default_factory=lambda: [10_000, 100_000, 1_000_000])
    """The numbers of pairs measured."""
    work: str = "/tmp/cis-distill-scale"
    """Where the synthetic data and the token caches go."""
    out: str = str(RESULTS / "scale-cpu")
    """The result folder: ``scale.json``, ``scale.md`` and ``scale.png``."""
    batches: int = 200
    """Loader batches timed (at most)."""
    seconds: float = 20.0
    """Loader seconds timed (at most)."""
    keep_caches: bool = False
    """Keep each size's token cache after its measurements."""


def run_sizes(options: Scale, invocation: dict[str, Any]) -> int:
    """Measure every size; write the JSON, the Markdown table and the plot. The README is left alone: where the
    committed ``scale-cpu/scale.json`` changed its headline block, this says which command rewrites it."""
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(options.sizes, Path(options.work), options.batches, options.seconds, options.keep_caches)
    result["command"] = invocation["command"]
    (out / "scale.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "scale.md").write_text(scale_table(result) + "\n")
    plot(result, out / "scale.png")
    print(scale_table(result))
    if not readme_is_current():
        print(f"README.md: its results block is out of date: {FIX}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.scale ARGS``, or ``measure WHAT OPTIONS`` (one measurement in this process, the
    runner's child: ``setup``, ``loader``, ``teacher_input`` or ``pk_cache`` with its JSON keyword arguments); the
    exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] != ["measure"]:
        return phases.main(Scale, run_sizes, "benchmarks.scale", argv)
    what, options = argv[1], json.loads(argv[2])
    if what == "teacher_input":
        result = measure_teacher_input(Path(options["lines"]), Path(options["rows"]))
    elif what == "pk_cache":
        result = measure_pk_cache(Path(options["root"]))
    else:
        folder, cache = Path(options.pop("folder")), Path(options.pop("cache_dir"))
        result = measure_setup(folder, cache) if what == "setup" else measure_loader(folder, cache, **options)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
