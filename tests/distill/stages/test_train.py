"""``distill train`` end to end on a tiny random BERT and tiny-Llama teacher triplets."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from distill.cli import main
from distill.core.schema import InputError
from tests.conftest import DL19_QRELS


def write_config(tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, **trainer) -> Path:
    config = {
        "model": {"backbone": str(tiny_bert), "lr": 1e-3},
        "data": {
            "teacher_data": [str(teacher_dataset)],
            "label": "cis",
            "qrels": str(DL19_QRELS),
            "val_queries": 1,
            "batch_size": 8,
            "max_length": 128,
            "target_scaling": "global",
        },
        "trainer": {
            "max_epochs": 2,
            "accelerator": "cpu",
            "devices": 1,
            "enable_progress_bar": False,
            "log_every_n_steps": 1,
            **trainer,
        },
        "run_name": "tiny",
        "checkpoint_root": str(tmp_path / "runs"),
        "wandb_mode": "disabled",
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def metrics(run: Path) -> list[dict[str, str]]:
    with (run / "logs" / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def test_train_validates_checkpoints_and_exports(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys
) -> None:
    assert main(["train", "--config", str(write_config(tmp_path, tiny_bert, teacher_dataset))]) == 0
    run = tmp_path / "runs" / "tiny"
    assert (run / "checkpoints" / "best.ckpt").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    rows = metrics(run)
    val = [r for r in rows if r.get("val/nDCG@10")]
    assert len(val) == 2  # one validation per epoch, on the held-out query
    for key in (
        "val/spearman",
        "val/pearson",
        "val/teacher_nDCG@10",
        "val/first_stage_nDCG@10",
        "val/fidelity_spearman",
        "val/fidelity_kendall_tau",
        "val/fidelity_nDCG@10_teacher",
        "val/interp_alpha",
        "val/interp_nDCG@10",
    ):
        assert all(r[key] for r in val), key
    assert any(r.get("train/loss") for r in rows)

    from transformers import AutoModelForSequenceClassification

    hf = run / "hf"
    model = AutoModelForSequenceClassification.from_pretrained(hf).eval()
    meta = model.config.cis_distill
    assert model.config.num_labels == 1 and meta["label"] == "cis" and meta["target_scaling"]["kind"] == "global"
    assert meta["monitor"] == "val/nDCG@10" and (hf / "model.safetensors").is_file()
    best_epoch = max(val, key=lambda r: float(r["val/nDCG@10"]))
    alpha = float(best_epoch["val/interp_alpha"])  # one first stage: the validation split's, as read
    chosen = {"alpha": alpha, "chosen_on": str(teacher_dataset.parent / "in.json"), "queries": 1}
    assert meta["interpolation"] == {"first_stage": chosen}
    assert meta["interpolate"] is False
    assert meta["extra"]["validation"]["interp_nDCG@10"] == pytest.approx(float(best_epoch["val/interp_nDCG@10"]))
    sample = {line.split()[0] for line in (teacher_dataset / "runs" / "cis.trec").read_text().splitlines()}
    assert len(meta["val_queries"]) == 1 and set(meta["val_queries"]) < sample  # the held-out query
    best = torch.load(run / "checkpoints" / "best.ckpt", weights_only=False)["state_dict"]
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, best[f"model.{name}"])

    # distill eval --held-out: the runs on the student's held-out queries only
    capsys.readouterr()
    assert main(["eval", "--qrels", str(DL19_QRELS), "--run", str(teacher_dataset), "--held-out", str(run)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("triplets/")]
    means = rows[:3]  # then the differences to the first run
    assert [r[0] for r in means] == ["triplets/first_stage", "triplets/cis", "triplets/upr"]
    assert all(r[1] == "1" for r in means)  # evaluated on the one held-out query of 3
    other = next(q for q in sorted(sample) if q not in meta["val_queries"])  # a run without the held-out query
    (tmp_path / "other.trec").write_text(f"{other} Q0 d1 1 1.0 x\n")
    other_run = ["--run", str(tmp_path / "other.trec"), "--held-out", str(run)]
    assert main(["eval", "--qrels", str(DL19_QRELS), *other_run]) == 2
    assert f"run {tmp_path / 'other.trec'} has none of {run}'s judged held-out" in capsys.readouterr().err
    assert main(["eval", "--qrels", str(DL19_QRELS), "--run", str(teacher_dataset), "--held-out", str(tmp_path)]) == 2
    assert "no student here" in capsys.readouterr().err


def test_exported_student_scores_the_same_in_sentence_transformers(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path
) -> None:
    st = pytest.importorskip("sentence_transformers")
    assert main(["train", "--config", str(write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=1))]) == 0
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    hf = tmp_path / "runs" / "tiny" / "hf"
    pairs = [
        ("how long is life cycle of flea", "The life cycle of a flea can last a year."),
        ("what is a rhino", "Rhinos are large herbivores with one or two horns."),
    ]
    model, tok = AutoModelForSequenceClassification.from_pretrained(hf).eval(), AutoTokenizer.from_pretrained(hf)
    with torch.no_grad():
        ours = model(**tok([q for q, _ in pairs], [p for _, p in pairs], padding=True, return_tensors="pt"))
    theirs = st.CrossEncoder(str(hf), device="cpu").predict(pairs)
    torch.testing.assert_close(torch.tensor(theirs, dtype=torch.float32), ours.logits.squeeze(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("loss", "group_size"), [("margin_mse", 4), ("listwise_kl", 6)])
def test_within_query_losses_train(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, loss: str, group_size: int
) -> None:
    path = write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=1)
    args = [
        "train",
        "--config",
        str(path),
        "--model.loss",
        loss,
        "--data.group_size",
        str(group_size),
        "--data.target_scaling",
        "per_query",
    ]
    assert main(args) == 0
    from safetensors.torch import load_file

    from distill.core.student_card import StudentCard

    run = tmp_path / "runs" / "tiny"
    card = StudentCard.read(run / "hf")
    assert card.loss == loss and card.target_scaling["kind"] == "per_query"
    losses = [float(r["train/loss"]) for r in metrics(run) if r.get("train/loss")]
    assert losses and np.isfinite(losses).all()
    before, after = load_file(tiny_bert / "model.safetensors"), load_file(run / "hf" / "model.safetensors")
    assert not torch.equal(before["classifier.weight"], after["classifier.weight"])  # it learned


def test_ctrl_c_in_fit_before_training_is_an_interruption_not_lightnings_exit_1(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C inside fit, before training's own handler is in (here as the optimisers are made): Lightning caught
    the KeyboardInterrupt and exited 1, where the docs promise "distill train: interrupted" and 130."""
    from students.module import CrossEncoderModule

    def ctrl_c(self):
        raise KeyboardInterrupt  # what SIGINT raises in the main thread

    monkeypatch.setattr(CrossEncoderModule, "configure_optimizers", ctrl_c)
    assert main(["train", "--config", str(write_config(tmp_path, tiny_bert, teacher_dataset))]) == 130
    assert capsys.readouterr().err.endswith("distill train: interrupted\n")


