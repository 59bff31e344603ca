"""The backends a student runs on: :meth:`~distill.serving.reranker.Reranker.load`'s ``backend`` and ``dtype``, the
named pairs of them (``openvino-int8``, ...) that ``backend="auto"`` chooses from and ``distill bench`` times, and the
file and runtime each one needs."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

from distill.serving.scorers import FORMAT_FILES, WEIGHT_FILES

BACKENDS = ("torch", "onnx", "torchscript", "openvino")
"""The runtimes of :meth:`Reranker.load` (besides ``auto``, which picks one of :data:`NAMED_BACKENDS`)."""
ONNX_DTYPES = {None: "onnx", "float32": "onnx", "float16": "onnx-fp16", "int8": "onnx-int8"}
"""The ONNX backends' ``dtype`` -> the exported format they run (``onnx``: onnxruntime, ``openvino``: OpenVINO)."""
OPENVINO_DTYPES = {**ONNX_DTYPES, "bfloat16": "onnx"}
"""OpenVINO also runs ``model.onnx`` in bf16 (on CPUs that have it)."""

NAMED_BACKENDS: dict[str, tuple[str, str | None]] = {
    "torch-fp32": ("torch", "float32"),
    "torch-fp16": ("torch", "float16"),
    "torch-bf16": ("torch", "bfloat16"),
    "torchscript": ("torchscript", None),
    "onnx-fp32": ("onnx", None),
    "onnx-fp16": ("onnx", "float16"),
    "onnx-int8": ("onnx", "int8"),
    "openvino-fp32": ("openvino", None),
    "openvino-bf16": ("openvino", "bfloat16"),
    "openvino-int8": ("openvino", "int8"),
}
"""Backend name -> (:meth:`Reranker.load` backend, dtype)."""
FP32_BACKENDS = ("torch-fp32", "torchscript", "onnx-fp32", "openvino-fp32")
"""The named backends that compute in fp32: the export checks each exported file against PyTorch fp32 to
max |Δscore| ≤ 1e-4, so they need no ranking-quality gate."""

Runtime = Literal["torch", "onnxruntime", "openvino"]


SHORT_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
"""How the backends' names spell a dtype."""


def backend_name(backend: str, dtype: str | None) -> str:
    """The name of :meth:`Reranker.load`'s ``(backend, dtype)`` (``("onnx", "int8")`` -> ``onnx-int8``);
    ``backend-dtype`` for a pair with no name, its dtype spelt as the named ones spell it (``openvino-fp16``)."""
    key = (backend, dtype or "float32") if backend == "torch" else (backend, None if dtype == "float32" else dtype)
    unnamed = f"{backend}-{SHORT_DTYPES.get(dtype or 'float32', dtype)}"
    return next((name for name, pair in NAMED_BACKENDS.items() if pair == key), unnamed)


def backend_files(name: str) -> tuple[str, ...]:
    """The files of a student folder that the named backend reads (any one of them, for the torch weights)."""
    backend, dtype = NAMED_BACKENDS[name]
    if backend == "torch":
        return WEIGHT_FILES
    if backend == "torchscript":
        return (FORMAT_FILES["torchscript"],)
    return (FORMAT_FILES[OPENVINO_DTYPES[dtype]],)


def runtime(name: str) -> Runtime:
    """The library that runs the named backend."""
    backend = NAMED_BACKENDS[name][0]
    return "onnxruntime" if backend == "onnx" else "openvino" if backend == "openvino" else "torch"


def installed_runtimes() -> frozenset[Runtime]:
    """The runtimes installed here (found on the path; none is imported)."""
    return frozenset(r for r in ("torch", "onnxruntime", "openvino") if importlib.util.find_spec(r) is not None)


def has_files(folder: Path, name: str) -> bool:
    """Whether ``folder`` holds a file the named backend reads."""
    return any((folder / file).is_file() for file in backend_files(name))
