"""The options of ``distill teach`` (:class:`TeachConfig`), checked as they are given."""

from __future__ import annotations

from dataclasses import dataclass, field

from distill.core.schema import InputError
from distill.model.resolver import DEFAULT_TEACHER
from distill.stages.teach_input import InputOptions
from teachers.causal_lm import ScorerOptions
from teachers.embedding import SIMILARITY
from teachers.terms import DEFAULT_PROMPT, LOGIT_CHUNK_ROWS, MAX_PASSAGE_TOKENS, SCORES, prompt_fault, required_terms


@dataclass
class TeachConfig(ScorerOptions, InputOptions):
    """Options of ``distill teach``: score every (query, candidate) pair with a causal-LM teacher, or with an
    embedding model (``scores: [similarity]``). How the inputs are read is :class:`InputOptions`'; the teacher's
    batch budget and speed levers, :class:`~teachers.causal_lm.ScorerOptions`'."""

    output: str | None = None
    """The dataset folder to write (required; ``distill run`` sets it)."""
    teacher: str = DEFAULT_TEACHER
    """A hub id, a local model folder, a .gguf file or an embedded alias (see ``distill.model.resolver``): a causal LM,
    or with ``scores: [similarity]`` a sentence-embedding model."""
    scores: list[str] = field(default_factory=lambda: ["cis"])
    """Scores to compute; the first is the dataset's primary label. For a causal LM, ``cis`` is always included.
    ``similarity`` alone makes the teacher an embedding model: the cosine of the query's and the passage's
    mean-pooled embeddings (:mod:`teachers.embedding`)."""
    max_queries: int | None = None
    """Score only the first N queries of the input."""
    start_token: int | str | None = None
    """Token every prefix starts with (id or string); default the tokenizer's BOS, else EOS."""
    max_passage_tokens: int = MAX_PASSAGE_TOKENS
    """Passage ids are truncated to this many tokens."""
    prompt: str = DEFAULT_PROMPT
    """The QA prompt of log p(K | Q), with a ``{query}`` field."""
    dtype: str = "auto"
    """``auto`` (bf16 on GPU, fp32 on CPU), ``float32``, ``bfloat16`` or ``float16``."""
    device_map: str | None = None
    """``auto`` shards one model over all visible GPUs (model parallel, one process)."""
    logit_chunk_rows: int = LOGIT_CHUNK_ROWS
    """Target positions per LM-head chunk (memory: rows x vocabulary fp32 values)."""
    chunk_size: int = 256
    """Pairs (or passages) per unit of work, the granularity of sharding and resuming."""
    cache_dir: str | None = None
    """Where log p(K) is cached; default ``$CIS_DISTILL_CACHE/pk`` (``~/.cache/cis-distill/pk``)."""
    reuse: list[str] = field(default_factory=list)
    """Teacher dataset folders made under the same teacher fingerprint (everything but the input and the scores):
    pairs found there (same qid, docid, query and passage text) take their terms from there instead of being
    scored, and their passages' log p(K) and queries' terms seed the caches. A folder of another fingerprint is
    refused; one without every term these scores need lends only its log p(K) and query terms."""
    overwrite: bool = False
    """Replace an output (or partial results) made by another configuration."""
    progress: bool = True
    """Show progress bars."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.input, str):  # Python callers may name one input
            self.input = [self.input]
        if isinstance(self.scores, str):
            self.scores = [s.strip() for s in self.scores.split(",") if s.strip()]
        if isinstance(self.reuse, str):
            self.reuse = [s.strip() for s in self.reuse.split(",") if s.strip()]
        if not self.input:
            raise InputError("teach: input is required (--input or input: in the config)")
        if not self.output:
            raise InputError("teach: output is required (--output or output: in the config)")
        if not self.scores:
            raise InputError(f"teach: scores: none given; one or more of {', '.join(SCORES)}, or {SIMILARITY}")
        if SIMILARITY in self.scores:
            if self.scores != [SIMILARITY]:
                raise InputError(
                    f"teach: scores: {SIMILARITY} is an embedding model's score and cannot be mixed with a causal "
                    f"LM's ({', '.join(s for s in self.scores if s != SIMILARITY)}): teach them in two runs"
                )
            if self.reuse:
                raise InputError(f"teach: reuse: only a causal LM's scores are reused, not {SIMILARITY}")
        else:
            try:
                required_terms(self.scores)
            except ValueError as e:
                raise InputError(f"teach: scores: {e}; or {SIMILARITY} (an embedding model)") from None
        for name in ("chunk_size", "max_passage_tokens", "max_queries", "logit_chunk_rows"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise InputError(f"teach: {name} must be positive, got {getattr(self, name)}")
        if not self.similarity and (fault := prompt_fault(self.prompt)):
            raise InputError(f"teach: prompt {self.prompt!r}: {fault}")

    @property
    def similarity(self) -> bool:
        """The teacher is an embedding model (:mod:`teachers.embedding`), not a causal LM."""
        return self.scores == [SIMILARITY]

    @property
    def score_columns(self) -> list[str]:
        return list(self.scores) if self.similarity else list(dict.fromkeys(["cis", *self.scores]))
