"""Loaders: rank_llm, qrels, TREC run, BEIR, multi-hop QA, and the bad-input policy."""

from __future__ import annotations

import json
import re
from collections import Counter
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from distill.core.schema import InputError, Query, RerankingData
from distill.data.loaders import _common, join_streams, load_candidates, load_qrels, open_candidates, skip_summary
from distill.data.loaders._common import repair_mojibake

DATA = Path(__file__).resolve().parents[3] / "data"
DL19 = DATA / "trec-dl19"
HOTPOT = DATA / "hotpotqa" / "hotpotqa_train100.json"


def shipped(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is not there")
    return path


@pytest.fixture(autouse=True)
def corpus_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Corpus indexes go to the test's folder, not the user's cache."""
    monkeypatch.setenv("CIS_DISTILL_CACHE", str(tmp_path / "cache"))


def raises(message: str) -> AbstractContextManager[pytest.ExceptionInfo[InputError]]:
    """Expect an :class:`InputError` whose message contains ``message``."""
    return pytest.raises(InputError, match=re.escape(message))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_jsonl(path: Path, records: list[dict]) -> Path:
    return write(path, "".join(json.dumps(r) + "\n" for r in records))


def ranking(data: RerankingData) -> dict[str, list[str]]:
    return {c.query.qid: [p.docid for p in c.passages] for c in data.candidates}


def texts(data: RerankingData) -> dict[str, str]:
    return {p.docid: p.text for c in data.candidates for p in c.passages}


# --- rank_llm and qrels on the shipped TREC DL19 data ---


def test_rank_llm_dl19() -> None:
    data = load_candidates(shipped(DL19 / "bm25_top100.json"))
    assert len(data.candidates) == 43
    assert data.num_pairs == 4300
    assert data.candidates[0].query.qid == "264014"
    assert data.candidates[0].query.text == "how long is life cycle of flea"
    assert all(len(c.passages) == 100 for c in data.candidates)
    assert not data.skipped


def test_a_rank_llm_list_is_streamed_an_entry_at_a_time_as_json_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = json.loads(shipped(DL19 / "bm25_top100.json").read_text())
    monkeypatch.setattr(_common, "LIST_READ_CHARS", 1000)  # far less than one entry: every entry runs past the window
    expected = load_candidates(DL19 / "bm25_top100.json")
    path = write(tmp_path / "indented.json", json.dumps(entries, indent=2))
    assert load_candidates(path).candidates == expected.candidates
    # The first query comes before the file is read to its end: a malformed tail is met only then.
    write(path, json.dumps(entries[:2])[:-1] + ', {"query": "q", "hits": [}]')
    stream = open_candidates(path).candidates
    assert next(stream).query.qid == expected.candidates[0].query.qid
    with raises(f"{path}:1:"):
        list(stream)


def test_a_query_that_comes_back_in_a_later_list_entry_is_named(tmp_path: Path) -> None:
    entries = json.loads(shipped(DL19 / "bm25_top100.json").read_text())[:3]
    path = write(tmp_path / "again.json", json.dumps([*entries, entries[1]]))
    qid = entries[1]["hits"][0]["qid"]
    with raises(f"{path}: entry [3]: qid {qid} already had its candidates at {path}: entry [1]"):
        load_candidates(path)
    skipped = load_candidates(path, on_bad_input="skip")
    assert len(skipped.candidates) == 3 and sum(skipped.skipped.values()) == 1


def test_a_query_without_hits_is_named_in_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Its qid is on its hits only, so nothing downstream (a rerank, an eval) would show the query had none."""
    entries = json.loads(shipped(DL19 / "bm25_top100.json").read_text())[:3]
    entries[1]["hits"] = []
    path = write(tmp_path / "empty.json", json.dumps(entries))
    with caplog.at_level("WARNING", logger="distill.data.loaders.rank_llm"):
        data = load_candidates(path)
    assert len(data.candidates) == 2
    assert caplog.messages == [f"{path}: entry [1]: no hits for query {entries[1]['query']!r}: nothing to score for it"]


def test_several_inputs_are_joined_a_query_at_a_time_through_files(tmp_path: Path) -> None:
    entries = json.loads(shipped(DL19 / "bm25_top100.json").read_text())
    first = write(tmp_path / "a.jsonl", "".join(json.dumps(e) + "\n" for e in entries[:3]))
    # The second input repeats query 1 (its last 30 hits and 5 new ones) and adds query 3.
    again = {"query": entries[1]["query"], "hits": entries[1]["hits"][-30:] + entries[5]["hits"][:5]}
    for hit in again["hits"]:
        hit["qid"] = entries[1]["hits"][0]["qid"]
    second = write(tmp_path / "b.json", json.dumps([entries[3], again]))
    expected = RerankingData.union([load_candidates(first), load_candidates(second)])
    scratch = tmp_path / "scratch"
    stream = join_streams([open_candidates(first), open_candidates(second)], scratch)
    joined = list(stream.candidates)
    assert joined == expected.candidates and not scratch.exists()
    assert [len(c.passages) for c in joined] == [100, 105, 100, 100]


def test_inputs_that_give_a_qid_different_query_texts_are_refused_before_any_is_scored(tmp_path: Path) -> None:
    first = rank_llm_file(tmp_path / "a", [hit("a")])
    second = write(tmp_path / "b" / "other.json", json.dumps([{"query": "another query", "hits": [hit("b")]}]))
    message = f"qid 1: {first} and {second} give it different query texts ('a query' and 'another query')"
    with raises(message):
        RerankingData.union([load_candidates(first), load_candidates(second)])
    scratch = tmp_path / "scratch"
    with raises(message):  # found while the inputs are copied, before the first query is handed on
        next(join_streams([open_candidates(first), open_candidates(second)], scratch).candidates)
    assert not scratch.exists()
    same = write(tmp_path / "c" / "same.json", json.dumps([{"query": "a query", "hits": [hit("b")]}]))
    assert ranking(RerankingData.union([load_candidates(first), load_candidates(same)])) == {"1": ["a", "b"]}


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_a_json_input_that_is_not_utf8_is_named(tmp_path: Path, suffix: str) -> None:
    entry = json.dumps({"query": "q", "hits": [{"qid": "1", "docid": "d", "content": "x"}]}).encode()
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes(
        b"[" + entry + b",\n" + entry.replace(b'"x"', b'"caf\xe9"') + b"]"
        if suffix == ".json"
        else entry + b"\n" + entry.replace(b'"x"', b'"caf\xe9"') + b"\n"
    )
    with raises("not UTF-8 text"):
        load_candidates(path)


def test_rank_llm_mojibake_repair() -> None:
    path = shipped(DL19 / "bm25_top100.json")
    raw = texts(load_candidates(path, repair_mojibake=False))["2688537"]
    fixed = texts(load_candidates(path))["2688537"]
    assert "Itâ\x80\x99s a long-lasting solution" in raw
    assert "FRONTLINE Â® Plus" in raw
    assert "It’s a long-lasting solution" in fixed
    assert fixed.startswith("FRONTLINE ® Plus")
    assert "â\x80" not in fixed


def test_repair_mojibake_keeps_what_it_cannot_repair() -> None:
    assert repair_mojibake("naïve café ☕") == "naïve café ☕"  # not Latin-1: cannot be mojibake
    assert repair_mojibake("naïve café") == "naïve café"  # Latin-1, but its bytes are not UTF-8
    assert repair_mojibake("plain ascii") == "plain ascii"


def test_qrels_dl19() -> None:
    qrels = load_qrels(shipped(DL19 / "qrels.txt"))
    assert len(qrels) == 43
    assert qrels["19335"]["1017759"] == 0
    candidates = load_candidates(shipped(DL19 / "bm25_top100.json"))
    assert set(qrels) == {c.query.qid for c in candidates.candidates}


def test_bad_qrels_lines_are_named_and_a_pair_judged_twice_must_agree(tmp_path: Path) -> None:
    path = tmp_path / "qrels.txt"
    for text, message in (
        (b"q1 0 d1 1\nq1 0 d2 caf\xe9\n", f"{path}:2: not UTF-8 text (invalid continuation byte at byte 11)"),
        (b"q1 0 d1 1\nq1 0 d1\n", f"{path}:2: expected 'qid iteration docid grade', got 'q1 0 d1'"),
        (b"q1 0 d1 high\n", f"{path}:1: relevance grade 'high' is not an integer"),
        (b"q1 0 d1 3\nq2 0 d1 0\nq1 0 d1 0\n", f"{path}:3: (q1, d1) is judged 0 here and 3 on an earlier line"),
    ):
        path.write_bytes(text)
        with raises(message):
            load_qrels(path)
    path.write_bytes(b"q1 0 d1 3\n\nq1 0 d1 3\nq1 0 d2 0\n")  # the same grade twice is one judgement
    assert load_qrels(path) == {"q1": {"d1": 3, "d2": 0}}


# --- TREC run with queries and corpus ---

RUN = """\
q1 Q0 d2 1 5.0 bm25
q1 Q0 d1 2 7.5 bm25
q2 Q0 d3 1 3.0 bm25
q1 Q0 d3 3 5.0 bm25
q2 Q0 d1 2 -1e3 bm25
"""


@pytest.fixture
def trec(tmp_path: Path) -> dict[str, Path]:
    return {
        "run": write(tmp_path / "run.trec", RUN),
        "queries": write(tmp_path / "queries.tsv", "q1\tfirst query\nq2\tsecond query\nq3\tunused query\n"),
        "corpus": write(
            tmp_path / "corpus.tsv",
            "d1\tpassage one\n"
            "d2\tTitle Two\tpassage two\n"
            "d3\t\tpassage three\n"
            "d4\tunused, malformed\tline\twith four fields\n",
        ),
        "queries_jsonl": write_jsonl(
            tmp_path / "queries.jsonl", [{"_id": "q1", "text": "first query"}, {"qid": "q2", "query": "second query"}]
        ),
        "corpus_jsonl": write_jsonl(
            tmp_path / "corpus.jsonl",
            [
                {"_id": "d1", "text": "passage one"},
                {"docid": "d2", "title": "Title Two", "text": "passage two"},
                {"id": "d3", "contents": "passage three", "title": ""},
                {"id": "d4"},  # no text, but not in the run: never looked at
            ],
        ),
    }


EXPECTED_RANKING = {"q1": ["d1", "d2", "d3"], "q2": ["d3", "d1"]}
EXPECTED_TEXTS = {"d1": "passage one", "d2": "Title Two passage two", "d3": "passage three"}


def test_trec_run_tsv(trec: dict[str, Path]) -> None:
    data = load_candidates(trec["run"], queries=trec["queries"], corpus=trec["corpus"])
    assert ranking(data) == EXPECTED_RANKING  # by score; the 5.0 tie by rank; qids by first appearance
    assert texts(data) == EXPECTED_TEXTS
    assert [c.query.text for c in data.candidates] == ["first query", "second query"]
    assert data.candidates[0].scores == [7.5, 5.0, 5.0]
    assert data.candidates[1].scores == [3.0, -1000.0]
    assert data.first_stage_run()["q1"] == {"d1": 3.0, "d2": 2.0, "d3": 1.0}  # the tie as ranked: not by docid
    assert data.qrels == {}


def test_trec_run_jsonl(trec: dict[str, Path]) -> None:
    data = load_candidates(trec["run"], queries=trec["queries_jsonl"], corpus=trec["corpus_jsonl"])
    assert ranking(data) == EXPECTED_RANKING
    assert texts(data) == EXPECTED_TEXTS


def test_a_jsonl_text_that_is_no_string_is_bad_input(trec: dict[str, Path]) -> None:
    corpus = write_jsonl(
        trec["corpus_jsonl"], [{"_id": "d1", "text": 5}, {"_id": "d2", "text": "b"}, {"_id": "d3", "text": "c"}]
    )
    with raises(f"{corpus}:1: the text is int, not a string"):
        load_candidates(trec["run"], queries=trec["queries_jsonl"], corpus=corpus)


def test_trec_run_is_streamed_a_query_at_a_time(trec: dict[str, Path]) -> None:
    """Grouped or not, a run gives the same candidates; a bad line of a later query is met only once that query is
    read."""
    grouped = write(trec["run"].with_name("grouped.trec"), "".join(sorted(RUN.splitlines(keepends=True))))
    expected = load_candidates(trec["run"], queries=trec["queries"], corpus=trec["corpus"])
    assert load_candidates(grouped, queries=trec["queries"], corpus=trec["corpus"]).candidates == expected.candidates
    with grouped.open("a") as f:
        f.write("q2 Q0 d2 three 1.0 bm25\n")
    stream = open_candidates(grouped, queries=trec["queries"], corpus=trec["corpus"]).candidates
    assert next(stream) == expected.candidates[0]
    with raises(f"{grouped}:6: rank 'three' is not an integer"):
        next(stream)


def test_trec_run_missing_docid(trec: dict[str, Path]) -> None:
    run = write(trec["run"], RUN + "q2 Q0 d9 3 0.5 bm25\n")
    with pytest.raises(InputError) as e:
        load_candidates(run, queries=trec["queries"], corpus=trec["corpus"])
    assert f"{run}:6:" in str(e.value)
    assert f"docid d9 not found in {trec['corpus']}" in str(e.value)
    data = load_candidates(run, queries=trec["queries"], corpus=trec["corpus"], on_bad_input="skip")
    assert ranking(data) == EXPECTED_RANKING
    assert sum(data.skipped.values()) == 1


def test_trec_run_missing_qid(trec: dict[str, Path]) -> None:
    run = write(trec["run"], "q7 Q0 d1 1 1.0 bm25\n" + RUN)
    with raises(f"{run}:1: qid q7 not found in {trec['queries']}"):
        load_candidates(run, queries=trec["queries"], corpus=trec["corpus"])


@pytest.mark.parametrize(
    ("line", "message"),
    [("q1 Q0 d1 1 7.5", "expected 6 fields"), ("q1 Q0 d1 1 high bm25", "score 'high' is not a number")],
)
def test_trec_run_malformed_line(trec: dict[str, Path], line: str, message: str) -> None:
    run = write(trec["run"], RUN.replace("q1 Q0 d3 3 5.0 bm25", line))
    with raises(f"{run}:4: {message}"):
        load_candidates(run, queries=trec["queries"], corpus=trec["corpus"])
    data = load_candidates(run, queries=trec["queries"], corpus=trec["corpus"], on_bad_input="skip")
    assert data.num_pairs == 4
    assert sum(data.skipped.values()) == 1


def test_trec_queries_line_without_tab(trec: dict[str, Path]) -> None:
    queries = write(trec["queries"], "q1\tfirst query\nq2 second query\n")
    with raises(f"{queries}:2: expected 'qid<TAB>text', got 1 tab-separated fields"):
        load_candidates(trec["run"], queries=queries, corpus=trec["corpus"])
    data = load_candidates(trec["run"], queries=queries, corpus=trec["corpus"], on_bad_input="skip")
    assert ranking(data) == {"q1": EXPECTED_RANKING["q1"]}
    assert data.skipped == Counter({"not 'qid<TAB>text'": 1, "qid not found in " + str(queries): 2})


def test_trec_run_needs_queries_and_corpus(trec: dict[str, Path]) -> None:
    with raises("needs --queries and --corpus"):
        load_candidates(trec["run"], queries=trec["queries"])
    with raises(f"{trec['corpus'].with_name('nope.tsv')}: corpus file not found"):
        load_candidates(trec["run"], queries=trec["queries"], corpus=trec["corpus"].with_name("nope.tsv"))


# --- BEIR ---


@pytest.fixture
def beir(tmp_path: Path) -> Path:
    root = tmp_path / "scifact"
    write_jsonl(
        root / "corpus.jsonl",
        [
            {"_id": "d1", "title": "", "text": "passage one"},
            {"_id": "d2", "title": "Title Two", "text": "passage two"},
            {"_id": "d3", "title": "Three", "text": "passage three"},
        ],
    )
    write_jsonl(root / "queries.jsonl", [{"_id": "q1", "text": "first query"}, {"_id": "q2", "text": "second"}])
    write(root / "qrels" / "test.tsv", "query-id\tcorpus-id\tscore\nq1\td2\t1\nq1\td1\t0\nq2\td3\t2\n")
    write(root / "qrels" / "dev.tsv", "query-id\tcorpus-id\tscore\nq2\td1\t1\n")
    return root


BEIR_TEST_QRELS = {"q1": {"d2": 1, "d1": 0}, "q2": {"d3": 2}}


def test_beir_without_run(beir: Path) -> None:
    data = load_candidates(beir)
    assert ranking(data) == {"q1": ["d2", "d1"], "q2": ["d3"]}  # the judged pairs, in file order
    assert [c.scores for c in data.candidates] == [[0.0, 0.0], [0.0]]
    assert texts(data) == {"d1": "passage one", "d2": "Title Two passage two", "d3": "Three passage three"}
    assert data.qrels == BEIR_TEST_QRELS


def test_beir_with_run(beir: Path, tmp_path: Path) -> None:
    run = write(tmp_path / "bm25.run", "q1 Q0 d3 2 1.5 bm25\nq1 Q0 d1 1 2.5 bm25\n")
    data = load_candidates(beir, run=run)
    assert ranking(data) == {"q1": ["d1", "d3"]}
    assert data.candidates[0].scores == [2.5, 1.5]
    assert data.qrels == BEIR_TEST_QRELS


def test_beir_split_and_missing_qrels(beir: Path) -> None:
    from distill.data.loaders._common import BadInput
    from distill.data.loaders.beir import load_beir

    candidates, qrels = load_beir(beir, None, BadInput("error"), True, split="dev")
    assert qrels == {"q2": {"d1": 1}}
    assert [(c.query.qid, [p.docid for p in c.passages]) for c in candidates] == [("q2", ["d1"])]
    with raises(f"{beir / 'qrels' / 'train.tsv'}: qrels file for split 'train' not found"):
        load_beir(beir, None, BadInput("error"), True, split="train")


def test_beir_qrels_are_optional_with_a_run_and_a_pair_judged_twice_must_agree(beir: Path, tmp_path: Path) -> None:
    """A folder without qrels could not be reranked on a run over it (as distill retrieve writes); a pair judged
    twice kept its last grade."""
    run = write(tmp_path / "bm25.run", "q1 Q0 d3 2 1.5 bm25\nq1 Q0 d1 1 2.5 bm25\n")
    (beir / "qrels" / "test.tsv").unlink()
    data = load_candidates(beir, run=run)
    assert ranking(data) == {"q1": ["d1", "d3"]} and data.qrels == {}
    with raises("test.tsv: qrels file for split 'test' not found (without a run, the judged pairs are"):
        load_candidates(beir)
    qrels = write(beir / "qrels" / "test.tsv", "query-id\tcorpus-id\tscore\nq1\td2\t1\nq1\td2\t1\nq2\td3\t2\n")
    assert ranking(load_candidates(beir)) == {"q1": ["d2"], "q2": ["d3"]}  # the same grade twice: judged once
    write(qrels, "query-id\tcorpus-id\tscore\nq1\td2\t1\nq2\td3\t2\nq1\td2\t0\n")
    with raises(f"{qrels}:4: (q1, d2) is judged 0 here and 1 on an earlier line"):
        load_candidates(beir, run=run)


def test_a_byte_order_mark_is_not_part_of_the_first_id(trec: dict[str, Path], tmp_path: Path) -> None:
    """With a BOM, qrels lost their first judgement and runs their first line's query, with exit 0; JSON inputs
    were 'malformed'."""
    bom = "\ufeff"

    def with_bom(path: Path) -> Path:
        return write(tmp_path / f"bom-{path.name}", bom + path.read_text(encoding="utf-8"))

    plain = load_candidates(trec["run"], queries=trec["queries"], corpus=trec["corpus"])
    for run, queries, corpus in [
        (with_bom(trec["run"]), trec["queries"], trec["corpus"]),
        (trec["run"], with_bom(trec["queries"]), with_bom(trec["corpus"])),
        (trec["run"], with_bom(trec["queries_jsonl"]), with_bom(trec["corpus_jsonl"])),
    ]:
        assert load_candidates(run, queries=queries, corpus=corpus).candidates == plain.candidates
    qrels = write(tmp_path / "qrels.txt", "q1 0 d1 3\nq1 0 d2 0\n")
    assert load_qrels(with_bom(qrels)) == load_qrels(qrels) == {"q1": {"d1": 3, "d2": 0}}
    listed = load_candidates(DL19 / "bm25_top100.json")
    assert load_candidates(with_bom(shipped(DL19 / "bm25_top100.json"))).candidates == listed.candidates


def test_a_compressed_input_is_named_as_such(tmp_path: Path) -> None:
    """rl.json.gz was taken for a TREC run, and asked for --queries and --corpus."""
    import gzip

    packed = tmp_path / "rl.json.gz"
    packed.write_bytes(gzip.compress(shipped(DL19 / "bm25_top100.json").read_bytes()[:1000]))
    with raises(f"{packed}: a compressed file: decompress it first"):
        load_candidates(packed)


def test_beir_missing_judged_passage(beir: Path) -> None:
    qrels_path = write(beir / "qrels" / "test.tsv", "query-id\tcorpus-id\tscore\nq1\td2\t1\nq1\td8\t1\n")
    with raises(f"{qrels_path}:3: docid d8 not found in {beir / 'corpus.jsonl'}"):
        load_candidates(beir)


# --- multi-hop QA ---


def test_hotpotqa_shipped() -> None:
    raw = json.loads(shipped(HOTPOT).read_text(encoding="utf-8"))
    data = load_candidates(HOTPOT)
    assert len(data.candidates) == 100
    assert not data.skipped
    # 99 questions have the usual 10 paragraphs; one has only 4.
    assert Counter(len(c.passages) for c in data.candidates) == Counter({10: 99, 4: 1})
    for question, cands in zip(raw, data.candidates, strict=True):
        qid = question["_id"]
        assert cands.query == Query(qid, question["question"].strip())
        assert [p.docid for p in cands.passages] == [f"{qid}-{k}" for k in range(len(question["context"]))]
        assert cands.scores == [-float(k) for k in range(len(question["context"]))]
        for p, (title, sentences) in zip(cands.passages, question["context"], strict=True):
            assert p.text == (title + ". " + "".join(sentences)).strip()
        relevant = {question["context"][int(d.rsplit("-", 1)[1])][0] for d, g in data.qrels[qid].items() if g == 1}
        assert relevant == {title for title, _ in question["supporting_facts"]}
        assert len(data.qrels[qid]) == len(question["context"])
        assert sorted(data.qrels[qid].values()) == [0] * (len(question["context"]) - 2) + [1, 1]


def test_hotpotqa_hf_variant_matches(tmp_path: Path) -> None:
    question = json.loads(shipped(HOTPOT).read_text(encoding="utf-8"))[0]
    hf = {
        "id": question["_id"],
        "question": question["question"],
        "context": {"title": [t for t, _ in question["context"]], "sentences": [s for _, s in question["context"]]},
        "supporting_facts": {
            "title": [t for t, _ in question["supporting_facts"]],
            "sent_id": [i for _, i in question["supporting_facts"]],
        },
    }
    listed = load_candidates(write(tmp_path / "list.json", json.dumps([question])))
    hf_data = load_candidates(write(tmp_path / "hf.json", json.dumps([hf])))
    assert hf_data.candidates == listed.candidates
    assert hf_data.qrels == listed.qrels


def test_2wiki_sentences_without_leading_space(tmp_path: Path) -> None:
    question = {
        "_id": "w1",
        "question": "Who?",
        "context": [["Alpha", ["Alpha is a film.", "It was made in 1990."]], ["Beta", ["Beta is a town."]]],
        "supporting_facts": [["Beta", 0]],
    }
    data = load_candidates(write(tmp_path / "2wiki.json", json.dumps([question])))
    assert texts(data) == {"w1-0": "Alpha. Alpha is a film. It was made in 1990.", "w1-1": "Beta. Beta is a town."}
    assert data.qrels == {"w1": {"w1-0": 0, "w1-1": 1}}


def test_a_question_without_paragraphs_is_named_in_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    questions = [
        {"_id": "h1", "question": "Who?", "context": [["A", ["a."]]]},
        {"_id": "h2", "question": "What?", "context": []},
    ]
    path = write(tmp_path / "hotpot.json", json.dumps(questions))
    with caplog.at_level("WARNING", logger="distill.data.loaders.multihop"):
        data = load_candidates(path)
    assert [c.query.qid for c in data.candidates] == ["h1"]
    assert caplog.messages == [f"{path}: entry [1]: no paragraphs for question h2: nothing to score for it"]


def test_multihop_supporting_title_not_in_context(tmp_path: Path) -> None:
    question = {"_id": "h1", "question": "Q?", "context": [["A", ["a."]]], "supporting_facts": [["Z", 0]]}
    path = write(tmp_path / "h.json", json.dumps([question, {**question, "_id": "h2", "supporting_facts": []}]))
    with raises(f"{path}: entry [0] supporting_facts: supporting title 'Z' is not in the context"):
        load_candidates(path)
    data = load_candidates(path, on_bad_input="skip")
    assert ranking(data) == {"h2": ["h2-0"]}
    assert sum(data.skipped.values()) == 1


def test_musique(tmp_path: Path) -> None:
    questions = [
        {
            "id": "2hop__1_2",
            "question": "Where was the author of X born?",
            "paragraphs": [
                {"idx": 0, "title": "Y", "paragraph_text": "Y is a place.", "is_supporting": False},
                {"idx": 1, "title": "X", "paragraph_text": "X was written by Z.", "is_supporting": True},
                {"idx": 2, "title": "Z", "paragraph_text": "Z was born in W.", "is_supporting": True},
            ],
        }
    ]
    data = load_candidates(write(tmp_path / "musique.json", json.dumps(questions)))
    as_jsonl = load_candidates(write(tmp_path / "musique.jsonl", "\n".join(json.dumps(q) for q in questions)))
    assert ranking(as_jsonl) == ranking(data) and texts(as_jsonl) == texts(data) and as_jsonl.qrels == data.qrels
    assert ranking(data) == {"2hop__1_2": ["2hop__1_2-0", "2hop__1_2-1", "2hop__1_2-2"]}
    assert data.candidates[0].scores == [0.0, -1.0, -2.0]
    assert texts(data)["2hop__1_2-2"] == "Z. Z was born in W."
    assert data.qrels == {"2hop__1_2": {"2hop__1_2-0": 0, "2hop__1_2-1": 1, "2hop__1_2-2": 1}}
    numbered = [{**questions[0], "paragraphs": [*questions[0]["paragraphs"], {"idx": 3, "paragraph_text": 7}]}]
    path = write(tmp_path / "numbered.json", json.dumps(numbered))
    with raises(f"{path}: entry [0] paragraph [3]: field 'paragraph_text': expected text, got int"):
        load_candidates(path)
    path = write(tmp_path / "numbered.json", json.dumps([{**questions[0], "question": 12}]))
    with raises(f"{path}: entry [0]: field 'question': expected text, got int"):
        load_candidates(path)


# --- bad input through load_candidates ---


def rank_llm_file(tmp_path: Path, hits: list[dict]) -> Path:
    return write(tmp_path / "cands.json", json.dumps([{"query": "a query", "hits": hits}]))


def hit(docid: str, content: str = "some text", rank: int = 1) -> dict:
    return {"qid": "1", "docid": docid, "content": content, "rank": rank, "score": 10.0 - rank}


def test_malformed_json_names_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path / "broken.json", '[\n  {"query": "q",\n   "hits": [,]}\n]\n')
    with raises(f"{path}:3:13: malformed JSON: Expecting value"):
        load_candidates(path)
    with raises(f"{path}:3:13: malformed JSON: Expecting value"):  # a list cannot be read on past it
        list(load_candidates(path, on_bad_input="skip").candidates)


