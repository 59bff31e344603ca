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
================== ======================================================== =====================

Passage ids are ``tok(" " + passage)`` truncated to ``max_passage_tokens``; ``tok`` adds no
special tokens. ``logp_uncond`` depends on the passage alone and is computed once per passage.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PROMPT = "Q: {query} A:"
UPR_PASSAGE_PREFIX = "Passage:"
UPR_QUESTION_PREFIX = "\nQuestion:"
UPR_PASSAGE_TOKENS = 200

PAIR_TERMS = ("logp_cond", "logp_cond_noprompt", "logp_upr")
"""Terms that depend on the (query, passage) pair; ``logp_uncond`` depends on the passage only."""


@dataclass(frozen=True)
class ScoreDefinition:
    """score = ``plus`` term − ``minus`` term (or the ``plus`` term alone)."""

    name: str
    plus: str
    minus: str | None
    description: str

    @property
    def terms(self) -> tuple[str, ...]:
        return (self.plus,) if self.minus is None else (self.plus, self.minus)

    def __call__(self, terms: dict) -> object:
        """The score from a mapping of term name to value (numbers or arrays)."""
        return terms[self.plus] if self.minus is None else terms[self.plus] - terms[self.minus]


SCORES: dict[str, ScoreDefinition] = {
    s.name: s
    for s in (
        ScoreDefinition("cis", "logp_cond", "logp_uncond", "CIS = log p(K | prompt(Q)) - log p(K) (the paper)"),
        ScoreDefinition("cond", "logp_cond", None, "log p(K | prompt(Q)), the paper's 'w/o p(K)' ablation"),
        ScoreDefinition(
            "noprompt", "logp_cond_noprompt", "logp_uncond", "CIS with plain concatenation, the 'w/o prompt' ablation"
        ),
        ScoreDefinition("upr", "logp_upr", None, "query likelihood log p(Q | K), the UPR baseline"),
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
