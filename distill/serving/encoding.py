"""Cross-encoder inputs: (query, passage) pairs to padded id arrays, as the student was trained on them.

Pairs are encoded once without padding (``[CLS] Q [SEP] K [SEP]``, the passage truncated to the max
length, as in training), then padded batch by batch. Every backend (PyTorch, ONNX, TorchScript) reads
the same int64 arrays.

A reranking call pairs one query with many passages, so a fast tokenizer's Rust backend encodes the passages in one
parallel call and each distinct query once, and the pairs are joined with numpy by the template that the tokenizer's
own post-processor gives (read off once per query): the ids are those of
``tokenizer(query, passage, truncation="only_second")``, held back to back in flat arrays (:class:`Encoded`), without
encoding every passage twice, per-pair Python lists or Python padding. A batch's padded arrays are built from them
with numpy (:meth:`Encoded.batch`), and carry the rows' lengths (:class:`Padded`); for the unpadded encoder a batch's
pairs are gathered back to back instead (:meth:`Encoded.pack`, :class:`Packed`), and no padded array is built.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distill.core.batching import segments
from distill.core.files import read_json_object
from distill.model.positions import usable_positions
from distill.serving.prefixes import MARGIN, prefixes, splits_at_spaces

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
"""The inputs a cross-encoder can take, in the order of the exported graphs' inputs."""

Batch = dict[str, np.ndarray]
"""Input name -> int64 array ``[batch, sequence]``."""


def input_names(tokenizer: Any) -> tuple[str, ...]:
    """The inputs the tokenizer gives, in :data:`INPUT_NAMES` order (no ``token_type_ids`` for RoBERTa and the like)."""
    return tuple(name for name in INPUT_NAMES if name in tokenizer.model_input_names)


def without_torch_notice(record: logging.LogRecord) -> bool:
    """Whether ``record`` is not transformers' "PyTorch was not found. Models won't be available ..." notice, which
    its import logs where torch is not installed: on the light install, which scores with ONNX or OpenVINO and needs
    transformers for its tokenizers only, the notice is wrong."""
    return not str(record.msg).startswith("PyTorch was not found")


def load_tokenizer(folder: str | Path) -> Any:
    """The tokenizer of a student folder, by the class its ``tokenizer_config.json`` names (that import needs no
    torch, where ``AutoTokenizer`` reads the model config, which imports it), else by ``AutoTokenizer``."""
    logging.getLogger("transformers").addFilter(without_torch_notice)  # before the import that logs it; added once
    import transformers

    folder = Path(folder)
    config = folder / "tokenizer_config.json"
    name = read_json_object(config).get("tokenizer_class") if config.is_file() else None
    tokenizer_class = getattr(transformers, name, None) if name else None
    return (tokenizer_class or transformers.AutoTokenizer).from_pretrained(folder)


def model_max_length(folder: str | Path, tokenizer: Any) -> int:
    """The longest sequence the student in ``folder`` takes, in tokens: the tokenizer's limit, capped by the
    positions of its ``config.json`` that hold a token (:func:`~distill.model.positions.usable_positions`)."""
    positions = usable_positions(read_json_object(Path(folder) / "config.json"))
    return int(min(tokenizer.model_max_length, positions if positions is not None else tokenizer.model_max_length))


