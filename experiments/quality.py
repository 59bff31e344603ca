"""Student quality: distillation choices compared on the validation queries, then tested once on DL19.

Every student starts from ``configs/train/minilm-dl2122.yaml`` (the SmolLM2 teacher's labels of the TREC DL21 and
DL22 BM25 top-100); the screening variants learn from DL21's labels alone (:data:`DL21_ONLY`). The Gemma-3-270m
variants name both teachers (:data:`TEACHERS`) and learn from one or from an ensemble of them. All are validated on
the same seeded split of 16 judged DL21 queries, where every setting (head, label, loss, epochs, learning rate, the
interpolation α) is chosen. DL19 is the test set: only the
variants named in :data:`TEST` are reranked on it, once each, and nothing is chosen by it.

    python experiments/quality.py teacher                 # -> benchmarks/results/quality-dl21-val-teacher.{json,md}
    python experiments/quality.py teacher --split dl19    # the test reference -> quality-dl19-teacher.{json,md}
    python experiments/quality.py train NAME [NAME ...]   # train variants -> benchmarks/results/quality/val-NAME.json
    python experiments/quality.py table                   # -> benchmarks/results/quality-dl21-val.{json,md}
    python experiments/quality.py test [NAME ...]         # -> benchmarks/results/quality-dl19-<name>.json
    python experiments/quality.py test NAME --first_stage tasb    # its TAS-B top-100 -> quality-dl19-tasb-<name>.json

Each row of the tables carries the command that made it.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from distill.core.project_files import PROJECT as ROOT
from distill.data.labels import LabelExpression, Term

RESULTS = ROOT / "benchmarks" / "results"
"""Where the records go (``benchmarks/results/``: beside the benchmarks' own)."""

BASE = ["distill", "train", "--config", "configs/train/minilm-dl2122.yaml"]
WITHIN_QUERY = ["--data.group_size", "25", "--data.batch_size", "50"]
"""Two queries of 25 candidates a batch, for the losses that compare candidates of one query."""

DL21_ONLY = ["--data.teacher_data", "[data/teacher/dl21-bm25-smollm2]"]
"""The screening runs learn from DL21's labels alone (37 training queries, 3,700 pairs), which a CPU trains in
minutes; the chosen settings are then trained on DL21 + DL22 (the config's default teacher data)."""
SEGMENT_COSINE = ["--model.head", "segment_cosine"]
TEACHERS = {"gemma": "bm25-gemma3", "smollm2": "bm25-smollm2"}
"""The named teachers of the ensemble labels: name -> the suffix of their ``data/teacher/<collection>-<suffix>``."""


def named_teachers(*collections: str) -> dict[str, list[str]]:
    """``data.teacher_data`` naming every teacher of :data:`TEACHERS`: name -> its folders of ``collections``."""
    return {name: [f"data/teacher/{c}-{suffix}" for c in collections] for name, suffix in TEACHERS.items()}


def teachers_flag(*collections: str) -> list[str]:
    return ["--data.teacher_data", json.dumps(named_teachers(*collections), separators=(",", ":"))]


GEMMA_DL2122 = teachers_flag("dl21", "dl22")


ENSEMBLES = (
    "z(gemma.cis) + z(gemma.cis_q)",
    "z(gemma.cis) + z(smollm2.cis_q)",
    "z(gemma.cis) + z(gemma.cis_q) + z(smollm2.cis_q)",
    "z(gemma.cis) + z(smollm2.cis_q) + 0.25*z(first_stage)",
    "z(gemma.cis) + z(smollm2.cis_q) + 0.5*z(first_stage)",
    "z(gemma.cis) + z(gemma.cis_q) + z(smollm2.cis_q) + 0.5*z(first_stage)",
    "z(gemma.cis) + z(gemma.cis_q) + z(smollm2.cis_q) + z(first_stage)",
    "2*z(gemma.cis) + z(smollm2.cis_q) + 0.5*z(first_stage)",
)
"""The teacher ensembles compared (:mod:`distill.data.labels` expressions over :data:`TEACHERS`)."""


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
    # Gemma-3-270m's labels (named teachers, joined on (qid, docid)), on DL21 + DL22 with the settings chosen above,
    # one epoch (the CPU time of this machine; the runs above gained at most half a point of validation in a second)
    # the paper's claim: Gemma's CIS alone (standardised per query, as the ensembles' terms are), no first stage
    "dl2122-gemma-seg-zcis-listwise_kl-lr3e-5": segment_cosine(
        "z(gemma.cis)", "listwise_kl", "--model.lr", "3.0e-5", "--trainer.max_epochs", "1", data=GEMMA_DL2122
    ),
    # the label that ranks best on validation (quality-dl21-val-teacher.md)
    "dl2122-ens3-seg-listwise_kl-lr3e-5": segment_cosine(
        ENSEMBLES[2], "listwise_kl", "--model.lr", "3.0e-5", "--trainer.max_epochs", "1", data=GEMMA_DL2122
    ),
    # the ensemble at the SmolLM2 screening's first learning rate (1e-4) for two epochs: on SmolLM2's label those
    # settings gave the highest validation Spearman with the label (0.582, against 0.550 at 3e-5)
    "dl2122-ens3-seg-listwise_kl": segment_cosine(ENSEMBLES[2], "listwise_kl", data=GEMMA_DL2122),
    # the ensemble's listwise-KL temperature, screened on DL21's labels alone, one epoch each. The hypothesis: its
    # label (a sum of three per-query z-scores) spreads over several units, so at temperature 1 the teacher's softmax
    # sits on the top few candidates and the rest of the ranking (the Spearman target) is barely taught. Refuted:
    # Spearman fell as the temperature rose (0.482, 0.475, 0.449)
    **{
        f"dl21-ens3-seg-listwise_kl-lr3e-5-t{t}": segment_cosine(
            ENSEMBLES[2],
            "listwise_kl",
            "--model.lr",
            "3.0e-5",
            "--model.temperature",
            t,
            "--trainer.max_epochs",
            "1",
            data=teachers_flag("dl21"),
        )
        for t in ("1", "2", "4")
    },
}
"""Variant name -> its arguments after :data:`BASE` (each trains into ``checkpoints/q-<name>``)."""

