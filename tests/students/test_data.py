"""The student stage's GPU levers, pinned on a CPU with a tiny random BERT: token-budget batches of few shapes,
padding that leaves the loss unchanged, steps without host syncs, the learning rate that follows the effective
batch, and the compiled encoder."""

from __future__ import annotations

import functools
import json
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from pytorch_lightning import Callback, Trainer
from pytorch_lightning.loggers import CSVLogger

from distill.cli import main
from distill.core.batching import round_up
from distill.core.schema import InputError
from students.data import StudentDataModule
from students.losses import LOSSES, build_loss
from students.module import CrossEncoderModule
from students.optim import adamw, scaled_lr
from students.sampling import TokenBudgetBatches
from tests.distill.stages.test_train import write_config

BUDGET = 512
MULTIPLE = 64


def data_module(teacher_dataset: Path, tiny_bert: Path, **options) -> StudentDataModule:
    options = {"max_batch_tokens": BUDGET, "pad_to_multiple_of": MULTIPLE, "max_length": 128, "label": "cis", **options}
    dm = StudentDataModule([str(teacher_dataset)], backbone=str(tiny_bert), val_queries=1, **options)
    dm.setup("fit")
    return dm


def cpu_trainer(*callbacks: Callback, **options) -> Trainer:
    """A Lightning trainer on the CPU that writes nothing (no checkpoints, logger, progress bar or summary)."""
    quiet = {"enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}
    return Trainer(
        accelerator="cpu", devices=1, use_distributed_sampler=False, callbacks=list(callbacks),
        **{**quiet, "logger": False, **options},
    )  # fmt: skip


def capture_compiles(monkeypatch: pytest.MonkeyPatch) -> list[torch.fx.GraphModule]:
    """Make ``torch.compile`` use a backend that runs each captured graph as it is and records it: the list fills
    with every graph compiled from now on (dynamo's caches reset first)."""
    graphs: list[torch.fx.GraphModule] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=capture))
    return graphs


def fit(module: CrossEncoderModule, dm: StudentDataModule, steps: int, *callbacks: Callback, **trainer) -> Trainer:
    trainer = cpu_trainer(*callbacks, max_steps=steps, limit_val_batches=0, num_sanity_val_steps=0, **trainer)
    trainer.fit(module, datamodule=dm)
    return trainer


# ----------------------------------------------------------------------------- token-budget batches