@dataclass(eq=False)
class Encoded:
    """Pairs as unpadded token ids, back to back in flat arrays: pair ``i`` is ``ids[offsets[i] : offsets[i] +
    pair_lengths[i]]`` (its attention mask is all ones)."""

    ids: np.ndarray
    """``[N]`` int64: every pair's token ids, pair after pair."""
    type_ids: np.ndarray
    """``[N]`` int64: their token type ids (zeros where the tokenizer gives none)."""
    pair_lengths: np.ndarray
    """``[pairs]`` int64: each pair's length in tokens."""
    truncated: int
    """How many pairs were longer than the max length and cut."""
    names: tuple[str, ...] = INPUT_NAMES
    """The inputs the tokenizer gives (:func:`input_names`)."""

    @property
    def lengths(self) -> list[int]:
        return self.pair_lengths.tolist()

    @property
    def offsets(self) -> np.ndarray:
        """``[pairs]`` int64: where each pair starts in :attr:`ids`."""
        return np.cumsum(self.pair_lengths) - self.pair_lengths

    @property
    def features(self) -> list[dict[str, list[int]]]:
        """One dict per pair: input name -> ids (``tokenizer(query, passage)``'s lists, for :func:`pad_batch`)."""
        bounds = np.cumsum(self.pair_lengths)[:-1]
        values = {
            "input_ids": [row.tolist() for row in np.split(self.ids, bounds)],
            "token_type_ids": [row.tolist() for row in np.split(self.type_ids, bounds)],
            "attention_mask": [[1] * n for n in self.lengths],
        }
        return [{name: values[name][i] for name in self.names} for i in range(len(self.pair_lengths))]

    @classmethod
    def from_features(
        cls, features: Sequence[dict[str, list[int]]], truncated: int = 0, names: tuple[str, ...] | None = None
    ) -> Encoded:
        """The flat arrays of per-pair id lists (by default with the inputs the first dict has; an attention mask is
        all ones, as an unpadded encoding's is)."""
        if names is None:
            names = tuple(name for name in INPUT_NAMES if name in features[0]) if features else INPUT_NAMES
        lengths = np.fromiter((len(f["input_ids"]) for f in features), np.int64, len(features))
        ids = _flat([f["input_ids"] for f in features], int(lengths.sum()))
        types = [f.get("token_type_ids") for f in features]
        type_ids = _flat(types, len(ids)) if all(t is not None for t in types) else np.zeros_like(ids)
        return cls(ids, type_ids, lengths, truncated, names)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Encoded):
            return NotImplemented
        return (
            self.truncated == other.truncated
            and self.names == other.names
            and all(np.array_equal(getattr(self, f), getattr(other, f)) for f in ("ids", "type_ids", "pair_lengths"))
        )

    def batch(
        self, tokenizer: Any, rows: Sequence[int] | np.ndarray | None = None, length: int | None = None
    ) -> Padded:
        """The pairs ``rows`` (all by default), in that order, padded to their longest (or to ``length``, if longer) on
        the tokenizer's padding side: :func:`pad_batch`'s arrays, built with numpy from the flat ids."""
        rows = np.arange(len(self.pair_lengths)) if rows is None else np.asarray(rows, dtype=np.int64)
        lengths = self.pair_lengths[rows]
        width = int(max(length or 0, lengths.max(initial=0)))
        left = tokenizer.padding_side == "left"
        columns = np.arange(width)
        real = columns >= width - lengths[:, None] if left else columns < lengths[:, None]
        tokens = segments(self.offsets[rows], lengths)  # the rows' tokens, row after row, as the mask's True cells
        fill = {"input_ids": tokenizer.pad_token_id, "token_type_ids": tokenizer.pad_token_type_id}
        source = {"input_ids": self.ids, "token_type_ids": self.type_ids}
        batch = Padded(lengths, left)
        for name in self.names:
            if name == "attention_mask":
                batch[name] = real.astype(np.int64)
                continue
            array = np.full((len(rows), width), fill[name], dtype=np.int64)
            array[real] = source[name][tokens]
            batch[name] = array
        return batch

    def pack(self, rows: Sequence[int] | np.ndarray | None = None) -> Packed:
        """The pairs ``rows`` (all by default), in that order, back to back (:class:`Packed`): one gather of the flat
        ids, no padding."""
        rows = np.arange(len(self.pair_lengths)) if rows is None else np.asarray(rows, dtype=np.int64)
        lengths = self.pair_lengths[rows]
        tokens = segments(self.offsets[rows], lengths)
        return Packed(self.ids[tokens], self.type_ids[tokens], lengths)


class Padded(dict):
    """A padded :data:`Batch` (input name -> int64 array ``[rows, width]``) that also knows where its real tokens
    are, without reading its attention mask: ``lengths`` ``[rows]`` and the padding side (``left``)."""

    def __init__(self, lengths: np.ndarray, left: bool = False) -> None:
        super().__init__()
        self.lengths = lengths
        self.left = left


