"""Scorers: a student folder's PyTorch weights, ONNX graphs or TorchScript file, as one callable each.

A scorer maps a padded :data:`~distill.serving.encoding.Batch` to the ``[batch]`` float32 scores. One that runs on
a device the host does not wait for (the torch scorer on CUDA) also starts a batch without waiting for it
(``launch``: a :class:`Launched`), so that its caller prepares the next batch while the device computes this one.
torch and onnxruntime are imported by the scorer that needs them, not by this module.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from distill.core.devices import RERANKER_LEVERS, attention_backends, device_type
from distill.core.files import read_json_object
from distill.core.run_folder import EXPORT_CARD
from distill.core.schema import InputError, MissingFileError
from distill.serving.encoding import INPUT_NAMES, Batch, Packed

FORMAT_FILES = {
    "onnx": "model.onnx",
    "onnx-fp16": "model.fp16.onnx",
    "onnx-int8": "model.int8.onnx",
    "torchscript": "model.torchscript.pt",
}
"""The exported formats and their files in an export folder."""
FORMAT_COPIES = {"onnx/model.onnx": "onnx"}
"""Files of an export folder that repeat a format's file (a hard link, or a copy where the file system has none), where
other runtimes look for it: sentence-transformers' ONNX backend (``CrossEncoder(folder, backend="onnx")``, through
optimum, as Infinity's ``optimum`` engine) and text-embeddings-inference's ONNX backend read ``onnx/model.onnx``."""

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
"""A Hugging Face folder's weights: one file, or the index of its shards."""

TORCH_DTYPES = ("float32", "float16", "bfloat16")


class Scorer(Protocol):
    input_names: tuple[str, ...]
    """The batch arrays the scorer reads."""

    def __call__(self, batch: Batch) -> np.ndarray:
        """float32 scores ``[batch]`` of int64 arrays ``[batch, sequence]``."""
        ...


class Launched:
    """A batch a scorer has started: :meth:`result` waits for its scores; :meth:`ready` says, without waiting,
    whether they are there.

    Args:
        wait: blocks until the device is done; ``([rows] float32 scores, the device's seconds on the batch)``.
        ready: whether ``wait`` would return at once.
    """

    def __init__(self, wait: Callable[[], tuple[np.ndarray, float]], ready: Callable[[], bool]) -> None:
        self._wait, self.ready = wait, ready

    @classmethod
    def done(cls, scores: np.ndarray, seconds: float) -> Launched:
        """A batch scored before its launch returned (on a processor)."""
        return cls(lambda: (scores, seconds), lambda: True)

    def result(self) -> tuple[np.ndarray, float]:
        """``([rows] float32 scores, seconds)``, once the device is done; the device's error, if it failed."""
        return self._wait()


def require_file(folder: Path, *names: str) -> Path:
    """The first of ``names`` present in ``folder``; else :class:`MissingFileError` naming the folder and the file."""
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise MissingFileError(f"{folder}: missing {' or '.join(names)}")


class GraphNotRunnable(InputError):
    """onnxruntime parses the graph at ``path`` but cannot run it on ``device``, for ``reason`` (onnxruntime's
    first line: no kernel for a type, say, or a graph that another version wrote)."""

    def __init__(self, path: Path, device: str, reason: str) -> None:
        self.reason = reason
        super().__init__(f"{path}: onnxruntime cannot run this graph on {device} ({reason}): export it again?")


def _unreadable_model(path: Path, detail: str) -> InputError:
    """The error for an exported file that its runtime cannot parse (a truncated or corrupt copy)."""
    detail = " ".join(detail.split()) or "unreadable"
    return InputError(f"{path}: not a valid ONNX model ({detail}): truncated or corrupt? export it again")


