"""The one config system: every subcommand's YAML and flags, checked with one-line errors naming file and key."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml

from distill.cli import COMMANDS, main
from distill.core.config import REPEATABLE, load_section, parse_config
from distill.core.schema import InputError


@dataclass
class Options:
    """A config with every kind of field a stage uses."""

    inputs: list[str] = field(default_factory=list)
    count: int | None = None
    weight: float | None = None
    mode: Literal["fast", "exact"] = "fast"
    enabled: bool = False
    token: int | str | None = None
    models: list[str] = field(default_factory=list, metadata={REPEATABLE: True})


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_flags_are_spelt_as_keys_dashes_accepted_lists_and_bools_made_easy(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("inputs: one.json\ncount: 3\nweight: 0.5\n")
    got = parse_config(Options, ["--config", str(config), "--count", "4", "--mode", "exact", "--enabled"], "x")
    assert got == Options(["one.json"], 4, 0.5, "exact", True, None)
    assert parse_config(Options, ["--inputs", "a,b", "--weight", "null", "--token", "<s>"], "x").inputs == ["a", "b"]
    assert parse_config(Options, ["--inputs", "a", "b", "--enabled", "false"], "x") == Options(["a", "b"])
    assert parse_config(Options, ["--inputs=[a, b]", "--token", "7"], "x").token == 7
    assert parse_config(Options, ["--count=2"], "x").count == 2


def test_a_repeatable_list_flag_given_again_adds_another_list_flag_is_refused_a_scalar_replaces() -> None:
    """``eval --run A --run B`` evaluated only B (the baseline dropped) and ``rerank --input a --input b`` only b's
    queries, with exit 0."""
    got = parse_config(Options, ["--models", "a=1", "--inputs", "x", "--models", "b=2,c", "--count", "1"], "x")
    assert (got.models, got.inputs) == (["a=1", "b=2", "c"], ["x"])
    assert parse_config(Options, ["--count", "1", "--count", "2"], "x").count == 2
    for again in (["--inputs", "y"], ["--inputs=[y]"]):
        with pytest.raises(InputError, match=re.escape("--inputs given twice: give all its items once")):
            parse_config(Options, ["--inputs", "x", *again], "x")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--count", "many"], "--count: expected int | null, got 'many'"),
        (["--weight", "heavy"], "--weight: expected float | null, got 'heavy'"),
        (["--mode", "quick"], "--mode: expected 'fast' | 'exact', got 'quick'"),
        (["--bogus", "1"], "x: unrecognized arguments: --bogus 1"),
    ],
)
def test_a_wrong_flag_is_one_error_naming_it(argv: list[str], expected: str) -> None:
    with pytest.raises(InputError) as error:
        parse_config(Options, argv, "x")
    assert str(error.value) == expected


def test_a_wrong_key_in_a_file_names_the_file_and_the_key(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("cont: 3\n")
    with pytest.raises(InputError, match=rf"^{config}: cont: unknown option \(did you mean 'count'\?\)$"):
        parse_config(Options, ["--config", str(config)], "x")
    config.write_text("count: [1, 2]\n")
    with pytest.raises(InputError, match=rf"^{config}: count: expected int \| null, got \[1, 2\]$"):
        parse_config(Options, ["--config", str(config)], "x")
    config.write_text("count: [1\n")
    with pytest.raises(InputError, match=rf"^{config}:2:1: malformed YAML: expected .,. or .\]., but got"):
        parse_config(Options, ["--config", str(config)], "x")
    with pytest.raises(InputError, match=r"^section: weight: expected float \| null, got 'x'$"):
        load_section(Options, {"weight": "x"}, "section")
    assert load_section(Options, None, "section") == Options()  # an absent section takes the defaults


OPTION_OF = {
    "teach": "max_queries",
    "export": "parity_queries",
    "rerank": "max_queries",
    "eval": "metrics",
    "retrieve": "method",
    "bench": "repeats",
    "migrate": "paths",
}


@pytest.mark.parametrize("command", sorted(OPTION_OF))
def test_every_subcommand_names_a_misspelt_key_in_one_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = OPTION_OF[command]
    config = tmp_path / f"{command}.yaml"
    config.write_text(yaml.safe_dump({key[:-1] + "z": 1}))
    assert main([command, "--config", str(config)]) == 2
    assert f"distill {command}: error: {config}: {key[:-1]}z: unknown option (did you mean '{key}'?)" in (
        one_line_error(capsys)
    )


def test_print_config_and_help_show_the_resolved_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["teach", "--input", "a.json", "--output", "o", "--max_queries", "2", "--print_config"])
    assert done.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["input"] == ["a.json"] and printed["max_queries"] == 2 and printed["teacher"] == "smollm2-135m"
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    assert "--parity_queries" in capsys.readouterr().out
    assert main([]) == 2 and "commands:" in capsys.readouterr().out
    assert main(["nonsense"]) == 2 and "unknown command 'nonsense'" in capsys.readouterr().err


def test_only_user_errors_become_one_line_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    import distill.stages.migrate as migrate

    def broken(config: object) -> None:
        raise ValueError("a bug, not bad input")

    monkeypatch.setattr(migrate, "migrate", broken)
    with pytest.raises(ValueError, match="a bug"):
        main(["migrate", "--paths", "x"])
    assert set(COMMANDS) >= {"teach", "train", "export", "rerank", "eval", "retrieve", "bench", "run", "migrate"}


def test_every_commands_options_are_validated() -> None:
    """jsonargparse accepts anything for a type it cannot resolve (``Unvalidated<...>``): ``TeachConfig``, which
    inherits ``InputOptions``' fields from another module, took ``--overwrite maybe`` as true and replaced a folder."""
    import importlib

    from distill.core.config import _parser
    from distill.stages.teach import TeachConfig

    configs = [
        getattr(importlib.import_module(command.module), command.config)
        for command in COMMANDS.values()
        if command.config
    ]
    assert TeachConfig in configs and len(configs) >= 8
    for cls in configs:
        hints = {a.dest: str(getattr(a, "_typehint", "")) for a in _parser(cls, "x")._actions}
        assert not [dest for dest, hint in hints.items() if "Unvalidated" in hint], cls.__name__
    with pytest.raises(InputError, match=re.escape("--overwrite: expected bool, got 'maybe'")):
        parse_config(TeachConfig, ["--input", "in.json", "--output", "out", "--overwrite", "maybe"], "distill teach")


def test_a_parser_unpickles_in_a_fresh_process() -> None:
    """``--trainer.strategy ddp_spawn`` pickles LightningCLI's parser into each worker, and its help formatter, a
    class made inside a function, could not be pickled (``Can't pickle local object``)."""
    import pickle
    import subprocess
    import sys

    from distill.core.config import help_formatter

    formatter = help_formatter()
    assert pickle.loads(pickle.dumps(formatter)) is formatter
    load = "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read()).__name__)"
    done = subprocess.run([sys.executable, "-c", load], input=pickle.dumps(formatter), capture_output=True)
    assert done.returncode == 0 and done.stdout.decode().strip() == "PlainHelpFormatter", done.stderr.decode()