TEST: list[str] = [
    "dl2122-ens3-seg-listwise_kl",
    "dl2122-gemma-seg-zcis-listwise_kl-lr3e-5",
    "dl2122-ens3-seg-listwise_kl-lr3e-5",
    "dl2122-seg-cis_q+0.25fs-listwise_kl-lr3e-5",
    "dl2122-seg-cis_q+0.25fs-listwise_kl",
    "seg-cis_q+0.25fs-listwise_kl",
    "seg-cis_q-listwise_kl",
    "seg-cis-listwise_kl",
]
"""The variants tested on DL19, chosen on the validation table (docs: Results): the best student on validation (the
ensemble label at 1e-4, two epochs), the two Gemma students of one epoch (the paper's claim, CIS alone; the label
that ranks best on validation), the best validation settings
trained on DL21 + DL22 (the final student, at the learning rate that won the screening; before it, at 1e-4), and
from the DL21-only screening the best validation nDCG@10 (a hybrid label), the best on a teacher score alone, and
the best on the paper's label, ``cis``."""

DL19 = "data/trec-dl19"
FIRST_STAGES = {
    "bm25": "bm25_top100.json",
    "tasb": "d_bert_kd_tasb_top100.json",
    "splade": "splade_p_p_ensemble_distil_top100.json",
}
"""The DL19 first stages a student reranks (their top-100 in ``data/trec-dl19``)."""
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
            run([*train_command(name), "--ckpt_path", "last"])  # an interrupted run resumed; else a fresh start
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


TEACHER_SCORES = ("cis", "upr", "cis_q", "cis_mean", "cis_q_mean")
HYBRID_WEIGHTS = (0.25, 0.5, 1.0, 2.0)
RANDOM_ORDERS = 100


def teacher_labels(teachers: Sequence[str]) -> list[str]:
    """Every label of the teacher tables: each score of each teacher, its hybrids with the first stage, and the
    ensembles of the teachers at hand."""
    labels = ["z(first_stage)", *(f"{t}.{s}" for t in teachers for s in TEACHER_SCORES)]
    labels += [f"z({t}.{s}) + {w:g}*z(first_stage)" for t in teachers for s in ("cis", "cis_q") for w in HYBRID_WEIGHTS]
    return labels + [e for e in ENSEMBLES if set(LabelExpression.parse(e, TEACHERS).teachers) <= set(teachers)]