@dataclass(frozen=True)
class TorchOptions:
    """The torch backend's speed levers. Each is recorded in :meth:`TorchScorer.settings` and
    :attr:`Reranker.settings <distill.serving.reranker.Reranker.settings>`.

    Every model that has an SDPA path (``torch.nn.functional.scaled_dot_product_attention``: fused flash or
    memory-efficient kernels on a GPU) is loaded with it; one without it keeps its own attention. These levers come
    on top of that."""

    tf32: bool = False
    """fp32 only, opt-in: compute fp32 matmuls on CUDA in TF32 (inputs rounded to a 10-bit mantissa, fp32
    accumulation), several times faster on Ampere and later GPUs. It changes the scores (by how much is not measured
    yet: no GPU), so it is off unless asked. It sets ``torch.backends.cuda.matmul.fp32_precision`` to ``tf32``
    during each forward only, and restores it after (process-wide meanwhile); CPU matmuls ignore it."""
    compile: bool = False
    """Opt-in: ``torch.compile`` the model (in place). It compiles on the first call, and once more with dynamic
    shapes when a later batch's shape differs, so the first calls wait; scores change within rounding."""
    cudnn_attention: bool = False
    """On CUDA, let SDPA use cuDNN's kernels, which build a plan on the host for every new (batch, length) shape,
    and a reranking call's shape is new almost every time (off: flash, memory-efficient or math kernels). No effect
    on a CPU."""
    unpad: bool | None = None
    """Run the encoder on the batch's real tokens only, the pairs back to back (:class:`~distill.model.unpadding.
    PackedEncoder`: flash variable-length attention on CUDA in fp16/bf16, SDPA on the re-padded heads elsewhere); a
    reranker then packs its batches without padding them (:meth:`Encoded.pack <distill.serving.encoding.Encoded.
    pack>`). BERT encoders only. Scores change within rounding; positions count from 0 in every pair, as in a
    right-padded batch. None: the device's default (:data:`~distill.core.devices.RERANKER_LEVERS`: on CUDA for a
    BERT encoder, off on a CPU)."""
    cuda_graphs: bool | None = None
    """With ``unpad`` on CUDA: replay each batch from a CUDA graph captured once per bucketed shape
    (:mod:`distill.serving.cuda_graphs`) instead of launching its kernels one by one; each new shape waits for its
    capture. None: the device's default (on CUDA with ``unpad``, off on a CPU, where it cannot run)."""

    def on(self, device: str | Any, unpaddable: bool = True) -> TorchOptions:
        """These levers with each one not given (None) at ``device``'s default
        (:data:`~distill.core.devices.RERANKER_LEVERS`); ``unpad``, and the graphs with it, only for a model that
        can run unpadded (``unpaddable``)."""
        defaults = RERANKER_LEVERS[device_type(device)]
        unpad = defaults["unpad"] and unpaddable if self.unpad is None else self.unpad
        graphs = defaults["cuda_graphs"] and unpad if self.cuda_graphs is None else self.cuda_graphs
        return replace(self, unpad=unpad, cuda_graphs=graphs)


@contextmanager
def fp32_matmul_precision(tf32: bool) -> Iterator[None]:
    """A context in which CUDA's fp32 matmuls run in TF32 if ``tf32`` (else nothing changes); the previous setting
    is restored on exit. Uses ``torch.backends.cuda.matmul.fp32_precision`` where torch has it (2.9 and later:
    mixing it with the legacy ``allow_tf32`` raises), else ``allow_tf32``."""
    if not tf32:
        yield
        return
    import torch

    matmul = torch.backends.cuda.matmul
    name, value = ("fp32_precision", "tf32") if hasattr(matmul, "fp32_precision") else ("allow_tf32", True)
    before = getattr(matmul, name)
    setattr(matmul, name, value)
    try:
        yield
    finally:
        setattr(matmul, name, before)


