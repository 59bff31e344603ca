"""Pair encoding: the fast path (each distinct query and each passage encoded once by the Rust tokenizer, joined
by its post-processor) gives exactly the tokenizer's own pair encoding, and the numpy padding ``tokenizer.pad``'s."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from distill.data.loaders import load_candidates
from distill.serving.encoding import Packed, encode_pairs, pad_batch, token_count
from tests.conftest import DL19, TINY_ENCODER


@pytest.fixture(scope="module")
def tokenizer(tiny_bert):
    return AutoTokenizer.from_pretrained(tiny_bert)


def reference(tokenizer, queries: list[str], passages: list[str], max_length: int) -> tuple[list[dict], int]:
    """``tokenizer(query, passage)`` pair by pair: only_second, else longest_first; and the truncated count."""
    features, truncated = [], 0
    special = tokenizer.num_special_tokens_to_add(pair=True)
    for query, passage in zip(queries, passages, strict=True):
        q, p = (len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in (query, passage))
        strategy = "only_second" if q + special < max_length else "longest_first"
        encoded = tokenizer(query, passage, truncation=strategy, max_length=max_length)
        features.append({k: encoded[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in encoded})
        truncated += q + p + special > max_length
    return features, truncated


@pytest.mark.parametrize("max_length", [512, 64, 8])
def test_fast_pair_encoding_is_the_tokenizers_own(tokenizer, max_length: int) -> None:
    lists = load_candidates(DL19).candidates[:3]
    queries = [c.query.text for c in lists for _ in c.passages[:30]] + ["word " * 300, "rhino"]
    passages = [p.text for c in lists for p in c.passages[:30]] + ["a passage", "horn " * 600]
    encoded = encode_pairs(tokenizer, queries, passages, max_length)
    features, truncated = reference(tokenizer, queries, passages, max_length)
    assert encoded.features == features and encoded.truncated == truncated > 0
    assert max(encoded.lengths) == max_length


def test_slow_tokenizers_take_the_python_path(tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    queries, passages = ["a query", "word " * 100], ["a passage " * 50, "short"]
    fast = encode_pairs(tokenizer, queries, passages, 40)
    monkeypatch.setattr(type(tokenizer), "is_fast", property(lambda self: False))
    assert encode_pairs(tokenizer, queries, passages, 40) == fast


def test_a_token_count_is_the_tokenizers_own(tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = ["", "rhino", "What is the daily life of a Rhodes scholar like?", "horn " * 600, "naïve café, 42 × 7"]
    counts = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    assert [token_count(tokenizer, t) for t in texts] == counts and counts[3] == 600
    monkeypatch.setattr(type(tokenizer), "is_fast", property(lambda self: False))
    assert [token_count(tokenizer, t) for t in texts] == counts


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_is_tokenizer_pad(tokenizer, side: str) -> None:
    tokenizer.padding_side = side
    try:
        features = encode_pairs(tokenizer, ["a query"] * 3, ["one", "two words here", "three " * 9], 512).features
        theirs = tokenizer.pad(features, padding="longest", return_tensors="np")
        ours = pad_batch(tokenizer, features)
    finally:
        tokenizer.padding_side = "right"
    assert list(ours) == ["input_ids", "attention_mask", "token_type_ids"]
    for name, array in ours.items():
        assert array.dtype == np.int64 and np.array_equal(array, theirs[name]), name


def bpe_tokenizer(processor):
    """The conftest's byte-level BPE tokenizer (no token type ids) with ``processor`` joining pairs."""
    from tests.conftest import _train_tokenizer

    texts = [c.query.text for c in load_candidates(DL19).candidates[:2]]
    tokenizer = _train_tokenizer(texts + [p.text for c in load_candidates(DL19).candidates[:2] for p in c.passages])
    tokenizer.backend_tokenizer.post_processor = processor
    return tokenizer


