"""The load benchmark's serving peer (:mod:`benchmarks.load`): plain ``CrossEncoder.predict`` behind ``distill
serve``'s own HTTP app, one request at a time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from distill.bench.methods import BASELINE, ST_BATCH_SIZE


class CrossEncoderLoop:
    """sentence-transformers' ``CrossEncoder.predict`` on a student's HF folder, as a model ``distill serve``'s app
    serves one request at a time (:class:`~distill.serving.batcher.WholeRequests`): the load benchmark's peer.

    Each request is one ``predict`` call on its (query, document) pairs at batch size :data:`ST_BATCH_SIZE`, fp32 on
    a CPU (fp16 on a GPU), as ``distill bench``'s ``st-crossencoder`` method calls it; ``CrossEncoder`` tokenises,
    truncates and pads the pairs itself. Its scores are raw (the student's config sets ST's activation to identity).
    """

    backend = BASELINE
    backend_reason = "the peer: CrossEncoder.predict, one request at a time"

    def __init__(self, encoder: Any, folder: Path) -> None:
        from distill.serving.encoding import load_tokenizer

        self.encoder = encoder
        self.folder = folder
        # the server's own copy: a fast tokenizer's padding and truncation are state, and the server tokenising a
        # request while predict tokenises another made predict's batch unpadded ("Unable to create tensor")
        self.tokenizer = load_tokenizer(folder)
        self.max_length = int(encoder.max_length)

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu") -> CrossEncoderLoop:
        """``CrossEncoder`` on the HF files of ``folder`` (an export folder, or a student's HF folder)."""
        import torch
        from sentence_transformers import CrossEncoder

        import distill.model.segment_cosine  # noqa: F401  (registers the segment-cosine head)

        dtype = torch.float16 if device.startswith("cuda") else torch.float32
        encoder = CrossEncoder(str(folder), device=device, model_kwargs={"dtype": dtype}, local_files_only=True)
        return cls(encoder, Path(folder))

    @property
    def settings(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "dtype": str(self.encoder.model.dtype).removeprefix("torch."),
            "device": str(self.encoder.device),
            "batch_size": ST_BATCH_SIZE,
            "max_length": self.max_length,
        }

    def predict(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """``[documents]`` float32 raw scores of ``(query, document)``, in the documents' order."""
        pairs = [(query, document) for document in documents]
        scores = self.encoder.predict(pairs, batch_size=ST_BATCH_SIZE, show_progress_bar=False, convert_to_numpy=True)
        return np.asarray(scores, dtype=np.float32)
