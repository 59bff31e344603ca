"""``distill export --push_to_hub REPO``: the finished export folder to a Hugging Face Hub model repository."""

from __future__ import annotations

from pathlib import Path

from distill.core.schema import InputError, UserError


class HubUploadError(UserError):
    """The upload failed (no token, no network, a bad repository id, no right to write): one line says why."""


def check_repo_id(repo_id: str) -> None:
    """``repo_id`` is a Hub model repository id (``name`` or ``user/name``).

    Raises:
        InputError: one line naming it and the Hub's rule.
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        rule = str(e).strip().splitlines()[0].split(". Use `repo_type`")[0].rstrip(".")
        raise InputError(f"export: push_to_hub: {repo_id!r}: {rule}") from None


def push_to_hub(folder: Path, repo_id: str, private: bool = False) -> str:
    """Create the model repository ``repo_id`` where it does not exist (``private`` if asked) and upload every
    file of ``folder`` to it in one commit, with the token ``huggingface_hub`` finds (``HF_TOKEN`` or
    ``hf auth login``).

    Returns:
        The repository's URL.

    Raises:
        HubUploadError: the Hub refused or could not be reached; the message names the repository and the reason.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HFValidationError, HTTPError

    api = HfApi()
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(
            repo_id=repo_id, folder_path=folder, repo_type="model", commit_message=f"Upload {folder.name} (cis-distill)"
        )
    except (OSError, HTTPError, HFValidationError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HubUploadError(
            f"push_to_hub {repo_id}: upload of {folder} failed: {reason}; the export there is complete and kept: "
            f"upload it again with `hf upload {repo_id} {folder} .`"
        ) from None
    return str(url)
