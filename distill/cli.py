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
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from distill.models import ModelNotFoundError

    command = argv[0] if argv else "distill"
    try:
        if command == "train":  # LightningCLI parses its own arguments
            from distill.train import run_train

            return run_train(argv[1:])
        args = build_parser().parse_args(argv)
        return args.func(args)
    except (InputError, ModelNotFoundError, ValueError) as e:
        print(f"distill {command}: error: {e}", file=sys.stderr)
        return 2
