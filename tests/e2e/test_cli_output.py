"""The command line's output: the stages' progress at INFO, shown; third-party notices a user can do nothing about
(transformers' per-model "Loading weights" bars and advisory warnings), hidden unless asked for."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

LOAD = """
import sys
if sys.argv[2] == "quiet":
    from distill.cli import quiet_third_parties
    quiet_third_parties()
from transformers import AutoModelForSequenceClassification
AutoModelForSequenceClassification.from_pretrained(sys.argv[1])
"""


DEEPSPEED = """
import sys
if sys.argv[1] == "quiet":
    from distill.cli import quiet_third_parties
    quiet_third_parties()
import accelerate.utils
if accelerate.utils.is_deepspeed_available():  # as accelerate's own import of DeepSpeed does
    from deepspeed.accelerator import get_accelerator
    print("accelerator", get_accelerator().device_name())
"""


def run_python(script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {
        k: v for k, v in os.environ.items() if k not in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS")
    }
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True, text=True, cwd=REPO, env={**environment, **env}, check=True,
    )  # fmt: skip


def load_stderr(model: Path, mode: str, **env: str) -> str:
    return run_python(LOAD, str(model), mode, **env).stderr


@pytest.mark.slow
def test_loading_a_model_shows_no_weight_loading_bar(tiny_bert: Path) -> None:
    assert "Loading weights" in load_stderr(tiny_bert, "plain")  # what a user saw
    assert "Loading weights" not in load_stderr(tiny_bert, "quiet")
    assert "Loading weights" in load_stderr(tiny_bert, "quiet", HF_HUB_DISABLE_PROGRESS_BARS="0")  # asked for


@pytest.mark.slow
def test_deepspeeds_accelerator_notice_is_not_shown() -> None:
    """DeepSpeed, imported by accelerate in ``teach`` and by Lightning's DeepSpeed strategy, prints which accelerator
    it detected on standard output, where a piped run's lines go."""
    pytest.importorskip("deepspeed")
    plain, quiet = run_python(DEEPSPEED, "plain"), run_python(DEEPSPEED, "quiet")
    assert "real_accelerator.py" in plain.stdout  # what a user saw: "Setting accelerator to CPU. If you have GPU ..."
    assert "accelerator" in quiet.stdout  # DeepSpeed was imported and detected one
    assert "real_accelerator.py" not in quiet.stdout + quiet.stderr, quiet.stdout + quiet.stderr


def test_progress_is_info_and_shown_third_party_info_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    from distill.cli import PROJECT_LOGGERS, quiet_third_parties

    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    levels = {name: logging.getLogger(name).level for name in PROJECT_LOGGERS}
    try:
        quiet_third_parties()
        assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"  # a user's choice stands
        assert logging.getLogger("distill.bench.latency").isEnabledFor(logging.INFO)
        assert logging.getLogger("students.token_store").isEnabledFor(logging.INFO)
        assert not logging.getLogger("urllib3.connectionpool").isEnabledFor(logging.INFO)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def test_every_commands_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    """``distill COMMAND --help`` shows the options' docstrings without their Sphinx markup: a cross-reference as its
    text, a literal without its double backquotes (Lightning's own options' too)."""
    from distill.cli import COMMANDS, main
    from distill.core.config import plain_text

    assert plain_text("``auto`` or :class:`~a.b.ServingOptions`, :mod:`distill.serving`, :meth:`pack <a.B.pack>`") == (
        "auto or ServingOptions, distill.serving, pack"
    )
    for name in COMMANDS:
        with pytest.raises(SystemExit) as done:
            main([name, "--help"])
        shown = capsys.readouterr().out
        assert done.value.code == 0 and "--help" in shown, name
        assert not re.search(r":[a-z]+:`|``", shown), (name, re.findall(r".*(?::[a-z]+:`|``).*", shown)[:3])


@pytest.mark.parametrize("json_output", [False, True])
def test_a_pipe_whose_reader_leaves_early_is_no_traceback(json_output: bool) -> None:
    """``distill eval ... | head -3`` ended in a BrokenPipeError traceback, after the work was done. Where the
    output itself (``--json /dev/stdout``) is cut short, one line says so, with exit 1."""
    teacher = REPO / "data" / "teacher" / "dl19-bm25-smollm2"
    args = ["eval", "--qrels", str(REPO / "data" / "trec-dl19" / "qrels.txt"), "--run", str(teacher)]
    args += ["--json", "/dev/stdout"] if json_output else ["--per_query", "true"]
    read, write = os.pipe()
    os.close(read)  # the reader has left before the first write
    done = subprocess.run([sys.executable, "-m", "distill", *args], stdout=write, stderr=subprocess.PIPE, text=True)
    os.close(write)
    if json_output:
        assert (done.returncode, done.stderr) == (
            1,
            "distill eval: error: the output's reader closed the pipe before the end\n",
        )
    else:
        assert (done.returncode, done.stderr) == (0, "")


def test_a_command_run_in_a_process_that_goes_on_puts_its_sigterm_handler_back(tmp_path, capsys) -> None:
    """A command writes one line on SIGTERM while it runs; ``main`` called in a process that goes on (a notebook, a
    test) leaves that process's own handler in place after it."""
    import signal

    from distill.cli import main

    before = signal.getsignal(signal.SIGTERM)
    assert main(["eval", "--run", str(tmp_path / "nowhere.trec"), "--qrels", str(tmp_path / "q.txt")]) == 2
    assert "q.txt: no such file" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before
