"""The teacher's files reused between runs check their contents: p(K) cache segments (teachers/passage_cache.py)
and the teacher stage's chunk files on resume (distill/stages/teach_chunks.py)."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distill.core.checksums import file_digest
from distill.stages import teach as teach_module
from distill.stages.teach import TeachConfig, teach
from teachers.passage_cache import PREFIX, PassageLogProbCache

SETTING = {"teacher": "t", "dtype": "float32", "start_token_id": 1}


def flip(path: Path, at: int | None = None) -> None:
    """Flip the lowest bit of one byte of the file at ``path`` (its middle byte by default); its size is kept."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0x01
    path.write_bytes(bytes(data))


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_a_flipped_byte_in_a_pk_segment_drops_that_segment_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = PassageLogProbCache(tmp_path, SETTING)
    cache.add(["a" * 32, "b" * 32], [-1.5, -2.5])
    cache.add(["c" * 32], [-3.5])
    first, second = sorted(cache.dir.glob("seg-*.jsonl"), key=lambda p: p.stat().st_size, reverse=True)
    assert all(p.name.startswith(PREFIX) for p in (first, second))
    # a digit of a value changes: the line still parses, and only the checksum tells
    text = first.read_text()
    flip(first, text.index("-1.5") + 1)
    assert json.loads(first.read_text().splitlines()[0])[1] != -1.5
    with caplog.at_level("WARNING", logger="teachers.passage_cache"):
        again = PassageLogProbCache(tmp_path, SETTING)
    [warning] = warnings_of(caplog)
    assert str(first) in warning and "does not match the checksum" in warning
    assert "a" * 32 not in again and "b" * 32 not in again and again["c" * 32] == -3.5
    assert not first.exists() and second.exists()  # deleted, so the next run warns no more
    again.add(["a" * 32, "b" * 32], [-1.5, -2.5])  # scored again
    caplog.clear()
    with caplog.at_level("WARNING", logger="teachers.passage_cache"):
        assert len(PassageLogProbCache(tmp_path, SETTING)) == 3
    assert not warnings_of(caplog)


def test_a_zeroed_pk_segment_and_an_earlier_versions_segments(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = PassageLogProbCache(tmp_path, SETTING)
    cache.add(["a" * 32], [-1.0])
    [segment] = cache.dir.glob("seg-*.jsonl")
    segment.write_bytes(bytes(segment.stat().st_size))
    legacy = cache.dir / "seg-0123456789abcdef0123456789abcdef.jsonl"  # no checksum: read where it is
    legacy.write_text(json.dumps(["d" * 32, -4.0]) + "\n")
    with caplog.at_level("WARNING", logger="teachers.passage_cache"):
        again = PassageLogProbCache(tmp_path, SETTING)
    [warning] = warnings_of(caplog)
    assert str(segment) in warning
    assert "a" * 32 not in again and again["d" * 32] == -4.0
    assert list(cache.dir.glob("seg-*.jsonl")) == [legacy]
    # an earlier version's segment that does not parse is deleted the same way
    legacy.write_text(json.dumps(["d" * 32, -4.0])[:-3] + "\n")
    caplog.clear()
    with caplog.at_level("WARNING", logger="teachers.passage_cache"):
        assert "d" * 32 not in PassageLogProbCache(tmp_path, SETTING)
    [warning] = warnings_of(caplog)
    assert str(legacy) in warning and "is malformed" in warning and not legacy.exists()


def config(tiny_llama: Path, sample_file: Path, tmp_path: Path, output: str = "out") -> TeachConfig:
    return TeachConfig(
        input=[str(sample_file)],
        output=str(tmp_path / output),
        teacher=str(tiny_llama),
        scores=["cis", "upr"],
        cache_dir=str(tmp_path / "cache"),
        chunk_size=5,
        max_batch_tokens=256,
        progress=False,
    )


def rows(path: Path) -> list[dict]:
    return datasets.load_from_disk(str(path)).to_list()


def test_a_damaged_teacher_chunk_is_scored_again_on_resume_and_nothing_else(
    tiny_llama: Path,
    sample_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Killed(Exception):
        pass

    def killed(*args, **kwargs):
        raise Killed

    # a run killed once every chunk was written, before they were joined
    monkeypatch.setattr(teach_module, "_merge", killed)
    with pytest.raises(Killed):
        teach(config(tiny_llama, sample_file, tmp_path))
    monkeypatch.undo()
    chunks = sorted((tmp_path / "out.partial" / "chunks").glob("*.parquet"))
    assert len(chunks) == 8 and all("-xxh3-" in p.name for p in chunks)
    reference = pa.concat_tables([pq.read_table(p) for p in chunks]).to_pylist()
    flip(chunks[2])
    chunks[5].write_bytes(bytes(chunks[5].stat().st_size))
    # and a p(K) segment with a flipped byte
    segments = sorted((tmp_path / "cache").rglob("seg-*.jsonl"))
    flip(segments[0])
    written: list[int] = []
    write_chunk = teach_module.write_chunk

    def recording(table, folder, j):
        written.append(j)
        return write_chunk(table, folder, j)

    monkeypatch.setattr(teach_module, "write_chunk", recording)
    with caplog.at_level("WARNING"):
        out = teach(config(tiny_llama, sample_file, tmp_path)).output
    warnings = warnings_of(caplog)
    assert len(warnings) == 3, warnings
    assert sum(str(chunks[j]) in w for j in (2, 5) for w in warnings) == 2
    assert sum(str(segments[0]) in w for w in warnings) == 1
    assert written == [2, 5]  # the damaged chunks only
    assert rows(out) == reference
    # the segment's passages were scored again: the same values, so the same bytes under the same name
    assert sorted((tmp_path / "cache").rglob("seg-*.jsonl")) == segments
    assert segments[0].name == f"{PREFIX}{file_digest(segments[0])}.jsonl"


def test_a_chunk_written_under_another_chunk_size_is_dropped_and_scored_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node launched with --chunk_size 3 beside one with 2 left size-3 chunks under the size-2 fingerprint: every
    later merge stopped with a RuntimeError, --overwrite true included."""
    from distill.stages.teach_chunks import chunk_file, write_chunk

    written = write_chunk(pa.table({"qid": ["q1", "q1", "q2"]}), tmp_path, 1)
    with caplog.at_level("WARNING", logger="distill.stages.teach_chunks"):
        assert chunk_file(tmp_path, 1, 2) is None
    [warning] = warnings_of(caplog)
    assert str(written) in warning and "holds 3 pairs, not the 2 of this run's chunk 1" in warning
    assert not written.exists()
    kept = write_chunk(pa.table({"qid": ["q1", "q1"]}), tmp_path, 1)
    assert chunk_file(tmp_path, 1, 2) == kept
