"""The results pages and the README's headline table, generated from the committed files in ``benchmarks/results/``.

No figure on a results page, nor in the README's headline block, is typed by hand: every table reads its results
file, and every row links to the file it came from. A new run is committed as its results file; the pages follow.

- The README's block between ``<!-- results:begin -->`` and ``<!-- results:end -->``:
  ``python -m benchmarks.results_pages readme`` rewrites it, ``python -m benchmarks.results_pages check`` exits
  with 1 when it is out of date (``tests/benchmarks/test_results_pages.py`` checks it).
- The docs' results pages (``results/*.md`` in the site): :func:`pages`, written at build time by ``docs/gen_pages.py``
  (mkdocs-gen-files), which also copies :func:`result_files` into the site so that the links resolve there.

Only the standard library is used: the pages build without torch.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import CHECKOUT, RESULTS

README = CHECKOUT / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
FIX = "python -m benchmarks.results_pages readme"
"""The command that rewrites the README's block."""


class Links:
    """Markdown links to results files (paths relative to ``benchmarks/results/``) from one page.

    The README links into the repository (``prefix="benchmarks/results/"``); a docs results page links to the
    copy of the file in the site (``prefix="files/"``).
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self, path: str, text: str | None = None) -> str:
        if not (RESULTS / path).exists():
            raise FileNotFoundError(f"results page: benchmarks/results/{path}: no such file")
        return f"[{text or f'`{path}`'}]({self.prefix}{path})"


def load(path: str) -> Any:
    """The JSON results file ``benchmarks/results/<path>``."""
    file = RESULTS / path
    if not file.is_file():
        raise FileNotFoundError(f"results page: benchmarks/results/{path}: no such file")
    return json.loads(file.read_text())


def result_files() -> list[str]:
    """Every file under ``benchmarks/results/`` (relative paths), which the site carries for the pages' links."""
    return sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file() and "/." not in f"/{p}")


def _f(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:.1f} ms"


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def _x(value: float) -> str:
    return f"{value:.2f}×"


def _table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


MOVED = {
    "benchmarks/teacher.py": "python -m benchmarks.teacher_throughput",
    "benchmarks/student_train.py": "python -m benchmarks.train_throughput",
    "benchmarks/gpu_suite.py": "python -m benchmarks.gpu_suite",
    "benchmarks/int8.py": "python -m benchmarks.int8",
    "benchmarks/onnx_cpu.py": "python -m benchmarks.onnx_cpu",
    "benchmarks/scale.py": "python -m benchmarks.scale",
    "benchmarks/quality.py": "python experiments/quality.py",
    **{
        f"-m distill.bench.{name}": f"python -m benchmarks.{name}"
        for name in ("teacher_throughput", "train_throughput", "gpu_suite", "int8", "onnx_cpu", "scale", "load")
    },
}
"""The scripts and modules that wrote older committed results -> the command that runs them now (the files keep
the command that ran; ``benchmarks/README.md`` gives each one's flags today)."""


RENAMED_LEVERS = (
    (re.compile(r"\+overlap(\d+)"), r"+overlap=\1"),
    (re.compile(r"\+padded\b"), "+unpad=false"),
    (re.compile(r"\+nographs\b"), "+cuda_graphs=false"),
    (re.compile(r"\+cudnn\b"), "+cudnn_attention"),
)
"""``distill bench`` lever suffixes of older committed results -> their spelling today (the same levers)."""


def now(command: str) -> str:
    """`` (now `...`)`` after a recorded ``command`` whose script has moved (the script today) or that names bench
    levers by their older spelling (the command as it is spelt today), else ``""``."""
    moved = next((new for old, new in MOVED.items() if old in command), None)
    if moved:
        return f" (now `{moved}`)"
    today = command
    for pattern, spelling in RENAMED_LEVERS:
        today = pattern.sub(spelling, today)
    return f" (now `{today}`)" if today != command else ""


def _command(text: str) -> str:
    """A recorded command as a code block, and today's where its script has moved."""
    block = f"```\n{text}\n```"
    moved = now(text)
    return f"{block}\n\nThe command as recorded{moved}; `benchmarks/README.md` gives its flags." if moved else block


# --- evaluation files (``distill eval --json``) -----------------------------------------------------------------


def run_key(result: dict[str, Any], suffix: str) -> str:
    """The one run of an eval result whose name ends with ``suffix``."""
    keys = [k for k in result["results"] if k.endswith(suffix)]
    if len(keys) != 1:
        raise KeyError(f"results page: {result.get('command', '?')[:80]}: {len(keys)} runs end with {suffix!r}")
    return keys[0]


def ndcg10(result: dict[str, Any], suffix: str) -> float:
    return result["results"][run_key(result, suffix)]["nDCG@10"]


def versus_first(result: dict[str, Any], suffix: str, metric: str = "nDCG@10") -> str:
    """``+4.01, p = 0.35``: a run's difference from the file's first run, with its test's p-value."""
    test = (result.get("significance") or {}).get("results", {}).get(run_key(result, suffix))
    if not test or metric not in test:
        return ""
    t = test[metric]
    p = t["p_value"]
    return f"{t['difference']:+.2f}, p {'< 0.001' if p < 0.001 else f'= {p:.3f}'}"


def fidelity(result: dict[str, Any], suffix: str) -> float | None:
    """The mean per-query Spearman of a run with the file's teacher label, where the file has one."""
    found = (result.get("fidelity") or {}).get("results", {}).get(run_key(result, suffix))
    return None if found is None else found["spearman"]


def label_rows(path: str) -> dict[str, float]:
    """``experiments/quality.py teacher``'s file: label -> nDCG@10."""
    return {r["label"]: r["nDCG@10"] for r in load(path)["rows"]}


# --- the demo (``make demo``'s output) ----------------------------------------------------------------------------

DEMO = "demo-cpu.txt"
DEMO_FUSED = "student (auto) fused with the first stage"
"""The demo's run of the student fused with the first stage (``fuse`` in its pipeline YAML)."""


def demo() -> dict[str, Any]:
    """``benchmarks/results/demo-cpu.txt``: its first line, the nDCG@10 table (run -> value) and its query count."""
    text = (RESULTS / DEMO).read_text()
    queries = re.search(r"nDCG@10 on (\d+) evaluation queries", text)
    ndcg: dict[str, float] = {}
    block = text.split("nDCG@10 on", 1)[1].split("==", 2)[1] if queries else ""
    for line in block.splitlines():
        match = re.match(r"\s+(\S.*?)\s+(-?\d+\.\d+)\s*$", line)
        if match:
            ndcg[match.group(1)] = float(match.group(2))
    if not queries or "student (auto)" not in ndcg:
        raise ValueError(f"results page: benchmarks/results/{DEMO}: no 'student (auto)' nDCG@10 table")
    return {"title": text.splitlines()[0].lstrip("# "), "queries": int(queries.group(1)), "ndcg": ndcg, "text": text}


# --- latency benchmarks (``distill bench``'s bench.json) ----------------------------------------------------------


def bench_cell(result: dict[str, Any], method: str, workload: str) -> dict[str, Any] | None:
    return next((c for c in result["cells"] if c["method"] == method and c["workload"] == workload), None)


def bench_method(result: dict[str, Any], prefix: str) -> str | None:
    """The first method whose name starts with ``prefix`` (``student auto`` -> ``student auto (openvino-bf16)``)."""
    return next((c["method"] for c in result["cells"] if c["method"].startswith(prefix)), None)


def floor_as_counted_now(result: dict[str, Any]) -> bool:
    """Whether a bench record's FLOP floors are counted as ``distill bench`` counts them now: a record without
    ``matmul.bf16_flops_per_s`` was made when low-precision backends were floored at the fp32 rate."""
    return "bf16_flops_per_s" in (result.get("matmul") or {})


def bench_table(result: dict[str, Any]) -> str:
    """p50 per call of every method on every workload; speed-ups on the last workload; nDCG@10 where measured."""
    workloads = [w["name"] for w in result["workloads"]]
    methods = list(dict.fromkeys(c["method"] for c in result["cells"]))
    last = workloads[-1]
    references = [m for m in ("student torch-fp32", "st-crossencoder", "teacher cis") if bench_cell(result, m, last)]
    quality = (result.get("quality") or {}).get("ndcg10", {})
    header = ["method", *(f"{w} (p50)" for w in workloads), *(f"vs {r} ({last})" for r in references)]
    floored = floor_as_counted_now(result)
    if floored:
        header.append(f"of FLOP floor ({last})")
    if quality:
        header.append(f"nDCG@10 ({(result.get('quality') or {}).get('queries', '?')} queries)")
    rows = []
    for method in methods:
        row: list[str] = []
        for w in workloads:
            c = bench_cell(result, method, w)
            row.append(_ms(c["p50_s"]) if c else "")
        mine = bench_cell(result, method, last)
        for r in references:
            ref = bench_cell(result, r, last)
            row.append(_x(ref["p50_s"] / mine["p50_s"]) if mine and ref else "")
        if floored:
            row.append(_pct(mine["flop_floor_s"] / mine["p50_s"]) if mine and mine.get("flop_floor_s") else "")
        if quality:
            row.append(_f(quality[method]) if method in quality else "")
        rows.append([f"`{method}`", *row])
    return _table(header, rows)


def environment(env: dict[str, Any]) -> str:
    """One line: the device, its features, threads, torch, and the commit measured."""
    parts = [env.get("device_name") or env.get("device", "?")]
    if env.get("cpu_features"):
        parts.append(env["cpu_features"])
    if env.get("torch_threads") and env.get("device") == "cpu":
        parts.append(f"{env['torch_threads']} threads")
    parts.append(f"torch {env.get('torch', '?')}")
    if env.get("git_commit"):
        parts.append(f"commit {env['git_commit'][:7]}")
    if env.get("utc"):
        parts.append(env["utc"][:10])
    return ", ".join(parts)