def test_a_within_query_validation_loss_takes_each_query_whole(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path
) -> None:
    """val/loss of listwise_kl went from 0.20 to 0.12 as data.eval_batch_size went from 12 to 3: batches cut by
    length split each query's list, and the loss with it."""
    path = write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=1)
    logged = []
    for size in ("3", "64"):
        args = ["train", "--config", str(path), "--model.loss", "listwise_kl", "--data.group_size", "4"]
        assert main([*args, "--data.eval_batch_size", size, "--run_name", f"eval{size}"]) == 0
        logged.append([float(r["val/loss"]) for r in metrics(tmp_path / "runs" / f"eval{size}") if r.get("val/loss")])
    assert logged[0] and logged[0] == pytest.approx(logged[1], rel=1e-5)


def test_bad_teacher_data_is_named(tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys) -> None:
    path = write_config(tmp_path, tiny_bert, teacher_dataset)
    assert main(["train", "--config", str(path), "--data.label", "bm25"]) == 2
    err = capsys.readouterr().err
    assert str(teacher_dataset) in err and "missing column(s) ['bm25']" in err
    assert main(["train", "--config", str(path), "--data.teacher_data", f"[{tmp_path / 'nowhere'}]"]) == 2
    assert "no teacher dataset here" in capsys.readouterr().err
    assert main(["train", "--config", str(path), "--data.val_queries", "3"]) == 2
    assert "holds out every query" in capsys.readouterr().err
    # qrels of another year: validation by nDCG@10 found no judged query, a traceback once training had started
    other = str(DL19_QRELS).replace("trec-dl19", "trec-dl21")
    for pool in ("any", "judged"):
        assert main(["train", "--config", str(path), "--data.qrels", other, "--data.val_pool", pool]) == 2
        assert f"data.qrels: {other} judge none of the teacher data's 3 queries" in capsys.readouterr().err
    # an empty qrels file: the error said judged needs data.qrels, which were given
    empty = tmp_path / "empty-qrels.txt"
    empty.write_text("")
    assert main(["train", "--config", str(path), "--data.qrels", str(empty), "--data.val_pool", "judged"]) == 2
    assert f"and data.qrels {empty} judge nothing (no line)" in capsys.readouterr().err


