"""The thread sampler, started by its sitecustomize in a child Python process, and its summary of what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import CHECKOUT
from benchmarks.thread_samples import main, summary

CHILD = textwrap.dedent(
    """
    import threading, time

    def wait_for_it():
        time.sleep(0.6)

    def spin_in_a_loop(until):
        while time.monotonic() < until:
            pass

    worker = threading.Thread(target=spin_in_a_loop, args=(time.monotonic() + 0.6,), name="spinner")
    worker.start()
    wait_for_it()
    worker.join()
    """
)


def test_the_sampler_counts_each_named_thread_where_it_is(tmp_path: Path) -> None:
    folder = tmp_path / "samples"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(CHECKOUT / "benchmarks" / "thread_sampling"), os.environ.get("PYTHONPATH", "")]
        ),
        "CIS_THREAD_SAMPLES": str(folder),
        "CIS_THREAD_SAMPLE_MS": "5",
    }
    subprocess.run([sys.executable, "-c", CHILD], env=env, check=True, timeout=60)
    (written,) = folder.glob("*.json")
    record = json.loads(written.read_text())
    assert record["interval"] == 0.005 and record["seconds"] >= 0.6
    threads = {name for _, name, _, _ in record["counts"]}
    assert {"MainThread", "spinner"} <= threads and "thread-sampler" not in threads
    spinner = sum(count for _, name, stack, count in record["counts"] if name == "spinner")
    in_loop = sum(
        count for _, name, stack, count in record["counts"] if name == "spinner" and stack.endswith(":spin_in_a_loop")
    )
    assert spinner >= 40 and in_loop / spinner > 0.9  # 0.6 s at one sample every 5 ms, nearly all in the loop

    text = summary(folder, thread="spinner", top=3, everything=True)
    assert "## spinner:" in text and "spin_in_a_loop" in text and "MainThread" not in text
    assert "0.0 s in http_api.py" in summary(folder, thread=None, top=3)  # no frame of http_api.py: no window
    marked = summary(folder, thread="spinner", top=3, marker="<string>")  # the child's own code marks every bucket
    assert "0.0 s" not in marked and "spin_in_a_loop" in marked

    with pytest.raises(FileNotFoundError, match="no samples"):
        summary(tmp_path, thread=None, top=3)
    with pytest.raises(SystemExit, match="no samples"):
        main([str(tmp_path)])