def test_a_json_lines_line_that_is_no_json_is_skipped_and_counted_under_skip(tmp_path: Path) -> None:
    """A JSON-lines file's lines are independent: a line cut short stopped the run even under skip."""
    good = [{"query": f"query {q}", "hits": [{**hit("a"), "qid": str(q)}]} for q in (1, 2)]
    lines = [json.dumps(good[0]), '{"query": "cut', json.dumps(good[1])]
    path = write(tmp_path / "cands.jsonl", "\n".join(lines) + "\n")
    with raises(f"{path}:2:11: malformed JSON: Unterminated string"):
        list(load_candidates(path).candidates)
    stream = load_candidates(path, on_bad_input="skip")
    assert [c.query.qid for c in stream.candidates] == ["1", "2"] and stream.skipped == {"malformed JSON": 1}
    broken_first = write(tmp_path / "first.jsonl", "\n".join([lines[1], lines[0]]) + "\n")  # the layout's sniff
    assert [c.query.qid for c in load_candidates(broken_first, on_bad_input="skip").candidates] == ["1"]


def test_missing_field_names_entry_and_hit(tmp_path: Path) -> None:
    no_content = {"qid": "1", "docid": "b", "rank": 2}
    path = rank_llm_file(tmp_path, [hit("a"), no_content])
    with raises(f"{path}: entry [0] hit [1]: missing field 'content'"):
        load_candidates(path)


