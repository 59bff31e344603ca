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

from distill.core.schema import InputError

FLAG_TYPES = {
    "int": int,
    "int | None": int,
    "float": float,
    "str": str,
    "str | None": str,
    "int | str | None": str,
}
LIST_TYPES = {"list[str]": str, "list[str] | None": str, "list[int]": int}
"""Option types given as comma-separated flags, and their item type."""


def _comma_list(item: type) -> Any:
    def parse(text: str) -> list[Any]:
        return [item(x.strip()) for x in text.split(",") if x.strip()]

    return parse


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
            kwargs.update(type=_bool, metavar="BOOL", nargs="?", const=True)
        elif f.type in LIST_TYPES:
            kwargs.update(type=_comma_list(LIST_TYPES[f.type]), metavar="A,B")
        elif f.type == "OnBadInput":
            from distill.core.loaders import OnBadInput

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
    from distill.core.config import load_config

    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return load_config(cls, args.config, overrides)


def cmd_teach(args: argparse.Namespace) -> int:
    from distill.stages.teach import TeachConfig, run_teach

    run_teach(_build_config(TeachConfig, args))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from distill.core.eval_report import evaluate_runs, format_per_query, format_table, to_json
    from distill.core.loaders import load_candidates, load_qrels
    from distill.core.loaders.multihop import is_multihop_file
    from distill.core.metrics import DEFAULT_METRICS, MULTIHOP_METRICS, default_rel_level, parse_metrics
    from distill.core.runs import Run, find_run_files, read_trec_run

    if not (args.input or (args.qrels and args.run)):
        raise InputError("give --qrels and --run, or --input (with --qrels where it has no judgements of its own)")
    runs: dict[str, Run] = {}
    if args.input:  # its own ranking first: the baseline
        data = load_candidates(args.input, qrels=args.qrels)
        if not data.qrels:
            raise InputError(f"{args.input}: no relevance judgements; give --qrels")
        qrels = data.qrels
        runs[f"{Path(args.input).stem}/first_stage"] = data.first_stage_run()
    else:
        qrels = load_qrels(Path(args.qrels))
    multihop = args.multihop or bool(args.input and is_multihop_file(Path(args.input)))
    metrics = args.metrics or list(MULTIHOP_METRICS if multihop else DEFAULT_METRICS)
    rel_level = default_rel_level(qrels) if args.rel_level is None else args.rel_level
    parse_metrics(metrics, rel_level)  # an unknown name fails before the runs are read
    if args.run:
        for name, path in find_run_files(args.run).items():
            runs[name] = read_trec_run(path)
            if not runs[name].keys() & qrels.keys():
                raise InputError(f"{path}: no query of the run has relevance judgements in {args.qrels or args.input}")
    if args.held_out:
        from students.model import held_out_queries

        qrels = {qid: judged for qid, judged in qrels.items() if qid in held_out_queries(Path(args.held_out))}
    report = evaluate_runs(runs, qrels, metrics, rel_level, args.test)
    if args.json:
        command = "distill " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        record = {"command": command, "qrels": args.qrels, "input": args.input, **to_json(report)}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    print(format_table(report))
    if args.per_query:
        print("\n" + format_per_query(report))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from distill.backend.export import export_student
    from distill.backend.parity import ParitySet
    from distill.core.loaders import load_candidates

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
    from distill.core.loaders import load_candidates
    from distill.core.runs import write_trec_run
    from distill.serving.reranker import Reranker

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