def teacher(split: str) -> dict[str, Any]:
    """nDCG@10 of every teacher label (:func:`teacher_labels`) on ``split``: ``val``, the students' 16 validation
    queries of DL21 (drawn as the student stage draws them), where labels are chosen; or ``dl19``, all 43 DL19
    queries, the test reference that chooses nothing. A teacher whose labels of the split are not there yet is
    left out."""
    import numpy as np

    from distill.data.label_table import load_label_table
    from distill.data.loaders import load_qrels
    from distill.data.teacher_data import TeacherDataset
    from distill.eval.metrics import evaluate
    from distill.eval.trec_runs import run_from_columns
    from students.data import split_queries

    collection = "dl21" if split == "val" else "dl19"
    qrels = load_qrels(ROOT / f"data/trec-{collection}/qrels.txt")
    present = {n: f for n, f in named_teachers(collection).items() if (ROOT / f[0] / "teacher.json").is_file()}
    first = load_label_table(present, "z(first_stage)").table
    queries = set(first.qid) & set(qrels)
    if split == "val":
        config = yaml.safe_load((ROOT / BASE[-1]).read_text())["data"]
        queries = split_queries(sorted(queries), config["val_queries"], 0)

    def ndcg(qids: list[str], docids: list[str], values: list[float]) -> float:
        return evaluate(run_from_columns(qids, docids, values), qrels, ["nDCG@10"])["nDCG@10"]

    columns = {n: set(TeacherDataset.open(ROOT / f[0]).table().column_names) for n, f in present.items()}
    rows = []
    for label in teacher_labels(list(present)):
        if split == "dl19":
            label = reference_label(label)
        if any(row["label"] == label for row in rows):
            continue  # cis_q as upr, computed already
        if any(t.teacher and t.score not in columns[t.teacher] for t in LabelExpression.parse(label, TEACHERS).terms):
            continue  # a score this split's labels lack (the SmolLM2 DL19 labels have no per-token variants)
        table = load_label_table(present, label).table
        table = table[table.qid.isin(queries)]
        rows.append({"label": label, "nDCG@10": ndcg(table.qid.tolist(), table.docid.tolist(), table.label.tolist())})
    # chance: the mean over seeded random orders of the same candidates
    rng = np.random.default_rng(0)
    pairs = first[first.qid.isin(queries)]
    shuffles = [ndcg(pairs.qid.tolist(), pairs.docid.tolist(), rng.random(len(pairs)).tolist()) for _ in range(100)]
    rows.append({"label": f"random order (mean of {RANDOM_ORDERS})", "nDCG@10": float(np.mean(shuffles))})
    command = f"python experiments/quality.py teacher --split {split}"
    what = (
        "the 16 validation queries (DL21), where labels are chosen"
        if split == "val"
        else ("all 43 DL19 queries, the test reference (nothing is chosen here)")
    )
    record = {"command": command, "teacher_data": present, "queries": sorted(queries), "rows": rows}
    lines = [f"`{command}`: the teachers' labels on {what}, reranking the BM25 top-100", ""]
    lines += ["| label | nDCG@10 |", "|---|---|", *(f"| `{r['label']}` | {r['nDCG@10']:.2f} |" for r in rows)]
    write(record, "\n".join(lines), "quality-dl21-val-teacher" if split == "val" else "quality-dl19-teacher")
    return record