class TorchScorer:
    """The Hugging Face weights of ``folder`` (``AutoModelForSequenceClassification``, one label), with the levers
    of :class:`TorchOptions` (each one not given at the device's default).

    It takes padded batches and, unpadded (``self.packed``), :class:`~distill.serving.encoding.Packed` ones too
    (``takes_packed``), which a reranker then gives it."""

    def __init__(
        self, folder: Path, device: str = "cpu", dtype: str | None = None, options: TorchOptions | None = None
    ) -> None:
        import inspect

        import torch

        import distill.model.segment_cosine  # noqa: F401  (registers the segment-cosine head)
        from distill.model.unpadding import PackedEncoder, unpaddable, varlen_kernel
        from distill.serving.cuda_graphs import CudaGraphs

        if dtype not in (None, *TORCH_DTYPES):
            raise InputError(f"the torch backend's dtype is one of {list(TORCH_DTYPES)}, not {dtype!r}")
        options = options or TorchOptions()
        if options.tf32 and dtype not in (None, "float32"):
            raise InputError(f"tf32 applies to float32 matmuls; the torch backend runs in {dtype}")
        require_file(folder, *WEIGHT_FILES)
        self.device = torch.device(device)
        self.dtype = dtype or "float32"
        self.model = _load_model(folder, getattr(torch, self.dtype)).to(self.device).eval()
        self.options = options = options.on(self.device, unpaddable(self.model))
        if options.cuda_graphs and self.device.type != "cuda":
            raise InputError(f"cuda_graphs: CUDA graphs run on a CUDA device, not {device!r}")
        if options.cuda_graphs and not options.unpad:
            raise InputError("cuda_graphs replays the unpadded encoder: not with unpad off")
        self.packed = PackedEncoder(self.model) if options.unpad else None
        self.takes_packed = self.packed is not None
        if options.compile:
            (self.packed or self.model).compile()
        config = self.model.config
        self.graphs = (
            CudaGraphs(
                self.packed,
                self.device,
                config.max_position_embeddings,
                config.pad_token_id or 0,
                fixed_width=varlen_kernel(next(self.model.parameters())) is not None,
            )
            if options.cuda_graphs
            else None
        )
        accepted = inspect.signature(self.model.forward).parameters
        self.input_names = tuple(name for name in INPUT_NAMES if name in accepted)

    def settings(self) -> dict[str, object]:
        """What the scorer computes with: dtype, device, the attention implementation the model loaded with, and the
        levers of :class:`TorchOptions`."""
        from distill.model.unpadding import kernel_name

        attention = getattr(self.model.config, "_attn_implementation", None)
        if self.packed is not None:
            attention = f"{attention} ({kernel_name(self.model)})"
        return {"dtype": self.dtype, "device": str(self.device), "attention": attention, **asdict(self.options)}

    @contextmanager
    def _computing(self) -> Iterator[None]:
        """The context every forward runs in: inference mode, the matmul precision and the attention backends."""
        import torch

        with (
            torch.inference_mode(),
            fp32_matmul_precision(self.options.tf32),
            attention_backends(self.device, self.options.cudnn_attention),
        ):
            yield

    def warm_up(self, max_tokens: int) -> int:
        """Capture the CUDA graphs of the shapes a batch of at most ``max_tokens`` tokens takes
        (:meth:`CudaGraphs.warm_up <distill.serving.cuda_graphs.CudaGraphs.warm_up>`); how many (none without
        graphs)."""
        if self.graphs is None:
            return 0
        with self._computing():
            return self.graphs.warm_up(max_tokens)

    def __call__(self, batch: Batch | Packed) -> np.ndarray:
        return self.launch(batch).result()[0]

    def launch(self, batch: Batch | Packed) -> Launched:
        """Start scoring ``batch``: on CUDA the work, and the copy of its scores to pinned host memory, is queued on
        the device and the host is free until :meth:`Launched.result` (whose seconds are the device's: between a
        CUDA event recorded once the batch's host-side preparation is done, before its first copy to the device, and
        one after the copy of its scores); on a processor it is done before this returns."""
        import torch

        started = time.perf_counter()
        on_cuda = self.device.type == "cuda"
        begin = torch.cuda.Event(enable_timing=True) if on_cuda else None
        with self._computing():
            if self.packed is None:
                if begin is not None:
                    begin.record()
                inputs = {k: torch.from_numpy(v).to(self.device) for k, v in batch.items() if k in self.input_names}
                scores = self.model(**inputs).logits[:, 0].float()
            else:
                scores = self._packed(batch if isinstance(batch, Packed) else Packed.of_padded(batch), begin)
        if not on_cuda:
            return Launched.done(scores.numpy(), time.perf_counter() - started)
        if scores.is_cuda:  # a graph's scores are on the host already (CudaGraphs.launch)
            scores = scores.to("cpu", non_blocking=True)  # pinned by PyTorch's caching host allocator
        end = torch.cuda.Event(enable_timing=True)
        end.record()

        def wait() -> tuple[np.ndarray, float]:
            end.synchronize()
            return scores.numpy().astype(np.float32), begin.elapsed_time(end) / 1e3

        return Launched(wait, end.query)

    def _packed(self, packed: Packed, begin: Any = None) -> Any:
        """The unpadded encoder's ``[rows]`` scores of ``packed``, a tensor: from a CUDA graph (on the host, being
        copied there), or eager (on the device); ``begin`` (a CUDA event) is recorded before the first copy to the
        device."""
        from distill.model.unpadding import packed_inputs, to_device

        if self.graphs is not None:
            return self.graphs.launch(packed, begin)
        tokens, cu_seqlens, width = packed_inputs(packed.input_ids, packed.token_type_ids, packed.lengths)
        if begin is not None:
            begin.record()
        return self.packed(to_device(tokens, self.device), to_device(cu_seqlens, self.device), width).float()


