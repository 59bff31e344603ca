"""Each option declared and defaulted once: Reranker.load, distill rerank, distill serve and distill bench's students
read one ServingOptions; distill teach and the teacher benchmark one ScorerOptions (and the teach config one
InputOptions); a config that could extend an options class does."""

from __future__ import annotations

import ast
import inspect
from dataclasses import fields
from pathlib import Path

import pytest

from distill.bench.latency import BenchConfig
from distill.core.config import parse_config
from distill.core.schema import InputError
from distill.serving.options import HttpOptions, RuntimeOptions, ServingOptions
from distill.serving.reranker import Reranker
from distill.serving.scorers import TorchOptions
from distill.serving.server import ServeConfig
from distill.stages.rerank import RerankConfig
from distill.stages.teach import TeachConfig
from distill.stages.teach_input import InputOptions
from teachers.causal_lm import ScorerOptions

SHARED = [f.name for f in fields(ServingOptions)]
OPTIONS = (RuntimeOptions, ServingOptions, HttpOptions, TorchOptions, ScorerOptions, InputOptions)
"""The options classes whose fields the commands' and benchmarks' configs share."""


def own_fields(cls: type) -> set[str]:
    """The fields a class declares itself (not those it inherits)."""
    return {
        node.target.id
        for node in ast.walk(ast.parse(inspect.getsource(cls)))
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }


def configs() -> list[type]:
    """Every command's config dataclass (``distill.cli.COMMANDS``) and every benchmark's options
    (``benchmarks.phases.BenchOptions``' subclasses)."""
    import dataclasses
    import importlib
    import pkgutil

    import benchmarks
    from benchmarks.phases import BenchOptions
    from distill.cli import COMMANDS

    found = []
    for command in COMMANDS.values():
        if command.config is not None:
            found.append(getattr(importlib.import_module(command.module), command.config))
    for module in pkgutil.iter_modules(benchmarks.__path__):
        for value in vars(importlib.import_module(f"benchmarks.{module.name}")).values():
            if isinstance(value, type) and issubclass(value, BenchOptions) and value.__module__.startswith("bench"):
                found.append(value)
    return list(dict.fromkeys(c for c in found if dataclasses.is_dataclass(c)))


def test_the_configs_found_include_the_teachers_and_the_benchmarks() -> None:
    from benchmarks.teacher_throughput import TeacherThroughput

    assert {TeachConfig, RerankConfig, ServeConfig, BenchConfig, TeacherThroughput} <= set(configs())


@pytest.mark.parametrize("config", [RerankConfig, ServeConfig, BenchConfig])
def test_the_commands_configs_extend_the_options_and_declare_none_of_their_fields_again(config: type) -> None:
    assert issubclass(ServingOptions, TorchOptions) and issubclass(ServingOptions, RuntimeOptions)
    assert issubclass(config, RuntimeOptions)
    own = own_fields(config)
    for options in OPTIONS:
        if issubclass(config, options):
            again = own & {f.name for f in fields(options)}
            assert own and not again, f"{config.__name__} declares {options.__name__}'s {sorted(again)} again"


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: o.__name__)
def test_a_config_with_every_field_of_an_options_class_extends_it(options: type) -> None:
    """A config that declares every field of an options class could extend it, and must: else each is declared,
    documented and defaulted twice."""
    names = {f.name for f in fields(options)}
    for config in configs():
        if names <= own_fields(config) | {f.name for f in fields(config)} and not issubclass(config, options):
            pytest.fail(f"{config.__name__} declares every field of {options.__name__}: extend it instead")


def test_the_teachers_configs_extend_the_scorers_options_and_declare_none_of_their_fields_again() -> None:
    from benchmarks.teacher_throughput import TeacherThroughput

    for config, extends in ((TeachConfig, (ScorerOptions, InputOptions)), (TeacherThroughput, (ScorerOptions,))):
        own = own_fields(config)
        for options in extends:
            assert issubclass(config, options), f"{config.__name__} does not extend {options.__name__}"
            again = own & {f.name for f in fields(options)}
            assert own and not again, f"{config.__name__} declares {options.__name__}'s {sorted(again)} again"


