"""What a student learns: a teacher score, or a sum of per-query z-scores of teacher scores and the first stage.

A label is an expression (parsed here, never evaluated as Python):

- ``cis``, ``upr``, ``cis_q``, ... : a score column of the teacher dataset, as it is; with named teachers
  (``data.teacher_data`` a mapping name -> folders) ``gemma.cis`` names the teacher's column;
- ``cis_q+0.5*first_stage``: a hybrid label, per query ``z(cis_q) + 0.5 · z(first_stage_score)``;
- a sum of terms ``[weight*]z(name.score)`` and ``[weight*]z(first_stage)``, joined by ``+`` or ``-``:
  ``z(gemma.cis) + z(smollm2.cis_q) + 0.25*z(first_stage)``. With a single teacher, ``z(cis)`` needs no name;
- ``z(judgment)`` in a sum: the pair's relevance grade in ``data.qrels`` (0 for a pair the qrels do not judge), so
  that queries with human judgments learn from them beside the teachers; a query the qrels do not judge at all has a
  constant grade, whose z-score is 0: its label is the other terms'.

``z`` standardises over the query's candidates (mean 0, standard deviation 1; a constant column gives 0), so a
sum weighs its terms by their weights alone, whatever each score's scale. The paper's §7 names hybrid causal +
similarity scoring as future work; an ensemble of teachers is one more such sum.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from distill.core.schema import InputError

FIRST_STAGE = "first_stage"
"""The first stage's name in a label expression."""
FIRST_STAGE_COLUMN = "first_stage_score"
JUDGMENT = "judgment"
"""The relevance grade of a pair in the qrels, in a label expression and as its column."""
UNTEACHED = (FIRST_STAGE, JUDGMENT)
"""The scores of a label that no teacher gives."""
_TOKEN = re.compile(r"\s*(?:(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_]\w*)|(?P<op>[-+*().]))")
_FORMS = "a score (cis), a hybrid (cis_q+0.5*first_stage) or a sum of z-terms (z(gemma.cis) + 0.25*z(first_stage))"


CONSTANT_SPREAD = 1e-12
"""A query whose values spread (std) less than this share of their largest magnitude is constant: what is left is
rounding (``0.1 + 0.2`` against ``0.3``), which standardising would blow up to a full-scale ranking."""


def per_query_z(values: np.ndarray, qids: Sequence[str]) -> np.ndarray:
    """``values`` standardised within each query: ``[n]`` float64, mean 0 and std 1 per query (0 where constant, by
    :data:`CONSTANT_SPREAD`).

    Each query's values are first scaled by a power of two that brings its largest magnitude into [0.5, 1), which
    changes no bit of the result but keeps the sum of squares finite for any finite values (``1e200`` squared is
    not).

    Raises:
        ValueError: a value is not finite (a NaN would zero its whole query).
    """
    values = np.asarray(values, dtype=np.float64)
    if not np.isfinite(values).all():
        raise ValueError(f"per_query_z: {int((~np.isfinite(values)).sum())} of {len(values)} values are not finite")
    _, index = np.unique(np.asarray(qids), return_inverse=True)
    largest = np.zeros(index.max(initial=-1) + 1)
    np.maximum.at(largest, index, np.abs(values))
    values = np.ldexp(values, -np.frexp(largest)[1][index])
    counts = np.bincount(index)
    mean = np.bincount(index, weights=values) / counts
    centred = values - mean[index]
    std = np.sqrt(np.bincount(index, weights=centred**2) / counts)
    spread = std[index] > CONSTANT_SPREAD  # of the largest magnitude, which the scaling made about 1
    return np.divide(centred, std[index], out=np.zeros_like(centred), where=spread)


@dataclass(frozen=True)
class Term:
    """``weight`` × a score: a teacher's column, the first stage (``score`` :data:`FIRST_STAGE`) or the qrels'
    grade (:data:`JUDGMENT`)."""

    weight: float
    score: str
    teacher: str | None = None
    """The named teacher whose column it is; None for the first stage and for an unnamed (single) teacher."""

    @property
    def name(self) -> str:
        """``gemma.cis``, ``cis`` or ``first_stage``: how the expression names it."""
        return f"{self.teacher}.{self.score}" if self.teacher else self.score

    @property
    def column(self) -> str:
        """Its column in a teachers' table (:mod:`distill.data.label_table`): the name, ``first_stage_score``
        for the first stage."""
        return FIRST_STAGE_COLUMN if self.score == FIRST_STAGE and self.teacher is None else self.name


