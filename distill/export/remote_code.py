"""Hugging Face remote code for the heads ``transformers`` does not know, so an export folder loads without
cis-distill.

A head of the project's own (the segment-cosine head, :mod:`distill.model.segment_cosine`) is written into the
folder as ``modeling_<name>.py``, a copy of the very module the project loads it with (it imports only torch and
transformers), and ``config.json`` gets an ``auto_map`` naming its classes. Then
``AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)`` and sentence-transformers'
``CrossEncoder(folder, trust_remote_code=True)`` load it in any Python. Inside cis-distill the registered local
classes are used and no remote code runs. Heads ``transformers`` has (the [CLS] head: plain BERT) get nothing.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from distill.core.files import read_json_object
from distill.core.run_folder import MODEL_CONFIG


@dataclass(frozen=True)
class RemoteCode:
    """The modeling code of one ``model_type``."""

    module: str
    """The project module that holds the classes (importing only torch and transformers)."""
    file: str
    """Its file name in the export folder."""
    config_class: str
    model_class: str


REMOTE_CODE = {
    "bert-segment-cosine": RemoteCode(
        "distill.model.segment_cosine", "modeling_segment_cosine.py", "BertSegmentCosineConfig", "BertForSegmentCosine"
    ),
    "mpnet-segment-cosine": RemoteCode(
        "distill.model.segment_cosine",
        "modeling_segment_cosine.py",
        "MPNetSegmentCosineConfig",
        "MPNetForSegmentCosine",
    ),
}
"""``model_type`` -> its remote code."""


def write_remote_code(folder: Path) -> str | None:
    """Write the modeling file of ``folder``'s ``model_type`` (if it has one) and ``auto_map`` into its config.

    Returns:
        The file written, or None for a model type ``transformers`` loads by itself (no ``auto_map`` either).
    """
    import importlib

    config_path = folder / MODEL_CONFIG
    config = read_json_object(config_path)
    code = REMOTE_CODE.get(config.get("model_type"))
    if code is None:
        return None
    source = importlib.import_module(code.module).__file__
    shutil.copyfile(source, folder / code.file)
    stem = Path(code.file).stem
    config["auto_map"] = {
        "AutoConfig": f"{stem}.{code.config_class}",
        "AutoModelForSequenceClassification": f"{stem}.{code.model_class}",
    }
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return code.file
