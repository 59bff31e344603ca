"""``distill train``: the student stage, driven by LightningCLI and composable YAML.

    distill train --config configs/train/minilm-dl19-cis.yaml [--trainer.devices 4 --trainer.strategy ddp]

Every run writes to ``<checkpoint_root>/<run_name>/``: ``checkpoints/`` (``best.ckpt`` by validation
nDCG@10, ``last.ckpt``), ``hf/`` (the best student as a plain Hugging Face folder), ``logs/`` (CSV and
the resolved config) and ``wandb/`` (offline by default). ``--ckpt_path last`` resumes a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pytorch_lightning import Trainer
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.cli import LightningCLI
from pytorch_lightning.loggers import CSVLogger, WandbLogger

from students.data import StudentDataModule
from students.export import ExportBestToHF
from students.module import CrossEncoderModule


class DistillCLI(LightningCLI):
    """LightningCLI with the project's run layout, loggers and checkpointing."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.add_argument("--run_name", default="student", help="the run's folder under checkpoint_root")
        parser.add_argument("--checkpoint_root", default="checkpoints")
        parser.add_argument("--wandb_mode", default="offline", choices=["offline", "online", "disabled"])
        parser.add_argument("--ckpt_path", default=None, help="a checkpoint to resume from, or 'last'")
        parser.link_arguments("model.backbone", "data.backbone")
        # Our batch samplers shard over ranks themselves; precision None means bf16-mixed on GPU, 32 on CPU.
        parser.set_defaults({"trainer.use_distributed_sampler": False, "trainer.precision": None})

    @property
    def run_dir(self) -> Path:
        return Path(self.config.checkpoint_root) / self.config.run_name

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        if config.get("precision") is None:
            config["precision"] = "bf16-mixed" if torch.cuda.is_available() else "32-true"
        config["default_root_dir"] = str(self.run_dir)
        if config.get("logger") in (None, True):
            config["logger"] = [CSVLogger(self.run_dir, name="logs", version="")]
            if self.config.wandb_mode != "disabled":
                config["logger"].append(
                    WandbLogger(
                        project="cis-distill",
                        name=self.config.run_name,
                        save_dir=str(self.run_dir),
                        mode=self.config.wandb_mode,
                    )
                )
        monitor = "val/nDCG@10" if self.config.data.qrels else "val/spearman"
        folder = self.run_dir / "checkpoints"
        best = ModelCheckpoint(folder, "best", monitor=monitor, mode="max", enable_version_counter=False)
        # Lightning's save_last only follows top-k saves; this one writes last.ckpt after every validation.
        last = ModelCheckpoint(folder, "last", save_top_k=1, enable_version_counter=False)
        callbacks = [best, last, ExportBestToHF(best, self.run_dir / "hf")]
        extra = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        return self._instantiate_trainer(config, [*extra, *callbacks])


def run_train(argv: list[str]) -> int:
    cli = DistillCLI(
        CrossEncoderModule,
        StudentDataModule,
        args=argv,
        run=False,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"prog": "distill train"},
    )
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.config.ckpt_path)
    if cli.trainer.is_global_zero:
        print_summary(cli.trainer, cli.run_dir)
    return 0


def print_summary(trainer: Trainer, run_dir: Path) -> None:
    """The last validation's metrics and where the run's artefacts are."""
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    print(f"\nrun folder: {run_dir}  (best student as a Hugging Face folder: {run_dir / 'hf'})")
    if metrics:
        print("last validation, held-out queries:")
        for key in sorted(metrics):
            print(f"  {key:<28} {metrics[key]:10.4f}")
