"""What the processes of one teacher job must share, checked by two real processes (torchrun, gloo): the folders the
main process writes in, and the news that its merge failed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_multi_node import free_port

REPO = Path(__file__).resolve().parents[3]
WORKER = r"""
import os
import sys
from pathlib import Path

from distill.cli import leave_process_group
from distill.stages import teach

state = teach.process_state()
root = Path(sys.argv[1])
teach.SHARED_WAIT_S = 1.0


def attempt(case, step):
    try:
        step()
        outcome = "ok"
    except Exception as e:
        outcome = f"{type(e).__name__}: {e}"
    os.write(1, f"outcome {case} {state.process_index} {outcome}\n".encode())  # one write: lines never interleave


# a node-local folder: each process sees only its own
attempt("local", lambda: teach.check_shared(root / f"node{state.process_index}", state, "output", root / "out"))
attempt("shared", lambda: teach.check_shared(root / "shared", state, "cache_dir", root / "shared"))
# the main process's merge fails (no config to write the dataset's metadata from)
attempt("merge", lambda: teach._merge(state, root / "work", root / "out", 4, None, {}, None, None))
leave_process_group()  # as the command line's main does
"""


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The worker's outcome of each case on each process (``<case> <rank>`` -> ``ok`` or the error)."""
    root = tmp_path_factory.mktemp("processes")
    worker = root / "worker.py"
    worker.write_text(WORKER)
    torchrun = Path(sys.executable).parent / "torchrun"
    done = subprocess.run(
        [str(torchrun), "--nproc_per_node", "2", "--master_port", str(free_port()), str(worker), str(root)],
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcomes = {}
    for line in done.stdout.splitlines():
        if line.startswith("outcome "):
            _, case, rank, outcome = line.split(" ", 3)
            outcomes[f"{case} {rank}"] = outcome
    return root, outcomes


def test_a_folder_one_process_does_not_see_is_refused_on_every_process(two_processes: tuple) -> None:
    root, outcomes = two_processes
    expected = f"InputError: teach: output: {root / 'out'}: process 1 does not see what process 0 writes there"
    assert outcomes["local 0"].startswith(expected) and outcomes["local 1"] == outcomes["local 0"]


def test_a_shared_folder_passes_and_keeps_no_marker(two_processes: tuple) -> None:
    root, outcomes = two_processes
    assert outcomes["shared 0"] == outcomes["shared 1"] == "ok"
    assert list((root / "shared").iterdir()) == []


def test_a_failed_merge_on_the_main_process_is_no_success_on_the_others(two_processes: tuple) -> None:
    """The other process said ``wrote <output>`` and exited 0, with no dataset there."""
    root, outcomes = two_processes
    assert outcomes["merge 0"].startswith("AttributeError: ")
    assert (
        outcomes["merge 1"]
        == f"PeerProcessFailed: {root / 'out'}: process 0 failed to write the dataset: its error says why"
    )