def cpu(result: dict[str, Any]) -> str:
    """A CPU run's machine as the headline names it, shorter than :func:`environment`: its threads, CPU and flags
    (``2 threads, AMD EPYC: avx2 ...``)."""
    env = result["environment"]
    flags = env["cpu_features"].split(" ", 1)[-1]
    return f"{env['torch_threads']} threads, {env['device_name']}: {flags}"


def backend_of(method: str) -> str:
    """The backend a bench method resolved to: ``openvino-bf16`` of ``student auto (openvino-bf16)``."""
    return method.split("(")[-1].rstrip(")")


# --- GPU suite ------------------------------------------------------------------------------------------------------

GPU_RUNS = {"gpu-h100.md": "gpu-suite-h100", "gpu-h200.md": "gpu-suite-h200"}
"""Results page -> the GPU suite's run folder: the H100's with every stage's default flags, and the H200's first run,
before those defaults (its teacher figures with the levers given as flags), whose page lists the H200's later runs."""
GPU = "gpu-suite-h200/2026-11-30-6910ee6/call1-eccd358/stages"
"""The GPU run the headline reads: the newest of every stage at its default flags (its record's ``README.md`` is one
folder up, and the H200 page shows it with the later runs)."""
GPU_LEVERS = "gpu-suite-h200"
"""The run with the teacher's extra runs (``teacher-levers*.json``: the levers given as flags, before they were the
defaults)."""


def gpu_figure(summary: dict[str, Any], stage: str, figure: str) -> dict[str, Any]:
    return next(f for f in summary["figures"] if f["stage"] == stage and f["figure"] == figure)


def _value(figure: dict[str, Any], value: Any) -> str:
    name = figure["figure"]
    if isinstance(value, bool) or value is None:
        return "" if value is None else ("yes" if value else "no")
    if name.endswith("_s") and not name.endswith("per_s"):
        return _ms(value)
    if "fraction" in name or name == "mfu":
        return _pct(value)
    if "speedup" in name:
        return _x(value)
    if name == "seconds":
        return f"{value:.0f} s"
    if isinstance(value, float):
        return f"{value:.3g}" if value < 10 else f"{value:,.0f}"
    return str(value)


def gpu_summary_table(summary: dict[str, Any]) -> str:
    rows = []
    for f in summary["figures"]:
        target = (
            ""
            if f["target"] is None
            else ("≥ " if f["kind"] == "min" else "≤ " if f["kind"] == "max" else "") + _value(f, f["target"])
        )
        met = {True: "met", False: "**not met**", None: ""}[f["met"]]
        rows.append([f["stage"], f"`{f['figure']}`", _value(f, f["value"]), target, met])
    return _table(["stage", "figure", "measured", "target", ""], rows)


def teacher_bench_row(links: Links, path: str) -> list[str]:
    """A teacher throughput result (:mod:`benchmarks.teacher_throughput`): workload, % of the ceiling, speed-ups over
    the plain and naive loops."""
    r = load(path)
    row = [
        links(path),
        f"{r['workload']['queries']} queries, {r['teacher']['pairs']:,} pairs",
        _pct(r["teacher"]["flop_ceiling_fraction"]),
        f"{r['teacher']['pairs_per_s']:.1f}",
        _x(r["speedup_over_plain_pairs_per_s"]) if r.get("speedup_over_plain_pairs_per_s") else "",
        _x(r["speedup_pairs_per_s"]),
    ]
    return row


# --- the headline table -----------------------------------------------------------------------------------------

EVAL_DL19 = "eval-dl19-bm25-smollm2.json"
TEACHERS_DL19 = "quality-dl19-teacher.json"
ENSEMBLE = "z(gemma.cis) + z(gemma.cis_q) + z(smollm2.upr)"
"""The three-teacher ensemble label, as the DL19 file spells it (SmolLM2's DL19 labels carry ``upr``, which ranks
as ``cis_q`` within a query)."""
STUDENT_GEMMA = "quality-dl19-dl2122-gemma-seg-zcis-listwise_kl-lr3e-5.json"
STUDENT_BEST = "quality-dl19-dl2122-ens3-seg-listwise_kl.json"
FINAL = "quality/final.json"
"""The final student's DL19 test on each first stage (``experiments/first_stages.py final``)."""
FIRST_STAGE_NAMES = {"bm25": "BM25", "tasb": "TAS-B", "splade": "SPLADE++"}
BENCH_AUTO = "bench-cpu-auto-dl2122-final/bench.json"
"""A MiniLM-L6 student's CPU backends, ``auto`` among them, against PyTorch and ``CrossEncoder.predict``."""
BENCH_FINAL = "bench-cpu-fs-mpnet-student-final/bench.json"
"""A student of the final student's architecture (all-mpnet-base-v2, every layer apart) on the CPU backends."""
SCALE = "scale-cpu/scale.json"


def headline(links: Links) -> str:
    """The README's table (and the results index's): one row a finding, each linking to its results file."""
    base = load(EVAL_DL19)
    teachers = label_rows(TEACHERS_DL19)
    gemma, best = load(STUDENT_GEMMA), load(STUDENT_BEST)
    bm25 = ndcg10(base, "/first_stage")
    d = demo()
    bm25_demo = next(v for k, v in d["ndcg"].items() if k.endswith("first_stage"))
    bench = load(BENCH_AUTO)
    auto = bench_method(bench, "student auto")
    workload = bench["workloads"][-1]["name"]
    p50 = {m: bench_cell(bench, m, workload)["p50_s"] for m in (auto, "student torch-fp32", "st-crossencoder")}
    large = load(BENCH_FINAL)
    large_auto = bench_method(large, "student auto")
    large_p50 = {m: bench_cell(large, m, workload)["p50_s"] for m in (large_auto, "student onnx-fp32")}
    summary = load(f"{GPU}/summary.json")
    device = summary["device_name"].replace("NVIDIA ", "").split()[0]
    teacher_ceiling = gpu_figure(summary, "teacher", "flop_ceiling_fraction")["value"]
    teacher_speed = gpu_figure(summary, "teacher", "speedup_over_plain_batched_loop")["value"]
    syncs = gpu_figure(summary, "train", "host_syncs_in_timed_steps")["value"]
    train_mfu = gpu_figure(summary, "train", "mfu")["value"]
    train_speed = gpu_figure(summary, "train", "speedup_over_plain_loop")["value"]
    rerank = gpu_figure(summary, "rerank", "torch-fp16_100_candidates_p50_s")["value"]
    rerank_st = gpu_figure(summary, "rerank", "speedup_over_st_crossencoder")["value"]
    final_backbone = load(FINAL)["backbone"]
    scale = load(SCALE)
    million = next(r for r in scale["rows"] if r["pairs"] == 1_000_000)
    rows = [
        ["nDCG@10, TREC DL19 (43 queries, BM25 top-100): BM25", _f(bm25), links(EVAL_DL19)],
        [
            "SmolLM2-135M teacher: `cis` (the paper's score) / `upr` (query likelihood)",
            f"{_f(ndcg10(base, '/cis'))} / {_f(ndcg10(base, '/upr'))}",
            links(EVAL_DL19),
        ],
        [
            "Gemma-3-270m teacher: `cis` / `cis_q`",
            f"{_f(teachers['gemma.cis'])} / {_f(teachers['gemma.cis_q'])}",
            links(TEACHERS_DL19),
        ],
        [
            "Three-teacher label `z(gemma.cis) + z(gemma.cis_q) + z(smollm2.cis_q)`",
            _f(teachers[ENSEMBLE]),
            links(TEACHERS_DL19),
        ],
        [
            "MiniLM-L6 student of Gemma's CIS alone: alone / + first stage",
            f"{_f(ndcg10(gemma, '/dl19-bm25.trec'))} / {_f(ndcg10(gemma, '/dl19-bm25-interp.trec'))}",
            links(STUDENT_GEMMA),
        ],
        [
            "MiniLM-L6 student of the three-teacher label (best on validation)",
            _f(ndcg10(best, "/dl19-bm25.trec")),
            links(STUDENT_BEST),
        ],
        *final_rows(load(FINAL), links),
        [
            f"`make demo` on a 2-core CPU, {d['queries']} DL19 queries it never saw: the student alone / fused with "
            "BM25 (α chosen on DL21), against BM25",
            f"{_f(d['ndcg']['student (auto)'])} / {_f(d['ndcg'][DEMO_FUSED]) if DEMO_FUSED in d['ndcg'] else '-'} "
            f"against {_f(bm25_demo)}",
            links(DEMO),
        ],
        [
            f'CPU reranking with a MiniLM-L6 student, {workload} ({cpu(bench)}): `backend="auto"` ({backend_of(auto)})',
            f"{_ms(p50[auto])}: {_x(p50['student torch-fp32'] / p50[auto])} PyTorch fp32, "
            f"{_x(p50['st-crossencoder'] / p50[auto])} `CrossEncoder.predict`",
            links(BENCH_AUTO),
        ],
        [
            f"CPU reranking with a student of the final one's architecture ({final_backbone}), {workload} "
            f'({cpu(large)}): `backend="auto"` ({backend_of(large_auto)})',
            f"{large_p50[large_auto]:.2f} s: {_x(large_p50['student onnx-fp32'] / large_p50[large_auto])} ONNX fp32",
            links(BENCH_FINAL),
        ],
        [
            f"{device} teacher (Llama-3-8B shapes, default flags): of the bf16 ceiling, over the plain loop",
            f"{_pct(teacher_ceiling)}, {_x(teacher_speed)}",
            links(f"{GPU}/summary.json"),
        ],
        [
            f"{device} student training (bert-large, the GPU config): MFU, over the plain loop, host syncs in its "
            "timed steps",
            f"{_pct(train_mfu)}, {_x(train_speed)}, {syncs}",
            links(f"{GPU}/summary.json"),
        ],
        [
            f"{device} reranking, bert-large fp16, 100 candidates, tokenising included: p50, over "
            "`CrossEncoder.predict`",
            f"{_ms(rerank)}, {_x(rerank_st)}",
            links(f"{GPU}/summary.json"),
        ],
        [
            "1M training pairs on a 2-core CPU: data setup cold / cached, peak RSS above baseline",
            f"{million['student_cold']['seconds']:.0f} s / {million['student_cached']['seconds']:.2f} s, "
            f"{million['student_cold']['peak_above_baseline_bytes'] / 2**20:.0f} MiB",
            links(SCALE),
        ],
        [*serve_headline(load(SERVE)), links(SERVE)],
    ]
    return _table(["result", "figure", "results file"], rows)


