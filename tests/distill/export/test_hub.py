"""``distill export --push_to_hub``: the finished folder goes to the Hub through huggingface_hub's HfApi, here a local
fake of it (nothing touches the network); failures are one line."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import ClassVar

import huggingface_hub
import pytest
from huggingface_hub.errors import HFValidationError, LocalTokenNotFoundError

from distill.core.schema import UserError
from distill.export.hub import HubUploadError, push_to_hub
from tests.conftest import DL19_QRELS


class FakeHub:
    """Stands for ``huggingface_hub.HfApi``: records the calls and what the folder held when it was uploaded."""

    calls: ClassVar[list[tuple[str, dict]]] = []
    uploaded: ClassVar[dict[str, bytes]] = {}
    error: ClassVar[Exception | None] = None

    def create_repo(self, repo_id: str, **kwargs) -> str:
        FakeHub.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
        if FakeHub.error is not None:
            raise FakeHub.error
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, **kwargs) -> None:
        FakeHub.calls.append(("upload_folder", kwargs))
        folder = Path(kwargs["folder_path"])
        FakeHub.uploaded = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> type[FakeHub]:
    FakeHub.calls, FakeHub.uploaded, FakeHub.error = [], {}, None
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHub)
    return FakeHub


def test_export_pushes_the_finished_folder(
    student: Path, tmp_path: Path, sample_file: Path, fake_hub: type[FakeHub], capsys
) -> None:
    from distill.cli import main

    run = tmp_path / "run"
    shutil.copytree(student, run / "hf")
    validation = ["--validation_input", str(sample_file), "--validation_qrels", str(DL19_QRELS)]
    args = ["export", "--checkpoint", str(run), "--formats", "onnx", *validation]
    assert main([*args, "--push_to_hub", "someone/tiny-reranker", "--private", "true"]) == 0
    assert "uploaded to https://huggingface.co/someone/tiny-reranker" in capsys.readouterr().out
    (create, repo), (upload, files) = fake_hub.calls
    assert create == "create_repo" and repo == {
        "repo_id": "someone/tiny-reranker",
        "private": True,
        "exist_ok": True,
        "repo_type": "model",
    }
    assert upload == "upload_folder" and files["repo_id"] == "someone/tiny-reranker"
    assert Path(files["folder_path"]) == run / "export" and files["repo_type"] == "model"
    export = run / "export"
    assert {"README.md", "card.json", "config.json", "model.onnx", "tokenizer.json"} <= set(fake_hub.uploaded)
    assert fake_hub.uploaded["README.md"] == (export / "README.md").read_bytes()
    assert 'CrossEncoder("someone/tiny-reranker")' in (export / "README.md").read_text()  # the card names the repo


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (LocalTokenNotFoundError("Token is required (`token=True`), but no token found."), "Token is required"),
        (OSError("[Errno -2] Name or service not known"), "[Errno -2] Name or service not known"),
        (HFValidationError("Repo id must be in the form 'repo_name' or 'namespace/repo_name'"), "Repo id must be"),
    ],
)
def test_upload_failures_are_one_line(exported: Path, fake_hub: type[FakeHub], error: Exception, reason: str) -> None:
    fake_hub.error = error
    with pytest.raises(HubUploadError) as caught:
        push_to_hub(exported, "someone/tiny-reranker")
    message = str(caught.value)
    assert message.startswith(f"push_to_hub someone/tiny-reranker: upload of {exported} failed: {reason}")
    assert "\n" not in message and isinstance(caught.value, UserError)
    assert [name for name, _ in fake_hub.calls] == ["create_repo"]  # nothing uploaded
    assert message.endswith(
        f"the export there is complete and kept: upload it again with `hf upload someone/tiny-reranker {exported} .`"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--push_to_hub", "bad id/x/y"], "error: push_to_hub: 'bad id/x/y': Repo id must be in the form"),
        (["--push_to_hub", ""], "error: push_to_hub: '': Repo id must use alphanumeric chars"),
        (["--private", "true"], "error: private: it applies to the repository push_to_hub creates"),
    ],
)
def test_hub_options_are_checked_before_the_export(student: Path, tmp_path: Path, capsys, args, message) -> None:
    from distill.cli import main

    output = tmp_path / "export"
    assert main(["export", "--checkpoint", str(student), "--output", str(output), *args]) == 2
    assert message in capsys.readouterr().err
    assert not output.exists()  # the export never started (it ran whole, then the upload failed)


def test_a_second_export_into_a_folder_being_written_is_refused_at_once(student: Path, tmp_path: Path, capsys) -> None:
    """Two exports into one folder both ran whole, the last one's files left: now the second meets the first's lock."""
    from distill.cli import main
    from distill.core.output_files import hold_output

    output = tmp_path / "export"
    held = hold_output(output)  # as a running export holds it
    assert held is not None
    try:
        assert main(["export", "--checkpoint", str(student), "--output", str(output)]) == 2
    finally:
        held.release()
    assert f"{output}: another distill export is writing it now" in capsys.readouterr().err
    assert not output.exists()