def cmd_retrieve(args: argparse.Namespace) -> int:
    from distill.retrieval import retrieve

    result = retrieve(
        args.corpus,
        args.queries,
        args.output,
        args.method,
        k=args.k,
        index_dir=args.index,
        encoder=args.encoder,
        device=args.device,
        max_batch_tokens=args.max_batch_tokens,
        output_format=args.format,
    )
    action = "reused" if result.reused_index else "built"
    print(f"{action} the {args.method} index {result.index_dir} ({result.num_docs} passages)")
    pairs = sum(map(len, result.run.values()))
    no_hits = result.num_queries - len(result.run)
    print(f"wrote {args.output}: {len(result.run)} queries, {pairs} pairs, {no_hits} queries without a hit")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from distill.bench import report

    if args.results:
        result = json.loads(Path(args.results).read_text())
    else:
        from distill.bench.run import BenchConfig, run_bench

        result = run_bench(_build_config(BenchConfig, args), "distill " + shlex.join(sys.argv[1:]))
    print(report.latency_table(result))
    for name, reason in result["skipped"].items():
        print(f"skipped {name}: {reason}")
    if getattr(args, "compare", False):
        print("\n" + report.compare_table(result))
    if "output" in result:
        print(f"wrote {result['output']}/bench.{{json,csv,png}}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from distill.pipeline import load_pipeline, run_pipeline

    run_pipeline(load_pipeline(args.config), set(args.force))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from distill.core.metrics import DEFAULT_METRICS, MULTIHOP_METRICS
    from distill.stages.teach import TeachConfig

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

    ev = sub.add_parser("eval", help="nDCG and other ir-measures metrics of TREC runs, with significance tests")
    ev.add_argument("--qrels", help="TREC qrels file (overrides the judgements of --input)")
    ev.add_argument(
        "--run", nargs="+", help="run files, or folders holding them (or a runs/ folder); the first is the baseline"
    )
    ev.add_argument(
        "--input",
        help="candidates with judgements (a multi-hop QA file, rank_llm JSON with --qrels, ...): their own order is "
        "evaluated as the first run (the baseline) and their judgements are the qrels",
    )
    ev.add_argument(
        "--metrics",
        nargs="+",
        help=f"ir-measures names (default: {' '.join(DEFAULT_METRICS)}; multi-hop: {' '.join(MULTIHOP_METRICS)})",
    )
    ev.add_argument(
        "--rel-level",
        type=int,
        help="grade from which a document is relevant for RR, R, P, AP, ... without a rel= of their own "
        "(default: 2 where the top grade is >= 2, as in TREC DL, else 1)",
    )
    ev.add_argument(
        "--multihop",
        action="store_true",
        help="multi-hop QA metrics (supporting-paragraph recall and precision at 3, 4, 6); automatic for such --input",
    )
    ev.add_argument(
        "--test", choices=["t", "randomization"], default="t", help="paired significance test vs the first run"
    )
    ev.add_argument(
        "--held-out",
        metavar="STUDENT",
        help="evaluate only the queries this student was validated on (its run or HF folder)",
    )
    ev.add_argument("--per-query", action="store_true", help="also print each query's values")
    ev.add_argument("--json", help="also write the results (means, per query, significance) to this JSON file")
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
    rerank.add_argument(
        "--max-batch-tokens", type=int, help="padded tokens per batch (default 1024 on a CPU, 16384 on a GPU)"
    )
    rerank.add_argument("--max-queries", type=int, help="rerank only the first N queries")
    rerank.set_defaults(func=cmd_rerank)

    from distill.retrieval.dense import DEFAULT_ENCODER
    from distill.retrieval.retrieve import METHODS, OUTPUT_FORMATS

    retrieve = sub.add_parser("retrieve", help="first-stage retrieval (BM25 or dense): candidates for teach and rerank")
    retrieve.add_argument("--corpus", required=True, help="passages (TSV docid<TAB>text or JSONL), or a BEIR folder")
    retrieve.add_argument("--queries", help="queries (TSV qid<TAB>text or JSONL); default: the BEIR folder's")
    retrieve.add_argument("--method", choices=METHODS, default="bm25")
    retrieve.add_argument("--encoder", default=DEFAULT_ENCODER, help="dense: encoder (alias, folder, hub id)")
    retrieve.add_argument("--k", type=int, default=100, help="passages per query")
    retrieve.add_argument("--index", help="index folder, reused while corpus and settings match (default: by --output)")
    retrieve.add_argument("--output", required=True, help="the candidates file to write")
    retrieve.add_argument("--format", choices=OUTPUT_FORMATS, default="trec", help="a TREC run, or rank_llm JSON")
    retrieve.add_argument("--device", default="cpu", help="dense: cpu or cuda[:N]")
    retrieve.add_argument("--max-batch-tokens", type=int, default=16384, help="dense: padded tokens per batch")
    retrieve.set_defaults(func=cmd_retrieve)

    from distill.bench.run import BenchConfig

    bench = sub.add_parser("bench", help="latency of a student's backends against its teacher (the paper's protocol)")
    add_config_flags(bench, BenchConfig)
    bench.add_argument("--results", help="print the tables of a saved bench.json instead of running")
    bench.set_defaults(func=cmd_bench)

    run = sub.add_parser("run", help="the whole pipeline (teach, train, export, bench, eval) from one YAML file")
    run.add_argument("--config", required=True, help="a pipeline YAML, such as configs/quickstart.yaml")
    run.add_argument(
        "--force",
        type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
        default=[],
        metavar="STAGE,...",
        help="rerun these stages (teach, train, export, bench, eval, or all) even when up to date",
    )
    run.set_defaults(func=cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    command = argv[0] if argv else "distill"
    try:
        if command == "train":  # LightningCLI parses its own arguments
            from distill.stages.train import run_train

            return run_train(argv[1:])
        args = build_parser().parse_args(argv)
        return args.func(args)
    except (InputError, FileNotFoundError, FileExistsError, ValueError) as e:  # ModelNotFoundError included
        print(f"distill {command}: error: {e}", file=sys.stderr)
        return 2
