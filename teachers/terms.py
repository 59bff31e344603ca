"""The teacher scores and the token sequences behind them.

Every score is built from log-probability *terms*, each a sum of token log-probabilities
(natural log) of a target given a prefix (see :class:`teachers.causal_lm.ScoringSequence`):

================== ======================================================== =====================
term               prefix ids                                               target ids
================== ======================================================== =====================
logp_cond          [start] + tok("Q: {query} A:")                           passage ids
logp_uncond        [start]                                                  passage ids
logp_cond_noprompt [start] + tok("{query}")                                 passage ids
logp_upr           [start] + tok("Passage:") + passage ids[:200]            tok(" " + query)
                   + tok("\\nQuestion:")
logp_upr_empty     [start] + tok("Passage:") + tok("\\nQuestion:")            tok(" " + query)
================== ======================================================== =====================

Passage ids are ``tok(" " + passage)`` truncated to ``max_passage_tokens``; ``tok`` adds no
special tokens. ``logp_uncond`` depends on the passage alone and is computed once per passage;
``logp_upr_empty`` depends on the query alone and is computed once per query.

A per-token score divides by a token count that every teacher dataset keeps:
``n_passage_tokens`` (the passage ids) or ``n_query_tokens`` (``tok(" " + query)``).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PROMPT = "Q: {query} A:"
"""The QA prompt of log p(K | Q): the query in its one field, ``{query}``; the passage follows it."""
MAX_PASSAGE_TOKENS = 256
"""Passage ids are truncated to this many tokens unless the teacher is told otherwise."""
LOGIT_CHUNK_ROWS = 1024
"""Target positions per LM-head chunk unless the teacher is told otherwise (memory: rows x vocabulary fp32)."""
UPR_PASSAGE_PREFIX = "Passage:"
UPR_QUESTION_PREFIX = "\nQuestion:"
UPR_PASSAGE_TOKENS = 200

PAIR_TERMS = ("logp_cond", "logp_cond_noprompt", "logp_upr")
"""Terms that depend on the (query, passage) pair; ``logp_uncond`` depends on the passage only."""
QUERY_TERMS = ("logp_upr_empty",)
"""Terms that depend on the query only."""


@dataclass(frozen=True)
class ScoreDefinition:
    """score = (``plus`` term − ``minus`` term) / ``per_token`` count, the parts that are set.

    Terms are summed log-probabilities in nats; a per-token score is in nats per token.
    """

    name: str
    plus: str
    minus: str | None
    description: str
    per_token: str | None = None
    """A token count to divide by (``n_passage_tokens`` or ``n_query_tokens``), or None for a summed score."""

    @property
    def terms(self) -> tuple[str, ...]:
        return (self.plus,) if self.minus is None else (self.plus, self.minus)

    def __call__(self, terms: dict) -> object:
        """The score from a mapping of term (and token count) name to value (numbers or arrays)."""
        value = terms[self.plus] if self.minus is None else terms[self.plus] - terms[self.minus]
        return value if self.per_token is None else value / terms[self.per_token]


SCORES: dict[str, ScoreDefinition] = {
    s.name: s
    for s in (
        ScoreDefinition("cis", "logp_cond", "logp_uncond", "CIS = log p(K | prompt(Q)) - log p(K) (the paper)"),
        ScoreDefinition("cond", "logp_cond", None, "log p(K | prompt(Q)), the paper's 'w/o p(K)' ablation"),
        ScoreDefinition(
            "noprompt", "logp_cond_noprompt", "logp_uncond", "CIS with plain concatenation, the 'w/o prompt' ablation"
        ),
        ScoreDefinition("upr", "logp_upr", None, "query likelihood log p(Q | K), the UPR baseline"),
        ScoreDefinition(
            "cis_q",
            "logp_upr",
            "logp_upr_empty",
            "CIS in the query direction: log p(Q | K) - log p(Q | empty passage) (Bayes: = log p(K|Q) - log p(K))",
        ),
        ScoreDefinition("cis_mean", "logp_cond", "logp_uncond", "CIS per passage token", "n_passage_tokens"),
        ScoreDefinition("cis_q_mean", "logp_upr", "logp_upr_empty", "cis_q per query token", "n_query_tokens"),
    )
}


def required_terms(scores: list[str]) -> list[str]:
    """The terms that ``scores`` need; ``logp_cond`` and ``logp_uncond`` are always kept."""
    unknown = [s for s in scores if s not in SCORES]
    if unknown:
        raise ValueError(f"unknown score(s) {unknown}; choose from {sorted(SCORES)}")
    terms = ["logp_cond", "logp_uncond"]
    for score in scores:
        terms.extend(t for t in SCORES[score].terms if t not in terms)
    return terms


def prompt_fault(prompt: str) -> str | None:
    """Why ``prompt`` cannot be the QA prompt (None where it can): it must hold the field ``{query}`` and no other
    (the passage follows the prompt; it is no field), in ``str.format`` syntax (``{{`` for a literal brace)."""
    import string

    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(prompt) if name is not None}
    except ValueError as e:  # a lone "{" or "}"
        return f"not a format string ({e}; write {{{{ or }}}} for a brace)"
    if "query" not in fields:
        return "must contain '{query}'"
    others = sorted(fields - {"query"})
    if others:
        return f"has fields {others} besides '{{query}}' (the passage follows the prompt)"
    return None