@pytest.mark.parametrize("kind", ["bert", "roberta", "none", "per-pair", "left-truncation"])
def test_the_template_joins_pairs_as_the_tokenizer_does(tokenizer, kind: str, monkeypatch) -> None:
    """The pairs joined with numpy by the post-processor's template (or one by one where it has none) are the
    tokenizer's own, for BERT's template, RoBERTa's ``<s> Q </s></s> K </s>``, no special tokens at all, and a
    passage cut on the left."""
    from tokenizers import processors

    from distill.serving import encoding

    if kind == "roberta":
        tokenizer = bpe_tokenizer(processors.RobertaProcessing(("</s>", 2), ("<s>", 1)))
    elif kind == "none":
        tokenizer = bpe_tokenizer(processors.TemplateProcessing(single="$A", pair="$A $B:1"))
    elif kind == "per-pair":
        monkeypatch.setattr(encoding, "_template", lambda *args: None)
    elif kind == "left-truncation":
        monkeypatch.setattr(tokenizer, "truncation_side", "left")
    lists = load_candidates(DL19).candidates[:2]
    # an empty query; an empty passage is left out: the tokenizer takes ``text_pair=""`` for no pair at all
    queries = [c.query.text for c in lists for _ in c.passages[:20]] + ["", "word " * 300]
    passages = [p.text for c in lists for p in c.passages[:20]] + ["a passage", "horn"]
    encoded = encode_pairs(tokenizer, queries, passages, 48)
    features, truncated = reference(tokenizer, queries, passages, 48)
    names = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in features[0]]
    assert encoded.features == [{name: f[name] for name in names} for f in features]
    assert encoded.truncated == truncated > 0 and list(encoded.names) == sorted(names, key=names.index)


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_batch_of_rows_is_built_from_the_flat_ids_as_tokenizer_pad_builds_it(tokenizer, side: str, call) -> None:
    query, passages = call
    encoded = encode_pairs(tokenizer, [query] * len(passages), passages, 512)
    rows = [7, 3, 99, 0, 42]
    tokenizer.padding_side = side
    try:
        theirs = tokenizer.pad([encoded.features[i] for i in rows], padding="longest", return_tensors="np")
        ours = encoded.batch(tokenizer, rows)
        wider = encoded.batch(tokenizer, rows, length=300)
    finally:
        tokenizer.padding_side = "right"
    assert list(ours) == ["input_ids", "attention_mask", "token_type_ids"]
    for name, array in ours.items():
        assert array.dtype == np.int64 and np.array_equal(array, theirs[name]), name
        pad = wider[name][:, : 300 - array.shape[1]] if side == "left" else wider[name][:, array.shape[1] :]
        assert np.array_equal(
            wider[name][:, -array.shape[1] :] if side == "left" else wider[name][:, : array.shape[1]], array
        )
        assert (pad == (tokenizer.pad_token_id if name == "input_ids" else 0)).all()
    assert ours.lengths.tolist() == [encoded.lengths[i] for i in rows] and ours.left == (side == "left")
    assert np.array_equal(ours["attention_mask"].sum(1), ours.lengths)
    # Packed, the same rows are their tokens back to back, whether gathered from the flat ids or from the padding.
    packed = encoded.pack(rows)
    assert packed.lengths.tolist() == ours.lengths.tolist()
    assert packed.input_ids.tolist() == [t for i in rows for t in encoded.features[i]["input_ids"]]
    assert packed.token_type_ids.tolist() == [t for i in rows for t in encoded.features[i]["token_type_ids"]]
    for batch in (ours, wider, dict(wider)):
        again = Packed.of_padded(batch)
        for name in ("input_ids", "token_type_ids", "lengths"):
            assert np.array_equal(getattr(again, name), getattr(packed, name)), name


