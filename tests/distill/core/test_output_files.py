"""Output files written whole: a reader sees the old file or the new one; a link is followed and a device or a pipe
written in place, never replaced; a full disk is one line naming the output."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from distill.cli import main
from distill.core.output_files import hold_output, open_whole, stream_descriptor, written_in_place
from tests.conftest import DISTILL, REPO


def test_a_file_is_replaced_whole_and_a_failed_write_keeps_the_old_one(tmp_path: Path) -> None:
    path = tmp_path / "run.trec"
    path.write_text("old\n")
    with pytest.raises(RuntimeError, match="mid-write"), open_whole(path) as f:
        f.write("half")
        raise RuntimeError("mid-write")
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["run.trec"]
    with open_whole(path) as f:
        f.write("new\n")
    assert path.read_text() == "new\n" and os.listdir(tmp_path) == ["run.trec"]


def test_a_link_is_followed_and_a_pipe_is_written_in_place(tmp_path: Path) -> None:
    """A link to a file: the file is replaced, the link stays. A named pipe (as ``/dev/stdout`` may be), reached
    through a link: written through, the link and the pipe stay (a rename over either would replace it)."""
    target, link, fifo, to_fifo = (tmp_path / name for name in ("real.trec", "link.trec", "fifo", "fifo.trec"))
    link.symlink_to(target)
    os.mkfifo(fifo)
    to_fifo.symlink_to(fifo)
    with open_whole(link) as f:
        f.write("x\n")
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader first: opening the pipe to write then waits not
    try:
        with open_whole(to_fifo) as f:
            f.write("y\n")
        assert os.read(reader, 100) == b"y\n"
    finally:
        os.close(reader)
    assert link.is_symlink() and target.read_text() == "x\n"
    assert to_fifo.is_symlink() and stat.S_ISFIFO(fifo.stat().st_mode)
    assert sorted(os.listdir(tmp_path)) == ["fifo", "fifo.trec", "link.trec", "real.trec"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (a device whose writes find no space)")
def test_a_full_disk_is_one_line_naming_the_output(
    tmp_path: Path, tiny_bert: Path, sample_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = tmp_path / "out" / "run.trec"
    full.parent.mkdir()
    full.symlink_to("/dev/full")
    assert written_in_place(full)  # else a regression would write beside /dev/full and rename over it
    with pytest.raises(OSError) as raised, open_whole(full) as f:
        f.write("z" * 100_000)
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(full))
    args = ["rerank", "--model", str(tiny_bert), "--backend", "torch", "--input", str(sample_file)]
    assert main([*args, "--output", str(full)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert f"distill rerank: error: {full}: No space left on device: free some space and run it again" in err
    assert full.is_symlink() and stat.S_ISCHR(full.stat().st_mode)


def test_a_run_written_to_standard_output_is_followed_there_by_nothing(
    tmp_path: Path, tiny_bert: Path, sample_file: Path
) -> None:
    """An output that is standard output (here a link to ``/dev/stdout``, so that a rename could only replace the
    link) pipes the run: standard output holds its lines only, the summary goes to stderr."""
    stdout = tmp_path / "out" / "stdout.trec"
    stdout.parent.mkdir()
    stdout.symlink_to("/dev/stdout")
    command = [DISTILL, "rerank", "--model", str(tiny_bert), "--backend", "torch", "--input", str(sample_file)]
    done = subprocess.run([*command, "--output", str(stdout)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert len(lines) == 36 and all(len(line) == 6 and line[1] == "Q0" for line in lines)
    assert f"wrote {stdout}: 3 queries, 36 pairs, 0 truncated" in done.stderr
    assert stdout.is_symlink() and os.listdir(stdout.parent) == ["stdout.trec"]


def test_an_eval_record_written_to_standard_output_is_followed_there_by_nothing(tmp_path: Path) -> None:
    """``distill eval --json`` to standard output: standard output holds the JSON record only, the table goes to
    stderr."""
    stdout = tmp_path / "stdout.json"
    stdout.symlink_to("/dev/stdout")
    command = [DISTILL, "eval", "--qrels", str(REPO / "data/trec-dl19/qrels.txt")]
    command += ["--run", str(REPO / "data/teacher/dl19-bm25-smollm2"), "--json", str(stdout)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["metrics"] and "nDCG@10" in done.stderr and stdout.is_symlink()


def test_an_output_is_held_by_one_process_at_a_time_and_freed_when_its_holder_is_killed(tmp_path: Path) -> None:
    output = tmp_path / "runs" / "tiny"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from distill.core.output_files import hold_output; from pathlib import Path; "
         f"lock = hold_output(Path({str(output)!r})); assert lock; print('held', flush=True); input()"],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        assert hold_output(output) is None
        assert (tmp_path / "runs" / ".tiny.lock").is_file() and not output.exists()  # the output is left to its job
    finally:
        holder.kill()  # SIGKILL: no clean-up runs, the kernel drops the lock; its file stays
        holder.wait()
    lock = hold_output(output)  # taken over
    assert lock is not None and hold_output(output) is None
    lock.release()
    assert os.listdir(tmp_path / "runs") == []  # released: nothing left beside the output


def test_a_hold_taken_as_its_file_is_removed_is_taken_again_on_the_new_file(tmp_path: Path) -> None:
    """The file opened by a second process just before the holder removes it and lets go is no longer the lock."""
    import fcntl

    output = tmp_path / "out"
    first = hold_output(output)
    stale = os.open(tmp_path / ".out.lock", os.O_RDWR)  # a second process opened the file, before the release
    first.release()
    fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)  # it then gets the lock of a file no longer there
    second = hold_output(output)  # a third finds no lock file: makes one, and holds it
    assert second is not None and (tmp_path / ".out.lock").is_file()
    os.close(stale)
    second.release()


@pytest.mark.parametrize("through_link", [False, True])
def test_a_run_to_standard_output_that_a_shell_sent_to_a_file_is_appended_there(
    tmp_path: Path, tiny_bert: Path, sample_file: Path, through_link: bool
) -> None:
    """``--output /dev/stdout >> log``: the run is written through the shell's descriptor, after what the log held
    (a rename over ``/dev/stdout``'s file replaced the log with the run)."""
    out = tmp_path / "out"
    out.mkdir()
    log = out / "log.txt"
    log.write_text("earlier line\n")
    output = Path("/dev/stdout")
    if through_link:
        output = out / "stdout.trec"
        output.symlink_to("/dev/stdout")
    command = [DISTILL, "rerank", "--model", str(tiny_bert), "--backend", "torch", "--input", str(sample_file)]
    with log.open("a") as appended:
        done = subprocess.run(
            [*command, "--output", str(output)], stdout=appended, stderr=subprocess.PIPE, text=True, timeout=600
        )
    assert done.returncode == 0, done.stderr
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier line" and len(lines) == 37 and all(len(line.split()) == 6 for line in lines[1:])
    assert f"wrote {output}: 3 queries, 36 pairs, 0 truncated" in done.stderr
    assert sorted(os.listdir(out)) == (["log.txt", "stdout.trec"] if through_link else ["log.txt"])


def test_a_path_names_a_descriptor_through_its_links_only(tmp_path: Path) -> None:
    link = tmp_path / "err"
    link.symlink_to("/dev/stderr")
    assert [stream_descriptor(p) for p in ("/dev/stdout", "/dev/fd/7", "/proc/self/fd/3", link)] == [1, 7, 3, 2]
    regular = tmp_path / "run.trec"
    assert stream_descriptor(regular) is None and stream_descriptor("/dev/shm/run.trec") is None
    assert written_in_place(Path("/dev/stdout")) and not written_in_place(regular)
