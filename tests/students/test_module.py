"""The student stage on tiny random BERTs: losses, scaling, sampling, training, export, resume."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from distill.core.schema import InputError
from students.losses import ADRMSE, LOSSES, ListwiseKL, MarginMSE, PointwiseMSE, RankNet, build_loss
from students.sampling import LengthGroupedBatches, QueryGroupedBatches, ResumableLoader
from students.scaling import TargetScaling


def test_pointwise_mse_is_mean_squared_error() -> None:
    scores, targets = torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 0.0, 1.0])
    assert PointwiseMSE()(scores, targets, torch.zeros(3, dtype=torch.long)).item() == pytest.approx(13 / 3)


def test_margin_mse_compares_within_queries_only() -> None:
    scores = torch.tensor([3.0, 1.0, 10.0, -5.0])
    targets = torch.tensor([2.0, 1.0, 0.0, 7.0])
    groups = torch.tensor([0, 0, 1, 2])
    # Only query 0 has a pair: student margin 2, teacher margin 1.
    assert MarginMSE()(scores, targets, groups).item() == pytest.approx(1.0)
    lone = MarginMSE()(scores[2:], targets[2:], torch.tensor([0, 1]))
    assert lone.item() == 0.0 and lone.requires_grad is False


def test_listwise_kl_per_query_matches_the_definition() -> None:
    scores = torch.tensor([0.5, 1.5, -1.0, 2.0, 0.0])
    targets = torch.tensor([1.0, 3.0, 0.0, -1.0, 1.0])
    groups = torch.tensor([1, 0, 1, 0, 1])
    expected = []
    for g in (0, 1):
        m = groups == g
        p, log_q = torch.softmax(targets[m] / 2.0, 0), torch.log_softmax(scores[m], 0)
        expected.append((p * (p.log() - log_q)).sum())
    got = ListwiseKL(temperature=2.0)(scores, targets, groups)
    assert got.item() == pytest.approx(torch.stack(expected).mean().item(), rel=1e-6)
    assert ListwiseKL()(targets, targets, groups).item() == pytest.approx(0.0, abs=1e-7)
    # A group index with no pair (sizes from the host say 3 queries; query 1 is absent) adds nothing to the mean.
    gapped = torch.where(groups == 1, 2, groups)
    assert ListwiseKL(temperature=2.0)(scores, targets, gapped, (3, 3)).item() == pytest.approx(got.item(), rel=1e-6)


def test_ranknet_is_the_logistic_loss_of_the_teachers_ordered_pairs() -> None:
    scores = torch.tensor([2.0, 0.0, 5.0, 1.0])
    targets = torch.tensor([1.0, 3.0, 0.0, 0.0])  # query 0: the teacher prefers the second; query 1: a tie
    groups = torch.tensor([0, 0, 1, 1])
    expected = torch.nn.functional.softplus(torch.tensor(2.0))  # log(1 + exp(-(0 - 2)))
    assert RankNet()(scores, targets, groups).item() == pytest.approx(expected.item())
    assert RankNet()(scores[2:], targets[2:], groups[2:] - 1).item() == 0.0  # ties give no pair


def test_adr_mse_is_zero_for_the_teachers_order_and_weighs_the_top_most() -> None:
    targets = torch.tensor([4.0, 3.0, 2.0, 1.0])
    groups = torch.zeros(4, dtype=torch.long)
    sharp = ADRMSE(temperature=0.01)
    assert sharp(targets * 10, targets, groups).item() == pytest.approx(0.0, abs=1e-6)
    top_swapped = sharp(torch.tensor([30.0, 40.0, 20.0, 10.0]), targets, groups)
    bottom_swapped = sharp(torch.tensor([40.0, 30.0, 10.0, 20.0]), targets, groups)
    assert top_swapped.item() > bottom_swapped.item() > 0


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_loss_checks_its_inputs_and_has_gradients(name: str) -> None:
    loss = build_loss(name, temperature=1.0)
    scores = torch.randn(6, requires_grad=True)
    targets, groups = torch.randn(6), torch.tensor([0, 0, 0, 1, 1, 1])
    value = loss(scores, targets, groups)
    value.backward()
    assert value.ndim == 0 and torch.isfinite(value) and scores.grad is not None
    with pytest.raises(ValueError, match=r"must all be \[B\]"):
        loss(scores[:, None], targets, groups)
    with pytest.raises(ValueError, match="must be long"):
        loss(scores, targets, groups.float())
    with pytest.raises(ValueError, match="empty batch"):
        loss(scores[:0], targets[:0], groups[:0])
    assert loss.within_query == (name != "mse")
    if name in ("listwise_kl", "adr_mse"):  # NaN passed "temperature <= 0" and made every loss NaN
        for bad in (float("nan"), 0.0, float("inf")):
            with pytest.raises(ValueError, match="temperature must be positive and finite"):
                build_loss(name, temperature=bad)


def test_target_scaling() -> None:
    targets, qids = np.array([1.0, 3.0, 10.0, 20.0]), ["a", "a", "b", "b"]
    assert TargetScaling.fit("none", targets)(targets, qids).tolist() == targets.tolist()
    glob = TargetScaling.fit("global", targets)
    assert glob(targets, qids).mean() == pytest.approx(0.0) and glob(targets, qids).std() == pytest.approx(1.0)
    per_query = TargetScaling.fit("per_query", targets)(targets, qids)
    assert per_query.tolist() == [-1.0, 1.0, -1.0, 1.0]
    with pytest.raises(ValueError, match="target_scaling"):
        TargetScaling.fit("minmax", targets)


def test_length_grouped_batches_cover_each_example_once_and_shard_evenly() -> None:
    lengths = np.random.default_rng(0).integers(5, 300, 103).tolist()
    single = list(LengthGroupedBatches(lengths, 8, seed=1))
    assert sorted(i for b in single for i in b) == list(range(103))
    ranks = [list(LengthGroupedBatches(lengths, 8, seed=1, rank=r, world_size=3)) for r in range(3)]
    assert len({len(r) for r in ranks}) == 1  # the same number of steps on every rank: no hang
    seen = [i for r in ranks for b in r for i in b]
    assert len(seen) == len(set(seen))
    spread = np.mean([max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in single])
    assert spread < 0.5 * (max(lengths) - min(lengths))
    sampler = LengthGroupedBatches(lengths, 8, seed=1)
    sampler.set_epoch(1)
    assert list(sampler) != single


def test_lightning_sets_the_epoch_and_a_resumed_pass_skips_what_was_consumed() -> None:
    from lightning_fabric.utilities.data import _set_sampler_epoch

    sampler = LengthGroupedBatches(list(range(5, 45)), 4, seed=3)
    loader = ResumableLoader(list(range(40)), batch_sampler=sampler)
    _set_sampler_epoch(loader, 2)  # what Lightning does before each epoch
    assert sampler.epoch == 2
    epoch_2 = list(sampler)
    sampler.resume(2, 3)
    assert list(sampler) == epoch_2[3:]  # the resumed pass over epoch 2
    assert list(sampler) == epoch_2  # once only
    sampler.resume(1, 3)  # a run saved at the end of epoch 1 goes on with all of epoch 2
    assert list(sampler) == epoch_2


def test_resumable_loader_starts_at_its_first_batch_and_leaves_the_global_rng_alone() -> None:
    sampler = LengthGroupedBatches(list(range(5, 45)), 4, seed=3)
    loader = ResumableLoader(list(range(40)), batch_sampler=sampler)
    batches = iter(loader)  # Lightning calls iter before it sets the epoch or a resumed position
    sampler.set_epoch(1)
    sampler.resume(1, 2)
    state = torch.get_rng_state()
    assert [b.tolist() for b in batches] == list(sampler)[2:]
    assert torch.equal(torch.get_rng_state(), state)


def test_query_grouped_batches_hold_whole_groups_of_one_query() -> None:
    qids = [f"q{i % 5}" for i in range(60)]
    batches = list(QueryGroupedBatches(qids, group_size=4, queries_per_batch=2, seed=0))
    assert sorted(i for b in batches for i in b) == list(range(60))
    for batch in batches:
        by_query = {q: sum(qids[i] == q for i in batch) for q in {qids[i] for i in batch}}
        assert len(batch) in (4, 8) and len(by_query) <= 2 and all(n % 4 == 0 for n in by_query.values())
    with pytest.raises(ValueError, match="group_size"):
        QueryGroupedBatches(qids, group_size=1, queries_per_batch=2)


def test_module_trains_with_dropout_and_clips_the_global_norm(tiny_bert) -> None:
    from students.module import CrossEncoderModule

    module = CrossEncoderModule(backbone=str(tiny_bert))
    module.configure_model()
    assert module.model.training  # from_pretrained's eval mode would switch dropout off
    for p in module.parameters():
        p.grad = torch.full_like(p, 10.0)
    module.configure_gradient_clipping(None, gradient_clip_val=1.0)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in module.parameters()]))
    assert norm.item() == pytest.approx(1.0, rel=1e-3)
    with pytest.raises(ValueError, match="norm"):
        module.configure_gradient_clipping(None, gradient_clip_val=1.0, gradient_clip_algorithm="value")


@pytest.mark.parametrize("lr", [math.inf, math.nan, 0.0])
def test_a_learning_rate_that_is_not_positive_and_finite_is_refused_before_anything_is_built(lr: float) -> None:
    from students.module import CrossEncoderModule

    with pytest.raises(InputError, match=f"model.lr: must be positive and finite, got {lr}"):
        CrossEncoderModule(backbone="all-minilm-l6-v2", lr=lr)


def test_a_forward_before_the_backbone_is_built_says_so(tiny_bert) -> None:
    from students.module import CrossEncoderModule

    module = CrossEncoderModule(backbone=str(tiny_bert))
    batch = {"input_ids": torch.ones(1, 4, dtype=torch.long), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    with pytest.raises(RuntimeError, match=r"built by configure_model\(\)"):  # was: 'NoneType' is not callable
        module(batch)
    module.configure_model()
    assert module(batch).shape == (1,)