def test(names: list[str], first_stage: str = "bm25") -> None:
    """Export each variant of ``names`` (of :data:`TEST`), rerank DL19's ``first_stage`` top-100 with and without the
    interpolation chosen on validation, and evaluate beside that first stage and, on BM25, the teacher (with
    per-query agreement with the student's own label, ensembles included)."""
    commands = []
    for name in names:
        folder = run_dir(name).relative_to(ROOT)
        if not (ROOT / folder / "hf" / "config.json").is_file():
            raise SystemExit(f"quality.py test: {folder}/hf is missing: run `quality.py train {name}` first")
        label = json.loads((ROOT / folder / "hf" / "config.json").read_text())["cis_distill"]["label"]
        if not (ROOT / folder / "export" / "model.onnx").is_file():
            commands.append(["distill", "export", "--checkpoint", str(folder), "--formats", "onnx"])
        rerank = ["distill", "rerank", "--model", str(folder), "--backend", "onnx"]
        rerank += ["--input", f"{DL19}/{FIRST_STAGES[first_stage]}"]
        runs = [f"data/teacher/dl19-{first_stage}-smollm2/runs/first_stage.trec"]
        for interpolation in ("false", "true"):
            output = folder / f"dl19-{first_stage}{'-interp' if interpolation == 'true' else ''}.trec"
            commands.append([*rerank, "--interpolation", interpolation, "--output", str(output)])
            runs.append(str(output))
        evaluate = ["distill", "eval", "--qrels", f"{DL19}/qrels.txt"]
        stem = f"quality-dl19-{name}" if first_stage == "bm25" else f"quality-dl19-{first_stage}-{name}"
        result = ["--json", str((RESULTS / f"{stem}.json").relative_to(ROOT))]
        if first_stage != "bm25":
            commands.append([*evaluate, "--run", *runs, *result])
            continue
        teachers = LabelExpression.parse(label, TEACHERS).teachers
        reference = {t: f for t, f in named_teachers("dl19").items() if t in teachers}
        if missing := [f[0] for f in reference.values() if not (ROOT / f[0] / "teacher.json").is_file()]:
            print(f"{name}: no DL19 labels in {missing} (configs/teach/): evaluated without the teacher's agreement")
            commands.append([*evaluate, "--run", *runs, *result])
            continue
        if teachers:
            teacher_flag = json.dumps(reference, separators=(",", ":"))
            members = [f"{reference[t.teacher][0]}/runs/{t.score}.trec" for t in reference_terms(label) if t.teacher]
        else:
            teacher_flag = DL19_TEACHER
            members = [
                f"{DL19_TEACHER}/runs/{t.score}.trec" for t in reference_terms(label) if t.score != "first_stage"
            ]
        members = [m for m in dict.fromkeys(members) if (ROOT / m).is_file()]
        runs = [runs[0], *members, *runs[1:]]
        commands.append(
            [*evaluate, "--run", *runs, "--teacher", teacher_flag, "--label", reference_label(label), *result]
        )
    for command in commands:
        run(command)


def reference_terms(label: str) -> list[Term]:
    """The terms of ``label`` as the DL19 reference names them (:func:`reference_label`)."""
    return LabelExpression.parse(reference_label(label), TEACHERS).terms


def reference_label(label: str) -> str:
    """The DL19 teacher column that ranks as ``label`` within every query.

    The committed SmolLM2 DL19 labels hold ``upr`` but not ``cis_q``: cis_q = upr - log p(Q | empty passage) differs
    from upr by one constant per query (and cis_q_mean divides it by one), so within a query, and after the
    per-query standardisation of a hybrid or ensemble label, they rank identically; per-query agreement is the same
    figure. The Gemma DL19 labels hold every score.
    """
    for query_direction in ("cis_q_mean", "cis_q"):
        label = re.sub(rf"(?<![\w.]){query_direction}\b", "upr", label)
        label = label.replace(f"smollm2.{query_direction}", "smollm2.upr")
    return label


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    train_parser = sub.add_parser("train", help="train variants (skips finished ones)")
    train_parser.add_argument("names", nargs="+", choices=sorted(EXPERIMENTS))
    teacher_parser = sub.add_parser("teacher", help="the teachers' labels, hybrids and ensembles on a split")
    teacher_parser.add_argument("--split", choices=("val", "dl19"), default="val")
    sub.add_parser("table", help="the validation table of the finished variants")
    test_parser = sub.add_parser("test", help="the DL19 test of the chosen variants (TEST; default all of them)")
    test_parser.add_argument("names", nargs="*", help=f"of {TEST}")
    test_parser.add_argument("--first_stage", choices=sorted(FIRST_STAGES), default="bm25")
    args = parser.parse_args(argv)
    if args.command == "train":
        train(args.names)
    elif args.command == "teacher":
        teacher(args.split)
    elif args.command == "table":
        table()
    elif unknown := set(args.names) - set(TEST):
        parser.error(f"test: {sorted(unknown)} not in TEST {TEST}")
    else:
        test(args.names or TEST, args.first_stage)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
