"""The rerank stage: a student scores each query's candidates, and the new order is written as a TREC run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from distill.core.loaders._common import OnBadInput
from distill.core.runs import Run
from distill.core.schema import Candidates, InputError, RerankingData
from distill.serving.scorers import TorchOptions

if TYPE_CHECKING:
    from distill.serving.reranker import Reranker


@dataclass
class RerankConfig:
    """Options of ``distill rerank``: rerank candidates with a student and write a TREC run."""

    model: str | None = None
    """The student (required): an HF folder (torch backend), an export folder, or a training run."""
    input: list[str] = field(default_factory=list)
    """The candidates (required): TREC runs (with ``queries`` and ``corpus``), rank_llm JSON, ...; several are
    joined."""
    queries: str | None = None
    """For a TREC run input: the queries (TSV or JSONL)."""
    corpus: str | None = None
    """For a TREC run input: the passages (TSV or JSONL)."""
    output: str | None = None
    """The TREC run to write (required; ``distill run`` sets it)."""
    backend: Literal["auto", "torch", "onnx", "torchscript", "openvino"] = "auto"
    """``auto``: the fastest backend and precision for this CPU (AMX: OpenVINO bf16 or int8; AVX-512 VNNI: int8;
    else fused fp32) or GPU (fp16) among the student's files, the installed runtimes and the precisions its export's
    quality gate passed; the report names it. ``openvino`` runs the ONNX files on OpenVINO (CPU;
    ``pip install 'cis-distill[openvino]'``)."""
    device: str = "cpu"
    """``cpu`` or ``cuda[:N]``."""
    dtype: str | None = None
    """With a named backend: torch: float32, float16 or bfloat16; onnx: float32, float16 or int8; openvino: those and
    bfloat16. ``auto`` chooses it."""
    max_length: int | None = None
    """The longest pair in tokens (default: the model's)."""
    max_batch_tokens: int | None = None
    """Padded tokens per batch (default 1024 on a CPU, 32768 on a GPU: a query's 100 candidates in one batch)."""
    overlap: int = 0
    """Tokenise in spans of this many pairs, the next span on a background thread while the current one is scored
    (0: all of a query's pairs first); any backend."""
    tf32: bool = TorchOptions.tf32
    """torch backend, fp32 on CUDA: matmuls in TF32 (changes the scores slightly)."""
    compile: bool = TorchOptions.compile
    """torch backend: ``torch.compile`` the model; the first queries wait while it compiles."""
    cudnn_attention: bool = TorchOptions.cudnn_attention
    """torch backend on CUDA: let attention use cuDNN's kernels, which plan every new batch shape on the host."""
    unpad: bool | None = TorchOptions.unpad
    """torch backend, BERT encoders: run the encoder on the real tokens only, attention within each pair. Default
    the device's (on for CUDA, off for a CPU)."""
    cuda_graphs: bool | None = TorchOptions.cuda_graphs
    """torch backend on CUDA, with ``unpad``: replay each batch from a CUDA graph captured once per bucketed shape.
    Default the device's (on for CUDA)."""
    max_queries: int | None = None
    """Rerank only the first N queries (N >= 1)."""
    on_bad_input: OnBadInput = "error"
    """``error``: stop at the first bad record of the input, naming it; ``skip``: skip bad records and count them."""
    held_out: str | None = None
    """A student (training run or model folder): rerank only the queries it was validated on."""
    interpolation: bool | float | None = None
    """Fuse with the first stage, α · z(student) + (1 − α) · z(first stage): ``null`` as the student's card says,
    ``true`` the card's α (chosen on validation), ``false`` never, a number that α."""

    def __post_init__(self) -> None:
        missing = [name for name in ("model", "input", "output") if not getattr(self, name)]
        if missing:
            raise InputError(f"rerank: missing required option(s): {', '.join(missing)}")
        if isinstance(self.input, str):  # Python callers may name one input
            self.input = [self.input]
        if self.max_queries is not None and self.max_queries < 1:
            raise InputError(f"rerank: max_queries must be positive, got {self.max_queries}")

    @property
    def torch_options(self) -> TorchOptions | None:
        """The torch backend's levers, or None where every one is at its default (any backend then loads)."""
        options = TorchOptions(self.tf32, self.compile, self.cudnn_attention, self.unpad, self.cuda_graphs)
        return None if options == TorchOptions() else options


@dataclass(frozen=True)
class RerankReport:
    output: Path
    queries: int
    pairs: int
    truncated: int
    skipped: int = 0
    """Bad input records skipped (``on_bad_input: skip``)."""
    """Pairs longer than the student's max length, cut."""
    alpha: float | None = None
    """The interpolation with the first stage, if any."""
    backend: str | None = None
    """The named backend that scored (``openvino-int8``, ...), and why where ``auto`` chose it."""
    backend_reason: str = ""

    def format(self) -> str:
        fused = "" if self.alpha is None else f", interpolated with the first stage (alpha {self.alpha:g})"
        line = f"wrote {self.output}: {self.queries} queries, {self.pairs} pairs, {self.truncated} truncated{fused}"
        if self.skipped:
            line += f", {self.skipped} bad input record(s) skipped"
        if self.backend:
            line += f"\nbackend {self.backend}" + (f" (auto: {self.backend_reason})" if self.backend_reason else "")
        return line


def rerank_run(reranker: Reranker, candidates: list[Candidates]) -> Run:
    """The student's run: qid -> docid -> score for every candidate of every query."""
    run: Run = {}
    for c in candidates:
        scores = reranker.score(c.query.text, [p.text for p in c.passages], c.scores)
        run[c.query.qid] = {p.docid: float(s) for p, s in zip(c.passages, scores, strict=True)}
    return run


def rerank(cfg: RerankConfig) -> RerankReport:
    """Rerank ``cfg.input`` with the student ``cfg.model`` and write ``cfg.output``."""
    from distill.core.loaders import load_candidates
    from distill.core.run_folder import student_folder
    from distill.core.runs import write_trec_run
    from distill.serving.reranker import Reranker
    from distill.stages.evaluate import held_out_queries

    check_paths(cfg)
    data = RerankingData.union(
        [load_candidates(p, queries=cfg.queries, corpus=cfg.corpus, on_bad_input=cfg.on_bad_input) for p in cfg.input]
    )
    candidates = data.candidates[: cfg.max_queries]
    if cfg.held_out:
        keep = held_out_queries(cfg.held_out)
        candidates = [c for c in candidates if c.query.qid in keep]
    folder = student_folder(cfg.model, exported=cfg.backend != "torch")
    reranker = Reranker.load(
        folder,
        cfg.backend,
        cfg.device,
        cfg.dtype,
        cfg.max_length,
        cfg.max_batch_tokens,
        cfg.interpolation,
        overlap=cfg.overlap,
        options=cfg.torch_options,
    )
    run = rerank_run(reranker, candidates)
    interp = f"-interp{reranker.alpha:g}" if reranker.alpha is not None else ""
    write_trec_run(cfg.output, run, tag=f"{Path(cfg.model).name}-{reranker.backend}{interp}")
    pairs = sum(map(len, run.values()))
    return RerankReport(
        Path(cfg.output),
        len(run),
        pairs,
        reranker.truncated,
        sum(data.skipped.values()),
        reranker.alpha,
        reranker.backend,
        reranker.backend_reason,
    )


def check_paths(cfg: RerankConfig) -> None:
    """Every path of ``cfg`` before any work: the inputs are there, the output can be written and is no input.

    Raises:
        InputError: ``rerank: <option>: <path>: <what is wrong>``.
    """
    from distill.core.loaders.irds import is_irds
    from distill.core.paths import input_path, output_file

    inputs = [("input", path) for path in cfg.input if not is_irds(path)]
    inputs += [(key, getattr(cfg, key)) for key in ("queries", "corpus") if getattr(cfg, key)]
    for key, path in inputs:
        input_path(path, "rerank", key, "any" if key == "input" else "file")
    input_path(cfg.model, "rerank", "model")
    output_file(cfg.output, "rerank", "output", [*inputs, ("model", cfg.model)])