def changed_levers(options: TorchOptions, device: str | Any) -> list[str]:
    """The names of the levers ``options`` sets away from their defaults on ``device``."""
    defaults = TorchOptions().on(device)
    return [name for name, value in asdict(options).items() if value is not None and value != getattr(defaults, name)]


def _load_model(folder: Path, dtype: Any) -> Any:
    """The model of ``folder`` with SDPA attention, or with its own where its architecture has no SDPA path."""
    from transformers import AutoModelForSequenceClassification

    try:
        return AutoModelForSequenceClassification.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa")
    except ValueError:  # "... does not support an attention implementation through ... scaled_dot_product_attention"
        return AutoModelForSequenceClassification.from_pretrained(folder, dtype=dtype)


@dataclass(frozen=True)
class SessionSettings:
    """onnxruntime session options; the defaults are onnxruntime's own (:mod:`benchmarks.onnx_cpu`'s ``sessions``
    times each alternative on a student)."""

    threads: int = 0
    """Intra-op threads; 0: onnxruntime's default, one per physical core."""
    graph_optimization: Literal["disable", "basic", "extended", "all"] = "all"
    """onnxruntime's graph optimisation level, applied when the session loads the graph."""
    memory_arena: bool = True
    """Reuse freed CPU memory in onnxruntime's arena instead of returning it to the allocator."""
    spinning: bool = True
    """Let idle intra-op threads spin for the next op instead of sleeping."""

    def options(self):  # -> onnxruntime.SessionOptions
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self.graph_optimization]
        options.enable_cpu_mem_arena = self.memory_arena
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if self.spinning else "0")
        return options


class OnnxScorer:
    """An ONNX graph with inputs named as the tokenizer's and a ``logits`` output ``[batch, 1]``, on onnxruntime."""

    def __init__(self, path: Path, device: str = "cpu", settings: SessionSettings | None = None) -> None:
        import onnxruntime as ort

        require_file(path.parent, path.name)
        settings = settings or SessionSettings()
        if device == "cpu":
            providers = ["CPUExecutionProvider"]
        elif device.startswith("cuda"):
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise InputError(f"{path}: onnxruntime has no CUDA provider here (install onnxruntime-gpu)")
            index = device.partition(":")[2] or "0"
            providers = [("CUDAExecutionProvider", {"device_id": int(index)})]
        else:
            raise InputError(f"{path}: device must be 'cpu' or 'cuda[:N]' for ONNX, not {device!r}")
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

        try:
            self.session = ort.InferenceSession(str(path), settings.options(), providers=providers)
        except (ort_errors.InvalidProtobuf, ort_errors.InvalidArgument) as e:  # the file: "Load model from ... failed:"
            if "Load model from" not in str(e):
                raise
            raise _unreadable_model(path, str(e).partition("failed:")[2].strip()) from None
        except (ort_errors.Fail, ort_errors.InvalidGraph, ort_errors.NotImplemented) as e:
            raise GraphNotRunnable(path, device, str(e).splitlines()[0]) from None
        self.input_names = tuple(i.name for i in self.session.get_inputs())

    def __call__(self, batch: Batch) -> np.ndarray:
        (logits,) = self.session.run(["logits"], {name: batch[name] for name in self.input_names})
        return logits[:, 0].astype(np.float32)


OPENVINO_PRECISIONS = {"float32": "f32", "bfloat16": "bf16"}
"""``dtype`` -> OpenVINO's ``INFERENCE_PRECISION_HINT``: the arithmetic of every op it does not run in int8."""
OPENVINO_INT8_PRECISION = "float32"
"""The arithmetic of the ops that OpenVINO does not run in int8 in the graph of ``int8_mode: weights`` (attention's
two matmuls, LayerNorms, GELU). fp32 rather than bf16 even where the CPU has bf16: on the final student it was both
faster and closer to fp32 (:mod:`benchmarks.onnx_cpu`'s ``openvino`` run, on the CPU latency results page)."""
OPENVINO_INT8_GROUP_SIZE = 128
"""Channels of a token's activations that OpenVINO quantises with one int8 scale, at run time, before a matmul whose
weights are int8 (the graph of ``int8_mode: weights``, see :mod:`distill.export.quantize`). Chosen on DL21 by
:mod:`benchmarks.int8` on the final student, against 64, 384 and no grouping: the fastest of them, with a ranking
as close to fp32's as the others' (its results on the CPU latency results page)."""


