"""Counts in the summaries that commands print: ``1 query``, ``2 queries``."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, in the plural (``plural``, default ``noun`` + ``s``) unless ``n`` is 1:
    ``counted(1, "query", "queries")`` is ``1 query``, ``counted(0, "pair")`` is ``0 pairs``."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