@dataclass(frozen=True)
class LabelExpression:
    """A parsed label: one score as it is (``standardised`` False), or the sum of its terms' per-query z-scores."""

    terms: tuple[Term, ...]
    standardised: bool

    @classmethod
    def parse(cls, text: str, teachers: Sequence[str] = (), key: str = "label") -> LabelExpression:
        """Parse ``text``; ``teachers`` are the named teachers (none: a single unnamed teacher).

        Raises:
            InputError: one line naming ``key`` and the offending token (an unknown teacher, a term that is not
                standardised, a malformed weight, ...).
        """
        return _Parser(text, tuple(teachers), key).parse()

    @property
    def teachers(self) -> list[str]:
        """The named teachers the expression uses, in order of first use."""
        return list(dict.fromkeys(t.teacher for t in self.terms if t.teacher))

    @property
    def members(self) -> dict[str, str]:
        """Each term's name -> its column, for a sum of two or more terms (else empty: the label is its one
        score)."""
        return {t.name: t.column for t in self.terms} if len(self.terms) > 1 else {}

    def values(self, columns: Mapping[str, np.ndarray], qids: Sequence[str]) -> np.ndarray:
        """The label of each pair, ``[n]`` float64, from ``columns`` (each term's :attr:`Term.column` -> ``[n]``)."""
        if not self.standardised:
            return np.asarray(columns[self.terms[0].column], dtype=np.float64)
        total = None
        for term in self.terms:
            z = per_query_z(columns[term.column], qids)
            total = term.weight * z if total is None else total + term.weight * z
        return total

    def __str__(self) -> str:
        if not self.standardised:
            return self.terms[0].name
        text = ""
        for term in self.terms:
            sign = "-" if term.weight < 0 else "+"
            weight = "" if abs(term.weight) == 1 else f"{abs(term.weight)!r}*".replace(".0*", "*")
            text += (f" {sign} " if text else "-" if sign == "-" else "") + f"{weight}z({term.name})"
        return text


LabelSpec = str | Mapping[str, str]
"""A label as given (``data.label``): one expression for every candidate list, or first stage -> its expression."""


@dataclass(frozen=True)
class Labels:
    """What each candidate list learns: one :class:`LabelExpression` for every list (``by_stage`` keyed None), or
    one per first stage (keyed by its name), so that each first stage's lists weigh the first stage as its own
    score deserves (``{bm25: "z(cis_q) + 0.25*z(first_stage)", splade: "z(cis_q) + z(first_stage)"}``)."""

    by_stage: Mapping[str | None, LabelExpression]

    @classmethod
    def parse(
        cls, label: LabelSpec, teachers: Sequence[str] = (), key: str = "label", stages: Sequence[str] | None = None
    ) -> Labels:
        """Parse ``label``: a string, or a mapping with an expression for each of ``stages`` (the first stages'
        names; None when none are named).

        Raises:
            InputError: one line naming ``key`` (``key.<stage>`` for a stage's expression): a malformed expression,
                a mapping without ``stages``, a first stage without a label or a label for no first stage.
        """
        if isinstance(label, str):
            return cls({None: LabelExpression.parse(label, teachers, key)})
        if not isinstance(label, Mapping) or not label:
            raise InputError(f"{key}: expected an expression or first stage -> expression, got {label!r}")
        if stages is None:
            raise InputError(f"{key}: a label per first stage ({', '.join(map(str, label))}) needs data.first_stages")
        if unknown := [name for name in label if name not in stages]:
            raise InputError(f"{key}: {unknown[0]!r} is not a first stage of data.first_stages ({', '.join(stages)})")
        if missing := [name for name in stages if name not in label]:
            raise InputError(f"{key}: no label for the first stage {missing[0]!r}")
        by_stage = {}
        for name in stages:
            if not isinstance(label[name], str):
                raise InputError(f"{key}.{name}: expected an expression, got {label[name]!r}")
            by_stage[name] = LabelExpression.parse(label[name], teachers, f"{key}.{name}")
        return cls(by_stage)

    @property
    def terms(self) -> tuple[Term, ...]:
        """Every expression's terms, each name once (its first use kept), in order of first use."""
        first: dict[str, Term] = {}
        for expression in self.by_stage.values():
            for term in expression.terms:
                first.setdefault(term.name, term)
        return tuple(first.values())

    @property
    def teachers(self) -> list[str]:
        """The named teachers any expression uses, in order of first use."""
        return list(dict.fromkeys(t for e in self.by_stage.values() for t in e.teachers))

    @property
    def members(self) -> dict[str, str]:
        """Each term's name -> its column when the labels use two or more scores (else empty: the label is its one
        score)."""
        terms = self.terms
        return {t.name: t.column for t in terms} if len(terms) > 1 else {}

    def values(
        self, columns: Mapping[str, np.ndarray], qids: Sequence[str], stages: np.ndarray | None = None
    ) -> np.ndarray:
        """The label of each pair, ``[n]`` float64, from ``columns`` (each term's column -> ``[n]``); ``stages``
        ``[n]`` int: each pair's first stage, its index in ``by_stage``, with a label per first stage (unused with
        one label)."""
        if None in self.by_stage:
            return self.by_stage[None].values(columns, qids)
        qids, out = np.asarray(qids), np.empty(len(qids), dtype=np.float64)
        for index, expression in enumerate(self.by_stage.values()):
            rows = stages == index
            out[rows] = expression.values({c: np.asarray(v)[rows] for c, v in columns.items()}, qids[rows])
        return out

    def __str__(self) -> str:
        if None in self.by_stage:
            return str(self.by_stage[None])
        return ", ".join(f"{name}: {expression}" for name, expression in self.by_stage.items())


