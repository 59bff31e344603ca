"""A causal-LM teacher: tokenises (query, passage) pairs into the score terms and scores them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distill.core.devices import compute_dtype
from distill.core.schema import InputError
from distill.model.resolver import ModelSource, gguf_parsed_once, load_pretrained, resolve_model
from teachers.causal_lm import CausalLMScorer, ScorerOptions, ScoringSequence
from teachers.terms import (
    DEFAULT_PROMPT,
    LOGIT_CHUNK_ROWS,
    MAX_PASSAGE_TOKENS,
    PAIR_TERMS,
    QUERY_TERMS,
    UPR_PASSAGE_PREFIX,
    UPR_PASSAGE_TOKENS,
    UPR_QUESTION_PREFIX,
    prompt_fault,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``"auto"`` is bf16 on a GPU and fp32 elsewhere."""
    if dtype == "auto":
        return compute_dtype(device)
    if dtype not in DTYPES:
        raise InputError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, not {dtype!r}")
    return DTYPES[dtype]


START_TOKEN_KEYS = ("start_token_id", "start_token")
"""The keys of :meth:`CausalLMTeacher.describe` that need the teacher's tokenizer: :func:`teacher_setting` has the
others."""


def teacher_setting(identity: str, dtype: torch.dtype, max_passage_tokens: int, prompt: str) -> dict[str, Any]:
    """:meth:`CausalLMTeacher.describe` but its start token (:data:`START_TOKEN_KEYS`), which a teacher's name, dtype
    and options give before it loads."""
    return {
        "teacher": identity,
        "dtype": str(dtype).removeprefix("torch."),
        "max_passage_tokens": max_passage_tokens,
        "prompt": prompt,
        "upr_prompt": [UPR_PASSAGE_PREFIX, UPR_PASSAGE_TOKENS, UPR_QUESTION_PREFIX],
    }


CAUSAL_LM_ARCHITECTURES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
"""Endings of the architecture names (``config.json``'s ``architectures``) of models that predict the next token."""


def architectures_of(source: ModelSource) -> list[str]:
    """The architectures ``source``'s ``config.json`` names; none where it names none or has none (a GGUF file, or a
    malformed file, which transformers names as it loads it)."""
    import json

    config = Path(source.location) / "config.json"
    if source.gguf_file or not config.is_file():
        return []
    try:
        return list(json.loads(config.read_text()).get("architectures") or [])
    except (json.JSONDecodeError, AttributeError, UnicodeDecodeError, TypeError):
        return []


def check_causal_lm(source: ModelSource) -> None:
    """Check that ``source`` is a causal LM where its ``config.json`` names its architectures (a GGUF file has none):
    an encoder (an embedding model such as all-MiniLM-L6-v2) loads as one with a random LM head, or fails later
    for want of a start token.

    Raises:
        InputError: the architectures named are none of a causal LM's.
    """
    architectures = architectures_of(source)
    if architectures and not any(a.endswith(CAUSAL_LM_ARCHITECTURES) for a in architectures):
        raise InputError(
            f"teacher {source.name}: {', '.join(architectures)} is no causal LM, which log p(K | Q) needs; an "
            "embedding model teaches with --scores similarity"
        )


def check_encoder(source: ModelSource) -> None:
    """Check that ``source`` is no causal LM (a GGUF file, or a ``config.json`` naming a causal LM's architecture):
    as an embedding model, a causal LM's mean-pooled hidden states give a similarity that means nothing.

    Raises:
        InputError: it is one.
    """
    architectures = architectures_of(source)
    if source.gguf_file or any(a.endswith(CAUSAL_LM_ARCHITECTURES) for a in architectures):
        kind = "a GGUF causal LM" if source.gguf_file else ", ".join(architectures)
        raise InputError(
            f"teacher {source.name}: {kind} is no embedding model, which --scores similarity needs (give --teacher, "
            "such as all-minilm-l6-v2); a causal LM teaches with --scores cis"
        )