def test_the_passages_are_encoded_in_one_parallel_call_and_joined_without_per_pair_calls(
    tokenizer, call, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One ``encode_batch_fast`` (the Rust backend's parallel batch call) for the passages, one for the query, and
    the post-processor once per query (its template), not once per pair; nothing sets TOKENIZERS_PARALLELISM."""
    import os

    from distill.serving.encoding import _plain_backend

    query, passages = call
    backend = _plain_backend(tokenizer)
    calls: list[tuple[str, int]] = []

    class Spy:
        def __getattr__(self, name):
            attribute = getattr(backend, name)
            if not callable(attribute):
                return attribute

            def spied(*args, **kwargs):
                calls.append((name, len(args[0]) if name.startswith("encode_batch") else 1))
                return attribute(*args, **kwargs)

            return spied

    before = os.environ.get("TOKENIZERS_PARALLELISM")
    want = encode_pairs(tokenizer, [query] * 100, passages, 512)
    monkeypatch.setattr("distill.serving.encoding._plain_backend", lambda tokenizer: Spy())
    assert encode_pairs(tokenizer, [query] * 100, passages, 512) == want
    assert sorted(calls) == [("encode_batch_fast", 1), ("encode_batch_fast", 100), ("post_process", 1)]
    assert os.environ.get("TOKENIZERS_PARALLELISM") == before


def long_documents(call) -> list[str]:
    """Documents many times the pair's length, among them text with few tokens a character past the prefix's cut
    (one unbroken word, combining marks, runs of spaces), where the prefix cannot stand for the whole."""
    _, passages = call
    prose = " ".join(passages)  # about 60 k characters of DL19 passages
    return [
        prose,
        prose[:9000],
        "x" * 20_000 + " " + prose,  # one word longer than the cut: an [UNK] or a few BPE tokens
        "\u0301" * 12_000 + " " + prose,  # combining marks, which BERT's normaliser strips
        "  " * 6_000 + prose,  # the spaces before the first word
        "a " * 5_000,
    ]


@pytest.mark.parametrize("kind", ["bert", "roberta"])
@pytest.mark.parametrize("max_length", [512, 64])
def test_long_documents_encoded_from_a_prefix_keep_the_tokenizers_own_ids(
    tokenizer, kind: str, max_length: int, call
) -> None:
    from tokenizers import processors

    if kind == "roberta":
        tokenizer = bpe_tokenizer(processors.RobertaProcessing(("</s>", 2), ("<s>", 1)))
    documents = long_documents(call)
    queries = [call[0]] * len(documents)
    encoded = encode_pairs(tokenizer, queries, documents, max_length)
    features, truncated = reference(tokenizer, queries, documents, max_length)
    names = list(encoded.names)
    assert encoded.features == [{name: f[name] for name in names} for f in features]
    assert encoded.truncated == truncated == len(documents)


def test_a_long_document_is_encoded_from_its_prefix_only(tokenizer, call, monkeypatch: pytest.MonkeyPatch) -> None:
    """The longest text the Rust backend gets is the cut (16 characters a token of the pair's length) and the rest
    of its last word, not the megabytes sent; text whose prefix gives too few tokens is encoded whole."""
    from distill.serving.encoding import _plain_backend
    from distill.serving.prefixes import CHARS_PER_TOKEN

    backend = _plain_backend(tokenizer)
    seen: list[int] = []

    class Spy:
        def __getattr__(self, name):
            attribute = getattr(backend, name)
            if name.startswith("encode_batch"):

                def spied(texts, *args, **kwargs):
                    seen.extend(map(len, texts))
                    return attribute(texts, *args, **kwargs)

                return spied
            return attribute

    monkeypatch.setattr("distill.serving.encoding._plain_backend", lambda tokenizer: Spy())
    documents = [" ".join(call[1]) * 40, "x" * 20_000 + " word"]
    encode_pairs(tokenizer, [call[0]] * 2, documents, 128)
    limit = CHARS_PER_TOKEN * 128
    assert limit <= seen[1] < limit + 100  # the prose: its prefix, to the end of a word
    # the unbroken word's prefix (20,000 characters) gave too few tokens: that document is encoded again, whole
    assert seen[2:] == [20_000, 20_005] and len(documents[0]) > 1_000_000


def test_only_tokenizers_that_split_words_at_spaces_are_encoded_from_a_prefix() -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from distill.serving.prefixes import splits_at_spaces

    def spec(pre_tokenizer, normalizer=None) -> bool:
        backend = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
        if pre_tokenizer is not None:
            backend.pre_tokenizer = pre_tokenizer
        if normalizer is not None:
            backend.normalizer = normalizer
        return splits_at_spaces(backend)

    split_gpt4 = pre_tokenizers.Split(r"\p{L}+", "isolated")
    assert spec(pre_tokenizers.BertPreTokenizer(), normalizers.BertNormalizer())
    assert spec(pre_tokenizers.ByteLevel()) and not spec(pre_tokenizers.ByteLevel(use_regex=False))
    assert spec(pre_tokenizers.Metaspace()) and not spec(pre_tokenizers.Metaspace(split=False))
    assert spec(pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]))
    assert not spec(pre_tokenizers.Sequence([split_gpt4, pre_tokenizers.ByteLevel(use_regex=False)]))
    assert not spec(None) and not spec(pre_tokenizers.Punctuation())
    assert not spec(pre_tokenizers.WhitespaceSplit(), normalizers.Replace(" ", ""))  # spaces removed: words join
    assert spec(pre_tokenizers.WhitespaceSplit(), normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase()]))


def test_a_roberta_student_takes_as_many_tokens_as_its_positions_hold(tiny_bert, tmp_path) -> None:
    """RoBERTa's position ids start at ``pad_token_id + 1``: of 66 embeddings, 64 hold a token. The limit was 66,
    and a pair that long was an IndexError's traceback in export, rerank and bench."""
    import torch
    from transformers import RobertaConfig, RobertaForSequenceClassification

    from distill.serving.reranker import Reranker

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    tokenizer.model_max_length = int(1e30)  # a tokenizer that names no limit: the config's positions decide
    config = RobertaConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=66, num_labels=1, **TINY_ENCODER)
    torch.manual_seed(0)
    RobertaForSequenceClassification(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    reranker = Reranker.load(tmp_path, backend="torch", interpolation=False)
    assert reranker.max_length == 64
    scores = reranker.score("how long do fleas live", ["fleas " * 300, "a short passage"])
    assert np.isfinite(scores).all() and reranker.truncated == 1
