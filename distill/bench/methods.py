"""The methods the latency benchmark times, each as ``score(query, passages) -> scores``, end to end
(tokenisation included), with the matmul FLOPs of a call (what its FLOP floor is counted on):

- the student on each backend (:class:`distill.serving.reranker.Reranker`): ``torch-fp32``, ``torch-fp16``,
  ``torch-bf16``, ``torchscript``, ``onnx-fp32``, ``onnx-fp16``, ``onnx-int8`` (onnxruntime), ``openvino-fp32``,
  ``openvino-bf16`` (``model.onnx`` in bf16 where the CPU has it) and ``openvino-int8`` (the same ONNX files on
  OpenVINO, an optional extra), and ``auto`` (the backend ``Reranker.load`` chooses for this machine, named in
  the method: ``student auto (openvino-int8)``); each with the reranker's levers as suffixes, named by their
  options' fields (:func:`variant`): ``torch-fp16+overlap=50``, ``torch-fp32+tf32``, ``torch-fp16+compile``,
  ``torch-fp32+unpad``, ``torch-fp16+unpad=false``, ``torch-fp16+cuda_graphs=false``, ...;
- the teacher: CIS with the teacher stage's scorer (:class:`teachers.teacher.CausalLMTeacher`), both terms
  computed per call (log p(K|Q) and log p(K); no p(K) cache);
- the peer baseline: sentence-transformers' ``CrossEncoder.predict`` on the same student folder
  (fp16 on a GPU, fp32 on a CPU; batch size 100), and its optimised backends (:mod:`distill.bench.peers`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distill.bench.workload import Call
from distill.core.devices import device_type
from distill.core.files import read_json_object
from distill.core.schema import InputError
from distill.serving.backends import NAMED_BACKENDS
from distill.serving.encoding import encode_pairs
from distill.serving.options import ServingOptions
from distill.serving.reranker import Reranker
from distill.serving.scorers import TorchOptions
from teachers.teacher import CausalLMTeacher

STUDENT_BACKENDS = NAMED_BACKENDS
"""Student backend name -> (:meth:`Reranker.load` backend, dtype)."""
AUTO = "auto"
"""The student on the backend ``Reranker.load(backend="auto")`` chooses (:mod:`distill.serving.auto`)."""
BASELINE = "st-crossencoder"
ST_BATCH_SIZE = 100
PEERS = ("st-onnx", "st-onnx-int8", "st-openvino")
"""sentence-transformers' optimised backends (:mod:`distill.bench.peers`), on a [CLS]-head student."""
DEFAULT_BACKENDS = {
    "cpu": (
        "torch-fp32",
        "torchscript",
        "onnx-fp32",
        "onnx-int8",
        "openvino-fp32",
        "openvino-bf16",
        "openvino-int8",
        AUTO,
        BASELINE,
        *PEERS,
    ),
    "cuda": ("torch-fp32", "torch-fp16", "torch-bf16", "torchscript", "onnx-fp16", BASELINE),
}
"""What runs by default on each device type (those whose files are there, OpenVINO where it is installed, the
peers where their optimum package is)."""
FLOAT, INT8, BF16 = "float", "int8", "bfloat16"
"""The arithmetic of matmul FLOPs: the device's float compute dtype (fp32 on a CPU), int8, or a CPU's bf16 (the
faster of its bf16 and fp32 rates: a bf16 backend computes in fp32 where the CPU has no bf16 instructions)."""
OVERLAP = "overlap"
"""The lever every backend takes: :meth:`Reranker.load`'s ``overlap``, written ``+overlap=N``."""
TRUE, FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
"""The spellings of a boolean lever's value (``+unpad=false``); ``+unpad`` alone is true."""


