"""The scorer and the score conventions, on a tiny random Llama."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from teachers import SCORES, CausalLMTeacher, required_terms
from teachers.causal_lm import ScorerOptions, ScoringSequence, target_logprobs


def naive_logprob(model: torch.nn.Module, prefix: list[int], target: list[int]) -> float:
    """One sequence, full logits, full log-softmax: the textbook computation."""
    with torch.no_grad():
        logits = model(torch.tensor([prefix + target])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return sum(logp[len(prefix) - 1 + i, t].item() for i, t in enumerate(target))


@pytest.fixture(scope="module")
def teacher(tiny_llama: Path) -> CausalLMTeacher:
    return CausalLMTeacher.load(str(tiny_llama), logit_chunk_rows=7, options=ScorerOptions(max_batch_tokens=64))


def test_target_logprobs_chunked_equals_full_log_softmax() -> None:
    torch.manual_seed(1)
    hidden, head = torch.randn(23, 16), torch.nn.Linear(16, 50, bias=False)
    targets = torch.randint(0, 50, (23,))
    full = torch.log_softmax(head(hidden), -1).gather(1, targets[:, None]).squeeze(1)
    for rows in (1, 5, 23, 100):
        torch.testing.assert_close(target_logprobs(hidden, head, targets, rows), full)
    capped = torch.log_softmax(torch.tanh(head(hidden) / 3.0) * 3.0, -1).gather(1, targets[:, None]).squeeze(1)
    torch.testing.assert_close(target_logprobs(hidden, head, targets, 4, softcap=3.0), capped)


def test_scorer_matches_one_at_a_time_full_softmax(teacher: CausalLMTeacher) -> None:
    rng = np.random.default_rng(0)
    vocab = teacher.scorer.model.config.vocab_size
    seqs = [
        ScoringSequence([1, *rng.integers(3, vocab, p).tolist()], rng.integers(3, vocab, t).tolist())
        for p, t in [(0, 5), (3, 1), (10, 30), (2, 17), (25, 4), (1, 60)]
    ]
    got = teacher.scorer.logprobs(seqs)
    want = [naive_logprob(teacher.scorer.model, s.prefix, s.target) for s in seqs]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_scores_do_not_depend_on_batching(teacher: CausalLMTeacher) -> None:
    rng = np.random.default_rng(1)
    vocab = teacher.scorer.model.config.vocab_size
    seqs = [ScoringSequence([1], rng.integers(3, vocab, n).tolist()) for n in rng.integers(1, 40, 25)]
    small = teacher.scorer.logprobs(seqs)
    teacher.scorer.options.max_batch_tokens = 10_000
    try:
        large = teacher.scorer.logprobs(seqs)
    finally:
        teacher.scorer.options.max_batch_tokens = 64
    np.testing.assert_allclose(small, large, rtol=1e-5, atol=1e-4)


def test_rejects_empty_prefix_or_target(teacher: CausalLMTeacher) -> None:
    with pytest.raises(ValueError, match="sequence 1"):
        teacher.scorer.logprobs([ScoringSequence([1], [5]), ScoringSequence([1], [])])


def test_term_conventions(teacher: CausalLMTeacher) -> None:
    """Each term is the exact prefix/target convention of the issue, checked against the naive computation."""
    tok, model, bos = teacher.tokenizer, teacher.scorer.model, teacher.start_token_id
    assert bos == tok.bos_token_id
    query, passage = "how long is life cycle of flea", "The life cycle of a flea can last anywhere from 20 days."

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    passage_ids = teacher.encode_passages([passage])[0]
    assert passage_ids == ids(" " + passage)
    terms = teacher.pair_terms([query], [passage_ids], ["logp_cond", "logp_cond_noprompt", "logp_upr"])
    expected = {
        "logp_cond": naive_logprob(model, [bos, *ids(f"Q: {query} A:")], passage_ids),
        "logp_cond_noprompt": naive_logprob(model, [bos, *ids(query)], passage_ids),
        "logp_upr": naive_logprob(
            model, [bos, *ids("Passage:"), *passage_ids[:200], *ids("\nQuestion:")], ids(" " + query)
        ),
    }
    for term, value in expected.items():
        assert terms[term][0] == pytest.approx(value, rel=1e-5, abs=1e-4), term
    uncond = teacher.passage_logprobs([passage_ids])[0]
    assert uncond == pytest.approx(naive_logprob(model, [bos], passage_ids), rel=1e-5, abs=1e-4)


def test_passages_are_truncated_and_upr_sees_200_tokens(tiny_llama: Path) -> None:
    teacher = CausalLMTeacher.load(str(tiny_llama), max_passage_tokens=230)
    long_passage = " ".join(["flea larvae hatch"] * 200)
    ids = teacher.encode_passages([long_passage])[0]
    assert len(ids) == 230
    model, bos, tok = teacher.scorer.model, teacher.start_token_id, teacher.tokenizer
    q = tok(" when do fleas hatch", add_special_tokens=False)["input_ids"]
    head, tail = (tok(t, add_special_tokens=False)["input_ids"] for t in ("Passage:", "\nQuestion:"))
    upr = teacher.pair_terms(["when do fleas hatch"], [ids], ["logp_upr"])["logp_upr"][0]
    assert upr == pytest.approx(naive_logprob(model, [bos, *head, *ids[:200], *tail], q), rel=1e-5, abs=1e-4)
    with pytest.raises(ValueError, match="max_passage_tokens must be positive, got -3"):  # dropped 3 tokens silently
        CausalLMTeacher.load(str(tiny_llama), max_passage_tokens=-3)


def test_start_token_override_changes_the_prefix(tiny_llama: Path) -> None:
    by_id = CausalLMTeacher.load(str(tiny_llama), start_token=2)
    by_name = CausalLMTeacher.load(str(tiny_llama), start_token="</s>")
    assert by_id.start_token_id == by_name.start_token_id == 2
    ids = by_id.encode_passages(["fleas"])
    assert by_id.passage_logprobs(ids)[0] == pytest.approx(by_name.passage_logprobs(ids)[0])
    default = CausalLMTeacher.load(str(tiny_llama))
    assert default.passage_logprobs(ids)[0] != pytest.approx(by_id.passage_logprobs(ids)[0])
    with pytest.raises(ValueError, match="not in the tokenizer"):
        CausalLMTeacher.load(str(tiny_llama), start_token="<no-such-token>")
    vocabulary = default.scorer.model.get_input_embeddings().num_embeddings
    for token in (vocabulary, -5, str(vocabulary + 7)):  # an IndexError (an OverflowError) once scoring began
        with pytest.raises(ValueError, match=f"start token id .* not in the teacher's vocabulary of {vocabulary} ids"):
            CausalLMTeacher.load(str(tiny_llama), start_token=token)
    with pytest.raises(ValueError, match="logit_chunk_rows must be positive, got 0"):
        CausalLMTeacher.load(str(tiny_llama), logit_chunk_rows=0)


def test_score_definitions() -> None:
    terms = {
        "logp_cond": np.array([-10.0]),
        "logp_uncond": np.array([-14.0]),
        "logp_cond_noprompt": np.array([-12.0]),
        "logp_upr": np.array([-3.0]),
    }
    assert SCORES["cis"](terms)[0] == 4.0
    assert SCORES["cond"](terms)[0] == -10.0
    assert SCORES["noprompt"](terms)[0] == 2.0
    assert SCORES["upr"](terms)[0] == -3.0
    assert required_terms(["upr"]) == ["logp_cond", "logp_uncond", "logp_upr"]
    with pytest.raises(ValueError, match="unknown score"):
        required_terms(["bm25"])


def test_a_string_for_a_list_and_an_unknown_term_are_refused(teacher: CausalLMTeacher) -> None:
    with pytest.raises(ValueError, match="a list of texts, not the string 'hello'"):
        teacher.encode_passages("hello")  # its five characters would have been five passages
    ids = teacher.encode_passages(["a passage"])
    with pytest.raises(ValueError, match=r"unknown term\(s\) \['cis'\]: pair terms are"):
        teacher.pair_terms(["a query"], ids, ["cis"])  # a score, not a term: {} came back


def test_a_special_tokens_text_in_a_passage_is_text_not_the_control_token(teacher: CausalLMTeacher) -> None:
    special = teacher.tokenizer.all_special_tokens[0]
    (ids,) = teacher.encode_passages([f"a passage with {special} inside"])
    assert teacher.tokenizer.convert_tokens_to_ids(special) not in ids  # an injected BOS or EOS before
    assert teacher.tokenizer.decode(ids).strip() == f"a passage with {special} inside"