@pytest.mark.parametrize(
    ("bad_hit", "reason", "kind"),
    [
        (hit("b", content="   ", rank=2), "empty passage text for docid b", "empty passage text"),
        (hit("a", rank=2), "duplicate (qid, docid)", "duplicate (qid, docid)"),
        (
            {**hit("b", rank=2), "score": "high"},
            "score 'high' is not a finite number",
            "a score that is not a finite number",
        ),
        ({**hit("b", rank=2), "score": [1]}, "score [1] is not a finite number", "a score that is not a finite number"),
        (
            {**hit("b", rank=2), "score": float("nan")},
            "score nan is not a finite number",
            "a score that is not a finite number",
        ),  # JSON's NaN
        (
            {**hit("b", rank=2), "score": True},
            "score True is not a finite number",
            "a score that is not a finite number",
        ),
        (
            {**hit("b", rank=2), "score": None, "rank": "first"},
            "rank 'first' is not a finite number",
            "a rank that is not a finite number",
        ),
        (
            {**hit("b", rank=2), "content": 5},
            "field 'content': expected text, got int",
            "field 'content': expected text, got int",
        ),
        (
            {**hit("b", rank=2), "content": {"text": "b"}},
            "field 'content': expected text, got dict",
            "field 'content': expected text, got dict",
        ),
        (
            hit("b", content="a\x00b", rank=2),
            "passage of docid b: has a NUL character (\\u0000) at character 1",
            "passage text a tokenizer cannot take",
        ),
        (
            hit("b", content="a\ud800", rank=2),
            "passage of docid b: has a lone UTF-16 surrogate (\\ud800)",
            "passage text a tokenizer cannot take",
        ),
        (
            hit("has space", rank=2),
            "docid 'has space': an id must be non-empty, without whitespace",
            "docid: an id must be non-empty, without whitespace (a TREC run field)",
        ),
        (
            hit("d\n1", rank=2),
            "docid 'd\\n1': an id must be non-empty, without whitespace",
            "docid: an id must be non-empty, without whitespace (a TREC run field)",
        ),
        (
            hit("", rank=2),
            "docid '': an id must be non-empty, without whitespace",
            "docid: an id must be non-empty, without whitespace (a TREC run field)",
        ),
        (
            {**hit("b", rank=2), "qid": "1 2"},
            "qid '1 2': an id must be non-empty, without whitespace",
            "qid: an id must be non-empty, without whitespace (a TREC run field)",
        ),
    ],
)
def test_bad_hit_error_or_skip(tmp_path: Path, bad_hit: dict, reason: str, kind: str) -> None:
    path = rank_llm_file(tmp_path, [hit("a"), bad_hit, hit("c", rank=3)])
    with pytest.raises(InputError) as e:
        load_candidates(path)
    assert f"{path}: entry [0] hit [1]: {reason}" in str(e.value)
    data = load_candidates(path, on_bad_input="skip")
    assert ranking(data) == {"1": ["a", "c"]}
    assert data.candidates[0].scores == [9.0, 7.0]
    assert data.skipped == {kind: 1}  # counted by kind: the record's own values left out


