"""Fixtures that several end-to-end modules share."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def ddp_reference(run_folder: Path, tiny_bert: Path, teacher_dataset: Path) -> tuple[Path, Path]:
    """An uninterrupted 2-rank DDP run of the resumable config (:func:`tests.e2e.test_resume.resumable_config`): its
    config and its folder, that killed and resumed runs on one node or on two are compared with; built once a run
    (:func:`tests.e2e.test_resume.reference_run`)."""
    from tests.e2e.test_resume import reference_run

    return reference_run(run_folder / "ddp-reference", tiny_bert, teacher_dataset, devices=2)