def test_token_budget_batches_cover_every_example_within_the_budget_in_few_shapes() -> None:
    lengths = np.random.default_rng(0).integers(10, 300, 500).tolist()
    sampler = TokenBudgetBatches(lengths, 4096, MULTIPLE, seed=1)
    epoch_0 = list(sampler)
    assert sorted(i for b in epoch_0 for i in b) == list(range(500))
    shapes = [(len(b), max(round_up(lengths[i], MULTIPLE) for i in b)) for b in epoch_0]
    assert all(n * width <= 4096 and width % MULTIPLE == 0 for n, width in shapes)
    full = [(4096 // width, width) for width in range(MULTIPLE, 321, MULTIPLE)]
    assert sum(shape not in full for shape in shapes) <= 1  # the window's last batch
    assert len(set(shapes)) <= len(full) + 1
    spread = np.mean([max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in epoch_0])
    assert spread < 0.5 * (max(lengths) - min(lengths))  # sorted by length: pairs of a batch are alike

    assert list(TokenBudgetBatches(lengths, 4096, MULTIPLE, seed=1)) == epoch_0  # deterministic under the seed
    assert list(TokenBudgetBatches(lengths, 4096, MULTIPLE, seed=2)) != epoch_0
    sampler.set_epoch(1)
    epoch_1 = list(sampler)
    assert epoch_1 != epoch_0 and len(epoch_1) == len(epoch_0)  # the whole epoch as window: as many batches

    windowed = list(TokenBudgetBatches(lengths, 4096, MULTIPLE, window=100, seed=1))
    assert sorted(i for b in windowed for i in b) == list(range(500))
    assert sum((len(b), max(round_up(lengths[i], MULTIPLE) for i in b)) not in full for b in windowed) <= 5
    ranks = [list(TokenBudgetBatches(lengths, 4096, MULTIPLE, seed=1, rank=r, world_size=3)) for r in range(3)]
    assert len({len(r) for r in ranks}) == 1
    assert [0] in list(TokenBudgetBatches([700, 20, 20], 512, MULTIPLE))  # longer than the budget: alone
    with pytest.raises(ValueError, match="positive"):
        TokenBudgetBatches(lengths, 0)


def test_token_budget_batches_hold_whole_query_groups() -> None:
    rng = np.random.default_rng(0)
    qids = [f"q{i % 9}" for i in range(108)]  # 12 candidates a query: 3 groups of 4
    lengths = rng.integers(10, 200, 108).tolist()
    batches = list(TokenBudgetBatches(lengths, 2048, MULTIPLE, qids, 4, seed=0))
    assert sorted(i for b in batches for i in b) == list(range(108))
    for batch in batches:
        counts = Counter(qids[i] for i in batch)
        assert all(n % 4 == 0 for n in counts.values()), counts
        assert len(batch) * max(round_up(lengths[i], MULTIPLE) for i in batch) <= 2048
    with pytest.raises(ValueError, match="group_size"):
        TokenBudgetBatches(lengths, 2048, MULTIPLE, qids, 1)


def test_bucketed_batches_have_bucket_shapes_and_the_loss_of_unpadded_pairs(
    teacher_dataset: Path, tiny_bert: Path
) -> None:
    dm = data_module(teacher_dataset, tiny_bert)
    batches = list(dm.train_dataloader())
    assert sum(len(b["target"]) for b in batches) == len(dm.train)
    buckets = {(BUDGET // width, width) for width in range(MULTIPLE, round_up(128, MULTIPLE) + 1, MULTIPLE)}
    shapes = [tuple(b["input_ids"].shape) for b in batches]
    assert sum(shape not in buckets for shape in shapes) <= 1, shapes  # the epoch's last batch may be short
    assert all(width % MULTIPLE == 0 and n * width <= BUDGET for n, width in shapes)

    module = CrossEncoderModule(backbone=str(tiny_bert), loss="mse")
    module.configure_model()
    module.model.eval()  # dropout off: padded and unpadded pairs must score alike
    with torch.no_grad():
        for batch in batches:
            scores = module(batch)
            alone = []
            for row in range(len(scores)):
                n = int(batch["attention_mask"][row].sum())
                single = {k: batch[k][row : row + 1, :n] for k in ("input_ids", "attention_mask", "token_type_ids")}
                alone.append(module(single))
            alone = torch.cat(alone)
            torch.testing.assert_close(scores, alone, atol=1e-5, rtol=1e-5)
            padded = module.loss_fn(scores, batch["target"], batch["group"])
            unpadded = module.loss_fn(alone, batch["target"], batch["group"])
            assert padded.item() == pytest.approx(unpadded.item(), rel=1e-5, abs=1e-6)


def test_query_groups_survive_the_token_budget(teacher_dataset: Path, tiny_bert: Path) -> None:
    dm = data_module(teacher_dataset, tiny_bert, group_size=4, max_batch_tokens=1024)
    for batch in dm.train_dataloader():
        assert all(n % 4 == 0 for n in Counter(batch["group"].tolist()).values())


# ----------------------------------------------------------------------------- no host syncs in a step


HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")


class CountHostReads(Callback):
    """The tensor reads to the host (``.item()``, ``.cpu()``, ...) between each training batch's start and end.

    AdamW's step counts are left out: they are host tensors on every device (a GPU's fused AdamW keeps them on
    the GPU and reads none)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.per_step: list[int] = []
        self.count = 0
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)

            @functools.wraps(original)
            def counted(tensor, *args, _original=original, **kwargs):
                if not sys._getframe(1).f_globals.get("__name__", "").startswith("torch.optim"):
                    self.count += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)

    def on_train_batch_start(self, *args) -> None:
        self.count = 0

    def on_train_batch_end(self, *args) -> None:
        self.per_step.append(self.count)


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_training_steps_read_the_host_only_when_they_log(
    teacher_dataset: Path, tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loss: str
) -> None:
    group_size = 4 if LOSSES[loss].within_query else None
    dm = data_module(teacher_dataset, tiny_bert, group_size=group_size, max_batch_tokens=1024)
    module = CrossEncoderModule(backbone=str(tiny_bert), loss=loss)
    counter = CountHostReads(monkeypatch)
    logger = CSVLogger(tmp_path)
    fit(module, dm, 6, counter, logger=logger, log_every_n_steps=3, gradient_clip_val=1.0)
    assert len(counter.per_step) == 6
    logging_steps = [2, 5]  # Lightning writes the logs after steps 3 and 6
    assert [n for step, n in enumerate(counter.per_step) if step not in logging_steps] == [0, 0, 0, 0]
    assert all(counter.per_step[step] >= 1 for step in logging_steps)
    logged = (Path(logger.log_dir) / "metrics.csv").read_text()
    assert "train/loss" in logged and "train/samples_per_s" in logged


def test_the_benchmark_counts_host_syncs_and_not_the_sync_debug_modes_notice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first ``torch.cuda.set_sync_debug_mode`` of a process warns that the mode "does not yet detect all
    synchronizing operations" (``TORCH_WARN_ONCE``). The H200 suite counted that notice as the stage's one host sync:
    the stage is the benchmark's first phase to set the mode (the plain loop's 275 were 5 a step, none extra)."""
    import warnings

    from benchmarks import train_throughput

    notice = ["Synchronization debug mode is a prototype feature and does not yet detect all synchronizing operations"]

    def set_sync_debug_mode(mode: str) -> None:  # CUDA's, without a GPU: the notice once a process
        if notice:
            warnings.warn(notice.pop(), UserWarning, stacklevel=2)

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_sync_debug_mode)
    syncs = train_throughput.HostSyncs(torch.device("cuda"))
    syncs.start()
    syncs.stop()
    assert (syncs.count, syncs.sites, notice) == (0, [], [])
    syncs.start()
    sync = f"{train_throughput.SYNC_WARNING} (Triggered internally at CUDAFunctions.cpp:155.)"
    warnings.warn(sync, UserWarning, stacklevel=1)  # as a synchronising call on this line warns
    syncs.stop()
    assert syncs.count == 1 and syncs.sites[0].startswith("tests/students/test_data.py:")


def test_the_benchmark_times_the_stage_that_distill_train_builds_from_its_config(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path
) -> None:
    """``python -m benchmarks.train_throughput ... -- ARGS`` times ``distill train ARGS``: the learning rate scaled
    to the config's budget, its clipping and padding multiple; the plain loop takes the same optimiser settings and
    trains on the same pairs; nothing is written where the config's runs go."""
    from benchmarks import train_throughput

    config = write_config(tmp_path, tiny_bert, teacher_dataset, gradient_clip_val=0.5)
    train = ["--config", str(config), "--model.lr_scaling", "sqrt", "--model.lr_reference_tokens", "256"]
    train += ["--data.max_batch_tokens", "512", "--data.pad_to_multiple_of", "64"]
    out = tmp_path / "result.json"
    argv = ["--warmup_steps", "1", "--steps", "2", "--matmul_size", "64", "--matmul_reps", "1", "--out", str(out)]
    assert train_throughput.main([*argv, "--", *train]) == 0
    result = json.loads(out.read_text())
    work = result["workload"]
    assert work["optimizer"]["lr"] == pytest.approx(1e-3 * math.sqrt(512 / 256))
    assert work["optimizer"]["gradient_clip_val"] == 0.5 and work["loss"] == "mse"
    assert (work["max_batch_tokens"], work["plain_batch_size"], work["pad_to_multiple_of"]) == (512, 4, 64)
    assert result["check"]["ok"] and result["stage"]["steps"] == 2
    assert result["command"].endswith(" -- " + " ".join(train)) and not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- the epoch boundary


def worker_pids(loader: torch.utils.data.DataLoader) -> tuple[int, ...] | None:
    """The process ids of the workers of ``loader``'s kept iterator (None: it keeps none)."""
    iterator = loader._iterator
    return None if iterator is None else tuple(w.pid for w in iterator._workers)


LOADER_PROBE = """
import json, sys
from pathlib import Path

from pytorch_lightning import Callback

from students.module import CrossEncoderModule
from tests.students.test_data import cpu_trainer, data_module, worker_pids

seen, loaders = {"train": set(), "val": set()}, {}


class Pids(Callback):
    def on_train_batch_start(self, trainer, *args):
        loaders["train"] = trainer.train_dataloader
        seen["train"].add(worker_pids(trainer.train_dataloader))

    def on_validation_batch_start(self, trainer, *args):
        loaders["val"] = trainer.val_dataloaders
        seen["val"].add(worker_pids(trainer.val_dataloaders))


dataset, backbone = Path(sys.argv[1]), Path(sys.argv[2])
trainer = cpu_trainer(Pids(), max_epochs=2)
trainer.fit(CrossEncoderModule(backbone=str(backbone)), datamodule=data_module(dataset, backbone, num_workers=1))
print("RESULT" + json.dumps({
    "epochs": trainer.current_epoch,
    "seen": {name: [list(p) if p is not None else None for p in pids] for name, pids in seen.items()},
    "shut_down": all(loader._iterator is None for loader in loaders.values()),
    "alive_after": [pid for pids in seen.values() for p in pids if p for pid in p if Path(f"/proc/{pid}").exists()],
}))
"""


def test_loader_workers_persist_across_epochs_and_validations_and_end_with_the_fit(
    teacher_dataset: Path, tiny_bert: Path
) -> None:
    """With workers, neither an epoch's start nor a validation forks new ones and waits for the old ones to exit: the
    training and the validation loader each keep theirs from their first batch to the end of the fit, which ends
    them. The fit runs in a fresh interpreter, as ``distill train`` does: a loader forks its workers from it, and a
    fork of a test worker that many earlier tests left threads in is not what users run."""
    import subprocess

    from tests.conftest import REPO

    done = subprocess.run(
        [sys.executable, "-c", LOADER_PROBE, str(teacher_dataset), str(tiny_bert)],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.rsplit("RESULT", 1)[1])
    seen = result["seen"]
    assert result["epochs"] == 2 and result["shut_down"]
    assert all(len(pids) == 1 and pids[0] is not None and len(pids[0]) == 1 for pids in seen.values()), seen
    assert result["alive_after"] == []  # the fit's end ended them, while the trainer's process still ran


# ----------------------------------------------------------------------------- optimiser and learning rate


def test_learning_rate_follows_the_effective_batch(teacher_dataset: Path, tiny_bert: Path) -> None:
    assert scaled_lr(1e-4, "none", 4096, 1024) == 1e-4
    assert scaled_lr(1e-4, "sqrt", 4096, 1024) == pytest.approx(2e-4)
    assert scaled_lr(1e-4, "linear", 4096, 1024) == pytest.approx(4e-4)
    assert scaled_lr(1e-4, "sqrt", 256, 1024) == pytest.approx(0.5e-4)

    dm = data_module(teacher_dataset, tiny_bert)
    module = CrossEncoderModule(
        backbone=str(tiny_bert), lr=1e-4, lr_scaling="sqrt", lr_reference_tokens=256, batch_tokens=BUDGET
    )
    trainer = fit(module, dm, 1, accumulate_grad_batches=2)
    (optimizer,) = trainer.optimizers
    peak = optimizer.param_groups[0]["initial_lr"]
    assert peak == pytest.approx(1e-4 * math.sqrt(BUDGET * 2 / 256))
    assert optimizer.defaults["foreach"] and not optimizer.defaults["fused"]  # on a CPU; fused on a GPU
    with pytest.raises(InputError, match="max_batch_tokens"):
        CrossEncoderModule(backbone=str(tiny_bert), lr_scaling="sqrt", lr_reference_tokens=256)


@pytest.mark.parametrize("name", sorted(name for name, loss in LOSSES.items() if loss.within_query))
def test_losses_given_the_hosts_group_sizes_read_nothing_back(name: str) -> None:
    """Given the host's (queries, largest group), a within-query loss reads no tensor value back to the host (no
    ``aten._local_scalar_dense``: what ``.item()``, ``.tolist()`` and ``int(tensor)`` run, a device sync on a GPU);
    without them a listwise loss, which pads each query to the largest group, must, and both give the same loss."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from students.losses import TemperatureLoss

    class ReadBacks(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func is torch.ops.aten._local_scalar_dense.default
            return func(*args, **(kwargs or {}))

    loss = build_loss(name)
    scores, targets = torch.randn(9, requires_grad=True), torch.randn(9)
    groups = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2, 2])
    with ReadBacks() as given:
        with_sizes = loss(scores, targets, groups, (3, 4))
    with ReadBacks() as found:
        without = loss(scores, targets, groups)
    assert given.count == 0
    assert (found.count > 0) == isinstance(loss, TemperatureLoss)  # pairwise losses never need the sizes
    torch.testing.assert_close(with_sizes, without)


def test_adamw_decays_weight_matrices_only() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = adamw(model.named_parameters(), 1e-3, 0.1)
    decayed, plain = optimizer.param_groups
    assert (decayed["weight_decay"], plain["weight_decay"]) == (0.1, 0.0)
    assert [p.shape for p in decayed["params"]] == [(4, 4)] and len(plain["params"]) == 3


def test_train_cli_scales_the_lr_from_the_config_and_names_a_missing_budget(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys, caplog
) -> None:
    path = write_config(tmp_path, tiny_bert, teacher_dataset, max_steps=2, limit_val_batches=0)
    argv = ["train", "--config", str(path), "--model.lr_scaling", "sqrt", "--model.lr_reference_tokens", "256"]
    assert main(argv) == 2
    assert "data.max_batch_tokens" in capsys.readouterr().err
    assert main([*argv, "--data.max_batch_tokens", "1024", "--data.pad_to_multiple_of", "64"]) == 0
    assert "learning rate 0.002: 0.001 at 256 tokens a step, sqrt-scaled to 1024" in caplog.text


# ----------------------------------------------------------------------------- torch.compile


@pytest.mark.parametrize("unpad", [False, True])
def test_compiled_blocks_compile_a_handful_of_times_and_train_like_eager(
    teacher_dataset: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch, unpad: bool
) -> None:
    """Compiled with a backend that runs the captured graphs as they are (no fused kernels), the encoder trains to
    the eager weights, and the graphs are captured a few times for many batch shapes (unpadded: a new number of
    real tokens every step)."""
    graphs = capture_compiles(monkeypatch)
    dm = data_module(teacher_dataset, tiny_bert, pad_to_multiple_of=16)  # many shapes, to count the compiles
    shapes = {tuple(b["input_ids"].shape) for b in dm.train_dataloader()}
    assert len(shapes) >= 4
    weights = []
    for compiled in (False, True):
        torch.manual_seed(0)
        module = CrossEncoderModule(backbone=str(tiny_bert), compile=compiled, unpad=unpad)
        if unpad:
            without_dropout(module)  # the unpadded path draws no attention dropout; eager and compiled alike
        fit(module, dm, 12, max_epochs=3)
        weights.append({k: v.clone() for k, v in module.model.state_dict().items()})
    assert weights[0].keys() == weights[1].keys()  # compiled in place: the checkpoint keys stay
    for key in weights[0]:
        torch.testing.assert_close(weights[1][key], weights[0][key], atol=1e-5, rtol=1e-4)
    assert 1 <= len(graphs) <= 4, f"{len(graphs)} graphs for {len(shapes)} shapes"
    torch._dynamo.reset()


class CountGraphs(Callback):
    """The graphs captured so far (``graphs``), at the start of each training epoch and at the end of training
    (:attr:`at_epochs`), and before and after each validation (:attr:`validations`)."""

    def __init__(self, graphs: list[torch.fx.GraphModule]) -> None:
        self.graphs = graphs
        self.at_epochs: list[int] = []
        self.validations: list[tuple[int, int]] = []

    def on_train_epoch_start(self, *args) -> None:
        self.at_epochs.append(len(self.graphs))

    def on_train_end(self, *args) -> None:
        self.at_epochs.append(len(self.graphs))

    def on_validation_start(self, *args) -> None:
        self.validations.append((len(self.graphs), -1))

    def on_validation_end(self, *args) -> None:
        self.validations[-1] = (self.validations[-1][0], len(self.graphs))


@pytest.mark.parametrize("unpad", [False, True])
def test_compiled_training_compiles_in_its_first_epoch_only(
    teacher_dataset: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch, unpad: bool
) -> None:
    """What comes between epochs (the validation, eager in eval mode under inference mode, with its batches of other
    shapes; the switch back to training; the loader's restart) compiles nothing, and every epoch after the first
    reuses the first one's graphs: its batches have the same shapes in another order."""
    graphs = capture_compiles(monkeypatch)
    dm = data_module(teacher_dataset, tiny_bert, pad_to_multiple_of=16)  # many shapes
    counter = CountGraphs(graphs)
    trainer = cpu_trainer(counter, max_epochs=3)
    trainer.fit(CrossEncoderModule(backbone=str(tiny_bert), compile=True, unpad=unpad), datamodule=dm)
    first_epoch = counter.at_epochs[1]
    assert first_epoch >= 1 and counter.at_epochs == [0, first_epoch, first_epoch, first_epoch]
    assert len(counter.validations) == 4 and all(before == after for before, after in counter.validations)
    torch._dynamo.reset()


def test_the_gpu_config_parses_and_says_how_the_lr_scales() -> None:
    import yaml

    from distill.stages.train import check_train_args

    path = Path(__file__).resolve().parents[2] / "configs" / "train" / "bert-large-gpu.yaml"
    check_train_args(["--config", str(path)], str(path))
    config = yaml.safe_load(path.read_text())
    model = config["model"]
    assert model["lr_scaling"] == "sqrt" and model["lr_reference_tokens"] > 0 and model["compile"] is True
    assert model["unpad"] is True
    assert config["data"]["num_workers"] > 0  # kept for the whole run: see the epoch boundary's tests


# ----------------------------------------------------------------------------- the unpadded encoder


def without_dropout(module: CrossEncoderModule) -> CrossEncoderModule:
    """The module with its backbone built and every dropout at 0: padded and unpadded training then compute the
    same function (the unpadded path applies no attention dropout; hidden dropout would draw other masks)."""
    module.configure_model()
    for layer in module.model.modules():
        if isinstance(layer, torch.nn.Dropout):
            layer.p = 0.0
    return module


def test_unpadded_training_computes_on_real_tokens_and_trains_like_padded(
    teacher_dataset: Path, tiny_bert: Path
) -> None:
    dm = data_module(teacher_dataset, tiny_bert)
    batch = next(iter(dm.train_dataloader()))
    real = int(batch["attention_mask"].sum())
    assert batch["packing"]["indices"].tolist() == torch.nonzero(batch["attention_mask"].flatten())[:, 0].tolist()
    assert batch["packing"]["cu_seqlens"][-1] == real and real < batch["attention_mask"].numel()
    weights, rows = [], []
    for unpad in (False, True):
        torch.manual_seed(0)
        module = without_dropout(CrossEncoderModule(backbone=str(tiny_bert), unpad=unpad))
        dense = module.model.base_model.encoder.layer[0].intermediate.dense
        dense.register_forward_hook(lambda layer, args, out: rows.append(args[0].shape[:-1].numel()))
        fit(module, dm, 6)
        weights.append({k: v.clone() for k, v in module.model.state_dict().items()})
    padded_rows, unpadded_rows = rows[:6], rows[6:]
    assert sum(unpadded_rows) < 0.8 * sum(padded_rows)  # padding to a multiple of 64 is gone
    for key in weights[0]:
        torch.testing.assert_close(weights[1][key], weights[0][key], atol=1e-5, rtol=1e-4)


def test_unpadded_training_steps_read_the_host_only_when_they_log(
    teacher_dataset: Path, tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dm = data_module(teacher_dataset, tiny_bert, group_size=4, max_batch_tokens=1024)
    module = CrossEncoderModule(backbone=str(tiny_bert), loss="listwise_kl", unpad=True)
    counter = CountHostReads(monkeypatch)
    fit(module, dm, 6, counter, logger=CSVLogger(tmp_path), log_every_n_steps=3)
    assert [n for step, n in enumerate(counter.per_step) if step not in (2, 5)] == [0, 0, 0, 0]


def test_train_queries_keeps_a_seeded_share_of_the_training_queries(teacher_dataset: Path, tiny_bert: Path) -> None:
    """A learning curve's point: fewer training queries, the same held-out ones, the same pick every time."""
    full = data_module(teacher_dataset, tiny_bert)
    rest = set(full.train.qid)
    assert len(rest) >= 2
    for size in (1, 1 / len(rest)):
        fewer = data_module(teacher_dataset, tiny_bert, train_queries=size)
        assert set(fewer.val.qid) == set(full.val.qid) and len(set(fewer.train.qid)) == 1
        assert set(fewer.train.qid) <= rest and len(fewer.train) < len(full.train)
        assert set(data_module(teacher_dataset, tiny_bert, train_queries=size).train.qid) == set(fewer.train.qid)
    with pytest.raises(InputError, match=rf"data.train_queries={len(rest) + 1}: cannot pick that many of {len(rest)}"):
        data_module(teacher_dataset, tiny_bert, train_queries=len(rest) + 1)
    with pytest.raises(InputError, match=r"data.train_queries: must be positive, got 0"):
        StudentDataModule([str(teacher_dataset)], train_queries=0)  # before anything is read


def test_a_judgment_label_reads_data_qrels_and_its_held_out_judgments_only_validate(
    teacher_dataset: Path, tiny_bert: Path, tmp_path: Path
) -> None:
    """``z(judgment)`` in ``data.label`` takes its grades from the ``data.qrels`` file: a training query's judged
    pairs move its labels; the held-out query's judgments are the validation's qrels."""
    plain = data_module(teacher_dataset, tiny_bert, label="z(cis) + z(first_stage)")
    qid = plain.train.qid[0]
    docid = next(d for q, d in zip(plain.train.qid, plain.train.docid, strict=True) if q == qid)
    held_out = plain.val.qid[0]
    qrels = tmp_path / "qrels.txt"
    qrels.write_text(f"{qid} 0 {docid} 3\n{held_out} 0 {plain.val.docid[0]} 2\n")
    judged = data_module(teacher_dataset, tiny_bert, label="z(cis) + z(first_stage) + z(judgment)", qrels=str(qrels))
    assert judged.train.qid == plain.train.qid and judged.val.qid == plain.val.qid
    rows = np.array([q == qid for q in plain.train.qid])
    assert not np.allclose(judged.train.labels[rows], plain.train.labels[rows])  # the judged query's labels moved
    top = max(zip(judged.train.labels[rows], np.array(judged.train.docid)[rows], strict=True))[1]
    assert top == docid  # its grade-3 pair is now the query's first
    np.testing.assert_array_equal(judged.train.labels[~rows], plain.train.labels[~rows])  # unjudged: unchanged
    assert judged.qrels == {held_out: {plain.val.docid[0]: 2}}


def test_a_teacher_dataset_rewritten_while_the_training_reads_it_is_refused(
    teacher_dataset: Path, tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The labels were read from one version of the folder and the texts tokenised from the next, which a
    ``distill teach --overwrite`` swapped in meanwhile: a student trained on mismatched pairs, exit 0."""
    import shutil

    from distill.core.output_files import replace_folder
    from students import data

    folder = Path(shutil.copytree(teacher_dataset, tmp_path / "teacher"))
    labels = data.load_label_table

    def rewritten_after_the_labels(*args, **kwargs):
        table = labels(*args, **kwargs)
        new = Path(shutil.copytree(folder, tmp_path / "new"))
        metadata = json.loads((new / "teacher.json").read_text())
        (new / "teacher.json").write_text(json.dumps({**metadata, "command": "distill teach --overwrite true"}))
        replace_folder(new, folder)  # as teach swaps a rewritten dataset in
        return table

    monkeypatch.setattr(data, "load_label_table", rewritten_after_the_labels)
    dm = StudentDataModule([str(folder)], backbone=str(tiny_bert), val_queries=1, cache_dir=str(tmp_path / "tokens"))
    with pytest.raises(InputError, match=rf"data.teacher_data: {folder} was rewritten while the training read it"):
        dm.setup("fit")
    monkeypatch.setattr(data, "load_label_table", labels)
    dm.setup("fit")  # read at rest, it trains
    assert len(dm.train) > 0