@dataclass(frozen=True)
class Variant:
    """A student method: a backend and the reranker's levers."""

    backend: str
    """A key of :data:`STUDENT_BACKENDS`, or :data:`AUTO`."""
    overlap: int = 0
    """:meth:`Reranker.load`'s ``overlap``: pairs per span tokenised ahead (0: off)."""
    options: TorchOptions | None = None
    """The torch backend's levers; None for none."""
    suffix: str = ""
    """The levers as written after the backend (``+overlap=50+tf32``)."""


def variant(name: str, device: str = "cpu") -> Variant:
    """The backend and levers of a student method's name: ``<backend>[+<option>[=<value>]...]``, each lever named
    by its option's own field: ``overlap=N`` (:meth:`Reranker.load`'s: tokenise ``N`` pairs ahead, any backend), and
    the torch backends' :class:`~distill.serving.scorers.TorchOptions` (``tf32``, ``compile``, ``cudnn_attention``,
    ``unpad``, ``cuda_graphs``), true when named alone (``+unpad``) or set to ``true`` or ``false``
    (``+unpad=false``, ``+cuda_graphs=false``).

    Raises:
        InputError: an unknown backend or lever, a lever without a value it needs, or a lever the backend or the
            device does not take.
    """
    backend, *levers = name.split("+")
    if backend not in (*STUDENT_BACKENDS, AUTO):
        raise InputError(f"{name}: levers (+...) go after a student backend, one of {[*STUDENT_BACKENDS, AUTO]}")
    torch_levers = [f.name for f in fields(TorchOptions)]
    overlap, flags = 0, {}
    for lever in levers:
        key, given, value = lever.partition("=")
        if key == OVERLAP:
            if not (value.isdigit() and int(value) > 0):
                raise InputError(f"{name}: {OVERLAP} takes a number of pairs, +{OVERLAP}=N with N >= 1")
            overlap = int(value)
        elif key in torch_levers:
            if given and value.lower() not in (*TRUE, *FALSE):
                raise InputError(f"{name}: {key} is true or false, got {value!r}")
            flags[key] = not given or value.lower() in TRUE
        else:
            raise InputError(f"{name}: unknown lever {key!r}; levers: {OVERLAP}=N, {', '.join(torch_levers)}")
    if flags and STUDENT_BACKENDS.get(backend, ("",))[0] != "torch":
        raise InputError(f"{name}: {', '.join(torch_levers)} are levers of the torch backends")
    if flags.get("tf32") and (STUDENT_BACKENDS[backend][1] != "float32" or device_type(device) != "cuda"):
        raise InputError(f"{name}: tf32 computes CUDA's fp32 matmuls in TF32; give it torch-fp32 on a GPU")
    suffix = "".join(f"+{lever}" for lever in levers)
    return Variant(backend, overlap, TorchOptions(**flags) if flags else None, suffix)


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
    """Tokens the model reads for a call (padding excluded)."""
    matmul_flops: Callable[[Call], dict[str, float]]
    """Arithmetic (:data:`FLOAT`, :data:`INT8`) -> the FLOPs of a call's matmuls, padding excluded: what its FLOP
    floor is counted on."""
    settings: dict[str, Any] = field(default_factory=dict)
    """How it scores (a student: :attr:`Reranker.settings <distill.serving.reranker.Reranker.settings>`)."""


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


