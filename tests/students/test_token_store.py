"""The student's tokenised, memory-mapped, cached pairs (students/token_store.py) and the data module on them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from distill.data.label_table import SOURCE, SOURCE_ROW, load_label_table
from distill.data.teacher_data import TeacherDataset
from students import token_store
from students.data import StudentDataModule
from students.token_store import open_store

REPO = Path(__file__).resolve().parents[2]
DL2122 = [str(REPO / "data/teacher/dl21-bm25-smollm2"), str(REPO / "data/teacher/dl22-bm25-smollm2")]


def store_of(folders: list[str], tokenizer, cache: Path, max_length: int = 512, label: str = "cis"):
    labelled = load_label_table(folders, label)
    table = labelled.table
    return open_store(
        cache, labelled.sources, table[SOURCE].to_numpy(), table[SOURCE_ROW].to_numpy(), tokenizer, max_length
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_bert: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_bert)


def reference(folders: list[str], tokenizer, max_length: int):
    """What ``tokenizer(query, passage, truncation="only_second")`` gives every pair of ``folders``, and the pairs
    it truncates (counted from the untruncated lengths), in the label table's order."""
    texts = [TeacherDataset.open(f).to_pandas(["query", "passage"]) for f in folders]
    table = load_label_table(folders, "cis").table
    queries = [texts[s]["query"][r] for s, r in zip(table[SOURCE], table[SOURCE_ROW], strict=True)]
    passages = [texts[s]["passage"][r] for s, r in zip(table[SOURCE], table[SOURCE_ROW], strict=True)]
    encoded = tokenizer(queries, passages, truncation="only_second", max_length=max_length)
    full = tokenizer(queries, passages)["input_ids"]
    return encoded, sum(len(ids) > max_length for ids in full)


@pytest.mark.parametrize("max_length", [512, 48])
def test_the_store_holds_what_the_tokenizer_gives(tokenizer, tmp_path: Path, max_length: int) -> None:
    store = store_of(DL2122[:1], tokenizer, tmp_path, max_length)
    encoded, truncated = reference(DL2122[:1], tokenizer, max_length)
    assert len(store) == len(encoded["input_ids"]) == 5300
    assert store.tokens.dtype == np.uint16  # 30,522 ids fit 16 bits
    rows = np.arange(len(store))
    tokens, lengths, query_lengths = store.pairs(rows)
    assert lengths.tolist() == [len(ids) for ids in encoded["input_ids"]]
    assert tokens.tolist() == [t for ids in encoded["input_ids"] for t in ids]
    assert query_lengths.tolist() == [types.index(1) for types in encoded["token_type_ids"]]
    assert store.truncated == truncated and (truncated > 0) == (max_length == 48)
    # any subset, in any order
    some = np.array([4000, 3, 17, 3])
    tokens, lengths, _ = store.pairs(some)
    assert tokens.tolist() == [t for i in some for t in encoded["input_ids"][i]]