def test_a_json_object_is_no_list_of_entries_and_not_called_malformed(tmp_path: Path) -> None:
    path = write(tmp_path / "one.json", json.dumps({"query": "a query", "hits": [hit("a")]}))
    with pytest.raises(InputError) as error:
        load_candidates(path)
    assert str(error.value) == f"{path}:1:1: expected a JSON list, got a JSON object"


def test_hits_that_are_not_a_list_and_scores_given_as_text(tmp_path: Path) -> None:
    path = write(tmp_path / "cands.json", json.dumps([{"query": "a query", "hits": 5}]))
    with raises(f"{path}: entry [0]: hits: expected a list of hits, got int"):
        load_candidates(path)
    path = write(tmp_path / "cands.json", json.dumps([{"query": 42, "hits": [hit("a")]}]))
    with raises(f"{path}: entry [0]: field 'query': expected text, got int"):
        load_candidates(path)
    path = rank_llm_file(tmp_path, [{**hit("a"), "score": "2.5"}, {**hit("b", rank=2), "score": "1"}])
    assert load_candidates(path).candidates[0].scores == [2.5, 1.0]  # a number as text
    path = rank_llm_file(tmp_path, [{**hit("a"), "score": None}, {**hit("b", rank=2), "score": None}])
    assert load_candidates(path).candidates[0].scores == [-1.0, -2.0]  # no score: minus the rank
    path = rank_llm_file(tmp_path, [{**hit("a"), "score": 10}, {**hit("b", rank=2), "score": None}])
    with raises(f"{path}: entry [0] hit [1]: no score, where this entry's first hits have one: give every hit"):
        load_candidates(path)  # scored -2 among scores of 10: the run and the ranks disagreed


