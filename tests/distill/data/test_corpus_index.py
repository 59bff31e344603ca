"""The corpus index: docid -> text on disk, built once, with the texts and bad-input reports of a read of the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distill.core.schema import InputError
from distill.data.loaders import load_candidates
from distill.data.loaders._common import BadInput
from distill.data.loaders.corpus_index import TextRecord, content_sample, file_index_folder, open_index
from distill.data.loaders.trec import open_corpus, read_corpus

DL19 = Path(__file__).resolve().parents[3] / "data" / "trec-dl19"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CIS_DISTILL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def dl19_passages() -> dict[str, str]:
    """Every DL19 BM25 candidate passage, as shipped (mojibake and all)."""
    data = load_candidates(DL19 / "bm25_top100.json", repair_mojibake=False)
    return {p.docid: p.text for c in data.candidates for p in c.passages}


@pytest.mark.parametrize("layout", ["tsv", "jsonl"])
@pytest.mark.parametrize("repair", [False, True])
def test_every_passage_of_a_real_corpus_is_found_as_a_read_of_the_file_gives_it(
    dl19_passages: dict[str, str], tmp_path: Path, layout: str, repair: bool
) -> None:
    path = tmp_path / f"corpus.{layout}"
    if layout == "tsv":
        path.write_text("".join(f"{d}\t{t}\n" for d, t in dl19_passages.items()), encoding="utf-8")
    else:
        path.write_text("".join(json.dumps({"_id": d, "text": t}) + "\n" for d, t in dl19_passages.items()))
    expected = read_corpus(path, BadInput("error"), repair, needed=None)
    assert len(expected) == len(dl19_passages) > 4000
    with open_corpus(path, BadInput("error"), repair) as index:
        assert index.records == len(expected)
        assert {docid: index.get(docid, BadInput("error")) for docid in expected} == expected
        assert index.get("no-such-docid", BadInput("error")) is None
        assert index.get_many([*expected, "no-such-docid"], BadInput("error")) == [*expected.values(), None]


def test_the_index_is_built_once_and_reopened_without_reading_the_corpus(tmp_path: Path) -> None:
    path = tmp_path / "corpus.tsv"
    path.write_text("d1\tone\nd2\ttwo\n")
    folder = file_index_folder(path, "tsv", True)

    def records():
        yield TextRecord(1, "d1", "one")
        yield TextRecord(2, "d2", "two")

    def never():
        raise AssertionError("the corpus was read again")
        yield

    open_index(folder, path, records()).close()
    with open_index(folder, path, never()) as index:
        assert index.get("d2", BadInput("error")) == "two"
    # Another process opens the same index (the key is the file's path, size and mtime) and finds the texts.
    code = (
        "import sys; from pathlib import Path; from distill.data.loaders._common import BadInput;"
        "from distill.data.loaders.corpus_index import CorpusIndex;"
        "print(CorpusIndex(Path(sys.argv[1]), 'c').get('d1', BadInput('error')))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "one"
    # A changed corpus is another index.
    path.write_text("d1\tone, changed\nd2\ttwo\n")
    os.utime(path, ns=(0, 1))
    assert file_index_folder(path, "tsv", True) != folder
    with open_corpus(path, BadInput("error"), True) as index:
        assert index.get("d1", BadInput("error")) == "one, changed"
    # So is one edited in place with its size and time kept (a copy that keeps times, touch -d).
    folder = file_index_folder(path, "tsv", True)
    path.write_text("d1\tone, CHANGED\nd2\ttwo\n")
    os.utime(path, ns=(0, 1))
    assert file_index_folder(path, "tsv", True) != folder
    with open_corpus(path, BadInput("error"), True) as index:
        assert index.get("d1", BadInput("error")) == "one, CHANGED"


def test_a_content_sample_reads_blocks_from_the_first_byte_to_the_last(tmp_path: Path) -> None:
    path = tmp_path / "corpus.tsv"
    data = bytearray(os.urandom(100_000))
    path.write_bytes(data)
    before = content_sample(path, len(data))
    for where in (0, len(data) - 1):  # an edit of the first or the last byte changes it
        changed = bytearray(data)
        changed[where] ^= 1
        path.write_bytes(changed)
        assert content_sample(path, len(data)) != before
    path.write_bytes(b"d1\tx\n")  # shorter than a block
    short = content_sample(path, 6)
    path.write_bytes(b"d1\ty\n")
    assert content_sample(path, 6) != short


def test_processes_opening_a_new_index_at_once_build_it_once(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "corpus.tsv"
    path.write_text("".join(f"d{i}\tpassage {i}\n" for i in range(50_000)))
    code = (
        "import sys; from pathlib import Path; from distill.data.loaders._common import BadInput;"
        "from distill.data.loaders.trec import open_corpus;"
        "index = open_corpus(Path(sys.argv[1]), BadInput('error'), True);"
        "print(index.get('d49999', BadInput('error')), index.folder)"
    )
    env = {**os.environ, "CIS_DISTILL_CACHE": str(cache)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(3)
    ]
    outs = [p.communicate()[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert {tuple(out) for out in outs} == {("passage", "49999", str(file_index_folder(path, "tsv", True)))}
    assert [p.name for p in (cache / "corpus").iterdir() if p.is_dir()] == [file_index_folder(path, "tsv", True).name]


def test_an_index_changed_since_it_was_written_is_built_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "corpus.tsv"
    path.write_text("".join(f"d{i}\tpassage number {i}\n" for i in range(1000)))
    with open_corpus(path, BadInput("error"), True) as index:
        texts = index.folder / "texts.bin"
    with texts.open("r+b") as f:  # a zeroed block
        f.seek(100)
        f.write(bytes(64))
    with open_corpus(path, BadInput("error"), True) as index:
        assert [index.get(f"d{i}", BadInput("error")) for i in range(1000)] == [
            f"passage number {i}" for i in range(1000)
        ]
    assert "does not match its checksums" in caplog.text and str(index.folder) in caplog.text
    for manifest in ("", '{"checks', "[1]", "\xff"):  # a truncated, emptied or foreign index.json: built again
        (index.folder / "index.json").write_text(manifest, encoding="latin-1")
        with open_corpus(path, BadInput("error"), True) as again:
            assert again.get("d7", BadInput("error")) == "passage number 7"


def test_bad_lines_are_reported_as_a_read_of_the_file_reports_them(tmp_path: Path) -> None:
    path = tmp_path / "corpus.tsv"
    path.write_text(
        "d1\tone\n"
        "no tab on this line\n"  # bad wherever it is
        "d2\ttoo\tmany\tfields\n"  # bad where d2 is needed
        "d3\tthree\n"
        "d3\tthree, again\n"  # bad where d3 is needed
        "d1\tone\n"  # a repeat with the same text: fine
    )
    with pytest.raises(InputError, match=rf"{path}:2: expected 'docid<TAB>text"):
        open_corpus(path, BadInput("error"), True)
    bad = BadInput("skip")
    with open_corpus(path, bad, True) as index:
        assert sum(bad.skipped.values()) == 1
        assert index.get("d1", bad) == "one" and sum(bad.skipped.values()) == 1
        assert index.get("d2", bad) is None and sum(bad.skipped.values()) == 2
        assert index.get("d3", bad) == "three" and sum(bad.skipped.values()) == 3
        assert index.get("d3", bad) == "three" and sum(bad.skipped.values()) == 3  # reported once
    with (
        open_corpus(path, BadInput("skip"), True) as index,
        pytest.raises(InputError, match=rf"{path}:5: docid d3 appears twice with different texts"),
    ):
        index.get("d3", BadInput("error"))
    reference = BadInput("skip")
    read_corpus(path, reference, True, needed={"d1", "d2", "d3"})
    assert reference.skipped == bad.skipped
    many = BadInput("skip")
    with open_corpus(path, many, True) as index:
        assert index.get_many(["d3", "d1", "d2", "d9"], many) == ["three", "one", None, None]
    assert many.skipped == bad.skipped


def test_a_corpus_line_that_is_no_json_is_named_or_skipped_as_the_other_bad_lines(tmp_path: Path, cache: Path) -> None:
    """The lines of JSON lines are independent: one cut short stopped the run even under --on_bad_input skip."""
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"_id": "d1", "text": "one"}\n{"_id": "d2", "text": \n{"_id": "d3", "text": "three"}\n')
    with pytest.raises(InputError, match=rf"^{path}:2: malformed JSON at column 23: Expecting value \(--on_bad"):
        open_corpus(path, BadInput("error"), True)
    skip = BadInput("skip")
    with open_corpus(path, skip, True) as index:
        assert index.get_many(["d3", "d1", "d2"], skip) == ["three", "one", None]
    assert skip.skipped["malformed JSON"] == 1