@dataclass(frozen=True)
class EncoderFlops:
    """The matmul FLOPs a BERT-style cross-encoder's score needs. The [CLS] head (``cls_tail``): every layer at every
    position, but the last layer beyond its keys and values only at the ``[CLS]`` position the score reads (see
    :mod:`distill.export.cls_tail`), then the pooler and the classifier once per pair. The segment-cosine head
    (:mod:`distill.model.segment_cosine`) reads every position of the last layer, and its first ``segment_layers``
    layers need attention within each segment only (the query's, with its start and separator tokens, and the
    passage's)."""

    layers: int
    hidden: int
    intermediate: int
    head_weights: int
    """Entries of the 2-D weights applied once per pair (names with ``pooler`` or ``classifier``)."""
    cls_tail: bool = True
    """The score reads the last layer at ``[CLS]`` only (False: at every position)."""
    segment_layers: int = 0
    """The first layers whose attention stays within each segment."""

    @classmethod
    def of(cls, folder: Path) -> EncoderFlops:
        """The shapes of the HF folder ``folder`` (``config.json`` and safetensors weights).

        Raises:
            InputError: ``config.json`` lacks a shape of a BERT-like encoder, naming it.
        """
        from safetensors import safe_open

        from distill.model.segment_cosine import MODEL_TYPE, MPNET_MODEL_TYPE

        head = 0
        for file in sorted(folder.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as weights:
                for name in weights.keys():  # noqa: SIM118  (safe_open has no __iter__)
                    shape = weights.get_slice(name).get_shape()
                    if len(shape) == 2 and ("pooler" in name or "classifier" in name):
                        head += int(np.prod(shape))
        config = read_json_object(folder / "config.json")
        if missing := [key for key in ("num_hidden_layers", "hidden_size", "intermediate_size") if key not in config]:
            raise InputError(
                f"{folder / 'config.json'}: no {', '.join(missing)}: bench counts a BERT-like encoder's FLOPs"
            )
        segment_head = config.get("model_type") in (MODEL_TYPE, MPNET_MODEL_TYPE)
        return cls(
            config["num_hidden_layers"],
            config["hidden_size"],
            config["intermediate_size"],
            head,
            cls_tail=not segment_head,
            segment_layers=config.get("segment_layers", 0) if segment_head else 0,
        )

    def __call__(self, lengths: Sequence[int], query_lengths: Sequence[int] | None = None) -> tuple[float, float]:
        """(FLOPs of the weight matmuls, FLOPs of attention's QK^T and AV) for pairs of ``lengths`` tokens, of
        which the first ``query_lengths`` are the query's segment (None: every layer counted across the pair)."""
        hidden, layer = self.hidden, 4 * self.hidden**2 + 2 * self.hidden * self.intermediate
        if self.cls_tail:
            per_token = (self.layers - 1) * layer + 2 * hidden**2  # the last layer's keys and values
            per_pair = layer - 2 * hidden**2 + self.head_weights  # its query, output and feed-forward at [CLS]
            across, tail = self.layers - 1, sum(lengths)  # [CLS] attends to every key of the last layer
        else:
            per_token, per_pair = self.layers * layer, self.head_weights
            across, tail = self.layers, 0
        weights = 2 * (per_token * sum(lengths) + per_pair * len(lengths))
        apart = min(self.segment_layers, across) if query_lengths is not None else 0
        squares = sum(n * n for n in lengths)
        apart_squares = 0
        if apart:
            apart_squares = sum(q * q + (n - q) ** 2 for n, q in zip(lengths, query_lengths, strict=True))
        attention = 4 * hidden * ((across - apart) * squares + apart * apart_squares + tail)
        return float(weights), float(attention)


def query_segments(tokenizer: Any, query: str, lengths: list[int]) -> list[int]:
    """The tokens of each pair's query segment (the query with its start and separator tokens), for pairs of
    ``lengths`` tokens."""
    query_tokens = len(tokenizer(query)["input_ids"])
    return [min(query_tokens, n) for n in lengths]


def student_method(
    folder: Path,
    backend: str,
    device: str,
    max_length: int | None,
    max_batch_tokens: int | None,
    threads: int = 0,
) -> Method:
    """The student in ``folder`` on ``backend`` (a key of :data:`STUDENT_BACKENDS`, or :data:`AUTO`: the method is
    named after the backend it chose), with the levers of its suffix (:func:`variant`); ``threads`` for the ONNX
    runtimes (0: one per physical core)."""
    chosen = variant(backend, device)
    kind, dtype = STUDENT_BACKENDS.get(chosen.backend, (AUTO, None))
    levers = asdict(chosen.options) if chosen.options is not None else {}
    serving = ServingOptions(
        backend=kind, device=device, dtype=dtype, max_length=max_length, max_batch_tokens=max_batch_tokens,
        interpolation=False, threads=threads, overlap=chosen.overlap, **levers,
    )  # fmt: skip
    reranker = Reranker.load(folder, serving)
    name = f"{AUTO} ({reranker.backend}){chosen.suffix}" if chosen.backend == AUTO else backend
    dtype = STUDENT_BACKENDS[reranker.backend][1]
    counts = EncoderFlops.of(folder)

    def lengths(call: Call) -> list[int]:
        queries = [call.query] * len(call.passages)
        return encode_pairs(reranker.tokenizer, queries, call.passages, reranker.max_length).lengths

    def matmul_flops(call: Call) -> dict[str, float]:
        pairs = lengths(call)
        weights, attention = counts(pairs, query_segments(reranker.tokenizer, call.query, pairs))
        if dtype == "int8":  # int8 weights; the activation-by-activation matmuls stay fp32
            return {INT8: weights, FLOAT: attention}
        if dtype == "bfloat16" and device == "cpu":  # at the CPU's bf16 rate, where it has one
            return {BF16: weights + attention}
        return {FLOAT: weights + attention}

    n_params = count_parameters(folder)
    return Method(
        f"student {name}",
        "student",
        dtype or "float32",
        n_params,
        reranker.score,
        _sum(lengths),
        matmul_flops,
        reranker.settings,
    )


def _sum(lengths: Callable[[Call], list[int]]) -> Callable[[Call], int]:
    return lambda call: sum(lengths(call))


def baseline_method(folder: Path, device: str, max_length: int | None, name: str = BASELINE) -> Method:
    """sentence-transformers' ``CrossEncoder`` on ``folder``: fp16 on a GPU, fp32 on a CPU, batch size 100."""
    from sentence_transformers import CrossEncoder

    import distill.model.segment_cosine  # noqa: F401  (registers the segment-cosine head)

    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    encoder = CrossEncoder(str(folder), device=device, max_length=max_length, model_kwargs={"dtype": dtype})
    return crossencoder_method(name, encoder, folder, str(dtype).removeprefix("torch."))


def crossencoder_method(name: str, encoder: Any, folder: Path, dtype: str) -> Method:
    """A sentence-transformers ``CrossEncoder`` (any backend) of the HF folder ``folder`` as a baseline method:
    ``predict`` at batch size 100. ``dtype`` ``int8`` counts its weight matmuls at the int8 rate."""
    tokenizer = encoder.tokenizer
    limit = encoder.max_seq_length

    def score(query: str, passages: list[str]) -> Sequence[float]:
        pairs = [(query, p) for p in passages]
        return encoder.predict(pairs, batch_size=ST_BATCH_SIZE, show_progress_bar=False).tolist()

    def lengths(call: Call) -> list[int]:
        encoded = tokenizer([call.query] * len(call.passages), call.passages, truncation=True, max_length=limit)
        return list(map(len, encoded["input_ids"]))

    def matmul_flops(call: Call) -> dict[str, float]:
        pairs = lengths(call)
        weights, attention = counts(pairs, query_segments(tokenizer, call.query, pairs))
        return {INT8: weights, FLOAT: attention} if dtype == "int8" else {FLOAT: weights + attention}

    counts = EncoderFlops.of(folder)
    settings = {"dtype": dtype, "batch_size": ST_BATCH_SIZE, "max_length": limit}
    return Method(name, "baseline", dtype, count_parameters(folder), score, _sum(lengths), matmul_flops, settings)


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

    def matmul_flops(call: Call) -> dict[str, float]:  # every parameter once per token (embeddings included)
        return {FLOAT: 2.0 * n_params * tokens_fed(call)}

    dtype = str(teacher.dtype).removeprefix("torch.")
    return Method("teacher cis", "teacher", dtype, n_params, score, tokens_fed, matmul_flops)