class OpenVinoScorer:
    """An ONNX graph compiled by OpenVINO for the CPU (the ``openvino`` extra); inputs and output as for
    :class:`OnnxScorer`. With one stream (OpenVINO's latency mode) each call runs on every core; with several
    (its throughput mode), that many calls may run at once, from as many threads, each on its share of the cores.

    Args:
        precision: ``float32`` or ``bfloat16`` (:data:`OPENVINO_PRECISIONS`), set explicitly: OpenVINO's own
            default is bf16 wherever the CPU has it.
        int8_group_size: for a graph with int8 weights, the channels of a token's activations quantised with one
            scale at run time (OpenVINO's dynamic quantisation); 0 computes those matmuls in ``precision``.
        perf_count: keep OpenVINO's per-node timings of the last batch (``self.request.profiling_info``), for
            profiling; off in serving.
        streams: inference streams: how many calls may run at once (``threads`` is then their total).
    """

    def __init__(
        self,
        path: Path,
        threads: int = 0,
        precision: str = "float32",
        int8_group_size: int = 0,
        perf_count: bool = False,
        streams: int = 1,
    ) -> None:
        try:
            import openvino
        except ImportError as e:  # a ModuleNotFoundError of openvino: the command line names its extra
            raise ModuleNotFoundError(
                "the openvino backend needs OpenVINO: pip install openvino", name="openvino"
            ) from e
        if precision not in OPENVINO_PRECISIONS:
            raise InputError(f"openvino precision must be one of {list(OPENVINO_PRECISIONS)}, not {precision!r}")
        require_file(path.parent, path.name)
        from openvino.frontend import FrontEndManager

        # where the ONNX frontend refuses a file, read_model tries every other frontend, each printing its parse errors
        if not FrontEndManager().load_by_framework("onnx").supported(str(path)):
            raise _unreadable_model(path, "OpenVINO's ONNX reader cannot parse it")
        core = openvino.Core()
        try:
            model = core.read_model(str(path))
        except RuntimeError as e:  # a file cut past its header: the ONNX frontend takes it, then fails to parse it
            if "can't be parsed" not in str(e):
                raise
            raise _unreadable_model(path, "OpenVINO's ONNX reader cannot parse it") from None
        config: dict[str, object] = {
            "PERFORMANCE_HINT": "LATENCY" if streams == 1 else "THROUGHPUT",
            "INFERENCE_PRECISION_HINT": OPENVINO_PRECISIONS[precision],
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": int8_group_size,
            "PERF_COUNT": perf_count,
        }
        if streams > 1:
            config["NUM_STREAMS"] = streams
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        self.compiled = core.compile_model(model, "CPU", config)
        self.streams = streams
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        """The idle infer requests, one a stream: a call takes one and gives it back."""
        for _ in range(streams):
            self.requests.put(self.compiled.create_infer_request())
        self.request = self.requests.get()
        """The first stream's request (its ``profiling_info`` holds the last batch's timings there)."""
        self.requests.put(self.request)
        self.input_names = tuple(_input_name(i.get_names()) for i in self.compiled.inputs)

    def __call__(self, batch: Batch) -> np.ndarray:
        request = self.requests.get()
        try:
            outputs = request.infer({name: batch[name] for name in self.input_names})
            return np.asarray(outputs[self.compiled.output("logits")])[:, 0].astype(np.float32)  # a copy
        finally:
            self.requests.put(request)


def _input_name(names: set[str]) -> str:
    """The input's name in :data:`INPUT_NAMES` among the tensor names OpenVINO gives it: a graph that casts an input
    at once may name the input by the cast's output as well, and ``get_any_name`` may pick either."""
    known = sorted(names & set(INPUT_NAMES))
    return known[0] if known else sorted(names)[0]


