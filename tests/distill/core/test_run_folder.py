"""Where a model folder's run is: the default place of its exports and benchmarks."""

from __future__ import annotations

from pathlib import Path

import pytest

from distill.core.run_folder import CHECKPOINT_ROOT, RunLayout, student_folder
from distill.core.schema import InputError


def test_a_model_folder_s_run_is_the_folder_above_it_however_it_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--checkpoint .`` put the export inside the model folder (refused as inside an input) and ``..`` likewise.
    Two model folders side by side shared one ``bench/`` (and ``export/``): the second's replaced the first's."""
    model, other = tmp_path / "student", tmp_path / "other"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    other.mkdir()
    (other / "config.json").write_text("{}")
    assert RunLayout.of(model).export == tmp_path / "student-export"
    assert RunLayout.of(other).bench == tmp_path / "other-bench" != RunLayout.of(model).bench
    monkeypatch.chdir(model)
    assert RunLayout.of(".").export == tmp_path / "student-export"
    monkeypatch.chdir(model / "sub")
    assert RunLayout.of("..").bench == tmp_path / "student-bench"
    assert RunLayout.of(tmp_path / "run").export == tmp_path / "run" / "export"  # a run folder: its own
    (tmp_path / "run" / "hf").mkdir(parents=True)
    (tmp_path / "run" / "hf" / "config.json").write_text("{}")
    assert RunLayout.of(tmp_path / "run" / "hf").bench == tmp_path / "run" / "bench"  # a run's student: the run's


def test_a_hub_snapshot_s_run_is_a_checkpoint_folder_not_the_hub_cache(tmp_path: Path) -> None:
    """An export of ``--checkpoint org/name`` went into the hub cache, as a revision named export."""
    snapshot = tmp_path / "hub" / "models--acme--reranker" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert RunLayout.of(snapshot).root == Path(CHECKPOINT_ROOT) / "acme--reranker"


def test_a_revision_for_a_local_folder_is_refused(tmp_path: Path) -> None:
    """A local folder has no revisions: ``Reranker.load(folder, revision="v1")`` scored the folder as it is."""
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InputError, match=f"revision v1: a hub id's \\(org/name\\); {tmp_path} is a local folder"):
        student_folder(tmp_path, revision="v1")
    assert student_folder(tmp_path) == tmp_path


def test_a_runs_export_older_than_its_hf_folder_is_refused_not_served(
    exported: Path, student: Path, tmp_path: Path
) -> None:
    """A training resumed after the export wrote a better student to hf/, and a run's name still loaded the old
    export/ (every backend, torch too) without a word."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from distill.core.checksums import weights_checksum

    run = tmp_path / "run"
    shutil.copytree(student, run / "hf")
    shutil.copytree(exported, run / "export")
    card = json.loads((run / "export" / "card.json").read_text())
    assert card["source_weights"] == weights_checksum(student) == weights_checksum(run / "hf") is not None
    card["source"] = "../hf"  # as an export of this run's hf/ records it
    (run / "export" / "card.json").write_text(json.dumps(card))
    assert student_folder(run) == run / "export"
    weights = load_file(run / "hf" / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + 1.0  # the training went on: a new best student
    save_file(weights, run / "hf" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InputError, match=r"export: exported from an earlier student than .*hf holds now"):
        student_folder(run)
    assert student_folder(run / "export") == run / "export"  # named, either folder loads
    assert student_folder(run, exported=False) == run / "hf"
    del card["source_weights"]  # an export made before the card recorded it: taken as current
    (run / "export" / "card.json").write_text(json.dumps(card))
    assert student_folder(run) == run / "export"


def test_a_run_stopped_after_a_validation_says_its_best_state_waits_for_the_end(tmp_path: Path) -> None:
    """hf/ is written from best.ckpt when a training ends: a run preempted after validations said none had run."""
    from distill.core.schema import MissingFileError

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"state")
    with pytest.raises(MissingFileError, match="no validation ran"):
        student_folder(tmp_path)
    (tmp_path / "checkpoints" / "best.ckpt").write_bytes(b"best")
    with pytest.raises(MissingFileError) as err:
        student_folder(tmp_path)
    assert str(err.value) == (
        f"{tmp_path}: no student in hf/ yet: it is written from {tmp_path / 'checkpoints' / 'best.ckpt'} (the best "
        "validation so far) when the training ends, and this one stopped before: resume it with distill train "
        "--ckpt_path last and let it end"
    )
