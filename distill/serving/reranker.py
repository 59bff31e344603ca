"""``Reranker``: score and rank a query's passages with a student, on PyTorch, ONNX, TorchScript or OpenVINO.

``Reranker.load("checkpoints/minilm/export").rerank("what is a rhino", passages, top_k=10)`` gives
``[(index into passages, score), ...]``, best first, on the fastest backend for this machine (``backend="auto"``,
:mod:`distill.serving.auto`); ``reranker.backend`` names it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from distill.core.batching import token_budget_batches
from distill.core.devices import STUDENT_BATCH_TOKENS, device_type
from distill.core.files import check_model_folder
from distill.core.interpolation import interpolate
from distill.core.run_folder import student_folder
from distill.core.schema import InputError, text_fault
from distill.serving.auto import choose_backend
from distill.serving.backends import BACKENDS, ONNX_DTYPES, OPENVINO_DTYPES, backend_name
from distill.serving.calibration import ScoreCalibration, normalised, read_calibration
from distill.serving.encoding import Batch, Packed, encode_pairs, load_tokenizer, model_max_length
from distill.serving.fusion import Fusion, first_stage_array
from distill.serving.hardware import serving_device
from distill.serving.options import ServingOptions
from distill.serving.scorers import Scorer, changed_levers, load_scorer, require_file

log = logging.getLogger(__name__)

Prepared = tuple[int, list[tuple[np.ndarray, Batch | Packed]]]
"""A span of a call's pairs, ready to score: how many of them were truncated, and its batches (padded, or packed for
a scorer that ``takes_packed``), each with the indices (into the call's passages) of its rows."""


class Reranker:
    """A cross-encoder student that scores (query, passage) pairs.

    Passages are encoded as in training, as pairs with the query (the passage cut so that the pair fits
    ``max_length``: by default the model's limit, which can be longer than the ``data.max_length`` the student
    trained and validated at, its card's ``student.max_length``), sorted by length into batches of at most
    ``max_batch_tokens`` padded tokens, and their scores returned in input order.

    With ``overlap`` set, a call's passages are taken in spans of that many, in input order: each span is encoded,
    sorted and padded on a background thread while the previous span's batches run, so tokenisation overlaps
    compute. Batches then hold one span's pairs, so the scores can change within rounding, as with another batch
    budget (where the spans' batches are the sequential path's, the scores are the same); the order and the
    ``truncated`` count are the sequential path's.

    With ``alpha`` set, a query's scores are interpolated with its first-stage scores (given to :meth:`score`):
    ``alpha · z(student) + (1 − alpha) · z(first stage)``, ``z`` standardising over the query's passages.
    :meth:`load` takes ``alpha`` from the student's card, the α of the first stage named (``first_stage``), or as
    ``interpolation`` says (:class:`~distill.serving.fusion.Fusion`).

    Attributes:
        truncated: how many pairs, over all calls, were longer than ``max_length`` and cut.
        backend: the named backend that scores (``openvino-int8``, ``torch-fp32``, ... : the keys of
            :data:`~distill.serving.backends.NAMED_BACKENDS`); None for a scorer given directly.
        backend_reason: why ``backend="auto"`` chose it (the machine, and each faster backend passed over with its
            reason); empty for a backend given by name.
    """

    def __init__(
        self,
        scorer: Scorer,
        tokenizer: Any,
        max_length: int,
        max_batch_tokens: int = STUDENT_BATCH_TOKENS["cpu"],
        alpha: float | None = None,
        backend: str | None = None,
        backend_reason: str = "",
        overlap: int = 0,
    ) -> None:
        if max_length < 1 or max_batch_tokens < 1:
            raise ValueError(f"max_length and max_batch_tokens must be positive, got {max_length}, {max_batch_tokens}")
        if overlap < 0:
            raise InputError(f"overlap is a number of pairs (0: off), not {overlap}")
        if alpha is not None and not 0 <= alpha <= 1:
            raise InputError(f"interpolation alpha must be in [0, 1], got {alpha}")
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.max_batch_tokens = max_batch_tokens
        self.alpha = alpha
        self.backend = backend
        self.backend_reason = backend_reason
        self.overlap = overlap
        self.truncated = 0
        self.first_stage: str | None = None
        """The first stage whose α ``alpha`` is (None: a number given, or no fusion)."""
        self.device: str | None = None
        """Where :meth:`load` put the model (``cpu``, ``cuda``); None for a scorer given directly."""
        self.calibration: ScoreCalibration | None = None
        """The export's score calibration (:mod:`distill.serving.calibration`), which :meth:`probabilities`
        applies; None for a folder without one."""

    @classmethod
    def load(cls, path: str | Path, options: ServingOptions | None = None, **changes: Any) -> Reranker:
        """The student in ``path``: an HF folder (``torch``), an export folder (any backend), a training run (its
        export, or its HF folder for ``torch``) or a Hub id.

        ``options`` (:class:`~distill.serving.options.ServingOptions`, default all its defaults) says how it is
        served: the backend (``auto``, default: the fastest this machine, the folder's files, the installed runtimes
        and the export's quality gate allow; it is logged and kept in ``reranker.backend``), the device and dtype,
        the longest pair, the batch budget, the first-stage fusion (``interpolation``, ``first_stage``: the α of that
        first stage in the student's card), the ONNX runtimes' threads, tokenising ahead
        and the torch backend's levers (recorded in :attr:`settings`). ``changes`` replace some of them by name:
        ``Reranker.load(folder, backend="onnx", dtype="int8")``.

        Raises:
            MissingFileError: a file the backend needs is missing (``tokenizer.json`` of an export, the model's
                file, ...); the message names the folder and the file.
            InputError: a file is unreadable (a truncated ``model.onnx`` or ``model.safetensors``, a malformed
                ``config.json``, ...), or an option is wrong: the message names it.
        """
        unknown = sorted(set(changes) - {f.name for f in fields(ServingOptions)})
        if unknown:
            raise TypeError(f"Reranker.load() got unknown option(s) {unknown}: see ServingOptions")
        options = replace(options or ServingOptions(), **changes)
        backend, dtype, max_length = options.backend, options.dtype, options.max_length
        device = serving_device(options.device)
        if backend not in ("auto", *BACKENDS):
            raise InputError(f"backend must be one of {['auto', *BACKENDS]}, not {backend!r}")
        path = student_folder(path, revision=options.revision)
        require_file(path, "config.json")
        require_file(path, "tokenizer_config.json")
        check_model_folder(path)  # each JSON file parses, the tokenizer's vocabulary is there, the weights whole
        fused = Fusion.of(path, options.interpolation, options.first_stage).applied()  # before the model loads
        first_stage, alpha = fused if fused is not None else (None, None)
        reason = ""
        if backend == "auto":
            levers = changed_levers(options.levers, device)
            choice = choose_backend(path, device, torch_levers=levers)
            (backend, dtype), reason = choice.load_args, choice.reason
            log.info("%s: backend auto chose %s (%s)", path, choice.backend, reason)
            if options.streams > 1 and backend != "openvino":
                log.warning("%s: streams %d: OpenVINO's option, and auto chose %s: one stream", path, options.streams,
                            choice.backend)  # fmt: skip
                options = replace(options, streams=1)
        dtypes = OPENVINO_DTYPES if backend == "openvino" else ONNX_DTYPES
        onnx = backend in ("onnx", "openvino")
        if onnx and dtype not in dtypes:
            raise InputError(f"the {backend} backend's dtype is one of {list(dtypes)}, not {dtype!r}")
        fmt = dtypes[dtype] if onnx else backend
        runtime = "openvino" if backend == "openvino" else "onnxruntime"
        # the exported files carry their dtype; OpenVINO computes model.onnx in the one asked for
        precision = None if backend == "onnx" or (backend == "openvino" and fmt != "onnx") else dtype
        tokenizer = load_tokenizer(path)  # before the model: its limits are checked first
        limit = model_max_length(path, tokenizer)
        if max_length is not None and max_length > limit:
            raise InputError(f"{path}: max_length {max_length} is over the model's {limit}")
        least = tokenizer.num_special_tokens_to_add(pair=True) + 2
        if max_length is not None and max_length < least:
            raise InputError(
                f"{path}: max_length {max_length} leaves no room for a query token and a passage token beside the "
                f"model's special tokens: at least {least}"
            )
        scorer = load_scorer(path, fmt, device, precision, options.threads, runtime, options.levers, options.streams)
        budget = options.max_batch_tokens or STUDENT_BATCH_TOKENS[device_type(device)]
        name = backend_name(backend, dtype)
        reranker = cls(scorer, tokenizer, max_length or limit, budget, alpha, name, reason, options.overlap)
        reranker.first_stage = first_stage
        reranker.calibration = read_calibration(path)
        reranker.device = device
        return reranker

    def warm_up(self) -> int:
        """Score one batch of each width a request can bring (powers of two up to ``max_length`` tokens a pair, each
        batch filling the token budget), then let the scorer capture the CUDA graphs of the budget's batch shapes
        where it replays them (:meth:`TorchScorer.warm_up <distill.serving.scorers.TorchScorer.warm_up>`), so that
        the runtime's first-call costs (OpenVINO's and CUDA's per-shape plans, graph captures, allocator growth) are
        paid before the first request; how many batch shapes ran."""
        widths = sorted({min(2**k, self.max_length) for k in range(4, self.max_length.bit_length() + 1)})
        for width in widths:
            pairs = max(1, self.max_batch_tokens // width)
            words = " ".join(["warm"] * width)  # at least width tokens: the pair is cut to max_length
            self._student_scores("warm up", [words] * pairs)
        self.truncated = 0
        captures = getattr(self.scorer, "warm_up", None)
        return len(widths) + (captures(self.max_batch_tokens) if captures else 0)

    @property
    def settings(self) -> dict[str, object]:
        """What scores, and how: the backend, the longest pair, the batch budget, ``overlap`` and, on ``torch``, the
        scorer's dtype, device, attention implementation and levers (:meth:`TorchScorer.settings
        <distill.serving.scorers.TorchScorer.settings>`)."""
        scorer = getattr(self.scorer, "settings", None)
        own = {"max_length": self.max_length, "max_batch_tokens": self.max_batch_tokens, "overlap": self.overlap}
        own["streams"] = getattr(self.scorer, "streams", 1)
        return {"backend": self.backend, **own, **(scorer() if callable(scorer) else {})}

    def score(
        self, query: str, passages: Sequence[str], first_stage_scores: Sequence[float] | None = None
    ) -> list[float]:
        """The score of each passage for ``query``, in the order of ``passages`` (higher is more relevant).

        ``first_stage_scores`` (one finite number per passage) are needed, and used, when the reranker interpolates;
        given to one that does not, they are refused rather than ignored.
        """
        if isinstance(passages, Iterator):  # a generator: read once, here
            passages = list(passages)
        if isinstance(passages, str) or not all(isinstance(p, str) for p in passages) or not isinstance(query, str):
            raise TypeError("score(query, passages) takes a query string and a sequence of passage strings")
        if not query.strip():
            raise InputError("query: must not be empty")
        for where, text in (("query", query), *((f"passages[{i}]", p) for i, p in enumerate(passages))):
            if (fault := text_fault(text)) is not None:
                raise InputError(f"{where}: {fault}")
        if first_stage_scores is not None:
            if self.alpha is None:
                raise InputError(
                    "first_stage_scores: this reranker does not fuse with a first stage: load it with "
                    "interpolation=True (or first_stage=NAME) to fuse them"
                )
            first_stage = first_stage_array(first_stage_scores, len(passages))
        elif self.alpha is not None and passages:
            raise InputError(
                f"this reranker interpolates with the first stage (alpha {self.alpha}): give one first-stage score "
                "per passage, or load it with interpolation=False"
            )
        if len(passages) == 0:  # a numpy array of strings has no truth value
            return []
        student = self._student_scores(query, passages)
        if self.alpha is None:
            return student.tolist()
        return interpolate(student, first_stage, [query] * len(student), self.alpha).tolist()

    def probabilities(
        self, query: str, passages: Sequence[str], first_stage_scores: Sequence[float] | None = None
    ) -> list[float]:
        """The normalised scores of :meth:`score`, each in (0, 1), in the order of ``passages``: the student's
        calibrated probability of relevance (:attr:`calibration`), or the sigmoid of a fused score or of a student
        without a calibration. Monotone in :meth:`score`'s raw scores, so both rank the same."""
        raw = np.asarray(self.score(query, passages, first_stage_scores), dtype=np.float64)
        return normalised(raw, self.calibration, self.alpha is not None).tolist()

    def _student_scores(self, query: str, passages: Sequence[str]) -> np.ndarray:
        scores = np.empty(len(passages), dtype=np.float32)
        for truncated, batches in self._prepared(query, passages):
            self.truncated += truncated
            for rows, batch in batches:
                scores[rows] = self.scorer(batch)
        return scores

    def _prepared(self, query: str, passages: Sequence[str]) -> Iterator[Prepared]:
        """The call's spans (:attr:`overlap` pairs each, or all of them), each prepared by :meth:`_prepare`; with
        several, on a background thread, one span ahead of the one being scored."""
        size = self.overlap or len(passages)
        spans = [(start, min(start + size, len(passages))) for start in range(0, len(passages), size)]
        if len(spans) == 1:
            yield self._prepare(query, passages, *spans[0])
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rerank-tokenize") as pool:
            pending = pool.submit(self._prepare, query, passages, *spans[0])
            for span in spans[1:]:
                ready = pending.result()
                pending = pool.submit(self._prepare, query, passages, *span)
                yield ready
            yield pending.result()

    def _prepare(self, query: str, passages: Sequence[str], start: int, stop: int) -> Prepared:
        """Encode ``passages[start:stop]``, sort them into token-budget batches and pad each batch, or pack it for a
        scorer that takes packed batches (the unpadded encoder): numpy, from the flat ids."""
        encoded = encode_pairs(self.tokenizer, [query] * (stop - start), list(passages[start:stop]), self.max_length)
        packed = getattr(self.scorer, "takes_packed", False)
        batches = [
            (np.asarray(rows) + start, encoded.pack(rows) if packed else encoded.batch(self.tokenizer, rows))
            for rows in token_budget_batches(encoded.lengths, self.max_batch_tokens)
        ]
        return encoded.truncated, batches

    def rerank(
        self,
        query: str,
        passages: Sequence[str],
        top_k: int | None = None,
        first_stage_scores: Sequence[float] | None = None,
    ) -> list[tuple[int, float]]:
        """``(index into passages, score)`` of the ``top_k`` best passages (all by default), best first; ties keep
        the input order."""
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int | np.integer)):
            raise TypeError(f"top_k must be an int or None, got {top_k!r}")
        if top_k is not None and top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {top_k}")
        if isinstance(passages, Iterator):  # a generator: read once, here
            passages = list(passages)
        scores = self.score(query, passages, first_stage_scores)
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        return [(i, scores[i]) for i in order[:top_k]]
