"""The ``distill`` command line: one subcommand per stage.

Every stage option can be set in a YAML file (``--config``) and overridden by a flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shlex
import sys
from pathlib import Path
from typing import Any, get_args

from distill.schema import InputError

FLAG_TYPES = {"int": int, "int | None": int, "str": str, "str | None": str, "int | str | None": str}


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_config_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """A ``--flag`` per dataclass field; flags not given leave the YAML/default value alone."""
    parser.add_argument("--config", help="YAML file of options; flags override it")
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": f"(default: {_default(f)})"}
        if f.type == "bool":
            kwargs.update(type=_bool, metavar="BOOL")
        elif f.type == "list[str]":
            kwargs.update(type=lambda s: [x.strip() for x in s.split(",") if x.strip()], metavar="A,B")
        elif f.type == "OnBadInput":
            from distill.loaders import OnBadInput

            kwargs.update(choices=get_args(OnBadInput))
        else:
            kwargs["type"] = FLAG_TYPES[f.type]
        names = [flag, "--score"] if f.name == "scores" else [flag]
        parser.add_argument(*names, **kwargs)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "required"


def _build_config(cls: type, args: argparse.Namespace) -> Any:
    from distill.config import load_config

    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return load_config(cls, args.config, overrides)


def cmd_teach(args: argparse.Namespace) -> int:
    from distill.teach import TeachConfig, run_teach

    run_teach(_build_config(TeachConfig, args))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from distill.evaluate import evaluate
    from distill.loaders import load_qrels
    from distill.runs import read_trec_run

    qrels = load_qrels(Path(args.qrels))
    files: list[Path] = []
    for given in map(Path, args.run):
        if given.is_dir():
            runs_dir = given / "runs" if (given / "runs").is_dir() else given
            files.extend(sorted(runs_dir.glob("*.trec")))
        elif given.is_file():
            files.append(given)
        else:
            raise InputError(f"{given}: no such run file or folder")
    if not files:
        raise InputError(f"no .trec run files in {args.run}")
    results = {
        f"{f.parent.parent.name}/{f.stem}" if f.parent.name == "runs" else str(f): evaluate(
            read_trec_run(f), qrels, args.metrics
        )
        for f in files
    }
    width = max(map(len, results))
    print(f"{'run':<{width}}  " + "  ".join(f"{m:>8}" for m in args.metrics))
    for name, values in results.items():
        print(f"{name:<{width}}  " + "  ".join(f"{values[m]:8.2f}" for m in args.metrics))
    if args.json:
        command = "distill " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        record = {"command": command, "qrels": args.qrels, "metrics": args.metrics, "results": results}
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from distill.backend import ParitySet, export_student
    from distill.loaders import load_candidates

    parity = None
    if args.parity_input:
        data = load_candidates(args.parity_input, qrels=args.qrels)
        parity = ParitySet.from_data(data, args.parity_queries, args.parity_depth)
    run = Path(args.checkpoint)
    model = run / "hf" if (run / "hf" / "config.json").is_file() else run
    output = Path(args.output) if args.output else (run if model != run else run.parent) / "export"
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    unknown = sorted(set(formats) - {"onnx", "torchscript"})
    if unknown:
        raise InputError(f"--formats: unknown format(s) {unknown}; choose from onnx, torchscript")
    report = export_student(model, output, formats, args.fp16, args.int8, parity)
    print(f"{'format':<12} {'file':<22} {'device':<6} {'max |Δscore|':>12} {'bound':>7}  nDCG@10 (PyTorch -> format)")
    for p in report.parity:
        ndcg = f"{p.ndcg10['pytorch']:.2f} -> {p.ndcg10[p.format]:.2f}" if p.ndcg10 else ""
        diff = "-" if p.max_abs_diff is None else f"{p.max_abs_diff:.3g}"
        bound = "-" if p.bound is None else f"{p.bound:g}"
        file = report.formats[p.format]
        print(f"{p.format:<12} {file:<22} {p.device or '-':<6} {diff:>12} {bound:>7}  {ndcg}{p.not_checked or ''}")
    print(f"wrote {report.out_dir} (card.json has the parity figures)")
    return 0


def cmd_rerank(args: argparse.Namespace) -> int:
    from distill.loaders import load_candidates
    from distill.reranker import Reranker
    from distill.runs import write_trec_run

    data = load_candidates(args.input, queries=args.queries, corpus=args.corpus)
    reranker = Reranker.load(args.model, args.backend, args.device, args.dtype, args.max_length, args.max_batch_tokens)
    run: dict[str, dict[str, float]] = {}
    for cands in data.candidates[: args.max_queries]:
        scores = reranker.score(cands.query.text, [p.text for p in cands.passages])
        run[cands.query.qid] = {p.docid: s for p, s in zip(cands.passages, scores, strict=True)}
    write_trec_run(args.output, run, tag=f"{Path(args.model).name}-{args.backend}")
    pairs = sum(map(len, run.values()))
    print(f"wrote {args.output}: {len(run)} queries, {pairs} pairs, {reranker.truncated} truncated")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from distill.teach import TeachConfig

    parser = argparse.ArgumentParser(
        prog="distill", description="Distil a causal LM's CIS into cross-encoder rerankers."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    teach = sub.add_parser("teach", help="score candidates with a causal-LM teacher and save triplets")
    add_config_flags(teach, TeachConfig)
    teach.set_defaults(func=cmd_teach)

    train = sub.add_parser(
        "train", help="distil the teacher's scores into a cross-encoder (LightningCLI; see distill train --help)"
    )
    train.add_argument("args", nargs=argparse.REMAINDER)

    ev = sub.add_parser("eval", help="nDCG and other ir-measures metrics of TREC runs")
    ev.add_argument("--qrels", required=True, help="TREC qrels file")
    ev.add_argument("--run", nargs="+", required=True, help="run files, or folders holding them (or a runs/ folder)")
    ev.add_argument("--metrics", nargs="+", default=["nDCG@1", "nDCG@5", "nDCG@10"], help="ir-measures names")
    ev.add_argument("--json", help="also write the results to this JSON file")
    ev.set_defaults(func=cmd_eval)

    export = sub.add_parser("export", help="export a student to ONNX and TorchScript, checked for parity with PyTorch")
    export.add_argument(
        "--checkpoint", required=True, help="a training run (checkpoints/<run>, its hf/ is exported) or an HF folder"
    )
    export.add_argument("--output", help="the export folder (default: <run>/export; a previous export is replaced)")
    export.add_argument("--formats", default="onnx,torchscript", help="comma-separated: onnx, torchscript")
    export.add_argument("--fp16", action="store_true", help="also model.fp16.onnx (fp16 weights, for GPUs)")
    export.add_argument("--int8", action="store_true", help="also model.int8.onnx (int8 weights, for CPUs)")
    export.add_argument("--parity-input", help="candidates to check on (default: the shipped DL19 BM25 top-100)")
    export.add_argument("--qrels", help="qrels of --parity-input, for the int8 nDCG@10 bound")
    export.add_argument(
        "--parity-queries",
        type=int,
        default=3,
        help="queries of --parity-input for the score bounds (int8 is checked on all judged ones)",
    )
    export.add_argument("--parity-depth", type=int, default=32, help="candidates per query for the score bounds")
    export.set_defaults(func=cmd_export)

    rerank = sub.add_parser("rerank", help="rerank candidates with a student and write a TREC run")
    rerank.add_argument("--model", required=True, help="an HF folder (torch backend) or an export folder")
    rerank.add_argument(
        "--input", "--run", dest="input", required=True, help="candidates (a TREC run or rank_llm JSON, ...)"
    )
    rerank.add_argument("--queries", help="for a TREC run input: the queries (TSV or JSONL)")
    rerank.add_argument("--corpus", help="for a TREC run input: the passages (TSV or JSONL)")
    rerank.add_argument("--output", required=True, help="the TREC run file to write")
    rerank.add_argument("--backend", choices=["torch", "onnx", "torchscript"], default="torch")
    rerank.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    rerank.add_argument("--dtype", help="torch: float32|float16|bfloat16; onnx: float32|float16|int8")
    rerank.add_argument("--max-length", type=int, help="longest pair in tokens (default: the model's)")
    rerank.add_argument("--max-batch-tokens", type=int, default=16384, help="padded tokens per batch")
    rerank.add_argument("--max-queries", type=int, help="rerank only the first N queries")
    rerank.set_defaults(func=cmd_rerank)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    command = argv[0] if argv else "distill"
    try:
        if command == "train":  # LightningCLI parses its own arguments
            from distill.train import run_train

            return run_train(argv[1:])
        args = build_parser().parse_args(argv)
        return args.func(args)
    except (InputError, FileNotFoundError, FileExistsError, ValueError) as e:  # ModelNotFoundError included
        print(f"distill {command}: error: {e}", file=sys.stderr)
        return 2