def test_unknown_json_layout(tmp_path: Path) -> None:
    with raises("unknown JSON layout"):
        load_candidates(write(tmp_path / "x.json", json.dumps([{"foo": 1}])))


def test_an_empty_json_list_says_it_holds_no_entries(tmp_path: Path) -> None:
    path = write(tmp_path / "x.json", "[]")
    with raises(f"{path}: no entries (an empty list): nothing to read"):  # was "unknown JSON layout"
        load_candidates(path)


def test_a_hit_of_another_qid_in_an_entry_is_named_and_never_takes_the_entrys_query(tmp_path: Path) -> None:
    entries = [
        {"query": "what causes rain", "hits": [{**hit("d1"), "qid": "q1"}, {**hit("d3", rank=2), "qid": "q2"}]},
        {"query": "how do vaccines work", "hits": [{**hit("d2"), "qid": "q2"}]},
    ]
    path = write(tmp_path / "mixed.json", json.dumps(entries))
    with raises(f"{path}: entry [0] hit [1]: qid q2, but this entry's hits are of qid q1"):  # was blamed on entry [1]
        load_candidates(path)
    data = load_candidates(path, on_bad_input="skip")  # q2 was scored with "what causes rain"
    assert {c.query.qid: (c.query.text, [p.docid for p in c.passages]) for c in data.candidates} == {
        "q1": ("what causes rain", ["d1"]),
        "q2": ("how do vaccines work", ["d2"]),
    }


