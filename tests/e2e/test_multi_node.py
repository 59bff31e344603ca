"""Two nodes on one host, launched as a cluster launches them: one launcher per node, each with its own environment,
meeting over gloo on 127.0.0.1. The teacher runs under ``accelerate launch --num_machines 2``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DL19
from tests.distill.stages.test_teach import _cli, one_process_rows, rows, saved

REPO = Path(__file__).resolve().parents[2]
NODES = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_env(node: int, root: Path) -> dict[str, str]:
    """A node's environment: its own temporary folder and home, one thread."""
    home = root / f"node{node}"
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def teacher_nodes(command: list[str], root: Path, last_node: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    """``accelerate launch`` of ``command`` on each of :data:`NODES` nodes, one process per node, with progress bars
    (which name each process's rank) into ``root/teacher-node<i>.log``; the last node's command line ends with
    ``last_node``."""
    launcher = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    port = free_port()
    return [
        subprocess.Popen(
            [
                launcher,
                "launch",
                "--multi_gpu",  # torchrun underneath; without CUDA the processes meet over gloo
                *["--num_machines", str(NODES), "--machine_rank", str(node), "--num_processes", str(NODES)],
                *["--main_process_ip", "127.0.0.1", "--main_process_port", str(port)],
                *["--mixed_precision", "no", "--dynamo_backend", "no"],
                *command,
                *["--progress", "true"],
                *(last_node if node == NODES - 1 else ()),
            ],
            env=node_env(node, root),
            cwd=REPO,
            stdout=(root / f"teacher-node{node}.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        for node in range(NODES)
    ]


PEER_GRACE_S = 5
"""How long a node whose peer was killed is given to stop on its own before it is killed too, as a scheduler ends
a job's surviving nodes."""


def wait_all(nodes: list[subprocess.Popen], timeout: float = 300) -> list[int]:
    return [node.wait(timeout=timeout) for node in nodes]


def kill_node(node: subprocess.Popen) -> None:
    """SIGKILL the launcher of a node and every process under it, as a lost machine or a scheduler does."""
    import psutil

    try:
        processes = [psutil.Process(node.pid), *psutil.Process(node.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        processes = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    node.wait()


@pytest.mark.slow
def test_two_node_teacher_gives_one_process_dataset(tiny_llama: Path, sample_file: Path, tmp_path: Path) -> None:
    """A shared output folder and p(K) cache, as a cluster's shared filesystem gives them."""
    two = tmp_path / "two"
    nodes = teacher_nodes(_cli(tiny_llama, sample_file, two, tmp_path / "c2"), tmp_path)
    assert wait_all(nodes) == [0, 0]
    assert "log p(K) [rank 0/2]" in (tmp_path / "teacher-node0.log").read_text()  # one process of two
    assert rows(two) == one_process_rows(tiny_llama, sample_file, tmp_path / "one")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cache_dir", "last_node", "expected"),
    [
        (True, ("--prompt", "Question: {query} Answer:"), "prompt: process 0 has 'Q: {query} A:', process 1 has 'Ques"),
        (
            True,
            ("--chunk-size", "3"),
            "chunk_size: process 0 has 2, process 1 has 3: the processes of one distill teach",
        ),
        # the nodes' own homes: each default log p(K) cache would hold half of the passages (a KeyError once scored)
        (False, (), "cache_dir: process 0 has PosixPath("),
    ],
    ids=["prompt", "chunk-size", "default-cache"],
)
def test_nodes_launched_with_other_options_stop_alike_before_scoring(
    tiny_llama: Path, sample_file: Path, tmp_path: Path, cache_dir: bool, last_node: tuple[str, ...], expected: str
) -> None:
    """Half of the chunks scored under each prompt, with exit 0; a chunk size that broke the partial folder for
    every later run."""
    out = tmp_path / "out"
    command = _cli(tiny_llama, sample_file, out, tmp_path / "c2")
    if not cache_dir:
        at = command.index("--cache-dir")
        del command[at : at + 2]
    assert wait_all(teacher_nodes(command, tmp_path, last_node)) == [1, 1]  # the launcher's, for a failed process
    for node in range(NODES):  # the process's one line, then the launcher's report of its exit status
        log = (tmp_path / f"teacher-node{node}.log").read_text()
        assert log.startswith(f"distill teach: error: {expected}") and "exitcode  : 2" in log, log[-2000:]
    assert not out.exists() and not out.with_name("out.partial").exists()


@pytest.mark.slow
def test_a_node_killed_mid_run_then_both_relaunched_gives_the_same_dataset(tiny_llama: Path, tmp_path: Path) -> None:
    """Three DL19 queries' top 60 (180 pairs in 60 chunks), so that a node dies with most chunks to score."""
    sample_file = tmp_path / "sample.json"
    sample_file.write_text(json.dumps([{**e, "hits": e["hits"][:60]} for e in json.loads(DL19.read_text())[:3]]))
    reference = one_process_rows(tiny_llama, sample_file, tmp_path / "reference")
    out, cache = tmp_path / "out", tmp_path / "c2"
    nodes = teacher_nodes(_cli(tiny_llama, sample_file, out, cache), tmp_path)
    deadline = time.monotonic() + 120
    while not saved(out.with_name("out.partial"), "chunks/*.parquet") and time.monotonic() < deadline:
        assert all(node.poll() is None for node in nodes), "a node ended before it was killed"
        time.sleep(0.002)
    kill_node(nodes[1])
    try:  # the other node loses its peer: it stops on its own, or the scheduler ends it
        nodes[0].wait(timeout=PEER_GRACE_S)
    except subprocess.TimeoutExpired:
        kill_node(nodes[0])
    assert not out.exists(), "the run finished before a node was killed"
    assert wait_all(teacher_nodes(_cli(tiny_llama, sample_file, out, cache), tmp_path)) == [0, 0]
    assert rows(out) == reference


def student_nodes(
    config: Path,
    root: Path,
    run_name: str,
    launch: str,
    caches: list[Path | None],
    *options: str,
    last_node: tuple[str, ...] = (),
) -> list[subprocess.Popen]:
    """``distill train --config config *options`` on each of :data:`NODES` nodes, one process per node, launched by
    ``torchrun`` or, with ``launch`` ``slurm``, as ``srun`` starts a task: the ``SLURM_*`` variables of a 2-node job
    and no launcher (Lightning's SLURM environment). Node ``i`` keeps its token store in ``caches[i]``
    (``CIS_DISTILL_CACHE``), or where ``options`` say. The last node's command line ends with ``last_node``."""
    port = free_port()
    train = ["-m", "distill", "train", "--config", str(config), "--run_name", run_name, *options]
    train += ["--trainer.num_nodes", str(NODES), "--trainer.devices", "1", "--trainer.strategy", "ddp"]
    nodes = []
    for node, cache in enumerate(caches):
        env = node_env(node, root)
        if cache is not None:
            env["CIS_DISTILL_CACHE"] = str(cache)
        if launch == "torchrun":
            launcher = shutil.which("torchrun", path=str(Path(sys.executable).parent))
            command = [launcher, "--nnodes", str(NODES), "--node_rank", str(node), "--nproc_per_node", "1"]
            command += ["--master_addr", "127.0.0.1", "--master_port", str(port), *train]
        else:
            command = [sys.executable, *train]
            env.update(
                SLURM_JOB_ID="4242",
                SLURM_JOB_NAME="distill-train",
                SLURM_NTASKS=str(NODES),
                SLURM_NTASKS_PER_NODE="1",
                SLURM_NNODES=str(NODES),
                SLURM_NODELIST="127.0.0.1",
                SLURM_PROCID=str(node),
                SLURM_LOCALID="0",
                SLURM_NODEID=str(node),
                MASTER_PORT=str(port),
            )
        command += list(last_node) if node == NODES - 1 else []
        log = (root / f"{run_name}-node{node}.log").open("w")
        nodes.append(subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
    return nodes


def node_logs(root: Path, run_name: str) -> str:
    return "".join((root / f"{run_name}-node{node}.log").read_text() for node in range(NODES))


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "hf" / "model.safetensors")


SAVED = "students.checkpointing: saved"


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path, teacher_dataset: Path) -> tuple[Path, str]:
    """The reference: the config (one epoch), trained by 2 DDP ranks on one node; its run folder and its log."""
    from tests.distill.stages.test_train import _subprocess_env, write_config

    root = tmp_path_factory.mktemp("one-node")
    config = write_config(root, tiny_bert, teacher_dataset, max_epochs=1)
    command = [sys.executable, "-m", "distill", "train", "--config", str(config), "--run_name", "one-node"]
    command += ["--trainer.devices", "2", "--trainer.strategy", "ddp", "--data.cache_dir", str(root / "tokens")]
    done = subprocess.run(command, env=_subprocess_env(), capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return config, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("launch", "shared"),
    [("torchrun", True), ("slurm", False)],
    ids=["torchrun-shared-cache", "slurm-node-local-caches"],
)
def test_two_node_student_equals_two_ranks_on_one_node(
    one_node: tuple[Path, str], tmp_path: Path, launch: str, shared: bool
) -> None:
    """The weights equal the one-node run's to the bit, and checkpoints are saved once (by global rank 0). A shared
    token store (``data.cache_dir`` on the shared filesystem) is built once in all, node-local ones once per node."""
    import torch

    config, reference_log = one_node
    options = ["--checkpoint_root", str(tmp_path / "runs")]
    options += ["--data.cache_dir", str(tmp_path / "tokens")] if shared else []
    caches = [None, None] if shared else [tmp_path / "node0-cache", tmp_path / "node1-cache"]
    assert wait_all(student_nodes(config, tmp_path, "two-nodes", launch, caches, *options)) == [0, 0]
    logs = node_logs(tmp_path, "two-nodes")
    assert logs.count("student tokens: tokenising") == (1 if shared else NODES), logs[-3000:]
    for cache in caches if not shared else []:
        assert any(cache.rglob("*")), f"{cache} holds no token store"
    assert "GLOBAL_RANK: 1" in logs or "world_size=2" in logs.replace(" ", ""), logs[-3000:]
    assert logs.count(SAVED) == reference_log.count(SAVED) > 0
    theirs, ours = weights(config.parent / "runs" / "one-node"), weights(tmp_path / "runs" / "two-nodes")
    assert theirs.keys() == ours.keys()
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_a_node_killed_then_both_resumed_from_last_ends_with_the_one_node_weights(
    ddp_reference: tuple[Path, Path],
) -> None:
    """Two nodes train the resumable config (a checkpoint every step, 6 steps an epoch over 2 ranks); node 1 is
    SIGKILLed after a checkpoint of the first epoch (node 0 loses its peer and is ended too, as a scheduler ends a
    job); both are launched again with ``--ckpt_path last`` and end with the weights of an uninterrupted 2-rank run
    on one node (the resume tests' "exactly")."""
    from tests.e2e.test_resume import assert_same_weights, saved_steps

    config, reference = ddp_reference
    root, run_name = config.parent, "two-nodes-killed"
    resume = ["--ckpt_path", "last"]
    nodes = student_nodes(config, root, run_name, "torchrun", [None, None], *resume)
    log = root / f"{run_name}-node0.log"
    deadline = time.monotonic() + 300
    while not (steps := saved_steps(log, 0)) or steps[-1] < 3:
        assert all(node.poll() is None for node in nodes), node_logs(root, run_name)[-3000:]
        assert time.monotonic() < deadline, "no checkpoint of step 3"
        time.sleep(0.02)
    kill_node(nodes[1])
    try:
        nodes[0].wait(timeout=PEER_GRACE_S)
    except subprocess.TimeoutExpired:
        kill_node(nodes[0])
    assert not (root / "runs" / run_name / "hf").exists(), "the run finished before a node was killed"
    nodes = student_nodes(config, root, run_name, "torchrun", [None, None], *resume)
    assert wait_all(nodes) == [0, 0], node_logs(root, run_name)[-3000:]
    assert "resumed at epoch" in node_logs(root, run_name)
    assert_same_weights(root / "runs" / run_name, reference)


@pytest.mark.slow
def test_student_nodes_launched_with_another_option_stop_alike_before_training(
    tiny_bert: Path, teacher_dataset: Path, tmp_path: Path
) -> None:
    """Another learning rate on one node trained with exit 0; another batch size hung at the first uneven step."""
    from tests.distill.stages.test_train import write_config

    config = write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=1)
    options = ("--checkpoint_root", str(tmp_path / "runs"))
    nodes = student_nodes(
        config, tmp_path, "split", "torchrun", [None, None], *options, last_node=("--model.lr", "1e-2")
    )
    assert wait_all(nodes) == [1, 1]  # torchrun's, for a failed process
    for node in range(NODES):
        log = (tmp_path / f"split-node{node}.log").read_text()
        line = "distill train: error: model.lr: process 0 has 0.001, process 1 has 0.01: the processes of one"
        assert line in log and "exitcode  : 2" in log and "Traceback" not in log.split(line)[0], log[-3000:]
    assert not list((tmp_path / "runs" / "split").rglob("*.ckpt"))
