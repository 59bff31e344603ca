"""The CPU's instruction-set features that decide which backend and precision serve a student fastest.

Read from the ``flags`` line of ``/proc/cpuinfo`` (Linux; ``Features`` on ARM). Elsewhere, or where the file cannot be
read, no feature is known, and only fp32 backends are chosen (:mod:`distill.serving.auto`).

``CIS_DISTILL_CPU_PROFILE`` (:data:`PROFILE_ENV`) names one of :data:`PROFILES` to decide as that class of CPU would,
whatever this machine is: the test suite checks every class's choices on one machine with it. Only the decisions
change (which backend ``auto`` picks, what the export's quality gate can check); the runtimes still run on this
CPU, and a bf16 graph on a CPU without bf16 is computed in fp32.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from distill.core.schema import InputError

CPUINFO = Path("/proc/cpuinfo")
FEATURES = ("amx_bf16", "amx_int8", "amx_tile", "avx512_vnni", "avx512_bf16", "avx_vnni", "avx512f", "avx2")
"""The flags (Linux's names) that the choices read (the backend here, sentence-transformers' int8 configuration in
``distill bench``); :attr:`CpuFeatures.flags` keeps only these."""

Tier = Literal["amx", "vnni_bf16", "vnni", "fp32"]
"""What the CPU does fastest: bf16 and int8 matmuls in AMX tiles; int8 and native bf16 dot products (AVX-512 VNNI
and AVX-512 BF16 on an AMD CPU: Zen 4 and later); int8 dot products (AVX-512 VNNI or AVX-VNNI); or fp32 only
(AVX2, AVX-512 without VNNI, ARM, unknown). An Intel CPU with AVX-512 BF16 but no AMX is ``vnni``: OpenVINO's bf16
ran slower than its fp32 there (:data:`distill.serving.auto.PREFERENCES`; the docs' CPU latency results page
gives the timings)."""
AMD = "AuthenticAMD"
INTEL = "GenuineIntel"
PROFILE_ENV = "CIS_DISTILL_CPU_PROFILE"


@dataclass(frozen=True)
class CpuFeatures:
    """The :data:`FEATURES` a CPU has."""

    flags: frozenset[str]
    vendor: str = ""
    """``vendor_id`` of ``/proc/cpuinfo`` (``GenuineIntel``, ``AuthenticAMD``); empty where unknown."""
    profile: str = ""
    """The name in :data:`PROFILES` these features were taken from (``CIS_DISTILL_CPU_PROFILE``); empty when they
    are this machine's."""

    @classmethod
    def parse(cls, cpuinfo: str) -> CpuFeatures:
        """The features of the first ``flags`` (or ARM ``Features``) line of ``cpuinfo`` text, and its ``vendor_id``,
        or of a bare space-separated flag list (``"avx2 avx512_vnni"``, no vendor)."""
        lines = [line for line in cpuinfo.splitlines() if ":" in line]
        if not lines:  # a bare flag list
            return cls(frozenset(cpuinfo.split()) & frozenset(FEATURES))
        fields = {}
        for line in lines:
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        words = fields.get("flags", fields.get("Features", "")).split()
        return cls(frozenset(words) & frozenset(FEATURES), fields.get("vendor_id", ""))

    @classmethod
    def read(cls, path: str | Path | None = None) -> CpuFeatures:
        """The features of the CPU that decisions are made for: the profile named by ``CIS_DISTILL_CPU_PROFILE``
        where it is set, else this machine's (``path``: a ``/proc/cpuinfo``-format file, default :data:`CPUINFO`);
        none where the file cannot be read.

        Raises:
            InputError: ``CIS_DISTILL_CPU_PROFILE`` names no profile.
        """
        if path is None:
            name = os.environ.get(PROFILE_ENV, "").strip()
            if name:
                return profile(name)
            path = CPUINFO
        try:
            return cls.parse(Path(path).read_text())
        except OSError:
            return cls(frozenset())

    @property
    def amx(self) -> bool:
        """AMX tiles with bf16 and int8 matmuls (Intel Sapphire Rapids and later)."""
        return {"amx_tile", "amx_bf16", "amx_int8"} <= self.flags

    @property
    def vnni(self) -> bool:
        """int8 dot-product instructions: AVX-512 VNNI or AVX-VNNI."""
        return bool({"avx512_vnni", "avx_vnni"} & self.flags)

    @property
    def tier(self) -> Tier:
        """The fastest arithmetic of this CPU (see :data:`Tier`)."""
        if self.amx:
            return "amx"
        if self.vnni:
            return "vnni_bf16" if self.vendor == AMD and "avx512_bf16" in self.flags else "vnni"
        return "fp32"

    def describe(self) -> str:
        """The vendor and features in one phrase, e.g. ``"AuthenticAMD avx2 avx512_bf16 avx512_vnni avx512f"``,
        preceded by ``profile NAME:`` when they come from :data:`PROFILES`."""
        features = " ".join([*([self.vendor] if self.vendor else []), *sorted(self.flags)]) or "none of " + "/".join(
            FEATURES
        )
        return f"profile {self.profile}: {features}" if self.profile else features