@dataclass(frozen=True, eq=False)
class Packed:
    """A batch's pairs back to back, as the unpadded encoder reads them: no padded array is built. Pair ``i`` is
    ``input_ids[offsets[i] : offsets[i] + lengths[i]]``, its positions counted from 0 (as a right-padded row's)."""

    input_ids: np.ndarray
    """``[N]`` int64: the pairs' token ids, pair after pair."""
    token_type_ids: np.ndarray
    """``[N]`` int64: their token type ids (zeros where the tokenizer gives none)."""
    lengths: np.ndarray
    """``[pairs]`` int64: each pair's length in tokens (``N`` in all)."""

    @classmethod
    def of_padded(cls, batch: Batch) -> Packed:
        """The real tokens of a padded batch (on either side): where its attention mask is 1, row by row; the
        lengths are a :class:`Padded` batch's own, else the mask's row sums."""
        mask = batch["attention_mask"].astype(bool)
        lengths = getattr(batch, "lengths", None)
        lengths = mask.sum(1) if lengths is None else lengths
        types = batch.get("token_type_ids")
        return cls(
            batch["input_ids"][mask],
            np.zeros(int(mask.sum()), np.int64) if types is None else types[mask],
            np.asarray(lengths, dtype=np.int64),
        )


def _flat(rows: Sequence[Sequence[int]], total: int) -> np.ndarray:
    """Lists of ints, back to back, as one int64 array of ``total`` values."""
    return np.fromiter(itertools.chain.from_iterable(rows), np.int64, total)


@dataclass(frozen=True)
class _Template:
    """How a fast tokenizer's post-processor joins a query with any passage: ``prefix + passage + suffix``."""

    prefix: tuple[list[int], list[int]]
    """Ids and type ids before the passage (the query and the special tokens around it)."""
    suffix: tuple[list[int], list[int]]
    """Ids and type ids after it."""
    passage_type: int
    """The passage tokens' type id."""


def _template(backend: Any, query: Any, special: int) -> _Template | None:
    """The template of ``query``'s pairs, read off the post-processor's output for the query paired with itself; None
    where that output is not ``prefix + passage + suffix`` (the passage's ids unchanged, one type id, every attention
    mask 1, ``special`` tokens added), or the query is empty: those pairs are joined one by one."""
    if len(query) == 0:
        return None
    pair = backend.post_process(query, query, add_special_tokens=True)
    second = [i for i, s in enumerate(pair.sequence_ids) if s == 1]
    if not second or second != list(range(second[0], second[0] + len(query))):
        return None
    start, stop = second[0], second[0] + len(query)
    ids, types = pair.ids, pair.type_ids
    if ids[start:stop] != query.ids or len(set(types[start:stop])) != 1 or not all(pair.attention_mask):
        return None
    if len(ids) != 2 * len(query) + special:
        return None
    return _Template((ids[:start], types[:start]), (ids[stop:], types[stop:]), types[start])


def encode_pairs(tokenizer: Any, queries: Sequence[str], passages: Sequence[str], max_length: int) -> Encoded:
    """Token ids of each ``(queries[i], passages[i])`` pair, at most ``max_length`` tokens.

    The passage is truncated (``only_second``, as in training). A query too long to leave room for one
    passage token is truncated together with its passage (``longest_first``) instead of raising.

    With a fast tokenizer, the passages are encoded in one parallel call of its Rust backend (without offsets), each
    distinct query once, and the pairs are joined by the post-processor's template with numpy: no per-pair Python
    lists.
    """
    if len(queries) != len(passages):
        raise ValueError(f"{len(queries)} queries for {len(passages)} passages")
    names = input_names(tokenizer)
    special = tokenizer.num_special_tokens_to_add(pair=True)
    backend = _plain_backend(tokenizer)
    count = len(queries)
    if backend is None:  # a slow tokenizer: the same ids, from its Python code
        query_ids = tokenizer(list(queries), add_special_tokens=False, verbose=False)["input_ids"]
        passage_ids = tokenizer(list(passages), add_special_tokens=False, verbose=False)["input_ids"]
        query_lengths = np.fromiter(map(len, query_ids), np.int64, count)
        passage_lengths = np.fromiter(map(len, passage_ids), np.int64, count)
        features: list[dict[str, list[int]] | None] = [None] * count
        fits = np.flatnonzero(query_lengths + special < max_length).tolist()
        _encode_with_python(tokenizer, queries, passages, max_length, fits, features)
        long_queries = np.flatnonzero(query_lengths + special >= max_length).tolist()
        _encode_with_python(tokenizer, queries, passages, max_length, long_queries, features, "longest_first")
        truncated = int(np.sum(query_lengths + passage_lengths + special > max_length))
        return Encoded.from_features(features, truncated, names)  # type: ignore[arg-type]  (every row is set)
    if not queries:
        return Encoded.from_features([], 0, names)
    return _encode_fast(tokenizer, backend, queries, passages, max_length, names, special)