def test_the_flags_fill_the_shared_options_and_load_takes_them(tmp_path: Path) -> None:
    argv = [
        "--model",
        "m",
        "--input",
        "i.json",
        "--output",
        "o.trec",
        "--backend",
        "torch",
        "--unpad",
        "--overlap",
        "8",
    ]
    config = parse_config(RerankConfig, argv, "distill rerank")
    serving = config.serving()
    assert type(serving) is ServingOptions
    assert (serving.backend, serving.unpad, serving.overlap, serving.device) == ("torch", True, 8, "auto")
    assert serving.levers == TorchOptions(unpad=True)


def test_load_names_an_unknown_option_and_a_bad_one(tiny_bert: Path) -> None:
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['unpadded'\]"):
        Reranker.load(tiny_bert, backend="torch", unpadded=True)
    with pytest.raises(InputError, match="backend 'auto' chooses the dtype itself"):
        Reranker.load(tiny_bert, dtype="float16")
    with pytest.raises(InputError, match="rerank: overlap is a number of pairs"):
        RerankConfig(model="m", input=["i"], output="o", overlap=-1)
    ServeConfig(model="m", interpolation=True)  # requests that send first-stage scores are fused
    with pytest.raises(InputError, match="serve: first_stage 'bm25' takes its alpha from the student's card"):
        ServeConfig(model="m", first_stage="bm25", interpolation=0.5)
    for bad in (0, -5):
        with pytest.raises(InputError, match=f"max_length must be positive .*, got {bad}$"):
            Reranker.load(tiny_bert, backend="torch", max_length=bad)
    with pytest.raises(
        InputError, match=r"max_length 4 leaves no room for a query token and a passage token .*: at least 5"
    ):
        Reranker.load(tiny_bert, backend="torch", max_length=4)  # BERT's pair: [CLS] q [SEP] p [SEP]
    assert Reranker.load(tiny_bert, backend="torch", max_length=5).max_length == 5


def test_options_and_changes_combine(tiny_bert: Path) -> None:
    base = ServingOptions(backend="torch", max_length=32)
    reranker = Reranker.load(tiny_bert, base, max_batch_tokens=64)
    assert (reranker.max_length, reranker.max_batch_tokens, reranker.backend) == (32, 64, "torch-fp32")


def test_the_device_defaults_to_auto_which_asks_torch_only_where_a_gpu_can_be(tmp_path, monkeypatch) -> None:
    import subprocess
    import sys

    import torch

    from distill.serving import hardware
    from distill.serving.options import ServingOptions

    assert ServingOptions().device == "auto"
    assert hardware.serving_device("cpu") == "cpu"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= 2:
        assert hardware.serving_device("cuda:1") == "cuda:1"
    else:  # a GPU torch does not have is one line, not torch's assertion once the model loads
        with pytest.raises(InputError, match=rf"^device cuda:1: torch sees {gpus} GPU\(s\) here .*; use device cpu$"):
            hardware.serving_device("cuda:1")
    for name in ("tpu", "meta", "cuda:x", "CPU"):  # one line, before torch is asked or a model is loaded
        with pytest.raises(InputError, match=rf"^device '{name}': expected auto, cpu, cuda or cuda:N$"):
            hardware.serving_device(name)
    monkeypatch.setattr(hardware, "NVIDIA_DRIVER", (str(tmp_path / "absent"),))
    assert hardware.serving_device("auto") == "cpu"
    script = (
        "import sys\nfrom distill.serving import hardware\n"
        f"hardware.NVIDIA_DRIVER = ({str(tmp_path / 'absent')!r},)\n"
        "print(hardware.serving_device('auto'), 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["cpu", "False"]  # no driver: torch is never imported to ask
    (tmp_path / "driver").write_text("")
    monkeypatch.setattr(hardware, "NVIDIA_DRIVER", (str(tmp_path / "driver"),))
    assert hardware.serving_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