class CausalLMTeacher:
    """Computes the terms of :mod:`teachers.terms` for (query, passage) pairs.

    Args:
        model: a Hugging Face causal LM, on its device(s), in eval mode.
        tokenizer: its tokenizer.
        identity: a stable description of the weights (see :attr:`ModelSource.identity`).
        start_token_id: the token every prefix starts with; default the tokenizer's BOS, else EOS.
        max_passage_tokens: passage ids are truncated to this many tokens.
        prompt: the QA prompt with a ``{query}`` field.
        logit_chunk_rows: target positions per LM-head chunk.
        options: the scorer's batch budget and speed levers (packing, bucketed widths, compiled layers, cuDNN
            attention); each not given takes the device type's default.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        identity: str,
        start_token_id: int | None = None,
        max_passage_tokens: int = MAX_PASSAGE_TOKENS,
        prompt: str = DEFAULT_PROMPT,
        logit_chunk_rows: int = LOGIT_CHUNK_ROWS,
        options: ScorerOptions | None = None,
    ) -> None:
        if fault := prompt_fault(prompt):
            raise ValueError(f"prompt {prompt!r}: {fault}")
        if max_passage_tokens < 1:
            raise ValueError(f"max_passage_tokens must be positive, got {max_passage_tokens}")
        if logit_chunk_rows < 1:
            raise ValueError(f"logit_chunk_rows must be positive, got {logit_chunk_rows}")
        if start_token_id is None:
            start_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        if start_token_id is None:
            raise InputError(f"{identity}: the tokenizer has neither a BOS nor an EOS token: set start_token")
        vocabulary = model.get_input_embeddings().num_embeddings
        if not 0 <= int(start_token_id) < vocabulary:
            raise InputError(
                f"start token id {start_token_id} is not in the teacher's vocabulary of {vocabulary} ids "
                f"(0 to {vocabulary - 1})"
            )
        self.tokenizer = tokenizer
        self.identity = identity
        self.start_token_id = int(start_token_id)
        self.max_passage_tokens = max_passage_tokens
        self.prompt = prompt
        self.dtype = next(model.parameters()).dtype
        self.scorer = CausalLMScorer(model, logit_chunk_rows, pad_token_id=self.start_token_id, options=options)

    @classmethod
    def load(
        cls,
        name: str,
        *,
        device: str | torch.device = "cpu",
        dtype: str = "auto",
        device_map: str | None = None,
        start_token: int | str | None = None,
        **kwargs: Any,
    ) -> CausalLMTeacher:
        """Load a teacher by name (see :func:`distill.model.resolver.resolve_model`).

        ``device_map="auto"`` spreads a model that does not fit one GPU over all visible GPUs
        (model parallel); otherwise the model goes to ``device``. ``start_token`` is a token id
        or a token string.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        source: ModelSource = resolve_model(name)
        check_causal_lm(source)
        device = torch.device(device)
        torch_dtype = resolve_dtype(dtype, device)
        with gguf_parsed_once(source):
            tokenizer = load_pretrained(source, AutoTokenizer)
            model = load_pretrained(
                source, AutoModelForCausalLM, dtype=torch_dtype, attn_implementation="sdpa", device_map=device_map
            )
        if device_map is None:
            model.to(device)
        model.eval()
        return cls(
            model, tokenizer, identity=source.identity, start_token_id=_token_id(tokenizer, start_token), **kwargs
        )

    @classmethod
    def random(
        cls, name: str, *, device: str | torch.device = "cpu", dtype: str = "auto", seed: int = 0, **kwargs: Any
    ) -> CausalLMTeacher:
        """A teacher with random weights in the shapes of ``name`` (a key of
        :data:`~distill.model.resolver.ARCHITECTURES`), built directly on ``device`` in ``dtype``: for timing
        full-size shapes where the weights are absent. Its tokenizer is the architecture's compatible one."""
        from transformers import AutoModelForCausalLM

        from distill.model.resolver import load_architecture

        device = torch.device(device)
        config, tokenizer = load_architecture(name)
        torch.manual_seed(seed)
        with device:
            model = AutoModelForCausalLM.from_config(
                config, dtype=resolve_dtype(dtype, device), attn_implementation="sdpa"
            )
        return cls(model.eval(), tokenizer, identity=f"random:{name}:seed{seed}", **kwargs)

    def describe(self) -> dict[str, Any]:
        """Everything the scores depend on, for dataset metadata and cache keys."""
        return {
            **teacher_setting(self.identity, self.dtype, self.max_passage_tokens, self.prompt),
            "start_token_id": self.start_token_id,
            "start_token": self.tokenizer.convert_ids_to_tokens(self.start_token_id),
        }

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, with no special tokens: a special token's text in a query or passage
        (``<|endoftext|>``) is split as text, never read as the control token it names.

        Raises:
            ValueError: ``texts`` is a string, not a list of texts (its characters would be the texts).
        """
        _check_list(texts)
        if not texts:
            return []
        return self.tokenizer(list(texts), add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def encode_passages(self, passages: Sequence[str]) -> list[list[int]]:
        """Passage ids: ``tok(" " + passage)`` truncated to ``max_passage_tokens``."""
        _check_list(passages)
        return [ids[: self.max_passage_tokens] for ids in self.tokenize([" " + p for p in passages])]

    def encode_queries(self, queries: Sequence[str]) -> list[list[int]]:
        """Query ids as the query-likelihood terms score them: ``tok(" " + query)``."""
        _check_list(queries)
        return self.tokenize([" " + q for q in queries])

    # The sequence layout of every term (see teachers.terms), in one place: scoring, benchmarks and
    # FLOP counts all build their sequences here.

    def passage_sequences(self, passage_ids: Sequence[list[int]]) -> list[ScoringSequence]:
        """``logp_uncond``: ``[start]`` then the passage ids, one sequence per passage."""
        return [ScoringSequence([self.start_token_id], list(ids)) for ids in passage_ids]

    def query_sequences(self, queries: Sequence[str]) -> list[ScoringSequence]:
        """``logp_upr_empty``: ``[start] + tok("Passage:") + tok("\\nQuestion:")`` then the query ids, one per query."""
        head, tail = self.tokenize([UPR_PASSAGE_PREFIX, UPR_QUESTION_PREFIX])
        return [ScoringSequence([self.start_token_id, *head, *tail], q) for q in self.encode_queries(queries)]

    def pair_sequences(
        self, term: str, queries: Sequence[str], passage_ids: Sequence[list[int]]
    ) -> list[ScoringSequence]:
        """The sequences of the pair term ``term`` (of :data:`PAIR_TERMS`), one per (query, passage) pair."""
        start = [self.start_token_id]
        if term == "logp_cond":
            prefixes = self.tokenize([self.prompt.format(query=q) for q in queries])
            return [ScoringSequence(start + p, list(ids)) for p, ids in zip(prefixes, passage_ids, strict=True)]
        if term == "logp_cond_noprompt":
            prefixes = self.tokenize(queries)
            return [ScoringSequence(start + p, list(ids)) for p, ids in zip(prefixes, passage_ids, strict=True)]
        if term == "logp_upr":
            head, tail = self.tokenize([UPR_PASSAGE_PREFIX, UPR_QUESTION_PREFIX])
            query_ids = self.encode_queries(queries)
            return [
                ScoringSequence(start + head + ids[:UPR_PASSAGE_TOKENS] + tail, q)
                for q, ids in zip(query_ids, passage_ids, strict=True)
            ]
        raise ValueError(f"{term!r} is not a pair term; pair terms: {PAIR_TERMS}")

    def passage_logprobs(
        self, passage_ids: Sequence[list[int]], on_batch: Callable[[int], None] | None = None
    ) -> np.ndarray:
        """``logp_uncond`` = log p(K) of each passage, ``[n]`` float64 nats."""
        return self.scorer.logprobs(self.passage_sequences(passage_ids), on_batch)

    def query_terms(
        self, queries: Sequence[str], terms: Sequence[str], on_batch: Callable[[int], None] | None = None
    ) -> dict[str, np.ndarray]:
        """The terms named in ``terms`` (of :data:`QUERY_TERMS`) that depend on the query alone.

        Returns:
            term name -> ``[n]`` float64 nats.
        """
        if "logp_upr_empty" not in terms:
            return {}
        return {"logp_upr_empty": self.scorer.logprobs(self.query_sequences(queries), on_batch)}

    def pair_terms(
        self,
        queries: Sequence[str],
        passage_ids: Sequence[list[int]],
        terms: Sequence[str],
        on_batch: Callable[[int], None] | None = None,
    ) -> dict[str, np.ndarray]:
        """The pair terms named in ``terms`` (of :data:`PAIR_TERMS`) for each (query, passage) pair.

        All terms' sequences are scored together (one length-sorted batching).

        Returns:
            term name -> ``[n]`` float64 nats, for the terms asked for that depend on the pair.
        """
        if unknown := sorted(set(terms) - set(PAIR_TERMS) - set(QUERY_TERMS) - {"logp_uncond"}):
            raise ValueError(f"unknown term(s) {unknown}: pair terms are {list(PAIR_TERMS)}")
        wanted = [t for t in PAIR_TERMS if t in terms]
        sequences = [seq for term in wanted for seq in self.pair_sequences(term, queries, passage_ids)]
        values = self.scorer.logprobs(sequences, on_batch)
        n = len(queries)
        return {term: values[k * n : (k + 1) * n] for k, term in enumerate(wanted)}


def _check_list(texts: Sequence[str]) -> None:
    """Raises ValueError where ``texts`` is a string, not a list of texts (its characters would be the texts)."""
    if isinstance(texts, str):
        raise ValueError(f"a list of texts, not the string {texts[:40]!r}")


def _token_id(tokenizer: Any, token: int | str | None) -> int | None:
    """A start token given as an id, a digit string or a token string."""
    if token is None or isinstance(token, int):
        return token
    if token.isdigit():
        return int(token)
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise InputError(f"start token {token!r} is not in the tokenizer's vocabulary")
    return token_id
