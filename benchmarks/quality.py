"""Student quality: distillation choices compared on the validation queries, then tested once on DL19.

Every student starts from ``configs/train/minilm-dl2122.yaml`` (the SmolLM2 teacher's labels of the TREC DL21 and
DL22 BM25 top-100); the screening variants learn from DL21's labels alone (:data:`DL21_ONLY`). All are validated on
the same seeded split of 16 judged DL21 queries, where every setting (head, label, loss, epochs, learning rate, the
interpolation α) is chosen. DL19 is the test set: only the
variants named in :data:`TEST` are reranked on it, once each, and nothing is chosen by it.

    python benchmarks/quality.py teacher                 # -> benchmarks/results/quality-dl21-val-teacher.{json,md}
    python benchmarks/quality.py train NAME [NAME ...]   # train variants -> benchmarks/results/quality/val-NAME.json
    python benchmarks/quality.py table                   # -> benchmarks/results/quality-dl21-val.{json,md}
    python benchmarks/quality.py test [NAME ...]         # -> benchmarks/results/quality-dl19-<name>.json

Each row of the tables carries the command that made it.
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import RESULTS, ROOT

BASE = ["distill", "train", "--config", "configs/train/minilm-dl2122.yaml"]
WITHIN_QUERY = ["--data.group_size", "25", "--data.batch_size", "50"]
"""Two queries of 25 candidates a batch, for the losses that compare candidates of one query."""

DL21_ONLY = ["--data.teacher_data", "[data/teacher/dl21-bm25-smollm2]"]
"""The screening runs learn from DL21's labels alone (37 training queries, 3,700 pairs), which a CPU trains in
minutes; the chosen settings are then trained on DL21 + DL22 (the config's default teacher data)."""
SEGMENT_COSINE = ["--model.head", "segment_cosine"]


def segment_cosine(label: str, loss: str, *extra: str, data: Sequence[str] = DL21_ONLY) -> list[str]:
    """A run of the segment-cosine head: ``label``, ``loss`` (batches of query groups for a within-query loss)."""
    batches = [] if loss == "mse" else WITHIN_QUERY
    return [*data, *SEGMENT_COSINE, "--data.label", label, "--model.loss", loss, *batches, *extra]


EXPERIMENTS: dict[str, list[str]] = {
    # the paper's [CLS] head, pointwise MSE on globally standardised targets
    "cis": [*DL21_ONLY, "--data.label", "cis"],
    "cis_q": [*DL21_ONLY, "--data.label", "cis_q"],
    # the segment-cosine head: labels
    "seg-cis-listwise_kl": segment_cosine("cis", "listwise_kl"),
    "seg-cis_q-listwise_kl": segment_cosine("cis_q", "listwise_kl"),
    "seg-cis_q+0.25fs-listwise_kl": segment_cosine("cis_q+0.25*first_stage", "listwise_kl"),
    # losses, on cis_q
    "seg-cis_q-mse": segment_cosine("cis_q", "mse"),
    "seg-cis_q-mse-per_query": segment_cosine("cis_q", "mse", "--data.target_scaling", "per_query"),
    "seg-cis_q-margin_mse": segment_cosine("cis_q", "margin_mse"),
    "seg-cis_q-ranknet": segment_cosine("cis_q", "ranknet"),
    "seg-cis_q-adr_mse": segment_cosine("cis_q", "adr_mse"),
    # listwise KL: temperature, the whole candidate list as one group, learning rate
    "seg-cis_q-listwise_kl-t0.5": segment_cosine("cis_q", "listwise_kl", "--model.temperature", "0.5"),
    "seg-cis_q-listwise_kl-g100": [
        *segment_cosine("cis_q", "listwise_kl"),
        *["--data.group_size", "100", "--data.batch_size", "100"],
    ],
    "seg-cis_q-listwise_kl-lr3e-5": segment_cosine("cis_q", "listwise_kl", "--model.lr", "3.0e-5"),
    "seg-cis_q-listwise_kl-lr3e-4": segment_cosine("cis_q", "listwise_kl", "--model.lr", "3.0e-4"),
    # the chosen settings on DL21 + DL22 (129 queries; the same 16 validation queries)
    "dl2122-seg-cis_q+0.25fs-listwise_kl": segment_cosine("cis_q+0.25*first_stage", "listwise_kl", data=()),
    # ... with the learning rate that won the screening (3e-5 against 1e-4 on cis_q)
    "dl2122-seg-cis_q+0.25fs-listwise_kl-lr3e-5": segment_cosine(
        "cis_q+0.25*first_stage", "listwise_kl", "--model.lr", "3.0e-5", data=()
    ),
}
"""Variant name -> its arguments after :data:`BASE` (each trains into ``checkpoints/q-<name>``)."""

TEST: list[str] = [
    "dl2122-seg-cis_q+0.25fs-listwise_kl-lr3e-5",
    "dl2122-seg-cis_q+0.25fs-listwise_kl",
    "seg-cis_q+0.25fs-listwise_kl",
    "seg-cis_q-listwise_kl",
    "seg-cis-listwise_kl",
]
"""The variants tested on DL19, chosen on the validation table (see the README): the best validation settings
trained on DL21 + DL22 (the final student, at the learning rate that won the screening; before it, at 1e-4), and
from the DL21-only screening the best validation nDCG@10 (a hybrid label), the best on a teacher score alone, and
the best on the paper's label, ``cis``."""

DL19 = "data/trec-dl19"
DL19_TEACHER = "data/teacher/dl19-bm25-smollm2"
VAL_COLUMNS = (
    "val/nDCG@10",
    "val/interp_nDCG@10",
    "val/interp_alpha",
    "val/fidelity_spearman",
    "val/fidelity_kendall_tau",
    "val/fidelity_nDCG@10_teacher",
    "val/teacher_nDCG@10",
    "val/first_stage_nDCG@10",
)


RECORDS = RESULTS / "quality"
"""One ``val-<name>.json`` per finished variant: its command and validations (:func:`record`)."""


def run_dir(name: str) -> Path:
    return ROOT / "checkpoints" / f"q-{name}"


def train_command(name: str) -> list[str]:
    return [*BASE, *EXPERIMENTS[name], "--run_name", f"q-{name}"]


def shell(command: Sequence[str]) -> str:
    return shlex.join(command)


def run(command: list[str]) -> None:
    print("+", shell(command), flush=True)
    subprocess.run([str(Path(sys.executable).parent / command[0]), *command[1:]], check=True, cwd=ROOT)


def record_path(name: str) -> Path:
    return RECORDS / f"val-{name}.json"


def train(names: list[str]) -> None:
    """Train each variant not yet recorded, then record its validations (:func:`record`)."""
    for name in names:
        if record_path(name).is_file():
            print(f"{name}: done ({record_path(name).relative_to(ROOT)})")
            continue
        if not (run_dir(name) / "hf" / "config.json").is_file():
            run(train_command(name))
        record(name)


def record(name: str) -> None:
    """Commit-ready record of a finished run: its command and its validations, one row per epoch (the run folder
    itself is git-ignored)."""
    with (run_dir(name) / "logs" / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/nDCG@10")]
    epochs = [{k: float(r[k]) for k in ("epoch", *VAL_COLUMNS) if r.get(k)} for r in rows]
    RECORDS.mkdir(parents=True, exist_ok=True)
    entry = {"name": name, "command": shell(train_command(name)), "epochs": epochs}
    record_path(name).write_text(json.dumps(entry, indent=2) + "\n")


def table() -> dict[str, Any]:
    """Every recorded variant's best epoch (by validation nDCG@10, as the student stage keeps it)."""
    rows = []
    for name in EXPERIMENTS:
        if not record_path(name).is_file():
            continue
        entry = json.loads(record_path(name).read_text())
        best = max(entry["epochs"], key=lambda r: r["val/nDCG@10"])
        rows.append({**entry, "best": best})
    record = {"split": "16 judged DL21 queries (seed 0), BM25 top-100 each", "rows": rows}
    lines = [
        "| variant | nDCG@10 | + first stage (α) | Spearman / τ with teacher (per query) | nDCG@10 vs teacher |"
        " teacher | BM25 | command |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        b = row["best"]
        lines.append(
            f"| {row['name']} (epoch {int(b['epoch']) + 1}) | {b['val/nDCG@10']:.2f} | "
            f"{b['val/interp_nDCG@10']:.2f} ({b['val/interp_alpha']:g}) | "
            f"{b['val/fidelity_spearman']:.3f} / {b['val/fidelity_kendall_tau']:.3f} | "
            f"{b['val/fidelity_nDCG@10_teacher']:.2f} | {b['val/teacher_nDCG@10']:.2f} | "
            f"{b['val/first_stage_nDCG@10']:.2f} | `{row['command']}` |"
        )
    write(record, "\n".join(lines), "quality-dl21-val")
    return record


def write(record: dict[str, Any], markdown: str, stem: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    (RESULTS / f"{stem}.md").write_text(markdown + "\n")
    print(markdown)


TEACHER_LABELS = ("cis", "upr", "cis_q", "cis_mean", "cis_q_mean")
HYBRID_WEIGHTS = (0.25, 0.5, 1.0, 2.0)
RANDOM_ORDERS = 100


def teacher() -> dict[str, Any]:
    """nDCG@10 of every teacher label, and of hybrids with the first stage, on the validation queries: which
    labels are worth a student (the students' own split, drawn as the student stage draws it)."""
    import numpy as np
    import pandas as pd
    import yaml

    from distill.core.labels import Label
    from distill.core.loaders import load_qrels
    from distill.core.metrics import evaluate
    from distill.core.runs import run_from_columns
    from distill.core.teacher_data import TeacherDataset
    from students.data import split_queries

    config = yaml.safe_load((ROOT / BASE[-1]).read_text())["data"]
    qrels = load_qrels(ROOT / config["qrels"])
    # The validation queries are judged ones (DL21), so unjudged labels (DL22) change nothing here: they may be
    # missing while they are being made.
    present = [path for path in config["teacher_data"] if (ROOT / path / "teacher.json").is_file()]
    tables = [TeacherDataset.open(ROOT / path).to_pandas() for path in present]
    table = pd.concat(tables, ignore_index=True).drop_duplicates(["qid", "docid"], keep="first")
    held_out = split_queries([q for q in table.qid if q in qrels], config["val_queries"], 0)
    val = table[table.qid.isin(held_out)]
    labels = ["first_stage", *TEACHER_LABELS]
    labels += [f"{score}+{w:g}*first_stage" for score in ("cis", "cis_q") for w in HYBRID_WEIGHTS]
    rows = []
    for name in labels:
        if name == "first_stage":
            values = val.first_stage_score.to_numpy()
        else:
            spec = Label.parse(name)
            values = spec.values(val[spec.score].to_numpy(), val.first_stage_score.to_numpy(), val.qid.tolist())
        run = run_from_columns(val.qid.tolist(), val.docid.tolist(), values.tolist())
        rows.append({"label": name, "nDCG@10": evaluate(run, qrels, ["nDCG@10"])["nDCG@10"]})
    # chance: the mean over seeded random orders of the same candidates
    rng = np.random.default_rng(0)
    shuffles = [
        evaluate(
            run_from_columns(val.qid.tolist(), val.docid.tolist(), rng.random(len(val)).tolist()), qrels, ["nDCG@10"]
        )
        for _ in range(RANDOM_ORDERS)
    ]
    rows.append(
        {
            "label": f"random order (mean of {RANDOM_ORDERS})",
            "nDCG@10": float(np.mean([r["nDCG@10"] for r in shuffles])),
        }
    )
    command = "python benchmarks/quality.py teacher"
    record = {"command": command, "teacher_data": present, "queries": sorted(held_out), "rows": rows}
    lines = [f"`{command}`: the teacher's labels on the {len(held_out)} validation queries (DL21)", ""]
    lines += ["| label | nDCG@10 |", "|---|---|", *(f"| {r['label']} | {r['nDCG@10']:.2f} |" for r in rows)]
    write(record, "\n".join(lines), "quality-dl21-val-teacher")
    return record


def test(names: list[str]) -> None:
    """Export each variant of ``names`` (of :data:`TEST`), rerank DL19's BM25 top-100 with and without the
    interpolation chosen on validation, and evaluate beside BM25 and the teacher (with per-query agreement with
    the teacher's label)."""
    commands = []
    for name in names:
        folder = run_dir(name).relative_to(ROOT)
        if not (ROOT / folder / "hf" / "config.json").is_file():
            raise SystemExit(f"quality.py test: {folder}/hf is missing: run `quality.py train {name}` first")
        label = json.loads((ROOT / folder / "hf" / "config.json").read_text())["cis_distill"]["label"]
        commands.append(["distill", "export", "--checkpoint", str(folder), "--formats", "onnx"])
        rerank = [
            "distill",
            "rerank",
            "--model",
            str(folder),
            "--backend",
            "onnx",
            "--input",
            f"{DL19}/bm25_top100.json",
        ]
        for interpolation in ("false", "true"):
            output = folder / f"dl19-bm25{'-interp' if interpolation == 'true' else ''}.trec"
            commands.append([*rerank, "--interpolation", interpolation, "--output", str(output)])
        runs = [f"{DL19_TEACHER}/runs/first_stage.trec", *teacher_runs(label), str(folder / "dl19-bm25.trec")]
        runs.append(str(folder / "dl19-bm25-interp.trec"))
        evaluate = ["distill", "eval", "--qrels", f"{DL19}/qrels.txt", "--run", *runs, "--teacher", DL19_TEACHER]
        result = (RESULTS / f"quality-dl19-{name}.json").relative_to(ROOT)
        commands.append([*evaluate, "--label", dl19_label(label), "--json", str(result)])
    for command in commands:
        run(command)


def dl19_label(label: str) -> str:
    """The DL19 teacher column that ranks as ``label`` within every query.

    The committed DL19 labels hold ``upr`` but not ``cis_q``: cis_q = upr - log p(Q | empty passage) differs from
    upr by one constant per query (and cis_q_mean divides it by one), so within a query, and after the per-query
    standardisation of a hybrid label, they rank identically; per-query agreement is the same figure.
    """
    for query_direction in ("cis_q_mean", "cis_q"):
        label = label.replace(query_direction, "upr")
    return label


def teacher_runs(label: str) -> list[str]:
    score = dl19_label(label).split("+")[0]
    return [f"{DL19_TEACHER}/runs/{score}.trec"] if (ROOT / DL19_TEACHER / "runs" / f"{score}.trec").is_file() else []


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    train_parser = sub.add_parser("train", help="train variants (skips finished ones)")
    train_parser.add_argument("names", nargs="+", choices=sorted(EXPERIMENTS))
    sub.add_parser("teacher", help="the teacher's labels (and hybrids) on the validation queries")
    sub.add_parser("table", help="the validation table of the finished variants")
    test_parser = sub.add_parser("test", help="the DL19 test of the chosen variants (TEST; default all of them)")
    test_parser.add_argument("names", nargs="*", help=f"of {TEST}")
    args = parser.parse_args(argv)
    if args.command == "train":
        train(args.names)
    elif args.command == "teacher":
        teacher()
    elif args.command == "table":
        table()
    elif unknown := set(args.names) - set(TEST):
        parser.error(f"test: {sorted(unknown)} not in TEST {TEST}")
    else:
        test(args.names or TEST)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
