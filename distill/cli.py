"""The ``distill`` command line: one subcommand per stage.

Each subcommand's options are one typed dataclass, its stage's config (see :mod:`distill.core.config`): YAML
files (``--config``, several compose in order), then flags (``--max_queries 3``); ``--print_config`` shows the
result and ``--help`` every option with its default. ``distill train`` is LightningCLI, on the same jsonargparse.

A subcommand imports its stage only when it runs, so ``distill eval`` never loads torch. Only the project's own
errors (:class:`~distill.core.schema.UserError`: bad input, a missing model, a failed parity check) print as one
line; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from distill.core.devices import job_leader
from distill.core.output_files import NO_SPACE, is_stdout
from distill.core.schema import EXIT_INTERRUPTED, UserError


@dataclass(frozen=True)
class Command:
    """A subcommand: ``function(config[, command line])`` of ``module``; it returns a report with ``format()``."""

    help: str
    module: str
    config: str | None
    """The name of the config dataclass in ``module``; None: the function parses the arguments itself."""
    function: str
    takes_command: bool = False
    """The function records the command line with its results."""
    positional: str | None = None
    """The list option that bare arguments before the first flag fill (``distill migrate A B``: ``--paths A B``)."""

    def takes(self, option: str) -> bool:
        """Whether the subcommand has the option ``option`` (``distill train``'s are LightningCLI's: not known)."""
        import dataclasses

        if self.config is None:
            return False
        config = getattr(importlib.import_module(self.module), self.config)
        return option in {f.name for f in dataclasses.fields(config)}

    def run(self, argv: Sequence[str], command_line: str, prog: str) -> Any:
        from distill.core.config import parse_config

        module = importlib.import_module(self.module)
        function = getattr(module, self.function)
        if self.config is None:
            return function(list(argv))
        argv = list(argv)
        if self.positional:
            bare = next((i for i, arg in enumerate(argv) if arg.startswith("-")), len(argv))
            if bare:
                argv = [f"--{self.positional}", *argv[:bare], *argv[bare:]]
        config = parse_config(getattr(module, self.config), argv, prog)
        return function(config, command_line) if self.takes_command else function(config)


COMMANDS: dict[str, Command] = {
    "teach": Command(
        "score candidates with a causal-LM teacher and save triplets",
        "distill.stages.teach",
        "TeachConfig",
        "teach",
        takes_command=True,
    ),
    "train": Command(
        "distil the teacher's scores into a cross-encoder (LightningCLI: distill train --help)",
        "distill.stages.train",
        None,
        "train",
    ),
    "export": Command(
        "export a student to ONNX and TorchScript, checked for parity with PyTorch",
        "distill.stages.export",
        "ExportConfig",
        "export",
    ),
    "rerank": Command(
        "rerank candidates with a student and write a TREC run", "distill.stages.rerank", "RerankConfig", "rerank"
    ),
    "eval": Command(
        "nDCG and other ir-measures metrics of TREC runs, with significance tests",
        "distill.stages.evaluate",
        "EvalConfig",
        "evaluate",
        takes_command=True,
    ),
    "retrieve": Command(
        "first-stage retrieval (BM25 or dense): candidates for teach and rerank",
        "distill.stages.retrieve",
        "RetrieveConfig",
        "retrieve",
    ),
    "bench": Command(
        "latency of a student's backends against its teacher (the paper's protocol)",
        "distill.bench.latency",
        "BenchConfig",
        "bench",
        takes_command=True,
    ),
    "run": Command(
        "the whole pipeline (teach, train, export, bench, rerank, eval) from one YAML file",
        "distill.pipeline",
        "RunConfig",
        "run",
    ),
    "serve": Command(
        "serve a student over HTTP (Cohere's /v1/rerank, TEI's /rerank), with dynamic batching",
        "distill.serving.server",
        "ServeConfig",
        "serve",
    ),
    "migrate": Command(
        "move old teacher datasets' metadata into teacher.json (the rows are untouched)",
        "distill.stages.migrate",
        "MigrateConfig",
        "migrate",
        positional="paths",
    ),
}


EXTRAS = {
    **dict.fromkeys(
        ("torch", "datasets", "accelerate", "pytorch_lightning", "lightning_fabric", "wandb", "pandas", "pyarrow"),
        "train",
    ),
    **dict.fromkeys(("gguf", "onnx", "onnxscript", "matplotlib"), "train"),
    **dict.fromkeys(("scipy", "ir_measures", "pytrec_eval"), "eval"),
    **dict.fromkeys(("faiss", "bm25s", "Stemmer", "ir_datasets"), "retrieval"),
    "openvino": "openvino",
}
"""The top-level module -> the extra of the package that installs it (``pip install 'cis-distill[train]'``)."""
NO_EXTRA = {"deepspeed": "pip install --no-build-isolation deepspeed (it builds against the installed torch)"}
"""A module that a command may need but no extra installs -> how to install it."""


def missing_extra(error: ModuleNotFoundError, prog: str) -> Exception:
    """One line naming the extra a missing module belongs to (or how to install one that no extra installs);
    ``error`` itself for any other module (a genuine bug, shown with its traceback)."""
    module = (error.name or "").split(".")[0]
    if module in NO_EXTRA:
        return UserError(f"{prog} needs {module}, which is not installed: {NO_EXTRA[module]}")
    extra = EXTRAS.get(module)
    if extra is None:
        return error
    return UserError(
        f"{prog} needs the {extra} extra ({module} is not installed): pip install -e '.[{extra}]' in a checkout, "
        f"or pip install '{_wheel_name()}[{extra}]' from the wheel"
    )


def _wheel_name() -> str:
    """The file name of the wheel of the installed version (``cis_distill-<version>-py3-none-any.whl``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"cis_distill-{version('cis-distill')}-py3-none-any.whl"
    except PackageNotFoundError:
        return "<the cis-distill wheel>"


PROJECT_LOGGERS = ("distill", "teachers", "students")
"""The project's loggers: their INFO lines are the stages' progress, which the command line shows."""


LIGHTNING_INFO = "pytorch_lightning.utilities.rank_zero"
"""Lightning's logger of the lines a training shows (devices, the end of ``fit``), and of its adverts."""


def no_advert(record: logging.LogRecord) -> bool:
    """Whether ``record`` is not one of Lightning's "💡 Tip" adverts (for its cloud services), which a run shows
    otherwise at every start."""
    return not str(record.msg).startswith("💡 Tip")


DEEPSPEED = "DeepSpeed"
"""DeepSpeed's logger, which writes to standard output."""


def no_accelerator_notice(record: logging.LogRecord) -> bool:
    """Whether ``record`` is not DeepSpeed's notice of the accelerator it detected ("Setting accelerator to CPU. If
    you have GPU ..."), which accelerate's import of DeepSpeed prints on standard output at every start."""
    return record.filename != "real_accelerator.py"


def quiet_third_parties() -> None:
    """Show the project's progress (INFO) and every warning, and keep the notices a user can do nothing about quiet:
    transformers' INFO-like warnings (``loss_type=None``, gradient-checkpointing notes), its per-model "Loading
    weights" and GGUF conversion bars, datasets' "Saving the dataset" bars, Lightning's adverts and DeepSpeed's
    accelerator notice. Set ``TRANSFORMERS_VERBOSITY``, ``HF_HUB_DISABLE_PROGRESS_BARS`` or
    ``HF_DATASETS_DISABLE_PROGRESS_BARS`` to see the first three again."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in PROJECT_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    logging.getLogger(LIGHTNING_INFO).addFilter(no_advert)
    logging.getLogger(DEEPSPEED).addFilter(no_accelerator_notice)  # kept: DeepSpeed's import adds a handler, no filter


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: distill COMMAND [--config FILE ...] [--option value ...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {command.help}" for name, command in COMMANDS.items()]
    lines += ["", "distill COMMAND --help lists a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``distill`` command ``argv``; its exit status. Without ``argv``, the program's own (``distill`` or
    ``python -m distill``): the process ends next, which :func:`ready_to_exit` makes quick."""
    if argv is None:
        status = main(sys.argv[1:])
        ready_to_exit()
        return status
    argv = list(argv)
    quiet_third_parties()
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"distill: error: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    prog = f"distill {name}"
    try:
        return _run(name, rest, argv, prog)
    finally:
        leave_process_group()


OWN_SIGTERM = ("train", "run")
"""Commands that handle SIGTERM themselves: train saves ``last.ckpt`` and exits 75 (a pipeline's train stage too).
(serve says it like the others while its models load; once it listens, its server's handler drains the requests in
flight and exits 0, and puts this one back after.)"""


@contextlib.contextmanager
def said_when_terminated(prog: str) -> Iterator[None]:
    """While in it, SIGTERM (a scheduler's time limit, ``kill``) writes ``<prog>: stopped by SIGTERM`` to standard
    error, then ends the process as the signal ends it (status 143): the stages keep nothing half-written under an
    output's name (:mod:`distill.core.output_files`), and a teach goes on from its saved chunks. The handler raises
    nothing, so no clean-up that the signal lands in is cut short, and writes with ``os.write``, which takes no lock.
    The handler before it is put back after (``main`` called in a process that goes on)."""
    line = f"\n{prog}: stopped by SIGTERM\n".encode()

    def stop(signum: int, frame: Any) -> None:
        if job_leader():
            os.write(sys.stderr.fileno(), line)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    if threading.current_thread() is not threading.main_thread():  # only the main thread sets handlers
        yield
        return
    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _run(name: str, rest: list[str], argv: list[str], prog: str) -> int:
    """:func:`main` of the command ``name`` (``prog``) with its arguments ``rest``."""
    if name in OWN_SIGTERM:
        return _run_command(name, rest, argv, prog)
    with said_when_terminated(prog):
        return _run_command(name, rest, argv, prog)


def _run_command(name: str, rest: list[str], argv: list[str], prog: str) -> int:
    """:func:`_run`, within its SIGTERM handling."""
    try:
        try:
            report = COMMANDS[name].run(rest, "distill " + shlex.join(argv), prog)
        except ModuleNotFoundError as e:
            raise missing_extra(e, prog) from None
    except UserError as e:
        message = _without_hint(_without_prefix(str(e), prog, name), COMMANDS[name])
        print(f"{prog}: error: {message}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:  # Ctrl-C: what each stage has saved so far stays (a teach goes on from it)
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # writing a run to a pipe whose reader left (`--output /dev/stdout | head`)
        _drop_stdout()
        print(f"{prog}: error: the output's reader closed the pipe before the end", file=sys.stderr)
        return 1
    except OSError as e:
        if e.errno not in NO_SPACE:
            raise
        where = f"{e.filename}: " if e.filename else ""
        print(f"{prog}: error: {where}{e.strerror}: free some space and run it again", file=sys.stderr)
        return 1
    if report is not None and job_leader():  # one summary for a job of several processes, not one a process
        # what is written to standard output (rerank's --output /dev/stdout, eval's --json) is not followed there by
        # the summary
        try:
            print(report.format(), file=sys.stderr if is_stdout(getattr(report, "output", None)) else sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:  # the summary's reader left (`distill eval ... | head -3`): the work is done
            _drop_stdout()
    return 0


def _drop_stdout() -> None:
    """Point standard output at ``/dev/null``: its pipe is closed, and the interpreter's flush at exit would fail
    on it with a second error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def leave_process_group() -> None:
    """Destroy this process's ``torch.distributed`` group, if it has one: a process that ends with its gloo group
    alive could abort at exit (``terminate called without an active exception``) once its peers had gone, turning
    one line and its exit status into a core dump."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def ready_to_exit() -> None:
    """Move every object to the garbage collector's permanent generation (``gc.freeze``), so that the interpreter's
    exit, which would collect them all, skips them: after ``distill train`` that collection (torch's, Lightning's and
    a compiled model's objects) went on for seconds after the summary was printed. The exit handlers still run
    (wandb's, the data loaders' and the compile workers' shutdown). For a process about to end only: its garbage
    is never collected again."""
    gc.freeze()


def _without_prefix(message: str, *prefixes: str) -> str:
    """``message`` without a leading ``distill eval: `` or ``eval: `` (the CLI's own prefix says it already)."""
    for prefix in prefixes:
        if message.startswith(f"{prefix}: "):
            return message[len(prefix) + 2 :]
    return message


def _without_hint(message: str, command: Command) -> str:
    """``message`` without the hint of a bad record's error (``--on_bad_input skip``) where ``command`` does not take
    that option (export, bench: their inputs must be whole)."""
    from distill.data.loaders._common import BadInput

    hint = f" ({BadInput.SKIP_HINT})"
    return message.replace(hint, "") if hint in message and not command.takes("on_bad_input") else message