def _encode_fast(
    tokenizer: Any,
    backend: Any,
    queries: Sequence[str],
    passages: Sequence[str],
    max_length: int,
    names: tuple[str, ...],
    special: int,
) -> Encoded:
    """:func:`encode_pairs` with a fast tokenizer's Rust ``backend``."""
    count = len(queries)
    position = {query: i for i, query in enumerate(dict.fromkeys(queries))}
    distinct = list(position)
    which = np.zeros(count, np.int64) if len(distinct) == 1 else np.array([position[q] for q in queries], np.int64)
    query_encodings = _encode_batch(backend, distinct)
    templates = [_template(backend, q, special) for q in query_encodings]
    query_lengths = np.array([len(q) for q in query_encodings], np.int64)[which]
    room = max_length - special - query_lengths
    encodings = _encode_passages(tokenizer, backend, passages, max_length, room)
    passage_rows = [e.ids for e in encodings]
    passage_lengths = np.fromiter(map(len, passage_rows), np.int64, count)
    flat = _flat(passage_rows, int(passage_lengths.sum()))
    truncated = int(np.sum(passage_lengths > room))
    kept = np.clip(passage_lengths, 0, np.maximum(room, 0))
    skip = passage_lengths - kept if tokenizer.truncation_side == "left" else np.zeros_like(kept)
    passage_starts = np.cumsum(passage_lengths) - passage_lengths + skip
    # Every pair as three segments of a source array: its prefix, its passage's kept tokens, its suffix.
    ids: list[Any] = [flat]
    passage_types = np.array([t.passage_type if t else 0 for t in templates], np.int64)
    types: list[Any] = [passage_types[which].repeat(passage_lengths)]
    size = len(flat)
    prefix = np.zeros((len(distinct), 2), np.int64)  # (start in the source, length) of each query's prefix
    suffix = np.zeros((len(distinct), 2), np.int64)
    for q, template in enumerate(templates):
        if template is None:
            continue
        for bounds, (part_ids, part_types) in ((prefix, template.prefix), (suffix, template.suffix)):
            bounds[q] = size, len(part_ids)
            ids.append(np.asarray(part_ids, np.int64))
            types.append(np.asarray(part_types, np.int64))
            size += len(part_ids)
    starts = np.stack([prefix[which, 0], passage_starts, suffix[which, 0]], axis=1)
    lengths = np.stack([prefix[which, 1], kept, suffix[which, 1]], axis=1)
    # The pairs the template does not join: a query too long for one passage token (longest_first, as the tokenizer
    # truncates it), or a post-processor that is not prefix + passage + suffix (joined one by one).
    no_template = np.array([templates[q] is None for q in which], bool)
    others: list[dict[str, list[int]] | None] = [None] * count
    long_queries = np.flatnonzero(room < 1).tolist()
    _encode_with_python(tokenizer, queries, passages, max_length, long_queries, others, "longest_first")
    for i in np.flatnonzero(no_template & (room >= 1)).tolist():
        encoding = encodings[i]
        if len(encoding) > room[i]:
            encoding.truncate(int(room[i]), direction=tokenizer.truncation_side)
        pair = backend.post_process(query_encodings[which[i]], encoding, add_special_tokens=True)
        others[i] = {"input_ids": pair.ids, "token_type_ids": pair.type_ids}
    for i, row in enumerate(others):
        if row is not None:
            starts[i], lengths[i] = (size, 0, 0), (len(row["input_ids"]), 0, 0)
            ids.append(np.asarray(row["input_ids"], np.int64))
            row_types = row.get("token_type_ids")
            types.append(np.asarray(row_types if row_types is not None else [0] * len(row["input_ids"]), np.int64))
            size += len(row["input_ids"])
    tokens = segments(starts.ravel(), lengths.ravel())
    return Encoded(np.concatenate(ids)[tokens], np.concatenate(types)[tokens], lengths.sum(1), truncated, names)


