"""Paths as the export's records show them, and as they are found again: relative to the working folder, else to
the project's folder (where the shipped data are). No absolute path reaches card.json or the model card."""

from __future__ import annotations

from pathlib import Path

from distill.core.project_files import PROJECT


def resolve_path(path: str) -> Path | None:
    """``path`` from the working folder, else (a relative one) from the project's folder; None if in neither."""
    given = Path(path)
    for candidate in (given,) if given.is_absolute() else (given, PROJECT / given):
        if candidate.exists():
            return candidate
    return None


def shown_path(path: str) -> str:
    """``path`` as a record shows it: a relative one as given, an absolute one inside the project from its folder,
    any other as its last two parts."""
    given = Path(path)
    if not given.is_absolute():
        return path
    if given.is_relative_to(PROJECT):
        return str(given.relative_to(PROJECT))
    return str(Path(given.parent.name) / given.name)
