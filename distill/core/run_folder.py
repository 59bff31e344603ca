"""Where a training run keeps its artefacts, in one place.

A run is the folder ``<checkpoint_root>/<run_name>/`` that ``distill train`` writes::

    checkpoints/  best.ckpt (by the validation metric) and last.ckpt
    hf/           the best student as a plain Hugging Face folder (``config.cis_distill`` is its card)
    logs/         metrics.csv and the resolved config
    wandb/        the wandb run (offline by default)
    export/       ONNX and TorchScript files with card.json (``distill export``)
    bench/        bench.json, bench.csv, bench.png (``distill bench``)
    eval/         reranked runs and eval.json (``distill run``)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from distill.core.schema import InputError, MissingFileError

MODEL_CONFIG = "config.json"
EXPORT_CARD = "card.json"
"""The export's card in ``export/`` (``distill export``)."""
CHECKPOINT_ROOT = "checkpoints"
"""Where runs go unless told otherwise, from the working folder."""


@dataclass(frozen=True)
class RunLayout:
    """The folders of the run at ``root``."""

    root: Path
    prefix: str = ""
    """Before each folder's name: a model folder outside a run (``models/a``) has its exports and benchmarks beside
    it under its own name (``models/a-export``), so that two such folders in one place keep theirs apart."""

    @property
    def checkpoints(self) -> Path:
        return self.root / f"{self.prefix}checkpoints"

    @property
    def hf(self) -> Path:
        return self.root / f"{self.prefix}hf"

    @property
    def logs(self) -> Path:
        return self.root / f"{self.prefix}logs"

    @property
    def export(self) -> Path:
        return self.root / f"{self.prefix}export"

    @property
    def bench(self) -> Path:
        return self.root / f"{self.prefix}bench"

    @property
    def eval(self) -> Path:
        return self.root / f"{self.prefix}eval"

    @classmethod
    def of(cls, path: str | Path) -> RunLayout:
        """The run a path belongs to: the run folder itself, or a model folder inside it (``hf/``, ``export/``).

        A model folder that is not in a run (an HF folder anywhere, ``models/a``) has its exports and benchmarks
        beside it, named by it (``models/a-export``, ``models/a-bench``). A hub model's snapshot
        (``.../models--org--name/snapshots/<revision>``) is the run ``checkpoints/org--name``: the hub cache is the
        hub's, and a cache clean-up would take what went there.
        """
        path = Path(path)
        if path.name in ("", ".."):  # "." or "..": the folder above is the named one's, not "." again
            path = Path(os.path.abspath(path))
        if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
            return cls(Path(CHECKPOINT_ROOT) / path.parent.parent.name.removeprefix("models--"))
        if path.name in ("hf", "export"):
            return cls(path.parent)
        if (path / MODEL_CONFIG).is_file():
            return cls(path.parent, f"{path.name}-")
        return cls(path)

    @property
    def last_checkpoint(self) -> Path | None:
        """``checkpoints/last.ckpt``, the run's newest state, where training saved one."""
        last = self.checkpoints / "last.ckpt"
        return last if last.exists() else None

    def no_student(self) -> str:
        """Why the run has no student: ``hf/`` is written from the best validation's checkpoint when a training
        ends, so a training stopped before its end (preempted, killed) has none yet, and one stopped before its first
        validation has no best checkpoint either (the message names the state to go on from, and how)."""
        if (self.checkpoints / "best.ckpt").is_file():
            return (
                f"{self.root}: no student in hf/ yet: it is written from {self.checkpoints / 'best.ckpt'} (the best "
                "validation so far) when the training ends, and this one stopped before: resume it with distill train "
                "--ckpt_path last and let it end"
            )
        if self.last_checkpoint is None:
            return f"{self.root}: no student here (no hf/{MODEL_CONFIG} or export/{MODEL_CONFIG})"
        return (
            f"{self.root}: no student here: no validation ran, so there is no best student for hf/ (written from the "
            f"best validation's checkpoint when a training ends), and distill export takes none; the newest state is "
            f"{self.last_checkpoint}: resume it with distill train --ckpt_path last and let a validation run "
            "(trainer.val_check_interval)"
        )

    def student(self, *, exported: bool = True) -> Path:
        """The student's model folder: ``export/`` (if ``exported`` and it is there), else ``hf/``.

        Raises:
            MissingFileError: neither is there (:meth:`no_student` says why).
            InputError: ``export/`` was exported from other weights than its source (``hf/``) holds now: training
                went on after the export (:meth:`check_export_current`).
        """
        for folder in (self.export, self.hf) if exported else (self.hf,):
            if (folder / MODEL_CONFIG).is_file():
                if folder == self.export:
                    self.check_export_current()
                return folder
        raise MissingFileError(self.no_student())

    def check_export_current(self) -> None:
        """``export/`` holds the student its source folder (``hf/``) holds now: its ``card.json`` records the
        checksum of the weights it was exported from (an export made before the card had it is taken as current).

        Raises:
            InputError: the source's weights are other ones now, naming both folders and the command to export again.
        """
        from distill.core.checksums import weights_checksum

        card = self.export / EXPORT_CARD
        try:
            values = json.loads(card.read_text())
        except (OSError, ValueError):
            return
        recorded = values.get("source_weights") if isinstance(values, dict) else None
        source = self.export / str(values.get("source") or "../hf") if recorded else None
        if source is None or not source.is_dir() or weights_checksum(source) in (None, recorded):
            return
        raise InputError(
            f"{self.export}: exported from an earlier student than {source.resolve()} holds now (the training went on "
            f"after the export): export it again (distill export --checkpoint {self.root}), or name {self.export} or "
            "the hf/ folder to load one of them"
        )


def student_folder(path: str | Path, *, exported: bool = True, revision: str | None = None) -> Path:
    """The model folder that ``path`` names: ``path`` itself if it holds ``config.json``, else the student of the
    run at ``path`` (its ``export/`` if ``exported`` and present, else its ``hf/``); where no such path exists, a hub
    id (``org/name``, at ``revision``) resolved into the Hugging Face cache
    (:func:`~distill.model.resolver.hub_snapshot`).

    Raises:
        MissingFileError: no model folder there (nor a hub model of that id).
        InputError: a ``revision`` for a local path, which has none.
    """
    from distill.model.resolver import HUB_REPO, hub_snapshot

    if not str(path).strip():  # Path("") is the working folder
        raise InputError("model: the name is empty: give a run, a model folder or a hub id (org/name)")
    if revision is not None and not revision.strip():
        raise InputError("revision: empty: give a branch, tag or commit, or leave it out for main")
    path = Path(path)
    if not path.exists():
        if HUB_REPO.match(str(path)):
            return hub_snapshot(str(path), revision)
        raise MissingFileError(f"{path}: no such run or model folder, nor a hub id (org/name)")
    if revision is not None:
        raise InputError(f"revision {revision}: a hub id's (org/name); {path} is a local folder, which has none")
    if (path / MODEL_CONFIG).is_file():
        return path
    return RunLayout(path).student(exported=exported)