def final_rows(final: dict[str, Any], links: Links) -> list[list[str]]:
    """One headline row per DL19 first stage of the final student: the first stage, the student alone, fused."""
    rows = []
    for stage, r in final["dl19"].items():
        alone, fused = (("*" if r[f"p_{x}_vs_first_stage"] < 0.05 else "") for x in ("student", "fused"))
        rows.append(
            [
                f"Final student `{final['student']}` ({final['backbone']}; BM25 and SPLADE++ candidates, chosen "
                f"on {final['validation_queries']} DL21 queries), DL19 {FIRST_STAGE_NAMES.get(stage, stage)} top-100: "
                "first stage / student alone / fused (α); `*`: differs from the first stage, paired t-test p < 0.05",
                f"{_f(r['first_stage'])} / {_f(r['student'])}{alone} / {_f(r['fused'])}{fused} ({r['alpha']:g})",
                links(FINAL),
            ]
        )
    return rows


def _delta(d: dict[str, Any]) -> str:
    """A mean difference with its 95% interval: ``+0.45 [-0.21, +1.23]``."""
    return f"{d['difference']:+.2f} [{d['interval'][0]:+.2f}, {d['interval'][1]:+.2f}]"


RUN_OPTIONS = ("--run_name", "--data.val_fold")
"""A training command's options that name the run or its fold, not what it trains: no lever changes them."""


