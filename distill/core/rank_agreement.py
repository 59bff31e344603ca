"""Whether every process of a ``torch.distributed`` job was launched alike: each node of a multi-node job is started
by its own command line, and two that differ (an option, a config file, an environment variable that a default
reads) would split one job's work between two settings, or hang it at a collective that one side never reaches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from distill.core.schema import InputError


def flat_settings(settings: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``settings`` with nested mappings flattened to dotted keys (``trainer.devices``) and each value as its
    ``repr``: comparable across processes whatever its type."""
    flat: dict[str, str] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_settings(value, f"{name}."))
        else:
            flat[name] = repr(value)
    return flat


def first_difference(everyone: list[dict[str, str]]) -> tuple[str, int, str, str] | None:
    """The first key (in sorted order) in which a process's flat settings differ from process 0's, with that
    process's rank and both values (``<unset>`` where one lacks the key); None where all agree."""
    for rank, theirs in enumerate(everyone[1:], 1):
        ours = everyone[0]
        for key in sorted(set(ours) | set(theirs)):
            if ours.get(key) != theirs.get(key):
                return key, rank, ours.get(key, "<unset>"), theirs.get(key, "<unset>")
    return None


def check_ranks_agree(settings: Mapping[str, Any], prog: str) -> None:
    """Every process of the initialised ``torch.distributed`` group was given the same ``settings`` (nothing to do
    in a single process). Every process takes part and every one raises alike, so that none waits on the others.

    Raises:
        InputError: ``<key>: process 0 has <value>, process <rank> has <value>: ...``.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, flat_settings(settings))
    difference = first_difference(everyone)
    if difference is not None:
        key, rank, ours, theirs = difference
        raise InputError(
            f"{key}: process 0 has {ours}, process {rank} has {theirs}: the processes of one {prog} job need the "
            "same options (launch every node with the same command line, config files and environment)"
        )
