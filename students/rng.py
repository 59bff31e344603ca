"""RNG states of this process and of every rank, saved in checkpoints so that a resumed run draws the
random numbers (dropout masks) an uninterrupted one would."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from pytorch_lightning import Trainer


def rng_state() -> dict[str, Any]:
    """This process's RNG states: python, numpy, torch (CPU) and, once CUDA is initialised, the current
    device's; in types that ``torch.load(weights_only=True)`` reads."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (name, keys.tolist(), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def gather_rng_states(trainer: Trainer) -> list[dict[str, Any]]:
    """Every rank's :func:`rng_state`, by rank (a collective: call it on every rank)."""
    if trainer.world_size == 1:
        return [rng_state()]
    states: list[Any] = [None] * trainer.world_size
    torch.distributed.all_gather_object(states, rng_state())
    return states