class _Parser:
    """``expression := ['-'] term (('+' | '-') term)*``; ``term := [number '*'] (z '(' ref ')' | ref)``;
    ``ref := name ['.' name]``. A bare ref (no ``z``) is a label on its own, or the legacy hybrid's two terms."""

    def __init__(self, text: str, teachers: tuple[str, ...], key: str) -> None:
        self.text, self.teachers, self.key = text, teachers, key
        self.tokens = self._tokenize()
        self.i = 0

    def fail(self, what: str) -> InputError:
        return InputError(f"{self.key}: {what} in {self.text.strip()!r}")

    def _tokenize(self) -> list[tuple[str, str]]:
        tokens, pos = [], 0
        while self.text[pos:].strip():
            match = _TOKEN.match(self.text, pos)
            if not match:
                raise self.fail(f"unexpected {self.text[pos:].lstrip()[0]!r}; expected {_FORMS}")
            tokens.append((match.lastgroup, match.group(match.lastgroup)))
            pos = match.end()
        if not tokens:
            raise InputError(f"{self.key}: empty; expected {_FORMS}")
        return tokens

    def peek(self, ahead: int = 0) -> tuple[str, str] | None:
        return self.tokens[self.i + ahead] if self.i + ahead < len(self.tokens) else None

    def take(self, kind: str, value: str | None = None, expected: str = "") -> str:
        token = self.peek()
        if token is None or token[0] != kind or (value is not None and token[1] != value):
            raise self.fail(f"expected {expected or repr(value)}, found {_found(token)}")
        self.i += 1
        return token[1]

    def parse(self) -> LabelExpression:
        sign = 1.0
        if self.peek() == ("op", "-"):
            self.i, sign = self.i + 1, -1.0
        terms = [self.term(sign)]
        while (token := self.peek()) is not None:
            if token not in (("op", "+"), ("op", "-")):
                raise self.fail(f"unexpected {token[1]!r} after a term; expected '+' or '-'")
            self.i += 1
            terms.append(self.term(1.0 if token[1] == "+" else -1.0))
        names = [term.name for term, _, _ in terms]
        if twice := [n for n in dict.fromkeys(names) if names.count(n) > 1]:
            raise self.fail(f"{twice[0]!r} appears more than once")
        if all(term.weight == 0 for term, _, _ in terms):
            raise self.fail("every weight is 0: the label would be the same for every pair, and teach nothing")
        bare = [term for term, z, _ in terms if not z]
        if not bare:
            return LabelExpression(tuple(term for term, _, _ in terms), True)
        (first, _, first_weighted), (last, _, _) = terms[0], terms[-1]
        if len(terms) == 1 and first.weight == 1.0 and not first_weighted:
            return LabelExpression((first,), False)
        if len(terms) == 2 and first.weight == 1.0 and not first_weighted and FIRST_STAGE == last.score != first.score:
            return LabelExpression((first, last), True)  # the hybrid cis_q+0.5*first_stage: both standardised
        allowed = {0} if len(terms) != 2 or last.score != FIRST_STAGE else {0, 1}  # where the legacy forms allow one
        culprit = next((t for i, (t, z, _) in enumerate(terms) if not z and i not in allowed), bare[0])
        raise self.fail(f"write {culprit.name!r} as z({culprit.name}) in a sum or with a weight")

    def term(self, sign: float) -> tuple[Term, bool, bool]:
        """The next term, whether it is written with ``z``, and whether it has a weight."""
        weight, weighted = sign, False
        if self.peek() is not None and self.peek()[0] == "number":
            number = self.take("number")
            self.take("op", "*", f"'*' after the weight {number}")
            weight, weighted = sign * float(number), True
            if not math.isfinite(weight):
                raise self.fail(f"the weight {number} is not a finite number")
        if self.peek() == ("name", "z") and self.peek(1) == ("op", "("):
            self.i += 2
            score, teacher = self.ref()
            self.take("op", ")", "')'")
            return Term(weight, score, teacher), True, weighted
        score, teacher = self.ref()
        return Term(weight, score, teacher), False, weighted

    def ref(self) -> tuple[str, str | None]:
        """(score, teacher) of ``score``, ``teacher.score``, ``first_stage`` or ``judgment``."""
        if self.peek() is None or self.peek()[0] != "name":
            raise self.fail(f"expected a score, teacher.score, first_stage or judgment, found {_found(self.peek())}")
        first = self.take("name")
        if self.peek() != ("op", "."):
            if first in UNTEACHED or not self.teachers:
                return first, None
            if len(self.teachers) == 1:
                return first, self.teachers[0]
            raise self.fail(f"{first!r} needs a teacher: {' or '.join(f'{t}.{first}' for t in self.teachers)}")
        self.i += 1
        score = self.take("name", expected="a score after '.'")
        if not self.teachers:
            raise self.fail(f"'{first}.{score}' names a teacher, but the teacher data is not a mapping of names")
        if first not in self.teachers:
            raise self.fail(f"unknown teacher {first!r} (teachers: {', '.join(sorted(self.teachers))})")
        return score, first


def _found(token: tuple[str, str] | None) -> str:
    return "the end" if token is None else repr(token[1])