def test_a_store_is_reused_only_under_the_same_key(
    tokenizer, tmp_path: Path, teacher_dataset: Path, tiny_llama: Path
) -> None:
    from transformers import AutoTokenizer

    # two folders: the tiny teacher's triplets and a copy of their first half
    dataset = TeacherDataset.open(teacher_dataset)
    half = tmp_path / "half"
    TeacherDataset.write(dataset.table().slice(0, dataset.table().num_rows // 2), dataset.metadata, half)
    folders = [str(teacher_dataset), str(half)]
    first = store_of(folders, tokenizer, tmp_path)
    again = store_of(folders, tokenizer, tmp_path)
    assert again.path == first.path and again.manifest == first.manifest  # reopened, not rebuilt
    # the label does not change the tokens: the same store serves it
    assert store_of(folders, tokenizer, tmp_path, label="upr").path == first.path
    # what does change them gives a store of its own
    others = {
        "max_length": store_of(folders, tokenizer, tmp_path, max_length=256),
        "rows": store_of(folders[:1], tokenizer, tmp_path),
        "order": store_of(folders[::-1], tokenizer, tmp_path),
        "tokenizer": store_of(folders, AutoTokenizer.from_pretrained(tiny_llama), tmp_path),
    }
    assert len({first.path, *(store.path for store in others.values())}) == 1 + len(others)
    # the same folder rewritten (new contents, same path) is another key
    copy = tmp_path / "copy"
    shutil.copytree(teacher_dataset, copy)
    before = store_of([str(copy)], tokenizer, tmp_path)
    table = TeacherDataset.open(copy).table()
    shutil.rmtree(copy)
    TeacherDataset.write(table, TeacherDataset.open(teacher_dataset).metadata, copy)
    assert store_of([str(copy)], tokenizer, tmp_path).path != before.path


def test_a_killed_or_damaged_build_is_rebuilt_never_read(
    tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    encode = token_store._pair_tokenizer

    class Killed(Exception):
        pass

    def dying(tok, max_length):
        backend = encode(tok, max_length)

        class Dies:
            def encode_batch(self, pairs):
                calls["n"] += 1
                if calls["n"] == 2:
                    raise Killed  # mid-build, after one chunk was written
                return backend.encode_batch(pairs)

        return Dies()

    monkeypatch.setattr(token_store, "CHUNK_PAIRS", 1000)
    monkeypatch.setattr(token_store, "_pair_tokenizer", dying)
    with pytest.raises(Killed):
        store_of(DL2122[:1], tokenizer, tmp_path)
    assert all(p.name.startswith(".") for p in tmp_path.iterdir() if p.is_dir())  # only a partial folder
    monkeypatch.setattr(token_store, "_pair_tokenizer", encode)
    store = store_of(DL2122[:1], tokenizer, tmp_path)
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]  # the stale partial build is gone
    good = store.tokens.tolist()

    # a truncated token file, or a folder without its manifest, under the key: rebuilt, same tokens
    with open(store.path / "tokens.bin", "r+b") as f:
        f.truncate(100)
    rebuilt = store_of(DL2122[:1], tokenizer, tmp_path)
    assert rebuilt.tokens.tolist() == good
    (rebuilt.path / "manifest.json").unlink()
    assert store_of(DL2122[:1], tokenizer, tmp_path).tokens.tolist() == good
    manifest = json.loads((rebuilt.path / "manifest.json").read_text())
    manifest["key"] = "another"
    (rebuilt.path / "manifest.json").write_text(json.dumps(manifest))
    assert store_of(DL2122[:1], tokenizer, tmp_path).manifest["key"] == rebuilt.manifest["key"]


def damage(path: Path, how: str) -> None:
    """Zero the file at ``path`` (its size kept), or flip one byte in its middle."""
    data = bytearray(path.read_bytes())
    if how == "zeroed":
        data = bytearray(len(data))
    else:
        data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    token_store._checked.clear()  # as a later process finds it: nothing checked yet


@pytest.mark.parametrize(
    ("name", "how"), [("tokens.bin", "zeroed"), ("tokens.bin", "flipped"), ("lengths.npy", "flipped")]
)
def test_a_store_damaged_at_the_same_size_is_rebuilt_with_one_warning(
    tokenizer, tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, how: str
) -> None:
    store = store_of(DL2122[:1], tokenizer, tmp_path)
    good, sizes = store.tokens.tolist(), store.manifest["sizes"]
    assert set(store.manifest["checksums"]) == set(sizes)
    assert all(c.startswith("xxh3_128:") for c in store.manifest["checksums"].values())
    token_store._checked.clear()
    reopened = store_of(DL2122[:1], tokenizer, tmp_path)
    assert reopened.verify_seconds > 0 and reopened.manifest == store.manifest  # checked, not rebuilt
    del store, reopened  # their maps
    damage(tmp_path / good_key(tmp_path) / name, how)
    assert (tmp_path / good_key(tmp_path) / name).stat().st_size == sizes[name]
    with caplog.at_level("WARNING", logger="students.token_store"):
        rebuilt = store_of(DL2122[:1], tokenizer, tmp_path)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and f"/{name} does not match its checksum" in warnings[0], warnings
    assert rebuilt.tokens.tolist() == good and rebuilt.verify_seconds == 0.0
    # rebuilt once: the next open (in a later process) finds it whole
    caplog.clear()
    token_store._checked.clear()
    with caplog.at_level("WARNING", logger="students.token_store"):
        assert store_of(DL2122[:1], tokenizer, tmp_path).tokens.tolist() == good
    assert not caplog.records


def good_key(cache: Path) -> str:
    [folder] = [p.name for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return folder


def test_a_store_of_an_earlier_version_without_checksums_is_rebuilt(tokenizer, tmp_path: Path) -> None:
    store = store_of(DL2122[:1], tokenizer, tmp_path)
    manifest = dict(store.manifest)
    del manifest["checksums"]
    (store.path / "manifest.json").write_text(json.dumps(manifest))
    token_store._checked.clear()
    assert "checksums" in store_of(DL2122[:1], tokenizer, tmp_path).manifest


def data_module(cache: Path, backbone: str, **options) -> StudentDataModule:
    return StudentDataModule(
        DL2122, label="cis", backbone=backbone, val_queries=8, cache_dir=str(cache), seed=3, **options
    )


def reference_batch(split, tokenizer, texts: dict, index: list[int], multiple: int) -> dict:
    """The batch of positions ``index`` of ``split`` as the tokenizer makes it: encode, then ``pad``."""
    keys = list(zip(split.qid, split.docid, strict=True))
    pairs = [texts[keys[i]] for i in index]
    encoded = tokenizer([q for q, _ in pairs], [p for _, p in pairs], truncation="only_second", max_length=512)
    features = [
        {k: encoded[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")} for i in range(len(index))
    ]
    return dict(tokenizer.pad(features, pad_to_multiple_of=multiple if multiple > 1 else None, return_tensors="pt"))


@pytest.mark.slow
def test_training_from_the_mapped_data_is_the_tokenizers_training_to_the_bit(tiny_bert: Path, tmp_path: Path) -> None:
    """DL21 + DL22: every batch the loader gathers equals the tokenizer's own encoding and padding of the same
    pairs, so a model trained on the loader's batches ends with the weights of one trained on the tokenizer's."""
    from transformers import AutoModelForSequenceClassification

    texts = {}
    for folder in DL2122:
        frame = TeacherDataset.open(folder).to_pandas(["qid", "docid", "query", "passage"])
        texts.update({(q, d): (a, b) for q, d, a, b in frame.itertuples(index=False)})
    dm = data_module(tmp_path, str(tiny_bert), max_batch_tokens=2048, pad_to_multiple_of=8, group_size=4)
    dm.setup("fit")
    assert len(dm.train) + len(dm.val) == 12900
    models = [AutoModelForSequenceClassification.from_pretrained(tiny_bert) for _ in range(2)]
    optimisers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in models]
    for step, batch in enumerate(dm.train_dataloader()):
        expected = reference_batch(dm.train, dm.tokenizer, texts, batch["index"].tolist(), 8)
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            assert torch.equal(batch[key], expected[key]), key
        for model, optimiser, inputs in zip(models, optimisers, (batch, expected), strict=True):
            logits = model(**{k: inputs[k] for k in ("input_ids", "token_type_ids", "attention_mask")}).logits
            loss = torch.nn.functional.mse_loss(logits[:, 0], batch["target"])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        if step == 30:
            break
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a, b)
    val = next(iter(dm.val_dataloader()))
    expected = reference_batch(dm.val, dm.tokenizer, texts, val["index"].tolist(), 8)
    assert all(torch.equal(val[key], expected[key]) for key in expected)


def test_the_data_module_maps_one_store_and_holds_no_texts(tiny_bert: Path, tmp_path: Path) -> None:
    dm = data_module(tmp_path, str(tiny_bert))
    dm.setup("fit")
    again = data_module(tmp_path, str(tiny_bert))
    again.setup("fit")
    assert dm.train.store.path == again.train.store.path == dm.val.store.path
    assert isinstance(dm.train.store.tokens, np.memmap)
    assert sorted(set(dm.train.qid) | set(dm.val.qid)) == sorted(
        {q for f in DL2122 for q in TeacherDataset.open(f).to_pandas(["qid"]).qid}
    )
    assert not set(dm.train.qid) & set(dm.val.qid)
    # worker processes get the store's path, not a copy of its arrays
    import pickle

    state = pickle.dumps(dm.train.store)
    assert len(state) < 10_000 and pickle.loads(state).tokens.tolist()[:50] == dm.train.store.tokens.tolist()[:50]


def test_training_data_from_a_zeroed_token_file_is_the_rebuilt_tokens_not_padding(
    tiny_bert: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``tokens.bin`` zeroed at its own size (every id ``[PAD]``): the next training's data rebuilds the store
    with one warning, and its batches hold the real tokens where the attention mask is set."""
    dm = data_module(tmp_path, str(tiny_bert))
    dm.setup("fit")
    good = dm.train.store.tokens.tolist()
    path = dm.train.store.path / "tokens.bin"
    del dm
    damage(path, "zeroed")
    with caplog.at_level("WARNING", logger="students.token_store"):
        again = data_module(tmp_path, str(tiny_bert))
        again.setup("fit")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and str(path) in warnings[0], warnings
    assert again.train.store.tokens.tolist() == good
    batch = next(iter(again.train_dataloader()))
    real = batch["input_ids"][batch["attention_mask"].bool()]
    assert not (real == again.tokenizer.pad_token_id).any()
