"""``distill migrate``: bring teacher datasets written by older versions to the current format."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class MigrateConfig:
    """Options of ``distill migrate``: move old teacher datasets' metadata into ``teacher.json``."""

    paths: list[str] = field(default_factory=list)
    """Teacher dataset folders (``distill teach`` outputs): ``distill migrate FOLDER...`` or ``--paths``."""


@dataclass(frozen=True)
class MigrateReport:
    changed: list[Path]
    current: list[Path]

    def format(self) -> str:
        lines = [f"migrated {path}" for path in self.changed]
        lines += [f"already current: {path}" for path in self.current]
        return "\n".join(lines) or "nothing to migrate"


def migrate(cfg: MigrateConfig) -> MigrateReport:
    """Migrate each folder of ``cfg.paths``; the rows (and so every score) are left bit-identical."""
    from distill.core.schema import InputError
    from distill.data.teacher_data import migrate as migrate_folder

    if not cfg.paths:
        raise InputError("migrate: give the teacher dataset folders to migrate: distill migrate FOLDER...")
    from distill.core.path_checks import input_path

    for path in cfg.paths:  # every folder first: none is migrated if one is wrong
        input_path(path, "migrate", "paths", "folder")
    changed, current = [], []
    for path in map(Path, cfg.paths):
        (changed if migrate_folder(path) else current).append(path)
    return MigrateReport(changed, current)