_AVX512 = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni")
PROFILES: dict[str, CpuFeatures] = {
    "avx2": CpuFeatures(frozenset({"avx2"}), AMD, "avx2"),
    "avx512-vnni": CpuFeatures(frozenset(_AVX512), INTEL, "avx512-vnni"),
    "avx512-vnni-bf16": CpuFeatures(frozenset(_AVX512), AMD, "avx512-vnni-bf16"),
    "amx": CpuFeatures(frozenset({*_AVX512, "amx_tile", "amx_bf16", "amx_int8"}), INTEL, "amx"),
}
"""One CPU of each :data:`Tier`, by the name ``CIS_DISTILL_CPU_PROFILE`` takes: AVX2 only (AMD Zen 2/3), AVX-512
VNNI and BF16 on an Intel CPU without AMX (Ice Lake, Cooper Lake), the same on an AMD CPU (Zen 4), and AMX
(Sapphire Rapids)."""


def profile(name: str) -> CpuFeatures:
    """The features of the profile ``name`` (a key of :data:`PROFILES`).

    Raises:
        InputError: ``name`` is no profile.
    """
    if name not in PROFILES:
        raise InputError(f"{PROFILE_ENV}={name!r} names no CPU profile: use one of {', '.join(PROFILES)}")
    return PROFILES[name]


NVIDIA_DRIVER = ("/dev/nvidiactl", "/proc/driver/nvidia/version")
"""Files the NVIDIA driver makes: without them no CUDA device can be there, and torch need not be imported to ask."""


def serving_device(name: str) -> str:
    """The device a reranker runs on: ``auto`` is ``cuda`` where torch is installed and sees a GPU, else ``cpu``
    (asked without importing torch where there is no NVIDIA driver, so that an ONNX server never loads it); any
    other name (``cpu``, ``cuda:1``) as given, a GPU once torch is seen to have it.

    Raises:
        InputError: a name other than ``auto``, ``cpu``, ``cuda`` or ``cuda:N``; a ``cuda`` device that torch does
            not have (no torch, a CPU-only build, no such GPU).
    """
    if re.fullmatch(r"auto|cpu|cuda(:\d+)?", name) is None:
        raise InputError(f"device {name!r}: expected auto, cpu, cuda or cuda:N")
    if name.startswith("cuda"):
        if importlib.util.find_spec("torch") is None:
            raise InputError(f"device {name}: needs torch with CUDA, which is not installed (use device cpu)")
        import torch

        suffix = name.partition(":")[2]
        index = int(suffix) if suffix.isdigit() else 0
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise InputError(f"device {name}: torch sees {seen} GPU(s) here ({torch.__version__}); use device cpu")
    if name != "auto":
        return name
    if importlib.util.find_spec("torch") is None or not any(Path(p).exists() for p in NVIDIA_DRIVER):
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