def test_a_passage_text_that_a_later_input_gives_otherwise_is_warned_of_once(tmp_path: Path, caplog) -> None:
    first = rank_llm_file(tmp_path / "a", [hit("a", content="Rain forms."), hit("b", rank=2)])
    other = [hit("a", content="A completely different passage."), hit("c", rank=2)]
    second = write(tmp_path / "b" / "other.json", json.dumps([{"query": "a query", "hits": other}]))
    joined = RerankingData.union([load_candidates(first), load_candidates(second)])
    assert [p.text for p in joined.candidates[0].passages] == ["Rain forms.", "some text", "some text"]
    streamed = list(join_streams([open_candidates(first), open_candidates(second)], tmp_path / "scratch").candidates)
    assert streamed == joined.candidates
    warned = [r.getMessage() for r in caplog.records if "another passage text" in r.getMessage()]
    assert len(warned) == 2 and all(m.startswith("1 candidate(s) have another passage text") for m in warned)
    assert f"(a; of {first} + {second}): the first input's text is kept" in warned[0]  # it was kept silently


def test_an_empty_query_or_passage_is_named_at_its_own_file_s_line(trec: dict[str, Path]) -> None:
    queries = write(trec["queries"].with_name("blank.tsv"), "q1\t   \nq2\tsecond query\n")
    with raises(f"{queries}:1: empty query text for qid q1"):  # it was named at the run's line
        load_candidates(trec["run"], queries=queries, corpus=trec["corpus"])
    corpus = write(trec["corpus"].with_name("blank.tsv"), "d1\t \t \nd2\tpassage two\nd3\tpassage three\n")
    with raises(f"{corpus}:1: empty passage text for docid d1"):
        load_candidates(trec["run"], queries=trec["queries"], corpus=corpus)


def test_a_qid_repeated_with_another_text_is_found_after_every_needed_qid(trec: dict[str, Path]) -> None:
    queries = write(trec["queries"].with_name("late.tsv"), "q1\tfirst query\nq2\tsecond query\nq1\tanother text\n")
    with raises(f"{queries}:3: qid q1 appears twice with different texts"):  # reading stopped at line 2
        load_candidates(trec["run"], queries=queries, corpus=trec["corpus"])


def test_the_skip_summary_puts_the_most_frequent_kinds_first_and_counts_the_rest() -> None:
    skipped = Counter({f"kind {i}": i for i in range(1, 11)})
    summary = skip_summary(skipped, shown=2)
    assert summary == "10 x kind 10; 9 x kind 9; 36 more, of 8 other kind(s)"