def test_nan_targets_are_rejected(tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys) -> None:
    import datasets

    broken = tmp_path / "broken"
    ds = datasets.load_from_disk(str(teacher_dataset))
    ds.map(lambda row, i: {"cis": float("nan") if i == 3 else row["cis"]}, with_indices=True).save_to_disk(broken)
    shutil.copy(teacher_dataset / "teacher.json", broken)
    assert main(["train", "--config", str(write_config(tmp_path, tiny_bert, broken))]) == 2
    assert "NaN/inf" in capsys.readouterr().err
    # a first-stage score too, which labels and validation use: a traceback from the labels or the first validation
    stage = tmp_path / "stage"
    ds.map(
        lambda row, i: {"first_stage_score": float("nan") if i == 5 else row["first_stage_score"]}, with_indices=True
    ).save_to_disk(stage)
    shutil.copy(teacher_dataset / "teacher.json", stage)
    assert main(["train", "--config", str(write_config(tmp_path, tiny_bert, stage))]) == 2
    assert f"{stage}: column 'first_stage_score' has 1 NaN/inf value(s), rows [5]" in capsys.readouterr().err


def test_a_max_length_with_no_room_for_a_passage_is_one_line(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys
) -> None:
    config = write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=1)
    cache = tmp_path / "cache"
    for length, expected in (
        ("1", "data.max_length: 1 tokens cannot hold a pair: this tokenizer's special tokens, one query token and "),
        ("5", "data.max_length: 5 tokens leave no room for a passage after the query "),
        ("8", "data.max_length: 8 tokens leave no room for a passage after the query "),  # DL19's queries: 5+ tokens
        # accepted: a passage past the backbone's positions ended in a size mismatch in its first validation
        ("100000", "data.max_length: 100000 tokens is over the backbone's 512 (its tokenizer's model_max_length)"),
    ):
        options = ["--data.max_length", length, "--data.cache_dir", str(cache)]
        assert main(["train", "--config", str(config), *options]) == 2
        err = capsys.readouterr().err
        assert expected in err and "Traceback" not in err, err
        if "no room for a passage" in expected:  # the query, its folder and its row, to find it by
            assert re.search(rf"\(\d+ tokens\) of {re.escape(str(teacher_dataset))}, row \d+: raise", err), err
    assert not [p for p in cache.rglob("*") if p.is_dir()]  # no partial store is left behind


