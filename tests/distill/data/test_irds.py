"""The ``irds:`` loader, on local ir_datasets datasets registered from real DL19 files (no network)."""

from __future__ import annotations

import random
import re
import uuid
from pathlib import Path

import pytest

from distill.core.schema import InputError, RerankingData
from distill.data.loaders import load_candidates, load_qrels
from distill.data.loaders._common import repair_mojibake

DL19 = Path(__file__).resolve().parents[3] / "data" / "trec-dl19"
NUM_QUERIES = 2


class DocsWithoutStore:
    """A docs component with ``docs_iter`` only, as some ir_datasets formats have: no ``docs_store``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def docs_iter(self):
        from ir_datasets.formats import GenericDoc

        with self.path.open(encoding="utf-8") as f:
            for line in f:
                docid, text = line.rstrip("\n").split("\t")
                yield GenericDoc(docid, text)

    def docs_cls(self):
        from ir_datasets.formats import GenericDoc

        return GenericDoc

    def docs_handler(self):
        return self


@pytest.fixture(scope="module")
def raw() -> RerankingData:
    """The first DL19 queries with their BM25 top-100, texts as shipped (MS MARCO mojibake and all)."""
    data = load_candidates(DL19 / "bm25_top100.json", repair_mojibake=False)
    data.candidates = data.candidates[:NUM_QUERIES]
    return data


@pytest.fixture
def files(tmp_path: Path, raw: RerankingData) -> dict[str, Path]:
    """docs, queries, qrels and scoreddocs files; the scoreddocs (a TREC run) in shuffled line order."""
    docs = {p.docid: p.text for c in raw.candidates for p in c.passages}
    lines = [
        f"{c.query.qid} Q0 {p.docid} 0 {s} bm25\n"
        for c in raw.candidates
        for p, s in zip(c.passages, c.scores, strict=True)
    ]
    random.Random(0).shuffle(lines)
    qids = {c.query.qid for c in raw.candidates}
    qrels = [line for line in (DL19 / "qrels.txt").read_text().splitlines(keepends=True) if line.split()[0] in qids]
    paths = {name: tmp_path / f"{name}.tsv" for name in ("docs", "queries", "qrels", "scoreddocs")}
    paths["docs"].write_text("".join(f"{d}\t{t}\n" for d, t in docs.items()), encoding="utf-8")
    paths["queries"].write_text("".join(f"{c.query.qid}\t{c.query.text}\n" for c in raw.candidates))
    paths["qrels"].write_text("".join(qrels))
    paths["scoreddocs"].write_text("".join(lines))
    return paths


def register(*parts: object) -> str:
    """Register an ir_datasets dataset of ``parts`` under a fresh id; return its ``irds:`` name."""
    import ir_datasets
    from ir_datasets.datasets.base import Dataset

    dataset_id = f"distill-test/{uuid.uuid4().hex}"
    ir_datasets.registry.register(dataset_id, Dataset(*parts))
    return f"irds:{dataset_id}"


def local_dataset(files: dict[str, Path], docs: object = None, scoreddocs: bool = True) -> str:
    from ir_datasets.formats import TrecQrels, TrecScoredDocs, TsvDocs, TsvQueries
    from ir_datasets.util import LocalDownload

    return register(
        docs or TsvDocs(LocalDownload(files["docs"])),
        TsvQueries(LocalDownload(files["queries"])),
        TrecQrels(LocalDownload(files["qrels"]), {0: "not relevant", 1: "related", 2: "highly", 3: "perfectly"}),
        TrecScoredDocs(LocalDownload(files["scoreddocs"])) if scoreddocs else None,
    )


@pytest.fixture(autouse=True)
def irds_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IR_DATASETS_HOME", str(tmp_path / "ir_datasets"))
    monkeypatch.setenv("CIS_DISTILL_CACHE", str(tmp_path / "cache"))  # where docs without a store are indexed


def test_candidates_in_score_order_with_texts_and_qrels(files: dict[str, Path], raw: RerankingData):
    data = load_candidates(local_dataset(files))
    first_seen = dict.fromkeys(line.split()[0] for line in files["scoreddocs"].read_text().splitlines())
    assert [c.query.qid for c in data.candidates] == list(first_seen)
    expected = {c.query.qid: c for c in raw.candidates}
    for cands in data.candidates:
        given = expected[cands.query.qid]
        assert cands.query.text == given.query.text
        order = sorted(range(len(given.scores)), key=lambda i: -given.scores[i])
        assert [p.docid for p in cands.passages] == [given.passages[i].docid for i in order]
        assert cands.scores == pytest.approx([given.scores[i] for i in order])
        assert [p.text for p in cands.passages] == [repair_mojibake(given.passages[i].text).strip() for i in order]
    texts = {p.docid: p.text for c in data.candidates for p in c.passages}
    assert texts["2688537"].startswith("FRONTLINE ® Plus")  # the shipped text has "FRONTLINE Â® Plus"
    judged = load_qrels(DL19 / "qrels.txt")
    assert data.qrels == {qid: judged[qid] for qid in expected}


def test_scoreddocs_kept_together_by_query_are_read_a_query_at_a_time(files: dict[str, Path]):
    import ir_datasets

    from distill.data.loaders.irds import scoreddocs_queries

    shuffled = load_candidates(local_dataset(files), depth=20)
    lines = files["scoreddocs"].read_text().splitlines(keepends=True)
    files["scoreddocs"].write_text("".join(sorted(lines, key=lambda line: line.split()[0])))
    name = local_dataset(files)
    qids, together = scoreddocs_queries(ir_datasets.load(name.removeprefix("irds:")))
    assert together and qids == {c.query.qid for c in shuffled.candidates}
    grouped = load_candidates(name, depth=20)
    assert sorted(grouped.candidates, key=lambda c: c.query.qid) == sorted(
        shuffled.candidates, key=lambda c: c.query.qid
    )


def test_depth_keeps_the_top_scored(files: dict[str, Path], raw: RerankingData):
    data = load_candidates(local_dataset(files), depth=10)
    expected = {c.query.qid: c for c in raw.candidates}
    for cands in data.candidates:
        given = expected[cands.query.qid]
        top = sorted(zip(given.scores, (p.docid for p in given.passages), strict=True), reverse=True)[:10]
        assert [p.docid for p in cands.passages] == [docid for _, docid in top]
    with pytest.raises(InputError, match="depth must be positive"):
        load_candidates(local_dataset(files), depth=0)


def test_docs_without_a_store_are_read_once(files: dict[str, Path]):
    with_store = load_candidates(local_dataset(files), depth=20)
    without = load_candidates(local_dataset(files, docs=DocsWithoutStore(files["docs"])), depth=20)
    assert without.candidates == with_store.candidates


def test_unknown_id_and_missing_scoreddocs_are_named(files: dict[str, Path]):
    with pytest.raises(InputError, match="irds:no-such/dataset: unknown ir_datasets id 'no-such/dataset'"):
        load_candidates("irds:no-such/dataset")
    name = local_dataset(files, scoreddocs=False)
    with pytest.raises(InputError, match=f"{name}: ir_datasets dataset .* has no scoreddocs"):
        load_candidates(name)


def test_a_scoreddoc_without_a_passage_is_bad_input(files: dict[str, Path]):
    qid = files["queries"].read_text().split("\t")[0]
    with files["scoreddocs"].open("a") as f:
        f.write(f"{qid} Q0 no-such-doc 0 99.0 bm25\n")
    name = local_dataset(files)
    where = f"{name}: scoreddoc (qid {qid}, docid no-such-doc): docid no-such-doc not in the dataset's docs"
    with pytest.raises(InputError, match=re.escape(where)):
        load_candidates(name)
    skipped = load_candidates(name, on_bad_input="skip")
    assert sum(skipped.skipped.values()) == 1
    assert skipped.num_pairs == 100 * NUM_QUERIES - 1  # the bad scoreddoc, scored highest, took one of the 100


def test_unreadable_files_are_named(files: dict[str, Path]):
    files["scoreddocs"].unlink()
    name = local_dataset(files)
    with pytest.raises(InputError, match=f"{name}: ir_datasets could not read the dataset's files"):
        load_candidates(name)


def test_qrels_from_a_file_an_irds_id_or_a_list_of_them(files: dict[str, Path], tmp_path: Path) -> None:
    """``read_qrels``: what ``data.qrels``, ``eval --qrels`` and export's ``validation_qrels`` take."""
    from ir_datasets.formats import TrecScoredDocs, TsvDocs, TsvQueries
    from ir_datasets.util import LocalDownload

    from distill.data.loaders.qrels import qrels_files, read_qrels

    whole = load_qrels(files["qrels"])
    assert len(whole) > 1 and read_qrels(local_dataset(files)) == whole == read_qrels(str(files["qrels"]))
    first = set(sorted(whole)[: len(whole) // 2])  # two "years": the first queries' judgements, the others'
    lines = files["qrels"].read_text().splitlines(keepends=True)
    halves = [tmp_path / "a.txt", tmp_path / "b.txt"]
    halves[0].write_text("".join(line for line in lines if line.split()[0] in first))
    halves[1].write_text("".join(line for line in lines if line.split()[0] not in first))
    assert read_qrels([str(halves[0]), local_dataset({**files, "qrels": halves[1]})]) == whole  # joined
    assert qrels_files([str(halves[0]), "irds:x/y"]) == [str(halves[0])] and qrels_files(None) == []
    parts = [TsvDocs(LocalDownload(files["docs"])), TsvQueries(LocalDownload(files["queries"])), None]
    unjudged = register(*parts, TrecScoredDocs(LocalDownload(files["scoreddocs"])))
    with pytest.raises(InputError, match=re.escape(f"{unjudged}: the ir_datasets dataset has no qrels")):
        read_qrels(unjudged)


def test_qrels_need_only_qrels_and_unreadable_ones_are_one_line(files: dict[str, Path]) -> None:
    """``--qrels irds:antique/test`` was refused for having no scoreddocs; qrels that could not be downloaded were a
    traceback (RuntimeError: All download sources failed)."""
    from ir_datasets.formats import TrecQrels
    from ir_datasets.util import LocalDownload

    from distill.data.loaders.qrels import read_qrels

    grades = {0: "not relevant", 1: "related", 2: "highly", 3: "perfectly"}
    judged_only = register(None, None, TrecQrels(LocalDownload(files["qrels"]), grades))
    assert read_qrels(judged_only) == load_qrels(files["qrels"])
    missing = register(None, None, TrecQrels(LocalDownload(files["qrels"].with_name("gone.tsv")), grades))
    with pytest.raises(InputError, match=re.escape(f"{missing}: ir_datasets could not read the dataset's files")):
        read_qrels(missing)
