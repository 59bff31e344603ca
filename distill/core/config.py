"""Stage configs: dataclass defaults, overridden by a YAML file, overridden by command-line flags."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

import yaml

from distill.core.schema import InputError

C = TypeVar("C")


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The mapping in the YAML file at ``path`` (empty for an empty file).

    Raises:
        InputError: the file is missing, cannot be parsed (the message names the line), or is not a mapping.
    """
    path = Path(path)
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise InputError(f"{path}: config file not found") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise InputError(f"{where}: malformed YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(loaded, dict):
        raise InputError(f"{path}: a config must be a mapping of option: value")
    return loaded


def load_config(cls: type[C], path: str | Path | None, overrides: dict[str, Any]) -> C:
    """Build ``cls`` from the YAML mapping at ``path`` (if any), then ``overrides``.

    Raises:
        InputError: the file cannot be parsed, names a key that ``cls`` does not have, or a
            required option is given nowhere.
    """
    values: dict[str, Any] = {}
    if path is not None:
        loaded = read_yaml_mapping(path)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(loaded) - known)
        if unknown:
            raise InputError(f"{path}: unknown option(s) {unknown}; known: {sorted(known)}")
        values.update(loaded)
    values.update(overrides)
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in values
    ]
    if missing:
        raise InputError(f"missing required option(s) {missing}: give them as --flags or in the config file")
    return cls(**values)