def train_options(row: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """The options of a selection row's first ``distill train`` command: option -> its value, the last one given as
    the command line parser takes it (every ``--config`` in order, as they compose), without :data:`RUN_OPTIONS`."""
    command = next(c for c in row["commands"] if c.startswith("distill train"))
    options: dict[str, tuple[str, ...]] = {}
    key = None
    for word in shlex.split(command)[2:]:
        if word.startswith("--"):
            key, _, value = word.partition("=")
            options[key] = options.get(key, ()) if key == "--config" else ()
            if value:
                options[key] += (value,)
        elif key is not None:
            options[key] += (word,)
    return {k: v for k, v in options.items() if k not in RUN_OPTIONS}


def changed_options(variant: dict[str, Any], base: dict[str, Any]) -> dict[str, str]:
    """The options whose values differ between two rows' training commands: option -> how a table shows the change
    (``--option value``, the option alone when its value is long, ``without --option`` when only ``base`` has it)."""
    ours, theirs = train_options(variant), train_options(base)
    changes = {}
    for key in sorted(ours.keys() | theirs.keys()):
        if ours.get(key) == theirs.get(key):
            continue
        value = " ".join(ours.get(key, ()))
        changes[key] = f"without `{key}`" if key not in ours else f"`{key} {value}`" if len(value) <= 24 else f"`{key}`"
    return changes


NOISE = {"--seed_everything"}
"""A variant that changes only these options is the same setting with other random draws: its difference is
training noise."""


def compared_students(final: dict[str, Any]) -> tuple[str, ...]:
    """The students a lever is compared with: the final student and the final student its selection replaced (the
    selection record's ``final_before``), whose levers stay on the page once one of them is chosen."""
    before = load(final["selection"]).get("final_before")
    return (final["student"],) + ((before,) if before not in (None, final["student"]) else ())


def levers_section(final: dict[str, Any], links: Links) -> list[str]:
    """Every selection that compared variants with a student of :func:`compared_students` (``select ... --against``
    it): a row a variant, the student it was compared with, what its training command changes, its difference with
    that student on each first stage's held-out DL21 lists and its fused nDCG@10. A variant that changes only
    :data:`NOISE` is named as training noise, the yardstick for the others; the final student's own row, where it
    was a lever against the student it replaced, is marked."""
    student = final["student"]
    compared = compared_students(final)
    rows, noise = [], []
    for path in sorted((RESULTS / "quality").glob("selection-*.json")):
        name = f"quality/{path.name}"
        record = load(name)
        against = next((s for s in compared if s in record["against"]), None)
        if against is None:
            continue
        base = next(row for row in record["rows"] if row["name"] == against)
        for row in record["rows"]:
            if row["name"] in (against, record["reference"]):
                continue
            changes = changed_options(row, base)
            if changes.keys() <= NOISE:
                noise.append(f"`{row['name']}`")
            chosen = " (the final student)" if row["name"] == student else ""
            cells = [f"`{row['name']}`{chosen}", f"`{against}`", ", ".join(changes.values())]
            cells += [_delta(row["student_vs"][against][stage]) for stage in ("bm25", "splade")]
            cells += [f"{_f(row[stage]['fused'])} ({row[stage]['alpha']:g})" for stage in ("bm25", "splade")]
            rows.append([*cells, links(name)])
    if not rows:
        return []
    fused = [f"{_f(v['fused'])} ({v['alpha']:g})" for v in (final["dl21_validation"][s] for s in ("bm25", "splade"))]
    replaced = f", or with the final student it replaced, `{compared[1]}`" if len(compared) > 1 else ""
    yardstick = (
        [
            f"{' and '.join(noise)} {'changes' if len(noise) == 1 else 'change'} only the random draws: the same "
            "setting trained again, so the Δ is training noise alone. A lever whose Δ is no larger is not told apart "
            "from the final student by these lists.",
            "",
        ]
        if noise
        else []
    )
    return [
        "## Levers tried against the final student",
        "",
        f"Each variant below was trained on the same folds and compared on the same held-out DL21 lists with the "
        f"final student, `{student}`{replaced}: what its training command changes, the mean difference of the "
        "student alone with its 95% paired-bootstrap interval over the queries, and the variant fused with the first "
        f"stage by the α chosen on those lists (`{student}`: {fused[0]} and {fused[1]}). Its record holds the "
        "commands.",
        "",
        _table(
            [
                "variant",
                "compared with",
                "changes",
                "BM25 list Δ [95%]",
                "SPLADE++ list Δ [95%]",
                "fused BM25 (α)",
                "fused SPLADE++ (α)",
                "record",
            ],
            rows,
        ),
        "",
        *yardstick,
    ]


def seeds_section(links: Links) -> list[str]:
    """Every comparison of settings over their seeds (``first_stages.py seeds``, ``quality/seeds-*.json``): a row a
    setting, its held-out DL21 nDCG@10 averaged over its seeds, alone and fused, and its difference with the record's
    baseline."""
    tables = []
    for path in sorted((RESULTS / "quality").glob("seeds-*.json")):
        name = f"quality/{path.name}"
        record = load(name)
        rows = []
        for row in record["rows"]:
            cells = [f"`{row['name']}`", str(len(row["seeds"]))]
            for stage in ("bm25", "splade"):
                r = row[stage]
                cells += [_f(r["student"]), _delta(r["student_vs"]), _f(r["fused"]), _delta(r["fused_vs"])]
            rows.append(cells)
        tables += [
            f"`{record['command']}` ({links(name)}): nDCG@10 on {record['split']}; Δ against `{record['against']}`'s "
            "seeds with its 95% paired-bootstrap interval.",
            "",
            _table(
                [
                    "setting",
                    "seeds",
                    "BM25 list",
                    "Δ [95%]",
                    "fused",
                    "Δ [95%]",
                    "SPLADE++ list",
                    "Δ [95%]",
                    "fused",
                    "Δ [95%]",
                ],
                rows,
            ),
            "",
            *ensembles_table(record),
        ]
    return ["## Settings compared over seeds", "", *tables] if tables else []


def ensembles_table(record: dict[str, Any]) -> list[str]:
    """A seeds record's ensembles (the members' runs scored together), each against the mean of its members; none
    in a record written before ``seeds`` scored them."""
    rows = []
    for mine in record.get("ensembles", []):
        cells = [mine["name"], str(len(mine["members"]))]
        for stage in ("bm25", "splade"):
            r = mine[stage]
            cells += [_f(r["student"]), _delta(r["student_vs_seed_mean"])]
            cells += [f"{_f(r['fused'])} ({r['alpha']:g})", _delta(r["fused_vs_seed_mean"])]
        rows.append(cells)
    if not rows:
        return []
    header = ["ensemble", "members", "BM25 list", "Δ [95%]", "fused (α)", "Δ [95%]"]
    header += ["SPLADE++ list", "Δ [95%]", "fused (α)", "Δ [95%]"]
    return [
        "The same seeds scored together (the mean of their per-query z-scores), fused by an α chosen on the same "
        "lists; Δ against the mean of the members' own figures.",
        "",
        _table(header, rows),
        "",
    ]


def depth_section(links: Links) -> list[str]:
    """Every rerank-depth record (``first_stages.py depth``, ``quality/depth-*.json``): a row a first stage and depth
    k, the setting reordering only the first stage's top k, alone and fused, against reordering all 100."""
    tables = []
    for path in sorted((RESULTS / "quality").glob("depth-*.json")):
        name = f"quality/{path.name}"
        record = load(name)
        rows = [
            [
                FIRST_STAGE_NAMES.get(row["first_stage"], row["first_stage"]),
                str(row["depth"]),
                _f(row["student"]),
                _delta(row["student_vs_100"]),
                _f(row["fused"]),
                _delta(row["fused_vs_100"]),
            ]
            for row in record["rows"]
        ]
        tables += [
            f"`{record['command']}` ({links(name)}): `{record['setting']}` ({len(record['seeds'])} seeds) reordering "
            f"only the first stage's top k, the rest below in its order; nDCG@10 on {record['split']}. Δ: against "
            "all 100, with its 95% paired-bootstrap interval. Below 100, the first stage chooses what the student may "
            "lift, so the student alone is a fusion too.",
            "",
            _table(["first stage", "k", "student alone", "Δ [95%]", "fused", "Δ [95%]"], rows),
            "",
        ]
    return ["## Rerank depth", "", *tables] if tables else []


def first_stages_section(links: Links) -> list[str]:
    """The students trained on BM25's and SPLADE++'s candidates: their selection on all of DL21, the levers tried
    since and the final student's DL19 test per first stage (``experiments/first_stages.py``)."""
    final = load(FINAL)
    selection_file = final.get("selection", "quality/selection-dl21.json")
    selection = load(selection_file)
    rows = []
    for row in selection["rows"]:
        cells = [f"`{row['name']}`"]
        for stage in ("bm25", "splade"):
            r = row[stage]
            cells += [_f(r["student"]), _delta(r["student_vs_reference"]), f"{_f(r['fused'])} ({r['alpha']:g})"]
        rows.append(cells)
    for label, ndcg in selection["teachers"].items():
        rows.append([f"teacher: {label}", _f(ndcg["bm25"]), "", "", _f(ndcg["splade"]), "", ""])
    incumbent = selection["final_before"]
    comparisons = []
    for baseline in selection["against"]:
        what = "the final student when this selection ran" if baseline == incumbent else "a baseline"
        against = [
            [f"`{row['name']}`", *(_delta(row["student_vs"][baseline][stage]) for stage in ("bm25", "splade"))]
            for row in selection["rows"]
        ]
        comparisons += [
            f"Each student alone against `{baseline}`, {what}: the mean difference with its 95% paired-bootstrap "
            "interval over the same queries.",
            "",
            _table(["variant", "BM25 list Δ [95%]", "SPLADE++ list Δ [95%]"], against),
            "",
        ]
    test = [
        [
            FIRST_STAGE_NAMES.get(stage, stage),
            _f(r["first_stage"]),
            f"{_f(r['student'])} (p {r['p_student_vs_first_stage']:.3f})",
            f"{_f(r['fused'])} (p {r['p_fused_vs_first_stage']:.3f})",
            f"{r['alpha']:g}",
        ]
        for stage, r in final["dl19"].items()
    ]
    header = ["variant", "BM25 list", "Δ [95%]", "fused (α)", "SPLADE++ list", "Δ [95%]", "fused (α)"]
    return [
        "## Students for the first stages users rerank",
        "",
        f"`{selection['command']}` ({links(selection_file)}): nDCG@10 on {selection['split']}. Δ is "
        f"a student's mean difference with `{selection['reference']}` (BM25's candidates alone) with its 95% paired-"
        "bootstrap interval; fused: with the first stage, by the α chosen on the same pooled lists.",
        "",
        _table(header, rows),
        "",
        *comparisons,
        f"`{final['command']}` ({links(FINAL)}): `{final['student']}` refitted on every list with those α, tested once "
        "on all 43 DL19 queries (TAS-B takes SPLADE++'s α; p: paired t-test against the first stage).",
        "",
        _table(["first stage", "first stage", "student alone", "fused", "α"], test),
        "",
        *levers_section(final, links),
        *seeds_section(links),
        *depth_section(links),
    ]


def readme_block() -> str:
    """The README's generated block, markers included."""
    return "\n".join(
        [
            BEGIN,
            f"<!-- generated from benchmarks/results/ by `{FIX}`: do not edit -->",
            headline(Links("benchmarks/results/")),
            END,
        ]
    )


def replace_block(text: str, block: str) -> str:
    """``text`` with its ``results`` block replaced by ``block``."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"README.md has no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    return head + block + rest.split(END, 1)[1]


def write_readme(readme: Path | None = None) -> bool:
    """Rewrite the README's block from the committed results; True if it changed."""
    readme = readme or README
    text = readme.read_text()
    new = replace_block(text, readme_block())
    if new != text:
        readme.write_text(new)
    return new != text


def readme_is_current(readme: Path | None = None) -> bool:
    """Whether the README's block is what the committed results give."""
    text = (readme or README).read_text()
    return replace_block(text, readme_block()) == text


# --- the pages ------------------------------------------------------------------------------------------------------


def _generated() -> str:
    return (
        "<!-- generated by benchmarks/results_pages.py from benchmarks/results/ at build time -->\n\n"
        '!!! note "Generated"\n    Every figure on this page is read from a committed file in `benchmarks/results/`, '
        "linked from its row.\n\n"
    )


def page_index(links: Links) -> str:
    return "\n".join(
        [
            "# Results",
            "",
            _generated(),
            "The headline figures, each from the results file its row links to (the README's table is the same,",
            "generated by the same code). Every measurement names its machine: compare figures within one file,",
            "where they were measured in one run.",
            "",
            headline(links),
            "",
            "- [Teachers](teachers.md): the teacher scores on DL19 and on the validation queries, behind other first",
            "  stages, and the teacher stage's throughput.",
            "- [Students](students.md): every student variant on validation, the chosen ones tested once on DL19.",
            "- [CPU latency](latency-cpu.md): `distill bench` on a CPU, every backend.",
            "- [GPU (H100)](gpu-h100.md) and [GPU (H200)](gpu-h200.md): the GPU suite, with the default flags on the",
            "  H100, before them on the H200.",
            "- [Scale](scale.md): the data layer from 10k to 10M pairs.",
            "- [Serving](serving-cpu.md): `distill serve` under load on a CPU, against one request at a time and",
            "  `CrossEncoder.predict`.",
            "- [The demo](demo.md): `make demo`'s output.",
            "- [Every results file](files.md), with the command that wrote it.",
            "",
            "To add a result: run its command (it writes its file into `benchmarks/results/`), commit the file, and",
            "rerun `python -m benchmarks.results_pages readme` if it changes a headline figure. No figure is",
            "typed by hand.",
            "",
        ]
    )


SCORES = {
    "first_stage": "BM25 (the input order)",
    "cis": "`cis` (the paper's score)",
    "cond": "`cond` (without log p(K))",
    "noprompt": "`noprompt` (without the prompt)",
    "upr": "`upr` (query likelihood)",
}


TEACHER_FINDINGS = """## What the tables show

- At 135M parameters the paper's CIS ranks below BM25, while query likelihood (`upr`) from the same model
  beats it; the paper needed GPT-2 1.5B for CIS to pay off. The stage computes every score from the same
  forward passes, so which to distil is measured, not assumed.
- A twice larger teacher (Gemma-3-270m) lifts CIS by several points on validation and on DL19, while query
  likelihood barely moves. CIS alone is still below BM25 at 270M parameters.
- The two directions and the two models disagree usefully: the three-way ensemble
  `z(gemma.cis) + z(gemma.cis_q) + z(smollm2.cis_q)` is the best label on validation, and it holds on DL19;
  adding the first stage no longer helps it much.
- Behind TAS-B or SPLADE candidates, the small teacher ranks far below those first stages.

"""
"""What the teachers' tables show, in words (no figure: the tables hold them)."""

STUDENT_FINDINGS = """## What the earlier round showed

- **The head decides it.** The paper's [CLS] head starts at random, and a few thousand pairs of CPU training
  leave it near chance on validation; the segment-cosine head starts from the backbone's own similarity and
  learns the teacher's ordering far more faithfully.
- **Listwise beats pointwise.** The within-query losses (listwise KL, margin MSE, RankNet) sit close together,
  and MSE, with either scaling, loses far more.
- **The paper's claim holds at 270M parameters.** A student distilled from Gemma's CIS alone, with no first-stage
  term in its label, beats BM25 on DL19 and beats its own teacher, on validation and on DL19.
- **Ensembles teach best.** The student of the three-teacher label is the best on validation and agrees with its
  label most; a higher listwise-KL temperature lowered that agreement, more training raised it.
- **Only behind BM25.** Trained on BM25's candidates alone, the students lift BM25's list, but rank TAS-B's and
  SPLADE's lists far worse than those lists arrived; interpolation only halves the damage. The students of the
  sections above, trained on SPLADE++'s candidates too, are what came of it.
- With 16 validation queries, students close to each other are within noise; nothing is chosen on DL19.

"""
"""What the students' tables show, in words."""


def page_teachers(links: Links) -> str:
    base = load(EVAL_DL19)
    rows = []
    for key, name in SCORES.items():
        r = base["results"][run_key(base, f"/{key}")]
        rows.append([name, _f(r["nDCG@1"]), _f(r["nDCG@5"]), f"**{_f(r['nDCG@10'])}**", versus_first(base, f"/{key}")])
    first = [
        "# Results: teachers",
        "",
        _generated(),
        TEACHER_FINDINGS,
        "## SmolLM2-135M-Instruct on TREC DL19 (BM25 top-100, 43 queries, fp32)",
        "",
        f"From {links(EVAL_DL19)}:",
        "",
        _command(base["command"]),
        "",
        "trec_eval's convention (unjudged passages are irrelevant); the last column is the change in nDCG@10 from",
        "BM25 with its paired t-test's p-value.",
        "",
        _table(["ranking", "nDCG@1", "nDCG@5", "nDCG@10", "Δ nDCG@10 vs BM25"], rows),
        "",
        "## The same teacher behind dense and learned-sparse first stages (DL19 top-100)",
        "",
    ]
    rows = []
    for name, path in (("TAS-B", "eval-dl19-tasb-smollm2.json"), ("SPLADE", "eval-dl19-splade-smollm2.json")):
        r = load(path)
        rows.append([name, *(_f(ndcg10(r, f"/{k}")) for k in ("first_stage", "cis", "upr")), links(path)])
    first += [_table(["candidates", "first stage", "`cis`", "`upr`", "file"], rows), ""]

    val, test = label_rows("quality-dl21-val-teacher.json"), label_rows(TEACHERS_DL19)
    rows = []
    for label, value in val.items():
        dl19 = test.get(label, test.get(label.replace("smollm2.cis_q", "smollm2.upr")))
        rows.append([f"`{label}`", _f(value), "" if dl19 is None else _f(dl19)])
    first += [
        "## Two teachers and their ensembles: validation (16 DL21 queries) and DL19 (43 queries)",
        "",
        f"From {links('quality-dl21-val-teacher.json')} and {links(TEACHERS_DL19)} (`z(...)` standardises a score",
        "within each query; SmolLM2's DL19 labels carry `upr`, which ranks as its `cis_q` within a query). Labels",
        "are chosen on validation; DL19 is the test.",
        "",
        _table(["label", "validation nDCG@10", "DL19 nDCG@10"], rows),
        "",
        "## Multi-hop QA: the HotpotQA sample's given paragraph order",
        "",
    ]
    hotpot = load("eval-hotpotqa-first-stage.json")
    [(run, figures)] = hotpot["results"].items()
    first += [
        f"From {links('eval-hotpotqa-first-stage.json')}: supporting-paragraph recall R@k and precision P@k.",
        "",
        _table(["run", *figures], [[f"`{run}`", *(_f(v) for v in figures.values())]]),
        "",
        "## Teacher-stage throughput",
        "",
        "`python -m benchmarks.teacher_throughput`: the stage's scorer against a plain batched loop (padded",
        "batches, full-vocabulary log-softmax) and a naive one-pair-at-a-time loop, on the same model in the same run",
        "(the older files were written by `benchmarks/teacher.py`, the same benchmark).",
        "",
    ]
    rows = [
        teacher_bench_row(links, p)
        for p in (
            "teacher-cpu-smollm2-135m.json",
            f"{GPU}/teacher.json",
            f"{GPU_LEVERS}/teacher.json",
            f"{GPU_LEVERS}/teacher-levers.json",
            f"{GPU_LEVERS}/teacher-levers-dl19.json",
        )
    ]
    first += [
        _table(
            ["file", "workload", "of the matmul ceiling", "pairs/s", "over the plain loop", "over the naive loop"], rows
        ),
        "",
        "Labelling logs of the Gemma-3-270m teacher on this project's 2-core CPU, with their commands and times: "
        + ", ".join(links(p) for p in result_files() if p.startswith("teach-cpu-"))
        + ".",
        "",
    ]
    return "\n".join(first)


def _students_test_rows(links: Links) -> list[list[str]]:
    rows = []
    for path in sorted(p for p in result_files() if re.fullmatch(r"quality-dl19-(?!teacher|tasb-|splade-).*\.json", p)):
        r = load(path)
        name = path.removeprefix("quality-dl19-").removesuffix(".json")
        alone, interp = "/dl19-bm25.trec", "/dl19-bm25-interp.trec"
        spearman = fidelity(r, alone)
        label = (r.get("fidelity") or {}).get("label", "")
        rows.append(
            [
                links(path, f"`{name}`"),
                f"`{label}`" if label else "",
                f"{_f(ndcg10(r, alone))} ({versus_first(r, alone)})",
                f"{_f(ndcg10(r, interp))} ({versus_first(r, interp)})",
                "" if spearman is None else f"{spearman:.3f}",
            ]
        )
    return rows


def page_students(links: Links) -> str:
    val = load("quality-dl21-val.json")
    rows = []
    for v in val["rows"]:
        b = v["best"]
        own = f"quality/val-{v['name']}.json"
        rows.append(
            [
                links(own, f"`{v['name']}`") if (RESULTS / own).exists() else f"`{v['name']}`",
                f"{b['epoch'] + 1:.0f}",
                _f(b["val/nDCG@10"]),
                f"{_f(b['val/interp_nDCG@10'])} ({b['val/interp_alpha']:.2f})",
                f"{b['val/fidelity_spearman']:.3f}",
                _f(b["val/teacher_nDCG@10"]),
                _f(b["val/first_stage_nDCG@10"]),
            ]
        )
    parts = [
        "# Results: students",
        "",
        _generated(),
        "Students trained on CPU from the teachers' labels, newest first (see [Train](../stages/train.md)):",
        "",
        "- **The current round** (the first two sections): students for the first stages users rerank, trained on",
        "  BM25's and SPLADE++'s candidates of TREC DL21 and DL22 and chosen on all 53 judged DL21 queries, each",
        "  scored by a student that did not train on it; DL19 is the test, run once, and chooses nothing.",
        "  `python experiments/first_stages.py` holds every variant as a command.",
        "- **The earlier round** (from *What the earlier round showed* on): all-MiniLM-L6-v2 students (22M",
        "  parameters) trained on BM25's candidates of DL21 and DL22 alone and chosen on one seeded split of 16 judged",
        "  DL21 queries. `python experiments/quality.py` holds every variant as a command.",
        "- **The first students**, trained on DL19's own queries before DL19 became the test year.",
        "",
        *first_stages_section(links),
        STUDENT_FINDINGS,
        "## Validation: 16 DL21 queries",
        "",
        f"From {links('quality-dl21-val.json')} (each variant's command is in the file, and in",
        '`quality-dl21-val.md`). The best epoch is kept; "+ first stage" interpolates with BM25 at the weight α',
        "chosen on these queries; Spearman is the per-query agreement with the teacher's label.",
        "",
        _table(
            ["variant", "epoch", "nDCG@10", "+ first stage (α)", "Spearman with the label", "teacher", "BM25"], rows
        ),
        "",
        "## Test: TREC DL19, 43 queries, BM25 top-100",
        "",
        "Each file holds the `distill eval` command, t-tests against BM25 and the per-query agreement with the",
        "student's label (Spearman, last column).",
        "",
        _table(
            ["student (results file)", "label", "nDCG@10 alone (Δ vs BM25)", "+ first stage (Δ vs BM25)", "Spearman"],
            _students_test_rows(links),
        ),
        "",
        "## Behind a dense or learned-sparse first stage (DL19 TAS-B and SPLADE top-100)",
        "",
    ]
    rows = []
    for path in sorted(p for p in result_files() if re.fullmatch(r"quality-dl19-(tasb|splade)-.*\.json", p)):
        r = load(path)
        stage, name = path.removeprefix("quality-dl19-").removesuffix(".json").split("-", 1)
        rows.append(
            [
                links(path, f"`{name}`"),
                stage,
                _f(ndcg10(r, "/first_stage")),
                f"{_f(ndcg10(r, f'/dl19-{stage}.trec'))} ({versus_first(r, f'/dl19-{stage}.trec')})",
                f"{_f(ndcg10(r, f'/dl19-{stage}-interp.trec'))} ({versus_first(r, f'/dl19-{stage}-interp.trec')})",
            ]
        )
    parts += [
        _table(["student", "first stage", "first stage nDCG@10", "student alone (Δ)", "+ first stage (Δ)"], rows),
        "",
        "## The first students: DL19 training queries, 9 held-out DL19 queries",
        "",
    ]
    early = "eval-dl19-heldout-minilm-students.json"
    r = load(early)
    rows = [
        [f"`{k}`", _f(v["nDCG@10"]), versus_first(r, k) if k != next(iter(r["results"])) else ""]
        for k, v in r["results"].items()
    ]
    parts += [
        f"From {links(early)}, students trained on 34 DL19 queries (configs of commit 3c01ed6):",
        "",
        _command(r["command"]),
        "",
        _table(["run", "nDCG@10", "Δ vs BM25"], rows),
        "",
        "Validation curves: "
        + ", ".join(links(p) for p in result_files() if p.startswith("train-") and p.endswith(".csv"))
        + ".",
        "",
        "## int8 and the ranking (the first CIS student, all 43 DL19 queries)",
        "",
    ]
    i8 = load("int8-minilm-dl19-all-cis.json")
    rows = [
        [
            f"`{name}`",
            _f(v["nDCG@10"]),
            f"{v['delta_nDCG@10']:+.2f}" if "delta_nDCG@10" in v else "",
            f"{v['max_abs_diff']:.3f}" if "max_abs_diff" in v else "",
        ]
        for name, v in i8["results"].items()
    ]
    parts += [
        f"From {links('int8-minilm-dl19-all-cis.json')}:",
        "",
        _command(i8["command"]),
        "",
        _table(["graph", "nDCG@10", "Δ", "max abs Δscore"], rows),
        "",
        "## Training throughput",
        "",
        "`python -m benchmarks.train_throughput`: `distill train`'s step (the stage its config and flags build)",
        "against a plain loop that pads every pair to `max_length`, on the same pairs (the older files",
        "were written by `benchmarks/student_train.py`, which built the stage from its own flags).",
        "",
    ]
    rows = []
    trained = re.compile(r"(gpu-suite-h[12]00/)?student-train(-cpu-.*)?\.json")
    for path in sorted(p for p in result_files() if trained.fullmatch(p)):
        t = load(path)
        plain, stage = t["plain"], t["stage"]
        rows.append(
            [
                links(path),
                t["environment"].get("device_name", "?"),
                f"{stage['samples'] / stage['seconds']:.1f}",
                f"{plain['samples'] / plain['seconds']:.1f}",
                _x(t["speedup_samples_per_s"]),
                _pct(1 - stage["real_tokens"] / stage["padded_tokens"]),
                _pct(1 - plain["real_tokens"] / plain["padded_tokens"]),
            ]
        )
    parts += [
        _table(
            [
                "file",
                "device",
                "stage samples/s",
                "plain samples/s",
                "speed-up",
                "stage padding",
                "plain padding",
            ],
            rows,
        ),
        "",
    ]
    return "\n".join(parts)


BENCH_TITLES = {
    "bench-cpu-auto-dl2122-final": '`backend="auto"` and every backend: the final SmolLM2 student',
    "bench-cpu-dl2122-seg-hybrid-lr3e-5": "The final SmolLM2 student's backends on an Intel Xeon (AVX-512, no AMX)",
    "bench-cpu-fs-hybrid-apart-final": "The MiniLM-L6 first-stage student `hybrid-apart` (run just after the next)",
    "bench-cpu-fs-mpnet-student-final": "The final first-stage student `mpnet-student` (all-mpnet-base-v2)",
    "bench-cpu-minilm-dl19-all-cis": "The first CIS student against the teacher, the paper's protocol",
    "bench-cpu-minilm-dl19-all-cis-batch16384": "The same at a 16,384-token batch budget",
    "bench-cpu-minilm-dl21-cis": "A DL21-only student",
    "bench-cpu-unpad-minilm-budget1024": "Unpadded layers (`+unpad`) at the CPU's 1,024-token budget",
    "bench-cpu-unpad-minilm-budget32768": "Unpadded layers (`+unpad`) in the GPU's one-batch layout (32,768 tokens)",
}


def _bench_section(links: Links, path: str, title: str) -> list[str]:
    r = load(path)
    folder = path.rsplit("/", 1)[0]
    lines = [
        f"## {title}",
        "",
        f"{links(path)}: {environment(r['environment'])}.",
        "",
        _command(r["command"]),
        "",
        bench_table(r),
        "",
    ]
    if (RESULTS / folder / "bench.png").exists():
        lines += [f"![{folder}]({links.prefix}{folder}/bench.png)", ""]
    return lines


def page_latency_cpu(links: Links) -> str:
    parts = [
        "# Results: CPU latency",
        "",
        _generated(),
        "`distill bench` runs: p50 per call, tokenisation included; a DL19 query's 100 BM25 candidates (`100",
        "candidates`) or one query's candidates cut at N passage tokens (the paper's protocol). The speed-up columns",
        "are on the last workload. Each `bench.json` holds every call's time, p95, pairs/s, peak memory, the FLOP",
        "floor and the environment; timings on these shared VMs move by 10–40% between runs, so compare within one",
        "run. The FLOP floor is a call's matmul FLOPs at the matmul rate measured in the same run (fp32; int8",
        "weight matmuls at the int8 rate; a bf16 backend at the faster of the CPU's bf16 and fp32 rates). A record",
        "made before the floor was counted so (no `matmul.bf16_flops_per_s` in its `bench.json`) shows no floor",
        "column: earlier counts floored low-precision backends at the fp32 rate (int8 too, in the earliest records),",
        "and their floors went past 100% (to 423%).",
        "",
    ]
    for path in sorted(p for p in result_files() if re.fullmatch(r"bench-cpu-[^/]+/bench\.json", p)):
        folder = path.split("/")[0]
        parts += _bench_section(links, path, BENCH_TITLES.get(folder, f"`{folder}`"))
    parts += [
        "## Explorations",
        "",
        "Graph variants, session settings and OpenVINO streams (`python -m benchmarks.onnx_cpu`), and int8",
        "settings (`python -m benchmarks.int8`): "
        + ", ".join(links(p) for p in result_files() if re.fullmatch(r"(onnx-cpu|int8-q)-.*\.json", p))
        + ". Exports that the int8 bound refused, with their commands: "
        + ", ".join(links(p) for p in result_files() if p.startswith("export-") and p.endswith(".log"))
        + ".",
        "",
    ]
    return "\n".join(parts)


def later_gpu_runs(links: Links, folder: str) -> list[str]:
    """The dated records in ``folder`` (``<date>-<commit>/README.md``), each by its title, and the headline's run
    (:data:`GPU`) where it is one of them: every figure against its target."""
    records = [
        p
        for p in result_files()
        if p.startswith(f"{folder}/")
        and p.count("/") == 2
        and p.endswith("/README.md")
        and p.split("/")[1][:4].isdigit()
    ]
    if not records:
        return []
    parts = [
        "## Later runs",
        "",
        "Later calls on this device, each record's README with its machine, commands and commit:",
        "",
    ]
    for record in records:
        title = (RESULTS / record).read_text().splitlines()[0].lstrip("# ")
        parts.append(f"- {links(record, title)}")
    parts.append("")
    if GPU.startswith(f"{folder}/"):
        summary = load(f"{GPU}/summary.json")
        parts += [
            f"### Every stage at its default flags ({links(f'{GPU}/summary.json')})",
            "",
            f"`{summary['command']}`: the run the README's headline reads.",
            "",
            gpu_summary_table(summary),
            "",
        ]
    return parts


def page_gpu(links: Links, folder: str) -> str:
    """The GPU suite's run in ``folder``: every figure against its target, the teacher's extra runs, reranking, and
    the profiles."""
    summary = load(f"{folder}/summary.json")
    device = summary["device_name"]
    parts = [
        f"# Results: the GPU suite on an {device.replace('NVIDIA ', '').split()[0]}",
        "",
        _generated(),
        f"`{summary['command']}`{now(summary['command'])} on one {device}: random weights in the real shapes (a",
        "Llama-3-8B teacher, a bert-large student). The run's own account, with its machine, software and commit, is",
        f"{links(f'{folder}/PROVENANCE.md')}. Targets are set for an H100.",
        "",
        f"## Every figure ({links(f'{folder}/summary.json')})",
        "",
        gpu_summary_table(summary),
        "",
    ]
    levers = [p for p in (f"{folder}/teacher-levers.json", f"{folder}/teacher-levers-dl19.json") if p in result_files()]
    if levers:
        parts += [
            "## The teacher with the GPU levers given as flags (packing, 64-token buckets, compile)",
            "",
            "Since then the CUDA defaults (see [Teach](../stages/teach.md)); this run's `teacher.json` ran before.",
            "",
            _table(
                ["file", "workload", "of the bf16 ceiling", "pairs/s", "over the plain loop", "over the naive loop"],
                [teacher_bench_row(links, p) for p in (f"{folder}/teacher.json", *levers)],
            ),
            "",
        ]
    parts += _bench_section(links, f"{folder}/bench/bench.json", "Reranking: bert-large, 100 candidates")
    profiles = [p for p in result_files() if p.startswith(f"{folder}/profile/") and p.endswith(".txt")]
    parts += [
        "## Profiles",
        "",
        "`--profile`: each stage again, short, under `torch.profiler`: " + ", ".join(links(p) for p in profiles) + ".",
        "",
    ]
    parts += later_gpu_runs(links, folder)
    return "\n".join(parts)


def scale_table(result: dict[str, Any]) -> str:
    """A scale run (``scale.json``) as a Markdown table: one row a size (a run from before the stores' checksums
    shows none: "-")."""
    rows = []
    for r in result["rows"]:
        cold, cached, loaders, teacher = r["student_cold"], r["student_cached"], r["loader"], r["teacher_input"]
        peaks = " / ".join(f"{x['peak_above_baseline_bytes'] / 2**20:.0f}" for x in (cold, cached))
        rates = " / ".join(f"{x['batches_per_s']:.1f}" for x in loaders)
        verify = f" ({cached['verify_seconds']:.2f} s)" if "verify_seconds" in cached else ""
        pk = r.get("pk_cache")
        rows.append(
            [
                f"{r['pairs']:,}",
                f"{cold['seconds']:.1f} s",
                f"{cached['seconds']:.2f} s{verify}",
                f"{peaks} MiB",
                f"{cold['cache_bytes'] / 2**20:.0f} MiB",
                f"{loaders[0]['first_batch_s'] * 1000:.0f} ms",
                rates,
                f"{teacher['seconds']:.1f} s, {teacher['peak_rss_bytes'] / 2**20:.0f} MiB",
                f"{pk['seconds']:.2f} s ({pk['verify_seconds']:.2f} s)" if pk else "-",
            ]
        )
    header = [
        "pairs",
        "setup cold",
        "setup cached (checksums)",
        "peak RSS above baseline (cold / cached)",
        "token cache",
        "first batch",
        "batches/s, 0 / 2 workers",
        "teacher input: time, peak RSS",
        "p(K) cache reopened (checksums)",
    ]
    return _table(header, rows)


def page_scale(links: Links) -> str:
    parts = [
        "# Results: scale",
        "",
        _generated(),
        "The student's data layer against the number of training pairs (synthetic teacher data made of the DL21",
        "and DL22 rows under new query ids), each measurement in a fresh process: setup cold (tokenising) and",
        "cached (in brackets, the part of it spent checking the token files against their checksums), peak RSS",
        "above the process's baseline, the token cache on disk, the training loader's batches/s at the GPU config's",
        "65,536-token budget, the teacher stage's input pass, and reopening a p(K) cache of one entry a pair (in",
        "brackets, hashing its segments). See",
        "[Train](../stages/train.md#scale-millions-of-pairs).",
        "",
    ]
    for path in sorted(p for p in result_files() if re.fullmatch(r"scale-cpu[^/]*/scale\.json", p)):
        r = load(path)
        folder = path.rsplit("/", 1)[0]
        parts += [
            f"## {links(path)}",
            "",
            f"CPU: {r['cpu']}, {r['cores']} cores, {r['cpu_features']}; commit {r['git_commit'][:7]}.",
            "",
            _command(r["command"]),
            "",
            scale_table(r),
            "",
        ]
        for g in r["growth"]:
            parts.append(
                f"- From {g['from_pairs']:,} to {g['to_pairs']:,} pairs, a pair costs "
                f"{g['peak_rss_bytes_per_pair']:.0f} bytes of peak RSS, {g['cold_seconds_per_pair'] * 1e6:.0f} µs of "
                f"cold setup, {g['cache_bytes_per_pair']:.0f} bytes of token cache and "
                f"{g['teacher_data_bytes_per_pair']:.0f} bytes of teacher data on disk; the teacher's input pass "
                f"peaks {g['teacher_input_peak_rss_growth']:+.1%} higher."
            )
        parts.append("")
        if (RESULTS / folder / "scale.png").exists():
            parts += [f"![scale]({links.prefix}{folder}/scale.png)", ""]
    sections = (
        (
            r"scale-cpu[^/]*/pk-cache\.json",
            "The p(K) cache",
            "Reopening a p(K) cache of N distinct passages (`python -m benchmarks.pk_cache`), in a fresh process: "
            "seconds, the peak RSS of the reopening and the RSS with the cache open, each above the process's "
            "imports, and one lookup's time. MS MARCO has 8.8M passages.",
            pk_cache_table,
        ),
        (
            r"scale-cpu[^/]*/teacher-input[^/]*\.json",
            "The teacher's input pass",
            "Each rank's input pass (`python -m benchmarks.teacher_input`), one rank at a time in a fresh process: "
            "every rank reads all of the input (the digest of every pair is the teacher's fingerprint) and keeps its "
            "share (chunk j of 256 pairs is rank j mod R's) in its row file; a corpus is looked up in its index, "
            "built once.",
            teacher_input_table,
        ),
    )
    for pattern, title, intro, table in sections:
        for path in sorted(p for p in result_files() if re.fullmatch(pattern, p)):
            r = load(path)
            parts += [f"## {title}: {links(path)}", "", intro, ""]
            parts += [f"CPU: {r['cpu']}, {r['cores']} cores, {r['cpu_features']}; commit {r['git_commit'][:7]}.", ""]
            parts += [_command(r["command"]), "", table(r), ""]
    return "\n".join(parts)


def pk_cache_table(result: dict[str, Any]) -> str:
    """A p(K) cache run (``pk-cache.json``) as a Markdown table: one row a size, its resident memory against the
    target."""
    target = result["target_resident_bytes"]
    rows = [
        [
            f"{r['entries']:,}",
            f"{r['seconds']:.1f} s ({r['verify_seconds']:.1f} s)",
            f"{r['peak_above_baseline_bytes'] / 2**20:.0f} MiB",
            f"{r['resident_above_baseline_bytes'] / 2**20:.0f} MiB",
            f"{r['resident_above_baseline_bytes'] / r['entries']:.0f}",
            f"{r['lookup_seconds'] * 1e6:.1f} µs",
            f"{r['cache_bytes'] / 2**20:.0f} MiB",
            "met" if r["met"] else "not met",
        ]
        for r in result["rows"]
    ]
    header = ["passages", "reopened (checksums)", "peak RSS", "resident", "bytes a passage", "lookup", "on disk",
              f"resident ≤ {target / 2**20:.0f} MiB"]  # fmt: skip
    return _table(header, rows)


def teacher_input_table(result: dict[str, Any]) -> str:
    """A teacher input run (``teacher-input.json``) as Markdown: the corpus indexes, then one row a format, size and
    number of ranks, against the targets."""
    targets = result["targets"]
    index_rows = [
        [
            i["corpus"],
            f"{i['records']:,}",
            f"{i['seconds']:.1f} s" if i["built"] else "(built before)",
            f"{i['reopen_seconds']:.2f} s" if "reopen_seconds" in i else "",
            f"{i['peak_rss_bytes'] / 2**20:.0f} MiB",
            f"{i['corpus_bytes'] / 2**20:,.0f} MiB",
            f"{i['index_bytes'] / 2**20:,.0f} MiB",
        ]
        for i in result["indexes"]
    ]
    rows = [
        [
            r["format"],
            f"{r['pairs']:,}",
            str(r["ranks"]),
            f"{r['peak_rss_bytes'] / 2**20:.0f} MiB",
            f"{r['peak_above_baseline_bytes'] / 2**20:.0f} MiB",
            f"{r['vs_one_rank']:.2f}x" if r["vs_one_rank"] is not None else "",
            f"{r['seconds']:.1f} s",
            f"{min(p['rows'] for p in r['per_rank']):,}–{max(p['rows'] for p in r['per_rank']):,}",
        ]
        for r in result["rows"]
    ]
    header = ["format", "pairs", "ranks", "peak RSS a rank", "above imports", "vs 1 rank", "seconds a rank",
              "pairs a rank keeps"]  # fmt: skip
    parts = []
    if index_rows:
        index_header = ["corpus index", "passages", "built in", "reopened in", "peak RSS", "corpus", "index"]
        parts += [_table(index_header, index_rows), ""]
    parts += [
        _table(header, rows),
        "",
        f"Targets: peak RSS a rank ≤ {targets['peak_rss_bytes'] / 2**30:.0f} GiB at 10M pairs; with 2 ranks "
        f"≤ {targets['two_ranks_vs_one']}x the 1-rank figure.",
    ]
    return "\n".join(parts)


# --- serving (``python -m benchmarks.load``) ---------------------------------------------------------------------

SERVE = "serve-cpu/serve.json"
"""The load benchmark's committed run."""


def _served(server: str, result: dict[str, Any]) -> str:
    return f"{server} ({result['servers'][server]['info']['backend']})"


def serve_table(result: dict[str, Any]) -> str:
    """A load run's cells (``serve.json``), one row each: throughput, latency and the batches the server made."""
    rows = []
    for name, server in result["servers"].items():
        for c in server["cells"]:
            b = c["batching"]
            rows.append(
                [
                    _served(name, result),
                    f"{c['documents']} ({c['request_tokens_p50']:.0f} / {c['request_tokens_p99']:.0f})",
                    c["concurrency"],
                    f"{c['requests']} ({c['requests'] - c['answered']} lost, {c['wrong']} wrong)",
                    f"{c['queries_per_s']:.2f}",
                    f"{c['pairs_per_s']:.0f}",
                    _ms(c["p50_s"]),
                    _ms(c["p95_s"]),
                    _ms(c["p99_s"]),
                    f"{c['p99_over_p50']:.2f} / {c['max_over_p50']:.2f}",
                    f"{b['requests_per_batch']:.2f} / {b['pairs_per_batch']:.1f} / "
                    f"{b['padded_tokens_per_batch'] / b['pairs_per_batch']:.0f} / "
                    f"{b['backend_s_per_batch'] / b['padded_tokens_per_batch'] * 1e6:.0f} µs",
                    f"{c['cpu_s']['server']:.0f} / {c['cpu_s']['load_generator']:.0f} s",
                ]
            )
    header = [
        "server (backend)",
        "docs (tokens a request, p50 / p99)",
        "concurrency",
        "requests",
        "queries/s",
        "pairs/s",
        "p50",
        "p95",
        "p99",
        "p99 / p50, max / p50",
        "a batch: requests / pairs / padded tokens a pair / backend time a padded token",
        "CPU: server / load generator",
    ]
    return _table(header, rows)


def serve_targets_table(result: dict[str, Any]) -> str:
    """The serving targets against a load run (``serve.json``'s ``targets``)."""

    def value(v: Any) -> str:
        return "-" if v is None else f"{v:,}" if isinstance(v, int) else f"{v:.2f}"

    verdict = {True: "holds", False: "**fails**", None: ""}
    return _table(
        ["target", "measured", "bound", ""],
        [[t["target"], value(t["value"]), t["bound"], verdict[t["holds"]]] for t in result["targets"]],
    )


def serve_robustness(result: dict[str, Any]) -> str:
    """The robustness cell in one paragraph."""
    r = result["servers"].get("batched", {}).get("robustness")
    if not r:
        return ""
    kinds = ", ".join(f"{k} {n:,}" for k, n in r["kinds"].items())
    return (
        f"Robustness: {r['requests']:,} requests at concurrency {r['concurrency']} ({kinds}): "
        f"{r['requests'] - r['answered']} lost, {r['wrong']} wrong (each malformed one must get its 4xx, each other "
        f"one its scores); {r['queries_per_s']:.1f} queries/s; the server "
        f"{'stayed up' if r['alive_after'] and r['health_after'] == 200 else 'did not stay up'} "
        f"(`/health` {r['health_after']} after), and exited with status {result['servers']['batched']['exit_status']} "
        "on SIGTERM."
    )


def serve_tables(result: dict[str, Any]) -> str:
    """A load run as Markdown: its command and machine, the cells, the robustness cell and the targets."""
    env = result["environment"]
    return "\n".join(
        [
            _command(result["command"]),
            "",
            f"Model: `{result['model']}`. Machine: {environment(env)}, {env['cores']} cores; pinning: "
            f"{result['pinning']}; the servers' TOKENIZERS_PARALLELISM: {env.get('tokenizers_parallelism', 'false')}"
            f". Load average (1, 5, 15 min) before / after: {result['load_average_before']} / "
            f"{result['load_average_after']}.",
            "",
            serve_table(result),
            "",
            serve_robustness(result),
            "",
            serve_targets_table(result),
        ]
    )


def serve_headline(result: dict[str, Any]) -> tuple[str, str]:
    """The README's serving row: 10 documents at concurrency 8 on the batched server, against one request at a
    time and the CrossEncoder.predict peer."""
    batched = _serve_cell(result, "batched", 10, 8)
    alone = _serve_cell(result, "one-at-a-time", 10, 8)
    peer = _serve_cell(result, "st-crossencoder", 10, 8)
    backend = result["servers"]["batched"]["info"]["backend"]
    rate = batched["queries_per_s"]
    return (
        f"`distill serve` with a MiniLM-L6 student ({backend}; {cpu(result)}), a DL19 query's 10 candidates from 8 "
        "clients: "
        "throughput, p99, over one request at a time and over `CrossEncoder.predict`",
        f"{rate:.1f} queries/s, {_ms(batched['p99_s'])}, {_x(rate / alone['queries_per_s'])}, "
        f"{_x(rate / peer['queries_per_s'])}",
    )


def _serve_cell(result: dict[str, Any], server: str, documents: int, concurrency: int) -> dict[str, Any]:
    cells = result["servers"][server]["cells"]
    return next(c for c in cells if c["documents"] == documents and c["concurrency"] == concurrency)


def serve_padding(result: dict[str, Any]) -> str:
    """What sharing batches saved at 10 documents and concurrency 8: padded tokens a pair, and the backend's time a
    padded token, in the batched and the one-at-a-time servers' cells (measured side by side): what the batched / one
    at a time ratio owes to each."""
    shared, alone = (_serve_cell(result, name, 10, 8)["batching"] for name in ("batched", "one-at-a-time"))

    def per_token(b: dict[str, Any]) -> float:
        return b["backend_s_per_batch"] / b["padded_tokens_per_batch"] * 1e6

    def per_pair(b: dict[str, Any]) -> float:
        return b["padded_tokens_per_batch"] / b["pairs_per_batch"]

    own = alone["tokens_per_batch"] / alone["pairs_per_batch"]
    return (
        f"At 10 documents and concurrency 8, shared batches carried {per_pair(shared):.0f} padded tokens a pair "
        f"against {per_pair(alone):.0f} one request at a time ({per_pair(alone) / per_pair(shared):.2f}×; the pairs' "
        f"own tokens are {own:.0f}), and the backend took {per_token(shared):.0f} against {per_token(alone):.0f} µs a "
        f"padded token ({per_token(alone) / per_token(shared):.2f}×): on this CPU, a batch of one request's pairs "
        "already keeps every core busy, so batching gains what padding it saves, at most "
        f"{per_pair(alone) / own:.2f}× were its batches unpadded."
    )


SERVE_FINDINGS = """## What the tables show

- **The backend is the bottleneck from one client on.** One request at a time, throughput hardly moves from 1 to 32
  clients: the server's own work (HTTP, validation, tokenising on its thread) overlaps the model's, and more clients
  only queue. Latency then grows with the queue, first in, first out: p99 stays close to p50 at every concurrency,
  and no request waits much longer than the others (max / p50).
- **Batching gains what padding it saves.** The backend's time a padded token is about the same in one request's
  batches as in shared ones (the batch column), so what concurrent requests gain is their pairs sorted by length
  together, with fewer padded tokens a pair: short of the issue's 1.5× for 10 candidates, which is out of reach
  here while one request's batches already keep both cores busy (the paragraph above each table bounds it). A
  request alone is scored at once: the batching window waits only for requests being tokenised, so concurrency 1
  costs the same batched or not.
- **100 candidates are compute-bound:** a request fills whole batches by itself, so batching neither gains nor
  costs much there.
- **The peer,** `CrossEncoder.predict` in PyTorch fp32 one request at a time, is slower by the backend (bf16
  OpenVINO on the fused graph against eager fp32) and by the padding of its unsorted batches.
- **Robustness:** malformed requests get their 4xx and a one-line error, the others their scores, and the server
  keeps serving.

"""
"""What the serving tables show, in words (the figures are in the tables)."""


def page_serving(links: Links) -> str:
    parts = [
        "# Results: serving",
        "",
        _generated(),
        "`distill serve` under a closed-loop HTTP load on loopback (`python -m benchmarks.load`, see",
        "[Serving](../serving.md#the-load-benchmark)): batched, one request at a time (`--batching false`) and the",
        "`CrossEncoder.predict` peer behind the same app, side by side: each cell runs on every server in turn. Each",
        "run names its model; the committed one serves the final SmolLM2 student,",
        "`q-dl2122-seg-cis_q+0.25fs-listwise_kl-lr3e-5` ([Students](students.md) gives its training command),",
        "exported by `distill export`. Each client's first request is its warm-up, outside the percentiles;",
        "throughput counts every request.",
        "",
    ]
    for path in sorted(p for p in result_files() if re.fullmatch(r"serve-cpu[^/]*/serve\.json", p)):
        result = load(path)
        folder = path.rsplit("/", 1)[0]
        parts += [f"## {links(path)}", "", serve_tables(result), ""]
        if (RESULTS / folder / "serve.png").exists():
            parts += [f"![serving]({links.prefix}{folder}/serve.png)", ""]
        parts += [serve_padding(result), ""]
    parts.append(SERVE_FINDINGS)
    parts += ["", calibration_section(links)]
    return "\n".join(parts)


def calibration_section(links: Links) -> str:
    """Every ``calibration-*.json`` (``benchmarks/calibration.py``): the calibrated scores' spread and fit on a
    judged candidates file beside the plain sigmoid's, and the share relevant at the raw scores' two ends."""
    rows = []
    for path in sorted(p for p in result_files() if re.fullmatch(r"calibration-[^/]*\.json", p)):
        r = load(path)
        cal, sig, bounds = r["calibrated"], r["sigmoid"], r.get("bounds", {})
        rows.append([
            links(path), r["queries"], r["pairs"], r["relevant"],
            f"{cal['p05']:.3f}–{cal['p95']:.3f}", cal["distinct_float32"], _f(cal["brier"], 3), _f(cal["ece"], 3),
            f"{bounds['bottom_5pct_relevant']:.2f} / {bounds['top_5pct_relevant']:.2f}" if bounds else "",
            f"{sig['p05']:.3f}–{sig['p95']:.3f}", sig["distinct_float32"],
        ])  # fmt: skip
    header = ["file", "queries", "pairs", "relevant", "calibrated p05–p95", "distinct", "Brier", "ECE",
              "relevant in raw bottom / top 5%", "sigmoid p05–p95", "distinct"]  # fmt: skip
    return "\n".join([
        "## Score calibration",
        "",
        "`python benchmarks/calibration.py` scores every candidate of a judged file with an export and compares the",
        "calibrated probabilities (the export's Platt scaling, fitted on its validation queries) with the plain",
        "sigmoid of the raw scores. The share relevant among the top 5% of raw scores is, on average, what any",
        "calibrated monotone map gives them: the spread the student's ranking earns.",
        "",
        _table(header, rows),
    ])  # fmt: skip


def page_demo(links: Links) -> str:
    d = demo()
    return "\n".join(
        [
            "# Results: the demo",
            "",
            _generated(),
            f"`make demo`'s output, as committed in {links(DEMO)}: {d['title']}.",
            "",
            "```",
            "\n".join(d["text"].splitlines()[1:]),
            "```",
            "",
        ]
    )


def _describe(path: str) -> str:
    """A results file's command: its JSON ``command``, or a text file's first line."""
    file = RESULTS / path
    if file.suffix == ".json":
        try:
            command = json.loads(file.read_text()).get("command")
        except (ValueError, AttributeError):
            return ""
        return f"`{command}`{now(command)}" if isinstance(command, str) else ""
    if file.suffix in (".txt", ".log", ".md"):
        first = file.read_text(errors="replace").splitlines()[:1]
        return f"`{first[0].lstrip('#$ ')[:200]}`" if first else ""
    return ""


def page_files(links: Links) -> str:
    rows = [[links(p), _describe(p).replace("|", "\\|")] for p in result_files()]
    moved = "A moved script's command is followed by today's; `benchmarks/README.md` gives its flags."
    return "\n".join(["# Every results file", "", _generated(), moved, "", _table(["file", "command"], rows), ""])


PAGES: dict[str, Callable[[Links], str]] = {
    "index.md": page_index,
    "teachers.md": page_teachers,
    "students.md": page_students,
    "latency-cpu.md": page_latency_cpu,
    **{page: partial(page_gpu, folder=folder) for page, folder in GPU_RUNS.items()},
    "scale.md": page_scale,
    "serving-cpu.md": page_serving,
    "demo.md": page_demo,
    "files.md": page_files,
}


def pages() -> dict[str, str]:
    """Every results page (file name -> Markdown), linking to the copies of the results files under ``files/``."""
    links = Links("files/")
    return {name: render(links) for name, render in PAGES.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.results_pages", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("readme", help="rewrite the README's headline table from the committed results")
    sub.add_parser("check", help="exit 1 if the README's headline table is not what the results give")
    write = sub.add_parser("pages", help="write the results pages into a folder (the docs build does this itself)")
    write.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "readme":
        print("README.md: results table " + ("rewritten" if write_readme() else "already up to date"))
    elif args.command == "check":
        if not readme_is_current():
            print(f"README.md: the results table is out of date: {FIX}", file=sys.stderr)
            return 1
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, text in pages().items():
            (args.out / name).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