def test_a_max_length_past_the_backbones_positions_is_one_line(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys
) -> None:
    """A backbone of 64 positions whose tokenizer says 512: a data.max_length past 64 ended in a size mismatch's
    traceback in the first training step."""
    from safetensors.torch import load_file, save_file

    short = tmp_path / "short-bert"
    shutil.copytree(tiny_bert, short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    weights = load_file(short / "model.safetensors")
    name = next(k for k in weights if k.endswith("position_embeddings.weight"))
    weights[name] = weights[name][:64].clone()
    save_file(weights, short / "model.safetensors", metadata={"format": "pt"})
    path = write_config(tmp_path, short, teacher_dataset, max_epochs=1)
    assert main(["train", "--config", str(path), "--data.cache_dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    expected = "data.max_length: 128 tokens is over the backbone's 64 (its position embeddings): "
    assert expected in err and "give --data.max_length 64 or less" in err and "Traceback" not in err, err


def test_a_run_that_diverges_stops_with_one_line_and_saves_no_student(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys
) -> None:
    config = write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=1)
    assert main(["train", "--config", str(config), "--model.lr", "1e30"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"training diverged: \d+ of \d+ validation scores are not finite after step \d+;", err), err
    assert "Traceback" not in err
    assert not (tmp_path / "runs" / "tiny" / "hf" / "model.safetensors").exists()


def test_validation_draws_judged_queries_and_training_can_keep_the_top_candidates(
    tiny_bert: Path, teacher_dataset: Path, tmp_path: Path
) -> None:
    from distill.data.loaders import load_qrels
    from students.data import StudentDataModule

    judged = load_qrels(DL19_QRELS)
    qrels = tmp_path / "qrels.txt"  # only one of the three sample queries is judged now
    first = sorted(q for q in judged if q in {"264014", "104861", "130510"})[0]
    qrels.write_text("".join(f"{first} 0 {d} {g}\n" for d, g in judged[first].items()))
    data = StudentDataModule(
        [str(teacher_dataset)],
        label="upr+1*first_stage",
        backbone=str(tiny_bert),
        qrels=str(qrels),
        val_queries=1,
        val_pool="judged",
        train_depth=5,
    )
    data.setup("fit")
    assert set(data.val.qid) == {first} and len(data.val) == 12  # validation keeps every candidate
    assert len(data.train) == 2 * 5  # the other two queries' top 5
    # The hybrid label standardises over each query's full candidate list, before the top 5 are kept.
    from distill.data.labels import per_query_z
    from distill.data.teacher_data import TeacherDataset

    table = TeacherDataset.open(teacher_dataset).to_pandas()
    upr, first_stage = table.upr.to_numpy(), table.first_stage_score.to_numpy()
    table["label"] = per_query_z(upr, table.qid) + per_query_z(first_stage, table.qid)
    expected = table.set_index(["qid", "docid"]).label
    got = [expected[(q, d)] for q, d in zip(data.train.qid, data.train.docid, strict=True)]
    np.testing.assert_allclose(data.train.labels, got)


def test_bad_data_fails_before_any_logger_exists_with_one_message(
    tmp_path: Path, tiny_bert: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, tiny_bert, tmp_path / "no-such-teacher-data")
    assert main(["train", "--config", str(config), "--wandb_mode", "offline"]) == 2
    err = capsys.readouterr().err
    assert err.count("no teacher dataset here") == 1 and "Traceback" not in err
    assert not (tmp_path / "runs" / "tiny" / "wandb").exists() and not (tmp_path / "runs" / "tiny" / "logs").exists()


@pytest.mark.parametrize(
    ("flag", "environment", "expected"),
    [
        (None, {}, "offline"),
        (None, {"WANDB_MODE": "disabled"}, "disabled"),  # the variable was ignored: a run was still written
        (None, {"WANDB_MODE": "dryrun"}, "offline"),  # wandb's other name for it
        ("offline", {"WANDB_MODE": "online"}, "offline"),  # the flag first
        (None, {"WANDB_MODE": "online", "WANDB_API_KEY": "k" * 40}, "online"),
        ("online", {"WANDB_BASE_URL": "https://wandb.example.org"}, "online"),  # that host's netrc entry
        ("online", {}, InputError("wandb_mode online: no W&B API key here: run `wandb login` or set WANDB_API_KEY")),
        (None, {"WANDB_MODE": "sometimes"}, InputError("WANDB_MODE='sometimes': expected one of offline, online,")),
    ],
)
def test_the_wandb_mode_is_the_flags_then_wandbs_own_variable_and_online_needs_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str | None, environment: dict, expected: str | Exception
) -> None:
    from distill.stages.train_checks import check_wandb_mode

    netrc = tmp_path / "netrc"
    netrc.write_text("machine wandb.example.org\n  login user\n  password " + "p" * 40 + "\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    if isinstance(expected, Exception):
        with pytest.raises(InputError, match=re.escape(str(expected))):
            check_wandb_mode(flag)
    else:
        assert check_wandb_mode(flag) == expected


def test_an_online_run_without_a_key_is_one_line_before_the_data_loads(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    config = write_config(tmp_path, tiny_bert, teacher_dataset)
    assert main(["train", "--config", str(config), "--wandb_mode", "online"]) == 2  # wandb's traceback, exit 1
    err = capsys.readouterr().err
    assert err.startswith("distill train: error: wandb_mode online: no W&B API key here") and err.count("\n") == 1
    assert not (tmp_path / "runs" / "tiny").exists()


def test_a_validation_split_of_one_pair_is_one_line_not_lightnings_missing_monitor(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One candidate a query, one query held out: nothing to rank or correlate, so no checkpoint could be chosen
    (Lightning's ModelCheckpoint raised that its monitored key was never logged)."""
    from tests.distill.serving.test_fusion import stage_copy

    single = stage_copy(teacher_dataset, tmp_path / "single", "single.json", 1, False)
    config = write_config(tmp_path, tiny_bert, single, max_epochs=1)
    assert main(["train", "--config", str(config), "--data.val_queries", "1", "--data.qrels", "null"]) == 2
    err = capsys.readouterr().err
    assert "distill train: error: data: the validation split holds 1 pair" in err and "Traceback" not in err


def test_training_to_a_log_file_prints_progress_lines(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=1)
    assert main(["train", "--config", str(config)]) == 0  # stderr is captured: not a terminal
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train: ")]
    assert lines and lines[-1].startswith("train: epoch 0, batch ") and "loss" in lines[-1]


def test_a_run_stopped_by_max_steps_mid_epoch_reports_the_batches_it_trained(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The last progress line said the whole epoch was done ("batch 3/3") after a stop at step 2."""
    config = write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=1, max_steps=2)
    assert main(["train", "--config", str(config)]) == 0
    last = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train: ")][-1]
    done, total, step = map(int, re.search(r"batch (\d+)/(\d+), step (\d+)", last).groups())
    assert (done, step) == (2, 2) and total > 2, last


def test_a_misspelt_train_key_is_one_line(tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys) -> None:
    config = write_config(tmp_path, tiny_bert, teacher_dataset)
    assert main(["train", "--config", str(config), "--model.lr", "fast"]) == 2
    err = capsys.readouterr().err
    assert err == "distill train: error: model.lr: expected float, got 'fast'\n"


def test_a_finished_run_is_resumed_or_replaced_when_asked_never_silently(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys
) -> None:
    """A second run under the same run_name with other options replaced the first run's checkpoints and weights,
    with exit 0."""
    config = write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=1)
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "runs" / "tiny"
    before = {p: p.read_bytes() for p in (run / "hf" / "model.safetensors", run / "checkpoints" / "last.ckpt")}
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--model.lr", "1e-2"]) == 2
    assert capsys.readouterr().err == (
        f"distill train: error: {run} holds an earlier training run: resume it with --ckpt_path last, replace it "
        "with --overwrite true, or choose another --run_name\n"
    )
    assert {p: p.read_bytes() for p in before} == before
    assert main(["train", "--config", str(config), "--ckpt_path", "last", "--overwrite", "true"]) == 2
    assert capsys.readouterr().err == (
        "distill train: error: --ckpt_path last resumes the run and --overwrite true replaces it: give one of them\n"
    )  # it resumed, and --overwrite was silently ignored
    assert {p: p.read_bytes() for p in before} == before
    # a replacement that cannot start (a label naming no score) leaves the earlier run: it removed it first
    assert main(["train", "--config", str(config), "--data.label", "nosuchscore", "--overwrite", "true"]) == 2
    assert "nosuchscore" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in before} == before
    # nor does one that fails once training has begun (it diverges): the earlier run was deleted, then a traceback
    assert main(["train", "--config", str(config), "--model.lr", "1e30", "--overwrite", "true"]) == 2
    assert "training diverged" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in before} == before
    assert yaml.safe_load((run / "logs" / "config.yaml").read_text())["model"]["lr"] != 1e30  # the earlier run's
    assert sorted(p.name for p in run.parent.iterdir()) == ["tiny"]  # nothing set aside is left
    assert main(["train", "--config", str(config), "--model.lr", "1e-2", "--overwrite", "true"]) == 0
    assert yaml.safe_load((run / "logs" / "config.yaml").read_text())["model"]["lr"] == 1e-2  # the new run's
    assert (run / "hf" / "model.safetensors").read_bytes() != before[run / "hf" / "model.safetensors"]
    assert sorted(p.name for p in run.parent.iterdir()) == ["tiny"]  # the earlier run, set aside, is gone


def test_a_resumed_run_keeps_what_it_learns_from(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys
) -> None:
    """A resume with another label exited 0: the card said upr, the weights and the best checkpoint were cis's."""
    config = write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=1)
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "runs" / "tiny"
    saved = (run / "logs" / "config.yaml").read_text()
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--ckpt_path", "last", "--data.label", "upr"]) == 2
    assert capsys.readouterr().err == (
        f"distill train: error: --ckpt_path last: data.label is 'upr' here and 'cis' in the run it resumes "
        f"({run / 'logs' / 'config.yaml'}): a resumed run keeps what it learns from and is validated on; give "
        "another --run_name for a new run\n"
    )
    assert (run / "logs" / "config.yaml").read_text() == saved
    assert main(["train", "--config", str(config), "--ckpt_path", "last", "--data.max_length", "64"]) == 2
    assert "data.max_length is 64 here and 128 in the run it resumes" in capsys.readouterr().err  # its inputs cut so
    assert main(["train", "--config", str(config), "--ckpt_path", "last", "--trainer.max_epochs", "2"]) == 0  # longer
    # without a logger, Lightning saved the config in the run folder itself, and the check found none
    unlogged = ["train", "--config", str(config), "--run_name", "nolog", "--trainer.logger", "false"]
    assert main(unlogged) == 0
    capsys.readouterr()
    assert main([*unlogged, "--ckpt_path", "last", "--data.label", "upr"]) == 2
    assert "data.label is 'upr' here and 'cis' in the run it resumes" in capsys.readouterr().err


def test_a_fast_dev_run_reports_no_validation_of_the_held_out_queries(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys
) -> None:
    """It said no validation ran, then printed one batch's figures as the held-out queries' last validation."""
    config = write_config(tmp_path, tiny_bert, teacher_dataset)
    assert main(["train", "--config", str(config), "--trainer.fast_dev_run", "true"]) == 0
    out = capsys.readouterr().out
    assert "(no student here" in out and "last validation" not in out, out


def test_a_new_run_from_another_runs_checkpoint_has_its_own_best(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys
) -> None:
    """It ended in a FileNotFoundError for ``<new run>/checkpoints/best.ckpt``, exit 1, with no ``hf/``."""
    config = write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=1)
    assert main(["train", "--config", str(config)]) == 0
    best = tmp_path / "runs" / "tiny" / "checkpoints" / "best.ckpt"
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--run_name", "same", "--ckpt_path", str(best)]) == 0
    out, err = capsys.readouterr()
    assert "(no student here" in out and "Traceback" not in err  # nothing left to train: no validation ran
    longer = ["--run_name", "longer", "--ckpt_path", str(best), "--trainer.max_epochs", "2"]
    assert main(["train", "--config", str(config), *longer]) == 0
    card = json.loads((tmp_path / "runs" / "longer" / "hf" / "config.json").read_text())["cis_distill"]
    assert card["checkpoint"] == "checkpoints/best.ckpt"  # its own, not the first run's


def test_a_second_job_on_the_same_run_stops_before_it_writes(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys
) -> None:
    """Two jobs with one run_name both exited 0, their checkpoints and logs mixed in one folder."""
    from distill.core.output_files import hold_output

    config = write_config(tmp_path, tiny_bert, teacher_dataset, max_epochs=1)
    run = tmp_path / "runs" / "tiny"
    other = hold_output(run)  # another process's hold, as a running distill train has it
    try:
        assert main(["train", "--config", str(config)]) == 2
        assert capsys.readouterr().err == (
            f"distill train: error: {run}: another distill train is writing this run now: wait for it to end, or "
            "choose another --run_name\n"
        )
        assert not run.exists()
    finally:
        other.release()
    assert main(["train", "--config", str(config)]) == 0
    assert (run / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--model.loss", "nosuchloss"], "model.loss: expected one of ['adr_mse', "),
        # a traceback from AdamW, after the data loaded
        (["--model.lr", "-1"], "model.lr: must be positive and finite, got -1.0"),
        (["--model.warmup_ratio", "1.5"], "model.warmup_ratio: must be in [0, 1), got 1.5"),
        (["--data.batch_size", "0"], "data.batch_size: must be positive, got 0"),  # trained with batches of 1, exit 0
        (["--data.group_size", "-2"], "data.group_size: must be positive, got -2"),
        (["--data.train_depth", "0"], "data.train_depth: must be positive, got 0"),  # NaN targets, then a traceback
        (["--checkpointing.every_minutes", "0"], "checkpointing.every_minutes: expected PositiveFloat | None, got '0'"),
        (["--checkpointing.every_n_steps", "-2"], "checkpointing.every_n_steps: expected PositiveInt | None, got '-2'"),
        (["--model.loss", "listwise_kl", "--data.group_size", "1"], "data.group_size: model.loss listwise_kl compares"),
        (["--data.val_fold", "1"], "data.val_fold: 1 without data.val_folds (the number of folds) picks no fold"),
        # Lightning's ValueError came only once the data was read, after a pipeline's teacher had run
        (["--trainer.strategy", "dpp"], "trainer.strategy: 'dpp' is not a name Lightning knows; one of: auto, ddp"),
        (["--trainer.accelerator", "cdua"], "trainer.accelerator: 'cdua' is not a name Lightning knows; one of: auto"),
        # tracebacks (Lightning's MisconfigurationException, a ZeroDivisionError), after the data loaded
        (["--trainer.enable_checkpointing", "false"], "trainer.enable_checkpointing: false, but distill train's"),
        (["--trainer.accumulate_grad_batches", "0"], "trainer.accumulate_grad_batches: 0; at least 1"),
        (["--trainer.devices", "0"], "trainer.devices: 0 names no device"),
        # the card said its every candidate, and the alpha was chosen on the share of queries validated
        (["--trainer.limit_val_batches", "0.5"], "trainer.limit_val_batches: 0.5: distill train validates whole"),
        (["--trainer.limit_val_batches", "1"], "trainer.limit_val_batches: 1: distill train validates whole"),
        pytest.param(
            ["--trainer.strategy", "deepspeed_stage_2", "--trainer.accelerator", "cpu"],
            "trainer.strategy: deepspeed_stage_2 shards the model over CUDA devices, and this run is on the CPU",
            marks=pytest.mark.skipif(
                "deepspeed_stage_2" not in __import__("pytorch_lightning").strategies.StrategyRegistry,
                reason="DeepSpeed is not installed",
            ),
        ),
        (["--trainer.strategy", "fsdp", "--trainer.accelerator", "cpu"], "trainer.strategy: fsdp shards the model"),
        pytest.param(
            ["--trainer.accelerator", "gpu"],  # configs/train/bert-large-gpu.yaml run on a CPU machine: a traceback
            "trainer.accelerator: gpu, but torch ",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU"),
        ),
    ],
)
def test_an_option_out_of_range_is_one_line_before_the_data_loads(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys, options: list[str], expected: str
) -> None:
    config = write_config(tmp_path, tiny_bert, teacher_dataset)
    assert main(["train", "--config", str(config), *options]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"distill train: error: {expected}") and err.count("\n") == 1, err
    assert not (tmp_path / "runs" / "tiny" / "logs").exists()


@pytest.mark.parametrize(
    ("launched", "options", "expected"),
    [
        (
            "2 1",
            ["--trainer.devices", "1"],
            "trainer.num_nodes: 1, but the launcher started 2 processes, 1 a node: give",
        ),
        (
            "4 2",
            ["--trainer.num_nodes", "2"],
            "trainer.devices: 1, but the launcher started 4 processes, 2 a node: give",
        ),
    ],
)
def test_a_config_that_does_not_match_torchruns_processes_is_one_line_before_the_data_loads(
    tmp_path: Path,
    tiny_bert: Path,
    teacher_dataset: Path,
    capsys,
    monkeypatch: pytest.MonkeyPatch,
    launched: str,
    options: list[str],
    expected: str,
) -> None:
    """torchrun --nnodes 2 without --trainer.num_nodes 2: Lightning's traceback came after the data was read."""
    world, local = launched.split()
    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    config = write_config(tmp_path, tiny_bert, teacher_dataset)
    assert main(["train", "--config", str(config), *options]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"distill train: error: {expected}") and err.count("\n") == 1, err


def test_several_nodes_launched_alone_is_one_line_not_a_wait_without_end(
    tmp_path: Path, tiny_bert: Path, teacher_dataset: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--trainer.num_nodes 2 with no launcher: Lightning's own environment made it node 0 of 2, and it waited for
    node 1 without end. Under a cluster environment, or with MASTER_ADDR given, it is one node of several."""
    from distill.stages.train_checks import check_node_launch

    for name in ("MASTER_ADDR", "NODE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS", "LSB_JOBID"):
        monkeypatch.delenv(name, raising=False)
    config = write_config(tmp_path, tiny_bert, teacher_dataset)
    assert main(["train", "--config", str(config), "--trainer.num_nodes", "2"]) == 2
    err = capsys.readouterr().err
    expected = "distill train: error: trainer.num_nodes: 2, but no launcher says which node this is"
    assert err.startswith(expected) and "torchrun --nnodes 2" in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs" / "tiny" / "logs").exists()
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")  # Lightning's environment, NODE_RANK 0 when unset
    check_node_launch({"num_nodes": 2})
    monkeypatch.delenv("MASTER_ADDR")
    monkeypatch.setenv("SLURM_NTASKS", "2")  # an sbatch job's step (srun)
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    check_node_launch({"num_nodes": 2})
    monkeypatch.delenv("SLURM_NTASKS")
    with pytest.raises(InputError, match=r"trainer\.num_nodes: 3, but no launcher"):
        check_node_launch({"num_nodes": 3})


def test_full_size_bert_large_config_runs_a_step(tmp_path: Path, teacher_dataset: Path) -> None:
    """bert-large-uncased builds offline from its embedded config (random weights) and trains a step (unvalidated:
    the best checkpoint's save is other tests' concern); its last checkpoint (4 GB with the optimiser's state) is
    read, then removed."""
    path = write_config(
        tmp_path,
        Path("bert-large-uncased"),
        teacher_dataset,
        max_steps=1,
        max_epochs=1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    args = [
        "train",
        "--config",
        str(path),
        "--model.random_init",
        "true",
        "--data.batch_size",
        "2",
        "--data.max_length",
        "64",
    ]
    assert main(args) == 0
    import torch

    checkpoint = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    try:
        state = torch.load(checkpoint, mmap=True, weights_only=False)
        weights = state["state_dict"]
        layers = {key.split(".layer.")[1].split(".")[0] for key in weights if ".layer." in key}
        embedding = next(value for key, value in weights.items() if key.endswith("word_embeddings.weight"))
        head = next(value for key, value in weights.items() if key.endswith("classifier.weight"))
        found = (embedding.shape[1], len(layers), tuple(head.shape), state["global_step"])
        del state, weights, embedding, head
    finally:
        checkpoint.unlink(missing_ok=True)  # 4 GB with the optimiser's state: not left in the run's temporary folder
    assert found == (1024, 24, (1, 1024), 1)


def _subprocess_env() -> dict[str, str]:
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def test_the_program_exits_promptly_after_its_summary(tmp_path: Path, tiny_bert: Path, teacher_dataset: Path) -> None:
    """``distill train`` as a program, with W&B offline and two loader workers: the process ends within 2 s of printing
    its summary, and nothing it started (loader workers, W&B's service) outlives it. Python's exit used to collect
    every object first: 2-5 s after the summary on this project's 2-core CPU, longer after a compiled model. Its
    stderr holds none of the third parties' notices that a user can do nothing about."""
    import os
    import subprocess
    import sys
    import time

    path = write_config(tmp_path, tiny_bert, teacher_dataset)
    command = [sys.executable, "-m", "distill", "train", "--config", str(path), "--wandb_mode", "offline"]
    log = tmp_path / "stderr.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [*command, "--data.num_workers", "2"],
            env=_subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
        summary = None
        for line in proc.stdout:  # to its end: the pipe closes when the last process holding it ends
            if line.startswith("run folder: ") and summary is None:
                summary = time.monotonic()
        code = proc.wait(timeout=60)
        ended = time.monotonic()
    assert code == 0 and summary is not None, log.read_text()[-3000:]
    assert ended - summary < 2.0, f"the process ended {ended - summary:.1f} s after its summary"
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # no process of its session is left
    assert (tmp_path / "runs" / "tiny" / "wandb").is_dir()
    notices = ("💡 Tip", "wandb: ", "weights_only")  # Lightning's adverts, W&B's offline warnings, save notes
    assert not [line for line in log.read_text().splitlines() if any(n in line for n in notices)], log.read_text()


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_with_uneven_batches(tmp_path: Path, tiny_bert: Path, teacher_dataset: Path) -> None:
    """24 training pairs in batches of 5 are 5 batches: two ranks must still step together and finish. The pairs
    are tokenised once (rank 0, in ``prepare_data``), and both ranks map the same cached files."""
    import subprocess
    import sys

    path = write_config(tmp_path, tiny_bert, teacher_dataset, devices=2, strategy="ddp", max_epochs=2)
    command = [sys.executable, "-m", "distill", "train", "--config", str(path), "--data.batch_size", "5"]
    command += ["--data.cache_dir", str(tmp_path / "tokens")]
    done = subprocess.run(command, env=_subprocess_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GLOBAL_RANK: 1" in done.stderr or "world_size=2" in done.stderr.replace(" ", "")
    assert (tmp_path / "runs" / "tiny" / "hf" / "model.safetensors").is_file()
    assert done.stderr.count("student tokens: tokenising") == 1, done.stderr[-3000:]
    assert done.stderr.count("student data: ") == 2  # both ranks set up, from the one store
    assert len([p for p in (tmp_path / "tokens").iterdir() if not p.name.startswith(".")]) == 1


def test_an_mpnet_backbone_trains_with_the_segment_cosine_head(
    tmp_path: Path, tiny_mpnet: Path, teacher_dataset: Path
) -> None:
    """An MPNet backbone (no token types: the segments are read off its separators) trains through ``distill train``
    with its layers apart, and its saved student reloads as the MPNet head with trained weights."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    path = write_config(tmp_path, tiny_mpnet, teacher_dataset, max_epochs=1)
    argv = ["train", "--config", str(path), "--model.head", "segment_cosine", "--model.segment_layers", "2"]
    assert main(argv) == 0
    run = tmp_path / "runs" / "tiny"
    assert [r for r in metrics(run) if r.get("val/nDCG@10")] and any(r.get("train/loss") for r in metrics(run))
    student = AutoModelForSequenceClassification.from_pretrained(run / "hf")
    assert type(student).__name__ == "MPNetForSegmentCosine" and student.config.segment_layers == 2
    backbone = AutoModel.from_pretrained(tiny_mpnet, add_pooling_layer=False)
    trained = student.mpnet.state_dict()
    assert any(not torch.equal(trained[name], weight) for name, weight in backbone.state_dict().items())


def test_the_saved_student_blends_its_trained_weights_with_its_initial_ones(
    tmp_path: Path, tiny_mpnet: Path, teacher_dataset: Path, capsys
) -> None:
    """With ``model.initial_weight_share`` s, the Hugging Face folder holds ``(1 − s) · best checkpoint + s · the
    backbone`` in every encoder weight, the head's too, and the card and model card say so."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    path = write_config(tmp_path, tiny_mpnet, teacher_dataset, max_epochs=1)
    argv = ["train", "--config", str(path), "--model.head", "segment_cosine", "--model.segment_layers", "2"]
    assert main([*argv, "--model.initial_weight_share", "0.25"]) == 0
    run = tmp_path / "runs" / "tiny"
    student = AutoModelForSequenceClassification.from_pretrained(run / "hf")
    best = torch.load(run / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    backbone = AutoModel.from_pretrained(tiny_mpnet, add_pooling_layer=False).state_dict()
    saved = student.state_dict()
    moved = 0
    for name, start in backbone.items():
        trained = best[f"model.mpnet.{name}"]
        if start.is_floating_point():
            torch.testing.assert_close(saved[f"mpnet.{name}"], 0.75 * trained + 0.25 * start)
            moved += not torch.equal(trained, start)
    assert moved  # training moved weights, so the blend is not the trained weights nor the initial ones
    torch.testing.assert_close(saved["scale"], 0.75 * best["model.scale"] + 0.25 * torch.tensor(20.0))
    assert student.config.cis_distill["initial_weight_share"] == 0.25

    capsys.readouterr()
    assert main([*argv[:3], "--model.initial_weight_share", "0.5"]) == 2  # the cls head: it starts at random
    assert "model.initial_weight_share: needs the segment_cosine head" in capsys.readouterr().err