class TorchScriptScorer:
    """A traced module taking the input arrays positionally (named in its schema) and returning ``[batch]`` scores."""

    def __init__(self, path: Path, device: str = "cpu") -> None:
        require_file(path.parent, path.name)  # before torch: a missing file is not a missing extra
        import torch

        self.device = torch.device(device)
        self.module = torch.jit.load(str(path), map_location=self.device).eval()
        self.input_names = tuple(arg.name for arg in self.module.forward.schema.arguments[1:])

    def __call__(self, batch: Batch) -> np.ndarray:
        import torch

        with torch.inference_mode():
            scores = self.module(*(torch.from_numpy(batch[name]).to(self.device) for name in self.input_names))
        return scores.float().cpu().numpy()


def int8_graph(folder: Path) -> dict[str, Any]:
    """How the export in ``folder`` made its int8 graph, as its ``card.json`` records it: ``mode`` (its
    ``int8_mode``) and ``runtime`` (the runtime it was made for and checked on); empty where there is no card or no
    int8 graph."""
    card = folder / EXPORT_CARD
    if not card.is_file():
        return {}
    return (read_json_object(card).get("optimizations") or {}).get("onnx-int8") or {}


def load_scorer(
    folder: str | Path,
    fmt: str,
    device: str = "cpu",
    dtype: str | None = None,
    threads: int = 0,
    runtime: Literal["onnxruntime", "openvino"] = "onnxruntime",
    options: TorchOptions | None = None,
    streams: int = 1,
) -> Scorer:
    """The scorer of format ``fmt`` (``torch`` or a key of :data:`FORMAT_FILES`) in ``folder``.

    Args:
        dtype: one of :data:`TORCH_DTYPES`, for ``torch``; for ``onnx`` on OpenVINO, one of
            :data:`OPENVINO_PRECISIONS`; the other exported files have theirs.
        threads: intra-op threads of an ONNX graph's runtime (0: its default, one per physical core); torch's
            threads are process-wide (``torch.set_num_threads``).
        runtime: what runs an ONNX graph: ``onnxruntime`` (:class:`OnnxScorer`) or ``openvino`` (on a CPU).
        options: the torch backend's levers (:class:`TorchOptions`); the other formats take none.
        streams: OpenVINO's inference streams (:class:`OpenVinoScorer`); the other runtimes have one.
    """
    folder = Path(folder)
    if streams != 1 and (fmt == "torch" or runtime != "openvino"):
        raise InputError(f"{folder}: streams {streams}: an option of the openvino backend, not of {fmt}")
    if fmt == "torch":
        return TorchScorer(folder, device, dtype, options)
    if options is not None and (changed := changed_levers(options, device)):
        raise InputError(f"{folder}: {', '.join(changed)}: options of the torch backend, not of {fmt}")
    if fmt not in FORMAT_FILES:
        raise InputError(f"unknown format {fmt!r}: expected 'torch' or one of {sorted(FORMAT_FILES)}")
    path = folder / FORMAT_FILES[fmt]
    if runtime == "openvino":
        if device != "cpu":
            raise InputError(f"{path}: the openvino backend runs on the CPU, not {device!r}")
        if fmt == "onnx-int8":  # int8 matmuls, the rest in OPENVINO_INT8_PRECISION
            if dtype not in (None, "int8"):
                raise InputError(f"{path} is int8; dtype={dtype!r} does not apply")
            if (
                int8_graph(folder).get("mode") == "dynamic"
            ):  # onnxruntime's own quantised ops, which OpenVINO cannot convert
                raise InputError(
                    f"{path}: an int8 graph of int8_mode dynamic is onnxruntime's (its QAttention OpenVINO cannot "
                    "convert): use the onnx backend, or export --int8_mode weights"
                )
            return OpenVinoScorer(path, threads, OPENVINO_INT8_PRECISION, OPENVINO_INT8_GROUP_SIZE, streams=streams)
        if fmt != "onnx" and dtype not in (None, "float32"):
            raise InputError(f"{fmt} has a fixed dtype; dtype={dtype!r} applies to model.onnx only")
        return OpenVinoScorer(path, threads, dtype or "float32", streams=streams)
    if dtype not in (None, "float32"):
        raise InputError(f"{fmt} has a fixed dtype; dtype={dtype!r} applies to the torch backend only")
    if fmt == "torchscript":
        return TorchScriptScorer(path, device)
    return OnnxScorer(path, device, SessionSettings(threads=threads))
