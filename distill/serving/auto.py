"""``backend="auto"``: the fastest backend and precision for this machine that the student's folder, the installed
runtimes and its export's quality gate allow.

The order of preference is data (:data:`PREFERENCES`), one list per kind of CPU (:mod:`distill.serving.hardware`)
and one for GPUs. The first backend of the list that passes every check is chosen:

- its runtime is installed (torch, onnxruntime, or OpenVINO: ``pip install openvino``);
- its file is in the folder (``model.onnx``, ``model.int8.onnx``, the Hugging Face weights, ...);
- a precision other than fp32 passed the export's quality gate: ``card.json``'s ``quality_gate.backends.<name>``
  says ``"passed": true`` (its nDCG@10 within the bound of PyTorch fp32's on held-out validation pairs). A folder
  with no gate (an older export, a plain Hugging Face folder) gets fp32 only. On a GPU, fp16 is the exception: the
  export measures on a CPU, where fp16 does not run, so it is chosen unless the gate records it as failed.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distill.core.devices import device_type
from distill.core.files import read_json_file
from distill.core.run_folder import EXPORT_CARD
from distill.core.schema import InputError, MissingFileError
from distill.serving.backends import (
    FP32_BACKENDS,
    NAMED_BACKENDS,
    Runtime,
    backend_files,
    has_files,
    installed_runtimes,
    runtime,
)
from distill.serving.hardware import CpuFeatures, Tier

log = logging.getLogger(__name__)

PREFERENCES: dict[Tier | str, tuple[str, ...]] = {
    "amx": ("openvino-bf16", "openvino-int8", "onnx-int8", "openvino-fp32", "torch-fp32"),
    "vnni_bf16": ("openvino-int8", "openvino-bf16", "onnx-int8", "onnx-fp32", "openvino-fp32", "torch-fp32"),
    "vnni": ("openvino-int8", "onnx-int8", "openvino-fp32", "torch-fp32"),
    "fp32": ("openvino-fp32", "onnx-fp32", "torch-fp32"),
    "cuda": ("torch-fp16", "torch-fp32"),
}
"""CPU tier (:data:`~distill.serving.hardware.Tier`) or ``cuda`` -> the named backends (keys of
:data:`~distill.serving.backends.NAMED_BACKENDS`), fastest first, as ``distill bench`` ranked them on each tier (the
docs' results page "CPU latency" gives the timings):

- ``amx``: AMX makes bf16 matrix products native, so OpenVINO bf16 leads; int8 is next, as on VNNI.
- ``vnni_bf16``: VNNI makes int8 fastest; AVX-512 BF16 dot products make bf16 the next choice (where the gate
  refuses int8), and onnxruntime fp32 leads fp32.
- ``vnni``: int8 first; without native bf16, OpenVINO computes bf16 slower than fp32, so bf16 is left out.
- ``fp32``: no int8 or bf16 instructions: the fp32 runtimes, OpenVINO's first.
- ``cuda``: PyTorch fp16 on the GPU (the export's ONNX graphs are CPU-tuned).

PyTorch fp32 ends every list: it runs every folder with the Hugging Face weights."""


@dataclass(frozen=True)
class Choice:
    """What ``backend="auto"`` chose, and why."""

    backend: str
    """A key of :data:`~distill.serving.backends.NAMED_BACKENDS` (``openvino-int8``)."""
    reason: str
    """The machine and each faster backend passed over with its reason, in one line."""

    @property
    def load_args(self) -> tuple[str, str | None]:
        """:meth:`Reranker.load`'s ``(backend, dtype)``."""
        return NAMED_BACKENDS[self.backend]


def quality_gate(folder: Path) -> dict[str, dict[str, Any]] | None:
    """The export's quality gate: named backend -> its record (``passed``, ``delta``, ...), from ``card.json``'s
    ``quality_gate.backends``; None where the folder has no card or its card no gate.

    Raises:
        InputError: the card is not JSON, or its gate is not shaped as ``{"backends": {name: {...}}}``.
    """
    path = folder / EXPORT_CARD
    if not path.is_file():
        return None
    card = read_json_file(path)
    gate = card.get("quality_gate") if isinstance(card, dict) else None
    if gate is None:
        return None
    backends = gate.get("backends") if isinstance(gate, dict) else None
    if not isinstance(backends, dict) or not all(isinstance(v, dict) for v in backends.values()):
        raise InputError(f"{path}: quality_gate.backends must map backend names to records")
    return backends


def _gate_refusal(name: str, gate: dict[str, dict[str, Any]] | None, cuda: bool) -> str | None:
    """Why the quality gate keeps ``name`` from being chosen; None if it does not.

    A backend the gate measured outside its bound is refused, whatever its precision. fp32 needs no more (the
    export's parity check holds it to PyTorch fp32's scores), nor does fp16 on a GPU; any other precision needs the
    gate's ``"passed": true``, which a backend the export machine could not run (``not_checked``) does not have."""
    record = (gate or {}).get(name, {})
    if record.get("passed") is False and "not_checked" not in record:
        return f"failed the quality gate ({_figures(record)})"
    if name in FP32_BACKENDS or (cuda and name == "torch-fp16") or record.get("passed") is True:
        return None
    if gate is None:
        return f"no quality gate in {EXPORT_CARD}"
    if "not_checked" in record:
        return f"not checked by the quality gate ({record['not_checked']})"
    return "not in the quality gate"


def _figures(record: dict[str, Any]) -> str:
    parts = [f"{key} {record[key]:+.2f}" if key == "delta" else f"{key} {record[key]}"
             for key in ("delta", "spearman") if isinstance(record.get(key), (int, float))]  # fmt: skip
    return ", ".join(parts) or "passed: false"


def choose_backend(
    folder: str | Path,
    device: str = "cpu",
    features: CpuFeatures | None = None,
    runtimes: Collection[Runtime] | None = None,
    torch_levers: Collection[str] = (),
) -> Choice:
    """The fastest named backend that can serve the student in ``folder`` on ``device``.

    Args:
        folder: an export folder (``distill export``) or a Hugging Face folder.
        device: ``cpu`` or ``cuda[:N]``.
        features: the CPU's features (default: this machine's, :meth:`CpuFeatures.read`).
        runtimes: the installed runtimes (default: those found here, :func:`installed_runtimes`).
        torch_levers: the torch backend's levers asked for (``unpad``, ``tf32``, ...): only torch runs them, so
            the other backends are passed over.

    Raises:
        MissingFileError: no backend of the list can run (no runtime, or no file, for any of them).
    """
    folder = Path(folder)
    cuda = device_type(device) == "cuda"
    features = features or CpuFeatures.read()
    runtimes = installed_runtimes() if runtimes is None else frozenset(runtimes)
    gate = quality_gate(folder)
    machine = "GPU" if cuda else f"{features.tier} CPU ({features.describe()})"
    passed_over = []
    for name in PREFERENCES["cuda" if cuda else features.tier]:
        if torch_levers and runtime(name) != "torch":
            why = f"{', '.join(torch_levers)} run(s) on torch only"
        elif runtime(name) not in runtimes:
            why = f"{runtime(name)} is not installed"
        elif not has_files(folder, name):
            why = f"no {' or '.join(backend_files(name))}"
        else:
            why = _gate_refusal(name, gate, cuda)
        if why is None:
            reason = f"{machine}" + (f"; passed over: {'; '.join(passed_over)}" if passed_over else "")
            return Choice(name, reason)
        passed_over.append(f"{name}: {why}")
    raise MissingFileError(f"{folder}: no backend can serve this student on {machine}: {'; '.join(passed_over)}")