def _encode_passages(
    tokenizer: Any, backend: Any, passages: Sequence[str], max_length: int, room: np.ndarray
) -> list[Any]:
    """Each passage encoded without special tokens, a long one from a prefix where that gives its pair's kept tokens
    (:mod:`distill.serving.prefixes`; not where the passage is cut on the left): the prefix's encoding, at least
    ``room[i]`` plus :data:`~distill.serving.prefixes.MARGIN` tokens, stands for the whole passage's."""
    texts, cut = prefixes(passages, max_length) if tokenizer.truncation_side == "right" else (passages, [])
    if cut and not _splits_at_spaces(tokenizer, backend):
        texts, cut = passages, []
    encodings = _encode_batch(backend, texts)
    short = [i for i in cut if len(encodings[i]) < room[i] + MARGIN]
    for i, encoding in zip(short, _encode_batch(backend, [passages[i] for i in short]) if short else [], strict=True):
        encodings[i] = encoding
    return encodings


_SPLITS_AT_SPACES: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _splits_at_spaces(tokenizer: Any, backend: Any) -> bool:
    """:func:`~distill.serving.prefixes.splits_at_spaces` of ``tokenizer``'s Rust ``backend``, read once."""
    if tokenizer not in _SPLITS_AT_SPACES:
        _SPLITS_AT_SPACES[tokenizer] = splits_at_spaces(backend)
    return _SPLITS_AT_SPACES[tokenizer]


def token_count(tokenizer: Any, text: str) -> int:
    """How many tokens ``text`` is, special tokens not counted: ``len(tokenizer(text, add_special_tokens=False)
    ["input_ids"])``, from a fast tokenizer's Rust backend without the Python wrapper's work."""
    backend = _plain_backend(tokenizer)
    if backend is None:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return len(backend.encode(text, add_special_tokens=False).ids)


def _encode_batch(backend: Any, texts: Sequence[str]) -> list[Any]:
    """``texts`` encoded without special tokens in one call of the Rust backend, in parallel (its
    ``TOKENIZERS_PARALLELISM``); without offsets where the backend can skip them (``encode_batch_fast``)."""
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    return encode(list(texts), add_special_tokens=False)


_PLAIN_BACKENDS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _plain_backend(tokenizer: Any) -> Any | None:
    """A copy of a fast tokenizer's Rust tokenizer without truncation or padding (cached per tokenizer); None for a
    slow tokenizer."""
    if not getattr(tokenizer, "is_fast", False):
        return None
    if tokenizer not in _PLAIN_BACKENDS:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        backend.no_truncation()
        backend.no_padding()
        _PLAIN_BACKENDS[tokenizer] = backend
    return _PLAIN_BACKENDS[tokenizer]


def _encode_with_python(
    tokenizer: Any,
    queries: Sequence[str],
    passages: Sequence[str],
    max_length: int,
    rows: list[int],
    features: list[dict[str, list[int]] | None],
    truncation: str = "only_second",
) -> None:
    """Set ``features[i]`` for each of ``rows`` with the tokenizer's own pair encoding, truncated by ``truncation``."""
    if not rows:
        return
    encoded = tokenizer(
        [queries[i] for i in rows], [passages[i] for i in rows], truncation=truncation, max_length=max_length
    )
    for j, i in enumerate(rows):
        features[i] = {name: encoded[name][j] for name in input_names(tokenizer)}


def pad_batch(tokenizer: Any, features: Sequence[dict[str, list[int]]], length: int | None = None) -> Batch:
    """Pad ``features`` to their longest (or to ``length``, if longer), on the tokenizer's padding side: int64
    arrays ``[len(features), longest]`` (``tokenizer.pad``'s values: the pad token, attention mask 0, the pad
    token type). :meth:`Encoded.batch` pads an encoding's rows without the lists."""
    return Encoded.from_features(features).batch(tokenizer, None, length)
