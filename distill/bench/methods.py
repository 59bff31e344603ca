"""The methods the latency benchmark times, each as ``score(query, passages) -> scores``, end to end
(tokenisation included):

- the student on each backend (:class:`distill.serving.reranker.Reranker`): ``torch-fp32``, ``torch-fp16``,
  ``torch-bf16``, ``torchscript``, ``onnx-fp32``, ``onnx-fp16``, ``onnx-int8``;
- the teacher: CIS with the teacher stage's scorer (:class:`teachers.teacher.CausalLMTeacher`), both terms
  computed per call (log p(K|Q) and log p(K); no p(K) cache);
- the peer baseline: sentence-transformers' ``CrossEncoder.predict`` on the same student folder
  (fp16 on a GPU, fp32 on a CPU; batch size 100).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from distill.bench.workload import Call
from distill.serving.encoding import encode_pairs
from distill.serving.reranker import Reranker
from teachers.teacher import CausalLMTeacher

STUDENT_BACKENDS: dict[str, tuple[str, str | None]] = {
    "torch-fp32": ("torch", "float32"),
    "torch-fp16": ("torch", "float16"),
    "torch-bf16": ("torch", "bfloat16"),
    "torchscript": ("torchscript", None),
    "onnx-fp32": ("onnx", None),
    "onnx-fp16": ("onnx", "float16"),
    "onnx-int8": ("onnx", "int8"),
}
"""Student backend name -> (:meth:`Reranker.load` backend, dtype)."""
BASELINE = "st-crossencoder"
ST_BATCH_SIZE = 100
DEFAULT_BACKENDS = {
    "cpu": ("torch-fp32", "torchscript", "onnx-fp32", "onnx-int8", BASELINE),
    "cuda": ("torch-fp32", "torch-fp16", "torch-bf16", "torchscript", "onnx-fp16", BASELINE),
}
"""What runs by default on each device type (those whose files are there)."""


@dataclass
class Method:
    """A scorer under test."""

    name: str
    role: str
    """``student``, ``teacher`` or ``baseline``."""
    dtype: str
    n_params: int
    """Every parameter, embeddings and heads included (tied weights once)."""
    score: Callable[[str, list[str]], Sequence[float]]
    """``(query, passages) -> one score per passage``."""
    tokens_fed: Callable[[Call], int]
    """Tokens the model reads for a call (padding excluded): what its FLOP floor is counted on."""


def count_parameters(folder: Path) -> int:
    """Parameters of the safetensors weights in an HF folder, without loading them."""
    from safetensors import safe_open

    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as weights:
            for name in weights.keys():  # noqa: SIM118  (safe_open has no __iter__)
                total += int(np.prod(weights.get_slice(name).get_shape()))
    if total == 0:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights")
    return total


def student_method(
    folder: Path, backend: str, device: str, max_length: int | None, max_batch_tokens: int | None
) -> Method:
    """The student in ``folder`` on ``backend`` (a key of :data:`STUDENT_BACKENDS`)."""
    kind, dtype = STUDENT_BACKENDS[backend]
    reranker = Reranker.load(folder, kind, device, dtype, max_length, max_batch_tokens, interpolation=False)

    def tokens_fed(call: Call) -> int:
        queries = [call.query] * len(call.passages)
        return sum(encode_pairs(reranker.tokenizer, queries, call.passages, reranker.max_length).lengths)

    return Method(
        f"student {backend}", "student", dtype or "float32", count_parameters(folder), reranker.score, tokens_fed
    )


def baseline_method(folder: Path, device: str, max_length: int | None) -> Method:
    """sentence-transformers' ``CrossEncoder`` on ``folder``: fp16 on a GPU, fp32 on a CPU, batch size 100."""
    from sentence_transformers import CrossEncoder

    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    encoder = CrossEncoder(str(folder), device=device, max_length=max_length, model_kwargs={"dtype": dtype})
    tokenizer = encoder.tokenizer
    limit = encoder.max_seq_length

    def score(query: str, passages: list[str]) -> Sequence[float]:
        pairs = [(query, p) for p in passages]
        return encoder.predict(pairs, batch_size=ST_BATCH_SIZE, show_progress_bar=False).tolist()

    def tokens_fed(call: Call) -> int:
        encoded = tokenizer([call.query] * len(call.passages), call.passages, truncation=True, max_length=limit)
        return sum(map(len, encoded["input_ids"]))

    return Method(BASELINE, "baseline", str(dtype).removeprefix("torch."), count_parameters(folder), score, tokens_fed)


def teacher_method(teacher: CausalLMTeacher) -> Method:
    """CIS = log p(K | Q) - log p(K) with the teacher stage's scorer, both terms computed per call."""
    model = teacher.scorer.model
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())

    def score(query: str, passages: list[str]) -> Sequence[float]:
        ids = teacher.encode_passages(passages)
        cond = teacher.pair_terms([query] * len(passages), ids, ["logp_cond"])["logp_cond"]
        return (cond - teacher.passage_logprobs(ids)).tolist()

    def tokens_fed(call: Call) -> int:
        ids = teacher.encode_passages(call.passages)
        cond = teacher.pair_sequences("logp_cond", [call.query] * len(ids), ids)
        return sum(map(len, cond)) + sum(map(len, teacher.passage_sequences(ids)))

    return Method("teacher cis", "teacher", str(teacher.dtype).removeprefix("torch."), n_params, score, tokens_fed)
