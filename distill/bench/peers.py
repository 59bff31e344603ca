"""The honest peer: sentence-transformers' own optimised ``CrossEncoder`` backends, timed in the same run as the
student's.

- ``st-onnx``: ``CrossEncoder(folder, backend="onnx")``, ST's ONNX export (optimum) on onnxruntime;
- ``st-onnx-int8``: that export quantised by ST's ``export_dynamic_quantized_onnx_model`` with the configuration of
  this CPU (``avx512_vnni``, ``avx512``, ``avx2`` or ``arm64``: :func:`st_quantization_config`);
- ``st-openvino``: ``CrossEncoder(folder, backend="openvino")``, ST's OpenVINO export (optimum-intel) at OpenVINO's
  defaults (what a user of ST gets: bf16 wherever the CPU has it; the method's dtype says which).

ST's static int8 OpenVINO export (``export_static_quantized_openvino_model``) calibrates on a dataset it downloads,
so it is not timed. ST's exports need ``sentence-transformers[onnx]`` (``optimum-onnx[onnxruntime]``) or
``sentence-transformers[openvino]`` (``optimum-intel[openvino]``); a peer whose package does not import is skipped
with its reason.

optimum exports the architectures ``transformers`` knows: a [CLS]-head student, not the segment-cosine head
(:func:`peer_folder`). ST and optimum read and write a scratch copy of the student's Hugging Face files only, and
load nothing from a hub.
"""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

from distill.bench.methods import Method, crossencoder_method
from distill.core.files import read_json_object
from distill.core.schema import InputError
from distill.serving.hardware import CpuFeatures

ST_BACKENDS = {"st-onnx": "onnx", "st-onnx-int8": "onnx", "st-openvino": "openvino"}
"""Peer name (the names of :data:`~distill.bench.methods.PEERS`) -> ``CrossEncoder``'s ``backend``."""
OPTIMUM = {
    "onnx": ("optimum.onnxruntime", "pip install 'sentence-transformers[onnx]'"),
    "openvino": ("optimum.intel.openvino", "pip install 'sentence-transformers[openvino]'"),
}
"""``CrossEncoder`` backend -> (the optimum module it imports, how to install it)."""
HF_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "*.txt", "tokenizer*", "special_*")
"""The files of a Hugging Face folder the peers read (glob patterns); never the student's own exported graphs."""


def peer_folder(student: Path, peer: str | Path | None) -> Path:
    """The [CLS]-head student the peers run on: ``peer`` (``--peer_student``), else the student itself.

    Raises:
        InputError: the folder's architecture is not one ``transformers`` knows without remote code (optimum
            cannot export it), or it is no model folder.
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    folder = Path(peer) if peer is not None else student
    config = folder / "config.json"
    if not config.is_file():
        raise InputError(f"--peer_student {folder}: no config.json")
    model_type = read_json_object(config).get("model_type")
    if model_type not in CONFIG_MAPPING_NAMES:
        hint = "give --peer_student, a [CLS]-head student" if peer is None else "give a [CLS]-head student"
        raise InputError(
            f"{folder}: the {model_type} head is not one sentence-transformers' optimum export takes: {hint}"
        )
    return folder


def st_quantization_config(features: CpuFeatures, machine: str | None = None) -> str:
    """The configuration of ST's ``export_dynamic_quantized_onnx_model`` for this CPU: ``arm64``, ``avx512_vnni``,
    ``avx512`` or ``avx2``."""
    if (machine or platform.machine()).lower() in ("aarch64", "arm64"):
        return "arm64"
    return "avx512_vnni" if "avx512_vnni" in features.flags else "avx512" if "avx512f" in features.flags else "avx2"


def require_optimum(name: str) -> None:
    """Import the optimum module of the peer ``name``.

    Raises:
        ImportError: in one line, with what to install (or why the installed one fails to import).
    """
    import importlib

    module, install = OPTIMUM[ST_BACKENDS[name]]
    try:
        importlib.import_module(module)
    except ImportError as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ImportError(f"{name} needs {module} ({install}): {detail}") from None


def hf_copy(folder: Path, scratch: Path) -> Path:
    """A copy of the Hugging Face files of ``folder`` (:data:`HF_FILES`) in ``scratch``, where ST and optimum may
    write their exports."""
    scratch.mkdir(parents=True, exist_ok=True)
    for pattern in HF_FILES:
        for path in folder.glob(pattern):
            if path.is_file():
                shutil.copy2(path, scratch / path.name)
    return scratch


def st_peer_method(name: str, folder: Path, device: str, max_length: int | None, threads: int, scratch: Path) -> Method:
    """The peer ``name`` (a key of :data:`ST_BACKENDS`) on the [CLS]-head student ``folder``, exported by ST into
    ``scratch``; ``threads`` intra-op threads of its runtime (0: the runtime's default)."""
    from sentence_transformers import CrossEncoder

    require_optimum(name)
    backend = ST_BACKENDS[name]
    copy = hf_copy(folder, scratch / name)
    kwargs: dict = {"export": True}
    if backend == "onnx" and threads:
        import onnxruntime as ort

        kwargs["session_options"] = ort.SessionOptions()
        kwargs["session_options"].intra_op_num_threads = threads
    if backend == "openvino":
        kwargs["ov_config"] = {"INFERENCE_NUM_THREADS": threads} if threads else {}

    def load(**extra) -> CrossEncoder:
        options = {**kwargs, **extra}
        return CrossEncoder(
            str(copy), device=device, max_length=max_length, backend=backend, model_kwargs=options,
            local_files_only=True,
        )  # fmt: skip

    encoder = load()
    dtype = "float32"
    if name == "st-onnx-int8":
        from sentence_transformers import export_dynamic_quantized_onnx_model

        config = st_quantization_config(CpuFeatures.read())
        export_dynamic_quantized_onnx_model(encoder, config, str(copy), file_suffix=f"int8_{config}")
        encoder, dtype = load(export=False, file_name=f"onnx/model_int8_{config}.onnx"), "int8"
    elif backend == "openvino":
        model = encoder.transformers_model  # optimum-intel's OVModel: ``request`` is its compiled model
        if model.request is None:
            model.compile()
        precision = model.request.get_property("INFERENCE_PRECISION_HINT")
        dtype = {"bf16": "bfloat16", "f16": "float16"}.get(str(precision), "float32")
    return crossencoder_method(name, encoder, folder, dtype)
