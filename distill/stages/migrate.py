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
    from distill.core.path_checks import input_path, output_folder
    from distill.core.schema import InputError
    from distill.data.teacher_data import migration

    if not cfg.paths:
        raise InputError("migrate: give the teacher dataset folders to migrate: distill migrate FOLDER...")
    for path in cfg.paths:
        input_path(path, "migrate", "paths", "folder")
    folders: dict[Path, Path] = {}  # each folder once, under the first name it is given
    for path in cfg.paths:
        folders.setdefault(Path(path).resolve(), Path(path))
    plans = [(path, migration(path)) for path in folders.values()]  # all checked: none is written if one is bad
    changed = [path for path, write in plans if write is not None]
    for path in changed:  # and each can be written in
        output_folder(path, "migrate", "paths")
    writes = [write for _, write in plans if write is not None]
    for i, (path, write) in enumerate(zip(changed, writes, strict=True)):
        try:
            write()
        except OSError as e:
            migrated = f" (migrated before it: {', '.join(map(str, changed[:i]))})" if i else ""
            raise InputError(f"migrate: {path}: cannot write: {e.strerror or e}{migrated}") from None
    return MigrateReport([path for path, write in plans if write], [path for path, write in plans if not write])
