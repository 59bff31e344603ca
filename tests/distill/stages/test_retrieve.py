"""``distill retrieve``: BM25 and dense first-stage retrieval over real DL19 passages, the saved index, and the
candidates it writes, read back with ``distill teach``'s loader."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest

from distill.cli import main
from distill.core.schema import InputError, Qrels, RerankingData
from distill.data.loaders import load_candidates, load_qrels
from distill.eval.metrics import evaluate
from distill.model.embeddings import Encoder
from distill.retrieval import RetrievalResult, retrieve
from distill.retrieval.index_cache import MANIFEST, index_key, save_atomically
from distill.retrieval.retrieve import default_index_dir

DL19 = Path(__file__).resolve().parents[3] / "data" / "trec-dl19"

NUM_QUERIES = 3
"""DL19 queries whose BM25 top-100 passages make the corpus: 300 passages."""


@pytest.fixture(scope="module")
def dl19() -> RerankingData:
    data = load_candidates(DL19 / "bm25_top100.json")
    data.candidates = data.candidates[:NUM_QUERIES]
    return data


@pytest.fixture(scope="module")
def qrels() -> Qrels:
    return load_qrels(DL19 / "qrels.txt")


@pytest.fixture(scope="module")
def corpus_texts(dl19: RerankingData) -> dict[str, str]:
    return {p.docid: p.text for c in dl19.candidates for p in c.passages}


def write_corpus(path: Path, texts: dict[str, str]) -> Path:
    """A JSONL corpus ``{"_id", "text"}``."""
    path.write_text("".join(json.dumps({"_id": docid, "text": text}) + "\n" for docid, text in texts.items()))
    return path


def write_queries(path: Path, queries: dict[str, str]) -> Path:
    """A TSV ``qid<TAB>text`` queries file."""
    path.write_text("".join(f"{qid}\t{text}\n" for qid, text in queries.items()))
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, dl19: RerankingData, corpus_texts: dict[str, str]) -> Path:
    """A folder with the corpus (``corpus.jsonl``) and the DL19 queries (``queries.tsv``)."""
    root = tmp_path_factory.mktemp("retrieve-inputs")
    write_corpus(root / "corpus.jsonl", corpus_texts)
    write_queries(root / "queries.tsv", {c.query.qid: c.query.text for c in dl19.candidates})
    return root


def ndcg10(run: dict[str, dict[str, float]], qrels: Qrels) -> float:
    return evaluate(run, qrels, ["nDCG@10"])["nDCG@10"]


def shuffled_ndcg10(qids: list[str], docids: list[str], qrels: Qrels, seeds: int = 5) -> float:
    """nDCG@10 of random rankings of the whole corpus, averaged over ``seeds`` shuffles."""
    rng = random.Random(0)
    return sum(ndcg10({q: {d: rng.random() for d in docids} for q in qids}, qrels) for _ in range(seeds)) / seeds


# --- BM25 ---


def test_bm25_ranks_a_passage_first_for_its_own_text(tmp_path: Path, inputs: Path, corpus_texts: dict[str, str]):
    counts: dict[str, int] = {}
    for text in corpus_texts.values():
        counts[text] = counts.get(text, 0) + 1
    unique = [docid for docid, text in corpus_texts.items() if counts[text] == 1]
    picked = unique[:: len(unique) // 8][:8]
    queries = write_queries(tmp_path / "own-text.tsv", {f"q-{d}": corpus_texts[d] for d in picked})
    # Lucene's own b: with its length normalisation, no longer passage that holds a text outranks the text itself
    index = tmp_path / "bm25-index"
    result = retrieve(
        inputs / "corpus.jsonl", queries, tmp_path / "run.trec", "bm25", k=5, index_dir=index, k1=1.2, b=0.75
    )
    assert result.num_docs == len(corpus_texts)
    for docid in picked:
        ranked = sorted(result.run[f"q-{docid}"].items(), key=lambda kv: -kv[1])
        assert ranked[0][0] == docid
        assert ranked[0][1] > ranked[1][1]
    # Pyserini's defaults (b 0.4) normalise less: a passage that holds another's text, and more, can come first
    default = retrieve(inputs / "corpus.jsonl", queries, tmp_path / "default.trec", "bm25", k=5, index_dir=index)
    assert not default.reused_index  # the index of another setting is built anew
    for docid in picked:
        ranked = sorted(default.run[f"q-{docid}"], key=lambda d: -default.run[f"q-{docid}"][d])
        assert ranked[0] == docid or corpus_texts[docid][-40:] in corpus_texts[ranked[0]], (docid, ranked[0])


def test_an_output_that_is_a_device_keeps_the_index_in_the_cache(
    tmp_path: Path, inputs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index's default place is beside the output; for an output written in place (here a link to /dev/null, as
    /dev/stdout is one), whose folder is no place for it, the cache: built there once, then reused."""
    monkeypatch.setenv("CIS_DISTILL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "null.trec").symlink_to(os.devnull)
    first = retrieve(inputs / "corpus.jsonl", inputs / "queries.tsv", out / "null.trec", "bm25", k=5)
    again = retrieve(inputs / "corpus.jsonl", inputs / "queries.tsv", out / "null.trec", "bm25", k=5)
    assert first.index_dir == again.index_dir and first.index_dir.parent == tmp_path / "cache" / "indexes"
    assert first.index_dir.name.startswith("corpus-") and first.index_dir.name.endswith(".bm25-index")
    assert (first.reused_index, again.reused_index) == (False, True) and os.listdir(out) == ["null.trec"]
    beside = retrieve(inputs / "corpus.jsonl", inputs / "queries.tsv", out / "run.trec", "bm25", k=5)
    assert beside.index_dir == out / "run.bm25-index"
    # /dev/stdout, whatever a shell sent it to (a file, under pytest's capture), is no folder for it either
    stdout = default_index_dir(Path("/dev/stdout"), inputs / "corpus.jsonl", "bm25")
    assert stdout == first.index_dir


def test_bm25_run_loads_with_teachs_loader_and_beats_a_shuffle(
    tmp_path: Path, inputs: Path, dl19: RerankingData, corpus_texts: dict[str, str], qrels: Qrels
):
    output = tmp_path / "bm25.trec"
    result = retrieve(inputs / "corpus.jsonl", inputs / "queries.tsv", output, "bm25", k=20)
    data = load_candidates(output, queries=inputs / "queries.tsv", corpus=inputs / "corpus.jsonl")
    assert [c.query.qid for c in data.candidates] == [c.query.qid for c in dl19.candidates]
    for cands in data.candidates:
        assert len(cands.passages) == 20
        assert cands.scores == sorted(cands.scores, reverse=True)
        assert all(p.text == corpus_texts[p.docid] for p in cands.passages)
        assert {p.docid: s for p, s in zip(cands.passages, cands.scores, strict=True)} == pytest.approx(
            result.run[cands.query.qid], abs=1e-5
        )
    qids = [c.query.qid for c in dl19.candidates]
    assert ndcg10(result.run, qrels) > shuffled_ndcg10(qids, list(corpus_texts), qrels) + 20


def test_bm25_index_is_reused_and_rebuilt_when_the_corpus_changes(tmp_path: Path, corpus_texts: dict[str, str]):
    corpus = write_corpus(tmp_path / "corpus.jsonl", corpus_texts)
    queries = write_queries(tmp_path / "queries.tsv", {"q1": "flea life cycle", "q2": "zyxwvut quorbl"})
    index = tmp_path / "index"

    def run(k: int) -> RetrievalResult:
        return retrieve(corpus, queries, tmp_path / "run.trec", "bm25", k=k, index_dir=index)

    first = run(10)
    assert not first.reused_index and first.index_dir == index
    assert "q2" not in first.run  # no passage shares a term with it
    files = {p.name: p.stat().st_mtime_ns for p in index.iterdir()}
    second = run(10)
    assert second.reused_index
    assert second.run == first.run
    assert {p.name: p.stat().st_mtime_ns for p in index.iterdir()} == files
    assert run(3).reused_index  # k is no setting of the index
    for name in sorted(p.name for p in index.iterdir() if p.name != MANIFEST):  # a file changed: built again
        damaged = index / name
        damaged.write_bytes(bytes(damaged.stat().st_size))  # zeroed
        again = run(10)
        assert not again.reused_index and again.run == first.run, name
        assert run(10).reused_index

    write_corpus(corpus, {**corpus_texts, "new-1": "The zyxwvut is a quorbl of the northern seas."})
    rebuilt = run(10)
    assert not rebuilt.reused_index
    assert rebuilt.num_docs == len(corpus_texts) + 1
    assert list(rebuilt.run["q2"]) == ["new-1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "index", "queries.tsv", "run.trec"]


def test_the_default_index_sits_next_to_the_output(tmp_path: Path, inputs: Path):
    result = retrieve(inputs / "corpus.jsonl", inputs / "queries.tsv", tmp_path / "out" / "dl19.trec", "bm25", k=5)
    assert result.index_dir == tmp_path / "out" / "dl19.bm25-index"
    assert (result.index_dir / MANIFEST).is_file()


def test_index_key_follows_corpus_content_and_settings(tmp_path: Path):
    a, b, c = (tmp_path / name / "corpus.tsv" for name in "abc")
    for path, text in ((a, "d1\tsome passage\n"), (b, "d1\tsome passage\n"), (c, "d1\tsome other passage\n")):
        path.parent.mkdir()
        path.write_text(text)
    settings = {"method": "bm25", "k1": 1.5}
    assert index_key(a, settings) == index_key(b, settings)  # content, not path
    assert index_key(a, settings) != index_key(c, settings)
    assert index_key(a, settings) != index_key(a, {**settings, "k1": 1.2})
    as_jsonl = b.rename(b.with_suffix(".jsonl"))  # the same bytes, parsed as another format
    assert index_key(a, settings) != index_key(as_jsonl, settings)


def test_an_interrupted_build_leaves_the_previous_index(tmp_path: Path):
    index = tmp_path / "index"
    save_atomically(index, "key-1", {}, ["d1"], lambda folder: (folder / "data").write_text("first"))

    def interrupted(folder: Path) -> None:
        (folder / "data").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_atomically(index, "key-2", {}, ["d1"], interrupted)
    assert (index / "data").read_text() == "first"
    assert json.loads((index / MANIFEST).read_text())["key"] == "key-1"
    assert [p.name for p in tmp_path.iterdir()] == ["index"]


# --- outputs, inputs and errors ---


def test_rank_llm_output_from_a_beir_folder(tmp_path: Path, dl19: RerankingData, corpus_texts: dict[str, str]):
    beir = tmp_path / "beir"
    beir.mkdir()
    write_corpus(beir / "corpus.jsonl", corpus_texts)
    (beir / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": c.query.qid, "text": c.query.text}) + "\n" for c in dl19.candidates)
    )
    result = retrieve(beir, None, tmp_path / "cands.json", "bm25", k=7, output_format="rank_llm")
    data = load_candidates(tmp_path / "cands.json")
    assert [c.query.text for c in data.candidates] == [c.query.text for c in dl19.candidates]
    for cands in data.candidates:
        ranked = sorted(result.run[cands.query.qid], key=lambda d: (-result.run[cands.query.qid][d], d))
        assert [p.docid for p in cands.passages] == ranked
        assert all(p.text == corpus_texts[p.docid] for p in cands.passages)


def test_bad_corpus_line_is_named(tmp_path: Path):
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("d1\tfirst passage\nd2 has no tab\n")
    queries = write_queries(tmp_path / "queries.tsv", {"q1": "passage"})
    with pytest.raises(InputError, match=f"{corpus}:2: expected 'docid<TAB>text'"):
        retrieve(corpus, queries, tmp_path / "run.trec", "bm25")
    with pytest.raises(InputError, match="queries file not found"):
        retrieve(corpus, tmp_path / "missing.tsv", tmp_path / "run.trec", "bm25")
    os.mkfifo(tmp_path / "queries.fifo")  # as a shell's <(...) gives it
    with pytest.raises(
        InputError, match=re.escape("queries: a pipe or a device, not a file (it is read more than once)")
    ):
        retrieve(corpus, tmp_path / "queries.fifo", tmp_path / "run.trec", "bm25")
    with pytest.raises(InputError, match="needs --queries"):
        retrieve(corpus, None, tmp_path / "run.trec", "bm25")
    corpus.write_text("d1\tfirst passage\nd2\t \n")
    with pytest.raises(InputError, match=f"{corpus}:2: empty passage text for docid d2"):
        retrieve(corpus, queries, tmp_path / "run.trec", "bm25")
    # ids a TREC run cannot hold as one field: the run was written, and no reader took it
    corpus.write_text("d1\tfirst passage\nd 2\tsecond passage\n")
    with pytest.raises(InputError, match=re.escape(f"{corpus}: docid 'd 2': an id must be non-empty, without")):
        retrieve(corpus, queries, tmp_path / "run.trec", "bm25")
    corpus.write_text("d1\tfirst passage\nd2\tsecond passage\n")
    spaced = write_queries(tmp_path / "spaced.tsv", {"q 1": "passage"})
    with pytest.raises(InputError, match=re.escape(f"{spaced}: qid 'q 1': an id must be non-empty, without")):
        retrieve(corpus, spaced, tmp_path / "run.trec", "bm25")
    assert not (tmp_path / "run.trec").exists()


def test_cli_retrieve(tmp_path: Path, inputs: Path, capsys: pytest.CaptureFixture[str]):
    output = tmp_path / "run.trec"
    argv = ["retrieve", "--corpus", str(inputs / "corpus.jsonl"), "--queries", str(inputs / "queries.tsv")]
    assert main([*argv, "--k", "4", "--output", str(output)]) == 0
    assert "built the bm25 index" in capsys.readouterr().out
    assert len(output.read_text().splitlines()) == NUM_QUERIES * 4
    assert main([*argv, "--k", "4", "--output", str(output)]) == 0
    assert "reused the bm25 index" in capsys.readouterr().out
    assert main([*argv, "--output", str(output), "--k", "0"]) == 2
    assert "--k: must be positive" in capsys.readouterr().err


def test_an_index_folder_that_holds_something_else_is_never_replaced(
    tmp_path: Path, inputs: Path, capsys: pytest.CaptureFixture[str]
):
    """``--index`` on a teacher dataset or a folder of notes deleted it, and wrote the index there, with exit 0."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "important.txt").write_text("mine")
    argv = ["retrieve", "--corpus", str(inputs / "corpus.jsonl"), "--queries", str(inputs / "queries.tsv")]
    output = tmp_path / "run.trec"
    assert main([*argv, "--index", str(notes), "--output", str(output)]) == 2
    assert capsys.readouterr().err == (
        f"distill retrieve: error: index: {notes} exists and is no index (no manifest.json), which a new index would "
        "replace: choose another --index\n"
    )
    assert [p.name for p in notes.iterdir()] == ["important.txt"] and not output.exists()
    (tmp_path / "empty").mkdir()  # nothing to lose: taken, then reused as the index it now is
    for _ in range(2):
        assert main([*argv, "--index", str(tmp_path / "empty"), "--output", str(output)]) == 0
    assert "reused the bm25 index" in capsys.readouterr().out


def test_an_index_another_job_replaces_while_this_one_reads_it_is_not_mixed(tmp_path: Path) -> None:
    """Two jobs of other settings sharing one --index: one read the index files, the other swapped its own index
    in, and the first read that one's docids; a check that fell between the swap's renames called the index
    folder "no index"."""
    from distill.core.output_files import replace_folder
    from distill.retrieval.index_cache import check_index_folder, load_docids, load_or_build

    directory = tmp_path / "index"

    def write(ids: list[str]):
        return lambda folder: (folder / "ids.json").write_text(json.dumps(ids))

    save_atomically(directory, "mine", {}, ["a", "b"], write(["a", "b"]))
    check_index_folder(directory)
    check_index_folder(tmp_path / "absent")  # as between the renames of another job's replacement

    def load_while_replaced(folder: Path) -> list[str]:
        index = json.loads((folder / "ids.json").read_text())
        other = tmp_path / "other"
        save_atomically(other, "theirs", {}, ["x", "y", "z"], write(["x", "y", "z"]))
        replace_folder(other, directory)  # the other job's index, swapped in between this job's reads
        return index

    class Index:
        def save(self, folder: Path) -> None:
            write(["a", "b"])(folder)

    built = []

    def build():
        built.append(1)
        return Index(), ["a", "b"]

    _, docids, reused = load_or_build(directory, "mine", {}, load_while_replaced, build)
    assert not reused and built == [1] and docids == ["a", "b"]  # rebuilt, not the other's docids
    assert load_docids(directory) == ["a", "b"]


# --- dense, with the real all-MiniLM-L6-v2 ---


@pytest.fixture(scope="module")
def dense_run(tmp_path_factory: pytest.TempPathFactory, inputs: Path) -> tuple[Path, RetrievalResult]:
    output = tmp_path_factory.mktemp("dense") / "dense.trec"
    return output, retrieve(inputs / "corpus.jsonl", inputs / "queries.tsv", output, "dense", k=100)


@pytest.mark.slow
def test_dense_ranks_relevant_passages_high(
    dense_run: tuple[Path, RetrievalResult], dl19: RerankingData, corpus_texts: dict[str, str], qrels: Qrels
):
    _, result = dense_run
    assert not result.reused_index
    assert all(len(hits) == 100 for hits in result.run.values())
    assert all(-1.0 <= s <= 1.0 for hits in result.run.values() for s in hits.values())
    qids = [c.query.qid for c in dl19.candidates]
    dense = ndcg10(result.run, qrels)
    assert dense > 50
    assert dense > shuffled_ndcg10(qids, list(corpus_texts), qrels) + 30


@pytest.mark.slow
def test_dense_index_is_reused(dense_run: tuple[Path, RetrievalResult], inputs: Path):
    output, first = dense_run
    again = retrieve(inputs / "corpus.jsonl", inputs / "queries.tsv", output, "dense", k=100)
    assert again.reused_index and again.index_dir == first.index_dir
    for qid, hits in first.run.items():
        assert again.run[qid] == pytest.approx(hits, abs=1e-5)
    data = load_candidates(output, queries=inputs / "queries.tsv", corpus=inputs / "corpus.jsonl")
    assert data.num_pairs == 100 * NUM_QUERIES


@pytest.mark.slow
def test_encoder_matches_sentence_transformers(corpus_texts: dict[str, str]):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    encoder = Encoder("all-minilm-l6-v2", max_batch_tokens=512)
    texts = [*list(corpus_texts.values())[:6], "how long is life cycle of flea", "a"]
    reference = sentence_transformers.SentenceTransformer(encoder.source.location, device="cpu").encode(texts)
    ours = encoder.encode(texts)
    assert ours.shape == (len(texts), 384)
    assert abs(ours - reference).max() < 1e-4
