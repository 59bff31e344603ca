"""Every committed config still parses: a renamed or retyped option fails here, not in a user's first run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO

CONFIGS = REPO / "configs"


def names(folder: Path) -> list[str]:
    return [str(path.relative_to(REPO)) for path in sorted(folder.glob("*.yaml"))]


@pytest.fixture(autouse=True)
def in_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the configs name their files from the checkout's root


@pytest.mark.parametrize("path", names(CONFIGS / "teach"))
def test_every_teach_config_parses(path: str) -> None:
    from distill.core.config import parse_config
    from distill.stages.teach import TeachConfig

    cfg = parse_config(TeachConfig, ["--config", path], "distill teach")
    assert cfg.input and cfg.output


@pytest.mark.parametrize("path", names(CONFIGS / "train"))
def test_every_train_config_parses(path: str) -> None:
    from distill.stages.train import check_train_args

    check_train_args(["--config", path], path)


@pytest.mark.parametrize("path", names(CONFIGS))
def test_every_pipeline_config_loads_and_checks_its_inputs(path: str, tmp_path: Path, monkeypatch) -> None:
    """Each pipeline but the paper's runs offline; the paper's, for users with a model hub, is refused offline before
    its first stage, as bert-large-uncased's weights are not in the (empty) hub cache."""
    import huggingface_hub

    from distill.model.resolver import ModelNotFoundError
    from distill.pipeline import check_inputs, load_pipeline

    pipeline = load_pipeline(path)
    if Path(path).name != "paper.yaml":
        check_inputs(pipeline)
        return
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match=r"^train: model\.backbone: cannot find model 'bert-large-uncased'"):
        check_inputs(pipeline)
