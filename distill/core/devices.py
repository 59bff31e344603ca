"""Devices, and every default that depends on the device type, in one place.

torch is imported by the functions that need it, so importing this module stays light.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Literal

from distill.core.schema import InputError

if TYPE_CHECKING:
    import torch

DeviceType = Literal["cpu", "cuda"]

STUDENT_BATCH_TOKENS: dict[DeviceType, int] = {"cpu": 1024, "cuda": 32768}
"""Padded tokens per student (cross-encoder) batch. Small batches keep a CPU's caches warm; a GPU wants large ones:
32768 takes a query's 100 candidates in one batch up to 327 tokens a pair (100 x 256 fits), where a smaller budget
splits them into batches that each pay the launch cost (the docs' CPU latency and GPU results pages time both)."""
TRAIN_PAD_MULTIPLE: dict[DeviceType, int] = {"cpu": 1, "cuda": 64}
"""What the student's training batches are padded to a multiple of. On a GPU, 64 keeps the shapes a step sees
to a few (attention plans, compiled graphs, cuBLAS heuristics are made per shape) and the matmuls aligned; a CPU
pays for every padded token and gains nothing from fewer shapes, so it pads to the longest pair."""
TEACHER_LEVERS: dict[DeviceType, dict[str, int | bool]] = {
    "cpu": {"max_batch_tokens": 8192, "bucket": 1, "packing": False, "compile": False},
    "cuda": {"max_batch_tokens": 16384, "bucket": 64, "packing": True, "compile": True},
}
"""The teacher scorer's batch budget and speed levers by default (:class:`teachers.causal_lm.ScorerOptions`, where
they are not given). A CPU keeps the exact path, whose scores never change; a GPU takes larger batches, buckets
lengths, packs sequences and compiles, which together keep its matrix units busy (the docs' GPU results pages
measure the levers against the plain loop)."""
RERANKER_LEVERS: dict[DeviceType, dict[str, bool]] = {
    "cpu": {"unpad": False, "cuda_graphs": False},
    "cuda": {"unpad": True, "cuda_graphs": True},
}
"""The torch reranker's speed levers by default (:class:`distill.serving.scorers.TorchOptions`' ``unpad`` and
``cuda_graphs``, where they are not given). A CPU keeps the padded path, whose scores never change. On CUDA the
encoder runs on the real tokens only, replayed from CUDA graphs, which remove the cost of launching each call's
kernels from Python (the docs' GPU results pages measure both). unpad applies to BERT encoders only: another model
keeps the padded path by default."""
MATMUL_SIZE: dict[DeviceType, int] = {"cpu": 2048, "cuda": 8192}
"""Side of the square matmul whose rate FLOP floors and ceilings are measured against."""


def device_type(device: str | torch.device) -> DeviceType:
    """``cuda`` for any CUDA device, else ``cpu``."""
    return "cuda" if str(device).startswith("cuda") else "cpu"


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` is the first GPU where there is one, else the CPU; a CUDA device that is not there is an error."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise InputError(f"device {name!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device {name!r}: CUDA is not available here")
    return device


def compute_dtype(device: str | torch.device) -> torch.dtype:
    """The dtype models compute in by default: bf16 on a GPU, fp32 on a CPU."""
    import torch

    return torch.bfloat16 if device_type(device) == "cuda" else torch.float32


def attention_backends(device: str | torch.device, cudnn: bool) -> contextlib.AbstractContextManager:
    """A context in which SDPA on a CUDA ``device`` avoids cuDNN's kernels unless ``cudnn``; elsewhere, nothing.

    cuDNN's SDPA builds a plan on the host for every new (batch, length) shape; stages whose shapes change from
    batch to batch (the teacher, reranking) use the flash, memory-efficient or math kernels instead."""
    if device_type(device) != "cuda" or cudnn:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def job_leader() -> bool:
    """Whether this process is its job's first, by the launcher's environment, before any process group exists:
    every rank that torchrun or accelerate (``RANK``, ``LOCAL_RANK``), SLURM (``SLURM_PROCID``) or Lightning's own
    launcher (``NODE_RANK``, ``LOCAL_RANK`` of the processes it starts) sets is 0, or none is set (a process started
    alone)."""
    return all(os.environ.get(key, "0") == "0" for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))
